/* Random specs and plans for the EMU tests and bench. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fixtures.h"
#include "emu/exec.h"
#include "emu/testutil.h"

uint64_t tu_next(tu_rng_t *r)
{
    uint64_t x = (r->s += 0x9e3779b97f4a7c15ull);
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

int tu_int(tu_rng_t *r, int lo, int hi)
{
    return lo + (int)(tu_next(r) % (uint64_t)(hi - lo + 1));
}

void tu_model(nrs_model_t *m, int layers, int hidden, int ffn, int heads, int kv, int vocab)
{
    set_model(m, layers, hidden, ffn, heads, kv, vocab, false);
}

static void cluster(nrs_spec_t *s, int gpn)
{
    s->cluster.gpu_mem_gib = 80;
    s->cluster.gpus_per_node = gpn;
    s->cluster.intra_gbps = 100;
    s->cluster.inter_gbps = 25;
    s->cluster.hbm_gbps = 1000;
    s->cluster.host_gbps = 20;
    s->runtime.mem_headroom_gib = 0;
    s->runtime.emulation_scale = 1;
}

void tu_spec_fixed(nrs_spec_t *s, const nrs_model_t *actor, int gpn)
{
    memset(s, 0, sizeof(*s));
    cluster(s, gpn);
    s->models[NRS_ROLE_ACTOR] = *actor;
    s->runtime.zero1 = true;
}

static void random_model(nrs_model_t *m, tu_rng_t *r)
{
    static const int heads[] = {2, 4, 8};
    int h = heads[tu_int(r, 0, 2)], kv;
    do
        kv = 1 << tu_int(r, 0, 3);
    while (kv > h);
    tu_model(m, tu_int(r, 1, 6), h * tu_int(r, 1, 3), tu_int(r, 3, 20), h, kv, tu_int(r, 5, 40));
}

void tu_spec(nrs_spec_t *s, tu_rng_t *r)
{
    static const int gpn[] = {1, 2, 4, 8};
    memset(s, 0, sizeof(*s));
    cluster(s, gpn[tu_int(r, 0, 3)]);
    random_model(&s->models[NRS_ROLE_ACTOR], r);
    s->models[NRS_ROLE_ACTOR].tied_embeddings = tu_int(r, 0, 3) == 0;
    if (tu_int(r, 0, 1)) {
        random_model(&s->models[NRS_ROLE_CRITIC], r);
        s->models[NRS_ROLE_CRITIC].value_head = true;
    }
    if (tu_int(r, 0, 1))
        random_model(&s->models[NRS_ROLE_REF], r);
    if (tu_int(r, 0, 2) == 0) {
        random_model(&s->models[NRS_ROLE_REWARD], r);
        s->models[NRS_ROLE_REWARD].value_head = true;
    }
    s->runtime.zero1 = tu_int(r, 0, 3) != 0;
}

static int tp_ok(const nrs_model_t *m, int tp)
{
    if (m->heads % tp)
        return 0;
    return tp <= m->kv_heads ? m->kv_heads % tp == 0 : tp % m->kv_heads == 0;
}

void tu_layout(const nrs_model_t *m, tu_rng_t *r, int gpus, nrs_layout_t *l)
{
    int tps[8], n = 0;
    for (int tp = 1; tp <= gpus && tp <= m->heads; tp++)
        if (tp_ok(m, tp))
            tps[n++] = tp;
    l->tp = tps[tu_int(r, 0, n - 1)];
    int ppmax = gpus / l->tp < m->layers ? gpus / l->tp : m->layers;
    l->pp = tu_int(r, 1, ppmax);
    l->dp = tu_int(r, 1, gpus / (l->tp * l->pp));
    l->mb = 1;
}

static void set_ms(nrs_plan_t *p, const nrs_spec_t *s, tu_rng_t *r, int ms, int pool)
{
    const nrs_model_t *m = &s->models[nrs_ms_role(ms)];
    p->has[ms] = true;
    p->pool_of[ms] = pool;
    tu_layout(m, r, p->pools[pool].gpus, &p->layout[ms]);
}

void tu_plan(const nrs_spec_t *s, tu_rng_t *r, int total, nrs_plan_t *p)
{
    int cuts[NRS_POOL_MAX + 1], n;
    memset(p, 0, sizeof(*p));
    p->total_gpus = total;
    n = tu_int(r, 1, total < NRS_POOL_MAX ? total : NRS_POOL_MAX);
    cuts[0] = 0;
    for (int i = 1; i < n; i++) { /* distinct increasing cut points */
        int lo = cuts[i - 1] + 1, hi = total - (n - i);
        cuts[i] = tu_int(r, lo, hi);
    }
    cuts[n] = total;
    p->npools = n;
    for (int i = 0; i < n; i++)
        p->pools[i] = (nrs_pool_t){cuts[i], cuts[i + 1] - cuts[i]};
    for (int ms = 0; ms < NRS_MS_COUNT; ms++) {
        if (!s->models[nrs_ms_role(ms)].present || ms == NRS_MS_ACTOR_INFER ||
            ms == NRS_MS_CRITIC_INFER)
            continue;
        set_ms(p, s, r, ms, tu_int(r, 0, n - 1));
    }
    p->has[NRS_MS_ACTOR_INFER] = true; /* shares actor.train's engine */
    p->pool_of[NRS_MS_ACTOR_INFER] = p->pool_of[NRS_MS_ACTOR_TRAIN];
    p->layout[NRS_MS_ACTOR_INFER] = p->layout[NRS_MS_ACTOR_TRAIN];
    if (p->has[NRS_MS_CRITIC_TRAIN]) {
        p->has[NRS_MS_CRITIC_INFER] = true;
        p->pool_of[NRS_MS_CRITIC_INFER] = p->pool_of[NRS_MS_CRITIC_TRAIN];
        p->layout[NRS_MS_CRITIC_INFER] = p->layout[NRS_MS_CRITIC_TRAIN];
    }
}

