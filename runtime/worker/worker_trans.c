/* The worker API: transitions, checkpoints, and restore from one when a
 * transition's state survives nowhere (worker_int.h). */
#define _GNU_SOURCE
#include <config.h>

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "emu/geometry.h"
#include "emu/graph.h"
#include "util/util.h"
#include "worker/ckpt.h"
#include "worker/dtrans.h"
#include "worker/worker_int.h"

/* ---- transitions ------------------------------------------------------------------- */

/* NRS_WORKER_KILL=RANK:OPS (SIGKILL after OPS of its ops) or RANK:ponr (right
 * after the point-of-no-return vote): the tests' failure injection. */
bool nrs_wk_verify_on(const nrs_worker_t *w)
{
    const char *e = getenv("NRS_WORKER_VERIFY");
    return e && *e ? strcmp(e, "0") != 0 : w->spec.runtime.verify;
}

static int64_t kill_hook(const nrs_worker_t *w)
{
    const char *k = getenv("NRS_WORKER_KILL");
    char *end;
    if (!k || strtol(k, &end, 10) != w->me || *end != ':')
        return -1;
    return !strcmp(end + 1, "ponr") ? -2 : strtoll(end + 1, NULL, 10);
}

/* NRS_WORKER_TRANS_FAIL=RANK:N: rank RANK's transition attempt N (the counter
 * the ranks share, from 0) fails on that rank alone before its ops, as a
 * failed copy of its GPU state to the host does: the tests' check that such
 * a rank still votes in the transition. */
static int trans_fail_hook(nrs_worker_t *w)
{
    const char *k = getenv("NRS_WORKER_TRANS_FAIL");
    char *end;
    if (!k || strtol(k, &end, 10) != w->me || *end != ':' ||
        strtoll(end + 1, NULL, 10) != (long long)w->attempt)
        return 0;
    return nrs_wk_seterr(w, NRS_ERR_XPORT, "test hook: transition attempt %u fails on this rank",
                         w->attempt);
}

/* NRS_WORKER_NOMEM=RANK:POINT:N: in rank RANK's transition attempt N (the
 * counter the ranks share, from 0) the memory at POINT cannot be had: "vote"
 * and "census" (nrs_dtrans_opts_t.nomem), "settle" (a restore's settle,
 * below), "hostcopy" (past the point of no return over NCCL, the first host
 * copy of the new state). The tests' check that such a rank still takes
 * part in every collective of the run, and frees what it holds. The point,
 * or NULL. */
static const char *nomem_hook(const nrs_worker_t *w)
{
    static const char *const points[] = {"vote", "census", "settle", "hostcopy"};
    for (size_t i = 0; i < sizeof points / sizeof points[0]; i++)
        if (nrs_wk_nomem(w, points[i], w->attempt))
            return points[i];
    return NULL;
}

static int restore(nrs_worker_t *w, const nrs_plan_t *next, const int *nperm, const int *out,
                   int nout, int job_step);

/* Ranks holding a GPU of the committed plan are no longer in line. */
static void placed_out_of_line(nrs_worker_t *w, const nrs_plan_t *next)
{
    for (int i = 0; w->waiting && w->n > 1 && i < next->total_gpus && i < w->n; i++)
        if (w->perm[i] >= 0 && w->perm[i] < w->n)
            w->waiting[w->perm[i]] = 0;
}

/* next becomes the current plan, its GPU i held by rank nperm[i] (the ranks
 * without one after them); this rank's GPU in it. */
static void adopt_plan(nrs_worker_t *w, const nrs_plan_t *next, const int *nperm)
{
    w->plan = *next;
    w->rep.epoch = next->epoch;
    memcpy(w->perm, nperm, sizeof(int) * (size_t)w->n);
    placed_out_of_line(w, next);
    w->my_gpu = -1;
    for (int i = 0; i < next->total_gpus; i++)
        if (w->n == 1 || w->perm[i] == w->me)
            w->my_gpu = i;
    if (w->n == 1)
        w->my_gpu = 0;
}

/* The last transition's result (nrs_worker_transition_stat) when it ran no
 * executor: its outcome, time since t0 and message. */
