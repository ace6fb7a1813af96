#!/usr/bin/env bash
# The job's controller as the plugin starts it (the shrink itself: test_shrink):
# an srun-only job with --nereus gets one controller on its first node, its
# tasks on every node get NEREUS_SOCKET_DIR and can ask `nereus status`, and
# the controller goes away with the step (and with a killed watcher), it runs
# as the job's user; concurrent steps share one, and the epilog of their job
# (no --nereus of its own) cleans the job directory; a job without --nereus starts none;
# a missing controller binary (runtime_dir pointing elsewhere) gives the tasks
# a clear NEREUS_ERROR and the job still runs; with the plugin "required"
# the step's launch fails instead.
. "$(dirname "$0")/lib.sh"
sl_need_plugin "controller"
sl_need_bins "controller" nereus
cd "$sl_tmp" || exit 1
sl_at_exit sl_plugstack_restore
state="$NRS_CLUSTER_DIR/nereus"
ctl_procs() { ps -eo args= | grep -E "nereus-(controller|watcher) --socket-dir $state/" | grep -v grep; }
last_job() { timeout 10 squeue -h -t all -o %i -n "$1" 2>/dev/null | sort -n | tail -1; }

# 1. srun-only job, 2 nodes: the step on the first node starts it.
cat >probe.sh <<EOF
#!/bin/bash
echo "\$SLURMD_NODENAME sock=\${NEREUS_SOCKET_DIR-unset} err=\${NEREUS_ERROR-unset}"
if [ "\$SLURM_NODEID" = 0 ]; then
    "$nrs" status >status.\$SLURM_JOB_ID.out 2>&1 && echo "status ok on \$SLURMD_NODENAME"
    ps -eo args= | grep -cE "nereus-controller --socket-dir \$NEREUS_SOCKET_DIR( |\\\$)" | sed 's/^/controllers=/'
fi
EOF
chmod 755 probe.sh
sl_run 60 srun -J nrs-ctl1 -N 2 -n 2 --nereus=good.yaml ./probe.sh
cp "$sl_out" srun1.out
jid=$(last_job nrs-ctl1)
sock="$state/n1/$jid"
if [ "$sl_rc" -eq 0 ] && [ "$(grep -c " sock=$sock err=unset$" srun1.out)" -eq 2 ]; then
    sl_ok "srun --nereus: tasks on both nodes get NEREUS_SOCKET_DIR=$sock"
else sl_fail "srun --nereus: tasks on both nodes get NEREUS_SOCKET_DIR=$sock" "rc $sl_rc"; fi
sl_check "a task on the first node asks nereus status (\$NEREUS_SOCKET_DIR)" grep -q '^status ok on n1$' srun1.out
sl_check "exactly one controller while the step ran" grep -q '^controllers=1$' srun1.out
sleep 1
# The lock file stays until the epilog removes it: let go, its record "stopped"
# (opened read-only: flock(1) would create a missing one).
lock_let_go() { [ ! -e "$1" ] || { grep -q '^stopped ' "$1" && flock -n 9; } 9<"$1"; }
if [ -z "$(ctl_procs | grep "/$jid ")" ] && lock_let_go "$sock/controller.lock" &&
    grep -q 'controller stopped; exiting' "$sock/watcher.log"; then
    sl_ok "controller and watcher gone with the step, lock let go"
else { ctl_procs; cat "$sock/controller.lock"; } >"$sl_out" 2>&1; sl_fail "controller and watcher gone with the step, lock let go" "see above"; fi

# 1b. Three concurrent steps with --nereus in one job (the batch step has
# none): the O_EXCL lock lets one start the controller, the others use it.
sl_run 20 sbatch --parsable -J nrs-ctl1b -N 1 -o conc.out --wrap 'for i in 1 2 3; do srun -n1 --overlap --nereus=good.yaml bash -c "echo sock=\$NEREUS_SOCKET_DIR err=\${NEREUS_ERROR-unset}; sleep 3" & done; wait'
jidc=$(tail -1 "$sl_out")
three_up() { [ "$(cat conc.out 2>/dev/null | grep -c '^sock=')" -ge 3 ]; }
for _ in $(seq 1 60); do three_up && break; sleep 0.25; done # then 3 s of sleep left
nc=$(ctl_procs | grep -cE "^[^ ]*nereus-controller --socket-dir $state/n1/$jidc( |\$)")
sl_wait_job_state "$jidc" COMPLETED 30
{ cat conc.out; cat "$state/n1/$jidc/watcher.log"; } >"$sl_out" 2>&1
if [ "$nc" -eq 1 ] && [ "$(grep -c "^sock=$state/n1/$jidc err=unset$" conc.out)" -eq 3 ] &&
    [ "$(grep -c ': started .*nereus-controller' "$state/n1/$jidc/watcher.log")" -eq 1 ]; then
    sl_ok "3 concurrent steps with --nereus: one controller, all 3 get its socket"
