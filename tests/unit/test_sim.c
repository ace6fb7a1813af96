/* Simulator tests: the trace loader's errors, and the policies' ordering on
 * small traces (oracle a lower bound; nereus no worse than fixed), determinism,
 * and the adaptation loop's forced move on node loss. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "adapt/adapt.h"
#include "fixtures.h"
#include "sim/sim.h"

static char tmpdir[] = "/tmp/nrs-test-sim-XXXXXX";

static const char *write_trace(const char *name, const char *text)
{
    static char path[512];
    snprintf(path, sizeof(path), "%s/%s", tmpdir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    return path;
}

/* The trace text as file name in tmpdir, loaded for s: it must load. */
static void load_trace(const nrs_spec_t *s, nrs_trace_t *t, const char *name, const char *text)
{
    char err[NRS_ERR_MAX];
    if (nrs_trace_load(write_trace(name, text), s, t, err, sizeof(err)) != 0)
        fail_msg("%s: %s", name, err);
}

static void expect_error(const char *text, const char *where, const char *what)
{
    nrs_spec_t s;
    nrs_trace_t t;
    char err[NRS_ERR_MAX];
    spec_8b(&s, 1);
    const char *p = write_trace("bad.trace", text);
    assert_int_equal(nrs_trace_load(p, &s, &t, err, sizeof(err)), -1);
    if (!strstr(err, where) || !strstr(err, what))
        fail_msg("error '%s' lacks '%s' or '%s'", err, where, what);
}

static void test_trace_errors(void **st)
{
    (void)st;
    expect_error("", "bad.trace:", "empty trace");
    {   /* a directory opens but does not read: say so, not "empty trace" */
        nrs_spec_t s;
        nrs_trace_t t;
        char err[NRS_ERR_MAX];
        spec_8b(&s, 1);
        assert_int_equal(nrs_trace_load(tmpdir, &s, &t, err, sizeof(err)), -1);
        if (!strstr(err, "cannot read: Is a directory"))
            fail_msg("error '%s' for a directory", err);
    }
    expect_error("steps 10\n", "bad.trace:1:1:", "expected 'nereus-trace 1'");
    expect_error("nereus-trace 1\nseed 3\n", "bad.trace:", "missing 'steps'");
    expect_error("nereus-trace 1\nsteps 0\n", "bad.trace:2:7:", "not a number in [1, 1e+06]");
    expect_error("nereus-trace 1\nsteps 10\nfrobnicate 3\n", "bad.trace:3:1:", "unknown directive");
    expect_error("nereus-trace 1\nsteps 10\ngpus 3\n", "bad.trace:3:1:", "takes 2 arguments, got 1");
    expect_error("nereus-trace 1\nsteps 10\ngpus 20 8\n", "bad.trace:3:6:", "not a number in [0, 9]");
    expect_error("nereus-trace 1\nsteps 10\ngpus 2 12\n", "bad.trace:3:8:", "whole number of nodes");
    expect_error("nereus-trace 1\nsteps 10\ntrue actor.frob 2\n", "bad.trace:3:6:", "unknown model-stage");
    expect_error("nereus-trace 1\nsteps 10\nnoise 1e999\n", "bad.trace:3:7:", "not a number");
    expect_error("nereus-trace 1\ngpus 2 8\nsteps 10\n", "bad.trace:2:1:", "'steps' must come before");
    expect_error("nereus-trace 1\nsteps 10\nramp 5 2 100 200\n", "bad.trace:3:8:", "not a number in [5, 10]");
    expect_error("nereus-trace 1\nsteps 10\nresponse 1 2.5x\n", "bad.trace:3:12:", "'2.5x' is not a number");
    /* a second 'steps' would drop the events past it without a word */
    expect_error("nereus-trace 1\nsteps 10\ngpus 8 16\nsteps 5\n", "bad.trace:4:1:",
                 "'steps' given twice");
    expect_error("nereus-trace 1\nsteps 0x10\n", "bad.trace:2:7:", "'0x10' is not a number");
    expect_error("nereus-trace 1\nsteps 10\nseed 1.5\n", "bad.trace:3:6:", "expected an integer");
}

/* A failure the job cannot take is found while simulating: the error names
 * the trace line. */
