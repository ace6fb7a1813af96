/* The controller's all-gather for the ranks (GATHER -> GATHERED, proto.h,
 * docs/protocol.md §GATHER): the collective of a transition's votes and of
 * the step agreement when the launcher's PMIx fences cannot be used (Slurm's
 * pmix plugin fails every fence of a step once nodes left it). A gather is
 * complete when each participant has contributed or is gone (its channel
 * closed), or at its deadline; every contributor still connected then gets
 * the same answer. The last completed gathers are remembered (who took part)
 * so that a contribution arriving after its gather was answered is refused,
 * never the start of a second gather with another answer. */
#include <stdio.h>
#include <limits.h>
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

/* A completed gather: its (key, name) and who contributed, one bit a rank (at
 * most 8 KiB), never the data. The last DONE_MAX are kept: gathers follow one
 * another at step boundaries, so a rank later than that is long gone. */
enum { DONE_MAX = 64 };

typedef struct {
    uint64_t key;
    char name[NRS_GATHER_NAME_MAX];
    int nranks;
    unsigned char *got; /* [(nranks + 7) / 8] */
} done_t;

struct nrs_gather_done {
    done_t d[DONE_MAX];
    int n, next; /* entries in use; the slot the next completion takes (the oldest) */
};

static done_t *find_done(const nrs_ctl_t *c, uint64_t key, const char *name)
{
    struct nrs_gather_done *r = c->gather_done;
    for (int i = 0; r && i < r->n; i++)
        if (r->d[i].key == key && !strcmp(r->d[i].name, name))
            return &r->d[i];
    return NULL;
}

/* Remember who contributed to g (best effort: without memory a late rank
 * would open a gather of its own, as if this one had been forgotten). A name
 * used again replaces its earlier entry. */
static void remember(nrs_ctl_t *c, const nrs_gather_t *g)
{
    if (!c->gather_done && !(c->gather_done = calloc(1, sizeof(*c->gather_done))))
        return;
    struct nrs_gather_done *r = c->gather_done;
    unsigned char *got = calloc(((size_t)g->nranks + 7) / 8, 1);
    if (!got)
        return;
    for (int k = 0; k < g->nranks; k++)
        if (g->state[k] == GS_GOT)
            got[k / 8] |= (unsigned char)(1u << (k % 8));
    done_t *d = find_done(c, g->key, g->name);
    if (!d) {
        d = &r->d[r->next];
        r->next = (r->next + 1) % DONE_MAX;
        if (r->n < DONE_MAX)
            r->n++;
    }
    free(d->got);
    d->key = g->key;
    snprintf(d->name, sizeof(d->name), "%s", g->name);
    d->nranks = g->nranks;
    d->got = got;
}

/* Rank r contributes to (key, name) after that gather completed without it:
 * the others have their answer, in which r is missing (dead to them). A rank
 * that did contribute starts the name over: a gather of that name again. */
static bool late(const nrs_ctl_t *c, const nrs_msg_gather_t *m, int r)
{
    const done_t *d = find_done(c, m->key, m->name);
    return d && !(r < d->nranks && (d->got[r / 8] >> (r % 8) & 1));
}

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
                    g->name, (unsigned long long)g->key, got, part,
                    c->now - g->t0);
    }
    /* the answer's frames, encoded once and queued by reference for every
     * recipient (an empty answer is one empty chunk) */
    uint32_t fit = nrs_gathered_fit(g->len);
    int nchunks = got ? (int)((got + fit - 1) / fit) : 1;
    size_t cap = (size_t)nchunks * (NRS_PROTO_HDR + NRS_PROTO_MAX_PAYLOAD);
    nrs_shared_t *frames = ranks ? nrs_shared_new(cap) : NULL;
    uint8_t *d = malloc((size_t)fit * g->len + 1);
    bool bad = !frames || !d;
    for (int ch = 0, off = 0; !bad && ch < nchunks; ch++) {
        nrs_msg_gathered_t m = {.key = g->key, .len = g->len};
        snprintf(m.name, sizeof(m.name), "%s", g->name);
        m.count = (uint32_t)(got - off) < fit ? (uint32_t)(got - off) : fit;
        for (uint32_t j = 0; j < m.count; j++)
            memcpy(d + (size_t)j * g->len, g->data + (size_t)ranks[off + (int)j] * g->len, g->len);
        int n = nrs_enc_gathered(frames->data + frames->len, cap - frames->len, &m, ranks + off,
                                 d, ch + 1 < nchunks ? NRS_FLAG_MORE : 0);
        bad = n < 0;
        frames->len += n > 0 ? (size_t)n : 0;
        off += (int)m.count;
    }
    if (frames && frames->len > INT_MAX)
        bad = true;
    if (!bad && frames->len < cap) { /* each chunk took ~half its slot: give the rest back */
        nrs_shared_t *f = realloc(frames, sizeof(*frames) + frames->len + 1);
        if (f) { /* still only ours */
            frames = f;
            frames->cap = frames->len;
        }
    }
    for (int i = 0; i < c->nconns; i++) {
        nrs_conn_t *k = c->conns[i];
        if (k->role != NRS_ROLE_WORKER || k->state != NRS_CONN_READY || k->rank < 0 ||
            k->rank >= g->nranks || g->state[k->rank] != GS_GOT)
            continue;
        /* an answer that cannot be made drops the ranks waiting for it */
        nrs_ctl_send_shared(c, k, frames, 0, bad ? -1 : (int)frames->len);
    }
    free(ranks);
    nrs_shared_unref(frames);
    free(d);
    unsigned gen = 0;
    bool world = (g->key & ~0xffffffffULL) == NRS_WORLD_KEY && sscanf(g->name, "world%u", &gen) == 1;
    /* who took part: the ranks made their world of exactly these */
    unsigned char *in = world ? calloc((size_t)g->nranks + 1, 1) : NULL;
    for (int r = 0; in && r < g->nranks; r++)
        in[r] = g->state[r] == GS_GOT;
    int n = g->nranks;
    remember(c, g);
    gather_free(g);
    c->gather[at] = c->gather[--c->ngather];
    if (world)
        nrs_ctl_world_ready(c, gen, in, in ? n : 0);
    free(in);
}

