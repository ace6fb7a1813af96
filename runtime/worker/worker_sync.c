/* The worker API: the step boundary (the agreement on PREPARE and WORLD) and
 * the per-step weight sync (worker_int.h). */
#define _GNU_SOURCE
#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "emu/graph.h"
#include "emu/pattern.h"
#include "util/util.h"
#include "worker/dtrans.h"
#include "worker/worker_int.h"

/* ---- the step boundary and the per-step weight sync ----------------------------- */

/* Ranks of the current plan (they hold its GPUs) that have not said they leave. */
int nrs_wk_plan_ranks(const nrs_worker_t *w, int *part)
{
    int n = 0;
    for (int g = 0; g < w->plan.total_gpus && g < w->n; g++)
        if (w->n == 1 || !w->leaving[w->perm[g]])
            part[n++] = w->n == 1 ? 0 : w->perm[g];
    return w->n == 1 ? 1 : n;
}

/* Who is left out of a collective of the plan's ranks part[0, np): every other
 * rank, and with skip_gone the ones the step agreement found dead (never this
 * one). in[r] = 1 for the participants. Returns how many are out. */
int nrs_wk_plan_outsiders(const nrs_worker_t *w, const int *part, int np, bool skip_gone,
                          unsigned char *in, int *out)
{
    int nout = 0;
    for (int i = 0; i < np; i++)
        in[part[i]] = 1;
    for (int i = 0; i < w->n; i++)
        if (!in[i] || (skip_gone && w->gone[i] && i != w->me))
            out[nout++] = i;
    return nout;
}

int nrs_wk_someone_leaving(const nrs_worker_t *w)
{
    for (int g = 0; w->n > 1 && g < w->plan.total_gpus && g < w->n; g++)
        if (w->leaving[w->perm[g]] || w->gone[w->perm[g]])
            return 1;
    return 0;
}

#define AGREE_LEAVING 0x80000000u

/* Every rank of the plan publishes the PREPARE it holds (0: none), or that it
 * leaves (retired by the controller: AGREE_LEAVING), the newest epoch it
 * knows the controller aborted and its transition counter; the largest epoch, or 0 when some rank knows
 * that one was aborted (the others learn it from their own ABORT). The ranks
 * that leave are left out of every later collective of this epoch. */
/* NRS_WORKER_CORRUPT_SYNC=RANK:N: in every weight sync, rank RANK's Nth
 * received transfer (from 0) arrives with one byte flipped: the tests'
 * check of runtime.verify on the syncs. -1: off. */
static int64_t corrupt_hook(const nrs_worker_t *w)
{
    const char *k = getenv("NRS_WORKER_CORRUPT_SYNC");
    char *end;
    if (!k || strtol(k, &end, 10) != w->me || *end != ':')
        return -1;
    return strtoll(end + 1, NULL, 10);
}

/* NRS_WORKER_SYNC_FAIL=RANK:N: rank RANK's Nth weight sync (from 0, counting
 * those that committed or failed) fails on that rank alone before its
 * transfers, as a failed copy of the GPU weights to the host does: the tests'
 * check that such a rank still takes part in the sync's votes. */
static int sync_fail_hook(nrs_worker_t *w)
{
    const char *k = getenv("NRS_WORKER_SYNC_FAIL");
    char *end;
    long long n = w->sync_steps + w->sync_failed;
    if (!k || strtol(k, &end, 10) != w->me || *end != ':' || strtoll(end + 1, NULL, 10) != n)
        return 0;
    return nrs_wk_seterr(w, NRS_ERR_XPORT, "test hook: weight sync %lld fails on this rank", n);
}

/* The step agreement's memory (w->agree_mem) for a world of n ranks. */
typedef struct {
    int *part, *out;       /* [n + 1] */
    uint32_t *all;         /* [4 (n + 1)] */
    unsigned char *in, *got; /* [n + 1] */
} agree_mem_t;

static size_t agree_bytes(int n)
{
    return ((size_t)n + 1) * (2 * sizeof(int) + 4 * sizeof(uint32_t) + 2);
}

