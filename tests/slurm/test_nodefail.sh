#!/usr/bin/env bash
# A node failure under --no-kill (DESIGN §8): `scontrol update NodeName=X
# State=DOWN` on a node of a running 4-node --nereus job. slurmctld takes the
# node out of the job, which goes on; the watcher sees the shorter node list,
# finds the node DOWN, and sends the controller a LOST delta (not a REMOVE:
# the state on that node is gone) within 2 poll intervals; the job finishes;
# the node comes back.
. "$(dirname "$0")/lib.sh"
sl_have_plugin || { sl_skip "nodefail" "no Nereus plugin in $(sl_plugstack)"; sl_done; }
cd "$sl_tmp" || exit 1
victim=n4
trap 'timeout 10 scontrol update NodeName=$victim State=RESUME >/dev/null 2>&1; rm -rf "$sl_tmp"' EXIT
wait_until() { # seconds cmd...
    local deadline=$((SECONDS + $1)); shift
    until "$@"; do [ $SECONDS -lt $deadline ] || return 1; sleep 0.25; done
}
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
if ! { [ "$sl_rc" -eq 0 ] && sl_wait_job_state "$jid" RUNNING 30 && wait_until 30 all_up; }; then
    sl_fail "4-node --no-kill job with --nereus running" "job '$jid'"
    timeout 10 scancel "$jid" 2>/dev/null; sl_done
fi
sl_ok "4-node --no-kill job with --nereus running"

sl_run 20 scontrol update NodeName=$victim State=DOWN Reason=nereus-test
t0=$SECONDS
sl_check "scontrol update NodeName=$victim State=DOWN accepted" test "$sl_rc" -eq 0
got_lost() { grep -q 'resource delta 1: lost -> 12 GPUs' "$jobdir/controller.log" 2>/dev/null; }
if wait_until 3 got_lost && grep -q "delta LOST hosts $victim" "$jobdir/watcher.log"; then
    sl_ok "controller got a LOST delta for $victim within 2 poll intervals ($((SECONDS - t0)) s): 16 -> 12 GPUs"
else
    { tail -n 5 "$jobdir/watcher.log"; tail -n 5 "$jobdir/controller.log"; } >"$sl_out" 2>&1
    sl_fail "controller got a LOST delta for $victim within 2 poll intervals" "not in controller.log after 3 s"
fi
state=$(sl_job_field "$jid" JobState) nodes=$(sl_job_field "$jid" NumNodes)
if [ "$state" = RUNNING ] && [ "$nodes" = 3 ]; then sl_ok "job still RUNNING, on 3 nodes"
else sl_fail "job still RUNNING, on 3 nodes" "state $state, $nodes nodes"; fi

touch "$sl_tmp/stop"
sl_check "job COMPLETED" sl_wait_job_state "$jid" COMPLETED 30
nodes_idle() { [ "$(timeout 10 sinfo -h -N -n $victim -o %T)" = idle ]; }
timeout 10 scontrol update NodeName=$victim State=RESUME >/dev/null 2>&1
sl_check "$victim back to idle" wait_until 30 nodes_idle
sl_done
