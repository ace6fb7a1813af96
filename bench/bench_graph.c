/* bench_graph: transition graph makespan against its lower bound, and the
 * time to build + schedule a graph, on Llama-3 shapes and on random plans.
 * Usage: bench_graph [CASES]        (a benchmark, never a timed test)
 *            the named cases, then CASES random plans (default 100)
 *        bench_graph exec [SCALE]
 *            the named cases of up to 64 GPUs, scaled down (default 1/256):
 *            the in-process executor against plain memcpy of the same ops'
 *            bytes, in the same run
 *        bench_graph scale SPEC [GPUS...]
 *            the best plan of SPEC at response 1024 -> 3072 on 64, 256, 512 and
 *            1024 GPUs (or GPUS): build + schedule time and where it went
 *            (docs/transitions.md §6), makespan / lower bound, graph hash */
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "emu/exec.h"
#include "emu/graph.h"
#include "emu/xport.h"
#include "nereus/spec.h"
#include "emu/testutil.h"

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void h200(nrs_spec_t *s)
{
    s->cluster.gpus_per_node = 8;
    s->cluster.intra_gbps = 450;
    s->cluster.inter_gbps = 50;
    s->cluster.hbm_gbps = 4800;
    s->cluster.host_gbps = 55;
    s->cluster.gpu_mem_gib = 141;
}

/* A count on the command line: digits only, at least min. */
static int parse_int(const char *s, int min, int *out)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (end == s || *end || *s == '-' || *s == '+' || v < min || v > 1 << 30)
        return -1;
    *out = (int)v;
    return 0;
}

typedef struct {
    const char *name;
    int big; /* 70B */
    int ga, gb;
    nrs_layout_t a, b;
} named_t;

/* Llama-3-8B or -70B shapes as the one model of an 8-GPU-per-node H200 spec. */
static void named_spec(const named_t *c, nrs_model_t *m, nrs_spec_t *s)
{
    if (c->big)
        tu_model(m, 80, 8192, 28672, 64, 8, 128256);
    else
        tu_model(m, 32, 4096, 14336, 32, 8, 128256);
    tu_spec_fixed(s, m, 8);
    h200(s);
}

/* Each run_* prints its figures and returns 0, or 1 when a case failed
 * (its error printed): the exit status then says that a figure is missing. */
static int run_named(const named_t *c)
{
    nrs_model_t m;
    nrs_spec_t s;
    nrs_plan_t a, b;
    nrs_emu_graph_t *g = NULL;
    char err[512];
    named_spec(c, &m, &s);
    tu_plan_single(&s, c->ga, &c->a, &a);
    tu_plan_single(&s, c->gb, &c->b, &b);
    double t0 = now_s();
    int rc = nrs_emu_transition(&s, &a, &b, NULL, &g, err, sizeof(err));
    double t1 = now_s();
    if (rc) {
        printf("%-44s error: %s\n", c->name, err);
        nrs_emu_graph_free(g);
        return 1;
    }
    double ms = (double)g->makespan * 1e-12, lb = (double)g->lower_bound * 1e-12;
    printf("%-44s %8zu ops %9.4f s  lb %9.4f s  ratio %.3f  build %.3f s\n", c->name, g->nops,
           ms, lb, lb > 0 ? ms / lb : 1, t1 - t0);
    nrs_emu_graph_free(g);
    return 0;
}

/* Plain memcpy of g's copies and transfers, in its order: the old buffers
 * allocated and written first (untimed), new ones allocated at their ALLOC
 * (first touch costs the same; grads zeroed, as the executor zeroes them),
 * each op's bytes one memcpy from its source offset to its destination
 * offset (clipped to the buffers); strided: row by row at the op's pitches,
 * as any copy of those regions must. Seconds. */
