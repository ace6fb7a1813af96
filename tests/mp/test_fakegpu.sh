#!/usr/bin/env bash
# The GPU code paths' host side, on CPUs: runtime/xfer/nccl.c and the NCCL
# transport (runtime/xfer/xport_nccl.c) against tests/fakegpu, a TEST DOUBLE
# of the CUDA runtime and NCCL (LD_PRELOADed in front of the real ones):
# device memory is host memory, NCCL messages cross processes over unix
# sockets. It proves the control flow and the bytes (ordering, grouping,
# staging, splits, shrinks, aborts), nothing about a GPU; test_nccl.sh and
# bench/gpu/device-check.sh are the GPU tests.
. "$(dirname "$0")/lib.sh"
FAKE="$B/tests/fakegpu/.libs/libfakegpu.so"
N="$B/tests/mp/mp_nccl"
T="$B/tests/mp/mp_transition"
W="$B/tests/mp/mp_worker"
S="${NRS_SRCDIR:-$(cd "$(dirname "$0")/../.." && pwd)}"
[ -e "$FAKE" ] || { echo "[  FAILED  ] fake GPU: $FAKE not built"; mp_fail=1; mp_done; }
export UCX_NET_DEVICES=lo UCX_TLS=sm
# Sanitizer builds: the preloaded fake comes before ASan's runtime, on purpose.
export ASAN_OPTIONS="${ASAN_OPTIONS}:verify_asan_link_order=0"
fake="LD_PRELOAD=$FAKE" # mp_case runs commands, not shell functions: env "$fake" CMD
# Every process that exits by itself must have freed its device memory and
# ended (destroyed or aborted) its communicators, error paths included.
export FAKE_LEAKS=1
mp_case "fake GPU: nccl 1 rank, world and split" 0 60 env "$fake" "$N"
mp_grep "fake GPU: nccl 1 rank: split bytes verified" "mp_nccl\[0/1\]: split: 67108867 bytes from rank 0 verified"
mp_case "fake GPU: nccl 1 rank, a lone receive ends in an abort" 0 60 env "$fake" "$N" --lone-recv
# A driver older than the CUDA runtime: the GPU is there, the message says
# why it cannot be used (a device check must not read as "no GPU" alone).
mp_case "fake GPU: a driver too old for CUDA 13 skips, and says so" 77 30 env "$fake" \
    FAKE_DRIVER=12040 "$N" --count
mp_grep "fake GPU: old driver: versions named" \
    "skipped: no GPU: .*: the driver supports CUDA 12.4, this CUDA runtime needs 13.0"
for n in 2 4; do
    mp_case "fake GPU: nccl $n ranks: ring, split halves, shrink" 0 120 env "$fake" FAKE_GPUS="$n" \
        "$SRV" -q -n "$n" -t 110 -- "$N" --bytes 1048579
    got=$(grep -c "mp_nccl\[[0-9]*/$((n - 1))\]: shrunk: 1048579 bytes from rank [0-9]* verified" "$mp_out")
    [ "$got" -eq $((n - 1)) ] && { echo "[       OK ] fake GPU: nccl $n ranks: $got survivor(s) verified the shrunk ring"; mp_pass=$((mp_pass + 1)); } \
        || { echo "[  FAILED  ] fake GPU: nccl $n ranks: $got of $((n - 1)) survivor(s) verified the shrunk ring"; mp_fail=$((mp_fail + 1)); }
done
# NCCL older than 2.27 (a GPU machine's own library, found at run time) has
# no ncclCommShrink: the shrink must be refused with the reason, not end the
# process at the call ("undefined symbol", as the double does then).
mp_case "fake GPU: NCCL 2.26 loaded: the shrink is refused, no crash" 1 60 env "$fake" FAKE_GPUS=2 \
    FAKE_NCCL_VERSION=22600 "$SRV" -q -n 2 -t 50 -- "$N" --bytes 4099
