/* The transport interface the transition executor drives. The local
 * transport (xport_local.c) copies between malloc'ed buffers in one process;
 * the UCX and NCCL transports implement the same table, each rank driving its
 * own ops. Memory is named by its owner: a physical GPU id >= 0, or -1 - node
 * for host memory of a node.
 *
 * Semantics: send and recv only post; a request is complete when progress()
 * has set req->done. A send and a recv match on (sender, receiver, tag); every
 * rank posts matching pairs in the same global order (the schedule), which is
 * what makes NCCL-style lockstep transports deadlock-free.
 */
#ifndef NRS_EMU_XPORT_H
#define NRS_EMU_XPORT_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    void *ptr;       /* local address (host memory, or device pointer) */
    int owner;       /* physical GPU, or -1 - node */
    size_t bytes;
    uint64_t handle; /* the transport's own (registration, memory handle) */
} nrs_xmem_t;

/* rows of row_bytes each, pitch bytes apart, from off. */
typedef struct {
    nrs_xmem_t *mem;
    size_t off, pitch, rows, row_bytes;
} nrs_xregion_t;

typedef struct {
    volatile int done;
    uint64_t id; /* the transport's */
} nrs_xreq_t;

typedef struct {
    const char *name;
    int (*mem_alloc)(void *ctx, int owner, size_t bytes, nrs_xmem_t *out);
    void (*mem_free)(void *ctx, nrs_xmem_t *m);
    /* Synchronous copy between memories of one rank (one GPU, or GPU<->host). */
    int (*copy)(void *ctx, const nrs_xregion_t *dst, const nrs_xregion_t *src);
    int (*send)(void *ctx, int peer, const nrs_xregion_t *src, uint64_t tag, nrs_xreq_t *req);
    int (*recv)(void *ctx, int peer, const nrs_xregion_t *dst, uint64_t tag, nrs_xreq_t *req);
    /* Advance posted requests; number completed, or -1 on a transport error. */
    int (*progress)(void *ctx);
    void (*destroy)(void *ctx);
    /* Zero a whole memory (it may be device memory); NULL: memset of ptr. */
    int (*mem_zero)(void *ctx, nrs_xmem_t *m);
} nrs_xport_ops_t;

typedef struct {
    const nrs_xport_ops_t *ops;
    void *ctx;
} nrs_xport_t;

/* owner -> rank, or -1 when no rank holds it (the distributed transports). */
typedef int (*nrs_owner_rank_fn)(void *arg, int owner);

/* In-process transport: every owner's memory in this process, memcpy. */
int nrs_xport_local_open(nrs_xport_t *x);
void nrs_xport_close(nrs_xport_t *x);

/* Whether region r has memory and lies inside it (zero rows: any memory). */
int nrs_xregion_ok(const nrs_xregion_t *r);

#endif
