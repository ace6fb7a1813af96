/* Unit tests of the job-spec loader: examples, presets, defaults, overrides,
 * every error class (tests/unit/data/spec/bad/NAME.yaml, whose first line is
 * "# expect: LINE:COL: message"), input bounds, and a deterministic round of
 * truncated and mutated inputs. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "nereus/spec.h"
#include "spec/spec_internal.h"

/* ---- helpers ------------------------------------------------------------- */

static const char *srcdir(void)
{
    const char *s = getenv("NRS_SRCDIR");
    return s && *s ? s : ".";
}

static void src_path(char *buf, size_t cap, const char *rel)
{
    snprintf(buf, cap, "%s/%s", srcdir(), rel);
}

static char *slurp(const char *path, size_t *len)
{
    FILE *fp = fopen(path, "rb");
    char *buf = NULL;
    if (!fp)
        return NULL;
    buf = malloc(NRS_SPEC_MAX_BYTES + 1);
    if (buf)
        *len = fread(buf, 1, NRS_SPEC_MAX_BYTES, fp);
    fclose(fp);
    return buf;
}

static void load_ok(const char *rel, nrs_spec_t *s)
{
    char path[512], err[NRS_ERR_MAX];
    src_path(path, sizeof(path), rel);
    int rc = nrs_spec_load(path, s, err, sizeof(err));
    if (rc != 0)
        print_error("%s: %s\n", rel, err);
    assert_int_equal(rc, 0);
    assert_string_equal(s->path, path);
}

/* "NAME:LINE:COL: message" on one line, LINE and COL >= 1. */
static void assert_error_shape(const char *err, const char *name)
{
    size_t n = strlen(name);
    assert_true(strlen(err) < NRS_ERR_MAX);
    assert_null(strchr(err, '\n'));
    assert_memory_equal(err, name, n);
    const char *p = err + n;
    assert_int_equal(*p, ':');
    char *end;
    long line = strtol(p + 1, &end, 10);
    assert_true(line >= 1);
    assert_int_equal(*end, ':');
    long col = strtol(end + 1, &end, 10);
    assert_true(col >= 1);
    assert_memory_equal(end, ": ", 2);
    assert_true(strlen(end + 2) > 0);
}

static void assert_dims(const nrs_model_t *m, int layers, int hidden, int ffn, int heads,
                        int kv_heads, int vocab, bool tied)
{
    assert_int_equal(m->layers, layers);
    assert_int_equal(m->hidden, hidden);
    assert_int_equal(m->ffn, ffn);
    assert_int_equal(m->heads, heads);
    assert_int_equal(m->kv_heads, kv_heads);
    assert_int_equal(m->vocab, vocab);
    assert_int_equal(m->tied_embeddings, tied);
}

/* ---- examples ------------------------------------------------------------ */

static void test_examples_load(void **state)
{
    static const char *const ex[] = {"examples/ppo-llama3-8b.yaml", "examples/grpo-qwen2.5-7b.yaml",
                                     "examples/ppo-llama3-70b.yaml", "examples/tiny-cpu.yaml"};
    char dir[512];
    size_t found = 0;
    for (size_t i = 0; i < sizeof(ex) / sizeof(ex[0]); i++) {
        nrs_spec_t s;
        load_ok(ex[i], &s);
    }
    /* and nothing in examples/ is left out of the list above */
    src_path(dir, sizeof(dir), "examples");
    DIR *d = opendir(dir);
    assert_non_null(d);
    for (struct dirent *e; (e = readdir(d));) {
        size_t n = strlen(e->d_name);
        if (n > 5 && strcmp(e->d_name + n - 5, ".yaml") == 0) {
            char rel[300];
            nrs_spec_t s;
            snprintf(rel, sizeof(rel), "examples/%s", e->d_name);
            load_ok(rel, &s);
            found++;
        }
    }
    closedir(d);
    assert_true(found >= 4);
}

