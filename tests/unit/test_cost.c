/* Unit tests of the cost model (runtime/model, docs/cost-model.md). Specs are
 * built by hand so these tests do not depend on the spec loader. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "emu/geometry.h"
#include "nereus/cost.h"

#define GIB 1073741824.0

static void llama3_8b(nrs_model_t *m)
{
    memset(m, 0, sizeof(*m));
    m->present = true;
    m->layers = 32;
    m->hidden = 4096;
    m->ffn = 14336;
    m->heads = 32;
    m->kv_heads = 8;
    m->vocab = 128256;
    m->dtype = NRS_DTYPE_BF16;
}

static void llama3_70b(nrs_model_t *m)
{
    llama3_8b(m);
    m->layers = 80;
    m->hidden = 8192;
    m->ffn = 28672;
    m->heads = 64;
}

/* Llama-3-8B PPO on 4 nodes of 8 H100. */
static void ppo_8b_h100(nrs_spec_t *s)
{
    memset(s, 0, sizeof(*s));
    nrs_cluster_t *c = &s->cluster;
    c->gpu_mem_gib = 80;
    c->peak_tflops = 989;
    c->hbm_gbps = 3350;
    c->gpus_per_node = 8;
    c->nodes = 4;
    c->intra_gbps = 450;
    c->inter_gbps = 50;
    c->host_gbps = 25;
    c->efficiency = 0.5;
    for (int r = 0; r < NRS_ROLE_COUNT; r++)
        llama3_8b(&s->models[r]);
    s->models[NRS_ROLE_CRITIC].value_head = true;
    s->models[NRS_ROLE_REWARD].value_head = true;
    s->algorithm.name = NRS_ALGO_PPO;
    s->runtime.mem_headroom_gib = 2;
    s->runtime.zero1 = true;
    s->runtime.recompute = false;
    s->workload.global_batch = 256;
    s->workload.samples_per_prompt = 1;
    s->workload.prompt_len = 1024;
    s->workload.response_len = 1024;
    s->workload.max_response_len = 1024;
    s->workload.micro_batch_max = 64;
    s->workload.ppo_epochs = 1;
}

static nrs_work_t work_of(const nrs_spec_t *s)
{
    nrs_work_t w;
    nrs_work_from_spec(s, &w);
    return w;
}

static nrs_layout_t lay(int tp, int pp, int dp, int mb)
{
    nrs_layout_t l = {tp, pp, dp, mb};
    return l;
}

/* Hand count of Llama-3-8B (see docs/cost-model.md §2). */
#define P8_EMB (128256.0 * 4096)                                 /* 525,336,576 */
#define P8_LAYER_MM (2.0 * 4096 * 4096 + 2.0 * 4096 * 1024 + 3.0 * 4096 * 14336)
#define P8_LAYER (P8_LAYER_MM + 2 * 4096)                          /* 218,112,000 */
#define P8 (2 * P8_EMB + 32 * P8_LAYER + 4096)                     /* 8,030,261,248 */

/* ---- parameters ------------------------------------------------------------ */

static void test_params_llama3(void **state)
{
    nrs_model_t m;
    llama3_8b(&m);
    double p = nrs_cost_params(&m);
    assert_true(fabs(p - 8.03e9) / 8.03e9 < 0.01);
    assert_true(p == P8);
    assert_true(p == 8030261248.0);

    llama3_70b(&m);
    p = nrs_cost_params(&m);
    assert_true(fabs(p - 70.6e9) / 70.6e9 < 0.01);
}

static void test_params_heads(void **state)
{
    nrs_model_t m;
    llama3_8b(&m);
    m.value_head = true; /* hidden -> 1 instead of the lm head */
    assert_true(nrs_cost_params(&m) == P8 - P8_EMB + 4096);
    m.value_head = false;
    m.tied_embeddings = true; /* head is the embedding */
    assert_true(nrs_cost_params(&m) == P8 - P8_EMB);
}

static void test_dtype_capacity_work_calib(void **state)
{
    nrs_spec_t s;
    ppo_8b_h100(&s);
    assert_int_equal(nrs_dtype_bytes(NRS_DTYPE_BF16), 2);
    assert_int_equal(nrs_dtype_bytes(NRS_DTYPE_FP16), 2);
    assert_int_equal(nrs_dtype_bytes(NRS_DTYPE_FP32), 4);
    assert_true(nrs_cost_capacity_bytes(&s) == 78.0 * GIB);

    s.workload.samples_per_prompt = 4;
    nrs_work_t w = work_of(&s);
    assert_int_equal(w.samples, 1024);
    assert_true(w.prompt_len == 1024 && w.response_len == 1024);

    nrs_calib_t c;
    memset(&c, 0, sizeof(c));
    nrs_calib_init(&c);
    for (int i = 0; i < NRS_MS_COUNT; i++)
        assert_true(c.stage[i] == 1.0);
    assert_true(c.sync == 1.0);
}

/* ---- memory ------------------------------------------------------------------ */

