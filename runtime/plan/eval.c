/* Ground truth of a plan: recomputes every prediction from the cost model and
 * checks memory on every pool in every phase. The search produces plans; this
 * is what they are judged by. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "plan/plan_int.h"

#define GIB (1024.0 * 1024.0 * 1024.0)

static const nrs_ms_t home_ms[NRS_ROLE_COUNT] = {NRS_MS_ACTOR_TRAIN, NRS_MS_CRITIC_TRAIN,
                                                 NRS_MS_REF_INFER, NRS_MS_REWARD_INFER};

void nrs_plan_req_init(nrs_plan_req_t *req, const nrs_spec_t *s)
{
    memset(req, 0, sizeof(*req));
    req->gpus = s->cluster.nodes * s->cluster.gpus_per_node;
    nrs_work_from_spec(s, &req->work);
    req->mode = NRS_PLAN_BEST;
}

int nrs_plan_home(const nrs_plan_t *p, nrs_role_t r)
{
    return p->has[home_ms[r]] ? p->pool_of[home_ms[r]] : -1;
}

bool nrs_plan_same_layout(const nrs_plan_t *a, const nrs_plan_t *b)
{
    return a->total_gpus == b->total_gpus && a->npools == b->npools &&
           !memcmp(a->pools, b->pools, sizeof(a->pools)) &&
           !memcmp(a->pool_of, b->pool_of, sizeof(a->pool_of)) &&
           !memcmp(a->layout, b->layout, sizeof(a->layout));
}

static int check_shape(const nrs_spec_t *s, const nrs_plan_t *p, char *err, size_t errlen)
{
    int next = 0;
    if (p->npools < 1 || p->npools > NRS_POOL_MAX) {
        snprintf(err, errlen, "plan has %d pools (1..%d allowed)", p->npools, NRS_POOL_MAX);
        return -1;
    }
    for (int i = 0; i < p->npools; i++) {
        if (p->pools[i].first_gpu != next || p->pools[i].gpus < 1) {
            snprintf(err, errlen, "pool %d is not a contiguous non-empty GPU range", i);
            return -1;
        }
        next += p->pools[i].gpus;
    }
    if (next != p->total_gpus) {
        snprintf(err, errlen, "pools cover %d GPUs, plan has %d", next, p->total_gpus);
        return -1;
    }
    for (int ms = 0; ms < NRS_MS_COUNT; ms++) {
        if (p->has[ms] != nrs_spec_has_ms(s, (nrs_ms_t)ms)) {
            snprintf(err, errlen, "%s: %s by the plan but %s by the spec", nrs_ms_name((nrs_ms_t)ms),
                     p->has[ms] ? "run" : "not run", p->has[ms] ? "absent" : "required");
            return -1;
        }
        if (!p->has[ms])
            continue;
        const nrs_layout_t *l = &p->layout[ms];
        if (p->pool_of[ms] < 0 || p->pool_of[ms] >= p->npools) {
            snprintf(err, errlen, "%s: no pool", nrs_ms_name((nrs_ms_t)ms));
            return -1;
        }
        if (l->tp < 1 || l->pp < 1 || l->dp < 1 ||
            (long)l->tp * l->pp * l->dp > p->pools[p->pool_of[ms]].gpus) {
            snprintf(err, errlen, "%s: tp*pp*dp = %ld exceeds its pool's %d GPUs",
                     nrs_ms_name((nrs_ms_t)ms), (long)l->tp * l->pp * l->dp,
                     p->pools[p->pool_of[ms]].gpus);
            return -1;
        }
    }
    static const nrs_ms_t pairs[2][2] = {{NRS_MS_ACTOR_INFER, NRS_MS_ACTOR_TRAIN},
                                         {NRS_MS_CRITIC_INFER, NRS_MS_CRITIC_TRAIN}};
    for (int i = 0; i < 2; i++) {
        nrs_ms_t a = pairs[i][0], b = pairs[i][1];
        if (!p->has[a])
            continue;
        if (p->pool_of[a] != p->pool_of[b] || p->layout[a].tp != p->layout[b].tp ||
            p->layout[a].pp != p->layout[b].pp || p->layout[a].dp != p->layout[b].dp) {
            snprintf(err, errlen, "%s must share pool, tp, pp and dp with %s", nrs_ms_name(a),
                     nrs_ms_name(b));
            return -1;
        }
    }
    return 0;
}

bool nrs_plan_gen_in_place(const nrs_spec_t *s, bool same_pool, const nrs_layout_t *train,
                           const nrs_layout_t *gen)
{
    if (!same_pool || train->tp != gen->tp || train->pp != gen->pp)
        return false;
    /* ZeRO-3 leaves 1/dp of the shard on a training rank: generation needs it
     * whole (the sync all-gathers it into buffers of its own). A broadcast sync
     * loads a generation engine that keeps its own copy. */
    if (s->runtime.zero3 && train->dp > 1)
        return false;
    return s->runtime.weight_sync != NRS_WSYNC_BROADCAST;
}