mp_grep "fake GPU: NCCL 2.26: the reason is given" "ncclCommShrink needs NCCL 2.27, NCCL 22600 is loaded"
for n in 2 4 8; do
    mp_case "fake GPU: transitions over NCCL, $n ranks, 6 random" 0 150 env "$fake" FAKE_NCCL_STRICT=1 \
        "$SRV" -q -n "$n" -t 140 -- "$T" --nccl --seed $((n * 7 + 3)) --count 6
    mp_grep "fake GPU: $n ranks moved their shards over nccl" "6 transition(s) over nccl"
done
# CUDA refuses a 2-D copy whose pitch is over the device's maximum (2^31 - 1
# on an H200), even of one row: a contiguous region (here: 72 and 256 bytes,
# the strided ones' pitches are at most 22) must move as a 1-D copy.
mp_case "fake GPU: over NCCL, contiguous copies are 1-D (maximum pitch 32)" 0 60 env "$fake" \
    FAKE_MAX_PITCH=32 FAKE_NCCL_STRICT=1 "$SRV" -q -n 2 -t 50 -- "$T" --nccl --seed 17 --count 6
mp_grep "fake GPU: small maximum pitch: 2 ranks moved their shards" "6 transition(s) over nccl"
mp_case "fake GPU: over NCCL, a corrupted byte is caught" 1 60 env "$fake" NRS_MP_CORRUPT=1 \
    "$SRV" -q -n 2 -t 50 --kill-on-fail 2 -- "$T" --nccl --seed 3 --count 4
mp_grep "fake GPU: the mismatch is reported" "checksum mismatch"
stamp=$(mktemp "${TMPDIR:-/tmp}/nrs-fkill.XXXXXX")
rm -f "$stamp"
mp_case "fake GPU: over NCCL, rank 1 SIGKILLed mid-transition" 137 60 env "$fake" NRS_MP_KILL=1:5 \
    NRS_MP_KILL_STAMP="$stamp" "$SRV" -n 4 -t 50 -- "$T" --nccl --seed 31 --count 6
got=$(grep -c "aborted, old state intact" "$mp_out")
late=$(grep -c "no transfer completed for" "$mp_out")
if [ "$got" -eq 3 ] && [ "$late" -eq 0 ]; then
    mp_ok "fake GPU: 3 survivors aborted with their old state intact, none by the stall time-out"
else
    mp_ko "fake GPU" "$got of 3 survivor(s) aborted intact, $late by the stall time-out"
fi
rm -f "$stamp"
# The NCCL transport's own rules (FAKE_NCCL_STRICT): one transfer per peer and
# direction per group, connections made first, both ways.
mp_case "fake GPU: the strict double refuses a one-way first group" 1 60 env "$fake" FAKE_NCCL_STRICT=1 \
    FAKE_GPUS=3 "$SRV" -q -n 3 -t 50 -- "$N" --bytes 4096
mp_grep "fake GPU: strict: the ring's first groups are one-way" "NCCL would set up the connection mid-transfer"
# Rounds (a peer's distance): NCCL runs more than 8 of them in one group
# batch after batch, so the transport bounds a group's rounds (8; beyond 9
# ranks only). The fan-out (tp 1 on rank 0 to tp 8 and back) with the bound
# and the double's limit both at 2: every group within it; without the
# bound the double refuses a group (both count rounds alike).
mp_case "fake GPU: fan-out over NCCL, groups of at most 2 rounds" 0 60 env "$fake" FAKE_NCCL_STRICT=1 \
    FAKE_NCCL_ROUNDS=2 NRS_NCCL_GROUP_ROUNDS=2 "$SRV" -q -n 8 -t 50 -- "$T" --nccl --fan --count 4
mp_grep "fake GPU: fan-out: 8 ranks moved their shards" "4 transition(s) over nccl"
mp_case "fake GPU: fan-out over NCCL without the bound: the double refuses a group" 1 60 env "$fake" \
    FAKE_NCCL_STRICT=1 FAKE_NCCL_ROUNDS=2 NRS_NCCL_GROUP_ROUNDS=0 "$SRV" -q -n 8 -t 50 --kill-on-fail 2 \
    -- "$T" --nccl --fan --count 4
