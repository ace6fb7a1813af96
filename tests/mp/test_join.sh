#!/usr/bin/env bash
# Joiners that wait their turn, with real ranks (nereus-controller, 8 + 8
# nereus-worker ranks under the tests' PMIx server, tests/mp/e2e.yaml, nodes
# of 4 GPUs): after the growth epoch, node0's 4 ranks SIGKILLed and `delta
# --lost node0` (4 GPUs left; ranks 0-3 dead, lower than any joiner; the
# survivors rebuild from dp replicas), `delta --add 1` and a join
# step of 8 ranks (world ranks 8-15): 4 of them take GPUs 4-7, 4 wait; then
# `delta --add 1` again: the 4 that waited take GPUs 8-11. The controller
# places joiners by count in world-rank order; the ranks must agree with it,
# so the GPUs added go to the joiners in line (12-15), not to the dead ranks
# 0-3 that stand before them in the ranks order. Every live rank verifies
# every shard; the 4 that waited take the job's step when placed, and every
# rank of the join step ends 0. Then a joiner killed at the start of the
# growth transition: aborted once, not retried. Hard time-outs everywhere.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/ctl_lib.sh"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/nrs-join.XXXXXX")
cpid="" spid="" jpid=""
cleanup() {
    for p in "$spid" "$jpid" "$cpid"; do [ -n "$p" ] && kill -KILL "$p" 2>/dev/null; done
    rm -rf "$tmp" "$mp_out"
}
trap cleanup EXIT
echo "[==========] joins: joiners in line for the GPUs a plan adds"
if ! command -v jq >/dev/null; then mp_skip "joins" "needs jq"; mp_done; fi
D="$tmp/s"
start_ctl "$D" "$tmp/c.log"
export NEREUS_SOCKET_DIR="$D"
echo "[ RUN      ] joins: 8 ranks, node0 lost, a join step of 8 for 4 GPUs, then 4 more GPUs"
"$SRV" -q -n 8 -t 170 -- "$WK" --spec "$SPEC" --steps 900 --step-ms 30 --gpus-per-host 4 \
    --response-len 32 --max-response-len 256 >"$tmp/w.log" 2>&1 &
spid=$!
wait_for 40 jq_ok "$D" '.epoch >= 2 and .nworkers == 8 and .pending_epoch == null'
pids=$(for r in 0 1 2 3; do sed -n "s/^rank $r of 8: pid \([0-9]*\),.*/\1/p" "$tmp/w.log"; done)
check "joins: found node0's 4 pids" "[ $(echo $pids | wc -w) -eq 4 ]"
kill -KILL $pids 2>/dev/null
wait_for 10 jq_ok "$D" '.nworkers == 4'
timeout 10 "$NRS" delta --lost node0 --socket-dir "$D" >"$tmp/d1.out" 2>&1
wait_for 40 jq_ok "$D" '.plan.total_gpus == 4 and .nworkers == 4 and .pending_epoch == null'
check "joins: node0 lost: a 4-GPU epoch" "jq_ok '$D' '.plan.total_gpus == 4 and .nworkers == 4'" \
    "$(status_json "$D" | jq -c '{epoch, nworkers, gpus}')"
timeout 10 "$NRS" delta --add 1 --socket-dir "$D" >"$tmp/d2.out" 2>&1
NEREUS_HOSTNAME=node2 "$SRV" -q -n 8 -t 160 --exits -- "$WK" --join --spec "$SPEC" --steps 900 \
    --step-ms 30 --response-len 32 --max-response-len 256 >"$tmp/j.log" 2>&1 &
jpid=$!
wait_for 60 jq_ok "$D" '.plan.total_gpus == 8 and .nworkers == 8 and .pending_epoch == null'
check "joins: 4 joiners placed on an 8-GPU plan, 4 waiting" \
    "jq_ok '$D' '.plan.total_gpus == 8 and .nworkers == 8'" "$(status_json "$D" | jq -c '{epoch, nworkers, gpus}')"
