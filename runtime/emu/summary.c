/* `nereus transition`: what a transition costs, and optionally an in-process
 * run of it on the scaled-down model with every shard verified. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "emu/exec.h"
#include "emu/graph.h"

static const char *const link_names[NRS_LINK_COUNT] = {"local", "intra-node", "inter-node",
                                                       "host"};

/* "12.34 GiB", "512 B", written to o (32 bytes; HUMAN gives each call its own,
 * living to the end of the enclosing block). */
#define HUMAN(b) human((b), (char[32]){0})
static const char *human(int64_t b, char *o)
{
    static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)b;
    int u = 0;
    while (v >= 1024 && u < 4) {
        v /= 1024;
        u++;
    }
    snprintf(o, 32, u ? "%.2f %s" : "%.0f %s", v, unit[u]);
    return o;
}

void nrs_emu_scale_spec(const nrs_spec_t *s, double scale, nrs_spec_t *out)
{
    int k = scale > 0 && scale < 1 ? (int)lround(1.0 / sqrt(scale)) : 1;
    *out = *s;
    for (int r = 0; r < NRS_ROLE_COUNT; r++) {
        nrs_model_t *m = &out->models[r];
        if (!m->present || m->heads < 1)
            continue;
        int hd = m->hidden / m->heads / k;
        m->hidden = m->heads * (hd > 0 ? hd : 1);
        m->ffn = m->ffn / k > 0 ? m->ffn / k : 1;
        m->vocab = m->vocab / k > 0 ? m->vocab / k : 1;
    }
}

static void print_peaks(FILE *out, const nrs_emu_graph_t *g)
{
    fprintf(out, "  peak memory per GPU (cap %s, %s of it for transfer buffers):\n", HUMAN(g->cap),
            HUMAN(g->reserve));
    if (g->nphys <= 64) {
        for (int i = 0; i < g->nphys; i++)
            fprintf(out, "    gpu %-4d %12s  %5.1f%%\n", i, HUMAN(g->peak[i]),
                    100.0 * (double)g->peak[i] / (double)g->cap);
        return;
    }
    int64_t lo = g->peak[0], hi = g->peak[0];
    int hg = 0;
    for (int i = 1; i < g->nphys; i++) {
        lo = g->peak[i] < lo ? g->peak[i] : lo;
        if (g->peak[i] > hi) {
            hi = g->peak[i];
            hg = i;
        }
    }
    fprintf(out, "    %d GPUs: min %s, max %s (%.1f%% of the cap, gpu %d)\n", g->nphys, HUMAN(lo),
            HUMAN(hi), 100.0 * (double)hi / (double)g->cap, hg);
}

static void print_graph(FILE *out, const nrs_emu_graph_t *g, unsigned e0, unsigned e1)
{
    nrs_emu_stats_t st;
    nrs_emu_graph_stats(g, &st);
    fprintf(out, "transition epoch %u -> %u on %d GPUs: %lld ops (%lld moves in %lld chunks of "
                 "%s, %lld communicators, %lld buffers staged to host)\n",
            e0, e1, g->nphys, (long long)st.nops, (long long)st.ntransfers,
            (long long)st.nchunks, HUMAN(g->chunk), (long long)st.ncomms, (long long)st.nstaged);
    fprintf(out, "  bytes moved:");
    for (int l = 0; l < NRS_LINK_COUNT; l++)
        fprintf(out, "%s %s %s", l ? "," : "", link_names[l], HUMAN(st.bytes[l]));
    fprintf(out, "\n");
    print_peaks(out, g);
    fprintf(out, "  makespan %.4g s, lower bound %.4g s (ratio %.3f)\n", st.makespan_s,
            st.lower_bound_s, st.lower_bound_s > 0 ? st.makespan_s / st.lower_bound_s : 1.0);
    if (st.ponr < st.nops)
        fprintf(out, "  point of no return: op %lld of %lld, at %.4g s (abort before it leaves "
                     "the old state intact)\n",
                (long long)st.ponr, (long long)st.nops, st.ponr_s);
    else
        fprintf(out, "  point of no return: none (no old state is destroyed)\n");
}

