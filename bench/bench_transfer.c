/* bench_transfer: our UCX path (runtime/xfer/ucx: nrs_ucx_isend/irecv, the
 * chunked tag transport the distributed transitions use) between two ranks,
 * one direction (rank 0 sends, rank 1 receives), for the message sizes
 * given; run under tests/mp/pmix_srv -n 2. bench/transfer.sh runs it
 * interleaved with `ucx_perftest -t tag_bw` on the same transport, sizes,
 * iteration and warm-up counts and outstanding window, and prints medians.
 *
 *   bench_transfer [--iters N] [--warmup W] [--outstanding K] [--min-bytes TOTAL]
 *                  [--chunk BYTES] [--window N] [--spin-us US] [--cpus S,R] SIZE...
 *
 * For each size: W warm-up messages (default ceil(ITERS/10), as
 * ucx_perftest's), a fence, then ITERS messages (default
 * max(5, TOTAL / SIZE), TOTAL default 1 GiB) with at most K of them posted
 * at a time (default 1, like `ucx_perftest -O 1`), the same buffer every
 * time, rank 1 acknowledging the last with one byte, as ucx_perftest's
 * tag_bw does. Rank 1 then checks that every byte arrived, and rank 0
 * prints, only when it did (a failed check: no line, exit status 1),
 *   ours SIZE ITERS WARMUP K MiB/s
 * where MiB/s = 2^20 bytes per second: ucx_perftest's "MB/s" is 2^20 too.
 * --cpus S,R binds rank 0 (the sender) to CPU S and rank 1 to CPU R before
 * UCX starts, as `ucx_perftest -c` binds each side.
 *
 *   bench_transfer --local [--reps N] SIZE...
 *
 * The in-process path (runtime/emu's local transport: post a send and a
 * receive, progress matches and copies them) against plain memcpy of the same
 * bytes, same buffers, same run, interleaved; both contiguous and strided
 * (rows of SIZE/64 bytes at a pitch of twice that, as a column slice of a
 * row-major shard travels). No PMIx. Prints, per size and shape,
 *   local SHAPE SIZE REPS xport_MB/s memcpy_MB/s ratio
 * taking the best of REPS (default 9) for each, as noise only slows. The
 * transport's copy is checked once per size and shape, untimed (rows copied,
 * the gaps between them untouched); a wrong copy: exit status 1.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "util/util.h"
#include "emu/xport.h"
#include "bind.h"
#include "rdv/rdv.h"
#include "xfer/ucx.h"
#include "xfer/xport_ucx.h"

/* One byte from rank 1 to rank 0: the end of a timed run. */
static int ack(nrs_ucx_t *u, int me, uint64_t tag, char *err, size_t errlen)
{
    char a = 1;
    nrs_ucx_op_t *op;
    int rc = me == 1 ? nrs_ucx_isend(u, 0, &a, 1, tag, &op, err, errlen)
                     : nrs_ucx_irecv(u, 1, &a, 1, tag, &op, err, errlen);
    return rc || nrs_ucx_waitall(u, &op, 1, err, errlen) ? -1 : 0;
}

/* n messages of size bytes from rank 0 to rank 1 (tags tag, tag+1, ...), at
 * most k posted at a time. */
static int run(nrs_ucx_t *u, int me, char *buf, size_t size, int n, int k, uint64_t tag,
               char *err, size_t errlen)
{
    nrs_ucx_op_t *ops[NRS_UCX_MAX_WINDOW * 4] = {0};
    int posted = 0, head = 0;
    if (k < 1)
        k = 1;
    if (k > (int)(sizeof ops / sizeof ops[0]))
        k = (int)(sizeof ops / sizeof ops[0]);
    for (int done = 0; done < n;) {
        if (posted < n && posted - done < k) {
            int rc = me == 0 ? nrs_ucx_isend(u, 1, buf, size, tag + (uint64_t)posted,
                                             &ops[posted % k], err, errlen)
                             : nrs_ucx_irecv(u, 0, buf, size, tag + (uint64_t)posted,
                                             &ops[posted % k], err, errlen);
            if (rc)
                goto fail;
            posted++;
            continue;
        }
        head = done % k; /* the oldest; waitall progresses all of them */
        if (nrs_ucx_waitall(u, &ops[head], 1, err, errlen))
            goto fail;
        done++;
    }
    return 0;
fail:
    for (int i = 0; i < k; i++)
        nrs_ucx_op_free(ops[i]);
    return -1;
}

