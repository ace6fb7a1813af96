/* Nereus control protocol: versioned, length-bounded binary frames between the
 * controller and its peers (ranks, the allocation watcher, the CLI). Every
 * message has a pure encoder and a validating decoder; nothing is memcpy'd
 * from or to a struct. Wire format: docs/protocol.md. */
#ifndef NRS_CTL_PROTO_H
#define NRS_CTL_PROTO_H

#include <stddef.h>
#include <stdint.h>

#include "nereus/plan.h"

enum {
    NRS_PROTO_MAGIC = 0x4353524e, /* "NRSC" little-endian */
    NRS_PROTO_VERSION = 1,
    NRS_PROTO_HDR = 16,               /* magic u32, version u16, type u16, flags u32, length u32 */
    NRS_PROTO_MAX_PAYLOAD = 64 * 1024, /* hard bound of a frame's payload */
    NRS_PROTO_STR_MAX = 64,     /* job id, host names (with the NUL) */
    NRS_PROTO_TOKEN_MAX = 128,  /* auth token (with the NUL) */
    NRS_PROTO_TEXT_MAX = 1024,  /* error / reply text (with the NUL) */
    NRS_PROTO_MAX_RANKS = 65536,
    NRS_PROTO_MAX_GPUS = 65536,
    NRS_PROTO_MAX_LOST = 4096,   /* GPU indices in one PLAN or DELTA */
    NRS_PROTO_MAX_HOSTS = 256,   /* host names in one DELTA */
    NRS_PROTO_MAX_STEP = 100000000,
    /* the longest HELLO payload: role, job, rank, nranks, host, token (strings
     * as u16 length + bytes below their bound); before HELLO nothing longer
     * is read (conn.h in_limit) */
    NRS_PROTO_HELLO_MAX = 4 + 2 + (NRS_PROTO_STR_MAX - 1) + 4 + 4 + 2 + (NRS_PROTO_STR_MAX - 1) +
                          2 + (NRS_PROTO_TOKEN_MAX - 1)
};

/* What a REPORT carries (nrs_dec_report refuses a frame outside it, and the
 * controller drops its sender): response length, each stage's seconds. */
#define NRS_PROTO_REPORT_MAX_LEN 1e7
#define NRS_PROTO_REPORT_MIN_S 1e-9
#define NRS_PROTO_REPORT_MAX_S 1e6

typedef enum {
    NRS_MSG_HELLO = 1,
    NRS_MSG_PLAN = 2,
    NRS_MSG_REPORT = 3,
    NRS_MSG_DELTA = 4,
    NRS_MSG_DELTA_REPLY = 5,
    NRS_MSG_STATUS_REQ = 6,
    NRS_MSG_STATUS = 7,
    NRS_MSG_PREPARE = 8,
    NRS_MSG_ACK = 9,
    NRS_MSG_COMMIT = 10,
    NRS_MSG_ABORT = 11,
    NRS_MSG_ERROR = 12,
    NRS_MSG_GATHER = 13,
    NRS_MSG_GATHERED = 14,
    NRS_MSG_WORLD = 15,
    NRS_MSG_MAX = 15
} nrs_msg_type_t;

/* Header flags, per type; any other bit set is malformed. */
enum {
    NRS_FLAG_MORE = 1u /* STATUS, GATHERED: more chunks of the same reply follow */
};

/* Error codes of an ERROR message (and of the decoders, negated). */
typedef enum {
    NRS_PERR_OK = 0,
    NRS_PERR_MAGIC = 1,      /* not a Nereus frame */
    NRS_PERR_VERSION = 2,    /* unknown protocol version */
    NRS_PERR_LENGTH = 3,     /* payload longer than NRS_PROTO_MAX_PAYLOAD */
    NRS_PERR_TYPE = 4,       /* unknown message type */
    NRS_PERR_MALFORMED = 5,  /* a field out of range, truncated or trailing bytes */
    NRS_PERR_UNEXPECTED = 6, /* message not allowed in this state or role */
    NRS_PERR_AUTH = 7,       /* peer uid or token refused */
    NRS_PERR_STALE = 8,      /* epoch or generation older than the controller's */
    NRS_PERR_REFUSED = 9,    /* well-formed but refused (duplicate rank, bad delta) */
    NRS_PERR_TIMEOUT = 10,   /* peer too slow (half-open frame, no HELLO) */
    NRS_PERR_INTERNAL = 11,
    NRS_PERR_COUNT
} nrs_perr_t;