static int run_scaled(const nrs_spec_t *s, const nrs_plan_t *from, const nrs_plan_t *to,
                      const nrs_emu_opts_t *o, const nrs_emu_graph_t *full, FILE *out,
                      char *err, size_t errlen)
{
    nrs_spec_t ss;
    nrs_emu_opts_t so = o ? *o : (nrs_emu_opts_t){0};
    nrs_emu_graph_t *g = NULL;
    nrs_xport_t x;
    nrs_emu_exec_result_t res;
    int64_t fb = 0, sb = 0;
    int rc;

    nrs_emu_scale_spec(s, s->runtime.emulation_scale, &ss);
    so.cap_bytes = INT64_MAX / 4; /* measure first, then scale the cap */
    so.chunk_bytes = 4096;
    if (nrs_emu_transition(&ss, from, to, &so, &g, err, errlen))
        goto fail;
    /* old and new state only: host copies the full graph staged are not state */
    for (int32_t i = 0; i < full->nold + full->nnew; i++)
        fb += full->buf[i].b.bytes;
    for (int32_t i = 0; i < g->nold + g->nnew; i++)
        sb += g->buf[i].b.bytes;
    nrs_emu_graph_free(g);
    g = NULL;
    if (fb <= 0) { /* the cap and chunk scale by sb / fb: no ratio, and nothing to run */
        fprintf(out, "  scaled run: neither plan holds state, nothing to execute\n");
        return 0;
    }
    so.chunk_bytes = (int64_t)((double)full->chunk * (double)sb / (double)fb) / 16 * 16;
    so.chunk_bytes = so.chunk_bytes < 256 ? 256 : so.chunk_bytes;
    so.cap_bytes = (int64_t)((double)(full->cap - full->reserve) * (double)sb / (double)fb) +
                   2 * so.chunk_bytes;
    if (nrs_emu_transition(&ss, from, to, &so, &g, err, errlen)) {
        fprintf(out, "  scaled run: %s; cap relaxed\n", err);
        so.cap_bytes = INT64_MAX / 4;
        if (nrs_emu_transition(&ss, from, to, &so, &g, err, errlen))
            goto fail;
    }
    if (nrs_xport_local_open(&x)) {
        snprintf(err, errlen, "cannot open the local transport");
        goto fail;
    }
    rc = nrs_emu_execute(g, &x, NULL, &res);
    nrs_xport_close(&x);
    fprintf(out, "  executed in-process at emulation scale %g (%s of state, %lld ops)\n",
            s->runtime.emulation_scale, HUMAN(sb), (long long)g->nops);
    fprintf(out, "verified %lld shards, %lld mismatches\n", (long long)res.verified,
            (long long)res.mismatches);
    if (rc) {
        snprintf(err, errlen, "verification failed: %s", res.first_error);
        goto fail;
    }
    nrs_emu_graph_free(g);
    return 0;
fail:
    nrs_emu_graph_free(g);
    return -1;
}

int nrs_transition_summary_opts(const nrs_spec_t *s, const nrs_plan_t *from,
                                const nrs_plan_t *to, const nrs_emu_opts_t *o, FILE *out,
                                bool execute, char *err, size_t errlen)
{
    nrs_emu_graph_t *g = NULL;
    int rc = nrs_emu_transition(s, from, to, o, &g, err, errlen);

    if (rc == NRS_EMU_ELOST) {
        fprintf(out, "transition epoch %u -> %u: state lost, a checkpoint is needed\n",
                from->epoch, to->epoch);
        nrs_emu_graph_print_lost_summary(g, out);
        nrs_emu_graph_free(g);
        return -1;
    }
    if (rc)
        return -1;
    print_graph(out, g, from->epoch, to->epoch);
    rc = execute ? run_scaled(s, from, to, o, g, out, err, errlen) : 0;
    nrs_emu_graph_free(g);
    return rc;
}

int nrs_transition_summary(const nrs_spec_t *s, const nrs_plan_t *from, const nrs_plan_t *to,
                           FILE *out, bool execute, char *err, size_t errlen)
{
    return nrs_transition_summary_opts(s, from, to, NULL, out, execute, err, errlen);
}
