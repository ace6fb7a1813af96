#!/usr/bin/env bash
# Failures: a rank SIGKILLed mid-transfer is detected by every survivor within
# 10 s (exit 4 = detected in time, 5 = too late), the survivors verify what
# the living sent and exit cleanly; no hang (hard time-outs).
. "$(dirname "$0")/lib.sh"
X="$B/tests/mp/mp_xchg"
export UCX_NET_DEVICES=lo
stamp=$(mktemp "${TMPDIR:-/tmp}/nrs-kill.XXXXXX")
# survivors NAME N: each of the N - 1 survivors of the last case said it saw
# rank 1 die within 10 s, and exited 4 (pmix_srv --exits: the server's own
# status is the victim's 137, which hides a survivor that crashed or that the
# sanitizer failed at exit)
survivors() {
    local got ok
    got=$(grep -c "peer failure detected after .* rank 1 lost" "$mp_out")
    ok=$(grep -c "pmix_srv: rank [0-9]* ended: exit 4$" "$mp_out")
    if [ "$got" -eq $(($2 - 1)) ] && [ "$ok" -eq $(($2 - 1)) ]; then
        mp_ok "$1: $got survivor(s) detected it within 10 s and exited 4"
    else
        mp_ko "$1" "$got of $(($2 - 1)) survivor(s) detected it in time, $ok exited 4"
    fi
}
for tls in sm tcp; do
    for n in 2 4; do
        rm -f "$stamp"
        # the server's status is the victim's (137); each survivor must say so
        mp_case "fail $tls $n ranks: rank 1 SIGKILLed mid-transfer" 137 60 env UCX_TLS=$tls \
            NRS_MP_KILL_STAMP="$stamp" "$SRV" --exits -n "$n" -t 50 -- "$X" --epochs 2 \
            --bytes $((32 * 1048576)) --chunk 1048576 --kill 1 --timeout 15
        survivors "fail $tls $n ranks" "$n"
    done
done
# Without the resource manager's word (pmix_srv --no-notify) each survivor
# sees the death itself: by the pid watch (peers of this host, sm), by UCX's
# peer-failure handling (NRS_UCX_ERRMODE=peer, tcp: what peers on other
# hosts get).
for v in "sm auto" "tcp peer"; do
    set -- $v
    rm -f "$stamp"
    mp_case "fail $1 4 ranks, errmode $2, no word from the resource manager" 137 60 \
        env UCX_TLS=$1 NRS_UCX_ERRMODE=$2 NRS_MP_KILL_STAMP="$stamp" "$SRV" --exits --no-notify -n 4 \
        -t 50 -- "$X" --epochs 2 --bytes $((32 * 1048576)) --chunk 1048576 --kill 1 --timeout 15
    survivors "fail $1 errmode $2, no notice" 4
    mp_grep "fail $1 errmode $2: the transport saw it" \
        "rank 1\( failed (\| tag [0-9]*: \)\(Connection reset\|Endpoint timeout\)"
    ! grep -q "reported by the resource manager" "$mp_out" ||
        mp_ko "fail $1 errmode $2" "the resource manager spoke"
done
rm -f "$stamp"
# The whole job SIGSTOPped mid-transfer (a Slurm suspend) for longer than the
# stall time-out, then resumed (rank 0 first, the others 0.2 s later): no
# peer failed, so nothing may fail: time a rank spent stopped is not time its
# peers failed to answer (before: every op still waiting failed at the first
# poll after the resume, "no progress for 1.0 s").
for tls in sm tcp; do
    mp_case "suspend $tls 3 ranks: all SIGSTOPped mid-transfer for 3 s (op time-out 1 s), resumed" \
        0 60 env UCX_TLS=$tls "$SRV" -q -n 3 -t 50 -- "$X" --bytes $((8 * 1048576)) \
        --chunk 1048576 --suspend 3 --op-timeout 1 --timeout 15
    whole=$(grep -c "epoch [12]: 3 buffer(s) of [0-9]* bytes verified" "$mp_out")
    if [ "$whole" -eq 6 ]; then mp_ok "suspend $tls: 3 of 3 ranks verified epochs 1 and 2 whole"
    else mp_ko "suspend $tls" "$whole of 6 epochs verified whole"; fi
done
# A rank SIGSTOPped mid-transfer is not dead: the others fail what involves it
# by the stall time-out (--op-timeout) and resume it; it fails what they gave
# up; all drop what is left of it (nrs_ucx_purge) and the next exchange goes
# through whole. Memory of the requests UCX could not cancel stays theirs
# (nrs_ucx_free; the sanitizer build checks).
for tls in sm tcp; do
    mp_case "stop $tls 3 ranks: rank 1 SIGSTOPped mid-transfer, then resumed" 0 60 \
        env UCX_TLS=$tls "$SRV" -q -n 3 -t 50 -- "$X" --bytes $((8 * 1048576)) \
        --chunk 1048576 --stop 1 --op-timeout 2 --timeout 15
    stalled=$(grep -c "stalled rank 1's transfers failed after" "$mp_out")
    whole=$(grep -c "epoch 2: 3 buffer(s) of [0-9]* bytes verified" "$mp_out")
    if [ "$stalled" -eq 2 ] && [ "$whole" -eq 3 ]; then
        mp_ok "stop $tls: 2 of 2 others timed it out, 3 of 3 ranks verified epoch 2"
    else
        mp_ko "stop $tls" "$stalled of 2 timed it out, $whole of 3 verified epoch 2"
    fi
done
mp_done
