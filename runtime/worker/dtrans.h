/* runtime/worker/dtrans: a distributed transition that commits or aborts
 * (docs/worker-api.md §4).
 *
 * Every rank builds the same graph (runtime/emu) and calls nrs_dtrans_run
 * with its own memory. The rank executes only its ops, in the global order,
 * with up to `window` transfers in flight (a buffer's free or read waits only
 * for the transfers that touch that buffer). Three phases:
 *
 *   prepare  the ranks compare graph hashes (rendezvous, epoch-tagged key);
 *   execute  ops before the point of no return (g->ponr), then a vote: every
 *            rank publishes its status and the survivors fence; any failure
 *            or missing vote aborts everywhere, the old state intact;
 *   commit   ops from the PONR on, then a second vote. A rank lost here
 *            leaves a partial state; the survivors exchange what they hold
 *            and report exactly which new-state boxes are present, which can
 *            be rebuilt (from a replica or from surviving sources) and which
 *            are lost (checkpoint needed).
 *
 * A dead peer is noticed by the transport (UCX error callback / pid watch)
 * or by the resource manager (PMIx event, nrs_rdv_peer_failed); every wait is
 * bounded by timeout_s.
 */
#ifndef NRS_WORKER_DTRANS_H
#define NRS_WORKER_DTRANS_H

#include <stdbool.h>
#include <stdint.h>

#include "emu/graph.h"
#include "emu/xport.h"
#include "rdv/rdv.h"

typedef enum {
    NRS_DT_COMMITTED = 0,
    NRS_DT_ABORTED = 1,     /* before the PONR: the old state is intact */
    NRS_DT_PARTIAL = 2,     /* past the PONR, a rank lost: see lost / rebuildable */
    NRS_DT_ERROR = -1       /* could not even start (bad arguments, out of memory) */
} nrs_dt_outcome_t;

typedef struct {
    int me, nranks;
    int (*owner_rank)(void *arg, int gpu); /* physical GPU -> rank; NULL: identity */
    void *owner_arg;
    int window;            /* transfers in flight; 0 = 32 */
    double timeout_s;      /* any wait: op stall, vote; 0 = 30 */
    int64_t kill_after;    /* test hook: SIGKILL self after this many own ops; -1 none;
                            * -2: right after the PONR vote passed */
    int kill_census;       /* test hook (PMIx gathers): this rank SIGKILLs itself once
                            * its census part is in, and the others read the census
                            * only once told of its death; -1 none */
    void (*cancel)(void *arg); /* drop the transport's posted ops (abort); may be NULL */
    void *cancel_arg;
    /* drop the messages that came under (tag & mask) and no receive took
     * (nrs_xport_ucx_purge): called with this run's tag bits
     * before its first vote, when no peer can have sent this run's messages
     * yet, so what is there is an aborted run's of the same tag (runs 128
     * apart share tags). May be NULL. */
    void (*purge)(void *arg, uint64_t tag, uint64_t mask);
    void *purge_arg;
    /* the transport's own view of a peer (e.g. nrs_ucx_peer_failed); may be NULL */
    bool (*peer_failed)(void *arg, int rank);
    void *peer_arg;
    const char *(*xport_error)(const nrs_xport_t *x); /* its last error; may be NULL */
    unsigned attempt;      /* the caller's count of runs, the same on every rank: keys
                            * of one run never match another's, nor tags of the 127
                            * runs before or after */
    bool sync_tags;        /* tags of their own (weight syncs), never a transition's */
    /* Ranks that take no part (their GPUs are lost: dead or retired): no op of
     * the graph is theirs, they are not waited for and do not vote. May be NULL. */
    const int *out_ranks;
    int nout;
    /* Called on every rank once the point-of-no-return vote has passed, before
     * any old buffer is freed: 0 goes on to the commit, anything else aborts
     * (old state intact; why[] says why). The control channel's PREPARE ACK and
     * the controller's COMMIT or ABORT happen here. May be NULL. With settle,
     * 1 says "undecided": the one who decides is gone (the controller died,
     * perhaps while it sent COMMIT). */
    int (*at_ponr)(void *arg, char *why, size_t whylen);
    void *ponr_arg;
    /* After at_ponr, every rank says what it got (commit, abort, undecided) in
     * one more gather: an undecided rank commits when some rank got the
     * commit, else it aborts, so the ranks never split over a decider that
     * died mid-way. Only for gathers that do not need the decider (gather
     * NULL: the PMIx rendezvous). */
    bool settle;
    /* The collective of the votes and the census (nrs_rdv_gather's contract,
     * and: all and got NULL, this rank only contributes, without waiting for
     * the answer; a rank without the memory for the answer still takes part):
     * NULL uses the PMIx rendezvous r; the worker passes the controller's
     * GATHER when it has a control channel. */
    int (*gather)(void *arg, uint64_t key, const char *name, const void *mine, size_t len,
                  const int *out, int nout, void *all, unsigned char *got, double timeout_s,
                  char *err, size_t errlen);
    void *gather_arg;
    /* NRS_DT_PARTIAL: filled with, per new-state buffer (g->nnew), 1 when some
     * survivor holds it complete (the census, the same on every rank). May be NULL. */
    unsigned char *present_out;
    /* Checksum every transfer (runtime.verify; host memory only): the sender
     * hashes what it sends, the receiver what it got, and the votes compare
     * the sums over all ranks. A mismatch before the point of no return
     * aborts; after it, the buffers written by transfers count as not held
     * in the census (rebuilt from survivors, or a checkpoint). */
    bool verify;
    int64_t corrupt_recv;  /* test hook: flip a byte of this rank's Nth received
                            * transfer as it arrives; -1 none */
    /* This rank failed on its own before the run (its memory could not be
     * staged, ...): it runs none of its ops but still takes part in the
     * run's first collective, the hash vote, saying no, so that every rank
     * aborts there alike (old state intact) and the collectives that follow
     * pair up; old_mem and new_mem may then be NULL. The same happens when
     * the run's own memory cannot be had (NRS_DT_ERROR on this rank). */
    bool fail_local;
    /* Test hook: this rank's memory at a named point cannot be had: "vote"
     * (the answers of the run's votes and settle, had as the run begins; the
     * rank then votes no without reading the answer), "census" (the census's,
     * had before its gather); NULL: none. */
    const char *nomem;
} nrs_dtrans_opts_t;

