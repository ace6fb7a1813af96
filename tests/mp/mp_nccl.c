/* mp_nccl: the NCCL transport on real GPUs (runtime/xfer/nccl.h).
 *
 *   mp_nccl [--bytes N] [--chunk N]
 *
 * Alone: one rank, a communicator of one, grouped send+recv to itself in
 * chunks, checksum of what arrived against what left. Under pmix_srv with
 * N ranks (one GPU each, N <= GPUs): rank 0's unique id travels through the
 * rendezvous ("nrs.e0.nccl"), every rank exchanges with its ring neighbours,
 * then the survivors' communicator of a shrink (rank N-1 left out) repeats it.
 * No GPU: prints "skipped: no GPU: <why>" and exits 77.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "rdv/rdv.h"
#include "xfer/nccl.h"

static void fill(unsigned char *p, size_t n, int src)
{
    uint64_t x = 0x243f6a8885a308d3ull ^ (uint64_t)src;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        p[i] = (unsigned char)x;
    }
}

/* Send to the right neighbour, receive from the left; check. */
static int ring(nrs_nccl_t *c, int device, size_t bytes, size_t chunk, const char *what)
{
    int me = nrs_nccl_rank(c), n = nrs_nccl_size(c), rc = -1;
    int right = (me + 1) % n, left = (me - 1 + n) % n;
    unsigned char *h = malloc(bytes), *want = malloc(bytes);
    void *ds = NULL, *dr = NULL;
    char err[256];
    if (!h || !want || nrs_cuda_alloc(device, bytes, &ds, err, sizeof err) ||
        nrs_cuda_alloc(device, bytes, &dr, err, sizeof err))
        goto out;
    fill(h, bytes, me);
    fill(want, bytes, left);
    if (nrs_cuda_copy(ds, h, bytes, 'h', err, sizeof err))
        goto out;
    nrs_nccl_xfer_t x[2] = {{right, 1, ds, bytes}, {left, 0, dr, bytes}};
    if (nrs_nccl_exchange(c, x, 2, chunk, 60, err, sizeof err) ||
        nrs_cuda_copy(h, dr, bytes, 'd', err, sizeof err))
        goto out;
    if (XXH64(h, bytes, 0) != XXH64(want, bytes, 0)) {
        snprintf(err, sizeof err, "checksum mismatch from rank %d", left);
        goto out;
    }
    printf("mp_nccl[%d/%d]: %s: %zu bytes from rank %d verified\n", me, n, what, bytes, left);
    rc = 0;
out:
    if (rc)
        fprintf(stderr, "mp_nccl[%d]: %s: %s\n", me, what, err);
    nrs_cuda_free(ds);
    nrs_cuda_free(dr);
    free(h);
    free(want);
    return rc;
}

int main(int argc, char **argv)
{
    size_t bytes = (64u << 20) + 3, chunk = 4u << 20;
    int ngpu, rc = 1;
    char err[512];
    for (int i = 1; i + 1 < argc; i++) {
        if (!strcmp(argv[i], "--bytes"))
            bytes = strtoull(argv[++i], NULL, 0);
        else if (!strcmp(argv[i], "--chunk"))
            chunk = strtoull(argv[++i], NULL, 0);
    }
    if (nrs_cuda_device_count(&ngpu, err, sizeof err)) {
        printf("skipped: %s\n", err);
        return 77;
    }
    nrs_rdv_t *r;
    if (nrs_rdv_init(&r, err, sizeof err)) {
        fprintf(stderr, "mp_nccl: %s\n", err);
        return 1;
    }
    int me = nrs_rdv_rank(r), n = nrs_rdv_size(r);
    if (n > ngpu) {
        printf("skipped: %d ranks but %d GPU(s) (NCCL needs one GPU per rank)\n", n, ngpu);
        nrs_rdv_fini(r);
        return 77;
    }
    unsigned char id[NRS_NCCL_ID_BYTES];
    void **ids = NULL;
    size_t *lens = NULL;
    nrs_nccl_t *c = NULL, *s = NULL;
    if (me == 0 && nrs_nccl_unique_id(id, err, sizeof err))
        goto fail;
    if (nrs_rdv_allgather(r, 0, "nccl", id, sizeof id, &ids, &lens, 60, err, sizeof err))
        goto fail;
    if (lens[0] != sizeof id) {
        snprintf(err, sizeof err, "rank 0's unique id is %zu bytes", lens[0]);
        goto fail;
    }
    memcpy(id, ids[0], sizeof id);
    if (nrs_nccl_init(&c, me, n, me, id, 60, err, sizeof err))
        goto fail;
    rc = ring(c, me, bytes, chunk, "world") ? 1 : 0;
    if (!rc && n > 2) {
        int gone = n - 1;
        if (nrs_nccl_shrink(c, &gone, 1, &s, 60, err, sizeof err))
            goto fail;
        if (s)
            rc = ring(s, me, bytes, chunk, "shrunk") ? 1 : 0;
    }
    nrs_nccl_fini(s);
    nrs_nccl_fini(c);
    goto out;
fail:
    fprintf(stderr, "mp_nccl[%d]: %s\n", me, err);
    nrs_nccl_abort(c);
    nrs_nccl_fini(c);
    rc = 1;
out:
    if (ids)
        nrs_rdv_free_blobs(r, ids, lens);
    nrs_rdv_fini(r);
    return rc;
}
