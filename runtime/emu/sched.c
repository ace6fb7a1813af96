/* Scheduler: a list scheduler over links (docs/transitions.md §3).
 *
 * Event-driven simulation on the spec's bandwidths. Each resource (a GPU's
 * HBM, NVLink tx/rx, NIC tx/rx, PCIe d2h/h2d) carries one chunk at a time;
 * when a resource frees, the waiting move with the most loaded resource
 * (longest remaining work first) whose other resource is free and whose
 * destination fits in memory starts its next chunk. Destination buffers are
 * allocated at their first chunk; old buffers are freed lazily, only when an
 * allocation on their GPU needs the room, else at the end — so the point of
 * no return comes as late as memory allows. When nothing runs and nothing
 * fits, an old buffer of the blocked GPU is staged to host memory.
 *
 * Cost: moves wait in pairs (the resources they use), in a fixed order
 * inside a pair, so an event looks at the freed resource's pairs, not its
 * moves; each list entry carries the pair's other resource, so a busy partner
 * is skipped without touching a move. A started move runs a burst of up to
 * BURST chunks back to back, one event, the chunks' times computed.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "emu/graph.h"

/* Chunks a started move runs back to back before it competes again. */
enum { BURST = 32 };

typedef struct {
    int64_t t;
    int64_t seq;
    int32_t op;    /* index in g->ops */
    int32_t stage; /* host buffer id for a stage op, else -1 */
} ev_t;

typedef struct {
    uint32_t n, next;     /* its chunks (nrs_emu_chunk), the next to start */
    int32_t src;          /* current source (host after staging) */
    int r[2];
    int32_t running;      /* chunks in flight (a burst) */
    int32_t pair;         /* the pair of resources it waits on */
    int32_t dst, dgpu;    /* its destination buffer and that buffer's GPU (copied here: */
    int64_t dbytes;       /* the hot start test touches only this line) */
    int64_t rem; /* remaining picoseconds on its resources */
    int64_t key; /* its order inside the pair: initial picoseconds */
} smove_t;

/* The moves that use one pair of resources (r[1] = -1: one resource), in a
 * fixed order: most picoseconds first, then move id. */
typedef struct {
    int r[2];
    int32_t *v;
    size_t n, cap, head;
    int own; /* v is its own allocation, else a slice of pairv */
} spair_t;

typedef struct {
    int32_t *v;
    size_t n, cap;
} ivec_t;

typedef struct {
    int32_t id;    /* pair */
    int32_t other; /* its other resource, or -1 */
} lent_t;

typedef struct {
    lent_t *v;
    size_t n, cap;
} lvec_t;

typedef struct {
    nrs_emu_graph_t *g;
    size_t nres;
    int64_t now;
    int64_t seq, capeff;
    int64_t *rem;
    unsigned char *busy, *indirty;
    lvec_t *lists; /* pairs per resource */
    ivec_t dirty;
    smove_t *mv;
    spair_t *pairs;
    size_t npairs, paircap;
    int32_t *pairv; /* initial pair slices */
    void *dres; /* try_start scratch */
    size_t drescap;
    size_t moves_left;
    size_t blocked_from; /* moves before it are done or have a live destination */
    int32_t *bysrc, *bysrc_off; /* moves reading each old buffer, in id order */
    /* per buffer (room for one host copy of every old buffer) */
    int32_t *reads;
    unsigned char *live, *keep, *staging;
    unsigned char *stalled; /* per GPU: stage_one's marks */
    int64_t *used, *freeable, *host_used;
    ivec_t *freeq; /* freeable old buffers per GPU */
    ev_t *heap;
    size_t nheap, heapcap;
    char *err;
    size_t errlen;
    nrs_emu_dmemo_t dm;
} sched_t;

static int ivec_push(ivec_t *v, int32_t x)
{
    NRS_GROW(v->v, v->n, v->cap, 1);
    v->v[v->n++] = x;
    return 0;
}

static int lvec_push(lvec_t *v, lent_t x)
{
    NRS_GROW(v->v, v->n, v->cap, 1);
    v->v[v->n++] = x;
    return 0;
}

static int ev_less(const ev_t *a, const ev_t *b)
{
    return a->t < b->t || (a->t == b->t && a->seq < b->seq);
}

static int heap_push(sched_t *S, ev_t e)
{
    NRS_GROW(S->heap, S->nheap, S->heapcap, 1);
    size_t i = S->nheap++;
    S->heap[i] = e;
    while (i > 0 && ev_less(&S->heap[i], &S->heap[(i - 1) / 2])) {
        ev_t t = S->heap[i];
        S->heap[i] = S->heap[(i - 1) / 2];
        S->heap[(i - 1) / 2] = t;
        i = (i - 1) / 2;
    }
    return 0;
}

static ev_t heap_pop(sched_t *S)
{
    ev_t top = S->heap[0];
    size_t i = 0;
    S->heap[0] = S->heap[--S->nheap];
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < S->nheap && ev_less(&S->heap[l], &S->heap[m]))
            m = l;
        if (r < S->nheap && ev_less(&S->heap[r], &S->heap[m]))
            m = r;
        if (m == i)
            break;
        ev_t t = S->heap[i];
        S->heap[i] = S->heap[m];
        S->heap[m] = t;
        i = m;
    }
    return top;
}

