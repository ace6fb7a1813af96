/* bench/sim: wall time to simulate a trace per policy, and that wall time
 * per step as a share of the simulated step. The wall time is the policy's
 * decisions (planning, admission) and the simulator's own bookkeeping
 * together: an upper bound on what the policy costs per step.
 * Usage: bench_sim SPEC TRACE */
#include <stdio.h>
#include <time.h>

#include "util/util.h"
#include "sim/sim.h"

int main(int argc, char **argv)
{
    nrs_spec_t s;
    nrs_trace_t t;
    char err[NRS_ERR_MAX];
    if (argc != 3) {
        fprintf(stderr, "usage: bench_sim SPEC TRACE\n");
        return 2;
    }
    if (nrs_spec_load(argv[1], &s, err, sizeof(err)) != 0 ||
        nrs_trace_load(argv[2], &s, &t, err, sizeof(err)) != 0) {
        fprintf(stderr, "bench_sim: %s\n", err);
        return 1;
    }
    printf("%-14s %10s %14s %16s %18s\n", "policy", "wall s", "wall ms/step", "simulated s/step",
           "wall share");
    for (int p = 0; p < NRS_SIM_POLICY_COUNT; p++) {
        nrs_sim_summary_t m;
        double t0 = nrs_now_s();
        if (nrs_sim_run(&s, &t, (nrs_sim_policy_t)p, NULL, NULL, &m, err, sizeof(err)) != 0) {
            fprintf(stderr, "bench_sim: %s\n", err);
            nrs_trace_free(&t);
            return 1;
        }
        double wall = nrs_now_s() - t0, per = m.steps ? wall / m.steps : 0;
        printf("%-14s %10.2f %14.3f %16.3f %17.4f%%\n", nrs_sim_policy_name((nrs_sim_policy_t)p),
               wall, per * 1e3, m.mean_step_s, m.mean_step_s > 0 ? 100 * per / m.mean_step_s : 0);
    }
    nrs_trace_free(&t);
    return 0;
}
