#!/usr/bin/env bash
# --nereus jobs resized twice (DESIGN §8). Slurm 22.05 without slurmdbd
# refuses any "scontrol update JobId=A ..." of a job that was resized once
# ("the DB index is being set"), so this needs "scripts/cluster up
# --accounting"; it skips otherwise.
#
# 1. shrink, then expand: a 4-node --no-kill job A is shrunk with "scontrol
#    update JobId=A NumNodes=2", then grown back with an allocation B on the
#    released nodes (--dependency=expand:A) merged by "scontrol update JobId=B
#    NumNodes=0" and, as Slurm's FAQ has it, "scontrol update JobId=A
#    NumNodes=ALL" (the update refused without slurmdbd). After each step
#    slurmctld's node list of A is checked, and the allocation watcher must
#    have sent the controller the matching delta (REMOVE, then ADD) within 2
#    poll intervals (poll_interval=1 here); the controller's status shows both
#    (16 -> 8 -> 16 GPUs, generation 2); the job finishes normally and is in
#    the accounting database.
# 2. node failure, then shrink: job C on n1..n4 loses n2 (State=DOWN: a LOST
#    delta; the controller commits epoch 2 on n1 n3 n4) and is then shrunk to
#    2 nodes (n4 released). No worker runs, so the controller knows no host
#    and the watcher names n4 by GPU index: its place in epoch 2's node order
#    (8..11), not epoch 1's (12..15, which epoch 2 no longer has).
. "$(dirname "$0")/lib.sh"
acct=$(timeout 10 scontrol show config 2>/dev/null | sed -n 's/^AccountingStorageType *= *//p')
if [ "$acct" != accounting_storage/slurmdbd ]; then
    sl_skip "resize twice" "the cluster runs without slurmdbd (AccountingStorageType=${acct:-?}; scripts/cluster up --accounting)"
    sl_done
fi
sl_need_plugin "resize twice"
sl_need_bins "resize twice" nereus
cd "$sl_tmp" || exit 1
# scontrol update, again while slurmctld says "the DB index is being set, try
# again in a bit" (slurmdbd has not yet given the job's new record an index).
resize() { # scontrol update arguments...
    local deadline=$((SECONDS + 30))
    while :; do
        sl_run 20 scontrol update "$@"
        [ "$sl_rc" -ne 0 ] && grep -q 'DB index is being set' "$sl_out" && [ $SECONDS -lt $deadline ] ||
            return 0
        sleep 0.5
    done
}
nodes_of() { timeout 10 scontrol show hostnames "$(sl_job_field "$1" NodeList)" | xargs; }
stop_all() { touch "$sl_tmp/stop"; timeout 10 scancel "$a" ${b:+"$b"} 2>/dev/null; }
b=""

sl_run 20 sbatch --parsable -J nrs-resize2 -N 4 --no-kill -o "$sl_tmp/a.out" --nereus=good.yaml \
    --wrap "while [ ! -e $sl_tmp/stop ]; do sleep 0.2; done; echo batch done"
a=$(tail -1 "$sl_out")
jobdir="$NRS_CLUSTER_DIR/nereus/n1/$a"
started() { grep -q 'started .*nereus-controller' "$jobdir/watcher.log" 2>/dev/null; }
answers() { timeout 10 "$nrs" status --socket-dir "$jobdir" >/dev/null 2>&1; }
if ! { [ "$sl_rc" -eq 0 ] && sl_wait_job_state "$a" RUNNING 30 && sl_wait_until 15 started &&
    sl_wait_until 10 answers; }; then
    sl_fail "4-node --nereus job running with its controller" "job '$a'"
    stop_all; sl_done
fi
sl_ok "4-node --nereus job $a running with its controller"
sl_run 10 "$nrs" status --json --socket-dir "$jobdir"
cp "$sl_out" status0.json

# ---- 1st resize: shrink to 2 nodes --------------------------------------------
resize JobId="$a" NumNodes=2
t1=$SECONDS
if [ "$sl_rc" -eq 0 ] && sl_wait_until 10 sl_job_num_nodes "$a" 2 && [ "$(nodes_of "$a")" = "n1 n2" ] &&
    [ "$(sl_job_field "$a" JobState)" = RUNNING ]; then
    sl_ok "1st resize: scontrol update JobId=$a NumNodes=2: RUNNING on n1 n2"
