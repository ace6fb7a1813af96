/* bench/bind.h: what the two-rank benches (bench_transfer, bench_ucp_plain)
 * share: binding each rank to a CPU, the receiver's check of the bytes and
 * the verdict both ranks agree on before rank 0 prints a figure. */
#ifndef NRS_BENCH_BIND_H
#define NRS_BENCH_BIND_H
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rdv/rdv.h"

/* Bind one of two bench ranks to a CPU ("S,R": rank 0 on CPU S, rank 1 on
 * CPU R), as `ucx_perftest -c` binds each side; call it before UCX starts
 * its thread. No --cpus (cpus NULL): unbound. */
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

/* The receiver's check of a run: every byte of buf is the sender's 0x5a.
 * $NRS_BENCH_CORRUPT=1 flips one byte first: the tests' proof that a run
 * whose bytes are wrong yields no figure. 0 or -1 (err says which byte). */
static inline int nrs_bench_check(char *buf, size_t size, char *err, size_t errlen)
{
    const char *c = getenv("NRS_BENCH_CORRUPT");
    if (c && !strcmp(c, "1") && size)
        buf[size / 2] ^= 1;
    for (size_t i = 0; i < size; i++)
        if (buf[i] != 0x5a) {
            snprintf(err, errlen, "size %zu: byte %zu did not arrive", size, i);
            return -1;
        }
    return 0;
}

/* Both ranks' verdicts on a run (bad: 0 or not), gathered under key: 0 when
 * both are 0. Rank 0 prints a run's figure only after this, so that a run
 * the receiver found wrong is never counted. On -1, a rank whose own verdict
 * was bad keeps its err. */
static inline int nrs_bench_verdict(nrs_rdv_t *r, uint64_t key, int bad, char *err, size_t errlen)
{
    char mine = bad ? 1 : 0;
    void **v = NULL;
    size_t *len = NULL;
    int other = -1;
    if (nrs_rdv_allgather(r, key, "verdict", &mine, 1, &v, &len, 30, err, errlen))
        return -1;
    for (int i = 0; i < 2; i++)
        if (len[i] != 1 || *(char *)v[i])
            other = i;
    nrs_rdv_free_blobs(r, v, len);
    if (other >= 0 && !bad)
        snprintf(err, errlen, "rank %d found the bytes wrong: no figure", other);
    return other >= 0 || bad ? -1 : 0;
}
#endif
