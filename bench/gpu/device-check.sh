#!/usr/bin/env bash
# Every GPU check in one short run, for a GPU machine lent for minutes: the
# NCCL tests (tests/mp/test_nccl.sh), the worker API once with its state in
# GPU memory (when DIR has tests/mp/mp_worker), and the GPU bench
# (bench/gpu/run.sh), each step under its own time-out, a log per step.
# Builds nothing.
#
#   bench/gpu/device-check.sh DIR
#   bench/gpu/device-check.sh --which-nccl [LIBDIR...]
#
# DIR: a folder made by bench/gpu/pack.sh (binaries + the libraries they
# need), or a build directory on the machine it was built on. Libraries: DIR's
# first, then NCCL found on this machine: NRS_NCCL_LIBDIR if set, else the
# newest libnccl.so.2 (ncclCommShrink needs 2.27) of Python's nvidia-nccl
# wheel, /usr/local/cuda/lib64 and the system's, else of a bounded find; the
# version is the one the library's banner names ("NCCL version 2.28.9"),
# else its real file name's (libnccl.so.2.28.9). It says which it took.
# --which-nccl: only that choice, among the LIBDIRs given (else the usual
# places): "NCCL <version> in <dir>"; exit 1 if none.
# Logs: $OUT/ when set (the device tool brings them back), else DIR/logs/.
# Exit 0 only when every step passed; a GPU that is not found is a failure
# here. Last line: "device-check: PASSED" or "device-check: FAILED: <steps>".
# Time: about a minute on one H200 (estimate); all steps together stop by
# NRS_DEVCHECK_BUDGET (540 s), and after a step times out the rest are not
# run (a wedged GPU would hang each of them in turn).
set -u
if [ "${1:-}" != --which-nccl ] && { [ $# -ne 1 ] || [ "$1" = --help ]; }; then
    awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "$0"; [ "${1:-}" = --help ]; exit
fi
R=$(cd "$(dirname "$0")/../.." && pwd)
failed="" hung=""
t_start=$(date +%s)
budget="${NRS_DEVCHECK_BUDGET:-540}" # seconds for all steps together

step() { # name limit_s cmd...: run under timeout, log, remember failures
    local name="$1" limit="$2" t0 rc left; shift 2
    t0=$(date +%s)
    left=$((budget - (t0 - t_start)))
    if [ -n "$hung" ] || [ "$left" -lt 10 ]; then # a wedged GPU would hang every step
        echo "=== $name: NOT RUN ($([ -n "$hung" ] && echo "after the time-out of$hung" || echo "no time left"))"
        failed="$failed $name(not-run)"; return 1
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    echo "=== $name (limit ${limit} s)"
    timeout -k 10 "$limit" "$@" 2>&1 | tee "$LOG/$name.log"
    rc=${PIPESTATUS[0]}
    echo "=== $name: exit $rc after $(($(date +%s) - t0)) s"
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        echo "=== $name: TIME-OUT"; hung="$hung $name"
    fi
    [ "$rc" -eq 0 ] || failed="$failed $name"
    return "$rc"
}

# The version of DIR/libnccl.so.2 ("2.28.9"), or "" when unknown: its
# banner, else its real file's name. A wheel's (nvidia-nccl-cu12) and the
# CUDA toolkit's are plain files named libnccl.so.2, without a version.
nccl_version() {
    local f v
    f=$(readlink -f "$1/libnccl.so.2") || return 0
    v=$(LC_ALL=C grep -a -o -m1 'NCCL version [0-9][0-9]*\.[0-9][0-9]*\.[0-9][0-9]*' "$f" 2>/dev/null |
        head -1 | sed 's/^NCCL version //')
    [ -n "$v" ] || v=$(basename "$f" | sed -n 's/^libnccl\.so\.\([0-9]*\.[0-9]*\.[0-9]*\)$/\1/p')
    echo "$v"
}

# Of the directories given, the one whose libnccl.so.2 is the newest (an
# older wheel of PyTorch's may come first and lack ncclCommShrink, 2.27);
# one of unknown version only when none is known. Each candidate on stderr.
newest_nccl() {
    local d v best="" bestv=""
    for d in "$@"; do
        [ -n "$d" ] && [ -e "$d/libnccl.so.2" ] || continue
        v=$(nccl_version "$d")
        echo "device-check: libnccl.so.2 in $d: NCCL ${v:-of unknown version}" >&2
        if [ -z "$best" ] || { [ -n "$v" ] && [ "$v" != "$bestv" ] &&
            [ "$(printf '%s\n%s\n' "${bestv:-0}" "$v" | sort -V | tail -1)" = "$v" ]; }; then
            best=$d bestv=$v
        fi
    done
    [ -n "$best" ] && echo "$best"
}

find_nccl() {
    local d py
    py=$(command -v python3 || true)
    [ -n "${NRS_NCCL_LIBDIR:-}" ] && [ -e "$NRS_NCCL_LIBDIR/libnccl.so.2" ] && { echo "$NRS_NCCL_LIBDIR"; return 0; }
    d=$(newest_nccl \
        $([ -n "$py" ] && timeout 30 "$py" -c 'import nvidia.nccl as m, os; print(" ".join(os.path.join(p, "lib") for p in m.__path__))' 2>/dev/null) \
        /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/lib/x86_64-linux-gnu /usr/local/lib)
    [ -n "$d" ] && { echo "$d"; return 0; }
    # shellcheck disable=SC2046 # one directory a word
    d=$(newest_nccl $(for d in $([ -n "$py" ] && timeout 30 "$py" -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null) /opt /usr; do
        timeout 60 find "$d" -name libnccl.so.2 2>/dev/null | head -20 | xargs -r -n1 dirname
    done))
    [ -n "$d" ] && echo "$d"
}

# The choice, said: "NCCL <version> in <dir>".
say_nccl() {
    echo "device-check: took NCCL $(v=$(nccl_version "$1"); echo "${v:-of unknown version}") in $1"
}

if [ "${1:-}" = --which-nccl ]; then
    shift
    if [ $# -gt 0 ]; then nccl_dir=$(newest_nccl "$@"); else nccl_dir=$(find_nccl); fi
    [ -n "$nccl_dir" ] || { echo "device-check: no libnccl.so.2 found"; exit 1; }
    say_nccl "$nccl_dir"; exit 0
fi
D=$(cd "$1" && pwd) || exit 2
LOG="${OUT:-$D/logs}"
mkdir -p "$LOG"

env_report() {
    uname -a; nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
    echo "NCCL: ${nccl_dir:-NOT FOUND}"; ls -l "${nccl_dir:-/nonexistent}"/libnccl.so* 2>&1
    echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
    echo "libcuda: $(ldconfig -p 2>/dev/null | grep -m1 'libcuda\.so\.1' || echo 'not in ldconfig')"
    local rc=0
    for b in tests/mp/mp_nccl bench/gpu/gpu_bench tests/mp/pmix_srv tests/mp/mp_worker; do
        [ -e "$D/$b" ] || continue
        f="$D/$b"; [ -f "$D/$(dirname "$b")/.libs/$(basename "$b")" ] && f="$D/$(dirname "$b")/.libs/$(basename "$b")"
        echo "--- ldd $b"; ldd "$f" || rc=1
        ldd "$f" | grep -q 'not found' && { echo "MISSING libraries for $b"; rc=1; }
    done
    [ -n "${nccl_dir:-}" ] || rc=1
    return "$rc"
}

nccl_dir=$(find_nccl) || nccl_dir=""
if [ -n "$nccl_dir" ]; then say_nccl "$nccl_dir"; else echo "device-check: no libnccl.so.2 found"; fi
export LD_LIBRARY_PATH="$D/lib:$D/.libs${nccl_dir:+:$nccl_dir}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# The driver's libcuda, where the loader would not look by itself.
if ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1'; then
    for d in /usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/lib64; do
        [ -e "$d/libcuda.so.1" ] && LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$d"
    done
fi
[ -d "$D/lib/pmix" ] && export PMIX_MCA_mca_base_component_path="$D/lib/pmix"
[ -d "$D/lib/ucx" ] && export UCX_MODULE_DIR="$D/lib/ucx"
# one host: sockets on loopback, not an IB/RoCE NIC NCCL may pick for ranks
# that NCCL_HOSTID makes hosts of their own (set NCCL_IB_DISABLE=0 to allow it)
export NCCL_DEBUG="${NCCL_DEBUG:-WARN}" NCCL_SOCKET_IFNAME="${NCCL_SOCKET_IFNAME:-lo}" NCCL_IB_DISABLE="${NCCL_IB_DISABLE:-1}"
export NRS_BUILDDIR="$D" NRS_SRCDIR="$R"

export D nccl_dir
step environment 60 bash -c "$(declare -f env_report); env_report"
step gpu-visible 45 "$D/tests/mp/mp_nccl" --count
v=$(sed -n 's/.*; NCCL \([0-9]*\) .*/\1/p' "$LOG/gpu-visible.log" 2>/dev/null | head -1)
[ -n "$v" ] && [ "$v" -lt 22700 ] && echo "=== WARNING: NCCL $v < 2.27: no ncclCommShrink"
step test_nccl 240 bash "$R/tests/mp/test_nccl.sh"
[ -f "$LOG/test_nccl.log" ] && grep -q '^skipped: no GPU' "$LOG/test_nccl.log" &&
    failed="$failed test_nccl(no-GPU)"
# The worker API (runtime/worker) keeps its state in GPU memory when it can
# (NRS_MEM_AUTO): 4 ranks, all on GPU 0, 4 random plans, every shard checked.
worker_gpu() {
    local out rc ok
    out=$(mktemp)
    env UCX_TLS=sm UCX_NET_DEVICES=lo NRS_WORKER_TIMEOUT=15 "$D/tests/mp/pmix_srv" -q -n 4 \
        -t 80 -- "$D/tests/mp/mp_worker" --seed 15 --count 4 2>&1 | tee "$out"
    rc=${PIPESTATUS[0]}
    ok=$(grep -c "transition(s) committed, every shard verified" "$out")
    echo "worker_gpu: exit $rc, $ok of 4 ranks verified"
    if grep -q "state in host memory" "$out"; then
        echo "worker_gpu: state stayed in host memory: the CUDA path did not run"; rc=1
    fi
    rm -f "$out"
    [ "$rc" -eq 0 ] && [ "$ok" -eq 4 ]
}
# One rank over UCX (NRS_WORKER_XPORT=ucx): its transitions of GPU state go
# through the NCCL transport (a communicator of one: allocations, zero-fills,
# local 2-D copies on the GPU). With 4 ranks on one GPU (worker_gpu above)
# NCCL refuses the duplicate GPU and every rank stages through host memory.
worker_nccl1() {
    local out rc
    out=$(mktemp)
    env UCX_TLS=sm UCX_NET_DEVICES=lo NRS_WORKER_XPORT=ucx NRS_WORKER_TIMEOUT=15 \
        "$D/tests/mp/pmix_srv" -q -n 1 -t 60 -- "$D/tests/mp/mp_worker" --seed 15 --count 4 \
        2>&1 | tee "$out"
    rc=${PIPESTATUS[0]}
    grep -q "transitions of GPU state over NCCL (1 ranks)" "$out" ||
        { echo "worker_nccl1: the NCCL transport was not used"; rc=1; }
    grep -q "4 transition(s) committed, every shard verified" "$out" || rc=1
    rm -f "$out"
    [ "$rc" -eq 0 ]
}
# The same 4 ranks, each a host of its own to NCCL (NCCL_HOSTID, NCCL's host
# hash: no "Duplicate GPU"), so their transitions of GPU state go over NCCL
# for real, between ranks (its socket transport on lo, all on GPU 0).
worker_nccl4() {
    local out rc ok
    out=$(mktemp)
    # shellcheck disable=SC2016 # expanded by the rank's shell
    env UCX_TLS=sm UCX_NET_DEVICES=lo NRS_WORKER_TIMEOUT=15 "$D/tests/mp/pmix_srv" -q -n 4 \
        -t 110 -- bash -c 'NCCL_HOSTID="nrs-h$PMIX_RANK" exec "$0" --seed 15 --count 4' \
        "$D/tests/mp/mp_worker" 2>&1 | tee "$out"
    rc=${PIPESTATUS[0]}
    ok=$(grep -c "4 transition(s) committed, every shard verified" "$out")
    [ "$(grep -c "transitions of GPU state over NCCL (4 ranks)" "$out")" -eq 4 ] ||
        { echo "worker_nccl4: not every rank used the NCCL transport"; rc=1; }
    echo "worker_nccl4: exit $rc, $ok of 4 ranks verified"
    rm -f "$out"
    [ "$rc" -eq 0 ] && [ "$ok" -eq 4 ]
}
if [ -x "$D/tests/mp/mp_worker" ]; then
    step worker_gpu 90 bash -c "$(declare -f worker_gpu); worker_gpu"
    step worker_nccl1 60 bash -c "$(declare -f worker_nccl1); worker_nccl1"
    step worker_nccl4 120 bash -c "$(declare -f worker_nccl4); worker_nccl4"
fi
step gpu_bench 190 bash "$R/bench/gpu/run.sh" "$D"
[ -f "$LOG/gpu_bench.log" ] && ! grep -q '^gpu_bench: ok$' "$LOG/gpu_bench.log" &&
    failed="$failed gpu_bench(no-ok-line)"

echo "device-check: $(($(date +%s) - t_start)) s in all; logs in $LOG"
if [ -z "$failed" ]; then
    echo "device-check: PASSED" | tee "$LOG/summary.log"; exit 0
fi
echo "device-check: FAILED:$failed" | tee "$LOG/summary.log"; exit 1
