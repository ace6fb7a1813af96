/* The census past the point of no return (runtime/worker/census.h): a rank's
 * part stays small at any plan size (the old bit-per-graph-buffer part did
 * not fit the gather from ~128 GPUs on), parts decode to exactly what the
 * live owners hold, and the linear-time classification gives the same
 * counts, map and first lost buffers as the quadratic reference it
 * replaced. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ctl/proto.h"
#include "emu/graph.h"
#include "emu/testutil.h"
#include "worker/census.h"

static int gpu_owner(const void *arg, int32_t id) /* rank = physical GPU, as dtrans */
{
    const nrs_emu_graph_t *g = arg;
    int gpu = g->buf[id].b.gpu >= 0 ? g->buf[id].b.gpu : g->buf[id].via;
    return gpu;
}

static nrs_emu_graph_t *llama8b_graph(int gpus, nrs_layout_t a, nrs_layout_t b)
{
    nrs_model_t m;
    nrs_spec_t s;
    nrs_plan_t pa, pb;
    nrs_emu_graph_t *g = NULL;
    char err[512];
    tu_model(&m, 32, 4096, 14336, 32, 8, 128256);
    tu_spec_fixed(&s, &m, 8);
    s.cluster.gpu_mem_gib = 1e6; /* the census, not memory, is tested */
    tu_plan_single(&s, gpus, &a, &pa);
    tu_plan_single(&s, gpus, &b, &pb);
    int rc = nrs_emu_transition(&s, &pa, &pb, NULL, &g, err, sizeof err);
    if (rc)
        fail_msg("transition: %s", err);
    return g;
}

/* 512 GPUs of Llama-3-8B: a bit per owned buffer is a few bytes per rank,
 * under a 64th of a bit per buffer of the whole graph. */
static void test_parts_fit_the_gather(void **st)
{
    (void)st;
    nrs_emu_graph_t *g = llama8b_graph(512, (nrs_layout_t){8, 1, 64, 1},
                                       (nrs_layout_t){4, 2, 64, 1});
    nrs_census_t c;
    assert_int_equal(nrs_census_init(&c, g, 512, gpu_owner, g), 0);
    printf("census: %zu buffers, a part of %zu bytes (the whole graph's bits: %zu)\n", g->nbuf,
           c.len, (g->nbuf + 7) / 8);
    assert_true(c.len * 8 * 64 < g->nbuf); /* far below a bit per buffer of the graph */
    assert_true(c.len <= 64 && c.len <= NRS_GATHER_DATA_MAX);
    size_t owned = 0;
    for (int r = 0; r < 512; r++) {
        assert_true((size_t)(c.off[r + 1] - c.off[r]) <= c.len * 8);
        for (int32_t p = c.off[r]; p < c.off[r + 1]; p++) {
            assert_int_equal(gpu_owner(g, c.ids[p]), r);
            if (p > c.off[r])
                assert_true(c.ids[p] > c.ids[p - 1]); /* id order: the same on every rank */
        }
        owned += (size_t)(c.off[r + 1] - c.off[r]);
    }
    assert_int_equal(owned, g->nbuf); /* every buffer has an owner here */
    nrs_census_free(&c);
    nrs_emu_graph_free(g);
}

/* Random holdings, some ranks dead: what the parts of the live ranks decode
 * to is exactly what their owners hold; a dead rank's part counts for nothing. */
static void test_pack_unpack(void **st)
{
    (void)st;
    tu_rng_t r = {0xce2505ULL};
    nrs_emu_graph_t *g = llama8b_graph(64, (nrs_layout_t){4, 2, 8, 1},
                                       (nrs_layout_t){8, 1, 8, 1});
    nrs_census_t c;
    assert_int_equal(nrs_census_init(&c, g, 64, gpu_owner, g), 0);
    unsigned char *held = calloc(g->nbuf + 1, 1), *all = calloc(g->nbuf + 1, 1);
    unsigned char *part = calloc(c.len + 1, 1), dead[64] = {0};
    for (int round = 0; round < 5; round++) {
        for (size_t i = 0; i < g->nbuf; i++)
            held[i] = tu_int(&r, 0, 2) != 0;
        for (int k = 0; k < 64; k++)
            dead[k] = tu_int(&r, 0, 7) == 0;
        memset(all, 0, g->nbuf);
        for (int k = 0; k < 64; k++) {
            nrs_census_pack(&c, k, held, part);
            if (!dead[k])
                nrs_census_unpack(&c, k, part, all);
        }
        for (size_t i = 0; i < g->nbuf; i++)
            assert_int_equal(all[i], held[i] && !dead[gpu_owner(g, (int32_t)i)]);
    }
    free(held);
    free(all);
    free(part);
    nrs_census_free(&c);
    nrs_emu_graph_free(g);
}

