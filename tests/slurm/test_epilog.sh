#!/usr/bin/env bash
# Hooks on released nodes (DESIGN §2, §8): on a shrink, job_epilog on the
# released nodes sends the job's controller the release at once (a "hint":
# nereus-watcher --hint, as the job's user, <= 2 s), before the watcher's
# next poll; the watcher then finds it done and does not send it again, so
# the controller counts the release once. When a --nereus job ends, every
# node's job directory <state_dir>/<job id> is cleaned by its epilog (all
# but the first node's controller.log and watcher.log, and so gone). A job
# without --nereus: no directory is created or touched, and it succeeds.
# To make the hint certainly first, the watcher is frozen (SIGSTOP) across
# the shrink and thawed once the hint is in the controller's log.
. "$(dirname "$0")/lib.sh"
cd "$sl_tmp" || exit 1
state="$NRS_CLUSTER_DIR/nereus"
sl_need_plugin "epilog hooks"
sl_need_bins "epilog hooks" nereus
job_dirs() { ls -d "$state"/n*/"$1" 2>/dev/null | xargs; }

# ---- (a) 4 nodes shrunk to 2: the released nodes' hint, counted once ---------
cat >hint.sbatch <<EOS
#!/bin/bash
#SBATCH -N 4
#SBATCH --no-kill
#SBATCH -J nrs-epilog
#SBATCH -o $sl_tmp/hint.out
#SBATCH --nereus=good.yaml
srun --no-kill -N 4 -n 4 bash -c 'while [ ! -e $sl_tmp/stop ]; do sleep 0.2; done'
echo "srun rc=\$?"
EOS
sl_run 20 sbatch --parsable hint.sbatch
jid=$(tail -1 "$sl_out")
jobdir="$state/n1/$jid"
answers() { "$nrs" status --socket-dir "$jobdir" >/dev/null 2>&1; }
all_dirs() { [ "$(job_dirs "$jid" | wc -w)" -eq 4 ]; }
if ! { [ "$sl_rc" -eq 0 ] && sl_wait_job_state "$jid" RUNNING 30 && sl_wait_until 20 answers &&
    sl_wait_until 10 all_dirs; }; then
    sl_fail "4-node --nereus job running, a job directory on every node" "job '$jid': $(job_dirs "$jid")"
    timeout 10 scancel "$jid" 2>/dev/null; sl_done
fi
sl_ok "4-node --nereus job $jid running, a job directory on every node"
watcher=$(ps -eo pid=,args= | grep -E "nereus-watcher --socket-dir $jobdir( |\$)" | grep -v grep | awk '{print $1}' | head -1)
[ -n "$watcher" ] && kill -STOP "$watcher"
sl_run 20 scontrol update JobId="$jid" NumNodes=2
t0=$SECONDS
hint_in() { grep -qE 'resource delta 1: remove -> 8 GPUs .* from #[0-9]+ watcher@n[34]$' "$jobdir/controller.log" 2>/dev/null; }
if [ -n "$watcher" ] && [ "$sl_rc" -eq 0 ] && sl_wait_until 3 hint_in; then
    sl_ok "hint from a released node's job_epilog in controller.log within $((SECONDS - t0)) s, watcher frozen: $(grep -oE 'remove -> 8 GPUs .* from .*' "$jobdir/controller.log" | head -1)"
else
    { tail -n 5 "$jobdir/controller.log"; grep -h 'nereus:' "$NRS_CLUSTER_DIR"/log/slurmd-n[34].log | tail -n 6; } >"$sl_out" 2>&1
    sl_fail "hint from a released node's job_epilog in controller.log" "watcher pid '$watcher', scontrol rc $sl_rc"
fi
# the released nodes' directories went with their epilog; n1 and n2 keep theirs
kept_only() { [ "$(job_dirs "$jid")" = "$state/n1/$jid $state/n2/$jid" ]; }
sl_check "released nodes' job directories removed by their epilog, n1 n2 keep theirs" sl_wait_until 5 kept_only
[ -n "$watcher" ] && kill -CONT "$watcher"
not_resent() { grep -q 'delta REMOVE hosts n3,n4: already sent by a hint' "$jobdir/watcher.log" 2>/dev/null; }
if sl_wait_until 5 not_resent; then
    sl_ok "watcher, thawed, sees the shrink and does not resend it"
