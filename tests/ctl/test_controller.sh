#!/usr/bin/env bash
# Process-level tests of nereus-controller (the control channel, docs/protocol.md): fake
# workers over the unix socket and TCP, status and delta through the CLI entry
# points, misbehaving peers, a second uid, SIGTERM. Every step has a hard
# time-out; prints the cmocka-style lines scripts/test counts.
set -u
B="${NRS_BUILDDIR:-$(cd "$(dirname "$0")/../.." && pwd)}"
S="${NRS_SRCDIR:-$(cd "$(dirname "$0")/../.." && pwd)}"
CTL="$B/nereus-controller"
CLI="$B/tests/ctl/ctl_cli"
FW="$B/tests/ctl/fake_workers"
SPEC="$S/examples/ppo-llama3-8b.yaml"
pass=0 fail=0 skip=0
tmp=$(mktemp -d "${TMPDIR:-/tmp}/nrs-ctl.XXXXXX")
chmod 0711 "$tmp" # the socket dir inside stays 0700; lets the second-uid test reach it when opened
D="$tmp/sock"
LOG="$tmp/controller.log"
cpid=""
cleanup() {
    [ -n "$cpid" ] && kill -KILL "$cpid" 2>/dev/null
    for p in $(jobs -p); do kill -KILL "$p" 2>/dev/null; done
    rm -rf "$tmp"
}
trap cleanup EXIT

ok() { echo "[       OK ] $1"; pass=$((pass + 1)); }
ko() { echo "[  FAILED  ] $1: $2"; fail=$((fail + 1)); sed 's/^/    | /' "${CURLOG:-$LOG}" 2>/dev/null | tail -n 25; }
sk() { echo "[ SKIPPED  ] $1: $2"; skip=$((skip + 1)); }
check() { # name command...: passes when the command exits 0 within CHECK_S s (60)
    local name="$1" rc; shift
    echo "[ RUN      ] $name"
    if timeout -k 2 "${CHECK_S:-60}" "$@" >"$tmp/out" 2>&1; then ok "$name"; else
        rc=$?; [ "$rc" -eq 124 ] && echo "    time-out after ${CHECK_S:-60} s"
        sed 's/^/    | /' "$tmp/out" | tail -n 20; ko "$name" "exit $rc"; fi
}
alive() { kill -0 "$cpid" 2>/dev/null; }
# SIGTERM to a controller of ours only: bash reaps background children as they
# exit, so a stale pid may by now be another test's process (make -j runs
# suites side by side)
term_ctl() { [ "$(cat /proc/"$1"/comm 2>/dev/null)" = nereus-controll ] && kill -TERM "$1"; }
status_json() { timeout 10 "$CLI" status --json --socket-dir "$D"; }
cpu_ticks() { sed 's/^.*) //' "/proc/$1/stat" | awk '{ print $12 + $13 }'; } # utime + stime
wait_for() { # seconds command...
    local n=$(( $1 * 10 )); shift
    for _ in $(seq "$n"); do "$@" >/dev/null 2>&1 && return 0; sleep 0.1; done
    return 1
}

head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$tmp/secret"; chmod 600 "$tmp/secret"
echo "[==========] nereus-controller process tests"

# --- start-up refusals ---------------------------------------------------------
mkdir -m 0755 "$tmp/open"
check "refuses a socket dir of mode 0755" bash -c "timeout 10 '$CTL' --socket-dir '$tmp/open' '$SPEC' 2>/dev/null; [ \$? -eq 1 ]"
check "says why it refuses the socket dir" bash -c "timeout 10 '$CTL' --socket-dir '$tmp/open' '$SPEC' 2>&1 | grep -q 'must be 0700'"
check "--tcp without a secret is refused" bash -c "timeout 10 '$CTL' --socket-dir '$tmp/x' --tcp 127.0.0.1:0 '$SPEC'; [ \$? -eq 2 ]"

