/* The simulator's step loop. The virtual cluster's true stage times are the cost
 * model's under the trace's hidden factors; the policy sees them only through
 * noisy measurements. Reported step latencies are the true (noise-free) times,
 * so `oracle` (true factors, best plan every step, free transitions) is a lower
 * bound of every other policy. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "adapt/adapt.h"
#include "sim/sim.h"

/* The most GPUs a run has (the trace's `gpus` limit, the planner's): the
 * size of run_t.lost and run_t.cur. */
#define NRS_SIM_MAX_GPUS (1 << 22)

static const char *const policy_names[NRS_SIM_POLICY_COUNT] = {
    "nereus", "fixed", "static-best", "oracle", "openrlhf-like", "verl-like"};

bool nrs_sim_policy_modelled(nrs_sim_policy_t p)
{
    return p == NRS_SIM_OPENRLHF || p == NRS_SIM_VERL;
}

const char *nrs_sim_policy_name(nrs_sim_policy_t p)
{
    return (unsigned)p < NRS_SIM_POLICY_COUNT ? policy_names[p] : "?";
}

int nrs_sim_policy_parse(const char *name, nrs_sim_policy_t *out)
{
    for (int i = 0; i < NRS_SIM_POLICY_COUNT; i++)
        if (!strcmp(name, policy_names[i])) {
            *out = (nrs_sim_policy_t)i;
            return 0;
        }
    return -1;
}

/* Deterministic N(0,1) from (seed, step, stream): identical for every policy. */
static double gauss_at(unsigned long seed, int step, int stream)
{
    uint64_t x = seed * 0x9E3779B97F4A7C15ULL ^ (uint64_t)step * 0xBF58476D1CE4E5B9ULL ^
                 (uint64_t)(stream + 1) * 0x94D049BB133111EBULL;
    double u[2];
    for (int i = 0; i < 2; i++) {
        uint64_t z = (x += 0x9E3779B97F4A7C15ULL);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
        z ^= z >> 31;
        u[i] = ((z >> 11) + 0.5) / 9007199254740992.0;
    }
    return sqrt(-2 * log(u[0])) * cos(2 * M_PI * u[1]);
}

typedef struct {
    const nrs_spec_t *s;     /* what the run is priced with (bspec for modelled baselines) */
    const nrs_spec_t *user;  /* the job's own spec */
    nrs_spec_t bspec;
    const nrs_trace_t *t;
    nrs_sim_policy_t pol;
    int gpus, ev;
    int *lost, nlost;
    int *cur; /* apply_events: current GPU -> GPU at the step's start */
    bool memfail, have_plan;
    double mem_cap;  /* fixed, static-best: from a failed allocation (0: none) */
    nrs_spec_t capped; /* r->s under mem_cap */
    nrs_plan_t plan, fixed_from;
    bool have_fixed_from;
    nrs_cond_t planned;
    nrs_adapt_t adapt;
    char why[256];
} run_t;

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* Applies the trace's events at `step`: GPU count, failures, memory. Each
 * event counts GPUs in the numbering the ones before it left (survivors in
 * order, added GPUs after them); r->cur maps that numbering back to the
 * step's start, in which r->lost is given, sorted. */
