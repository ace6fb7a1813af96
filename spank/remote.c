/* Remote context (slurmstepd), for a step of a job submitted with --nereus:
 *
 *   init_post_opt (root)        create the per-job directory, owned by the user
 *   user_init (as the user,     check the spec, export NEREUS_* to the tasks,
 *     in the step's cwd)        start the job's watcher + controller on the
 *                               job's first node, or join the one another
 *                               step runs (one at a time: flock)
 *   task_exit (root)            the step that started them: after its last
 *                               local task, stop them cleanly (SIGTERM)
 *   exit (root)                 anything of ours still there: SIGKILL
 *
 * No hint from task_exit on a released node: it runs while slurmstepd is
 * killing the step (proctrack SIGKILLs every process of the step, a helper
 * forked there too: seen on 22.05); job_epilog (slurmd.c), ~30 ms later and
 * outside the step, sends it. nrs_hint_run is here, next to the spawning of
 * the watcher, and shared with it.
 *
 * A step without --nereus returns at the top of every hook. A failure is
 * logged and returned: Slurm then fails the step only when the plugstack
 * line says "required"; with "optional" the step runs without Nereus (we
 * export nothing after a failure). */
#define _GNU_SOURCE /* pipe2, setresuid, setresgid */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <slurm/slurm.h>

#include "ctl_lock.h"

static nrs_remote_t nrs_remote;

int nrs_remote_init(spank_t sp, int ac, char **av)
{
    if (nrs_spank_options_register(sp) < 0)
        return -1;
    /* A broken config fails no step: post_opt refuses --nereus with it. */
    (void)nrs_spank_config_parse(ac, av);
    return 0;
}

static int nrs_remote_ids(spank_t sp, nrs_remote_t *r)
{
    if (spank_get_item(sp, S_JOB_ID, &r->job_id) != ESPANK_SUCCESS ||
        spank_get_item(sp, S_JOB_STEPID, &r->step_id) != ESPANK_SUCCESS ||
        spank_get_item(sp, S_JOB_NODEID, &r->node_id) != ESPANK_SUCCESS ||
        spank_get_item(sp, S_JOB_UID, &r->uid) != ESPANK_SUCCESS ||
        spank_get_item(sp, S_JOB_GID, &r->gid) != ESPANK_SUCCESS) {
        nrs_err("cannot read the job's ids from slurmstepd");
        return -1;
    }
    return 0;
}

/* The job's environment variable name, whatever its length (a node list of
 * a few thousand nodes is longer than any fixed buffer): malloc'd, or NULL
 * with *rc = ESPANK_ENV_NOEXIST (not set) or why it cannot be read.
 * spank_getenv only says ESPANK_NOSPACE, not the length: grow until it
 * fits, up to NRS_ENV_MAX. */
enum { NRS_ENV_MAX = 4 << 20 };

char *nrs_remote_getenv_dup(spank_t sp, const char *name, spank_err_t *rc)
{
    for (size_t n = 8192; n <= NRS_ENV_MAX; n *= 2) {
        char *buf = malloc(n);

        if (buf == NULL) {
            *rc = ESPANK_ERROR;
            return NULL;
        }
        *rc = spank_getenv(sp, name, buf, (int)n);
        if (*rc == ESPANK_SUCCESS)
            return buf;
        free(buf);
        if (*rc != ESPANK_NOSPACE)
            return NULL;
    }
    return NULL; /* still ESPANK_NOSPACE */
}

/* Host number idx of the first of these node lists set in the job's
 * environment (the user's to set: callers check the name) into buf (*fits:
 * it fitted; "" else), *from: the list's name. 1: found; 0: none of them is
 * set; -1: the first one set cannot be read, parsed, or has no host idx
 * (why[wn] says so): never guess from another list or the host name
 * then, which could make a node that is not the job's first start a second
 * controller. */
static int nrs_remote_list_host(spank_t sp, const char *const *lists, size_t nlists,
                                uint32_t idx, char *buf, size_t n, const char **from, bool *fits,
                                char *why, size_t wn)
{
    spank_err_t rc = ESPANK_ENV_NOEXIST;
    char *nodelist = NULL, *host = NULL;
    hostlist_t hl = NULL;
    bool found;

    buf[0] = '\0';
    *fits = true;
    *from = NULL;
    for (size_t i = 0; i < nlists && *from == NULL; i++)
        if ((nodelist = nrs_remote_getenv_dup(sp, lists[i], &rc)) != NULL ||
            rc != ESPANK_ENV_NOEXIST)
            *from = lists[i];
    if (*from == NULL)
        return 0;
    if (nodelist == NULL) {
        snprintf(why, wn, "%s is set but cannot be read (%s)", *from, spank_strerror(rc));
        return -1;
    }
    hl = slurm_hostlist_create(nodelist);
    for (uint32_t k = 0; hl != NULL && k <= idx; k++) {
        free(host);
        host = slurm_hostlist_shift(hl);
    }
    found = host != NULL;
    if (!found)
        snprintf(why, wn, "%s (%zu bytes) %s", *from, strlen(nodelist),
                 hl == NULL ? "is not a node list" : "has too few hosts");
    else if (nrs_spank_strlcpy(buf, host, n) < 0)
        *fits = false;
    free(host);
    free(nodelist);
    if (hl != NULL)
        slurm_hostlist_destroy(hl);
    buf[n - 1] = '\0';
    return found ? 1 : -1;
}

/* A node name goes into root's paths (state_dir's "%n", mkdir, chown) and
 * ctl_node: refuse anything but a plain name. 0, or -1 (logged). */
static int nrs_remote_check_node(const char *name, bool fits, const char *what, const char *from)
{
    char shown[68];
    size_t i;

    if (fits && nrs_spank_node_name_ok(name))
        return 0;
    if (!fits) {
        nrs_err("%s (from %s) is too long: refusing Nereus for this job", what, from);
        return -1;
    }
    for (i = 0; name[i] != '\0' && i < sizeof(shown) - 4; i++) /* printable, short */
        shown[i] = nrs_spank_printable_char(name[i]);
    snprintf(shown + i, sizeof(shown) - i, "%s", name[i] != '\0' ? "..." : "");
    nrs_err("%s '%s' (from %s) is not a valid node name ([A-Za-z0-9._-]+, not . or ..): "
            "refusing Nereus for this job", what, shown, from);
    return -1;
}

/* The host name, when no node list says more. */
void nrs_remote_host_name(char *buf, size_t n)
{
    if (gethostname(buf, n) != 0 || buf[0] == '\0')
        nrs_spank_strlcpy(buf, "unknown", n);
    buf[n - 1] = '\0';
}

/* This node's name. Several slurmd may share one host, so the host name is
 * not it. Slurm sets SLURMD_NODENAME to it in slurmstepd's own environment,
 * which the user does not control; the job's environment (spank_getenv) is
 * the user's, and its SLURMD_NODENAME at this point is the submitter's (a
 * step launched from a batch script inherits the batch node's). Without it
 * (another Slurm?): the step's node list, indexed by our relative node id.
 * Either way the name must be a plain node name. 0, or -1 (logged). */
