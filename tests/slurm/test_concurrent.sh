#!/usr/bin/env bash
# Concurrent steps with --nereus in a job allocated without it (sbatch whose
# batch step has no --nereus: the steps start the job's controller
# themselves). One step at a time holds <job dir>/controller.lock (an flock)
# and runs the controller; the others join it, or wait for it (bounded) and
# then take over or fail with its reason. Each case makes the step that
# waits actually wait: a fake nereus-controller holds the first step's
# controller in the state under test until the test has seen the waiting
# step's slurmstepd hold the lock file open (the bounded look for that is
# the only wait, and it just goes on when it is not seen).
#   1. the first step's controller fails to start while a second step waits:
#      the second fails at once with that reason (no 10 s time-out of its own,
#      no second start);
#   2. a step that comes while the previous step's controller is stopping
#      waits for it to be gone and starts a new one (no time-out waiting for
#      the one that is going away);
#   3. a step on another node of the job (not the first) waits for the
#      controller that a step on the first node is starting, and its tasks
#      find it answering; with no controller anywhere it says so and runs on;
#   4. many short steps at once: no NEREUS_ERROR, never two controllers.
. "$(dirname "$0")/lib.sh"
sl_need_plugin "concurrent"
sl_need_bins "concurrent" nereus nereus-controller nereus-watcher
cd "$sl_tmp" || exit 1
sl_at_exit sl_plugstack_restore
state="$NRS_CLUSTER_DIR/nereus"
ctl_procs() { ps -eo args= | grep -E "nereus-(controller|watcher) --socket-dir $state/" | grep -v grep; }

# A probe task: who it is, NEREUS_ERROR, and whether the controller answers.
cat >probe.sh <<EOF
#!/bin/bash
s=\$("$nrs" status 2>&1 | head -1)
echo "\$1 on \$SLURMD_NODENAME err=\${NEREUS_ERROR-unset} spec=\${NEREUS_SPEC:+set} status=\$s"
EOF
chmod 755 probe.sh
# runtime_dir with the real watcher and a fake controller (a bash script; it
# runs as the job's user, root here, in the job directory).
fake_rt() { # dir body
    mkdir -p "$1"; ln -sf "$NRS_BUILDDIR/nereus-watcher" "$1/nereus-watcher"
    printf '#!/bin/bash\n%s\n' "$2" >"$1/nereus-controller"; chmod 755 "$1" "$1/nereus-controller"
}
use_rt() { sed -E "s|runtime_dir=[^ ]*|runtime_dir=$1|" "$NRS_CLUSTER_DIR/etc/plugstack.conf.nereus" >"$(sl_plugstack)"; }
# The slurmstepd of step JOB.STEP has DIR/controller.lock open (it waits for
# the lock's holder: the old O_EXCL lock file was never kept open).
holds_lock() { # job.step dir
    local p
    for p in $(ps -eo pid=,args= | awk -v s="[$1]" '$2 == "slurmstepd:" && $3 == s {print $1}'); do
        ls -l "/proc/$p/fd" 2>/dev/null | grep -q -- "-> $2/controller.lock\$" && return 0
    done
    return 1
}
wait_file() { local i; for i in $(seq 1 "$2"); do [ -e "$1" ] && return 0; sleep 0.1; done; return 1; }
run_job() { # name nodes script: sbatch it (no --nereus), its job id in $jid
    sl_run 20 sbatch --parsable -J "$1" -N "$2" -o "$sl_tmp/$1.out" "$3"
    jid=$(tail -1 "$sl_out")
    case "$jid" in '' | *[!0-9]*) jid=0 ;; esac
}
started() { grep -c ': started .*nereus-controller' "$1/watcher.log" 2>/dev/null; }
show() { { cat "$@"; } >"$sl_out" 2>&1; }

