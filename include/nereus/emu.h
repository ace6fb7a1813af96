/* Nereus EMUs and transitions (docs/transitions.md).
 *
 * An EMU (Elastic Model Unit) is one data-parallel replica of one model-stage:
 * its ordered GPUs and, per rank, the boxes of global tensor coordinates it
 * holds. A transition turns the EMUs of one plan into those of another; its
 * graph is a pure function of (old plan, new plan, spec, options): every rank
 * and the controller build the same one.
 *
 * Ownership: a graph is owned by the caller and released with
 * nrs_emu_graph_free(). Options borrow their arrays for the duration of a call.
 */
#ifndef NEREUS_EMU_H
#define NEREUS_EMU_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "nereus/plan.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What a box of state holds. Grads have the weights' boxes; master and Adam
 * moments are fp32 and split over dp when runtime.zero1. */
typedef enum {
    NRS_EMU_WEIGHT,
    NRS_EMU_GRAD,
    NRS_EMU_MASTER,
    NRS_EMU_ADAM_M,
    NRS_EMU_ADAM_V,
    NRS_EMU_KIND_COUNT
} nrs_emu_kind_t;

/* Link classes bytes travel on. */
typedef enum {
    NRS_LINK_LOCAL, /* copy inside one GPU (HBM) */
    NRS_LINK_INTRA, /* GPU to GPU inside a node (NVLink) */
    NRS_LINK_INTER, /* across nodes (NIC) */
    NRS_LINK_HOST,  /* GPU <-> host memory staging (PCIe) */
    NRS_LINK_COUNT
} nrs_link_t;

enum {
    NRS_EMU_ELOST = -2 /* state lost on every replica: a checkpoint is needed */
};

typedef struct {
    int64_t chunk_bytes; /* transfer chunk, same on every rank; 0 = 16 MiB */
    int64_t cap_bytes;   /* per-GPU memory cap; 0 = gpu_mem_gib - mem_headroom_gib */
    const int *gpu_map;  /* new plan's GPU i -> physical GPU id (the old plan's
                          * numbering); NULL = identity */
    int ngpu_map;
    const int *lost;     /* physical GPUs (old numbering) whose state is gone */
    int nlost;
    /* old buffers (state order) whose contents are gone though their GPU lives:
     * a state left partial past a point of no return; NULL = none */
    const unsigned char *missing;
    size_t nmissing;
} nrs_emu_opts_t;

typedef struct nrs_emu_graph nrs_emu_graph_t;

typedef struct {
    int64_t bytes[NRS_LINK_COUNT]; /* payload per link class */
    int64_t nops, ntransfers, nchunks, ncomms, nstaged;
    double makespan_s;    /* scheduled on the spec's bandwidths */
    double lower_bound_s; /* max over links of bytes / bandwidth */
    int64_t ponr;         /* index of the point-of-no-return op; nops if none */
    double ponr_s;        /* its start time */
    int64_t cap_bytes;    /* per-GPU cap the schedule kept */
    int64_t peak_bytes;   /* the largest per-GPU peak */
    int peak_gpu;
    int ngpus;            /* physical GPUs the graph spans */
    int nlost;            /* lost boxes (NRS_EMU_ELOST) */
    uint64_t hash;        /* xxHash of the canonical serialization */
} nrs_emu_stats_t;

void nrs_emu_opts_init(nrs_emu_opts_t *o);

/* Graph of the transition from plan `from` to plan `to`, scheduled.
 * 0 on success; NRS_EMU_ELOST when some state survives nowhere (*out is set:
 * nrs_emu_graph_print_lost lists the boxes); -1 with err otherwise. */
int nrs_emu_transition(const nrs_spec_t *s, const nrs_plan_t *from, const nrs_plan_t *to,
                       const nrs_emu_opts_t *o, nrs_emu_graph_t **out, char *err,
                       size_t errlen);

/* The per-step weight sync of the actor: actor.train weights -> actor.generate. */
int nrs_emu_weight_sync(const nrs_spec_t *s, const nrs_plan_t *p, const nrs_emu_opts_t *o,
                        nrs_emu_graph_t **out, char *err, size_t errlen);

void nrs_emu_graph_free(nrs_emu_graph_t *g);
void nrs_emu_graph_stats(const nrs_emu_graph_t *g, nrs_emu_stats_t *st);
int64_t nrs_emu_graph_peak(const nrs_emu_graph_t *g, int gpu);
void nrs_emu_graph_print_lost(const nrs_emu_graph_t *g, FILE *out);
/* The same, one line per (model, kind): boxes, bytes, and which layers and
 * global tensors, for people. */
void nrs_emu_graph_print_lost_summary(const nrs_emu_graph_t *g, FILE *out);

/* What `nereus transition` prints: bytes per link class, peak memory per GPU
 * against the cap, makespan against the lower bound, the point of no return;
 * with execute, runs the transition in-process on the model scaled down by
 * runtime.emulation_scale and verifies every shard's checksum.
 * 0 on success (and, with execute, 0 mismatches); -1 with err otherwise. */
int nrs_transition_summary(const nrs_spec_t *s, const nrs_plan_t *from, const nrs_plan_t *to,
                           FILE *out, bool execute, char *err, size_t errlen);

/* Same with options (lost GPUs, GPU map, cap, chunk); o may be NULL. */
int nrs_transition_summary_opts(const nrs_spec_t *s, const nrs_plan_t *from,
                                const nrs_plan_t *to, const nrs_emu_opts_t *o, FILE *out,
                                bool execute, char *err, size_t errlen);

/* The spec with every model scaled down for an in-process run: head dim,
 * ffn and vocab divided by round(1/sqrt(scale)) (at least 1 each), layers and
 * heads kept so every layout stays valid. */
void nrs_emu_scale_spec(const nrs_spec_t *s, double scale, nrs_spec_t *out);

#ifdef __cplusplus
}
#endif
#endif