static void test_persist_hand_worked(void **state)
{
    nrs_spec_t s;
    ppo_8b_h100(&s);
    nrs_layout_t l = lay(1, 1, 1, 1);

    /* Mixed-precision Adam, no sharding: 2 weights + 2 grads + 12 optimizer. */
    s.runtime.zero1 = false;
    assert_true(nrs_cost_persist_bytes(&s, NRS_ROLE_ACTOR, &l) == 16.0 * P8);
    /* Inference-only models hold weights only. */
    assert_true(nrs_cost_persist_bytes(&s, NRS_ROLE_REF, &l) == 2.0 * P8);

    /* tp=2, pp=2, dp=4, ZeRO-1. The last stage is the heavier one: 16 layers +
     * lm head (vocab x hidden) + final norm versus 16 layers + embedding. Tensor
     * parallelism splits matmuls and the vocab-parallel head; norms stay whole. */
    s.runtime.zero1 = true;
    l = lay(2, 2, 4, 1);
    double sharded = 16 * P8_LAYER_MM + P8_EMB; /* head = vocab x hidden */
    double replicated = 16 * 2 * 4096 + 4096;   /* 2 RMSNorm per layer + final */
    double p_gpu = sharded / 2 + replicated;    /* = 2,007,633,920 params */
    assert_true(p_gpu == 2007633920.0);
    double expect = p_gpu * 2 /* bf16 weights */ + p_gpu * 2 /* bf16 grads */ +
                    p_gpu * 12 / 4 /* master+m+v over dp */;
    assert_true(nrs_cost_persist_bytes(&s, NRS_ROLE_ACTOR, &l) == expect);

    /* Absent model: nothing; invalid layout: never fits. */
    s.models[NRS_ROLE_CRITIC].present = false;
    assert_true(nrs_cost_persist_bytes(&s, NRS_ROLE_CRITIC, &l) == 0);
    l = lay(3, 1, 1, 1);
    assert_true(isinf(nrs_cost_persist_bytes(&s, NRS_ROLE_ACTOR, &l)));
}

static void test_persist_monotone(void **state)
{
    nrs_spec_t s;
    ppo_8b_h100(&s);
    static const int tps[] = {1, 2, 4, 8, 16, 32};
    static const int pps[] = {1, 2, 4, 8, 16, 32};

    for (int r = 0; r < NRS_ROLE_COUNT; r++)
        for (int a = 0; a < 6; a++)
            for (int b = 0; b < 6; b++)
                for (int c = 0; c < 6; c++)
                    for (int d = 0; d < 6; d++) {
                        nrs_layout_t x = lay(tps[a], pps[b], 2, 1), y = lay(tps[c], pps[d], 2, 1);
                        /* y splits x further (tp and pp each a multiple). Across
                         * directions tp*pp alone does not order memory: the
                         * head stays whole on the last stage however large pp
                         * is (tp=1,pp=32 holds more than tp=2,pp=8). */
                        if ((y.tp % x.tp) || (y.pp % x.pp) || (x.tp == y.tp && x.pp == y.pp))
                            continue;
                        double bx = nrs_cost_persist_bytes(&s, r, &x);
                        double by = nrs_cost_persist_bytes(&s, r, &y);
                        assert_true(isfinite(bx) && isfinite(by));
                        assert_true(by <= bx);
                    }
    /* More dp shards the optimizer state (ZeRO-1): never more memory. */
    for (int dp = 1; dp < 64; dp++) {
        nrs_layout_t x = lay(2, 1, dp, 1), y = lay(2, 1, dp + 1, 1);
        assert_true(nrs_cost_persist_bytes(&s, NRS_ROLE_ACTOR, &y) <=
                    nrs_cost_persist_bytes(&s, NRS_ROLE_ACTOR, &x));
    }
}

static void test_gen_weights_and_kv(void **state)
{
    nrs_spec_t s;
    ppo_8b_h100(&s);
    nrs_layout_t l = lay(1, 1, 32, 64);
    double wb = nrs_cost_gen_weight_bytes(&s, &l);
    assert_true(wb == 2.0 * P8);
    assert_true(fabs(wb - 16.06e9) < 0.01e9);

    const nrs_model_t *m = &s.models[NRS_ROLE_ACTOR];
    assert_true(nrs_cost_kv_token_bytes(m, 1, 1) == 131072.0); /* 2*32*8*128*2 */
    assert_true(nrs_cost_kv_token_bytes(m, 2, 1) == 65536.0);
    assert_true(nrs_cost_kv_token_bytes(m, 8, 1) == 16384.0);
    /* tp = 16 > 8 kv heads: each rank keeps one replicated kv head. */
    assert_true(nrs_cost_kv_token_bytes(m, 16, 1) == 16384.0);
    assert_true(nrs_cost_kv_token_bytes(m, 1, 4) == 131072.0 / 4);
    assert_true(nrs_cost_kv_token_bytes(m, 3, 1) < 0);
}

/* Qwen2.5-3B-like: 2 kv heads, so tp = 4 or 8 replicates whole kv heads. */
static void qwen25_3b(nrs_model_t *m)
{
    memset(m, 0, sizeof(*m));
    m->present = true;
    m->layers = 36;
    m->hidden = 2048;
    m->ffn = 11008;
    m->heads = 16;
    m->kv_heads = 2;
    m->vocab = 151936;
    m->tied_embeddings = true;
    m->dtype = NRS_DTYPE_BF16;
}

/* Elements the most loaded rank of a (tp, pp) layout holds, as the EMU
 * geometry lays them out (runtime/emu/geometry.c, the ground truth). */
static double geometry_max_elems(const nrs_model_t *m, int tp, int pp)
{
    nrs_emu_tbox_t bx[64];
    double most = 0;
    assert_true(nrs_emu_rank_boxes_max(m, pp) <= 64);
    for (int p = 0; p < pp; p++)
        for (int t = 0; t < tp; t++) {
            int nb = nrs_emu_rank_boxes(m, tp, pp, p, t, bx, 64);
            double e = 0;
            for (int i = 0; i < nb; i++)
                e += (double)nrs_emu_rect_area(&bx[i].box);
            if (e > most)
                most = e;
        }
    return most;
}

/* The memory model must never count less than a rank really allocates, or a
 * plan at the cap passes the planner and is refused at transition time. With
 * tp > kv heads each rank holds a whole replicated kv head of k and v. */
