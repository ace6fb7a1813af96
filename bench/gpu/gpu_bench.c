/* gpu_bench: device-to-device transition throughput against cudaMemcpy, and
 * the NCCL transport with one rank (bench/gpu/run.sh runs it).
 *
 *   gpu_bench [--reps N] [--chunk BYTES] [--max-mib M] [--deadline S]
 *
 * 1. A real transition graph (runtime/emu: a 1.0e8-parameter actor, trained,
 *    tp 4 -> tp 2 x pp 2 on 4 GPUs), every GPU of the plan mapped onto
 *    device 0: each local copy and transfer of the graph becomes a strided
 *    cudaMemcpy2DAsync (one row: cudaMemcpyAsync), in graph order on one
 *    stream. Throughput = bytes the graph moves / time, against one
 *    cudaMemcpy of the same bytes (D2D) in the same run. Best of N for each.
 * 2. The NCCL transport (runtime/xfer/nccl) with a communicator of one:
 *    grouped ncclSend/ncclRecv to itself, chunked, for 16 MiB .. M MiB (x4),
 *    against cudaMemcpy of the same bytes; every received byte is compared
 *    (an offset-dependent pattern, the receive buffer poisoned before each
 *    repetition).
 * One table, ours and cudaMemcpy side by side; the last line is
 * "gpu_bench: ok" or "gpu_bench: FAILED" (exit 1). The whole run is bounded
 * by --deadline (default 150 s): past it, it says so and exits 124.
 * Without a GPU it prints "skipped: no GPU: <why>" and exits 77.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cuda_runtime.h>

#include "emu/graph.h"
#include "emu/testutil.h"
#include "util/util.h"
#include "xfer/nccl.h"

typedef struct {
    int reps, max_mib, deadline_s;
    long long chunk;
} opts_t;

#define CK(x)                                                                                     \
    do {                                                                                          \
        cudaError_t e_ = (x);                                                                     \
        if (e_ != cudaSuccess) {                                                                  \
            fprintf(stderr, "gpu_bench: %s:%d: %s: %s\n", __FILE__, __LINE__, #x,                 \
                    cudaGetErrorString(e_));                                                      \
            goto fail;                                                                            \
        }                                                                                         \
    } while (0)

static void on_alarm(int sig)
{
    static const char msg[] = "gpu_bench: deadline passed: FAILED (hung?)\n";
    (void)sig;
    if (write(2, msg, sizeof msg - 1) < 0)
        _exit(124);
    _exit(124);
}

static void row(const char *what, double bytes, double ours_s, double mc_s, const char *data)
{
    printf("%-44s %10.1f %10.1f %10.1f %6.2f  %s\n", what, bytes / 1048576.0, bytes / ours_s / 1e9,
           bytes / mc_s / 1e9, mc_s / ours_s, data);
    fflush(stdout);
}

/* Best of reps device-to-device cudaMemcpy of n bytes, seconds; -1 on error. */
static double memcpy_best(void *d, const void *s, size_t n, int reps)
{
    double best = 1e30;
    for (int k = 0; k < reps; k++) {
        if (cudaDeviceSynchronize() != cudaSuccess)
            return -1;
        double t0 = nrs_now_s();
        if (cudaMemcpy(d, s, n, cudaMemcpyDeviceToDevice) != cudaSuccess ||
            cudaDeviceSynchronize() != cudaSuccess)
            return -1;
        double t = nrs_now_s() - t0;
        best = t < best ? t : best;
    }
    return best;
}

static int is_move(const nrs_emu_op_t *op)
{
    return (op->type == NRS_EMU_OP_XFER || op->type == NRS_EMU_OP_COPY ||
            op->type == NRS_EMU_OP_STAGE) &&
           op->rows > 0 && op->row_bytes > 0;
}

/* The region [off, off + (rows-1)*pitch + row_bytes) lies in buffer id. */
static int region_ok(const nrs_emu_graph_t *g, int32_t id, int64_t off, int64_t pitch,
                     const nrs_emu_op_t *op)
{
    if (id < 0 || (size_t)id >= g->nbuf)
        return 0;
    int64_t bytes = g->buf[nrs_emu_canon(g, id)].b.bytes;
    if (op->rows > 1 && pitch < op->row_bytes)
        return 0;
    return off >= 0 && off + (int64_t)(op->rows - 1) * (op->rows > 1 ? pitch : 0) + op->row_bytes <=
                           bytes;
}

/* Every move of the graph, in order, on stream st. */
static cudaError_t run_graph(const nrs_emu_graph_t *g, void **mem, cudaStream_t st)
{
    for (size_t i = 0; i < g->nops; i++) {
        const nrs_emu_op_t *op = &g->ops[i];
        if (!is_move(op))
            continue;
        char *d = (char *)mem[nrs_emu_canon(g, op->dst_buf)] + op->dst_off;
        const char *s = (const char *)mem[nrs_emu_canon(g, op->src_buf)] + op->src_off;
        cudaError_t e =
            op->rows == 1
                ? cudaMemcpyAsync(d, s, (size_t)op->row_bytes, cudaMemcpyDeviceToDevice, st)
                : cudaMemcpy2DAsync(d, (size_t)op->dst_pitch, s, (size_t)op->src_pitch,
                                    (size_t)op->row_bytes, (size_t)op->rows,
                                    cudaMemcpyDeviceToDevice, st);
        if (e != cudaSuccess)
            return e;
    }
    return cudaSuccess;
}

