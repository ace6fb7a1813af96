/* Transition graph construction (docs/transitions.md §2).
 *
 * Pure function of (old state, new state, spec, options): every iteration is
 * over arrays sorted by integer keys with the buffer id as the last key, so
 * the graph never depends on addresses or hash order.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "emu/graph.h"


int nrs_emu_node_of(const nrs_emu_graph_t *g, int gpu)
{
    return gpu >= 0 ? gpu / g->gpn : -1 - gpu;
}

int nrs_emu_resources(const nrs_emu_graph_t *g, int src_gpu, int dst_gpu, int via, int r[2])
{
    const int K = NRS_EMU_RES_KINDS;
    r[1] = -1;
    if (src_gpu < 0) { /* from host memory */
        if (nrs_emu_node_of(g, src_gpu) == nrs_emu_node_of(g, dst_gpu)) {
            r[0] = dst_gpu * K + NRS_EMU_RES_H2D;
            return NRS_LINK_HOST;
        }
        r[0] = via * K + NRS_EMU_RES_INTER_TX;
        r[1] = dst_gpu * K + NRS_EMU_RES_INTER_RX;
        return NRS_LINK_INTER;
    }
    if (dst_gpu < 0) {
        r[0] = src_gpu * K + NRS_EMU_RES_D2H;
        return NRS_LINK_HOST;
    }
    if (src_gpu == dst_gpu) {
        r[0] = src_gpu * K + NRS_EMU_RES_HBM;
        return NRS_LINK_LOCAL;
    }
    if (nrs_emu_node_of(g, src_gpu) == nrs_emu_node_of(g, dst_gpu)) {
        r[0] = src_gpu * K + NRS_EMU_RES_INTRA_TX;
        r[1] = dst_gpu * K + NRS_EMU_RES_INTRA_RX;
        return NRS_LINK_INTRA;
    }
    r[0] = src_gpu * K + NRS_EMU_RES_INTER_TX;
    r[1] = dst_gpu * K + NRS_EMU_RES_INTER_RX;
    return NRS_LINK_INTER;
}

int64_t nrs_emu_duration(const nrs_emu_graph_t *g, int res, int64_t bytes)
{
    int64_t ps = llround((double)bytes / g->bw[res % NRS_EMU_RES_KINDS]);
    return ps > 0 ? ps : 1;
}


int nrs_emu_push_op(nrs_emu_graph_t *g, const nrs_emu_op_t *op)
{
    NRS_GROW(g->ops, g->nops, g->opcap, 1);
    g->ops[g->nops++] = *op;
    return 0;
}

int nrs_emu_push_buf(nrs_emu_graph_t *g, const nrs_emu_gbuf_t *b)
{
    NRS_GROW(g->buf, g->nbuf, g->bufcap, 1);
    g->buf[g->nbuf++] = *b;
    return 0;
}

static int push_move(nrs_emu_graph_t *g, int32_t src, int32_t dst, const nrs_emu_rect_t *r)
{
    NRS_GROW(g->moves, g->nmoves, g->movecap, 1);
    g->moves[g->nmoves++] = (nrs_emu_move_t){src, dst, *r};
    return 0;
}

static int push_lost(nrs_emu_graph_t *g, const nrs_emu_buf_t *b, const nrs_emu_rect_t *r)
{
    NRS_GROW(g->lost, g->nlost, g->lostcap, 1);
    g->lost[g->nlost++] = (nrs_emu_lost_t){b->role, b->tensor, b->kind, *r};
    return 0;
}

/* --- sorted views of the old buffers ------------------------------------- */

typedef struct {
    int32_t k[9]; /* comparison keys, id last */
} skey_t;

static int key_cmp(const void *a, const void *b)
{
    const skey_t *x = a, *y = b;
    for (int i = 0; i < 9; i++)
        if (x->k[i] != y->k[i])
            return x->k[i] < y->k[i] ? -1 : 1;
    return 0;
}

/* Sources: grouped by (role, tensor, kind), then by replica group. */
static void src_key(const nrs_emu_buf_t *b, int32_t id, skey_t *k)
{
    *k = (skey_t){{b->role, b->tensor, b->kind, b->engine, b->set, b->box.r0, b->box.c0, b->gpu,
                  id}};
}

/* Old actor.generate weights (a pool of their own) are one optimizer step
 * behind actor.train's: transitions run at the step boundary, after the train
 * phase and before the weight sync. They are valid state only for generation
 * destinations (which the sync overwrites anyway); trained and inference
 * engines take their weights from the trained engine's buffers. The weight
 * sync graph's sources are actor.train's, so this never restricts it. */
static int old_is_gen(const nrs_emu_graph_t *g, int32_t old)
{
    return g->from.eng[g->buf[old].b.engine].ms == NRS_MS_ACTOR_GENERATE;
}

static int new_is_gen(const nrs_emu_graph_t *g, int32_t dst)
{
    return g->to.eng[g->buf[dst].b.engine].ms == NRS_MS_ACTOR_GENERATE;
}

/* --- uncovered regions ----------------------------------------------------- */

typedef struct {
    nrs_emu_rect_t *r;
    size_t n, cap;
} rects_t;

