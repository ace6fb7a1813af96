#!/usr/bin/env bash
# The benchmarks (bench/) as programs, never timed: their arguments, exit
# statuses and output shapes at tiny sizes, that a run whose bytes are wrong
# yields no figure, and that the scripts leave a failed run out of their
# figures and exit 1 (with stub programs in a fake build directory).
. "$(dirname "$0")/../mp/lib.sh"
S="${NRS_SRCDIR:-$(cd "$(dirname "$0")/../.." && pwd)}"
SPEC="$S/examples/ppo-llama3-8b.yaml"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/nrs-bench.XXXXXX")
trap 'rm -rf "$tmp" "$mp_out"' EXIT

bt_awk() { # name awk-program: true of the last case's output
    if awk "$2" "$mp_out"; then
        echo "[       OK ] $1"; mp_pass=$((mp_pass + 1))
    else
        echo "[  FAILED  ] $1"; mp_fail=$((mp_fail + 1))
    fi
}
bt_lacks() { # name pattern: the last case's output lacks it
    if grep -Eq -- "$2" "$mp_out"; then
        echo "[  FAILED  ] $1: output has '$2'"; mp_fail=$((mp_fail + 1))
    else
        echo "[       OK ] $1"; mp_pass=$((mp_pass + 1))
    fi
}

# bench_plan: the median of an even count is the mean of the middle two
# (it was the upper one: with 2 repeats the median column was the max).
mp_case "bench_plan: 2 repeats" 0 60 "$B/bench/bench_plan" "$SPEC" 2
bt_awk "bench_plan: median of 2 = mean of min and max" \
    'NR > 1 { n++; d = $2 - ($3 + $4) / 2; if (d > 0.011 || d < -0.011) bad++ }
     END { exit !(n == 5 && !bad) }'
mp_case "bench_plan: REPEATS 5x refused" 2 10 "$B/bench/bench_plan" "$SPEC" 5x

# bench_graph: usage, and a failed case is exit status 1.
mp_case "bench_graph --help" 0 10 "$B/bench/bench_graph" --help
mp_grep "bench_graph --help: usage" "usage: bench_graph \[CASES\]"
mp_case "bench_graph scale without SPEC" 2 10 "$B/bench/bench_graph" scale
mp_case "bench_graph scale: a GPU count without a plan fails" 1 60 \
    "$B/bench/bench_graph" scale "$SPEC" 12 64
mp_grep "bench_graph scale: says why" "12 GPUs: plan: 12 GPUs is not a whole number"
mp_grep "bench_graph scale: the other count measured" "64 GPUs: .* ratio 1\.[0-9]* "
mp_case "bench_graph scale: junk count" 2 10 "$B/bench/bench_graph" scale "$SPEC" 64x
mp_case "bench_graph exec: scale 0 refused" 2 10 "$B/bench/bench_graph" exec 0
mp_case "bench_graph exec, tiny" 0 120 "$B/bench/bench_graph" exec 0.00001
bt_awk "bench_graph exec: 5 cases, each verified" \
    '/every shard verified$/ { n++ } END { exit n != 5 }'
mp_case "bench_graph 2 random cases" 0 120 "$B/bench/bench_graph" 2
mp_grep "bench_graph: random summary" "random 8B-shaped plans, 2 cases: makespan/lower bound worst"

# bench_controller: counts checked, the controller's own failure named at
# once, and a soft descriptor limit below the ranks raised.
C="$B/nereus-controller"
mp_case "bench_controller: 0 ranks refused" 2 10 "$B/bench/bench_controller" "$C" "$SPEC" 0
mp_case "bench_controller: a controller that refuses the GPUs" 1 30 \
    "$B/bench/bench_controller" "$C" "$SPEC" 12 2
mp_grep "bench_controller: says the controller exited" \
    "exited before it listened: no figures (controller: .*12 GPUs is not a whole number"
