#!/usr/bin/env bash
# CLI tests: the nereus command as a user runs it. Ends with "cli: N passed, N failed".
set -u
top="$(cd "$(dirname "$0")/../.." && pwd)"
bin="${NRS_BIN:?set NRS_BIN to the nereus binary}"
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
pass=0 fail=0

check() { # name expected-rc regex-on-stdout+stderr command...
    local name="$1" want="$2" re="$3"; shift 3
    "$@" >"$tmp/out" 2>&1; local rc=$?
    if [ "$rc" -eq "$want" ] && grep -Eq -- "$re" "$tmp/out"; then
        pass=$((pass + 1)); echo "ok   $name"
    else
        fail=$((fail + 1)); echo "FAIL $name (rc $rc, want $want; /$re/)"; sed 's/^/     | /' "$tmp/out" | head -20
    fi
}

check "help" 0 "Usage: nereus COMMAND" "$bin" --help
check "no args is a usage error" 2 "Usage: nereus" "$bin"
check "unknown command" 2 "unknown command 'frobnicate'" "$bin" frobnicate
check "version" 0 "^nereus [0-9]+\.[0-9]+" "$bin" version
check "plan --help" 0 "--baseline fixed" "$bin" plan --help
check "help plan" 0 "--response-len" "$bin" help plan
check "validate --help" 0 "FILE:LINE:COL" "$bin" validate --help

for f in "$top"/examples/*.yaml; do
    check "validate $(basename "$f")" 0 "valid" "$bin" validate "$f"
done

ex="$top/examples/ppo-llama3-8b.yaml"
check "plan example" 0 "predicted step time: [0-9.]+ s" "$bin" plan "$ex"
check "plan lists every PPO model-stage" 0 "critic.train" "$bin" plan "$ex"
check "plan --nodes 16" 0 "128 GPUs" "$bin" plan "$ex" --nodes 16
check "plan --gpus 8 --response-len 4096" 0 "response 4096 tokens" "$bin" plan "$ex" --gpus 8 --response-len 4096
check "plan --baseline fixed" 0 "fixed-baseline plan" "$bin" plan "$ex" --baseline fixed --gpus 64
"$bin" plan "$ex" --json >"$tmp/plan.json" 2>&1
check "plan --json is JSON" 0 "step_s" python3 -c "import json,sys; d=json.load(open('$tmp/plan.json')); assert d['step_s']>0 and len(d['stages'])==7; print('step_s', d['step_s'])"
check "plan --gpus 12 rejected" 1 "12 GPUs is not a whole number of 8-GPU nodes" "$bin" plan "$ex" --gpus 12
check "plan --gpus and --nodes" 2 "not both" "$bin" plan "$ex" --gpus 8 --nodes 1
check "plan --gpus junk" 2 "--gpus: 'x8' is not an integer" "$bin" plan "$ex" --gpus x8
check "plan --baseline unknown" 2 "unknown baseline 'static'" "$bin" plan "$ex" --baseline static
check "plan bad option" 2 "unknown or incomplete option" "$bin" plan "$ex" --frob
check "plan missing file" 1 "nosuch.yaml" "$bin" plan "$tmp/nosuch.yaml"

# Infeasible: the 8B PPO job on one 24 GiB GPU.
sed -e 's/^\( *gpu_mem_gib:\).*/\1 24/' "$ex" >"$tmp/small-gpu.yaml"
check "plan infeasible names the constraint" 1 "no feasible plan: .* needs [0-9.]+ GiB per GPU at best \(tp=1, pp=1\) but a GPU has [0-9.]+ GiB usable" \
    "$bin" plan "$tmp/small-gpu.yaml" --gpus 1

# Errors are FILE:LINE:COL: message.
printf 'cluster:\n  gpu_mem_gib: 80\n  bogus_key: 1\n' >"$tmp/bad1.yaml"
check "validate unknown key" 1 "bad1.yaml:3:3: " "$bin" validate "$tmp/bad1.yaml"
printf 'cluster: [1, 2\n' >"$tmp/bad2.yaml"
check "validate YAML syntax" 1 "bad2.yaml:[0-9]+:[0-9]+: " "$bin" validate "$tmp/bad2.yaml"
check "validate no file" 2 "no FILE given" "$bin" validate
check "plan on a bad spec" 1 "bad1.yaml:3:3: " "$bin" plan "$tmp/bad1.yaml"

