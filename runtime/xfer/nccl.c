/* NCCL transport and CUDA memory (nccl.h). */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda.h> /* CUresult, CUdevice: the driver's context query (gpu_leave) */
#include <cuda_runtime_api.h>
/* nccl.h declares some functions with () */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <nccl.h>
#pragma GCC diagnostic pop

#include "util/util.h"
#include "xfer/nccl.h"

_Static_assert(sizeof(ncclUniqueId) == NRS_NCCL_ID_BYTES, "NRS_NCCL_ID_BYTES != ncclUniqueId");
_Static_assert(NRS_NCCL_NOCOLOR == NCCL_SPLIT_NOCOLOR, "NRS_NCCL_NOCOLOR != NCCL_SPLIT_NOCOLOR");

struct nrs_nccl {
    ncclComm_t comm;
    cudaStream_t stream;
    cudaEvent_t ready; /* recorded on the legacy stream: our stream waits on it */
    int rank, size, device;
    bool aborted;
    bool shrunk; /* parent of a shrink (NCCL_SHRINK_ABORT): abort, never reuse */
    /* nrs_nccl_post's tickets: an event recorded after each, oldest first */
    cudaEvent_t *ev;
    size_t ev_head, ev_n, ev_cap;
    int64_t posted, completed;
};

int nrs_cuda_device_count(int *n, char *err, size_t errlen)
{
    cudaError_t e = cudaGetDeviceCount(n);
    int drv = 0, rt = 0;
    if (e == cudaErrorInsufficientDriver && cudaDriverGetVersion(&drv) == cudaSuccess && drv > 0 &&
        cudaRuntimeGetVersion(&rt) == cudaSuccess) {
        /* a driver, too old for this runtime: GPUs may well be there */
        nrs_seterr(err, errlen,
                   "no GPU: %s: the driver supports CUDA %d.%d, this CUDA runtime needs %d.%d",
                   cudaGetErrorName(e), drv / 1000, drv % 1000 / 10, rt / 1000, rt % 1000 / 10);
        *n = 0;
        return -1;
    }
    if (e != cudaSuccess || *n < 1) {
        nrs_seterr(err, errlen, "no GPU: %s", e != cudaSuccess ? cudaGetErrorName(e) : "0 devices");
        *n = 0;
        return -1;
    }
    return 0;
}

/* ---- the caller's device ------------------------------------------------------------
 * libnereus runs inside a training framework's process (PyTorch, ...), and
 * a thread's current device is the framework's: every function here that
 * works on a GPU makes its device current for the call (gpu_enter) and
 * makes the caller's current again before it returns (gpu_leave), on its
 * error paths too. Also, the CUDA calls without a device (cudaMemcpy,
 * cudaMemset, cudaFree, the legacy stream) act on the current device, so
 * they must run under our device, not the caller's.
 * One exception: a device of the caller's without a primary context (a
 * thread that never used CUDA: device 0) is not made current again, since
 * cudaSetDevice would make that context (CUDA 12 and later: hundreds of
 * MiB of GPU 0, in every rank of the node); the thread's device then stays
 * ours, as PyTorch's own device guard does it (c10::cuda::MaybeSetDevice). */
typedef struct {
    int saved, device; /* saved: -1 when unknown (no driver, no device) */
} gpu_guard_t;

static int gpu_enter(gpu_guard_t *g, int device, char *err, size_t errlen)
{
    g->device = device;
    if (cudaGetDevice(&g->saved) != cudaSuccess)
        g->saved = -1;
    cudaError_t e = g->saved == device ? cudaSuccess : cudaSetDevice(device);
    if (e != cudaSuccess) {
        nrs_seterr(err, errlen, "cuda: GPU %d: %s", device, cudaGetErrorString(e));
        return -1;
    }
    return 0;
}

typedef CUresult (*cu_device_get_fn)(CUdevice *, int);
typedef CUresult (*cu_ctx_state_fn)(CUdevice, unsigned int *, int *);

/* The driver's function sym, through the runtime (libcuda is not linked),
 * or NULL. */
