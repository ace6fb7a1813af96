/* NCCL behind the executor's transport table (xport_nccl.h). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "emu/graph.h"
#include "util/util.h"
#include "xfer/xport_nccl.h"

#define MEM_DEVICE 1
#define MEM_HOST 2
/* Posted transfers wait for the stream to drain or for this many more
 * before they go out as a group: fewer, larger groups. */
#define GROUP_MIN 16

/* Offsets of the regions packed into one staging buffer for one group. */
#define STAGE_ALIGN 256

typedef struct {
    nrs_xreq_t *req;
    int is_send, peer; /* communicator rank */
    nrs_xregion_t r;
    int64_t ticket; /* -1 until it went out */
} npost_t;

/* A staging buffer: strided regions are packed into it (sends) or received
 * into it (receives), at distinct offsets within one group. */
typedef struct {
    void *p;
    size_t n;
} stage_t;

typedef struct {
    nrs_nccl_t *c;
    int device;
    nrs_owner_rank_fn owner_rank;
    void *arg;
    int *comm_rank, nranks;
    double timeout_s;
    npost_t *q; /* posts in order: [head, head + n), the first nout of them out */
    size_t head, n, nout, cap;
    stage_t stage[2];  /* [1] for strided sends, [0] for strided receives */
    size_t stage_want; /* their size: the graph's chunk (preconnect), else what a post needs */
    void **dfree; /* device frees deferred while transfers were posted */
    size_t ndfree, dfcap;
    int failed;
    int rounds; /* at most this many rounds in a group (run_length); 0: no bound */
    char err[256];
} xn_t;

static int contiguous(const nrs_xregion_t *r)
{
    return r->rows <= 1 || r->pitch == r->row_bytes;
}

