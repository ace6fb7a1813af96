/* The controller's state machine without sockets: HELLO and the first plan,
 * per-step reports into the calibration, a lost node forcing epoch 2 through
 * PLAN -> PREPARE -> ACK -> COMMIT -> ACK, aborts (a rank gone, a rank that
 * cannot prepare), bad peers dropped with an ERROR, time-outs, status. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ctl/ctl.h"
#include "fixtures.h"

enum { N = 16 };
static nrs_spec_t spec;
static nrs_ctl_t *ctl;
static nrs_conn_t *w[N], *cli;
static double now;

/* ---- helpers ------------------------------------------------------------- */

static nrs_conn_t *peer(bool tcp)
{
    nrs_conn_t *k = nrs_conn_new(-1, now);
    k->tcp = tcp;
    assert_int_equal(nrs_ctl_attach(ctl, k, now), 0);
    return k;
}

static void feed(nrs_conn_t *k, const uint8_t *b, int n)
{
    assert_true(n > 0);
    size_t off = 0;
    while (off < (size_t)n && k->state < NRS_CONN_CLOSING) {
        off += nrs_conn_feed(k, b + off, (size_t)n - off, now);
        nrs_ctl_input(ctl, k, now);
    }
}

/* Pop the next frame the controller queued for k: its type, payload in *p. */
static int next(nrs_conn_t *k, const uint8_t **p, nrs_hdr_t *h)
{
    /* a few frames' payloads stay valid at once */
    static uint8_t buf[4][NRS_PROTO_HDR + NRS_PROTO_MAX_PAYLOAD];
    static int at;
    uint8_t *b = buf[at++ % 4];
    if (nrs_conn_pending(k) < NRS_PROTO_HDR)
        return 0;
    assert_int_equal(nrs_conn_take(k, b, NRS_PROTO_HDR), NRS_PROTO_HDR);
    assert_int_equal(nrs_proto_hdr_decode(b, h), 0);
    assert_int_equal(nrs_conn_take(k, b + NRS_PROTO_HDR, h->length), h->length);
    *p = b + NRS_PROTO_HDR;
    return h->type;
}

static int expect(nrs_conn_t *k, int type, const uint8_t **p, nrs_hdr_t *h)
{
    int t = next(k, p, h);
    if (t != type)
        fail_msg("expected %s, got %s", nrs_msg_name(type), t ? nrs_msg_name(t) : "nothing");
    return t;
}

static void hello(nrs_conn_t *k, int role, int rank, int nranks, const char *host, const char *tok)
{
    nrs_msg_hello_t m;
    uint8_t b[512];
    memset(&m, 0, sizeof(m));
    m.role = (uint32_t)role;
    m.rank = rank;
    m.nranks = nranks;
    snprintf(m.host, sizeof(m.host), "%s", host);
    snprintf(m.token, sizeof(m.token), "%s", tok ? tok : "");
    feed(k, b, nrs_enc_hello(b, sizeof(b), &m));
}

static void report(nrs_conn_t *k, unsigned epoch, unsigned step, double gen_s)
{
    nrs_msg_report_t m;
    uint8_t b[256];
    memset(&m, 0, sizeof(m));
    m.epoch = epoch;
    m.step = step;
    m.nstages = 2;
    m.ms[0] = NRS_MS_ACTOR_GENERATE;
    m.seconds[0] = gen_s;
    m.ms[1] = NRS_MS_ACTOR_TRAIN;
    m.seconds[1] = 4;
    feed(k, b, nrs_enc_report(b, sizeof(b), &m));
}

static void ack(nrs_conn_t *k, unsigned epoch, unsigned phase, int status)
{
    nrs_msg_ack_t a = {epoch, phase, status, 0.5};
    uint8_t b[64];
    feed(k, b, nrs_enc_ack(b, sizeof(b), &a));
}

static void delta_lost_host(nrs_conn_t *k, const char *host, nrs_msg_delta_reply_t *r)
{
    static nrs_msg_delta_t m;
    static uint8_t b[NRS_PROTO_HDR + NRS_PROTO_MAX_PAYLOAD];
    const uint8_t *p;
    nrs_hdr_t h;
    memset(&m, 0, sizeof(m));
    m.kind = NRS_DELTA_LOST;
    m.nhosts = 1;
    snprintf(m.hosts[0], NRS_PROTO_STR_MAX, "%s", host);
    feed(k, b, nrs_enc_delta(b, sizeof(b), &m));
    expect(k, NRS_MSG_DELTA_REPLY, &p, &h);
    assert_int_equal(nrs_dec_delta_reply(p, h.length, r, NULL, 0), 0);
}

/* A REMOVE/LOST delta naming host (may be NULL) and/or GPUs gpus[0..ngpus). */
static void delta_send(nrs_conn_t *k, uint32_t kind, const char *host, const int *gpus, int ngpus,
                       nrs_msg_delta_reply_t *r)
{
    static nrs_msg_delta_t m;
    static uint8_t b[NRS_PROTO_HDR + NRS_PROTO_MAX_PAYLOAD];
    const uint8_t *p;
    nrs_hdr_t h;
    memset(&m, 0, sizeof(m));
    m.kind = kind;
    if (host) {
        m.nhosts = 1;
        snprintf(m.hosts[0], NRS_PROTO_STR_MAX, "%s", host);
    }
    for (int i = 0; i < ngpus; i++)
        m.gpus[m.ngpus++] = gpus[i];
    feed(k, b, nrs_enc_delta(b, sizeof(b), &m));
    expect(k, NRS_MSG_DELTA_REPLY, &p, &h);
    assert_int_equal(nrs_dec_delta_reply(p, h.length, r, NULL, 0), 0);
}

static void status_has(const char *needle)
{
    char *txt = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&txt, &len);
    nrs_ctl_status(ctl, true, now, f);
    fclose(f);
    if (!strstr(txt, needle))
        fail_msg("status lacks %s: %s", needle, txt);
    free(txt);
}

static void drain_all(void)
{
    for (int i = 0; i < nrs_ctl_nconns(ctl); i++)
        nrs_conn_clear_out(nrs_ctl_conn(ctl, i));
}

/* A controller on 16 GPUs (2 nodes) with 16 workers and one CLI, all HELLO'd. */
static int setup(void **st)
{
    (void)st;
    nrs_ctl_opts_t o;
    char err[NRS_ERR_MAX];
    spec_8b(&spec, 2);
    nrs_ctl_opts_init(&o, &spec);
    o.secret = "0123456789abcdef-secret";
    o.job = "77";
    now = 100;
    assert_int_equal(nrs_ctl_new(&ctl, &o, now, err, sizeof(err)), 0);
    for (int i = 0; i < N; i++) {
        char host[16];
        snprintf(host, sizeof(host), "node%d", i / 8);
        w[i] = peer(false);
        hello(w[i], NRS_ROLE_WORKER, i, N, host, NULL);
    }
    cli = peer(false);
    hello(cli, NRS_ROLE_CLI, 0, 0, "login", NULL);
    return 0;
}

static int teardown(void **st)
{
    (void)st;
    while (nrs_ctl_nconns(ctl) > 0) {
        nrs_conn_t *k = nrs_ctl_conn(ctl, nrs_ctl_nconns(ctl) - 1);
        nrs_ctl_detach(ctl, k, now);
        nrs_conn_free(k);
    }
    nrs_ctl_free(ctl);
    return 0;
}

/* Free a peer the way the loop does. */
static void gone(nrs_conn_t *k)
{
    nrs_ctl_detach(ctl, k, now);
    nrs_conn_free(k);
}

