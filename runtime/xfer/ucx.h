/* runtime/xfer/ucx: host-memory transfers between ranks over UCX tag
 * matching (docs/protocol-dataplane.md §2).
 *
 * One worker per process (thread mode single), endpoints to every rank
 * (itself included) with UCP_ERR_HANDLING_MODE_PEER and an error callback,
 * so a dead peer fails the operations that involve it instead of leaving
 * them waiting. A message is cut into chunks of chunk_bytes, at most window
 * of them in flight; the UCX tag of a chunk is
 *     sender rank (16 bits) | message tag (32 bits) | chunk index (16 bits)
 * so sender and receiver agree on the chunking by construction (both derive
 * it from the same length and chunk size).
 *
 * Every operation has a stall time-out: it fails when no chunk of it has
 * completed for op_timeout_s of this rank's awake time (nrs_awake_s: time
 * the rank was stopped, as in a suspended job, is not counted). Nothing here blocks without progressing the
 * worker; nrs_ucx_progress has the nrs_rdv_progress_fn signature so a PMIx
 * fence can keep UCX moving.
 *
 * Not thread-safe: one thread drives a context.
 */
#ifndef NRS_XFER_UCX_H
#define NRS_XFER_UCX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct nrs_ucx nrs_ucx_t;
typedef struct nrs_ucx_op nrs_ucx_op_t;

#define NRS_UCX_MAX_WINDOW 16
#define NRS_UCX_MAX_RANKS 65536
#define NRS_UCX_MAX_CHUNKS 65536

typedef struct {
    size_t chunk_bytes;     /* 0 = 8 MiB */
    int window;             /* chunks in flight per message; 0 = 4 */
    double op_timeout_s;    /* stall time-out; 0 = 30 s */
    double keepalive_s;     /* UCX keep-alive (dead-peer detection); 0 = 1 s,
                             * unless UCX_KEEPALIVE_INTERVAL is set */
    double spin_s;          /* waits poll without napping this long after the
                             * last event (nrs_ucx_spin), plus while a chunk in
                             * flight could still be moving; 0 = 1 ms, < 0 = never */
} nrs_ucx_opts_t;

/* Second opinion on peer liveness (e.g. nrs_rdv_peer_failed). */
typedef bool (*nrs_ucx_probe_fn)(void *arg, int rank);

void nrs_ucx_opts_init(nrs_ucx_opts_t *o);

int nrs_ucx_init(nrs_ucx_t **out, int rank, int size, const nrs_ucx_opts_t *o, char *err,
                 size_t errlen);
/* Close endpoints and worker. Call nrs_ucx_disconnect first (and a fence
 * after it) for a quiet exit. */
void nrs_ucx_fini(nrs_ucx_t *u);

int nrs_ucx_rank(const nrs_ucx_t *u);
int nrs_ucx_size(const nrs_ucx_t *u);

/* This worker's address, to publish through the rendezvous. Owned by u. */
void nrs_ucx_address(const nrs_ucx_t *u, const void **addr, size_t *len);

/* Endpoints to every rank from their addresses (addrs[rank], lens[rank]). */
/* The world grew to size ranks (at most 4x the first size + 64): ranks from the
 * old size on have no endpoint until nrs_ucx_connect. */
int nrs_ucx_grow(nrs_ucx_t *u, int size, char *err, size_t errlen);
/* A rank with no address (gone before it could give one): failed, never connected. */
void nrs_ucx_mark_failed(nrs_ucx_t *u, int rank);
int nrs_ucx_connect(nrs_ucx_t *u, void *const *addrs, const size_t *lens, char *err,
                    size_t errlen);

/* Flush and close every endpoint (bounded by timeout_s, then forced). An op
 * posted to a rank afterwards fails without touching UCX's endpoint. */
void nrs_ucx_disconnect(nrs_ucx_t *u, double timeout_s);

void nrs_ucx_set_probe(nrs_ucx_t *u, nrs_ucx_probe_fn fn, void *arg);

/* Post a message; buf must stay valid until the op completes or is freed
 * (an op freed while UCX still runs one of its requests — a rendezvous send
 * its peer never matched cannot be cancelled — uses buf until that request
 * ends or nrs_ucx_fini; a buffer of the caller's own for the op can be handed
 * over with nrs_ucx_op_adopt). tag < 2^32. 0 and *op on success; -1 with err. */
