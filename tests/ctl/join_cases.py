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
      join pending), and so must the 2-rank step restarted, both ranks;
  join_cases.py SOCKET join-hole  8 joiners for 4 added GPUs, joiner 0 silent
      in the world gather: the committed 12-GPU plan has a rank on every GPU
      (joiners are placed by count, not by their step rank);
  join_cases.py SOCKET join-leftover  8 joiners for 4 GPUs (4 wait), then a
      second ADD: the 4 waiting joiners take GPUs 12..15;
  join_cases.py SOCKET gone-ready-joiner  4 joiners complete the world gather,
      one dies in the transition: the retry never plans its GPU;
  join_cases.py SOCKET join-stuck  a 4-rank join step dies whole after WORLD:
      the relaunched step is accepted, not "a join ... is in progress";
  join_cases.py SOCKET lost-line  8 joiners for 4 GPUs (n1 placed, 2 waiting
      on n2, 2 on n3): LOST n2 is accepted and drops n2's waiting joiners;
      n3's close, then LOST n3 is accepted too (their host is remembered),
      and LOST n2 again is "already applied": the plan is never touched.
  join_cases.py SOCKET commit-gone-joiner  4 joiners on n1 prepare the
      join's epoch and get its COMMIT, then n1 dies before they ACK it: their
      GPUs, without a rank, are lost once the commit completes (a plan of 8
      announced; before: kept until a LOST came), and the LOST n1 that
      follows is known (before: their host was forgotten, "already applied",
      GPUs without a rank kept).
  join_cases.py SOCKET commit-hello-joiner  a 2-rank join step whose rank 0
      says HELLO while epoch 2 commits (it gets the plan of epoch 1): once
      the commit completes it must be told epoch 2, as its rank 1 is (before:
      it kept epoch 1, and its world gather would find the job on another);
  join_cases.py SOCKET commit-join-world  the same, both ranks during the
      commit: their WORLD comes once it completes, after the plan of epoch 2
      (before: at once, with the plan of epoch 1, the ranks' world gather
      following their commit).