static int rects_push(rects_t *v, const nrs_emu_rect_t *r)
{
    if (nrs_emu_rect_area(r) == 0)
        return 0;
    NRS_GROW(v->r, v->n, v->cap, 1);
    v->r[v->n++] = *r;
    return 0;
}

/* Replace u by u minus i (i inside u): up to four pieces, in a fixed order. */
static int rects_cut(rects_t *out, const nrs_emu_rect_t *u, const nrs_emu_rect_t *i)
{
    nrs_emu_rect_t top = {u->r0, i->r0, u->c0, u->c1}, bot = {i->r1, u->r1, u->c0, u->c1};
    nrs_emu_rect_t lft = {i->r0, i->r1, u->c0, i->c0}, rgt = {i->r0, i->r1, i->c1, u->c1};
    return rects_push(out, &top) || rects_push(out, &lft) || rects_push(out, &rgt) ||
           rects_push(out, &bot);
}

/* --- source selection ------------------------------------------------------ */

/* Runs tried per class of identical geometry: all of a class up to TRY_ALL,
 * else up to TRY_NODE on the destination's node and TRY_ROTATE spread ones. */
enum { TRY_ALL = 8, TRY_NODE = 8, TRY_ROTATE = 4 };

/* Candidate index. The sorted source keys fall into runs, one per replica
 * group (role, tensor, kind, engine, set). Runs of one engine usually hold
 * the same boxes (every dp replica of a model-stage has the same geometry),
 * so consecutive equal runs share a leader: the boxes meeting a destination
 * are searched once in the leader (r0 is sorted inside a run, and no box is
 * taller than the run's maxh), and the same positions are used in the others. */
typedef struct {
    size_t start, len;
    int32_t role, tensor, kind;
    int32_t maxh;   /* tallest box */
    size_t leader;  /* first run of its class of identical geometry */
    size_t ncls;    /* leader: runs in its class (they are consecutive) */
    int32_t node;   /* node of its first buffer's GPU */
} run_t;

typedef struct {
    int64_t left; /* area it leaves uncovered */
    int64_t cost; /* the most loaded resource it touches, after */
    size_t a;     /* tie-break: class order, then pick order inside the class */
    size_t run;   /* its run, and its candidates' positions in offs */
    size_t o0, no;
} group_t;

typedef struct {
    nrs_emu_graph_t *g;
    int64_t *load;   /* picoseconds per resource so far */
    rects_t unc, tmp;
    const skey_t *keys;
    nrs_emu_rect_t *kbox; /* box of keys[i] */
    run_t *runs;
    size_t nruns;
    size_t *offs;    /* candidate positions inside a run, per class */
    size_t noffs, offscap;
    group_t *grp;
    size_t grpcap;
    int32_t *cand;   /* old buffer ids of one group */
    size_t ncand, candcap;
    int32_t *touched; /* resources changed by a dry run */
    int64_t *undo;
    size_t ntouched, touchcap, undocap;
    int32_t *order;
    size_t ordercap;
    size_t *bynode;  /* per class [leader, leader + ncls): its runs by (node, run) */
    int32_t *stamp;  /* per run: last destination it was tried for, + 1 */
    nrs_emu_dmemo_t dm;
} sel_t;

static int touch(sel_t *S, int r, int64_t add)
{
    NRS_GROW(S->touched, S->ntouched, S->touchcap, 1);
    NRS_GROW(S->undo, S->ntouched, S->undocap, 1);
    S->touched[S->ntouched] = r;
    S->undo[S->ntouched++] = S->load[r];
    S->load[r] += add;
    return 0;
}

static int64_t move_cost(sel_t *S, int32_t src, int32_t dst, int64_t bytes)
{
    const nrs_emu_graph_t *g = S->g;
    int r[2];
    int64_t c = 0;
    nrs_emu_resources(g, g->buf[src].b.gpu, g->buf[dst].b.gpu, -1, r);
    for (int k = 0; k < 2; k++)
        if (r[k] >= 0) {
            int64_t v = S->load[r[k]] + nrs_emu_duration_m(g, &S->dm, r[k], bytes);
            c = v > c ? v : c;
        }
    return c;
}

/* Cover what is left of dst's box from candidates cand[0, n) (one replica
 * group), cheapest first. Dry: only loads change (and are undone by the
 * caller). Returns -1 on allocation failure. */
