/* LD_PRELOAD shim for test_watcher.sh: in nereus-watcher (and no other
 * process it runs), SIGTERM arrives once, just before its first sleep of a
 * second or more starts: after the watcher's last look at its stop flag,
 * before it is asleep. That is the window in which a SIGTERM from slurmstepd
 * can come at any time; here it comes there on purpose, so that a watcher
 * that loses it (and sleeps its whole interval) shows every time. Whichever
 * call the watcher sleeps in is caught: nanosleep, clock_nanosleep, or poll,
 * ppoll, select, pselect on no descriptor. It says so on stderr.
 *
 *   cc -shared -fPIC -o term_shim.so term_shim.c -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/select.h>
#include <time.h>
#include <unistd.h>

static int shim_done;

static int shim_in_watcher(void)
{
    static const char me[] = "nereus-watcher";
    char exe[4096];
    ssize_t k = readlink("/proc/self/exe", exe, sizeof(exe) - 1);

    if (k < (ssize_t)sizeof(me) - 1)
        return 0;
    exe[k] = '\0';
    return strcmp(exe + k - (sizeof(me) - 1), me) == 0;
}

static void shim_term(double s)
{
    if (shim_done || s < 1 || !shim_in_watcher())
        return;
    shim_done = 1;
    fprintf(stderr, "term_shim: SIGTERM just before a sleep of %.0f s\n", s);
    kill(getpid(), SIGTERM);
}

static double shim_ts(const struct timespec *ts)
{
    return ts != NULL ? (double)ts->tv_sec + (double)ts->tv_nsec / 1e9 : 1e9;
}

/* The libc function this one stands in for. */
#define SHIM_REAL(name)                                                                            \
    static __typeof__(name) *real;                                                                 \
    if (real == NULL)                                                                              \
        real = (__typeof__(name) *)dlsym(RTLD_NEXT, #name)

int nanosleep(const struct timespec *req, struct timespec *rem)
{
    SHIM_REAL(nanosleep);
    shim_term(shim_ts(req));
    return real(req, rem);
}

int clock_nanosleep(clockid_t c, int flags, const struct timespec *req, struct timespec *rem)
{
    SHIM_REAL(clock_nanosleep);
    if (!(flags & TIMER_ABSTIME))
        shim_term(shim_ts(req));
    return real(c, flags, req, rem);
}

int poll(struct pollfd *fds, nfds_t n, int ms)
{
    SHIM_REAL(poll);
    if (n == 0)
        shim_term(ms < 0 ? 1e9 : ms / 1e3);
    return real(fds, n, ms);
}

int ppoll(struct pollfd *fds, nfds_t n, const struct timespec *ts, const sigset_t *mask)
{
    SHIM_REAL(ppoll);
    if (n == 0)
        shim_term(shim_ts(ts));
    return real(fds, n, ts, mask);
}

int select(int n, fd_set *r, fd_set *w, fd_set *e, struct timeval *tv)
{
    SHIM_REAL(select);
    if (n == 0)
        shim_term(tv != NULL ? (double)tv->tv_sec + (double)tv->tv_usec / 1e6 : 1e9);
    return real(n, r, w, e, tv);
}

int pselect(int n, fd_set *r, fd_set *w, fd_set *e, const struct timespec *ts,
            const sigset_t *mask)
{
    SHIM_REAL(pselect);
    if (n == 0)
        shim_term(shim_ts(ts));
    return real(n, r, w, e, ts, mask);
}
