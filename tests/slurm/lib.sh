# Shared by the tests/slurm drivers: they run against the local cluster of
# scripts/cluster (SLURM_CONF set by run.sh), every command under a time-out,
# and print the cmocka-style lines scripts/test counts:
#   sl_ok NAME / sl_fail NAME WHY / sl_skip NAME WHY / sl_check NAME CMD...
#   sl_run LIMIT CMD...   run CMD, output in $sl_out, exit status in $sl_rc
#   sl_done               summary lines; exit status
# and share these helpers:
#   sl_wait_until SECONDS CMD...  poll CMD every 0.25 s until it succeeds
#                         (status 0) or SECONDS have passed (status 1)
#   sl_delta_within NAME DETAIL T0 JOBDIR CTL_PATTERN [WATCHER_PATTERN [CMD...]]
#                         the job's controller got a resource delta within 2
#                         poll intervals of the resize at T0 (a $SECONDS value):
#                         CTL_PATTERN (grep) in JOBDIR/controller.log within
#                         3 s, WATCHER_PATTERN (if not empty) in watcher.log,
#                         CMD (if given) succeeds. OK line: "NAME within 2 poll
#                         intervals (N s): DETAIL"; on failure both logs' tails
#   sl_need_plugin NAME   skip NAME and exit unless plugstack.conf has Nereus
#   sl_need_bins NAME PROG...  the same unless $NRS_BUILDDIR has each PROG (sets nrs, wk)
#   sl_at_exit CMD        on exit run CMD, then remove $sl_tmp (replaces the
#                         trap set here)
#   sl_resume NODE        scontrol update NodeName=NODE State=RESUME, quietly
#   sl_job_num_nodes JOBID N  slurmctld's NumNodes of JOBID is N
#   sl_all_idle           all 4 nodes of the cluster (run.sh) idle
#   sl_granted_job        the job id of salloc's "Granted job allocation" in
#                         $sl_out
#   sl_check_slurmds      check "every slurmd still running" (cluster status)
set -u
NRS_SRCDIR="${NRS_SRCDIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}"
: "${NRS_CLUSTER_DIR:=/tmp/nereus-cluster}"
: "${SLURM_CONF:=$NRS_CLUSTER_DIR/etc/slurm.conf}"
export SLURM_CONF NRS_CLUSTER_DIR
sl_pass=0 sl_failed=0 sl_skipped=0 sl_rc=0
sl_tmp=$(mktemp -d "${TMPDIR:-/tmp}/nrs-slurm.XXXXXX")
chmod 755 "$sl_tmp" # read by slurmstepd and the tasks
sl_out="$sl_tmp/out"
: >"$sl_out"
trap 'rm -rf "$sl_tmp"' EXIT
sl_at_exit() { trap "$1; rm -rf \"\$sl_tmp\"" EXIT; }

sl_ok() { echo "[       OK ] $1"; sl_pass=$((sl_pass + 1)); }
sl_fail() {
    echo "[  FAILED  ] $1: $2"; sl_failed=$((sl_failed + 1))
    [ ! -s "$sl_out" ] || sed 's/^/    | /' "$sl_out" | tail -n 25
}
sl_skip() { echo "[ SKIPPED  ] $1: $2"; sl_skipped=$((sl_skipped + 1)); }
sl_run() { # limit cmd...: never hangs
    local limit="$1"; shift
    timeout -k 5 "$limit" "$@" >"$sl_out" 2>&1
    sl_rc=$?
    [ "$sl_rc" -ne 124 ] || echo "(time-out after $limit s: $*)" >>"$sl_out"
    return 0
}
sl_check() { # name cmd...: pass when cmd succeeds
    local name="$1"; shift
    if "$@"; then sl_ok "$name"; else sl_fail "$name" "check failed: $*"; fi
}
sl_wait_until() { # seconds cmd...
    local deadline=$((SECONDS + $1)); shift
    until "$@"; do [ $SECONDS -lt $deadline ] || return 1; sleep 0.25; done
}
sl_done() {
    [ "$sl_pass" -gt 0 ] && echo "[  PASSED  ] $sl_pass test(s)."
    [ "$sl_failed" -gt 0 ] && echo "[  FAILED  ] $sl_failed test(s), listed above"
    [ "$sl_skipped" -gt 0 ] && echo "[  SKIPPED ] $sl_skipped test(s)"
    [ "$sl_failed" -eq 0 ] || exit 1
    [ "$sl_pass" -gt 0 ] || exit 77
    exit 0
}

