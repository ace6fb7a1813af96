#!/usr/bin/env bash
# GPU benchmark: device-to-device transition throughput against cudaMemcpy,
# and the NCCL transport with one rank (bench/gpu/gpu_bench.c), in one table:
# ours and cudaMemcpy side by side, their ratio, and whether the bytes arrived.
#
#   bench/gpu/run.sh [BUILD_DIR] [--reps N] [--chunk BYTES] [--max-mib M] [--deadline S]
#   bench/gpu/run.sh --help
#
# BUILD_DIR: a configured build with CUDA and NCCL (default: .), or a folder
# made by bench/gpu/pack.sh. Bounded: gpu_bench gives up after --deadline
# (150 s) and this script kills it after NRS_GPU_BENCH_TIMEOUT (180 s);
# expected well under a minute on one H200 (CUDA and NCCL start-up included;
# an estimate: it has not run on a GPU yet). Ends with "gpu_bench: ok" or
# "gpu_bench: FAILED" (exit 1). Where no GPU is present it prints
# "skipped: no GPU: <why>" and exits 0.
#
# On the GPU machine, run bench/gpu/device-check.sh (the tests and this
# bench, each under its own time-out); bench/gpu/README says how.
set -u
usage() {
    awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "$0"
}
case "${1:-}" in -h | --help) usage; exit 0 ;; esac
B=.
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then B="$1"; shift; fi
G="$B/bench/gpu/gpu_bench"
if [ ! -x "$G" ]; then
    if [ -f "$B/Makefile" ]; then
        make -C "$B" bench/gpu/gpu_bench >/dev/null 2>&1 ||
            { echo "run.sh: 'make bench/gpu/gpu_bench' failed in $B: configure found no CUDA/NCCL (needs HAVE_NCCL)?" >&2; exit 1; }
    else
        echo "run.sh: no $G (not a build directory with CUDA and NCCL?)" >&2; exit 1
    fi
fi
# one host: NCCL on loopback sockets, its IB transport off (an IB card that
# leads nowhere can hang or slow its set-up); the user's settings win
export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"
export NCCL_SOCKET_IFNAME="${NCCL_SOCKET_IFNAME:-lo}" NCCL_IB_DISABLE="${NCCL_IB_DISABLE:-1}"
limit="${NRS_GPU_BENCH_TIMEOUT:-180}"
timeout -k 5 "$limit" "$G" "$@"
rc=$?
case "$rc" in
    77) exit 0 ;;
    124 | 137) echo "run.sh: gpu_bench timed out (exit $rc; limit ${limit} s): FAILED" >&2 ;;
esac
exit "$rc"