static int cover_from(sel_t *S, int32_t dst, const int32_t *cand, size_t n, int dry,
                      int64_t *cost)
{
    nrs_emu_graph_t *g = S->g;
    int esize = g->buf[dst].b.esize;

    NRS_GROW(S->order, 0, S->ordercap, n);
    for (size_t i = 0; i < n; i++)
        S->order[i] = cand[i];
    /* cheapest candidate first (insertion sort: groups are small) */
    for (size_t i = 1; i < n; i++) {
        int32_t x = S->order[i];
        nrs_emu_rect_t m;
        nrs_emu_rect_meet(&g->buf[x].b.box, &g->buf[dst].b.box, &m);
        int64_t cx = move_cost(S, x, dst, nrs_emu_rect_area(&m) * esize);
        size_t j = i;
        while (j > 0) {
            int32_t y = S->order[j - 1];
            nrs_emu_rect_meet(&g->buf[y].b.box, &g->buf[dst].b.box, &m);
            int64_t cy = move_cost(S, y, dst, nrs_emu_rect_area(&m) * esize);
            if (cy < cx || (cy == cx && g->buf[y].b.gpu <= g->buf[x].b.gpu))
                break;
            S->order[j] = y;
            j--;
        }
        S->order[j] = x;
    }
    *cost = 0;
    for (size_t i = 0; i < n && S->unc.n; i++) {
        int32_t src = S->order[i];
        S->tmp.n = 0;
        for (size_t u = 0; u < S->unc.n; u++) {
            nrs_emu_rect_t m;
            if (!nrs_emu_rect_meet(&S->unc.r[u], &g->buf[src].b.box, &m)) {
                if (rects_push(&S->tmp, &S->unc.r[u]))
                    return -1;
                continue;
            }
            int r[2];
            int64_t bytes = nrs_emu_rect_area(&m) * esize;
            nrs_emu_resources(g, g->buf[src].b.gpu, g->buf[dst].b.gpu, -1, r);
            for (int k = 0; k < 2; k++)
                if (r[k] >= 0) {
                    int64_t d = nrs_emu_duration_m(g, &S->dm, r[k], bytes);
                    if (dry ? touch(S, r[k], d) : (S->load[r[k]] += d, 0))
                        return -1;
                    if (S->load[r[k]] > *cost)
                        *cost = S->load[r[k]];
                }
            if ((!dry && push_move(g, src, dst, &m)) || rects_cut(&S->tmp, &S->unc.r[u], &m))
                return -1;
        }
        rects_t t = S->unc;
        S->unc = S->tmp;
        S->tmp = t;
    }
    return 0;
}

static int64_t unc_area(const sel_t *S)
{
    int64_t a = 0;
    for (size_t i = 0; i < S->unc.n; i++)
        a += nrs_emu_rect_area(&S->unc.r[i]);
    return a;
}

static int group_cmp(const void *x, const void *y)
{
    const group_t *p = x, *q = y;
    if (p->left != q->left)
        return p->left < q->left ? -1 : 1;
    if (p->cost != q->cost)
        return p->cost < q->cost ? -1 : 1;
    return p->a < q->a ? -1 : p->a > q->a;
}

static int build_index(sel_t *S, const skey_t *keys, size_t nkeys)
{
    const nrs_emu_graph_t *g = S->g;
    S->keys = keys;
    S->kbox = malloc(sizeof(*S->kbox) * (nkeys + 1));
    S->runs = malloc(sizeof(*S->runs) * (nkeys + 1));
    if (!S->kbox || !S->runs)
        return -1;
    for (size_t i = 0; i < nkeys; i++)
        S->kbox[i] = g->buf[keys[i].k[8]].b.box;
    for (size_t i = 0; i < nkeys;) {
        size_t j = i;
        int32_t h = 0;
        while (j < nkeys && !memcmp(keys[j].k, keys[i].k, 5 * sizeof(int32_t))) {
            int32_t hj = S->kbox[j].r1 - S->kbox[j].r0;
            h = hj > h ? hj : h;
            j++;
        }
        run_t *R = &S->runs[S->nruns];
        *R = (run_t){i, j - i, keys[i].k[0], keys[i].k[1], keys[i].k[2], h, S->nruns, 1,
                     nrs_emu_node_of(g, keys[i].k[7])};
        if (S->nruns) { /* same geometry as the previous run's leader: share it */
            run_t *L = &S->runs[S->runs[S->nruns - 1].leader];
            if (!memcmp(keys[L->start].k, keys[i].k, 4 * sizeof(int32_t)) && L->len == R->len &&
                L->maxh == R->maxh &&
                !memcmp(&S->kbox[L->start], &S->kbox[i], R->len * sizeof(*S->kbox))) {
                R->leader = S->runs[S->nruns - 1].leader;
                L->ncls++;
            }
        }
        S->nruns++;
        i = j;
    }
    S->bynode = malloc(sizeof(*S->bynode) * (S->nruns + 1));
    S->stamp = calloc(S->nruns + 1, sizeof(*S->stamp));
    if (!S->bynode || !S->stamp)
        return -1;
    for (size_t l = 0; l < S->nruns; l += S->runs[l].ncls) { /* counting sort by node */
        size_t n = S->runs[l].ncls;
        for (size_t i = 0; i < n; i++) {
            size_t j = i; /* runs of one engine come in GPU order: mostly sorted already */
            while (j > 0 && S->runs[S->bynode[l + j - 1]].node > S->runs[l + i].node) {
                S->bynode[l + j] = S->bynode[l + j - 1];
                j--;
            }
            S->bynode[l + j] = l + i;
        }
    }
    return 0;
}

/* Positions (in run R) of the boxes meeting box, appended to S->offs. */
static int run_meets(sel_t *S, const run_t *R, const nrs_emu_rect_t *box)
{
    const nrs_emu_rect_t *kb = S->kbox + R->start;
    int64_t from = (int64_t)box->r0 - R->maxh; /* boxes starting at or above it end above box */
    size_t lo = 0, hi = R->len;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (kb[mid].r0 <= from)
            lo = mid + 1;
        else
            hi = mid;
    }
    for (size_t i = lo; i < R->len && kb[i].r0 < box->r1; i++) {
        nrs_emu_rect_t m;
        if (!nrs_emu_rect_meet(&kb[i], box, &m))
            continue;
        NRS_GROW(S->offs, S->noffs, S->offscap, 1);
        S->offs[S->noffs++] = i;
    }
    return 0;
}

