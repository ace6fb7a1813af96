/* runtime/worker: the worker side of libnereus (include/nereus/nereus.h).
 * Internal hooks for the control channel (runtime/ctl) live here; what a
 * trainer calls (the step boundary and the weight sync too, API 4) is in
 * nereus.h. */
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

#endif
