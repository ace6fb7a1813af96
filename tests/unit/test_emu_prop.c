/* Property tests of transitions over random (plan A, plan B) pairs with a
 * fixed seed: random GPU counts, non-divisible tp/pp changes, dp up and down,
 * released and lost nodes. Each case is built, scheduled and executed on real
 * bytes in-process. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "emu/exec.h"
#include "emu/graph.h"
#include "emu/testutil.h"

enum { CASES = 300, MAX_GPUS = 64 };

/* Allocation hooks (not under the sanitizers, whose own malloc they would
 * bypass): this program's malloc, calloc, realloc and free replace the C
 * library's for the whole process, the library under test included, and
 * forward to it. While on, they count the allocations still live (a leak
 * check of its own), can fail the Nth one, and fill new memory with garbage
 * that differs from run to run (so a result that reads memory nobody wrote
 * differs too). */
#if defined(__has_feature) /* clang's spelling of the sanitizers */
#if __has_feature(address_sanitizer) || __has_feature(memory_sanitizer)
#define NO_ALLOC_HOOKS 1
#endif
#endif
#if !defined(__SANITIZE_ADDRESS__) && !defined(NO_ALLOC_HOOKS)
#define ALLOC_HOOKS 1
#include <malloc.h>
extern void *__libc_malloc(size_t n);
extern void *__libc_calloc(size_t n, size_t k);
extern void *__libc_realloc(void *p, size_t n);
extern void __libc_free(void *p);

static struct {
    int on;
    long calls;    /* allocations asked for while on */
    long fail_at;  /* the one to refuse; -1: none */
    long live;     /* made minus freed while on */
    uint64_t fill; /* 0: none; else the garbage's seed */
} H = {0, 0, -1, 0, 0};

static int hook_refuse(void)
{
    return H.on && H.calls++ == H.fail_at;
}

static void hook_fill(unsigned char *p, size_t from, size_t to)
{
    for (size_t i = from; H.fill && i < to; i++)
        p[i] = (unsigned char)((H.fill >> (8 * (i % 8))) ^ (i / 8));
}

void *malloc(size_t n)
{
    if (hook_refuse())
        return NULL;
    void *p = __libc_malloc(n);
    if (p && H.on) {
        H.live++;
        hook_fill(p, 0, n);
    }
    return p;
}

void *calloc(size_t n, size_t k)
{
    if (hook_refuse())
        return NULL;
    void *p = __libc_calloc(n, k);
    if (p && H.on)
        H.live++;
    return p;
}

void free(void *p)
{
    if (p && H.on)
        H.live--;
    __libc_free(p);
}

void *realloc(void *q, size_t n)
{
    if (!q)
        return malloc(n);
    if (n == 0) {
        free(q);
        return NULL;
    }
    if (hook_refuse())
        return NULL;
    size_t old = malloc_usable_size(q);
    unsigned char *p = __libc_realloc(q, n);
    if (p && H.on && n > old)
        hook_fill(p, old, n);
    return p;
}
#endif

typedef struct {
    nrs_spec_t s;
    nrs_plan_t a, b;
    int map[MAX_GPUS], nmap;
    int lost[MAX_GPUS], nlost;
    nrs_emu_opts_t o;
    const char *kind;
} pair_t;

/* Marks k distinct nodes of [0, n) in gone[] (drawn until k are). */
static void pick_gone(tu_rng_t *r, int n, int k, int *gone)
{
    for (int i = 0; i < k;) {
        int x = tu_int(r, 0, n - 1);
        if (!gone[x]) {
            gone[x] = 1;
            i++;
        }
    }
}

/* A random pair: same GPUs, more nodes, fewer nodes (released: their state is
 * still readable), or lost nodes (their state is gone). */
static void random_pair_ex(tu_rng_t *r, pair_t *c, int infer_only)
{
    static const int64_t chunks[] = {16, 64, 256, 4096};
    memset(c, 0, sizeof(*c));
    tu_spec(&c->s, r);
    if (infer_only) { /* no grads to free first: the tightest memory case */
        c->s.models[NRS_ROLE_ACTOR].present = false;
        c->s.models[NRS_ROLE_CRITIC].present = false;
        if (!c->s.models[NRS_ROLE_REWARD].present) {
            c->s.models[NRS_ROLE_REF] = c->s.models[NRS_ROLE_ACTOR];
            c->s.models[NRS_ROLE_REF].present = true;
        }
    }
    int gpn = c->s.cluster.gpus_per_node, na = tu_int(r, 1, 32 / gpn > 4 ? 4 : 32 / gpn);
    int nb = na, kind = tu_int(r, 0, 3), gone[8] = {0};
    if (na < 2 && kind >= 2)
        kind = 1;
    if (kind == 1)
        nb = na + tu_int(r, 1, 2);
    if (kind >= 2) { /* drop some nodes, maybe add new ones */
        int ndrop = tu_int(r, 1, na - 1);
        pick_gone(r, na, ndrop, gone);
        nb = na - ndrop + tu_int(r, 0, 1);
        for (int n = 0; n < na; n++)
            if (!gone[n])
                for (int k = 0; k < gpn; k++)
                    c->map[c->nmap++] = n * gpn + k;
            else if (kind == 3)
                for (int k = 0; k < gpn; k++)
                    c->lost[c->nlost++] = n * gpn + k;
        for (int extra = na * gpn; c->nmap < nb * gpn; extra++)
            c->map[c->nmap++] = extra;
        c->o.gpu_map = c->map;
        c->o.ngpu_map = c->nmap;
        c->o.lost = c->lost;
        c->o.nlost = c->nlost;
    }
    static const char *const kinds[] = {"same", "grow", "release", "lost"};
    c->kind = kinds[kind];
    tu_plan(&c->s, r, na * gpn, &c->a);
    tu_plan(&c->s, r, nb * gpn, &c->b);
    c->b.epoch = 1;
    c->o.chunk_bytes = chunks[tu_int(r, 0, 3)];
}

