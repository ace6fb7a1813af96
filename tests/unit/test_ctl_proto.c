/* Control protocol: every message round-trips field by field; every class of
 * malformed input is rejected (header: magic, version, length, type, flags;
 * payload: truncation, trailing bytes, ranges, counts, strings too long or with
 * NUL bytes, epochs); framing over a byte stream split anywhere. */
#include <fcntl.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ctl/auth.h"
#include "ctl/client.h"
#include "ctl/conn.h"
#include "ctl/proto.h"
#include "fixtures.h"

#define CAP (NRS_PROTO_HDR + NRS_PROTO_MAX_PAYLOAD)
static uint8_t buf[CAP];
static char why[256];

static nrs_hdr_t hdr_of(int n)
{
    nrs_hdr_t h;
    assert_int_equal(nrs_proto_hdr_decode(buf, &h), 0);
    assert_int_equal(h.length, n - NRS_PROTO_HDR);
    return h;
}
static const uint8_t *pl(void) { return buf + NRS_PROTO_HDR; }

static void sample_plan(nrs_plan_t *p)
{
    memset(p, 0, sizeof(*p));
    p->epoch = 3;
    p->total_gpus = 16;
    p->npools = 2;
    p->pools[0] = (nrs_pool_t){0, 8};
    p->pools[1] = (nrs_pool_t){8, 8};
    for (int ms = 0; ms < NRS_MS_COUNT; ms++) {
        p->has[ms] = ms != NRS_MS_REWARD_INFER;
        p->pool_of[ms] = ms == NRS_MS_ACTOR_GENERATE;
        p->layout[ms] = (nrs_layout_t){2, 1, 4, 8 + ms};
        p->ms_time[ms] = 0.5 + ms;
        p->ms_mem[ms] = 1e10 + ms;
        if (!p->has[ms]) { /* absent stages do not travel */
            p->pool_of[ms] = 0;
            memset(&p->layout[ms], 0, sizeof(p->layout[ms]));
            p->ms_time[ms] = p->ms_mem[ms] = 0;
        }
    }
    p->phase_time[0] = 1.25;
    p->phase_time[1] = 2.5;
    p->phase_time[2] = 3.75;
    p->sync_s = 0.01;
    p->step_s = 7.51;
    p->capacity_bytes = 78.0 * (1 << 30);
}

/* ---- header -------------------------------------------------------------- */

static void test_header(void **st)
{
    (void)st;
    nrs_hdr_t h;
    nrs_proto_hdr_encode(buf, NRS_MSG_REPORT, 0, 10);
    assert_int_equal(nrs_proto_hdr_decode(buf, &h), 0);
    assert_int_equal(h.type, NRS_MSG_REPORT);
    assert_int_equal(h.length, 10);
    /* little-endian on the wire whatever the host */
    assert_int_equal(buf[0], 'N');
    assert_int_equal(buf[3], 'C');
    assert_int_equal(buf[6], NRS_MSG_REPORT);
    assert_int_equal(buf[12], 10);
    buf[0] ^= 1;
    assert_int_equal(nrs_proto_hdr_decode(buf, &h), -NRS_PERR_MAGIC);
    nrs_proto_hdr_encode(buf, NRS_MSG_REPORT, 0, 10);
    buf[4] = 2;
    assert_int_equal(nrs_proto_hdr_decode(buf, &h), -NRS_PERR_VERSION);
    nrs_proto_hdr_encode(buf, NRS_MSG_REPORT, 0, NRS_PROTO_MAX_PAYLOAD + 1);
    assert_int_equal(nrs_proto_hdr_decode(buf, &h), -NRS_PERR_LENGTH);
    nrs_proto_hdr_encode(buf, NRS_MSG_REPORT, 0, NRS_PROTO_MAX_PAYLOAD);
    assert_int_equal(nrs_proto_hdr_decode(buf, &h), 0);
    nrs_proto_hdr_encode(buf, 0, 0, 0);
    assert_int_equal(nrs_proto_hdr_decode(buf, &h), -NRS_PERR_TYPE);
    nrs_proto_hdr_encode(buf, NRS_MSG_MAX + 1, 0, 0);
    assert_int_equal(nrs_proto_hdr_decode(buf, &h), -NRS_PERR_TYPE);
    nrs_proto_hdr_encode(buf, NRS_MSG_REPORT, NRS_FLAG_MORE, 0); /* MORE only on STATUS */
    assert_int_equal(nrs_proto_hdr_decode(buf, &h), -NRS_PERR_MALFORMED);
    nrs_proto_hdr_encode(buf, NRS_MSG_STATUS, NRS_FLAG_MORE, 0);
    assert_int_equal(nrs_proto_hdr_decode(buf, &h), 0);
    nrs_proto_hdr_encode(buf, NRS_MSG_STATUS, 0x80, 0);
    assert_int_equal(nrs_proto_hdr_decode(buf, &h), -NRS_PERR_MALFORMED);
    assert_string_equal(nrs_perr_name(NRS_PERR_AUTH), "not authorized");
    assert_string_equal(nrs_msg_name(NRS_MSG_PLAN), "PLAN");
    assert_string_equal(nrs_perr_name(999), "unknown error");
}

/* Every strict prefix of a valid payload and every extension by a byte fails. */
typedef int (*dec_fn)(const uint8_t *, size_t, void *, char *, size_t);
static void truncations(dec_fn dec, void *m, size_t n)
{
    uint8_t *copy = malloc(n + 1);
    memcpy(copy, pl(), n);
    assert_int_equal(dec(copy, n, m, why, sizeof(why)), 0);
    for (size_t k = 0; k < n; k++)
        assert_int_equal(dec(copy, k, m, why, sizeof(why)), -NRS_PERR_MALFORMED);
    copy[n] = 0;
    assert_int_equal(dec(copy, n + 1, m, why, sizeof(why)), -NRS_PERR_MALFORMED);
    assert_non_null(strstr(why, "trailing"));
    free(copy);
}

/* ---- HELLO ------------------------------------------------------------------- */

static void hello_ok(nrs_msg_hello_t *m)
{
    memset(m, 0, sizeof(*m));
    m->role = NRS_ROLE_WORKER;
    snprintf(m->job, sizeof(m->job), "4242");
    m->rank = 5;
    m->nranks = 16;
    snprintf(m->host, sizeof(m->host), "node0");
    snprintf(m->token, sizeof(m->token), "s3cr3t");
}

