/* The worker API: the state of the current plan (its buffers, their layer
 * views, verify) and the reports of a step (worker_int.h). */
#define _GNU_SOURCE
#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "emu/geometry.h"
#include "emu/graph.h"
#include "emu/pattern.h"
#include "worker/worker_int.h"
#ifdef HAVE_NCCL
#include "xfer/nccl.h"
#endif

/* ---- state ---------------------------------------------------------------------------- */

void nrs_wk_sync_free(nrs_worker_t *w)
{
    for (int j = 0; w->sg && w->sgmem && j < w->sg->nnew; j++)
        if (w->sgmem[j].ptr && w->x.ops)
            w->x.ops->mem_free(w->x.ctx, &w->sgmem[j]);
    nrs_emu_graph_free(w->sg);
    free(w->stmap);
    free(w->sgidx);
    free(w->sgmem);
    w->sg = NULL;
    w->stmap = w->sgidx = NULL;
    w->sgmem = NULL;
    w->synced = 0;
}

void nrs_wk_sync_reset(nrs_worker_t *w)
{
    nrs_wk_sync_free(w);
    w->sync_n = w->agree_n = 0;
    if (w->leaving)
        memset(w->leaving, 0, (size_t)w->n);
    if (w->gone)
        memset(w->gone, 0, (size_t)w->n);
}

/* This rank's buffers of the current state, freed (its index kept). */
static void free_buffers(nrs_worker_t *w)
{
    for (size_t i = 0; w->mem && i < w->st.nbuf; i++) {
        if (w->mem[i].ptr && w->x.ops)
            w->x.ops->mem_free(w->x.ctx, &w->mem[i]);
        memset(&w->mem[i], 0, sizeof w->mem[i]);
#ifdef HAVE_NCCL
        if (w->dev && w->dev[i])
            nrs_cuda_free(w->cuda_dev, w->dev[i]);
#endif
        if (w->dev)
            w->dev[i] = NULL;
    }
}

void nrs_wk_free_state(nrs_worker_t *w)
{
    nrs_wk_sync_reset(w);
    free_buffers(w);
    free(w->mem);
    free(w->dev);
    free(w->mine);
    w->mem = NULL;
    w->dev = NULL;
    w->mine = NULL;
    w->nmine = 0;
    w->allocated = 0;
    nrs_emu_state_free(&w->st);
    memset(&w->st, 0, sizeof w->st);
}

int nrs_wk_buf_rank(const nrs_worker_t *w, const nrs_emu_buf_t *b)
{
    return nrs_wk_owner_rank((void *)w, b->gpu);
}

void nrs_wk_index_free(nrs_wk_index_t *ix)
{
    nrs_emu_state_free(&ix->st);
    free(ix->mem);
    free(ix->dev);
    free(ix->mine);
    memset(ix, 0, sizeof(*ix));
}

int nrs_wk_index_build(const nrs_worker_t *w, const nrs_plan_t *p, const int *perm,
                       nrs_wk_index_t *ix, char *why, size_t whylen)
{
    memset(ix, 0, sizeof(*ix));
    if (nrs_emu_state_build(&w->spec, p, NRS_EMU_SEL_PERSISTENT, NULL, 0, &ix->st, why, whylen)) {
        memset(&ix->st, 0, sizeof ix->st);
        return NRS_ERR_PLAN;
    }
    ix->mem = calloc(ix->st.nbuf + 1, sizeof(*ix->mem));
    ix->dev = calloc(ix->st.nbuf + 1, sizeof(*ix->dev));
    ix->mine = calloc(ix->st.nbuf + 1, sizeof(*ix->mine));
    if (!ix->mem || !ix->dev || !ix->mine) {
        nrs_wk_index_free(ix);
        snprintf(why, whylen, "out of memory");
        return NRS_ERR_NOMEM;
    }
    for (size_t i = 0; i < ix->st.nbuf; i++)
        if (nrs_wk_rank_under(w, perm, ix->st.buf[i].gpu) == w->me)
            ix->mine[ix->nmine++] = (int)i;
    return 0;
}

