/* runtime/worker: what the files of the worker API (include/nereus/nereus.h)
 * share: the handle, and the helpers one file defines for the others. Not
 * installed; runtime/ctl's hooks are in worker.h. The files: worker.c (errors,
 * init, accessors, finalize), worker_state.c (the plan's state, its buffers,
 * reports), worker_trans.c (transitions, checkpoints), worker_ctl.c (the
 * control channel, its collectives, a growing world), worker_sync.c (the step
 * boundary, the per-step weight sync). */
#ifndef NRS_WORKER_WORKER_INT_H
#define NRS_WORKER_WORKER_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ctl/proto.h"
#include "emu/geometry.h"
#include "emu/graph.h"
#include "emu/xport.h"
#include "rdv/rdv.h"
#include "worker/dtrans.h"
#include "worker/worker.h"
#include "xfer/ucx.h"

struct nrs_worker {
    nrs_spec_t spec;
    nrs_rdv_t *r;
    nrs_ucx_t *u;
    nrs_xport_t x;
    int xport_ucx;
    int me, n;
    double timeout_s;
    nrs_plan_t plan;
    int have_plan, broken;
    nrs_emu_state_t st; /* the current plan's state, every rank's buffers */
    nrs_xmem_t *mem;    /* [st.nbuf]: this rank's (host) memory, ptr NULL elsewhere */
    void **dev;         /* [st.nbuf]: CUDA copies when mem_kind == NRS_MEM_CUDA */
    int *mine;          /* indices into st.buf of this rank's buffers */
    int nmine;
    int mem_kind, allocated;
    int cuda_dev;       /* the CUDA device this rank's state lives on */
    unsigned attempt;
    nrs_dtrans_result_t last;
    int have_last;
    /* reports */
    nrs_worker_report_t rep;
    nrs_report_fn sink;
    void *sink_arg;
    nrs_worker_report_hook_fn hook;
    void *hook_arg;
    int ctl_fd; /* control channel to nereus-controller, -1 if none */
    char ctl_err[384];
    int *perm;  /* [n]: perm[g] = rank holding GPU g of the current plan (g < total_gpus),
                 * then the ranks holding nothing, in order */
    int my_gpu; /* this rank's GPU in the current plan, -1: none */
    uint8_t *cbuf;          /* a frame from the controller */
    /* a GATHER to the controller: had with the channel, so that no gather
     * needs memory of its own (a rank that could not send its part left the
     * others waiting for it; nrs_wk_ctl_gather) */
    struct nrs_wk_gsend *gsend;
    nrs_msg_plan_t *pend;   /* PLAN(TRANSITION) waiting for its PREPARE */
    int have_pend, retired, ponr_acked;
    unsigned ctl_epoch;     /* epoch of the transition being run for the controller */
    /* the per-step weight sync of the current epoch (nrs_emu_weight_sync) */
    nrs_emu_graph_t *sg;    /* its graph, built once per epoch */
    int *stmap;             /* [sg->nold]: train weight -> index into st.buf */
    int *sgidx;             /* [sg->nnew]: generation buffer -> index into st.buf (kept in
                             * place on a train buffer, or persistent on its own pool), -1 */
    nrs_xmem_t *sgmem;      /* [sg->nnew]: generation buffers the sync allocated (sgidx -1) */
    int synced;             /* the generation buffers hold this epoch's sync */
    unsigned sync_n, agree_n, sync_sample;
    long long sync_steps, sync_failed, sync_bytes, sync_last_bytes, sync_sampled, sync_verified;
    long long sync_no_vote; /* syncs with nothing to move (NRS_SS_NO_VOTE) */
    double sync_last_s, sync_total_s;
    int defer;              /* control frames: keep a PREPARE for the step's agreement */
    unsigned prep_epoch;    /* the PREPARE kept, 0: none */
    unsigned aborted_epoch; /* the newest epoch the controller aborted */
    int run_aborted;        /* the controller aborted the transition running now */
    int running;            /* a controller-driven transition runs (nrs_wk_ctl_prepare) */
    unsigned char *leaving; /* [n]: ranks that said at a step boundary they are retired */
    unsigned char *gone;    /* [n]: ranks of the plan whose agreement value never came (dead) */
    unsigned char *waiting; /* [n]: joiners of the world without a GPU yet: the GPUs a
                             * plan adds go to them, in world-rank order, as the
                             * controller places them (docs/protocol.md §Joins) */
    unsigned char *dead;    /* [n]: ranks out of the job for good (lost GPUs of a committed
                             * epoch, or gone): never waited for again */
    int coll_ctl;           /* collectives through the controller's GATHER, not PMIx fences */
    char *ckpt_dir;         /* checkpoints (ckpt.h), NULL: none */
    int joiner;             /* this rank came with a join step (NEREUS_JOIN) */
    unsigned world_gen;     /* generations of the world this rank is in */
    nrs_msg_world_t *world_pend; /* a WORLD read, kept for the step agreement */
    int join_step;          /* joiner: the job's step when it joined; -1 */
    unsigned agreed_world;  /* the newest world generation a rank of the plan has */
    unsigned world_dropped; /* the newest generation the ranks agreed without its WORLD
                             * on every rank (none switched): its WORLD is stale */
    void *agree_mem;        /* the step agreement's memory, had with the world (n ranks):
                             * no agreement needs memory of its own (nrs_wk_agree_mem) */
    int last_step;          /* the last step reported */
    int job_step;           /* the job's step at the last commit (ranks holding GPUs); -1 */
    long restored_step;     /* the last transition restored this step's checkpoint; -1 */
    unsigned char *present; /* broken: [st.nbuf] 1 = complete on some survivor (census) */
    struct nrs_wk_nccl *nccl; /* worker_nccl.c: the NCCL transport of GPU state, NULL */
    char err[640];
    int init_rc;            /* nrs_worker_init's failure, 0: none (nrs_wk_unusable) */
    char init_err[640];
};