# --- the controller on the 8B PPO example, 16 GPUs (2 nodes of 8) -------------
"$CTL" --socket-dir "$D" --gpus 16 --secret-file "$tmp/secret" --tcp 127.0.0.1:0 \
    --hello-timeout 2 --frame-timeout 2 --transition-timeout 10 --log "$LOG" "$SPEC" 2>/dev/null &
cpid=$!
if wait_for 10 status_json; then ok "controller answers status"; else ko "controller answers status" "no answer"; fi
check "socket dir is 0700 and the socket 0600" bash -c "[ \"\$(stat -c %a '$D')\" = 700 ] && [ \"\$(stat -c %a '$D/ctl.sock')\" = 600 ]"
check "a second controller on the same dir is refused" bash -c "timeout 10 '$CTL' --socket-dir '$D' '$SPEC' 2>&1 | grep -q 'another controller'"
port=$(sed -n 's/.*listening on tcp 127.0.0.1:\([0-9]*\).*/\1/p' "$LOG" | head -1)

# 16 fake workers: they report 6 steps (actor.generate 1.4x slower than the
# model), then follow the controller until the delta below moves them to epoch 2.
timeout -k 2 40 "$FW" --socket-dir "$D" --ranks 16 --nranks 16 --gpn 8 --steps 6 --interval-ms 100 \
    --gen-factor 1.4 --response-len 1024 --expect-epoch 2 --expect-retired 8 --timeout 30 \
    >"$tmp/fw.out" 2>&1 &
fwpid=$!
wait_for 10 bash -c "$CLI status --json --socket-dir $D | jq -e '.nworkers == 16 and .step >= 3' >/dev/null"
status_json >"$tmp/st.json" 2>&1
check "status --json lists the 16 workers, healthy" jq -e '(.workers | length) == 16 and all(.workers[]; .health == "ok") and .epoch == 1' "$tmp/st.json"
check "status --json has plan, calibration, decisions, transitions" \
    jq -e '.plan.total_gpus == 16 and (.plan.stages | length) == 7 and .calibration["actor.generate"].factor > 1.2 and (.decisions | length) >= 1 and .transitions.started == 0' "$tmp/st.json"
check "status (text) prints the plan table and the ranks" bash -c "timeout 10 '$CLI' status --socket-dir '$D' | grep -q 'actor.generate' && timeout 10 '$CLI' status --socket-dir '$D' | grep -q 'node1'"

# --- a lost node forces epoch 2; the survivors receive PLAN epoch 2 and commit --
echo "[ RUN      ] delta --lost node1 forces epoch 2"
if timeout 10 "$CLI" delta --lost node1 --socket-dir "$D" >"$tmp/delta.out" 2>&1 && grep -q 'epoch 1 -> 2' "$tmp/delta.out" && grep -q forced "$tmp/delta.out"; then
    ok "delta --lost node1 forces epoch 2"; else sed 's/^/    | /' "$tmp/delta.out"; ko "delta --lost node1 forces epoch 2" "reply"; fi
if wait "$fwpid"; then ok "8 surviving workers committed epoch 2, 8 retired"; else
    sed 's/^/    | /' "$tmp/fw.out" | tail -20; ko "8 surviving workers committed epoch 2, 8 retired" "fake workers"; fi
check "survivors saw PLAN, PREPARE and COMMIT" bash -c "[ \$(grep -c 'epoch 2, 2 plans, 1 prepares, 1 commits' '$tmp/fw.out') -eq 8 ]"
status_json >"$tmp/st2.json" 2>&1
check "status: epoch 2 on 8 GPUs, one forced admitted decision, one commit" \
    jq -e '.epoch == 2 and .gpus == 8 and .plan.total_gpus == 8 and .transitions.committed == 1 and any(.decisions[]; .forced and .admitted and .trigger == "resources")' "$tmp/st2.json"
check "the decision was logged with its numbers" grep -q 'ADMITTED (forced) saving .* horizon .* cost ' "$LOG"
check "delta of an unknown host is rejected" bash -c "timeout 10 '$CLI' delta --lost nosuchhost --socket-dir '$D' | grep -q 'rejected.*unknown host'; [ \${PIPESTATUS[0]} -eq 1 ]"
check "delta --add 1 is answered" bash -c "timeout 10 '$CLI' delta --add 1 --socket-dir '$D' | grep -q '^accepted.*16 GPUs'"

