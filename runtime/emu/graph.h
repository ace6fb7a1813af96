/* The transition graph: buffers, region moves chosen among replicas, chunked
 * operations, and (after nrs_emu_schedule) their timeline
 * (docs/transitions.md §2-3). */
#ifndef NRS_EMU_GRAPH_H
#define NRS_EMU_GRAPH_H

#include <stddef.h>
#include <stdint.h>

#include "emu/geometry.h"
#include "util/util.h"

typedef enum {
    NRS_EMU_OP_ALLOC, /* dst_buf on dst_gpu; grads are zero-filled */
    NRS_EMU_OP_FREE,  /* src_buf on src_gpu */
    NRS_EMU_OP_COPY,  /* same GPU */
    NRS_EMU_OP_XFER,  /* send on src_gpu + recv on dst_gpu (host staging: gpu < 0) */
    NRS_EMU_OP_STAGE, /* copy a whole GPU buffer to host memory of its node */
    NRS_EMU_OP_COMM,  /* communicator set-up: src_buf = engine (-1: transition
                       * world), dst_buf = group kind, rows = members */
    NRS_EMU_OP_COUNT
} nrs_emu_op_type_t;

enum { NRS_EMU_COMM_WORLD, NRS_EMU_COMM_TP, NRS_EMU_COMM_PP, NRS_EMU_COMM_DP };

/* Resources a transfer occupies, per physical GPU. */
enum {
    NRS_EMU_RES_HBM,
    NRS_EMU_RES_INTRA_TX,
    NRS_EMU_RES_INTRA_RX,
    NRS_EMU_RES_INTER_TX,
    NRS_EMU_RES_INTER_RX,
    NRS_EMU_RES_D2H,
    NRS_EMU_RES_H2D,
    NRS_EMU_RES_KINDS
};

enum { NRS_EMU_ORIGIN_OLD, NRS_EMU_ORIGIN_NEW, NRS_EMU_ORIGIN_HOST };

/* Phases of nrs_emu_graph_make, timed (seconds in phase_s). */
enum {
    NRS_EMU_PH_STATES,   /* both plans' boxes */
    NRS_EMU_PH_BUFFERS,  /* graph buffers and the ones kept in place */
    NRS_EMU_PH_SOURCES,  /* a source for every region */
    NRS_EMU_PH_CHUNKS,   /* moves cut into chunks, the lower bound */
    NRS_EMU_PH_SCHEDULE, /* the timeline */
    NRS_EMU_PHASES
};

/* Buffers: old state [0, nold), new state [nold, nold + nnew), host staging after. */
typedef struct {
    nrs_emu_buf_t b; /* b.gpu: physical GPU; host buffers: -1 - node */
    int32_t alias;   /* new buffer kept in place: id of the old buffer it is; else -1 */
    int32_t via;     /* host buffer: the GPU it was staged from (its PCIe and NIC) */
    int8_t origin;
    int8_t lost;     /* old buffer on a lost GPU */
} nrs_emu_gbuf_t;

/* One region of a destination buffer and the source buffer it comes from. */
typedef struct {
    int32_t src, dst;
    nrs_emu_rect_t box;
} nrs_emu_move_t;

typedef struct {
    uint8_t type, link; /* nrs_emu_op_type_t, nrs_link_t */
    int32_t src_buf, dst_buf;
    int32_t src_gpu, dst_gpu;
    int32_t rows;       /* rows of row_bytes, at src_pitch / dst_pitch */
    int32_t move;       /* move it belongs to; -1 */
    int64_t src_off, dst_off, src_pitch, dst_pitch, row_bytes;
    int64_t start, end; /* picoseconds, after scheduling */
} nrs_emu_op_t;

typedef struct {
    int32_t role, tensor, kind;
    nrs_emu_rect_t box;
} nrs_emu_lost_t;

/* The most chunks a graph may have: op, move and read counts are 32-bit,
 * and the schedule adds an alloc and a free per buffer to its chunks. */
#define NRS_EMU_MAX_CHUNKS ((int64_t)1 << 30)

/* A move cut into chunks of at most g->chunk bytes, the same on every rank.
 * Chunks are computed (nrs_emu_chunk), not stored. */
typedef struct {
    nrs_emu_op_t op; /* the whole move: rows of row_bytes (one row when contiguous) */
    int64_t per;     /* whole rows per chunk; 0: rows longer than a chunk, in pieces */
    int64_t npr;     /* pieces per row (per == 0) */
    uint32_t n;      /* chunks */
} nrs_emu_mchunk_t;

struct nrs_emu_graph {
    nrs_model_t models[NRS_ROLE_COUNT];
    int gpn, nphys, nnodes;
    int64_t cap, reserve, chunk;
    double bw[NRS_EMU_RES_KINDS]; /* bytes per picosecond */
    int keep_old;                 /* old buffers stay (weight sync) */
    nrs_emu_state_t from, to;     /* engines and buffers of both plans */