static void test_hello(void **st)
{
    (void)st;
    nrs_msg_hello_t m, d;
    hello_ok(&m);
    int n = nrs_enc_hello(buf, CAP, &m);
    assert_true(n > NRS_PROTO_HDR);
    nrs_hdr_t h = hdr_of(n);
    assert_int_equal(h.type, NRS_MSG_HELLO);
    assert_int_equal(nrs_dec_hello(pl(), h.length, &d, why, sizeof(why)), 0);
    assert_int_equal(d.role, NRS_ROLE_WORKER);
    assert_string_equal(d.job, "4242");
    assert_int_equal(d.rank, 5);
    assert_int_equal(d.nranks, 16);
    assert_string_equal(d.host, "node0");
    assert_string_equal(d.token, "s3cr3t");
    truncations((dec_fn)nrs_dec_hello, &d, h.length);

    /* ranges */
    m.rank = 16;
    n = nrs_enc_hello(buf, CAP, &m);
    assert_int_equal(nrs_dec_hello(pl(), hdr_of(n).length, &d, why, sizeof(why)), -NRS_PERR_MALFORMED);
    hello_ok(&m);
    m.rank = -1;
    n = nrs_enc_hello(buf, CAP, &m);
    assert_int_equal(nrs_dec_hello(pl(), hdr_of(n).length, &d, why, sizeof(why)), -NRS_PERR_MALFORMED);
    hello_ok(&m);
    m.nranks = NRS_PROTO_MAX_RANKS + 1;
    n = nrs_enc_hello(buf, CAP, &m);
    assert_int_equal(nrs_dec_hello(pl(), hdr_of(n).length, &d, why, sizeof(why)), -NRS_PERR_MALFORMED);
    hello_ok(&m);
    m.role = 7;
    n = nrs_enc_hello(buf, CAP, &m);
    assert_int_equal(nrs_dec_hello(pl(), hdr_of(n).length, &d, why, sizeof(why)), -NRS_PERR_MALFORMED);
    hello_ok(&m);
    m.role = NRS_ROLE_CLI; /* a CLI carries no rank */
    n = nrs_enc_hello(buf, CAP, &m);
    assert_int_equal(nrs_dec_hello(pl(), hdr_of(n).length, &d, why, sizeof(why)), -NRS_PERR_MALFORMED);
    m.rank = m.nranks = 0;
    n = nrs_enc_hello(buf, CAP, &m);
    assert_int_equal(nrs_dec_hello(pl(), hdr_of(n).length, &d, why, sizeof(why)), 0);
    hello_ok(&m);
    m.host[0] = 0; /* a worker must name its host */
    n = nrs_enc_hello(buf, CAP, &m);
    assert_int_equal(nrs_dec_hello(pl(), hdr_of(n).length, &d, why, sizeof(why)), -NRS_PERR_MALFORMED);

    /* strings: NUL inside, too long (hand-made: the encoder refuses both) */
    hello_ok(&m);
    n = nrs_enc_hello(buf, CAP, &m);
    buf[NRS_PROTO_HDR + 4 + 2 + 1] = 0; /* inside job "4242" */
    assert_int_equal(nrs_dec_hello(pl(), hdr_of(n).length, &d, why, sizeof(why)), -NRS_PERR_MALFORMED);
    assert_non_null(strstr(why, "NUL"));
    n = nrs_enc_hello(buf, CAP, &m);
    buf[NRS_PROTO_HDR + 4] = NRS_PROTO_STR_MAX; /* job length 64 >= bound */
    assert_int_equal(nrs_dec_hello(pl(), hdr_of(n).length, &d, why, sizeof(why)), -NRS_PERR_MALFORMED);
    buf[NRS_PROTO_HDR + 4] = 0xff; /* longer than the payload */
    buf[NRS_PROTO_HDR + 5] = 0xff;
    assert_int_equal(nrs_dec_hello(pl(), hdr_of(n).length, &d, why, sizeof(why)), -NRS_PERR_MALFORMED);
    /* the encoder refuses an unterminated string and a buffer too small */
    memset(m.host, 'x', sizeof(m.host));
    assert_int_equal(nrs_enc_hello(buf, CAP, &m), -1);
    hello_ok(&m);
    assert_int_equal(nrs_enc_hello(buf, 20, &m), -1);
    assert_int_equal(nrs_enc_hello(buf, 4, &m), -1);
}

/* ---- PLAN -------------------------------------------------------------------- */

static nrs_msg_plan_t pm, pd;

static int enc_plan_mut(void (*mut)(nrs_msg_plan_t *))
{
    memset(&pm, 0, sizeof(pm));
    sample_plan(&pm.plan);
    pm.flags = NRS_PLAN_TRANSITION | NRS_PLAN_FORCED;
    pm.prev_epoch = 2;
    pm.nlost = 3;
    pm.lost[0] = 1;
    pm.lost[1] = 4;
    pm.lost[2] = 9;
    if (mut)
        mut(&pm);
    int n = nrs_enc_plan(buf, CAP, &pm);
    if (n < 0)
        return -100;
    return nrs_dec_plan(pl(), hdr_of(n).length, &pd, why, sizeof(why));
}

static void m_epoch0(nrs_msg_plan_t *m) { m->plan.epoch = 0; m->prev_epoch = 0; m->nlost = 0; }
static void m_prev(nrs_msg_plan_t *m) { m->prev_epoch = 3; }
static void m_flags(nrs_msg_plan_t *m) { m->flags = 8; }
static void m_gpus(nrs_msg_plan_t *m) { m->plan.total_gpus = 0; }
static void m_pools(nrs_msg_plan_t *m) { m->plan.npools = 0; }
static void m_pool_out(nrs_msg_plan_t *m) { m->plan.pools[1].gpus = 9; }
static void m_overlap(nrs_msg_plan_t *m) { m->plan.pools[1].first_gpu = 4; m->plan.pools[1].gpus = 4; }
static void m_pool_of(nrs_msg_plan_t *m) { m->plan.pool_of[0] = 2; }
static void m_layout(nrs_msg_plan_t *m) { m->plan.layout[0].tp = 0; }
static void m_toobig(nrs_msg_plan_t *m) { m->plan.layout[0].dp = 5; }
static void m_nan(nrs_msg_plan_t *m) { m->plan.step_s = NAN; }
static void m_neg(nrs_msg_plan_t *m) { m->plan.ms_time[1] = -1; }
static void m_inf(nrs_msg_plan_t *m) { m->plan.ms_mem[1] = INFINITY; }
static void m_lost_order(nrs_msg_plan_t *m) { m->lost[2] = 4; }
static void m_lost_noprev(nrs_msg_plan_t *m) { m->prev_epoch = 0; }
static void m_nostage(nrs_msg_plan_t *m) { memset(m->plan.has, 0, sizeof(m->plan.has)); }
static void m_nlost(nrs_msg_plan_t *m) { m->nlost = NRS_PROTO_MAX_LOST + 1; }

