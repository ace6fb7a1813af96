#!/usr/bin/env bash
# A --nereus job suspended and resumed (scontrol suspend / resume: what
# preemption with PreemptMode=SUSPEND and gang scheduling do). Slurm 22.05
# sends the job's tasks SIGTSTP, 2 s later SIGSTOP to every process of each
# step (the controller and the watcher too: they are the batch step's), and
# SIGCONT at the resume; the monotonic clocks run on meanwhile. A 4-node
# --no-kill job of 8 nereus-worker ranks (examples/ppo-live.yaml) with
# NRS_WORKER_TIMEOUT=5 (the ranks' stall time-outs and the controller's
# gathers: 5 s; a rank waits 15 s for a gather's answer) is suspended for
# 20 s, then resumed:
#   1. between steps (the ranks agree at every step boundary: some gather is
#      always open): the job finishes, every rank verifies every shard, no
#      rank is dropped (before: the controller completed the open gather
#      without the ranks stopped in it and retired them, "gather ... already
#      completed without this rank": 7 of 8 finished);
#   2. during a transition: suspended as soon as the controller announces
#      epoch 2 (the ranks' response length grows), so that the stop comes
#      while it is in flight (checked: the controller's stop is logged
#      between the announcement and the commit): it commits, nothing aborts,
#      the job finishes with every shard verified.
. "$(dirname "$0")/lib.sh"
sl_need_plugin "suspend"
sl_need_bins "suspend" nereus-worker nereus
command -v jq >/dev/null || { sl_skip "suspend" "needs jq"; sl_done; }
cd "$sl_tmp" || exit 1
spec="$sl_tmp/ppo-live.yaml"
cp "$NRS_SRCDIR/examples/ppo-live.yaml" "$spec"
chmod 644 "$spec"
jid=""
sl_at_exit '[ -z "$jid" ] || { timeout 10 scontrol resume "$jid"; timeout 10 scancel "$jid"; } 2>/dev/null'

