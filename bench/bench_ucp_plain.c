/* bench_ucp_plain: the loop ucx_perftest -t tag_bw -O 1 runs, on plain UCP
 * (ucp_tag_send_nbx / ucp_tag_recv_nbx, ucp_worker_progress until done),
 * under the tests' PMIx server like bench_transfer: the same harness, the
 * same address exchange, no Nereus layer. With bench/transfer.sh it splits
 * a gap between our path and ucx_perftest into what the harness costs and
 * what runtime/xfer/ucx.c costs (docs/protocol-dataplane.md §6).
 *
 *   tests/mp/pmix_srv -n 2 -- bench_ucp_plain [--iters N] [--warmup W] [--cpus S,R] SIZE...
 *
 * Rank 0 sends, rank 1 receives, one message in flight, the same buffer
 * every time, a one-byte acknowledgement at the end (--cpus S,R: rank 0 on
 * CPU S, rank 1 on CPU R, as bench_transfer); rank 1 checks that every byte
 * arrived and rank 0 then prints (a failed check: no line, exit status 1)
 *   plain SIZE ITERS WARMUP 1 MiB/s        (MiB = 2^20 bytes, as ucx_perftest)
 *
 *   tests/mp/pmix_srv -n 2 -- bench_ucp_plain --mix PAIRS [--cpus S,R] SIZE...
 *
 * Our layer against this loop in the same two processes: a context of
 * runtime/xfer/ucx.c beside the plain one, and PAIRS pairs of blocks (a block:
 * 8 MiB of messages, at least one, and the acknowledgement), one plain and
 * one through nrs_ucx_isend/irecv and nrs_ucx_waitall, which goes first
 * alternating. Both then run on the same CPUs at the same moment, so load
 * elsewhere on the machine hits both alike (end-to-end runs on a shared
 * machine vary by 2x). Rank 0 prints
 *   mix SIZE PAIRS MSGS_PER_BLOCK RATIO Q1 Q3 PLAIN_MiB/s OURS_MiB/s
 * RATIO: the median over the pairs of plain block time / ours block time
 * (ours' share of plain's bandwidth), Q1, Q3 its quartiles. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ucp/api/ucp.h>

#include "bind.h"
#include "rdv/rdv.h"
#include "util/util.h"
#include "xfer/ucx.h"

typedef struct {
    ucp_worker_h worker;
    ucp_ep_h ep;
    int me;
    volatile int done;
} plain_t;

static void sent(void *req, ucs_status_t st, void *arg)
{
    (void)req;
    ((plain_t *)arg)->done = st == UCS_OK ? 1 : -1;
}

static void received(void *req, ucs_status_t st, const ucp_tag_recv_info_t *info, void *arg)
{
    (void)req;
    (void)info;
    ((plain_t *)arg)->done = st == UCS_OK ? 1 : -1;
}

/* One message of len bytes, from rank `from` to the other: 0 or -1. */
static int one(plain_t *P, int from, void *buf, size_t len, ucp_tag_t tag)
{
    ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                                               UCP_OP_ATTR_FIELD_USER_DATA,
                               .user_data = P};
    void *req;
    P->done = 0;
    if (P->me == from) {
        prm.cb.send = sent;
        req = ucp_tag_send_nbx(P->ep, buf, len, tag, &prm);
    } else {
        prm.cb.recv = received;
        req = ucp_tag_recv_nbx(P->worker, buf, len, tag, (ucp_tag_t)-1, &prm);
    }
    if (UCS_PTR_IS_ERR(req))
        return -1;
    if (req == NULL)
        return 0;
    while (!P->done)
        ucp_worker_progress(P->worker);
    ucp_request_free(req);
    return P->done == 1 ? 0 : -1;
}

static int run(plain_t *P, char *buf, size_t size, int n)
{
    for (int i = 0; i < n; i++)
        if (one(P, 0, buf, size, 0x1337))
            return -1;
    char a = 1;
    return one(P, 1, &a, 1, 0x1338);
}

