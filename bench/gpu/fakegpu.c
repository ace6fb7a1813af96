/* fakegpu: a stand-in CUDA runtime + NCCL (communicators of one rank) for
 * running the GPU code paths' host side on a machine without a GPU, before
 * spending device time: LD_PRELOAD it in front of the real libraries.
 *
 *   gcc -O1 -shared -fPIC -I/usr/local/cuda/include -o /tmp/libfakegpu.so bench/gpu/fakegpu.c
 *   LD_PRELOAD=/tmp/libfakegpu.so bash bench/gpu/device-check.sh DIR
 *
 * Device memory is host memory (bounds-checked: a copy outside an
 * allocation aborts). Streams are deferred queues that run only when
 * something waits for them, so a missing stream or event dependency shows
 * up as wrong bytes; blocking streams and the legacy stream order each
 * other as CUDA's do. cudaMemcpy host->device returns before the device
 * write, device->device is asynchronous, device->host waits (as CUDA's).
 * NCCL: ncclInProgress for a few polls after every non-blocking call;
 * split children appear only when the parent's job completes; sends and
 * receives to self pair up in group order; a receive nobody sends hangs its
 * stream until ncclCommAbort. It proves nothing about real GPUs or NCCL.
 * Knobs: FAKE_GPUS=N (0: no device), FAKE_NOSYNC=1 (legacy-stream syncs and
 * event waits do nothing: the races they prevent appear), FAKE_CORRUPT=1
 * (each NCCL chunk loses its last byte), FAKE_SLEEP=S (cudaGetDeviceCount
 * sleeps: a hang). Not built by make; not part of any test. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cuda_runtime_api.h>
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <nccl.h>

#define POLLS 3

/* ---- device memory ---- */
typedef struct { char *p; size_t n; } alloc_t;
static alloc_t allocs[4096];
static int nalloc;

static int in_dev(const void *p, size_t n)
{
    for (int i = 0; i < nalloc; i++)
        if ((const char *)p >= allocs[i].p && (const char *)p + n <= allocs[i].p + allocs[i].n)
            return 1;
    return 0;
}

/* ---- streams: deferred op queues ---- */
typedef enum { OP_COPY, OP_SET, OP_WAIT, OP_HANG } opk_t;
struct fstream;
typedef struct {
    opk_t k;
    char *d;
    const char *s;
    size_t n, dpitch, spitch, rows;
    int v;
    struct fstream *ws;
    long wpos;
    void *comm;
} op_t;
typedef struct fstream {
    op_t *q;
    long n, cap, done;
    int blocking, polls;
} fstream_t;
static fstream_t legacy = {.blocking = 1};
static fstream_t *streams[256];
static int nstreams;

typedef struct fcomm {
    int rank, size, aborted, polls, destroyed;
    ncclComm_t *pending; /* split: where to write the child at completion */
    struct fcomm *child;
} fcomm_t;

static fstream_t *S(cudaStream_t s)
{
    if (s == 0 || s == cudaStreamLegacy)
        return &legacy;
    return (fstream_t *)s;
}

static void push(fstream_t *s, op_t o)
{
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 64;
        s->q = realloc(s->q, s->cap * sizeof(op_t));
    }
    s->q[s->n++] = o;
}

static int flush_to(fstream_t *s, long upto);

/* 0 done, 1 blocked (hang) */
static int run_op(fstream_t *s, op_t *o)
{
    switch (o->k) {
    case OP_COPY:
        for (size_t r = 0; r < o->rows; r++)
            memmove(o->d + r * o->dpitch, o->s + r * o->spitch, o->n);
        return 0;
    case OP_SET:
        memset(o->d, o->v, o->n);
        return 0;
    case OP_WAIT:
        return flush_to(o->ws, o->wpos);
    case OP_HANG:
        return ((fcomm_t *)o->comm)->aborted ? 0 : 1;
    }
    (void)s;
    return 0;
}

static int run_queue(fstream_t *s, long upto)
{
    while (s->done < upto) {
        if (run_op(s, &s->q[s->done]))
            return 1;
        s->done++;
    }
    return 0;
}
static int depth_;
static int flush_to(fstream_t *s, long upto)
{
    int r = 0;
    if (depth_++ == 0) { /* legacy <-> blocking streams: implicit order */
        if (s != &legacy && s->blocking)
            r = run_queue(&legacy, legacy.n);
        if (s == &legacy)
            for (int i = 0; i < nstreams && !r; i++)
                if (streams[i] && streams[i]->blocking)
                    r = run_queue(streams[i], streams[i]->n);
    }
    if (!r)
        r = run_queue(s, upto);
    depth_--;
    return r;
}
static int flush(fstream_t *s) { return flush_to(s, s->n); }