/* ---- tests ---------------------------------------------------------------- */

static void test_hello_gets_plan(void **st)
{
    (void)st;
    const uint8_t *p;
    nrs_hdr_t h;
    static nrs_msg_plan_t m;
    assert_int_equal(nrs_ctl_nworkers(ctl), N);
    expect(w[3], NRS_MSG_PLAN, &p, &h);
    assert_int_equal(nrs_dec_plan(p, h.length, &m, NULL, 0), 0);
    assert_int_equal(m.plan.epoch, 1);
    assert_int_equal(m.plan.total_gpus, N);
    assert_int_equal(m.flags, 0);
    assert_int_equal(next(cli, &p, &h), 0); /* a CLI gets nothing for its HELLO */

    /* duplicate rank, wrong nranks, wrong job, TCP without / with the token */
    nrs_conn_t *d = peer(false);
    hello(d, NRS_ROLE_WORKER, 3, N, "node0", NULL);
    assert_int_equal(d->state, NRS_CONN_CLOSING);
    expect(d, NRS_MSG_ERROR, &p, &h);
    gone(d);
    d = peer(false);
    hello(d, NRS_ROLE_WORKER, 3, N + 1, "node0", NULL);
    assert_int_equal(d->state, NRS_CONN_CLOSING);
    gone(d);
    d = peer(false);
    {
        nrs_msg_hello_t hm;
        uint8_t b[512];
        memset(&hm, 0, sizeof(hm));
        hm.role = NRS_ROLE_CLI;
        snprintf(hm.job, sizeof(hm.job), "78");
        feed(d, b, nrs_enc_hello(b, sizeof(b), &hm));
    }
    assert_int_equal(d->state, NRS_CONN_CLOSING);
    gone(d);
    d = peer(true);
    hello(d, NRS_ROLE_CLI, 0, 0, "remote", "wrong-token-wrong-token");
    expect(d, NRS_MSG_ERROR, &p, &h);
    nrs_msg_error_t e;
    assert_int_equal(nrs_dec_error(p, h.length, &e, NULL, 0), 0);
    assert_int_equal(e.code, NRS_PERR_AUTH);
    gone(d);
    d = peer(true);
    hello(d, NRS_ROLE_CLI, 0, 0, "remote", "0123456789abcdef-secret");
    assert_int_equal(d->state, NRS_CONN_READY);
    gone(d);
    assert_int_equal(nrs_ctl_nworkers(ctl), N);
}

static void test_reports_calibrate(void **st)
{
    (void)st;
    const nrs_adapt_t *a = nrs_ctl_adapt(ctl);
    for (unsigned s = 0; s < 3; s++)
        for (int i = 0; i < N; i++)
            report(w[i], 1, s, 1.5 * a->plan.ms_time[NRS_MS_ACTOR_GENERATE]);
    assert_int_equal(nrs_ctl_reports(ctl), 3 * N);
    /* one measurement per model-stage per step (the slowest rank's), not per report */
    assert_int_equal(a->cal.n[NRS_MS_ACTOR_GENERATE], 3);
    assert_int_equal(a->cal.n[NRS_MS_ACTOR_TRAIN], 3);
    assert_int_equal(a->cal.n[NRS_MS_REF_INFER], 0);
    /* a step not above the rank's last (re-run after a checkpoint restore, or
     * repeated): ignored, not a measurement, and the rank keeps its channel */
    report(w[0], 1, 1, 1.0);
    report(w[0], 1, 2, 1.0);
    report(w[0], 1, 2, 1.0);
    assert_int_equal(w[0]->state, NRS_CONN_READY);
    assert_int_equal(w[0]->last_step, 2);
    assert_int_equal(nrs_ctl_reports(ctl), 3 * N);
    assert_int_equal(a->cal.n[NRS_MS_ACTOR_GENERATE], 3);
    status_has("\"stale_reports\":3");
    /* the next higher step is taken again */
    report(w[0], 1, 3, 1.0);
    assert_int_equal(w[0]->state, NRS_CONN_READY);
    assert_int_equal(w[0]->last_step, 3);
    assert_int_equal(nrs_ctl_reports(ctl), 3 * N + 1);
    /* an epoch from the future: dropped */
    report(w[1], 9, 5, 1.0);
    assert_int_equal(w[1]->state, NRS_CONN_CLOSING);
    assert_int_equal(nrs_ctl_nworkers(ctl), N - 1);
}

/* What the ranks measured across a stop of the job (a Slurm suspend stops the
 * controller with them; the loop calls nrs_ctl_stopped at the resume) is no
 * sample: the step half reported before the stop, the step after a stop
 * between two, and a transition in flight (tests/ctl: stopped-step and
 * stopped-prepare, through a real SIGSTOP). */
static void test_stopped_not_measured(void **st)
{
    (void)st;
    const nrs_adapt_t *a = nrs_ctl_adapt(ctl);
    nrs_msg_delta_reply_t r;
    double gen = a->plan.ms_time[NRS_MS_ACTOR_GENERATE];
    for (int i = 0; i < N; i++)
        report(w[i], 1, 0, gen);
    for (int i = 0; i < N / 2; i++) /* step 1 open: half of it before the stop */
        report(w[i], 1, 1, gen);
    nrs_ctl_stopped(ctl, now, 30);
    for (int i = N / 2; i < N; i++)
        report(w[i], 1, 1, gen + 30);
    assert_int_equal(a->cal.n[NRS_MS_ACTOR_GENERATE], 1);
    for (int i = 0; i < N; i++)
        report(w[i], 1, 2, gen);
    assert_int_equal(a->cal.n[NRS_MS_ACTOR_GENERATE], 2);
    nrs_ctl_stopped(ctl, now, 30); /* between steps 2 and 3: step 3 spans it */
    for (int i = 0; i < N; i++)
        report(w[i], 1, 3, gen + 30);
    assert_int_equal(a->cal.n[NRS_MS_ACTOR_GENERATE], 2);
    for (int i = 0; i < N; i++)
        report(w[i], 1, 4, gen);
    assert_int_equal(a->cal.n[NRS_MS_ACTOR_GENERATE], 3);
    drain_all();
    delta_lost_host(cli, "node1", &r);
    assert_int_equal(nrs_ctl_pending_epoch(ctl), 2);
    nrs_ctl_stopped(ctl, now, 30);
    for (int i = 0; i < 8; i++)
        ack(w[i], 2, NRS_MSG_PREPARE, 0);
    for (int i = 0; i < 8; i++)
        ack(w[i], 2, NRS_MSG_COMMIT, 0);
    assert_int_equal(nrs_ctl_epoch(ctl), 2);
    assert_int_equal(nrs_ctl_adapt(ctl)->cal.sync_n, 0);
}

