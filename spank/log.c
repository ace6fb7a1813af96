/* Error reporting: every message is prefixed "nereus: ". */
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
    slurm_error(NRS_SPANK_PREFIX "%s", nrs_spank_last_error);
}