static void test_persist_covers_geometry(void **state)
{
    nrs_spec_t s;
    ppo_8b_h100(&s);
    s.runtime.zero1 = false;
    static const int tps[] = {1, 2, 4, 8, 16}, pps[] = {1, 2, 3, 4};
    for (int k = 0; k < 3; k++) {
        nrs_model_t *m = &s.models[NRS_ROLE_ACTOR];
        if (k == 0) {
            qwen25_3b(m);
        } else {
            llama3_8b(m);
            if (k == 2) { /* ffn and vocab that tp does not divide: balanced rows */
                m->ffn = 14337;
                m->vocab = 50257;
            }
        }
        for (size_t a = 0; a < sizeof(tps) / sizeof(tps[0]); a++)
            for (size_t b = 0; b < sizeof(pps) / sizeof(pps[0]); b++) {
                nrs_layout_t l = lay(tps[a], pps[b], 1, 1);
                if (m->heads % l.tp)
                    continue;
                double g = geometry_max_elems(m, l.tp, l.pp);
                /* weights 2 + grads 2 + fp32 master, m, v 12 bytes an element */
                assert_true(nrs_cost_gen_weight_bytes(&s, &l) >= 2.0 * g);
                assert_true(nrs_cost_persist_bytes(&s, NRS_ROLE_ACTOR, &l) >= 16.0 * g);
            }
    }
    /* Qwen at tp = 4, pp = 1: every layer's k and v hold one 128-wide head of
     * 2048 inputs on each rank (2 kv heads spread over 4 ranks would be half). */
    qwen25_3b(&s.models[NRS_ROLE_ACTOR]);
    nrs_layout_t l = lay(4, 1, 1, 1);
    double want = 151936.0 * 2048 / 4 +
                  36.0 * ((2.0 * 2048 * 2048 + 3.0 * 2048 * 11008) / 4 + 2.0 * 2048 * 128 +
                          2.0 * 2048) +
                  2048;
    assert_true(geometry_max_elems(&s.models[NRS_ROLE_ACTOR], 4, 1) == want);
    assert_true(nrs_cost_gen_weight_bytes(&s, &l) == 2.0 * want);
}

/* The same under ZeRO: a rank's flat buffer of N elements split over dp
 * replicas gives the largest shard ceil(N/dp) elements (docs/transitions.md,
 * "ZeRO-1"), 1 to dp-1 more than N/dp when dp does not divide N (8B: N mod 3 =
 * 1). The memory model must count that shard, not N/dp, or a plan at the cap
 * is refused at transition time by a few bytes. */
static void test_persist_covers_zero_shards(void **state)
{
    nrs_spec_t s;
    char err[256];
    (void)state;
    ppo_8b_h100(&s);
    for (int z = 0; z < 4; z++) {
        s.runtime.zero1 = z & 1;
        s.runtime.zero3 = z >> 1;
        for (int dp = 2; dp <= 7; dp++) {
            nrs_plan_t p = {.total_gpus = dp, .npools = 1, .pools = {{0, dp}}};
            nrs_emu_state_t st;
            for (int ms = 0; ms < NRS_MS_COUNT; ms++) {
                p.has[ms] = nrs_spec_has_ms(&s, (nrs_ms_t)ms);
                p.layout[ms] = lay(1, 1, dp, 1);
            }
            if (nrs_emu_state_build(&s, &p, NRS_EMU_SEL_PERSISTENT, NULL, 0, &st, err,
                                    sizeof(err)))
                fail_msg("%s", err);
            double per[8][NRS_ROLE_COUNT] = {{0}};
            for (size_t i = 0; i < st.nbuf; i++)
                per[st.buf[i].gpu][st.buf[i].role] += (double)st.buf[i].bytes;
            nrs_emu_state_free(&st);
            for (int r = 0; r < NRS_ROLE_COUNT; r++) {
                double most = 0, want = nrs_cost_persist_bytes(&s, (nrs_role_t)r, &p.layout[0]);
                for (int g = 0; g < dp; g++)
                    most = fmax(most, per[g][r]);
                if (most > want)
                    fail_msg("zero1 %d zero3 %d dp %d role %d: a GPU holds %.0f bytes, the "
                             "memory model counts %.0f",
                             s.runtime.zero1, s.runtime.zero3, dp, r, most, want);
            }
        }
    }
}

/* ---- stage time: validity ------------------------------------------------------ */

static int stage(const nrs_spec_t *s, nrs_ms_t ms, nrs_layout_t l, const nrs_work_t *w,
                 nrs_stage_cost_t *o)
{
    return nrs_cost_stage(s, ms, &l, w, NULL, o);
}

/* With tp > kv heads every rank computes the k and v projections of its own
 * (replicated) kv head: the tp ranks together do tp/kv times the k, v FLOPs. */
static void test_replicated_kv_flops(void **state)
{
    nrs_spec_t s;
    ppo_8b_h100(&s);
    qwen25_3b(&s.models[NRS_ROLE_ACTOR]);
    nrs_work_t w = work_of(&s);
    nrs_stage_cost_t c2, c4;
    assert_int_equal(stage(&s, NRS_MS_ACTOR_INFER, lay(2, 1, 4, 4), &w, &c2), 0);
    assert_int_equal(stage(&s, NRS_MS_ACTOR_INFER, lay(4, 1, 4, 4), &w, &c4), 0);
    double seq = 2048, kv_layer = 2.0 * 2048 * 256; /* k and v of both kv heads */
    double mm = nrs_cost_params(&s.models[NRS_ROLE_ACTOR]); /* tied: the embedding is the head */
    double att = 4.0 * 36 * 2048 * seq * seq;
    double f_gpu = 989e12 * 0.5, seqs = 256.0 / 4;
    assert_true(fabs(c2.compute_s - seqs * (2.0 * mm * seq + att) / (2 * f_gpu)) <=
                1e-9 * c2.compute_s);
    /* tp = 4 over 2 kv heads: each kv head computed twice. */
    assert_true(fabs(c4.compute_s - seqs * (2.0 * (mm + 36 * kv_layer) * seq + att) / (4 * f_gpu)) <=
                1e-9 * c4.compute_s);
}

