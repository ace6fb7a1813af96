/* The worker's control-channel edges in one process: a singleton worker whose
 * control channel is one end of a socketpair, a fake controller (a thread) on
 * the other. Each case runs in its own process (argv[1] names it):
 *   planmid   a PLAN(TRANSITION) arrives while the transition's votes wait:
 *             the running transition keeps its own plan (it used the freed
 *             one: ASan saw it) and commits epoch 2, every shard verified;
 *   abort     PREPARE(2) and ABORT(2) read together at a step boundary: the
 *             kept PREPARE is void (it ran all the same, then waited for a
 *             COMMIT that never came);
 *   abortmid  the controller aborts epoch 2 during the transition's first vote
 *             and retries it at once (the same epoch number, another plan):
 *             the rank must not vote yes for the aborted run (it did, the
 *             controller took that ACK for the retry's and the rank committed
 *             the aborted plan); it runs the retry, which commits;
 *   world N   a WORLD whose gather answer names a GPU holder that is gone
 *             (N=0) or a GPU out of range (N=1): a clear error, no overflow;
 *   retune N  a re-tune (epoch 2: epoch 1's plan with every micro-batch
 *             doubled, nrs_adapt_retune) through PLAN/PREPARE/COMMIT: it
 *             commits, every shard verified, without a GATHER (N=0: the
 *             controller's COMMIT decides; the executor's three votes and
 *             the NCCL choice are not run), and under tests/fakegpu without
 *             setting up a communicator or copying between GPU and host;
 *             N=1: the collectives over PMIx (a singleton's), one vote, the
 *             COMMIT, then the settle;
 *   worldmem N  the world switch of "world" on a rank without memory for it:
 *             N=0, none for the first gather (the lengths): the rank still
 *             sends its part, saying so, and waits for no answer; N=1, none
 *             for the second's answer: it still sends its entry, marked;
 *             neither switches (before, it returned without a GATHER, and
 *             the others waited for it and then took it for dead);
 *   worldpeer N  the same seen from a rank with its memory: the answer has
 *             rank 1's mark (N=0: in the lengths, N=1: in the entries): no
 *             rank switches, and after the lengths no second GATHER;
 *   suspend   the process SIGSTOPped for 3 s (a Slurm suspend stops the job's
 *             ranks and its controller) while the worker waits for the
 *             COMMIT of epoch 2 at the point of no return (NRS_WORKER_TIMEOUT
 *             0.5: it waits 2 s), the COMMIT sent 0.3 s after the resume:
 *             the worker commits epoch 2, every shard verified (before: its
 *             wait had counted the stop, it gave up at the resume, "no
 *             COMMIT from the controller for epoch 2 (timed out)");
 *   reports   the reports a trainer may make (before any plan, a stage of 0 s,
 *             infinite or huge figures): every REPORT frame the worker sends
 *             decodes as the controller decodes it (a frame it refuses gets
 *             the rank dropped and retired), the rest refused by the call.
 * Exit 0 when the case behaved; it prints what it saw. */
#include <config.h>

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../fakegpu/counts.h"
#include "mp_suspend.h"
#include "ctl/proto.h"
#include "nereus/nereus.h"
#include "nereus/plan.h"
#include "worker/worker_int.h"

static int cfd = -1, mode;
static int ngathers;              /* GATHER frames the fake controller read */
static char gnames[8][64];        /* the first ones' names */
static uint32_t gfirst[8], gmark[8]; /* each one's part: its first u32, the u32 at byte 20 */
static int reports_ok, reports_bad; /* REPORT frames that decode, and that do not */
static uint8_t *fbuf;
static nrs_plan_t P1, P2, P3;

static void sendf(const uint8_t *b, int n)
{
    for (int o = 0; n > 0 && o < n;) {
        ssize_t k = write(cfd, b + o, (size_t)(n - o));
        if (k <= 0)
            return;
        o += (int)k;
    }
}

static int readn(uint8_t *b, size_t n)
{
    for (size_t o = 0; o < n;) {
        ssize_t k = read(cfd, b + o, n - o);
        if (k <= 0)
            return -1;
        o += (size_t)k;
    }
    return 0;
}

static int recvf(nrs_hdr_t *h)
{
    if (readn(fbuf, NRS_PROTO_HDR) || nrs_proto_hdr_decode(fbuf, h))
        return -1;
    return readn(fbuf + NRS_PROTO_HDR, h->length);
}