/* ix becomes the handle's (its state freed before: nrs_wk_free_state). */
static void index_install(nrs_worker_t *w, nrs_wk_index_t *ix)
{
    w->st = ix->st;
    w->mem = ix->mem;
    w->dev = ix->dev;
    w->mine = ix->mine;
    w->nmine = ix->nmine;
    memset(ix, 0, sizeof(*ix));
}

void nrs_wk_index_keep(nrs_worker_t *w, nrs_wk_index_t *ix, const nrs_emu_graph_t *g)
{
    for (size_t j = 0; j < ix->st.nbuf; j++) {
        int32_t c = nrs_emu_canon(g, g->nold + (int32_t)j);
        ix->mem[j] = w->mem[c];
        ix->dev[j] = w->dev[c];
        memset(&w->mem[c], 0, sizeof w->mem[c]);
        w->dev[c] = NULL;
    }
    nrs_wk_free_state(w); /* the epoch's sync and counters, the old index: no buffer left */
    index_install(w, ix);
    w->allocated = 1;
}

void nrs_wk_free_new(nrs_worker_t *w, nrs_xmem_t *nm, size_t n, bool dev)
{
    for (size_t i = 0; nm && i < n; i++) {
        if (!nm[i].ptr)
            continue;
#ifdef HAVE_NCCL
        if (dev) {
            nrs_cuda_free(w->cuda_dev, nm[i].ptr);
            nm[i].ptr = NULL;
            continue;
        }
#else
        (void)dev;
#endif
        w->x.ops->mem_free(w->x.ctx, &nm[i]);
    }
}

/* The state of the current plan and which buffers are ours (the state freed
 * before; on failure it stays empty). */
int nrs_wk_index_state(nrs_worker_t *w)
{
    char err[512];
    nrs_wk_index_t ix;
    int rc = nrs_wk_index_build(w, &w->plan, w->perm, &ix, err, sizeof err);
    if (rc)
        return nrs_wk_seterr(w, rc, "%s", err);
    index_install(w, &ix);
    return 0;
}

int nrs_wk_plan_ok(nrs_worker_t *w, const nrs_plan_t *p)
{
    if (!p)
        return nrs_wk_seterr(w, NRS_ERR_INVAL, "no plan");
    if (w->n > 1 && p->total_gpus > w->n)
        return nrs_wk_seterr(w, NRS_ERR_PLAN, "plan of epoch %u spans %d GPUs, the job has %d "
                             "ranks", p->epoch, p->total_gpus, w->n);
    return 0;
}

/* A plan well-formed enough to index: pools inside its GPUs, each
 * model-stage on a pool that exists, a layout that fits it (the checks of a
 * plan from the wire; the epoch may be 0 here). */
static int plan_wellformed(nrs_worker_t *w, const nrs_plan_t *plan)
{
    char why[256];
    nrs_plan_t p = *plan;
    if (!p.epoch)
        p.epoch = 1;
    if (nrs_proto_check_plan(&p, why, sizeof why))
        return nrs_wk_seterr(w, NRS_ERR_PLAN, "nrs_worker_set_plan: plan of epoch %u: %s",
                             plan->epoch, why);
    return 0;
}

/* The plan is checked and its state indexed before anything of the handle
 * changes: a plan refused leaves the previous one (or none) current, its
 * state and buffers as they were. */
int nrs_worker_set_plan(nrs_worker_t *w, const nrs_plan_t *plan)
{
    int rc;
    char err[512];
    nrs_wk_index_t ix;
    if ((rc = nrs_wk_unusable(w, __func__)))
        return rc;
    if (!plan)
        return nrs_wk_seterr(w, NRS_ERR_INVAL, "nrs_worker_set_plan: plan is NULL");
    if ((rc = nrs_wk_plan_ok(w, plan)) || (rc = plan_wellformed(w, plan)))
        return rc;
    if ((rc = nrs_wk_index_build(w, plan, NULL, &ix, err, sizeof err)))
        return nrs_wk_seterr(w, rc, "nrs_worker_set_plan: plan of epoch %u: %s", plan->epoch,
                             err);
    nrs_wk_free_state(w);
    w->plan = *plan;
    w->have_plan = 1;
    w->broken = 0;
    w->rep.epoch = plan->epoch;
    nrs_wk_perm_identity(w);
    index_install(w, &ix);
    return NRS_OK;
}

