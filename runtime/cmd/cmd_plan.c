/* nereus plan FILE [--gpus N | --nodes N] [--response-len L] [--baseline fixed] [--json] */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "cmd/cli.h"
#include "nereus/plan.h"

static const char usage[] =
    "Usage: nereus plan FILE [--gpus N | --nodes N] [--response-len L]\n"
    "                        [--baseline fixed] [--json]\n"
    "\n"
    "Plans the job in FILE: for every model-stage (actor.generate, *.infer,\n"
    "*.train) a pool of GPUs and a layout (tp, pp, dp, micro-batch) with the least\n"
    "predicted step time such that every GPU fits in memory in every phase.\n"
    "\n"
    "  --gpus N          plan for N GPUs (fewer than a node, or whole nodes);\n"
    "                    default: cluster.nodes x cluster.gpus_per_node\n"
    "  --nodes N         plan for N nodes\n"
    "  --response-len L  mean response length in tokens (default: workload.response_len)\n"
    "  --baseline fixed  the fixed baseline instead: the initial tp/pp of every\n"
    "                    model-stage kept (spec layouts, else the best colocated plan\n"
    "                    on cluster.nodes), only dp scales with the GPUs\n"
    "  --json            print the plan as one JSON object\n"
    "  -h, --help        show this help\n"
    "\n"
    "Exit status: 0 a plan was found, 1 the spec is invalid or no plan fits\n"
    "(the message names the tightest constraint), 2 usage error.\n";

int nrs_cmd_plan(int argc, char **argv)
{
    static const struct option opts[] = {
        {"gpus", required_argument, NULL, 'g'},   {"nodes", required_argument, NULL, 'n'},
        {"response-len", required_argument, NULL, 'r'},
        {"baseline", required_argument, NULL, 'b'}, {"json", no_argument, NULL, 'j'},
        {"help", no_argument, NULL, 'h'},         {NULL, 0, NULL, 0}};
    int gpus = 0, nodes = 0, resp = 0, json = 0, fixed = 0, c;
    nrs_spec_t s;
    nrs_plan_req_t req;
    nrs_plan_t p;
    char err[NRS_ERR_MAX];

    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'g':
            if (nrs_cli_int("--gpus", optarg, 1, 1 << 22, &gpus))
                return NRS_EXIT_USAGE;
            break;
        case 'n':
            if (nrs_cli_int("--nodes", optarg, 1, 1 << 20, &nodes))
                return NRS_EXIT_USAGE;
            break;
        case 'r':
            if (nrs_cli_int("--response-len", optarg, 1, 1 << 24, &resp))
                return NRS_EXIT_USAGE;
            break;
        case 'b':
            if (strcmp(optarg, "fixed") != 0) {
                fprintf(stderr, "nereus plan: --baseline: unknown baseline '%s' (known: fixed)\n",
                        optarg);
                return NRS_EXIT_USAGE;
            }
            fixed = 1;
            break;
        case 'j':
            json = 1;
            break;
        case 'h':
            fputs(usage, stdout);
            return NRS_EXIT_OK;
        default:
            fprintf(stderr, "nereus plan: unknown or incomplete option '%s'\n%s", argv[optind - 1],
                    usage);
            return NRS_EXIT_USAGE;
        }
    }
    if (optind != argc - 1) {
        fprintf(stderr, "nereus plan: expected exactly one FILE\n%s", usage);
        return NRS_EXIT_USAGE;
    }
    if (gpus && nodes) {
        fprintf(stderr, "nereus plan: give --gpus or --nodes, not both\n");
        return NRS_EXIT_USAGE;
    }
    if (nrs_cli_load(argv[optind], &s) != 0)
        return NRS_EXIT_FAIL;
    nrs_plan_req_init(&req, &s);
    if (nodes)
        req.gpus = nodes * s.cluster.gpus_per_node;
    if (gpus)
        req.gpus = gpus;
    if (resp)
        req.work.response_len = resp;
    req.mode = fixed ? NRS_PLAN_FIXED : NRS_PLAN_BEST;
    if (nrs_plan_best(&s, &req, &p, err, sizeof(err)) != 0) {
        fprintf(stderr, "nereus plan: %s: %s\n", argv[optind], err);
        return NRS_EXIT_FAIL;
    }
    if (json) {
        nrs_plan_print_json(stdout, &s, &p);
        return NRS_EXIT_OK;
    }
    printf("Nereus %s plan for %s: %d GPUs, %d sequences/step, prompt %.0f + response %.0f tokens\n\n",
           fixed ? "fixed-baseline" : "best", argv[optind], req.gpus, req.work.samples,
           req.work.prompt_len, req.work.response_len);
    nrs_plan_print(stdout, &s, &p);
    return NRS_EXIT_OK;
}