static void test_example_ppo_8b(void **state)
{
    nrs_spec_t s;
    load_ok("examples/ppo-llama3-8b.yaml", &s);
    assert_string_equal(s.cluster.gpu, "H100-SXM-80GB");
    assert_true(s.cluster.gpu_mem_gib == 80 && s.cluster.peak_tflops == 989);
    assert_true(s.cluster.hbm_gbps == 3350 && s.cluster.intra_gbps == 450);
    assert_true(s.cluster.inter_gbps == 50 && s.cluster.host_gbps == 25);
    assert_int_equal(s.cluster.gpus_per_node, 8);
    assert_int_equal(s.cluster.nodes, 4);
    assert_int_equal(s.algorithm.name, NRS_ALGO_PPO);
    assert_true(s.algorithm.reward_model && s.algorithm.kl);
    for (int r = 0; r < NRS_ROLE_COUNT; r++) {
        assert_true(s.models[r].present);
        assert_string_equal(s.models[r].preset, "llama3-8b");
        assert_dims(&s.models[r], 32, 4096, 14336, 32, 8, 128256, false);
        assert_int_equal(s.models[r].value_head, r == NRS_ROLE_CRITIC || r == NRS_ROLE_REWARD);
    }
    assert_int_equal(s.models[NRS_ROLE_ACTOR].init_generate.tp, 2);
    assert_int_equal(s.models[NRS_ROLE_ACTOR].init_train.tp, 4);
    assert_int_equal(s.models[NRS_ROLE_ACTOR].init_train.pp, 1);
    assert_int_equal(s.models[NRS_ROLE_REF].init_train.tp, 0);
    assert_int_equal(s.workload.global_batch, 256);
    assert_int_equal(s.workload.max_response_len, 8192);
    assert_int_equal(s.workload.steps, 1000);
    assert_int_equal(s.runtime.transports, NRS_XFER_UCX | NRS_XFER_NCCL | NRS_XFER_LOCAL);
    for (int ms = 0; ms < NRS_MS_COUNT; ms++)
        assert_true(nrs_spec_has_ms(&s, (nrs_ms_t)ms));
}

static void test_example_grpo(void **state)
{
    nrs_spec_t s;
    load_ok("examples/grpo-qwen2.5-7b.yaml", &s);
    assert_int_equal(s.algorithm.name, NRS_ALGO_GRPO);
    assert_false(s.algorithm.reward_model);
    assert_true(s.algorithm.kl);
    assert_false(s.models[NRS_ROLE_CRITIC].present);
    assert_false(s.models[NRS_ROLE_REWARD].present);
    assert_true(s.models[NRS_ROLE_REF].present);
    assert_string_equal(s.models[NRS_ROLE_ACTOR].preset, "qwen2.5-7b");
    assert_int_equal(s.models[NRS_ROLE_ACTOR].init_generate.tp, 1);
    assert_int_equal(s.models[NRS_ROLE_ACTOR].init_generate.pp, 0);
    assert_int_equal(s.workload.samples_per_prompt, 8);
    assert_int_equal(s.runtime.transports, NRS_XFER_UCX | NRS_XFER_NCCL | NRS_XFER_LOCAL);
    assert_false(nrs_spec_has_ms(&s, NRS_MS_CRITIC_TRAIN));
    assert_false(nrs_spec_has_ms(&s, NRS_MS_REWARD_INFER));
    assert_true(nrs_spec_has_ms(&s, NRS_MS_REF_INFER));
}

static void test_example_tiny(void **state)
{
    nrs_spec_t s;
    load_ok("examples/tiny-cpu.yaml", &s);
    const nrs_model_t *a = &s.models[NRS_ROLE_ACTOR];
    assert_string_equal(a->preset, "");
    assert_dims(a, 4, 256, 1024, 8, 2, 4096, true);
    assert_int_equal(a->dtype, NRS_DTYPE_FP32);
    assert_int_equal(s.runtime.transports, NRS_XFER_UCX | NRS_XFER_LOCAL);
    assert_true(s.runtime.emulation_scale == 1);
    assert_true(s.policy.poll_interval == 0.5);
}

/* The complete example in docs/job-spec.md stays valid. */
static void test_doc_example(void **state)
{
    char path[512], err[NRS_ERR_MAX];
    size_t len = 0;
    nrs_spec_t s;
    src_path(path, sizeof(path), "docs/job-spec.md");
    char *doc = slurp(path, &len);
    assert_non_null(doc);
    doc[len] = '\0';
    const char *sec = strstr(doc, "## Complete example");
    assert_non_null(sec);
    const char *b = strstr(sec, "```yaml\n");
    assert_non_null(b);
    b += strlen("```yaml\n");
    const char *e = strstr(b, "```");
    assert_non_null(e);
    int rc = nrs_spec_load_buffer("job-spec.md", b, (size_t)(e - b), &s, err, sizeof(err));
    if (rc != 0)
        print_error("%s\n", err);
    assert_int_equal(rc, 0);
    assert_int_equal(s.models[NRS_ROLE_REWARD].layers, 16);
    assert_string_equal(s.models[NRS_ROLE_CRITIC].preset, "llama3-8b");
    free(doc);
}

/* ---- presets ------------------------------------------------------------- */

static void test_presets_dims(void **state)
{
    nrs_model_t m;
    memset(&m, 0, sizeof(m));
    assert_int_equal(nrs_preset_lookup("llama3-8b", &m), 0);
    assert_dims(&m, 32, 4096, 14336, 32, 8, 128256, false);
    assert_int_equal(nrs_preset_lookup("llama3-70b", &m), 0);
    assert_dims(&m, 80, 8192, 28672, 64, 8, 128256, false);
    assert_int_equal(nrs_preset_lookup("qwen2.5-7b", &m), 0);
    assert_dims(&m, 28, 3584, 18944, 28, 4, 152064, false);
    assert_int_equal(nrs_preset_lookup("qwen2.5-32b", &m), 0);
    assert_dims(&m, 64, 5120, 27648, 40, 8, 152064, false);
    assert_int_equal(nrs_preset_lookup("llama3.2-1b", &m), 0);
    assert_dims(&m, 16, 2048, 8192, 32, 8, 128256, true);
    assert_int_equal(nrs_preset_lookup("qwen2.5-0.5b", &m), 0);
    assert_dims(&m, 24, 896, 4864, 14, 2, 151936, true);
    assert_int_equal(m.dtype, NRS_DTYPE_BF16);
    assert_string_equal(m.preset, "qwen2.5-0.5b");
}