static int mark_dirty(sched_t *S, int r)
{
    if (r < 0 || S->indirty[r])
        return 0;
    S->indirty[r] = 1;
    return ivec_push(&S->dirty, r);
}

/* Resources whose waiting moves may start once memory on gpu frees. */
static int mark_gpu_dirty(sched_t *S, int gpu)
{
    static const int rx[] = {NRS_EMU_RES_HBM, NRS_EMU_RES_INTRA_RX, NRS_EMU_RES_INTER_RX,
                             NRS_EMU_RES_H2D};
    for (size_t i = 0; i < sizeof(rx) / sizeof(rx[0]); i++)
        if (mark_dirty(S, gpu * NRS_EMU_RES_KINDS + rx[i]))
            return -1;
    return 0;
}

static int emit(sched_t *S, nrs_emu_op_t op)
{
    nrs_emu_graph_t *g = S->g;
    if (op.type == NRS_EMU_OP_FREE && op.src_buf < g->nold && g->ponr < 0)
        g->ponr = (int64_t)g->nops;
    if (op.type != NRS_EMU_OP_XFER && op.type != NRS_EMU_OP_COPY &&
        op.type != NRS_EMU_OP_STAGE)
        op.start = op.end = S->now;
    return nrs_emu_push_op(g, &op);
}

static void note_peak(sched_t *S, int gpu)
{
    nrs_emu_graph_t *g = S->g;
    if (gpu >= 0 && S->used[gpu] + g->reserve > g->peak[gpu])
        g->peak[gpu] = S->used[gpu] + g->reserve;
}

static int free_buf(sched_t *S, int32_t id)
{
    nrs_emu_graph_t *g = S->g;
    nrs_emu_op_t op = {.type = NRS_EMU_OP_FREE, .src_buf = id, .dst_buf = -1,
                       .src_gpu = g->buf[id].b.gpu, .dst_gpu = -1, .move = -1};
    int gpu = g->buf[id].b.gpu;
    S->live[id] = 0;
    if (gpu >= 0)
        S->used[gpu] -= g->buf[id].b.bytes;
    else
        S->host_used[-1 - gpu] -= g->buf[id].b.bytes;
    return emit(S, op);
}

static int fits(const sched_t *S, int gpu, int64_t need)
{
    return S->used[gpu] + need - S->freeable[gpu] <= S->capeff;
}

/* Allocate new buffer id, freeing old buffers already fully read if needed. */
static int alloc_buf(sched_t *S, int32_t id)
{
    nrs_emu_graph_t *g = S->g;
    int gpu = g->buf[id].b.gpu;
    int64_t need = g->buf[id].b.bytes;
    ivec_t *q = &S->freeq[gpu];
    size_t i = 0;

    while (S->used[gpu] + need > S->capeff && i < q->n) {
        int32_t v = q->v[i++];
        S->freeable[gpu] -= g->buf[v].b.bytes;
        if (free_buf(S, v))
            return -1;
    }
    if (i) {
        memmove(q->v, q->v + i, (q->n - i) * sizeof(*q->v));
        q->n -= i;
    }
    nrs_emu_op_t op = {.type = NRS_EMU_OP_ALLOC, .src_buf = -1, .dst_buf = id, .src_gpu = -1,
                       .dst_gpu = gpu, .move = -1};
    S->live[id] = 1;
    S->used[gpu] += need;
    note_peak(S, gpu);
    return emit(S, op);
}

static int startable(const sched_t *S, const smove_t *m)
{
    if (m->running || m->next == m->n || S->staging[m->src])
        return 0;
    if (S->busy[m->r[0]] || (m->r[1] >= 0 && S->busy[m->r[1]]))
        return 0;
    return S->live[m->dst] || fits(S, m->dgpu, m->dbytes);
}

/* Bytes a region covers are one contiguous run on both sides. */
static int contiguous(const nrs_emu_op_t *o)
{
    return o->rows == 1 || (o->src_pitch == o->row_bytes && o->dst_pitch == o->row_bytes);
}

/* op continues last (same buffers, both contiguous, right after it): a burst's
 * chunks become one operation. Strided chunks stay apart: each is packed
 * through a buffer of at most one chunk (the graph's reserve). */
static int extends(const nrs_emu_op_t *last, const nrs_emu_op_t *op)
{
    int64_t n = last->rows * last->row_bytes;
    return last->type == op->type && last->move == op->move && last->src_buf == op->src_buf &&
           last->dst_buf == op->dst_buf && contiguous(last) && contiguous(op) &&
           op->src_off == last->src_off + n && op->dst_off == last->dst_off + n &&
           op->start == last->end;
}

/* Start move mi: up to BURST of its chunks back to back on its resources,
 * one event at the end, contiguous chunks merged into one operation. Chunk
 * times are computed, not simulated. */
