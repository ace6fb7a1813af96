/* Distributed transitions: prepare, execute, vote at the point of no return,
 * commit or abort (dtrans.h, docs/worker-api.md §4). */
#define _GNU_SOURCE
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "emu/pattern.h"
#include "util/util.h"
#include "worker/census.h"
#include "worker/dtrans.h"

/* ucx carries 32 bits of tag: 8 of run (opts.sync_tags: the top one), 24 of op
 * (16.7 M ops; 1,024 GPUs take ~285 k): a run's stale message matches a run
 * 128 later at the earliest */
#define DT_TAG_OP_BITS 24

typedef struct {
    int used;
    int64_t op;
    int32_t src, dst; /* buffer ids on this rank, -1 for the other side */
    nrs_xreq_t rs, rr;
    nrs_xregion_t dreg; /* what is received, hashed when it is in (opts.verify) */
} flight_t;

/* A rank's vote (the gather's bytes): its value, and the sums of what it sent
 * and received since the last vote (opts.verify). */
typedef struct {
    int64_t val;
    uint64_t sent, recv;
    int64_t hashed; /* 1: this rank hashes (opts.verify) */
} vote_t;

typedef struct {
    const nrs_emu_graph_t *g;
    const nrs_xport_t *x;
    nrs_rdv_t *r;
    const nrs_dtrans_opts_t *o;
    nrs_dtrans_result_t *res;
    nrs_xmem_t *mem;
    unsigned char *live;
    int32_t *reads, *writes; /* transfers in flight reading / writing a buffer */
    int32_t *need, *got;     /* writes into a buffer: in the graph / completed here */
    flight_t *fl;
    int window, nfl;
    double stall_end;
    int failed;
    uint64_t sum_sent, sum_recv; /* opts.verify: since the last vote */
    int64_t nrecv;               /* transfers received here */
    int corrupt;                 /* the sums differed after the point of no return */
    int past_ponr;               /* running the ops from the PONR on */
    unsigned char *late;         /* [nbuf] written by a transfer past the PONR (verify) */
    /* The answers of the run's votes and of its settle, had with the run's
     * memory: past its first vote no collective of the run allocates, so
     * none can be left out for want of memory (a rank that left one out
     * paired its next collective with the others' vote, PMIx fences match
     * by who takes part). NULL: the run could not have them; its first
     * vote is then cast without reading the answer (vote). */
    void *vall;             /* [nranks + 1] vote_t, or int32_t for settle */
    unsigned char *vgot;    /* [nranks + 1] */
} dt_t;

static void fail(dt_t *D, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(dt_t *D, const char *fmt, ...)
{
    va_list ap;
    if (D->failed++)
        return;
    va_start(ap, fmt);
    vsnprintf(D->res->msg, sizeof D->res->msg, fmt, ap);
    va_end(ap);
}

void nrs_dtrans_opts_init(nrs_dtrans_opts_t *o, int me, int nranks)
{
    memset(o, 0, sizeof(*o));
    o->me = me;
    o->nranks = nranks;
    o->window = 32;
    o->timeout_s = 30;
    o->kill_after = -1;
    o->kill_census = -1;
    o->corrupt_recv = -1;
}

/* The test hook: this rank's memory at point `at` cannot be had. */
static bool nomem(const nrs_dtrans_opts_t *o, const char *at)
{
    return o->nomem && !strcmp(o->nomem, at);
}

int nrs_dtrans_buf_rank(const nrs_emu_graph_t *g, const nrs_dtrans_opts_t *o, int32_t id)
{
    const nrs_emu_gbuf_t *b = &g->buf[id];
    int gpu = b->b.gpu >= 0 ? b->b.gpu : b->via;
    if (gpu < 0)
        return -1;
    int rank = o->owner_rank ? o->owner_rank(o->owner_arg, gpu) : gpu;
    return rank >= 0 && rank < o->nranks ? rank : -1;
}

static int rank_of(const dt_t *D, int32_t id)
{
    return nrs_dtrans_buf_rank(D->g, D->o, id);
}

static int is_out(const dt_t *D, int rank)
{
    for (int i = 0; i < D->o->nout; i++)
        if (D->o->out_ranks[i] == rank)
            return 1;
    return 0;
}

static int peer_dead(const dt_t *D, int i);

static int first_dead(const dt_t *D)
{
    for (int i = 0; i < D->o->nranks; i++)
        if (i != D->o->me && !is_out(D, i) && peer_dead(D, i))
            return i;
    return -1;
}

/* ---- the test hook: die here ------------------------------------------------------- */

static void die_now(const dt_t *D)
{
    const char *f = getenv("NRS_MP_KILL_STAMP"); /* when, for the survivors' latency */
    if (f) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        FILE *fp = fopen(f, "w");
        if (fp) {
            fprintf(fp, "%.6f\n", (double)ts.tv_sec + ts.tv_nsec * 1e-9);
            fclose(fp);
        }
    }
    fprintf(stderr, "nereus: dtrans[%d]: test hook: SIGKILL myself at op %lld of %lld\n",
            D->o->me, (long long)D->res->ops_done, (long long)D->res->my_ops);
    raise(SIGKILL);
}

