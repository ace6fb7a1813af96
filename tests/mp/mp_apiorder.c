/* The worker API called out of order or after a failure, in one process (a
 * singleton worker, no PMIx server) unless said otherwise:
 *   mp_apiorder badplan SPEC      a plan set_plan refuses (a model-stage on a pool that does
 *                                 not exist) leaves the previous plan and its state current
 *   mp_apiorder unbuildable SPEC  a well-formed plan whose state cannot be built (tp does not
 *                                 divide the heads) is refused: no plan, no state of 0 buffers
 *   mp_apiorder afterfail SPEC    after an init that failed (run it with NRS_WORKER_XPORT=ucx
 *                                 UCX_TLS=nosuchtl, or SPEC a file that does not exist) every
 *                                 call but last_error, finalize and the queries of what the
 *                                 handle is returns NRS_ERR_INVAL, saying the init failed
 *   mp_apiorder allocfail SPEC    alloc_state failing half-way (RLIMIT_AS) frees what it had
 *                                 allocated; the retry succeeds and leaks nothing
 *   mp_apiorder memflags SPEC     report_memory's 95% flag for counts near 2^62 (no overflow)
 *   mp_apiorder contact SPEC      2 ranks under tests/mp/pmix_srv: rank 1 is no worker but
 *                                 says at start-up (the "coll" blob) how to reach a controller
 *                                 with a blob that does not end in a NUL; rank 0 must read no
 *                                 byte past it (the token it sends in HELLO is the blob's)
 * Exit 0 when every check holds, 1 when one fails (a crash: the signal). */
#define _GNU_SOURCE
#include <config.h>

#include <arpa/inet.h>
#include <malloc.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "ctl/client.h"
#include "ctl/proto.h"
#include "nereus/nereus.h"
#include "nereus/plan.h"
#include "rdv/rdv.h"
#include "worker/worker.h"
#include "xfer/ucx.h"

#if defined(__SANITIZE_ADDRESS__)
#define UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define UNDER_ASAN 1
#endif
#endif
#ifndef UNDER_ASAN
#define UNDER_ASAN 0
#endif

static int fails;

#define CHECK(cond, ...)                                                                          \
    do {                                                                                          \
        if (!(cond)) {                                                                            \
            printf("FAIL %s:%d: ", __func__, __LINE__);                                           \
            printf(__VA_ARGS__);                                                                  \
            printf("\n");                                                                         \
            fails++;                                                                              \
        }                                                                                         \
        fflush(stdout);                                                                           \
    } while (0)

static nrs_spec_t spec;

static void plan_for(int gpus, unsigned epoch, nrs_plan_t *p)
{
    char err[256];
    nrs_plan_req_t req;
    nrs_plan_req_init(&req, &spec);
    req.gpus = gpus;
    if (nrs_plan_best(&spec, &req, p, err, sizeof err)) {
        printf("FAIL: no plan for %d GPU(s): %s\n", gpus, err);
        exit(2);
    }
    p->epoch = epoch;
}

static nrs_worker_t *singleton(void)
{
    nrs_worker_t *w = NULL;
    int rc = nrs_worker_init_spec(&w, &spec);
    if (rc) {
        printf("FAIL: init: %s: %s\n", nrs_worker_strerror(rc), nrs_worker_last_error(w));
        exit(2);
    }
    return w;
}

/* The state checks out: n buffers, each its pattern. */
static void state_ok(nrs_worker_t *w, int n, const char *when)
{
    long long v = -1, m = -1;
    int rc = nrs_worker_verify_state(w, &v, &m);
    CHECK(nrs_worker_nbuffers(w) == n, "%s: %d buffer(s), wanted %d", when, nrs_worker_nbuffers(w),
          n);
    CHECK(rc == NRS_OK && v == n && m == 0, "%s: verify %d (%lld verified, %lld mismatches): %s",
          when, rc, v, m, nrs_worker_last_error(w));
}

