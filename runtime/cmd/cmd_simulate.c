/* nereus simulate FILE --trace TRACE [--policy P|all] [--csv OUT] [--quiet] */
#include <getopt.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cmd/cli.h"
#include "sim/sim.h"

static const char usage[] =
    "Usage: nereus simulate FILE --trace TRACE [--policy POLICY] [--csv OUT] [--quiet]\n"
    "\n"
    "Replays TRACE (GPUs joining, leaving and failing, response length over time,\n"
    "memory events; format in docs/simulator.md) against the job in FILE on a\n"
    "virtual cluster whose true speeds differ from the cost model by the trace's\n"
    "hidden factors, running the real planner, policy and transition graph.\n"
    "\n"
    "  --trace TRACE     the trace file (required)\n"
    "  --policy POLICY   nereus | fixed | static-best | oracle | openrlhf-like |\n"
    "                    verl-like | all (default all)\n"
    "                    fixed: initial tp/pp kept, only dp scales; static-best: the\n"
    "                    one tp/pp best for the whole trace, chosen with hindsight;\n"
    "                    oracle: best plan every step with true speeds, free moves;\n"
    "                    openrlhf-like, verl-like: MODELLED placements of those\n"
    "                    systems priced by the same cost model, not runs of them\n"
    "                    (docs/baselines.md)\n"
    "  --csv OUT         write one row per policy and step to OUT ('-': stdout,\n"
    "                    and the summary goes to stderr)\n"
    "  --quiet           no progress on the terminal\n"
    "  -h, --help        show this help\n"
    "\n"
    "Prints per policy: mean step latency, throughput (samples per second of mean\n"
    "step), total time, transitions, the share of time spent in transitions, and the\n"
    "mean prediction error; nereus' throughput against each baseline that ran.\n"
    "Exit status: 0 success, 1 bad spec or trace, 2 usage error.\n";

typedef struct {
    FILE *csv;
    const nrs_spec_t *s;
    nrs_sim_policy_t pol;
    int steps;
    bool progress;
    double last;
} out_t;

static void on_row(const nrs_sim_row_t *row, void *arg)
{
    out_t *o = arg;
    if (o->csv) {
        fprintf(o->csv, "%s,%d,%d,%.1f,%.6f,%.6f,%.6f,%u,%d,%d,%d", nrs_sim_policy_name(o->pol),
                row->step, row->gpus, row->response_len, row->step_s, row->predicted_s,
                row->transition_s, row->epoch, row->transition, row->forced, row->checkpoint);
        for (int ms = 0; ms < NRS_MS_COUNT; ms++) {
            const nrs_layout_t *l = &row->plan->layout[ms];
            if (row->plan->has[ms])
                fprintf(o->csv, ",%dx%dx%d", l->tp, l->pp, l->dp);
            else
                fprintf(o->csv, ",");
        }
        fprintf(o->csv, "\n");
    }
    if (o->progress) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        double now = ts.tv_sec + ts.tv_nsec * 1e-9;
        if (now - o->last > 0.2 || row->step + 1 == o->steps) {
            fprintf(stderr, "\r%-12s step %d/%d", nrs_sim_policy_name(o->pol), row->step + 1, o->steps);
            o->last = now;
        }
    }
}

/* Samples (global_batch x samples_per_prompt) per second of mean step. */
static double throughput(const nrs_spec_t *s, const nrs_sim_summary_t *m)
{
    nrs_work_t w;
    nrs_work_from_spec(s, &w);
    return m->mean_step_s > 0 ? w.samples / m->mean_step_s : 0;
}

static void print_summary(FILE *out, const nrs_spec_t *s, nrs_sim_policy_t pol, const nrs_sim_summary_t *m)
{
    fprintf(out, "%-14s %12.3f %10.2f %10.3f %8d (%d forced) %12.4f%% %10.2f%%",
            nrs_sim_policy_name(pol), m->mean_step_s, throughput(s, m), m->total_s / 3600,
            m->transitions, m->forced, m->transition_share * 100, m->pred_err * 100);
    if (nrs_sim_policy_modelled(pol))
        fprintf(out, "  (modelled)");
    if (m->checkpoints)
        fprintf(out, "  %d checkpoint restores", m->checkpoints);
    if (m->retunes) /* micro-batches only: free, not transitions */
        fprintf(out, "  %d re-tune%s", m->retunes, m->retunes == 1 ? "" : "s");
    if (m->infeasible_step >= 0)
        fprintf(out, "  STOPPED at step %d: %s", m->infeasible_step, m->infeasible_why);
    fprintf(out, "\n");
}

/* The name of whichever of policies a and b stopped before the end of the
 * trace (a first), or NULL: their means and totals cover different steps
 * then, and no ratio of them means anything. */
static const char *stopped(const nrs_sim_summary_t *sum, int a, int b)
{
    if (sum[a].infeasible_step >= 0 || sum[a].steps == 0)
        return nrs_sim_policy_name((nrs_sim_policy_t)a);
    if (sum[b].infeasible_step >= 0 || sum[b].steps == 0)
        return nrs_sim_policy_name((nrs_sim_policy_t)b);
    return NULL;
}

