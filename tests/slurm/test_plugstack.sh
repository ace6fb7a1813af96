#!/usr/bin/env bash
# A bad plugstack argument with the plugin "required" (the strict case: any
# init failure would fail every srun/sbatch/salloc and every step, and
# slurmd would refuse to start): jobs without --nereus run and print nothing
# from Nereus; --nereus is refused with "nereus: plugstack.conf: ..."; a
# slurmd (re)started with that line comes up and logs the error once.
# (srun, sbatch, salloc and slurmstepd read plugstack.conf afresh; slurmd only
# at start, so n4's slurmd is restarted here, and again with the good line.)
. "$(dirname "$0")/lib.sh"
sl_need_plugin "bad plugstack argument"
cd "$sl_tmp" || exit 1
run="$NRS_CLUSTER_DIR/run" log="$NRS_CLUSTER_DIR/log"
why="nereus: plugstack.conf: argument 'bogus' is unknown (known: runtime_dir, state_dir, default_spec, poll_interval, controller_tcp)"

slurmd_pid() { cat "$run/slurmd-$1.pid" 2>/dev/null; }
slurmd_alive() { local p; p=$(slurmd_pid "$1") && [ -n "$p" ] && kill -0 "$p" 2>/dev/null &&
    [ "$(sed 's/.*) //' "/proc/$p/stat" 2>/dev/null | cut -d' ' -f1)" != Z ]; }
node_idle() { [ "$(timeout 10 sinfo -h -n "$1" -o %T 2>/dev/null)" = idle ]; }
# As scripts/cluster starts it (its own session, pid file for status/down).
slurmd_restart() { # node
    local p; p=$(slurmd_pid "$1")
    [ -z "$p" ] || { kill -TERM "$p" 2>/dev/null; sl_wait_until 15 bash -c "! kill -0 $p 2>/dev/null"; }
    (cd "$NRS_CLUSTER_DIR" && exec setsid slurmd -D -N "$1" -f "$SLURM_CONF" >>"$log/slurmd-$1.out" 2>&1 </dev/null) &
    echo $! >"$run/slurmd-$1.pid"
}
good_again() {
    restored=1
    sl_plugstack_restore
    slurmd_restart n4
    sl_wait_until 60 node_idle n4
}
restored=0
sl_at_exit '[ "$restored" = 1 ] || good_again >/dev/null 2>&1'
no_nereus() { ! grep -qi nereus "$@"; }

sed 's/^optional /required /; s/$/ bogus=1/' "$NRS_CLUSTER_DIR/etc/plugstack.conf.nereus" >"$(sl_plugstack)"

# ---- clients and steps --------------------------------------------------------
sl_run 30 srun -N 2 echo fine
if [ "$sl_rc" -eq 0 ] && [ "$(grep -c '^fine$' "$sl_out")" -eq 2 ] && no_nereus "$sl_out"; then
    sl_ok "required + bad argument: srun without --nereus runs, nothing from nereus"
else sl_fail "required + bad argument: srun without --nereus runs, nothing from nereus" "rc $sl_rc"; fi

sl_run 20 sbatch --parsable -N 2 -o "$sl_tmp/plain.out" --wrap 'srun -N 2 echo fine'
jid=$(tail -1 "$sl_out")
sb_quiet=1; no_nereus "$sl_out" || sb_quiet=0
if [ "$sb_quiet" -eq 1 ] && sl_wait_job_state "$jid" COMPLETED 40 &&
    [ "$(grep -c '^fine$' "$sl_tmp/plain.out")" -eq 2 ] && no_nereus "$sl_tmp/plain.out"; then
    sl_ok "required + bad argument: sbatch without --nereus (batch step and its srun) COMPLETED, nothing from nereus"
else cp "$sl_tmp/plain.out" "$sl_out" 2>/dev/null
    sl_fail "required + bad argument: sbatch without --nereus COMPLETED, nothing from nereus" "job '$jid' $(sl_job_field "$jid" JobState)"; fi

sl_run 30 salloc -N 1 true
if [ "$sl_rc" -eq 0 ] && no_nereus "$sl_out"; then
    sl_ok "required + bad argument: salloc without --nereus runs, nothing from nereus"
else sl_fail "required + bad argument: salloc without --nereus runs, nothing from nereus" "rc $sl_rc"; fi

sl_run 30 srun -J nrs-badconf --nereus=good.yaml true
if [ "$sl_rc" -ne 0 ] && grep -qF "$why" "$sl_out" && sl_no_job_named nrs-badconf; then
    sl_ok "required + bad argument: srun --nereus refused with 'nereus: plugstack.conf: ...', no job"
else sl_fail "required + bad argument: srun --nereus refused with 'nereus: plugstack.conf: ...', no job" "rc $sl_rc"; fi

# ---- slurmd ----------------------------------------------------------------------
before=$(grep -cF "$why" "$log/slurmd-n4.log" 2>/dev/null)
slurmd_restart n4
sleep 2
if slurmd_alive n4 && sl_wait_until 60 node_idle n4; then
    sl_ok "required + bad argument: slurmd restarted with it comes up (n4 idle)"
else tail -n 5 "$log/slurmd-n4.log" >"$sl_out" 2>&1
    sl_fail "required + bad argument: slurmd restarted with it comes up (n4 idle)" "see its log"; fi
after=$(grep -cF "$why" "$log/slurmd-n4.log" 2>/dev/null)
grep -F "$why" "$log/slurmd-n4.log" 2>/dev/null | tail -n 2 >"$sl_out"
sl_check "slurmd logged the bad argument once, as an error ($before -> $after)" \
    test "$after" -eq $((before + 1)) -a "$(grep -c 'error: nereus: plugstack.conf' "$sl_out")" -ge 1
sl_run 30 srun -w n4 -N 1 echo fine
sl_check "a job without --nereus runs on that node" test "$sl_rc" -eq 0 -a "$(grep -c '^fine$' "$sl_out")" -eq 1

good_again
sl_check "n4's slurmd restarted with the good line, idle" node_idle n4
sl_check_slurmds
sl_done
