/* Public entry points of runtime/emu: build + schedule a transition graph,
 * its statistics, its canonical hash. */
#include <stdlib.h>
#include <string.h>

#include "emu/graph.h"
#include "emu/pattern.h"

void nrs_emu_opts_init(nrs_emu_opts_t *o)
{
    memset(o, 0, sizeof(*o));
}

static double gbps(double v, double dflt) /* -> bytes per picosecond */
{
    return (v > 0 ? v : dflt) * 1e-3;
}

static int graph_config(nrs_emu_graph_t *g, const nrs_spec_t *s, const nrs_emu_opts_t *o,
                        char *err, size_t errlen)
{
    const nrs_cluster_t *c = &s->cluster;
    int maxg = g->from.max_gpu > g->to.max_gpu ? g->from.max_gpu : g->to.max_gpu;

    memcpy(g->models, s->models, sizeof(g->models));
    for (int i = 0; i < o->nlost; i++)
        if (o->lost[i] > maxg)
            maxg = o->lost[i];
    g->nphys = maxg + 1 > 0 ? maxg + 1 : 1;
    g->gpn = c->gpus_per_node > 0 ? c->gpus_per_node : g->nphys;
    g->nnodes = (g->nphys + g->gpn - 1) / g->gpn;
    g->bw[NRS_EMU_RES_HBM] = gbps(c->hbm_gbps, 2000) / 2; /* a copy reads and writes */
    g->bw[NRS_EMU_RES_INTRA_TX] = g->bw[NRS_EMU_RES_INTRA_RX] = gbps(c->intra_gbps, 150);
    g->bw[NRS_EMU_RES_INTER_TX] = g->bw[NRS_EMU_RES_INTER_RX] = gbps(c->inter_gbps, 25);
    g->bw[NRS_EMU_RES_D2H] = g->bw[NRS_EMU_RES_H2D] = gbps(c->host_gbps, 25);
    g->chunk = o->chunk_bytes > 0 ? o->chunk_bytes : NRS_COST_CHUNK_BYTES;
    /* one pack buffer for a strided send, one for a recv; the planner leaves
     * it free under the default chunk (nereus/cost.h) */
    g->reserve = NRS_COST_RESERVE_BYTES(g->chunk);
    g->cap = o->cap_bytes > 0
                 ? o->cap_bytes
                 : (int64_t)((c->gpu_mem_gib - s->runtime.mem_headroom_gib) * (1 << 30));
    if (g->cap <= g->reserve) {
        snprintf(err, errlen, "per-GPU memory cap %lld bytes leaves no room (chunk %lld)",
                 (long long)g->cap, (long long)g->chunk);
        return -1;
    }
    return 0;
}

int nrs_emu_graph_make(const nrs_spec_t *s, const nrs_plan_t *from, nrs_emu_sel_t from_sel,
                       const nrs_plan_t *to, nrs_emu_sel_t to_sel, const nrs_emu_opts_t *o,
                       nrs_emu_graph_t **out, char *err, size_t errlen)
{
    nrs_emu_opts_t dflt;
    nrs_emu_graph_t *g = calloc(1, sizeof(*g));
    int rc = -1;

    *out = NULL;
    if (errlen)
        err[0] = 0; /* a failure that says nothing (a refused allocation) is out of memory */
    if (!o) {
        nrs_emu_opts_init(&dflt);
        o = &dflt;
    }
    if (!g) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    g->from.max_gpu = g->to.max_gpu = -1;
    double t0 = nrs_now_s();
    if (nrs_emu_state_build(s, from, from_sel, NULL, 0, &g->from, err, errlen) ||
        nrs_emu_state_build(s, to, to_sel, o->gpu_map, o->ngpu_map, &g->to, err, errlen) ||
        graph_config(g, s, o, err, errlen))
        goto fail;
    g->phase_s[NRS_EMU_PH_STATES] = nrs_now_s() - t0;
    g->keep_old = from_sel == NRS_EMU_SEL_ACTOR_TRAIN_W;
    rc = nrs_emu_graph_build(g, s, o, err, errlen);
    if (rc == NRS_EMU_ELOST) {
        *out = g;
        return rc;
    }
    t0 = nrs_now_s();
    if (rc || (rc = nrs_emu_schedule(g, err, errlen)))
        goto fail;
    g->phase_s[NRS_EMU_PH_SCHEDULE] = nrs_now_s() - t0;
    *out = g;
    return 0;
fail:
    if (errlen && !err[0])
        snprintf(err, errlen, "out of memory building the transition graph");
    nrs_emu_graph_free(g);
    return -1;
}

int nrs_emu_transition(const nrs_spec_t *s, const nrs_plan_t *from, const nrs_plan_t *to,
                       const nrs_emu_opts_t *o, nrs_emu_graph_t **out, char *err, size_t errlen)
{
    return nrs_emu_graph_make(s, from, NRS_EMU_SEL_PERSISTENT, to, NRS_EMU_SEL_PERSISTENT, o,
                              out, err, errlen);
}