static void test_plan(void **st)
{
    (void)st;
    assert_int_equal(enc_plan_mut(NULL), 0);
    const nrs_plan_t *a = &pm.plan, *b = &pd.plan;
    assert_int_equal(b->epoch, 3);
    assert_int_equal(pd.prev_epoch, 2);
    assert_int_equal(pd.flags, NRS_PLAN_TRANSITION | NRS_PLAN_FORCED);
    assert_int_equal(b->total_gpus, 16);
    assert_int_equal(b->npools, 2);
    assert_int_equal(b->pools[1].first_gpu, 8);
    for (int ms = 0; ms < NRS_MS_COUNT; ms++) {
        assert_int_equal(b->has[ms], a->has[ms]);
        if (!a->has[ms])
            continue;
        assert_int_equal(b->pool_of[ms], a->pool_of[ms]);
        assert_memory_equal(&b->layout[ms], &a->layout[ms], sizeof(nrs_layout_t));
        assert_true(b->ms_time[ms] == a->ms_time[ms]); /* bit-exact doubles */
        assert_true(b->ms_mem[ms] == a->ms_mem[ms]);
    }
    assert_true(b->phase_time[2] == a->phase_time[2] && b->sync_s == a->sync_s &&
                b->step_s == a->step_s && b->capacity_bytes == a->capacity_bytes);
    assert_int_equal(pd.nlost, 3);
    assert_int_equal(pd.lost[2], 9);
    assert_int_equal(nrs_plan_same_layout(a, b), true);
    int n = nrs_enc_plan(buf, CAP, &pm);
    truncations((dec_fn)nrs_dec_plan, &pd, hdr_of(n).length);

    void (*bad[])(nrs_msg_plan_t *) = {m_epoch0, m_prev, m_flags, m_gpus, m_pools, m_pool_out,
                                       m_overlap, m_pool_of, m_layout, m_toobig, m_nan, m_neg,
                                       m_inf, m_lost_order, m_lost_noprev, m_nostage};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        int rc = enc_plan_mut(bad[i]);
        if (rc != -100) /* some the encoder itself refuses */
            assert_int_equal(rc, -NRS_PERR_MALFORMED);
    }
    assert_int_equal(enc_plan_mut(m_nlost), -100);
    /* count of model-stages other than ours */
    enc_plan_mut(NULL);
    n = nrs_enc_plan(buf, CAP, &pm);
    size_t off = NRS_PROTO_HDR + 16 + 1 + 8 * 2;
    assert_int_equal(buf[off], NRS_MS_COUNT);
    buf[off] = NRS_MS_COUNT + 1;
    assert_int_equal(nrs_dec_plan(pl(), hdr_of(n).length, &pd, why, sizeof(why)), -NRS_PERR_MALFORMED);
    buf[off] = NRS_MS_COUNT;
    buf[off + 1] = 2; /* has = 2 */
    assert_int_equal(nrs_dec_plan(pl(), hdr_of(n).length, &pd, why, sizeof(why)), -NRS_PERR_MALFORMED);
}

/* A real plan from the planner survives the wire. */
static void test_plan_real(void **st)
{
    (void)st;
    nrs_spec_t s;
    nrs_plan_req_t req;
    char err[NRS_ERR_MAX];
    spec_8b(&s, 4);
    nrs_plan_req_init(&req, &s);
    memset(&pm, 0, sizeof(pm));
    assert_int_equal(nrs_plan_best(&s, &req, &pm.plan, err, sizeof(err)), 0);
    pm.plan.epoch = 1;
    int n = nrs_enc_plan(buf, CAP, &pm);
    assert_true(n > 0 && n < 1024);
    assert_int_equal(nrs_dec_plan(pl(), hdr_of(n).length, &pd, why, sizeof(why)), 0);
    assert_true(nrs_plan_same_layout(&pm.plan, &pd.plan));
    assert_true(pd.plan.step_s == pm.plan.step_s);
}

/* ---- REPORT ------------------------------------------------------------------- */

static void report_ok(nrs_msg_report_t *m)
{
    memset(m, 0, sizeof(*m));
    m->epoch = 2;
    m->step = 17;
    m->flags = NRS_REPORT_MEM_HIGH;
    m->response_len = 1500;
    m->nstages = 3;
    m->ms[0] = NRS_MS_ACTOR_GENERATE;
    m->seconds[0] = 3.5;
    m->ms[1] = NRS_MS_ACTOR_TRAIN;
    m->seconds[1] = 4.25;
    m->ms[2] = NRS_MS_REF_INFER;
    m->seconds[2] = 1;
}

static int report_mut(int what)
{
    nrs_msg_report_t m, d;
    report_ok(&m);
    switch (what) {
    case 1: m.epoch = 0; break;
    case 2: m.step = NRS_PROTO_MAX_STEP + 1; break;
    case 3: m.flags = 4; break;
    case 4: m.response_len = -1; break;
    case 5: m.ms[1] = NRS_MS_COUNT; break;
    case 6: m.ms[1] = m.ms[0]; break;
    case 7: m.seconds[2] = 0; break;
    case 8: m.seconds[2] = NAN; break;
    case 9: m.seconds[2] = 1e7; break;
    case 10: m.response_len = INFINITY; break;
    }
    int n = nrs_enc_report(buf, CAP, &m);
    return nrs_dec_report(pl(), hdr_of(n).length, &d, why, sizeof(why));
}

static void test_report(void **st)
{
    (void)st;
    nrs_msg_report_t m, d;
    report_ok(&m);
    int n = nrs_enc_report(buf, CAP, &m);
    nrs_hdr_t h = hdr_of(n);
    assert_int_equal(nrs_dec_report(pl(), h.length, &d, why, sizeof(why)), 0);
    assert_int_equal(d.epoch, 2);
    assert_int_equal(d.step, 17);
    assert_int_equal(d.flags, NRS_REPORT_MEM_HIGH);
    assert_true(d.response_len == 1500);
    assert_int_equal(d.nstages, 3);
    assert_int_equal(d.ms[1], NRS_MS_ACTOR_TRAIN);
    assert_true(d.seconds[1] == 4.25);
    truncations((dec_fn)nrs_dec_report, &d, h.length);
    for (int w = 1; w <= 10; w++)
        assert_int_equal(report_mut(w), -NRS_PERR_MALFORMED);
    /* stage count beyond NRS_MS_COUNT */
    n = nrs_enc_report(buf, CAP, &m);
    buf[NRS_PROTO_HDR + 20] = NRS_MS_COUNT + 1;
    assert_int_equal(nrs_dec_report(pl(), hdr_of(n).length, &d, why, sizeof(why)), -NRS_PERR_MALFORMED);
    m.nstages = NRS_MS_COUNT + 1;
    assert_int_equal(nrs_enc_report(buf, CAP, &m), -1);
}

/* ---- DELTA and its reply --------------------------------------------------------- */

static nrs_msg_delta_t dm, dd;