static int nrs_remote_node_name(spank_t sp, uint32_t node_id, char *buf, size_t n)
{
    static const char *const lists[] = {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST",
                                        "SLURM_NODELIST"};
    const char *e = getenv("SLURMD_NODENAME"), *from = "SLURMD_NODENAME";
    char why[256];
    bool fits = true;

    if (e != NULL && e[0] != '\0') {
        fits = nrs_spank_strlcpy(buf, e, n) == 0;
    } else {
        int k = nrs_remote_list_host(sp, lists, sizeof(lists) / sizeof(lists[0]), node_id, buf,
                                     n, &from, &fits, why, sizeof(why));

        if (k < 0) {
            nrs_err("cannot tell this node's name: %s: refusing Nereus for this step", why);
            return -1;
        }
        if (k == 0) {
            from = "the host name";
            nrs_remote_host_name(buf, n);
        }
    }
    return nrs_remote_check_node(buf, fits, "this node's name", from);
}

/* The job's first node: where its controller runs, whichever step (batch
 * script, or a step on a subset of the nodes) comes first. Only the job's
 * environment says (the user's: a wrong name only points this job's
 * NEREUS_SOCKET_DIR elsewhere, but it goes into a path, so it is checked).
 * No job node list: our own step's first node. One that is set but cannot
 * be read or parsed refuses Nereus for the step rather than guess. 0, or -1
 * (logged). */
static int nrs_remote_first_node(spank_t sp, char *buf, size_t n)
{
    static const char *const lists[] = {"SLURM_JOB_NODELIST", "SLURM_NODELIST"};
    static const char *const step[] = {"SLURM_STEP_NODELIST"};
    bool fits = true;
    const char *from = NULL;
    char why[256];
    int k = nrs_remote_list_host(sp, lists, sizeof(lists) / sizeof(lists[0]), 0, buf, n, &from,
                                 &fits, why, sizeof(why));

    if (k == 0)
        k = nrs_remote_list_host(sp, step, 1, 0, buf, n, &from, &fits, why, sizeof(why));
    if (k < 0) {
        nrs_err("cannot tell the job's first node: %s: refusing Nereus for this step", why);
        return -1;
    }
    if (k == 0) {
        from = "the host name";
        nrs_remote_host_name(buf, n);
    }
    return nrs_remote_check_node(buf, fits, "the job's first node", from);
}

/* state_dir with "%n" replaced by the node name. */
int nrs_state_dir(const char *node, char *out, size_t n)
{
    if (nrs_state_dir_expand(node, out, n) == 0)
        return 0;
    nrs_err("state_dir %s: expanded path too long", nrs_spank_config.state_dir);
    return -1;
}

int nrs_state_dir_expand(const char *node, char *out, size_t n)
{
    const char *s = nrs_spank_config.state_dir;
    size_t used = 0;

    for (; *s != '\0'; s++) {
        const char *piece = s;
        size_t len = 1;

        if (s[0] == '%' && s[1] == 'n') {
            piece = node;
            len = strlen(node);
            s++;
        }
        if (used + len >= n)
            return -1;
        memcpy(out + used, piece, len);
        used += len;
    }
    out[used] = '\0';
    return 0;
}

/* Component fd of state_dir (its path so far: shown) may hold root's paths
 * to the job directories: root's, and group and others cannot write to it
 * (they could swap a job's directory, or plant a link or a future job's
 * directory); only an ancestor that existed before us may instead be a
 * sticky directory of root's (like /tmp: others may add entries, not move
 * root's). 0, or -1 with why. */
static int nrs_state_dir_check(int fd, const char *path, const char *shown, bool last, bool made,
                               char *why, size_t n)
{
    struct stat st;

    if (fstat(fd, &st) != 0) {
        snprintf(why, n, "state_dir %s: %s: %s", path, shown, strerror(errno));
        return -1;
    }
    if (st.st_uid != 0) {
        snprintf(why, n, "state_dir %s: %s is owned by uid %u, not root", path, shown,
                 (unsigned)st.st_uid);
        return -1;
    }
    if ((st.st_mode & 022) != 0 && (last || made || (st.st_mode & S_ISVTX) == 0)) {
        snprintf(why, n, "state_dir %s: %s is writable by group or others%s", path,
                 shown, last && (st.st_mode & S_ISVTX) ? " (sticky is not enough for state_dir "
                                                        "itself, only above it, like /tmp)" : "");
        return -1;
    }
    return 0;
}

/* The next component c of state_dir below fd, made if missing (create);
 * never through a link. Its fd, or -1 with why (errno ENOENT: missing). */
static int nrs_state_dir_step(int fd, const char *c, const char *path, const char *shown,
                              bool create, bool *made, char *why, size_t n)
{
    struct stat st;
    int nfd;

    *made = false;
    for (int attempt = 0; attempt < 2; attempt++) {
        nfd = openat(fd, c, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (nfd >= 0 || errno != ENOENT || !create || *made)
            break;
        if (mkdirat(fd, c, 0755) == 0)
            *made = true;
        else if (errno != EEXIST) {
            snprintf(why, n, "state_dir %s: mkdir %s: %s", path, shown, strerror(errno));
            return -1;
        }
    }
    if (nfd >= 0) {
        /* Ours: 0755 whatever the umask, so that users reach their job dirs. */
        if (*made && fchmod(nfd, 0755) != 0) {
            snprintf(why, n, "state_dir %s: chmod %s: %s", path, shown, strerror(errno));
            close(nfd);
            return -1;
        }
        return nfd;
    }
    int e = errno;

    if (e == ENOENT)
        snprintf(why, n, "state_dir %s: %s does not exist", path, shown);
    else if (fstatat(fd, c, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode))
        snprintf(why, n, "state_dir %s: %s is a symbolic link (name the real directory in "
                 "plugstack.conf)", path, shown);
    else if (e == ENOTDIR || e == ELOOP)
        snprintf(why, n, "state_dir %s: %s is not a directory", path, shown);
    else
        snprintf(why, n, "state_dir %s: %s: %s", path, shown, strerror(e));
    errno = e == ENOENT ? ENOENT : EPERM;
    return -1;
}

int nrs_state_dir_open(const char *path, bool create, char *why, size_t n)
{
    char buf[NRS_SPANK_PATH_MAX], shown[NRS_SPANK_PATH_MAX];
    size_t used = 0;
    int fd, e = EPERM;

    why[0] = '\0';
    if (path[0] != '/' || nrs_spank_strlcpy(buf, path, sizeof(buf)) < 0) {
        snprintf(why, n, "state_dir %s: not an absolute path", path);
        errno = EINVAL;
        return -1;
    }
    shown[0] = '/';
    shown[1] = '\0';
    fd = open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(why, n, "state_dir %s: /: %s", path, strerror(errno));
        goto fail;
    }
    if (nrs_state_dir_check(fd, path, "/", false, false, why, n) != 0)
        goto fail;
    for (char *c = buf, *next; *c != '\0'; c = next) {
        bool made, last;
        int nfd;

        while (*c == '/')
            c++;
        if (*c == '\0')
            break;
        next = c + strcspn(c, "/");
        if (*next != '\0')
            *next++ = '\0';
        last = next[strspn(next, "/")] == '\0';
        if (strcmp(c, ".") == 0 || strcmp(c, "..") == 0) {
            snprintf(why, n, "state_dir %s: '.' and '..' are not allowed in it", path);
            goto fail;
        }
        /* The path so far, for messages (it fits: buf does). */
        used += (size_t)snprintf(shown + used, sizeof(shown) - used, "/%s", c);
        nfd = nrs_state_dir_step(fd, c, path, shown, create, &made, why, n);
        if (nfd < 0) {
            e = errno;
            goto fail;
        }
        close(fd);
        fd = nfd;
        if (nrs_state_dir_check(fd, path, shown, last, made, why, n) != 0)
            goto fail;
        if (last)
            return fd;
    }
    snprintf(why, n, "state_dir %s: not a directory below /", path);
fail:
    if (fd >= 0)
        close(fd);
    errno = e;
    return -1;
}

