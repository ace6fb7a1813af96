#!/usr/bin/env bash
# Recovery under Slurm with real ranks (issue 7): a 4-node --nereus --no-kill
# job runs nereus-worker, 2 ranks per node (examples/ppo-live.yaml: 4 nodes of
# 2 emulated GPUs), over srun --mpi=pmix, with a checkpoint every 10 steps.
#   1. shrink: scontrol update JobId=N NumNodes=2. Slurm kills the tasks on
#      n3 and n4 (and from then on fails every PMIx fence of the step); the
#      controller loses their GPUs (gone ranks, at its next decision) or the
#      watcher's delta does, whichever comes first; it forces a plan
#      on the 4 GPUs left; the 4 survivors agree through the controller,
#      rebuild the state (from replicas, else from the newest checkpoint),
#      commit, and finish every step with every checksum intact.
#   2. node failure: scontrol update NodeName=n4 State=DOWN under --no-kill,
#      the same way (a LOST delta; n4's ranks, alive or not, are retired).
. "$(dirname "$0")/lib.sh"
sl_need_plugin "recover"
sl_need_bins "recover" nereus-worker nereus
cd "$sl_tmp" || exit 1
spec="$sl_tmp/ppo-live.yaml"
cp "$NRS_SRCDIR/examples/ppo-live.yaml" "$spec"
chmod 644 "$spec"
victim=n4
sl_at_exit "sl_resume $victim"

# run NAME STEPS: submit the job, print its id
submit() {
    mkdir -p "$sl_tmp/$1/ck"
    chmod -R 777 "$sl_tmp/$1"
    cat >"$sl_tmp/$1/job.sbatch" <<EOS
#!/bin/bash
#SBATCH -N 4
#SBATCH --ntasks-per-node=2
#SBATCH --no-kill
#SBATCH -J nrs-recover-$1
#SBATCH -o $sl_tmp/$1/job.out
#SBATCH --nereus=$spec
export NRS_WORKER_TIMEOUT=15
srun --mpi=pmix --no-kill --kill-on-bad-exit=0 $wk --steps $2 --step-ms 60 \\
    --checkpoint-dir $sl_tmp/$1/ck --checkpoint-every 10
echo "srun rc=\$?"
EOS
    sl_run 20 sbatch --parsable "$sl_tmp/$1/job.sbatch"
    tail -1 "$sl_out"
}
status_ok() { # jobdir jq-filter
    local j
    j=$(NEREUS_SOCKET_DIR="$1" timeout 5 "$nrs" status --json 2>/dev/null) && [ -n "$j" ] &&
        echo "$j" | jq -e "$2" >/dev/null
}
# checks after the job ended: NAME DIR
survivors() {
    local d="$sl_tmp/$1" n
    n=$(grep -cE '^rank [0-9]+: epoch [0-9]+, [0-9]+ transition\(s\): verified [1-9][0-9]* shards, 0 mismatches' "$d/job.out")
    if [ "$n" -eq "$2" ]; then sl_ok "$1: the $2 survivors finished every step, every shard verified"
    else cp "$d/job.out" "$sl_out"; sl_fail "$1: the $2 survivors finished every step, every shard verified" "$n of $2"; fi
    # (a rank whose GPU holds no actor.generate shard in the last plan verifies 0)
    n=$(grep -cE '^rank [0-9]+: weight sync: [0-9]+ steps, .*verified [0-9]+ generation shards, 0 mismatches' "$d/job.out")
    k=$(grep -cE '^rank [0-9]+: weight sync: [0-9]+ steps, .*verified [1-9][0-9]* generation shards, 0 mismatches' "$d/job.out")
    sl_check "$1: the $2 survivors' generation weights verified ($k hold some)" test "$n" -eq "$2" -a "$k" -ge 1
    n=$(grep -cE "^rank [0-9]+: step [0-9]+: (epoch [0-9]+ committed|transition: restored)" "$d/job.out")
    sl_check "$1: the survivors committed the forced epoch" test "$n" -ge "$2"
}
command -v jq >/dev/null || { sl_skip "recover" "needs jq"; sl_done; }
# forced_committed WHAT GPUS: within 40 s the forced epoch on GPUS GPUs committed
forced_committed() {
    local what="$1" gpus="$2"
    forced() { status_ok "$jobdir" ".gpus == $gpus and .plan.total_gpus == $gpus and .transitions.committed >= 1 and .epoch >= 2"; }
    if sl_wait_until 40 forced; then sl_ok "$what: the forced $gpus-GPU epoch committed"
    else
        grep -v report "$jobdir/controller.log" | tail -n 12 >"$sl_out"
        sl_fail "$what: the forced $gpus-GPU epoch committed" "status: $(NEREUS_SOCKET_DIR="$jobdir" timeout 5 "$nrs" status --json 2>/dev/null | jq -c '{gpus, epoch, transitions}')"
    fi
}
# started NAME: submit NAME's job, wait until its 8 ranks are connected and a
# checkpoint is published (else fail and stop); sets jid and jobdir
started() {
    jid=$(submit "$1" 320)
    jobdir="$NRS_CLUSTER_DIR/nereus/n1/$jid"
    cur="$1"
    up() { status_ok "$jobdir" '.nworkers == 8' && [ -s "$sl_tmp/$cur/ck/LATEST" ]; }
    if ! { sl_wait_job_state "$jid" RUNNING 30 && sl_wait_until 60 up; }; then
        { tail -n 20 "$sl_tmp/$1/job.out"; tail -n 10 "$jobdir/controller.log"; } >"$sl_out" 2>&1
        sl_fail "$1: 8 ranks connected to the job's controller, a checkpoint published" "job '$jid'"
        timeout 10 scancel "$jid" 2>/dev/null; sl_done
    fi
    sl_ok "$1: 8 ranks connected to the job's controller, a checkpoint published"
}