const char *nrs_perr_name(int code);
const char *nrs_msg_name(int type);

typedef struct {
    uint16_t version;
    uint16_t type;
    uint32_t flags;
    uint32_t length;
} nrs_hdr_t;

/* ---- messages ------------------------------------------------------------ */

/* A joiner is a rank of a later job step (an expansion's join step): its rank
 * and nranks are its step's; the controller gives it a place in the job's
 * world (WORLD) and, after the controller says so, it is a worker. */
typedef enum {
    NRS_ROLE_WORKER = 1,
    NRS_ROLE_WATCHER = 2,
    NRS_ROLE_CLI = 3,
    NRS_ROLE_JOINER = 4
} nrs_peer_role_t;

typedef struct {
    uint32_t role;                   /* nrs_peer_role_t */
    char job[NRS_PROTO_STR_MAX];
    int32_t rank, nranks;            /* worker: 0 <= rank < nranks; others: 0, 0 */
    char host[NRS_PROTO_STR_MAX];
    char token[NRS_PROTO_TOKEN_MAX]; /* per-job secret (TCP peers); may be empty */
} nrs_msg_hello_t;

/* PLAN flags */
enum {
    NRS_PLAN_TRANSITION = 1u, /* a PREPARE for this epoch follows */
    NRS_PLAN_FORCED = 2u      /* the previous plan became infeasible */
};

typedef struct {
    uint32_t flags;
    uint32_t prev_epoch;         /* epoch the transition starts from (0: none) */
    nrs_plan_t plan;             /* plan.epoch is the message's epoch */
    int32_t nlost;               /* GPUs of prev_epoch whose state is gone */
    int32_t lost[NRS_PROTO_MAX_LOST];
} nrs_msg_plan_t;

/* REPORT flags */
enum {
    NRS_REPORT_MEM_HIGH = 1u,   /* a stage ran near its memory cap */
    NRS_REPORT_MEM_FAILED = 2u  /* a stage failed to allocate */
};

typedef struct {
    uint32_t epoch, step, flags;
    double response_len;        /* mean response tokens measured; 0 = unknown */
    int nstages;
    uint8_t ms[NRS_MS_COUNT];   /* distinct nrs_ms_t */
    double seconds[NRS_MS_COUNT];
} nrs_msg_report_t;

typedef enum { NRS_DELTA_ADD = 1, NRS_DELTA_REMOVE = 2, NRS_DELTA_LOST = 3 } nrs_delta_kind_t;

typedef struct {
    uint64_t generation;        /* 0: the controller assigns the next one */
    uint32_t kind;              /* nrs_delta_kind_t */
    uint32_t add_nodes;         /* ADD: whole nodes added */
    int nhosts;                 /* REMOVE/LOST: hosts */
    char hosts[NRS_PROTO_MAX_HOSTS][NRS_PROTO_STR_MAX];
    int ngpus;                  /* REMOVE/LOST: GPU indices (current numbering) */
    int32_t gpus[NRS_PROTO_MAX_LOST];
} nrs_msg_delta_t;

typedef struct {
    uint64_t generation;
    uint32_t accepted;          /* 1: the delta was applied */
    uint32_t epoch;             /* committed epoch when replying */
    uint32_t new_epoch;         /* epoch announced for it, 0: none */
    char text[NRS_PROTO_TEXT_MAX];
} nrs_msg_delta_reply_t;

enum { NRS_STATUS_JSON = 1u };

typedef struct {
    uint32_t format;            /* 0 text, NRS_STATUS_JSON */
} nrs_msg_status_req_t;

/* PREPARE, COMMIT: just the epoch. ABORT: epoch and reason. */
typedef struct {
    uint32_t epoch;
    char text[NRS_PROTO_TEXT_MAX];
} nrs_msg_epoch_t;