static void test_preset_spellings(void **state)
{
    static const struct {
        const char *given, *canonical;
    } v[] = {
        {"Llama-3-8B", "llama3-8b"},          {"LLAMA3-8B", "llama3-8b"},
        {"meta-llama-3-8b", "llama3-8b"},     {"Meta-Llama-3-8B-Instruct", "llama3-8b"},
        {"llama_3_8b", "llama3-8b"},          {"Llama-3.1-70B", "llama3.1-70b"},
        {"Qwen2.5-7B-Instruct", "qwen2.5-7b"}, {"qwen2.5_7b", "qwen2.5-7b"},
        {"Qwen2.5-0.5B", "qwen2.5-0.5b"},     {"Llama-3.2-1B", "llama3.2-1b"},
        {"llama3.2-1b", "llama3.2-1b"},
    };
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        nrs_model_t m;
        memset(&m, 0, sizeof(m));
        assert_int_equal(nrs_preset_lookup(v[i].given, &m), 0);
        assert_string_equal(m.preset, v[i].canonical);
    }
    assert_int_equal(nrs_preset_lookup("llama3-7b", NULL), -1);
    assert_int_equal(nrs_preset_lookup("", NULL), -1);
    assert_int_equal(nrs_preset_lookup(NULL, NULL), -1);
    assert_int_equal(nrs_preset_lookup("gpt-2", NULL), -1);
}

static void test_preset_names(void **state)
{
    const char *const *names = nrs_preset_names();
    size_t n = 0;
    for (; names[n]; n++) {
        nrs_model_t m;
        char a[NRS_NAME_MAX], b[NRS_NAME_MAX];
        memset(&m, 0, sizeof(m));
        assert_int_equal(nrs_preset_lookup(names[n], &m), 0);
        assert_string_equal(m.preset, names[n]);
        assert_int_equal(m.heads % m.kv_heads, 0);
        assert_int_equal(m.hidden % m.heads, 0);
        /* normalized spellings never collide */
        nrs_preset_normalize(names[n], strlen(names[n]), a, sizeof(a));
        for (size_t j = 0; j < n; j++) {
            nrs_preset_normalize(names[j], strlen(names[j]), b, sizeof(b));
            assert_string_not_equal(a, b);
        }
    }
    assert_true(n >= 6 && n <= NRS_MAX_PRESETS);
}

/* ---- defaults, overrides, aliases ---------------------------------------- */

static void test_defaults(void **state)
{
    nrs_spec_t s;
    load_ok("tests/unit/data/spec/good/minimal.yaml", &s);
    assert_string_equal(s.cluster.gpu, "");
    assert_true(s.cluster.host_gbps == 25);
    assert_true(s.cluster.efficiency == 0.5);
    assert_false(s.cluster.tp_across_nodes);
    assert_int_equal(s.algorithm.name, NRS_ALGO_PPO);
    assert_true(s.algorithm.reward_model);
    assert_true(s.algorithm.kl);
    assert_int_equal(s.workload.samples_per_prompt, 1);
    assert_int_equal(s.workload.max_response_len, s.workload.response_len);
    assert_int_equal(s.workload.ppo_epochs, 1);
    assert_int_equal(s.workload.micro_batch_max, 64);
    assert_int_equal(s.policy.horizon, 0);
    assert_true(s.policy.min_gain == 0.02 && s.policy.margin == 0.1);
    assert_int_equal(s.policy.hysteresis, 5);
    assert_true(s.policy.calib_alpha == 0.3 && s.policy.drift_threshold == 0.15);
    assert_true(s.policy.poll_interval == 2);
    assert_int_equal(s.runtime.transports, NRS_XFER_UCX | NRS_XFER_NCCL | NRS_XFER_LOCAL);
    assert_true(s.runtime.mem_headroom_gib == 2 && s.runtime.emulation_scale == 1e-3);
    assert_true(s.runtime.zero1 && !s.runtime.recompute && s.runtime.verify);
    assert_false(s.runtime.zero3);
    assert_false(s.runtime.offload_optimizer);
    assert_int_equal(s.runtime.weight_sync, NRS_WSYNC_RESHARD);
    for (int r = 0; r < NRS_ROLE_COUNT; r++) {
        const nrs_model_t *m = &s.models[r];
        assert_true(m->present);
        assert_int_equal(m->dtype, NRS_DTYPE_BF16);
        assert_int_equal(m->init_train.tp + m->init_train.pp + m->init_infer.tp +
                             m->init_infer.pp + m->init_generate.tp + m->init_generate.pp,
                         0);
        assert_dims(m, 16, 2048, 8192, 32, 8, 128256, true);
    }
}

