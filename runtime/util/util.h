/* Small helpers every module uses: a monotonic clock, a short sleep for
 * progress loops, and bounded error formatting. */
#ifndef NRS_UTIL_H
#define NRS_UTIL_H

#include <stddef.h>

/* Seconds on the monotonic clock. */
double nrs_now_s(void);
/* Sleep about `us` microseconds (progress loops that must not spin). */
void nrs_nap_us(long us);
/* snprintf into err (if err and len), for "-1 with err" error returns. */
void nrs_seterr(char *err, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#endif
