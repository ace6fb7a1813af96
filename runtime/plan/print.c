/* Printing plans: a table for people, JSON for programs. */
#include <stdio.h>

#include "plan/plan_int.h"

#define GIB (1024.0 * 1024.0 * 1024.0)

static const char *const phase_names[3] = {"generate", "infer", "train"};

void nrs_plan_print(FILE *out, const nrs_spec_t *s, const nrs_plan_t *p)
{
    int gpn = s->cluster.gpus_per_node;
    fprintf(out, "pools:\n");
    for (int i = 0; i < p->npools; i++) {
        const nrs_pool_t *pl = &p->pools[i];
        fprintf(out, "  %d: GPUs %d-%d (%d GPUs", i, pl->first_gpu, pl->first_gpu + pl->gpus - 1,
                pl->gpus);
        if (pl->gpus >= gpn)
            fprintf(out, ", nodes %d-%d", pl->first_gpu / gpn, (pl->first_gpu + pl->gpus) / gpn - 1);
        fprintf(out, ")\n");
    }
    fprintf(out, "\n%-16s %4s %4s %4s %5s %5s %11s %19s\n", "model-stage", "pool", "tp", "pp", "dp",
            "mb", "time (s)", "memory/GPU (GiB)");
    for (int ms = 0; ms < NRS_MS_COUNT; ms++) {
        if (!p->has[ms])
            continue;
        const nrs_layout_t *l = &p->layout[ms];
        fprintf(out, "%-16s %4d %4d %4d %5d %5d %11.3f %8.1f / %-8.1f\n", nrs_ms_name((nrs_ms_t)ms),
                p->pool_of[ms], l->tp, l->pp, l->dp, l->mb, p->ms_time[ms], p->ms_mem[ms] / GIB,
                p->capacity_bytes / GIB);
    }
    fprintf(out, "\nweight sync (actor.train -> actor.generate): %.3f s\n", p->sync_s);
    fprintf(out, "predicted step time: %.3f s (generate %.3f + infer %.3f + train %.3f + sync %.3f)\n",
            p->step_s, p->phase_time[0], p->phase_time[1], p->phase_time[2], p->sync_s);
}

void nrs_plan_print_json(FILE *out, const nrs_spec_t *s, const nrs_plan_t *p)
{
    (void)s;
    fprintf(out, "{\"epoch\":%u,\"total_gpus\":%d,\"capacity_gib\":%.6g,\"pools\":[", p->epoch,
            p->total_gpus, p->capacity_bytes / GIB);
    for (int i = 0; i < p->npools; i++)
        fprintf(out, "%s{\"first_gpu\":%d,\"gpus\":%d}", i ? "," : "", p->pools[i].first_gpu,
                p->pools[i].gpus);
    fprintf(out, "],\"stages\":[");
    for (int ms = 0, n = 0; ms < NRS_MS_COUNT; ms++) {
        if (!p->has[ms])
            continue;
        const nrs_layout_t *l = &p->layout[ms];
        fprintf(out,
                "%s{\"name\":\"%s\",\"pool\":%d,\"tp\":%d,\"pp\":%d,\"dp\":%d,\"mb\":%d,"
                "\"time_s\":%.9g,\"mem_gib\":%.6g}",
                n++ ? "," : "", nrs_ms_name((nrs_ms_t)ms), p->pool_of[ms], l->tp, l->pp, l->dp,
                l->mb, p->ms_time[ms], p->ms_mem[ms] / GIB);
    }
    fprintf(out, "],\"phases\":{");
    for (int ph = 0; ph < 3; ph++)
        fprintf(out, "%s\"%s\":%.9g", ph ? "," : "", phase_names[ph], p->phase_time[ph]);
    fprintf(out, "},\"sync_s\":%.9g,\"step_s\":%.9g}\n", p->sync_s, p->step_s);
}