static void test_lost_node_commit(void **st)
{
    (void)st;
    const uint8_t *p;
    nrs_hdr_t h;
    nrs_msg_delta_reply_t r;
    static nrs_msg_plan_t m;
    nrs_msg_epoch_t em;
    drain_all();
    delta_lost_host(cli, "node1", &r);
    assert_int_equal(r.accepted, 1);
    assert_int_equal(r.epoch, 1);
    assert_int_equal(r.new_epoch, 2);
    assert_non_null(strstr(r.text, "forced"));
    assert_int_equal(nrs_ctl_pending_epoch(ctl), 2);
    for (int i = 8; i < N; i++) /* ranks on the lost node are retired */
        assert_int_equal(w[i]->state, NRS_CONN_CLOSING);
    for (int i = 0; i < 8; i++) {
        expect(w[i], NRS_MSG_PLAN, &p, &h);
        assert_int_equal(nrs_dec_plan(p, h.length, &m, NULL, 0), 0);
        assert_int_equal(m.plan.epoch, 2);
        assert_int_equal(m.prev_epoch, 1);
        assert_int_equal(m.flags, NRS_PLAN_TRANSITION | NRS_PLAN_FORCED);
        assert_int_equal(m.plan.total_gpus, 8);
        assert_int_equal(m.nlost, 8);
        assert_int_equal(m.lost[0], 8);
        expect(w[i], NRS_MSG_PREPARE, &p, &h);
    }
    for (int i = 0; i < 8; i++) {
        assert_int_equal(next(w[i], &p, &h), 0);
        ack(w[i], 2, NRS_MSG_PREPARE, 0);
    }
    for (int i = 0; i < 8; i++) {
        expect(w[i], NRS_MSG_COMMIT, &p, &h);
        assert_int_equal(nrs_dec_epoch(NRS_MSG_COMMIT, p, h.length, &em, NULL, 0), 0);
        assert_int_equal(em.epoch, 2);
    }
    assert_int_equal(nrs_ctl_epoch(ctl), 1); /* committed only once every rank confirms */
    for (int i = 0; i < 8; i++)
        ack(w[i], 2, NRS_MSG_COMMIT, 0);
    assert_int_equal(nrs_ctl_epoch(ctl), 2);
    assert_int_equal(nrs_ctl_pending_epoch(ctl), 0);
    assert_int_equal(nrs_ctl_nworkers(ctl), 8);
    assert_int_equal(nrs_ctl_adapt(ctl)->cal.sync_n, 1); /* the transition was measured */
    /* a delta for a host nobody runs on is rejected, the allocation unchanged */
    delta_lost_host(cli, "node1", &r);
    assert_int_equal(r.accepted, 0);
    assert_non_null(strstr(r.text, "unknown host"));

    char *txt = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&txt, &len);
    nrs_ctl_status(ctl, true, now + 5, f);
    fclose(f);
    assert_non_null(strstr(txt, "\"epoch\":2,"));
    assert_non_null(strstr(txt, "\"committed\":1"));
    assert_non_null(strstr(txt, "\"forced\":true"));
    assert_non_null(strstr(txt, "\"actor.generate\":{\"error\":"));
    free(txt);
    f = open_memstream(&txt, &len);
    nrs_ctl_status(ctl, false, now + 5, f);
    fclose(f);
    assert_non_null(strstr(txt, "epoch 2"));
    assert_non_null(strstr(txt, "model-stage"));
    assert_non_null(strstr(txt, "admitted (forced)"));
    free(txt);
}

/* A step's reports at response length len, each stage's time as the model
 * predicts it for the plan that runs (calibration factors stay 1). */
static void report_len(unsigned epoch, unsigned step, double len)
{
    const nrs_plan_t *p = &nrs_ctl_adapt(ctl)->plan;
    nrs_msg_report_t m;
    uint8_t b[256];
    for (int i = 0; i < N; i++) {
        if (!w[i]) /* (gone) */
            continue;
        memset(&m, 0, sizeof(m));
        m.epoch = epoch;
        m.step = step;
        m.response_len = len;
        m.nstages = 2;
        m.ms[0] = NRS_MS_ACTOR_GENERATE;
        m.seconds[0] = p->ms_time[NRS_MS_ACTOR_GENERATE];
        m.ms[1] = NRS_MS_ACTOR_TRAIN;
        m.seconds[1] = p->ms_time[NRS_MS_ACTOR_TRAIN];
        feed(w[i], b, nrs_enc_report(b, sizeof(b), &m));
    }
}

/* A response length the plan cannot hold whose best plan changes
 * micro-batches only (spec_8b, 16 GPUs, 1700 tokens): the ranks still get it
 * as a new epoch through PREPARE and COMMIT (they switch at one step), but it
 * is decided at no cost and the ranks' time for it, the votes of an empty
 * graph, is not taken for a transition's: before, it calibrated the transition
 * factor against 1 s of communicator set-up never run. */
static void test_retune_commit(void **st)
{
    (void)st;
    const uint8_t *p;
    nrs_hdr_t h;
    static nrs_msg_plan_t m;
    const nrs_plan_t old = nrs_ctl_adapt(ctl)->plan;
    drain_all();
    report_len(1, 0, 1700);
    assert_int_equal(nrs_ctl_pending_epoch(ctl), 2);
    for (int i = 0; i < N; i++) {
        expect(w[i], NRS_MSG_PLAN, &p, &h);
        assert_int_equal(nrs_dec_plan(p, h.length, &m, NULL, 0), 0);
        assert_int_equal(m.flags, NRS_PLAN_TRANSITION | NRS_PLAN_FORCED);
        assert_int_equal(m.nlost, 0);
        expect(w[i], NRS_MSG_PREPARE, &p, &h);
    }
    assert_true(nrs_adapt_retune(&old, &m.plan) && !nrs_plan_same_layout(&old, &m.plan));
    for (int i = 0; i < N; i++)
        ack(w[i], 2, NRS_MSG_PREPARE, 0);
    for (int i = 0; i < N; i++) {
        expect(w[i], NRS_MSG_COMMIT, &p, &h);
        ack(w[i], 2, NRS_MSG_COMMIT, 0); /* 0.5 s each */
    }
    assert_int_equal(nrs_ctl_epoch(ctl), 2);
    if (nrs_ctl_adapt(ctl)->cal.sync_n != 0)
        fail_msg("a micro-batch re-tune calibrated transitions (%d sample)",
                 nrs_ctl_adapt(ctl)->cal.sync_n);
    status_has("\"retune\":true,\"saving_s\":0,\"horizon_steps\":");
    status_has("\"cost_s\":0,\"makespan_s\":0,");
    status_has("\"committed\":1,\"aborted\":0,\"retunes\":1,");
}

/* A rank gone for good while its node stays (its process crashed, or the
 * controller dropped it; no watcher reports it): its GPU is lost at the
 * controller's next decision, here the survivors' next step, and the plan
 * announced leaves it out (forced, the rest of its node with it: whole
 * nodes). One back before that decision keeps its GPU. Before, the next
 * plans kept the GPU of the gone rank, whose votes never come: every
 * transition aborted. */