/* Candidate ids of group G, in key order, into S->cand. */
static int group_cands(sel_t *S, const group_t *G)
{
    const run_t *R = &S->runs[G->run];
    NRS_GROW(S->cand, 0, S->candcap, G->no);
    for (size_t i = 0; i < G->no; i++)
        S->cand[i] = S->keys[R->start + S->offs[G->o0 + i]].k[8];
    S->ncand = G->no;
    return 0;
}

/* Dry run of one group: what it leaves uncovered and its most loaded
 * resource after. One candidate (the common case) is computed directly, with
 * the same integer sums as cover_from. */
static int group_try(sel_t *S, int32_t dst, group_t *G, const int64_t *dur)
{
    const nrs_emu_graph_t *g = S->g;
    const nrs_emu_buf_t *D = &g->buf[dst].b;
    if (G->no == 1) {
        int32_t id = S->keys[S->runs[G->run].start + S->offs[G->o0]].k[8];
        int r[2];
        nrs_emu_rect_t m;
        nrs_emu_rect_meet(&g->buf[id].b.box, &D->box, &m);
        nrs_emu_resources(g, g->buf[id].b.gpu, D->gpu, -1, r);
        G->cost = 0;
        for (int k = 0; k < 2; k++)
            if (r[k] >= 0) {
                int64_t v = S->load[r[k]] + dur[r[k] % NRS_EMU_RES_KINDS];
                G->cost = v > G->cost ? v : G->cost;
            }
        G->left = nrs_emu_rect_area(&D->box) - nrs_emu_rect_area(&m);
        return 0;
    }
    S->unc.n = 0;
    S->ntouched = 0;
    if (group_cands(S, G) || rects_push(&S->unc, &D->box) ||
        cover_from(S, dst, S->cand, S->ncand, 1, &G->cost))
        return -1;
    while (S->ntouched > 0) {
        S->ntouched--;
        S->load[S->touched[S->ntouched]] = S->undo[S->ntouched];
    }
    G->left = unc_area(S);
    return 0;
}

