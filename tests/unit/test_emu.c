/* Unit tests of runtime/emu: shard geometry, graph cases, scheduler limits,
 * executor checks. Property tests over random plans: test_emu_prop.c. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "emu/exec.h"
#include "emu/geometry.h"
#include "emu/pattern.h"
#include "emu/testutil.h"
#include "fixtures.h"
#include "nereus/cost.h"

static void test_split_balanced(void **state)
{
    int st, len, total = 0;
    (void)state;
    /* 7 layers over 3 stages: 3, 2, 2 (first stages get the extra) */
    nrs_emu_split(7, 3, 0, &st, &len);
    assert_int_equal(st, 0);
    assert_int_equal(len, 3);
    nrs_emu_split(7, 3, 1, &st, &len);
    assert_int_equal(st, 3);
    assert_int_equal(len, 2);
    nrs_emu_split(7, 3, 2, &st, &len);
    assert_int_equal(st, 5);
    assert_int_equal(len, 2);
    for (int i = 0; i < 5; i++) {
        nrs_emu_split(13, 5, i, &st, &len);
        assert_int_equal(st, total);
        total += len;
    }
    assert_int_equal(total, 13);
}

/* kv rows of tp rank t in layer 0's qkv (the second and third box). */
static void kv_rows(const nrs_model_t *m, int tp, int t, int *k0, int *k1, int *v0)
{
    nrs_emu_tbox_t bx[64];
    int n = nrs_emu_rank_boxes(m, tp, 1, 0, t, bx, 64), seen = 0;
    for (int i = 0; i < n; i++)
        if (bx[i].tensor == NRS_EMU_T_GLOBALS + NRS_EMU_LT_QKV) {
            if (seen == 1) {
                *k0 = bx[i].box.r0;
                *k1 = bx[i].box.r1;
            } else if (seen == 2)
                *v0 = bx[i].box.r0;
            seen++;
        }
    assert_int_equal(seen, 3);
}

static void test_gqa_kv_split_and_replication(void **state)
{
    nrs_model_t m;
    int k0, k1, v0, hd = 2;
    (void)state;
    tu_model(&m, 2, 16, 10, 8, 2, 11); /* head dim 2: q 16 rows, k 4, v 4 */
    /* tp 2 <= kv 2: rank t holds kv head t */
    for (int t = 0; t < 2; t++) {
        kv_rows(&m, 2, t, &k0, &k1, &v0);
        assert_int_equal(k0, 16 + t * hd);
        assert_int_equal(k1, 16 + (t + 1) * hd);
        assert_int_equal(v0, 16 + 4 + t * hd);
    }
    /* tp 8 > kv 2: rank t holds kv head t*kv/tp = t/4, replicated on 4 ranks */
    for (int t = 0; t < 8; t++) {
        kv_rows(&m, 8, t, &k0, &k1, &v0);
        assert_int_equal(k0, 16 + (t / 4) * hd);
        assert_int_equal(k1 - k0, hd);
        assert_int_equal(v0, 16 + 4 + (t / 4) * hd);
    }
    nrs_layout_t bad = {3, 1, 1, 1};
    char err[128];
    assert_int_equal(nrs_emu_layout_check(&m, &bad, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "tp=3"));
    /* grouped-query attention: heads a multiple of kv heads, as the spec
     * loader requires; a model built in code is checked here */
    nrs_model_t g;
    nrs_layout_t one = {1, 1, 1, 1};
    tu_model(&g, 2, 16, 16, 4, 8, 8);
    assert_int_equal(nrs_emu_layout_check(&g, &one, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "heads 4 is not a multiple of kv heads 8"));
    tu_model(&g, 2, 24, 16, 6, 4, 8);
    assert_int_equal(nrs_emu_layout_check(&g, &one, err, sizeof(err)), -1);
    tu_model(&g, 2, 24, 16, 6, 3, 8);
    if (nrs_emu_layout_check(&g, &one, err, sizeof(err)))
        fail_msg("%s", err);
}

/* A layer tensor's stacked coordinate is layers * hidden, an int32: layers
 * 4096 and hidden 2^20 wrapped it to 0 (qkv 3145728 x 0). The geometry
 * refuses such a model as the loader does; at the bound the shapes and a
 * rank's boxes are exact. */
static void test_stacked_coordinates_fit(void **state)
{
    nrs_model_t m;
    nrs_layout_t l = {1, 2, 1, 1};
    nrs_emu_tbox_t bx[32];
    char err[256];
    int rows, cols;
    (void)state;
    tu_model(&m, 4096, 1 << 20, 4096, 8, 8, 1000);
    assert_int_equal(nrs_emu_layout_check(&m, &l, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "layers 4096 * hidden 1048576 exceeds 1073741824"));
    tu_model(&m, 1024, 1 << 20, 4096, 8, 8, 1000); /* exactly NRS_MODEL_MAX_STACKED */
    if (nrs_emu_layout_check(&m, &l, err, sizeof(err)))
        fail_msg("%s", err);
    nrs_emu_tensor_shape(&m, NRS_EMU_T_GLOBALS + NRS_EMU_LT_QKV, &rows, &cols);
    assert_int_equal(rows, 3 << 20);
    assert_int_equal(cols, NRS_MODEL_MAX_STACKED);
    nrs_emu_tensor_shape(&m, NRS_EMU_T_GLOBALS + NRS_EMU_LT_DOWN, &rows, &cols);
    assert_int_equal(rows, NRS_MODEL_MAX_STACKED);
    int n = nrs_emu_rank_boxes(&m, 1, 2, 1, 0, bx, (int)(sizeof(bx) / sizeof(bx[0])));
    int seen = 0;
    for (int i = 0; i < n; i++) {
        int t = bx[i].tensor - NRS_EMU_T_GLOBALS;
        const nrs_emu_rect_t *b = &bx[i].box;
        if (t == NRS_EMU_LT_QKV || t == NRS_EMU_LT_GATE || t == NRS_EMU_LT_UP) {
            assert_int_equal(b->c0, 512 << 20); /* stage 1 of 2: layers [512, 1024) */
            assert_int_equal(b->c1, NRS_MODEL_MAX_STACKED);
            seen++;
        } else if (t == NRS_EMU_LT_O || t == NRS_EMU_LT_DOWN) {
            assert_int_equal(b->r0, 512 << 20);
            assert_int_equal(b->r1, NRS_MODEL_MAX_STACKED);
            seen++;
        }
    }
    assert_int_equal(seen, 3 + 2 + 2); /* q|k|v, gate, up; o, down */
}

/* nrs_emu_checksum is XXH64 (seed 0) in every build: ranks and checkpoints
 * of different builds compare these sums (it once was FNV-1a in builds
 * without libxxhash). Fixed vectors from libxxhash 0.8.1 ("" and "abc" as
 * the xxHash documentation gives them), lengths through every branch
 * (32-byte stripes, 8-, 4- and 1-byte tails). */
