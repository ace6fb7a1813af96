/* The controller's event loop: epoll over the listening sockets (unix, and
 * TCP for remote ranks), every peer, a signalfd (SIGTERM, SIGINT) and a
 * timerfd for time-outs. Non-blocking sockets, bounded buffers (conn.c). */
#ifndef NRS_CTL_LOOP_H
#define NRS_CTL_LOOP_H

#include "ctl/ctl.h"

typedef struct {
    const char *socket_dir; /* created 0700, or checked */
    const char *tcp;        /* HOST:PORT or NULL */
    int max_conns;          /* 0: 60000 */
    FILE *log;              /* NULL: silent */
} nrs_loop_opts_t;

/* Set up the sockets, then run until SIGTERM/SIGINT: 0 on a clean shutdown
 * (socket removed), -1 with err when the set-up failed. */
int nrs_loop_run(const nrs_loop_opts_t *o, nrs_ctl_opts_t *co, char *err, size_t errlen);

/* The controller's clock: nrs_awake_s (util.h), so that time it spent
 * stopped (a suspended job) counts in no time-out: no rank is dropped, no
 * gather completed without it, no transition aborted for it. Its log's
 * times are on it too. */
double nrs_loop_now(void);

#endif
