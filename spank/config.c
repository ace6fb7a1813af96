/* plugstack.conf arguments, parsed once per process into one struct.
 *
 *   optional /usr/lib/slurm/nereus.so runtime_dir=/usr/bin \
 *       state_dir=/var/lib/nereus/%n poll_interval=2 default_spec=/etc/nereus/job.yaml
 *
 * Unknown keys are rejected: a typo must not silently fall back to a default. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nrs_spank.h"

#ifndef NRS_SPANK_DEFAULT_RUNTIME_DIR
#define NRS_SPANK_DEFAULT_RUNTIME_DIR "/usr/bin"
#endif
#ifndef NRS_SPANK_DEFAULT_STATE_DIR
#define NRS_SPANK_DEFAULT_STATE_DIR "/var/lib/nereus"
#endif

nrs_spank_config_t nrs_spank_config;

typedef enum { NRS_ARG_PATH, NRS_ARG_SECONDS, NRS_ARG_HOSTPORT } nrs_arg_kind_t;

typedef struct {
    const char *key;
    nrs_arg_kind_t kind;
    size_t off;
} nrs_arg_t;

#define ARG(k, kind, f) {k, kind, offsetof(nrs_spank_config_t, f)}
static const nrs_arg_t nrs_args[] = {
    ARG("runtime_dir", NRS_ARG_PATH, runtime_dir),
    ARG("state_dir", NRS_ARG_PATH, state_dir),
    ARG("default_spec", NRS_ARG_PATH, default_spec),
    ARG("poll_interval", NRS_ARG_SECONDS, poll_interval),
    ARG("controller_tcp", NRS_ARG_HOSTPORT, controller_tcp),
};
#define NRS_NARGS (sizeof(nrs_args) / sizeof(nrs_args[0]))

int nrs_spank_strlcpy(char *dst, const char *src, size_t n)
{
    size_t len = strlen(src);

    if (len >= n)
        return -1;
    memcpy(dst, src, len + 1);
    return 0;
}

char nrs_spank_printable_char(char c)
{
    return (unsigned char)c >= 0x20 && (unsigned char)c < 0x7f ? c : '?';
}

void nrs_spank_printable(char *s)
{
    for (; *s != '\0'; s++)
        *s = nrs_spank_printable_char(*s);
}

bool nrs_spank_node_name_ok(const char *name)
{
    if (name == NULL || name[0] == '\0' || strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
        return false;
    for (const char *c = name; *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
              *c == '-' || *c == '_' || *c == '.'))
            return false;
    return true;
}

void nrs_spank_config_reset(void)
{
    memset(&nrs_spank_config, 0, sizeof(nrs_spank_config));
    nrs_spank_strlcpy(nrs_spank_config.runtime_dir, NRS_SPANK_DEFAULT_RUNTIME_DIR,
                      sizeof(nrs_spank_config.runtime_dir));
    nrs_spank_strlcpy(nrs_spank_config.state_dir, NRS_SPANK_DEFAULT_STATE_DIR,
                      sizeof(nrs_spank_config.state_dir));
    nrs_spank_config.poll_interval = 2.0;
    nrs_spank_strlcpy(nrs_spank_config.controller_tcp, "0.0.0.0:0",
                      sizeof(nrs_spank_config.controller_tcp));
}

static const nrs_arg_t *nrs_arg_find(const char *key, size_t keylen)
{
    for (size_t i = 0; i < NRS_NARGS; i++)
        if (strlen(nrs_args[i].key) == keylen && strncmp(nrs_args[i].key, key, keylen) == 0)
            return &nrs_args[i];
    return NULL;
}

static int nrs_arg_set(const nrs_arg_t *a, const char *val, char *err, size_t errlen)
{
    char *dst = (char *)&nrs_spank_config + a->off;
    char *end = NULL;
    double d;

    switch (a->kind) {
    case NRS_ARG_PATH:
        if (val[0] != '/') {
            snprintf(err, errlen, "%s=%s: must be an absolute path", a->key, val);
            return -1;
        }
        if (nrs_spank_strlcpy(dst, val, NRS_SPANK_PATH_MAX) < 0) {
            snprintf(err, errlen, "%s: path longer than %d bytes", a->key, NRS_SPANK_PATH_MAX - 1);
            return -1;
        }
        return 0;
    case NRS_ARG_HOSTPORT: { /* HOST:PORT, or none */
        const char *colon = strrchr(val, ':');
        unsigned long port = colon ? strtoul(colon + 1, &end, 10) : 0;
        if (strcmp(val, "none") != 0 &&
            (!colon || colon == val || !colon[1] || *end != '\0' || port > 65535 ||
             strpbrk(val, " \t/") != NULL)) {
            snprintf(err, errlen, "%s=%s: expected HOST:PORT (port 0: any) or none", a->key, val);
            return -1;
        }
        if (nrs_spank_strlcpy(dst, val, 64) < 0) {
            snprintf(err, errlen, "%s: longer than 63 bytes", a->key);
            return -1;
        }
        return 0;
    }
    case NRS_ARG_SECONDS:
        errno = 0;
        d = strtod(val, &end);
        if (errno != 0 || end == val || *end != '\0' || !(d >= 0.1 && d <= 3600.0)) {
            snprintf(err, errlen, "%s=%s: expected seconds in [0.1, 3600]", a->key, val);
            return -1;
        }
        memcpy(dst, &d, sizeof(d));
        return 0;
    }
    return -1;
}