int nrs_worker_epoch(const nrs_worker_t *w)
{
    int rc;
    if ((rc = nrs_wk_unusable(w, __func__)))
        return rc;
    return w->have_plan ? (int)w->plan.epoch : -1;
}

/* Model-stage ms: 0 and this rank's coordinates, -1 if it does not run it. */
static int coords(const nrs_worker_t *w, int ms, int *t, int *p, int *d)
{
    if (!w->have_plan || ms < 0 || ms >= NRS_MS_COUNT || !w->plan.has[ms])
        return -1;
    const nrs_layout_t *l = &w->plan.layout[ms];
    int first = w->plan.pools[w->plan.pool_of[ms]].first_gpu;
    int idx = w->my_gpu - first;
    if (idx < 0 || idx >= l->tp * l->pp * l->dp)
        return -1;
    *d = idx / (l->tp * l->pp);
    *p = idx % (l->tp * l->pp) / l->tp;
    *t = idx % l->tp;
    return 0;
}

int nrs_worker_nroles(const nrs_worker_t *w)
{
    int n = 0, t, p, d, rc;
    if ((rc = nrs_wk_unusable(w, __func__)))
        return rc;
    for (int ms = 0; ms < NRS_MS_COUNT; ms++)
        n += !coords(w, ms, &t, &p, &d);
    return n;
}

/* An output the caller may leave NULL. */
static void put(int *out, int v)
{
    if (out)
        *out = v;
}

int nrs_worker_role(const nrs_worker_t *w, int i, int *ms, int *tp, int *pp, int *dp, int *t,
                    int *p, int *d)
{
    int ct, cp, cd, rc;
    if ((rc = nrs_wk_unusable(w, __func__)))
        return rc;
    for (int k = 0, j = i; k < NRS_MS_COUNT; k++) {
        if (coords(w, k, &ct, &cp, &cd) || j--)
            continue;
        const nrs_layout_t *l = &w->plan.layout[k];
        put(ms, k);
        put(tp, l->tp);
        put(pp, l->pp);
        put(dp, l->dp);
        put(t, ct);
        put(p, cp);
        put(d, cd);
        return NRS_OK;
    }
    return nrs_wk_seterr(w, NRS_ERR_INVAL, "nrs_worker_role: role %d: this rank runs %d "
                         "model-stage(s)%s", i, nrs_worker_nroles(w),
                         w->have_plan ? "" : " (no plan yet)");
}

int nrs_worker_group(const nrs_worker_t *w, int ms, int group, int *ranks, int max)
{
    int t, p, d, n = 0, rc;
    if ((rc = nrs_wk_unusable(w, __func__)))
        return rc;
    if (group < NRS_GROUP_TP || group > NRS_GROUP_DP)
        return nrs_wk_seterr(w, NRS_ERR_INVAL, "nrs_worker_group: group %d: not NRS_GROUP_TP, "
                             "_PP or _DP", group);
    if (coords(w, ms, &t, &p, &d))
        return nrs_wk_seterr(w, NRS_ERR_INVAL, "nrs_worker_group: model-stage %d (%s) is not "
                             "run by this rank%s", ms, nrs_worker_ms_name(ms),
                             w->have_plan ? "" : " (no plan yet)");
    if (!ranks)
        max = 0; /* the count only */
    const nrs_layout_t *l = &w->plan.layout[ms];
    int first = w->plan.pools[w->plan.pool_of[ms]].first_gpu;
    int len = group == NRS_GROUP_TP ? l->tp : group == NRS_GROUP_PP ? l->pp : l->dp;
    for (int k = 0; k < len; k++) {
        int tt = group == NRS_GROUP_TP ? k : t, pp = group == NRS_GROUP_PP ? k : p,
            dd = group == NRS_GROUP_DP ? k : d;
        if (n < max)
            ranks[n] = w->n == 1 ? first + dd * l->tp * l->pp + pp * l->tp + tt
                                 : nrs_wk_owner_rank((void *)w,
                                                     first + dd * l->tp * l->pp + pp * l->tp + tt);
        n++;
    }
    return n;
}

#ifdef HAVE_NCCL
/* This rank's node-local index: $NRS_CUDA_DEVICE (a device, not an index),
 * else the launcher's local rank (Slurm, torchrun, Open MPI), else -1. */