/* ---- the quadratic classification the census used before, as the reference ---- */

static int same_box(const nrs_emu_buf_t *a, const nrs_emu_buf_t *b)
{
    return a->role == b->role && a->tensor == b->tensor && a->kind == b->kind &&
           !memcmp(&a->box, &b->box, sizeof a->box);
}

static void reference(const nrs_emu_graph_t *g, const unsigned char *all, unsigned char *present,
                      nrs_census_count_t *out)
{
    int nfirst = 0;
    memset(out, 0, sizeof(*out));
    out->first_lost[0] = out->first_lost[1] = out->first_lost[2] = -1;
    for (int32_t j = g->nold; j < g->nold + g->nnew; j++) {
        const nrs_emu_buf_t *b = &g->buf[j].b;
        present[j - g->nold] = all[nrs_emu_canon(g, j)];
        if (all[nrs_emu_canon(g, j)]) {
            out->present++;
            continue;
        }
        int rebuild = b->kind == NRS_EMU_GRAD;
        for (int32_t k = g->nold; !rebuild && k < g->nold + g->nnew; k++)
            rebuild = k != j && all[nrs_emu_canon(g, k)] && same_box(&g->buf[k].b, b);
        if (!rebuild && g->buf[j].alias < 0) {
            int any = 0, srcs = 1;
            for (size_t m = 0; m < g->nmoves; m++)
                if (g->moves[m].dst == j) {
                    any = 1;
                    srcs &= all[g->moves[m].src];
                }
            rebuild = any && srcs;
        }
        if (rebuild) {
            out->rebuildable++;
        } else {
            if (nfirst < 3)
                out->first_lost[nfirst++] = j;
            out->lost++;
        }
    }
}

/* Random plan pairs and random holdings (dense and sparse): the same answer
 * as the reference, every field. */
static void test_classify_matches_reference(void **st)
{
    (void)st;
    tu_rng_t r = {0xc1a551fULL};
    int cases = 0, partial = 0;
    while (cases < 60) {
        nrs_spec_t s;
        nrs_plan_t a, b;
        nrs_emu_graph_t *g = NULL;
        char err[512];
        tu_spec(&s, &r);
        s.cluster.gpu_mem_gib = 1e6;
        int gpus = s.cluster.gpus_per_node * tu_int(&r, 1, 4);
        tu_plan(&s, &r, gpus, &a);
        tu_plan(&s, &r, gpus, &b);
        if (nrs_emu_transition(&s, &a, &b, NULL, &g, err, sizeof err)) {
            nrs_emu_graph_free(g);
            continue;
        }
        unsigned char *all = calloc(g->nbuf + 1, 1);
        unsigned char *p1 = calloc((size_t)g->nnew + 1, 1), *p2 = calloc((size_t)g->nnew + 1, 1);
        int keep = tu_int(&r, 1, 10); /* 1 in keep..10 of the buffers held */
        for (size_t i = 0; i < g->nbuf; i++)
            all[i] = tu_int(&r, 1, 10) <= keep;
        nrs_census_count_t want, got;
        reference(g, all, p1, &want);
        assert_int_equal(nrs_census_classify(g, all, p2, &got), 0);
        assert_int_equal(got.present, want.present);
        assert_int_equal(got.rebuildable, want.rebuildable);
        assert_int_equal(got.lost, want.lost);
        for (int k = 0; k < 3; k++)
            assert_int_equal(got.first_lost[k], want.first_lost[k]);
        assert_memory_equal(p1, p2, (size_t)g->nnew + 1);
        partial += want.lost > 0 && want.rebuildable > 0;
        free(all);
        free(p1);
        free(p2);
        nrs_emu_graph_free(g);
        cases++;
    }
    printf("census: %d random cases, %d with both rebuildable and lost buffers\n", cases,
           partial);
    assert_true(partial > 0); /* the cases exercise every branch */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parts_fit_the_gather),
        cmocka_unit_test(test_pack_unpack),
        cmocka_unit_test(test_classify_matches_reference),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
