#!/usr/bin/env bash
# Concurrent steps with --nereus in a job allocated without it (sbatch whose
# batch step has no --nereus: the steps start the job's controller
# themselves). One step at a time holds <job dir>/controller.lock (an flock)
# and runs the controller; the others join it, or wait for it (bounded) and
# then take over or fail with its reason. Each case makes the step that
# waits actually wait: a fake nereus-controller holds the first step's
# controller in the state under test until the test has seen the waiting
# step's slurmstepd hold the lock file open (the bounded look for that is
# the only wait; when it is not seen in time, what depends on it is skipped,
# with the reason, not failed).
#   1. the first step's controller fails to start while a second step waits:
#      the second fails at once with that reason (no 10 s time-out of its own,
#      no second start);
#   2. a step that comes while the previous step's controller is stopping
#      waits for it to be gone and starts a new one (no time-out waiting for
#      the one that is going away);
#   3. a step on another node of the job (not the first) waits for the
#      controller that a step on the first node is starting, and its tasks
#      find it answering; with no controller anywhere it says so and runs on;
#   4. many short steps at once: no NEREUS_ERROR, never two controllers;
#   5. a step whose --nereus spec differs from the running controller's fails
#      at once, saying whose controller it is (it does not join it);
#   6. state_dir without %n: a step on another node finds no lock in its own
#      job directory and cannot tell: slurmd's log, nothing in srun's output;
#   7. the first node's state_dir not root's: a step on another node does not
#      wait for a lock planted there.
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
if [ "$seen1" != yes ]; then
    sl_skip "start-up failure while another step waited: that step gets the same reason at once (not a time-out)" "step 1 was not seen holding $dir1/controller.lock within 15 s (a slow step launch): it may not have waited"
    sl_skip "... and does not start a second controller (1 start in watcher.log)" "as above"
elif grep -qF "second on n1 err=$why1 (step 0 started it; this step waited for it) spec= " second1.out; then
    sl_ok "start-up failure while another step waited: that step gets the same reason at once (not a time-out)"
    sl_check "... and does not start a second controller (1 start in watcher.log)" test "$(started "$dir1")" = 1
else
    sl_fail "start-up failure while another step waited: that step gets the same reason at once (not a time-out)" "see above"
    sl_check "... and does not start a second controller (1 start in watcher.log)" test "$(started "$dir1")" = 1
fi

# 2. Step 0 is short: its controller stops at once, and the fake lingers
# after the real controller is gone (until released, at most 1.8 s: well
# within the 3 s after which the watcher SIGKILLs it, and the plugin the
# watcher). Step 1 comes while it stops.
fake_rt "$sl_tmp/rt2" "\"$NRS_BUILDDIR/nereus-controller\" \"\$@\" & c=\$!
trap 'kill -TERM \$c; wait \$c; touch $sl_tmp/stopping2; for i in \$(seq 1 18); do [ -e $sl_tmp/go2 ] && break; sleep 0.1; done; exit 0' TERM
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
sl_wait_until 2 holds_lock "$jid.1" "$dir2" && seen2=yes || seen2=no
touch go2
sl_wait_job_state "$jid" COMPLETED 40
sl_plugstack_restore
show first2.out second2.out "$dir2/watcher.log"
sl_check "first short step: its tasks had the controller" grep -q "^first on n1 err=unset spec=set status=job $jid: epoch 1" first2.out
if [ "$seen2" != yes ]; then
    sl_skip "a step that came while the controller was stopping waited for it and started a new one, its tasks have it" "step 1 was not seen holding $dir2/controller.lock while the fake controller lingered (a slow step launch): it may have come after the stop"
elif grep -q "^second on n1 err=unset spec=set status=job $jid: epoch 1" second2.out; then
    sl_ok "a step that came while the controller was stopping waited for it and started a new one, its tasks have it"
else sl_fail "a step that came while the controller was stopping waited for it and started a new one, its tasks have it" "see above"; fi
# One after the other in watcher.log: the first exits before the second
# starts (a controller SIGKILLed by its watcher is stopped too: K).
order=$(grep -oE 'started .*nereus-controller|controller stopped; exiting|ignored SIGTERM for 3 s: SIGKILL' "$dir2/watcher.log" 2>/dev/null |
    sed 's/^started.*/S/; s/^controller stopped.*/E/; s/^ignored SIGTERM.*/K/' | tr -d '\n' | sed 's/KE/E/g; s/K/E/g')
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
if [ "$seen3" != yes ]; then
    sl_skip "step on n2 only, started while the step on n1 started the controller: waited for it, its tasks have it" "step 1 was not seen holding $dir3/controller.lock within 15 s (a slow step launch): it may not have waited"
elif grep -q "^second on n2 err=unset spec=set status=job $jid: epoch 1" second3.out; then
    sl_ok "step on n2 only, started while the step on n1 started the controller: waited for it, its tasks have it"
else sl_fail "step on n2 only, started while the step on n1 started the controller: waited for it, its tasks have it" "see above"; fi
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

