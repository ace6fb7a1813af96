/* mp_transition: one rank of a distributed transition, run under pmix_srv.
 *
 *   mp_transition [--seed N] [--count K] [--chunk BYTES] [--timeout S]
 *
 * Every rank draws the same K random (spec, old plan, new plan) triples from
 * the seed (reshards, dp up and down, migrations, pools moving), builds the
 * transition graph itself (DESIGN §2 rule 1: only the inputs are shared; the
 * ranks check by exchanging the graph's hash), and executes its own
 * operations over UCX through the executor's transport table: buffers of
 * physical GPU g live on rank g, host staging buffers on the rank of the GPU
 * they were staged from. Afterwards each rank verifies the checksum of every
 * shard it holds against the pattern (and, for weight syncs, the old state).
 *
 * The op loop follows the global schedule, each transfer completed before the
 * next: the earliest unfinished transfer always has both ranks at it, so the
 * loop is deadlock-free. (runtime/emu's in-process executor is the model;
 * this is its rank-filtered twin and belongs there once the worker API
 * drives transitions.)
 */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "emu/graph.h"
#include "emu/pattern.h"
#include "emu/testutil.h"
#include "emu/xport.h"
#include "rdv/rdv.h"
#include "xfer/ucx.h"
#include "xfer/xport_ucx.h"

typedef struct {
    const nrs_emu_graph_t *g;
    nrs_xport_t *x;
    nrs_ucx_t *u;
    int me, size, corrupt;
    double timeout;
    nrs_xmem_t *mem;
    unsigned char *live;
    unsigned char *scratch;
    int64_t xfers, bytes, verified, errors;
    char first[256];
} rx_t;

