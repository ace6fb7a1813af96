/* The worker API: the control channel to nereus-controller (plans, PREPARE /
 * COMMIT / ABORT, reports), collectives through it, and a growing world
 * (worker_int.h). */
#define _GNU_SOURCE
#include <config.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <unistd.h>

#include "ctl/client.h"
#include "ctl/proto.h"
#include "adapt/adapt.h"
#include "rdv/rdv.h"
#include "util/util.h"
#include "worker/worker_int.h"
#include "xfer/ucx.h"
#include "xfer/xport_ucx.h"

/* ---- the control channel: plans, PREPARE / COMMIT / ABORT ------------------------ */

static void ctl_close(nrs_worker_t *w, const char *why)
{
    if (w->ctl_fd >= 0) { /* once, and loud: collectives through it fail from now on */
        close(w->ctl_fd);
        fprintf(stderr, "nereus: worker[%d]: control channel closed: %s\n", w->me, why);
    }
    w->ctl_fd = -1;
    snprintf(w->ctl_err, sizeof w->ctl_err, "control channel: %.360s", why);
}

/* A send on the channel failed (why): the controller may have said why before
 * it closed (an ERROR, e.g. "rank retired", behind frames already queued), so
 * read what is left before closing; an ERROR retires this rank. */
static void ctl_send_failed(nrs_worker_t *w, const char *why)
{
    char said[NRS_PROTO_TEXT_MAX + 64];
    if (w->ctl_fd >= 0 && !nrs_client_refusal(w->ctl_fd, said, sizeof said)) {
        ctl_close(w, said);
        w->retired = 1;
        nrs_wk_seterr(w, NRS_ERR_RETIRED, "%s", said);
        return;
    }
    ctl_close(w, why);
}

void nrs_wk_ctl_report(nrs_worker_t *w, const nrs_worker_report_t *r)
{
    nrs_msg_report_t m;
    uint8_t buf[1024];
    char err[256];
    /* no plan yet (epoch 0): nothing the controller could measure, and a
     * REPORT of epoch 0 is one it refuses */
    if (w->ctl_fd < 0 || !r->epoch)
        return;
    memset(&m, 0, sizeof m);
    m.epoch = r->epoch;
    m.step = r->step;
    m.flags = r->flags & (NRS_REPORT_MEM_HIGH | NRS_REPORT_MEM_FAILED);
    m.response_len = r->response_len;
    for (int i = 0; i < r->nstages; i++)
        if (r->seconds[i] >= NRS_PROTO_REPORT_MIN_S) { /* a stage of no measurable time: none */
            m.ms[m.nstages] = r->ms[i];
            m.seconds[m.nstages++] = r->seconds[i];
        }
    int len = nrs_enc_report(buf, sizeof buf, &m);
    if (len < 0) {
        ctl_close(w, "REPORT: does not encode");
    } else if (nrs_client_send(w->ctl_fd, buf, len, err, sizeof err)) {
        char why[300];
        snprintf(why, sizeof why, "REPORT: %.280s", err);
        ctl_send_failed(w, why);
    }
}

/* One frame within timeout_s (the wait for its first byte; the rest of a frame
 * must follow within NRS_WORKER_TIMEOUT): 1 with *h and the payload at
 * w->cbuf + NRS_PROTO_HDR, 0 on time-out, -1 when the channel is gone. */
int nrs_wk_ctl_recv(nrs_worker_t *w, double timeout_s, nrs_hdr_t *h)
{
    char err[256];
    if (w->ctl_fd < 0)
        return -1;
    if (!w->cbuf && !(w->cbuf = malloc(NRS_PROTO_HDR + NRS_PROTO_MAX_PAYLOAD)))
        return -1;
    struct pollfd p = {.fd = w->ctl_fd, .events = POLLIN};
    int pr;
    /* With UCX up, in slices, progressing it in between: a send this rank
     * counts as done may still sit in UCX's own queue (tcp), and a peer
     * waits for it while this rank waits here (a vote, a gather). Awake
     * time, in slices anyway (util.h): a rank stopped with its job (a Slurm
     * suspend) has not waited for the controller meanwhile, and reads its
     * answer after the resume; every wait on the controller goes through
     * here, and their deadlines are on the same clock. */
    double end = nrs_awake_s() + (timeout_s > 0 ? timeout_s : 0);
    for (;;) {
        double left = end - nrs_awake_s();
        int ms = nrs_awake_slice_ms(left);
        if (w->u && ms > 2)
            ms = 2;
        pr = poll(&p, 1, ms);
        if (pr < 0 && errno == EINTR)
            continue;
        if (pr != 0 || nrs_awake_s() >= end)
            break;
        if (w->u)
            nrs_ucx_progress(w->u);
    }
    if (pr == 0)
        return 0;
    if (pr < 0 || nrs_client_recv(w->ctl_fd, w->cbuf, NRS_PROTO_HDR + NRS_PROTO_MAX_PAYLOAD, h,
                                  w->timeout_s, err, sizeof err)) {
        ctl_close(w, pr < 0 ? "poll failed" : err);
        return -1;
    }
    return 1;
}

