#!/usr/bin/env bash
# The worker API (include/nereus/nereus.h) across 4 and 8 processes: chains of
# random plans committed with every shard verified; a rank SIGKILLed before
# the point of no return makes every survivor abort within 10 s with its old
# state intact; one killed right after it makes every survivor report the
# census of the new state (present / rebuildable / lost). Before the chains
# every rank calls each public function with a NULL handle (refused with its
# failure value, the call named in nrs_worker_last_error(NULL)) and those
# with output pointers with NULL ones; on the first state and after every
# transition every rank takes its layer-tensor buffers apart by layer
# (nrs_worker_buffer_layer, API 5) and checks each part against the geometry
# and the pattern. No hang: hard time-outs on everything.
. "$(dirname "$0")/lib.sh"
W="$B/tests/mp/mp_worker"
export UCX_NET_DEVICES=lo NRS_WORKER_TIMEOUT=15
for tls in sm tcp; do
    for n in 4 8; do
        mp_case "worker $tls $n ranks: 4 random plans, every checksum" 0 60 env UCX_TLS=$tls \
            "$SRV" -q -n "$n" -t 50 -- "$W" --seed $((n * 3 + ${#tls})) --count 4
        got=$(grep -c "transition(s) committed, every shard verified" "$mp_out")
        [ "$got" -eq "$n" ] && { echo "[       OK ] worker $tls $n ranks: $got rank(s) verified"; mp_pass=$((mp_pass + 1)); } \
            || { echo "[  FAILED  ] worker $tls $n ranks: $got of $n rank(s) verified"; mp_fail=$((mp_fail + 1)); }
        got=$(grep -cE "NULL checks: [1-9][0-9]* calls refused a NULL handle, NULL outputs taken" "$mp_out")
        [ "$got" -eq "$n" ] && { echo "[       OK ] worker $tls $n ranks: NULL handle and NULL outputs on $got rank(s)"; mp_pass=$((mp_pass + 1)); } \
            || { echo "[  FAILED  ] worker $tls $n ranks: NULL checks passed on $got of $n rank(s)"; mp_fail=$((mp_fail + 1)); }
        # layer views (nrs_worker_buffer_layer): every rank, on the first state and after
        # each of the 4 transitions; some rank holds layer tensors and took them apart
        got=$(grep -cE "layer views \((initial state|epoch [2-5])\): [0-9]+ buffer\(s\), [0-9]+ part\(s\) tile their boxes, [0-9]+ refused" "$mp_out")
        some=$(grep -cE "layer views \(initial state\): [1-9][0-9]* buffer\(s\), [1-9][0-9]* part\(s\) tile" "$mp_out")
        [ "$got" -eq $((n * 5)) ] && [ "$some" -ge 1 ] && { echo "[       OK ] worker $tls $n ranks: layer views tile every layer buffer ($got checks, $some rank(s) with layer tensors at first)"; mp_pass=$((mp_pass + 1)); } \
            || { echo "[  FAILED  ] worker $tls $n ranks: layer views passed $got of $((n * 5)) time(s), $some rank(s) with layer tensors"; mp_fail=$((mp_fail + 1)); }
    done
done
stamp=$(mktemp "${TMPDIR:-/tmp}/nrs-wkill.XXXXXX")
for tls in sm tcp; do
    for n in 4 8; do
        rm -f "$stamp"
        mp_case "worker $tls $n ranks: rank 1 SIGKILLed before the PONR" 137 60 env UCX_TLS=$tls \
            NRS_MP_KILL_STAMP="$stamp" "$SRV" -n "$n" -t 50 -- "$W" --seed $((n + 11)) \
            --count 3 --kill 1
        got=$(grep -c "aborted after .* old state intact" "$mp_out")
        if [ "$got" -eq $((n - 1)) ] && ! grep -q "exited with status 5" "$mp_out"; then
            echo "[       OK ] worker $tls $n ranks: $got survivor(s) aborted within 10 s, old state intact"
            mp_pass=$((mp_pass + 1))
        else
            echo "[  FAILED  ] worker $tls $n ranks: $got of $((n - 1)) survivor(s) aborted in time"
            mp_fail=$((mp_fail + 1))
        fi
    done
done
rm -f "$stamp"
# runtime.transports: a job of several ranks needs ucx; one rank runs without it
mp_case "worker 2 ranks, runtime.transports [local]: init refused" 1 60 env UCX_TLS=sm \
    "$SRV" -q -n 2 -t 50 -- "$W" --seed 5 --count 1 --transports 1
mp_grep "worker: the refusal says why" "runtime.transports leaves out ucx, which a job of several ranks needs"
mp_case "worker 1 rank, runtime.transports [local]: runs" 0 60 "$SRV" -q -n 1 -t 50 -- "$W" \
    --seed 5 --count 2 --transports 1
mp_grep "worker 1 rank [local]: its transitions commit, verified" "2 transition(s) committed, every shard verified"
mp_case "worker sm 4 ranks: rank 2 SIGKILLed past the PONR" 137 60 env UCX_TLS=sm \
    "$SRV" -n 4 -t 50 -- "$W" --seed 5 --count 2 --kill-ponr 2
got=$(grep -c "census: .* present, .* rebuildable, .* lost" "$mp_out")
if [ "$got" -eq 3 ]; then
    echo "[       OK ] worker past the PONR: 3 survivor(s) reported the census"; mp_pass=$((mp_pass + 1))
else
    echo "[  FAILED  ] worker past the PONR: $got of 3 survivor(s) reported"; mp_fail=$((mp_fail + 1))
fi
mp_done
