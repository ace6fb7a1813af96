/* nereus validate FILE... */
#include <stdio.h>
#include <string.h>

#include "cmd/cli.h"

static const char usage[] =
    "Usage: nereus validate [-q] FILE...\n"
    "\n"
    "Loads each job spec with the same loader the runtime and the SPANK plugin use,\n"
    "and reports the first error of each as FILE:LINE:COL: message.\n"
    "\n"
    "  -q, --quiet   print nothing for valid files\n"
    "  -h, --help    show this help\n"
    "\n"
    "Exit status: 0 if every file is valid, 1 if one is not, 2 usage error.\n";

int nrs_cmd_validate(int argc, char **argv)
{
    int quiet = 0, nfiles = 0, bad = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            fputs(usage, stdout);
            return NRS_EXIT_OK;
        }
        if (!strcmp(argv[i], "-q") || !strcmp(argv[i], "--quiet"))
            quiet = 1;
        else if (argv[i][0] == '-' && argv[i][1]) {
            fprintf(stderr, "nereus validate: unknown option '%s'\n%s", argv[i], usage);
            return NRS_EXIT_USAGE;
        }
    }
    for (int i = 1; i < argc; i++) {
        nrs_spec_t s;
        if (argv[i][0] == '-' && argv[i][1])
            continue;
        nfiles++;
        if (nrs_cli_load(argv[i], &s) != 0)
            bad++;
        else if (!quiet)
            printf("%s: valid\n", argv[i]);
    }
    if (nfiles == 0) {
        fprintf(stderr, "nereus validate: no FILE given\n%s", usage);
        return NRS_EXIT_USAGE;
    }
    return bad ? NRS_EXIT_FAIL : NRS_EXIT_OK;
}
