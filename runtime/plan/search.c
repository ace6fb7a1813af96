/* The planner's search: for every pool configuration, a depth-first search over
 * the units' (tp, pp) with branch and bound. The best micro-batch of a stage
 * given the memory left on its pool comes from the candidate's staircase.
 *
 * Bound: persistent bytes of units not yet placed are counted at their least
 * possible value, their stage times at their least possible value; times only
 * grow as memory shrinks, so the bound never exceeds any completion and the
 * search is exact. Ties keep the first plan found, in a fixed order:
 * deterministic. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "plan/plan_int.h"

typedef struct {
    int tp, pp; /* 0: free */
} restrict_t;

typedef struct {
    nrs_planner_t *pl;
    const nrs_config_t *cfg;
    const nrs_table_t *tab[U_COUNT];
    int choice[U_COUNT];
    restrict_t only[U_COUNT];
    bool colocated_only;
    bool oom;           /* a table could not be built */
    double best;
    nrs_config_t best_cfg;
    int best_choice[U_COUNT];
} search_t;

static bool gen_coloc(const search_t *S)
{
    return S->cfg->pool_of_unit[U_GEN] == S->cfg->pool_of_unit[U_ACTOR];
}

/* Lower bound of the step time with units[0..depth) placed (exact at the leaf).
 * mb, when given, receives the chosen micro-batches. */
static double bound(const search_t *S, int depth, int mb[U_COUNT][2])
{
    const nrs_planner_t *pl = S->pl;
    double P[NRS_POOL_MAX] = {0}, ph[3][NRS_POOL_MAX] = {{0}}, extra = 0, sync = 0;
    bool coloc = gen_coloc(S), placed[U_COUNT] = {false};

    for (int i = 0; i < depth; i++)
        placed[pl->units[i]] = true;
    /* summed in nrs_plan_eval's order: at the leaf, the same bytes to the bit */
    for (int k = 0; k < U_COUNT; k++) {
        nrs_unit_t u = nrs_plan_persist_order[k];
        if (!pl->present[u] || (u == U_GEN && coloc))
            continue; /* generation weights are transient on the actor's pool */
        P[S->cfg->pool_of_unit[u]] +=
            placed[u] ? S->tab[u]->cand[S->choice[u]].persist : S->tab[u]->min_persist;
    }
    for (int p = 0; p < S->cfg->npools; p++) /* room for a transition's buffers */
        if (!nrs_plan_fits(P[p], NRS_PLAN_RESERVE, pl->cap))
            return NRS_INF;
    if (depth > 1 && pl->present[U_GEN]) { /* actor and gen are units[0], units[1] */
        const nrs_cand_t *a = &S->tab[U_ACTOR]->cand[S->choice[U_ACTOR]];
        const nrs_cand_t *g = &S->tab[U_GEN]->cand[S->choice[U_GEN]];
        nrs_layout_t la = {a->tp, a->pp, a->dp, 1}, lg = {g->tp, g->pp, g->dp, 1};
        if (coloc && !nrs_plan_gen_in_place(pl->spec, true, &la, &lg))
            extra = g->persist;
        sync = nrs_cost_sync_s(pl->spec, &la, &lg, coloc, &pl->calib);
    }
    for (int i = 0; i < pl->nunits; i++) {
        nrs_unit_t u = (nrs_unit_t)pl->units[i];
        int pool = S->cfg->pool_of_unit[u];
        for (int k = 0; k < nrs_unit_nstages(u); k++) {
            int phase = nrs_ms_stage(nrs_unit_ms(u, k));
            double t;
            if (i < depth) {
                double held = P[pool] + (u == U_GEN ? extra : 0);
                t = nrs_cand_time(S->tab[u], &S->tab[u]->cand[S->choice[u]], k, held, pl->cap,
                                  mb ? &mb[u][k] : NULL);
            } else {
                t = S->tab[u]->lb_stage[k];
            }
            if (t >= NRS_INF)
                return NRS_INF;
            ph[phase][pool] += t;
        }
    }
    double total = sync;
    for (int f = 0; f < 3; f++) {
        double m = 0;
        for (int p = 0; p < S->cfg->npools; p++)
            m = fmax(m, ph[f][p]);
        total += m;
    }
    return total;
}

static bool allowed(const search_t *S, nrs_unit_t u, const nrs_cand_t *c)
{
    const restrict_t *r = &S->only[u];
    return !r->tp || (r->tp == c->tp && r->pp == c->pp);
}

static void dfs(search_t *S, int depth)
{
    if (depth == S->pl->nunits) {
        double v = bound(S, depth, NULL);
        if (v < S->best) {
            S->best = v;
            S->best_cfg = *S->cfg;
            memcpy(S->best_choice, S->choice, sizeof(S->choice));
        }
        return;
    }
    nrs_unit_t u = (nrs_unit_t)S->pl->units[depth];
    for (int c = 0; c < S->tab[u]->ncand; c++) {
        if (!allowed(S, u, &S->tab[u]->cand[c]))
            continue;
        S->choice[u] = c;
        if (bound(S, depth + 1, NULL) < S->best)
            dfs(S, depth + 1);
    }
}

