/* What Slurm does to a suspended job (scontrol suspend, then resume; also
 * preemption and gang scheduling with PreemptMode=SUSPEND), for the tests/mp
 * ranks: every rank SIGSTOPped, then SIGCONTed. Test code only. */
#ifndef NRS_MP_SUSPEND_H
#define NRS_MP_SUSPEND_H

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "rdv/rdv.h"

/* Every rank's pid (*pids, malloc'd, size of the job): 0, or 1 said on stderr. */
static inline int mp_gather_pids(nrs_rdv_t *r, double timeout_s, pid_t **pids)
{
    char err[512];
    pid_t pid = getpid();
    void **blobs = NULL;
    size_t *lens = NULL;
    int n = nrs_rdv_size(r);
    if (!(*pids = calloc((size_t)n, sizeof(**pids))) ||
        nrs_rdv_allgather(r, 0, "pid", &pid, sizeof pid, &blobs, &lens, timeout_s, err,
                          sizeof err)) {
        fprintf(stderr, "rank %d: %s\n", nrs_rdv_rank(r), *pids ? err : "out of memory");
        return 1;
    }
    for (int i = 0; i < n; i++)
        memcpy(&(*pids)[i], blobs[i], sizeof pid);
    nrs_rdv_free_blobs(r, blobs, lens);
    return 0;
}

static inline void mp_nap_s(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) != 0)
        ;
}

/* Rank 0 (pids[0]) stops, or resumes, every other rank. */
static inline void mp_signal_others(const pid_t *pids, int n, int sig)
{
    for (int i = 1; i < n; i++)
        kill(pids[i], sig);
}

/* Called by rank 0: SIGSTOP every other rank, then itself, for s seconds; a
 * child of its own resumes them, rank 0 first and the others 0.2 s later
 * (nodes resume one after another). Returns once rank 0 runs again: the
 * child's pid (to reap once the wait is over), or -1. */
static inline pid_t mp_suspend_job(const pid_t *pids, int n, double s, const char *what)
{
    mp_signal_others(pids, n, SIGSTOP);
    pid_t child = fork();
    if (child == 0) {
        mp_nap_s(s);
        kill(pids[0], SIGCONT);
        mp_nap_s(0.2);
        mp_signal_others(pids, n, SIGCONT);
        _exit(0);
    }
    if (child < 0) {
        perror("fork");
        mp_signal_others(pids, n, SIGCONT);
        return -1;
    }
    fprintf(stderr, "rank 0: every rank SIGSTOPped %s for %.1f s\n", what, s);
    raise(SIGSTOP);
    fprintf(stderr, "rank 0: resumed\n");
    return child;
}

#endif
