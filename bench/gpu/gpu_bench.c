/* gpu_bench: device-to-device transition throughput against cudaMemcpy, and
 * the NCCL transport with one rank (bench/gpu/run.sh runs it).
 *
 *   gpu_bench [--reps N] [--chunk BYTES]
 *
 * 1. A real transition graph (runtime/emu: a 1.0e8-parameter actor, trained,
 *    tp 4 -> tp 2 x pp 2 on 4 GPUs), every GPU of the plan mapped onto
 *    device 0: each local copy and transfer of the graph becomes a strided
 *    cudaMemcpy2DAsync, in graph order on one stream. Throughput = bytes the
 *    graph moves / time, against one cudaMemcpy of the same bytes (D2D) in
 *    the same run. Best of N for each.
 * 2. The NCCL transport (runtime/xfer/nccl) with a communicator of one:
 *    grouped ncclSend/ncclRecv to itself, chunked, for 16 MiB .. 1 GiB, against
 *    cudaMemcpy of the same bytes; the received bytes are compared.
 * Without a GPU it prints "skipped: no GPU: <why>" and exits 77.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime.h>

#include "emu/graph.h"
#include "emu/testutil.h"
#include "xfer/nccl.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

#define CK(x)                                                                                     \
    do {                                                                                          \
        cudaError_t e_ = (x);                                                                     \
        if (e_ != cudaSuccess) {                                                                  \
            fprintf(stderr, "gpu_bench: %s: %s\n", #x, cudaGetErrorString(e_));                  \
            return -1;                                                                            \
        }                                                                                         \
    } while (0)

static double memcpy_best(void *d, const void *s, size_t n, int reps)
{
    double best = 1e30;
    for (int k = 0; k < reps; k++) {
        cudaDeviceSynchronize();
        double t0 = now_s();
        if (cudaMemcpy(d, s, n, cudaMemcpyDeviceToDevice) != cudaSuccess)
            return -1;
        cudaDeviceSynchronize();
        double t = now_s() - t0;
        best = t < best ? t : best;
    }
    return best;
}

static int bench_graph(int reps, long long chunk)
{
    nrs_spec_t s;
    nrs_model_t m;
    nrs_plan_t a, b;
    nrs_layout_t la = {4, 1, 1, 1}, lb = {2, 2, 1, 1};
    nrs_emu_opts_t o;
    nrs_emu_graph_t *g = NULL;
    char err[512];
    tu_model(&m, 16, 1024, 4096, 16, 8, 32000);
    tu_spec_fixed(&s, &m, 4);
    tu_plan_single(&s, 4, &la, &a);
    tu_plan_single(&s, 4, &lb, &b);
    nrs_emu_opts_init(&o);
    o.chunk_bytes = chunk;
    if (nrs_emu_transition(&s, &a, &b, &o, &g, err, sizeof err)) {
        fprintf(stderr, "gpu_bench: graph: %s\n", err);
        nrs_emu_graph_free(g);
        return -1;
    }
    void **mem = calloc(g->nbuf, sizeof(*mem));
    long long moved = 0, biggest = 0, total = 0;
    for (size_t i = 0; i < g->nbuf; i++) {
        total += g->buf[i].b.bytes;
        if (g->buf[i].alias < 0 && cudaMalloc(&mem[i], (size_t)g->buf[i].b.bytes ? (size_t)g->buf[i].b.bytes : 1) != cudaSuccess) {
            fprintf(stderr, "gpu_bench: cudaMalloc of buffer %zu failed\n", i);
            return -1;
        }
    }
    for (size_t i = 0; i < g->nops; i++) {
        const nrs_emu_op_t *op = &g->ops[i];
        if (op->type == NRS_EMU_OP_XFER || op->type == NRS_EMU_OP_COPY || op->type == NRS_EMU_OP_STAGE)
            moved += (long long)op->rows * op->row_bytes;
    }
    biggest = moved;
    cudaStream_t st;
    CK(cudaStreamCreate(&st));
    double best = 1e30;
    for (int k = 0; k < reps; k++) {
        cudaDeviceSynchronize();
        double t0 = now_s();
        for (size_t i = 0; i < g->nops; i++) {
            const nrs_emu_op_t *op = &g->ops[i];
            if (op->type != NRS_EMU_OP_XFER && op->type != NRS_EMU_OP_COPY &&
                op->type != NRS_EMU_OP_STAGE)
                continue;
            char *d = (char *)mem[nrs_emu_canon(g, op->dst_buf)] + op->dst_off;
            const char *sp = (const char *)mem[nrs_emu_canon(g, op->src_buf)] + op->src_off;
            size_t dp = op->rows > 1 ? (size_t)op->dst_pitch : (size_t)op->row_bytes;
            size_t spch = op->rows > 1 ? (size_t)op->src_pitch : (size_t)op->row_bytes;
            CK(cudaMemcpy2DAsync(d, dp, sp, spch, (size_t)op->row_bytes, (size_t)op->rows,
                                 cudaMemcpyDeviceToDevice, st));
        }
        CK(cudaStreamSynchronize(st));
        double t = now_s() - t0;
        best = t < best ? t : best;
    }
    void *x, *y;
    CK(cudaMalloc(&x, (size_t)biggest));
    CK(cudaMalloc(&y, (size_t)biggest));
    double mc = memcpy_best(y, x, (size_t)biggest, reps);
    printf("transition tp4 -> tp2xpp2 (%zu ops, %.1f MB moved of %.1f MB state): %.1f GB/s, "
           "cudaMemcpy of the same bytes %.1f GB/s, ratio %.2f\n", g->nops, moved / 1e6,
           total / 1e6, moved / best / 1e9, moved / mc / 1e9, mc / best);
    cudaFree(x);
    cudaFree(y);
    for (size_t i = 0; i < g->nbuf; i++)
        if (mem[i])
            cudaFree(mem[i]);
    free(mem);
    cudaStreamDestroy(st);
    nrs_emu_graph_free(g);
    return 0;
}

static int bench_nccl(int reps, long long chunk)
{
    unsigned char id[NRS_NCCL_ID_BYTES];
    nrs_nccl_t *c = NULL;
    char err[512];
    if (nrs_nccl_unique_id(id, err, sizeof err) ||
        nrs_nccl_init(&c, 0, 1, 0, id, 60, err, sizeof err)) {
        fprintf(stderr, "gpu_bench: nccl: %s\n", err);
        return -1;
    }
    int rc = 0;
    for (size_t size = 16u << 20; size <= (1u << 30) && !rc; size *= 4) {
        void *s, *d;
        unsigned char *hs = malloc(4096), *hd = malloc(4096);
        CK(cudaMalloc(&s, size));
        CK(cudaMalloc(&d, size));
        CK(cudaMemset(s, 0x3c, size));
        CK(cudaMemset(d, 0, size));
        nrs_nccl_xfer_t x[2] = {{0, 1, s, size}, {0, 0, d, size}};
        double best = 1e30;
        for (int k = 0; k < reps && !rc; k++) {
            double t0 = now_s();
            if (nrs_nccl_exchange(c, x, 2, (size_t)chunk, 60, err, sizeof err)) {
                fprintf(stderr, "gpu_bench: nccl exchange: %s\n", err);
                rc = -1;
            }
            double t = now_s() - t0;
            best = t < best ? t : best;
        }
        cudaMemcpy(hd, (char *)d + size - 4096, 4096, cudaMemcpyDeviceToHost);
        memset(hs, 0x3c, 4096);
        int same = !memcmp(hs, hd, 4096);
        double mc = memcpy_best(d, s, size, reps);
        if (!rc)
            printf("nccl 1 rank, %zu MiB in %lld MiB chunks: %.1f GB/s, cudaMemcpy %.1f GB/s, "
                   "ratio %.2f, data %s\n", size >> 20, chunk >> 20, size / best / 1e9,
                   size / mc / 1e9, mc / best, same ? "ok" : "WRONG");
        rc |= same ? 0 : -1;
        cudaFree(s);
        cudaFree(d);
        free(hs);
        free(hd);
    }
    nrs_nccl_fini(c);
    return rc;
}

int main(int argc, char **argv)
{
    int reps = 5, n = 0;
    long long chunk = 64ll << 20;
    char why[256];
    for (int i = 1; i + 1 < argc; i++) {
        if (!strcmp(argv[i], "--reps"))
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--chunk"))
            chunk = atoll(argv[++i]);
    }
    if (nrs_cuda_device_count(&n, why, sizeof why)) {
        printf("skipped: %s\n", why);
        return 77;
    }
    struct cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, 0) == cudaSuccess)
        printf("device 0 of %d: %s, %.0f GiB\n", n, p.name, p.totalGlobalMem / 1073741824.0);
    int rc = bench_graph(reps, chunk);
    rc |= bench_nccl(reps, chunk);
    return rc ? 1 : 0;
}