/* A plan whose model-stages sit on a pool out of range: refused, and the plan
 * and state of epoch 1 stay current. */
static int case_badplan(void)
{
    nrs_plan_t p1, bad, got;
    plan_for(1, 1, &p1);
    nrs_worker_t *w = singleton();
    CHECK(!nrs_worker_set_plan(w, &p1), "set_plan(epoch 1): %s", nrs_worker_last_error(w));
    CHECK(!nrs_worker_alloc_state(w, NRS_MEM_HOST, 1), "alloc_state: %s",
          nrs_worker_last_error(w));
    int nroles = nrs_worker_nroles(w), nbuf = nrs_worker_nbuffers(w);
    printf("epoch 1: %d role(s), %d buffer(s)\n", nroles, nbuf);
    bad = p1;
    bad.epoch = 2;
    for (int ms = 0; ms < NRS_MS_COUNT; ms++)
        if (bad.has[ms])
            bad.pool_of[ms] = 100000000;
    int rc = nrs_worker_set_plan(w, &bad);
    printf("set_plan(pool 100000000) -> %d: %s\n", rc, nrs_worker_last_error(w));
    fflush(stdout);
    CHECK(rc == NRS_ERR_PLAN, "set_plan of a bad plan returned %d, wanted NRS_ERR_PLAN", rc);
    CHECK(nrs_worker_epoch(w) == 1, "epoch %d after the refusal, wanted 1", nrs_worker_epoch(w));
    CHECK(nrs_worker_nroles(w) == nroles, "%d role(s) after the refusal, wanted %d",
          nrs_worker_nroles(w), nroles);
    CHECK(!nrs_worker_plan(w, &got) && got.epoch == 1 && got.pool_of[0] == p1.pool_of[0],
          "nrs_worker_plan after the refusal is not epoch 1's");
    for (int i = 0; i < nroles; i++) {
        int ms = -1, t = -1;
        CHECK(!nrs_worker_role(w, i, &ms, NULL, NULL, NULL, &t, NULL, NULL) && ms >= 0,
              "role %d: %s", i, nrs_worker_last_error(w));
        int ranks[64];
        CHECK(nrs_worker_group(w, ms, NRS_GROUP_TP, ranks, 64) >= 1, "group of %s: %s",
              nrs_worker_ms_name(ms), nrs_worker_last_error(w));
    }
    state_ok(w, nbuf, "after the refused plan");
    /* a plan of the same shape, epoch 2: taken */
    nrs_plan_t p2 = p1;
    p2.epoch = 2;
    CHECK(!nrs_worker_set_plan(w, &p2) && nrs_worker_epoch(w) == 2, "set_plan(epoch 2): %s",
          nrs_worker_last_error(w));
    nrs_worker_finalize(w);
    printf("badplan: %s\n", fails ? "FAILED" : "ok");
    return fails != 0;
}

/* Pools and layouts that fit (the checks of a plan from the wire pass), but
 * tp = 3 does not divide the actor's 8 heads: nrs_emu_state_build refuses. */
static void unbuildable(nrs_plan_t *p)
{
    memset(p, 0, sizeof(*p));
    p->epoch = 1;
    p->total_gpus = 4;
    p->npools = 1;
    p->pools[0].first_gpu = 0;
    p->pools[0].gpus = 4;
    for (int ms = 0; ms < NRS_MS_COUNT; ms++) {
        p->has[ms] = 1;
        p->pool_of[ms] = 0;
        p->layout[ms] = (nrs_layout_t){.tp = 1, .pp = 1, .dp = 1, .mb = 1};
    }
    p->layout[NRS_MS_ACTOR_TRAIN].tp = 3;
}

