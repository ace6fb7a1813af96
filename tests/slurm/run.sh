#!/usr/bin/env bash
# tests/slurm: start a local cluster (scripts/cluster) with the built plugin,
# run every tests/slurm/test_*.sh against it, stop it. Each test prints the
# cmocka-style "[  PASSED  ] N test(s)." / "[  FAILED  ] N test(s)" lines.
#
#   NRS_BUILDDIR=/path/to/build tests/slurm/run.sh [test_name ...]
#
#   NRS_BUILDDIR     build tree: spank/.libs/nereus.so, tests/slurm/pmix_hello
#   NRS_SPANK_SO     the plugin, if not $NRS_BUILDDIR/spank/.libs/nereus.so
#   NRS_CLUSTER_DIR  cluster directory (default /tmp/nereus-cluster-test; its
#                    ports 16917 and 17101.. differ from scripts/cluster's own
#                    defaults, so a developer's cluster may keep running)
#   NRS_CLUSTER_PORT, NRS_CLUSTER_SLURMD_PORT  slurmctld's port (16917; slurmdbd
#                    and MariaDB take the next but one and the one after) and
#                    the first slurmd's (17101)
#   NRS_SLURM_ACCOUNTING  1 (default): the cluster runs slurmdbd on MariaDB
#                    (scripts/cluster up --accounting; test_resize2 needs it);
#                    0: without, and test_resize2 skips. When the accounting
#                    packages cannot be installed the run goes on without.
# Needs root and Debian's Slurm packages (installed by scripts/setup-slurm,
# which it runs). Exit status: 0 all passed, 1 a failure, 77 skipped.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
top="$(cd "$here/../.." && pwd)"
export NRS_SRCDIR="${NRS_SRCDIR:-$top}"
export NRS_CLUSTER_DIR="${NRS_CLUSTER_DIR:-/tmp/nereus-cluster-test}"
export NRS_CLUSTER_PORT="${NRS_CLUSTER_PORT:-16917}"
export NRS_CLUSTER_SLURMD_PORT="${NRS_CLUSTER_SLURMD_PORT:-17101}"
export NRS_BUILDDIR="${NRS_BUILDDIR:-}"
so="${NRS_SPANK_SO:-${NRS_BUILDDIR:+$NRS_BUILDDIR/spank/.libs/nereus.so}}"
export SLURM_CONF="$NRS_CLUSTER_DIR/etc/slurm.conf"

skip() { echo "[  SKIPPED ] 1 test(s): tests/slurm: $*"; exit 77; }
[ "$(id -u)" -eq 0 ] || skip "needs root (the local cluster runs slurmctld/slurmd as root)"
[ -n "$so" ] && [ -f "$so" ] || { echo "tests/slurm: plugin not found (set NRS_BUILDDIR or NRS_SPANK_SO)"; echo "[  FAILED  ] 1 test(s)"; exit 1; }
acct=()
if [ "${NRS_SLURM_ACCOUNTING:-1}" != 0 ]; then
    if timeout 600 "$top/scripts/setup-slurm" --accounting; then acct=(--accounting)
    else echo "tests/slurm: slurmdbd/MariaDB not installable: running without accounting"; fi
fi
[ "${#acct[@]}" -gt 0 ] || timeout 600 "$top/scripts/setup-slurm" ||
    { echo "[  FAILED  ] 1 test(s): setup-slurm"; exit 1; }

cluster() { timeout 180 "$top/scripts/cluster" "$@" --dir "$NRS_CLUSTER_DIR"; }
cluster down >/dev/null 2>&1 # whatever a crashed run left
trap 'cluster down' EXIT
echo "==> tests/slurm: cluster in $NRS_CLUSTER_DIR, plugin $so${acct:+, with accounting}"
if ! cluster up --nodes 4 --spank "$so" --poll-interval 1 "${acct[@]}"; then
    echo "[  FAILED  ] 1 test(s): scripts/cluster up"; exit 1
fi

tests=("$@")
[ "${#tests[@]}" -gt 0 ] || tests=(cluster submit untouched pmix shrink nodefail expand controller concurrent recover join resize2 epilog hostile plugstack statedir options watcher harness suspend)
rc=0
for t in "${tests[@]}"; do
    echo "==> tests/slurm/test_$t.sh"
    out=$(mktemp "${TMPDIR:-/tmp}/nrs-slurm-out.XXXXXX")
    timeout -k 10 300 bash "$here/test_$t.sh" 2>&1 | tee "$out"
    r=${PIPESTATUS[0]}
    case "$r" in
    0|77) ;;
    124) echo "[  FAILED  ] 1 test(s): test_$t.sh timed out"; rc=1 ;;
    *) # a script that died (e.g. set -u) printed no failure of its own: count one
       grep -q '^\[  FAILED  \]' "$out" || echo "[  FAILED  ] 1 test(s): test_$t.sh exit $r"
       rc=1 ;;
    esac
    rm -f "$out"
done

trap - EXIT
cluster down
left=$(ps -eo pid=,args= | grep -F -- "$NRS_CLUSTER_DIR/" | grep -Ev 'grep|run\.sh' || true)
if [ -z "$left" ]; then echo "[  PASSED  ] 1 test(s). (cluster down left nothing running)"
else echo "[  FAILED  ] 1 test(s): still running after down:"; echo "$left"; rc=1; fi
exit $rc
