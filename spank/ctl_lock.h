/* Nereus SPANK plugin, remote context (slurmstepd): what remote.c (the
 * step's hooks, the job directory, the watcher's fork) and ctl_lock.c (one
 * controller per job: DIR/controller.lock) share. Internal, like
 * nrs_spank.h: the version script (nereus.lds) keeps none of it exported. */
#ifndef NRS_CTL_LOCK_H
#define NRS_CTL_LOCK_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "nrs_spank.h"

/* This step, from init_post_opt to exit (one per slurmstepd: remote.c's). */
typedef struct {
    uint32_t job_id, step_id, node_id;
    uid_t uid;
    gid_t gid;
    bool disabled; /* a hook failed: run the step without Nereus */
    char why[NRS_SPANK_MSG_MAX];
    char job_dir[NRS_SPANK_PATH_MAX];
    char ctl_dir[NRS_SPANK_PATH_MAX]; /* the job dir on the controller's node */
    bool ctl_here;                    /* this node is the job's first node */
    char node[256];                   /* this node's Slurm name */
    char first[256];                  /* the job's first node (the controller's) */
    pid_t watcher;                    /* started by this step; 0: none */
    int lock_fd;                      /* DIR/controller.lock, when locked */
    bool noflock;                     /* state_dir's filesystem has no flock: */
    int nl_fd;                        /* ... the node-local lock file (root's) */
    bool locked;                      /* ... held: this step runs the controller */
    unsigned lock_seq;                /* this step's attempt in its record */
    uint32_t tasks, tasks_exited;     /* local tasks of this step */

    char spec[PATH_MAX];
} nrs_remote_t;

/* Bounds of the controller's start and stop, in ms (ctl_lock.c says how). */
enum { NRS_CTL_WAIT_MS = 10000, NRS_INIT_WAIT_MS = 20000, NRS_STOP_WAIT_MS = 3000 };

/* ---- remote.c ------------------------------------------------------------- */

/* out = "dir/name": 0, or -1 (too long, logged). */
int nrs_remote_path(char *out, size_t n, const char *dir, const char *name);
/* The host name ("unknown" without one), when no node list says more. */
void nrs_remote_host_name(char *buf, size_t n);
/* The job's environment variable name, however long: malloc'd, or NULL
 * with *rc (ESPANK_ENV_NOEXIST: not set; else why it cannot be read). */
char *nrs_remote_getenv_dup(spank_t sp, const char *name, spank_err_t *rc);
/* Open path, in a directory the job's user controls (the job directory),
 * with flags (O_RDONLY; O_WRONLY | O_CREAT | O_APPEND, mode): never blocking
 * in open() (a FIFO the user made there would hang slurmstepd for good),
 * never through a link, and only a regular file owned by uid; blocking again
 * on return. fd, or -1 with why[n]. */
int nrs_open_user_file(const char *path, int flags, mode_t mode, uid_t uid, char *why, size_t n);
/* Fork and exec the watcher prog for this step, as the job's user: its pid,
 * or -1 with the reason logged. */
pid_t nrs_remote_spawn(spank_t sp, const nrs_remote_t *r, const char *prog);

/* ---- ctl_lock.c ----------------------------------------------------------- */

/* The node-local lock file (root's), for state_dir filesystems without
 * flock: byte 0 for <state>/.lock, byte <job id> for controller.lock. */
#define NRS_NL_DIR "/run/nereus"
#define NRS_NL_LOCK NRS_NL_DIR "/lock"

/* errno e of flock says the filesystem has none. */
bool nrs_flock_unsupported(int e);
/* A new open file description of NRS_NL_LOCK (made if missing), or -1 with
 * why. As root. */
int nrs_nl_open(char *why, size_t n);
/* Byte at of NRS_NL_LOCK (fd): type F_WRLCK, F_RDLCK or F_UNLCK, never
 * waiting. 0, or -1 (errno EWOULDBLOCK: someone else holds it). */
int nrs_nl_lock(int fd, short type, off_t at);

/* On the job's first node (user_init, as the user): join the job's
 * controller, or start it. 0, or -1 (logged). */
int nrs_remote_controller_start(spank_t sp, nrs_remote_t *r);
/* On another node: wait for the first node's controller where its job
 * directory is seen; never fails the step (what it finds is logged). */
void nrs_remote_controller_find(nrs_remote_t *r);
/* The job's first node is one of this step's nodes: 1 yes (or no step node
 * list), 0 no, -1 the step's node list is set but unreadable (logged). */
int nrs_remote_step_has_first(spank_t sp, const nrs_remote_t *r);
/* Stop the watcher this step started (TERM, up to wait_ms, then KILL) and
 * let go of the lock, leaving the record "failed WHY" (why) or "stopped".
 * Bounded: a job directory that no longer answers is left as it is. */
void nrs_remote_stop_watcher(nrs_remote_t *r, int wait_ms, const char *why);

#endif