static int case_unbuildable(void)
{
    nrs_plan_t bad, p1;
    unbuildable(&bad);
    nrs_worker_t *w = singleton();
    int rc = nrs_worker_set_plan(w, &bad);
    printf("no plan yet: set_plan(tp 3) -> %d: %s\n", rc, nrs_worker_last_error(w));
    CHECK(rc == NRS_ERR_PLAN, "set_plan returned %d, wanted NRS_ERR_PLAN", rc);
    CHECK(nrs_worker_epoch(w) == -1, "epoch %d after the refusal, wanted -1 (no plan)",
          nrs_worker_epoch(w));
    /* out of order or NULL: refused, the message naming the call (docs/worker-api.md §1) */
    rc = nrs_worker_set_plan(w, NULL);
    printf("set_plan(NULL) -> %d: %s\n", rc, nrs_worker_last_error(w));
    CHECK(rc == NRS_ERR_INVAL && !strncmp(nrs_worker_last_error(w), "nrs_worker_set_plan: ", 21),
          "set_plan(NULL): %d: %s", rc, nrs_worker_last_error(w));
    rc = nrs_worker_transition(w, &bad);
    printf("transition without a plan -> %d: %s\n", rc, nrs_worker_last_error(w));
    CHECK(rc == NRS_ERR_INVAL && !strncmp(nrs_worker_last_error(w), "nrs_worker_transition: ", 23),
          "transition without a plan: %d: %s", rc, nrs_worker_last_error(w));
    CHECK(nrs_worker_nroles(w) == 0, "%d role(s) without a plan", nrs_worker_nroles(w));
    rc = nrs_worker_alloc_state(w, NRS_MEM_HOST, 1);
    printf("alloc_state -> %d (%d buffer(s)): %s\n", rc, nrs_worker_nbuffers(w),
           nrs_worker_last_error(w));
    CHECK(rc == NRS_ERR_INVAL, "alloc_state without a usable plan returned %d, wanted "
          "NRS_ERR_INVAL", rc);
    /* with a plan: refused, the plan and its state stay */
    plan_for(1, 1, &p1);
    CHECK(!nrs_worker_set_plan(w, &p1), "set_plan(epoch 1): %s", nrs_worker_last_error(w));
    CHECK(!nrs_worker_alloc_state(w, NRS_MEM_HOST, 1), "alloc_state: %s",
          nrs_worker_last_error(w));
    int nbuf = nrs_worker_nbuffers(w);
    bad.epoch = 2;
    rc = nrs_worker_set_plan(w, &bad);
    CHECK(rc == NRS_ERR_PLAN && nrs_worker_epoch(w) == 1, "set_plan(tp 3) on epoch 1: %d, "
          "epoch %d", rc, nrs_worker_epoch(w));
    state_ok(w, nbuf, "after the refused plan");
    rc = nrs_worker_transition(w, NULL);
    printf("transition(NULL) -> %d: %s\n", rc, nrs_worker_last_error(w));
    CHECK(rc == NRS_ERR_INVAL && !strncmp(nrs_worker_last_error(w), "nrs_worker_transition: ", 23),
          "transition(NULL): %d: %s", rc, nrs_worker_last_error(w));
    state_ok(w, nbuf, "after transition(NULL)");
    nrs_worker_finalize(w);
    printf("unbuildable: %s\n", fails ? "FAILED" : "ok");
    return fails != 0;
}