static int select_sources(sel_t *S, int32_t dst)
{
    nrs_emu_graph_t *g = S->g;
    const nrs_emu_buf_t *D = &g->buf[dst].b;
    size_t lo = 0, hi = S->nruns, ng = 0, best = 0;
    int64_t dur[NRS_EMU_RES_KINDS];
    int64_t mbytes = -1; /* bytes of the one-candidate meet durations are for */

    while (lo < hi) { /* first run of (role, tensor, kind) */
        size_t mid = (lo + hi) / 2;
        const run_t *R = &S->runs[mid];
        int c = R->role != D->role ? (R->role < D->role ? -1 : 1)
                : R->tensor != D->tensor ? (R->tensor < D->tensor ? -1 : 1)
                : R->kind != D->kind ? (R->kind < D->kind ? -1 : 1) : 0;
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    S->noffs = 0;
    int32_t stamp = dst + 1;
    int dnode = nrs_emu_node_of(g, D->gpu), dgen = new_is_gen(g, dst);
    for (size_t l = lo; l < S->nruns;) {
        const run_t *L = &S->runs[l];
        if (L->role != D->role || L->tensor != D->tensor || L->kind != D->kind)
            break;
        size_t n = L->ncls, o0 = S->noffs, no;
        /* a class is one engine: stale generation weights feed only generation */
        if (!dgen && old_is_gen(g, S->keys[L->start].k[8])) {
            l += n;
            continue;
        }
        if (run_meets(S, L, &D->box))
            return -1;
        no = S->noffs - o0;
        mbytes = -1;
        if (no) {
            /* Every run of a class has the same boxes, so the same coverage:
             * small classes are tried in full; in a large one, the runs on
             * the destination's node and TRY_ROTATE runs spread from replica
             * (d mod n) stand for it (the least loaded of them wins). */
            size_t pick[TRY_NODE + TRY_ROTATE], np = 0;
            if (n <= TRY_ALL) {
                for (size_t k = 0; k < n; k++)
                    pick[np++] = l + k;
            } else {
                size_t a = 0, b = n; /* first run of the class on dnode */
                while (a < b) {
                    size_t mid = (a + b) / 2;
                    if (S->runs[S->bynode[l + mid]].node < dnode)
                        a = mid + 1;
                    else
                        b = mid;
                }
                for (; a < n && np < TRY_NODE && S->runs[S->bynode[l + a]].node == dnode; a++)
                    pick[np++] = S->bynode[l + a];
                size_t base = ((size_t)D->replica + (size_t)D->rank) % n;
                for (size_t k = 0; k < TRY_ROTATE; k++)
                    pick[np++] = l + (base + k * n / TRY_ROTATE) % n;
            }
            for (size_t k = 0; k < np; k++) {
                size_t i = pick[k];
                if (S->stamp[i] == stamp)
                    continue;
                S->stamp[i] = stamp;
                NRS_GROW(S->grp, ng, S->grpcap, 1);
                group_t *G = &S->grp[ng];
                /* ties go to the class met first, then to the pick order:
                 * node-local runs, then replica (d mod n) and the spread */
                *G = (group_t){0, 0, l * (TRY_NODE + TRY_ROTATE) + k, i, o0, no};
                if (no == 1 && mbytes < 0) { /* durations of this class's one meet */
                    nrs_emu_rect_t m;
                    nrs_emu_rect_meet(&S->kbox[L->start + S->offs[o0]], &D->box, &m);
                    mbytes = nrs_emu_rect_area(&m) * D->esize;
                    for (int r = 0; r < NRS_EMU_RES_KINDS; r++)
                        dur[r] = nrs_emu_duration(g, r, mbytes);
                }
                if (group_try(S, dst, G, dur))
                    return -1;
                if (ng && group_cmp(G, &S->grp[best]) < 0)
                    best = ng;
                ng++;
            }
        }
        l += n;
    }
    S->unc.n = 0;
    if (rects_push(&S->unc, &D->box))
        return -1;
    if (ng && S->grp[best].left == 0) { /* the first in order covers it all */
        int64_t c;
        return group_cands(S, &S->grp[best]) ||
               cover_from(S, dst, S->cand, S->ncand, 0, &c);
    }
    if (ng > 1)
        qsort(S->grp, ng, sizeof(*S->grp), group_cmp);
    for (size_t i = 0; i < ng && S->unc.n; i++) {
        int64_t c;
        if (group_cands(S, &S->grp[i]) || cover_from(S, dst, S->cand, S->ncand, 0, &c))
            return -1;
    }
    for (size_t i = 0; i < S->unc.n; i++)
        if (push_lost(g, D, &S->unc.r[i]))
            return -1;
    return 0;
}

/* --- buffers, keeps, chunks ------------------------------------------------ */

static int add_buffers(nrs_emu_graph_t *g, const nrs_emu_opts_t *o, char *err, size_t errlen)
{
    size_t np = (size_t)g->nphys;
    NRS_GROW(g->buf, 0, g->bufcap, g->from.nbuf + g->to.nbuf + 64); /* one allocation */
    unsigned char *lost = calloc(np + 1, 1); /* per physical GPU */
    if (!lost)
        return -1;
    for (int i = 0; o && i < o->nlost; i++)
        if (o->lost[i] >= 0 && (size_t)o->lost[i] < np)
            lost[o->lost[i]] = 1;
#define LOST(gpu) ((gpu) >= 0 && (size_t)(gpu) < np && lost[gpu])
    for (size_t i = 0; i < g->from.nbuf; i++)
        g->buf[i] = (nrs_emu_gbuf_t){g->from.buf[i], -1, -1, NRS_EMU_ORIGIN_OLD,
                                     (int8_t)(LOST(g->from.buf[i].gpu) ||
                                              (o && o->missing && i < o->nmissing &&
                                               o->missing[i]))};
    g->nbuf = g->from.nbuf;
    g->nold = (int32_t)g->nbuf;
    for (size_t i = 0; i < g->to.nbuf; i++) {
        const nrs_emu_buf_t *b = &g->to.buf[i];
        if (LOST(b->gpu)) {
            snprintf(err, errlen, "new plan places %s state on lost GPU %d",
                     nrs_ms_name(g->to.eng[b->engine].ms), b->gpu);
            free(lost);
            return -2;
        }
        g->buf[g->nbuf++] = (nrs_emu_gbuf_t){*b, -1, -1, NRS_EMU_ORIGIN_NEW, 0};
    }
#undef LOST
    free(lost);
    g->nnew = (int32_t)(g->nbuf - (size_t)g->nold);
    return 0;
}

/* Insertion sort of k[0, n) by key_cmp (short, nearly sorted segments). */
static void isort_keys(skey_t *k, size_t n)
{
    for (size_t i = 1; i < n; i++) {
        skey_t x = k[i];
        size_t j = i;
        while (j > 0 && key_cmp(&k[j - 1], &x) > 0) {
            k[j] = k[j - 1];
            j--;
        }
        k[j] = x;
    }
}

/* Source keys of the surviving old buffers, sorted by key_cmp. The result is
 * the one total order; the work is cut by its structure: a stable counting
 * sort on (role, tensor, kind, engine) first, then each run of one replica
 * group (set) is sorted on its own (a handful of boxes, or one ZeRO-1 kind). */
static skey_t *src_keys(const nrs_emu_graph_t *g, size_t *n)
{
    int32_t nt = 1, ne = 1;
    for (int r = 0; r < NRS_ROLE_COUNT; r++)
        if (g->models[r].present && nrs_emu_tensor_count(&g->models[r]) > nt)
            nt = nrs_emu_tensor_count(&g->models[r]);
    for (int32_t i = 0; i < g->nold; i++) {
        const nrs_emu_buf_t *b = &g->buf[i].b;
        if (b->tensor >= nt)
            nt = b->tensor + 1;
        if (b->engine >= ne)
            ne = b->engine + 1;
    }
    size_t nb = (size_t)NRS_ROLE_COUNT * (size_t)nt * NRS_EMU_KIND_COUNT * (size_t)ne;
    skey_t *k = malloc(sizeof(*k) * ((size_t)g->nold + 1));
    size_t *off = calloc(nb + 2, sizeof(size_t));
    *n = 0;
    if (!k || !off) {
        free(k);
        free(off);
        return NULL;
    }
#define BUCKET(b) ((((size_t)(b)->role * (size_t)nt + (size_t)(b)->tensor) * NRS_EMU_KIND_COUNT + \
                    (b)->kind) * (size_t)ne + (size_t)(b)->engine)
    for (int32_t i = 0; i < g->nold; i++)
        if (!g->buf[i].lost)
            off[BUCKET(&g->buf[i].b) + 1]++;
    for (size_t i = 0; i < nb; i++)
        off[i + 1] += off[i];
    for (int32_t i = 0; i < g->nold; i++)
        if (!g->buf[i].lost)
            src_key(&g->buf[i].b, i, &k[off[BUCKET(&g->buf[i].b)]++]);
