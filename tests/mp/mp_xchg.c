/* mp_xchg: one rank of an all-to-all UCX exchange, run under pmix_srv.
 *
 *   mp_xchg [--bytes N] [--chunk N] [--window N] [--epochs N] [--timeout S]
 *           [--kill RANK] [--stop RANK] [--suspend S] [--op-timeout S] [--late-free]
 *           [--edges] [--no-fds]
 *
 * Rendezvous (worker addresses under "nrs.e<epoch>.ucx"), endpoints to every
 * rank, then per epoch every rank sends a deterministic buffer to every rank
 * (itself included) and checks each received buffer's XXH64 against the
 * sender's published checksum and against the generator.
 *
 * --kill R: rank R SIGKILLs itself once its transfers are under way. The
 * others must see the failure within 10 s, finish the exchanges with the
 * living, verify those, agree among themselves and exit 4 ("peer failure
 * detected as expected"); 5 if detection took longer; 1 on anything else.
 *
 * --stop R: rank R SIGSTOPs itself once its transfers of epoch 1 are under
 * way (more chunks than a window each). The others fail what involves it by
 * the stall time-out (--op-timeout), free their buffers through nrs_ucx_free
 * and resume it (SIGCONT); it fails what they gave up. Everybody drops what
 * is left under tag 1 (nrs_ucx_purge), then epoch 2 must go through whole.
 *
 * --suspend S: what Slurm does to a suspended job (scontrol suspend, then
 * resume): once its transfers of epoch 1 are under way, rank 0 SIGSTOPs every
 * other rank and itself for S seconds (longer than --op-timeout), then they
 * are resumed, rank 0 first and the others 0.2 s later (nodes resume one
 * after another). No peer failed: every transfer must complete, both epochs
 * verify whole on every rank (before: each rank's stall clock had counted
 * the stop, and at the resume every op still waiting failed at once, "no
 * progress for 1.0 s").
 *
 * --no-fds: from epoch 2 on, every rank runs with no file descriptor left
 * (all taken by dup): nothing may fail for it (the pid watch of the peers
 * of this host took an unreadable /proc for a dead peer).
 *
 * --edges (any number of ranks): a message whose chunk count overflows, a tag
 * of 33 bits and a send after nrs_ucx_disconnect must not be taken (refused,
 * or an op that failed at once); exit 1 if one is.
 *
 * --late-free (2 ranks, one host, tcp): rank 1 receives --bytes from rank 0
 * through the executor's UCX transport and SIGSTOPs rank 0 once the data
 * starts landing, so its request cannot be cancelled. Rank 1 aborts (cancel,
 * then mem_free of the receive buffer, as an aborted transition does), then
 * rank 0 resumes (SIGCONT) and the rest of its data lands. It must land in memory UCX was left,
 * not in freed memory (SIGSEGV, or an ASan report); both ranks then exchange
 * once more and exit 0.
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <xxhash.h>

#include "mp_suspend.h"
#include "rdv/rdv.h"
#include "xfer/ucx.h"
#include "xfer/xport_ucx.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The victim notes when it dies (NRS_MP_KILL_STAMP names a file) so the
 * survivors measure their detection latency from the real moment. */
static double wall_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void stamp_kill(void)
{
    const char *f = getenv("NRS_MP_KILL_STAMP");
    FILE *fp = f ? fopen(f, "w") : NULL;
    if (fp) {
        fprintf(fp, "%.6f\n", wall_s());
        fclose(fp);
    }
}

/* Seconds from the victim's death (or from start0) to t. */
static double since_kill(double t, double start0)
{
    const char *f = getenv("NRS_MP_KILL_STAMP");
    FILE *fp = f ? fopen(f, "r") : NULL;
    double k;
    if (!fp)
        return t - start0;
    int ok = fscanf(fp, "%lf", &k) == 1;
    fclose(fp);
    return ok ? t - k : t - start0;
}