int nrs_wk_agree_mem(nrs_worker_t *w, int n)
{
    void *p = realloc(w->agree_mem, agree_bytes(n));
    if (!p)
        return -1;
    w->agree_mem = p;
    return 0;
}

static agree_mem_t agree_mem(const nrs_worker_t *w)
{
    agree_mem_t a;
    size_t n1 = (size_t)w->n + 1;
    a.part = w->agree_mem;
    a.out = a.part + n1;
    a.all = (uint32_t *)(a.out + n1);
    a.in = (unsigned char *)(a.all + 4 * n1);
    a.got = a.in + n1;
    memset(a.in, 0, n1);
    return a;
}

void nrs_wk_plan_arrays(const nrs_worker_t *w, int **part, int **out, unsigned char **in)
{
    agree_mem_t a = agree_mem(w);
    *part = a.part;
    *out = a.out;
    *in = a.in;
}

/* One gather of the step agreement among the plan's ranks (those found gone
 * left out): v[nv] from each into a.all, in a.got; a participant whose value
 * never came is gone (and dead) from now on, the same on every rank: the
 * gather collected it or not. The participants in a.part, how many (-1: the
 * gather failed, err says why). No memory of its own (w->agree_mem): a rank
 * that left the agreement out paired its next collective with the others'
 * agreement (PMIx fences match by who takes part). */
static int agree_gather(nrs_worker_t *w, const uint32_t *v, int nv, agree_mem_t *a, char *err,
                        size_t errlen)
{
    char name[48];
    int np = nrs_wk_plan_ranks(w, a->part);
    int nout = nrs_wk_plan_outsiders(w, a->part, np, true, a->in, a->out);
    uint64_t key = (2ULL << 32) | w->plan.epoch;
    snprintf(name, sizeof name, "ag%u", w->agree_n++);
    if (nrs_wk_coll_gather(w, key, name, v, sizeof(uint32_t) * (size_t)nv, a->out, nout, a->all,
                           a->got, err, errlen))
        return -1;
    for (int i = 0; i < np; i++) {
        int r = a->part[i];
        if (r != w->me && !w->gone[r] && !a->got[r])
            w->gone[r] = w->dead[r] = 1;
    }
    return np;
}

static unsigned agree_prepare(nrs_worker_t *w, unsigned mine)
{
    char err[384];
    unsigned best = mine, aborted = w->aborted_epoch;
    uint32_t v[4] = {mine, w->world_pend ? w->world_pend->gen : w->world_gen, w->aborted_epoch,
                     w->attempt};
    unsigned attempt = w->attempt;
    agree_mem_t a = agree_mem(w);
    w->agreed_world = v[1];
    int np = agree_gather(w, v, 4, &a, err, sizeof err);
    for (int i = 0; i < np; i++) {
        int r = a.part[i];
        if (r == w->me || w->gone[r])
            continue;
        const uint32_t *o = a.all + 4 * (size_t)r;
        if (o[1] > w->agreed_world)
            w->agreed_world = o[1];
        aborted = o[2] > aborted ? o[2] : aborted;
        attempt = o[3] > attempt ? o[3] : attempt;
        if (o[0] & AGREE_LEAVING)
            w->leaving[r] = 1;
        else if (o[0] > best)
            best = o[0];
    }
    /* the transition counter names every vote and tag of the next one: a rank
     * that missed one (it lacked the PREPARE the others ran) catches up */
    w->attempt = attempt;
    if (!(best & AGREE_LEAVING) && best <= aborted)
        best = 0;
    return best & AGREE_LEAVING ? 0 : best;
}

/* What the agreement named (a WORLD, a PREPARE) and this rank lacks when it
 * should take it: every rank of the plan says whether it has it, in one more
 * gather, and all take it only if all have it. A rank that went on without
 * it (an error for it, the others in the world switch's or the transition's
 * collectives) paired its next collective with theirs: over PMIx the
 * fences matched wrongly, through the controller the others waited for it
 * to their time-out, took it for dead, and its gathers no longer matched
 * theirs. The first rank that lacks it (this one when the gather failed and
 * it lacks it), or -1. */