static void test_gone_rank_lost(void **st)
{
    (void)st;
    const uint8_t *p;
    nrs_hdr_t h;
    static nrs_msg_plan_t m;
    drain_all();
    gone(w[3]);
    w[3] = peer(false); /* back before a decision: the GPU is its again */
    hello(w[3], NRS_ROLE_WORKER, 3, N, "node0", NULL);
    expect(w[3], NRS_MSG_PLAN, &p, &h);
    report_len(1, 0, 0);
    status_has("\"lost_gpus_pending\":0,");
    assert_int_equal(nrs_ctl_pending_epoch(ctl), 0);
    gone(w[3]);
    w[3] = NULL;
    assert_int_equal(nrs_ctl_pending_epoch(ctl), 0); /* (no decision yet) */
    report_len(1, 1, 0);
    assert_int_equal(nrs_ctl_pending_epoch(ctl), 2);
    for (int i = 0; i < N; i++) {
        if (!w[i])
            continue;
        expect(w[i], NRS_MSG_PLAN, &p, &h);
        assert_int_equal(nrs_dec_plan(p, h.length, &m, NULL, 0), 0);
        assert_int_equal(m.flags, NRS_PLAN_TRANSITION | NRS_PLAN_FORCED);
        assert_int_equal(m.plan.total_gpus, 8);
        assert_int_equal(m.nlost, 1);
        assert_int_equal(m.lost[0], 3);
        expect(w[i], NRS_MSG_PREPARE, &p, &h);
    }
    status_has("\"gpus\":15,\"lost_gpus_pending\":1,");
    /* lost: a HELLO for it is refused now */
    nrs_conn_t *d = peer(false);
    hello(d, NRS_ROLE_WORKER, 3, 15, "node0", NULL);
    expect(d, NRS_MSG_ERROR, &p, &h);
    nrs_msg_error_t e;
    assert_int_equal(nrs_dec_error(p, h.length, &e, NULL, 0), 0);
    assert_non_null(strstr(e.text, "rank 3 has no GPU"));
    gone(d);
    for (int i = 0; i < N; i++)
        if (w[i])
            ack(w[i], 2, NRS_MSG_PREPARE, 0);
    for (int i = 0; i < N; i++)
        if (w[i])
            ack(w[i], 2, NRS_MSG_COMMIT, 0);
    assert_int_equal(nrs_ctl_epoch(ctl), 2);
    assert_int_equal(nrs_ctl_nworkers(ctl), 8); /* node1's ranks; node0's have no place */
    status_has("\"gpus\":15,");
    /* the LOST of node0 all the same (the node failed after all): known, no
     * new plan; its GPUs left without a place leave the allocation's count,
     * and a second source's LOST is "already applied" */
    nrs_msg_delta_reply_t r;
    delta_lost_host(cli, "node0", &r);
    assert_int_equal(r.accepted, 1);
    assert_non_null(strstr(r.text, "applied: 8 GPUs"));
    assert_int_equal(r.new_epoch, 0);
    delta_lost_host(cli, "node0", &r);
    assert_int_equal(r.accepted, 1);
    assert_non_null(strstr(r.text, "already applied"));
    assert_int_equal(nrs_ctl_pending_epoch(ctl), 0);
    status_has("\"gpus\":8,");
}

/* The same release from two sources (a released node's hint, then the
 * watcher's poll; by name or as GPU indices, in either order) is applied
 * once: the second is accepted as "already applied", keeps the generation
 * and does not abort the transition the first one announced. */
static void test_delta_twice(void **st)
{
    (void)st;
    nrs_msg_delta_reply_t r;
    int node1[8] = {8, 9, 10, 11, 12, 13, 14, 15}, mixed[2] = {8, 0};
    nrs_conn_t *hint = peer(false), *watcher = peer(false);
    hello(hint, NRS_ROLE_WATCHER, 0, 0, "node1", NULL);
    hello(watcher, NRS_ROLE_WATCHER, 0, 0, "login", NULL);
    drain_all();
    delta_send(hint, NRS_DELTA_REMOVE, "node1", NULL, 0, &r);
    assert_int_equal(r.accepted, 1);
    assert_int_equal(r.generation, 1);
    assert_int_equal(r.new_epoch, 2);
    assert_int_equal(nrs_ctl_pending_epoch(ctl), 2);
    status_has("\"gpus\":8,");
    /* again by name: no change, the announced epoch goes on */
    delta_send(watcher, NRS_DELTA_REMOVE, "node1", NULL, 0, &r);
    assert_int_equal(r.accepted, 1);
    assert_int_equal(r.generation, 1);
    assert_int_equal(r.epoch, 1);
    assert_int_equal(r.new_epoch, 2);
    assert_non_null(strstr(r.text, "already applied"));
    assert_int_equal(nrs_ctl_pending_epoch(ctl), 2);
    /* as GPU indices (the watcher's fallback), and as LOST: the same */
    delta_send(watcher, NRS_DELTA_REMOVE, NULL, node1, 8, &r);
    assert_int_equal(r.accepted, 1);
    assert_int_equal(r.generation, 1);
    assert_non_null(strstr(r.text, "already applied"));
    delta_send(watcher, NRS_DELTA_LOST, "node1", node1, 8, &r);
    assert_int_equal(r.accepted, 1);
    assert_int_equal(r.generation, 1);
    assert_int_equal(nrs_ctl_pending_epoch(ctl), 2);
    status_has("\"gpus\":8,");
    status_has("\"generation\":1,");
    /* an unknown host is still refused */
    delta_send(watcher, NRS_DELTA_REMOVE, "node7", NULL, 0, &r);
    assert_int_equal(r.accepted, 0);
    assert_non_null(strstr(r.text, "unknown host"));
    /* partly new: only the new GPU counts */
    delta_send(watcher, NRS_DELTA_REMOVE, NULL, mixed, 2, &r);
    assert_int_equal(r.accepted, 1);
    assert_int_equal(r.generation, 2);
    status_has("\"gpus\":7,");
    status_has("\"generation\":2,");
}

/* A rank that ACKed PREPARE and then gave up waiting for COMMIT (ACK status
 * NRS_ACK_GAVE_UP): before COMMIT every rank is told ABORT; after COMMIT it
 * alone is retired. Either way no rank keeps an epoch the others left. */
static void gave_up(bool after_commit)
{
    const uint8_t *p;
    nrs_hdr_t h;
    nrs_msg_delta_reply_t r;
    drain_all();
    delta_lost_host(cli, "node1", &r);
    assert_int_equal(r.accepted, 1);
    for (int i = 0; i < 8; i++) {
        expect(w[i], NRS_MSG_PLAN, &p, &h);
        expect(w[i], NRS_MSG_PREPARE, &p, &h);
    }
    for (int i = 0; i < (after_commit ? 8 : 1); i++)
        ack(w[i], 2, NRS_MSG_PREPARE, 0);
    if (!after_commit) {
        ack(w[0], 2, NRS_MSG_PREPARE, NRS_ACK_GAVE_UP);
        for (int i = 0; i < 8; i++)
            expect(w[i], NRS_MSG_ABORT, &p, &h);
        assert_int_equal(nrs_ctl_epoch(ctl), 1);
        assert_int_equal(nrs_ctl_nworkers(ctl), 8);
        return;
    }
    for (int i = 0; i < 8; i++)
        expect(w[i], NRS_MSG_COMMIT, &p, &h);
    ack(w[3], 2, NRS_MSG_PREPARE, NRS_ACK_GAVE_UP);
    expect(w[3], NRS_MSG_ERROR, &p, &h);
    assert_int_equal(w[3]->state, NRS_CONN_CLOSING);
    for (int i = 0; i < 8; i++)
        if (i != 3)
            assert_true(w[i]->state < NRS_CONN_CLOSING);
}

static void test_gave_up_before_commit(void **st)
{
    (void)st;
    gave_up(false);
}

static void test_gave_up_after_commit(void **st)
{
    (void)st;
    gave_up(true);
}

/* More GPUs lost than one PLAN can carry (NRS_PROTO_MAX_LOST), in one delta
 * or over two while a plan is pending: refused whole, not written past the
 * lists (the controller once crashed on both). A job of 4,208 GPUs, one
 * worker holding its transition in PREPARE. */