#undef BUCKET
    *n = off[nb];
    free(off);
    for (size_t i = 0; i < *n;) { /* runs of equal (role, tensor, kind, engine, set) */
        size_t j = i + 1;
        while (j < *n && !memcmp(k[j].k, k[i].k, 5 * sizeof(int32_t)))
            j++;
        if (j - i <= 64)
            isort_keys(k + i, j - i);
        else
            qsort(k + i, j - i, sizeof(*k), key_cmp);
        i = j;
    }
    return k;
}

/* A new buffer identical to an old one on the same GPU (same role, tensor,
 * kind, box) is the old one: the lowest-id such old buffer not yet taken,
 * and never an old generation buffer for a non-generation one (old_is_gen).
 * Buffers are matched GPU by GPU through a small open-addressing table of
 * that GPU's old buffers, inserted in id order, so equal keys lie along a
 * probe sequence in id order and the first untaken one found is the lowest.
 * The table is only an index: the result does not depend on it. */
static uint32_t keep_hash(const nrs_emu_buf_t *b)
{
    uint64_t h = (uint64_t)(uint32_t)b->tensor * 0x9e3779b97f4a7c15ull;
    h ^= ((uint64_t)(uint16_t)b->role << 8 | b->kind) + 0x632be59bd9b4e019ull + (h << 6) + (h >> 2);
    h ^= ((uint64_t)(uint32_t)b->box.r0 << 32 | (uint32_t)b->box.r1) * 0xff51afd7ed558ccdull;
    h ^= ((uint64_t)(uint32_t)b->box.c0 << 32 | (uint32_t)b->box.c1) * 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 29;
    return (uint32_t)h;
}

static int keep_same(const nrs_emu_buf_t *a, const nrs_emu_buf_t *b)
{
    return a->tensor == b->tensor && a->role == b->role && a->kind == b->kind &&
           a->box.r0 == b->box.r0 && a->box.r1 == b->box.r1 && a->box.c0 == b->box.c0 &&
           a->box.c1 == b->box.c1;
}

static int find_keeps(nrs_emu_graph_t *g)
{
    size_t np = (size_t)g->nphys;
    int32_t nb = g->nold + g->nnew;
    size_t *off = calloc(np + 2, sizeof(size_t)), *noff = calloc(np + 2, sizeof(size_t));
    int32_t *ids = malloc(sizeof(int32_t) * ((size_t)nb + 1));
    int32_t *tab = NULL;
    size_t tabcap = 0;
    int rc = -1;

    if (!off || !noff || !ids)
        goto fail;
    for (int32_t i = 0; i < g->nold; i++) /* by GPU, in id order (old, then new) */
        if (!g->buf[i].lost)
            off[g->buf[i].b.gpu + 1]++;
    for (int32_t j = g->nold; j < nb; j++)
        noff[g->buf[j].b.gpu + 1]++;
    for (size_t p = 0; p < np; p++) {
        off[p + 1] += off[p];
        noff[p + 1] += noff[p];
    }
    size_t nold = off[np];
    for (size_t p = 0; p <= np; p++)
        noff[p] += nold;
    {
        size_t *co = malloc(sizeof(size_t) * (2 * np + 2));
        if (!co)
            goto fail;
        memcpy(co, off, sizeof(size_t) * np);
        memcpy(co + np, noff, sizeof(size_t) * np);
        for (int32_t i = 0; i < g->nold; i++)
            if (!g->buf[i].lost)
                ids[co[g->buf[i].b.gpu]++] = i;
        for (int32_t j = g->nold; j < nb; j++)
            ids[co[np + (size_t)g->buf[j].b.gpu]++] = j;
        free(co);
    }
    for (size_t p = 0; p < np; p++) {
        size_t no = off[p + 1] - off[p], nn = noff[p + 1] - noff[p], cap = 16;
        if (!no || !nn)
            continue;
        while (cap < 2 * no)
            cap *= 2;
        if (cap > tabcap) {
            free(tab);
            if (!(tab = malloc(sizeof(int32_t) * cap)))
                goto fail;
            tabcap = cap;
        }
        memset(tab, 0, sizeof(int32_t) * cap); /* 0: empty; id + 1; taken: -(id + 1) */
        for (size_t k = off[p]; k < off[p + 1]; k++) {
            size_t h = keep_hash(&g->buf[ids[k]].b) & (cap - 1);
            while (tab[h] != 0)
                h = (h + 1) & (cap - 1);
            tab[h] = ids[k] + 1;
        }
        for (size_t k = noff[p]; k < noff[p + 1]; k++) {
            int32_t j = ids[k];
            const nrs_emu_buf_t *b = &g->buf[j].b;
            for (size_t h = keep_hash(b) & (cap - 1); tab[h] != 0; h = (h + 1) & (cap - 1))
                if (tab[h] > 0 && keep_same(&g->buf[tab[h] - 1].b, b) &&
                    (!old_is_gen(g, tab[h] - 1) || new_is_gen(g, j))) {
                    g->buf[j].alias = tab[h] - 1;
                    tab[h] = -tab[h];
                    break;
                }
        }
    }
    rc = 0;
fail:
    free(off);
    free(noff);
    free(ids);
    free(tab);
    return rc;
}