static void test_delta(void **st)
{
    (void)st;
    memset(&dm, 0, sizeof(dm));
    dm.generation = 7;
    dm.kind = NRS_DELTA_LOST;
    dm.nhosts = 2;
    snprintf(dm.hosts[0], NRS_PROTO_STR_MAX, "node1");
    snprintf(dm.hosts[1], NRS_PROTO_STR_MAX, "node3");
    dm.ngpus = 2;
    dm.gpus[0] = 40;
    dm.gpus[1] = 41;
    int n = nrs_enc_delta(buf, CAP, &dm);
    nrs_hdr_t h = hdr_of(n);
    assert_int_equal(h.type, NRS_MSG_DELTA);
    assert_int_equal(nrs_dec_delta(pl(), h.length, &dd, why, sizeof(why)), 0);
    assert_true(dd.generation == 7);
    assert_int_equal(dd.kind, NRS_DELTA_LOST);
    assert_int_equal(dd.nhosts, 2);
    assert_string_equal(dd.hosts[1], "node3");
    assert_int_equal(dd.ngpus, 2);
    assert_int_equal(dd.gpus[1], 41);
    truncations((dec_fn)nrs_dec_delta, &dd, h.length);

    dm.kind = 9; /* kind */
    n = nrs_enc_delta(buf, CAP, &dm);
    assert_int_equal(nrs_dec_delta(pl(), hdr_of(n).length, &dd, why, sizeof(why)), -NRS_PERR_MALFORMED);
    dm.kind = NRS_DELTA_ADD; /* ADD with hosts */
    dm.add_nodes = 1;
    n = nrs_enc_delta(buf, CAP, &dm);
    assert_int_equal(nrs_dec_delta(pl(), hdr_of(n).length, &dd, why, sizeof(why)), -NRS_PERR_MALFORMED);
    dm.nhosts = dm.ngpus = 0;
    n = nrs_enc_delta(buf, CAP, &dm);
    assert_int_equal(nrs_dec_delta(pl(), hdr_of(n).length, &dd, why, sizeof(why)), 0);
    dm.add_nodes = 0; /* ADD of nothing */
    n = nrs_enc_delta(buf, CAP, &dm);
    assert_int_equal(nrs_dec_delta(pl(), hdr_of(n).length, &dd, why, sizeof(why)), -NRS_PERR_MALFORMED);
    dm.kind = NRS_DELTA_REMOVE; /* REMOVE of nothing */
    n = nrs_enc_delta(buf, CAP, &dm);
    assert_int_equal(nrs_dec_delta(pl(), hdr_of(n).length, &dd, why, sizeof(why)), -NRS_PERR_MALFORMED);
    dm.nhosts = 1;
    dm.hosts[0][0] = 0; /* empty host name */
    n = nrs_enc_delta(buf, CAP, &dm);
    assert_int_equal(nrs_dec_delta(pl(), hdr_of(n).length, &dd, why, sizeof(why)), -NRS_PERR_MALFORMED);
    dm.nhosts = 0;
    dm.ngpus = 1;
    dm.gpus[0] = -3; /* GPU index */
    n = nrs_enc_delta(buf, CAP, &dm);
    assert_int_equal(nrs_dec_delta(pl(), hdr_of(n).length, &dd, why, sizeof(why)), -NRS_PERR_MALFORMED);
    dm.gpus[0] = 3;
    n = nrs_enc_delta(buf, CAP, &dm);
    assert_int_equal(nrs_dec_delta(pl(), hdr_of(n).length, &dd, why, sizeof(why)), 0);
    /* counts beyond their bounds, hand-made */
    size_t off = NRS_PROTO_HDR + 16;
    buf[off] = 0xff;
    buf[off + 1] = 0xff; /* nhosts 65535 */
    assert_int_equal(nrs_dec_delta(pl(), hdr_of(n).length, &dd, why, sizeof(why)), -NRS_PERR_MALFORMED);
    dm.nhosts = NRS_PROTO_MAX_HOSTS + 1;
    assert_int_equal(nrs_enc_delta(buf, CAP, &dm), -1);

    nrs_msg_delta_reply_t r = {7, 1, 2, 3, "applied"}, rd;
    n = nrs_enc_delta_reply(buf, CAP, &r);
    h = hdr_of(n);
    assert_int_equal(nrs_dec_delta_reply(pl(), h.length, &rd, why, sizeof(why)), 0);
    assert_true(rd.generation == 7 && rd.accepted == 1 && rd.epoch == 2 && rd.new_epoch == 3);
    assert_string_equal(rd.text, "applied");
    truncations((dec_fn)nrs_dec_delta_reply, &rd, h.length);
    r.new_epoch = 2; /* not above the epoch */
    n = nrs_enc_delta_reply(buf, CAP, &r);
    assert_int_equal(nrs_dec_delta_reply(pl(), hdr_of(n).length, &rd, why, sizeof(why)), -NRS_PERR_MALFORMED);
    r.new_epoch = 0;
    r.accepted = 2;
    n = nrs_enc_delta_reply(buf, CAP, &r);
    assert_int_equal(nrs_dec_delta_reply(pl(), hdr_of(n).length, &rd, why, sizeof(why)), -NRS_PERR_MALFORMED);
}

/* ---- STATUS, PREPARE/COMMIT/ABORT, ACK, ERROR ------------------------------------- */

static void test_status(void **st)
{
    (void)st;
    nrs_msg_status_req_t q = {NRS_STATUS_JSON}, qd;
    int n = nrs_enc_status_req(buf, CAP, &q);
    nrs_hdr_t h = hdr_of(n);
    assert_int_equal(nrs_dec_status_req(pl(), h.length, &qd, why, sizeof(why)), 0);
    assert_int_equal(qd.format, NRS_STATUS_JSON);
    truncations((dec_fn)nrs_dec_status_req, &qd, h.length);
    q.format = 2;
    n = nrs_enc_status_req(buf, CAP, &q);
    assert_int_equal(nrs_dec_status_req(pl(), hdr_of(n).length, &qd, why, sizeof(why)), -NRS_PERR_MALFORMED);

    const char *text;
    size_t len;
    n = nrs_enc_status(buf, CAP, "{\"epoch\":1}", 11, NRS_FLAG_MORE);
    h = hdr_of(n);
    assert_int_equal(h.flags, NRS_FLAG_MORE);
    assert_int_equal(nrs_dec_status(pl(), h.length, &text, &len, why, sizeof(why)), 0);
    assert_int_equal(len, 11);
    assert_memory_equal(text, "{\"epoch\":1}", 11);
    buf[NRS_PROTO_HDR + 3] = 0;
    assert_int_equal(nrs_dec_status(pl(), h.length, &text, &len, why, sizeof(why)), -NRS_PERR_MALFORMED);
    assert_int_equal(nrs_enc_status(buf, CAP, "a\0b", 3, 0), -1);
    assert_int_equal(nrs_enc_status(buf, CAP, "ab", 2, 4), -1);
    static char big[NRS_PROTO_MAX_PAYLOAD + 1];
    memset(big, 'x', sizeof(big));
    assert_int_equal(nrs_enc_status(buf, CAP, big, NRS_PROTO_MAX_PAYLOAD, 0), CAP);
    assert_int_equal(nrs_enc_status(buf, CAP, big, NRS_PROTO_MAX_PAYLOAD + 1, 0), -1);
}

