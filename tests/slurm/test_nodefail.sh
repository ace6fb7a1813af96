#!/usr/bin/env bash
# A node failure under --no-kill (DESIGN §8): `scontrol update NodeName=X
# State=DOWN` on a node of a running 4-node --nereus job. slurmctld takes the
# node out of the job, which goes on; the watcher sees the shorter node list,
# finds the node DOWN, and sends the controller a LOST delta (not a REMOVE:
# the state on that node is gone) within 2 poll intervals; the job finishes;
# the node comes back.
. "$(dirname "$0")/lib.sh"
sl_need_plugin "nodefail"
cd "$sl_tmp" || exit 1
victim=n4
sl_at_exit "sl_resume $victim"
cat >fail.sbatch <<EOS2
#!/bin/bash
#SBATCH -N 4
#SBATCH --no-kill
#SBATCH -J nrs-nodefail
#SBATCH -o $sl_tmp/fail.out
#SBATCH --nereus=good.yaml
srun --no-kill -N 4 -n 4 bash -c 'touch $sl_tmp/up.\$SLURMD_NODENAME; while [ ! -e $sl_tmp/stop ]; do sleep 0.2; done'
echo "srun rc=\$?"
EOS2
all_up() { local n; for n in n1 n2 n3 n4; do [ -e "$sl_tmp/up.$n" ] || return 1; done; }
sl_run 20 sbatch --parsable fail.sbatch
jid=$(tail -1 "$sl_out")
jobdir="$NRS_CLUSTER_DIR/nereus/n1/$jid"
if ! { [ "$sl_rc" -eq 0 ] && sl_wait_job_state "$jid" RUNNING 30 && sl_wait_until 30 all_up; }; then
    sl_fail "4-node --no-kill job with --nereus running" "job '$jid'"
    timeout 10 scancel "$jid" 2>/dev/null; sl_done
fi
sl_ok "4-node --no-kill job with --nereus running"

sl_run 20 scontrol update NodeName=$victim State=DOWN Reason=nereus-test
t0=$SECONDS
sl_check "scontrol update NodeName=$victim State=DOWN accepted" test "$sl_rc" -eq 0
sl_delta_within "controller got a LOST delta for $victim" "16 -> 12 GPUs" "$t0" "$jobdir" \
    'resource delta 1: lost -> 12 GPUs' "delta LOST hosts $victim"
state=$(sl_job_field "$jid" JobState) nodes=$(sl_job_field "$jid" NumNodes)
if [ "$state" = RUNNING ] && [ "$nodes" = 3 ]; then sl_ok "job still RUNNING, on 3 nodes"
else sl_fail "job still RUNNING, on 3 nodes" "state $state, $nodes nodes"; fi

touch "$sl_tmp/stop"
sl_check "job COMPLETED" sl_wait_job_state "$jid" COMPLETED 30
nodes_idle() { [ "$(timeout 10 sinfo -h -N -n $victim -o %T)" = idle ]; }
sl_resume $victim
sl_check "$victim back to idle" sl_wait_until 30 nodes_idle
sl_done
