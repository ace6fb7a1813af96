/* UCX transport (ucx.h, docs/protocol-dataplane.md §2). */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <ucp/api/ucp.h>
#include <ucs/debug/log_def.h>

#include "util/util.h"
#include "xfer/ucx.h"

#define TAG_CHUNK_BITS 16
#define TAG_USER_BITS 32
#define TAG_FULL_MASK UINT64_MAX

/* A chunk in flight is expected to end within its size at this rate (10 GbE,
 * the slowest link we aim at); until then a wait keeps polling (nrs_ucx_spin):
 * UCX reports nothing between the start and the end of a rendezvous, 3 ms for
 * 8 MiB over TCP here, and a nap in it delays the completion. */
#define SPIN_FLOOR_BYTES_PER_S 1e9

/* What a rank publishes: who it is, the CPUs it may run on (cpus_len bytes,
 * bit c of byte c / 8 for CPU c: do ranks of this host share CPUs?), then its
 * worker address. */
#define BLOB_MAGIC 0x4e525355u /* "NRSU" */
typedef struct {
    uint32_t magic, addr_len;
    int32_t pid, cpus_len;
    uint64_t start; /* process start time (clock ticks since boot): pid reuse */
    uint64_t pidns; /* its pid namespace (inode; 0 unknown): whose pids it speaks of */
    char host[64];
} blob_hdr_t;

typedef struct {
    ucp_ep_h ep;
    ucs_status_t failed; /* UCS_OK while healthy */
    bool closed;
    void *close_req;
    bool watch; /* same host, no UCX peer-failure support: we watch its pid */
    int pid;
    uint64_t start;
} peer_t;

typedef struct {
    nrs_ucx_op_t *op;
    void *req;
    int busy, done;
    int released; /* handed back to UCX still running (ucp_request_free): no
                   * callback will come; UCX may use the buffer until it ends */
    ucs_status_t status;
    size_t want;          /* chunk bytes expected */
    ucp_tag_recv_info_t info;
} slot_t;

typedef struct {
    void *p;
    size_t len;
} late_t;

struct nrs_ucx_op {
    nrs_ucx_op_t *next, *prev;
    nrs_ucx_t *u;
    int peer, is_send, state; /* 0 pending, 1 done, -1 failed */
    char *buf;
    size_t len, chunk, nchunks, next_chunk, done_chunks;
    uint64_t tag;
    int inflight;
    double deadline;
    slot_t slots[NRS_UCX_MAX_WINDOW];
    void (*on_done)(void *arg, int status);
    void *on_done_arg;
    void *owned; /* nrs_ucx_op_adopt: freed with the op, once UCX is done with it */
    char err[192];
};

struct nrs_ucx {
    int rank, size;
    nrs_ucx_opts_t o;
    ucp_context_h ctx;
    ucp_worker_h worker;
    ucp_address_t *addr;
    size_t addr_len;
    void *blob; /* blob_hdr_t + address */
    size_t blob_len;
    double next_watch, next_check;
    peer_t *peers;
    nrs_ucx_op_t *ops; /* posted, not yet harvested */
    int new_failures;
    nrs_ucx_probe_fn probe;
    void *probe_arg;
    nrs_ucx_op_t **orphans; /* freed ops whose requests UCX still holds: their
                             * callbacks write into the slots, their buffers
                             * stay in use; reaped when the requests end,
                             * released to UCX before endpoints and worker go */
    size_t norphans, orphcap;
    late_t *late; /* nrs_ucx_free: memory a request of an orphan still uses */
    size_t nlate, latecap;
    int cap;           /* peers allocated (>= size) */
    double last_event; /* nrs_ucx_spin */
    cpu_set_t cpus;     /* the CPUs this process may use */
    cpu_set_t shared;   /* theirs and those of the ranks of this host that share one */
    int nshare;         /* those ranks, this one included (connected so far) */
    uint64_t ops_posted, ops_since_idle;
    uint64_t completions; /* chunk requests ended (slot_finish) */
    double inflight_s;    /* what the largest chunk in flight may take (progress) */
};

void nrs_ucx_opts_init(nrs_ucx_opts_t *o)
{
    o->chunk_bytes = 8u << 20;
    o->window = 4;
    o->op_timeout_s = 30;
    o->keepalive_s = 1;
    o->spin_s = 1e-3;
}

/* ---- context ------------------------------------------------------------------------- */

static void ep_error_cb(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    peer_t *p = arg;
    (void)ep;
    if (p->failed == UCS_OK)
        p->failed = status == UCS_OK ? UCS_ERR_ENDPOINT_TIMEOUT : status;
}

static int config_set(ucp_config_t *cfg, const char *name, const char *val, char *err,
                      size_t errlen)
{
    char env[64];
    snprintf(env, sizeof env, "UCX_%s", name);
    if (getenv(env)) /* the user's setting wins */
        return 0;
    ucs_status_t st = ucp_config_modify(cfg, name, val);
    if (st != UCS_OK) {
        nrs_seterr(err, errlen, "ucx: config %s=%s: %s", name, val, ucs_status_string(st));
        return -1;
    }
    return 0;
}

/* Field 22 of /proc/PID/stat; 0 if unknown. State Z/X counts as gone. */
static uint64_t proc_start(int pid, bool *gone)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    *gone = false;
    if (!f)
        return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *p = strrchr(buf, ')'); /* the command name may hold spaces */
    if (!p || p[1] != ' ')
        return 0;
    p += 2;
    *gone = *p == 'Z' || *p == 'X';
    for (int field = 3; field < 22 && p; field++) {
        p = strchr(p, ' ');
        if (p)
            p++;
    }
    return p ? strtoull(p, NULL, 10) : 0;
}

