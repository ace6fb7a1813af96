/* In-process executor (docs/transitions.md §4). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "emu/exec.h"
#include "util/util.h"
#include "emu/pattern.h"

enum { MAX_SPINS = 1 << 20 };

typedef struct {
    const nrs_emu_graph_t *g;
    const nrs_xport_t *x;
    nrs_xmem_t *mem;
    unsigned char *live;
    int64_t *used;
    unsigned char *scratch;
    nrs_emu_exec_result_t *res;
    bool no_poison;
} ex_t;

static void note(ex_t *E, int64_t *counter, const char *fmt, ...)
{
    (*counter)++;
    if (E->res->first_error[0])
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(E->res->first_error, sizeof(E->res->first_error), fmt, ap);
    va_end(ap);
}

static int owner_of(const nrs_emu_graph_t *g, int32_t id)
{
    return g->buf[id].b.gpu;
}

static void ex_alloc(ex_t *E, int32_t id, int fill)
{
    const nrs_emu_graph_t *g = E->g;
    const nrs_emu_buf_t *b = &g->buf[id].b;
    int owner = owner_of(g, id);

    if (E->live[id]) {
        note(E, &E->res->use_after_free, "buffer %d allocated twice", id);
        return;
    }
    if (E->x->ops->mem_alloc(E->x->ctx, owner, (size_t)b->bytes, &E->mem[id])) {
        note(E, &E->res->xport_errors, "alloc of %lld bytes failed", (long long)b->bytes);
        return;
    }
    E->live[id] = 1;
    if (fill == 1)
        nrs_emu_pattern_fill(b, E->mem[id].ptr);
    else if (b->kind == NRS_EMU_GRAD || !E->no_poison) /* grads start at zero; */
        memset(E->mem[id].ptr, b->kind == NRS_EMU_GRAD ? 0 : 0xa5, (size_t)b->bytes);
    /* anything else is poison until written */
    if (owner < 0)
        return;
    E->used[owner] += b->bytes;
    if (E->used[owner] + g->reserve > E->res->peak_max)
        E->res->peak_max = E->used[owner] + g->reserve;
    if (E->used[owner] + g->reserve > g->cap)
        note(E, &E->res->cap_violations, "GPU %d at %lld bytes, over the cap %lld", owner,
             (long long)(E->used[owner] + g->reserve), (long long)g->cap);
}

static void ex_free(ex_t *E, int32_t id)
{
    if (!E->live[id]) {
        note(E, &E->res->use_after_free, "buffer %d freed while not allocated", id);
        return;
    }
    E->x->ops->mem_free(E->x->ctx, &E->mem[id]);
    E->live[id] = 0;
    if (owner_of(E->g, id) >= 0)
        E->used[owner_of(E->g, id)] -= E->g->buf[id].b.bytes;
}

static int both_live(ex_t *E, const nrs_emu_op_t *op, size_t i)
{
    if (E->live[op->src_buf] && E->live[op->dst_buf])
        return 1;
    note(E, &E->res->use_after_free, "op %zu reads buffer %d / writes %d: not allocated", i,
         op->src_buf, op->dst_buf);
    return 0;
}

static void regions(ex_t *E, const nrs_emu_op_t *op, nrs_xregion_t *src, nrs_xregion_t *dst)
{
    *src = (nrs_xregion_t){&E->mem[op->src_buf], (size_t)op->src_off, (size_t)op->src_pitch,
                           (size_t)op->rows, (size_t)op->row_bytes};
    *dst = (nrs_xregion_t){&E->mem[op->dst_buf], (size_t)op->dst_off, (size_t)op->dst_pitch,
                           (size_t)op->rows, (size_t)op->row_bytes};
}

static void ex_xfer(ex_t *E, const nrs_emu_op_t *op, size_t i)
{
    const nrs_xport_ops_t *X = E->x->ops;
    nrs_xregion_t src, dst;
    nrs_xreq_t rs = {0}, rr = {0};
    int spins = 0;

    regions(E, op, &src, &dst);
    if (X->recv(E->x->ctx, op->src_gpu, &dst, (uint64_t)i, &rr) ||
        X->send(E->x->ctx, op->dst_gpu, &src, (uint64_t)i, &rs)) {
        note(E, &E->res->xport_errors, "op %zu: post failed", i);
        return;
    }
    while (!(rs.done && rr.done) && spins++ < MAX_SPINS)
        if (X->progress(E->x->ctx) < 0) {
            note(E, &E->res->xport_errors, "op %zu: transport error", i);
            return;
        }
    if (!(rs.done && rr.done))
        note(E, &E->res->xport_errors, "op %zu: never completed", i);
}

