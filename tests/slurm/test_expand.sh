#!/usr/bin/env bash
# An expansion (DESIGN §8): a 2-node --nereus job A; an allocation B on the 2
# other nodes with --dependency=expand:A; `scontrol update JobId=B NumNodes=0`
# hands B's nodes to A. The watcher sees A's node list grow and sends the
# controller an ADD delta (2 nodes) within 2 poll intervals; with no worker
# connected the controller records it (16 GPUs, generation 1, a decision;
# whether it adopts a new plan is the policy's call). (Launching a join step on the new nodes is the job's
# business: not tested here.)
. "$(dirname "$0")/lib.sh"
sl_need_plugin "expand"
sl_need_bins "expand" nereus
cd "$sl_tmp" || exit 1
sl_run 20 sbatch --parsable -J nrs-expand -N 2 -w 'n[1-2]' -o "$sl_tmp/a.out" --nereus=good.yaml \
    --wrap "while [ ! -e $sl_tmp/stop ]; do sleep 0.2; done"
a=$(tail -1 "$sl_out")
jobdir="$NRS_CLUSTER_DIR/nereus/n1/$a"
started() { grep -q 'started .*nereus-controller' "$jobdir/watcher.log" 2>/dev/null; }
if ! { [ "$sl_rc" -eq 0 ] && sl_wait_job_state "$a" RUNNING 30 && sl_wait_until 15 started; }; then
    sl_fail "2-node --nereus job running with its controller" "job '$a'"
    timeout 10 scancel "$a" 2>/dev/null; sl_done
fi
sl_ok "2-node --nereus job running with its controller"
sl_run 30 salloc -J nrs-expand-b -N 2 -w 'n[3-4]' --dependency=expand:"$a" --no-shell
b=$(sl_granted_job)
if [ -z "$b" ]; then
    sl_fail "allocation with --dependency=expand:$a granted" "rc $sl_rc"
    touch "$sl_tmp/stop"; timeout 10 scancel "$a" 2>/dev/null; sl_done
fi
sl_ok "allocation $b with --dependency=expand:$a granted"
sl_run 20 scontrol update JobId="$b" NumNodes=0
t0=$SECONDS
if [ "$sl_rc" -eq 0 ] && sl_wait_until 10 sl_job_num_nodes "$a" 4; then sl_ok "scontrol update JobId=$b NumNodes=0: job $a now on 4 nodes"
else sl_fail "scontrol update JobId=$b NumNodes=0: job $a now on 4 nodes" "rc $sl_rc, $(sl_job_field "$a" NumNodes) nodes"; fi
sl_delta_within "controller got an ADD delta (2 nodes)" "8 -> 16 GPUs" "$t0" "$jobdir" \
    'resource delta 1: add -> 16 GPUs' 'delta ADD 2 node(s)'
sl_run 10 "$nrs" status --json --socket-dir "$jobdir"
if python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["gpus"]==16 and d["generation"]==1 and d["epoch"] in (1, 2) and any(x.get("source","").startswith("delta 1") for x in d["decisions"]), d' "$sl_out" >/dev/null 2>&1; then
    sl_ok "status: 16 GPUs, generation 1, a decision from delta 1"
else sl_fail "status: 16 GPUs, generation 1, a decision from delta 1" "see above"; fi
touch "$sl_tmp/stop"
sl_check "job $a COMPLETED" sl_wait_job_state "$a" COMPLETED 30
timeout 10 scancel "$b" 2>/dev/null
gone() { ! ps -eo args= | grep -qE "nereus-(controller|watcher) --socket-dir $jobdir( |\$)"; }
sl_check "controller and watcher gone with the job" sl_wait_until 10 gone
sl_check "all 4 nodes idle again" sl_wait_until 30 sl_all_idle
sl_done
