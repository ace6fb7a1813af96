/* mp_transition: one rank of a distributed transition, run under pmix_srv.
 *
 *   mp_transition [--seed N] [--count K] [--chunk BYTES] [--timeout S] [--fan]
 *                 [--suspend S]
 *
 * Every rank draws the same K random (spec, old plan, new plan) triples from
 * the seed (reshards, dp up and down, migrations, pools moving), builds the
 * transition graph itself (only the inputs are shared; the
 * ranks check by exchanging the graph's hash), and executes its own
 * operations over UCX through the executor's transport table: buffers of
 * physical GPU g live on rank g, host staging buffers on the rank of the GPU
 * they were staged from. Afterwards each rank verifies the checksum of every
 * shard it holds against the pattern (and, for weight syncs, the old state).
 *
 * The ops run through the library's distributed executor (runtime/worker/
 * dtrans: several transfers in flight, a vote at the point of no return and
 * at the end); the worker API (tests/mp/mp_worker.c) drives the same code.
 *
 *   mp_transition --nccl ...
 *
 * The same over NCCL (runtime/xfer/xport_nccl, built with HAVE_NCCL): every
 * buffer in GPU memory (GPU NRS_MP_DEVICE, default 0), rank 0's unique id
 * through the rendezvous, the pattern written and checked through host
 * copies. NRS_MP_KILL=RANK:OPS: that rank SIGKILLs itself after OPS of its
 * own operations (dtrans' test hook); the others must see the transition
 * abort with their old state intact, which they check and report as
 * "aborted, old state intact", exiting 3.
 *
 * --fan: instead of random plans, one actor at tp 1 (all on GPU 0) to tp N
 * over all N ranks and back, in turn: rank 0 sends to (then receives from)
 * every other rank, the widest fan-out a rank can have.
 *
 * --tight: each transition under a per-GPU cap of the larger of that GPU's
 * old and new state (plus the transfer reserve), so that some must stage
 * through host memory: transfers then come from host buffers, sent by the
 * rank of the GPU they were staged from.
 *
 * --mem-check (with --nccl, under tests/fakegpu): each rank's GPU may hold
 * no more than the schedule's peak for it (its state at the worst moment
 * plus the transfer reserve, nrs_emu_graph_peak): FAKE_MEM_CAP is set to
 * that for the transition, so an allocation beyond it fails the
 * transition; the peak the fake saw is printed with the groups NCCL ran
 * and this rank's strided transfers.
 *
 * --snug: each transition under the smallest per-GPU cap (to 1/32 of the
 * range) whose schedule stages nothing (NCCL moves no host memory), found
 * by bisection between the larger of a GPU's old and new state plus the
 * reserve and the uncapped schedule's peak: old buffers are freed just as
 * the allocations after them need the room.
 *
 * --verify: the executor checksums every transfer (runtime.verify).
 * NRS_MP_CORRUPT_WIRE=RANK:N: the Nth transfer that rank receives arrives
 * with a byte flipped (dtrans' test hook); with --verify every rank must
 * abort with its old state intact, exiting 3.
 *
 * --suspend S (UCX): what Slurm does to a suspended job (scontrol suspend,
 * then resume), in the middle of a transition: rank 0 SIGSTOPs every other
 * rank as it posts a receive; if the progress call after it leaves a
 * transfer waiting (the sender had not sent it all), it stops itself too,
 * for S seconds (longer than --timeout, the executor's stall time-out), and
 * they are resumed, rank 0 first, the others 0.2 s later; else it resumes
 * them and tries again at its next receive. No peer failed: every transition must
 * commit and verify (before: rank 0's executor had counted the stop in its
 * stall clock and failed at once, "no transfer completed for 2.0 s").
 *
 * NRS_MP_STALE=1: before the first transition, the sender of its first
 * transfer between two ranks sends a message of the same size and tag (run
 * and op) full of 0xee: what a run 128 earlier that aborted before the
 * receiver posted its receive leaves there. The transition must not take it.
 */
#define _GNU_SOURCE
#include <config.h>

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>

