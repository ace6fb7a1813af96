/* Trace files: one directive a line, '#' comments (docs/simulator.md).
 *
 *   nereus-trace 1               first directive, required
 *   steps N                      required, 1..1000000
 *   seed N | noise SIGMA | checkpoint SECONDS
 *   true NAME FACTOR             NAME: a model-stage (actor.train...) or sync
 *   gpus STEP N                  GPU count from STEP (shrink drops the last nodes)
 *   fail STEP NODE               node NODE of the current numbering fails at STEP
 *   memory STEP                  a stage fails to allocate at STEP
 *   response STEP LEN            mean response length from STEP on
 *   ramp STEP0 STEP1 LEN0 LEN1   linear over [STEP0, STEP1], LEN1 after (STEP1 <= steps)
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sim/sim.h"

enum { LINE_MAX_BYTES = 4096, TRACE_MAX_BYTES = 1 << 20, MAX_WORDS = 8 };

typedef struct {
    const char *path;
    int line;
    char *word[MAX_WORDS];
    int col[MAX_WORDS];
    int nwords;
    char *err;
    size_t errlen;
} ctx_t;

static int fail(ctx_t *c, int w, const char *msg)
{
    snprintf(c->err, c->errlen, "%s:%d:%d: %s", c->path, c->line, w < c->nwords ? c->col[w] : 1, msg);
    return -1;
}

static int num(ctx_t *c, int w, double lo, double hi, double *out)
{
    char *end, msg[160];
    if (w >= c->nwords)
        return fail(c, c->nwords ? c->nwords - 1 : 0, "missing a number");
    errno = 0;
    double v = strtod(c->word[w], &end);
    /* numbers are decimal: strtod would take hexadecimal too */
    if (errno || end == c->word[w] || *end || strpbrk(c->word[w], "xX") || !isfinite(v) ||
        v < lo || v > hi) {
        snprintf(msg, sizeof(msg), "'%.40s' is not a number in [%g, %g]", c->word[w], lo, hi);
        return fail(c, w, msg);
    }
    *out = v;
    return 0;
}

static int integer(ctx_t *c, int w, long lo, long hi, int *out)
{
    double v;
    if (num(c, w, (double)lo, (double)hi, &v) != 0)
        return -1;
    if (v != floor(v))
        return fail(c, w, "expected an integer");
    *out = (int)v;
    return 0;
}

static int want_words(ctx_t *c, int n)
{
    char msg[96];
    if (c->nwords == n)
        return 0;
    snprintf(msg, sizeof(msg), "'%s' takes %d argument%s, got %d", c->word[0], n - 1,
             n == 2 ? "" : "s", c->nwords - 1);
    return fail(c, c->nwords > n ? n : 0, msg);
}

static void split(ctx_t *c, char *line)
{
    c->nwords = 0;
    for (char *p = line; *p && c->nwords < MAX_WORDS + 1;) {
        while (*p == ' ' || *p == '\t' || *p == '\r')
            p++;
        if (!*p || *p == '#')
            break;
        if (c->nwords == MAX_WORDS) {
            c->nwords++;
            break;
        }
        c->col[c->nwords] = (int)(p - line) + 1;
        c->word[c->nwords++] = p;
        while (*p && *p != ' ' && *p != '\t' && *p != '\r' && *p != '#')
            p++;
        if (*p == '#')
            *p = '\0';
        else if (*p)
            *p++ = '\0';
    }
}

static int add_event(ctx_t *c, nrs_trace_t *t, int step, nrs_event_kind_t kind, int value)
{
    int w = c->nwords - 1; /* the value's word (the step's for memory) */
    if (t->nevents == NRS_TRACE_MAX_EVENTS)
        return fail(c, 0, "too many events (at most 4096)");
    t->events[t->nevents] = (nrs_event_t){step, kind, value, t->nevents, c->line, c->col[w]};
    t->nevents++;
    return 0;
}

typedef struct {
    int s0, s1;
    double l0, l1;
} seg_t;

