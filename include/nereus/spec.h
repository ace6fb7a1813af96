/* Nereus job spec: typed structs loaded from YAML (libyaml).
 *
 * Ownership: nrs_spec_t is a plain value with no heap pointers; copy it freely.
 * Every error is reported as one line "FILE:LINE:COL: message".
 */
#ifndef NEREUS_SPEC_H
#define NEREUS_SPEC_H

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

enum {
    NRS_NAME_MAX = 64,
    NRS_ERR_MAX = 512,
    NRS_SPEC_MAX_BYTES = 1 << 20, /* input bound: 1 MiB */
    NRS_SPEC_MAX_DEPTH = 16,      /* nesting bound */
    NRS_SPEC_MAX_ALIASES = 64,    /* alias expansions bound */
    /* Bound of a model's layers * hidden: a layer tensor stacks every
     * layer's hidden rows or columns (runtime/emu/geometry.h), in int32
     * shard coordinates; 2^30 leaves room for a sum of two. */
    NRS_MODEL_MAX_STACKED = 1 << 30
};

typedef enum { NRS_DTYPE_BF16, NRS_DTYPE_FP16, NRS_DTYPE_FP32 } nrs_dtype_t;

/* The four models of an RLHF job. */
typedef enum {
    NRS_ROLE_ACTOR,
    NRS_ROLE_CRITIC,
    NRS_ROLE_REF,
    NRS_ROLE_REWARD,
    NRS_ROLE_COUNT
} nrs_role_t;

/* Model-stages, in phase order: generate -> infer -> train. */
typedef enum {
    NRS_MS_ACTOR_GENERATE,
    NRS_MS_ACTOR_INFER,
    NRS_MS_CRITIC_INFER,
    NRS_MS_REF_INFER,
    NRS_MS_REWARD_INFER,
    NRS_MS_ACTOR_TRAIN,
    NRS_MS_CRITIC_TRAIN,
    NRS_MS_COUNT
} nrs_ms_t;

typedef enum { NRS_STAGE_GENERATE, NRS_STAGE_INFER, NRS_STAGE_TRAIN } nrs_stage_t;
typedef enum { NRS_ALGO_PPO, NRS_ALGO_GRPO } nrs_algo_t;

typedef struct {
    char gpu[NRS_NAME_MAX]; /* free text, e.g. "H100-SXM" */
    double gpu_mem_gib;     /* memory per GPU, GiB */
    double peak_tflops;     /* dense bf16 TFLOP/s per GPU */
    double hbm_gbps;        /* HBM bandwidth per GPU, GB/s */
    int gpus_per_node;
    int nodes;              /* nodes at the start of the job */
    double intra_gbps;      /* per-GPU intra-node (NVLink) GB/s */
    double inter_gbps;      /* per-GPU inter-node (NIC) GB/s */
    double host_gbps;       /* per-GPU host<->device (PCIe) GB/s */
    double efficiency;      /* achievable fraction of peak for GEMMs (default 0.5) */
    bool tp_across_nodes;   /* allow tp > gpus_per_node (default false) */
} nrs_cluster_t;

/* Initial (tp, pp) of a model-stage, for the fixed baseline; 0 = unset. */
typedef struct {
    int tp, pp;
} nrs_tp_pp_t;

typedef struct {
    bool present;
    char preset[NRS_NAME_MAX]; /* "" when all dims were explicit */
    int layers, hidden, ffn, heads, kv_heads, vocab;
    nrs_dtype_t dtype;
    bool tied_embeddings;
    bool value_head;           /* critic and reward: scalar head (set by role) */
    nrs_tp_pp_t init_train;    /* layout.train */
    nrs_tp_pp_t init_infer;    /* layout.infer */
    nrs_tp_pp_t init_generate; /* layout.generate (actor only) */
} nrs_model_t;

typedef struct {
    nrs_algo_t name;
    bool reward_model; /* reward: model (true, default) | rule */
    bool kl;           /* reference model for the KL term (default true) */
} nrs_algorithm_t;