submit() { # NAME STEPS [ENV...]: the job's id
    local name=$1 steps=$2
    shift 2
    mkdir -p "$sl_tmp/$name/ck"
    chmod -R 777 "$sl_tmp/$name"
    cat >"$sl_tmp/$name/job.sbatch" <<EOS
#!/bin/bash
#SBATCH -N 4
#SBATCH --ntasks-per-node=2
#SBATCH --no-kill
#SBATCH -J nrs-suspend-$name
#SBATCH -o $sl_tmp/$name/job.out
#SBATCH --nereus=$spec
export NRS_WORKER_TIMEOUT=5 $*
srun --mpi=pmix --no-kill --kill-on-bad-exit=0 $wk --steps $steps --step-ms 60 \\
    --checkpoint-dir $sl_tmp/$name/ck --checkpoint-every 10
echo "srun rc=\$?"
EOS
    sl_run 20 sbatch --parsable "$sl_tmp/$name/job.sbatch"
    tail -1 "$sl_out"
}
workers() { # the controller's count of connected ranks is $2
    local j
    j=$(NEREUS_SOCKET_DIR="$1" timeout 5 "$nrs" status --json 2>/dev/null) && [ -n "$j" ] &&
        echo "$j" | jq -e ".nworkers == $2" >/dev/null
}
# suspended NAME: scontrol suspend the job, check it SUSPENDED and every
# process of it stopped once SIGSTOP came (2 s after SIGTSTP), hold 20 s,
# resume; sets t_res
suspended() {
    local name=$1 running
    sl_run 20 scontrol suspend "$jid"
    if ! { [ "$sl_rc" -eq 0 ] && sl_wait_job_state "$jid" SUSPENDED 10; }; then
        sl_fail "$name: scontrol suspend $jid: SUSPENDED" "rc $sl_rc, $(sl_job_field "$jid" JobState)"
        return 1
    fi
    sleep 3
    running=$(ps -eo stat=,args= | grep -E "nereus-(worker|controller|watcher)( |$)" |
        grep -F -e "$jobdir" -e "$sl_tmp/$name/ck" | grep -vc '^T')
    sl_check "$name: job SUSPENDED, its ranks, controller and watcher stopped" test "$running" -eq 0
    sleep 17
    sl_run 20 scontrol resume "$jid"
    sl_check "$name: scontrol resume $jid after 20 s" test "$sl_rc" -eq 0
}
# finished NAME: the job completed, all 8 ranks verified every shard, none
# was dropped and nothing aborted
finished() {
    local d="$sl_tmp/$1" n bad
    sl_check "$1: the job COMPLETED" sl_wait_job_state "$jid" COMPLETED 120
    n=$(grep -cE '^rank [0-9]+: epoch [0-9]+, [0-9]+ transition\(s\): verified [1-9][0-9]* shards, 0 mismatches' "$d/job.out")
    if [ "$n" -eq 8 ] && grep -q '^srun rc=0$' "$d/job.out"; then
        sl_ok "$1: all 8 ranks finished every step, every shard verified"
    else
        { grep -vE '^rank [0-9]+: step [0-9]+: (epoch|checkpoint)' "$d/job.out"; grep -v report "$jobdir/controller.log"; } |
            tail -n 25 >"$sl_out"
        sl_fail "$1: all 8 ranks finished every step, every shard verified" "$n of 8"
    fi
    bad=$(grep -E 'dropped|retired|ABORT|did not (contribute|prepare|confirm)' "$jobdir/controller.log" | head -3)
    if [ -z "$bad" ]; then sl_ok "$1: the controller dropped no rank, aborted nothing"
    else echo "$bad" >"$sl_out"; sl_fail "$1: the controller dropped no rank, aborted nothing" "see above"; fi
    sl_check "$1: the controller saw that it had been stopped" \
        grep -q 'resumed (SIGCONT: a suspended job?) after .* s stopped, which count in no time-out' "$jobdir/controller.log"
    sl_check "$1: the watcher ran on with the job" grep -q 'controller stopped; exiting' "$jobdir/watcher.log"
}
started() { # NAME STEPS [ENV...]: submit, wait for the 8 ranks; sets jid, jobdir
    jid=$(submit "$@")
    jobdir="$NRS_CLUSTER_DIR/nereus/n1/$jid"
    if ! { sl_wait_job_state "$jid" RUNNING 30 && sl_wait_until 60 workers "$jobdir" 8; }; then
        { tail -n 20 "$sl_tmp/$1/job.out"; tail -n 10 "$jobdir/controller.log"; } >"$sl_out" 2>&1
        sl_fail "$1: 8 ranks connected to the job's controller" "job '$jid'"
        timeout 10 scancel "$jid" 2>/dev/null
        jid=""
        return 1
    fi
    sl_ok "$1: 8 ranks connected to the job's controller"
}

# --- 1. between steps ------------------------------------------------------------
if started steps 150; then
    sleep 2
    suspended steps && finished steps
fi
jid=""

# --- 2. during a transition --------------------------------------------------------
# (tail -F follows the log as it grows: the suspend follows the line at once)
announced() { timeout 90 tail -n +1 -F "$jobdir/controller.log" 2>/dev/null | grep -q -m1 'epoch 2: announcing'; }
# the controller's stop is logged after epoch 2's announcement, before its commit
in_flight() {
    sed -n '/epoch 2: announcing/,/epoch 2 committed/p' "$jobdir/controller.log" | grep -q 'resumed (SIGCONT'
}
if started transition 150; then
    if announced; then
        sl_ok "transition: epoch 2 announced: the job suspended at once"
        if suspended transition; then
            finished transition
            n=$(grep -cE '^rank [0-9]+: step [0-9]+: epoch 2 committed' "$sl_tmp/transition/job.out")
            sl_check "transition: epoch 2 committed on all 8 ranks ($(grep -m1 -oE 'epoch 2 committed in .*' "$jobdir/controller.log"))" \
                test "$n" -eq 8
            grep -E 'announcing|resumed|committed' "$jobdir/controller.log" | head -n 4 >"$sl_out"
            sl_check "transition: the job was stopped while epoch 2 was in flight" in_flight
        fi
    else
        sl_fail "transition: epoch 2 announced" "not within 90 s"
        timeout 10 scancel "$jid" 2>/dev/null
    fi
fi
jid=""
sl_check "all 4 nodes idle again" sl_wait_until 30 sl_all_idle
sl_done