/* The optional cost-model switches of runtime (docs/job-spec.md): set, and
 * their errors. */
static void test_runtime_cost_switches(void **state)
{
    (void)state;
    char path[512], err[NRS_ERR_MAX], buf[4096];
    size_t len = 0;
    nrs_spec_t s;
    src_path(path, sizeof(path), "tests/unit/data/spec/good/minimal.yaml");
    char *base = slurp(path, &len);
    assert_non_null(base);
    int n = snprintf(buf, sizeof(buf), "%.*sruntime:\n  zero3: true\n  offload_optimizer: true\n"
                                       "  weight_sync: Broadcast\n", (int)len, base);
    assert_int_equal(nrs_spec_load_buffer("rt", buf, (size_t)n, &s, err, sizeof(err)), 0);
    assert_true(s.runtime.zero3 && s.runtime.offload_optimizer);
    assert_int_equal(s.runtime.weight_sync, NRS_WSYNC_BROADCAST);
    assert_true(s.runtime.zero1 && s.runtime.verify); /* the others keep their defaults */
    n = snprintf(buf, sizeof(buf), "%.*sruntime:\n  weight_sync: reshard\n  zero3: false\n",
                 (int)len, base);
    assert_int_equal(nrs_spec_load_buffer("rt", buf, (size_t)n, &s, err, sizeof(err)), 0);
    assert_int_equal(s.runtime.weight_sync, NRS_WSYNC_RESHARD);
    assert_false(s.runtime.zero3);
    n = snprintf(buf, sizeof(buf), "%.*sruntime:\n  weight_sync: brodcast\n", (int)len, base);
    assert_int_equal(nrs_spec_load_buffer("rt", buf, (size_t)n, &s, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "runtime.weight_sync: unknown value 'brodcast'"));
    assert_non_null(strstr(err, "did you mean 'broadcast'"));
    n = snprintf(buf, sizeof(buf), "%.*sruntime:\n  zero3: yes\n", (int)len, base);
    assert_int_equal(nrs_spec_load_buffer("rt", buf, (size_t)n, &s, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "runtime.zero3"));
    n = snprintf(buf, sizeof(buf), "%.*sruntime:\n  offload_optimiser: true\n", (int)len, base);
    assert_int_equal(nrs_spec_load_buffer("rt", buf, (size_t)n, &s, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "offload_optimizer"));
    free(base);
}

static void test_overrides(void **state)
{
    nrs_spec_t s;
    load_ok("tests/unit/data/spec/good/override.yaml", &s);
    const nrs_model_t *a = &s.models[NRS_ROLE_ACTOR], *r = &s.models[NRS_ROLE_REF];
    assert_string_equal(a->preset, "llama3-8b");
    assert_dims(a, 8, 4096, 14336, 32, 8, 32000, false); /* layers given before the preset */
    assert_int_equal(a->dtype, NRS_DTYPE_FP16);
    assert_string_equal(r->preset, "qwen2.5-0.5b");
    assert_dims(r, 24, 896, 4864, 14, 7, 151936, false);
    assert_int_equal(r->dtype, NRS_DTYPE_BF16);
    assert_false(r->value_head);
}

/* Load a GRPO spec whose actor has these dims; 0, or -1 with err. */
static int load_dims(int layers, int hidden, int ffn, int heads, int kv, int vocab, char *err,
                     size_t errlen)
{
    char buf[1024];
    nrs_spec_t s;
    int n = snprintf(buf, sizeof(buf),
                     "cluster: {gpu_mem_gib: 80, peak_tflops: 989, hbm_gbps: 3350, "
                     "gpus_per_node: 8, nodes: 1, intra_gbps: 450, inter_gbps: 50}\n"
                     "models:\n"
                     "  actor: {layers: %d, hidden: %d, ffn: %d, heads: %d, kv_heads: %d, "
                     "vocab: %d}\n"
                     "algorithm: {name: grpo, reward: rule, kl: false}\n"
                     "workload: {global_batch: 8, samples_per_prompt: 4, prompt_len: 128, "
                     "response_len: 128, steps: 10}\n",
                     layers, hidden, ffn, heads, kv, vocab);
    assert_true(n > 0 && (size_t)n < sizeof(buf));
    return nrs_spec_load_buffer("d", buf, (size_t)n, &s, err, errlen);
}

/* layers * hidden is the largest coordinate of a stacked layer tensor, an
 * int32: every key in its range (layers 4096, hidden 2^20) gave 2^32, which
 * wrapped to a qkv of 3145728 x 0. Refused above 2^30, at hidden's value;
 * a 405B-class model is 1/520 of the bound. */