static void test_epoch_msgs(void **st)
{
    (void)st;
    nrs_msg_epoch_t m = {5, "rank 3 gone"}, d;
    uint16_t types[] = {NRS_MSG_PREPARE, NRS_MSG_COMMIT, NRS_MSG_ABORT};
    for (int i = 0; i < 3; i++) {
        int n = nrs_enc_epoch(buf, CAP, types[i], &m);
        nrs_hdr_t h = hdr_of(n);
        assert_int_equal(h.type, types[i]);
        assert_int_equal(nrs_dec_epoch(types[i], pl(), h.length, &d, why, sizeof(why)), 0);
        assert_int_equal(d.epoch, 5);
        assert_string_equal(d.text, types[i] == NRS_MSG_ABORT ? "rank 3 gone" : "");
        uint8_t copy[256];
        memcpy(copy, pl(), h.length);
        for (size_t k = 0; k < h.length; k++)
            assert_int_equal(nrs_dec_epoch(types[i], copy, k, &d, why, sizeof(why)), -NRS_PERR_MALFORMED);
    }
    m.epoch = 1; /* no transition goes to epoch 1 */
    int n = nrs_enc_epoch(buf, CAP, NRS_MSG_COMMIT, &m);
    assert_int_equal(nrs_dec_epoch(NRS_MSG_COMMIT, pl(), hdr_of(n).length, &d, why, sizeof(why)), -NRS_PERR_MALFORMED);
    assert_int_equal(nrs_enc_epoch(buf, CAP, NRS_MSG_PLAN, &m), -1);
    assert_int_equal(nrs_dec_epoch(NRS_MSG_PLAN, pl(), 4, &d, why, sizeof(why)), -NRS_PERR_MALFORMED);

    nrs_msg_ack_t a = {5, NRS_MSG_COMMIT, 0, 1.5}, ad;
    n = nrs_enc_ack(buf, CAP, &a);
    nrs_hdr_t h = hdr_of(n);
    assert_int_equal(nrs_dec_ack(pl(), h.length, &ad, why, sizeof(why)), 0);
    assert_true(ad.epoch == 5 && ad.phase == NRS_MSG_COMMIT && ad.status == 0 && ad.seconds == 1.5);
    truncations((dec_fn)nrs_dec_ack, &ad, h.length);
    a.phase = NRS_MSG_ABORT;
    n = nrs_enc_ack(buf, CAP, &a);
    assert_int_equal(nrs_dec_ack(pl(), hdr_of(n).length, &ad, why, sizeof(why)), -NRS_PERR_MALFORMED);
    a.phase = NRS_MSG_PREPARE;
    a.seconds = -1;
    n = nrs_enc_ack(buf, CAP, &a);
    assert_int_equal(nrs_dec_ack(pl(), hdr_of(n).length, &ad, why, sizeof(why)), -NRS_PERR_MALFORMED);

    nrs_msg_error_t e = {NRS_PERR_AUTH, "go away"}, ed;
    n = nrs_enc_error(buf, CAP, &e);
    h = hdr_of(n);
    assert_int_equal(nrs_dec_error(pl(), h.length, &ed, why, sizeof(why)), 0);
    assert_int_equal(ed.code, NRS_PERR_AUTH);
    assert_string_equal(ed.text, "go away");
    truncations((dec_fn)nrs_dec_error, &ed, h.length);
    e.code = 0;
    n = nrs_enc_error(buf, CAP, &e);
    assert_int_equal(nrs_dec_error(pl(), hdr_of(n).length, &ed, why, sizeof(why)), -NRS_PERR_MALFORMED);
    e.code = NRS_PERR_COUNT;
    n = nrs_enc_error(buf, CAP, &e);
    assert_int_equal(nrs_dec_error(pl(), hdr_of(n).length, &ed, why, sizeof(why)), -NRS_PERR_MALFORMED);
}

/* ---- framing: frames split at every byte, bounded buffers, state machine ---------- */

static void test_framing(void **st)
{
    (void)st;
    uint8_t stream[2048];
    size_t len = 0;
    nrs_msg_hello_t hm;
    nrs_msg_report_t rm;
    hello_ok(&hm);
    report_ok(&rm);
    int n = nrs_enc_hello(stream, sizeof(stream), &hm);
    len += (size_t)n;
    for (int i = 0; i < 5; i++) {
        rm.step = (uint32_t)i;
        len += (size_t)nrs_enc_report(stream + len, sizeof(stream) - len, &rm);
    }
    for (size_t cut = 1; cut < len; cut += 7) {
        nrs_conn_t *c = nrs_conn_new(-1, 0);
        nrs_hdr_t h;
        const uint8_t *p;
        int frames = 0;
        size_t off = 0;
        while (off < len) {
            size_t k = len - off < cut ? len - off : cut;
            size_t took = nrs_conn_feed(c, stream + off, k, 0);
            off += took;
            while (nrs_conn_frame(c, &h, &p) == 1) {
                frames++;
                nrs_conn_consume(c, &h, 0);
            }
            assert_true(took > 0 || c->in_len == 0);
        }
        assert_int_equal(frames, 6);
        assert_int_equal(c->in_len, 0);
        nrs_conn_free(c);
    }
    /* a bad header stops input at once */
    nrs_conn_t *c = nrs_conn_new(-1, 0);
    uint8_t junk[64];
    memset(junk, 0x5a, sizeof(junk));
    nrs_conn_feed(c, junk, sizeof(junk), 0);
    nrs_hdr_t h;
    const uint8_t *p;
    assert_int_equal(nrs_conn_frame(c, &h, &p), -NRS_PERR_MAGIC);
    nrs_conn_free(c);
    /* a frame of the maximum length is buffered whole, not more */
    c = nrs_conn_new(-1, 0);
    static uint8_t big[NRS_CONN_IN_MAX + 100];
    memset(big, 'x', sizeof(big));
    nrs_proto_hdr_encode(big, NRS_MSG_STATUS, 0, NRS_PROTO_MAX_PAYLOAD);
    size_t took = 0;
    for (int i = 0; i < 100 && took < sizeof(big); i++)
        took += nrs_conn_feed(c, big + took, sizeof(big) - took, 0);
    assert_int_equal(took, NRS_CONN_IN_MAX);
    assert_int_equal(nrs_conn_frame(c, &h, &p), 1);
    assert_int_equal(h.length, NRS_PROTO_MAX_PAYLOAD);
    nrs_conn_consume(c, &h, 0);
    assert_int_equal(c->in_len, 0);
    /* output is bounded */
    for (int i = 0; i < NRS_CONN_OUT_MAX / NRS_CONN_IN_MAX; i++)
        assert_int_equal(nrs_conn_queue(c, big, NRS_CONN_IN_MAX), 0);
    assert_int_equal(nrs_conn_queue(c, big, NRS_CONN_IN_MAX), -1);
    nrs_conn_free(c);

    /* which messages a peer may send, by state and role */
    assert_int_equal(nrs_conn_check_type(NRS_CONN_NEW, 0, NRS_MSG_HELLO), 0);
    assert_int_equal(nrs_conn_check_type(NRS_CONN_NEW, 0, NRS_MSG_REPORT), -NRS_PERR_UNEXPECTED);
    assert_int_equal(nrs_conn_check_type(NRS_CONN_NEW, 0, NRS_MSG_ERROR), 0);
    assert_int_equal(nrs_conn_check_type(NRS_CONN_READY, NRS_ROLE_WORKER, NRS_MSG_HELLO), -NRS_PERR_UNEXPECTED);
    assert_int_equal(nrs_conn_check_type(NRS_CONN_READY, NRS_ROLE_WORKER, NRS_MSG_REPORT), 0);
    assert_int_equal(nrs_conn_check_type(NRS_CONN_READY, NRS_ROLE_WORKER, NRS_MSG_ACK), 0);
    assert_int_equal(nrs_conn_check_type(NRS_CONN_READY, NRS_ROLE_WORKER, NRS_MSG_GATHER), 0);
    assert_int_equal(nrs_conn_check_type(NRS_CONN_READY, NRS_ROLE_CLI, NRS_MSG_GATHER), -NRS_PERR_UNEXPECTED);
    assert_int_equal(nrs_conn_check_type(NRS_CONN_READY, NRS_ROLE_WORKER, NRS_MSG_DELTA), -NRS_PERR_UNEXPECTED);
    assert_int_equal(nrs_conn_check_type(NRS_CONN_READY, NRS_ROLE_CLI, NRS_MSG_DELTA), 0);
    assert_int_equal(nrs_conn_check_type(NRS_CONN_READY, NRS_ROLE_WATCHER, NRS_MSG_STATUS_REQ), 0);
    assert_int_equal(nrs_conn_check_type(NRS_CONN_READY, NRS_ROLE_CLI, NRS_MSG_REPORT), -NRS_PERR_UNEXPECTED);
    for (int t = NRS_MSG_PLAN; t <= NRS_MSG_MAX; t++) /* controller-to-peer messages never come in */
        if (t == NRS_MSG_PLAN || t == NRS_MSG_PREPARE || t == NRS_MSG_COMMIT ||
            t == NRS_MSG_ABORT || t == NRS_MSG_STATUS || t == NRS_MSG_DELTA_REPLY ||
            t == NRS_MSG_GATHERED || t == NRS_MSG_WORLD)
            for (int r = NRS_ROLE_WORKER; r <= NRS_ROLE_CLI; r++)
                assert_int_equal(nrs_conn_check_type(NRS_CONN_READY, r, t), -NRS_PERR_UNEXPECTED);
}

