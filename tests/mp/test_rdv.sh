#!/usr/bin/env bash
# PMIx rendezvous: 2/4/8 ranks over several epochs, singleton, a rank that never joins.
. "$(dirname "$0")/lib.sh"
R="$B/tests/mp/mp_rdv"
for n in 2 4 8; do
    mp_case "rdv $n ranks, 3 epochs" 0 60 "$SRV" -q -n "$n" -t 50 -- "$R" --epochs 3
done
mp_case "rdv singleton (no server)" 0 30 env -u PMIX_SERVER_URI41 -u PMIX_SERVER_URI4 -u PMIX_NAMESPACE "$R" --expect-singleton
# Rank 2 never calls PMIx: the others must say so within their 3 s time-out.
mp_case "rdv rank never joins: clear error" 3 40 "$SRV" -q -n 4 -t 30 --kill-on-fail 1 -- "$R" --nojoin 2 --timeout 3
mp_grep "rdv rank never joins: names rank 2" "rank 2 never arrived"
mp_done
