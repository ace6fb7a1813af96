#!/usr/bin/env bash
# GPU benchmark: device-to-device transition throughput against cudaMemcpy,
# and the NCCL transport with one rank (bench/gpu/gpu_bench.c). Where no GPU
# is present it prints "skipped: no GPU: <why>" and exits 0.
#   bench/gpu/run.sh [BUILD_DIR] [--reps N] [--chunk BYTES]
set -u
B="${1:-$(pwd)}"; shift || true
G="$B/bench/gpu/gpu_bench"
if [ ! -x "$G" ]; then
    make -C "$B" bench/gpu/gpu_bench >/dev/null 2>&1 || {
        echo "gpu_bench not built: configure found no CUDA/NCCL (needs HAVE_NCCL)"; exit 1; }
fi
timeout -k 5 300 "$G" "$@"
rc=$?
[ "$rc" -eq 77 ] && exit 0
exit "$rc"