static void test_trace_event_error_line(void **st)
{
    (void)st;
    nrs_spec_t s;
    nrs_trace_t t;
    nrs_sim_summary_t m;
    char err[NRS_ERR_MAX];
    spec_8b(&s, 4);
    load_trace(&s, &t, "fail.trace", "nereus-trace 1\nsteps 10\n"
                                      "gpus 0 32\n# node 7 of 4\nfail 3 7\n");
    assert_int_equal(nrs_sim_run(&s, &t, NRS_SIM_NEREUS, NULL, NULL, &m, err, sizeof(err)), -1);
    if (!strstr(err, "fail.trace:5:8:") || !strstr(err, "node 7 cannot fail"))
        fail_msg("error '%s' lacks the trace line", err);
    nrs_trace_free(&t);
}

static void test_trace_loads(void **st)
{
    (void)st;
    nrs_spec_t s;
    nrs_trace_t t;
    char err[NRS_ERR_MAX];
    spec_8b(&s, 4);
    const char *p = write_trace("ok.trace", "# a trace\nnereus-trace 1\nsteps 11  # eleven\n"
                                            "true actor.train 0.5\ntrue sync 2\n"
                                            "ramp 0 10 100 200\nresponse 8 999\n"
                                            "memory 3\ngpus 5 16\ngpus 0 64\nfail 2 1\n");
    assert_int_equal(nrs_trace_load(p, &s, &t, err, sizeof(err)), 0);
    assert_int_equal(t.steps, 11);
    assert_int_equal(t.initial_gpus, 64);
    assert_true(t.truth.stage[NRS_MS_ACTOR_TRAIN] == 0.5 && t.truth.sync == 2);
    assert_true(t.truth.stage[NRS_MS_ACTOR_GENERATE] == 1);
    assert_true(t.response[0] == 100 && t.response[5] == 150 && t.response[7] == 170);
    assert_true(t.response[8] == 999 && t.response[10] == 999);
    assert_int_equal(t.nevents, 3); /* sorted by step */
    assert_int_equal(t.events[0].kind, NRS_EV_FAIL);
    assert_int_equal(t.events[1].kind, NRS_EV_MEMORY);
    assert_int_equal(t.events[2].kind, NRS_EV_GPUS);
    assert_int_equal(t.events[2].value, 16);
    nrs_trace_free(&t);
}

static const char small_trace[] =
    "nereus-trace 1\nsteps 80\nseed 3\nnoise 0.05\ntrue actor.generate 1.3\n"
    "true actor.train 0.8\ntrue sync 1.5\nramp 0 79 512 4096\ngpus 0 32\ngpus 30 64\nfail 60 1\n";

static void test_policy_ordering(void **st)
{
    (void)st;
    nrs_spec_t s;
    nrs_trace_t t;
    nrs_sim_summary_t m[NRS_SIM_POLICY_COUNT];
    char err[NRS_ERR_MAX];
    spec_8b(&s, 4);
    s.workload.steps = 80;
    /* The example spec's initial layouts: what the fixed baseline keeps. */
    s.models[NRS_ROLE_ACTOR].init_generate = (nrs_tp_pp_t){2, 1};
    for (int r = 0; r < NRS_ROLE_COUNT; r++) {
        s.models[r].init_infer = (nrs_tp_pp_t){2, 1};
        s.models[r].init_train = (nrs_tp_pp_t){4, 1};
    }
    load_trace(&s, &t, "small.trace", small_trace);
    for (int p = 0; p < NRS_SIM_POLICY_COUNT; p++) {
        if (nrs_sim_run(&s, &t, (nrs_sim_policy_t)p, NULL, NULL, &m[p], err, sizeof(err)) != 0)
            fail_msg("%s: %s", nrs_sim_policy_name((nrs_sim_policy_t)p), err);
        if (m[p].infeasible_step >= 0)
            fail_msg("%s stopped at step %d: %s", nrs_sim_policy_name((nrs_sim_policy_t)p),
                     m[p].infeasible_step, m[p].infeasible_why);
        assert_int_equal(m[p].steps, 80);
        print_message("%-12s mean %.3f s total %.1f s, %d transitions (%.3f%%)\n",
                      nrs_sim_policy_name((nrs_sim_policy_t)p), m[p].mean_step_s, m[p].total_s,
                      m[p].transitions, 100 * m[p].transition_share);
    }
    for (int p = 0; p < NRS_SIM_POLICY_COUNT; p++) /* oracle bounds every policy */
        assert_true(m[NRS_SIM_ORACLE].total_s <= m[p].total_s * (1 + 1e-12));
    assert_true(m[NRS_SIM_STATIC_BEST].total_s <= m[NRS_SIM_FIXED].total_s * (1 + 1e-12));
    assert_true(m[NRS_SIM_NEREUS].total_s <= m[NRS_SIM_FIXED].total_s);
    /* Growing responses on more GPUs: re-planning tp/pp pays off. */
    assert_true(m[NRS_SIM_NEREUS].mean_step_s < 0.9 * m[NRS_SIM_FIXED].mean_step_s);
    assert_true(m[NRS_SIM_NEREUS].transitions >= 2); /* the expansion and the failure */
    assert_true(m[NRS_SIM_NEREUS].forced >= 1);      /* the failure forces a move */
    /* Calibration learned the hidden factors: prediction error well below
     * the uncalibrated model's. */
    assert_true(m[NRS_SIM_NEREUS].pred_err < m[NRS_SIM_FIXED].pred_err / 2);
    nrs_trace_free(&t);
}