static void set_last(nrs_worker_t *w, int outcome, double t0, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void set_last(nrs_worker_t *w, int outcome, double t0, const char *fmt, ...)
{
    va_list ap;
    memset(&w->last, 0, sizeof w->last);
    w->last.outcome = outcome;
    w->last.failed_rank = -1;
    w->last.total_s = nrs_now_s() - t0;
    va_start(ap, fmt);
    vsnprintf(w->last.msg, sizeof w->last.msg, fmt, ap);
    va_end(ap);
    w->have_last = 1;
}

/* Nothing moves in g (a re-tune of micro-batches, nrs_adapt_retune: the same
 * pools, placement and tp/pp/dp): no op, no GPU lost, and every new buffer
 * is an old one kept in place, on the rank that holds it now. Every rank
 * builds the same graph and the same numbering (nperm), so every rank
 * finds the same without a collective. */
static bool nothing_moves(const nrs_worker_t *w, const nrs_emu_graph_t *g, const int *nperm,
                          int nlost)
{
    if (g->nops || nlost || w->broken || g->nnew != g->nold)
        return false;
    for (int32_t j = g->nold; j < g->nold + g->nnew; j++) {
        int32_t c = g->buf[j].alias;
        if (c < 0 || c >= g->nold || nrs_wk_rank_under(w, nperm, g->buf[j].b.gpu) !=
                                         nrs_wk_rank_under(w, w->perm, g->buf[c].b.gpu))
            return false;
    }
    return true;
}

static int vote_all(nrs_worker_t *w, uint64_t key, const char *name, int32_t mine, const int *out,
                    int nout, char *why, size_t whylen);

/* A point of no return of this file's own (a restore, a transition in which
 * nothing moves) settled as a transition's (dtrans settle: PMIx collectives
 * outlive the controller): what the controller's PONR gave this rank (d),
 * shared by every participant in "dt<attempt>.settle"; never a split. sb:
 * NRS_DTRANS_SETTLE_BYTES, had before the vote. */
static int settle(nrs_worker_t *w, uint64_t epoch, int d, void *sb, const int *out, int nout,
                  unsigned attempt, char *why, size_t whylen)
{
    nrs_dtrans_opts_t o;
    nrs_wk_dtrans_opts(w, &o);
    o.out_ranks = out;
    o.nout = nout;
    o.attempt = attempt;
    return nrs_dtrans_settle(&o, nrs_wk_job_rdv(w), epoch, d, sb, why, whylen);
}

/* A transition in which nothing moves (nothing_moves): no communicator, no
 * copy between the GPU and the host, no executor and its three votes; the
 * new plan's index is built aside, the ranks decide, and each keeps its
 * buffers under the new index. Who decides: the controller's COMMIT when
 * its GATHERs carry the collectives (it hears every rank's ACK: a rank that
 * failed here says so in its ACK, prepare_run, and the controller aborts on
 * every rank); else one vote of every participant, "keep<attempt>" (a rank
 * that failed votes no and every rank aborts alike: without it a rank's
 * own failure left it on the old epoch while the others took the new
 * one), then the controller's PONR and the settle, as a transition's. */
static int keep_in_place(nrs_worker_t *w, const nrs_plan_t *next, const nrs_emu_graph_t *g,
                         const int *nperm, const int *out, int nout, int job_step, int ctl)
{
    char why[512] = "", name[48];
    double t0 = nrs_now_s();
    unsigned from = w->plan.epoch;
    bool decider = ctl && w->coll_ctl, settles = ctl && !w->coll_ctl;
    nrs_wk_index_t ix;
    int lrc = nrs_wk_index_build(w, next, nperm, &ix, why, sizeof why);
    if (lrc)
        lrc = nrs_wk_seterr(w, lrc, "%s", why);
    else
        lrc = trans_fail_hook(w);
    unsigned attempt = w->attempt++;
    void *sb = settles && !lrc ? malloc(NRS_DTRANS_SETTLE_BYTES(w->n)) : NULL;
    if (settles && !lrc && !sb)
        lrc = nrs_wk_seterr(w, NRS_ERR_NOMEM, "out of memory for the settle");
    char lwhy[sizeof w->err] = "";
    if (lrc)
        snprintf(lwhy, sizeof lwhy, "%s", w->err);
    snprintf(name, sizeof name, "keep%u", attempt);
    int d = decider ? (lrc ? -1 : 0)
                    : vote_all(w, next->epoch, name, lrc != 0, out, nout, why, sizeof why);
    if (!d && ctl)
        d = nrs_wk_ctl_ponr(w, why, sizeof why);
    if (d != -1 && settles)
        d = settle(w, next->epoch, d, sb, out, nout, attempt, why, sizeof why);
    free(sb);
    if (lrc || d) {
        nrs_wk_index_free(&ix);
        set_last(w, NRS_DT_ABORTED, t0, "%s", lrc ? lwhy : why);
        if (lrc)
            return nrs_wk_seterr(w, lrc, "transition %u -> %u (nothing moves): %.400s; %s: "
                                 "aborted on every rank, old state intact", from, next->epoch,
                                 lwhy, decider ? "the controller aborts it" : "this rank voted no");
        return nrs_wk_seterr(w, NRS_ERR_ABORTED, "transition %u -> %u (nothing moves): %.400s; "
                             "aborted before the point of no return: old state intact", from,
                             next->epoch, why);
    }
    for (int i = 0; i < nout; i++) /* out of the job for good */
        w->dead[out[i]] = 1;
    if (ctl)
        w->job_step = job_step;
    nrs_wk_index_keep(w, &ix, g);
    adopt_plan(w, next, nperm);
    set_last(w, NRS_DT_COMMITTED, t0, "committed epoch %u: nothing moves (%d buffer(s) kept in "
             "place here): %s", next->epoch, w->nmine,
             decider ? "the controller's commit, no vote" : "one vote");
    snprintf(w->err, sizeof w->err, "transition %u -> %u: %s", from, next->epoch, w->last.msg);
    return NRS_OK;
}

/* The job's step at a controller's transition: every participant gives the
 * last step it reported if it holds a GPU of the current plan (the ranks of
 * the plan run their steps in lockstep), else -1 (a joiner in line counts
 * steps of its own); the largest, known alike to all (-1: none came). A rank
 * the transition places continues from it (nrs_worker_job_step). */
static int job_step_of(nrs_worker_t *w, uint32_t epoch, const int *out, int nout)
{
    int32_t mine = w->my_gpu >= 0 ? w->last_step : -1;
    char name[48];
    snprintf(name, sizeof name, "step.%u", w->attempt);
    int32_t best = nrs_wk_coll_i32(w, epoch, name, mine, out, nout, NRS_WK_MAX);
    return best >= 0 ? best : mine; /* a failed gather: the transition fails on its own */
}

/* A transition to next. gpu_map/lost: the controller's resize (survivors on
 * whole nodes first, adapt.h nrs_adapt_gpu_map), NULL/0 for none; ctl: the control channel runs
 * the PONR (ACK PREPARE, wait for COMMIT or ABORT). */
int nrs_wk_do_transition(nrs_worker_t *w, const nrs_plan_t *next, const int *gpu_map,
                         const int *lost, int nlost, int ctl)
{
    char err[512];
    int rc;
    /* after a failure past the point of no return only a restore from a checkpoint
     * (a controller's transition) can make the state whole again */
    int recover = w->broken && ctl && (w->ckpt_dir || w->present);
    if (!w->have_plan || !w->allocated || (w->broken && !recover))
        return nrs_wk_seterr(w, NRS_ERR_INVAL, w->broken ? "an earlier transition failed past "
                             "its point of no return (no checkpoint to restore)"
                             : "no plan or no state");
    if ((rc = nrs_wk_plan_ok(w, next)))
        return rc;
    if (next->epoch <= w->plan.epoch)
        return nrs_wk_seterr(w, NRS_ERR_PLAN, "epoch %u is not after the current %u", next->epoch,
                             w->plan.epoch);
    nrs_emu_opts_t eo;
    nrs_emu_opts_init(&eo);
    eo.chunk_bytes = (int64_t)nrs_wk_env_double("NRS_WORKER_CHUNK", 0, 0, 0x1p40);
    eo.gpu_map = gpu_map;
    eo.ngpu_map = gpu_map ? next->total_gpus : 0;
    eo.lost = lost;
    eo.nlost = nlost;
    /* a partial state: what no survivor holds complete is lost too (the census
     * told every rank the same); the rest is rebuilt from replicas */
    unsigned char *missing = NULL;
    if (w->broken && w->present && (missing = calloc(w->st.nbuf + 1, 1))) {
        for (size_t i = 0; i < w->st.nbuf; i++)
            missing[i] = !w->present[i];
        eo.missing = missing;
        eo.nmissing = w->st.nbuf;
    }
    int out_ranks[NRS_PROTO_MAX_LOST], nout = 0;
    int *nperm = calloc((size_t)w->n + 1, sizeof(int)), np = 0;
    if (!nperm)
        return nrs_wk_seterr(w, NRS_ERR_NOMEM, "out of memory");
    /* The new numbering: GPU i of next is physical GPU gpu_map[i] of the current plan. */
    char *used = calloc((size_t)w->n + 1, 1);
    for (int i = 0; used && i < next->total_gpus; i++) {
        int phys = gpu_map ? gpu_map[i] : i;
        int r = phys >= 0 && phys < w->n ? (w->perm ? w->perm[phys] : phys) : -1;
        if (w->n == 1)
            r = 0;
        if (r < 0 || (w->n > 1 && used[r])) {
            free(used);
            free(nperm);
            return nrs_wk_seterr(w, NRS_ERR_PLAN, "GPU %d of epoch %u has no rank of this job", i,
                                 next->epoch);
        }
        used[r] = 1;
        if (np < w->n)
            nperm[np++] = r;
    }
    for (int i = 0; used && w->n > 1 && i < nlost; i++) {
        int r = lost[i] >= 0 && lost[i] < w->n && w->perm ? w->perm[lost[i]] : -1;
        if (r == w->me) {
            free(used);
            free(nperm);
            return nrs_wk_seterr(w, NRS_ERR_PLAN, "this rank's GPU %d is lost in epoch %u", lost[i],
                                 next->epoch);
        }
        if (r >= 0 && nout < NRS_PROTO_MAX_LOST)
            out_ranks[nout++] = r;
    }
    /* and the ranks the step agreement found dead or leaving (they hold no GPU of
     * the current plan any more: e.g. killed by a shrink two epochs ago) */
    for (int r = 0; used && w->n > 1 && r < w->n; r++) {
        int dup = r == w->me || used[r] || !(w->gone[r] || w->leaving[r] || w->dead[r]);
        for (int i = 0; !dup && i < nout; i++)
            dup = out_ranks[i] == r;
        if (!dup && nout < NRS_PROTO_MAX_LOST)
            out_ranks[nout++] = r;
    }
    /* The ranks without a GPU of next: first the joiners in line that are not
     * out of the job, in world-rank order, then the others. A GPU a later
     * plan adds is the next place of this order (perm[phys]), so it goes to
     * the joiner the controller places there (docs/protocol.md §Joins), not
     * to a dead rank of lower rank. What decides it every rank knows alike:
     * the world gather, the step agreements, the committed plans. */
    for (int pass = 0; used && w->n > 1 && pass < 2; pass++)
        for (int r = 0; r < w->n; r++) {
            bool line = w->waiting && w->waiting[r] && !w->dead[r] && !w->gone[r] && !w->leaving[r];
            if (!used[r] && line == (pass == 0))
                nperm[np++] = r, used[r] = 1;
        }
    if (!used) {
        free(nperm);
        return nrs_wk_seterr(w, NRS_ERR_NOMEM, "out of memory");
    }
    free(used);
    nrs_emu_graph_t *g = NULL;
    int grc = nrs_emu_transition(&w->spec, &w->plan, next, &eo, &g, err, sizeof err);
    w->restored_step = -1;
    free(missing);
    bool restoring = grc == NRS_EMU_ELOST && ctl && w->ckpt_dir; /* alike on every rank */
    int job_step = ctl && w->n > 1 && (!grc || restoring)
                       ? job_step_of(w, next->epoch, out_ranks, nout) : w->last_step;
    if (restoring) {
        nrs_emu_graph_free(g);
        rc = restore(w, next, nperm, out_ranks, nout, job_step);
        free(nperm);
        return rc;
    }
    if (grc) {
        nrs_emu_graph_free(g);
        free(nperm);
        return nrs_wk_seterr(w, NRS_ERR_PLAN, "transition %u -> %u: %s", w->plan.epoch, next->epoch,
                             grc == NRS_EMU_ELOST ? "state lost on every replica" : err);
    }
    if ((size_t)g->nold != w->st.nbuf) {
        nrs_emu_graph_free(g);
        free(nperm);
        return nrs_wk_seterr(w, NRS_ERR_PLAN, "graph and state disagree (%d vs %zu buffers)",
                             g->nold, w->st.nbuf);
    }
    if (nothing_moves(w, g, nperm, nlost)) {
        rc = keep_in_place(w, next, g, nperm, out_ranks, nout, job_step, ctl);
        nrs_emu_graph_free(g);
        free(nperm);
        return rc;
    }
    /* GPU state: GPU to GPU over NCCL when every participant can, else
     * through the host copies over UCX (every participant votes, whatever
     * its memory: a rank without a GPU says no for all) */
    int nccl = w->xport_ucx && !w->broken &&
               nrs_wk_nccl_choose(w, g, next->epoch, out_ranks, nout);
    if (ctl && w->run_aborted) { /* its ABORT came in the vote above: the others see it too */
        nrs_emu_graph_free(g);
        free(nperm);
        return nrs_wk_seterr(w, NRS_ERR_ABORTED, "transition %u -> %u: the controller aborted "
                             "it; old state intact", w->plan.epoch, next->epoch);
    }
    const nrs_xport_t *x = nccl ? nrs_wk_nccl_xport(w) : &w->x;
    nrs_xmem_t *old = nccl ? calloc(w->st.nbuf + 1, sizeof(*old)) : w->mem;
    /* A failure of this rank alone from here on: it still votes, a no, in the
     * run (nrs_dtrans_opts_t.fail_local), so that every rank aborts it alike
     * and counts the attempt: a rank that returned before the votes paired
     * its next collective with the others' hash vote (they saw it dead) and
     * its attempt counter fell behind theirs. */
    int lrc = old ? 0 : nrs_wk_seterr(w, NRS_ERR_NOMEM, "out of memory");
    for (int k = 0; nccl && old && k < w->nmine; k++) {
        int i = w->mine[k];
        nrs_wk_nccl_wrap(&old[i], w->dev[i], w->st.buf[i].gpu, (size_t)w->st.buf[i].bytes);
    }
    if (!lrc && !nccl && (rc = nrs_wk_sync_host(w, 'd')))
        lrc = rc;
    if (!lrc && (rc = trans_fail_hook(w)))
        lrc = rc;
    nrs_dtrans_opts_t o;
    nrs_wk_dtrans_opts(w, &o);
    if (nccl)
        nrs_wk_nccl_opts(w, &o);
    o.kill_after = kill_hook(w);
    const char *kc = getenv("NRS_WORKER_KILL_CENSUS"); /* test hook: dtrans.h */
    if (kc && *kc)
        o.kill_census = atoi(kc);
    o.verify = !nccl && nrs_wk_verify_on(w); /* GPU memory over NCCL: not hashed */
    o.nomem = nomem_hook(w);
    bool no_hostcopy = o.nomem && !strcmp(o.nomem, "hostcopy");
    o.attempt = w->attempt++;
    o.out_ranks = out_ranks;
    o.nout = nout;
    if (ctl) {
        o.at_ponr = nrs_wk_ctl_ponr;
        o.ponr_arg = w;
        o.settle = !w->coll_ctl; /* PMIx gathers outlive the controller */
    }
    nrs_xmem_t *nm = calloc((size_t)g->nnew + 1, sizeof(*nm));
    if (!nm && !lrc)
        lrc = nrs_wk_seterr(w, NRS_ERR_NOMEM, "out of memory");
    unsigned char *present = calloc((size_t)g->nnew + 1, 1);
    o.present_out = present;
    o.fail_local = lrc != 0;
    char why[sizeof w->err] = "";
    if (lrc)
        snprintf(why, sizeof why, "%s", w->err);
    if (nccl) /* a failure here fails the run at once, on every rank alike */
        nrs_wk_nccl_preconnect(w, g);
    int out = nrs_dtrans_run(g, next->epoch, x, nrs_wk_job_rdv(w), lrc ? NULL : old,
                             lrc ? NULL : nm, &o, &w->last);
    size_t nnew = (size_t)g->nnew;
    w->have_last = 1;
    snprintf(w->err, sizeof w->err, "transition %u -> %u%s: %s", w->plan.epoch, next->epoch,
             nccl ? " (over NCCL)" : "", w->last.msg);
    nrs_emu_graph_free(g);
    if (lrc || out == NRS_DT_ABORTED || out == NRS_DT_ERROR) { /* the old state is intact */
        free(nm);
        free(nperm);
        free(present);
        if (nccl) {
            nrs_wk_nccl_after(w, out);
            free(old);
        }
        if (lrc)
            return nrs_wk_seterr(w, lrc, "transition %u -> %u: %.400s; this rank voted no: "
                                 "aborted on every rank, old state intact", w->plan.epoch,
                                 next->epoch, why);
        return out == NRS_DT_ERROR ? NRS_ERR_NOMEM : NRS_ERR_ABORTED;
    }
    for (int i = 0; i < nout; i++) /* out of the job for good */
        w->dead[out_ranks[i]] = 1;
    if (ctl) /* (nrs_worker_job_step: the controller's transitions) */
        w->job_step = job_step;
    /* committed or partial: the new state is what we hold now */
    for (size_t i = 0; i < w->st.nbuf; i++) /* old buffers left (partial only) */
        if (old[i].ptr)
            x->ops->mem_free(x->ctx, &old[i]);
    if (nccl) { /* the executor freed the old device buffers (or the loop above) */
        nrs_wk_nccl_after(w, out); /* the transport is gone after this unless committed */
        for (size_t i = 0; i < w->st.nbuf; i++)
            w->dev[i] = NULL;
        free(old);
    }
    int mk = w->mem_kind;
    nrs_wk_free_state(w);
    adopt_plan(w, next, nperm);
    free(nperm);
    /* the new state's buffers go to the handle; what it cannot take is freed
     * here (a device buffer dropped leaked its GPU memory for the job) */
    if ((rc = nrs_wk_index_state(w)) ||
        (w->st.nbuf != nnew && (rc = nrs_wk_seterr(w, NRS_ERR_PLAN, "new state has %zu buffers, "
                                                   "the graph %zu", w->st.nbuf, nnew)))) {
        nrs_wk_free_new(w, nm, nnew, nccl); /* runtime/emu builds both the same way */
        free(nm);
        free(present);
        return rc;
    }
    if (nccl) { /* device buffers from the transport; fresh host copies (filled on demand) */
        for (int k = 0; k < w->nmine; k++) { /* all of them first: the state frees them */
            w->dev[w->mine[k]] = nm[w->mine[k]].ptr;
            nm[w->mine[k]].ptr = NULL;
        }
        for (int k = 0; k < w->nmine; k++) {
            int i = w->mine[k];
            if (no_hostcopy || w->x.ops->mem_alloc(w->x.ctx, w->st.buf[i].gpu,
                                                   (size_t)w->st.buf[i].bytes, &w->mem[i])) {
                nrs_wk_free_new(w, nm, nnew, nccl); /* none: not this rank's */
                free(nm);
                free(present);
                return nrs_wk_seterr(w, NRS_ERR_NOMEM, "out of memory for host copies%s",
                                     no_hostcopy ? " (test hook)" : "");
            }
        }
    } else {
        memcpy(w->mem, nm, sizeof(*nm) * w->st.nbuf);
    }
    free(nm);
    w->allocated = 1;
    w->mem_kind = mk;
    free(w->present);
    w->present = NULL;
    if (out == NRS_DT_PARTIAL) {
        w->broken = 1;
        if (present && nnew == w->st.nbuf)
            w->present = present, present = NULL;
        free(present);
        return NRS_ERR_PARTIAL;
    }
    free(present);
    w->broken = 0;
    return nccl ? 0 : nrs_wk_sync_host(w, 'h');
}

int nrs_worker_transition(nrs_worker_t *w, const nrs_plan_t *next)
{
    int bad = nrs_wk_cannot_act(w, __func__);
    if (bad)
        return bad;
    if (!next || !w->have_plan || !w->allocated)
        return nrs_wk_seterr(w, NRS_ERR_INVAL, "nrs_worker_transition: %s", !next
                             ? "next is NULL" : "no plan or no state (nrs_worker_set_plan, "
                             "nrs_worker_alloc_state first)");
    return nrs_wk_do_transition(w, next, NULL, NULL, 0, 0);
}

double nrs_worker_transition_stat(const nrs_worker_t *w, int which)
{
    if (!w)
        nrs_wk_nohandle(__func__);
    if (!w || !w->have_last) /* no transition yet: no rank failed, nothing restored */
        return which == NRS_TS_FAILED_RANK || which == NRS_TS_RESTORED_STEP ? -1 : 0;
    const nrs_dtrans_result_t *r = &w->last;
    switch (which) {
    case NRS_TS_SECONDS: return r->total_s;
    case NRS_TS_PREPARE_S: return r->prepare_s;
    case NRS_TS_EXECUTE_S: return r->execute_s;
    case NRS_TS_VOTE_S: return r->vote_s;
    case NRS_TS_COMMIT_S: return r->commit_s;
    case NRS_TS_BYTES_SENT: return (double)r->bytes_sent;
    case NRS_TS_BYTES_RECV: return (double)r->bytes_recv;
    case NRS_TS_TRANSFERS: return (double)r->xfers;
    case NRS_TS_MAX_INFLIGHT: return (double)r->max_inflight;
    case NRS_TS_FAILED_RANK: return r->failed_rank;
    case NRS_TS_PRESENT: return (double)r->present;
    case NRS_TS_REBUILDABLE: return (double)r->rebuildable;
    case NRS_TS_LOST: return (double)r->lost;
    case NRS_TS_RESTORED_STEP: return (double)w->restored_step;
    case NRS_TS_BYTES_VERIFIED: return (double)r->bytes_verified;
    default: return 0;
    }
}

/* ---- checkpoints: write at a step boundary, restore when state is lost ------------- */

int nrs_worker_set_checkpoint_dir(nrs_worker_t *w, const char *dir)
{
    if (nrs_wk_unusable(w, __func__))
        return NRS_ERR_INVAL;
    char *d = dir && *dir ? strdup(dir) : NULL;
    if (dir && *dir && !d)
        return nrs_wk_seterr(w, NRS_ERR_NOMEM, "nrs_worker_set_checkpoint_dir: out of memory");
    free(w->ckpt_dir);
    w->ckpt_dir = d;
    return NRS_OK;
}

/* Every rank votes ok (0) or not under (key, name) among all ranks but out;
 * 0 when every participant's vote came and is 0. A rank without the memory
 * for the answer still votes, a no. */
static int vote_all(nrs_worker_t *w, uint64_t key, const char *name, int32_t mine, const int *out,
                    int nout, char *why, size_t whylen)
{
    int32_t *all = calloc((size_t)w->n + 1, sizeof(int32_t));
    unsigned char *got = calloc((size_t)w->n + 1, 1), *skip = calloc((size_t)w->n + 1, 1);
    char err[384];
    int rc = -1;
    if (!all || !got || !skip) { /* it still votes, a no, without the answer */
        mine = 1;
        nrs_wk_coll_gather(w, key, name, &mine, sizeof mine, out, nout, NULL, NULL, err,
                           sizeof err);
        snprintf(why, whylen, "out of memory: this rank voted no");
        goto out;
    }
    if (nrs_wk_coll_gather(w, key, name, &mine, sizeof mine, out, nout, all, got, err,
                           sizeof err)) {
        snprintf(why, whylen, "%s", err);
        goto out;
    }
    for (int i = 0; i < nout; i++)
        skip[out[i]] = 1;
    for (int i = 0; i < w->n; i++)
        if (!skip[i] && (!got[i] || all[i])) {
            snprintf(why, whylen, "rank %d %s", i, got[i] ? "failed" : "did not vote (dead)");
            goto out;
        }
    rc = 0;
out:
    free(all);
    free(got);
    free(skip);
    return rc;
}

int nrs_worker_checkpoint(nrs_worker_t *w, long step)
{
    char err[512] = "", name[48];
    int bad = nrs_wk_cannot_act(w, __func__);
    if (bad)
        return bad;
    if (step < 0)
        return nrs_wk_seterr(w, NRS_ERR_INVAL, "nrs_worker_checkpoint: step %ld: negative", step);
    if (!w->ckpt_dir)
        return nrs_wk_seterr(w, NRS_ERR_INVAL, "nrs_worker_checkpoint: no checkpoint directory "
                             "($NEREUS_CHECKPOINT_DIR)");
    if (!w->have_plan || !w->allocated || w->broken)
        return nrs_wk_seterr(w, NRS_ERR_INVAL, "nrs_worker_checkpoint: no plan or no state");
    /* every rank of the plan takes part: a checkpoint without one is not one.
     * The vote's participants in memory had with the world, and a rank
     * without the memory to write still votes, a no: one that returned
     * before the vote left the others waiting for it ("did not vote
     * (dead)") and paired its next collective with their vote. */
    int *part, *out, nout, rc = NRS_OK;
    unsigned char *in;
    nrs_wk_plan_arrays(w, &part, &out, &in);
    if (nrs_wk_someone_leaving(w))
        return nrs_wk_seterr(w, NRS_ERR_CHECKPOINT, "checkpoint of step %ld skipped: ranks of "
                             "the plan are retired or dead (the last one stays)", step);
    nout = nrs_wk_plan_outsiders(w, part, nrs_wk_plan_ranks(w, part), false, in, out);
    if (w->n > 1 && !in[w->me])
        return NRS_OK; /* holds nothing of the plan */
    void **bytes = nrs_wk_nomem(w, "checkpoint", step)
                       ? NULL : calloc((size_t)w->nmine + 1, sizeof(void *));
    int32_t ok = 0;
    if (!bytes) {
        snprintf(err, sizeof err, "out of memory: this rank voted no");
        ok = 1;
    } else if ((rc = nrs_wk_sync_host(w, 'd'))) { /* this rank votes no, with why */
        snprintf(err, sizeof err, "%.500s", w->err);
        ok = 1;
    }
    for (int k = 0; bytes && k < w->nmine; k++)
        bytes[k] = w->mem[w->mine[k]].ptr;
    if (!ok && nrs_ckpt_write(w->ckpt_dir, step, &w->st, w->mine, w->nmine, bytes, err, sizeof err))
        ok = 1;
    free(bytes);
    char why[512] = "";
    snprintf(name, sizeof name, "ck%ld", step);
    if (vote_all(w, (4ULL << 32) | w->plan.epoch, name, ok, out, nout, why, sizeof why))
        return nrs_wk_seterr(w, NRS_ERR_CHECKPOINT, "checkpoint of step %ld not published: %s",
                             step, ok ? err : why);
    int lowest = -1; /* the lowest rank of the plan publishes */
    for (int i = 0; i < w->n && lowest < 0; i++)
        if (in[i])
            lowest = i;
    if (lowest == w->me && nrs_ckpt_publish(w->ckpt_dir, step, &w->st, err, sizeof err))
        return nrs_wk_seterr(w, NRS_ERR_CHECKPOINT, "%s", err);
    return NRS_OK;
}

/* A transition whose state survives nowhere: the new plan's buffers from the
 * newest checkpoint. Prepare (read everything), vote, the controller's PONR,
 * then the old state goes. Before the PONR an abort leaves it intact. */
static int restore(nrs_worker_t *w, const nrs_plan_t *next, const int *nperm, const int *out,
                   int nout, int job_step)
{
    char err[512], why[512] = "", name[48];
    double t0 = nrs_now_s();
    long step = nrs_ckpt_latest(w->ckpt_dir);
    nrs_ckpt_t *ck = NULL;
    nrs_emu_state_t st2;
    memset(&st2, 0, sizeof st2);
    st2.max_gpu = -1;
    int g2 = -1, n2 = 0, rc = NRS_OK;
    int32_t ok = 0;
    for (int i = 0; i < next->total_gpus && w->n > 1; i++)
        if (nperm[i] == w->me)
            g2 = i;
    if (w->n == 1)
        g2 = 0;
    if (step < 0) {
        snprintf(err, sizeof err, "no checkpoint in %s", w->ckpt_dir);
        ok = 1;
    } else if (nrs_ckpt_open(&ck, w->ckpt_dir, step, err, sizeof err) ||
               nrs_emu_state_build(&w->spec, next, NRS_EMU_SEL_PERSISTENT, NULL, 0, &st2, err,
                                   sizeof err)) {
        ok = 1;
    }
    nrs_xmem_t *nm = calloc(st2.nbuf + 1, sizeof(*nm));
    long long nbytes = 0;
    if (!nm)
        ok = 1;
    for (size_t i = 0; !ok && i < st2.nbuf; i++) {
        const nrs_emu_buf_t *b = &st2.buf[i];
        if (b->gpu != g2)
            continue;
        if (w->x.ops->mem_alloc(w->x.ctx, b->gpu, (size_t)b->bytes, &nm[i])) {
            snprintf(err, sizeof err, "%lld bytes for buffer %zu", (long long)b->bytes, i);
            ok = 1;
        } else if (nrs_ckpt_fill(ck, b, nm[i].ptr, err, sizeof err)) {
            ok = 1;
        }
        n2++;
        nbytes += b->bytes;
    }
    nrs_ckpt_close(ck);
    /* the settle's memory before the vote: a rank without it votes no */
    const char *hook = nomem_hook(w);
    bool settles = !w->coll_ctl;
    void *sb = settles && !(hook && !strcmp(hook, "settle"))
                   ? malloc(NRS_DTRANS_SETTLE_BYTES(w->n)) : NULL;
    if (settles && !sb && !ok) {
        snprintf(err, sizeof err, "out of memory for the settle");
        ok = 1;
    }
    unsigned attempt = w->attempt++;
    snprintf(name, sizeof name, "rs%u", attempt);
    int d = vote_all(w, next->epoch, name, ok, out, nout, why, sizeof why) ? -1
                                                                           : nrs_wk_ctl_ponr(w, why,
                                                                                             sizeof why);
    if (d != -1 && settles)
        d = settle(w, next->epoch, d, sb, out, nout, attempt, why, sizeof why);
    free(sb);
    if (d) { /* the buffers read go at out */
        rc = nrs_wk_seterr(w, NRS_ERR_ABORTED, "transition %u -> %u: state lost on every replica; "
                           "restore from %s%s: %s; aborted before the point of no return: old "
                           "state intact", w->plan.epoch, next->epoch, w->ckpt_dir,
                           step >= 0 ? "" : " (none)", ok ? err : why);
        goto out;
    }
    /* past the point of no return: the new state is the checkpoint's */
    for (int i = 0; i < nout; i++) /* out of the job for good */
        w->dead[out[i]] = 1;
    int mk = w->mem_kind;
    nrs_wk_free_state(w);
    adopt_plan(w, next, nperm); /* this rank's GPU: g2 */
    if ((rc = nrs_wk_index_state(w)))
        goto out;
    if (w->st.nbuf != st2.nbuf) {
        rc = nrs_wk_seterr(w, NRS_ERR_PLAN, "restored state has %zu buffers, the plan %zu",
                           st2.nbuf, w->st.nbuf);
        goto out;
    }
    memcpy(w->mem, nm, sizeof(*nm) * st2.nbuf);
    memset(nm, 0, sizeof(*nm) * st2.nbuf);
    w->allocated = 1;
    w->mem_kind = mk;
    w->restored_step = step;
    w->job_step = job_step;
    w->broken = 0;
    free(w->present);
    w->present = NULL;
    set_last(w, NRS_DT_COMMITTED, t0, "restored epoch %u from the checkpoint of step %ld: %d "
             "buffer(s), %lld bytes here", next->epoch, step, n2, nbytes);
    snprintf(w->err, sizeof w->err, "transition: %s", w->last.msg);
    rc = nrs_wk_sync_host(w, 'h');
out:
    /* what was read and not taken into w->mem (an abort; past the point of
     * no return, a failed index or a buffer count that differs) */
    for (size_t i = 0; nm && i < st2.nbuf; i++)
        if (nm[i].ptr)
            w->x.ops->mem_free(w->x.ctx, &nm[i]);
    free(nm);
    nrs_emu_state_free(&st2);
    return rc;
}