# nereus status / delta: what they check before they reach a controller.
nosock() { env -u NEREUS_SOCKET_DIR "$@"; }
check "status --help" 0 "Usage: nereus status" "$bin" status --help
check "status without a job directory" 2 "no --socket-dir and no \\\$NEREUS_SOCKET_DIR" nosock "$bin" status
check "status stray argument" 2 "nereus status: unexpected argument 'extra'" "$bin" status -d "$tmp" extra
check "status unknown option" 2 "nereus status: unknown or incomplete option '--frob'" "$bin" status --frob
check "status --timeout junk" 2 "--timeout: '5x' is not in" "$bin" status -d "$tmp" --timeout 5x
check "status no controller" 1 "cannot connect to the controller at $tmp/ctl.sock" "$bin" status -d "$tmp"
# A controller that accepts nobody (its backlog full): --timeout bounds the
# connect too (before: the unix connect waited for ever).
mkdir -m 0700 "$tmp/full"
python3 -c '
import socket, sys, time
l = socket.socket(socket.AF_UNIX); l.bind(sys.argv[1] + "/ctl.sock"); l.listen(0)
held = []
while True:  # fill the backlog
    c = socket.socket(socket.AF_UNIX); c.setblocking(False)
    try: c.connect(sys.argv[1] + "/ctl.sock")
    except BlockingIOError: break
    held.append(c)
print("ready", flush=True); time.sleep(30)' "$tmp/full" >"$tmp/full.out" 2>&1 &
fullpid=$!
for _ in $(seq 50); do grep -q ready "$tmp/full.out" && break; sleep 0.1; done
check "status --timeout 1 when the controller accepts nobody" 1 "no connection within 1 s" \
    timeout 10 "$bin" status -d "$tmp/full" --timeout 1
kill "$fullpid" 2>/dev/null; wait "$fullpid" 2>/dev/null
check "delta --help" 0 "--lost-gpus LIST" "$bin" delta --help
check "delta needs one kind" 2 "give exactly one of --add" "$bin" delta -d "$tmp"
check "delta two kinds" 2 "give exactly one of --add" "$bin" delta -d "$tmp" --add 1 --lost a
check "delta stray argument" 2 "nereus delta: unexpected argument 'extra'" "$bin" delta -d "$tmp" --add 1 extra
check "delta unknown option" 2 "nereus delta: unknown or incomplete option '--frob'" "$bin" delta --frob
check "delta --add 0" 2 "'0' is not a node count in 1..4096" "$bin" delta -d "$tmp" --add 0
check "delta --lost-gpus junk" 2 "'1,x': expected GPU" "$bin" delta -d "$tmp" --lost-gpus 1,x
check "delta --lost empty" 2 "',': expected HOST" "$bin" delta -d "$tmp" --lost ,
check "delta --timeout junk" 2 "--timeout: '0' is not in" "$bin" delta -d "$tmp" --add 1 --timeout 0
check "delta --generation -1" 2 "'-1' is not a positive integer" "$bin" delta -d "$tmp" --add 1 --generation -1
check "delta no controller" 1 "cannot connect to the controller at $tmp/ctl.sock" "$bin" delta -d "$tmp" --add 1

# nereus transition: build, schedule, execute in-process, verify.
tiny="$top/examples/tiny-cpu.yaml"
check "transition --help" 0 "--lost-nodes" "$bin" transition --help
check "transition summary" 0 "makespan [0-9.]+ s, lower bound [0-9.]+ s \(ratio" "$bin" transition "$tiny" --from-gpus 4 --to-gpus 8
check "transition --execute verifies every shard" 0 "verified [0-9]+ shards, 0 mismatches" \
    "$bin" transition "$tiny" --from-gpus 4 --to-gpus 8 --execute
check "transition after a loss (zero1: optimizer shards lost)" 1 "restore from a checkpoint" \
    "$bin" transition "$tiny" --from-gpus 8 --to-gpus 4 --lost-nodes 1
check "transition after a loss below one node (its GPUs alone)" 1 "restore from a checkpoint" \
    "$bin" transition "$tiny" --from-gpus 2 --to-gpus 4 --lost-nodes 0
check "transition bad node" 2 "--lost-nodes: '7' is not an integer in 0..1" \
    "$bin" transition "$tiny" --from-gpus 8 --to-gpus 4 --lost-nodes 7
# ZeRO-3 + optimizer offload: the transition state has the bytes the planner
# counts, so the transitions fit and adaptation goes on (it stopped at step 5).
sed -e 's/^  zero1: true .*/  zero1: false\n  zero3: true\n  offload_optimizer: true/' "$ex" >"$tmp/z3.yaml"
check "transition zero3+offload fits the planner's memory" 0 "makespan [0-9.]+ s" \
    "$bin" transition "$tmp/z3.yaml" --from-gpus 16 --to-gpus 32
check "simulate zero3+offload adapts (transitions, no STOP)" 0 "^nereus +[0-9.]+ +[0-9.]+ +[0-9.]+ +[1-9][0-9]* \(" \
    "$bin" simulate "$tmp/z3.yaml" --trace "$top/examples/traces/ppo-8b-grow.trace" --policy nereus --quiet
check "transition needs both sizes" 2 "expected FILE, --from-gpus and --to-gpus" "$bin" transition "$tiny" --to-gpus 4

