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

/* Parameters by how tensor parallelism splits them, as runtime/emu/geometry.c
 * lays them out: q and o projections evenly over tp ranks (tp divides the
 * heads); the MLP by ffn rows and the vocab-parallel embedding and lm head by
 * vocab rows, balanced (the first ranks one row more when tp does not divide
 * them); the k and v projections by kv head (sharded while tp <= kv heads, one
 * whole kv head per rank beyond); and those every tp rank keeps whole (norm
 * vectors, the 1-wide value head). */
typedef struct {
    double sharded;
    double ffn;
    double vocab;
    double kv;
    double replicated;
} nrs_mdl_params_t;

double nrs_mdl_head_dim(const nrs_model_t *m);
int nrs_mdl_stage_layers(const nrs_model_t *m, int pp);
/* Parameters the most loaded tensor rank holds (a replicated kv head counted
 * whole, a balanced split's larger part). */
double nrs_mdl_per_gpu(const nrs_model_t *m, nrs_mdl_params_t p, int tp);
/* Parameters summed over the model (each kv head once). */
double nrs_mdl_total(nrs_mdl_params_t p);

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
