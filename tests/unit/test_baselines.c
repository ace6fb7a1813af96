/* The modelled baselines of the simulator (docs/baselines.md): the shape of
 * their plans (pools, tp, dp) at several sizes, nereus against them on the
 * shipped shape traces, oracle below all, and the cost-model switches they set
 * moving times in the documented direction. MODELLED, not runs of those
 * systems. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "fixtures.h"
#include "sim/sim.h"

static void hints_like_example(nrs_spec_t *s)
{
    /* examples/ppo-llama3-8b.yaml's layout hints. */
    s->models[NRS_ROLE_ACTOR].init_generate = (nrs_tp_pp_t){2, 1};
    for (int r = 0; r < NRS_ROLE_COUNT; r++) {
        s->models[r].init_infer = (nrs_tp_pp_t){2, 1};
        s->models[r].init_train = (nrs_tp_pp_t){4, 1};
    }
}

static void pool_is(const nrs_plan_t *p, int i, int first, int gpus)
{
    if (p->pools[i].first_gpu != first || p->pools[i].gpus != gpus)
        fail_msg("pool %d is GPUs %d+%d, expected %d+%d", i, p->pools[i].first_gpu,
                 p->pools[i].gpus, first, gpus);
}

static void layout_is(const nrs_plan_t *p, nrs_ms_t ms, int pool, int tp, int pp, int dp)
{
    const nrs_layout_t *l = &p->layout[ms];
    if (!p->has[ms] || p->pool_of[ms] != pool || l->tp != tp || l->pp != pp || l->dp != dp)
        fail_msg("%s: pool %d %dx%dx%d, expected pool %d %dx%dx%d", nrs_ms_name(ms),
                 p->pool_of[ms], l->tp, l->pp, l->dp, pool, tp, pp, dp);
}

/* Pools are contiguous, whole nodes from 4 nodes on, and no tp group leaves a
 * node. */
static void check_placement(const nrs_spec_t *s, const nrs_plan_t *p)
{
    int gpn = s->cluster.gpus_per_node, next = 0;
    for (int i = 0; i < p->npools; i++) {
        assert_int_equal(p->pools[i].first_gpu, next);
        next += p->pools[i].gpus;
        if (p->total_gpus >= 4 * gpn)
            assert_int_equal(p->pools[i].gpus % gpn, 0);
    }
    assert_int_equal(next, p->total_gpus);
    for (int ms = 0; ms < NRS_MS_COUNT; ms++) {
        if (!p->has[ms])
            continue;
        int tp = p->layout[ms].tp;
        assert_int_equal(gpn % tp, 0);
        assert_int_equal(p->pools[p->pool_of[ms]].first_gpu % tp, 0);
    }
}

static void plan_of(const nrs_spec_t *s, nrs_sim_policy_t pol, int gpus, nrs_plan_t *p)
{
    nrs_work_t w;
    nrs_spec_t b;
    char err[NRS_ERR_MAX];
    nrs_work_from_spec(s, &w);
    if (nrs_sim_baseline_plan(s, pol, gpus, &w, p, err, sizeof(err)) != 0)
        fail_msg("%s on %d GPUs: %s", nrs_sim_policy_name(pol), gpus, err);
    assert_int_equal(p->total_gpus, gpus);
    check_placement(s, p);
    /* The ground truth agrees: valid and fits on every pool in every phase. */
    nrs_plan_t q = *p;
    nrs_sim_baseline_spec(s, pol, &b);
    if (nrs_plan_eval(&b, &w, NULL, &q, err, sizeof(err)) != 0)
        fail_msg("%s: %s", nrs_sim_policy_name(pol), err);
    assert_true(fabs(q.step_s - p->step_s) <= 1e-9 * p->step_s);
}

