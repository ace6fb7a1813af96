/* Nereus planner: pools, placement and layouts with the least predicted step
 * latency subject to memory in every phase (docs/planner.md).
 *
 * GPU numbering: a plan covers GPUs 0..total_gpus-1, node n holding GPUs
 * n*gpus_per_node .. (n+1)*gpus_per_node-1. Pools are contiguous GPU ranges.
 * Inside a pool, a model-stage with layout (tp, pp, dp) puts
 *     dp replica d, pipeline stage p, tensor rank t  on GPU
 *     pool.first_gpu + d*tp*pp + p*tp + t
 * (tp innermost, so a tensor-parallel group stays inside a node).
 * GPUs of the pool past tp*pp*dp are idle for that model-stage.
 */
#ifndef NEREUS_PLAN_H
#define NEREUS_PLAN_H

#include <stdio.h>

#include "nereus/cost.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Units of placement: the actor's generation engine and the four models. */
enum { NRS_POOL_MAX = 5 };

typedef struct {
    int first_gpu;
    int gpus;
} nrs_pool_t;

typedef struct {
    unsigned epoch;
    int total_gpus;
    int npools;
    nrs_pool_t pools[NRS_POOL_MAX];
    bool has[NRS_MS_COUNT];        /* model-stages this job runs */
    int pool_of[NRS_MS_COUNT];     /* index into pools */
    nrs_layout_t layout[NRS_MS_COUNT];
    /* actor.infer shares tp/pp/dp (and pool) with actor.train, critic.infer
     * with critic.train: one engine and one copy of the weights per model. */

    /* Predictions (cost model, calibrated). */
    double ms_time[NRS_MS_COUNT];  /* seconds per step */
    double ms_mem[NRS_MS_COUNT];   /* peak per-GPU bytes on its pool while it runs */
    double phase_time[3];          /* indexed by nrs_stage_t */
    double sync_s;                 /* train->generate weight sync */
    double step_s;                 /* predicted step latency */
    double capacity_bytes;         /* usable bytes per GPU */
} nrs_plan_t;

/* BEST: least predicted step time. FIXED: the fixed baseline (below).
 * TEMPLATE: fixed_from's pools, placement and tp/pp taken as they are, dp =
 * floor(pool / (tp*pp)), only micro-batches chosen (modelled baselines). */
typedef enum { NRS_PLAN_BEST, NRS_PLAN_FIXED, NRS_PLAN_TEMPLATE } nrs_plan_mode_t;

typedef struct {
    int gpus;                      /* total GPUs: < gpus_per_node, or a multiple of it */
    nrs_work_t work;
    nrs_plan_mode_t mode;
    const nrs_calib_t *calib;      /* NULL: defaults */
    /* FIXED: the initial plan whose tp/pp (and micro-batches) are kept while dp
     * scales; NULL derives it (spec layouts, else the best colocated plan at
     * cluster.nodes). */
    const nrs_plan_t *fixed_from;
} nrs_plan_req_t;

/* Fill req with the spec's defaults: cluster.nodes * gpus_per_node GPUs, the
 * spec's workload, mode BEST, default calibration. */
void nrs_plan_req_init(nrs_plan_req_t *req, const nrs_spec_t *s);

/* The plan with the least predicted step latency (or the fixed baseline).
 * 0 on success; -1 with err = "no feasible plan: <tightest constraint>" or the
 * reason the request is invalid. Deterministic. */
int nrs_plan_best(const nrs_spec_t *s, const nrs_plan_req_t *req, nrs_plan_t *out, char *err,
                  size_t errlen);

/* Exhaustive search over the same space, without pruning (tests, bench). */
int nrs_plan_brute(const nrs_spec_t *s, const nrs_plan_req_t *req, nrs_plan_t *out, char *err,
                   size_t errlen);

/* Recompute the predictions of plan p (pools, pool_of, layouts set) and check it:
 * 0 if valid and every GPU fits in every phase, -1 with the reason otherwise. */
int nrs_plan_eval(const nrs_spec_t *s, const nrs_work_t *w, const nrs_calib_t *calib,
                  nrs_plan_t *p, char *err, size_t errlen);

/* Whether two plans place and lay out every model-stage the same way
 * (predictions and epochs aside). */
bool nrs_plan_same_layout(const nrs_plan_t *a, const nrs_plan_t *b);

/* Pool holding a model's persistent state (its train or infer stage's pool). */
int nrs_plan_home(const nrs_plan_t *p, nrs_role_t r);

/* Human-readable table, and the same as one JSON object. */
void nrs_plan_print(FILE *out, const nrs_spec_t *s, const nrs_plan_t *p);
void nrs_plan_print_json(FILE *out, const nrs_spec_t *s, const nrs_plan_t *p);

#ifdef __cplusplus
}
#endif
#endif