static int start_chunk(sched_t *S, int32_t mi)
{
    nrs_emu_graph_t *g = S->g;
    smove_t *m = &S->mv[mi];
    size_t k = m->n - m->next < BURST ? m->n - m->next : BURST;
    int64_t t = S->now;

    if (!S->live[m->dst] && alloc_buf(S, m->dst))
        return -1;
    for (size_t c = 0; c < k; c++) {
        nrs_emu_op_t op;
        nrs_emu_chunk(g, (size_t)mi, m->next + c, &op);
        int64_t d = nrs_emu_duration_m(g, &S->dm, m->r[0], op.row_bytes * op.rows);
        if (m->src != op.src_buf) { /* staged to host */
            op.src_buf = m->src;
            op.src_gpu = g->buf[m->src].b.gpu;
            op.type = NRS_EMU_OP_XFER;
            op.link = (uint8_t)nrs_emu_resources(g, op.src_gpu, op.dst_gpu,
                                                 g->buf[m->src].via, (int[2]){0, 0});
        }
        op.start = t;
        op.end = t + d;
        t += d;
        for (int r = 0; r < 2; r++)
            if (m->r[r] >= 0)
                S->rem[m->r[r]] -= d;
        m->rem -= d;
        if (c > 0 && extends(&g->ops[g->nops - 1], &op)) { /* one op: contiguous bytes */
            nrs_emu_op_t *last = &g->ops[g->nops - 1];
            last->row_bytes = last->rows * last->row_bytes + op.rows * op.row_bytes;
            last->rows = 1;
            last->src_pitch = last->dst_pitch = last->row_bytes;
            last->end = op.end;
        } else if (emit(S, op)) {
            return -1;
        }
    }
    for (int r = 0; r < 2; r++)
        if (m->r[r] >= 0)
            S->busy[m->r[r]] = 1;
    m->running = (int)k;
    return heap_push(S, (ev_t){t, S->seq++, (int32_t)g->nops - 1, -1});
}

typedef struct {
    int64_t rem;
    int32_t r;
} dres_t;

static int dres_cmp(const void *x, const void *y) /* most loaded first, then id */
{
    const dres_t *a = x, *b = y;
    if (a->rem != b->rem)
        return a->rem > b->rem ? -1 : 1;
    return a->r < b->r ? -1 : a->r > b->r;
}

/* The first move of pair p (from its head) that can start now, or -1. Done
 * and re-sourced moves at the head are dropped. */
static int32_t pair_first(sched_t *S, int32_t p)
{
    spair_t *P = &S->pairs[p];
    while (P->head < P->n) {
        const smove_t *m = &S->mv[P->v[P->head]];
        if (m->next < m->n && m->pair == p)
            break;
        P->head++;
    }
    for (size_t j = P->head; j < P->n; j++) {
        const smove_t *m = &S->mv[P->v[j]];
        if (m->pair == p && startable(S, m))
            return P->v[j];
    }
    return -1;
}

/* Start what can start on the resources that changed: on each free one, the
 * pair whose other resource is free with the most remaining work on its
 * busier resource (then the move with more remaining, then lower id). */
static int try_start(sched_t *S)
{
    ivec_t d = S->dirty;
    if (S->drescap < d.n + 1) {
        void *p = realloc(S->dres, sizeof(dres_t) * (d.n + 1));
        if (!p)
            return -1;
        S->dres = p;
        S->drescap = d.n + 1;
    }
    dres_t *o = S->dres;
    S->dirty.n = 0; /* o holds the resources: marks made below go to the next round */
    for (size_t i = 0; i < d.n; i++) { /* most loaded resource first */
        S->indirty[d.v[i]] = 0;
        o[i] = (dres_t){S->rem[d.v[i]], d.v[i]};
    }
    if (d.n > 1)
        qsort(o, d.n, sizeof(*o), dres_cmp);
    for (size_t i = 0; i < d.n; i++) {
        int r = o[i].r;
        lvec_t *L = &S->lists[r];
        int32_t best = -1;
        int64_t bp = 0;
        if (S->busy[r])
            continue;
        for (size_t k = 0; k < L->n;) {
            int other = L->v[k].other;
            spair_t *P = &S->pairs[L->v[k].id];
            if (P->head == P->n) {
                L->v[k] = L->v[--L->n]; /* exhausted: drop */
                continue;
            }
            if (other >= 0 && S->busy[other]) {
                k++;
                continue;
            }
            int32_t id = pair_first(S, L->v[k].id);
            if (P->head == P->n) {
                L->v[k] = L->v[--L->n];
                continue;
            }
            k++;
            if (id < 0)
                continue;
            const smove_t *m = &S->mv[id];
            int64_t a = S->rem[r], b = other >= 0 ? S->rem[other] : 0, p = a > b ? a : b;
            if (best < 0 || p > bp ||
                (p == bp && (m->rem > S->mv[best].rem ||
                             (m->rem == S->mv[best].rem && id < best)))) {
                best = id;
                bp = p;
            }
        }
        if (best >= 0 && start_chunk(S, best))
            return -1;
    }
    return 0;
}