static int find(const nrs_ctl_t *c, uint64_t key, const char *name)
{
    for (int i = 0; i < c->ngather; i++)
        if (c->gather[i]->key == key && !strcmp(c->gather[i]->name, name))
            return i;
    return -1;
}

/* Open gathers rank r contributed to, still unanswered. */
static int open_of(const nrs_ctl_t *c, int r)
{
    int n = 0;
    for (int i = 0; i < c->ngather; i++)
        n += r < c->gather[i]->nranks && c->gather[i]->state[r] == GS_GOT;
    return n;
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

/* s with control bytes as \xNN, for an ERROR's text (the name is a peer's;
 * the log escapes its lines itself, nrs_log_line). */
static const char *printable(const char *s, char *buf, size_t n)
{
    size_t o = 0;
    for (; *s && o + 5 < n; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch < 0x20 || ch == 0x7f)
            o += (size_t)snprintf(buf + o, n - o, "\\x%02x", ch);
        else
            buf[o++] = (char)ch;
    }
    buf[o] = 0;
    return buf;
}

/* A late contribution to a barrier (no data: finalize's): nothing of the
 * others' answer can differ from its own, so it is answered at once, with
 * itself alone, instead of refused. A rank that ends its steps a while after
 * the others (a joiner that waited in line counted its own) then finalizes
 * cleanly; the others went on at their time-out without it. */
static void answer_late_barrier(nrs_ctl_t *c, nrs_conn_t *k, const nrs_msg_gather_t *m)
{
    uint8_t buf[NRS_PROTO_HDR + 64 + NRS_GATHER_NAME_MAX];
    int32_t me = k->rank;
    nrs_msg_gathered_t a = {.key = m->key, .len = 0, .count = 1};
    snprintf(a.name, sizeof(a.name), "%s", m->name);
    uint8_t none = 0;
    int len = nrs_enc_gathered(buf, sizeof(buf), &a, &me, &none, 0);
    nrs_ctl_log(c, "gather %s/%llu: rank %d came after it completed: answered alone (a barrier)",
                m->name, (unsigned long long)m->key, me);
    nrs_ctl_send(c, k, buf, len);
}

void nrs_ctl_on_gather(nrs_ctl_t *c, nrs_conn_t *k, const uint8_t *p, size_t n)
{
    nrs_msg_gather_t *m = malloc(sizeof(*m));
    char why[128], nm[4 * NRS_GATHER_NAME_MAX + 8], text[sizeof(nm) + 96];
    const char *no = NULL;
    if (!m)
        return nrs_ctl_refuse(c, k, NRS_PERR_INTERNAL, "out of memory");
    if (nrs_dec_gather(p, n, m, why, sizeof(why)) != 0) {
        free(m);
        return nrs_ctl_refuse(c, k, NRS_PERR_MALFORMED, why);
    }
    int r = k->rank, at = find(c, m->key, m->name);
    nrs_gather_t *g = at >= 0 ? c->gather[at] : NULL;
    if (r < 0 || r >= m->nranks) {
        no = "GATHER: this rank is not one of the gather's ranks";
    } else if (m->nranks > c->world) { /* ranks that do not exist would hold it to its time-out */
        snprintf(text, sizeof(text), "GATHER: %d ranks, the world has %d", m->nranks, c->world);
        no = text;
    } else if (open_of(c, r) >= NRS_CTL_GATHER_PER_RANK) {
        no = "GATHER: this rank has too many gathers open";
    } else if (late(c, m, r) && m->len == 0) {
        answer_late_barrier(c, k, m);
        free(m);
        return;
    } else if (late(c, m, r)) { /* refused: an answer of its own would differ from theirs */
        snprintf(text, sizeof(text), "GATHER: gather %s/%llu already completed without this rank",
                 printable(m->name, nm, sizeof(nm)), (unsigned long long)m->key);
        no = text;
    } else if (g && (g->nranks != m->nranks || g->len != m->len || !same_out(g, m))) {
        no = "GATHER: the ranks disagree on its participants or size";
    } else if (g && g->state[r] == GS_GOT) {
        no = "GATHER: contributed twice";
    } else if (g ? g->state[r] == GS_OUT : false) {
        no = "GATHER: this rank is left out of it";
    }
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
        nrs_ctl_log(c, "gather %s/%llu: %d rank(s) did not contribute within %.1f s",
                    g->name, (unsigned long long)g->key, g->waiting,
                    g->deadline - g->t0);
        complete(c, i);
    }
}

void nrs_ctl_gather_free(nrs_ctl_t *c)
{
    for (int i = 0; i < c->ngather; i++)
        gather_free(c->gather[i]);
    c->ngather = 0;
    for (int i = 0; c->gather_done && i < c->gather_done->n; i++)
        free(c->gather_done->d[i].got);
    free(c->gather_done);
    c->gather_done = NULL;
}
