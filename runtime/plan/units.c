/* Placement units and their candidate tables: every (tp, pp) a unit can take on
 * a pool of a given size, with the micro-batch staircase of each of its stages.
 * Tables are filled from the cost model once per (unit, pool size) and cached. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "plan/plan_int.h"

static const nrs_ms_t unit_stages[U_COUNT][2] = {
    [U_GEN] = {NRS_MS_ACTOR_GENERATE, NRS_MS_COUNT},
    [U_ACTOR] = {NRS_MS_ACTOR_INFER, NRS_MS_ACTOR_TRAIN},
    [U_CRITIC] = {NRS_MS_CRITIC_INFER, NRS_MS_CRITIC_TRAIN},
    [U_REF] = {NRS_MS_REF_INFER, NRS_MS_COUNT},
    [U_REWARD] = {NRS_MS_REWARD_INFER, NRS_MS_COUNT},
};
static const nrs_role_t unit_roles[U_COUNT] = {NRS_ROLE_ACTOR, NRS_ROLE_ACTOR, NRS_ROLE_CRITIC,
                                               NRS_ROLE_REF, NRS_ROLE_REWARD};
/* Search order: the actor first, then its generation engine (so the weight sync
 * is known early), then the other models. */
static const nrs_unit_t search_order[U_COUNT] = {U_ACTOR, U_GEN, U_CRITIC, U_REF, U_REWARD};
const nrs_unit_t nrs_plan_persist_order[U_COUNT] = {U_ACTOR, U_CRITIC, U_REF, U_REWARD, U_GEN};

int nrs_unit_nstages(nrs_unit_t u)
{
    return unit_stages[u][1] == NRS_MS_COUNT ? 1 : 2;
}

nrs_ms_t nrs_unit_ms(nrs_unit_t u, int i)
{
    return unit_stages[u][i];
}

nrs_role_t nrs_unit_role(nrs_unit_t u)
{
    return unit_roles[u];
}

int nrs_tp_options(const nrs_spec_t *s, int gpus, int *out, int max)
{
    int gpn = s->cluster.gpus_per_node, n = 0;
    for (int t = 1; t <= gpn && t <= gpus && n < max; t++)
        if (gpn % t == 0)
            out[n++] = t;
    if (s->cluster.tp_across_nodes)
        for (int t = 2 * gpn; t <= gpus && n < max; t *= 2)
            out[n++] = t;
    return n;
}

int nrs_planner_init(nrs_planner_t *pl, const nrs_spec_t *s, const nrs_plan_req_t *req)
{
    memset(pl, 0, sizeof(*pl));
    pl->spec = s;
    pl->work = req->work;
    if (req->calib)
        pl->calib = *req->calib;
    else
        nrs_calib_init(&pl->calib);
    pl->cap = nrs_cost_capacity_bytes(s);
    pl->gpn = s->cluster.gpus_per_node;
    for (int i = 0; i < U_COUNT; i++) {
        nrs_unit_t u = search_order[i];
        pl->present[u] = nrs_spec_has_ms(s, nrs_unit_ms(u, 0));
        if (pl->present[u])
            pl->units[pl->nunits++] = u;
    }
    return pl->present[U_ACTOR] ? 0 : -1;
}

void nrs_planner_free(nrs_planner_t *pl)
{
    for (int u = 0; u < U_COUNT; u++) {
        for (int i = 0; i < pl->ntables[u]; i++) {
            free(pl->tables[u][i].cand);
            free(pl->tables[u][i].steps);
        }
        free(pl->tables[u]);
    }
    memset(pl, 0, sizeof(*pl));
}