/* Every call but the allowed ones: NRS_ERR_INVAL, "nrs_worker_init failed". */
#define REFUSED(expr)                                                                             \
    do {                                                                                          \
        int rc_ = (expr);                                                                         \
        const char *e_ = nrs_worker_last_error(w);                                                \
        CHECK(rc_ == NRS_ERR_INVAL && strstr(e_, "nrs_worker_init failed"),                       \
              "%s -> %d: %s", #expr, rc_, e_);                                                    \
        nrefused++;                                                                               \
    } while (0)

static void sink(void *arg, const char *json)
{
    (void)arg;
    (void)json;
}

static int case_afterfail(const char *path)
{
    nrs_worker_t *w = NULL;
    int rc = nrs_worker_init(&w, path), nrefused = 0;
    char init_err[640];
    snprintf(init_err, sizeof init_err, "%s", nrs_worker_last_error(w));
    printf("init -> %d (%s): %s\n", rc, nrs_worker_strerror(rc), init_err);
    if (!rc || !w) {
        printf("afterfail: init did not fail with a handle (rc %d): nothing to check\n", rc);
        nrs_worker_finalize(w);
        return 1;
    }
    nrs_plan_t p; /* every model-stage on 1 GPU (no spec needed: it may not load) */
    unbuildable(&p);
    p.total_gpus = p.pools[0].gpus = 1;
    p.layout[NRS_MS_ACTOR_TRAIN].tp = 1;
    rc = nrs_worker_set_plan(w, &p);
    printf("set_plan -> %d: %s\n", rc, nrs_worker_last_error(w));
    fflush(stdout);
    CHECK(rc == NRS_ERR_INVAL, "set_plan after a failed init returned %d", rc);
    CHECK(strstr(nrs_worker_last_error(w), init_err) != NULL, "the message lacks the init's");
    rc = nrs_worker_alloc_state(w, NRS_MEM_HOST, 1);
    printf("alloc_state -> %d: %s\n", rc, nrs_worker_last_error(w));
    fflush(stdout);
    REFUSED(nrs_worker_alloc_state(w, NRS_MEM_HOST, 1));
    REFUSED(nrs_worker_set_plan(w, &p));
    REFUSED(nrs_worker_epoch(w));
    REFUSED(nrs_worker_nroles(w));
    REFUSED(nrs_worker_role(w, 0, NULL, NULL, NULL, NULL, NULL, NULL, NULL));
    REFUSED(nrs_worker_group(w, NRS_MS_ACTOR_TRAIN, NRS_GROUP_TP, NULL, 0));
    REFUSED(nrs_worker_mem_kind(w));
    REFUSED(nrs_worker_nbuffers(w));
    REFUSED(nrs_worker_buffer(w, 0, NULL, NULL));
    REFUSED(nrs_worker_buffer_desc(w, 0, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL));
    REFUSED(nrs_worker_buffer_layer(w, 0, 0, NULL, NULL, NULL, NULL, NULL, NULL));
    REFUSED(nrs_worker_verify_state(w, NULL, NULL));
    REFUSED(nrs_worker_set_report_sink(w, sink, NULL));
    REFUSED(nrs_worker_report_stage(w, 0, 1.0));
    REFUSED(nrs_worker_report_memory(w, 1, 2, 0));
    REFUSED(nrs_worker_report_step(w, 0, 1.0));
    REFUSED(nrs_worker_gpu(w));
    REFUSED(nrs_worker_plan(w, &p));
    nrs_worker_set_report_hook(w, NULL, NULL);
    CHECK(strstr(nrs_worker_last_error(w), "nrs_worker_init failed") != NULL,
          "set_report_hook: %s", nrs_worker_last_error(w));
    /* the calls of the other files: refused alike */
    REFUSED(nrs_worker_transition(w, &p));
    REFUSED(nrs_worker_weight_sync(w));
    REFUSED(nrs_worker_control_plan(w, 0));
    REFUSED(nrs_worker_control_poll(w, 0));
    REFUSED(nrs_worker_control_step(w));
    REFUSED(nrs_worker_set_checkpoint_dir(w, "/tmp"));
    REFUSED(nrs_worker_checkpoint(w, 0));
    REFUSED(nrs_worker_verify_generation(w, NULL, NULL));
    /* what the handle is: still answered */
    printf("rank %d size %d singleton %d transport %s control %s\n", nrs_worker_rank(w),
           nrs_worker_size(w), nrs_worker_is_singleton(w), nrs_worker_transport(w),
           nrs_worker_control(w));
    CHECK(nrs_worker_finalize(w) == NRS_OK, "finalize: %s", nrs_worker_last_error(NULL));
    printf("afterfail: %d call(s) refused: %s\n", nrefused, fails ? "FAILED" : "ok");
    return fails != 0;
}

/* The process's mapped bytes (/proc/self/statm: pages). */
static long long vm_bytes(void)
{
    long long pages = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f) {
        if (fscanf(f, "%lld", &pages) != 1)
            pages = 0;
        fclose(f);
    }
    return pages * sysconf(_SC_PAGESIZE);
}

