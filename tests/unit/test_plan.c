/* Planner tests: exact against brute force on small cases, every plan feasible,
 * infeasible specs rejected with the reason, the model's sanity properties, and
 * determinism. Specs are built in code so this suite does not depend on the
 * loader; the loader's examples are planned by the CLI tests. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "nereus/emu.h"
#include "nereus/plan.h"
#include "fixtures.h"

/* Deterministic generator for the random small cases. */
static uint64_t rng_state;
static int rnd(int lo, int hi)
{
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return lo + (int)((rng_state >> 33) % (uint64_t)(hi - lo + 1));
}

typedef enum { CASE_GRPO_MIN, CASE_GRPO_REF, CASE_PPO } case_kind_t;

/* A small model and cluster where memory binds: capacity of a few MiB. */
static void spec_small(nrs_spec_t *s, case_kind_t kind, int gpn, int nodes, int samples)
{
    memset(s, 0, sizeof(*s));
    snprintf(s->path, sizeof(s->path), "test-small");
    int heads = 4 << rnd(0, 1), kv = heads >> rnd(0, 2);
    int hidden = heads * 32 * rnd(1, 2), layers = rnd(2, 4);
    s->cluster = (nrs_cluster_t){.gpu_mem_gib = rnd(20, 400) / 1024.0, .peak_tflops = 100,
                                 .hbm_gbps = 1000, .gpus_per_node = gpn, .nodes = nodes,
                                 .intra_gbps = rnd(50, 500), .inter_gbps = rnd(5, 50),
                                 .host_gbps = 10, .efficiency = 0.5};
    for (int r = 0; r < NRS_ROLE_COUNT; r++)
        set_model(&s->models[r], layers, hidden, hidden * 4, heads, kv, 2048,
                  r == NRS_ROLE_CRITIC || r == NRS_ROLE_REWARD);
    s->algorithm.name = kind == CASE_PPO ? NRS_ALGO_PPO : NRS_ALGO_GRPO;
    s->algorithm.kl = kind != CASE_GRPO_MIN;
    s->algorithm.reward_model = kind == CASE_PPO;
    if (kind != CASE_PPO)
        s->models[NRS_ROLE_CRITIC].present = false;
    if (!s->algorithm.kl)
        s->models[NRS_ROLE_REF].present = false;
    if (!s->algorithm.reward_model)
        s->models[NRS_ROLE_REWARD].present = false;
    s->workload = (nrs_workload_t){.global_batch = samples, .samples_per_prompt = 1,
                                   .prompt_len = rnd(64, 512), .response_len = rnd(64, 1024),
                                   .ppo_epochs = 1, .steps = 100, .micro_batch_max = 64};
    s->workload.max_response_len = s->workload.response_len;
    s->runtime = (nrs_runtime_t){.transports = 7, .mem_headroom_gib = 0, .emulation_scale = 1,
                                 .zero1 = rnd(0, 1), .verify = true};
}

static void plan_ok(const nrs_spec_t *s, int gpus, nrs_plan_mode_t mode, nrs_plan_t *p)
{
    nrs_plan_req_t req;
    char err[NRS_ERR_MAX];
    nrs_plan_req_init(&req, s);
    req.gpus = gpus;
    req.mode = mode;
    int rc = nrs_plan_best(s, &req, p, err, sizeof(err));
    if (rc != 0)
        fail_msg("plan on %d GPUs failed: %s", gpus, err);
}

/* Every plan the planner returns passes the ground-truth evaluation. */
static void assert_feasible(const nrs_spec_t *s, const nrs_plan_t *p)
{
    nrs_plan_t q = *p;
    nrs_work_t w;
    char err[NRS_ERR_MAX];
    nrs_work_from_spec(s, &w);
    assert_int_equal(nrs_plan_eval(s, &w, NULL, &q, err, sizeof(err)), 0);
    assert_true(fabs(q.step_s - p->step_s) <= 1e-12 * p->step_s);
    for (int ms = 0; ms < NRS_MS_COUNT; ms++)
        if (q.has[ms])
            assert_true(q.ms_mem[ms] <= q.capacity_bytes);
}

