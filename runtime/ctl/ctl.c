/* Controller state: peers, per-step aggregation of reports, decisions through
 * runtime/adapt, and the two-phase transition PLAN -> PREPARE -> (every rank
 * ACKs) -> COMMIT, or ABORT before the point of no return (COMMIT sent). */
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ctl/auth.h"
#include "ctl/ctl_int.h"
#include "util/util.h"

const char *const nrs_ctl_trigger_names[] = {"none",   "resources",   "workload",
                                           "memory", "calibration", "recheck"};
#define trigger_names nrs_ctl_trigger_names

static void logf_(nrs_ctl_t *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* One log line. Control bytes are written as \xNN: peers' text (an ERROR's,
 * a host name) goes into it, and a newline there would forge a line. */
static void logf_(nrs_ctl_t *c, const char *fmt, ...)
{
    char line[2048];
    if (!c->o.log)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    fprintf(c->o.log, "nereus-controller: [%.3f] ", c->now - c->t_start);
    nrs_log_line(c->o.log, line);
}

static const char *peer_name(const nrs_conn_t *k, char *buf, size_t n)
{
    static const char *const roles[] = {"peer", "worker", "watcher", "cli"};
    if (k->role == NRS_ROLE_WORKER && k->gpu >= 0) /* the rank, then its GPU (they differ) */
        snprintf(buf, n, "#%lu worker rank %d@%s (GPU %d)", k->serial, k->rank, k->host, k->gpu);
    else if (k->role == NRS_ROLE_WORKER)
        snprintf(buf, n, "#%lu worker rank %d@%s (no GPU)", k->serial, k->rank, k->host);
    else
        snprintf(buf, n, "#%lu %s%s%s", k->serial, roles[k->role >= 0 && k->role <= 3 ? k->role : 0],
                 k->tcp ? " (tcp)" : "", "");
    return buf;
}

void nrs_ctl_opts_init(nrs_ctl_opts_t *o, const nrs_spec_t *spec)
{
    memset(o, 0, sizeof(*o));
    o->spec = spec;
    o->job = "";
    o->hello_timeout_s = 5;
    o->frame_timeout_s = 10;
    o->transition_timeout_s = 60;
}

static const nrs_plan_t *committed(const nrs_ctl_t *c)
{
    return c->tr != TR_IDLE ? &c->tr_saved.plan : &c->a.plan;
}

/* ---- output ---------------------------------------------------------------- */

static void retire_worker(nrs_ctl_t *c, nrs_conn_t *k, const char *why);

static void notify(nrs_ctl_t *c, nrs_conn_t *k)
{
    if (c->o.on_output)
        c->o.on_output(c->o.arg, k);
}

/* Queue n bytes: of f, or of s from off when s is not NULL. */
static void queue_out(nrs_ctl_t *c, nrs_conn_t *k, const uint8_t *f, nrs_shared_t *s,
                      size_t off, int n)
{
    char nm[160];
    if (k->state >= NRS_CONN_CLOSING)
        return;
    if (n < 0 || (s ? nrs_conn_queue_shared(k, s, off, (size_t)n)
                    : nrs_conn_queue(k, f, (size_t)n)) != 0) {
        logf_(c, "%s: %s: dropped", peer_name(k, nm, sizeof(nm)),
              n < 0 ? "message does not encode" : "does not read its output");
        k->state = NRS_CONN_DEAD;
        c->dropped++;
        retire_worker(c, k, "dropped");
        notify(c, k);
        return;
    }
    notify(c, k);
}