static int pair_push(sched_t *S, int32_t p, int32_t mi)
{
    spair_t *P = &S->pairs[p];
    if (P->n == P->cap || !P->own) {
        size_t nc = P->n * 2 + 8;
        int32_t *v = malloc(nc * sizeof(*v));
        if (!v)
            return -1;
        if (P->n)
            memcpy(v, P->v, P->n * sizeof(*v));
        if (P->own)
            free(P->v);
        P->v = v;
        P->cap = nc;
        P->own = 1;
    }
    /* keep the order from the head on: insert by (key desc, id) */
    size_t j = P->n++;
    const smove_t *m = &S->mv[mi];
    while (j > P->head) {
        const smove_t *q = &S->mv[P->v[j - 1]];
        if (q->key > m->key || (q->key == m->key && P->v[j - 1] < mi))
            break;
        P->v[j] = P->v[j - 1];
        j--;
    }
    P->v[j] = mi;
    return 0;
}

static int32_t pair_new(sched_t *S, const int r[2])
{
    NRS_GROW(S->pairs, S->npairs, S->paircap, 1);
    int32_t id = (int32_t)S->npairs++;
    S->pairs[id] = (spair_t){{r[0], r[1]}, NULL, 0, 0, 0, 0};
    for (int k = 0; k < 2; k++)
        if (r[k] >= 0 && lvec_push(&S->lists[r[k]], (lent_t){id, r[1 - k]}))
            return -1;
    return id;
}

/* Resources and remaining time of move mi from its current source. */
static void move_resources(sched_t *S, int32_t mi)
{
    nrs_emu_graph_t *g = S->g;
    smove_t *m = &S->mv[mi];
    const nrs_emu_gbuf_t *src = &g->buf[m->src];
    nrs_emu_resources(g, src->b.gpu, g->buf[g->moves[mi].dst].b.gpu, src->via, m->r);
    m->rem = nrs_emu_chunks_ps(g, &S->dm, (size_t)mi, m->next, m->r[0]);
    for (int k = 0; k < 2; k++)
        if (m->r[k] >= 0)
            S->rem[m->r[k]] += m->rem;
}

/* Re-sourced move (staging): into the pair of its new resources. */
static int set_resources(sched_t *S, int32_t mi)
{
    smove_t *m = &S->mv[mi];
    int32_t p = -1;
    move_resources(S, mi);
    const lvec_t *L = &S->lists[m->r[0]];
    for (size_t k = 0; k < L->n && p < 0; k++) {
        const spair_t *P = &S->pairs[L->v[k].id];
        if (P->r[0] == m->r[0] && P->r[1] == m->r[1])
            p = L->v[k].id;
    }
    if (p >= 0 && S->pairs[p].head == S->pairs[p].n)
        p = -1; /* exhausted pairs leave the lists: a fresh one is seen from both */
    if (p < 0 && (p = pair_new(S, m->r)) < 0)
        return -1;
    m->pair = p;
    for (int k = 0; k < 2; k++)
        if (m->r[k] >= 0 && mark_dirty(S, m->r[k]))
            return -1;
    return pair_push(S, p, mi);
}

static int on_read_done(sched_t *S, int32_t src, int n)
{
    nrs_emu_graph_t *g = S->g;
    int gpu = g->buf[src].b.gpu;
    if ((S->reads[src] -= n) > 0)
        return 0;
    if (g->buf[src].origin == NRS_EMU_ORIGIN_HOST)
        return free_buf(S, src);
    if (S->keep[src])
        return 0;
    S->freeable[gpu] += g->buf[src].b.bytes;
    return ivec_push(&S->freeq[gpu], src) || mark_gpu_dirty(S, gpu);
}

static int on_event(sched_t *S, ev_t e)
{
    nrs_emu_graph_t *g = S->g;
    const nrs_emu_op_t opv = g->ops[e.op], *op = &opv; /* g->ops may move */
    int r[2];

    S->now = e.t;
    if (e.stage >= 0) { /* staging done: the GPU copy goes, readers read the host copy */
        int32_t victim = op->src_buf, host = e.stage;
        int gpu = g->buf[victim].b.gpu;
        S->busy[gpu * NRS_EMU_RES_KINDS + NRS_EMU_RES_D2H] = 0;
        S->staging[victim] = 0;
        if (free_buf(S, victim) || mark_dirty(S, gpu * NRS_EMU_RES_KINDS + NRS_EMU_RES_D2H))
            return -1;
        S->live[host] = 1;
        for (int32_t j = S->bysrc_off[victim]; j < S->bysrc_off[victim + 1]; j++) {
            smove_t *m = &S->mv[S->bysrc[j]];
            if (m->src != victim || m->next == m->n)
                continue;
            for (int k = 0; k < 2; k++)
                if (m->r[k] >= 0)
                    S->rem[m->r[k]] -= m->rem;
            m->src = host;
            if (set_resources(S, S->bysrc[j]))
                return -1;
        }
        return mark_gpu_dirty(S, gpu);
    }
    smove_t *m = &S->mv[op->move];
    int nrun = m->running;
    m->running = 0;
    m->next += (size_t)nrun;
    if (m->next == m->n)
        S->moves_left--;
    nrs_emu_resources(g, op->src_gpu, op->dst_gpu, g->buf[op->src_buf].via, r);
    for (int k = 0; k < 2; k++)
        if (r[k] >= 0) {
            S->busy[r[k]] = 0;
            if (mark_dirty(S, r[k]))
                return -1;
        }
    return on_read_done(S, op->src_buf, nrun);
}

