/* The adaptation loop shared by the controller daemon and the simulator: from
 * the current conditions and measurements, decide whether to re-plan and
 * whether the new plan pays for its transition (one policy,
 * no second copy). Knows nothing of Slurm or of the network. */
#ifndef NRS_ADAPT_H
#define NRS_ADAPT_H

#include "nereus/emu.h"
#include "nereus/policy.h"

/* What the job runs on and processes now. */
typedef struct {
    int gpus;
    nrs_work_t work;
} nrs_cond_t;

/* How the GPUs changed since the current plan: the old GPUs whose state is
 * gone (released or failed nodes). Survivors keep their order and come first in
 * the new numbering; added GPUs follow. */
typedef struct {
    const int *lost;
    int nlost;
} nrs_resize_t;

typedef struct {
    const nrs_spec_t *spec;
    nrs_calibrator_t cal;
    nrs_admission_t adm;
    nrs_plan_t plan;       /* current plan (plan.epoch) */
    unsigned epoch_floor;  /* a candidate's epoch is at least this: numbers of
                            * aborted attempts are never proposed again */
    nrs_cond_t planned;    /* conditions of the last planning */
    nrs_calib_t planned_f; /* calibration of the last planning */
    int recheck_step;      /* re-plan then (hysteresis ran out); -1 none */
    double mem_cap_bytes;  /* > 0: usable bytes per GPU plans must fit, from a
                            * failed allocation (nrs_adapt_failed_cap) until the
                            * GPUs or the workload change; 0: the spec's */
    double setup_s;        /* fixed set-up cost of a transition (communicators) */
    /* The last transition priced without lost GPUs. Its graph is a pure
     * function of the two layouts, and a candidate comes back after a
     * rejection or a drift: it is not built again (1.8 s at 1,024 GPUs). */
    struct {
        bool valid;
        nrs_plan_t from, to;
        int rc, lost_boxes;
        double makespan_s;
    } priced;
    long graphs_built;     /* transition graphs built to price a candidate */
} nrs_adapt_t;

typedef struct {
    nrs_trigger_t trigger; /* NONE: nothing was planned this step */
    bool changed;          /* the candidate was adopted */
    bool retune;           /* the candidate changes micro-batches only
                            * (nrs_adapt_retune): no transition, cost 0 */
    nrs_decision_t decision;
    nrs_plan_t cand;
    double makespan_s;     /* transition graph makespan (uncalibrated); 0 for a re-tune */
    double cost_s;         /* predicted, calibrated: (makespan + setup) * calib.sync;
                            * 0 for a re-tune */
    int lost_boxes;        /* > 0: some state survives nowhere (checkpoint needed) */
} nrs_adapt_out_t;

/* Relative change of the response length that makes a re-plan worth looking at. */
#define NRS_ADAPT_WORKLOAD_DELTA 0.05
/* Default fixed set-up cost of a transition, seconds (communicator creation). */
#define NRS_ADAPT_SETUP_S 1.0

int nrs_adapt_init(nrs_adapt_t *a, const nrs_spec_t *s, const nrs_cond_t *c, char *err,
                   size_t errlen);
/* A measured stage time of the current plan under conditions c. */
void nrs_adapt_measure(nrs_adapt_t *a, const nrs_cond_t *c, nrs_ms_t ms, double seconds);
/* A measured transition, against the graph makespan it was predicted from. */
void nrs_adapt_measure_transition(nrs_adapt_t *a, double seconds, double makespan_s);
/* One decision point. memory_failed: a stage failed to allocate (forces a move).
 * rz: GPUs lost since the current plan; those at or beyond its total_gpus
 * (joined, never planned on) leave it whole and are not passed on.
 * 0 on success (out says what happened); -1 with err when the job cannot go on
 * (no feasible plan on the GPUs left). */
int nrs_adapt_step(nrs_adapt_t *a, int step, const nrs_cond_t *now, const nrs_resize_t *rz,
                   bool memory_failed, nrs_adapt_out_t *out, char *err, size_t errlen);
/* GPU numbering of a resize: map[i] = physical GPU (old numbering) of the new
 * plan's GPU i: the survivors on whole nodes of gpn GPUs, then those of nodes
 * with a GPU lost (each in order), then new GPUs numbered from old_total. A
 * plan of whole nodes too small for every survivor leaves the damaged nodes
 * out, not the last node. gpn <= 0: the survivors in order. */
void nrs_adapt_gpu_map(int old_total, int new_total, const nrs_resize_t *rz, int gpn, int *map);
/* Old GPU gpu's place in that order (its GPU in the new plan when below its
 * size), -1 if lost. lost: sorted, each GPU once. */
int nrs_adapt_gpu_place(int old_total, const int *lost, int nlost, int gpn, int gpu);
/* A failed allocation says the model under-counts the memory of plan p: the
 * usable bytes per GPU to plan with from then on, just below p's predicted
 * peak under work w (and at most cap, the one learned before, when > 0), so
 * that p itself and every plan predicted to need as much no longer fit. cap
 * unchanged when p does not fit the spec anyway (its peak says nothing). */
double nrs_adapt_failed_cap(const nrs_spec_t *s, const nrs_work_t *w, const nrs_plan_t *p,
                            double cap);
/* s, or with a learned cap (> 0) a copy of s in *tmp whose usable memory per
 * GPU is cap_bytes (its headroom raised): what to plan and check fits with. */
const nrs_spec_t *nrs_adapt_capped_spec(const nrs_spec_t *s, double cap_bytes, nrs_spec_t *tmp);
/* Whether `to` differs from `from` in micro-batches only: the same GPUs, pools,
 * placement and tp/pp/dp of every model-stage. Persistent state and the
 * engines' communicators are functions of those alone (runtime/emu), so the
 * transition graph of such a change, without lost GPUs, has no op: nothing
 * moves and no communicator is set up. The loop prices it at 0 and does not
 * count it as a transition (hysteresis, calibration of transitions). True for
 * identical layouts too. */
bool nrs_adapt_retune(const nrs_plan_t *from, const nrs_plan_t *to);
/* Graph makespan of from -> to under a resize (uncalibrated); -1 on error,
 * NRS_EMU_ELOST (with *lost_boxes) when state is lost. */
int nrs_adapt_transition_makespan(const nrs_spec_t *s, const nrs_plan_t *from,
                                  const nrs_plan_t *to, const nrs_resize_t *rz, double *makespan,
                                  int *lost_boxes, char *err, size_t errlen);

#endif