static long local_index(int *is_device)
{
    static const char *const vars[] = {"NRS_CUDA_DEVICE", "SLURM_LOCALID", "LOCAL_RANK",
                                       "OMPI_COMM_WORLD_LOCAL_RANK"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        char *end;
        long x = v && *v ? strtol(v, &end, 10) : -1;
        if (v && *v && !*end && x >= 0) {
            *is_device = i == 0;
            return x;
        }
    }
    return -1;
}

/* A GPU for this rank: the only one it sees (a launcher that binds one GPU
 * per task), else the one its local rank names (device = local rank mod the
 * GPUs seen, so the ranks of a node spread over its GPUs, not all on 0). */
static int cuda_ok(nrs_worker_t *w, char *why, size_t len)
{
    int n = 0, is_device = 0;
    if (nrs_cuda_device_count(&n, why, len) || n < 1)
        return 0;
    long local = local_index(&is_device);
    if (is_device && local >= n) {
        snprintf(why, len, "NRS_CUDA_DEVICE=%ld, but %d GPU(s) are visible", local, n);
        return 0;
    }
    w->cuda_dev = n == 1 || local < 0 ? 0 : (int)(local % n);
    return 1;
}
#endif

/* A failure half-way: what was allocated goes (a retry starts afresh). */
static int alloc_undo(nrs_worker_t *w, int rc)
{
    free_buffers(w);
    w->mem_kind = NRS_MEM_HOST;
    return rc;
}

int nrs_worker_alloc_state(nrs_worker_t *w, int mem, int fill)
{
    int rc;
    if ((rc = nrs_wk_unusable(w, __func__)))
        return rc;
    if (mem != NRS_MEM_AUTO && mem != NRS_MEM_HOST && mem != NRS_MEM_CUDA)
        return nrs_wk_seterr(w, NRS_ERR_INVAL, "nrs_worker_alloc_state: mem %d: not NRS_MEM_AUTO, "
                             "_HOST or _CUDA", mem);
    if (!w->have_plan || w->allocated || w->broken)
        return nrs_wk_seterr(w, NRS_ERR_INVAL, "nrs_worker_alloc_state: %s",
                             w->allocated ? "state already allocated" : "no usable plan");
    if (!w->x.ops || !w->mem || !w->mine)
        return nrs_wk_seterr(w, NRS_ERR_INVAL, "nrs_worker_alloc_state: %s",
                             !w->x.ops ? "no transport" : "no state index");
    w->mem_kind = NRS_MEM_HOST;
    w->err[0] = '\0';
    if (mem == NRS_MEM_CUDA || mem == NRS_MEM_AUTO) {
#ifdef HAVE_NCCL
        char why[256];
        if (cuda_ok(w, why, sizeof why))
            w->mem_kind = NRS_MEM_CUDA;
        else if (mem == NRS_MEM_CUDA)
            return nrs_wk_seterr(w, NRS_ERR_UNSUPPORTED, "CUDA memory requested: %s", why);
        else
            nrs_wk_seterr(w, NRS_OK, "state in host memory: %s", why);
#else
        if (mem == NRS_MEM_CUDA)
            return nrs_wk_seterr(w, NRS_ERR_UNSUPPORTED,
                                 "CUDA memory requested: built without CUDA");
        nrs_wk_seterr(w, NRS_OK, "state in host memory: built without CUDA");
#endif
    }
    for (int k = 0; k < w->nmine; k++) {
        int i = w->mine[k];
        const nrs_emu_buf_t *b = &w->st.buf[i];
        if (w->x.ops->mem_alloc(w->x.ctx, b->gpu, (size_t)b->bytes, &w->mem[i])) {
            memset(&w->mem[i], 0, sizeof w->mem[i]);
            return alloc_undo(w, nrs_wk_seterr(w, NRS_ERR_NOMEM, "%lld bytes for buffer %d",
                                              (long long)b->bytes, i));
        }
        if (fill)
            nrs_emu_pattern_fill(b, w->mem[i].ptr);
        else
            memset(w->mem[i].ptr, 0, (size_t)b->bytes);
#ifdef HAVE_NCCL
        char e[256];
        if (w->mem_kind == NRS_MEM_CUDA &&
            (nrs_cuda_alloc(w->cuda_dev, (size_t)b->bytes, &w->dev[i], e, sizeof e) ||
             nrs_cuda_copy(w->cuda_dev, w->dev[i], w->mem[i].ptr, (size_t)b->bytes, 'h', e,
                           sizeof e)))
            return alloc_undo(w, nrs_wk_seterr(w, NRS_ERR_NOMEM, "%s", e));
#endif
    }
    w->allocated = 1;
    return NRS_OK;
}