static int directive(ctx_t *c, nrs_trace_t *t, const nrs_spec_t *s, seg_t *segs, int *nsegs,
                     bool *have_steps)
{
    const char *d = c->word[0];
    int step, v;
    double x;
    if (!strcmp(d, "steps")) {
        /* a second one would leave events and responses past the new end */
        if (*have_steps)
            return fail(c, 0, "'steps' given twice");
        if (want_words(c, 2) || integer(c, 1, 1, NRS_TRACE_MAX_STEPS, &t->steps))
            return -1;
        *have_steps = true;
        return 0;
    }
    if (!strcmp(d, "seed")) {
        if (want_words(c, 2) || num(c, 1, 0, 4294967295.0, &x))
            return -1;
        if (x != floor(x)) /* above INT_MAX: not for integer() */
            return fail(c, 1, "expected an integer");
        t->seed = (unsigned long)x;
        return 0;
    }
    if (!strcmp(d, "noise"))
        return want_words(c, 2) || num(c, 1, 0, 1, &t->noise) ? -1 : 0;
    if (!strcmp(d, "checkpoint"))
        return want_words(c, 2) || num(c, 1, 0, 1e7, &t->checkpoint_s) ? -1 : 0;
    if (!strcmp(d, "true")) {
        if (want_words(c, 3) || num(c, 2, 0.01, 100, &x))
            return -1;
        if (!strcmp(c->word[1], "sync")) {
            t->truth.sync = x;
            return 0;
        }
        for (int ms = 0; ms < NRS_MS_COUNT; ms++)
            if (!strcmp(c->word[1], nrs_ms_name((nrs_ms_t)ms))) {
                t->truth.stage[ms] = x;
                return 0;
            }
        return fail(c, 1, "unknown model-stage (actor.generate, actor.infer, critic.infer, "
                          "ref.infer, reward.infer, actor.train, critic.train, or sync)");
    }
    if (!*have_steps)
        return fail(c, 0, "'steps' must come before events");
    if (!strcmp(d, "gpus") || !strcmp(d, "fail")) {
        bool gpus = !strcmp(d, "gpus");
        if (want_words(c, 3) || integer(c, 1, 0, t->steps - 1, &step) ||
            integer(c, 2, gpus ? 1 : 0, gpus ? (1 << 22) : (1 << 20), &v))
            return -1;
        int gpn = s->cluster.gpus_per_node;
        if (gpus && v > gpn && v % gpn)
            return fail(c, 2, "GPU count must be below a node or a whole number of nodes");
        if (gpus && step == 0) {
            t->initial_gpus = v;
            return 0;
        }
        return add_event(c, t, step, gpus ? NRS_EV_GPUS : NRS_EV_FAIL, v);
    }
    if (!strcmp(d, "memory")) {
        if (want_words(c, 2) || integer(c, 1, 0, t->steps - 1, &step))
            return -1;
        return add_event(c, t, step, NRS_EV_MEMORY, 0);
    }
    if (!strcmp(d, "response") || !strcmp(d, "ramp")) {
        seg_t g;
        bool ramp = !strcmp(d, "ramp");
        if (*nsegs == NRS_TRACE_MAX_EVENTS)
            return fail(c, 0, "too many response directives");
        if (want_words(c, ramp ? 5 : 3) || integer(c, 1, 0, t->steps - 1, &g.s0))
            return -1;
        if (ramp ? integer(c, 2, g.s0, t->steps, &g.s1) || num(c, 3, 1, 1e7, &g.l0) ||
                       num(c, 4, 1, 1e7, &g.l1)
                 : num(c, 2, 1, 1e7, &g.l0))
            return -1;
        if (!ramp) {
            g.s1 = g.s0;
            g.l1 = g.l0;
        }
        segs[(*nsegs)++] = g;
        return 0;
    }
    return fail(c, 0, "unknown directive (nereus-trace, steps, seed, noise, checkpoint, true, "
                      "gpus, fail, memory, response, ramp)");
}

static int cmp_event(const void *a, const void *b)
{
    const nrs_event_t *x = a, *y = b;
    return x->step != y->step ? x->step - y->step : x->order - y->order;
}