static uint64_t pid_ns(void)
{
    struct stat st;
    return stat("/proc/self/ns/pid", &st) ? 0 : (uint64_t)st.st_ino;
}

static int make_blob(nrs_ucx_t *u)
{
    blob_hdr_t h = {.magic = BLOB_MAGIC, .addr_len = (uint32_t)u->addr_len, .pid = (int32_t)getpid()};
    bool gone;
    h.start = proc_start((int)getpid(), &gone);
    h.pidns = pid_ns();
    gethostname(h.host, sizeof h.host);
    h.host[sizeof h.host - 1] = '\0';
    for (int c = 0; c < CPU_SETSIZE; c++) /* up to the last CPU we may use */
        if (CPU_ISSET(c, &u->cpus))
            h.cpus_len = c / 8 + 1;
    u->blob_len = sizeof h + (size_t)h.cpus_len + u->addr_len;
    if (!(u->blob = calloc(1, u->blob_len)))
        return -1;
    unsigned char *mask = (unsigned char *)u->blob + sizeof h;
    for (int c = 0; c < h.cpus_len * 8; c++)
        if (CPU_ISSET(c, &u->cpus))
            mask[c / 8] |= (unsigned char)(1u << (c % 8));
    memcpy(u->blob, &h, sizeof h);
    memcpy(mask + h.cpus_len, u->addr, u->addr_len);
    return 0;
}

int nrs_ucx_init(nrs_ucx_t **out, int rank, int size, const nrs_ucx_opts_t *o, char *err,
                 size_t errlen)
{
    nrs_ucx_t *u = calloc(1, sizeof(*u));
    ucp_config_t *cfg = NULL;
    ucs_status_t st;
    char ka[32];

    if (!u || size < 1 || size > NRS_UCX_MAX_RANKS || rank < 0 || rank >= size) {
        nrs_seterr(err, errlen, u ? "ucx: bad rank %d of %d" : "ucx: out of memory", rank, size);
        free(u);
        return -1;
    }
    u->rank = rank;
    u->size = size;
    nrs_ucx_opts_init(&u->o);
    if (o) {
        if (o->chunk_bytes) /* bytes, never 0 */
            u->o.chunk_bytes = o->chunk_bytes;
        if (o->window > 0)
            u->o.window = o->window > NRS_UCX_MAX_WINDOW ? NRS_UCX_MAX_WINDOW : o->window;
        if (o->op_timeout_s > 0)
            u->o.op_timeout_s = o->op_timeout_s;
        if (o->keepalive_s > 0)
            u->o.keepalive_s = o->keepalive_s;
        if (o->spin_s > 0)
            u->o.spin_s = o->spin_s;
        else if (o->spin_s < 0)
            u->o.spin_s = 0;
    }
    if (sched_getaffinity(0, sizeof u->cpus, &u->cpus)) { /* unknown: every CPU */
        CPU_ZERO(&u->cpus);
        for (long c = 0; c < sysconf(_SC_NPROCESSORS_ONLN) && c < CPU_SETSIZE; c++)
            CPU_SET((int)c, &u->cpus);
    }
    /* room to grow (nrs_ucx_grow): the endpoints' error callbacks hold pointers
     * into this array, so it is never moved */
    u->cap = size * 4 + 64 < NRS_UCX_MAX_RANKS ? size * 4 + 64 : NRS_UCX_MAX_RANKS;
    if (!(u->peers = calloc((size_t)u->cap, sizeof(*u->peers)))) {
        nrs_seterr(err, errlen, "ucx: out of memory");
        goto fail;
    }
    if ((st = ucp_config_read(NULL, NULL, &cfg)) != UCS_OK) {
        nrs_seterr(err, errlen, "ucx: ucp_config_read: %s", ucs_status_string(st));
        goto fail;
    }
    /* Dead peers must be seen in seconds: keep-alive on every endpoint. */
    snprintf(ka, sizeof ka, "%gs", u->o.keepalive_s);
    if (config_set(cfg, "KEEPALIVE_INTERVAL", ka, err, errlen))
        goto fail;
    ucp_params_t params = {
        .field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED |
                      UCP_PARAM_FIELD_ESTIMATED_NUM_EPS | UCP_PARAM_FIELD_NAME,
        .features = UCP_FEATURE_TAG,
        .mt_workers_shared = 0,
        .estimated_num_eps = (size_t)size,
        .name = "nereus",
    };
    st = ucp_init(&params, cfg, &u->ctx);
    ucp_config_release(cfg);
    cfg = NULL;
    if (st != UCS_OK) {
        nrs_seterr(err, errlen, "ucx: ucp_init: %s", ucs_status_string(st));
        goto fail;
    }
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                              .thread_mode = UCS_THREAD_MODE_SINGLE};
    if ((st = ucp_worker_create(u->ctx, &wp, &u->worker)) != UCS_OK) {
        nrs_seterr(err, errlen, "ucx: ucp_worker_create: %s", ucs_status_string(st));
        goto fail;
    }
    if ((st = ucp_worker_get_address(u->worker, &u->addr, &u->addr_len)) != UCS_OK) {
        nrs_seterr(err, errlen, "ucx: ucp_worker_get_address: %s", ucs_status_string(st));
        goto fail;
    }
    if (make_blob(u)) {
        nrs_seterr(err, errlen, "ucx: out of memory");
        goto fail;
    }
    *out = u;
    return 0;
fail:
    if (cfg)
        ucp_config_release(cfg);
    nrs_ucx_fini(u);
    return -1;
}

