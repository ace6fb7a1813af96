/* Shard geometry (docs/transitions.md §1).
 *
 * Conventions (Megatron-LM): weights are [out, in]; column-parallel tensors
 * split rows over tp, row-parallel ones split columns. qkv stacks q, k and v
 * rows; with GQA a tp rank holds kv heads [t*kv/tp, (t+1)*kv/tp) when tp <= kv
 * heads, and kv head t*kv/tp (each head replicated on tp/kv ranks) when tp > kv
 * heads. Non-divisible splits (ffn, vocab over tp; layers over pp) are balanced
 * with the first parts one larger.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "emu/geometry.h"
#include "util/util.h"

void nrs_emu_split(int n, int k, int i, int *start, int *len)
{
    int base = n / k, rem = n % k;
    *start = i * base + (i < rem ? i : rem);
    *len = base + (i < rem ? 1 : 0);
}


int nrs_emu_tensor_count(const nrs_model_t *m)
{
    (void)m;
    return NRS_EMU_T_GLOBALS + NRS_EMU_LT_COUNT;
}

static int head_dim(const nrs_model_t *m)
{
    return m->heads > 0 ? m->hidden / m->heads : 0;
}

void nrs_emu_tensor_shape(const nrs_model_t *m, int t, int *rows, int *cols)
{
    int hd = head_dim(m), q = m->heads * hd, kv = m->kv_heads * hd, L = m->layers;

    *cols = m->hidden;
    switch (t) {
    case NRS_EMU_T_EMBED: *rows = m->vocab; return;
    case NRS_EMU_T_FINAL_NORM: *rows = 1; return;
    case NRS_EMU_T_HEAD:
        *rows = m->value_head ? 1 : m->tied_embeddings ? 0 : m->vocab;
        return;
    default: break;
    }
    switch (t - NRS_EMU_T_GLOBALS) {
    case NRS_EMU_LT_QKV: *rows = q + 2 * kv; *cols = L * m->hidden; break;
    case NRS_EMU_LT_O: *rows = L * m->hidden; *cols = q; break;
    case NRS_EMU_LT_GATE:
    case NRS_EMU_LT_UP: *rows = m->ffn; *cols = L * m->hidden; break;
    case NRS_EMU_LT_DOWN: *rows = L * m->hidden; *cols = m->ffn; break;
    case NRS_EMU_LT_NORM1:
    case NRS_EMU_LT_NORM2: *rows = L; break;
    default: *rows = 0; break;
    }
}

static int is_layer_tensor(int t)
{
    return t >= NRS_EMU_T_GLOBALS && t < NRS_EMU_T_GLOBALS + NRS_EMU_LT_COUNT;
}

/* How layer tensor t stacks its layers: 1 side by side in columns (column-
 * parallel), 0 one under the other in rows; *span: rows or columns per layer. */
static int stacks_in_cols(const nrs_model_t *m, int t, int *span)
{
    switch (t - NRS_EMU_T_GLOBALS) {
    case NRS_EMU_LT_QKV:
    case NRS_EMU_LT_GATE:
    case NRS_EMU_LT_UP: *span = m->hidden; return 1;
    case NRS_EMU_LT_O:
    case NRS_EMU_LT_DOWN: *span = m->hidden; return 0;
    default: *span = 1; return 0;
    }
}

void nrs_emu_box_layers(const nrs_model_t *m, int t, const nrs_emu_rect_t *box, int *l0, int *l1)
{
    int span;
    *l0 = *l1 = 0;
    if (!is_layer_tensor(t))
        return;
    int cols = stacks_in_cols(m, t, &span);
    if (span < 1)
        return;
    int a = cols ? box->c0 : box->r0, b = cols ? box->c1 : box->r1;
    *l0 = a / span;
    *l1 = b > a ? (b - 1) / span + 1 : *l0;
}