/* ---- CUDA runtime ---- */
static int ndev(void)
{
    const char *e = getenv("FAKE_GPUS");
    return e ? atoi(e) : 1;
}
cudaError_t cudaGetDeviceCount(int *n)
{
    if (getenv("FAKE_SLEEP"))
        sleep(atoi(getenv("FAKE_SLEEP")));
    *n = ndev();
    return *n ? cudaSuccess : cudaErrorNoDevice;
}
cudaError_t cudaSetDevice(int d) { return d >= 0 && d < ndev() ? cudaSuccess : cudaErrorInvalidDevice; }
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int d)
{
    memset(p, 0, sizeof *p);
    strcpy(p->name, "FakeGPU");
    p->totalGlobalMem = 80ull << 30;
    return cudaSuccess;
}
const char *cudaGetErrorString(cudaError_t e) { return e ? "fake cuda error" : "no error"; }
const char *cudaGetErrorName(cudaError_t e) { return e ? "cudaErrorFake" : "cudaSuccess"; }
cudaError_t cudaMalloc(void **p, size_t n)
{
    if (nalloc == 4096)
        return cudaErrorMemoryAllocation;
    char *m = malloc(n);
    if (!m)
        return cudaErrorMemoryAllocation;
    memset(m, 0xee, n > 4096 ? 4096 : n);
    allocs[nalloc++] = (alloc_t){m, n};
    *p = m;
    return cudaSuccess;
}
cudaError_t cudaFree(void *p)
{
    if (!p)
        return cudaSuccess;
    flush(&legacy);
    for (int i = 0; i < nstreams; i++)
        if (streams[i])
            flush(streams[i]);
    for (int i = 0; i < nalloc; i++)
        if (allocs[i].p == p) {
            free(p);
            allocs[i] = allocs[--nalloc];
            return cudaSuccess;
        }
    fprintf(stderr, "fake: cudaFree of %p: not allocated\n", p);
    abort();
}
static cudaError_t check(const void *p, size_t n, int dev)
{
    if (n && dev && !in_dev(p, n)) {
        fprintf(stderr, "fake: %p+%zu: not device memory\n", p, n);
        abort();
    }
    return cudaSuccess;
}
cudaError_t cudaMemcpy2DAsync(void *d, size_t dp, const void *s, size_t sp, size_t w, size_t h,
                              enum cudaMemcpyKind k, cudaStream_t st)
{
    if (h > 1 && (dp < w || sp < w))
        return cudaErrorInvalidPitchValue;
    size_t dn = h ? (h - 1) * dp + w : 0, sn = h ? (h - 1) * sp + w : 0;
    check(d, dn, k != cudaMemcpyDeviceToHost);
    check(s, sn, k != cudaMemcpyHostToDevice);
    push(S(st), (op_t){.k = OP_COPY, .d = d, .s = s, .n = w, .dpitch = dp, .spitch = sp, .rows = h});
    return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, enum cudaMemcpyKind k, cudaStream_t st)
{
    return cudaMemcpy2DAsync(d, n, s, n, n, 1, k, st);
}
cudaError_t cudaMemcpy(void *d, const void *s, size_t n, enum cudaMemcpyKind k)
{
    cudaError_t e = cudaMemcpyAsync(d, s, n, k, 0);
    /* D2H: synchronous. H2D from pageable: the host buffer is staged at
     * once (copy the bytes now), the device write is deferred. D2D: async. */
    if (e == cudaSuccess && k == cudaMemcpyDeviceToHost)
        flush(&legacy);
    else if (e == cudaSuccess && k == cudaMemcpyHostToDevice) {
        void *stage = malloc(n);
        memcpy(stage, s, n);
        legacy.q[legacy.n - 1].s = stage; /* leaked: fine for a fake */
    }
    return e;
}
cudaError_t cudaMemset(void *d, int v, size_t n)
{
    check(d, n, 1);
    push(&legacy, (op_t){.k = OP_SET, .d = d, .n = n, .v = v});
    return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize(void)
{
    if (flush(&legacy))
        return cudaErrorLaunchTimeout;
    for (int i = 0; i < nstreams; i++)
        if (streams[i] && flush(streams[i]))
            return cudaErrorLaunchTimeout;
    return cudaSuccess;
}
static cudaError_t mkstream(cudaStream_t *s, int blocking)
{
    fstream_t *f = calloc(1, sizeof *f);
    f->blocking = blocking;
    streams[nstreams++] = f;
    *s = (cudaStream_t)f;
    return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t *s) { return mkstream(s, 1); }
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int fl)
{
    return mkstream(s, !(fl & cudaStreamNonBlocking));
}
cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    fstream_t *f = S(s);
    for (int i = 0; i < nstreams; i++)
        if (streams[i] == f)
            streams[i] = NULL;
    free(f->q);
    free(f);
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    if (getenv("FAKE_NOSYNC") && S(s) == &legacy)
        return cudaSuccess;
    if (flush(S(s))) {
        fprintf(stderr, "fake: cudaStreamSynchronize on a hung stream: would hang forever\n");
        abort();
    }
    return cudaSuccess;
}
cudaError_t cudaStreamQuery(cudaStream_t s)
{
    fstream_t *f = S(s);
    if (f->done < f->n && f->polls++ % 2 == 0)
        return cudaErrorNotReady;
    return flush(f) ? cudaErrorNotReady : cudaSuccess;
}
typedef struct { fstream_t *s; long pos; } fevent_t;
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int fl)
{
    *e = (cudaEvent_t)calloc(1, sizeof(fevent_t));
    return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e)
{
    free(e);
    return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s)
{
    fevent_t *f = (fevent_t *)e;
    f->s = S(s);
    f->pos = f->s->n;
    return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int fl)
{
    fevent_t *f = (fevent_t *)e;
    if (getenv("FAKE_NOSYNC"))
        return cudaSuccess;
    if (f->s)
        push(S(s), (op_t){.k = OP_WAIT, .ws = f->s, .wpos = f->pos});
    return cudaSuccess;
}

