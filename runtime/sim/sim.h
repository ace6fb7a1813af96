/* Trace-driven simulator (docs/simulator.md): replays GPUs and response length
 * over time on a virtual cluster whose true speeds differ from the cost model's
 * by hidden factors, running the real planner, policy and transition graph. */
#ifndef NRS_SIM_H
#define NRS_SIM_H

#include "nereus/plan.h"

enum { NRS_TRACE_MAX_STEPS = 1000000, NRS_TRACE_MAX_EVENTS = 4096 };

typedef enum { NRS_EV_GPUS, NRS_EV_FAIL, NRS_EV_MEMORY } nrs_event_kind_t;

typedef struct {
    int step;
    nrs_event_kind_t kind;
    int value; /* GPUS: GPU count; FAIL: node index; MEMORY: unused */
    int order; /* position in the file: ties keep it */
    int line, col; /* of its value in the trace, for errors found while simulating */
} nrs_event_t;

typedef struct {
    char path[256];
    int steps;
    unsigned long seed;
    double noise;             /* sigma of log-normal measurement noise */
    double checkpoint_s;      /* restore from checkpoint when state is lost */
    nrs_calib_t truth;        /* hidden factors: true time = model x factor */
    int initial_gpus;         /* 0: the spec's */
    double *response;         /* [steps] mean response length per step */
    nrs_event_t events[NRS_TRACE_MAX_EVENTS];
    int nevents;              /* sorted by step, then file order */
} nrs_trace_t;

/* Loads a trace for spec s; errors are "FILE:LINE:COL: message". */
int nrs_trace_load(const char *path, const nrs_spec_t *s, nrs_trace_t *t, char *err, size_t errlen);
void nrs_trace_free(nrs_trace_t *t);

typedef enum {
    NRS_SIM_NEREUS,
    NRS_SIM_FIXED,
    NRS_SIM_STATIC_BEST,
    NRS_SIM_ORACLE,
    NRS_SIM_OPENRLHF, /* modelled OpenRLHF placement (docs/baselines.md), not run */
    NRS_SIM_VERL,     /* modelled verl placement (docs/baselines.md), not run */
    NRS_SIM_POLICY_COUNT
} nrs_sim_policy_t;

const char *nrs_sim_policy_name(nrs_sim_policy_t p);
int nrs_sim_policy_parse(const char *name, nrs_sim_policy_t *out);
/* Whether the policy is one of the modelled baselines (openrlhf-like, verl-like). */
bool nrs_sim_policy_modelled(nrs_sim_policy_t p);

/* ---- modelled baselines (runtime/sim/baselines.c, docs/baselines.md) ----- */

/* The spec the baseline is priced with: s with the runtime switches of the
 * cost model that system uses (zero3, offload_optimizer, recompute,
 * weight_sync). */
void nrs_sim_baseline_spec(const nrs_spec_t *s, nrs_sim_policy_t pol, nrs_spec_t *out);
/* The baseline's template plan on `gpus` GPUs: pools, placement, tp/pp (dp and
 * micro-batches unset). 0, or -1 with err. */
int nrs_sim_baseline_template(const nrs_spec_t *s, nrs_sim_policy_t pol, int gpus, nrs_plan_t *t,
                              char *err, size_t errlen);
/* The template planned for work w (NRS_PLAN_TEMPLATE: dp fills the pools,
 * micro-batches chosen to fit memory) under the baseline's spec. */
int nrs_sim_baseline_plan(const nrs_spec_t *s, nrs_sim_policy_t pol, int gpus, const nrs_work_t *w,
                          nrs_plan_t *out, char *err, size_t errlen);

typedef struct {
    int step, gpus;
    double response_len;
    double step_s;       /* true (noise-free) step latency */
    double predicted_s;  /* the policy's prediction of it (calibrated for nereus) */
    double transition_s; /* true time of a transition made before this step */
    unsigned epoch;
    bool transition, forced, checkpoint;
    bool retune;         /* the plan changed micro-batches only before this step:
                          * no transition, free (nrs_adapt_retune) */
    const nrs_plan_t *plan;
    const char *why;     /* the admission decision, when one was taken */
} nrs_sim_row_t;

typedef struct {
    int steps, transitions, forced, checkpoints;
    int retunes;         /* changes of micro-batches only (not transitions) */
    double total_s, step_sum_s, transition_s;
    double mean_step_s, transition_share;
    double pred_err;     /* mean |predicted / true - 1| over steps */
    int infeasible_step; /* -1, or the step where the policy could not go on */
    char infeasible_why[NRS_ERR_MAX];
} nrs_sim_summary_t;

typedef void (*nrs_sim_row_fn)(const nrs_sim_row_t *row, void *arg);

/* Runs one policy over the trace; row_fn (may be NULL) sees every step.
 * 0 on success (an infeasible baseline is reported in the summary, not an
 * error); -1 with err on a failure of the simulator itself. */
int nrs_sim_run(const nrs_spec_t *s, const nrs_trace_t *t, nrs_sim_policy_t pol,
                nrs_sim_row_fn row_fn, void *arg, nrs_sim_summary_t *sum, char *err,
                size_t errlen);

#endif