# --- a worker whose prepare fails makes the controller abort (own controller) --
D2="$tmp/sock2"
CURLOG="$tmp/c2.log"
"$CTL" --socket-dir "$D2" --gpus 16 --transition-timeout 10 --log "$tmp/c2.log" "$SPEC" 2>/dev/null &
c2=$!
wait_for 10 timeout 5 "$CLI" status --socket-dir "$D2"
timeout -k 2 30 "$FW" --verbose --socket-dir "$D2" --ranks 16 --nranks 16 --gpn 8 --prepare-status 1 \
    --expect-epoch 99 --timeout 8 >"$tmp/fw2.out" 2>&1 &
fw2=$!
wait_for 10 bash -c "$CLI status --json --socket-dir $D2 | jq -e '.nworkers == 16' >/dev/null"
timeout 10 "$CLI" delta --lost node1 --socket-dir "$D2" >"$tmp/d2.out" 2>&1
wait_for 10 bash -c "$CLI status --json --socket-dir $D2 | jq -e '.transitions.aborted >= 1' >/dev/null"
check "a rank that cannot prepare makes the transition abort" bash -c "timeout 10 '$CLI' status --json --socket-dir '$D2' | jq -e '.transitions.aborted >= 1 and .transitions.committed == 0 and .epoch == 1'"
check "ABORT was logged and reached the ranks" bash -c "grep -q 'ABORT before the point of no return' '$tmp/c2.log' && grep -q 'ABORT epoch 2' '$tmp/fw2.out'"
check "the retry backs off (at most 3 aborts in 3 s)" bash -c "sleep 2; [ \$(grep -c 'ABORT before' '$tmp/c2.log') -le 3 ]"
kill "$fw2" 2>/dev/null; wait "$fw2" 2>/dev/null
term_ctl "$c2"; wait "$c2"; c2rc=$?
[ "$c2rc" -eq 0 ] && ok "second controller stopped" || ko "second controller stopped" "exit $c2rc"
CURLOG=""

# --- a retry after an abort is a new attempt under a new epoch number ----------
# Every rank fails its first PREPARE (epoch 2) and accepts the next: the retry
# must come as epoch 3, so nothing of attempt 2 (a late ACK, a gather, a tag)
# can be taken for it.
D4="$tmp/sock4"
CURLOG="$tmp/c4.log"
"$CTL" --socket-dir "$D4" --gpus 16 --transition-timeout 10 --log "$tmp/c4.log" "$SPEC" 2>/dev/null &
c4=$!
wait_for 10 timeout 5 "$CLI" status --socket-dir "$D4"
timeout -k 2 30 "$FW" --verbose --socket-dir "$D4" --ranks 16 --nranks 16 --gpn 8 --prepare-status 1 \
    --prepare-fails 1 --expect-epoch 3 --expect-retired 8 --timeout 20 >"$tmp/fw4.out" 2>&1 &
fw4=$!
wait_for 10 bash -c "$CLI status --json --socket-dir $D4 | jq -e '.nworkers == 16' >/dev/null"
timeout 10 "$CLI" delta --lost node1 --socket-dir "$D4" >"$tmp/d4.out" 2>&1
if wait "$fw4"; then ok "the 8 survivors committed the retry"; else
    sed 's/^/    | /' "$tmp/fw4.out" | tail -20; ko "the 8 survivors committed the retry" "fake workers"; fi
check "attempt 2 was aborted at every survivor, the retry came as epoch 3" bash -c \
    "[ \$(grep -c 'ABORT epoch 2' '$tmp/fw4.out') -eq 8 ] && [ \$(grep -c 'PLAN epoch 3 transition' '$tmp/fw4.out') -eq 8 ] && [ \$(grep -c 'COMMIT epoch 3' '$tmp/fw4.out') -eq 8 ] && ! grep -q 'COMMIT epoch 2' '$tmp/fw4.out'"