static double memcpy_baseline(const nrs_emu_graph_t *g, int strided)
{
    char **mem = calloc(g->nbuf + 1, sizeof(char *));
    double t = 0;
    if (!mem)
        return 0;
    for (int32_t i = 0; i < g->nold; i++)
        if ((mem[i] = malloc((size_t)g->buf[i].b.bytes + 1)))
            memset(mem[i], 1, (size_t)g->buf[i].b.bytes);
    double t0 = now_s();
    for (size_t i = 0; i < g->nops; i++) {
        const nrs_emu_op_t *op = &g->ops[i];
        int32_t d = op->dst_buf >= 0 ? nrs_emu_canon(g, op->dst_buf) : -1;
        int32_t sb = op->src_buf >= 0 ? nrs_emu_canon(g, op->src_buf) : -1;
        if (op->type == NRS_EMU_OP_ALLOC && d >= 0 && !mem[d]) {
            mem[d] = malloc((size_t)g->buf[d].b.bytes + 1);
            if (mem[d] && g->buf[d].b.kind == NRS_EMU_GRAD) /* as the executor: zero grads */
                memset(mem[d], 0, (size_t)g->buf[d].b.bytes);
        } else if (op->type == NRS_EMU_OP_FREE && sb >= 0) {
            free(mem[sb]);
            mem[sb] = NULL;
        } else if ((op->type == NRS_EMU_OP_COPY || op->type == NRS_EMU_OP_XFER ||
                    op->type == NRS_EMU_OP_STAGE) && d >= 0 && sb >= 0) {
            if (!mem[d]) /* a host staging buffer: allocated at the stage */
                mem[d] = malloc((size_t)g->buf[d].b.bytes + 1);
            int64_t n = (int64_t)op->rows * op->row_bytes;
            int64_t so = op->src_off, dof = op->dst_off;
            int64_t sr = g->buf[sb].b.bytes, dr = g->buf[d].b.bytes;
            n = n < sr ? n : sr;
            n = n < dr ? n : dr;
            so = so + n <= sr ? so : sr - n;
            dof = dof + n <= dr ? dof : dr - n;
            if (mem[d] && mem[sb] && strided && op->rows > 1)
                for (int32_t k = 0; k < op->rows; k++)
                    memcpy(mem[d] + op->dst_off + k * op->dst_pitch,
                           mem[sb] + op->src_off + k * op->src_pitch, (size_t)op->row_bytes);
            else if (mem[d] && mem[sb])
                memcpy(mem[d] + dof, mem[sb] + so, (size_t)n);
            __asm__ __volatile__("" : : "r"(mem[d]) : "memory");
        }
    }
    t = now_s() - t0;
    for (size_t i = 0; i < g->nbuf; i++)
        free(mem[i]);
    free(mem);
    return t;
}

/* The executor (local transport) on case c scaled down, against plain memcpy
 * of each copy and transfer's bytes into buffers allocated as the graph
 * allocates them, in the same run. */
static int run_exec(const named_t *c, double scale)
{
    nrs_model_t m;
    nrs_spec_t s, ss;
    nrs_plan_t a, b;
    nrs_emu_graph_t *g = NULL;
    nrs_emu_opts_t o = {0};
    nrs_xport_t x;
    nrs_emu_exec_result_t res;
    char err[512];
    named_spec(c, &m, &s);
    s.cluster.gpu_mem_gib = 1e6; /* scaled: the full cap does not apply */
    nrs_emu_scale_spec(&s, scale, &ss);
    tu_plan_single(&ss, c->ga, &c->a, &a);
    tu_plan_single(&ss, c->gb, &c->b, &b);
    o.chunk_bytes = 1 << 20;
    if (nrs_emu_transition(&ss, &a, &b, &o, &g, err, sizeof(err)) || nrs_xport_local_open(&x)) {
        printf("%-44s error: %s\n", c->name, err);
        nrs_emu_graph_free(g);
        return 1;
    }
    nrs_emu_exec_opts_t eo = {.stop_after = -1, .no_poison = true}; /* as memcpy: no poison */
    int64_t state = 0, budget = (int64_t)sysconf(_SC_PHYS_PAGES) * sysconf(_SC_PAGESIZE) / 3 * 2;
    for (size_t i = 0; i < g->nbuf; i++)
        state += g->buf[i].b.bytes;
    if (state > budget) { /* old + new state at the peak: stay inside RAM */
        printf("%-44s skipped: %.1f GB of state at this scale, over two thirds of the RAM\n",
               c->name, (double)state / 1e9);
        nrs_xport_close(&x);
        nrs_emu_graph_free(g);
        return 0;
    }
    int rc = 0;
    double t = 0, ts = 0;
    for (int pass = 0; pass < 2; pass++) { /* the second pass of each is reported */
        rc |= nrs_emu_execute(g, &x, &eo, &res); /* either pass failing fails the case */
        t = memcpy_baseline(g, 0);
        ts = memcpy_baseline(g, 1);
    }
    nrs_xport_close(&x);
    double mb = (double)res.bytes_moved / 1e6;
    printf("%-44s %7.1f MB %6zu ops  executor %7.1f MB/s  memcpy %7.1f (ratio %.2f)  "
           "strided memcpy %7.1f (ratio %.2f)  %s\n",
           c->name, mb, g->nops, res.run_s > 0 ? mb / res.run_s : 0, t > 0 ? mb / t : 0,
           res.run_s > 0 && t > 0 ? t / res.run_s : 0, ts > 0 ? mb / ts : 0,
           res.run_s > 0 && ts > 0 ? ts / res.run_s : 0,
           rc ? "VERIFY FAILED" : "every shard verified");
    nrs_emu_graph_free(g);
    return rc ? 1 : 0;
}

