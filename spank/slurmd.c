/* slurmd context: parsing the arguments at start-up puts a misconfigured
 * plugstack line in the slurmd log.
 *
 * job_epilog (S_CTX_JOB_SCRIPT: a process slurmd runs as root after the
 * job's steps on this node ended; on the nodes a shrink released it runs
 * while the job goes on elsewhere), for a job with --nereus:
 *
 *   1. hint: if this node has left a job that still runs, tell its
 *      controller now (nereus-watcher --hint, as the job's user, <= 2 s;
 *      skipped, with a log line, where the controller is not reachable);
 *   2. clean-up: remove this node's job directory <state_dir>/<job id>
 *      (state_dir with %n = this node), once nothing of ours runs in it:
 *      everything but its top-level *.log files; the directory goes when
 *      nothing is kept (every node but the first, whose controller.log and
 *      watcher.log stay).
 *
 * Both log their failures and never fail the epilog (that would drain the
 * node). A job without --nereus returns at once, unless one of its steps
 * had it (a job directory of its user is here, with ctl_node): an lstat or
 * two. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <slurm/slurm.h>

#include "nrs_spank.h"

enum { NRS_EPILOG_WAIT_MS = 2000, NRS_RM_DEPTH = 16 };

int nrs_slurmd_init(spank_t sp, int ac, char **av)
{
    (void)sp;
    /* A broken config is logged here, once, and never stops slurmd. */
    (void)nrs_spank_config_parse(ac, av);
    return 0;
}


static bool nrs_env_u32(const char *name, uint32_t *out)
{
    const char *s = getenv(name);
    char *end;
    unsigned long v;

    if (s == NULL || *s == '\0')
        return false;
    errno = 0;
    v = strtoul(s, &end, 10);
    if (errno != 0 || *end != '\0' || v > UINT32_MAX)
        return false;
    *out = (uint32_t)v;
    return true;
}

/* ---- processes still in the job directory -----------------------------------
 *
 * The epilog SIGKILLs only a process that is certainly the job's own
 * nereus-watcher or nereus-controller of this job directory, checked and
 * signalled through one open /proc/PID directory (pfd): every read is of
 * that process (reads through pfd fail once it is gone, never reach a
 * process that got its pid since), and pidfd_send_signal(2) on pfd signals
 * that very process. kill(pid) after a scan could hit a new process that
 * reused the pid; the command line and working directory alone could be any
 * process's that looks alike (another user's, in a mount namespace of its
 * own, or in a job directory its owner opened up), so every uid must be the
 * job's user's as well. Without pidfd_send_signal (Linux < 5.1) nothing is
 * killed: the directory is left in place. */

/* pidfd_send_signal(pfd, sig): 0, or -1 with errno (ESRCH: gone). */
static int nrs_pidfd_kill(int pfd, int sig)
{
#ifdef SYS_pidfd_send_signal
    return (int)syscall(SYS_pidfd_send_signal, pfd, sig, NULL, 0);
#else
    (void)pfd;
    (void)sig;
    errno = ENOSYS;
    return -1;
#endif
}

/* The file name of the process pfd into buf[n], NUL-terminated: its length,
 * or -1. */
static ssize_t nrs_proc_read(int pfd, const char *name, char *buf, size_t n)
{
    int fd = openat(pfd, name, O_RDONLY | O_CLOEXEC);
    ssize_t k = 0, got = 0;

    if (fd < 0)
        return -1;
    while ((size_t)got < n - 1 && (k = read(fd, buf + got, n - 1 - (size_t)got)) > 0)
        got += k;
    close(fd);
    buf[got] = '\0';
    return k < 0 ? -1 : got;
}

/* Every uid of the process pfd (real, effective, saved, filesystem) is uid. */
static bool nrs_proc_uids_are(int pfd, uid_t uid)
{
    char buf[4096];
    const char *l;
    unsigned r, e, s, f;

    if (nrs_proc_read(pfd, "status", buf, sizeof(buf)) <= 0 ||
        (l = strstr(buf, "\nUid:")) == NULL || sscanf(l + 5, "%u %u %u %u", &r, &e, &s, &f) != 4)
        return false;
    return r == uid && e == uid && s == uid && f == uid;
}

