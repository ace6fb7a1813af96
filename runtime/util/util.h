/* Small helpers every module uses: a monotonic clock, a short sleep for
 * progress loops, bounded error formatting, and growing arrays. */
#ifndef NRS_UTIL_H
#define NRS_UTIL_H

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

/* Seconds on the monotonic clock. */
double nrs_now_s(void);
/* Sleep about `us` microseconds (progress loops that must not spin). */
void nrs_nap_us(long us);
/* snprintf into err (if err and len), for "-1 with err" error returns. */
void nrs_seterr(char *err, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* The rest of a log line: s with control bytes as \xNN (text from a peer
 * must not forge lines), a newline, flushed. */
void nrs_log_line(FILE *f, const char *s);

/* Make room in arr (n used of cap allocated) for extra more elements,
 * doubling from 64. Out of memory: `return -1` from the calling function,
 * arr and cap unchanged (the caller still owns and frees arr). */
#define NRS_GROW(arr, n, cap, extra)                                                          \
    do {                                                                                      \
        if ((n) + (extra) > (cap)) {                                                          \
            size_t nc_ = (cap) ? (cap) * 2 : 64;                                              \
            while (nc_ < (n) + (extra))                                                       \
                nc_ *= 2;                                                                     \
            void *p_ = realloc((arr), nc_ * sizeof(*(arr)));                                  \
            if (!p_)                                                                          \
                return -1;                                                                    \
            (arr) = p_;                                                                       \
            (cap) = nc_;                                                                      \
        }                                                                                     \
    } while (0)

#endif
