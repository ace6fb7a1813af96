#!/usr/bin/env bash
# Random transitions (reshard, dp up/down, migration, pools moving) executed
# across 2/4/8 processes over UCX sm and tcp: every rank builds the same graph
# (hashes compared), runs its own ops, and verifies every shard it holds.
. "$(dirname "$0")/lib.sh"
T="$B/tests/mp/mp_transition"
export UCX_NET_DEVICES=lo
for tls in sm tcp; do
    for n in 2 4 8; do
        mp_case "transition $tls $n ranks, 6 random transitions" 0 90 env UCX_TLS=$tls \
            "$SRV" -q -n "$n" -t 80 -- "$T" --seed $((n * 7 + ${#tls})) --count 6
    done
done
# An aborted run's send that its receiver never took waits there under its
# tag (run and op); the run 128 on has the same tags and must not take it
# for its own (the executor drops such messages before its first vote).
for tls in sm tcp; do
    mp_case "transition $tls: a stale message of an aborted run is not taken" 0 60 \
        env UCX_TLS=$tls NRS_MP_STALE=1 "$SRV" -q -n 2 -t 50 -- "$T" --seed 5 --count 3 --timeout 5
    mp_grep "transition $tls: the stale message was there" "a stale message of .* sent to rank"
done
# The whole job SIGSTOPped mid-transition (a Slurm suspend) for longer than the
# executor's stall time-out (--timeout 2), rank 0 with a receive waiting for a
# stopped sender, then resumed: no peer failed, every transition must commit
# and verify (before: rank 0 failed at once, "no transfer completed for 2.0 s").
for tls in sm tcp; do
    mp_case "transition $tls 3 ranks: all SIGSTOPped mid-transition for 4 s, resumed" 0 60 \
        env UCX_TLS=$tls "$SRV" -q -n 3 -t 50 -- "$T" --seed 1 --count 3 --timeout 2 --suspend 4
    mp_grep "transition $tls: the job was stopped mid-transition" "every rank SIGSTOPped mid-transition"
done
# Under a cap that forces host staging: transfers from host buffers are
# received from the rank of the GPU that staged them (seed 6's first
# transition on 4 ranks stages two buffers).
mp_case "transition sm 4 ranks, staged through host memory" 0 90 env UCX_TLS=sm \
    "$SRV" -q -n 4 -t 80 -- "$T" --tight --seed 6 --count 6
mp_grep "transition: staged and verified" "transition 1: .*, [1-9][0-9]* staged, "
# The check must bite: one byte flipped on arrival at rank 1 fails the run.
mp_case "transition: a corrupted byte is caught" 1 60 env UCX_TLS=sm NRS_MP_CORRUPT=1 \
    "$SRV" -q -n 2 -t 50 --kill-on-fail 2 -- "$T" --seed 3 --count 4
mp_grep "transition: the mismatch is reported" "checksum mismatch"
# runtime.verify: the executor checksums every transfer. Clean runs commit;
# a byte flipped on the wire makes every rank abort, old state intact (without
# --verify the same byte goes through unseen and only the test's own check
# after the commit catches it).
for tls in sm tcp; do
    mp_case "transition --verify $tls 4 ranks, 6 random transitions" 0 90 env UCX_TLS=$tls \
        "$SRV" -q -n 4 -t 80 -- "$T" --verify --seed 41 --count 6
    got=$(grep -c "shard(s) verified, [1-9][0-9]* bytes hashed" "$mp_out")
    [ "$got" -eq 4 ] && { echo "[       OK ] transition --verify $tls: 4 of 4 ranks hashed what they moved"; mp_pass=$((mp_pass + 1)); } \
        || { echo "[  FAILED  ] transition --verify $tls: $got of 4 ranks hashed anything"; mp_fail=$((mp_fail + 1)); }
done
mp_case "transition --verify: a byte flipped on the wire aborts every rank" 3 60 env UCX_TLS=sm \
    NRS_MP_CORRUPT_WIRE=1:0 "$SRV" -q -n 2 -t 50 -- "$T" --verify --seed 3 --count 4
got=$(grep -c "aborted, old state intact .*checksum mismatch: the bytes received differ" "$mp_out")
[ "$got" -eq 2 ] && { echo "[       OK ] transition --verify: 2 of 2 ranks aborted on the mismatch, old state intact"; mp_pass=$((mp_pass + 1)); } \
    || { echo "[  FAILED  ] transition --verify: $got of 2 ranks aborted on the mismatch"; mp_fail=$((mp_fail + 1)); }
# Past the point of no return (a memory cap puts transfers after the first
# free; seed 13's third transition has them): the done vote sees the mismatch
# on both ranks and the census counts what transfers wrote as not held.
mp_case "transition --verify: a byte flipped past the PONR fails the run" 1 60 env UCX_TLS=sm \
    NRS_MP_CORRUPT_WIRE=1:20 "$SRV" -q -n 2 -t 50 -- "$T" --verify --cap 70000 --seed 13 --count 6
got=$(grep -c "done vote: checksum mismatch: .*; past the point of no return: new state .* [1-9][0-9]* lost (" "$mp_out")
[ "$got" -eq 2 ] && { echo "[       OK ] transition --verify: 2 of 2 ranks report the mismatch past the PONR and the census"; mp_pass=$((mp_pass + 1)); } \
    || { echo "[  FAILED  ] transition --verify past the PONR: $got of 2 ranks reported it"; mp_fail=$((mp_fail + 1)); }
mp_case "transition without --verify: the flipped byte is committed" 1 60 env UCX_TLS=sm \
    NRS_MP_CORRUPT_WIRE=1:0 "$SRV" -q -n 2 -t 50 --kill-on-fail 2 -- "$T" --seed 3 --count 4
mp_grep "transition without --verify: only the test's own check finds it" "checksum mismatch"
# A rank SIGKILLed mid-transition: the server notifies its death (PMIx event),
# every survivor hears of it, and all abort with their old state intact; the
# votes' fences must not hang on ranks that learned of the death at
# different times.
mp_case "transition sm 4 ranks: rank 1 SIGKILLed mid-transition" 137 60 env UCX_TLS=sm \
    NRS_MP_KILL=1:5 "$SRV" -n 4 -t 50 -- "$T" --seed 31 --count 6
got=$(grep -c "aborted, old state intact" "$mp_out")
heard=$(grep -c "rdv: rank 1 reported failed by the resource manager" "$mp_out")
late=$(grep -c "timed out" "$mp_out")
if [ "$got" -eq 3 ] && [ "$heard" -eq 3 ] && [ "$late" -eq 0 ]; then
    echo "[       OK ] transition: 3 survivors heard of the death and aborted intact, no fence timed out"
    mp_pass=$((mp_pass + 1))
else
    echo "[  FAILED  ] transition kill: $got of 3 aborted intact, $heard heard of it, $late time-out(s)"
    mp_fail=$((mp_fail + 1))
fi
mp_done
