/* Control protocol: encoders and validating decoders. Little-endian fixed-width
 * fields written byte by byte, so the host's endianness and struct layout never
 * reach the wire. Decoders reject truncation, trailing bytes, out-of-range
 * values and strings that are too long or carry NUL bytes. */
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "ctl/proto.h"

static const char *const perr_names[NRS_PERR_COUNT] = {
    "ok", "bad magic", "unsupported version", "frame too long", "unknown type", "malformed",
    "unexpected", "not authorized", "stale", "refused", "timed out", "internal error"};

const char *nrs_perr_name(int code)
{
    return code >= 0 && code < NRS_PERR_COUNT ? perr_names[code] : "unknown error";
}

static const char *const msg_names[NRS_MSG_MAX + 1] = {
    "?", "HELLO", "PLAN", "REPORT", "DELTA", "DELTA_REPLY", "STATUS_REQ", "STATUS",
    "PREPARE", "ACK", "COMMIT", "ABORT", "ERROR", "GATHER", "GATHERED", "WORLD"};

const char *nrs_msg_name(int type)
{
    return type >= 1 && type <= NRS_MSG_MAX ? msg_names[type] : "?";
}

/* ---- little-endian primitives ------------------------------------------- */

static void put16(uint8_t *b, uint16_t v)
{
    b[0] = (uint8_t)v;
    b[1] = (uint8_t)(v >> 8);
}
static void put32(uint8_t *b, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        b[i] = (uint8_t)(v >> (8 * i));
}
static uint16_t get16(const uint8_t *b)
{
    return (uint16_t)(b[0] | (b[1] << 8));
}
static uint32_t get32(const uint8_t *b)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++)
        v |= (uint32_t)b[i] << (8 * i);
    return v;
}

/* Allowed header flags per type. */
static uint32_t type_flags(uint16_t type)
{
    return type == NRS_MSG_STATUS || type == NRS_MSG_GATHERED ? NRS_FLAG_MORE : 0;
}

int nrs_proto_hdr_decode(const uint8_t *b, nrs_hdr_t *h)
{
    if (get32(b) != NRS_PROTO_MAGIC)
        return -NRS_PERR_MAGIC;
    h->version = get16(b + 4);
    h->type = get16(b + 6);
    h->flags = get32(b + 8);
    h->length = get32(b + 12);
    if (h->version != NRS_PROTO_VERSION)
        return -NRS_PERR_VERSION;
    if (h->length > NRS_PROTO_MAX_PAYLOAD)
        return -NRS_PERR_LENGTH;
    if (h->type < 1 || h->type > NRS_MSG_MAX)
        return -NRS_PERR_TYPE;
    if (h->flags & ~type_flags(h->type))
        return -NRS_PERR_MALFORMED;
    return 0;
}

void nrs_proto_hdr_encode(uint8_t *b, uint16_t type, uint32_t flags, uint32_t length)
{
    put32(b, NRS_PROTO_MAGIC);
    put16(b + 4, NRS_PROTO_VERSION);
    put16(b + 6, type);
    put32(b + 8, flags);
    put32(b + 12, length);
}

/* ---- writer --------------------------------------------------------------- */

typedef struct {
    uint8_t *b;
    size_t cap, n;
    bool bad;
} wr_t;

static void wr_init(wr_t *w, uint8_t *buf, size_t cap)
{
    w->b = buf;
    w->cap = cap < NRS_PROTO_HDR + NRS_PROTO_MAX_PAYLOAD ? cap : NRS_PROTO_HDR + NRS_PROTO_MAX_PAYLOAD;
    w->n = NRS_PROTO_HDR;
    w->bad = cap < NRS_PROTO_HDR;
}
static uint8_t *wr_room(wr_t *w, size_t k)
{
    if (w->bad || w->cap - w->n < k) {
        w->bad = true;
        return NULL;
    }
    uint8_t *p = w->b + w->n;
    w->n += k;
    return p;
}
static void w8(wr_t *w, uint8_t v)
{
    uint8_t *p = wr_room(w, 1);
    if (p)
        *p = v;
}
static void w16(wr_t *w, uint16_t v)
{
    uint8_t *p = wr_room(w, 2);
    if (p)
        put16(p, v);
}
static void w32(wr_t *w, uint32_t v)
{
    uint8_t *p = wr_room(w, 4);
    if (p)
        put32(p, v);
}
static void w64(wr_t *w, uint64_t v)
{
    w32(w, (uint32_t)v);
    w32(w, (uint32_t)(v >> 32));
}
static void wf64(wr_t *w, double d)
{
    uint64_t v;
    memcpy(&v, &d, sizeof(v)); /* IEEE-754 binary64 bit pattern */
    w64(w, v);
}
/* u16 length + bytes, no NUL; max counts the NUL of the C string. */
static void wstr(wr_t *w, const char *s, size_t max)
{
    size_t len = strnlen(s, max);
    if (len >= max) {
        w->bad = true;
        return;
    }
    w16(w, (uint16_t)len);
    uint8_t *p = wr_room(w, len);
    if (p)
        memcpy(p, s, len);
}
static int wr_finish(wr_t *w, uint16_t type, uint32_t flags)
{
    if (w->bad)
        return -1;
    nrs_proto_hdr_encode(w->b, type, flags, (uint32_t)(w->n - NRS_PROTO_HDR));
    return (int)w->n;
}