/* ---- verification (opts.verify) ------------------------------------------------------- */

static uint64_t mix64(uint64_t x) /* splitmix64's finalizer */
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

/* Op i's contribution to a sum: its bytes' hash, row by row, bound to i (the
 * same on both sides: rows and row_bytes are the op's, pitches may differ). */
static uint64_t region_hash(dt_t *D, const nrs_xregion_t *r, int64_t i)
{
    const uint8_t *p = (const uint8_t *)r->mem->ptr + r->off;
    uint64_t h = mix64((uint64_t)i + 0x9e3779b97f4a7c15ULL);
    for (size_t k = 0; k < r->rows; k++)
        h = mix64(h ^ nrs_emu_checksum(p + k * r->pitch, r->row_bytes));
    D->res->bytes_verified += (int64_t)(r->rows * r->row_bytes);
    return h;
}

/* ---- progress ------------------------------------------------------------------------ */

static void harvest(dt_t *D)
{
    for (int k = 0; k < D->window; k++) {
        flight_t *f = &D->fl[k];
        if (!f->used || !f->rs.done || !f->rr.done)
            continue;
        if (f->src >= 0)
            D->reads[f->src]--;
        if (f->dst >= 0) {
            D->writes[f->dst]--;
            D->got[f->dst]++;
            if (D->nrecv++ == D->o->corrupt_recv && f->dreg.rows && f->dreg.row_bytes)
                ((uint8_t *)f->dreg.mem->ptr)[f->dreg.off] ^= 0x5a; /* the test hook */
            if (D->o->verify)
                D->sum_recv += region_hash(D, &f->dreg, f->op);
            if (D->past_ponr && D->late)
                D->late[f->dst] = 1;
        }
        f->used = 0;
        D->nfl--;
        D->stall_end = nrs_awake_s() + D->o->timeout_s;
    }
}

/* One round of progress and failure checks: 0, or -1 once failed. */
static int step(dt_t *D)
{
    if (D->failed)
        return -1;
    int n = D->x->ops->progress(D->x->ctx);
    if (n < 0) {
        int dead = first_dead(D);
        D->res->failed_rank = dead;
        const char *why = D->o->xport_error ? D->o->xport_error(D->x) : D->x->ops->name;
        if (dead >= 0)
            fail(D, "rank %d died (op %lld of this rank's %lld): %s", dead,
                 (long long)D->res->ops_done, (long long)D->res->my_ops, why);
        else
            fail(D, "transport error at op %lld: %s", (long long)D->res->ops_done, why);
        return -1;
    }
    harvest(D);
    int dead = first_dead(D);
    if (dead >= 0) {
        D->res->failed_rank = dead;
        fail(D, "rank %d died (op %lld of this rank's %lld)", dead, (long long)D->res->ops_done,
             (long long)D->res->my_ops);
        return -1;
    }
    /* awake time: a rank stopped with its job (Slurm's suspend) has not
     * waited for its peers meanwhile (util.h) */
    if (D->nfl && nrs_awake_s() > D->stall_end) {
        fail(D, "no transfer completed for %.1f s (%d in flight, op %lld)", D->o->timeout_s,
             D->nfl, (long long)D->res->ops_done);
        return -1;
    }
    if (!n)
        nrs_nap_us(20);
    return 0;
}

static int wait_reads(dt_t *D, int32_t id) /* no transfer in flight touches id */
{
    while (D->reads[id] || D->writes[id])
        if (step(D))
            return -1;
    return 0;
}

static int wait_writes(dt_t *D, int32_t id) /* id's contents are final */
{
    while (D->writes[id])
        if (step(D))
            return -1;
    return 0;
}

static int wait_slot(dt_t *D)
{
    while (D->nfl >= D->window)
        if (step(D))
            return -1;
    return 0;
}

static int drain(dt_t *D)
{
    while (D->nfl)
        if (step(D))
            return -1;
    return 0;
}

/* ---- ops ----------------------------------------------------------------------------- */

static int alloc_buf(dt_t *D, int32_t id)
{
    const nrs_emu_buf_t *b = &D->g->buf[id].b;
    if (D->live[id]) {
        fail(D, "buffer %d allocated twice", id);
        return -1;
    }
    if (D->x->ops->mem_alloc(D->x->ctx, b->gpu, (size_t)b->bytes, &D->mem[id])) {
        fail(D, "allocation of %lld bytes for buffer %d failed", (long long)b->bytes, id);
        return -1;
    }
    D->live[id] = 1;
    if (b->kind == NRS_EMU_GRAD) { /* grads start at zero: transitions are at step boundaries */
        if (!D->x->ops->mem_zero)
            memset(D->mem[id].ptr, 0, (size_t)b->bytes);
        else if (D->x->ops->mem_zero(D->x->ctx, &D->mem[id])) {
            fail(D, "zeroing buffer %d failed", id);
            return -1;
        }
    }
    return 0;
}

