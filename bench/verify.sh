#!/usr/bin/env bash
# bench/verify.sh: what runtime.verify costs a transition. bench/bench_worker
# (one process holding every GPU's state, the worker API's transition through
# the executor, runtime/worker/dtrans) with $NRS_WORKER_VERIFY=0 and =1: every
# transfer hashed by its sender and its receiver, the sums compared in the
# votes. REPS pairs of runs, interleaved, alternating which goes first; prints
# each side's median "transition" seconds and the ratio of the medians.
# A run that fails (bench_worker's exit status not 0: a phase failed or a
# shard did not verify) ends the script with exit status 1, no figures.
# Figures only, never a test.
#   bench/verify.sh [BUILD_DIR] [--spec FILE] [--scale S] [--gpus N] [--reps N]
set -u
here="$(cd "$(dirname "$0")" && pwd)"
B=. spec="$here/../examples/ppo-llama3-8b.yaml" scale=1e-2 gpus=8 reps=5
while [ $# -gt 0 ]; do
    case "$1" in
    --spec) spec=$2; shift 2 ;; --scale) scale=$2; shift 2 ;; --gpus) gpus=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    -h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "bench/verify.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) B=$1; shift ;;
    esac
done
W="$B/bench/bench_worker"
[ -x "$W" ] || { echo "bench/verify.sh: $W not built (make bench)" >&2; exit 2; }
case "$reps" in ''|*[!0-9]*|0) echo "bench/verify.sh: --reps $reps: want a count" >&2; exit 2 ;; esac
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
one() { # NRS_WORKER_VERIFY value: the transition's seconds; nothing when the run failed
    local rc
    NRS_WORKER_VERIFY=$1 "$W" "$spec" --scale "$scale" "$gpus" >"$tmp/out" 2>&1
    rc=$?
    [ $rc = 0 ] || { echo "bench/verify.sh: bench_worker (verify $1) exit $rc: $(tail -1 "$tmp/out")" >&2; return 1; }
    sed -n 's/.* transition \([0-9.]*\) .*/\1/p' "$tmp/out" | head -1
}
off=() on=()
for i in $(seq "$reps"); do
    if [ $((i % 2)) = 1 ]; then a=$(one 0); b=$(one 1); else b=$(one 1); a=$(one 0); fi
    [ -n "$a" ] && [ -n "$b" ] || { echo "bench/verify.sh: a run failed" >&2; exit 1; }
    off+=("$a") on+=("$b")
done
. "$here/lib.sh"
med() { printf '%s\n' "$@" | nrs_stats %.3f | cut -d' ' -f1; }
mo=$(med "${off[@]}") mv=$(med "${on[@]}")
echo "verify: $(basename "$spec") at scale $scale on $gpus GPUs (one process), $reps pairs of runs"
echo "  transition, verify off: median $mo s   (${off[*]})"
echo "  transition, verify on:  median $mv s   (${on[*]})"
awk -v a="$mo" -v b="$mv" 'BEGIN { printf "  verify on / off: %.3f\n", b / a }'
