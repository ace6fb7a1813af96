#!/usr/bin/env bash
# The worker API from Python (python/nereus_worker.py, ctypes): the binding
# against the headers and the library, then Python ranks in real jobs under
# the tests' PMIx server with nereus-controller on tests/mp/e2e.yaml
# (controller --gpus 4: node0's 4 GPUs):
#   1. the binding alone (python/test_nereus_worker.py): constants and API
#      version equal to the headers' (and a header changed in a copy is
#      caught), the tensor ids runtime/emu/geometry.h's, every bound
#      function's ctypes types its nereus.h prototype's (buffer_layer's
#      arguments too), the library's version check, error paths (bad, malformed or
#      no spec; calls out of order; a finalized handle) raise NereusError with
#      the library's message, which names the call and the reason; every
#      function of nereus.h called with a NULL handle (ctypes) refuses it; a
#      failed init's message outlives its handle; a singleton handle (no
#      transition yet: failed rank -1), reports into a Python sink;
#      py_worker.py on a missing spec fails cleanly (no traceback, no crash);
#   2. buffers: one Python rank (PMIx singleton) under a controller: reads
#      its host state through memoryviews (sizes match the boxes, zero
#      exactly where the pattern is: grads), flips one byte -> verify_state
#      counts exactly 1 mismatch, restores it -> 0; takes every layer-tensor
#      buffer apart by layer (buffer_layer, API 5; --check-layers: shapes,
#      places, addresses and bytes as computed from the boxes, the parts
#      tiling them, layers outside refused; also in 3 and 4, where the spec
#      is scaled, at the first and the last state); then re-runs steps 2-4
#      (as after a checkpoint restore): the controller ignores those
#      reports, logs the run once, keeps the channel, takes step 5;
#   3. 4 Python ranks (tests/mp/py_worker.py, nereus-worker's loop), 24
#      steps, response length 32 -> 512: from the ranks' reports the
#      controller admits a workload transition, every rank executes it in
#      control_poll and verifies every shard, the controller commits it;
#   4. a mixed job: ranks 0-1 Python (py_worker.py --sync: the per-step
#      agreement and weight sync, control_step and weight_sync of API 4),
#      ranks 2-3 nereus-worker, one PMIx namespace (a wrapper picks the
#      program by PMIX_RANK, as test_e2e.sh's half.sh), on a copy of e2e.yaml
#      with runtime.emulation_scale 0.25, so that the Python ranks must scale
#      the spec as nereus-worker does (nrs_worker_init_emulated) for their
#      graphs to match: they take the same transitions and weight syncs, all
#      4 verify every shard and generation shard;
#   5. a join step of Python and C ranks, half of it in line: 4
#      nereus-worker ranks on 4 GPUs, `delta --add 1` and 8 joiners (4
#      py_worker.py --join --sync, 4 nereus-worker --join): 4 are placed, 4
#      wait counting steps of their own, two of them ending those steps and
#      following the controller; a second `delta --add 1` places the 4 and
#      each takes the job's step (job_step, API 8), the one the C ranks
#      committed that epoch at; all 12 end 0 and verify every shard.
# Hard time-outs everywhere; prints the lines scripts/test counts.
# The build: $NRS_BUILDDIR, else $B (B=<build> bash tests/mp/test_python.sh).
[ -n "${B:-}" ] && [ -z "${NRS_BUILDDIR:-}" ] && export NRS_BUILDDIR="$B"
export NRS_SRCDIR="${NRS_SRCDIR:-$(cd "$(dirname "$0")/../.." && pwd)}"
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/ctl_lib.sh"
PYW="$S/tests/mp/py_worker.py"
export PYTHONDONTWRITEBYTECODE=1 # no __pycache__ in the source tree (read-only under distcheck)
unset NEREUS_SOCKET_DIR NEREUS_JOB_DIR NEREUS_SPEC NEREUS_JOIN NEREUS_CHECKPOINT_DIR
tmp=$(mktemp -d "${TMPDIR:-/tmp}/nrs-py.XXXXXX")
cpid=""
cleanup() {
    for p in "$cpid" "${spid:-}" "${jpid:-}"; do [ -n "$p" ] && kill -KILL "$p" 2>/dev/null; done
    if [ "${mp_fail:-0}" -gt 0 ]; then # a failed run keeps what explains it
        grep -HnE 'Traceback|Error|Sanitizer|Assertion|signal|core dumped' "$tmp"/*.log 2>/dev/null |
            grep -v 'transition aborted\|ABORT before\|signal 15' | head -n 40 | sed 's/^/    ! /'
    fi
    rm -rf "$tmp" "$mp_out"
}
trap cleanup EXIT
count() { grep -cE -- "$1" "$2"; } # lines of file $2 matching $1
has() { grep -qE -- "$2" "$1"; }     # file $1 has a line matching $2

echo "[==========] the worker API from Python: python/nereus_worker.py, tests/mp/py_worker.py"
if ! command -v python3 >/dev/null || ! python3 -c 'import sys; sys.exit(sys.version_info < (3, 8))'; then
    mp_skip "python" "needs python3 >= 3.8"; mp_done
fi
NEREUS_LIB=""
for f in "$B/.libs/libnereus.so.0" "$B/.libs/libnereus.so" "$B/libnereus.so.0"; do
    [ -e "$f" ] && { NEREUS_LIB="$f"; break; }
done
if [ -z "$NEREUS_LIB" ] || [ ! -x "$SRV" ] || [ ! -x "$CTL" ]; then
    mp_skip "python" "needs libnereus, nereus-controller and tests/mp/pmix_srv in $B (make; make tests/mp/pmix_srv)"
    mp_done
fi
export NEREUS_LIB
# An ASan build: python3 is not instrumented, so the runtime must come first,
# and CPython's own allocations are not ours to report.
PY=(python3)
if asan=$(ldd "$NEREUS_LIB" 2>/dev/null | sed -n 's/.*libasan[^ ]* => \([^ ]*\).*/\1/p' | head -n 1) &&
    [ -n "$asan" ]; then
    PY=(env LD_PRELOAD="$asan" ASAN_OPTIONS="${ASAN_OPTIONS}:detect_leaks=0" python3)
fi

# --- 1. the binding alone -------------------------------------------------------------
mp_case "binding: constants, version check, error paths, singleton (python/test_nereus_worker.py)" \
    0 60 "${PY[@]}" "$S/python/test_nereus_worker.py" -v
cp "$mp_out" "$tmp/unit.log"
for t in test_api_version_matches_header test_constants_match_headers test_version_check \
    test_every_function_has_types test_every_stable_function_is_bound \
    test_bound_types_match_header test_buffer_layer_arguments test_bad_spec_path \
    test_malformed_spec test_no_spec test_failed_init_message_outlives_the_handle \
    test_parser_sees_every_function test_every_function_refuses_null test_no_transition_yet \
    test_null_outputs test_out_of_order test_messages_name_the_call \
    test_reports_reach_a_python_sink test_finalized_handle_raises \
    test_arguments_that_do_not_fit_c; do
    check "binding: $t" "grep -qE '^$t .* \.\.\. ok$' '$tmp/unit.log'" "not run or not ok"
done
check "binding: nothing skipped" "! grep -q 'skipped' '$tmp/unit.log'"

# the constants check catches a header change: run it on a copy with one value moved
# and one constant added
mkdir -p "$tmp/drift/include/nereus" "$tmp/drift/runtime/emu"
cp "$S"/include/nereus/*.h "$tmp/drift/include/nereus/"
cp "$S/runtime/emu/geometry.h" "$tmp/drift/runtime/emu/"
sed -i 's/NRS_GROUP_DP = 2/NRS_GROUP_DP = 3/; s/NRS_ERR_CHECKPOINT = -12/NRS_ERR_CHECKPOINT = -12, NRS_ERR_NEW = -13/' \
    "$tmp/drift/include/nereus/nereus.h"
mp_case "binding: a drifted header copy fails the constants check" 1 30 \
    env NRS_SRCDIR="$tmp/drift" python3 "$S/python/test_nereus_worker.py" Constants.test_constants_match_headers
mp_grep "binding: the drift names the moved value" "NRS_GROUP_DP: header 3, binding 2"
mp_grep "binding: the drift names the new constant" "'NRS_ERR_NEW'"

mp_case "binding: py_worker on a missing spec fails cleanly" 1 30 \
    "${PY[@]}" "$PYW" --spec "$tmp/missing.yaml"
mp_grep "binding: the spec error reaches Python" \
    "py_worker: init: job spec could not be loaded: $tmp/missing.yaml:1:1: cannot open: No such file"
check "binding: no traceback" "! grep -q Traceback '$mp_out'"

# --- 2. buffers through memoryviews -------------------------------------------------------
D="$tmp/s2"
start_ctl "$D" "$tmp/c2.log" --gpus 1
mp_case "buffers: 1 Python rank (PMIx singleton), host state read and corrupted through memoryviews" \
    0 40 env NEREUS_SOCKET_DIR="$D" "${PY[@]}" "$PYW" --spec "$SPEC" --steps 6 --mem host \
    --check-buffers --check-layers --quiet-s 0.5 --rerun 2:4
cp "$mp_out" "$tmp/w2.log"
V='verify_state: [1-9][0-9]* shards'
check "buffers: non-zero state, zero exactly in the grads, sizes as their boxes, all verified" \
    'has "$tmp/w2.log" "^rank 0: buffers: [1-9][0-9]* host buffer\(s\), [1-9][0-9]* bytes, 0 with the wrong zeroness for their kind, sizes match their boxes; $V, 0 mismatches"'
check "buffers: one byte flipped through a memoryview -> exactly 1 mismatch" \
    'has "$tmp/w2.log" "^rank 0: byte [0-9]+ of weight buffer [0-9]+ flipped through a memoryview: $V, 1 mismatches"'
check "buffers: restored -> 0 mismatches, and still at the end" \
    'has "$tmp/w2.log" "^rank 0: byte restored: $V, 0 mismatches" &&
     has "$tmp/w2.log" "^rank 0: epoch 1, 0 transition\(s\): verified [1-9][0-9]* shards, 0 mismatches"'
L='layer views \((initial state|epoch [0-9]+, at the end)\): [0-9]+ buffer\(s\), [0-9]+ part\(s\) tile their boxes, [0-9]+ refused, 0 wrong'
L1='layer views \(initial state\): [1-9][0-9]* buffer\(s\), [1-9][0-9]* part\(s\) tile their boxes, [1-9][0-9]* refused, 0 wrong'
check "buffers: every layer-tensor buffer tiled by its layers' views, first and last state" \
    '[ "$(count "^rank 0: $L" "$tmp/w2.log")" -eq 2 ] && has "$tmp/w2.log" "^rank 0: $L1"' \
    "$(grep 'layer views' "$tmp/w2.log" | tr '\n' ';')"
# steps 2-4 reported again: not new steps, so ignored, and the channel stays
check "stale reports: the rank re-ran steps 2-4 and kept its control channel" \
    '[ "$(count "re-running from step" "$tmp/w2.log")" -eq 1 ] &&
     has "$tmp/w2.log" "^rank 0: step 4: re-running from step 2" &&
     has "$tmp/w2.log" "^rank 0: control connected after the last step"'
check "stale reports: ignored, logged once for the run, step 5 taken" \
    '[ "$(count "REPORT of step [0-9]+ after step [0-9]+: ignored" "$tmp/c2.log")" -eq 1 ] &&
     has "$tmp/c2.log" "REPORT of step 2 after step 4: ignored" &&
     has "$tmp/c2.log" "3 stale REPORT\(s\) of steps 2-4 ignored; step 5 is a new one" &&
     ! grep -q "dropped" "$tmp/c2.log"' "$(grep -E 'stale|ignored|dropped' "$tmp/c2.log" | tr '\n' ';')"
stop_ctl "buffers"

# --- 3. 4 Python ranks: a workload-driven transition --------------------------------------
D="$tmp/s3"
start_ctl "$D" "$tmp/c3.log" --gpus 4
# (a hang detector: 9 s here, 40 s under ASan with another suite beside it)
mp_case "python: 4 ranks, 24 steps, response length 32 -> 512" 0 110 \
    env NEREUS_SOCKET_DIR="$D" "$SRV" -q -n 4 -t 100 -- "${PY[@]}" "$PYW" --spec "$SPEC" \
    --steps 24 --step-ms 30 --gpus-per-host 4 --response-len 32 --max-response-len 512 \
    --check-layers
cp "$mp_out" "$tmp/w3.log"
n=$(count '^rank [0-3] of 4: pid [0-9]+, epoch 1, GPU [0-3], [1-9][0-9]* buffer\(s\), control connected' "$tmp/w3.log")
check "python: 4 ranks took the controller's epoch 1 and allocated state" "[ $n -eq 4 ]" "$n of 4"
n=$(grep -E '^rank [0-3]: step [0-9]+: epoch 2 committed' "$tmp/w3.log" | cut -d: -f1 | sort -u | wc -l)
check "python: 4 ranks executed and committed epoch 2" "[ $n -eq 4 ]" "$n of 4"
n=$(count '^rank [0-3]: epoch ([2-9]|[1-9][0-9]+), [1-9][0-9]* transition\(s\): verified [1-9][0-9]* shards, 0 mismatches' "$tmp/w3.log")
check "python: 4 ranks verified every shard after the transition(s)" "[ $n -eq 4 ]" "$n of 4"
n=$(grep -E '^rank [0-3]: epoch [0-9]+,' "$tmp/w3.log" | sed 's/^rank [0-3]: //; s/: verified.*//' | sort -u | wc -l)
check "python: the 4 ranks ended on the same epoch after as many transitions" "[ $n -eq 1 ]" \
    "$(grep -E '^rank [0-3]: epoch [0-9]+,' "$tmp/w3.log" | tr '\n' ';')"
n=$(count "^rank [0-3]: $L" "$tmp/w3.log")
m=$(count "^rank [0-3]: $L1" "$tmp/w3.log")
check "python: 4 ranks' layer views tile their layer-tensor buffers, first and last state" \
    "[ $n -eq 8 ] && [ $m -ge 1 ]" "$n of 8, $m with layer tensors at first"
check "python: the controller admitted a workload transition and committed it" \
    "grep -q 'trigger workload: ADMITTED' '$tmp/c3.log' && grep -q 'epoch 2 committed in' '$tmp/c3.log'" \
    "$(grep -c ADMITTED "$tmp/c3.log") admissions"
if command -v jq >/dev/null; then
    check "python: status: epoch >= 2, commits, no abort" \
        "jq_ok '$D' '.epoch >= 2 and .transitions.committed >= 1 and .transitions.aborted == 0'"
    check "python: the ranks' stage times calibrated the model" \
        "jq_ok '$D' '[.calibration | to_entries[] | select(.key != \"sync\") | .value.samples] | length == 7 and min >= 20'" \
        "$(timeout 5 "$NRS" status --json --socket-dir "$D" | jq -c .calibration)"
else
    mp_skip "python: status checks" "needs jq"
fi
[ "$mp_fail" -gt 0 ] && { show "$tmp/w3.log" 30; grep -v report "$tmp/c3.log" | show /dev/stdin 20; }
stop_ctl "python"

# --- 4. a mixed job: Python and C ranks ---------------------------------------------------
# a non-trivial emulation scale: the Python ranks must scale the spec as nereus-worker does
# (nrs_worker_init_emulated), or their transition and sync graphs differ from the C ranks'
sed 's/^\(  emulation_scale:\).*/\1 0.25/' "$S/tests/mp/e2e.yaml" >"$tmp/e2e-scaled.yaml"
check "mixed: the spec copy has runtime.emulation_scale 0.25" \
    "grep -qx '  emulation_scale: 0.25' '$tmp/e2e-scaled.yaml'"
SPEC="$tmp/e2e-scaled.yaml"
cat >"$tmp/mixed.sh" <<EOS
#!/bin/sh
# ranks 0-1 Python, 2-3 nereus-worker: one job, one PMIx namespace
if [ "\${PMIX_RANK:-0}" -lt 2 ]; then exec ${PY[*]} "$PYW" --sync --check-layers "\$@"; fi
exec "$WK" "\$@"
EOS
chmod +x "$tmp/mixed.sh"
D="$tmp/s4"
start_ctl "$D" "$tmp/c4.log" --gpus 4
mp_case "mixed: ranks 0-1 Python, 2-3 nereus-worker, 24 steps, response length 32 -> 512" 0 60 \
    env NEREUS_SOCKET_DIR="$D" "$SRV" -q -n 4 -t 55 -- "$tmp/mixed.sh" --spec "$SPEC" \
    --steps 24 --step-ms 30 --gpus-per-host 4 --response-len 32 --max-response-len 512
cp "$mp_out" "$tmp/w4.log"
c2=$(grep -E '^rank [0-3]: step [0-9]+: epoch 2 committed' "$tmp/w4.log")
n=$(echo "$c2" | cut -d: -f1 | sort -u | wc -l)
m=$(echo "$c2" | cut -d: -f2 | sort -u | wc -l)
check "mixed: the 4 ranks committed epoch 2, at the same step" "[ $n -eq 4 ] && [ $m -eq 1 ]" \
    "$n of 4, at $m step(s): $(echo "$c2" | tr '\n' ';')"
n=$(count '^rank [0-3]: epoch ([2-9]|[1-9][0-9]+), [1-9][0-9]* transition\(s\): verified [1-9][0-9]* shards, 0 mismatches' "$tmp/w4.log")
check "mixed: 4 ranks verified every shard" "[ $n -eq 4 ]" "$n of 4"
n=$(count "^rank [01]: $L" "$tmp/w4.log")
check "mixed: the 2 Python ranks' layer views tile their buffers on the scaled spec" \
    "[ $n -eq 4 ]" "$n of 4: $(grep 'layer views' "$tmp/w4.log" | tr '\n' ';')"
G='weight sync: 24 steps, [0-9]+ bytes, 0 failed, [0-9.]+ s/step; verified [1-9][0-9]* generation shards, 0 mismatches'
n=$(count "^rank [01]: $G" "$tmp/w4.log")
m=$(count "^rank [23]: $G" "$tmp/w4.log")
check "mixed: 2 Python and 2 C ranks synced every step and verified their generation shards" \
    "[ $n -eq 2 ] && [ $m -eq 2 ]" "$n Python, $m C"
check "mixed: the controller committed epoch 2" "grep -q 'epoch 2 committed in' '$tmp/c4.log'"
[ "$mp_fail" -gt 0 ] && { show "$tmp/w4.log" 30; grep -v report "$tmp/c4.log" | show /dev/stdin 20; }
stop_ctl "mixed"

# --- 5. a join step of Python and C ranks, half of it in line -------------------------
# 4 nereus-worker ranks on node0 (4 GPUs), `delta --add 1` and a join step of 8
# (world ranks 4-11; Python: py_worker.py --join --sync, C: nereus-worker
# --join; a wrapper picks by PMIX_RANK): world 4-7 (2 Python, 2 C) take GPUs
# 4-7, world 8-11 wait in line counting steps of their own. Two of those (8
# Python, 10 C) run theirs at 1 ms a step, end them in line and follow the
# controller; the other two (9 Python, 11 C) are still in their steps. Then
# `delta --add 1` places all four on GPUs 8-11: each takes the job's step
# (job_step, API 8), the one the C ranks committed that epoch at; 8 and 10
# run the rest of that step's boundary (the weight sync) and go back to the
# job's steps, 9 and 11 go on from it; all 12 end 0 and meet in finalize.
if ! command -v jq >/dev/null; then mp_skip "join" "needs jq"; mp_done; fi
SPEC="$S/tests/mp/e2e.yaml"
cat >"$tmp/joinmix.sh" <<EOS
#!/bin/sh
# join ranks 0-7 = world 4-11: Python 0 1 4 5, C 2 3 6 7; 4 and 6 fast
r=\${PMIX_RANK:-0}
case \$r in 4|6) set -- "\$@" --step-ms 1 --quiet-s 60 ;; *) set -- "\$@" --step-ms 30 ;; esac
case \$r in 0|1|4|5) exec ${PY[*]} "$PYW" --sync "\$@" ;; esac
exec "$WK" "\$@"
EOS
chmod +x "$tmp/joinmix.sh"
D="$tmp/s5"
start_ctl "$D" "$tmp/c5.log" --gpus 4
spid="" jpid=""
echo "[ RUN      ] join: 4 C ranks, a join step of 4 Python and 4 C ranks for 4 GPUs, then 4 more"
NEREUS_SOCKET_DIR="$D" "$SRV" -q -n 4 -t 150 -- "$WK" --spec "$SPEC" --steps 500 --step-ms 30 \
    --gpus-per-host 4 --response-len 32 --max-response-len 256 >"$tmp/w5.log" 2>&1 &