static void random_pair(tu_rng_t *r, pair_t *c)
{
    random_pair_ex(r, c, 0);
}

/* The boxes reported lost really survive nowhere. Old actor.generate
 * buffers do not count: they are one optimizer step stale and may feed only
 * generation destinations, so a box surviving only there is lost for
 * actor.train (and a generation box is lost only when no train copy meets it
 * either). */
static void check_lost_is_real(const nrs_emu_graph_t *g)
{
    assert_true(g->nlost > 0);
    for (size_t i = 0; i < g->nlost; i++) {
        const nrs_emu_lost_t *l = &g->lost[i];
        for (int32_t k = 0; k < g->nold; k++) {
            const nrs_emu_buf_t *b = &g->buf[k].b;
            nrs_emu_rect_t m;
            if (g->buf[k].lost || b->role != l->role || b->tensor != l->tensor ||
                b->kind != l->kind || g->from.eng[b->engine].ms == NRS_MS_ACTOR_GENERATE)
                continue;
            assert_false(nrs_emu_rect_meet(&b->box, &l->box, &m));
        }
    }
}

static int execute(const nrs_emu_graph_t *g, int64_t stop, nrs_emu_exec_result_t *res)
{
    nrs_xport_t x;
    nrs_emu_exec_opts_t eo = {.stop_after = stop};
    assert_int_equal(nrs_xport_local_open(&x), 0);
    int rc = nrs_emu_execute(g, &x, &eo, res);
    nrs_xport_close(&x);
    return rc;
}

static void expect_clean(const nrs_emu_exec_result_t *res, int rc, const char *what)
{
    if (rc || res->mismatches || res->use_after_free || res->cap_violations || res->leaks)
        fail_msg("%s: %lld mismatches, %lld use-after-free, %lld over cap, %lld leaks: %s", what,
                 (long long)res->mismatches, (long long)res->use_after_free,
                 (long long)res->cap_violations, (long long)res->leaks, res->first_error);
}

/* Every rank runs only its own ops, in order, with blocking send/recv that
 * complete when both sides have posted: no deadlock, whatever the case. */
static void check_lockstep(const nrs_emu_graph_t *g)
{
    size_t **ops = calloc((size_t)g->nphys, sizeof(size_t *));
    size_t *n = calloc((size_t)g->nphys, sizeof(size_t)), *at = calloc((size_t)g->nphys, sizeof(size_t));
    size_t left = 0;
    for (int r = 0; r < g->nphys; r++) {
        n[r] = nrs_emu_rank_ops(g, r, NULL, 0);
        ops[r] = malloc(sizeof(size_t) * (n[r] + 1));
        nrs_emu_rank_ops(g, r, ops[r], n[r]);
        left += n[r];
    }
    for (int progress = 1; left && progress;) {
        progress = 0;
        for (int r = 0; r < g->nphys; r++) {
            while (at[r] < n[r]) {
                const nrs_emu_op_t *op = &g->ops[ops[r][at[r]]];
                int s = nrs_emu_op_rank(g, op, 0), d = nrs_emu_op_rank(g, op, 1);
                int peer = s == r ? d : s;
                if (op->type == NRS_EMU_OP_XFER && peer != r) {
                    if (at[peer] >= n[peer] || ops[peer][at[peer]] != ops[r][at[r]])
                        break; /* blocked until the peer reaches the same op */
                    at[peer]++;
                    left--;
                }
                at[r]++;
                left--;
                progress = 1;
            }
        }
    }
    assert_int_equal(left, 0);
    for (int r = 0; r < g->nphys; r++)
        free(ops[r]);
    free(ops);
    free(n);
    free(at);
}

/* Every destination shard equals the reference; no use after free; no leak;
 * graph built twice is identical; boxes reported lost are really lost. */
static void test_random_transitions_verify(void **state)
{
    tu_rng_t r = {20240601};
    int ok = 0, lost = 0;
    int64_t shards = 0;
    (void)state;
    for (int i = 0; i < CASES; i++) {
        pair_t c;
        nrs_emu_graph_t *g = NULL, *g2 = NULL;
        nrs_emu_exec_result_t res;
        char err[512];
        random_pair(&r, &c);
        int rc = nrs_emu_transition(&c.s, &c.a, &c.b, &c.o, &g, err, sizeof(err));
        /* again, from copies whose predictions (not part of the layout) differ */
        nrs_plan_t a2 = c.a, b2 = c.b;
        a2.step_s = 1e9;
        b2.ms_time[NRS_MS_ACTOR_TRAIN] = -1;
        b2.capacity_bytes = 3;
        int rc2 = nrs_emu_transition(&c.s, &a2, &b2, &c.o, &g2, err, sizeof(err));
        assert_int_equal(rc, rc2);
        if (rc == NRS_EMU_ELOST) {
            assert_string_equal(c.kind, "lost");
            check_lost_is_real(g);
            lost++;
        } else {
            if (rc)
                fail_msg("case %d (%s): %s", i, c.kind, err);
            assert_int_equal(nrs_emu_graph_hash(g), nrs_emu_graph_hash(g2));
            assert_int_equal(g->nops, g2->nops);
            expect_clean(&res, execute(g, -1, &res), c.kind);
            check_lockstep(g);
            shards += res.verified;
            ok++;
        }
        nrs_emu_graph_free(g);
        nrs_emu_graph_free(g2);
    }
    print_message("random transitions: %d verified (%lld shards), %d reported lost state\n", ok,
                  (long long)shards, lost);
    assert_true(ok > CASES / 2);
    assert_true(lost > 0);
}

/* Tight caps: every GPU fits the old state and the new state, barely. The
 * schedule must stay under the cap at every moment (the executor checks each
 * allocation), staging through host memory when it has to. */