void nrs_wk_ctl_ack(nrs_worker_t *w, unsigned epoch, unsigned phase, int status, double seconds)
{
    nrs_msg_ack_t a = {epoch, phase, status, seconds > 0 ? seconds : 0};
    uint8_t buf[64];
    char err[256];
    if (w->ctl_fd >= 0 && nrs_client_send(w->ctl_fd, buf, nrs_enc_ack(buf, sizeof buf, &a), err,
                                          sizeof err))
        ctl_send_failed(w, err);
}

/* ERROR from the controller: this rank is retired (or refused). */
static int ctl_error(nrs_worker_t *w, const nrs_hdr_t *h)
{
    nrs_msg_error_t e;
    char why[NRS_PROTO_TEXT_MAX + 64];
    if (nrs_dec_error(w->cbuf + NRS_PROTO_HDR, h->length, &e, NULL, 0))
        snprintf(e.text, sizeof e.text, "(malformed ERROR)");
    snprintf(why, sizeof why, "the controller says %s: %s", nrs_perr_name((int)e.code), e.text);
    ctl_close(w, why);
    w->retired = 1;
    return nrs_wk_seterr(w, NRS_ERR_RETIRED, "%s", why);
}

/* At the point of no return of a controller-driven transition: every rank has
 * voted yes; tell the controller, and go on only on its COMMIT. The
 * controller decides within its --transition-timeout, so this waits longer
 * (4 x NRS_WORKER_TIMEOUT); a rank that gives up all the same says so
 * (ACK status NRS_ACK_GAVE_UP), so that the controller aborts everyone with
 * it or, if it had already committed, retires it: never a silent split. */
int nrs_wk_ctl_ponr(void *arg, char *why, size_t whylen)
{
    nrs_worker_t *w = arg;
    nrs_hdr_t h;
    double end = nrs_awake_s() + 4 * w->timeout_s;
    if (w->run_aborted) { /* its ABORT came before the vote passed: no yes from here */
        snprintf(why, whylen, "the controller aborted epoch %u", w->ctl_epoch);
        return -1;
    }
    nrs_wk_ctl_ack(w, w->ctl_epoch, NRS_MSG_PREPARE, 0, 0);
    w->ponr_acked = 1;
    while (w->ctl_fd >= 0 && nrs_awake_s() < end) {
        int k = nrs_wk_ctl_recv(w, end - nrs_awake_s(), &h);
        if (k <= 0)
            break;
        if (h.type == NRS_MSG_ERROR) {
            ctl_error(w, &h);
            snprintf(why, whylen, "%s", w->err);
            return -1;
        }
        if (h.type != NRS_MSG_COMMIT && h.type != NRS_MSG_ABORT) {
            int d = w->defer; /* a new PLAN, PREPARE or WORLD: kept for later */
            w->defer = 1;
            nrs_wk_ctl_frame(w, &h);
            w->defer = d;
            continue;
        }
        nrs_msg_epoch_t m;
        if (nrs_dec_epoch(h.type, w->cbuf + NRS_PROTO_HDR, h.length, &m, NULL, 0) ||
            m.epoch != w->ctl_epoch)
            continue;
        if (h.type == NRS_MSG_COMMIT)
            return 0;
        nrs_wk_ctl_frame(w, &h); /* the bookkeeping of every ABORT (aborted_epoch, ...) */
        snprintf(why, whylen, "the controller aborted epoch %u: %s", m.epoch, m.text);
        return -1;
    }
    snprintf(why, whylen, "no COMMIT from the controller for epoch %u (%s)", w->ctl_epoch,
             w->ctl_fd < 0 ? w->ctl_err : "timed out");
    if (w->ctl_fd < 0) /* undecided: the others may have got it (dtrans settle) */
        return 1;
    nrs_wk_ctl_ack(w, w->ctl_epoch, NRS_MSG_PREPARE, NRS_ACK_GAVE_UP, 0);
    return -1;
}

static int prepare_run(nrs_worker_t *w, unsigned epoch, const nrs_msg_plan_t *m);

/* NRS_WORKER_DROP=RANK:prepare:EPOCH or RANK:world:GEN: rank RANK never reads
 * the PREPARE of EPOCH or the WORLD of GEN (as if it never came), while the
 * others do: the tests' check that the step agreement has every rank leave
 * it alike. */
static bool drop_hook(const nrs_worker_t *w, const char *what, unsigned n)
{
    const char *k = getenv("NRS_WORKER_DROP");
    char *end;
    size_t l = strlen(what);
    return k && strtol(k, &end, 10) == w->me && *end == ':' && !strncmp(end + 1, what, l) &&
           end[1 + l] == ':' && strtoul(end + 2 + l, NULL, 10) == n;
}

/* PREPARE(epoch): the transition the pending PLAN announced. */
int nrs_wk_ctl_prepare(nrs_worker_t *w, unsigned epoch)
{
    nrs_msg_plan_t *m = w->pend;
    if (!w->have_pend || m->plan.epoch != epoch || !w->have_plan || !w->allocated ||
        m->prev_epoch != w->plan.epoch) {
        nrs_wk_ctl_ack(w, epoch, NRS_MSG_PREPARE, 3, 0);
        w->have_pend = 0;
        return nrs_wk_seterr(w, NRS_ERR_PLAN, "PREPARE of epoch %u: no matching PLAN from epoch %d",
                             epoch, nrs_worker_epoch(w));
    }
    w->have_pend = 0;
    w->pend = NULL; /* this transition's: a PLAN that comes meanwhile is kept apart */
    int rc = prepare_run(w, epoch, m);
    free(m);
    return rc;
}

