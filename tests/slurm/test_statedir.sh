#!/usr/bin/env bash
# state_dir and the job directories in it, where root creates and removes
# things for users:
#  - every directory of state_dir (the path walked from / without following
#    a link) must be root's and not writable by group or others; only an
#    ancestor may instead be a sticky directory of root's (like /tmp). A
#    directory a user made first (the user could swap job directories or
#    links between root's mkdir and chown), a sticky world-writable state dir
#    itself (anyone could plant <future job id> directories), a symbolic link,
#    a group-writable ancestor: the step runs without Nereus, NEREUS_ERROR
#    says why, and nothing is created in it. job_epilog uses the same rule
#    (an ancestor handed to a user after the job ran: nothing cleaned).
#  - job-id reuse: an earlier job's <state>/<job id> (another user's, or an
#    ended job's logs) is removed and made afresh for the new job.
. "$(dirname "$0")/lib.sh"
sl_need_plugin "state_dir checks"
cd "$sl_tmp" || exit 1
nb=$(id -u nobody 2>/dev/null) || { sl_skip "state_dir checks" "no user nobody"; sl_done; }
state="$NRS_CLUSTER_DIR/nereus"
base=$(mktemp -d /tmp/nrs-statedir.XXXXXX)
chmod 755 "$base"
sl_at_exit "sl_plugstack_restore; rm -rf '$base'"
use_state() { # state_dir (with %n)
    sed "s|state_dir=[^ ]*|state_dir=$1|" "$NRS_CLUSTER_DIR/etc/plugstack.conf.nereus" >"$(sl_plugstack)"
}
step() { # a --nereus step on n1: its NEREUS_JOB_DIR and NEREUS_ERROR
    sl_run 40 srun -J nrs-statedir -N 1 -w n1 --nereus=good.yaml \
        bash -c 'echo "dir=${NEREUS_JOB_DIR-unset} err=${NEREUS_ERROR-unset}"'
}
empty() { [ -z "$(ls -A "$1" 2>/dev/null)" ]; }
refused() { # name state_dir dir-that-stays-empty pattern-of-NEREUS_ERROR
    use_state "$2"
    step
    if [ "$sl_rc" -eq 0 ] && grep -q "^dir=unset err=state_dir $4" "$sl_out" && empty "$3"; then
        sl_ok "$1: the step runs without Nereus, NEREUS_ERROR says why, nothing created in $3"
    else
        ls -laR "$3" >>"$sl_out" 2>&1
        sl_fail "$1: the step runs without Nereus, NEREUS_ERROR says why, nothing created in $3" "rc $sl_rc"
    fi
}

# ---- 1. unsafe state dirs: refused, untouched -----------------------------------
mkdir -m 1777 "$base/tmp" # like /tmp
setpriv --reuid="$nb" --regid="$(id -g nobody)" --clear-groups mkdir -m 755 "$base/tmp/nereus"
refused "a user's directory in a sticky /tmp (state_dir=.../tmp/nereus/%n, made by nobody first)" \
    "$base/tmp/nereus/%n" "$base/tmp/nereus" "$base/tmp/nereus/n1: $base/tmp/nereus is owned by uid $nb, not root"
mkdir -p "$base/st/n1" && chmod 1777 "$base/st/n1"
refused "the state dir itself sticky and world-writable" \
    "$base/st/%n" "$base/st/n1" "$base/st/n1: $base/st/n1 is writable by group or others"
mkdir -m 755 "$base/real" && ln -s real "$base/link"
refused "a symbolic link in state_dir" "$base/link/%n" "$base/real" "$base/link/n1: $base/link is a symbolic link"
mkdir -m 775 "$base/gw"
refused "a group-writable ancestor" "$base/gw/s/%n" "$base/gw" "$base/gw/s/n1: $base/gw is writable by group or others"

# ---- 2. a sticky ancestor (like /tmp) is fine; what is missing is made root 0755 --
use_state "$base/tmp/new/%n"
step
modes=$(stat -c '%U:%a' "$base/tmp/new" "$base/tmp/new/n1" 2>/dev/null | xargs)
if [ "$sl_rc" -eq 0 ] && grep -q "^dir=$base/tmp/new/n1/[0-9]* err=unset$" "$sl_out" &&
    [ "$modes" = "root:755 root:755" ]; then
    sl_ok "under a sticky ancestor: the missing directories made (root, 0755: $modes), Nereus runs"
