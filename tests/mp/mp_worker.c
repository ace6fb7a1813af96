/* mp_worker: one rank driving the public worker API (include/nereus/nereus.h)
 * under tests/mp/pmix_srv.
 *
 *   mp_worker [--seed N] [--count K] [--kill RANK] [--kill-ponr RANK [--kill-census RANK2]]
 *             [--transports MASK] [--fail RANK [--nomem]] [--nomem-census RANK]
 *             [--retune T] [--nomem-hostcopy RANK] [--caller-device D]
 *
 * Every rank draws the same spec and the same chain of random plans
 * (epochs 1, 2, ...; reshards, dp up and down, pools moving), allocates its
 * state under plan 1 filled with runtime/emu's pattern, and runs the chain
 * of transitions through nrs_worker_transition, verifying every shard it
 * holds after each. Reports go through a sink (counted).
 *
 * --kill R: rank R SIGKILLs itself half-way through its ops before the
 * point of no return of the first transition in which it has at least 8 of
 * them; every survivor must come back NRS_ERR_ABORTED and find its old
 * state intact: it prints
 *   mp_worker[i]: aborted after X s (Y s after the kill): old state intact (N shards)
 * and exits 3. --kill-ponr R: R dies right after the PONR vote of the first
 * transition; survivors print the census (present / rebuildable / lost)
 * and exit 6. --kill-census R2 (with --kill-ponr): R2 dies too, once its
 * part of the census is in (NRS_WORKER_KILL_CENSUS), and the others read
 * the census only once told of its death: what it contributed must count
 * all the same.
 *
 * --fail R: the first transition fails on rank R alone before its ops
 * (NRS_WORKER_TRANS_FAIL=R:0): R must come back with its own error and say
 * it voted no, every other rank NRS_ERR_ABORTED naming R's no, all with the
 * old state intact; each prints
 *   mp_worker[i]: transition 1 failed on rank R alone (...): aborted everywhere, old state intact
 * and the same transition is tried again: it and the rest of the chain commit.
 * With --nomem R has no memory for its votes instead (NRS_WORKER_NOMEM=R:vote:0):
 * it comes back NRS_ERR_NOMEM, having voted no all the same.
 * --nomem-census R2 (with --kill-ponr): R2 has no memory for the census of
 * the first transition (NRS_WORKER_NOMEM=R2:census:0): every survivor must
 * print the same census, without it (every new buffer lost).
 *
 * --retune T: transition T of the chain is a re-tune (nrs_adapt_retune): the
 * current plan with every micro-batch doubled, nothing else changed (no
 * draw: the chain's later plans are those without it). Nothing moves: no
 * communicator is set up, nothing is copied between GPU and host, one
 * vote. Each rank prints what the transition said and, under tests/fakegpu,
 * what it set up and copied:
 *   mp_worker[i]: re-tune to epoch E: transition ...: committed epoch E: nothing moves (...)
 *   mp_worker[i]: re-tune: C communicator(s) made, K copies
 * With --fail R (and T = 1) the re-tune is what fails on R alone.
 *
 * --nomem-hostcopy R: past the point of no return of the first transition
 * over NCCL, R cannot have its first host copy (NRS_WORKER_NOMEM=R:hostcopy:0):
 * it must come back NRS_ERR_NOMEM, with every device buffer of the new state
 * still freed at finalize (tests/fakegpu FAKE_LEAKS); it prints
 *   mp_worker[R]: transition 1: no host copies (...): the device state freed at finalize
 * and ends 0; use --count 1 (the others commit and end).
 *
 * Before the chain every rank calls each public function with a NULL
 * handle (each must return its failure value and name itself in
 * nrs_worker_last_error(NULL)) and the calls with output pointers with
 * NULL ones on its real handle, then prints
 *   mp_worker[i]: NULL checks: N calls refused a NULL handle, NULL outputs taken
 *
 * Layer views (nrs_worker_buffer_layer, API 5): after the state is allocated
 * and after every transition, every rank takes each buffer of a layer tensor
 * apart into the layers its box touches (computed here from the box and the
 * spec's hidden size) and checks every part against the geometry computed
 * here (shape, pitch, place in the layer's own weight, address inside the
 * buffer, contents = runtime/emu's pattern at those global coordinates in
 * host memory), that the parts tile the box, and that a layer outside the
 * box or a global tensor's buffer is refused naming the layer; it prints
 *   mp_worker[i]: layer views (<when>): B buffer(s), P part(s) tile their boxes, R refused
 *
 * --caller-device D (built with CUDA): the thread makes CUDA device D its
 * current one first, as a framework would (PyTorch's torch.cuda.set_device),
 * and after each worker call that may touch GPU state (set-up, verify,
 * transition, finalize) D must still be current: a call that leaves another
 * one is named on stderr and the run fails. Without a failure it prints
 *   mp_worker[i]: the caller's CUDA device D kept across N call(s)
 */