mp_grep "fake GPU: fan-out without the bound: too many rounds" "rounds (more than 2)"
# Device memory: each rank's GPU may hold no more than the schedule's peak
# for it, its state plus the transfer reserve (two chunks: one strided send
# and one strided receive in flight, docs/transitions.md "Memory");
# --mem-check makes that the fake's FAKE_MEM_CAP. Small chunks make many
# strided transfers: the fan-out's column slices, and random reshards. The
# NCCL transport packs them through its two staging buffers of a chunk
# (its old pool gave each post in flight a buffer: up to 3.6 chunks more).
mp_case "fake GPU: over NCCL, device memory within state + reserve: fan-out, 8 ranks" 0 60 \
    env "$fake" FAKE_NCCL_STRICT=1 "$SRV" -q -n 8 -t 50 -- "$T" --nccl --fan --count 4 \
    --chunk 1024 --timeout 10 --mem-check
mp_grep "fake GPU: fan-out within the reserve: 8 ranks moved their shards" "4 transition(s) over nccl"
mp_grep "fake GPU: fan-out within the reserve: rank 0 sent strided transfers" \
    "mp_transition\[0\]: transition 1: device peak .* [1-9][0-9]* strided transfer"
mp_case "fake GPU: over NCCL, device memory within state + reserve: 4 ranks, 6 random" 0 60 \
    env "$fake" FAKE_NCCL_STRICT=1 "$SRV" -q -n 4 -t 50 -- "$T" --nccl --seed 7 --count 6 \
    --chunk 1024 --timeout 10 --mem-check
mp_grep "fake GPU: random within the reserve: 4 ranks moved their shards" "6 transition(s) over nccl"
# Under the smallest caps that stage nothing (--snug), the scheduler frees an
# old buffer just as the allocation after it needs the room; the transport
# defers a free while transfers are posted (cudaFree would wait for them),
# so the allocation must wait for that free (it held up to a chunk more).
for n in 4 8; do
    mp_case "fake GPU: over NCCL, snug caps: deferred frees done before allocations, $n ranks" 0 60 \
        env "$fake" FAKE_NCCL_STRICT=1 "$SRV" -q -n "$n" -t 50 -- "$T" --nccl --seed $((n * 13 + 7)) \
        --count 6 --chunk 1024 --timeout 10 --mem-check --snug
    mp_grep "fake GPU: snug caps: $n ranks moved their shards" "6 transition(s) over nccl"
done
# The worker API with its state in (fake) GPU memory: transitions over NCCL.
# The first is a re-tune (micro-batches only: nothing moves): it sets up no
# communicator and copies nothing (it used to set up the job's NCCL
# communicator, the later ones then over it).
mp_case "fake GPU: worker 4 ranks, state on the GPU, a re-tune then 3 transitions over NCCL" 0 120 \
    env "$fake" FAKE_NCCL_STRICT=1 NRS_WORKER_TIMEOUT=15 "$SRV" -q -n 4 -t 110 -- "$W" --seed 15 --count 4 \
    --retune 1
got=$(grep -c "4 transition(s) committed, every shard verified" "$mp_out")
nccl=$(grep -c "transitions of GPU state over NCCL (4 ranks)" "$mp_out")
if [ "$got" -eq 4 ] && [ "$nccl" -eq 4 ] && ! grep -q "stages through host memory" "$mp_out"; then
    echo "[       OK ] fake GPU: worker: 4 of 4 ranks verified every shard, all over NCCL"; mp_pass=$((mp_pass + 1))
else
    echo "[  FAILED  ] fake GPU: worker: $got of 4 ranks verified, $nccl over NCCL"; mp_fail=$((mp_fail + 1))
fi
rt=$(grep -c "re-tune: 0 communicator(s) made, 0 copies" "$mp_out")
[ "$rt" -eq 4 ] && { echo "[       OK ] fake GPU: worker: the re-tune made no communicator and copied nothing on 4 of 4 ranks"; mp_pass=$((mp_pass + 1)); } ||
    { echo "[  FAILED  ] fake GPU: worker: the re-tune made no communicator and copied nothing on $rt of 4 ranks"; mp_fail=$((mp_fail + 1))
      grep "re-tune" "$mp_out" | sed 's/^/    | /'; }
