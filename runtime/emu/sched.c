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
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "emu/graph.h"

typedef struct {
    int64_t t;
    int64_t seq;
    int32_t op;    /* index in g->ops */
    int32_t stage; /* host buffer id for a stage op, else -1 */
} ev_t;

typedef struct {
    size_t c0, n, next; /* its chunks in g->chunks */
    int32_t src;        /* current source (host after staging) */
    int r[2];
    int running;
    int64_t rem; /* remaining picoseconds on its resources */
} smove_t;

typedef struct {
    int32_t *v;
    size_t n, cap;
} ivec_t;

typedef struct {
    nrs_emu_graph_t *g;
    size_t nres;
    int64_t now;
    int64_t seq, capeff;
    int64_t *rem;
    unsigned char *busy, *indirty;
    ivec_t *lists; /* moves per resource */
    ivec_t dirty;
    smove_t *mv;
    size_t moves_left;
    /* per buffer (room for one host copy of every old buffer) */
    int32_t *reads;
    unsigned char *live, *keep, *staging;
    int64_t *used, *freeable, *host_used;
    ivec_t *freeq; /* freeable old buffers per GPU */
    ev_t *heap;
    size_t nheap, heapcap;
    char *err;
    size_t errlen;
} sched_t;

static int ivec_push(ivec_t *v, int32_t x)
{
    if (v->n == v->cap) {
        size_t nc = v->cap ? v->cap * 2 : 8;
        int32_t *p = realloc(v->v, nc * sizeof(*p));
        if (!p)
            return -1;
        v->v = p;
        v->cap = nc;
    }
    v->v[v->n++] = x;
    return 0;
}

static int ev_less(const ev_t *a, const ev_t *b)
{
    return a->t < b->t || (a->t == b->t && a->seq < b->seq);
}

