#!/usr/bin/env bash
# scripts/cluster itself: "up" on a running cluster changes nothing, "status"
# lists every daemon and node, the fake GPUs are there, and a GPU job gets them.
. "$(dirname "$0")/lib.sh"
cluster="$NRS_SRCDIR/scripts/cluster"
pids() { cat "$NRS_CLUSTER_DIR"/run/{munged,slurmctld,slurmd-n*}.pid 2>/dev/null | sort | xargs; }
before=$(pids)
sl_run 60 "$cluster" up --dir "$NRS_CLUSTER_DIR"
if [ "$sl_rc" -eq 0 ] && grep -q "already up" "$sl_out" && [ "$(pids)" = "$before" ]; then
    sl_ok "up on a running cluster: a no-op"
else sl_fail "up on a running cluster: a no-op" "rc=$sl_rc, pids '$before' -> '$(pids)'"; fi
sl_run 20 "$cluster" status --dir "$NRS_CLUSTER_DIR"
if [ "$sl_rc" -eq 0 ] && [ "$(grep -c ' idle gpu:4 ' "$sl_out")" -eq 4 ]; then
    sl_ok "status: 4 idle nodes with 4 GPUs each"
else sl_fail "status: 4 idle nodes with 4 GPUs each" "rc=$sl_rc"; fi
sl_run 30 srun -N 1 --gres=gpu:2 bash -c 'echo "gpus=$CUDA_VISIBLE_DEVICES"'
sl_check "--gres=gpu:2 job gets 2 GPUs" grep -q '^gpus=0,1$' "$sl_out"
sl_done
