/* Nereus SPANK plugin: what the per-context files share.
 *
 * spank.c dispatches every slurm_spank_* entry point on spank_context() to
 * one of: submit.c (srun = local, sbatch/salloc = allocator: the submission
 * side, same work in both), remote.c (slurmstepd; with ctl_lock.c, the
 * job's controller lock, sharing ctl_lock.h), slurmd.c (slurmd).
 * config.c parses the plugstack.conf arguments once; options.c owns the
 * option table and its callbacks. Nothing here is exported: the linker
 * version script (nereus.lds) keeps only the SPANK symbols visible.
 */
#ifndef NRS_SPANK_H
#define NRS_SPANK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <slurm/spank.h>

/* Slurm 22.05 is the oldest version we build against (Debian 12). */
#define NRS_SLURM_MIN SLURM_VERSION_NUM(22, 5, 0)
#if SLURM_VERSION_NUMBER < NRS_SLURM_MIN
#error "nereus: the SPANK plugin needs Slurm 22.05 or newer"
#endif

#define NRS_SPANK_PREFIX "nereus: "
#define nrs_info(...) slurm_info(NRS_SPANK_PREFIX __VA_ARGS__)
#define nrs_verbose(...) slurm_verbose(NRS_SPANK_PREFIX __VA_ARGS__)
#define nrs_debug(...) slurm_debug(NRS_SPANK_PREFIX __VA_ARGS__)

enum { NRS_SPANK_PATH_MAX = 4096, NRS_SPANK_MSG_MAX = 1024 };

/* slurm_error("nereus: ...") that also keeps the message, so that a step
 * running without Nereus can tell its tasks why (NEREUS_ERROR). Outside the
 * submission side (srun, sbatch, salloc) printable ASCII only
 * (nrs_spank_printable): root's log, which it may quote the user's bytes in. */
