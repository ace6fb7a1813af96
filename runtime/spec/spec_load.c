/* Job spec loader: the schema (one field table per section), defaults, model
 * presets and overrides, and the entry points. Cross-field checks live in
 * spec_check.c. */
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "spec/spec_check.h"
#include "spec/spec_internal.h"

_Static_assert(sizeof(nrs_dtype_t) == sizeof(int) && sizeof(nrs_algo_t) == sizeof(int),
               "NRS_F_ENUM stores an int");

/* Designated initializers only: fields left out are zero. */
#define F_INT(n, o, fl, l, h) \
    {.name = n, .type = NRS_F_INT, .off = (o), .flags = (fl), .lo = (l), .hi = (h)}
#define F_DBL(n, o, fl, l, h) \
    {.name = n, .type = NRS_F_DBL, .off = (o), .flags = (fl), .lo = (l), .hi = (h)}
#define F_BOOL(n, o) {.name = n, .type = NRS_F_BOOL, .off = (o)}
#define F_STR(n, o) {.name = n, .type = NRS_F_STR, .off = (o)}
#define F_ENUM(n, o, e) {.name = n, .type = NRS_F_ENUM, .off = (o), .enums = (e)}
#define F_FN(n, o, fl, f, a) \
    {.name = n, .type = NRS_F_FN, .off = (o), .flags = (fl), .fn = (f), .aux = (a)}

#define BIG 1e7 /* upper bound of rates and sizes: far above any real GPU */

/* ---- cluster ------------------------------------------------------------- */

#define CL(f) offsetof(nrs_cluster_t, f)
static const nrs_field_t cluster_fields[NRS_CL_N] = {
    [NRS_CL_GPU] = F_STR("gpu", CL(gpu)),
    [NRS_CL_GPU_MEM] = F_DBL("gpu_mem_gib", CL(gpu_mem_gib), NRS_REQUIRED | NRS_LO_OPEN, 0, 1e6),
    [NRS_CL_PEAK] = F_DBL("peak_tflops", CL(peak_tflops), NRS_REQUIRED | NRS_LO_OPEN, 0, BIG),
    [NRS_CL_HBM] = F_DBL("hbm_gbps", CL(hbm_gbps), NRS_REQUIRED | NRS_LO_OPEN, 0, BIG),
    [NRS_CL_GPN] = F_INT("gpus_per_node", CL(gpus_per_node), NRS_REQUIRED, 1, 1024),
    [NRS_CL_NODES] = F_INT("nodes", CL(nodes), NRS_REQUIRED, 1, 65536),
    [NRS_CL_INTRA] = F_DBL("intra_gbps", CL(intra_gbps), NRS_REQUIRED | NRS_LO_OPEN, 0, BIG),
    [NRS_CL_INTER] = F_DBL("inter_gbps", CL(inter_gbps), NRS_REQUIRED | NRS_LO_OPEN, 0, BIG),
    [NRS_CL_HOST] = F_DBL("host_gbps", CL(host_gbps), NRS_LO_OPEN, 0, BIG),
    [NRS_CL_EFF] = F_DBL("efficiency", CL(efficiency), NRS_LO_OPEN, 0, 1),
    [NRS_CL_TP_ACROSS] = F_BOOL("tp_across_nodes", CL(tp_across_nodes)),
};

/* ---- models -------------------------------------------------------------- */

static const nrs_enum_t dtype_enum[] = {
    {"bf16", NRS_DTYPE_BF16}, {"fp16", NRS_DTYPE_FP16}, {"fp32", NRS_DTYPE_FP32}, {NULL, 0}};

static int on_preset(nrs_sctx_t *c, const char *path, int key, int val, void *dst,
                     const nrs_field_t *f);
static int on_layout(nrs_sctx_t *c, const char *path, int key, int val, void *dst,
                     const nrs_field_t *f);
