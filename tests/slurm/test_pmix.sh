#!/usr/bin/env bash
# PMIx across the local cluster's 4 slurmd: srun --mpi=pmix launches on every
# node, and real PMIx clients rendezvous (put, fence with data, get every
# peer), with and without --nereus.
. "$(dirname "$0")/lib.sh"
cd "$sl_tmp" || exit 1
hello="${NRS_BUILDDIR:-}/tests/slurm/pmix_hello"

sl_run 40 srun -N 4 --mpi=pmix hostname
sl_check "srun -N 4 --mpi=pmix hostname: 4 tasks" test "$sl_rc" -eq 0 -a "$(grep -c . "$sl_out")" -eq 4

if [ ! -x "$hello" ]; then
    sl_skip "pmix rendezvous" "$hello not built (needs PMIx and NRS_BUILDDIR)"; sl_done
fi
sl_run 60 srun -N 4 -n 4 --mpi=pmix "$hello"
if [ "$sl_rc" -eq 0 ] && [ "$(grep -c ': 4 peers on n1,n2,n3,n4$' "$sl_out")" -eq 4 ]; then
    sl_ok "PMIx fence across 4 slurmd: every rank sees all 4"
else sl_fail "PMIx fence across 4 slurmd: every rank sees all 4" "rc=$sl_rc"; fi

if sl_have_plugin; then
    sl_run 60 srun -N 4 -n 8 --mpi=pmix --nereus=good.yaml "$hello"
    if [ "$sl_rc" -eq 0 ] && [ "$(grep -c ': 8 peers on n1,n1,n2,n2,n3,n3,n4,n4$' "$sl_out")" -eq 8 ]; then
        sl_ok "PMIx with --nereus, 8 ranks on 4 nodes"
    else sl_fail "PMIx with --nereus, 8 ranks on 4 nodes" "rc=$sl_rc"; fi
fi
sl_done