# The same through the controller's PLAN/PREPARE/COMMIT (tests/mp/mp_wkctl,
# one rank, its state on the GPU, UCX as it would be in a job): it used to
# run the executor's votes (4 GATHERs) and copy every buffer to the host and
# back (232 copies).
for nccl in 1 0; do
    mp_case "fake GPU: a re-tune through the controller (NRS_WORKER_NCCL=$nccl): no communicator, no copy" \
        0 60 env "$fake" NRS_WORKER_XPORT=ucx NRS_WORKER_NCCL=$nccl "$B/tests/mp/mp_wkctl" \
        "$S/examples/tiny-cpu.yaml" retune 0
    mp_grep "fake GPU: re-tune through the controller (NRS_WORKER_NCCL=$nccl): on the GPU, nothing done" \
        "state on the GPU"
done
# libnereus runs in a framework's threads: a call that works on its GPU (0
# here) must make the caller's current device (1) current again before it
# returns, on every path: over NCCL, staging through host copies, aborted
# by a peer's death; the library's own calls (mp_nccl: copies, transfers,
# split, shrink, a failing exchange) alike.
mp_case "fake GPU: worker over NCCL on GPU 0: the caller's device 1 current after every call" 0 120 \
    env "$fake" FAKE_GPUS=2 NRS_CUDA_DEVICE=0 FAKE_NCCL_STRICT=1 NRS_WORKER_TIMEOUT=15 "$SRV" -q \
    -n 4 -t 110 -- "$W" --seed 15 --count 4 --caller-device 1
got=$(grep -c "4 transition(s) committed, every shard verified" "$mp_out")
nccl=$(grep -c "transitions of GPU state over NCCL (4 ranks)" "$mp_out")
kept=$(grep -c "the caller's CUDA device 1 kept across" "$mp_out")
[ "$got" -eq 4 ] && [ "$nccl" -eq 4 ] && [ "$kept" -eq 4 ] && { echo "[       OK ] fake GPU: worker: 4 of 4 ranks kept the caller's device, over NCCL"; mp_pass=$((mp_pass + 1)); } \
    || { echo "[  FAILED  ] fake GPU: worker, caller's device: $kept of 4 kept it, $got verified, $nccl over NCCL"; mp_fail=$((mp_fail + 1)); }
mp_case "fake GPU: worker staging through host copies: the caller's device current after every call" \
    0 120 env "$fake" FAKE_GPUS=2 NRS_CUDA_DEVICE=0 NRS_WORKER_NCCL=0 NRS_WORKER_TIMEOUT=15 "$SRV" \
    -q -n 4 -t 110 -- "$W" --seed 15 --count 4 --caller-device 1
mp_grep "fake GPU: worker staging: the caller's device kept" "the caller's CUDA device 1 kept across"
mp_case "fake GPU: worker over NCCL, rank 1 killed: the survivors keep the caller's device" 137 60 \
    env "$fake" FAKE_GPUS=2 NRS_CUDA_DEVICE=0 "$SRV" -n 4 -t 50 -- "$W" --seed 15 --count 3 \
    --kill 1 --caller-device 1
got=$(grep -c "aborted after .* old state intact" "$mp_out")
kept=$(grep -c "the caller's CUDA device 1 kept across" "$mp_out")
[ "$got" -eq 3 ] && [ "$kept" -eq 3 ] && { echo "[       OK ] fake GPU: worker: 3 survivors aborted and kept the caller's device"; mp_pass=$((mp_pass + 1)); } \
    || { echo "[  FAILED  ] fake GPU: worker kill, caller's device: $kept of 3 kept it, $got aborted intact"; mp_fail=$((mp_fail + 1)); }
mp_case "fake GPU: nccl 2 ranks on GPUs 0 and 1: the caller's device 2 current after every call" 0 60 \
    env "$fake" FAKE_GPUS=3 "$SRV" -q -n 2 -t 50 -- "$N" --bytes 4099 --caller-device 2