# 1. Step 0's controller hangs until released, then fails; step 1 comes
# meanwhile and waits. Released once step 1 is seen waiting.
fake_rt "$sl_tmp/rt1" "touch $sl_tmp/up1; for i in \$(seq 1 80); do [ -e $sl_tmp/go1 ] && break; sleep 0.1; done
echo 'nereus-controller: simulated start-up failure' >&2; exit 1"
cat >job1.sh <<EOF
#!/bin/bash
cd $sl_tmp
srun -n1 --overlap --nereus=good.yaml ./probe.sh first >first1.out 2>&1 &
for i in \$(seq 1 200); do [ -e up1 ] && break; sleep 0.1; done
srun -n1 --overlap --nereus=good.yaml ./probe.sh second >second1.out 2>&1
wait
EOF
chmod 755 job1.sh
use_rt "$sl_tmp/rt1"
run_job nrs-conc1 1 ./job1.sh
dir1="$state/n1/$jid"
sl_wait_until 15 holds_lock "$jid.1" "$dir1" && seen1=yes || seen1=no
touch go1
sl_wait_job_state "$jid" COMPLETED 40
sl_plugstack_restore
show first1.out second1.out "$dir1/watcher.log"
why1="the job's controller did not start: nereus-controller: simulated start-up failure ($dir1/controller.log)"
if grep -qF "first on n1 err=$why1 spec= " first1.out; then
    sl_ok "start-up failure: the step that started the controller gets its reason"
else sl_fail "start-up failure: the step that started the controller gets its reason" "see above"; fi
if [ "$seen1" = yes ] && grep -qF "second on n1 err=$why1 (step 0 started it; this step waited for it) spec= " second1.out; then
    sl_ok "start-up failure while another step waited: that step gets the same reason at once (not a time-out)"
else sl_fail "start-up failure while another step waited: that step gets the same reason at once (not a time-out)" "waiting step seen holding the lock: $seen1"; fi
sl_check "... and does not start a second controller (1 start in watcher.log)" test "$(started "$dir1")" = 1

# 2. Step 0 is short: its controller stops at once, and the fake lingers
# after the real controller is gone (until released, at most 2.5 s: the
# watcher SIGKILLs it at 3 s). Step 1 comes while it stops.
fake_rt "$sl_tmp/rt2" "\"$NRS_BUILDDIR/nereus-controller\" \"\$@\" & c=\$!
trap 'kill -TERM \$c; wait \$c; touch $sl_tmp/stopping2; for i in \$(seq 1 25); do [ -e $sl_tmp/go2 ] && break; sleep 0.1; done; exit 0' TERM
wait \$c; wait \$c"
cat >job2.sh <<EOF
#!/bin/bash
cd $sl_tmp
srun -n1 --overlap --nereus=good.yaml ./probe.sh first >first2.out 2>&1 &
for i in \$(seq 1 200); do [ -e stopping2 ] && break; sleep 0.1; done
srun -n1 --overlap --nereus=good.yaml ./probe.sh second >second2.out 2>&1
wait
EOF
chmod 755 job2.sh
use_rt "$sl_tmp/rt2"
run_job nrs-conc2 1 ./job2.sh
dir2="$state/n1/$jid"
wait_file "$sl_tmp/stopping2" 300
sl_wait_until 3 holds_lock "$jid.1" "$dir2" && seen2=yes || seen2=no
touch go2
sl_wait_job_state "$jid" COMPLETED 40
sl_plugstack_restore
show first2.out second2.out "$dir2/watcher.log"
sl_check "first short step: its tasks had the controller" grep -q "^first on n1 err=unset spec=set status=job $jid: epoch 1" first2.out
if grep -q "^second on n1 err=unset spec=set status=job $jid: epoch 1" second2.out; then
    sl_ok "a step that came while the controller was stopping started a new one (waited for the lock: $seen2), its tasks have it"
else sl_fail "a step that came while the controller was stopping started a new one, its tasks have it" "waiting step seen holding the lock: $seen2"; fi
# One after the other in watcher.log: the first exits before the second starts.
order=$(grep -oE 'started .*nereus-controller|controller stopped; exiting' "$dir2/watcher.log" 2>/dev/null |
    sed 's/^started.*/S/; s/^controller stopped.*/E/' | tr -d '\n')
sl_check "two controllers one after the other, never two at once (watcher.log: $order)" test "$order" = SESE