static void fill(unsigned char *p, size_t n, int src, int dst, int epoch)
{
    uint64_t x = 0x9e3779b97f4a7c15ull ^ ((uint64_t)src << 40) ^ ((uint64_t)dst << 20) ^ (uint64_t)epoch;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        memcpy(p + i, &x, 8);
    }
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    for (; i < n; i++)
        p[i] = (unsigned char)(x >> (8 * (i & 7)));
}

typedef struct {
    size_t bytes;
    int epochs, kill, stop, late_free, edges, no_fds;
    pid_t stop_pid; /* --stop's victim */
    pid_t *pids;    /* --suspend: every rank's */
    double timeout, suspend;
    nrs_ucx_opts_t uo;
} args_t;

static void parse(int argc, char **argv, args_t *a)
{
    a->bytes = (1u << 20) + 4093;
    a->epochs = 2;
    a->kill = -1;
    a->stop = -1;
    a->suspend = 0;
    a->pids = NULL;
    a->timeout = 20;
    nrs_ucx_opts_init(&a->uo);
    a->uo.chunk_bytes = 256 << 10;
    a->late_free = a->edges = a->no_fds = 0;
    for (int i = 1; i < argc; i++) {
        a->late_free |= !strcmp(argv[i], "--late-free");
        a->edges |= !strcmp(argv[i], "--edges");
        a->no_fds |= !strcmp(argv[i], "--no-fds");
    }
    for (int i = 1; i + 1 < argc; i++) {
        if (!strcmp(argv[i], "--bytes"))
            a->bytes = strtoull(argv[++i], NULL, 0);
        else if (!strcmp(argv[i], "--chunk"))
            a->uo.chunk_bytes = strtoull(argv[++i], NULL, 0);
        else if (!strcmp(argv[i], "--window"))
            a->uo.window = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--epochs"))
            a->epochs = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--timeout"))
            a->timeout = atof(argv[++i]);
        else if (!strcmp(argv[i], "--op-timeout"))
            a->uo.op_timeout_s = atof(argv[++i]);
        else if (!strcmp(argv[i], "--kill"))
            a->kill = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--stop"))
            a->stop = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--suspend"))
            a->suspend = atof(argv[++i]);
    }
}

static bool probe(void *arg, int rank)
{
    return nrs_rdv_peer_failed(arg, rank);
}

/* Wait for every op; failed ones are reported, not fatal, so the exchanges
 * with living peers still finish. ops[i] is the receive from rank i, ops[n + i]
 * the send to rank i: lost[i] is set when one of them failed. Returns the
 * number that failed. */
static int wait_each(nrs_ucx_t *u, nrs_ucx_op_t **ops, int n, int me, int *lost, double *t_fail,
                     char *first, size_t firstlen)
{
    int failed = 0;
    for (;;) {
        int pending = 0;
        for (int i = 0; i < 2 * n; i++) {
            if (!ops[i])
                continue;
            int st = nrs_ucx_test(ops[i]);
            if (st == 0) {
                pending++;
            } else if (st < 0) {
                if (!failed++ && *t_fail == 0) {
                    *t_fail = wall_s();
                    snprintf(first, firstlen, "%s", nrs_ucx_op_error(ops[i]));
                }
                fprintf(stderr, "mp_xchg[%d]: %s\n", me, nrs_ucx_op_error(ops[i]));
                lost[i % n] = 1;
                nrs_ucx_op_free(ops[i]);
                ops[i] = NULL;
            }
        }
        if (!pending)
            return failed;
        if (nrs_ucx_progress(u) == 0) {
            struct timespec ts = {0, 20000};
            nanosleep(&ts, NULL);
        }
    }
}