static int on_config(const nrs_config_t *cfg, void *arg)
{
    search_t *S = arg;
    if (S->colocated_only && cfg->npools != 1)
        return 0;
    S->cfg = cfg;
    for (int i = 0; i < S->pl->nunits; i++) {
        nrs_unit_t u = (nrs_unit_t)S->pl->units[i];
        S->tab[u] = nrs_planner_table(S->pl, u, cfg->gpus[cfg->pool_of_unit[u]]);
        if (!S->tab[u]) {
            S->oom = true;
            return -1;
        }
        if (S->tab[u]->ncand == 0)
            return 0;
    }
    if (bound(S, 0, NULL) < S->best)
        dfs(S, 0);
    return 0;
}

/* Materialises the best plan found and checks it against the ground truth. */
static int finish(search_t *S, nrs_plan_t *out, char *err, size_t errlen)
{
    int mb[U_COUNT][2] = {{0}};
    nrs_planner_t *pl = S->pl;

    S->cfg = &S->best_cfg;
    for (int u = 0; u < U_COUNT; u++)
        if (pl->present[u])
            S->tab[u] = nrs_planner_table(pl, (nrs_unit_t)u, S->best_cfg.gpus[S->best_cfg.pool_of_unit[u]]);
    memcpy(S->choice, S->best_choice, sizeof(S->choice));
    bound(S, pl->nunits, mb);
    memset(out, 0, sizeof(*out));
    nrs_config_to_plan(pl, &S->best_cfg, out);
    for (int u = 0; u < U_COUNT; u++) {
        if (!pl->present[u])
            continue;
        const nrs_cand_t *c = &S->tab[u]->cand[S->choice[u]];
        for (int k = 0; k < nrs_unit_nstages((nrs_unit_t)u); k++)
            out->layout[nrs_unit_ms((nrs_unit_t)u, k)] = (nrs_layout_t){c->tp, c->pp, c->dp, mb[u][k]};
    }
    return nrs_plan_eval(pl->spec, &pl->work, &pl->calib, out, err, errlen);
}

static int check_req(const nrs_spec_t *s, const nrs_plan_req_t *req, char *err, size_t errlen)
{
    int gpn = s->cluster.gpus_per_node;
    if (req->gpus < 1 || req->gpus > (1 << 22)) {
        snprintf(err, errlen, "GPU count %d out of range (1..%d)", req->gpus, 1 << 22);
        return -1;
    }
    if (req->gpus > gpn && req->gpus % gpn != 0) {
        snprintf(err, errlen, "%d GPUs is not a whole number of %d-GPU nodes", req->gpus, gpn);
        return -1;
    }
    if (req->work.samples < 1 || !(req->work.prompt_len >= 1) || !(req->work.response_len >= 1)) {
        snprintf(err, errlen, "workload needs at least one sequence of at least one token");
        return -1;
    }
    if (!s->models[NRS_ROLE_ACTOR].present) {
        snprintf(err, errlen, "the spec has no actor model");
        return -1;
    }
    return nrs_plan_calib_check(req->calib, err, errlen);
}

static int run_search(nrs_planner_t *pl, search_t *S, int gpus, nrs_plan_t *out, char *err,
                      size_t errlen)
{
    S->pl = pl;
    S->best = NRS_INF;
    nrs_configs_foreach(pl, gpus, on_config, S);
    if (S->oom) {
        snprintf(err, errlen, "out of memory while planning");
        return -1;
    }
    if (S->best >= NRS_INF) {
        nrs_plan_explain_infeasible(pl, gpus, err, errlen);
        return -1;
    }
    return finish(S, out, err, errlen);
}

/* tp/pp the fixed baseline keeps: the given plan's, else the spec's layout
 * hints, else the best colocated plan's on the spec's initial nodes. */
