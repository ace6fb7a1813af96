/* bench_transfer: our UCX path (runtime/xfer/ucx) between two ranks, one
 * direction, for the message sizes given; run under tests/mp/pmix_srv -n 2
 * (bench/transfer.sh does, next to ucx_perftest with the same sizes).
 *
 *   bench_transfer [--chunk N] [--window N] [--min-bytes TOTAL] SIZE...
 *
 * For each size: 2 warm-up messages, then ITERS = max(5, TOTAL / SIZE)
 * messages back to back, rank 1 acknowledging the last; rank 0 prints
 *   ours SIZE ITERS MB/s
 * (MB = 1e6 bytes, as ucx_perftest counts).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rdv/rdv.h"
#include "xfer/ucx.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int one(nrs_ucx_t *u, int me, char *buf, size_t size, int iters, uint64_t tag,
               char *err, size_t errlen)
{
    for (int i = 0; i < iters; i++) {
        nrs_ucx_op_t *op;
        int rc = me == 0 ? nrs_ucx_isend(u, 1, buf, size, tag, &op, err, errlen)
                         : nrs_ucx_irecv(u, 0, buf, size, tag, &op, err, errlen);
        if (rc || nrs_ucx_waitall(u, &op, 1, err, errlen))
            return -1;
    }
    char ack = 1;
    nrs_ucx_op_t *op;
    int rc = me == 1 ? nrs_ucx_isend(u, 0, &ack, 1, tag + 1, &op, err, errlen)
                     : nrs_ucx_irecv(u, 1, &ack, 1, tag + 1, &op, err, errlen);
    return rc || nrs_ucx_waitall(u, &op, 1, err, errlen) ? -1 : 0;
}

int main(int argc, char **argv)
{
    nrs_ucx_opts_t uo;
    size_t total = 1u << 30, sizes[32];
    int nsizes = 0, rc = 1;
    char err[512];
    nrs_rdv_t *r = NULL;
    nrs_ucx_t *u = NULL;
    void **addrs = NULL;
    size_t *lens = NULL;

    nrs_ucx_opts_init(&uo);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--chunk") && i + 1 < argc)
            uo.chunk_bytes = strtoull(argv[++i], NULL, 0);
        else if (!strcmp(argv[i], "--window") && i + 1 < argc)
            uo.window = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--min-bytes") && i + 1 < argc)
            total = strtoull(argv[++i], NULL, 0);
        else if (nsizes < 32)
            sizes[nsizes++] = strtoull(argv[i], NULL, 0);
    }
    if (nrs_rdv_init(&r, err, sizeof err))
        goto fail;
    int me = nrs_rdv_rank(r);
    if (nrs_rdv_size(r) != 2) {
        snprintf(err, sizeof err, "needs exactly 2 ranks (run under pmix_srv -n 2)");
        goto fail;
    }
    if (nrs_ucx_init(&u, me, 2, &uo, err, sizeof err))
        goto fail;
    nrs_rdv_set_progress(r, nrs_ucx_progress, u);
    const void *addr;
    size_t alen;
    nrs_ucx_address(u, &addr, &alen);
    if (nrs_rdv_allgather(r, 0, "ucx", addr, alen, &addrs, &lens, 30, err, sizeof err) ||
        nrs_ucx_connect(u, addrs, lens, err, sizeof err))
        goto fail;
    for (int k = 0; k < nsizes; k++) {
        size_t size = sizes[k];
        int iters = (int)(total / size) < 5 ? 5 : (int)(total / size);
        char *buf = malloc(size);
        if (!buf) {
            snprintf(err, sizeof err, "out of memory");
            goto fail;
        }
        memset(buf, me + 1, size);
        uint64_t tag = 16 * (uint64_t)k;
        if (one(u, me, buf, size, 2, tag, err, sizeof err) ||
            nrs_rdv_fence(r, (uint64_t)k + 1, NULL, 30, err, sizeof err)) {
            free(buf);
            goto fail;
        }
        double t0 = now_s();
        int bad = one(u, me, buf, size, iters, tag + 4, err, sizeof err);
        double dt = now_s() - t0;
        free(buf);
        if (bad)
            goto fail;
        if (me == 0)
            printf("ours %zu %d %.1f\n", size, iters, (double)size * iters / dt / 1e6);
        fflush(stdout);
    }
    nrs_ucx_disconnect(u, 5);
    rc = nrs_rdv_fence(r, 1000, NULL, 30, err, sizeof err) ? 1 : 0;
    goto out;
fail:
    fprintf(stderr, "bench_transfer: %s\n", err);
out:
    if (addrs)
        nrs_rdv_free_blobs(r, addrs, lens);
    nrs_ucx_fini(u);
    if (r)
        nrs_rdv_fini(r);
    return rc;
}