/* ---- reader --------------------------------------------------------------- */

typedef struct {
    const uint8_t *b;
    size_t n, off;
    char *why;
    size_t wl;
    bool bad;
} rd_t;

static void rd_init(rd_t *r, const uint8_t *p, size_t n, char *why, size_t wl)
{
    r->b = p;
    r->n = n;
    r->off = 0;
    r->why = why;
    r->wl = wl;
    r->bad = false;
    if (why && wl)
        why[0] = 0;
}
static bool fail(rd_t *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool fail(rd_t *r, const char *fmt, ...)
{
    if (!r->bad && r->why && r->wl) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(r->why, r->wl, fmt, ap);
        va_end(ap);
    }
    r->bad = true;
    return false;
}
static const uint8_t *rd_take(rd_t *r, size_t k, const char *field)
{
    if (r->bad)
        return NULL;
    if (r->n - r->off < k) {
        fail(r, "truncated at %s", field);
        return NULL;
    }
    const uint8_t *p = r->b + r->off;
    r->off += k;
    return p;
}
static uint8_t r8(rd_t *r, const char *f)
{
    const uint8_t *p = rd_take(r, 1, f);
    return p ? *p : 0;
}
static uint16_t r16(rd_t *r, const char *f)
{
    const uint8_t *p = rd_take(r, 2, f);
    return p ? get16(p) : 0;
}
static uint32_t r32(rd_t *r, const char *f)
{
    const uint8_t *p = rd_take(r, 4, f);
    return p ? get32(p) : 0;
}
static uint64_t r64(rd_t *r, const char *f)
{
    uint64_t lo = r32(r, f);
    return lo | (uint64_t)r32(r, f) << 32;
}
static double rf64(rd_t *r, const char *f)
{
    uint64_t v = r64(r, f);
    double d;
    memcpy(&d, &v, sizeof(d));
    return d;
}
/* Finite, in [lo, hi]. */
static double rnum(rd_t *r, const char *f, double lo, double hi)
{
    double d = rf64(r, f);
    if (!r->bad && !(isfinite(d) && d >= lo && d <= hi))
        fail(r, "%s out of range", f);
    return d;
}
/* In [lo, hi]; lo once the message is bad, so that a bound the decoder then
 * computes from it (size - 1, size - base) cannot overflow. */
static int32_t rint_range(rd_t *r, const char *f, int64_t lo, int64_t hi)
{
    int32_t v = (int32_t)r32(r, f);
    if (!r->bad && (v < lo || v > hi))
        fail(r, "%s = %d out of range %lld..%lld", f, (int)v, (long long)lo, (long long)hi);
    return r->bad ? (int32_t)lo : v;
}
static void rstr(rd_t *r, const char *f, char *out, size_t max)
{
    out[0] = 0;
    uint16_t len = r16(r, f);
    if (r->bad)
        return;
    if (len >= max) {
        fail(r, "%s longer than %zu bytes", f, max - 1);
        return;
    }
    const uint8_t *p = rd_take(r, len, f);
    if (!p)
        return;
    if (memchr(p, 0, len)) {
        fail(r, "%s contains a NUL byte", f);
        return;
    }
    memcpy(out, p, len);
    out[len] = 0;
}
static int rd_finish(rd_t *r)
{
    if (!r->bad && r->off != r->n)
        fail(r, "%zu trailing bytes", r->n - r->off);
    return r->bad ? -NRS_PERR_MALFORMED : 0;
}

/* ---- HELLO ---------------------------------------------------------------- */

int nrs_enc_hello(uint8_t *buf, size_t cap, const nrs_msg_hello_t *m)
{
    wr_t w;
    wr_init(&w, buf, cap);
    w32(&w, m->role);
    wstr(&w, m->job, sizeof(m->job));
    w32(&w, (uint32_t)m->rank);
    w32(&w, (uint32_t)m->nranks);
    wstr(&w, m->host, sizeof(m->host));
    wstr(&w, m->token, sizeof(m->token));
    return wr_finish(&w, NRS_MSG_HELLO, 0);
}

