/* nereus: validate job specs and plan layouts (more subcommands join as the
 * runtime grows). */
#include "config.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd/cli.h"
#include "ctl/ctl_cmd.h"

static const char usage[] =
    "Usage: nereus COMMAND [OPTIONS]\n"
    "\n"
    "Adaptive TP/PP/DP parallelism for LLM post-training (PPO, GRPO) on Slurm.\n"
    "\n"
    "Commands:\n"
    "  validate FILE    check a job spec; errors are printed as FILE:LINE:COL: message\n"
    "  plan FILE        print the layout with the least predicted step time\n"
    "  transition FILE --from-gpus N --to-gpus M\n"
    "                   build, schedule (and with --execute run and verify) the\n"
    "                   transition between the best plans on N and M GPUs\n"
    "  simulate FILE --trace TRACE\n"
    "                   replay a trace of GPUs and response lengths against the\n"
    "                   policies (nereus, fixed, static-best, oracle, and the\n"
    "                   modelled openrlhf-like and verl-like)\n"
    "  status [--json]  the job controller's state: epoch, plan, ranks, decisions\n"
    "  delta --add N | --remove HOSTS | --lost HOSTS | --lost-gpus LIST\n"
    "        | --remove-gpus LIST\n"
    "                   send a resource delta to the job controller\n"
    "  help [COMMAND]   show this text, or a command's own help\n"
    "  version          print the version\n"
    "\n"
    "Run 'nereus COMMAND --help' for a command's options. Exit status: 0 success,\n"
    "1 the spec, the trace or the plan failed (status, delta: the controller could not\n"
    "be reached, refused, or rejected the delta), 2 usage error. Documentation:\n"
    "docs/job-spec.md, docs/cost-model.md, docs/planner.md.\n";

int nrs_cli_load(const char *path, nrs_spec_t *s)
{
    char err[NRS_ERR_MAX];
    if (nrs_spec_load(path, s, err, sizeof(err)) != 0) {
        fprintf(stderr, "nereus: %s\n", err);
        return -1;
    }
    return 0;
}

int nrs_cli_int(const char *opt, const char *val, int lo, int hi, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(val, &end, 10);
    if (errno || end == val || *end || v < lo || v > hi) {
        fprintf(stderr, "nereus: %s: '%s' is not an integer in %d..%d\n", opt, val, lo, hi);
        return -1;
    }
    *out = (int)v;
    return 0;
}

int main(int argc, char **argv)
{
    static const struct {
        const char *name;
        int (*fn)(int, char **);
    } cmds[] = {{"validate", nrs_cmd_validate}, {"plan", nrs_cmd_plan}, {"simulate", nrs_cmd_simulate},
                 {"transition", nrs_cmd_transition}, {"status", nrs_cmd_status},
                 {"delta", nrs_cmd_delta}};

    if (argc < 2) {
        fputs(usage, stderr);
        return NRS_EXIT_USAGE;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "help") || !strcmp(cmd, "--help") || !strcmp(cmd, "-h")) {
        if (argc > 2)
            for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++)
                if (!strcmp(argv[2], cmds[i].name)) {
                    char *av[] = {argv[2], "--help", NULL};
                    return cmds[i].fn(2, av);
                }
        fputs(usage, stdout);
        return NRS_EXIT_OK;
    }
    if (!strcmp(cmd, "version") || !strcmp(cmd, "--version")) {
        printf("nereus %s\n", PACKAGE_VERSION);
        return NRS_EXIT_OK;
    }
    for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++)
        if (!strcmp(cmd, cmds[i].name))
            return cmds[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "nereus: unknown command '%s'; run 'nereus --help'\n", cmd);
    return NRS_EXIT_USAGE;
}