static int case_allocfail(void)
{
    if (UNDER_ASAN) { /* its allocator reserves and keeps what RLIMIT_AS would count */
        printf("allocfail: skipped under AddressSanitizer\n");
        return 0;
    }
    mallopt(M_MMAP_THRESHOLD, 64 * 1024); /* big buffers mapped, unmapped when freed */
    nrs_plan_t p;
    plan_for(4, 1, &p);
    nrs_worker_t *w = singleton();
    long long total = 0, bytes;
    CHECK(!nrs_worker_set_plan(w, &p), "set_plan: %s", nrs_worker_last_error(w));
    CHECK(!nrs_worker_alloc_state(w, NRS_MEM_HOST, 1), "alloc_state: %s",
          nrs_worker_last_error(w));
    int nbuf = nrs_worker_nbuffers(w);
    for (int i = 0; i < nbuf; i++)
        if (!nrs_worker_buffer(w, i, NULL, &bytes))
            total += bytes;
    CHECK(!nrs_worker_set_plan(w, &p), "set_plan again (frees the state): %s",
          nrs_worker_last_error(w));
    long long v0 = vm_bytes();
    struct rlimit old, lim;
    getrlimit(RLIMIT_AS, &old);
    lim = old;
    lim.rlim_cur = (rlim_t)(v0 + total / 2);
    setrlimit(RLIMIT_AS, &lim);
    int rc = nrs_worker_alloc_state(w, NRS_MEM_HOST, 1);
    long long v1 = vm_bytes();
    setrlimit(RLIMIT_AS, &old);
    printf("%d buffer(s) of %lld bytes; limited to +%lld: alloc_state -> %d: %s; %lld bytes "
           "still mapped\n", nbuf, total, total / 2, rc, nrs_worker_last_error(w), v1 - v0);
    CHECK(rc == NRS_ERR_NOMEM, "alloc_state under the limit returned %d, wanted NRS_ERR_NOMEM",
          rc);
    CHECK(v1 - v0 < total / 8, "the failed alloc_state kept %lld bytes", v1 - v0);
    CHECK(nrs_worker_nbuffers(w) == 0, "%d buffer(s) after the failure", nrs_worker_nbuffers(w));
    rc = nrs_worker_alloc_state(w, NRS_MEM_HOST, 1);
    CHECK(rc == NRS_OK, "the retry: %d: %s", rc, nrs_worker_last_error(w));
    state_ok(w, nbuf, "after the retry");
    CHECK(!nrs_worker_set_plan(w, &p), "set_plan (frees the state): %s",
          nrs_worker_last_error(w));
    long long v2 = vm_bytes();
    printf("after the retry's state was freed: %lld bytes still mapped\n", v2 - v0);
    CHECK(v2 - v0 < total / 8, "%lld bytes leaked by the retry", v2 - v0);
    nrs_worker_finalize(w);
    printf("allocfail: %s\n", fails ? "FAILED" : "ok");
    return fails != 0;
}

static char last_json[2048];
static void keep_json(void *arg, const char *json)
{
    (void)arg;
    snprintf(last_json, sizeof last_json, "%s", json);
}

/* The flags of one report of (used, cap). */
static int flags_of(nrs_worker_t *w, long long used, long long cap)
{
    unsigned f = 99;
    CHECK(!nrs_worker_report_memory(w, used, cap, 0), "report_memory: %s",
          nrs_worker_last_error(w));
    CHECK(!nrs_worker_report_step(w, 1, 1.0), "report_step: %s", nrs_worker_last_error(w));
    const char *s = strstr(last_json, "\"flags\":");
    if (!s || sscanf(s, "\"flags\":%u", &f) != 1)
        printf("FAIL: no flags in %s\n", last_json), fails++;
    return (int)f;
}