static int exchange(nrs_rdv_t *r, nrs_ucx_t *u, const args_t *a, int epoch, int *dead,
                    double *t_fail, int *nbad)
{
    int me = nrs_rdv_rank(r), n = nrs_rdv_size(r), rc = 0;
    unsigned char **sbuf = calloc((size_t)n, sizeof(*sbuf)), **rbuf = calloc((size_t)n, sizeof(*rbuf));
    nrs_ucx_op_t **ops = calloc(2 * (size_t)n, sizeof(*ops));
    uint64_t *sums = calloc((size_t)n, sizeof(*sums));
    int *lost = calloc((size_t)n, sizeof(*lost));
    char err[512], first[512] = "";
    if (!sbuf || !rbuf || !ops || !sums || !lost)
        goto oom;
    for (int j = 0; j < n; j++) {
        if (!(sbuf[j] = malloc(a->bytes ? a->bytes : 1)) || !(rbuf[j] = malloc(a->bytes ? a->bytes : 1)))
            goto oom;
        fill(sbuf[j], a->bytes, me, j, epoch);
        memset(rbuf[j], 0xee, a->bytes);
        sums[j] = XXH64(sbuf[j], a->bytes, 0);
    }
    /* Publish what we send so receivers check end to end. */
    if (nrs_rdv_put(r, (uint64_t)epoch, "sums", sums, (size_t)n * sizeof(*sums), err, sizeof err) ||
        nrs_rdv_commit(r, err, sizeof err)) {
        fprintf(stderr, "mp_xchg[%d]: %s\n", me, err);
        rc = 1;
        goto out;
    }
    int failed = 0;
    for (int k = 0; k < n; k++) { /* staggered order: rank me talks to me+k first */
        int j = (me + k) % n, from = (me - k + n) % n;
        /* A peer known dead gets no ops; the others go on. */
        if (nrs_ucx_peer_failed(u, from)) {
            if (!failed++)
                snprintf(first, sizeof first, "rank %d known dead: skipped", from);
        } else if (nrs_ucx_irecv(u, from, rbuf[from], a->bytes, (uint64_t)epoch, &ops[from], err,
                                 sizeof err)) {
            goto post_failed;
        }
        if (nrs_ucx_peer_failed(u, j)) {
            if (!failed++)
                snprintf(first, sizeof first, "rank %d known dead: skipped", j);
        } else if (nrs_ucx_isend(u, j, sbuf[j], a->bytes, (uint64_t)epoch, &ops[n + j], err,
                                 sizeof err)) {
            goto post_failed;
        }
    }
    if (me == a->kill) {
        /* Let a few chunks go out, then die without any clean-up. */
        double end = now_s() + 0.02;
        while (now_s() < end)
            nrs_ucx_progress(u);
        fprintf(stderr, "mp_xchg[%d]: SIGKILL myself mid-transfer\n", me);
        fflush(stderr);
        stamp_kill();
        raise(SIGKILL);
    }
    if (me == a->stop && epoch == 1) {
        /* Stop with its first chunks under way (more than a window of them
         * per message: the rest waits for this rank); the others time out,
         * abort and resume this rank. */
        fprintf(stderr, "mp_xchg[%d]: SIGSTOP myself mid-transfer\n", me);
        raise(SIGSTOP);
        fprintf(stderr, "mp_xchg[%d]: resumed\n", me);
    }
    pid_t resumer = a->suspend > 0 && me == 0 && epoch == 1
                        ? mp_suspend_job(a->pids, n, a->suspend, "mid-transfer") : -1;
    failed += wait_each(u, ops, n, me, lost, t_fail, first, sizeof first);
    if (resumer > 0)
        waitpid(resumer, NULL, 0);
    if (a->stop >= 0 && a->stop != me && epoch == 1)
        kill(a->stop_pid, SIGCONT);
    for (int j = 0; j < n; j++)
        if (nrs_ucx_peer_failed(u, j))
            dead[j] = 1;
    *nbad = failed;
    int verified = 0;
    for (int i = 0; a->stop >= 0 && a->stop != me && epoch == 1 && i < n; i++)
        if (lost[i] != (i == a->stop)) { /* only what involves the stopped rank fails */
            fprintf(stderr, "mp_xchg[%d]: epoch 1: transfers with rank %d %s\n", me, i,
                    lost[i] ? "failed" : "did not fail");
            rc = 1;
        }
    for (int i = 0; i < n; i++) {
        if (dead[i] || lost[i])
            continue;
        void *blob;
        size_t len;
        if (nrs_rdv_get(r, i, (uint64_t)epoch, "sums", &blob, &len, a->timeout, err, sizeof err)) {
            fprintf(stderr, "mp_xchg[%d]: %s\n", me, err);
            rc = 1;
            continue;
        }
        uint64_t want = len == (size_t)n * sizeof(uint64_t) ? ((uint64_t *)blob)[me] : 0;
        free(blob);
        uint64_t have = XXH64(rbuf[i], a->bytes, 0);
        fill(sbuf[0], a->bytes, i, me, epoch); /* regenerate into a scratch buffer */
        uint64_t gen = XXH64(sbuf[0], a->bytes, 0);
        if (have != want || have != gen) {
            fprintf(stderr, "mp_xchg[%d]: epoch %d: from rank %d: checksum %016llx, sender says "
                    "%016llx, generator %016llx\n", me, epoch, i, (unsigned long long)have,
                    (unsigned long long)want, (unsigned long long)gen);
            rc = 1;
        } else {
            verified++;
        }
    }
    if (!failed && !rc)
        printf("mp_xchg[%d/%d]: epoch %d: %d buffer(s) of %zu bytes verified\n", me, n, epoch,
               verified, a->bytes);
    else if (failed && !rc)
        printf("mp_xchg[%d/%d]: epoch %d: %d op(s) failed (%s); %d buffer(s) from living ranks "
               "verified\n", me, n, epoch, failed, first, verified);
    goto out;
post_failed:
    fprintf(stderr, "mp_xchg[%d]: %s\n", me, err);
    rc = 1;
    goto out;
oom:
    fprintf(stderr, "mp_xchg[%d]: out of memory\n", me);
    rc = 1;
out:
    for (int j = 0; ops && j < 2 * n; j++)
        nrs_ucx_op_free(ops[j]);
    /* a request UCX could not cancel (a stopped peer's) may still use them */
    for (int j = 0; j < n; j++) {
        if (sbuf)
            nrs_ucx_free(u, sbuf[j], a->bytes);
        if (rbuf)
            nrs_ucx_free(u, rbuf[j], a->bytes);
    }
    free(sbuf);
    free(rbuf);
    free(ops);
    free(sums);
    free(lost);
    return rc;
}

