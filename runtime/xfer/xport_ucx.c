/* UCX behind the executor's transport table (xport_ucx.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/util.h"
#include "xfer/xport_ucx.h"

typedef struct post {
    struct post *next;
    struct xu *X;
    nrs_ucx_op_t *op;
    nrs_xreq_t *req;
    nrs_xregion_t region; /* recv into a strided region: unpack on completion */
    unsigned char *bounce; /* owned by op once posted (nrs_ucx_op_adopt): an op
                            * freed while UCX still holds a request of it keeps
                            * it until that request ends */
    int is_send, ended, status, reported;
} post_t;

typedef struct xu {
    nrs_ucx_t *u;
    nrs_owner_rank_fn owner_rank;
    void *arg;
    post_t *posts;
    int failed;
    char err[256];
} xu_t;

static int contiguous(const nrs_xregion_t *r)
{
    return r->rows <= 1 || r->pitch == r->row_bytes;
}

static void pack(unsigned char *dst, const nrs_xregion_t *r)
{
    const unsigned char *s = (const unsigned char *)r->mem->ptr + r->off;
    for (size_t i = 0; i < r->rows; i++)
        memcpy(dst + i * r->row_bytes, s + i * r->pitch, r->row_bytes);
}

static void unpack(const nrs_xregion_t *r, const unsigned char *src)
{
    unsigned char *d = (unsigned char *)r->mem->ptr + r->off;
    for (size_t i = 0; i < r->rows; i++)
        memcpy(d + i * r->pitch, src + i * r->row_bytes, r->row_bytes);
}

static int u_alloc(void *ctx, int owner, size_t bytes, nrs_xmem_t *out)
{
    (void)ctx;
    out->ptr = malloc(bytes ? bytes : 1);
    out->owner = owner;
    out->bytes = bytes;
    out->handle = 0;
    return out->ptr ? 0 : -1;
}

/* An aborted transfer's request UCX could not cancel may still write the
 * memory (a receive whose sender stopped mid-rendezvous): it goes when that
 * request ends (nrs_ucx_free). */
static void u_free(void *ctx, nrs_xmem_t *m)
{
    xu_t *X = ctx;
    nrs_ucx_free(X->u, m->ptr, m->bytes);
    m->ptr = NULL;
}

static int u_copy(void *ctx, const nrs_xregion_t *dst, const nrs_xregion_t *src)
{
    (void)ctx;
    if (src->rows != dst->rows || src->row_bytes != dst->row_bytes || !nrs_xregion_ok(src) ||
        !nrs_xregion_ok(dst))
        return -1;
    const unsigned char *s = (const unsigned char *)src->mem->ptr + src->off;
    unsigned char *d = (unsigned char *)dst->mem->ptr + dst->off;
    for (size_t i = 0; i < src->rows; i++)
        memmove(d + i * dst->pitch, s + i * src->pitch, src->row_bytes);
    return 0;
}

static void on_done(void *arg, int status)
{
    post_t *p = arg;
    p->ended = 1;
    p->status = status;
}

static int post(xu_t *X, int is_send, int peer_owner, const nrs_xregion_t *r, uint64_t tag,
                nrs_xreq_t *req)
{
    int rank = X->owner_rank(X->arg, peer_owner);
    size_t bytes = r->rows * r->row_bytes;
    post_t *p = calloc(1, sizeof(*p));
    char err[256];

    req->done = 0;
    if (!p || rank < 0 || !nrs_xregion_ok(r)) {
        snprintf(X->err, sizeof X->err, "ucx xport: %s", !p ? "out of memory"
                 : rank < 0 ? "owner held by no rank" : "region out of bounds");
        free(p);
        return -1;
    }
    p->X = X;
    p->req = req;
    p->is_send = is_send;
    p->region = *r;
    void *buf = (unsigned char *)r->mem->ptr + r->off;
    if (!contiguous(r)) {
        if (!(p->bounce = malloc(bytes ? bytes : 1))) {
            free(p);
            return -1;
        }
        if (is_send)
            pack(p->bounce, r);
        buf = p->bounce;
    }
    int rc = is_send ? nrs_ucx_isend(X->u, rank, buf, bytes, tag, &p->op, err, sizeof err)
                     : nrs_ucx_irecv(X->u, rank, buf, bytes, tag, &p->op, err, sizeof err);
    if (rc) {
        snprintf(X->err, sizeof X->err, "%s", err);
        free(p->bounce);
        free(p);
        return -1;
    }
    nrs_ucx_op_adopt(p->op, p->bounce);
    nrs_ucx_op_on_done(p->op, on_done, p);
    if (nrs_ucx_test(p->op)) /* ended while posting */
        on_done(p, nrs_ucx_test(p->op) > 0 ? 0 : -1);
    p->next = X->posts;
    X->posts = p;
    return 0;
}