static void test_stacked_bound(void **state)
{
    (void)state;
    char err[NRS_ERR_MAX];
    if (load_dims(126, 16384, 53248, 128, 8, 128256, err, sizeof(err)))
        fail_msg("405B-class: %s", err);
    assert_true(126LL * 16384 * 512 < NRS_MODEL_MAX_STACKED);
    if (load_dims(1024, 1 << 20, 4096, 8, 8, 1000, err, sizeof(err))) /* exactly 2^30 */
        fail_msg("at the bound: %s", err);
    assert_int_equal(load_dims(1025, 1 << 20, 4096, 8, 8, 1000, err, sizeof(err)), -1);
    assert_string_equal(err, "d:3:33: models.actor: layers * hidden (1025 * 1048576 = "
                             "1074790400) must be at most 2^30 (1073741824): the layer "
                             "tensors stack every layer in 32-bit shard coordinates");
    assert_int_equal(load_dims(4096, 1 << 20, 4096, 8, 8, 1000, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "(4096 * 1048576 = 4294967296) must be at most 2^30"));
}

static void test_aliases_within_bounds(void **state)
{
    nrs_spec_t s;
    load_ok("tests/unit/data/spec/good/aliases.yaml", &s);
    for (int r = 0; r < NRS_ROLE_COUNT; r++) {
        assert_true(s.models[r].present);
        assert_int_equal(s.models[r].init_infer.tp, 2);
    }
    assert_true(s.models[NRS_ROLE_CRITIC].value_head);
    assert_false(s.models[NRS_ROLE_REF].value_head);
    assert_int_equal(s.runtime.transports, NRS_XFER_LOCAL | NRS_XFER_UCX);
}

/* ---- the error classes, one file each ------------------------------------ */

static const char *const bad_cases[] = {
    "alias-expansions", "alias-recursive", "alias-undefined", "billion-laughs", "control-escape", "depth",
    "depth-block", "duplicate-in-flow", "duplicate-key", "duplicate-section", "empty",
    "enum-algorithm", "enum-dtype", "enum-dtype-nosuggest", "enum-reward", "enum-transport",
    "generate-not-actor", "grpo-critic", "grpo-samples", "grpo-samples-default", "headroom",
    "headroom-default", "heads-kv", "heads-kv-explicit", "hidden-heads", "invalid-utf8",
    "key-not-scalar", "max-response", "missing-actor", "missing-critic", "missing-dims",
    "missing-key", "missing-ref", "missing-reward", "missing-section", "multi-doc", "negative",
    "negative-double", "not-a-number-inf", "nul-escape", "null-doc", "overflow-double",
    "overflow-int32", "overflow-int64", "pp-layers", "preset-unknown", "preset-unknown-far",
    "range-calib-alpha", "range-calib-alpha-zero", "range-efficiency", "range-emulation-scale",
    "range-min-gain", "range-tp", "raw-nul", "ref-without-kl", "reward-rule-with-model",
    "root-scalar", "stacked-overflow", "string-too-long", "syntax", "syntax-flow", "syntax-indent", "tag-binary",
    "tag-local", "too-big-int", "tp-gpus-per-node", "tp-heads", "tp-kv-heads", "tp-pp-gpus",
    "train-ref", "transport-empty", "transport-scalar", "transport-twice", "underflow-double",
    "unknown-key", "unknown-key-case", "unknown-key-list", "unknown-key-transposed",
    "unknown-model-key", "unknown-role", "wrong-type-bool", "wrong-type-float-for-int",
    "wrong-type-mapping", "wrong-type-null", "wrong-type-quoted", "wrong-type-root",
    "wrong-type-section", "wrong-type-string", "zero", "zero-double",
};
enum { NBAD = sizeof(bad_cases) / sizeof(bad_cases[0]) };

static void test_bad_file(void **state)
{
    const char *name = *state;
    char rel[256], path[512], err[NRS_ERR_MAX], want[NRS_ERR_MAX];
    size_t len = 0;
    snprintf(rel, sizeof(rel), "tests/unit/data/spec/bad/%s.yaml", name);
    src_path(path, sizeof(path), rel);
    char *buf = slurp(path, &len);
    assert_non_null(buf);
    const char *tag = "# expect: ";
    assert_memory_equal(buf, tag, strlen(tag));
    const char *e = buf + strlen(tag), *nl = memchr(e, '\n', len - strlen(tag));
    assert_non_null(nl);
    snprintf(want, sizeof(want), "%.*s", (int)(nl - e), e);
    free(buf);

    /* want = "LINE:COL: message": the position must match exactly, the
     * message must contain the expected text */
    const char *msg = strstr(want, ": ");
    assert_non_null(msg);
    nrs_spec_t s;
    memset(&s, 0xAB, sizeof(s));
    int rc = nrs_spec_load(path, &s, err, sizeof(err));
    if (rc == 0)
        print_error("%s: loaded, expected %s\n", name, want);
    assert_int_equal(rc, -1);
    assert_error_shape(err, path);
    char pos[NRS_ERR_MAX + 600];
    snprintf(pos, sizeof(pos), "%s:%.*s: ", path, (int)(msg - want), want);
    if (strncmp(err, pos, strlen(pos)) != 0 || !strstr(err + strlen(pos), msg + 2))
        print_error("%s:\n  want %s\n  got  %s\n", name, want, err + strlen(path) + 1);
    assert_memory_equal(err, pos, strlen(pos));
    assert_non_null(strstr(err + strlen(pos), msg + 2));
    /* a failed load leaves a zeroed spec, never half a spec */
    assert_int_equal(s.models[NRS_ROLE_ACTOR].present, 0);
    assert_int_equal(s.cluster.nodes, 0);
}