/* How move mi is cut: whole rows per chunk, or rows longer than a chunk in
 * pieces; a range contiguous on both sides is one long row. Returns its
 * chunks, counted in 64 bits (k->n holds them only up to NRS_EMU_MAX_CHUNKS,
 * which the caller checks). */
static int64_t chunk_move(nrs_emu_graph_t *g, int32_t mi)
{
    const nrs_emu_move_t *mv = &g->moves[mi];
    const nrs_emu_buf_t *S = &g->buf[mv->src].b, *D = &g->buf[mv->dst].b;
    const nrs_emu_rect_t *R = &mv->box;
    int64_t es = D->esize, sw = S->box.c1 - S->box.c0, dw = D->box.c1 - D->box.c0;
    int64_t row = (R->c1 - R->c0) * es, rows = R->r1 - R->r0, ch = g->chunk;
    int r[2];
    nrs_emu_mchunk_t *k = &g->mch[mi];
    nrs_emu_op_t *op = &k->op;

    memset(k, 0, sizeof(*k));
    op->link = (uint8_t)nrs_emu_resources(g, S->gpu, D->gpu, -1, r);
    op->type = S->gpu == D->gpu ? NRS_EMU_OP_COPY : NRS_EMU_OP_XFER;
    op->src_buf = mv->src;
    op->dst_buf = mv->dst;
    op->src_gpu = S->gpu;
    op->dst_gpu = D->gpu;
    op->move = mi;
    op->src_off = ((R->r0 - S->box.r0) * sw + (R->c0 - S->box.c0)) * es;
    op->dst_off = ((R->r0 - D->box.r0) * dw + (R->c0 - D->box.c0)) * es;
    op->src_pitch = sw * es;
    op->dst_pitch = dw * es;
    if (row == op->src_pitch && row == op->dst_pitch) { /* one contiguous range */
        row *= rows;
        rows = 1;
    }
    op->rows = (int32_t)rows;
    op->row_bytes = row;
    int64_t n;
    if (row <= ch) { /* whole rows per chunk */
        k->per = ch / row;
        n = (rows + k->per - 1) / k->per;
    } else { /* rows longer than a chunk: pieces of rows */
        k->npr = (row + ch - 1) / ch;
        n = rows * k->npr;
    }
    k->n = (uint32_t)(n <= NRS_EMU_MAX_CHUNKS ? n : 0);
    return n;
}

void nrs_emu_chunk(const nrs_emu_graph_t *g, size_t mi, size_t c, nrs_emu_op_t *out)
{
    const nrs_emu_mchunk_t *k = &g->mch[mi];
    *out = k->op;
    if (k->per) {
        int64_t i = (int64_t)c * k->per;
        out->rows = (int32_t)(k->op.rows - i < k->per ? k->op.rows - i : k->per);
        out->src_off += i * k->op.src_pitch;
        out->dst_off += i * k->op.dst_pitch;
        return;
    }
    int64_t i = (int64_t)c / k->npr, o = ((int64_t)c % k->npr) * g->chunk;
    out->rows = 1;
    out->row_bytes = k->op.row_bytes - o < g->chunk ? k->op.row_bytes - o : g->chunk;
    out->src_off += i * k->op.src_pitch + o;
    out->dst_off += i * k->op.dst_pitch + o;
}

int64_t nrs_emu_chunks_ps(const nrs_emu_graph_t *g, nrs_emu_dmemo_t *m, size_t mi, size_t from,
                          int res)
{
    const nrs_emu_mchunk_t *k = &g->mch[mi];
    int64_t n = k->n, f = (int64_t)from;
    if (f >= n)
        return 0;
    if (k->per) { /* all full but perhaps the last */
        int64_t rest = k->op.rows - (n - 1) * k->per, full = k->per * k->op.row_bytes;
        return (n - 1 - f) * nrs_emu_duration_m(g, m, res, full) +
               nrs_emu_duration_m(g, m, res, rest * k->op.row_bytes);
    }
    /* pieces: in each row npr - 1 full ones and a last one */
    int64_t last = k->op.row_bytes - (k->npr - 1) * g->chunk;
    int64_t lasts = n / k->npr - f / k->npr; /* last pieces in [f, n): rows ending in it */
    return (n - f - lasts) * nrs_emu_duration_m(g, m, res, g->chunk) +
           lasts * nrs_emu_duration_m(g, m, res, last);
}