mp_grep "fake GPU: nccl: rank 1 kept the caller's device" "mp_nccl\[1\]: the caller's CUDA device 2 kept"
mp_case "fake GPU: nccl, a failing exchange: the caller's device current again" 0 60 env "$fake" \
    FAKE_GPUS=2 "$N" --lone-recv --caller-device 1
mp_grep "fake GPU: nccl lone receive: the caller's device kept" "mp_nccl\[0\]: the caller's CUDA device 1 kept"
# A thread that never used CUDA (device 0, no context there): the worker on
# GPU 1 must not make a context on GPU 0 to give device 0 back (CUDA 12's
# cudaSetDevice makes one: GPU memory, in every rank of a node).
mp_case "fake GPU: worker on GPU 1, the caller never used CUDA: no context on GPU 0" 0 120 \
    env "$fake" FAKE_GPUS=2 FAKE_NO_CONTEXT=0 NRS_CUDA_DEVICE=1 NRS_WORKER_TIMEOUT=15 "$SRV" -q \
    -n 4 -t 110 -- "$W" --seed 15 --count 4
got=$(grep -c "4 transition(s) committed, every shard verified" "$mp_out")
nccl=$(grep -c "transitions of GPU state over NCCL (4 ranks)" "$mp_out")
[ "$got" -eq 4 ] && [ "$nccl" -eq 4 ] && { echo "[       OK ] fake GPU: worker on GPU 1: no context on GPU 0, 4 of 4 verified over NCCL"; mp_pass=$((mp_pass + 1)); } \
    || { echo "[  FAILED  ] fake GPU: worker on GPU 1, no context on GPU 0: $got verified, $nccl over NCCL"; mp_fail=$((mp_fail + 1)); }
# An InfiniBand card that leads nowhere (FAKE_NCCL_IB: NCCL's set-up fails
# unless NCCL_IB_DISABLE=1): the one-host tests turn IB off (lib.sh), and
# so do the GPU bench (run.sh) and the device check, unless the user says.
mp_case "fake GPU: an IB card without a fabric: the tests keep NCCL off IB" 0 120 env "$fake" \
    FAKE_NCCL_IB=1 NRS_WORKER_TIMEOUT=15 "$SRV" -q -n 4 -t 110 -- "$W" --seed 15 --count 4
got=$(grep -c "transitions of GPU state over NCCL (4 ranks)" "$mp_out")
[ "$got" -eq 4 ] && { echo "[       OK ] fake GPU: IB card: 4 of 4 ranks over NCCL all the same"; mp_pass=$((mp_pass + 1)); } \
    || { echo "[  FAILED  ] fake GPU: IB card: $got of 4 ranks over NCCL"; mp_fail=$((mp_fail + 1)); }
stub=$(mktemp -d "${TMPDIR:-/tmp}/nrs-stub.XXXXXX")
mkdir -p "$stub/bench/gpu"
printf '#!/bin/sh\necho "IB_DISABLE=$NCCL_IB_DISABLE IFNAME=$NCCL_SOCKET_IFNAME"\necho "gpu_bench: ok"\n' \
    >"$stub/bench/gpu/gpu_bench"
chmod +x "$stub/bench/gpu/gpu_bench"
mp_case "bench/gpu/run.sh: NCCL off IB, on lo, by default" 0 30 \
    env -u NCCL_IB_DISABLE -u NCCL_SOCKET_IFNAME bash "$S/bench/gpu/run.sh" "$stub"
mp_grep "bench/gpu/run.sh: the defaults reach gpu_bench" "IB_DISABLE=1 IFNAME=lo"
mp_case "bench/gpu/run.sh: the user's NCCL settings win" 0 30 \
    env NCCL_IB_DISABLE=0 NCCL_SOCKET_IFNAME=eth0 bash "$S/bench/gpu/run.sh" "$stub"
