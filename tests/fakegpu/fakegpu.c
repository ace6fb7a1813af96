/* fakegpu: a stand-in CUDA runtime + NCCL for running the GPU code paths'
 * host side on a machine without a GPU: LD_PRELOAD it in front of the real
 * libraries (make builds it as tests/fakegpu/.libs/libfakegpu.so; the
 * fake-GPU suite, tests/mp/test_fakegpu.sh, uses it). A TEST DOUBLE: it
 * proves nothing about real GPUs or NCCL; the real checks are
 * tests/mp/test_nccl.sh and bench/gpu/device-check.sh on a GPU.
 *
 * Device memory is host memory (bounds-checked: a copy outside an
 * allocation aborts). Streams are deferred queues that run only when
 * something waits for them, so a missing stream or event dependency shows
 * up as wrong bytes; blocking streams and the legacy stream order each
 * other as CUDA's do. cudaMemcpy host->device returns before the device
 * write, device->device is asynchronous, device->host waits (as CUDA's).
 * NCCL: ncclInProgress for a few polls after every non-blocking call;
 * split children appear only when the parent's job completes; sends and
 * receives to self pair up in group order; a receive from self nobody sends
 * hangs its stream until ncclCommAbort. Communicators span processes: the
 * unique id names them, each rank listens on an abstract unix socket, and
 * a send to another rank is a length-prefixed message on one ordered
 * connection per pair (a length that differs from the receive's is an
 * error, as is a peer that hung up); ncclCommSplit exchanges colours and
 * keys over those connections; ncclCommShrink keeps the ranks not excluded.
 * cudaMemcpy2D[Async] keeps CUDA's pitch rules: width <= both pitches,
 * and pitches at most the device's maximum (2^31 - 1 as on an H200, or
 * FAKE_MAX_PITCH=N), one row or many.
 * Knobs: FAKE_GPUS=N (0: no device), FAKE_NOSYNC=1 (legacy-stream syncs and
 * event waits do nothing: the races they prevent appear), FAKE_CORRUPT=1
 * (each NCCL chunk to self loses its last byte), FAKE_SLEEP=S
 * (cudaGetDeviceCount sleeps: a hang), FAKE_DRIVER=V (a driver for CUDA V
 * only, e.g. 12040: cudaGetDeviceCount finds cudaErrorInsufficientDriver),
 * FAKE_NCCL_DUPLICATE=1 (init fails, as real NCCL's does for two ranks on
 * one GPU), FAKE_NCCL_VERSION=V (ncclGetVersion's; below 22700 calling
 * ncclCommShrink exits 127, as the loader would: 2.27 added it), FAKE_NCCL_STRICT=1 (a
 * group may hold one transfer per peer and direction, and the first group
 * that reaches a peer must go both ways with it: the rules the NCCL
 * transport keeps so that NCCL's lazy connection set-up and per-channel
 * order cannot deadlock it; a group that breaks them fails),
 * FAKE_NCCL_ROUNDS=N (with STRICT: a group of transfers over one byte may
 * span at most N rounds, a round being the distance to the peer: NCCL's
 * channels run more than 8 rounds in batches one after another; the
 * preconnect's one-byte group, the same pattern on every rank, is the
 * schedule NCCL makes round by round alike on every rank),
 * FAKE_NO_CONTEXT=D (a CUDA context on device D aborts the process: the
 * code must not make one there), FAKE_NCCL_IB=1 (the machine has an
 * InfiniBand card that leads nowhere: a communicator set up without
 * NCCL_IB_DISABLE=1 fails, where real NCCL may hang or crawl; one host's
 * tests must turn IB off), FAKE_LEAKS=1 (a process that exits by itself
 * with device memory not freed, or a communicator neither destroyed nor
 * aborted, exits 99 instead, saying what), FAKE_MEM_CAP=BYTES (a cudaMalloc
 * that would take a device's allocations over BYTES fails with
 * cudaErrorMemoryAllocation, saying so on stderr; read at every call).
 * Counts, found with dlsym by a test that runs under the fake:
 * fakegpu_counts gives how many communicators this process made (init,
 * split, shrink) and how many copies (cudaMemcpy*, of any kind) it asked
 * for: a test's check that a code path sets up no communicator and copies
 * nothing; fakegpu_mem_stats (below) a device's bytes in use, their peak,
 * and the number of groups run.
 * Devices: each thread has its current device (cudaSetDevice, cudaGetDevice;
 * 0 at first), as CUDA's. Each device has its own legacy stream, which the
 * CUDA calls without a stream use: the current device's. Streams, events and
 * communicators belong to the device current when they were made (split and
 * shrink children: their parent's); an event recorded on another device's
 * stream, or a transfer on a stream of another device than its
 * communicator's, is refused. A device's primary context comes with
 * cudaSetDevice (as since CUDA 12) or with the first call that needs one
 * there (memory, streams, events, copies); the driver's
 * cuDevicePrimaryCtxGetState (cudaGetDriverEntryPointByVersion) says
 * whether it is there. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <cuda.h>
#include <cuda_runtime_api.h>
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#pragma GCC diagnostic ignored "-Wunused-parameter"
#pragma GCC diagnostic ignored "-Wmissing-prototypes"
#include <nccl.h>

#define POLLS 3
#define WAIT_CAP_S 120.0 /* a synchronize that waits longer aborts the process */

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