timeout 10 "$NRS" delta --add 1 --socket-dir "$D" >"$tmp/d3.out" 2>&1
wait_for 60 jq_ok "$D" '.plan.total_gpus == 12 and .nworkers == 12 and .pending_epoch == null'
check "joins: the 4 that waited placed on a 12-GPU plan" \
    "jq_ok '$D' '.plan.total_gpus == 12 and .nworkers == 12 and .transitions.aborted == 0'" \
    "$(status_json "$D" | jq -c '{epoch, nworkers, gpus, transitions}')"
wait_steps 1500
check "joins: the first step ended (137: its 4 killed ranks)" "[ $rc -eq 137 ]" "first step $rc"
# Every rank of the join step ends 0: the 4 that waited counted steps of
# their own while in line and take the job's step when placed
# (nrs_worker_job_step), so all end together and meet in finalize.
n=$(grep -acE 'pmix_srv: rank [0-7] ended: exit 0' "$tmp/j.log")
check "joins: every rank of the join step exited 0" "[ $n -eq 8 ]" \
    "$(grep -ao 'pmix_srv: rank [0-9]* ended: [a-z]* [0-9]*' "$tmp/j.log" | tr '\n' ' ')"
n=$(grep -acE "^rank (12|13|14|15): step [0-9]+: placed at the job's step [0-9]+" "$tmp/j.log")
check "joins: the 4 that waited took the job's step when placed" "[ $n -eq 4 ]" "$n of 4"
# ... the step at which the first step's ranks committed that epoch
e=$(sed -n 's/^rank 12: step [0-9]*: epoch \([0-9]*\) committed (GPU [89],.*/\1/p' "$tmp/j.log" | head -1)
js=$(sed -n "s/^rank 12: step [0-9]*: placed at the job's step \([0-9]*\):.*/\1/p" "$tmp/j.log" | tail -1)
ws=$(sed -n "s/^rank 4: step \([0-9]*\): epoch ${e:-x} committed.*/\1/p" "$tmp/w.log" | head -1)
check "joins: that step is the one the first step's ranks committed epoch ${e:-?} at" \
    "[ -n '$js' ] && [ '$js' = '$ws' ]" "placed at ${js:-?}, rank 4 committed at ${ws:-?}"
check "joins: no finalize barrier completed without a rank" \
    "! grep -aq 'already completed without' '$tmp/w.log' '$tmp/j.log'"
check "joins: the controller took no REPORT of the placed joiners for stale" \
    "! grep -q 'stale REPORT' '$tmp/c.log'" "$(grep -m2 'stale REPORT' "$tmp/c.log")"
n=$(grep -E '^rank (8|9|10|11): step [0-9]+: epoch [0-9]+ committed \(GPU [4-7],' "$tmp/j.log" | cut -d: -f1 | sort -u | wc -l)
check "joins: world ranks 8-11 took GPUs 4-7" "[ $n -eq 4 ]" "$n of 4"
n=$(grep -E '^rank (12|13|14|15): step [0-9]+: epoch [0-9]+ committed \(GPU ([89]|1[01]),' "$tmp/j.log" | cut -d: -f1 | sort -u | wc -l)
check "joins: world ranks 12-15, which waited, took GPUs 8-11" "[ $n -eq 4 ]" "$n of 4"
n=$(cat "$tmp/w.log" "$tmp/j.log" | grep -cE '^rank [0-9]+: epoch [0-9]+, [0-9]+ transition\(s\): verified [1-9][0-9]* shards, 0 mismatches')
check "joins: all 12 live ranks verified every shard" "[ $n -eq 12 ]" "$n of 12"
check "joins: no sanitizer report" "! grep -q 'Sanitizer' '$tmp/w.log' '$tmp/j.log'"
[ "$mp_fail" -gt 0 ] && { show "$tmp/j.log" 30; grep -v report "$tmp/c.log" | show /dev/stdin 30; }
stop_ctl "joins"

