#!/usr/bin/env bash
# bench/transfer.sh: our UCX path (bench/bench_transfer, i.e. runtime/xfer/ucx)
# against ucx_perftest -t tag_bw on this machine, then the in-process path
# against memcpy. See --help and docs/protocol-dataplane.md §6.
set -u
usage() {
    cat <<'EOF'
usage: bench/transfer.sh [options] [BUILD_DIR [SIZE_MIB...]]

Two processes on this machine, one direction, host memory. For each UCX
transport (UCX_TLS) and message size, REPS pairs of runs, interleaved and
alternating which goes first (ours, perftest, perftest, ours, ...), each run
a fresh pair of processes:
  ours:     tests/mp/pmix_srv -n 2 -- bench/bench_transfer --iters N --warmup W
              --outstanding K SIZE   (nrs_ucx_isend/irecv: chunked tag messages)
  perftest: ucx_perftest -t tag_bw -s SIZE -n N -w W -O K  (server + client)
both with UCX_TLS=<tls> UCX_NET_DEVICES=lo, the same N, W, K, the same buffer
reused for every message and one ack at the end. N = max(5, BYTES / SIZE),
W = ceil(N / 10) (ucx_perftest's own default rule). Bandwidth is MiB/s
(2^20 B/s, what ucx_perftest calls MB/s: its "overall" column). Prints per
size the median of each side, the ratio of the medians and the median,
min and max of the per-pair ratios. Target: ratio >= 0.9.

options:
  -b, --build DIR     build directory (default: $PWD, or the first argument)
  -t, --tls "LIST"    UCX transports, each run separately (default "sm tcp")
  -s, --sizes "LIST"  message sizes in MiB (default "1 4 16 64 256")
  -r, --reps N        pairs of runs per size (default 5)
  -B, --bytes N       bytes per run at least (default 1073741824)
  -O, --outstanding K messages posted at a time, both sides (default 1)
  -x, --extra "ARGS"  more bench_transfer options, e.g. "--chunk 4194304",
                      "--spin-us -1" (nap at once, as before), "--xport" (through
                      the executor's transport table, waiting as dtrans does)
      --plain         the other side is bench/bench_ucp_plain instead: ucx_perftest's
                      loop on plain UCP in our harness (pmix_srv, PMIx), to tell what
                      the harness costs from what runtime/xfer/ucx.c costs (-O 1 only)
      --no-local      skip the in-process vs memcpy part
  -v, --verbose       print every run's figure
  -h, --help          this text
environment: NRS_BENCH_TLS, NRS_BENCH_MIN_BYTES, NRS_BENCH_REPS set the
defaults of -t, -B and -r.
Needs: make bench/bench_transfer tests/mp/pmix_srv (and for --plain bench/bench_ucp_plain)
in BUILD_DIR; ucx_perftest
(Debian: apt install ucx-utils).
EOF
}
B=$(pwd); sizes_mib="1 4 16 64 256"; tls_list="${NRS_BENCH_TLS:-sm tcp}"
total="${NRS_BENCH_MIN_BYTES:-1073741824}"; reps="${NRS_BENCH_REPS:-5}"; K=1
extra=""; local_part=1; verbose=0; plain=0; pos=()
while [ $# -gt 0 ]; do
    case "$1" in
    -h|--help) usage; exit 0 ;;
    -b|--build) B="$2"; shift ;;
    -t|--tls) tls_list="$2"; shift ;;
    -s|--sizes) sizes_mib="$2"; shift ;;
    -r|--reps) reps="$2"; shift ;;
    -B|--bytes) total="$2"; shift ;;
    -O|--outstanding) K="$2"; shift ;;
    -x|--extra) extra="$2"; shift ;;
    --no-local) local_part=0 ;;
    --plain) plain=1 ;;
    -v|--verbose) verbose=1 ;;
    -*) echo "transfer.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) pos+=("$1") ;;
    esac
    shift