/* ---- the job directory <state>/<job id> ---------------------------------------
 *
 * Made by root relative to the checked state dir's fd (nrs_state_dir_open),
 * never by path, under <state>/.lock. Several steps of one job share it;
 * whoever comes first makes it. Job ids are reused (a wrap, a reset of
 * slurmctld's state): what an earlier job left there is removed first. */
enum { NRS_LOCK_MS = 5000 };

/* <state>/.lock, root's 0600: no user can open it, so none can hold it. It
 * serializes the steps of a job starting on this node at once, from the
 * look at <state>/<job id> to its making (two first steps would both make
 * it, or one take the other's half-made one for an earlier job's); each
 * holds it for a few calls. Without flock there (r->noflock set, logged
 * once): byte 0 of NRS_NL_LOCK. fd, or -1 (logged). */
static int nrs_state_lock(int sfd, const char *state, nrs_remote_t *r)
{
    double deadline = nrs_now_ms() + NRS_LOCK_MS;
    struct stat st;
    char why[NRS_SPANK_MSG_MAX];
    int fd = openat(sfd, ".lock", O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0600);

    if (fd < 0 || fstat(fd, &st) != 0) {
        nrs_err("%s/.lock: %s", state, strerror(errno));
        goto fail;
    }
    if (!S_ISREG(st.st_mode) || st.st_uid != 0) {
        nrs_err("%s/.lock is not a regular file of root's", state);
        goto fail;
    }
    while ((r->noflock ? nrs_nl_lock(fd, F_WRLCK, 0) : flock(fd, LOCK_EX | LOCK_NB)) != 0) {
        if (!r->noflock && nrs_flock_unsupported(errno)) {
            int e = errno, nfd = nrs_nl_open(why, sizeof(why));

            if (nfd < 0) {
                nrs_err("%s/.lock: flock: %s (no flock on state_dir's filesystem), and the "
                        "node-local lock instead: %s", state, strerror(e), why);
                goto fail;
            }
            nrs_info("state_dir %s: flock: %s (none on its filesystem): this node's steps lock "
                     "in %s instead (node-local; steps on other nodes do not wait for the "
                     "job's controller)", state, strerror(e), NRS_NL_LOCK);
            close(fd);
            fd = nfd;
            r->noflock = true;
            continue;
        }
        if (errno != EWOULDBLOCK && errno != EINTR) {
            nrs_err("%s/.lock: %s", state, strerror(errno));
            goto fail;
        }
        if (nrs_now_ms() >= deadline) {
            nrs_err("%s/.lock: still taken after %d s", state, NRS_LOCK_MS / 1000);
            goto fail;
        }
        poll(NULL, 0, 10);
    }
    return fd;
fail:
    if (fd >= 0)
        close(fd);
    return -1;
}

/* <state>/<id> (st: its lstat) is this job's: a directory of the job's user
 * holding ctl_node, which the step that made it wrote before handing it
 * over. Another owner's is an earlier job's; so is one without ctl_node (an
 * ended job's: its epilog removed all but the logs). 1: this job's, 0: an
 * earlier job's, -1: cannot tell (logged). */
static int nrs_job_dir_ours(int sfd, const char *state, const char *id, const struct stat *st,
                            uid_t uid)
{
    char path[32];
    struct stat cs;

    if (!S_ISDIR(st->st_mode) || st->st_uid != uid)
        return 0;
    /* Through <id>: a directory in sfd, where only root makes entries. */
    snprintf(path, sizeof(path), "%s/ctl_node", id);
    if (fstatat(sfd, path, &cs, AT_SYMLINK_NOFOLLOW) == 0)
        return S_ISREG(cs.st_mode) ? 1 : 0;
    if (errno == ENOENT)
        return 0;
    nrs_err("%s/%s: %s", state, path, strerror(errno));
    return -1;
}

/* Move an earlier job's <state>/<id> aside, to a name no job id has, so that
 * the new one can be made at once; nrs_job_dir_remove removes it after the
 * lock. 0, or -1 (logged). */
static int nrs_job_dir_retire(int sfd, const char *state, const char *id, char *aside, size_t n)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    snprintf(aside, n, ".old-%s-%d-%ld", id, (int)getpid(), (long)ts.tv_nsec);
    if (renameat(sfd, id, sfd, aside) != 0) {
        nrs_err("%s/%s is an earlier job's and cannot be moved aside: %s", state, id,
                strerror(errno));
        aside[0] = '\0';
        return -1;
    }
    return 0;
}

/* Remove what nrs_job_dir_retire moved aside: the epilog's removal (no link
 * followed). A failure only leaves it there (logged). */
