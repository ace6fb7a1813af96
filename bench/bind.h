/* bench/bind.h: bind one of two bench ranks to a CPU ("S,R": rank 0 on CPU S,
 * rank 1 on CPU R), as `ucx_perftest -c` binds each side; call it before UCX
 * starts its thread. No --cpus (cpus NULL): unbound. */
#ifndef NRS_BENCH_BIND_H
#define NRS_BENCH_BIND_H
#include <sched.h>
#include <stdio.h>

static inline int nrs_bench_bind(const char *cpus, int me, char *err, size_t errlen)
{
    int c[2];
    cpu_set_t set;
    if (!cpus)
        return 0;
    if (sscanf(cpus, "%d,%d", &c[0], &c[1]) != 2 || c[me] < 0 || c[me] >= CPU_SETSIZE) {
        snprintf(err, errlen, "--cpus %s: want S,R (two CPU numbers)", cpus);
        return -1;
    }
    CPU_ZERO(&set);
    CPU_SET(c[me], &set);
    if (sched_setaffinity(0, sizeof set, &set)) {
        snprintf(err, errlen, "--cpus %s: cannot bind rank %d to CPU %d", cpus, me, c[me]);
        return -1;
    }
    return 0;
}
#endif