static int bench_graph(const opts_t *o)
{
    nrs_spec_t s;
    nrs_model_t m;
    nrs_plan_t a, b;
    nrs_layout_t la = {4, 1, 1, 1}, lb = {2, 2, 1, 1};
    nrs_emu_opts_t eo;
    nrs_emu_graph_t *g = NULL;
    void **mem = NULL, *x = NULL, *y = NULL;
    cudaStream_t st = NULL;
    char err[512];
    int rc = -1;
    tu_model(&m, 16, 1024, 4096, 16, 8, 32000);
    tu_spec_fixed(&s, &m, 4);
    tu_plan_single(&s, 4, &la, &a);
    tu_plan_single(&s, 4, &lb, &b);
    nrs_emu_opts_init(&eo);
    eo.chunk_bytes = o->chunk;
    if (nrs_emu_transition(&s, &a, &b, &eo, &g, err, sizeof err)) {
        fprintf(stderr, "gpu_bench: graph: %s\n", err);
        goto fail;
    }
    long long moved = 0, total = 0, nmoves = 0;
    for (size_t i = 0; i < g->nops; i++) {
        const nrs_emu_op_t *op = &g->ops[i];
        if (!is_move(op))
            continue;
        /* A stray offset would fault on the GPU and poison the context. */
        if (!region_ok(g, op->src_buf, op->src_off, op->src_pitch, op) ||
            !region_ok(g, op->dst_buf, op->dst_off, op->dst_pitch, op)) {
            fprintf(stderr, "gpu_bench: graph op %zu out of its buffers\n", i);
            goto fail;
        }
        moved += (long long)op->rows * op->row_bytes;
        nmoves++;
    }
    if (!(mem = calloc(g->nbuf, sizeof(*mem))))
        goto fail;
    for (size_t i = 0; i < g->nbuf; i++) {
        total += g->buf[i].b.bytes;
        if (g->buf[i].alias < 0)
            CK(cudaMalloc(&mem[i], g->buf[i].b.bytes > 0 ? (size_t)g->buf[i].b.bytes : 1));
    }
    CK(cudaStreamCreate(&st));
    double best = 1e30;
    for (int k = 0; k < o->reps; k++) {
        CK(cudaDeviceSynchronize());
        double t0 = nrs_now_s();
        CK(run_graph(g, mem, st));
        CK(cudaStreamSynchronize(st));
        double t = nrs_now_s() - t0;
        best = t < best ? t : best;
    }
    CK(cudaMalloc(&x, moved > 0 ? (size_t)moved : 1));
    CK(cudaMalloc(&y, moved > 0 ? (size_t)moved : 1));
    double mc = memcpy_best(y, x, moved > 0 ? (size_t)moved : 1, o->reps);
    if (mc < 0 || moved <= 0) {
        fprintf(stderr, "gpu_bench: cudaMemcpy baseline failed (%lld bytes)\n", moved);
        goto fail;
    }
    char what[128];
    snprintf(what, sizeof what, "transition tp4->tp2xpp2 (%lld moves, %.0f MiB state)", nmoves,
             total / 1048576.0);
    row(what, (double)moved, best, mc, "-");
    rc = 0;
fail:
    cudaFree(x);
    cudaFree(y);
    for (size_t i = 0; mem && i < g->nbuf; i++)
        cudaFree(mem[i]);
    free(mem);
    if (st)
        cudaStreamDestroy(st);
    nrs_emu_graph_free(g);
    return rc;
}

static void pattern(unsigned char *p, size_t n)
{
    for (size_t i = 0; i < n; i += 8) { /* differs between chunks and within rows */
        uint64_t v = (i / 8) * 0x9e3779b97f4a7c15ull;
        memcpy(p + i, &v, n - i < 8 ? n - i : 8);
    }
}

/* One size: best of reps exchanges of send+recv to ourselves, every
 * repetition's bytes checked (receive buffer poisoned before it). */