static void test_checksum_is_xxh64(void **state)
{
    static const struct {
        size_t n;
        uint64_t h;
    } v[] = {
        {0, 0xef46db3751d8e999ull},   {1, 0xa96c7f0ce858bbb7ull},   {3, 0xbed43740ee6332bbull},
        {4, 0xfa212ae44b3bb23dull},   {5, 0xd339dcc9ac8e6776ull},   {7, 0x2744460dd675d2c0ull},
        {8, 0x994b676b71ce94ddull},   {9, 0x572b84c18b983af8ull},   {12, 0xb92f588ce720786eull},
        {31, 0x6711d55e306b5d8full},  {32, 0x07f7b8e3bc5d6e25ull},  {33, 0x09f85eeb4e1cbe9full},
        {40, 0xd25150177ba46490ull},  {63, 0xb7c9968c066cb6a5ull},  {64, 0x50d4159a0411632eull},
        {100, 0x9ddada11d3dc2d8full}, {1000, 0x0bf0bdbcc82eb373ull}, {4109, 0xb90e0ee5573f05d5ull},
    };
    unsigned char b[4200];
    (void)state;
    for (size_t i = 0; i < sizeof(b); i++)
        b[i] = (unsigned char)(i * 131 + 7);
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++)
        if (nrs_emu_checksum(b, v[i].n) != v[i].h)
            fail_msg("%zu bytes: %016llx, XXH64 is %016llx", v[i].n,
                     (unsigned long long)nrs_emu_checksum(b, v[i].n), (unsigned long long)v[i].h);
    assert_true(nrs_emu_checksum("abc", 3) == 0x44bc2cf5ad770999ull);
}

/* Every element of every tensor is held by the replica's ranks exactly as
 * often as it is replicated: once for split tensors, tp times for norms and a
 * value head, tp/kv times for kv rows when tp > kv heads. */
static void check_cover(const nrs_model_t *m, int tp, int pp)
{
    int nt = nrs_emu_tensor_count(m), maxb = nrs_emu_rank_boxes_max(m, pp);
    nrs_emu_tbox_t *bx = malloc(sizeof(*bx) * (size_t)maxb);
    int **cnt = calloc((size_t)nt, sizeof(int *));
    int hd = m->hidden / m->heads, q = m->heads * hd;
    for (int t = 0; t < nt; t++) {
        int r, c;
        nrs_emu_tensor_shape(m, t, &r, &c);
        cnt[t] = calloc((size_t)(r * c + 1), sizeof(int));
    }
    for (int p = 0; p < pp; p++)
        for (int t = 0; t < tp; t++) {
            int n = nrs_emu_rank_boxes(m, tp, pp, p, t, bx, maxb);
            for (int i = 0; i < n; i++) {
                int r, c;
                nrs_emu_tensor_shape(m, bx[i].tensor, &r, &c);
                for (int y = bx[i].box.r0; y < bx[i].box.r1; y++)
                    for (int x = bx[i].box.c0; x < bx[i].box.c1; x++)
                        cnt[bx[i].tensor][y * c + x]++;
            }
        }
    for (int t = 0; t < nt; t++) {
        int r, c, lt = (t - NRS_EMU_T_GLOBALS) % NRS_EMU_LT_COUNT;
        nrs_emu_tensor_shape(m, t, &r, &c);
        for (int y = 0; y < r; y++) {
            int want = 1;
            if (t == NRS_EMU_T_FINAL_NORM || (t == NRS_EMU_T_HEAD && m->value_head) ||
                (t >= NRS_EMU_T_GLOBALS && (lt == NRS_EMU_LT_NORM1 || lt == NRS_EMU_LT_NORM2)))
                want = tp;
            if (t >= NRS_EMU_T_GLOBALS && lt == NRS_EMU_LT_QKV && y >= q && tp > m->kv_heads)
                want = tp / m->kv_heads;
            if (t == NRS_EMU_T_EMBED && m->tied_embeddings && pp > 1)
                want = 2;
            for (int x = 0; x < c; x++)
                assert_int_equal(cnt[t][y * c + x], want);
        }
        free(cnt[t]);
    }
    free(cnt);
    free(bx);
}

static void test_replica_covers_every_tensor(void **state)
{
    tu_rng_t r = {42};
    (void)state;
    for (int i = 0; i < 200; i++) {
        nrs_spec_t s;
        nrs_layout_t l;
        tu_spec(&s, &r);
        for (int role = 0; role < NRS_ROLE_COUNT; role++) {
            if (!s.models[role].present)
                continue;
            tu_layout(&s.models[role], &r, 16, &l);
            check_cover(&s.models[role], l.tp, l.pp);
        }
    }
}

/* ZeRO-1: the master/Adam boxes of the dp replicas of one (stage, tp rank)
 * position partition that position's weight elements. */
static void test_zero1_partitions_rank_shard(void **state)
{
    nrs_model_t m;
    nrs_spec_t s;
    nrs_plan_t p;
    nrs_layout_t l = {2, 2, 3, 1};
    nrs_emu_state_t st;
    char err[256];
    (void)state;
    tu_model(&m, 3, 8, 7, 4, 2, 9);
    tu_spec_fixed(&s, &m, 4);
    tu_plan_single(&s, 12, &l, &p);
    assert_int_equal(nrs_emu_state_build(&s, &p, NRS_EMU_SEL_PERSISTENT, NULL, 0, &st, err,
                                         sizeof(err)),
                     0);
    for (int rank = 0; rank < 4; rank++) {
        int64_t w = 0, k[NRS_EMU_KIND_COUNT] = {0};
        for (size_t i = 0; i < st.nbuf; i++) {
            const nrs_emu_buf_t *b = &st.buf[i];
            if (b->rank != rank)
                continue;
            if (b->kind == NRS_EMU_WEIGHT && b->replica == 0)
                w += nrs_emu_rect_area(&b->box);
            k[b->kind] += nrs_emu_rect_area(&b->box);
            if (b->kind >= NRS_EMU_MASTER) {
                assert_int_equal(b->set, -1);
                assert_int_equal(b->esize, 4);
            }
        }
        assert_int_equal(k[NRS_EMU_WEIGHT], 3 * w); /* every replica holds the weights */
        assert_int_equal(k[NRS_EMU_GRAD], 3 * w);
        for (int kind = NRS_EMU_MASTER; kind < NRS_EMU_KIND_COUNT; kind++)
            assert_int_equal(k[kind], w); /* split over dp, no overlap (areas add up) */
    }
    nrs_emu_state_free(&st);
}

static void run_pair(const nrs_spec_t *s, const nrs_plan_t *a, const nrs_plan_t *b)
{
    char err[512] = "";
    int rc = tu_run(s, a, b, NULL, -1, err, sizeof(err));
    if (rc)
        fail_msg("%s", err);
}