static void test_memory_cap_respected(void **state)
{
    tu_rng_t r = {777};
    int done = 0, staged = 0;
    (void)state;
    for (int i = 0; i < CASES; i++) {
        pair_t c;
        nrs_emu_graph_t *g = NULL;
        nrs_emu_exec_result_t res;
        char err[512];
        random_pair_ex(&r, &c, i % 2);
        c.o.nlost = 0; /* recovery is tested above */
        if (nrs_emu_transition(&c.s, &c.a, &c.b, &c.o, &g, err, sizeof(err)))
            fail_msg("case %d: %s", i, err);
        /* the cap: the larger of each GPU's old and new state, plus the reserve */
        int64_t need = tu_state_need(g);
        nrs_emu_graph_free(g);
        c.o.cap_bytes = need + 2 * c.o.chunk_bytes + tu_int(&r, 0, 3) * (need / 8);
        if (nrs_emu_transition(&c.s, &c.a, &c.b, &c.o, &g, err, sizeof(err)))
            fail_msg("case %d: cap %lld: %s", i, (long long)c.o.cap_bytes, err);
        for (int k = 0; k < g->nphys; k++)
            assert_true(g->peak[k] <= g->cap);
        expect_clean(&res, execute(g, -1, &res), "tight cap");
        check_lockstep(g);
        assert_true(res.peak_max <= c.o.cap_bytes);
        staged += g->nstaged > 0;
        done++;
        nrs_emu_graph_free(g);
    }
    print_message("tight caps: %d transitions under the cap, %d staged through host\n", done,
                  staged);
}

/* A cap below the new state is refused with the GPU named. */
static void test_cap_too_small_is_clear(void **state)
{
    nrs_model_t m;
    nrs_spec_t s;
    nrs_plan_t a, b;
    nrs_layout_t la = {4, 1, 1, 1}, lb = {1, 1, 1, 1};
    nrs_emu_opts_t o = {.chunk_bytes = 64, .cap_bytes = 4096};
    nrs_emu_graph_t *g = NULL;
    char err[512];
    (void)state;
    tu_model(&m, 4, 16, 32, 4, 4, 40);
    tu_spec_fixed(&s, &m, 4);
    tu_plan_single(&s, 4, &la, &a);
    tu_plan_single(&s, 4, &lb, &b);
    assert_int_equal(nrs_emu_transition(&s, &a, &b, &o, &g, err, sizeof(err)), -1);
    assert_null(g);
    assert_non_null(strstr(err, "GPU 0"));
    assert_non_null(strstr(err, "cap"));
}

/* Makespan within 1.25x of the max-over-links lower bound. */
static void test_makespan_near_lower_bound(void **state)
{
    tu_rng_t r = {4242};
    double worst = 0, sum = 0;
    static const double edge[] = {1.001, 1.01, 1.05, 1.10, 1.25};
    int n = 0, hist[6] = {0};
    (void)state;
    for (int i = 0; i < CASES; i++) {
        pair_t c;
        nrs_emu_graph_t *g = NULL;
        char err[512];
        random_pair(&r, &c);
        c.o.nlost = 0;
        c.o.chunk_bytes = 64;
        if (nrs_emu_transition(&c.s, &c.a, &c.b, &c.o, &g, err, sizeof(err)))
            fail_msg("case %d: %s", i, err);
        if (g->lower_bound > 0) {
            double ratio = (double)g->makespan / (double)g->lower_bound;
            if (ratio > worst)
                worst = ratio;
            sum += ratio;
            n++;
            int b = 0;
            while (b < 5 && ratio > edge[b])
                b++;
            hist[b]++;
            if (ratio > 1.25)
                fail_msg("case %d (%s): makespan %lld ps vs lower bound %lld ps: %.3f", i,
                         c.kind, (long long)g->makespan, (long long)g->lower_bound, ratio);
        }
        nrs_emu_graph_free(g);
    }
    print_message("makespan / lower bound over %d cases: worst %.3f, mean %.3f\n", n, worst,
                  n ? sum / n : 0);
    print_message("  <=1.001 %d, <=1.01 %d, <=1.05 %d, <=1.10 %d, <=1.25 %d, >1.25 %d\n",
                  hist[0], hist[1], hist[2], hist[3], hist[4], hist[5]);
}

/* Abort anywhere up to the point of no return: the old state is intact.
 * Past it, old state is gone (so the point is not set too late). */
static void test_abort_before_point_of_no_return(void **state)
{
    tu_rng_t r = {99};
    int past = 0;
    (void)state;
    for (int i = 0; i < CASES / 2; i++) {
        pair_t c;
        nrs_emu_graph_t *g = NULL;
        nrs_emu_exec_result_t res;
        char err[512];
        random_pair(&r, &c);
        c.o.nlost = 0;
        if (nrs_emu_transition(&c.s, &c.a, &c.b, &c.o, &g, err, sizeof(err)))
            fail_msg("case %d: %s", i, err);
        int64_t k = g->ponr ? tu_int(&r, 0, (int)g->ponr) : 0;
        expect_clean(&res, execute(g, k, &res), "abort");
        assert_true(res.aborted || k == (int64_t)g->nops);
        if (g->ponr < (int64_t)g->nops) {
            execute(g, g->ponr + 1, &res);
            assert_true(res.mismatches > 0);
            past++;
        }
        nrs_emu_graph_free(g);
    }
    print_message("aborts: old state intact before the point of no return; %d cases checked "
                  "past it\n",
                  past);
}

static void test_per_rank_programs_deadlock_free(void **state)
{
    tu_rng_t r = {5150};
    (void)state;
    for (int i = 0; i < CASES / 2; i++) {
        pair_t c;
        nrs_emu_graph_t *g = NULL;
        char err[512];
        random_pair(&r, &c);
        int rc = nrs_emu_transition(&c.s, &c.a, &c.b, &c.o, &g, err, sizeof(err));
        if (rc == NRS_EMU_ELOST) {
            nrs_emu_graph_free(g);
            continue;
        }
        if (rc)
            fail_msg("case %d: %s", i, err);
        check_lockstep(g);
        nrs_emu_graph_free(g);
    }
}