spid=$!
wait_for 30 jq_ok "$D" '.nworkers == 4 and .pending_epoch == null'
timeout 10 "$NRS" delta --add 1 --socket-dir "$D" >"$tmp/d5.out" 2>&1
NEREUS_SOCKET_DIR="$D" NEREUS_HOSTNAME=node1 "$SRV" -q -n 8 -t 140 --exits -- "$tmp/joinmix.sh" \
    --join --spec "$SPEC" --steps 500 --response-len 32 --max-response-len 256 \
    >"$tmp/j5.log" 2>&1 &
jpid=$!
wait_for 60 jq_ok "$D" '.plan.total_gpus == 8 and .nworkers == 8 and .pending_epoch == null'
check "join: 4 joiners placed on an 8-GPU plan, 4 waiting" \
    "jq_ok '$D' '.plan.total_gpus == 8 and .nworkers == 8'" \
    "$(status_json "$D" | jq -c '{epoch, nworkers, gpus}' 2>&1)"
done_in_line() { [ "$(grep -acE '^rank (8|10): its steps done, in line' "$tmp/j5.log")" -eq 2 ]; }
wait_for 60 done_in_line
check "join: world ranks 8 (Python) and 10 (C) ended their steps in line, following" \
    done_in_line "$(grep -a 'its steps done' "$tmp/j5.log" | tr '\n' ';')"
