/* Error reporting: every message is prefixed "nereus: ", and is one line. */
#include <stdarg.h>
#include <stdio.h>

#include "nrs_spank.h"

char nrs_spank_last_error[NRS_SPANK_MSG_MAX];

void nrs_err(const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(nrs_spank_last_error, sizeof(nrs_spank_last_error), fmt, ap);
    va_end(ap);
    /* Outside srun, sbatch and salloc (the user's own terminal) it goes to
     * root's log, and may quote the user's bytes (a spec path, a command):
     * one printable line, or a line break in them would start a line of
     * the log without our prefix. */
    if (spank_context() != S_CTX_LOCAL && spank_context() != S_CTX_ALLOCATOR)
        nrs_spank_printable(nrs_spank_last_error);
    slurm_error(NRS_SPANK_PREFIX "%s", nrs_spank_last_error);
}