else sl_fail "under a sticky ancestor: the missing directories made (root, 0755), Nereus runs" "rc $sl_rc, modes '$modes'"; fi

# ---- 3. job_epilog: the same rule ------------------------------------------------------
use_state "$base/ep/%n"
sl_run 20 sbatch --parsable -J nrs-statedir-ep -N 1 -w n1 -o "$sl_tmp/ep.out" \
    --wrap "srun --nereus=good.yaml true; chown $nb $base/ep"
jid=$(tail -1 "$sl_out")
if sl_wait_job_state "$jid" COMPLETED 40 && sleep 1 && [ -d "$base/ep/n1/$jid" ] &&
    grep -q "nereus: job $jid: .*state_dir $base/ep/n1: $base/ep is owned by uid $nb, not root" \
        "$NRS_CLUSTER_DIR/log/slurmd-n1.log"; then
    sl_ok "job_epilog: an ancestor of state_dir handed to a user: nothing cleaned, logged"
else { cat "$sl_tmp/ep.out"; ls -la "$base/ep/n1"; grep "job $jid" "$NRS_CLUSTER_DIR/log/slurmd-n1.log" | grep nereus | tail -5; } >"$sl_out" 2>&1
    sl_fail "job_epilog: an ancestor of state_dir handed to a user: nothing cleaned, logged" "job '$jid'"; fi
sl_plugstack_restore

# ---- 4. job-id reuse: an earlier job's directory is replaced ---------------------------
held_job() { # name: a held 1-node --nereus batch job on n1 printing what it got
    sl_run 20 sbatch --parsable --hold -J "$1" -N 1 -w n1 -o "$sl_tmp/$1.out" --nereus=good.yaml \
        --wrap 'echo "dir=${NEREUS_JOB_DIR-unset} err=${NEREUS_ERROR-unset}"; ls -A "$NEREUS_JOB_DIR"'
    tail -1 "$sl_out"
}
mkdir -p "$state/n1"
j=$(held_job nrs-reuse1)
mkdir -m 700 "$state/n1/$j" && echo old >"$state/n1/$j/old.txt" && chown -R "$nb" "$state/n1/$j"
timeout 10 scontrol release "$j"
if sl_wait_job_state "$j" COMPLETED 40 && grep -q "^dir=$state/n1/$j err=unset$" "$sl_tmp/nrs-reuse1.out" &&
    ! grep -q '^old.txt$' "$sl_tmp/nrs-reuse1.out"; then
    sl_ok "another user's directory at <state>/<job id> (job-id reuse): removed, the new job runs with Nereus"
else cp "$sl_tmp/nrs-reuse1.out" "$sl_out" 2>/dev/null
    sl_fail "another user's directory at <state>/<job id> (job-id reuse): removed, the new job runs with Nereus" "job '$j'"; fi
if grep -q "nereus: job $j: $state/n1/$j is an earlier job's (owner uid $nb): removed" "$NRS_CLUSTER_DIR/log/slurmd-n1.log"; then
    sl_ok "the removal is logged (verbose)"
else grep "job $j" "$NRS_CLUSTER_DIR/log/slurmd-n1.log" | grep nereus | tail -5 >"$sl_out"
    sl_fail "the removal is logged (verbose)" "not in slurmd-n1.log"; fi

# The same user's: an ended job's logs (its epilog removed the rest, ctl_node too).
j=$(held_job nrs-reuse2)
mkdir -m 700 "$state/n1/$j" && echo "OLD JOB'S LINE" >"$state/n1/$j/controller.log"
timeout 10 scontrol release "$j"
if sl_wait_job_state "$j" COMPLETED 40 && grep -q "^dir=$state/n1/$j err=unset$" "$sl_tmp/nrs-reuse2.out" &&
    ! grep -q "OLD JOB'S LINE" "$state/n1/$j/controller.log" 2>/dev/null; then
    sl_ok "an ended job's logs at <state>/<job id> (same user): replaced, not appended to"
else { cat "$sl_tmp/nrs-reuse2.out"; head -3 "$state/n1/$j/controller.log"; } >"$sl_out" 2>&1
    sl_fail "an ended job's logs at <state>/<job id> (same user): replaced, not appended to" "job '$j'"; fi

sl_check "every node idle again" sl_wait_until 20 sl_all_idle
sl_check_slurmds
sl_done
