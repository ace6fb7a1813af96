/* Cross-field checks of a walked spec. Each error points at the node that
 * carries the offending value: the explicit key if there is one, else the
 * preset it came from, else the mapping that lacks it. */
#include <limits.h>
#include <stdio.h>

#include "spec/spec_check.h"

static const char *const stage_names[3] = {
    [NRS_STAGE_GENERATE] = "generate", [NRS_STAGE_INFER] = "infer", [NRS_STAGE_TRAIN] = "train"};

/* Where a model's value came from. */
static nrs_mark_t model_mark(const nrs_seen_t *ms, int field)
{
    if (nrs_seen(ms, field))
        return ms->val[field];
    if (nrs_seen(ms, NRS_MD_PRESET))
        return ms->val[NRS_MD_PRESET];
    return ms->map;
}

static nrs_mark_t model_mark2(const nrs_seen_t *ms, int first, int second)
{
    return nrs_seen(ms, first) ? ms->val[first] : model_mark(ms, second);
}

static int check_role(nrs_sctx_t *c, const nrs_spec_t *s, nrs_role_t r, bool need,
                      const char *why_needed, const char *why_unused)
{
    const char *name = nrs_role_name(r);
    if (need && !s->models[r].present)
        return nrs_diag_at(&c->d, c->models.map, "missing required key '%s' in models (%s)", name,
                           why_needed);
    if (!need && s->models[r].present)
        return nrs_diag_at(&c->d, c->models.key[r], "models.%s is not used: %s", name, why_unused);
    return 0;
}

static int check_roles(nrs_sctx_t *c, const nrs_spec_t *s)
{
    const nrs_algorithm_t *a = &s->algorithm;
    if (check_role(c, s, NRS_ROLE_CRITIC, a->name == NRS_ALGO_PPO,
                   "algorithm ppo trains a critic",
                   "algorithm grpo has no critic; remove it or set algorithm.name: ppo") < 0)
        return -1;
    if (check_role(c, s, NRS_ROLE_REF, a->kl,
                   "algorithm.kl is true (the default); set kl: false to run without one",
                   "algorithm.kl is false; remove it or set kl: true") < 0)
        return -1;
    return check_role(c, s, NRS_ROLE_REWARD, a->reward_model,
                      "algorithm.reward is model (the default); use reward: rule otherwise",
                      "algorithm.reward is rule; remove it or set reward: model");
}

static const nrs_tp_pp_t *stage_layout(const nrs_model_t *m, int st)
{
    return st == NRS_STAGE_GENERATE ? &m->init_generate
           : st == NRS_STAGE_INFER  ? &m->init_infer
                                    : &m->init_train;
}

static int check_layout(nrs_sctx_t *c, const nrs_spec_t *s, nrs_role_t r, int st)
{
    const nrs_model_t *m = &s->models[r];
    const nrs_seen_t *ls = &c->tp_pp[r][st];
    const nrs_tp_pp_t *l = stage_layout(m, st);
    const nrs_cluster_t *cl = &s->cluster;
    char p[64];
    snprintf(p, sizeof(p), "models.%s.layout.%s", nrs_role_name(r), stage_names[st]);
    if (l->tp > 0 && m->heads % l->tp != 0)
        return nrs_diag_at(&c->d, ls->val[NRS_TP], "%s.tp (%d) must divide heads (%d)", p, l->tp,
                           m->heads);
    if (l->tp > 0 && m->kv_heads % l->tp != 0)
        return nrs_diag_at(&c->d, ls->val[NRS_TP], "%s.tp (%d) must divide kv_heads (%d)", p,
                           l->tp, m->kv_heads);
    if (l->tp > cl->gpus_per_node && !cl->tp_across_nodes)
        return nrs_diag_at(&c->d, ls->val[NRS_TP],
                           "%s.tp (%d) exceeds cluster.gpus_per_node (%d); set "
                           "cluster.tp_across_nodes: true to span nodes",
                           p, l->tp, cl->gpus_per_node);
    if (l->pp > m->layers)
        return nrs_diag_at(&c->d, ls->val[NRS_PP], "%s.pp (%d) exceeds layers (%d)", p, l->pp,
                           m->layers);
    long long gpus = (long long)cl->gpus_per_node * cl->nodes;
    long long used = (long long)(l->tp > 0 ? l->tp : 1) * (l->pp > 0 ? l->pp : 1);
    if (used > gpus)
        return nrs_diag_at(&c->d, nrs_seen(ls, NRS_PP) ? ls->val[NRS_PP] : ls->val[NRS_TP],
                           "%s: tp*pp (%lld) exceeds the cluster's %lld GPUs", p, used, gpus);
    return 0;
}