static void send_epoch(uint16_t type, unsigned e)
{
    nrs_msg_epoch_t m;
    uint8_t b[2048];
    memset(&m, 0, sizeof m);
    m.epoch = e;
    snprintf(m.text, sizeof m.text, "fake controller");
    sendf(b, nrs_enc_epoch(b, sizeof b, type, &m));
}

static void send_plan(const nrs_plan_t *p, unsigned flags, unsigned prev)
{
    nrs_msg_plan_t *m = calloc(1, sizeof *m);
    uint8_t *b = malloc(NRS_PROTO_HDR + NRS_PROTO_MAX_PAYLOAD);
    m->flags = flags;
    m->prev_epoch = prev;
    m->plan = *p;
    sendf(b, nrs_enc_plan(b, NRS_PROTO_HDR + NRS_PROTO_MAX_PAYLOAD, m));
    free(m);
    free(b);
}

static void send_gathered(const nrs_msg_gather_t *g, int n, const int32_t *ranks,
                          const uint8_t *data)
{
    nrs_msg_gathered_t a;
    uint8_t *b = malloc(NRS_PROTO_HDR + NRS_PROTO_MAX_PAYLOAD);
    memset(&a, 0, sizeof a);
    a.key = g->key;
    snprintf(a.name, sizeof a.name, "%s", g->name);
    a.len = g->len;
    a.count = (uint32_t)n;
    sendf(b, nrs_enc_gathered(b, NRS_PROTO_HDR + NRS_PROTO_MAX_PAYLOAD, &a, ranks, data, 0));
    free(b);
}

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* Answers every GATHER with this rank's own entry (a world of one), COMMITs
 * what is prepared; in "planmid" a new PLAN comes before the first answer;
 * in "world" the answer holds four ranks. */
static void *controller(void *arg)
{
    const char *c = arg;
    nrs_hdr_t h;
    int ngather = 0;
    if (!strcmp(c, "planmid") || !strcmp(c, "abort") || !strcmp(c, "abortmid") ||
        !strcmp(c, "retune") || !strcmp(c, "suspend")) {
        send_plan(&P2, NRS_PLAN_TRANSITION, 1);
        send_epoch(NRS_MSG_PREPARE, 2);
        if (!strcmp(c, "abort"))
            send_epoch(NRS_MSG_ABORT, 2);
    }
    while (!recvf(&h)) {
        const uint8_t *p = fbuf + NRS_PROTO_HDR;
        if (h.type == NRS_MSG_GATHER) {
            nrs_msg_gather_t g;
            if (nrs_dec_gather(p, h.length, &g, NULL, 0))
                continue;
            int k0 = __atomic_fetch_add(&ngathers, 1, __ATOMIC_SEQ_CST);
            if (k0 < 8) {
                snprintf(gnames[k0], sizeof gnames[k0], "%s", g.name);
                memcpy(&gfirst[k0], g.data, g.len >= 4 ? 4 : 0);
                memcpy(&gmark[k0], (const uint8_t *)g.data + 20, g.len >= 24 ? 4 : 0);
            }
            if (!strcmp(c, "world") || !strcmp(c, "worldpeer")) {
                int32_t ranks[4] = {0, 1, 4, 5};
                uint8_t *d = calloc(4, g.len + 1);
                for (int k = 0; k < 4; k++)
                    memcpy(d + (size_t)k * g.len, g.data, g.len);
                if (!strcmp(c, "worldpeer")) { /* rank 1 says it has no memory for it */
                    if (g.len == 4 && mode == 0)
                        put32(d + 4, 0xFFFFFFFFu);
                    else if (g.len > 4 && mode == 1)
                        put32(d + g.len + 20, 3);
                } else if (g.len > 4) { /* world<gen>: rank 1 holds GPU 2 (or one out of range) */
                    put32(d + g.len + 4, mode == 1 ? 0xFFFFFFFFu : 2);
                    for (int k = 2; k < 4; k++) { /* ranks 4, 5: joiners */
                        put32(d + (size_t)k * g.len + 4, 0);
                        put32(d + (size_t)k * g.len + 20, 1);
                    }
                }
                send_gathered(&g, 4, ranks, d);
                free(d);
                continue;
            }
            if (++ngather == 1 && !strcmp(c, "planmid"))
                send_plan(&P3, NRS_PLAN_TRANSITION, 1); /* the controller re-plans meanwhile */
            if (ngather == 1 && !strcmp(c, "abortmid")) { /* a delta: abort, re-decide */
                send_epoch(NRS_MSG_ABORT, 2);
                send_plan(&P3, NRS_PLAN_TRANSITION, 1);
                send_epoch(NRS_MSG_PREPARE, 2);
            }
            int32_t r0 = 0;
            send_gathered(&g, 1, &r0, g.data);
        } else if (h.type == NRS_MSG_REPORT) {
            nrs_msg_report_t m;
            char why[128];
            if (nrs_dec_report(p, h.length, &m, why, sizeof why)) {
                printf("REPORT refused by the controller's decoder: %s\n", why);
                reports_bad++;
            } else {
                reports_ok++;
            }
        } else if (h.type == NRS_MSG_ACK) {
            nrs_msg_ack_t a;
            if (nrs_dec_ack(p, h.length, &a, NULL, 0) || a.phase != NRS_MSG_PREPARE ||
                a.status != 0 || !strcmp(c, "abort"))
                continue;
            if (!strcmp(c, "suspend")) { /* the job stopped while the worker waits */
                pid_t me = getpid(), resumer = mp_suspend_job(&me, 1, 3.0, "at the PONR");
                mp_nap_s(0.3); /* the worker looks first */
                if (resumer > 0)
                    waitpid(resumer, NULL, 0);
            }
            send_epoch(NRS_MSG_COMMIT, a.epoch);
        }
    }
    return NULL;
}