check "status: epoch 3 committed, one abort, one commit" bash -c "timeout 10 '$CLI' status --json --socket-dir '$D4' | jq -e '.epoch == 3 and .transitions.aborted == 1 and .transitions.committed == 1'"
term_ctl "$c4"; wait "$c4"; c4rc=$?
[ "$c4rc" -eq 0 ] && ok "fourth controller stopped" || ko "fourth controller stopped" "exit $c4rc"
CURLOG=""

# --- misbehaving peers: the controller drops them and stays up -----------------
for mode in garbage badversion hugelen beforehello badhello badreport; do
    check "bad peer '$mode' gets an ERROR" "$FW" --socket-dir "$D" --bad "$mode" --timeout 30
done
check "bad peer 'nohello' is dropped after the HELLO time-out" "$FW" --socket-dir "$D" --bad nohello --timeout 6
check "bad peer 'slowloris' is dropped after the frame time-out" "$FW" --socket-dir "$D" --bad slowloris --timeout 8
for i in $(seq 20); do "$FW" --socket-dir "$D" --bad midframe >/dev/null 2>&1; done
ok "20 peers disconnecting mid-frame"
check "bad peer 'flood' (200 KB of random bytes) gets an ERROR" "$FW" --socket-dir "$D" --bad flood --timeout 30
check "a CLI that half-closes after STATUS_REQ gets its whole reply (20 times)" \
    bash -c "for i in \$(seq 20); do '$FW' --socket-dir '$D' --bad halfclose --timeout 5 || exit 1; done"
check "controller still answers after the bad peers" bash -c "alive() { kill -0 $cpid; }; alive && timeout 10 '$CLI' status --json --socket-dir '$D' | jq -e '.counters.dropped >= 8' >/dev/null"

# --- a contribution after its gather completed is refused (own controller) -------
D3="$tmp/sock3"
CURLOG="$tmp/c3.log"
"$CTL" --socket-dir "$D3" --gpus 16 --log "$tmp/c3.log" "$SPEC" 2>/dev/null &
c3=$!
wait_for 10 timeout 5 "$CLI" status --socket-dir "$D3"
check "a GATHER after its gather completed is refused, not answered a second time" \
    "$FW" --socket-dir "$D3" --bad lategather --nranks 16 --timeout 5
check "a worker on a host named with a newline gets its plan" \
    "$FW" --socket-dir "$D3" --bad forgedhost --nranks 16 --timeout 5
wait_for 5 grep -q 'FORGED disconnected' "$tmp/c3.log"
check "the controller logs that host escaped: no forged log line" \
    bash -c "grep -qF 'node0\\x0anereus-controller' '$tmp/c3.log' && ! grep -q '^nereus-controller: \\[0.000\\] FORGED' '$tmp/c3.log'"
term_ctl "$c3"; wait "$c3"
CURLOG=""

# --- a gather's answer to 1,024 ranks: 8 KiB each, 8 MiB for every rank --------
# (queued by reference: copied for each recipient it passed the 8 MiB a peer
# may queue, and every rank was dropped)
D5="$tmp/sock5"
CURLOG="$tmp/c5.log"
"$CTL" --socket-dir "$D5" --gpus 1024 --log "$tmp/c5.log" "$SPEC" 2>/dev/null &
c5=$!
wait_for 10 timeout 5 "$CLI" status --socket-dir "$D5"
CHECK_S=130 check "1,024 ranks gathering 8 KiB each all get the whole 8 MiB answer" \
    bash -c "timeout -k 2 120 '$FW' --socket-dir '$D5' --ranks 1024 --nranks 1024 --gather-len 8192 --timeout 100 >'$tmp/g5.out' 2>&1; rc=\$?; cat '$tmp/g5.out' >>'$tmp/c5.log'; exit \$rc"
hwm=$(awk '/VmHWM/ { print $2 }' "/proc/$c5/status" 2>/dev/null)
echo "    controller peak memory after the 1,024-rank gather: ${hwm:-?} kB; $(grep -o 'got the whole answer in .*' "$tmp/g5.out" 2>/dev/null)"
term_ctl "$c5"; wait "$c5"
CURLOG=""