static int agree_have(nrs_worker_t *w, bool lacking)
{
    char err[384];
    uint32_t v = lacking;
    agree_mem_t a = agree_mem(w);
    int np = agree_gather(w, &v, 1, &a, err, sizeof err), who = -1;
    if (np < 0)
        return lacking ? w->me : -1; /* this rank's own word */
    for (int i = 0; i < np; i++) {
        int r = a.part[i];
        if ((r == w->me ? lacking : !w->gone[r] && a.all[r]) && (who < 0 || r < who))
            who = r;
    }
    return who;
}

/* A PREPARE(e) some rank lacks: no rank runs it; those that hold it tell the
 * controller they could not prepare (it aborts now, not at its time-out, and
 * retries under a new epoch). */
static int prepare_lacked(nrs_worker_t *w, unsigned e, int who)
{
    bool mine = w->prep_epoch == e;
    w->prep_epoch = 0;
    if (mine)
        nrs_wk_ctl_ack(w, e, NRS_MSG_PREPARE, 1, 0);
    if (who == w->me)
        return nrs_wk_seterr(w, NRS_ERR_ABORTED, "epoch %u: the others have its PREPARE, this "
                             "rank has not (control: %s): no rank runs it, old epoch intact", e,
                             nrs_worker_control(w));
    return nrs_wk_seterr(w, NRS_ERR_ABORTED, "epoch %u: rank %d has not its PREPARE: no rank "
                         "runs it, old epoch intact", e, who);
}

/* Reads the channel until done(w, arg) or the end (keeping a PREPARE). */
static void wait_for(nrs_worker_t *w, double end, bool (*done)(const nrs_worker_t *, unsigned),
                     unsigned arg)
{
    nrs_hdr_t h;
    int rc;
    while (!done(w, arg) && w->ctl_fd >= 0 && nrs_awake_s() < end) {
        int k = nrs_wk_ctl_recv(w, end - nrs_awake_s(), &h);
        if (k < 0)
            break;
        if (k > 0 && (rc = nrs_wk_ctl_frame(w, &h)) < 0 && rc != NRS_ERR_PLAN)
            break;
    }
}

static bool has_world(const nrs_worker_t *w, unsigned gen)
{
    return w->world_pend && w->world_pend->gen >= gen;
}

static bool has_prepare(const nrs_worker_t *w, unsigned e)
{
    return w->prep_epoch == e;
}

/* The world the agreement named: every rank switches, or none (a rank
 * lacks its WORLD: its generation is dropped on every rank). */
static int switch_world(nrs_worker_t *w, double end)
{
    unsigned gen = w->agreed_world;
    wait_for(w, end, has_world, gen);
    nrs_msg_world_t *m = w->world_pend;
    int who = agree_have(w, !(m && m->gen == gen));
    w->world_pend = NULL;
    int rc = who < 0 ? nrs_wk_world_switch(w, m) : NRS_OK;
    free(m);
    if (who < 0)
        return rc;
    w->world_dropped = gen; /* its WORLD, if it comes, is stale */
    if (who == w->me)
        return nrs_wk_seterr(w, NRS_ERR_RDV, "world %u: this rank has no WORLD from the "
                             "controller (control: %s): no rank switches, the world stays as it "
                             "was", gen, nrs_worker_control(w));
    return nrs_wk_seterr(w, NRS_ERR_RDV, "world %u: rank %d has no WORLD from the controller: no "
                         "rank switches, the world stays as it was", gen, who);
}

