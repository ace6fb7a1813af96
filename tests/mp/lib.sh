# Shared by the tests/mp drivers: run cases under the tests' PMIx server with a
# hard time-out, count them, print the lines scripts/test parses.
#   mp_case NAME WANT_RC LIMIT_S CMD...   run CMD (stdout+stderr to a log);
#                                         pass if its exit status is WANT_RC
#                                         and it finished within LIMIT_S
#   mp_grep NAME PATTERN                  the last case's output contains PATTERN
#   mp_skip NAME WHY
#   mp_done                               summary lines; exit status
set -u
B="${NRS_BUILDDIR:-$(cd "$(dirname "$0")/../.." && pwd)}"
SRV="$B/tests/mp/pmix_srv"
mp_pass=0 mp_fail=0 mp_skipped=0
mp_out=$(mktemp "${TMPDIR:-/tmp}/nrs-mp.XXXXXX")
trap 'rm -f "$mp_out"' EXIT
# Sanitizer builds: LSan must not report UCX's and PMIx's own allocations.
export LSAN_OPTIONS="${LSAN_OPTIONS:-}${LSAN_OPTIONS:+:}suppressions=${NRS_SRCDIR:-$B}/tests/mp/lsan.supp:print_suppressions=0"
# libpmix and libucx lack frame pointers: the fast unwinder would cut their
# stacks short of the functions lsan.supp names.
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1}:fast_unwind_on_malloc=0"
# The PMIx server library must not pick up a system server or old rendezvous files.
export PMIX_MCA_gds="${PMIX_MCA_gds:-hash}"
# One host: where the GPU state goes over NCCL (a build with CUDA, on a GPU
# machine: test_worker, test_e2e, ... as well as test_nccl), NCCL's sockets
# stay on loopback and its InfiniBand transport stays off: an IB card of the
# machine that leads nowhere can hang or slow NCCL's set-up. The user's
# settings win.
export NCCL_IB_DISABLE="${NCCL_IB_DISABLE:-1}" NCCL_SOCKET_IFNAME="${NCCL_SOCKET_IFNAME:-lo}"

mp_now() { date +%s.%N; }
mp_case() { # name want_rc limit cmd...
    local name="$1" want="$2" limit="$3"; shift 3
    local t0 t1 rc el
    echo "[ RUN      ] $name"
    t0=$(mp_now)
    timeout -k 5 "$limit" "$@" >"$mp_out" 2>&1
    rc=$?
    t1=$(mp_now)
    el=$(echo "$t1 - $t0" | bc)
    sed 's/^/    | /' "$mp_out" | tail -n 40
    if [ "$rc" -eq "$want" ]; then
        echo "[       OK ] $name (${el} s)"; mp_pass=$((mp_pass + 1)); return 0
    fi
    [ "$rc" -eq 124 ] && echo "    time-out after ${limit} s"
    echo "[  FAILED  ] $name: exit $rc, wanted $want (${el} s)"; mp_fail=$((mp_fail + 1)); return 1
}
mp_grep() { # name pattern: checks the last case's output
    if grep -q -- "$2" "$mp_out"; then
        echo "[       OK ] $1"; mp_pass=$((mp_pass + 1))
    else
        echo "[  FAILED  ] $1: output lacks '$2'"; mp_fail=$((mp_fail + 1))
    fi
}
mp_ok() { echo "[       OK ] $1"; mp_pass=$((mp_pass + 1)); }      # name
mp_ko() { echo "[  FAILED  ] $1: $2"; mp_fail=$((mp_fail + 1)); } # name why
mp_skip() { echo "[ SKIPPED  ] $1: $2"; mp_skipped=$((mp_skipped + 1)); }
mp_done() {
    [ "$mp_pass" -gt 0 ] && echo "[  PASSED  ] $mp_pass test(s)."
    [ "$mp_fail" -gt 0 ] && echo "[  FAILED  ] $mp_fail test(s), listed above"
    [ "$mp_skipped" -gt 0 ] && echo "[  SKIPPED ] $mp_skipped test(s)"
    [ "$mp_fail" -eq 0 ] || exit 1
    [ "$mp_pass" -gt 0 ] || exit 77
    exit 0
}