static int on_stage(nrs_sctx_t *c, const char *path, int key, int val, void *dst,
                    const nrs_field_t *f);
static int on_model(nrs_sctx_t *c, const char *path, int key, int val, void *dst,
                    const nrs_field_t *f);

#define MD(f) offsetof(nrs_model_t, f)
static const nrs_field_t model_fields[NRS_MD_N] = {
    [NRS_MD_PRESET] = F_FN("preset", MD(preset), 0, on_preset, 0),
    [NRS_MD_LAYERS] = F_INT("layers", MD(layers), 0, 1, 4096),
    [NRS_MD_HIDDEN] = F_INT("hidden", MD(hidden), 0, 1, 1 << 20),
    [NRS_MD_FFN] = F_INT("ffn", MD(ffn), 0, 1, 1 << 22),
    [NRS_MD_HEADS] = F_INT("heads", MD(heads), 0, 1, 65536),
    [NRS_MD_KV_HEADS] = F_INT("kv_heads", MD(kv_heads), 0, 1, 65536),
    [NRS_MD_VOCAB] = F_INT("vocab", MD(vocab), 0, 1, 1 << 24),
    [NRS_MD_DTYPE] = F_ENUM("dtype", MD(dtype), dtype_enum),
    [NRS_MD_TIED] = F_BOOL("tied_embeddings", MD(tied_embeddings)),
    [NRS_MD_LAYOUT] = F_FN("layout", 0, 0, on_layout, 0),
};

static const nrs_field_t layout_fields[3] = {
    [NRS_STAGE_GENERATE] = F_FN("generate", MD(init_generate), 0, on_stage, NRS_STAGE_GENERATE),
    [NRS_STAGE_INFER] = F_FN("infer", MD(init_infer), 0, on_stage, NRS_STAGE_INFER),
    [NRS_STAGE_TRAIN] = F_FN("train", MD(init_train), 0, on_stage, NRS_STAGE_TRAIN),
};

static const nrs_field_t tp_pp_fields[NRS_TP_PP_N] = {
    [NRS_TP] = F_INT("tp", offsetof(nrs_tp_pp_t, tp), 0, 1, 65536),
    [NRS_PP] = F_INT("pp", offsetof(nrs_tp_pp_t, pp), 0, 1, 4096),
};

#define MODEL_AT(r) ((r) * sizeof(nrs_model_t))
static const nrs_field_t models_fields[NRS_ROLE_COUNT] = {
    [NRS_ROLE_ACTOR] = F_FN("actor", MODEL_AT(NRS_ROLE_ACTOR), NRS_REQUIRED, on_model,
                            NRS_ROLE_ACTOR),
    [NRS_ROLE_CRITIC] = F_FN("critic", MODEL_AT(NRS_ROLE_CRITIC), 0, on_model, NRS_ROLE_CRITIC),
    [NRS_ROLE_REF] = F_FN("ref", MODEL_AT(NRS_ROLE_REF), 0, on_model, NRS_ROLE_REF),
    [NRS_ROLE_REWARD] = F_FN("reward", MODEL_AT(NRS_ROLE_REWARD), 0, on_model, NRS_ROLE_REWARD),
};

/* ---- algorithm, workload, policy, runtime -------------------------------- */

static const nrs_enum_t algo_enum[] = {{"ppo", NRS_ALGO_PPO}, {"grpo", NRS_ALGO_GRPO}, {NULL, 0}};
static const nrs_enum_t reward_enum[] = {{"model", 1}, {"rule", 0}, {NULL, 0}};

static int on_reward(nrs_sctx_t *c, const char *path, int key, int val, void *dst,
                     const nrs_field_t *f);

#define AL(f) offsetof(nrs_algorithm_t, f)
static const nrs_field_t algorithm_fields[NRS_AL_N] = {
    [NRS_AL_NAME] = F_ENUM("name", AL(name), algo_enum),
    [NRS_AL_REWARD] = {.name = "reward", .type = NRS_F_FN, .off = AL(reward_model),
                       .fn = on_reward, .enums = reward_enum},
    [NRS_AL_KL] = F_BOOL("kl", AL(kl)),
};

