#!/usr/bin/env bash
# What a user controls must not reach root's hands unchecked, nor hang a
# daemon:
#  - node names: init_post_opt (root) makes <state_dir with %n = node>/<job>;
#    a forged SLURM_STEP_NODELIST (sbatch hands the batch step the
#    submitter's environment) must not pick that path: this node's name comes
#    from Slurm (slurmstepd's SLURMD_NODENAME), and a forged
#    SLURM_JOB_NODELIST (the job's first node, which only the environment
#    says) with "../" is refused with a clear NEREUS_ERROR; either way
#    nothing is created outside the state dir;
#  - a FIFO as the spec: refused at once, by srun at submission and by
#    slurmstepd on the node (a relative spec resolves in --chdir there when
#    the job lacks srun's NEREUS_SPEC_PATH),
#    instead of blocking in open() for good;
#  - FIFOs the job's tasks made in their job directory: watcher.log, which
#    the next step's slurmstepd opens to start the watcher, and
#    controller.log, whose last line a step joining a controller that died
#    reads: refused at once (the step runs without Nereus) instead of
#    blocking that slurmstepd, and with it the node, for good.
. "$(dirname "$0")/lib.sh"
sl_need_plugin "hostile inputs"
cd "$sl_tmp" || exit 1
state="$NRS_CLUSTER_DIR/nereus"
up="../../../../../../../../../../../../../" # from $state/<node> to / (and more)
evil="$sl_tmp/evil"
last_job() { timeout 10 squeue -h -t all -o %i -n "$1" 2>/dev/null | sort -n | tail -1; }
job_done() { sl_wait_job_state "$1" COMPLETED 40 || sl_wait_job_state "$1" FAILED 1; }

# ---- 1. a forged step node list: the job runs with this node's real name ------
sl_run 20 env SLURM_STEP_NODELIST="$up${evil#/}/x" sbatch --parsable -J nrs-forge1 -N 1 -w n1 \
    -o "$sl_tmp/forge1.out" --nereus=good.yaml \
    --wrap 'echo "dir=${NEREUS_JOB_DIR-unset} err=${NEREUS_ERROR-unset}"'
j1=$(tail -1 "$sl_out")
job_done "$j1"
cp "$sl_tmp/forge1.out" "$sl_out" 2>/dev/null
if [ ! -e "$evil" ] && grep -q "^dir=$state/n1/$j1 err=unset$" "$sl_tmp/forge1.out"; then
    sl_ok "SLURM_STEP_NODELIST='../..$evil/x': nothing created there, the job dir is $state/n1/$j1"
else
    ls -laR "$evil" >>"$sl_out" 2>&1
    sl_fail "SLURM_STEP_NODELIST='../..$evil/x': nothing created there, the job dir is $state/n1/$j1" "see above"
fi

# ---- 2. a forged job node list (the first node): refused with the reason ------
sl_run 20 sbatch --parsable -J nrs-forge2 -N 1 -w n1 -o "$sl_tmp/forge2.out" --wrap \
    "SLURM_JOB_NODELIST='$up${evil#/}/y' srun --nereus=good.yaml bash -c 'echo \"sock=\${NEREUS_SOCKET_DIR-unset} err=\${NEREUS_ERROR-unset}\"'"
j2=$(tail -1 "$sl_out")
job_done "$j2"
cp "$sl_tmp/forge2.out" "$sl_out" 2>/dev/null
if [ ! -e "$evil" ] && grep -q "^sock=unset err=the job's first node '\.\./\.\./.*' (from SLURM_JOB_NODELIST) is not a valid node name" "$sl_tmp/forge2.out"; then
    sl_ok "SLURM_JOB_NODELIST='../..$evil/y': Nereus refused for the step, NEREUS_ERROR says why, nothing created"
else
    ls -laR "$evil" >>"$sl_out" 2>&1
    sl_fail "SLURM_JOB_NODELIST='../..$evil/y': Nereus refused for the step, NEREUS_ERROR says why, nothing created" "see above"
fi
if grep -h "nereus: .*first node '\.\./" "$NRS_CLUSTER_DIR/log/slurmd-n1.log" >/dev/null 2>&1; then
    sl_ok "the refusal is in the slurmd log, prefixed nereus:"
else sl_fail "the refusal is in the slurmd log, prefixed nereus:" "not in slurmd-n1.log"; fi
sl_check "no job directory for the refused step's job" test ! -e "$state/n1/$j2"

# ---- 3. a FIFO as the spec ------------------------------------------------------
mkfifo fifo.yaml
t0=$SECONDS
sl_run 20 srun -J nrs-fifo1 --nereus=fifo.yaml true
took=$((SECONDS - t0))
if [ "$sl_rc" -ne 0 ] && [ "$sl_rc" -ne 124 ] &&
    grep -q "nereus: job spec fifo.yaml is a FIFO, not a regular file" "$sl_out"; then
    sl_ok "srun --nereus=FIFO refused at once (${took} s) with the reason"