typedef struct {
    int global_batch;       /* prompts per step */
    int samples_per_prompt; /* responses per prompt (GRPO group size); default 1 */
    int prompt_len;         /* tokens */
    int response_len;       /* mean response tokens at the start */
    int max_response_len;   /* cap; default = response_len */
    int ppo_epochs;         /* passes over the batch in train; default 1 */
    int steps;              /* total steps of the run */
    int micro_batch_max;    /* upper bound on micro-batch (sequences); default 64 */
} nrs_workload_t;

typedef struct {
    int horizon;            /* steps; 0 = estimate from the run */
    double min_gain;        /* fraction of step time; default 0.02 */
    double margin;          /* admission margin; default 0.1 */
    int hysteresis;         /* steps between transitions; default 5 */
    double calib_alpha;     /* calibration smoothing in (0,1]; default 0.3 */
    double drift_threshold; /* re-plan when prediction error exceeds; default 0.15 */
    double poll_interval;   /* watcher poll, seconds; default 2 */
} nrs_policy_t;

enum { NRS_XFER_LOCAL = 1, NRS_XFER_UCX = 2, NRS_XFER_NCCL = 4 };

/* How the actor's trained weights reach its generation engine each step
 * (docs/cost-model.md §7). RESHARD: resharded in place or pool to pool by the
 * transition machinery; BROADCAST: tensor by tensor, gathered to training rank 0
 * and broadcast from it to every generation rank (OpenRLHF-style). */
typedef enum { NRS_WSYNC_RESHARD, NRS_WSYNC_BROADCAST } nrs_weight_sync_t;

typedef struct {
    unsigned transports;     /* NRS_XFER_* mask; default ucx|nccl|local */
    double mem_headroom_gib; /* reserved per GPU; default 2 */
    double emulation_scale;  /* model size factor for CPU runs, (0,1]; default 1e-3 */
    bool zero1;              /* shard optimizer state over dp; default true */
    bool recompute;          /* activation recompute in train; default false */
    bool verify;             /* checksum every transition; default true */
    /* Optional cost-model switches (docs/cost-model.md); the modelled baselines
     * set them on a copy of the spec (docs/baselines.md). */
    bool zero3;              /* ZeRO-3: weights, grads and optimizer state sharded over dp,
                              * parameters gathered per layer; default false */
    bool offload_optimizer;  /* fp32 master + Adam on the host (ZeRO-Offload); default false */
    nrs_weight_sync_t weight_sync; /* reshard (default) | broadcast */
} nrs_runtime_t;

typedef struct {
    char path[256];
    nrs_cluster_t cluster;
    nrs_model_t models[NRS_ROLE_COUNT];
    nrs_algorithm_t algorithm;
    nrs_workload_t workload;
    nrs_policy_t policy;
    nrs_runtime_t runtime;
} nrs_spec_t;

/* Load and validate a spec file. 0 on success; -1 with err = "FILE:LINE:COL: msg". */
int nrs_spec_load(const char *path, nrs_spec_t *out, char *err, size_t errlen);

/* Same from a descriptor the caller opened (and still owns: it is not closed),
 * read to its end; name is used as FILE in messages. For callers that must
 * check what they open first (e.g. refuse a FIFO that would block). */
int nrs_spec_load_fd(int fd, const char *name, nrs_spec_t *out, char *err, size_t errlen);

/* Same from memory; name is used as FILE in messages. */
int nrs_spec_load_buffer(const char *name, const char *buf, size_t len, nrs_spec_t *out,
                         char *err, size_t errlen);

/* Fill dims of a preset ("llama3-8b", "llama3-70b", "qwen2.5-7b", "qwen2.5-32b", ...).
 * Names are matched case-insensitively; 0 on success, -1 if unknown. */
int nrs_preset_lookup(const char *name, nrs_model_t *out);

/* NULL-terminated list of preset names, for --help and suggestions. */
const char *const *nrs_preset_names(void);

/* Names for printing. */
const char *nrs_role_name(nrs_role_t r);
const char *nrs_ms_name(nrs_ms_t ms); /* "actor.generate", ... */
nrs_role_t nrs_ms_role(nrs_ms_t ms);
nrs_stage_t nrs_ms_stage(nrs_ms_t ms);

/* Whether this job runs the model-stage (depends on algorithm and models). */
bool nrs_spec_has_ms(const nrs_spec_t *s, nrs_ms_t ms);

#ifdef __cplusplus
}
#endif
#endif