int nrs_emu_layer_part(const nrs_model_t *m, int t, const nrs_emu_rect_t *box, int l,
                       nrs_emu_rect_t *in, nrs_emu_rect_t *local)
{
    int span;
    if (!is_layer_tensor(t) || l < 0 || l >= m->layers)
        return 0;
    int cols = stacks_in_cols(m, t, &span);
    nrs_emu_rect_t layer = {0, INT32_MAX, 0, INT32_MAX};
    if (cols) {
        layer.c0 = l * span;
        layer.c1 = (l + 1) * span;
    } else {
        layer.r0 = l * span;
        layer.r1 = (l + 1) * span;
    }
    if (!nrs_emu_rect_meet(box, &layer, in))
        return 0;
    *local = *in;
    if (cols) {
        local->c0 -= layer.c0;
        local->c1 -= layer.c0;
    } else {
        local->r0 -= layer.r0;
        local->r1 -= layer.r0;
    }
    return 1;
}

void nrs_emu_tensor_name(const nrs_model_t *m, int t, char *buf, size_t n)
{
    static const char *const lt[NRS_EMU_LT_COUNT] = {"qkv", "o_proj", "gate", "up",
                                                     "down", "norm1", "norm2"};
    if (t == NRS_EMU_T_EMBED)
        snprintf(buf, n, "embed");
    else if (t == NRS_EMU_T_FINAL_NORM)
        snprintf(buf, n, "final_norm");
    else if (t == NRS_EMU_T_HEAD)
        snprintf(buf, n, "%s", m->value_head ? "value_head" : "lm_head");
    else
        snprintf(buf, n, "layers.%s",
                 is_layer_tensor(t) ? lt[t - NRS_EMU_T_GLOBALS] : "?");
}

const char *nrs_emu_kind_name(int kind)
{
    static const char *const k[NRS_EMU_KIND_COUNT] = {"weight", "grad", "master", "adam_m",
                                                      "adam_v"};
    return (unsigned)kind < NRS_EMU_KIND_COUNT ? k[kind] : "?";
}

int nrs_emu_layout_check(const nrs_model_t *m, const nrs_layout_t *l, char *err, size_t errlen)
{
    if (l->tp < 1 || l->pp < 1 || l->dp < 1) {
        snprintf(err, errlen, "layout tp=%d pp=%d dp=%d: all must be >= 1", l->tp, l->pp, l->dp);
        return -1;
    }
    if (m->layers < 1 || m->heads < 1 || m->kv_heads < 1 || m->hidden % m->heads) {
        snprintf(err, errlen, "model dims invalid (layers %d, heads %d, kv heads %d, hidden %d)",
                 m->layers, m->heads, m->kv_heads, m->hidden);
        return -1;
    }
    if (m->heads % m->kv_heads) { /* the loader's rule, for a model built in code */
        snprintf(err, errlen, "model dims: heads %d is not a multiple of kv heads %d", m->heads,
                 m->kv_heads);
        return -1;
    }
    if ((int64_t)m->layers * m->hidden > NRS_MODEL_MAX_STACKED) {
        /* the loader refuses these; a spec built in code is checked here */
        snprintf(err, errlen, "model dims: layers %d * hidden %d exceeds %d, the bound of a "
                 "stacked layer tensor's coordinates", m->layers, m->hidden,
                 NRS_MODEL_MAX_STACKED);
        return -1;
    }
    if (l->pp > m->layers) {
        snprintf(err, errlen, "pp=%d > layers=%d", l->pp, m->layers);
        return -1;
    }
    if (m->heads % l->tp) {
        snprintf(err, errlen, "tp=%d does not divide heads=%d", l->tp, m->heads);
        return -1;
    }
    if (l->tp <= m->kv_heads ? m->kv_heads % l->tp : l->tp % m->kv_heads) {
        snprintf(err, errlen, "tp=%d and kv heads=%d: neither divides the other", l->tp,
                 m->kv_heads);
        return -1;
    }
    return 0;
}

int nrs_emu_rank_boxes_max(const nrs_model_t *m, int pp)
{
    (void)m;
    (void)pp;
    return 4 + NRS_EMU_LT_COUNT + 2;
}

