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

/* A process (other than us) whose cwd is dir or below it; *ours: it is the
 * job's nereus-watcher/controller of that dir. 0: none. */
static pid_t nrs_dir_user(const char *dir, bool *ours)
{
    size_t dl = strlen(dir);
    struct dirent *e;
    pid_t found = 0;
    DIR *proc = opendir("/proc");

    *ours = false;
    if (proc == NULL)
        return 0;
    while (found == 0 && (e = readdir(proc)) != NULL) {
        char path[64], cwd[NRS_SPANK_PATH_MAX], cmd[NRS_SPANK_PATH_MAX + 64];
        pid_t pid = (pid_t)atoi(e->d_name);
        ssize_t k;
        int fd;

        if (pid <= 0 || pid == getpid())
            continue;
        snprintf(path, sizeof(path), "/proc/%d/cwd", (int)pid);
        k = readlink(path, cwd, sizeof(cwd) - 1);
        if (k <= 0)
            continue;
        cwd[k] = '\0';
        if (strncmp(cwd, dir, dl) != 0 || (cwd[dl] != '\0' && cwd[dl] != '/'))
            continue;
        found = pid;
        snprintf(path, sizeof(path), "/proc/%d/cmdline", (int)pid);
        fd = open(path, O_RDONLY | O_CLOEXEC);
        k = fd >= 0 ? read(fd, cmd, sizeof(cmd) - 1) : -1;
        if (fd >= 0)
            close(fd);
        for (ssize_t i = 0; i < k; i++)
            if (cmd[i] == '\0')
                cmd[i] = ' ';
        cmd[k > 0 ? k : 0] = '\0';
        char want[NRS_SPANK_PATH_MAX + 64];
        for (int prog = 0; prog < 2 && !*ours; prog++) {
            snprintf(want, sizeof(want), "nereus-%s --socket-dir %s ",
                     prog ? "controller" : "watcher", dir);
            *ours = strstr(cmd, want) != NULL;
        }
    }
    closedir(proc);
    return found;
}

/* Wait (bounded) until nothing runs in dir; our own daemons still there
 * after that are killed (Slurm should have: their step ended). 0: free. */
static int nrs_dir_wait_free(uint32_t job_id, const char *dir)
{
    double deadline = nrs_now_ms() + NRS_EPILOG_WAIT_MS;
    bool ours, killed = false;
    pid_t pid;

    while ((pid = nrs_dir_user(dir, &ours)) != 0) {
        if (nrs_now_ms() >= deadline) {
            if (!ours || killed) {
                slurm_error(NRS_SPANK_PREFIX "job %u: %s still in use (pid %d): left in place",
                            job_id, dir, (int)pid);
                return -1;
            }
            slurm_error(NRS_SPANK_PREFIX "job %u: pid %d (nereus) still running in %s after the "
                        "job's steps: SIGKILL", job_id, (int)pid, dir);
            kill(pid, SIGKILL);
            killed = true;
            deadline = nrs_now_ms() + 500;
            continue;
        }
        poll(NULL, 0, 50);
    }
    return 0;
}

/* A log file the clean-up keeps: NAME.log at the top (controller.log,
 * watcher.log: the job's record of deltas and decisions, for afterwards). */
static bool nrs_keep(int dfd, const char *name, int depth)
{
    size_t l = strlen(name);
    struct stat st;

    return depth == 0 && l > 4 &&
           strcmp(name + l - 4, ".log") == 0 &&
           fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode);
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

static int nrs_rm_walk(int dfd, int depth, const struct stat *top, bool keep_logs, bool *kept)
{
    int fd = dup(dfd), rc = 0;
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    struct dirent *e;

    if (d == NULL) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        if (keep_logs && nrs_keep(dfd, e->d_name, depth)) {
            *kept = true;
            continue;
        }
        if (unlinkat(dfd, e->d_name, 0) == 0)
            continue;
        if (errno != EISDIR || depth >= NRS_RM_DEPTH) {
            rc = -1;
            continue;
        }
        int sub = openat(dfd, e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (sub < 0) {
            rc = -1;
            continue;
        }
        /* The check is on the directory opened, so a swap after it is moot. */
        if (!nrs_rm_may_enter(sub, top) || nrs_rm_walk(sub, depth + 1, top, keep_logs, kept) != 0) {
            close(sub);
            rc = -1;
            continue;
        }
        close(sub);
        if (unlinkat(dfd, e->d_name, AT_REMOVEDIR) != 0)
            rc = -1;
    }
    closedir(d);
    return rc;
}

/* Shared with remote.c (an earlier job's directory at a reused job id). */
int nrs_rm_below(int dfd, int depth, bool keep_logs, bool *kept)
{
    struct stat top;

    if (fstat(dfd, &top) != 0)
        return -1;
    return nrs_rm_walk(dfd, depth, &top, keep_logs, kept);
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
        else if (jerr != ENOENT)
            slurm_error(NRS_SPANK_PREFIX "job %u: %s: %s", job_id, dir, strerror(jerr));
        return;
    }
    if (fstat(jfd, &st) != 0 || st.st_uid != uid) {
        slurm_error(NRS_SPANK_PREFIX "job %u: %s is not a directory of uid %u: left alone", job_id,
                    dir, (unsigned)uid);
        return;
    }
    if (nrs_dir_wait_free(job_id, dir) != 0)
        return;
    rc = nrs_rm_below(jfd, 0, true, &kept);
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
    int fd = jfd >= 0 ? openat(jfd, "ctl_node", O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC)
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
    char mark[NRS_SPANK_PATH_MAX + 16];
    uint32_t job_id = 0, u32;
    uid_t uid;
    struct stat st;
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
    k = snprintf(dir, sizeof(dir), "%s/%u", state, job_id);
    if (k <= 0 || (size_t)k >= sizeof(dir) || lstat(dir, &st) != 0 || !S_ISDIR(st.st_mode) ||
        st.st_uid != uid)
        return false;
    snprintf(mark, sizeof(mark), "%s/ctl_node", dir);
    return lstat(mark, &st) == 0 && S_ISREG(st.st_mode);
}

void nrs_epilog(spank_t sp, int ac, char **av)
{
    char node[256], first[256], state[NRS_SPANK_PATH_MAX], ctl_state[NRS_SPANK_PATH_MAX];
    char dir[NRS_SPANK_PATH_MAX], ctl_dir[NRS_SPANK_PATH_MAX], id[16], why[NRS_SPANK_MSG_MAX];
    uint32_t job_id = 0, u32;
    uid_t uid;
    gid_t gid;
    bool shared;
    int k, hint = 0, sfd, jfd, jerr;

    if (!nrs_spank_option_given(sp) && !nrs_epilog_has_job_dir(sp, ac, av))
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
    sfd = nrs_state_dir_open(state, false, why, sizeof(why));
    if (sfd < 0) {
        if (errno == ENOENT)
            nrs_verbose("job %u: epilog: %s: nothing to clean", job_id, why);
        else
            slurm_error(NRS_SPANK_PREFIX "job %u: epilog: %s: no clean-up", job_id, why);
        return;
    }
    jfd = openat(sfd, id, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    jerr = jfd < 0 ? errno : 0;
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