#define WL(f) offsetof(nrs_workload_t, f)
#define TOKENS (1 << 22)
static const nrs_field_t workload_fields[NRS_WL_N] = {
    [NRS_WL_BATCH] = F_INT("global_batch", WL(global_batch), NRS_REQUIRED, 1, 1 << 24),
    [NRS_WL_SAMPLES] = F_INT("samples_per_prompt", WL(samples_per_prompt), 0, 1, 4096),
    [NRS_WL_PROMPT] = F_INT("prompt_len", WL(prompt_len), NRS_REQUIRED, 1, TOKENS),
    [NRS_WL_RESPONSE] = F_INT("response_len", WL(response_len), NRS_REQUIRED, 1, TOKENS),
    [NRS_WL_MAX_RESPONSE] = F_INT("max_response_len", WL(max_response_len), 0, 1, TOKENS),
    [NRS_WL_EPOCHS] = F_INT("ppo_epochs", WL(ppo_epochs), 0, 1, 1024),
    [NRS_WL_STEPS] = F_INT("steps", WL(steps), NRS_REQUIRED, 1, 1 << 30),
    [NRS_WL_MICRO] = F_INT("micro_batch_max", WL(micro_batch_max), 0, 1, 1 << 20),
};

#define PO(f) offsetof(nrs_policy_t, f)
static const nrs_field_t policy_fields[NRS_PO_N] = {
    [NRS_PO_HORIZON] = F_INT("horizon", PO(horizon), 0, 0, 1 << 30),
    [NRS_PO_MIN_GAIN] = F_DBL("min_gain", PO(min_gain), NRS_HI_OPEN, 0, 1),
    [NRS_PO_MARGIN] = F_DBL("margin", PO(margin), 0, 0, 1),
    [NRS_PO_HYSTERESIS] = F_INT("hysteresis", PO(hysteresis), 0, 0, 1 << 20),
    [NRS_PO_CALIB] = F_DBL("calib_alpha", PO(calib_alpha), NRS_LO_OPEN, 0, 1),
    [NRS_PO_DRIFT] = F_DBL("drift_threshold", PO(drift_threshold), NRS_LO_OPEN, 0, 10),
    [NRS_PO_POLL] = F_DBL("poll_interval", PO(poll_interval), NRS_LO_OPEN, 0, 3600),
};

static int on_transports(nrs_sctx_t *c, const char *path, int key, int val, void *dst,
                         const nrs_field_t *f);
static const nrs_enum_t xfer_enum[] = {
    {"ucx", NRS_XFER_UCX}, {"nccl", NRS_XFER_NCCL}, {"local", NRS_XFER_LOCAL}, {NULL, 0}};

static const nrs_enum_t wsync_enum[] = {
    {"reshard", NRS_WSYNC_RESHARD}, {"broadcast", NRS_WSYNC_BROADCAST}, {NULL, 0}};

#define RT(f) offsetof(nrs_runtime_t, f)
static const nrs_field_t runtime_fields[NRS_RT_N] = {
    [NRS_RT_TRANSPORTS] = {.name = "transports", .type = NRS_F_FN, .off = RT(transports),
                           .fn = on_transports, .enums = xfer_enum},
    [NRS_RT_HEADROOM] = F_DBL("mem_headroom_gib", RT(mem_headroom_gib), 0, 0, 1e6),
    [NRS_RT_EMU_SCALE] = F_DBL("emulation_scale", RT(emulation_scale), NRS_LO_OPEN, 0, 1),
    [NRS_RT_ZERO1] = F_BOOL("zero1", RT(zero1)),
    [NRS_RT_RECOMPUTE] = F_BOOL("recompute", RT(recompute)),
    [NRS_RT_VERIFY] = F_BOOL("verify", RT(verify)),
    [NRS_RT_ZERO3] = F_BOOL("zero3", RT(zero3)),
    [NRS_RT_OFFLOAD] = F_BOOL("offload_optimizer", RT(offload_optimizer)),
    [NRS_RT_WSYNC] = F_ENUM("weight_sync", RT(weight_sync), wsync_enum),
};

