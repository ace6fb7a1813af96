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
              --outstanding K [--cpus S,R] SIZE   (nrs_ucx_isend/irecv: chunked tag messages)
  perftest: ucx_perftest -t tag_bw -s SIZE -n N -w W -O K  (server -c R, client -c S)
both with UCX_TLS=<tls> UCX_NET_DEVICES=lo, the same N, W, K, the same buffer
reused for every message and one ack at the end, the sender bound to one CPU
and the receiver to another, the same two for both (which CPU does which
changed ucx_perftest over tcp by 2.5x on the build machine). A run during
which other processes took more than F of those CPUs is run again (up to T
times; the last try counts, flagged "noisy"). N = max(5, BYTES / SIZE),
W = ceil(N / 10) (ucx_perftest's own default rule). Bandwidth is MiB/s
(2^20 B/s, what ucx_perftest calls MB/s: its "overall" column). Prints per
size the median of each side, the ratio of the medians and the median,
min and max of the per-pair ratios. Target: ratio >= 0.9. A run that failed
(a side's exit status not 0: bench_transfer exits 1 when the receiver found
a byte wrong) is left out of the figures and counted as "(ours failed N)"
or "(perftest failed N)"; the script then exits 1.

options:
  -b, --build DIR     build directory (default: $PWD, or the first argument)
  -t, --tls "LIST"    UCX transports, each run separately (default "sm tcp")
  -s, --sizes "LIST"  message sizes in MiB (default "1 4 16 64 256")
  -r, --reps N        pairs of runs per size (default 5)
  -B, --bytes N       bytes per run at least (default 1073741824)
  -O, --outstanding K messages posted at a time, both sides (default 1)
  -c, --cpus "S R"    sender on CPU S, receiver on CPU R, both programs (default:
                      the last two CPUs this shell may use; "none": unbound)
  -f, --max-other F   rerun a run if other processes used more than F of the
                      bound CPUs (all CPUs if unbound) meanwhile (default 0.1)
  -T, --tries T       runs of one measurement at most (default 5; 1: no rerun)
  -x, --extra "ARGS"  more bench_transfer options, e.g. "--chunk 4194304",
                      "--spin-us -1" (nap at once, as before), "--xport" (through
                      the executor's transport table, waiting as dtrans does)
      --plain         the other side is bench/bench_ucp_plain instead: ucx_perftest's
                      loop on plain UCP in our harness (pmix_srv, PMIx), to tell what
                      the harness costs from what runtime/xfer/ucx.c costs (-O 1 only)
      --mix PAIRS     instead: bench_ucp_plain --mix PAIRS, our layer against the plain
                      loop in the same two processes, blocks interleaved (see
                      bench/bench_ucp_plain.c); REPS runs per size, the median of
                      their ours/plain ratios (the harness and the load cancel out)
      --no-local      skip the in-process vs memcpy part
  -o, --out FILE      also append every pair to FILE: "tls MiB ours perftest" (MiB/s;
                      --mix: "mix tls MiB ratio plain ours", one line a run)
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
extra=""; local_part=1; verbose=0; plain=0; pos=(); cpus=auto; max_other=0.1; tries=5; out=""; mixp=0
while [ $# -gt 0 ]; do
    case "$1" in
    -h|--help) usage; exit 0 ;;
    -b|--build) B="$2"; shift ;;
    -t|--tls) tls_list="$2"; shift ;;
    -s|--sizes) sizes_mib="$2"; shift ;;
    -r|--reps) reps="$2"; shift ;;
    -B|--bytes) total="$2"; shift ;;
    -O|--outstanding) K="$2"; shift ;;
    -c|--cpus) cpus="$2"; shift ;;
    -f|--max-other) max_other="$2"; shift ;;
    -T|--tries) tries="$2"; shift ;;
    -x|--extra) extra="$2"; shift ;;
    --no-local) local_part=0 ;;
    -o|--out) out="$2"; shift ;;
    --plain) plain=1 ;;
    --mix) mixp="$2"; shift ;;
    -v|--verbose) verbose=1 ;;
    -*) echo "transfer.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) pos+=("$1") ;;
    esac
    shift
