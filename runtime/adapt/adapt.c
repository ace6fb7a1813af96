/* The adaptation loop: triggers -> re-plan with the calibrated model -> price the
 * transition with its scheduled graph -> admission. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "adapt/adapt.h"

#define NRS_ADAPT_GIB (1024.0 * 1024.0 * 1024.0)

int nrs_adapt_init(nrs_adapt_t *a, const nrs_spec_t *s, const nrs_cond_t *c, char *err,
                   size_t errlen)
{
    nrs_plan_req_t req;
    memset(a, 0, sizeof(*a));
    a->spec = s;
    a->setup_s = NRS_ADAPT_SETUP_S;
    a->recheck_step = -1;
    nrs_calibrator_init(&a->cal, s->policy.calib_alpha);
    nrs_admission_init(&a->adm, s);
    nrs_plan_req_init(&req, s);
    req.gpus = c->gpus;
    req.work = c->work;
    if (nrs_plan_best(s, &req, &a->plan, err, errlen) != 0)
        return -1;
    a->plan.epoch = 1;
    a->planned = *c;
    nrs_calib_init(&a->planned_f);
    return 0;
}

void nrs_adapt_measure(nrs_adapt_t *a, const nrs_cond_t *c, nrs_ms_t ms, double seconds)
{
    nrs_plan_t p = a->plan;
    char err[NRS_ERR_MAX];
    if ((unsigned)ms >= NRS_MS_COUNT || !p.has[ms])
        return;
    /* Uncalibrated prediction of what ran: factor 1 for every stage. */
    if (nrs_plan_eval(a->spec, &c->work, NULL, &p, err, sizeof(err)) != 0)
        return;
    nrs_calibrator_add(&a->cal, ms, seconds, p.ms_time[ms]);
}

void nrs_adapt_measure_transition(nrs_adapt_t *a, double seconds, double makespan_s)
{
    nrs_calibrator_add_sync(&a->cal, seconds, makespan_s + a->setup_s);
}

double nrs_adapt_failed_cap(const nrs_spec_t *s, const nrs_work_t *w, const nrs_plan_t *p,
                            double cap)
{
    nrs_plan_t q = *p;
    char err[NRS_ERR_MAX];
    double peak = 0;
    if (nrs_plan_eval(nrs_adapt_capped_spec(s, cap, &(nrs_spec_t){0}), w, NULL, &q, err,
                      sizeof(err)) != 0)
        return cap;
    for (int ms = 0; ms < NRS_MS_COUNT; ms++)
        if (q.has[ms])
            peak = fmax(peak, q.ms_mem[ms]);
    /* one byte below: nrs_plan_fits refuses the peak itself */
    return cap > 0 && cap < peak - 1 ? cap : peak - 1;
}

const nrs_spec_t *nrs_adapt_capped_spec(const nrs_spec_t *s, double cap_bytes, nrs_spec_t *tmp)
{
    if (!(cap_bytes > 0))
        return s;
    *tmp = *s;
    tmp->runtime.mem_headroom_gib = s->cluster.gpu_mem_gib - cap_bytes / NRS_ADAPT_GIB;
    return tmp;
}

/* The workload moved since the last planning (response or prompt length by
 * NRS_ADAPT_WORKLOAD_DELTA, or the batch). */
static bool workload_moved(const nrs_adapt_t *a, const nrs_cond_t *now)
{
    return now->work.samples != a->planned.work.samples ||
           fabs(now->work.response_len / a->planned.work.response_len - 1) >=
               NRS_ADAPT_WORKLOAD_DELTA ||
           fabs(now->work.prompt_len / a->planned.work.prompt_len - 1) >= NRS_ADAPT_WORKLOAD_DELTA;
}