int nrs_ucx_rank(const nrs_ucx_t *u) { return u->rank; }
int nrs_ucx_size(const nrs_ucx_t *u) { return u->size; }

void nrs_ucx_address(const nrs_ucx_t *u, const void **addr, size_t *len)
{
    *addr = u->blob;
    *len = u->blob_len;
}

void nrs_ucx_set_probe(nrs_ucx_t *u, nrs_ucx_probe_fn fn, void *arg)
{
    u->probe = fn;
    u->probe_arg = arg;
}

bool nrs_ucx_peer_failed(const nrs_ucx_t *u, int rank)
{
    if (rank < 0 || rank >= u->size)
        return true;
    return u->peers[rank].failed != UCS_OK || (u->probe && u->probe(u->probe_arg, rank));
}

/* NRS_UCX_ERRMODE=peer|none|auto (default auto: none for peers on this host,
 * whose shared-memory transports have no peer-failure support in UCX 1.13 —
 * an endpoint in PEER mode would lose them — and peer elsewhere). */
static ucp_err_handling_mode_t err_mode_for(bool same_host)
{
    const char *m = getenv("NRS_UCX_ERRMODE");
    if (m && !strcmp(m, "peer"))
        return UCP_ERR_HANDLING_MODE_PEER;
    if (m && !strcmp(m, "none"))
        return UCP_ERR_HANDLING_MODE_NONE;
    return same_host ? UCP_ERR_HANDLING_MODE_NONE : UCP_ERR_HANDLING_MODE_PEER;
}

/* A rank of this host (this one too) that may run on one of our CPUs competes
 * for them: more such ranks than CPUs among them is oversubscription
 * (nrs_ucx_spin). Ranks bound to a core each share nothing. */
static void note_cpus(nrs_ucx_t *u, bool same_host, const unsigned char *mask, int len)
{
    cpu_set_t theirs, both;
    CPU_ZERO(&theirs);
    for (int c = 0; c < len * 8; c++)
        if (mask[c / 8] >> (c % 8) & 1)
            CPU_SET(c, &theirs);
    CPU_AND(&both, &u->cpus, &theirs);
    if (!same_host || !CPU_COUNT(&both))
        return;
    if (!u->nshare++)
        CPU_ZERO(&u->shared);
    CPU_OR(&u->shared, &u->shared, &theirs);
}

static int connect_one(nrs_ucx_t *u, int i, const void *blob, size_t len, char *err,
                       size_t errlen)
{
    peer_t *p = &u->peers[i];
    blob_hdr_t h;
    char me[64];
    if (!blob || len < sizeof h) {
        nrs_seterr(err, errlen, "ucx: no worker address for rank %d", i);
        return -1;
    }
    memcpy(&h, blob, sizeof h);
    if (h.magic != BLOB_MAGIC || h.cpus_len < 0 || h.cpus_len > CPU_SETSIZE / 8 ||
        sizeof h + (size_t)h.cpus_len + h.addr_len != len) {
        nrs_seterr(err, errlen, "ucx: rank %d's address blob is malformed (%zu bytes)", i, len);
        return -1;
    }
    h.host[sizeof h.host - 1] = '\0';
    gethostname(me, sizeof me);
    me[sizeof me - 1] = '\0';
    bool same_host = !strcmp(me, h.host);
    ucp_ep_params_t ep = {
        .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER,
        .address = (const ucp_address_t *)((const char *)blob + sizeof h + h.cpus_len),
        .err_mode = err_mode_for(same_host),
        .err_handler = {.cb = ep_error_cb, .arg = p},
    };
    ucs_status_t st = ucp_ep_create(u->worker, &ep, &p->ep);
    if (st == UCS_ERR_UNREACHABLE && ep.err_mode == UCP_ERR_HANDLING_MODE_PEER && same_host) {
        ep.err_mode = UCP_ERR_HANDLING_MODE_NONE; /* only shm transports allowed */
        st = ucp_ep_create(u->worker, &ep, &p->ep);
    }
    if (st != UCS_OK) {
        p->ep = NULL;
        nrs_seterr(err, errlen, "ucx: endpoint to rank %d: %s", i, ucs_status_string(st));
        return -1;
    }
    /* its pid names it here only on this host and in our pid namespace
     * (NRS_UCX_ERRMODE=none puts peers elsewhere in MODE_NONE too; a rank in
     * a container of its own has pids of its own): the others are left to
     * the resource manager's word and the op time-outs */
    p->watch = same_host && h.pidns == pid_ns() && ep.err_mode == UCP_ERR_HANDLING_MODE_NONE &&
               i != u->rank;
    note_cpus(u, same_host, (const unsigned char *)blob + sizeof h, h.cpus_len);
    p->pid = h.pid;
    p->start = h.start;
    return 0;
}

int nrs_ucx_connect(nrs_ucx_t *u, void *const *addrs, const size_t *lens, char *err,
                    size_t errlen)
{
    for (int i = 0; i < u->size; i++)
        if (!u->peers[i].ep && u->peers[i].failed == UCS_OK &&
            connect_one(u, i, addrs[i], lens[i], err, errlen))
            return -1;
    return 0;
}

int nrs_ucx_grow(nrs_ucx_t *u, int size, char *err, size_t errlen)
{
    if (size < u->size || size > u->cap) {
        nrs_seterr(err, errlen, "ucx: cannot grow from %d to %d ranks (room for %d)", u->size,
                   size, u->cap);
        return -1;
    }
    u->size = size; /* the new peers are zeroed: no endpoint until connected */
    return 0;
}