static int prepare_run(nrs_worker_t *w, unsigned epoch, const nrs_msg_plan_t *m)
{
    int *map = calloc((size_t)m->plan.total_gpus + 1, sizeof(int));
    if (!map) {
        nrs_wk_ctl_ack(w, epoch, NRS_MSG_PREPARE, 2, 0);
        return nrs_wk_seterr(w, NRS_ERR_NOMEM, "out of memory");
    }
    nrs_resize_t rz = {m->lost, m->nlost};
    nrs_adapt_gpu_map(w->plan.total_gpus, m->plan.total_gpus, m->nlost ? &rz : NULL,
                      w->spec.cluster.gpus_per_node, map);
    w->ctl_epoch = epoch;
    w->ponr_acked = 0;
    w->run_aborted = 0;
    w->running = 1;
    double t0 = nrs_now_s();
    int rc = nrs_wk_do_transition(w, &m->plan, map, m->lost, m->nlost, 1);
    w->running = 0;
    free(map);
    double dt = nrs_now_s() - t0;
    if (rc == NRS_OK) {
        nrs_wk_ctl_ack(w, epoch, NRS_MSG_COMMIT, 0, dt);
        return 1;
    }
    if (rc == NRS_ERR_PARTIAL) {
        nrs_wk_ctl_ack(w, epoch, NRS_MSG_COMMIT, 1, dt);
        return rc;
    }
    /* failed before the vote passed: the controller aborts (not when it did
     * already: an ACK of that epoch would count for its retry, which reuses
     * the number) */
    if (!w->ponr_acked && !w->run_aborted)
        nrs_wk_ctl_ack(w, epoch, NRS_MSG_PREPARE, rc == NRS_ERR_ABORTED ? 1 : 2, 0);
    if (w->retired)
        return NRS_ERR_RETIRED;
    return rc == NRS_ERR_ABORTED ? rc : NRS_ERR_ABORTED;
}

int nrs_wk_ctl_frame(nrs_worker_t *w, const nrs_hdr_t *h)
{
    char why[256];
    const uint8_t *p = w->cbuf + NRS_PROTO_HDR;
    switch (h->type) {
    case NRS_MSG_PLAN: {
        nrs_msg_plan_t *m = malloc(sizeof *m);
        int rc = NRS_OK;
        if (!m)
            return nrs_wk_seterr(w, NRS_ERR_NOMEM, "out of memory");
        if (nrs_dec_plan(p, h->length, m, why, sizeof why)) {
            free(m);
            ctl_close(w, "malformed PLAN");
            return nrs_wk_seterr(w, NRS_ERR_PLAN, "PLAN from the controller: %s", why);
        }
        if (m->flags & NRS_PLAN_TRANSITION) { /* kept for its PREPARE */
            if (w->aborted_epoch >= m->plan.epoch) /* a new attempt of an aborted epoch */
                w->aborted_epoch = m->plan.epoch - 1;
            free(w->pend);
            w->pend = m;
            w->have_pend = 1;
            return NRS_OK;
        }
        if (!w->have_plan) { /* the committed plan, answer to HELLO */
            rc = nrs_worker_set_plan(w, &m->plan);
            rc = rc ? rc : 2;
        } /* else: the plan we run, again */
        free(m);
        return rc;
    }
    case NRS_MSG_PREPARE: {
        nrs_msg_epoch_t m;
        if (nrs_dec_epoch(h->type, p, h->length, &m, why, sizeof why))
            return nrs_wk_seterr(w, NRS_ERR_PLAN, "PREPARE: %s", why);
        if (drop_hook(w, "prepare", m.epoch))
            return NRS_OK;
        if (w->defer) { /* nrs_worker_control_step runs it once every rank has agreed */
            w->prep_epoch = m.epoch;
            return NRS_OK;
        }
        return nrs_wk_ctl_prepare(w, m.epoch);
    }
    case NRS_MSG_WORLD: {
        nrs_msg_world_t *m = malloc(sizeof *m);
        if (!m)
            return nrs_wk_seterr(w, NRS_ERR_NOMEM, "out of memory");
        if (nrs_dec_world(p, h->length, m, why, sizeof why)) {
            free(m);
            ctl_close(w, "malformed WORLD");
            return nrs_wk_seterr(w, NRS_ERR_PLAN, "WORLD from the controller: %s", why);
        }
        if (m->gen <= w->world_gen || m->gen <= w->world_dropped || m->rank != w->me ||
            drop_hook(w, "world", m->gen)) {
            free(m);
            return NRS_OK;
        }
        free(w->world_pend); /* switched at the next step boundary, by agreement */
        w->world_pend = m;
        return NRS_OK;
    }
    case NRS_MSG_ERROR:
        return ctl_error(w, h);
    case NRS_MSG_ABORT: { /* a PREPARE kept for the step agreement is void */
        nrs_msg_epoch_t m;
        if (nrs_dec_epoch(h->type, p, h->length, &m, NULL, 0))
            return NRS_OK;
        if (m.epoch > w->aborted_epoch)
            w->aborted_epoch = m.epoch;
        if (w->running && m.epoch == w->ctl_epoch)
            w->run_aborted = 1; /* the running one: it must not vote yes at its PONR */
        if (w->prep_epoch == m.epoch)
            w->prep_epoch = 0;
        if (w->have_pend && w->pend && w->pend->plan.epoch == m.epoch)
            w->have_pend = 0;
        return NRS_OK;
    }
    default: /* late COMMIT of a finished transition, status text */
        return NRS_OK;
    }
}