#define _GNU_SOURCE
#include <config.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "emu/graph.h"
#include "emu/pattern.h"
#include "../fakegpu/counts.h"
#include "emu/testutil.h"
#include "nereus/nereus.h"
#ifdef HAVE_NCCL
#include <cuda_runtime_api.h>
#endif

static double wall_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void draw_spec(tu_rng_t *rng, int n, nrs_spec_t *s)
{
    tu_spec(s, rng);
    int gpn = s->cluster.gpus_per_node;
    while (gpn > n)
        gpn /= 2;
    s->cluster.gpus_per_node = gpn;
}

static void draw_plan(tu_rng_t *rng, const nrs_spec_t *s, int n, unsigned epoch, nrs_plan_t *p)
{
    int gpn = s->cluster.gpus_per_node;
    tu_plan(s, rng, tu_int(rng, 1, n / gpn) * gpn, p);
    p->epoch = epoch;
}

/* This rank's ops before the point of no return of (a -> b); every rank computes it. */
static int64_t pre_ponr_ops(const nrs_spec_t *s, const nrs_plan_t *a, const nrs_plan_t *b,
                            int rank)
{
    nrs_emu_graph_t *g = NULL;
    char err[256];
    int64_t n = 0;
    if (nrs_emu_transition(s, a, b, NULL, &g, err, sizeof err) == 0)
        for (int64_t i = 0; i < g->ponr; i++) {
            const nrs_emu_op_t *op = &g->ops[i];
            n += nrs_emu_op_rank(g, op, 0) == rank || nrs_emu_op_rank(g, op, 1) == rank;
        }
    nrs_emu_graph_free(g);
    return n;
}

/* p with every micro-batch doubled (a new epoch): a re-tune of p. */
static void retune_of(const nrs_plan_t *p, unsigned epoch, nrs_plan_t *out)
{
    *out = *p;
    out->epoch = epoch;
    for (int ms = 0; ms < NRS_MS_COUNT; ms++)
        if (out->has[ms])
            out->layout[ms].mb *= 2;
}

static int reports;
static void sink(void *arg, const char *json)
{
    (void)arg;
    reports += strstr(json, "\"type\":\"report\"") != NULL;
}

static int caller_dev = -1; /* --caller-device */
static int dev_checks, dev_bad;

/* The caller's device is still current after call (--caller-device). */
static void device_kept(const char *call)
{
    if (caller_dev < 0)
        return;
    int d = -1;
#ifdef HAVE_NCCL
    if (cudaGetDevice(&d) != cudaSuccess)
        d = -1;
#endif
    dev_checks++;
    if (d != caller_dev) {
        fprintf(stderr, "mp_worker: %s left CUDA device %d current, the caller's is %d\n", call,
                d, caller_dev);
        dev_bad++;
    }
}

/* Make D the thread's current device, as the framework would: 0 or -1. */
static int set_caller_device(int d)
{
#ifdef HAVE_NCCL
    if (cudaSetDevice(d) == cudaSuccess)
        return 0;
    fprintf(stderr, "mp_worker: --caller-device %d: cudaSetDevice failed\n", d);
#else
    fprintf(stderr, "mp_worker: --caller-device %d: built without CUDA\n", d);
#endif
    return -1;
}

static int check(nrs_worker_t *w, const char *when, long long *nv)
{
    long long v, m;
    int rc = nrs_worker_verify_state(w, &v, &m);
    device_kept("nrs_worker_verify_state");
    *nv = v;
    if (rc)
        fprintf(stderr, "mp_worker[%d]: %s: %lld of %lld shard(s) wrong: %s\n",
                nrs_worker_rank(w), when, m, v, nrs_worker_strerror(rc));
    return rc;
}

/* fn(NULL, ...) returned got: it must be want, and say so in last_error(NULL). */
static int refused(const char *fn, double got, double want, const char *why)
{
    char msg[128];
    snprintf(msg, sizeof msg, "%s: %s", fn, why);
    if (got == want && !strcmp(nrs_worker_last_error(NULL), msg))
        return 0;
    fprintf(stderr, "mp_worker: %s(NULL): %g, wanted %g; last_error(NULL) '%s', wanted '%s'\n",
            fn, got, want, nrs_worker_last_error(NULL), msg);
    return 1;
}