typedef struct {
    uint64_t h;
    int n;
} digest_t;

static void digest(const nrs_sim_row_t *row, void *arg)
{
    digest_t *d = arg;
    double v[3] = {row->step_s, row->transition_s, row->predicted_s};
    const unsigned char *b = (const unsigned char *)v;
    for (size_t i = 0; i < sizeof(v); i++)
        d->h = (d->h ^ b[i]) * 1099511628211ULL;
    d->h ^= row->epoch;
    d->n++;
}

static void test_deterministic(void **st)
{
    (void)st;
    nrs_spec_t s;
    nrs_trace_t t;
    nrs_sim_summary_t m;
    digest_t a = {14695981039346656037ULL, 0}, b = a;
    char err[NRS_ERR_MAX];
    spec_8b(&s, 2);
    load_trace(&s, &t, "small.trace", small_trace);
    assert_int_equal(nrs_sim_run(&s, &t, NRS_SIM_NEREUS, digest, &a, &m, err, sizeof(err)), 0);
    assert_int_equal(nrs_sim_run(&s, &t, NRS_SIM_NEREUS, digest, &b, &m, err, sizeof(err)), 0);
    assert_int_equal(a.n, 80);
    assert_true(a.h == b.h);
    nrs_trace_free(&t);
}

/* The horizon of the simulated job is capped by the trace's steps left, not
 * by the spec's workload.steps: a trace longer than the spec must still
 * admit paying moves after the spec's last step, and a shorter one must not
 * amortize a move over steps that never run. */
typedef struct {
    int step;
    double horizon;
    bool changed;
} horizon_at_t;

static void note_horizon(const nrs_sim_row_t *row, void *arg)
{
    horizon_at_t *h = arg;
    const char *x = row->why ? strstr(row->why, "horizon ") : NULL;
    if (row->step == h->step && x) {
        h->horizon = atof(x + strlen("horizon "));
        h->changed = row->transition;
    }
}

static void test_horizon_from_trace(void **st)
{
    (void)st;
    nrs_spec_t s;
    nrs_trace_t t;
    nrs_sim_summary_t m;
    char err[NRS_ERR_MAX];
    spec_8b(&s, 4);
    load_trace(&s, &t, "grow.trace", "nereus-trace 1\nsteps 40\n"
                                      "gpus 0 32\ngpus 30 64\n");
    int spec_steps[2] = {10, 1000};
    for (int i = 0; i < 2; i++) {
        horizon_at_t h = {30, -1, false};
        s.workload.steps = spec_steps[i];
        assert_int_equal(nrs_sim_run(&s, &t, NRS_SIM_NEREUS, note_horizon, &h, &m, err,
                                     sizeof(err)), 0);
        print_message("spec steps %d: horizon %.0f at step 30, moved %d\n", spec_steps[i],
                      h.horizon, h.changed);
        assert_true(h.horizon == 10); /* 40 - 30: the first change of the run */
        assert_true(h.changed);       /* 32 -> 64 GPUs pays within 10 steps */
    }
    nrs_trace_free(&t);
}

/* Events of one step count nodes in the numbering the ones before them
 * left: node 0 failing twice is the first two nodes, the same as node 1 then
 * node 0, not one node's state lost for two nodes' GPUs. */
static void rows_of(const nrs_sim_row_t *row, void *arg)
{
    double *v = arg;
    v[2 * row->step] = row->step_s;
    v[2 * row->step + 1] = row->transition_s;
}