static void test_stage_invalid(void **state)
{
    nrs_spec_t s;
    ppo_8b_h100(&s);
    nrs_work_t w = work_of(&s);
    nrs_stage_cost_t o;

    for (int ms = 0; ms < NRS_MS_COUNT; ms++) {
        assert_int_equal(stage(&s, ms, lay(0, 1, 1, 1), &w, &o), -1);
        assert_int_equal(stage(&s, ms, lay(1, 0, 1, 1), &w, &o), -1);
        assert_int_equal(stage(&s, ms, lay(1, 1, 0, 1), &w, &o), -1);
        assert_int_equal(stage(&s, ms, lay(1, 1, 1, 0), &w, &o), -1);
        assert_int_equal(stage(&s, ms, lay(3, 1, 1, 1), &w, &o), -1);  /* heads % 3 */
        assert_int_equal(stage(&s, ms, lay(64, 1, 1, 1), &w, &o), -1); /* heads % 64 */
        assert_int_equal(stage(&s, ms, lay(1, 33, 1, 1), &w, &o), -1); /* pp > layers */
        assert_int_equal(stage(&s, ms, lay(16, 1, 2, 1), &w, &o), 0);  /* kv replicated */
        assert_int_equal(stage(&s, ms, lay(1, 32, 1, 1), &w, &o), 0);
    }
    /* mb larger than a replica's share (256/32 = 8): invalid for train and infer,
     * capped for generate. */
    assert_int_equal(stage(&s, NRS_MS_ACTOR_TRAIN, lay(1, 1, 32, 9), &w, &o), -1);
    assert_int_equal(stage(&s, NRS_MS_REF_INFER, lay(1, 1, 32, 9), &w, &o), -1);
    assert_int_equal(stage(&s, NRS_MS_ACTOR_TRAIN, lay(1, 1, 32, 8), &w, &o), 0);
    nrs_stage_cost_t g8, g64;
    assert_int_equal(stage(&s, NRS_MS_ACTOR_GENERATE, lay(1, 1, 32, 8), &w, &g8), 0);
    assert_int_equal(stage(&s, NRS_MS_ACTOR_GENERATE, lay(1, 1, 32, 64), &w, &g64), 0);
    assert_memory_equal(&g8, &g64, sizeof(g8));

    /* kv heads neither divisible by tp nor dividing it. */
    s.models[NRS_ROLE_ACTOR].heads = 24;
    s.models[NRS_ROLE_ACTOR].hidden = 3072;
    s.models[NRS_ROLE_ACTOR].kv_heads = 6;
    assert_int_equal(stage(&s, NRS_MS_ACTOR_TRAIN, lay(4, 1, 1, 1), &w, &o), -1);
    assert_int_equal(stage(&s, NRS_MS_ACTOR_TRAIN, lay(6, 1, 1, 1), &w, &o), 0);
    assert_int_equal(stage(&s, NRS_MS_ACTOR_TRAIN, lay(12, 1, 1, 1), &w, &o), 0);

    /* Absent model, bad work, bad cluster. */
    s.models[NRS_ROLE_CRITIC].present = false;
    assert_int_equal(stage(&s, NRS_MS_CRITIC_TRAIN, lay(1, 1, 1, 1), &w, &o), -1);
    nrs_work_t bad = w;
    bad.samples = 0;
    assert_int_equal(stage(&s, NRS_MS_REF_INFER, lay(1, 1, 1, 1), &bad, &o), -1);
    bad = w;
    bad.response_len = NAN;
    assert_int_equal(stage(&s, NRS_MS_REF_INFER, lay(1, 1, 1, 1), &bad, &o), -1);
    s.cluster.hbm_gbps = 0;
    assert_int_equal(stage(&s, NRS_MS_REF_INFER, lay(1, 1, 1, 1), &w, &o), -1);
    assert_int_equal(nrs_cost_stage(&s, NRS_MS_COUNT, &(nrs_layout_t){1, 1, 1, 1}, &w, NULL, &o),
                     -1);
}

/* ---- stage time: properties ------------------------------------------------------ */

/* Every power-of-two (tp, pp) on 32 GPUs; dp = 32 / (tp * pp). */
#define FOR_TP_PP(tp, pp)                                                                   \
    for (int tp = 1; tp <= 32; tp *= 2)                                                    \
        for (int pp = 1; pp * tp <= 32; pp *= 2)

/* Epochs times micro-batches (or sequences) must not be int arithmetic: with
 * 2^24 sequences on one replica at mb = 1 and 256 epochs the product is 2^32,
 * which wrapped to 0 and priced the whole training stage at zero compute. */
static void test_train_epochs_no_int_overflow(void **state)
{
    nrs_spec_t s;
    ppo_8b_h100(&s);
    s.workload.global_batch = 1 << 24;
    s.workload.prompt_len = 16;
    s.workload.response_len = 16;
    s.runtime.zero3 = true; /* its per-micro-batch terms divide by epochs * micro-batches */
    nrs_work_t w = work_of(&s);
    nrs_stage_cost_t one, many;
    nrs_layout_t l = lay(8, 4, 1, 1);
    s.workload.ppo_epochs = 1;
    assert_int_equal(stage(&s, NRS_MS_ACTOR_TRAIN, l, &w, &one), 0);
    s.workload.ppo_epochs = 256;
    assert_int_equal(stage(&s, NRS_MS_ACTOR_TRAIN, l, &w, &many), 0);
    assert_true(isfinite(many.time_s) && isfinite(many.comm_s));
    assert_true(fabs(many.compute_s - 256 * one.compute_s) <= 1e-9 * many.compute_s);
    assert_true(fabs(many.comm_s - 256 * one.comm_s) <= 1e-9 * many.comm_s);
    assert_true(fabs(many.time_s - 256 * one.time_s) <= 1e-9 * many.time_s);
}