int nrs_worker_control_plan(nrs_worker_t *w, double timeout_s)
{
    nrs_hdr_t h;
    int bad = nrs_wk_cannot_act(w, __func__);
    if (bad)
        return bad;
    if (w->ctl_fd < 0)
        return nrs_wk_seterr(w, NRS_ERR_INVAL, "nrs_worker_control_plan: no control channel: %s",
                             nrs_worker_control(w));
    double end = nrs_awake_s() + timeout_s;
    while (!w->have_plan) {
        double left = end - nrs_awake_s();
        int k = left > 0 ? nrs_wk_ctl_recv(w, left, &h) : 0;
        if (k < 0)
            return w->retired ? nrs_wk_retired_err(w, __func__)
                              : nrs_wk_seterr(w, NRS_ERR_INVAL, "%s", w->ctl_err);
        if (k == 0)
            return nrs_wk_seterr(w, NRS_ERR_PLAN, "no plan from the controller within %.1f s",
                                 timeout_s);
        int rc = nrs_wk_ctl_frame(w, &h);
        if (rc < 0)
            return rc;
    }
    return NRS_OK;
}

int nrs_worker_control_poll(nrs_worker_t *w, double timeout_s)
{
    nrs_hdr_t h;
    int first = 1;
    int bad = nrs_wk_cannot_act(w, __func__);
    if (bad)
        return bad;
    if (w->prep_epoch) { /* a PREPARE that came during the last run's votes (a retry) */
        unsigned e = w->prep_epoch;
        w->prep_epoch = 0;
        return nrs_wk_ctl_prepare(w, e);
    }
    while (w->ctl_fd >= 0) {
        int k = nrs_wk_ctl_recv(w, first ? timeout_s : 0, &h);
        first = 0;
        if (k <= 0)
            return NRS_OK; /* nothing more, or the channel is gone: the job runs on */
        int rc = nrs_wk_ctl_frame(w, &h);
        if (rc != NRS_OK && rc != 2)
            return rc; /* a transition ran (1, or its failure), or an error */
    }
    return NRS_OK;
}

/* ---- collectives through the controller (GATHER / GATHERED) ------------------------ */

struct nrs_wk_gsend {
    nrs_msg_gather_t m;
    uint8_t frame[NRS_PROTO_HDR + NRS_PROTO_MAX_PAYLOAD];
};

int nrs_wk_ctl_buffers(nrs_worker_t *w)
{
    if (!w->cbuf)
        w->cbuf = malloc(NRS_PROTO_HDR + NRS_PROTO_MAX_PAYLOAD);
    if (!w->gsend)
        w->gsend = malloc(sizeof(*w->gsend));
    return w->cbuf && w->gsend ? 0 : -1;
}

/* nrs_rdv_gather's contract over the control channel: the controller waits for
 * every participant or its channel's end, and gives all the same answer. */
