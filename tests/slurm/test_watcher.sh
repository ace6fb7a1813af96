#!/usr/bin/env bash
# nereus-watcher on its own (as the plugin starts it, here by hand), against
# a fake controller in a runtime dir of its own:
#  - a delta the controller did not take (here: it closes every connection
#    unanswered; also "busy", or no answer) is sent again at the next poll,
#    then with a growing interval (bounded), instead of being dropped: the
#    controller would go on counting a released node;
#  - a FIFO as controller.log in its socket dir: it refuses it at once
#    instead of blocking in open();
#  - a SIGTERM that comes after its last look at its stop flag and before
#    its sleep starts (term_shim.c puts one there) is not lost: it stops its
#    controller and exits, instead of sleeping out its interval (an hour);
#  - a delta the controller answers only after a slow commit (35 s) is
#    waited for, not given up on while it is applied.
. "$(dirname "$0")/lib.sh"
sl_need_bins "nereus-watcher" nereus-watcher
command -v python3 >/dev/null || { sl_skip "nereus-watcher" "no python3"; sl_done; }
fake="$sl_tmp/fakert"
w="$sl_tmp/w"
mkdir -m 755 "$fake" && mkdir -m 700 "$w"
cat >"$fake/nereus-controller" <<'PY'
#!/usr/bin/env python3
# A controller that cannot answer: accepts on ctl.sock, closes at once.
import os, socket, sys
p = os.path.join(sys.argv[sys.argv.index("--socket-dir") + 1], "ctl.sock")
try: os.unlink(p)
except FileNotFoundError: pass
s = socket.socket(socket.AF_UNIX); s.bind(p); s.listen(16)
while True:
    c, _ = s.accept(); c.close()
    sys.stderr.write("fake controller: a connection closed unanswered\n"); sys.stderr.flush()
PY
chmod 755 "$fake/nereus-controller"
wpid=
job=
cleanup() {
    [ -z "$wpid" ] || { kill "$wpid" 2>/dev/null; wait "$wpid" 2>/dev/null; }
    [ -z "$job" ] || timeout 10 scancel "$job" 2>/dev/null
}
sl_at_exit cleanup
watcher() { # socket dir [interval [runtime dir]]: the command line (in $cmd)
    cmd=("$NRS_BUILDDIR/nereus-watcher" --socket-dir "$1" --job "$job" --runtime-dir "${3:-$fake}"
        --interval "${2:-1}" --tcp none --slurm-conf "$SLURM_CONF" "$sl_good")
}
shrunk_job() { # socket dir, runtime dir, job name: 2 nodes, the watcher on them, shrunk to 1
    sl_run 30 salloc -N 2 --no-shell -J "$3"
    job=$(sl_granted_job)
    watcher "$1" 1 "$2"
    "${cmd[@]}" >"$1/watcher.log" 2>&1 &
    wpid=$!
    sl_wait_until 10 test -S "$1/ctl.sock"
    sleep 1
    sl_run 20 scontrol update JobId="$job" NumNodes=1
}

# ---- 1. a delta that failed is sent again, with a bounded backoff ---------------
shrunk_job "$w" "$fake" nrs-watcher
keep=$(sl_job_field "$job" NodeList)
sl_wait_until 10 grep -q 'delta REMOVE' "$w/watcher.log"
sleep 10
tries=$(grep -c 'delta REMOVE hosts' "$w/watcher.log")
cp "$w/watcher.log" "$sl_out"
# Every poll would be about 10 in 10 s; sent again after 1, 2, 4, 8 s: 4-5.
if [ "$tries" -ge 3 ] && [ "$tries" -le 6 ] && grep -q 'sent again in' "$w/watcher.log"; then
    sl_ok "a REMOVE the controller did not take is sent again, backing off ($tries times in ~10 s; job now on $keep)"
else sl_fail "a REMOVE the controller did not take is sent again, backing off" "$tries attempt(s) in ~10 s"; fi
kill "$wpid" 2>/dev/null; wait "$wpid" 2>/dev/null; wpid=

# ---- 2. controller.log a FIFO: refused at once ---------------------------------
w2="$sl_tmp/w2"
mkdir -m 700 "$w2" && mkfifo "$w2/controller.log"
t0=$SECONDS
watcher "$w2"
sl_run 20 "${cmd[@]}"
took=$((SECONDS - t0))
if [ "$sl_rc" -ne 0 ] && [ "$sl_rc" -ne 124 ] && [ "$took" -le 10 ] &&
    grep -q "controller.log: not a regular file" "$sl_out"; then
    sl_ok "controller.log a FIFO: the watcher refuses it at once (${took} s) and says why"
else
    [ "$sl_rc" -ne 124 ] || timeout 3 sh -c ': <>"$1"' _ "$w2/controller.log"
    sl_fail "controller.log a FIFO: the watcher refuses it at once and says why" "rc $sl_rc after ${took} s"
fi

