/* The controller's all-gather for the ranks (GATHER -> GATHERED, proto.h,
 * docs/protocol.md §GATHER): the collective of a transition's votes and of
 * the step agreement when the launcher's PMIx fences cannot be used (Slurm's
 * pmix plugin fails every fence of a step once nodes left it). A gather is
 * complete when each participant has contributed or is gone (its channel
 * closed), or at its deadline; every contributor still connected then gets
 * the same answer. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctl/ctl_int.h"

enum { GS_WAIT, GS_GOT, GS_GONE, GS_OUT };

struct nrs_gather {
    uint64_t key;
    char name[NRS_GATHER_NAME_MAX];
    int nranks;
    uint32_t len;
    double t0, deadline;
    unsigned char *state; /* [nranks] GS_* */
    uint8_t *data;        /* [nranks * len] */
    int waiting;
};

static void gather_free(nrs_gather_t *g)
{
    if (!g)
        return;
    free(g->state);
    free(g->data);
    free(g);
}

static size_t held_bytes(const nrs_ctl_t *c)
{
    size_t n = 0;
    for (int i = 0; i < c->ngather; i++)
        n += (size_t)c->gather[i]->nranks * c->gather[i]->len;
    return n;
}

/* Send the answer to every contributor still connected, and forget it. */
static void complete(nrs_ctl_t *c, int at)
{
    nrs_gather_t *g = c->gather[at];
    int32_t *ranks = malloc(sizeof(int32_t) * ((size_t)g->nranks + 1));
    int got = 0, part = 0;
    for (int r = 0; ranks && r < g->nranks; r++) {
        part += g->state[r] != GS_OUT;
        if (g->state[r] == GS_GOT)
            ranks[got++] = r;
    }
    c->gathers++;
    if (got < part) { /* the ranks learn who is missing: say it once here */
        c->gathers_short++;
        nrs_ctl_log(c, "gather %s/%llu: %d of %d participant(s) after %.3f s, the others gone",
                    g->name, (unsigned long long)g->key, got, part, c->now - g->t0);
    }
    /* the answer's frames, encoded once for every recipient (an empty answer is
     * one empty chunk) */
    uint32_t fit = nrs_gathered_fit(g->len);
    int nchunks = got ? (int)((got + fit - 1) / fit) : 1;
    size_t cap = (size_t)nchunks * (NRS_PROTO_HDR + NRS_PROTO_MAX_PAYLOAD), used = 0;
    uint8_t *frames = ranks ? malloc(cap) : NULL, *d = malloc((size_t)fit * g->len + 1);
    int *flen = malloc(sizeof(int) * (size_t)nchunks);
    for (int ch = 0, off = 0; frames && d && flen && ch < nchunks; ch++) {
        nrs_msg_gathered_t m = {.key = g->key, .len = g->len};
        snprintf(m.name, sizeof(m.name), "%s", g->name);
        m.count = (uint32_t)(got - off) < fit ? (uint32_t)(got - off) : fit;
        for (uint32_t j = 0; j < m.count; j++)
            memcpy(d + (size_t)j * g->len, g->data + (size_t)ranks[off + (int)j] * g->len, g->len);
        flen[ch] = nrs_enc_gathered(frames + used, cap - used, &m, ranks + off, d,
                                    ch + 1 < nchunks ? NRS_FLAG_MORE : 0);
        used += flen[ch] > 0 ? (size_t)flen[ch] : 0;
        off += (int)m.count;
    }
    for (int i = 0; frames && d && flen && i < c->nconns; i++) {
        nrs_conn_t *k = c->conns[i];
        if (k->role != NRS_ROLE_WORKER || k->state != NRS_CONN_READY || k->rank < 0 ||
            k->rank >= g->nranks || g->state[k->rank] != GS_GOT)
            continue;
        size_t pos = 0;
        for (int ch = 0; ch < nchunks && k->state == NRS_CONN_READY; ch++) {
            nrs_ctl_send(c, k, frames + pos, flen[ch]);
            pos += flen[ch] > 0 ? (size_t)flen[ch] : 0;
        }
    }
    free(ranks);
    free(frames);
    free(d);
    free(flen);
    unsigned gen = 0;
    bool world = (g->key & ~0xffffffffULL) == NRS_WORLD_KEY && sscanf(g->name, "world%u", &gen) == 1;
    gather_free(g);
    c->gather[at] = c->gather[--c->ngather];
    if (world)
        nrs_ctl_world_ready(c, gen);
}

static int find(const nrs_ctl_t *c, uint64_t key, const char *name)
{
    for (int i = 0; i < c->ngather; i++)
        if (c->gather[i]->key == key && !strcmp(c->gather[i]->name, name))
            return i;
    return -1;
}