#define REFUSED(fn, want, ...) (n++, bad += refused(#fn, (double)fn(__VA_ARGS__), want, \
                                                     "no handle (NULL)"))
#define NO_OUT(fn, ...) (n++, bad += refused(#fn, (double)fn(__VA_ARGS__), NRS_ERR_INVAL, \
                                             "out is NULL"))

/* Every public call with a NULL handle: the number of failures, *calls. */
static int null_handle(int *calls)
{
    int bad = 0, n = 0;
    NO_OUT(nrs_worker_init, NULL, NULL);
    NO_OUT(nrs_worker_init_spec, NULL, NULL);
    NO_OUT(nrs_worker_init_emulated, NULL, NULL);
    bad += nrs_worker_finalize(NULL) != NRS_OK, n++;
    REFUSED(nrs_worker_rank, -1, NULL);
    REFUSED(nrs_worker_size, -1, NULL);
    REFUSED(nrs_worker_is_singleton, 0, NULL);
    bad += strcmp(nrs_worker_transport(NULL), "none") != 0, n++;
    bad += strcmp(nrs_worker_control(NULL), "no handle") != 0, n++;
    REFUSED(nrs_worker_set_plan, NRS_ERR_INVAL, NULL, NULL);
    REFUSED(nrs_worker_epoch, -1, NULL);
    REFUSED(nrs_worker_nroles, NRS_ERR_INVAL, NULL);
    REFUSED(nrs_worker_role, NRS_ERR_INVAL, NULL, 0, NULL, NULL, NULL, NULL, NULL, NULL, NULL);
    REFUSED(nrs_worker_group, NRS_ERR_INVAL, NULL, 0, NRS_GROUP_TP, NULL, 0);
    REFUSED(nrs_worker_alloc_state, NRS_ERR_INVAL, NULL, NRS_MEM_HOST, 1);
    REFUSED(nrs_worker_mem_kind, NRS_ERR_INVAL, NULL);
    REFUSED(nrs_worker_nbuffers, NRS_ERR_INVAL, NULL);
    REFUSED(nrs_worker_buffer, NRS_ERR_INVAL, NULL, 0, NULL, NULL);
    REFUSED(nrs_worker_buffer_desc, NRS_ERR_INVAL, NULL, 0, NULL, NULL, NULL, NULL, NULL, NULL,
            NULL, NULL);
    REFUSED(nrs_worker_buffer_layer, NRS_ERR_INVAL, NULL, 0, 0, NULL, NULL, NULL, NULL, NULL,
            NULL);
    REFUSED(nrs_worker_verify_state, NRS_ERR_INVAL, NULL, NULL, NULL);
    REFUSED(nrs_worker_set_report_sink, NRS_ERR_INVAL, NULL, NULL, NULL);
    REFUSED(nrs_worker_report_stage, NRS_ERR_INVAL, NULL, 0, 1.0);
    REFUSED(nrs_worker_report_memory, NRS_ERR_INVAL, NULL, 0, 0, 0);
    REFUSED(nrs_worker_report_step, NRS_ERR_INVAL, NULL, 0, 0.0);
    REFUSED(nrs_worker_transition, NRS_ERR_INVAL, NULL, NULL);
    REFUSED(nrs_worker_transition_stat, 0, NULL, NRS_TS_SECONDS);
    REFUSED(nrs_worker_transition_stat, -1, NULL, NRS_TS_FAILED_RANK);
    REFUSED(nrs_worker_set_checkpoint_dir, NRS_ERR_INVAL, NULL, NULL);
    REFUSED(nrs_worker_checkpoint, NRS_ERR_INVAL, NULL, 1);
    REFUSED(nrs_worker_joined_at, -1, NULL);
    REFUSED(nrs_worker_control_plan, NRS_ERR_INVAL, NULL, 0.0);
    REFUSED(nrs_worker_control_poll, NRS_ERR_INVAL, NULL, 0.0);
    REFUSED(nrs_worker_gpu, -1, NULL);
    REFUSED(nrs_worker_plan, NRS_ERR_INVAL, NULL, NULL);
    REFUSED(nrs_worker_control_step, NRS_ERR_INVAL, NULL);
    REFUSED(nrs_worker_weight_sync, NRS_ERR_INVAL, NULL);
    REFUSED(nrs_worker_sync_stat, 0, NULL, NRS_SS_STEPS);
    REFUSED(nrs_worker_verify_generation, NRS_ERR_INVAL, NULL, NULL, NULL);
    *calls = n;
    return bad;
}