if [ "$(ulimit -Hn)" = unlimited ] || [ "$(ulimit -Hn)" -ge 200 ]; then
    mp_case "bench_controller: 80 ranks under a soft limit of 64 descriptors" 0 60 \
        bash -c 'ulimit -Sn 64 && exec "$@"' - "$B/bench/bench_controller" "$C" "$SPEC" 80 2
    mp_grep "bench_controller: every report taken" \
        "80 ranks over the unix socket, 2 steps, 160 reports taken (160 sent)"
else
    mp_skip "bench_controller: soft limit" "hard descriptor limit $(ulimit -Hn)"
fi

# bench_worker: --scale 0 was no scaling at all (the full model in this
# process: OOM-killed on a 23 GB machine); the address space is capped so
# that a regression fails instead of swamping the machine.
# ASan reserves terabytes of shadow, which no such cap allows: the case
# runs in the other builds only.
if [ -x "$B/bench/bench_worker" ]; then
    if ldd "$B/.libs/libnereus.so" 2>/dev/null | grep -q libasan; then
        mp_skip "bench_worker: --scale 0 refused" "a sanitizer build (no address-space cap)"
    else
        mp_case "bench_worker: --scale 0 refused" 2 30 \
            bash -c 'ulimit -v 4000000 && exec "$@"' - "$B/bench/bench_worker" "$SPEC" --scale 0 8
    fi
    mp_case "bench_worker: GPU count 8x refused" 2 10 "$B/bench/bench_worker" "$SPEC" 8x
    mp_case "bench_worker: 8 GPUs at 1e-4" 0 60 "$B/bench/bench_worker" "$SPEC" --scale 1e-4 8
    mp_grep "bench_worker: every shard verified" "0 mismatches"
else
    mp_skip "bench_worker" "not built (needs PMIx and UCX)"
fi

# bench_transfer --local: the transport's copy is checked (it was not).
if [ -x "$B/bench/bench_transfer" ]; then
    T="$B/bench/bench_transfer"
    mp_case "bench_transfer --local --reps 0 refused" 2 10 "$T" --local --reps 0 4096
    mp_case "bench_transfer --local 1M refused" 2 10 "$T" --local 1M
    mp_case "bench_transfer --local 4096" 0 30 "$T" --local --reps 2 4096
    bt_awk "bench_transfer --local: both shapes" \
        '$1 == "local" && $4 == 2 && $7 ~ /^[0-9.]+$/ { n++ } END { exit n != 2 }'
    mp_case "bench_transfer --local: a wrong copy fails" 1 30 env NRS_BENCH_CORRUPT=1 "$T" --local 4096
    mp_grep "bench_transfer --local: says which byte" "4096 bytes: byte 2048 of the copy is wrong"

    # Two ranks: rank 0 printed its figure before rank 1 had checked the
    # bytes, so a run with a wrong byte still gave a figure (and
    # transfer.sh took it). NRS_BENCH_CORRUPT=1 flips one received byte.
    export UCX_TLS=sm UCX_NET_DEVICES=lo
    P="$B/bench/bench_ucp_plain"
    mp_case "bench_transfer: 2 ranks" 0 60 "$SRV" -q -n 2 -t 50 -- "$T" --iters 3 4096
    mp_grep "bench_transfer: the figure" "^ours 4096 3 1 1 [0-9.]*$"
    mp_case "bench_transfer: a wrong byte fails" 1 60 env NRS_BENCH_CORRUPT=1 \
        "$SRV" -q -n 2 -t 50 -- "$T" --iters 3 4096
    mp_grep "bench_transfer: rank 1 says which byte" "size 4096: byte 2048 did not arrive"
    bt_lacks "bench_transfer: no figure for it" "^ours "
    mp_case "bench_ucp_plain: 2 ranks" 0 60 "$SRV" -q -n 2 -t 50 -- "$P" --iters 3 4096
    mp_grep "bench_ucp_plain: the figure" "^plain 4096 3 1 1 [0-9.]*$"
    mp_case "bench_ucp_plain: a wrong byte fails" 1 60 env NRS_BENCH_CORRUPT=1 \
        "$SRV" -q -n 2 -t 50 -- "$P" --iters 3 4096
    bt_lacks "bench_ucp_plain: no figure for it" "^plain "
    mp_case "bench_ucp_plain --mix: a wrong byte fails" 1 60 env NRS_BENCH_CORRUPT=1 \
        "$SRV" -q -n 2 -t 50 -- "$P" --mix 2 4096
    bt_lacks "bench_ucp_plain --mix: no figure for it" "^mix "
    mp_case "bench_ucp_plain: no size" 2 10 "$P" --iters 3
    unset UCX_TLS UCX_NET_DEVICES
