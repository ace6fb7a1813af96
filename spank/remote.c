/* Remote context (slurmstepd), for a step of a job submitted with --nereus:
 *
 *   init_post_opt (root)        create the per-job directory, owned by the user
 *   user_init (as the user,     check the spec, export NEREUS_* to the tasks,
 *     in the step's cwd)        start the job's controller on the first node
 *   exit                        nothing yet
 *
 * A step without --nereus returns at the top of every hook. A failure is
 * logged and returned: Slurm then fails the step only when the plugstack
 * line says "required"; with "optional" the step runs without Nereus (we
 * export nothing after a failure). */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <slurm/slurm.h>

#include "nrs_spank.h"

typedef struct {
    uint32_t job_id, step_id, node_id;
    uid_t uid;
    gid_t gid;
    bool disabled; /* a hook failed: run the step without Nereus */
    char why[NRS_SPANK_MSG_MAX];
    char job_dir[NRS_SPANK_PATH_MAX];
    char spec[PATH_MAX];
} nrs_remote_t;

static nrs_remote_t nrs_remote;

int nrs_remote_init(spank_t sp, int ac, char **av)
{
    if (nrs_spank_options_register(sp) < 0)
        return -1;
    return nrs_spank_config_parse(ac, av);
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

/* This node's name. Several slurmd may share one host, so the host name is
 * not it, and SLURMD_NODENAME in the job's environment at this point is the
 * submitter's (a step launched from a batch script inherits the batch
 * node's). The step's node list, indexed by our relative node id, is right. */
static void nrs_remote_node_name(spank_t sp, uint32_t node_id, char *buf, size_t n)
{
    static const char *const lists[] = {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST",
                                        "SLURM_NODELIST"};
    char nodelist[8192];
    hostlist_t hl = NULL;
    char *host = NULL;

    buf[0] = '\0';
    for (size_t i = 0; i < sizeof(lists) / sizeof(lists[0]) && hl == NULL; i++)
        if (spank_getenv(sp, lists[i], nodelist, sizeof(nodelist)) == ESPANK_SUCCESS)
            hl = slurm_hostlist_create(nodelist);
    for (uint32_t i = 0; hl != NULL && i <= node_id; i++) {
        free(host);
        host = slurm_hostlist_shift(hl);
    }
    if (host != NULL)
        nrs_spank_strlcpy(buf, host, n);
    free(host);
    if (hl != NULL)
        slurm_hostlist_destroy(hl);
    if (buf[0] == '\0' && (gethostname(buf, n) != 0 || buf[0] == '\0'))
        nrs_spank_strlcpy(buf, "unknown", n);
    buf[n - 1] = '\0';
}

/* state_dir with "%n" replaced by the node name. */
static int nrs_remote_state_dir(spank_t sp, uint32_t node_id, char *out, size_t n)
{
    const char *s = nrs_spank_config.state_dir;
    char node[256];
    size_t used = 0;

    nrs_remote_node_name(sp, node_id, node, sizeof(node));
    for (; *s != '\0'; s++) {
        const char *piece = s;
        size_t len = 1;

        if (s[0] == '%' && s[1] == 'n') {
            piece = node;
            len = strlen(node);
            s++;
        }
        if (used + len >= n)
            goto fail;
        memcpy(out + used, piece, len);
        used += len;
    }
    out[used] = '\0';
    return 0;
fail:
    nrs_err("state_dir %s: expanded path too long", nrs_spank_config.state_dir);
    return -1;
}

/* mkdir -p, root-owned 0755, refusing a component others may write to: a
 * user who can write there could plant a symlink at a job's directory. */
static int nrs_mkdir_p(const char *path)
{
    char buf[NRS_SPANK_PATH_MAX];
    struct stat st;

    if (nrs_spank_strlcpy(buf, path, sizeof(buf)) < 0)
        return -1;
    for (char *p = buf + 1;; p++) {
        if (*p != '/' && *p != '\0')
            continue;
        char c = *p;
        *p = '\0';
        if (mkdir(buf, 0755) != 0 && errno != EEXIST) {
            nrs_err("state_dir: mkdir %s: %s", buf, strerror(errno));
            return -1;
        }
        *p = c;
        if (c == '\0')
            break;
    }
    if (lstat(buf, &st) != 0 || !S_ISDIR(st.st_mode)) {
        nrs_err("state_dir %s is not a directory", buf);
        return -1;
    }
    if ((st.st_mode & 022) != 0 && (st.st_mode & S_ISVTX) == 0) {
        nrs_err("state_dir %s is writable by group or others; refusing it", buf);
        return -1;
    }
    return 0;
}

/* <state_dir>/<job id>, mode 0700, owned by the job's user. Several steps of
 * one job share it; whoever comes first creates it. */
static int nrs_remote_job_dir(spank_t sp, nrs_remote_t *r)
{
    char state[NRS_SPANK_PATH_MAX];
    struct stat st;
    int n;

    if (nrs_remote_state_dir(sp, r->node_id, state, sizeof(state)) < 0 || nrs_mkdir_p(state) < 0)
        return -1;
    n = snprintf(r->job_dir, sizeof(r->job_dir), "%s/%u", state, r->job_id);
    if (n < 0 || (size_t)n >= sizeof(r->job_dir)) {
        nrs_err("job directory path too long");
        return -1;
    }
    if (mkdir(r->job_dir, 0700) == 0) {
        if (lchown(r->job_dir, r->uid, r->gid) != 0) {
            nrs_err("chown %s: %s", r->job_dir, strerror(errno));
            return -1;
        }
        return 0;
    }
    if (errno != EEXIST) {
        nrs_err("mkdir %s: %s", r->job_dir, strerror(errno));
        return -1;
    }
    if (lstat(r->job_dir, &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != r->uid) {
        nrs_err("%s exists and is not a directory of uid %u", r->job_dir, (unsigned)r->uid);
        return -1;
    }
    return 0;
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
        nrs_err("plugin misconfigured on this node: %s", nrs_spank_config.error);
        goto fail;
    }
    if (nrs_spank_opt.arg[0] == '\0') {
        nrs_err("--nereus without FILE and no default_spec on this node");
        goto fail;
    }
    if (nrs_remote_job_dir(sp, r) < 0)
        goto fail;
    return 0;
fail:
    nrs_remote_disable(r);
    return -1;
}

/* Where the job's nereus-controller will be started (next: issue 7, once per
 * job on node 0, as the user, inside the step so that Slurm's process
 * tracking reaps it; it listens in r->job_dir and runs the allocation
 * watcher). For now it only says so. */
static int nrs_remote_controller_start(spank_t sp, const nrs_remote_t *r)
{
    (void)sp;
    nrs_debug("job %u step %u: controller start not implemented yet (%s/nereus-controller, "
              "job dir %s)",
              r->job_id, r->step_id, nrs_spank_config.runtime_dir, r->job_dir);
    return 0;
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
        nrs_remote_setenv(sp, "NEREUS_RUNTIME_DIR", nrs_spank_config.runtime_dir) < 0 ||
        nrs_remote_setenv(sp, "NEREUS_POLL_INTERVAL", poll) < 0)
        return -1;
    return 0;
}

