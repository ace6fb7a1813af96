/* NCCL transport and CUDA memory (nccl.h). */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>
/* nccl.h declares some functions with () */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <nccl.h>
#pragma GCC diagnostic pop

#include "util/util.h"
#include "xfer/nccl.h"

struct nrs_nccl {
    ncclComm_t comm;
    cudaStream_t stream;
    int rank, size, device;
    bool aborted;
};

int nrs_cuda_device_count(int *n, char *err, size_t errlen)
{
    cudaError_t e = cudaGetDeviceCount(n);
    if (e != cudaSuccess || *n < 1) {
        nrs_seterr(err, errlen, "no GPU: %s", e != cudaSuccess ? cudaGetErrorName(e) : "0 devices");
        *n = 0;
        return -1;
    }
    return 0;
}

int nrs_cuda_alloc(int device, size_t bytes, void **ptr, char *err, size_t errlen)
{
    cudaError_t e = cudaSetDevice(device);
    if (e == cudaSuccess)
        e = cudaMalloc(ptr, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        nrs_seterr(err, errlen, "cuda: %zu bytes on GPU %d: %s", bytes, device, cudaGetErrorString(e));
        return -1;
    }
    return 0;
}

void nrs_cuda_free(void *ptr)
{
    if (ptr)
        cudaFree(ptr);
}

int nrs_cuda_copy(void *dst, const void *src, size_t bytes, char kind, char *err, size_t errlen)
{
    enum cudaMemcpyKind k = kind == 'h' ? cudaMemcpyHostToDevice
                          : kind == 'd' ? cudaMemcpyDeviceToHost : cudaMemcpyDeviceToDevice;
    cudaError_t e = cudaMemcpy(dst, src, bytes, k);
    if (e != cudaSuccess) {
        nrs_seterr(err, errlen, "cuda: copy of %zu bytes: %s", bytes, cudaGetErrorString(e));
        return -1;
    }
    return 0;
}

int nrs_nccl_unique_id(unsigned char id[NRS_NCCL_ID_BYTES], char *err, size_t errlen)
{
    ncclUniqueId u;
    ncclResult_t r = ncclGetUniqueId(&u);
    if (r != ncclSuccess) {
        nrs_seterr(err, errlen, "nccl: ncclGetUniqueId: %s", ncclGetErrorString(r));
        return -1;
    }
    memcpy(id, u.internal, NRS_NCCL_ID_BYTES);
    return 0;
}

/* Until the communicator leaves ncclInProgress; abort on error or time-out. */
static int wait_comm(nrs_nccl_t *c, double timeout_s, const char *what, char *err, size_t errlen)
{
    double end = nrs_now_s() + timeout_s;
    ncclResult_t st = ncclInProgress;
    while (ncclCommGetAsyncError(c->comm, &st) == ncclSuccess && st == ncclInProgress &&
           nrs_now_s() < end)
        nrs_nap_us(20);
    if (st == ncclSuccess)
        return 0;
    nrs_seterr(err, errlen, "nccl: %s: %s", what,
           st == ncclInProgress ? "timed out" : ncclGetErrorString(st));
    nrs_nccl_abort(c);
    return -1;
}

static nrs_nccl_t *comm_new(int device)
{
    nrs_nccl_t *c = calloc(1, sizeof(*c));
    if (!c)
        return NULL;
    c->device = device;
    if (cudaSetDevice(device) != cudaSuccess ||
        cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking) != cudaSuccess) {
        free(c);
        return NULL;
    }
    return c;
}

static void comm_free(nrs_nccl_t *c)
{
    if (c->stream)
        cudaStreamDestroy(c->stream);
    free(c);
}

int nrs_nccl_init(nrs_nccl_t **out, int rank, int size, int device,
                  const unsigned char id[NRS_NCCL_ID_BYTES], double timeout_s, char *err,
                  size_t errlen)
{
    nrs_nccl_t *c = comm_new(device);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    ncclUniqueId u;
    if (!c) {
        nrs_seterr(err, errlen, "nccl: cannot set up GPU %d", device);
        return -1;
    }
    cfg.blocking = 0;
    memcpy(u.internal, id, NRS_NCCL_ID_BYTES);
    c->rank = rank;
    c->size = size;
    ncclResult_t r = ncclCommInitRankConfig(&c->comm, size, u, rank, &cfg);
    if (r != ncclSuccess && r != ncclInProgress) {
        nrs_seterr(err, errlen, "nccl: ncclCommInitRankConfig: %s", ncclGetErrorString(r));
        if (c->comm)
            ncclCommAbort(c->comm);
        comm_free(c);
        return -1;
    }
    if (wait_comm(c, timeout_s, "communicator set-up", err, errlen)) {
        comm_free(c);
        return -1;
    }
    *out = c;
    return 0;
}