typedef struct {
    int outcome;           /* nrs_dt_outcome_t */
    int failed_rank;       /* first peer seen dead, -1 */
    int64_t my_ops, ops_done, ponr;
    int64_t xfers, bytes_sent, bytes_recv, max_inflight;
    int64_t bytes_verified; /* sent and received bytes hashed here (opts.verify) */
    bool no_vote;           /* a weight sync with nothing to move: committed, no vote */
    /* NRS_DT_PARTIAL: new-state buffers over all survivors */
    int64_t present, rebuildable, lost;
    double prepare_s, execute_s, vote_s, commit_s, total_s;
    char msg[512];
} nrs_dtrans_result_t;

void nrs_dtrans_opts_init(nrs_dtrans_opts_t *o, int me, int nranks);

/* opts.settle for a point of no return of the caller's own (a restore from a
 * checkpoint): every participant (o->out_ranks out) says what at_ponr gave it
 * (mine: 0 commit, 1 undecided, else abort) in the gather "dt<o->attempt>.settle"
 * over r; the decision, 0 or not, why[] saying how an undecided one was reached.
 * buf: NRS_DTRANS_SETTLE_BYTES(o->nranks) bytes for the answer, had before the
 * caller's own vote (a rank without them votes no there): an undecided rank
 * that could not read the others would abort while they commit. */
#define NRS_DTRANS_SETTLE_BYTES(nranks) (((size_t)(nranks) + 1) * (sizeof(int32_t) + 1))
int nrs_dtrans_settle(const nrs_dtrans_opts_t *o, nrs_rdv_t *r, uint64_t epoch, int mine,
                      void *buf, char *why, size_t whylen);

/* Run this rank's part of transition g to epoch `epoch`.
 * old_mem[g->nold]: this rank's old buffers (ptr NULL where not held here),
 * allocated with x's mem_alloc. new_mem[g->nnew]: zeroed by the caller.
 *   COMMITTED: new_mem holds this rank's new buffers (kept-in-place ones are
 *              moved from old_mem), old_mem is emptied (freed or moved). A
 *              weight sync (g->keep_old) keeps old_mem: a new buffer kept in
 *              place is then the same memory in both (g->buf[].alias).
 *   ABORTED:   new_mem is empty again, old_mem untouched.
 *   PARTIAL:   new_mem holds what this rank has of the new state (complete or
 *              not), old_mem what was not freed; res->present/rebuildable/lost.
 *   With opts.fail_local this rank votes no and returns ABORTED (the others
 *   abort too); a weight sync with nothing to move (no vote) returns ABORTED
 *   here and COMMITTED on the others, who moved nothing either.
 * Returns res->outcome. res->msg says what happened, naming ranks and ops. */
int nrs_dtrans_run(const nrs_emu_graph_t *g, uint64_t epoch, const nrs_xport_t *x, nrs_rdv_t *r,
                   nrs_xmem_t *old_mem, nrs_xmem_t *new_mem, const nrs_dtrans_opts_t *o,
                   nrs_dtrans_result_t *res);

/* The rank executing buffer id of g (its GPU's, or for host memory the GPU it
 * was staged from), -1 if none. */
int nrs_dtrans_buf_rank(const nrs_emu_graph_t *g, const nrs_dtrans_opts_t *o, int32_t id);

#endif
