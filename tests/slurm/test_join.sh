#!/usr/bin/env bash
# An expansion with real ranks (issue 7): a 2-node --nereus job A runs 4
# nereus-worker ranks (examples/ppo-live.yaml: 2 emulated GPUs per node) over
# srun --mpi=pmix; an allocation B on the 2 other nodes with
# --dependency=expand:A is merged into A (scontrol update JobId=B NumNodes=0);
# the watcher's ADD delta reaches the controller, which keeps the plan until
# ranks run there; a join step on the new nodes (srun --jobid=A -w n[3-4]
# nereus-worker --join) joins the job's world through the controller, the
# controller plans on 8 GPUs, the joiners receive their replicas (dp grows),
# and all 8 ranks finish with every checksum intact.
. "$(dirname "$0")/lib.sh"
sl_need_plugin "join"
sl_need_bins "join" nereus-worker nereus
command -v jq >/dev/null || { sl_skip "join" "needs jq"; sl_done; }
cd "$sl_tmp" || exit 1
spec="$sl_tmp/ppo-live.yaml"
cp "$NRS_SRCDIR/examples/ppo-live.yaml" "$spec"
chmod 644 "$spec"
status_ok() { # jq-filter
    local j
    j=$(NEREUS_SOCKET_DIR="$jobdir" timeout 5 "$nrs" status --json 2>/dev/null) && [ -n "$j" ] &&
        echo "$j" | jq -e "$1" >/dev/null
}
steps=300
# The job script launches the join step itself, as a real one would: once
# the job has grown, it takes the job's new node list (Slurm leaves the
# batch step's SLURM_JOB_NODELIST as it was) and runs srun on the new nodes.
cat >"$sl_tmp/a.sbatch" <<EOS
#!/bin/bash
#SBATCH -N 2
#SBATCH -w n[1-2]
#SBATCH --ntasks-per-node=2
#SBATCH -J nrs-join-a
#SBATCH -o $sl_tmp/a.out
#SBATCH --nereus=$spec
export NRS_WORKER_TIMEOUT=15
srun --mpi=pmix -N 2 -n 4 -w 'n[1-2]' $wk --steps $steps --step-ms 60 &
first=\$!
while [ ! -e $sl_tmp/expanded ] && kill -0 \$first 2>/dev/null; do sleep 0.2; done
if [ -e $sl_tmp/expanded ]; then
    export SLURM_JOB_NODELIST=\$(scontrol show job \$SLURM_JOB_ID | sed -n 's/^ *NodeList=//p')
    export SLURM_NNODES=4 SLURM_JOB_NUM_NODES=4
    srun --mpi=pmix -N 2 -n 4 -w 'n[3-4]' --ntasks-per-node=2 --nereus=$spec \\
        $wk --join --steps $steps --step-ms 60 >$sl_tmp/join.out 2>&1
    echo "join srun rc=\$?"
fi
wait \$first
echo "srun rc=\$?"
EOS
sl_run 20 sbatch --parsable "$sl_tmp/a.sbatch"
a=$(tail -1 "$sl_out")
jobdir="$NRS_CLUSTER_DIR/nereus/n1/$a"
if ! { sl_wait_job_state "$a" RUNNING 30 && sl_wait_until 60 status_ok '.nworkers == 4'; }; then
    { tail -n 20 "$sl_tmp/a.out"; tail -n 10 "$jobdir/controller.log"; } >"$sl_out" 2>&1
    sl_fail "2-node job of 4 ranks connected to its controller" "job '$a'"
    timeout 10 scancel "$a" 2>/dev/null; sl_done