else tail -n 5 "$jobdir/watcher.log" >"$sl_out" 2>&1
    sl_fail "watcher, thawed, sees the shrink and does not resend it" "see watcher.log"; fi
sl_run 10 "$nrs" status --json --socket-dir "$jobdir"
if python3 - "$sl_out" >"$sl_tmp/py.out" 2>&1 <<'EOPY'
import json, sys
b = json.load(open(sys.argv[1]))
assert b["gpus"] == 8 and b["generation"] == 1 and b["epoch"] == 2, (b["gpus"], b["generation"], b["epoch"])
EOPY
then sl_ok "status: 8 GPUs, generation 1, epoch 2 (the release counted once)"
else cp "$sl_tmp/py.out" "$sl_out"; sl_fail "status: 8 GPUs, generation 1, epoch 2 (the release counted once)" "see above"; fi
n=$(grep -c 'resource delta [0-9]*:' "$jobdir/controller.log")
sl_check "exactly one resource delta applied ($n)" test "$n" -eq 1

# ---- (b) the job ends: its job directories are cleaned on every node --------------
# Only the first node's controller.log and watcher.log stay (the job's record).
touch "$sl_tmp/stop"
cleaned() {
    [ "$(job_dirs "$jid")" = "$jobdir" ] &&
        [ "$(ls -A "$jobdir" | sort | xargs)" = "controller.log watcher.log" ]
}
if sl_wait_job_state "$jid" COMPLETED 30 && sl_wait_until 10 cleaned; then
    sl_ok "job COMPLETED; job directories gone on n2..n4, n1 keeps only controller.log and watcher.log"
else
    sl_fail "job COMPLETED; job directories gone on n2..n4, n1 keeps only its logs" \
        "state $(sl_job_field "$jid" JobState), left: $(job_dirs "$jid"): $(ls -A "$jobdir" 2>/dev/null | xargs)"
fi
sl_check "the batch script ran to its end" grep -q 'srun rc=' "$sl_tmp/hint.out"

# ---- (c) a job without --nereus: nothing created or touched ----------------------
snap() { find "$state" -printf '%p %i %T@ %m %u\n' 2>/dev/null | sort; }
snap >before.txt
rm -f "$sl_tmp/stop"
cat >plain.sbatch <<EOS
#!/bin/bash
#SBATCH -N 4
#SBATCH -J nrs-plain
#SBATCH -o $sl_tmp/plain.out
srun -N 4 -n 4 bash -c 'ls -d $state/\$SLURMD_NODENAME/\$SLURM_JOB_ID 2>/dev/null; echo "plain on \$SLURMD_NODENAME"'
echo "srun rc=\$?"
EOS
sl_run 20 sbatch --parsable plain.sbatch
pj=$(tail -1 "$sl_out")
if [ "$sl_rc" -eq 0 ] && sl_wait_job_state "$pj" COMPLETED 40 &&
    [ "$(grep -c '^plain on n' "$sl_tmp/plain.out")" -eq 4 ] && grep -q 'srun rc=0' "$sl_tmp/plain.out"; then
    sl_ok "job $pj without --nereus COMPLETED, 4 tasks, srun rc=0"
else cp "$sl_tmp/plain.out" "$sl_out" 2>/dev/null
    sl_fail "job $pj without --nereus COMPLETED, 4 tasks, srun rc=0" "state $(sl_job_field "$pj" JobState)"; fi
sleep 1 # its epilogs
snap >after.txt
if cmp -s before.txt after.txt && ! grep -q "^$state" "$sl_tmp/plain.out"; then
    sl_ok "no job directory created, nothing in $state touched"
else diff before.txt after.txt >"$sl_out"
    sl_fail "no job directory created, nothing in $state touched" "see the diff"; fi
if grep -h "nereus: job $pj:" "$NRS_CLUSTER_DIR"/log/slurmd-n*.log >"$sl_out" 2>&1; then
    sl_fail "no nereus line in the slurmd logs for job $pj" "see above"
else sl_ok "no nereus line in the slurmd logs for job $pj"; fi
sl_check_slurmds
sl_done
