/* The plugin's options: one table, registered in a loop from slurm_spank_init
 * (the only place Slurm allows it, in every context that uses them), one
 * callback each. Callbacks may fire more than once (DESIGN §8): they only
 * record the latest value, which is checked once all are given. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "nereus/spec.h"
#include "nrs_spank.h"

nrs_spank_opt_t nrs_spank_opt;

enum { NRS_OPT_NEREUS = 1 };

static int nrs_opt_nereus(int val, const char *arg, int remote);

static struct spank_option nrs_spank_options[] = {
    {"nereus", "FILE",
     "--nereus[=FILE]: adapt the TP/PP/DP layout of this RLHF job while it "
     "runs; FILE is the Nereus job spec (YAML), given with '=' (in "
     "'--nereus FILE' FILE is the command). Without FILE, the site's "
     "default_spec.",
     2, NRS_OPT_NEREUS, nrs_opt_nereus},
    SPANK_OPTIONS_TABLE_END,
};

int nrs_spank_options_register(spank_t sp)
{
    for (struct spank_option *o = nrs_spank_options; o->name != NULL; o++) {
        spank_err_t rc = spank_option_register(sp, o);

        if (rc != ESPANK_SUCCESS) {
            nrs_err("cannot register --%s: %s", o->name, spank_strerror(rc));
            return -1;
        }
    }
    return 0;
}

bool nrs_spank_option_given(spank_t sp)
{
    char *arg = NULL;

    if (nrs_spank_opt.given ||
        spank_option_getopt(sp, &nrs_spank_options[0], &arg) == ESPANK_SUCCESS)
        return true;
    /* How Slurm hands a job's plugin options to prolog and epilog. */
    return getenv("SPANK__SLURM_SPANK_OPTION_nereus_nereus") != NULL;
}

/* What a non-regular file is, for the message. */
static const char *nrs_file_kind(mode_t m)
{
    if (S_ISFIFO(m))
        return "a FIFO";
    if (S_ISDIR(m))
        return "a directory";
    if (S_ISCHR(m) || S_ISBLK(m))
        return "a device";
    if (S_ISSOCK(m))
        return "a socket";
    return "a special file";
}

int nrs_spank_check_spec(const char *path, char *why, size_t n)
{
    char err[NRS_ERR_MAX];
    nrs_spec_t *spec = calloc(1, sizeof(*spec));
    struct stat st;
    int fd = -1, rc = -1;

    if (spec == NULL) {
        snprintf(why, n, "%s: out of memory", path);
        goto out;
    }
    /* Open without blocking (a FIFO or a device would hang slurmstepd or srun
     * here for good) and read only a regular file. */
    fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(why, n, "%s:1:1: cannot open: %s", path, strerror(errno));
        goto out;
    }
    if (fstat(fd, &st) != 0) {
        snprintf(why, n, "%s:1:1: cannot stat: %s", path, strerror(errno));
        goto out;
    }
    if (!S_ISREG(st.st_mode)) {
        snprintf(why, n, "job spec %s is %s, not a regular file", path, nrs_file_kind(st.st_mode));
        goto out;
    }
    err[0] = '\0';
    if (nrs_spec_load_fd(fd, path, spec, err, sizeof(err)) != 0) {
        snprintf(why, n, "%s", err[0] ? err : "invalid job spec");
        goto out;
    }
    rc = 0;
out:
    if (fd >= 0)
        close(fd);
    free(spec);
    return rc;
}

/* The job's own spec for a relative FILE that an srun in a batch script or
 * an salloc shell inherited from the job (the option in its environment)
 * and that names no file here (another directory): the file the job was
 * submitted with (NRS_SPEC_PATH_ENV), if it is a regular file. NULL: none,
 * FILE is resolved here as given. */
static const char *nrs_opt_inherited_spec(const char *arg)
{
    const char *inherited = getenv("SLURM_SPANK__SLURM_SPANK_OPTION_nereus_nereus");
    const char *job = getenv(NRS_SPEC_PATH_ENV);
    struct stat st;

    if (arg[0] == '/' || inherited == NULL || strcmp(inherited, arg) != 0 || job == NULL ||
        job[0] != '/' || lstat(arg, &st) == 0 || errno != ENOENT)
        return NULL;
    return stat(job, &st) == 0 && S_ISREG(st.st_mode) ? job : NULL;
}

/* The submission's look at the spec, in a bounded child (nrs_bounded_call):
 * the spec, the directory it is looked up in or the job's copy may be on a
 * hung NFS or FUSE mount, where srun, sbatch or salloc would block in the
 * kernel for good, deaf to Ctrl-C. */
typedef struct {
    const char *path;    /* FILE as given, or default_spec */
    const char *checked; /* validated already: not parsed again */
} nrs_opt_look_t;

