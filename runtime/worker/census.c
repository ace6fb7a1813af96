/* The census past the point of no return: compact parts, and the
 * classification of the new state (census.h). Linear or n log n in the
 * graph's size: it runs on every survivor of a 1,024-GPU job. */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "worker/census.h"

int nrs_census_init(nrs_census_t *c, const nrs_emu_graph_t *g, int nranks,
                    int (*owner)(const void *arg, int32_t id), const void *arg)
{
    int32_t *rank = malloc(sizeof(int32_t) * (g->nbuf + 1));
    int32_t *cur = malloc(sizeof(int32_t) * ((size_t)nranks + 1));
    size_t most = 0;
    memset(c, 0, sizeof(*c));
    c->nranks = nranks;
    c->off = calloc((size_t)nranks + 1, sizeof(int32_t));
    c->ids = malloc(sizeof(int32_t) * (g->nbuf + 1));
    if (!rank || !cur || !c->off || !c->ids)
        goto fail;
    for (size_t i = 0; i < g->nbuf; i++) { /* counting sort by owner: id order kept */
        int r = owner(arg, (int32_t)i);
        rank[i] = r >= 0 && r < nranks ? r : -1;
        if (rank[i] >= 0)
            c->off[rank[i] + 1]++;
    }
    for (int r = 0; r < nranks; r++) {
        most = (size_t)c->off[r + 1] > most ? (size_t)c->off[r + 1] : most;
        c->off[r + 1] += c->off[r];
    }
    memcpy(cur, c->off, sizeof(int32_t) * (size_t)nranks);
    for (size_t i = 0; i < g->nbuf; i++)
        if (rank[i] >= 0)
            c->ids[cur[rank[i]]++] = (int32_t)i;
    c->len = (most + 7) / 8;
    free(rank);
    free(cur);
    return 0;
fail:
    free(rank);
    free(cur);
    nrs_census_free(c);
    return -1;
}

void nrs_census_free(nrs_census_t *c)
{
    free(c->off);
    free(c->ids);
    memset(c, 0, sizeof(*c));
}

void nrs_census_pack(const nrs_census_t *c, int rank, const unsigned char *held,
                     unsigned char *part)
{
    memset(part, 0, c->len);
    for (int32_t p = 0; p < c->off[rank + 1] - c->off[rank]; p++)
        if (held[c->ids[c->off[rank] + p]])
            part[p / 8] |= (unsigned char)(1u << (p % 8));
}

void nrs_census_unpack(const nrs_census_t *c, int rank, const unsigned char *part,
                       unsigned char *all)
{
    for (int32_t p = 0; p < c->off[rank + 1] - c->off[rank]; p++)
        if ((part[p / 8] >> (p % 8)) & 1)
            all[c->ids[c->off[rank] + p]] = 1;
}

/* ---- classification ------------------------------------------------------------ */

typedef struct {
    int32_t role, tensor, kind, r0, r1, c0, c1, id;
} bkey_t;

static int bkey_cmp(const void *x, const void *y) /* what a box is, then id */
{
    const bkey_t *a = x, *b = y;
    const int32_t *ka = &a->role, *kb = &b->role;
    for (int i = 0; i < 8; i++)
        if (ka[i] != kb[i])
            return ka[i] < kb[i] ? -1 : 1;
    return 0;
}

struct nrs_census_work {
    bkey_t *k;                        /* [nnew] */
    unsigned char *held_box, *recv, *srcs; /* [nnew] */
};

nrs_census_work_t *nrs_census_work_new(const nrs_emu_graph_t *g)
{
    size_t n = (size_t)g->nnew;
    nrs_census_work_t *wk = calloc(1, sizeof(*wk));
    if (!wk)
        return NULL;
    wk->k = malloc(sizeof(*wk->k) * (n + 1));
    wk->held_box = malloc(n + 1);
    wk->recv = malloc(n + 1);
    wk->srcs = malloc(n + 1);
    if (!wk->k || !wk->held_box || !wk->recv || !wk->srcs) {
        nrs_census_work_free(wk);
        return NULL;
    }
    return wk;
}

void nrs_census_work_free(nrs_census_work_t *wk)
{
    if (!wk)
        return;
    free(wk->k);
    free(wk->held_box);
    free(wk->recv);
    free(wk->srcs);
    free(wk);
}

/* held_box[j - nold]: some new buffer with j's box (any GPU) is held. */
static void held_boxes(const nrs_emu_graph_t *g, const unsigned char *all, bkey_t *k,
                       unsigned char *held_box)
{
    size_t n = (size_t)g->nnew;
    for (size_t j = 0; j < n; j++) {
        const nrs_emu_buf_t *b = &g->buf[g->nold + (int32_t)j].b;
        k[j] = (bkey_t){b->role, b->tensor, b->kind, b->box.r0, b->box.r1, b->box.c0, b->box.c1,
                        g->nold + (int32_t)j};
    }
    qsort(k, n, sizeof(*k), bkey_cmp);
    for (size_t i = 0; i < n;) {
        size_t e = i;
        int any = 0;
        while (e < n && !memcmp(&k[e], &k[i], offsetof(bkey_t, id))) {
            any |= all[nrs_emu_canon(g, k[e].id)];
            e++;
        }
        for (size_t m = i; m < e; m++)
            held_box[k[m].id - g->nold] = (unsigned char)any;
        i = e;
    }
}

int nrs_census_classify(const nrs_emu_graph_t *g, const unsigned char *all,
                        unsigned char *present_out, nrs_census_count_t *out)
{
    nrs_census_work_t *wk = nrs_census_work_new(g);
    memset(out, 0, sizeof(*out));
    out->first_lost[0] = out->first_lost[1] = out->first_lost[2] = -1;
    if (!wk)
        return -1;
    nrs_census_classify_in(wk, g, all, present_out, out);
    nrs_census_work_free(wk);
    return 0;
}

void nrs_census_classify_in(nrs_census_work_t *wk, const nrs_emu_graph_t *g,
                            const unsigned char *all, unsigned char *present_out,
                            nrs_census_count_t *out)
{
    size_t n = (size_t)g->nnew;
    unsigned char *held_box = wk->held_box, *recv = wk->recv, *srcs = wk->srcs;
    int nfirst = 0;
    memset(out, 0, sizeof(*out));
    out->first_lost[0] = out->first_lost[1] = out->first_lost[2] = -1;
    memset(held_box, 0, n + 1);
    memset(recv, 0, n + 1);
    held_boxes(g, all, wk->k, held_box);
    memset(srcs, 1, n + 1);
    for (size_t m = 0; m < g->nmoves; m++) { /* regions each new buffer receives */
        int32_t d = g->moves[m].dst - g->nold;
        if (d < 0 || (size_t)d >= n)
            continue;
        recv[d] = 1;
        srcs[d] &= all[g->moves[m].src] ? 1 : 0;
    }
    for (size_t j = 0; j < n; j++) {
        int32_t id = g->nold + (int32_t)j;
        const nrs_emu_gbuf_t *b = &g->buf[id];
        int present = all[nrs_emu_canon(g, id)] != 0;
        if (present_out)
            present_out[j] = (unsigned char)present;
        if (present) {
            out->present++;
            continue;
        }
        /* not held itself, so a held one with its box is another buffer */
        int rebuild = b->b.kind == NRS_EMU_GRAD || held_box[j] ||
                      (b->alias < 0 && recv[j] && srcs[j]);
        if (rebuild) {
            out->rebuildable++;
        } else {
            if (nfirst < 3)
                out->first_lost[nfirst++] = id;
            out->lost++;
        }
    }
}
