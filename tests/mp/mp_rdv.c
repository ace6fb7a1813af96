/* mp_rdv: one rank of a rendezvous test, run under pmix_srv (or alone: singleton).
 *
 *   mp_rdv [--epochs N] [--nojoin RANK] [--timeout S] [--expect-singleton] [--gather]
 *   mp_rdv --die-after-gather RANK [--die-before RANK2]
 *   mp_rdv --die-after-put RANK
 *
 * Every rank publishes a rank- and epoch-specific blob for N epochs and checks
 * every peer's. With --nojoin R, rank R never calls PMIx and sleeps; the others
 * must fail within the time-out with a message naming R (exit 3 = the expected
 * failure was seen, 1 = anything else). With --gather, each epoch is a
 * survivors' gather (nrs_rdv_gather) of a rank- and epoch-specific int
 * instead: its time-out must name R too.
 *
 * --die-after-gather R: every rank posts a survivors' gather (nrs_rdv_gather
 * _post: put, commit, fence) and rank R SIGKILLs itself once its fence is
 * complete; each other rank waits until PMIx has told it of R's death and
 * only then reads the gather (nrs_rdv_gather_read). What the fence brought
 * decides: every survivor must find R's bytes and print
 *   mp_rdv[i]: rank R's contribution counted after its death
 * (exit 0); finding them missing (a rank's own view of deaths deciding, as
 * before the fix) exits 4. With --die-before R2, rank R2 SIGKILLs itself
 * before it puts anything, so the fence completes without it (partial) and
 * the others also wait to be told of its death: R's bytes must still be
 * found and R2's must be missing, on every survivor. A second gather
 * follows: the survivors' bytes only (mp_rdv[i]: second gather: ...).
 *
 * --die-after-put R: every rank puts a blob and fences (nrs_rdv_allgather's
 * first half); rank R SIGKILLs itself after the fence, the others wait until
 * PMIx told them of its death and only then get R's blob (nrs_rdv_get): what
 * PMIx already holds must still come (mp_rdv[i]: rank R's blob read after
 * its death; exit 0). Giving up at once because the rank is dead (a rank
 * that learned of a death between the fence and its gets failed its
 * allgather) exits 4.
 */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "rdv/rdv.h"

static void make_blob(char *buf, size_t len, int rank, unsigned epoch)
{
    snprintf(buf, len, "rank=%d epoch=%u payload=%08x", rank, epoch,
             (unsigned)(rank * 2654435761u ^ epoch));
}

/* --die-after-gather: see the head of the file. */
static int told(nrs_rdv_t *r, int rank)
{
    struct timespec ts = {0, 10 * 1000 * 1000};
    for (int i = 0; i < 1000 && rank >= 0 && !nrs_rdv_peer_failed(r, rank); i++)
        nanosleep(&ts, NULL);
    return rank < 0 || nrs_rdv_peer_failed(r, rank);
}