/* The calls with outputs, every output NULL, on w with its state (and, before
 * any transition, no failed rank): the number of failures. */
static int null_outputs(nrs_worker_t *w)
{
    int bad = 0, tp = 0, nb = nrs_worker_nbuffers(w), ms = 0;
    bad += nrs_worker_verify_state(w, NULL, NULL) != NRS_OK;
    bad += nrs_worker_plan(w, NULL) != NRS_ERR_INVAL ||
           !strstr(nrs_worker_last_error(w), "nrs_worker_plan: out is NULL");
    bad += nrs_worker_transition_stat(w, NRS_TS_FAILED_RANK) != -1;
    bad += nrs_worker_transition_stat(w, NRS_TS_RESTORED_STEP) != -1;
    if (nrs_worker_nroles(w) > 0) {
        bad += nrs_worker_role(w, 0, NULL, NULL, NULL, NULL, NULL, NULL, NULL) != NRS_OK;
        bad += nrs_worker_role(w, 0, &ms, &tp, NULL, NULL, NULL, NULL, NULL) != NRS_OK;
        bad += nrs_worker_group(w, ms, NRS_GROUP_TP, NULL, 8) != tp;
    }
    if (nb > 0) {
        bad += nrs_worker_buffer(w, 0, NULL, NULL) != NRS_OK;
        bad += nrs_worker_buffer_desc(w, nb - 1, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
                                      NULL) != NRS_OK;
    }
    char want[96];
    snprintf(want, sizeof want, "nrs_worker_buffer: buffer %d: this rank holds %d buffer(s)", nb,
             nb);
    bad += nrs_worker_buffer(w, nb, NULL, NULL) != NRS_ERR_INVAL ||
           strcmp(nrs_worker_last_error(w), want);
    if (bad)
        fprintf(stderr, "mp_worker[%d]: NULL outputs: %d check(s) failed (last: %s)\n",
                nrs_worker_rank(w), bad, nrs_worker_last_error(w));
    return bad;
}

/* Tensor ids (nereus.h, nrs_worker_buffer_desc): 0..2 global, 3..9 stacked. */
enum { T_QKV = 3, T_O, T_GATE, T_UP, T_DOWN, T_NORM1, T_NORM2, T_END };

/* The last error of w is buffer_layer's and names layer l. */
static int names_layer(const nrs_worker_t *w, int l)
{
    char want[48];
    const char *m = nrs_worker_last_error(w), *p;
    snprintf(want, sizeof want, "layer %d", l);
    if (strncmp(m, "nrs_worker_buffer_layer: ", 25))
        return 0;
    for (p = strstr(m, want); p; p = strstr(p + 1, want))
        if (p[strlen(want)] < '0' || p[strlen(want)] > '9')
            return 1;
    return 0;
}

/* buffer_layer(w, i, l) must fail with NRS_ERR_INVAL naming layer l, also
 * with every output NULL: 0 if so. */
static int refuses(nrs_worker_t *w, int i, int l)
{
    void *ptr;
    int rows, cols, r0, c0, bad = 0;
    long long pitch;
    bad += nrs_worker_buffer_layer(w, i, l, &ptr, &rows, &cols, &pitch, &r0, &c0) !=
               NRS_ERR_INVAL || !names_layer(w, l);
    bad += nrs_worker_buffer_layer(w, i, l, NULL, NULL, NULL, NULL, NULL, NULL) !=
               NRS_ERR_INVAL || !names_layer(w, l);
    if (bad)
        fprintf(stderr, "mp_worker[%d]: buffer %d, layer %d: not refused as it should be (%s)\n",
                nrs_worker_rank(w), i, l, nrs_worker_last_error(w));
    return bad;
}

/* The layer views of every buffer (see the head of the file): the number of
 * failed checks; the counts of buffers, parts and refusals checked. */