# ---- 3. SIGTERM just before the watcher's sleep: not lost ----------------------
# term_shim.c (LD_PRELOAD) sends the watcher SIGTERM once, just before its
# first sleep (its poll interval, here 3600 s) starts: the window in which
# slurmstepd's SIGTERM can always come. A watcher that loses it sleeps the
# hour (slurmstepd SIGKILLs it after 3 s, its controller with it); one that
# keeps it stops its controller and exits. Its exit is waited for at most
# 30 s: a bound for a hang, not a timing.
name="SIGTERM just before the watcher's 3600 s sleep: it stops its controller and exits"
shim="$sl_tmp/term_shim.so"
w3="$sl_tmp/w3"
if ! ${CC:-cc} -std=gnu11 -shared -fPIC -o "$shim" "$NRS_SRCDIR/tests/slurm/term_shim.c" -ldl \
    >"$sl_out" 2>&1; then
    sl_skip "$name" "cannot build term_shim.so"
else
    mkdir -m 700 "$w3"
    watcher "$w3" 3600
    LD_PRELOAD="$shim" "${cmd[@]}" >"$w3/watcher.log" 2>&1 &
    wpid=$!
    exited() { [ ! -e "/proc/$wpid" ] || grep -q '^[0-9]* (.*) Z ' "/proc/$wpid/stat" 2>/dev/null; }
    rc=
    if sl_wait_until 30 exited; then wait "$wpid"; rc=$?; wpid=; fi
    cp "$w3/watcher.log" "$sl_out"
    if [ "$rc" = 0 ] && grep -q '^term_shim: SIGTERM just before a sleep of 3600 s' "$w3/watcher.log" &&
        grep -q 'started .*nereus-controller' "$w3/watcher.log" &&
        grep -q 'signal 15: stopping' "$w3/watcher.log" &&
        grep -q 'controller stopped; exiting' "$w3/watcher.log"; then
        sl_ok "$name"
    else
        sl_fail "$name" "${rc:+exit $rc}${wpid:+still running (asleep) after 30 s}"
        [ -z "$wpid" ] || { kill -KILL "$wpid"; wait "$wpid" 2>/dev/null; wpid=; }
    fi
fi

timeout 10 scancel "$job" 2>/dev/null
job=

# ---- 4. a delta answered only after a slow commit: waited for ------------------
# The controller answers a delta that comes during a COMMIT once the commit
# completes, up to its 60 s transition time-out later; this one answers after
# 35 s. A watcher that gives up sooner (it waited 30 s) logs the delta as not
# taken although it was applied, and its retry names a host the controller no
# longer knows.
fake4="$sl_tmp/fakert4"
w4="$sl_tmp/w4"
mkdir -m 755 "$fake4" && mkdir -m 700 "$w4"
cat >"$fake4/nereus-controller" <<'PY'
#!/usr/bin/env python3
# Answers every DELTA "accepted", 35 s after it came (docs/protocol.md frames).
import os, socket, struct, sys, threading, time
p = os.path.join(sys.argv[sys.argv.index("--socket-dir") + 1], "ctl.sock")
try: os.unlink(p)
except FileNotFoundError: pass
def serve(c):
    buf = b''
    while True:
        d = c.recv(65536)
        if not d: return
        buf += d
        while len(buf) >= 16:
            magic, ver, typ, flags, n = struct.unpack('<IHHII', buf[:16])
            if len(buf) < 16 + n: break
            pl, buf = buf[16:16 + n], buf[16 + n:]
            if typ == 4:  # DELTA: generation first
                gen = struct.unpack('<Q', pl[:8])[0]
                time.sleep(35)
                t = b'applied after a slow commit'
                r = struct.pack('<QIII', gen, 1, 1, 0) + struct.pack('<H', len(t)) + t
                c.sendall(struct.pack('<IHHII', 0x4353524e, 1, 5, 0, len(r)) + r)
                sys.stderr.write("fake controller: DELTA answered after 35 s\n"); sys.stderr.flush()
s = socket.socket(socket.AF_UNIX); s.bind(p); s.listen(16)
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
PY
chmod 755 "$fake4/nereus-controller"
shrunk_job "$w4" "$fake4" nrs-watcher4
sl_wait_until 60 grep -q 'delta REMOVE hosts' "$w4/watcher.log"
cp "$w4/watcher.log" "$sl_out"
if grep -q 'delta REMOVE hosts .*: accepted: .*applied after a slow commit' "$w4/watcher.log"; then
    sl_ok "a REMOVE answered after a 35 s commit is waited for and logged as applied"
else sl_fail "a REMOVE answered after a 35 s commit is waited for and logged as applied" \
    "$(grep -m1 'delta REMOVE hosts' "$w4/watcher.log")"; fi
kill "$wpid" 2>/dev/null; wait "$wpid" 2>/dev/null; wpid=
timeout 10 scancel "$job" 2>/dev/null
job=
sl_check "every node idle again" sl_wait_until 30 sl_all_idle
sl_done