int nrs_worker_mem_kind(const nrs_worker_t *w)
{
    int rc;
    if ((rc = nrs_wk_unusable(w, __func__)))
        return rc;
    return w->mem_kind ? w->mem_kind : NRS_MEM_HOST;
}

int nrs_worker_nbuffers(const nrs_worker_t *w)
{
    int rc;
    if ((rc = nrs_wk_unusable(w, __func__)))
        return rc;
    return w->allocated ? w->nmine : 0;
}

/* Buffer i of this rank, or why there is none (fn: the call). */
static int buffer_ok(const nrs_worker_t *w, int i, const char *fn)
{
    int rc;
    if ((rc = nrs_wk_unusable(w, fn)))
        return rc;
    if (!w->allocated)
        return nrs_wk_seterr(w, NRS_ERR_INVAL, "%s: buffer %d: no state allocated", fn, i);
    if (i < 0 || i >= w->nmine)
        return nrs_wk_seterr(w, NRS_ERR_INVAL, "%s: buffer %d: this rank holds %d buffer(s)", fn, i,
                             w->nmine);
    return NRS_OK;
}

/* Where state buffer k lives: device memory under NRS_MEM_CUDA. */
static char *buf_addr(const nrs_worker_t *w, int k)
{
    return w->mem_kind == NRS_MEM_CUDA ? w->dev[k] : w->mem[k].ptr;
}

int nrs_worker_buffer(const nrs_worker_t *w, int i, void **ptr, long long *bytes)
{
    int rc = buffer_ok(w, i, __func__);
    if (rc)
        return rc;
    int k = w->mine[i];
    if (ptr)
        *ptr = buf_addr(w, k);
    if (bytes)
        *bytes = w->st.buf[k].bytes;
    return NRS_OK;
}

int nrs_worker_buffer_desc(const nrs_worker_t *w, int i, int *role, int *tensor, int *kind,
                           int *r0, int *r1, int *c0, int *c1, int *esize)
{
    int rc = buffer_ok(w, i, __func__);
    if (rc)
        return rc;
    const nrs_emu_buf_t *b = &w->st.buf[w->mine[i]];
    put(role, b->role);
    put(tensor, b->tensor);
    put(kind, b->kind);
    put(r0, b->box.r0);
    put(r1, b->box.r1);
    put(c0, b->box.c0);
    put(c1, b->box.c1);
    put(esize, b->esize);
    return NRS_OK;
}

int nrs_worker_buffer_layer(const nrs_worker_t *w, int i, int layer, void **ptr, int *rows,
                            int *cols, long long *pitch, int *r0, int *c0)
{
    int rc = buffer_ok(w, i, __func__);
    if (rc)
        return rc;
    int k = w->mine[i];
    const nrs_emu_buf_t *b = &w->st.buf[k];
    nrs_emu_rect_t in, local;
    if (!nrs_emu_layer_part(&w->spec.models[b->role], b->tensor, &b->box, layer, &in, &local))
        return nrs_wk_seterr(w, NRS_ERR_INVAL, "%s: buffer %d holds no part of layer %d",
                             __func__, i, layer);
    int64_t width = b->box.c1 - b->box.c0;
    if (ptr) {
        char *base = buf_addr(w, k);
        *ptr = base ? base + ((in.r0 - b->box.r0) * width + (in.c0 - b->box.c0)) * b->esize
                    : NULL;
    }
    put(rows, in.r1 - in.r0);
    put(cols, in.c1 - in.c0);
    if (pitch)
        *pitch = width * b->esize;
    put(r0, local.r0);
    put(c0, local.c0);
    return NRS_OK;
}

