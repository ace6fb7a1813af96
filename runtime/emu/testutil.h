/* Random specs and plans for the EMU tests and bench (tiny dims); the code is
 * tests/unit/test_emu_util.c, linked only into tests and bench, never the library. */
#ifndef NRS_EMU_TESTUTIL_H
#define NRS_EMU_TESTUTIL_H

#include <stdint.h>

#include "nereus/emu.h"

typedef struct {
    uint64_t s;
} tu_rng_t;

uint64_t tu_next(tu_rng_t *r);
int tu_int(tu_rng_t *r, int lo, int hi); /* inclusive */

/* A spec with tiny random models (actor always; critic, ref, reward maybe),
 * gpus_per_node from {1, 2, 4, 8}, fixed bandwidths, memory unbounded. */
void tu_spec(nrs_spec_t *s, tu_rng_t *r);

/* A fixed model for targeted tests. */
void tu_model(nrs_model_t *m, int layers, int hidden, int ffn, int heads, int kv, int vocab);
void tu_spec_fixed(nrs_spec_t *s, const nrs_model_t *actor, int gpn);

/* Random valid layout of model m on at most gpus GPUs. */
void tu_layout(const nrs_model_t *m, tu_rng_t *r, int gpus, nrs_layout_t *l);

/* Random valid plan on total GPUs: contiguous pools, random layouts. */
void tu_plan(const nrs_spec_t *s, tu_rng_t *r, int total, nrs_plan_t *p);

/* One pool of total GPUs, every model-stage with layout l (actor only). */
void tu_plan_single(const nrs_spec_t *s, int total, const nrs_layout_t *l, nrs_plan_t *p);

/* Two inference-only models of the same size on two pools of 4 GPUs (a),
 * swapped (b): every receiver must first send, so a cap that holds only the
 * larger of each GPU's old and new state forces host staging. */
void tu_plan_swap(nrs_spec_t *s, nrs_plan_t *a, nrs_plan_t *b);

/* The largest state one GPU of g holds before (its surviving old buffers) or
 * after (its new ones) the transition: the least cap under which only host
 * staging, not the state itself, can be short. */
int64_t tu_state_need(const nrs_emu_graph_t *g);

/* Build, execute with the local transport, return 0 when everything checks. */
int tu_run(const nrs_spec_t *s, const nrs_plan_t *a, const nrs_plan_t *b, const nrs_emu_opts_t *o,
           int64_t stop_after, char *err, size_t errlen);

#endif