static void region(dt_t *D, int32_t id, int64_t off, int64_t pitch, const nrs_emu_op_t *op,
                   nrs_xregion_t *out)
{
    *out = (nrs_xregion_t){&D->mem[id], (size_t)off, (size_t)pitch, (size_t)op->rows,
                           (size_t)op->row_bytes};
}

static int do_copy(dt_t *D, const nrs_emu_op_t *op, int64_t i)
{
    nrs_xregion_t s, d;
    if (rank_of(D, op->dst_buf) != D->o->me) {
        fail(D, "op %lld: local copy to another rank", (long long)i);
        return -1;
    }
    if (op->type == NRS_EMU_OP_STAGE && alloc_buf(D, op->dst_buf))
        return -1;
    if (!D->live[op->src_buf] || !D->live[op->dst_buf]) {
        fail(D, "op %lld: copy between buffers not allocated", (long long)i);
        return -1;
    }
    if (wait_writes(D, op->src_buf))
        return -1;
    region(D, op->src_buf, op->src_off, op->src_pitch, op, &s);
    region(D, op->dst_buf, op->dst_off, op->dst_pitch, op, &d);
    if (D->x->ops->copy(D->x->ctx, &d, &s)) {
        fail(D, "op %lld: copy out of bounds", (long long)i);
        return -1;
    }
    D->got[op->dst_buf]++;
    return 0;
}

static uint64_t run_bits(const nrs_dtrans_opts_t *o)
{
    return (o->sync_tags ? 0x80u : 0u) | (o->attempt & 0x7fu);
}

static int do_xfer(dt_t *D, const nrs_emu_op_t *op, int64_t i)
{
    int me = D->o->me, s = rank_of(D, op->src_buf), d = rank_of(D, op->dst_buf);
    uint64_t tag = (run_bits(D->o) << DT_TAG_OP_BITS) | (uint64_t)i;
    if ((s == me && !D->live[op->src_buf]) || (d == me && !D->live[op->dst_buf])) {
        fail(D, "op %lld: transfer of a buffer not allocated", (long long)i);
        return -1;
    }
    if (wait_slot(D) || (s == me && wait_writes(D, op->src_buf)))
        return -1;
    int k = 0;
    while (D->fl[k].used)
        k++;
    flight_t *f = &D->fl[k];
    *f = (flight_t){.used = 1, .op = i, .src = -1, .dst = -1, .rs = {1, 0}, .rr = {1, 0}};
    nrs_xregion_t sr, dr;
    if (d == me) {
        region(D, op->dst_buf, op->dst_off, op->dst_pitch, op, &dr);
        f->dst = op->dst_buf;
        f->dreg = dr;
        D->writes[op->dst_buf]++;
        /* the sender's GPU: host staging memory is sent by the GPU it was
         * staged from (its op->src_gpu is -1 - node, which no rank owns) */
        const nrs_emu_gbuf_t *sb = &D->g->buf[op->src_buf];
        if (D->x->ops->recv(D->x->ctx, sb->b.gpu >= 0 ? sb->b.gpu : sb->via, &dr, tag, &f->rr))
            goto post_failed;
    }
    if (s == me) {
        region(D, op->src_buf, op->src_off, op->src_pitch, op, &sr);
        f->src = op->src_buf;
        if (D->o->verify)
            D->sum_sent += region_hash(D, &sr, i);
        D->reads[op->src_buf]++;
        if (D->x->ops->send(D->x->ctx, op->dst_gpu, &sr, tag, &f->rs))
            goto post_failed;
        D->res->bytes_sent += (int64_t)op->rows * op->row_bytes;
    }
    if (d == me)
        D->res->bytes_recv += (int64_t)op->rows * op->row_bytes;
    if (D->nfl++ == 0)
        D->stall_end = nrs_awake_s() + D->o->timeout_s;
    if (D->nfl > D->res->max_inflight)
        D->res->max_inflight = D->nfl;
    D->res->xfers++;
    return 0;
post_failed:
    D->nfl++; /* the slot stays: the transport may hold one side */
    fail(D, "op %lld: posting the transfer (rank %d -> %d) failed", (long long)i, s, d);
    return -1;
}

static int do_op(dt_t *D, int64_t i)
{
    const nrs_emu_op_t *op = &D->g->ops[i];
    int me = D->o->me;
    switch (op->type) {
    case NRS_EMU_OP_ALLOC:
        return rank_of(D, op->dst_buf) == me ? alloc_buf(D, op->dst_buf) : 0;
    case NRS_EMU_OP_FREE:
        if (rank_of(D, op->src_buf) != me)
            return 0;
        if (!D->live[op->src_buf]) {
            fail(D, "op %lld: free of buffer %d not allocated", (long long)i, op->src_buf);
            return -1;
        }
        if (wait_reads(D, op->src_buf))
            return -1;
        D->x->ops->mem_free(D->x->ctx, &D->mem[op->src_buf]);
        D->live[op->src_buf] = 0;
        return 0;
    case NRS_EMU_OP_COPY:
    case NRS_EMU_OP_STAGE:
        return rank_of(D, op->src_buf) == me ? do_copy(D, op, i) : 0;
    case NRS_EMU_OP_XFER:
        return do_xfer(D, op, i);
    default:
        return 0; /* communicator set-up: host transports need none */
    }
}