static int heap_push(sched_t *S, ev_t e)
{
    if (S->nheap == S->heapcap) {
        size_t nc = S->heapcap ? S->heapcap * 2 : 64;
        ev_t *p = realloc(S->heap, nc * sizeof(*p));
        if (!p)
            return -1;
        S->heap = p;
        S->heapcap = nc;
    }
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

static int64_t move_prio(const sched_t *S, const smove_t *m)
{
    int64_t a = S->rem[m->r[0]], b = m->r[1] >= 0 ? S->rem[m->r[1]] : 0;
    return a > b ? a : b;
}

static int startable(const sched_t *S, const smove_t *m)
{
    const nrs_emu_graph_t *g = S->g;
    int32_t dst = g->moves[m - S->mv].dst;
    if (m->running || m->next == m->n || S->staging[m->src])
        return 0;
    if (S->busy[m->r[0]] || (m->r[1] >= 0 && S->busy[m->r[1]]))
        return 0;
    return S->live[dst] || fits(S, g->buf[dst].b.gpu, g->buf[dst].b.bytes);
}

static int start_chunk(sched_t *S, int32_t mi)
{
    nrs_emu_graph_t *g = S->g;
    smove_t *m = &S->mv[mi];
    nrs_emu_op_t op = g->chunks[m->c0 + m->next];
    int64_t bytes = op.row_bytes * op.rows;
    int64_t d = nrs_emu_duration(g, m->r[0], bytes);

    if (!S->live[op.dst_buf] && alloc_buf(S, op.dst_buf))
        return -1;
    if (m->src != op.src_buf) { /* staged to host */
        op.src_buf = m->src;
        op.src_gpu = g->buf[m->src].b.gpu;
        op.type = NRS_EMU_OP_XFER;
        op.link = (uint8_t)nrs_emu_resources(g, op.src_gpu, op.dst_gpu, g->buf[m->src].via,
                                             (int[2]){0, 0});
    }
    op.start = S->now;
    op.end = S->now + d;
    for (int k = 0; k < 2; k++)
        if (m->r[k] >= 0) {
            S->busy[m->r[k]] = 1;
            S->rem[m->r[k]] -= d;
        }
    m->rem -= d;
    m->running = 1;
    if (heap_push(S, (ev_t){op.end, S->seq++, (int32_t)g->nops, -1}))
        return -1;
    return emit(S, op);
}

static int dirty_cmp_rem(const sched_t *S, int a, int b)
{
    if (S->rem[a] != S->rem[b])
        return S->rem[a] > S->rem[b] ? -1 : 1;
    return a < b ? -1 : a > b;
}

/* Start what can start on the resources that changed. */
static int try_start(sched_t *S)
{
    ivec_t d = S->dirty;
    S->dirty = (ivec_t){0};
    for (size_t i = 0; i < d.n; i++)
        S->indirty[d.v[i]] = 0;
    for (size_t i = 1; i < d.n; i++) { /* most loaded resource first */
        int32_t x = d.v[i];
        size_t j = i;
        while (j > 0 && dirty_cmp_rem(S, d.v[j - 1], x) > 0) {
            d.v[j] = d.v[j - 1];
            j--;
        }
        d.v[j] = x;
    }
    for (size_t i = 0; i < d.n; i++) {
        int r = d.v[i];
        ivec_t *L = &S->lists[r];
        int32_t best = -1;
        int64_t bp = 0;
        if (S->busy[r])
            continue;
        for (size_t k = 0; k < L->n;) {
            smove_t *m = &S->mv[L->v[k]];
            if (m->next == m->n || (m->r[0] != r && m->r[1] != r)) {
                L->v[k] = L->v[--L->n]; /* done or moved: drop */
                continue;
            }
            if (startable(S, m)) {
                int64_t p = move_prio(S, m);
                int32_t id = L->v[k];
                if (best < 0 || p > bp ||
                    (p == bp && (m->rem > S->mv[best].rem ||
                                 (m->rem == S->mv[best].rem && id < best)))) {
                    best = id;
                    bp = p;
                }
            }
            k++;
        }
        if (best >= 0 && start_chunk(S, best))
            goto fail;
    }
    free(d.v);
    return 0;
fail:
    free(d.v);
    return -1;
}

static int set_resources(sched_t *S, int32_t mi)
{
    nrs_emu_graph_t *g = S->g;
    smove_t *m = &S->mv[mi];
    const nrs_emu_gbuf_t *src = &g->buf[m->src];
    nrs_emu_resources(g, src->b.gpu, g->buf[g->moves[mi].dst].b.gpu, src->via, m->r);
    m->rem = 0;
    for (size_t c = m->next; c < m->n; c++) {
        const nrs_emu_op_t *op = &g->chunks[m->c0 + c];
        m->rem += nrs_emu_duration(g, m->r[0], op->row_bytes * op->rows);
    }
    for (int k = 0; k < 2; k++)
        if (m->r[k] >= 0) {
            S->rem[m->r[k]] += m->rem;
            if (ivec_push(&S->lists[m->r[k]], mi) || mark_dirty(S, m->r[k]))
                return -1;
        }
    return 0;
}

static int on_read_done(sched_t *S, int32_t src)
{
    nrs_emu_graph_t *g = S->g;
    int gpu = g->buf[src].b.gpu;
    if (--S->reads[src] > 0)
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
        for (size_t i = 0; i < g->nmoves; i++)
            if (S->mv[i].src == victim && S->mv[i].next < S->mv[i].n) {
                smove_t *m = &S->mv[i];
                for (int k = 0; k < 2; k++)
                    if (m->r[k] >= 0)
                        S->rem[m->r[k]] -= m->rem;
                m->src = host;
                if (set_resources(S, (int32_t)i))
                    return -1;
            }
        return mark_gpu_dirty(S, gpu);
    }
    smove_t *m = &S->mv[op->move];
    m->running = 0;
    m->next++;
    if (m->next == m->n)
        S->moves_left--;
    nrs_emu_resources(g, op->src_gpu, op->dst_gpu, g->buf[op->src_buf].via, r);
    for (int k = 0; k < 2; k++)
        if (r[k] >= 0) {
            S->busy[r[k]] = 0;
            if (mark_dirty(S, r[k]))
                return -1;
        }
    return on_read_done(S, op->src_buf);
}

/* Nothing runs and nothing fits: stage an old buffer of a blocked GPU. */
static int stage_one(sched_t *S)
{
    nrs_emu_graph_t *g = S->g;
    int32_t blocked = -1, victim = -1;
    for (size_t i = 0; i < g->nmoves && blocked < 0; i++)
        if (S->mv[i].next < S->mv[i].n && !S->live[g->moves[i].dst])
            blocked = (int32_t)i;
    if (blocked < 0) {
        snprintf(S->err, S->errlen, "scheduler stalled with %zu moves left", S->moves_left);
        return -1;
    }
    const nrs_emu_gbuf_t *D = &g->buf[g->moves[blocked].dst];
    int gpu = D->b.gpu;
    for (int32_t i = 0; i < g->nold; i++) {
        const nrs_emu_gbuf_t *b = &g->buf[i];
        if (b->b.gpu != gpu || !S->live[i] || S->keep[i] || S->reads[i] <= 0 || S->staging[i])
            continue;
        if (victim < 0 || b->b.bytes > g->buf[victim].b.bytes)
            victim = i;
    }
    if (victim < 0) {
        snprintf(S->err, S->errlen,
                 "GPU %d: cannot fit %lld bytes of the new state under the cap of %lld bytes "
                 "(%lld in use, nothing left to stage to host)",
                 gpu, (long long)D->b.bytes, (long long)(S->capeff + g->reserve),
                 (long long)(S->used[gpu] + g->reserve));
        return -1;
    }
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
    return emit(S, op);
}