static void test_too_many_lost(void **st)
{
    (void)st;
    nrs_msg_delta_reply_t r;
    static int g[NRS_PROTO_MAX_LOST];
    teardown(NULL);
    nrs_ctl_opts_t o;
    char err[NRS_ERR_MAX];
    spec_8b(&spec, 526);
    nrs_ctl_opts_init(&o, &spec);
    o.secret = "0123456789abcdef-secret";
    o.job = "78";
    assert_int_equal(nrs_ctl_new(&ctl, &o, now, err, sizeof(err)), 0);
    nrs_conn_t *k = peer(false), *c = peer(false);
    hello(k, NRS_ROLE_WORKER, 0, 4208, "big", NULL);
    hello(c, NRS_ROLE_CLI, 0, 0, "login", NULL);
    drain_all();
    for (int i = 0; i < NRS_PROTO_MAX_LOST; i++)
        g[i] = i + 1;
    delta_send(c, NRS_DELTA_LOST, NULL, g, NRS_PROTO_MAX_LOST, &r);
    assert_int_equal(r.accepted, 1);
    for (int i = 0; i < 111; i++)
        g[i] = NRS_PROTO_MAX_LOST + 1 + i;
    delta_send(c, NRS_DELTA_LOST, NULL, g, 111, &r);
    assert_int_equal(r.accepted, 0);
    assert_non_null(strstr(r.text, "too many GPUs lost"));
    status_has("\"generation\":1,"); /* the second one left no trace */
}

static void test_abort_on_gone_rank(void **st)
{
    (void)st;
    const uint8_t *p;
    nrs_hdr_t h;
    nrs_msg_delta_reply_t r;
    nrs_msg_epoch_t em;
    drain_all();
    delta_lost_host(cli, "node1", &r);
    assert_int_equal(r.new_epoch, 2);
    for (int i = 0; i < 7; i++)
        ack(w[i], 2, NRS_MSG_PREPARE, 0);
    gone(w[7]); /* before the point of no return */
    w[7] = NULL;
    assert_int_equal(nrs_ctl_pending_epoch(ctl), 0);
    assert_int_equal(nrs_ctl_epoch(ctl), 1);
    for (int i = 0; i < 7; i++) {
        expect(w[i], NRS_MSG_PLAN, &p, &h);
        expect(w[i], NRS_MSG_PREPARE, &p, &h);
        expect(w[i], NRS_MSG_ABORT, &p, &h);
        assert_int_equal(nrs_dec_epoch(NRS_MSG_ABORT, p, h.length, &em, NULL, 0), 0);
        assert_int_equal(em.epoch, 2);
        assert_non_null(strstr(em.text, "gone"));
    }
    /* the old plan is intact; the retry (after its back-off) proposes again,
     * as a new attempt under a new number */
    assert_int_equal(nrs_ctl_adapt(ctl)->plan.epoch, 1);
    assert_int_equal(nrs_ctl_adapt(ctl)->plan.total_gpus, N);
    nrs_ctl_tick(ctl, now + 0.5);
    assert_int_equal(nrs_ctl_pending_epoch(ctl), 0);
    now += 1.5;
    nrs_ctl_tick(ctl, now);
    assert_int_equal(nrs_ctl_pending_epoch(ctl), 3);
    /* a rank that cannot prepare aborts it too */
    ack(w[0], 3, NRS_MSG_PREPARE, 5);
    assert_int_equal(nrs_ctl_pending_epoch(ctl), 0);
    assert_int_equal(nrs_ctl_epoch(ctl), 1);
}

static void test_prepare_timeout(void **st)
{
    (void)st;
    nrs_msg_delta_reply_t r;
    delta_lost_host(cli, "node1", &r);
    assert_int_equal(nrs_ctl_pending_epoch(ctl), 2);
    nrs_ctl_tick(ctl, now + 61); /* transition_timeout_s 60 */
    assert_int_equal(nrs_ctl_pending_epoch(ctl), 0);
    assert_int_equal(nrs_ctl_epoch(ctl), 1);
}

static void test_bad_peers(void **st)
{
    (void)st;
    const uint8_t *p;
    nrs_hdr_t h;
    nrs_msg_error_t e;
    uint8_t junk[100];
    memset(junk, 0xa5, sizeof(junk));
    nrs_conn_t *k = peer(false);
    feed(k, junk, sizeof(junk));
    assert_int_equal(k->state, NRS_CONN_CLOSING);
    expect(k, NRS_MSG_ERROR, &p, &h);
    assert_int_equal(nrs_dec_error(p, h.length, &e, NULL, 0), 0);
    assert_int_equal(e.code, NRS_PERR_MAGIC);
    gone(k);
    /* REPORT before HELLO */
    k = peer(false);
    report(k, 1, 0, 1);
    expect(k, NRS_MSG_ERROR, &p, &h);
    assert_int_equal(nrs_dec_error(p, h.length, &e, NULL, 0), 0);
    assert_int_equal(e.code, NRS_PERR_UNEXPECTED);
    gone(k);
    /* a controller-to-peer message from a peer */
    k = peer(false);
    hello(k, NRS_ROLE_CLI, 0, 0, "x", NULL);
    nrs_msg_epoch_t em = {2, ""};
    uint8_t b[64];
    feed(k, b, nrs_enc_epoch(b, sizeof(b), NRS_MSG_COMMIT, &em));
    assert_int_equal(k->state, NRS_CONN_CLOSING);
    gone(k);
    /* a malformed HELLO */
    k = peer(false);
    nrs_msg_hello_t hm;
    memset(&hm, 0, sizeof(hm));
    hm.role = NRS_ROLE_WORKER;
    hm.rank = 20;
    hm.nranks = 4;
    uint8_t hb[512];
    int n = nrs_enc_hello(hb, sizeof(hb), &hm);
    feed(k, hb, n);
    expect(k, NRS_MSG_ERROR, &p, &h);
    assert_int_equal(nrs_dec_error(p, h.length, &e, NULL, 0), 0);
    assert_int_equal(e.code, NRS_PERR_MALFORMED);
    gone(k);
    /* half a frame, then silence: dropped by the frame time-out; no HELLO at all:
     * dropped by the HELLO time-out */
    nrs_conn_t *slow = peer(false), *mute = peer(false);
    nrs_msg_hello_t sm;
    memset(&sm, 0, sizeof(sm));
    sm.role = NRS_ROLE_CLI;
    n = nrs_enc_hello(hb, sizeof(hb), &sm);
    nrs_conn_feed(slow, hb, (size_t)n - 3, now);
    nrs_ctl_input(ctl, slow, now);
    assert_int_equal(slow->state, NRS_CONN_NEW);
    nrs_ctl_tick(ctl, now + 4);
    assert_int_equal(slow->state, NRS_CONN_NEW);
    assert_int_equal(mute->state, NRS_CONN_NEW);
    nrs_ctl_tick(ctl, now + 6);
    assert_int_equal(mute->state, NRS_CONN_CLOSING);
    assert_int_equal(slow->state, NRS_CONN_CLOSING); /* no HELLO within 5 s either */
    nrs_ctl_tick(ctl, now + 9);
    assert_int_equal(mute->state, NRS_CONN_DEAD); /* flush of its ERROR took too long */
    gone(slow);
    gone(mute);
    assert_int_equal(nrs_ctl_nworkers(ctl), N);
}

static void test_status_chunks(void **st)
{
    (void)st;
    const uint8_t *p;
    nrs_hdr_t h;
    nrs_msg_status_req_t q = {NRS_STATUS_JSON};
    uint8_t b[64];
    drain_all();
    feed(cli, b, nrs_enc_status_req(b, sizeof(b), &q));
    expect(cli, NRS_MSG_STATUS, &p, &h);
    assert_int_equal(h.flags, 0);
    assert_true(h.length > 100);
    assert_memory_equal(p, "{\"job\":\"77\"", 11);
}

/* GPUs lost end the plan even when as many GPUs remain as it has (joiners
 * not yet planned make up the count): never "the best plan is the one we
 * run" with dead GPUs in it (runtime/adapt, as the controller calls it). */