/* ---- top level ----------------------------------------------------------- */

static int on_section(nrs_sctx_t *c, const char *path, int key, int val, void *dst,
                      const nrs_field_t *f);

#define SP(f) offsetof(nrs_spec_t, f)
static const nrs_field_t root_fields[NRS_ROOT_N] = {
    [NRS_ROOT_CLUSTER] = F_FN("cluster", SP(cluster), NRS_REQUIRED, on_section, NRS_ROOT_CLUSTER),
    [NRS_ROOT_MODELS] = F_FN("models", SP(models), NRS_REQUIRED, on_section, NRS_ROOT_MODELS),
    [NRS_ROOT_ALGORITHM] = F_FN("algorithm", SP(algorithm), 0, on_section, NRS_ROOT_ALGORITHM),
    [NRS_ROOT_WORKLOAD] = F_FN("workload", SP(workload), NRS_REQUIRED, on_section,
                               NRS_ROOT_WORKLOAD),
    [NRS_ROOT_POLICY] = F_FN("policy", SP(policy), 0, on_section, NRS_ROOT_POLICY),
    [NRS_ROOT_RUNTIME] = F_FN("runtime", SP(runtime), 0, on_section, NRS_ROOT_RUNTIME),
};

#define N(a) (sizeof(a) / sizeof((a)[0]))

static int on_section(nrs_sctx_t *c, const char *path, int key, int val, void *dst,
                      const nrs_field_t *f)
{
    switch (f->aux) {
    case NRS_ROOT_CLUSTER:
        return nrs_walk_map(c, val, path, cluster_fields, N(cluster_fields), dst, &c->cluster);
    case NRS_ROOT_MODELS:
        return nrs_walk_map(c, val, path, models_fields, N(models_fields), dst, &c->models);
    case NRS_ROOT_ALGORITHM:
        return nrs_walk_map(c, val, path, algorithm_fields, N(algorithm_fields), dst,
                            &c->algorithm);
    case NRS_ROOT_WORKLOAD:
        return nrs_walk_map(c, val, path, workload_fields, N(workload_fields), dst, &c->workload);
    case NRS_ROOT_POLICY:
        return nrs_walk_map(c, val, path, policy_fields, N(policy_fields), dst, &c->policy);
    default:
        return nrs_walk_map(c, val, path, runtime_fields, N(runtime_fields), dst, &c->runtime);
    }
}

/* ---- handlers ------------------------------------------------------------ */

static int on_preset(nrs_sctx_t *c, const char *path, int key, int val, void *dst,
                     const nrs_field_t *f)
{
    char name[NRS_NAME_MAX], q[NRS_QUOTE_MAX + 8];
    nrs_model_t m;
    if (nrs_get_string(c, path, val, name, sizeof(name)) < 0)
        return -1;
    if (nrs_preset_lookup(name, &m) == 0) {
        memcpy(dst, m.preset, sizeof(m.preset)); /* canonical spelling */
        return 0;
    }
    /* suggest over canonical spellings, so "Llama-3-7B" finds llama3-8b */
    const char *const *names = nrs_preset_names();
    char norm[NRS_MAX_PRESETS][NRS_NAME_MAX], want[NRS_NAME_MAX];
    const char *cands[NRS_MAX_PRESETS];
    size_t n = 0;
    for (; names[n] && n < NRS_MAX_PRESETS; n++) {
        nrs_preset_normalize(names[n], strlen(names[n]), norm[n], sizeof(norm[n]));
        cands[n] = norm[n];
    }
    nrs_preset_normalize(name, strlen(name), want, sizeof(want));
    const char *s = nrs_suggest(want, strlen(want), cands, n);
    const char *hint = NULL;
    for (size_t i = 0; i < n && s; i++)
        if (cands[i] == s)
            hint = names[i];
    nrs_quote(q, name, strlen(name));
    if (hint)
        return nrs_diag_at(&c->d, nrs_node(c, val)->mark,
                           "%s: unknown preset '%s'; did you mean '%s'?", path, q, hint);
    return nrs_diag_at(&c->d, nrs_node(c, val)->mark,
                       "%s: unknown preset '%s' (see docs/job-spec.md for the list, or give "
                       "layers, hidden, ffn, heads, kv_heads and vocab)",
                       path, q);
}

