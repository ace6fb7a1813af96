#!/usr/bin/env bash
# The controller dies while it sends COMMIT (nereus-controller with
# NRS_CTL_DIE_MID_COMMIT=N: SIGKILLed once N workers have their COMMIT
# written out), with real ranks (8 nereus-worker ranks under the tests' PMIx
# server, tests/mp/e2e.yaml, the workload-driven transition of epoch 2). The
# ranks that got COMMIT go past the point of no return; the others find the
# channel gone, undecided. With the collectives over PMIx
# (NRS_WORKER_COLL=pmix: they outlive the controller) they settle it among
# themselves in one more gather: an undecided rank commits when some rank got
# the COMMIT, so all 8 end on epoch 2 with every shard verified, and run on
# without the controller (nereus-worker then exits 1: "the controller was
# lost during the run"). With N = 0 the controller dies before any COMMIT:
# all abort and stay on epoch 1. (With the collectives through the
# controller, the default, its death fails every later collective: the job
# ends, README "Controller death".) Hard time-outs everywhere.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/ctl_lib.sh"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/nrs-settle.XXXXXX")
cpid="" spid=""
cleanup() {
    for p in "$spid" "$cpid"; do [ -n "$p" ] && kill -KILL "$p" 2>/dev/null; done
    rm -rf "$tmp" "$mp_out"
}
trap cleanup EXIT
echo "[==========] settle: the controller dies while it sends COMMIT"
if ! command -v jq >/dev/null; then mp_skip "settle" "needs jq"; mp_done; fi

# run N: the job with the controller dying after N COMMITs; its logs in $tmp/*N.log
run() {
    local n="$1" D="$tmp/s$1"
    NRS_CTL_DIE_MID_COMMIT=$n start_ctl "$D" "$tmp/c$n.log"
    NRS_WORKER_COLL=pmix NEREUS_SOCKET_DIR="$D" "$SRV" -q -n 8 -t 240 --exits -- "$WK" --spec "$SPEC" --steps 40 \
        --step-ms 30 --gpus-per-host 4 --response-len 32 --max-response-len 256 \
        >"$tmp/w$n.log" 2>&1
    rc=$?
    for _ in $(seq 50); do kill -0 "$cpid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$cpid" 2>/dev/null && { kill -KILL "$cpid"; dead=0; } || dead=1
    wait "$cpid" 2>/dev/null
    cpid=""
}

echo "[ RUN      ] settle: 8 ranks, the controller SIGKILLed after 3 COMMITs"
run 3
check "settle: the controller died with COMMIT sent to 3 workers" \
    "[ $dead -eq 1 ] && grep -q 'dying with COMMIT sent to 3 worker' '$tmp/c3.log'"
# ends() LOG: every rank ran to its end and said the controller was lost (exit 1)
ends() {
    [ "$(grep -acE 'pmix_srv: rank [0-7] ended: exit 1' "$1")" -eq 8 ] &&
        [ "$(grep -acE '^rank [0-7]: the controller was lost during the run' "$1")" -eq 8 ]
}
check "settle: every rank ran to its end, the controller lost (exit 1, none 3: partial)" "ends '$tmp/w3.log'" \
    "$(grep -ao 'pmix_srv: rank [0-9]* ended: [a-z]* [0-9]*' "$tmp/w3.log" | tr '\n' ' ')"
n=$(grep -cE '^rank [0-7]: step [0-9]+: epoch 2 committed' "$tmp/w3.log")
check "settle: all 8 ranks committed epoch 2" "[ $n -eq 8 ]" "$n of 8"
n=$(grep -cE '^rank [0-7]: step [0-9]+: transition aborted' "$tmp/w3.log")
check "settle: no rank aborted it" "[ $n -eq 0 ]" "$n aborted: $(grep -m1 'transition aborted' "$tmp/w3.log")"
n=$(grep -cE '^rank [0-7]: epoch 2, [0-9]+ transition\(s\): verified [1-9][0-9]* shards, 0 mismatches' "$tmp/w3.log")
check "settle: all 8 verified every shard of epoch 2" "[ $n -eq 8 ]" "$n of 8"
check "settle: no sanitizer report" "! grep -q 'Sanitizer' '$tmp/w3.log'"
[ "$mp_fail" -gt 0 ] && { show "$tmp/w3.log" 30; grep -v report "$tmp/c3.log" | show /dev/stdin 20; }

echo "[ RUN      ] settle: 8 ranks, the controller SIGKILLed before any COMMIT"
run 0
f=$mp_fail
check "settle: every rank ran to its end, the controller lost (exit 1)" "ends '$tmp/w0.log'" \
    "$(grep -ao 'pmix_srv: rank [0-9]* ended: [a-z]* [0-9]*' "$tmp/w0.log" | tr '\n' ' ')"
n=$(grep -cE '^rank [0-7]: step [0-9]+: transition aborted, staying on epoch 1: .*no COMMIT from the controller.*no other rank got the commit' "$tmp/w0.log")
check "settle: all 8 aborted the transition: none got the commit" "[ $n -eq 8 ]" "$n of 8: $(grep -m1 'transition aborted' "$tmp/w0.log")"
n=$(grep -cE '^rank [0-7]: epoch 1, 0 transition\(s\): verified [1-9][0-9]* shards, 0 mismatches' "$tmp/w0.log")
check "settle: all 8 stayed on epoch 1, every shard verified" "[ $n -eq 8 ]" "$n of 8"
[ "$mp_fail" -gt "$f" ] && { show "$tmp/w0.log" 30; grep -v report "$tmp/c0.log" | show /dev/stdin 20; }
mp_done