static int nccl_size(nrs_nccl_t *c, size_t size, const opts_t *o, unsigned char *hs,
                     unsigned char *hd)
{
    void *s = NULL, *d = NULL;
    char err[512];
    int rc = -1, same = 1;
    CK(cudaMalloc(&s, size));
    CK(cudaMalloc(&d, size));
    pattern(hs, size);
    CK(cudaMemcpy(s, hs, size, cudaMemcpyHostToDevice));
    nrs_nccl_xfer_t x[2] = {{0, 1, s, size}, {0, 0, d, size}};
    double best = 1e30;
    for (int k = 0; k < o->reps && same; k++) {
        CK(cudaMemset(d, 0xa5, size));
        CK(cudaDeviceSynchronize()); /* the NCCL stream does not wait for stream 0 by itself */
        double t0 = nrs_now_s();
        if (nrs_nccl_exchange(c, x, 2, (size_t)o->chunk, 60, err, sizeof err)) {
            fprintf(stderr, "gpu_bench: nccl exchange of %zu bytes: %s\n", size, err);
            goto fail;
        }
        double t = nrs_now_s() - t0;
        best = t < best ? t : best;
        CK(cudaMemcpy(hd, d, size, cudaMemcpyDeviceToHost));
        same = !memcmp(hs, hd, size);
    }
    double mc = memcpy_best(d, s, size, o->reps);
    if (mc < 0) {
        fprintf(stderr, "gpu_bench: cudaMemcpy of %zu bytes failed\n", size);
        goto fail;
    }
    char what[128];
    snprintf(what, sizeof what, "nccl 1 rank, send+recv to self, %lld MiB chunks",
             o->chunk >> 20);
    row(what, (double)size, best, mc, same ? "ok" : "WRONG");
    rc = same ? 0 : -1;
fail:
    cudaFree(s);
    cudaFree(d);
    return rc;
}

static int bench_nccl(const opts_t *o)
{
    unsigned char id[NRS_NCCL_ID_BYTES];
    nrs_nccl_t *c = NULL;
    char err[512];
    int lib, hdr, rc = 0;
    size_t max = (size_t)o->max_mib << 20;
    nrs_nccl_version(&lib, &hdr);
    printf("# NCCL %d (built against %d)\n", lib, hdr);
    double t0 = nrs_now_s();
    if (nrs_nccl_unique_id(id, err, sizeof err) ||
        nrs_nccl_init(&c, 0, 1, 0, id, 60, err, sizeof err)) {
        fprintf(stderr, "gpu_bench: nccl: %s\n", err);
        return -1;
    }
    printf("# NCCL communicator of one ready in %.2f s\n", nrs_now_s() - t0);
    unsigned char *hs = malloc(max), *hd = malloc(max);
    if (!hs || !hd) {
        fprintf(stderr, "gpu_bench: out of host memory (2 x %d MiB)\n", o->max_mib);
        rc = -1;
    }
    for (size_t size = 16u << 20; size <= max && !rc; size *= 4)
        rc = nccl_size(c, size, o, hs, hd);
    free(hs);
    free(hd);
    nrs_nccl_fini(c);
    return rc;
}

static int usage(FILE *f, int rc)
{
    fprintf(f, "usage: gpu_bench [--reps N] [--chunk BYTES] [--max-mib M] [--deadline S]\n"
               "  --reps N       best of N (1..100, default 5)\n"
               "  --chunk BYTES  graph and NCCL chunk (default 64 MiB)\n"
               "  --max-mib M    largest NCCL size, 16 x 4^k up to M (default 1024)\n"
               "  --deadline S   give up, exit 124, after S seconds (default 150)\n"
               "  exit 0 ok, 1 failed, 2 usage, 77 no GPU, 124 deadline\n");
    return rc;
}

static int parse(int argc, char **argv, opts_t *o)
{
    *o = (opts_t){5, 1024, 150, 64ll << 20};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        char *e = NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h"))
            exit(usage(stdout, 0));
        else if (v && !strcmp(a, "--reps"))
            o->reps = (int)strtol(v, &e, 0), i++;
        else if (v && !strcmp(a, "--chunk"))
            o->chunk = strtoll(v, &e, 0), i++;
        else if (v && !strcmp(a, "--max-mib"))
            o->max_mib = (int)strtol(v, &e, 0), i++;
        else if (v && !strcmp(a, "--deadline"))
            o->deadline_s = (int)strtol(v, &e, 0), i++;
        else
            return -1;
        if (*e || e == v)
            return -1;
    }
    return o->reps >= 1 && o->reps <= 100 && o->chunk >= 4096 && o->max_mib >= 16 &&
                   o->max_mib <= 16384 && o->deadline_s >= 1
               ? 0
               : -1;
}

int main(int argc, char **argv)
{
    opts_t o;
    int n = 0;
    char why[256];
    if (parse(argc, argv, &o))
        return usage(stderr, 2);
    setvbuf(stdout, NULL, _IOLBF, 0); /* a time-out must not eat what was printed */
    signal(SIGALRM, on_alarm);
    alarm((unsigned)o.deadline_s);
    if (nrs_cuda_device_count(&n, why, sizeof why)) {
        printf("skipped: %s\n", why);
        return 77;
    }
    struct cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, 0) == cudaSuccess)
        printf("# device 0 of %d: %s, %.0f GiB; best of %d\n", n, p.name,
               p.totalGlobalMem / 1073741824.0, o.reps);
    printf("%-44s %10s %10s %10s %6s  %s\n", "what", "MiB", "ours GB/s", "memcpy", "ratio",
           "data");
    int rc = bench_graph(&o);
    rc |= bench_nccl(&o);
    printf("gpu_bench: %s\n", rc ? "FAILED" : "ok");
    return rc ? 1 : 0;
}