else sl_fail "3 concurrent steps with --nereus: one controller, all 3 get its socket" "$nc running"; fi
# The job's allocation had no --nereus, its steps did: its epilog still cleans
# the job directory (on the first node only the two logs stay).
only_logs() { [ "$(ls -A "$state/n1/$jidc" 2>/dev/null | sort | xargs)" = "controller.log watcher.log" ]; }
if sl_wait_until 10 only_logs; then
    sl_ok "job without --nereus whose steps had it: its epilog cleans the job directory (only the logs stay)"
else ls -la "$state/n1/$jidc" >"$sl_out" 2>&1
    sl_fail "job without --nereus whose steps had it: its epilog cleans the job directory" "left: $(ls -A "$state/n1/$jidc" 2>/dev/null | xargs)"; fi

# 1d. The watcher killed (SIGKILL: no chance to stop its child): the
# controller dies with it (parent-death signal), not orphaned for the rest
# of the step.
sl_run 20 sbatch --parsable -J nrs-ctl1d -N 1 -o pdeath.out --nereus=good.yaml --wrap 'sleep 20'
jidd=$(tail -1 "$sl_out")
dird="$state/n1/$jidd"
pid_of_prog() { ps -eo pid=,args= | grep -E "^ *[0-9]+ [^ ]*nereus-$1 --socket-dir $dird( |\$)" | awk '{print $1}' | head -1; }
both_up() { [ -n "$(pid_of_prog watcher)" ] && [ -n "$(pid_of_prog controller)" ]; }
if sl_wait_job_state "$jidd" RUNNING 30 && sl_wait_until 15 both_up; then
    wpid=$(pid_of_prog watcher) cpid=$(pid_of_prog controller)
    kill -KILL "$wpid"
    ctl_gone() { ! kill -0 "$cpid" 2>/dev/null || [ "$(sed 's/.*) //' /proc/"$cpid"/stat 2>/dev/null | cut -d' ' -f1)" = Z ]; }
    if sl_wait_until 3 ctl_gone && [ "$(sl_job_field "$jidd" JobState)" = RUNNING ]; then
        sl_ok "watcher SIGKILLed: its controller dies with it while the job runs on"
    else ps -o pid,ppid,args -p "$cpid" >"$sl_out" 2>&1
        sl_fail "watcher SIGKILLed: its controller dies with it while the job runs on" "controller $cpid still there"; fi
else sl_fail "watcher SIGKILLed: its controller dies with it" "job '$jidd': no watcher and controller"; fi
timeout 10 scancel "$jidd" 2>/dev/null
sl_wait_job_state "$jidd" CANCELLED 20

# 1c. As another user (nobody): the watcher and controller run with its real
# and effective uid, not root's, and answer it; the watcher's libslurm call
# works as that user (the controller is sized from the job: 2 nodes, not the
# spec's 1).
if command -v setpriv >/dev/null && id -u nobody >/dev/null 2>&1; then
    nb=$(id -u nobody)
    sl_run 30 setpriv --reuid="$nb" --regid="$(id -g nobody)" --clear-groups env HOME=/tmp \
        srun -J nrs-ctl1c -N 2 -n 2 --nereus=good.yaml bash -c '[ "$SLURM_NODEID" = 0 ] || exit 0; ps -o ruser=,user=,args= -u "$(id -u)" | grep -cE "^nobody +nobody +[^ ]*nereus-(watcher|controller) --socket-dir $NEREUS_SOCKET_DIR( |\$)"; "'"$nrs"'" status | head -1'
    if [ "$sl_rc" -eq 0 ] && grep -qx 2 "$sl_out" && grep -q '^job [0-9]*: epoch 1, 8 GPUs' "$sl_out"; then
        sl_ok "as user nobody: watcher and controller run as nobody (real and effective), slurm_load_job works (8 GPUs = 2 nodes x 4), status answers"
    else sl_fail "as user nobody: watcher and controller run as nobody (real and effective), slurm_load_job works" "rc $sl_rc"; fi
else sl_skip "as user nobody" "no setpriv or no user nobody"; fi

# 2. No --nereus: no controller, no job directory.
# (Other controllers may run on this machine: count this cluster's only.)
sl_run 30 srun -J nrs-ctl2 -N 1 bash -c "sleep 1; ps -eo args= | grep -cE '^[^ ]*nereus-(controller|watcher) --socket-dir $state/'; true"

