#!/usr/bin/env bash
# The worker API's calls out of order or after a failure (tests/mp/mp_apiorder):
# a refused plan leaves the previous one current (it used to stay, half set:
# a crash); a well-formed plan whose state cannot be built is refused (it
# used to give a state of 0 buffers); after a failed init every call but
# last_error, finalize and what-the-handle-is queries says so (alloc_state
# used to crash on the missing transport); alloc_state failing half-way
# frees what it took; report_memory's near-cap flag for huge counts; a
# peer's start-up contact blob without a NUL is not read past. One process
# (a singleton) but for the contact case (2 ranks under pmix_srv).
. "$(dirname "$0")/lib.sh"
A="$B/tests/mp/mp_apiorder"
S="${NRS_SRCDIR:-$B}/examples/tiny-cpu.yaml"
unset NEREUS_SOCKET_DIR NEREUS_JOB_DIR NEREUS_CONTROLLER NRS_WORKER_XPORT
export NRS_WORKER_TIMEOUT=15
mp_case "apiorder: a refused plan (pool out of range) leaves epoch 1 current" 0 30 "$A" badplan "$S"
mp_grep "apiorder: the bad plan named" "pool 100000000 out of range"
mp_case "apiorder: an unbuildable plan (tp 3, 8 heads) is refused, no 0-buffer state" 0 30 \
    "$A" unbuildable "$S"
mp_grep "apiorder: the unbuildable plan's reason" "tp=3 does not divide heads=8"
mp_case "apiorder: after init failed (ucx, no such transport) every call refused" 0 30 \
    env NRS_WORKER_XPORT=ucx UCX_TLS=nosuchtl "$A" afterfail "$S"
mp_grep "apiorder: the refusal says why" "set_plan: nrs_worker_init failed: "
mp_case "apiorder: after init failed (no spec file) every call refused" 0 30 \
    "$A" afterfail /nonexistent/spec.yaml
mp_case "apiorder: alloc_state failing half-way frees it, the retry leaks nothing" 0 60 \
    "$A" allocfail "$S"
mp_case "apiorder: report_memory's near-cap flag for counts near 2^62" 0 30 "$A" memflags "$S"
for tls in sm tcp; do
    mp_case "apiorder: $tls: a peer's contact blob without a NUL is not read past" 0 60 \
        env UCX_TLS=$tls UCX_NET_DEVICES=lo "$SRV" -q -n 2 -t 50 -- "$A" contact "$S"
    mp_grep "apiorder: $tls: the token is the blob's" "token of 11 byte(s): 'BBBBBBBBBBB'"
done
mp_done