static void test_same_step_events(void **st)
{
    (void)st;
    nrs_spec_t s;
    nrs_trace_t t;
    nrs_sim_summary_t m;
    char err[NRS_ERR_MAX];
    const char *traces[2] = {"nereus-trace 1\nsteps 8\ngpus 0 24\nfail 5 0\nfail 5 0\n",
                             "nereus-trace 1\nsteps 8\ngpus 0 24\nfail 5 1\nfail 5 0\n"};
    double v[2][16];
    spec_8b(&s, 3);
    s.runtime.zero1 = false; /* every shard has a replica: no checkpoint */
    for (int i = 0; i < 2; i++) {
        load_trace(&s, &t, "same.trace", traces[i]);
        if (nrs_sim_run(&s, &t, NRS_SIM_NEREUS, rows_of, v[i], &m, err, sizeof(err)) != 0)
            fail_msg("%s", err);
        assert_int_equal(m.steps, 8);
        nrs_trace_free(&t);
    }
    print_message("transition at step 5: %.6f s and %.6f s\n", v[0][11], v[1][11]);
    assert_true(v[0][11] > 0);
    for (int k = 0; k < 16; k++)
        assert_true(v[0][k] == v[1][k]);
}

/* A spec larger than any run (8M GPUs) with a failure at step 0: stopped
 * there, as the planner would, before the events are numbered. */
static void test_too_many_gpus(void **st)
{
    (void)st;
    nrs_spec_t s;
    nrs_trace_t t;
    nrs_sim_summary_t m;
    char err[NRS_ERR_MAX];
    spec_8b(&s, 1 << 20);
    load_trace(&s, &t, "huge.trace", "nereus-trace 1\nsteps 3\nfail 0 1\n");
    assert_int_equal(nrs_sim_run(&s, &t, NRS_SIM_FIXED, NULL, NULL, &m, err, sizeof(err)), 0);
    assert_int_equal(m.infeasible_step, 0);
    assert_non_null(strstr(m.infeasible_why, "out of range"));
    nrs_trace_free(&t);
}

/* The fixed baseline pays a checkpoint restore when a node loss leaves
 * ZeRO-1 shards on no survivor, and the summary counts it. */
static void test_fixed_counts_restores(void **st)
{
    (void)st;
    nrs_spec_t s;
    nrs_trace_t t;
    nrs_sim_summary_t m;
    char err[NRS_ERR_MAX];
    spec_8b(&s, 3);
    load_trace(&s, &t, "restore.trace", "nereus-trace 1\nsteps 8\n"
                                         "checkpoint 300\nfail 5 0\n");
    if (nrs_sim_run(&s, &t, NRS_SIM_FIXED, NULL, NULL, &m, err, sizeof(err)) != 0)
        fail_msg("%s", err);
    assert_int_equal(m.infeasible_step, -1);
    assert_int_equal(m.transitions, 1);
    assert_true(m.transition_s > 300);
    assert_int_equal(m.checkpoints, 1);
    nrs_trace_free(&t);
}

/* Node loss: the current plan cannot go on, the move is forced and priced by
 * its transition graph. Without ZeRO-1 every shard has a replica on the other
 * node and nothing is lost; with it, optimizer shards of the lost node exist
 * nowhere else and a checkpoint is needed. */
static void forced_on_loss(bool zero1, nrs_adapt_out_t *out)
{
    nrs_spec_t s;
    nrs_adapt_t a;
    nrs_cond_t c;
    char err[NRS_ERR_MAX];
    int lost[8];
    spec_8b(&s, 2);
    s.runtime.zero1 = zero1;
    c.gpus = 16;
    nrs_work_from_spec(&s, &c.work);
    assert_int_equal(nrs_adapt_init(&a, &s, &c, err, sizeof(err)), 0);
    assert_int_equal(nrs_adapt_step(&a, 1, &c, NULL, false, out, err, sizeof(err)), 0);
    assert_int_equal(out->trigger, NRS_TRIGGER_NONE);
    for (int i = 0; i < 8; i++)
        lost[i] = 8 + i;
    nrs_resize_t rz = {lost, 8};
    c.gpus = 8;
    assert_int_equal(nrs_adapt_step(&a, 2, &c, &rz, false, out, err, sizeof(err)), 0);
    assert_int_equal(out->trigger, NRS_TRIGGER_RESOURCES);
    assert_true(out->changed && out->decision.forced);
    assert_int_equal(a.plan.total_gpus, 8);
    assert_int_equal(a.plan.epoch, 2);
    assert_true(out->cost_s > 0);
    print_message("zero1 %d: %s; graph makespan %.3f s, %d boxes lost\n", zero1, out->decision.why,
                  out->makespan_s, out->lost_boxes);
}

static void test_adapt_forced_on_loss(void **st)
{
    (void)st;
    nrs_adapt_out_t out;
    forced_on_loss(false, &out);
    assert_int_equal(out.lost_boxes, 0);
    forced_on_loss(true, &out);
    assert_true(out.lost_boxes > 0);
}

/* GPUs lost that the current plan does not use (joined, not planned on: the
 * expansion did not pay) do not end it: no forced move. */
