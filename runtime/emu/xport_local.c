/* Local transport: all ranks in one process, memory from malloc, transfers
 * are strided memcpy once both sides of a pair are posted. */
#include <stdlib.h>
#include <string.h>

#include "emu/xport.h"
#include "util/util.h"

typedef struct {
    int sender, receiver;
    uint64_t tag;
    nrs_xregion_t region;
    nrs_xreq_t *req;
} post_t;

typedef struct {
    post_t *sends, *recvs;
    size_t nsend, nrecv, capsend, caprecv;
} local_t;

/* off + (rows - 1) * pitch + row_bytes <= bytes, without wrapping around
 * size_t: a negative offset (as size_t) or a huge pitch must not pass. A
 * region names its memory even with no rows: the transports read r->mem of
 * every region that passes. */
int nrs_xregion_ok(const nrs_xregion_t *r)
{
    if (!r->mem)
        return 0;
    if (r->rows == 0)
        return 1;
    if (!r->mem->ptr || (r->rows > 1 && r->row_bytes > r->pitch))
        return 0;
    size_t n = r->mem->bytes;
    if (r->off > n || r->row_bytes > n - r->off)
        return 0;
    size_t room = n - r->off - r->row_bytes; /* for the other rows' starts */
    return r->rows == 1 || r->pitch <= room / (r->rows - 1);
}

static void strided_copy(const nrs_xregion_t *dst, const nrs_xregion_t *src)
{
    unsigned char *d = (unsigned char *)dst->mem->ptr + dst->off;
    const unsigned char *s = (const unsigned char *)src->mem->ptr + src->off;
    for (size_t i = 0; i < src->rows; i++)
        memcpy(d + i * dst->pitch, s + i * src->pitch, src->row_bytes);
}

static int shape_ok(const nrs_xregion_t *dst, const nrs_xregion_t *src)
{
    return src->rows == dst->rows && src->row_bytes == dst->row_bytes && nrs_xregion_ok(src) &&
           nrs_xregion_ok(dst);
}

static int l_alloc(void *ctx, int owner, size_t bytes, nrs_xmem_t *out)
{
    out->ptr = malloc(bytes ? bytes : 1);
    out->owner = owner;
    out->bytes = bytes;
    out->handle = 0;
    return out->ptr ? 0 : -1;
}

static void l_free(void *ctx, nrs_xmem_t *m)
{
    free(m->ptr);
    m->ptr = NULL;
}

static int l_copy(void *ctx, const nrs_xregion_t *dst, const nrs_xregion_t *src)
{
    if (!shape_ok(dst, src))
        return -1;
    strided_copy(dst, src);
    return 0;
}

static int post(post_t **v, size_t *n, size_t *cap, const post_t *p)
{
    NRS_GROW(*v, *n, *cap, 1);
    (*v)[(*n)++] = *p;
    return 0;
}

static int l_send(void *ctx, int peer, const nrs_xregion_t *src, uint64_t tag, nrs_xreq_t *req)
{
    local_t *L = ctx;
    post_t p = {src->mem->owner, peer, tag, *src, req};
    req->done = 0;
    return post(&L->sends, &L->nsend, &L->capsend, &p);
}

static int l_recv(void *ctx, int peer, const nrs_xregion_t *dst, uint64_t tag, nrs_xreq_t *req)
{
    local_t *L = ctx;
    post_t p = {peer, dst->mem->owner, tag, *dst, req};
    req->done = 0;
    return post(&L->recvs, &L->nrecv, &L->caprecv, &p);
}

static int l_progress(void *ctx)
{
    local_t *L = ctx;
    int done = 0;
    for (size_t i = 0; i < L->nrecv;) {
        post_t *r = &L->recvs[i];
        size_t j = 0;
        while (j < L->nsend && (L->sends[j].sender != r->sender ||
                                L->sends[j].receiver != r->receiver || L->sends[j].tag != r->tag))
            j++;
        if (j == L->nsend) {
            i++;
            continue;
        }
        if (!shape_ok(&r->region, &L->sends[j].region))
            return -1;
        strided_copy(&r->region, &L->sends[j].region);
        r->req->done = 1;
        L->sends[j].req->done = 1;
        L->sends[j] = L->sends[--L->nsend];
        L->recvs[i] = L->recvs[--L->nrecv];
        done += 2;
    }
    return done;
}

static void l_destroy(void *ctx)
{
    local_t *L = ctx;
    free(L->sends);
    free(L->recvs);
    free(L);
}

static const nrs_xport_ops_t local_ops = {"local", l_alloc,    l_free,    l_copy,
                                          l_send,  l_recv,     l_progress, l_destroy, NULL};

int nrs_xport_local_open(nrs_xport_t *x)
{
    x->ops = &local_ops;
    x->ctx = calloc(1, sizeof(local_t));
    return x->ctx ? 0 : -1;
}

void nrs_xport_close(nrs_xport_t *x)
{
    if (x->ops && x->ctx)
        x->ops->destroy(x->ctx);
    x->ops = NULL;
    x->ctx = NULL;
}