/* ---- device memory ---- */
#define MAXDEV 16
typedef struct { char *p; size_t n; int dev; } alloc_t;
static alloc_t allocs[65536];
static int nalloc;
static size_t dev_used[MAXDEV], dev_peak[MAXDEV]; /* bytes allocated per device */
static long ngroups;                             /* groups with transfers, ever */

/* For the test programs, which look it up with dlsym (the real libraries
 * have no such symbol): device dev's bytes in use and its peak since the
 * last reset (reset: the peak starts again from what is in use now), and
 * the groups with transfers run so far in this process. */
void fakegpu_mem_stats(int dev, int reset, size_t *used, size_t *peak, long *groups)
{
    dev = dev >= 0 && dev < MAXDEV ? dev : 0;
    *used = dev_used[dev];
    *peak = dev_peak[dev];
    *groups = ngroups;
    if (reset)
        dev_peak[dev] = dev_used[dev];
}

static int in_dev(const void *p, size_t n)
{
    for (int i = 0; i < nalloc; i++)
        if ((const char *)p >= allocs[i].p && (const char *)p + n <= allocs[i].p + allocs[i].n)
            return 1;
    return 0;
}

/* ---- streams: deferred op queues ---- */
typedef enum { OP_COPY, OP_SET, OP_WAIT, OP_HANG, OP_NET } opk_t;
struct fstream;
struct fcomm;
typedef struct { /* one send or receive to another rank */
    struct fcomm *c;
    int peer, send;
    char *buf;
    size_t n, at; /* at: bytes moved so far, the 8-byte length first */
    uint64_t len;  /* the length on the wire (receive: as read) */
} net_t;
typedef struct {
    opk_t k;
    char *d;
    const char *s;
    size_t n, dpitch, spitch, rows;
    int v;
    struct fstream *ws;
    long wpos;
    void *comm;
    net_t *net; /* OP_NET: a group's transfers to other ranks, progressed together */
    int nnet;
    void *own;  /* freed once the op ran (a host->device copy's staged bytes) */
} op_t;
typedef struct fstream {
    op_t *q;
    long n, cap, done;
    int blocking, polls;
    int dev, legacy; /* its device; legacy: that device's legacy stream */
} fstream_t;
static fstream_t legacies[MAXDEV];
static fstream_t *streams[256];
static int nstreams;
static __thread int cur_dev; /* the calling thread's current device */
static int ctx[MAXDEV];      /* primary context made on the device */

/* The current device's primary context, made if it is not there yet. */
static void touch_dev(int d)
{
    if (ctx[d])
        return;
    const char *e = getenv("FAKE_NO_CONTEXT");
    if (e && *e && atoi(e) == d) {
        fprintf(stderr, "fake: a CUDA context on device %d (FAKE_NO_CONTEXT=%d)\n", d, d);
        abort();
    }
    ctx[d] = 1;
}
static void touch(void) { touch_dev(cur_dev); }

/* The current device's legacy stream. */
static fstream_t *legacy_of(int d)
{
    fstream_t *l = &legacies[d];
    l->blocking = l->legacy = 1;
    l->dev = d;
    return l;
}

typedef struct fcomm {
    int rank, size, aborted, polls, destroyed, killed;
    int failed;      /* a peer hung up or sent the wrong length: the async error */
    char token[256]; /* the communicator's name, the same in every process */
    int lfd;         /* listening socket */
    int *out, *in;   /* per peer: connection we send on, connection we receive on */
    int *peers;      /* parent world rank of each rank (for messages only) */
    unsigned char *conn; /* FAKE_NCCL_STRICT: a group went both ways with this peer */
    int nderived;    /* splits and shrinks started: names the children */
    int dev;         /* its device (the current one at init; a child: its parent's) */
    ncclComm_t *pending; /* split: where to write the child at completion */
    struct fcomm *child;
} fcomm_t;

