/* Planner internals: placement units, per-pool candidate tables, pool configs. */
#ifndef NRS_PLAN_INT_H
#define NRS_PLAN_INT_H

#include "nereus/plan.h"

/* A unit of placement: one engine with one copy of a model's weights. */
typedef enum { U_GEN, U_ACTOR, U_CRITIC, U_REF, U_REWARD, U_COUNT } nrs_unit_t;

#define NRS_INF 1e300
enum { NRS_PLAN_SLICES = 8, NRS_PLAN_PP_MAX = 32, NRS_PLAN_GEN_MB_MAX = 1024 };

/* Staircase of (transient bytes, time) for one stage of one (tp, pp): entries
 * sorted by trans ascending with time strictly decreasing, so the best
 * micro-batch under a memory budget is a binary search. */
typedef struct {
    double trans, time;
    int mb;
} nrs_step_t;

typedef struct {
    int tp, pp, dp;
    double persist;   /* model: persistent state; gen: generation weights */
    int off[2], n[2]; /* staircases of the unit's stages in the table's steps */
    double lb;        /* sum of the unit's stage times with the pool to itself */
} nrs_cand_t;

typedef struct {
    int gpus;
    int ncand;
    nrs_cand_t *cand;   /* sorted by lb (ties: enumeration order) */
    nrs_step_t *steps;
    int nsteps, capsteps;
    double lb_stage[2]; /* least time of each stage over candidates */
    double min_persist;
} nrs_table_t;

typedef struct {
    const nrs_spec_t *spec;
    nrs_work_t work;
    nrs_calib_t calib;
    double cap;
    int gpn;
    int tgpus; /* GPUs of the request */
    bool present[U_COUNT];
    int units[U_COUNT], nunits; /* present units in search order */
    nrs_table_t *tables[U_COUNT];
    int ntables[U_COUNT], captables[U_COUNT];
} nrs_planner_t;

/* A pool configuration: units grouped into pools of given sizes. */
typedef struct {
    int npools;
    int gpus[NRS_POOL_MAX];
    int pool_of_unit[U_COUNT];
} nrs_config_t;

/* units.c */
int nrs_unit_nstages(nrs_unit_t u);
nrs_ms_t nrs_unit_ms(nrs_unit_t u, int i);
nrs_role_t nrs_unit_role(nrs_unit_t u);
int nrs_planner_init(nrs_planner_t *pl, const nrs_spec_t *s, const nrs_plan_req_t *req);
void nrs_planner_free(nrs_planner_t *pl);
const nrs_table_t *nrs_planner_table(nrs_planner_t *pl, nrs_unit_t u, int gpus);
/* The planner's one memory test, in the search and in its ground truth
 * (nrs_plan_eval) alike: `held` bytes on each GPU of a pool (persistent state,
 * generation weights while generation runs) plus `more` (a stage's transient)
 * fit in `cap`. One expression, so the two cannot disagree by a rounding error
 * at the cap; `held` must be summed as eval sums it (nrs_plan_persist_order). */
static inline bool nrs_plan_fits(double held, double more, double cap)
{
    return held + more <= cap;
}

/* Bytes of every GPU's cap a pool's persistent state must leave free: the
 * staging reserve of transitions under the default chunk (nereus/cost.h). */
#define NRS_PLAN_RESERVE ((double)NRS_COST_RESERVE_BYTES(NRS_COST_CHUNK_BYTES))

/* The order in which persistent bytes of a pool are summed: the models by role
 * (actor, critic, ref, reward), then a generation engine of its own pool. */
extern const nrs_unit_t nrs_plan_persist_order[U_COUNT];

/* Best (time, mb) of stage i of candidate c on a pool holding `held` bytes per
 * GPU under `cap` (nrs_plan_fits); returns NRS_INF when nothing fits. */
double nrs_cand_time(const nrs_table_t *t, const nrs_cand_t *c, int i, double held, double cap,
                     int *mb);
/* Micro-batch candidates of unit u's stages at data-parallel degree dp. */
int nrs_mb_options(const nrs_planner_t *pl, nrs_unit_t u, int dp, int *out, int max);
/* Enumerates the tp values allowed on a pool of `gpus` GPUs; returns count. */
int nrs_tp_options(const nrs_spec_t *s, int gpus, int *out, int max);

/* configs.c: calls fn for every pool configuration of the present units. */
typedef int (*nrs_config_fn)(const nrs_config_t *cfg, void *arg);
int nrs_configs_foreach(const nrs_planner_t *pl, int total_gpus, nrs_config_fn fn, void *arg);
void nrs_config_to_plan(const nrs_planner_t *pl, const nrs_config_t *cfg, nrs_plan_t *p);

/* The pp values a unit may take with tp on a pool of `gpus` GPUs: 1..max. */
int nrs_pp_max(const nrs_planner_t *pl, nrs_unit_t u, int tp, int gpus);

/* explain.c */
void nrs_plan_explain_infeasible(nrs_planner_t *pl, int gpus, char *err, size_t errlen);

/* eval.c: whether actor.generate reads actor.train's weights in place and so
 * holds nothing of its own: same pool, same tp and pp, and the training ranks
 * hold their whole shard (not 1/dp of it under ZeRO-3) with the reshard sync
 * (a broadcast sync fills a separate engine's own copy). */
bool nrs_plan_gen_in_place(const nrs_spec_t *s, bool same_pool, const nrs_layout_t *train,
                           const nrs_layout_t *gen);

/* 0 when every calibration factor is finite and > 0 (NULL: the defaults);
 * else -1 with err naming the factor: a NaN or infinite factor would make
 * every plan "infeasible" and blame memory. */
int nrs_plan_calib_check(const nrs_calib_t *c, char *err, size_t errlen);

#endif