static void run_brute_cases(case_kind_t kind, int ncases, const int (*shapes)[3], int nshapes)
{
    int agree = 0, infeasible = 0;
    for (int i = 0; i < ncases; i++) {
        const int *sh = shapes[i % nshapes]; /* gpn, nodes, samples */
        nrs_spec_t s;
        nrs_plan_req_t req;
        nrs_plan_t a, b;
        char ea[NRS_ERR_MAX], eb[NRS_ERR_MAX];
        spec_small(&s, kind, sh[0], sh[1], sh[2]);
        nrs_plan_req_init(&req, &s);
        int ra = nrs_plan_best(&s, &req, &a, ea, sizeof(ea));
        int rb = nrs_plan_brute(&s, &req, &b, eb, sizeof(eb));
        if (rb != 0 && strstr(eb, "more than"))
            fail_msg("case %d too large for brute force", i);
        if (ra != rb)
            fail_msg("case %d (kind %d, %d GPUs): planner rc %d (%s), brute rc %d (%s)", i, kind,
                     req.gpus, ra, ra ? ea : "", rb, rb ? eb : "");
        if (ra != 0) {
            assert_non_null(strstr(ea, "no feasible plan"));
            infeasible++;
            continue;
        }
        if (fabs(a.step_s - b.step_s) > 1e-9 * b.step_s)
            fail_msg("case %d: planner %.9g s, brute force %.9g s", i, a.step_s, b.step_s);
        assert_feasible(&s, &a);
        agree++;
    }
    print_message("kind %d: %d cases equal to brute force, %d infeasible in both\n", kind, agree,
                  infeasible);
    assert_true(agree > 0);
}

static void test_brute_grpo_min(void **st)
{
    (void)st;
    static const int shapes[][3] = {{8, 1, 8}, {4, 2, 8}, {4, 4, 16}, {2, 8, 16}, {8, 2, 16},
                                    {4, 1, 4}, {2, 1, 2}, {1, 1, 4}};
    rng_state = 1;
    run_brute_cases(CASE_GRPO_MIN, 40, shapes, 8);
}

static void test_brute_grpo_ref(void **st)
{
    (void)st;
    static const int shapes[][3] = {{4, 2, 8}, {8, 1, 8}, {2, 4, 8}, {4, 1, 4}, {2, 1, 4}};
    rng_state = 2;
    run_brute_cases(CASE_GRPO_REF, 20, shapes, 5);
}

static void test_brute_ppo(void **st)
{
    (void)st;
    static const int shapes[][3] = {{2, 1, 2}, {1, 2, 2}, {2, 1, 1}};
    rng_state = 3;
    run_brute_cases(CASE_PPO, 9, shapes, 3);
}

static void test_infeasible_reason(void **st)
{
    (void)st;
    nrs_spec_t s;
    nrs_plan_req_t req;
    nrs_plan_t p;
    char err[NRS_ERR_MAX];
    spec_8b(&s, 1);
    s.cluster.gpu_mem_gib = 16;
    nrs_plan_req_init(&req, &s);
    req.gpus = 1;
    assert_int_equal(nrs_plan_best(&s, &req, &p, err, sizeof(err)), -1);
    print_message("%s\n", err);
    assert_non_null(strstr(err, "no feasible plan: "));
    assert_non_null(strstr(err, "GiB per GPU at best (tp=1, pp=1) but a GPU has 14.0 GiB usable"));
    /* Bad requests. */
    req.gpus = 12;
    assert_int_equal(nrs_plan_best(&s, &req, &p, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "not a whole number of 8-GPU nodes"));
    req.gpus = 0;
    assert_int_equal(nrs_plan_best(&s, &req, &p, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "out of range"));
}

/* samples = global_batch * samples_per_prompt may be up to INT_MAX (the
 * validator's bound): the per-replica ceil-divisions must not overflow int
 * (it was UB, and wrapped negative: no micro-batch options, no plan). */
static void test_samples_near_int_max(void **st)
{
    (void)st;
    nrs_spec_t s;
    nrs_plan_req_t req;
    nrs_plan_t p;
    char err[NRS_ERR_MAX];
    spec_8b(&s, 32);
    s.workload.global_batch = 16777215;
    s.workload.samples_per_prompt = 128; /* 2147483520 samples */
    nrs_plan_req_init(&req, &s);
    req.gpus = 256;
    int rc = nrs_plan_best(&s, &req, &p, err, sizeof(err));
    if (rc)
        fail_msg("%s", err);
    assert_true(isfinite(p.step_s) && p.step_s > 0);
    for (int ms = 0; ms < NRS_MS_COUNT; ms++)
        if (p.has[ms])
            assert_true(p.layout[ms].mb >= 1);
}