    nrs_emu_gbuf_t *buf;
    size_t nbuf, bufcap;
    int32_t nold, nnew;
    nrs_emu_move_t *moves;
    size_t nmoves, movecap;
    nrs_emu_mchunk_t *mch; /* [nmoves]: how each move is cut, scheduler input */
    size_t nchunks;        /* chunks of every move */
    nrs_emu_op_t *ops;    /* scheduled, in execution order */
    size_t nops, opcap;
    nrs_emu_lost_t *lost;
    size_t nlost, lostcap;

    int64_t *peak;      /* per physical GPU, with the reserve */
    int64_t *host_peak; /* per node */
    int64_t link_bytes[NRS_LINK_COUNT];
    int64_t makespan, lower_bound; /* picoseconds */
    int64_t ponr; /* first op that destroys old state; nops if none */
    int64_t nstaged, ncomms;
    double phase_s[NRS_EMU_PHASES]; /* where building it went (bench_graph) */
};

/* Node of a GPU (or of a host buffer's gpu field). */
int nrs_emu_node_of(const nrs_emu_graph_t *g, int gpu);

/* Resources (r[1] = -1 when one) and link class of a transfer from src_gpu
 * to dst_gpu; via = the staging GPU when src_gpu is host memory. */
int nrs_emu_resources(const nrs_emu_graph_t *g, int src_gpu, int dst_gpu, int via, int r[2]);
/* Picoseconds bytes take on resource res (at least 1). Times are integers so
 * that sums, and every decision made on them, are exact and the same on every
 * machine: one IEEE division per duration, no accumulated rounding. */
int64_t nrs_emu_duration(const nrs_emu_graph_t *g, int res, int64_t bytes);

/* The last duration computed per resource kind: consecutive chunks of a move
 * mostly have the same size, so most calls skip the division and rounding.
 * Initialize with nrs_emu_dmemo_init; the values are nrs_emu_duration's. */
typedef struct {
    int64_t bytes[NRS_EMU_RES_KINDS], ps[NRS_EMU_RES_KINDS];
} nrs_emu_dmemo_t;

static inline void nrs_emu_dmemo_init(nrs_emu_dmemo_t *m)
{
    for (int k = 0; k < NRS_EMU_RES_KINDS; k++)
        m->bytes[k] = -1;
}

static inline int64_t nrs_emu_duration_m(const nrs_emu_graph_t *g, nrs_emu_dmemo_t *m, int res,
                                         int64_t bytes)
{
    int k = res % NRS_EMU_RES_KINDS;
    if (m->bytes[k] != bytes) {
        m->bytes[k] = bytes;
        m->ps[k] = nrs_emu_duration(g, k, bytes);
    }
    return m->ps[k];
}

/* Build buffers, moves (sources balanced over replicas) and chunks.
 * 0, NRS_EMU_ELOST (g->lost filled), or -1 with err. */
int nrs_emu_graph_build(nrs_emu_graph_t *g, const nrs_spec_t *s, const nrs_emu_opts_t *o,
                        char *err, size_t errlen);

/* Chunk c of move mi (c < g->mch[mi].n). */
void nrs_emu_chunk(const nrs_emu_graph_t *g, size_t mi, size_t c, nrs_emu_op_t *out);
/* Picoseconds chunks [from, n) of move mi take on resource res, each
 * rounded as nrs_emu_duration rounds it. */
int64_t nrs_emu_chunks_ps(const nrs_emu_graph_t *g, nrs_emu_dmemo_t *m, size_t mi, size_t from,
                          int res);

int nrs_emu_push_op(nrs_emu_graph_t *g, const nrs_emu_op_t *op);
int nrs_emu_push_buf(nrs_emu_graph_t *g, const nrs_emu_gbuf_t *b);

/* The buffer an id denotes (kept new buffers resolve to their old one). */
static inline int32_t nrs_emu_canon(const nrs_emu_graph_t *g, int32_t id)
{
    return g->buf[id].alias >= 0 ? g->buf[id].alias : id;
}

/* The rank (physical GPU) that executes side 0 (source) or 1 (destination)
 * of op; host memory belongs to the GPU that staged it; -1 for none (COMM,
 * which every member of the group runs at the same position). */
int nrs_emu_op_rank(const nrs_emu_graph_t *g, const nrs_emu_op_t *op, int side);

/* Indices of the ops rank gpu executes, in order; writes at most max, returns
 * the count. Each rank filters the one global order, so the two sides of
 * every transfer are posted in the same relative order on both ranks. */
size_t nrs_emu_rank_ops(const nrs_emu_graph_t *g, int gpu, size_t *idx, size_t max);

/* Order the ops into a timeline under the memory cap (sched.c). 0 or -1 with err. */
int nrs_emu_schedule(nrs_emu_graph_t *g, char *err, size_t errlen);

/* xxHash of the canonical serialization of buffers and scheduled ops. */
uint64_t nrs_emu_graph_hash(const nrs_emu_graph_t *g);

/* A graph for (from, to), scheduled: the common path of the public calls. */
int nrs_emu_graph_make(const nrs_spec_t *s, const nrs_plan_t *from, nrs_emu_sel_t from_sel,
                       const nrs_plan_t *to, nrs_emu_sel_t to_sel, const nrs_emu_opts_t *o,
                       nrs_emu_graph_t **out, char *err, size_t errlen);

#endif