static int apply_events(run_t *r, int step, char *err, size_t errlen)
{
    int gpn = r->s->cluster.gpus_per_node, old = r->gpus, next_new = old;
    bool mapped = false;
    r->nlost = 0;
    r->memfail = false;
    for (; r->ev < r->t->nevents && r->t->events[r->ev].step == step; r->ev++) {
        const nrs_event_t *e = &r->t->events[r->ev];
        if (e->kind == NRS_EV_MEMORY) {
            r->memfail = true;
            continue;
        }
        if (!mapped) {
            for (int g = 0; g < r->gpus; g++)
                r->cur[g] = g;
            mapped = true;
        }
        if (e->kind == NRS_EV_GPUS) {
            for (int g = e->value; g < r->gpus; g++) /* released: their tasks are killed */
                if (r->cur[g] < old)                 /* one added just now held nothing */
                    r->lost[r->nlost++] = r->cur[g];
            for (int g = r->gpus; g < e->value; g++)
                r->cur[g] = next_new++;
            r->gpus = e->value;
        } else {
            if (r->gpus < 2 * gpn || e->value >= r->gpus / gpn) {
                snprintf(err, errlen, "%s:%d:%d: step %d: node %d cannot fail: the job has %d GPUs",
                         r->t->path, e->line, e->col, step, e->value, r->gpus);
                return -1;
            }
            int first = e->value * gpn;
            for (int g = first; g < first + gpn; g++)
                if (r->cur[g] < old)
                    r->lost[r->nlost++] = r->cur[g];
            memmove(r->cur + first, r->cur + first + gpn,
                    sizeof(int) * (size_t)(r->gpus - first - gpn));
            r->gpus -= gpn;
        }
    }
    qsort(r->lost, (size_t)r->nlost, sizeof(int), cmp_int);
    return 0;
}

static void cond_at(const run_t *r, int step, nrs_cond_t *c)
{
    c->gpus = r->gpus;
    nrs_work_from_spec(r->s, &c->work);
    c->work.response_len = r->t->response[step];
}

static bool workload_moved(const nrs_cond_t *a, const nrs_cond_t *b)
{
    return fabs(a->work.response_len / b->work.response_len - 1) >= NRS_ADAPT_WORKLOAD_DELTA;
}

/* The plan a baseline runs from now on; a move starts a new epoch. */
static void adopt(run_t *r, const nrs_cond_t *c, const nrs_plan_t *np, bool moved)
{
    unsigned epoch = !r->have_plan ? 1 : moved ? r->plan.epoch + 1 : r->plan.epoch;
    r->plan = *np;
    r->plan.epoch = epoch;
    r->planned = *c;
    r->have_plan = true;
}

/* Fixed and static-best: keep tp/pp, re-plan dp when GPUs change and
 * micro-batches when the workload moves or an allocation failed (below the
 * failed plan's peak until the GPUs or the workload change, as the
 * adaptation loop does: nrs_adapt_failed_cap).
 * Returns the true transition time. */
static int step_fixed(run_t *r, const nrs_cond_t *c, double *trans, bool *moved, bool *ckpt,
                      char *err, size_t errlen)
{
    nrs_plan_req_t req;
    nrs_plan_t np;
    bool resources = !r->have_plan || c->gpus != r->planned.gpus || r->nlost > 0;
    *trans = 0;
    *moved = *ckpt = false;
    bool moved_work = r->have_plan && workload_moved(c, &r->planned);
    if (r->have_plan && r->memfail)
        r->mem_cap = nrs_adapt_failed_cap(r->s, &c->work, &r->plan, r->mem_cap);
    else if (resources || moved_work)
        r->mem_cap = 0; /* as the adaptation loop: until the job changes */
    const nrs_spec_t *ps = nrs_adapt_capped_spec(r->s, r->mem_cap, &r->capped);
    if (r->have_plan && !resources && !r->memfail && !moved_work) {
        nrs_plan_t p = r->plan; /* micro-batches re-tuned before memory runs out */
        if (nrs_plan_eval(ps, &c->work, NULL, &p, err, errlen) == 0)
            return 0;
    }
    nrs_plan_req_init(&req, ps);
    req.gpus = c->gpus;
    req.work = c->work;
    req.mode = NRS_PLAN_FIXED;
    req.fixed_from = r->have_fixed_from ? &r->fixed_from : NULL;
    if (nrs_plan_best(ps, &req, &np, err, errlen) != 0)
        return 1; /* the baseline cannot go on */
    if (!r->have_fixed_from) {
        r->fixed_from = np;
        r->have_fixed_from = true;
    }
    if (r->have_plan && resources) {
        nrs_resize_t rz = {r->lost, r->nlost};
        double mk;
        int lostb, rc = nrs_adapt_transition_makespan(r->s, &r->plan, &np, &rz, &mk, &lostb, err,
                                                      errlen);
        if (rc == -1)
            return -1;
        *ckpt = lostb > 0; /* some state survives nowhere: restored */
        *trans = (mk + NRS_ADAPT_SETUP_S) * r->t->truth.sync + (*ckpt ? r->t->checkpoint_s : 0);
        *moved = true;
    }
    adopt(r, c, &np, *moved);
    return 0;
}