void tu_plan_single(const nrs_spec_t *s, int total, const nrs_layout_t *l, nrs_plan_t *p)
{
    memset(p, 0, sizeof(*p));
    p->total_gpus = total;
    p->npools = 1;
    p->pools[0] = (nrs_pool_t){0, total};
    p->has[NRS_MS_ACTOR_TRAIN] = p->has[NRS_MS_ACTOR_INFER] = true;
    p->layout[NRS_MS_ACTOR_TRAIN] = p->layout[NRS_MS_ACTOR_INFER] = *l;
}

void tu_plan_swap(nrs_spec_t *s, nrs_plan_t *a, nrs_plan_t *b)
{
    nrs_model_t m;
    nrs_layout_t l = {2, 2, 1, 1};
    int ms[] = {NRS_MS_REF_INFER, NRS_MS_REWARD_INFER};
    tu_model(&m, 4, 8, 12, 4, 2, 16);
    tu_spec_fixed(s, &m, 4);
    s->models[NRS_ROLE_ACTOR].present = false;
    s->models[NRS_ROLE_REF] = m;
    s->models[NRS_ROLE_REWARD] = m; /* same dims, same bytes per GPU */
    memset(a, 0, sizeof(*a));
    a->total_gpus = 8;
    a->npools = 2;
    a->pools[0] = (nrs_pool_t){0, 4};
    a->pools[1] = (nrs_pool_t){4, 4};
    for (int i = 0; i < 2; i++) {
        a->has[ms[i]] = true;
        a->layout[ms[i]] = l;
        a->pool_of[ms[i]] = i;
    }
    *b = *a;
    for (int i = 0; i < 2; i++)
        b->pool_of[ms[i]] = 1 - i;
}

int64_t tu_state_need(const nrs_emu_graph_t *g)
{
    int64_t need = 0, *per = calloc((size_t)g->nphys * 2 + 1, sizeof(int64_t));
    if (!per) {
        fprintf(stderr, "tu_state_need: out of memory\n");
        abort();
    }
    for (int32_t k = 0; k < g->nold + g->nnew; k++) /* old and new state per GPU */
        if (k >= g->nold || !g->buf[k].lost)
            per[2 * g->buf[k].b.gpu + (k >= g->nold)] += g->buf[k].b.bytes;
    for (int k = 0; k < 2 * g->nphys; k++)
        need = per[k] > need ? per[k] : need;
    free(per);
    return need;
}

int tu_run(const nrs_spec_t *s, const nrs_plan_t *a, const nrs_plan_t *b, const nrs_emu_opts_t *o,
           int64_t stop_after, char *err, size_t errlen)
{
    nrs_emu_graph_t *g = NULL;
    nrs_xport_t x;
    nrs_emu_exec_opts_t eo = {.stop_after = stop_after};
    nrs_emu_exec_result_t res;
    int rc = nrs_emu_transition(s, a, b, o, &g, err, errlen);
    if (rc) {
        nrs_emu_graph_free(g);
        return rc;
    }
    if (nrs_xport_local_open(&x)) {
        nrs_emu_graph_free(g);
        return -1;
    }
    rc = nrs_emu_execute(g, &x, &eo, &res);
    if (rc)
        snprintf(err, errlen, "execute: %lld mismatches, %lld uaf, %lld cap, %lld leaks: %s",
                 (long long)res.mismatches, (long long)res.use_after_free,
                 (long long)res.cap_violations, (long long)res.leaks, res.first_error);
    nrs_xport_close(&x);
    nrs_emu_graph_free(g);
    return rc;
}
