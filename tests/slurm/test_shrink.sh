#!/usr/bin/env bash
# The Slurm mechanics of a shrink (DESIGN §8), under --nereus: a 4-node
# --no-kill job shrunk with "scontrol update JobId=N NumNodes=2" keeps running
# on 2 nodes; its tasks on the released nodes are killed, the others go on;
# the released nodes return to idle; the job then finishes normally.
# With the plugin: the job's controller (started by the batch step on the
# first node) runs exactly once for the job and answers `nereus status`; the
# allocation watcher sends it the shrink as a resource delta within 2 poll
# intervals (poll_interval=1 here); the tasks just sleep, so no worker is
# connected and the controller records the delta (log, status: generation,
# GPUs, a decision) without a transition; it and the watcher exit when the
# job ends.
. "$(dirname "$0")/lib.sh"
cd "$sl_tmp" || exit 1
nereus=""
sl_have_plugin && nereus="#SBATCH --nereus=good.yaml"
all="n1 n2 n3 n4"

cat >shrink.sbatch <<EOS
#!/bin/bash
#SBATCH -N 4
#SBATCH --no-kill
#SBATCH -J nrs-shrink
#SBATCH -o $sl_tmp/shrink.out
$nereus
srun --no-kill -N 4 -n 4 bash -c 'while [ ! -e $sl_tmp/stop ]; do date +%s%N >$sl_tmp/hb.\$SLURMD_NODENAME; sleep 0.2; done; echo "task on \$SLURMD_NODENAME done"'
echo "srun rc=\$?"
EOS
hb() { cat "$sl_tmp/hb.$1" 2>/dev/null || echo none; }
all_beating() { local n; for n in $all; do [ -s "$sl_tmp/hb.$n" ] || return 1; done; }

sl_run 20 sbatch --parsable shrink.sbatch
jid=$(tail -1 "$sl_out")
if ! { [ "$sl_rc" -eq 0 ] && sl_wait_job_state "$jid" RUNNING 30 && sl_wait_until 30 all_beating; }; then
    sl_fail "4-node job running with a task on every node" "job '$jid'"
    timeout 10 scancel "$jid" 2>/dev/null; sl_done
fi
sl_ok "4-node job running with a task on every node"

nrs="${NRS_BUILDDIR:+$NRS_BUILDDIR/nereus}"
jobdir="$NRS_CLUSTER_DIR/nereus/n1/$jid"
# Processes of this job's controller / watcher (their command lines name the
# job dir; a libtool wrapper execs the real binary under the same name).
nrs_procs() { ps -eo args= | grep -E "nereus-$1 --socket-dir $jobdir( |\$)" | grep -v grep; }
nrs_count() { nrs_procs "$1" | wc -l; }
have_ctl=0
if [ -n "$nereus" ]; then
    if [ -n "$nrs" ] && [ -x "$nrs" ]; then have_ctl=1
    else sl_skip "controller checks" "no nereus CLI (set NRS_BUILDDIR)"; fi
fi
if [ "$have_ctl" -eq 1 ]; then
    # The batch step started it; the srun step found the lock and reused it.
    if [ "$(nrs_count controller)" -eq 1 ] && [ "$(nrs_count watcher)" -eq 1 ]; then
        sl_ok "exactly one controller and one watcher for the job (batch step + srun step)"
    else { nrs_procs controller; nrs_procs watcher; } >"$sl_out"
        sl_fail "exactly one controller and one watcher for the job (batch step + srun step)" \
            "$(nrs_count controller) controller(s), $(nrs_count watcher) watcher(s)"; fi
    sl_run 10 "$nrs" status --socket-dir "$jobdir"
    if [ "$sl_rc" -eq 0 ] && grep -q "^job $jid: epoch 1, 16 GPUs" "$sl_out"; then
        sl_ok "nereus status answers: job $jid, epoch 1, 16 GPUs (4 nodes x 4)"
    else sl_fail "nereus status answers: job $jid, epoch 1, 16 GPUs (4 nodes x 4)" "rc $sl_rc"; fi
    sl_run 10 "$nrs" status --json --socket-dir "$jobdir"
    cp "$sl_out" status0.json
fi