static void *driver_fn(const char *sym)
{
    void *fn = NULL;
    enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
    cudaError_t e = cudaGetDriverEntryPointByVersion(sym, &fn, 12000, cudaEnableDefault, &q);
#else
    cudaError_t e = cudaGetDriverEntryPoint(sym, &fn, cudaEnableDefault, &q);
#endif
    return e == cudaSuccess && q == cudaDriverEntryPointSuccess ? fn : NULL;
}

/* Has the device a primary context? 1 when the driver cannot tell. */
static int has_context(int device)
{
    static void *get_fn, *state_fn;
    static int looked; /* threads racing here look up the same pointers */
    if (!__atomic_load_n(&looked, __ATOMIC_ACQUIRE)) {
        __atomic_store_n(&get_fn, driver_fn("cuDeviceGet"), __ATOMIC_RELAXED);
        __atomic_store_n(&state_fn, driver_fn("cuDevicePrimaryCtxGetState"), __ATOMIC_RELAXED);
        __atomic_store_n(&looked, 1, __ATOMIC_RELEASE);
    }
    cu_device_get_fn get = (cu_device_get_fn)__atomic_load_n(&get_fn, __ATOMIC_RELAXED);
    cu_ctx_state_fn state = (cu_ctx_state_fn)__atomic_load_n(&state_fn, __ATOMIC_RELAXED);
    CUdevice d;
    unsigned int flags;
    int active;
    if (!get || !state || get(&d, device) != CUDA_SUCCESS ||
        state(d, &flags, &active) != CUDA_SUCCESS)
        return 1;
    return active != 0;
}

static void gpu_leave(const gpu_guard_t *g)
{
    if (g->saved >= 0 && g->saved != g->device && has_context(g->saved))
        cudaSetDevice(g->saved);
}

int nrs_cuda_alloc(int device, size_t bytes, void **ptr, char *err, size_t errlen)
{
    gpu_guard_t g;
    *ptr = NULL;
    if (gpu_enter(&g, device, err, errlen))
        return -1;
    cudaError_t e = cudaMalloc(ptr, bytes ? bytes : 1);
    gpu_leave(&g);
    if (e != cudaSuccess) {
        nrs_seterr(err, errlen, "cuda: %zu bytes on GPU %d: %s", bytes, device, cudaGetErrorString(e));
        *ptr = NULL;
        return -1;
    }
    return 0;
}

void nrs_cuda_free(int device, void *ptr)
{
    gpu_guard_t g;
    char err[64];
    if (!ptr || gpu_enter(&g, device, err, sizeof err))
        return;
    cudaFree(ptr);
    gpu_leave(&g);
}

/* e, then the legacy stream's work done: cudaMemcpy returns before a
 * device->device copy, or the DMA of a pageable host->device one, is done,
 * cudaMemset before its fill, and a non-blocking stream (NCCL's) would not
 * wait for them. 0, or -1 with "cuda: WHAT: the error". */
static int legacy_done(cudaError_t e, char *err, size_t errlen, const char *what)
{
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(cudaStreamLegacy);
    if (e != cudaSuccess) {
        nrs_seterr(err, errlen, "cuda: %s: %s", what, cudaGetErrorString(e));
        return -1;
    }
    return 0;
}

static enum cudaMemcpyKind copy_kind(char kind)
{
    return kind == 'h' ? cudaMemcpyHostToDevice
         : kind == 'd' ? cudaMemcpyDeviceToHost : cudaMemcpyDeviceToDevice;
}

int nrs_cuda_copy(int device, void *dst, const void *src, size_t bytes, char kind, char *err,
                  size_t errlen)
{
    nrs_cuda_copy2d_t cp = {dst, bytes, src, bytes, bytes, 1};
    return nrs_cuda_copy2d(device, &cp, kind, err, errlen);
}

/* Rows back to back on both sides: one 1-D copy. cudaMemcpy2D refuses a
 * pitch over the device's maximum (cudaDevAttrMaxPitch, 2^31 - 1 on an
 * H200) even for one row, so a contiguous region of 2 GiB or more could
 * not move as a 2-D copy. */