static int mine(const dt_t *D, const nrs_emu_op_t *op)
{
    int me = D->o->me;
    switch (op->type) {
    case NRS_EMU_OP_ALLOC: return rank_of(D, op->dst_buf) == me;
    case NRS_EMU_OP_FREE:
    case NRS_EMU_OP_COPY:
    case NRS_EMU_OP_STAGE: return rank_of(D, op->src_buf) == me;
    case NRS_EMU_OP_XFER: return rank_of(D, op->src_buf) == me || rank_of(D, op->dst_buf) == me;
    default: return 0;
    }
}

/* Run my ops of [from, to): 0, or -1 (D->failed). */
static int run_range(dt_t *D, int64_t from, int64_t to)
{
    for (int64_t i = from; i < to; i++) {
        if (!mine(D, &D->g->ops[i]))
            continue;
        if (D->o->kill_after >= 0 && D->res->ops_done == D->o->kill_after)
            die_now(D);
        if (do_op(D, i))
            return -1;
        D->res->ops_done++;
        if (D->nfl && step(D)) /* keep transfers moving while posting */
            return -1;
    }
    return drain(D);
}

/* ---- votes --------------------------------------------------------------------------- */

/* all NULL (got too): this rank only contributes, it cannot read the answer
 * (no memory for it), so that the collective pairs up on every rank all the
 * same (opts.gather's contract). */
static int gather(dt_t *D, uint64_t epoch, const char *name, const void *mine, size_t len,
                  void *all, unsigned char *got, char *err, size_t errlen)
{
    const nrs_dtrans_opts_t *o = D->o;
    if (o->gather)
        return o->gather(o->gather_arg, epoch, name, mine, len, o->out_ranks, o->nout, all, got,
                         o->timeout_s, err, errlen);
    if (!all)
        return nrs_rdv_gather_post(D->r, epoch, name, mine, len, o->out_ranks, o->nout,
                                   o->timeout_s, err, errlen);
    return nrs_rdv_gather(D->r, epoch, name, mine, len, o->out_ranks, o->nout, all, got,
                          o->timeout_s, err, errlen);
}

static int peer_dead(const dt_t *D, int i)
{
    return (D->r && nrs_rdv_peer_failed(D->r, i)) ||
           (D->o->peer_failed && D->o->peer_failed(D->o->peer_arg, i));
}

/* Every survivor contributes val under (epoch, name) (the gather), with the
 * sums of what it sent and received since the last vote (opts.verify). 0
 * when every rank's value came and equals want (want NULL: any value != 0
 * is a no) and the sums agree; -1 with res->msg naming the first rank
 * missing or saying no, or the mismatch (D->corrupt is set when the sums
 * differ: the same on every rank, they all see the same sums). Without the
 * run's vote memory (D->vall) this rank still votes, a no, and does not
 * read the answer: every rank aborts there alike. */
static int vote(dt_t *D, uint64_t epoch, const char *what, int64_t val, const int64_t *want)
{
    char name[48], err[384];
    int n = D->o->nranks;
    vote_t *all = D->vall, v = {val, D->sum_sent, D->sum_recv, D->o->verify};
    int hashed = D->o->verify;
    unsigned char *got = D->vgot;
    uint64_t sent = v.sent, recv = v.recv;
    D->sum_sent = D->sum_recv = 0;
    snprintf(name, sizeof name, "dt%u.%s", D->o->attempt, what);
    if (!all) {
        v.val = want ? (int64_t)((uint64_t)*want ^ 1) : 1;
        if (gather(D, epoch, name, &v, sizeof v, NULL, NULL, err, sizeof err))
            snprintf(D->res->msg, sizeof D->res->msg, "%s vote: out of memory; %s", what, err);
        else
            snprintf(D->res->msg, sizeof D->res->msg, "%s vote: out of memory: this rank voted "
                     "no", what);
        return -1;
    }
    if (gather(D, epoch, name, &v, sizeof v, all, got, err, sizeof err)) {
        snprintf(D->res->msg, sizeof D->res->msg, "%s vote: %s", what, err);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        if (i == D->o->me || is_out(D, i))
            continue;
        /* what the gather brought decides, never what this rank alone knows:
         * a rank that voted and died since voted (its death fails what comes
         * next, on every rank); with PMIx's local knowledge some survivors
         * aborted before the PONR while the others went past it (the PMIx
         * gather's got[] is what PMIx holds: nrs_rdv_gather_read) */
        if (!got[i]) {
            if (D->res->failed_rank < 0)
                D->res->failed_rank = i;
            snprintf(D->res->msg, sizeof D->res->msg, "%s vote: rank %d did not vote (dead)",
                     what, i);
            return -1;
        }
        if (want ? all[i].val != *want : all[i].val != 0) {
            snprintf(D->res->msg, sizeof D->res->msg, "%s vote: rank %d says no (%lld)", what, i,
                     (long long)all[i].val);
            return -1;
        }
        sent += all[i].sent;
        recv += all[i].recv;
        hashed &= all[i].hashed == 1; /* the sums mean something only if every rank hashed */
    }
    if (want && val != *want)
        return -1;
    if (hashed && sent != recv) {
        D->corrupt = 1;
        snprintf(D->res->msg, sizeof D->res->msg, "%s vote: checksum mismatch: the bytes "
                 "received differ from the bytes sent (runtime.verify)", what);
        return -1;
    }
    return 0;
}

