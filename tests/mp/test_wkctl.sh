#!/usr/bin/env bash
# The worker's control-channel edges against a fake controller (tests/mp/mp_wkctl.c).
. "$(dirname "$0")/lib.sh"
K="$B/tests/mp/mp_wkctl"
SPEC="${NRS_SRCDIR:-$(cd "$(dirname "$0")/../.." && pwd)}/examples/tiny-cpu.yaml"
export UCX_TLS=sm
mp_case "worker: a PLAN mid-transition does not replace the running one" 0 60 "$K" "$SPEC" planmid
mp_grep "worker: the transition committed epoch 2, every shard verified" "epoch 2, [1-9][0-9]* verified, 0 bad"
# Time the rank spent stopped (a Slurm suspend) is not time the controller
# failed to answer: a COMMIT that comes after the resume is taken.
mp_case "worker: stopped 3 s while it waits for the COMMIT (2 s), resumed: epoch 2 commits" 0 60 \
    env NRS_WORKER_TIMEOUT=0.5 "$K" "$SPEC" suspend
mp_grep "worker: the COMMIT after the resume taken, every shard verified" \
    "suspend: control_poll 1 (ok), epoch 2, [1-9][0-9]* verified, 0 bad"
mp_case "worker: an ABORT read with its PREPARE voids it" 0 60 "$K" "$SPEC" abort
mp_case "worker: an ABORT mid-transition, its retry under the same epoch: the retry commits" 0 60 \
    env NRS_WORKER_XPORT=ucx "$K" "$SPEC" abortmid
mp_case "worker: a world whose GPU holder is gone: a clear error" 0 60 "$K" "$SPEC" world 0
mp_grep "worker: the error names the GPU" "no rank holds GPU 2 of epoch 1"
mp_case "worker: a world entry with a GPU out of range: a clear error" 0 60 "$K" "$SPEC" world 1
mp_grep "worker: the error names the entry" "rank 1's entry does not fit"
# A rank without memory for a world switch still sends its part of each
# gather, marked, and switches not (it used to return before the gather: the
# others waited for it, took it for dead, or paired it with their next one);
# a rank that reads such a mark does not switch either.
mp_case "worker: no memory for a world's first gather: its part sent all the same, marked" 0 60 \
    "$K" "$SPEC" worldmem 0
mp_grep "worker: the lengths' GATHER came, saying it cannot switch" "GATHER wlen1: first word 0xffffffff"
mp_case "worker: no memory for a world's second gather's answer: its entry sent, marked" 0 60 \
    "$K" "$SPEC" worldmem 1
mp_grep "worker: the entries' GATHER came, marked" "GATHER world1: first word 0x[0-9a-f]*, word at byte 20 3"
mp_case "worker: rank 1 cannot switch (the lengths): no rank switches, no second gather" 0 60 \
    "$K" "$SPEC" worldpeer 0
mp_case "worker: rank 1 has no memory for the entries' answer: no rank switches" 0 60 \
    "$K" "$SPEC" worldpeer 1
# A re-tune (micro-batches only: nothing moves) is decided by the
# controller's COMMIT alone: no GATHER (it used to run the executor's hash,
# ponr and done votes: 3 GATHERs, and the NCCL choice's); tests/fakegpu runs
# it with the state on the GPU (test_fakegpu.sh).
mp_case "worker: a re-tune commits on the controller's COMMIT, without a GATHER" 0 60 "$K" "$SPEC" retune 0
mp_grep "worker: the re-tune kept every buffer in place" "committed epoch 2: nothing moves (.*): the controller's commit, no vote"
# With the collectives over PMIx (they outlive the controller): one vote,
# the COMMIT, the settle.
mp_case "worker: a re-tune, collectives over PMIx: one vote, the COMMIT, the settle" 0 60 "$K" "$SPEC" retune 1
mp_grep "worker: the re-tune over PMIx kept every buffer in place" "committed epoch 2: nothing moves (.*): one vote"
mp_case "worker: every REPORT decodes as the controller's (no plan yet, a 0 s stage), bad figures refused" \
    0 30 "$K" "$SPEC" reports
mp_grep "worker: the REPORT frames all decode" "2 REPORT frame(s) decode, 0 refused"
mp_done
