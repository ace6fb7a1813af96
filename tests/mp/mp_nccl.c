/* mp_nccl: the NCCL transport on real GPUs (runtime/xfer/nccl.h).
 *
 *   mp_nccl [--bytes N] [--chunk N] [--timeout S]
 *   mp_nccl --count        GPUs visible (CUDA_VISIBLE_DEVICES counts) and the
 *                          NCCL version; no communicator
 *   mp_nccl --lone-recv    a receive nobody sends: must fail (refused, or by
 *                          --timeout, default 3 s here) and abort, not hang
 *   --caller-device D      the thread's current device is D first (as a
 *                          framework's), and must be again after every call
 *                          that works on the GPU (set-up, copies, transfers,
 *                          split, shrink, finalize, the lone receive's
 *                          failure); one that is not is named, and fails
 *
 * Alone (not under a PMIx server: no PMIX_RANK): one rank, a communicator of
 * one, without the rendezvous; grouped send+recv to itself in chunks,
 * checksum of what arrived against what left, then the same on a
 * ncclCommSplit child. Under pmix_srv with N ranks (one GPU each, N <= GPUs,
 * rank r on GPU r: one node): rank 0's unique id travels through the
 * rendezvous ("nrs.e0.nccl"), every rank exchanges with its ring neighbours,
 * then within its split half (colour rank % 2), then on the survivors'
 * communicator of a shrink that leaves rank N-1 out.
 * Receive buffers are poisoned first, so a transfer that moved nothing fails.
 * No GPU: prints "skipped: no GPU: <why>" and exits 77.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>
#include <xxhash.h>

#include "rdv/rdv.h"
#include "util/util.h"
#include "xfer/nccl.h"

typedef struct {
    size_t bytes, chunk;
    double timeout_s;
    int count, lone_recv, caller_dev;
} opts_t;

static int caller_dev = -1, dev_bad; /* --caller-device; calls that did not keep it */

/* After what: the caller's device current again (--caller-device). */
static void kept(const char *what)
{
    int d = -1;
    if (caller_dev < 0)
        return;
    if (cudaGetDevice(&d) != cudaSuccess || d != caller_dev) {
        fprintf(stderr, "mp_nccl: %s left CUDA device %d current, the caller's is %d\n", what, d,
                caller_dev);
        dev_bad++;
    }
}

static void fill(unsigned char *p, size_t n, int src)
{
    uint64_t x = 0x243f6a8885a308d3ull ^ (uint64_t)src;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        p[i] = (unsigned char)x;
    }
}

/* Send to the right neighbour, receive from the left; check. */
static int ring(nrs_nccl_t *c, int device, const opts_t *o, const char *what)
{
    int me = nrs_nccl_rank(c), n = nrs_nccl_size(c), rc = -1;
    int right = (me + 1) % n, left = (me - 1 + n) % n;
    size_t bytes = o->bytes;
    unsigned char *h = malloc(bytes), *want = malloc(bytes);
    void *ds = NULL, *dr = NULL;
    char err[512] = "out of memory";
    if (!h || !want || nrs_cuda_alloc(device, bytes, &ds, err, sizeof err) ||
        nrs_cuda_alloc(device, bytes, &dr, err, sizeof err))
        goto out;
    kept("nrs_cuda_alloc");
    fill(want, bytes, left);
    for (size_t i = 0; i < bytes; i++) /* poison: differs from want everywhere */
        h[i] = (unsigned char)~want[i];
    if (nrs_cuda_copy(device, dr, h, bytes, 'h', err, sizeof err))
        goto out;
    fill(h, bytes, me);
    if (nrs_cuda_copy(device, ds, h, bytes, 'h', err, sizeof err))
        goto out;
    kept("nrs_cuda_copy (to the GPU)");
    nrs_nccl_xfer_t x[2] = {{right, 1, ds, bytes}, {left, 0, dr, bytes}};
    double t0 = nrs_now_s();
    if (nrs_nccl_exchange(c, x, 2, o->chunk, o->timeout_s, err, sizeof err))
        goto out;
    double t = nrs_now_s() - t0;
    kept("nrs_nccl_exchange");
    if (nrs_cuda_copy(device, h, dr, bytes, 'd', err, sizeof err))
        goto out;
    kept("nrs_cuda_copy (from the GPU)");
    if (XXH64(h, bytes, 0) != XXH64(want, bytes, 0)) {
        size_t i = 0;
        while (i < bytes && h[i] == want[i])
            i++;
        snprintf(err, sizeof err, "data from rank %d wrong from byte %zu of %zu", left, i, bytes);
        goto out;
    }
    printf("mp_nccl[%d/%d]: %s: %zu bytes from rank %d verified (%.3f s, %.1f GB/s)\n", me, n,
           what, bytes, left, t, bytes / (t > 0 ? t : 1e-9) / 1e9);
    rc = 0;
out:
    if (rc)
        fprintf(stderr, "mp_nccl[%d]: %s: %s\n", me, what, err);
    nrs_cuda_free(device, ds);
    nrs_cuda_free(device, dr);
    kept("nrs_cuda_free");
    free(h);
    free(want);
    return rc;
}

