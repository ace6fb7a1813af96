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
# The check must bite: one byte flipped on arrival at rank 1 fails the run.
mp_case "transition: a corrupted byte is caught" 1 60 env UCX_TLS=sm NRS_MP_CORRUPT=1 \
    "$SRV" -q -n 2 -t 50 --kill-on-fail 2 -- "$T" --seed 3 --count 4
mp_grep "transition: the mismatch is reported" "checksum mismatch"
mp_done
