/* libnereus worker API: what a training process (rank) of a Nereus job calls
 * (docs/worker-api.md).
 *
 * One opaque handle per process. Every function returns NRS_OK (0) or a
 * negative NRS_ERR_* code; nrs_worker_strerror names the code and
 * nrs_worker_last_error says what happened (ranks, ops, bytes): every call
 * that fails sets it (a bad argument or a call out of order: naming the
 * call and the reason), so it never shows an older call's. Arguments are
 * plain ints, long longs, doubles, char* and pointers to them, so the API
 * is usable through ctypes/cffi; the four calls that take Nereus structs
 * (nrs_worker_init_spec, nrs_worker_set_plan, nrs_worker_transition,
 * nrs_worker_plan) take them by pointer. Not thread-safe: one thread
 * drives a handle.
 *
 * A NULL handle is refused by every call, never dereferenced: the call
 * returns its failure value (NRS_ERR_INVAL for codes and counts, -1 for
 * rank, size, epoch, GPU and step numbers, 0 for flags and figures but
 * nrs_worker_transition_stat's as before any transition, a fixed string for
 * strings; nrs_worker_finalize(NULL) is NRS_OK) and
 * nrs_worker_last_error(NULL) says which call. Output pointers may be NULL
 * where a call says so.
 *
 * Life of a rank:
 *   nrs_worker_init(_emulated)   PMIx (or singleton), rendezvous, transports
 *   nrs_worker_set_plan          the current plan (epoch N), or from the
 *   nrs_worker_control_plan        controller
 *   nrs_worker_alloc_state       the EMU state this rank holds under it
 *   nrs_worker_role / _group     what this rank is in the plan
 *   per step: train; nrs_worker_report_* ; the step boundary
 *     (nrs_worker_control_step, or nrs_worker_control_poll without other
 *     per-step collectives: a new epoch is taken there); the actor's
 *     nrs_worker_weight_sync (train -> generate)
 *   nrs_worker_finalize
 *
 * Stability: functions are only added; NRS_WORKER_API_VERSION grows when
 * they are. Codes keep their values.
 */
#ifndef NEREUS_NEREUS_H
#define NEREUS_NEREUS_H

#include "nereus/plan.h"
#include "nereus/spec.h"