static void test_openrlhf_shape(void **st)
{
    (void)st;
    nrs_spec_t s, b;
    nrs_plan_t p;
    char err[NRS_ERR_MAX];
    spec_8b(&s, 1);
    hints_like_example(&s);
    nrs_sim_baseline_spec(&s, NRS_SIM_OPENRLHF, &b);
    assert_true(b.runtime.zero3 && b.runtime.offload_optimizer && b.runtime.recompute);
    assert_int_equal(b.runtime.weight_sync, NRS_WSYNC_BROADCAST);
    assert_false(s.runtime.zero3); /* the user's spec is untouched */

    /* 8 GPUs, the script's shape: vLLM 2 engines x tp 2, actor+ref on 2,
     * critic+reward on 2, DeepSpeed data parallel (tp 1). */
    plan_of(&s, NRS_SIM_OPENRLHF, 8, &p);
    assert_int_equal(p.npools, 3);
    pool_is(&p, 0, 0, 4);
    pool_is(&p, 1, 4, 2);
    pool_is(&p, 2, 6, 2);
    layout_is(&p, NRS_MS_ACTOR_GENERATE, 0, 2, 1, 2);
    layout_is(&p, NRS_MS_ACTOR_TRAIN, 1, 1, 1, 2);
    layout_is(&p, NRS_MS_ACTOR_INFER, 1, 1, 1, 2);
    layout_is(&p, NRS_MS_REF_INFER, 1, 1, 1, 2);
    layout_is(&p, NRS_MS_CRITIC_TRAIN, 2, 1, 1, 2);
    layout_is(&p, NRS_MS_REWARD_INFER, 2, 1, 1, 2);
    /* Two nodes: below 4 nodes the shares are in GPUs. */
    plan_of(&s, NRS_SIM_OPENRLHF, 16, &p);
    pool_is(&p, 0, 0, 8);
    pool_is(&p, 1, 8, 4);
    pool_is(&p, 2, 12, 4);
    /* 4, 5 and 16 nodes: whole nodes, gen 1/2, actor+ref 1/4, critic+reward the rest. */
    plan_of(&s, NRS_SIM_OPENRLHF, 32, &p);
    pool_is(&p, 0, 0, 16);
    pool_is(&p, 1, 16, 8);
    pool_is(&p, 2, 24, 8);
    layout_is(&p, NRS_MS_ACTOR_GENERATE, 0, 2, 1, 8);
    layout_is(&p, NRS_MS_ACTOR_TRAIN, 1, 1, 1, 8);
    plan_of(&s, NRS_SIM_OPENRLHF, 40, &p);
    pool_is(&p, 0, 0, 24);
    pool_is(&p, 1, 24, 8);
    pool_is(&p, 2, 32, 8);
    plan_of(&s, NRS_SIM_OPENRLHF, 128, &p);
    pool_is(&p, 0, 0, 64);
    pool_is(&p, 1, 64, 32);
    pool_is(&p, 2, 96, 32);
    layout_is(&p, NRS_MS_ACTOR_GENERATE, 0, 2, 1, 32);
    layout_is(&p, NRS_MS_CRITIC_TRAIN, 2, 1, 1, 32);
    /* No generate hint: the script's vLLM tp 2. */
    s.models[NRS_ROLE_ACTOR].init_generate = (nrs_tp_pp_t){0, 0};
    plan_of(&s, NRS_SIM_OPENRLHF, 32, &p);
    layout_is(&p, NRS_MS_ACTOR_GENERATE, 0, 2, 1, 8);
    /* GRPO with a rule reward: no third pool, the actor's pool takes the rest. */
    s.algorithm = (nrs_algorithm_t){NRS_ALGO_GRPO, false, true};
    s.models[NRS_ROLE_CRITIC].present = s.models[NRS_ROLE_REWARD].present = false;
    s.workload.samples_per_prompt = 4;
    s.workload.global_batch = 64;
    plan_of(&s, NRS_SIM_OPENRLHF, 8, &p);
    assert_int_equal(p.npools, 2);
    pool_is(&p, 0, 0, 4);
    pool_is(&p, 1, 4, 4);
    layout_is(&p, NRS_MS_ACTOR_TRAIN, 1, 1, 1, 4);
    assert_false(p.has[NRS_MS_CRITIC_TRAIN] || p.has[NRS_MS_REWARD_INFER]);
    /* Too small for its pools. */
    spec_8b(&s, 1);
    assert_int_equal(nrs_sim_baseline_template(&s, NRS_SIM_OPENRLHF, 2, &p, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "at least 4 GPUs"));
}