/* Send ERROR and close once it is flushed. */
static void drop(nrs_ctl_t *c, nrs_conn_t *k, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void drop(nrs_ctl_t *c, nrs_conn_t *k, int code, const char *fmt, ...)
{
    nrs_msg_error_t e;
    uint8_t buf[NRS_PROTO_HDR + 8 + NRS_PROTO_TEXT_MAX];
    char nm[160];
    va_list ap;
    if (k->state >= NRS_CONN_CLOSING)
        return;
    e.code = (uint32_t)code;
    va_start(ap, fmt);
    vsnprintf(e.text, sizeof(e.text), fmt, ap);
    va_end(ap);
    logf_(c, "%s: dropped: %s: %s", peer_name(k, nm, sizeof(nm)), nrs_perr_name(code), e.text);
    int n = nrs_enc_error(buf, sizeof(buf), &e);
    if (n > 0 && nrs_conn_queue(k, buf, (size_t)n) == 0)
        k->state = NRS_CONN_CLOSING;
    else
        k->state = NRS_CONN_DEAD;
    k->t_closing = c->now;
    c->dropped++;
    retire_worker(c, k, e.text);
    notify(c, k);
}

void nrs_ctl_log(nrs_ctl_t *c, const char *fmt, ...)
{
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    logf_(c, "%s", line);
}

static void send_frame(nrs_ctl_t *c, nrs_conn_t *k, const uint8_t *f, int n)
{
    queue_out(c, k, f, NULL, 0, n);
}

void nrs_ctl_send(nrs_ctl_t *c, nrs_conn_t *k, const uint8_t *frame, int n)
{
    send_frame(c, k, frame, n);
}

void nrs_ctl_send_shared(nrs_ctl_t *c, nrs_conn_t *k, nrs_shared_t *s, size_t off, int n)
{
    queue_out(c, k, NULL, s, off, n);
}

void nrs_ctl_refuse(nrs_ctl_t *c, nrs_conn_t *k, int code, const char *why)
{
    drop(c, k, code, "%s", why);
}

static int enc_plan_msg(nrs_ctl_t *c, uint8_t *buf, size_t cap, const nrs_plan_t *p,
                        uint32_t flags, unsigned prev, const int *lost, int nlost)
{
    nrs_msg_plan_t *m = malloc(sizeof(*m));
    if (!m)
        return -1;
    memset(m, 0, sizeof(*m));
    m->flags = flags;
    m->prev_epoch = prev;
    m->plan = *p;
    m->nlost = nlost;
    if (nlost > 0)
        memcpy(m->lost, lost, sizeof(int) * (size_t)nlost);
    int n = nrs_enc_plan(buf, cap, m);
    free(m);
    (void)c;
    return n;
}

static void send_plan(nrs_ctl_t *c, nrs_conn_t *k, const nrs_plan_t *p)
{
    uint8_t buf[4096];
    send_frame(c, k, buf, enc_plan_msg(c, buf, sizeof(buf), p, 0, 0, NULL, 0));
}

static void send_epoch(nrs_ctl_t *c, nrs_conn_t *k, uint16_t type, unsigned epoch,
                       const char *text)
{
    nrs_msg_epoch_t m;
    uint8_t buf[NRS_PROTO_HDR + 8 + NRS_PROTO_TEXT_MAX];
    m.epoch = epoch;
    snprintf(m.text, sizeof(m.text), "%s", text ? text : "");
    send_frame(c, k, buf, nrs_enc_epoch(buf, sizeof(buf), type, &m));
}

static void send_delta_reply(nrs_ctl_t *c, nrs_conn_t *k, uint64_t gen, bool accepted,
                             unsigned new_epoch, const char *text)
{
    nrs_msg_delta_reply_t r;
    uint8_t buf[NRS_PROTO_HDR + 24 + NRS_PROTO_TEXT_MAX];
    if (!k)
        return;
    r.generation = gen;
    r.accepted = accepted;
    r.epoch = committed(c)->epoch;
    r.new_epoch = new_epoch > r.epoch ? new_epoch : 0;
    snprintf(r.text, sizeof(r.text), "%s", text);
    send_frame(c, k, buf, nrs_enc_delta_reply(buf, sizeof(buf), &r));
}

/* A removal bigger than one PLAN can carry (NRS_PROTO_MAX_LOST GPUs, counting
 * those lost since the committed plan): refused whole, nothing applied. */
static void too_many_lost(nrs_ctl_t *c, nrs_conn_t *from, uint64_t gen)
{
    char text[128];
    snprintf(text, sizeof(text), "too many GPUs lost before a new plan (at most %d; %d already)",
             NRS_PROTO_MAX_LOST, c->rz_nlost);
    send_delta_reply(c, from, gen, false, 0, text);
}

/* ---- decisions ------------------------------------------------------------- */

static void record(nrs_ctl_t *c, const decision_t *d)
{
    if (c->ndec == DEC_MAX)
        memmove(c->dec, c->dec + 1, sizeof(c->dec[0]) * (DEC_MAX - 1));
    else
        c->ndec++;
    c->dec[c->ndec - 1] = *d;
    logf_(c,
          "decision [%s] trigger %s: %s%s saving %.4f s/step horizon %.1f steps "
          "cost %.3f s (makespan %.3f s%s), epoch %u -> %u: %s",
          d->source, trigger_names[d->trigger],
          !d->planned ? "not planned" : d->admitted ? "ADMITTED" : "rejected",
          d->forced ? " (forced)" : "", d->saving_s, d->horizon_steps, d->cost_s, d->makespan_s,
          d->lost_boxes > 0 ? ", STATE LOST: checkpoint needed" : "", d->from_epoch, d->to_epoch,
          d->why);
}

static void start_transition(nrs_ctl_t *c, const nrs_adapt_out_t *out, const nrs_adapt_t *saved);
static int lose_gone(nrs_ctl_t *c);

/* GPUs a plan may use: the allocation's, but only those with a rank: the
 * committed plan's that are not lost, and the joiners whose world is
 * connected (an expansion's GPUs count once its join step's ranks are in). */
/* Joiners whose world gather completed and that are still connected, not yet
 * placed: counted when needed, never kept, so that one that leaves (or is
 * placed) is never counted as a GPU. */
static int joiners_ready(const nrs_ctl_t *c)
{
    int n = 0;
    for (int i = 0; i < c->nconns; i++) {
        const nrs_conn_t *k = c->conns[i];
        n += k->role == NRS_ROLE_WORKER && k->joiner == 2 && k->state == NRS_CONN_READY;
    }
    return n;
}

static int plan_gpus(const nrs_ctl_t *c)
{
    int usable = committed(c)->total_gpus - c->rz_nlost + joiners_ready(c);
    int gpn = c->o.spec->cluster.gpus_per_node;
    if (c->alloc_gpus < usable)
        usable = c->alloc_gpus;
    /* above a node, plans take whole nodes (plan/search.c): a node with a GPU
     * gone (its rank gave up, a LOST of one GPU) is left out, not a reason to
     * plan nothing while the plan holds a GPU without a rank */
    if (gpn > 0 && usable > gpn)
        usable -= usable % gpn;
    return usable;
}

/* One decision point: conditions now (allocation, reported workload, GPUs
 * lost since the committed plan) through nrs_adapt_step. */
static int decide(nrs_ctl_t *c, const char *source, long step, bool memfail, nrs_adapt_out_t *out,
                  char *err, size_t errlen)
{
    nrs_adapt_t saved = c->a;
    decision_t d;
    int rc;

    memset(&d, 0, sizeof(d));
    err[0] = 0;
    if (c->tr != TR_IDLE) { /* c->a is the announced plan, not the committed one */
        snprintf(err, errlen, "epoch %u is being announced", c->tr_epoch);
        memset(out, 0, sizeof(*out));
        logf_(c, "decision (%s) skipped: %s", source, err);
        return -1;
    }
    lose_gone(c); /* a plan is for the ranks there are */
    nrs_cond_t cond = {plan_gpus(c), c->work};
    nrs_resize_t rz = {c->rz_lost, c->rz_nlost};
    rc = nrs_adapt_step(&c->a, step < 0 ? 0 : (int)step, &cond, c->rz_nlost ? &rz : NULL, memfail,
                        out, err, errlen);
    d.step = step;
    snprintf(d.source, sizeof(d.source), "%s", source);
    d.from_epoch = saved.plan.epoch;
    d.to_epoch = saved.plan.epoch;
    if (rc != 0) {
        c->a = saved;
        d.trigger = out->trigger;
        snprintf(d.why, sizeof(d.why), "cannot plan: %s", err);
        if (strcmp(c->last_fail, d.why) != 0) /* once, not at every step */
            record(c, &d);
        snprintf(c->last_fail, sizeof(c->last_fail), "%s", d.why);
        return -1;
    }
    c->last_fail[0] = 0;
    if (out->trigger == NRS_TRIGGER_NONE)
        return 0;
    d.trigger = out->trigger;
    d.planned = out->decision.why[0] != 0;
    d.admitted = out->changed;
    d.forced = out->decision.forced;
    d.retune = out->retune;
    d.saving_s = out->decision.saving_s;
    d.horizon_steps = out->decision.horizon_steps;
    d.cost_s = out->cost_s;
    d.makespan_s = out->makespan_s;
    d.lost_boxes = out->lost_boxes;
    if (out->changed)
        d.to_epoch = c->a.plan.epoch;
    snprintf(d.why, sizeof(d.why), "%s",
             d.planned ? out->decision.why : "re-planned: the best plan is the current one");
    record(c, &d);
    if (out->changed)
        start_transition(c, out, &saved);
    return 0;
}

/* ---- transitions ----------------------------------------------------------- */

static void finish_commit(nrs_ctl_t *c);
static void run_queued_deltas(nrs_ctl_t *c);
static void abort_transition(nrs_ctl_t *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void world_owed(nrs_ctl_t *c);

/* New GPU index of a survivor of the announced transition (nrs_adapt_gpu_place:
 * the survivors on whole nodes first, then those of damaged nodes), -1 if lost. */
static int renumber(const nrs_ctl_t *c, int old_total, int gpu)
{
    return nrs_adapt_gpu_place(old_total, c->tr_lost, c->tr_nlost,
                               c->o.spec->cluster.gpus_per_node, gpu);
}

static int cmp_conn_rank(const void *a, const void *b)
{
    int x = (*(nrs_conn_t *const *)a)->rank, y = (*(nrs_conn_t *const *)b)->rank;
    return (x > y) - (x < y);
}

/* Each participant's GPU in the announced plan, fixed now, as the ranks fix
 * it (nrs_adapt_gpu_map): a survivor's place, whole nodes before damaged ones;
 * then the joiners taking part, in world-rank order, on the GPUs after the
 * survivors, as many as the plan has room for (the others wait for a later
 * plan). Counted over the joiners placed, never from a joiner's step rank:
 * the step's ranks that were refused or are still waiting take no GPU.
 * -1: out of memory. */
static int place_participants(nrs_ctl_t *c, int old_total)
{
    nrs_conn_t **j = malloc(sizeof(*j) * ((size_t)c->nconns + 1));
    int nj = 0;
    if (!j)
        return -1;
    for (int i = 0; i < c->nconns; i++) {
        nrs_conn_t *k = c->conns[i];
        if (k->tr_state != TRP_WAIT)
            continue;
        k->tr_gpu = k->gpu >= 0 ? renumber(c, old_total, k->gpu) : -1;
        if (k->gpu < 0)
            j[nj++] = k;
    }
    qsort(j, (size_t)nj, sizeof(*j), cmp_conn_rank);
    for (int i = 0, g = old_total - c->tr_nlost; i < nj && g < c->a.plan.total_gpus; i++)
        j[i]->tr_gpu = g++;
    free(j);
    return 0;
}

/* The announced transition's PLAN (c->a.plan, from the saved epoch, its
 * lost GPUs) into buf of NRS_PROTO_HDR + NRS_PROTO_MAX_PAYLOAD bytes. */
static int enc_announced(nrs_ctl_t *c, uint8_t *buf)
{
    return enc_plan_msg(c, buf, NRS_PROTO_HDR + NRS_PROTO_MAX_PAYLOAD, &c->a.plan,
                        NRS_PLAN_TRANSITION | (c->tr_forced ? NRS_PLAN_FORCED : 0),
                        c->tr_saved.plan.epoch, c->tr_lost, c->tr_nlost);
}

static void start_transition(nrs_ctl_t *c, const nrs_adapt_out_t *out, const nrs_adapt_t *saved)
{
    uint8_t *plan = malloc(NRS_PROTO_HDR + NRS_PROTO_MAX_PAYLOAD);
    c->tr = TR_PREPARE;
    c->tr_saved = *saved;
    c->tr_epoch = c->a.plan.epoch;
    if (c->tr_epoch > c->announced)
        c->announced = c->tr_epoch;
    c->tr_forced = out->decision.forced;
    c->tr_retune = out->retune;
    c->tr_stopped = false;
    c->tr_nlost = c->rz_nlost;
    memcpy(c->tr_lost, c->rz_lost, sizeof(int) * (size_t)c->rz_nlost);
    c->tr_t0 = c->now;
    c->tr_deadline = c->now + c->o.transition_timeout_s;
    c->tr_makespan = out->makespan_s;
    c->tr_waiting = c->tr_parts = 0;
    c->ngu = 0;
    c->ntrh = 0;
    c->tr_started++;
    int n = plan ? enc_announced(c, plan) : -1;
    for (int i = 0; i < c->nconns; i++) {
        nrs_conn_t *k = c->conns[i];
        if (k->role != NRS_ROLE_WORKER || k->state != NRS_CONN_READY ||
            (k->gpu < 0 && k->joiner != 2))
            continue;
        k->tr_state = TRP_WAIT;
        k->tr_seconds = 0;
        c->tr_parts++;
        c->tr_waiting++;
    }
    logf_(c, "epoch %u: announcing to %d workers (%s%s%d GPUs lost), prepare", c->tr_epoch,
          c->tr_parts, c->tr_retune ? "micro-batches only, " : "", c->tr_forced ? "forced, " : "",
          c->tr_nlost);
    if (place_participants(c, saved->plan.total_gpus) != 0) {
        free(plan);
        return abort_transition(c, "out of memory");
    }
    /* A send that fails retires its rank, which aborts this transition, and
     * the abort may apply a queued delta that announces the next one: the
     * rest of this loop must not send this one's PLAN, or a PREPARE of that
     * next epoch, to its participants. */
    unsigned epoch = c->tr_epoch;
    for (int i = 0; i < c->nconns && c->tr == TR_PREPARE && c->tr_epoch == epoch; i++) {
        nrs_conn_t *k = c->conns[i];
        if (k->tr_state != TRP_WAIT)
            continue;
        send_frame(c, k, plan, n);
        if (c->tr == TR_PREPARE && c->tr_epoch == epoch && k->tr_state == TRP_WAIT)
            send_epoch(c, k, NRS_MSG_PREPARE, c->tr_epoch, NULL);
    }
    free(plan);
    if (c->tr_epoch != epoch)
        return;
    if (c->tr == TR_PREPARE && c->tr_waiting == 0) {
        c->tr = TR_COMMIT;
        finish_commit(c);
    }
}

static void abort_transition(nrs_ctl_t *c, const char *fmt, ...)
{
    char why[NRS_PROTO_TEXT_MAX];
    va_list ap;
    if (c->tr != TR_PREPARE)
        return;
    va_start(ap, fmt);
    vsnprintf(why, sizeof(why), fmt, ap);
    va_end(ap);
    unsigned epoch = c->tr_epoch;
    c->tr = TR_IDLE;
    c->a = c->tr_saved; /* the old plan and the policy's state before the decision */
    /* A retry is a new attempt under a new number: an ACK, a gather or a
     * transfer tag of this one can never be taken for the retry's. */
    c->a.epoch_floor = epoch + 1;
    c->tr_aborted++;
    c->retry = true; /* with a growing back-off: a rank that keeps failing must not storm */
    c->retry_backoff_s = c->retry_backoff_s > 0 ? 2 * c->retry_backoff_s : 1.0;
    if (c->retry_backoff_s > 30)
        c->retry_backoff_s = 30;
    c->retry_at = c->now + c->retry_backoff_s;
    logf_(c, "epoch %u: ABORT before the point of no return: %s (staying on epoch %u)", epoch, why,
          c->a.plan.epoch);
    for (int i = 0; i < c->nconns; i++) {
        nrs_conn_t *k = c->conns[i];
        if (k->tr_state == TRP_NONE)
            continue;
        k->tr_state = TRP_NONE;
        send_epoch(c, k, NRS_MSG_ABORT, epoch, why);
    }
    world_owed(c);
    run_queued_deltas(c);
}

/* NRS_CTL_DIE_MID_COMMIT=N (tests): once N workers have their COMMIT written
 * out, the controller dies by SIGKILL before the others get theirs. */
static void die_mid_commit(nrs_ctl_t *c, int sent)
{
    const char *e = getenv("NRS_CTL_DIE_MID_COMMIT");
    char *end;
    if (!e || !*e || strtol(e, &end, 10) != sent || *end)
        return;
    logf_(c, "NRS_CTL_DIE_MID_COMMIT=%d: dying with COMMIT sent to %d worker(s)", sent, sent);
    for (int i = 0; i < c->nconns; i++)
        for (int t = 0; t < 100000 && nrs_conn_flush(c->conns[i]) == 1; t++)
            ;
    kill(getpid(), SIGKILL);
}

static void enter_commit(nrs_ctl_t *c)
{
    c->tr = TR_COMMIT;
    c->tr_deadline = c->now + c->o.transition_timeout_s;
    c->tr_waiting = 0;
    logf_(c, "epoch %u: every rank prepared: COMMIT (point of no return)", c->tr_epoch);
    for (int i = 0; i < c->nconns; i++) {
        nrs_conn_t *k = c->conns[i];
        if (k->tr_state != TRP_DONE)
            continue;
        k->tr_state = TRP_WAIT;
        c->tr_waiting++;
    }
    /* (as in start_transition: a failed send that completes the commit may
     * start the next transition, whose participants must not get this COMMIT) */
    unsigned epoch = c->tr_epoch;
    int sent = 0;
    die_mid_commit(c, 0);
    for (int i = 0; i < c->nconns && c->tr == TR_COMMIT && c->tr_epoch == epoch; i++)
        if (c->conns[i]->tr_state == TRP_WAIT) {
            send_epoch(c, c->conns[i], NRS_MSG_COMMIT, c->tr_epoch, NULL);
            die_mid_commit(c, ++sent);
        }
    if (c->tr == TR_COMMIT && c->tr_epoch == epoch && c->tr_waiting == 0)
        finish_commit(c);
}

static void lose_gave_up(nrs_ctl_t *c);
static void line_host_remember(nrs_ctl_t *c, const char *host, int gpus);

/* No rank of the join step is left (each placed, refused or gone; leaving:
 * one about to be): no join is pending, and the next join step starts anew
 * instead of being refused as "in progress". */
static void join_settle(nrs_ctl_t *c, const nrs_conn_t *leaving)
{
    if (!c->join_m)
        return;
    for (int i = 0; i < c->nconns; i++) {
        const nrs_conn_t *k = c->conns[i];
        if (k != leaving && k->joiner && k->state < NRS_CONN_CLOSING)
            return;
    }
    c->join_m = c->join_have = 0;
}

static void finish_commit(nrs_ctl_t *c)
{
    double worst = 0;
    const nrs_plan_t *p = &c->a.plan;
    c->tr = TR_IDLE;
    c->tr_committed++;
    c->tr_last_s = c->now - c->tr_t0;
    c->tr_total_s += c->tr_last_s;
    /* Survivors take their places in the new numbering (hosts too). */
    int old_total = c->tr_saved.plan.total_gpus, o = 0;
    if (old_total > NRS_PROTO_MAX_GPUS)
        old_total = NRS_PROTO_MAX_GPUS;
    char(*was)[NRS_PROTO_STR_MAX] = malloc(sizeof(*was) * ((size_t)old_total + 1));
    if (was)
        memcpy(was, c->gpu_host, sizeof(*was) * (size_t)old_total);
    for (int g = 0; g < old_total; g++) {
        int at = renumber(c, old_total, g);
        if (at < 0)
            continue;
        o++;
        if (was && at != g)
            memcpy(c->gpu_host[at], was[g], sizeof(c->gpu_host[0]));
        else if (!was && at != g) /* out of memory: the host is forgotten, not another's */
            c->gpu_host[at][0] = 0;
    }
    free(was);
    /* Deltas queued meanwhile name GPUs of the epoch committed when they came:
     * into the new numbering (a GPU lost or left out of the plan is gone already) */
    for (int i = 0; i < c->ndq; i++) {
        nrs_msg_delta_t *m = c->dq[i].m;
        int n = 0;
        for (int j = 0; j < m->ngpus; j++) {
            int g = renumber(c, old_total, m->gpus[j]);
            if (g >= 0 && g < p->total_gpus)
                m->gpus[n++] = g;
        }
        m->ngpus = n;
    }
    /* (the GPUs after the survivors: names of an earlier, larger plan's) */
    int top = old_total > p->total_gpus ? old_total : p->total_gpus;
    for (; o < top && o < NRS_PROTO_MAX_GPUS; o++)
        c->gpu_host[o][0] = 0;
    /* (and those of participants gone after COMMIT: the LOST of their node
     * must find their GPUs, a joiner's too) */
    for (int i = 0; i < c->ntrh; i++)
        if (c->trh[i].gpu < p->total_gpus)
            snprintf(c->gpu_host[c->trh[i].gpu], sizeof(c->gpu_host[0]), "%s", c->trh[i].host);
    c->ntrh = 0;
    memset(c->by_gpu, 0, sizeof(c->by_gpu[0]) * NRS_PROTO_MAX_GPUS);
    c->nworkers = 0;
    for (int i = 0; i < c->nconns; i++) {
        nrs_conn_t *k = c->conns[i];
        if (k->role == NRS_ROLE_WORKER && k->gpu < 0 && k->joiner == 1)
            send_plan(c, k, p); /* said HELLO meanwhile (got the old plan), its world to come */
        if (k->role != NRS_ROLE_WORKER || (k->gpu < 0 && k->joiner != 2))
            continue;
        if (k->tr_seconds > worst)
            worst = k->tr_seconds;
        bool part = k->tr_state != TRP_NONE;
        int g = part ? k->tr_gpu : renumber(c, old_total, k->gpu);
        k->tr_state = TRP_NONE;
        k->tr_gpu = -1;
        if (k->joiner == 2 && (!part || g < 0)) {
            if (!part) /* its world came meanwhile: it holds the old plan */
                send_plan(c, k, p);
            continue; /* no room for it in this plan (or its world came meanwhile): it waits */
        }
        if (g < 0 || g >= p->total_gpus || c->by_gpu[g]) {
            /* (its GPU, still counted: out of the count with its node's LOST) */
            if (k->gpu >= 0)
                line_host_remember(c, k->host, 1);
            k->gpu = -1;
            drop(c, k, NRS_PERR_REFUSED, "no place in epoch %u", p->epoch);
            continue;
        }
        if (k->gpu < 0) /* placed: it leaves its own count of steps in line for the job's */
            k->last_step = -1;
        k->gpu = g;
        k->joiner = 0;
        c->by_gpu[g] = k;
        c->nworkers++;
        snprintf(c->gpu_host[g], sizeof(c->gpu_host[0]), "%s", k->host);
        if (!part) /* joined while the transition ran: take the new plan as it is */
            send_plan(c, k, p);
    }
    join_settle(c, NULL); /* every joiner has its GPU: the join is done */
    world_owed(c); /* a join step complete meanwhile: its WORLD, with this plan known */
    c->rz_nlost = 0;
    c->retry = false;
    c->retry_backoff_s = 0;
    if (joiners_ready(c) > 0 && plan_gpus(c) > p->total_gpus) { /* joined during it: grow next */
        c->retry = true;
        c->retry_at = c->now;
    }
    c->step_n = 0;
    c->step_cur = -1;
    /* A re-tune's empty graph predicts nothing to measure against: its time
     * (the ranks' votes) is no sample of a transition's set-up and makespan */
    if (worst > 0 && !c->tr_retune && !c->tr_stopped)
        nrs_adapt_measure_transition(&c->a, worst, c->tr_makespan);
    c->tr_retunes += c->tr_retune;
    logf_(c, "epoch %u committed in %.3f s (ranks: %.3f s measured, %.3f s makespan predicted%s)",
          p->epoch, c->tr_last_s, worst, c->tr_makespan,
          c->tr_retune    ? "; micro-batches only: no transition to calibrate"
          : c->tr_stopped ? "; the job was stopped during it: not calibrated"
                          : "");
    lose_gave_up(c);
    run_queued_deltas(c);
}

/* ---- peers ----------------------------------------------------------------- */

/* A worker gone or dropped: its GPU freed; and if it takes part in the
 * transition (a joiner does too, without a GPU yet), that transition learns
 * of it now rather than at its time-out. */
static void retire_worker(nrs_ctl_t *c, nrs_conn_t *k, const char *why)
{
    char nm[160];
    if (k->role != NRS_ROLE_WORKER)
        return;
    bool holds = k->gpu >= 0 && c->by_gpu[k->gpu] == k;
    if (!holds && k->tr_state == TRP_NONE)
        return;
    peer_name(k, nm, sizeof(nm));
    if (holds) {
        c->by_gpu[k->gpu] = NULL;
        c->nworkers--;
        k->gpu = -1;
    }
    int st = k->tr_state;
    k->tr_state = TRP_NONE;
    if (st == TRP_NONE)
        return;
    if (c->tr == TR_PREPARE) {
        abort_transition(c, "%s gone (%s)", nm, why);
    } else if (c->tr == TR_COMMIT) {
        logf_(c, "epoch %u: %s gone after the point of no return (%s): its state must be "
                 "recovered from replicas", c->tr_epoch, nm, why);
        if (k->tr_gpu >= 0 && k->tr_gpu < NRS_PROTO_MAX_GPUS) { /* its host, kept */
            if (c->ntrh == c->cap_trh) {
                int cap = c->cap_trh ? 2 * c->cap_trh : 16;
                struct nrs_ctl_tr_host *t = realloc(c->trh, sizeof(*t) * (size_t)cap);
                if (t) {
                    c->trh = t;
                    c->cap_trh = cap;
                }
            }
            if (c->ntrh < c->cap_trh) {
                c->trh[c->ntrh].gpu = k->tr_gpu;
                snprintf(c->trh[c->ntrh++].host, sizeof(c->trh[0].host), "%s", k->host);
            }
        }
        if (st == TRP_WAIT && --c->tr_waiting == 0)
            finish_commit(c);
    }
}

/* A REPORT of a step not above the rank's last one, as from a trainer that
 * restored a checkpoint and re-runs steps, or repeats a step number: not a
 * measurement of a new step, so ignored, but the rank keeps its channel. A
 * run of them is logged when it starts and counted when it ends. */
static void stale_report(nrs_ctl_t *c, nrs_conn_t *k, uint32_t step)
{
    char nm[160];
    if (k->stale_n++ == 0) {
        logf_(c, "%s: REPORT of step %u after step %ld: ignored (steps re-run, e.g. after a "
              "checkpoint restore); the connection stays", peer_name(k, nm, sizeof(nm)), step,
              k->last_step);
        k->stale_lo = k->stale_hi = step;
    }
    k->stale_lo = step < k->stale_lo ? step : k->stale_lo;
    k->stale_hi = step > k->stale_hi ? step : k->stale_hi;
    c->stale_reports++;
    k->t_report = c->now; /* not a measurement, but the rank is alive and reporting */
}

/* k's run of stale REPORTs (if any) ends, for why. */
static void stale_end(nrs_ctl_t *c, nrs_conn_t *k, const char *why)
{
    char nm[160];
    if (k->stale_n == 0)
        return;
    logf_(c, "%s: %lu stale REPORT(s) of steps %u-%u ignored; %s", peer_name(k, nm, sizeof(nm)),
          k->stale_n, k->stale_lo, k->stale_hi, why);
    k->stale_n = 0;
}

int nrs_ctl_attach(nrs_ctl_t *c, nrs_conn_t *k, double now)
{
    c->now = now;
    if (c->nconns >= CONNS_MAX)
        return -1;
    if (c->nconns == c->cap_conns) {
        int cap = c->cap_conns ? c->cap_conns * 2 : 64;
        nrs_conn_t **p = realloc(c->conns, sizeof(*p) * (size_t)cap);
        if (!p)
            return -1;
        c->conns = p;
        c->cap_conns = cap;
    }
    k->serial = ++c->serial;
    k->in_limit = NRS_PROTO_HELLO_MAX; /* before HELLO: nothing longer is buffered */
    k->slot = c->nconns;
    c->conns[c->nconns++] = k;
    return 0;
}

/* A joiner waiting without a GPU: its world not complete yet, or in line for
 * a later plan (docs/protocol.md §Joining). */
static bool in_line(const nrs_conn_t *k)
{
    return k->role == NRS_ROLE_WORKER && k->joiner && k->gpu < 0 && k->state == NRS_CONN_READY;
}

static int line_host_find(const nrs_ctl_t *c, const char *host)
{
    for (int i = 0; i < c->nline_host; i++)
        if (!strcmp(c->line_host[i], host))
            return i;
    return -1;
}

static bool line_host_known(const nrs_ctl_t *c, const char *host)
{
    return line_host_find(c, host) >= 0;
}

/* A joiner leaves the line without a GPU, or GPUs of the plan go without a
 * delta (lose_gone; ranks without a place in a plan of whole nodes: gpus
 * of them, which alloc_gpus still counts): their host stays known (the
 * last NRS_CTL_LINE_HOSTS), for the LOST that may follow once no GPU of the
 * plan runs there. */
static void line_host_remember(nrs_ctl_t *c, const char *host, int gpus)
{
    if (!host[0])
        return;
    int i = line_host_find(c, host);
    if (i < 0) {
        i = c->line_host_next;
        snprintf(c->line_host[i], sizeof(c->line_host[0]), "%s", host);
        c->line_gpus[i] = 0; /* (the oldest's: they stay counted) */
        c->line_host_next = (c->line_host_next + 1) % NRS_CTL_LINE_HOSTS;
        if (c->nline_host < NRS_CTL_LINE_HOSTS)
            c->nline_host++;
    }
    c->line_gpus[i] += gpus;
}

void nrs_ctl_detach(nrs_ctl_t *c, nrs_conn_t *k, double now)
{
    c->now = now;
    if (k->slot < 0 || k->slot >= c->nconns || c->conns[k->slot] != k)
        return;
    retire_worker(c, k, "disconnected");
    stale_end(c, k, "disconnected");
    bool held = k->rank >= 0 && k->rank < NRS_PROTO_MAX_RANKS && c->by_rank[k->rank] &&
                c->by_rank[k->rank] != k; /* its rank is another connection's now */
    if (k->role == NRS_ROLE_WORKER && k->rank >= 0 && k->rank < NRS_PROTO_MAX_RANKS &&
        c->by_rank[k->rank] == k)
        c->by_rank[k->rank] = NULL;
    if (k->role == NRS_ROLE_WORKER && !held) /* (a refused joiner, closing, whose rank a live one took) */
        nrs_ctl_gather_gone(c, k->rank);
    /* a joiner gone before its step's world was complete: its place is free
     * again (the step, restarted, takes it); none left, also after WORLD (the
     * whole step died): no join is pending */
    if (k->role == NRS_ROLE_WORKER && k->joiner == 1 && c->join_m && c->world == c->join_base)
        c->join_have--; /* (its WORLD not sent yet: also one waiting for a transition) */
    if (k->role == NRS_ROLE_WORKER && k->joiner) {
        join_settle(c, k);
        if (k->gpu < 0)
            line_host_remember(c, k->host, 0);
    }
    for (int i = 0; i < c->ndq; i++)
        if (c->dq[i].from == k)
            c->dq[i].from = NULL;
    c->conns[k->slot] = c->conns[--c->nconns];
    c->conns[k->slot]->slot = k->slot;
    k->slot = -1;
}

static bool in_list(const int *v, int n, int x)
{
    for (int i = 0; i < n; i++)
        if (v[i] == x)
            return true;
    return false;
}

/* World ranks below end whose worker left, the ranks a WORLD lists as gone:
 * how many; the first max of them into out (may be NULL). */
static int gone_ranks(const nrs_ctl_t *c, int end, int32_t *out, int max)
{
    int n = 0;
    for (int r = 0; r < end; r++) {
        if (!c->rank_gone[r])
            continue;
        if (out && n < max)
            out[n] = r;
        n++;
    }
    return n;
}

/* A WORLD lists every rank gone, and the list becomes the out list of the
 * ranks' world gathers, which holds NRS_GATHER_MAX_OUT ranks: with more gone
 * no world can be built right, so no join is (false, why[] says so). Never
 * a list cut short: the ranks missing from it the others would count as
 * alive and wait for. */
static bool gone_fit(int ngone, char *why, size_t wl)
{
    if (ngone <= NRS_GATHER_MAX_OUT)
        return true;
    snprintf(why, wl, "join refused: %d ranks of the world are gone, a WORLD lists at most %d",
             ngone, NRS_GATHER_MAX_OUT);
    return false;
}

/* The world grows by the join step's ranks, and every world rank connected
 * hears of it: WORLD, with every rank gone listed. -1 with why[] said, the
 * world as it was and nothing sent, when it cannot (gone_fit). */
static int grow_world(nrs_ctl_t *c, char *why, size_t wl)
{
    nrs_msg_world_t *w = calloc(1, sizeof(*w));
    uint8_t *buf = malloc(NRS_PROTO_HDR + NRS_PROTO_MAX_PAYLOAD);
    if (!w || !buf || !gone_fit(gone_ranks(c, c->join_base, w->out, NRS_GATHER_MAX_OUT), why, wl)) {
        if (!w || !buf)
            snprintf(why, wl, "join refused: out of memory");
        free(w);
        free(buf);
        return -1;
    }
    c->world = c->join_base + c->join_m;
    c->world_gen++;
    w->gen = c->world_gen;
    w->size = c->world;
    w->base = c->join_base;
    w->count = c->join_m;
    w->nout = gone_ranks(c, c->join_base, NULL, 0);
    logf_(c, "world %u: %d rank(s) joined as %d..%d (%d gone before): %d ranks", w->gen,
          w->count, w->base, w->size - 1, w->nout, w->size);
    for (int i = 0; i < c->nconns; i++) {
        nrs_conn_t *k = c->conns[i];
        if (k->role != NRS_ROLE_WORKER || k->state != NRS_CONN_READY || k->rank < 0 ||
            (k->gpu < 0 && !k->joiner))
            continue;
        w->rank = k->rank;
        send_frame(c, k, buf, nrs_enc_world(buf, NRS_PROTO_HDR + NRS_PROTO_MAX_PAYLOAD, w));
    }
    free(w);
    free(buf);
    return 0;
}

/* A join the world could not take (grow_world): every rank of its step is
 * refused, saying why, and leaves no trace (its world rank free, not a
 * joiner when it disconnects), so the next join step starts anew. */
static void refuse_join(nrs_ctl_t *c, const char *why)
{
    for (int i = 0; i < c->nconns; i++) {
        nrs_conn_t *k = c->conns[i];
        if (k->role != NRS_ROLE_WORKER || k->joiner != 1 || k->state != NRS_CONN_READY)
            continue;
        drop(c, k, NRS_PERR_REFUSED, "%s", why);
        if (c->by_rank[k->rank] == k)
            c->by_rank[k->rank] = NULL;
        k->joiner = 0;
    }
    join_settle(c, NULL);
}

/* Every rank of the join step has said HELLO and its WORLD is not out yet:
 * sent now, unless a transition is in flight. Its ranks hold the committed
 * plan of their HELLO and take the WORLD's step agreement after their own
 * commit: a WORLD of now would have the joiners compare the plan of an epoch
 * the others left with theirs. finish_commit and abort_transition call again. */
static void world_owed(nrs_ctl_t *c)
{
    char why[160];
    if (c->tr != TR_IDLE || !c->join_m || c->join_have < c->join_m || c->world != c->join_base)
        return;
    if (grow_world(c, why, sizeof(why)) != 0)
        refuse_join(c, why);
}

/* A rank of a join step: world rank join_base + its step rank. */
static void on_joiner(nrs_ctl_t *c, nrs_conn_t *k, const nrs_msg_hello_t *m)
{
    if (c->join_m && c->join_have == c->join_m)
        return drop(c, k, NRS_PERR_REFUSED, "a join of %d ranks is in progress", c->join_m);
    if (c->join_m && m->nranks != c->join_m)
        return drop(c, k, NRS_PERR_REFUSED, "join step of %d ranks, %d are joining", m->nranks,
                    c->join_m);
    if (c->world + m->nranks > NRS_PROTO_MAX_RANKS)
        return drop(c, k, NRS_PERR_REFUSED, "the world would exceed %d ranks", NRS_PROTO_MAX_RANKS);
    char why[160];
    /* said to the step's first rank rather than after its last has come */
    if (!c->join_m && !gone_fit(gone_ranks(c, c->world, NULL, 0), why, sizeof(why)))
        return drop(c, k, NRS_PERR_REFUSED, "%s", why);
    if (!c->join_m) {
        c->join_base = c->world;
        c->join_m = m->nranks;
        c->join_have = 0;
    }
    int r = c->join_base + m->rank;
    if (c->by_rank[r])
        return drop(c, k, NRS_PERR_REFUSED, "join rank %d is already connected", m->rank);
    k->role = NRS_ROLE_WORKER;
    k->rank = r;
    c->by_rank[r] = k;
    k->gpu = -1;
    k->joiner = 1;
    snprintf(k->host, sizeof(k->host), "%s", m->host);
    k->state = NRS_CONN_READY;
    c->rank_gone[r] = 0;
    send_plan(c, k, committed(c));
    /* (ranks may have gone since the first joiner: counted again) */
    if (++c->join_have == c->join_m)
        world_owed(c);
}

void nrs_ctl_world_ready(nrs_ctl_t *c, unsigned gen, const unsigned char *in, int n)
{
    nrs_adapt_out_t out;
    char err[NRS_ERR_MAX];
    /* (a join not yet complete: the gather is of the world before it) */
    if (gen != c->world_gen || !c->join_m || c->join_have < c->join_m)
        return;
    int ready = 0;
    for (int i = 0; i < c->nconns; i++) {
        nrs_conn_t *k = c->conns[i];
        if (!k->joiner || k->state != NRS_CONN_READY)
            continue;
        if (in && (k->rank < 0 || k->rank >= n || !in[k->rank])) {
            /* the ranks left it out of their world: no GPU for it */
            drop(c, k, NRS_PERR_REFUSED, "joined rank %d took no part in world %u's gather",
                 k->rank, gen);
            continue;
        }
        k->joiner = 2;
        ready++;
    }
    logf_(c, "world %u connected: %d joined rank(s) can take GPUs (allocation %d GPUs)", gen,
          ready, c->alloc_gpus);
    join_settle(c, NULL); /* none took part: the join step is over */
    if (c->tr == TR_IDLE)
        decide(c, "join", c->step_closed, false, &out, err, sizeof(err));
}

static void on_joiner(nrs_ctl_t *c, nrs_conn_t *k, const nrs_msg_hello_t *m);

/* A rank of the plan that says HELLO while a transition prepares takes part
 * in it: the announced PLAN and its PREPARE, as the others got them, and the
 * commit waits for its ACK. The ranks' own collectives count every rank of
 * the plan, so the transition could not commit without it: it kept the
 * committed epoch (a worker takes only its first committed PLAN), lacked the
 * PREPARE the others agreed on, and the transition aborted to be retried. */
static void join_transition(nrs_ctl_t *c, nrs_conn_t *k)
{
    uint8_t *plan = malloc(NRS_PROTO_HDR + NRS_PROTO_MAX_PAYLOAD);
    int n = plan ? enc_announced(c, plan) : -1;
    unsigned epoch = c->tr_epoch;
    if (n < 0) {
        free(plan);
        return abort_transition(c, "rank %d said HELLO: its PLAN does not encode", k->rank);
    }
    k->tr_state = TRP_WAIT;
    k->tr_seconds = 0;
    k->tr_gpu = renumber(c, c->tr_saved.plan.total_gpus, k->gpu);
    c->tr_parts++;
    c->tr_waiting++;
    logf_(c, "epoch %u: rank %d said HELLO while it prepares: it takes part (%d workers)", epoch,
          k->rank, c->tr_parts);
    send_frame(c, k, plan, n);
    free(plan);
    /* (a failed send retired it, which aborted this transition) */
    if (c->tr == TR_PREPARE && c->tr_epoch == epoch && k->tr_state == TRP_WAIT)
        send_epoch(c, k, NRS_MSG_PREPARE, epoch, NULL);
}

static void on_hello(nrs_ctl_t *c, nrs_conn_t *k, const uint8_t *p, size_t n)
{
    nrs_msg_hello_t m;
    char why[128];
    if (nrs_dec_hello(p, n, &m, why, sizeof(why)) != 0)
        return drop(c, k, NRS_PERR_MALFORMED, "HELLO: %s", why);
    if (k->tcp && !(c->has_secret && nrs_auth_token_ok(c->secret, m.token)))
        return drop(c, k, NRS_PERR_AUTH, "TCP peer without the job's token");
    if (c->job[0] && m.job[0] && strcmp(m.job, c->job) != 0)
        return drop(c, k, NRS_PERR_REFUSED, "job '%s' is not this controller's ('%s')", m.job,
                    c->job);
    if (m.role == NRS_ROLE_WORKER) {
        if (m.nranks != c->alloc_gpus)
            return drop(c, k, NRS_PERR_REFUSED, "nranks %d, but the job has %d GPUs", m.nranks,
                        c->alloc_gpus);
        if (m.rank >= committed(c)->total_gpus || in_list(c->rz_lost, c->rz_nlost, m.rank))
            return drop(c, k, NRS_PERR_REFUSED, "rank %d has no GPU in epoch %u", m.rank,
                        committed(c)->epoch);
        if (c->by_gpu[m.rank])
            return drop(c, k, NRS_PERR_REFUSED, "rank %d is already connected", m.rank);
        /* Its world rank, the one it gathers as, is its HELLO rank: after a
         * commit that renumbered the GPUs a survivor may hold that rank on
         * another GPU, and two ranks must never gather as one. */
        if (c->by_rank[m.rank])
            return drop(c, k, NRS_PERR_REFUSED, "world rank %d is already connected (on GPU %d)",
                        m.rank, c->by_rank[m.rank]->gpu);
        k->gpu = m.rank;
        c->by_gpu[m.rank] = k;
        c->nworkers++;
        snprintf(c->gpu_host[m.rank], sizeof(c->gpu_host[0]), "%s", m.host);
    }
    if (m.role == NRS_ROLE_JOINER)
        return on_joiner(c, k, &m);
    k->role = (int)m.role;
    k->rank = m.rank;
    snprintf(k->host, sizeof(k->host), "%s", m.host);
    k->state = NRS_CONN_READY;
    if (m.role == NRS_ROLE_WORKER) {
        c->by_rank[m.rank] = k;
        c->rank_gone[m.rank] = 0; /* back: the gathers wait for it again */
        send_plan(c, k, committed(c));
        if (c->tr == TR_PREPARE && k->gpu >= 0)
            join_transition(c, k);
    }
}

/* Close the gathered step: measurements into the calibration, then a decision. */
static void close_step(nrs_ctl_t *c)
{
    nrs_cond_t cond = {plan_gpus(c), c->work};
    nrs_adapt_out_t out;
    char err[NRS_ERR_MAX], src[32];
    if (c->step_n == 0)
        return;
    if (c->resp_n > 0)
        cond.work.response_len = c->work.response_len = c->resp_sum / c->resp_n;
    for (int ms = 0; ms < NRS_MS_COUNT && c->step_cur > c->stop_step; ms++)
        if (c->step_seen[ms])
            nrs_adapt_measure(&c->a, &cond, (nrs_ms_t)ms, c->step_max[ms]);
    c->step_closed = c->step_cur;
    c->step_n = 0;
    bool memfail = c->step_flags & NRS_REPORT_MEM_FAILED;
    snprintf(src, sizeof(src), "step %ld", c->step_cur);
    if (c->tr == TR_IDLE && !(c->retry && c->now < c->retry_at)) /* back off after an abort */
        decide(c, src, c->step_cur, memfail, &out, err, sizeof(err));
}

static void on_report(nrs_ctl_t *c, nrs_conn_t *k, const uint8_t *p, size_t n)
{
    nrs_msg_report_t m;
    char why[128];
    if (nrs_dec_report(p, n, &m, why, sizeof(why)) != 0)
        return drop(c, k, NRS_PERR_MALFORMED, "REPORT: %s", why);
    unsigned newest = c->tr == TR_COMMIT ? c->tr_epoch : committed(c)->epoch;
    if (m.epoch > newest)
        return drop(c, k, NRS_PERR_UNEXPECTED, "REPORT of epoch %u, newest is %u", m.epoch, newest);
    /* (a rank without a GPU measures nothing: a joiner in line counts steps
     * of its own and takes the job's at commits, back and forth) */
    if (k->gpu >= 0 && (long)m.step <= k->last_step)
        return stale_report(c, k, m.step);
    if (k->stale_n) {
        snprintf(why, sizeof(why), "step %u is a new one", m.step);
        stale_end(c, k, why);
    }
    k->last_step = m.step;
    k->t_report = c->now;
    k->nreports++;
    c->reports++;
    if (k->gpu < 0 || c->tr != TR_IDLE || m.epoch != c->a.plan.epoch)
        return; /* not a measurement of the plan that runs now */
    if ((long)m.step > c->step_cur) {
        close_step(c);
        if (c->tr != TR_IDLE)
            return;
        c->step_cur = m.step;
        c->step_n = 0;
        memset(c->step_seen, 0, sizeof(c->step_seen));
        c->resp_sum = 0;
        c->resp_n = 0;
        c->step_flags = 0;
    } else if ((long)m.step < c->step_cur || c->step_closed == c->step_cur) {
        return; /* late for a step already decided on */
    }
    for (int i = 0; i < m.nstages; i++) {
        int ms = m.ms[i];
        if (!c->step_seen[ms] || m.seconds[i] > c->step_max[ms])
            c->step_max[ms] = m.seconds[i];
        c->step_seen[ms] = true;
    }
    if (m.response_len > 0) {
        c->resp_sum += m.response_len;
        c->resp_n++;
    }
    c->step_flags |= m.flags;
    if (++c->step_n >= c->nworkers)
        close_step(c);
}

/* A rank that ACKed PREPARE waited for COMMIT or ABORT in vain and aborted
 * epoch on its side. Before COMMIT: everyone aborts with it. After: the
 * others go (or went) on without it, so it holds a stale epoch and is retired
 * (its GPUs come back as lost), never left disagreeing unnoticed. */
static void gave_up(nrs_ctl_t *c, nrs_conn_t *k, unsigned epoch)
{
    char nm[160];
    if (c->tr == TR_PREPARE && epoch == c->tr_epoch)
        return abort_transition(c, "%s gave up waiting for COMMIT of epoch %u",
                                peer_name(k, nm, sizeof(nm)), epoch);
    bool committing = c->tr == TR_COMMIT && epoch == c->tr_epoch;
    if (!committing && (c->tr == TR_COMMIT || committed(c)->epoch != epoch))
        return;
    /* its GPU in that epoch: the announced plan's while it commits (lost once
     * the commit completes), else the committed plan's (lost now) */
    int g = committing ? (k->tr_state != TRP_NONE ? k->tr_gpu : -1) : k->gpu;
    if (g >= 0 && c->ngu < NRS_PROTO_MAX_LOST)
        c->gu_gpu[c->ngu++] = g;
    drop(c, k, NRS_PERR_REFUSED, "rank retired: it gave up on epoch %u, which the others "
         "committed", epoch);
    if (!committing)
        lose_gave_up(c);
}

static void on_ack(nrs_ctl_t *c, nrs_conn_t *k, const uint8_t *p, size_t n)
{
    nrs_msg_ack_t m;
    char why[128], nm[160];
    if (nrs_dec_ack(p, n, &m, why, sizeof(why)) != 0)
        return drop(c, k, NRS_PERR_MALFORMED, "ACK: %s", why);
    if (m.epoch > c->a.plan.epoch && m.epoch > c->announced) /* late ACKs of an aborted one: fine */
        return drop(c, k, NRS_PERR_UNEXPECTED, "ACK of epoch %u never announced", m.epoch);
    if (m.phase == NRS_MSG_PREPARE && m.status == NRS_ACK_GAVE_UP)
        return gave_up(c, k, m.epoch);
    bool want = k->tr_state == TRP_WAIT && m.epoch == c->tr_epoch &&
                ((c->tr == TR_PREPARE && m.phase == NRS_MSG_PREPARE) ||
                 (c->tr == TR_COMMIT && m.phase == NRS_MSG_COMMIT));
    if (!want)
        return; /* late answer to an aborted or finished transition */
    k->tr_state = TRP_DONE;
    if (m.phase == NRS_MSG_PREPARE) {
        if (m.status != 0)
            return abort_transition(c, "%s could not prepare epoch %u (status %d)",
                                    peer_name(k, nm, sizeof(nm)), m.epoch, (int)m.status);
        if (--c->tr_waiting == 0)
            enter_commit(c);
        return;
    }
    k->tr_seconds = m.seconds;
    if (m.status != 0)
        logf_(c, "epoch %u: %s failed after the point of no return (status %d): recovery needed",
              m.epoch, peer_name(k, nm, sizeof(nm)), (int)m.status);
    if (--c->tr_waiting == 0)
        finish_commit(c);
}

/* ---- resource deltas ------------------------------------------------------- */

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* Who sent a delta, for the log: "#7 watcher@n3" (the host of its HELLO). */
static const char *delta_source(const nrs_conn_t *k, char *buf, size_t n)
{
    char nm[160];
    if (!k)
        snprintf(buf, n, "a peer now gone");
    else if (k->role != NRS_ROLE_WORKER && k->host[0])
        snprintf(buf, n, "%s@%s", peer_name(k, nm, sizeof(nm)), k->host);
    else
        snprintf(buf, n, "%s", peer_name(k, nm, sizeof(nm)));
    return buf;
}

/* The plan's GPUs on the hosts of a REMOVE/LOST delta that are not out yet,
 * into gone[] (*ngone), and the joiners in line there (*nline): 0; -1 with
 * text[] said for a host where no GPU's rank of the plan, no joiner, nor
 * one that left the line, ran; -2 when more GPUs than a PLAN carries. */
static int delta_hosts(nrs_ctl_t *c, const nrs_msg_delta_t *m, int *gone, int *ngone, int *nline,
                       char *text, size_t tl)
{
    const nrs_plan_t *cur = committed(c);
    for (int h = 0; h < m->nhosts; h++) {
        int found = 0;
        for (int g = 0; g < cur->total_gpus; g++) {
            nrs_conn_t *k = c->by_gpu[g];
            const char *host = k ? k->host : c->gpu_host[g]; /* its rank may be gone */
            if (!host[0] || strcmp(host, m->hosts[h]) != 0)
                continue;
            found++; /* already removed (rz_lost) or named twice: known, no change */
            if (in_list(gone, *ngone, g) || in_list(c->rz_lost, c->rz_nlost, g))
                continue;
            if (*ngone == NRS_PROTO_MAX_LOST)
                return -2;
            gone[(*ngone)++] = g;
        }
        for (int i = 0; i < c->nconns; i++)
            if (in_line(c->conns[i]) && !strcmp(c->conns[i]->host, m->hosts[h]))
                found++, (*nline)++;
        if (!found && !line_host_known(c, m->hosts[h])) {
            snprintf(text, tl, "unknown host '%s' (no rank of epoch %u runs there)", m->hosts[h],
                     cur->epoch);
            return -1;
        }
    }
    return 0;
}

static bool host_named(const nrs_msg_delta_t *m, const char *host)
{
    for (int h = 0; h < m->nhosts; h++)
        if (!strcmp(m->hosts[h], host))
            return true;
    return false;
}

/* GPUs on the hosts of delta m that were planned away without a place and
 * that alloc_gpus still counts (line_gpus); with take, no longer. */
static int planned_away(nrs_ctl_t *c, const nrs_msg_delta_t *m, bool take)
{
    int n = 0;
    for (int i = 0; i < c->nline_host; i++) {
        if (!c->line_gpus[i] || !host_named(m, c->line_host[i]))
            continue;
        n += c->line_gpus[i];
        if (take)
            c->line_gpus[i] = 0;
    }
    return n;
}

/* The joiners in line on the delta's hosts are retired: no GPU of theirs will
 * ever be planned. How many. */
static int retire_line(nrs_ctl_t *c, const nrs_msg_delta_t *m, uint64_t gen)
{
    int n = 0;
    for (int i = 0; i < c->nconns; i++) {
        nrs_conn_t *k = c->conns[i];
        if (!in_line(k) || !host_named(m, k->host))
            continue;
        line_host_remember(c, k->host, 0);
        drop(c, k, NRS_PERR_REFUSED, "%s: rank retired (resource delta %llu): it held no GPU",
             m->kind == NRS_DELTA_LOST ? "node lost" : "node removed", (unsigned long long)gen);
        n++;
    }
    return n;
}

/* A REMOVE/LOST whose hosts hold no GPU of the plan, only joiners in line,
 * or GPUs planned away before without a place (planned_away): applied, the
 * joiners are retired, those GPUs leave the allocation's count, and nothing
 * else changes. No decision: the plan and its GPUs are as they were (a
 * transition in PREPARE goes on, unless a retired joiner takes part in it:
 * then it aborts, as for any participant gone). For joiners the count
 * stays: an ADD counts nodes, not hosts, so whether this node's GPUs were
 * counted is not known; a count too high is bounded by the ranks there are
 * (plan_gpus), one too low would keep a later joiner off GPUs the job has. */
static void retire_line_only(nrs_ctl_t *c, nrs_conn_t *from, const nrs_msg_delta_t *m,
                             uint64_t gen)
{
    char text[NRS_PROTO_TEXT_MAX], src[NRS_ERR_MAX];
    c->generation = gen;
    int n = retire_line(c, m, gen), out = planned_away(c, m, true);
    const nrs_plan_t *cur = committed(c);
    c->alloc_gpus -= out;
    logf_(c, "resource delta %llu: %s of %d joining rank(s) without a GPU, retired, and %d GPU(s) "
          "planned away before: plan kept (epoch %u, %d GPUs; allocation %d), from %s",
          (unsigned long long)gen, m->kind == NRS_DELTA_LOST ? "lost" : "remove", n, out,
          cur->epoch, cur->total_gpus, c->alloc_gpus, delta_source(from, src, sizeof(src)));
    char jn[64] = "", ou[80] = "";
    if (n > 0)
        snprintf(jn, sizeof(jn), "%d joining rank(s) retired, they held no GPU; ", n);
    if (out > 0)
        snprintf(ou, sizeof(ou), "%d GPU(s) out that a plan had left without a place; ", out);
    snprintf(text, sizeof(text), "applied: %d GPUs; %s%splan kept: epoch %u on %d GPUs",
             c->alloc_gpus, jn, ou, cur->epoch, cur->total_gpus);
    send_delta_reply(c, from, gen, true, 0, text);
}

/* Apply one delta to the allocation and decide; reply to `from` (may be NULL). */
static void apply_delta(nrs_ctl_t *c, nrs_conn_t *from, nrs_msg_delta_t *m)
{
    char text[NRS_PROTO_TEXT_MAX], err[NRS_ERR_MAX];
    int gone[NRS_PROTO_MAX_LOST], ngone = 0, nline = 0, nout = 0;
    const nrs_plan_t *cur = committed(c);
    uint64_t gen = m->generation ? m->generation : c->generation + 1;
    nrs_adapt_out_t out;

    if (m->generation && m->generation <= c->generation) {
        snprintf(text, sizeof(text), "stale generation %llu (controller is at %llu)",
                 (unsigned long long)m->generation, (unsigned long long)c->generation);
        return send_delta_reply(c, from, m->generation, false, 0, text);
    }
    if (!m->generation && c->generation == UINT64_MAX) /* +1 would wrap to 0: all stale again */
        return send_delta_reply(c, from, 0, false, 0, "no generation left to number it "
                                "(the controller is at 18446744073709551615)");
    if (m->kind == NRS_DELTA_ADD) {
        long add = (long)m->add_nodes * c->o.spec->cluster.gpus_per_node;
        long max = c->o.max_gpus > 0 ? c->o.max_gpus : NRS_PROTO_MAX_GPUS;
        if (c->alloc_gpus + add > max)
            return send_delta_reply(c, from, gen, false, 0, "too many GPUs");
    } else {
        int rc = delta_hosts(c, m, gone, &ngone, &nline, text, sizeof(text));
        if (rc == -2)
            return too_many_lost(c, from, gen);
        if (rc != 0)
            return send_delta_reply(c, from, gen, false, 0, text);
        for (int i = 0; i < m->ngpus; i++) {
            int g = m->gpus[i];
            if (g >= cur->total_gpus) {
                snprintf(text, sizeof(text), "GPU %d not in epoch %u (%d GPUs)", g, cur->epoch,
                         cur->total_gpus);
                return send_delta_reply(c, from, gen, false, 0, text);
            }
            if (in_list(gone, ngone, g) || in_list(c->rz_lost, c->rz_nlost, g))
                continue;
            if (ngone == NRS_PROTO_MAX_LOST)
                return too_many_lost(c, from, gen);
            gone[ngone++] = g;
        }
        /* rz_lost holds every GPU lost until a plan takes them away */
        if (c->rz_nlost + ngone > NRS_PROTO_MAX_LOST)
            return too_many_lost(c, from, gen);
        nout = planned_away(c, m, false);
        if (ngone == 0 && (nline > 0 || nout > 0))
            return retire_line_only(c, from, m, gen);
        if (ngone == 0) {
            /* Every host and GPU named is already out of the allocation: the
             * same release from a second source (a released node's hint, then
             * the watcher's poll). Applied once: no generation, no decision,
             * an announced transition goes on. */
            snprintf(text, sizeof(text), "already applied: %d GPUs; nothing left to remove",
                     c->alloc_gpus);
            logf_(c, "resource delta (%s): %s of GPUs or ranks already removed: no change "
                  "(generation %llu)",
                  delta_source(from, err, sizeof(err)),
                  m->kind == NRS_DELTA_LOST ? "lost" : "remove", (unsigned long long)c->generation);
            return send_delta_reply(c, from, c->generation, true, c->a.plan.epoch, text);
        }
        if (c->alloc_gpus - ngone - nout < 1)
            return send_delta_reply(c, from, gen, false, 0, "that would leave no GPU");
    }
    /* The delta is a fact about the allocation: from here on it is applied. */
    c->generation = gen;
    if (c->tr == TR_PREPARE)
        abort_transition(c, "superseded by resource delta %llu", (unsigned long long)gen);
    if (m->kind == NRS_DELTA_ADD) {
        c->alloc_gpus += (int)m->add_nodes * c->o.spec->cluster.gpus_per_node;
    } else {
        for (int i = 0; i < ngone; i++) {
            nrs_conn_t *k = c->by_gpu[gone[i]];
            c->rz_lost[c->rz_nlost++] = gone[i];
            if (k)
                drop(c, k, NRS_PERR_REFUSED, "%s: rank retired (resource delta %llu)",
                     m->kind == NRS_DELTA_LOST ? "node lost" : "node removed",
                     (unsigned long long)gen);
        }
        qsort(c->rz_lost, (size_t)c->rz_nlost, sizeof(int), cmp_int);
        c->alloc_gpus -= ngone + planned_away(c, m, true);
        retire_line(c, m, gen);
    }
    logf_(c, "resource delta %llu: %s -> %d GPUs (%d lost since epoch %u) from %s",
          (unsigned long long)gen,
          m->kind == NRS_DELTA_ADD ? "add" : m->kind == NRS_DELTA_LOST ? "lost" : "remove",
          c->alloc_gpus, c->rz_nlost, cur->epoch, delta_source(from, err, sizeof(err)));
    char src[48];
    snprintf(src, sizeof(src), "delta %llu at step %ld", (unsigned long long)gen, c->step_closed);
    c->retry = false;
    if (decide(c, src, c->step_closed, false, &out, err, sizeof(err)) != 0) {
        snprintf(text, sizeof(text), "applied: %d GPUs; no plan: %s", c->alloc_gpus, err);
        return send_delta_reply(c, from, gen, true, 0, text);
    }
    bool waiting = !out.changed && plan_gpus(c) < c->alloc_gpus; /* GPUs without ranks yet */
    if (waiting && out.trigger == NRS_TRIGGER_NONE) { /* say so: a decision of its own */
        decision_t d;
        memset(&d, 0, sizeof(d));
        d.step = c->step_closed;
        snprintf(d.source, sizeof(d.source), "%s", src);
        d.trigger = NRS_TRIGGER_RESOURCES;
        d.from_epoch = d.to_epoch = c->a.plan.epoch;
        snprintf(d.why, sizeof(d.why), "plan kept: %d of %d GPUs have no rank yet (a join step "
                 "brings them in)", c->alloc_gpus - plan_gpus(c), c->alloc_gpus);
        record(c, &d);
    }
    if (out.changed)
        snprintf(text, sizeof(text), "applied: %d GPUs; epoch %u announced%s: %s", c->alloc_gpus,
                 c->a.plan.epoch, out.decision.forced ? " (forced)" : "", out.decision.why);
    else if (waiting)
        snprintf(text, sizeof(text), "applied: %d GPUs; plan kept: %d of them have no rank yet "
                 "(a join step brings them in)", c->alloc_gpus, c->alloc_gpus - plan_gpus(c));
    else
        snprintf(text, sizeof(text), "applied: %d GPUs; plan kept: %s", c->alloc_gpus,
                 out.decision.why[0] ? out.decision.why : "the current plan is still the best");
    send_delta_reply(c, from, gen, true, out.changed ? c->a.plan.epoch : 0, text);
}

/* GPU g of the committed plan had a rank, which left: its HELLO named the
 * host (gpu_host, kept and renumbered with the GPU), no worker holds it now,
 * and it is not lost already. */
static bool gpu_gone(const nrs_ctl_t *c, int g)
{
    return !c->by_gpu[g] && c->gpu_host[g][0] && !in_list(c->rz_lost, c->rz_nlost, g);
}

/* The GPUs of the committed plan whose rank is gone for good (its process
 * crashed or was killed, or the controller dropped it) while its node stays
 * in the allocation, so that no watcher reports it: lost like a LOST delta's
 * GPUs (out of the allocation, planned away, the host remembered for the
 * LOST that may come all the same), without a generation. Called when the
 * controller decides: the plan it announces must hold only GPUs with a rank,
 * since the ranks' votes count every rank of the plan and the gone one's
 * never comes (every transition aborted, a forced move never committed).
 * Until then a HELLO for the GPU takes it back. None while no worker is
 * connected: the job has ended (or not begun), there is nobody to plan for.
 * How many. */
static int lose_gone(nrs_ctl_t *c)
{
    const nrs_plan_t *cur = committed(c);
    int n = 0;
    if (c->tr != TR_IDLE || c->nworkers == 0)
        return 0;
    for (int g = 0; g < cur->total_gpus && g < NRS_PROTO_MAX_GPUS; g++) {
        if (!gpu_gone(c, g))
            continue;
        if (c->rz_nlost == NRS_PROTO_MAX_LOST || c->alloc_gpus <= 1)
            break; /* (the rest at the next plan) */
        c->rz_lost[c->rz_nlost++] = g;
        c->alloc_gpus--;
        line_host_remember(c, c->gpu_host[g], 0);
        logf_(c, "GPU %d of epoch %u lost: its rank (on %s) is gone and none took it back", g,
              cur->epoch, c->gpu_host[g]);
        n++;
    }
    if (n > 0)
        qsort(c->rz_lost, (size_t)c->rz_nlost, sizeof(int), cmp_int);
    return n;
}

/* The GPUs of ranks that gave up on the committed epoch (gave_up): their
 * nodes are fine, so no watcher will report them, yet the rank is retired
 * and its state is not the others'; they are lost like a LOST delta's GPUs
 * (out of the allocation, planned away), without a generation of the
 * watcher's numbering. So are those of ranks gone (lose_gone): at the end
 * of a commit, a participant that left after its COMMIT. */
static void lose_gave_up(nrs_ctl_t *c)
{
    nrs_adapt_out_t out;
    char err[NRS_ERR_MAX], src[48];
    const nrs_plan_t *cur = committed(c);
    int n = 0;
    if (c->tr == TR_COMMIT)
        return; /* at the commit's end (finish_commit) */
    for (int i = 0; i < c->ngu; i++) {
        int g = c->gu_gpu[i];
        if (g < 0 || g >= cur->total_gpus || c->by_gpu[g] || in_list(c->rz_lost, c->rz_nlost, g) ||
            c->rz_nlost == NRS_PROTO_MAX_LOST || c->alloc_gpus <= 1)
            continue;
        c->rz_lost[c->rz_nlost++] = g;
        c->alloc_gpus--;
        n++;
        logf_(c, "GPU %d of epoch %u lost: its rank gave up on the epoch", g, cur->epoch);
    }
    c->ngu = 0;
    if (n > 0) {
        qsort(c->rz_lost, (size_t)c->rz_nlost, sizeof(int), cmp_int);
        if (c->tr == TR_PREPARE)
            abort_transition(c, "%d GPU(s) lost: ranks gave up on epoch %u", n, cur->epoch);
    }
    /* and those of ranks gone during the commit (or since): planned now, not
     * at the survivors' next step (with a partial state they wait for it) */
    int ng = lose_gone(c);
    if (n + ng == 0)
        return;
    snprintf(src, sizeof(src), "%s at step %ld", n ? "gave up" : "ranks gone", c->step_closed);
    c->retry = false;
    decide(c, src, c->step_closed, false, &out, err, sizeof(err));
}

/* The deltas queued during a COMMIT, in their order, each applied (and
 * decided) on its own. Not re-entered: a delta that aborts the transition
 * the one before it started must not apply the next one inside its own
 * application (abort_transition comes back here), or its decision would
 * run with that next one's transition open and take its plan for the
 * committed one. */
static void run_queued_deltas(nrs_ctl_t *c)
{
    if (c->dq_running)
        return;
    c->dq_running = true;
    while (c->ndq > 0 && c->tr != TR_COMMIT) {
        queued_delta_t q = c->dq[0];
        memmove(c->dq, c->dq + 1, sizeof(c->dq[0]) * (size_t)(--c->ndq));
        apply_delta(c, q.from, q.m);
        free(q.m);
    }
    c->dq_running = false;
}

static void on_delta(nrs_ctl_t *c, nrs_conn_t *k, const uint8_t *p, size_t n)
{
    char why[128];
    nrs_msg_delta_t *m = malloc(sizeof(*m));
    if (!m)
        return drop(c, k, NRS_PERR_INTERNAL, "out of memory");
    if (nrs_dec_delta(p, n, m, why, sizeof(why)) != 0) {
        free(m);
        return drop(c, k, NRS_PERR_MALFORMED, "DELTA: %s", why);
    }
    if (c->tr == TR_COMMIT) { /* past the point of no return: after the commit */
        for (int i = 0; i < m->ngpus; i++) /* (GPUs of the committed plan: renumbered then) */
            if (m->gpus[i] >= committed(c)->total_gpus) {
                char text[128];
                uint64_t gen = m->generation;
                snprintf(text, sizeof(text), "GPU %d not in epoch %u (%d GPUs)", m->gpus[i],
                         committed(c)->epoch, committed(c)->total_gpus);
                free(m);
                return send_delta_reply(c, k, gen, false, 0, text);
            }
        if (c->ndq == DQ_MAX) {
            uint64_t gen = m->generation;
            free(m);
            return send_delta_reply(c, k, gen, false, 0, "busy: too many deltas queued");
        }
        c->dq[c->ndq].m = m;
        c->dq[c->ndq++].from = k;
        return;
    }
    apply_delta(c, k, m);
    free(m);
}

static void on_status_req(nrs_ctl_t *c, nrs_conn_t *k, const uint8_t *p, size_t n)
{
    nrs_msg_status_req_t m;
    char why[128];
    char *text = NULL;
    size_t len = 0;
    if (nrs_dec_status_req(p, n, &m, why, sizeof(why)) != 0)
        return drop(c, k, NRS_PERR_MALFORMED, "STATUS_REQ: %s", why);
    FILE *f = open_memstream(&text, &len);
    if (!f)
        return drop(c, k, NRS_PERR_INTERNAL, "out of memory");
    nrs_ctl_status(c, m.format & NRS_STATUS_JSON, c->now, f);
    fclose(f);
    uint8_t *buf = malloc(NRS_PROTO_HDR + NRS_PROTO_MAX_PAYLOAD);
    size_t off = 0;
    const size_t chunk = NRS_PROTO_MAX_PAYLOAD;
    do {
        size_t k2 = len - off < chunk ? len - off : chunk;
        uint32_t fl = off + k2 < len ? NRS_FLAG_MORE : 0;
        int fn = buf ? nrs_enc_status(buf, NRS_PROTO_HDR + NRS_PROTO_MAX_PAYLOAD, text + off, k2, fl)
                     : -1;
        send_frame(c, k, buf, fn);
        off += k2;
    } while (off < len && k->state == NRS_CONN_READY);
    free(buf);
    free(text);
}

void nrs_ctl_input(nrs_ctl_t *c, nrs_conn_t *k, double now)
{
    nrs_hdr_t h;
    const uint8_t *p;
    int rc;
    c->now = now;
    while (k->state < NRS_CONN_CLOSING && (rc = nrs_conn_frame(k, &h, &p)) != 0) {
        if (rc < 0) {
            drop(c, k, -rc, "bad frame header");
            k->in_len = 0;
            return;
        }
        c->frames++;
        if ((rc = nrs_conn_check_type(k->state, k->role, h.type)) != 0) {
            drop(c, k, -rc, "%s not allowed %s", nrs_msg_name(h.type),
                 k->state == NRS_CONN_NEW ? "before HELLO" : "for this role");
            k->in_len = 0;
            return;
        }
        switch (h.type) {
        case NRS_MSG_HELLO: on_hello(c, k, p, h.length); break;
        case NRS_MSG_REPORT: on_report(c, k, p, h.length); break;
        case NRS_MSG_ACK: on_ack(c, k, p, h.length); break;
        case NRS_MSG_DELTA: on_delta(c, k, p, h.length); break;
        case NRS_MSG_STATUS_REQ: on_status_req(c, k, p, h.length); break;
        case NRS_MSG_GATHER: nrs_ctl_on_gather(c, k, p, h.length); break;
        case NRS_MSG_ERROR: {
            nrs_msg_error_t e;
            char why[128];
            if (nrs_dec_error(p, h.length, &e, why, sizeof(why)) != 0)
                snprintf(e.text, sizeof(e.text), "(malformed ERROR: %s)", why);
            char nm[160];
            logf_(c, "%s says: %s; closing", peer_name(k, nm, sizeof(nm)), e.text);
            k->state = NRS_CONN_DEAD;
            retire_worker(c, k, "peer error");
            notify(c, k);
            break;
        }
        default: break;
        }
        if (k->state >= NRS_CONN_CLOSING) {
            k->in_len = 0;
            return;
        }
        nrs_conn_consume(k, &h, now);
    }
}

void nrs_ctl_tick(nrs_ctl_t *c, double now)
{
    c->now = now;
    for (int i = 0; i < c->nconns; i++) {
        nrs_conn_t *k = c->conns[i];
        if (k->state == NRS_CONN_NEW && now - k->t_open > c->o.hello_timeout_s)
            drop(c, k, NRS_PERR_TIMEOUT, "no HELLO within %.1f s", c->o.hello_timeout_s);
        else if (k->state < NRS_CONN_CLOSING && k->in_len > 0 &&
                 now - k->t_partial > c->o.frame_timeout_s)
            drop(c, k, NRS_PERR_TIMEOUT, "frame incomplete for %.1f s", c->o.frame_timeout_s);
        else if (k->state == NRS_CONN_CLOSING && now - k->t_closing > 2.0) {
            k->state = NRS_CONN_DEAD;
            notify(c, k);
        }
    }
    nrs_ctl_gather_tick(c);
    if (c->tr == TR_PREPARE && now > c->tr_deadline) {
        abort_transition(c, "%d of %d ranks did not prepare within %.1f s", c->tr_waiting,
                         c->tr_parts, c->o.transition_timeout_s);
    } else if (c->tr == TR_COMMIT && now > c->tr_deadline) {
        logf_(c, "epoch %u: %d ranks did not confirm the commit within %.1f s: they need recovery",
              c->tr_epoch, c->tr_waiting, c->o.transition_timeout_s);
        finish_commit(c);
    }
    if (c->retry && c->tr == TR_IDLE && now >= c->retry_at) {
        nrs_adapt_out_t out;
        char err[NRS_ERR_MAX];
        c->retry = false;
        lose_gone(c); /* (a rank gone, e.g. the one whose leaving aborted) */
        if (plan_gpus(c) != c->a.plan.total_gpus || c->rz_nlost)
            if (decide(c, "retry", c->step_closed, false, &out, err, sizeof(err)) != 0)
                c->retry = false; /* no plan: wait for the next delta */
    }
}

void nrs_ctl_stopped(nrs_ctl_t *c, double now, double seconds)
{
    c->now = now;
    /* the step whose reports come after the resume: the one open now (some
     * ranks reported it before the stop), else the next */
    bool open = c->step_n > 0 && c->step_closed != c->step_cur;
    c->stop_step = open ? c->step_cur : c->step_cur + 1;
    c->tr_stopped |= c->tr != TR_IDLE;
    logf_(c, "resumed (SIGCONT: a suspended job?) after %.1f s stopped, which count in no "
          "time-out; the ranks' times of step %ld%s calibrate nothing", seconds, c->stop_step,
          c->tr != TR_IDLE ? " and of the transition in flight" : "");
}

/* ---- life cycle ------------------------------------------------------------ */

int nrs_ctl_new(nrs_ctl_t **out, const nrs_ctl_opts_t *o, double now, char *err, size_t errlen)
{
    nrs_ctl_t *c = calloc(1, sizeof(*c));
    *out = NULL;
    if (!c || !(c->by_gpu = calloc(NRS_PROTO_MAX_GPUS, sizeof(c->by_gpu[0]))) ||
        !(c->gpu_host = calloc(NRS_PROTO_MAX_GPUS, sizeof(c->gpu_host[0]))) ||
        !(c->rank_gone = calloc(NRS_PROTO_MAX_RANKS, 1)) ||
        !(c->by_rank = calloc(NRS_PROTO_MAX_RANKS, sizeof(c->by_rank[0])))) {
        if (c) {
            free(c->by_gpu);
            free(c->gpu_host);
            free(c->rank_gone);
        }
        free(c);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    c->o = *o;
    c->now = c->t_start = now;
    snprintf(c->job, sizeof(c->job), "%s", o->job ? o->job : "");
    if (o->secret) {
        snprintf(c->secret, sizeof(c->secret), "%s", o->secret);
        c->has_secret = c->secret[0] != 0;
    }
    const nrs_spec_t *s = o->spec;
    c->alloc_gpus = o->gpus > 0 ? o->gpus : s->cluster.nodes * s->cluster.gpus_per_node;
    c->world = c->alloc_gpus;
    if (c->alloc_gpus > NRS_PROTO_MAX_GPUS) {
        snprintf(err, errlen, "%d GPUs: at most %d", c->alloc_gpus, NRS_PROTO_MAX_GPUS);
        goto fail;
    }
    nrs_work_from_spec(s, &c->work);
    nrs_cond_t cond = {c->alloc_gpus, c->work};
    if (nrs_adapt_init(&c->a, s, &cond, err, errlen) != 0)
        goto fail;
    c->step_cur = c->step_closed = -1;
    c->stop_step = -2;
    logf_(c, "epoch %u: %d GPUs, predicted step %.3f s", c->a.plan.epoch, c->alloc_gpus,
          c->a.plan.step_s);
    *out = c;
    return 0;
fail:
    free(c->by_gpu);
    free(c->gpu_host);
    free(c->rank_gone);
    free(c->by_rank);
    free(c);
    return -1;
}

void nrs_ctl_free(nrs_ctl_t *c)
{
    if (!c)
        return;
    for (int i = 0; i < c->ndq; i++)
        free(c->dq[i].m);
    nrs_ctl_gather_free(c);
    free(c->trh);
    free(c->conns);
    free(c->by_gpu);
    free(c->gpu_host);
    free(c->rank_gone);
    free(c->by_rank);
    free(c);
}

int nrs_ctl_nconns(const nrs_ctl_t *c) { return c->nconns; }
nrs_conn_t *nrs_ctl_conn(const nrs_ctl_t *c, int i) { return c->conns[i]; }
unsigned nrs_ctl_epoch(const nrs_ctl_t *c) { return committed(c)->epoch; }
unsigned nrs_ctl_pending_epoch(const nrs_ctl_t *c) { return c->tr != TR_IDLE ? c->tr_epoch : 0; }
int nrs_ctl_nworkers(const nrs_ctl_t *c) { return c->nworkers; }
unsigned long nrs_ctl_reports(const nrs_ctl_t *c) { return c->reports; }
const nrs_adapt_t *nrs_ctl_adapt(const nrs_ctl_t *c) { return &c->a; }