static void test_reshard_cases(void **state)
{
    nrs_model_t m;
    nrs_spec_t s;
    nrs_plan_t a, b;
    static const nrs_layout_t cases[][2] = {
        {{2, 1, 1, 1}, {4, 1, 1, 1}}, /* tp 2 -> 4 */
        {{1, 3, 1, 1}, {1, 2, 1, 1}}, /* pp 3 -> 2, non-divisible */
        {{2, 3, 1, 1}, {4, 2, 1, 1}}, /* both */
        {{2, 2, 1, 1}, {2, 2, 3, 1}}, /* replicate: dp 1 -> 3 */
        {{2, 2, 3, 1}, {2, 2, 1, 1}}, /* retire: dp 3 -> 1 */
        {{8, 1, 1, 1}, {1, 7, 1, 1}}, /* tp 8 (> kv heads) -> pp 7 */
    };
    (void)state;
    tu_model(&m, 7, 16, 13, 8, 2, 21);
    tu_spec_fixed(&s, &m, 4);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        tu_plan_single(&s, 12, &cases[i][0], &a);
        tu_plan_single(&s, 12, &cases[i][1], &b);
        run_pair(&s, &a, &b);
        run_pair(&s, &b, &a);
    }
}

static void test_migrate_to_other_gpus(void **state)
{
    nrs_model_t m;
    nrs_spec_t s;
    nrs_plan_t a, b;
    nrs_layout_t l = {2, 2, 1, 1};
    nrs_emu_graph_t *g;
    nrs_emu_stats_t st;
    char err[256];
    (void)state;
    tu_model(&m, 4, 8, 9, 4, 4, 10);
    tu_spec_fixed(&s, &m, 4);
    tu_plan_single(&s, 8, &l, &a);
    b = a;
    b.pools[0] = (nrs_pool_t){4, 4}; /* same layout, the other node */
    run_pair(&s, &a, &b);
    assert_int_equal(nrs_emu_transition(&s, &a, &b, NULL, &g, err, sizeof(err)), 0);
    nrs_emu_graph_stats(g, &st);
    assert_int_equal(st.bytes[NRS_LINK_LOCAL], 0);
    assert_int_equal(st.bytes[NRS_LINK_INTRA], 0);
    assert_true(st.bytes[NRS_LINK_INTER] > 0);
    nrs_emu_graph_free(g);
    /* identical plans: nothing moves, nothing is destroyed */
    assert_int_equal(nrs_emu_transition(&s, &a, &a, NULL, &g, err, sizeof(err)), 0);
    nrs_emu_graph_stats(g, &st);
    assert_int_equal(st.ntransfers, 0);
    assert_int_equal(st.ponr, st.nops);
    nrs_emu_graph_free(g);
}

static void test_weight_sync(void **state)
{
    nrs_model_t m;
    nrs_spec_t s;
    nrs_plan_t p;
    nrs_layout_t tr = {2, 2, 2, 1}, gen = {4, 1, 2, 1};
    nrs_emu_graph_t *g;
    nrs_emu_stats_t st;
    nrs_xport_t x;
    nrs_emu_exec_result_t res;
    char err[256];
    (void)state;
    tu_model(&m, 3, 8, 9, 4, 2, 10);
    tu_spec_fixed(&s, &m, 8);
    tu_plan_single(&s, 8, &tr, &p);
    p.has[NRS_MS_ACTOR_GENERATE] = true;
    p.layout[NRS_MS_ACTOR_GENERATE] = gen;
    assert_int_equal(nrs_emu_weight_sync(&s, &p, NULL, &g, err, sizeof(err)), 0);
    nrs_emu_graph_stats(g, &st);
    assert_true(st.ntransfers > 0);
    assert_int_equal(st.ponr, st.nops); /* the train weights stay */
    assert_int_equal(nrs_xport_local_open(&x), 0);
    assert_int_equal(nrs_emu_execute(g, &x, NULL, &res), 0);
    assert_true(res.verified > 0);
    nrs_xport_close(&x);
    nrs_emu_graph_free(g);
}


/* Non-generation (actor.train) weight buffers of g kept in place as, or moved
 * from, OLD actor.generate buffers; *ntrain: actor.train weight buffers. */
static int64_t stale_gen_uses(const nrs_emu_graph_t *g, int *ntrain)
{
    int64_t bad = 0;
    *ntrain = 0;
    for (int32_t j = g->nold; j < g->nold + g->nnew; j++) {
        const nrs_emu_gbuf_t *B = &g->buf[j];
        if (g->to.eng[B->b.engine].ms != NRS_MS_ACTOR_TRAIN || B->b.kind != NRS_EMU_WEIGHT)
            continue;
        (*ntrain)++;
        if (B->alias >= 0 &&
            g->from.eng[g->buf[B->alias].b.engine].ms == NRS_MS_ACTOR_GENERATE)
            bad += B->b.bytes;
    }
    for (size_t i = 0; i < g->nmoves; i++) {
        const nrs_emu_gbuf_t *S = &g->buf[g->moves[i].src], *D = &g->buf[g->moves[i].dst];
        if (g->to.eng[D->b.engine].ms != NRS_MS_ACTOR_GENERATE &&
            S->origin == NRS_EMU_ORIGIN_OLD &&
            g->from.eng[S->b.engine].ms == NRS_MS_ACTOR_GENERATE)
            bad += nrs_emu_rect_area(&g->moves[i].box) * D->b.esize;
    }
    return bad;
}

/* At the step boundary (where transitions run, before the weight sync) the
 * separate-pool actor.generate weights are one optimizer step behind
 * actor.train's: they must never become, or feed, the new actor.train
 * weights (reviewer's stale_gen). Old: generate tp4 on GPUs 0-3, the rest
 * tp4 on GPUs 4-7; new: one pool of 8, tp4 dp2 (replica 0 on GPUs 0-3, where
 * the old generation buffers have the same boxes). */