static void test_verl_shape(void **st)
{
    (void)st;
    nrs_spec_t s, b;
    nrs_plan_t p;
    spec_8b(&s, 1);
    hints_like_example(&s);
    s.runtime.recompute = true;
    nrs_sim_baseline_spec(&s, NRS_SIM_VERL, &b);
    assert_false(b.runtime.zero3 || b.runtime.offload_optimizer);
    assert_true(b.runtime.zero1 && b.runtime.recompute); /* the spec's own */
    assert_int_equal(b.runtime.weight_sync, NRS_WSYNC_RESHARD);
    s.runtime.recompute = false;
    /* One pool of every GPU; training tp 4, rollout tp 2 (divides 4), ref and
     * reward at their infer hints; dp fills the pool. */
    for (int g = 8; g <= 128; g *= 4) {
        plan_of(&s, NRS_SIM_VERL, g, &p);
        assert_int_equal(p.npools, 1);
        pool_is(&p, 0, 0, g);
        layout_is(&p, NRS_MS_ACTOR_GENERATE, 0, 2, 1, g / 2);
        layout_is(&p, NRS_MS_ACTOR_TRAIN, 0, 4, 1, g / 4);
        layout_is(&p, NRS_MS_ACTOR_INFER, 0, 4, 1, g / 4);
        layout_is(&p, NRS_MS_CRITIC_TRAIN, 0, 4, 1, g / 4);
        layout_is(&p, NRS_MS_REF_INFER, 0, 2, 1, g / 2);
        layout_is(&p, NRS_MS_REWARD_INFER, 0, 2, 1, g / 2);
        /* Resharded in place over NVLink: tp 4 -> 2 inside a node. */
        assert_true(p.sync_s > 0 && p.sync_s < 0.1);
    }
    /* Rollout tp: the largest divisor of the training tp not above the hint. */
    s.models[NRS_ROLE_ACTOR].init_generate = (nrs_tp_pp_t){8, 1};
    plan_of(&s, NRS_SIM_VERL, 32, &p);
    layout_is(&p, NRS_MS_ACTOR_GENERATE, 0, 4, 1, 8);
    assert_true(p.sync_s == 0); /* same tp: generation reads the weights in place */
    s.models[NRS_ROLE_ACTOR].init_generate = (nrs_tp_pp_t){3, 1};
    plan_of(&s, NRS_SIM_VERL, 32, &p);
    layout_is(&p, NRS_MS_ACTOR_GENERATE, 0, 2, 1, 16);
    /* Training hints but no rollout hint: the rollout runs at the training
     * tp (docs/baselines.md), not at the fixed baseline's generation tp
     * (2 here, for short responses on one node). */
    spec_8b(&s, 1);
    s.workload.response_len = 128;
    for (int r = 0; r < NRS_ROLE_COUNT; r++)
        s.models[r].init_infer = s.models[r].init_train = (nrs_tp_pp_t){4, 1};
    plan_of(&s, NRS_SIM_VERL, 8, &p);
    layout_is(&p, NRS_MS_ACTOR_TRAIN, 0, 4, 1, 2);
    layout_is(&p, NRS_MS_ACTOR_GENERATE, 0, 4, 1, 2);
    /* No hints at all: the fixed baseline's initial choice, rollout tp still
     * dividing the training tp. */
    spec_8b(&s, 4);
    plan_of(&s, NRS_SIM_VERL, 64, &p);
    assert_int_equal(p.npools, 1);
    assert_int_equal(p.layout[NRS_MS_ACTOR_TRAIN].tp % p.layout[NRS_MS_ACTOR_GENERATE].tp, 0);
    assert_int_equal(p.layout[NRS_MS_ACTOR_GENERATE].pp, 1);
}

/* ---- nereus against them on the shipped shape traces --------------------- */