/* The decisions at_ponr brought (0 commit, 1 undecided, else abort), shared:
 * an undecided rank takes the commit when some rank got it. A rank that got
 * the commit goes on whatever the gather says (the decider decided); one
 * that got an abort aborts. Its decision, why[] saying how it was reached.
 * all[nranks + 1] and got[nranks + 1]: the answer's memory, had before the
 * point of no return (an undecided rank that could not read the others
 * would abort while they commit). */
static int settle(dt_t *D, uint64_t epoch, int mine, int32_t *all, unsigned char *got, char *why,
                  size_t whylen)
{
    char name[48], err[384] = "";
    int n = D->o->nranks, from = -1;
    int32_t v = mine == 0 ? 0 : mine == 1 ? 1 : 2;
    snprintf(name, sizeof name, "dt%u.settle", D->o->attempt);
    if (!gather(D, epoch, name, &v, sizeof v, all, got, err, sizeof err)) {
        for (int i = 0; i < n && from < 0; i++)
            if (i != D->o->me && got[i] && !is_out(D, i) && all[i] == 0)
                from = i;
    } else if (mine == 1) {
        size_t l = strlen(why);
        snprintf(why + l, whylen - l, "; no word from the others either: %.200s", err);
    }
    if (mine != 1)
        return mine;
    if (from < 0) {
        size_t l = strlen(why);
        if (!err[0])
            snprintf(why + l, whylen - l, "; no other rank got the commit");
        return 1;
    }
    snprintf(why, whylen, "rank %d got the commit: committed with it", from);
    return 0;
}

int nrs_dtrans_settle(const nrs_dtrans_opts_t *o, nrs_rdv_t *r, uint64_t epoch, int mine,
                      void *buf, char *why, size_t whylen)
{
    dt_t D = {.o = o, .r = r};
    int32_t *all = buf;
    return settle(&D, epoch, mine, all, (unsigned char *)(all + o->nranks + 1), why, whylen);
}

/* ---- past the point of no return: who holds what ---------------------------------- */

static int census_owner(const void *arg, int32_t id)
{
    return rank_of(arg, id);
}

/* The census's gather; with the kill_census test hook (PMIx gathers only),
 * that rank dies once its part is in and the others read once told of it. */
static int census_gather(dt_t *D, uint64_t epoch, const char *name, const void *mine,
                         size_t len, void *every, unsigned char *got, char *err, size_t errlen)
{
    const nrs_dtrans_opts_t *o = D->o;
    int k = o->kill_census;
    if (k < 0 || k >= o->nranks || o->gather || !D->r)
        return gather(D, epoch, name, mine, len, every, got, err, errlen);
    if (nrs_rdv_gather_post(D->r, epoch, name, mine, len, o->out_ranks, o->nout, o->timeout_s,
                            err, errlen))
        return -1;
    if (o->me == k)
        die_now(D);
    for (int i = 0; i < 1000 && !peer_dead(D, k); i++)
        nrs_nap_us(10000);
    return nrs_rdv_gather_read(D->r, epoch, name, mine, len, o->out_ranks, o->nout, every, got,
                               err, errlen);
}

/* Whether every survivor can take the census (it had the memory for it): the
 * first rank that cannot, -1 when all can. Every survivor says so first in a
 * gather of its own, with the run's vote memory (had since the run began):
 * a rank that left the census out paired its next collective with the
 * others' census, and one that could not classify what it gathered held a
 * census of its own. What the gather brought decides, as in a vote. */
static int census_ready(dt_t *D, uint64_t epoch, bool ok)
{
    char name[48], err[384];
    vote_t v = {ok ? 0 : 1, 0, 0, 0}, *all = D->vall;
    snprintf(name, sizeof name, "dt%u.cready", D->o->attempt);
    if (gather(D, epoch, name, &v, sizeof v, all, D->vgot, err, sizeof err))
        return ok ? -1 : D->o->me; /* no answer: this rank's own word */
    for (int i = 0; i < D->o->nranks; i++)
        if (i == D->o->me ? !ok : D->vgot[i] && !is_out(D, i) && all[i].val)
            return i;
    return -1;
}