int nrs_dec_hello(const uint8_t *p, size_t n, nrs_msg_hello_t *m, char *why, size_t wl)
{
    rd_t r;
    rd_init(&r, p, n, why, wl);
    memset(m, 0, sizeof(*m));
    m->role = r32(&r, "role");
    if (!r.bad && (m->role < NRS_ROLE_WORKER || m->role > NRS_ROLE_JOINER))
        fail(&r, "role %u unknown", m->role);
    bool rank_role = m->role == NRS_ROLE_WORKER || m->role == NRS_ROLE_JOINER;
    rstr(&r, "job", m->job, sizeof(m->job));
    m->rank = (int32_t)r32(&r, "rank");
    m->nranks = (int32_t)r32(&r, "nranks");
    if (!r.bad && rank_role &&
        !(m->nranks >= 1 && m->nranks <= NRS_PROTO_MAX_RANKS && m->rank >= 0 && m->rank < m->nranks))
        fail(&r, "rank %d of %d out of range", (int)m->rank, (int)m->nranks);
    if (!r.bad && !rank_role && (m->rank != 0 || m->nranks != 0))
        fail(&r, "rank and nranks must be 0 for a non-worker");
    rstr(&r, "host", m->host, sizeof(m->host));
    rstr(&r, "token", m->token, sizeof(m->token));
    if (!r.bad && rank_role && !m->host[0])
        fail(&r, "worker without a host name");
    return rd_finish(&r);
}

/* ---- PLAN ----------------------------------------------------------------- */

int nrs_proto_check_plan(const nrs_plan_t *p, char *why, size_t wl)
{
#define BAD(...) do { if (why && wl) snprintf(why, wl, __VA_ARGS__); return -NRS_PERR_MALFORMED; } while (0)
    if (p->epoch < 1)
        BAD("epoch 0");
    if (p->total_gpus < 1 || p->total_gpus > NRS_PROTO_MAX_GPUS)
        BAD("total_gpus %d out of range", p->total_gpus);
    if (p->npools < 1 || p->npools > NRS_POOL_MAX)
        BAD("npools %d out of range", p->npools);
    for (int i = 0; i < p->npools; i++) {
        const nrs_pool_t *pl = &p->pools[i];
        if (pl->first_gpu < 0 || pl->gpus < 1 || pl->first_gpu > p->total_gpus - pl->gpus)
            BAD("pool %d (GPUs %d+%d) outside 0..%d", i, pl->first_gpu, pl->gpus, p->total_gpus);
        for (int j = 0; j < i; j++) {
            const nrs_pool_t *q = &p->pools[j];
            if (pl->first_gpu < q->first_gpu + q->gpus && q->first_gpu < pl->first_gpu + pl->gpus)
                BAD("pools %d and %d overlap", j, i);
        }
    }
    int nhas = 0;
    for (int ms = 0; ms < NRS_MS_COUNT; ms++) {
        if (!p->has[ms])
            continue;
        nhas++;
        const nrs_layout_t *l = &p->layout[ms];
        if (p->pool_of[ms] < 0 || p->pool_of[ms] >= p->npools)
            BAD("%s: pool %d out of range", nrs_ms_name((nrs_ms_t)ms), p->pool_of[ms]);
        if (l->tp < 1 || l->pp < 1 || l->dp < 1 || l->mb < 1)
            BAD("%s: layout (%d,%d,%d,%d) not positive", nrs_ms_name((nrs_ms_t)ms), l->tp, l->pp,
                l->dp, l->mb);
        long long g = (long long)l->tp * l->pp * l->dp;
        if (g > p->pools[p->pool_of[ms]].gpus)
            BAD("%s: tp*pp*dp = %lld exceeds its pool's %d GPUs", nrs_ms_name((nrs_ms_t)ms), g,
                p->pools[p->pool_of[ms]].gpus);
    }
    if (!nhas)
        BAD("no model-stage");
    return 0;
#undef BAD
}

int nrs_enc_plan(uint8_t *buf, size_t cap, const nrs_msg_plan_t *m)
{
    const nrs_plan_t *p = &m->plan;
    wr_t w;
    wr_init(&w, buf, cap);
    if (m->nlost < 0 || m->nlost > NRS_PROTO_MAX_LOST || p->npools < 0 || p->npools > NRS_POOL_MAX)
        return -1;
    w32(&w, p->epoch);
    w32(&w, m->prev_epoch);
    w32(&w, m->flags);
    w32(&w, (uint32_t)p->total_gpus);
    w8(&w, (uint8_t)p->npools);
    for (int i = 0; i < p->npools; i++) {
        w32(&w, (uint32_t)p->pools[i].first_gpu);
        w32(&w, (uint32_t)p->pools[i].gpus);
    }
    w8(&w, NRS_MS_COUNT);
    for (int ms = 0; ms < NRS_MS_COUNT; ms++) {
        w8(&w, p->has[ms] ? 1 : 0);
        if (!p->has[ms])
            continue;
        w8(&w, (uint8_t)p->pool_of[ms]);
        w32(&w, (uint32_t)p->layout[ms].tp);
        w32(&w, (uint32_t)p->layout[ms].pp);
        w32(&w, (uint32_t)p->layout[ms].dp);
        w32(&w, (uint32_t)p->layout[ms].mb);
        wf64(&w, p->ms_time[ms]);
        wf64(&w, p->ms_mem[ms]);
    }
    for (int ph = 0; ph < 3; ph++)
        wf64(&w, p->phase_time[ph]);
    wf64(&w, p->sync_s);
    wf64(&w, p->step_s);
    wf64(&w, p->capacity_bytes);
    w32(&w, (uint32_t)m->nlost);
    for (int i = 0; i < m->nlost; i++)
        w32(&w, (uint32_t)m->lost[i]);
    return wr_finish(&w, NRS_MSG_PLAN, 0);
}