int nrs_wk_ctl_gather(void *arg, uint64_t key, const char *name, const void *mine, size_t len,
                      const int *out, int nout, void *all, unsigned char *got, double timeout_s,
                      char *err, size_t errlen)
{
    nrs_worker_t *w = arg;
    char why[256];
    int rc = -1, saved = w->defer;
    if (got)
        memset(got, 0, (size_t)w->n);
    if (w->ctl_fd < 0 || nrs_wk_ctl_buffers(w)) {
        snprintf(err, errlen, "gather %s: %s", name, w->ctl_fd >= 0 ? "out of memory"
                 : w->ctl_err[0] ? w->ctl_err : "no control channel");
        return -1;
    }
    if (len > NRS_GATHER_DATA_MAX || nout > NRS_GATHER_MAX_OUT) {
        snprintf(err, errlen, "gather %s: %zu bytes, %d ranks out: too large for the control "
                 "channel", name, len, nout);
        return -1;
    }
    nrs_msg_gather_t *m = &w->gsend->m;
    uint8_t *buf = w->gsend->frame;
    m->key = key;
    snprintf(m->name, sizeof m->name, "%s", name);
    m->timeout_ms = (uint32_t)(timeout_s > 0 ? timeout_s * 1000 : 30000);
    m->nranks = w->n;
    m->nout = nout;
    memcpy(m->out, out, sizeof(int32_t) * (size_t)nout);
    m->len = (uint32_t)len;
    m->data = mine;
    int n = nrs_enc_gather(buf, sizeof w->gsend->frame, m);
    if (n < 0 || nrs_client_send(w->ctl_fd, buf, n, why, sizeof why)) {
        if (n >= 0)
            ctl_send_failed(w, why);
        snprintf(err, errlen, "gather %s: %s", name,
                 n < 0 ? "does not encode" : w->retired ? w->ctl_err : why);
        return -1;
    }
    if (!all) /* its answer, when it comes, is one to a gather given up on */
        return 0;
    /* the controller answers within timeout_s of the first contribution */
    double end = nrs_awake_s() + 2 * (timeout_s > 0 ? timeout_s : 30) + 5;
    w->defer = 1; /* a PREPARE that comes meanwhile is kept for the step's agreement */
    for (;;) {
        nrs_hdr_t h;
        double left = end - nrs_awake_s();
        int k = left > 0 ? nrs_wk_ctl_recv(w, left, &h) : 0;
        if (k <= 0) {
            snprintf(err, errlen, "gather %s: %s", name,
                     k < 0 ? w->ctl_err : "no answer from the controller");
            goto out;
        }
        if (h.type == NRS_MSG_GATHERED) {
            nrs_msg_gathered_t g;
            if (nrs_dec_gathered(w->cbuf + NRS_PROTO_HDR, h.length, &g, why, sizeof why)) {
                ctl_close(w, "malformed GATHERED");
                snprintf(err, errlen, "gather %s: GATHERED: %s", name, why);
                goto out;
            }
            if (g.key != key || strcmp(g.name, name) || g.len != len)
                continue; /* an answer to an earlier gather this rank gave up on */
            for (uint32_t i = 0; i < g.count; i++) {
                int32_t r;
                const uint8_t *d;
                nrs_gathered_entry(&g, i, &r, &d);
                if (r < w->n) {
                    got[r] = 1;
                    if (len)
                        memcpy((char *)all + (size_t)r * len, d, len);
                }
            }
            if (!(h.flags & NRS_FLAG_MORE))
                break;
            continue;
        }
        if (h.type == NRS_MSG_ABORT && w->ctl_epoch && key == w->ctl_epoch) {
            nrs_msg_epoch_t a;
            if (!nrs_dec_epoch(h.type, w->cbuf + NRS_PROTO_HDR, h.length, &a, NULL, 0) &&
                a.epoch == w->ctl_epoch) {
                nrs_wk_ctl_frame(w, &h); /* the bookkeeping of every ABORT (aborted_epoch, ...) */
                w->run_aborted = w->running; /* whatever this gather was for */
                snprintf(err, errlen, "gather %s: the controller aborted epoch %u: %.300s", name,
                         a.epoch, a.text);
                goto out;
            }
            continue;
        }
        if (nrs_wk_ctl_frame(w, &h) < 0 && (w->retired || w->ctl_fd < 0)) {
            snprintf(err, errlen, "gather %s: %s", name, w->ctl_err);
            goto out;
        }
    }
    rc = 0;
out:
    w->defer = saved;
    return rc;
}

/* The collective the worker uses at step boundaries: the controller's, or
 * the PMIx rendezvous'. */
int nrs_wk_coll_gather(nrs_worker_t *w, uint64_t key, const char *name, const void *mine,
                       size_t len, const int *out, int nout, void *all, unsigned char *got,
                       char *err, size_t errlen)
{
    if (w->coll_ctl)
        return nrs_wk_ctl_gather(w, key, name, mine, len, out, nout, all, got, w->timeout_s, err,
                                 errlen);
    if (!all)
        return nrs_rdv_gather_post(w->r, key, name, mine, len, out, nout, w->timeout_s, err,
                                   errlen);
    return nrs_rdv_gather(w->r, key, name, mine, len, out, nout, all, got, w->timeout_s, err,
                          errlen);
}

int32_t nrs_wk_coll_i32(nrs_worker_t *w, uint64_t key, const char *name, int32_t mine,
                        const int *out, int nout, int op)
{
    int32_t *all = calloc((size_t)w->n + 1, sizeof(*all));
    unsigned char *got = calloc((size_t)w->n + 1, 1);
    char err[384];
    if (!all || !got) { /* it still takes part, without the answer: a no for ALL */
        free(all);
        free(got);
        if (op == NRS_WK_ALL)
            mine = 0;
        nrs_wk_coll_gather(w, key, name, &mine, sizeof mine, out, nout, NULL, NULL, err,
                           sizeof err);
        return op == NRS_WK_ALL ? 0 : -1;
    }
    bool ok = !nrs_wk_coll_gather(w, key, name, &mine, sizeof mine, out, nout, all, got, err,
                                  sizeof err);
    int32_t res = op == NRS_WK_ALL ? ok : -1;
    for (int r = 0; ok && r < w->n; r++) {
        bool part = true;
        for (int i = 0; i < nout; i++)
            part = part && out[i] != r;
        if (op == NRS_WK_MAX && got[r] && all[r] > res)
            res = all[r];
        else if (op == NRS_WK_ALL && part && !(got[r] && all[r]))
            res = 0;
    }
    free(all);
    free(got);
    return res;
}

/* ---- a growing world: the ranks of a join step (docs/worker-api.md §7) ------------ */