static void test_stage_finite_positive(void **state)
{
    nrs_spec_t s;
    ppo_8b_h100(&s);
    s.runtime.recompute = true; /* the other half is below */
    for (int rc = 0; rc < 2; rc++, s.runtime.recompute = false) {
        nrs_work_t w = work_of(&s);
        for (int ms = 0; ms < NRS_MS_COUNT; ms++)
            FOR_TP_PP(tp, pp)
            for (int mb = 1, dp = 32 / (tp * pp); mb <= 64; mb *= 2) {
                nrs_stage_cost_t o;
                int rcode = stage(&s, ms, lay(tp, pp, dp, mb), &w, &o);
                if (mb > 256 / dp && ms != NRS_MS_ACTOR_GENERATE) {
                    assert_int_equal(rcode, -1);
                    continue;
                }
                assert_int_equal(rcode, 0);
                assert_true(isfinite(o.time_s) && o.time_s > 0);
                assert_true(isfinite(o.trans_bytes) && o.trans_bytes > 0);
                assert_true(o.compute_s > 0 && o.memory_s >= 0 && o.comm_s >= 0 &&
                            o.bubble_s >= 0);
                assert_true(fabs(o.time_s - (o.compute_s + o.memory_s + o.comm_s + o.bubble_s)) <=
                            1e-12 * o.time_s);
                if (pp == 1)
                    assert_true(o.bubble_s == 0);
                if (tp == 1 && pp == 1 && dp == 1)
                    assert_true(o.comm_s == 0);
            }
    }
}

static void test_stage_mb_monotone_memory(void **state)
{
    nrs_spec_t s;
    ppo_8b_h100(&s);
    for (int rc = 0; rc < 2; rc++) {
        s.runtime.recompute = rc;
        nrs_work_t w = work_of(&s);
        for (int ms = 0; ms < NRS_MS_COUNT; ms++)
            FOR_TP_PP(tp, pp)
            {
                int dp = 32 / (tp * pp);
                double prev = 0;
                int cap = ms == NRS_MS_ACTOR_GENERATE ? 300 : (256 + dp - 1) / dp;
                for (int mb = 1; mb <= cap; mb++) {
                    nrs_stage_cost_t o;
                    assert_int_equal(stage(&s, ms, lay(tp, pp, dp, mb), &w, &o), 0);
                    assert_true(o.trans_bytes >= prev);
                    prev = o.trans_bytes;
                }
            }
    }
}

static void test_train_dp_monotone(void **state)
{
    nrs_spec_t s;
    ppo_8b_h100(&s);
    nrs_work_t w = work_of(&s);
    for (int ms = NRS_MS_ACTOR_TRAIN; ms <= NRS_MS_CRITIC_TRAIN; ms++)
        for (int tp = 1; tp <= 8; tp *= 2)
            for (int pp = 1; pp <= 4; pp *= 2) {
                double prev = INFINITY;
                for (int dp = 1; dp <= 256; dp++) {
                    nrs_stage_cost_t o;
                    assert_int_equal(stage(&s, ms, lay(tp, pp, dp, 1), &w, &o), 0);
                    assert_true(o.compute_s <= prev);
                    prev = o.compute_s;
                }
            }
}

static void test_response_monotone(void **state)
{
    nrs_spec_t s;
    ppo_8b_h100(&s);
    nrs_work_t w = work_of(&s);
    for (int ms = 0; ms < NRS_MS_COUNT; ms++)
        FOR_TP_PP(tp, pp)
        for (int mb = 1, dp = 32 / (tp * pp); mb <= 8; mb *= 2) {
            double prev = 0, prev_mem = 0;
            for (double r = 0; r <= 8192; r += 512) {
                nrs_work_t wr = w;
                wr.response_len = r;
                nrs_stage_cost_t o;
                assert_int_equal(stage(&s, ms, lay(tp, pp, dp, mb), &wr, &o), 0);
                assert_true(o.time_s >= prev);
                assert_true(o.trans_bytes >= prev_mem);
                prev = o.time_s;
                prev_mem = o.trans_bytes;
            }
        }
}

static void test_stage_pure_and_calibrated(void **state)
{
    nrs_spec_t s;
    ppo_8b_h100(&s);
    nrs_work_t w = work_of(&s);
    nrs_calib_t c;
    nrs_calib_init(&c);
    for (int ms = 0; ms < NRS_MS_COUNT; ms++) {
        nrs_layout_t l = lay(2, 2, 8, 4);
        nrs_stage_cost_t a, b, k;
        nrs_spec_t copy = s;
        assert_int_equal(nrs_cost_stage(&s, ms, &l, &w, NULL, &a), 0);
        assert_int_equal(nrs_cost_stage(&s, ms, &l, &w, &c, &b), 0);
        assert_memory_equal(&a, &b, sizeof(a));
        assert_memory_equal(&s, &copy, sizeof(s));
        c.stage[ms] = 1.5;
        assert_int_equal(nrs_cost_stage(&s, ms, &l, &w, &c, &k), 0);
        assert_true(fabs(k.time_s - 1.5 * a.time_s) <= 1e-12 * k.time_s);
        assert_true(k.compute_s == a.compute_s && k.trans_bytes == a.trans_bytes);
    }
}

/* ---- stage time: hand-worked ------------------------------------------------------ */

