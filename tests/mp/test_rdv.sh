#!/usr/bin/env bash
# PMIx rendezvous: 2/4/8 ranks over several epochs, singleton, a rank that never joins,
# a gather whose contributor died before the others read it.
. "$(dirname "$0")/lib.sh"
R="$B/tests/mp/mp_rdv"
for n in 2 4 8; do
    mp_case "rdv $n ranks, 3 epochs" 0 60 "$SRV" -q -n "$n" -t 50 -- "$R" --epochs 3
done
mp_case "rdv singleton (no server)" 0 30 env -u PMIX_SERVER_URI41 -u PMIX_SERVER_URI4 -u PMIX_NAMESPACE "$R" --expect-singleton
# Rank 2 never calls PMIx: the others must say so within their 3 s time-out.
mp_case "rdv rank never joins: clear error" 3 40 "$SRV" -q -n 4 -t 30 --kill-on-fail 1 -- "$R" --nojoin 2 --timeout 3
mp_grep "rdv rank never joins: names rank 2" "rank 2 never arrived"
# The same through the survivors' gather (the votes of runtime/worker/dtrans.c):
# its time-out names the rank and the key too (before, it said "every rank
# published its key" without asking, and "epoch 0").
mp_case "rdv gather, rank never joins: clear error" 3 40 "$SRV" -q -n 4 -t 30 --kill-on-fail 1 -- "$R" --gather --nojoin 2 --timeout 3
mp_grep "rdv gather, rank never joins: names rank 2 and the key" "rank 2 never arrived (no 'nrs.e1.gtest')"
mp_case "rdv gather 4 ranks, 3 epochs" 0 60 "$SRV" -q -n 4 -t 50 -- "$R" --gather --epochs 3
# Rank 1's second gather has no memory of its own (NRS_RDV_NOMEM=1:1: the
# fence's tracker is the handle's spare; its participants and process list
# are the handle's anyway): it still contributes, every gather pairs. It
# used to allocate them per post and return before its fence: its next
# fence paired with the others' gather.
mp_case "rdv gather 4 ranks, rank 1 without memory for a post: every gather pairs" 0 60 \
    env NRS_RDV_NOMEM=1:1 "$SRV" -q -n 4 -t 50 -- "$R" --gather --epochs 3
# Rank 2 dies after its fence; the others get its blob only once told of
# the death: what PMIx holds still comes (before, nrs_rdv_get gave up at
# once on a dead rank: an allgather failed on a rank that learned of a death
# between the fence and its gets, test_fail's "rdv: rank 1's 'nrs.e1.sums'
# unavailable: the rank died").
mp_case "rdv get of a rank that published and died" 137 40 "$SRV" -q -n 4 -t 30 --exits -- "$R" --die-after-put 2
n=$(grep -c "mp_rdv\[[013]\]: rank 2's blob read after its death" "$mp_out")
if [ "$n" -eq 3 ]; then
    echo "[       OK ] rdv get: 3 of 3 survivors read the dead rank's blob"; mp_pass=$((mp_pass + 1))
else
    echo "[  FAILED  ] rdv get: $n of 3 survivors read the dead rank's blob"; mp_fail=$((mp_fail + 1))
    grep -E "mp_rdv|pmix_srv: rank" "$mp_out" | tail -n 12 | sed 's/^/    | /'
fi
# Rank 2 dies once its survivors' fence is complete; the others read the
# gather only after PMIx told them of the death. What the fence brought
# decides, the same on every rank: all 3 find rank 2's bytes (before, each
# rank's own view of deaths left them out: a vote of runtime/worker/dtrans.c
# then went past the point of no return on some ranks and aborted on others).
mp_case "rdv gather: a rank that contributed and died is counted" 137 40 "$SRV" -q -n 4 -t 30 --exits -- "$R" --die-after-gather 2
n=$(grep -c "mp_rdv\[[013]\]: rank 2's contribution counted after its death" "$mp_out")
e=$(grep -cE "pmix_srv: rank [013] ended: exit 0$" "$mp_out")
if [ "$n" -eq 3 ] && [ "$e" -eq 3 ]; then
    echo "[       OK ] rdv gather: 3 of 3 survivors counted the dead rank's bytes and ended 0"; mp_pass=$((mp_pass + 1))
else
    echo "[  FAILED  ] rdv gather: $n of 3 survivors counted the dead rank's bytes, $e ended 0"; mp_fail=$((mp_fail + 1))
    grep -E "mp_rdv|pmix_srv: rank" "$mp_out" | tail -n 12 | sed 's/^/    | /'
fi
# The same with rank 1 dead before it put anything: the fence completes
# without it (partial) and the survivors read once told of both deaths.
# Every survivor must still find rank 2's bytes, and none rank 1's (before,
# after a partial fence a rank known dead was looked up locally only: not
# found, under PMIx's hash store, on a rank that had not asked before).
# A second gather then brings the survivors' bytes only.
mp_case "rdv gather after a partial fence: the dead contributor is counted" 137 40 "$SRV" -q -n 4 -t 30 --exits -- "$R" --die-after-gather 2 --die-before 1
n=$(grep -c "mp_rdv\[[03]\]: rank 2's contribution counted after its death" "$mp_out")
s=$(grep -c "mp_rdv\[[03]\]: second gather: the survivors' bytes only" "$mp_out")
e=$(grep -cE "pmix_srv: rank [03] ended: exit 0$" "$mp_out")
if [ "$n" -eq 2 ] && [ "$s" -eq 2 ] && [ "$e" -eq 2 ]; then
    echo "[       OK ] rdv gather, partial fence: 2 of 2 survivors counted rank 2, not rank 1, and ended 0"; mp_pass=$((mp_pass + 1))
else
    echo "[  FAILED  ] rdv gather, partial fence: $n of 2 survivors counted rank 2 (and not rank 1), $s had the survivors only in the next gather, $e ended 0"; mp_fail=$((mp_fail + 1))
    grep -E "mp_rdv|pmix_srv: rank" "$mp_out" | tail -n 12 | sed 's/^/    | /'
fi
mp_done