static void ex_op(ex_t *E, const nrs_emu_op_t *op, size_t i)
{
    nrs_xregion_t src, dst;
    switch (op->type) {
    case NRS_EMU_OP_ALLOC: ex_alloc(E, op->dst_buf, 0); break;
    case NRS_EMU_OP_FREE: ex_free(E, op->src_buf); break;
    case NRS_EMU_OP_STAGE:
        ex_alloc(E, op->dst_buf, 2);
        /* fall through */
    case NRS_EMU_OP_COPY:
        if (!both_live(E, op, i))
            break;
        regions(E, op, &src, &dst);
        if (E->x->ops->copy(E->x->ctx, &dst, &src))
            note(E, &E->res->xport_errors, "op %zu: copy out of bounds", i);
        break;
    case NRS_EMU_OP_XFER:
        if (both_live(E, op, i))
            ex_xfer(E, op, i);
        break;
    default: break; /* communicator set-up: nothing to do in one process */
    }
}

static void check_buf(ex_t *E, int32_t live_id, const nrs_emu_buf_t *want)
{
    E->res->verified++;
    if (!E->live[live_id]) {
        note(E, &E->res->mismatches, "shard %d missing", live_id);
        return;
    }
    uint64_t have = nrs_emu_checksum(E->mem[live_id].ptr, (size_t)want->bytes);
    if (have != nrs_emu_pattern_checksum(want, E->scratch)) {
        char name[64];
        nrs_emu_tensor_name(&E->g->models[want->role], want->tensor, name, sizeof(name));
        note(E, &E->res->mismatches, "GPU %d %s.%s %s rows [%d,%d) cols [%d,%d): checksum",
             want->gpu, nrs_role_name(want->role), name, nrs_emu_kind_name(want->kind),
             want->box.r0, want->box.r1, want->box.c0, want->box.c1);
    }
}

static void verify_new(ex_t *E)
{
    const nrs_emu_graph_t *g = E->g;
    unsigned char *expect = calloc(g->nbuf + 1, 1);
    if (!expect) { /* nothing verified is no success */
        note(E, &E->res->xport_errors, "out of memory verifying the new state");
        return;
    }
    for (int32_t j = g->nold; j < g->nold + g->nnew; j++) {
        check_buf(E, nrs_emu_canon(g, j), &g->buf[j].b);
        expect[nrs_emu_canon(g, j)] = 1;
    }
    for (int32_t i = 0; i < g->nold && g->keep_old; i++)
        if (!g->buf[i].lost && !expect[i]) {
            check_buf(E, i, &g->buf[i].b);
            expect[i] = 1;
        }
    for (size_t i = 0; i < g->nbuf; i++)
        if (E->live[i] && !expect[i])
            note(E, &E->res->leaks, "buffer %zu still allocated after the transition", i);
    free(expect);
}

/* Abort: release what the transition allocated; the old state must be whole. */
static void abort_and_verify_old(ex_t *E)
{
    const nrs_emu_graph_t *g = E->g;
    for (size_t i = (size_t)g->nold; i < g->nbuf; i++)
        if (E->live[i])
            ex_free(E, (int32_t)i);
    for (int32_t i = 0; i < g->nold; i++)
        if (!g->buf[i].lost)
            check_buf(E, i, &g->buf[i].b);
}

int nrs_emu_execute(const nrs_emu_graph_t *g, const nrs_xport_t *x, const nrs_emu_exec_opts_t *o,
                    nrs_emu_exec_result_t *res)
{
    ex_t E = {g, x, NULL, NULL, NULL, NULL, res, o && o->no_poison};
    int64_t maxb = 1;
    size_t stop = o && o->stop_after >= 0 && (size_t)o->stop_after < g->nops
                      ? (size_t)o->stop_after
                      : g->nops;

    memset(res, 0, sizeof(*res));
    for (size_t i = 0; i < g->nbuf; i++)
        if (g->buf[i].b.bytes > maxb)
            maxb = g->buf[i].b.bytes;
    E.mem = calloc(g->nbuf + 1, sizeof(*E.mem));
    E.live = calloc(g->nbuf + 1, 1);
    E.used = calloc((size_t)g->nphys + 1, sizeof(int64_t));
    E.scratch = malloc((size_t)maxb);
    if (!E.mem || !E.live || !E.used || !E.scratch) {
        note(&E, &res->xport_errors, "out of memory");
        goto out;
    }
    for (int32_t i = 0; i < g->nold; i++)
        if (!g->buf[i].lost)
            ex_alloc(&E, i, 1);
    double t0 = nrs_now_s();
    for (size_t i = 0; i < stop; i++) {
        const nrs_emu_op_t *op = &g->ops[i];
        ex_op(&E, op, i);
        if (op->type == NRS_EMU_OP_COPY || op->type == NRS_EMU_OP_XFER ||
            op->type == NRS_EMU_OP_STAGE)
            res->bytes_moved += (int64_t)op->rows * op->row_bytes;
    }
    res->run_s = nrs_now_s() - t0;
    res->ops_done = (int64_t)stop;
    res->aborted = stop < g->nops;
    if (res->aborted)
        abort_and_verify_old(&E);
    else
        verify_new(&E);
out:
    for (size_t i = 0; E.live && i < g->nbuf; i++)
        if (E.live[i])
            ex_free(&E, (int32_t)i);
    free(E.mem);
    free(E.live);
    free(E.used);
    free(E.scratch);
    return res->mismatches || res->use_after_free || res->cap_violations || res->leaks ||
                   res->xport_errors
               ? -1
               : 0;
}