/* WORLD_NOLEN: the length a rank gives in wlen<gen> when it cannot switch
 * (no memory for the switch, its transport could not grow); WORLD_NOMEM:
 * the mark (at byte 20) of its entry in world<gen> when it has no memory for
 * that gather's answer. Every rank reads the mark and none switches. */
enum { WORLD_BLOB = 8192, WORLD_HDR = 24, WORLD_NOMEM = 3 };
#define WORLD_NOLEN 0xFFFFFFFFu

static void put_u32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static uint32_t get_u32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static int grow_arrays(nrs_worker_t *w, int size)
{
    int *perm = realloc(w->perm, sizeof(int) * ((size_t)size + 1));
    if (perm)
        w->perm = perm;
    unsigned char **a[4] = {&w->leaving, &w->gone, &w->dead, &w->waiting};
    for (int k = 0; perm && k < 4; k++) {
        unsigned char *q = realloc(*a[k], (size_t)size + 1);
        if (!q)
            return -1;
        if (size > w->n)
            memset(q + w->n, 0, (size_t)(size - w->n) + 1);
        *a[k] = q;
    }
    return perm && !nrs_wk_agree_mem(w, size) ? 0 : -1;
}

/* The first rank whose entry in a gather's answer (got[r], its bytes at
 * all + r * len, the u32 at byte at) is mark, or -1. */
static int marked(const unsigned char *all, const unsigned char *got, int n, size_t len,
                  size_t at, uint32_t mark)
{
    for (int r = 0; r < n; r++)
        if (got[r] == 1 && get_u32(all + (size_t)r * len + at) == mark)
            return r;
    return -1;
}

/* Every rank of the world (the first step's and the joiners) gives its
 * address and where it is; all compute the same ranks order and connect.
 * A rank takes part in both gathers whatever befalls it: each has its
 * memory before the gather, and a rank without it (or whose transport could
 * not grow) still sends its part, marked, without waiting for the answer;
 * every rank reads the mark and none switches. A rank that returned before
 * a gather left the others waiting for it (the controller's gather then
 * completed without it: taken for dead; PMIx fences pair by participants). */
