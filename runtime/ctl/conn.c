/* Connection buffers and framing. The input buffer grows only up to one whole
 * frame (header + NRS_PROTO_MAX_PAYLOAD) and only once a valid header asks for
 * it, so thousands of idle peers cost a few KiB each. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "ctl/conn.h"

enum { IN_INITIAL = 4096 };

/* A piece of shared output: bytes [off, end) of s, to be written once
 * `at` private bytes have been (out_sent == at). */
struct nrs_conn_ref {
    nrs_shared_t *s;
    size_t off, end;
    unsigned long long at;
};

nrs_shared_t *nrs_shared_new(size_t cap)
{
    nrs_shared_t *s = malloc(sizeof(*s) + (cap ? cap : 1));
    if (s)
        *s = (nrs_shared_t){.refs = 1, .cap = cap};
    return s;
}

void nrs_shared_unref(nrs_shared_t *s)
{
    if (s && --s->refs == 0)
        free(s);
}

nrs_conn_t *nrs_conn_new(int fd, double now)
{
    nrs_conn_t *c = calloc(1, sizeof(*c));
    if (!c)
        return NULL;
    c->in = malloc(IN_INITIAL);
    if (!c->in) {
        free(c);
        return NULL;
    }
    c->in_cap = IN_INITIAL;
    c->fd = fd;
    c->t_open = now;
    c->rank = -1;
    c->gpu = -1;
    c->last_step = -1;
    c->slot = -1;
    c->tr_gpu = -1;
    return c;
}

void nrs_conn_free(nrs_conn_t *c)
{
    if (!c)
        return;
    free(c->in);
    nrs_conn_clear_out(c);
    free(c->out);
    free(c->refs);
    free(c);
}

/* Room the current frame may still use: up to its announced end once the
 * header is in (a bad header stops input), else up to a header. */
static bool over_limit(const nrs_conn_t *c, const nrs_hdr_t *h)
{
    return c->state == NRS_CONN_NEW && c->in_limit > 0 && h->length > c->in_limit;
}

static size_t in_want(const nrs_conn_t *c)
{
    if (c->in_len < NRS_PROTO_HDR)
        return IN_INITIAL;
    nrs_hdr_t h;
    if (nrs_proto_hdr_decode(c->in, &h) != 0 || over_limit(c, &h))
        return c->in_len;
    size_t end = NRS_PROTO_HDR + (size_t)h.length;
    return end > IN_INITIAL ? end : IN_INITIAL;
}

static int in_reserve(nrs_conn_t *c)
{
    size_t want = in_want(c);
    if (want > NRS_CONN_IN_MAX)
        want = NRS_CONN_IN_MAX;
    if (want <= c->in_cap)
        return 0;
    uint8_t *p = realloc(c->in, want);
    if (!p)
        return -1;
    c->in = p;
    c->in_cap = want;
    return 0;
}

static void note_partial(nrs_conn_t *c, size_t before, double now)
{
    if (before == 0 && c->in_len > 0)
        c->t_partial = now;
}

size_t nrs_conn_feed(nrs_conn_t *c, const uint8_t *data, size_t n, double now)
{
    size_t before = c->in_len, took = 0;
    while (took < n) {
        if (in_reserve(c) != 0)
            break;
        size_t room = c->in_cap - c->in_len;
        if (room == 0)
            break;
        size_t k = n - took < room ? n - took : room;
        memcpy(c->in + c->in_len, data + took, k);
        c->in_len += k;
        took += k;
        if (c->in_len >= NRS_PROTO_HDR && in_want(c) <= c->in_len)
            break; /* a whole frame (or a bad header): let the caller look */
    }
    note_partial(c, before, now);
    return took;
}

