/* bench/plan: planning time against the number of GPUs, on one spec, in one
 * run (median of repeated runs, the mean of the middle two for an even
 * count; the machines are shared and noisy).
 * Usage: bench_plan SPEC [REPEATS]    (1..100, default 5) */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "util/util.h"
#include "nereus/plan.h"

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    static const int sizes[] = {64, 256, 1024, 4096, 16384};
    nrs_spec_t s;
    char err[NRS_ERR_MAX];
    char *end = NULL;
    long reps = argc > 2 ? strtol(argv[2], &end, 10) : 5;

    if (argc < 2 || argc > 3 || (end && (end == argv[2] || *end)) || reps < 1 || reps > 100) {
        fprintf(stderr, "usage: bench_plan SPEC [REPEATS 1..100]\n");
        return 2;
    }
    if (nrs_spec_load(argv[1], &s, err, sizeof(err)) != 0) {
        fprintf(stderr, "bench_plan: %s\n", err);
        return 1;
    }
    printf("%-8s %12s %12s %12s %10s %8s\n", "GPUs", "median ms", "min ms", "max ms", "step s", "pools");
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        double t[100];
        nrs_plan_t p;
        nrs_plan_req_t req;
        nrs_plan_req_init(&req, &s);
        req.gpus = sizes[i];
        for (int r = 0; r < reps; r++) {
            double t0 = nrs_now_s();
            if (nrs_plan_best(&s, &req, &p, err, sizeof(err)) != 0) {
                fprintf(stderr, "bench_plan: %d GPUs: %s\n", sizes[i], err);
                return 1;
            }
            t[r] = (nrs_now_s() - t0) * 1e3;
        }
        qsort(t, (size_t)reps, sizeof(double), cmp_d);
        double med = reps % 2 ? t[reps / 2] : (t[reps / 2 - 1] + t[reps / 2]) / 2;
        printf("%-8d %12.2f %12.2f %12.2f %10.3f %8d\n", sizes[i], med, t[0], t[reps - 1],
               p.step_s, p.npools);
    }
    return 0;
}