else
    sl_fail "1st resize: scontrol update JobId=$a NumNodes=2: RUNNING on n1 n2" \
        "rc $sl_rc, $(sl_job_field "$a" NumNodes) nodes ($(nodes_of "$a")), $(sl_job_field "$a" JobState)"
    stop_all; sl_done
fi
sl_delta_within "watcher sent REMOVE n3,n4" "16 -> 8 GPUs" "$t1" "$jobdir" \
    'resource delta 1: remove -> 8 GPUs' 'delta REMOVE hosts n3,n4'
released_idle() { [ "$(timeout 10 sinfo -h -N -n 'n[3-4]' -o %T | grep -cx idle)" -eq 2 ]; }
sl_wait_until 20 released_idle

# ---- 2nd resize: expand by 2 nodes; then NumNodes=ALL on A (without slurmdbd
# 22.05 refuses that update, and any other of A, after the 1st resize) ----------
sl_run 30 salloc -J nrs-resize2-b -N 2 -w 'n[3-4]' --dependency=expand:"$a" --no-shell
b=$(sl_granted_job)
if [ -z "$b" ]; then
    sl_fail "allocation with --dependency=expand:$a granted" "rc $sl_rc"
    stop_all; sl_done
fi
sl_ok "allocation $b on n3 n4 with --dependency=expand:$a granted"
resize JobId="$b" NumNodes=0
t2=$SECONDS
if [ "$sl_rc" -eq 0 ] && sl_wait_until 10 sl_job_num_nodes "$a" 4 && [ "$(nodes_of "$a")" = "n1 n2 n3 n4" ] &&
    [ "$(sl_job_field "$a" JobState)" = RUNNING ]; then
    sl_ok "2nd resize: scontrol update JobId=$b NumNodes=0: job $a RUNNING on n1 n2 n3 n4"
else
    sl_fail "2nd resize: scontrol update JobId=$b NumNodes=0: job $a RUNNING on n1 n2 n3 n4" \
        "rc $sl_rc, $(sl_job_field "$a" NumNodes) nodes ($(nodes_of "$a")), $(sl_job_field "$a" JobState)"
    stop_all; sl_done
fi
sl_delta_within "watcher sent ADD 2 nodes" "8 -> 16 GPUs" "$t2" "$jobdir" \
    'resource delta 2: add -> 16 GPUs' 'delta ADD 2 node(s) (n3'
resize JobId="$a" NumNodes=ALL
if [ "$sl_rc" -eq 0 ] && [ "$(nodes_of "$a")" = "n1 n2 n3 n4" ] &&
    [ "$(sl_job_field "$a" JobState)" = RUNNING ]; then
    sl_ok "scontrol update JobId=$a NumNodes=ALL (an update of the resized job) accepted"
else
    sl_fail "scontrol update JobId=$a NumNodes=ALL (an update of the resized job) accepted" \
        "rc $sl_rc, nodes $(nodes_of "$a"), $(sl_job_field "$a" JobState)"
fi
grep -E 'delta (REMOVE|ADD|LOST)' "$jobdir/watcher.log" | grep -v 'GPU index' >"$sl_out"
sl_check "watcher.log: REMOVE, then ADD, nothing else" \
    test "$(sed -E 's/.*delta (REMOVE|ADD|LOST).*/\1/' "$sl_out" | xargs)" = "REMOVE ADD"

sl_run 10 "$nrs" status --json --socket-dir "$jobdir"
cp "$sl_out" status2.json
if python3 - status0.json status2.json >"$sl_out" 2>&1 <<'EOPY'
import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:3])
assert a["gpus"] == 16 and a["generation"] == 0, (a["gpus"], a["generation"])
assert b["gpus"] == 16 and b["generation"] == 2, (b["gpus"], b["generation"])
src = [d.get("source", "") for d in b["decisions"]]
assert any(s.startswith("delta 1") for s in src) and any(s.startswith("delta 2") for s in src), src
EOPY
then sl_ok "status: generation 0 -> 2, 16 GPUs again, decisions from delta 1 and delta 2"
else sl_fail "status: generation 0 -> 2, 16 GPUs again, decisions from delta 1 and delta 2" "see above"; fi

touch "$sl_tmp/stop"
if sl_wait_job_state "$a" COMPLETED 30 && grep -q 'batch done' "$sl_tmp/a.out"; then
    sl_ok "job $a COMPLETED"