/* Modelled baselines: their template, re-planned (micro-batches) when the
 * workload moves. Neither system resizes a running job: a change of GPUs is a
 * restart from a checkpoint (trace `checkpoint`) with the template re-scaled. */
static int step_modelled(run_t *r, const nrs_cond_t *c, double *trans, bool *moved, bool *ckpt,
                         char *err, size_t errlen)
{
    nrs_plan_t np;
    bool resources = !r->have_plan || c->gpus != r->planned.gpus || r->nlost > 0;
    *trans = 0;
    *moved = *ckpt = false;
    if (r->have_plan && !resources && !workload_moved(c, &r->planned)) {
        nrs_plan_t p = r->plan;
        if (nrs_plan_eval(r->s, &c->work, NULL, &p, err, errlen) == 0)
            return 0;
    }
    if (nrs_sim_baseline_plan(r->user, r->pol, c->gpus, &c->work, &np, err, errlen) != 0)
        return 1;
    if (r->have_plan && resources) {
        *trans = r->t->checkpoint_s;
        *moved = *ckpt = true; /* a restart: counted as a restore */
    }
    adopt(r, c, &np, *moved);
    return 0;
}

/* Oracle moves are free; they are counted all the same (a change of
 * micro-batches only is no move: counted apart, as a re-tune). */
static int step_oracle(run_t *r, const nrs_cond_t *c, bool *moved, char *err, size_t errlen)
{
    nrs_plan_req_t req;
    nrs_plan_t old = r->plan;
    if (r->have_plan && c->gpus == r->planned.gpus &&
        c->work.response_len == r->planned.work.response_len && r->nlost == 0)
        return 0;
    nrs_plan_req_init(&req, r->s);
    req.gpus = c->gpus;
    req.work = c->work;
    req.calib = &r->t->truth;
    unsigned epoch = r->have_plan ? r->plan.epoch : 0;
    if (nrs_plan_best(r->s, &req, &r->plan, err, errlen) != 0)
        return 1;
    *moved = r->have_plan && !nrs_adapt_retune(&old, &r->plan); /* micro-batches: no move */
    r->plan.epoch = *moved || !r->have_plan ? epoch + 1 : epoch;
    r->planned = *c;
    r->have_plan = true;
    return 0;
}

static int step_nereus(run_t *r, int step, const nrs_cond_t *c, double *trans, bool *moved,
                       bool *forced, bool *ckpt, char *err, size_t errlen)
{
    nrs_adapt_out_t out;
    nrs_resize_t rz = {r->lost, r->nlost};
    *trans = 0;
    *moved = *forced = *ckpt = false;
    r->why[0] = '\0';
    if (!r->have_plan) {
        if (nrs_adapt_init(&r->adapt, r->s, c, err, errlen) != 0)
            return 1;
        /* The simulated job lasts the trace's steps, not the spec's: the
         * horizon is capped by what is left of the trace. */
        r->adapt.adm.total_steps = r->t->steps;
        r->have_plan = true;
        r->plan = r->adapt.plan;
        return 0;
    }
    if (nrs_adapt_step(&r->adapt, step, c, &rz, r->memfail, &out, err, errlen) != 0)
        return 1;
    if (out.trigger != NRS_TRIGGER_NONE)
        snprintf(r->why, sizeof(r->why), "%s", out.decision.why);
    if (out.changed && !out.retune) { /* a re-tune: nothing runs, nothing to measure */
        double t = (out.makespan_s + r->adapt.setup_s) * r->t->truth.sync;
        nrs_adapt_measure_transition(&r->adapt, t * exp(r->t->noise * gauss_at(r->t->seed, step, 99)),
                                     out.makespan_s);
        *ckpt = out.lost_boxes > 0;
        *trans = t + (*ckpt ? r->t->checkpoint_s : 0);
        *moved = true;
        *forced = out.decision.forced;
    }
    r->plan = r->adapt.plan;
    return 0;
}

