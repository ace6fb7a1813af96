#!/usr/bin/env bash
# --nereus at submission: a bad spec is refused by srun and by sbatch (option
# and #SBATCH line) with FILE:LINE:COL and no job created, the last value
# given counting (sbatch's command line overrides #SBATCH); a good one reaches
# the tasks as NEREUS_SPEC (absolute), with a per-job directory per node; a
# failure inside Nereus on a node leaves that step running without it.
. "$(dirname "$0")/lib.sh"
sl_need_plugin "submit"
cd "$sl_tmp" || exit 1
tag="nrs$$"

# -- refused at submission -----------------------------------------------------
sl_run 30 srun -J "$tag-srun" --nereus=bad.yaml true
if [ "$sl_rc" -ne 0 ] && grep -q "nereus: $sl_bad_where unknown key 'gpus_per_nod'" "$sl_out"; then
    sl_ok "srun --nereus=bad.yaml refused with FILE:LINE:COL"
else sl_fail "srun --nereus=bad.yaml refused with FILE:LINE:COL" "rc=$sl_rc"; fi
sl_check "srun --nereus=bad.yaml created no job" sl_no_job_named "$tag-srun"

sl_run 30 sbatch -J "$tag-sbatch" --nereus=bad.yaml --wrap true
if [ "$sl_rc" -ne 0 ] && grep -q "nereus: $sl_bad_where" "$sl_out"; then
    sl_ok "sbatch --nereus=bad.yaml refused with FILE:LINE:COL"
else sl_fail "sbatch --nereus=bad.yaml refused with FILE:LINE:COL" "rc=$sl_rc"; fi
sl_check "sbatch --nereus=bad.yaml created no job" sl_no_job_named "$tag-sbatch"

printf '#!/bin/bash\n#SBATCH --nereus=bad.yaml\n#SBATCH -J %s\ntrue\n' "$tag-script" >bad.sbatch
sl_run 30 sbatch bad.sbatch
if [ "$sl_rc" -ne 0 ] && grep -q "nereus: $sl_bad_where" "$sl_out" && sl_no_job_named "$tag-script"; then
    sl_ok "#SBATCH --nereus=bad.yaml refused, no job"
else sl_fail "#SBATCH --nereus=bad.yaml refused, no job" "rc=$sl_rc"; fi

# The command line overrides #SBATCH (Slurm's rule): only the last value
# counts, whichever of the two is bad. sbatch runs the option's callback for
# the script's line first, then for the command line's.
printf '#!/bin/bash\n#SBATCH --nereus=bad.yaml\necho "spec=$NEREUS_SPEC"\n' >bad-line.sbatch
sl_run 30 sbatch --parsable -o "$sl_tmp/over-%j.out" --nereus=good.yaml bad-line.sbatch
jid=$(tail -1 "$sl_out")
if [ "$sl_rc" -eq 0 ] && sl_wait_job_state "$jid" COMPLETED 40 &&
   grep -q "^spec=$sl_tmp/good.yaml$" "$sl_tmp/over-$jid.out"; then
    sl_ok "#SBATCH --nereus=bad.yaml, sbatch --nereus=good.yaml: the job runs with good.yaml"
else sl_fail "#SBATCH --nereus=bad.yaml, sbatch --nereus=good.yaml: the job runs with good.yaml" "rc=$sl_rc"; fi
printf '#!/bin/bash\n#SBATCH --nereus=good.yaml\n#SBATCH -J %s\ntrue\n' "$tag-over" >good-line.sbatch
sl_run 30 sbatch --nereus=bad.yaml good-line.sbatch
if [ "$sl_rc" -ne 0 ] && grep -q "nereus: $sl_bad_where" "$sl_out" && sl_no_job_named "$tag-over"; then
    sl_ok "#SBATCH --nereus=good.yaml, sbatch --nereus=bad.yaml: refused with FILE:LINE:COL, no job"
else sl_fail "#SBATCH --nereus=good.yaml, sbatch --nereus=bad.yaml: refused with FILE:LINE:COL, no job" "rc=$sl_rc"; fi
# The same for srun: the job's option in the environment, then its own.
sl_run 30 env SLURM_SPANK__SLURM_SPANK_OPTION_nereus_nereus=bad.yaml srun --nereus=good.yaml \
    bash -c 'echo "spec=$NEREUS_SPEC"'
sl_check "an inherited --nereus=bad.yaml, srun --nereus=good.yaml: srun's own spec is taken" \
    grep -q "^spec=$sl_tmp/good.yaml$" "$sl_out"

sl_run 30 salloc -J "$tag-salloc" --nereus=bad.yaml true
if [ "$sl_rc" -ne 0 ] && grep -q "nereus: $sl_bad_where" "$sl_out" && sl_no_job_named "$tag-salloc"; then
    sl_ok "salloc --nereus=bad.yaml refused, no job"
else sl_fail "salloc --nereus=bad.yaml refused, no job" "rc=$sl_rc"; fi

sl_run 30 srun -J "$tag-missing" --nereus=missing.yaml true
if [ "$sl_rc" -ne 0 ] && grep -q "nereus: missing.yaml" "$sl_out" && sl_no_job_named "$tag-missing"; then
    sl_ok "srun --nereus=missing.yaml refused, no job"