/* In the child: 1 (the job's own spec, NRS_SPEC_PATH_ENV, stands for FILE)
 * or 0 (FILE), with the spec's absolute path in out ("" where realpath
 * fails); or -1 with the message. */
static int nrs_opt_look(void *arg, char *out, size_t n)
{
    const nrs_opt_look_t *l = arg;
    const char *job = nrs_opt_inherited_spec(l->path);
    const char *path = job != NULL ? job : l->path;
    char abs[PATH_MAX];

    if (strcmp(path, l->checked) != 0 && nrs_spank_check_spec(path, out, n) != 0)
        return -1;
    snprintf(out, n, "%s", realpath(path, abs) != NULL ? abs : "");
    return job != NULL;
}

/* Submission side: o->arg the spec path (checked), o->abs its absolute path
 * ("" if unknown), which the job gets as NRS_SPEC_PATH_ENV in our own
 * environment (srun/sbatch/salloc pass it on: its steps may run in another
 * directory; never an outer job's for this one). 0, or -1 (logged). */
static int nrs_opt_submitted(nrs_spank_opt_t *o, const char *path)
{
    char out[PATH_MAX + NRS_SPANK_MSG_MAX], why[NRS_SPANK_MSG_MAX];
    nrs_opt_look_t l = {path, o->checked};
    int rc = nrs_bounded_call(NRS_FS_WAIT_MS, nrs_opt_look, &l, out, sizeof(out));

    if (rc == NRS_BOUNDED_TIMEOUT) {
        nrs_fs_hung_why(why, sizeof(why), "job spec", path);
        nrs_err("%s", why);
        return -1;
    }
    if (rc == NRS_BOUNDED_ERROR) {
        nrs_err("--nereus: cannot check the job spec %s: %s", path, out);
        return -1;
    }
    if (rc < 0) {
        nrs_err("%s", out);
        return -1;
    }
    if (rc == 1)
        path = getenv(NRS_SPEC_PATH_ENV);
    if (path == NULL || nrs_spank_strlcpy(o->arg, path, sizeof(o->arg)) < 0 ||
        nrs_spank_strlcpy(o->abs, out, sizeof(o->abs)) < 0) {
        nrs_err("--nereus: path longer than %d bytes", NRS_SPANK_PATH_MAX - 1);
        return -1;
    }
    nrs_spank_strlcpy(o->checked, o->arg, sizeof(o->checked));
    if (o->abs[0] != '\0')
        setenv(NRS_SPEC_PATH_ENV, o->abs, 1);
    else
        unsetenv(NRS_SPEC_PATH_ENV);
    return 0;
}

/* The last --nereus given (o->arg, or default_spec for a bare one), on the
 * submission side. 0, or -1 (logged). */
int nrs_spank_opt_check(void)
{
    nrs_spank_opt_t *o = &nrs_spank_opt;

    if (o->too_long) {
        nrs_err("--nereus: path longer than %d bytes", NRS_SPANK_PATH_MAX - 1);
        return -1;
    }
    if (o->arg[0] == '\0') {
        nrs_err("--nereus needs a job spec: --nereus=FILE (this cluster sets no default_spec)");
        return -1;
    }
    return nrs_opt_submitted(o, o->arg);
}

/* Slurm calls this once per value, in order: sbatch for each "#SBATCH
 * --nereus" of the script, then for its command line's, which overrides
 * them; srun for the one inherited from its job (SLURM_SPANK_... in the
 * environment), then its own. The last one is the job's, and a failure here
 * ends the submission at once, before a later value is seen: so this only
 * records the value, which is checked once all are in (submission side:
 * init_post_opt, nrs_spank_opt_check; the nodes: post_opt and user_init, as
 * the job's user; a failure here, as root, would fail the step even for an
 * "optional" plugin). Refused here only: --nereus at all with a broken
 * plugstack line, which no later value changes. */
static int nrs_opt_nereus(int val, const char *arg, int remote)
{
    nrs_spank_opt_t *o = &nrs_spank_opt;
    const char *path;

    (void)val;
    o->given = true;
    o->bare = arg == NULL || arg[0] == '\0';
    path = !o->bare ? arg : nrs_spank_config.default_spec;
    /* Said by the check: not "no FILE" (which it would look like). */
    o->too_long = nrs_spank_strlcpy(o->arg, path, sizeof(o->arg)) < 0;
    if (o->too_long)
        o->arg[0] = '\0';
    if (!remote && nrs_spank_config.broken) {
        nrs_err("plugstack.conf: %s; --nereus cannot be used until it is fixed (ask your "
                "administrator)", nrs_spank_config.error);
        return -1;
    }
    return 0;
}