void nrs_err(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
extern char nrs_spank_last_error[NRS_SPANK_MSG_MAX];

/* plugstack.conf arguments: "key=value" words after the plugin path. */
typedef struct {
    char runtime_dir[NRS_SPANK_PATH_MAX];  /* nereus-controller and friends */
    char state_dir[NRS_SPANK_PATH_MAX];    /* per-job dirs; "%n" = node name */
    char default_spec[NRS_SPANK_PATH_MAX]; /* used by a bare --nereus */
    double poll_interval;                  /* allocation watcher, seconds */
    char controller_tcp[64];               /* HOST:PORT the controller also listens
                                            * on for ranks on other nodes; "none" */
    bool parsed;                           /* parsed once per process */
    bool broken;                           /* parse failed: refuse --nereus */
    char error[NRS_SPANK_MSG_MAX];         /* why it is broken */
} nrs_spank_config_t;

extern nrs_spank_config_t nrs_spank_config;

/* Parse argv once into nrs_spank_config. 0, or -1 with the reason kept in
 * nrs_spank_config.error (and config.broken set). Later calls return the
 * first result. A bad plugstack line must not fail or disturb jobs without
 * --nereus: the reason is logged as an error once in slurmd's context (the
 * admin's log), at debug level elsewhere; only --nereus is refused, with it. */
int nrs_spank_config_parse(int ac, char **av);
/* Reset to defaults (tests and re-init). */
void nrs_spank_config_reset(void);

/* --nereus[=FILE]: what the user asked for, filled by the option callback
 * (the last value given: sbatch's command line overrides #SBATCH). */
typedef struct {
    bool given;                     /* --nereus seen (with or without FILE) */
    bool bare;                      /* ... without FILE */
    char arg[NRS_SPANK_PATH_MAX];   /* FILE as given, or default_spec */
    bool too_long;                  /* ... FILE did not fit arg */
    char checked[NRS_SPANK_PATH_MAX]; /* last arg validated successfully */
    char abs[NRS_SPANK_PATH_MAX];   /* ... its absolute path, or "" (submission side) */
} nrs_spank_opt_t;

extern nrs_spank_opt_t nrs_spank_opt;

/* Submission side (init_post_opt): check the spec of the last --nereus
 * given, with a bound (nrs_bounded_call), and resolve it: arg and abs set,
 * NRS_SPEC_PATH_ENV exported. 0, or -1 (logged, "FILE:LINE:COL: ..." for a
 * bad spec). */
int nrs_spank_opt_check(void);

/* --nereus given to this job: in prolog/epilog context too (there Slurm
 * runs no option callback; the option is in the job's environment). */
bool nrs_spank_option_given(spank_t sp);

/* At submission a relative FILE is made absolute and handed to the job in
 * this variable of srun's/sbatch's/salloc's environment (which the job
 * inherits unless --export says otherwise), so that a step running in
 * another directory (--chdir) uses the file the user meant. */
#define NRS_SPEC_PATH_ENV "NEREUS_SPEC_PATH"

/* Register every option of the table; call from slurm_spank_init only. */
int nrs_spank_options_register(spank_t sp);

/* Validate a spec file with the runtime's loader, logging nothing (safe in
 * a forked child, nrs_bounded_call): 0, or -1 with "FILE:LINE:COL: message"
 * in why[n]. It is opened without blocking and must be a regular file (a
 * FIFO would hang the caller). */
int nrs_spank_check_spec(const char *path, char *why, size_t n);

/* ---- bounded filesystem work (bounded.c) ---------------------------------
 *
 * What slurmstepd does on a path that may be on a hung NFS or FUSE mount
 * (the job's spec, the step's working directory, runtime_dir) runs in a
 * forked child, with the caller's credentials and working directory, for at
 * most a bound; then the child is SIGKILLed and the --nereus step fails with
 * a message, instead of slurmstepd blocking in the kernel for good. */
enum {
    NRS_FS_WAIT_MS = 10000,          /* the bound of each such call */
    NRS_BOUNDED_OUT_MAX = 8192,      /* out[] of a call, at most */
    NRS_BOUNDED_TIMEOUT = -2,        /* no answer within the bound */
    NRS_BOUNDED_ERROR = -3,          /* no child (fork, pipe: out says why) */
};
/* Runs in the child: only fork-safe calls (no slurm_*, no spank_*); writes
 * its result or message into out[n] and returns its status, >= -1. */
typedef int (*nrs_bounded_fn)(void *arg, char *out, size_t n);
/* fn(arg, out, n) in a forked child, waited for at most ms (until the child
 * has exited, whoever else holds its pipe): fn's return value with out[n]
 * what it wrote, or NRS_BOUNDED_TIMEOUT (the child is SIGKILLed; out "") or
 * NRS_BOUNDED_ERROR. */
int nrs_bounded_call(int ms, nrs_bounded_fn fn, void *arg, char *out, size_t n);
/* Whether path's filesystem answers: an lstat of path in a bounded child
 * (whatever it finds). 0; or -1 with why "WHAT PATH: its filesystem did not
 * answer within 10 s (a hung NFS or FUSE mount?)". Where no child can be
 * made (fork, pipe) it tells nothing: 0. For root's paths (state_dir), walked
 * in-process afterwards: a mount that stops answering in between is not
 * covered. */
int nrs_fs_answers(const char *path, const char *what, char *why, size_t n);
/* why[n] = "WHAT PATH: its filesystem did not answer within 10 s (a hung NFS
 * or FUSE mount?)": what a bounded call that timed out on PATH says. */
void nrs_fs_hung_why(char *why, size_t n, const char *what, const char *path);
/* waitpid(pid) for at most ms (status may be NULL): a child stuck in an
 * unkillable wait is left to whoever reaps it later. */
void nrs_reap_bounded(pid_t pid, int ms, int *status);
/* A pidfd of the child pid (readable once it has exited), or -1 where the
 * kernel has none (before 5.3): then its exit is looked at every
 * NRS_EXIT_POLL_MS (waitid WNOWAIT). */
enum { NRS_EXIT_POLL_MS = 10 };
int nrs_pidfd_open(pid_t pid);
/* One read of what the unreaped child pid (pidfd: nrs_pidfd_open's) writes
 * on the pipe rfd (O_NONBLOCK), waiting at most until deadline (nrs_now_ms)
 * and, where wait_ms >= 0, at most wait_ms: bytes read (> 0); 0 when its
 * output has ended: EOF, or the child has exited (*exited set; it stays
 * unreaped) and the pipe is drained (EOF may never come: another thread's
 * fork may hold the write end); -1 with errno ETIMEDOUT (the deadline),
 * EAGAIN (wait_ms passed), or poll's or read's error. */
ssize_t nrs_child_read(int rfd, pid_t pid, int pidfd, bool *exited, void *buf, size_t n,
                       double deadline, int wait_ms);

/* Copy src into dst of size n; -1 (and dst untouched) if it does not fit. */
int nrs_spank_strlcpy(char *dst, const char *src, size_t n);

/* c as root's messages may show bytes of others' (a user's file, a
 * plugstack word): printable ASCII as it is, anything else '?'. */
char nrs_spank_printable_char(char c);
/* The same for every byte of s, in place. */
void nrs_spank_printable(char *s);

/* name can be a node name in a path (state_dir's "%n", ctl_node): one
 * component of [A-Za-z0-9._-], not "." or "..". */
bool nrs_spank_node_name_ok(const char *name);

/* Per context. Each returns 0 or -1 (with the reason logged). */
int nrs_submit_init(spank_t sp, int ac, char **av);
int nrs_submit_post_opt(spank_t sp, int ac, char **av);
int nrs_remote_init(spank_t sp, int ac, char **av);
int nrs_remote_post_opt(spank_t sp, int ac, char **av);
int nrs_remote_user_init(spank_t sp, int ac, char **av);
int nrs_remote_task_exit(spank_t sp, int ac, char **av);
int nrs_remote_exit(spank_t sp, int ac, char **av);
int nrs_slurmd_init(spank_t sp, int ac, char **av);
/* job_epilog (S_CTX_JOB_SCRIPT, root): the hint and the clean-up of this
 * node's job directory; they log failures and never fail. */
void nrs_epilog(spank_t sp, int ac, char **av);

/* ---- shared by remote.c (slurmstepd) and slurmd.c (job_epilog) ---------- */

/* state_dir with "%n" replaced by node: 0, or -1 (too long, logged). */
int nrs_state_dir(const char *node, char *out, size_t n);
/* The same, silent: -1 when it does not fit. */
int nrs_state_dir_expand(const char *node, char *out, size_t n);
/* Open the state directory path (absolute, "%n" expanded) walking it from
 * "/" with openat(O_NOFOLLOW | O_DIRECTORY): no link is followed and no
 * component is looked up again after its check. Every component must be a
 * directory of root's that group and others cannot write to; an ancestor
 * (never the state directory itself) may instead be a sticky directory of
 * root's, like /tmp. create: missing components are made (mkdirat, root,
 * 0755); else a missing one fails with errno ENOENT. The directory's fd, or
 * -1 with the reason in why[n] (nothing created below an unsafe component).
 * The same rule for slurmstepd and job_epilog. */
int nrs_state_dir_open(const char *path, bool create, char *why, size_t n);
/* Remove everything under the open directory dfd, never following a link
 * (unlinkat relative to each directory's fd, at most a few levels deep);
 * keep_logs: but the regular *.log files at the top (*kept: some were).
 * 0; -1 when something could not be removed; NRS_RM_LATE when budget_ms
 * ran out first (the rest left: root's walk is in-process, and slurmd
 * fails, and drains the node on, an epilog past its time-out). */
enum { NRS_RM_LATE = -2, NRS_RM_BUDGET_MS = 10000 };
int nrs_rm_below(int dfd, bool keep_logs, bool *kept, int budget_ms);
/* Run runtime_dir/nereus-watcher --hint NODE ... as uid/gid, in a process
 * group of its own, for at most NRS_HINT_MS, its output logged; then its
 * whole group is SIGKILLed (what it left behind; itself at the deadline):
 * its exit status, or -1 (could not run it, killed). Never blocks longer. */
enum { NRS_HINT_MS = 2000 };
int nrs_hint_run(uid_t uid, gid_t gid, uint32_t job_id, const char *node, const char *from,
                 const char *ctl_dir, const char *nodes, bool report_end);
double nrs_now_ms(void);

#endif
