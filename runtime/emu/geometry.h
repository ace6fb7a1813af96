/* Shard geometry: the tensors of a model in global coordinates and the boxes
 * of them every rank of every EMU of a plan holds (docs/transitions.md §1). */
#ifndef NRS_EMU_GEOMETRY_H
#define NRS_EMU_GEOMETRY_H

#include <stddef.h>
#include <stdint.h>

#include "nereus/emu.h"

/* Global tensors first, then NRS_EMU_LT_COUNT layer tensors, each holding
 * every layer stacked (docs/transitions.md §1): column-parallel ones (qkv,
 * gate, up) put layer l in columns [l*hidden, (l+1)*hidden), row-parallel ones
 * (o, down) in rows [l*hidden, (l+1)*hidden), the norms in row l. So a rank's
 * share of a pipeline stage's layers is one box per tensor (or three: q|k|v). */
enum { NRS_EMU_T_EMBED, NRS_EMU_T_FINAL_NORM, NRS_EMU_T_HEAD, NRS_EMU_T_GLOBALS };
enum {
    NRS_EMU_LT_QKV,   /* [q | k | v] rows x hidden, column-parallel */
    NRS_EMU_LT_O,     /* hidden x q rows, row-parallel */
    NRS_EMU_LT_GATE,  /* ffn x hidden, column-parallel */
    NRS_EMU_LT_UP,    /* ffn x hidden, column-parallel */
    NRS_EMU_LT_DOWN,  /* hidden x ffn, row-parallel */
    NRS_EMU_LT_NORM1, /* 1 x hidden, replicated */
    NRS_EMU_LT_NORM2, /* 1 x hidden, replicated */
    NRS_EMU_LT_COUNT
};

/* A 2-D box [r0,r1) x [c0,c1) of a tensor's global (rows = out, cols = in). */
typedef struct {
    int32_t r0, r1, c0, c1;
} nrs_emu_rect_t;

/* One buffer of persistent state on one GPU: a box of one tensor, one kind. */
typedef struct {
    int32_t engine;  /* index into the state's engines */
    int32_t replica; /* dp index d */
    int32_t rank;    /* p*tp + t inside the replica */
    int32_t gpu;     /* physical GPU */
    int32_t set;     /* replica group sources are chosen among: d, or -1 when
                      * ZeRO-1 spreads the kind over every replica */
    int16_t role;
    uint8_t kind;    /* nrs_emu_kind_t */
    uint8_t esize;   /* bytes per element */
    int32_t tensor;
    nrs_emu_rect_t box;
    int64_t bytes;
} nrs_emu_buf_t;

/* A model-stage that holds state in a plan. */
typedef struct {
    int ms;           /* nrs_ms_t */
    int role;         /* nrs_role_t */
    nrs_layout_t lay;
    int first_gpu;    /* the pool's first GPU (plan numbering) */
    int trained;      /* holds grads, master weights and Adam moments */
} nrs_emu_engine_t;

typedef enum {
    NRS_EMU_SEL_PERSISTENT, /* every model's persistent state */
    NRS_EMU_SEL_ACTOR_TRAIN_W, /* actor.train weights only (sync source) */
    NRS_EMU_SEL_ACTOR_GEN_W    /* actor.generate weights (sync destination) */
} nrs_emu_sel_t;

typedef struct {
    int nengines;
    nrs_emu_engine_t eng[NRS_MS_COUNT];
    nrs_emu_buf_t *buf;
    size_t nbuf, cap;
    int max_gpu; /* largest physical GPU id used, -1 if none */
} nrs_emu_state_t;

/* Balanced split of n into k parts: part i starts at *start, has *len; the
 * first n % k parts get one more. */
void nrs_emu_split(int n, int k, int i, int *start, int *len);

int nrs_emu_tensor_count(const nrs_model_t *m);
/* Global shape; rows = 0 when the model has no such tensor (tied head). */
void nrs_emu_tensor_shape(const nrs_model_t *m, int t, int *rows, int *cols);
void nrs_emu_tensor_name(const nrs_model_t *m, int t, char *buf, size_t n);
const char *nrs_emu_kind_name(int kind);
/* Layers [*l0, *l1) a box of tensor t touches; both 0 for a global tensor. */
void nrs_emu_box_layers(const nrs_model_t *m, int t, const nrs_emu_rect_t *box, int *l0, int *l1);
/* The part of box (of layer tensor t) that holds layer l: *in in the stacked
 * tensor's coordinates, *local in layer l's own [out, in] ones. 1 when not
 * empty, else 0 (also for a global tensor). */
int nrs_emu_layer_part(const nrs_model_t *m, int t, const nrs_emu_rect_t *box, int l,
                       nrs_emu_rect_t *in, nrs_emu_rect_t *local);

/* 0 if layout l is valid for model m (tp | heads, kv heads split or replicated
 * evenly, 1 <= pp <= layers, layers * hidden <= NRS_MODEL_MAX_STACKED); -1
 * with the reason otherwise. */
int nrs_emu_layout_check(const nrs_model_t *m, const nrs_layout_t *l, char *err, size_t errlen);

/* Weight boxes of rank (p, t) in canonical order (tensor id, then q|k|v).
 * Writes at most max entries; returns the count. */
typedef struct {
    int32_t tensor;
    nrs_emu_rect_t box;
} nrs_emu_tbox_t;
int nrs_emu_rank_boxes(const nrs_model_t *m, int tp, int pp, int p, int t, nrs_emu_tbox_t *out,
                       int max);
int nrs_emu_rank_boxes_max(const nrs_model_t *m, int pp);

/* Build the state plan p holds (sel chooses which). gpu_map as in
 * nrs_emu_opts_t. 0, or -1 with err. */
int nrs_emu_state_build(const nrs_spec_t *s, const nrs_plan_t *p, nrs_emu_sel_t sel,
                        const int *gpu_map, int ngpu_map, nrs_emu_state_t *out, char *err,
                        size_t errlen);
void nrs_emu_state_free(nrs_emu_state_t *st);

static inline int64_t nrs_emu_rect_area(const nrs_emu_rect_t *r)
{
    if (r->r1 <= r->r0 || r->c1 <= r->c0)
        return 0;
    return (int64_t)(r->r1 - r->r0) * (r->c1 - r->c0);
}

/* Intersection of a and b into out; 1 when it is not empty. */
static inline int nrs_emu_rect_meet(const nrs_emu_rect_t *a, const nrs_emu_rect_t *b,
                                    nrs_emu_rect_t *out)
{
    out->r0 = a->r0 > b->r0 ? a->r0 : b->r0;
    out->r1 = a->r1 < b->r1 ? a->r1 : b->r1;
    out->c0 = a->c0 > b->c0 ? a->c0 : b->c0;
    out->c1 = a->c1 < b->c1 ? a->c1 : b->c1;
    return out->r0 < out->r1 && out->c0 < out->c1;
}

#endif
