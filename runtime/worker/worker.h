/* runtime/worker: the worker side of libnereus (include/nereus/nereus.h).
 * Internal hooks for the control channel (runtime/ctl) live here. */
#ifndef NRS_WORKER_WORKER_H
#define NRS_WORKER_WORKER_H

#include <stdint.h>

#include "nereus/nereus.h"

/* One report, in the fields of the controller's REPORT message
 * (runtime/ctl/proto.h nrs_msg_report_t): the wiring point of the control
 * channel. runtime/ctl sets a hook that encodes it (nrs_enc_report) and
 * writes it to $NEREUS_SOCKET; the JSON sink of nereus.h is called too. */
typedef struct {
    int rank;
    uint32_t epoch, step, flags; /* flags: 1 memory high, 2 allocation failed */
    double response_len;
    int nstages;
    uint8_t ms[NRS_MS_COUNT];
    double seconds[NRS_MS_COUNT];
    long long mem_used, mem_cap;
} nrs_worker_report_t;

typedef void (*nrs_worker_report_hook_fn)(void *arg, const nrs_worker_report_t *r);
void nrs_worker_set_report_hook(nrs_worker_t *w, nrs_worker_report_hook_fn fn, void *arg);

/* ---- the per-step weight sync (docs/worker-api.md §5); not in nereus.h yet ---- */
/* The step boundary, collective over the ranks of the current plan: reads the
 * control channel, agrees with the others on a pending PREPARE and runs it on
 * all of them (a rank that has not read it yet waits for it). Returns as
 * nrs_worker_control_poll. Use it, not control_poll, between steps when the
 * step has other collectives (nrs_worker_weight_sync). */
int nrs_worker_control_step(nrs_worker_t *w);

/* The actor's per-step weight sync (nrs_emu_weight_sync) of the current plan,
 * run with the distributed executor: actor.train's weights stay, the
 * generation engine's weight buffers are (re)written; collective over the
 * ranks of the plan. Then one generation shard of this rank is checked.
 * NRS_OK, NRS_ERR_ABORTED (the sync failed; the training state is intact),
 * NRS_ERR_VERIFY, NRS_ERR_PLAN (the plan has no actor.train/actor.generate). */
int nrs_worker_weight_sync(nrs_worker_t *w);

/* Fields of nrs_worker_sync_stat. */
enum {
    NRS_SS_STEPS = 0,      /* syncs run (committed) */
    NRS_SS_FAILED = 1,     /* syncs that failed */
    NRS_SS_BYTES = 2,      /* bytes this rank received, all syncs */
    NRS_SS_LAST_S = 3,     /* seconds of the last sync */
    NRS_SS_LAST_BYTES = 4, /* bytes this rank received, last sync */
    NRS_SS_TOTAL_S = 5,    /* seconds, all syncs */
    NRS_SS_SAMPLED = 6     /* generation shards checked after syncs */
};
double nrs_worker_sync_stat(const nrs_worker_t *w, int which);

/* Checks every generation weight shard this rank holds (after the last sync)
 * against the pattern. NRS_OK, NRS_ERR_VERIFY, NRS_ERR_INVAL (no sync since
 * the last epoch change: nothing to check). */
int nrs_worker_verify_generation(nrs_worker_t *w, long long *verified, long long *mismatches);

#endif