static bool copy_flat(const nrs_cuda_copy2d_t *cp)
{
    return cp->rows <= 1 || (cp->dpitch == cp->width && cp->spitch == cp->width);
}

int nrs_cuda_copy2d(int device, const nrs_cuda_copy2d_t *cp, char kind, char *err,
                    size_t errlen)
{
    char what[96];
    gpu_guard_t g;
    if (cp->rows == 1)
        snprintf(what, sizeof what, "copy of %zu bytes", cp->width);
    else
        snprintf(what, sizeof what, "2-D copy of %zu rows of %zu bytes", cp->rows, cp->width);
    if (gpu_enter(&g, device, err, errlen))
        return -1;
    cudaError_t e = cudaSuccess;
    if (cp->rows && copy_flat(cp))
        e = cudaMemcpy(cp->dst, cp->src, cp->rows * cp->width, copy_kind(kind));
    else if (cp->rows)
        e = cudaMemcpy2D(cp->dst, cp->dpitch, cp->src, cp->spitch, cp->width, cp->rows,
                         copy_kind(kind));
    int rc = legacy_done(e, err, errlen, what);
    gpu_leave(&g);
    return rc;
}

int nrs_cuda_zero(int device, void *ptr, size_t bytes, char *err, size_t errlen)
{
    char what[64];
    gpu_guard_t g;
    snprintf(what, sizeof what, "zeroing %zu bytes", bytes);
    if (gpu_enter(&g, device, err, errlen))
        return -1;
    int rc = legacy_done(bytes ? cudaMemset(ptr, 0, bytes) : cudaSuccess, err, errlen, what);
    gpu_leave(&g);
    return rc;
}