int nrs_emu_weight_sync(const nrs_spec_t *s, const nrs_plan_t *p, const nrs_emu_opts_t *o,
                        nrs_emu_graph_t **out, char *err, size_t errlen)
{
    if (!p->has[NRS_MS_ACTOR_TRAIN] || !p->has[NRS_MS_ACTOR_GENERATE]) {
        *out = NULL;
        snprintf(err, errlen, "weight sync needs actor.train and actor.generate");
        return -1;
    }
    return nrs_emu_graph_make(s, p, NRS_EMU_SEL_ACTOR_TRAIN_W, p, NRS_EMU_SEL_ACTOR_GEN_W, o,
                              out, err, errlen);
}

void nrs_emu_graph_free(nrs_emu_graph_t *g)
{
    if (!g)
        return;
    nrs_emu_state_free(&g->from);
    nrs_emu_state_free(&g->to);
    free(g->buf);
    free(g->moves);
    free(g->mch);
    free(g->ops);
    free(g->lost);
    free(g->peak);
    free(g->host_peak);
    free(g);
}

int64_t nrs_emu_graph_peak(const nrs_emu_graph_t *g, int gpu)
{
    return g->peak && gpu >= 0 && gpu < g->nphys ? g->peak[gpu] : 0;
}

void nrs_emu_graph_stats(const nrs_emu_graph_t *g, nrs_emu_stats_t *st)
{
    memset(st, 0, sizeof(*st));
    memcpy(st->bytes, g->link_bytes, sizeof(st->bytes));
    st->nops = (int64_t)g->nops;
    st->ntransfers = (int64_t)g->nmoves;
    st->nchunks = (int64_t)g->nchunks;
    st->ncomms = g->ncomms;
    st->nstaged = g->nstaged;
    st->makespan_s = (double)g->makespan * 1e-12;
    st->lower_bound_s = (double)g->lower_bound * 1e-12;
    st->ponr = g->ponr;
    st->ponr_s = 1e-12 * (double)(g->ponr >= 0 && (size_t)g->ponr < g->nops ? g->ops[g->ponr].start
                                                                            : g->makespan);
    st->cap_bytes = g->cap;
    st->ngpus = g->nphys;
    st->nlost = (int)g->nlost;
    st->peak_gpu = -1;
    for (int i = 0; g->peak && i < g->nphys; i++)
        if (st->peak_gpu < 0 || g->peak[i] > st->peak_bytes) {
            st->peak_bytes = g->peak[i];
            st->peak_gpu = i;
        }
    st->hash = nrs_emu_graph_hash(g);
}

void nrs_emu_graph_print_lost(const nrs_emu_graph_t *g, FILE *out)
{
    for (size_t i = 0; i < g->nlost; i++) {
        const nrs_emu_lost_t *l = &g->lost[i];
        char name[64];
        nrs_emu_tensor_name(&g->models[l->role], l->tensor, name, sizeof(name));
        int l0, l1;
        nrs_emu_box_layers(&g->models[l->role], l->tensor, &l->box, &l0, &l1);
        fprintf(out, "lost: %s.%s %s", nrs_role_name(l->role), name, nrs_emu_kind_name(l->kind));
        if (l1 > l0)
            fprintf(out, " layers [%d,%d)", l0, l1);
        fprintf(out, " rows [%d,%d) cols [%d,%d)\n", l->box.r0, l->box.r1, l->box.c0, l->box.c1);
    }
}

/* Appends "a-b" or "a" for the layer run [a, b] to buf. */
static void put_run(char *buf, size_t n, int a, int b, bool *first)
{
    size_t len = strlen(buf);
    if (len + 24 >= n)
        return;
    snprintf(buf + len, n - len, a == b ? "%s%d" : "%s%d-%d", *first ? "" : ",", a, b);
    *first = false;
}