# A joiner that dies after the world formed, at the start of the growth
# transition (NRS_WORKER_KILL=6:0: world rank 6, before its first op): every
# rank aborts it with its old state intact, and the controller does not try
# the growth again: node1 has 3 live ranks for 4 GPUs and plans take whole
# nodes. The job goes on on 4 GPUs; the 3 joiners left wait in line to the end.
D="$tmp/s2"
start_ctl "$D" "$tmp/c2.log" --gpus 4
export NEREUS_SOCKET_DIR="$D"
echo "[ RUN      ] joins: a joiner killed at the start of the growth transition"
"$SRV" -q -n 4 -t 90 -- "$WK" --spec "$SPEC" --steps 300 --step-ms 30 --gpus-per-host 4 \
    --response-len 32 --max-response-len 256 >"$tmp/w2.log" 2>&1 &
spid=$!
wait_for 20 jq_ok "$D" '.nworkers == 4'
timeout 10 "$NRS" delta --add 1 --socket-dir "$D" >"$tmp/d4.out" 2>&1
NRS_WORKER_KILL=6:0 NEREUS_HOSTNAME=node1 "$SRV" -q -n 4 -t 90 --exits -- "$WK" --join \
    --spec "$SPEC" --steps 300 --step-ms 30 --response-len 32 --max-response-len 256 \
    >"$tmp/j2.log" 2>&1 &
jpid=$!
wait_for 40 jq_ok "$D" '.transitions.aborted >= 1 and .pending_epoch == null'
st=$(status_json "$D" | jq -c '{epoch, nworkers, gpus, plan: .plan.total_gpus, transitions}')
wait_steps 900
check "joins: the first step ended 0" "[ $rc -eq 0 ]" "first step $rc"
check "joins: the killed joiner died by SIGKILL, its 3 peers exited 0" \
    "grep -aq 'pmix_srv: rank 2 ended: signal 9' '$tmp/j2.log' && [ \$(grep -acE 'pmix_srv: rank [013] ended: exit 0' '$tmp/j2.log') -eq 3 ]" \
    "$(grep -ao 'pmix_srv: rank [0-9]* ended: [a-z]* [0-9]*' "$tmp/j2.log" | tr '\n' ' ')"
n=$(cat "$tmp/w2.log" "$tmp/j2.log" | grep -cE '^rank [0-57]: step [0-9]+: transition aborted, staying on epoch 1: transition 1 -> 2: rank 6 died .*old state intact')
check "joins: all 7 live ranks aborted the growth, naming rank 6, old state intact" "[ $n -eq 7 ]" "$n of 7"
check "joins: the growth aborted once and was not retried; 4 GPUs planned" \
    "jq_ok '$D' '.transitions.started == 1 and .transitions.aborted == 1 and .plan.total_gpus == 4 and .epoch == 1'" \
    "at the abort: $st; now: $(status_json "$D" | jq -c '{epoch, plan: .plan.total_gpus, transitions}')"
n=$(grep -cE '^rank [0-3]: epoch 1, 0 transition\(s\): verified 116 shards, 0 mismatches' "$tmp/w2.log")
check "joins: the first step's 4 ranks verified every shard of epoch 1" "[ $n -eq 4 ]" "$n of 4"
check "joins: no finalize barrier completed without a rank" \
    "! grep -aq 'already completed without' '$tmp/w2.log' '$tmp/j2.log'"
# sends to rank 6 that UCX 1.13 cannot purge on shared memory were released
# at shutdown: UCX's warning per request is left out (one line of ours)
check "joins: no UCX 'not returned to mpool' warning per request" \
    "! grep -aq 'was not returned to mpool' '$tmp/w2.log' '$tmp/j2.log'" \
    "$(grep -ac 'was not returned to mpool' "$tmp/w2.log") in the first step's log"
check "joins: no sanitizer report" "! grep -q 'Sanitizer' '$tmp/w2.log' '$tmp/j2.log'"
[ "$mp_fail" -gt 0 ] && { show "$tmp/j2.log" 30; grep -v report "$tmp/c2.log" | show /dev/stdin 30; }
stop_ctl "joins, one killed"
mp_done