timeout 10 "$NRS" delta --add 1 --socket-dir "$D" >"$tmp/d6.out" 2>&1
wait_for 60 jq_ok "$D" '.plan.total_gpus == 12 and .nworkers == 12 and .pending_epoch == null'
check "join: the 4 that waited placed on a 12-GPU plan" \
    "jq_ok '$D' '.plan.total_gpus == 12 and .nworkers == 12 and .transitions.aborted == 0'" \
    "$(status_json "$D" | jq -c '{epoch, nworkers, gpus, transitions}' 2>&1)"
wait_steps 1600
check "join: the C ranks' step exited 0" "[ $rc -eq 0 ]" "exit $rc"
n=$(grep -acE 'pmix_srv: rank [0-7] ended: exit 0' "$tmp/j5.log")
check "join: every rank of the join step exited 0" "[ $n -eq 8 ]" \
    "$(grep -ao 'pmix_srv: rank [0-9]* ended: [a-z]* [0-9]*' "$tmp/j5.log" | tr '\n' ' ')"
n=$(grep -aE '^rank (4|5|6|7): step [0-9]+: epoch [0-9]+ committed \(GPU [4-7],' "$tmp/j5.log" |
    cut -d: -f1 | sort -u | wc -l)
check "join: world ranks 4-7 took GPUs 4-7" "[ $n -eq 4 ]" "$n of 4"
# ... the step at which the C ranks committed the 12-GPU epoch
e=$(sed -n 's/^rank 9: step [0-9]*: epoch \([0-9]*\) committed (GPU \(9\|1[01]\),.*/\1/p' "$tmp/j5.log" | head -1)
ws=$(sed -n "s/^rank 0: step \([0-9]*\): epoch ${e:-x} committed.*/\1/p" "$tmp/w5.log" | head -1)
placed() { sed -n "s/^rank $1: step $2: placed at the job's step \([0-9]*\):.*/\1/p" "$tmp/j5.log" | tail -1; }
p8=$(placed 8 500) p10=$(placed 10 500) p9=$(placed 9 '[0-9]*') p11=$(placed 11 '[0-9]*')
check "join: 9 (Python) and 11 (C), in their steps, took the job's step ${ws:-?} (epoch ${e:-?})" \
    "[ -n '$ws' ] && [ '$p9' = '$ws' ] && [ '$p11' = '$ws' ]" "rank 9 at ${p9:-?}, 11 at ${p11:-?}"