int nrs_worker_control_step(nrs_worker_t *w)
{
    nrs_hdr_t h;
    int rc = NRS_OK;
    if (nrs_wk_unusable(w, __func__))
        return NRS_ERR_INVAL;
    int in_plan = w->n > 1 && w->have_plan && w->my_gpu >= 0 && w->allocated;
    if (w->retired) {
        if (in_plan && !w->leaving[w->me]) { /* told by a REPORT's refusal: say so */
            agree_prepare(w, AGREE_LEAVING);
            w->leaving[w->me] = 1;
        }
        return nrs_wk_retired_err(w, __func__);
    }
    if (!in_plan)
        return nrs_worker_control_poll(w, 0); /* nobody to agree with */
    w->defer = 1;
    while (w->ctl_fd >= 0 && rc >= 0 && nrs_wk_ctl_recv(w, 0, &h) > 0)
        rc = nrs_wk_ctl_frame(w, &h);
    if (w->retired) { /* the others learn it here and stop waiting for this rank */
        w->defer = 0;
        agree_prepare(w, AGREE_LEAVING);
        w->leaving[w->me] = 1;
        return NRS_ERR_RETIRED;
    }
    if (rc < 0 && rc != NRS_ERR_PLAN) {
        w->defer = 0;
        return rc;
    }
    unsigned e = agree_prepare(w, w->prep_epoch);
    /* someone has it: it reaches this rank too (the controller sends it to
     * all), unless this rank's channel failed; all take it or none */
    double end = nrs_awake_s() + w->timeout_s;
    if (w->agreed_world > w->world_gen && (rc = switch_world(w, end))) {
        w->defer = 0;
        return rc;
    }
    int who = -1;
    if (e) {
        wait_for(w, end, has_prepare, e);
        who = agree_have(w, w->prep_epoch != e || w->retired);
    }
    w->defer = 0;
    if (w->retired)
        return NRS_ERR_RETIRED;
    if (!e)
        return NRS_OK;
    if (who >= 0)
        return prepare_lacked(w, e, who);
    w->prep_epoch = 0;
    return nrs_wk_ctl_prepare(w, e);
}

/* The persistent buffers of the actor's two engines, sorted by what a buffer
 * is, so that each of the sync graph's buffers finds its state buffer in
 * O(log n): a linear search per buffer was quadratic in the plan's size
 * (minutes per epoch at 1,024 GPUs). */
typedef struct {
    int32_t ms, gpu, role, tensor, kind;
    nrs_emu_rect_t box;
    int32_t idx;
} skey_t;

static skey_t state_key(const nrs_emu_buf_t *b, int ms, int32_t idx)
{
    return (skey_t){ms, b->gpu, b->role, b->tensor, b->kind, b->box, idx};
}

static int skey_cmp(const void *x, const void *y) /* idx last: the first of equals wins */
{
    const skey_t *a = x, *b = y;
    const int32_t ka[] = {a->ms, a->gpu, a->role, a->tensor, a->kind, a->box.r0, a->box.r1,
                          a->box.c0, a->box.c1, a->idx};
    const int32_t kb[] = {b->ms, b->gpu, b->role, b->tensor, b->kind, b->box.r0, b->box.r1,
                          b->box.c0, b->box.c1, b->idx};
    for (size_t i = 0; i < sizeof ka / sizeof ka[0]; i++)
        if (ka[i] != kb[i])
            return ka[i] < kb[i] ? -1 : 1;
    return 0;
}

static skey_t *state_index(const nrs_worker_t *w, size_t *n)
{
    skey_t *v = malloc(sizeof(*v) * (w->st.nbuf + 1));
    *n = 0;
    if (!v)
        return NULL;
    for (size_t i = 0; i < w->st.nbuf; i++) {
        int ms = w->st.eng[w->st.buf[i].engine].ms;
        if (ms == NRS_MS_ACTOR_TRAIN || ms == NRS_MS_ACTOR_GENERATE)
            v[(*n)++] = state_key(&w->st.buf[i], ms, (int32_t)i);
    }
    qsort(v, *n, sizeof(*v), skey_cmp);
    return v;
}

/* The persistent buffer of engine model-stage ms that b is, -1 if none. */
static int find_state(const skey_t *v, size_t n, const nrs_emu_buf_t *b, int ms)
{
    skey_t k = state_key(b, ms, -1); /* below every idx: the first of equals */
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (skey_cmp(&v[mid], &k) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo < n) {
        k.idx = v[lo].idx;
        if (!skey_cmp(&v[lo], &k))
            return v[lo].idx;
    }
    return -1;
}