static void test_gather_msgs(void **st)
{
    (void)st;
    static nrs_msg_gather_t m, d;
    uint8_t data[5] = {1, 2, 3, 4, 5};
    memset(&m, 0, sizeof(m));
    m.key = 0x123456789ull;
    snprintf(m.name, sizeof(m.name), "dt3.ponr");
    m.timeout_ms = 15000;
    m.nranks = 8;
    m.nout = 2;
    m.out[0] = 7;
    m.out[1] = 3;
    m.len = sizeof(data);
    m.data = data;
    int n = nrs_enc_gather(buf, CAP, &m);
    nrs_hdr_t h = hdr_of(n);
    assert_int_equal(h.type, NRS_MSG_GATHER);
    assert_int_equal(nrs_dec_gather(pl(), h.length, &d, why, sizeof(why)), 0);
    assert_true(d.key == m.key && d.timeout_ms == 15000 && d.nranks == 8 && d.nout == 2);
    assert_true(d.out[0] == 7 && d.out[1] == 3 && d.len == 5);
    assert_memory_equal(d.data, data, 5);
    assert_string_equal(d.name, "dt3.ponr");
    truncations((dec_fn)nrs_dec_gather, &d, h.length);
    /* out of range: a rank out twice, beyond nranks, a zero time-out, no name */
    m.out[1] = 7;
    assert_int_equal(nrs_dec_gather(pl(), hdr_of(nrs_enc_gather(buf, CAP, &m)).length, &d, why, sizeof(why)), -NRS_PERR_MALFORMED);
    assert_non_null(strstr(why, "twice"));
    m.out[1] = 8;
    assert_int_equal(nrs_dec_gather(pl(), hdr_of(nrs_enc_gather(buf, CAP, &m)).length, &d, why, sizeof(why)), -NRS_PERR_MALFORMED);
    m.out[1] = 3;
    m.timeout_ms = 0;
    assert_int_equal(nrs_dec_gather(pl(), hdr_of(nrs_enc_gather(buf, CAP, &m)).length, &d, why, sizeof(why)), -NRS_PERR_MALFORMED);
    m.timeout_ms = 1;
    m.name[0] = 0;
    assert_int_equal(nrs_dec_gather(pl(), hdr_of(nrs_enc_gather(buf, CAP, &m)).length, &d, why, sizeof(why)), -NRS_PERR_MALFORMED);
    m.len = NRS_GATHER_DATA_MAX + 1;
    assert_int_equal(nrs_enc_gather(buf, CAP, &m), -1);

    /* GATHERED: entries ascending, sizes exact; MORE allowed on it */
    nrs_msg_gathered_t g = {.key = 9, .len = 3, .count = 3}, gd;
    snprintf(g.name, sizeof(g.name), "ag1");
    int32_t ranks[3] = {0, 4, 6};
    uint8_t vals[9] = {0, 0, 0, 4, 4, 4, 6, 6, 6};
    n = nrs_enc_gathered(buf, CAP, &g, ranks, vals, NRS_FLAG_MORE);
    h = hdr_of(n);
    assert_int_equal(h.type, NRS_MSG_GATHERED);
    assert_int_equal(h.flags, NRS_FLAG_MORE);
    assert_int_equal(nrs_dec_gathered(pl(), h.length, &gd, why, sizeof(why)), 0);
    assert_true(gd.key == 9 && gd.len == 3 && gd.count == 3);
    for (uint32_t i = 0; i < 3; i++) {
        int32_t r;
        const uint8_t *e;
        nrs_gathered_entry(&gd, i, &r, &e);
        assert_int_equal(r, ranks[i]);
        assert_int_equal(e[2], ranks[i]);
    }
    truncations((dec_fn)nrs_dec_gathered, &gd, h.length);
    ranks[2] = 4; /* not ascending */
    n = nrs_enc_gathered(buf, CAP, &g, ranks, vals, 0);
    assert_int_equal(nrs_dec_gathered(pl(), hdr_of(n).length, &gd, why, sizeof(why)), -NRS_PERR_MALFORMED);
    assert_true(nrs_gathered_fit(0) > 1000 && nrs_gathered_fit(NRS_GATHER_DATA_MAX) == 1);
    assert_int_equal(nrs_enc_gathered(buf, CAP, &g, ranks, vals, 2), -1); /* unknown flag */
}