static nrs_trigger_t trigger(const nrs_adapt_t *a, int step, const nrs_cond_t *now,
                             const nrs_resize_t *rz, bool memory_failed)
{
    nrs_calib_t f;
    if (now->gpus != a->planned.gpus || (rz && rz->nlost > 0))
        return NRS_TRIGGER_RESOURCES;
    if (memory_failed)
        return NRS_TRIGGER_MEMORY;
    nrs_plan_t p = a->plan; /* the model sees the next step will not fit */
    nrs_spec_t tmp;
    char err[NRS_ERR_MAX];
    nrs_calibrator_factors(&a->cal, &f);
    if (nrs_plan_eval(nrs_adapt_capped_spec(a->spec, a->mem_cap_bytes, &tmp), &now->work, &f, &p,
                      err, sizeof(err)) != 0)
        return NRS_TRIGGER_MEMORY;
    if (workload_moved(a, now))
        return NRS_TRIGGER_WORKLOAD;
    double drift = log1p(a->spec->policy.drift_threshold);
    for (int ms = 0; ms < NRS_MS_COUNT; ms++)
        if (a->plan.has[ms] && fabs(log(f.stage[ms] / a->planned_f.stage[ms])) > drift)
            return NRS_TRIGGER_CALIBRATION;
    if (fabs(log(f.sync / a->planned_f.sync)) > drift)
        return NRS_TRIGGER_CALIBRATION;
    if (a->recheck_step >= 0 && step >= a->recheck_step)
        return NRS_TRIGGER_RECHECK;
    return NRS_TRIGGER_NONE;
}

