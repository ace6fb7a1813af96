#!/usr/bin/env bash
# End to end (issue 6): nereus-controller + 8 nereus-worker ranks under the
# tests' PMIx server on tests/mp/e2e.yaml (2 nodes x 4 GPUs, zero1 off):
#   1. the response length grows -> the controller re-plans and admits a
#      transition -> every rank executes it -> every checksum intact;
#   2. a node's 4 ranks SIGKILLed, `nereus delta --lost node0` -> forced
#      transition on the 4 survivors (renumbered survivors first), state
#      rebuilt from dp replicas -> the job finishes, every checksum intact;
#  2b. one rank SIGKILLed between steps, its node kept, no delta: the
#      controller loses its GPU itself -> forced transition to the other
#      node (whole nodes), the dead rank's node-mates retired, the survivors
#      rebuild from replicas and finish;
#   3. peers that send garbage, a bad REPORT, or disconnect do not take the
#      controller down;
#   4. a rank SIGKILLed in the middle of a transition: every survivor aborts
#      with its old state intact, the controller sends ABORT; then it plans
#      without the dead rank's GPU (and its node), the survivors on the
#      other node move there with every checksum intact;
#   5. `nereus delta --remove node1` with node1's ranks alive: they are told
#      "rank retired" and leave, the survivors transition without waiting for
#      them (fences over the participants only);
#  5b. one GPU lost on 3 nodes of 4 (12 ranks, `delta --lost-gpus 1`): the
#      8-GPU plan of whole nodes is nodes 1 and 2, node0's other ranks have no
#      place (before: ranks kept their order, n2's last 3 were left out);
#   6. ZeRO-1 on (optimizer state split over dp: a lost node's shards survive
#      nowhere), a checkpoint every 5 steps: node0's ranks SIGKILLed, delta
#      --lost node0 -> the forced epoch restores the new plan's state from the
#      newest checkpoint, the survivors verify every shard;
#   7. a rank SIGKILLed right after the point-of-no-return vote of the first
#      transition: the survivors' state is partial (the census says what is
#      missing, the same on every survivor); `delta --lost node1` (its node:
#      the planner takes whole nodes) -> node1's other ranks are retired, the
#      forced epoch is rebuilt from what survives complete (no roll-back to
#      the checkpoint), the 4 survivors verify every shard;
#   8. an expansion: 4 ranks on node0 (controller --gpus 4), `delta --add 1`,
#      then a join step of 4 ranks (a second PMIx server, nereus-worker
#      --join): the controller connects the world through a gather, plans
#      on 8 GPUs, the joiners receive their replicas (dp grows), all 8
#      finish every step with every shard verified;
#   9. ranks 4-7 cannot reach the controller (no socket dir, as ranks on other
#      nodes of a real cluster today): every rank takes PMIx collectives (the
#      choice is made together at start-up), the job runs its 24 steps and
#      every rank verifies every shard; 10. the same ranks, the controller
#      also listening on TCP (--tcp, --secret-file DIR/secret, as the plugin
#      starts it): ranks 0-3 pass its contact (DIR/ctl.tcp) and the job's
#      secret to 4-7 through the start-up rendezvous, 4-7 connect over TCP,
#      and all 8 use the controller's collectives through a growth transition;
#  11. the controller SIGKILLed mid-run: every rank says its channel closed
#      and that the controller was lost, and the job exits 1, not 0.
# In each, every rank runs the actor's weight sync (actor.train -> actor.generate)
# every step and verifies its generation shards at the end; the 4-GPU epoch of 5.
# reshards (generate tp 4, train tp 2: bytes move), the 8-GPU epochs do not.
# Hard time-outs everywhere; prints the lines scripts/test counts.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/ctl_lib.sh"
FW="$B/tests/ctl/fake_workers"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/nrs-e2e.XXXXXX")
cpid="" spid=""
cleanup() {
    [ -n "$spid" ] && kill -KILL "$spid" 2>/dev/null
    [ -n "$cpid" ] && kill -KILL "$cpid" 2>/dev/null
    # a failed run keeps what explains it: sanitizer reports, aborts, signals
    if [ "${mp_fail:-0}" -gt 0 ]; then
        grep -HnE 'Sanitizer|runtime error|Assertion|abort|signal|core dumped' "$tmp"/*.log 2>/dev/null |
            grep -v 'transition aborted\|ABORT before\|abort: \|signal 15' | head -n 40 | sed 's/^/    ! /'
        grep -hA24 'ERROR: AddressSanitizer' "$tmp"/*.log 2>/dev/null | head -n 50 | sed 's/^/    ! /'
    fi
    rm -rf "$tmp" "$mp_out"
}
trap cleanup EXIT
# layouts_differ [STATUS.json]: "true" when the plan gives actor.generate
# another tp/pp than actor.train, "false" when not (jq's error otherwise)
layouts_differ() {
    jq -r '[.plan.stages[] | select(.name == "actor.generate" or .name == "actor.train") | "\(.tp)x\(.pp)"] | unique | length > 1' "$@" 2>/dev/null
}
# wait_srv TENTHS [FILTER FILE]: wait for the PMIx server $spid to end (SIGKILL
# after TENTHS tenths of a second); its exit status in $rc, 124 on time-out.
# With FILTER, the first status of $D for which it holds is kept in FILE.
wait_srv() {
    rc=124
    [ -n "${3:-}" ] && rm -f "$3"
    for _ in $(seq "$1"); do
        if ! kill -0 "$spid" 2>/dev/null; then wait "$spid"; rc=$?; break; fi
        if [ -n "${3:-}" ] && [ ! -s "$3" ] &&
            status_json "$D" 2>/dev/null | jq -e "$2" >/dev/null 2>&1; then
            status_json "$D" >"$3" 2>/dev/null
        fi
        sleep 0.1
    done
    [ "$rc" -eq 124 ] && kill -KILL "$spid" 2>/dev/null
    spid=""
}
# survivors LOG N KILLED...: pmix_srv --exits said in LOG how each of its N
# ranks ended; every one but the KILLED ones must have exited, none died by a
# signal (the server's status is the worst child's: a killed rank's 137 hid a
# survivor's SIGABRT in its finalize). $why says which did not.
survivors() {
    local log="$1" n="$2" r e
    shift 2
    why=""
    for r in $(seq 0 $((n - 1))); do
        case " $* " in *" $r "*) continue ;; esac
        e=$(grep -ao "pmix_srv: rank $r ended: [a-z]* [0-9]*" "$log" | head -n 1)
        [ -n "$e" ] || e="no end reported"
        case "$e" in *": exit "*) ;; *) why="${why:+$why; }rank $r: ${e#pmix_srv: rank $r ended: }" ;; esac
    done
    [ -z "$why" ]
}

echo "[==========] end to end: nereus-controller + 8 nereus-worker ranks"
if ! command -v jq >/dev/null; then mp_skip "end to end" "needs jq"; mp_done; fi

# --- 1. growth-driven transition -------------------------------------------------
D="$tmp/s1"
start_ctl "$D" "$tmp/c1.log"
export NEREUS_SOCKET_DIR="$D"
mp_case "growth: 8 ranks, 24 steps, response length 32 -> 256" 0 50 \
    "$SRV" -q -n 8 -t 45 -- "$WK" --spec "$SPEC" --steps 24 --step-ms 30 --gpus-per-host 4 \
    --response-len 32 --max-response-len 256
cp "$mp_out" "$tmp/w1.log"
n=$(grep -c 'verified [0-9]* shards, 0 mismatches' "$tmp/w1.log")
check "growth: 8 ranks verified every shard" "[ $n -eq 8 ]" "$n of 8"
n=$(grep -c 'step [0-9]*: epoch 2 committed' "$tmp/w1.log")
check "growth: 8 ranks committed epoch 2" "[ $n -eq 8 ]" "$n of 8"
# the per-step weight sync (actor.train -> actor.generate) ran on every rank, every step
n=$(grep -cE 'weight sync: 24 steps, [0-9]+ bytes, 0 failed, .*verified [1-9][0-9]* generation shards, 0 mismatches' "$tmp/w1.log")
check "growth: 8 ranks synced generation weights every step, every generation shard verified" \
    "[ $n -eq 8 ]" "$n of 8: $(grep -m1 'weight sync' "$tmp/w1.log")"
check "growth: the controller admitted a workload-triggered transition" \
    "grep -q 'trigger workload: ADMITTED' '$tmp/c1.log' && grep -q 'epoch 2 committed in' '$tmp/c1.log'" \
    "$(grep -c ADMITTED "$tmp/c1.log") admissions"
check "growth: status says epoch >= 2, one commit, no abort" \
    "jq_ok '$D' '.epoch >= 2 and .transitions.committed >= 1 and .transitions.aborted == 0'"
check "growth: the ranks' step agreements and votes went through the controller" \
    "jq_ok '$D' '.counters.gathers >= 24 and .counters.gathers_short == 0'" \
    "$(status_json "$D" | jq -c .counters)"
stop_ctl "growth"
grep -q 'ADMITTED' "$tmp/c1.log" || show "$tmp/c1.log"

# --- 2. a node lost: forced transition, recovery from replicas ------------------------
D="$tmp/s2"
start_ctl "$D" "$tmp/c2.log"
export NEREUS_SOCKET_DIR="$D"
echo "[ RUN      ] lost node: 8 ranks, node0's 4 ranks SIGKILLed, delta --lost node0, PMIx fences broken after"
# --break-fences: every PMIx fence fails once a rank died, as under Slurm 22.05
# after a shrink; the survivors agree through the controller alone
"$SRV" -q -n 8 -t 50 --break-fences --exits -- "$WK" --spec "$SPEC" --steps 48 --step-ms 30 --gpus-per-host 4 \
    --response-len 32 --max-response-len 256 >"$tmp/w2.log" 2>&1 &
spid=$!
# after the growth transition (epoch 2), while the job runs
wait_for 30 jq_ok "$D" '.epoch >= 2 and .nworkers == 8 and .transitions.committed >= 1'
jq_ok "$D" '.epoch >= 2' && ok "lost node: epoch 2 committed first" || ko "lost node: epoch 2 committed first" "still $(status_json "$D" | jq .epoch)"
# a misbehaving peer and a disconnecting one while the job runs
for mode in garbage badreport midframe; do
    timeout 20 "$FW" --socket-dir "$D" --bad "$mode" --timeout 10 >"$tmp/bad.out" 2>&1
done
pids=$(for r in 0 1 2 3; do sed -n "s/^rank $r of 8: pid \([0-9]*\),.*/\1/p" "$tmp/w2.log"; done)
check "lost node: found node0's 4 pids" "[ $(echo $pids | wc -w) -eq 4 ]"
kill -KILL $pids 2>/dev/null
wait_for 10 jq_ok "$D" '.nworkers == 4'
timeout 10 "$NRS" delta --lost node0 --socket-dir "$D" >"$tmp/delta.out" 2>&1
drc=$?
# (the controller may have planned node0's GPUs away already, on the
# survivors' next step: their ranks were gone; then the LOST was applied)
check "lost node: delta --lost node0 accepted, forced new epoch (or planned already)" \
    "[ $drc -eq 0 ] && grep -qE 'forced|already applied' '$tmp/delta.out'" "exit $drc: $(cat "$tmp/delta.out")"
wait_srv 450
check "lost node: the job ended (server exit 137: the 4 killed ranks)" "[ $rc -eq 137 ]" "exit $rc"
survivors "$tmp/w2.log" 8 0 1 2 3
check "lost node: the 4 survivors exited, none died by a signal" '[ -z "$why" ]' "$why"
n=$(grep -c 'verified [0-9]* shards, 0 mismatches' "$tmp/w2.log")
check "lost node: the 4 survivors verified every shard" "[ $n -eq 4 ]" "$n of 4"
# the forced epoch is the survivors' first commit on GPUs 0-3 after epoch 2 (a workload
# transition on the 4 GPUs may follow it before the job ends)
e=$(sed -n 's/^rank [4-7]: step [0-9]*: epoch \([0-9]*\) committed (GPU [0-3],.*/\1/p' "$tmp/w2.log" | sort -n | awk '$1 > 2' | head -1)
n=$(grep -E "^rank [4-7]: step [0-9]+: epoch ${e:-x} committed \(GPU [0-3]," "$tmp/w2.log" | sed 's/.*(GPU \([0-3]\),.*/\1/' | sort -u | wc -l)
check "lost node: survivors took GPUs 0-3 of the forced epoch (epoch ${e:-none})" "[ $n -eq 4 ]" "$n of 4"
n=$(grep -cE 'weight sync: [1-9][0-9]* steps, .*verified [1-9][0-9]* generation shards, 0 mismatches' "$tmp/w2.log")
check "lost node: the 4 survivors verified every generation shard" "[ $n -eq 4 ]" "$n of 4"
check "lost node: the controller forced it, no state lost" \
    "grep -q 'trigger resources: ADMITTED (forced)' '$tmp/c2.log' && ! grep -q 'STATE LOST' '$tmp/c2.log'"
check "lost node: status: 4 GPUs, >= 2 commits" \
    "jq_ok '$D' '.gpus == 4 and .plan.total_gpus == 4 and .transitions.committed >= 2'"
check "lost node: no sanitizer report from a survivor" \
    "! grep -q 'Sanitizer' '$tmp/w2.log'" "$(grep -m1 Sanitizer "$tmp/w2.log")"
check "lost node: the survivors' gathers went on without the dead ranks" \
    "jq_ok '$D' '.counters.gathers_short >= 1'" "$(status_json "$D" | jq -c .counters)"
check "bad peers were dropped, the controller stayed up" \
    "kill -0 $cpid && jq_ok '$D' '.counters.dropped >= 2'"
if [ "$mp_fail" -gt 0 ]; then show "$tmp/w2.log" 40; grep -v 'report' "$tmp/c2.log" | show /dev/stdin 30; fi
stop_ctl "lost node"

# --- 2b. a rank SIGKILLed between steps, its node kept: no delta comes ---------------
# Its GPU is lost at the controller's next decision (the survivors' next step),
# like a LOST delta of that GPU: the plan of whole nodes leaves node1 out, the
# survivors on node0 rebuild the state from replicas and go on (before: every
# later transition aborted on the dead rank's missing votes).
D="$tmp/s2b"
start_ctl "$D" "$tmp/c2b.log"
export NEREUS_SOCKET_DIR="$D"
echo "[ RUN      ] gone rank: 8 ranks, rank 5 SIGKILLed after epoch 2, node1 kept, no delta"
"$SRV" -q -n 8 -t 50 --break-fences --exits -- "$WK" --spec "$SPEC" --steps 48 --step-ms 30 \
    --gpus-per-host 4 --response-len 32 --max-response-len 256 >"$tmp/w2b.log" 2>&1 &
spid=$!
wait_for 30 jq_ok "$D" '.epoch >= 2 and .nworkers == 8 and .transition_phase == "idle"'
pid5=$(sed -n "s/^rank 5 of 8: pid \([0-9]*\),.*/\1/p" "$tmp/w2b.log")
check "gone rank: found rank 5's pid, epoch 2 committed first" "[ -n '$pid5' ] && jq_ok '$D' '.epoch >= 2'"
[ -n "$pid5" ] && kill -KILL "$pid5" 2>/dev/null
wait_srv 450 '.plan.total_gpus == 4 and .transition_phase == "idle"' "$tmp/plan2b.json"
check "gone rank: the job ended (server exit 137: the killed rank)" "[ $rc -eq 137 ]" "exit $rc"
survivors "$tmp/w2b.log" 8 5
check "gone rank: the 7 others exited, none died by a signal" '[ -z "$why" ]' "$why"
check "gone rank: the controller lost GPU 5 itself and forced a plan without it" \
    "grep -q 'GPU 5 of epoch [0-9]* lost: its rank (on node1) is gone' '$tmp/c2b.log' && grep -q 'trigger resources: ADMITTED (forced)' '$tmp/c2b.log' && [ -s '$tmp/plan2b.json' ]" \
    "$(grep -E 'lost|ABORT|ADMITTED' "$tmp/c2b.log" | tail -n 5)"
n=$(grep -E '^rank [0-3]: .*epoch [0-9]+ committed \(GPU [0-3]' "$tmp/w2b.log" | grep -v 'epoch 2 committed' | cut -d: -f1 | sort -u | wc -l)
check "gone rank: node0's 4 ranks took GPUs 0-3 of the forced epoch" "[ $n -eq 4 ]" "$n of 4"
n=$(grep -cE '^rank [0-3]: epoch [0-9]+, [0-9]+ transition\(s\): verified [1-9][0-9]* shards, 0 mismatches' "$tmp/w2b.log")
check "gone rank: node0's 4 ranks went on and verified every shard" "[ $n -eq 4 ]" "$n of 4"
n=$(grep -cE 'pmix_srv: rank [467] ended: exit 4' "$tmp/w2b.log")
check "gone rank: node1's 3 live ranks had no place in it (retired)" "[ $n -eq 3 ]" "$n of 3"
[ "$mp_fail" -gt 0 ] && { show "$tmp/w2b.log" 30; grep -v report "$tmp/c2b.log" | show /dev/stdin 30; }
stop_ctl "gone rank"

# --- 3. a rank dies in the middle of a transition: every survivor aborts -------------
D="$tmp/s3"
start_ctl "$D" "$tmp/c3.log"
export NEREUS_SOCKET_DIR="$D"
mp_case "abort: rank 5 SIGKILLed after 3 of its ops of the first transition" 137 50 \
    env NRS_WORKER_KILL=5:3 "$SRV" -q -n 8 -t 45 --exits -- "$WK" --spec "$SPEC" --steps 24 --step-ms 30 \
    --gpus-per-host 4 --response-len 32 --max-response-len 256
cp "$mp_out" "$tmp/w3.log"
survivors "$tmp/w3.log" 8 5
check "abort: the 7 survivors exited, none died by a signal" '[ -z "$why" ]' "$why"
n=$(grep 'transition aborted, staying on epoch 1: .*old state intact' "$tmp/w3.log" | cut -d: -f1 | sort -u | wc -l)
check "abort: the 7 survivors aborted, old state intact" "[ $n -eq 7 ]" "$n of 7"
# then the loss: the retry (after its back-off, while the ranks follow the
# controller for 2 s after their last step) plans without rank 5's GPU, and
# so without node1 (whole nodes); before, it kept the GPU and every retry
# aborted on rank 5's missing votes, the job ending on epoch 1
n=$(grep -cE '^rank [0-3]: epoch [0-9]+, 1 transition\(s\): verified [1-9][0-9]* shards, 0 mismatches' "$tmp/w3.log")
check "abort: then node0's 4 ranks moved to an epoch without GPU 5, every shard verified" "[ $n -eq 4 ]" "$n of 4"
n=$(grep -cE 'pmix_srv: rank [467] ended: exit 4' "$tmp/w3.log")
check "abort: node1's 3 live ranks had no place in it (retired)" "[ $n -eq 3 ]" "$n of 3"
check "abort: no sanitizer report from a survivor" \
    "! grep -q 'Sanitizer' '$tmp/w3.log'" "$(grep -m1 Sanitizer "$tmp/w3.log")"
check "abort: the controller sent ABORT, then lost GPU 5, and stayed up" \
    "grep -q 'ABORT before the point of no return: .*rank 5' '$tmp/c3.log' && grep -q 'GPU 5 of epoch 1 lost: its rank (on node1) is gone' '$tmp/c3.log' && jq_ok '$D' '.plan.total_gpus == 4 and .transitions.aborted >= 1 and .transitions.committed == 1'"
stop_ctl "abort"

# --- 4. a node removed gracefully: its ranks are alive, retired, not waited for --------
D="$tmp/s4"
start_ctl "$D" "$tmp/c4.log"
export NEREUS_SOCKET_DIR="$D"
echo "[ RUN      ] remove: delta --remove node1 while its 4 ranks run"
"$SRV" -q -n 8 -t 50 -- "$WK" --spec "$SPEC" --steps 40 --step-ms 30 --gpus-per-host 4 \
    --response-len 32 --max-response-len 256 >"$tmp/w4.log" 2>&1 &
spid=$!
# after epoch 2: its plan keeps dp replicas across the nodes (epoch 1's does not)
wait_for 30 jq_ok "$D" '.epoch >= 2 and .nworkers == 8 and .transitions.committed >= 1'
timeout 10 "$NRS" delta --remove node1 --socket-dir "$D" >"$tmp/delta4.out" 2>&1
drc=$?
# keep the committed 4-GPU plan: whether its sync has bytes to move
wait_srv 450 '.plan.total_gpus == 4 and .transition_phase == "idle"' "$tmp/plan4.json"
check "remove: delta accepted, the job ended (exit 4: the retired ranks)" "[ $drc -eq 0 ] && [ $rc -eq 4 ]" \
    "delta exit $drc, server exit $rc"
n=$(grep -c 'retired: .*rank retired' "$tmp/w4.log")
check "remove: node1's 4 ranks were told they are retired" "[ $n -eq 4 ]" "$n of 4"
n=$(grep -c 'after retirement: report_step: retired by the controller, weight_sync: retired by the controller' "$tmp/w4.log")
check "remove: after it, the retired ranks' report_step and weight_sync say so" "[ $n -eq 4 ]" \
    "$n of 4: $(grep -m1 'after retirement' "$tmp/w4.log")"
n=$(grep -E '^rank [0-3]: epoch [0-9]+, [0-9]+ transition\(s\): verified [0-9]* shards, 0 mismatches' "$tmp/w4.log" | wc -l)
check "remove: the 4 survivors moved on and verified every shard" "[ $n -eq 4 ] && jq_ok '$D' '.gpus == 4 and .plan.total_gpus == 4'" "$n of 4; status: $(status_json "$D" | jq -c '{gpus, epoch, pending_epoch, transition_phase, total: .plan.total_gpus}')"
# every step synced, or skipped at most once: the step between node1's ranks
# saying they are retired and the PREPARE of the epoch without them
n=$(sed -nE 's/^rank [0-3]: weight sync: ([0-9]+) steps, [0-9]+ bytes, ([0-9]+) failed, .*verified [1-9][0-9]* generation shards, 0 mismatches.*/\1 \2/p' "$tmp/w4.log" | awk '$1 + $2 == 40 && $2 <= 1' | wc -l)
check "remove: the 4 survivors synced every step, every generation shard verified" "[ $n -eq 4 ]" "$n of 4: $(grep -m1 '^rank [0-3]: weight sync' "$tmp/w4.log")"
# The sync moves bytes exactly when the committed plan gives actor.generate
# another tp/pp than actor.train (equal layouts share the buffers: an empty
# graph). Which plan wins depends on the calibrated speeds, so ask the plan.
b=$(sed -n 's/^rank [0-3]: weight sync: [0-9]* steps, \([0-9]*\) bytes.*/\1/p' "$tmp/w4.log" | awk '{s += $1} END {print s + 0}')
differ=$(layouts_differ "$tmp/plan4.json")
check "remove: the 4-GPU epoch's sync moved bytes iff generate and train layouts differ" \
    "{ [ '$differ' = true ] && [ $b -gt 0 ]; } || { [ '$differ' = false ] && [ $b -eq 0 ]; }" "$b bytes, layouts differ: ${differ:-unknown}"
[ "$mp_fail" -gt 0 ] && show "$tmp/w4.log" 30
stop_ctl "remove"

# --- 5b. one GPU lost: the plan of whole nodes leaves the rest of its node out ----------
D="$tmp/s5b"
start_ctl "$D" "$tmp/c5b.log" --gpus 12
export NEREUS_SOCKET_DIR="$D"
echo "[ RUN      ] lost GPU: 12 ranks on 3 nodes, delta --lost-gpus 1 while rank 1 runs"
"$SRV" -q -n 12 -t 50 -- "$WK" --spec "$SPEC" --steps 40 --step-ms 30 --gpus-per-host 4 \
    --response-len 32 --max-response-len 256 >"$tmp/w5b.log" 2>&1 &
spid=$!
wait_for 30 jq_ok "$D" '.nworkers == 12 and .plan.total_gpus == 12 and .transition_phase == "idle"'
timeout 10 "$NRS" delta --lost-gpus 1 --socket-dir "$D" >"$tmp/delta5b.out" 2>&1
drc=$?
# the committed 8-GPU plan with its 8 ranks, while they run
wait_srv 450 '.plan.total_gpus == 8 and .nworkers == 8 and .transition_phase == "idle"' "$tmp/plan5b.json"
check "lost GPU: delta accepted, the job ended (exit 4: the retired ranks)" "[ $drc -eq 0 ] && [ $rc -eq 4 ]" \
    "delta exit $drc, server exit $rc: $(cat "$tmp/delta5b.out")"
n=$(grep -E '^rank [0-3]: step [0-9]+: retired: ' "$tmp/w5b.log" | cut -d: -f1 | sort -u | wc -l)
check "lost GPU: node0's 4 ranks retired (rank 1 lost, 0, 2, 3 no place)" "[ $n -eq 4 ]" "$n of 4"
n=$(grep -E '^rank ([4-9]|1[01]): epoch [0-9]+, [0-9]+ transition\(s\): verified [0-9]* shards, 0 mismatches' "$tmp/w5b.log" | wc -l)
check "lost GPU: nodes 1 and 2's 8 ranks moved on and verified every shard" "[ $n -eq 8 ]" "$n of 8"
n=$(grep -E 'rank ([4-9]|1[01]): .*epoch [0-9]+ committed \(GPU [0-7]' "$tmp/w5b.log" | cut -d: -f1 | sort -u | wc -l)
check "lost GPU: nodes 1 and 2's ranks took GPUs 0-7" "[ $n -eq 8 ]" "$n of 8"
hosts=$(jq -c '[.workers[].host]' "$tmp/plan5b.json" 2>/dev/null)
check "lost GPU: the 8-GPU plan is nodes 1 and 2, whole" \
    "[ '$hosts' = '[\"node1\",\"node1\",\"node1\",\"node1\",\"node2\",\"node2\",\"node2\",\"node2\"]' ]" \
    "GPUs 0-7 on ${hosts:-(no status of the 8-GPU plan)}"
[ "$mp_fail" -gt 0 ] && show "$tmp/w5b.log" 30
stop_ctl "lost GPU"

# --- 6. state that survives nowhere: restore from the checkpoint ------------------------
D="$tmp/s6"
SPEC6="$tmp/e2e-zero1.yaml"
sed 's/^  zero1: false .*/  zero1: true/' "$SPEC" >"$SPEC6"
CTL_SPEC="$SPEC6" start_ctl "$D" "$tmp/c6.log"
export NEREUS_SOCKET_DIR="$D"
echo "[ RUN      ] restore: zero1, checkpoints every 5 steps, node0's 4 ranks SIGKILLed, delta --lost node0"
"$SRV" -q -n 8 -t 60 --break-fences --exits -- "$WK" --spec "$SPEC6" --steps 100 --step-ms 30 \
    --gpus-per-host 4 --response-len 32 --max-response-len 256 --checkpoint-dir "$tmp/ck6" \
    --checkpoint-every 5 >"$tmp/w6.log" 2>&1 &
spid=$!
wait_for 30 test -s "$tmp/ck6/LATEST"
check "restore: a checkpoint was published" "[ -s '$tmp/ck6/LATEST' ] && [ -d '$tmp/ck6/step-'\$(cat '$tmp/ck6/LATEST') ]"
pids=$(for r in 0 1 2 3; do sed -n "s/^rank $r of 8: pid \([0-9]*\),.*/\1/p" "$tmp/w6.log"; done)
kill -KILL $pids 2>/dev/null
wait_for 10 jq_ok "$D" '.nworkers == 4'
timeout 10 "$NRS" delta --lost node0 --socket-dir "$D" >"$tmp/delta6.out" 2>&1
drc=$?
wait_srv 550
check "restore: delta accepted, the job ended (server exit 137: the 4 killed ranks)" \
    "[ $drc -eq 0 ] && [ $rc -eq 137 ]" "delta exit $drc, server exit $rc"
survivors "$tmp/w6.log" 8 0 1 2 3
check "restore: the 4 survivors exited, none died by a signal" '[ -z "$why" ]' "$why"
check "restore: the controller saw the state lost on every replica" \
    "grep -q 'STATE LOST: checkpoint needed' '$tmp/c6.log'"
n=$(grep -cE '^rank [4-7]: step [0-9]+: transition: restored epoch [0-9]+ from the checkpoint of step [0-9]+' "$tmp/w6.log")
check "restore: the 4 survivors restored the forced epoch from the checkpoint" "[ $n -eq 4 ]" "$n of 4"
n=$(grep -cE '^rank [4-7]: epoch [0-9]+, [0-9]+ transition\(s\): verified [1-9][0-9]* shards, 0 mismatches' "$tmp/w6.log")
check "restore: the 4 survivors verified every shard" "[ $n -eq 4 ]" "$n of 4"
check "restore: status: 4 GPUs, the restore committed" \
    "jq_ok '$D' '.gpus == 4 and .plan.total_gpus == 4 and .transitions.committed >= 1'"
check "restore: no sanitizer report from a survivor" \
    "! grep -q 'Sanitizer' '$tmp/w6.log'" "$(grep -m1 Sanitizer "$tmp/w6.log")"
[ "$mp_fail" -gt 0 ] && { show "$tmp/w6.log" 30; grep -v report "$tmp/c6.log" | show /dev/stdin 20; }
stop_ctl "restore"

# --- 7. a rank lost past the point of no return: recovery from the checkpoint ---------------
D="$tmp/s7"
start_ctl "$D" "$tmp/c7.log"
export NEREUS_SOCKET_DIR="$D"
echo "[ RUN      ] past the PONR: rank 5 SIGKILLed right after the PONR vote, checkpoints every 5 steps"
NRS_WORKER_KILL=5:ponr "$SRV" -q -n 8 -t 70 --break-fences --exits -- "$WK" --spec "$SPEC" --steps 90 \
    --step-ms 30 --gpus-per-host 4 --response-len 32 --max-response-len 256 \
    --checkpoint-dir "$tmp/ck7" --checkpoint-every 5 >"$tmp/w7.log" 2>&1 &
spid=$!
partial() { [ "$(grep -c 'waiting for the recovery' "$tmp/w7.log")" -eq 7 ]; }
wait_for 40 partial
check "past the PONR: the 7 survivors hold a partial state and wait for the recovery" partial \
    "$(grep -c 'waiting for the recovery' "$tmp/w7.log") of 7"
wait_for 20 jq_ok "$D" '.nworkers == 7 and .transition_phase == "idle"'
g=$(status_json "$D" | jq -r '.epoch')
timeout 10 "$NRS" delta --lost node1 --socket-dir "$D" >"$tmp/delta7.out" 2>&1
drc=$?
wait_srv 550
check "past the PONR: delta --lost node1 accepted (epoch $g), the job ended (exit 137: rank 5)" \
    "[ $drc -eq 0 ] && [ $rc -eq 137 ]" "delta exit $drc: $(cat "$tmp/delta7.out"), server exit $rc"
survivors "$tmp/w7.log" 8 5
check "past the PONR: the 7 other ranks exited, none died by a signal" '[ -z "$why" ]' "$why"
# what survives complete on node0 is enough: the forced epoch is rebuilt from those
# replicas (the census's 'rebuildable'), no roll-back to the checkpoint
n=$(grep -E '^rank [0-3]: step [0-9]+: epoch [3-9] committed' "$tmp/w7.log" | cut -d: -f1 | sort -u | wc -l)
r=$(grep -cE '^rank [0-3]: step [0-9]+: transition: restored' "$tmp/w7.log")
check "past the PONR: the 4 survivors on node0 rebuilt the forced epoch from replicas, no restore" \
    "[ $n -eq 4 ] && [ $r -eq 0 ]" "$n of 4 committed, $r restored"
n=$(grep -cE '^rank [0-3]: epoch [0-9]+, [0-9]+ transition\(s\): verified [1-9][0-9]* shards, 0 mismatches' "$tmp/w7.log")
check "past the PONR: the 4 survivors verified every shard" "[ $n -eq 4 ]" "$n of 4"
n=$(grep -cE '^rank [4-7]: step [0-9]+: retired: ' "$tmp/w7.log")
check "past the PONR: node1's 3 live ranks were retired" "[ $n -eq 3 ]" "$n of 3"
check "past the PONR: status: 4 GPUs" "jq_ok '$D' '.gpus == 4 and .plan.total_gpus == 4'"
[ "$mp_fail" -gt 0 ] && { show "$tmp/w7.log" 30; grep -v report "$tmp/c7.log" | show /dev/stdin 20; }
stop_ctl "past the PONR"

# --- 8. an expansion: a join step's ranks join the job's world, dp grows -----------------
D="$tmp/s8"
start_ctl "$D" "$tmp/c8.log" --gpus 4
export NEREUS_SOCKET_DIR="$D"
echo "[ RUN      ] expansion: 4 ranks, delta --add 1, a join step of 4 ranks"
"$SRV" -q -n 4 -t 60 -- "$WK" --spec "$SPEC" --steps 100 --step-ms 30 --gpus-per-host 4 \
    --response-len 32 --max-response-len 256 >"$tmp/w8.log" 2>&1 &
spid=$!
wait_for 20 jq_ok "$D" '.nworkers == 4'
timeout 10 "$NRS" delta --add 1 --socket-dir "$D" >"$tmp/delta8.out" 2>&1
drc=$?
check "expansion: delta --add 1 accepted, the plan kept until ranks join" \
    "[ $drc -eq 0 ] && grep -q 'plan kept' '$tmp/delta8.out'" "exit $drc: $(cat "$tmp/delta8.out")"
NEREUS_HOSTNAME=node1 "$SRV" -q -n 4 -t 60 -- "$WK" --join --spec "$SPEC" --steps 100 \
    --step-ms 30 --response-len 32 --max-response-len 256 >"$tmp/j8.log" 2>&1 &
jpid=$!
wait_for 40 jq_ok "$D" '.nworkers == 8 and .plan.total_gpus == 8'
check "expansion: 8 workers on an 8-GPU plan while the job runs" \
    "jq_ok '$D' '.nworkers == 8 and .plan.total_gpus == 8' || ! kill -0 $spid 2>/dev/null" \
    "$(status_json "$D" | jq -c '{nworkers, gpus, epoch}')"
wait_steps 650
check "expansion: both steps ended cleanly" "[ $rc -eq 0 ] && [ $jrc -eq 0 ]" "first step $rc, join step $jrc"
check "expansion: the controller connected the world (8 ranks) and grew the plan" \
    "grep -q 'world 1: 4 rank(s) joined as 4..7' '$tmp/c8.log' && grep -q 'decision \[join\] trigger resources: ADMITTED' '$tmp/c8.log'"
n=$(grep -cE '^rank [4-7] of 8: joined the job at step [0-9]+' "$tmp/j8.log")
check "expansion: the 4 joiners are world ranks 4-7" "[ $n -eq 4 ]" "$n of 4"
n=$(grep -E '^rank [4-7]: step [0-9]+: epoch [0-9]+ committed \(GPU [4-7],' "$tmp/j8.log" | cut -d: -f1 | sort -u | wc -l)
check "expansion: the joiners took GPUs 4-7 of the grown epoch" "[ $n -eq 4 ]" "$n of 4"
n=$(cat "$tmp/w8.log" "$tmp/j8.log" | grep -cE '^rank [0-7]: epoch [0-9]+, [0-9]+ transition\(s\): verified [1-9][0-9]* shards, 0 mismatches')
check "expansion: all 8 ranks verified every shard" "[ $n -eq 8 ]" "$n of 8"
check "expansion: status: 8 GPUs" "jq_ok '$D' '.gpus == 8 and .plan.total_gpus == 8'"
check "expansion: no sanitizer report" "! grep -q 'Sanitizer' '$tmp/w8.log' '$tmp/j8.log'"
[ "$mp_fail" -gt 0 ] && { show "$tmp/j8.log" 20; grep -v report "$tmp/c8.log" | show /dev/stdin 20; }
stop_ctl "expansion"

# --- 9. a control channel on some ranks only: all ranks use PMIx collectives -------------
D="$tmp/s9"
start_ctl "$D" "$tmp/c9.log"
export NEREUS_SOCKET_DIR="$D"
cat >"$tmp/half.sh" <<'EOS'
#!/bin/sh
[ "${PMIX_RANK:-0}" -ge 4 ] && unset NEREUS_SOCKET_DIR NEREUS_JOB_DIR
exec "$@"
EOS
chmod +x "$tmp/half.sh"
mp_case "mixed: 8 ranks, 4 with a control channel, 24 steps" 0 50 \
    "$SRV" -q -n 8 -t 45 -- "$tmp/half.sh" "$WK" --spec "$SPEC" --steps 24 --step-ms 30 \
    --gpus-per-host 4 --response-len 32 --max-response-len 32 --quiet-s 0.5
cp "$mp_out" "$tmp/w9.log"
check "mixed: rank 0 says the collectives go over PMIx" \
    "grep -q '4 of 8 ranks have a control channel: collectives over PMIx' '$tmp/w9.log'"
n=$(grep -c 'verified [0-9]* shards, 0 mismatches' "$tmp/w9.log")
check "mixed: 8 ranks verified every shard" "[ $n -eq 8 ]" "$n of 8"
# One epoch: where its plan gives actor.generate train's layout, every sync
# had nothing to move and cast no vote (API 9); otherwise none of them.
differ=$(status_json "$D" 2>/dev/null | layouts_differ)
want=$([ "$differ" = false ] && echo 24 || echo 0)
n=$(grep -cE "^rank [0-7]: weight syncs with nothing to move \(no vote\): $want$" "$tmp/w9.log")
s=$(grep -cE '^rank [0-7]: weight sync: 24 steps, ' "$tmp/w9.log")
check "mixed: every sync of an epoch whose layouts agree casts no vote, else none" \
    "[ -n '$differ' ] && [ $n -eq 8 ] && [ $s -eq 8 ]" "$n of 8 with $want no-vote syncs ($s synced 24 steps), layouts differ: ${differ:-unknown}"
stop_ctl "mixed"

# --- 10. ranks that cannot reach the socket connect over TCP -----------------------------
D="$tmp/s10"
mkdir -m 700 "$D"
head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$D/secret"
chmod 600 "$D/secret"
start_ctl "$D" "$tmp/c10.log" --tcp 127.0.0.1:0 --secret-file "$D/secret"
wait_for 10 test -s "$D/ctl.tcp"
export NEREUS_SOCKET_DIR="$D"
mp_case "tcp: 8 ranks, 4 reach the controller over TCP, 24 steps, response length 32 -> 256" 0 50 \
    "$SRV" -q -n 8 -t 45 -- "$tmp/half.sh" "$WK" --spec "$SPEC" --steps 24 --step-ms 30 \
    --gpus-per-host 4 --response-len 32 --max-response-len 256
cp "$mp_out" "$tmp/w10.log"
check "tcp: the controller wrote its contact" "grep -qE '^127.0.0.1:[0-9]+$' '$D/ctl.tcp'"
check "tcp: no rank fell back to PMIx" "! grep -q 'collectives over PMIx' '$tmp/w10.log'"
# ranks 4-7 have no socket dir: connected means over TCP, with the contact
n=$(grep -cE '^rank [4-7] of 8: .*control connected' "$tmp/w10.log")
check "tcp: ranks 4-7 (no socket dir) connected over TCP" "[ $n -eq 4 ]" "$n of 4"
check "tcp: all 8 agreed through the controller" "jq_ok '$D' '.counters.gathers >= 24'" \
    "$(status_json "$D" | jq -c .counters)"
n=$(grep -c 'step [0-9]*: epoch 2 committed' "$tmp/w10.log")
check "tcp: 8 ranks committed epoch 2" "[ $n -eq 8 ]" "$n of 8"
n=$(grep -c 'verified [0-9]* shards, 0 mismatches' "$tmp/w10.log")
check "tcp: 8 ranks verified every shard" "[ $n -eq 8 ]" "$n of 8"
stop_ctl "tcp"
check "tcp: the contact file went with the controller" "[ ! -e '$D/ctl.tcp' ]"

# --- 11. the controller SIGKILLed mid-run ---------------------------------------------------
# The ranks run on without adaptation; each says its channel closed, and the
# job does not end as a success (it once exited 0 with every later weight
# sync failed).
D="$tmp/s11"
start_ctl "$D" "$tmp/c11.log"
export NEREUS_SOCKET_DIR="$D"
( sleep 3; kill -KILL "$cpid" ) &
killer=$!
mp_case "lost controller: SIGKILLed 3 s into a 30-step job: the job exits 1" 1 60 \
    "$SRV" -q -n 8 -t 55 -- "$WK" --spec "$SPEC" --steps 30 --step-ms 200 --gpus-per-host 4 \
    --response-len 32 --max-response-len 32
wait "$killer" 2>/dev/null
cp "$mp_out" "$tmp/w11.log"
n=$(grep -c 'the controller was lost during the run' "$tmp/w11.log")
check "lost controller: all 8 ranks said so" "[ $n -eq 8 ]" "$n of 8"
n=$(grep -c 'nereus: worker\[[0-7]\]: control channel closed' "$tmp/w11.log")
check "lost controller: each rank logged its channel closing once" "[ $n -eq 8 ]" "$n of 8"
cpid=""
mp_done