static int identity(void *arg, int owner)
{
    (void)arg;
    return owner;
}

static void progress_for(nrs_ucx_t *u, double s)
{
    for (double end = now_s() + s; now_s() < end;)
        if (nrs_ucx_progress(u) <= 0)
            usleep(50);
}

static int late_free(nrs_rdv_t *r, nrs_ucx_t *u, const args_t *a, int me)
{
    char err[512];
    int rc = 1;
    pid_t pid = getpid(), peer = 0;
    void **blobs = NULL;
    size_t *lens = NULL;
    if (nrs_rdv_size(r) != 2) {
        fprintf(stderr, "mp_xchg: --late-free needs 2 ranks\n");
        return 1;
    }
    if (nrs_rdv_allgather(r, 0, "pid", &pid, sizeof pid, &blobs, &lens, a->timeout, err,
                          sizeof err)) {
        fprintf(stderr, "mp_xchg[%d]: %s\n", me, err);
        return 1;
    }
    memcpy(&peer, blobs[0], sizeof peer);
    nrs_rdv_free_blobs(r, blobs, lens);
    if (me == 0) { /* rank 1 stops and resumes this process */
        unsigned char *b = malloc(a->bytes);
        nrs_ucx_op_t *op = NULL;
        if (b)
            fill(b, a->bytes, 0, 1, 7);
        if (nrs_rdv_fence(r, 49, NULL, a->timeout, err, sizeof err) || !b ||
            nrs_ucx_isend(u, 1, b, a->bytes, 7, &op, err, sizeof err) ||
            nrs_ucx_waitall(u, &op, 1, err, sizeof err)) {
            fprintf(stderr, "mp_xchg[0]: %s\n", b ? err : "out of memory");
            free(b);
            return 1;
        }
        free(b);
        rc = 0;
    } else {
        nrs_xport_t x;
        nrs_xmem_t m;
        nrs_xreq_t req;
        if (nrs_xport_ucx_open(&x, u, identity, NULL))
            return 1;
        if (x.ops->mem_alloc(x.ctx, 1, a->bytes, &m)) {
            nrs_xport_close(&x);
            return 1;
        }
        memset(m.ptr, 0, a->bytes);
        nrs_xregion_t reg = {.mem = &m, .off = 0, .rows = 1, .row_bytes = a->bytes,
                             .pitch = a->bytes};
        int bad = x.ops->recv(x.ctx, 0, &reg, 7, &req);
        if (bad)
            snprintf(err, sizeof err, "%s", nrs_xport_ucx_error(&x));
        if (bad || nrs_rdv_fence(r, 49, NULL, a->timeout, err, sizeof err)) {
            fprintf(stderr, "mp_xchg[1]: %s\n", err);
            nrs_xport_ucx_cancel(&x);
            x.ops->mem_free(x.ctx, &m);
            nrs_xport_close(&x);
            return 1;
        }
        /* rank 0's data starts landing: stop it there, mid-rendezvous */
        uint64_t first = 0;
        for (double end = now_s() + a->timeout; now_s() < end && !req.done && !first;) {
            x.ops->progress(x.ctx);
            memcpy(&first, m.ptr, sizeof first);
        }
        kill(peer, SIGSTOP);
        if (req.done || !first) {
            fprintf(stderr, "mp_xchg[1]: the receive %s before the abort: nothing tested\n",
                    req.done ? "ended" : "never started");
        } else {
            nrs_xport_ucx_cancel(&x); /* the abort: 0.5 s, the request stays */
            x.ops->mem_free(x.ctx, &m);
            /* memory the allocator hands out again, where the old buffer was */
            unsigned char *again = malloc(a->bytes);
            if (again)
                memset(again, 0x5a, a->bytes);
            kill(peer, SIGCONT);
            progress_for(u, 3.0); /* rank 0 resumes: the rest of its data arrives */
            size_t changed = 0;
            for (size_t i = 0; again && i < a->bytes; i++)
                changed += again[i] != 0x5a;
            free(again);
            rc = again && !changed ? 0 : 1;
            printf("mp_xchg[1]: receive left to UCX at the abort; %zu byte(s) of memory "
                   "allocated after it changed\n", changed);
        }
        kill(peer, SIGCONT);
        nrs_xport_close(&x);
    }
    if (nrs_rdv_fence(r, 50, NULL, a->timeout, err, sizeof err)) {
        fprintf(stderr, "mp_xchg[%d]: fence: %s\n", me, err);
        rc = 1;
    }
    return rc;
}