/* The command line of pfd has "PROG --socket-dir DIR" as three arguments,
 * PROG ending in nereus-watcher or nereus-controller (a libtool wrapper runs
 * "/bin/sh .../nereus-watcher --socket-dir DIR ...", then
 * ".../lt-nereus-watcher ..."). */
static bool nrs_proc_is_daemon_of(int pfd, const char *dir)
{
    static const char *const progs[] = {"nereus-watcher", "nereus-controller"};
    static char cmd[3 * NRS_SPANK_PATH_MAX];
    const char *arg[3] = {"", "", ""};
    ssize_t k = nrs_proc_read(pfd, "cmdline", cmd, sizeof(cmd));

    for (const char *c = cmd; k > 0 && c < cmd + k; c += strlen(c) + 1) {
        arg[0] = arg[1];
        arg[1] = arg[2];
        arg[2] = c;
        if (strcmp(arg[1], "--socket-dir") != 0 || strcmp(arg[2], dir) != 0)
            continue;
        for (size_t i = 0; i < sizeof(progs) / sizeof(progs[0]); i++) {
            size_t l = strlen(arg[0]), pl = strlen(progs[i]);

            if (l >= pl && strcmp(arg[0] + l - pl, progs[i]) == 0)
                return true;
        }
    }
    return false;
}

/* The process pfd is certainly the job's own daemon of dir (jst: dir's
 * fstat): all its uids the job's user's, its command line one of ours for
 * dir, and its working directory that very directory (the inode, not a path
 * that reads alike). */
static bool nrs_proc_is_ours(int pfd, const char *dir, const struct stat *jst, uid_t uid)
{
    struct statx sx;

    /* the cwd's attributes from the cache: a cwd in a FUSE mount of the
     * user's would ask its daemon, which may never answer */
    return nrs_proc_uids_are(pfd, uid) && nrs_proc_is_daemon_of(pfd, dir) &&
           statx(pfd, "cwd", AT_NO_AUTOMOUNT | AT_STATX_DONT_SYNC, STATX_INO, &sx) == 0 &&
           makedev(sx.stx_dev_major, sx.stx_dev_minor) == jst->st_dev &&
           sx.stx_ino == jst->st_ino;
}

typedef struct {
    int others;   /* processes in dir not certainly ours (they keep it) */
    int ours;     /* the job's own watcher/controller there */
    pid_t first;  /* one of them, an other if any: for the message */
} nrs_dir_users_t;

/* Every process (but us) whose working directory is dir or below it. With
 * do_kill: SIGKILL those that are certainly ours, through their pfd. */