/* Stage the largest old buffer of gpu that still has reads to host memory of
 * its node. 1 when one was staged, 0 when gpu has none, -1 on error. */
static int stage_gpu(sched_t *S, int gpu)
{
    nrs_emu_graph_t *g = S->g;
    int32_t victim = -1;
    for (int32_t i = 0; i < g->nold; i++) {
        const nrs_emu_gbuf_t *b = &g->buf[i];
        if (b->b.gpu != gpu || !S->live[i] || S->keep[i] || S->reads[i] <= 0 || S->staging[i])
            continue;
        if (victim < 0 || b->b.bytes > g->buf[victim].b.bytes)
            victim = i;
    }
    if (victim < 0)
        return 0;
    nrs_emu_gbuf_t h = g->buf[victim];
    h.origin = NRS_EMU_ORIGIN_HOST;
    h.b.gpu = -1 - nrs_emu_node_of(g, gpu);
    h.via = gpu;
    h.alias = -1;
    int32_t hid = (int32_t)g->nbuf;
    if (nrs_emu_push_buf(g, &h))
        return -1;
    S->reads[hid] = S->reads[victim];
    S->reads[victim] = 0;
    S->staging[victim] = 1;
    S->host_used[-1 - h.b.gpu] += h.b.bytes;
    if (S->host_used[-1 - h.b.gpu] > g->host_peak[-1 - h.b.gpu])
        g->host_peak[-1 - h.b.gpu] = S->host_used[-1 - h.b.gpu];
    int res = gpu * NRS_EMU_RES_KINDS + NRS_EMU_RES_D2H;
    int64_t d = nrs_emu_duration(g, res, h.b.bytes);
    nrs_emu_op_t op = {.type = NRS_EMU_OP_STAGE, .link = NRS_LINK_HOST, .src_buf = victim,
                       .dst_buf = hid, .src_gpu = gpu, .dst_gpu = h.b.gpu, .rows = 1,
                       .move = -1, .row_bytes = h.b.bytes, .src_pitch = h.b.bytes,
                       .dst_pitch = h.b.bytes, .start = S->now, .end = S->now + d};
    S->busy[res] = 1;
    g->nstaged++;
    g->link_bytes[NRS_LINK_HOST] += h.b.bytes;
    if (heap_push(S, (ev_t){op.end, S->seq++, (int32_t)g->nops, hid}))
        return -1;
    return emit(S, op) ? -1 : 1;
}

/* Nothing runs and nothing fits: stage an old buffer of each blocked GPU, in
 * the order of their lowest-id pending moves. Each GPU stages over its own
 * PCIe link, so GPUs blocked at the same moment (every replica of a reshard
 * under a tight cap) stage in parallel, not one after the other. */
static int stage_one(sched_t *S)
{
    nrs_emu_graph_t *g = S->g;
    int32_t blocked = -1;
    int staged = 0;
    /* moves only finish and destinations only become live: resume the scan */
    for (size_t i = S->blocked_from; i < g->nmoves && blocked < 0; i++)
        if (S->mv[i].next < S->mv[i].n && !S->live[g->moves[i].dst])
            blocked = (int32_t)i;
        else
            S->blocked_from = i + 1;
    if (blocked < 0) {
        snprintf(S->err, S->errlen, "scheduler stalled with %zu moves left", S->moves_left);
        return -1;
    }
    const nrs_emu_gbuf_t *D = &g->buf[g->moves[blocked].dst];
    int gpu = D->b.gpu, rc = stage_gpu(S, gpu);
    if (rc < 0)
        return -1;
    if (rc == 0) {
        snprintf(S->err, S->errlen,
                 "GPU %d: cannot fit %lld bytes of the new state under the cap of %lld bytes "
                 "(%lld in use, nothing left to stage to host)",
                 gpu, (long long)D->b.bytes, (long long)(S->capeff + g->reserve),
                 (long long)(S->used[gpu] + g->reserve));
        return -1;
    }
    staged++;
    S->stalled[gpu] = 1;
    for (size_t i = (size_t)blocked + 1; i < g->nmoves; i++) {
        const smove_t *m = &S->mv[i];
        if (m->next == m->n || S->live[m->dst] || S->stalled[m->dgpu] ||
            fits(S, m->dgpu, m->dbytes))
            continue;
        S->stalled[m->dgpu] = 1;
        if ((rc = stage_gpu(S, m->dgpu)) < 0)
            return -1;
        staged += rc;
    }
    for (size_t i = (size_t)blocked; i < g->nmoves; i++) /* clear the marks */
        S->stalled[S->mv[i].dgpu] = 0;
    return staged > 0 ? 0 : -1;
}

/* --- set-up, end, communicators -------------------------------------------- */