static void test_bad_files_all_listed(void **state)
{
    char dir[512];
    size_t n = 0;
    src_path(dir, sizeof(dir), "tests/unit/data/spec/bad");
    DIR *d = opendir(dir);
    assert_non_null(d);
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.')
            continue;
        bool listed = false;
        for (size_t i = 0; i < NBAD && !listed; i++) {
            char f[256];
            snprintf(f, sizeof(f), "%s.yaml", bad_cases[i]);
            listed = strcmp(f, e->d_name) == 0;
        }
        if (!listed)
            print_error("%s is not in bad_cases[]\n", e->d_name);
        assert_true(listed);
        n++;
    }
    closedir(d);
    assert_int_equal(n, NBAD);
}

/* ---- input bounds and API edges ------------------------------------------ */

static void test_buffer_bounds(void **state)
{
    char err[NRS_ERR_MAX];
    nrs_spec_t s;
    char *big = malloc(NRS_SPEC_MAX_BYTES + 2);
    assert_non_null(big);
    memset(big, ' ', NRS_SPEC_MAX_BYTES + 1);
    big[NRS_SPEC_MAX_BYTES + 1] = '\0';
    assert_int_equal(nrs_spec_load_buffer("big", big, NRS_SPEC_MAX_BYTES + 1, &s, err, sizeof(err)), -1);
    assert_string_equal(err, "big:1:1: spec too large (1048577 bytes, limit 1048576)");
    /* exactly at the bound is read (and is an empty spec) */
    assert_int_equal(nrs_spec_load_buffer("big", big, NRS_SPEC_MAX_BYTES, &s, err, sizeof(err)), -1);
    assert_string_equal(err, "big:1:1: empty spec: expected a mapping with cluster, models and workload");
    free(big);

    assert_int_equal(nrs_spec_load_buffer("nil", NULL, 0, &s, err, sizeof(err)), -1);
    assert_string_equal(err, "nil:1:1: empty spec: expected a mapping with cluster, models and workload");
    assert_int_equal(nrs_spec_load_buffer(NULL, "x: 1", 4, &s, err, sizeof(err)), -1);
    assert_string_equal(err, "<spec>:1:1: unknown key 'x' in the top level (valid keys: cluster, "
                             "models, algorithm, workload, policy, runtime)");
    /* no err buffer, or a tiny one: still -1, never an overflow */
    assert_int_equal(nrs_spec_load_buffer("t", "x: 1", 4, &s, NULL, 0), -1);
    char tiny[8];
    memset(tiny, 'Z', sizeof(tiny));
    assert_int_equal(nrs_spec_load_buffer("t", "x: 1", 4, &s, tiny, 6), -1);
    assert_string_equal(tiny, "t:1:1");
    assert_int_equal(tiny[7], 'Z');
    /* embedded NUL bytes in the middle of the buffer */
    static const char nul[] = "cluster:\n  gpu: a\0b\n";
    assert_int_equal(nrs_spec_load_buffer("nul", nul, sizeof(nul) - 1, &s, err, sizeof(err)), -1);
    assert_string_equal(err, "nul:2:9: invalid input: control characters are not allowed (byte 0x00)");
    /* a message echoing user bytes stays on one line */
    static const char q[] = "\"a\\nb\": 1\n";
    assert_int_equal(nrs_spec_load_buffer("q", q, sizeof(q) - 1, &s, err, sizeof(err)), -1);
    assert_string_equal(err, "q:1:1: unknown key 'a?b' in the top level (valid keys: cluster, models, "
                             "algorithm, workload, policy, runtime)");
    /* C1 controls (NEL) and the line separator become '?' too */
    static const char c1[] = "\"a\\Nb\\Lc\\x80\": 1\n";
    assert_int_equal(nrs_spec_load_buffer("c1", c1, sizeof(c1) - 1, &s, err, sizeof(err)), -1);
    assert_string_equal(err, "c1:1:1: unknown key 'a?b?c?' in the top level (valid keys: cluster, "
                             "models, algorithm, workload, policy, runtime)");
}

/* A reader error names the character libyaml decoded (not its low byte) at
 * the line and column libyaml's own marks would give: the BOM is no column,
 * CR, NEL and LS break lines, UTF-16 counts 2-byte units. */