jid2=$(last_job nrs-ctl2)
if [ "$sl_rc" -eq 0 ] && [ "$(tail -1 "$sl_out")" = 0 ] && [ -n "$jid2" ] && [ ! -e "$state/n1/$jid2" ]; then
    sl_ok "a job without --nereus starts no controller (and creates no job directory)"
else sl_fail "a job without --nereus starts no controller (and creates no job directory)" "rc $sl_rc, job '$jid2'"; fi

# 3. runtime_dir without the binaries: a clear NEREUS_ERROR, the job runs.
sed -E "s|runtime_dir=[^ ]*|runtime_dir=$sl_tmp/no-such-dir|" "$NRS_CLUSTER_DIR/etc/plugstack.conf.nereus" >"$(sl_plugstack)"
sl_run 30 srun -J nrs-ctl3 -N 1 --nereus=good.yaml bash -c 'echo "sock=${NEREUS_SOCKET_DIR-unset}"; echo "err=${NEREUS_ERROR-unset}"; exit 0'
cp "$sl_out" srun3.out
sl_plugstack_restore
if [ "$sl_rc" -eq 0 ] && grep -q '^sock=unset$' srun3.out &&
    grep -q "^err=cannot run $sl_tmp/no-such-dir/nereus-controller: No such file or directory (runtime_dir=" srun3.out; then
    sl_ok "missing nereus-controller: job runs, NEREUS_ERROR says why, no NEREUS_SOCKET_DIR"
else sl_fail "missing nereus-controller: job runs, NEREUS_ERROR says why, no NEREUS_SOCKET_DIR" "rc $sl_rc"; fi
# 3b. A controller that fails at start-up, and one that never answers: the
# step still starts (bounded wait: at most 10 s), NEREUS_ERROR says why, the
# hung one is stopped.
fake_rt() { # dir body: runtime_dir with the real watcher and a fake controller
    mkdir -p "$1"; ln -sf "$NRS_BUILDDIR/nereus-watcher" "$1/nereus-watcher"
    printf '#!/bin/sh\n%s\n' "$2" >"$1/nereus-controller"; chmod 755 "$1" "$1/nereus-controller"
}
fake_rt "$sl_tmp/rt-fail" 'echo "nereus-controller: simulated start-up failure" >&2; exit 1'
fake_rt "$sl_tmp/rt-hang" 'exec sleep 61'
for kind in fail hang; do
    sed -E "s|runtime_dir=[^ ]*|runtime_dir=$sl_tmp/rt-$kind|" "$NRS_CLUSTER_DIR/etc/plugstack.conf.nereus" >"$(sl_plugstack)"
    t0=$SECONDS
    sl_run 40 srun -J nrs-ctl-$kind -N 1 --nereus=good.yaml bash -c 'echo "err=${NEREUS_ERROR-unset}"'
    took=$((SECONDS - t0))
    cp "$sl_out" "srun-$kind.out"
done
sl_plugstack_restore
if grep -q "^err=the job's controller did not start: nereus-controller: simulated start-up failure" srun-fail.out; then
    sl_ok "controller failing at start-up: the job runs, NEREUS_ERROR has its message"
else cp srun-fail.out "$sl_out"; sl_fail "controller failing at start-up: the job runs, NEREUS_ERROR has its message" "see above"; fi
sleep 1
if grep -q "^err=the job's controller did not answer on .* within 10 s" srun-hang.out && [ "$took" -le 20 ] &&
    ! ps -eo args= | grep -q '^sleep 61$'; then
    sl_ok "controller never answering: the step starts after the 10 s bound (${took} s), the controller is stopped"
else cp srun-hang.out "$sl_out"; sl_fail "controller never answering: the step starts after the 10 s bound" "${took} s"; fi

# 4. The same with the plugin "required": the step fails instead, with the
# reason in srun's output; slurmd stays up.
sed -E "s|runtime_dir=[^ ]*|runtime_dir=$sl_tmp/no-such-dir|; s|^optional |required |" \
    "$NRS_CLUSTER_DIR/etc/plugstack.conf.nereus" >"$(sl_plugstack)"
sl_run 30 srun -J nrs-ctl4 -N 1 --nereus=good.yaml echo should-not-run
sl_plugstack_restore
# (22.05's srun may still exit 0 after "task 0 launch failed".)
if ! grep -q should-not-run "$sl_out" && grep -q 'launch failed' "$sl_out" &&
    grep -q 'nereus: cannot run .*/nereus-controller' "$sl_out"; then
    sl_ok "missing nereus-controller, plugin required: the step's launch fails, with the reason"
else sl_fail "missing nereus-controller, plugin required: the step's launch fails, with the reason" "rc $sl_rc"; fi
sl_check "no controller or watcher left anywhere" test -z "$(ctl_procs)"
sl_check_slurmds
sl_done