void nrs_nccl_version(int *lib, int *header)
{
    if (ncclGetVersion(lib) != ncclSuccess)
        *lib = 0;
    *header = NCCL_VERSION_CODE;
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

/* Until the communicator leaves ncclInProgress (polled at least once, also
 * past the deadline); abort on error or time-out. */
static int wait_comm(nrs_nccl_t *c, double end, const char *what, char *err, size_t errlen)
{
    ncclResult_t st = ncclInProgress, q;
    while ((q = ncclCommGetAsyncError(c->comm, &st)) == ncclSuccess && st == ncclInProgress &&
           nrs_awake_s() < end)
        nrs_nap_us(20);
    if (q == ncclSuccess && st == ncclSuccess)
        return 0;
    if (q != ncclSuccess)
        nrs_seterr(err, errlen, "nccl: %s: ncclCommGetAsyncError: %s", what, ncclGetErrorString(q));
    else if (st == ncclInProgress)
        nrs_seterr(err, errlen, "nccl: %s: timed out: aborting the communicator", what);
    else
        nrs_seterr(err, errlen, "nccl: %s: %s (%s)", what, ncclGetErrorString(st),
                   ncclGetLastError(c->comm));
    nrs_nccl_abort(c);
    return -1;
}

static void comm_free(nrs_nccl_t *c)
{
    for (size_t i = 0; i < c->ev_n; i++)
        cudaEventDestroy(c->ev[(c->ev_head + i) % c->ev_cap]);
    free(c->ev);
    if (c->ready)
        cudaEventDestroy(c->ready);
    if (c->stream)
        cudaStreamDestroy(c->stream);
    free(c);
}

/* On device, the current one (the caller's gpu_enter). */
static nrs_nccl_t *comm_new(int device, char *err, size_t errlen)
{
    nrs_nccl_t *c = calloc(1, sizeof(*c));
    if (!c) {
        nrs_seterr(err, errlen, "nccl: out of memory");
        return NULL;
    }
    c->device = device;
    cudaError_t e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
    if (e == cudaSuccess)
        e = cudaEventCreateWithFlags(&c->ready, cudaEventDisableTiming);
    if (e != cudaSuccess) {
        nrs_seterr(err, errlen, "nccl: cannot set up GPU %d: %s", device, cudaGetErrorString(e));
        comm_free(c);
        return NULL;
    }
    return c;
}

/* nrs_nccl_init on device, the current one: NCCL takes it for the
 * communicator's. */
static int init_here(nrs_nccl_t **out, int rank, int size, int device,
                     const unsigned char id[NRS_NCCL_ID_BYTES], double end, char *err,
                     size_t errlen)
{
    nrs_nccl_t *c = comm_new(device, err, errlen);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    ncclUniqueId u;
    if (!c)
        return -1;
    cfg.blocking = 0;
    memcpy(u.internal, id, NRS_NCCL_ID_BYTES);
    c->rank = rank;
    c->size = size;
    ncclResult_t r = ncclCommInitRankConfig(&c->comm, size, u, rank, &cfg);
    if (r != ncclSuccess && r != ncclInProgress) {
        nrs_seterr(err, errlen, "nccl: ncclCommInitRankConfig (rank %d of %d, GPU %d): %s", rank,
                   size, device, ncclGetErrorString(r));
        nrs_nccl_abort(c);
        comm_free(c);
        return -1;
    }
    if (wait_comm(c, end, "communicator set-up", err, errlen)) {
        comm_free(c);
        return -1;
    }
    *out = c;
    return 0;
}

int nrs_nccl_init(nrs_nccl_t **out, int rank, int size, int device,
                  const unsigned char id[NRS_NCCL_ID_BYTES], double timeout_s, char *err,
                  size_t errlen)
{
    double end = nrs_awake_s() + timeout_s;
    gpu_guard_t g;
    *out = NULL;
    if (size < 1 || rank < 0 || rank >= size || device < 0) {
        nrs_seterr(err, errlen, "nccl: rank %d of %d on GPU %d: invalid", rank, size, device);
        return -1;
    }
    if (gpu_enter(&g, device, err, errlen))
        return -1;
    int rc = init_here(out, rank, size, device, id, end, err, errlen);
    gpu_leave(&g);
    return rc;
}

/* After a split or shrink was started on c: the child, once NCCL has stored
 * it in d->comm (by the end of the parent's asynchronous job; NULL for
 * NCCL_SPLIT_NOCOLOR), ready. */
static int derive_wait(nrs_nccl_t *c, nrs_nccl_t *d, nrs_nccl_t **out, double end, const char *what,
                       char *err, size_t errlen)
{
    /* Aborting the parent (wait_comm on error or time-out) joins its job,
     * so d->comm is final then too, and a half-made child is aborted. */
    if (wait_comm(c, end, what, err, errlen)) {
        nrs_nccl_abort(d);
        comm_free(d);
        return -1;
    }
    if (!d->comm) {
        comm_free(d);
        return 0;
    }
    if (wait_comm(d, end, "new communicator", err, errlen) ||
        ncclCommUserRank(d->comm, &d->rank) != ncclSuccess ||
        ncclCommCount(d->comm, &d->size) != ncclSuccess) {
        if (!d->aborted)
            nrs_seterr(err, errlen, "nccl: %s: new communicator: no rank", what);
        nrs_nccl_abort(d);
        comm_free(d);
        return -1;
    }
    *out = d;
    return 0;
}

static int usable(const nrs_nccl_t *c, char *err, size_t errlen)
{
    if (!c || !c->comm)
        nrs_seterr(err, errlen, "nccl: no communicator");
    else if (c->aborted)
        nrs_seterr(err, errlen, "nccl: communicator was aborted");
    else if (c->shrunk)
        nrs_seterr(err, errlen, "nccl: communicator was shrunk: use the survivors' one");
    else
        return 1;
    return 0;
}

/* NCCL refused to start a split or shrink of c: both communicators are
 * aborted (c's other ranks may be inside the collective), d is freed. */
static int derive_refused(nrs_nccl_t *c, nrs_nccl_t *d, const char *call, ncclResult_t r,
                          char *err, size_t errlen)
{
    nrs_seterr(err, errlen, "nccl: %s: %s", call, ncclGetErrorString(r));
    nrs_nccl_abort(c);
    nrs_nccl_abort(d);
    comm_free(d);
    return -1;
}

static int shrink_here(nrs_nccl_t *c, const int *exclude, int nexclude, nrs_nccl_t **out,
                       double timeout_s, char *err, size_t errlen)
{
    double end = nrs_awake_s() + timeout_s;
    *out = NULL;
    if (!usable(c, err, errlen))
        return -1;
    if (nexclude < 1 || nexclude >= c->size) {
        nrs_seterr(err, errlen, "nccl: shrink: %d of %d ranks excluded", nexclude, c->size);
        return -1;
    }
    /* NCCL sorts the list in place, and refuses a caller that is in it. */
    int *ex = malloc((size_t)nexclude * sizeof(*ex));
    if (!ex) {
        nrs_seterr(err, errlen, "nccl: out of memory");
        return -1;
    }
    bool me = false;
    for (int i = 0; i < nexclude; i++) {
        ex[i] = exclude[i];
        me |= ex[i] == c->rank;
        /* NCCL counts survivors as size - nexclude: a repeated or foreign
         * rank would make ranks disagree on the new size and hang. */
        bool bad = ex[i] < 0 || ex[i] >= c->size;
        for (int j = 0; j < i && !bad; j++)
            bad = ex[j] == ex[i];
        if (bad) {
            nrs_seterr(err, errlen, "nccl: shrink: excluded rank %d: out of range or repeated",
                       ex[i]);
            free(ex);
            return -1;
        }
    }
    c->shrunk = true;
    if (me) {
        free(ex);
        return 0;
    }
    /* Built against 2.28, but the library loaded may be older: ncclCommShrink
     * came with 2.27, and calling it there (lazy binding) would kill the
     * process with "undefined symbol". */
    int lib, hdr;
    nrs_nccl_version(&lib, &hdr);
    if (lib < 22700) {
        nrs_seterr(err, errlen, "nccl: shrink: ncclCommShrink needs NCCL 2.27, NCCL %d is loaded",
                   lib);
        free(ex);
        return -1;
    }
    nrs_nccl_t *d = comm_new(c->device, err, errlen);
    if (!d) {
        free(ex);
        return -1;
    }
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclResult_t r = ncclCommShrink(c->comm, ex, nexclude, &d->comm, &cfg, NCCL_SHRINK_ABORT);
    free(ex);
    if (r != ncclSuccess && r != ncclInProgress)
        return derive_refused(c, d, "ncclCommShrink", r, err, errlen);
    return derive_wait(c, d, out, end, "shrink", err, errlen);
}

static int split_here(nrs_nccl_t *c, int color, int key, nrs_nccl_t **out, double timeout_s,
                      char *err, size_t errlen)
{
    double end = nrs_awake_s() + timeout_s;
    *out = NULL;
    if (!usable(c, err, errlen))
        return -1;
    nrs_nccl_t *d = comm_new(c->device, err, errlen);
    if (!d)
        return -1;
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclResult_t r = ncclCommSplit(c->comm, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &d->comm,
                                   &cfg);
    if (r != ncclSuccess && r != ncclInProgress)
        return derive_refused(c, d, "ncclCommSplit", r, err, errlen);
    return derive_wait(c, d, out, end, "split", err, errlen);
}

/* A usable c, and its device current for the call: 0, or -1 with err. */
static int comm_enter(gpu_guard_t *g, const nrs_nccl_t *c, char *err, size_t errlen)
{
    return usable(c, err, errlen) ? gpu_enter(g, c->device, err, errlen) : -1;
}

int nrs_nccl_shrink(nrs_nccl_t *c, const int *exclude, int nexclude, nrs_nccl_t **out,
                    double timeout_s, char *err, size_t errlen)
{
    gpu_guard_t g;
    *out = NULL;
    if (comm_enter(&g, c, err, errlen))
        return -1;
    int rc = shrink_here(c, exclude, nexclude, out, timeout_s, err, errlen);
    gpu_leave(&g);
    return rc;
}

int nrs_nccl_split(nrs_nccl_t *c, int color, int key, nrs_nccl_t **out, double timeout_s,
                   char *err, size_t errlen)
{
    gpu_guard_t g;
    *out = NULL;
    if (comm_enter(&g, c, err, errlen))
        return -1;
    int rc = split_here(c, color, key, out, timeout_s, err, errlen);
    gpu_leave(&g);
    return rc;
}

void nrs_nccl_abort(nrs_nccl_t *c)
{
    if (c && c->comm && !c->aborted) {
        gpu_guard_t g;
        char err[64];
        int entered = !gpu_enter(&g, c->device, err, sizeof err); /* aborted all the same */
        ncclCommAbort(c->comm); /* blocking even when the communicator is not */
        c->aborted = true;
        if (entered)
            gpu_leave(&g);
    }
}

/* nrs_nccl_fini on c's device. */
static void fini_here(nrs_nccl_t *c)
{
    if (c->comm && !c->aborted && !c->shrunk) { /* wait_comm aborts what does not finalize */
        char err[64];
        ncclResult_t r = ncclCommFinalize(c->comm);
        if ((r == ncclSuccess || r == ncclInProgress) &&
            wait_comm(c, nrs_awake_s() + 10.0, "finalize", err, sizeof err) == 0)
            ncclCommDestroy(c->comm);
        else
            nrs_nccl_abort(c);
    } else {
        nrs_nccl_abort(c);
    }
    comm_free(c);
}

void nrs_nccl_fini(nrs_nccl_t *c)
{
    gpu_guard_t g;
    char err[64];
    if (!c)
        return;
    int entered = !gpu_enter(&g, c->device, err, sizeof err); /* freed all the same */
    fini_here(c);
    if (entered)
        gpu_leave(&g);
}

int nrs_nccl_rank(const nrs_nccl_t *c) { return c->rank; }
bool nrs_nccl_aborted(const nrs_nccl_t *c) { return !c || c->aborted || c->shrunk; }
int nrs_nccl_size(const nrs_nccl_t *c) { return c->size; }

/* Work on the legacy default stream (cudaMemcpy, kernels on stream 0) comes
 * first: our stream is non-blocking and would not wait for it. */
static cudaError_t after_legacy(nrs_nccl_t *c)
{
    cudaError_t e = cudaEventRecord(c->ready, cudaStreamLegacy); /* c's device's */
    if (e == cudaSuccess)
        e = cudaStreamWaitEvent(c->stream, c->ready, 0);
    return e;
}

/* The communicator's asynchronous error, if it has one: 1 with err set. */
static int comm_failed(nrs_nccl_t *c, char *err, size_t errlen)
{
    ncclResult_t st;
    if (ncclCommGetAsyncError(c->comm, &st) != ncclSuccess || st == ncclSuccess ||
        st == ncclInProgress)
        return 0;
    nrs_seterr(err, errlen, "nccl: %s (%s)", ncclGetErrorString(st), ncclGetLastError(c->comm));
    return 1;
}

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
        if (comm_failed(c, err, errlen))
            break;
        if (nrs_awake_s() > end) {
            nrs_seterr(err, errlen, "nccl: transfers not done in time: aborting the communicator");
            break;
        }
        nrs_nap_us(20);
    }
    nrs_nccl_abort(c);
    return -1;
}

