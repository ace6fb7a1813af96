/* Entry points of the `nereus status` and `nereus delta` subcommands (wired
 * into runtime/cmd/nereus.c by its owner). argv[0] is the subcommand's name.
 * Exit status: 0 success, 1 failure (controller unreachable, refused,
 * delta rejected), 2 usage error. */
#ifndef NRS_CTL_CMD_H
#define NRS_CTL_CMD_H

int nrs_cmd_status(int argc, char **argv);
int nrs_cmd_delta(int argc, char **argv);

#endif