# Specs: a good one (the shipped tiny CPU example) and a copy with one typo,
# whose FILE:LINE:COL we know from where the typo is.
sl_good="$sl_tmp/good.yaml"
sl_bad="$sl_tmp/bad.yaml"
cp "$NRS_SRCDIR/examples/tiny-cpu.yaml" "$sl_good"
sed 's/^  gpus_per_node:/  gpus_per_nod:/' "$sl_good" >"$sl_bad"
sl_bad_where="bad.yaml:$(grep -n '^  gpus_per_nod:' "$sl_bad" | cut -d: -f1):3:"
chmod 644 "$sl_good" "$sl_bad"

sl_job_field() { # jobid field: one field of scontrol show job
    timeout 10 scontrol -o show job "$1" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$2=//p" | head -1
}
sl_wait_job_state() { # jobid state seconds
    local deadline=$((SECONDS + $3))
    while [ $SECONDS -lt $deadline ]; do
        [ "$(sl_job_field "$1" JobState)" = "$2" ] && return 0
        sleep 0.5
    done
    return 1
}
# No job record carries this name (the refused submission created none).
sl_no_job_named() {
    local jobs
    jobs=$(timeout 10 scontrol -o show jobs 2>&1) || return 1 # no answer proves nothing
    ! grep -q "JobName=$1 " <<<"$jobs"
}
sl_plugstack() { echo "$NRS_CLUSTER_DIR/etc/plugstack.conf"; }
sl_plugstack_restore() { cp "$NRS_CLUSTER_DIR/etc/plugstack.conf.nereus" "$(sl_plugstack)"; }
sl_have_plugin() { grep -q 'nereus.so' "$(sl_plugstack)" 2>/dev/null; }
sl_need_plugin() { # name
    sl_have_plugin || { sl_skip "$1" "no Nereus plugin in $(sl_plugstack)"; sl_done; }
}
# sl_need_bins NAME PROG...: skip NAME and exit unless each PROG is an
# executable of $NRS_BUILDDIR; sets nrs (the nereus CLI) and wk (nereus-worker).
sl_need_bins() {
    local name=$1 p
    shift
    nrs="${NRS_BUILDDIR:+$NRS_BUILDDIR/nereus}"
    wk="${NRS_BUILDDIR:+$NRS_BUILDDIR/nereus-worker}"
    for p in "$@"; do
        [ -n "$NRS_BUILDDIR" ] && [ -x "$NRS_BUILDDIR/$p" ] ||
            { sl_skip "$name" "no $p (set NRS_BUILDDIR)"; sl_done; }
    done
}
sl_check_slurmds() {
    sl_run 20 "$NRS_SRCDIR/scripts/cluster" status --dir "$NRS_CLUSTER_DIR"
    sl_check "every slurmd still running" test "$sl_rc" -eq 0
}
sl_resume() { timeout 10 scontrol update NodeName="$1" State=RESUME >/dev/null 2>&1; }
sl_job_num_nodes() { [ "$(sl_job_field "$1" NumNodes)" = "$2" ]; }
sl_all_idle() { [ "$(timeout 10 sinfo -h -N -o %T | grep -cx idle)" -eq 4 ]; }
sl_granted_job() { sed -n 's/.*Granted job allocation \([0-9]*\).*/\1/p' "$sl_out" | tail -1; }

# The allocation watcher polls every second (run.sh: --poll-interval 1), so a
# delta is due within 2 poll intervals; 1 s more for scontrol and the RPCs.
sl_delta_within() { # name detail t0 jobdir ctl-pattern [watcher-pattern [cmd...]]
    local name="$1 within 2 poll intervals" detail="$2" t0="$3" dir="$4" ctl="$5" wat="${6:-}" why=""
    shift $(($# < 6 ? $# : 6))
    if ! sl_wait_until 3 grep -q -- "$ctl" "$dir/controller.log" 2>/dev/null; then
        why="'$ctl' not in controller.log after 3 s"
    elif [ -n "$wat" ] && ! grep -q -- "$wat" "$dir/watcher.log" 2>/dev/null; then
        why="'$wat' not in watcher.log"
    elif [ $# -gt 0 ] && ! "$@"; then
        why="check failed: $*"
    fi
    if [ -z "$why" ]; then
        sl_ok "$name ($((SECONDS - t0)) s)${detail:+: $detail}"
        return 0
    fi
    { tail -n 5 "$dir/watcher.log"; tail -n 5 "$dir/controller.log"; } >"$sl_out" 2>&1
    sl_fail "$name" "$why"
    return 1
}
