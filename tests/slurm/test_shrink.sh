#!/usr/bin/env bash
# The Slurm mechanics of a shrink (DESIGN §8), under --nereus: a 4-node
# --no-kill job shrunk with "scontrol update JobId=N NumNodes=2" keeps running
# on 2 nodes; its tasks on the released nodes are killed, the others go on;
# the released nodes return to idle; the job then finishes normally.
# (What the runtime does about it comes with the controller and watcher.)
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
wait_until() { # seconds cmd...
    local deadline=$((SECONDS + $1)); shift
    until "$@"; do [ $SECONDS -lt $deadline ] || return 1; sleep 0.5; done
}

sl_run 20 sbatch --parsable shrink.sbatch
jid=$(tail -1 "$sl_out")
if ! { [ "$sl_rc" -eq 0 ] && sl_wait_job_state "$jid" RUNNING 30 && wait_until 30 all_beating; }; then
    sl_fail "4-node job running with a task on every node" "job '$jid'"
    timeout 10 scancel "$jid" 2>/dev/null; sl_done
fi
sl_ok "4-node job running with a task on every node"

sl_run 20 scontrol update JobId="$jid" NumNodes=2
sl_check "scontrol update JobId=$jid NumNodes=2 accepted" test "$sl_rc" -eq 0
two_nodes() { [ "$(sl_job_field "$jid" NumNodes)" = 2 ]; }
wait_until 15 two_nodes
kept=$(timeout 10 scontrol show hostnames "$(sl_job_field "$jid" NodeList)" | xargs)
released=$(for n in $all; do case " $kept " in *" $n "*) ;; *) echo "$n" ;; esac; done | xargs)
state=$(sl_job_field "$jid" JobState)
if two_nodes && [ "$state" = RUNNING ] && [ "$(wc -w <<<"$kept")" -eq 2 ]; then
    sl_ok "job still RUNNING, on 2 nodes ($kept)"
else sl_fail "job still RUNNING, on 2 nodes ($kept)" "state $state, NumNodes $(sl_job_field "$jid" NumNodes)"; fi

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
sl_check "released nodes back to idle" wait_until 20 released_idle

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
sl_run 20 "$NRS_SRCDIR/scripts/cluster" status --dir "$NRS_CLUSTER_DIR"
sl_check "every slurmd still running" test "$sl_rc" -eq 0
sl_done