# --- the fd table full: no busy loop, and peers accepted again once some close ---
D4="$tmp/sock4"
CURLOG="$tmp/c4.log"
(ulimit -n 40 && exec "$CTL" --socket-dir "$D4" --gpus 16 --hello-timeout 30 --log "$tmp/c4.log" "$SPEC" 2>/dev/null) &
c4=$!
wait_for 10 timeout 5 "$CLI" status --socket-dir "$D4"
timeout -k 2 30 "$FW" --socket-dir "$D4" --bad hold --ranks 60 --timeout 4 >"$tmp/hold.out" 2>&1 &
hold=$!
echo "[ RUN      ] with its fd table full the controller does not spin"
if wait_for 3 grep -q 'accept: Too many open files' "$tmp/c4.log"; then
    t0=$(cpu_ticks "$c4"); sleep 2; t1=$(cpu_ticks "$c4")
    ms=$(( (t1 - t0) * 1000 / $(getconf CLK_TCK) ))
    if [ "$ms" -lt 300 ]; then ok "with its fd table full the controller does not spin"; else
        ko "with its fd table full the controller does not spin" "$ms ms of CPU in 2 s"; fi
else
    ko "with its fd table full the controller does not spin" "the fd table did not fill"
fi
wait "$hold"
echo "[ RUN      ] it accepts peers again once they close"
if wait_for 10 timeout 5 "$CLI" status --socket-dir "$D4"; then ok "it accepts peers again once they close"; else
    ko "it accepts peers again once they close" "no status"; fi
check "the full fd table was logged once" bash -c "[ \$(grep -c 'not accepting peers' '$tmp/c4.log') -eq 1 ]"
term_ctl "$c4"; wait "$c4"
CURLOG=""

# --- a TCP flood before HELLO does not take the fd table from the unix peers ----
# (before: 300 silent TCP peers filled a table of 200 fds, and `nereus status`
# waited in the unix backlog until the HELLO time-out dropped them)
D6="$tmp/sock6"
CURLOG="$tmp/c6.log"
(ulimit -n 200 && exec "$CTL" --socket-dir "$D6" --gpus 16 --secret-file "$tmp/secret" --tcp 127.0.0.1:0 \
    --hello-timeout 10 --log "$tmp/c6.log" "$SPEC" 2>/dev/null) &
c6=$!
wait_for 10 timeout 5 "$CLI" status --socket-dir "$D6"
port6=$(sed -n 's/.*listening on tcp 127.0.0.1:\([0-9]*\).*/\1/p' "$tmp/c6.log" | head -1)
python3 -c '
import socket, sys, time
held = []
for i in range(300):
    s = socket.socket(); s.settimeout(2)
    try: s.connect(("127.0.0.1", int(sys.argv[1]))); held.append(s)
    except OSError: pass
print("connected", len(held), flush=True); time.sleep(8)' "${port6:-1}" >"$tmp/flood.out" 2>&1 &
flood=$!
wait_for 5 grep -q connected "$tmp/flood.out"
check "300 silent TCP peers: status over the unix socket is answered at once" \
    timeout 10 "$CLI" status --socket-dir "$D6" --timeout 3
check "the TCP peers held back were logged" grep -q 'TCP peers have not said HELLO: not accepting more' "$tmp/c6.log"
kill "$flood" 2>/dev/null; wait "$flood" 2>/dev/null
check "a TCP worker with the secret gets the plan after the flood" \
    "$FW" --tcp "127.0.0.1:${port6:-1}" --token-file "$tmp/secret" --ranks 1 --nranks 16 --timeout 5
term_ctl "$c6"; wait "$c6"
CURLOG=""

# --- TCP: the job's secret is required ------------------------------------------
if [ -n "$port" ]; then
    check "TCP worker with the secret gets the plan" "$FW" --tcp "127.0.0.1:$port" --token-file "$tmp/secret" --ranks 1 --nranks 16 --timeout 5
    echo wrong-secret-wrong-secret >"$tmp/bad"
    check "TCP worker with a wrong secret is refused" bash -c "'$FW' --tcp '127.0.0.1:$port' --token-file '$tmp/bad' --ranks 1 --nranks 16 --timeout 5 | grep -q 'refused: TCP peer without the job'"