static int check_caps(sched_t *S)
{
    nrs_emu_graph_t *g = S->g;
    int64_t *need = calloc((size_t)g->nphys + 1, sizeof(int64_t));
    int rc = 0;
    if (!need) {
        snprintf(S->err, S->errlen, "out of memory scheduling the transition");
        return -1;
    }
    for (int32_t j = g->nold; j < g->nold + g->nnew; j++)
        if (g->buf[j].alias < 0)
            need[g->buf[j].b.gpu] += g->buf[j].b.bytes;
    for (int32_t i = 0; i < g->nold; i++)
        if (S->keep[i])
            need[g->buf[i].b.gpu] += g->buf[i].b.bytes;
    for (int gpu = 0; gpu < g->nphys && !rc; gpu++) {
        const char *what = S->used[gpu] > S->capeff ? "old" : need[gpu] > S->capeff ? "new" : NULL;
        if (what) {
            snprintf(S->err, S->errlen,
                     "GPU %d: the %s state needs %lld bytes, over the cap of %lld bytes "
                     "(%lld reserved for transfer buffers)",
                     gpu, what, (long long)(what[0] == 'o' ? S->used[gpu] : need[gpu]),
                     (long long)g->cap, (long long)g->reserve);
            rc = 1;
        }
    }
    free(need);
    return rc;
}

typedef struct {
    int32_t r0, r1, id;
    int64_t key;
} pkey_t;

static int pair_order(const void *x, const void *y)
{
    const pkey_t *p = x, *q = y;
    if (p->r0 != q->r0)
        return p->r0 < q->r0 ? -1 : 1;
    if (p->r1 != q->r1)
        return p->r1 < q->r1 ? -1 : 1;
    if (p->key != q->key)
        return p->key > q->key ? -1 : 1;
    return p->id < q->id ? -1 : p->id > q->id;
}

/* Every move's resources and time; the moves grouped into pairs. */
static int init_pairs(sched_t *S)
{
    nrs_emu_graph_t *g = S->g;
    size_t n = 0;
    pkey_t *pk = malloc(sizeof(*pk) * (g->nmoves + 1));
    S->pairv = malloc(sizeof(int32_t) * (g->nmoves + 1));
    if (!S->pairv || !pk) {
        free(pk);
        return -1;
    }
    for (size_t i = 0; i < g->nmoves; i++) {
        smove_t *m = &S->mv[i];
        m->src = g->moves[i].src;
        m->dst = g->moves[i].dst;
        m->dgpu = g->buf[m->dst].b.gpu;
        m->dbytes = g->buf[m->dst].b.bytes;
        m->pair = -1;
        move_resources(S, (int32_t)i);
        m->key = m->rem;
        if (m->n) {
            S->moves_left++;
            pk[n++] = (pkey_t){m->r[0], m->r[1], (int32_t)i, m->key};
        }
    }
    qsort(pk, n, sizeof(*pk), pair_order);
    for (size_t i = 0; i < n; i++)
        S->pairv[i] = pk[i].id;
    free(pk);
    for (size_t i = 0; i < n;) {
        const smove_t *m = &S->mv[S->pairv[i]];
        size_t j = i;
        while (j < n && S->mv[S->pairv[j]].r[0] == m->r[0] && S->mv[S->pairv[j]].r[1] == m->r[1])
            j++;
        int32_t p = pair_new(S, m->r);
        if (p < 0)
            return -1; /* pk is freed already */
        S->pairs[p].v = S->pairv + i;
        S->pairs[p].n = S->pairs[p].cap = j - i;
        for (size_t k = i; k < j; k++)
            S->mv[S->pairv[k]].pair = p;
        i = j;
    }
    return 0;
}