/* The per-step weight sync on random plans. */
static void test_random_weight_sync(void **state)
{
    tu_rng_t r = {31337};
    (void)state;
    for (int i = 0; i < CASES / 2; i++) {
        pair_t c;
        nrs_emu_graph_t *g = NULL;
        nrs_emu_exec_result_t res;
        char err[512];
        random_pair(&r, &c);
        if (nrs_emu_weight_sync(&c.s, &c.a, NULL, &g, err, sizeof(err)))
            fail_msg("case %d: %s", i, err);
        expect_clean(&res, execute(g, -1, &res), "sync");
        assert_int_equal(g->ponr, (int64_t)g->nops);
        nrs_emu_graph_free(g);
    }
}

/* Random pairs over what random_pair leaves out: ZeRO-1, ZeRO-3 and
 * optimizer offload in any combination, fp16/fp32 models, head counts of 3,
 * 6 or 12 (tp 3, 6, 12) with any kv count dividing them, 3 or 6 GPUs per
 * node, survivors placed on other indices (a shuffled gpu map) together with
 * lost or released nodes and new GPUs, chunks of 1 and 7 bytes, and old
 * buffers missing on live GPUs. */
static void random_pair_opts(tu_rng_t *r, pair_t *c, unsigned char *missing, size_t nmissing)
{
    static const int gpns[] = {1, 2, 3, 4, 6, 8}, heads[] = {1, 2, 3, 4, 6, 8, 12, 16};
    static const int64_t chunks[] = {1, 7, 16, 64, 4096};
    memset(c, 0, sizeof(*c));
    tu_spec(&c->s, r);
    c->s.cluster.gpus_per_node = gpns[tu_int(r, 0, 5)];
    for (int ro = 0; ro < NRS_ROLE_COUNT; ro++) {
        nrs_model_t *m = &c->s.models[ro];
        if (!m->present)
            continue;
        bool vh = m->value_head;
        int h = heads[tu_int(r, 0, 7)], kv;
        do
            kv = tu_int(r, 1, h);
        while (h % kv);
        tu_model(m, tu_int(r, 1, 9), h * tu_int(r, 1, 3), tu_int(r, 1, 23), h, kv,
                 tu_int(r, 1, 41));
        m->dtype = (nrs_dtype_t)tu_int(r, 0, 2);
        m->tied_embeddings = tu_int(r, 0, 2) == 0;
        m->value_head = vh;
    }
    c->s.runtime.zero1 = tu_int(r, 0, 1);
    c->s.runtime.zero3 = tu_int(r, 0, 2) == 0;
    c->s.runtime.offload_optimizer = tu_int(r, 0, 2) == 0;
    int gpn = c->s.cluster.gpus_per_node, maxn = MAX_GPUS / gpn;
    int na = tu_int(r, 1, maxn / 2 < 6 ? (maxn / 2 > 0 ? maxn / 2 : 1) : 6), nb = na;
    int kind = tu_int(r, 0, 3), gone[MAX_GPUS] = {0}, pool[MAX_GPUS], np = 0;
    if (kind == 2 && na > 1) { /* lose or release some nodes, maybe add new ones */
        int nd = tu_int(r, 1, na - 1);
        pick_gone(r, na, nd, gone);
        nb = na - nd + tu_int(r, 0, 2);
    }
    if (kind == 3)
        nb = na + tu_int(r, 1, 3);
    nb = nb < maxn ? nb : maxn;
    static const char *const kinds[] = {"same", "moved", "lost", "grow"};
    c->kind = kinds[kind];
    if (kind >= 1) {
        for (int n = 0; n < na; n++)
            for (int k = 0; k < gpn; k++) {
                if (!gone[n])
                    pool[np++] = n * gpn + k;
                else
                    c->lost[c->nlost++] = n * gpn + k;
            }
        for (int e = na * gpn; np < nb * gpn; e++)
            pool[np++] = e;
        if (tu_int(r, 0, 1)) /* survivors and new GPUs in any order */
            for (int i = np - 1; i > 0; i--) {
                int j = tu_int(r, 0, i), t = pool[i];
                pool[i] = pool[j];
                pool[j] = t;
            }
        for (int i = 0; i < nb * gpn; i++)
            c->map[c->nmap++] = pool[i];
        c->o.gpu_map = c->map;
        c->o.ngpu_map = c->nmap;
        if (tu_int(r, 0, 1)) { /* else released: still readable */
            c->o.lost = c->lost;
            c->o.nlost = c->nlost;
        }
    }
    tu_plan(&c->s, r, na * gpn, &c->a);
    tu_plan(&c->s, r, nb * gpn, &c->b);
    c->b.epoch = 1;
    c->o.chunk_bytes = chunks[tu_int(r, 0, 4)];
    if (tu_int(r, 0, 3) == 0) {
        nrs_emu_state_t st;
        char err[256];
        if (!nrs_emu_state_build(&c->s, &c->a, NRS_EMU_SEL_PERSISTENT, NULL, 0, &st, err,
                                 sizeof(err))) {
            c->o.nmissing = st.nbuf < nmissing ? st.nbuf : nmissing;
            for (size_t k = 0; k < c->o.nmissing; k++)
                missing[k] = tu_int(r, 0, 9) == 0;
            c->o.missing = missing;
            nrs_emu_state_free(&st);
        }
    }
}

/* The moves of every destination that is neither kept nor a grad partition
 * its box exactly, from a surviving old buffer of the same (role, tensor,
 * kind) that holds the region (never a stale generation one for another
 * engine); kept buffers are identical surviving old ones on the same GPU;
 * the chunked ops carry each move's bytes exactly once, inside both buffers. */