typedef struct {
    uint32_t epoch;
    uint32_t phase;             /* NRS_MSG_PREPARE or NRS_MSG_COMMIT */
    int32_t status;             /* 0 ok; otherwise the rank could not do it */
    double seconds;             /* COMMIT: time the rank spent in the transition */
} nrs_msg_ack_t;

/* ACK(PREPARE) status of a rank that had ACKed 0 and then waited for COMMIT
 * or ABORT in vain: it has aborted the epoch on its side. */
#define NRS_ACK_GAVE_UP 4

typedef struct {
    uint32_t code;              /* nrs_perr_t */
    char text[NRS_PROTO_TEXT_MAX];
} nrs_msg_error_t;

/* GATHER (rank -> controller): this rank's part of an all-gather among the
 * ranks of the job but `out` (the collective of a transition's votes and of the
 * step agreement when the PMIx fences of the launcher cannot be used, e.g.
 * after Slurm took nodes away). The controller answers with GATHERED once
 * every participant has contributed or is gone (its channel closed), or
 * timeout_ms after the first contribution: the same answer to every one. */
enum {
    NRS_GATHER_NAME_MAX = 48,    /* with the NUL */
    NRS_GATHER_DATA_MAX = 32768, /* bytes per rank */
    NRS_GATHER_MAX_OUT = 4096,   /* ranks left out */
    NRS_GATHER_TIMEOUT_MAX = 3600000
};

typedef struct {
    uint64_t key;                /* the caller's epoch-like key */
    char name[NRS_GATHER_NAME_MAX];
    uint32_t timeout_ms;         /* 1 .. NRS_GATHER_TIMEOUT_MAX */
    int32_t nranks;              /* ranks of the job: 1 .. NRS_PROTO_MAX_RANKS */
    int32_t nout;
    int32_t out[NRS_GATHER_MAX_OUT]; /* distinct, < nranks */
    uint32_t len;                /* <= NRS_GATHER_DATA_MAX */
    const uint8_t *data;         /* decoder: points into the payload */
} nrs_msg_gather_t;

/* GATHERED (controller -> ranks): one chunk of the answer, NRS_FLAG_MORE when
 * more chunks follow; entries are (u32 rank, len bytes), ranks ascending over
 * the chunks. A rank not listed did not contribute (dead or gone). */
typedef struct {
    uint64_t key;
    char name[NRS_GATHER_NAME_MAX];
    uint32_t len;                /* bytes per rank */
    uint32_t count;              /* entries in this chunk */
    const uint8_t *entries;      /* decoder: count x (4 + len) bytes in the payload */
} nrs_msg_gathered_t;

/* WORLD (controller -> ranks): the job's world grows by `count` joining
 * ranks, world ranks base .. base + count - 1 (generation gen, size ranks in
 * all); `rank` is the recipient's world rank; `out` the ranks known gone,
 * every one (the controller refuses a join with more gone than out holds,
 * never cuts the list: it is the out list of the ranks' world gathers).
 * Every rank of the world then contributes to the gather "world<gen>" (key
 * NRS_WORLD_KEY | gen) its transport address: see docs/protocol.md §Joining. */
#define NRS_WORLD_KEY (5ULL << 32)
typedef struct {
    uint32_t gen;                /* >= 1 */
    int32_t size, rank, base, count;
    int32_t nout;
    int32_t out[NRS_GATHER_MAX_OUT];
} nrs_msg_world_t;

/* Entries of len bytes that fit one GATHERED frame (at least 1). */
uint32_t nrs_gathered_fit(uint32_t len);

/* ---- framing ------------------------------------------------------------- */

/* Decode a header from NRS_PROTO_HDR bytes: 0, or -nrs_perr_t (MAGIC, VERSION,
 * LENGTH, TYPE, MALFORMED for flags not allowed on the type). */
int nrs_proto_hdr_decode(const uint8_t *b, nrs_hdr_t *h);
void nrs_proto_hdr_encode(uint8_t *b, uint16_t type, uint32_t flags, uint32_t length);