typedef struct {
    nrs_emu_tbox_t *out;
    int n, max;
} box_sink_t;

static void put(box_sink_t *k, int tensor, int r0, int r1, int c0, int c1)
{
    if (r1 <= r0 || c1 <= c0 || k->n >= k->max)
        return;
    k->out[k->n].tensor = tensor;
    k->out[k->n].box = (nrs_emu_rect_t){r0, r1, c0, c1};
    k->n++;
}

/* kv head range of tp rank t: [*h0, *h0 + *nh). */
static void kv_heads_of(const nrs_model_t *m, int tp, int t, int *h0, int *nh)
{
    if (tp <= m->kv_heads) {
        *nh = m->kv_heads / tp;
        *h0 = t * *nh;
    } else {
        *nh = 1;
        *h0 = t / (tp / m->kv_heads);
    }
}

/* Layers [l0, l0 + nl) of every layer tensor, stacked (docs/transitions.md §1):
 * column-parallel tensors side by side in columns, row-parallel ones and the
 * norms one under the other in rows, so each rank's share is one box. */
static void layer_boxes(box_sink_t *k, const nrs_model_t *m, int tp, int t, int l0, int nl)
{
    int base = NRS_EMU_T_GLOBALS;
    int hd = head_dim(m), H = m->hidden, q = m->heads * hd, kvr = m->kv_heads * hd;
    int qh = m->heads / tp, h0, nh, f0, fl, c0 = l0 * H, c1 = (l0 + nl) * H;

    kv_heads_of(m, tp, t, &h0, &nh);
    nrs_emu_split(m->ffn, tp, t, &f0, &fl);
    put(k, base + NRS_EMU_LT_QKV, t * qh * hd, (t + 1) * qh * hd, c0, c1);
    put(k, base + NRS_EMU_LT_QKV, q + h0 * hd, q + (h0 + nh) * hd, c0, c1);
    put(k, base + NRS_EMU_LT_QKV, q + kvr + h0 * hd, q + kvr + (h0 + nh) * hd, c0, c1);
    put(k, base + NRS_EMU_LT_O, c0, c1, t * qh * hd, (t + 1) * qh * hd);
    put(k, base + NRS_EMU_LT_GATE, f0, f0 + fl, c0, c1);
    put(k, base + NRS_EMU_LT_UP, f0, f0 + fl, c0, c1);
    put(k, base + NRS_EMU_LT_DOWN, c0, c1, f0, f0 + fl);
    put(k, base + NRS_EMU_LT_NORM1, l0, l0 + nl, 0, H);
    put(k, base + NRS_EMU_LT_NORM2, l0, l0 + nl, 0, H);
}

int nrs_emu_rank_boxes(const nrs_model_t *m, int tp, int pp, int p, int t, nrs_emu_tbox_t *out,
                       int max)
{
    box_sink_t k = {out, 0, max};
    int l0, nl, v0, vl, H = m->hidden;

    nrs_emu_split(m->layers, pp, p, &l0, &nl);
    nrs_emu_split(m->vocab, tp, t, &v0, &vl);
    if (p == 0)
        put(&k, NRS_EMU_T_EMBED, v0, v0 + vl, 0, H);
    layer_boxes(&k, m, tp, t, l0, nl);
    if (p == pp - 1) {
        put(&k, NRS_EMU_T_FINAL_NORM, 0, 1, 0, H);
        if (m->value_head)
            put(&k, NRS_EMU_T_HEAD, 0, 1, 0, H);
        else if (!m->tied_embeddings)
            put(&k, NRS_EMU_T_HEAD, v0, v0 + vl, 0, H);
        else if (pp > 1) /* tied: the last stage keeps a copy of the embedding */
            put(&k, NRS_EMU_T_EMBED, v0, v0 + vl, 0, H);
    }
    return k.n;
}

/* --- state of a plan ------------------------------------------------------ */

static int esize_of(nrs_dtype_t d)
{
    return d == NRS_DTYPE_FP32 ? 4 : 2;
}