/* True and predicted time of the current plan; measurements to the policy. */
static int run_plan(run_t *r, int step, const nrs_cond_t *c, double *true_s, double *pred_s,
                    char *err, size_t errlen)
{
    nrs_plan_t p = r->plan, q = r->plan;
    nrs_calib_t f;
    if (nrs_plan_eval(r->s, &c->work, &r->t->truth, &p, err, errlen) != 0)
        return 1;
    *true_s = p.step_s;
    if (r->pol == NRS_SIM_NEREUS)
        nrs_calibrator_factors(&r->adapt.cal, &f);
    else
        nrs_calib_init(&f);
    *pred_s = nrs_plan_eval(r->s, &c->work, r->pol == NRS_SIM_ORACLE ? &r->t->truth : &f, &q, err,
                            errlen) == 0 ? q.step_s : NAN;
    if (r->pol != NRS_SIM_NEREUS)
        return 0;
    for (int ms = 0; ms < NRS_MS_COUNT; ms++)
        if (p.has[ms])
            nrs_adapt_measure(&r->adapt, c, (nrs_ms_t)ms,
                              p.ms_time[ms] * exp(r->t->noise * gauss_at(r->t->seed, step, ms)));
    return 0;
}

static int simulate(run_t *r, nrs_sim_row_fn fn, void *arg, nrs_sim_summary_t *sum, char *err,
                    size_t errlen)
{
    const nrs_trace_t *t = r->t;
    memset(sum, 0, sizeof(*sum));
    sum->infeasible_step = -1;
    r->gpus = t->initial_gpus ? t->initial_gpus : r->s->cluster.nodes * r->s->cluster.gpus_per_node;
    if (r->gpus > NRS_SIM_MAX_GPUS) { /* as the planner says; before apply_events fills r->cur */
        sum->infeasible_step = 0;
        snprintf(sum->infeasible_why, sizeof(sum->infeasible_why),
                 "GPU count %d out of range (1..%d)", r->gpus, NRS_SIM_MAX_GPUS);
        return 0;
    }
    for (int step = 0; step < t->steps; step++) {
        nrs_cond_t c;
        double trans = 0, true_s, pred_s;
        bool moved = false, forced = false, ckpt = false, had = r->have_plan;
        nrs_plan_t prev = r->plan;
        int rc;
        if (apply_events(r, step, err, errlen) != 0)
            return -1;
        cond_at(r, step, &c);
        r->why[0] = '\0';
        if (r->pol == NRS_SIM_NEREUS)
            rc = step_nereus(r, step, &c, &trans, &moved, &forced, &ckpt, err, errlen);
        else if (r->pol == NRS_SIM_ORACLE)
            rc = step_oracle(r, &c, &moved, err, errlen);
        else if (nrs_sim_policy_modelled(r->pol))
            rc = step_modelled(r, &c, &trans, &moved, &ckpt, err, errlen);
        else
            rc = step_fixed(r, &c, &trans, &moved, &ckpt, err, errlen);
        if (rc == 0)
            rc = run_plan(r, step, &c, &true_s, &pred_s, err, errlen);
        if (rc < 0)
            return -1;
        if (rc > 0) {
            sum->infeasible_step = step;
            snprintf(sum->infeasible_why, sizeof(sum->infeasible_why), "%s", err);
            err[0] = '\0';
            break;
        }
        /* every policy's change of micro-batches only, counted apart */
        bool retune = had && !moved && !nrs_plan_same_layout(&prev, &r->plan) &&
                      nrs_adapt_retune(&prev, &r->plan);
        sum->steps++;
        sum->retunes += retune;
        sum->step_sum_s += true_s;
        sum->transition_s += trans;
        sum->transitions += moved;
        sum->forced += forced;
        sum->checkpoints += ckpt;
        sum->pred_err += isfinite(pred_s) ? fabs(pred_s / true_s - 1) : 0;
        if (fn) {
            nrs_sim_row_t row = {step, c.gpus, c.work.response_len, true_s, pred_s, trans,
                                 r->plan.epoch, moved, forced, ckpt, retune, &r->plan,
                                 r->why[0] ? r->why : NULL};
            fn(&row, arg);
        }
    }
    sum->total_s = sum->step_sum_s + sum->transition_s;
    if (sum->steps) {
        sum->mean_step_s = sum->step_sum_s / sum->steps;
        sum->pred_err /= sum->steps;
    }
    sum->transition_share = sum->total_s > 0 ? sum->transition_s / sum->total_s : 0;
    return 0;
}