static void test_adapt_loss_outside_plan(void **st)
{
    (void)st;
    nrs_spec_t s;
    nrs_adapt_t a;
    nrs_cond_t c = {.gpus = 32};
    nrs_adapt_out_t out;
    char err[NRS_ERR_MAX];
    int lost[8];
    spec_8b(&s, 4);
    s.policy.min_gain = 100; /* nothing pays: only a forced move is made */
    nrs_work_from_spec(&s, &c.work);
    assert_int_equal(nrs_adapt_init(&a, &s, &c, err, sizeof(err)), 0);
    c.gpus = 64;
    assert_int_equal(nrs_adapt_step(&a, 10, &c, NULL, false, &out, err, sizeof(err)), 0);
    assert_false(out.changed);
    assert_int_equal(a.plan.total_gpus, 32);
    for (int i = 0; i < 8; i++) /* node 5: one of the joiners */
        lost[i] = 40 + i;
    nrs_resize_t rz = {lost, 8};
    c.gpus = 56;
    if (nrs_adapt_step(&a, 20, &c, &rz, false, &out, err, sizeof(err)) != 0)
        fail_msg("%s", err);
    assert_int_equal(out.trigger, NRS_TRIGGER_RESOURCES);
    print_message("%s\n", out.decision.why);
    assert_false(out.decision.forced);
    assert_false(out.changed);
    assert_int_equal(a.plan.total_gpus, 32);
    lost[0] = 31; /* one of its own: now it must move */
    assert_int_equal(nrs_adapt_step(&a, 30, &c, &rz, false, &out, err, sizeof(err)), 0);
    assert_true(out.decision.forced && out.changed);
}

/* The horizon is the mean interval between changes of the job: a hysteresis
 * recheck (nothing changed) is not one, and a workload change the memory
 * trigger caught first is. */
static void test_adapt_records_changes(void **st)
{
    (void)st;
    nrs_spec_t s;
    nrs_adapt_t a;
    nrs_cond_t c = {.gpus = 32};
    nrs_adapt_out_t out;
    char err[NRS_ERR_MAX];
    spec_8b(&s, 16);
    s.policy.hysteresis = 5;
    nrs_work_from_spec(&s, &c.work);
    assert_int_equal(nrs_adapt_init(&a, &s, &c, err, sizeof(err)), 0);
    c.gpus = 64;
    assert_int_equal(nrs_adapt_step(&a, 100, &c, NULL, false, &out, err, sizeof(err)), 0);
    assert_int_equal(out.trigger, NRS_TRIGGER_RESOURCES);
    assert_true(out.changed);
    c.gpus = 128; /* one step later: refused for hysteresis, rechecked later */
    assert_int_equal(nrs_adapt_step(&a, 101, &c, NULL, false, &out, err, sizeof(err)), 0);
    assert_false(out.changed);
    assert_non_null(strstr(out.decision.why, "hysteresis"));
    long changes = a.adm.nchanges;
    bool rechecked = false;
    for (int step = 102; step <= 110; step++) {
        assert_int_equal(nrs_adapt_step(&a, step, &c, NULL, false, &out, err, sizeof(err)), 0);
        rechecked |= out.trigger == NRS_TRIGGER_RECHECK;
    }
    assert_true(rechecked);
    assert_int_equal(a.adm.nchanges, changes); /* a recheck is no change */
    /* a response length the current plan cannot hold: memory, and a change */
    changes = a.adm.nchanges;
    c.work.response_len *= 8;
    assert_int_equal(nrs_adapt_step(&a, 200, &c, NULL, false, &out, err, sizeof(err)), 0);
    assert_int_equal(out.trigger, NRS_TRIGGER_MEMORY);
    assert_int_equal(a.adm.nchanges, changes + 1);
}

/* A candidate rejected, then asked about again under the same layouts: its
 * transition is priced from the first graph, not built again, with the same
 * makespan. */