#define TIME_MAX 1e9  /* seconds */
#define BYTES_MAX 1e18

int nrs_dec_plan(const uint8_t *b, size_t n, nrs_msg_plan_t *m, char *why, size_t wl)
{
    rd_t r;
    nrs_plan_t *p = &m->plan;
    rd_init(&r, b, n, why, wl);
    memset(m, 0, sizeof(*m));
    p->epoch = r32(&r, "epoch");
    m->prev_epoch = r32(&r, "prev_epoch");
    m->flags = r32(&r, "flags");
    if (!r.bad && (m->flags & ~(uint32_t)(NRS_PLAN_TRANSITION | NRS_PLAN_FORCED)))
        fail(&r, "unknown plan flags 0x%x", m->flags);
    if (!r.bad && p->epoch < 1)
        fail(&r, "epoch 0");
    if (!r.bad && m->prev_epoch >= p->epoch)
        fail(&r, "prev_epoch %u not below epoch %u", m->prev_epoch, p->epoch);
    p->total_gpus = rint_range(&r, "total_gpus", 1, NRS_PROTO_MAX_GPUS);
    p->npools = r8(&r, "npools");
    if (!r.bad && (p->npools < 1 || p->npools > NRS_POOL_MAX))
        fail(&r, "npools %d out of range", p->npools);
    for (int i = 0; i < p->npools && !r.bad; i++) {
        p->pools[i].first_gpu = rint_range(&r, "pool.first_gpu", 0, NRS_PROTO_MAX_GPUS);
        p->pools[i].gpus = rint_range(&r, "pool.gpus", 1, NRS_PROTO_MAX_GPUS);
    }
    int nms = r8(&r, "nms");
    if (!r.bad && nms != NRS_MS_COUNT)
        fail(&r, "%d model-stages, expected %d", nms, NRS_MS_COUNT);
    for (int ms = 0; ms < NRS_MS_COUNT && !r.bad; ms++) {
        uint8_t has = r8(&r, "has");
        if (!r.bad && has > 1)
            fail(&r, "has = %u", has);
        p->has[ms] = has == 1;
        if (!p->has[ms])
            continue;
        p->pool_of[ms] = r8(&r, "pool_of");
        p->layout[ms].tp = rint_range(&r, "tp", 1, NRS_PROTO_MAX_GPUS);
        p->layout[ms].pp = rint_range(&r, "pp", 1, NRS_PROTO_MAX_GPUS);
        p->layout[ms].dp = rint_range(&r, "dp", 1, NRS_PROTO_MAX_GPUS);
        p->layout[ms].mb = rint_range(&r, "mb", 1, 1 << 24);
        p->ms_time[ms] = rnum(&r, "ms_time", 0, TIME_MAX);
        p->ms_mem[ms] = rnum(&r, "ms_mem", 0, BYTES_MAX);
    }
    for (int ph = 0; ph < 3; ph++)
        p->phase_time[ph] = rnum(&r, "phase_time", 0, TIME_MAX);
    p->sync_s = rnum(&r, "sync_s", 0, TIME_MAX);
    p->step_s = rnum(&r, "step_s", 0, TIME_MAX);
    p->capacity_bytes = rnum(&r, "capacity_bytes", 0, BYTES_MAX);
    m->nlost = rint_range(&r, "nlost", 0, NRS_PROTO_MAX_LOST);
    for (int i = 0; i < m->nlost && !r.bad; i++) {
        m->lost[i] = rint_range(&r, "lost", 0, NRS_PROTO_MAX_GPUS - 1);
        if (!r.bad && i > 0 && m->lost[i] <= m->lost[i - 1])
            fail(&r, "lost GPUs not strictly increasing");
    }
    if (!r.bad && m->nlost && m->prev_epoch == 0)
        fail(&r, "lost GPUs without a previous epoch");
    int rc = rd_finish(&r);
    if (rc == 0)
        rc = nrs_proto_check_plan(p, why, wl);
    return rc;
}

/* ---- REPORT --------------------------------------------------------------- */

int nrs_enc_report(uint8_t *buf, size_t cap, const nrs_msg_report_t *m)
{
    wr_t w;
    wr_init(&w, buf, cap);
    if (m->nstages < 0 || m->nstages > NRS_MS_COUNT)
        return -1;
    w32(&w, m->epoch);
    w32(&w, m->step);
    w32(&w, m->flags);
    wf64(&w, m->response_len);
    w8(&w, (uint8_t)m->nstages);
    for (int i = 0; i < m->nstages; i++) {
        w8(&w, m->ms[i]);
        wf64(&w, m->seconds[i]);
    }
    return wr_finish(&w, NRS_MSG_REPORT, 0);
}