# 5. Step 0 runs the controller with good.yaml; step 1 asks for other.yaml:
# it fails at once and names good.yaml and step 0 (it does not join it).
cp "$sl_good" other.yaml
cat >job5.sh <<EOF
#!/bin/bash
cd $sl_tmp
srun -n1 --overlap --nereus=good.yaml bash -c './probe.sh first; for i in \$(seq 1 100); do [ -s second5.out ] && break; sleep 0.1; done' >first5.out 2>&1 &
for i in \$(seq 1 150); do grep -q '^first' first5.out 2>/dev/null && break; sleep 0.1; done
t0=\$(date +%s%N)
srun -n1 --overlap --nereus=other.yaml ./probe.sh second >second5.tmp 2>&1
echo "took \$(( (\$(date +%s%N) - t0) / 1000000 )) ms" >>second5.tmp; mv second5.tmp second5.out
wait
EOF
chmod 755 job5.sh
run_job nrs-conc5 1 ./job5.sh
sl_wait_job_state "$jid" COMPLETED 40
show first5.out second5.out
took5=$(sed -n 's/^took \([0-9]*\) ms$/\1/p' second5.out)
if grep -q "^first on n1 err=unset spec=set status=job $jid: epoch 1" first5.out &&
    grep -q "^second on n1 err=the job's controller runs .*/good.yaml (started by step 0), not this step's --nereus spec .*/other.yaml" second5.out &&
    [ "${took5:-99999}" -lt 8000 ]; then
    sl_ok "a step with another spec than the running controller's fails at once, naming it ($took5 ms)"
else sl_fail "a step with another spec than the running controller's fails at once, naming it" "see above (took ${took5:-?} ms)"; fi

# 6. state_dir without %n (every node one machine here: one job directory);
# a step on n2 only, with no step on n1: no controller.lock in its own job
# directory, which cannot tell it anything: nothing in srun's output.
sed -E "s|state_dir=[^ ]*|state_dir=$state/flat|" "$NRS_CLUSTER_DIR/etc/plugstack.conf.nereus" >"$(sl_plugstack)"
cat >job6.sh <<EOF
#!/bin/bash
cd $sl_tmp
srun -N1 -n1 -w n2 --overlap --nereus=good.yaml ./probe.sh sixth >sixth6.out 2>&1
EOF
chmod 755 job6.sh
run_job nrs-conc6 2 ./job6.sh
sl_wait_job_state "$jid" COMPLETED 40
sl_plugstack_restore
show sixth6.out
if grep -q "^sixth on n2 err=unset spec=set " sixth6.out && ! grep -q "no step of this job runs its controller" sixth6.out; then
    sl_ok "state_dir without %n, a step on another node, no lock there: runs with Nereus, no false error in srun's output"
else sl_fail "state_dir without %n, a step on another node, no lock there: runs with Nereus, no false error in srun's output" "see above"; fi
rm -rf "${state:?}/flat"

# 7. The first node's state_dir (n1's) is not root's: a user could plant a
# held controller.lock in it. A step on n2 does not wait for it (the old
# plugin waited 10 s), and runs with Nereus.
base7=$(mktemp -d /tmp/nrs-conc7.XXXXXX) && chmod 755 "$base7" && mkdir "$base7/n1" && chown 65534 "$base7/n1"
sed -E "s|state_dir=[^ ]*|state_dir=$base7/%n|" "$NRS_CLUSTER_DIR/etc/plugstack.conf.nereus" >"$(sl_plugstack)"
cat >job7.sh <<EOF
#!/bin/bash
cd $sl_tmp
mkdir -p $base7/n1/\$SLURM_JOB_ID
exec 9>$base7/n1/\$SLURM_JOB_ID/controller.lock
flock -x 9
t0=\$(date +%s%N)
srun -N1 -n1 -w n2 --overlap --nereus=good.yaml ./probe.sh seventh >seventh7.out 2>&1
echo "took \$(( (\$(date +%s%N) - t0) / 1000000 )) ms" >>seventh7.out
EOF
chmod 755 job7.sh
run_job nrs-conc7 2 ./job7.sh
sl_wait_job_state "$jid" COMPLETED 40
sl_plugstack_restore
show seventh7.out
took7=$(sed -n 's/^took \([0-9]*\) ms$/\1/p' seventh7.out)
if grep -q "^seventh on n2 err=unset spec=set " seventh7.out && ! grep -q "waited for" seventh7.out &&
    [ "${took7:-99999}" -lt 6000 ]; then
    sl_ok "a held controller.lock in a first-node state_dir that is not root's: not waited for ($took7 ms)"
else sl_fail "a held controller.lock in a first-node state_dir that is not root's: not waited for" "see above (took ${took7:-?} ms)"; fi
[ -n "$base7" ] && rm -rf "$base7"

none_left() { [ -z "$(ctl_procs)" ]; }
sl_check "no controller or watcher left" sl_wait_until 10 none_left
sl_check_slurmds
sl_done