static void check_exact_cover(const nrs_emu_graph_t *g)
{
    int32_t nb = g->nold + g->nnew;
    int64_t *area = calloc((size_t)nb + 1, sizeof(int64_t));
    int64_t *moved = calloc(g->nmoves + 1, sizeof(int64_t));
    assert_non_null(area);
    assert_non_null(moved);
    for (size_t i = 0; i < g->nmoves; i++) {
        const nrs_emu_move_t *mv = &g->moves[i];
        const nrs_emu_gbuf_t *S = &g->buf[mv->src], *D = &g->buf[mv->dst];
        nrs_emu_rect_t in;
        assert_true(mv->src < g->nold && !S->lost);
        assert_true(mv->dst >= g->nold && mv->dst < nb);
        assert_true(D->alias < 0 && D->b.kind != NRS_EMU_GRAD);
        assert_true(S->b.role == D->b.role && S->b.tensor == D->b.tensor &&
                    S->b.kind == D->b.kind && S->b.esize == D->b.esize);
        assert_true(nrs_emu_rect_meet(&S->b.box, &D->b.box, &in));
        assert_true(mv->box.r0 >= in.r0 && mv->box.r1 <= in.r1 && mv->box.c0 >= in.c0 &&
                    mv->box.c1 <= in.c1 && nrs_emu_rect_area(&mv->box) > 0);
        assert_false(g->from.eng[S->b.engine].ms == NRS_MS_ACTOR_GENERATE &&
                     g->to.eng[D->b.engine].ms != NRS_MS_ACTOR_GENERATE);
        area[mv->dst] += nrs_emu_rect_area(&mv->box);
        for (size_t j = i + 1; j < g->nmoves && g->moves[j].dst == mv->dst; j++)
            assert_false(nrs_emu_rect_meet(&mv->box, &g->moves[j].box, &in));
    }
    for (int32_t j = g->nold; j < nb; j++) {
        const nrs_emu_gbuf_t *D = &g->buf[j];
        if (D->alias >= 0) {
            const nrs_emu_gbuf_t *O = &g->buf[D->alias];
            assert_true(D->alias < g->nold && !O->lost && O->b.gpu == D->b.gpu &&
                        O->b.role == D->b.role && O->b.tensor == D->b.tensor &&
                        O->b.kind == D->b.kind && O->b.bytes == D->b.bytes &&
                        !memcmp(&O->b.box, &D->b.box, sizeof(O->b.box)));
        } else if (D->b.kind != NRS_EMU_GRAD) {
            assert_int_equal(area[j], nrs_emu_rect_area(&D->b.box));
        }
    }
    for (size_t i = 0; i < g->nops; i++) {
        const nrs_emu_op_t *op = &g->ops[i];
        if (op->type != NRS_EMU_OP_XFER && op->type != NRS_EMU_OP_COPY)
            continue;
        assert_true(op->move >= 0 && (size_t)op->move < g->nmoves);
        assert_true(op->src_off >= 0 && op->dst_off >= 0 && op->rows > 0);
        assert_true(op->src_off + (op->rows - 1) * op->src_pitch + op->row_bytes <=
                    g->buf[op->src_buf].b.bytes);
        assert_true(op->dst_off + (op->rows - 1) * op->dst_pitch + op->row_bytes <=
                    g->buf[op->dst_buf].b.bytes);
        moved[op->move] += op->rows * op->row_bytes;
    }
    for (size_t i = 0; i < g->nmoves; i++)
        assert_int_equal(moved[i], nrs_emu_rect_area(&g->moves[i].box) *
                                       g->buf[g->moves[i].dst].b.esize);
    free(area);
    free(moved);
}

/* How many copies of kind k each (replica, rank) of engine e holds in total
 * over the dp replicas: dp when every replica holds the kind whole, 1 when
 * ZeRO splits it, 0 when it is not on the GPU. Written from the spec and the
 * docs (docs/transitions.md §1), not from geometry.c. */
static int kind_copies(const nrs_spec_t *s, const nrs_emu_engine_t *e, int k)
{
    const nrs_runtime_t *rt = &s->runtime;
    if (!e->trained && k != NRS_EMU_WEIGHT)
        return 0;
    if (k >= NRS_EMU_MASTER) {
        if (rt->offload_optimizer ||
            (k == NRS_EMU_MASTER && s->models[e->role].dtype == NRS_DTYPE_FP32))
            return 0;
        return rt->zero1 || rt->zero3 ? 1 : e->lay.dp;
    }
    return rt->zero3 && e->ms != NRS_MS_ACTOR_GENERATE ? 1 : e->lay.dp;
}

/* Every rank position (p, t) of every engine, over all dp replicas, holds each
 * element of its weight boxes exactly kind_copies times per kind (no element
 * twice in one ZeRO partition, none missing), nothing outside them, with the
 * kind's element size: the state a transition starts from and must rebuild
 * is the model, whole, under every option. */