int nrs_wk_world_switch(nrs_worker_t *w, const nrs_msg_world_t *m)
{
    char err[512], name[32];
    int size = m->size, rc = NRS_OK, *left = NULL, nleft = 0, who;
    uint32_t blob = 0;
    unsigned char *mine = NULL, *all = NULL, *got = NULL, *lall = NULL, *lgot = NULL,
                  *placed = NULL, l4[4];
    void **addrs = NULL;
    size_t *lens = NULL;
    /* a world refused leaves the current one as it was: its size and order */
    int old_n = w->n, *old_perm = malloc(sizeof(int) * ((size_t)w->n + 1));
    if (old_perm && w->perm)
        memcpy(old_perm, w->perm, sizeof(int) * (size_t)w->n);
    if (!nrs_wk_nomem(w, "wlen", m->gen)) { /* the first gather's memory */
        mine = calloc(WORLD_BLOB, 1);
        left = malloc(sizeof(int) * NRS_GATHER_MAX_OUT);
        lall = calloc((size_t)size, 4);
        lgot = calloc((size_t)size + 1, 1);
    }
    if (!mine || !old_perm || !left || !lall || !lgot || grow_arrays(w, size)) {
        rc = nrs_wk_seterr(w, NRS_ERR_NOMEM, "world %u: out of memory", m->gen);
        goto cannot;
    }
    w->n = size;
    if (w->joiner && !w->u) {
        nrs_ucx_opts_t uo;
        nrs_ucx_opts_init(&uo);
        uo.op_timeout_s = w->timeout_s;
        w->me = m->rank;
        if (nrs_ucx_init(&w->u, w->me, size, &uo, err, sizeof err)) {
            rc = nrs_wk_seterr(w, NRS_ERR_XPORT, "%s", err);
            goto cannot;
        }
    } else if (nrs_ucx_grow(w->u, size, err, sizeof err)) {
        rc = nrs_wk_seterr(w, NRS_ERR_XPORT, "%s", err);
        goto cannot;
    }
    for (int i = 0; i < m->nout; i++)
        w->dead[m->out[i]] = 1;
    const void *addr;
    size_t alen;
    nrs_ucx_address(w->u, &addr, &alen);
    if (alen > WORLD_BLOB - WORLD_HDR) {
        rc = nrs_wk_seterr(w, NRS_ERR_XPORT, "transport address of %zu bytes", alen);
        goto cannot;
    }
    /* the blobs fit the longest address (not WORLD_BLOB bytes each: the
     * answer goes to every rank): a first gather of the lengths; a rank
     * missing from it is left out of the second */
    put_u32(l4, (uint32_t)alen);
    snprintf(name, sizeof name, "wlen%u", m->gen);
    if (nrs_wk_coll_gather(w, NRS_WORLD_KEY | m->gen, name, l4, 4, m->out, m->nout, lall, lgot,
                           err, sizeof err)) {
        rc = nrs_wk_seterr(w, NRS_ERR_RDV, "world %u: %s", m->gen, err);
        goto out;
    }
    for (int i = 0; i < m->nout; i++)
        lgot[m->out[i]] = 2; /* left out already */
    if ((who = marked(lall, lgot, size, 4, 0, WORLD_NOLEN)) >= 0) {
        rc = nrs_wk_seterr(w, NRS_ERR_RDV, "world %u: rank %d cannot switch (out of memory, or "
                           "its transport): no rank switches, the world stays as it was", m->gen,
                           who);
        goto out;
    }
    for (int r = 0; r < size; r++) {
        uint32_t l = get_u32(lall + 4 * (size_t)r);
        if (lgot[r] == 1 && l > WORLD_BLOB - WORLD_HDR) {
            rc = nrs_wk_seterr(w, NRS_ERR_XPORT,
                               "world %u: rank %d's transport address is %u bytes", m->gen, r, l);
            goto out;
        }
        if (lgot[r] == 1)
            blob = l > blob ? l : blob;
        if (lgot[r] != 1 && nleft == NRS_GATHER_MAX_OUT) {
            rc = nrs_wk_seterr(w, NRS_ERR_RDV, "world %u: more than %d ranks gone", m->gen,
                               NRS_GATHER_MAX_OUT);
            goto out;
        }
        if (lgot[r] != 1)
            left[nleft++] = r;
    }
    blob = (WORLD_HDR + blob + 7) / 8 * 8;
    put_u32(mine, (uint32_t)alen);
    put_u32(mine + 4, w->joiner && w->join_step < 0 ? 0 : (uint32_t)(w->my_gpu + 1));
    put_u32(mine + 8, w->attempt);
    put_u32(mine + 12, (uint32_t)(w->last_step + 1));
    put_u32(mine + 16, w->have_plan ? w->plan.epoch : 0);
    /* 1: a joiner new to the world; 2: one of an earlier join still in line
     * for a GPU (a rank new to the world learns it from this) */
    put_u32(mine + 20, !w->joiner ? 0 : w->join_step < 0 ? 1 : w->my_gpu < 0 ? 2 : 0);
    memcpy(mine + WORLD_HDR, addr, alen);
    snprintf(name, sizeof name, "world%u", m->gen);
    if (!nrs_wk_nomem(w, "world", m->gen)) { /* the second gather's memory */
        all = calloc((size_t)size, blob);
        got = calloc((size_t)size + 1, 1);
        addrs = calloc((size_t)size + 1, sizeof(void *));
        lens = calloc((size_t)size + 1, sizeof(size_t));
        placed = calloc((size_t)size + 1, 1);
    }
    if (!all || !got || !addrs || !lens || !placed) { /* its entry, marked, all the same */
        put_u32(mine + 20, WORLD_NOMEM);
        nrs_wk_coll_gather(w, NRS_WORLD_KEY | m->gen, name, mine, blob, left, nleft, NULL, NULL,
                           err, sizeof err);
        rc = nrs_wk_seterr(w, NRS_ERR_NOMEM, "world %u: out of memory: this rank said so, no "
                           "rank switches, the world stays as it was", m->gen);
        goto out;
    }
    if (nrs_wk_coll_gather(w, NRS_WORLD_KEY | m->gen, name, mine, blob, left, nleft, all, got,
                           err, sizeof err)) {
        rc = nrs_wk_seterr(w, NRS_ERR_RDV, "world %u: %s", m->gen, err);
        goto out;
    }
    if ((who = marked(all, got, size, blob, 20, WORLD_NOMEM)) >= 0) {
        rc = nrs_wk_seterr(w, NRS_ERR_RDV, "world %u: rank %d has no memory for it: no rank "
                           "switches, the world stays as it was", m->gen, who);
        goto out;
    }
    /* ranks order: the current plan's GPUs, then the joiners, then the others */
    unsigned epoch = 0, attempt = 0;
    int step = -1, total = w->have_plan ? w->plan.total_gpus : 0, np = 0;
    if (total > size) {
        rc = nrs_wk_seterr(w, NRS_ERR_PLAN, "world %u: %d ranks for the %d GPUs of epoch %u",
                           m->gen, size, total, w->plan.epoch);
        goto out;
    }
    for (int g = 0; g < total; g++)
        w->perm[g] = -1;
    for (int r = 0; r < size; r++) {
        const unsigned char *b = all + (size_t)r * blob;
        if (!got[r]) {
            w->dead[r] = 1;
            nrs_ucx_mark_failed(w->u, r);
            continue;
        }
        uint32_t g1 = get_u32(b + 4), l = get_u32(b);
        if (g1 > (uint32_t)total || (g1 && w->perm[g1 - 1] >= 0) ||
            l > blob - WORLD_HDR || (lgot[r] == 1 && l != get_u32(lall + 4 * (size_t)r))) {
            rc = nrs_wk_seterr(w, NRS_ERR_PLAN, "world %u: rank %d's entry does not fit (GPU %u "
                               "of %d, a %u-byte address in %u)", m->gen, r, g1, total, l,
                               blob - WORLD_HDR);
            goto out;
        }
        if (g1) {
            w->perm[g1 - 1] = r;
            placed[r] = 1;
        } else if (get_u32(b + 20)) {
            w->waiting[r] = 1; /* a joiner in line for a GPU */
        }
        if (get_u32(b + 20) != 1) { /* a rank already in the world: its counters */
            attempt = get_u32(b + 8) > attempt ? get_u32(b + 8) : attempt;
            step = (int)get_u32(b + 12) > step ? (int)get_u32(b + 12) : step;
            epoch = get_u32(b + 16);
        }
        addrs[r] = (void *)(b + WORLD_HDR);
        lens[r] = get_u32(b);
    }
    for (int g = 0; g < total; g++) /* before the others are placed: size slots in all */
        if (w->perm[g] < 0) {
            rc = nrs_wk_seterr(w, NRS_ERR_PLAN, "world %u: no rank holds GPU %d of epoch %u",
                               m->gen, g, w->plan.epoch);
            goto out;
        }
    np = total;
    for (int r = m->base; r < size; r++) /* the joiners that came, then the others */
        if (!placed[r] && got[r])
            w->perm[np++] = r, placed[r] = 1;
    for (int r = 0; r < size; r++)
        if (!placed[r])
            w->perm[np++] = r;
    if (w->have_plan && epoch && epoch != w->plan.epoch) {
        rc = nrs_wk_seterr(w, NRS_ERR_PLAN, "world %u: the job is on epoch %u, this rank on %u",
                           m->gen, epoch, w->plan.epoch);
        goto out;
    }
    if (nrs_ucx_connect(w->u, addrs, lens, err, sizeof err)) {
        rc = nrs_wk_seterr(w, NRS_ERR_XPORT, "world %u: %s", m->gen, err);
        goto out;
    }
    if (w->joiner && !w->x.ops) {
        w->attempt = attempt;
        w->join_step = step;
        w->my_gpu = -1;
        if (nrs_xport_ucx_open(&w->x, w->u, nrs_wk_owner_rank, w)) {
            rc = nrs_wk_seterr(w, NRS_ERR_NOMEM, "out of memory");
            goto out;
        }
    }
    w->world_gen = m->gen;
    goto out;
cannot: /* this rank cannot switch: it says so in the first gather (no answer read) */
    put_u32(l4, WORLD_NOLEN);
    snprintf(name, sizeof name, "wlen%u", m->gen);
    nrs_wk_coll_gather(w, NRS_WORLD_KEY | m->gen, name, l4, 4, m->out, m->nout, NULL, NULL, err,
                       sizeof err);
out:
    if (rc != NRS_OK && w->perm && old_perm && old_n <= size) {
        memcpy(w->perm, old_perm, sizeof(int) * (size_t)old_n);
        w->n = old_n;
    }
    free(old_perm);
    free(mine);
    free(left);
    free(lall);
    free(lgot);
    free(all);
    free(got);
    free(addrs);
    free(lens);
    free(placed);
    return rc;
}