/* Micro-batch candidates: powers of two up to the cap, and the cap itself. */
int nrs_mb_options(const nrs_planner_t *pl, nrs_unit_t u, int dp, int *out, int max)
{
    /* int64: samples may be up to INT_MAX (the validator's bound) */
    int per_rep = (int)(((int64_t)pl->work.samples + dp - 1) / dp);
    int cap = u == U_GEN ? NRS_PLAN_GEN_MB_MAX : pl->spec->workload.micro_batch_max;
    if (cap > per_rep)
        cap = per_rep;
    int n = 0;
    for (int mb = 1; mb <= cap && n < max; mb *= 2)
        out[n++] = mb;
    if (n > 0 && out[n - 1] != cap && n < max)
        out[n++] = cap;
    return n;
}

static int cmp_step(const void *a, const void *b)
{
    const nrs_step_t *x = a, *y = b;
    if (x->trans != y->trans)
        return x->trans < y->trans ? -1 : 1;
    if (x->time != y->time)
        return x->time < y->time ? -1 : 1;
    return x->mb - y->mb;
}

static int push_step(nrs_table_t *t, nrs_step_t st)
{
    if (t->nsteps == t->capsteps) {
        int nc = t->capsteps ? 2 * t->capsteps : 64;
        nrs_step_t *p = realloc(t->steps, (size_t)nc * sizeof(*p));
        if (!p)
            return -1;
        t->steps = p;
        t->capsteps = nc;
    }
    t->steps[t->nsteps++] = st;
    return 0;
}

/* Appends the staircase of one stage; returns its length (0: no valid mb). */
static int add_staircase(const nrs_planner_t *pl, nrs_table_t *t, nrs_unit_t u, nrs_ms_t ms,
                         nrs_layout_t l)
{
    int mbs[24], nmb = nrs_mb_options(pl, u, l.dp, mbs, 24), start = t->nsteps;
    for (int i = 0; i < nmb; i++) {
        nrs_stage_cost_t c;
        l.mb = mbs[i];
        if (nrs_cost_stage(pl->spec, ms, &l, &pl->work, &pl->calib, &c) != 0)
            continue;
        if (push_step(t, (nrs_step_t){c.trans_bytes, c.time_s, l.mb}) != 0)
            return -1;
    }
    int n = t->nsteps - start, kept = 0;
    if (n > 1)
        qsort(t->steps + start, (size_t)n, sizeof(nrs_step_t), cmp_step);
    for (int i = 0; i < n; i++) {
        nrs_step_t st = t->steps[start + i];
        if (kept == 0 || st.time < t->steps[start + kept - 1].time)
            t->steps[start + kept++] = st;
    }
    t->nsteps = start + kept;
    return kept;
}

double nrs_cand_time(const nrs_table_t *t, const nrs_cand_t *c, int i, double held, double cap,
                     int *mb)
{
    const nrs_step_t *st = t->steps + c->off[i];
    int lo = 0, hi = c->n[i]; /* first entry that does not fit (rounding is monotone) */
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (nrs_plan_fits(held, st[mid].trans, cap))
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == 0)
        return NRS_INF;
    if (mb)
        *mb = st[lo - 1].mb;
    return st[lo - 1].time;
}

typedef struct {
    nrs_cand_t c;
    int idx;
} cand_sort_t;

static int cmp_cand(const void *a, const void *b)
{
    const cand_sort_t *x = a, *y = b;
    if (x->c.lb != y->c.lb)
        return x->c.lb < y->c.lb ? -1 : 1;
    return x->idx - y->idx;
}

static double cand_persist(const nrs_planner_t *pl, nrs_unit_t u, const nrs_layout_t *l)
{
    if (u == U_GEN)
        return nrs_cost_gen_weight_bytes(pl->spec, l);
    return nrs_cost_persist_bytes(pl->spec, nrs_unit_role(u), l);
}

int nrs_pp_max(const nrs_planner_t *pl, nrs_unit_t u, int tp, int gpus)
{
    int ppmax = gpus / tp, layers = pl->spec->models[nrs_unit_role(u)].layers;
    if (ppmax > layers)
        ppmax = layers;
    return ppmax > NRS_PLAN_PP_MAX ? NRS_PLAN_PP_MAX : ppmax;
}