static int identity(void *arg, int owner)
{
    (void)arg;
    return owner;
}

/* The same through the executor's transport table (xport_ucx), waiting as
 * runtime/worker/dtrans.c does: progress, and a 20 us nap when it reported
 * nothing completed. */
static int run_xport(nrs_xport_t *x, int me, nrs_xmem_t *m, size_t size, int n, int k,
                     uint64_t tag, char *err, size_t errlen)
{
    nrs_xreq_t reqs[NRS_UCX_MAX_WINDOW * 4];
    nrs_xregion_t reg = {m, 0, size, 1, size};
    int posted = 0;
    if (k < 1)
        k = 1;
    if (k > (int)(sizeof reqs / sizeof reqs[0]))
        k = (int)(sizeof reqs / sizeof reqs[0]);
    for (int done = 0; done < n;) {
        if (posted < n && posted - done < k) {
            nrs_xreq_t *q = &reqs[posted % k];
            int rc = me == 0 ? x->ops->send(x->ctx, 1, &reg, tag + (uint64_t)posted, q)
                             : x->ops->recv(x->ctx, 0, &reg, tag + (uint64_t)posted, q);
            if (rc)
                goto fail;
            posted++;
            continue;
        }
        if (reqs[done % k].done) {
            done++;
            continue;
        }
        int got = x->ops->progress(x->ctx);
        if (got < 0)
            goto fail;
        if (!got)
            nrs_nap_us(20);
    }
    return 0;
fail:
    snprintf(err, errlen, "%s", nrs_xport_ucx_error(x));
    return -1;
}