static void test_tight_memory_names_stage(void **st)
{
    (void)st;
    nrs_spec_t s;
    nrs_plan_req_t req;
    nrs_plan_t p;
    char err[NRS_ERR_MAX];
    spec_8b(&s, 1);
    s.cluster.gpu_mem_gib = 6; /* 4 GiB usable: nothing fits even at tp=8 */
    nrs_plan_req_init(&req, &s);
    assert_int_equal(nrs_plan_best(&s, &req, &p, err, sizeof(err)), -1);
    print_message("%s\n", err);
    assert_non_null(strstr(err, "actor.train needs"));
    assert_non_null(strstr(err, "(tp=8, pp="));
}

static void test_more_gpus_never_slower(void **st)
{
    (void)st;
    nrs_spec_t s;
    nrs_plan_t p;
    double prev = 1e300;
    spec_8b(&s, 1);
    for (int g = 8; g <= 512; g *= 2) {
        plan_ok(&s, g, NRS_PLAN_BEST, &p);
        assert_feasible(&s, &p);
        print_message("%4d GPUs: %.3f s/step, %d pools\n", g, p.step_s, p.npools);
        assert_true(p.step_s <= prev * (1 + 1e-12));
        prev = p.step_s;
    }
}

static void test_longer_response_never_faster(void **st)
{
    (void)st;
    nrs_spec_t s;
    nrs_plan_t p;
    double prev = 0;
    spec_8b(&s, 4);
    for (int len = 256; len <= 8192; len *= 2) {
        s.workload.response_len = len;
        plan_ok(&s, 32, NRS_PLAN_BEST, &p);
        print_message("response %5d: %.3f s/step\n", len, p.step_s);
        assert_true(p.step_s >= prev);
        prev = p.step_s;
    }
}

static void test_fixed_never_better(void **st)
{
    (void)st;
    nrs_spec_t s;
    nrs_plan_t best, fixed;
    spec_8b(&s, 2);
    for (int g = 16; g <= 256; g *= 2) {
        for (int len = 512; len <= 4096; len *= 2) {
            s.workload.response_len = len;
            plan_ok(&s, g, NRS_PLAN_BEST, &best);
            plan_ok(&s, g, NRS_PLAN_FIXED, &fixed);
            assert_feasible(&s, &fixed);
            assert_int_equal(fixed.npools, 1);
            assert_true(fixed.step_s >= best.step_s * (1 - 1e-12));
        }
    }
}

static void test_fixed_keeps_tp_pp(void **st)
{
    (void)st;
    nrs_spec_t s;
    nrs_plan_t a, b;
    nrs_plan_req_t req;
    char err[NRS_ERR_MAX];
    spec_8b(&s, 2);
    s.models[NRS_ROLE_ACTOR].init_train = (nrs_tp_pp_t){4, 2};
    s.models[NRS_ROLE_ACTOR].init_generate = (nrs_tp_pp_t){2, 1};
    plan_ok(&s, 16, NRS_PLAN_FIXED, &a);
    assert_int_equal(a.layout[NRS_MS_ACTOR_TRAIN].tp, 4);
    assert_int_equal(a.layout[NRS_MS_ACTOR_TRAIN].pp, 2);
    assert_int_equal(a.layout[NRS_MS_ACTOR_TRAIN].dp, 2);
    assert_int_equal(a.layout[NRS_MS_ACTOR_GENERATE].tp, 2);
    nrs_plan_req_init(&req, &s);
    req.gpus = 64;
    req.mode = NRS_PLAN_FIXED;
    req.fixed_from = &a;
    assert_int_equal(nrs_plan_best(&s, &req, &b, err, sizeof(err)), 0);
    for (int ms = 0; ms < NRS_MS_COUNT; ms++) {
        if (!a.has[ms])
            continue;
        assert_int_equal(b.layout[ms].tp, a.layout[ms].tp);
        assert_int_equal(b.layout[ms].pp, a.layout[ms].pp);
        assert_int_equal(b.layout[ms].dp, 64 / (a.layout[ms].tp * a.layout[ms].pp));
    }
}

/* TEMPLATE keeps pools, placement and tp/pp, and chooses micro-batches: the best
 * plan as its own template comes back with the same step time. */