static void nrs_dir_users(uint32_t job_id, const char *dir, const struct stat *jst, uid_t uid,
                          bool do_kill, nrs_dir_users_t *u)
{
    size_t dl = strlen(dir);
    DIR *proc = opendir("/proc");
    struct dirent *e;

    memset(u, 0, sizeof(*u));
    if (proc == NULL)
        return;
    while ((e = readdir(proc)) != NULL) {
        char cwd[NRS_SPANK_PATH_MAX];
        pid_t pid = (pid_t)atoi(e->d_name);
        ssize_t k;
        int pfd;

        if (pid <= 0 || pid == getpid())
            continue;
        pfd = openat(dirfd(proc), e->d_name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (pfd < 0)
            continue;
        k = readlinkat(pfd, "cwd", cwd, sizeof(cwd) - 1);
        if (k > 0)
            cwd[k] = '\0';
        if (k <= 0 || strncmp(cwd, dir, dl) != 0 || (cwd[dl] != '\0' && cwd[dl] != '/')) {
            close(pfd);
            continue;
        }
        if (!nrs_proc_is_ours(pfd, dir, jst, uid)) {
            if (u->others++ == 0)
                u->first = pid;
        } else {
            if (u->ours++ == 0 && u->others == 0)
                u->first = pid;
            if (do_kill && nrs_pidfd_kill(pfd, SIGKILL) == 0)
                slurm_error(NRS_SPANK_PREFIX "job %u: pid %d (nereus, uid %u) still running in %s "
                            "after the job's steps: SIGKILL", job_id, (int)pid, (unsigned)uid, dir);
            else if (do_kill && errno != ESRCH)
                slurm_error(NRS_SPANK_PREFIX "job %u: pid %d (nereus) still running in %s: not "
                            "killed (pidfd_send_signal: %s)", job_id, (int)pid, dir,
                            strerror(errno));
        }
        close(pfd);
    }
    closedir(proc);
}

/* Wait (bounded) until nothing runs in dir (jfd: its fd); the job's own
 * daemons still there after that are killed (Slurm should have: their step
 * ended), anything else keeps it. 0: free. */
static int nrs_dir_wait_free(uint32_t job_id, uid_t uid, int jfd, const char *dir)
{
    double deadline = nrs_now_ms() + NRS_EPILOG_WAIT_MS;
    bool killed = false;
    nrs_dir_users_t u;
    struct stat jst;

    if (fstat(jfd, &jst) != 0)
        return -1;
    for (;;) {
        nrs_dir_users(job_id, dir, &jst, uid, false, &u);
        if (u.others + u.ours == 0)
            return 0;
        if (nrs_now_ms() < deadline) {
            poll(NULL, 0, 50);
            continue;
        }
        if (u.others > 0 || killed) {
            slurm_error(NRS_SPANK_PREFIX "job %u: %s still in use (pid %d%s): left in place",
                        job_id, dir, (int)u.first,
                        u.others > 0 ? ", not the job's nereus daemon" : "");
            return -1;
        }
        nrs_dir_users(job_id, dir, &jst, uid, true, &u);
        killed = true;
        deadline = nrs_now_ms() + 500;
    }
}

/* statx of name in dfd ("" with AT_EMPTY_PATH: dfd itself) from what the
 * kernel has cached, asking no filesystem daemon: the user may have mounted
 * a FUSE filesystem (allow_other) on an entry of their job directory, and
 * a stat that crosses into it waits for its daemon, which may never answer
 * (root's epilog would hang until slurmd's time-out drains the node). 0 or
 * -1. */
static int nrs_statx_cached(int dfd, const char *name, int flags, struct statx *sx)
{
    return statx(dfd, name, flags | AT_SYMLINK_NOFOLLOW | AT_NO_AUTOMOUNT | AT_STATX_DONT_SYNC,
                 STATX_BASIC_STATS, sx);
}

/* A log file the clean-up keeps: NAME.log at the top (controller.log,
 * watcher.log: the job's record of deltas and decisions, for afterwards). */
static bool nrs_keep(int dfd, const char *name, int depth)
{
    size_t l = strlen(name);
    struct statx sx;

    return depth == 0 && l > 4 &&
           strcmp(name + l - 4, ".log") == 0 &&
           nrs_statx_cached(dfd, name, 0, &sx) == 0 && S_ISREG(sx.stx_mode);
}

/* name in dfd opened with flags (O_RDONLY | O_DIRECTORY for a directory,
 * else a regular file) only if it is on dev, dfd's filesystem, so not a
 * mount point of the user's: it is pinned first with an O_PATH descriptor
 * (which calls no filesystem's open, follows no link) and checked from the
 * cache, so that a mount point's daemon is never asked; then that very
 * inode is opened. fd, or -1 with errno (EXDEV: a mount point; ENOTDIR or
 * ELOOP: not the kind asked for). */
static int nrs_open_here(int dfd, const char *name, int flags, dev_t dev)
{
    bool want_dir = (flags & O_DIRECTORY) != 0;
    int at = openat(dfd, name, O_PATH | O_NOFOLLOW | O_CLOEXEC | (want_dir ? O_DIRECTORY : 0));
    int fd = -1, e = EXDEV;
    struct statx sx;
    char self[64];

    if (at < 0)
        return -1;
    if (nrs_statx_cached(at, "", AT_EMPTY_PATH, &sx) != 0) {
        e = errno;
    } else if (makedev(sx.stx_dev_major, sx.stx_dev_minor) != dev) {
        e = EXDEV;
    } else if (want_dir) {
        fd = openat(at, ".", flags | O_CLOEXEC);
        e = errno;
    } else if (!S_ISREG(sx.stx_mode)) {
        e = S_ISLNK(sx.stx_mode) ? ELOOP : EINVAL;
    } else {
        snprintf(self, sizeof(self), "/proc/self/fd/%d", at);
        fd = open(self, flags | O_CLOEXEC);
        e = errno;
    }
    close(at);
    errno = e;
    return fd;
}

/* A subdirectory (sub: its fd) root's clean-up may go into: one of the
 * owner of the directory it started from (the job's user) on the same
 * filesystem. Whatever else the user put in their job directory (another
 * user's directory they may rename, a mount point) is left alone: root
 * must not remove what the user could not, nor wait for a FUSE mount. */
static bool nrs_rm_may_enter(int sub, const struct stat *top)
{
    struct stat st;

    return fstat(sub, &st) == 0 && st.st_uid == top->st_uid && st.st_dev == top->st_dev;
}

/* One removal: the rule for subdirectories (top), what to keep, and when
 * to stop. */
typedef struct {
    struct stat top;
    bool keep_logs, *kept, late;
    double deadline;
} nrs_rm_t;

static int nrs_rm_walk(nrs_rm_t *rm, int dfd, int depth)
{
    int fd = dup(dfd), rc = 0;
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    struct dirent *e;

    if (d == NULL) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    rewinddir(d); /* the dup shares dfd's offset: an earlier walk's */
    while (!rm->late && (e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        if (nrs_now_ms() >= rm->deadline) {
            rm->late = true;
            break;
        }
        if (rm->keep_logs && nrs_keep(dfd, e->d_name, depth)) {
            *rm->kept = true;
            continue;
        }
        if (unlinkat(dfd, e->d_name, 0) == 0)
            continue;
        if (errno != EISDIR || depth >= NRS_RM_DEPTH) {
            rc = -1;
            continue;
        }
        int sub = nrs_open_here(dfd, e->d_name, O_RDONLY | O_DIRECTORY, rm->top.st_dev);
        if (sub < 0) {
            rc = -1;
            continue;
        }
        /* The check is on the directory opened, so a swap after it is moot. */
        if (!nrs_rm_may_enter(sub, &rm->top) || nrs_rm_walk(rm, sub, depth + 1) != 0) {
            close(sub);
            rc = -1;
            continue;
        }
        close(sub);
        if (unlinkat(dfd, e->d_name, AT_REMOVEDIR) != 0)
            rc = -1;
    }
    closedir(d);
    return rm->late ? -1 : rc;
}

/* Shared with remote.c (an earlier job's directory at a reused job id). */
int nrs_rm_below(int dfd, bool keep_logs, bool *kept, int budget_ms)
{
    nrs_rm_t rm = {.keep_logs = keep_logs, .kept = kept, .deadline = nrs_now_ms() + budget_ms};
    int rc;

    if (fstat(dfd, &rm.top) != 0)
        return -1;
    rc = nrs_rm_walk(&rm, dfd, 0);
    return rm.late ? NRS_RM_LATE : rc;
}

/* <state>/<job id> (jfd: opened in the checked state dir sfd, no link
 * followed; jerr: why not), made by the plugin (remote.c
 * nrs_remote_job_dir): a real directory of the job's user. Anything else is
 * left alone. */
static void nrs_epilog_cleanup(uint32_t job_id, uid_t uid, int sfd, int jfd, int jerr,
                               const char *id, const char *dir)
{
    struct stat st;
    bool kept = false;
    int rc;

    if (jfd < 0) {
        if (jerr == ELOOP || jerr == ENOTDIR)
            slurm_error(NRS_SPANK_PREFIX "job %u: %s is not a directory of uid %u: left alone",
                        job_id, dir, (unsigned)uid);
        else if (jerr == EXDEV)
            slurm_error(NRS_SPANK_PREFIX "job %u: %s is a mount point (another filesystem): "
                        "left alone", job_id, dir);
        else if (jerr != ENOENT)
            slurm_error(NRS_SPANK_PREFIX "job %u: %s: %s", job_id, dir, strerror(jerr));
        return;
    }
    if (fstat(jfd, &st) != 0 || st.st_uid != uid) {
        slurm_error(NRS_SPANK_PREFIX "job %u: %s is not a directory of uid %u: left alone", job_id,
                    dir, (unsigned)uid);
        return;
    }
    if (nrs_dir_wait_free(job_id, uid, jfd, dir) != 0)
        return;
    rc = nrs_rm_below(jfd, true, &kept, NRS_RM_BUDGET_MS);
    if (rc == NRS_RM_LATE) {
        slurm_error(NRS_SPANK_PREFIX "job %u: stopped removing %s after %d s (so many files "
                    "that slurmd's epilog time-out could drain the node): the rest is left there",
                    job_id, dir, NRS_RM_BUDGET_MS / 1000);
        return;
    }
    if (rc == 0 && kept) {
        nrs_verbose("job %u: cleaned %s (its *.log kept)", job_id, dir);
        return;
    }
    if (rc != 0) {
        slurm_error(NRS_SPANK_PREFIX "job %u: cannot remove all of %s (left: what could not be "
                    "removed, and any directory in it not of uid %u or on another filesystem)",
                    job_id, dir, (unsigned)uid);
        return;
    }
    if (unlinkat(sfd, id, AT_REMOVEDIR) != 0) {
        slurm_error(NRS_SPANK_PREFIX "job %u: cannot remove %s: %s", job_id, dir, strerror(errno));
        return;
    }
    nrs_verbose("job %u: removed %s", job_id, dir);
}

/* The job's first node, where its controller runs: the epilog's
 * environment does not say (SLURM_NODELIST holds this epilog's nodes), so
 * remote.c notes it in the job directory jfd as ctl_node. A node name or ""
 * (none, or not one). */
static void nrs_epilog_first_node(int jfd, char *out, size_t n)
{
    ssize_t k = -1;
    struct stat js;
    int fd = jfd >= 0 && fstat(jfd, &js) == 0 ? nrs_open_here(jfd, "ctl_node", O_RDONLY | O_NONBLOCK,
                                                               js.st_dev)
                                              : -1;

    if (fd >= 0) {
        k = read(fd, out, n - 1);
        close(fd);
    }
    out[k > 0 ? k : 0] = '\0';
    out[strcspn(out, "\n")] = '\0';
    if (!nrs_spank_node_name_ok(out))
        out[0] = '\0';
}

/* This node's name (slurmd's SLURMD_NODENAME, else the host name) into
 * node[n]: 0, or -1 (logged unless quiet) when it does not fit or is no
 * plain node name (it goes into root's paths). */
static int nrs_epilog_node_name(uint32_t job_id, char *node, size_t n, bool quiet)
{
    const char *e = getenv("SLURMD_NODENAME");

    if (e != NULL && *e != '\0') {
        if (nrs_spank_strlcpy(node, e, n) < 0) {
            if (!quiet)
                slurm_error(NRS_SPANK_PREFIX "job %u: epilog: SLURMD_NODENAME longer than %zu "
                            "bytes", job_id, n - 1);
            return -1;
        }
    } else if (gethostname(node, n) != 0) {
        return -1;
    }
    node[n - 1] = '\0';
    if (!nrs_spank_node_name_ok(node)) {
        if (!quiet)
            slurm_error(NRS_SPANK_PREFIX "job %u: epilog: node name '%.64s' is not a plain node "
                        "name", job_id, node);
        return -1;
    }
    return 0;
}

/* A job whose allocation had no --nereus may still have run steps with it
 * (sbatch job.sh, whose sruns say --nereus): those left a job directory here,
 * the job's user's, with ctl_node in it (remote.c nrs_job_dir_make). Anything
 * else at <state>/<job id> is not this job's: the logs an earlier job of
 * that id left on its first node (a job-id wrap; its epilog removed
 * ctl_node), another user's. For the others this costs an lstat or two and
 * says nothing. */
static bool nrs_epilog_has_job_dir(spank_t sp, int ac, char **av)
{
    char node[256], state[NRS_SPANK_PATH_MAX], dir[NRS_SPANK_PATH_MAX];
    char mark[NRS_SPANK_PATH_MAX + 16], why[NRS_SPANK_MSG_MAX];
    uint32_t job_id = 0, u32;
    uid_t uid;
    struct statx ss, st, sm;
    int k;

    if (nrs_spank_config_parse(ac, av) != 0)
        return false;
    if (spank_get_item(sp, S_JOB_ID, &job_id) != ESPANK_SUCCESS &&
        !nrs_env_u32("SLURM_JOB_ID", &job_id))
        return false;
    if (nrs_epilog_node_name(job_id, node, sizeof(node), true) < 0 ||
        nrs_state_dir_expand(node, state, sizeof(state)) < 0)
        return false;
    if (spank_get_item(sp, S_JOB_UID, &uid) != ESPANK_SUCCESS) {
        if (!nrs_env_u32("SLURM_JOB_UID", &u32))
            return false;
        uid = (uid_t)u32;
    }
    /* Every job's epilog comes here: a state_dir on a hung mount must not
     * hold it (the node would drain), so a bounded look first. */
    if (nrs_fs_answers(state, "state_dir", why, sizeof(why)) < 0) {
        slurm_error(NRS_SPANK_PREFIX "job %u: epilog: %s: cannot tell whether the job ran steps "
                    "with --nereus here; no clean-up", job_id, why);
        return false;
    }
    /* from the cache only, and no further than a mount point of the user's
     * on the job directory or on ctl_node (its daemon may never answer) */
    k = snprintf(dir, sizeof(dir), "%s/%u", state, job_id);
    if (k <= 0 || (size_t)k >= sizeof(dir) ||
        statx(AT_FDCWD, state, AT_NO_AUTOMOUNT | AT_STATX_DONT_SYNC, STATX_BASIC_STATS, &ss) != 0 ||
        nrs_statx_cached(AT_FDCWD, dir, 0, &st) != 0 || !S_ISDIR(st.stx_mode) ||
        st.stx_uid != uid || st.stx_dev_major != ss.stx_dev_major ||
        st.stx_dev_minor != ss.stx_dev_minor)
        return false;
    snprintf(mark, sizeof(mark), "%s/ctl_node", dir);
    return nrs_statx_cached(AT_FDCWD, mark, 0, &sm) == 0 && S_ISREG(sm.stx_mode) &&
           sm.stx_dev_major == st.stx_dev_major && sm.stx_dev_minor == st.stx_dev_minor;
}

void nrs_epilog(spank_t sp, int ac, char **av)
{
    char node[256], first[256], state[NRS_SPANK_PATH_MAX], ctl_state[NRS_SPANK_PATH_MAX];
    char dir[NRS_SPANK_PATH_MAX], ctl_dir[NRS_SPANK_PATH_MAX], id[16], why[NRS_SPANK_MSG_MAX];
    uint32_t job_id = 0, u32;
    uid_t uid;
    gid_t gid;
    bool shared, given = nrs_spank_option_given(sp);
    int k, hint = 0, sfd, jfd, jerr;

    /* Without --nereus, has_job_dir has had its bounded look at state_dir. */
    if (!given && !nrs_epilog_has_job_dir(sp, ac, av))
        return;
    /* Slurm calls no slurm_spank_init in this context: parse here (once). */
    if (nrs_spank_config_parse(ac, av) != 0) {
        slurm_error(NRS_SPANK_PREFIX "epilog: plugstack.conf: %s", nrs_spank_config.error);
        return;
    }
    if (spank_get_item(sp, S_JOB_ID, &job_id) != ESPANK_SUCCESS &&
        !nrs_env_u32("SLURM_JOB_ID", &job_id)) {
        slurm_error(NRS_SPANK_PREFIX "epilog: no job id");
        return;
    }
    if (spank_get_item(sp, S_JOB_UID, &uid) != ESPANK_SUCCESS) {
        if (!nrs_env_u32("SLURM_JOB_UID", &u32)) {
            slurm_error(NRS_SPANK_PREFIX "job %u: epilog: no uid", job_id);
            return;
        }
        uid = (uid_t)u32;
    }
    if (spank_get_item(sp, S_JOB_GID, &gid) != ESPANK_SUCCESS) {
        gid = nrs_env_u32("SLURM_JOB_GID", &u32) ? (gid_t)u32 : (gid_t)-1;
    }
    if (nrs_epilog_node_name(job_id, node, sizeof(node), false) < 0 ||
        nrs_state_dir(node, state, sizeof(state)) < 0)
        return;
    k = snprintf(dir, sizeof(dir), "%s/%u", state, job_id);
    if (k < 0 || (size_t)k >= sizeof(dir))
        return;
    snprintf(id, sizeof(id), "%u", job_id);
    /* The steps' rule (remote.c): an unsafe state dir is left alone, job
     * directory, ctl_node and all; a missing one holds nothing of the job. */
    if (given && nrs_fs_answers(state, "state_dir", why, sizeof(why)) < 0) {
        slurm_error(NRS_SPANK_PREFIX "job %u: epilog: %s: no clean-up", job_id, why);
        return;
    }
    sfd = nrs_state_dir_open(state, false, why, sizeof(why));
    if (sfd < 0) {
        if (errno == ENOENT)
            nrs_verbose("job %u: epilog: %s: nothing to clean", job_id, why);
        else
            slurm_error(NRS_SPANK_PREFIX "job %u: epilog: %s: no clean-up", job_id, why);
        return;
    }
    {
        struct stat ss;
        jfd = fstat(sfd, &ss) == 0 ? nrs_open_here(sfd, id, O_RDONLY | O_DIRECTORY, ss.st_dev) : -1;
        jerr = jfd < 0 ? errno : 0;
    }
    /* A state_dir without %n may be one directory shared by every node: only
     * the job's final epilog (the job no longer runs) may remove it. */
    shared = strstr(nrs_spank_config.state_dir, "%n") == NULL;
    nrs_epilog_first_node(jfd, first, sizeof(first));
    /* The job's first node is never released (it holds the controller):
     * its epilog is the job's end, no hint. */
    if (first[0] != '\0' && strcmp(first, node) != 0 && gid != (gid_t)-1 &&
        nrs_state_dir(first, ctl_state, sizeof(ctl_state)) == 0 &&
        (k = snprintf(ctl_dir, sizeof(ctl_dir), "%s/%u", ctl_state, job_id)) > 0 &&
        (size_t)k < sizeof(ctl_dir))
        hint = nrs_hint_run(uid, gid, job_id, node, "job_epilog", ctl_dir, getenv("SLURM_NODELIST"),
                            shared);
    if (shared && (first[0] == '\0' || (strcmp(first, node) != 0 && hint != 3)))
        nrs_verbose("job %u: %s may be shared with nodes still running the job: kept", job_id,
                    dir);
    else
        nrs_epilog_cleanup(job_id, uid, sfd, jfd, jerr, id, dir);
    if (jfd >= 0)
        close(jfd);
    close(sfd);
}