Prints "ok: ..." and exits 0, or "FAIL: ..." and exits 1."""
import struct, sys, time
import nc

path, case = sys.argv[1], sys.argv[2]


def refused(peer):
    """The ERROR text the controller sent peer, or None."""
    for t, f, pl in peer.drain(0.5):
        if t == 'ERROR':
            return nc.errtext(pl)[1]
    return None



find, transition = nc.find, nc.transition


def holes(want_total):
    """Exit unless the committed plan has want_total GPUs, each with a rank."""
    st = nc.status(path)
    total = st['plan']['total_gpus']
    held = set(w['rank'] for w in st['workers'])
    empty = sorted(set(range(total)) - held)
    if total != want_total or empty or st['nworkers'] != total:
        print('FAIL: epoch %s plan of %d GPUs (want %d), %d workers, GPUs without a rank: %s'
              % (st['epoch'], total, want_total, st['nworkers'], empty)); sys.exit(1)
    return st


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


def join_step():
    """A join step of 4 ranks on n1 says HELLO; returns them 0.5 s later."""
    J = [nc.Peer(path) for r in range(4)]
    for r, p in enumerate(J):
        p.send(nc.hello(4, r, 4, host='n1'))
    time.sleep(0.5)
    return J


def world_gather(peers):
    """Each of peers (what it got so far drained) joins the world gather of 12."""
    for p in peers:
        p.drain(0.05)
        p.send(nc.gather((5 << 32) | 1, 'world1', 12, b'ab'))


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
if case == 'join-stuck':
    J = join_step()
    for p in J:  # the join step dies whole, after WORLD
        p.s.close()
    time.sleep(0.3)
    world_gather(W)
    time.sleep(0.5)
    K = [nc.Peer(path) for r in range(4)]
    for r, p in enumerate(K):
        p.send(nc.hello(4, r, 4, host='n1'))
    for r, p in enumerate(K):
        why = refused(p)
        if why:
            print('FAIL: relaunched joiner %d refused: %s' % (r, why)); sys.exit(1)
    print('ok: the join step relaunched after its whole first run died is accepted'); sys.exit(0)
if case == 'commit-gone-joiner':
    J = join_step()
    world_gather(W + J)
    ep = None
    for p in W + J:
        x = find(p, 'PREPARE')
        if not x or x[0] != 'PREPARE':
            print('FAIL: no PREPARE for the join'); sys.exit(1)
        ep = struct.unpack_from('<I', x[2])[0]
        p.send(nc.ack(ep, 8))
    for p in W + J:
        x = find(p, 'COMMIT')
        if not x or x[0] != 'COMMIT':
            print('FAIL: no COMMIT for the join'); sys.exit(1)
    for p in J:  # node n1 dies past the point of no return
        p.s.close()
    time.sleep(0.3)
    for p in W:
        p.send(nc.ack(ep, 10, 0, 0.1))
    time.sleep(0.5)
    st = nc.status(path)
    if st['epoch'] != ep or st['plan']['total_gpus'] != 12:
        print('FAIL: epoch %s on %d GPUs after the join\'s commit' % (st['epoch'], st['plan']['total_gpus'])); sys.exit(1)
    # their GPUs have no rank: lost when the commit completes, without a delta
    pend = (st.get('pending_plan') or {}).get('total_gpus')
    if not st['pending_epoch'] or pend != 8:
        print('FAIL: after the join\'s commit without its joiners: pending epoch %s on %s GPUs'
              % (st['pending_epoch'], pend)); sys.exit(1)
    cli.send(nc.delta(3, hosts=('n1',)))
    x = find(cli, 'DELTA_REPLY')
    if not x or x[0] != 'DELTA_REPLY':
        print('FAIL: no reply to LOST n1'); sys.exit(1)
    acc, cur, new = struct.unpack_from('<III', x[2], 8)
    text = x[2][22:].decode(errors='replace')
    st = nc.status(path)
    if not acc or not new or not st['pending_epoch'] or st['pending_plan']['total_gpus'] != 8:
        print('FAIL: LOST n1 after its joiners died in the commit: accepted %d, new epoch %d: %s'
              % (acc, new, text)); sys.exit(1)
    print('ok: LOST of the joiners\' node after they died in the commit: epoch', new,
          'on', st['pending_plan']['total_gpus'], 'GPUs announced'); sys.exit(0)
if case in ('commit-hello-joiner', 'commit-join-world'):
    cli.send(nc.delta(3, gpus=(7,)))  # epoch 2, forced
    cli.recv(10)
    S = W[:7]
    ep = None
    for p in S:
        x = find(p, 'PREPARE')
        if not x or x[0] != 'PREPARE':
            print('FAIL: no PREPARE'); sys.exit(1)
        ep = struct.unpack_from('<I', x[2])[0]
        p.send(nc.ack(ep, 8))
    for p in S:
        if find(p, 'COMMIT')[0] != 'COMMIT':
            print('FAIL: no COMMIT'); sys.exit(1)

    def plans(peer, t=0.5):  # the committed plans it got (epochs), and 'W' for WORLD
        return [x == 'WORLD' and 'W' or struct.unpack_from('<I', pl)[0]
                for x, f, pl in peer.drain(t)
                if x == 'WORLD' or x == 'PLAN' and not struct.unpack_from('<I', pl, 8)[0] & 1]

    j0 = nc.Peer(path)
    j0.send(nc.hello(4, 0, 2, host='n1'))  # between the first COMMIT and the last ACK
    if case == 'commit-join-world':
        j1 = nc.Peer(path)
        j1.send(nc.hello(4, 1, 2, host='n1'))
    seen = plans(j0)
    for p in S:
        p.send(nc.ack(ep, 10, 0, 0.1))
    seen += plans(j0)
    st = nc.status(path)
    if st['epoch'] != ep or st['pending_epoch']:
        print('FAIL: epoch', st['epoch'], 'pending', st['pending_epoch'], 'after the commit of', ep)
        sys.exit(1)
    if case == 'commit-join-world':
        seen1 = plans(j1, 0.1)
    else:
        j1 = nc.Peer(path)
        j1.send(nc.hello(4, 1, 2, host='n1'))
        seen1 = []
    seen1 += plans(j1)
    seen += plans(j0, 0.1)
    for got in seen, seen1:  # the plan of epoch ep, then WORLD
        if 'W' not in got or [e for e in got[:got.index('W')]][-1:] != [ep]:
            print('FAIL: committed epoch %d; joiner 0 got %s, joiner 1 %s (W: WORLD)' % (ep, seen, seen1))
            sys.exit(1)
    print('ok: joiners that said HELLO during the commit of epoch', ep, 'got', seen, seen1)
    sys.exit(0)
if case == 'gone-ready-joiner':
    J = join_step()
    world_gather(W + J)
    x = find(W[0], 'PREPARE')
    if not x or x[0] != 'PREPARE':
        print('FAIL: no PREPARE for the join'); sys.exit(1)
    J[0].s.close()
    x = find(W[0], 'ABORT')
    if not x or x[0] != 'ABORT':
        print('FAIL: no ABORT after the joiner died'); sys.exit(1)
    time.sleep(2.5)  # past the retry (1 s back-off): 11 ranks for 12 GPUs
    prep = [t for t, f, pl in W[0].drain(0.3)]
    st = holes(8)
    if 'PREPARE' in prep or st['pending_epoch']:
        print('FAIL: the retry announced a plan with the gone joiner\'s GPU:', prep); sys.exit(1)
    print('ok: the gone joiner is not planned; epoch', st['epoch'], 'kept'); sys.exit(0)
J = [nc.Peer(path) for r in range(8)]
for r, p in enumerate(J):  # lost-line: ranks 4..7 (in line) on n2, n3
    host = 'n1' if case != 'lost-line' or r < 4 else 'n%d' % (2 + (r - 4) // 2)
    p.send(nc.hello(4, r, 8, host=host))
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
if case == 'join-hole':
    for p in W + J[1:]:  # joiner 0 stays silent: refused
        p.send(nc.gather(key, 'world1', 16, b'ab', timeout_ms=1000))
    time.sleep(1.6)
    J[0].drain(0.05)
    transition(W + J[1:])
    holes(12)
    print('ok: every GPU of the 12-GPU plan has a rank'); sys.exit(0)
if case == 'join-leftover':
    for p in W + J:
        p.send(nc.gather(key, 'world1', 16, b'ab'))
    transition(W + J)
    st = holes(12)
    for p in W + J:
        p.drain(0.05)
    for step in range(1, 4):
        for p in W + J[:4]:
            p.send(nc.report(st['epoch'], step, stages=((0, 0.01),)))
        time.sleep(0.1)
    cli.send(nc.delta(1, add=1))
    cli.recv(10)
    transition(W + J)
    holes(16)
    print('ok: the joiners left waiting take GPUs 12..15 of the next plan'); sys.exit(0)
if case == 'lost-line':
    for p in W + J:
        p.send(nc.gather(key, 'world1', 16, b'ab'))
    transition(W + J)
    st0 = holes(12)

    def lost(host, want):
        """LOST host: must be accepted, with want in the reply, plan kept."""
        cli.send(nc.delta(3, hosts=(host,)))
        x = find(cli, 'DELTA_REPLY')
        if not x or x[0] != 'DELTA_REPLY':
            print('FAIL: no reply to LOST', host, x and x[0]); sys.exit(1)
        acc, ep, new = struct.unpack_from('<III', x[2], 8)
        text = x[2][22:].decode(errors='replace')
        if not acc or new or want not in text:
            print('FAIL: LOST %s: accepted %d, new epoch %d: %s' % (host, acc, new, text))
            sys.exit(1)

    lost('n2', 'held no GPU')
    for r in (4, 5):
        why = refused(J[r])
        if not why or 'node lost' not in why:
            print('FAIL: waiting joiner %d on n2 was not retired: %s' % (r, why)); sys.exit(1)
    J[6].s.close()
    J[7].s.close()
    time.sleep(0.3)
    lost('n3', 'already applied')
    lost('n2', 'already applied')
    prep = [t for p in W + J[:4] for t, f, pl in p.drain(0.1)]
    st = holes(12)
    if 'PREPARE' in prep or 'ERROR' in prep or st['pending_epoch'] or st['epoch'] != st0['epoch']:
        print('FAIL: the plan was disturbed:', prep, st['epoch'], st['pending_epoch']); sys.exit(1)
    print('ok: LOST of waiting joiners\' hosts accepted, they are dropped, plan kept'); sys.exit(0)
print('FAIL: unknown case', case); sys.exit(1)