static const char *src(const char *rel)
{
    static char path[4][512];
    static int k;
    const char *d = getenv("NRS_SRCDIR");
    k = (k + 1) % 4;
    snprintf(path[k], sizeof(path[k]), "%s/%s", d && *d ? d : ".", rel);
    return path[k];
}

static void test_shape_traces(void **st)
{
    (void)st;
    static const char *const traces[] = {"examples/traces/shape-8.trace",
                                         "examples/traces/shape-32.trace",
                                         "examples/traces/shape-128.trace"};
    static const nrs_sim_policy_t pols[] = {NRS_SIM_NEREUS, NRS_SIM_ORACLE, NRS_SIM_OPENRLHF,
                                            NRS_SIM_VERL};
    nrs_spec_t s;
    char err[NRS_ERR_MAX];
    if (nrs_spec_load(src("examples/ppo-llama3-8b.yaml"), &s, err, sizeof(err)) != 0)
        fail_msg("%s", err);
    for (size_t i = 0; i < sizeof(traces) / sizeof(traces[0]); i++) {
        nrs_trace_t t;
        nrs_sim_summary_t m[NRS_SIM_POLICY_COUNT];
        if (nrs_trace_load(src(traces[i]), &s, &t, err, sizeof(err)) != 0)
            fail_msg("%s", err);
        for (size_t k = 0; k < sizeof(pols) / sizeof(pols[0]); k++) {
            nrs_sim_policy_t p = pols[k];
            if (nrs_sim_run(&s, &t, p, NULL, NULL, &m[p], err, sizeof(err)) != 0)
                fail_msg("%s: %s", nrs_sim_policy_name(p), err);
            if (m[p].infeasible_step >= 0)
                fail_msg("%s stopped: %s", nrs_sim_policy_name(p), m[p].infeasible_why);
            assert_int_equal(m[p].steps, t.steps);
        }
        const nrs_sim_summary_t *n = &m[NRS_SIM_NEREUS], *o = &m[NRS_SIM_ORACLE];
        print_message("%s: nereus %.3f s, openrlhf-like %.3f s (%.2fx), verl-like %.3f s (%.2fx)\n",
                      traces[i], n->mean_step_s, m[NRS_SIM_OPENRLHF].mean_step_s,
                      m[NRS_SIM_OPENRLHF].mean_step_s / n->mean_step_s, m[NRS_SIM_VERL].mean_step_s,
                      m[NRS_SIM_VERL].mean_step_s / n->mean_step_s);
        for (size_t k = 0; k < sizeof(pols) / sizeof(pols[0]); k++) {
            const nrs_sim_summary_t *x = &m[pols[k]];
            assert_true(n->mean_step_s <= x->mean_step_s * (1 + 1e-12));
            assert_true(n->total_s <= x->total_s * (1 + 1e-12));
            assert_true(o->total_s <= x->total_s * (1 + 1e-12));
            assert_true(o->mean_step_s <= x->mean_step_s * (1 + 1e-12));
        }
        nrs_trace_free(&t);
    }
}

/* A resize restarts a modelled baseline from its checkpoint. */
static void test_resize_restarts(void **st)
{
    (void)st;
    static const char text[] = "nereus-trace 1\nsteps 12\nnoise 0\ncheckpoint 300\n"
                               "gpus 0 32\ngpus 6 64\n";
    char path[] = "/tmp/nrs-test-baselines-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    FILE *f = fdopen(fd, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    nrs_spec_t s;
    nrs_trace_t t;
    nrs_sim_summary_t m;
    char err[NRS_ERR_MAX];
    spec_8b(&s, 4);
    hints_like_example(&s);
    assert_int_equal(nrs_trace_load(path, &s, &t, err, sizeof(err)), 0);
    remove(path);
    for (int p = NRS_SIM_OPENRLHF; p <= NRS_SIM_VERL; p++) {
        assert_int_equal(nrs_sim_run(&s, &t, (nrs_sim_policy_t)p, NULL, NULL, &m, err, sizeof(err)), 0);
        assert_int_equal(m.infeasible_step, -1);
        assert_int_equal(m.transitions, 1);
        assert_true(m.transition_s == 300);
        assert_int_equal(m.checkpoints, 1); /* the restart is reported as one */
    }
    nrs_trace_free(&t);
}