/* CUDA state: the host copies are what the transports move. */
int nrs_wk_sync_host(nrs_worker_t *w, char dir)
{
#ifdef HAVE_NCCL
    char e[256];
    for (int k = 0; w->mem_kind == NRS_MEM_CUDA && k < w->nmine; k++) {
        int i = w->mine[k];
        size_t n = (size_t)w->st.buf[i].bytes;
        if (!w->dev[i] && dir == 'd') /* none on the device (a partial state): the host's is it */
            continue;
        if (!w->dev[i] && dir == 'h' && nrs_cuda_alloc(w->cuda_dev, n, &w->dev[i], e, sizeof e))
            return nrs_wk_seterr(w, NRS_ERR_NOMEM, "%s", e);
        if (dir == 'd' ? nrs_cuda_copy(w->cuda_dev, w->mem[i].ptr, w->dev[i], n, 'd', e, sizeof e)
                       : nrs_cuda_copy(w->cuda_dev, w->dev[i], w->mem[i].ptr, n, 'h', e, sizeof e))
            return nrs_wk_seterr(w, NRS_ERR_XPORT, "%s", e);
    }
#else
    (void)w, (void)dir;
#endif
    return 0;
}

/* Counts the caller may leave NULL: written where given, zero first. */
void nrs_wk_counts(long long *verified, long long *mismatches, long long v, long long m)
{
    if (verified)
        *verified = v;
    if (mismatches)
        *mismatches = m;
}

int nrs_worker_verify_state(const nrs_worker_t *w, long long *verified, long long *mismatches)
{
    int64_t maxb = 1;
    long long v = 0, m = 0;
    int rc;
    nrs_wk_counts(verified, mismatches, 0, 0);
    if ((rc = nrs_wk_unusable(w, __func__)))
        return rc;
    if (!w->allocated)
        return nrs_wk_seterr(w, NRS_ERR_INVAL, "nrs_worker_verify_state: no state allocated");
    for (int k = 0; k < w->nmine; k++)
        if (w->st.buf[w->mine[k]].bytes > maxb)
            maxb = w->st.buf[w->mine[k]].bytes;
    unsigned char *scratch = malloc((size_t)maxb);
    if (!scratch)
        return nrs_wk_seterr(w, NRS_ERR_NOMEM, "nrs_worker_verify_state: out of memory");
    if ((rc = nrs_wk_sync_host((nrs_worker_t *)w, 'd'))) {
        free(scratch);
        return rc;
    }
    for (int k = 0; k < w->nmine; k++) {
        const nrs_emu_buf_t *b = &w->st.buf[w->mine[k]];
        const void *p = w->mem[w->mine[k]].ptr;
        v++;
        if (!p || nrs_emu_checksum(p, (size_t)b->bytes) != nrs_emu_pattern_checksum(b, scratch))
            m++;
    }
    free(scratch);
    nrs_wk_counts(verified, mismatches, v, m);
    return m ? nrs_wk_seterr(w, NRS_ERR_VERIFY, "nrs_worker_verify_state: %lld of %lld shard(s) "
                             "do not match the pattern", m, v) : NRS_OK;
}

/* ---- reports ------------------------------------------------------------------------ */

void nrs_worker_set_report_hook(nrs_worker_t *w, nrs_worker_report_hook_fn fn, void *arg)
{
    if (!w) {
        nrs_wk_nohandle(__func__);
        return;
    }
    if (nrs_wk_unusable(w, __func__))
        return;
    w->hook = fn;
    w->hook_arg = arg;
}

int nrs_worker_set_report_sink(nrs_worker_t *w, nrs_report_fn fn, void *arg)
{
    int rc;
    if ((rc = nrs_wk_unusable(w, __func__)))
        return rc;
    w->sink = fn;
    w->sink_arg = arg;
    return NRS_OK;
}