else
    sl_fail "job $a COMPLETED" "state $(sl_job_field "$a" JobState)"
fi
timeout 10 scancel "$b" 2>/dev/null
gone() { ! ps -eo args= | grep -qE "nereus-(controller|watcher) --socket-dir $jobdir( |\$)"; }
if sl_wait_until 10 gone && grep -q 'controller stopped; exiting' "$jobdir/watcher.log"; then
    sl_ok "controller and watcher exited with the job"
else
    tail -n 5 "$jobdir/watcher.log" >"$sl_out" 2>&1
    sl_fail "controller and watcher exited with the job" "see above"
fi
# slurmdbd has the job (a resized job's record is split at each resize).
in_db() { timeout 10 sacct -n -X -P -j "$a" -o JobID,State 2>/dev/null | grep -q "^$a|COMPLETED"; }
sl_run 10 sacct -n -X -P -j "$a" -o JobID,NNodes,State
if sl_wait_until 15 in_db; then sl_ok "sacct: job $a COMPLETED in the accounting database"
else sacct -n -X -P -j "$a" -o JobID,NNodes,State >"$sl_out" 2>&1
    sl_fail "sacct: job $a COMPLETED in the accounting database" "see above"; fi
sl_check "all 4 nodes idle again" sl_wait_until 30 sl_all_idle

# ---- 2. node failure, then shrink ------------------------------------------------
victim=n2
sl_at_exit "sl_resume $victim"
rm -f "$sl_tmp/stop"
sl_run 20 sbatch --parsable -J nrs-resize2-c -N 4 --no-kill -o "$sl_tmp/c.out" --nereus=good.yaml \
    --wrap "while [ ! -e $sl_tmp/stop ]; do sleep 0.2; done; echo batch done"
c=$(tail -1 "$sl_out") a=$c b=""
jobdir="$NRS_CLUSTER_DIR/nereus/n1/$c"
if ! { [ "$sl_rc" -eq 0 ] && sl_wait_job_state "$c" RUNNING 30 && sl_wait_until 15 started &&
    sl_wait_until 10 answers; }; then
    sl_fail "4-node --nereus job running with its controller" "job '$c'"
    stop_all; sl_done
fi
sl_ok "4-node --nereus job $c running with its controller"
sl_run 20 scontrol update NodeName=$victim State=DOWN Reason=nereus-test
t3=$SECONDS
# (sl_rc: the State=DOWN update's, untouched by sl_delta_within)
down_accepted_on_n1_n3_n4() { [ "$sl_rc" -eq 0 ] && [ "$(nodes_of "$c")" = "n1 n3 n4" ]; }
sl_delta_within "$victim DOWN: job $c on n1 n3 n4; LOST GPUs 4..7" "" "$t3" "$jobdir" \
    'resource delta 1: lost -> 12 GPUs' 'delta LOST as 4 GPU index(es) from 4 ' down_accepted_on_n1_n3_n4
resize JobId="$c" NumNodes=2
t4=$SECONDS
if [ "$sl_rc" -eq 0 ] && sl_wait_until 10 sl_job_num_nodes "$c" 2 &&
    [ "$(nodes_of "$c")" = "n1 n3" ]; then
    sl_ok "2nd resize: scontrol update JobId=$c NumNodes=2: RUNNING on n1 n3"
else
    sl_fail "2nd resize: scontrol update JobId=$c NumNodes=2: RUNNING on n1 n3" \
        "rc $sl_rc, nodes $(nodes_of "$c")"
fi
sl_delta_within "REMOVE n4 as GPUs 8..11 (its place in epoch 2)" "12 -> 8 GPUs" "$t4" "$jobdir" \
    'resource delta 2: remove -> 8 GPUs' \
    'delta REMOVE as 4 GPU index(es) from 8 (the place of n4 in the node order of epoch 2)'
sl_run 10 "$nrs" status --json --socket-dir "$jobdir"
if python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["gpus"]==8 and d["generation"]==2, d' "$sl_out" >/dev/null 2>&1; then
    sl_ok "status: 8 GPUs, generation 2"
else sl_fail "status: 8 GPUs, generation 2" "see above"; fi
touch "$sl_tmp/stop"
sl_check "job $c COMPLETED" sl_wait_job_state "$c" COMPLETED 30
sl_resume $victim
sl_check "all 4 nodes idle again" sl_wait_until 30 sl_all_idle
sl_done