done
if [ ${#pos[@]} -gt 0 ]; then B="${pos[0]}"; fi
if [ ${#pos[@]} -gt 1 ]; then sizes_mib="${pos[*]:1}"; fi
SRV="$B/tests/mp/pmix_srv"; BT="$B/bench/bench_transfer"; BP="$B/bench/bench_ucp_plain"
if [ $plain = 1 ]; then
    [ -x "$BP" ] || { echo "missing $BP: run 'make bench/bench_ucp_plain' in $B" >&2; exit 1; }
    [ "$K" = 1 ] || { echo "transfer.sh: --plain runs one message in flight (-O 1)" >&2; exit 2; }
fi
for f in "$SRV" "$BT"; do
    [ -x "$f" ] || { echo "missing $f: run 'make bench/bench_transfer tests/mp/pmix_srv' in $B" >&2; exit 1; }
done
command -v ucx_perftest >/dev/null || { echo "ucx_perftest not found (apt install ucx-utils)" >&2; exit 1; }
export UCX_NET_DEVICES=lo
port=$((20000 + $$ % 20000))

ours() { # tls size iters warmup -> MiB/s
    UCX_TLS=$1 timeout 300 "$SRV" -q -n 2 -t 290 -- "$BT" --iters "$3" --warmup "$4" \
        --outstanding "$K" $extra "$2" | awk '$1 == "ours" || $1 == "xport" {print $6}'
}
perftest() { # tls size iters warmup -> MiB/s
    local out spid i
    if [ $plain = 1 ]; then
        UCX_TLS=$1 timeout 300 "$SRV" -q -n 2 -t 290 -- "$BP" --iters "$3" --warmup "$4" "$2" |
            awk '$1 == "plain" {print $6}'
        return
    fi
    port=$((port + 1)); [ $port -gt 60000 ] && port=20000
    UCX_TLS=$1 timeout 300 ucx_perftest -t tag_bw -s "$2" -n "$3" -w "$4" -O "$K" \
        -p "$port" >/dev/null 2>&1 &
    spid=$!
    for i in $(seq 100); do # until the server listens (5 s at most)
        ss -Hltn "sport = :$port" 2>/dev/null | grep -q . && break
        sleep 0.05
    done
    out=$(UCX_TLS=$1 timeout 300 ucx_perftest 127.0.0.1 -t tag_bw -s "$2" -n "$3" -w "$4" \
        -O "$K" -p "$port" 2>&1)
    wait "$spid" 2>/dev/null
    echo "$out" | awk '/^Final:/ {print $(NF-2)}'
}
# median, min, max of the numbers on stdin, printed with format $1
. "$(dirname "$0")/lib.sh"
stats() { nrs_stats "$@"; }
ratios() { awk '{ if ($2 > 0) printf "%.3f\n", $1 / $2 }'; }

echo "ours:     pmix_srv -n 2 -- bench_transfer --iters N --warmup W --outstanding $K $extra SIZE"
if [ $plain = 1 ]; then
    echo "perftest: (--plain) pmix_srv -n 2 -- bench_ucp_plain --iters N --warmup W SIZE"
else
    echo "perftest: ucx_perftest -t tag_bw -s SIZE -n N -w W -O $K  (client 127.0.0.1)"
fi
echo "env: UCX_TLS=<tls> UCX_NET_DEVICES=lo; $reps pairs per size, interleaved; MiB/s"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
for tls in $tls_list; do
    for r in $(seq "$reps"); do
        for m in $sizes_mib; do
            s=$((m * 1048576)); n=$((total / s)); [ $n -lt 5 ] && n=5; w=$(((n + 9) / 10))
            if [ $((r % 2)) -eq 1 ]; then o=$(ours $tls $s $n $w); p=$(perftest $tls $s $n $w)
            else p=$(perftest $tls $s $n $w); o=$(ours $tls $s $n $w); fi
            echo "${o:-0} ${p:-0}" >>"$tmp/$tls.$m"
            [ $verbose = 1 ] && echo "  $tls ${m}MiB rep $r: ours ${o:-fail} perftest ${p:-fail}"
        done
    done
done
echo
printf '%-4s %8s %6s %4s %4s %22s %22s %7s %20s\n' tls MiB iters warm reps \
    "ours med [min-max]" "perftest med [min-max]" ratio "pair ratio med [min-max]"
for tls in $tls_list; do
    for m in $sizes_mib; do
        s=$((m * 1048576)); n=$((total / s)); [ $n -lt 5 ] && n=5; w=$(((n + 9) / 10))
        f="$tmp/$tls.$m"
        read -r om omin omax < <(awk '$1 > 0 {print $1}' "$f" | stats %.0f)
        read -r pm pmin pmax < <(awk '$2 > 0 {print $2}' "$f" | stats %.0f)
        read -r rm rmin rmax < <(awk '$1 > 0 && $2 > 0' "$f" | ratios | stats %.2f)
        ratio=$(awk -v o="$om" -v p="$pm" 'BEGIN { if (p + 0 > 0 && o + 0 > 0) printf "%.2f", o / p; else print "n/a" }')
        fails=$(awk '$1 <= 0 || $2 <= 0' "$f" | wc -l)
        printf '%-4s %8s %6s %4s %4s %22s %22s %7s %20s%s\n' "$tls" "$m" "$n" "$w" "$reps" \
            "$om [$omin-$omax]" "$pm [$pmin-$pmax]" "$ratio" "$rm [$rmin-$rmax]" \
            "$([ "$fails" -gt 0 ] && echo " ($fails failed)")"
    done
done
if [ $local_part = 1 ]; then
    echo
    sizes_b=""; for m in $sizes_mib; do sizes_b="$sizes_b $((m * 1048576))"; done
    "$BT" --local $sizes_b
fi
