/* bench_worker: what the worker API's per-epoch paths cost at scale, in one
 * process. A singleton rank holds every GPU's state (the local transport),
 * so one process walks the paths every rank of a large job walks: the plan's
 * state index, the weight sync's graph and its mapping onto the state, a
 * transition, the verification. A benchmark (never a timed test): it is how
 * quadratic paths show (the weight sync's state lookup was 1.7 s at 64 GPUs
 * and minutes at 1,024 before it was indexed).
 *
 *   bench_worker SPEC [--scale S] [GPUS...]
 *
 * For each GPU count (default 64 and 256): the best plan of SPEC at response
 * 1,024 tokens -> the best at 3,072 (as bench_graph scale), the model scaled
 * down by S (default 1e-4: the geometry, boxes and graphs are the real ones,
 * the bytes few; S in (0, 1]). Prints seconds per phase and the peak RSS.
 * Exit status 1 when a phase failed or a shard did not verify. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "nereus/emu.h"
#include "nereus/nereus.h"
#include "nereus/plan.h"
#include "nereus/spec.h"

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* One phase: its time, and 1 when it failed (the message printed). */
static int phase(nrs_worker_t *w, const char *what, int rc, double t0, double *acc)
{
    double t = now_s() - t0;
    *acc += t;
    printf(" %s %.3f", what, t);
    if (rc) {
        printf("\n  %s: %s (%d)\n", what, nrs_worker_last_error(w), rc);
        return 1;
    }
    return 0;
}

static int run(const nrs_spec_t *s, double scale, int gpus)
{
    nrs_plan_req_t req;
    nrs_plan_t a, b;
    nrs_spec_t small;
    nrs_worker_t *w = NULL;
    char err[512];
    double t, total = 0;
    long long verified = 0, bad = 0;
    int failed = 0;

    nrs_plan_req_init(&req, s);
    req.gpus = gpus;
    req.work.response_len = 1024;
    if (nrs_plan_best(s, &req, &a, err, sizeof err))
        return printf("%5d GPUs: plan: %s\n", gpus, err), 1;
    req.work.response_len = 3072;
    if (nrs_plan_best(s, &req, &b, err, sizeof err))
        return printf("%5d GPUs: plan: %s\n", gpus, err), 1;
    a.epoch = 1;
    b.epoch = 2;
    nrs_emu_scale_spec(s, scale, &small);
    if (nrs_worker_init_spec(&w, &small))
        return printf("%5d GPUs: init: %s\n", gpus, nrs_worker_last_error(NULL)), 1;
    printf("%5d GPUs: seconds:", gpus);
    t = now_s();
    failed = phase(w, "set_plan", nrs_worker_set_plan(w, &a), t, &total);
    t = now_s();
    failed = failed || phase(w, "alloc", nrs_worker_alloc_state(w, NRS_MEM_HOST, 1), t, &total);
    t = now_s();
    failed = failed || phase(w, "sync(build)", nrs_worker_weight_sync(w), t, &total);
    t = now_s();
    failed = failed || phase(w, "sync", nrs_worker_weight_sync(w), t, &total);
    t = now_s();
    failed = failed || phase(w, "transition", nrs_worker_transition(w, &b), t, &total);
    t = now_s();
    failed = failed || phase(w, "verify", nrs_worker_verify_state(w, &verified, &bad), t, &total);
    t = now_s();
    failed = failed || phase(w, "sync(new epoch)", nrs_worker_weight_sync(w), t, &total);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    printf("%s total %.3f; %d buffers, %lld shards verified, %lld mismatches; transition: %.0f "
           "bytes moved, %.0f hashed; peak RSS %ld MiB\n",
           failed ? " (failed)" : "", total, nrs_worker_nbuffers(w), verified, bad,
           nrs_worker_transition_stat(w, NRS_TS_BYTES_SENT),
           nrs_worker_transition_stat(w, NRS_TS_BYTES_VERIFIED), ru.ru_maxrss / 1024);
    nrs_worker_finalize(w);
    return failed || bad;
}

int main(int argc, char **argv)
{
    nrs_spec_t s;
    char err[512];
    double scale = 1e-4;
    int sizes[16], n = 0, rc = 0;

    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        fprintf(argc < 2 ? stderr : stdout, "usage: bench_worker SPEC [--scale S] [GPUS...]\n");
        return argc < 2 ? 2 : 0;
    }
    if (nrs_spec_load(argv[1], &s, err, sizeof err)) {
        fprintf(stderr, "%s: %s\n", argv[1], err);
        return 1;
    }
    for (int i = 2; i < argc; i++) {
        char *end;
        long v;
        if (!strcmp(argv[i], "--scale") && i + 1 < argc) {
            /* not 0 (no scaling: the full model's bytes in this process) */
            scale = strtod(argv[++i], &end);
            if (end == argv[i] || *end || !(scale > 0 && scale <= 1))
                return fprintf(stderr, "bench_worker: --scale %s: a number in (0, 1]\n",
                               argv[i]), 2;
        } else if (n < 16 && (v = strtol(argv[i], &end, 10)) > 0 && v <= 1 << 20 && !*end &&
                   argv[i][0] != '+')
            sizes[n++] = (int)v;
        else
            return fprintf(stderr, "bench_worker: bad argument %s\n", argv[i]), 2;
    }
    if (!n) {
        sizes[n++] = 64;
        sizes[n++] = 256;
    }
    for (int i = 0; i < n; i++)
        rc |= run(&s, scale, sizes[i]);
    return rc;
}