static int layer_views(nrs_worker_t *w, const nrs_spec_t *s, const char *when)
{
    int nb = nrs_worker_nbuffers(w), bad = 0, nlayer = 0, nref = 0, me = nrs_worker_rank(w);
    int host = nrs_worker_mem_kind(w) == NRS_MEM_HOST;
    long long nparts = 0;
    for (int i = 0; i < nb; i++) {
        int role, tensor, kind, r0, r1, c0, c1, es;
        void *base;
        long long bytes;
        if (nrs_worker_buffer_desc(w, i, &role, &tensor, &kind, &r0, &r1, &c0, &c1, &es) ||
            nrs_worker_buffer(w, i, &base, &bytes)) {
            fprintf(stderr, "mp_worker[%d]: buffer %d: %s\n", me, i, nrs_worker_last_error(w));
            return bad + 1;
        }
        if (tensor < T_QKV) { /* a global tensor holds no layer */
            bad += refuses(w, i, 0);
            nref++;
            continue;
        }
        if (tensor >= T_END || role < 0 || role >= NRS_ROLE_COUNT) {
            fprintf(stderr, "mp_worker[%d]: buffer %d: tensor %d of role %d?\n", me, i, tensor,
                    role);
            return bad + 1;
        }
        const nrs_model_t *m = &s->models[role];
        /* qkv, gate, up: layer l in columns [l*H, (l+1)*H); o, down: in rows
         * [l*H, (l+1)*H); the norms: row l */
        int bycol = tensor == T_QKV || tensor == T_GATE || tensor == T_UP;
        int span = tensor >= T_NORM1 ? 1 : m->hidden;
        int a = bycol ? c0 : r0, b = bycol ? c1 : r1, l0 = a / span, l1 = (b - 1) / span + 1;
        long long width = c1 - c0, area = (long long)(r1 - r0) * width, sum = 0;
        nlayer++;
        for (int l = l0; l < l1; l++) {
            /* the part, in the stacked tensor: the box within layer l's range */
            int er0 = r0, er1 = r1, ec0 = c0, ec1 = c1;
            if (bycol) {
                ec0 = c0 > l * span ? c0 : l * span;
                ec1 = c1 < (l + 1) * span ? c1 : (l + 1) * span;
            } else {
                er0 = r0 > l * span ? r0 : l * span;
                er1 = r1 < (l + 1) * span ? r1 : (l + 1) * span;
            }
            void *ptr = NULL;
            int rows = -1, cols = -1, lr0 = -1, lc0 = -1;
            long long pitch = -1;
            int rc = nrs_worker_buffer_layer(w, i, l, &ptr, &rows, &cols, &pitch, &lr0, &lc0);
            long long off = rc ? -1 : (long long)((uintptr_t)ptr - (uintptr_t)base);
            long long want_off = ((long long)(er0 - r0) * width + (ec0 - c0)) * es;
            int want_lr0 = bycol ? r0 : er0 - l * span, want_lc0 = bycol ? ec0 - l * span : c0;
            int ok = rc == NRS_OK && rows == er1 - er0 && cols == ec1 - ec0 && rows > 0 &&
                     cols > 0 && pitch == width * es && lr0 == want_lr0 && lc0 == want_lc0 &&
                     off == want_off && off >= 0 && off + (rows - 1) * pitch + cols * es <= bytes;
            /* every output NULL: the same answer */
            ok = ok && nrs_worker_buffer_layer(w, i, l, NULL, NULL, NULL, NULL, NULL, NULL) ==
                           NRS_OK;
            int same = 1; /* the bytes, in host memory */
            if (ok && host) {
                /* the pattern of those global coordinates (grads: zero), row by
                 * row: through the view, and at the place the box puts them */
                nrs_emu_buf_t pb = {.role = (int16_t)role, .kind = (uint8_t)kind,
                                    .esize = (uint8_t)es, .tensor = tensor,
                                    .box = {er0, er1, ec0, ec1}};
                size_t rowb = (size_t)cols * es;
                pb.bytes = (int64_t)rows * (int64_t)rowb;
                char *want = malloc((size_t)pb.bytes);
                if (!want)
                    return bad + 1;
                nrs_emu_pattern_fill(&pb, want);
                for (int r = 0; same && r < rows; r++) {
                    const char *at = (const char *)base +
                                     ((long long)(er0 + r - r0) * width + (ec0 - c0)) * es;
                    same = !memcmp((const char *)ptr + r * pitch, want + r * rowb, rowb) &&
                           !memcmp(at, want + r * rowb, rowb);
                }
                free(want);
            }
            if (!ok || !same) {
                fprintf(stderr, "mp_worker[%d]: buffer %d (tensor %d, kind %d, box [%d,%d)x[%d,%d),"
                        " hidden %d), layer %d: rc %d, %d x %d, pitch %lld, at (%d, %d), offset "
                        "%lld of %lld; wanted %d x %d, pitch %lld, at (%d, %d), offset %lld; %s "
                        "(%s)\n", me, i, tensor, kind, r0, r1, c0, c1, m->hidden, l, rc, rows,
                        cols, pitch, lr0, lc0, off, bytes, er1 - er0, ec1 - ec0, width * es,
                        want_lr0, want_lc0, want_off,
                        same ? "bytes not compared or as the pattern" : "bytes not the pattern's",
                        rc ? nrs_worker_last_error(w) : "the call succeeded");
                bad++;
            }
            sum += rc ? 0 : (long long)rows * cols;
            nparts++;
        }
        if (sum != area) {
            fprintf(stderr, "mp_worker[%d]: buffer %d: layers %d..%d cover %lld of %lld elements\n",
                    me, i, l0, l1 - 1, sum, area);
            bad++;
        }
        /* outside the box: the layer before, the one after, and past the model */
        if (l0 > 0)
            bad += refuses(w, i, l0 - 1), nref++;
        bad += refuses(w, i, l1), nref++;
        bad += refuses(w, i, m->layers + 3), nref++;
        bad += refuses(w, i, -1), nref++;
    }
    if (!bad)
        printf("mp_worker[%d]: layer views (%s): %d buffer(s), %lld part(s) tile their boxes, "
               "%d refused\n", me, when, nlayer, nparts, nref);
    return bad;
}

