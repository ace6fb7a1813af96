/* The executor's transport interface (runtime/emu/xport.h) over UCX: each
 * rank drives its own side of every transfer. Memory is host memory
 * (malloc); owners (physical GPU ids, or -1 - node for a node's host memory)
 * map to ranks through owner_rank. Strided regions travel packed in a bounce
 * buffer; the xport tag (the op index) is the UCX message tag.
 */
#ifndef NRS_XFER_XPORT_UCX_H
#define NRS_XFER_XPORT_UCX_H

#include "emu/xport.h"
#include "xfer/ucx.h"

/* u must outlive the transport, or the transport be detached from it
 * (nrs_xport_ucx_detach) before nrs_ucx_fini; nrs_xport_close releases what
 * it posted. mem_free keeps memory a request UCX could not cancel still uses
 * until that request ends (nrs_ucx_free). */
int nrs_xport_ucx_open(nrs_xport_t *x, nrs_ucx_t *u, nrs_owner_rank_fn owner_rank, void *arg);

/* The first transport error since open ("" if none). */
const char *nrs_xport_ucx_error(const nrs_xport_t *x);

/* Drop every posted send and receive (cancelled in UCX) and clear the error:
 * what an aborted transition calls before the next one. */
void nrs_xport_ucx_cancel(nrs_xport_t *x);

/* Release what is posted and stop using u (nrs_ucx_fini comes next): mem_free
 * frees at once afterwards, what UCX still used went with nrs_ucx_fini. */
void nrs_xport_ucx_detach(nrs_xport_t *x);

/* Drop the messages that came under (xport tag & mask) and no receive took
 * (nrs_ucx_purge): what an aborted run's sends left at this rank. */
size_t nrs_xport_ucx_purge(nrs_xport_t *x, uint64_t tag, uint64_t mask);

#endif