static void test_template(void **st)
{
    (void)st;
    nrs_spec_t s;
    nrs_plan_t best, t, out;
    nrs_plan_req_t req;
    char err[NRS_ERR_MAX];
    spec_8b(&s, 4);
    plan_ok(&s, 512, NRS_PLAN_BEST, &best);
    nrs_plan_req_init(&req, &s);
    req.gpus = 512;
    req.mode = NRS_PLAN_TEMPLATE;
    req.fixed_from = &best;
    assert_int_equal(nrs_plan_best(&s, &req, &out, err, sizeof(err)), 0);
    assert_true(nrs_plan_same_layout(&best, &out));
    assert_true(fabs(out.step_s - best.step_s) <= 1e-12 * best.step_s);
    /* Three pools of a separate-engines system on 32 GPUs: generation on 16,
     * actor and ref on 8, critic and reward on 8; every GPU data-parallel. */
    memset(&t, 0, sizeof(t));
    t.total_gpus = 32;
    t.npools = 3;
    t.pools[0] = (nrs_pool_t){0, 16};
    t.pools[1] = (nrs_pool_t){16, 8};
    t.pools[2] = (nrs_pool_t){24, 8};
    for (int ms = 0; ms < NRS_MS_COUNT; ms++) {
        t.has[ms] = true;
        t.layout[ms] = (nrs_layout_t){1, 1, 0, 0};
    }
    t.pool_of[NRS_MS_ACTOR_GENERATE] = 0;
    t.layout[NRS_MS_ACTOR_GENERATE].tp = 2;
    t.pool_of[NRS_MS_ACTOR_INFER] = t.pool_of[NRS_MS_ACTOR_TRAIN] = t.pool_of[NRS_MS_REF_INFER] = 1;
    t.pool_of[NRS_MS_CRITIC_INFER] = t.pool_of[NRS_MS_CRITIC_TRAIN] = t.pool_of[NRS_MS_REWARD_INFER] = 2;
    s.cluster.gpu_mem_gib = 160; /* two 8B trained models' state on 8 GPUs each */
    req.gpus = 32;
    req.fixed_from = &t;
    assert_int_equal(nrs_plan_best(&s, &req, &out, err, sizeof(err)), 0);
    assert_int_equal(out.npools, 3);
    assert_int_equal(out.layout[NRS_MS_ACTOR_GENERATE].dp, 8);
    assert_int_equal(out.layout[NRS_MS_ACTOR_TRAIN].dp, 8);
    assert_int_equal(out.pool_of[NRS_MS_REWARD_INFER], 2);
    assert_feasible(&s, &out);
    /* A template on the wrong GPU count is refused. */
    req.gpus = 64;
    assert_int_equal(nrs_plan_best(&s, &req, &out, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "template plan"));
}

static void test_deterministic(void **st)
{
    (void)st;
    nrs_spec_t s;
    nrs_plan_t a, b;
    spec_8b(&s, 4);
    plan_ok(&s, 32, NRS_PLAN_BEST, &a);
    plan_ok(&s, 32, NRS_PLAN_BEST, &b);
    assert_memory_equal(&a, &b, sizeof(a));
}

/* Generation on the actor's pool at the actor's tp and pp reads the training
 * weights in place only when a training rank holds its whole shard: under
 * ZeRO-3 (dp > 1) it holds 1/dp and generation needs the shard gathered, and a
 * broadcast sync fills an engine copy of its own. Those weights must be counted
 * while generation runs, and the planner must agree with its ground truth. */
static void test_colocated_gen_weights(void **st)
{
    (void)st;
    nrs_spec_t s;
    nrs_plan_t p, q;
    nrs_work_t w;
    char err[NRS_ERR_MAX];
    spec_8b(&s, 1);
    s.cluster.gpu_mem_gib = 1000; /* memory does not bind: compare the counts */
    nrs_work_from_spec(&s, &w);
    memset(&p, 0, sizeof(p));
    p.total_gpus = 8;
    p.npools = 1;
    p.pools[0] = (nrs_pool_t){0, 8};
    for (int ms = 0; ms < NRS_MS_COUNT; ms++) {
        p.has[ms] = true;
        p.pool_of[ms] = 0;
        p.layout[ms] = (nrs_layout_t){1, 1, 8, ms == NRS_MS_ACTOR_GENERATE ? 8 : 1};
    }
    for (int k = 0; k < 3; k++) {
        s.runtime.zero3 = k == 1;
        s.runtime.weight_sync = k == 2 ? NRS_WSYNC_BROADCAST : NRS_WSYNC_RESHARD;
        double persist = 0;
        for (int r = 0; r < NRS_ROLE_COUNT; r++)
            persist += nrs_cost_persist_bytes(&s, (nrs_role_t)r, &p.layout[NRS_MS_ACTOR_TRAIN]);
        nrs_stage_cost_t c;
        assert_int_equal(nrs_cost_stage(&s, NRS_MS_ACTOR_GENERATE, &p.layout[NRS_MS_ACTOR_GENERATE],
                                        &w, NULL, &c), 0);
        double own = k == 0 ? 0 : nrs_cost_gen_weight_bytes(&s, &p.layout[NRS_MS_ACTOR_GENERATE]);
        q = p;
        assert_int_equal(nrs_plan_eval(&s, &w, NULL, &q, err, sizeof(err)), 0);
        assert_true(fabs(q.ms_mem[NRS_MS_ACTOR_GENERATE] - (persist + c.trans_bytes + own)) <=
                    1e-9 * q.ms_mem[NRS_MS_ACTOR_GENERATE]);
        /* The search prices the same memory as the ground truth. */
        plan_ok(&s, 8, NRS_PLAN_BEST, &q);
        assert_feasible(&s, &q);
    }
}