void nrs_ucx_mark_failed(nrs_ucx_t *u, int rank)
{
    if (rank >= 0 && rank < u->size && !u->peers[rank].ep)
        u->peers[rank].failed = UCS_ERR_UNREACHABLE;
}

/* Peers without UCX failure detection: is the process still there? */
static void watch_peers(nrs_ucx_t *u, double now)
{
    if (now < u->next_watch)
        return;
    u->next_watch = now + 0.1;
    for (int i = 0; i < u->size; i++) {
        peer_t *p = &u->peers[i];
        bool gone = false;
        if (!p->watch || p->failed != UCS_OK)
            continue;
        if (kill(p->pid, 0) && errno == ESRCH) {
            gone = true;
        } else if (p->start) {
            /* 0: /proc unreadable here (out of file descriptors, say), which
             * says nothing of the peer; another start time: pid reused */
            uint64_t start = proc_start(p->pid, &gone);
            gone = gone || (start && start != p->start);
        }
        if (gone)
            p->failed = UCS_ERR_CONNECTION_RESET;
    }
}

bool nrs_ucx_check_peer(nrs_ucx_t *u, int rank)
{
    double now = nrs_awake_s(); /* the clock of watch_peers' (progress) */
    if (now >= u->next_check) {
        u->next_check = now + 0.01;
        ucp_worker_progress(u->worker); /* endpoint error callbacks run here */
        watch_peers(u, now);
    }
    return nrs_ucx_peer_failed(u, rank);
}

static void close_ep(nrs_ucx_t *u, peer_t *p, bool force)
{
    if (!p->ep || p->closed)
        return;
    ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                               .flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0};
    void *req = ucp_ep_close_nbx(p->ep, &prm);
    p->closed = true;
    p->close_req = UCS_PTR_IS_PTR(req) ? req : NULL;
    (void)u;
}

static void reap_closes(nrs_ucx_t *u)
{
    for (int i = 0; i < u->size; i++) {
        peer_t *p = &u->peers[i];
        if (p->close_req && ucp_request_check_status(p->close_req) != UCS_INPROGRESS) {
            ucp_request_free(p->close_req);
            p->close_req = NULL;
        }
    }
}

static bool closes_pending(const nrs_ucx_t *u)
{
    for (int i = 0; i < u->size; i++)
        if (u->peers[i].close_req)
            return true;
    return false;
}

static bool op_busy(const nrs_ucx_op_t *op);

/* An op no request of which UCX holds any more: its memory and what it owns. */
static void op_dispose(nrs_ucx_op_t *op)
{
    free(op->owned);
    free(op);
}

/* Whether a request UCX still holds reads or writes [p, p + len). */
static bool in_use(const nrs_ucx_t *u, const char *p, size_t len)
{
    for (size_t i = 0; i < u->norphans; i++) {
        const nrs_ucx_op_t *op = u->orphans[i];
        if (op_busy(op) && op->buf < p + len && p < op->buf + op->len)
            return true;
    }
    for (const nrs_ucx_op_t *op = u->ops; op; op = op->next)
        if (op_busy(op) && op->buf < p + len && p < op->buf + op->len)
            return true;
    return false;
}

/* What nrs_ucx_free kept, once no request uses it (all: the worker is gone). */
static void free_late(nrs_ucx_t *u, bool all)
{
    for (size_t i = 0; i < u->nlate;) {
        if (!all && in_use(u, u->late[i].p, u->late[i].len)) {
            i++;
            continue;
        }
        free(u->late[i].p);
        u->late[i] = u->late[--u->nlate];
    }
}

void nrs_ucx_free(nrs_ucx_t *u, void *p, size_t len)
{
    if (!p)
        return;
    if (!u || !in_use(u, p, len ? len : 1)) {
        free(p);
        return;
    }
    if (u->nlate == u->latecap) {
        size_t nc = u->latecap ? 2 * u->latecap : 8;
        late_t *v = realloc(u->late, nc * sizeof(*v));
        if (!v)
            return; /* leak rather than free memory UCX writes to */
        u->late = v;
        u->latecap = nc;
    }
    u->late[u->nlate++] = (late_t){p, len ? len : 1};
}

/* Orphans whose requests have ended since (their callbacks ran): release the
 * requests, free the ops and what they own. */
static void reap_orphans(nrs_ucx_t *u)
{
    for (size_t i = 0; i < u->norphans;) {
        nrs_ucx_op_t *op = u->orphans[i];
        for (int k = 0; k < NRS_UCX_MAX_WINDOW; k++) {
            slot_t *s = &op->slots[k];
            if (!s->busy && s->req) {
                ucp_request_free(s->req);
                s->req = NULL;
            }
        }
        if (op_busy(op)) {
            i++;
            continue;
        }
        op_dispose(op);
        u->orphans[i] = u->orphans[--u->norphans];
    }
    free_late(u, false);
}

/* Whether an orphan still has a request to rank in flight (a rendezvous send
 * its peer never matched: UCX 1.13 cannot cancel it, and it holds up the
 * flush of a graceful close of that endpoint for ever). */
static bool orphans_on(const nrs_ucx_t *u, int rank)
{
    for (size_t i = 0; i < u->norphans; i++)
        if (u->orphans[i]->peer == rank && op_busy(u->orphans[i]))
            return true;
    return false;
}

/* Before the worker goes: every request an orphan still holds is cancelled
 * where UCX can (an unmatched receive) and handed back (ucp_request_free: UCX
 * releases a running one itself when it ends, and calls no callback after).
 * The ops, and the buffers they own, stay until the worker is destroyed. */