static int sync_build(nrs_worker_t *w)
{
    char err[512];
    nrs_emu_opts_t eo;
    nrs_emu_opts_init(&eo);
    eo.chunk_bytes = (int64_t)nrs_wk_env_double("NRS_WORKER_CHUNK", 0, 0, 0x1p40);
    if (nrs_emu_weight_sync(&w->spec, &w->plan, &eo, &w->sg, err, sizeof err))
        return nrs_wk_seterr(w, NRS_ERR_PLAN, "weight sync of epoch %u: %s", w->plan.epoch, err);
    const nrs_emu_graph_t *g = w->sg;
    size_t nk = 0;
    skey_t *keys = state_index(w, &nk);
    w->stmap = calloc((size_t)g->nold + 1, sizeof(int));
    w->sgidx = calloc((size_t)g->nnew + 1, sizeof(int));
    w->sgmem = calloc((size_t)g->nnew + 1, sizeof(*w->sgmem));
    if (!keys || !w->stmap || !w->sgidx || !w->sgmem) {
        free(keys);
        return nrs_wk_seterr(w, NRS_ERR_NOMEM, "out of memory");
    }
    for (int32_t i = 0; i < g->nold; i++)
        if ((w->stmap[i] = find_state(keys, nk, &g->buf[i].b, NRS_MS_ACTOR_TRAIN)) < 0 &&
            nrs_wk_buf_rank(w, &g->buf[i].b) == w->me) {
            free(keys);
            return nrs_wk_seterr(w, NRS_ERR_PLAN, "weight sync: train buffer %d is not in the "
                                 "state", i);
        }
    for (int32_t j = 0; j < g->nnew; j++) {
        const nrs_emu_gbuf_t *b = &g->buf[g->nold + j];
        w->sgidx[j] = b->alias >= 0 && b->alias < g->nold
                          ? w->stmap[b->alias]
                          : find_state(keys, nk, &b->b, NRS_MS_ACTOR_GENERATE);
    }
    free(keys);
    return 0;
}

static void *gen_ptr(const nrs_worker_t *w, int j)
{
    return w->sgidx[j] >= 0 ? w->mem[w->sgidx[j]].ptr : w->sgmem[j].ptr;
}

/* Generation buffer j of this rank against the pattern: 0 ok, 1 mismatch, -1 not here. */
static int gen_check(const nrs_worker_t *w, int j, unsigned char *scratch)
{
    const nrs_emu_buf_t *b = &w->sg->buf[w->sg->nold + j].b;
    if (nrs_wk_buf_rank(w, b) != w->me)
        return -1;
    const void *p = gen_ptr(w, j);
    return !p || nrs_emu_checksum(p, (size_t)b->bytes) != nrs_emu_pattern_checksum(b, scratch);
}

static int64_t gen_max_bytes(const nrs_worker_t *w)
{
    int64_t m = 1;
    for (int32_t j = 0; j < w->sg->nnew; j++)
        if (w->sg->buf[w->sg->nold + j].b.bytes > m)
            m = w->sg->buf[w->sg->nold + j].b.bytes;
    return m;
}

