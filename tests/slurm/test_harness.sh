#!/usr/bin/env bash
# The plugin's own code outside Slurm (spank_harness.c on the fake SPANK API
# of fake_spank.c, compiled here from the plugin's sources as the build tree
# $NRS_BUILDDIR configured them): what a job's user can stage but a live
# cluster cannot cheaply show, each case a regression test:
#  - FIFOs in the job directory (watcher.log, controller.log): slurmstepd
#    refuses them at once instead of blocking in open() for good;
#  - a node list over 8 KiB still names the job's first node; one that does
#    not parse refuses Nereus for the step instead of guessing;
#  - root's epilog clean-up leaves alone another user's directory the user
#    moved into their job dir, and says nothing for a job without --nereus
#    whose id an earlier job's kept logs have;
#  - task_exit (root) never connects through a ctl.sock link;
#  - a --nereus=FILE over 4095 bytes says so; "--nereus FILE" with a long
#    FILE shows it cut short;
#  - the user's bytes (a spec path with a line break) in root's log: one
#    printable line per message, each with the plugin's prefix (also what a
#    released node's hint prints);
#  - root's epilog SIGKILLs the job's own watcher left in its job dir, and
#    never another user's process that looks like it (same command line and
#    working directory: the job's user opened the dir to others);
#  - a hung filesystem (a FUSE mount whose daemon never answers, as a hung
#    NFS or sshfs mount) under the spec, runtime_dir or the watcher's
#    program: slurmstepd gives up after its bound with the reason instead of
#    blocking in the kernel for good (skipped where no FUSE mount is possible);
#  - the same on the submission side: srun/sbatch/salloc --nereus=FILE on a
#    hung mount is refused after the bound, with the reason;
#  - a job directory whose mount stops answering mid-step: task_exit still
#    stops the watcher and returns after the bound, saying why;
#  - the same for state_dir (root's) on a hung mount: init_post_opt gives up
#    on Nereus for the step, and root's epilog of any job, with or without
#    --nereus, returns and logs why;
#  - root's removal of a job directory stops at its deadline (10 s: an
#    epilog past slurmd's time-out drains the node) and leaves the rest;
#  - a hung FUSE mount of the user's in their job dir, on it, or on its
#    ctl_node: root's epilog leaves it alone and returns instead of blocking;
#  - a bounded call (the spec's check, the looks at state_dir, runtime_dir)
#    answers when its child exits, also while another process holds a copy
#    of its pipe (a fork of another thread of slurmstepd): not at its deadline;
#  - a released node's hint killed at its deadline, or exiting, leaves
#    nothing it started running (its whole process group is killed);
#  - the watcher's start (its exec seen), and a released node's hint (its
#    exit), while another process holds a copy of their pipe (a fork of
#    another thread of slurmstepd; the harness's --wrap=fork makes one):
#    not taken for a time-out, nor waited for until the deadline.
# Needs root, a C compiler and the Slurm and libyaml headers (as the build).
. "$(dirname "$0")/lib.sh"
name="SPANK harness"
[ "$(id -u)" -eq 0 ] || { sl_skip "$name" "needs root"; sl_done; }
[ -n "$NRS_BUILDDIR" ] && [ -f "$NRS_BUILDDIR/config.h" ] && [ -x "$NRS_BUILDDIR/nereus-watcher" ] ||
    { sl_skip "$name" "no build tree with nereus-watcher (set NRS_BUILDDIR)"; sl_done; }
command -v setpriv >/dev/null || { sl_skip "$name" "no setpriv"; sl_done; }

# The plugin's sources and flags, from the build tree's Makefile.
vars=$(printf 'nrs-print:\n\t@echo $(spank_nereus_la_SOURCES)\n\t@echo $(SLURM_CPPFLAGS) $(YAML_CFLAGS)\n\t@echo $(YAML_LIBS) $(SLURM_LDFLAGS) $(SLURM_LIBS)\n\t@echo $(CC)\n' |
    make -s --no-print-directory -C "$NRS_BUILDDIR" -f Makefile -f - nrs-print 2>/dev/null)
srcs=() cppflags=$(sed -n 2p <<<"$vars") libs=$(sed -n 3p <<<"$vars") cc=$(sed -n 4p <<<"$vars")
for f in $(sed -n 1p <<<"$vars"); do case $f in *.c) srcs+=("$NRS_SRCDIR/$f") ;; esac; done
[ "${#srcs[@]}" -gt 0 ] || { sl_fail "$name: build" "no sources from $NRS_BUILDDIR/Makefile"; sl_done; }
grep -q -- -lslurm <<<"$libs" || libs="$libs -lslurm"
h="$sl_tmp/spank_harness"
build() { # extra cflags...
    # shellcheck disable=SC2086 # word lists
    ${cc:-cc} -std=gnu11 -g -O1 "$@" -Wl,--wrap=fork,--wrap=clock_gettime -DHAVE_CONFIG_H \
        -DNRS_SPANK_DEFAULT_RUNTIME_DIR="\"$NRS_BUILDDIR\"" \
        -DNRS_SPANK_DEFAULT_STATE_DIR="\"$sl_tmp/state\"" \
        -I"$NRS_BUILDDIR" -I"$NRS_SRCDIR/include" -I"$NRS_SRCDIR/runtime" -I"$NRS_SRCDIR/spank" $cppflags \
        -o "$h" "$NRS_SRCDIR/tests/slurm/spank_harness.c" "$NRS_SRCDIR/tests/slurm/fake_spank.c" \
        "${srcs[@]}" $libs -lm >"$sl_out" 2>&1
}
# With AddressSanitizer where the compiler has it (catches what a case only
# corrupts), else plain.
build -fsanitize=address,undefined -fno-omit-frame-pointer || build ||
    { sl_fail "$name: build" "see the compiler's output"; sl_done; }
export ASAN_OPTIONS=detect_leaks=0
# A hung-filesystem case that failed leaves its FUSE mount behind (its
# connection ended with the case): detach it before anything walks $sl_tmp.
hung_umount() { awk -v t="$sl_tmp/" 'index($2, t) == 1 { print $2 }' /proc/mounts | xargs -r -n1 umount -l; }
sl_at_exit hung_umount
for c in fifo-spawn fifo-join long-nodelist bad-nodelist has-first epilog-foreign \
    epilog-not-ours sock-link long-arg epilog-kill-ours epilog-kill-foreign hung-spec \
    hung-submit hung-jobdir hung-runtime hung-exec hint-group-hang hint-group-exit hung-state hung-state-epilog \
    hung-state-epilog-ours rm-late epilog-mount epilog-mount-jobdir epilog-mount-ctl-node \
    epilog-mount-no-nereus bounded-held long-argv log-lines hint-output spawn-held hint-held; do
    b="$sl_tmp/$c"
    mkdir -m 755 "$b"
    sl_run 40 "$h" "$c" "$b" "$NRS_BUILDDIR" "$sl_good"
    hung_umount
    what=$(grep -E '^(PASS|FAIL|SKIP): ' "$sl_out" | tail -1)
    if [ "$sl_rc" -eq 0 ] && [ "${what#PASS: }" != "$what" ]; then sl_ok "$c: ${what#PASS: }"
    elif [ "$sl_rc" -eq 77 ] && [ "${what#SKIP: }" != "$what" ]; then sl_skip "$c" "${what#SKIP: }"
    else sl_fail "$c: ${what#*: }" "exit $sl_rc"; fi
done
# shellcheck disable=SC2115 # $sl_tmp is set by lib.sh
rm -rf "$sl_tmp"/*/home # other users' files
sl_done