/* Random plans of a random Llama-3-8B-shaped job on 8..64 GPUs. */
static int run_random(int cases)
{
    tu_rng_t r = {12345};
    double worst = 0, sum = 0, tmax = 0;
    int n = 0;
    for (int i = 0; i < cases; i++) {
        nrs_spec_t s;
        nrs_plan_t a, b;
        nrs_emu_graph_t *g = NULL;
        nrs_emu_opts_t o = {0};
        char err[512];
        tu_spec(&s, &r);
        h200(&s);
        s.cluster.gpu_mem_gib = 1e6; /* makespan, not memory, is measured here */
        for (int k = 0; k < NRS_ROLE_COUNT; k++)
            if (s.models[k].present) {
                nrs_model_t *m = &s.models[k];
                int heads = m->heads, kv = m->kv_heads, vh = m->value_head;
                tu_model(m, 32, heads * 128, 14336, heads, kv, 128256);
                m->value_head = vh;
            }
        tu_plan(&s, &r, 8 * tu_int(&r, 1, 8), &a);
        tu_plan(&s, &r, 8 * tu_int(&r, 1, 8), &b);
        o.chunk_bytes = (int64_t)1 << tu_int(&r, 22, 26);
        double t0 = now_s();
        if (nrs_emu_transition(&s, &a, &b, &o, &g, err, sizeof(err))) {
            printf("random %d: %s\n", i, err);
            nrs_emu_graph_free(g);
            continue;
        }
        double t = now_s() - t0;
        double ratio = g->lower_bound > 0 ? (double)g->makespan / (double)g->lower_bound : 1;
        tmax = t > tmax ? t : tmax;
        worst = ratio > worst ? ratio : worst;
        sum += ratio;
        n++;
        nrs_emu_graph_free(g);
    }
    printf("random 8B-shaped plans, %d cases: makespan/lower bound worst %.3f mean %.3f; "
           "slowest build %.3f s\n",
           n, worst, n ? sum / n : 0, tmax);
    return n < cases;
}

/* The transition the controller prices when the response length triples:
 * best plan at 1024 tokens -> best plan at 3072, same GPUs. */
static int run_scale(const char *path, int argc, char **argv)
{
    int sizes[16] = {64, 256, 512, 1024}, nsizes = 4, failed = 0;
    nrs_spec_t s;
    char err[512];
    if (argc > 16) {
        fprintf(stderr, "bench_graph scale: 16 GPU counts at most\n");
        return 2;
    }
    if (argc > 0) /* explicit sizes */
        for (nsizes = 0; nsizes < argc; nsizes++)
            if (parse_int(argv[nsizes], 1, &sizes[nsizes])) {
                fprintf(stderr, "bench_graph scale: '%s' is not a GPU count\n", argv[nsizes]);
                return 2;
            }
    if (nrs_spec_load(path, &s, err, sizeof(err))) {
        fprintf(stderr, "%s: %s\n", path, err);
        return 1;
    }
    for (int i = 0; i < nsizes; i++) {
        nrs_plan_req_t req;
        nrs_plan_t a, b;
        nrs_emu_graph_t *g = NULL;
        nrs_emu_stats_t st;
        nrs_plan_req_init(&req, &s);
        req.gpus = sizes[i];
        req.work.response_len = 1024;
        if (nrs_plan_best(&s, &req, &a, err, sizeof(err))) {
            printf("%5d GPUs: plan: %s\n", sizes[i], err);
            failed = 1;
            continue;
        }
        req.work.response_len = 3072;
        if (nrs_plan_best(&s, &req, &b, err, sizeof(err))) {
            printf("%5d GPUs: plan: %s\n", sizes[i], err);
            failed = 1;
            continue;
        }
        double t0 = now_s();
        int rc = nrs_emu_transition(&s, &a, &b, NULL, &g, err, sizeof(err));
        double t = now_s() - t0;
        if (rc) {
            printf("%5d GPUs: transition: %s\n", sizes[i], err);
            nrs_emu_graph_free(g);
            failed = 1;
            continue;
        }
        nrs_emu_graph_stats(g, &st);
        printf("%5d GPUs: %9.1f ms  %7zu moves %8zu ops  makespan %.6f s  lb %.6f s  "
               "ratio %.4f  hash %016llx\n",
               sizes[i], t * 1e3, g->nmoves, g->nops, st.makespan_s, st.lower_bound_s,
               st.lower_bound_s > 0 ? st.makespan_s / st.lower_bound_s : 1,
               (unsigned long long)st.hash);
        printf("           phases: states %.1f ms, buffers %.1f, sources %.1f, chunks %.1f, "
               "schedule %.1f; %zu + %d boxes, %zu chunks\n",
               g->phase_s[NRS_EMU_PH_STATES] * 1e3, g->phase_s[NRS_EMU_PH_BUFFERS] * 1e3,
               g->phase_s[NRS_EMU_PH_SOURCES] * 1e3, g->phase_s[NRS_EMU_PH_CHUNKS] * 1e3,
               g->phase_s[NRS_EMU_PH_SCHEDULE] * 1e3, g->from.nbuf, (int)g->to.nbuf, g->nchunks);
        size_t by[NRS_EMU_OP_COUNT] = {0};
        for (size_t k = 0; k < g->nops; k++)
            by[g->ops[k].type]++;
        printf("           ops: %zu allocs, %zu frees, %zu transfers, %zu copies, %zu stagings, "
               "%zu comms\n", by[NRS_EMU_OP_ALLOC], by[NRS_EMU_OP_FREE], by[NRS_EMU_OP_XFER],
               by[NRS_EMU_OP_COPY], by[NRS_EMU_OP_STAGE], by[NRS_EMU_OP_COMM]);
        nrs_emu_graph_free(g);
    }
    return failed;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: bench_graph [CASES]                 named cases, then CASES random plans "
               "(default 100)\n"
               "       bench_graph exec [SCALE]            the executor against memcpy, scaled "
               "(default 1/256)\n"
               "       bench_graph scale SPEC [GPUS...]    SPEC's transition at response 1024 -> "
               "3072\n"
               "exit status: 0, 1 when a case failed (its line says why), 2 usage\n");
}