/* A receive from ourselves with no send: NCCL refuses it when the group is
 * launched ("Trying to recv to self without a matching send", possibly as
 * the asynchronous error of a non-blocking communicator); else it would wait
 * for ever and the deadline must end it. Either way: abort, return -1. */
static int lone_recv(nrs_nccl_t *c, int device, const opts_t *o)
{
    void *d = NULL;
    char err[512];
    if (nrs_cuda_alloc(device, o->bytes, &d, err, sizeof err)) {
        fprintf(stderr, "mp_nccl: lone receive: %s\n", err);
        return 1;
    }
    nrs_nccl_xfer_t x = {nrs_nccl_rank(c), 0, d, o->bytes};
    double t0 = nrs_now_s();
    int r = nrs_nccl_exchange(c, &x, 1, o->chunk, o->timeout_s, err, sizeof err);
    double t = nrs_now_s() - t0;
    kept("nrs_nccl_exchange (failing)");
    int rc = 1;
    if (!r)
        fprintf(stderr, "mp_nccl: lone receive completed: it should not\n");
    else if (t > o->timeout_s + 5)
        fprintf(stderr, "mp_nccl: lone receive failed after %.1f s, deadline %.1f s\n", t,
                o->timeout_s);
    else {
        printf("mp_nccl: lone receive failed in %.2f s as it should: %s\n", t, err);
        rc = 0;
    }
    nrs_cuda_free(device, d);
    return rc;
}

static int usage(FILE *f, int rc)
{
    fprintf(f, "usage: mp_nccl [--bytes N] [--chunk N] [--timeout S] [--caller-device D]\n"
               "               [--count | --lone-recv]\n"
               "  alone: one rank; under tests/mp/pmix_srv -n N: N ranks, one GPU each\n"
               "  exit 0 ok, 1 failed, 2 usage, 77 skipped (no GPU, too few GPUs)\n");
    return rc;
}

static int parse(int argc, char **argv, opts_t *o)
{
    *o = (opts_t){(64u << 20) + 3, 4u << 20, 60, 0, 0, -1};
    int timeout_set = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        char *e = NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h"))
            exit(usage(stdout, 0));
        else if (!strcmp(a, "--count"))
            o->count = 1;
        else if (!strcmp(a, "--lone-recv"))
            o->lone_recv = 1;
        else if (v && !strcmp(a, "--bytes"))
            o->bytes = strtoull(v, &e, 0), i++;
        else if (v && !strcmp(a, "--chunk"))
            o->chunk = strtoull(v, &e, 0), i++;
        else if (v && !strcmp(a, "--timeout"))
            o->timeout_s = strtod(v, &e), i++, timeout_set = 1;
        else if (v && !strcmp(a, "--caller-device"))
            o->caller_dev = (int)strtol(v, &e, 10), i++;
        else
            return -1;
        if (e && (*e || e == v))
            return -1;
    }
    if (o->lone_recv && !timeout_set)
        o->timeout_s = 3;
    return o->bytes && o->chunk && o->timeout_s > 0 ? 0 : -1;
}

/* Rank 0's unique id to every rank; alone, no rendezvous at all. */
static int share_id(nrs_rdv_t *r, int me, unsigned char id[NRS_NCCL_ID_BYTES], char *err,
                    size_t errlen)
{
    void **ids = NULL;
    size_t *lens = NULL;
    if (me == 0 && nrs_nccl_unique_id(id, err, errlen))
        return -1;
    if (!r)
        return 0;
    if (nrs_rdv_allgather(r, 0, "nccl", id, NRS_NCCL_ID_BYTES, &ids, &lens, 60, err, errlen))
        return -1;
    int rc = 0;
    if (lens[0] != NRS_NCCL_ID_BYTES) {
        snprintf(err, errlen, "rank 0's unique id is %zu bytes", lens[0]);
        rc = -1;
    } else {
        memcpy(id, ids[0], NRS_NCCL_ID_BYTES);
    }
    nrs_rdv_free_blobs(r, ids, lens);
    return rc;
}

