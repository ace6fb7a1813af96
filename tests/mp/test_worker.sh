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
# and the pattern. Then runtime.verify on the weight syncs of nereus-worker:
# a byte flipped on the wire fails every sync (none commits), and without
# verify the same flip is committed; a sync or a transition that fails on one
# rank alone (also for want of memory for its votes or the census) is aborted
# by all, and the later ones commit; a re-tune (nothing moves) runs one vote
# only, and still aborts on every rank when one fails; a rank without memory
# for a checkpoint votes no. No hang: hard time-outs on everything.
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
# A transition that fails on one rank alone before its ops (its GPU state not
# copied out: NRS_WORKER_TRANS_FAIL via --fail): that rank still votes, a no.
# It used to return before the votes: the others saw it dead, its transition
# counter fell behind theirs, and the same transition tried again never
# paired up. Every rank aborts, keeps its old state, and the retry commits.
for tls in sm tcp; do
    mp_case "worker $tls 4 ranks: rank 1's first transition fails on it alone, the retry commits" 0 60 \
        env UCX_TLS=$tls "$SRV" -q -n 4 -t 50 -- "$W" --seed 7 --count 3 --fail 1
    a=$(grep -c "transition 1 failed on rank 1 alone .*: aborted everywhere, old state intact" "$mp_out")
    c=$(grep -c "3 transition(s) committed, every shard verified" "$mp_out")
    [ "$a" -eq 4 ] && [ "$c" -eq 4 ] && { echo "[       OK ] worker $tls: 4 of 4 ranks aborted with rank 1's no, then committed the chain"; mp_pass=$((mp_pass + 1)); } \
        || { echo "[  FAILED  ] worker $tls: $a of 4 ranks aborted with rank 1's no, $c of 4 committed the chain"; mp_fail=$((mp_fail + 1)); }
done
# The same when the rank has no memory for the run's votes
# (NRS_WORKER_NOMEM=1:vote:0 via --nomem): it still votes, a no, without
# reading the answer. It used to return before its gather ("hash vote: out of
# memory"): the others waited 16 s and saw it "did not vote (dead)".
mp_case "worker sm 4 ranks: rank 1 has no memory for its votes, the retry commits" 0 60 \
    env UCX_TLS=sm "$SRV" -q -n 4 -t 50 -- "$W" --seed 7 --count 3 --fail 1 --nomem
a=$(grep -c "transition 1 failed on rank 1 alone .*: aborted everywhere, old state intact" "$mp_out")
c=$(grep -c "3 transition(s) committed, every shard verified" "$mp_out")
[ "$a" -eq 4 ] && [ "$c" -eq 4 ] && ! grep -q "did not vote" "$mp_out" &&
    { echo "[       OK ] worker: 4 of 4 ranks aborted with the no of rank 1 (no memory), then committed the chain"; mp_pass=$((mp_pass + 1)); } ||
    { echo "[  FAILED  ] worker: $a of 4 ranks aborted with the no of rank 1 (no memory), $c of 4 committed the chain"; mp_fail=$((mp_fail + 1)); }
# A re-tune (micro-batches only, nothing moves; --retune 1) runs no executor:
# no NCCL choice, no copy, not its three votes, only one vote ("keep<N>"),
# since without a controller nothing else makes a rank's own failure abort
# every rank alike. Here it fails on rank 1 alone (NRS_WORKER_TRANS_FAIL via
# --fail): every rank aborts it, the retry commits, each saying it kept its
# buffers in place (the old code ran the executor: "committed epoch 2: 0
# op(s)").
mp_case "worker sm 4 ranks: a re-tune fails on rank 1 alone, the retry commits in place" 0 60 \
    env UCX_TLS=sm "$SRV" -q -n 4 -t 50 -- "$W" --seed 7 --count 2 --retune 1 --fail 1
