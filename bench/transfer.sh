#!/usr/bin/env bash
# Our UCX path (bench/bench_transfer) against ucx_perftest -t tag_bw, same
# transport, same sizes, same run, one direction between two processes on
# this machine; prints MB/s of both and the ratio. Then the in-process path
# (runtime/emu's local transport) against memcpy of the same bytes, same run
# (bench_transfer --local; target >= 0.8x).
#   bench/transfer.sh [BUILD_DIR] [SIZES_MIB...]     (default 1 4 16 64 256)
#   NRS_BENCH_TLS="sm tcp"   NRS_BENCH_MIN_BYTES=1073741824 (per size)
set -u
B="${1:-$(pwd)}"; shift || true
sizes_mib="${*:-1 4 16 64 256}"
tls_list="${NRS_BENCH_TLS:-sm tcp}"
total="${NRS_BENCH_MIN_BYTES:-1073741824}"
SRV="$B/tests/mp/pmix_srv"; BT="$B/bench/bench_transfer"
for f in "$SRV" "$BT"; do
    [ -x "$f" ] || { echo "missing $f: run 'make check TESTS= && make bench' in $B"; exit 1; }
done
command -v ucx_perftest >/dev/null || { echo "ucx_perftest not found (apt install ucx-utils)"; exit 1; }
export UCX_NET_DEVICES=lo
port=$((20000 + $$ % 20000))
perftest() { # tls size iters -> MB/s
    local out
    UCX_TLS=$1 timeout 120 ucx_perftest -t tag_bw -s "$2" -n "$3" -p "$port" >/dev/null 2>&1 &
    local spid=$!
    sleep 0.3
    out=$(UCX_TLS=$1 timeout 120 ucx_perftest 127.0.0.1 -t tag_bw -s "$2" -n "$3" -p "$port" 2>&1)
    wait "$spid" 2>/dev/null
    port=$((port + 1))
    echo "$out" | awk '/^Final:/ {print $(NF-3)}'
}
printf '%-4s %10s %6s %12s %12s %7s\n' tls bytes iters "ours MB/s" "perftest" ratio
for tls in $tls_list; do
    bytes=""; for m in $sizes_mib; do bytes="$bytes $((m * 1048576))"; done
    ours=$(UCX_TLS=$tls "$SRV" -q -n 2 -t 600 -- "$BT" --min-bytes "$total" $bytes)
    for s in $bytes; do
        line=$(echo "$ours" | awk -v s="$s" '$1 == "ours" && $2 == s')
        iters=$(echo "$line" | awk '{print $3}'); o=$(echo "$line" | awk '{print $4}')
        p=$(perftest "$tls" "$s" "${iters:-5}")
        r=$(awk -v o="${o:-0}" -v p="${p:-0}" 'BEGIN { if (p > 0) printf "%.2f", o / p; else print "n/a" }')
        printf '%-4s %10s %6s %12s %12s %7s\n' "$tls" "$s" "${iters:-?}" "${o:-fail}" "${p:-fail}" "$r"
    done
done
echo
sizes_b=""; for m in $sizes_mib; do sizes_b="$sizes_b $((m * 1048576))"; done
"$BT" --local $sizes_b