int nrs_worker_weight_sync(nrs_worker_t *w)
{
    int rc;
    if ((rc = nrs_wk_cannot_act(w, __func__)))
        return rc;
    if (!w->have_plan || !w->allocated || w->broken)
        return nrs_wk_seterr(w, NRS_ERR_INVAL, "nrs_worker_weight_sync: %s", w->broken
                             ? "the state is partial (a transition failed past its point of no "
                               "return)"
                             : "no plan or no state");
    if (!w->plan.has[NRS_MS_ACTOR_TRAIN] || !w->plan.has[NRS_MS_ACTOR_GENERATE])
        return nrs_wk_seterr(w, NRS_ERR_PLAN, "nrs_worker_weight_sync: the plan of epoch %u has no "
                             "actor.train and actor.generate", w->plan.epoch);
    if (w->n > 1 && w->my_gpu < 0)
        return NRS_OK; /* not in the plan */
    if (nrs_wk_someone_leaving(w)) {
        w->sync_failed++;
        return nrs_wk_seterr(w, NRS_ERR_ABORTED, "weight sync of epoch %u: skipped, ranks of the "
                             "plan are retired or dead (waiting for the transition without "
                             "them)", w->plan.epoch);
    }
    /* A failure of this rank alone (its memory, its GPU copy): it still takes
     * part in the sync's votes, saying no, so that every rank aborts the sync
     * alike and counts it (sync_n): a rank that left them out paired its next
     * collective, the step agreement, with the others' hash vote. Only the
     * graph's own failure (the same plan and spec everywhere) skips them. */
    int lrc = w->sg ? 0 : sync_build(w), keep = !lrc; /* keep the graph for the next sync */
    if (lrc && !w->sg) {
        nrs_wk_sync_free(w); /* the epoch's agreements and gone ranks stand */
        return lrc;
    }
    const nrs_emu_graph_t *g = w->sg;
    nrs_xmem_t *om = calloc((size_t)g->nold + 1, sizeof(*om));
    nrs_xmem_t *nm = calloc((size_t)g->nnew + 1, sizeof(*nm));
    int *out = calloc((size_t)w->n + 1, sizeof(int)), nout = 0;
    if (!out) { /* not even who votes is known here */
        free(om);
        free(nm);
        if (!keep)
            nrs_wk_sync_free(w);
        return nrs_wk_seterr(w, NRS_ERR_NOMEM, "out of memory");
    }
    if (!lrc && (!om || !nm))
        lrc = nrs_wk_seterr(w, NRS_ERR_NOMEM, "out of memory");
    for (int32_t i = 0; !lrc && i < g->nold; i++)
        if (w->stmap[i] >= 0)
            om[i] = w->mem[w->stmap[i]];
    for (int g2 = w->plan.total_gpus; w->n > 1 && g2 < w->n; g2++)
        out[nout++] = w->perm[g2]; /* ranks without a GPU of the plan */
    if (!lrc && (rc = nrs_wk_sync_host(w, 'd')))
        lrc = rc;
    if (!lrc && (rc = sync_fail_hook(w)))
        lrc = rc;
    nrs_dtrans_opts_t o;
    nrs_wk_dtrans_opts(w, &o);
    /* tags of the syncs' own (never a transition's); keys: its own epoch tag, one
     * per sync */
    uint64_t tag = (1ULL << 63) | ((uint64_t)w->sync_n << 32) | w->plan.epoch;
    /* sync_n starts again each epoch (a joiner's count agrees with the others'
     * from its first epoch): the epoch moves the tags on, so two syncs share
     * tags only 128 apart in an epoch, or 64 in the next */
    o.sync_tags = true;
    o.attempt = w->plan.epoch * 64u + w->sync_n++;
    o.out_ranks = out;
    o.nout = nout;
    o.verify = nrs_wk_verify_on(w); /* host memory: the sync stages GPU weights */
    o.corrupt_recv = corrupt_hook(w);
    o.fail_local = lrc != 0;
    nrs_dtrans_result_t res;
    if (lrc) {
        char why[sizeof w->err];
        snprintf(why, sizeof why, "%s", w->err);
        nrs_dtrans_run(g, tag, &w->x, nrs_wk_job_rdv(w), NULL, NULL, &o, &res);
        free(om);
        free(nm);
        free(out);
        if (!keep)
            nrs_wk_sync_free(w);
        w->sync_failed++;
        return nrs_wk_seterr(w, lrc, "weight sync of epoch %u: %.400s; this rank voted no: the "
                             "sync aborted on every rank, the state intact", w->plan.epoch, why);
    }
    int oc = nrs_dtrans_run(g, tag, &w->x, nrs_wk_job_rdv(w), om, nm, &o, &res);
    free(om);
    free(out);
    w->sync_verified += res.bytes_verified;
    if (oc != NRS_DT_COMMITTED) { /* nothing old is freed by a sync: the state is intact */
        for (int32_t j = 0; j < g->nnew; j++)
            if (nm[j].ptr && !(g->buf[g->nold + j].alias >= 0))
                w->x.ops->mem_free(w->x.ctx, &nm[j]);
        free(nm);
        w->sync_failed++;
        return nrs_wk_seterr(w, NRS_ERR_ABORTED, "weight sync of epoch %u: %s", w->plan.epoch,
                             res.msg);
    }
    for (int32_t j = 0; j < g->nnew; j++) {
        if (g->buf[g->nold + j].alias >= 0)
            continue; /* the train buffer itself */
        if (w->sgidx[j] >= 0) { /* persistent on its own pool: the new contents replace it */
            nrs_xmem_t *m = &w->mem[w->sgidx[j]];
            if (m->ptr)
                w->x.ops->mem_free(w->x.ctx, m);
            *m = nm[j];
        } else {
            if (w->sgmem[j].ptr)
                w->x.ops->mem_free(w->x.ctx, &w->sgmem[j]);
            w->sgmem[j] = nm[j];
        }
    }
    free(nm);
    if ((rc = nrs_wk_sync_host(w, 'h')))
        return rc;
    w->synced = 1;
    w->sync_steps++;
    w->sync_no_vote += res.no_vote;
    w->sync_last_s = res.total_s;
    w->sync_total_s += res.total_s;
    w->sync_last_bytes = res.bytes_recv;
    w->sync_bytes += res.bytes_recv;
    /* one shard of this rank, a different one each step */
    int mine = 0;
    for (int32_t j = 0; j < g->nnew; j++)
        mine += nrs_wk_buf_rank(w, &g->buf[g->nold + j].b) == w->me;
    if (!mine)
        return NRS_OK;
    unsigned char *scratch = malloc((size_t)gen_max_bytes(w));
    if (!scratch)
        return nrs_wk_seterr(w, NRS_ERR_NOMEM, "nrs_worker_weight_sync: out of memory");
    int pick = (int)(w->sync_sample++ % (unsigned)mine), bad = 0;
    for (int32_t j = 0; j < g->nnew; j++) {
        if (nrs_wk_buf_rank(w, &g->buf[g->nold + j].b) != w->me || pick--)
            continue;
        bad = gen_check(w, j, scratch) == 1;
        w->sync_sampled++;
        break;
    }
    free(scratch);
    return bad ? nrs_wk_seterr(w, NRS_ERR_VERIFY, "weight sync of epoch %u: a generation shard "
                               "does not match", w->plan.epoch) : NRS_OK;
}