a=$(grep -c "transition 1 failed on rank 1 alone .*: aborted everywhere, old state intact" "$mp_out")
k=$(grep -c "re-tune to epoch 2: transition 1 -> 2: committed epoch 2: nothing moves (.*): one vote" "$mp_out")
c=$(grep -c "2 transition(s) committed, every shard verified" "$mp_out")
[ "$a" -eq 4 ] && [ "$k" -eq 4 ] && [ "$c" -eq 4 ] &&
    { echo "[       OK ] worker: 4 of 4 ranks aborted the re-tune with rank 1, then kept their buffers in place"; mp_pass=$((mp_pass + 1)); } ||
    { echo "[  FAILED  ] worker: $a of 4 aborted the re-tune with rank 1, $k of 4 committed it in place, $c of 4 the chain"; mp_fail=$((mp_fail + 1)); }
# runtime.transports: a job of several ranks needs ucx; one rank runs without it
mp_case "worker 2 ranks, runtime.transports [local]: init refused" 1 60 env UCX_TLS=sm \
    "$SRV" -q -n 2 -t 50 -- "$W" --seed 5 --count 1 --transports 1
mp_grep "worker: the refusal says why" "runtime.transports leaves out ucx, which a job of several ranks needs"
mp_case "worker 1 rank, runtime.transports [local]: runs" 0 60 "$SRV" -q -n 1 -t 50 -- "$W" \
    --seed 5 --count 2 --transports 1
mp_grep "worker 1 rank [local]: its transitions commit, verified" "2 transition(s) committed, every shard verified"
# a knob that is not a number in its range is ignored with a word, not read
# as 0 (atof: a time-out of 0 s failed every wait at once)
mp_case "worker 2 ranks, NRS_WORKER_TIMEOUT=abc NRS_WORKER_WINDOW=0: defaults, runs" 0 60 \
    env UCX_TLS=sm NRS_WORKER_TIMEOUT=abc NRS_WORKER_WINDOW=0 "$SRV" -q -n 2 -t 50 -- "$W" --seed 5 --count 2
mp_grep "worker: the bad time-out is said" "NRS_WORKER_TIMEOUT='abc' is not a number in \[0.01, 1000000\]: 30 is used"
mp_grep "worker: the bad window is said" "NRS_WORKER_WINDOW='0' is not a number in \[1, 1048576\]: 32 is used"
mp_case "worker sm 4 ranks: rank 2 SIGKILLed past the PONR" 137 60 env UCX_TLS=sm \
    "$SRV" -n 4 -t 50 -- "$W" --seed 5 --count 2 --kill-ponr 2
got=$(grep -c "census: .* present, .* rebuildable, .* lost" "$mp_out")
if [ "$got" -eq 3 ]; then
    echo "[       OK ] worker past the PONR: 3 survivor(s) reported the census"; mp_pass=$((mp_pass + 1))
else
    echo "[  FAILED  ] worker past the PONR: $got of 3 survivor(s) reported"; mp_fail=$((mp_fail + 1))
fi
# The census counts what its gather brought, not what each survivor was told
# of deaths: rank 1 dies too, once its part of the census is in, and the
# others read the census only once told of that (NRS_WORKER_KILL_CENSUS).
# Its part must count all the same: the census of ranks 0 and 3 is the one of
# the run without that death (seed 4: with rank 1 left out, as before, it
# was 60 present, 33 rebuildable, 15 lost instead of 71, 22, 15).
mp_case "worker sm 4 ranks, seed 4: rank 2 SIGKILLed past the PONR" 137 60 env UCX_TLS=sm \
    "$SRV" -n 4 -t 50 -- "$W" --seed 4 --count 2 --kill-ponr 2
want=$(grep -oE "census: .* present, .* rebuildable, .* lost" "$mp_out" | sort -u)
mp_case "worker sm 4 ranks, seed 4: and rank 1 once its census part is in" 137 60 env UCX_TLS=sm \
    "$SRV" -n 4 -t 50 -- "$W" --seed 4 --count 2 --kill-ponr 2 --kill-census 1
