/* In-process executor: runs a scheduled graph on real bytes through a
 * transport, tracking liveness and memory, and verifies every shard against
 * the pattern (docs/transitions.md §4). */
#ifndef NRS_EMU_EXEC_H
#define NRS_EMU_EXEC_H

#include <stdbool.h>
#include <stdint.h>

#include "emu/graph.h"
#include "emu/xport.h"

typedef struct {
    int64_t stop_after; /* run ops [0, stop_after) then abort; < 0: run all */
    bool no_poison;     /* new buffers are not poisoned first (benchmarks: a byte
                         * the graph never writes may then go unnoticed) */
} nrs_emu_exec_opts_t;

typedef struct {
    int64_t ops_done;
    bool aborted;
    int64_t verified;       /* shards whose checksum was compared */
    int64_t mismatches;     /* of those, wrong or missing */
    int64_t use_after_free; /* ops that touched a buffer not allocated (or allocated twice) */
    int64_t cap_violations; /* allocations that took a GPU over the cap */
    int64_t leaks;          /* buffers live at the end that the new state does not hold */
    int64_t xport_errors;
    int64_t peak_max;       /* largest per-GPU bytes seen, with the reserve */
    int64_t bytes_moved;    /* payload of the copies, transfers and stagings run */
    double run_s;           /* seconds running the ops (not filling, not verifying) */
    char first_error[256];
} nrs_emu_exec_result_t;

/* Fill old state, run, verify (the new state; after an abort, the old state),
 * release everything. 0 when everything checked out, -1 otherwise. */
int nrs_emu_execute(const nrs_emu_graph_t *g, const nrs_xport_t *x, const nrs_emu_exec_opts_t *o,
                    nrs_emu_exec_result_t *res);

#endif