/* ---- the switches the baselines set move times the documented way -------- */

static double stage_time(const nrs_spec_t *s, nrs_ms_t ms, const nrs_plan_t *p,
                         nrs_stage_cost_t *c)
{
    nrs_work_t w;
    nrs_work_from_spec(s, &w);
    assert_int_equal(nrs_cost_stage(s, ms, &p->layout[ms], &w, NULL, c), 0);
    return c->time_s;
}

static void test_switch_directions(void **st)
{
    (void)st;
    nrs_spec_t s, b, x;
    nrs_plan_t p;
    nrs_stage_cost_t on, off;
    spec_8b(&s, 1);
    hints_like_example(&s);
    plan_of(&s, NRS_SIM_OPENRLHF, 8, &p);
    nrs_sim_baseline_spec(&s, NRS_SIM_OPENRLHF, &b);
    const nrs_layout_t *tr = &p.layout[NRS_MS_ACTOR_TRAIN], *gn = &p.layout[NRS_MS_ACTOR_GENERATE];

    /* Broadcast on one node: ZeRO-3 gather of half of W over NVLink, W broadcast
     * over NVLink, 291 tensors x 10 ms, 5 ms: far above resharding pool to pool. */
    x = b;
    x.runtime.weight_sync = NRS_WSYNC_RESHARD;
    double P = nrs_cost_params(&s.models[NRS_ROLE_ACTOR]), W = 2 * P;
    double bc = nrs_cost_sync_s(&b, tr, gn, 0, NULL), rs = nrs_cost_sync_s(&x, tr, gn, 0, NULL);
    assert_true(fabs(bc - (W / 2 / 450e9 + W / 450e9 + 291 * 10e-3 + 5e-3)) <= 1e-9);
    assert_true(bc > 10 * rs);
    assert_true(fabs(p.sync_s - bc) <= 1e-12);

    /* Offload: CPU Adam is slower than the HBM-bound GPU step; it frees the 12
     * optimizer bytes of this rank's half of the parameters. */
    x = b;
    x.runtime.offload_optimizer = false;
    double t_on = stage_time(&b, NRS_MS_ACTOR_TRAIN, &p, &on);
    double t_off = stage_time(&x, NRS_MS_ACTOR_TRAIN, &p, &off);
    assert_true(t_on > t_off && on.memory_s > off.memory_s && on.compute_s == off.compute_s);
    assert_true(fabs(nrs_cost_persist_bytes(&x, NRS_ROLE_ACTOR, tr) -
                     nrs_cost_persist_bytes(&b, NRS_ROLE_ACTOR, tr) - 12 * P / 2) <= 1e-3 * P);

    /* ZeRO-3 halves the weights and gradients over dp = 2 (with offload: 4P
     * on the GPU becomes 2P) and adds per-micro-batch gathers. */
    x = b;
    x.runtime.zero3 = false;
    assert_true(fabs(nrs_cost_persist_bytes(&x, NRS_ROLE_ACTOR, tr) - 4 * P) <= 1e-3 * P);
    assert_true(fabs(nrs_cost_persist_bytes(&b, NRS_ROLE_ACTOR, tr) - 2 * P) <= 1e-3 * P);
    stage_time(&x, NRS_MS_ACTOR_TRAIN, &p, &off);
    assert_true(on.comm_s > off.comm_s);

    /* Gradient checkpointing: one more forward, x 4/3 the FLOPs. */
    x = b;
    x.runtime.recompute = false;
    stage_time(&x, NRS_MS_ACTOR_TRAIN, &p, &off);
    assert_true(fabs(on.compute_s - off.compute_s * 4 / 3) <= 1e-9 * on.compute_s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_openrlhf_shape),
        cmocka_unit_test(test_verl_shape),
        cmocka_unit_test(test_shape_traces),
        cmocka_unit_test(test_resize_restarts),
        cmocka_unit_test(test_switch_directions),
    };
    return cmocka_run_group_tests_name("baselines", tests, NULL, NULL);
}