int nrs_cmd_simulate(int argc, char **argv)
{
    static const struct option opts[] = {{"trace", required_argument, NULL, 't'},
                                         {"policy", required_argument, NULL, 'p'},
                                         {"csv", required_argument, NULL, 'c'},
                                         {"quiet", no_argument, NULL, 'q'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    const char *trace = NULL, *csv = NULL;
    int all = 1, quiet = 0, c, rc = NRS_EXIT_OK;
    nrs_sim_policy_t only = NRS_SIM_NEREUS;
    nrs_spec_t s;
    nrs_trace_t t;
    nrs_sim_summary_t sum[NRS_SIM_POLICY_COUNT];
    bool ran[NRS_SIM_POLICY_COUNT] = {false};
    char err[NRS_ERR_MAX];

    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 't':
            trace = optarg;
            break;
        case 'p':
            if (!strcmp(optarg, "all")) {
                all = 1;
            } else if (nrs_sim_policy_parse(optarg, &only) == 0) {
                all = 0;
            } else {
                fprintf(stderr, "nereus simulate: --policy: unknown policy '%s' (nereus, fixed, "
                                "static-best, oracle, openrlhf-like, verl-like, all)\n", optarg);
                return NRS_EXIT_USAGE;
            }
            break;
        case 'c':
            csv = optarg;
            break;
        case 'q':
            quiet = 1;
            break;
        case 'h':
            fputs(usage, stdout);
            return NRS_EXIT_OK;
        default:
            fprintf(stderr, "nereus simulate: unknown or incomplete option '%s'\n%s",
                    argv[optind - 1], usage);
            return NRS_EXIT_USAGE;
        }
    }
    if (optind != argc - 1 || !trace) {
        fprintf(stderr, "nereus simulate: expected FILE and --trace TRACE\n%s", usage);
        return NRS_EXIT_USAGE;
    }
    if (nrs_cli_load(argv[optind], &s) != 0)
        return NRS_EXIT_FAIL;
    if (nrs_trace_load(trace, &s, &t, err, sizeof(err)) != 0) {
        fprintf(stderr, "nereus: %s\n", err);
        return NRS_EXIT_FAIL;
    }
    out_t o = {.s = &s, .steps = t.steps, .progress = !quiet && isatty(2)};
    if (csv) {
        o.csv = strcmp(csv, "-") ? fopen(csv, "w") : stdout;
        if (!o.csv) {
            fprintf(stderr, "nereus simulate: cannot write %s\n", csv);
            nrs_trace_free(&t);
            return NRS_EXIT_FAIL;
        }
        fprintf(o.csv, "policy,step,gpus,response_len,step_s,predicted_s,transition_s,epoch,"
                       "transition,forced,checkpoint");
        for (int ms = 0; ms < NRS_MS_COUNT; ms++)
            fprintf(o.csv, ",%s", nrs_ms_name((nrs_ms_t)ms));
        fprintf(o.csv, "\n");
    }
    for (int p = 0; p < NRS_SIM_POLICY_COUNT; p++) {
        if (!all && p != (int)only)
            continue;
        o.pol = (nrs_sim_policy_t)p;
        if (nrs_sim_run(&s, &t, o.pol, on_row, &o, &sum[p], err, sizeof(err)) != 0) {
            fprintf(stderr, "\nnereus simulate: %s: %s\n", nrs_sim_policy_name(o.pol), err);
            rc = NRS_EXIT_FAIL;
            break;
        }
        ran[p] = true;
    }
    if (o.progress)
        fprintf(stderr, "\r%40s\r", "");
    FILE *info = csv && !strcmp(csv, "-") ? stderr : stdout;
    if (rc == NRS_EXIT_OK) {
        fprintf(info, "Simulated %s over %s: %d steps\n\n", argv[optind], trace, t.steps);
        fprintf(info, "%-14s %12s %10s %10s %20s %13s %11s\n", "policy", "mean step s", "samples/s",
               "total h", "transitions", "in transit.", "pred. err");
        for (int p = 0; p < NRS_SIM_POLICY_COUNT; p++)
            if (ran[p])
                print_summary(info, &s, (nrs_sim_policy_t)p, &sum[p]);
        const char *who;
        if (ran[NRS_SIM_NEREUS] && ran[NRS_SIM_FIXED]) {
            if ((who = stopped(sum, NRS_SIM_NEREUS, NRS_SIM_FIXED)))
                fprintf(info, "\nnereus vs fixed: no ratio, %s stopped\n", who);
            else
                fprintf(info, "\nnereus vs fixed: %.1f%% lower mean step latency, %.1f%% less total time\n",
                       100 * (1 - sum[NRS_SIM_NEREUS].mean_step_s / sum[NRS_SIM_FIXED].mean_step_s),
                       100 * (1 - sum[NRS_SIM_NEREUS].total_s / sum[NRS_SIM_FIXED].total_s));
        }
        if (ran[NRS_SIM_NEREUS] && ran[NRS_SIM_STATIC_BEST]) {
            if ((who = stopped(sum, NRS_SIM_NEREUS, NRS_SIM_STATIC_BEST)))
                fprintf(info, "nereus vs static-best: no ratio, %s stopped\n", who);
            else
                fprintf(info, "nereus vs static-best: %+.1f%% total time\n",
                       100 * (sum[NRS_SIM_NEREUS].total_s / sum[NRS_SIM_STATIC_BEST].total_s - 1));
        }
        for (int p = 0; p < NRS_SIM_POLICY_COUNT; p++) {
            if (!ran[p] || !ran[NRS_SIM_NEREUS] || !nrs_sim_policy_modelled((nrs_sim_policy_t)p))
                continue;
            if ((who = stopped(sum, NRS_SIM_NEREUS, p)))
                fprintf(info, "nereus vs %s: no ratio, %s stopped\n",
                       nrs_sim_policy_name((nrs_sim_policy_t)p), who);
            else
                fprintf(info, "nereus vs %s: %.2fx throughput (MODELLED baseline, not a run of it; "
                       "docs/baselines.md)\n", nrs_sim_policy_name((nrs_sim_policy_t)p),
                       throughput(&s, &sum[NRS_SIM_NEREUS]) / throughput(&s, &sum[p]));
        }
    }
    if (o.csv && o.csv != stdout)
        fclose(o.csv);
    nrs_trace_free(&t);
    return rc;
}