#ifdef __cplusplus
extern "C" {
#endif

#define NRS_WORKER_API_VERSION 9

typedef struct nrs_worker nrs_worker_t;

enum {
    NRS_OK = 0,
    NRS_ERR_INVAL = -1,       /* bad argument, or call out of order */
    NRS_ERR_NOMEM = -2,
    NRS_ERR_SPEC = -3,        /* the job spec could not be loaded */
    NRS_ERR_RDV = -4,         /* rendezvous (PMIx) failed or timed out */
    NRS_ERR_XPORT = -5,       /* transport set-up failed */
    NRS_ERR_PLAN = -6,        /* no plan, or a plan this job cannot take */
    NRS_ERR_ABORTED = -7,     /* transition aborted before its point of no return:
                               * the old epoch is intact and current */
    NRS_ERR_PARTIAL = -8,     /* transition failed past its point of no return:
                               * nrs_worker_last_error says what is present,
                               * rebuildable or lost; only finalize is allowed */
    NRS_ERR_VERIFY = -9,      /* a checksum did not match */
    NRS_ERR_UNSUPPORTED = -10, /* not built in (e.g. CUDA memory without CUDA) */
    NRS_ERR_RETIRED = -11,    /* the controller retired this rank (its node left the
                               * job) or refused it: only finalize is allowed (API 2) */
    NRS_ERR_CHECKPOINT = -12  /* a checkpoint could not be written or read (API 3) */
};

/* Memory the state lives in. AUTO: CUDA when built with CUDA and a GPU is
 * visible, else host (nrs_worker_last_error then says why). */
enum { NRS_MEM_AUTO = 0, NRS_MEM_HOST = 1, NRS_MEM_CUDA = 2 };

/* Communicator groups of a model-stage. */
enum { NRS_GROUP_TP = 0, NRS_GROUP_PP = 1, NRS_GROUP_DP = 2 };

/* Fields of nrs_worker_transition_stats, by index. */
enum {
    NRS_TS_SECONDS = 0,     /* wall time of the last transition on this rank */
    NRS_TS_PREPARE_S = 1,
    NRS_TS_EXECUTE_S = 2,   /* ops before the point of no return */
    NRS_TS_VOTE_S = 3,
    NRS_TS_COMMIT_S = 4,
    NRS_TS_BYTES_SENT = 5,
    NRS_TS_BYTES_RECV = 6,
    NRS_TS_TRANSFERS = 7,
    NRS_TS_MAX_INFLIGHT = 8,
    NRS_TS_FAILED_RANK = 9, /* the first rank seen dead, -1 if none (or no transition yet) */
    NRS_TS_PRESENT = 10,    /* after NRS_ERR_PARTIAL: new-state buffers present, */
    NRS_TS_REBUILDABLE = 11,/*   rebuildable from survivors, */
    NRS_TS_LOST = 12,       /*   lost (a checkpoint is needed) */
    NRS_TS_RESTORED_STEP = 13, /* the state was restored from the checkpoint of this
                                * step (-1: not a restore; API 3) */
    NRS_TS_BYTES_VERIFIED = 14, /* (API 6) bytes this rank hashed, sent and received
                                 * (runtime.verify; 0 when off) */
    NRS_TS_COUNT = 15
};

int nrs_worker_api_version(void);
const char *nrs_worker_strerror(int rc);

/* spec_path: the job's YAML (NULL: $NEREUS_SPEC; still NULL: NRS_ERR_SPEC).
 * Joins the job: PMIx_Init (no server = singleton, rank 0 of 1), UCX worker
 * addresses exchanged under epoch-tagged keys when there are several ranks
 * (UCX_TLS, UCX_NET_DEVICES are UCX's own variables). The state is the
 * spec's models at full size. On failure *out may still be set: read
 * nrs_worker_last_error(*out) (or, after finalizing it,
 * nrs_worker_last_error(NULL)), then finalize it. out NULL: NRS_ERR_INVAL. */
int nrs_worker_init(nrs_worker_t **out, const char *spec_path);
/* The same with a spec already in memory (copied; NULL: an empty spec). */
int nrs_worker_init_spec(nrs_worker_t **out, const nrs_spec_t *spec);
/* The same as nrs_worker_init with the spec scaled down by its
 * runtime.emulation_scale (nrs_emu_scale_spec), as nereus-worker does: the
 * EMU state and every transition and weight-sync graph are those of the
 * scaled spec. Every rank of a job must take the same one (a rank of
 * nrs_worker_init and one of this build different graphs, whose hashes then
 * fail to match); use it for ranks that share a job with nereus-worker
 * (API 4). */
int nrs_worker_init_emulated(nrs_worker_t **out, const char *spec_path);
/* Leaves the job (survivors' fence, bounded), frees everything, also when
 * it fails (NRS_ERR_RDV: the fence did not complete; the message is then
 * kept for nrs_worker_last_error(NULL)). NULL is fine (NRS_OK). */
int nrs_worker_finalize(nrs_worker_t *w);

/* What the last call that failed on w said ("" if none; a warning of a call
 * that succeeded, e.g. alloc_state's "state in host memory: ..."). With
 * NULL: the message of the last call of this thread that failed without a
 * handle to keep it: nrs_worker_init* (kept there as well when it returned
 * a handle), nrs_worker_finalize (the handle is gone), or a call passed a
 * NULL handle; "" if none (API 4). Valid until the next call. */
const char *nrs_worker_last_error(const nrs_worker_t *w);
int nrs_worker_rank(const nrs_worker_t *w);           /* -1: NULL handle */
int nrs_worker_size(const nrs_worker_t *w);           /* -1: NULL handle */
int nrs_worker_is_singleton(const nrs_worker_t *w);   /* 1 or 0 (also for NULL) */
const char *nrs_worker_transport(const nrs_worker_t *w); /* "ucx" or "local"; "none": NULL */
/* Control channel: "connected", "none" (no $NEREUS_SOCKET_DIR / $NEREUS_JOB_DIR),
 * or why it failed ("no handle": NULL). */
const char *nrs_worker_control(const nrs_worker_t *w);

/* ---- the plan and this rank's place in it -------------------------------- */

/* The current plan (the first one, or one the controller sends for an epoch
 * this rank missed). Rank r is GPU r of the plan. Frees any state held. */
int nrs_worker_set_plan(nrs_worker_t *w, const nrs_plan_t *plan);
/* Epoch of the current plan; -1 before any (and for NULL). */
int nrs_worker_epoch(const nrs_worker_t *w);
/* Model-stages this rank runs in the current plan (NRS_ERR_INVAL for NULL),
 * and for the i-th: the model-stage (nrs_ms_t), the layout, and this rank's
 * coordinates (NRS_ERR_INVAL when i is not below nrs_worker_nroles). Any of
 * the output pointers may be NULL (not written). */
int nrs_worker_nroles(const nrs_worker_t *w);
int nrs_worker_role(const nrs_worker_t *w, int i, int *ms, int *tp, int *pp, int *dp, int *t,
                    int *p, int *d);
/* Ranks of this rank's tp, pp or dp group of model-stage ms, in group order:
 * the count (at most max written; ranks NULL or max 0: the count only), or
 * NRS_ERR_INVAL (no such group, or this rank does not run ms). */
int nrs_worker_group(const nrs_worker_t *w, int ms, int group, int *ranks, int max);
const char *nrs_worker_ms_name(int ms); /* "?" for an unknown ms */

/* ---- state ------------------------------------------------------------- */

/* Allocate the EMU state this rank holds under the current plan (weights;
 * for trained models also grads, fp32 master weights and Adam moments).
 * fill != 0 writes runtime/emu's deterministic pattern (tests, demos). */
int nrs_worker_alloc_state(nrs_worker_t *w, int mem, int fill);
/* NRS_MEM_HOST or NRS_MEM_CUDA; NRS_ERR_INVAL for NULL. */
int nrs_worker_mem_kind(const nrs_worker_t *w);
/* Buffers this rank holds (0 before alloc_state; NRS_ERR_INVAL for NULL). */
int nrs_worker_nbuffers(const nrs_worker_t *w);
/* Buffer i: its address (device memory under NRS_MEM_CUDA) and size. The
 * outputs of this and nrs_worker_buffer_desc may be NULL (not written). */
int nrs_worker_buffer(const nrs_worker_t *w, int i, void **ptr, long long *bytes);
/* What buffer i holds: role (nrs_role_t), tensor id, kind (nrs_emu_kind_t)
 * and its box [r0,r1) x [c0,c1) in global coordinates, element size; the
 * buffer is the box, row-major. Tensor ids: 0 embedding, 1 final norm, 2 lm
 * (or value) head; 3..9 the layer tensors qkv, o, gate, up, down, norm1,
 * norm2, each holding every layer stacked (docs/transitions.md §1): qkv, gate
 * and up put layer l in columns [l*hidden, (l+1)*hidden), o and down in rows
 * [l*hidden, (l+1)*hidden), the norms in row l. So one buffer holds a rank's
 * share of all the layers of its pipeline stage. */
int nrs_worker_buffer_desc(const nrs_worker_t *w, int i, int *role, int *tensor, int *kind,
                           int *r0, int *r1, int *c0, int *c1, int *esize);
/* Layer `layer`'s part of buffer i (a layer tensor), as a framework's
 * per-layer parameter sees it: rows x cols elements starting at *ptr, *pitch
 * bytes from row to row; (*r0, *c0) is where it sits in that layer's own
 * [out, in] weight. NRS_ERR_INVAL when the buffer holds none of that layer
 * (or holds a global tensor). API 5. Outputs may be NULL. */
int nrs_worker_buffer_layer(const nrs_worker_t *w, int i, int layer, void **ptr, int *rows,
                            int *cols, long long *pitch, int *r0, int *c0);
/* Checksum every buffer against the pattern (state filled with fill = 1):
 * NRS_OK, NRS_ERR_VERIFY (mismatches > 0), NRS_ERR_INVAL (no state). The
 * counts may be NULL. */
int nrs_worker_verify_state(const nrs_worker_t *w, long long *verified, long long *mismatches);

/* ---- reports (carried to the controller) -------------------------------- */

/* A sink receives each report as one JSON line (docs/worker-api.md §3).
 * Default: $NEREUS_REPORT_FILE (appended), else dropped. Independently, when
 * the control channel is connected, every report goes to the controller as
 * a REPORT frame (runtime/ctl/proto.h). */
typedef void (*nrs_report_fn)(void *arg, const char *json);
int nrs_worker_set_report_sink(nrs_worker_t *w, nrs_report_fn fn, void *arg);
/* seconds: >= 0, at most 1e6 for the stage in a step (NRS_ERR_INVAL otherwise;
 * a stage of under 1e-9 s is left out of the controller's REPORT). */
int nrs_worker_report_stage(nrs_worker_t *w, int ms, double seconds);
int nrs_worker_report_memory(nrs_worker_t *w, long long used_bytes, long long cap_bytes,
                             int alloc_failed);
/* Close step `step` (response_len: mean tokens, 0 unknown): sends one report
 * with what was recorded since the last one. A step not above the last one
 * (steps re-run after restoring a checkpoint) reaches the controller, which
 * ignores it as a measurement and keeps the channel. step 0..100000000,
 * response_len 0..1e7 (NRS_ERR_INVAL otherwise). Before any plan the report
 * goes to the sink only (the controller measures plans). */
int nrs_worker_report_step(nrs_worker_t *w, int step, double response_len);

/* ---- transitions ---------------------------------------------------------- */

/* Move this rank's state to plan next (next->epoch > the current epoch),
 * together with every other rank (a collective: all ranks call it with the
 * same plan). NRS_OK: committed, next is current. NRS_ERR_ABORTED: a rank
 * failed or died before the point of no return; every rank keeps the old
 * epoch intact. NRS_ERR_PARTIAL: failure past it (see nrs_worker_last_error).
 * Bounded: no wait longer than $NRS_WORKER_TIMEOUT seconds (default 30). */
int nrs_worker_transition(nrs_worker_t *w, const nrs_plan_t *next);
/* Figures of the last transition (NRS_TS_*): the value; before any
 * transition (and for NULL or an unknown field) 0, except NRS_TS_FAILED_RANK
 * and NRS_TS_RESTORED_STEP: -1. */
double nrs_worker_transition_stat(const nrs_worker_t *w, int which);

/* ---- checkpoints (API 3, docs/worker-api.md §6) ------------------------------ */

/* Where checkpoints go: a directory every rank can read and write (a shared
 * file system on a real cluster); NULL turns them off. Default
 * $NEREUS_CHECKPOINT_DIR. */
int nrs_worker_set_checkpoint_dir(nrs_worker_t *w, const char *dir);
/* A collective at a step boundary (every rank of the job, the same step):
 * write this rank's part of the state as the checkpoint of `step`, and once
 * every rank of the plan has, publish it. A transition whose state survives
 * nowhere (a node lost with every replica of some box) then restores the
 * new plan's state from the newest checkpoint instead of failing: the state
 * goes back to that step (nrs_worker_transition_stat NRS_TS_RESTORED_STEP).
 * NRS_OK, or NRS_ERR_CHECKPOINT (nothing published; the old one stays; a
 * publish that fails after every rank wrote is reported by the lowest rank
 * only, docs/worker-api.md §6). */
int nrs_worker_checkpoint(nrs_worker_t *w, long step);

/* ---- joining a running job (API 3, docs/worker-api.md §7) ------------------ */

/* A rank started with $NEREUS_JOIN=1 belongs to a join step: ranks launched
 * on nodes an expansion added (srun on the new nodes). nrs_worker_init then
 * connects to the job's controller as a joiner, waits until every rank of its
 * step has, joins the job's world (rank and size: nrs_worker_rank/size) and
 * takes the committed plan holding no GPU; the controller's next epoch gives
 * it GPUs (dp grows). This returns the step the job was at when it joined
 * (start the step loop there), -1 for a rank that started with the job
 * (and for NULL). */
int nrs_worker_joined_at(const nrs_worker_t *w);

/* (API 8) The job's step at the last transition of the controller this rank
 * committed: the last step (nrs_worker_report_step) of the ranks that held
 * GPUs before it, which run their steps in lockstep; -1 before the first
 * (and for NULL). A rank that held no GPU and got one (a joiner that waited
 * in line) continues its step loop after this step, as the others do. */
int nrs_worker_job_step(const nrs_worker_t *w);

/* ---- the controller drives the epochs (API 2, docs/worker-api.md §3) --------- */

/* Wait up to timeout_s for the controller's plan of the committed epoch (its
 * answer to HELLO) and take it as nrs_worker_set_plan does. NRS_ERR_INVAL
 * without a control channel (nrs_worker_control says why). */
int nrs_worker_control_plan(nrs_worker_t *w, double timeout_s);
/* Handle what the controller sent, waiting up to timeout_s for the first
 * frame (0: do not wait). When it announced a transition (PLAN + PREPARE),
 * run it as a collective (every rank does, at its next poll): build the graph
 * from the current plan with the PLAN's lost GPUs (survivors first), execute,
 * vote at the point of no return, ACK PREPARE, and on the controller's
 * COMMIT finish and ACK COMMIT (on ABORT keep the old epoch). Returns
 * NRS_OK (nothing to do), 1 (a transition committed: a new epoch, new GPU
 * index and state), NRS_ERR_ABORTED (old epoch intact), NRS_ERR_PARTIAL,
 * NRS_ERR_RETIRED, or another code. Call it once per step when the step has
 * no other collective; with the weight sync, nrs_worker_control_step. */
int nrs_worker_control_poll(nrs_worker_t *w, double timeout_s);
/* This rank's GPU index in the current plan (it moves when GPUs below it are
 * lost); -1 when it holds none (and for NULL). */
int nrs_worker_gpu(const nrs_worker_t *w);
/* A copy of the current plan (API 2); NRS_ERR_INVAL before any or out NULL. */
int nrs_worker_plan(const nrs_worker_t *w, nrs_plan_t *out);

/* ---- the step boundary and the actor's weight sync (API 4, docs/worker-api.md §5) ----
 *
 * An RLHF step ends with the actor's trained weights copied to its
 * generation engine (train -> generate), a collective. A transition must
 * then be taken by every rank at the same step: a rank that read the
 * controller's PREPARE one poll later than another would be in the next
 * sync while the other waits for it in the transition. So a job with the
 * weight sync ends every step on every rank with
 *     nrs_worker_report_step; nrs_worker_control_step; nrs_worker_weight_sync
 * (the same calls, the same number of times, on every rank of the job: both
 * are collectives whose keys count their calls within an epoch). After the
 * last step, follow the controller with nrs_worker_control_poll until it is
 * quiet (a transition decided on the last step is a collective too), then
 * nrs_worker_verify_generation.
 */

/* The step boundary, once per step on every rank: reads the control channel
 * without waiting, keeping a PREPARE; then the ranks of the current plan
 * agree (a gather through the controller, else PMIx) on the newest PREPARE
 * any of them holds, each waits (up to $NRS_WORKER_TIMEOUT) for that PREPARE
 * to reach it too, and all run the transition as nrs_worker_control_poll
 * would. A rank retired by the controller says so in the agreement (the
 * others stop waiting for it); a rank whose part never comes (dead) is left
 * out for the rest of the epoch. A rank holding no GPU of the plan (or
 * without state, or alone in the job) only polls: nothing to agree on.
 * Returns as nrs_worker_control_poll: NRS_OK (nothing to do), 1 (a
 * transition committed: new epoch, GPU index and state; rebuild your
 * communicators), NRS_ERR_ABORTED (the old epoch is intact and current,
 * also when the others agreed on a PREPARE that never reached this rank),
 * NRS_ERR_PARTIAL, NRS_ERR_RETIRED (only finalize is allowed), or another
 * code (NRS_ERR_RDV: the job's world could not grow). */
int nrs_worker_control_step(nrs_worker_t *w);

/* The actor's per-step weight sync (train -> generate) of the current plan:
 * actor.train's weights, which stay, are copied into actor.generate's
 * weight buffers in generate's layout (nrs_emu_weight_sync; no transfer at
 * all where the two layouts and pools are the same, and then, since API 9,
 * no collective either: every rank has the same plan), with the distributed
 * executor of the transitions. A collective over the ranks holding GPUs of
 * the plan, after nrs_worker_control_step each step; a rank holding none
 * returns NRS_OK at once. Afterwards one generation shard of this rank (a
 * different one each step) is checked against the pattern. NRS_OK;
 * NRS_ERR_ABORTED (the sync failed, e.g. a rank died or, under
 * runtime.verify, the bytes received differ from those sent; or it was
 * skipped since ranks of the plan are retired or dead: the training state is
 * intact and
 * the failure counted, NRS_SS_FAILED); NRS_ERR_VERIFY (the checked shard
 * does not match); NRS_ERR_PLAN (the plan has no actor.train and
 * actor.generate: nothing to sync); NRS_ERR_INVAL (no plan or no state). */
int nrs_worker_weight_sync(nrs_worker_t *w);

/* Fields of nrs_worker_sync_stat. */
enum {
    NRS_SS_STEPS = 0,      /* syncs run (committed) */
    NRS_SS_FAILED = 1,     /* syncs that failed */
    NRS_SS_BYTES = 2,      /* bytes this rank received, all syncs */
    NRS_SS_LAST_S = 3,     /* seconds of the last sync */
    NRS_SS_LAST_BYTES = 4, /* bytes this rank received, last sync */
    NRS_SS_TOTAL_S = 5,    /* seconds, all syncs */
    NRS_SS_SAMPLED = 6,    /* generation shards checked after syncs */
    NRS_SS_BYTES_VERIFIED = 7, /* (API 7) bytes this rank hashed, sent and
                                * received, all syncs (runtime.verify) */
    NRS_SS_NO_VOTE = 8 /* (API 9) syncs with nothing to move anywhere (generate's
                        * layout is train's): committed at once, without the
                        * graph's three votes; counted in NRS_SS_STEPS too */
};
/* Figures of the weight syncs on this rank (NRS_SS_*); 0 for NULL or an
 * unknown field. Local. */
double nrs_worker_sync_stat(const nrs_worker_t *w, int which);

/* Checksums every generation weight shard this rank holds (filled by the
 * last sync) against the pattern; local, not a collective. NRS_OK,
 * NRS_ERR_VERIFY (mismatches > 0), NRS_ERR_INVAL (no sync since the last
 * epoch change: nothing to check; sync first). The counts may be NULL. */
int nrs_worker_verify_generation(nrs_worker_t *w, long long *verified, long long *mismatches);

#ifdef __cplusplus
}
#endif
#endif
