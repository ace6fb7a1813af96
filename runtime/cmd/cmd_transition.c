/* nereus transition FILE --from-gpus N --to-gpus M [...] [--execute] */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "adapt/adapt.h"
#include "cmd/cli.h"

static const char usage[] =
    "Usage: nereus transition FILE --from-gpus N --to-gpus M [--response-len L]\n"
    "                              [--to-response-len L] [--lost-nodes LIST] [--execute]\n"
    "\n"
    "Builds the transition graph from the best plan on N GPUs to the best plan on\n"
    "M GPUs and prints its summary: bytes moved per link class, peak memory per GPU\n"
    "against the cap, the scheduled makespan against its lower bound, and the point\n"
    "of no return.\n"
    "\n"
    "  --from-gpus N         GPUs of the old plan (required)\n"
    "  --to-gpus M           GPUs of the new plan (required)\n"
    "  --response-len L      response length of the old plan (default: the spec's)\n"
    "  --to-response-len L   response length of the new plan (default: --response-len)\n"
    "  --lost-nodes LIST     comma-separated nodes of the old plan whose state is gone\n"
    "                        (failed or released); the survivors keep their order\n"
    "  --execute             run the transition in this process on the model scaled\n"
    "                        down by runtime.emulation_scale and verify every shard\n"
    "  -h, --help            show this help\n"
    "\n"
    "Exit status: 0 success (with --execute: every checksum verified), 1 the spec,\n"
    "the plans or the transition failed (state that survives nowhere is listed),\n"
    "2 usage error.\n";

static int parse_nodes(const char *list, int gpn, int from_gpus, int *lost, int *nlost)
{
    char buf[4096], *save = NULL;
    if (strlen(list) >= sizeof(buf)) {
        fprintf(stderr, "nereus transition: --lost-nodes: list too long\n");
        return -1;
    }
    strcpy(buf, list);
    *nlost = 0;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        int node;
        /* a plan below one node holds part of node 0 */
        if (nrs_cli_int("--lost-nodes", tok, 0, (from_gpus + gpn - 1) / gpn - 1, &node))
            return -1;
        for (int g = node * gpn; g < (node + 1) * gpn && g < from_gpus; g++) {
            for (int i = 0; i < *nlost; i++)
                if (lost[i] == g) {
                    fprintf(stderr, "nereus transition: --lost-nodes: node %d given twice\n", node);
                    return -1;
                }
            lost[(*nlost)++] = g;
        }
    }
    return 0;
}

static int plan_at(const nrs_spec_t *s, int gpus, int resp, nrs_plan_t *p, const char *what)
{
    nrs_plan_req_t req;
    char err[NRS_ERR_MAX];
    nrs_plan_req_init(&req, s);
    req.gpus = gpus;
    if (resp)
        req.work.response_len = resp;
    if (nrs_plan_best(s, &req, p, err, sizeof(err)) != 0) {
        fprintf(stderr, "nereus transition: %s plan on %d GPUs: %s\n", what, gpus, err);
        return -1;
    }
    return 0;
}

int nrs_cmd_transition(int argc, char **argv)
{
    static const struct option opts[] = {
        {"from-gpus", required_argument, NULL, 'f'}, {"to-gpus", required_argument, NULL, 't'},
        {"response-len", required_argument, NULL, 'r'},
        {"to-response-len", required_argument, NULL, 'R'},
        {"lost-nodes", required_argument, NULL, 'l'}, {"execute", no_argument, NULL, 'x'},
        {"help", no_argument, NULL, 'h'},           {NULL, 0, NULL, 0}};
    int from = 0, to = 0, resp = 0, resp2 = 0, execute = 0, c, nlost = 0, rc = NRS_EXIT_FAIL;
    const char *lost_list = NULL;
    nrs_spec_t s;
    nrs_plan_t a, b;
    int *lost = NULL, *map = NULL;
    char err[NRS_ERR_MAX];

    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'f':
            if (nrs_cli_int("--from-gpus", optarg, 1, 1 << 20, &from))
                return NRS_EXIT_USAGE;
            break;
        case 't':
            if (nrs_cli_int("--to-gpus", optarg, 1, 1 << 20, &to))
                return NRS_EXIT_USAGE;
            break;
        case 'r':
            if (nrs_cli_int("--response-len", optarg, 1, 1 << 24, &resp))
                return NRS_EXIT_USAGE;
            break;
        case 'R':
            if (nrs_cli_int("--to-response-len", optarg, 1, 1 << 24, &resp2))
                return NRS_EXIT_USAGE;
            break;
        case 'l':
            lost_list = optarg;
            break;
        case 'x':
            execute = 1;
            break;
        case 'h':
            fputs(usage, stdout);
            return NRS_EXIT_OK;
        default:
            fprintf(stderr, "nereus transition: unknown or incomplete option '%s'\n%s",
                    argv[optind - 1], usage);
            return NRS_EXIT_USAGE;
        }
    }
    if (optind != argc - 1 || !from || !to) {
        fprintf(stderr, "nereus transition: expected FILE, --from-gpus and --to-gpus\n%s", usage);
        return NRS_EXIT_USAGE;
    }
    if (nrs_cli_load(argv[optind], &s) != 0)
        return NRS_EXIT_FAIL;
    if (!(lost = malloc(sizeof(int) * (size_t)from)) || !(map = malloc(sizeof(int) * (size_t)to))) {
        fprintf(stderr, "nereus transition: out of memory\n");
        goto out;
    }
    if (lost_list && parse_nodes(lost_list, s.cluster.gpus_per_node, from, lost, &nlost) != 0) {
        rc = NRS_EXIT_USAGE;
        goto out;
    }
    if (plan_at(&s, from, resp, &a, "old") || plan_at(&s, to, resp2 ? resp2 : resp, &b, "new"))
        goto out;
    a.epoch = 1;
    b.epoch = 2;
    nrs_emu_opts_t o;
    nrs_resize_t rz = {lost, nlost};
    nrs_emu_opts_init(&o);
    if (nlost || to != from) {
        nrs_adapt_gpu_map(from, to, &rz, s.cluster.gpus_per_node, map);
        o.gpu_map = map;
        o.ngpu_map = to;
        o.lost = lost;
        o.nlost = nlost;
    }
    printf("Nereus transition for %s: best plan on %d GPUs -> best plan on %d GPUs%s\n\n",
           argv[optind], from, to, nlost ? " (after a loss)" : "");
    if (nrs_transition_summary_opts(&s, &a, &b, &o, stdout, execute, err, sizeof(err)) != 0) {
        fprintf(stderr, "nereus transition: %s\n", err);
        goto out;
    }
    rc = NRS_EXIT_OK;
out:
    free(lost);
    free(map);
    return rc;
}