#include "emu/graph.h"
#include "mp_suspend.h"
#include "emu/pattern.h"
#include "emu/testutil.h"
#include "emu/xport.h"
#include "rdv/rdv.h"
#include "util/util.h"
#include "worker/dtrans.h"
#include "xfer/ucx.h"
#include "xfer/xport_ucx.h"
#ifdef HAVE_NCCL
#include "xfer/nccl.h"
#include "xfer/xport_nccl.h"
#endif

typedef struct {
    int64_t xfers, bytes, verified, errors, max_inflight;
    double exec_s; /* the executor's run (nrs_dtrans_run) */
    int64_t hashed; /* bytes the executor hashed (--verify) */
    int aborted; /* NRS_MP_KILL: aborted as it should, old state checked */
    char first[512];
} rx_t;

static void note(rx_t *E, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note(rx_t *E, const char *fmt, ...)
{
    va_list ap;
    E->errors++;
    if (E->first[0])
        return;
    va_start(ap, fmt);
    vsnprintf(E->first, sizeof E->first, fmt, ap);
    va_end(ap);
}

static bool probe(void *arg, int rank)
{
    return nrs_rdv_peer_failed(arg, rank);
}

static bool ucx_dead(void *arg, int rank) { return nrs_ucx_peer_failed(arg, rank); }
static void ucx_cancel(void *arg) { nrs_xport_ucx_cancel(arg); }
static void ucx_purge(void *arg, uint64_t tag, uint64_t mask)
{
    nrs_xport_ucx_purge(arg, tag, mask);
}
static const char *ucx_error(const nrs_xport_t *x) { return nrs_xport_ucx_error(x); }

/* tests/fakegpu's, when it is preloaded (weak: NULL otherwise) */
void fakegpu_mem_stats(int dev, int reset, size_t *used, size_t *peak, long *groups)
    __attribute__((weak));

/* --suspend: the UCX transport's table with send, recv and progress
 * counting the posts and their completions (progress returns those) */
static double suspend_s;
static pid_t *job_pids;
static int job_n;
static const nrs_xport_ops_t *sh_real;
static nrs_xport_ops_t sh_ops;
static int64_t sh_posted, sh_done;
static pid_t sh_resumer; /* 0: not suspended yet */
static int sh_armed;     /* the others are stopped: a receive was just posted */

static int sh_send(void *ctx, int peer, const nrs_xregion_t *src, uint64_t tag, nrs_xreq_t *req)
{
    int rc = sh_real->send(ctx, peer, src, tag, req);
    sh_posted += rc == 0;
    return rc;
}

static int sh_recv(void *ctx, int peer, const nrs_xregion_t *dst, uint64_t tag, nrs_xreq_t *req)
{
    if (!sh_resumer && !sh_armed) {
        mp_signal_others(job_pids, job_n, SIGSTOP);
        sh_armed = 1;
    }
    int rc = sh_real->recv(ctx, peer, dst, tag, req);
    sh_posted += rc == 0;
    return rc;
}

static int sh_progress(void *ctx)
{
    int n = sh_real->progress(ctx);
    sh_done += n > 0 ? n : 0;
    if (sh_armed) {
        sh_armed = 0;
        if (n >= 0 && sh_posted > sh_done) /* a transfer waits for a (stopped) peer */
            sh_resumer = mp_suspend_job(job_pids, job_n, suspend_s, "mid-transition");
        else
            mp_signal_others(job_pids, job_n, SIGCONT);
    }
    return n;
}

static void suspend_shim(nrs_xport_t *x)
{
    sh_real = x->ops;
    sh_ops = *x->ops;
    sh_ops.send = sh_send;
    sh_ops.recv = sh_recv;
    sh_ops.progress = sh_progress;
    x->ops = &sh_ops;
}

static int use_nccl; /* --nccl: buffers in GPU memory, reached through host copies */
static int nccl_dev; /* their GPU: $NRS_MP_DEVICE, else 0 */
static int use_verify; /* --verify: the executor checksums every transfer */
#ifdef HAVE_NCCL
/* No UCX traffic while NCCL moves the bytes: look for dead peers all the same. */
static bool ucx_gone(void *arg, int rank) { return nrs_ucx_check_peer(arg, rank); }
static void nccl_cancel(void *arg) { nrs_xport_nccl_cancel(arg); }
static const char *nccl_error(const nrs_xport_t *x) { return nrs_xport_nccl_error(x); }
#endif

/* Bytes of m into host memory h (m->bytes of them), or from h into m. */
static int mem_io(nrs_xmem_t *m, unsigned char *h, char dir)
{
#ifdef HAVE_NCCL
    char err[256];
    if (use_nccl && m->owner >= 0) {
        int rc = dir == 'd' ? nrs_cuda_copy(nccl_dev, h, m->ptr, m->bytes, 'd', err, sizeof err)
                            : nrs_cuda_copy(nccl_dev, m->ptr, h, m->bytes, 'h', err, sizeof err);
        if (rc)
            fprintf(stderr, "mp_transition: %s\n", err);
        return rc;
    }
#endif
    if (dir == 'd')
        memcpy(h, m->ptr, m->bytes);
    else
        memcpy(m->ptr, h, m->bytes);
    return 0;
}

static int identity(void *arg, int owner)
{
    (void)arg;
    return owner;
}

static void check(rx_t *E, nrs_xmem_t *m, const nrs_emu_buf_t *want, unsigned char *scratch,
                  unsigned char *host)
{
    E->verified++;
    if (!m->ptr)
        note(E, "GPU %d: a shard is missing", want->gpu);
    else if (mem_io(m, host, 'd'))
        note(E, "GPU %d: cannot read a shard back", want->gpu);
    else if (nrs_emu_checksum(host, (size_t)want->bytes) !=
             nrs_emu_pattern_checksum(want, scratch))
        note(E, "GPU %d: checksum mismatch", want->gpu);
}

/* This rank's part of g through the library's executor (runtime/worker/
 * dtrans), then every shard it holds against the pattern. */
static int execute(const nrs_emu_graph_t *g, uint64_t epoch, nrs_xport_t *x, nrs_ucx_t *u,
                   nrs_rdv_t *r, int me, int size, double timeout, unsigned attempt, rx_t *E)
{
    int64_t maxb = 1;
    nrs_dtrans_opts_t o;
    nrs_dtrans_result_t res;
    memset(E, 0, sizeof(*E));
    nrs_dtrans_opts_init(&o, me, size);
    o.owner_rank = identity;
    o.timeout_s = timeout;
    o.cancel = ucx_cancel;
    o.cancel_arg = x;
    o.purge = ucx_purge;
    o.purge_arg = x;
    o.peer_failed = ucx_dead;
    o.peer_arg = u;
    o.xport_error = ucx_error;
#ifdef HAVE_NCCL
    if (use_nccl) {
        o.cancel = nccl_cancel;
        o.purge = NULL;
        o.xport_error = nccl_error;
        o.peer_failed = ucx_gone;
    }
#endif
    o.attempt = attempt;
    o.verify = use_verify;
    const char *kill = getenv("NRS_MP_KILL"); /* RANK:OPS */
    if (kill && atoi(kill) == me && strchr(kill, ':'))
        o.kill_after = atoll(strchr(kill, ':') + 1);
    /* RANK:N: the Nth transfer RANK receives arrives with a byte flipped */
    const char *wire = getenv("NRS_MP_CORRUPT_WIRE");
    if (wire && atoi(wire) == me && strchr(wire, ':'))
        o.corrupt_recv = atoll(strchr(wire, ':') + 1);
    if (wire)
        kill = wire; /* the run must abort everywhere, the old state intact */
    for (size_t i = 0; i < g->nbuf; i++)
        if (g->buf[i].b.bytes > maxb)
            maxb = g->buf[i].b.bytes;
    nrs_xmem_t *old = calloc((size_t)g->nold + 1, sizeof(*old));
    nrs_xmem_t *nw = calloc((size_t)g->nnew + 1, sizeof(*nw));
    unsigned char *scratch = malloc((size_t)maxb), *host = malloc((size_t)maxb);
    if (!old || !nw || !scratch || !host) {
        note(E, "out of memory");
        goto out;
    }
    for (int32_t i = 0; i < g->nold; i++)
        if (!g->buf[i].lost && nrs_dtrans_buf_rank(g, &o, i) == me) {
            if (x->ops->mem_alloc(x->ctx, g->buf[i].b.gpu, (size_t)g->buf[i].b.bytes, &old[i])) {
                note(E, "out of memory");
                goto out;
            }
            nrs_emu_pattern_fill(&g->buf[i].b, host);
            if (mem_io(&old[i], host, 'h')) {
                note(E, "cannot write the pattern");
                goto out;
            }
        }
#ifdef HAVE_NCCL
    if (use_nccl && nrs_xport_nccl_preconnect(x, g, timeout))
        fprintf(stderr, "mp_transition[%d]: %s\n", me, nrs_xport_nccl_error(x));
#endif
    int out = nrs_dtrans_run(g, epoch, x, r, old, nw, &o, &res);
#ifdef HAVE_NCCL
    if (use_nccl)
        nrs_xport_nccl_release(x);
#endif
    E->xfers = res.xfers;
    E->exec_s = res.total_s;
    E->hashed = res.bytes_verified;
    E->bytes = res.bytes_sent;
    E->max_inflight = res.max_inflight;
    if (out == NRS_DT_ABORTED && kill) { /* the old state must be intact */
        int64_t v = 0;
        for (int32_t i = 0; i < g->nold; i++)
            if (old[i].ptr) {
                check(E, &old[i], &g->buf[i].b, scratch, host);
                v++;
            }
        if (!E->errors) {
            printf("mp_transition[%d]: aborted, old state intact (%lld shard(s) verified): %s\n",
                   me, (long long)v, res.msg);
            E->aborted = 1;
        }
        goto out;
    }
    if (out != NRS_DT_COMMITTED) {
        note(E, "%s", res.msg);
        goto out;
    }
    const char *c = getenv("NRS_MP_CORRUPT"); /* negative test: one byte flipped */
    for (int32_t j = 0; c && atoi(c) == me && j < g->nnew; j++)
        if (nw[j].ptr && nw[j].bytes > 0 && g->buf[g->nold + j].alias < 0) {
            if (mem_io(&nw[j], host, 'd'))
                break;
            host[0] ^= 0x5a;
            mem_io(&nw[j], host, 'h');
            break;
        }
    for (int32_t j = 0; j < g->nnew; j++)
        if (nrs_dtrans_buf_rank(g, &o, g->nold + j) == me)
            check(E, &nw[j], &g->buf[g->nold + j].b, scratch, host);
    for (int32_t i = 0; i < g->nold; i++) { /* left: only a weight sync keeps old state */
        if (!old[i].ptr)
            continue;
        if (g->keep_old)
            check(E, &old[i], &g->buf[i].b, scratch, host);
        else
            note(E, "buffer %d still allocated after the transition", i);
    }
out:
    for (int32_t i = 0; old && i < g->nold; i++)
        if (old[i].ptr)
            x->ops->mem_free(x->ctx, &old[i]);
    for (int32_t j = 0; nw && j < g->nnew; j++)
        if (nw[j].ptr)
            x->ops->mem_free(x->ctx, &nw[j]);
    free(old);
    free(nw);
    free(scratch);
    free(host);
    return E->errors || E->aborted ? -1 : 0;
}

/* --snug: *g again under the smallest cap, to within 1/32 of the range,
 * whose schedule stages nothing (the uncapped *g stages nothing). */
static int snug(const nrs_spec_t *s, const nrs_plan_t *a, const nrs_plan_t *b,
                const nrs_emu_opts_t *eo, nrs_emu_graph_t **g, char *err, size_t errlen)
{
    nrs_emu_stats_t st;
    nrs_emu_graph_stats(*g, &st);
    int64_t lo = tu_state_need(*g) + (*g)->reserve, hi = st.peak_bytes, step = (hi - lo) / 32 + 1;
    while (hi - lo > step) {
        nrs_emu_opts_t o = *eo;
        nrs_emu_graph_t *h = NULL;
        o.cap_bytes = lo + (hi - lo) / 2;
        if (nrs_emu_transition(s, a, b, &o, &h, err, errlen))
            return -1;
        if (h->nstaged) {
            lo = o.cap_bytes;
            nrs_emu_graph_free(h);
        } else {
            hi = o.cap_bytes;
            nrs_emu_graph_free(*g);
            *g = h;
        }
    }
    return 0;
}

/* This rank's transfers whose region here is strided. */
static int64_t strided_here(const nrs_emu_graph_t *g, int me)
{
    nrs_dtrans_opts_t o;
    int64_t n = 0;
    nrs_dtrans_opts_init(&o, me, me + 1);
    o.owner_rank = identity;
    for (size_t i = 0; i < g->nops; i++) {
        const nrs_emu_op_t *op = &g->ops[i];
        if (op->type != NRS_EMU_OP_XFER || op->rows <= 1)
            continue;
        n += nrs_dtrans_buf_rank(g, &o, op->src_buf) == me && op->src_pitch != op->row_bytes;
        n += nrs_dtrans_buf_rank(g, &o, op->dst_buf) == me && op->dst_pitch != op->row_bytes;
    }
    return n;
}

#ifdef HAVE_NCCL
/* Everyone's communicator (rank 0's unique id through the rendezvous) and
 * the NCCL transport over it: executor rank r is communicator rank r. */
static int nccl_open(nrs_rdv_t *r, int me, int n, double timeout, nrs_nccl_t **c, nrs_xport_t *x,
                     char *err, size_t errlen)
{
    unsigned char id[NRS_NCCL_ID_BYTES] = {0};
    void **ids;
    size_t *il;
    const char *d = getenv("NRS_MP_DEVICE");
    int dev = nccl_dev = d ? atoi(d) : 0;
    if (me == 0 && nrs_nccl_unique_id(id, err, errlen))
        return -1;
    if (nrs_rdv_allgather(r, 0, "nccl", id, sizeof id, &ids, &il, timeout, err, errlen))
        return -1;
    int ok = il[0] == sizeof id;
    if (ok)
        memcpy(id, ids[0], sizeof id);
    nrs_rdv_free_blobs(r, ids, il);
    if (!ok) {
        snprintf(err, errlen, "rank 0's NCCL unique id is malformed");
        return -1;
    }
    if (nrs_nccl_init(c, me, n, dev, id, timeout, err, errlen))
        return -1;
    int *cr = malloc((size_t)n * sizeof(*cr));
    for (int i = 0; cr && i < n; i++)
        cr[i] = i;
    int rc = cr ? nrs_xport_nccl_open(x, *c, dev, identity, NULL, cr, n, timeout) : -1;
    free(cr);
    if (rc)
        snprintf(err, errlen, "out of memory");
    return rc;
}
#endif

/* Same draw on every rank: a spec whose nodes divide the ranks, two plans. */
static void draw(tu_rng_t *rng, int n, nrs_spec_t *s, nrs_plan_t *a, nrs_plan_t *b)
{
    tu_spec(s, rng);
    int gpn = s->cluster.gpus_per_node;
    while (gpn > n)
        gpn /= 2;
    s->cluster.gpus_per_node = gpn;
    int na = tu_int(rng, 1, n / gpn), nb = tu_int(rng, 1, n / gpn);
    tu_plan(s, rng, na * gpn, a);
    tu_plan(s, rng, nb * gpn, b);
}

/* --fan: transition t of tp 1 -> tp n (odd t) or back (even t). */
static void fan(int t, int n, nrs_spec_t *s, nrs_plan_t *a, nrs_plan_t *b)
{
    nrs_model_t m;
    nrs_layout_t one = {1, 1, 1, 1}, wide = {n, 1, 1, 1};
    tu_model(&m, 2, 4 * n, 4 * n, n, n, 4 * n);
    tu_spec_fixed(s, &m, n < 8 ? n : 8);
    tu_plan_single(s, n, t % 2 ? &one : &wide, a);
    tu_plan_single(s, n, t % 2 ? &wide : &one, b);
}

int main(int argc, char **argv)
{
    uint64_t seed = 1;
    int count = 6, rc = 1, use_fan = 0, use_tight = 0, use_mem = 0, use_snug = 0;
    double timeout = 20;
    char err[512];
    nrs_ucx_opts_t uo;
    nrs_emu_opts_t eo;
    nrs_rdv_t *r = NULL;
    nrs_ucx_t *u = NULL;
    nrs_xport_t x = {0};
    void **addrs = NULL;
    size_t *lens = NULL;
#ifdef HAVE_NCCL
    nrs_nccl_t *nc = NULL;
#endif

    nrs_ucx_opts_init(&uo);
    uo.chunk_bytes = 64 << 10;
    nrs_emu_opts_init(&eo);
    eo.chunk_bytes = 16 << 10;
    for (int i = 1; i < argc; i++) {
        use_nccl |= !strcmp(argv[i], "--nccl");
        use_verify |= !strcmp(argv[i], "--verify");
        use_fan |= !strcmp(argv[i], "--fan");
        use_tight |= !strcmp(argv[i], "--tight");
        use_mem |= !strcmp(argv[i], "--mem-check");
        use_snug |= !strcmp(argv[i], "--snug");
    }
    if (use_mem && (!use_nccl || !fakegpu_mem_stats)) {
        fprintf(stderr, "mp_transition: --mem-check: needs --nccl under tests/fakegpu\n");
        return 2;
    }
#ifndef HAVE_NCCL
    if (use_nccl) {
        fprintf(stderr, "mp_transition: --nccl: built without NCCL\n");
        return 2;
    }
#endif
    for (int i = 1; i + 1 < argc; i++) {
        if (!strcmp(argv[i], "--seed"))
            seed = strtoull(argv[++i], NULL, 0);
        else if (!strcmp(argv[i], "--count"))
            count = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--chunk"))
            eo.chunk_bytes = strtoll(argv[++i], NULL, 0);
        else if (!strcmp(argv[i], "--timeout"))
            timeout = atof(argv[++i]);
        else if (!strcmp(argv[i], "--cap")) /* per-GPU memory cap: transfers after the PONR */
            eo.cap_bytes = strtoll(argv[++i], NULL, 0);
        else if (!strcmp(argv[i], "--suspend"))
            suspend_s = atof(argv[++i]);
    }
    if (nrs_rdv_init(&r, err, sizeof err)) {
        fprintf(stderr, "mp_transition: %s\n", err);
        return 1;
    }
    int me = nrs_rdv_rank(r), n = nrs_rdv_size(r);
    const void *addr;
    size_t alen;
    if (nrs_ucx_init(&u, me, n, &uo, err, sizeof err))
        goto fail;
    nrs_rdv_set_progress(r, nrs_ucx_progress, u);
    nrs_ucx_set_probe(u, probe, r);
    nrs_ucx_address(u, &addr, &alen);
    if (nrs_rdv_allgather(r, 0, "ucx", addr, alen, &addrs, &lens, timeout, err, sizeof err) ||
        nrs_ucx_connect(u, addrs, lens, err, sizeof err))
        goto fail;
#ifdef HAVE_NCCL
    if (use_nccl) {
        if (nccl_open(r, me, n, timeout, &nc, &x, err, sizeof err))
            goto fail;
    } else
#endif
    if (nrs_xport_ucx_open(&x, u, identity, NULL)) {
        snprintf(err, sizeof err, "out of memory");
        goto fail;
    }
    if (suspend_s > 0) {
        if (mp_gather_pids(r, timeout, &job_pids))
            goto out;
        job_n = n;
        if (me == 0)
            suspend_shim(&x);
    }
    tu_rng_t rng = {seed * 0x9e3779b97f4a7c15ull + 1};
    int64_t tot_x = 0, tot_b = 0, tot_v = 0;
    double tot_s = 0;
    int64_t tot_h = 0;
    rc = 0;
    for (int t = 1; t <= count && !rc; t++) {
        nrs_spec_t s;
        nrs_plan_t a, b;
        nrs_emu_graph_t *g = NULL;
        if (use_fan)
            fan(t, n, &s, &a, &b);
        else
            draw(&rng, n, &s, &a, &b);
        int grc = nrs_emu_transition(&s, &a, &b, &eo, &g, err, sizeof err);
        if (!grc && use_tight) { /* again, under the larger of each GPU's old and new state */
            nrs_emu_opts_t to = eo;
            to.cap_bytes = tu_state_need(g) + 2 * g->chunk;
            nrs_emu_graph_free(g);
            g = NULL;
            grc = nrs_emu_transition(&s, &a, &b, &to, &g, err, sizeof err);
        }
        if (!grc && use_snug)
            grc = snug(&s, &a, &b, &eo, &g, err, sizeof err);
        if (grc) {
            fprintf(stderr, "mp_transition[%d]: transition %d: graph: %s\n", me, t, err);
            nrs_emu_graph_free(g);
            rc = 1;
            break;
        }
        nrs_emu_stats_t st;
        nrs_emu_graph_stats(g, &st);
        void **hs;
        size_t *hl;
        if (nrs_rdv_allgather(r, (uint64_t)t, "graph", &st.hash, sizeof st.hash, &hs, &hl, timeout,
                              err, sizeof err)) {
            nrs_emu_graph_free(g);
            goto fail;
        }
        for (int i = 0; i < n; i++)
            if (hl[i] != sizeof st.hash || memcmp(hs[i], &st.hash, sizeof st.hash)) {
                fprintf(stderr, "mp_transition[%d]: transition %d: rank %d built another graph\n",
                        me, t, i);
                rc = 1;
            }
        nrs_rdv_free_blobs(r, hs, hl);
        nrs_ucx_op_t *stale = NULL;
        const char *sh = getenv("NRS_MP_STALE");
        nrs_dtrans_opts_t so;
        nrs_dtrans_opts_init(&so, me, n);
        for (size_t i = 0; sh && atoi(sh) && t == 1 && !use_nccl && i < g->nops; i++) {
            const nrs_emu_op_t *op = &g->ops[i];
            if (op->type != NRS_EMU_OP_XFER)
                continue;
            int sr = nrs_dtrans_buf_rank(g, &so, op->src_buf);
            int d = nrs_dtrans_buf_rank(g, &so, op->dst_buf);
            if (sr == d || sr < 0 || d < 0)
                continue;
            size_t len = (size_t)op->rows * (size_t)op->row_bytes;
            unsigned char *junk = sr == me ? malloc(len ? len : 1) : NULL;
            if (junk) {
                memset(junk, 0xee, len);
                uint64_t tag = ((uint64_t)(t & 0x7f) << 24) | i; /* dtrans' tag of op i */
                if (nrs_ucx_isend(u, d, junk, len, tag, &stale, err, sizeof err))
                    free(junk);
                else
                    nrs_ucx_op_adopt(stale, junk);
                printf("mp_transition[%d]: a stale message of %zu bytes for op %zu sent to "
                       "rank %d\n", me, len, i, d);
            }
            break;
        }
        /* the stale message is out before the next fence: it waits at its
         * receiver before the transition starts there */
        if (stale)
            for (double e = nrs_now_s() + 1; nrs_ucx_test(stale) == 0 && nrs_now_s() < e;)
                nrs_ucx_progress(u);
        if (sh && nrs_rdv_fence(r, 1000000 + (uint64_t)t, NULL, timeout, err, sizeof err)) {
            nrs_ucx_op_free(stale);
            nrs_emu_graph_free(g);
            goto fail;
        }
        rx_t E;
        int64_t memcap = nrs_emu_graph_peak(g, me) ? nrs_emu_graph_peak(g, me) : g->reserve;
        size_t used0 = 0, peak = 0;
        long groups0 = 0, groups = 0;
        if (use_mem) { /* the fake refuses what the schedule did not count */
            char v[32];
            snprintf(v, sizeof v, "%lld", (long long)memcap);
            setenv("FAKE_MEM_CAP", v, 1);
            fakegpu_mem_stats(nccl_dev, 1, &used0, &peak, &groups0);
        }
        if (!rc && execute(g, (uint64_t)t, &x, u, r, me, n, timeout, (unsigned)t, &E) &&
            E.aborted) {
            nrs_emu_graph_free(g);
            rc = 3; /* NRS_MP_KILL: as it should; no fence, a rank is gone */
            break;
        } else if (!rc && E.errors) {
            fprintf(stderr, "mp_transition[%d]: transition %d (%d -> %d GPUs, %lld ops): %lld "
                    "error(s), first: %s\n", me, t, a.total_gpus, b.total_gpus,
                    (long long)g->nops, (long long)E.errors, E.first);
            rc = 1;
        }
        if (use_mem) {
            size_t used;
            fakegpu_mem_stats(nccl_dev, 0, &used, &peak, &groups);
            unsetenv("FAKE_MEM_CAP");
            printf("mp_transition[%d]: transition %d: device peak %zu bytes of the schedule's "
                   "%lld (cap %lld, reserve %lld), %ld group(s), %lld strided transfer(s) here\n",
                   me, t, peak, (long long)memcap, (long long)g->cap, (long long)g->reserve,
                   groups - groups0, (long long)strided_here(g, me));
            if (!rc && peak > (size_t)memcap) {
                fprintf(stderr, "mp_transition[%d]: transition %d: device peak %zu over the "
                        "schedule's %lld\n", me, t, peak, (long long)memcap);
                rc = 1;
            }
        }
        if (!rc && me == 0)
            printf("mp_transition: transition %d: %d -> %d GPUs, %lld ops, %lld staged, graph "
                   "%016llx: rank 0 ran %lld transfer(s) (up to %lld in flight), verified %lld "
                   "shard(s)\n", t, a.total_gpus, b.total_gpus, (long long)g->nops,
                   (long long)g->nstaged, (unsigned long long)st.hash, (long long)E.xfers,
                   (long long)E.max_inflight, (long long)E.verified);
        if (sh_resumer > 0) { /* the wait is over: reap rank 0's resumer */
            waitpid(sh_resumer, NULL, 0);
            sh_resumer = -1;
        }
        tot_x += rc ? 0 : E.xfers;
        tot_b += rc ? 0 : E.bytes;
        tot_v += rc ? 0 : E.verified;
        tot_s += rc ? 0 : E.exec_s;
        tot_h += rc ? 0 : E.hashed;
        nrs_emu_graph_free(g);
        nrs_ucx_op_free(stale);
        /* the next transition starts only when every rank is done with this one */
        if (nrs_rdv_fence(r, (uint64_t)t, NULL, timeout, err, sizeof err)) {
            fprintf(stderr, "mp_transition[%d]: %s\n", me, err);
            rc = 1;
        }
    }
    if (!rc && me == 0 && suspend_s > 0 && !sh_resumer) {
        fprintf(stderr, "mp_transition[0]: --suspend: no transfer ever waited: nothing tested\n");
        rc = 1;
    }
    if (!rc)
        printf("mp_transition[%d/%d]: %d transition(s) over %s: %lld transfer(s), %lld bytes "
               "sent, %lld shard(s) verified, %lld bytes hashed, %.6f s in the executor\n", me,
               n, count, x.ops->name, (long long)tot_x, (long long)tot_b, (long long)tot_v,
               (long long)tot_h, tot_s);
    nrs_xport_close(&x);
#ifdef HAVE_NCCL
    nrs_nccl_fini(nc);
    nc = NULL;
#endif
    if (rc == 3)
        goto out;
    nrs_ucx_disconnect(u, 5.0);
    if (nrs_rdv_fence(r, (uint64_t)count + 1, NULL, timeout, err, sizeof err)) {
        fprintf(stderr, "mp_transition[%d]: %s\n", me, err);
        rc = 1;
    }
    goto out;
fail:
    fprintf(stderr, "mp_transition[%d]: %s\n", me, err);
    rc = 1;
    nrs_xport_close(&x);
#ifdef HAVE_NCCL
    nrs_nccl_fini(nc);
#endif
out:
    if (addrs)
        nrs_rdv_free_blobs(r, addrs, lens);
    nrs_ucx_fini(u);
    nrs_rdv_fini(r);
    free(job_pids);
    return rc;
}
