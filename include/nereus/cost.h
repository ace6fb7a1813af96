/* Nereus cost model: predicted time and per-GPU memory of a model-stage under a
 * layout. Every formula is in docs/cost-model.md. Pure functions of their inputs:
 * the planner, the simulator, the controller and the benchmarks all call these.
 */
#ifndef NEREUS_COST_H
#define NEREUS_COST_H

#include <stdint.h>

#include "nereus/spec.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Transitions (docs/transitions.md, runtime/emu): moves are cut into chunks of
 * at most NRS_COST_CHUNK_BYTES unless the transition's options say otherwise,
 * and every GPU keeps NRS_COST_RESERVE_BYTES(chunk) of its cap for the
 * transition's pack buffers (one strided send and one strided receive in
 * flight). A plan's persistent state must leave that reserve free on every GPU
 * or no transition can leave or reach it: the planner counts it. Defined here,
 * below both the planner and runtime/emu, so that both count the same bytes. */
#define NRS_COST_CHUNK_BYTES ((int64_t)16 << 20)
#define NRS_COST_RESERVE_BYTES(chunk) (2 * (int64_t)(chunk))

/* Layout of one model-stage. tp*pp*dp GPUs are used; mb is the micro-batch in
 * sequences (train/infer) or the number of sequences decoded concurrently per
 * replica (generate). */
typedef struct {
    int tp, pp, dp, mb;
} nrs_layout_t;

/* What one step processes. */
typedef struct {
    int samples;         /* sequences per step = global_batch * samples_per_prompt */
    double prompt_len;   /* tokens */
    double response_len; /* mean response tokens */
} nrs_work_t;

/* Multiplicative corrections fitted online (issue: calibration); all 1 by default. */
typedef struct {
    double stage[NRS_MS_COUNT]; /* time of each model-stage */
    double sync;                /* train->generate weight sync and transitions */
} nrs_calib_t;

typedef struct {
    double time_s;      /* calibrated predicted time of the stage in one step */
    double compute_s;   /* GEMM/attention compute part (uncalibrated) */
    double memory_s;    /* memory-bound part (decode) */
    double comm_s;      /* TP all-reduce + PP p2p + DP all-reduce */
    double bubble_s;    /* pipeline bubble */
    double trans_bytes; /* per-GPU transient bytes while it runs (activations, KV, logits) */
} nrs_stage_cost_t;

void nrs_calib_init(nrs_calib_t *c);
void nrs_work_from_spec(const nrs_spec_t *s, nrs_work_t *w);

/* Parameter count of a model (embedding, layers, norms, head or value head). */
double nrs_cost_params(const nrs_model_t *m);

/* Bytes per element of the model's dtype. */
int nrs_dtype_bytes(nrs_dtype_t d);

/* Usable bytes per GPU: gpu_mem_gib minus runtime.mem_headroom_gib. */
double nrs_cost_capacity_bytes(const nrs_spec_t *s);

/* Per-GPU bytes of a model's persistent state in layout l (the most loaded GPU):
 * weights, plus for trained models (actor, critic) grads, fp32 master weights and
 * Adam moments, optimizer state split over dp when runtime.zero1. */
double nrs_cost_persist_bytes(const nrs_spec_t *s, nrs_role_t r, const nrs_layout_t *l);

/* Per-GPU bytes of the actor's generation weights in layout l (held persistently
 * on a separate generation pool, or for the generate phase on the actor's pool). */
double nrs_cost_gen_weight_bytes(const nrs_spec_t *s, const nrs_layout_t *l);

/* Time and transient memory of one model-stage. Returns 0, or -1 when the layout
 * is not valid for the stage (tp does not divide heads/kv heads, pp > layers,
 * mb < 1, ...). calib may be NULL (all factors 1). */
int nrs_cost_stage(const nrs_spec_t *s, nrs_ms_t ms, const nrs_layout_t *l,
                   const nrs_work_t *w, const nrs_calib_t *calib, nrs_stage_cost_t *out);

/* Seconds of the per-step train->generate weight sync of the actor. same_pool:
 * both layouts on the same GPUs (reshard in place over NVLink/NIC); otherwise the
 * weights cross between pools over the inter-node links. 0 when same_pool and
 * the two layouts have identical tp and pp (weights are shared). */
double nrs_cost_sync_s(const nrs_spec_t *s, const nrs_layout_t *train, const nrs_layout_t *gen,
                       int same_pool, const nrs_calib_t *calib);

/* KV-cache bytes one token adds on the most loaded GPU of a (tp, pp) layout:
 * 2 (K and V) * ceil(layers/pp) * kv heads per tensor rank * head_dim * dtype
 * bytes; when tp > kv_heads each rank holds one (replicated) kv head. -1 when
 * (tp, pp) is not valid for the model. (Added by the cost model.) */
double nrs_cost_kv_token_bytes(const nrs_model_t *m, int tp, int pp);

#ifdef __cplusplus
}
#endif
#endif