static void test_stale_generation_weights(void **state)
{
    nrs_model_t m;
    nrs_spec_t s;
    nrs_plan_t a, b;
    nrs_layout_t l4 = {4, 1, 1, 1}, l42 = {4, 1, 2, 1};
    nrs_emu_graph_t *g = NULL;
    nrs_emu_stats_t st;
    char err[512];
    int ntrain;
    (void)state;
    tu_model(&m, 2, 8, 12, 4, 2, 10);
    tu_spec_fixed(&s, &m, 8);
    tu_plan_single(&s, 8, &l4, &a);
    a.npools = 2;
    a.pools[0] = (nrs_pool_t){0, 4};
    a.pools[1] = (nrs_pool_t){4, 4};
    a.pool_of[NRS_MS_ACTOR_TRAIN] = a.pool_of[NRS_MS_ACTOR_INFER] = 1;
    a.has[NRS_MS_ACTOR_GENERATE] = true;
    a.layout[NRS_MS_ACTOR_GENERATE] = l4;
    a.pool_of[NRS_MS_ACTOR_GENERATE] = 0;
    tu_plan_single(&s, 8, &l42, &b);
    b.has[NRS_MS_ACTOR_GENERATE] = true;
    b.layout[NRS_MS_ACTOR_GENERATE] = l42;
    if (nrs_emu_transition(&s, &a, &b, NULL, &g, err, sizeof(err)))
        fail_msg("%s", err);
    assert_int_equal(stale_gen_uses(g, &ntrain), 0);
    assert_true(ntrain > 0);
    nrs_emu_graph_free(g);
    /* every byte still has a (fresh) source: it executes and verifies */
    nrs_emu_opts_t o = {.chunk_bytes = 64};
    if (tu_run(&s, &a, &b, &o, -1, err, sizeof(err)))
        fail_msg("%s", err);
    /* generation weights staying on their own pool are still kept in place */
    assert_int_equal(nrs_emu_transition(&s, &a, &a, NULL, &g, err, sizeof(err)), 0);
    nrs_emu_graph_stats(g, &st);
    assert_int_equal(st.ntransfers, 0);
    nrs_emu_graph_free(g);
    /* the train pool (GPUs 4-7) is lost: only stale generation copies of the
     * weights survive, which is lost state, not a silent one-step rollback */
    int lost[] = {4, 5, 6, 7}, map[] = {0, 1, 2, 3};
    nrs_plan_t c;
    tu_plan_single(&s, 4, &l4, &c);
    nrs_emu_opts_t ol = {.gpu_map = map, .ngpu_map = 4, .lost = lost, .nlost = 4};
    assert_int_equal(nrs_emu_transition(&s, &a, &c, &ol, &g, err, sizeof(err)), NRS_EMU_ELOST);
    int weights = 0;
    for (size_t i = 0; i < g->nlost; i++)
        weights += g->lost[i].kind == NRS_EMU_WEIGHT;
    assert_true(weights > 0);
    nrs_emu_graph_free(g);
}

/* The EMU state on the most loaded GPU of each role is what the planner's
 * memory model (nrs_cost_persist_bytes) counts, under every combination of
 * ZeRO-1, ZeRO-3 and optimizer offload: otherwise transitions reject plans
 * the planner accepted (check_caps) and adaptation stops (reviewer's z3). */
static void test_state_matches_memory_model(void **state)
{
    static const nrs_layout_t ls[] = {{2, 2, 4, 1}, {4, 1, 8, 1}, {1, 4, 2, 1}, {8, 1, 1, 1}};
    nrs_spec_t s;
    char err[256];
    (void)state;
    spec_8b(&s, 4);
    for (int z = 0; z < 24; z++) {
        /* every dtype: an fp32 model is its own master copy (no master kind) */
        for (int r = 0; r < NRS_ROLE_COUNT; r++)
            s.models[r].dtype = (nrs_dtype_t)(z / 8);
        s.runtime.zero1 = z & 1;
        s.runtime.zero3 = (z >> 1) & 1;
        s.runtime.offload_optimizer = (z >> 2) & 1;
        for (size_t li = 0; li < sizeof(ls) / sizeof(ls[0]); li++) {
            nrs_plan_t p = {.total_gpus = 32, .npools = 1, .pools = {{0, 32}}};
            nrs_emu_state_t st;
            for (int ms = 0; ms < NRS_MS_COUNT; ms++) {
                p.has[ms] = nrs_spec_has_ms(&s, (nrs_ms_t)ms);
                p.layout[ms] = ls[li];
            }
            if (nrs_emu_state_build(&s, &p, NRS_EMU_SEL_PERSISTENT, NULL, 0, &st, err,
                                    sizeof(err)))
                fail_msg("%s", err);
            double per[32][NRS_ROLE_COUNT] = {{0}};
            for (size_t i = 0; i < st.nbuf; i++)
                per[st.buf[i].gpu][st.buf[i].role] += (double)st.buf[i].bytes;
            for (int r = 0; r < NRS_ROLE_COUNT; r++) {
                double most = 0, want = nrs_cost_persist_bytes(&s, (nrs_role_t)r, &ls[li]);
                for (int g = 0; g < 32; g++)
                    most = per[g][r] > most ? per[g][r] : most;
                if (fabs(most - want) > 1e-6 * want)
                    fail_msg("dtype %d zero1 %d zero3 %d offload %d layout %zu role %d: EMU "
                             "%.0f, memory model %.0f bytes",
                             z / 8, s.runtime.zero1, s.runtime.zero3,
                             s.runtime.offload_optimizer, li, r, most, want);
            }
            nrs_emu_state_free(&st);
        }
    }
}

/* ZeRO-3 state (weights and grads in flat dp shards, no replica) re-shards
 * and executes, and the weight sync gathers the shards into whole
 * generation weights. */
static void test_zero3_transitions_execute(void **state)
{
    nrs_model_t m;
    nrs_spec_t s;
    nrs_plan_t a, b;
    nrs_layout_t la = {2, 1, 2, 1}, lb = {1, 2, 4, 1}, gen = {4, 1, 2, 1};
    nrs_emu_graph_t *g;
    nrs_emu_exec_result_t res;
    nrs_xport_t x;
    char err[512];
    (void)state;
    tu_model(&m, 3, 8, 9, 4, 2, 10);
    tu_spec_fixed(&s, &m, 4);
    for (int off = 0; off < 2; off++) {
        s.runtime.zero1 = false;
        s.runtime.zero3 = true;
        s.runtime.offload_optimizer = off;
        tu_plan_single(&s, 8, &la, &a);
        tu_plan_single(&s, 8, &lb, &b);
        nrs_emu_opts_t o = {.chunk_bytes = 64};
        if (tu_run(&s, &a, &b, &o, -1, err, sizeof(err)))
            fail_msg("offload %d: %s", off, err);
        b.has[NRS_MS_ACTOR_GENERATE] = true;
        b.layout[NRS_MS_ACTOR_GENERATE] = gen;
        assert_int_equal(nrs_emu_weight_sync(&s, &b, NULL, &g, err, sizeof(err)), 0);
        assert_int_equal(nrs_xport_local_open(&x), 0);
        assert_int_equal(nrs_emu_execute(g, &x, NULL, &res), 0);
        assert_true(res.verified > 0);
        nrs_xport_close(&x);
        nrs_emu_graph_free(g);
    }
}

/* Two inference models of the same size swap pools under a cap that holds
 * one model's weights per GPU: neither side can receive before it sends, so
 * the schedule must stage through host memory, and stay under the cap. */