static void check_state_cover(const nrs_spec_t *s, const nrs_plan_t *p)
{
    nrs_emu_state_t st;
    char err[256];
    if (nrs_emu_state_build(s, p, NRS_EMU_SEL_PERSISTENT, NULL, 0, &st, err, sizeof(err)))
        fail_msg("state: %s", err);
    for (int e = 0; e < st.nengines; e++) {
        const nrs_emu_engine_t *E = &st.eng[e];
        const nrs_model_t *m = &s->models[E->role];
        int nt = nrs_emu_tensor_count(m), maxb = nrs_emu_rank_boxes_max(m, E->lay.pp);
        nrs_emu_tbox_t *bx = malloc(sizeof(*bx) * (size_t)maxb);
        int32_t *base[16] = {0}, *cnt[16] = {0};
        int rows[16], cols[16];
        assert_true(nt <= 16);
        for (int t = 0; t < nt; t++) {
            nrs_emu_tensor_shape(m, t, &rows[t], &cols[t]);
            base[t] = calloc((size_t)rows[t] * (size_t)cols[t] + 1, sizeof(int32_t));
            cnt[t] = calloc((size_t)rows[t] * (size_t)cols[t] + 1, sizeof(int32_t));
        }
        for (int rank = 0; rank < E->lay.tp * E->lay.pp; rank++) {
            int n = nrs_emu_rank_boxes(m, E->lay.tp, E->lay.pp, rank / E->lay.tp,
                                       rank % E->lay.tp, bx, maxb);
            for (int t = 0; t < nt; t++)
                memset(base[t], 0, sizeof(int32_t) * (size_t)rows[t] * (size_t)cols[t]);
            for (int i = 0; i < n; i++)
                for (int y = bx[i].box.r0; y < bx[i].box.r1; y++)
                    for (int x = bx[i].box.c0; x < bx[i].box.c1; x++)
                        base[bx[i].tensor][y * cols[bx[i].tensor] + x]++;
            for (int k = 0; k < NRS_EMU_KIND_COUNT; k++) {
                int want = kind_copies(s, E, k);
                int es = k >= NRS_EMU_MASTER || m->dtype == NRS_DTYPE_FP32 ? 4 : 2;
                for (int t = 0; t < nt; t++)
                    memset(cnt[t], 0, sizeof(int32_t) * (size_t)rows[t] * (size_t)cols[t]);
                for (size_t i = 0; i < st.nbuf; i++) {
                    const nrs_emu_buf_t *b = &st.buf[i];
                    if (b->engine != e || b->rank != rank || b->kind != k)
                        continue;
                    assert_int_equal(b->esize, es);
                    assert_int_equal(b->bytes, nrs_emu_rect_area(&b->box) * es);
                    assert_true(b->box.r0 >= 0 && b->box.r1 <= rows[b->tensor] &&
                                b->box.c0 >= 0 && b->box.c1 <= cols[b->tensor]);
                    for (int y = b->box.r0; y < b->box.r1; y++)
                        for (int x = b->box.c0; x < b->box.c1; x++)
                            cnt[b->tensor][y * cols[b->tensor] + x]++;
                }
                for (int t = 0; t < nt; t++)
                    for (int j = 0; j < rows[t] * cols[t]; j++)
                        if (cnt[t][j] != base[t][j] * want)
                            fail_msg("engine %d (%s) rank %d %s tensor %d element %d: %d "
                                     "copies, want %d", e, nrs_ms_name(E->ms), rank,
                                     nrs_emu_kind_name(k), t, j, cnt[t][j],
                                     base[t][j] * want);
            }
        }
        for (int t = 0; t < nt; t++) {
            free(base[t]);
            free(cnt[t]);
        }
        free(bx);
    }
    nrs_emu_state_free(&st);
}

static void test_state_covers_model(void **state)
{
    static unsigned char missing[1 << 16];
    tu_rng_t r = {31337};
    (void)state;
    for (int i = 0; i < CASES; i++) {
        pair_t c;
        random_pair_opts(&r, &c, missing, sizeof(missing));
        check_state_cover(&c.s, &c.a);
        check_state_cover(&c.s, &c.b);
    }
}

static void test_random_options_and_maps(void **state)
{
    static unsigned char missing[1 << 16];
    tu_rng_t r = {8675309};
    int ok = 0, lost = 0, staged = 0;
    (void)state;
    for (int i = 0; i < CASES; i++) {
        pair_t c;
        nrs_emu_graph_t *g = NULL, *g2 = NULL;
        nrs_emu_exec_result_t res;
        char err[512];
        random_pair_opts(&r, &c, missing, sizeof(missing));
        int rc = nrs_emu_transition(&c.s, &c.a, &c.b, &c.o, &g, err, sizeof(err));
        int rc2 = nrs_emu_transition(&c.s, &c.a, &c.b, &c.o, &g2, err, sizeof(err));
        assert_int_equal(rc, rc2);
        if (rc == NRS_EMU_ELOST) {
            check_lost_is_real(g);
            lost++;
        } else {
            if (rc)
                fail_msg("case %d (%s): %s", i, c.kind, err);
            assert_int_equal(nrs_emu_graph_hash(g), nrs_emu_graph_hash(g2));
            check_exact_cover(g);
            expect_clean(&res, execute(g, -1, &res), c.kind);
            check_lockstep(g);
            /* again under a cap that holds only the larger of each GPU's
             * old and new state */
            int64_t need = tu_state_need(g);
            nrs_emu_graph_free(g2);
            g2 = NULL;
            c.o.cap_bytes = need + 2 * g->chunk;
            if (nrs_emu_transition(&c.s, &c.a, &c.b, &c.o, &g2, err, sizeof(err)))
                fail_msg("case %d (%s): cap %lld: %s", i, c.kind, (long long)c.o.cap_bytes,
                         err);
            check_exact_cover(g2);
            expect_clean(&res, execute(g2, -1, &res), "tight cap");
            assert_true(res.peak_max <= c.o.cap_bytes);
            check_lockstep(g2);
            staged += g2->nstaged > 0;
            ok++;
        }
        nrs_emu_graph_free(g);
        nrs_emu_graph_free(g2);
    }
    print_message("options and maps: %d verified (%d under a tight cap staged), %d reported "
                  "lost state\n",
                  ok, staged, lost);
    assert_true(ok > CASES / 2);
    assert_true(lost > 0);
}

/* Rotation of a plan's pools: every model-stage moves to the next pool (a
 * new layout where it does not fit there), so GPUs that must receive must
 * also send. Under a cap that holds only the larger of each GPU's old and
 * new state this is where host staging happens; the up-front check promises
 * that it always can (a GPU that cannot fit still holds an old buffer with
 * reads to stage). Every case must schedule, stay under the cap in the
 * executor, verify, run in lockstep and abort cleanly before its point of
 * no return. */