/* World ring, split halves, survivors of a shrink. */
static int run(nrs_nccl_t *c, int me, int n, int device, const opts_t *o)
{
    char err[512];
    nrs_nccl_t *s = NULL;
    if (ring(c, device, o, "world"))
        return 1;
    if (nrs_nccl_split(c, n > 1 ? me % 2 : 0, me, &s, 60, err, sizeof err) || !s) {
        fprintf(stderr, "mp_nccl[%d]: split: %s\n", me, s ? err : "no communicator");
        return 1;
    }
    kept("nrs_nccl_split");
    int rc = ring(s, device, o, "split") ? 1 : 0;
    nrs_nccl_fini(s);
    kept("nrs_nccl_fini");
    s = NULL;
    if (rc || n < 2)
        return rc;
    int gone = n - 1;
    if (nrs_nccl_shrink(c, &gone, 1, &s, 60, err, sizeof err)) {
        fprintf(stderr, "mp_nccl[%d]: shrink: %s\n", me, err);
        return 1;
    }
    kept("nrs_nccl_shrink");
    if ((me == gone) != !s) {
        fprintf(stderr, "mp_nccl[%d]: shrink: %s communicator\n", me, s ? "unexpected" : "no");
        rc = 1;
    } else if (s) {
        rc = ring(s, device, o, "shrunk") ? 1 : 0;
    }
    nrs_nccl_fini(s);
    return rc;
}

int main(int argc, char **argv)
{
    opts_t o;
    int ngpu, rc = 1, lib, hdr;
    char err[512];
    if (parse(argc, argv, &o))
        return usage(stderr, 2);
    setvbuf(stdout, NULL, _IOLBF, 0); /* a time-out must not eat what was printed */
    if (nrs_cuda_device_count(&ngpu, err, sizeof err)) {
        printf("skipped: %s\n", err);
        return 77;
    }
    if (o.count) {
        nrs_nccl_version(&lib, &hdr);
        printf("%d GPU(s); NCCL %d (built against %d)\n", ngpu, lib, hdr);
        return 0;
    }
    nrs_rdv_t *r = NULL;
    if (getenv("PMIX_RANK") && nrs_rdv_init(&r, err, sizeof err)) {
        fprintf(stderr, "mp_nccl: %s\n", err);
        return 1;
    }
    int me = r ? nrs_rdv_rank(r) : 0, n = r ? nrs_rdv_size(r) : 1;
    /* NCCL refuses two ranks on one GPU of one host, the host being what
     * NCCL_HOSTID says where set: ranks that each claim a host of their own
     * share a GPU and talk over NCCL's socket transport (test_nccl.sh). */
    if (n > ngpu && !getenv("NCCL_HOSTID")) {
        printf("skipped: %d ranks but %d GPU(s) (NCCL needs one GPU per rank)\n", n, ngpu);
        nrs_rdv_fini(r);
        return 77;
    }
    int device = me % ngpu; /* one node: local rank = rank */
    if (o.caller_dev >= 0 && cudaSetDevice(o.caller_dev) != cudaSuccess) {
        fprintf(stderr, "mp_nccl[%d]: --caller-device %d: no such device\n", me, o.caller_dev);
        nrs_rdv_fini(r);
        return 1;
    }
    caller_dev = o.caller_dev;
    unsigned char id[NRS_NCCL_ID_BYTES] = {0}; /* what ranks but 0 publish */
    nrs_nccl_t *c = NULL;
    if (share_id(r, me, id, err, sizeof err) ||
        nrs_nccl_init(&c, me, n, device, id, 60, err, sizeof err)) {
        fprintf(stderr, "mp_nccl[%d]: %s\n", me, err);
    } else {
        kept("nrs_nccl_init");
        rc = o.lone_recv ? lone_recv(c, device, &o) : run(c, me, n, device, &o);
    }
    nrs_nccl_fini(c);
    kept("nrs_nccl_fini");
    if (caller_dev >= 0 && !dev_bad)
        printf("mp_nccl[%d]: the caller's CUDA device %d kept (its rank on GPU %d)\n", me,
               caller_dev, device);
    if (dev_bad && !rc)
        rc = 1;
    if (r)
        nrs_rdv_fini(r);
    return rc;
}
