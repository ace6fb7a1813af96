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

static double link_Bps(const nrs_cluster_t *c, int span)
{
    return (span <= c->gpus_per_node ? c->intra_gbps : c->inter_gbps) * NRS_MDL_GB;
}

/* runtime.weight_sync = broadcast (OpenRLHF's _broadcast_to_vllm): tensor by
 * tensor, the pieces of the tensor are gathered to training rank 0 (over the
 * tp*pp ranks, and the dp group under ZeRO-3), then rank 0 broadcasts the whole
 * tensor to every generation rank; each tensor also pays a fixed latency (an
 * RPC to every engine, the gather, the load into the engine). */
static double broadcast_s(const nrs_spec_t *s, double total, const nrs_layout_t *t,
                          const nrs_layout_t *g, int same_pool)
{
    const nrs_cluster_t *c = &s->cluster;
    const nrs_model_t *m = &s->models[NRS_ROLE_ACTOR];
    int holders = t->tp * t->pp * (int)nrs_mdl_zero_w(&s->runtime, t);
    int hspan = s->runtime.zero3 ? gpus(t) : t->tp * t->pp;
    /* The broadcast group: training rank 0 and the generation ranks; inside a
     * node only when both layouts share one node's GPUs. */
    int bspan = same_pool ? (gpus(t) > gpus(g) ? gpus(t) : gpus(g)) : gpus(t) + gpus(g);
    double gather = holders > 1 ? total * (holders - 1.0) / holders / link_Bps(c, hspan) : 0;

    return gather + total / link_Bps(c, bspan) +
           nrs_mdl_tensor_count(m) * NRS_MDL_SYNC_TENSOR_LAT_S;
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
    double total = nrs_cost_params(m) * nrs_dtype_bytes(m->dtype);
    double shard = nrs_cost_gen_weight_bytes(s, gen);
    double t;
    if (s->runtime.weight_sync == NRS_WSYNC_BROADCAST) {
        t = broadcast_s(s, total, train, gen, same_pool);
    } else if (same_pool && train->tp == gen->tp && train->pp == gen->pp) {
        /* Identical sharding on the same GPUs: generation reads the trained
         * weights, once ZeRO-3 has all-gathered its dp shards of them. */
        if (!s->runtime.zero3 || train->dp <= 1)
            return 0;
        t = (train->dp - 1.0) / train->dp * shard / link_Bps(c, gpus(train));
    } else {
        t = same_pool ? same_pool_s(c, total, shard, train, gen)
                      : cross_pool_s(c, total, shard, train, gen);
    }

    return (t + NRS_MDL_SYNC_LAT_S) * (calib ? calib->sync : 1.0);
}