int main(int argc, char **argv)
{
    static const named_t named[] = {
        {"8B  tp4 pp2 dp2 -> tp8 pp1 dp2 (16 GPUs)", 0, 16, 16, {4, 2, 2, 1}, {8, 1, 2, 1}},
        {"8B  tp2 pp3 dp1 -> tp4 pp2 dp1 (8 GPUs)", 0, 8, 8, {2, 3, 1, 1}, {4, 2, 1, 1}},
        {"8B  dp 2 -> 8 (tp4 pp2, 16 -> 64 GPUs)", 0, 16, 64, {4, 2, 2, 1}, {4, 2, 8, 1}},
        {"8B  dp 8 -> 2 (tp4 pp2, 64 -> 16 GPUs)", 0, 64, 16, {4, 2, 8, 1}, {4, 2, 2, 1}},
        {"70B tp8 pp4 dp2 -> tp8 pp2 dp4 (64 GPUs)", 1, 64, 64, {8, 4, 2, 1}, {8, 2, 4, 1}},
        {"70B tp8 pp8 dp16 -> tp8 pp5 dp25 (1000)", 1, 1024, 1000, {8, 8, 16, 1}, {8, 5, 25, 1}},
        {"70B tp8 pp8 dp16 -> tp8 pp4 dp32 (1024)", 1, 1024, 1024, {8, 8, 16, 1}, {8, 4, 32, 1}},
        {"8B  tp4 pp2 dp128 -> tp8 pp1 dp128 (1024)", 0, 1024, 1024, {4, 2, 128, 1},
         {8, 1, 128, 1}},
        {"8B  dp 128 -> 256 (tp4 pp1, 512 -> 1024)", 0, 512, 1024, {4, 1, 128, 1},
         {4, 1, 256, 1}},
    };
    int failed = 0, cases = 100;
    if (argc > 1 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
        usage(stdout);
        return 0;
    }
    if (argc > 1 && !strcmp(argv[1], "scale")) {
        if (argc < 3) {
            usage(stderr);
            return 2;
        }
        return run_scale(argv[2], argc - 3, argv + 3);
    }
    if (argc > 1 && !strcmp(argv[1], "exec")) {
        char *end = NULL;
        double scale = argc > 2 ? strtod(argv[2], &end) : 1.0 / 256;
        if (argc > 3 || (end && (*end || end == argv[2] || !(scale > 0 && scale <= 1)))) {
            fprintf(stderr, "bench_graph exec: SCALE is a number in (0, 1]\n");
            return 2;
        }
        /* freed memory stays in the heap: both sides then write to pages
         * already faulted in (in a VM a first touch costs more than the copy) */
        mallopt(M_MMAP_THRESHOLD, 1 << 30);
        mallopt(M_TRIM_THRESHOLD, 1 << 30);
        for (size_t i = 0; i < sizeof(named) / sizeof(named[0]); i++)
            if (named[i].ga <= 64 && named[i].gb <= 64)
                failed |= run_exec(&named[i], scale);
        return failed;
    }
    if (argc > 2 || (argc > 1 && parse_int(argv[1], 0, &cases))) {
        usage(stderr);
        return 2;
    }
    for (size_t i = 0; i < sizeof(named) / sizeof(named[0]); i++)
        failed |= run_named(&named[i]);
    failed |= run_random(cases);
    return failed;
}