static int state_push(nrs_emu_state_t *st, const nrs_emu_buf_t *b)
{
    NRS_GROW(st->buf, st->nbuf, st->cap, 1);
    st->buf[st->nbuf++] = *b;
    if (b->gpu > st->max_gpu)
        st->max_gpu = b->gpu;
    return 0;
}

static int push_box(nrs_emu_state_t *st, nrs_emu_buf_t *tmpl, int tensor, int kind, int esize,
                    const nrs_emu_rect_t *r)
{
    tmpl->tensor = tensor;
    tmpl->kind = (uint8_t)kind;
    tmpl->esize = (uint8_t)esize;
    tmpl->box = *r;
    tmpl->bytes = nrs_emu_rect_area(r) * esize;
    return tmpl->bytes > 0 ? state_push(st, tmpl) : 0;
}

/* The ZeRO shard of replica d: elements [a, b) of the rank's flat weight
 * buffer (its boxes concatenated in canonical order, each row-major), as
 * boxes: a partial first row, full rows, a partial last row per box, of
 * esize bytes per element. */
static int push_flat_range(nrs_emu_state_t *st, nrs_emu_buf_t *tmpl, const nrs_emu_tbox_t *bx,
                           int nb, int64_t a, int64_t b, int kind, int esize)
{
    int64_t f = 0;
    for (int i = 0; i < nb; i++) {
        const nrs_emu_rect_t *r = &bx[i].box;
        int64_t n = nrs_emu_rect_area(r), w = r->c1 - r->c0;
        int64_t e0 = (a > f ? a : f) - f, e1 = (b < f + n ? b : f + n) - f;
        f += n;
        if (e1 <= e0)
            continue;
        int32_t ra = (int32_t)(e0 / w), ca = (int32_t)(e0 % w);
        int32_t rb = (int32_t)(e1 / w), cb = (int32_t)(e1 % w);
        nrs_emu_rect_t p;
        if (ra == rb) {
            p = (nrs_emu_rect_t){r->r0 + ra, r->r0 + ra + 1, r->c0 + ca, r->c0 + cb};
            if (push_box(st, tmpl, bx[i].tensor, kind, esize, &p))
                return -1;
            continue;
        }
        if (ca > 0) {
            p = (nrs_emu_rect_t){r->r0 + ra, r->r0 + ra + 1, r->c0 + ca, r->c1};
            if (push_box(st, tmpl, bx[i].tensor, kind, esize, &p))
                return -1;
            ra++;
        }
        p = (nrs_emu_rect_t){r->r0 + ra, r->r0 + rb, r->c0, r->c1};
        if (push_box(st, tmpl, bx[i].tensor, kind, esize, &p))
            return -1;
        p = (nrs_emu_rect_t){r->r0 + rb, r->r0 + rb + 1, r->c0, r->c0 + cb};
        if (push_box(st, tmpl, bx[i].tensor, kind, esize, &p))
            return -1;
    }
    return 0;
}

/* Kind k of an engine under the runtime's ZeRO options, as model/memory.c
 * counts it (docs/cost-model.md §3.1): 0 not on the GPU (offloaded
 * optimizer state lives in host memory), 1 whole on every replica, 2 split
 * over the dp replicas. ZeRO-3 splits weights and gradients of every engine
 * DeepSpeed runs; generation weights (actor.generate) stay whole. */
static int kind_mode(const nrs_runtime_t *rt, const nrs_emu_engine_t *e, int k)
{
    if (k >= NRS_EMU_MASTER) {
        if (rt->offload_optimizer)
            return 0;
        return rt->zero1 || rt->zero3 ? 2 : 1;
    }
    return rt->zero3 && e->ms != NRS_MS_ACTOR_GENERATE ? 2 : 1;
}

