#!/usr/bin/env bash
# NCCL transport and CUDA memory on real GPUs; "skipped: no GPU" elsewhere
# (counted as skipped, never as passed).
. "$(dirname "$0")/lib.sh"
N="$B/tests/mp/mp_nccl"
probe=$("$N" --bytes 1 2>&1); prc=$?
if [ "$prc" -eq 77 ]; then
    echo "$probe"
    mp_skip "nccl" "$(echo "$probe" | head -1)"
    mp_done
fi
mp_case "nccl 1 rank: 64 MiB+3 to itself, 4 MiB chunks" 0 120 "$N"
ngpu=$(nvidia-smi -L 2>/dev/null | wc -l)
if [ "${ngpu:-0}" -ge 2 ]; then
    mp_case "nccl $ngpu ranks: ring, then shrink" 0 180 "$SRV" -q -n "$ngpu" -t 170 -- "$N"
else
    mp_skip "nccl multi-rank" "one GPU: NCCL refuses two ranks on one GPU"
fi
mp_done