static nrs_gather_t *open_gather(nrs_ctl_t *c, const nrs_msg_gather_t *m, const char **why)
{
    size_t bytes = (size_t)m->nranks * m->len;
    if (c->ngather >= NRS_CTL_GATHER_MAX) {
        *why = "too many gathers open";
        return NULL;
    }
    if (bytes > NRS_CTL_GATHER_BYTES || held_bytes(c) + bytes > NRS_CTL_GATHER_BYTES) {
        *why = "gathers too large for the controller";
        return NULL;
    }
    nrs_gather_t *g = calloc(1, sizeof(*g));
    if (!g || !(g->state = calloc((size_t)m->nranks, 1)) ||
        !(g->data = calloc(bytes ? bytes : 1, 1))) {
        gather_free(g);
        *why = "out of memory";
        return NULL;
    }
    g->key = m->key;
    snprintf(g->name, sizeof(g->name), "%s", m->name);
    g->nranks = m->nranks;
    g->len = m->len;
    g->t0 = c->now;
    g->deadline = c->now + m->timeout_ms / 1000.0;
    for (int i = 0; i < m->nout; i++)
        g->state[m->out[i]] = GS_OUT;
    for (int r = 0; r < g->nranks; r++)
        if (g->state[r] == GS_WAIT && c->rank_gone[r])
            g->state[r] = GS_GONE;
        else if (g->state[r] == GS_WAIT)
            g->waiting++;
    c->gather[c->ngather++] = g;
    return g;
}

static bool same_out(const nrs_gather_t *g, const nrs_msg_gather_t *m)
{
    int n = 0;
    for (int i = 0; i < m->nout; i++)
        if (g->state[m->out[i]] != GS_OUT)
            return false;
    for (int r = 0; r < g->nranks; r++)
        n += g->state[r] == GS_OUT;
    return n == m->nout;
}

void nrs_ctl_on_gather(nrs_ctl_t *c, nrs_conn_t *k, const uint8_t *p, size_t n)
{
    nrs_msg_gather_t *m = malloc(sizeof(*m));
    char why[128];
    const char *no = NULL;
    if (!m)
        return nrs_ctl_refuse(c, k, NRS_PERR_INTERNAL, "out of memory");
    if (nrs_dec_gather(p, n, m, why, sizeof(why)) != 0) {
        free(m);
        return nrs_ctl_refuse(c, k, NRS_PERR_MALFORMED, why);
    }
    int r = k->rank, at = find(c, m->key, m->name);
    nrs_gather_t *g = at >= 0 ? c->gather[at] : NULL;
    if (r < 0 || r >= m->nranks)
        no = "GATHER: this rank is not one of the gather's ranks";
    else if (g && (g->nranks != m->nranks || g->len != m->len || !same_out(g, m)))
        no = "GATHER: the ranks disagree on its participants or size";
    else if (g && g->state[r] == GS_GOT)
        no = "GATHER: contributed twice";
    else if (g ? g->state[r] == GS_OUT : false)
        no = "GATHER: this rank is left out of it";
    for (int i = 0; !no && !g && i < m->nout; i++)
        if (m->out[i] == r)
            no = "GATHER: this rank is left out of it";
    if (!no && !g)
        g = open_gather(c, m, &no); /* NULL: no says why */
    if (no || !g) {
        free(m);
        return nrs_ctl_refuse(c, k, NRS_PERR_REFUSED, no);
    }
    if (g->state[r] == GS_WAIT)
        g->waiting--;
    g->state[r] = GS_GOT; /* a rank thought gone that speaks is back */
    if (m->len)
        memcpy(g->data + (size_t)r * g->len, m->data, m->len);
    free(m);
    if (g->waiting == 0)
        complete(c, find(c, g->key, g->name));
}

void nrs_ctl_gather_gone(nrs_ctl_t *c, int rank)
{
    if (rank < 0 || rank >= NRS_PROTO_MAX_RANKS)
        return;
    c->rank_gone[rank] = 1;
    for (int i = c->ngather - 1; i >= 0; i--) {
        nrs_gather_t *g = c->gather[i];
        if (rank < g->nranks && g->state[rank] == GS_WAIT) {
            g->state[rank] = GS_GONE;
            if (--g->waiting == 0)
                complete(c, i);
        }
    }
}

void nrs_ctl_gather_tick(nrs_ctl_t *c)
{
    for (int i = c->ngather - 1; i >= 0; i--) {
        nrs_gather_t *g = c->gather[i];
        if (c->now <= g->deadline)
            continue;
        nrs_ctl_log(c, "gather %s/%llu: %d rank(s) did not contribute within %.1f s", g->name,
                    (unsigned long long)g->key, g->waiting, g->deadline - g->t0);
        complete(c, i);
    }
}

void nrs_ctl_gather_free(nrs_ctl_t *c)
{
    for (int i = 0; i < c->ngather; i++)
        gather_free(c->gather[i]);
    c->ngather = 0;
}
