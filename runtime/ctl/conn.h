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
    NRS_CONN_OUT_MAX = 8 << 20 /* a peer that lets more pile up is dropped */
};

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
    uint8_t *out;
    size_t out_off, out_len, out_cap;
    double t_open, t_partial, t_closing; /* monotonic seconds */
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
    int joiner;      /* 1: a joining rank without a GPU yet; 2: its world is connected */
    double tr_seconds;
    bool dirty;      /* queued output not yet handed to the socket (loop.c) */
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

/* Queue an encoded frame: 0, or -1 when the output bound would be exceeded. */
int nrs_conn_queue(nrs_conn_t *c, const uint8_t *frame, size_t n);
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