/* worker.c */
/* Sets the message of w (NULL: this thread's, last_error(NULL)); returns rc. */
int nrs_wk_seterr(const nrs_worker_t *w, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* NRS_ERR_INVAL for call fn given a NULL handle. */
int nrs_wk_nohandle(const char *fn);
/* NRS_ERR_RETIRED for call fn once the controller retired this rank. */
int nrs_wk_retired_err(nrs_worker_t *w, const char *fn);
/* The rank that holds GPU owner of the current plan (arg: the handle); -1: none. */
int nrs_wk_owner_rank(void *arg, int owner);
/* The same under GPU order perm (NULL: rank r holds GPU r), for an order not
 * yet the handle's. */
int nrs_wk_rank_under(const nrs_worker_t *w, const int *perm, int owner);
/* The identity map: rank r holds GPU r (w->perm, w->my_gpu). */
void nrs_wk_perm_identity(nrs_worker_t *w);
/* $name as a number in [lo, hi], else dflt (a value set but not such a
 * number is said on stderr, once a name). */
double nrs_wk_env_double(const char *name, double dflt, double lo, double hi);
/* The executor options every distributed run of this rank shares. */
void nrs_wk_dtrans_opts(nrs_worker_t *w, nrs_dtrans_opts_t *o);
/* runtime.verify: transfers are checksummed (a worker without a spec: off);
 * $NRS_WORKER_VERIFY=0|1 overrides it. */
bool nrs_wk_verify_on(const nrs_worker_t *w);
/* 0, or NRS_ERR_INVAL for a NULL handle (nrs_wk_nohandle) or one whose init
 * failed (last error "fn: nrs_worker_init failed: ..."): such a handle takes
 * only last_error, finalize and the queries of what it is (rank, size,
 * is_singleton, transport, control). */
int nrs_wk_unusable(const nrs_worker_t *w, const char *fn);
/* nrs_wk_unusable, then NRS_ERR_RETIRED once the controller retired the rank:
 * the entry check of every call that acts (a retired rank has only finalize
 * and the queries left). */
int nrs_wk_cannot_act(nrs_worker_t *w, const char *fn);
/* The rendezvous that names this job's ranks in failure reports (NULL: a joiner). */
nrs_rdv_t *nrs_wk_job_rdv(const nrs_worker_t *w);
/* Test hook NRS_WORKER_NOMEM=RANK:POINT:N: true when this rank is RANK and
 * the memory at point (docs/worker-api.md names them) cannot be had in its
 * Nth occasion n (a transition attempt, a world generation, a checkpoint's
 * step). The tests' check that such a rank still takes part in every
 * collective. */
bool nrs_wk_nomem(const nrs_worker_t *w, const char *point, long long n);

/* worker_state.c */
/* Frees the current epoch's weight sync (its graph and generation buffers). */
void nrs_wk_sync_free(nrs_worker_t *w);
/* The same, and the epoch's counts of syncs and step agreements and its
 * leaving and gone ranks: only when the epoch changes. */
void nrs_wk_sync_reset(nrs_worker_t *w);
/* Frees the current plan's state and buffers (the sync's too). */
void nrs_wk_free_state(nrs_worker_t *w);
/* The rank that holds buffer b. */
int nrs_wk_buf_rank(const nrs_worker_t *w, const nrs_emu_buf_t *b);
/* Builds the current plan's state and finds this rank's buffers. */
int nrs_wk_index_state(nrs_worker_t *w);
/* A plan's state index (its buffers, which are this rank's, room for their
 * memory), built aside: installed only once complete. */
typedef struct {
    nrs_emu_state_t st;
    nrs_xmem_t *mem;
    void **dev;
    int *mine;
    int nmine;
} nrs_wk_index_t;
/* Plan p's index under GPU order perm (NULL: the identity) into ix: 0, or
 * NRS_ERR_PLAN / NRS_ERR_NOMEM with why (ix empty). */
int nrs_wk_index_build(const nrs_worker_t *w, const nrs_plan_t *p, const int *perm,
                       nrs_wk_index_t *ix, char *why, size_t whylen);
void nrs_wk_index_free(nrs_wk_index_t *ix);
/* A transition in which nothing moves (g: no op, every new buffer an old
 * one kept in place, on the same rank): ix (built for the new plan) takes
 * the current buffers, host and device, new buffer j the old one it keeps,
 * and becomes the handle's state in place of the current one (the epoch's
 * sync and counters reset as nrs_wk_free_state does). It cannot fail. */
void nrs_wk_index_keep(nrs_worker_t *w, nrs_wk_index_t *ix, const nrs_emu_graph_t *g);
/* Frees the buffers nm[0, n) that a transition's new state brought and the
 * handle did not take (a failure past the point of no return): device
 * memory (dev: the NCCL path, whose transport may be gone) with CUDA, host
 * memory through the handle's transport. */
void nrs_wk_free_new(nrs_worker_t *w, nrs_xmem_t *nm, size_t n, bool dev);
/* 0 if plan p fits this job, else the error. */
int nrs_wk_plan_ok(nrs_worker_t *w, const nrs_plan_t *p);
/* CUDA state: copies to the host buffers (dir 'd') or back to the device ('h'). */
int nrs_wk_sync_host(nrs_worker_t *w, char dir);
/* Writes the counts v, m where the caller gave a pointer. */
void nrs_wk_counts(long long *verified, long long *mismatches, long long v, long long m);

/* worker_trans.c */
/* A transition to next (a resize: gpu_map, lost; ctl: the controller runs its PONR). */
int nrs_wk_do_transition(nrs_worker_t *w, const nrs_plan_t *next, const int *gpu_map,
                         const int *lost, int nlost, int ctl);

/* worker_ctl.c */
/* Sends a step's report to the controller, if there is a channel. */
void nrs_wk_ctl_report(nrs_worker_t *w, const nrs_worker_report_t *r);
/* One frame within timeout_s: 1 (in *h, w->cbuf), 0 on time-out, -1 channel gone. */
int nrs_wk_ctl_recv(nrs_worker_t *w, double timeout_s, nrs_hdr_t *h);
/* A controller-driven transition's point of no return: ACK, wait for COMMIT. */
int nrs_wk_ctl_ponr(void *arg, char *why, size_t whylen);
/* Runs the transition the pending PLAN announced, on its PREPARE(epoch). */
int nrs_wk_ctl_prepare(nrs_worker_t *w, unsigned epoch);
/* ACK(epoch, phase, status, seconds) to the controller (a failed send closes
 * the channel). */
void nrs_wk_ctl_ack(nrs_worker_t *w, unsigned epoch, unsigned phase, int status, double seconds);
/* Handles one frame from the controller (PLAN, PREPARE, WORLD, ERROR). */
int nrs_wk_ctl_frame(nrs_worker_t *w, const nrs_hdr_t *h);
/* The channel's buffers (the frame read, the GATHER sent), had before HELLO:
 * 0, or -1 out of memory. */
int nrs_wk_ctl_buffers(nrs_worker_t *w);
/* nrs_rdv_gather over the control channel (arg: the handle). all and got
 * NULL: only contribute, without waiting for the answer (a rank without the
 * memory for it still takes part); it needs no memory of its own. */
int nrs_wk_ctl_gather(void *arg, uint64_t key, const char *name, const void *mine, size_t len,
                      const int *out, int nout, void *all, unsigned char *got, double timeout_s,
                      char *err, size_t errlen);
/* The step boundaries' gather: the controller's or PMIx's (all and got NULL:
 * only contribute, as nrs_wk_ctl_gather). */
int nrs_wk_coll_gather(nrs_worker_t *w, uint64_t key, const char *name, const void *mine,
                       size_t len, const int *out, int nout, void *all, unsigned char *got,
                       char *err, size_t errlen);
/* One int32 per participant through nrs_wk_coll_gather, reduced alike on
 * every rank: NRS_WK_MAX the largest that came (-1: none, or the gather
 * failed), NRS_WK_ALL 1 when every participant's came and is nonzero, else 0.
 * Without the memory for the answer a rank still contributes (0 for ALL:
 * every rank gets 0; its own value for MAX: -1 here). */
enum { NRS_WK_MAX, NRS_WK_ALL };
int32_t nrs_wk_coll_i32(nrs_worker_t *w, uint64_t key, const char *name, int32_t mine,
                        const int *out, int nout, int op);
/* Switches to the world m describes (every rank, the joiners too). */
int nrs_wk_world_switch(nrs_worker_t *w, const nrs_msg_world_t *m);
/* A joiner's init: HELLO, wait for its world, join it, take the committed plan. */
int nrs_wk_join_world(nrs_worker_t *w);

/* worker_sync.c */
/* The current plan's ranks in part that have not said they leave; how many. */
int nrs_wk_plan_ranks(const nrs_worker_t *w, int *part);
/* The ranks left out of a collective of part[0, np) (in[r] = 1: a participant); how many. */
int nrs_wk_plan_outsiders(const nrs_worker_t *w, const int *part, int np, bool skip_gone,
                          unsigned char *in, int *out);
/* 1 if a rank of the plan is retired or dead. */
int nrs_wk_someone_leaving(const nrs_worker_t *w);
/* The step agreement's memory for a world of n ranks (w->agree_mem): 0, or -1
 * out of memory. */
int nrs_wk_agree_mem(nrs_worker_t *w, int n);
/* The step agreement's part, out and in arrays (in zeroed), for a collective
 * of the plan's ranks outside an agreement (a checkpoint's vote): memory
 * had with the world, so that no rank leaves such a vote for want of it. */
void nrs_wk_plan_arrays(const nrs_worker_t *w, int **part, int **out, unsigned char **in);

/* worker_nccl.c (GPU state over NCCL; without HAVE_NCCL these say no) */
/* The participants' choice for graph g (every rank not in out[nout] calls
 * it, with the same arguments): 1 when the transition moves GPU state over
 * NCCL (the communicator and its transport ready), 0 when it stages through
 * host memory. A failed set-up falls back (0) and stays off for the job. */
int nrs_wk_nccl_choose(nrs_worker_t *w, const nrs_emu_graph_t *g, uint64_t key, const int *out,
                       int nout);
/* The NCCL transport (after a choice of 1). */
const nrs_xport_t *nrs_wk_nccl_xport(const nrs_worker_t *w);
/* The executor options that differ over NCCL: cancel, errors, peer watch. */
void nrs_wk_nccl_opts(nrs_worker_t *w, nrs_dtrans_opts_t *o);
/* Before a transition over NCCL: every connection it needs, set up at once. */
void nrs_wk_nccl_preconnect(nrs_worker_t *w, const nrs_emu_graph_t *g);
/* After a transition over NCCL: a commit frees what waited to be freed;
 * anything else drops the communicator (and the transport). */
void nrs_wk_nccl_after(nrs_worker_t *w, int outcome);
/* m: device memory dev of bytes on GPU owner, as the NCCL transport holds it. */
void nrs_wk_nccl_wrap(nrs_xmem_t *m, void *dev, int owner, size_t bytes);
/* Frees the communicator and the transport (finalize). */
void nrs_wk_nccl_free(nrs_worker_t *w);

#endif