static void test_lost_replans_same_count(void **st)
{
    (void)st;
    nrs_adapt_t a;
    nrs_adapt_out_t out;
    nrs_work_t work;
    char err[NRS_ERR_MAX];
    int lost[8] = {8, 9, 10, 11, 12, 13, 14, 15};
    nrs_work_from_spec(&spec, &work);
    nrs_cond_t cond = {N, work};
    nrs_resize_t rz = {lost, 8};
    assert_int_equal(nrs_adapt_init(&a, &spec, &cond, err, sizeof(err)), 0);
    assert_int_equal(nrs_adapt_step(&a, 10, &cond, &rz, false, &out, err, sizeof(err)), 0);
    assert_int_equal(out.trigger, NRS_TRIGGER_RESOURCES);
    assert_true(out.changed);
    assert_int_equal(a.plan.epoch, 2);
    assert_int_equal(a.plan.total_gpus, N);
}

/* The GPU numbering of a resize (runtime/adapt): survivors on whole nodes
 * first, then those of damaged nodes, then new GPUs; place() is map's inverse. */
static void check_map(int old_total, int gpn, const int *lost, int nlost, int new_total)
{
    int map[80], at[80], nw = 0, s = 0;
    char gone[80] = {0}, damaged[80] = {0};
    nrs_resize_t rz = {lost, nlost};
    for (int i = 0; i < nlost; i++)
        gone[lost[i]] = 1, damaged[gpn > 0 ? lost[i] / gpn : 0] = gpn > 0;
    for (int g = 0; gpn > 0 && g < old_total; g++)
        damaged[g / gpn] |= (g / gpn + 1) * gpn > old_total; /* the partial node */
    for (int g = 0; g < old_total; g++)
        s += !gone[g], nw += !gone[g] && !(gpn > 0 && damaged[g / gpn]);
    nrs_adapt_gpu_map(old_total, new_total, nlost ? &rz : NULL, gpn, map);
    for (int g = 0; g < old_total; g++) {
        at[g] = nrs_adapt_gpu_place(old_total, lost, nlost, gpn, g);
        if (gone[g] != (at[g] < 0))
            fail_msg("GPU %d of %d (%d a node): place %d", g, old_total, gpn, at[g]);
        if (at[g] >= 0 && at[g] < new_total && map[at[g]] != g)
            fail_msg("GPU %d placed at %d, map there %d", g, at[g], map[at[g]]);
    }
    for (int i = 0; i < new_total; i++) {
        int g = map[i];
        if (i >= s) { /* new GPUs after every survivor */
            assert_int_equal(g, old_total + (i - s));
            continue;
        }
        assert_true(g >= 0 && g < old_total && !gone[g]);
        if (i > 0 && i != nw && map[i - 1] >= g) /* in order within each group */
            fail_msg("map[%d] = %d after %d", i, g, map[i - 1]);
        if (i < nw && gpn > 0) /* a whole node lands on a whole node, GPU for GPU */
            assert_int_equal(g % gpn, i % gpn);
        else if (gpn > 0)
            assert_true(damaged[g / gpn]);
    }
}

static void test_gpu_map_whole_nodes(void **st)
{
    (void)st;
    int one[] = {1}, map[12];
    nrs_resize_t rz = {one, 1};
    /* 12 GPUs, 4 a node, GPU 1 lost: the 8-GPU plan is nodes 1 and 2 */
    nrs_adapt_gpu_map(12, 8, &rz, 4, map);
    for (int i = 0; i < 8; i++)
        assert_int_equal(map[i], 4 + i);
    assert_int_equal(nrs_adapt_gpu_place(12, one, 1, 4, 0), 8);
    assert_int_equal(nrs_adapt_gpu_place(12, one, 1, 4, 3), 10);
    assert_int_equal(nrs_adapt_gpu_place(12, one, 1, 4, 1), -1);
    /* no GPU per node given: the survivors in order, as before */
    nrs_adapt_gpu_map(12, 8, &rz, 0, map);
    assert_int_equal(map[0], 0);
    assert_int_equal(map[1], 2);
    unsigned seed = 12345;
    for (int t = 0; t < 3000; t++) {
        seed = seed * 1103515245u + 12345u;
        int gpn = (int[]){0, 1, 2, 4, 8}[(seed >> 16) % 5];
        int nodes = 1 + (int)((seed >> 8) % 8);
        int old_total = gpn ? nodes * gpn : nodes;
        if (gpn > 1 && (seed & 1)) /* a plan below one node */
            old_total = 1 + (int)((seed >> 4) % (unsigned)(gpn - 1));
        int lost[64], nlost = 0;
        for (int g = 0; g < old_total; g++) {
            seed = seed * 1103515245u + 12345u;
            if ((seed >> 16) % 5 == 0)
                lost[nlost++] = g;
        }
        seed = seed * 1103515245u + 12345u;
        check_map(old_total, gpn, lost, nlost, (int)((seed >> 16) % (unsigned)(old_total + 5)));
    }
}

/* Before HELLO a peer cannot make the controller buffer a frame longer
 * than a HELLO: the header alone is refused with ERROR(LENGTH). */
static void test_prehello_length(void **st)
{
    (void)st;
    const uint8_t *p;
    nrs_hdr_t h;
    nrs_msg_error_t e;
    uint8_t b[NRS_PROTO_HDR + 64];
    nrs_conn_t *k = peer(true);
    nrs_proto_hdr_encode(b, NRS_MSG_HELLO, 0, NRS_PROTO_MAX_PAYLOAD);
    memset(b + NRS_PROTO_HDR, 0, 64);
    feed(k, b, sizeof(b));
    expect(k, NRS_MSG_ERROR, &p, &h);
    assert_int_equal(nrs_dec_error(p, h.length, &e, NULL, 0), 0);
    assert_int_equal(e.code, NRS_PERR_LENGTH);
    assert_true(k->in_cap <= 4096);
    /* the longest HELLO still fits */
    nrs_conn_t *k2 = peer(true);
    nrs_msg_hello_t m;
    uint8_t hb[1024];
    memset(&m, 0, sizeof(m));
    m.role = NRS_ROLE_CLI;
    memset(m.job, 'j', sizeof(m.job) - 1);
    memset(m.host, 'h', sizeof(m.host) - 1);
    memset(m.token, 't', sizeof(m.token) - 1);
    int n = nrs_enc_hello(hb, sizeof(hb), &m);
    assert_int_equal(n, NRS_PROTO_HDR + NRS_PROTO_HELLO_MAX);
    feed(k2, hb, n);
    expect(k2, NRS_MSG_ERROR, &p, &h); /* a bad token (AUTH), not a LENGTH */
    assert_int_equal(nrs_dec_error(p, h.length, &e, NULL, 0), 0);
    assert_int_equal(e.code, NRS_PERR_AUTH);
}

/* ---- the ranks' all-gather (GATHER -> GATHERED) ---------------------------- */

static void gather(nrs_conn_t *k, uint64_t key, const char *name, uint32_t val, const int *out,
                   int nout, uint32_t timeout_ms)
{
    static nrs_msg_gather_t m;
    static uint8_t b[NRS_PROTO_HDR + NRS_PROTO_MAX_PAYLOAD];
    memset(&m, 0, sizeof(m));
    m.key = key;
    snprintf(m.name, sizeof(m.name), "%s", name);
    m.timeout_ms = timeout_ms;
    m.nranks = N;
    m.nout = nout;
    for (int i = 0; i < nout; i++)
        m.out[i] = out[i];
    m.len = sizeof(val);
    m.data = (const uint8_t *)&val;
    feed(k, b, nrs_enc_gather(b, sizeof(b), &m));
}