else
    ko "TCP listener" "no port in the log"
fi

# --- another uid is refused ------------------------------------------------------
if [ "$(id -u)" = 0 ] && id nobody >/dev/null 2>&1 && command -v setpriv >/dev/null; then
    AS_NOBODY="setpriv --reuid=nobody --regid=nogroup --clear-groups"
    check "nobody cannot reach the 0700 socket dir" bash -c "$AS_NOBODY '$CLI' status --socket-dir '$D' 2>&1 | grep -q 'Permission denied'"
    # Open the directory up by hand: SO_PEERCRED must still refuse the peer.
    chmod 0711 "$D"; chmod 0666 "$D/ctl.sock"
    echo "[ RUN      ] nobody is refused by SO_PEERCRED"
    $AS_NOBODY "$CLI" status --socket-dir "$D" >"$tmp/nobody.out" 2>&1; rc=$?
    chmod 0700 "$D"; chmod 0600 "$D/ctl.sock"
    if [ "$rc" -eq 1 ] && grep -q 'not authorized' "$tmp/nobody.out"; then ok "nobody is refused by SO_PEERCRED"; else
        sed 's/^/    | /' "$tmp/nobody.out"; ko "nobody is refused by SO_PEERCRED" "exit $rc"; fi
    check "the refusal was logged" grep -q 'refused a local peer of uid 65534' "$LOG"
else
    sk "second uid refused" "needs root, user nobody and setpriv"
fi

# --- SIGTERM: exit 0, socket removed ---------------------------------------------
# Join steps (tests/ctl/join_cases.py): a joiner that dies in the join's
# transition aborts it at once; one that never joins the world gather gets no GPU;
# a join step whose rank died after HELLO leaves no stale join behind.
# Joiners take GPUs by count (a refused or waiting one leaves no hole), one gone
# is not planned, a join step that died whole does not block the next; a LOST of
# the hosts of joiners waiting for GPUs drops them and keeps the plan; a LOST of
# the node of joiners that died after the COMMIT placing them takes their GPUs out;
# a joiner that said HELLO while an epoch committed is told the new committed plan.
for case in dead-joiner silent-joiner restarted-join join-hole join-leftover gone-ready-joiner \
    join-stuck lost-line commit-gone-joiner commit-hello-joiner commit-join-world; do
    DJ="$tmp/sj-$case"
    "$CTL" --socket-dir "$DJ" --transition-timeout 15 --hello-timeout 5 --log "$tmp/cj-$case.log" \
        "$S/tests/mp/e2e.yaml" 2>/dev/null &
    jpid=$!
    CURLOG="$tmp/cj-$case.log"
    if wait_for 10 test -S "$DJ/ctl.sock"; then
        check "join: $case" python3 "$S/tests/ctl/join_cases.py" "$DJ/ctl.sock" "$case"
    else
        ko "join: $case" "no controller socket"
    fi
    CURLOG=""
    term_ctl "$jpid"
    wait "$jpid" 2>/dev/null
done