/* One GPU, GRPO without a reference: only the actor and its generation engine
 * (in place), one layout (tp = pp = dp = 1), memory set by the test. */
static void spec_one_gpu(nrs_spec_t *s)
{
    spec_8b(s, 1);
    s->cluster.gpus_per_node = 1;
    set_model(&s->models[NRS_ROLE_ACTOR], 4, 512, 2048, 8, 8, 32000, false);
    for (int r = NRS_ROLE_CRITIC; r < NRS_ROLE_COUNT; r++)
        s->models[r].present = false;
    s->algorithm = (nrs_algorithm_t){NRS_ALGO_GRPO, false, false};
    s->workload.global_batch = 4;
    s->workload.prompt_len = 512;
    s->runtime.mem_headroom_gib = 0;
}

/* The largest transient at micro-batch 1 of the one-GPU spec's stages. */
static double least_peak_transient(const nrs_spec_t *s, const nrs_work_t *w)
{
    static const nrs_ms_t stages[] = {NRS_MS_ACTOR_GENERATE, NRS_MS_ACTOR_INFER,
                                      NRS_MS_ACTOR_TRAIN};
    nrs_layout_t l = {1, 1, 1, 1};
    double t = 0;
    for (size_t i = 0; i < sizeof(stages) / sizeof(stages[0]); i++) {
        nrs_stage_cost_t c;
        assert_int_equal(nrs_cost_stage(s, stages[i], &l, w, NULL, &c), 0);
        t = fmax(t, c.trans_bytes);
    }
    return t;
}

/* Memory exactly at the cap, where persist + transient rounds down onto it: the
 * ground truth (persist + transient <= cap) accepts the plan, so the search,
 * which compared the transient with cap - persist, must too (it found no plan).
 * A fractional mean response length (the simulator's ramps) gives a transient
 * with low-order bits, hence the rounding. */
static void test_search_and_eval_agree_at_cap(void **st)
{
    (void)st;
    nrs_spec_t s;
    nrs_plan_req_t req;
    nrs_plan_t a, b;
    nrs_layout_t l = {1, 1, 1, 1};
    char ea[NRS_ERR_MAX], eb[NRS_ERR_MAX];
    int found = 0;
    spec_one_gpu(&s);
    nrs_plan_req_init(&req, &s);
    double persist = nrs_cost_persist_bytes(&s, NRS_ROLE_ACTOR, &l);
    for (int k = 1; k < 200 && !found; k++) {
        req.work.response_len = 512 + k / 7.0;
        double trans = least_peak_transient(&s, &req.work), cap = persist + trans;
        if (cap - persist >= trans)
            continue; /* no rounding to tell the two comparisons apart */
        found = k;
        s.cluster.gpu_mem_gib = cap / (1024.0 * 1024.0 * 1024.0); /* exact: cap bytes usable */
        int ra = nrs_plan_best(&s, &req, &a, ea, sizeof(ea));
        int rb = nrs_plan_brute(&s, &req, &b, eb, sizeof(eb));
        if (rb != 0)
            fail_msg("response %.4f: the ground truth refuses the plan at its cap: %s",
                     req.work.response_len, eb);
        if (ra != 0)
            fail_msg("response %.4f: the ground truth accepts a plan at %.0f bytes on a cap of "
                     "%.0f, the search found none: %s",
                     req.work.response_len, persist + trans, cap, ea);
        assert_true(fabs(a.step_s - b.step_s) <= 1e-9 * b.step_s);
    }
    assert_true(found > 0);
}