static void test_world_msg(void **st)
{
    (void)st;
    static nrs_msg_world_t m, d;
    memset(&m, 0, sizeof(m));
    m.gen = 1;
    m.size = 12;
    m.rank = 9;
    m.base = 8;
    m.count = 4;
    m.nout = 2;
    m.out[0] = 2;
    m.out[1] = 5;
    int n = nrs_enc_world(buf, CAP, &m);
    nrs_hdr_t h = hdr_of(n);
    assert_int_equal(h.type, NRS_MSG_WORLD);
    assert_int_equal(nrs_dec_world(pl(), h.length, &d, why, sizeof(why)), 0);
    assert_true(d.gen == 1 && d.size == 12 && d.rank == 9 && d.base == 8 && d.count == 4);
    assert_true(d.nout == 2 && d.out[0] == 2 && d.out[1] == 5);
    truncations((dec_fn)nrs_dec_world, &d, h.length);
    m.count = 3; /* base + count must be the size */
    assert_int_equal(nrs_dec_world(pl(), hdr_of(nrs_enc_world(buf, CAP, &m)).length, &d, why, sizeof(why)), -NRS_PERR_MALFORMED);
    m.count = 4;
    m.out[1] = 8; /* a gone rank is one of the world before */
    assert_int_equal(nrs_dec_world(pl(), hdr_of(nrs_enc_world(buf, CAP, &m)).length, &d, why, sizeof(why)), -NRS_PERR_MALFORMED);
    m.out[1] = 5;
    m.gen = 0;
    assert_int_equal(nrs_dec_world(pl(), hdr_of(nrs_enc_world(buf, CAP, &m)).length, &d, why, sizeof(why)), -NRS_PERR_MALFORMED);
    /* a joiner's HELLO: rank and nranks are its step's */
    nrs_msg_hello_t hm, hd;
    memset(&hm, 0, sizeof(hm));
    hm.role = NRS_ROLE_JOINER;
    hm.rank = 3;
    hm.nranks = 4;
    snprintf(hm.host, sizeof(hm.host), "n3");
    n = nrs_enc_hello(buf, CAP, &hm);
    assert_int_equal(nrs_dec_hello(pl(), hdr_of(n).length, &hd, why, sizeof(why)), 0);
    assert_int_equal(hd.role, NRS_ROLE_JOINER);
    hm.rank = 4;
    n = nrs_enc_hello(buf, CAP, &hm);
    assert_int_equal(nrs_dec_hello(pl(), hdr_of(n).length, &hd, why, sizeof(why)), -NRS_PERR_MALFORMED);
    hm.role = 5;
    hm.rank = 0;
    n = nrs_enc_hello(buf, CAP, &hm);
    assert_int_equal(nrs_dec_hello(pl(), hdr_of(n).length, &hd, why, sizeof(why)), -NRS_PERR_MALFORMED);
}

/* A field out of range is refused before a later bound is computed from it:
 * a size, base or nranks of INT32_MIN must not overflow `size - 1` or
 * `size - base` (signed overflow, UB: the sanitizer build aborts). */
static void test_range_overflow(void **st)
{
    (void)st;
    static nrs_msg_world_t wm, wd;
    static nrs_msg_gather_t gm, gd;
    memset(&wm, 0, sizeof(wm));
    wm.gen = 1;
    wm.size = INT32_MIN;
    wm.rank = 0;
    wm.base = 1;
    wm.count = 1;
    int n = nrs_enc_world(buf, CAP, &wm);
    assert_int_equal(nrs_dec_world(pl(), hdr_of(n).length, &wd, why, sizeof(why)), -NRS_PERR_MALFORMED);
    assert_non_null(strstr(why, "size"));
    wm.size = 12;
    wm.base = INT32_MIN;
    n = nrs_enc_world(buf, CAP, &wm);
    assert_int_equal(nrs_dec_world(pl(), hdr_of(n).length, &wd, why, sizeof(why)), -NRS_PERR_MALFORMED);
    assert_non_null(strstr(why, "base"));
    memset(&gm, 0, sizeof(gm));
    gm.key = 1;
    snprintf(gm.name, sizeof(gm.name), "g");
    gm.timeout_ms = 10;
    gm.nranks = INT32_MIN;
    n = nrs_enc_gather(buf, CAP, &gm);
    assert_int_equal(nrs_dec_gather(pl(), hdr_of(n).length, &gd, why, sizeof(why)), -NRS_PERR_MALFORMED);
    assert_non_null(strstr(why, "nranks"));
}

/* The per-job secret: a regular file of ours, private, 16..127 bytes; a FIFO
 * is refused at once (before: open() waited for a writer, forever). */
static void test_secret_file(void **st)
{
    (void)st;
    char dir[] = "/tmp/nrs-secret-XXXXXX", path[64], out[NRS_PROTO_TOKEN_MAX], err[256];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/s", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("0123456789abcdef0123\n", f);
    fclose(f);
    assert_int_equal(chmod(path, 0600), 0);
    assert_int_equal(nrs_auth_load_secret(path, out, sizeof(out), err, sizeof(err)), 0);
    assert_string_equal(out, "0123456789abcdef0123");
    assert_true(nrs_auth_token_ok(out, "0123456789abcdef0123"));
    assert_false(nrs_auth_token_ok(out, "0123456789abcdef012"));
    assert_int_equal(chmod(path, 0400), 0);
    assert_int_equal(nrs_auth_load_secret(path, out, sizeof(out), err, sizeof(err)), 0);
    for (unsigned i = 0; i < 3; i++) { /* group/other bits, or an executable secret */
        const mode_t bad[3] = {0640, 0604, 0700};
        assert_int_equal(chmod(path, bad[i]), 0);
        assert_int_equal(nrs_auth_load_secret(path, out, sizeof(out), err, sizeof(err)), -1);
        assert_non_null(strstr(err, "mode 0600 or 0400"));
    }
    unlink(path);
    assert_int_equal(mkfifo(path, 0600), 0);
    alarm(5); /* a hang fails the test (SIGALRM) instead of the whole suite */
    assert_int_equal(nrs_auth_load_secret(path, out, sizeof(out), err, sizeof(err)), -1);
    alarm(0);
    assert_non_null(strstr(err, "not a regular file"));
    unlink(path);
    rmdir(dir);
}

/* The controller queued frames, then an ERROR, and closed (a rank retired
 * while it was sending): the rank's next send fails, and nrs_client_refusal
 * still finds what the controller said, behind the frames before it. */
/* Shared output: pieces queued by reference go out in queue order between
 * private frames, over a socket as through nrs_conn_take; references are
 * dropped when sent or cleared; the bounds hold. */