static size_t release_orphans(nrs_ucx_t *u)
{
    size_t running = 0;
    for (size_t i = 0; i < u->norphans; i++) {
        nrs_ucx_op_t *op = u->orphans[i];
        for (int k = 0; k < NRS_UCX_MAX_WINDOW; k++) {
            slot_t *s = &op->slots[k];
            if (s->busy && s->req)
                ucp_request_cancel(u->worker, s->req);
            if (!s->req)
                continue;
            if (s->busy)
                s->released = 1, running++;
            ucp_request_free(s->req);
            s->req = NULL;
        }
    }
    return running;
}

/* ucp_worker_destroy with requests released still running (sends to a rank
 * that died, on an endpoint without peer-failure handling: shared memory in
 * UCX 1.13, which cannot purge them): UCX warns of each ("object ... was not
 * returned to mpool ucp_requests"), a line per request in every survivor's
 * log for a loss already reported. Those warnings only are left out here,
 * and counted in one line instead. */
static size_t mpool_quiet;

static ucs_log_func_rc_t quiet_mpool(const char *file, unsigned line, const char *fn,
                                     ucs_log_level_t level,
                                     const ucs_log_component_config_t *conf, const char *msg,
                                     va_list ap)
{
    (void)file, (void)line, (void)fn, (void)conf, (void)ap;
    if (level == UCS_LOG_LEVEL_WARN && msg && strstr(msg, "was not returned to mpool")) {
        mpool_quiet++;
        return UCS_LOG_FUNC_RC_STOP;
    }
    return UCS_LOG_FUNC_RC_CONTINUE;
}

static void destroy_worker(nrs_ucx_t *u, size_t running)
{
    if (!running) {
        ucp_worker_destroy(u->worker);
        return;
    }
    mpool_quiet = 0;
    ucs_log_push_handler(quiet_mpool);
    ucp_worker_destroy(u->worker); /* ends what the released requests did */
    ucs_log_pop_handler();
    if (mpool_quiet)
        fprintf(stderr, "nereus: ucx: rank %d: %zu transfer(s) to dead peers were still in UCX "
                "at shutdown (UCX's %zu mpool warning(s) left out)\n", u->rank, running,
                mpool_quiet);
}

void nrs_ucx_disconnect(nrs_ucx_t *u, double timeout_s)
{
    double end = nrs_now_s() + timeout_s;
    ucp_worker_progress(u->worker);
    reap_orphans(u);
    /* A graceful close flushes first, which waits for every send on the
     * endpoint: close forcibly where an orphaned send will never end (its
     * requests complete as cancelled, and are reaped below). */
    for (int i = 0; i < u->size; i++)
        close_ep(u, &u->peers[i], u->peers[i].failed != UCS_OK || orphans_on(u, i));
    while (closes_pending(u) && nrs_now_s() < end) {
        if (!ucp_worker_progress(u->worker))
            nrs_nap_us(20);
        reap_closes(u);
    }
    reap_orphans(u);
    /* Stragglers (a peer gone mid-flush): hand the close request back to UCX,
     * which completes it when the worker is destroyed; one never released
     * fails an assertion in ucp_worker_destroy. */
    for (int i = 0; i < u->size; i++) {
        peer_t *p = &u->peers[i];
        if (!p->close_req)
            continue;
        ucp_request_cancel(u->worker, p->close_req);
        double e2 = nrs_now_s() + 1.0;
        while (ucp_request_check_status(p->close_req) == UCS_INPROGRESS && nrs_now_s() < e2)
            ucp_worker_progress(u->worker);
        ucp_request_free(p->close_req);
        p->close_req = NULL;
    }
}

void nrs_ucx_fini(nrs_ucx_t *u)
{
    if (!u)
        return;
    while (u->ops) {
        nrs_ucx_op_t *op = u->ops;
        nrs_ucx_op_free(op);
    }
    if (u->worker) {
        bool open = false;
        for (int i = 0; i < u->size; i++)
            open |= u->peers[i].ep && !u->peers[i].closed;
        if (open)
            nrs_ucx_disconnect(u, 2.0);
        /* Orphaned ops may still complete while the worker winds down. */
        double end = nrs_now_s() + 1.0;
        while (u->norphans && nrs_now_s() < end) {
            ucp_worker_progress(u->worker);
            reap_orphans(u);
        }
        size_t running = release_orphans(u); /* no request of ours left unreleased */
        reap_closes(u);
        for (int i = 0; i < u->size; i++)
            if (u->peers[i].close_req) {
                ucp_request_free(u->peers[i].close_req);
                u->peers[i].close_req = NULL;
            }
        if (u->addr)
            ucp_worker_release_address(u->worker, u->addr);
        destroy_worker(u, running); /* ends what the released requests did */
    }
    /* UCX is done with every buffer now */
    for (size_t i = 0; i < u->norphans; i++)
        op_dispose(u->orphans[i]);
    u->norphans = 0;
    free(u->orphans);
    free_late(u, true);
    free(u->late);
    free(u->blob);
    if (u->ctx)
        ucp_cleanup(u->ctx);
    free(u->peers);
    free(u);
}

/* ---- operations ------------------------------------------------------------------------- */

static uint64_t chunk_tag(int sender, uint64_t tag, size_t chunk)
{
    return ((uint64_t)sender << (TAG_USER_BITS + TAG_CHUNK_BITS)) | (tag << TAG_CHUNK_BITS) |
           (uint64_t)chunk;
}