static int push_rank(nrs_emu_state_t *st, const nrs_spec_t *s, const nrs_emu_engine_t *e,
                     nrs_emu_buf_t *tmpl, const nrs_emu_tbox_t *bx, int nb, nrs_emu_sel_t sel)
{
    const nrs_model_t *m = &s->models[e->role];
    int es = esize_of(m->dtype);
    int kinds = e->trained && sel == NRS_EMU_SEL_PERSISTENT ? NRS_EMU_KIND_COUNT : 1;

    for (int k = 0; k < kinds; k++) {
        int mode = kind_mode(&s->runtime, e, k), ke = k >= NRS_EMU_MASTER ? 4 : es;
        /* An fp32 model is its own master copy, as the memory model counts it
         * (nrs_mdl_opt_bytes_per_param): a second one would not fit the
         * plans the planner accepted. */
        if (mode == 0 || (k == NRS_EMU_MASTER && m->dtype == NRS_DTYPE_FP32))
            continue;
        if (mode == 2) {
            int64_t total = 0, a, b;
            for (int i = 0; i < nb; i++)
                total += nrs_emu_rect_area(&bx[i].box);
            a = total * tmpl->replica / e->lay.dp;
            b = total * (tmpl->replica + 1) / e->lay.dp;
            tmpl->set = -1;
            if (push_flat_range(st, tmpl, bx, nb, a, b, k, ke))
                return -1;
            continue;
        }
        tmpl->set = tmpl->replica;
        for (int i = 0; i < nb; i++)
            if (push_box(st, tmpl, bx[i].tensor, k, ke, &bx[i].box))
                return -1;
    }
    return 0;
}

static int map_gpu(int g, const int *map, int nmap)
{
    if (!map)
        return g;
    return g < nmap ? map[g] : -1;
}

static int push_engine(nrs_emu_state_t *st, const nrs_spec_t *s, const nrs_plan_t *p,
                       const nrs_emu_engine_t *e, nrs_emu_sel_t sel, const int *map, int nmap,
                       char *err, size_t errlen)
{
    const nrs_model_t *m = &s->models[e->role];
    const nrs_layout_t *l = &e->lay;
    const nrs_pool_t *pool = &p->pools[p->pool_of[e->ms]];
    int maxb = nrs_emu_rank_boxes_max(m, l->pp);
    nrs_emu_tbox_t *bx;
    int rc = -1;

    if (nrs_emu_layout_check(m, l, err, errlen))
        return -1;
    if (l->tp * l->pp * l->dp > pool->gpus) {
        snprintf(err, errlen, "%s: tp*pp*dp=%d > pool gpus %d", nrs_ms_name(e->ms),
                 l->tp * l->pp * l->dp, pool->gpus);
        return -1;
    }
    bx = malloc(sizeof(*bx) * (size_t)maxb);
    if (!bx)
        return -1;
    for (int d = 0; d < l->dp; d++)
        for (int pp = 0; pp < l->pp; pp++)
            for (int t = 0; t < l->tp; t++) {
                nrs_emu_buf_t tmpl = {0};
                int nb = nrs_emu_rank_boxes(m, l->tp, l->pp, pp, t, bx, maxb);
                tmpl.engine = st->nengines;
                tmpl.replica = d;
                tmpl.rank = pp * l->tp + t;
                tmpl.role = (int16_t)e->role;
                tmpl.gpu = map_gpu(pool->first_gpu + d * l->tp * l->pp + pp * l->tp + t, map,
                                   nmap);
                if (tmpl.gpu < 0) {
                    snprintf(err, errlen, "%s: GPU %d has no physical mapping",
                             nrs_ms_name(e->ms),
                             pool->first_gpu + d * l->tp * l->pp + pp * l->tp + t);
                    goto fail;
                }
                if (push_rank(st, s, e, &tmpl, bx, nb, sel))
                    goto fail_oom;
            }
    rc = 0;
    goto fail;
fail_oom:
    snprintf(err, errlen, "out of memory");
fail:
    free(bx);
    return rc;
}