static int run_one(const nrs_spec_t *s, const nrs_trace_t *t, nrs_sim_policy_t pol,
                   const nrs_plan_t *fixed_from, nrs_sim_row_fn fn, void *arg,
                   nrs_sim_summary_t *sum, char *err, size_t errlen)
{
    run_t *r = calloc(1, sizeof(*r));
    int maxg = NRS_SIM_MAX_GPUS, rc;
    if (!r || !(r->lost = malloc(sizeof(int) * (size_t)maxg)) ||
        !(r->cur = malloc(sizeof(int) * (size_t)maxg))) {
        if (r)
            free(r->lost);
        free(r);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    r->s = r->user = s;
    r->t = t;
    r->pol = pol;
    if (nrs_sim_policy_modelled(pol)) {
        nrs_sim_baseline_spec(s, pol, &r->bspec);
        r->s = &r->bspec;
    }
    if (fixed_from) {
        r->fixed_from = *fixed_from;
        r->have_fixed_from = true;
    }
    rc = simulate(r, fn, arg, sum, err, errlen);
    free(r->cur);
    free(r->lost);
    free(r);
    return rc;
}

/* Distinct tp/pp choices of the oracle's plans: the static-best candidates. */
typedef struct {
    nrs_plan_t cand[32];
    int n;
} cands_t;

static bool same_tp_pp(const nrs_plan_t *a, const nrs_plan_t *b)
{
    for (int ms = 0; ms < NRS_MS_COUNT; ms++)
        if (a->has[ms] && (a->layout[ms].tp != b->layout[ms].tp || a->layout[ms].pp != b->layout[ms].pp))
            return false;
    return true;
}

static void collect(const nrs_sim_row_t *row, void *arg)
{
    cands_t *c = arg;
    for (int i = 0; i < c->n; i++)
        if (same_tp_pp(&c->cand[i], row->plan))
            return;
    if (c->n < 32)
        c->cand[c->n++] = *row->plan;
}

int nrs_sim_run(const nrs_spec_t *s, const nrs_trace_t *t, nrs_sim_policy_t pol,
                nrs_sim_row_fn fn, void *arg, nrs_sim_summary_t *sum, char *err, size_t errlen)
{
    if (pol != NRS_SIM_STATIC_BEST)
        return run_one(s, t, pol, NULL, fn, arg, sum, err, errlen);
    /* Hindsight: every tp/pp the oracle used, kept fixed over the whole trace. */
    cands_t *c = calloc(1, sizeof(*c));
    nrs_sim_summary_t probe;
    int best = -1;
    double best_total = INFINITY;
    if (!c) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    if (run_one(s, t, NRS_SIM_ORACLE, NULL, collect, c, &probe, err, errlen) != 0) {
        free(c);
        return -1;
    }
    for (int i = 0; i < c->n; i++) {
        if (run_one(s, t, NRS_SIM_FIXED, &c->cand[i], NULL, NULL, &probe, err, errlen) != 0) {
            free(c);
            return -1;
        }
        if (probe.infeasible_step < 0 && probe.total_s < best_total) {
            best_total = probe.total_s;
            best = i;
        }
    }
    int rc = best < 0 ? run_one(s, t, NRS_SIM_FIXED, NULL, fn, arg, sum, err, errlen)
                      : run_one(s, t, NRS_SIM_FIXED, &c->cand[best], fn, arg, sum, err, errlen);
    free(c);
    return rc;
}