static void test_rotated_pools_under_tight_caps(void **state)
{
    tu_rng_t r = {271828};
    int done = 0, staged = 0;
    int64_t nstaged = 0;
    (void)state;
    for (int i = 0; i < CASES / 2; i++) {
        pair_t c;
        nrs_emu_graph_t *g = NULL;
        nrs_emu_exec_result_t res;
        char err[512];
        random_pair_ex(&r, &c, i % 3 != 0);
        c.o = (nrs_emu_opts_t){.chunk_bytes = c.o.chunk_bytes}; /* the same GPUs */
        if (i % 2 == 0) { /* ref and reward of the same size on equal pools */
            int gpn = c.s.cluster.gpus_per_node, n = gpn * tu_int(&r, 1, 16 / gpn > 1 ? 16 / gpn : 1);
            nrs_model_t m = c.s.models[NRS_ROLE_ACTOR]; /* or another present one */
            for (int ro = NRS_ROLE_REWARD; ro > NRS_ROLE_ACTOR; ro--)
                if (c.s.models[ro].present)
                    m = c.s.models[ro];
            m.present = true;
            m.value_head = false;
            memset(c.s.models, 0, sizeof(c.s.models));
            c.s.models[NRS_ROLE_REF] = c.s.models[NRS_ROLE_REWARD] = m;
            memset(&c.a, 0, sizeof(c.a));
            c.a.total_gpus = 2 * n;
            c.a.npools = 2;
            c.a.pools[0] = (nrs_pool_t){0, n};
            c.a.pools[1] = (nrs_pool_t){n, n};
            c.a.has[NRS_MS_REF_INFER] = c.a.has[NRS_MS_REWARD_INFER] = true;
            c.a.pool_of[NRS_MS_REWARD_INFER] = 1;
            tu_layout(&m, &r, n, &c.a.layout[NRS_MS_REF_INFER]);
            c.a.layout[NRS_MS_REWARD_INFER] = c.a.layout[NRS_MS_REF_INFER];
        }
        c.b = c.a;
        c.b.epoch = 1;
        if (c.a.npools < 2)
            continue;
        for (int ms = 0; ms < NRS_MS_COUNT; ms++) {
            if (!c.a.has[ms] || ms == NRS_MS_ACTOR_INFER || ms == NRS_MS_CRITIC_INFER)
                continue;
            int p = (c.a.pool_of[ms] + 1) % c.a.npools;
            const nrs_layout_t *l = &c.a.layout[ms];
            c.b.pool_of[ms] = p;
            if (l->tp * l->pp * l->dp > c.b.pools[p].gpus || tu_int(&r, 0, 3) == 0)
                tu_layout(&c.s.models[nrs_ms_role(ms)], &r, c.b.pools[p].gpus, &c.b.layout[ms]);
        }
        for (int k = 0; k < 2; k++) { /* infer stages share their train stage's engine */
            int inf = k ? NRS_MS_CRITIC_INFER : NRS_MS_ACTOR_INFER;
            int tr = k ? NRS_MS_CRITIC_TRAIN : NRS_MS_ACTOR_TRAIN;
            c.b.pool_of[inf] = c.b.pool_of[tr];
            c.b.layout[inf] = c.b.layout[tr];
        }
        if (nrs_emu_transition(&c.s, &c.a, &c.b, &c.o, &g, err, sizeof(err)))
            fail_msg("case %d: %s", i, err);
        c.o.cap_bytes = tu_state_need(g) + 2 * g->chunk + tu_int(&r, 0, 2) * g->chunk;
        nrs_emu_graph_free(g);
        g = NULL;
        if (nrs_emu_transition(&c.s, &c.a, &c.b, &c.o, &g, err, sizeof(err)))
            fail_msg("case %d: cap %lld: %s", i, (long long)c.o.cap_bytes, err);
        for (int k = 0; k < g->nphys; k++)
            assert_true(g->peak[k] <= g->cap);
        expect_clean(&res, execute(g, -1, &res), "rotated, tight cap");
        assert_true(res.peak_max <= c.o.cap_bytes);
        check_exact_cover(g);
        check_lockstep(g);
        int64_t k = g->ponr ? tu_int(&r, 0, (int)g->ponr) : 0;
        expect_clean(&res, execute(g, k, &res), "rotated, aborted");
        staged += g->nstaged > 0;
        nstaged += g->nstaged;
        done++;
        nrs_emu_graph_free(g);
    }
    print_message("rotated pools: %d transitions under tight caps, %d staged (%lld buffers)\n",
                  done, staged, (long long)nstaged);
    assert_true(done > CASES / 4 && staged > done / 4);
}

#ifdef ALLOC_HOOKS
typedef struct {
    int rc;            /* build: 0, NRS_EMU_ELOST, -1 */
    uint64_t hash;     /* of the graph built */
    int64_t lower_bound;
    int exec_rc;       /* execution */
    int64_t verified;  /* shards verified */
} alloc_run_t;

/* Build, schedule and execute c (a weight sync when sync) with the hooks on:
 * allocation fail_at refused (-1: none), new memory filled from seed. */
static void alloc_run(const pair_t *c, int sync, long fail_at, uint64_t seed, alloc_run_t *out,
                      char *err, size_t errlen)
{
    nrs_emu_graph_t *g = NULL;
    nrs_xport_t x;
    nrs_emu_exec_result_t res;
    memset(out, 0, sizeof(*out));
    err[0] = 0;
    H = (typeof(H)){1, 0, fail_at, 0, seed};
    out->rc = sync ? nrs_emu_weight_sync(&c->s, &c->a, &c->o, &g, err, errlen)
                   : nrs_emu_transition(&c->s, &c->a, &c->b, &c->o, &g, err, errlen);
    out->exec_rc = -1;
    if (out->rc == 0) {
        out->hash = nrs_emu_graph_hash(g);
        out->lower_bound = g->lower_bound;
        if (nrs_xport_local_open(&x) == 0) {
            out->exec_rc = nrs_emu_execute(g, &x, NULL, &res);
            out->verified = res.verified;
            nrs_xport_close(&x);
        }
    }
    nrs_emu_graph_free(g);
    H.on = 0;
}