/* --- set-up, end, communicators -------------------------------------------- */

static int check_caps(sched_t *S)
{
    nrs_emu_graph_t *g = S->g;
    int64_t *need = calloc((size_t)g->nphys + 1, sizeof(int64_t));
    int rc = 0;
    if (!need)
        return -1;
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

static int sched_init(sched_t *S, nrs_emu_graph_t *g)
{
    size_t nb = g->nbuf + (size_t)g->nold + 1, np = (size_t)g->nphys + 1;
    S->g = g;
    S->nres = (size_t)g->nphys * NRS_EMU_RES_KINDS;
    S->capeff = g->cap - g->reserve;
    S->rem = calloc(S->nres + 1, sizeof(int64_t));
    S->busy = calloc(S->nres + 1, 1);
    S->indirty = calloc(S->nres + 1, 1);
    S->lists = calloc(S->nres + 1, sizeof(ivec_t));
    S->mv = calloc(g->nmoves + 1, sizeof(smove_t));
    S->reads = calloc(nb, sizeof(int32_t));
    S->live = calloc(nb, 1);
    S->keep = calloc(nb, 1);
    S->staging = calloc(nb, 1);
    S->used = calloc(np, sizeof(int64_t));
    S->freeable = calloc(np, sizeof(int64_t));
    S->host_used = calloc((size_t)g->nnodes + 1, sizeof(int64_t));
    S->freeq = calloc(np, sizeof(ivec_t));
    g->peak = calloc(np, sizeof(int64_t));
    g->host_peak = calloc((size_t)g->nnodes + 1, sizeof(int64_t));
    if (!S->rem || !S->busy || !S->indirty || !S->lists || !S->mv || !S->reads || !S->live ||
        !S->keep || !S->staging || !S->used || !S->freeable || !S->host_used || !S->freeq ||
        !g->peak || !g->host_peak)
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
    for (size_t c = 0; c < g->nchunks; c++)
        S->reads[g->chunks[c].src_buf]++;
    for (size_t c = 0; c < g->nchunks;) { /* chunks of a move are consecutive */
        int32_t mi = g->chunks[c].move;
        size_t e = c;
        while (e < g->nchunks && g->chunks[e].move == mi)
            e++;
        S->mv[mi].c0 = c;
        S->mv[mi].n = e - c;
        c = e;
    }
    for (size_t i = 0; i < g->nmoves; i++) {
        S->mv[i].src = g->moves[i].src;
        if (S->mv[i].n)
            S->moves_left++;
        if (set_resources(S, (int32_t)i))
            return -1;
    }
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
    free(S->rem);
    free(S->busy);
    free(S->indirty);
    free(S->lists);
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
    free(S->heap);
}

/* GPUs of engine e of st, rank-major (replica, stage, tensor rank). */
static int engine_gpus(const nrs_emu_state_t *st, int e, int *gpus, int n)
{
    for (int i = 0; i < n; i++)
        gpus[i] = -1;
    for (size_t i = 0; i < st->nbuf; i++) {
        const nrs_emu_buf_t *b = &st->buf[i];
        const nrs_layout_t *l = &st->eng[b->engine].lay;
        if (b->engine == e)
            gpus[b->replica * l->tp * l->pp + b->rank] = b->gpu;
    }
    return 0;
}

static int engine_changed(const nrs_emu_graph_t *g, int e)
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
            return 1;
        engine_gpus(&g->from, f, a, n);
        engine_gpus(&g->to, e, a + n, n);
        changed = memcmp(a, a + n, sizeof(int) * (size_t)n) != 0;
        for (int i = 0; i < n && !changed; i++)
            for (int k = 0; k < g->nold; k++)
                if (g->buf[k].lost && g->buf[k].b.gpu == a[i])
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
    for (int e = 0; e < g->to.nengines; e++) {
        const nrs_layout_t *l = &g->to.eng[e].lay;
        int kinds[3][2] = {{NRS_EMU_COMM_TP, l->tp}, {NRS_EMU_COMM_PP, l->pp},
                           {NRS_EMU_COMM_DP, l->dp}};
        if (!engine_changed(g, e))
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
                if (emit(S, op))
                    return -1;
            }
        }
    }
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

    g->ponr = -1;
    g->nops = 0;
    g->makespan = 0;
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