fi
sl_ok "2-node job of 4 ranks connected to its controller"
# replicas before: the sum of dp over the model-stages of the plan
dp_sum() { NEREUS_SOCKET_DIR="$jobdir" timeout 5 "$nrs" status --json 2>/dev/null | jq '[.plan.stages[].dp] | add'; }
dp0=$(dp_sum)
sl_run 30 salloc -J nrs-join-b -N 2 -w 'n[3-4]' --ntasks-per-node=2 --dependency=expand:"$a" --no-shell
b=$(sl_granted_job)
if [ -z "$b" ]; then
    sl_fail "allocation with --dependency=expand:$a granted" "rc $sl_rc"
    timeout 10 scancel "$a" 2>/dev/null; sl_done
fi
sl_run 20 scontrol update JobId="$b" NumNodes=0
sl_check "job $b merged: job $a on 4 nodes" sl_wait_until 10 sl_job_num_nodes "$a" 4
add() { grep -q 'resource delta 1: add -> 8 GPUs' "$jobdir/controller.log" 2>/dev/null; }
sl_check "the controller got the ADD delta (4 -> 8 GPUs)" sl_wait_until 10 add
sl_check "the plan stays on 4 GPUs until ranks run on the new nodes" status_ok '.gpus == 8 and .plan.total_gpus == 4'
touch "$sl_tmp/expanded" # the job script launches its join step now
world() { grep -q 'world 1: 4 rank(s) joined as 4..7' "$jobdir/controller.log" 2>/dev/null; }
if sl_wait_until 60 world; then sl_ok "the join step's 4 ranks joined the job's world as ranks 4-7"
else
    { tail -n 10 "$sl_tmp/join.out"; grep -v report "$jobdir/controller.log" | tail -n 10; } >"$sl_out" 2>&1
    sl_fail "the join step's 4 ranks joined the job's world as ranks 4-7" "no world in controller.log"
fi
grown() { status_ok '.plan.total_gpus == 8 and .nworkers == 8'; }
if sl_wait_until 60 grown; then sl_ok "the controller grew the plan onto the joiners: 8 GPUs, 8 workers"
else
    grep -v report "$jobdir/controller.log" | tail -n 12 >"$sl_out"
    sl_fail "the controller grew the plan onto the joiners: 8 GPUs, 8 workers" "status: $(NEREUS_SOCKET_DIR="$jobdir" timeout 5 "$nrs" status --json 2>/dev/null | jq -c '{gpus, nworkers, epoch}')"
fi
dp1=$(dp_sum)
sl_check "dp grew with the joiners (sum of dp over the stages: $dp0 -> $dp1)" \
    test "${dp1:-0}" -gt "${dp0:-0}"
sl_check "job $a finished" sl_wait_job_state "$a" COMPLETED 180
sl_check "both steps ended cleanly" grep -q 'join srun rc=0' "$sl_tmp/a.out"
sl_check "the first step ended cleanly" grep -q '^srun rc=0' "$sl_tmp/a.out"
n=$(grep -cE '^rank [4-7] of 8: joined the job at step [0-9]+' "$sl_tmp/join.out")
sl_check "the 4 joiners are world ranks 4-7 ($n)" test "$n" -eq 4
n=$(grep -E '^rank [4-7]: step [0-9]+: epoch [0-9]+ committed \(GPU [4-7],' "$sl_tmp/join.out" | cut -d: -f1 | sort -u | wc -l)
sl_check "the joiners took GPUs 4-7 ($n)" test "$n" -eq 4
n=$(cat "$sl_tmp/a.out" "$sl_tmp/join.out" | grep -cE '^rank [0-7]: epoch [0-9]+, [0-9]+ transition\(s\): verified [1-9][0-9]* shards, 0 mismatches')
if [ "$n" -eq 8 ]; then sl_ok "all 8 ranks finished every step, every shard verified"
else cat "$sl_tmp/a.out" "$sl_tmp/join.out" | tail -n 20 >"$sl_out"; sl_fail "all 8 ranks finished every step, every shard verified" "$n of 8"; fi
timeout 10 scancel "$b" 2>/dev/null
sl_check "all 4 nodes idle again" sl_wait_until 30 sl_all_idle
sl_done
