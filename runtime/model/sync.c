/* Per-step weight sync of the actor from its train layout to its generate
 * layout. docs/cost-model.md §7.
 */
#include <math.h>

#include "model/model_int.h"

static int gpus(const nrs_layout_t *l)
{
    return l->tp * l->pp * l->dp;
}

/* Same GPUs: every generation rank gathers its shard from the train replica it
 * sits in (contiguous tp*pp GPUs, NVLink when that fits a node). Bounded below
 * by all the bytes the generation replicas need over the sources' links. */
static double same_pool_s(const nrs_cluster_t *c, double total, double shard,
                          const nrs_layout_t *t, const nrs_layout_t *g)
{
    int span = t->tp * t->pp > g->tp * g->pp ? t->tp * t->pp : g->tp * g->pp;
    double bw = (span <= c->gpus_per_node ? c->intra_gbps : c->inter_gbps) * NRS_MDL_GB;

    return fmax(shard / bw, total * g->dp / (gpus(t) * bw));
}

/* Different pools: the full weights cross the NICs of the smaller side, then
 * each generation GPU must still receive its shard (NVLink fan-out). */
static double cross_pool_s(const nrs_cluster_t *c, double total, double shard,
                           const nrs_layout_t *t, const nrs_layout_t *g)
{
    int n = gpus(t) < gpus(g) ? gpus(t) : gpus(g);

    return fmax(total / (n * c->inter_gbps * NRS_MDL_GB), shard / (c->intra_gbps * NRS_MDL_GB));
}

double nrs_cost_sync_s(const nrs_spec_t *s, const nrs_layout_t *train, const nrs_layout_t *gen,
                       int same_pool, const nrs_calib_t *calib)
{
    const nrs_model_t *m = &s->models[NRS_ROLE_ACTOR];
    const nrs_cluster_t *c = &s->cluster;

    if (nrs_mdl_dims_ok(m) != 0 || train->dp < 1 || gen->dp < 1 ||
        nrs_mdl_tp_pp_ok(m, train->tp, train->pp) != 0 ||
        nrs_mdl_tp_pp_ok(m, gen->tp, gen->pp) != 0 || c->intra_gbps <= 0 ||
        c->inter_gbps <= 0 || c->gpus_per_node < 1)
        return INFINITY;
    /* Identical sharding on the same GPUs: generation reads the trained weights. */
    if (same_pool && train->tp == gen->tp && train->pp == gen->pp)
        return 0;

    double total = nrs_cost_params(m) * nrs_dtype_bytes(m->dtype);
    double shard = nrs_cost_gen_weight_bytes(s, gen);
    double t = same_pool ? same_pool_s(c, total, shard, train, gen)
                         : cross_pool_s(c, total, shard, train, gen);

    return (t + NRS_MDL_SYNC_LAT_S) * (calib ? calib->sync : 1.0);
}