/* Every rank must issue the same groups, so a bad batch is refused before
 * anything is posted; chunks: of the longest transfer. */
static int check_batch(const nrs_nccl_t *c, const nrs_nccl_xfer_t *x, int n, size_t chunk,
                       size_t *nchunks, char *err, size_t errlen)
{
    size_t maxb = 0;
    if (n < 0 || (n > 0 && !x)) {
        nrs_seterr(err, errlen, "nccl: exchange: %d transfers", n);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        if (x[i].peer < 0 || x[i].peer >= c->size || (x[i].bytes && !x[i].buf)) {
            nrs_seterr(err, errlen, "nccl: exchange: transfer %d: peer %d of %d, buffer %p", i,
                       x[i].peer, c->size, x[i].buf);
            return -1;
        }
        if (x[i].bytes > maxb)
            maxb = x[i].bytes;
    }
    *nchunks = maxb / chunk + (maxb % chunk != 0); /* no overflow near SIZE_MAX */
    return 0;
}

/* Group ch: chunk ch of every transfer that has one. */
static ncclResult_t post_group(nrs_nccl_t *c, const nrs_nccl_xfer_t *x, int n, size_t chunk,
                               size_t ch)
{
    ncclResult_t r = ncclGroupStart();
    if (r != ncclSuccess)
        return r;
    for (int i = 0; i < n && r == ncclSuccess; i++) {
        size_t off = ch * chunk;
        if (off >= x[i].bytes)
            continue;
        size_t len = x[i].bytes - off < chunk ? x[i].bytes - off : chunk;
        char *p = (char *)x[i].buf + off;
        r = x[i].is_send ? ncclSend(p, len, ncclUint8, x[i].peer, c->comm, c->stream)
                         : ncclRecv(p, len, ncclUint8, x[i].peer, c->comm, c->stream);
    }
    ncclResult_t g = ncclGroupEnd();
    return r == ncclSuccess ? g : r;
}