else sl_fail "srun --nereus=missing.yaml refused, no job" "rc=$sl_rc"; fi

sl_run 30 srun -J "$tag-bare" --nereus true
if [ "$sl_rc" -ne 0 ] && grep -q "nereus: --nereus needs a job spec" "$sl_out"; then
    sl_ok "bare --nereus without default_spec refused"
else sl_fail "bare --nereus without default_spec refused" "rc=$sl_rc"; fi

# -- accepted: the tasks see it --------------------------------------------------
sl_run 30 srun -N 2 -l --nereus=good.yaml bash -c \
    'echo "spec=$NEREUS_SPEC dir=$NEREUS_JOB_DIR mode=$(stat -c %a "$NEREUS_JOB_DIR") poll=$NEREUS_POLL_INTERVAL"'
poll=$(sed -n 's/.* poll_interval=\([^ ]*\).*/\1/p' "$NRS_CLUSTER_DIR/etc/plugstack.conf.nereus") # run.sh: 1
if [ "$sl_rc" -eq 0 ] && [ "$(grep -c "spec=$sl_tmp/good.yaml dir=$NRS_CLUSTER_DIR/nereus/n[12]/[0-9]* mode=700 poll=$poll$" "$sl_out")" -eq 2 ]; then
    sl_ok "srun --nereus=good.yaml: tasks see NEREUS_SPEC (absolute), a 0700 job dir per node"
else sl_fail "srun --nereus=good.yaml: tasks see NEREUS_SPEC (absolute), a 0700 job dir per node" "rc=$sl_rc"; fi

cat >good.sbatch <<EOS
#!/bin/bash
#SBATCH --nereus=good.yaml
#SBATCH -N 2
#SBATCH -o $sl_tmp/good-%j.out
echo "batch spec=\$NEREUS_SPEC"
srun -l bash -c 'echo "step node=\$SLURMD_NODENAME spec=\$NEREUS_SPEC dir=\$NEREUS_JOB_DIR"'
EOS
sl_run 20 sbatch --parsable good.sbatch
jid=$(tail -1 "$sl_out")
if [ "$sl_rc" -eq 0 ] && sl_wait_job_state "$jid" COMPLETED 40; then
    cp "$sl_tmp/good-$jid.out" "$sl_out"
    if grep -q "batch spec=$sl_tmp/good.yaml" "$sl_out" &&
       grep -q "step node=n1 spec=$sl_tmp/good.yaml dir=$NRS_CLUSTER_DIR/nereus/n1/$jid$" "$sl_out" &&
       grep -q "step node=n2 spec=$sl_tmp/good.yaml dir=$NRS_CLUSTER_DIR/nereus/n2/$jid$" "$sl_out"; then
        sl_ok "#SBATCH --nereus=good.yaml: batch step and srun steps see NEREUS_*"
    else sl_fail "#SBATCH --nereus=good.yaml: batch step and srun steps see NEREUS_*" "output"; fi
else sl_fail "#SBATCH --nereus=good.yaml: batch step and srun steps see NEREUS_*" "job $jid did not complete"; fi

# -- a failure inside Nereus does not fail the job ("optional") -------------------
mkdir -p "$NRS_CLUSTER_DIR/nereus/n2"
chmod 777 "$NRS_CLUSTER_DIR/nereus/n2" # unsafe state dir: the plugin refuses it
sl_run 30 srun -N 2 -l --nereus=good.yaml bash -c 'echo "spec=${NEREUS_SPEC:-none} error=${NEREUS_ERROR:-}"'
chmod 755 "$NRS_CLUSTER_DIR/nereus/n2"
if [ "$sl_rc" -eq 0 ] && grep -q "^0: spec=$sl_tmp/good.yaml error=$" "$sl_out" &&
   grep -q "^1: spec=none error=state_dir .* writable by group or others" "$sl_out"; then
    sl_ok "unsafe state dir on one node: that step runs without Nereus, NEREUS_ERROR says why"
else sl_fail "unsafe state dir on one node: that step runs without Nereus, NEREUS_ERROR says why" "rc=$sl_rc"; fi

# -- a misconfigured plugstack line: --nereus refused with the reason, other
#    jobs unaffected ------------------------------------------------------------
sl_at_exit sl_plugstack_restore
sed 's/$/ bogus=1/' "$NRS_CLUSTER_DIR/etc/plugstack.conf.nereus" >"$(sl_plugstack)"
sl_run 30 srun --nereus=good.yaml true
if [ "$sl_rc" -ne 0 ] && grep -q "nereus: plugstack.conf: argument 'bogus' is unknown (known: runtime_dir, state_dir, default_spec, poll_interval, controller_tcp)" "$sl_out"; then
    sl_ok "unknown plugstack argument: --nereus refused with the reason"
else sl_fail "unknown plugstack argument: --nereus refused with the reason" "rc=$sl_rc"; fi
sl_run 30 srun -N 2 echo fine
sl_check "unknown plugstack argument: a job without --nereus still runs, nothing from nereus" \
    test "$sl_rc" -eq 0 -a "$(grep -c '^fine$' "$sl_out")" -eq 2 -a "$(grep -ci nereus "$sl_out")" -eq 0
sl_plugstack_restore

sl_check_slurmds
sl_done
