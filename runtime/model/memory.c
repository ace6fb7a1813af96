/* Persistent memory per GPU: weights, gradients, optimizer state.
 * docs/cost-model.md §3.
 */
#include <math.h>
#include <stdint.h>

#include "model/model_int.h"

double nrs_cost_capacity_bytes(const nrs_spec_t *s)
{
    return (s->cluster.gpu_mem_gib - s->runtime.mem_headroom_gib) * NRS_MDL_GIB;
}

static int layout_ok(const nrs_model_t *m, const nrs_layout_t *l)
{
    if (nrs_mdl_dims_ok(m) != 0 || l->dp < 1)
        return -1;
    return nrs_mdl_tp_pp_ok(m, l->tp, l->pp);
}

/* Parameters on the most loaded GPU of a (tp, pp) layout. */
static double params_per_gpu(const nrs_model_t *m, const nrs_layout_t *l)
{
    return nrs_mdl_per_gpu(m, nrs_mdl_stage_weights(m, l->pp), l->tp);
}

/* Elements of the largest of z ZeRO shards of p: a rank's flat buffer is cut
 * into z contiguous ranges [p*d/z, p*(d+1)/z), as runtime/emu/geometry.c cuts
 * it, so some hold ceil(p/z) elements (p/z counted up to z-1 elements less than
 * a GPU holds). */
static double zero_shard(double p, double z)
{
    int64_t n = (int64_t)ceil(p), k = (int64_t)z;
    return k > 1 ? (double)((n + k - 1) / k) : p;
}

static int role_trained(nrs_role_t r)
{
    return r == NRS_ROLE_ACTOR || r == NRS_ROLE_CRITIC;
}

double nrs_cost_persist_bytes(const nrs_spec_t *s, nrs_role_t r, const nrs_layout_t *l)
{
    if ((unsigned)r >= NRS_ROLE_COUNT)
        return INFINITY;
    const nrs_model_t *m = &s->models[r];
    if (!m->present)
        return 0; /* nothing to hold */
    if (layout_ok(m, l) != 0)
        return INFINITY; /* never fits: the planner must not pick it */

    double p = params_per_gpu(m, l), b = nrs_dtype_bytes(m->dtype);
    /* ZeRO-3 splits weights and gradients over dp too (every role DeepSpeed
     * runs, inference-only ones included); ZeRO-1 only the optimizer state. */
    double zw = nrs_mdl_zero_w(&s->runtime, l), zo = nrs_mdl_zero_o(&s->runtime, l);
    double bytes = zero_shard(p, zw) * b; /* weights */
    if (role_trained(r)) {
        bytes += zero_shard(p, zw) * b; /* gradients, same dtype; ZeRO-1 leaves them whole */
        if (!s->runtime.offload_optimizer) /* offloaded: master and moments on the host */
            bytes += zero_shard(p, zo) * nrs_mdl_opt_bytes_per_param(m->dtype);
    }
    return bytes;
}

double nrs_cost_gen_weight_bytes(const nrs_spec_t *s, const nrs_layout_t *l)
{
    const nrs_model_t *m = &s->models[NRS_ROLE_ACTOR];
    if (layout_ok(m, l) != 0)
        return INFINITY;
    return params_per_gpu(m, l) * nrs_dtype_bytes(m->dtype);
}
