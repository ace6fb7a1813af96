/* The executor's transport interface (runtime/emu/xport.h) over NCCL: GPU
 * memory moves GPU to GPU (docs/protocol-dataplane.md §3). Built with
 * HAVE_NCCL.
 *
 * NCCL has no tags: a send and a receive between two ranks match in the
 * order they are posted. The executor posts every rank's operations in the
 * graph's global order, so they match; the xport tag is not used. What was
 * posted goes out (once the stream has drained, or 16 wait) as groups
 * (ncclGroupStart / End) on the communicator's stream, each a run of the
 * posts with at most one transfer per peer and direction (NCCL progresses
 * those independently). Any such grouping of each rank's operations into
 * consecutive runs of the global order is free of deadlock: the globally
 * first unfinished transfer has every earlier operation of both of its
 * ranks done, so it is in the running group of both. That needs every
 * connection set up first (NCCL makes one at its first use and blocks
 * until the peer takes part): nrs_xport_nccl_preconnect. Device buffers
 * are freed only when nothing is posted (cudaFree synchronizes the device);
 * an allocation that comes after such a deferred free waits until the posts
 * drain and the free is done, as the schedule counted the freed bytes gone.
 * Strided regions are packed into (and unpacked from) device staging on the
 * same stream: one buffer for the sends and one for the receives, of a
 * chunk each, the transition's reserve (NRS_COST_RESERVE_BYTES); a group's
 * strided regions of one direction share its buffer, so a group holds at
 * most a chunk of them each way. Memory of a GPU owner is this rank's
 * device; host memory (owner < 0) can be allocated and copied but never
 * travels.
 */
#ifndef NRS_XFER_XPORT_NCCL_H
#define NRS_XFER_XPORT_NCCL_H

#include "emu/graph.h"
#include "emu/xport.h"
#include "xfer/nccl.h"

/* c: the communicator of the ranks taking part (it must outlive the
 * transport); comm_rank[r]: the communicator rank of executor rank r
 * (owner_rank's numbering), -1 for a rank not in it, for nranks ranks
 * (copied). timeout_s bounds the wait for an enqueue. */
int nrs_xport_nccl_open(nrs_xport_t *x, nrs_nccl_t *c, int device, nrs_owner_rank_fn owner_rank,
                        void *arg, const int *comm_rank, int nranks, double timeout_s);

/* m: the nrs_xmem_t of device memory allocated elsewhere (bytes at dev on
 * this rank's GPU), as this transport's mem_alloc would have made it, so
 * that the transport can move it and mem_free (cudaFree) free it. */
void nrs_xport_nccl_wrap(nrs_xmem_t *m, void *dev, int owner, size_t bytes);

/* Before a transition over this transport, on every rank of the
 * communicator (the same graph g): one byte each way with every rank this
 * one exchanges transfers with, in one group, waited for (timeout_s), so
 * that no connection is set up in the middle of the transfers; the staging
 * buffers take g's chunk as their size. 0, or -1 (the error in
 * nrs_xport_nccl_error; the communicator aborted on a time-out). */
int nrs_xport_nccl_preconnect(nrs_xport_t *x, const nrs_emu_graph_t *g, double timeout_s);

/* Frees the device buffers whose free waited for the posted transfers to
 * end, and the staging buffers, if none is posted now (the caller, after a
 * transition). */
void nrs_xport_nccl_release(nrs_xport_t *x);

/* The first transport error since open ("" if none). */
const char *nrs_xport_nccl_error(const nrs_xport_t *x);

/* Drop every posted transfer: the communicator is aborted (NCCL cannot
 * cancel one transfer), so the caller needs a new one for the next
 * transition. */
void nrs_xport_nccl_cancel(nrs_xport_t *x);

#endif