/* The answer k got: ranks present into got[N] with their values; chunks. */
static int gathered(nrs_conn_t *k, const char *name, unsigned char *got, uint32_t *vals)
{
    const uint8_t *p;
    nrs_hdr_t h;
    int chunks = 0;
    memset(got, 0, N);
    do {
        expect(k, NRS_MSG_GATHERED, &p, &h);
        nrs_msg_gathered_t g;
        assert_int_equal(nrs_dec_gathered(p, h.length, &g, NULL, 0), 0);
        assert_string_equal(g.name, name);
        for (uint32_t i = 0; i < g.count; i++) {
            int32_t r;
            const uint8_t *d;
            nrs_gathered_entry(&g, i, &r, &d);
            assert_true(r >= 0 && r < N);
            got[r] = 1;
            memcpy(&vals[r], d, sizeof(vals[r]));
        }
        chunks++;
    } while (h.flags & NRS_FLAG_MORE);
    return chunks;
}

static void test_gather(void **st)
{
    (void)st;
    const uint8_t *p;
    nrs_hdr_t h;
    unsigned char got[N];
    uint32_t vals[N];
    int out[2] = {14, 15};
    drain_all();
    /* every rank but 14 and 15: nobody hears anything before the last one */
    for (int i = 0; i < N - 2; i++) {
        gather(w[i], 7, "ag0", 100u + (unsigned)i, out, 2, 5000);
        if (i < N - 3)
            assert_int_equal(next(w[i], &p, &h), 0);
    }
    for (int i = 0; i < N - 2; i++) {
        gathered(w[i], "ag0", got, vals);
        for (int r = 0; r < N; r++) {
            assert_int_equal(got[r], r < N - 2);
            if (r < N - 2)
                assert_int_equal(vals[r], 100u + (unsigned)r);
        }
    }
    assert_int_equal(next(w[14], &p, &h), 0); /* left out: no answer */
    /* a rank whose channel closes is not waited for */
    for (int i = 1; i < N; i++)
        gather(w[i], 7, "ag1", 1, NULL, 0, 5000);
    assert_int_equal(next(w[1], &p, &h), 0);
    gone(w[0]);
    w[0] = NULL;
    for (int i = 1; i < N; i++) {
        gathered(w[i], "ag1", got, vals);
        assert_int_equal(got[0], 0);
        assert_int_equal(got[i], 1);
    }
    /* ... nor later: rank 0 is known gone */
    for (int i = 1; i < N; i++)
        gather(w[i], 8, "ag2", 2, NULL, 0, 5000);
    gathered(w[3], "ag2", got, vals);
    assert_int_equal(got[0], 0);
    assert_int_equal(got[15], 1);
    drain_all();
    /* a silent rank: the gather completes at its deadline, without it */
    for (int i = 1; i < N - 1; i++)
        gather(w[i], 9, "ag3", 3, NULL, 0, 2000);
    nrs_ctl_tick(ctl, now + 1);
    assert_int_equal(next(w[1], &p, &h), 0);
    nrs_ctl_tick(ctl, now + 2.5);
    gathered(w[1], "ag3", got, vals);
    assert_int_equal(got[15], 0);
    assert_int_equal(got[14], 1);
    drain_all();
    /* refusals: twice, a disagreement on who takes part, left out of it */
    gather(w[1], 10, "ag4", 4, NULL, 0, 2000);
    gather(w[1], 10, "ag4", 4, NULL, 0, 2000);
    expect(w[1], NRS_MSG_ERROR, &p, &h);
    assert_int_equal(w[1]->state, NRS_CONN_CLOSING);
    gather(w[2], 10, "ag4", 4, out, 2, 2000);
    expect(w[2], NRS_MSG_ERROR, &p, &h);
    gather(w[14], 11, "ag5", 4, out, 2, 2000);
    expect(w[14], NRS_MSG_ERROR, &p, &h);
}

/* A contribution after its gather completed is late: refused at once, never
 * the start of a second gather of the same (key, name) with another answer.
 * A rank that had contributed starts the name over (a name used again). */
static void test_gather_late(void **st)
{
    (void)st;
    const uint8_t *p;
    nrs_hdr_t h;
    unsigned char got[N];
    uint32_t vals[N];
    nrs_msg_error_t e;
    drain_all();
    for (int i = 0; i < N; i++)
        if (i != 5)
            gather(w[i], 12, "ag6", 6, NULL, 0, 1000);
    nrs_ctl_tick(ctl, now + 1.5);
    for (int i = 0; i < N; i++)
        if (i != 5) {
            gathered(w[i], "ag6", got, vals);
            assert_int_equal(got[5], 0);
        }
    now += 2;
    gather(w[5], 12, "ag6", 6, NULL, 0, 1000);
    expect(w[5], NRS_MSG_ERROR, &p, &h);
    assert_int_equal(nrs_dec_error(p, h.length, &e, NULL, 0), 0);
    assert_int_equal(e.code, NRS_PERR_REFUSED);
    assert_non_null(strstr(e.text, "already completed without this rank"));
    assert_int_equal(next(w[5], &p, &h), 0);
    assert_int_equal(w[5]->state, NRS_CONN_CLOSING);
    nrs_ctl_tick(ctl, now + 1.5); /* and no second gather answers it later */
    assert_int_equal(next(w[5], &p, &h), 0);
    gone(w[5]);
    w[5] = NULL;
    /* the same (key, name) again, from a rank that contributed: a new gather */
    for (int i = 0; i < N; i++) {
        if (i == 5)
            continue;
        gather(w[i], 12, "ag6", 7, NULL, 0, 1000);
        assert_int_equal(w[i]->state, NRS_CONN_READY);
    }
    for (int i = 0; i < N; i++)
        if (i != 5) {
            gathered(w[i], "ag6", got, vals);
            assert_int_equal(got[5], 0);
            assert_int_equal(got[i], 1);
            assert_int_equal(vals[i], 7);
        }
}

/* A late contribution to a barrier (no data, finalize's) is answered at once
 * with the rank alone, its channel kept; one with data stays refused (above). */
static void test_gather_late_barrier(void **st)
{
    (void)st;
    static nrs_msg_gather_t m;
    static uint8_t b[NRS_PROTO_HDR + 256];
    const uint8_t *p;
    nrs_hdr_t h;
    nrs_msg_gathered_t g;
    int32_t r;
    const uint8_t *d;
    drain_all();
    memset(&m, 0, sizeof(m));
    m.key = 3ULL << 32;
    snprintf(m.name, sizeof(m.name), "fini");
    m.timeout_ms = 1000;
    m.nranks = N;
    for (int i = 0; i < N; i++)
        if (w[i] && i != 6)
            feed(w[i], b, nrs_enc_gather(b, sizeof(b), &m));
    nrs_ctl_tick(ctl, now + 1.5); /* completed without rank 6 at its time-out */
    for (int i = 0; i < N; i++)
        if (w[i] && i != 6) {
            expect(w[i], NRS_MSG_GATHERED, &p, &h);
            assert_int_equal(nrs_dec_gathered(p, h.length, &g, NULL, 0), 0);
            assert_int_equal(g.count, (uint32_t)(N - 1)); /* all but rank 6, late */
        }
    now += 2;
    feed(w[6], b, nrs_enc_gather(b, sizeof(b), &m));
    expect(w[6], NRS_MSG_GATHERED, &p, &h);
    assert_int_equal(nrs_dec_gathered(p, h.length, &g, NULL, 0), 0);
    assert_string_equal(g.name, "fini");
    assert_int_equal(g.count, 1);
    nrs_gathered_entry(&g, 0, &r, &d);
    assert_int_equal(r, 6);
    assert_int_equal(w[6]->state, NRS_CONN_READY);
    assert_int_equal(next(w[6], &p, &h), 0);
}

