/* One control-channel connection: bounded input and output buffers, frame
 * extraction, and the per-connection protocol state machine (which message
 * types a peer may send in which state). No policy here; the controller
 * (ctl.c), the CLI and the test workers all use it. */
#ifndef NRS_CTL_CONN_H
#define NRS_CTL_CONN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "ctl/proto.h"

enum {
    NRS_CONN_IN_MAX = NRS_PROTO_HDR + NRS_PROTO_MAX_PAYLOAD, /* one whole frame */
    NRS_CONN_OUT_MAX = 8 << 20, /* a peer that lets more pile up is dropped */
    /* the frames of one message after its first (a status reply in chunks,
     * each but the last with MORE) may go this far beyond NRS_CONN_OUT_MAX:
     * the whole reply is queued before a byte of it can be sent, so the
     * bound on what a peer lets pile up cannot apply to it */
    NRS_CONN_MSG_MAX = 64 << 20,
    /* shared frames (one gather answer for every rank) a peer may hold
     * references to: bytes, and how many pieces */
    NRS_CONN_SHARED_MAX = 256 << 20,
    NRS_CONN_REFS_MAX = 64
};

/* Bytes queued once for many peers (a gather's answer): each peer's queue
 * holds a reference, not a copy. Single-threaded reference count. */
typedef struct nrs_shared {
    unsigned refs;
    size_t len, cap;
    uint8_t data[];
} nrs_shared_t;

/* A buffer of cap bytes, len 0, one reference (the caller's); NULL when out
 * of memory. */
nrs_shared_t *nrs_shared_new(size_t cap);
void nrs_shared_unref(nrs_shared_t *s);

struct nrs_conn_ref; /* conn.c */

typedef enum {
    NRS_CONN_NEW,     /* waiting for HELLO */
    NRS_CONN_READY,   /* HELLO accepted */
    NRS_CONN_CLOSING, /* flushing a last ERROR, then closed; input ignored */
    NRS_CONN_DEAD     /* to be closed by the owner */
} nrs_conn_state_t;

typedef struct nrs_conn {
    int fd;
    unsigned long serial; /* unique per controller, for logs */
    bool tcp;             /* remote peer: must present the job's token */
    uid_t uid;            /* unix peers: SO_PEERCRED uid */
    nrs_conn_state_t state;
    uint8_t *in;
    size_t in_len, in_cap;
    uint8_t *out; /* private output: bytes [out_off, out_len) */
    size_t out_off, out_len, out_cap;
    struct nrs_conn_ref *refs; /* shared output, in order, each after the
                                  private bytes queued before it */
    int nrefs, refs_cap;
    size_t out_shared;       /* shared bytes still to send */
    unsigned long long out_sent, out_put; /* private bytes ever sent, queued */
    bool out_more;           /* the last frame queued set MORE: its message goes on */
    double t_open, t_partial, t_closing; /* monotonic seconds */
    /* > 0: while NEW, a frame whose payload is longer is refused (LENGTH)
     * and its bytes are never buffered: the controller's peers before HELLO
     * (a HELLO is short), so an unauthenticated peer cannot pin a whole
     * frame's buffer. 0: no bound but the protocol's (clients). */
    size_t in_limit;
    /* Identity, after HELLO. */
    int role; /* nrs_peer_role_t, 0 before HELLO */
    int rank;
    char host[NRS_PROTO_STR_MAX];
    /* Controller bookkeeping (ctl.c). */
    int slot;        /* index in the controller's connection table */
    int gpu;         /* worker: GPU index in the committed plan */
    double t_report; /* last REPORT */
    long last_step;  /* -1: none yet */
    unsigned long nreports;
    unsigned long stale_n;     /* REPORTs of steps not above last_step, this run of them */
    uint32_t stale_lo, stale_hi; /* their steps */
    int tr_state;    /* transition participation (ctl.c) */
    int tr_gpu;      /* participant: its GPU in the announced plan, -1 none (ctl.c) */
    int joiner;      /* 1: a joining rank without a GPU yet; 2: its world is connected */
    double tr_seconds;
    bool dirty;      /* queued output not yet handed to the socket (loop.c) */
    bool pre_hello;  /* a TCP peer counted as not yet past HELLO (loop.c) */
    unsigned ev;     /* epoll events armed (loop.c) */
} nrs_conn_t;

nrs_conn_t *nrs_conn_new(int fd, double now);
void nrs_conn_free(nrs_conn_t *c);

/* Append received bytes (tests, fuzzing; nrs_conn_read for sockets): the
 * number taken, at most what fits the current frame's bound. */
size_t nrs_conn_feed(nrs_conn_t *c, const uint8_t *data, size_t n, double now);

/* The next complete frame: 1 with *h and *payload set (valid until
 * nrs_conn_consume), 0 when more bytes are needed, or -nrs_perr_t when the
 * header is bad (the connection must be dropped). */
int nrs_conn_frame(nrs_conn_t *c, nrs_hdr_t *h, const uint8_t **payload);
/* Drop the frame returned by nrs_conn_frame. */
void nrs_conn_consume(nrs_conn_t *c, const nrs_hdr_t *h, double now);

/* Queue an encoded frame: 0, or -1 when the output bound would be exceeded
 * (NRS_CONN_OUT_MAX pending; for a frame that continues a message, one after
 * a frame with MORE, NRS_CONN_OUT_MAX + NRS_CONN_MSG_MAX). */
int nrs_conn_queue(nrs_conn_t *c, const uint8_t *frame, size_t n);
/* Queue bytes [off, off + n) of s after what is queued (the connection
 * takes its own reference): 0, or -1 when the shared bounds would be
 * exceeded. */
int nrs_conn_queue_shared(nrs_conn_t *c, nrs_shared_t *s, size_t off, size_t n);
/* Bytes queued and not yet written, private and shared. */
size_t nrs_conn_pending(const nrs_conn_t *c);
/* Copy up to n queued bytes, in order, into buf and drop them from the
 * queue (tests, fuzzing): how many. */
size_t nrs_conn_take(nrs_conn_t *c, uint8_t *buf, size_t n);
/* Discard queued output (fuzzing, closing). */
void nrs_conn_clear_out(nrs_conn_t *c);

/* Socket I/O (non-blocking fds). read: bytes read, 0 at EOF, -1 error, -2
 * would block or no room. flush: 0 all written, 1 some left, -1 error. */
ssize_t nrs_conn_read(nrs_conn_t *c, double now);
int nrs_conn_flush(nrs_conn_t *c);

/* Whether a peer in this state and role may send this message type:
 * 0, or -NRS_PERR_UNEXPECTED. */
int nrs_conn_check_type(nrs_conn_state_t st, int role, int type);

#endif