static int derive(nrs_nccl_t *c, nrs_nccl_t **out, int split, int color, int key,
                  const int *exclude, int nexclude, double timeout_s, char *err, size_t errlen)
{
    nrs_nccl_t *d = comm_new(c->device);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    if (!d) {
        nrs_seterr(err, errlen, "nccl: out of memory");
        return -1;
    }
    cfg.blocking = 0;
    ncclResult_t r = split ? ncclCommSplit(c->comm, color, key, &d->comm, &cfg)
                           : ncclCommShrink(c->comm, (int *)exclude, nexclude, &d->comm, &cfg,
                                            NCCL_SHRINK_ABORT);
    if (r != ncclSuccess && r != ncclInProgress) {
        nrs_seterr(err, errlen, "nccl: %s: %s", split ? "ncclCommSplit" : "ncclCommShrink",
               ncclGetErrorString(r));
        comm_free(d);
        return -1;
    }
    if (wait_comm(c, timeout_s, split ? "split" : "shrink", err, errlen)) {
        comm_free(d);
        return -1;
    }
    if (!d->comm) { /* not a member (split with NCCL_SPLIT_NOCOLOR) */
        comm_free(d);
        *out = NULL;
        return 0;
    }
    if (wait_comm(d, timeout_s, "new communicator", err, errlen)) {
        comm_free(d);
        return -1;
    }
    ncclCommUserRank(d->comm, &d->rank);
    ncclCommCount(d->comm, &d->size);
    *out = d;
    return 0;
}

int nrs_nccl_shrink(nrs_nccl_t *c, const int *exclude, int nexclude, nrs_nccl_t **out,
                    double timeout_s, char *err, size_t errlen)
{
    return derive(c, out, 0, 0, 0, exclude, nexclude, timeout_s, err, errlen);
}

int nrs_nccl_split(nrs_nccl_t *c, int color, int key, nrs_nccl_t **out, double timeout_s,
                   char *err, size_t errlen)
{
    return derive(c, out, 1, color, key, NULL, 0, timeout_s, err, errlen);
}

void nrs_nccl_abort(nrs_nccl_t *c)
{
    if (c && c->comm && !c->aborted) {
        ncclCommAbort(c->comm);
        c->aborted = true;
    }
}

void nrs_nccl_fini(nrs_nccl_t *c)
{
    if (!c)
        return;
    if (c->comm && !c->aborted) { /* wait_comm aborts what does not finalize */
        char err[64];
        ncclResult_t r = ncclCommFinalize(c->comm);
        if ((r == ncclSuccess || r == ncclInProgress) &&
            wait_comm(c, 10.0, "finalize", err, sizeof err) == 0)
            ncclCommDestroy(c->comm);
        else
            nrs_nccl_abort(c);
    }
    comm_free(c);
}

int nrs_nccl_rank(const nrs_nccl_t *c) { return c->rank; }
int nrs_nccl_size(const nrs_nccl_t *c) { return c->size; }

/* Stream done, or the communicator failed, or the deadline passed. */
static int wait_stream(nrs_nccl_t *c, double end, char *err, size_t errlen)
{
    for (;;) {
        cudaError_t e = cudaStreamQuery(c->stream);
        if (e == cudaSuccess)
            return 0;
        if (e != cudaErrorNotReady) {
            nrs_seterr(err, errlen, "nccl: stream: %s", cudaGetErrorString(e));
            break;
        }
        ncclResult_t st;
        if (ncclCommGetAsyncError(c->comm, &st) == ncclSuccess && st != ncclSuccess &&
            st != ncclInProgress) {
            nrs_seterr(err, errlen, "nccl: %s", ncclGetErrorString(st));
            break;
        }
        if (nrs_now_s() > end) {
            nrs_seterr(err, errlen, "nccl: transfers not done in time: aborting the communicator");
            break;
        }
        nrs_nap_us(20);
    }
    nrs_nccl_abort(c);
    return -1;
}

int nrs_nccl_exchange(nrs_nccl_t *c, const nrs_nccl_xfer_t *x, int n, size_t chunk_bytes,
                      double timeout_s, char *err, size_t errlen)
{
    double end = nrs_now_s() + timeout_s;
    size_t maxb = 0;
    if (c->aborted) {
        nrs_seterr(err, errlen, "nccl: communicator was aborted");
        return -1;
    }
    if (!chunk_bytes)
        chunk_bytes = 16u << 20;
    for (int i = 0; i < n; i++)
        if (x[i].bytes > maxb)
            maxb = x[i].bytes;
    size_t nchunks = maxb ? (maxb + chunk_bytes - 1) / chunk_bytes : 0;
    cudaSetDevice(c->device);
    for (size_t ch = 0; ch < nchunks; ch++) {
        ncclResult_t r = ncclGroupStart();
        for (int i = 0; i < n && r == ncclSuccess; i++) {
            size_t off = ch * chunk_bytes;
            if (off >= x[i].bytes)
                continue;
            size_t len = x[i].bytes - off < chunk_bytes ? x[i].bytes - off : chunk_bytes;
            char *p = (char *)x[i].buf + off;
            r = x[i].is_send ? ncclSend(p, len, ncclUint8, x[i].peer, c->comm, c->stream)
                             : ncclRecv(p, len, ncclUint8, x[i].peer, c->comm, c->stream);
        }
        ncclResult_t g = ncclGroupEnd();
        if (r == ncclSuccess)
            r = g;
        if (r != ncclSuccess && r != ncclInProgress) {
            nrs_seterr(err, errlen, "nccl: group %zu: %s", ch, ncclGetErrorString(r));
            nrs_nccl_abort(c);
            return -1;
        }
        /* Non-blocking communicator: wait for the enqueue itself, then go on. */
        if (r == ncclInProgress && wait_comm(c, end - nrs_now_s(), "enqueue", err, errlen))
            return -1;
    }
    return wait_stream(c, end, err, errlen);
}