# Worker cases (tests/ctl/ctl_cases.py, 12 GPUs): a rank back after a disconnect
# gathers again; a HELLO as a survivor's world rank is refused; a rank that gives
# up after COMMIT loses its GPU; gathers beyond the world or a rank's share are
# refused; a long frame before HELLO is refused at once; deltas queued during
# a COMMIT are applied one after another, each plan following the committed epoch;
# a delta after one of generation 2^64-1 does not wrap the generations to 0;
# a GPU index queued during a COMMIT is read in the numbering of the epoch it came in;
# a host name with an escape sequence is shown escaped by nereus status;
# a delta sent during a slow commit (the default transition time-out) is answered;
# a rank that says HELLO while a transition prepares takes part in it;
# a gather, and a transition, open while the controller is SIGSTOPped past
# their time-outs (a suspended job) wait for the ranks after the SIGCONT;
# what the ranks measured across the stop (a step, a transition) calibrates nothing;
# a rank gone for good while its node stays (crashed, dropped for breaking the
# protocol, dead in a transition) has its GPU lost: the next plan leaves it out
# and commits (before: every transition aborted on the gone rank's vote).
for case in generation-wrap rejoin-gone dup-world-rank gaveup-lost gather-slots prehello-length queued-deltas host-escape \
    queued-gpu-delta lost-one-gpu delta-in-commit hello-in-prepare stopped-gather stopped-prepare stopped-step \
    crashed-rank dropped-rank gone-in-prepare; do
    DJ="$tmp/sw-$case"
    tt=15; [ "$case" = delta-in-commit ] && tt=60; [ "$case" = stopped-prepare ] && tt=2
    "$CTL" --socket-dir "$DJ" --gpus 12 --transition-timeout "$tt" --log "$tmp/cw-$case.log" \
        "$S/tests/mp/e2e.yaml" 2>/dev/null &
    jpid=$!
    CURLOG="$tmp/cw-$case.log"
    if wait_for 10 test -S "$DJ/ctl.sock"; then
        check "worker: $case" env NRS_CTL_CLI="$CLI" NRS_CTL_PID="$jpid" python3 "$S/tests/ctl/ctl_cases.py" "$DJ/ctl.sock" "$case"
    else
        ko "worker: $case" "no controller socket"
    fi
    CURLOG=""
    term_ctl "$jpid"
    wait "$jpid" 2>/dev/null
done

echo "[ RUN      ] SIGTERM exits 0 and removes the socket"
timeout -k 2 20 "$FW" --socket-dir "$D" --ranks 4 --nranks 16 --expect-epoch 99 --timeout 15 >/dev/null 2>&1 &
wait_for 10 bash -c "$CLI status --json --socket-dir $D | jq -e '.nworkers == 4' >/dev/null"
term_ctl "$cpid"
rc=124
for _ in $(seq 100); do if ! kill -0 "$cpid" 2>/dev/null; then wait "$cpid"; rc=$?; break; fi; sleep 0.1; done
cpid=""
if [ "$rc" -eq 0 ] && [ ! -e "$D/ctl.sock" ]; then ok "SIGTERM exits 0 and removes the socket"; else
    ko "SIGTERM exits 0 and removes the socket" "exit $rc, socket $( [ -e "$D/ctl.sock" ] && echo left || echo gone)"; fi
check "controller log says it stopped" grep -q 'stopped' "$LOG"

# a hang-up stops it the same way (before, libucs's UCX_DEBUG_SIGNO handler took
# it and the controller ran on)
echo "[ RUN      ] SIGHUP exits 0 and removes the socket"
DH="$tmp/hup"
"$CTL" --socket-dir "$DH" --gpus 16 --log "$tmp/hup.log" "$SPEC" 2>/dev/null &
hpid=$!
wait_for 10 test -S "$DH/ctl.sock"
[ "$(cat /proc/"$hpid"/comm 2>/dev/null)" = nereus-controll ] && kill -HUP "$hpid"
rc=124
for _ in $(seq 100); do if ! kill -0 "$hpid" 2>/dev/null; then wait "$hpid"; rc=$?; break; fi; sleep 0.1; done
if [ "$rc" -eq 0 ] && [ ! -e "$DH/ctl.sock" ] && grep -q 'signal 1 from' "$tmp/hup.log"; then ok "SIGHUP exits 0 and removes the socket"; else
    ko "SIGHUP exits 0 and removes the socket" "exit $rc, socket $( [ -e "$DH/ctl.sock" ] && echo left || echo gone)"; fi

[ "$pass" -gt 0 ] && echo "[  PASSED  ] $pass test(s)."
[ "$fail" -gt 0 ] && echo "[  FAILED  ] $fail test(s), listed above"
[ "$skip" -gt 0 ] && echo "[  SKIPPED ] $skip test(s)"
[ "$fail" -eq 0 ]