/* No census (rank who could not take it): every new buffer counts as lost,
 * on every rank alike (what that rank holds is known nowhere else). */
static void no_census(dt_t *D, int who)
{
    const nrs_emu_graph_t *g = D->g;
    nrs_dtrans_result_t *res = D->res;
    if (D->o->present_out)
        memset(D->o->present_out, 0, (size_t)g->nnew);
    res->present = res->rebuildable = 0;
    res->lost = g->nnew;
    size_t l = strlen(res->msg);
    snprintf(res->msg + l, sizeof res->msg - l, "; past the point of no return: no census, "
             "rank %d could not take it (out of memory): all %lld new buffer(s) count as lost: "
             "checkpoint needed", who, (long long)res->lost);
}

/* Every survivor contributes a bit per buffer it owns (1 = held here,
 * complete) in the gather, and each computes the same census of the new
 * state (census.h). All the memory first: a survivor without it says so
 * (census_ready) and no rank takes the census. */
static void census(dt_t *D, uint64_t epoch)
{
    const nrs_emu_graph_t *g = D->g;
    nrs_dtrans_result_t *res = D->res;
    int n = D->o->nranks, me = D->o->me;
    nrs_census_t c;
    nrs_census_count_t cnt;
    nrs_census_work_t *wk = NULL;
    unsigned char *held = NULL, *mine = NULL, *all = NULL, *every = NULL, *got = NULL;
    char name[48], err[384], lostmsg[256] = "";
    size_t len = 1;

    memset(&c, 0, sizeof c);
    if (!nomem(D->o, "census") && !nrs_census_init(&c, g, n, census_owner, D)) {
        len = c.len ? c.len : 1; /* a gather carries at least a byte */
        held = calloc(g->nbuf + 1, 1);
        all = calloc(g->nbuf + 1, 1);
        mine = calloc(len, 1);
        every = calloc((size_t)n * len + 1, 1);
        got = calloc((size_t)n + 1, 1);
        wk = nrs_census_work_new(g);
    }
    int who = census_ready(D, epoch, held && all && mine && every && got && wk);
    if (who >= 0) {
        no_census(D, who);
        goto out;
    }
    for (size_t i = 0; i < g->nbuf; i++) /* corrupt: what a transfer wrote since is suspect */
        held[i] = D->live[i] && D->writes[i] == 0 && D->got[i] >= D->need[i] &&
                  !(D->corrupt && D->late && D->late[i]);
    nrs_census_pack(&c, me, held, mine);
    snprintf(name, sizeof name, "dt%u.census", D->o->attempt);
    if (census_gather(D, epoch, name, mine, len, every, got, err, sizeof err)) {
        memset(got, 0, (size_t)n); /* only what this rank holds is known */
        memcpy(every + (size_t)me * len, mine, len);
        got[me] = 1;
    }
    /* what the gather brought, the same on every rank: a rank that contributed
     * and died since counts (its GPUs are lost in the next epoch anyway); this
     * rank's own view of deaths made censuses differ, and the recovery's graph
     * hash vote then failed */
    for (int i = 0; i < n; i++)
        if (got[i] && (i == me || !is_out(D, i)))
            nrs_census_unpack(&c, i, every + (size_t)i * len, all);
    nrs_census_classify_in(wk, g, all, D->o->present_out, &cnt);
    res->present = cnt.present;
    res->rebuildable = cnt.rebuildable;
    res->lost = cnt.lost;
    for (int k = 0; k < 3 && cnt.first_lost[k] >= 0; k++) {
        const nrs_emu_buf_t *b = &g->buf[cnt.first_lost[k]].b;
        size_t l = strlen(lostmsg);
        snprintf(lostmsg + l, sizeof lostmsg - l, "%s%s t%d %s [%d,%d)x[%d,%d) on GPU %d",
                 l ? "; " : "", nrs_role_name((nrs_role_t)b->role), b->tensor,
                 nrs_emu_kind_name(b->kind), b->box.r0, b->box.r1, b->box.c0, b->box.c1, b->gpu);
    }
    size_t l = strlen(res->msg);
    snprintf(res->msg + l, sizeof res->msg - l,
             "; past the point of no return: new state %lld buffer(s) present, %lld "
             "rebuildable from survivors, %lld lost%s%s%s", (long long)res->present,
             (long long)res->rebuildable, (long long)res->lost, res->lost ? " (" : "", lostmsg,
             res->lost ? (res->lost > 3 ? ", ...): checkpoint needed" : "): checkpoint needed")
                       : ": a recover transition from the surviving state can rebuild it");
out:
    nrs_census_free(&c);
    nrs_census_work_free(wk);
    free(held);
    free(mine);
    free(all);
    free(every);
    free(got);
}