static void test_swap_stages_through_host(void **state)
{
    nrs_spec_t s;
    nrs_plan_t a, b;
    nrs_emu_graph_t *g;
    nrs_emu_exec_result_t res;
    nrs_xport_t x;
    char err[512];
    (void)state;
    tu_plan_swap(&s, &a, &b);
    nrs_emu_opts_t o = {.chunk_bytes = 64};
    assert_int_equal(nrs_emu_transition(&s, &a, &b, &o, &g, err, sizeof(err)), 0);
    int64_t per[2][8] = {{0}}, most = 0;
    for (size_t i = 0; i < g->nbuf; i++) /* old and new state per GPU */
        per[i >= (size_t)g->nold][g->buf[i].b.gpu] += g->buf[i].b.bytes;
    for (int i = 0; i < 8; i++)
        for (int k = 0; k < 2; k++)
            most = per[k][i] > most ? per[k][i] : most;
    nrs_emu_graph_free(g);
    /* room for the larger of (old, new) on each GPU, not both */
    o.cap_bytes = most + 2 * o.chunk_bytes;
    int rc = nrs_emu_transition(&s, &a, &b, &o, &g, err, sizeof(err));
    if (rc)
        fail_msg("%s", err);
    assert_true(g->nstaged > 0);
    assert_true(g->link_bytes[NRS_LINK_HOST] > 0);
    for (int i = 0; i < g->nphys; i++)
        assert_true(g->peak[i] <= o.cap_bytes);
    assert_int_equal(nrs_xport_local_open(&x), 0);
    rc = nrs_emu_execute(g, &x, NULL, &res);
    if (rc)
        fail_msg("%s", res.first_error);
    assert_true(res.peak_max <= o.cap_bytes);
    nrs_xport_close(&x);
    nrs_emu_graph_free(g);
}

/* A reshard of dp independent replicas (one per node, inference only) under
 * a cap that holds the larger of each GPU's old and new state: every replica
 * must stage, and each GPU stages over its own PCIe link, so the makespan
 * does not grow with the number of replicas. */
static double staged_reshard(int dp, int64_t *staged)
{
    nrs_model_t m;
    nrs_spec_t s;
    nrs_plan_t a, b;
    nrs_layout_t la = {4, 2, dp, 1}, lb = {8, 1, dp, 1};
    nrs_emu_graph_t *g = NULL;
    nrs_emu_exec_result_t res;
    nrs_xport_t x;
    char err[512];
    tu_model(&m, 4, 32, 48, 8, 8, 64);
    tu_spec_fixed(&s, &m, 8);
    s.models[NRS_ROLE_ACTOR].present = false;
    s.models[NRS_ROLE_REF] = m;
    memset(&a, 0, sizeof(a));
    a.total_gpus = 8 * dp;
    a.npools = 1;
    a.pools[0] = (nrs_pool_t){0, 8 * dp};
    a.has[NRS_MS_REF_INFER] = true;
    b = a;
    a.layout[NRS_MS_REF_INFER] = la;
    b.layout[NRS_MS_REF_INFER] = lb;
    nrs_emu_opts_t o = {.chunk_bytes = 64};
    assert_int_equal(nrs_emu_transition(&s, &a, &b, &o, &g, err, sizeof(err)), 0);
    int64_t most = tu_state_need(g);
    nrs_emu_graph_free(g);
    o.cap_bytes = most + 2 * o.chunk_bytes;
    int rc = nrs_emu_transition(&s, &a, &b, &o, &g, err, sizeof(err));
    if (rc)
        fail_msg("dp %d: %s", dp, err);
    assert_int_equal(nrs_xport_local_open(&x), 0);
    rc = nrs_emu_execute(g, &x, NULL, &res);
    nrs_xport_close(&x);
    if (rc)
        fail_msg("dp %d: %s", dp, res.first_error);
    assert_true(res.peak_max <= o.cap_bytes);
    *staged = g->nstaged;
    double ms = (double)g->makespan;
    nrs_emu_graph_free(g);
    return ms;
}

static void test_staging_parallel_across_replicas(void **state)
{
    int64_t st1, st8;
    (void)state;
    double one = staged_reshard(1, &st1), eight = staged_reshard(8, &st8);
    print_message("staged reshard: dp 1 %.3g us (%lld staged), dp 8 %.3g us (%lld staged)\n",
                  one * 1e-6, (long long)st1, eight * 1e-6, (long long)st8);
    assert_true(st1 > 0 && st8 >= 8 * st1 / 2);
    if (eight > 2 * one)
        fail_msg("makespan grows with independent replicas: dp 1 %.0f ps, dp 8 %.0f ps", one,
                 eight);
}

/* The executor notices a wrong offset, a freed source, a missing free. */
static void test_executor_catches_bad_graphs(void **state)
{
    nrs_model_t m;
    nrs_spec_t s;
    nrs_plan_t a, b;
    nrs_layout_t la = {2, 1, 1, 1}, lb = {1, 2, 1, 1};
    nrs_emu_graph_t *g;
    nrs_emu_exec_result_t res;
    nrs_xport_t x;
    char err[512];
    (void)state;
    tu_model(&m, 2, 8, 8, 4, 2, 8);
    tu_spec_fixed(&s, &m, 2);
    tu_plan_single(&s, 2, &la, &a);
    tu_plan_single(&s, 2, &lb, &b);
    nrs_emu_opts_t o = {.chunk_bytes = 32};
    assert_int_equal(nrs_xport_local_open(&x), 0);
    assert_int_equal(nrs_emu_transition(&s, &a, &b, &o, &g, err, sizeof(err)), 0);
    assert_int_equal(nrs_emu_execute(g, &x, NULL, &res), 0);
    size_t first = 0, fr = 0;
    while (g->ops[first].type != NRS_EMU_OP_XFER && g->ops[first].type != NRS_EMU_OP_COPY)
        first++;
    /* 1. a shifted destination offset */
    g->ops[first].dst_off += 2;
    assert_int_equal(nrs_emu_execute(g, &x, NULL, &res), -1);
    assert_true(res.mismatches > 0);
    g->ops[first].dst_off -= 2;
    /* 2. the source freed before it is read */
    for (fr = 0; fr < g->nops; fr++)
        if (g->ops[fr].type == NRS_EMU_OP_FREE && g->ops[fr].src_buf == g->ops[first].src_buf)
            break;
    assert_true(fr < g->nops);
    nrs_emu_op_t t = g->ops[fr];
    memmove(&g->ops[first + 1], &g->ops[first], (fr - first) * sizeof(t));
    g->ops[first] = t;
    assert_int_equal(nrs_emu_execute(g, &x, NULL, &res), -1);
    assert_true(res.use_after_free > 0);
    /* 3. the free dropped */
    g->ops[first].type = NRS_EMU_OP_COMM;
    assert_int_equal(nrs_emu_execute(g, &x, NULL, &res), -1);
    assert_true(res.leaks > 0);
    nrs_xport_close(&x);
    nrs_emu_graph_free(g);
}

/* A region reaching outside its memory is refused, however far: an offset
 * before the buffer (a negative one, as size_t) or a pitch so large that
 * the region's end wraps around size_t must not pass as in bounds. */
