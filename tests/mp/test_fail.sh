#!/usr/bin/env bash
# Failures: a rank SIGKILLed mid-transfer is detected by every survivor within
# 10 s (exit 4 = detected in time, 5 = too late), the survivors verify what
# the living sent and exit cleanly; no hang (hard time-outs).
. "$(dirname "$0")/lib.sh"
X="$B/tests/mp/mp_xchg"
export UCX_NET_DEVICES=lo
stamp=$(mktemp "${TMPDIR:-/tmp}/nrs-kill.XXXXXX")
for tls in sm tcp; do
    for n in 2 4; do
        rm -f "$stamp"
        # the server's status is the victim's (137); each survivor must say so
        mp_case "fail $tls $n ranks: rank 1 SIGKILLed mid-transfer" 137 60 env UCX_TLS=$tls \
            NRS_MP_KILL_STAMP="$stamp" "$SRV" -n "$n" -t 50 -- "$X" --epochs 2 \
            --bytes $((32 * 1048576)) --chunk 1048576 --kill 1 --timeout 15
        got=$(grep -c "peer failure detected after .* rank 1 lost" "$mp_out")
        if [ "$got" -eq $((n - 1)) ] && ! grep -q "exited with status 5" "$mp_out"; then
            echo "[       OK ] fail $tls $n ranks: $got survivor(s) detected it within 10 s"
            mp_pass=$((mp_pass + 1))
        else
            echo "[  FAILED  ] fail $tls $n ranks: $got of $((n - 1)) survivor(s) detected it in time"
            mp_fail=$((mp_fail + 1))
        fi
    done
done
rm -f "$stamp"
mp_done