int nrs_dec_report(const uint8_t *b, size_t n, nrs_msg_report_t *m, char *why, size_t wl)
{
    rd_t r;
    rd_init(&r, b, n, why, wl);
    memset(m, 0, sizeof(*m));
    m->epoch = r32(&r, "epoch");
    if (!r.bad && m->epoch < 1)
        fail(&r, "epoch 0");
    m->step = r32(&r, "step");
    if (!r.bad && m->step > NRS_PROTO_MAX_STEP)
        fail(&r, "step %u out of range", m->step);
    m->flags = r32(&r, "flags");
    if (!r.bad && (m->flags & ~(uint32_t)(NRS_REPORT_MEM_HIGH | NRS_REPORT_MEM_FAILED)))
        fail(&r, "unknown report flags 0x%x", m->flags);
    m->response_len = rnum(&r, "response_len", 0, NRS_PROTO_REPORT_MAX_LEN);
    m->nstages = r8(&r, "nstages");
    if (!r.bad && m->nstages > NRS_MS_COUNT)
        fail(&r, "%d stages, at most %d", m->nstages, NRS_MS_COUNT);
    unsigned seen = 0;
    for (int i = 0; i < m->nstages && !r.bad; i++) {
        m->ms[i] = r8(&r, "ms");
        if (!r.bad && m->ms[i] >= NRS_MS_COUNT)
            fail(&r, "model-stage %u unknown", m->ms[i]);
        if (!r.bad && (seen & (1u << m->ms[i])))
            fail(&r, "model-stage %s twice", nrs_ms_name((nrs_ms_t)m->ms[i]));
        if (!r.bad)
            seen |= 1u << m->ms[i];
        m->seconds[i] = rnum(&r, "seconds", NRS_PROTO_REPORT_MIN_S, NRS_PROTO_REPORT_MAX_S);
    }
    return rd_finish(&r);
}

/* ---- DELTA ---------------------------------------------------------------- */

int nrs_enc_delta(uint8_t *buf, size_t cap, const nrs_msg_delta_t *m)
{
    wr_t w;
    wr_init(&w, buf, cap);
    if (m->nhosts < 0 || m->nhosts > NRS_PROTO_MAX_HOSTS || m->ngpus < 0 ||
        m->ngpus > NRS_PROTO_MAX_LOST)
        return -1;
    w64(&w, m->generation);
    w32(&w, m->kind);
    w32(&w, m->add_nodes);
    w16(&w, (uint16_t)m->nhosts);
    for (int i = 0; i < m->nhosts; i++)
        wstr(&w, m->hosts[i], sizeof(m->hosts[i]));
    w16(&w, (uint16_t)m->ngpus);
    for (int i = 0; i < m->ngpus; i++)
        w32(&w, (uint32_t)m->gpus[i]);
    return wr_finish(&w, NRS_MSG_DELTA, 0);
}

int nrs_dec_delta(const uint8_t *b, size_t n, nrs_msg_delta_t *m, char *why, size_t wl)
{
    rd_t r;
    rd_init(&r, b, n, why, wl);
    m->nhosts = m->ngpus = 0;
    m->generation = r64(&r, "generation");
    m->kind = r32(&r, "kind");
    if (!r.bad && (m->kind < NRS_DELTA_ADD || m->kind > NRS_DELTA_LOST))
        fail(&r, "delta kind %u unknown", m->kind);
    m->add_nodes = r32(&r, "add_nodes");
    m->nhosts = r16(&r, "nhosts");
    if (!r.bad && m->nhosts > NRS_PROTO_MAX_HOSTS)
        fail(&r, "%d hosts, at most %d", m->nhosts, NRS_PROTO_MAX_HOSTS);
    if (r.bad)
        m->nhosts = 0;
    for (int i = 0; i < m->nhosts && !r.bad; i++) {
        rstr(&r, "host", m->hosts[i], sizeof(m->hosts[i]));
        if (!r.bad && !m->hosts[i][0])
            fail(&r, "empty host name");
    }
    m->ngpus = r16(&r, "ngpus");
    if (!r.bad && m->ngpus > NRS_PROTO_MAX_LOST)
        fail(&r, "%d GPUs, at most %d", m->ngpus, NRS_PROTO_MAX_LOST);
    if (r.bad)
        m->ngpus = 0;
    for (int i = 0; i < m->ngpus && !r.bad; i++)
        m->gpus[i] = rint_range(&r, "gpu", 0, NRS_PROTO_MAX_GPUS - 1);
    if (!r.bad && m->kind == NRS_DELTA_ADD &&
        (m->add_nodes < 1 || m->add_nodes > 4096 || m->nhosts || m->ngpus))
        fail(&r, "ADD needs 1..4096 nodes and no hosts or GPUs");
    if (!r.bad && m->kind != NRS_DELTA_ADD && (m->add_nodes || (!m->nhosts && !m->ngpus)))
        fail(&r, "REMOVE/LOST need hosts or GPUs and no added nodes");
    return rd_finish(&r);
}

