/* Modelled baselines of the simulator: openrlhf-like and verl-like placements
 * (docs/baselines.md). They are MODELLED, not run: each is a template plan (pools,
 * placement, tp/pp fixed the way the system's flags fix them) plus the runtime
 * switches of the cost model that system uses, priced by the same cost model and
 * planner (NRS_PLAN_TEMPLATE chooses only micro-batches) as every other policy. */
#include <stdio.h>
#include <string.h>

#include "sim/sim.h"

void nrs_sim_baseline_spec(const nrs_spec_t *s, nrs_sim_policy_t pol, nrs_spec_t *out)
{
    *out = *s;
    nrs_runtime_t *rt = &out->runtime;
    if (pol == NRS_SIM_OPENRLHF) {
        /* train_ppo_llama_ray.sh: --zero_stage 3 --adam_offload
         * --gradient_checkpointing; weights to vLLM by _broadcast_to_vllm. */
        rt->zero3 = true;
        rt->offload_optimizer = true;
        rt->recompute = true;
        rt->weight_sync = NRS_WSYNC_BROADCAST;
    } else if (pol == NRS_SIM_VERL) {
        /* Megatron backend: distributed optimizer (ZeRO-1 over dp, the spec's
         * zero1), no parameter sharding, no offload, resharding in place. */
        rt->zero3 = false;
        rt->offload_optimizer = false;
        rt->weight_sync = NRS_WSYNC_RESHARD;
    }
}

static int round_div(int a, int b)
{
    return (2 * a + b) / (2 * b);
}

/* Largest power of two <= want that divides both n and the node. */
static int fit_tp(int want, int n, int gpn)
{
    int tp = 1;
    while (tp * 2 <= want && n % (tp * 2) == 0 && gpn % (tp * 2) == 0)
        tp *= 2;
    return tp;
}

static void set_ms(nrs_plan_t *t, const nrs_spec_t *s, nrs_ms_t ms, int pool, int tp, int pp)
{
    t->has[ms] = nrs_spec_has_ms(s, ms);
    if (!t->has[ms])
        return;
    t->pool_of[ms] = pool;
    t->layout[ms] = (nrs_layout_t){tp, pp, 0, 0};
}

/* OpenRLHF examples/scripts/train_ppo_llama_ray.sh on 8 GPUs: vLLM 2 engines x
 * tp 2 (4 GPUs), actor + ref colocated on 2, critic + reward colocated on 2.
 * The shares 1/2, 1/4, 1/4 are kept at every size, in whole nodes from 4 nodes
 * on; training is DeepSpeed ZeRO-3 data parallelism (tp = pp = 1). */
static int openrlhf_template(const nrs_spec_t *s, int gpus, nrs_plan_t *t, char *err,
                             size_t errlen)
{
    int gpn = s->cluster.gpus_per_node, g[3];
    bool third = nrs_spec_has_ms(s, NRS_MS_CRITIC_TRAIN) || nrs_spec_has_ms(s, NRS_MS_REWARD_INFER);
    int unit = gpus >= 4 * gpn ? gpn : 1, n = gpus / unit;
    if (n < (third ? 4 : 2)) {
        snprintf(err, errlen, "openrlhf-like: needs at least %d GPUs for its pools, have %d",
                 third ? 4 : 2, gpus);
        return -1;
    }
    g[0] = round_div(n, 2);
    g[1] = third ? round_div(n, 4) : n - g[0];
    if (g[1] < 1)
        g[1] = 1;
    g[2] = n - g[0] - g[1];
    memset(t, 0, sizeof(*t));
    t->total_gpus = gpus;
    t->npools = third ? 3 : 2;
    for (int i = 0, first = 0; i < t->npools; i++) {
        t->pools[i] = (nrs_pool_t){first, g[i] * unit};
        first += g[i] * unit;
    }
    const nrs_tp_pp_t *h = &s->models[NRS_ROLE_ACTOR].init_generate;
    int gen_tp = fit_tp(h->tp > 0 ? h->tp : 2, t->pools[0].gpus, gpn);
    set_ms(t, s, NRS_MS_ACTOR_GENERATE, 0, gen_tp, 1);
    set_ms(t, s, NRS_MS_ACTOR_INFER, 1, 1, 1);
    set_ms(t, s, NRS_MS_ACTOR_TRAIN, 1, 1, 1);
    set_ms(t, s, NRS_MS_REF_INFER, 1, 1, 1);
    set_ms(t, s, NRS_MS_CRITIC_INFER, 2, 1, 1);
    set_ms(t, s, NRS_MS_CRITIC_TRAIN, 2, 1, 1);
    set_ms(t, s, NRS_MS_REWARD_INFER, 2, 1, 1);
    return 0;
}

/* The (tp, pp) a verl user fixes in the config: the spec's layout hints, else
 * the fixed baseline's initial choice (best colocated plan on cluster.nodes). */