/* An answer larger than a frame comes in chunks, ranks ascending. */
static void test_gather_chunks(void **st)
{
    (void)st;
    static nrs_msg_gather_t m;
    static uint8_t b[NRS_PROTO_HDR + NRS_PROTO_MAX_PAYLOAD], data[20000];
    const uint8_t *p;
    nrs_hdr_t h;
    drain_all();
    for (int i = 0; i < N; i++) {
        memset(&m, 0, sizeof(m));
        m.key = 3;
        snprintf(m.name, sizeof(m.name), "census");
        m.timeout_ms = 1000;
        m.nranks = N;
        m.len = sizeof(data);
        memset(data, i + 1, sizeof(data));
        m.data = data;
        feed(w[i], b, nrs_enc_gather(b, sizeof(b), &m));
    }
    int chunks = 0, seen = 0;
    do {
        expect(w[5], NRS_MSG_GATHERED, &p, &h);
        nrs_msg_gathered_t g;
        assert_int_equal(nrs_dec_gathered(p, h.length, &g, NULL, 0), 0);
        assert_true(g.count >= 1 && g.count <= nrs_gathered_fit(sizeof(data)));
        for (uint32_t i = 0; i < g.count; i++) {
            int32_t r;
            const uint8_t *d;
            nrs_gathered_entry(&g, i, &r, &d);
            assert_int_equal(r, seen);
            assert_int_equal(d[0], seen + 1);
            assert_int_equal(d[sizeof(data) - 1], seen + 1);
            seen++;
        }
        chunks++;
    } while (h.flags & NRS_FLAG_MORE);
    assert_int_equal(seen, N);
    assert_true(chunks >= N / 3);
}

/* ---- a join when more ranks are gone than a WORLD lists ------------------- */

enum { BIG_NODES = 513, BIG = BIG_NODES * 8, MAXG = NRS_GATHER_MAX_OUT };

/* A controller on 4,104 GPUs whose ranks 0 .. MAXG said HELLO and left:
 * MAXG + 1 world ranks gone, one more than a WORLD (and the world gathers'
 * out lists, which it becomes) can carry. */
static int setup_gone(void **st)
{
    (void)st;
    nrs_ctl_opts_t o;
    char err[NRS_ERR_MAX];
    spec_8b(&spec, BIG_NODES);
    nrs_ctl_opts_init(&o, &spec);
    now = 100;
    assert_int_equal(nrs_ctl_new(&ctl, &o, now, err, sizeof(err)), 0);
    for (int r = 0; r <= MAXG; r++) {
        nrs_conn_t *k = peer(false);
        hello(k, NRS_ROLE_WORKER, r, BIG, "node", NULL);
        gone(k);
    }
    return 0;
}

static void refused_with(nrs_conn_t *k, const char *needle)
{
    const uint8_t *p;
    nrs_hdr_t h;
    nrs_msg_error_t e;
    expect(k, NRS_MSG_ERROR, &p, &h);
    assert_int_equal(nrs_dec_error(p, h.length, &e, NULL, 0), 0);
    assert_int_equal(e.code, NRS_PERR_REFUSED);
    if (!strstr(e.text, needle))
        fail_msg("refusal '%s' lacks '%s'", e.text, needle);
}

/* WORLD k got: every gone rank listed, none cut. */
static void world_lists_all_gone(nrs_conn_t *k, int rank, int hole)
{
    static nrs_msg_world_t m;
    const uint8_t *p;
    nrs_hdr_t h;
    char why[128];
    expect(k, NRS_MSG_WORLD, &p, &h);
    assert_int_equal(nrs_dec_world(p, h.length, &m, why, sizeof(why)), 0);
    assert_int_equal(m.rank, rank);
    assert_int_equal(m.base, BIG);
    assert_int_equal(m.size, BIG + 1);
    assert_int_equal(m.nout, MAXG);
    for (int i = 0, r = 0; i < m.nout; i++, r++) {
        r += r == hole;
        assert_int_equal(m.out[i], r);
    }
}

static void test_world_gone_cap(void **st)
{
    (void)st;
    const uint8_t *p;
    nrs_hdr_t h;
    /* MAXG + 1 gone: a join's first rank is refused, saying why; no WORLD */
    nrs_conn_t *a = peer(false);
    hello(a, NRS_ROLE_JOINER, 0, 1, "new0", NULL);
    refused_with(a, "gone");
    assert_int_equal(next(a, &p, &h), 0);
    gone(a);
    /* rank 5 back: MAXG gone. A 2-rank join's first rank is accepted; rank 5
     * leaves again before the second: the join is refused whole, no WORLD */
    nrs_conn_t *r5 = peer(false);
    hello(r5, NRS_ROLE_WORKER, 5, BIG, "node", NULL);
    expect(r5, NRS_MSG_PLAN, &p, &h);
    nrs_conn_t *b0 = peer(false), *b1 = peer(false);
    hello(b0, NRS_ROLE_JOINER, 0, 2, "new0", NULL);
    expect(b0, NRS_MSG_PLAN, &p, &h);
    gone(r5);
    hello(b1, NRS_ROLE_JOINER, 1, 2, "new0", NULL);
    expect(b1, NRS_MSG_PLAN, &p, &h);
    refused_with(b1, "gone");
    refused_with(b0, "gone");
    gone(b0);
    gone(b1);
    /* rank 5 back again: MAXG gone, each listed in the WORLD of a join */
    r5 = peer(false);
    hello(r5, NRS_ROLE_WORKER, 5, BIG, "node", NULL);
    expect(r5, NRS_MSG_PLAN, &p, &h);
    nrs_conn_t *c0 = peer(false);
    hello(c0, NRS_ROLE_JOINER, 0, 1, "new0", NULL);
    expect(c0, NRS_MSG_PLAN, &p, &h);
    world_lists_all_gone(c0, BIG, 5);
    world_lists_all_gone(r5, 5, 5);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_hello_gets_plan, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reports_calibrate, setup, teardown),
        cmocka_unit_test_setup_teardown(test_lost_node_commit, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stopped_not_measured, setup, teardown),
        cmocka_unit_test_setup_teardown(test_retune_commit, setup, teardown),
        cmocka_unit_test_setup_teardown(test_delta_twice, setup, teardown),
        cmocka_unit_test_setup_teardown(test_gone_rank_lost, setup, teardown),
        cmocka_unit_test_setup_teardown(test_abort_on_gone_rank, setup, teardown),
        cmocka_unit_test_setup_teardown(test_prepare_timeout, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_peers, setup, teardown),
        cmocka_unit_test_setup_teardown(test_status_chunks, setup, teardown),
        cmocka_unit_test_setup_teardown(test_gather, setup, teardown),
        cmocka_unit_test_setup_teardown(test_gather_late, setup, teardown),
        cmocka_unit_test_setup_teardown(test_gather_late_barrier, setup, teardown),
        cmocka_unit_test_setup_teardown(test_gather_chunks, setup, teardown),
        cmocka_unit_test_setup_teardown(test_too_many_lost, setup, teardown),
        cmocka_unit_test_setup_teardown(test_gave_up_before_commit, setup, teardown),
        cmocka_unit_test_setup_teardown(test_gave_up_after_commit, setup, teardown),
        cmocka_unit_test_setup_teardown(test_lost_replans_same_count, setup, teardown),
        cmocka_unit_test_setup_teardown(test_prehello_length, setup, teardown),
        cmocka_unit_test(test_gpu_map_whole_nodes),
        cmocka_unit_test_setup_teardown(test_world_gone_cap, setup_gone, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
