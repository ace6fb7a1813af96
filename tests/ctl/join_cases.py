"""Join-step cases against a running nereus-controller (tests/mp/e2e.yaml:
nodes of 4 GPUs), over its unix socket, with tests/ctl/nc.py:

  join_cases.py SOCKET dead-joiner   8 ranks on n0, delta --add 1, 8 joiners,
      the world gather, then joiner 0 closes during the join's transition:
      rank 1 must get ABORT at once (within 3 s), not at the time-out;
  join_cases.py SOCKET silent-joiner  the same, but joiner 7 never
      contributes to the world gather (1 s time-out): it must be refused,
      and the others go on;
  join_cases.py SOCKET restarted-join  a 2-rank join step whose rank 0 says
      HELLO and dies: a later 4-rank join step must be accepted (no stale
      join pending), and so must the 2-rank step restarted, both ranks.
Prints "ok: ..." and exits 0, or "FAIL: ..." and exits 1."""
import sys, time
import nc

path, case = sys.argv[1], sys.argv[2]


def refused(peer):
    """The ERROR text the controller sent peer, or None."""
    for t, f, pl in peer.drain(0.5):
        if t == 'ERROR':
            return nc.errtext(pl)[1]
    return None

W = [nc.Peer(path) for r in range(8)]
for r, p in enumerate(W):
    p.send(nc.hello(1, r, 8, host='n0'))
for p in W:
    x = p.recv(5)
    if not x or x[0] != 'PLAN':
        print('FAIL: worker got', x and x[0]); sys.exit(1)
cli = nc.Peer(path)
cli.send(nc.hello(2, 0, 0))
cli.send(nc.delta(1, add=1))
cli.recv(10)
if case == 'restarted-join':
    a = nc.Peer(path)
    a.send(nc.hello(4, 0, 2, host='n1'))
    a.drain(0.5)
    a.s.close()
    time.sleep(0.3)
    b = nc.Peer(path)
    b.send(nc.hello(4, 0, 4, host='n1'))
    why = refused(b)
    if why:
        print('FAIL: a 4-rank join after the dead one was refused:', why); sys.exit(1)
    b.s.close()
    time.sleep(0.3)
    c0, c1 = nc.Peer(path), nc.Peer(path)
    c0.send(nc.hello(4, 0, 2, host='n1'))
    time.sleep(0.3)
    c1.send(nc.hello(4, 1, 2, host='n1'))
    why = refused(c1)
    if why:
        print('FAIL: the restarted step\'s rank 1 was refused:', why); sys.exit(1)
    print('ok: a later join and the restarted step were both accepted'); sys.exit(0)
J = [nc.Peer(path) for r in range(8)]
for r, p in enumerate(J):
    p.send(nc.hello(4, r, 8, host='n1'))
time.sleep(0.5)
for p in W + J:
    p.drain(0.05)
key = (5 << 32) | 1
if case == 'dead-joiner':
    for p in W + J:
        p.send(nc.gather(key, 'world1', 16, b'ab'))
    time.sleep(0.5)
    for p in W + J:
        p.drain(0.3)
    t0 = time.time()
    J[0].s.close()
    while time.time() - t0 < 10:
        x = W[1].recv(0.2)
        if x and x[0] == 'ABORT':
            dt = time.time() - t0
            if dt < 3:
                print('ok: ABORT %.1f s after the joiner died' % dt); sys.exit(0)
            print('FAIL: ABORT only after %.1f s' % dt); sys.exit(1)
    print('FAIL: no ABORT within 10 s'); sys.exit(1)
if case == 'silent-joiner':
    for p in W + J[:7]:
        p.send(nc.gather(key, 'world1', 16, b'ab', timeout_ms=1000))
    time.sleep(2)
    got = J[7].drain(0.5)
    refused = any(t == 'ERROR' and 'took no part' in nc.errtext(pl)[1] for t, f, pl in got)
    if not refused:
        print('FAIL: the silent joiner got', [t for t, f, pl in got]); sys.exit(1)
    others = [t for t, f, pl in W[0].drain(0.5)]
    if 'PREPARE' not in others:
        print('FAIL: the others got no PREPARE:', others); sys.exit(1)
    print('ok: the silent joiner was refused, the others prepare'); sys.exit(0)
print('FAIL: unknown case', case); sys.exit(1)
