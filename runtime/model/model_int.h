/* Internal helpers of the cost model (runtime/model). Not installed.
 * Formulas and their sources: docs/cost-model.md.
 */
#ifndef NEREUS_MODEL_INT_H
#define NEREUS_MODEL_INT_H

#include "nereus/cost.h"

/* Fixed constants of the model (docs/cost-model.md, "Constants"). */
#define NRS_MDL_GB 1e9                  /* the spec's GB/s are 10^9 bytes/s */
#define NRS_MDL_GIB 1073741824.0        /* 2^30 */
#define NRS_MDL_LAT_INTRA_S 10e-6       /* latency of one collective or p2p inside a node */
#define NRS_MDL_LAT_INTER_S 30e-6       /* ... across nodes */
#define NRS_MDL_SYNC_LAT_S 5e-3         /* fixed cost of one train->generate weight sync */
#define NRS_MDL_PREFILL_CHUNK 8192.0    /* tokens per prefill chunk (vLLM max_num_batched_tokens) */
#define NRS_MDL_SYNC_TENSOR_LAT_S 10e-3 /* broadcast sync: per-tensor RPC + gather + load (§7) */
#define NRS_MDL_CPU_ADAM_HOST_PPS 4.5e9 /* offload: Adam parameters per second per host (§4) */
#define NRS_MDL_Z3_LIVE_LAYERS 2.0      /* zero3: layers gathered at once (current + prefetch) */

/* Parameters split in two: those tensor parallelism shards over tp ranks
 * (matmuls, vocab-parallel embedding and lm head) and those every tp rank keeps
 * whole (norm vectors, the 1-wide value head). */
typedef struct {
    double sharded;
    double replicated;
} nrs_mdl_params_t;

double nrs_mdl_head_dim(const nrs_model_t *m);
int nrs_mdl_stage_layers(const nrs_model_t *m, int pp);
double nrs_mdl_per_gpu(nrs_mdl_params_t p, int tp);

/* Parameters of one decoder layer. */
nrs_mdl_params_t nrs_mdl_layer_params(const nrs_model_t *m);

/* Parameters held by the most loaded pipeline stage (memory). */
nrs_mdl_params_t nrs_mdl_stage_weights(const nrs_model_t *m, int pp);

/* Parameters of the slowest stage that take part in a matmul for every token:
 * its layers plus the output head (the embedding is a lookup). Used for FLOPs
 * and for the weight bytes one decode step reads. */
nrs_mdl_params_t nrs_mdl_stage_matmul(const nrs_model_t *m, int pp);

/* Width of the output head (vocab, or 1 for a value head) and whether tp splits it. */
double nrs_mdl_head_width(const nrs_model_t *m, int tp);

/* Bytes of activations one token stores per layer for the backward pass, per
 * GPU, with tensor + sequence parallelism and FlashAttention. */
double nrs_mdl_act_token_layer(const nrs_model_t *m, int tp);

/* Validity of (tp, pp) for a model: heads and kv heads vs tp, pp <= layers. */
int nrs_mdl_tp_pp_ok(const nrs_model_t *m, int tp, int pp);

/* Optimizer-state bytes per parameter of a trained model (fp32 master + Adam m, v). */
double nrs_mdl_opt_bytes_per_param(nrs_dtype_t d);

/* Number of weight tensors of a model as a checkpoint names them (per layer q, k,
 * v, o, gate, up, down and two norms; embedding, final norm, untied head). */
double nrs_mdl_tensor_count(const nrs_model_t *m);

/* ZeRO sharding factors of a layout under the spec's runtime: weights and
 * gradients are split over zw ranks (dp with zero3), optimizer state over zo
 * (dp with zero1 or zero3). */
double nrs_mdl_zero_w(const nrs_runtime_t *rt, const nrs_layout_t *l);
double nrs_mdl_zero_o(const nrs_runtime_t *rt, const nrs_layout_t *l);

/* Sanity of dimensions (all positive); 0 when usable. */
int nrs_mdl_dims_ok(const nrs_model_t *m);

#endif
