#!/usr/bin/env bash
# The paper's headline comparisons, from `nereus simulate` (docs/baselines.md):
#   1. 8B PPO throughput (samples/s = global_batch * samples_per_prompt / mean
#      step) of nereus against the MODELLED openrlhf-like and verl-like
#      placements on three cluster shapes (examples/traces/shape-*.trace);
#   2. nereus against fixed, mean step latency, on ppo-8b-grow.trace;
#   3. transitions and their share of run time on ppo-8b-1024.trace (last: slow).
# The baselines are models of those systems priced by Nereus' own cost model,
# not runs of OpenRLHF or verl.
#
# Usage: bench/sim-baselines.sh BUILD_DIR [SRC_DIR]
#   NRS_SKIP_1024=1   skip the 1,024-GPU run
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: bench/sim-baselines.sh BUILD_DIR [SRC_DIR]" >&2; exit 2; }
build="$(cd "$1" && pwd)"
src="${2:-$(cd "$(dirname "$0")/.." && pwd)}"
nereus="$build/nereus"
[ -x "$nereus" ] || { echo "sim-baselines: $nereus not built" >&2; exit 1; }
spec="$src/examples/ppo-llama3-8b.yaml"
traces="$src/examples/traces"
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT

# Field of a policy's summary line: 2 mean step s, 3 samples/s, 4 total h,
# 5 transitions, 8 share of time in transitions (with %).
field() { awk -v p="$2" -v f="$3" '$1 == p { print $f; exit }' "$1"; }

now() { date +%s.%N; }
# Floating-point arithmetic without bc.
calc() { awk "BEGIN { printf \"%.6f\", $1 }"; }

echo "Modelled baselines (openrlhf-like, verl-like) are placements priced by the"
echo "Nereus cost model, NOT runs of OpenRLHF or verl (docs/baselines.md)."
echo
echo "1. Llama-3-8B PPO throughput, samples/s ($(basename "$spec"))"
printf '%-8s %10s %14s %10s %12s %10s\n' "GPUs" "nereus" "openrlhf-like" "verl-like" \
    "vs openrlhf" "vs verl"
for t in "$traces"/shape-*.trace; do
    g="$(basename "$t" .trace)"; g="${g#shape-}"
    for p in nereus openrlhf-like verl-like; do
        "$nereus" simulate "$spec" --trace "$t" --policy "$p" --quiet >"$tmp/$g.$p"
    done
    n="$(field "$tmp/$g.nereus" nereus 3)"
    o="$(field "$tmp/$g.openrlhf-like" openrlhf-like 3)"
    v="$(field "$tmp/$g.verl-like" verl-like 3)"
    # Ratios from the mean steps (same samples per step), not the rounded rates.
    ns="$(field "$tmp/$g.nereus" nereus 2)"
    os="$(field "$tmp/$g.openrlhf-like" openrlhf-like 2)"
    vs="$(field "$tmp/$g.verl-like" verl-like 2)"
    printf '%-8s %10s %14s %10s %11.2fx %9.2fx\n' "$g" "$n" "$o" "$v" \
        "$(calc "$os / $ns")" "$(calc "$vs / $ns")"
done | sort -n
echo "   paper: 2.14-7.27x over OpenRLHF, 1.10-1.47x over verl (8B PPO)"
echo

echo "2. nereus vs fixed, mean step latency (ppo-8b-grow.trace)"
"$nereus" simulate "$spec" --trace "$traces/ppo-8b-grow.trace" --policy nereus --quiet >"$tmp/grow.n"
"$nereus" simulate "$spec" --trace "$traces/ppo-8b-grow.trace" --policy fixed --quiet >"$tmp/grow.f"
n="$(field "$tmp/grow.n" nereus 2)"; f="$(field "$tmp/grow.f" fixed 2)"
printf '   nereus %.3f s, fixed %.3f s: %.1f%% lower (paper: 27.7%%)\n' "$n" "$f" \
    "$(calc "100 * (1 - $n / $f)")"
echo

echo "3. 1,000 steps growing to 1,024 GPUs (ppo-8b-1024.trace), nereus"
if [ "${NRS_SKIP_1024:-0}" = 1 ]; then
    echo "   skipped (NRS_SKIP_1024=1)"
else
    t0="$(now)"
    "$nereus" simulate "$spec" --trace "$traces/ppo-8b-1024.trace" --policy nereus --quiet >"$tmp/big"
    t1="$(now)"
    printf '   %s transitions, %s of run time in transitions (paper: six, 0.079%%); simulated in %.1f s wall\n' \
        "$(field "$tmp/big" nereus 5)" "$(field "$tmp/big" nereus 8)" "$(calc "$t1 - $t0")"
fi