/* --stop R: epoch 1 with rank R stopped mid-transfer (the others fail what
 * involves it by the stall time-out, resume it and go on; it fails what the
 * others gave up), everybody drops what is left under tag 1, then epoch 2 must
 * go through whole. */
static int stop_run(nrs_rdv_t *r, nrs_ucx_t *u, args_t *a, int me, int *dead)
{
    char err[512];
    pid_t pid = getpid();
    void **blobs = NULL;
    size_t *lens = NULL;
    int nbad = 0;
    double t0 = wall_s(), t_fail = 0;
    if (a->stop < 0 || a->stop >= nrs_rdv_size(r) ||
        nrs_rdv_allgather(r, 0, "pid", &pid, sizeof pid, &blobs, &lens, a->timeout, err,
                          sizeof err)) {
        fprintf(stderr, "mp_xchg[%d]: %s\n", me, a->stop < 0 ? "--stop: no such rank" : err);
        return 1;
    }
    memcpy(&a->stop_pid, blobs[a->stop], sizeof a->stop_pid);
    nrs_rdv_free_blobs(r, blobs, lens);
    if (exchange(r, u, a, 1, dead, &t_fail, &nbad))
        return 1;
    if (!nbad) {
        fprintf(stderr, "mp_xchg[%d]: epoch 1: nothing failed: nothing tested\n", me);
        return 1;
    }
    if (me != a->stop)
        printf("mp_xchg[%d]: stalled rank %d's transfers failed after %.2f s\n", me, a->stop,
               t_fail - t0);
    if (nrs_rdv_fence(r, 101, NULL, a->timeout, err, sizeof err)) {
        fprintf(stderr, "mp_xchg[%d]: fence: %s\n", me, err);
        return 1;
    }
    printf("mp_xchg[%d]: %zu stale message(s) of epoch 1 dropped\n", me,
           nrs_ucx_purge(u, 1, UINT32_MAX));
    if (exchange(r, u, a, 2, dead, &t_fail, &nbad))
        return 1;
    if (nbad) {
        fprintf(stderr, "mp_xchg[%d]: epoch 2: %d op(s) failed\n", me, nbad);
        return 1;
    }
    return 0;
}