static int check_model(nrs_sctx_t *c, const nrs_spec_t *s, nrs_role_t r)
{
    const nrs_model_t *m = &s->models[r];
    const nrs_seen_t *ms = &c->model[r];
    const char *name = nrs_role_name(r);
    if (m->kv_heads > m->heads || m->heads % m->kv_heads != 0)
        return nrs_diag_at(&c->d, model_mark2(ms, NRS_MD_KV_HEADS, NRS_MD_HEADS),
                           "models.%s: heads (%d) must be a multiple of kv_heads (%d)", name,
                           m->heads, m->kv_heads);
    if (m->hidden % m->heads != 0)
        return nrs_diag_at(&c->d, model_mark2(ms, NRS_MD_HIDDEN, NRS_MD_HEADS),
                           "models.%s: hidden (%d) must be a multiple of heads (%d)", name,
                           m->hidden, m->heads);
    long long stacked = (long long)m->layers * m->hidden;
    if (stacked > NRS_MODEL_MAX_STACKED)
        return nrs_diag_at(&c->d, model_mark2(ms, NRS_MD_HIDDEN, NRS_MD_LAYERS),
                           "models.%s: layers * hidden (%d * %d = %lld) must be at most 2^30 "
                           "(%d): the layer tensors stack every layer in 32-bit shard "
                           "coordinates",
                           name, m->layers, m->hidden, stacked, NRS_MODEL_MAX_STACKED);
    for (int st = 0; st < 3; st++)
        if (c->tp_pp[r][st].bits && check_layout(c, s, r, st) < 0)
            return -1;
    return 0;
}

static int check_workload(nrs_sctx_t *c, nrs_spec_t *s)
{
    nrs_workload_t *w = &s->workload;
    const nrs_seen_t *ws = &c->workload;
    if (!nrs_seen(ws, NRS_WL_MAX_RESPONSE))
        w->max_response_len = w->response_len;
    if (w->max_response_len < w->response_len)
        return nrs_diag_at(&c->d, ws->val[NRS_WL_MAX_RESPONSE],
                           "workload.max_response_len (%d) must be >= response_len (%d)",
                           w->max_response_len, w->response_len);
    nrs_mark_t sm = nrs_seen(ws, NRS_WL_SAMPLES) ? ws->val[NRS_WL_SAMPLES] : ws->map;
    if (s->algorithm.name == NRS_ALGO_GRPO && w->samples_per_prompt < 2)
        return nrs_diag_at(&c->d, sm,
                           "workload.samples_per_prompt must be >= 2 for grpo (advantages are "
                           "relative to the group), got %d",
                           w->samples_per_prompt);
    if ((long long)w->global_batch * w->samples_per_prompt > INT_MAX)
        return nrs_diag_at(&c->d, sm,
                           "workload: global_batch * samples_per_prompt (%lld) is too large",
                           (long long)w->global_batch * w->samples_per_prompt);
    return 0;
}

static int check_runtime(nrs_sctx_t *c, const nrs_spec_t *s)
{
    const nrs_seen_t *rs = &c->runtime;
    if (s->runtime.mem_headroom_gib >= s->cluster.gpu_mem_gib)
        return nrs_diag_at(&c->d,
                           nrs_seen(rs, NRS_RT_HEADROOM) ? rs->val[NRS_RT_HEADROOM]
                                                         : c->cluster.val[NRS_CL_GPU_MEM],
                           "runtime.mem_headroom_gib (%g) must be less than "
                           "cluster.gpu_mem_gib (%g)",
                           s->runtime.mem_headroom_gib, s->cluster.gpu_mem_gib);
    return 0;
}

int nrs_spec_check(nrs_sctx_t *c, nrs_spec_t *s)
{
    if (check_roles(c, s) < 0)
        return -1;
    for (int r = 0; r < NRS_ROLE_COUNT; r++)
        if (s->models[r].present && check_model(c, s, (nrs_role_t)r) < 0)
            return -1;
    if (check_workload(c, s) < 0)
        return -1;
    return check_runtime(c, s);
}
