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
 *
 *   bench_transfer --local [--reps N] SIZE...
 *
 * The in-process path (runtime/emu's local transport: post a send and a
 * receive, progress matches and copies them) against plain memcpy of the same
 * bytes, same buffers, same run, interleaved; both contiguous and strided
 * (rows of SIZE/64 bytes at a pitch of twice that, as a column slice of a
 * row-major shard travels). No PMIx. Prints, per size and shape,
 *   local SHAPE SIZE REPS xport_MB/s memcpy_MB/s ratio
 * taking the best of REPS (default 9) for each, as noise only slows.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "util/util.h"
#include "emu/xport.h"
#include "rdv/rdv.h"
#include "xfer/ucx.h"

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

static double xport_once(nrs_xport_t *x, nrs_xregion_t *dst, nrs_xregion_t *src)
{
    nrs_xreq_t rs, rr;
    double t0 = nrs_now_s();
    if (x->ops->send(x->ctx, 1, src, 7, &rs) || x->ops->recv(x->ctx, 0, dst, 7, &rr))
        return -1;
    while (!(rs.done && rr.done))
        if (x->ops->progress(x->ctx) < 0)
            return -1;
    return nrs_now_s() - t0;
}

static double memcpy_once(nrs_xregion_t *dst, nrs_xregion_t *src)
{
    double t0 = nrs_now_s();
    char *d = (char *)dst->mem->ptr + dst->off;
    const char *s = (const char *)src->mem->ptr + src->off;
    for (size_t i = 0; i < src->rows; i++)
        memcpy(d + i * dst->pitch, s + i * src->pitch, src->row_bytes);
    return nrs_now_s() - t0;
}

static int bench_local(int argc, char **argv)
{
    int reps = 9;
    nrs_xport_t x;
    if (nrs_xport_local_open(&x))
        return 1;
    printf("%-5s %-10s %10s %5s %12s %12s %6s\n", "local", "shape", "bytes", "reps", "xport MB/s",
           "memcpy MB/s", "ratio");
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
            reps = atoi(argv[++i]);
            continue;
        }
        size_t size = strtoull(argv[i], NULL, 0);
        for (int strided = 0; strided < 2; strided++) {
            size_t row = strided ? size / 64 : size, rows = strided ? 64 : 1;
            size_t pitch = strided ? 2 * row : row, span = rows * pitch;
            nrs_xmem_t ms, md;
            if (x.ops->mem_alloc(x.ctx, 0, span, &ms) || x.ops->mem_alloc(x.ctx, 1, span, &md))
                return 1;
            memset(ms.ptr, 1, span);
            memset(md.ptr, 2, span);
            nrs_xregion_t src = {&ms, 0, pitch, rows, row}, dst = {&md, 0, pitch, rows, row};
            double bx = 1e30, bm = 1e30;
            for (int k = 0; k < reps; k++) { /* interleaved: the same machine state */
                double tx = xport_once(&x, &dst, &src), tm = memcpy_once(&dst, &src);
                if (tx < 0)
                    return 1;
                bx = tx < bx ? tx : bx;
                bm = tm < bm ? tm : bm;
            }
            double bytes = (double)(rows * row);
            printf("%-5s %-10s %10zu %5d %12.1f %12.1f %6.2f\n", "local",
                   strided ? "strided" : "contiguous", size, reps, bytes / bx / 1e6,
                   bytes / bm / 1e6, bm / bx);
            x.ops->mem_free(x.ctx, &ms);
            x.ops->mem_free(x.ctx, &md);
        }
    }
    nrs_xport_close(&x);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "--local"))
        return bench_local(argc, argv);
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
        double t0 = nrs_now_s();
        int bad = one(u, me, buf, size, iters, tag + 4, err, sizeof err);
        double dt = nrs_now_s() - t0;
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