/* A rank of a join step: HELLO as a joiner, wait for the world to be
 * complete (every joiner connected), join it, take the committed plan. */
int nrs_wk_join_world(nrs_worker_t *w)
{
    char why[256];
    nrs_hdr_t h;
    if (w->ctl_fd < 0)
        return nrs_wk_seterr(w, NRS_ERR_INVAL, "a joining rank needs the job's controller: %s",
                             nrs_worker_control(w));
    double end = nrs_awake_s() + nrs_wk_env_double("NRS_WORKER_JOIN_TIMEOUT", 120, 0.01, 1e6);
    while (!w->world_gen) {
        double left = end - nrs_awake_s();
        int k = left > 0 ? nrs_wk_ctl_recv(w, left, &h) : 0;
        if (k <= 0)
            return nrs_wk_seterr(w, NRS_ERR_RDV, "join: %s", k < 0 ? w->ctl_err
                                 : "the controller never completed the world (do all ranks of the "
                            "join step run?)");
        const uint8_t *p = w->cbuf + NRS_PROTO_HDR;
        if (h.type == NRS_MSG_PLAN) {
            nrs_msg_plan_t *m = malloc(sizeof *m);
            if (m && !nrs_dec_plan(p, h.length, m, why, sizeof why) &&
                !(m->flags & NRS_PLAN_TRANSITION)) {
                w->plan = m->plan;
                w->have_plan = 1;
                w->rep.epoch = m->plan.epoch;
            }
            free(m);
        } else if (h.type == NRS_MSG_WORLD) {
            nrs_msg_world_t *m = malloc(sizeof *m);
            int rc = !m ? nrs_wk_seterr(w, NRS_ERR_NOMEM, "out of memory")
                     : nrs_dec_world(p, h.length, m, why, sizeof why)
                         ? nrs_wk_seterr(w, NRS_ERR_PLAN, "WORLD: %s", why)
                         : nrs_wk_world_switch(w, m);
            free(m);
            if (rc)
                return rc;
        } else if (h.type == NRS_MSG_ERROR) {
            return ctl_error(w, &h);
        }
    }
    if (!w->have_plan)
        return nrs_wk_seterr(w, NRS_ERR_PLAN, "join: no plan from the controller");
    nrs_wk_free_state(w);
    w->my_gpu = -1;
    return nrs_wk_index_state(w);
}

int nrs_worker_joined_at(const nrs_worker_t *w)
{
    return w ? w->join_step : nrs_wk_nohandle(__func__);
}

int nrs_worker_job_step(const nrs_worker_t *w)
{
    return w ? w->job_step : nrs_wk_nohandle(__func__);
}