static void test_region_bounds_do_not_wrap(void **state)
{
    unsigned char buf[64];
    nrs_xmem_t mem = {buf, 0, sizeof buf, 0};
    (void)state;
    nrs_xregion_t ok = {&mem, 8, 16, 3, 16}, end = {&mem, 48, 16, 1, 16};
    assert_true(nrs_xregion_ok(&ok));
    assert_true(nrs_xregion_ok(&end));
    nrs_xregion_t before = {&mem, (size_t)-8, 16, 1, 16}; /* bytes [-8, 8) */
    assert_false(nrs_xregion_ok(&before));
    nrs_xregion_t past = {&mem, 49, 16, 1, 16};
    assert_false(nrs_xregion_ok(&past));
    nrs_xregion_t wrap = {&mem, 0, SIZE_MAX / 2 + 1, 3, 8}; /* 2 pitches wrap to 0 */
    assert_false(nrs_xregion_ok(&wrap));
    nrs_xregion_t big = {&mem, 8, 8, SIZE_MAX / 4, 8};
    assert_false(nrs_xregion_ok(&big));
    /* zero rows: in bounds of any memory, but a region without memory is
     * refused (the transports read r->mem of every region that passes) */
    nrs_xregion_t none = {&mem, 64, 0, 0, 0}, nomem = {NULL, 0, 0, 0, 0};
    assert_true(nrs_xregion_ok(&none));
    assert_false(nrs_xregion_ok(&nomem));
    nrs_xport_t lx;
    assert_int_equal(nrs_xport_local_open(&lx), 0);
    assert_int_equal(lx.ops->copy(lx.ctx, &nomem, &nomem), -1);
    assert_int_equal(lx.ops->copy(lx.ctx, &none, &none), 0);
    nrs_xport_close(&lx);

    /* through the executor: an op whose source starts 8 bytes before its
     * buffer is a transport error, not a read outside the buffer */
    nrs_model_t m;
    nrs_spec_t s;
    nrs_plan_t a, b;
    nrs_layout_t la = {2, 1, 1, 1}, lb = {1, 2, 1, 1};
    nrs_emu_graph_t *g;
    nrs_emu_exec_result_t res;
    nrs_xport_t x;
    char err[512];
    tu_model(&m, 2, 8, 8, 4, 2, 8);
    tu_spec_fixed(&s, &m, 2);
    tu_plan_single(&s, 2, &la, &a);
    tu_plan_single(&s, 2, &lb, &b);
    nrs_emu_opts_t o = {.chunk_bytes = 32};
    assert_int_equal(nrs_xport_local_open(&x), 0);
    assert_int_equal(nrs_emu_transition(&s, &a, &b, &o, &g, err, sizeof(err)), 0);
    for (size_t i = 0; i < g->nops; i++)
        if (g->ops[i].type == NRS_EMU_OP_XFER || g->ops[i].type == NRS_EMU_OP_COPY) {
            g->ops[i].src_off -= g->ops[i].src_off + 8;
            g->ops[i].dst_off -= g->ops[i].dst_off + 8;
        }
    assert_int_equal(nrs_emu_execute(g, &x, NULL, &res), -1);
    assert_true(res.xport_errors > 0);
    nrs_xport_close(&x);
    nrs_emu_graph_free(g);
}

/* A move cut into more chunks than the scheduler can count is refused with
 * a clear error: its chunk count was truncated to 32 bits, so a move of 2^32
 * chunks (4 GiB in chunks of 1 byte) had none and its destination was
 * allocated but never written, with no error. */
static void test_chunk_count_overflow_refused(void **state)
{
    nrs_model_t m;
    nrs_spec_t s;
    nrs_plan_t a, b;
    nrs_layout_t la = {1, 1, 1, 1}, lb = {2, 1, 1, 1};
    nrs_emu_graph_t *g = NULL;
    char err[512] = "";
    (void)state;
    /* embedding [2^30, 4]: each tp half of it is 2^32 bytes in bf16 */
    tu_model(&m, 1, 4, 4, 4, 4, 1 << 30);
    tu_spec_fixed(&s, &m, 2);
    tu_plan_single(&s, 2, &la, &a);
    tu_plan_single(&s, 2, &lb, &b);
    nrs_emu_opts_t o = {.chunk_bytes = 1, .cap_bytes = (int64_t)1 << 50};
    int rc = nrs_emu_transition(&s, &a, &b, &o, &g, err, sizeof(err));
    if (rc == 0) {
        int64_t bytes = 0, cut = 0;
        for (size_t i = 0; i < g->nmoves; i++) {
            bytes += nrs_emu_rect_area(&g->moves[i].box) * g->buf[g->moves[i].dst].b.esize;
            cut += g->mch[i].n;
        }
        nrs_emu_graph_free(g);
        fail_msg("accepted: %lld bytes to move in chunks of 1 byte, %lld chunks", (long long)bytes,
                 (long long)cut);
    }
    assert_int_equal(rc, -1);
    assert_null(g);
    assert_non_null(strstr(err, "chunks"));
    print_message("refused: %s\n", err);
}

/* Recover: a lost node whose state has a replica elsewhere is rebuilt from
 * it; with dp = 1 the lost boxes are reported exactly, with an error. */
static void test_recover(void **state)
{
    nrs_model_t m;
    nrs_spec_t s;
    nrs_plan_t a, b;
    nrs_layout_t two = {2, 1, 2, 1}, one = {2, 1, 1, 1};
    nrs_emu_graph_t *g = NULL;
    char err[512];
    int lost[] = {2, 3}, map[] = {0, 1};
    (void)state;
    tu_model(&m, 3, 8, 8, 4, 2, 8);
    tu_spec_fixed(&s, &m, 2);
    s.runtime.zero1 = false; /* with ZeRO-1 the optimizer state has no replica */
    tu_plan_single(&s, 4, &two, &a);
    tu_plan_single(&s, 2, &one, &b);
    nrs_emu_opts_t o = {.chunk_bytes = 64, .gpu_map = map, .ngpu_map = 2, .lost = lost,
                        .nlost = 2};
    int rc = tu_run(&s, &a, &b, &o, -1, err, sizeof(err));
    if (rc)
        fail_msg("%s", err);
    /* lose node 0 too (GPUs 0, 1) with the survivors on new GPUs 4, 5 */
    int lost2[] = {0, 1, 2, 3}, map2[] = {4, 5};
    o.lost = lost2;
    o.nlost = 4;
    o.gpu_map = map2;
    assert_int_equal(nrs_emu_transition(&s, &a, &b, &o, &g, err, sizeof(err)), NRS_EMU_ELOST);
    assert_non_null(strstr(err, "checkpoint"));
    assert_non_null(g);
    /* everything is lost: each (tensor, kind but grad) of the model, whole */
    int64_t area = 0;
    for (size_t i = 0; i < g->nlost; i++)
        area += nrs_emu_rect_area(&g->lost[i].box);
    int64_t want = 0;
    for (int t = 0; t < nrs_emu_tensor_count(&m); t++) {
        int r, c;
        nrs_emu_tensor_shape(&m, t, &r, &c);
        want += (int64_t)r * c * (NRS_EMU_KIND_COUNT - 1);
    }
    assert_int_equal(area, want);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    nrs_emu_graph_print_lost(g, f);
    fclose(f);
    assert_non_null(strstr(buf, "lost: actor.layers.qkv weight layers [0,"));
    assert_non_null(strstr(buf, "adam_v"));
    free(buf);
    nrs_emu_graph_free(g);
    /* ZeRO-1, dp 2, one node lost: weights survive, half the optimizer does not */
    s.runtime.zero1 = true;
    o.lost = lost;
    o.nlost = 2;
    o.gpu_map = map;
    assert_int_equal(nrs_emu_transition(&s, &a, &b, &o, &g, err, sizeof(err)), NRS_EMU_ELOST);
    for (size_t i = 0; i < g->nlost; i++)
        assert_true(g->lost[i].kind >= NRS_EMU_MASTER);
    nrs_emu_graph_free(g);
}