static int case_memflags(void)
{
    nrs_worker_t *w = singleton();
    struct { long long used, cap; int want; } t[] = {
        {94, 100, 0},
        {95, 100, 1},
        {1LL << 60, 1LL << 62, 0},             /* 25%: used * 100 and cap * 95 overflow */
        {(1LL << 62) - 1, 1LL << 62, 1},       /* ~100% */
        {(1LL << 62) / 100 * 94, 1LL << 62, 0},
        {(1LL << 62) / 100 * 96, 1LL << 62, 1},
        {0x7fffffffffffffffLL / 2, 0x7fffffffffffffffLL, 0},
    };
    nrs_worker_set_report_sink(w, keep_json, NULL);
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        int f = flags_of(w, t[i].used, t[i].cap);
        printf("used %lld of %lld: flags %d\n", t[i].used, t[i].cap, f);
        CHECK((f & 1) == t[i].want, "used %lld of %lld: near-cap flag %d, wanted %d", t[i].used,
              t[i].cap, f & 1, t[i].want);
    }
    nrs_worker_finalize(w);
    printf("memflags: %s\n", fails ? "FAILED" : "ok");
    return fails != 0;
}

/* ---- contact: rank 0 a worker, rank 1 a peer with an unterminated blob ------------- */

enum { CONTACT = 512, NB = 11 }; /* the blob coll_choice exchanges; the token's B's */

/* malloc'd chunks of the blob's size, freed full of 'C': a read past a blob
 * that lands in one finds no NUL soon. */
static void poison_heap(void)
{
    void *p[32];
    for (int i = 0; i < 32; i++)
        if ((p[i] = malloc(CONTACT)))
            memset(p[i], 'C', malloc_usable_size(p[i]));
    for (int i = 0; i < 32; i++)
        free(p[i]);
}

static int contact_worker(void)
{
    nrs_worker_t *w = NULL;
    poison_heap();
    int rc = nrs_worker_init_spec(&w, &spec);
    printf("rank 0: init -> %d: %s; control %s\n", rc, nrs_worker_last_error(w),
           nrs_worker_control(w));
    fflush(stdout);
    rc = nrs_worker_finalize(w) || rc;
    return rc != 0;
}