static void test_shared_out(void **st)
{
    (void)st;
    enum { BIG = 300000 };
    nrs_shared_t *s1 = nrs_shared_new(BIG), *s2 = nrs_shared_new(16);
    assert_non_null(s1);
    assert_non_null(s2);
    for (int i = 0; i < BIG; i++)
        s1->data[i] = (uint8_t)(i * 7 + 1);
    s1->len = BIG;
    memcpy(s2->data, "0123456789abcdef", 16);
    s2->len = 16;
    uint8_t *want = malloc(BIG + 64), *got = malloc(BIG + 64);
    assert_non_null(want);
    assert_non_null(got);
    size_t wn = 0;
    for (int round = 0; round < 2; round++) {
        int sv[2];
        assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
        nrs_conn_t *c = nrs_conn_new(round ? sv[0] : -1, 0);
        assert_non_null(c);
        wn = 0;
        /* A, s1[5..BIG), B, s2[2..10), s2[0..16), C */
        assert_int_equal(nrs_conn_queue(c, (const uint8_t *)"AAA", 3), 0);
        memcpy(want + wn, "AAA", 3), wn += 3;
        assert_int_equal(nrs_conn_queue_shared(c, s1, 5, BIG - 5), 0);
        memcpy(want + wn, s1->data + 5, BIG - 5), wn += BIG - 5;
        assert_int_equal(nrs_conn_queue(c, (const uint8_t *)"BB", 2), 0);
        memcpy(want + wn, "BB", 2), wn += 2;
        assert_int_equal(nrs_conn_queue_shared(c, s2, 2, 8), 0);
        memcpy(want + wn, s2->data + 2, 8), wn += 8;
        assert_int_equal(nrs_conn_queue_shared(c, s2, 0, 16), 0);
        memcpy(want + wn, s2->data, 16), wn += 16;
        assert_int_equal(nrs_conn_queue(c, (const uint8_t *)"C", 1), 0);
        memcpy(want + wn, "C", 1), wn += 1;
        assert_int_equal(nrs_conn_pending(c), wn);
        assert_int_equal(s1->refs, 2);
        assert_int_equal(s2->refs, 3);
        /* out of range, or past the bounds: refused, nothing queued */
        assert_int_equal(nrs_conn_queue_shared(c, s2, 10, 7), -1);
        assert_int_equal(nrs_conn_queue_shared(c, s2, 17, 0), -1);
        assert_int_equal(nrs_conn_pending(c), wn);
        size_t n = 0;
        if (!round) { /* nrs_conn_take, in odd-sized pieces */
            size_t k;
            while ((k = nrs_conn_take(c, got + n, 4097)) > 0)
                n += k;
        } else { /* the socket, read as it is written */
            assert_int_equal(fcntl(sv[0], F_SETFL, O_NONBLOCK), 0);
            while (n < wn) {
                int rc = nrs_conn_flush(c);
                assert_true(rc >= 0);
                ssize_t k = read(sv[1], got + n, wn - n);
                assert_true(k > 0);
                n += (size_t)k;
            }
            assert_int_equal(nrs_conn_flush(c), 0);
        }
        assert_int_equal(n, wn);
        assert_memory_equal(got, want, wn);
        assert_int_equal(nrs_conn_pending(c), 0);
        assert_int_equal(s1->refs, 1);
        assert_int_equal(s2->refs, 1);
        /* cleared output drops its references; later output is in order */
        assert_int_equal(nrs_conn_queue_shared(c, s2, 0, 4), 0);
        assert_int_equal(nrs_conn_queue(c, (const uint8_t *)"D", 1), 0);
        assert_int_equal(s2->refs, 2);
        nrs_conn_clear_out(c);
        assert_int_equal(s2->refs, 1);
        assert_int_equal(nrs_conn_pending(c), 0);
        assert_int_equal(nrs_conn_queue(c, (const uint8_t *)"E", 1), 0);
        assert_int_equal(nrs_conn_queue_shared(c, s2, 4, 2), 0);
        assert_int_equal(nrs_conn_take(c, got, 8), 3);
        assert_memory_equal(got, "E45", 3);
        /* at most NRS_CONN_REFS_MAX pieces; freeing drops what is left */
        for (int i = 0; i < NRS_CONN_REFS_MAX; i++)
            assert_int_equal(nrs_conn_queue_shared(c, s2, 0, 1), 0);
        assert_int_equal(nrs_conn_queue_shared(c, s2, 0, 1), -1);
        assert_int_equal(s2->refs, 1 + NRS_CONN_REFS_MAX);
        nrs_conn_clear_out(c);
        /* at most NRS_CONN_SHARED_MAX bytes referenced (a piece never sent:
         * its length is declared, not allocated) */
        nrs_shared_t *s3 = nrs_shared_new(1);
        assert_non_null(s3);
        s3->len = NRS_CONN_SHARED_MAX;
        assert_int_equal(nrs_conn_queue_shared(c, s3, 0, NRS_CONN_SHARED_MAX - 1), 0);
        assert_int_equal(nrs_conn_queue_shared(c, s2, 0, 2), -1);
        assert_int_equal(nrs_conn_queue_shared(c, s2, 0, 1), 0);
        nrs_conn_clear_out(c);
        assert_int_equal(s3->refs, 1);
        nrs_shared_unref(s3);
        for (int i = 0; i < 3; i++)
            assert_int_equal(nrs_conn_queue_shared(c, s2, 0, 1), 0);
        nrs_conn_free(c);
        assert_int_equal(s2->refs, 1);
        close(sv[0]);
        close(sv[1]);
    }
    free(want);
    free(got);
    nrs_shared_unref(s1);
    nrs_shared_unref(s2);
}

static void test_refusal_behind_frames(void **st)
{
    (void)st;
    for (int with_error = 0; with_error < 2; with_error++) {
        int sv[2];
        char err[NRS_PROTO_TEXT_MAX + 64] = "";
        uint8_t f[CAP];
        assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
        nrs_msg_epoch_t prep = {7, ""};
        nrs_msg_ack_t ack = {7, NRS_MSG_PREPARE, 0, 0};
        int n = nrs_enc_epoch(f, CAP, NRS_MSG_PREPARE, &prep);
        assert_int_equal(nrs_client_send(sv[1], f, n, err, sizeof err), 0);
        n = nrs_enc_epoch(f, CAP, NRS_MSG_COMMIT, &prep);
        assert_int_equal(nrs_client_send(sv[1], f, n, err, sizeof err), 0);
        if (with_error) {
            nrs_msg_error_t e = {NRS_PERR_REFUSED, "node removed: rank retired (resource delta 1)"};
            n = nrs_enc_error(f, CAP, &e);
            assert_true(n > 0);
            assert_int_equal(nrs_client_send(sv[1], f, n, err, sizeof err), 0);
        }
        close(sv[1]);
        n = nrs_enc_ack(f, CAP, &ack);
        assert_int_not_equal(nrs_client_send(sv[0], f, n, err, sizeof err), 0); /* EPIPE */
        err[0] = 0;
        int rc = nrs_client_refusal(sv[0], err, sizeof err);
        if (with_error) {
            assert_int_equal(rc, 0);
            assert_non_null(strstr(err, "the controller refused: "));
            assert_non_null(strstr(err, "rank retired (resource delta 1)"));
        } else {
            assert_int_equal(rc, -1); /* two frames, then the end: no refusal */
        }
        close(sv[0]);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_header),  cmocka_unit_test(test_hello),
        cmocka_unit_test(test_plan),    cmocka_unit_test(test_plan_real),
        cmocka_unit_test(test_report),  cmocka_unit_test(test_delta),
        cmocka_unit_test(test_status),  cmocka_unit_test(test_epoch_msgs),
        cmocka_unit_test(test_framing), cmocka_unit_test(test_gather_msgs),
        cmocka_unit_test(test_world_msg), cmocka_unit_test(test_refusal_behind_frames),
        cmocka_unit_test(test_shared_out), cmocka_unit_test(test_range_overflow),
        cmocka_unit_test(test_secret_file),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
