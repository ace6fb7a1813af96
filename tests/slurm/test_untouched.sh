#!/usr/bin/env bash
# A job without --nereus runs exactly as if the plugin were absent: the same
# environment (job-specific values masked), output and exit status, with the
# plugin line in plugstack.conf and with it removed (srun and slurmstepd read
# plugstack.conf afresh for every command and step).
. "$(dirname "$0")/lib.sh"
sl_need_plugin "untouched"
cd "$sl_tmp" || exit 1
sl_at_exit sl_plugstack_restore

# The task's environment with what differs from job to job masked: the job
# id, ports, pids, times.
probe='env | sort | sed -E "s/^(SLURM_JOB_?ID)=.*/\1=<job>/; s/^(SLURM_[A-Z_]*(PORT|PID|TIME|PORTS)[A-Z_]*)=.*/\1=<x>/"; echo "out: hello from $SLURMD_NODENAME"; exit 3'
srun_probe() { # out-file: stdout, then exit status, then stderr (never interleaved)
    timeout -k 5 30 srun -w n1 -N 1 bash -c "$probe" >"$1" 2>"$1.err"
    echo "rc=$?" >>"$1"
    cat "$1.err" >>"$1"
}
sbatch_probe() { # out-file
    local jid
    sl_run 20 sbatch --parsable -w n1 -N 1 -o "$1.job" --wrap "$probe"
    jid=$(tail -1 "$sl_out")
    sl_wait_job_state "$jid" FAILED 40 || echo "job $jid did not end FAILED (exit 3)" >>"$1.job"
    { cat "$1.job"; echo "exit=$(sl_job_field "$jid" ExitCode)"; } >"$1"
}

srun_probe with-srun
sbatch_probe with-sbatch
echo "# plugin removed by tests/slurm/test_untouched.sh" >"$(sl_plugstack)"
srun_probe without-srun
sbatch_probe without-sbatch
sl_run 30 srun --nereus=good.yaml true
without_rc=$sl_rc
sl_plugstack_restore

sl_check "plugin really absent in the reference run (--nereus unknown)" test "$without_rc" -ne 0
for kind in srun sbatch; do
    if diff -u "without-$kind" "with-$kind" >"$sl_out" 2>&1; then
        sl_ok "$kind without --nereus: environment, output, exit status as without the plugin"
    else sl_fail "$kind without --nereus: environment, output, exit status as without the plugin" "differs"; fi
done
if grep -q '^rc=3$' with-srun && grep -q '^out: hello from n1$' with-srun && grep -q '^exit=3:0$' with-sbatch; then
    sl_ok "exit status 3 and output came through"
else cp with-srun "$sl_out"; sl_fail "exit status 3 and output came through" "see output"; fi
if ! grep -q '^NEREUS_\|^SPANK_' with-srun with-sbatch; then
    sl_ok "no NEREUS_* or SPANK_* in a job without --nereus"
else sl_fail "no NEREUS_* or SPANK_* in a job without --nereus" "found"; fi
sl_done