done
if [ ${#pos[@]} -gt 0 ]; then B="${pos[0]}"; fi
if [ ${#pos[@]} -gt 1 ]; then sizes_mib="${pos[*]:1}"; fi
SRV="$B/tests/mp/pmix_srv"; BT="$B/bench/bench_transfer"; BP="$B/bench/bench_ucp_plain"
if [ $plain = 1 ] || [ "$mixp" != 0 ]; then
    [ -x "$BP" ] || { echo "missing $BP: run 'make bench/bench_ucp_plain' in $B" >&2; exit 1; }
    [ "$K" = 1 ] || { echo "transfer.sh: --plain and --mix run one message in flight (-O 1)" >&2; exit 2; }
fi
for f in "$SRV" "$BT"; do
    [ -x "$f" ] || { echo "missing $f: run 'make bench/bench_transfer tests/mp/pmix_srv' in $B" >&2; exit 1; }
done
command -v ucx_perftest >/dev/null || { echo "ucx_perftest not found (apt install ucx-utils)" >&2; exit 1; }
export UCX_NET_DEVICES=lo
port=$((20000 + $$ % 20000))
if [ "$cpus" = auto ]; then # the last two CPUs we may use
    cpus=$(awk '/^Cpus_allowed_list:/ {print $2}' /proc/self/status | tr ',' '\n' |
        awk -F- '{ for (c = $1; c <= ($2 == "" ? $1 : $2); c++) print c }' | tail -2 | xargs)
    [ "$(echo "$cpus" | wc -w)" = 2 ] || cpus=none
fi
if [ "$cpus" = none ]; then
    ocpu=""; pt_send=""; pt_recv=""
else
    read -r cs cr <<<"$cpus"
    ocpu="--cpus $cs,$cr"; pt_send="-c $cs"; pt_recv="-c $cr"
fi

# ranks WHAT TLS CMD...: CMD as two ranks under pmix_srv; its output only
# when every rank exited 0 (a rank that found the bytes wrong fails), else
# none and WHAT's failure on stderr with its last line there.
ranks() {
    local what=$1 tls=$2 rc
    shift 2
    UCX_TLS=$tls timeout 300 "$SRV" -q -n 2 -t 290 -- "$@" >"$tmp/ranks.out" 2>"$tmp/ranks.err"
    rc=$?
    [ $rc = 0 ] && { cat "$tmp/ranks.out"; return 0; }
    echo "transfer.sh: $what $tls failed (exit $rc): $(tail -1 "$tmp/ranks.err")" >&2
    return 1
}
ours() { # tls size iters warmup -> MiB/s
    ranks "ours $2" "$1" "$BT" --iters "$3" --warmup "$4" --outstanding "$K" $ocpu $extra "$2" |
        awk '$1 == "ours" || $1 == "xport" {print $6}'
}
perftest() { # tls size iters warmup -> MiB/s
    local spid i rc
    if [ $plain = 1 ]; then
        ranks "plain $2" "$1" "$BP" --iters "$3" --warmup "$4" $ocpu "$2" | awk '$1 == "plain" {print $6}'
        return
    fi
    port=$((port + 1)); [ $port -gt 60000 ] && port=20000
    while ss -Hltn "sport = :$port" 2>/dev/null | grep -q .; do port=$((port + 1)); done # in use
    UCX_TLS=$1 timeout 300 ucx_perftest -t tag_bw -s "$2" -n "$3" -w "$4" -O "$K" \
        -p "$port" $pt_recv >/dev/null 2>&1 &
    spid=$!
    for i in $(seq 250); do # until the server listens (5 s at most)
        ss -Hltn "sport = :$port" 2>/dev/null | grep -q . && break
        sleep 0.02
    done
    UCX_TLS=$1 timeout 300 ucx_perftest 127.0.0.1 -t tag_bw -s "$2" -n "$3" -w "$4" \
        -O "$K" -p "$port" $pt_send >"$tmp/pt.out" 2>&1
    rc=$?
    wait "$spid" 2>/dev/null
    [ $rc = 0 ] && awk '/^Final:/ {print $(NF-2); ok = 1} END { exit !ok }' "$tmp/pt.out" ||
        echo "transfer.sh: ucx_perftest $1 $2 failed (exit $rc): $(tail -1 "$tmp/pt.out")" >&2
}
# Busy jiffies of the bound CPUs (all if unbound), steal included.
busy() {
    local want="cpu"
    [ "$cpus" = none ] || want="cpu$cs cpu$cr"
    awk -v w=" $want " 'index(w, " " $1 " ") { b += $2 + $3 + $4 + $7 + $8 + $9 } END { print b }' /proc/stat
}
# CPU seconds of this shell's children so far (from the `times` builtin)
child_s() { tail -1 "$1" | tr -d s | awk '{ split($1, u, "m"); split($2, k, "m"); print u[1] * 60 + u[2] + k[1] * 60 + k[2] }'; }
# measure FN ARGS...: FN's figure on stdout, rerun while other processes took
# more than max_other of the CPUs meanwhile (our own children subtracted);
# "noisy" on fd 3 when the last try is kept anyway. Runs FN in this shell, not
# a subshell, so that `times` counts its processes.
measure() {
    local t b0 b1 e0 e1 other hz ncpu
    hz=$(getconf CLK_TCK); ncpu=$([ "$cpus" = none ] && nproc || echo 2)
    for t in $(seq "$tries"); do
        times >"$tmp/t0"; b0=$(busy); e0=$(date +%s.%N)
        "$@" >"$tmp/val"
        b1=$(busy); e1=$(date +%s.%N); times >"$tmp/t1"
        other=$(awk -v b0="$b0" -v b1="$b1" -v c0="$(child_s "$tmp/t0")" -v c1="$(child_s "$tmp/t1")" \
            -v e0="$e0" -v e1="$e1" -v hz="$hz" -v n="$ncpu" \
            'BEGIN { printf "%.3f", ((b1 - b0) / hz - (c1 - c0)) / ((e1 - e0) * n) }')
        awk -v o="$other" -v m="$max_other" 'BEGIN { exit !(o <= m) }' && break
        [ "$t" = "$tries" ] && { echo noisy >&3; break; }
        echo retry >&3
    done
    cat "$tmp/val"
}
# median, min, max of the numbers on stdin, printed with format $1
. "$(dirname "$0")/lib.sh"
stats() { nrs_stats "$@"; }
ratios() { awk '{ if ($2 > 0) printf "%.3f\n", $1 / $2 }'; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
nfail=0 # failed runs: the exit status is 1 when there were any

if [ "$mixp" != 0 ]; then # our layer against the plain loop, in one pair of processes
    echo "mix: pmix_srv -n 2 -- bench_ucp_plain --mix $mixp $ocpu SIZE; UCX_NET_DEVICES=lo; $reps runs per size"
    printf '%-4s %8s %4s %28s %14s %14s\n' tls MiB runs "ours/plain med [min-max]" "plain MiB/s" "ours MiB/s"
    for tls in $tls_list; do
        for m in $sizes_mib; do
            for r in $(seq "$reps"); do
                ranks "mix $m MiB" "$tls" "$BP" --mix "$mixp" $ocpu $((m * 1048576)) | awk '$1 == "mix"'
            done >"$tmp/mix"
            read -r rm rmin rmax < <(awk '{print $5}' "$tmp/mix" | nrs_stats %.3f)
            read -r pm _ _ < <(awk '{print $8}' "$tmp/mix" | nrs_stats %.0f)
            read -r om _ _ < <(awk '{print $9}' "$tmp/mix" | nrs_stats %.0f)
            fm=$((reps - $(wc -l <"$tmp/mix"))); nfail=$((nfail + fm))
            printf '%-4s %8s %4s %28s %14s %14s%s\n' "$tls" "$m" "$(wc -l <"$tmp/mix")" \
                "$rm [$rmin-$rmax]" "$pm" "$om" "$([ $fm = 0 ] || echo " (failed $fm)")"
            [ -n "$out" ] && awk -v t="$tls" -v m="$m" '{print "mix", t, m, $5, $8, $9}' "$tmp/mix" >>"$out"
        done
    done
    [ $nfail = 0 ] || { echo "transfer.sh: $nfail run(s) failed, left out of the figures" >&2; exit 1; }
    exit 0
fi
echo "ours:     pmix_srv -n 2 -- bench_transfer --iters N --warmup W --outstanding $K $ocpu $extra SIZE"
if [ $plain = 1 ]; then
    echo "perftest: (--plain) pmix_srv -n 2 -- bench_ucp_plain --iters N --warmup W $ocpu SIZE"
else
    echo "perftest: ucx_perftest -t tag_bw -s SIZE -n N -w W -O $K  (client 127.0.0.1)"
fi
echo "env: UCX_TLS=<tls> UCX_NET_DEVICES=lo; $reps pairs per size, interleaved; MiB/s"
if [ "$cpus" = none ]; then echo "cpus: unbound"
else echo "cpus: sender on $cs, receiver on $cr (ours: --cpus $cs,$cr; perftest: client -c $cs, server -c $cr)"; fi
echo "noise: a run is rerun (up to $tries tries) if other processes took > $max_other of those CPUs"
for tls in $tls_list; do
    for r in $(seq "$reps"); do
        for m in $sizes_mib; do
            s=$((m * 1048576)); n=$((total / s)); [ $n -lt 5 ] && n=5; w=$(((n + 9) / 10))
            if [ $((r % 2)) -eq 1 ]; then
                measure ours $tls $s $n $w 3>>"$tmp/noise" >"$tmp/o"
                measure perftest $tls $s $n $w 3>>"$tmp/noise" >"$tmp/p"
            else
                measure perftest $tls $s $n $w 3>>"$tmp/noise" >"$tmp/p"
                measure ours $tls $s $n $w 3>>"$tmp/noise" >"$tmp/o"
            fi
            o=$(cat "$tmp/o"); p=$(cat "$tmp/p")
            echo "${o:-0} ${p:-0}" >>"$tmp/$tls.$m"
            [ -n "$out" ] && echo "$tls $m ${o:-0} ${p:-0}" >>"$out"
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
        fo=$(awk '$1 <= 0' "$f" | wc -l); fp=$(awk '$2 <= 0' "$f" | wc -l); nfail=$((nfail + fo + fp))
        fails=""; [ "$fo" -gt 0 ] && fails=" (ours failed $fo)"; [ "$fp" -gt 0 ] && fails="$fails (perftest failed $fp)"
        printf '%-4s %8s %6s %4s %4s %22s %22s %7s %20s%s\n' "$tls" "$m" "$n" "$w" "$reps" \
            "$om [$omin-$omax]" "$pm [$pmin-$pmax]" "$ratio" "$rm [$rmin-$rmax]" \
            "$fails"
    done
done
touch "$tmp/noise"
echo "reruns for noise: $(grep -c retry "$tmp/noise"); kept noisy: $(grep -c noisy "$tmp/noise")"
if [ $local_part = 1 ]; then
    echo
    sizes_b=""; for m in $sizes_mib; do sizes_b="$sizes_b $((m * 1048576))"; done
    "$BT" --local $sizes_b || { echo "transfer.sh: bench_transfer --local failed" >&2; nfail=$((nfail + 1)); }
fi
[ $nfail = 0 ] || { echo "transfer.sh: $nfail run(s) failed, left out of the figures" >&2; exit 1; }