static int xn_fail(xn_t *X, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int xn_fail(xn_t *X, const char *fmt, ...)
{
    va_list ap;
    if (!X->failed++) {
        va_start(ap, fmt);
        vsnprintf(X->err, sizeof X->err, fmt, ap);
        va_end(ap);
    }
    return -1;
}

/* ---- memory --------------------------------------------------------------------------- */

static int n_progress(void *ctx);

/* Every post done, and with them the deferred frees (n_free): 0, or -1
 * (failed; or no transfer completed for timeout_s, the communicator is
 * aborted then). Free of deadlock as any grouping is (xport_nccl.h): what
 * is posted comes before the caller's next operation in the global order,
 * so no peer needs this rank to go further first. */
static int drain(xn_t *X)
{
    double end = nrs_awake_s() + X->timeout_s;
    while (X->n) {
        int k = n_progress(X);
        if (k < 0)
            return -1;
        if (k > 0) {
            end = nrs_awake_s() + X->timeout_s;
        } else if (nrs_awake_s() > end) {
            nrs_nccl_abort(X->c);
            return xn_fail(X, "nccl xport: no transfer completed for %.1f s (%zu posted) "
                           "before an allocation", X->timeout_s, X->n);
        } else {
            nrs_nap_us(20);
        }
    }
    return 0;
}

static int n_alloc(void *ctx, int owner, size_t bytes, nrs_xmem_t *out)
{
    xn_t *X = ctx;
    char err[256];
    *out = (nrs_xmem_t){.owner = owner, .bytes = bytes};
    if (owner < 0) {
        out->ptr = malloc(bytes ? bytes : 1);
        out->handle = MEM_HOST;
        return out->ptr ? 0 : xn_fail(X, "nccl xport: out of host memory");
    }
    /* A free the schedule put before this allocation may still wait
     * (n_free): the schedule counted its bytes as gone, and under a tight
     * cap this allocation needs them (the scheduler frees old buffers
     * lazily, when an allocation needs the room). So the posts drain first
     * and the frees go, then the allocation. */
    if (X->ndfree && drain(X))
        return -1;
    if (nrs_cuda_alloc(X->device, bytes, &out->ptr, err, sizeof err))
        return xn_fail(X, "nccl xport: %s", err);
    out->handle = MEM_DEVICE;
    return 0;
}

/* cudaFree synchronizes the device: with NCCL kernels out that wait for a
 * peer, it would block this rank (no progress, no failure checks, no
 * abort) until they end, perhaps for ever. So a device buffer is freed at
 * once only when nothing is posted; else at the next moment nothing is
 * (n_progress, nrs_xport_nccl_release), or after the communicator's abort. */
static void flush_frees(xn_t *X)
{
    for (size_t i = 0; i < X->ndfree; i++)
        nrs_cuda_free(X->device, X->dfree[i]);
    X->ndfree = 0;
}

static void n_free(void *ctx, nrs_xmem_t *m)
{
    xn_t *X = ctx;
    if (m->handle != MEM_DEVICE) {
        free(m->ptr);
    } else if (!X->n) {
        nrs_cuda_free(X->device, m->ptr);
    } else {
        if (X->ndfree == X->dfcap) {
            size_t cap = X->dfcap ? 2 * X->dfcap : 64;
            void **v = realloc(X->dfree, cap * sizeof(*v));
            if (!v) { /* no room to wait: free now, and block if it must */
                nrs_cuda_free(X->device, m->ptr);
                m->ptr = NULL;
                return;
            }
            X->dfree = v;
            X->dfcap = cap;
        }
        X->dfree[X->ndfree++] = m->ptr;
    }
    m->ptr = NULL;
}

static int n_zero(void *ctx, nrs_xmem_t *m)
{
    xn_t *X = ctx;
    char err[256];
    if (m->handle != MEM_DEVICE) {
        memset(m->ptr, 0, m->bytes);
        return 0;
    }
    return nrs_cuda_zero(X->device, m->ptr, m->bytes, err, sizeof err)
               ? xn_fail(X, "nccl xport: %s", err) : 0;
}

void nrs_xport_nccl_wrap(nrs_xmem_t *m, void *dev, int owner, size_t bytes)
{
    *m = (nrs_xmem_t){.ptr = dev, .owner = owner, .bytes = bytes, .handle = MEM_DEVICE};
}

static char *base(const nrs_xregion_t *r) { return (char *)r->mem->ptr + r->off; }

static int n_copy(void *ctx, const nrs_xregion_t *dst, const nrs_xregion_t *src)
{
    xn_t *X = ctx;
    char err[256];
    if (src->rows != dst->rows || src->row_bytes != dst->row_bytes || !nrs_xregion_ok(src) ||
        !nrs_xregion_ok(dst))
        return xn_fail(ctx, "nccl xport: copy between unequal or out-of-bounds regions");
    bool sd = src->mem->handle == MEM_DEVICE, dd = dst->mem->handle == MEM_DEVICE;
    if (!sd && !dd) {
        for (size_t i = 0; i < src->rows; i++)
            memmove(base(dst) + i * dst->pitch, base(src) + i * src->pitch, src->row_bytes);
        return 0;
    }
    nrs_cuda_copy2d_t cp = {base(dst), src->rows > 1 ? dst->pitch : src->row_bytes, base(src),
                            src->rows > 1 ? src->pitch : src->row_bytes, src->row_bytes,
                            src->rows};
    if (nrs_cuda_copy2d(X->device, &cp, sd && dd ? 'x' : dd ? 'h' : 'd', err, sizeof err))
        return xn_fail(ctx, "nccl xport: %s", err);
    return 0;
}

/* ---- staging ---------------------------------------------------------------------------
 * The transition's reserve (NRS_COST_RESERVE_BYTES, docs/transitions.md
 * "Memory") is two chunks of every GPU: one strided send and one strided
 * receive in flight, each packed through at most a chunk. So the device
 * staging is two buffers, one for the sends and one for the receives, of a
 * chunk each (preconnect: the graph's), made at the first strided post that
 * needs them. A group packs its strided sends at distinct offsets of the
 * send buffer and receives its strided receives into distinct offsets of
 * the receive buffer; a run ends before a strided post that no longer fits
 * (run_length). The next group reuses the buffers at once: everything
 * (packing, the group, unpacking) is on the communicator's stream, so the
 * next group's packing runs after the last group's transfers and its
 * receives after the last unpacking. Nothing waits for a buffer, and the
 * groups stay consecutive runs of the posts (the deadlock argument,
 * xport_nccl.h). Only a post larger than a buffer (no preconnect: sized by
 * the posts; never one of a graph's, whose strided transfers are at most a
 * chunk) waits: the buffer is replaced, which needs cudaFree, when nothing
 * is out. */

static void stage_free(xn_t *X)
{
    for (int d = 0; d < 2; d++) {
        nrs_cuda_free(X->device, X->stage[d].p);
        X->stage[d] = (stage_t){0};
    }
}

static size_t stage_round(size_t n) { return (n + STAGE_ALIGN - 1) / STAGE_ALIGN * STAGE_ALIGN; }

/* Bytes of post p packed into a staging buffer, 0 when it needs none. */
static size_t staged_bytes(const npost_t *p)
{
    return contiguous(&p->r) ? 0 : p->r.rows * p->r.row_bytes;
}

/* The buffer of direction d holds at least bytes: 0; 1 when it cannot be
 * replaced yet (posts out); -1 failed. */
static int stage_fit(xn_t *X, int d, size_t bytes)
{
    stage_t *s = &X->stage[d];
    char err[256];
    if (s->n >= bytes)
        return 0;
    if (s->p && X->nout)
        return 1;
    nrs_cuda_free(X->device, s->p); /* nothing out: it does not wait for a peer */
    *s = (stage_t){0};
    size_t n = bytes > X->stage_want ? bytes : X->stage_want;
    if (nrs_cuda_alloc(X->device, n, &s->p, err, sizeof err))
        return xn_fail(X, "nccl xport: staging buffer: %s", err);
    s->n = n;
    return 0;
}

/* ---- transfers ------------------------------------------------------------------------ */

/* The communicator rank holding owner's memory, or -1. */
static int comm_rank_of(const xn_t *X, int owner)
{
    int r = X->owner_rank(X->arg, owner);
    return r >= 0 && r < X->nranks ? X->comm_rank[r] : -1;
}

static int n_post(xn_t *X, int is_send, int peer_owner, const nrs_xregion_t *r, nrs_xreq_t *req)
{
    int cr = comm_rank_of(X, peer_owner);
    req->done = 0;
    if (X->failed)
        return -1;
    if (cr < 0)
        return xn_fail(X, "nccl xport: owner %d: no rank of the communicator holds it", peer_owner);
    if (!nrs_xregion_ok(r) || r->mem->handle != MEM_DEVICE)
        return xn_fail(X, "nccl xport: %s", !nrs_xregion_ok(r) ? "region out of bounds"
                                            : "host memory cannot travel over NCCL");
    if (X->head + X->n == X->cap) {
        if (X->head) { /* room at the front: move the live posts down */
            memmove(X->q, X->q + X->head, X->n * sizeof(*X->q));
            X->head = 0;
        } else {
            size_t cap = X->cap ? 2 * X->cap : 64;
            npost_t *v = realloc(X->q, cap * sizeof(*v));
            if (!v)
                return xn_fail(X, "nccl xport: out of memory");
            X->q = v;
            X->cap = cap;
        }
    }
    X->q[X->head + X->n++] = (npost_t){.req = req, .is_send = is_send, .peer = cr, .r = *r,
                                       .ticket = -1};
    return 0;
}

static int n_send(void *ctx, int peer, const nrs_xregion_t *src, uint64_t tag, nrs_xreq_t *req)
{
    (void)tag; /* NCCL matches by order (xport_nccl.h) */
    return n_post(ctx, 1, peer, src, req);
}

static int n_recv(void *ctx, int peer, const nrs_xregion_t *dst, uint64_t tag, nrs_xreq_t *req)
{
    (void)tag;
    return n_post(ctx, 0, peer, dst, req);
}

/* How many of the k posts at p go out together: the longest run with at
 * most one transfer per peer and direction, its strided regions within the
 * staging buffers (after the first of each direction, which fits: issue),
 * and at most RUN_ROUNDS rounds. NCCL progresses the transfers of a group
 * to different peers independently, but runs a second one to the same peer
 * after the first, behind whatever shares its channel; a rank whose peer
 * waits for that second one could wait for ever. Rounds: NCCL files a
 * group's transfers by round, the distance to the peer (a send to me + r
 * and a receive from me - r are round r), and a channel's batch holds at
 * most 8 transfers, each of another round; a channel runs its batches one
 * after another (NVIDIA/nccl enqueue.cc, NCCL_MAX_DEV_WORK_P2P_PER_BATCH).
 * So a group of more than 8 rounds could hold a transfer whose peer has not
 * posted it yet in front of the one the peer waits for: beyond 9 ranks
 * only. NRS_NCCL_GROUP_ROUNDS=N (1-64; 0: no bound) changes the 8, for the
 * tests (test_fakegpu.sh: the strict double counts rounds the same way). */
#define RUN_ROUNDS 8
#define RUN_ROUNDS_MAX 64
static size_t run_length(const xn_t *X, const npost_t *p, size_t k)
{
    int me = nrs_nccl_rank(X->c), size = nrs_nccl_size(X->c), round[RUN_ROUNDS_MAX], nround = 0;
    size_t n = 0, packed[2] = {0, 0};
    for (; n < k; n++) {
        for (size_t j = 0; j < n; j++)
            if (p[j].peer == p[n].peer && p[j].is_send == p[n].is_send)
                return n;
        size_t b = staged_bytes(&p[n]); /* into the staging buffer (above) */
        if (b && packed[p[n].is_send] && packed[p[n].is_send] + b > X->stage[p[n].is_send].n)
            return n;
        packed[p[n].is_send] = stage_round(packed[p[n].is_send] + b);
        int r = ((p[n].is_send ? p[n].peer - me : me - p[n].peer) % size + size) % size, seen = 0;
        for (int j = 0; j < nround && !seen; j++)
            seen = round[j] == r;
        if (!seen && X->rounds && nround == X->rounds)
            return n;
        if (!seen && nround < RUN_ROUNDS_MAX)
            round[nround++] = r;
    }
    return n;
}

/* The first strided post of each direction among the k at p has a
 * staging buffer that holds it: 0; 1 when one must wait (stage_fit); -1. */
static int stage_ready(xn_t *X, const npost_t *p, size_t k)
{
    int seen[2] = {0, 0};
    for (size_t i = 0; i < k && !(seen[0] && seen[1]); i++) {
        size_t b = staged_bytes(&p[i]);
        if (!b || seen[p[i].is_send]++)
            continue;
        int rc = stage_fit(X, p[i].is_send, b);
        if (rc)
            return rc;
    }
    return 0;
}

/* The next run of the posts not yet out, as one group between their
 * packing and unpacking: 1, 0 when it must wait for a staging buffer
 * (nothing went out), or -1. */
static int issue(xn_t *X)
{
    npost_t *p = X->q + X->head + X->nout;
    size_t k = run_length(X, p, X->n - X->nout), at[2] = {0, 0};
    int ready = stage_ready(X, p, k); /* (buffers only grow: the run still fits) */
    if (ready)
        return ready > 0 ? 0 : -1;
    nrs_cuda_copy2d_t *pre = calloc(k, sizeof(*pre)), *post = calloc(k, sizeof(*post));
    nrs_nccl_xfer_t *x = calloc(k, sizeof(*x));
    int npre = 0, npost = 0, rc = -1;
    char err[256];
    if (!pre || !post || !x) {
        xn_fail(X, "nccl xport: out of memory");
        goto out;
    }
    for (size_t i = 0; i < k; i++) {
        const nrs_xregion_t *r = &p[i].r;
        size_t bytes = r->rows * r->row_bytes;
        void *buf = base(r);
        if (staged_bytes(&p[i])) {
            int d = p[i].is_send;
            buf = (char *)X->stage[d].p + at[d];
            at[d] = stage_round(at[d] + bytes);
            nrs_cuda_copy2d_t packed = {buf, r->row_bytes, base(r), r->pitch, r->row_bytes,
                                        r->rows};
            nrs_cuda_copy2d_t unpacked = {base(r), r->pitch, buf, r->row_bytes, r->row_bytes,
                                          r->rows};
            if (d)
                pre[npre++] = packed;
            else
                post[npost++] = unpacked;
        }
        x[i] = (nrs_nccl_xfer_t){p[i].peer, p[i].is_send, buf, bytes};
    }
    int64_t t = nrs_nccl_post(X->c, pre, npre, x, (int)k, post, npost, X->timeout_s, err,
                              sizeof err);
    if (t < 0) {
        xn_fail(X, "nccl xport: %s", err);
        goto out;
    }
    for (size_t i = 0; i < k; i++)
        p[i].ticket = t;
    X->nout += k;
    rc = 1;
out:
    free(pre);
    free(post);
    free(x);
    return rc;
}

static int n_progress(void *ctx)
{
    xn_t *X = ctx;
    char err[256];
    int64_t done;
    if (X->failed)
        return -1;
    if (nrs_nccl_poll(X->c, &done, err, sizeof err))
        return xn_fail(X, "nccl xport: %s", err);
    int completed = 0;
    while (X->nout && X->q[X->head].ticket < done) {
        X->q[X->head].req->done = 1;
        X->head++;
        X->n--;
        X->nout--;
        completed++;
    }
    if (X->n == 0) {
        X->head = 0;
        flush_frees(X);
    }
    /* out now when the stream has drained (nothing would wait behind it)
     * or enough have gathered; each group a run of them (run_length) */
    if (X->n > X->nout && (X->nout == 0 || X->n - X->nout >= GROUP_MIN)) {
        int rc = 1;
        while (X->n > X->nout && (rc = issue(X)) > 0)
            ;
        if (rc < 0)
            return -1;
    }
    return completed;
}

/* Every post dropped; the communicator aborted first when any were out, so
 * that no staging buffer is still in use. */
static void drop_all(xn_t *X)
{
    if (X->nout)
        nrs_nccl_abort(X->c);
    X->head = X->n = X->nout = 0;
    stage_free(X);
    flush_frees(X);
}

static void n_destroy(void *ctx)
{
    xn_t *X = ctx;
    drop_all(X);
    free(X->dfree);
    free(X->q);
    free(X->comm_rank);
    free(X);
}

static const nrs_xport_ops_t nccl_ops = {"nccl", n_alloc, n_free,     n_copy, n_send,
                                         n_recv, n_progress, n_destroy, n_zero};

int nrs_xport_nccl_open(nrs_xport_t *x, nrs_nccl_t *c, int device, nrs_owner_rank_fn owner_rank,
                        void *arg, const int *comm_rank, int nranks, double timeout_s)
{
    xn_t *X = calloc(1, sizeof(*X));
    if (!X || !(X->comm_rank = malloc((size_t)(nranks > 0 ? nranks : 1) * sizeof(int)))) {
        free(X);
        return -1;
    }
    memcpy(X->comm_rank, comm_rank, (size_t)nranks * sizeof(int));
    X->c = c;
    X->device = device;
    X->owner_rank = owner_rank;
    X->arg = arg;
    X->nranks = nranks;
    X->timeout_s = timeout_s > 0 ? timeout_s : 30;
    const char *rounds = getenv("NRS_NCCL_GROUP_ROUNDS");
    char *end = NULL;
    long r = rounds && *rounds ? strtol(rounds, &end, 10) : RUN_ROUNDS;
    /* (a word that is not a number is not 0, no bound: the default) */
    X->rounds = end && *end ? RUN_ROUNDS : r < 0 || r > RUN_ROUNDS_MAX ? RUN_ROUNDS : (int)r;
    x->ops = &nccl_ops;
    x->ctx = X;
    return 0;
}

const char *nrs_xport_nccl_error(const nrs_xport_t *x)
{
    return ((const xn_t *)x->ctx)->err;
}

void nrs_xport_nccl_cancel(nrs_xport_t *x)
{
    xn_t *X = x->ctx;
    if (X->n)
        nrs_nccl_abort(X->c); /* NCCL cannot take back one transfer */
    drop_all(X);
    X->failed = 0;
    X->err[0] = '\0';
}

void nrs_xport_nccl_release(nrs_xport_t *x)
{
    xn_t *X = x->ctx;
    if (!X->n) {
        flush_frees(X);
        stage_free(X); /* the reserve is the transition's only */
    }
}

/* ---- connections before the transfers ------------------------------------------------ */

static void add_peer(const xn_t *X, int *peers, int *np, int cr)
{
    if (cr < 0 || cr == nrs_nccl_rank(X->c))
        return;
    for (int i = 0; i < *np; i++)
        if (peers[i] == cr)
            return;
    peers[(*np)++] = cr;
}

int nrs_xport_nccl_preconnect(nrs_xport_t *x, const nrs_emu_graph_t *g, double timeout_s)
{
    xn_t *X = x->ctx;
    int me = nrs_nccl_rank(X->c), n = nrs_nccl_size(X->c), np = 0, rc = -1;
    int *peers = malloc((size_t)(n > 0 ? n : 1) * sizeof(*peers));
    nrs_nccl_xfer_t *xf = NULL;
    void *buf = NULL;
    char err[256];
    if (!peers)
        return xn_fail(X, "nccl xport: out of memory");
    X->stage_want = g->chunk > 0 ? (size_t)g->chunk : 0;
    for (size_t i = 0; i < g->nops; i++) {
        const nrs_emu_op_t *op = &g->ops[i];
        if (op->type != NRS_EMU_OP_XFER)
            continue;
        int cs = comm_rank_of(X, g->buf[op->src_buf].b.gpu);
        int cd = comm_rank_of(X, g->buf[op->dst_buf].b.gpu);
        if (cs == me)
            add_peer(X, peers, &np, cd);
        else if (cd == me)
            add_peer(X, peers, &np, cs);
    }
    if (!np) {
        free(peers);
        return 0;
    }
    if (!(xf = calloc(2 * (size_t)np, sizeof(*xf))) ||
        nrs_cuda_alloc(X->device, 2 * (size_t)np, &buf, err, sizeof err)) {
        xn_fail(X, "nccl xport: pre-connect: %s", xf ? err : "out of memory");
        goto out;
    }
    /* one byte each way with every peer, in one group that is the same on
     * both sides of each pair: NCCL sets up each connection at its first
     * use, blocking until the peer takes part, and groups that differ
     * between ranks could wait for each other there */
    for (int i = 0; i < np; i++) {
        xf[2 * i] = (nrs_nccl_xfer_t){peers[i], 1, (char *)buf + 2 * i, 1};
        xf[2 * i + 1] = (nrs_nccl_xfer_t){peers[i], 0, (char *)buf + 2 * i + 1, 1};
    }
    double end = nrs_awake_s() + timeout_s;
    int64_t t = nrs_nccl_post(X->c, NULL, 0, xf, 2 * np, NULL, 0, timeout_s, err, sizeof err), done = 0;
    while (t >= 0 && !nrs_nccl_poll(X->c, &done, err, sizeof err) && done <= t &&
           nrs_awake_s() < end)
        nrs_nap_us(50);
    if (t < 0 || done <= t) {
        if (t >= 0 && done <= t && !nrs_nccl_aborted(X->c)) {
            snprintf(err, sizeof err, "timed out after %.1f s", timeout_s);
            nrs_nccl_abort(X->c);
        }
        xn_fail(X, "nccl xport: pre-connect with %d peer(s): %s", np, err);
        goto out;
    }
    rc = 0;
out:
    nrs_cuda_free(X->device, buf);
    free(xf);
    free(peers);
    return rc;
}