/* ---- the run -------------------------------------------------------------------------- */

/* A weight sync with nothing to do anywhere (the generation layout is the
 * training one: every generation buffer aliases its train buffer; at most the
 * communicator set-up the scheduler notes, which runs nothing here). Its
 * graph comes from the epoch's plan, the same on every rank, so every rank
 * skips the votes alike: three collectives a step saved. */
static bool no_vote(const nrs_emu_graph_t *g, const nrs_dtrans_opts_t *o)
{
    if (!o->sync_tags)
        return false;
    for (size_t i = 0; i < g->nops; i++)
        if (g->ops[i].type != NRS_EMU_OP_COMM)
            return false;
    return true;
}

/* This rank cannot run its part (opts.fail_local, or no memory for the run):
 * it still casts its vote in the run's first collective, the hash vote, as a
 * no, so that every rank aborts there with its old state intact. Leaving it
 * out paired this rank's next collective with the others' hash vote (PMIx
 * fences match by who takes part, not by key): they saw "did not vote
 * (dead)", it saw them gone, and their counters of runs parted. A weight
 * sync with nothing to move has no vote on any rank: nothing to take part in. */
static void vote_no(dt_t *D, uint64_t epoch, const char *why)
{
    const nrs_emu_graph_t *g = D->g;
    if (!no_vote(g, D->o)) {
        int64_t h = (int64_t)nrs_emu_graph_hash(g), no = (int64_t)((uint64_t)h ^ 1);
        vote(D, epoch, "hash", no, &h);
    }
    snprintf(D->res->msg, sizeof D->res->msg, "%s; this rank voted no: aborted before the point "
             "of no return on every rank, no op done here: old state intact", why);
}

static void abort_run(dt_t *D, nrs_xmem_t *new_mem)
{
    const nrs_emu_graph_t *g = D->g;
    if (D->o->cancel)
        D->o->cancel(D->o->cancel_arg);
    for (size_t i = (size_t)g->nold; i < g->nbuf; i++) /* new and host buffers only */
        if (D->live[i]) {
            D->x->ops->mem_free(D->x->ctx, &D->mem[i]);
            D->live[i] = 0;
        }
    memset(new_mem, 0, sizeof(*new_mem) * (size_t)g->nnew);
}

static void hand_over(dt_t *D, nrs_xmem_t *old_mem, nrs_xmem_t *new_mem)
{
    const nrs_emu_graph_t *g = D->g;
    for (int32_t j = g->nold; j < g->nold + g->nnew; j++) {
        int32_t c = nrs_emu_canon(g, j);
        new_mem[j - g->nold] = D->live[c] ? D->mem[c] : (nrs_xmem_t){0};
        if (D->live[c] && !(g->keep_old && c < g->nold))
            D->live[c] = 0; /* moved; a weight sync's kept old buffer stays old too (shared) */
    }
    for (int32_t i = 0; i < g->nold; i++)
        old_mem[i] = D->live[i] ? D->mem[i] : (nrs_xmem_t){0};
    for (size_t i = (size_t)g->nold; i < g->nbuf; i++) /* stray host buffers */
        if (D->live[i])
            D->x->ops->mem_free(D->x->ctx, &D->mem[i]);
}