# 3. Different nodes of a 2-node job: step 0 on n1 starts the controller
# (held until released); step 1 on n2 only waits for it.
fake_rt "$sl_tmp/rt3" "touch $sl_tmp/up3; for i in \$(seq 1 60); do [ -e $sl_tmp/go3 ] && break; sleep 0.1; done
exec \"$NRS_BUILDDIR/nereus-controller\" \"\$@\""
cat >job3.sh <<EOF
#!/bin/bash
cd $sl_tmp
# (its task stays until step 1's has asked the controller)
srun -N1 -n1 -w n1 --overlap --nereus=good.yaml bash -c './probe.sh first; for i in \$(seq 1 150); do [ -s second3.out ] && break; sleep 0.1; done' >first3.out 2>&1 &
for i in \$(seq 1 200); do [ -e up3 ] && break; sleep 0.1; done
srun -N1 -n1 -w n2 --overlap --nereus=good.yaml ./probe.sh second >second3.out 2>&1
wait
# No step on n1 now: a step on n2 alone finds no controller to wait for.
srun -N1 -n1 -w n2 --overlap --nereus=good.yaml ./probe.sh third >third3.out 2>&1
EOF
chmod 755 job3.sh
use_rt "$sl_tmp/rt3"
run_job nrs-conc3 2 ./job3.sh
dir3="$state/n1/$jid"
sl_wait_until 15 holds_lock "$jid.1" "$dir3" && seen3=yes || seen3=no
touch go3
sl_wait_job_state "$jid" COMPLETED 40
sl_plugstack_restore
show first3.out second3.out third3.out
sl_check "step on the first node: its tasks have the controller" grep -q "^first on n1 err=unset spec=set status=job $jid: epoch 1" first3.out
if [ "$seen3" = yes ] && grep -q "^second on n2 err=unset spec=set status=job $jid: epoch 1" second3.out; then
    sl_ok "step on n2 only, started while the step on n1 started the controller: waited for it, its tasks have it"
else sl_fail "step on n2 only, started while the step on n1 started the controller: waited for it, its tasks have it" "waiting step seen holding the lock: $seen3"; fi
if grep -q "^third on n2 err=unset spec=set status=nereus status: cannot connect" third3.out &&
    grep -q "nereus: job $jid step 2: no step of this job runs its controller on its first node n1 now" third3.out; then
    sl_ok "step on n2 only, no controller anywhere: it says so in srun's output and runs on with Nereus"
else sl_fail "step on n2 only, no controller anywhere: it says so in srun's output and runs on with Nereus" "see above"; fi

# 4. 20 short steps, a new one every 0-0.2 s (the real controller): each joins
# the running controller or starts the next; never two at once. (Whether a
# task still finds the controller it joined depends on the step that runs it
# still running: not checked here.)
cat >job4.sh <<EOF
#!/bin/bash
cd $sl_tmp
for i in \$(seq 1 20); do
    srun -n1 --overlap --nereus=good.yaml ./probe.sh s\$i >>many4.out 2>&1 &
    sleep 0.\$((RANDOM % 3))
done
wait
EOF
chmod 755 job4.sh
run_job nrs-conc4 1 ./job4.sh
dir4="$state/n1/$jid"
sl_wait_job_state "$jid" COMPLETED 90
ok4=$(grep -c "^s[0-9]* on n1 err=unset spec=set " many4.out)
show many4.out
sl_check "20 short concurrent steps: all 20 joined or started the controller, no NEREUS_ERROR ($ok4)" test "$ok4" -eq 20
most=$(awk '/: started .*nereus-controller/ {n++; if (n > m) m = n} /controller stopped; exiting/ {n--} END {print m + 0}' "$dir4/watcher.log" 2>/dev/null)
sl_check "... at most one controller at a time ($(started "$dir4") started, $most at once)" test "$most" -eq 1
sl_check "... no controller refused for another running there" test "$(grep -c 'another controller is running there' "$dir4/controller.log" 2>/dev/null)" = 0

none_left() { [ -z "$(ctl_procs)" ]; }
sl_check "no controller or watcher left" sl_wait_until 10 none_left
sl_check_slurmds
sl_done
