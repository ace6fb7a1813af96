/* runtime/xfer/nccl: GPU memory and GPU-to-GPU transfers over NCCL
 * (docs/protocol-dataplane.md §3). Built when configure finds the
 * CUDA runtime and NCCL (HAVE_NCCL).
 *
 * Communicators are non-blocking (config.blocking = 0): every wait polls
 * ncclCommGetAsyncError and the stream under a deadline (on nrs_awake_s:
 * time the rank was stopped, as in a suspended job, counts in none), and a communicator
 * that fails or times out is aborted (ncclCommAbort), never waited on.
 * Transfers are grouped ncclSend/ncclRecv, cut into chunks of the same size
 * on every rank: chunk c of every transfer of a batch goes in group c, so
 * all ranks issue identical group sequences (NCCL's lockstep requirement).
 *
 * The caller's device: every function that works on a GPU (the device
 * given, or the communicator's) makes it the current device for the call,
 * and the caller's current again before it returns, failures included;
 * libnereus runs in a framework's threads, whose device is theirs. Not when
 * the caller's device has no CUDA context (a thread that never used CUDA):
 * making it current would make one, so the thread keeps ours (nccl.c).
 */
#ifndef NRS_XFER_NCCL_H
#define NRS_XFER_NCCL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define NRS_NCCL_ID_BYTES 128

typedef struct nrs_nccl nrs_nccl_t;

/* GPUs visible, 0 and *n; -1 with err ("no GPU: ..." when the driver or the
 * device is missing). */
int nrs_cuda_device_count(int *n, char *err, size_t errlen);
/* device: the GPU the memory is on (of nrs_cuda_alloc's), here and below. */
int nrs_cuda_alloc(int device, size_t bytes, void **ptr, char *err, size_t errlen);
void nrs_cuda_free(int device, void *ptr);
/* Synchronous copies (done when it returns, also device->device and from
 * pageable host memory, which cudaMemcpy alone does not wait for), on
 * device's legacy stream; kind: 'h' host->device, 'd' device->host, 'x'
 * device->device. */
int nrs_cuda_copy(int device, void *dst, const void *src, size_t bytes, char kind, char *err,
                  size_t errlen);

/* rows of width bytes, dpitch / spitch apart (cudaMemcpy2D's terms). */
typedef struct {
    void *dst;
    size_t dpitch;
    const void *src;
    size_t spitch, width, rows;
} nrs_cuda_copy2d_t;

/* Synchronous 2-D copy (kind as nrs_cuda_copy) and zero-fill of device memory. */
int nrs_cuda_copy2d(int device, const nrs_cuda_copy2d_t *cp, char kind, char *err,
                    size_t errlen);
int nrs_cuda_zero(int device, void *ptr, size_t bytes, char *err, size_t errlen);

/* NCCL_VERSION_CODE of the library loaded (2.28.9 = 22809) and of the header
 * built against. */
void nrs_nccl_version(int *lib, int *header);

/* A fresh unique id (rank 0 makes it, the rendezvous carries it). */
int nrs_nccl_unique_id(unsigned char id[NRS_NCCL_ID_BYTES], char *err, size_t errlen);

/* device: the CUDA device of this rank (its local rank on the node, or 0
 * when the resource manager gives each rank one GPU by CUDA_VISIBLE_DEVICES). */
int nrs_nccl_init(nrs_nccl_t **out, int rank, int size, int device,
                  const unsigned char id[NRS_NCCL_ID_BYTES], double timeout_s, char *err,
                  size_t errlen);
/* Survivors' communicator without the excluded ranks, after a failure
 * (ncclCommShrink with NCCL_SHRINK_ABORT: c's pending operations are
 * killed). Only survivors take part; an excluded rank that calls it gets
 * *out = NULL and 0. Either way c is done: it refuses transfers and
 * nrs_nccl_fini aborts it. */
int nrs_nccl_shrink(nrs_nccl_t *c, const int *exclude, int nexclude, nrs_nccl_t **out,
                    double timeout_s, char *err, size_t errlen);
/* A sub-communicator by colour (ncclCommSplit; every rank of c calls it);
 * key orders ranks; color NRS_NCCL_NOCOLOR (negative) gives *out = NULL. */
#define NRS_NCCL_NOCOLOR (-1)
int nrs_nccl_split(nrs_nccl_t *c, int color, int key, nrs_nccl_t **out, double timeout_s,
                   char *err, size_t errlen);
void nrs_nccl_abort(nrs_nccl_t *c);
void nrs_nccl_fini(nrs_nccl_t *c); /* finalize + destroy, or abort if that fails */

int nrs_nccl_rank(const nrs_nccl_t *c);
int nrs_nccl_size(const nrs_nccl_t *c);

typedef struct {
    int peer;    /* communicator rank */
    int is_send; /* else receive */
    void *buf;   /* device memory */
    size_t bytes;
} nrs_nccl_xfer_t;

/* Run a batch of transfers (the same batch, mirrored, on every rank involved,
 * with the same chunk_bytes everywhere: 0 = 16 MiB), chunked; waits at most
 * timeout_s, aborting the communicator on failure or time-out. Transfers to
 * one peer pair up in the order they are listed. Work queued before on the
 * legacy default stream (cudaMemcpy, cudaMemset, kernels on stream 0) is
 * waited for; when it returns 0 the bytes are in place. */
int nrs_nccl_exchange(nrs_nccl_t *c, const nrs_nccl_xfer_t *x, int n, size_t chunk_bytes,
                      double timeout_s, char *err, size_t errlen);

/* Asynchronous use, for a transport that posts as it goes (xport_nccl.h):
 * nrs_nccl_post enqueues on c's stream, after everything enqueued before
 * and after the work on the legacy default stream, the device-to-device
 * copies pre[] (packing), one group of the transfers x[] (not chunked), then
 * the copies post[] (unpacking), and returns its ticket (0, 1, 2, ... per
 * communicator), or -1 (c is aborted then, as on any failure). Every rank
 * must post the transfers between each pair in the same order; grouping may
 * differ. nrs_nccl_poll sets *done to the number of tickets whose work is
 * complete (they complete in order): 0, or -1 when the communicator failed
 * (aborted). Neither waits for peers, except that a non-blocking enqueue is
 * waited for up to timeout_s. */
int64_t nrs_nccl_post(nrs_nccl_t *c, const nrs_cuda_copy2d_t *pre, int npre,
                      const nrs_nccl_xfer_t *x, int n, const nrs_cuda_copy2d_t *post, int npost,
                      double timeout_s, char *err, size_t errlen);
int nrs_nccl_poll(nrs_nccl_t *c, int64_t *done, char *err, size_t errlen);
bool nrs_nccl_aborted(const nrs_nccl_t *c);

#endif