static int sched_init(sched_t *S, nrs_emu_graph_t *g)
{
    size_t nb = g->nbuf + (size_t)g->nold + 1, np = (size_t)g->nphys + 1;
    S->g = g;
    S->nres = (size_t)g->nphys * NRS_EMU_RES_KINDS;
    S->capeff = g->cap - g->reserve;
    S->rem = calloc(S->nres + 1, sizeof(int64_t));
    S->busy = calloc(S->nres + 1, 1);
    S->indirty = calloc(S->nres + 1, 1);
    S->lists = calloc(S->nres + 1, sizeof(lvec_t));
    S->bysrc = calloc(g->nmoves + 1, sizeof(int32_t));
    S->bysrc_off = calloc((size_t)g->nold + 2, sizeof(int32_t));
    S->mv = calloc(g->nmoves + 1, sizeof(smove_t));
    S->reads = calloc(nb, sizeof(int32_t));
    S->live = calloc(nb, 1);
    S->keep = calloc(nb, 1);
    S->staging = calloc(nb, 1);
    S->used = calloc(np, sizeof(int64_t));
    S->freeable = calloc(np, sizeof(int64_t));
    S->host_used = calloc((size_t)g->nnodes + 1, sizeof(int64_t));
    S->freeq = calloc(np, sizeof(ivec_t));
    S->stalled = calloc(np, 1);
    g->peak = calloc(np, sizeof(int64_t));
    g->host_peak = calloc((size_t)g->nnodes + 1, sizeof(int64_t));
    if (!S->rem || !S->busy || !S->indirty || !S->lists || !S->bysrc || !S->bysrc_off || !S->mv || !S->reads || !S->live ||
        !S->keep || !S->staging || !S->used || !S->freeable || !S->host_used || !S->freeq ||
        !S->stalled || !g->peak || !g->host_peak)
        return -1;
    for (int32_t i = 0; i < g->nold; i++)
        if (!g->buf[i].lost) {
            S->live[i] = 1;
            S->used[g->buf[i].b.gpu] += g->buf[i].b.bytes;
        }
    for (int32_t j = g->nold; j < g->nold + g->nnew; j++)
        if (g->buf[j].alias >= 0)
            S->keep[g->buf[j].alias] = 1;
    for (int32_t i = 0; i < g->nold && g->keep_old; i++)
        S->keep[i] = 1;
    for (int gpu = 0; gpu < g->nphys; gpu++)
        note_peak(S, gpu);
    for (size_t i = 0; i < g->nmoves; i++) {
        S->reads[g->moves[i].src] += (int32_t)g->mch[i].n;
        S->mv[i].n = g->mch[i].n;
    }
    /* moves by source (counting sort, stable): staging re-sources them */
    for (size_t i = 0; i < g->nmoves; i++)
        S->bysrc_off[g->moves[i].src + 1]++;
    for (int32_t i = 0; i < g->nold; i++)
        S->bysrc_off[i + 1] += S->bysrc_off[i];
    for (size_t i = 0; i < g->nmoves; i++) /* bysrc_off[src] is src's cursor here */
        S->bysrc[S->bysrc_off[g->moves[i].src]++] = (int32_t)i;
    for (int32_t i = g->nold; i > 0; i--) /* shift the cursors back to starts */
        S->bysrc_off[i] = S->bysrc_off[i - 1];
    S->bysrc_off[0] = 0;
    if (init_pairs(S))
        return -1;
    for (int32_t i = 0; i < g->nold; i++) /* never read, not kept: freeable now */
        if (S->live[i] && !S->keep[i] && S->reads[i] == 0) {
            S->freeable[g->buf[i].b.gpu] += g->buf[i].b.bytes;
            if (ivec_push(&S->freeq[g->buf[i].b.gpu], i))
                return -1;
        }
    return 0;
}

static void sched_fini(sched_t *S)
{
    for (size_t r = 0; r < S->nres && S->lists; r++)
        free(S->lists[r].v);
    for (int gpu = 0; gpu < S->g->nphys && S->freeq; gpu++)
        free(S->freeq[gpu].v);
    for (size_t p = 0; p < S->npairs; p++)
        if (S->pairs[p].own)
            free(S->pairs[p].v);
    free(S->pairs);
    free(S->pairv);
    free(S->dres);
    free(S->rem);
    free(S->busy);
    free(S->indirty);
    free(S->lists);
    free(S->bysrc);
    free(S->bysrc_off);
    free(S->dirty.v);
    free(S->mv);
    free(S->reads);
    free(S->live);
    free(S->keep);
    free(S->staging);
    free(S->used);
    free(S->freeable);
    free(S->host_used);
    free(S->freeq);
    free(S->stalled);
    free(S->heap);
}

/* GPUs of engine e of st, rank-major (replica, stage, tensor rank). */
static int engine_gpus(const nrs_emu_state_t *st, int e, int *gpus, int n)
{
    size_t lo = 0, hi = st->nbuf;
    for (int i = 0; i < n; i++)
        gpus[i] = -1;
    while (lo < hi) { /* engines push their buffers in engine order: its first one */
        size_t mid = (lo + hi) / 2;
        if (st->buf[mid].engine < e)
            lo = mid + 1;
        else
            hi = mid;
    }
    for (size_t i = lo; i < st->nbuf && st->buf[i].engine == e; i++) {
        const nrs_emu_buf_t *b = &st->buf[i];
        const nrs_layout_t *l = &st->eng[b->engine].lay;
        if (b->engine == e)
            gpus[b->replica * l->tp * l->pp + b->rank] = b->gpu;
    }
    return 0;
}

/* 1 when engine e of the new plan needs new communicators, 0 when not, -1
 * out of memory (not taken for "changed": the op list must not depend on
 * one rank's memory). */
static int engine_changed(const nrs_emu_graph_t *g, int e, const unsigned char *gpu_lost)
{
    const nrs_emu_engine_t *E = &g->to.eng[e];
    int n = E->lay.tp * E->lay.pp * E->lay.dp, changed = 1;
    for (int f = 0; f < g->from.nengines; f++) {
        const nrs_emu_engine_t *F = &g->from.eng[f];
        if (F->ms != E->ms || F->lay.tp != E->lay.tp || F->lay.pp != E->lay.pp ||
            F->lay.dp != E->lay.dp)
            continue;
        int *a = malloc(sizeof(int) * (size_t)n * 2);
        if (!a)
            return -1;
        engine_gpus(&g->from, f, a, n);
        engine_gpus(&g->to, e, a + n, n);
        changed = memcmp(a, a + n, sizeof(int) * (size_t)n) != 0;
        for (int i = 0; i < n && !changed; i++)
            if (a[i] >= 0 && a[i] < g->nphys && gpu_lost[a[i]])
                changed = 1;
        free(a);
    }
    return changed;
}

/* Communicators the new EMUs need: tp, pp and dp groups of every engine whose
 * GPUs or layout changed. */