static int cmp_gpu(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* A node is damaged when a GPU of it is lost, or it is the partial node at
 * the end of a plan below one node; the others are whole. */
int nrs_adapt_gpu_place(int old_total, const int *lost, int nlost, int gpn, int gpu)
{
    int below = 0, in_node = 0, dmg_below = 0, dmg = 0, dmg_gpus_below = 0, node_lost = 0;
    int node = gpn > 0 ? gpu / gpn : 0, last = -1;
    for (int i = 0; i < nlost; i++) {
        if (lost[i] == gpu)
            return -1;
        below += lost[i] >= 0 && lost[i] < gpu;
    }
    if (gpn <= 0)
        return gpu - below;
    int nodes = (old_total + gpn - 1) / gpn, tail = old_total % gpn ? nodes - 1 : -1;
    for (int i = 0; i < nlost; i++) { /* sorted: each damaged node once */
        int d = lost[i] / gpn;
        if (lost[i] < 0 || lost[i] >= old_total)
            continue;
        if (d == node)
            node_lost++, in_node += lost[i] < gpu;
        if (d == last)
            continue;
        last = d;
        dmg++;
        if (d < node)
            dmg_below++, dmg_gpus_below += d == tail ? old_total - d * gpn : gpn;
    }
    if (tail >= 0 && tail != last) /* the partial node, not counted yet */
        dmg++, dmg_below += tail < node, dmg_gpus_below += tail < node ? old_total - tail * gpn : 0;
    if (!node_lost && node != tail)
        return (node - dmg_below) * gpn + gpu % gpn;
    int whole = (nodes - dmg) * gpn, lost_below_dmg = below - in_node;
    /* the survivors of the damaged nodes below, then this node's below gpu */
    return whole + (dmg_gpus_below - lost_below_dmg) + (gpu - node * gpn - in_node);
}

void nrs_adapt_gpu_map(int old_total, int new_total, const nrs_resize_t *rz, int gpn, int *map)
{
    int nl = 0, *lost = NULL, n = 0;
    if (rz && rz->nlost > 0 && (lost = malloc(sizeof(int) * (size_t)rz->nlost))) {
        for (int i = 0; i < rz->nlost; i++)
            if (rz->lost[i] >= 0 && rz->lost[i] < old_total)
                lost[nl++] = rz->lost[i];
        qsort(lost, (size_t)nl, sizeof(int), cmp_gpu);
        int u = 0;
        for (int i = 0; i < nl; i++)
            if (!u || lost[u - 1] != lost[i])
                lost[u++] = lost[i];
        nl = u;
    } else if (rz && rz->nlost > 0) {
        /* out of memory: survivors in order; a rank numbering otherwise than
         * the others builds another graph, which the hash vote refuses */
        gpn = 0;
    }
    for (int i = 0; i < new_total; i++)
        map[i] = -1;
    const int *l = lost ? lost : rz ? rz->lost : NULL;
    if (!lost)
        nl = rz ? rz->nlost : 0;
    for (int gpu = 0; gpu < old_total; gpu++) {
        int at = nrs_adapt_gpu_place(old_total, l, nl, gpn, gpu);
        if (at >= 0) {
            n++;
            if (at < new_total)
                map[at] = gpu;
        }
    }
    for (int i = n, next_new = old_total; i < new_total; i++)
        map[i] = next_new++;
    free(lost);
}

int nrs_adapt_transition_makespan(const nrs_spec_t *s, const nrs_plan_t *from,
                                  const nrs_plan_t *to, const nrs_resize_t *rz, double *makespan,
                                  int *lost_boxes, char *err, size_t errlen)
{
    nrs_emu_opts_t o;
    nrs_emu_graph_t *g = NULL;
    nrs_emu_stats_t st;
    int *map = NULL, rc;

    nrs_emu_opts_init(&o);
    *lost_boxes = 0;
    if (rz && rz->nlost > 0) {
        map = malloc(sizeof(int) * (size_t)(to->total_gpus > 0 ? to->total_gpus : 1));
        if (!map) {
            snprintf(err, errlen, "out of memory");
            return -1;
        }
        nrs_adapt_gpu_map(from->total_gpus, to->total_gpus, rz, s->cluster.gpus_per_node, map);
        o.gpu_map = map;
        o.ngpu_map = to->total_gpus;
        o.lost = rz->lost;
        o.nlost = rz->nlost;
    }
    rc = nrs_emu_transition(s, from, to, &o, &g, err, errlen);
    if (g) {
        nrs_emu_graph_stats(g, &st);
        *makespan = st.makespan_s;
        *lost_boxes = st.nlost;
        nrs_emu_graph_free(g);
    }
    free(map);
    return rc;
}

bool nrs_adapt_retune(const nrs_plan_t *from, const nrs_plan_t *to)
{
    if (from->total_gpus != to->total_gpus || from->npools != to->npools ||
        memcmp(from->pools, to->pools, sizeof(from->pools)) ||
        memcmp(from->has, to->has, sizeof(from->has)) ||
        memcmp(from->pool_of, to->pool_of, sizeof(from->pool_of)))
        return false;
    for (int ms = 0; ms < NRS_MS_COUNT; ms++) {
        const nrs_layout_t *f = &from->layout[ms], *t = &to->layout[ms];
        if (from->has[ms] && (f->tp != t->tp || f->pp != t->pp || f->dp != t->dp))
            return false;
    }
    return true;
}

/* nrs_adapt_transition_makespan from the current plan, remembered for the
 * next identical question when no GPU is lost (a resize's question comes
 * once). */
static int price(nrs_adapt_t *a, const nrs_plan_t *to, const nrs_resize_t *rz, double *makespan,
                 int *lost_boxes, char *err, size_t errlen)
{
    if (!rz && a->priced.valid && nrs_plan_same_layout(&a->priced.from, &a->plan) &&
        nrs_plan_same_layout(&a->priced.to, to)) {
        *makespan = a->priced.makespan_s;
        *lost_boxes = a->priced.lost_boxes;
        return a->priced.rc;
    }
    a->graphs_built++;
    int rc = nrs_adapt_transition_makespan(a->spec, &a->plan, to, rz, makespan, lost_boxes, err,
                                           errlen);
    if (!rz && rc != -1) {
        a->priced.valid = true;
        a->priced.from = a->plan;
        a->priced.to = *to;
        a->priced.rc = rc;
        a->priced.makespan_s = *makespan;
        a->priced.lost_boxes = *lost_boxes;
    }
    return rc;
}

static double current_time(const nrs_adapt_t *a, const nrs_spec_t *ps, const nrs_cond_t *now,
                           const nrs_calib_t *f, bool resources, bool memory_failed)
{
    nrs_plan_t p = a->plan;
    char err[NRS_ERR_MAX];
    /* Lost or released GPUs end the current plan; so does a failed allocation.
     * On added GPUs the current plan could go on, on the GPUs it has. */
    if (memory_failed || (resources && now->gpus < a->plan.total_gpus))
        return NRS_POLICY_INFEASIBLE;
    if (nrs_plan_eval(ps, &now->work, f, &p, err, sizeof(err)) != 0)
        return NRS_POLICY_INFEASIBLE;
    return p.step_s;
}

/* nrs_adapt_step with rz holding only the plan's own lost GPUs. */
static int decide(nrs_adapt_t *a, int step, const nrs_cond_t *now, const nrs_resize_t *rz,
                  bool memory_failed, nrs_adapt_out_t *out, char *err, size_t errlen)
{
    nrs_plan_req_t req;
    nrs_calib_t f;

    out->trigger = trigger(a, step, now, rz, memory_failed);
    if (out->trigger == NRS_TRIGGER_NONE)
        return 0;
    /* A change of resources or workload (also one the memory trigger caught
     * first) feeds the horizon; a recheck or a drift is no change of the job */
    bool changed = out->trigger == NRS_TRIGGER_RESOURCES ||
                   ((out->trigger == NRS_TRIGGER_WORKLOAD || out->trigger == NRS_TRIGGER_MEMORY) &&
                    workload_moved(a, now));
    if (changed)
        nrs_admission_note_change(&a->adm, step);
    bool resources = out->trigger == NRS_TRIGGER_RESOURCES;
    bool lost = rz && rz->nlost > 0;
    nrs_spec_t tmp;
    /* A failed allocation: plan below the failed plan's peak while the job
     * stays as it was when it failed; a change of it plans with the spec's
     * memory again (a failure that persists is seen again) */
    if (memory_failed)
        a->mem_cap_bytes = nrs_adapt_failed_cap(a->spec, &now->work, &a->plan, a->mem_cap_bytes);
    else if (changed)
        a->mem_cap_bytes = 0;
    const nrs_spec_t *ps = nrs_adapt_capped_spec(a->spec, a->mem_cap_bytes, &tmp);
    nrs_calibrator_factors(&a->cal, &f);
    nrs_plan_req_init(&req, ps);
    req.gpus = now->gpus;
    req.work = now->work;
    req.calib = &f;
    if (nrs_plan_best(ps, &req, &out->cand, err, errlen) != 0)
        return -1;
    a->planned = *now;
    a->planned_f = f;
    a->recheck_step = -1;
    /* GPUs lost end the current plan whatever the count: joiners not yet
     * planned can make it equal the plan's, and the same layout would then
     * keep the dead GPUs in it */
    double cur = lost ? NRS_POLICY_INFEASIBLE
                      : current_time(a, ps, now, &f, resources, memory_failed);
    if (cur != NRS_POLICY_INFEASIBLE && nrs_plan_same_layout(&out->cand, &a->plan))
        return 0; /* the best plan is the one we run */
    /* Micro-batches only: nothing to build or pay (no op in its graph, not
     * even a communicator: nrs_adapt_retune). GPUs lost are a move whatever
     * the layouts. */
    out->retune = !lost && nrs_adapt_retune(&a->plan, &out->cand);
    if (out->retune) {
        nrs_admission_decide_retune(&a->adm, step, cur, out->cand.step_s, &out->decision);
    } else {
        int rc = price(a, &out->cand, lost ? rz : NULL, &out->makespan_s, &out->lost_boxes, err,
                       errlen);
        if (rc == -1)
            return -1;
        out->cost_s = (out->makespan_s + a->setup_s) * f.sync;
        nrs_admission_decide(&a->adm, step, cur, out->cand.step_s, out->cost_s, &out->decision);
    }
    if (!out->decision.admit) {
        if (strstr(out->decision.why, "hysteresis"))
            a->recheck_step = a->adm.last_transition_step + a->spec->policy.hysteresis;
        return 0;
    }
    out->changed = true;
    out->cand.epoch = a->plan.epoch + 1 > a->epoch_floor ? a->plan.epoch + 1 : a->epoch_floor;
    a->plan = out->cand;
    if (!out->retune) /* a re-tune is no transition: no hysteresis after it */
        nrs_admission_note_transition(&a->adm, step);
    return 0;
}

/* The lost GPUs of rz that the current plan runs on, into *in (NULL when
 * none; free it). GPUs beyond the plan joined and were never planned on:
 * losing them leaves the plan whole, and kept in the list they would alias
 * the numbers nrs_adapt_gpu_map gives to added GPUs. -1 out of memory. */
static int lost_in_plan(const nrs_adapt_t *a, const nrs_resize_t *rz, nrs_resize_t *in)
{
    int *l, n = 0;
    in->lost = NULL;
    in->nlost = 0;
    if (!rz || rz->nlost <= 0)
        return 0;
    if (!(l = malloc(sizeof(int) * (size_t)rz->nlost)))
        return -1;
    for (int i = 0; i < rz->nlost; i++)
        if (rz->lost[i] >= 0 && rz->lost[i] < a->plan.total_gpus)
            l[n++] = rz->lost[i];
    if (!n) {
        free(l);
        return 0;
    }
    in->lost = l;
    in->nlost = n;
    return 0;
}

int nrs_adapt_step(nrs_adapt_t *a, int step, const nrs_cond_t *now, const nrs_resize_t *rz,
                   bool memory_failed, nrs_adapt_out_t *out, char *err, size_t errlen)
{
    nrs_resize_t in;
    memset(out, 0, sizeof(*out));
    if (lost_in_plan(a, rz, &in) != 0) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    int rc = decide(a, step, now, &in, memory_failed, out, err, errlen);
    free((int *)in.lost);
    return rc;
}