# --- 1. shrink ---------------------------------------------------------------------
started shrink
sl_run 20 scontrol update JobId="$jid" NumNodes=2
t0=$SECONDS
sl_check "shrink: scontrol update NumNodes=2 accepted" test "$sl_rc" -eq 0
# Slurm kills the released nodes' tasks before the watcher's poll sees the
# shrink: the controller may have lost their GPUs already (gone ranks, lost at
# its next decision), and the delta then changes nothing. Either way it came.
delta() { grep -qE 'resource delta (1: remove -> 4 GPUs|\(#[0-9]+ watcher@[^)]*\): remove of GPUs or ranks already removed: no change)' "$jobdir/controller.log" 2>/dev/null; }
if sl_wait_until 10 delta; then sl_ok "shrink: the controller got the delta ($((SECONDS - t0)) s, poll 1 s)"
else grep -E 'resource delta|lost:' "$jobdir/controller.log" | tail -n 8 >"$sl_out"
    sl_fail "shrink: the controller got the delta" "not in controller.log after 10 s"; fi
forced_committed shrink 4
sl_check "shrink: the job finished" sl_wait_job_state "$jid" COMPLETED 120
survivors shrink 4
n=$(grep -cE '^rank [4-7]: epoch .* verified' "$sl_tmp/shrink/job.out")
sl_check "shrink: no rank of the released nodes claims to have finished" test "$n" -eq 0
sl_check "shrink: the survivors agreed without PMIx (gathers without the dead answered)" \
    grep -q 'gather .* of 8 participant(s) .* the others gone' "$jobdir/controller.log"

# --- 2. node failure ----------------------------------------------------------------
started nodefail
sl_run 20 scontrol update NodeName=$victim State=DOWN Reason=nereus-test
sl_check "node failure: scontrol update NodeName=$victim State=DOWN accepted" test "$sl_rc" -eq 0
# (as for the shrink: n4's ranks may be gone, their GPUs lost, before the LOST)
lost() { grep -qE 'resource delta (1: lost -> 6 GPUs|\(#[0-9]+ watcher@[^)]*\): lost of GPUs or ranks already removed: no change)' "$jobdir/controller.log" 2>/dev/null; }
sl_check "node failure: the controller got a LOST delta (8 -> 6 GPUs)" sl_wait_until 10 lost
forced_committed "node failure" 6
sl_check "node failure: the job finished" sl_wait_job_state "$jid" COMPLETED 120
survivors nodefail 6
sl_resume $victim
nodes_idle() { [ "$(timeout 10 sinfo -h -N -n $victim -o %T)" = idle ]; }
sl_check "node failure: $victim back to idle" sl_wait_until 30 nodes_idle
sl_done