static void test_adapt_prices_once(void **st)
{
    (void)st;
    nrs_spec_t s;
    nrs_adapt_t a;
    nrs_cond_t c;
    nrs_adapt_out_t first, again;
    char err[NRS_ERR_MAX];
    spec_8b(&s, 2);
    s.policy.min_gain = 100; /* nothing pays: every candidate is rejected */
    s.policy.hysteresis = 0;
    c.gpus = 16;
    nrs_work_from_spec(&s, &c.work);
    double base = c.work.response_len;
    assert_int_equal(nrs_adapt_init(&a, &s, &c, err, sizeof(err)), 0);
    c.work.response_len = base / 4;
    assert_int_equal(nrs_adapt_step(&a, 1, &c, NULL, false, &first, err, sizeof(err)), 0);
    assert_int_equal(first.trigger, NRS_TRIGGER_WORKLOAD);
    assert_false(first.changed);
    assert_int_equal(a.graphs_built, 1); /* a new layout was priced */
    c.work.response_len = base;
    assert_int_equal(nrs_adapt_step(&a, 2, &c, NULL, false, &again, err, sizeof(err)), 0);
    long built = a.graphs_built;
    c.work.response_len = base / 4;
    assert_int_equal(nrs_adapt_step(&a, 3, &c, NULL, false, &again, err, sizeof(err)), 0);
    assert_int_equal(again.trigger, NRS_TRIGGER_WORKLOAD);
    assert_true(nrs_plan_same_layout(&again.cand, &first.cand));
    assert_int_equal(a.graphs_built, built); /* the same question: not built again */
    assert_true(again.makespan_s == first.makespan_s && again.cost_s > 0);
    assert_false(again.changed);
}