int nrs_ucx_isend(nrs_ucx_t *u, int peer, const void *buf, size_t len, uint64_t tag,
                  nrs_ucx_op_t **op, char *err, size_t errlen);
int nrs_ucx_irecv(nrs_ucx_t *u, int peer, void *buf, size_t len, uint64_t tag,
                  nrs_ucx_op_t **op, char *err, size_t errlen);

/* 1 done, 0 pending, -1 failed (nrs_ucx_op_error says why). Does not progress. */
int nrs_ucx_test(const nrs_ucx_op_t *op);
const char *nrs_ucx_op_error(const nrs_ucx_op_t *op);
/* Cancel if still pending, release. Requests UCX cannot cancel are kept
 * (with the op's buffer, see nrs_ucx_op_adopt) until they end, and handed
 * back to UCX (ucp_request_free) before endpoints and worker go. */
void nrs_ucx_op_free(nrs_ucx_op_t *op);
/* mem (malloc'd; e.g. a bounce buffer the op sends from or receives into) is
 * freed with the op: when it is freed and UCX is done with its requests, at
 * the latest in nrs_ucx_fini after the worker is destroyed. */
void nrs_ucx_op_adopt(nrs_ucx_op_t *op, void *mem);
/* The same for n ops at once, waiting at most 0.5 s in all (ops[i] set NULL). */
void nrs_ucx_op_free_many(nrs_ucx_op_t **ops, size_t n);
/* free(p) of memory [p, p + len) that ops used: at once, or, while a request
 * UCX could not cancel still reads or writes it (a rendezvous whose peer
 * stopped answering, past op_free's bound), once that request ends, at the
 * latest in nrs_ucx_fini after the worker is destroyed. u NULL: free(p). */
void nrs_ucx_free(nrs_ucx_t *u, void *p, size_t len);

/* Drop the messages that arrived under tag (the bits of mask: the message
 * tag's, from any sender) and were never received: an aborted run's sends
 * its peers no longer wanted, which would otherwise match a later run's
 * receives of the same tag. The count. */
size_t nrs_ucx_purge(nrs_ucx_t *u, uint64_t tag, uint64_t mask);

/* Progress until every op is done or one failed; frees them all.
 * 0, or -1 with the first failure in err. */
int nrs_ucx_waitall(nrs_ucx_t *u, nrs_ucx_op_t **ops, size_t n, char *err, size_t errlen);

/* Advance the worker (up to 64 rounds while it finds work, none after a
 * request of ours ended) and every posted op: the count of events, or -1 when
 * some op has failed since the last call. Signature of nrs_rdv_progress_fn. */
int nrs_ucx_progress(void *u);

/* For wait loops, after nrs_ucx_progress returned events: true = poll again
 * at once (something happened, or an op was posted, less than spin_s ago, or
 * less than the largest chunk in flight takes at 1 GB/s: UCX reports nothing
 * in the middle of a rendezvous; when more ranks of this host than CPUs share
 * this rank's CPUs, only spin_s, and it has called sched_yield, so a peer
 * waiting for this core goes first — ranks bound to a core each share
 * nothing), false = idle that long or no op posted: nap before polling again. A nap costs its timer slack (~50 us
 * on Linux) on top, and on a busy host the CPU until the scheduler gives it
 * back: a 1 MiB message over shared memory takes ~70 us, so naps between the
 * events of a transfer in flight used to halve its throughput. */
bool nrs_ucx_spin(nrs_ucx_t *u, int events);

bool nrs_ucx_peer_failed(const nrs_ucx_t *u, int rank);
/* The same, for a caller whose transfers do not go through UCX (the NCCL
 * transport): first looks (at most every 10 ms) for what UCX progress would
 * find, endpoint errors and vanished processes on this host. */
bool nrs_ucx_check_peer(nrs_ucx_t *u, int rank);

/* Completion hook (used by the executor adapter): called once when op ends. */
void nrs_ucx_op_on_done(nrs_ucx_op_t *op, void (*fn)(void *arg, int status), void *arg);

#endif