int nrs_conn_frame(nrs_conn_t *c, nrs_hdr_t *h, const uint8_t **payload)
{
    if (c->in_len < NRS_PROTO_HDR)
        return 0;
    int rc = nrs_proto_hdr_decode(c->in, h);
    if (rc != 0)
        return rc;
    if (over_limit(c, h))
        return -NRS_PERR_LENGTH;
    if (c->in_len < NRS_PROTO_HDR + (size_t)h->length)
        return 0;
    *payload = c->in + NRS_PROTO_HDR;
    return 1;
}

void nrs_conn_consume(nrs_conn_t *c, const nrs_hdr_t *h, double now)
{
    size_t k = NRS_PROTO_HDR + (size_t)h->length;
    memmove(c->in, c->in + k, c->in_len - k);
    c->in_len -= k;
    if (c->in_len > 0)
        c->t_partial = now;
    /* Give back a large buffer once the big frame is gone. */
    if (c->in_cap > IN_INITIAL && c->in_len <= IN_INITIAL) {
        uint8_t *p = realloc(c->in, IN_INITIAL);
        if (p) {
            c->in = p;
            c->in_cap = IN_INITIAL;
        }
    }
}

/* Whether an encoded frame says more of its message follows. */
static bool frame_more(const uint8_t *frame, size_t n)
{
    nrs_hdr_t h;
    return n >= NRS_PROTO_HDR && nrs_proto_hdr_decode(frame, &h) == 0 && (h.flags & NRS_FLAG_MORE);
}

int nrs_conn_queue(nrs_conn_t *c, const uint8_t *frame, size_t n)
{
    /* A message's first frame must find the backlog under the bound; the
     * rest of it is let through (up to NRS_CONN_MSG_MAX more): a status
     * reply larger than the bound reaches a peer that reads it, and one
     * that does not is dropped at its next message. */
    size_t max = c->out_more ? (size_t)NRS_CONN_OUT_MAX + NRS_CONN_MSG_MAX : NRS_CONN_OUT_MAX;
    if (c->out_off > 0 && c->out_off == c->out_len)
        c->out_off = c->out_len = 0;
    if (c->out_len - c->out_off + n > max)
        return -1;
    if (c->out_len + n > c->out_cap) {
        if (c->out_off > 0) { /* compact first */
            memmove(c->out, c->out + c->out_off, c->out_len - c->out_off);
            c->out_len -= c->out_off;
            c->out_off = 0;
        }
        size_t cap = c->out_cap ? c->out_cap : 4096;
        while (cap < c->out_len + n)
            cap *= 2;
        if (cap != c->out_cap) {
            uint8_t *p = realloc(c->out, cap);
            if (!p)
                return -1;
            c->out = p;
            c->out_cap = cap;
        }
    }
    memcpy(c->out + c->out_len, frame, n);
    c->out_len += n;
    c->out_put += n;
    c->out_more = frame_more(frame, n);
    return 0;
}

int nrs_conn_queue_shared(nrs_conn_t *c, nrs_shared_t *s, size_t off, size_t n)
{
    if (off > s->len || n > s->len - off || c->nrefs >= NRS_CONN_REFS_MAX ||
        c->out_shared + n > NRS_CONN_SHARED_MAX)
        return -1;
    if (n == 0)
        return 0;
    if (c->nrefs == c->refs_cap) {
        int cap = c->refs_cap ? 2 * c->refs_cap : 4;
        struct nrs_conn_ref *r = realloc(c->refs, sizeof(*r) * (size_t)cap);
        if (!r)
            return -1;
        c->refs = r;
        c->refs_cap = cap;
    }
    s->refs++;
    c->refs[c->nrefs++] = (struct nrs_conn_ref){s, off, off + n, c->out_put};
    c->out_shared += n;
    return 0;
}

size_t nrs_conn_pending(const nrs_conn_t *c)
{
    return c->out_len - c->out_off + c->out_shared;
}

static void pop_ref(nrs_conn_t *c)
{
    c->out_shared -= c->refs[0].end - c->refs[0].off;
    nrs_shared_unref(c->refs[0].s);
    memmove(c->refs, c->refs + 1, sizeof(*c->refs) * (size_t)--c->nrefs);
}