int nrs_dtrans_run(const nrs_emu_graph_t *g, uint64_t epoch, const nrs_xport_t *x, nrs_rdv_t *r,
                   nrs_xmem_t *old_mem, nrs_xmem_t *new_mem, const nrs_dtrans_opts_t *o,
                   nrs_dtrans_result_t *res)
{
    dt_t D = {.g = g, .x = x, .r = r, .o = o, .res = res};
    double t0 = nrs_now_s(), t1;
    memset(res, 0, sizeof(*res));
    res->failed_rank = -1;
    res->ponr = g->ponr;
    D.window = o->window > 0 ? o->window : 32;
    D.mem = calloc(g->nbuf + 1, sizeof(*D.mem));
    D.live = calloc(g->nbuf + 1, 1);
    D.reads = calloc(g->nbuf + 1, sizeof(int32_t));
    D.writes = calloc(g->nbuf + 1, sizeof(int32_t));
    D.need = calloc(g->nbuf + 1, sizeof(int32_t));
    D.got = calloc(g->nbuf + 1, sizeof(int32_t));
    D.fl = calloc((size_t)D.window, sizeof(*D.fl));
    D.late = o->verify ? calloc(g->nbuf + 1, 1) : NULL;
    D.vall = nomem(o, "vote") ? NULL : calloc((size_t)o->nranks + 1, sizeof(vote_t));
    D.vgot = D.vall ? calloc((size_t)o->nranks + 1, 1) : NULL;
    if (!D.vgot) { /* both or neither: vote() reads no answer without them */
        free(D.vall);
        D.vall = NULL;
    }
    if (g->nops >> DT_TAG_OP_BITS) { /* the same graph everywhere: alike on every rank */
        snprintf(res->msg, sizeof res->msg, "graph too large");
        res->outcome = NRS_DT_ERROR;
        goto out;
    }
    if (!D.mem || !D.live || !D.reads || !D.writes || !D.need || !D.got || !D.fl || !D.vall ||
        o->fail_local) {
        vote_no(&D, epoch, o->fail_local ? "this rank failed before the run" : "out of memory");
        res->outcome = o->fail_local ? NRS_DT_ABORTED : NRS_DT_ERROR;
        if (new_mem)
            memset(new_mem, 0, sizeof(*new_mem) * (size_t)g->nnew);
        goto out;
    }
    for (int32_t i = 0; i < g->nold; i++)
        if (old_mem[i].ptr) {
            D.mem[i] = old_mem[i];
            D.live[i] = 1;
        }
    for (size_t i = 0; i < g->nops; i++) {
        const nrs_emu_op_t *op = &g->ops[i];
        if (op->type == NRS_EMU_OP_XFER || op->type == NRS_EMU_OP_COPY ||
            op->type == NRS_EMU_OP_STAGE)
            D.need[op->dst_buf]++;
        if (mine(&D, op))
            res->my_ops++;
    }
    if (no_vote(g, o)) {
        hand_over(&D, old_mem, new_mem);
        res->outcome = NRS_DT_COMMITTED;
        res->no_vote = true;
        snprintf(res->msg, sizeof res->msg, "nothing to move: no vote");
        goto out;
    }

    /* An aborted run's sends nobody received wait here under their tags; the
     * run 128 on would take them for its own. No peer sends this run's before
     * the hash vote below, which waits for this rank. */
    if (o->purge)
        o->purge(o->purge_arg, run_bits(o) << DT_TAG_OP_BITS, 0xffull << DT_TAG_OP_BITS);

    /* prepare: the same graph everywhere */
    int64_t h = (int64_t)nrs_emu_graph_hash(g);
    if (vote(&D, epoch, "hash", h, &h)) {
        res->outcome = NRS_DT_ABORTED;
        goto aborted;
    }
    t1 = nrs_now_s();
    res->prepare_s = t1 - t0;

    /* execute up to the point of no return, then vote */
    int rc = run_range(&D, 0, g->ponr);
    res->execute_s = nrs_now_s() - t1;
    t1 = nrs_now_s();
    char local[512];
    snprintf(local, sizeof local, "%s", res->msg);
    if (vote(&D, epoch, "ponr", rc ? 1 : 0, NULL) || rc) {
        if (rc) /* our own failure says more than the vote */
            snprintf(res->msg, sizeof res->msg, "%s", local);
        res->outcome = NRS_DT_ABORTED;
        goto aborted;
    }
    res->vote_s = nrs_now_s() - t1;
    if (o->at_ponr) {
        char why[400] = "";
        int d = o->at_ponr(o->ponr_arg, why, sizeof why);
        if (o->settle && !o->gather)
            d = settle(&D, epoch, d, D.vall, D.vgot, why, sizeof why);
        if (d) {
            snprintf(res->msg, sizeof res->msg, "at the point of no return: %s", why);
            res->outcome = NRS_DT_ABORTED;
            goto aborted;
        }
    }
    if (o->kill_after == -2)
        die_now(&D);

    /* commit: the rest, and everyone says it is done */
    t1 = nrs_now_s();
    D.past_ponr = 1;
    rc = run_range(&D, g->ponr, (int64_t)g->nops);
    snprintf(local, sizeof local, "%s", res->msg);
    if (vote(&D, epoch, "done", rc ? 1 : 0, NULL) || rc) {
        if (rc)
            snprintf(res->msg, sizeof res->msg, "%s", local);
        if (o->cancel)
            o->cancel(o->cancel_arg);
        D.nfl = 0;
        census(&D, epoch);
        res->outcome = NRS_DT_PARTIAL;
        hand_over(&D, old_mem, new_mem);
        goto out;
    }
    res->commit_s = nrs_now_s() - t1;
    hand_over(&D, old_mem, new_mem);
    res->outcome = NRS_DT_COMMITTED;
    snprintf(res->msg, sizeof res->msg, "committed epoch %llu: %lld op(s), %lld transfer(s), "
             "up to %lld in flight", (unsigned long long)epoch, (long long)res->ops_done,
             (long long)res->xfers, (long long)res->max_inflight);
    goto out;
aborted:
    abort_run(&D, new_mem);
    {
        size_t l = strlen(res->msg);
        snprintf(res->msg + l, sizeof res->msg - l, "; aborted before the point of no return "
                 "(op %lld of %lld done here): old state intact", (long long)res->ops_done,
                 (long long)res->my_ops);
    }
out:
    res->total_s = nrs_now_s() - t0;
    free(D.mem);
    free(D.live);
    free(D.reads);
    free(D.writes);
    free(D.need);
    free(D.got);
    free(D.fl);
    free(D.late);
    free(D.vall);
    free(D.vgot);
    return res->outcome;
}