static int on_layout(nrs_sctx_t *c, const char *path, int key, int val, void *dst,
                     const nrs_field_t *f)
{
    return nrs_walk_map(c, val, path, layout_fields, N(layout_fields), dst, &c->layout[c->role]);
}

/* Which model-stages a role has: only the actor generates, only actor and
 * critic train (see nrs_ms_t). */
static int on_stage(nrs_sctx_t *c, const char *path, int key, int val, void *dst,
                    const nrs_field_t *f)
{
    const nrs_ynode_t *k = nrs_node(c, key);
    const char *role = nrs_role_name((nrs_role_t)c->role);
    if (f->aux == NRS_STAGE_GENERATE && c->role != NRS_ROLE_ACTOR)
        return nrs_diag_at(&c->d, k->mark, "%s: only the actor has a generate stage", path);
    if (f->aux == NRS_STAGE_TRAIN && c->role != NRS_ROLE_ACTOR && c->role != NRS_ROLE_CRITIC)
        return nrs_diag_at(&c->d, k->mark, "%s: the %s model is not trained (no %s.train stage)",
                           path, role, role);
    return nrs_walk_map(c, val, path, tp_pp_fields, N(tp_pp_fields), dst,
                        &c->tp_pp[c->role][f->aux]);
}

static void copy_dims(nrs_model_t *dst, const nrs_model_t *src, const nrs_seen_t *s)
{
    if (nrs_seen(s, NRS_MD_LAYERS))
        dst->layers = src->layers;
    if (nrs_seen(s, NRS_MD_HIDDEN))
        dst->hidden = src->hidden;
    if (nrs_seen(s, NRS_MD_FFN))
        dst->ffn = src->ffn;
    if (nrs_seen(s, NRS_MD_HEADS))
        dst->heads = src->heads;
    if (nrs_seen(s, NRS_MD_KV_HEADS))
        dst->kv_heads = src->kv_heads;
    if (nrs_seen(s, NRS_MD_VOCAB))
        dst->vocab = src->vocab;
    if (nrs_seen(s, NRS_MD_DTYPE))
        dst->dtype = src->dtype;
    if (nrs_seen(s, NRS_MD_TIED))
        dst->tied_embeddings = src->tied_embeddings;
}

/* A model: preset first, then explicit dims on top, whatever their order. */
static int on_model(nrs_sctx_t *c, const char *path, int key, int val, void *dst,
                    const nrs_field_t *f)
{
    nrs_model_t given = {.dtype = NRS_DTYPE_BF16}, *m = dst;
    nrs_seen_t *s = &c->model[f->aux];
    c->role = f->aux;
    if (nrs_walk_map(c, val, path, model_fields, N(model_fields), &given, s) < 0)
        return -1;
    *m = (nrs_model_t){.dtype = NRS_DTYPE_BF16};
    if (nrs_seen(s, NRS_MD_PRESET) && nrs_preset_lookup(given.preset, m) < 0)
        return nrs_diag_at(&c->d, s->val[NRS_MD_PRESET], "%s: preset vanished", path);
    for (int i = NRS_MD_LAYERS; i <= NRS_MD_VOCAB && !nrs_seen(s, NRS_MD_PRESET); i++)
        if (!nrs_seen(s, i))
            return nrs_diag_at(&c->d, s->map,
                               "missing required key '%s' in %s (no preset given)",
                               model_fields[i].name, path);
    copy_dims(m, &given, s);
    m->init_train = given.init_train;
    m->init_infer = given.init_infer;
    m->init_generate = given.init_generate;
    m->present = true;
    m->value_head = f->aux == NRS_ROLE_CRITIC || f->aux == NRS_ROLE_REWARD;
    return 0;
}