void nrs_emu_graph_print_lost_summary(const nrs_emu_graph_t *g, FILE *out)
{
    for (int role = 0; role < NRS_ROLE_COUNT; role++) {
        const nrs_model_t *m = &g->models[role];
        for (int kind = 0; kind < NRS_EMU_KIND_COUNT; kind++) {
            long boxes = 0;
            double bytes = 0;
            unsigned char layers[1024] = {0}, globals[NRS_EMU_T_GLOBALS] = {0};
            int esize = kind == NRS_EMU_WEIGHT || kind == NRS_EMU_GRAD ? nrs_dtype_bytes(m->dtype) : 4;
            for (size_t i = 0; i < g->nlost; i++) {
                const nrs_emu_lost_t *l = &g->lost[i];
                if (l->role != role || l->kind != kind)
                    continue;
                boxes++;
                bytes += (double)nrs_emu_rect_area(&l->box) * esize;
                if (l->tensor < NRS_EMU_T_GLOBALS) {
                    globals[l->tensor] = 1;
                    continue;
                }
                int l0, l1;
                nrs_emu_box_layers(m, l->tensor, &l->box, &l0, &l1);
                for (int y = l0; y < l1 && y < 1024; y++)
                    layers[y] = 1;
            }
            if (!boxes)
                continue;
            char what[256] = "";
            bool first = true;
            for (int a = 0; a < 1024; a++) {
                if (!layers[a])
                    continue;
                int b = a;
                while (b + 1 < 1024 && layers[b + 1])
                    b++;
                if (first) {
                    snprintf(what, sizeof(what), "layers ");
                }
                put_run(what, sizeof(what), a, b, &first);
                a = b;
            }
            for (int t = 0; t < NRS_EMU_T_GLOBALS; t++)
                if (globals[t]) {
                    char name[64];
                    size_t len = strlen(what);
                    nrs_emu_tensor_name(m, t, name, sizeof(name));
                    snprintf(what + len, sizeof(what) - len, "%s%s", len ? ", " : "", name);
                }
            fprintf(out, "lost: %s %s: %ld boxes, %.2f GiB (%s)\n", nrs_role_name(role),
                    nrs_emu_kind_name(kind), boxes, bytes / (1024.0 * 1024 * 1024), what);
        }
    }
}

static int endpoint_rank(const nrs_emu_graph_t *g, int gpu, int32_t buf)
{
    return gpu >= 0 ? gpu : g->buf[buf].via;
}

int nrs_emu_op_rank(const nrs_emu_graph_t *g, const nrs_emu_op_t *op, int side)
{
    switch (op->type) {
    case NRS_EMU_OP_ALLOC: return side ? endpoint_rank(g, op->dst_gpu, op->dst_buf) : -1;
    case NRS_EMU_OP_FREE: return side ? -1 : endpoint_rank(g, op->src_gpu, op->src_buf);
    case NRS_EMU_OP_COPY:
    case NRS_EMU_OP_STAGE: return side ? -1 : op->src_gpu;
    case NRS_EMU_OP_XFER:
        return side ? op->dst_gpu : endpoint_rank(g, op->src_gpu, op->src_buf);
    default: return -1;
    }
}

size_t nrs_emu_rank_ops(const nrs_emu_graph_t *g, int gpu, size_t *idx, size_t max)
{
    size_t n = 0;
    for (size_t i = 0; i < g->nops; i++)
        if (nrs_emu_op_rank(g, &g->ops[i], 0) == gpu || nrs_emu_op_rank(g, &g->ops[i], 1) == gpu) {
            if (n < max)
                idx[n] = i;
            n++;
        }
    return n;
}

/* Canonical serialization: every field as a 64-bit integer, in a fixed order. */
typedef struct {
    int64_t v[32];
    int n;
    uint64_t h;
} ser_t;

static void ser_flush(ser_t *w)
{
    uint64_t x = nrs_emu_checksum(w->v, sizeof(int64_t) * (size_t)w->n);
    w->h = (w->h ^ x) * 0x100000001b3ull + (x >> 7);
    w->n = 0;
}

static void ser(ser_t *w, int64_t x)
{
    if (w->n == 32)
        ser_flush(w);
    w->v[w->n++] = x;
}

uint64_t nrs_emu_graph_hash(const nrs_emu_graph_t *g)
{
    ser_t w = {.h = 0x9e3779b97f4a7c15ull};
    ser(&w, (int64_t)g->nbuf);
    for (size_t i = 0; i < g->nbuf; i++) {
        const nrs_emu_gbuf_t *b = &g->buf[i];
        int64_t f[] = {b->b.engine, b->b.replica, b->b.rank, b->b.gpu, b->b.set,  b->b.role,
                       b->b.kind,   b->b.esize,   b->b.tensor, b->b.box.r0, b->b.box.r1,
                       b->b.box.c0, b->b.box.c1,  b->b.bytes, b->alias,    b->via,
                       b->origin,   b->lost};
        for (size_t k = 0; k < sizeof(f) / sizeof(f[0]); k++)
            ser(&w, f[k]);
    }
    ser(&w, (int64_t)g->nops);
    for (size_t i = 0; i < g->nops; i++) {
        const nrs_emu_op_t *o = &g->ops[i];
        int64_t f[] = {o->type,    o->link,    o->src_buf,   o->dst_buf,   o->src_gpu,
                       o->dst_gpu, o->rows,    o->move,      o->src_off,   o->dst_off,
                       o->src_pitch, o->dst_pitch, o->row_bytes};
        for (size_t k = 0; k < sizeof(f) / sizeof(f[0]); k++)
            ser(&w, f[k]);
        ser(&w, o->start);
        ser(&w, o->end);
    }
    ser(&w, g->ponr);
    ser_flush(&w);
    return w.h;
}