static void test_train_hand_worked(void **state)
{
    nrs_spec_t s;
    ppo_8b_h100(&s);
    nrs_work_t w = work_of(&s);
    nrs_stage_cost_t o, r;

    /* One GPU, all 256 sequences of 2048 tokens. FLOPs = 6 * matmul params
     * (all but the embedding lookup) * tokens + 12 * layers * hidden * seq^2. */
    assert_int_equal(stage(&s, NRS_MS_ACTOR_TRAIN, lay(1, 1, 1, 4), &w, &o), 0);
    double mm = P8 - P8_EMB, seq = 2048;
    double flops = 256 * (6 * mm * seq + 12.0 * 32 * 4096 * seq * seq);
    assert_true(fabs(o.compute_s - flops / (989e12 * 0.5)) <= 1e-9 * o.compute_s);
    assert_true(o.comm_s == 0 && o.bubble_s == 0);
    /* Adam step: 28 bytes touched per parameter over HBM. */
    assert_true(fabs(o.memory_s - P8 * 28 / 3350e9) <= 1e-9 * o.memory_s);

    /* Recompute: x 4/3 FLOPs, and less transient memory. */
    s.runtime.recompute = true;
    assert_int_equal(stage(&s, NRS_MS_ACTOR_TRAIN, lay(1, 1, 1, 4), &w, &r), 0);
    assert_true(fabs(r.compute_s - o.compute_s * 4 / 3) <= 1e-9 * r.compute_s);
    assert_true(r.trans_bytes < o.trans_bytes);

    /* Bubble fraction (pp-1)/(m+pp-1) of the pipelined time: tp=1, pp=4, dp=1,
     * mb=4 gives m = 64 micro-batches. */
    s.runtime.recompute = false;
    assert_int_equal(stage(&s, NRS_MS_ACTOR_TRAIN, lay(1, 4, 1, 4), &w, &o), 0);
    double pipe = o.compute_s + o.bubble_s; /* p2p is the rest of comm */
    assert_true(o.bubble_s / (pipe + o.comm_s) < 3.0 / 64 + 1e-9);
    assert_true(o.bubble_s > 0);

    /* Transient with pp=1: one micro-batch of stored activations of all layers
     * (8h + 4q + 8ffn + 4kv bytes per token per layer, docs §3.3) + fp32 logits
     * and their gradient. */
    assert_int_equal(stage(&s, NRS_MS_ACTOR_TRAIN, lay(1, 1, 1, 4), &w, &o), 0);
    double act = 8.0 * 4096 + 4.0 * 4096 + 8.0 * 14336 + 4.0 * 8 * 128;
    double expect = 4 * seq * 32 * act + 2.0 * 4 * seq * 128256 * 4;
    assert_true(o.trans_bytes == expect);
}

static void test_generate_hand_worked(void **state)
{
    nrs_spec_t s;
    ppo_8b_h100(&s);
    nrs_work_t w = work_of(&s);
    nrs_stage_cost_t o;

    /* tp=1, dp=32: 8 sequences per replica, one round. */
    assert_int_equal(stage(&s, NRS_MS_ACTOR_GENERATE, lay(1, 1, 32, 8), &w, &o), 0);
    double kv = 8 * 2048 * 131072.0;
    assert_true(o.trans_bytes > kv && o.trans_bytes < kv + 2 * GIB);
    /* Decode is memory-bound: at least response_len reads of the matmul weights. */
    double w_read = 2.0 * (P8 - P8_EMB);
    assert_true(o.memory_s >= 1024 * w_read / 3350e9);
    assert_true(o.memory_s > o.compute_s);
    assert_true(o.comm_s == 0 && o.bubble_s == 0);

    /* tp=2 splits weights and KV: decode is faster, but not 2x (all-reduce latency). */
    nrs_stage_cost_t t2;
    assert_int_equal(stage(&s, NRS_MS_ACTOR_GENERATE, lay(2, 1, 16, 16), &w, &t2), 0);
    assert_true(t2.comm_s > 0);

    /* pp with fewer sequences than stages leaves a bubble. */
    nrs_work_t one = w;
    one.samples = 1;
    assert_int_equal(stage(&s, NRS_MS_ACTOR_GENERATE, lay(1, 4, 1, 1), &one, &o), 0);
    assert_true(o.bubble_s > 2.0 * (o.compute_s + o.memory_s));
}

/* ---- sync ---------------------------------------------------------------------- */

static void test_sync(void **state)
{
    nrs_spec_t s;
    ppo_8b_h100(&s);
    nrs_layout_t t = lay(2, 1, 16, 4), g_same = lay(2, 1, 16, 16), g1 = lay(1, 1, 32, 8);
    nrs_calib_t c;
    nrs_calib_init(&c);

    assert_true(nrs_cost_sync_s(&s, &t, &g_same, 1, NULL) == 0);
    double same = nrs_cost_sync_s(&s, &t, &g1, 1, NULL);
    /* Each GPU gathers the full 16 GB model over NVLink. */
    assert_true(same >= 2.0 * P8 / 450e9 && isfinite(same));
    double cross = nrs_cost_sync_s(&s, &t, &g1, 0, NULL);
    assert_true(cross > 2.0 * P8 / (32 * 50e9));
    /* Across pools even identical sharding must move the weights. */
    assert_true(nrs_cost_sync_s(&s, &t, &g_same, 0, NULL) > 0);
    c.sync = 2;
    assert_true(fabs(nrs_cost_sync_s(&s, &t, &g1, 0, &c) - 2 * cross) <= 1e-12);
    nrs_layout_t bad = lay(3, 1, 1, 1);
    assert_true(isinf(nrs_cost_sync_s(&s, &t, &bad, 0, NULL)));
}

/* ---- optional runtime switches: zero3, offload_optimizer, weight_sync -------- */

/* ZeRO-3 splits weights and gradients over dp as well, for every DeepSpeed
 * model; offloading removes the 12 optimizer bytes from the GPU. */
static void test_zero3_offload_memory(void **state)
{
    nrs_spec_t s;
    ppo_8b_h100(&s);
    nrs_layout_t l = lay(1, 1, 4, 1);
    s.runtime.zero3 = true;
    assert_true(nrs_cost_persist_bytes(&s, NRS_ROLE_ACTOR, &l) == (2.0 + 2.0 + 12.0) * P8 / 4);
    assert_true(nrs_cost_persist_bytes(&s, NRS_ROLE_REF, &l) == 2.0 * P8 / 4);
    s.runtime.offload_optimizer = true;
    assert_true(nrs_cost_persist_bytes(&s, NRS_ROLE_ACTOR, &l) == (2.0 + 2.0) * P8 / 4);
    /* Offload without ZeRO-3: weights and grads whole, nothing for Adam. */
    s.runtime.zero3 = false;
    assert_true(nrs_cost_persist_bytes(&s, NRS_ROLE_ACTOR, &l) == 4.0 * P8);
    /* ZeRO-3 without ZeRO-1 still shards the optimizer state. */
    s.runtime.offload_optimizer = false;
    s.runtime.zero3 = true;
    s.runtime.zero1 = false;
    assert_true(nrs_cost_persist_bytes(&s, NRS_ROLE_ACTOR, &l) == 16.0 * P8 / 4);
    /* dp = 1: nothing to shard over. */
    l = lay(1, 1, 1, 1);
    assert_true(nrs_cost_persist_bytes(&s, NRS_ROLE_ACTOR, &l) == 16.0 * P8);
}