static int setup(void **st)
{
    (void)st;
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **st)
{
    (void)st;
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

/* Largest predicted per-GPU bytes of any stage of plan p under the spec's
 * workload. */
static double plan_peak(const nrs_spec_t *s, const nrs_plan_t *p)
{
    nrs_plan_t q = *p;
    nrs_work_t w;
    char err[NRS_ERR_MAX];
    double peak = 0;
    nrs_work_from_spec(s, &w);
    if (nrs_plan_eval(s, &w, NULL, &q, err, sizeof(err)) != 0)
        fail_msg("%s", err);
    for (int ms = 0; ms < NRS_MS_COUNT; ms++)
        if (q.has[ms])
            peak = fmax(peak, q.ms_mem[ms]);
    return peak;
}

/* A failed allocation: the current plan cannot go on as it is. The model's
 * best plan is that very plan (the model said it fits), so the move was to an
 * identical plan, counted and priced as a transition. Now the loop plans below
 * the failed plan's predicted peak until the GPUs or the workload change. */
static void test_adapt_memory_failure_moves(void **st)
{
    (void)st;
    nrs_spec_t s;
    nrs_adapt_t a;
    nrs_cond_t c = {.gpus = 16};
    nrs_adapt_out_t out;
    char err[NRS_ERR_MAX];
    spec_8b(&s, 2);
    nrs_work_from_spec(&s, &c.work);
    assert_int_equal(nrs_adapt_init(&a, &s, &c, err, sizeof(err)), 0);
    nrs_plan_t failed = a.plan;
    double peak = plan_peak(&s, &failed);
    assert_int_equal(nrs_adapt_step(&a, 1, &c, NULL, true, &out, err, sizeof(err)), 0);
    assert_int_equal(out.trigger, NRS_TRIGGER_MEMORY);
    assert_true(out.changed && out.decision.forced);
    if (nrs_plan_same_layout(&failed, &a.plan))
        fail_msg("moved to the plan that failed: %s", out.decision.why);
    assert_true(plan_peak(&s, &a.plan) < peak);
    /* while the job stays as it was, so does the lowered memory: a re-plan
     * for a drift of the calibration keeps below the failed peak */
    assert_int_equal(nrs_adapt_step(&a, 2, &c, NULL, false, &out, err, sizeof(err)), 0);
    assert_int_equal(out.trigger, NRS_TRIGGER_NONE);
    for (int i = 0; i < 30; i++)
        nrs_adapt_measure(&a, &c, NRS_MS_ACTOR_GENERATE, 2 * a.plan.ms_time[NRS_MS_ACTOR_GENERATE]);
    assert_int_equal(nrs_adapt_step(&a, 3, &c, NULL, false, &out, err, sizeof(err)), 0);
    assert_int_equal(out.trigger, NRS_TRIGGER_CALIBRATION);
    assert_true(plan_peak(&s, &out.cand) < peak);
    /* new GPUs: planned with the spec's memory again */
    nrs_plan_req_t req;
    nrs_plan_t best;
    nrs_calib_t f;
    nrs_calibrator_factors(&a.cal, &f);
    nrs_plan_req_init(&req, &s);
    req.gpus = c.gpus = 32;
    req.calib = &f;
    assert_int_equal(nrs_plan_best(&s, &req, &best, err, sizeof(err)), 0);
    assert_int_equal(nrs_adapt_step(&a, 4, &c, NULL, false, &out, err, sizeof(err)), 0);
    assert_int_equal(out.trigger, NRS_TRIGGER_RESOURCES);
    assert_true(nrs_plan_same_layout(&out.cand, &best));
}

typedef struct {
    nrs_plan_t at[8];
    bool transition[8], retune[8];
    unsigned epoch[8];
} rows_t;

static void keep_rows(const nrs_sim_row_t *row, void *arg)
{
    rows_t *r = arg;
    if (row->step < 8) {
        r->at[row->step] = *row->plan;
        r->transition[row->step] = row->transition;
        r->retune[row->step] = row->retune;
        r->epoch[row->step] = row->epoch;
    }
}

/* The trace's `memory STEP`: nereus, fixed and static-best leave the plan that
 * failed for one below its peak (docs/simulator.md); a plan that keeps its
 * layouts and only lowers micro-batches moves no state: no transition for the
 * fixed baselines. Before, nereus moved to the identical plan and paid a
 * transition, and the fixed baselines ignored the failure. */
static void test_sim_memory_event(void **st)
{
    (void)st;
    static const nrs_sim_policy_t pols[] = {NRS_SIM_FIXED, NRS_SIM_STATIC_BEST, NRS_SIM_NEREUS};
    nrs_spec_t s;
    nrs_trace_t t;
    char err[NRS_ERR_MAX];
    spec_8b(&s, 2);
    load_trace(&s, &t, "memory.trace", "nereus-trace 1\nsteps 6\nnoise 0\nmemory 3\n");
    for (size_t i = 0; i < sizeof(pols) / sizeof(pols[0]); i++) {
        nrs_sim_summary_t m;
        rows_t r;
        memset(&r, 0, sizeof(r));
        if (nrs_sim_run(&s, &t, pols[i], keep_rows, &r, &m, err, sizeof(err)) != 0)
            fail_msg("%s: %s", nrs_sim_policy_name(pols[i]), err);
        if (m.infeasible_step >= 0)
            fail_msg("%s stopped at step %d: %s", nrs_sim_policy_name(pols[i]),
                     m.infeasible_step, m.infeasible_why);
        print_message("%s: %d transitions, peak %.2f -> %.2f GiB\n", nrs_sim_policy_name(pols[i]),
                      m.transitions, plan_peak(&s, &r.at[2]) / (1 << 30),
                      plan_peak(&s, &r.at[3]) / (1 << 30));
        if (nrs_plan_same_layout(&r.at[2], &r.at[3]))
            fail_msg("%s: the plan that failed at step 3 runs on", nrs_sim_policy_name(pols[i]));
        assert_true(plan_peak(&s, &r.at[3]) < plan_peak(&s, &r.at[2]));
        assert_true(nrs_plan_same_layout(&r.at[3], &r.at[5])); /* and stays */
        if (pols[i] != NRS_SIM_NEREUS) /* micro-batches only: nothing moves */
            assert_int_equal(m.transitions, 0);
        else
            assert_int_equal(m.transitions, r.transition[3]);
    }
    nrs_trace_free(&t);
}


/* Whether plan b differs from a in micro-batches only (and in at least one). */
static bool only_mb_differs(const nrs_plan_t *a, const nrs_plan_t *b)
{
    bool mb = false;
    if (a->total_gpus != b->total_gpus || a->npools != b->npools ||
        memcmp(a->pools, b->pools, sizeof(a->pools)) ||
        memcmp(a->pool_of, b->pool_of, sizeof(a->pool_of)))
        return false;
    for (int ms = 0; ms < NRS_MS_COUNT; ms++) {
        const nrs_layout_t *x = &a->layout[ms], *y = &b->layout[ms];
        if (x->tp != y->tp || x->pp != y->pp || x->dp != y->dp)
            return false;
        mb |= x->mb != y->mb;
    }
    return mb;
}

/* A response length the plan cannot hold on 16 GPUs (spec_8b, 2 nodes) whose
 * best plan keeps every pool and tp/pp/dp and only lowers micro-batches: the
 * transition graph moves nothing and sets up no communicator, so the move
 * costs nothing. Before, it was priced at the empty graph's makespan plus 1 s
 * of communicator set-up, and counted as a transition for the hysteresis: a
 * move that paid right after it was refused. */
static void test_adapt_retune_is_free(void **st)
{
    (void)st;
    nrs_spec_t s;
    nrs_adapt_t a;
    nrs_cond_t c = {.gpus = 16};
    nrs_adapt_out_t out;
    nrs_emu_graph_t *g = NULL;
    nrs_emu_stats_t gs;
    char err[NRS_ERR_MAX];
    spec_8b(&s, 2);
    s.policy.horizon = 100; /* the growth below pays whatever the history */
    nrs_work_from_spec(&s, &c.work);
    assert_int_equal(nrs_adapt_init(&a, &s, &c, err, sizeof(err)), 0);
    nrs_plan_t old = a.plan;
    c.work.response_len = 1700;
    assert_int_equal(nrs_adapt_step(&a, 1, &c, NULL, false, &out, err, sizeof(err)), 0);
    assert_int_equal(out.trigger, NRS_TRIGGER_MEMORY);
    assert_true(out.changed && out.decision.forced);
    if (!only_mb_differs(&old, &a.plan))
        fail_msg("not a micro-batch-only move: %s", out.decision.why);
    assert_int_equal(a.plan.epoch, 2); /* the ranks take it as a new epoch */
    /* the graph the ranks build for it: nothing to run */
    assert_int_equal(nrs_emu_transition(&s, &old, &a.plan, NULL, &g, err, sizeof(err)), 0);
    nrs_emu_graph_stats(g, &gs);
    nrs_emu_graph_free(g);
    assert_true(gs.nops == 0 && gs.ncomms == 0 && gs.makespan_s == 0);
    if (out.cost_s != 0)
        fail_msg("a micro-batch re-tune priced as a transition: %s", out.decision.why);
    /* not a transition: a move that pays right after it is not refused */
    c.gpus = 32;
    assert_int_equal(nrs_adapt_step(&a, 2, &c, NULL, false, &out, err, sizeof(err)), 0);
    assert_int_equal(out.trigger, NRS_TRIGGER_RESOURCES);
    if (!out.changed)
        fail_msg("growth after a re-tune: %s", out.decision.why);
}

/* The same in the simulator: the re-tune at step 3 moves the epoch (as the
 * runtime does) but is no transition and costs nothing, for nereus and the
 * oracle alike, as for the fixed baselines. */
static void test_sim_retune_not_a_transition(void **st)
{
    (void)st;
    static const nrs_sim_policy_t pols[] = {NRS_SIM_NEREUS, NRS_SIM_ORACLE, NRS_SIM_FIXED};
    nrs_spec_t s;
    nrs_trace_t t;
    char err[NRS_ERR_MAX];
    spec_8b(&s, 2);
    load_trace(&s, &t, "retune.trace", "nereus-trace 1\nsteps 6\nnoise 0\ntrue sync 1.5\n"
                                        "response 3 1700\n");
    for (size_t i = 0; i < sizeof(pols) / sizeof(pols[0]); i++) {
        const char *name = nrs_sim_policy_name(pols[i]);
        nrs_sim_summary_t m;
        rows_t r;
        memset(&r, 0, sizeof(r));
        if (nrs_sim_run(&s, &t, pols[i], keep_rows, &r, &m, err, sizeof(err)) != 0)
            fail_msg("%s: %s", name, err);
        assert_int_equal(m.infeasible_step, -1);
        if (!only_mb_differs(&r.at[2], &r.at[3]))
            fail_msg("%s: step 3 is not a micro-batch re-tune", name);
        if (m.transitions != 0 || m.transition_s != 0)
            fail_msg("%s: the re-tune counted as %d transition(s), %.3f s", name, m.transitions,
                     m.transition_s);
        assert_false(r.transition[3]);
        assert_true(r.retune[3]); /* counted apart */
        assert_int_equal(m.retunes, 1);
        if (pols[i] == NRS_SIM_NEREUS) /* the runtime announces it as a new epoch */
            assert_int_equal(r.epoch[3], r.epoch[2] + 1);
    }
    nrs_trace_free(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_trace_errors),
        cmocka_unit_test(test_trace_loads),
        cmocka_unit_test(test_trace_event_error_line),
        cmocka_unit_test(test_policy_ordering),
        cmocka_unit_test(test_deterministic),
        cmocka_unit_test(test_horizon_from_trace),
        cmocka_unit_test(test_same_step_events),
        cmocka_unit_test(test_too_many_gpus),
        cmocka_unit_test(test_fixed_counts_restores),
        cmocka_unit_test(test_adapt_forced_on_loss),
        cmocka_unit_test(test_adapt_loss_outside_plan),
        cmocka_unit_test(test_adapt_prices_once),
        cmocka_unit_test(test_adapt_records_changes),
        cmocka_unit_test(test_adapt_memory_failure_moves),
        cmocka_unit_test(test_sim_memory_event),
        cmocka_unit_test(test_adapt_retune_is_free),
        cmocka_unit_test(test_sim_retune_not_a_transition),
    };
    return cmocka_run_group_tests_name("sim", tests, setup, teardown);
}
