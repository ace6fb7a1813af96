#!/usr/bin/env bash
# --nereus[=FILE] as users write it:
#  - a relative FILE means the file in the submission directory, also when
#    the step runs elsewhere (--chdir): srun/sbatch hand its absolute path to
#    the job (NEREUS_SPEC_PATH), the step uses it; an srun in the batch
#    script, in another directory, inherits the job's file;
#  - "--nereus FILE" (a space: the option's argument is optional, so FILE
#    becomes the command) is refused with how to write it, even with a
#    default_spec that would otherwise silently be used.
. "$(dirname "$0")/lib.sh"
sl_need_plugin "--nereus FILE"
cd "$sl_tmp" || exit 1
sl_at_exit sl_plugstack_restore
mkdir -m 755 other # no good.yaml there
show='echo "spec=${NEREUS_SPEC-unset} err=${NEREUS_ERROR-unset}"'

# ---- 1. a relative FILE with --chdir ------------------------------------------------
sl_run 40 srun -J nrs-opt1 -N 1 --chdir="$sl_tmp/other" --nereus=good.yaml bash -c "$show"
if [ "$sl_rc" -eq 0 ] && grep -q "^spec=$sl_tmp/good.yaml err=unset$" "$sl_out"; then
    sl_ok "srun --chdir=other --nereus=good.yaml: the step uses the submission directory's good.yaml"
else sl_fail "srun --chdir=other --nereus=good.yaml: the step uses the submission directory's good.yaml" "rc $sl_rc"; fi

sl_run 20 sbatch --parsable -J nrs-opt2 -N 1 -D "$sl_tmp/other" -o "$sl_tmp/opt2.out" --nereus=good.yaml \
    --wrap "echo batch; $show; srun bash -c 'echo step; $show'"
j=$(tail -1 "$sl_out")
if sl_wait_job_state "$j" COMPLETED 40 &&
    [ "$(grep -c "^spec=$sl_tmp/good.yaml err=unset$" "$sl_tmp/opt2.out")" -eq 2 ]; then
    sl_ok "sbatch -D other --nereus=good.yaml: the batch step and its srun use the submission directory's good.yaml"
else cp "$sl_tmp/opt2.out" "$sl_out" 2>/dev/null
    sl_fail "sbatch -D other --nereus=good.yaml: the batch step and its srun use the submission directory's good.yaml" "job '$j' $(sl_job_field "$j" JobState)"; fi

# ---- 2. "--nereus FILE": FILE is the command -----------------------------------------
sed "s|\$| default_spec=$sl_good|" "$NRS_CLUSTER_DIR/etc/plugstack.conf.nereus" >"$(sl_plugstack)"
printf '#!/bin/sh\n%s\n' "$show" >job.yaml
chmod 755 job.yaml
sl_run 40 srun -J nrs-opt3 -N 1 --nereus ./job.yaml
if grep -q "^spec=unset err='--nereus FILE' takes FILE as the command; write --nereus=FILE" "$sl_out" &&
    grep -q "^slurmstepd-n[0-9]*: error: nereus: '--nereus FILE' takes FILE as the command; write --nereus=FILE" "$sl_out"; then
    sl_ok "srun --nereus ./job.yaml (default_spec set): refused, srun's stderr and NEREUS_ERROR say to write --nereus=FILE"
else sl_fail "srun --nereus ./job.yaml (default_spec set): refused, srun's stderr and NEREUS_ERROR say to write --nereus=FILE" "rc $sl_rc"; fi
if grep -q "nereus: '--nereus FILE' takes FILE as the command; write --nereus=FILE" "$NRS_CLUSTER_DIR"/log/slurmd-n*.log; then
    sl_ok "the refusal is in the slurmd log, prefixed nereus:"
else sl_fail "the refusal is in the slurmd log, prefixed nereus:" "not in slurmd-n*.log"; fi
sl_run 40 srun -J nrs-opt4 -N 1 --nereus bash -c "$show"
sl_check "a bare --nereus with another command still uses default_spec" grep -q "^spec=$sl_good err=unset$" "$sl_out"
sl_plugstack_restore

sl_run 10 srun --help
sl_check "srun --help shows --nereus[=FILE]" grep -qF -- '--nereus[=FILE]' "$sl_out"

sl_check "every node idle again" sl_wait_until 20 sl_all_idle
sl_check_slurmds
sl_done