sl_run 20 scontrol update JobId="$jid" NumNodes=2
t_resize=$SECONDS
sl_check "scontrol update JobId=$jid NumNodes=2 accepted" test "$sl_rc" -eq 0
sl_wait_until 15 sl_job_num_nodes "$jid" 2
kept=$(timeout 10 scontrol show hostnames "$(sl_job_field "$jid" NodeList)" | xargs)
released=$(for n in $all; do case " $kept " in *" $n "*) ;; *) echo "$n" ;; esac; done | xargs)
state=$(sl_job_field "$jid" JobState)
if sl_job_num_nodes "$jid" 2 && [ "$state" = RUNNING ] && [ "$(wc -w <<<"$kept")" -eq 2 ]; then
    sl_ok "job still RUNNING, on 2 nodes ($kept)"
else sl_fail "job still RUNNING, on 2 nodes ($kept)" "state $state, NumNodes $(sl_job_field "$jid" NumNodes)"; fi

if [ "$have_ctl" -eq 1 ]; then
    sl_delta_within "controller got the delta" "remove $released -> 8 GPUs" "$t_resize" "$jobdir" \
        'resource delta 1: remove -> 8 GPUs'
    sl_run 10 "$nrs" status --json --socket-dir "$jobdir"
    cp "$sl_out" status1.json
    if python3 - status0.json status1.json >"$sl_out" 2>&1 <<'EOPY'
import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:3])
assert a["gpus"] == 16 and a["generation"] == 0, (a["gpus"], a["generation"])
assert b["gpus"] == 8 and b["generation"] == 1, (b["gpus"], b["generation"])
# No worker to prepare: the forced epoch 2 commits at once.
assert a["epoch"] == 1 and b["epoch"] == 2, (a["epoch"], b["epoch"])
assert any(d.get("source", "").startswith("delta 1") for d in b["decisions"]), b["decisions"]
EOPY
    then sl_ok "status: 16 -> 8 GPUs, generation 0 -> 1, epoch 1 -> 2, a decision from delta 1"
    else sl_fail "status: 16 -> 8 GPUs, generation 0 -> 1, epoch 1 -> 2, a decision from delta 1" "see above"; fi
fi

sleep 3 # released tasks are SIGKILLed by now
declare -A before
for n in $all; do before[$n]=$(hb "$n"); done
sleep 2
ok=1
for n in $kept; do [ "$(hb "$n")" != "${before[$n]}" ] || { ok=0; echo "$n stopped beating" >"$sl_out"; }; done
sl_check "tasks on the kept nodes go on" test "$ok" -eq 1
ok=1
for n in $released; do [ "$(hb "$n")" = "${before[$n]}" ] || { ok=0; echo "$n still beating" >"$sl_out"; }; done
sl_check "tasks on the released nodes ($released) were killed" test "$ok" -eq 1

released_idle() {
    local n
    for n in $released; do
        [ "$(timeout 10 sinfo -h -N -n "$n" -o %T)" = idle ] || return 1
    done
}
sl_check "released nodes back to idle" sl_wait_until 20 released_idle

touch "$sl_tmp/stop"
if sl_wait_job_state "$jid" COMPLETED 30; then
    cp "$sl_tmp/shrink.out" "$sl_out"
    ok=1
    for n in $kept; do grep -q "task on $n done" "$sl_out" || ok=0; done
    for n in $released; do grep -q "task on $n done" "$sl_out" && ok=0; done
    sl_check "job COMPLETED; the kept tasks finished, the released did not" test "$ok" -eq 1
else
    sl_fail "job COMPLETED; the kept tasks finished, the released did not" "state $(sl_job_field "$jid" JobState)"
    timeout 10 scancel "$jid" 2>/dev/null
fi
if [ "$have_ctl" -eq 1 ]; then
    gone() { [ "$(nrs_count controller)" -eq 0 ] && [ "$(nrs_count watcher)" -eq 0 ]; }
    if sl_wait_until 10 gone && grep -q 'controller stopped; exiting' "$jobdir/watcher.log" &&
        grep -q 'stopped' "$jobdir/controller.log"; then
        sl_ok "controller and watcher exited cleanly with the job (no orphans)"
    else { nrs_procs controller; nrs_procs watcher; tail -n 5 "$jobdir/watcher.log"; } >"$sl_out" 2>&1
        sl_fail "controller and watcher exited cleanly with the job (no orphans)" "see above"; fi
fi
sl_check_slurmds
sl_done