static int on_reward(nrs_sctx_t *c, const char *path, int key, int val, void *dst,
                     const nrs_field_t *f)
{
    int v = 0;
    if (nrs_get_enum(c, path, val, f->enums, &v) < 0)
        return -1;
    *(bool *)dst = v != 0;
    return 0;
}

static int on_transports(nrs_sctx_t *c, const char *path, int key, int val, void *dst,
                         const nrs_field_t *f)
{
    const nrs_ynode_t *seq = nrs_node(c, val);
    unsigned mask = 0;
    char q[NRS_QUOTE_MAX + 8];
    if (seq->kind != NRS_YN_SEQ)
        return nrs_type_error(c, path, val, "a sequence (e.g. [ucx, nccl, local])");
    if (seq->count == 0)
        return nrs_diag_at(&c->d, seq->mark, "%s: list at least one transport", path);
    for (int i = seq->first; i >= 0; i = nrs_node(c, i)->next) {
        int item = nrs_deref(c, i);
        int bit = 0;
        if (item < 0 || nrs_get_enum(c, path, item, f->enums, &bit) < 0)
            return -1;
        const nrs_ynode_t *n = nrs_node(c, item);
        if (mask & (unsigned)bit)
            return nrs_diag_at(&c->d, nrs_node(c, i)->mark, "%s: transport '%s' listed twice", path,
                               nrs_quote(q, n->text, n->len));
        mask |= (unsigned)bit;
    }
    *(unsigned *)dst = mask;
    return 0;
}

/* ---- entry points -------------------------------------------------------- */

static void set_defaults(nrs_spec_t *s)
{
    s->cluster.host_gbps = 25;
    s->cluster.efficiency = 0.5;
    s->cluster.tp_across_nodes = false;
    s->algorithm = (nrs_algorithm_t){.name = NRS_ALGO_PPO, .reward_model = true, .kl = true};
    s->workload.samples_per_prompt = 1;
    s->workload.ppo_epochs = 1;
    s->workload.micro_batch_max = 64;
    s->policy = (nrs_policy_t){.horizon = 0, .min_gain = 0.02, .margin = 0.1, .hysteresis = 5,
                               .calib_alpha = 0.3, .drift_threshold = 0.15, .poll_interval = 2};
    s->runtime = (nrs_runtime_t){.transports = NRS_XFER_UCX | NRS_XFER_NCCL | NRS_XFER_LOCAL,
                                 .mem_headroom_gib = 2, .emulation_scale = 1e-3, .zero1 = true,
                                 .recompute = false, .verify = true, .zero3 = false,
                                 .offload_optimizer = false,
                                 .weight_sync = NRS_WSYNC_RESHARD};
}

static int load_tree(nrs_sctx_t *c, nrs_spec_t *s)
{
    nrs_ytree_t *t = &c->t;
    if (t->root < 0)
        return nrs_diag_at(&c->d, (nrs_mark_t){1, 1},
                           "empty spec: expected a mapping with cluster, models and workload");
    int root = nrs_deref(c, t->root);
    if (root < 0)
        return -1;
    if (nrs_node(c, root)->kind != NRS_YN_MAP)
        return nrs_type_error(c, "", root, "a mapping with cluster, models and workload");
    if (nrs_walk_map(c, root, "", root_fields, N(root_fields), s, &c->root) < 0)
        return -1;
    return nrs_spec_check(c, s);
}

