/* Small helpers every module uses: a monotonic clock, the clock of
 * time-outs, a short sleep for progress loops, bounded error formatting, and growing arrays. */
#ifndef NRS_UTIL_H
#define NRS_UTIL_H

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

/* Seconds on the monotonic clock: what a measurement reads. */
double nrs_now_s(void);

/* Seconds on the clock of time-outs: the monotonic clock less the time this
 * process did not run. Slurm suspends a job (scontrol suspend; preemption or
 * gang scheduling with PreemptMode=SUSPEND) by SIGSTOP to every process of
 * it, its controller included, and resumes it with SIGCONT; the monotonic
 * clock runs on meanwhile, so at the resume every deadline set before the
 * stop had passed, at every waiter at once, though no peer had failed to
 * answer. Here a gap of more than NRS_AWAKE_GAP_S between two reads (of any
 * caller in the process) is time the process was stopped or starved, not
 * time it waited for an answer: it is left out, entirely. So a wait that
 * reads this clock must read it at least every NRS_AWAKE_SLICE_S (poll in
 * slices no longer), or its own sleep would be left out and it would never
 * time out. One thread at a time (the worker API's rule). */
#define NRS_AWAKE_GAP_S 1.0
#define NRS_AWAKE_SLICE_S 0.25
double nrs_awake_s(void);
/* The time left out so far: the sum of those gaps. */
double nrs_awake_skipped_s(void);
/* poll()'s time-out (ms) for one slice of a wait with left s to go on that
 * clock: left rounded up, at most NRS_AWAKE_SLICE_S, 0 when none is left. */
int nrs_awake_slice_ms(double left);
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