got=$(grep -cE "mp_worker\[[03]\]: $want\$" "$mp_out")
if [ -n "$want" ] && [ "$(echo "$want" | wc -l)" -eq 1 ] && [ "$got" -eq 2 ]; then
    echo "[       OK ] worker census: rank 1's part counted after its death on 2 of 2 survivors ($want)"; mp_pass=$((mp_pass + 1))
else
    echo "[  FAILED  ] worker census: $got of 2 survivors reported '$want' once rank 1 died"; mp_fail=$((mp_fail + 1))
    grep "census:" "$mp_out" | sed 's/^/    | /'
fi
# A survivor without memory for the census (NRS_WORKER_NOMEM=1:census:0):
# it says so in the census's first gather, and no survivor takes the census:
# all count every new buffer as lost, alike. It used to leave the census's
# gather out: the others waited for it 16 s and counted without its part
# (60 present, 12 lost), it counted nothing (0, 0, 0).
mp_case "worker sm 4 ranks, seed 5: rank 2 SIGKILLed past the PONR, rank 1 without memory for the census" \
    137 60 env UCX_TLS=sm "$SRV" -n 4 -t 50 -- "$W" --seed 5 --count 2 --kill-ponr 2 --nomem-census 1
got=$(grep -cE "mp_worker\[[013]\]: partial: .*no census, rank 1 could not take it \(out of memory\): all 72 new buffer\(s\) count as lost" "$mp_out")
same=$(grep -oE "census: .* present, .* rebuildable, .* lost" "$mp_out" | sort | uniq -c | sed 's/^ *//')
if [ "$got" -eq 3 ] && [ "$same" = "3 census: 0 present, 0 rebuildable, 72 lost" ]; then
    echo "[       OK ] worker census: 3 of 3 survivors took none, all 72 new buffers lost"; mp_pass=$((mp_pass + 1))
else
    echo "[  FAILED  ] worker census without memory: $got of 3 survivors took none; censuses: $same"; mp_fail=$((mp_fail + 1))
fi

# runtime.verify on the weight syncs (nereus-worker, the GRPO example on 4
# ranks: its syncs move bytes between ranks). NRS_WORKER_CORRUPT_SYNC=1:0
# flips a byte of rank 1's first received transfer of every sync.
WK="$B/nereus-worker"
GRPO="${NRS_SRCDIR:-$B}/examples/grpo-qwen2.5-7b.yaml"
# sync_line R: rank R's summary "STEPS BYTES FAILED MISMATCHES HASHED"
sync_line() {
    sed -nE "s/^rank $1: weight sync: ([0-9]+) steps, ([0-9]+) bytes, ([0-9]+) failed, .* ([0-9]+) mismatches \(.*\); ([0-9]+) bytes hashed$/\1 \2 \3 \4 \5/p" "$mp_out"
}
SYNCS=("$SRV" -q -n 4 -t 50 -- "$WK" --spec "$GRPO" --steps 3 --step-ms 10 --gpus-per-host 4)
mp_case "weight sync, verify on: 4 ranks, 3 steps" 0 60 env UCX_TLS=sm NRS_WORKER_VERIFY=1 \
    "${SYNCS[@]}"
