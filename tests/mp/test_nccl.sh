#!/usr/bin/env bash
# NCCL transport and CUDA memory on real GPUs; "skipped: no GPU" elsewhere
# (counted as skipped, never as passed). Every command runs under a time-out
# (lib.sh's mp_case), so a hang costs at most its limit; about 15-30 s in all
# on one H200 (most of it CUDA and NCCL start-up, three times). GPUs: those
# CUDA_VISIBLE_DEVICES leaves visible; with two or more, one rank per GPU.
. "$(dirname "$0")/lib.sh"
N="$B/tests/mp/mp_nccl"
# NCCL's own reason for a failure lands in the case's log. One host: lib.sh
# keeps NCCL on loopback sockets (NCCL_SOCKET_IFNAME=lo, NCCL_IB_DISABLE=1:
# a VM's only other interface, or an IB card, may lead nowhere).
export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"
probe=$(timeout -k 5 60 "$N" --count 2>&1); prc=$?
if [ "$prc" -eq 77 ]; then
    echo "$probe"
    mp_skip "nccl" "$(echo "$probe" | head -1)"
    mp_done
fi
echo "$probe"
if [ "$prc" -ne 0 ]; then
    echo "[  FAILED  ] nccl: '$N --count' exited $prc"; mp_fail=$((mp_fail + 1)); mp_done
fi
ngpu=$(echo "$probe" | sed -n 's/^\([0-9][0-9]*\) GPU(s).*/\1/p' | head -1)
mp_case "nccl 1 rank: 64 MiB+3 to itself in 4 MiB chunks, then on a split child" 0 90 "$N"
mp_grep "nccl 1 rank: world bytes verified" "mp_nccl\[0/1\]: world: 67108867 bytes from rank 0 verified"
mp_grep "nccl 1 rank: split bytes verified" "mp_nccl\[0/1\]: split: 67108867 bytes from rank 0 verified"
# NCCL refuses a lone receive from self (ncclInvalidUsage); either way the
# communicator must be aborted and the call return, well before the limit.
mp_case "nccl 1 rank: a receive nobody sends fails (refused or 3 s deadline), aborted" 0 45 \
    "$N" --lone-recv
mp_grep "nccl 1 rank: lone receive aborted" "lone receive failed in"
if [ "${ngpu:-0}" -ge 2 ]; then
    mp_case "nccl $ngpu ranks: ring, split halves, then shrink" 0 180 \
        "$SRV" -q -n "$ngpu" -t 170 -- "$N"
    mp_grep "nccl $ngpu ranks: rank 0 verified all three" "mp_nccl\[0/$((ngpu - 1))\]: shrunk: "
else
    # NCCL refuses two ranks on one GPU of one host; NCCL_HOSTID (NCCL's
    # host hash) makes each rank a host of its own, so 3 ranks share the GPU
    # over NCCL's socket transport on lo: ring, split, shrink across ranks.
    # shellcheck disable=SC2016 # expanded by the rank's shell
    mp_case "nccl 3 ranks on one GPU (a host each: NCCL_HOSTID): ring, split halves, then shrink" \
        0 170 "$SRV" -q -n 3 -t 160 -- bash -c 'NCCL_HOSTID="nrs-h$PMIX_RANK" exec "$0" --bytes 16777219' "$N"
    got=$(grep -c "mp_nccl\[[0-9]*/2\]: shrunk: 16777219 bytes from rank [0-9]* verified" "$mp_out")
    if [ "$got" -eq 2 ]; then
        echo "[       OK ] nccl 3 ranks on one GPU: 2 survivors verified the shrunk ring"; mp_pass=$((mp_pass + 1))
    else
        echo "[  FAILED  ] nccl 3 ranks on one GPU: $got of 2 survivor(s) verified the shrunk ring"; mp_fail=$((mp_fail + 1))
    fi
fi
mp_done