static void test_reader_error_marks(void **state)
{
    (void)state;
    static const struct {
        const char *in;
        size_t len;
        const char *want;
    } c[] = {
#define C(s, w) {s, sizeof(s) - 1, w}
        C("ab: \xed\xa0\x80\n", "t:1:5: invalid input: invalid Unicode character (U+D800)"),
        C("ab: \xef\xbf\xbe\n", "t:1:5: invalid input: control characters are not allowed (U+FFFE)"),
        C("ab: \xc2\x80\n",
          "t:1:5: invalid input: control characters are not allowed (U+0080)"),
        C("\xef\xbb\xbfx: \xff\n", "t:1:4: invalid input: invalid leading UTF-8 octet (byte 0xff)"),
        C("a: 1\rb: \xff\n", "t:2:4: invalid input: invalid leading UTF-8 octet (byte 0xff)"),
        C("a: 1\r\nb: \xff\n", "t:2:4: invalid input: invalid leading UTF-8 octet (byte 0xff)"),
        C("a: 1\xe2\x80\xa8" "b: \xff\n",
          "t:2:4: invalid input: invalid leading UTF-8 octet (byte 0xff)"),
        C("\xff\xfe\n\0\n\0x\0\0\xdc\n\0",
          "t:3:2: invalid input: unexpected low surrogate area (U+DC00)"),
#undef C
    };
    char err[NRS_ERR_MAX];
    nrs_spec_t s;
    for (size_t i = 0; i < sizeof(c) / sizeof(c[0]); i++) {
        assert_int_equal(nrs_spec_load_buffer("t", c[i].in, c[i].len, &s, err, sizeof(err)), -1);
        if (strcmp(err, c[i].want) != 0)
            print_error("case %zu:\n  want %s\n  got  %s\n", i, c[i].want, err);
        assert_string_equal(err, c[i].want);
    }
}

static void test_file_errors(void **state)
{
    char err[NRS_ERR_MAX], dir[512], path[600];
    nrs_spec_t s;
    assert_int_equal(nrs_spec_load("/nonexistent/nereus.yaml", &s, err, sizeof(err)), -1);
    assert_string_equal(err, "/nonexistent/nereus.yaml:1:1: cannot open: No such file or directory");
    assert_int_equal(nrs_spec_load(NULL, &s, err, sizeof(err)), -1);
    assert_string_equal(err, "<spec>:1:1: cannot open: no path given");

    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof(dir), "%s/nrs-spec-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    assert_non_null(mkdtemp(dir));
    assert_int_equal(nrs_spec_load(dir, &s, err, sizeof(err)), -1);
    assert_error_shape(err, dir);
    assert_non_null(strstr(err, ": cannot read: Is a directory"));

    snprintf(path, sizeof(path), "%s/big.yaml", dir);
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    for (int i = 0; i <= NRS_SPEC_MAX_BYTES / 8; i++)
        fputs("#comment", fp);
    fclose(fp);
    assert_int_equal(nrs_spec_load(path, &s, err, sizeof(err)), -1);
    assert_non_null(strstr(err, ":1:1: spec too large (more than 1048576 bytes)"));
    unlink(path);
    rmdir(dir);
}

/* nrs_spec_load_fd: the same result as nrs_spec_load, messages naming the
 * given name, the descriptor left open; a pipe is read to its end. */
static void test_load_fd(void **state)
{
    char path[512], err[NRS_ERR_MAX];
    nrs_spec_t s, ref;
    size_t len = 0;
    int fd, p[2];

    src_path(path, sizeof(path), "examples/tiny-cpu.yaml");
    assert_int_equal(nrs_spec_load(path, &ref, err, sizeof(err)), 0);
    fd = open(path, O_RDONLY);
    assert_true(fd >= 0);
    assert_int_equal(nrs_spec_load_fd(fd, "named.yaml", &s, err, sizeof(err)), 0);
    assert_string_equal(s.path, "named.yaml");
    snprintf(s.path, sizeof(s.path), "%s", ref.path);
    assert_memory_equal(&s, &ref, sizeof(s));
    assert_int_equal(fcntl(fd, F_GETFD), 0); /* still open: the caller's */
    close(fd);

    src_path(path, sizeof(path), "tests/unit/data/spec/bad/alias-undefined.yaml");
    fd = open(path, O_RDONLY);
    assert_true(fd >= 0);
    assert_int_equal(nrs_spec_load_fd(fd, "bad.yaml", &s, err, sizeof(err)), -1);
    assert_error_shape(err, "bad.yaml");
    close(fd);

    src_path(path, sizeof(path), "examples/tiny-cpu.yaml");
    char *buf = slurp(path, &len);
    assert_non_null(buf);
    assert_true(len > 0 && len < 65536); /* fits a pipe's buffer */
    assert_int_equal(pipe(p), 0);
    assert_int_equal(write(p[1], buf, len), (ssize_t)len);
    close(p[1]);
    assert_int_equal(nrs_spec_load_fd(p[0], "pipe", &s, err, sizeof(err)), 0);
    close(p[0]);
    free(buf);

    assert_int_equal(nrs_spec_load_fd(-1, "nofd", &s, err, sizeof(err)), -1);
    assert_string_equal(err, "nofd:1:1: cannot read: Bad file descriptor");
}

