/* mp_worker: one rank driving the public worker API (include/nereus/nereus.h)
 * under tests/mp/pmix_srv.
 *
 *   mp_worker [--seed N] [--count K] [--kill RANK] [--kill-ponr RANK]
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
 * and exit 6.
 *
 * Before the chain every rank calls each public function with a NULL
 * handle (each must return its failure value and name itself in
 * nrs_worker_last_error(NULL)) and the calls with output pointers with
 * NULL ones on its real handle, then prints
 *   mp_worker[i]: NULL checks: N calls refused a NULL handle, NULL outputs taken
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "emu/graph.h"
#include "emu/testutil.h"
#include "nereus/nereus.h"

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

static int reports;
static void sink(void *arg, const char *json)
{
    (void)arg;
    reports += strstr(json, "\"type\":\"report\"") != NULL;
}

static int check(nrs_worker_t *w, const char *when, long long *nv)
{
    long long v, m;
    int rc = nrs_worker_verify_state(w, &v, &m);
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
    int count = 4, kill = -1, kill_ponr = -1, rc = 1;
    for (int i = 1; i + 1 < argc; i++) {
        if (!strcmp(argv[i], "--seed"))
            seed = strtoull(argv[++i], NULL, 0);
        else if (!strcmp(argv[i], "--count"))
            count = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--kill"))
            kill = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--kill-ponr"))
            kill_ponr = atoi(argv[++i]);
    }
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
    int e = nrs_worker_init_spec(&w, &s);
    if (e) {
        fprintf(stderr, "mp_worker: init: %s: %s\n", nrs_worker_strerror(e),
                nrs_worker_last_error(w));
        nrs_worker_finalize(w);
        return 1;
    }
    int me = nrs_worker_rank(w);
    nrs_worker_set_report_sink(w, sink, NULL);
    draw_plan(&rng, &s, n, 1, &cur);
    if ((e = nrs_worker_set_plan(w, &cur)) || (e = nrs_worker_alloc_state(w, NRS_MEM_AUTO, 1)) ||
        check(w, "initial state", &nv)) {
        fprintf(stderr, "mp_worker[%d]: set-up: %s: %s\n", me, nrs_worker_strerror(e),
                nrs_worker_last_error(w));
        goto out;
    }
    if (me == 0 && nrs_worker_last_error(w)[0])
        printf("mp_worker[0]: %s\n", nrs_worker_last_error(w));
    int ncalls = 0;
    if (null_handle(&ncalls) || null_outputs(w))
        goto out;
    printf("mp_worker[%d]: NULL checks: %d calls refused a NULL handle, NULL outputs taken\n", me,
           ncalls);
    show_roles(w);
    int armed = 0, skips = 0;
    double t_kill0 = 0;
    for (int t = 1; t <= count; t++) {
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
        nrs_worker_report_stage(w, NRS_MS_ACTOR_TRAIN, 0.25 * t);
        nrs_worker_report_memory(w, 1 << 20, 1 << 21, 0);
        nrs_worker_report_step(w, t, 128);
        t_kill0 = wall_s();
        e = nrs_worker_transition(w, &next);
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
    return rc;
}