static int fixed_layouts(const nrs_spec_t *s, const nrs_plan_req_t *req, restrict_t only[U_COUNT],
                         char *err, size_t errlen)
{
    static const struct {
        nrs_unit_t u;
        nrs_ms_t ms;
    } defs[] = {{U_GEN, NRS_MS_ACTOR_GENERATE}, {U_ACTOR, NRS_MS_ACTOR_TRAIN},
                {U_CRITIC, NRS_MS_CRITIC_TRAIN}, {U_REF, NRS_MS_REF_INFER},
                {U_REWARD, NRS_MS_REWARD_INFER}};
    memset(only, 0, sizeof(restrict_t) * U_COUNT);
    if (req->fixed_from) {
        for (size_t i = 0; i < sizeof(defs) / sizeof(defs[0]); i++)
            if (req->fixed_from->has[defs[i].ms])
                only[defs[i].u] = (restrict_t){req->fixed_from->layout[defs[i].ms].tp,
                                               req->fixed_from->layout[defs[i].ms].pp};
        return 0;
    }
    for (size_t i = 0; i < sizeof(defs) / sizeof(defs[0]); i++) {
        const nrs_model_t *m = &s->models[nrs_ms_role(defs[i].ms)];
        const nrs_tp_pp_t *h = defs[i].u == U_GEN       ? &m->init_generate
                               : defs[i].u == U_ACTOR || defs[i].u == U_CRITIC ? &m->init_train
                                                                               : &m->init_infer;
        if (h->tp > 0)
            only[defs[i].u] = (restrict_t){h->tp, h->pp > 0 ? h->pp : 1};
    }
    /* Units without a hint: best colocated plan at the initial size. */
    nrs_plan_req_t init = *req;
    nrs_planner_t pl;
    search_t S = {0};
    nrs_plan_t p;
    init.gpus = s->cluster.nodes * s->cluster.gpus_per_node;
    if (nrs_planner_init(&pl, s, &init) != 0) {
        snprintf(err, errlen, "the spec has no actor model");
        return -1;
    }
    memcpy(S.only, only, sizeof(S.only));
    S.colocated_only = true;
    int rc = run_search(&pl, &S, init.gpus, &p, err, errlen);
    nrs_planner_free(&pl);
    if (rc != 0) {
        char why[NRS_ERR_MAX];
        snprintf(why, sizeof(why), "%s", err);
        snprintf(err, errlen, "fixed baseline: no initial colocated plan on %d GPUs: %s", init.gpus, why);
        return -1;
    }
    for (size_t i = 0; i < sizeof(defs) / sizeof(defs[0]); i++)
        if (p.has[defs[i].ms])
            only[defs[i].u] = (restrict_t){p.layout[defs[i].ms].tp, p.layout[defs[i].ms].pp};
    return 0;
}

/* TEMPLATE: one configuration, every unit's tp/pp given. */
static int run_template(nrs_planner_t *pl, search_t *S, const nrs_plan_t *t, nrs_plan_t *out,
                        char *err, size_t errlen)
{
    nrs_config_t cfg = {.npools = t->npools};
    if (t->npools < 1 || t->npools > NRS_POOL_MAX || t->total_gpus != pl->tgpus) {
        snprintf(err, errlen, "template plan: %d pools on %d GPUs, request for %d GPUs", t->npools,
                 t->total_gpus, pl->tgpus);
        return -1;
    }
    for (int i = 0; i < t->npools; i++)
        cfg.gpus[i] = t->pools[i].gpus;
    for (int u = 0; u < U_COUNT; u++) {
        nrs_ms_t ms = nrs_unit_ms((nrs_unit_t)u, 0);
        cfg.pool_of_unit[u] = pl->present[u] ? t->pool_of[ms] : -1;
        if (pl->present[u] && (!t->has[ms] || t->pool_of[ms] < 0 || t->pool_of[ms] >= t->npools)) {
            snprintf(err, errlen, "template plan: %s has no pool", nrs_ms_name(ms));
            return -1;
        }
        if (pl->present[u])
            S->only[u] = (restrict_t){t->layout[ms].tp, t->layout[ms].pp};
    }
    S->pl = pl;
    S->best = NRS_INF;
    on_config(&cfg, S);
    if (S->oom) {
        snprintf(err, errlen, "out of memory while planning");
        return -1;
    }
    if (S->best >= NRS_INF) {
        snprintf(err, errlen, "no feasible plan: the template's layouts do not fit in memory on "
                              "their pools (or tp does not divide the heads)");
        return -1;
    }
    return finish(S, out, err, errlen);
}

int nrs_plan_best(const nrs_spec_t *s, const nrs_plan_req_t *req, nrs_plan_t *out, char *err,
                  size_t errlen)
{
    nrs_planner_t pl;
    search_t S = {0};
    int rc;

    if (check_req(s, req, err, errlen) != 0)
        return -1;
    if (req->mode == NRS_PLAN_FIXED) {
        if (fixed_layouts(s, req, S.only, err, errlen) != 0)
            return -1;
        S.colocated_only = true;
    }
    nrs_planner_init(&pl, s, req);
    pl.tgpus = req->gpus;
    if (req->mode == NRS_PLAN_TEMPLATE) {
        rc = req->fixed_from ? run_template(&pl, &S, req->fixed_from, out, err, errlen) : -1;
        if (!req->fixed_from)
            snprintf(err, errlen, "template mode needs a template plan (fixed_from)");
        nrs_planner_free(&pl);
        return rc;
    }
    rc = run_search(&pl, &S, req->gpus, out, err, errlen);
    if (rc != 0 && req->mode == NRS_PLAN_FIXED) {
        char why[NRS_ERR_MAX];
        snprintf(why, sizeof(why), "%s", err);
        snprintf(err, errlen, "fixed baseline (tp/pp kept) infeasible on %d GPUs: %s", req->gpus, why);
    }
    nrs_planner_free(&pl);
    return rc;
}