static int parse(ctx_t *c, char *text, nrs_trace_t *t, const nrs_spec_t *s, seg_t *segs)
{
    bool have_header = false, have_steps = false;
    int nsegs = 0;
    char *save = NULL;
    c->line = 0;
    for (char *line = text; line; line = save) {
        save = strchr(line, '\n');
        if (save)
            *save++ = '\0';
        c->line++;
        if (strlen(line) > LINE_MAX_BYTES)
            return fail(c, 0, "line longer than 4096 bytes");
        split(c, line);
        if (c->nwords == 0)
            continue;
        if (c->nwords > MAX_WORDS)
            return fail(c, MAX_WORDS - 1, "too many words on the line");
        if (!have_header) {
            if (strcmp(c->word[0], "nereus-trace") || c->nwords != 2 || strcmp(c->word[1], "1"))
                return fail(c, 0, "expected 'nereus-trace 1' as the first directive");
            have_header = true;
            continue;
        }
        if (directive(c, t, s, segs, &nsegs, &have_steps) != 0)
            return -1;
    }
    if (!have_header || !have_steps) {
        c->nwords = 0;
        return fail(c, 0, have_header ? "missing 'steps'" : "empty trace: expected 'nereus-trace 1'");
    }
    for (int i = 0; i < nsegs; i++)
        if (segs[i].s0 >= t->steps || segs[i].s1 > t->steps) {
            c->nwords = 0;
            return fail(c, 0, "a response directive lies past 'steps' (declare steps first)");
        }
    t->response = malloc(sizeof(double) * (size_t)t->steps);
    if (!t->response)
        return fail(c, 0, "out of memory");
    for (int i = 0; i < t->steps; i++)
        t->response[i] = s->workload.response_len;
    for (int i = 0; i < nsegs; i++) {
        const seg_t *g = &segs[i];
        for (int k = g->s0; k < t->steps; k++)
            t->response[k] = k >= g->s1 ? g->l1
                                        : g->l0 + (g->l1 - g->l0) * (k - g->s0) / (double)(g->s1 - g->s0);
    }
    qsort(t->events, (size_t)t->nevents, sizeof(nrs_event_t), cmp_event);
    return 0;
}

int nrs_trace_load(const char *path, const nrs_spec_t *s, nrs_trace_t *t, char *err, size_t errlen)
{
    ctx_t c = {.path = path, .err = err, .errlen = errlen};
    char *text = NULL;
    seg_t *segs = NULL;
    int rc = -1;
    FILE *f;

    memset(t, 0, sizeof(*t));
    snprintf(t->path, sizeof(t->path), "%s", path);
    t->seed = 1;
    t->noise = 0.05;
    t->checkpoint_s = 300;
    nrs_calib_init(&t->truth);
    if (!(f = fopen(path, "rb"))) {
        snprintf(err, errlen, "%s:0:0: cannot open: %s", path, strerror(errno));
        return -1;
    }
    text = malloc(TRACE_MAX_BYTES + 1);
    segs = malloc(sizeof(seg_t) * NRS_TRACE_MAX_EVENTS);
    if (!text || !segs) {
        snprintf(err, errlen, "%s:0:0: out of memory", path);
        goto out;
    }
    size_t n = fread(text, 1, TRACE_MAX_BYTES + 1, f);
    if (ferror(f)) { /* e.g. a directory: not an empty trace */
        snprintf(err, errlen, "%s:0:0: cannot read: %s", path, strerror(errno));
        goto out;
    }
    if (n > TRACE_MAX_BYTES) {
        snprintf(err, errlen, "%s:0:0: larger than %d bytes", path, TRACE_MAX_BYTES);
        goto out;
    }
    if (memchr(text, '\0', n)) {
        snprintf(err, errlen, "%s:0:0: contains a NUL byte: not a text trace", path);
        goto out;
    }
    text[n] = '\0';
    rc = parse(&c, text, t, s, segs);
out:
    if (rc != 0)
        nrs_trace_free(t);
    fclose(f);
    free(text);
    free(segs);
    return rc;
}

void nrs_trace_free(nrs_trace_t *t)
{
    free(t->response);
    t->response = NULL;
}