/* Encoders write a whole frame (header + payload) into buf[cap]: the frame's
 * length, or -1 when it does not fit (never partially meaningful). */
int nrs_enc_hello(uint8_t *buf, size_t cap, const nrs_msg_hello_t *m);
int nrs_enc_plan(uint8_t *buf, size_t cap, const nrs_msg_plan_t *m);
int nrs_enc_report(uint8_t *buf, size_t cap, const nrs_msg_report_t *m);
int nrs_enc_delta(uint8_t *buf, size_t cap, const nrs_msg_delta_t *m);
int nrs_enc_delta_reply(uint8_t *buf, size_t cap, const nrs_msg_delta_reply_t *m);
int nrs_enc_status_req(uint8_t *buf, size_t cap, const nrs_msg_status_req_t *m);
/* One chunk of a STATUS reply: text[len], flags NRS_FLAG_MORE when more follow. */
int nrs_enc_status(uint8_t *buf, size_t cap, const char *text, size_t len, uint32_t flags);
/* PREPARE, COMMIT or ABORT (type), text used by ABORT only. */
int nrs_enc_epoch(uint8_t *buf, size_t cap, uint16_t type, const nrs_msg_epoch_t *m);
int nrs_enc_ack(uint8_t *buf, size_t cap, const nrs_msg_ack_t *m);
int nrs_enc_error(uint8_t *buf, size_t cap, const nrs_msg_error_t *m);
int nrs_enc_gather(uint8_t *buf, size_t cap, const nrs_msg_gather_t *m);
int nrs_enc_world(uint8_t *buf, size_t cap, const nrs_msg_world_t *m);
/* GATHERED chunk: m->count entries, rank ranks[i] with data + i * m->len. */
int nrs_enc_gathered(uint8_t *buf, size_t cap, const nrs_msg_gathered_t *m,
                     const int32_t *ranks, const uint8_t *data, uint32_t flags);

/* Decoders take the payload of a frame whose header was accepted: 0, or
 * -NRS_PERR_MALFORMED with why[] saying which field (why may be NULL). */
int nrs_dec_hello(const uint8_t *p, size_t n, nrs_msg_hello_t *m, char *why, size_t wl);
int nrs_dec_plan(const uint8_t *p, size_t n, nrs_msg_plan_t *m, char *why, size_t wl);
int nrs_dec_report(const uint8_t *p, size_t n, nrs_msg_report_t *m, char *why, size_t wl);
int nrs_dec_delta(const uint8_t *p, size_t n, nrs_msg_delta_t *m, char *why, size_t wl);
int nrs_dec_delta_reply(const uint8_t *p, size_t n, nrs_msg_delta_reply_t *m, char *why,
                        size_t wl);
int nrs_dec_status_req(const uint8_t *p, size_t n, nrs_msg_status_req_t *m, char *why, size_t wl);
/* STATUS: text without NUL bytes; *text points into p. */
int nrs_dec_status(const uint8_t *p, size_t n, const char **text, size_t *len, char *why,
                   size_t wl);
int nrs_dec_epoch(uint16_t type, const uint8_t *p, size_t n, nrs_msg_epoch_t *m, char *why,
                  size_t wl);
int nrs_dec_ack(const uint8_t *p, size_t n, nrs_msg_ack_t *m, char *why, size_t wl);
int nrs_dec_error(const uint8_t *p, size_t n, nrs_msg_error_t *m, char *why, size_t wl);
int nrs_dec_gather(const uint8_t *p, size_t n, nrs_msg_gather_t *m, char *why, size_t wl);
int nrs_dec_world(const uint8_t *p, size_t n, nrs_msg_world_t *m, char *why, size_t wl);
int nrs_dec_gathered(const uint8_t *p, size_t n, nrs_msg_gathered_t *m, char *why, size_t wl);
/* Entry i of a decoded GATHERED chunk. */
void nrs_gathered_entry(const nrs_msg_gathered_t *m, uint32_t i, int32_t *rank,
                        const uint8_t **data);

/* Semantic checks of a plan received on the wire (also run by nrs_dec_plan). */
int nrs_proto_check_plan(const nrs_plan_t *p, char *why, size_t wl);

#endif