static void test_suggest(void **state)
{
    assert_int_equal(nrs_edit_distance("gpus_per_nod", 12, "gpus_per_node", 13, 3), 1);
    assert_int_equal(nrs_edit_distance("wrokload", 8, "workload", 8, 3), 1); /* transposition */
    assert_int_equal(nrs_edit_distance("NODES", 5, "nodes", 5, 3), 0);
    assert_int_equal(nrs_edit_distance("abc", 3, "xyz", 3, 3), 3);
    assert_int_equal(nrs_edit_distance("a", 1, "abcdefgh", 8, 3), 4); /* capped */
    static const char *const keys[] = {"nodes", "gpus_per_node", NULL, "inter_gbps"};
    assert_string_equal(nrs_suggest("inter_gbs", 9, keys, 4), "inter_gbps");
    assert_null(nrs_suggest("colour", 6, keys, 4));
    assert_null(nrs_suggest("", 0, keys, 4));
}

/* ---- never a crash, a leak or a malformed message, whatever the bytes ---- */

static void check_any(const char *name, const char *buf, size_t len)
{
    char err[NRS_ERR_MAX];
    nrs_spec_t s;
    int rc = nrs_spec_load_buffer(name, buf, len, &s, err, sizeof(err));
    assert_true(rc == 0 || rc == -1);
    if (rc < 0)
        assert_error_shape(err, name);
}

static void test_truncations_and_mutations(void **state)
{
    char path[512];
    size_t len = 0;
    src_path(path, sizeof(path), "examples/ppo-llama3-8b.yaml");
    char *orig = slurp(path, &len);
    assert_non_null(orig);
    char *buf = malloc(len + 1);
    assert_non_null(buf);
    int ok = 0;

    for (size_t n = 0; n <= len; n++) { /* every prefix */
        memcpy(buf, orig, n);
        char err[NRS_ERR_MAX];
        nrs_spec_t s;
        int rc = nrs_spec_load_buffer("trunc", buf, n, &s, err, sizeof(err));
        if (rc < 0)
            assert_error_shape(err, "trunc");
        ok += rc == 0;
    }
    assert_true(ok >= 1); /* at least the whole file; most prefixes lack keys */

    static const char spice[] = ":-[]{},&*!|>'\"#%@`\0\n\t ~0123456789.eE\xff\xc3";
    uint32_t x = 0x9E3779B9u;
    for (int round = 0; round < 4000; round++) {
        memcpy(buf, orig, len);
        int edits = 1 + round % 4;
        for (int e = 0; e < edits; e++) {
            x = x * 1664525u + 1013904223u;
            size_t at = (x >> 8) % len;
            x = x * 1664525u + 1013904223u;
            buf[at] = (x & 1) ? spice[(x >> 8) % (sizeof(spice) - 1)] : (char)(x >> 16);
        }
        check_any("mut", buf, len);
    }
    /* spliced halves of two files */
    for (size_t cut = 0; cut < len; cut += 37)
        check_any("splice", orig + cut, len - cut);
    free(buf);
    free(orig);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_examples_load),
        cmocka_unit_test(test_example_ppo_8b),
        cmocka_unit_test(test_example_grpo),
        cmocka_unit_test(test_example_tiny),
        cmocka_unit_test(test_doc_example),
        cmocka_unit_test(test_presets_dims),
        cmocka_unit_test(test_preset_spellings),
        cmocka_unit_test(test_preset_names),
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_overrides),
        cmocka_unit_test(test_stacked_bound),
        cmocka_unit_test(test_aliases_within_bounds),
        cmocka_unit_test(test_bad_files_all_listed),
        cmocka_unit_test(test_buffer_bounds),
        cmocka_unit_test(test_reader_error_marks),
        cmocka_unit_test(test_file_errors),
        cmocka_unit_test(test_load_fd),
        cmocka_unit_test(test_suggest),
        cmocka_unit_test(test_runtime_cost_switches),
        cmocka_unit_test(test_truncations_and_mutations),
    };
    struct CMUnitTest bad[NBAD];
    for (size_t i = 0; i < NBAD; i++)
        bad[i] = (struct CMUnitTest){.name = bad_cases[i], .test_func = test_bad_file,
                                     .initial_state = (void *)bad_cases[i]};
    int failed = cmocka_run_group_tests_name("spec", tests, NULL, NULL);
    failed += _cmocka_run_group_tests("spec_errors", bad, NBAD, NULL, NULL);
    return failed ? 1 : 0;
}
