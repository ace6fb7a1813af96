/* Test driver: `ctl_cli status ...` / `ctl_cli delta ...` run the same entry
 * points `nereus status` and `nereus delta` call, so the process tests need
 * nothing from runtime/cmd. */
#include <stdio.h>
#include <string.h>

#include "ctl/ctl_cmd.h"

int main(int argc, char **argv)
{
    if (argc >= 2 && !strcmp(argv[1], "status"))
        return nrs_cmd_status(argc - 1, argv + 1);
    if (argc >= 2 && !strcmp(argv[1], "delta"))
        return nrs_cmd_delta(argc - 1, argv + 1);
    fprintf(stderr, "usage: ctl_cli status|delta [OPTIONS]\n");
    return 2;
}