/* --edges: what must not be taken: refused, or an op that failed at once */
static int edges(nrs_ucx_t *u, int me)
{
    char err[512], b[8];
    int bad = 0;
    struct {
        const char *what;
        size_t len;
        uint64_t tag;
    } cases[] = {
        {"a message of SIZE_MAX bytes", SIZE_MAX, 1},
        {"a message of SIZE_MAX - 1 bytes", SIZE_MAX - 1, 1},
        {"a tag of 2^32", 1, 1ull << 32},
        {"a send after nrs_ucx_disconnect", sizeof b, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        nrs_ucx_op_t *op = NULL;
        if (i == 3)
            nrs_ucx_disconnect(u, 2.0);
        int rc = nrs_ucx_isend(u, me, b, cases[i].len, cases[i].tag, &op, err, sizeof err);
        int st = rc ? -1 : nrs_ucx_test(op);
        printf("mp_xchg[%d]: %s: %s\n", me, cases[i].what,
               rc ? err : st < 0 ? nrs_ucx_op_error(op) : st ? "done" : "pending");
        bad += st >= 0;
        nrs_ucx_op_free(op);
    }
    return bad ? 1 : 0;
}

/* --no-fds: take every free descriptor (*fds, their count) under a soft limit
 * of at most 4096 (a hard limit of millions would take long); give them back */
static struct rlimit fd_limit;

static int take_fds(int **fds)
{
    int n = 0, cap = 0, fd;
    struct rlimit low;
    *fds = NULL;
    getrlimit(RLIMIT_NOFILE, &fd_limit);
    low = fd_limit;
    low.rlim_cur = low.rlim_cur > 4096 ? 4096 : low.rlim_cur;
    setrlimit(RLIMIT_NOFILE, &low);
    while ((fd = dup(2)) >= 0) {
        if (n == cap) {
            int *v = realloc(*fds, (size_t)(cap = cap ? 2 * cap : 256) * sizeof(*v));
            if (!v) {
                close(fd);
                break;
            }
            *fds = v;
        }
        (*fds)[n++] = fd;
    }
    return n;
}

static void give_fds(int *fds, int n)
{
    for (int i = 0; i < n; i++)
        close(fds[i]);
    free(fds);
    if (n)
        setrlimit(RLIMIT_NOFILE, &fd_limit);
}

int main(int argc, char **argv)
{
    args_t a;
    char err[512];
    nrs_rdv_t *r = NULL;
    nrs_ucx_t *u = NULL;
    void **addrs = NULL;
    size_t *lens = NULL;
    int rc = 1;

    parse(argc, argv, &a);
    if (nrs_rdv_init(&r, err, sizeof err)) {
        fprintf(stderr, "mp_xchg: %s\n", err);
        return 1;
    }
    int me = nrs_rdv_rank(r), n = nrs_rdv_size(r);
    int *dead = calloc((size_t)n, sizeof(*dead));
    if (!dead || nrs_ucx_init(&u, me, n, &a.uo, err, sizeof err)) {
        fprintf(stderr, "mp_xchg[%d]: %s\n", me, dead ? err : "out of memory");
        goto out;
    }
    nrs_ucx_set_probe(u, probe, r);
    nrs_rdv_set_progress(r, nrs_ucx_progress, u);
    const void *addr;
    size_t alen;
    nrs_ucx_address(u, &addr, &alen);
    double t0 = now_s();
    if (nrs_rdv_allgather(r, 0, "ucx", addr, alen, &addrs, &lens, a.timeout, err, sizeof err) ||
        nrs_ucx_connect(u, addrs, lens, err, sizeof err)) {
        fprintf(stderr, "mp_xchg[%d]: %s\n", me, err);
        goto out;
    }
    if (me == 0)
        printf("mp_xchg: %d ranks connected in %.3f s\n", n, now_s() - t0);
    if (a.edges) {
        rc = edges(u, me);
        goto out;
    }
    if (a.late_free) {
        rc = late_free(r, u, &a, me);
        int d = rc ? 0 : exchange(r, u, &a, 1, dead, &(double){0}, &(int){0});
        rc = rc ? rc : d;
        nrs_ucx_disconnect(u, 5.0);
        goto out;
    }
    double t_fail = 0, t_start = wall_s();
    int nbad = 0;
    rc = 0;
    int bad_total = 0;
    if (a.stop >= 0 && (rc = stop_run(r, u, &a, me, dead)))
        goto out;
    if (a.suspend > 0 && (rc = mp_gather_pids(r, a.timeout, &a.pids)))
        goto out;
    int *fds = NULL, nfds = 0;
    for (int e = 1; e <= a.epochs && a.stop < 0 && !rc; e++) { /* survivors run every epoch */
        if (a.no_fds && e == 2) { /* and long enough for the pid watch to look */
            printf("mp_xchg[%d]: %d file descriptor(s) taken, none left\n", me,
                   nfds = take_fds(&fds));
            progress_for(u, 0.3);
        }
        rc = exchange(r, u, &a, e, dead, &t_fail, &nbad);
        bad_total += nbad;
    }
    give_fds(fds, nfds);
    if (rc)
        goto out;
    if (bad_total) {
        int *alive = calloc((size_t)n, sizeof(*alive)), na = 0, who = -1;
        for (int i = 0; alive && i < n; i++) {
            if (!dead[i])
                alive[na++] = i;
            else if (who < 0)
                who = i;
        }
        double lag = since_kill(t_fail, t_start);
        printf("mp_xchg[%d]: peer failure detected after %.2f s: rank %d lost; %d survivor(s)\n",
               me, lag, who, na);
        /* Survivors agree they are done before closing, so none of them
         * tears down an endpoint another still reads from. */
        if (nrs_rdv_fence_survivors(r, NULL, 0, a.timeout, err, sizeof err))
            fprintf(stderr, "mp_xchg[%d]: survivors' fence: %s\n", me, err);
        free(alive);
        nrs_ucx_disconnect(u, 2.0);
        rc = lag < 10.0 ? 4 : 5;
        goto out;
    }
    nrs_ucx_disconnect(u, 5.0);
    if (nrs_rdv_fence(r, 99, NULL, a.timeout, err, sizeof err)) {
        fprintf(stderr, "mp_xchg[%d]: final fence: %s\n", me, err);
        rc = 1;
    }
out:
    if (addrs)
        nrs_rdv_free_blobs(r, addrs, lens);
    nrs_ucx_fini(u);
    nrs_rdv_fini(r);
    free(dead);
    free(a.pids);
    return rc;
}