static fstream_t *S(cudaStream_t s)
{
    if (s == 0 || s == cudaStreamLegacy) {
        touch();
        return legacy_of(cur_dev);
    }
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
static int net_progress(net_t *t);

/* 0 done, 1 blocked (waits for a peer, or hangs) */
static int run_op(fstream_t *s, op_t *o)
{
    switch (o->k) {
    case OP_COPY:
        for (size_t r = 0; r < o->rows; r++)
            memmove(o->d + r * o->dpitch, o->s + r * o->spitch, o->n);
        free(o->own);
        o->own = NULL;
        return 0;
    case OP_SET:
        memset(o->d, o->v, o->n);
        return 0;
    case OP_WAIT:
        return flush_to(o->ws, o->wpos);
    case OP_HANG:
        return ((fcomm_t *)o->comm)->aborted || ((fcomm_t *)o->comm)->killed ? 0 : 1;
    case OP_NET: {
        int busy = 0;
        for (int i = 0; i < o->nnet; i++) {
            /* one connection per pair and direction: its transfers go in order */
            int behind = 0;
            for (int j = 0; j < i && !behind && !o->net[i].c->aborted && !o->net[i].c->killed; j++)
                behind = o->net[j].c == o->net[i].c && o->net[j].peer == o->net[i].peer &&
                         o->net[j].send == o->net[i].send && o->net[j].at < 8 + o->net[j].n;
            busy |= behind ? 1 : net_progress(&o->net[i]);
        }
        if (!busy) {
            free(o->net);
            o->net = NULL;
            o->nnet = 0;
        }
        return busy;
    }
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
        fstream_t *l = &legacies[s->dev]; /* (the device's: only they order each other) */
        if (!s->legacy && s->blocking)
            r = run_queue(l, l->n);
        if (s->legacy)
            for (int i = 0; i < nstreams && !r; i++)
                if (streams[i] && streams[i]->blocking && streams[i]->dev == s->dev)
                    r = run_queue(streams[i], streams[i]->n);
    }
    if (!r)
        r = run_queue(s, upto);
    depth_--;
    return r;
}
static int flush(fstream_t *s) { return flush_to(s, s->n); }

/* Is the op the queue is blocked on a hang (a receive nobody sends) rather
 * than a transfer that waits for a peer? */
static int hung(fstream_t *s)
{
    return s->done < s->n && s->q[s->done].k == OP_HANG;
}

/* Flush until done; a true hang, or WAIT_CAP_S, aborts the process. */
static void flush_wait(fstream_t *s, const char *who)
{
    double end = now_s() + WAIT_CAP_S;
    while (flush(s)) {
        if (hung(s) || now_s() > end) {
            fprintf(stderr, "fake: %s on a hung stream: would hang forever\n", who);
            abort();
        }
        usleep(50);
    }
}

/* ---- CUDA runtime ---- */
static int ndev(void)
{
    const char *e = getenv("FAKE_GPUS");
    return e ? atoi(e) : 1;
}
/* FAKE_DRIVER=V: the driver supports CUDA V (12040: 12.4), older than the
 * runtime's 13.0: no device can be used, as CUDA 13 on such a driver. */
static int fake_driver(void)
{
    const char *e = getenv("FAKE_DRIVER");
    return e && *e ? atoi(e) : 13000;
}
cudaError_t cudaDriverGetVersion(int *v)
{
    *v = fake_driver();
    return cudaSuccess;
}
cudaError_t cudaRuntimeGetVersion(int *v)
{
    *v = 13000;
    return cudaSuccess;
}
cudaError_t cudaGetDeviceCount(int *n)
{
    if (getenv("FAKE_SLEEP"))
        sleep(atoi(getenv("FAKE_SLEEP")));
    *n = ndev();
    if (fake_driver() < 13000) {
        *n = 0;
        return cudaErrorInsufficientDriver;
    }
    return *n ? cudaSuccess : cudaErrorNoDevice;
}
cudaError_t cudaSetDevice(int d)
{
    if (d < 0 || d >= ndev() || d >= MAXDEV)
        return cudaErrorInvalidDevice;
    cur_dev = d;
    touch(); /* CUDA 12 and later: the device's primary context, at once */
    return cudaSuccess;
}
cudaError_t cudaGetDevice(int *d)
{
    if (!ndev() || fake_driver() < 13000)
        return ndev() ? cudaErrorInsufficientDriver : cudaErrorNoDevice;
    *d = cur_dev;
    return cudaSuccess;
}
/* The driver's functions that the runtime hands out: whether a device's
 * primary context is there (it makes none), and a device by ordinal. */
static CUresult fake_cuDeviceGet(CUdevice *dev, int ordinal)
{
    if (ordinal < 0 || ordinal >= ndev() || ordinal >= MAXDEV)
        return CUDA_ERROR_INVALID_DEVICE;
    *dev = ordinal;
    return CUDA_SUCCESS;
}
static CUresult fake_cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active)
{
    if (dev < 0 || dev >= ndev() || dev >= MAXDEV)
        return CUDA_ERROR_INVALID_DEVICE;
    *flags = 0;
    *active = ctx[dev];
    return CUDA_SUCCESS;
}
cudaError_t cudaGetDriverEntryPointByVersion(const char *sym, void **fn, unsigned int ver,
                                             unsigned long long flags,
                                             enum cudaDriverEntryPointQueryResult *st)
{
    *fn = !strcmp(sym, "cuDeviceGet") ? (void *)fake_cuDeviceGet
        : !strcmp(sym, "cuDevicePrimaryCtxGetState") ? (void *)fake_cuDevicePrimaryCtxGetState
        : NULL;
    if (st)
        *st = *fn ? cudaDriverEntryPointSuccess : cudaDriverEntryPointSymbolNotFound;
    return cudaSuccess;
}
cudaError_t cudaGetDriverEntryPoint(const char *sym, void **fn, unsigned long long flags,
                                    enum cudaDriverEntryPointQueryResult *st)
{
    return cudaGetDriverEntryPointByVersion(sym, fn, 12000, flags, st);
}
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
    touch();
    if (nalloc == (int)(sizeof allocs / sizeof allocs[0]))
        return cudaErrorMemoryAllocation;
    /* read at every call: a test program may set it between its phases */
    const char *cap = getenv("FAKE_MEM_CAP");
    if (cap && *cap && dev_used[cur_dev] + n > strtoull(cap, NULL, 0)) {
        fprintf(stderr, "fake: cudaMalloc of %zu bytes on device %d refused: %zu in use, "
                "FAKE_MEM_CAP %s\n", n, cur_dev, dev_used[cur_dev], cap);
        return cudaErrorMemoryAllocation;
    }
    char *m = malloc(n);
    if (!m)
        return cudaErrorMemoryAllocation;
    memset(m, 0xee, n > 4096 ? 4096 : n);
    allocs[nalloc++] = (alloc_t){m, n, cur_dev};
    if ((dev_used[cur_dev] += n) > dev_peak[cur_dev])
        dev_peak[cur_dev] = dev_used[cur_dev];
    *p = m;
    return cudaSuccess;
}
cudaError_t cudaFree(void *p)
{
    if (!p)
        return cudaSuccess;
    touch();
    for (int d = 0; d < MAXDEV; d++)
        flush_wait(&legacies[d], "cudaFree");
    for (int i = 0; i < nstreams; i++)
        if (streams[i])
            flush_wait(streams[i], "cudaFree");
    for (int i = 0; i < nalloc; i++)
        if (allocs[i].p == p) {
            free(p);
            dev_used[allocs[i].dev] -= allocs[i].n;
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
/* CUDA's limit on a 2-D copy's pitches (cudaDevAttrMaxPitch, memPitch:
 * 2^31 - 1 on an H200), whatever the height: a contiguous copy larger than
 * that must be a 1-D one. FAKE_MAX_PITCH=N lowers it, for the tests. */
static size_t max_pitch(void)
{
    const char *e = getenv("FAKE_MAX_PITCH");
    return e && *e ? (size_t)strtoull(e, NULL, 0) : 2147483647u;
}
static cudaError_t copy_async(void *d, size_t dp, const void *s, size_t sp, size_t w, size_t h,
                              enum cudaMemcpyKind k, cudaStream_t st);
cudaError_t cudaMemcpy2DAsync(void *d, size_t dp, const void *s, size_t sp, size_t w, size_t h,
                              enum cudaMemcpyKind k, cudaStream_t st)
{
    if (h && (dp < w || sp < w)) /* CUDA's rule for every height, one row included */
        return cudaErrorInvalidPitchValue;
    if (dp > max_pitch() || sp > max_pitch()) {
        fprintf(stderr, "fake: 2-D copy with pitches %zu, %zu: over the maximum pitch %zu\n", dp,
                sp, max_pitch());
        return cudaErrorInvalidPitchValue;
    }
    return copy_async(d, dp, s, sp, w, h, k, st);
}
static long ncomms, ncopies; /* fakegpu_counts */
void fakegpu_counts(long *comms, long *copies);
void fakegpu_counts(long *comms, long *copies)
{
    *comms = ncomms;
    *copies = ncopies;
}
static cudaError_t copy_async(void *d, size_t dp, const void *s, size_t sp, size_t w, size_t h,
                              enum cudaMemcpyKind k, cudaStream_t st)
{
    ncopies++;
    if (h > 1 && (dp < w || sp < w))
        return cudaErrorInvalidPitchValue;
    size_t dn = h ? (h - 1) * dp + w : 0, sn = h ? (h - 1) * sp + w : 0;
    check(d, dn, k != cudaMemcpyDeviceToHost);
    check(s, sn, k != cudaMemcpyHostToDevice);
    push(S(st), (op_t){.k = OP_COPY, .d = d, .s = s, .n = w, .dpitch = dp, .spitch = sp, .rows = h});
    return cudaSuccess;
}
cudaError_t cudaMemcpy2D(void *d, size_t dp, const void *s, size_t sp, size_t w, size_t h,
                         enum cudaMemcpyKind k)
{
    /* as cudaMemcpy: synchronous for the host, done when it returns here */
    cudaError_t e = cudaMemcpy2DAsync(d, dp, s, sp, w, h, k, 0);
    if (e == cudaSuccess)
        flush_wait(S(0), "cudaMemcpy2D");
    return e;
}
cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, enum cudaMemcpyKind k, cudaStream_t st)
{
    return copy_async(d, n, s, n, n, 1, k, st); /* 1-D: no pitch limit */
}
cudaError_t cudaMemcpy(void *d, const void *s, size_t n, enum cudaMemcpyKind k)
{
    cudaError_t e = cudaMemcpyAsync(d, s, n, k, 0);
    /* D2H: synchronous. H2D from pageable: the host buffer is staged at
     * once (copy the bytes now), the device write is deferred. D2D: async. */
    if (e == cudaSuccess && k == cudaMemcpyDeviceToHost)
        flush_wait(S(0), "cudaMemcpy");
    else if (e == cudaSuccess && k == cudaMemcpyHostToDevice) {
        fstream_t *l = S(0);
        void *stage = malloc(n ? n : 1);
        memcpy(stage, s, n);
        l->q[l->n - 1].s = stage;
        l->q[l->n - 1].own = stage;
    }
    return e;
}
cudaError_t cudaMemset(void *d, int v, size_t n)
{
    check(d, n, 1);
    push(S(0), (op_t){.k = OP_SET, .d = d, .n = n, .v = v});
    return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize(void) /* the current device's streams */
{
    fstream_t *l = S(0);
    if (flush(l) && hung(l))
        return cudaErrorLaunchTimeout;
    flush_wait(l, "cudaDeviceSynchronize");
    for (int i = 0; i < nstreams; i++)
        if (streams[i] && streams[i]->dev == cur_dev) {
            if (flush(streams[i]) && hung(streams[i]))
                return cudaErrorLaunchTimeout;
            flush_wait(streams[i], "cudaDeviceSynchronize");
        }
    return cudaSuccess;
}
static cudaError_t mkstream(cudaStream_t *s, int blocking)
{
    fstream_t *f = calloc(1, sizeof *f);
    touch();
    f->blocking = blocking;
    f->dev = cur_dev;
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
    for (long i = f->done; i < f->n; i++)
        free(f->q[i].net);
    free(f->q);
    free(f);
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    if (getenv("FAKE_NOSYNC") && S(s)->legacy)
        return cudaSuccess;
    flush_wait(S(s), "cudaStreamSynchronize");
    return cudaSuccess;
}
cudaError_t cudaStreamQuery(cudaStream_t s)
{
    fstream_t *f = S(s);
    if (f->done < f->n && f->polls++ % 2 == 0)
        return cudaErrorNotReady;
    return flush(f) ? cudaErrorNotReady : cudaSuccess;
}
typedef struct { fstream_t *s; long pos; int polls, dev; } fevent_t;
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int fl)
{
    fevent_t *f = calloc(1, sizeof(fevent_t));
    touch();
    f->dev = cur_dev;
    *e = (cudaEvent_t)f;
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
    fstream_t *fs = S(s);
    if (fs->dev != f->dev) { /* CUDA: both must be of one device */
        fprintf(stderr, "fake: cudaEventRecord: an event of device %d on a stream of device %d\n",
                f->dev, fs->dev);
        return cudaErrorInvalidResourceHandle;
    }
    f->s = fs;
    f->pos = f->s->n;
    return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t e)
{
    fevent_t *f = (fevent_t *)e;
    if (!f->s)
        return cudaSuccess;
    if (f->s->done < f->pos && f->polls++ % 2 == 0)
        return cudaErrorNotReady;
    return flush_to(f->s, f->pos) ? cudaErrorNotReady : cudaSuccess;
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

/* ---- NCCL: communicators across processes ---- */
/* FAKE_NCCL_VERSION=V: the library is NCCL V; before 2.27 (22700) it has no
 * ncclCommShrink, which then ends the process as the dynamic loader does. */
static int fake_nccl_version(void)
{
    const char *e = getenv("FAKE_NCCL_VERSION");
    return e && *e ? atoi(e) : 22809;
}
ncclResult_t ncclGetVersion(int *v)
{
    *v = fake_nccl_version();
    return ncclSuccess;
}
const char *ncclGetErrorString(ncclResult_t r) { return r ? "fake nccl error" : "no error"; }
const char *ncclGetLastError(ncclComm_t c) { return "fake last error"; }
ncclResult_t ncclGetUniqueId(ncclUniqueId *u)
{
    static unsigned n;
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    memset(u, 0, sizeof *u);
    snprintf(u->internal, sizeof u->internal, "fk%d.%u.%lx", (int)getpid(), n++,
             (unsigned long)t.tv_nsec);
    return ncclSuccess;
}

static void sock_name(struct sockaddr_un *a, socklen_t *len, const char *token, int rank)
{
    memset(a, 0, sizeof *a);
    a->sun_family = AF_UNIX;
    uint64_t h = 1469598103934665603ull; /* FNV-1a: names of any length fit */
    for (const char *p = token; *p; p++)
        h = (h ^ (unsigned char)*p) * 1099511628211ull;
    int n = snprintf(a->sun_path + 1, sizeof a->sun_path - 1, "fakenccl/%016llx/%d",
                     (unsigned long long)h, rank);
    *len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n);
}

static int nlive; /* communicators made, neither destroyed nor aborted */
static fcomm_t *mkcomm(const char *token, int rank, int size)
{
    ncomms++;
    fcomm_t *c = calloc(1, sizeof *c);
    nlive++;
    c->rank = rank;
    c->size = size;
    c->polls = POLLS;
    c->lfd = -1;
    snprintf(c->token, sizeof c->token, "%s", token);
    c->out = malloc(size * sizeof(int));
    c->in = malloc(size * sizeof(int));
    c->conn = calloc(size, 1);
    for (int i = 0; i < size; i++)
        c->out[i] = c->in[i] = -1;
    if (size > 1) {
        struct sockaddr_un a;
        socklen_t len;
        sock_name(&a, &len, token, rank);
        c->lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (c->lfd < 0 || bind(c->lfd, (struct sockaddr *)&a, len) || listen(c->lfd, 256)) {
            fprintf(stderr, "fake: communicator %s rank %d: cannot listen: %s\n", token, rank,
                    strerror(errno));
            c->failed = 1;
        }
    }
    return c;
}

static void closeall(fcomm_t *c)
{
    for (int i = 0; i < c->size; i++) {
        if (c->out[i] >= 0)
            close(c->out[i]);
        if (c->in[i] >= 0)
            close(c->in[i]);
        c->out[i] = c->in[i] = -1;
    }
    if (c->lfd >= 0)
        close(c->lfd);
    c->lfd = -1;
}

/* The connection to send to peer p: connect (once its rank listens) and
 * say who we are. 0 ready, 1 not yet. */
static int out_fd(fcomm_t *c, int p)
{
    if (c->out[p] >= 0)
        return 0;
    struct sockaddr_un a;
    socklen_t len;
    sock_name(&a, &len, c->token, p);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, len)) {
        if (fd >= 0)
            close(fd);
        return 1; /* not listening yet (or gone: the caller's deadline ends it) */
    }
    int32_t me = c->rank;
    if (write(fd, &me, sizeof me) != sizeof me) {
        close(fd);
        return 1;
    }
    fcntl(fd, F_SETFL, O_NONBLOCK);
    c->out[p] = fd;
    return 0;
}