static int build_table(const nrs_planner_t *pl, nrs_unit_t u, int gpus, nrs_table_t *t)
{
    int tps[16], ntp = nrs_tp_options(pl->spec, gpus, tps, 16), ns = nrs_unit_nstages(u);
    int cap = 0;
    cand_sort_t *cs = NULL;

    memset(t, 0, sizeof(*t));
    t->gpus = gpus;
    t->lb_stage[0] = t->lb_stage[1] = NRS_INF;
    t->min_persist = NRS_INF;
    for (int a = 0; a < ntp; a++) {
        int ppmax = nrs_pp_max(pl, u, tps[a], gpus);
        for (int pp = 1; pp <= ppmax; pp++) {
            nrs_layout_t l = {tps[a], pp, gpus / (tps[a] * pp), 1};
            nrs_cand_t c = {.tp = l.tp, .pp = l.pp, .dp = l.dp};
            int save = t->nsteps, ok = 1;
            c.persist = cand_persist(pl, u, &l);
            c.lb = 0;
            /* no transition could leave or reach it, even alone (generation
             * weights are persistent only on a pool of their own: the search
             * checks pools) */
            if (u != U_GEN && !nrs_plan_fits(c.persist, NRS_PLAN_RESERVE, pl->cap))
                continue;
            for (int i = 0; i < ns && ok; i++) {
                c.off[i] = t->nsteps;
                c.n[i] = add_staircase(pl, t, u, nrs_unit_ms(u, i), l);
                if (c.n[i] < 0)
                    goto fail;
                double tm = c.n[i] ? nrs_cand_time(t, &c, i, c.persist, pl->cap, NULL) : NRS_INF;
                ok = tm < NRS_INF;
                c.lb += tm;
            }
            if (!ok) { /* cannot fit even alone on the pool: never feasible */
                t->nsteps = save;
                continue;
            }
            for (int i = 0; i < ns; i++) {
                double tm = nrs_cand_time(t, &c, i, c.persist, pl->cap, NULL);
                if (tm < t->lb_stage[i])
                    t->lb_stage[i] = tm;
            }
            if (c.persist < t->min_persist)
                t->min_persist = c.persist;
            if (t->ncand == cap) {
                cap = cap ? 2 * cap : 32;
                cand_sort_t *p = realloc(cs, (size_t)cap * sizeof(*p));
                if (!p)
                    goto fail;
                cs = p;
            }
            cs[t->ncand] = (cand_sort_t){c, t->ncand};
            t->ncand++;
        }
    }
    if (t->ncand > 1)
        qsort(cs, (size_t)t->ncand, sizeof(*cs), cmp_cand);
    t->cand = malloc((size_t)(t->ncand ? t->ncand : 1) * sizeof(nrs_cand_t));
    if (!t->cand)
        goto fail;
    for (int i = 0; i < t->ncand; i++)
        t->cand[i] = cs[i].c;
    free(cs);
    return 0;
fail:
    free(cs);
    free(t->steps);
    memset(t, 0, sizeof(*t));
    return -1;
}

const nrs_table_t *nrs_planner_table(nrs_planner_t *pl, nrs_unit_t u, int gpus)
{
    for (int i = 0; i < pl->ntables[u]; i++)
        if (pl->tables[u][i].gpus == gpus)
            return &pl->tables[u][i];
    if (pl->ntables[u] == pl->captables[u]) {
        int nc = pl->captables[u] ? 2 * pl->captables[u] : 8;
        nrs_table_t *p = realloc(pl->tables[u], (size_t)nc * sizeof(*p));
        if (!p)
            return NULL;
        pl->tables[u] = p;
        pl->captables[u] = nc;
    }
    nrs_table_t *t = &pl->tables[u][pl->ntables[u]];
    if (build_table(pl, u, gpus, t) != 0)
        return NULL;
    pl->ntables[u]++;
    return t;
}