static void test_zero3_time(void **state)
{
    nrs_spec_t s;
    ppo_8b_h100(&s);
    nrs_work_t w = work_of(&s);
    nrs_stage_cost_t o, z;

    /* dp = 4 inside a node, mb = 4: 64 sequences a replica, 16 micro-batches.
     * Per micro-batch two parameter all-gathers (hidden behind the compute)
     * and one gradient reduce-scatter; each is 32 collectives of 10 us plus
     * (dp-1)/dp of the 2P weight bytes over NVLink. The step's gradient
     * all-reduce is gone. */
    assert_int_equal(stage(&s, NRS_MS_ACTOR_TRAIN, lay(1, 1, 4, 4), &w, &o), 0);
    assert_true(fabs(o.comm_s - (10e-6 + 2.0 * 3 / 4 * 2 * P8 / 450e9)) <= 1e-12);
    s.runtime.zero3 = true;
    assert_int_equal(stage(&s, NRS_MS_ACTOR_TRAIN, lay(1, 1, 4, 4), &w, &z), 0);
    double coll = 32 * 10e-6 + 3.0 / 4 * 2 * P8 / 450e9; /* 0.02709 s */
    assert_true(2 * coll < z.compute_s / 16);                /* all-gathers hidden */
    assert_true(fabs(z.comm_s - 16 * coll) <= 1e-9 * z.comm_s);
    assert_true(z.comm_s > o.comm_s); /* 1.5x the volume, every micro-batch */
    assert_true(z.compute_s == o.compute_s && z.memory_s < o.memory_s * (1 + 1e-12));
    /* Gathered parameters: two whole layers and the head (+ final norm). */
    double gathered = 2.0 * (2 * P8_LAYER + P8_EMB + 4096);
    assert_true(fabs(z.trans_bytes - o.trans_bytes - gathered) <= 1e-6 * gathered);

    /* dp = 16 spans two nodes: NIC speed and 30 us; mb = 1, 16 micro-batches.
     * The all-gathers now outlast the compute: the excess shows. */
    assert_int_equal(stage(&s, NRS_MS_ACTOR_TRAIN, lay(1, 1, 16, 1), &w, &z), 0);
    coll = 32 * 30e-6 + 15.0 / 16 * 2 * P8 / 50e9; /* 0.30209 s */
    double cmb = z.compute_s / 16;
    assert_true(2 * coll > cmb);
    assert_true(fabs(z.comm_s - 16 * (2 * coll - cmb + coll)) <= 1e-9 * z.comm_s);

    /* Infer: one all-gather per micro-batch's forward, excess over compute. */
    assert_int_equal(stage(&s, NRS_MS_REF_INFER, lay(1, 1, 16, 1), &w, &z), 0);
    cmb = z.compute_s / 16;
    assert_true(fabs(z.comm_s - 16 * fmax(0, coll - cmb)) <= 1e-9 * z.comm_s);
    assert_true(z.comm_s > 0);
    s.runtime.zero3 = false;
    assert_int_equal(stage(&s, NRS_MS_REF_INFER, lay(1, 1, 16, 1), &w, &o), 0);
    assert_true(o.comm_s == 0 && o.compute_s == z.compute_s);
}

static void test_offload_time(void **state)
{
    nrs_spec_t s;
    ppo_8b_h100(&s);
    nrs_work_t w = work_of(&s);
    nrs_stage_cost_t o, f;

    /* ZeRO-1 over dp = 4: this rank owns P/4 of the optimizer. Offloaded, the
     * HBM-bound Adam step becomes CPU Adam at 4.5e9 params/s per host shared by
     * 8 GPUs, plus its gradients down and weights up over 25 GB/s PCIe. */
    assert_int_equal(stage(&s, NRS_MS_ACTOR_TRAIN, lay(1, 1, 4, 4), &w, &o), 0);
    s.runtime.offload_optimizer = true;
    assert_int_equal(stage(&s, NRS_MS_ACTOR_TRAIN, lay(1, 1, 4, 4), &w, &f), 0);
    double po = P8 / 4;
    assert_true(fabs(f.memory_s - po / (4.5e9 / 8)) <= 1e-9 * f.memory_s); /* 3.569 s */
    assert_true(fabs(f.comm_s - o.comm_s - 2 * po * 2 / 25e9) <= 1e-9 * f.comm_s);
    assert_true(f.memory_s > o.memory_s && f.compute_s == o.compute_s);
    assert_true(f.trans_bytes == o.trans_bytes);
    /* Two PPO epochs: two optimizer steps. */
    s.workload.ppo_epochs = 2;
    nrs_stage_cost_t e2;
    assert_int_equal(stage(&s, NRS_MS_ACTOR_TRAIN, lay(1, 1, 4, 4), &w, &e2), 0);
    assert_true(fabs(e2.memory_s - 2 * f.memory_s) <= 1e-9 * e2.memory_s);
    /* No host link to price: invalid; infer does not care. */
    s.cluster.host_gbps = 0;
    assert_int_equal(stage(&s, NRS_MS_ACTOR_TRAIN, lay(1, 1, 4, 4), &w, &f), -1);
    assert_int_equal(stage(&s, NRS_MS_ACTOR_INFER, lay(1, 1, 4, 4), &w, &f), 0);
}