static void op_fail(nrs_ucx_op_t *op, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void op_fail(nrs_ucx_op_t *op, const char *fmt, ...)
{
    va_list ap;
    if (op->state != 0)
        return;
    op->state = -1;
    op->u->new_failures++;
    va_start(ap, fmt);
    vsnprintf(op->err, sizeof op->err, fmt, ap);
    va_end(ap);
    if (op->on_done)
        op->on_done(op->on_done_arg, -1);
}

static void slot_finish(slot_t *s, ucs_status_t st)
{
    s->op->u->completions++;
    s->status = st;
    s->done = 1;
    s->busy = 0;
}

static void send_cb(void *req, ucs_status_t st, void *user)
{
    (void)req;
    slot_finish(user, st);
}

static void recv_cb(void *req, ucs_status_t st, const ucp_tag_recv_info_t *info, void *user)
{
    slot_t *s = user;
    (void)req;
    if (info)
        s->info = *info;
    slot_finish(s, st);
}

static int post_chunk(nrs_ucx_op_t *op, slot_t *s)
{
    nrs_ucx_t *u = op->u;
    size_t i = op->next_chunk, off = i * op->chunk;
    size_t n = op->len - off < op->chunk ? op->len - off : op->chunk;
    ucp_request_param_t prm = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
        .user_data = s,
    };
    void *req;

    memset(s, 0, sizeof(*s));
    s->op = op;
    s->want = n;
    s->busy = 1;
    if (op->is_send) {
        prm.cb.send = send_cb;
        req = ucp_tag_send_nbx(u->peers[op->peer].ep, op->buf + off, n,
                               chunk_tag(u->rank, op->tag, i), &prm);
    } else {
        /* Always complete through the callback: UCX 1.13 does not fill
         * recv_info.tag_info on immediate completion. */
        prm.op_attr_mask |= UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
        prm.cb.recv = recv_cb;
        req = ucp_tag_recv_nbx(u->worker, op->buf + off, n, chunk_tag(op->peer, op->tag, i),
                               TAG_FULL_MASK, &prm);
    }
    op->next_chunk++;
    op->inflight++;
    if (UCS_PTR_IS_ERR(req)) {
        slot_finish(s, UCS_PTR_STATUS(req));
    } else if (req == NULL) { /* sends only */
        s->info.length = n;
        slot_finish(s, UCS_OK);
    } else {
        s->req = req;
    }
    return 0;
}

/* Take in finished chunks, post new ones, apply time-outs and peer failures. */
static int advance(nrs_ucx_op_t *op, double now)
{
    nrs_ucx_t *u = op->u;
    int events = 0;
    if (op->state)
        return 0;
    for (int k = 0; k < u->o.window; k++) {
        slot_t *s = &op->slots[k];
        if (!s->done)
            continue;
        s->done = 0;
        op->inflight--;
        events++;
        if (s->req) {
            ucp_request_free(s->req);
            s->req = NULL;
        }
        if (s->status != UCS_OK) {
            op_fail(op, "ucx: %s rank %d tag %llu: %s", op->is_send ? "send to" : "recv from",
                    op->peer, (unsigned long long)op->tag, ucs_status_string(s->status));
            return events;
        }
        if (!op->is_send && s->info.length != s->want) {
            op_fail(op, "ucx: recv from rank %d tag %llu: chunk of %zu bytes, wanted %zu",
                    op->peer, (unsigned long long)op->tag, (size_t)s->info.length, s->want);
            return events;
        }
        op->done_chunks++;
        op->deadline = now + u->o.op_timeout_s;
    }
    if (op->done_chunks == op->nchunks) {
        op->state = 1;
        if (op->on_done)
            op->on_done(op->on_done_arg, 0);
        return events + 1;
    }
    /* UCX frees a closed endpoint: no chunk goes to one that
     * nrs_ucx_disconnect closed (a failed peer's closes forcibly, below) */
    if (u->peers[op->peer].closed && u->peers[op->peer].failed == UCS_OK) {
        op_fail(op, "ucx: %s rank %d tag %llu: its endpoint is closed",
                op->is_send ? "send to" : "recv from", op->peer, (unsigned long long)op->tag);
        return events;
    }
    if (nrs_ucx_peer_failed(u, op->peer)) {
        ucs_status_t st = u->peers[op->peer].failed;
        op_fail(op, "ucx: peer rank %d failed (%s) during %s of tag %llu", op->peer,
                st != UCS_OK ? ucs_status_string(st) : "reported by the resource manager",
                op->is_send ? "send" : "recv", (unsigned long long)op->tag);
        return events;
    }
    if (now > op->deadline) {
        op_fail(op, "ucx: %s rank %d tag %llu: no progress for %.1f s (%zu of %zu chunks)",
                op->is_send ? "send to" : "recv from", op->peer, (unsigned long long)op->tag,
                u->o.op_timeout_s, op->done_chunks, op->nchunks);
        return events;
    }
    for (int k = 0; k < u->o.window && op->next_chunk < op->nchunks; k++)
        if (!op->slots[k].busy && !op->slots[k].done) {
            post_chunk(op, &op->slots[k]);
            events++;
        }
    return events;
}