/* The next run of queued bytes, in order: private bytes up to the next
 * shared piece, else that piece. NULL when nothing is queued. */
static const uint8_t *next_run(const nrs_conn_t *c, size_t *n)
{
    if (c->nrefs && c->refs[0].at == c->out_sent) {
        *n = c->refs[0].end - c->refs[0].off;
        return c->refs[0].s->data + c->refs[0].off;
    }
    *n = c->out_len - c->out_off;
    if (c->nrefs && c->refs[0].at - c->out_sent < *n)
        *n = (size_t)(c->refs[0].at - c->out_sent);
    return *n ? c->out + c->out_off : NULL;
}

/* The first k bytes of the run next_run gave have been written. */
static void advance(nrs_conn_t *c, size_t k)
{
    if (c->nrefs && c->refs[0].at == c->out_sent) {
        c->refs[0].off += k;
        c->out_shared -= k;
        if (c->refs[0].off == c->refs[0].end)
            pop_ref(c);
        return;
    }
    c->out_off += k;
    c->out_sent += k;
}

size_t nrs_conn_take(nrs_conn_t *c, uint8_t *buf, size_t n)
{
    size_t took = 0, run;
    const uint8_t *p;
    while (took < n && (p = next_run(c, &run))) {
        size_t k = run < n - took ? run : n - took;
        memcpy(buf + took, p, k);
        advance(c, k);
        took += k;
    }
    return took;
}

void nrs_conn_clear_out(nrs_conn_t *c)
{
    while (c->nrefs)
        pop_ref(c);
    c->out_sent = c->out_put;
    c->out_off = c->out_len = 0;
}

ssize_t nrs_conn_read(nrs_conn_t *c, double now)
{
    if (in_reserve(c) != 0)
        return -1;
    size_t want = in_want(c);
    if (want > c->in_cap)
        want = c->in_cap;
    if (want <= c->in_len)
        return -2; /* a whole frame (or a bad header) waits to be looked at */
    size_t before = c->in_len;
    ssize_t k;
    do
        k = read(c->fd, c->in + c->in_len, want - c->in_len);
    while (k < 0 && errno == EINTR);
    if (k < 0)
        return errno == EAGAIN || errno == EWOULDBLOCK ? -2 : -1;
    c->in_len += (size_t)k;
    note_partial(c, before, now);
    return k;
}

int nrs_conn_flush(nrs_conn_t *c)
{
    size_t run;
    const uint8_t *p;
    while ((p = next_run(c, &run))) {
        ssize_t k = send(c->fd, p, run, MSG_NOSIGNAL);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            return errno == EAGAIN || errno == EWOULDBLOCK ? 1 : -1;
        }
        advance(c, (size_t)k);
    }
    c->out_off = c->out_len = 0;
    /* Give back a large buffer after a big status reply. */
    if (c->out_cap > 65536) {
        free(c->out);
        c->out = NULL;
        c->out_cap = 0;
    }
    return 0;
}

int nrs_conn_check_type(nrs_conn_state_t st, int role, int type)
{
    if (type == NRS_MSG_ERROR)
        return 0; /* a peer may always say why it gives up */
    if (st == NRS_CONN_NEW)
        return type == NRS_MSG_HELLO ? 0 : -NRS_PERR_UNEXPECTED;
    if (st != NRS_CONN_READY)
        return -NRS_PERR_UNEXPECTED;
    switch (role) {
    case NRS_ROLE_WORKER:
        return type == NRS_MSG_REPORT || type == NRS_MSG_ACK || type == NRS_MSG_GATHER
                   ? 0
                   : -NRS_PERR_UNEXPECTED;
    case NRS_ROLE_WATCHER:
    case NRS_ROLE_CLI:
        return type == NRS_MSG_DELTA || type == NRS_MSG_STATUS_REQ ? 0 : -NRS_PERR_UNEXPECTED;
    default:
        return -NRS_PERR_UNEXPECTED;
    }
}