/* Whether generation keeps its own weights on its pool, and what it adds. */
static double gen_extra(const nrs_spec_t *s, const nrs_plan_t *p, bool *separate)
{
    const nrs_layout_t *g = &p->layout[NRS_MS_ACTOR_GENERATE], *t = &p->layout[NRS_MS_ACTOR_TRAIN];
    *separate = p->pool_of[NRS_MS_ACTOR_GENERATE] != p->pool_of[NRS_MS_ACTOR_TRAIN];
    if (nrs_plan_gen_in_place(s, !*separate, t, g))
        return 0; /* generation reads the training weights in place */
    return nrs_cost_gen_weight_bytes(s, g);
}

int nrs_plan_calib_check(const nrs_calib_t *c, char *err, size_t errlen)
{
    if (!c)
        return 0;
    for (int ms = 0; ms < NRS_MS_COUNT; ms++)
        if (!isfinite(c->stage[ms]) || !(c->stage[ms] > 0)) {
            snprintf(err, errlen, "invalid calibration factor for %s: %g (must be finite and > 0)",
                     nrs_ms_name((nrs_ms_t)ms), c->stage[ms]);
            return -1;
        }
    if (!isfinite(c->sync) || !(c->sync > 0)) {
        snprintf(err, errlen, "invalid calibration factor for the weight sync: %g "
                              "(must be finite and > 0)", c->sync);
        return -1;
    }
    return 0;
}

int nrs_plan_eval(const nrs_spec_t *s, const nrs_work_t *w, const nrs_calib_t *calib,
                  nrs_plan_t *p, char *err, size_t errlen)
{
    double persist[NRS_POOL_MAX] = {0}, work[3][NRS_POOL_MAX] = {{0}};
    nrs_calib_t defc;
    bool gen_separate;

    if (!calib) {
        nrs_calib_init(&defc);
        calib = &defc;
    }
    if (nrs_plan_calib_check(calib, err, errlen) != 0 || check_shape(s, p, err, errlen) != 0)
        return -1;
    p->capacity_bytes = nrs_cost_capacity_bytes(s);
    for (int r = 0; r < NRS_ROLE_COUNT; r++) { /* nrs_plan_persist_order */
        int h = nrs_plan_home(p, (nrs_role_t)r);
        if (h >= 0)
            persist[h] += nrs_cost_persist_bytes(s, (nrs_role_t)r, &p->layout[home_ms[r]]);
    }
    double extra = gen_extra(s, p, &gen_separate);
    if (gen_separate) {
        persist[p->pool_of[NRS_MS_ACTOR_GENERATE]] += extra;
        extra = 0;
    }
    for (int ms = 0; ms < NRS_MS_COUNT; ms++) {
        nrs_stage_cost_t c;
        if (!p->has[ms])
            continue;
        int pool = p->pool_of[ms];
        if (nrs_cost_stage(s, (nrs_ms_t)ms, &p->layout[ms], w, calib, &c) != 0) {
            snprintf(err, errlen, "%s: layout tp=%d pp=%d dp=%d mb=%d is not valid for the model",
                     nrs_ms_name((nrs_ms_t)ms), p->layout[ms].tp, p->layout[ms].pp,
                     p->layout[ms].dp, p->layout[ms].mb);
            return -1;
        }
        double held = persist[pool] + (ms == NRS_MS_ACTOR_GENERATE ? extra : 0);
        p->ms_time[ms] = c.time_s;
        p->ms_mem[ms] = held + c.trans_bytes;
        if (!nrs_plan_fits(held, c.trans_bytes, p->capacity_bytes)) {
            snprintf(err, errlen,
                     "%s needs %.1f GiB per GPU (tp=%d, pp=%d, mb=%d) but a GPU has %.1f GiB usable",
                     nrs_ms_name((nrs_ms_t)ms), p->ms_mem[ms] / GIB, p->layout[ms].tp,
                     p->layout[ms].pp, p->layout[ms].mb, p->capacity_bytes / GIB);
            return -1;
        }
        work[nrs_ms_stage((nrs_ms_t)ms)][pool] += c.time_s;
    }
    for (int i = 0; i < p->npools; i++)
        if (!nrs_plan_fits(persist[i], NRS_PLAN_RESERVE, p->capacity_bytes)) {
            snprintf(err, errlen,
                     "pool %d: persistent state of %.1f GiB per GPU leaves less than the "
                     "transitions' %.0f MiB for transfer buffers of %.1f GiB usable",
                     i, persist[i] / GIB, NRS_PLAN_RESERVE / (1 << 20), p->capacity_bytes / GIB);
            return -1;
        }
    p->step_s = 0;
    for (int ph = 0; ph < 3; ph++) {
        p->phase_time[ph] = 0;
        for (int i = 0; i < p->npools; i++)
            p->phase_time[ph] = fmax(p->phase_time[ph], work[ph][i]);
        p->step_s += p->phase_time[ph];
    }
    p->sync_s = nrs_cost_sync_s(s, &p->layout[NRS_MS_ACTOR_TRAIN], &p->layout[NRS_MS_ACTOR_GENERATE],
                                !gen_separate, calib);
    p->step_s += p->sync_s;
    return 0;
}