static int exchange_here(nrs_nccl_t *c, const nrs_nccl_xfer_t *x, int n, size_t chunk_bytes,
                         double timeout_s, char *err, size_t errlen)
{
    double end = nrs_awake_s() + timeout_s;
    size_t nchunks;
    if (!usable(c, err, errlen))
        return -1;
    if (!chunk_bytes)
        chunk_bytes = 16u << 20;
    if (check_batch(c, x, n, chunk_bytes, &nchunks, err, errlen))
        return -1;
    cudaError_t e = after_legacy(c);
    if (e != cudaSuccess) {
        nrs_seterr(err, errlen, "nccl: GPU %d: %s", c->device, cudaGetErrorString(e));
        return -1;
    }
    for (size_t ch = 0; ch < nchunks; ch++) {
        ncclResult_t r = post_group(c, x, n, chunk_bytes, ch);
        if (r != ncclSuccess && r != ncclInProgress) {
            nrs_seterr(err, errlen, "nccl: group %zu of %zu: %s (%s)", ch, nchunks,
                       ncclGetErrorString(r), ncclGetLastError(c->comm));
            nrs_nccl_abort(c);
            return -1;
        }
        /* Non-blocking communicator: wait for the enqueue itself, then go on. */
        if (r == ncclInProgress && wait_comm(c, end, "enqueue", err, errlen))
            return -1;
    }
    return wait_stream(c, end, err, errlen);
}