static int plan_pool_ok(const nrs_plan_t *p, int ms, char *err, size_t errlen)
{
    int pi = p->pool_of[ms];
    if (pi < 0 || pi >= p->npools || p->npools > NRS_POOL_MAX) {
        snprintf(err, errlen, "%s: pool %d out of range", nrs_ms_name(ms), pi);
        return -1;
    }
    const nrs_pool_t *pool = &p->pools[pi];
    if (pool->first_gpu < 0 || pool->gpus < 1 || pool->first_gpu + pool->gpus > p->total_gpus) {
        snprintf(err, errlen, "%s: pool [%d, +%d) outside the plan's %d GPUs", nrs_ms_name(ms),
                 pool->first_gpu, pool->gpus, p->total_gpus);
        return -1;
    }
    return 0;
}

static int home_ms(const nrs_plan_t *p, int role)
{
    static const int train[NRS_ROLE_COUNT] = {NRS_MS_ACTOR_TRAIN, NRS_MS_CRITIC_TRAIN, -1, -1};
    static const int infer[NRS_ROLE_COUNT] = {NRS_MS_ACTOR_INFER, NRS_MS_CRITIC_INFER,
                                              NRS_MS_REF_INFER, NRS_MS_REWARD_INFER};
    if (train[role] >= 0 && p->has[train[role]])
        return train[role];
    return p->has[infer[role]] ? infer[role] : -1;
}

static int add_engine(nrs_emu_state_t *st, const nrs_plan_t *p, int ms, int role, int trained,
                      char *err, size_t errlen)
{
    if (plan_pool_ok(p, ms, err, errlen))
        return -1;
    nrs_emu_engine_t *e = &st->eng[st->nengines];
    e->ms = ms;
    e->role = role;
    e->lay = p->layout[ms];
    e->first_gpu = p->pools[p->pool_of[ms]].first_gpu;
    e->trained = trained;
    return 0;
}

int nrs_emu_state_build(const nrs_spec_t *s, const nrs_plan_t *p, nrs_emu_sel_t sel,
                        const int *gpu_map, int ngpu_map, nrs_emu_state_t *out, char *err,
                        size_t errlen)
{
    memset(out, 0, sizeof(*out));
    out->max_gpu = -1;
    for (int role = 0; role < NRS_ROLE_COUNT; role++) {
        int ms = home_ms(p, role), gen = 0;
        if (sel == NRS_EMU_SEL_ACTOR_TRAIN_W && role != NRS_ROLE_ACTOR)
            continue;
        if (sel == NRS_EMU_SEL_ACTOR_GEN_W) {
            if (role != NRS_ROLE_ACTOR || !p->has[NRS_MS_ACTOR_GENERATE])
                continue;
            ms = NRS_MS_ACTOR_GENERATE;
            gen = 1;
        }
        if (ms < 0 || !s->models[role].present)
            continue;
        if (add_engine(out, p, ms, role,
                       !gen && (ms == NRS_MS_ACTOR_TRAIN || ms == NRS_MS_CRITIC_TRAIN), err,
                       errlen))
            goto fail;
        if (push_engine(out, s, p, &out->eng[out->nengines], sel, gpu_map, ngpu_map, err, errlen))
            goto fail;
        out->nengines++;
        /* Generation weights on a pool of their own persist between steps; on
         * the actor's pool they are rebuilt by the per-step sync. */
        if (sel == NRS_EMU_SEL_PERSISTENT && role == NRS_ROLE_ACTOR &&
            p->has[NRS_MS_ACTOR_GENERATE] &&
            p->pool_of[NRS_MS_ACTOR_GENERATE] != p->pool_of[ms]) {
            if (add_engine(out, p, NRS_MS_ACTOR_GENERATE, role, 0, err, errlen))
                goto fail;
            if (push_engine(out, s, p, &out->eng[out->nengines], sel, gpu_map, ngpu_map, err,
                            errlen))
                goto fail;
            out->nengines++;
        }
    }
    return 0;
fail:
    nrs_emu_state_free(out);
    return -1;
}

void nrs_emu_state_free(nrs_emu_state_t *st)
{
    free(st->buf);
    memset(st, 0, sizeof(*st));
    st->max_gpu = -1;
}
