/* Exhaustive reference search over the planner's space: every pool
 * configuration, every (tp, pp, micro-batch) of every stage, each plan judged by
 * nrs_plan_eval. No tables, no bounds: it checks the real search in tests. */
#include <stdio.h>
#include <string.h>

#include "plan/plan_int.h"

enum { BRUTE_MAX_LEAVES = 200000000 };

typedef struct {
    nrs_planner_t *pl;
    const nrs_config_t *cfg;
    nrs_plan_t cur, best;
    long leaves;
    bool found, too_big;
} brute_t;

static void leaf(brute_t *B)
{
    char err[NRS_ERR_MAX];
    if (++B->leaves > BRUTE_MAX_LEAVES) {
        B->too_big = true;
        return;
    }
    if (nrs_plan_eval(B->pl->spec, &B->pl->work, &B->pl->calib, &B->cur, err, sizeof(err)) != 0)
        return;
    if (!B->found || B->cur.step_s < B->best.step_s) {
        B->best = B->cur;
        B->found = true;
    }
}

static void units(brute_t *B, int i);

static void stages(brute_t *B, int i, nrs_unit_t u, int k, nrs_layout_t l)
{
    if (k == nrs_unit_nstages(u)) {
        units(B, i + 1);
        return;
    }
    int mbs[24], n = nrs_mb_options(B->pl, u, l.dp, mbs, 24);
    for (int j = 0; j < n && !B->too_big; j++) {
        l.mb = mbs[j];
        B->cur.layout[nrs_unit_ms(u, k)] = l;
        stages(B, i, u, k + 1, l);
    }
}

static void units(brute_t *B, int i)
{
    if (i == B->pl->nunits) {
        leaf(B);
        return;
    }
    nrs_unit_t u = (nrs_unit_t)B->pl->units[i];
    int gpus = B->cfg->gpus[B->cfg->pool_of_unit[u]], tps[16];
    int ntp = nrs_tp_options(B->pl->spec, gpus, tps, 16);
    for (int a = 0; a < ntp; a++)
        for (int pp = 1; pp <= nrs_pp_max(B->pl, u, tps[a], gpus) && !B->too_big; pp++)
            stages(B, i, u, 0, (nrs_layout_t){tps[a], pp, gpus / (tps[a] * pp), 1});
}

static int on_config(const nrs_config_t *cfg, void *arg)
{
    brute_t *B = arg;
    B->cfg = cfg;
    memset(&B->cur, 0, sizeof(B->cur));
    nrs_config_to_plan(B->pl, cfg, &B->cur);
    units(B, 0);
    return B->too_big ? -1 : 0;
}

int nrs_plan_brute(const nrs_spec_t *s, const nrs_plan_req_t *req, nrs_plan_t *out, char *err,
                   size_t errlen)
{
    nrs_planner_t pl;
    brute_t B = {0};
    if (req->mode != NRS_PLAN_BEST || nrs_planner_init(&pl, s, req) != 0) {
        snprintf(err, errlen, "brute force supports mode BEST with an actor only");
        return -1;
    }
    B.pl = &pl;
    nrs_configs_foreach(&pl, req->gpus, on_config, &B);
    nrs_planner_free(&pl);
    if (B.too_big) {
        snprintf(err, errlen, "brute force: more than %d plans", BRUTE_MAX_LEAVES);
        return -1;
    }
    if (!B.found) {
        snprintf(err, errlen, "no feasible plan");
        return -1;
    }
    *out = B.best;
    return 0;
}