int nrs_nccl_exchange(nrs_nccl_t *c, const nrs_nccl_xfer_t *x, int n, size_t chunk_bytes,
                      double timeout_s, char *err, size_t errlen)
{
    gpu_guard_t g;
    if (comm_enter(&g, c, err, errlen))
        return -1;
    int rc = exchange_here(c, x, n, chunk_bytes, timeout_s, err, errlen);
    gpu_leave(&g);
    return rc;
}

/* ---- posting as one goes (xport_nccl) ---------------------------------------------- */

static cudaError_t copies(nrs_nccl_t *c, const nrs_cuda_copy2d_t *cp, int n)
{
    cudaError_t e = cudaSuccess;
    for (int i = 0; i < n && e == cudaSuccess; i++)
        if (cp[i].rows && copy_flat(&cp[i]))
            e = cudaMemcpyAsync(cp[i].dst, cp[i].src, cp[i].rows * cp[i].width,
                                cudaMemcpyDeviceToDevice, c->stream);
        else if (cp[i].rows)
            e = cudaMemcpy2DAsync(cp[i].dst, cp[i].dpitch, cp[i].src, cp[i].spitch, cp[i].width,
                                  cp[i].rows, cudaMemcpyDeviceToDevice, c->stream);
    return e;
}

/* An event for the next ticket, at the end of the ring. */
static cudaError_t push_event(nrs_nccl_t *c)
{
    if (c->ev_n == c->ev_cap) {
        size_t cap = c->ev_cap ? 2 * c->ev_cap : 16;
        cudaEvent_t *v = malloc(cap * sizeof(*v));
        if (!v)
            return cudaErrorMemoryAllocation;
        for (size_t i = 0; i < c->ev_n; i++)
            v[i] = c->ev[(c->ev_head + i) % c->ev_cap];
        free(c->ev);
        c->ev = v;
        c->ev_cap = cap;
        c->ev_head = 0;
    }
    cudaEvent_t ev;
    cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    if (e != cudaSuccess)
        return e;
    if ((e = cudaEventRecord(ev, c->stream)) != cudaSuccess) {
        cudaEventDestroy(ev);
        return e;
    }
    c->ev[(c->ev_head + c->ev_n++) % c->ev_cap] = ev;
    return cudaSuccess;
}