static int contact_peer(void)
{
    char err[512];
    nrs_rdv_t *r;
    nrs_ucx_t *u;
    double to = 20;
    if (nrs_rdv_init(&r, err, sizeof err))
        return printf("rank 1: rdv: %s\n", err), 1;
    int me = nrs_rdv_rank(r), n = nrs_rdv_size(r);
    nrs_ucx_opts_t uo;
    nrs_ucx_opts_init(&uo);
    if (nrs_ucx_init(&u, me, n, &uo, err, sizeof err))
        return printf("rank 1: ucx: %s\n", err), 1;
    nrs_rdv_set_progress(r, nrs_ucx_progress, u);
    const void *a;
    size_t al;
    void **b;
    size_t *l;
    nrs_ucx_address(u, &a, &al);
    if (nrs_rdv_allgather(r, 0, "ucx", a, al, &b, &l, to, err, sizeof err))
        return printf("rank 1: ucx allgather: %s\n", err), 1;
    if (nrs_ucx_connect(u, b, l, err, sizeof err))
        return printf("rank 1: ucx connect: %s\n", err), 1;
    nrs_rdv_free_blobs(r, b, l);
    /* a "controller" rank 0 can reach */
    int ls = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    struct sockaddr_in sa;
    socklen_t sl = sizeof sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (ls < 0 || bind(ls, (struct sockaddr *)&sa, sizeof sa) || listen(ls, 4) ||
        getsockname(ls, (struct sockaddr *)&sa, &sl))
        return printf("rank 1: listen: failed\n"), 1;
    /* "1HOST:PORT<spaces>BBBBBBBBBBB", no NUL: the token runs to the blob's end */
    char blob[CONTACT];
    memset(blob, ' ', sizeof blob);
    blob[0] = 1;
    int k = snprintf(blob + 1, 64, "127.0.0.1:%u", (unsigned)ntohs(sa.sin_port));
    blob[1 + k] = ' ';
    memset(blob + CONTACT - NB, 'B', NB);
    if (nrs_rdv_allgather(r, 0, "coll", blob, sizeof blob, &b, &l, to, err, sizeof err))
        return printf("rank 1: coll allgather: %s\n", err), 1;
    nrs_rdv_free_blobs(r, b, l);
    char c2 = 0; /* no control channel here: all take PMIx */
    if (nrs_rdv_allgather(r, 0, "coll2", &c2, 1, &b, &l, to, err, sizeof err))
        return printf("rank 1: coll2 allgather: %s\n", err), 1;
    nrs_rdv_free_blobs(r, b, l);
    int bad = 1;
    struct pollfd pf = {ls, POLLIN, 0};
    if (poll(&pf, 1, 5000) == 1) {
        int fd = accept(ls, NULL, NULL);
        uint8_t *buf = malloc(NRS_PROTO_HDR + NRS_PROTO_MAX_PAYLOAD);
        nrs_hdr_t h;
        nrs_msg_hello_t m;
        char why[256];
        if (fd >= 0 && buf &&
            !nrs_client_recv(fd, buf, NRS_PROTO_HDR + NRS_PROTO_MAX_PAYLOAD, &h, 10, why,
                             sizeof why) &&
            h.type == NRS_MSG_HELLO &&
            !nrs_dec_hello(buf + NRS_PROTO_HDR, h.length, &m, why, sizeof why)) {
            size_t tl = strlen(m.token);
            printf("rank 1: HELLO from rank %d, token of %zu byte(s): '%.40s'\n", (int)m.rank, tl,
                   m.token);
            bad = tl != NB || strspn(m.token, "B") != NB;
            if (bad)
                printf("FAIL: rank 0 read past the blob: the token should be %d B's\n", NB);
        } else {
            printf("FAIL: no HELLO from rank 0\n");
        }
        free(buf);
        if (fd >= 0)
            close(fd);
    } else {
        printf("FAIL: rank 0 never connected to the blob's address\n");
    }
    close(ls);
    nrs_ucx_disconnect(u, 2.0);
    if (nrs_rdv_fence_survivors(r, NULL, 0, to, err, sizeof err))
        printf("rank 1: fence: %s\n", err);
    nrs_ucx_fini(u);
    nrs_rdv_fini(r);
    return bad;
}

int main(int argc, char **argv)
{
    char err[512];
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 3) {
        fprintf(stderr, "usage: mp_apiorder badplan|unbuildable|afterfail|allocfail|memflags|"
                "contact SPEC\n");
        return 2;
    }
    const char *c = argv[1];
    if (!strcmp(c, "afterfail"))
        return case_afterfail(argv[2]);
    if (nrs_spec_load(argv[2], &spec, err, sizeof err)) {
        fprintf(stderr, "mp_apiorder: %s: %s\n", argv[2], err);
        return 2;
    }
    if (!strcmp(c, "badplan"))
        return case_badplan();
    if (!strcmp(c, "unbuildable"))
        return case_unbuildable();
    if (!strcmp(c, "allocfail"))
        return case_allocfail();
    if (!strcmp(c, "memflags"))
        return case_memflags();
    if (!strcmp(c, "contact")) {
        const char *rk = getenv("PMIX_RANK");
        return rk && atoi(rk) == 1 ? contact_peer() : contact_worker();
    }
    fprintf(stderr, "mp_apiorder: %s: no such case\n", c);
    return 2;
}