static int verl_hints(const nrs_spec_t *s, nrs_tp_pp_t h[NRS_MS_COUNT], char *err, size_t errlen)
{
    bool missing = false;
    memset(h, 0, sizeof(nrs_tp_pp_t) * NRS_MS_COUNT);
    for (int ms = 0; ms < NRS_MS_COUNT; ms++) {
        if (!nrs_spec_has_ms(s, (nrs_ms_t)ms))
            continue;
        const nrs_model_t *m = &s->models[nrs_ms_role((nrs_ms_t)ms)];
        nrs_stage_t st = nrs_ms_stage((nrs_ms_t)ms);
        const nrs_tp_pp_t *x = st == NRS_STAGE_GENERATE ? &m->init_generate
                               : (ms == NRS_MS_REF_INFER || ms == NRS_MS_REWARD_INFER)
                                   ? &m->init_infer
                                   : &m->init_train; /* actor/critic infer share train's */
        h[ms] = (nrs_tp_pp_t){x->tp, x->tp > 0 && x->pp > 0 ? x->pp : 1};
        missing |= x->tp <= 0;
    }
    if (!missing)
        return 0;
    nrs_plan_req_t req;
    nrs_plan_t p;
    nrs_plan_req_init(&req, s);
    req.mode = NRS_PLAN_FIXED;
    if (nrs_plan_best(s, &req, &p, err, errlen) != 0)
        return -1;
    for (int ms = 0; ms < NRS_MS_COUNT; ms++)
        if (p.has[ms] && h[ms].tp <= 0)
            h[ms] = (nrs_tp_pp_t){p.layout[ms].tp, p.layout[ms].pp};
    return 0;
}

/* verl (HybridFlow): every model colocated on all GPUs; training tp/pp fixed;
 * the rollout's tp divides the training tp (pp is folded into dp for
 * generation); ref and reward with their own fixed tp/pp. */
static int verl_template(const nrs_spec_t *s, int gpus, nrs_plan_t *t, char *err, size_t errlen)
{
    nrs_tp_pp_t h[NRS_MS_COUNT];
    if (verl_hints(s, h, err, errlen) != 0)
        return -1;
    memset(t, 0, sizeof(*t));
    t->total_gpus = gpus;
    t->npools = 1;
    t->pools[0] = (nrs_pool_t){0, gpus};
    const nrs_tp_pp_t *tr = &h[NRS_MS_ACTOR_TRAIN];
    /* The rollout tp is the user's hint, else the training tp: not the
     * fixed baseline's generation tp that verl_hints fills in. */
    int hint = s->models[NRS_ROLE_ACTOR].init_generate.tp;
    int want = hint > 0 ? hint : tr->tp, gen_tp = 1;
    for (int d = 1; d <= tr->tp; d++)
        if (tr->tp % d == 0 && d <= want)
            gen_tp = d;
    set_ms(t, s, NRS_MS_ACTOR_GENERATE, 0, gen_tp, 1);
    set_ms(t, s, NRS_MS_ACTOR_TRAIN, 0, tr->tp, tr->pp);
    set_ms(t, s, NRS_MS_ACTOR_INFER, 0, tr->tp, tr->pp);
    const nrs_tp_pp_t *cr = &h[NRS_MS_CRITIC_TRAIN];
    set_ms(t, s, NRS_MS_CRITIC_TRAIN, 0, cr->tp, cr->pp);
    set_ms(t, s, NRS_MS_CRITIC_INFER, 0, cr->tp, cr->pp);
    set_ms(t, s, NRS_MS_REF_INFER, 0, h[NRS_MS_REF_INFER].tp, h[NRS_MS_REF_INFER].pp);
    set_ms(t, s, NRS_MS_REWARD_INFER, 0, h[NRS_MS_REWARD_INFER].tp, h[NRS_MS_REWARD_INFER].pp);
    return 0;
}

int nrs_sim_baseline_template(const nrs_spec_t *s, nrs_sim_policy_t pol, int gpus, nrs_plan_t *t,
                              char *err, size_t errlen)
{
    if (pol == NRS_SIM_OPENRLHF)
        return openrlhf_template(s, gpus, t, err, errlen);
    if (pol == NRS_SIM_VERL)
        return verl_template(s, gpus, t, err, errlen);
    snprintf(err, errlen, "%s is not a modelled baseline", nrs_sim_policy_name(pol));
    return -1;
}

int nrs_sim_baseline_plan(const nrs_spec_t *s, nrs_sim_policy_t pol, int gpus, const nrs_work_t *w,
                          nrs_plan_t *out, char *err, size_t errlen)
{
    nrs_spec_t b;
    nrs_plan_t t;
    nrs_plan_req_t req;
    char why[NRS_ERR_MAX];
    if (nrs_sim_baseline_template(s, pol, gpus, &t, err, errlen) != 0)
        return -1;
    nrs_sim_baseline_spec(s, pol, &b);
    nrs_plan_req_init(&req, &b);
    req.gpus = gpus;
    req.work = *w;
    req.mode = NRS_PLAN_TEMPLATE;
    req.fixed_from = &t;
    if (nrs_plan_best(&b, &req, out, why, sizeof(why)) != 0) {
        snprintf(err, errlen, "%s on %d GPUs: %s", nrs_sim_policy_name(pol), gpus, why);
        return -1;
    }
    return 0;
}