bad="" moved=0
for r in 0 1 2 3; do
    set -- $(sync_line $r)
    [ $# -eq 5 ] || { bad="$bad rank $r: no summary;"; continue; }
    moved=$((moved + $2))
    # every sync committed; what a rank received it hashed (and what it sent)
    [ "$1" -ge 3 ] && [ "$3" -eq 0 ] && [ "$4" -eq 0 ] && [ "$5" -ge "$2" ] ||
        bad="$bad rank $r: $*;"
done
if [ -z "$bad" ] && [ "$moved" -gt 0 ]; then mp_ok "weight sync, verify on: every sync committed, every received byte hashed"
else mp_ko "weight sync, verify on: every sync committed, every received byte hashed" "${bad:-no bytes moved}"; fi
mp_case "weight sync, verify on, a byte flipped on the wire: every sync fails, the job goes on" 0 60 \
    env UCX_TLS=sm NRS_WORKER_VERIFY=1 NRS_WORKER_CORRUPT_SYNC=1:0 \
    "${SYNCS[@]}"
n=$(grep -c 'weight sync of epoch 1: ponr vote: checksum mismatch' "$mp_out")
[ "$n" -eq 4 ] && mp_ok "weight sync: all 4 ranks name the checksum mismatch" ||
    mp_ko "weight sync: all 4 ranks name the checksum mismatch" "$n of 4"
bad=""
for r in 0 1 2 3; do
    set -- $(sync_line $r)
    [ $# -eq 5 ] && [ "$1" -eq 0 ] && [ "$3" -ge 3 ] || bad="$bad rank $r: ${*:-no summary};"
done
[ -z "$bad" ] && mp_ok "weight sync: no rank committed a corrupted sync" ||
    mp_ko "weight sync: no rank committed a corrupted sync" "$bad"
# A sync that fails on one rank alone (NRS_WORKER_SYNC_FAIL=1:1: rank 1's
# second sync, before its transfers): that rank still votes, a no, in the
# sync's collectives. It used to return before them: its next collective (the
# step agreement) paired with the others' hash vote, they saw "rank 1 did not
# vote (dead)", it saw them gone, and every later sync was skipped.
mp_case "weight sync, rank 1's second sync fails on it alone: every rank aborts it, the rest commit" 0 60 \
    env UCX_TLS=sm NRS_WORKER_VERIFY=1 NRS_WORKER_SYNC_FAIL=1:1 \
    "$SRV" -q -n 4 -t 50 -- "$WK" --spec "$GRPO" --steps 5 --step-ms 10 --gpus-per-host 4
n=$(grep -c 'step 1: weight sync: .*hash vote: rank 1 says no' "$mp_out")
m=$(grep -c 'rank 1: step 1: weight sync: .*test hook: weight sync 1 fails on this rank; this rank voted no' "$mp_out")
[ "$n" -eq 3 ] && [ "$m" -eq 1 ] && ! grep -q 'did not vote\|skipped, ranks of the plan' "$mp_out" &&
    mp_ok "weight sync, one rank's local failure: it votes no, the 3 others abort with it" ||
    mp_ko "weight sync, one rank's local failure: it votes no, the 3 others abort with it" \
        "$n of 3 saw its no, $m of 1 said it"
bad=""
for r in 0 1 2 3; do
    set -- $(sync_line $r)
    # 4 of the 5 syncs committed on every rank, the generation shards verified
    [ $# -eq 5 ] && [ "$1" -eq 4 ] && [ "$3" -eq 1 ] && [ "$4" -eq 0 ] || bad="$bad rank $r: ${*:-no summary};"
done
[ -z "$bad" ] && mp_ok "weight sync, one rank's local failure: the later syncs commit, every shard verified" ||
    mp_ko "weight sync, one rank's local failure: the later syncs commit, every shard verified" "$bad"
# A rank without memory for a checkpoint (NRS_WORKER_NOMEM=1:checkpoint:2:
# rank 1, the checkpoint of step 2) still votes, a no: none publishes it, the
# others name rank 1, the later one is published. It used to return before
# the vote: the others waited 16 s and saw it "did not vote (dead)", its next
# collective paired with their vote.
ck=$(mktemp -d "${TMPDIR:-/tmp}/nrs-ck.XXXXXX")
mp_case "checkpoints, rank 1 without memory for the one of step 2: every rank leaves it, the next is published" \
    0 60 env UCX_TLS=sm NRS_WORKER_NOMEM=1:checkpoint:2 "$SRV" -q -n 4 -t 50 -- "$WK" --spec "$GRPO" \
    --steps 4 --step-ms 10 --gpus-per-host 4 --checkpoint-dir "$ck" --checkpoint-every 1
n=$(grep -c "checkpoint of step 2 not published: rank 1 failed" "$mp_out")
m=$(grep -c "^rank 1: .*checkpoint of step 2 not published: out of memory: this rank voted no" "$mp_out")
[ "$n" -eq 3 ] && [ "$m" -eq 1 ] && [ "$(cat "$ck/LATEST" 2>/dev/null)" = 3 ] && ! grep -q "did not vote" "$mp_out" &&
    mp_ok "checkpoint, one rank without memory: it votes no, none publishes, step 3's is published" ||
    mp_ko "checkpoint, one rank without memory: it votes no, none publishes, step 3's is published" \
        "$n of 3 named rank 1, $m of 1 said it voted no, LATEST $(cat "$ck/LATEST" 2>/dev/null)"
rm -rf "$ck"
mp_case "weight sync, verify off, the same flip: committed, only the test's own check finds it" 1 60 \
    env UCX_TLS=sm NRS_WORKER_VERIFY=0 NRS_WORKER_CORRUPT_SYNC=1:0 \
    "${SYNCS[@]}"
set -- $(sync_line 1)
[ $# -eq 5 ] && [ "$3" -eq 0 ] && [ "$4" -ge 1 ] && [ "$5" -eq 0 ] &&
    mp_ok "weight sync, verify off: rank 1 committed the flipped byte, hashed nothing" ||
    mp_ko "weight sync, verify off: rank 1 committed the flipped byte, hashed nothing" "${*:-no summary}"

# The step agreement names a PREPARE some rank never gets (NRS_WORKER_DROP=3:prepare:2:
# rank 3 ignores the PREPARE of epoch 2; nereus-controller, 8 nereus-worker
# ranks, tests/mp/e2e.yaml, the workload-driven epoch 2 of test_e2e's first
# case). After the wait for it (NRS_WORKER_TIMEOUT, 5 s here) every rank says
# whether it has it: none runs it, those that have it tell the controller,
# and its retry (epoch 3) commits. Rank 3 used to leave alone ("the others
# have its PREPARE, this rank has not") while the others ran it: they waited
# for it in the transition's gathers, it for them in its next agreement, each
# side took the other for dead and the controller dropped ranks whose
# gathers had completed without them (exit 4).
. "$(dirname "$0")/ctl_lib.sh"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/nrs-wk.XXXXXX")
cpid=""
spid=""
trap 'for p in "$spid" "$cpid"; do [ -n "$p" ] && kill -KILL "$p" 2>/dev/null; done; rm -rf "$tmp" "$mp_out"' EXIT
start_ctl "$tmp/s" "$tmp/c.log"
mp_case "step agreement: rank 3 never gets the PREPARE of epoch 2: no rank runs it, epoch 3 commits" 0 60 \
    env NEREUS_SOCKET_DIR="$tmp/s" NRS_WORKER_TIMEOUT=5 NRS_WORKER_DROP=3:prepare:2 \
    "$SRV" -q -n 8 -t 50 -- "$WK" --spec "$SPEC" --steps 24 --step-ms 30 --gpus-per-host 4 \
    --response-len 32 --max-response-len 256
a=$(grep -cE '^rank [0-24-7]: step [0-9]+: transition aborted, staying on epoch 1: epoch 2: rank 3 has not its PREPARE: no rank runs it' "$mp_out")
b=$(grep -cE '^rank 3: step [0-9]+: transition aborted, staying on epoch 1: epoch 2: the others have its PREPARE, this rank has not .*no rank runs it' "$mp_out")
c=$(grep -cE '^rank [0-7]: epoch 3, 1 transition\(s\): verified [1-9][0-9]* shards, 0 mismatches' "$mp_out")
[ "$a" -eq 7 ] && [ "$b" -eq 1 ] && [ "$c" -eq 8 ] && ! grep -q 'did not vote\|retired or dead' "$mp_out" &&
    mp_ok "step agreement, a PREPARE one rank lacks: 8 of 8 left it alike, 8 of 8 committed its retry" ||
    mp_ko "step agreement, a PREPARE one rank lacks: 8 of 8 left it alike, 8 of 8 committed its retry" \
        "$a of 7 named rank 3, $b of 1 said it lacked it, $c of 8 verified epoch 3"
grep -q 'epoch 3 committed in' "$tmp/c.log" && mp_ok "step agreement: the controller committed the retry" ||
    mp_ko "step agreement: the controller committed the retry" "$(grep -E 'epoch [23]' "$tmp/c.log" | tail -n 3)"
stop_ctl "step agreement"

# The same for a WORLD (an expansion: 4 ranks, delta --add 1, a join step of
# 4; NRS_WORKER_DROP=1:world:1, rank 1 never gets the WORLD of generation 1):
# no rank of the first step switches, each says why and runs on in its world;
# the joiners, left alone in theirs, give up. Rank 1 used to stay alone in
# the old world while the others switched: its next agreement's GATHER, of
# another size than theirs, got it dropped (exit 1).
if command -v jq >/dev/null; then
    start_ctl "$tmp/w" "$tmp/cw.log" --gpus 4
    env NEREUS_SOCKET_DIR="$tmp/w" NRS_WORKER_TIMEOUT=5 NRS_WORKER_DROP=1:world:1 \
        "$SRV" -q -n 4 -t 50 --exits -- "$WK" --spec "$SPEC" --steps 40 --step-ms 30 \
        --gpus-per-host 4 --response-len 32 --max-response-len 256 >"$tmp/w.log" 2>&1 &
    spid=$!
    wait_for 20 jq_ok "$tmp/w" '.nworkers == 4'
    timeout 10 "$NRS" delta --add 1 --socket-dir "$tmp/w" >/dev/null 2>&1
    mp_case "step agreement: rank 1 never gets the WORLD of an expansion: no rank switches" 1 50 \
        env NEREUS_SOCKET_DIR="$tmp/w" NEREUS_HOSTNAME=node1 NRS_WORKER_TIMEOUT=5 \
        "$SRV" -q -n 4 -t 45 --exits -- "$WK" --join --spec "$SPEC" --steps 40 --step-ms 30 \
        --response-len 32 --max-response-len 256
    wait "$spid"
    src=$?
    a=$(grep -cE '^rank [0237]: step [0-9]+: .*world 1: rank 1 has no WORLD from the controller: no rank switches' "$tmp/w.log")
    b=$(grep -cE '^rank 1: step [0-9]+: .*world 1: this rank has no WORLD from the controller .*no rank switches' "$tmp/w.log")
    c=$(grep -cE '^rank [0-3]: epoch 1, 0 transition\(s\): verified [1-9][0-9]* shards, 0 mismatches' "$tmp/w.log")
    [ "$src" -eq 0 ] && [ "$a" -eq 3 ] && [ "$b" -eq 1 ] && [ "$c" -eq 4 ] &&
        ! grep -q 'disagree' "$tmp/cw.log" &&
        mp_ok "step agreement, a WORLD one rank lacks: 4 of 4 stayed alike, ended 0, every shard verified" ||
        mp_ko "step agreement, a WORLD one rank lacks: 4 of 4 stayed alike, ended 0, every shard verified" \
            "exit $src; $a of 3 named rank 1, $b of 1 said it lacked it, $c of 4 verified; $(grep -m1 disagree "$tmp/cw.log")"
    stop_ctl "step agreement, world"
else
    mp_skip "step agreement, a WORLD one rank lacks" "needs jq"
fi
mp_done