/* --mix: m messages and the acknowledgement through runtime/xfer/ucx.c */
static int run_ours(nrs_ucx_t *u, int me, char *buf, size_t size, int m, uint64_t *tag,
                    char *err, size_t errlen)
{
    nrs_ucx_op_t *op;
    char a = 1;
    for (int i = 0; i <= m; i++, ++*tag) {
        int ack = i == m, rc = (me == 0) != ack
            ? nrs_ucx_isend(u, 1 - me, ack ? &a : buf, ack ? 1 : size, *tag, &op, err, errlen)
            : nrs_ucx_irecv(u, 1 - me, ack ? &a : buf, ack ? 1 : size, *tag, &op, err, errlen);
        if (rc || nrs_ucx_waitall(u, &op, 1, err, errlen))
            return -1;
    }
    return 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* --mix for one size: pairs of blocks, plain and ours, timed on rank 0;
 * the line rank 0 prints into line */
static int mix(plain_t *P, nrs_ucx_t *u, char *buf, size_t size, int pairs, char *line,
               size_t linelen, char *err, size_t errlen)
{
    int m = size && (8u << 20) / size > 1 ? (int)((8u << 20) / size) : 1;
    double *ratio = calloc((size_t)pairs, sizeof(*ratio)), t[2] = {0, 0};
    uint64_t tag = 0;
    if (!ratio) {
        nrs_seterr(err, errlen, "out of memory");
        return -1;
    }
    for (int i = -1; i < pairs; i++) { /* pair -1: warm-up */
        double dt[2];
        for (int k = 0; k < 2; k++) {
            int ours = (k + i) & 1 ? 1 : 0;
            double t0 = nrs_now_s();
            if (ours ? run_ours(u, P->me, buf, size, m, &tag, err, errlen) : run(P, buf, size, m)) {
                if (!ours)
                    nrs_seterr(err, errlen, "size %zu: a plain transfer failed", size);
                free(ratio);
                return -1;
            }
            dt[ours] = nrs_now_s() - t0;
        }
        if (i >= 0) {
            ratio[i] = dt[0] / dt[1];
            t[0] += dt[0];
            t[1] += dt[1];
        }
    }
    qsort(ratio, (size_t)pairs, sizeof(*ratio), cmp_double);
    double mib = (double)size * m * pairs / 1048576.0;
    snprintf(line, linelen, "mix %zu %d %d %.3f %.3f %.3f %.2f %.2f\n", size, pairs, m,
             ratio[pairs / 2], ratio[pairs / 4], ratio[(3 * pairs) / 4], mib / t[0], mib / t[1]);
    free(ratio);
    return 0;
}

/* --mix: runtime/xfer/ucx.c's context beside the plain one */
static int setup_ours(nrs_ucx_t **u, nrs_rdv_t *r, int me, char *err, size_t errlen)
{
    const void *addr;
    size_t alen, *lens;
    void **addrs;
    if (nrs_ucx_init(u, me, 2, NULL, err, errlen))
        return -1;
    nrs_ucx_address(*u, &addr, &alen);
    if (nrs_rdv_allgather(r, 0, "ucx", addr, alen, &addrs, &lens, 30, err, errlen))
        return -1;
    int rc = nrs_ucx_connect(*u, addrs, lens, err, errlen);
    nrs_rdv_free_blobs(r, addrs, lens);
    return rc;
}

static int setup(plain_t *P, nrs_rdv_t *r, ucp_context_h *ctx, char *err, size_t errlen)
{
    ucp_params_t params = {.field_mask = UCP_PARAM_FIELD_FEATURES, .features = UCP_FEATURE_TAG};
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                              .thread_mode = UCS_THREAD_MODE_SINGLE};
    ucp_address_t *addr;
    size_t alen, *lens;
    void **addrs;
    if (ucp_init(&params, NULL, ctx) != UCS_OK ||
        ucp_worker_create(*ctx, &wp, &P->worker) != UCS_OK ||
        ucp_worker_get_address(P->worker, &addr, &alen) != UCS_OK) {
        nrs_seterr(err, errlen, "ucp set-up failed");
        return -1;
    }
    int rc = nrs_rdv_allgather(r, 0, "plain", addr, alen, &addrs, &lens, 30, err, errlen);
    ucp_worker_release_address(P->worker, addr);
    if (rc)
        return -1;
    ucp_ep_params_t ep = {.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS,
                          .address = addrs[1 - P->me]};
    rc = ucp_ep_create(P->worker, &ep, &P->ep) == UCS_OK ? 0 : -1;
    nrs_rdv_free_blobs(r, addrs, lens);
    if (rc)
        nrs_seterr(err, errlen, "ucp_ep_create failed");
    return rc;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: bench_ucp_plain [--iters N] [--warmup W] [--cpus S,R] SIZE...\n"
               "       bench_ucp_plain --mix PAIRS [--cpus S,R] SIZE...\n"
               "       (two ranks: run under tests/mp/pmix_srv -n 2)\n");
}