double nrs_worker_sync_stat(const nrs_worker_t *w, int which)
{
    if (!w) {
        nrs_wk_nohandle(__func__);
        return 0;
    }
    switch (which) {
    case NRS_SS_STEPS: return (double)w->sync_steps;
    case NRS_SS_FAILED: return (double)w->sync_failed;
    case NRS_SS_BYTES: return (double)w->sync_bytes;
    case NRS_SS_LAST_S: return w->sync_last_s;
    case NRS_SS_LAST_BYTES: return (double)w->sync_last_bytes;
    case NRS_SS_TOTAL_S: return w->sync_total_s;
    case NRS_SS_SAMPLED: return (double)w->sync_sampled;
    case NRS_SS_BYTES_VERIFIED: return (double)w->sync_verified;
    case NRS_SS_NO_VOTE: return (double)w->sync_no_vote;
    default: return 0;
    }
}

int nrs_worker_verify_generation(nrs_worker_t *w, long long *verified, long long *mismatches)
{
    long long v = 0, m = 0;
    int rc;
    nrs_wk_counts(verified, mismatches, 0, 0);
    if ((rc = nrs_wk_unusable(w, __func__)))
        return rc;
    if (!w->sg || !w->synced)
        return nrs_wk_seterr(w, NRS_ERR_INVAL, "nrs_worker_verify_generation: no weight sync since "
                             "epoch %d began: nothing to check", nrs_worker_epoch(w));
    unsigned char *scratch = malloc((size_t)gen_max_bytes(w));
    if (!scratch)
        return nrs_wk_seterr(w, NRS_ERR_NOMEM, "nrs_worker_verify_generation: out of memory");
    if ((rc = nrs_wk_sync_host(w, 'd'))) {
        free(scratch);
        return rc;
    }
    for (int32_t j = 0; j < w->sg->nnew; j++) {
        int r = gen_check(w, j, scratch);
        if (r < 0)
            continue;
        v++;
        m += r;
    }
    free(scratch);
    nrs_wk_counts(verified, mismatches, v, m);
    return m ? nrs_wk_seterr(w, NRS_ERR_VERIFY, "nrs_worker_verify_generation: %lld of %lld "
                             "generation shard(s) do not match the pattern", m, v) : NRS_OK;
}