static int die_after_gather(nrs_rdv_t *r, int dier, int before, double timeout)
{
    int me = nrs_rdv_rank(r), n = nrs_rdv_size(r), rc = 1;
    int32_t mine = 1000 + 7 * me, *all = calloc((size_t)n, sizeof(*all));
    unsigned char *got = calloc((size_t)n, 1);
    char err[512];
    if (!all || !got || dier < 0 || dier >= n || before >= n || before == dier) {
        fprintf(stderr, "mp_rdv[%d]: bad --die-after-gather %d / --die-before %d of %d\n", me,
                dier, before, n);
        goto out;
    }
    if (me == before)
        raise(SIGKILL);
    if (nrs_rdv_gather_post(r, 7, "vote", &mine, sizeof mine, NULL, 0, timeout, err,
                            sizeof err)) {
        fprintf(stderr, "mp_rdv[%d]: gather: %s\n", me, err);
        goto out;
    }
    if (me == dier)
        raise(SIGKILL);
    if (!told(r, dier) || !told(r, before)) {
        fprintf(stderr, "mp_rdv[%d]: never told of rank %d's or %d's death\n", me, dier, before);
        goto out;
    }
    if (nrs_rdv_gather_read(r, 7, "vote", &mine, sizeof mine, NULL, 0, all, got, err,
                            sizeof err)) {
        fprintf(stderr, "mp_rdv[%d]: read: %s\n", me, err);
        goto out;
    }
    rc = 0;
    for (int i = 0; i < n; i++)
        if (i == before) {
            if (got[i]) {
                fprintf(stderr, "mp_rdv[%d]: rank %d, dead before it put, counted\n", me, i);
                rc = 1;
            }
        } else if (!got[i] || all[i] != 1000 + 7 * i) {
            fprintf(stderr, "mp_rdv[%d]: rank %d's contribution %s\n", me, i,
                    got[i] ? "is wrong" : "is missing");
            rc = i == dier ? 4 : 1;
        }
    if (!rc)
        printf("mp_rdv[%d]: rank %d's contribution counted after its death\n", me, dier);
    /* and a gather after it: the survivors' bytes only, the dead missing */
    mine += 1;
    if (!rc && nrs_rdv_gather(r, 8, "vote", &mine, sizeof mine, NULL, 0, all, got, timeout,
                              err, sizeof err)) {
        fprintf(stderr, "mp_rdv[%d]: second gather: %s\n", me, err);
        rc = 1;
    }
    for (int i = 0; !rc && i < n; i++)
        if (i == dier || i == before ? got[i] : !got[i] || all[i] != 1001 + 7 * i) {
            fprintf(stderr, "mp_rdv[%d]: second gather: rank %d %s\n", me, i,
                    got[i] ? "wrong or counted though dead" : "missing");
            rc = 1;
        }
    if (!rc)
        printf("mp_rdv[%d]: second gather: the survivors' bytes only\n", me);
out:
    free(all);
    free(got);
    return rc;
}

/* --die-after-put: see the head of the file. */
static int die_after_put(nrs_rdv_t *r, int dier, double timeout)
{
    int me = nrs_rdv_rank(r), n = nrs_rdv_size(r);
    char mine[128], want[128], err[512];
    void *blob = NULL;
    size_t len = 0;
    if (dier < 0 || dier >= n) {
        fprintf(stderr, "mp_rdv[%d]: bad --die-after-put %d of %d\n", me, dier, n);
        return 1;
    }
    make_blob(mine, sizeof mine, me, 9);
    if (nrs_rdv_put(r, 9, "late", mine, strlen(mine) + 1, err, sizeof err) ||
        nrs_rdv_commit(r, err, sizeof err) || nrs_rdv_fence(r, 9, "late", timeout, err, sizeof err)) {
        fprintf(stderr, "mp_rdv[%d]: %s\n", me, err);
        return 1;
    }
    if (me == dier)
        raise(SIGKILL);
    if (!told(r, dier)) {
        fprintf(stderr, "mp_rdv[%d]: never told of rank %d's death\n", me, dier);
        return 1;
    }
    if (nrs_rdv_get(r, dier, 9, "late", &blob, &len, timeout, err, sizeof err)) {
        fprintf(stderr, "mp_rdv[%d]: %s\n", me, err);
        return 4;
    }
    make_blob(want, sizeof want, dier, 9);
    int ok = len == strlen(want) + 1 && !memcmp(blob, want, len);
    free(blob);
    if (!ok) {
        fprintf(stderr, "mp_rdv[%d]: rank %d's blob is wrong\n", me, dier);
        return 1;
    }
    printf("mp_rdv[%d]: rank %d's blob read after its death\n", me, dier);
    return 0;
}

/* --gather: one epoch as a survivors' gather; 0 ok, 3 the failure naming
 * nojoin, 1 anything else. */
static int gather_epoch(nrs_rdv_t *r, unsigned e, int nojoin, double timeout)
{
    int me = nrs_rdv_rank(r), n = nrs_rdv_size(r), rc = 1;
    int32_t mine = (int32_t)(e * 1000 + (unsigned)me), *all = calloc((size_t)n, sizeof(*all));
    unsigned char *got = calloc((size_t)n, 1);
    char err[512], needle[32];
    if (!all || !got)
        goto out;
    if (nrs_rdv_gather(r, e, "gtest", &mine, sizeof mine, NULL, 0, all, got, timeout, err,
                       sizeof err)) {
        fprintf(stderr, "mp_rdv[%d]: %s\n", me, err);
        snprintf(needle, sizeof needle, "rank %d never arrived", nojoin);
        rc = nojoin >= 0 && strstr(err, needle) ? 3 : 1;
        goto out;
    }
    rc = 0;
    for (int i = 0; i < n; i++)
        if (!got[i] || all[i] != (int32_t)(e * 1000 + (unsigned)i)) {
            fprintf(stderr, "mp_rdv[%d]: epoch %u: rank %d's gather part is %s\n", me, e, i,
                    got[i] ? "wrong" : "missing");
            rc = 1;
        }
out:
    free(all);
    free(got);
    return rc;
}