int nrs_worker_report_stage(nrs_worker_t *w, int ms, double seconds)
{
    int rc;
    if ((rc = nrs_wk_cannot_act(w, __func__)))
        return rc;
    if (ms < 0 || ms >= NRS_MS_COUNT)
        return nrs_wk_seterr(w, NRS_ERR_INVAL, "nrs_worker_report_stage: model-stage %d: not an "
                             "nrs_ms_t (0..%d)", ms, NRS_MS_COUNT - 1);
    /* what a REPORT can carry (a frame the controller refuses retires the rank) */
    int i = 0;
    while (i < w->rep.nstages && w->rep.ms[i] != ms)
        i++;
    double total = (i < w->rep.nstages ? w->rep.seconds[i] : 0) + seconds;
    if (!(seconds >= 0) || !(total <= NRS_PROTO_REPORT_MAX_S))
        return nrs_wk_seterr(w, NRS_ERR_INVAL, "nrs_worker_report_stage: %s: %g seconds%s",
                             nrs_worker_ms_name(ms), seconds, seconds >= 0 ? " (a step's "
                             "stage takes at most 1e6)" : "");
    if (i < w->rep.nstages) {
        w->rep.seconds[i] = total; /* the stage ran again this step */
        return NRS_OK;
    }
    w->rep.ms[w->rep.nstages] = (uint8_t)ms;
    w->rep.seconds[w->rep.nstages++] = seconds;
    return NRS_OK;
}

int nrs_worker_report_memory(nrs_worker_t *w, long long used_bytes, long long cap_bytes,
                             int alloc_failed)
{
    int rc;
    if ((rc = nrs_wk_cannot_act(w, __func__)))
        return rc;
    if (used_bytes < 0 || cap_bytes < 0)
        return nrs_wk_seterr(w, NRS_ERR_INVAL, "nrs_worker_report_memory: %lld bytes used of %lld: "
                             "negative", used_bytes, cap_bytes);
    w->rep.mem_used = used_bytes > w->rep.mem_used ? used_bytes : w->rep.mem_used;
    w->rep.mem_cap = cap_bytes;
    /* 95% or more of the cap; in double: used * 100 overflows for big counts */
    if (cap_bytes && (double)used_bytes * 100.0 >= (double)cap_bytes * 95.0)
        w->rep.flags |= 1u;
    if (alloc_failed)
        w->rep.flags |= 2u;
    return NRS_OK;
}

static void file_sink(const char *json)
{
    const char *f = getenv("NEREUS_REPORT_FILE");
    FILE *fp = f ? fopen(f, "a") : NULL;
    if (fp) {
        fprintf(fp, "%s\n", json);
        fclose(fp);
    }
}

int nrs_worker_report_step(nrs_worker_t *w, int step, double response_len)
{
    int rc;
    if ((rc = nrs_wk_cannot_act(w, __func__)))
        return rc;
    if (step < 0 || !(response_len >= 0))
        return nrs_wk_seterr(w, NRS_ERR_INVAL, "nrs_worker_report_step: step %d, response "
                             "length %g: negative", step, response_len);
    if (step > NRS_PROTO_MAX_STEP || !(response_len <= NRS_PROTO_REPORT_MAX_LEN))
        return nrs_wk_seterr(w, NRS_ERR_INVAL, "nrs_worker_report_step: step %d, response "
                             "length %g: out of range (steps up to %d, lengths up to %g)", step,
                             response_len, NRS_PROTO_MAX_STEP, NRS_PROTO_REPORT_MAX_LEN);
    nrs_worker_report_t *r = &w->rep;
    char json[2048];
    w->last_step = step;
    r->rank = w->me;
    r->epoch = w->have_plan ? w->plan.epoch : 0;
    r->step = (uint32_t)step;
    r->response_len = response_len;
    int l = snprintf(json, sizeof json, "{\"type\":\"report\",\"rank\":%d,\"epoch\":%u,\"step\":%u,"
                     "\"flags\":%u,\"response_len\":%.6g,\"mem_used\":%lld,\"mem_cap\":%lld,"
                     "\"stages\":{", r->rank, r->epoch, r->step, r->flags, r->response_len,
                     r->mem_used, r->mem_cap);
    for (int i = 0; i < r->nstages && l < (int)sizeof json; i++)
        l += snprintf(json + l, sizeof json - (size_t)l, "%s\"%s\":%.9g", i ? "," : "",
                      nrs_ms_name((nrs_ms_t)r->ms[i]), r->seconds[i]);
    if (l < (int)sizeof json)
        snprintf(json + l, sizeof json - (size_t)l, "}}");
    if (w->hook)
        w->hook(w->hook_arg, r);
    nrs_wk_ctl_report(w, r);
    if (w->sink)
        w->sink(w->sink_arg, json);
    else
        file_sink(json);
    memset(r, 0, sizeof(*r));
    return NRS_OK;
}