/* A plan whose persistent state leaves less than the transitions' staging
 * reserve (2 chunks, docs/transitions.md "Memory") under the cap cannot be moved
 * from or to: nrs_emu_transition refuses it before anything moves. A workload
 * whose transients are below the reserve let the planner pick such a plan
 * (tp = 1, its state within a few MiB of the cap); the planner must count the
 * reserve and take one whose transitions run (pp = 2 here). */
static void test_plan_leaves_transition_reserve(void **st)
{
    (void)st;
    nrs_spec_t s;
    nrs_plan_req_t req;
    nrs_plan_t p;
    nrs_emu_graph_t *g = NULL;
    nrs_layout_t l1 = {1, 1, 1, 1};
    char err[NRS_ERR_MAX];
    spec_one_gpu(&s);
    s.cluster.gpus_per_node = 2;
    s.models[NRS_ROLE_ACTOR].vocab = 1024;
    s.workload.global_batch = 2;
    s.workload.prompt_len = s.workload.response_len = 16;
    s.runtime.zero1 = false;
    nrs_plan_req_init(&req, &s);
    double persist = nrs_cost_persist_bytes(&s, NRS_ROLE_ACTOR, &l1);
    double trans = least_peak_transient(&s, &req.work);
    assert_true(trans < 4 << 20); /* well below the reserve */
    s.cluster.gpu_mem_gib = (persist + trans + (8 << 20)) / (1024.0 * 1024.0 * 1024.0);
    plan_ok(&s, 2, NRS_PLAN_BEST, &p);
    print_message("plan: actor tp %d pp %d dp %d, generate tp %d; state %.0f of %.0f bytes\n",
                  p.layout[NRS_MS_ACTOR_TRAIN].tp, p.layout[NRS_MS_ACTOR_TRAIN].pp,
                  p.layout[NRS_MS_ACTOR_TRAIN].dp, p.layout[NRS_MS_ACTOR_GENERATE].tp,
                  nrs_cost_persist_bytes(&s, NRS_ROLE_ACTOR, &p.layout[NRS_MS_ACTOR_TRAIN]),
                  p.capacity_bytes);
    int rc = nrs_emu_transition(&s, &p, &p, NULL, &g, err, sizeof(err));
    nrs_emu_graph_free(g);
    if (rc != 0)
        fail_msg("the planner's plan cannot be moved from: %s", err);
}

static void test_eval_rejects_bad_plans(void **st)
{
    (void)st;
    nrs_spec_t s;
    nrs_plan_t p, q;
    nrs_work_t w;
    char err[NRS_ERR_MAX];
    spec_8b(&s, 1);
    plan_ok(&s, 8, NRS_PLAN_BEST, &p);
    nrs_work_from_spec(&s, &w);
    q = p;
    q.layout[NRS_MS_ACTOR_TRAIN].dp = 100;
    assert_int_equal(nrs_plan_eval(&s, &w, NULL, &q, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "exceeds its pool"));
    q = p;
    q.layout[NRS_MS_ACTOR_INFER].tp = q.layout[NRS_MS_ACTOR_TRAIN].tp == 1 ? 2 : 1;
    assert_int_equal(nrs_plan_eval(&s, &w, NULL, &q, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "must share pool"));
    q = p;
    q.pools[0].gpus = 4;
    assert_int_equal(nrs_plan_eval(&s, &w, NULL, &q, err, sizeof(err)), -1);
    q = p;
    s.cluster.gpu_mem_gib = 20;
    assert_int_equal(nrs_plan_eval(&s, &w, NULL, &q, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "GiB usable"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_brute_grpo_min),
        cmocka_unit_test(test_brute_grpo_ref),
        cmocka_unit_test(test_brute_ppo),
        cmocka_unit_test(test_infeasible_reason),
        cmocka_unit_test(test_tight_memory_names_stage),
        cmocka_unit_test(test_more_gpus_never_slower),
        cmocka_unit_test(test_longer_response_never_faster),
        cmocka_unit_test(test_fixed_never_better),
        cmocka_unit_test(test_fixed_keeps_tp_pp),
        cmocka_unit_test(test_template),
        cmocka_unit_test(test_deterministic),
        cmocka_unit_test(test_eval_rejects_bad_plans),
        cmocka_unit_test(test_colocated_gen_weights),
        cmocka_unit_test(test_samples_near_int_max),
        cmocka_unit_test(test_search_and_eval_agree_at_cap),
        cmocka_unit_test(test_plan_leaves_transition_reserve),
    };
    return cmocka_run_group_tests_name("plan", tests, NULL, NULL);
}