int nrs_enc_delta_reply(uint8_t *buf, size_t cap, const nrs_msg_delta_reply_t *m)
{
    wr_t w;
    wr_init(&w, buf, cap);
    w64(&w, m->generation);
    w32(&w, m->accepted);
    w32(&w, m->epoch);
    w32(&w, m->new_epoch);
    wstr(&w, m->text, sizeof(m->text));
    return wr_finish(&w, NRS_MSG_DELTA_REPLY, 0);
}

int nrs_dec_delta_reply(const uint8_t *b, size_t n, nrs_msg_delta_reply_t *m, char *why,
                        size_t wl)
{
    rd_t r;
    rd_init(&r, b, n, why, wl);
    m->generation = r64(&r, "generation");
    m->accepted = r32(&r, "accepted");
    if (!r.bad && m->accepted > 1)
        fail(&r, "accepted = %u", m->accepted);
    m->epoch = r32(&r, "epoch");
    m->new_epoch = r32(&r, "new_epoch");
    if (!r.bad && m->new_epoch && m->new_epoch <= m->epoch)
        fail(&r, "new_epoch %u not above epoch %u", m->new_epoch, m->epoch);
    rstr(&r, "text", m->text, sizeof(m->text));
    return rd_finish(&r);
}

/* ---- STATUS --------------------------------------------------------------- */

int nrs_enc_status_req(uint8_t *buf, size_t cap, const nrs_msg_status_req_t *m)
{
    wr_t w;
    wr_init(&w, buf, cap);
    w32(&w, m->format);
    return wr_finish(&w, NRS_MSG_STATUS_REQ, 0);
}

int nrs_dec_status_req(const uint8_t *b, size_t n, nrs_msg_status_req_t *m, char *why, size_t wl)
{
    rd_t r;
    rd_init(&r, b, n, why, wl);
    m->format = r32(&r, "format");
    if (!r.bad && (m->format & ~(uint32_t)NRS_STATUS_JSON))
        fail(&r, "unknown status format 0x%x", m->format);
    return rd_finish(&r);
}

int nrs_enc_status(uint8_t *buf, size_t cap, const char *text, size_t len, uint32_t flags)
{
    wr_t w;
    wr_init(&w, buf, cap);
    if (flags & ~(uint32_t)NRS_FLAG_MORE || memchr(text, 0, len))
        return -1;
    uint8_t *p = wr_room(&w, len);
    if (p)
        memcpy(p, text, len);
    return wr_finish(&w, NRS_MSG_STATUS, flags);
}

int nrs_dec_status(const uint8_t *b, size_t n, const char **text, size_t *len, char *why,
                   size_t wl)
{
    rd_t r;
    rd_init(&r, b, n, why, wl);
    if (memchr(b, 0, n))
        fail(&r, "status text contains a NUL byte");
    *text = (const char *)b;
    *len = n;
    r.off = n;
    return rd_finish(&r);
}

/* ---- PREPARE / COMMIT / ABORT, ACK, ERROR ---------------------------------- */

int nrs_enc_epoch(uint8_t *buf, size_t cap, uint16_t type, const nrs_msg_epoch_t *m)
{
    wr_t w;
    wr_init(&w, buf, cap);
    if (type != NRS_MSG_PREPARE && type != NRS_MSG_COMMIT && type != NRS_MSG_ABORT)
        return -1;
    w32(&w, m->epoch);
    if (type == NRS_MSG_ABORT)
        wstr(&w, m->text, sizeof(m->text));
    return wr_finish(&w, type, 0);
}

int nrs_dec_epoch(uint16_t type, const uint8_t *b, size_t n, nrs_msg_epoch_t *m, char *why,
                  size_t wl)
{
    rd_t r;
    rd_init(&r, b, n, why, wl);
    m->text[0] = 0;
    if (type != NRS_MSG_PREPARE && type != NRS_MSG_COMMIT && type != NRS_MSG_ABORT)
        fail(&r, "not an epoch message");
    m->epoch = r32(&r, "epoch");
    if (!r.bad && m->epoch < 2)
        fail(&r, "transition to epoch %u", m->epoch);
    if (type == NRS_MSG_ABORT)
        rstr(&r, "reason", m->text, sizeof(m->text));
    return rd_finish(&r);
}

int nrs_enc_ack(uint8_t *buf, size_t cap, const nrs_msg_ack_t *m)
{
    wr_t w;
    wr_init(&w, buf, cap);
    w32(&w, m->epoch);
    w32(&w, m->phase);
    w32(&w, (uint32_t)m->status);
    wf64(&w, m->seconds);
    return wr_finish(&w, NRS_MSG_ACK, 0);
}