int main(int argc, char **argv)
{
    int epochs = 3, nojoin = -1, expect_singleton = 0, dier = -1, before = -1, gather = 0, putdier = -1;
    double timeout = 10;
    char err[512];
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--epochs") && i + 1 < argc)
            epochs = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--nojoin") && i + 1 < argc)
            nojoin = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--timeout") && i + 1 < argc)
            timeout = atof(argv[++i]);
        else if (!strcmp(argv[i], "--die-after-gather") && i + 1 < argc)
            dier = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--die-after-put") && i + 1 < argc)
            putdier = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--die-before") && i + 1 < argc)
            before = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--expect-singleton"))
            expect_singleton = 1;
        else if (!strcmp(argv[i], "--gather"))
            gather = 1;
    }
    const char *envrank = getenv("NRS_MP_RANK");
    if (nojoin >= 0 && envrank && atoi(envrank) == nojoin) {
        sleep((unsigned)(timeout * 3 + 5)); /* the server kills us when the others give up */
        return 0;
    }
    nrs_rdv_t *r;
    if (nrs_rdv_init(&r, err, sizeof err)) {
        fprintf(stderr, "mp_rdv: %s\n", err);
        return 1;
    }
    int me = nrs_rdv_rank(r), n = nrs_rdv_size(r), rc = 0;
    if (expect_singleton && (!nrs_rdv_is_singleton(r) || n != 1 || me != 0)) {
        fprintf(stderr, "mp_rdv: expected a singleton, got rank %d of %d\n", me, n);
        rc = 1;
    }
    if (putdier >= 0) {
        rc = die_after_put(r, putdier, timeout);
        nrs_rdv_fini(r);
        return rc;
    }
    if (dier >= 0) {
        rc = die_after_gather(r, dier, before, timeout);
        nrs_rdv_fini(r);
        return rc;
    }
    for (int e = 1; e <= epochs && !rc && gather; e++)
        rc = gather_epoch(r, (unsigned)e, nojoin, timeout);
    for (int e = 1; e <= epochs && !rc && !gather; e++) {
        char mine[128], want[128];
        void **blobs;
        size_t *lens;
        make_blob(mine, sizeof mine, me, (unsigned)e);
        if (nrs_rdv_allgather(r, (uint64_t)e, "test", mine, strlen(mine) + 1, &blobs, &lens,
                              timeout, err, sizeof err)) {
            fprintf(stderr, "mp_rdv[%d]: %s\n", me, err);
            char needle[32];
            snprintf(needle, sizeof needle, "rank %d never arrived", nojoin);
            rc = nojoin >= 0 && strstr(err, needle) ? 3 : 1;
            break;
        }
        for (int i = 0; i < n; i++) {
            make_blob(want, sizeof want, i, (unsigned)e);
            if (lens[i] != strlen(want) + 1 || memcmp(blobs[i], want, lens[i])) {
                fprintf(stderr, "mp_rdv[%d]: epoch %d: rank %d's blob is wrong\n", me, e, i);
                rc = 1;
            }
        }
        nrs_rdv_free_blobs(r, blobs, lens);
    }
    if (!rc && nojoin >= 0) {
        fprintf(stderr, "mp_rdv[%d]: rendezvous succeeded although rank %d never joined\n", me,
                nojoin);
        rc = 1;
    }
    if (!rc)
        printf("mp_rdv[%d/%d]: %d epoch(s) ok%s\n", me, n, epochs,
               nrs_rdv_is_singleton(r) ? " (singleton)" : "");
    nrs_rdv_fini(r);
    return rc;
}
