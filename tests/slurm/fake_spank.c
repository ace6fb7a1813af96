/* A fake SPANK API, for driving the plugin's own code outside Slurm
 * (tests/slurm/spank_harness.c, built and run by test_harness.sh): the job's
 * items and environment are these globals. spank_getenv copies as Slurm's
 * does (strlcpy; ESPANK_NOSPACE when the value does not fit), the log calls
 * go to stderr as "[level] message". */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include <slurm/spank.h>

int fake_ctx = S_CTX_REMOTE;
uint32_t fake_job = 4242, fake_step = 0, fake_nodeid = 0, fake_tasks = 1;
uid_t fake_uid = 1000;
gid_t fake_gid = 1000;
struct spank_option *fake_opt;
char *fake_argv0 = "python";
static char *fake_env[64];
static int fake_nenv;

/* The harness's handles on the job's environment. */
void fake_setenv(const char *name, const char *value);
const char *fake_getenv(const char *name);

static char *fake_env_get(const char *name)
{
    size_t l = strlen(name);

    for (int i = 0; i < fake_nenv; i++)
        if (fake_env[i] != NULL && strncmp(fake_env[i], name, l) == 0 && fake_env[i][l] == '=')
            return fake_env[i] + l + 1;
    return NULL;
}

void fake_setenv(const char *name, const char *value)
{
    size_t l = strlen(name);
    char *s = malloc(l + strlen(value) + 2);

    sprintf(s, "%s=%s", name, value);
    for (int i = 0; i < fake_nenv; i++)
        if (fake_env[i] != NULL && strncmp(fake_env[i], name, l) == 0 && fake_env[i][l] == '=') {
            free(fake_env[i]);
            fake_env[i] = s;
            return;
        }
    if (fake_nenv < 64)
        fake_env[fake_nenv++] = s;
}

const char *fake_getenv(const char *name)
{
    return fake_env_get(name);
}

spank_context_t spank_context(void)
{
    return fake_ctx;
}

spank_err_t spank_option_register(spank_t sp, struct spank_option *opt)
{
    (void)sp;
    fake_opt = opt;
    return ESPANK_SUCCESS;
}

spank_err_t spank_option_getopt(spank_t sp, struct spank_option *opt, char **optarg)
{
    (void)sp;
    (void)opt;
    (void)optarg;
    return ESPANK_ERROR;
}

const char *spank_strerror(spank_err_t e)
{
    return e == ESPANK_NOSPACE ? "no space" : "spank error";
}

spank_err_t spank_get_item(spank_t sp, spank_item_t item, ...)
{
    static char *av[2];
    spank_err_t rc = ESPANK_SUCCESS;
    va_list ap;

    (void)sp;
    va_start(ap, item);
    switch (item) {
    case S_JOB_ID: *va_arg(ap, uint32_t *) = fake_job; break;
    case S_JOB_STEPID: *va_arg(ap, uint32_t *) = fake_step; break;
    case S_JOB_NODEID: *va_arg(ap, uint32_t *) = fake_nodeid; break;
    case S_JOB_UID: *va_arg(ap, uid_t *) = fake_uid; break;
    case S_JOB_GID: *va_arg(ap, gid_t *) = fake_gid; break;
    case S_JOB_LOCAL_TASK_COUNT: *va_arg(ap, uint32_t *) = fake_tasks; break;
    case S_JOB_ARGV: {
        int *c = va_arg(ap, int *);
        char ***v = va_arg(ap, char ***);

        av[0] = fake_argv0;
        *c = 1;
        *v = av;
        break;
    }
    default: rc = ESPANK_NOT_AVAIL; break;
    }
    va_end(ap);
    return rc;
}

spank_err_t spank_getenv(spank_t sp, const char *var, char *buf, int len)
{
    char *v = fake_env_get(var);

    (void)sp;
    if (v == NULL)
        return ESPANK_ENV_NOEXIST;
    snprintf(buf, (size_t)len, "%s", v);
    return strlen(v) >= (size_t)len ? ESPANK_NOSPACE : ESPANK_SUCCESS;
}

spank_err_t spank_setenv(spank_t sp, const char *var, const char *val, int overwrite)
{
    (void)sp;
    (void)overwrite;
    fake_setenv(var, val);
    return ESPANK_SUCCESS;
}

spank_err_t spank_unsetenv(spank_t sp, const char *var)
{
    (void)sp;
    (void)var;
    return ESPANK_SUCCESS;
}

spank_err_t spank_job_control_setenv(spank_t sp, const char *var, const char *val, int overwrite)
{
    (void)sp;
    (void)var;
    (void)val;
    (void)overwrite;
    return ESPANK_SUCCESS;
}

static void fake_log(const char *level, const char *fmt, va_list ap)
{
    fprintf(stderr, "[%s] ", level);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
}

#define FAKE_LOG(name, level)                                                                      \
    void name(const char *fmt, ...)                                                                \
    {                                                                                              \
        va_list ap;                                                                                \
        va_start(ap, fmt);                                                                         \
        fake_log(level, fmt, ap);                                                                  \
        va_end(ap);                                                                                \
    }
FAKE_LOG(slurm_error, "error")
FAKE_LOG(slurm_info, "info")
FAKE_LOG(slurm_verbose, "verbose")
FAKE_LOG(slurm_debug, "debug")