static nrs_worker_t *worker(const nrs_spec_t *spec)
{
    nrs_worker_t *w;
    int sv[2];
    if (nrs_worker_init_spec(&w, spec) || socketpair(AF_UNIX, SOCK_STREAM, 0, sv)) {
        fprintf(stderr, "mp_wkctl: init: %s\n", nrs_worker_last_error(w));
        exit(2);
    }
    w->ctl_fd = sv[0];
    cfd = sv[1];
    w->coll_ctl = 1;
    return w;
}

int main(int argc, char **argv)
{
    nrs_spec_t spec;
    nrs_plan_req_t req;
    char err[512];
    const char *c = argc > 2 ? argv[2] : "";
    if (argc < 3 || nrs_spec_load(argv[1], &spec, err, sizeof err)) {
        fprintf(stderr, "usage: mp_wkctl SPEC planmid|abort|abortmid|retune|world N|worldmem N|"
                "worldpeer N|suspend|reports%s%s\n", argc > 2 ? ": " : "",
                argc > 2 ? err : "");
        return 2;
    }
    mode = argc > 3 ? atoi(argv[3]) : 0;
    fbuf = malloc(NRS_PROTO_HDR + NRS_PROTO_MAX_PAYLOAD);
    nrs_plan_req_init(&req, &spec);
    req.gpus = !strncmp(c, "world", 5) ? 4 : 1;
    if (nrs_plan_best(&spec, &req, &P1, err, sizeof err))
        return fprintf(stderr, "plan: %s\n", err), 2;
    req.gpus = 2;
    if (nrs_plan_best(&spec, &req, &P2, err, sizeof err))
        return fprintf(stderr, "plan: %s\n", err), 2;
    P1.epoch = 1;
    P2.epoch = 2;
    P3 = P2; /* the same epoch again, as a retry would be */
    if (!strcmp(c, "retune")) { /* epoch 1's plan, every micro-batch doubled */
        P2 = P1;
        P2.epoch = 2;
        for (int ms = 0; ms < NRS_MS_COUNT; ms++)
            P2.layout[ms].mb *= P2.has[ms] ? 2 : 1;
    }
    bool world = !strncmp(c, "world", 5);
    if (!strcmp(c, "abortmid")) { /* the retry: another plan under the same number */
        req.gpus = 1;
        if (nrs_plan_best(&spec, &req, &P3, err, sizeof err))
            return fprintf(stderr, "plan: %s\n", err), 2;
        P3.epoch = 2;
    }
    if (!strcmp(c, "suspend")) /* a worker that gave up closes its end: say so, no SIGPIPE */
        signal(SIGPIPE, SIG_IGN);
    nrs_worker_t *w = worker(&spec);
    pthread_t t;
    int rc = 1, e;
    if (!strcmp(c, "reports")) {
        pthread_create(&t, NULL, controller, (void *)c);
        int bad = 0, k;
        /* before any plan (epoch 0); then a stage that took no measurable time */
        bad += (k = nrs_worker_report_step(w, 0, 16)) != NRS_OK;
        printf("report_step before a plan: %d\n", k);
        if (nrs_worker_set_plan(w, &P1))
            return fprintf(stderr, "set-up: %s\n", nrs_worker_last_error(w)), 2;
        bad += nrs_worker_report_stage(w, NRS_MS_ACTOR_TRAIN, 0.0) != NRS_OK;
        bad += nrs_worker_report_stage(w, NRS_MS_ACTOR_GENERATE, 0.25) != NRS_OK;
        bad += nrs_worker_report_step(w, 1, 0) != NRS_OK;
        /* figures no REPORT can carry: refused by the call, naming it */
        struct { int ms; double s; int step; double len; } r[] = {
            {NRS_MS_ACTOR_TRAIN, 1.0 / 0.0, -1, 0}, {NRS_MS_ACTOR_TRAIN, 2e6, -1, 0},
            {-1, 0, 2, 1.0 / 0.0}, {-1, 0, 2, 2e7}, {-1, 0, NRS_PROTO_MAX_STEP + 1, 1}};
        for (size_t i = 0; i < sizeof r / sizeof r[0]; i++) {
            k = r[i].ms >= 0 ? nrs_worker_report_stage(w, r[i].ms, r[i].s)
                             : nrs_worker_report_step(w, r[i].step, r[i].len);
            printf("%s -> %d: %s\n", r[i].ms >= 0 ? "report_stage" : "report_step", k,
                   nrs_worker_last_error(w));
            bad += k != NRS_ERR_INVAL || strncmp(nrs_worker_last_error(w), "nrs_worker_report_", 18);
        }
        bad += nrs_worker_report_stage(w, NRS_MS_ACTOR_TRAIN, 0.5) != NRS_OK;
        bad += nrs_worker_report_step(w, 2, 64) != NRS_OK;
        usleep(300000);
        shutdown(w->ctl_fd, SHUT_WR); /* the thread reads what was sent, then ends */
        pthread_join(t, NULL);
        printf("reports: %d call(s) not as expected; %d REPORT frame(s) decode, %d refused\n", bad,
               reports_ok, reports_bad);
        close(cfd);
        nrs_worker_finalize(w);
        free(fbuf);
        return bad || reports_bad || reports_ok < 2 ? 1 : 0;
    }
    if (world) {
        if (!strcmp(c, "worldmem")) /* this rank (0) has no memory for world 1 */
            setenv("NRS_WORKER_NOMEM", mode ? "0:world:1" : "0:wlen:1", 1);
        /* rank 0 of 4 at epoch 1; ranks 2 and 3 died before the join */
        w->n = 4;
        w->me = 0;
        w->my_gpu = 0;
        w->plan = P1;
        w->have_plan = 1;
        w->perm = realloc(w->perm, 5 * sizeof(int));
        for (int i = 0; i < 4; i++)
            w->perm[i] = i;
        unsigned char **a[3] = {&w->leaving, &w->gone, &w->dead};
        for (int k = 0; k < 3; k++) {
            *a[k] = realloc(*a[k], 5);
            memset(*a[k], 0, 5);
        }
        nrs_ucx_opts_t uo;
        nrs_ucx_opts_init(&uo);
        if (nrs_ucx_init(&w->u, 0, 4, &uo, err, sizeof err))
            return fprintf(stderr, "ucx: %s\n", err), 2;
        pthread_create(&t, NULL, controller, (void *)c);
        nrs_msg_world_t m;
        memset(&m, 0, sizeof m);
        m.gen = 1, m.size = 6, m.rank = 0, m.base = 4, m.count = 2, m.nout = 2;
        m.out[0] = 2, m.out[1] = 3;
        e = nrs_wk_world_switch(w, &m);
        int kept = w->n == 4;
        for (int i = 0; i < 4; i++)
            kept &= w->perm[i] == i;
        printf("world switch: %d: %s; the world of 4 %s\n", e,
               e ? nrs_worker_last_error(w) : "ok", kept ? "kept" : "changed");
        usleep(100000); /* the GATHERs sent without waiting for their answers reach it */
        int ng = __atomic_load_n(&ngathers, __ATOMIC_SEQ_CST);
        for (int k = 0; k < ng && k < 8; k++)
            printf("GATHER %s: first word %#x, word at byte 20 %u\n", gnames[k], gfirst[k],
                   gmark[k]);
        const char *msg = nrs_worker_last_error(w);
        if (!strcmp(c, "world"))
            rc = e == NRS_ERR_PLAN && kept ? 0 : 1;
        else if (!strcmp(c, "worldmem")) /* N=0: it says so in wlen1; N=1: in world1 */
            rc = e == NRS_ERR_NOMEM && kept && ng == mode + 1 &&
                         !strcmp(gnames[mode], mode ? "world1" : "wlen1") &&
                         (mode ? gmark[1] == 3 : gfirst[0] == 0xFFFFFFFFu)
                     ? 0 : 1;
        else /* worldpeer: rank 1's mark read, no rank switches; after wlen1 no world1 */
            rc = e == NRS_ERR_RDV && kept && ng == mode + 1 &&
                         strstr(msg, mode ? "rank 1 has no memory for it: no rank switches"
                                          : "rank 1 cannot switch")
                     ? 0 : 1;
    } else {
        /* a re-tune's state where the worker puts it (tests/fakegpu: on the GPU) */
        int mem = !strcmp(c, "retune") ? NRS_MEM_AUTO : NRS_MEM_HOST;
        if ((e = nrs_worker_set_plan(w, &P1)) || (e = nrs_worker_alloc_state(w, mem, 1)))
            return fprintf(stderr, "set-up: %s\n", nrs_worker_last_error(w)), 2;
        pthread_create(&t, NULL, controller, (void *)c);
        if (!strcmp(c, "planmid") || !strcmp(c, "suspend")) {
            /* the PLAN and the PREPARE may come in two reads: poll until one runs */
            for (int k = 0; k < 100 && (e = nrs_worker_control_poll(w, 0.1)) == 0; k++)
                ;
            long long v = 0, bad = 0;
            int ve = nrs_worker_verify_state(w, &v, &bad);
            printf("%s: control_poll %d (%s), epoch %d, %lld verified, %lld bad\n", c, e,
                   e < 0 ? nrs_worker_last_error(w) : "ok", nrs_worker_epoch(w), v, bad);
            rc = e >= 0 && nrs_worker_epoch(w) == 2 && !ve && v > 0 && !bad ? 0 : 1;
        } else if (!strcmp(c, "retune")) {
            long comms0 = 0, copies0 = 0, comms1 = 0, copies1 = 0;
            w->coll_ctl = mode == 0;
            int fake = fakegpu_counts_get(&comms0, &copies0);
            for (int k = 0; k < 100 && (e = nrs_worker_control_poll(w, 0.1)) == 0; k++)
                ;
            fake = fake || fakegpu_counts_get(&comms1, &copies1);
            long long v = 0, bad = 0;
            int ve = nrs_worker_verify_state(w, &v, &bad);
            int ng = __atomic_load_n(&ngathers, __ATOMIC_SEQ_CST);
            printf("retune %d: control_poll %d (%s), epoch %d, %d GATHER(s), %lld verified, %lld "
                   "bad, state on the %s\n", mode, e, nrs_worker_last_error(w),
                   nrs_worker_epoch(w), ng, v, bad,
                   nrs_worker_mem_kind(w) == NRS_MEM_CUDA ? "GPU" : "host");
            if (!fake)
                printf("retune: %ld communicator(s) made, %ld copies\n", comms1 - comms0,
                       copies1 - copies0);
            rc = e == 1 && nrs_worker_epoch(w) == 2 && ng == 0 && !ve && v > 0 && !bad &&
                         (fake || (comms1 == comms0 && copies1 == copies0))
                     ? 0 : 1;
        } else if (!strcmp(c, "abortmid")) {
            int first = -99;
            for (int k = 0; k < 200 && (e = nrs_worker_control_poll(w, 0.1)) != 1; k++)
                if (e != 0 && first == -99)
                    first = e; /* the aborted run's outcome */
            nrs_plan_t got;
            long long v = 0, bad = 0;
            int ve = nrs_worker_verify_state(w, &v, &bad);
            int pe = nrs_worker_plan(w, &got);
            printf("abortmid: first run %d, then %d (%s); epoch %d on %d GPU(s) (the retry's: "
                   "%d), %lld verified, %lld bad\n", first, e, nrs_worker_last_error(w),
                   nrs_worker_epoch(w), pe ? -1 : got.total_gpus, P3.total_gpus, v, bad);
            rc = first == NRS_ERR_ABORTED && e == 1 && !pe && got.total_gpus == P3.total_gpus &&
                         !ve && v > 0 && !bad
                     ? 0
                     : 1;
        } else { /* what nrs_worker_control_step drains at a step boundary */
            nrs_hdr_t h;
            usleep(300000);
            w->defer = 1;
            while (w->ctl_fd >= 0 && nrs_wk_ctl_recv(w, 0.2, &h) > 0)
                nrs_wk_ctl_frame(w, &h);
            w->defer = 0;
            printf("abort: after the step's frames: PREPARE kept for epoch %u, plan pending %d\n",
                   w->prep_epoch, w->have_pend);
            rc = w->prep_epoch == 0 && !w->have_pend ? 0 : 1;
        }
    }
    shutdown(cfd, SHUT_RDWR);
    pthread_join(t, NULL);
    close(cfd);
    nrs_worker_finalize(w);
    free(fbuf);
    return rc;
}