/* A partial state (past a point of no return): buffers whose contents are gone
 * though their GPU lives (opts.missing) are never a source or kept; their
 * boxes come from the other replica, and when no replica has them they are
 * reported lost. */
static void test_missing_buffers(void **state)
{
    nrs_model_t m;
    nrs_spec_t s;
    nrs_plan_t a, b;
    nrs_layout_t two = {2, 1, 2, 1}, one = {2, 1, 1, 1};
    nrs_emu_state_t st;
    nrs_emu_graph_t *g = NULL;
    char err[512];
    int lost[] = {2, 3}, map[] = {0, 1};
    (void)state;
    tu_model(&m, 3, 8, 8, 4, 2, 8);
    tu_spec_fixed(&s, &m, 2);
    s.runtime.zero1 = false;
    tu_plan_single(&s, 4, &two, &a); /* dp 2: replica 0 on GPUs 0-1, replica 1 on 2-3 */
    tu_plan_single(&s, 4, &one, &b);
    memset(&st, 0, sizeof(st));
    assert_int_equal(nrs_emu_state_build(&s, &a, NRS_EMU_SEL_PERSISTENT, NULL, 0, &st, err,
                                         sizeof(err)), 0);
    unsigned char *miss = calloc(st.nbuf + 1, 1);
    int nmiss = 0;
    for (size_t i = 0; i < st.nbuf; i++) /* replica 0's weights on GPU 0: gone */
        if (st.buf[i].gpu == 0 && st.buf[i].kind == NRS_EMU_WEIGHT)
            miss[i] = 1, nmiss++;
    assert_true(nmiss > 0);
    nrs_emu_opts_t o = {.chunk_bytes = 64, .missing = miss, .nmissing = st.nbuf};
    assert_int_equal(nrs_emu_transition(&s, &a, &b, &o, &g, err, sizeof(err)), 0);
    for (size_t k = 0; k < g->nmoves; k++) /* never read from a missing buffer */
        assert_true(g->moves[k].src >= g->nold || !miss[g->moves[k].src]);
    for (int32_t j = g->nold; j < g->nold + g->nnew; j++) /* nor kept in place */
        assert_true(g->buf[j].alias < 0 || !miss[g->buf[j].alias]);
    nrs_emu_graph_free(g);
    int rc = tu_run(&s, &a, &b, &o, -1, err, sizeof(err)); /* and the bytes check */
    if (rc)
        fail_msg("%s", err);
    /* the other replica lost as well (node 1): those weights survive nowhere */
    o.lost = lost;
    o.nlost = 2;
    o.gpu_map = map;
    o.ngpu_map = 2;
    tu_plan_single(&s, 2, &one, &b);
    int rc2 = nrs_emu_transition(&s, &a, &b, &o, &g, err, sizeof(err));
    if (rc2 != NRS_EMU_ELOST)
        fail_msg("want ELOST, got %d: %s", rc2, err);
    assert_true(g->nlost > 0);
    for (size_t i = 0; i < g->nlost; i++)
        assert_int_equal(g->lost[i].kind, NRS_EMU_WEIGHT);
    nrs_emu_graph_free(g);
    free(miss);
    nrs_emu_state_free(&st);
}

/* More replicas than source choice tries in full (TRY_ALL): the runs on the
 * destination's node and a spread stand for a class; every shard still
 * verifies, survivors of a mostly lost pool still cover, and the load is
 * spread over the source replicas. */
static void test_many_replicas(void **state)
{
    nrs_model_t m;
    nrs_spec_t s;
    nrs_plan_t a, b;
    nrs_layout_t wide = {1, 1, 24, 1}, tp2 = {2, 1, 12, 1}, wide2 = {1, 1, 32, 1};
    nrs_emu_graph_t *g = NULL;
    char err[512];
    (void)state;
    tu_model(&m, 3, 8, 8, 4, 2, 8);
    tu_spec_fixed(&s, &m, 4);
    s.runtime.zero1 = false;
    tu_plan_single(&s, 24, &wide, &a);
    tu_plan_single(&s, 24, &tp2, &b);
    run_pair(&s, &a, &b);
    run_pair(&s, &b, &a);
    tu_plan_single(&s, 32, &wide2, &b); /* dp 24 -> 32: new replicas read old ones */
    run_pair(&s, &a, &b);
    /* 20 of 24 GPUs lost, the new plan on the 4 survivors + 4 new GPUs */
    int lost[20], map[8] = {0, 1, 2, 3, 24, 25, 26, 27};
    for (int i = 0; i < 20; i++)
        lost[i] = 4 + i;
    nrs_layout_t eight = {1, 1, 8, 1};
    tu_plan_single(&s, 8, &eight, &b);
    nrs_emu_opts_t o = {.chunk_bytes = 64, .gpu_map = map, .ngpu_map = 8, .lost = lost,
                        .nlost = 20};
    if (tu_run(&s, &a, &b, &o, -1, err, sizeof(err)))
        fail_msg("%s", err);
    /* dp 24 -> 32 on the same GPUs and 8 more: the senders are spread (replica
     * d mod 24 first), so no sender is busier than the busiest receiver */
    tu_plan_single(&s, 32, &wide2, &b);
    assert_int_equal(nrs_emu_transition(&s, &a, &b, NULL, &g, err, sizeof(err)), 0);
    int64_t sent[32] = {0}, recv[32] = {0}, hs = 0, hr = 0;
    for (size_t i = 0; i < g->nmoves; i++) {
        const nrs_emu_op_t *c = &g->mch[i].op;
        if (c->src_gpu != c->dst_gpu && c->src_gpu >= 0 && c->src_gpu < 32 &&
            c->dst_gpu < 32) {
            sent[c->src_gpu] += c->row_bytes * c->rows;
            recv[c->dst_gpu] += c->row_bytes * c->rows;
        }
    }
    for (int i = 0; i < 32; i++) {
        hs = sent[i] > hs ? sent[i] : hs;
        hr = recv[i] > hr ? recv[i] : hr;
    }
    assert_true(hr > 0);
    assert_true(hs <= hr);
    assert_true(g->makespan <= g->lower_bound * 5 / 4);
    nrs_emu_graph_free(g);
}