/* A step running without Nereus: drop what it inherited (a step launched from
 * a batch script gets the batch step's NEREUS_*) and tell the tasks why;
 * their stderr is the user's, slurmstepd's log is not. */
static int nrs_remote_unexport(spank_t sp, const nrs_remote_t *r)
{
    static const char *const names[] = {"NEREUS_SPEC", "NEREUS_JOB_DIR", "NEREUS_RUNTIME_DIR",
                                        "NEREUS_POLL_INTERVAL"};

    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        spank_unsetenv(sp, names[i]);
    return spank_setenv(sp, "NEREUS_ERROR", r->why, 1) == ESPANK_SUCCESS ? 0 : -1;
}

int nrs_remote_user_init(spank_t sp, int ac, char **av)
{
    nrs_remote_t *r = &nrs_remote;

    (void)ac;
    (void)av;
    if (!nrs_spank_opt.given || r->step_id == SLURM_EXTERN_CONT)
        return 0;
    if (r->disabled)
        return nrs_remote_unexport(sp, r);
    /* We run as the user in the step's working directory here: a relative
     * spec resolves as it did at submission, and the user must be able to
     * read it on this node. */
    if (realpath(nrs_spank_opt.arg, r->spec) == NULL) {
        nrs_err("job spec %s: %s", nrs_spank_opt.arg, strerror(errno));
        goto fail;
    }
    if (nrs_spank_validate_spec(r->spec) < 0 || nrs_remote_export(sp, r) < 0)
        goto fail;
    if (r->node_id == 0 && nrs_remote_controller_start(sp, r) < 0)
        goto fail;
    return 0;
fail:
    nrs_remote_disable(r);
    nrs_remote_unexport(sp, r);
    return -1;
}

int nrs_remote_exit(spank_t sp, int ac, char **av)
{
    (void)sp;
    (void)ac;
    (void)av;
    if (nrs_spank_opt.given && !nrs_remote.disabled)
        nrs_debug("job %u step %u: exit", nrs_remote.job_id, nrs_remote.step_id);
    return 0;
}