static void note(rx_t *E, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note(rx_t *E, const char *fmt, ...)
{
    va_list ap;
    E->errors++;
    if (E->first[0])
        return;
    va_start(ap, fmt);
    vsnprintf(E->first, sizeof E->first, fmt, ap);
    va_end(ap);
}

static bool probe(void *arg, int rank)
{
    return nrs_rdv_peer_failed(arg, rank);
}

static int identity(void *arg, int owner)
{
    (void)arg;
    return owner;
}

/* The rank holding buffer id: its GPU's, or for host staging the GPU it came from. */
static int rank_of(const rx_t *E, int32_t id)
{
    const nrs_emu_gbuf_t *b = &E->g->buf[id];
    int gpu = b->b.gpu >= 0 ? b->b.gpu : b->via;
    return gpu >= 0 && gpu < E->size ? gpu : -1;
}

static void rx_alloc(rx_t *E, int32_t id, int fill)
{
    const nrs_emu_buf_t *b = &E->g->buf[id].b;
    if (E->live[id]) {
        note(E, "buffer %d allocated twice", id);
        return;
    }
    if (E->x->ops->mem_alloc(E->x->ctx, b->gpu, (size_t)b->bytes, &E->mem[id])) {
        note(E, "alloc of %lld bytes failed", (long long)b->bytes);
        return;
    }
    E->live[id] = 1;
    if (fill)
        nrs_emu_pattern_fill(b, E->mem[id].ptr);
    else
        memset(E->mem[id].ptr, b->kind == NRS_EMU_GRAD ? 0 : 0xa5, (size_t)b->bytes);
}

static void rx_free(rx_t *E, int32_t id)
{
    if (!E->live[id]) {
        note(E, "buffer %d freed while not allocated", id);
        return;
    }
    E->x->ops->mem_free(E->x->ctx, &E->mem[id]);
    E->live[id] = 0;
}

static void regions(rx_t *E, const nrs_emu_op_t *op, nrs_xregion_t *src, nrs_xregion_t *dst)
{
    *src = (nrs_xregion_t){&E->mem[op->src_buf], (size_t)op->src_off, (size_t)op->src_pitch,
                           (size_t)op->rows, (size_t)op->row_bytes};
    *dst = (nrs_xregion_t){&E->mem[op->dst_buf], (size_t)op->dst_off, (size_t)op->dst_pitch,
                           (size_t)op->rows, (size_t)op->row_bytes};
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void rx_xfer(rx_t *E, const nrs_emu_op_t *op, size_t i)
{
    const nrs_xport_ops_t *X = E->x->ops;
    int s = rank_of(E, op->src_buf), d = rank_of(E, op->dst_buf);
    nrs_xregion_t src, dst;
    nrs_xreq_t rs = {1, 0}, rr = {1, 0};

    if (s != E->me && d != E->me)
        return;
    if ((s == E->me && !E->live[op->src_buf]) || (d == E->me && !E->live[op->dst_buf])) {
        note(E, "op %zu: buffer not allocated", i);
        return;
    }
    regions(E, op, &src, &dst);
    if ((d == E->me && X->recv(E->x->ctx, s, &dst, (uint64_t)i, &rr)) ||
        (s == E->me && X->send(E->x->ctx, d, &src, (uint64_t)i, &rs))) {
        note(E, "op %zu: post failed: %s", i, nrs_xport_ucx_error(E->x));
        return;
    }
    double end = now_s() + E->timeout;
    while (!(rs.done && rr.done) && now_s() < end)
        if (X->progress(E->x->ctx) < 0) {
            note(E, "op %zu: %s", i, nrs_xport_ucx_error(E->x));
            return;
        }
    if (!(rs.done && rr.done))
        note(E, "op %zu (rank %d -> %d): not done after %.0f s", i, s, d, E->timeout);
    E->xfers++;
    if (d == E->me && E->corrupt && op->rows > 0 && op->row_bytes > 0) { /* negative test */
        ((unsigned char *)dst.mem->ptr)[dst.off] ^= 0x5a;
        E->corrupt = 0;
    }
    if (s == E->me)
        E->bytes += (int64_t)op->rows * op->row_bytes;
}

static void rx_op(rx_t *E, const nrs_emu_op_t *op, size_t i)
{
    nrs_xregion_t src, dst;
    switch (op->type) {
    case NRS_EMU_OP_ALLOC:
        if (rank_of(E, op->dst_buf) == E->me)
            rx_alloc(E, op->dst_buf, 0);
        break;
    case NRS_EMU_OP_FREE:
        if (rank_of(E, op->src_buf) == E->me)
            rx_free(E, op->src_buf);
        break;
    case NRS_EMU_OP_STAGE:
    case NRS_EMU_OP_COPY:
        if (rank_of(E, op->src_buf) != E->me)
            break;
        if (rank_of(E, op->dst_buf) != E->me) {
            note(E, "op %zu: local copy across ranks", i);
            break;
        }
        if (op->type == NRS_EMU_OP_STAGE)
            rx_alloc(E, op->dst_buf, 0);
        if (!E->live[op->src_buf] || !E->live[op->dst_buf]) {
            note(E, "op %zu: buffer not allocated", i);
            break;
        }
        regions(E, op, &src, &dst);
        if (E->x->ops->copy(E->x->ctx, &dst, &src))
            note(E, "op %zu: copy out of bounds", i);
        break;
    case NRS_EMU_OP_XFER: rx_xfer(E, op, i); break;
    default: break; /* communicators: UCX needs none */
    }
}

static void check(rx_t *E, int32_t id, const nrs_emu_buf_t *want)
{
    E->verified++;
    if (!E->live[id]) {
        note(E, "shard %d missing", id);
        return;
    }
    if (nrs_emu_checksum(E->mem[id].ptr, (size_t)want->bytes) !=
        nrs_emu_pattern_checksum(want, E->scratch))
        note(E, "GPU %d shard %d: checksum mismatch", want->gpu, id);
}

static void verify(rx_t *E)
{
    const nrs_emu_graph_t *g = E->g;
    unsigned char *expect = calloc(g->nbuf + 1, 1);
    if (!expect) {
        note(E, "out of memory");
        return;
    }
    for (int32_t j = g->nold; j < g->nold + g->nnew; j++) {
        int32_t c = nrs_emu_canon(g, j);
        expect[c] = 1;
        if (rank_of(E, c) == E->me)
            check(E, c, &g->buf[j].b);
    }
    for (int32_t i = 0; g->keep_old && i < g->nold; i++)
        if (!g->buf[i].lost && !expect[i]) {
            expect[i] = 1;
            if (rank_of(E, i) == E->me)
                check(E, i, &g->buf[i].b);
        }
    for (size_t i = 0; i < g->nbuf; i++)
        if (E->live[i] && !expect[i])
            note(E, "buffer %zu still allocated after the transition", i);
    free(expect);
}

static int execute(const nrs_emu_graph_t *g, nrs_xport_t *x, nrs_ucx_t *u, int me, int size,
                   double timeout, rx_t *E)
{
    int64_t maxb = 1;
    memset(E, 0, sizeof(*E));
    *E = (rx_t){.g = g, .x = x, .u = u, .me = me, .size = size, .timeout = timeout,
                .corrupt = getenv("NRS_MP_CORRUPT") && atoi(getenv("NRS_MP_CORRUPT")) == me};
    for (size_t i = 0; i < g->nbuf; i++)
        if (g->buf[i].b.bytes > maxb)
            maxb = g->buf[i].b.bytes;
    E->mem = calloc(g->nbuf + 1, sizeof(*E->mem));
    E->live = calloc(g->nbuf + 1, 1);
    E->scratch = malloc((size_t)maxb);
    if (!E->mem || !E->live || !E->scratch) {
        note(E, "out of memory");
        goto out;
    }
    for (int32_t i = 0; i < g->nold; i++)
        if (!g->buf[i].lost && rank_of(E, i) == me)
            rx_alloc(E, i, 1);
    for (size_t i = 0; i < g->nops && !E->errors; i++)
        rx_op(E, &g->ops[i], i);
    if (!E->errors)
        verify(E);
out:
    for (size_t i = 0; E->live && i < g->nbuf; i++)
        if (E->live[i])
            rx_free(E, (int32_t)i);
    free(E->mem);
    free(E->live);
    free(E->scratch);
    return E->errors ? -1 : 0;
}

/* Same draw on every rank: a spec whose nodes divide the ranks, two plans. */
static void draw(tu_rng_t *rng, int n, nrs_spec_t *s, nrs_plan_t *a, nrs_plan_t *b)
{
    tu_spec(s, rng);
    int gpn = s->cluster.gpus_per_node;
    while (gpn > n)
        gpn /= 2;
    s->cluster.gpus_per_node = gpn;
    int na = tu_int(rng, 1, n / gpn), nb = tu_int(rng, 1, n / gpn);
    tu_plan(s, rng, na * gpn, a);
    tu_plan(s, rng, nb * gpn, b);
}

int main(int argc, char **argv)
{
    uint64_t seed = 1;
    int count = 6, rc = 1;
    double timeout = 20;
    char err[512];
    nrs_ucx_opts_t uo;
    nrs_emu_opts_t eo;
    nrs_rdv_t *r = NULL;
    nrs_ucx_t *u = NULL;
    nrs_xport_t x = {0};
    void **addrs = NULL;
    size_t *lens = NULL;

    nrs_ucx_opts_init(&uo);
    uo.chunk_bytes = 64 << 10;
    nrs_emu_opts_init(&eo);
    eo.chunk_bytes = 16 << 10;
    for (int i = 1; i + 1 < argc; i++) {
        if (!strcmp(argv[i], "--seed"))
            seed = strtoull(argv[++i], NULL, 0);
        else if (!strcmp(argv[i], "--count"))
            count = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--chunk"))
            eo.chunk_bytes = strtoll(argv[++i], NULL, 0);
        else if (!strcmp(argv[i], "--timeout"))
            timeout = atof(argv[++i]);
    }
    if (nrs_rdv_init(&r, err, sizeof err)) {
        fprintf(stderr, "mp_transition: %s\n", err);
        return 1;
    }
    int me = nrs_rdv_rank(r), n = nrs_rdv_size(r);
    const void *addr;
    size_t alen;
    if (nrs_ucx_init(&u, me, n, &uo, err, sizeof err))
        goto fail;
    nrs_rdv_set_progress(r, nrs_ucx_progress, u);
    nrs_ucx_set_probe(u, probe, r);
    nrs_ucx_address(u, &addr, &alen);
    if (nrs_rdv_allgather(r, 0, "ucx", addr, alen, &addrs, &lens, timeout, err, sizeof err) ||
        nrs_ucx_connect(u, addrs, lens, err, sizeof err))
        goto fail;
    if (nrs_xport_ucx_open(&x, u, identity, NULL)) {
        snprintf(err, sizeof err, "out of memory");
        goto fail;
    }
    tu_rng_t rng = {seed * 0x9e3779b97f4a7c15ull + 1};
    int64_t tot_x = 0, tot_b = 0, tot_v = 0;
    rc = 0;
    for (int t = 1; t <= count && !rc; t++) {
        nrs_spec_t s;
        nrs_plan_t a, b;
        nrs_emu_graph_t *g = NULL;
        draw(&rng, n, &s, &a, &b);
        int grc = nrs_emu_transition(&s, &a, &b, &eo, &g, err, sizeof err);
        if (grc) {
            fprintf(stderr, "mp_transition[%d]: transition %d: graph: %s\n", me, t, err);
            nrs_emu_graph_free(g);
            rc = 1;
            break;
        }
        nrs_emu_stats_t st;
        nrs_emu_graph_stats(g, &st);
        void **hs;
        size_t *hl;
        if (nrs_rdv_allgather(r, (uint64_t)t, "graph", &st.hash, sizeof st.hash, &hs, &hl, timeout,
                              err, sizeof err)) {
            nrs_emu_graph_free(g);
            goto fail;
        }
        for (int i = 0; i < n; i++)
            if (hl[i] != sizeof st.hash || memcmp(hs[i], &st.hash, sizeof st.hash)) {
                fprintf(stderr, "mp_transition[%d]: transition %d: rank %d built another graph\n",
                        me, t, i);
                rc = 1;
            }
        nrs_rdv_free_blobs(r, hs, hl);
        rx_t E;
        if (!rc && execute(g, &x, u, me, n, timeout, &E)) {
            fprintf(stderr, "mp_transition[%d]: transition %d (%d -> %d GPUs, %lld ops): %lld "
                    "error(s), first: %s\n", me, t, a.total_gpus, b.total_gpus,
                    (long long)g->nops, (long long)E.errors, E.first);
            rc = 1;
        }
        if (!rc && me == 0)
            printf("mp_transition: transition %d: %d -> %d GPUs, %lld ops, graph %016llx: rank 0 "
                   "ran %lld transfer(s), verified %lld shard(s)\n", t, a.total_gpus, b.total_gpus,
                   (long long)g->nops, (unsigned long long)st.hash, (long long)E.xfers,
                   (long long)E.verified);
        tot_x += rc ? 0 : E.xfers;
        tot_b += rc ? 0 : E.bytes;
        tot_v += rc ? 0 : E.verified;
        nrs_emu_graph_free(g);
        /* the next transition starts only when every rank is done with this one */
        if (nrs_rdv_fence(r, (uint64_t)t, NULL, timeout, err, sizeof err)) {
            fprintf(stderr, "mp_transition[%d]: %s\n", me, err);
            rc = 1;
        }
    }
    if (!rc)
        printf("mp_transition[%d/%d]: %d transition(s): %lld transfer(s), %lld bytes sent, %lld "
               "shard(s) verified\n", me, n, count, (long long)tot_x, (long long)tot_b,
               (long long)tot_v);
    nrs_xport_close(&x);
    nrs_ucx_disconnect(u, 5.0);
    if (nrs_rdv_fence(r, (uint64_t)count + 1, NULL, timeout, err, sizeof err)) {
        fprintf(stderr, "mp_transition[%d]: %s\n", me, err);
        rc = 1;
    }
    goto out;
fail:
    fprintf(stderr, "mp_transition[%d]: %s\n", me, err);
    rc = 1;
    nrs_xport_close(&x);
out:
    if (addrs)
        nrs_rdv_free_blobs(r, addrs, lens);
    nrs_ucx_fini(u);
    nrs_rdv_fini(r);
    return rc;
}