static int post_op(nrs_ucx_t *u, int is_send, int peer, void *buf, size_t len, uint64_t tag,
                   nrs_ucx_op_t **out, char *err, size_t errlen)
{
    if (peer < 0 || peer >= u->size || !u->peers[peer].ep) {
        nrs_seterr(err, errlen, "ucx: no endpoint to rank %d", peer);
        return -1;
    }
    if (tag >> TAG_USER_BITS) {
        nrs_seterr(err, errlen, "ucx: tag %llu does not fit in %d bits", (unsigned long long)tag,
               TAG_USER_BITS);
        return -1;
    }
    /* not (len + chunk - 1) / chunk: that wraps for len near SIZE_MAX, and a
     * message of 0 chunks is done before it starts */
    size_t nchunks = len / u->o.chunk_bytes + (len % u->o.chunk_bytes != 0);
    nchunks = nchunks ? nchunks : 1;
    if (nchunks > NRS_UCX_MAX_CHUNKS) {
        nrs_seterr(err, errlen, "ucx: %zu bytes need %zu chunks of %zu (max %d)", len, nchunks,
               u->o.chunk_bytes, NRS_UCX_MAX_CHUNKS);
        return -1;
    }
    nrs_ucx_op_t *op = calloc(1, sizeof(*op));
    if (!op) {
        nrs_seterr(err, errlen, "ucx: out of memory");
        return -1;
    }
    *op = (nrs_ucx_op_t){.u = u, .peer = peer, .is_send = is_send, .buf = buf, .len = len,
                         .chunk = u->o.chunk_bytes, .nchunks = nchunks, .tag = tag,
                         .deadline = nrs_awake_s() + u->o.op_timeout_s};
    op->next = u->ops;
    if (u->ops)
        u->ops->prev = op;
    u->ops = op;
    u->ops_posted++;
    advance(op, nrs_awake_s());
    *out = op;
    return 0;
}

int nrs_ucx_isend(nrs_ucx_t *u, int peer, const void *buf, size_t len, uint64_t tag,
                  nrs_ucx_op_t **op, char *err, size_t errlen)
{
    return post_op(u, 1, peer, (void *)buf, len, tag, op, err, errlen);
}

int nrs_ucx_irecv(nrs_ucx_t *u, int peer, void *buf, size_t len, uint64_t tag,
                  nrs_ucx_op_t **op, char *err, size_t errlen)
{
    return post_op(u, 0, peer, buf, len, tag, op, err, errlen);
}

int nrs_ucx_test(const nrs_ucx_op_t *op) { return op->state; }
const char *nrs_ucx_op_error(const nrs_ucx_op_t *op) { return op->err; }

void nrs_ucx_op_on_done(nrs_ucx_op_t *op, void (*fn)(void *arg, int status), void *arg)
{
    op->on_done = fn;
    op->on_done_arg = arg;
}

void nrs_ucx_op_adopt(nrs_ucx_op_t *op, void *mem)
{
    op->owned = mem;
}

static void unlink_op(nrs_ucx_op_t *op)
{
    nrs_ucx_t *u = op->u;
    if (op->prev)
        op->prev->next = op->next;
    else if (u->ops == op)
        u->ops = op->next;
    if (op->next)
        op->next->prev = op->prev;
    op->next = op->prev = NULL;
}

static bool op_busy(const nrs_ucx_op_t *op)
{
    for (int k = 0; k < NRS_UCX_MAX_WINDOW; k++)
        if (op->slots[k].busy)
            return true;
    return false;
}

/* Requests still in UCX: cancel them and wait (briefly) for their callbacks,
 * which write into the op's slots. */
static void release_slots(nrs_ucx_op_t *op)
{
    nrs_ucx_t *u = op->u;
    for (int k = 0; k < NRS_UCX_MAX_WINDOW; k++) {
        slot_t *s = &op->slots[k];
        if (s->busy && s->req)
            ucp_request_cancel(u->worker, s->req);
    }
    double end = nrs_now_s() + 0.5;
    while (op_busy(op) && nrs_now_s() < end)
        ucp_worker_progress(u->worker);
    for (int k = 0; k < NRS_UCX_MAX_WINDOW; k++) {
        slot_t *s = &op->slots[k];
        if (!s->busy && s->req) {
            ucp_request_free(s->req);
            s->req = NULL;
        }
    }
}

static void free_released(nrs_ucx_op_t *op)
{
    nrs_ucx_t *u = op->u;
    if (op_busy(op)) { /* UCX may still write to it: keep it until fini */
        if (u->norphans == u->orphcap) {
            size_t nc = u->orphcap ? 2 * u->orphcap : 8;
            nrs_ucx_op_t **v = realloc(u->orphans, nc * sizeof(*v));
            if (!v)
                return; /* leak rather than free memory UCX owns */
            u->orphans = v;
            u->orphcap = nc;
        }
        u->orphans[u->norphans++] = op;
        return;
    }
    op_dispose(op);
}

void nrs_ucx_op_free(nrs_ucx_op_t *op)
{
    if (!op)
        return;
    unlink_op(op);
    release_slots(op);
    free_released(op);
}

/* Cancel every slot of every op first, then wait once (bounded): sends to a
 * dead peer over shared memory never complete, and waiting for each op in
 * turn would take n times the bound. */
void nrs_ucx_op_free_many(nrs_ucx_op_t **ops, size_t n)
{
    nrs_ucx_t *u = NULL;
    for (size_t i = 0; i < n; i++) {
        if (!ops[i])
            continue;
        u = ops[i]->u;
        unlink_op(ops[i]);
        for (int k = 0; k < NRS_UCX_MAX_WINDOW; k++)
            if (ops[i]->slots[k].busy && ops[i]->slots[k].req)
                ucp_request_cancel(u->worker, ops[i]->slots[k].req);
    }
    if (!u)
        return;
    double end = nrs_now_s() + 0.5;
    for (bool busy = true; busy && nrs_now_s() < end;) {
        ucp_worker_progress(u->worker);
        busy = false;
        for (size_t i = 0; i < n && !busy; i++)
            busy = ops[i] && op_busy(ops[i]);
    }
    for (size_t i = 0; i < n; i++) {
        if (!ops[i])
            continue;
        for (int k = 0; k < NRS_UCX_MAX_WINDOW; k++) {
            slot_t *s = &ops[i]->slots[k];
            if (!s->busy && s->req) {
                ucp_request_free(s->req);
                s->req = NULL;
            }
        }
        free_released(ops[i]);
        ops[i] = NULL;
    }
}