mp_grep "bench/gpu/run.sh: the user's settings reach gpu_bench" "IB_DISABLE=0 IFNAME=eth0"
rm -rf "$stub"
# bench/gpu/device-check.sh takes the newest libnccl.so.2 (ncclCommShrink:
# 2.27), by the version its banner names, else its file name's: a wheel's or
# the CUDA toolkit's is a plain libnccl.so.2 (no version in the name).
nd=$(mktemp -d "${TMPDIR:-/tmp}/nrs-nccl.XXXXXX")
mkdir -p "$nd/wheel" "$nd/sys" "$nd/named" "$nd/old9"
printf 'x\0NCCL version 2.28.9+cuda12.9\0y' >"$nd/wheel/libnccl.so.2"
printf 'x\0NCCL version 2.21.5+cuda12.4\0y' >"$nd/sys/libnccl.so.2.21.5"
ln -s libnccl.so.2.21.5 "$nd/sys/libnccl.so.2"
printf 'no banner' >"$nd/named/libnccl.so.2.27.3" # the file name's version
ln -s libnccl.so.2.27.3 "$nd/named/libnccl.so.2"
printf 'x\0NCCL version 2.9.9\0y' >"$nd/old9/libnccl.so.2" # 2.9 < 2.27
for order in "sys named wheel old9" "old9 wheel sys named" "wheel named"; do
    # shellcheck disable=SC2046 # one directory a word
    mp_case "device-check: the newest NCCL of $order" 0 30 bash "$S/bench/gpu/device-check.sh" \
        --which-nccl $(for d in $order; do echo "$nd/$d"; done)
    mp_grep "device-check: took the wheel's 2.28.9 ($order)" "took NCCL 2.28.9 in $nd/wheel\$"
done
mp_case "device-check: the newest NCCL, by file name without a banner" 0 30 \
    bash "$S/bench/gpu/device-check.sh" --which-nccl "$nd/sys" "$nd/named" "$nd/old9"
mp_grep "device-check: took 2.27.3" "took NCCL 2.27.3 in $nd/named\$"
rm -rf "$nd"
mp_case "fake GPU: worker, NCCL refused at set-up: falls back to host staging" 0 120 \
    env "$fake" FAKE_NCCL_DUPLICATE=1 NRS_WORKER_TIMEOUT=15 "$SRV" -q -n 4 -t 110 -- "$W" \
    --seed 15 --count 4
got=$(grep -c "4 transition(s) committed, every shard verified" "$mp_out")
back=$(grep -c "GPU state stages through host memory: nccl: ncclCommInitRankConfig" "$mp_out")
[ "$got" -eq 4 ] && [ "$back" -eq 4 ] && { echo "[       OK ] fake GPU: worker: every rank said why and staged, 4 of 4 verified"; mp_pass=$((mp_pass + 1)); } \
    || { echo "[  FAILED  ] fake GPU: worker fallback: $got of 4 verified, $back said why"; mp_fail=$((mp_fail + 1)); }
# Transition 2 a re-tune: staging, it used to copy every buffer of a rank
# to the host and back (rank 0 and 1 hold 84 each).
mp_case "fake GPU: worker, NRS_WORKER_NCCL=0: host staging" 0 120 \
    env "$fake" NRS_WORKER_NCCL=0 NRS_WORKER_TIMEOUT=15 "$SRV" -q -n 4 -t 110 -- "$W" \
    --seed 15 --count 4 --retune 2
got=$(grep -c "4 transition(s) committed, every shard verified" "$mp_out")
rt=$(grep -c "re-tune: 0 communicator(s) made, 0 copies" "$mp_out")
[ "$got" -eq 4 ] && [ "$rt" -eq 4 ] && ! grep -q "over NCCL" "$mp_out" && { echo "[       OK ] fake GPU: worker: NCCL off, 4 of 4 verified, the re-tune copied nothing"; mp_pass=$((mp_pass + 1)); } \
    || { echo "[  FAILED  ] fake GPU: worker, NCCL off: $got of 4 verified, $rt of 4 re-tuned without a copy"; mp_fail=$((mp_fail + 1))
         grep "re-tune" "$mp_out" | sed 's/^/    | /'; }