static int lower_bound_of(nrs_emu_graph_t *g)
{
    size_t nres = (size_t)g->nphys * NRS_EMU_RES_KINDS;
    int64_t *load = calloc(nres + 1, sizeof(int64_t));
    nrs_emu_dmemo_t dm;
    if (!load)
        return -1;
    nrs_emu_dmemo_init(&dm);
    g->lower_bound = 0;
    memset(g->link_bytes, 0, sizeof(g->link_bytes));
    for (size_t i = 0; i < g->nmoves; i++) {
        const nrs_emu_op_t *c = &g->mch[i].op;
        int64_t bytes = c->row_bytes * c->rows;
        int r[2];
        g->link_bytes[nrs_emu_resources(g, c->src_gpu, c->dst_gpu, -1, r)] += bytes;
        for (int k = 0; k < 2; k++)
            if (r[k] >= 0) {
                load[r[k]] += nrs_emu_chunks_ps(g, &dm, i, 0, r[k]);
                if (load[r[k]] > g->lower_bound)
                    g->lower_bound = load[r[k]];
            }
    }
    free(load);
    return 0;
}

static int lost_cmp(const void *a, const void *b)
{
    const nrs_emu_lost_t *x = a, *y = b;
    int32_t kx[7] = {x->role, x->tensor, x->kind, x->box.r0, x->box.r1, x->box.c0, x->box.c1};
    int32_t ky[7] = {y->role, y->tensor, y->kind, y->box.r0, y->box.r1, y->box.c0, y->box.c1};
    for (int i = 0; i < 7; i++)
        if (kx[i] != ky[i])
            return kx[i] < ky[i] ? -1 : 1;
    return 0;
}

static void dedupe_lost(nrs_emu_graph_t *g)
{
    size_t n = 0;
    qsort(g->lost, g->nlost, sizeof(*g->lost), lost_cmp);
    for (size_t i = 0; i < g->nlost; i++)
        if (n == 0 || lost_cmp(&g->lost[n - 1], &g->lost[i]))
            g->lost[n++] = g->lost[i];
    g->nlost = n;
}

static int choose_sources(nrs_emu_graph_t *g)
{
    sel_t S = {.g = g};
    size_t nkeys;
    int32_t first = g->nold; /* first new buffer that needs sources */
    while (first < g->nold + g->nnew &&
           (g->buf[first].alias >= 0 || g->buf[first].b.kind == NRS_EMU_GRAD))
        first++;
    if (first == g->nold + g->nnew) /* all kept or zero-filled: nothing to index */
        return 0;
    nrs_emu_dmemo_init(&S.dm);
    skey_t *keys = src_keys(g, &nkeys);
    int rc = -1;

    S.load = calloc((size_t)g->nphys * NRS_EMU_RES_KINDS + 1, sizeof(int64_t));
    if (!keys || !S.load || build_index(&S, keys, nkeys))
        goto fail;
    for (int32_t j = first; j < g->nold + g->nnew; j++) {
        if (g->buf[j].alias >= 0 || g->buf[j].b.kind == NRS_EMU_GRAD)
            continue;
        if (select_sources(&S, j))
            goto fail;
    }
    rc = 0;
fail:
    free(keys);
    free(S.load);
    free(S.unc.r);
    free(S.tmp.r);
    free(S.cand);
    free(S.kbox);
    free(S.runs);
    free(S.offs);
    free(S.grp);
    free(S.bynode);
    free(S.stamp);
    free(S.touched);
    free(S.undo);
    free(S.order);
    return rc;
}

int nrs_emu_graph_build(nrs_emu_graph_t *g, const nrs_spec_t *s, const nrs_emu_opts_t *o,
                        char *err, size_t errlen)
{
    double t0 = nrs_now_s(), t1;
    int rc = add_buffers(g, o, err, errlen);
    if (rc == -2)
        return -1;
    if (rc || find_keeps(g))
        goto oom;
    t1 = nrs_now_s();
    g->phase_s[NRS_EMU_PH_BUFFERS] = t1 - t0;
    if (choose_sources(g))
        goto oom;
    t0 = nrs_now_s();
    g->phase_s[NRS_EMU_PH_SOURCES] = t0 - t1;
    if (g->nlost) {
        dedupe_lost(g);
        snprintf(err, errlen,
                 "%zu boxes of state survive on no replica: restore from a checkpoint",
                 g->nlost);
        return NRS_EMU_ELOST;
    }
    free(g->mch);
    g->mch = malloc(sizeof(*g->mch) * (g->nmoves + 1));
    if (!g->mch)
        goto oom;
    int64_t nchunks = 0;
    for (size_t i = 0; i < g->nmoves; i++)
        nchunks += chunk_move(g, (int32_t)i);
    if (nchunks > NRS_EMU_MAX_CHUNKS) {
        snprintf(err, errlen,
                 "transition graph too large: %lld chunks of at most %lld bytes, more than "
                 "%lld: use a larger chunk",
                 (long long)nchunks, (long long)g->chunk, (long long)NRS_EMU_MAX_CHUNKS);
        return -1;
    }
    g->nchunks = (size_t)nchunks;
    if (lower_bound_of(g))
        goto oom;
    g->phase_s[NRS_EMU_PH_CHUNKS] = nrs_now_s() - t0;
    return 0;
oom:
    snprintf(err, errlen, "out of memory building the transition graph");
    return -1;
}
