/* Why no plan fits: the tightest memory constraint, in words a user can act on. */
#include <math.h>
#include <stdio.h>

#include "plan/plan_int.h"

#define GIB (1024.0 * 1024.0 * 1024.0)

typedef struct {
    double need;  /* least bytes per GPU over layouts */
    int tp, pp;
    bool reserve; /* the transitions' reserve, not the transient, sets it */
} need_t;

/* Least memory stage k of unit u needs with the whole cluster to itself. */
static need_t least_need(nrs_planner_t *pl, nrs_unit_t u, int k, int gpus)
{
    need_t best = {NRS_INF, 0, 0, false};
    int tps[16], ntp = nrs_tp_options(pl->spec, gpus, tps, 16);
    for (int a = 0; a < ntp; a++)
        for (int pp = 1; pp <= nrs_pp_max(pl, u, tps[a], gpus); pp++) {
            nrs_layout_t l = {tps[a], pp, gpus / (tps[a] * pp), 1};
            nrs_stage_cost_t c;
            if (nrs_cost_stage(pl->spec, nrs_unit_ms(u, k), &l, &pl->work, &pl->calib, &c) != 0)
                continue;
            double persist = u == U_GEN ? nrs_cost_gen_weight_bytes(pl->spec, &l)
                                        : nrs_cost_persist_bytes(pl->spec, nrs_unit_role(u), &l);
            /* the state leaves room for the transitions' buffers, as the search
             * checks it (fl(p + max(t, r)) = max(fl(p + t), fl(p + r))); not
             * generation weights, persistent only on a pool of their own */
            double r = u == U_GEN ? 0 : NRS_PLAN_RESERVE, more = fmax(c.trans_bytes, r);
            if (persist + more < best.need)
                best = (need_t){persist + more, l.tp, l.pp, c.trans_bytes < r};
        }
    return best;
}

void nrs_plan_explain_infeasible(nrs_planner_t *pl, int gpus, char *err, size_t errlen)
{
    need_t worst = {0, 0, 0, false};
    nrs_ms_t worst_ms = NRS_MS_ACTOR_TRAIN;
    double together = 0;

    for (int i = 0; i < pl->nunits; i++) {
        nrs_unit_t u = (nrs_unit_t)pl->units[i];
        for (int k = 0; k < nrs_unit_nstages(u); k++) {
            need_t n = least_need(pl, u, k, gpus);
            if (n.need > worst.need) {
                worst = n;
                worst_ms = nrs_unit_ms(u, k);
            }
        }
        const nrs_table_t *t = nrs_planner_table(pl, u, gpus);
        if (t && t->ncand > 0)
            together += t->min_persist;
    }
    if (worst.need >= NRS_INF) {
        snprintf(err, errlen, "no feasible plan: %s has no valid layout on %d GPUs (check tp against "
                 "heads and kv_heads, and the batch)", nrs_ms_name(worst_ms), gpus);
        return;
    }
    if (worst.need > pl->cap) {
        snprintf(err, errlen,
                 "no feasible plan: %s needs %.1f GiB per GPU at best (tp=%d, pp=%d%s) but a GPU "
                 "has %.1f GiB usable",
                 nrs_ms_name(worst_ms), worst.need / GIB, worst.tp, worst.pp,
                 worst.reserve ? "; its state and the transitions' buffers" : "", pl->cap / GIB);
        return;
    }
    snprintf(err, errlen,
             "no feasible plan: every model-stage fits alone on %d GPUs, but not together: the "
             "models' state alone needs %.1f GiB per GPU at best colocated and no split into pools "
             "fits in %.1f GiB usable",
             gpus, together / GIB, pl->cap / GIB);
}
