/* The nereus command: one function per subcommand. */
#ifndef NRS_CLI_H
#define NRS_CLI_H

#include "nereus/spec.h"

/* Exit codes of every subcommand. */
enum { NRS_EXIT_OK = 0, NRS_EXIT_FAIL = 1, NRS_EXIT_USAGE = 2 };

int nrs_cmd_validate(int argc, char **argv);
int nrs_cmd_plan(int argc, char **argv);
int nrs_cmd_simulate(int argc, char **argv);
int nrs_cmd_transition(int argc, char **argv);

/* Loads a spec or prints "nereus: FILE:LINE:COL: message" to stderr. */
int nrs_cli_load(const char *path, nrs_spec_t *s);
/* Parses a positive int option value or prints an error naming the option. */
int nrs_cli_int(const char *opt, const char *val, int lo, int hi, int *out);

#endif
