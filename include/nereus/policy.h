/* Nereus controller policy: online calibration of the cost model and admission
 * of transitions (docs/policy.md). One policy, called by the
 * controller daemon and the simulator alike. */
#ifndef NEREUS_POLICY_H
#define NEREUS_POLICY_H

#include "nereus/plan.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- calibration -------------------------------------------------------- */

/* Per model-stage multiplicative corrections of the cost model, fitted from
 * measured times. Robust: log-space running mean for the first steps, then an
 * exponential average, with residuals clipped at 3 robust deviations. */
typedef struct {
    double log_f[NRS_MS_COUNT]; /* log of the fitted factor */
    double dev[NRS_MS_COUNT];   /* robust scale of log residuals */
    double err[NRS_MS_COUNT];   /* smoothed |log(measured / predicted)| */
    int n[NRS_MS_COUNT];        /* samples seen */
    double sync_log_f, sync_dev, sync_err;
    int sync_n;
    double alpha; /* policy.calib_alpha */
} nrs_calibrator_t;

void nrs_calibrator_init(nrs_calibrator_t *c, double alpha);
/* One measurement of a model-stage: measured seconds, and the uncalibrated
 * prediction for the layout that ran (calibration factor 1). */
void nrs_calibrator_add(nrs_calibrator_t *c, nrs_ms_t ms, double measured_s, double predicted_s);
/* One measured transition or weight sync against its uncalibrated prediction. */
void nrs_calibrator_add_sync(nrs_calibrator_t *c, double measured_s, double predicted_s);
/* Current factors, for nrs_plan_req_t.calib. */
void nrs_calibrator_factors(const nrs_calibrator_t *c, nrs_calib_t *out);
/* Relative prediction error of a model-stage (fraction; 0 before any sample). */
double nrs_calibrator_error(const nrs_calibrator_t *c, nrs_ms_t ms);

/* ---- admission ---------------------------------------------------------- */

typedef enum {
    NRS_TRIGGER_NONE,
    NRS_TRIGGER_RESOURCES,   /* nodes added, removed or lost */
    NRS_TRIGGER_WORKLOAD,    /* response length or batch changed */
    NRS_TRIGGER_MEMORY,      /* a stage near its cap or failed to allocate */
    NRS_TRIGGER_CALIBRATION, /* prediction error beyond policy.drift_threshold */
    NRS_TRIGGER_RECHECK      /* a move refused for hysteresis may be reconsidered */
} nrs_trigger_t;

typedef struct {
    bool admit;
    bool forced;          /* the current plan is infeasible now */
    bool retune;          /* micro-batches only: no transition, nothing to pay */
    double saving_s;      /* T(current) - T(candidate), per step */
    double horizon_steps; /* H */
    double cost_s;        /* C(current -> candidate) */
    double margin;
    char why[256];        /* one line, with the numbers */
} nrs_decision_t;

typedef struct {
    nrs_policy_t p;
    int total_steps;
    int last_transition_step; /* -1: none yet */
    int change_steps[64];     /* steps of recent resource/workload changes (ring) */
    int nchanges;
} nrs_admission_t;

void nrs_admission_init(nrs_admission_t *a, const nrs_spec_t *s);
/* Record a change of resources or workload at `step` (for the horizon). */
void nrs_admission_note_change(nrs_admission_t *a, int step);
/* Expected steps until the next change: policy.horizon if set, else the mean
 * interval between recorded changes, capped by the steps left. */
double nrs_admission_horizon(const nrs_admission_t *a, int step);
/* Decide whether to move from the current plan to the candidate. cur_step_s is
 * the current plan's predicted step time under the present conditions, or
 * NRS_POLICY_INFEASIBLE when it no longer fits (forces the move). */
#define NRS_POLICY_INFEASIBLE (-1.0)
void nrs_admission_decide(const nrs_admission_t *a, int step, double cur_step_s,
                          double cand_step_s, double cost_s, nrs_decision_t *d);
/* The same for a candidate that changes micro-batches only (nothing moves, no
 * communicator is set up: runtime/adapt nrs_adapt_retune): admitted on its
 * saving alone, at least min_gain of the step, with no cost to weigh and no
 * hysteresis (there is no transition to flap); forced when the current plan
 * no longer fits. */
void nrs_admission_decide_retune(const nrs_admission_t *a, int step, double cur_step_s,
                                 double cand_step_s, nrs_decision_t *d);
/* Record that a transition was carried out at `step` (hysteresis); a re-tune
 * is none. */
void nrs_admission_note_transition(nrs_admission_t *a, int step);

#ifdef __cplusplus
}
#endif
#endif