static void show_roles(nrs_worker_t *w)
{
    int ms, tp, pp, dp, t, p, d, ranks[64];
    for (int i = 0; i < nrs_worker_nroles(w); i++) {
        nrs_worker_role(w, i, &ms, &tp, &pp, &dp, &t, &p, &d);
        int ng = nrs_worker_group(w, ms, NRS_GROUP_TP, ranks, 64);
        printf("mp_worker[%d]: epoch %d: %s tp%d pp%d dp%d at (t%d p%d d%d), tp group of %d "
               "from rank %d\n", nrs_worker_rank(w), nrs_worker_epoch(w),
               nrs_worker_ms_name(ms), tp, pp, dp, t, p, d, ng, ng > 0 ? ranks[0] : -1);
    }
}

int main(int argc, char **argv)
{
    uint64_t seed = 1;
    int count = 4, kill = -1, kill_ponr = -1, kill_census = -1, fail = -1, rc = 1;
    int nomem = 0, nomem_census = -1, retune = -1, nomem_hostcopy = -1;
    unsigned transports = 0; /* NRS_XFER_* mask for runtime.transports; 0: the drawn spec's */
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--nomem"))
            nomem = 1;
        else if (i + 1 == argc)
            break;
        else if (!strcmp(argv[i], "--nomem-census"))
            nomem_census = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--nomem-hostcopy"))
            nomem_hostcopy = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--retune"))
            retune = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--seed"))
            seed = strtoull(argv[++i], NULL, 0);
        else if (!strcmp(argv[i], "--count"))
            count = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--kill"))
            kill = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--kill-ponr"))
            kill_ponr = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--kill-census"))
            kill_census = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--fail"))
            fail = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--transports"))
            transports = (unsigned)atoi(argv[++i]);
        else if (!strcmp(argv[i], "--caller-device"))
            caller_dev = atoi(argv[++i]);
    }
    if (caller_dev >= 0 && set_caller_device(caller_dev))
        return 1;
    /* the spec's size does not depend on the job: draw it with the rank
     * count the server exports */
    const char *ns = getenv("NRS_MP_SIZE");
    int n = ns ? atoi(ns) : 1;
    tu_rng_t rng = {seed * 0x9e3779b97f4a7c15ull + 7};
    nrs_spec_t s;
    nrs_plan_t cur, next;
    nrs_worker_t *w = NULL;
    long long nv = 0;
    draw_spec(&rng, n, &s);
    if (transports)
        s.runtime.transports = transports;
    int e = nrs_worker_init_spec(&w, &s);
    device_kept("nrs_worker_init_spec");
    if (e) {
        fprintf(stderr, "mp_worker: init: %s: %s\n", nrs_worker_strerror(e),
                nrs_worker_last_error(w));
        nrs_worker_finalize(w);
        return 1;
    }
    int me = nrs_worker_rank(w);
    nrs_worker_set_report_sink(w, sink, NULL);
    draw_plan(&rng, &s, n, 1, &cur);
    e = nrs_worker_set_plan(w, &cur);
    device_kept("nrs_worker_set_plan");
    if (!e) {
        e = nrs_worker_alloc_state(w, NRS_MEM_AUTO, 1);
        device_kept("nrs_worker_alloc_state");
    }
    if (e || check(w, "initial state", &nv)) {
        fprintf(stderr, "mp_worker[%d]: set-up: %s: %s\n", me, nrs_worker_strerror(e),
                nrs_worker_last_error(w));
        goto out;
    }
    if (me == 0 && nrs_worker_last_error(w)[0])
        printf("mp_worker[0]: %s\n", nrs_worker_last_error(w));
    int ncalls = 0;
    if (null_handle(&ncalls) || null_outputs(w) || layer_views(w, &s, "initial state"))
        goto out;
    printf("mp_worker[%d]: NULL checks: %d calls refused a NULL handle, NULL outputs taken\n", me,
           ncalls);
    show_roles(w);
    int armed = 0, skips = 0, retry = 0, failed = 0;
    double t_kill0 = 0;
    if (fail >= 0) { /* rank fail's first transition (attempt 0) */
        char v[32];
        snprintf(v, sizeof v, nomem ? "%d:vote:0" : "%d:0", fail);
        setenv(nomem ? "NRS_WORKER_NOMEM" : "NRS_WORKER_TRANS_FAIL", v, 1);
    }
    if (nomem_census >= 0 || nomem_hostcopy >= 0) {
        char v[32];
        snprintf(v, sizeof v, nomem_census >= 0 ? "%d:census:0" : "%d:hostcopy:0",
                 nomem_census >= 0 ? nomem_census : nomem_hostcopy);
        setenv("NRS_WORKER_NOMEM", v, 1);
    }
    long comms0 = 0, copies0 = 0, comms1 = 0, copies1 = 0;
    for (int t = 1; t <= count; t++) {
        if (!retry && t == retune) /* a retry: the same plan again */
            retune_of(&cur, (unsigned)t + 1, &next);
        else if (!retry)
            draw_plan(&rng, &s, n, (unsigned)t + 1, &next);
        if (kill >= 0 && !armed) {
            int64_t k = pre_ponr_ops(&s, &cur, &next, kill);
            if (k >= 8) {
                armed = 1;
                if (me == kill) {
                    char v[64];
                    snprintf(v, sizeof v, "%d:%lld", kill, (long long)(k / 2));
                    setenv("NRS_WORKER_KILL", v, 1);
                }
            } else if (++skips > 200) {
                fprintf(stderr, "mp_worker[%d]: no draw gives rank %d 8 ops\n", me, kill);
                goto out;
            } else {
                t--; /* not this one: the same draw on every rank */
                continue;
            }
        }
        if (kill_ponr >= 0 && t == 1 && me == kill_ponr) {
            char v[64];
            snprintf(v, sizeof v, "%d:ponr", kill_ponr);
            setenv("NRS_WORKER_KILL", v, 1);
        }
        if (kill_census >= 0 && t == 1) { /* every rank: the others wait for its death */
            char v[32];
            snprintf(v, sizeof v, "%d", kill_census);
            setenv("NRS_WORKER_KILL_CENSUS", v, 1);
        }
        if (!retry) { /* one report a step */
            nrs_worker_report_stage(w, NRS_MS_ACTOR_TRAIN, 0.25 * t);
            nrs_worker_report_memory(w, 1 << 20, 1 << 21, 0);
            nrs_worker_report_step(w, t, 128);
        }
        retry = 0;
        t_kill0 = wall_s();
        int fake = fakegpu_counts_get(&comms0, &copies0);
        e = nrs_worker_transition(w, &next);
        fake = fake || fakegpu_counts_get(&comms1, &copies1);
        device_kept("nrs_worker_transition");
        if (t == 1 && me == nomem_hostcopy) {
            const char *msg = nrs_worker_last_error(w);
            if (e != NRS_ERR_NOMEM || !strstr(msg, "out of memory for host copies")) {
                fprintf(stderr, "mp_worker[%d]: transition 1 without host copies: %s: %s\n", me,
                        nrs_worker_strerror(e), msg);
                goto out;
            }
            printf("mp_worker[%d]: transition 1: no host copies (%s): the device state freed at "
                   "finalize\n", me, msg);
            rc = 0;
            goto out;
        }
        if (fail >= 0 && t == 1 && !failed++) {
            /* rank fail votes no; the others abort with it; all keep the old state */
            char no[64];
            /* the executor's hash vote; a re-tune's one vote (vote_all) */
            snprintf(no, sizeof no, retune == 1 ? "rank %d failed" : "rank %d says no", fail);
            const char *msg = nrs_worker_last_error(w);
            bool ok = me == fail ? e == (nomem ? NRS_ERR_NOMEM : NRS_ERR_XPORT) &&
                                       strstr(msg, "this rank voted no")
                                 : e == NRS_ERR_ABORTED && strstr(msg, no);
            if (!ok) {
                fprintf(stderr, "mp_worker[%d]: transition 1, rank %d failing: %s: %s\n", me, fail,
                        nrs_worker_strerror(e), msg);
                goto out;
            }
            if (check(w, "old state after the failure", &nv))
                goto out;
            printf("mp_worker[%d]: transition 1 failed on rank %d alone (%s): aborted everywhere, "
                   "old state intact (%lld shards)\n", me, fail, nrs_worker_strerror(e), nv);
            retry = 1;
            t--;
            continue;
        }
        double took = wall_s() - t_kill0;
        if (e == NRS_ERR_ABORTED) {
            const char *f = getenv("NRS_MP_KILL_STAMP");
            double kt = 0;
            FILE *fp = f ? fopen(f, "r") : NULL;
            if (fp) {
                if (fscanf(fp, "%lf", &kt) != 1)
                    kt = 0;
                fclose(fp);
            }
            double lag = kt > 0 ? wall_s() - kt : took;
            fprintf(stderr, "mp_worker[%d]: %s\n", me, nrs_worker_last_error(w));
            if (check(w, "old state after the abort", &nv))
                goto out;
            printf("mp_worker[%d]: aborted after %.2f s (%.2f s after the kill, failed rank %d): "
                   "old state intact (%lld shards)\n", me, took, lag,
                   (int)nrs_worker_transition_stat(w, NRS_TS_FAILED_RANK), nv);
            rc = lag < 10.0 ? 3 : 5;
            goto out;
        }
        if (e == NRS_ERR_PARTIAL) {
            printf("mp_worker[%d]: partial: %s\n", me, nrs_worker_last_error(w));
            printf("mp_worker[%d]: census: %g present, %g rebuildable, %g lost\n", me,
                   nrs_worker_transition_stat(w, NRS_TS_PRESENT),
                   nrs_worker_transition_stat(w, NRS_TS_REBUILDABLE),
                   nrs_worker_transition_stat(w, NRS_TS_LOST));
            rc = 6;
            goto out;
        }
        if (e) {
            fprintf(stderr, "mp_worker[%d]: transition %d: %s: %s\n", me, t,
                    nrs_worker_strerror(e), nrs_worker_last_error(w));
            goto out;
        }
        if (check(w, "after the transition", &nv))
            goto out;
        if (t == retune) {
            printf("mp_worker[%d]: re-tune to epoch %d: %s\n", me, nrs_worker_epoch(w),
                   nrs_worker_last_error(w));
            if (!fake)
                printf("mp_worker[%d]: re-tune: %ld communicator(s) made, %ld copies\n", me,
                       comms1 - comms0, copies1 - copies0);
        }
        char when[32];
        snprintf(when, sizeof when, "epoch %d", nrs_worker_epoch(w));
        if (layer_views(w, &s, when))
            goto out;
        if (me == 0)
            printf("mp_worker[0]: epoch %d: %d -> %d GPUs in %.3f s, %g transfer(s), up to %g in "
                   "flight, verified %lld shard(s)\n", nrs_worker_epoch(w), cur.total_gpus,
                   next.total_gpus, nrs_worker_transition_stat(w, NRS_TS_SECONDS),
                   nrs_worker_transition_stat(w, NRS_TS_TRANSFERS),
                   nrs_worker_transition_stat(w, NRS_TS_MAX_INFLIGHT), nv);
        cur = next;
    }
    show_roles(w);
    if (reports != count) {
        fprintf(stderr, "mp_worker[%d]: %d report(s) reached the sink, wanted %d\n", me, reports,
                count);
        goto out;
    }
    printf("mp_worker[%d/%d]: %d transition(s) committed, every shard verified, %d report(s)\n",
           me, n, count, reports);
    rc = 0;
out:
    e = nrs_worker_finalize(w);
    device_kept("nrs_worker_finalize");
    if (caller_dev >= 0 && !dev_bad)
        printf("mp_worker[%d]: the caller's CUDA device %d kept across %d call(s)\n", me,
               caller_dev, dev_checks);
    if (dev_bad && !rc)
        rc = 1;
    return rc;
}