static void nrs_job_dir_remove(int sfd, const char *state, const char *aside)
{
    int fd = openat(sfd, aside, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    bool kept = false;
    int rc = fd >= 0 ? nrs_rm_below(fd, false, &kept, NRS_RM_BUDGET_MS) : 0;

    if (fd >= 0)
        close(fd);
    if (rc == NRS_RM_LATE)
        slurm_error(NRS_SPANK_PREFIX "stopped removing %s/%s (an earlier job's directory) after "
                    "%d s: the rest is left there", state, aside, NRS_RM_BUDGET_MS / 1000);
    else if (rc != 0)
        slurm_error(NRS_SPANK_PREFIX "cannot remove all of %s/%s (an earlier job's directory): "
                    "left there", state, aside);
    else if (unlinkat(sfd, aside, fd >= 0 ? AT_REMOVEDIR : 0) != 0)
        slurm_error(NRS_SPANK_PREFIX "cannot remove %s/%s (an earlier job's directory): %s",
                    state, aside, strerror(errno));
}

/* Make <state>/<id>: root's, 0700, while ctl_node (the job's first node, for
 * job_epilog, and the mark of this job's directory) is written in it; then
 * the job's user's. 0, or -1 (logged; what was made is removed). */
static int nrs_job_dir_make(int sfd, const char *state, const char *id, const nrs_remote_t *r,
                            const char *first)
{
    const char *what = "mkdir";
    int jfd = -1, fd = -1, rc = -1;

    if (mkdirat(sfd, id, 0700) != 0)
        goto fail;
    what = "open";
    jfd = openat(sfd, id, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (jfd < 0 || fchmod(jfd, 0700) != 0)
        goto fail;
    what = "write ctl_node in";
    fd = openat(jfd, "ctl_node", O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0 || dprintf(fd, "%s\n", first) < 0)
        goto fail;
    what = "chown";
    if (fchown(jfd, r->uid, r->gid) != 0)
        goto fail;
    rc = 0;
fail:
    if (rc != 0) {
        nrs_err("%s %s/%s: %s", what, state, id, strerror(errno));
        if (jfd >= 0) {
            unlinkat(jfd, "ctl_node", 0);
            unlinkat(sfd, id, AT_REMOVEDIR);
        }
    }
    if (fd >= 0)
        close(fd);
    if (jfd >= 0)
        close(jfd);
    return rc;
}

/* <state_dir>/<job id>, mode 0700, owned by the job's user, for this step. */
static int nrs_remote_job_dir(spank_t sp, nrs_remote_t *r)
{
    char state[NRS_SPANK_PATH_MAX], ctl_state[NRS_SPANK_PATH_MAX], node[256], first[256];
    char id[16], aside[64], why[NRS_SPANK_MSG_MAX];
    struct stat st;
    int n, m, sfd, lfd = -1, ours = 0, rc = -1;

    /* Both names are checked before anything is created. */
    if (nrs_remote_node_name(sp, r->node_id, node, sizeof(node)) < 0 ||
        nrs_remote_first_node(sp, first, sizeof(first)) < 0)
        return -1;
    r->ctl_here = strcmp(node, first) == 0;
    snprintf(r->node, sizeof(r->node), "%s", node);
    snprintf(r->first, sizeof(r->first), "%s", first);

    if (nrs_state_dir(node, state, sizeof(state)) < 0 ||
        nrs_state_dir(first, ctl_state, sizeof(ctl_state)) < 0)
        return -1;
    n = snprintf(r->job_dir, sizeof(r->job_dir), "%s/%u", state, r->job_id);
    m = snprintf(r->ctl_dir, sizeof(r->ctl_dir), "%s/%u", ctl_state, r->job_id);
    if (n < 0 || (size_t)n >= sizeof(r->job_dir) || m < 0 || (size_t)m >= sizeof(r->ctl_dir)) {
        nrs_err("job directory path too long");
        return -1;
    }
    snprintf(id, sizeof(id), "%u", r->job_id);
    aside[0] = '\0';
    /* Root's walk below is in-process: first a bounded look, so that a
     * state_dir on a hung mount fails this step rather than holding
     * slurmstepd. */
    if (nrs_fs_answers(state, "state_dir", why, sizeof(why)) < 0) {
        nrs_err("%s; refusing it", why);
        return -1;
    }
    sfd = nrs_state_dir_open(state, true, why, sizeof(why));
    if (sfd < 0) {
        nrs_err("%s; refusing it", why);
        return -1;
    }
    lfd = nrs_state_lock(sfd, state, r);
    if (lfd < 0)
        goto out;
    if (fstatat(sfd, id, &st, AT_SYMLINK_NOFOLLOW) == 0) {
        ours = nrs_job_dir_ours(sfd, state, id, &st, r->uid);
        if (ours < 0 || (ours == 0 && nrs_job_dir_retire(sfd, state, id, aside, sizeof(aside)) < 0))
            goto out;
        if (ours == 0)
            nrs_verbose("job %u: %s is an earlier job's (owner uid %u%s): removed, made afresh",
                        r->job_id, r->job_dir, (unsigned)st.st_uid,
                        st.st_uid == r->uid ? ", no ctl_node" : "");
    } else if (errno != ENOENT) {
        nrs_err("%s: %s", r->job_dir, strerror(errno));
        goto out;
    }
    if (ours == 0 && nrs_job_dir_make(sfd, state, id, r, first) < 0)
        goto out;
    if (r->noflock && r->ctl_here && r->nl_fd <= 0) { /* for user_init, as the user */
        r->nl_fd = nrs_nl_open(why, sizeof(why));
        if (r->nl_fd < 0) {
            nrs_err("no flock on state_dir %s's filesystem, and the node-local lock instead: %s",
                    state, why);
            r->nl_fd = 0;
            goto out;
        }
    }
    rc = 0;
out:
    if (lfd >= 0)
        close(lfd); /* the lock goes with it */
    if (aside[0] != '\0')
        nrs_job_dir_remove(sfd, state, aside);
    close(sfd);
    return rc;
}

/* Keep the first reason; the step goes on without Nereus (plugin "optional")
 * or fails (plugin "required": Slurm's decision, from our return value). */
static void nrs_remote_disable(nrs_remote_t *r)
{
    if (!r->disabled)
        nrs_spank_strlcpy(r->why, nrs_spank_last_error, sizeof(r->why));
    r->disabled = true;
    slurm_error(NRS_SPANK_PREFIX "job %u: running this step without Nereus", r->job_id);
}

/* "--nereus job.yaml cmd": the option's argument is optional, so job.yaml
 * became the command (and a bare --nereus takes default_spec, or is refused
 * at submission without one). true (logged) when the task's command looks
 * like a spec. */
static bool nrs_remote_argv_is_spec(spank_t sp)
{
    static const char *const ext[] = {".yaml", ".yml"};
    char **argv = NULL;
    int argc = 0;
    size_t l;

    if (spank_get_item(sp, S_JOB_ARGV, &argc, &argv) != ESPANK_SUCCESS || argc < 1 ||
        argv == NULL || argv[0] == NULL)
        return false;
    l = strlen(argv[0]);
    for (size_t i = 0; i < sizeof(ext) / sizeof(ext[0]); i++)
        if (l > strlen(ext[i]) && strcasecmp(argv[0] + l - strlen(ext[i]), ext[i]) == 0) {
            char cmd[260];

            /* Cut short where it is long (printable: nrs_err). */
            snprintf(cmd, sizeof(cmd), "%.256s%s", argv[0], l > 256 ? "..." : "");
            nrs_err("'--nereus FILE' takes FILE as the command; write --nereus=FILE (the "
                    "command is %s)", cmd);
            return true;
        }
    return false;
}

int nrs_remote_post_opt(spank_t sp, int ac, char **av)
{
    nrs_remote_t *r = &nrs_remote;

    (void)ac;
    (void)av;
    if (!nrs_spank_opt.given)
        return 0;
    if (nrs_remote_ids(sp, r) < 0)
        goto fail;
    if (r->step_id == SLURM_EXTERN_CONT)
        return 0; /* the extern step runs no tasks of the job */
    if (nrs_spank_config.broken) {
        nrs_err("plugstack.conf: %s (on this node)", nrs_spank_config.error);
        goto fail;
    }
    if (nrs_spank_opt.too_long) {
        nrs_err("--nereus: path longer than %d bytes", NRS_SPANK_PATH_MAX - 1);
        goto fail;
    }
    if (nrs_spank_opt.arg[0] == '\0') {
        nrs_err("--nereus without FILE and no default_spec on this node");
        goto fail;
    }
    if (nrs_spank_opt.bare && nrs_remote_argv_is_spec(sp))
        goto fail;
    if (nrs_remote_job_dir(sp, r) < 0)
        goto fail;
    return 0;
fail:
    nrs_remote_disable(r);
    return -1;
}

/* ---- the job's controller ----------------------------------------------------
 *
 * On the job's first node, the first step with --nereus forks
 * RT/nereus-watcher from slurmstepd, fully switched to the job's user; the
 * watcher starts RT/nereus-controller as its own child and then polls
 * slurmctld. Both stay descendants of this slurmstepd: no setsid, no double
 * fork, so proctrack (linuxproc: by parentage; cgroup: by cgroup) kills them
 * with the step. DIR/controller.lock (an flock held by the step that runs
 * it: ctl_lock.c) makes it one per job at a time; a later step finds the
 * lock taken and joins that controller, or waits (bounded) for its start or
 * its stop. */
int nrs_remote_path(char *out, size_t n, const char *dir, const char *name)
{
    int k = snprintf(out, n, "%s/%s", dir, name);

    if (k < 0 || (size_t)k >= n) {
        nrs_err("%s/%s: path too long", dir, name);
        return -1;
    }
    return 0;
}

double nrs_now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

int nrs_open_user_file(const char *path, int flags, mode_t mode, uid_t uid, char *why, size_t n)
{
    struct stat st;
    int fd = open(path, flags | O_NONBLOCK | O_NOFOLLOW | O_NOCTTY | O_CLOEXEC, mode), fl;

    /* ENXIO: a FIFO without a reader (O_WRONLY) or a socket: neither is one. */
    if (fd < 0 && errno == ENXIO)
        snprintf(why, n, "not a regular file of the job's user (uid %u)", (unsigned)uid);
    else if (fd < 0)
        snprintf(why, n, "%s", strerror(errno));
    if (fd < 0)
        return -1;
    if (fstat(fd, &st) != 0) {
        snprintf(why, n, "cannot stat: %s", strerror(errno));
    } else if (!S_ISREG(st.st_mode) || st.st_uid != uid) {
        snprintf(why, n, "not a regular file of the job's user (uid %u)", (unsigned)uid);
    } else if ((fl = fcntl(fd, F_GETFL)) < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
        snprintf(why, n, "fcntl: %s", strerror(errno));
    } else {
        return fd;
    }
    close(fd);
    return -1;
}

/* The forked child of slurmstepd: only async-signal-safe calls from here.
 * slurmstepd is running as the user with seteuid (real uid root): become
 * the user for good, reset signals, give it the job dir's log as stdout and
 * stderr and no other descriptor of slurmstepd, exec. */
/* In a forked child (async-signal-safe calls only): become uid/gid for good
 * with these groups, default signal handling and no blocked signal, umask
 * 077, cwd, stdin from /dev/null, stdout and stderr to out. 0, or -1 with
 * errno (EPERM: still not the user). */
static int nrs_child_become(uid_t uid, gid_t gid, const gid_t *groups, size_t ngroups,
                            const char *cwd, int out)
{
    struct sigaction sa;
    sigset_t none;
    int nul;

    if (getuid() == 0 && (seteuid(0) != 0 || setgroups(ngroups, groups) != 0 ||
                          setresgid(gid, gid, gid) != 0 || setresuid(uid, uid, uid) != 0))
        return -1;
    if (getuid() != uid || geteuid() != uid) {
        errno = EPERM;
        return -1;
    }
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = SIG_DFL;
    for (int sig = 1; sig < NSIG; sig++)
        sigaction(sig, &sa, NULL);
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    umask(077);
    if (chdir(cwd) != 0 || (nul = open("/dev/null", O_RDONLY)) < 0 || dup2(nul, 0) < 0 ||
        dup2(out, 1) < 0 || dup2(out, 2) < 0)
        return -1;
    return 0;
}

static void nrs_remote_child(const nrs_remote_t *r, const char *cwd, int logfd, int errfd,
                             const gid_t *groups, int ngroups, char *const argv[],
                             char *const envp[])
{
    int e = 0;

    if (nrs_child_become(r->uid, r->gid, groups, (size_t)ngroups, cwd, logfd) != 0)
        goto fail;
    /* Every descriptor of slurmstepd but errfd (close-on-exec), moved to 3. */
    if (errfd != 3) {
        if (dup3(errfd, 3, O_CLOEXEC) < 0)
            goto fail;
        errfd = 3;
    }
    closefrom(4);
    execve(argv[0], argv, envp);
fail:
    e = errno ? errno : EINVAL;
    if (write(errfd, &e, sizeof(e)) < 0)
        e = 0;
    _exit(127);
}

/* The groups slurmstepd has now (the user's, in user_init), however many:
 * *groups (malloc'd; NULL when none) and *n. 0, or -1 (logged). */
static int nrs_remote_groups(gid_t **groups, int *n)
{
    int k = getgroups(0, NULL);

    *groups = NULL;
    *n = 0;
    if (k > 0 && (*groups = calloc((size_t)k, sizeof(**groups))) == NULL) {
        nrs_err("getgroups: out of memory");
        return -1;
    }
    if (k > 0)
        k = getgroups(k, *groups);
    if (k < 0) {
        nrs_err("getgroups: %s", strerror(errno));
        free(*groups);
        *groups = NULL;
        return -1;
    }
    *n = k;
    return 0;
}

/* Whether the child pid has exec'd: its /proc/PID/exe can be read and is
 * not ours (self, "": unknown). Until its exec it is a copy of slurmstepd:
 * its exe is ours, or cannot be read (it has become the job's user, and a
 * process that changed its credentials may not be looked at by the user
 * until it execs: not dumpable); after, it is the program's (or a script's
 * interpreter's). The exe changes only past the exec's point of no return.
 * The link is the kernel's name of the file (d_path): no call to its
 * filesystem, so it answers while the exec waits on a hung mount. */
static bool nrs_child_execd(pid_t pid, const char *self)
{
    char path[32], exe[PATH_MAX];
    ssize_t k;

    if (self[0] == '\0')
        return false;
    snprintf(path, sizeof(path), "/proc/%d/exe", (int)pid);
    k = readlink(path, exe, sizeof(exe) - 1);
    if (k <= 0)
        return false;
    exe[k] = '\0';
    return strcmp(exe, self) != 0;
}

/* The forked watcher pid's answer on fd (O_NONBLOCK; close-on-exec at its
 * end): its exec succeeded (*e 0), or an errno (*e). Its exec is seen at
 * EOF, or (another thread of slurmstepd may have forked while the pipe was
 * open here, and that process holds the write end: no EOF) from its
 * /proc/PID/exe, looked at every NRS_EXIT_POLL_MS while it says nothing; an
 * exit without an answer is taken as EOF was (it exec'd: the caller finds
 * it gone). Waited for at most NRS_FS_WAIT_MS: its chdir into the job
 * directory and its execve of runtime_dir's program block where their
 * filesystem hangs. false: no answer. */
static bool nrs_remote_exec_wait(int fd, pid_t pid, int *e)
{
    double deadline = nrs_now_ms() + NRS_FS_WAIT_MS;
    char self[PATH_MAX];
    ssize_t sl = readlink("/proc/self/exe", self, sizeof(self) - 1);
    int pidfd = nrs_pidfd_open(pid);
    bool exited = false, answered = true;

    self[sl > 0 ? sl : 0] = '\0';
    *e = 0;
    for (;;) {
        ssize_t k = nrs_child_read(fd, pid, pidfd, &exited, e, sizeof(*e), deadline,
                                   NRS_EXIT_POLL_MS);

        if (k > 0 && k != (ssize_t)sizeof(*e))
            *e = 0; /* not an answer: as EOF */
        if (k >= 0 || (errno != EAGAIN && errno != ETIMEDOUT))
            break; /* an errno; EOF or an exit; or an error: as EOF */
        if (errno == ETIMEDOUT) {
            answered = false;
            break;
        }
        if (nrs_child_execd(pid, self))
            break;
    }
    if (pidfd >= 0)
        close(pidfd);
    return answered;
}

/* Fork and exec the watcher; its pid, or -1 with the reason logged. */
pid_t nrs_remote_spawn(spank_t sp, const nrs_remote_t *r, const char *prog)
{
    char job[16], interval[32], conf[NRS_SPANK_PATH_MAX], log[NRS_SPANK_PATH_MAX + 32];
    char env_conf[NRS_SPANK_PATH_MAX + 16], env_job[32], env_dir[NRS_SPANK_PATH_MAX + 32];
    char why[128];
    const char *sc = getenv("SLURM_CONF"); /* this node's, else the job's */
    gid_t *groups = NULL;
    int ngroups = 0, pfd[2], e = 0, logfd = -1;
    bool answered;
    char *argv[16], *envp[8];
    int a = 0, v = 0;
    pid_t pid = -1;

    conf[0] = '\0';
    if (sc != NULL && sc[0] != '\0')
        nrs_spank_strlcpy(conf, sc, sizeof(conf));
    else if (spank_getenv(sp, "SLURM_CONF", conf, sizeof(conf)) != ESPANK_SUCCESS)
        conf[0] = '\0';
    snprintf(job, sizeof(job), "%u", r->job_id);
    snprintf(interval, sizeof(interval), "%g", nrs_spank_config.poll_interval);
    snprintf(env_conf, sizeof(env_conf), "SLURM_CONF=%s", conf);
    snprintf(env_job, sizeof(env_job), "SLURM_JOB_ID=%u", r->job_id);
    snprintf(env_dir, sizeof(env_dir), "NEREUS_SOCKET_DIR=%s", r->job_dir);
    argv[a++] = (char *)prog;
    argv[a++] = "--socket-dir";
    argv[a++] = (char *)r->job_dir;
    argv[a++] = "--job";
    argv[a++] = job;
    argv[a++] = "--runtime-dir";
    argv[a++] = nrs_spank_config.runtime_dir;
    argv[a++] = "--interval";
    argv[a++] = interval;
    argv[a++] = "--tcp";
    argv[a++] = nrs_spank_config.controller_tcp;
    if (conf[0] != '\0') {
        argv[a++] = "--slurm-conf";
        argv[a++] = conf;
        envp[v++] = env_conf;
    }
    argv[a++] = (char *)r->spec;
    argv[a] = NULL;
    envp[v++] = "PATH=/usr/local/bin:/usr/bin:/bin";
    envp[v++] = env_job;
    envp[v++] = env_dir;
    envp[v] = NULL;
    if (nrs_remote_groups(&groups, &ngroups) < 0 ||
        nrs_remote_path(log, sizeof(log), r->job_dir, "watcher.log") < 0)
        goto fail;
    /* The job directory is the user's: watcher.log may be anything they made. */
    logfd = nrs_open_user_file(log, O_WRONLY | O_CREAT | O_APPEND, 0600, r->uid, why,
                               sizeof(why));
    if (logfd < 0) {
        nrs_err("%s: %s", log, why);
        goto fail;
    }
    if (pipe2(pfd, O_CLOEXEC) != 0) {
        nrs_err("pipe: %s", strerror(errno));
        goto fail;
    }
    if (fcntl(pfd[0], F_SETFL, O_NONBLOCK) != 0) { /* the read end only */
        nrs_err("fcntl: %s", strerror(errno));
        close(pfd[0]);
        close(pfd[1]);
        goto fail;
    }
    pid = fork();
    if (pid == 0)
        nrs_remote_child(r, r->job_dir, logfd, pfd[1], groups, ngroups, argv, envp);
    close(pfd[1]);
    if (pid < 0) {
        nrs_err("fork: %s", strerror(errno));
        close(pfd[0]);
        goto fail;
    }
    /* Its exec (the pipe was close-on-exec), or an int: why not. */
    answered = nrs_remote_exec_wait(pfd[0], pid, &e);
    close(pfd[0]);
    if (!answered) {
        kill(pid, SIGKILL); /* ours, not reaped: no other process has its pid */
        nrs_reap_bounded(pid, 1000, NULL);
        nrs_err("cannot run %s as uid %u: no answer within %d s (a hung filesystem under "
                "runtime_dir or the job directory?)", prog, (unsigned)r->uid,
                NRS_FS_WAIT_MS / 1000);
        pid = -1;
    } else if (e != 0) {
        /* It exits at once, but with slurmstepd's descriptors still open
         * (it failed before closefrom): bounded, as every other wait. */
        nrs_reap_bounded(pid, 1000, NULL);
        nrs_err("cannot run %s as uid %u: %s", prog, (unsigned)r->uid, strerror(e));
        pid = -1;
    }
fail:
    if (logfd >= 0)
        close(logfd);
    free(groups);
    return pid;
}

static int nrs_remote_setenv(spank_t sp, const char *name, const char *value)
{
    spank_err_t rc = spank_setenv(sp, name, value, 1);

    if (rc != ESPANK_SUCCESS) {
        nrs_err("cannot set %s: %s", name, spank_strerror(rc));
        return -1;
    }
    return 0;
}

static int nrs_remote_export(spank_t sp, const nrs_remote_t *r)
{
    char poll[32];

    snprintf(poll, sizeof(poll), "%g", nrs_spank_config.poll_interval);
    spank_unsetenv(sp, "NEREUS_ERROR"); /* inherited from a failed batch step */
    if (nrs_remote_setenv(sp, "NEREUS_SPEC", r->spec) < 0 ||
        nrs_remote_setenv(sp, "NEREUS_JOB_DIR", r->job_dir) < 0 ||
        nrs_remote_setenv(sp, "NEREUS_SOCKET_DIR", r->ctl_dir) < 0 ||
        nrs_remote_setenv(sp, "NEREUS_RUNTIME_DIR", nrs_spank_config.runtime_dir) < 0 ||
        nrs_remote_setenv(sp, "NEREUS_POLL_INTERVAL", poll) < 0 ||
        /* The controller names hosts as Slurm does (several slurmd may share
         * one machine, so gethostname() is not it). */
        (r->node[0] && nrs_remote_setenv(sp, "NEREUS_HOSTNAME", r->node) < 0))
        return -1;
    return 0;
}

/* A step running without Nereus: drop what it inherited (a step launched from
 * a batch script gets the batch step's NEREUS_*) and tell the tasks why;
 * their stderr is the user's, slurmstepd's log is not. */
static int nrs_remote_unexport(spank_t sp, const nrs_remote_t *r)
{
    static const char *const names[] = {"NEREUS_SPEC",          "NEREUS_JOB_DIR",
                                        "NEREUS_SOCKET_DIR",    "NEREUS_RUNTIME_DIR",
                                        "NEREUS_POLL_INTERVAL", "NEREUS_HOSTNAME"};

    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        spank_unsetenv(sp, names[i]);
    return spank_setenv(sp, "NEREUS_ERROR", r->why, 1) == ESPANK_SUCCESS ? 0 : -1;
}

/* The spec a relative FILE names: the submission's file, made absolute by
 * srun/sbatch/salloc (NRS_SPEC_PATH_ENV in the job's environment), if that
 * is a regular file; else FILE as given, in the step's working directory.
 * Resolved (realpath) and checked by the runtime's loader, as the user, in
 * a bounded child (nrs_bounded_call): the spec, the submission's copy or
 * the working directory may be on a hung NFS or FUSE mount. */
typedef struct {
    const char *arg;       /* FILE as given */
    const char *submitted; /* NRS_SPEC_PATH_ENV, or "" */
} nrs_spec_find_t;

/* In the child: 1 (the submission's file) or 0 (FILE) with the resolved
 * path in out, or -1 with the message. */
static int nrs_remote_spec_find(void *arg, char *out, size_t n)
{
    const nrs_spec_find_t *f = arg;
    const char *path = f->arg;
    char full[PATH_MAX];
    struct stat st;
    int from = 0;

    if (path[0] != '/' && f->submitted[0] == '/' && stat(f->submitted, &st) == 0 &&
        S_ISREG(st.st_mode)) {
        path = f->submitted;
        from = 1;
    }
    if (realpath(path, full) == NULL) {
        snprintf(out, n, "job spec %s: %s", f->arg, strerror(errno));
        return -1;
    }
    if (nrs_spank_check_spec(full, out, n) != 0)
        return -1;
    snprintf(out, n, "%s", full);
    return from;
}

/* r->spec: the step's spec, resolved and valid. 0, or -1 (logged). */
static int nrs_remote_spec(spank_t sp, nrs_remote_t *r)
{
    char submitted[PATH_MAX], out[PATH_MAX + NRS_SPANK_MSG_MAX];
    nrs_spec_find_t f = {nrs_spank_opt.arg, submitted};
    int rc;

    if (nrs_spank_opt.arg[0] == '/' ||
        spank_getenv(sp, NRS_SPEC_PATH_ENV, submitted, (int)sizeof(submitted)) != ESPANK_SUCCESS)
        submitted[0] = '\0';
    rc = nrs_bounded_call(NRS_FS_WAIT_MS, nrs_remote_spec_find, &f, out, sizeof(out));
    if (rc == NRS_BOUNDED_TIMEOUT) {
        nrs_fs_hung_why(out, sizeof(out), "job spec", nrs_spank_opt.arg);
        nrs_err("%s", out);
        return -1;
    }
    if (rc < 0 || nrs_spank_strlcpy(r->spec, out, sizeof(r->spec)) < 0) {
        nrs_err("%s", rc < 0 ? out : "job spec: resolved path too long");
        return -1;
    }
    if (rc == 1) { /* the user's paths, in root's log: printable */
        snprintf(out, sizeof(out), "job spec %.2000s: %.2000s (%s, from the submission)",
                 nrs_spank_opt.arg, r->spec, NRS_SPEC_PATH_ENV);
        nrs_spank_printable(out);
        nrs_debug("%s", out);
    }
    return 0;
}

int nrs_remote_user_init(spank_t sp, int ac, char **av)
{
    nrs_remote_t *r = &nrs_remote;

    (void)ac;
    (void)av;
    if (!nrs_spank_opt.given || r->step_id == SLURM_EXTERN_CONT)
        return 0;
    if (r->disabled) {
        /* Said again here, where it reaches the user (srun's stderr), not
         * only slurmd's log as in init_post_opt. */
        slurm_error(NRS_SPANK_PREFIX "%s (this step runs without Nereus)", r->why);
        return nrs_remote_unexport(sp, r);
    }
    /* We run as the user here, who must be able to read the spec on this
     * node, in the step's working directory (--chdir: not the submission's). */
    if (nrs_remote_spec(sp, r) < 0 || nrs_remote_export(sp, r) < 0)
        goto fail;
    if (spank_get_item(sp, S_JOB_LOCAL_TASK_COUNT, &r->tasks) != ESPANK_SUCCESS)
        r->tasks = 0;
    if (r->ctl_here && nrs_remote_controller_start(sp, r) < 0)
        goto fail;
    if (!r->ctl_here) {
        int has = nrs_remote_step_has_first(sp, r);

        if (has < 0)
            goto fail;
        if (has == 0)
            nrs_remote_controller_find(r);
    }
    return 0;
fail:
    nrs_remote_disable(r);
    nrs_remote_unexport(sp, r);
    return -1;
}

/* ---- hints from a node leaving the job ---------------------------------------
 *
 * nereus-watcher --hint (spank/watcher.c) does the work as the job's user: it
 * checks (bounded) that the controller is reachable from here and that
 * slurmctld runs the job without this node, then sends the controller the
 * release. We only run it, log what it says, and kill it at NRS_HINT_MS. */

/* Log the helper's output, one line at a time, printable: it runs as the
 * job's user and may echo what the job's controller (the user's process)
 * answered, and this is root's log. */
static void nrs_hint_log(uint32_t job_id, char *buf, size_t *len, bool flush)
{
    char *nl;

    while ((nl = memchr(buf, '\n', *len)) != NULL || (flush && *len > 0)) {
        size_t l = nl ? (size_t)(nl - buf) : *len;

        for (size_t i = 0; i < l; i++)
            buf[i] = nrs_spank_printable_char(buf[i]);
        nrs_info("job %u: %.*s", job_id, (int)l, buf);
        l += nl ? 1 : 0;
        memmove(buf, buf + l, *len - l);
        *len -= l;
    }
}

/* Wait until deadline for the hint pid to exit, without reaping it
 * (waitid WNOWAIT): true when it has. *unreaped: it is still ours to reap
 * (false only if something else reaped it: then false, status unknown). */
static bool nrs_hint_wait_exit(pid_t pid, double deadline, bool *unreaped)
{
    *unreaped = true;
    for (;;) {
        siginfo_t si;

        memset(&si, 0, sizeof(si));
        if (waitid(P_PID, (id_t)pid, &si, WEXITED | WNOHANG | WNOWAIT) == 0) {
            if (si.si_pid == pid)
                return true;
        } else if (errno != EINTR) {
            *unreaped = false; /* ECHILD */
            return false;
        }
        if (nrs_now_ms() >= deadline)
            return false;
        poll(NULL, 0, 10);
    }
}

int nrs_hint_run(uid_t uid, gid_t gid, uint32_t job_id, const char *node, const char *from,
                 const char *ctl_dir, const char *nodes, bool report_end)
{
    char prog[NRS_SPANK_PATH_MAX + 32], job[16], conf[NRS_SPANK_PATH_MAX];
    char env_conf[NRS_SPANK_PATH_MAX + 16], buf[4096];
    const char *sc = getenv("SLURM_CONF");
    double deadline = nrs_now_ms() + NRS_HINT_MS;
    char *argv[24], *envp[4];
    int a = 0, v = 0, pfd[2], st = 0, pidfd;
    size_t len = 0;
    ssize_t k;
    bool done, unreaped, exited = false;
    pid_t pid;

    if (nrs_remote_path(prog, sizeof(prog), nrs_spank_config.runtime_dir, "nereus-watcher") < 0)
        return -1;
    conf[0] = '\0';
    if (sc != NULL)
        nrs_spank_strlcpy(conf, sc, sizeof(conf));
    snprintf(job, sizeof(job), "%u", job_id);
    snprintf(env_conf, sizeof(env_conf), "SLURM_CONF=%s", conf);
    argv[a++] = prog;
    argv[a++] = "--hint";
    argv[a++] = (char *)node;
    argv[a++] = "--from";
    argv[a++] = (char *)from;
    argv[a++] = "--socket-dir";
    argv[a++] = (char *)ctl_dir;
    argv[a++] = "--job";
    argv[a++] = job;
    argv[a++] = "--timeout";
    argv[a++] = "1.8";
    if (nodes != NULL && nodes[0] != '\0') {
        argv[a++] = "--nodes";
        argv[a++] = (char *)nodes;
    }
    if (conf[0] != '\0') {
        argv[a++] = "--slurm-conf";
        argv[a++] = conf;
        envp[v++] = env_conf;
    }
    if (report_end)
        argv[a++] = "--report-end";
    argv[a] = NULL;
    envp[v++] = "PATH=/usr/local/bin:/usr/bin:/bin";
    envp[v] = NULL;
    if (pipe2(pfd, O_CLOEXEC) != 0) {
        slurm_error(NRS_SPANK_PREFIX "job %u: hint: pipe: %s", job_id, strerror(errno));
        return -1;
    }
    if (fcntl(pfd[0], F_SETFL, O_NONBLOCK) != 0) { /* ours only: the other is its stdout */
        slurm_error(NRS_SPANK_PREFIX "job %u: hint: fcntl: %s", job_id, strerror(errno));
        close(pfd[0]);
        close(pfd[1]);
        return -1;
    }
    pid = fork();
    if (pid == 0) { /* async-signal-safe calls only */
        /* A process group of its own (also set by the parent below, so that
         * it is there whichever runs first): what it starts is killed with it. */
        setpgid(0, 0);
        if (nrs_child_become(uid, gid, &gid, 1, "/", pfd[1]) != 0)
            _exit(126);
        closefrom(3);
        execve(prog, argv, envp);
        _exit(127);
    }
    close(pfd[1]);
    if (pid < 0) {
        slurm_error(NRS_SPANK_PREFIX "job %u: hint: fork: %s", job_id, strerror(errno));
        close(pfd[0]);
        return -1;
    }
    setpgid(pid, pid); /* EACCES once it has exec'd: it made its group first */
    /* Its output until it has exited and that is drained, EOF, or the
     * deadline (nrs_child_read: not at EOF alone, which a process that
     * another thread forked meanwhile, holding the pipe, would put off to
     * the deadline). */
    pidfd = nrs_pidfd_open(pid);
    while ((k = nrs_child_read(pfd[0], pid, pidfd, &exited, buf + len, sizeof(buf) - 1 - len,
                               deadline, -1)) > 0) {
        len += (size_t)k;
        nrs_hint_log(job_id, buf, &len, len == sizeof(buf) - 1);
    }
    if (pidfd >= 0)
        close(pidfd);
    nrs_hint_log(job_id, buf, &len, true);
    close(pfd[0]);
    done = nrs_hint_wait_exit(pid, deadline, &unreaped);
    /* Kill its whole process group, not only the hint: whatever it started
     * and left behind (children of a wrapper script runtime_dir has in its
     * place, anything put in the background) would otherwise go on running
     * as the job's user on a node the job has left, where no step's process
     * tracking will kill it; and at the deadline the hint itself. Only while
     * the hint is not reaped: its pid, the group's id, is then still ours,
     * so no other group can have that id. A descendant that left the group
     * (setsid, setpgid) is not reached: that would need a cgroup of its own,
     * which job_epilog has not got. */
    if (unreaped && kill(-pid, SIGKILL) != 0)
        kill(pid, SIGKILL); /* no group (setpgid failed): the hint alone */
    if (!done) {
        slurm_error(NRS_SPANK_PREFIX "job %u: hint from %s (%s): no answer within %d ms: killed "
                    "(its process group)", job_id, node, from, NRS_HINT_MS);
        if (unreaped)
            nrs_reap_bounded(pid, 1000, NULL);
        return -1;
    }
    if (unreaped)
        nrs_reap_bounded(pid, 1000, &st);
    if (WIFEXITED(st) && WEXITSTATUS(st) >= 126) {
        slurm_error(NRS_SPANK_PREFIX "job %u: hint: cannot run %s as uid %u (status %d)", job_id,
                    prog, (unsigned)uid, WEXITSTATUS(st));
        return -1;
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* After the last local task of the step that started the watcher (for a
 * batch job: the batch script, i.e. the job), stop it and the controller
 * cleanly, before slurmstepd's process tracking SIGKILLs what is left. */
int nrs_remote_task_exit(spank_t sp, int ac, char **av)
{
    nrs_remote_t *r = &nrs_remote;

    (void)sp;
    (void)ac;
    (void)av;
    if (!nrs_spank_opt.given || (r->watcher <= 0 && !r->locked))
        return 0;
    if (++r->tasks_exited >= r->tasks)
        nrs_remote_stop_watcher(r, NRS_STOP_WAIT_MS, NULL);
    return 0;
}

int nrs_remote_exit(spank_t sp, int ac, char **av)
{
    (void)sp;
    (void)ac;
    (void)av;
    if (nrs_spank_opt.given && (nrs_remote.watcher > 0 || nrs_remote.locked))
        nrs_remote_stop_watcher(&nrs_remote, 0, NULL);
    if (nrs_spank_opt.given && !nrs_remote.disabled)
        nrs_debug("job %u step %u: exit", nrs_remote.job_id, nrs_remote.step_id);
    return 0;
}