/* The connection peer p sends on: accept what is waiting. 0 ready, 1 not yet. */
static int in_fd(fcomm_t *c, int p)
{
    while (c->in[p] < 0) {
        int fd = accept4(c->lfd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0)
            return 1;
        int32_t who = -1;
        struct pollfd pf = {fd, POLLIN, 0};
        if (poll(&pf, 1, 5000) != 1 || read(fd, &who, sizeof who) != sizeof who || who < 0 ||
            who >= c->size || c->in[who] >= 0) {
            close(fd);
            continue;
        }
        fcntl(fd, F_SETFL, O_NONBLOCK);
        c->in[who] = fd;
    }
    return 0;
}

/* One step of a transfer to another rank: 0 done, 1 not yet (or failed:
 * c->failed says so; the stream stays blocked until the abort). */
static int net_progress(net_t *t)
{
    fcomm_t *c = t->c;
    if (c->aborted || c->killed)
        return 0;
    if (c->failed)
        return 1;
    if (t->send ? out_fd(c, t->peer) : in_fd(c, t->peer))
        return 1;
    int fd = t->send ? c->out[t->peer] : c->in[t->peer];
    for (;;) {
        size_t total = 8 + t->n;
        if (t->at == total || (!t->send && t->at == 8 + (size_t)t->len && t->at >= 8))
            break;
        char *p;
        size_t room;
        if (t->at < 8) {
            if (t->send)
                t->len = t->n;
            p = (char *)&t->len + t->at;
            room = 8 - t->at;
        } else {
            p = t->buf + (t->at - 8);
            room = total - t->at;
        }
        ssize_t k = t->send ? send(fd, p, room, MSG_NOSIGNAL) : recv(fd, p, room, 0);
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
            return 1;
        if (k <= 0) {
            fprintf(stderr, "fake: rank %d: %s rank %d: %s\n", c->rank,
                    t->send ? "send to" : "receive from", t->peer,
                    k == 0 ? "peer hung up" : strerror(errno));
            c->failed = 1;
            return 1;
        }
        t->at += (size_t)k;
        if (!t->send && t->at == 8 && t->len != t->n) {
            fprintf(stderr, "fake: rank %d: receive of %zu bytes from rank %d: %llu sent\n",
                    c->rank, t->n, t->peer, (unsigned long long)t->len);
            c->failed = 1;
            return 1;
        }
    }
    return 0;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int n, ncclUniqueId id, int rank,
                                    ncclConfig_t *cfg)
{
    if (n < 1 || rank < 0 || rank >= n || !cfg || cfg->blocking != 0 || cfg->magic != 0xcafebeef)
        return ncclInvalidArgument;
    if (getenv("FAKE_NCCL_DUPLICATE") && n > 1 && !getenv("NCCL_HOSTID"))
        return ncclInvalidUsage; /* real NCCL: "Duplicate GPU detected" (same host hash) */
    const char *ib = getenv("NCCL_IB_DISABLE");
    if (getenv("FAKE_NCCL_IB") && !(ib && !strcmp(ib, "1"))) {
        fprintf(stderr, "fake: NET/IB: an InfiniBand card without a fabric (FAKE_NCCL_IB), "
                "NCCL_IB_DISABLE=%s: set-up would hang\n", ib ? ib : "(unset)");
        return ncclSystemError;
    }
    char token[256];
    snprintf(token, sizeof token, "%.*s", (int)sizeof id.internal, id.internal);
    fcomm_t *c = mkcomm(token, rank, n);
    c->dev = cur_dev; /* NCCL: the communicator's GPU is the current device */
    *comm = (ncclComm_t)c;
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
    if (c->failed) {
        *st = ncclRemoteError;
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
static int ready(fcomm_t *c)
{
    return c && !c->aborted && !c->destroyed && !c->killed && c->polls == 0 && !c->pending;
}

/* Blocking all-to-all of 8 bytes per rank over c's connections (a split's
 * colours and keys), bounded: 0, or -1 when a peer does not take part. */
static int exchange8(fcomm_t *c, const int32_t mine[2], int32_t (*all)[2])
{
    double end = now_s() + 30;
    net_t *t = calloc(2 * c->size, sizeof *t);
    int n = 0;
    for (int p = 0; p < c->size; p++) {
        if (p == c->rank)
            continue;
        t[n++] = (net_t){c, p, 1, (char *)mine, 8, 0, 0};
        t[n++] = (net_t){c, p, 0, (char *)all[p], 8, 0, 0};
    }
    memcpy(all[c->rank], mine, 8);
    for (int busy = 1; busy;) {
        busy = 0;
        for (int i = 0; i < n; i++)
            busy |= net_progress(&t[i]);
        if (busy && (c->failed || now_s() > end)) {
            free(t);
            return -1;
        }
        if (busy)
            usleep(50);
    }
    free(t);
    return 0;
}

typedef struct { int32_t key, rank; } member_t;
static int by_key(const void *a, const void *b)
{
    const member_t *x = a, *y = b;
    return x->key != y->key ? (x->key < y->key ? -1 : 1) : x->rank - y->rank;
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *cfg)
{
    fcomm_t *c = (fcomm_t *)comm;
    if (!ready(c))
        return ncclInvalidUsage;
    *newcomm = NULL;
    int32_t mine[2] = {color, key}, (*all)[2] = calloc(c->size, sizeof *all);
    int n = c->nderived++;
    if (exchange8(c, mine, all)) {
        free(all);
        c->failed = 1; /* the asynchronous error: the caller aborts */
        return ncclInProgress;
    }
    c->child = NULL;
    if (color != NCCL_SPLIT_NOCOLOR) {
        member_t *m = calloc(c->size, sizeof *m);
        int k = 0, me = -1;
        for (int r = 0; r < c->size; r++)
            if (all[r][0] == color)
                m[k++] = (member_t){all[r][1], r};
        qsort(m, k, sizeof *m, by_key);
        for (int i = 0; i < k; i++)
            if (m[i].rank == c->rank)
                me = i;
        char token[320];
        snprintf(token, sizeof token, "%s.s%dc%d", c->token, n, color);
        c->child = mkcomm(token, me, k);
        c->child->polls = 0;
        c->child->dev = c->dev;
        free(m);
    }
    free(all);
    c->pending = newcomm;
    c->polls = POLLS;
    return ncclInProgress;
}
static int cmpi(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }
ncclResult_t ncclCommShrink(ncclComm_t comm, int *ex, int nex, ncclComm_t *newcomm, ncclConfig_t *cfg,
                            int flags)
{
    fcomm_t *c = (fcomm_t *)comm;
    if (fake_nccl_version() < 22700) {
        fprintf(stderr, "fake: symbol lookup error: undefined symbol: ncclCommShrink (NCCL %d)\n",
                fake_nccl_version());
        _exit(127);
    }
    if (!c || c->destroyed || c->aborted || !ex || nex <= 0 || nex >= c->size)
        return ncclInvalidArgument;
    if (c->failed) /* real NCCL (2.28 ncclCommInitChildComm): the parent's async error */
        return ncclRemoteError;
    qsort(ex, nex, sizeof(int), cmpi);
    if (bsearch(&c->rank, ex, nex, sizeof(int), cmpi))
        return ncclInvalidArgument;
    if (flags & NCCL_SHRINK_ABORT)
        c->killed = 1; /* the parent's pending operations end */
    int me = 0;
    for (int r = 0; r < c->rank; r++)
        me += !bsearch(&r, ex, nex, sizeof(int), cmpi);
    char token[320];
    snprintf(token, sizeof token, "%s.k%d", c->token, c->nderived++);
    *newcomm = NULL;
    c->child = mkcomm(token, me, c->size - nex);
    c->child->polls = 0;
    c->child->dev = c->dev;
    c->pending = newcomm;
    c->polls = POLLS;
    return ncclInProgress;
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
    closeall(c);
    nlive--;
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
    closeall(c);
    nlive--;
    c->destroyed = 1;
    return ncclSuccess;
}
typedef struct { int send; void *buf; size_t n; int peer; fcomm_t *c; fstream_t *s; } p2p_t;
static p2p_t grp[65536];
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
    if (!depth || !ready(c) || t != ncclUint8 || peer < 0 || peer >= c->size ||
        ngrp == (int)(sizeof grp / sizeof grp[0]))
        return ncclInvalidArgument;
    check(buf, n, 1);
    fstream_t *fs = S(st);
    if (fs->dev != c->dev) {
        fprintf(stderr, "fake: a transfer on a stream of device %d, communicator of device %d\n",
                fs->dev, c->dev);
        return ncclInvalidArgument;
    }
    grp[ngrp++] = (p2p_t){send, (void *)buf, n, peer, c, fs};
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
/* NCCL's round of a transfer: the distance to its peer (a send to rank + r
 * and a receive from rank - r are round r). */
static int round_of(const p2p_t *g)
{
    int d = g->send ? g->peer - g->c->rank : g->c->rank - g->peer;
    return (d % g->c->size + g->c->size) % g->c->size;
}

/* FAKE_NCCL_STRICT's rules (see the top): 0, or -1 with why on stderr. */
static int strict_ok(void)
{
    for (int i = 0; i < ngrp; i++) {
        p2p_t *a = &grp[i];
        int other = 0;
        if (a->peer == a->c->rank)
            continue;
        for (int j = 0; j < ngrp; j++) {
            if (j == i || grp[j].c != a->c || grp[j].peer != a->peer)
                continue;
            if (grp[j].send == a->send) {
                fprintf(stderr, "fake: strict: two %ss to rank %d in one group\n",
                        a->send ? "send" : "receive", a->peer);
                return -1;
            }
            other = 1;
        }
        if (!a->c->conn[a->peer] && !other) {
            fprintf(stderr, "fake: strict: rank %d's first group with rank %d goes one way: "
                    "NCCL would set up the connection mid-transfer\n", a->c->rank, a->peer);
            return -1;
        }
    }
    const char *e = getenv("FAKE_NCCL_ROUNDS");
    int most = e ? atoi(e) : 0, nround = 0, big = 0;
    for (int i = 0; most > 0 && i < ngrp; i++) {
        int seen = 0;
        for (int j = 0; j < i && !seen; j++)
            seen = round_of(&grp[j]) == round_of(&grp[i]);
        nround += !seen;
        big |= grp[i].n > 1;
    }
    if (big && nround > most) {
        fprintf(stderr, "fake: strict: a group of %d rounds (more than %d): NCCL would run some "
                "of them behind the others\n", nround, most);
        return -1;
    }
    for (int i = 0; i < ngrp; i++)
        grp[i].c->conn[grp[i].peer] = 1;
    return 0;
}

ncclResult_t ncclGroupEnd(void)
{
    if (--depth)
        return ncclSuccess;
    fcomm_t *c = ngrp ? grp[0].c : NULL;
    if (getenv("FAKE_NCCL_STRICT") && strict_ok()) {
        ngrp = 0;
        return ncclInvalidUsage;
    }
    static int used[sizeof grp / sizeof grp[0]];
    memset(used, 0, sizeof used);
    /* transfers to other ranks: one op on the stream, progressed together */
    net_t *net = NULL;
    int nnet = 0;
    fstream_t *ns = NULL;
    for (int i = 0; i < ngrp; i++) {
        if (grp[i].peer == grp[i].c->rank)
            continue;
        if (!net)
            net = calloc(ngrp, sizeof *net);
        net[nnet++] = (net_t){grp[i].c, grp[i].peer, grp[i].send, grp[i].buf, grp[i].n, 0, 0};
        ns = grp[i].s;
    }
    for (int i = 0; i < ngrp; i++) { /* to self: receives take sends in order */
        if (grp[i].send || grp[i].peer != grp[i].c->rank)
            continue;
        int j = 0;
        while (j < ngrp && (!grp[j].send || used[j] || grp[j].peer != grp[j].c->rank))
            j++;
        if (j == ngrp) { /* nobody sends: the kernel would wait forever */
            push(grp[i].s, (op_t){.k = OP_HANG, .comm = grp[i].c});
            continue;
        }
        used[j] = 1;
        if (grp[j].n != grp[i].n) {
            ngrp = 0;
            free(net);
            return ncclInvalidUsage;
        }
        push(grp[i].s, (op_t){.k = OP_COPY, .d = grp[i].buf, .s = grp[j].buf, .n = grp[i].n,
                              .dpitch = grp[i].n, .spitch = grp[i].n, .rows = 1});
        if (getenv("FAKE_CORRUPT") && grp[i].n > 100) /* drop the last byte of a chunk */
            grp[i].s->q[grp[i].s->n - 1].n -= 1;
    }
    if (nnet)
        push(ns, (op_t){.k = OP_NET, .net = net, .nnet = nnet});
    ngroups += ngrp > 0;
    ngrp = 0;
    if (c && rand() % 2) {
        c->polls = POLLS;
        return ncclInProgress;
    }
    return ncclSuccess;
}

/* FAKE_LEAKS=1: at a normal exit, device memory never freed or a
 * communicator neither destroyed nor aborted fails the process (exit 99). */
__attribute__((destructor)) static void leaks(void)
{
    if (!getenv("FAKE_LEAKS") || (!nalloc && !nlive))
        return;
    size_t bytes = 0;
    for (int i = 0; i < nalloc; i++)
        bytes += allocs[i].n;
    fprintf(stderr, "fake: at exit: %d device allocation(s) (%zu bytes) never freed, %d "
            "communicator(s) neither destroyed nor aborted\n", nalloc, bytes, nlive);
    _exit(99);
}