static void nrs_known_keys(char *buf, size_t n)
{
    size_t used = 0;

    buf[0] = '\0';
    for (size_t i = 0; i < NRS_NARGS && used < n; i++)
        used += (size_t)snprintf(buf + used, n - used, "%s%s", i ? ", " : "", nrs_args[i].key);
}

/* One "key=value" word. */
static int nrs_config_word(const char *word, unsigned *seen, char *err, size_t errlen)
{
    const char *eq = strchr(word, '=');
    const nrs_arg_t *a;
    char known[256];

    if (eq == NULL || eq == word) {
        snprintf(err, errlen, "argument '%s': expected key=value", word);
        return -1;
    }
    a = nrs_arg_find(word, (size_t)(eq - word));
    if (a == NULL) {
        nrs_known_keys(known, sizeof(known));
        snprintf(err, errlen, "argument '%.*s' is unknown (known: %s)",
                 (int)(eq - word), word, known);
        return -1;
    }
    if (*seen & (1u << (a - nrs_args))) {
        snprintf(err, errlen, "argument '%s' given twice", a->key);
        return -1;
    }
    *seen |= 1u << (a - nrs_args);
    return nrs_arg_set(a, eq + 1, err, errlen);
}

int nrs_spank_config_parse(int ac, char **av)
{
    nrs_spank_config_t *c = &nrs_spank_config;
    unsigned seen = 0;

    if (c->parsed)
        return c->broken ? -1 : 0;
    nrs_spank_config_reset();
    for (int i = 0; i < ac; i++) {
        if (nrs_config_word(av[i], &seen, c->error, sizeof(c->error)) < 0)
            goto fail;
    }
    c->parsed = true;
    return 0;
fail:
    c->parsed = true;
    c->broken = true;
    /* It quotes plugstack.conf's words: logged, as printable ASCII only. */
    nrs_spank_printable(c->error);
    /* Never an error where every user would see it (srun, sbatch, each step):
     * slurmd's log is the admin's, and it parses once, at start-up. */
    if (spank_context() == S_CTX_SLURMD)
        slurm_error(NRS_SPANK_PREFIX "plugstack.conf: %s (every --nereus is refused until it is "
                    "fixed; jobs without --nereus are not affected)", c->error);
    else
        nrs_debug("plugstack.conf: %s (--nereus is refused)", c->error);
    return -1;
}