/* n messages and the acknowledgement, through ucx.h or through xport_ucx */
static int measure(nrs_ucx_t *u, nrs_xport_t *x, int use_xport, int me, nrs_xmem_t *m, int n,
                   int k, uint64_t tag, char *err, size_t errlen)
{
    int rc = use_xport ? run_xport(x, me, m, m->bytes, n, k, tag, err, errlen)
                       : run(u, me, m->ptr, m->bytes, n, k, tag, err, errlen);
    return rc || ack(u, me, tag + (uint64_t)n, err, errlen) ? -1 : 0;
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

/* The xport's copy of src into dst, checked: the rows hold src's bytes (1),
 * the gaps between them still dst's own (2). Untimed, once per size and
 * shape, on dst refilled first: memcpy_once leaves the same bytes there. */
static int local_check(nrs_xport_t *x, nrs_xregion_t *dst, nrs_xregion_t *src, size_t span,
                       char *err, size_t errlen)
{
    char *d = dst->mem->ptr;
    memset(d, 2, span);
    if (xport_once(x, dst, src) < 0) {
        snprintf(err, errlen, "the local transport failed");
        return -1;
    }
    const char *c = getenv("NRS_BENCH_CORRUPT");
    if (c && !strcmp(c, "1"))
        d[span / 2] ^= 1;
    for (size_t i = 0; i < span; i++)
        if (d[i] != (i % dst->pitch < dst->row_bytes ? 1 : 2)) {
            snprintf(err, errlen, "%zu bytes: byte %zu of the copy is wrong",
                     src->rows * src->row_bytes, i);
            return -1;
        }
    return 0;
}

/* A size or a count: digits only, at least min. */
static int parse_count(const char *s, size_t min, size_t *out)
{
    char *end;
    if (*s < '0' || *s > '9')
        return -1;
    *out = strtoull(s, &end, 0);
    return *end || *out < min ? -1 : 0;
}

/* One size and shape of --local: the copy checked, then REPS interleaved
 * pairs, the best of each printed. 0, or 1 with the message printed. */
static int local_one(nrs_xport_t *x, size_t size, int strided, size_t reps)
{
    size_t row = strided ? size / 64 : size, rows = strided ? 64 : 1;
    size_t pitch = strided ? 2 * row : row, span = rows * pitch;
    nrs_xmem_t ms = {0}, md = {0};
    char err[256] = "out of memory";
    double bx = 1e30, bm = 1e30;
    int rc = 1;
    if (x->ops->mem_alloc(x->ctx, 0, span, &ms) || x->ops->mem_alloc(x->ctx, 1, span, &md))
        goto out;
    memset(ms.ptr, 1, span);
    memset(md.ptr, 2, span);
    nrs_xregion_t src = {&ms, 0, pitch, rows, row}, dst = {&md, 0, pitch, rows, row};
    if (local_check(x, &dst, &src, span, err, sizeof err))
        goto out;
    for (size_t k = 0; k < reps; k++) { /* interleaved: the same machine state */
        double tx = xport_once(x, &dst, &src), tm = memcpy_once(&dst, &src);
        if (tx < 0) {
            snprintf(err, sizeof err, "the local transport failed");
            goto out;
        }
        bx = tx < bx ? tx : bx;
        bm = tm < bm ? tm : bm;
    }
    double bytes = (double)(rows * row);
    printf("%-5s %-10s %10zu %5zu %12.1f %12.1f %6.2f\n", "local",
           strided ? "strided" : "contiguous", size, reps, bytes / bx / 1e6, bytes / bm / 1e6,
           bm / bx);
    rc = 0;
out:
    if (rc)
        fprintf(stderr, "bench_transfer --local: %s\n", err);
    if (ms.ptr)
        x->ops->mem_free(x->ctx, &ms);
    if (md.ptr)
        x->ops->mem_free(x->ctx, &md);
    return rc;
}

static int bench_local(int argc, char **argv)
{
    size_t reps = 9, size, n;
    nrs_xport_t x;
    for (int i = 2; i < argc; i++) /* every argument checked before the first figure */
        if (!strcmp(argv[i], "--reps") && i + 1 < argc ? parse_count(argv[++i], 1, &n)
                                                        : parse_count(argv[i], 64, &n)) {
            fprintf(stderr, "bench_transfer --local: bad argument %s (sizes: bytes, 64 at "
                            "least; --reps: 1 at least)\n", argv[i]);
            return 2;
        }
    if (nrs_xport_local_open(&x))
        return 1;
    printf("%-5s %-10s %10s %5s %12s %12s %6s\n", "local", "shape", "bytes", "reps", "xport MB/s",
           "memcpy MB/s", "ratio");
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--reps")) {
            parse_count(argv[++i], 1, &reps);
            continue;
        }
        parse_count(argv[i], 64, &size);
        for (int strided = 0; strided < 2; strided++)
            if (local_one(&x, size, strided, reps)) {
                nrs_xport_close(&x);
                return 1;
            }
    }
    nrs_xport_close(&x);
    return 0;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: bench_transfer [--iters N] [--warmup W] [--outstanding K]\n"
               "                      [--min-bytes TOTAL] [--chunk BYTES] [--window N]\n"
               "                      [--spin-us US] [--cpus S,R] SIZE...\n"
               "         (two ranks: run under tests/mp/pmix_srv -n 2; see bench/transfer.sh)\n"
               "       bench_transfer --local [--reps N] SIZE...\n");
}

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "--local"))
        return bench_local(argc, argv);
    nrs_ucx_opts_t uo;
    size_t total = 1u << 30, sizes[32];
    int nsizes = 0, rc = 1, fixed_iters = 0, warmup = -1, k = 1, use_xport = 0;
    const char *cpus = NULL;
    char err[512];
    nrs_rdv_t *r = NULL;
    nrs_ucx_t *u = NULL;
    void **addrs = NULL;
    size_t *lens = NULL;

    nrs_ucx_opts_init(&uo);
    for (int i = 1; i < argc; i++) {
        int more = i + 1 < argc;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--chunk") && more)
            uo.chunk_bytes = strtoull(argv[++i], NULL, 0);
        else if (!strcmp(argv[i], "--window") && more)
            uo.window = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--min-bytes") && more)
            total = strtoull(argv[++i], NULL, 0);
        else if (!strcmp(argv[i], "--iters") && more)
            fixed_iters = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--warmup") && more)
            warmup = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--cpus") && more)
            cpus = argv[++i];
        else if (!strcmp(argv[i], "--xport"))
            use_xport = 1;
        else if (!strcmp(argv[i], "--spin-us") && more)
            uo.spin_s = atof(argv[++i]) * 1e-6; /* < 0: nap as soon as idle */
        else if (!strcmp(argv[i], "--outstanding") && more)
            k = atoi(argv[++i]);
        else if (nsizes < 32 && !parse_count(argv[i], 1, &sizes[nsizes]))
            nsizes++;
        else {
            usage(stderr);
            return 2;
        }
    }
    if (!nsizes) {
        usage(stderr);
        return 2;
    }
    if (nrs_rdv_init(&r, err, sizeof err))
        goto fail;
    int me = nrs_rdv_rank(r);
    if (nrs_rdv_size(r) != 2) {
        snprintf(err, sizeof err, "needs exactly 2 ranks (run under pmix_srv -n 2)");
        goto fail;
    }
    if (nrs_bench_bind(cpus, me, err, sizeof err) ||
        nrs_ucx_init(&u, me, 2, &uo, err, sizeof err))
        goto fail;
    nrs_rdv_set_progress(r, nrs_ucx_progress, u);
    const void *addr;
    size_t alen;
    nrs_ucx_address(u, &addr, &alen);
    if (nrs_rdv_allgather(r, 0, "ucx", addr, alen, &addrs, &lens, 30, err, sizeof err) ||
        nrs_ucx_connect(u, addrs, lens, err, sizeof err))
        goto fail;
    nrs_xport_t x = {0};
    if (use_xport && nrs_xport_ucx_open(&x, u, identity, NULL)) {
        snprintf(err, sizeof err, "out of memory");
        goto fail;
    }
    for (int s = 0; s < nsizes; s++) {
        size_t size = sizes[s];
        int iters = fixed_iters > 0 ? fixed_iters
                    : size && total / size > 5 ? (int)(total / size) : 5;
        int warm = warmup >= 0 ? warmup : (iters + 9) / 10;
        nrs_xmem_t m = {0};
        m.bytes = size;
        if (use_xport ? x.ops->mem_alloc(x.ctx, me, size, &m) : !(m.ptr = malloc(size ? size : 1))) {
            snprintf(err, sizeof err, "out of memory");
            goto fail;
        }
        char *buf = m.ptr;
        memset(buf, me == 0 ? 0x5a : 0, size);
        uint64_t tag = (uint64_t)s << 24;
        if ((warm && measure(u, &x, use_xport, me, &m, warm, k, tag, err, sizeof err)) ||
            nrs_rdv_fence(r, (uint64_t)s + 1, NULL, 30, err, sizeof err)) {
            free(buf);
            goto fail;
        }
        if (me == 1)
            memset(buf, 0, size); /* the timed messages must fill it again */
        double t0 = nrs_now_s();
        int bad = measure(u, &x, use_xport, me, &m, iters, k, tag + (1u << 23), err, sizeof err);
        double dt = nrs_now_s() - t0;
        if (!bad) /* rank 0 prints only what rank 1 found whole */
            bad = nrs_bench_verdict(r, (uint64_t)s + 1,
                                    me == 1 && nrs_bench_check(buf, size, err, sizeof err), err,
                                    sizeof err);
        free(buf);
        if (bad)
            goto fail;
        if (me == 0)
            printf("%s %zu %d %d %d %.2f\n", use_xport ? "xport" : "ours", size, iters, warm, k,
                   (double)size * iters / dt / 1048576.0);
        fflush(stdout);
    }
    if (use_xport)
        nrs_xport_close(&x);
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