static int64_t post_here(nrs_nccl_t *c, const nrs_cuda_copy2d_t *pre, int npre,
                         const nrs_nccl_xfer_t *x, int n, const nrs_cuda_copy2d_t *post,
                         int npost, double timeout_s, char *err, size_t errlen)
{
    size_t unused;
    if (!usable(c, err, errlen) || check_batch(c, x, n, SIZE_MAX, &unused, err, errlen))
        return -1;
    cudaError_t e = after_legacy(c);
    if (e == cudaSuccess)
        e = copies(c, pre, npre);
    if (e != cudaSuccess) {
        nrs_seterr(err, errlen, "nccl: GPU %d: %s", c->device, cudaGetErrorString(e));
        nrs_nccl_abort(c);
        return -1;
    }
    if (n > 0) {
        ncclResult_t r = post_group(c, x, n, SIZE_MAX, 0);
        if (r != ncclSuccess && r != ncclInProgress) {
            nrs_seterr(err, errlen, "nccl: group of %d transfers: %s (%s)", n,
                       ncclGetErrorString(r), ncclGetLastError(c->comm));
            nrs_nccl_abort(c);
            return -1;
        }
        if (r == ncclInProgress && wait_comm(c, nrs_awake_s() + timeout_s, "enqueue", err, errlen))
            return -1;
    }
    e = copies(c, post, npost);
    if (e == cudaSuccess)
        e = push_event(c);
    if (e != cudaSuccess) {
        nrs_seterr(err, errlen, "nccl: GPU %d: %s", c->device, cudaGetErrorString(e));
        nrs_nccl_abort(c);
        return -1;
    }
    return c->posted++;
}

int64_t nrs_nccl_post(nrs_nccl_t *c, const nrs_cuda_copy2d_t *pre, int npre,
                      const nrs_nccl_xfer_t *x, int n, const nrs_cuda_copy2d_t *post, int npost,
                      double timeout_s, char *err, size_t errlen)
{
    gpu_guard_t g;
    if (comm_enter(&g, c, err, errlen))
        return -1;
    int64_t t = post_here(c, pre, npre, x, n, post, npost, timeout_s, err, errlen);
    gpu_leave(&g);
    return t;
}

/* No device of its own: event queries and destroys are the same from any
 * device, and it is called in loops. */
int nrs_nccl_poll(nrs_nccl_t *c, int64_t *done, char *err, size_t errlen)
{
    *done = c ? c->completed : 0;
    if (!usable(c, err, errlen))
        return -1;
    while (c->ev_n) {
        cudaEvent_t ev = c->ev[c->ev_head];
        cudaError_t e = cudaEventQuery(ev);
        if (e == cudaErrorNotReady)
            break;
        if (e != cudaSuccess) {
            nrs_seterr(err, errlen, "nccl: stream: %s", cudaGetErrorString(e));
            nrs_nccl_abort(c);
            return -1;
        }
        cudaEventDestroy(ev);
        c->ev_head = (c->ev_head + 1) % c->ev_cap;
        c->ev_n--;
        c->completed++;
    }
    *done = c->completed;
    if (c->ev_n && comm_failed(c, err, errlen)) { /* still waiting: has it failed? */
        nrs_nccl_abort(c);
        return -1;
    }
    return 0;
}