static void test_sync_broadcast(void **state)
{
    nrs_spec_t s;
    ppo_8b_h100(&s);
    double W = 2.0 * P8, tensors = 32 * 9 + 3; /* 291 Hugging Face tensors */
    nrs_layout_t t = lay(1, 1, 2, 1), g = lay(2, 1, 2, 8);
    double reshard = nrs_cost_sync_s(&s, &t, &g, 0, NULL);

    /* OpenRLHF on one node: actor dp = 2 and vLLM 2 x tp 2 share the node. No
     * ZeRO-3: rank 0 holds every tensor; it broadcasts W over NVLink, 10 ms a
     * tensor, plus the fixed 5 ms. */
    s.runtime.weight_sync = NRS_WSYNC_BROADCAST;
    double b = nrs_cost_sync_s(&s, &t, &g, 0, NULL);
    assert_true(fabs(b - (W / 450e9 + tensors * 10e-3 + 5e-3)) <= 1e-12); /* 2.9507 s */
    assert_true(b > reshard);
    /* ZeRO-3: each tensor first all-gathered over the dp = 2 ranks. */
    s.runtime.zero3 = true;
    double bz = nrs_cost_sync_s(&s, &t, &g, 0, NULL);
    assert_true(fabs(bz - b - W / 2 / 450e9) <= 1e-12);
    /* 128 GPUs: actor dp = 32 over 4 nodes, 32 engines on 8 nodes: NIC speed. */
    t = lay(1, 1, 32, 1);
    g = lay(2, 1, 32, 8);
    double big = nrs_cost_sync_s(&s, &t, &g, 0, NULL);
    assert_true(fabs(big - (W * 31 / 32 / 50e9 + W / 50e9 + tensors * 10e-3 + 5e-3)) <= 1e-9);
    /* Calibrated like every sync. */
    nrs_calib_t c;
    nrs_calib_init(&c);
    c.sync = 1.5;
    assert_true(fabs(nrs_cost_sync_s(&s, &t, &g, 0, &c) - 1.5 * big) <= 1e-9);
    /* Broadcast is paid even for identical sharding on one pool. */
    nrs_layout_t same = lay(1, 1, 32, 8);
    assert_true(nrs_cost_sync_s(&s, &t, &same, 1, NULL) > tensors * 10e-3);

    /* Reshard under ZeRO-3, same pool, same tp/pp: generation gathers its dp
     * shards: (dp-1)/dp of its shard over the dp group's links (32 GPUs: NIC). */
    s.runtime.weight_sync = NRS_WSYNC_RESHARD;
    double z = nrs_cost_sync_s(&s, &t, &same, 1, NULL);
    assert_true(fabs(z - (31.0 / 32 * W / 50e9 + 5e-3)) <= 1e-9);
    s.runtime.zero3 = false;
    assert_true(nrs_cost_sync_s(&s, &t, &same, 1, NULL) == 0);
}

/* Predictions the lead sanity-checks against published numbers (printed). */
static void test_print_anchors(void **state)
{
    nrs_spec_t s;
    ppo_8b_h100(&s);
    nrs_work_t w = work_of(&s);
    nrs_stage_cost_t o;
    nrs_layout_t l = lay(2, 1, 16, 4);

    assert_int_equal(nrs_cost_stage(&s, NRS_MS_ACTOR_TRAIN, &l, &w, NULL, &o), 0);
    print_message("actor.train tp2 pp1 dp16 mb4: %.3f s (compute %.3f comm %.3f mem %.3f) "
                  "persist %.2f GiB trans %.2f GiB\n",
                  o.time_s, o.compute_s, o.comm_s, o.memory_s,
                  nrs_cost_persist_bytes(&s, NRS_ROLE_ACTOR, &l) / GIB, o.trans_bytes / GIB);
    l = lay(1, 1, 32, 64);
    assert_int_equal(nrs_cost_stage(&s, NRS_MS_ACTOR_GENERATE, &l, &w, NULL, &o), 0);
    print_message("actor.generate tp1 dp32 mb64 (-> 8): %.3f s (compute %.3f mem %.3f) "
                  "trans %.2f GiB\n",
                  o.time_s, o.compute_s, o.memory_s, o.trans_bytes / GIB);
    l = lay(2, 1, 16, 8);
    assert_int_equal(nrs_cost_stage(&s, NRS_MS_ACTOR_INFER, &l, &w, NULL, &o), 0);
    print_message("actor.infer tp2 dp16 mb8: %.3f s trans %.2f GiB\n", o.time_s,
                  o.trans_bytes / GIB);
    nrs_layout_t g = lay(1, 1, 32, 8);
    l = lay(2, 1, 16, 4);
    print_message("sync tp2->tp1 same pool: %.4f s; cross pool: %.4f s\n",
                  nrs_cost_sync_s(&s, &l, &g, 1, NULL), nrs_cost_sync_s(&s, &l, &g, 0, NULL));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_params_llama3),
        cmocka_unit_test(test_params_heads),
        cmocka_unit_test(test_dtype_capacity_work_calib),
        cmocka_unit_test(test_persist_hand_worked),
        cmocka_unit_test(test_persist_monotone),
        cmocka_unit_test(test_gen_weights_and_kv),
        cmocka_unit_test(test_persist_covers_geometry),
        cmocka_unit_test(test_persist_covers_zero_shards),
        cmocka_unit_test(test_replicated_kv_flops),
        cmocka_unit_test(test_stage_invalid),
        cmocka_unit_test(test_stage_finite_positive),
        cmocka_unit_test(test_train_epochs_no_int_overflow),
        cmocka_unit_test(test_stage_mb_monotone_memory),
        cmocka_unit_test(test_train_dp_monotone),
        cmocka_unit_test(test_response_monotone),
        cmocka_unit_test(test_stage_pure_and_calibrated),
        cmocka_unit_test(test_train_hand_worked),
        cmocka_unit_test(test_generate_hand_worked),
        cmocka_unit_test(test_sync),
        cmocka_unit_test(test_zero3_offload_memory),
        cmocka_unit_test(test_zero3_time),
        cmocka_unit_test(test_offload_time),
        cmocka_unit_test(test_sync_broadcast),
        cmocka_unit_test(test_print_anchors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