int nrs_dec_ack(const uint8_t *b, size_t n, nrs_msg_ack_t *m, char *why, size_t wl)
{
    rd_t r;
    rd_init(&r, b, n, why, wl);
    m->epoch = r32(&r, "epoch");
    if (!r.bad && m->epoch < 2)
        fail(&r, "ack of epoch %u", m->epoch);
    m->phase = r32(&r, "phase");
    if (!r.bad && m->phase != NRS_MSG_PREPARE && m->phase != NRS_MSG_COMMIT)
        fail(&r, "ack of phase %u", m->phase);
    m->status = (int32_t)r32(&r, "status");
    m->seconds = rnum(&r, "seconds", 0, 1e6);
    return rd_finish(&r);
}

int nrs_enc_error(uint8_t *buf, size_t cap, const nrs_msg_error_t *m)
{
    wr_t w;
    wr_init(&w, buf, cap);
    w32(&w, m->code);
    wstr(&w, m->text, sizeof(m->text));
    return wr_finish(&w, NRS_MSG_ERROR, 0);
}

int nrs_dec_error(const uint8_t *b, size_t n, nrs_msg_error_t *m, char *why, size_t wl)
{
    rd_t r;
    rd_init(&r, b, n, why, wl);
    m->code = r32(&r, "code");
    if (!r.bad && (m->code < 1 || m->code >= NRS_PERR_COUNT))
        fail(&r, "error code %u unknown", m->code);
    rstr(&r, "text", m->text, sizeof(m->text));
    return rd_finish(&r);
}

/* ---- GATHER, GATHERED ------------------------------------------------------- */

static void wbytes(wr_t *w, const void *p, size_t n)
{
    uint8_t *d = wr_room(w, n);
    if (d && n)
        memcpy(d, p, n);
}

/* A rank list: u32 count, then that many u32 ranks. */
static void wranks(wr_t *w, const int32_t *v, int n)
{
    w32(w, (uint32_t)n);
    for (int i = 0; i < n; i++)
        w32(w, (uint32_t)v[i]);
}

/* Read a rank list of at most max ranks, each in lo..hi (hi below
 * NRS_PROTO_MAX_RANKS; none twice when distinct); the count, 0 once the
 * message is bad. */
static int32_t rranks(rd_t *r, const char *what, int32_t *v, int max, int32_t lo, int32_t hi,
                      bool distinct)
{
    uint8_t seen[NRS_PROTO_MAX_RANKS / 8];
    int32_t n = rint_range(r, "nout", 0, max);
    memset(seen, 0, sizeof(seen));
    for (int i = 0; !r->bad && i < n; i++) {
        int32_t o = v[i] = rint_range(r, what, lo, hi);
        if (r->bad || !distinct)
            continue;
        if ((seen[o / 8] >> (o % 8)) & 1)
            fail(r, "%s %d twice", what, o);
        seen[o / 8] |= (uint8_t)(1u << (o % 8));
    }
    return r->bad ? 0 : n;
}

int nrs_enc_gather(uint8_t *buf, size_t cap, const nrs_msg_gather_t *m)
{
    wr_t w;
    wr_init(&w, buf, cap);
    if (m->nout < 0 || m->nout > NRS_GATHER_MAX_OUT || m->len > NRS_GATHER_DATA_MAX)
        return -1;
    w64(&w, m->key);
    wstr(&w, m->name, sizeof(m->name));
    w32(&w, m->timeout_ms);
    w32(&w, (uint32_t)m->nranks);
    wranks(&w, m->out, m->nout);
    w32(&w, m->len);
    wbytes(&w, m->data, m->len);
    return wr_finish(&w, NRS_MSG_GATHER, 0);
}

/* The head GATHER and GATHERED share: key u64, a non-empty name. */
static uint64_t rkey_name(rd_t *r, char *name, size_t n)
{
    uint64_t key = r64(r, "key");
    rstr(r, "name", name, n);
    if (!r->bad && !name[0])
        fail(r, "empty name");
    return key;
}

int nrs_dec_gather(const uint8_t *b, size_t n, nrs_msg_gather_t *m, char *why, size_t wl)
{
    rd_t r;
    rd_init(&r, b, n, why, wl);
    m->key = rkey_name(&r, m->name, sizeof(m->name));
    m->timeout_ms = r32(&r, "timeout_ms");
    if (!r.bad && (m->timeout_ms < 1 || m->timeout_ms > NRS_GATHER_TIMEOUT_MAX))
        fail(&r, "timeout_ms = %u out of range 1..%u", m->timeout_ms, NRS_GATHER_TIMEOUT_MAX);
    m->nranks = rint_range(&r, "nranks", 1, NRS_PROTO_MAX_RANKS);
    m->nout = rranks(&r, "out rank", m->out, NRS_GATHER_MAX_OUT, 0, m->nranks - 1, true);
    m->len = r32(&r, "len");
    if (!r.bad && m->len > NRS_GATHER_DATA_MAX)
        fail(&r, "len = %u over %u", m->len, NRS_GATHER_DATA_MAX);
    m->data = r.bad ? NULL : rd_take(&r, m->len, "data");
    if (r.bad)
        m->nout = 0, m->len = 0, m->data = NULL;
    return rd_finish(&r);
}