/* Messages that came under tag (the bits of mask, any sender and chunk) and
 * no receive of ours took: received into a buffer of their own and dropped.
 * A rendezvous one needs its sender: bounded by 0.5 s in all, then left to
 * UCX as an orphan (with its buffer). */
size_t nrs_ucx_purge(nrs_ucx_t *u, uint64_t tag, uint64_t mask)
{
    ucp_tag_t t = tag << TAG_CHUNK_BITS, m = (mask & ((1ull << TAG_USER_BITS) - 1)) << TAG_CHUNK_BITS;
    double end = nrs_now_s() + 0.5;
    size_t n = 0;
    for (int i = 0; i < 1000 && ucp_worker_progress(u->worker); i++) /* what has arrived */
        ;
    for (;;) {
        ucp_tag_recv_info_t info;
        ucp_tag_message_h msg = ucp_tag_probe_nb(u->worker, t & m, m, 1, &info);
        if (!msg)
            break;
        nrs_ucx_op_t *op = calloc(1, sizeof(*op));
        void *buf = op ? malloc(info.length ? info.length : 1) : NULL;
        if (!buf) { /* it was taken off the queue: it must be received */
            free(op);
            fprintf(stderr, "nereus: ucx: rank %d: out of memory dropping a stale message\n",
                    u->rank);
            break;
        }
        *op = (nrs_ucx_op_t){.u = u, .peer = -1, .buf = buf, .len = info.length, .owned = buf};
        slot_t *s = &op->slots[0];
        s->op = op;
        s->busy = 1;
        ucp_request_param_t prm = {
            .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                            UCP_OP_ATTR_FLAG_NO_IMM_CMPL,
            .cb.recv = recv_cb,
            .user_data = s,
        };
        void *req = ucp_tag_msg_recv_nbx(u->worker, buf, info.length, msg, &prm);
        if (UCS_PTR_IS_ERR(req))
            s->busy = 0;
        else
            s->req = req;
        while (s->busy && nrs_now_s() < end)
            ucp_worker_progress(u->worker);
        if (!s->busy && s->req) {
            ucp_request_free(s->req);
            s->req = NULL;
        }
        free_released(op); /* an orphan while UCX still holds it */
        n++;
    }
    return n;
}

int nrs_ucx_progress(void *arg)
{
    nrs_ucx_t *u = arg;
    int events = 0;
    uint64_t ended = u->completions;
    /* Rounds while UCX finds work, but none after one of our requests ended:
     * a round more is a syscall over TCP, and the waiter of that request
     * posts the next message (the peer waits for its RTS or RTR meanwhile). */
    for (int i = 0; i < 64 && u->completions == ended; i++) {
        unsigned n = ucp_worker_progress(u->worker);
        events += (int)n;
        if (!n)
            break;
    }
    /* the stall clock leaves out time this rank was stopped (a suspended
     * job): at the resume its peers' chunks come, not a time-out */
    double now = nrs_awake_s(), inflight = 0;
    watch_peers(u, now);
    for (nrs_ucx_op_t *op = u->ops; op; op = op->next) {
        events += advance(op, now);
        if (op->state == 0 && op->inflight) {
            double t = (double)(op->len < op->chunk ? op->len : op->chunk) / SPIN_FLOOR_BYTES_PER_S;
            inflight = t > inflight ? t : inflight;
        }
    }
    u->inflight_s = inflight;
    if (u->norphans) /* late completions of ops freed while still in UCX */
        reap_orphans(u);
    else if (u->nlate)
        free_late(u, false);
    for (int i = 0; i < u->size; i++) /* a failed endpoint is closed, forcibly */
        if (u->peers[i].failed != UCS_OK && u->peers[i].ep && !u->peers[i].closed)
            close_ep(u, &u->peers[i], true);
    reap_closes(u);
    if (u->new_failures) {
        u->new_failures = 0;
        return -1;
    }
    return events;
}

bool nrs_ucx_spin(nrs_ucx_t *u, int events)
{
    double now = nrs_now_s();
    if (events != 0 || u->ops_since_idle != u->ops_posted) {
        u->last_event = now;
        u->ops_since_idle = u->ops_posted;
        return true;
    }
    /* oversubscribed: a peer may be waiting for this core, so no longer than
     * spin_s, and yielding */
    bool crowded = u->nshare > CPU_COUNT(&u->shared);
    double window = u->o.spin_s > 0 ? u->o.spin_s + (crowded ? 0 : u->inflight_s) : 0;
    if (!u->ops || now - u->last_event >= window)
        return false;
    if (crowded)
        sched_yield();
    return true;
}

int nrs_ucx_waitall(nrs_ucx_t *u, nrs_ucx_op_t **ops, size_t n, char *err, size_t errlen)
{
    int rc = 0;
    for (;;) {
        size_t pending = 0;
        nrs_ucx_op_t *bad = NULL;
        for (size_t i = 0; i < n; i++) {
            if (!ops[i])
                continue;
            if (ops[i]->state == 0)
                pending++;
            else if (ops[i]->state < 0 && !bad)
                bad = ops[i];
        }
        if (bad) {
            nrs_seterr(err, errlen, "%s", bad->err);
            rc = -1;
            break;
        }
        if (!pending)
            break;
        if (!nrs_ucx_spin(u, nrs_ucx_progress(u)))
            nrs_nap_us(20);
    }
    for (size_t i = 0; i < n; i++) {
        nrs_ucx_op_free(ops[i]);
        ops[i] = NULL;
    }
    return rc;
}