static int u_send(void *ctx, int peer, const nrs_xregion_t *src, uint64_t tag, nrs_xreq_t *req)
{
    return post(ctx, 1, peer, src, tag, req);
}

static int u_recv(void *ctx, int peer, const nrs_xregion_t *dst, uint64_t tag, nrs_xreq_t *req)
{
    return post(ctx, 0, peer, dst, tag, req);
}

/* p->bounce goes with p->op (adopted), never before UCX is done with it */
static void release(post_t *p)
{
    nrs_ucx_op_free(p->op);
    free(p);
}

/* Completed posts are reported and released; failed ones kept (see below). */
static int harvest(xu_t *X)
{
    int done = 0;
    for (post_t **pp = &X->posts; *pp;) {
        post_t *p = *pp;
        if (!p->ended) {
            pp = &p->next;
            continue;
        }
        if (p->status) {
            /* kept until cancel/destroy frees every failed op in one bounded
             * wait: freeing them one by one waits for each (0.5 s apiece) */
            if (!p->reported++ && !X->failed++)
                snprintf(X->err, sizeof X->err, "%s", nrs_ucx_op_error(p->op));
            pp = &p->next;
            continue;
        } else {
            if (!p->is_send && p->bounce)
                unpack(&p->region, p->bounce);
            p->req->done = 1;
            done++;
        }
        *pp = p->next;
        release(p);
    }
    return done;
}

/* The executor naps when progress reports nothing completed; a nap between
 * the chunks of a transfer in flight costs more than the chunk (timer slack),
 * so while UCX is busy this keeps polling until a post completes, UCX has
 * been quiet for its spin time (nrs_ucx_spin), a failure, or POLL_MAX_S. */
#define POLL_MAX_S 0.005

static int u_progress(void *ctx)
{
    xu_t *X = ctx;
    double end = nrs_now_s() + POLL_MAX_S;
    int done;
    for (;;) {
        int ev = nrs_ucx_progress(X->u);
        done = harvest(X);
        if (done || X->failed || ev < 0 || !X->posts || !nrs_ucx_spin(X->u, ev) ||
            nrs_now_s() > end)
            break;
    }
    return X->failed ? -1 : done;
}

static void release_all(xu_t *X)
{
    if (!X->u) /* detached: nothing is posted */
        return;
    size_t n = 0;
    for (post_t *p = X->posts; p; p = p->next)
        n++;
    nrs_ucx_op_t **ops = calloc(n + 1, sizeof(*ops));
    n = 0;
    for (post_t *p = X->posts; ops && p; p = p->next)
        ops[n++] = p->op;
    if (ops)
        nrs_ucx_op_free_many(ops, n); /* one bounded wait for all of them */
    while (X->posts) {
        post_t *p = X->posts;
        X->posts = p->next;
        if (ops)
            p->op = NULL;
        release(p);
    }
    free(ops);
}

static void u_destroy(void *ctx)
{
    xu_t *X = ctx;
    release_all(X);
    free(X);
}

static const nrs_xport_ops_t ucx_ops = {"ucx", u_alloc, u_free, u_copy, u_send,
                                        u_recv, u_progress, u_destroy, NULL};

int nrs_xport_ucx_open(nrs_xport_t *x, nrs_ucx_t *u, nrs_owner_rank_fn owner_rank, void *arg)
{
    xu_t *X = calloc(1, sizeof(*X));
    if (!X)
        return -1;
    X->u = u;
    X->owner_rank = owner_rank;
    X->arg = arg;
    x->ops = &ucx_ops;
    x->ctx = X;
    return 0;
}

const char *nrs_xport_ucx_error(const nrs_xport_t *x)
{
    return ((const xu_t *)x->ctx)->err;
}

void nrs_xport_ucx_detach(nrs_xport_t *x)
{
    xu_t *X = x->ctx;
    release_all(X);
    X->u = NULL;
}

size_t nrs_xport_ucx_purge(nrs_xport_t *x, uint64_t tag, uint64_t mask)
{
    return nrs_ucx_purge(((xu_t *)x->ctx)->u, tag, mask);
}

void nrs_xport_ucx_cancel(nrs_xport_t *x)
{
    xu_t *X = x->ctx;
    release_all(X);
    X->failed = 0;
    X->err[0] = '\0';
}