/* key u64, name (u16 + up to 47), len u32, count u32 */
#define GATHERED_HEAD (8 + 2 + (NRS_GATHER_NAME_MAX - 1) + 4 + 4)

uint32_t nrs_gathered_fit(uint32_t len)
{
    uint32_t k = (uint32_t)((NRS_PROTO_MAX_PAYLOAD - GATHERED_HEAD) / (4 + (size_t)len));
    return k ? k : 1;
}

int nrs_enc_gathered(uint8_t *buf, size_t cap, const nrs_msg_gathered_t *m,
                     const int32_t *ranks, const uint8_t *data, uint32_t flags)
{
    wr_t w;
    wr_init(&w, buf, cap);
    if (m->len > NRS_GATHER_DATA_MAX || (flags & ~(uint32_t)NRS_FLAG_MORE))
        return -1;
    w64(&w, m->key);
    wstr(&w, m->name, sizeof(m->name));
    w32(&w, m->len);
    w32(&w, m->count);
    for (uint32_t i = 0; i < m->count && !w.bad; i++) {
        w32(&w, (uint32_t)ranks[i]);
        wbytes(&w, data + (size_t)i * m->len, m->len);
    }
    return wr_finish(&w, NRS_MSG_GATHERED, flags);
}

int nrs_dec_gathered(const uint8_t *b, size_t n, nrs_msg_gathered_t *m, char *why, size_t wl)
{
    rd_t r;
    rd_init(&r, b, n, why, wl);
    m->key = rkey_name(&r, m->name, sizeof(m->name));
    m->len = r32(&r, "len");
    if (!r.bad && m->len > NRS_GATHER_DATA_MAX)
        fail(&r, "len = %u over %u", m->len, NRS_GATHER_DATA_MAX);
    m->count = r32(&r, "count");
    size_t each = 4 + (size_t)m->len;
    if (!r.bad && m->count > NRS_PROTO_MAX_PAYLOAD / each)
        fail(&r, "%u entries of %zu bytes: more than a frame", m->count, each);
    m->entries = r.bad ? NULL : rd_take(&r, (size_t)m->count * each, "entries");
    int32_t prev = -1;
    for (uint32_t i = 0; !r.bad && i < m->count; i++) {
        int32_t rk = (int32_t)get32(m->entries + i * each);
        if (rk < 0 || rk >= NRS_PROTO_MAX_RANKS || rk <= prev)
            fail(&r, "entry %u: rank %d not ascending in 0..%d", i, (int)rk,
                 NRS_PROTO_MAX_RANKS - 1);
        prev = rk;
    }
    if (r.bad)
        m->count = 0, m->entries = NULL;
    return rd_finish(&r);
}

void nrs_gathered_entry(const nrs_msg_gathered_t *m, uint32_t i, int32_t *rank,
                        const uint8_t **data)
{
    const uint8_t *e = m->entries + (size_t)i * (4 + m->len);
    *rank = (int32_t)get32(e);
    *data = e + 4;
}

/* ---- WORLD ------------------------------------------------------------------------ */

int nrs_enc_world(uint8_t *buf, size_t cap, const nrs_msg_world_t *m)
{
    wr_t w;
    wr_init(&w, buf, cap);
    if (m->nout < 0 || m->nout > NRS_GATHER_MAX_OUT)
        return -1;
    w32(&w, m->gen);
    w32(&w, (uint32_t)m->size);
    w32(&w, (uint32_t)m->rank);
    w32(&w, (uint32_t)m->base);
    w32(&w, (uint32_t)m->count);
    wranks(&w, m->out, m->nout);
    return wr_finish(&w, NRS_MSG_WORLD, 0);
}

int nrs_dec_world(const uint8_t *b, size_t n, nrs_msg_world_t *m, char *why, size_t wl)
{
    rd_t r;
    rd_init(&r, b, n, why, wl);
    m->gen = r32(&r, "gen");
    if (!r.bad && m->gen < 1)
        fail(&r, "generation 0");
    m->size = rint_range(&r, "size", 2, NRS_PROTO_MAX_RANKS);
    m->rank = rint_range(&r, "rank", 0, m->size - 1);
    m->base = rint_range(&r, "base", 1, m->size - 1);
    m->count = rint_range(&r, "count", 1, m->size - m->base);
    if (!r.bad && m->base + m->count != m->size)
        fail(&r, "base %d + count %d != size %d", m->base, m->count, m->size);
    m->nout = rranks(&r, "out rank", m->out, NRS_GATHER_MAX_OUT, 0, m->base - 1, false);
    return rd_finish(&r);
}