else sl_fail "srun --nereus=FIFO refused at once with the reason" "rc $sl_rc after ${took} s"; fi

# On the node: spec.yaml here is a regular file (srun checks it), in the
# step's --chdir it is a FIFO (slurmstepd opens it there: --export keeps
# srun's NEREUS_SPEC_PATH, the file checked here, from the job).
mkdir fifodir && mkfifo fifodir/spec.yaml && chmod 755 fifodir
cp good.yaml spec.yaml
t0=$SECONDS
sl_run 40 srun -J nrs-fifo2 -N 1 -w n2 --chdir="$sl_tmp/fifodir" --export=PATH --nereus=spec.yaml \
    bash -c 'echo "spec=${NEREUS_SPEC-unset} err=${NEREUS_ERROR-unset}"'
took=$((SECONDS - t0))
if [ "$sl_rc" -eq 124 ]; then # a stepd blocked in open(): let it go, end the job
    timeout 5 sh -c "cat good.yaml >fifodir/spec.yaml" 2>/dev/null
    jf=$(last_job nrs-fifo2); [ -z "$jf" ] || timeout 10 scancel "$jf" 2>/dev/null
fi
if [ "$sl_rc" -eq 0 ] && [ "$took" -le 15 ] &&
    grep -q "^spec=unset err=job spec $sl_tmp/fifodir/spec.yaml is a FIFO, not a regular file$" "$sl_out"; then
    sl_ok "spec a FIFO on the node: the step starts at once (${took} s) without Nereus, NEREUS_ERROR says why"
else sl_fail "spec a FIFO on the node: the step starts at once without Nereus, NEREUS_ERROR says why" "rc $sl_rc after ${took} s"; fi
# ---- 4. a FIFO as watcher.log: the next step does not hang -------------------
# A stepd blocked in open() of a FIFO: open it from here to let it go.
fifo_release() { for f in "$@"; do [ -p "$f" ] && timeout 3 sh -c ': <>"$1"' _ "$f" 2>/dev/null; done; }
sl_run 30 salloc -N 1 -w n3 --no-shell -J nrs-fifolog
jl=$(sl_granted_job)
jd="$state/n3/$jl"
sl_run 40 srun --jobid="$jl" --nereus=good.yaml bash -c \
    'rm -f "$NEREUS_JOB_DIR/watcher.log" && mkfifo "$NEREUS_JOB_DIR/watcher.log"'
t0=$SECONDS
sl_run 40 srun --jobid="$jl" --nereus=good.yaml bash -c 'echo "err=${NEREUS_ERROR-unset}"'
took=$((SECONDS - t0))
[ "$sl_rc" -ne 124 ] || fifo_release "$jd/watcher.log"
if [ "$sl_rc" -eq 0 ] && [ "$took" -le 20 ] &&
    grep -q "^err=$jd/watcher.log: not a regular file of the job's user" "$sl_out"; then
    sl_ok "watcher.log a FIFO: the next step starts at once (${took} s) without Nereus, NEREUS_ERROR says why"
else sl_fail "watcher.log a FIFO: the next step starts at once without Nereus, NEREUS_ERROR says why" "rc $sl_rc after ${took} s"; fi
[ -z "$jl" ] || timeout 10 scancel "$jl" 2>/dev/null

# ---- 5. a dead controller's logs are FIFOs: a step joining it does not hang ----
sl_run 30 salloc -N 1 -w n3 --no-shell -J nrs-fifojoin
jj=$(sl_granted_job)
jd="$state/n3/$jj"
timeout 60 srun --overlap --jobid="$jj" --nereus=good.yaml bash -c 'cd "$NEREUS_JOB_DIR" &&
    pkill -KILL -f "nereus-watcher --socket-dir $PWD " ; sleep 0.5;
    rm -f controller.log watcher.log; mkfifo controller.log watcher.log; echo ready; sleep 50' \
    >"$sl_tmp/fifojoin1.out" 2>&1 &
sl_wait_until 30 grep -q ready "$sl_tmp/fifojoin1.out"
t0=$SECONDS
sl_run 40 srun --overlap --jobid="$jj" --nereus=good.yaml bash -c 'echo "err=${NEREUS_ERROR-unset}"'
took=$((SECONDS - t0))
[ "$sl_rc" -ne 124 ] || fifo_release "$jd/controller.log" "$jd/watcher.log"
if [ "$sl_rc" -eq 0 ] && [ "$took" -le 20 ] &&
    grep -q "^err=the job's controller, started by step 0, is no longer running" "$sl_out"; then
    sl_ok "a dead controller's logs FIFOs: the joining step starts at once (${took} s) without Nereus, NEREUS_ERROR says why"
else sl_fail "a dead controller's logs FIFOs: the joining step starts at once without Nereus, NEREUS_ERROR says why" "rc $sl_rc after ${took} s"; fi
[ -z "$jj" ] || timeout 10 scancel "$jj" 2>/dev/null
wait
sl_check "every node idle again" sl_wait_until 30 sl_all_idle

sl_check_slurmds
sl_done