int main(int argc, char **argv)
{
    size_t total = 1u << 30, sizes[32];
    int nsizes = 0, iters = 0, warmup = -1, rc = 1, pairs = 0;
    const char *cpus = NULL;
    nrs_ucx_t *u = NULL;
    char err[512] = "";
    nrs_rdv_t *r = NULL;
    ucp_context_h ctx = NULL;
    plain_t P = {0};

    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--cpus") && i + 1 < argc)
            cpus = argv[++i];
        else if (!strcmp(argv[i], "--mix") && i + 1 < argc && atoi(argv[i + 1]) > 0)
            pairs = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--iters") && i + 1 < argc)
            iters = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--warmup") && i + 1 < argc)
            warmup = atoi(argv[++i]);
        else if (argv[i][0] >= '0' && argv[i][0] <= '9' && nsizes < 32)
            sizes[nsizes++] = strtoull(argv[i], NULL, 0);
        else {
            int help = !strcmp(argv[i], "-h") || !strcmp(argv[i], "--help");
            usage(help ? stdout : stderr);
            return help ? 0 : 2;
        }
    }
    if (!nsizes) {
        usage(stderr);
        return 2;
    }
    if (nrs_rdv_init(&r, err, sizeof err))
        goto out;
    P.me = nrs_rdv_rank(r);
    if (nrs_rdv_size(r) != 2) {
        snprintf(err, sizeof err, "needs exactly 2 ranks (run under pmix_srv -n 2)");
        goto out;
    }
    if (nrs_bench_bind(cpus, P.me, err, sizeof err) || setup(&P, r, &ctx, err, sizeof err) ||
        (pairs && setup_ours(&u, r, P.me, err, sizeof err)))
        goto out;
    for (int s = 0; s < nsizes; s++) {
        size_t size = sizes[s];
        int n = iters > 0 ? iters : size && total / size > 5 ? (int)(total / size) : 5;
        int w = warmup >= 0 ? warmup : (n + 9) / 10;
        char *buf = malloc(size ? size : 1);
        if (!buf) {
            snprintf(err, sizeof err, "out of memory");
            goto out;
        }
        memset(buf, P.me == 0 ? 0x5a : 0, size);
        char line[256];
        int bad = 0;
        if (pairs) {
            bad = mix(&P, u, buf, size, pairs, line, sizeof line, err, sizeof err);
        } else {
            if ((w && run(&P, buf, size, w)) ||
                nrs_rdv_fence(r, (uint64_t)s + 1, NULL, 30, err, sizeof err)) {
                free(buf);
                goto out;
            }
            if (P.me == 1)
                memset(buf, 0, size); /* the timed messages must fill it again */
            double t0 = nrs_now_s();
            bad = run(&P, buf, size, n);
            double dt = nrs_now_s() - t0;
            if (bad)
                snprintf(err, sizeof err, "size %zu: a transfer failed", size);
            snprintf(line, sizeof line, "plain %zu %d %d 1 %.2f\n", size, n, w,
                     (double)size * n / dt / 1048576.0);
        }
        if (!bad) /* rank 0 prints only what rank 1 found whole, as bench_transfer */
            bad = nrs_bench_verdict(r, (uint64_t)s + 1,
                                    P.me == 1 && nrs_bench_check(buf, size, err, sizeof err),
                                    err, sizeof err);
        free(buf);
        if (bad)
            goto out;
        if (P.me == 0)
            fputs(line, stdout);
        fflush(stdout);
    }
    if (u)
        nrs_ucx_disconnect(u, 5);
    rc = nrs_rdv_fence(r, 1000, NULL, 30, err, sizeof err) ? 1 : 0;
out:
    if (rc && err[0])
        fprintf(stderr, "bench_ucp_plain: %s\n", err);
    if (P.ep) { /* forced: the peer may be gone already */
        ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                                   .flags = UCP_EP_CLOSE_FLAG_FORCE};
        void *req = ucp_ep_close_nbx(P.ep, &prm);
        while (UCS_PTR_IS_PTR(req) && ucp_request_check_status(req) == UCS_INPROGRESS)
            ucp_worker_progress(P.worker);
        if (UCS_PTR_IS_PTR(req))
            ucp_request_free(req);
    }
    nrs_ucx_fini(u);
    if (P.worker)
        ucp_worker_destroy(P.worker);
    if (ctx)
        ucp_cleanup(ctx);
    if (r)
        nrs_rdv_fini(r);
    return rc;
}