/* ---- NCCL, one rank ---- */
ncclResult_t ncclGetVersion(int *v)
{
    *v = 22809;
    return ncclSuccess;
}
const char *ncclGetErrorString(ncclResult_t r) { return r ? "fake nccl error" : "no error"; }
const char *ncclGetLastError(ncclComm_t c) { return "fake last error"; }
ncclResult_t ncclGetUniqueId(ncclUniqueId *u)
{
    memset(u, 0x42, sizeof *u);
    return ncclSuccess;
}
static fcomm_t *mkcomm(int rank, int size)
{
    fcomm_t *c = calloc(1, sizeof *c);
    c->rank = rank;
    c->size = size;
    c->polls = POLLS;
    return c;
}
ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int n, ncclUniqueId id, int rank,
                                    ncclConfig_t *cfg)
{
    if (n != 1 || rank != 0 || !cfg || cfg->blocking != 0 || cfg->magic != 0xcafebeef)
        return ncclInvalidArgument;
    *comm = (ncclComm_t)mkcomm(rank, n);
    return ncclInProgress;
}
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *st)
{
    fcomm_t *c = (fcomm_t *)comm;
    if (!c || c->destroyed)
        return ncclInvalidArgument;
    if (c->aborted) {
        *st = ncclSystemError;
        return ncclSuccess;
    }
    if (c->polls > 0) {
        c->polls--;
        *st = ncclInProgress;
        return ncclSuccess;
    }
    if (c->pending) { /* split done: publish the child now */
        *c->pending = (ncclComm_t)c->child;
        c->pending = NULL;
    }
    *st = ncclSuccess;
    return ncclSuccess;
}
static int ready(fcomm_t *c) { return c && !c->aborted && !c->destroyed && c->polls == 0 && !c->pending; }
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *cfg)
{
    fcomm_t *c = (fcomm_t *)comm;
    if (!ready(c))
        return ncclInvalidUsage;
    *newcomm = NULL;
    c->child = color == NCCL_SPLIT_NOCOLOR ? NULL : mkcomm(0, 1);
    if (c->child)
        c->child->polls = 0;
    c->pending = newcomm;
    c->polls = POLLS;
    return ncclInProgress;
}
static int cmpi(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }
ncclResult_t ncclCommShrink(ncclComm_t comm, int *ex, int nex, ncclComm_t *newcomm, ncclConfig_t *cfg,
                            int flags)
{
    fcomm_t *c = (fcomm_t *)comm;
    if (!ex || nex <= 0)
        return ncclInvalidArgument;
    qsort(ex, nex, sizeof(int), cmpi);
    if (bsearch(&c->rank, ex, nex, sizeof(int), cmpi))
        return ncclInvalidArgument;
    return ncclInvalidArgument; /* one rank: nothing else to exclude */
}
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *r)
{
    *r = ((fcomm_t *)comm)->rank;
    return ncclSuccess;
}
ncclResult_t ncclCommCount(const ncclComm_t comm, int *n)
{
    *n = ((fcomm_t *)comm)->size;
    return ncclSuccess;
}
ncclResult_t ncclCommAbort(ncclComm_t comm)
{
    fcomm_t *c = (fcomm_t *)comm;
    if (!c)
        return ncclSuccess;
    if (c->destroyed) {
        fprintf(stderr, "fake: abort of a destroyed communicator\n");
        abort();
    }
    if (c->pending) {
        *c->pending = (ncclComm_t)c->child;
        c->pending = NULL;
    }
    c->aborted = 1;
    c->destroyed = 1;
    fprintf(stderr, "fake: communicator %p aborted\n", (void *)c);
    return ncclSuccess;
}
ncclResult_t ncclCommFinalize(ncclComm_t comm)
{
    fcomm_t *c = (fcomm_t *)comm;
    if (!ready(c))
        return ncclInvalidUsage;
    c->polls = POLLS;
    return ncclInProgress;
}
ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
    fcomm_t *c = (fcomm_t *)comm;
    if (c->destroyed) {
        fprintf(stderr, "fake: double destroy\n");
        abort();
    }
    c->destroyed = 1;
    return ncclSuccess;
}
typedef struct { int send; void *buf; size_t n; int peer; fcomm_t *c; fstream_t *s; } p2p_t;
static p2p_t grp[4096];
static int ngrp, depth;
ncclResult_t ncclGroupStart(void)
{
    depth++;
    return ncclSuccess;
}
static ncclResult_t p2p(int send, const void *buf, size_t n, ncclDataType_t t, int peer, ncclComm_t comm,
                        cudaStream_t st)
{
    fcomm_t *c = (fcomm_t *)comm;
    if (!depth || !ready(c) || t != ncclUint8 || peer < 0 || peer >= c->size || ngrp == 4096)
        return ncclInvalidArgument;
    check(buf, n, 1);
    grp[ngrp++] = (p2p_t){send, (void *)buf, n, peer, c, S(st)};
    return ncclSuccess;
}
ncclResult_t ncclSend(const void *b, size_t n, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t s)
{
    return p2p(1, b, n, t, peer, c, s);
}
ncclResult_t ncclRecv(void *b, size_t n, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t s)
{
    return p2p(0, b, n, t, peer, c, s);
}
ncclResult_t ncclGroupEnd(void)
{
    if (--depth)
        return ncclSuccess;
    fcomm_t *c = ngrp ? grp[0].c : NULL;
    int used[4096] = {0};
    for (int i = 0; i < ngrp; i++) {
        if (grp[i].send)
            continue;
        int j = 0;
        while (j < ngrp && (!grp[j].send || used[j]))
            j++;
        if (j == ngrp) { /* nobody sends: the kernel would wait forever */
            push(grp[i].s, (op_t){.k = OP_HANG, .comm = grp[i].c});
            continue;
        }
        used[j] = 1;
        if (grp[j].n != grp[i].n) {
            ngrp = 0;
            return ncclInvalidUsage;
        }
        push(grp[i].s, (op_t){.k = OP_COPY, .d = grp[i].buf, .s = grp[j].buf, .n = grp[i].n,
                              .dpitch = grp[i].n, .spitch = grp[i].n, .rows = 1});
        if (getenv("FAKE_CORRUPT") && grp[i].n > 100) /* drop the last byte of a chunk */
            grp[i].s->q[grp[i].s->n - 1].n -= 1;
    }
    ngrp = 0;
    if (c && rand() % 2) {
        c->polls = POLLS;
        return ncclInProgress;
    }
    return ncclSuccess;
}