mp_case "fake GPU: worker, runtime.transports [ucx, local]: host staging" 0 120 \
    env "$fake" NRS_WORKER_TIMEOUT=15 "$SRV" -q -n 4 -t 110 -- "$W" \
    --seed 15 --count 4 --transports 3
got=$(grep -c "4 transition(s) committed, every shard verified" "$mp_out")
[ "$got" -eq 4 ] && ! grep -q "over NCCL" "$mp_out" && { echo "[       OK ] fake GPU: worker: the spec leaves NCCL out, 4 of 4 verified over UCX"; mp_pass=$((mp_pass + 1)); } \
    || { echo "[  FAILED  ] fake GPU: worker, spec without nccl: $got of 4 verified"; mp_fail=$((mp_fail + 1)); }
# shellcheck disable=SC2016 # expanded by the rank's shell
mp_case "fake GPU: worker, rank 2 without a GPU: every rank stages" 0 120 \
    env "$fake" NRS_WORKER_TIMEOUT=15 "$SRV" -q -n 4 -t 110 -- bash -c \
    '[ "$PMIX_RANK" = 2 ] && export FAKE_GPUS=0; exec "$0" --seed 15 --count 4' "$W"
got=$(grep -c "4 transition(s) committed, every shard verified" "$mp_out")
[ "$got" -eq 4 ] && ! grep -q "over NCCL" "$mp_out" && { echo "[       OK ] fake GPU: worker, mixed memory: host staging on every rank, 4 of 4 verified"; mp_pass=$((mp_pass + 1)); } \
    || { echo "[  FAILED  ] fake GPU: worker, mixed memory: $got of 4 verified"; mp_fail=$((mp_fail + 1)); }
# Past the point of no return over NCCL, rank 1 cannot have its first host
# copy (NRS_WORKER_NOMEM=1:hostcopy:0): NRS_ERR_NOMEM, and the new state's
# device buffers are all freed at finalize (FAKE_LEAKS). They used to leak:
# only those before the failed copy reached the handle.
mp_case "fake GPU: worker over NCCL, rank 1 without host copies past the PONR: no device memory leaks" \
    0 60 env "$fake" FAKE_NCCL_STRICT=1 NRS_WORKER_TIMEOUT=15 "$SRV" -q -n 4 -t 50 -- "$W" \
    --seed 15 --count 1 --nomem-hostcopy 1
mp_grep "fake GPU: worker: rank 1 said why" "mp_worker\[1\]: transition 1: no host copies (out of memory for host copies"
mp_case "fake GPU: worker over NCCL, rank 1 SIGKILLed before the PONR" 137 60 env "$fake" \
    "$SRV" -n 4 -t 50 -- "$W" --seed 15 --count 3 --kill 1
got=$(grep -c "aborted after .* old state intact" "$mp_out")
[ "$got" -eq 3 ] && grep -q "over NCCL" "$mp_out" && { echo "[       OK ] fake GPU: worker: 3 survivors aborted, old state intact"; mp_pass=$((mp_pass + 1)); } \
    || { echo "[  FAILED  ] fake GPU: worker kill: $got of 3 survivor(s) aborted intact"; mp_fail=$((mp_fail + 1)); }
mp_case "fake GPU: worker over NCCL, rank 2 SIGKILLed past the PONR" 137 60 env "$fake" \
    "$SRV" -n 4 -t 50 -- "$W" --seed 5 --count 2 --kill-ponr 2
got=$(grep -c "census: .* present, .* rebuildable, .* lost" "$mp_out")
[ "$got" -eq 3 ] && { echo "[       OK ] fake GPU: worker past the PONR: 3 survivors reported the census"; mp_pass=$((mp_pass + 1)); } \
    || { echo "[  FAILED  ] fake GPU: worker past the PONR: $got of 3 reported"; mp_fail=$((mp_fail + 1))
         grep -E 'mp_worker\[[0-9]+\]|pmix_srv: rank' "$mp_out" | grep -v 'layer views\|NULL checks' |
             tail -n 20 | sed 's/^/    | /'; }
mp_done