else
    mp_skip "bench_transfer" "not built (needs PMIx and UCX)"
fi

# The scripts, against stubs in a fake build directory: pmix_srv runs no
# ranks but prints what the bench would and exits $STUB_RC.
fb="$tmp/build"
mkdir -p "$fb/tests/mp" "$fb/bench" "$tmp/bin"
cat >"$fb/tests/mp/pmix_srv" <<'STUB'
#!/usr/bin/env bash
while [ "$1" != -- ]; do shift; done; shift
prog=$(basename "$1"); shift
size=${*: -1}
case "$prog $*" in
*--mix*) echo "mix $size 2 8 0.990 0.980 1.000 1000.00 990.00" ;;
bench_transfer*) echo "ours $size 5 1 1 1000.00" ;;
bench_ucp_plain*) echo "plain $size 5 1 1 1000.00" ;;
esac
echo "stub $prog: exit ${STUB_RC:-0}" >&2
exit "${STUB_RC:-0}"
STUB
printf '#!/bin/sh\nexit 0\n' >"$fb/bench/bench_transfer"
printf '#!/bin/sh\nexit 0\n' >"$fb/bench/bench_ucp_plain"
printf '#!/bin/sh\nexit 1\n' >"$tmp/bin/ucx_perftest" # --plain never runs it
cat >"$fb/bench/bench_worker" <<'STUB'
#!/bin/sh
echo "    8 GPUs: seconds: set_plan 0.001 alloc 0.010 sync(build) 0.002 sync 0.001 transition 0.500 verify 0.100"
echo "  verify: 3 shards did not verify (-1)"
echo " (failed) total 0.614; 798 buffers, 795 shards verified, 3 mismatches"
exit 1
STUB
chmod +x "$fb/tests/mp/pmix_srv" "$fb/bench/"* "$tmp/bin/ucx_perftest"
ts="$S/bench/transfer.sh"
tsargs=(-b "$fb" --plain -t sm -s 1 -r 2 -T 1 -c none --no-local)
mp_case "transfer.sh: runs that succeed" 0 60 env PATH="$tmp/bin:$PATH" bash "$ts" "${tsargs[@]}"
mp_grep "transfer.sh: their ratio" \
    "^sm  *1  *1024  *103  *2  *1000 \[1000-1000\]  *1000 \[1000-1000\]  *1\.00  *1\.00 \[1\.00-1\.00\]$"
mp_case "transfer.sh: runs that fail are not counted" 1 60 \
    env PATH="$tmp/bin:$PATH" STUB_RC=1 bash "$ts" "${tsargs[@]}"
mp_grep "transfer.sh: the failures counted" "n/a \[n/a-n/a\] .*(ours failed 2) (perftest failed 2)$"
mp_grep "transfer.sh: a failure named" "ours 1048576 sm failed (exit 1): stub bench_transfer: exit 1"
mp_case "transfer.sh --mix: runs that fail are not counted" 1 60 \
    env PATH="$tmp/bin:$PATH" STUB_RC=1 bash "$ts" -b "$fb" --mix 2 -t sm -s 1 -r 2 -c none
mp_grep "transfer.sh --mix: the failures counted" "^sm  *1  *0 .* (failed 2)$"
mp_case "verify.sh: a failed bench_worker run is not counted" 1 30 bash "$S/bench/verify.sh" "$fb" --reps 1
mp_grep "verify.sh: says which" "bench_worker (verify [01]) exit 1: .*(failed)"
bt_lacks "verify.sh: no figures" "median"
mp_case "verify.sh: unknown option" 2 10 bash "$S/bench/verify.sh" "$fb" --rep 1

mp_done