static char *summary(const nrs_spec_t *s, const nrs_plan_t *a, const nrs_plan_t *b,
                     const nrs_emu_opts_t *o, int *rc)
{
    char *buf = NULL, err[512] = "";
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    *rc = nrs_transition_summary_opts(s, a, b, o, f, true, err, sizeof(err));
    if (*rc)
        fprintf(f, "error: %s\n", err);
    fclose(f);
    return buf;
}

/* What `nereus transition` prints, executed on the scaled-down model. */
static void test_transition_summary(void **state)
{
    nrs_model_t m;
    nrs_spec_t s;
    nrs_plan_t a, b;
    nrs_layout_t la = {8, 4, 2, 1}, lb = {8, 2, 4, 1};
    int rc;
    (void)state;
    tu_model(&m, 80, 8192, 28672, 64, 8, 128256); /* Llama-3-70B shapes */
    tu_spec_fixed(&s, &m, 8);
    s.runtime.emulation_scale = 1e-4;
    s.runtime.mem_headroom_gib = 2;
    tu_plan_single(&s, 64, &la, &a);
    tu_plan_single(&s, 64, &lb, &b);
    b.epoch = 7;
    char *out = summary(&s, &a, &b, NULL, &rc);
    if (rc)
        fail_msg("%s", out);
    assert_non_null(strstr(out, "transition epoch 0 -> 7 on 64 GPUs"));
    assert_non_null(strstr(out, "inter-node"));
    assert_non_null(strstr(out, "cap 78.00 GiB"));
    assert_non_null(strstr(out, "lower bound"));
    assert_non_null(strstr(out, "point of no return: op"));
    assert_non_null(strstr(out, " shards, 0 mismatches"));
    free(out);
    /* all replicas lost: reported, with an error */
    int lost[64], map[8];
    for (int i = 0; i < 64; i++)
        lost[i] = i;
    for (int i = 0; i < 8; i++)
        map[i] = 64 + i;
    nrs_layout_t small = {8, 1, 1, 1};
    tu_plan_single(&s, 8, &small, &b);
    nrs_emu_opts_t o = {.lost = lost, .nlost = 64, .gpu_map = map, .ngpu_map = 8};
    out = summary(&s, &a, &b, &o, &rc);
    assert_int_equal(rc, -1);
    assert_non_null(strstr(out, "checkpoint"));
    /* one line per model and kind: every layer and the embedding are gone */
    assert_non_null(strstr(out, "lost: actor weight: "));
    assert_non_null(strstr(out, "(layers 0-"));
    assert_non_null(strstr(out, "embed"));
    free(out);
}

/* A transition that stages through host memory under its cap: the scaled
 * run scales the cap by the ratio of the scaled state to the full state
 * (old and new buffers), and runs under it, staging too. Host copies made
 * while scheduling are not state: counted in, they shrank the scaled cap
 * below the state and the run went uncapped ('cap relaxed'). */
static void test_transition_summary_staged(void **state)
{
    nrs_spec_t s;
    nrs_plan_t a, b;
    nrs_emu_graph_t *g = NULL;
    char err[512];
    int rc;
    (void)state;
    tu_plan_swap(&s, &a, &b);
    nrs_emu_opts_t o = {.chunk_bytes = 256};
    assert_int_equal(nrs_emu_transition(&s, &a, &b, &o, &g, err, sizeof(err)), 0);
    o.cap_bytes = tu_state_need(g) + 2 * o.chunk_bytes;
    nrs_emu_graph_free(g);
    g = NULL;
    assert_int_equal(nrs_emu_transition(&s, &a, &b, &o, &g, err, sizeof(err)), 0);
    assert_true(g->nstaged > 0);
    nrs_emu_graph_free(g);
    char *out = summary(&s, &a, &b, &o, &rc);
    if (rc || strstr(out, "cap relaxed") || !strstr(out, " shards, 0 mismatches"))
        fail_msg("%s", out);
    free(out);
}

/* Plans that hold no state (no model-stage): the scaled run compares the
 * scaled state with the full one, 0 bytes to 0, and must not divide by it. */
static void test_transition_summary_no_state(void **state)
{
    nrs_model_t m;
    nrs_spec_t s;
    nrs_plan_t a = {.total_gpus = 4, .npools = 1, .pools = {{0, 4}}}, b = a;
    int rc;
    (void)state;
    tu_model(&m, 4, 64, 128, 4, 2, 256);
    tu_spec_fixed(&s, &m, 4);
    s.runtime.emulation_scale = 1e-2;
    b.epoch = 2;
    char *out = summary(&s, &a, &b, NULL, &rc);
    if (rc)
        fail_msg("%s", out);
    assert_non_null(strstr(out, "transition epoch 0 -> 2 on 1 GPUs: 0 ops"));
    if (!strstr(out, "scaled run: neither plan holds state, nothing to execute\n") ||
        strstr(out, "executed in-process"))
        fail_msg("the scaled run did not stop at the empty state:\n%s", out);
    free(out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_split_balanced),
        cmocka_unit_test(test_gqa_kv_split_and_replication),
        cmocka_unit_test(test_stacked_coordinates_fit),
        cmocka_unit_test(test_checksum_is_xxh64),
        cmocka_unit_test(test_replica_covers_every_tensor),
        cmocka_unit_test(test_zero1_partitions_rank_shard),
        cmocka_unit_test(test_reshard_cases),
        cmocka_unit_test(test_migrate_to_other_gpus),
        cmocka_unit_test(test_weight_sync),
        cmocka_unit_test(test_stale_generation_weights),
        cmocka_unit_test(test_state_matches_memory_model),
        cmocka_unit_test(test_zero3_transitions_execute),
        cmocka_unit_test(test_swap_stages_through_host),
        cmocka_unit_test(test_staging_parallel_across_replicas),
        cmocka_unit_test(test_executor_catches_bad_graphs),
        cmocka_unit_test(test_region_bounds_do_not_wrap),
        cmocka_unit_test(test_chunk_count_overflow_refused),
        cmocka_unit_test(test_recover),
        cmocka_unit_test(test_missing_buffers),
        cmocka_unit_test(test_many_replicas),
        cmocka_unit_test(test_transition_summary),
        cmocka_unit_test(test_transition_summary_no_state),
        cmocka_unit_test(test_transition_summary_staged),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