int nrs_spec_load_buffer(const char *name, const char *buf, size_t len, nrs_spec_t *out,
                         char *err, size_t errlen)
{
    nrs_sctx_t *c = calloc(1, sizeof(*c));
    nrs_spec_t *s = calloc(1, sizeof(*s));
    nrs_diag_t oom = {.file = name ? name : "<spec>", .err = err, .errlen = errlen};
    int rc = -1;

    if (err && errlen)
        err[0] = '\0';
    if (!c || !s) {
        nrs_diag_at(&oom, (nrs_mark_t){1, 1}, "out of memory");
        goto fail;
    }
    c->d = (nrs_diag_t){.file = name ? name : "<spec>", .err = err, .errlen = errlen};
    c->t.root = -1;
    if (!buf && len)
        len = 0;
    if (len > NRS_SPEC_MAX_BYTES) {
        nrs_diag_at(&c->d, (nrs_mark_t){1, 1}, "spec too large (%zu bytes, limit %d)", len,
                    NRS_SPEC_MAX_BYTES);
        goto fail;
    }
    set_defaults(s);
    snprintf(s->path, sizeof(s->path), "%s", name ? name : "");
    if (nrs_ytree_parse(&c->t, buf ? buf : "", len, &c->d) < 0 || load_tree(c, s) < 0)
        goto fail;
    rc = 0;
fail:
    if (out && rc == 0)
        *out = *s;
    else if (out)
        memset(out, 0, sizeof(*out));
    if (c)
        nrs_ytree_free(&c->t);
    free(c);
    free(s);
    return rc;
}

int nrs_spec_load_fd(int fd, const char *name, nrs_spec_t *out, char *err, size_t errlen)
{
    char *buf = NULL;
    size_t len = 0;
    int rc = -1;
    nrs_diag_t d = {.file = name ? name : "<spec>", .err = err, .errlen = errlen};
    const nrs_mark_t top = {1, 1};

    if (out)
        memset(out, 0, sizeof(*out));
    if (fd < 0) {
        nrs_diag_at(&d, top, "cannot read: %s", strerror(EBADF));
        goto fail;
    }
    /* one byte more than the bound tells "too large" from "exactly at the bound" */
    buf = malloc((size_t)NRS_SPEC_MAX_BYTES + 1);
    if (!buf) {
        nrs_diag_at(&d, top, "out of memory");
        goto fail;
    }
    while (len < (size_t)NRS_SPEC_MAX_BYTES + 1) {
        ssize_t k = read(fd, buf + len, (size_t)NRS_SPEC_MAX_BYTES + 1 - len);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0) {
            nrs_diag_at(&d, top, "cannot read: %s", strerror(errno));
            goto fail;
        }
        if (k == 0)
            break;
        len += (size_t)k;
    }
    if (len > NRS_SPEC_MAX_BYTES) {
        nrs_diag_at(&d, top, "spec too large (more than %d bytes)", NRS_SPEC_MAX_BYTES);
        goto fail;
    }
    rc = nrs_spec_load_buffer(name, buf, len, out, err, errlen);
fail:
    free(buf);
    return rc;
}

int nrs_spec_load(const char *path, nrs_spec_t *out, char *err, size_t errlen)
{
    nrs_diag_t d = {.file = path ? path : "<spec>", .err = err, .errlen = errlen};
    int fd, rc;

    if (out)
        memset(out, 0, sizeof(*out));
    if (!path || (fd = open(path, O_RDONLY | O_CLOEXEC)) < 0) {
        nrs_diag_at(&d, (nrs_mark_t){1, 1}, "cannot open: %s",
                    path ? strerror(errno) : "no path given");
        return -1;
    }
    rc = nrs_spec_load_fd(fd, path, out, err, errlen);
    close(fd);
    return rc;
}
