/* Pool configurations: every grouping of the placement units into pools (set
 * partitions) times every split of the GPUs into pools of those groups.
 *
 * Pool sizes: on one node (total <= gpus_per_node) a pool is a power-of-two
 * subset of the node, or the whole of it; across nodes, whole nodes. With more
 * than NRS_PLAN_SLICES nodes, all pools but the last are multiples of
 * q = ceil(nodes / NRS_PLAN_SLICES) nodes and the last takes the rest, which
 * keeps the space (and the search) bounded at any scale. */
#include "plan/plan_int.h"

typedef struct {
    const nrs_planner_t *pl;
    int total, gpn;
    nrs_config_fn fn;
    void *arg;
    nrs_config_t cfg;
    int group_of[U_COUNT]; /* by position in pl->units */
} walk_t;

static int is_pow2(int x)
{
    return x > 0 && (x & (x - 1)) == 0;
}

/* Emits all sizes for pools k..npools-1 given `left` GPUs. */
static int sizes(walk_t *w, int k, int left)
{
    int n = w->cfg.npools;
    if (k == n - 1) {
        if (left <= 0)
            return 0;
        if (w->total <= w->gpn && n > 1 && !is_pow2(left))
            return 0;
        w->cfg.gpus[k] = left;
        return w->fn(&w->cfg, w->arg);
    }
    int step, first;
    if (w->total <= w->gpn) {
        for (int g = 1; g < left; g *= 2) {
            w->cfg.gpus[k] = g;
            int rc = sizes(w, k + 1, left - g);
            if (rc)
                return rc;
        }
        return 0;
    }
    int nodes = w->total / w->gpn;
    step = nodes <= NRS_PLAN_SLICES ? 1 : (nodes + NRS_PLAN_SLICES - 1) / NRS_PLAN_SLICES;
    first = step;
    for (int nd = first; nd * w->gpn < left; nd += step) {
        w->cfg.gpus[k] = nd * w->gpn;
        int rc = sizes(w, k + 1, left - nd * w->gpn);
        if (rc)
            return rc;
    }
    return 0;
}

/* Restricted growth strings over the present units. */
static int partitions(walk_t *w, int pos, int ngroups)
{
    const nrs_planner_t *pl = w->pl;
    if (pos == pl->nunits) {
        w->cfg.npools = ngroups;
        for (int i = 0; i < pl->nunits; i++)
            w->cfg.pool_of_unit[pl->units[i]] = w->group_of[i];
        return sizes(w, 0, w->total);
    }
    for (int g = 0; g <= ngroups && g < NRS_POOL_MAX; g++) {
        w->group_of[pos] = g;
        int rc = partitions(w, pos + 1, g == ngroups ? ngroups + 1 : ngroups);
        if (rc)
            return rc;
    }
    return 0;
}

int nrs_configs_foreach(const nrs_planner_t *pl, int total_gpus, nrs_config_fn fn, void *arg)
{
    walk_t w = {.pl = pl, .total = total_gpus, .gpn = pl->gpn, .fn = fn, .arg = arg};
    for (int u = 0; u < U_COUNT; u++)
        w.cfg.pool_of_unit[u] = -1;
    return partitions(&w, 0, 0);
}

void nrs_config_to_plan(const nrs_planner_t *pl, const nrs_config_t *cfg, nrs_plan_t *p)
{
    int first = 0;
    p->npools = cfg->npools;
    p->total_gpus = 0;
    for (int i = 0; i < cfg->npools; i++) {
        p->pools[i] = (nrs_pool_t){first, cfg->gpus[i]};
        first += cfg->gpus[i];
    }
    p->total_gpus = first;
    for (int ms = 0; ms < NRS_MS_COUNT; ms++) {
        p->has[ms] = false;
        p->pool_of[ms] = -1;
    }
    for (int u = 0; u < U_COUNT; u++) {
        if (!pl->present[u])
            continue;
        for (int i = 0; i < nrs_unit_nstages((nrs_unit_t)u); i++) {
            nrs_ms_t ms = nrs_unit_ms((nrs_unit_t)u, i);
            p->has[ms] = true;
            p->pool_of[ms] = cfg->pool_of_unit[u];
        }
    }
}