check "join: 8 (Python) and 10 (C), after their last step, took it too" \
    "[ -n '$ws' ] && [ '$p8' = '$ws' ] && [ '$p10' = '$ws' ]" "rank 8 at ${p8:-?}, 10 at ${p10:-?}"
n=$(grep -acE '^rank (8|10): after the last step: epoch [0-9]+ committed \(GPU ([89]|1[01])\)' "$tmp/j5.log")
check "join: 8 and 10 were placed while following the controller" "[ $n -eq 2 ]" "$n of 2"
n=$(cat "$tmp/w5.log" "$tmp/j5.log" | grep -acE '^rank [0-9]+: epoch [0-9]+, [0-9]+ transition\(s\): verified [1-9][0-9]* shards, 0 mismatches')
check "join: all 12 ranks verified every shard" "[ $n -eq 12 ]" "$n of 12"
# every joiner synced as many steps as the others placed with it: 8 and 10
# too, whose first was the boundary of the step they were placed at
G='weight sync: [0-9]+ steps, [0-9]+ bytes, 0 failed, [0-9.]+ s/step; verified [0-9]+ generation shards, 0 mismatches'
n=$(grep -acE "^rank ([4-9]|1[01]): $G" "$tmp/j5.log")
m=$(sed -n 's/^rank \(8\|9\|10\|11\): weight sync: \([0-9]*\) steps,.*/\2/p' "$tmp/j5.log" | sort -u | wc -l)
check "join: the 8 joiners' weight syncs: none failed, no mismatch; 8-11 synced as many steps" \
    "[ $n -eq 8 ] && [ $m -eq 1 ]" "$n of 8; $(grep -a 'weight sync: [0-9]* steps' "$tmp/j5.log" | cut -d, -f1 | tr '\n' ';')"
check "join: no traceback, no finalize barrier completed without a rank, no weight sync vote lost" \
    "! grep -aq 'Traceback\|already completed without\|did not vote' '$tmp/w5.log' '$tmp/j5.log'"
[ "$mp_fail" -gt 0 ] && { show "$tmp/j5.log" 30; grep -v report "$tmp/c5.log" | show /dev/stdin 20; }
stop_ctl "join"
mp_done