static int emit_comms(sched_t *S)
{
    nrs_emu_graph_t *g = S->g;
    unsigned char *gpu_lost = calloc((size_t)g->nphys + 1, 1); /* GPUs with lost state */
    if (!gpu_lost)
        return -1;
    for (int32_t k = 0; k < g->nold; k++)
        if (g->buf[k].lost && g->buf[k].b.gpu >= 0 && g->buf[k].b.gpu < g->nphys)
            gpu_lost[g->buf[k].b.gpu] = 1;
    for (int e = 0; e < g->to.nengines; e++) {
        const nrs_layout_t *l = &g->to.eng[e].lay;
        int kinds[3][2] = {{NRS_EMU_COMM_TP, l->tp}, {NRS_EMU_COMM_PP, l->pp},
                           {NRS_EMU_COMM_DP, l->dp}};
        int ch = engine_changed(g, e, gpu_lost);
        if (ch < 0) {
            free(gpu_lost);
            return -1;
        }
        if (!ch)
            continue;
        for (int k = 0; k < 3; k++) {
            if (kinds[k][1] < 2)
                continue;
            int groups = l->tp * l->pp * l->dp / kinds[k][1];
            for (int i = 0; i < groups; i++) {
                nrs_emu_op_t op = {.type = NRS_EMU_OP_COMM, .src_buf = e,
                                   .dst_buf = kinds[k][0], .rows = kinds[k][1], .move = i,
                                   .src_gpu = -1, .dst_gpu = -1};
                g->ncomms++;
                if (emit(S, op)) {
                    free(gpu_lost);
                    return -1;
                }
            }
        }
    }
    free(gpu_lost);
    return 0;
}

static int finish(sched_t *S)
{
    nrs_emu_graph_t *g = S->g;
    for (int32_t i = 0; i < g->nold; i++)
        if (S->live[i] && !S->keep[i] && free_buf(S, i))
            return -1;
    for (int32_t j = g->nold; j < g->nold + g->nnew; j++)
        if (g->buf[j].alias < 0 && !S->live[j] && alloc_buf(S, j))
            return -1;
    return emit_comms(S);
}

static void link_totals(nrs_emu_graph_t *g)
{
    memset(g->link_bytes, 0, sizeof(g->link_bytes));
    for (size_t i = 0; i < g->nops; i++) {
        const nrs_emu_op_t *op = &g->ops[i];
        if (op->type == NRS_EMU_OP_XFER || op->type == NRS_EMU_OP_COPY ||
            op->type == NRS_EMU_OP_STAGE)
            g->link_bytes[op->link] += op->row_bytes * op->rows;
        if (op->end > g->makespan)
            g->makespan = op->end;
    }
}

int nrs_emu_schedule(nrs_emu_graph_t *g, char *err, size_t errlen)
{
    sched_t S = {.err = err, .errlen = errlen};
    int rc = -1;

    nrs_emu_dmemo_init(&S.dm);
    g->ponr = -1;
    g->nops = 0;
    g->makespan = 0;
    { /* every chunk, an alloc and a free per buffer, a few comms: one allocation */
        size_t want = g->nchunks + 2 * g->nbuf + 256;
        if (want > g->opcap) {
            void *p = realloc(g->ops, want * sizeof(*g->ops));
            if (p) {
                g->ops = p;
                g->opcap = want;
            }
        }
    }
    if (g->nchunks > (size_t)NRS_EMU_MAX_CHUNKS || g->nmoves >= INT32_MAX) {
        snprintf(err, errlen, "transition graph too large to schedule (%zu chunks)", g->nchunks);
        goto out;
    }
    if (sched_init(&S, g)) {
        snprintf(err, errlen, "out of memory scheduling the transition");
        goto out;
    }
    if (check_caps(&S))
        goto out;
    if (g->nchunks) {
        nrs_emu_op_t world = {.type = NRS_EMU_OP_COMM, .src_buf = -1,
                              .dst_buf = NRS_EMU_COMM_WORLD, .rows = g->nphys, .move = -1,
                              .src_gpu = -1, .dst_gpu = -1};
        g->ncomms++;
        if (emit(&S, world))
            goto oom;
    }
    for (size_t r = 0; r < S.nres; r++)
        if (mark_dirty(&S, (int)r))
            goto oom;
    while (S.moves_left > 0) {
        while (S.dirty.n)
            if (try_start(&S))
                goto oom;
        if (S.nheap == 0) {
            if (stage_one(&S))
                goto out;
            continue;
        }
        ev_t e = heap_pop(&S);
        if (on_event(&S, e))
            goto oom;
        while (S.nheap && S.heap[0].t == e.t)
            if (on_event(&S, heap_pop(&S)))
                goto oom;
    }
    while (S.nheap) /* a stage still running when the last move ended */
        if (on_event(&S, heap_pop(&S)))
            goto oom;
    if (finish(&S))
        goto oom;
    if (g->ponr < 0)
        g->ponr = (int64_t)g->nops;
    link_totals(g);
    rc = 0;
    goto out;
oom:
    snprintf(err, errlen, "out of memory scheduling the transition");
out:
    sched_fini(&S);
    return rc;
}