# nereus simulate: every policy on a short trace; bad traces are FILE:LINE:COL.
printf 'nereus-trace 1\nsteps 30\ntrue actor.train 0.8\nramp 0 29 128 512\ngpus 0 4\ngpus 10 8\nfail 20 1\n' >"$tmp/t.trace"
check "simulate all policies" 0 "oracle .*" "$bin" simulate "$tiny" --trace "$tmp/t.trace" --quiet
check "simulate reports nereus vs fixed" 0 "nereus vs fixed: " "$bin" simulate "$tiny" --trace "$tmp/t.trace" --quiet
"$bin" simulate "$tiny" --trace "$tmp/t.trace" --policy nereus --csv "$tmp/t.csv" --quiet >/dev/null 2>&1
check "simulate --csv has a row per step" 0 "^31$" wc -l <"$tmp/t.csv"
check "simulate --csv rows" 0 "^nereus,29,4," tail -n 1 "$tmp/t.csv"
printf 'nereus-trace 1\nsteps 30\ngpus 40 8\n' >"$tmp/bad.trace"
check "simulate bad trace" 1 "bad.trace:3:6: '40' is not a number in \[0, 29\]" "$bin" simulate "$tiny" --trace "$tmp/bad.trace"
check "simulate unknown policy" 2 "unknown policy 'best'" "$bin" simulate "$tiny" --trace "$tmp/t.trace" --policy best
check "simulate --csv - keeps the summary (stderr)" 0 "^oracle " sh -c '"$1" simulate "$2" --trace "$3" --csv - --quiet 2>&1 >/dev/null' _ "$bin" "$tiny" "$tmp/t.trace"
check "simulate --csv - rows alone on stdout" 0 "^policy,step," sh -c '"$1" simulate "$2" --trace "$3" --csv - --quiet 2>/dev/null | head -n 1' _ "$bin" "$tiny" "$tmp/t.trace"
check "simulate needs a trace" 2 "expected FILE and --trace" "$bin" simulate "$tiny"
# Policies that stop at different steps cover different steps: no ratio.
printf 'nereus-trace 1\nsteps 12\ngpus 0 32\ngpus 8 5\ngpus 10 3\n' >"$tmp/stop.trace"
check "simulate: no ratio against a policy that stopped" 0 "nereus vs static-best: no ratio, nereus stopped" \
    "$bin" simulate "$ex" --trace "$tmp/stop.trace" --quiet

# Every shipped trace (but the slow 1,024-GPU one, run by bench/sim-baselines.sh):
# nereus no worse than fixed, within 5% of static-best, oracle below every policy.
order_ok() { # csv: totals per policy (steps + transitions) in the required order
    awk -F, 'NR > 1 {t[$1] += $5 + $7} END {
        n = t["nereus"]; bad = 0
        if (n > t["fixed"] * (1 + 1e-9)) { print "nereus above fixed"; bad = 1 }
        if (n > t["static-best"] * 1.05) { print "nereus more than 5% above static-best"; bad = 1 }
        for (p in t) if (t["oracle"] > t[p] * (1 + 1e-9)) { print "oracle above " p; bad = 1 }
        printf "nereus %.0f s, fixed %.0f s, static-best %.0f s, oracle %.0f s\n", n, t["fixed"], t["static-best"], t["oracle"]
        exit bad }' "$1"
}
for tr in "$top"/examples/traces/*.trace; do
    name=$(basename "$tr" .trace)
    [ "$name" = ppo-8b-1024 ] && continue
    spec="$ex"; case "$name" in grpo-*) spec="$top/examples/grpo-qwen2.5-7b.yaml" ;; esac
    "$bin" simulate "$spec" --trace "$tr" --csv "$tmp/$name.csv" --quiet >/dev/null 2>&1
    check "trace $name: nereus <= fixed, <= 1.05 static-best, oracle lowest" 0 "nereus [0-9]+ s" order_ok "$tmp/$name.csv"
done

# nereus-worker's own options (built where PMIx and UCX are): a bad number is a
# usage error that names it, before any spec is read.
wbin="$(dirname "$bin")/nereus-worker"
if [ -x "$wbin" ]; then
    check "worker --help" 0 "nereus-worker - a synthetic PPO/GRPO job" "$wbin" --help
    check "worker --steps junk" 2 "--steps: 'abc' is not an integer in \[0, 1000000000\]" "$wbin" --spec "$tiny" --steps abc
    check "worker --steps not whole" 2 "--steps: '2.5' is not an integer" "$wbin" --spec "$tiny" --steps 2.5
    check "worker --step-ms 0" 2 "--step-ms: '0' is not a number in \[0.001, " "$wbin" --spec "$tiny" --step-ms 0
    check "worker --gpus-per-host 0" 2 "--gpus-per-host: '0' is not an integer in \[1, " "$wbin" --spec "$tiny" --gpus-per-host 0
    check "worker stray argument" 2 "unexpected argument 'extra'" "$wbin" --spec "$tiny" extra
    check "worker bad spec is FILE:LINE:COL" 1 "bad1.yaml:3:3: " "$wbin" --spec "$tmp/bad1.yaml"
else
    echo "skip nereus-worker options: not built (no PMIx or UCX)"
fi

echo "cli: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