/* Every allocation of a build, schedule and execution refused in turn: the
 * build fails with a message, or it succeeds with the very graph (a refused
 * scratch buffer may only cost speed, as qsort's does); the execution
 * reports the failure or verifies every shard; nothing leaks. And with the
 * new memory full of garbage that differs from run to run, the graph is the
 * same: no result depends on memory nobody wrote (every rank and the
 * controller must build the identical op list). */
static void test_allocation_failures_and_garbage(void **state)
{
    tu_rng_t r = {1234567};
    int cases = 0, refused = 0, staged = 0, lost = 0, syncs = 0;
    long allocs = 0;
    (void)state;
    for (int i = 0; i < 14; i++) {
        pair_t c;
        alloc_run_t ref, run;
        char err[512];
        int sync = i % 4 == 3;
        random_pair(&r, &c);
        if (i == 13) { /* nothing changes: no communicator to set up */
            nrs_model_t m;
            nrs_layout_t l = {2, 2, 2, 1};
            memset(&c, 0, sizeof(c));
            tu_model(&m, 4, 16, 32, 4, 4, 40);
            tu_spec_fixed(&c.s, &m, 4);
            tu_plan_single(&c.s, 8, &l, &c.a);
            c.b = c.a;
        }
        if (i % 4 == 2 || i == 12) { /* a tight cap: host staging's allocations too */
            nrs_emu_graph_t *g = NULL;
            if (i == 12) { /* pools swapped: staging certain */
                memset(&c, 0, sizeof(c));
                tu_plan_swap(&c.s, &c.a, &c.b);
                c.o.chunk_bytes = 64;
            }
            c.o.nlost = 0;
            if (nrs_emu_transition(&c.s, &c.a, &c.b, &c.o, &g, err, sizeof(err)) == 0)
                c.o.cap_bytes = tu_state_need(g) + 2 * g->chunk;
            nrs_emu_graph_free(g);
            g = NULL;
            if (nrs_emu_transition(&c.s, &c.a, &c.b, &c.o, &g, err, sizeof(err)) == 0)
                staged += g->nstaged > 0;
            nrs_emu_graph_free(g);
        }
        alloc_run(&c, sync, -1, 0, &ref, err, sizeof(err));
        if (H.live)
            fail_msg("case %d: %ld allocations never freed", i, H.live);
        if (ref.rc == -1) /* a sync of a plan without both engines */
            continue;
        if (ref.rc == 0 && ref.exec_rc)
            fail_msg("case %d: execution failed without a refused allocation", i);
        lost += ref.rc == NRS_EMU_ELOST;
        syncs += sync;
        for (uint64_t seed = 1; seed <= 3; seed++) {
            alloc_run(&c, sync, -1, seed * 0x9e3779b97f4a7c15ull, &run, err, sizeof(err));
            assert_int_equal(run.rc, ref.rc);
            if (run.hash != ref.hash)
                fail_msg("case %d: graph differs with other garbage in new memory", i);
        }
        long n = H.calls;
        allocs += n;
        for (long k = 0; k < n; k++) {
            alloc_run(&c, sync, k, 0, &run, err, sizeof(err));
            if (H.live)
                fail_msg("case %d, allocation %ld of %ld refused: %ld allocations never freed "
                         "(build %d: %s)", i, k, n, H.live, run.rc, err);
            if (run.rc == -1) {
                if (!err[0])
                    fail_msg("case %d, allocation %ld refused: the build failed without a "
                             "message", i, k);
                refused++;
                continue;
            }
            if (run.rc != ref.rc || (run.rc == 0 && (run.hash != ref.hash ||
                                                     run.lower_bound != ref.lower_bound)))
                fail_msg("case %d, allocation %ld refused: build %d (want %d), another graph "
                         "(lower bound %lld ps, want %lld)", i, k, run.rc, ref.rc,
                         (long long)run.lower_bound, (long long)ref.lower_bound);
            if (run.rc == 0 && run.exec_rc == 0 && run.verified != ref.verified)
                fail_msg("case %d, allocation %ld refused: execution succeeded having verified "
                         "%lld of %lld shards", i, k, (long long)run.verified,
                         (long long)ref.verified);
        }
        cases++;
    }
    print_message("allocation failures: %d cases (%d syncs, %d staged, %d with lost state), "
                  "%ld allocations refused one by one (%d builds failed cleanly)\n",
                  cases, syncs, staged, lost, allocs, refused);
    assert_true(cases >= 8 && syncs > 0 && staged > 0 && lost > 0);
}
#else
static void test_allocation_failures_and_garbage(void **state)
{
    (void)state;
    skip(); /* the sanitizers own malloc here */
}
#endif

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_random_transitions_verify),
        cmocka_unit_test(test_memory_cap_respected),
        cmocka_unit_test(test_cap_too_small_is_clear),
        cmocka_unit_test(test_makespan_near_lower_bound),
        cmocka_unit_test(test_abort_before_point_of_no_return),
        cmocka_unit_test(test_random_weight_sync),
        cmocka_unit_test(test_per_rank_programs_deadlock_free),
        cmocka_unit_test(test_random_options_and_maps),
        cmocka_unit_test(test_state_covers_model),
        cmocka_unit_test(test_allocation_failures_and_garbage),
        cmocka_unit_test(test_rotated_pools_under_tight_caps),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
