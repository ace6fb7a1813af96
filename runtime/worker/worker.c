/* The worker API (include/nereus/nereus.h, docs/worker-api.md): errors, init,
 * accessors, finalize. The rest is in worker_state.c, worker_trans.c,
 * worker_ctl.c and worker_sync.c; what they share is in worker_int.h. */
#define _GNU_SOURCE
#include <config.h>

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ctl/client.h"
#include "ctl/proto.h"
#include "emu/geometry.h"
#include "emu/xport.h"
#include "rdv/rdv.h"
#include "worker/dtrans.h"
#include "worker/worker_int.h"
#include "xfer/ucx.h"
#include "xfer/xport_ucx.h"

/* The message of the last call of this thread that failed without a handle
 * to keep it (init, finalize, a NULL handle): nrs_worker_last_error(NULL).
 * Per thread: a handle is driven by one thread. */
static _Thread_local char tls_err[640];

/* Every failure says why, in w's message or (w NULL) the thread's. The
 * message is the one part of a handle that const accessors write too. */
int nrs_wk_seterr(const nrs_worker_t *w, int rc, const char *fmt, ...)
{
    char *buf = w ? ((nrs_worker_t *)w)->err : tls_err;
    size_t n = w ? sizeof w->err : sizeof tls_err;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, n, fmt, ap);
    va_end(ap);
    return rc;
}

/* A call given a NULL handle: NRS_ERR_INVAL (-1), and which call it was. */
int nrs_wk_nohandle(const char *fn)
{
    return nrs_wk_seterr(NULL, NRS_ERR_INVAL, "%s: no handle (NULL)", fn);
}

/* Once the controller retired this rank, every call but finalize says so. */
int nrs_wk_retired_err(nrs_worker_t *w, const char *fn)
{
    return nrs_wk_seterr(w, NRS_ERR_RETIRED, "%s: retired by the controller (%s)", fn,
                         w->ctl_err[0] ? w->ctl_err : "control channel closed");
}

int nrs_worker_api_version(void) { return NRS_WORKER_API_VERSION; }

const char *nrs_worker_strerror(int rc)
{
    switch (rc) {
    case NRS_OK: return "success";
    case NRS_ERR_INVAL: return "invalid argument or call out of order";
    case NRS_ERR_NOMEM: return "out of memory";
    case NRS_ERR_SPEC: return "job spec could not be loaded";
    case NRS_ERR_RDV: return "rendezvous failed";
    case NRS_ERR_XPORT: return "transport set-up failed";
    case NRS_ERR_PLAN: return "plan not usable";
    case NRS_ERR_ABORTED: return "transition aborted before its point of no return (old epoch intact)";
    case NRS_ERR_PARTIAL: return "transition failed past its point of no return";
    case NRS_ERR_VERIFY: return "checksum mismatch";
    case NRS_ERR_UNSUPPORTED: return "not supported by this build";
    case NRS_ERR_RETIRED: return "retired by the controller";
    case NRS_ERR_CHECKPOINT: return "checkpoint failed";
    default: return "unknown error";
    }
}

/* ---- init ----------------------------------------------------------------------------- */

static bool probe(void *arg, int rank) { return nrs_rdv_peer_failed(arg, rank); }
static bool ucx_dead(void *arg, int rank) { return nrs_ucx_peer_failed(arg, rank); }
static void ucx_cancel(void *arg) { nrs_xport_ucx_cancel(arg); }
static void ucx_purge(void *arg, uint64_t tag, uint64_t mask)
{
    nrs_xport_ucx_purge(arg, tag, mask);
}
static const char *ucx_error(const nrs_xport_t *x) { return nrs_xport_ucx_error(x); }

int nrs_wk_rank_under(const nrs_worker_t *w, const int *perm, int owner)
{
    if (w->n == 1)
        return 0; /* singleton: every GPU's memory is here (local transport) */
    if (owner < 0 || owner >= w->n)
        return -1;
    return perm ? perm[owner] : owner;
}

int nrs_wk_owner_rank(void *arg, int owner)
{
    const nrs_worker_t *w = arg;
    return nrs_wk_rank_under(w, w->perm, owner);
}

/* Rank r holds GPU r (a plan from nrs_worker_set_plan or the controller's HELLO answer). */
void nrs_wk_perm_identity(nrs_worker_t *w)
{
    for (int i = 0; w->perm && i < w->n; i++)
        w->perm[i] = i;
    w->my_gpu = w->n == 1 ? 0 : w->me;
}

double nrs_wk_env_double(const char *name, double dflt, double lo, double hi)
{
    static const char *warned[8];
    const char *v = getenv(name);
    char *end;
    if (!v || !*v)
        return dflt;
    errno = 0;
    double d = strtod(v, &end);
    if (!errno && end != v && !*end && d >= lo && d <= hi)
        return d;
    for (size_t i = 0; i < sizeof warned / sizeof warned[0]; i++) { /* once a name */
        if (warned[i] == name)
            return dflt;
        if (!warned[i]) {
            warned[i] = name;
            break;
        }
    }
    fprintf(stderr, "nereus: %s='%.40s' is not a number in [%.15g, %.15g]: %.15g is used\n", name, v, lo,
            hi, dflt);
    return dflt;
}

/* Executor options every distributed run of this rank shares (transitions and
 * weight syncs alike). */
void nrs_wk_dtrans_opts(nrs_worker_t *w, nrs_dtrans_opts_t *o)
{
    nrs_dtrans_opts_init(o, w->me, w->n);
    o->owner_rank = nrs_wk_owner_rank;
    o->owner_arg = w;
    o->timeout_s = w->timeout_s;
    o->window = (int)nrs_wk_env_double("NRS_WORKER_WINDOW", 32, 1, 1 << 20);
    if (w->coll_ctl) {
        o->gather = nrs_wk_ctl_gather;
        o->gather_arg = w;
    }
    if (w->xport_ucx) {
        o->cancel = ucx_cancel;
        o->cancel_arg = &w->x;
        o->purge = ucx_purge;
        o->purge_arg = &w->x;
        o->peer_failed = ucx_dead;
        o->peer_arg = w->u;
        o->xport_error = ucx_error;
    }
}

bool nrs_wk_nomem(const nrs_worker_t *w, const char *point, long long n)
{
    const char *k = getenv("NRS_WORKER_NOMEM");
    char *end;
    size_t l = strlen(point);
    return k && strtol(k, &end, 10) == w->me && *end == ':' && !strncmp(end + 1, point, l) &&
           end[1 + l] == ':' && strtoll(end + 2 + l, NULL, 10) == n;
}

/* The rendezvous whose failure reports speak of this job's ranks: a joiner's
 * PMIx namespace is its own step's, not the job's world. */
nrs_rdv_t *nrs_wk_job_rdv(const nrs_worker_t *w) { return w->joiner ? NULL : w->r; }

static int join(nrs_worker_t *w)
{
    char err[512];
    if (nrs_rdv_init(&w->r, err, sizeof err))
        return nrs_wk_seterr(w, NRS_ERR_RDV, "%s", err);
    w->me = nrs_rdv_rank(w->r);
    w->n = nrs_rdv_size(w->r);
    /* runtime.transports: what the job allows (a worker without a spec,
     * everything) */
    unsigned allow = w->spec.runtime.transports ? w->spec.runtime.transports
                                                : NRS_XFER_UCX | NRS_XFER_NCCL | NRS_XFER_LOCAL;
    if ((w->joiner || w->n > 1) && !(allow & NRS_XFER_UCX))
        return nrs_wk_seterr(w, NRS_ERR_XPORT,
                             "the job spec's runtime.transports leaves out ucx, which %s needs",
                             w->joiner ? "a joining rank" : "a job of several ranks");
    if (w->joiner) { /* the world's transports come with the controller's WORLD */
        w->xport_ucx = 1;
        return 0;
    }
    /* local | ucx; by default local for one rank (if allowed), else ucx */
    const char *xp = getenv("NRS_WORKER_XPORT");
    w->xport_ucx = xp ? !strcmp(xp, "ucx") : w->n > 1 || !(allow & NRS_XFER_LOCAL);
    if (!w->xport_ucx) {
        if (w->n > 1)
            return nrs_wk_seterr(w, NRS_ERR_XPORT, "the local transport needs a job of one rank, "
                                 "this one has %d", w->n);
        return nrs_xport_local_open(&w->x) ? nrs_wk_seterr(w, NRS_ERR_NOMEM, "out of memory") : 0;
    }
    nrs_ucx_opts_t uo;
    nrs_ucx_opts_init(&uo);
    uo.op_timeout_s = w->timeout_s;
    const void *addr;
    size_t alen;
    void **addrs = NULL;
    size_t *lens = NULL;
    if (nrs_ucx_init(&w->u, w->me, w->n, &uo, err, sizeof err))
        return nrs_wk_seterr(w, NRS_ERR_XPORT, "%s", err);
    nrs_rdv_set_progress(w->r, nrs_ucx_progress, w->u);
    nrs_ucx_set_probe(w->u, probe, w->r);
    nrs_ucx_address(w->u, &addr, &alen);
    if (nrs_rdv_allgather(w->r, 0, "ucx", addr, alen, &addrs, &lens, w->timeout_s, err,
                          sizeof err))
        return nrs_wk_seterr(w, NRS_ERR_RDV, "%s", err);
    int rc = nrs_ucx_connect(w->u, addrs, lens, err, sizeof err);
    nrs_rdv_free_blobs(w->r, addrs, lens);
    if (rc)
        return nrs_wk_seterr(w, NRS_ERR_XPORT, "%s", err);
    if (nrs_xport_ucx_open(&w->x, w->u, nrs_wk_owner_rank, w))
        return nrs_wk_seterr(w, NRS_ERR_NOMEM, "out of memory");
    return 0;
}

/* The control channel (runtime/ctl): a unix socket in $NEREUS_SOCKET_DIR
 * (else $NEREUS_JOB_DIR), HELLO as a worker. Without one, reports go to the
 * sink only; a failure to connect is not fatal (the job runs on its plan). */
/* HELLO as a worker (or joiner) on a connected fd; the channel is then w's. */
static int ctl_hello(nrs_worker_t *w, int fd, const char *token)
{
    nrs_msg_hello_t m;
    uint8_t buf[512];
    char err[256];
    const char *job = getenv("NEREUS_JOB_ID");
    memset(&m, 0, sizeof m);
    m.role = w->joiner ? NRS_ROLE_JOINER : NRS_ROLE_WORKER;
    m.rank = w->me;
    m.nranks = w->n;
    const char *hn = getenv("NEREUS_HOSTNAME"); /* launchers (and tests) that name nodes */
    snprintf(m.job, sizeof m.job, "%s", job ? job : (getenv("SLURM_JOB_ID") ? getenv("SLURM_JOB_ID") : ""));
    snprintf(m.token, sizeof m.token, "%s", token ? token : "");
    if (hn && *hn)
        snprintf(m.host, sizeof m.host, "%s", hn);
    else if (gethostname(m.host, sizeof m.host))
        m.host[0] = '\0';
    m.host[sizeof m.host - 1] = '\0';
    if (nrs_wk_ctl_buffers(w)) {
        snprintf(w->ctl_err, sizeof w->ctl_err, "control channel: out of memory");
        close(fd);
        return -1;
    }
    if (nrs_client_send(fd, buf, nrs_enc_hello(buf, sizeof buf, &m), err, sizeof err)) {
        snprintf(w->ctl_err, sizeof w->ctl_err, "control channel: HELLO: %s", err);
        close(fd);
        return -1;
    }
    w->ctl_fd = fd;
    return 0;
}

/* The control channel (runtime/ctl): a unix socket in $NEREUS_SOCKET_DIR
 * (else $NEREUS_JOB_DIR), or TCP to $NEREUS_CONTROLLER (HOST:PORT, with
 * $NEREUS_TOKEN), HELLO as a worker. Without one, reports go to the sink
 * only; a failure to connect is not fatal (the job runs on its plan). */
static void ctl_connect(nrs_worker_t *w)
{
    const char *dir = nrs_client_socket_dir(NULL), *tcp = getenv("NEREUS_CONTROLLER");
    const char *tok = getenv("NEREUS_TOKEN");
    char err[256];
    if (!dir)
        dir = getenv("NEREUS_JOB_DIR");
    int fd = -1;
    if (dir && *dir)
        fd = nrs_client_connect_unix(dir, err, sizeof err);
    if (fd < 0 && tcp && *tcp) {
        fd = nrs_client_connect_tcp(tcp, err, sizeof err);
    } else if (dir && *dir && fd >= 0) {
        tok = NULL; /* local: the socket's peer credentials are the proof */
    }
    if (fd < 0) {
        if ((dir && *dir) || (tcp && *tcp))
            snprintf(w->ctl_err, sizeof w->ctl_err, "control channel: %s", err);
        return;
    }
    ctl_hello(w, fd, tok);
}

/* This rank's way to the controller for ranks that cannot reach its unix
 * socket: "HOST:PORT TOKEN" from the controller's contact file and the
 * job's secret next to the socket; "" when there is none. */
static void ctl_contact(char *out, size_t n)
{
    const char *dir = nrs_client_socket_dir(NULL);
    char path[4200], hp[300] = "", tok[NRS_PROTO_TOKEN_MAX + 2] = "";
    out[0] = 0;
    if (!dir)
        dir = getenv("NEREUS_JOB_DIR");
    if (!dir || !*dir)
        return;
    snprintf(path, sizeof path, "%s/ctl.tcp", dir);
    FILE *f = fopen(path, "re");
    if (!f)
        return;
    if (!fgets(hp, sizeof hp, f))
        hp[0] = 0;
    fclose(f);
    hp[strcspn(hp, "\n")] = 0;
    snprintf(path, sizeof path, "%s/secret", dir);
    if (!(f = fopen(path, "re")))
        return;
    if (!fgets(tok, sizeof tok, f))
        tok[0] = 0;
    fclose(f);
    tok[strcspn(tok, "\n")] = 0;
    if (hp[0] && tok[0] && !strchr(hp, ' '))
        snprintf(out, n, "%s %s", hp, tok);
}

/* Every rank must take the same collectives: the controller's only when every
 * rank has a control channel (a rank without one, e.g. on a node that cannot
 * reach the controller's socket, would never contribute), else PMIx for all.
 * Decided at start-up, while the launcher's fences work. */
static int coll_choice(nrs_worker_t *w)
{
    enum { CONTACT = 512 };
    char err[512], mine[CONTACT];
    void **b = NULL;
    size_t *l = NULL;
    memset(mine, 0, sizeof mine);
    mine[0] = (char)w->coll_ctl;
    if (w->coll_ctl)
        ctl_contact(mine + 1, sizeof mine - 1);
    /* 1: who is connected, and how the others can reach the controller */
    if (nrs_rdv_allgather(w->r, 0, "coll", mine, sizeof mine, &b, &l, w->timeout_s, err,
                          sizeof err))
        return nrs_wk_seterr(w, NRS_ERR_RDV, "%s", err);
    const char *coll = getenv("NRS_WORKER_COLL");
    int allowed = !(coll && !strcmp(coll, "pmix"));
    for (int i = 0; allowed && w->ctl_fd < 0 && i < w->n; i++) {
        /* a peer's blob need not end in a NUL: scan a terminated copy */
        char c[CONTACT];
        if (l[i] == CONTACT)
            memcpy(c, (const char *)b[i] + 1, CONTACT - 1);
        c[l[i] == CONTACT ? CONTACT - 1 : 0] = '\0';
        char hp[300], tok[NRS_PROTO_TOKEN_MAX];
        if (!c[0] || sscanf(c, "%299s %127s", hp, tok) != 2)
            continue;
        int fd = nrs_client_connect_tcp(hp, err, sizeof err);
        if (fd < 0) {
            snprintf(w->ctl_err, sizeof w->ctl_err, "control channel: tcp %.60s: %.250s", hp, err);
            continue;
        }
        if (!ctl_hello(w, fd, tok))
            break;
    }
    nrs_rdv_free_blobs(w->r, b, l);
    w->coll_ctl = w->ctl_fd >= 0 && allowed;
    /* 2: every rank has a channel now, or all take PMIx */
    char c2 = (char)w->coll_ctl;
    if (nrs_rdv_allgather(w->r, 0, "coll2", &c2, 1, &b, &l, w->timeout_s, err, sizeof err))
        return nrs_wk_seterr(w, NRS_ERR_RDV, "%s", err);
    int with = 0;
    for (int i = 0; i < w->n; i++)
        with += l[i] == 1 && ((char *)b[i])[0];
    nrs_rdv_free_blobs(w->r, b, l);
    if (w->coll_ctl && with < w->n) {
        w->coll_ctl = 0;
        if (w->me == 0)
            fprintf(stderr, "nereus: %d of %d ranks have a control channel: collectives over "
                    "PMIx (after a shrink they fail under Slurm's pmix plugin)\n", with, w->n);
    }
    return 0;
}

int nrs_wk_unusable(const nrs_worker_t *w, const char *fn)
{
    if (!w)
        return nrs_wk_nohandle(fn);
    if (!w->init_rc)
        return 0;
    return nrs_wk_seterr(w, NRS_ERR_INVAL, "%s: nrs_worker_init failed: %s", fn, w->init_err);
}

int nrs_wk_cannot_act(nrs_worker_t *w, const char *fn)
{
    int rc = nrs_wk_unusable(w, fn);
    return rc ? rc : w->retired ? nrs_wk_retired_err(w, fn) : 0;
}

/* A handle that holds nothing yet: finalize may take it as it is. */
static nrs_worker_t *worker_new(void)
{
    nrs_worker_t *w = calloc(1, sizeof(*w));
    if (!w)
        return NULL;
    w->timeout_s = nrs_wk_env_double("NRS_WORKER_TIMEOUT", 30, 0.01, 1e6);
    w->ctl_fd = -1;
    w->restored_step = -1;
    w->join_step = -1;
    w->last_step = -1;
    w->job_step = -1;
    w->my_gpu = -1;
    return w;
}

static int init_spec(nrs_worker_t **out, const nrs_spec_t *spec)
{
    nrs_worker_t *w = worker_new();
    *out = w;
    if (!w)
        return nrs_wk_seterr(NULL, NRS_ERR_NOMEM, "nrs_worker_init: out of memory");
    if (spec)
        w->spec = *spec;
    const char *jn = getenv("NEREUS_JOIN");
    w->joiner = jn && *jn && strcmp(jn, "0");
    const char *ck = getenv("NEREUS_CHECKPOINT_DIR");
    if (ck && *ck && !(w->ckpt_dir = strdup(ck)))
        return nrs_wk_seterr(w, NRS_ERR_NOMEM, "out of memory");
    int rc = join(w);
    if (!rc && (!(w->perm = calloc((size_t)w->n + 1, sizeof(int))) ||
                !(w->leaving = calloc((size_t)w->n + 1, 1)) ||
                !(w->gone = calloc((size_t)w->n + 1, 1)) ||
                !(w->dead = calloc((size_t)w->n + 1, 1)) ||
                !(w->waiting = calloc((size_t)w->n + 1, 1)) || nrs_wk_agree_mem(w, w->n)))
        rc = nrs_wk_seterr(w, NRS_ERR_NOMEM, "out of memory");
    nrs_wk_perm_identity(w);
    if (!rc)
        ctl_connect(w);
    /* Collectives: through the controller when this rank has one (every rank
     * of a job does or none), since a launcher's PMIx fences may not survive
     * a resize (Slurm 22.05's pmix plugin fails them once nodes left the
     * step); NRS_WORKER_COLL=pmix|controller overrides. */
    const char *coll = getenv("NRS_WORKER_COLL");
    w->coll_ctl = w->ctl_fd >= 0 && w->n > 1 && !(coll && !strcmp(coll, "pmix"));
    if (!rc && !w->joiner && w->n > 1 && w->r && !nrs_rdv_is_singleton(w->r))
        rc = coll_choice(w);
    if (!rc && w->joiner) {
        w->coll_ctl = 1;
        rc = nrs_wk_join_world(w);
    }
    return rc;
}

/* An init that failed: its message outlives the handle (last_error(NULL)). */
static int init_failed(nrs_worker_t *w, int rc)
{
    if (rc && w) {
        nrs_wk_seterr(NULL, rc, "%s", w->err);
        w->init_rc = rc;
        snprintf(w->init_err, sizeof w->init_err, "%s", w->err[0] ? w->err
                 : nrs_worker_strerror(rc));
        w->have_plan = 0; /* a joiner's plan, taken before its world failed: not usable */
    }
    return rc;
}

int nrs_worker_init_spec(nrs_worker_t **out, const nrs_spec_t *spec)
{
    if (!out)
        return nrs_wk_seterr(NULL, NRS_ERR_INVAL, "nrs_worker_init_spec: out is NULL");
    int rc = init_spec(out, spec);
    return init_failed(*out, rc);
}

/* nrs_worker_init and _emulated: the spec from spec_path, else $NEREUS_SPEC,
 * scaled down by its runtime.emulation_scale when emulated, as nereus-worker
 * runs it: every rank of a job must build the same graphs. */
static int init_path(nrs_worker_t **out, const char *fn, const char *spec_path, int emulated)
{
    nrs_spec_t s, small;
    char err[512];
    if (!out)
        return nrs_wk_seterr(NULL, NRS_ERR_INVAL, "%s: out is NULL", fn);
    *out = NULL;
    if (!spec_path)
        spec_path = getenv("NEREUS_SPEC");
    if (!spec_path)
        snprintf(err, sizeof err, "no job spec: pass a path or set NEREUS_SPEC");
    if (!spec_path || nrs_spec_load(spec_path, &s, err, sizeof err)) {
        if (!(*out = worker_new())) /* a handle that says why */
            return nrs_wk_seterr(NULL, NRS_ERR_NOMEM, "%s: out of memory", fn);
        return init_failed(*out, nrs_wk_seterr(*out, NRS_ERR_SPEC, "%s", err));
    }
    if (emulated)
        nrs_emu_scale_spec(&s, s.runtime.emulation_scale, &small);
    return nrs_worker_init_spec(out, emulated ? &small : &s);
}

int nrs_worker_init(nrs_worker_t **out, const char *spec_path)
{
    return init_path(out, "nrs_worker_init", spec_path, 0);
}

int nrs_worker_init_emulated(nrs_worker_t **out, const char *spec_path)
{
    return init_path(out, "nrs_worker_init_emulated", spec_path, 1);
}

const char *nrs_worker_last_error(const nrs_worker_t *w) { return w ? w->err : tls_err; }
int nrs_worker_rank(const nrs_worker_t *w) { return w ? w->me : nrs_wk_nohandle(__func__); }
int nrs_worker_size(const nrs_worker_t *w) { return w ? w->n : nrs_wk_nohandle(__func__); }

int nrs_worker_is_singleton(const nrs_worker_t *w)
{
    if (!w) {
        nrs_wk_nohandle(__func__);
        return 0;
    }
    return w->r && nrs_rdv_is_singleton(w->r);
}

const char *nrs_worker_transport(const nrs_worker_t *w)
{
    if (!w) {
        nrs_wk_nohandle(__func__);
        return "none";
    }
    return w->xport_ucx ? "ucx" : "local";
}

const char *nrs_worker_control(const nrs_worker_t *w)
{
    if (!w) {
        nrs_wk_nohandle(__func__);
        return "no handle";
    }
    return w->ctl_fd >= 0 ? "connected" : w->ctl_err[0] ? w->ctl_err : "none";
}
const char *nrs_worker_ms_name(int ms)
{
    return ms >= 0 && ms < NRS_MS_COUNT ? nrs_ms_name((nrs_ms_t)ms) : "?";
}

/* ---- finalize ----------------------------------------------------------------------- */

/* Every rank still in the job (not retired, not known dead) is done. Through
 * the controller it waits up to NRS_WORKER_FINI_TIMEOUT (s, default and at
 * least NRS_WORKER_TIMEOUT; a rank that dies does not hold it, its connection
 * closes); a rank that comes after it completed (a joiner that never got a
 * GPU ends on its own count) is answered alone by the controller, not
 * refused. Long waits here hold up transitions: a rank in finalize keeps a
 * PREPARE for later, never ACKs it. */
static int fini_barrier(nrs_worker_t *w, char *err, size_t errlen)
{
    if (!w->coll_ctl)
        return nrs_rdv_fence_survivors(w->r, NULL, 0, w->timeout_s, err, errlen);
    if (w->ctl_fd < 0)
        return 0; /* retired (or the controller is gone): nobody to wait for */
    double tmo = nrs_wk_env_double("NRS_WORKER_FINI_TIMEOUT", w->timeout_s, 0, 1e6);
    tmo = tmo < w->timeout_s ? w->timeout_s : tmo;
    tmo = tmo > NRS_GATHER_TIMEOUT_MAX / 1000.0 ? NRS_GATHER_TIMEOUT_MAX / 1000.0 : tmo;
    int *out = calloc((size_t)w->n + 1, sizeof(int)), nout = 0;
    unsigned char *got = calloc((size_t)w->n + 1, 1), none = 0;
    int rc = -1;
    if (out && got) {
        for (int i = 0; i < w->n; i++)
            if (i != w->me && (w->leaving[i] || w->gone[i] || w->dead[i]))
                out[nout++] = i;
        rc = nrs_wk_ctl_gather(w, 3ULL << 32, "fini", &none, 0, out, nout, &none, got,
                               tmo, err, errlen);
    }
    free(out);
    free(got);
    return rc;
}

int nrs_worker_finalize(nrs_worker_t *w)
{
    char err[512];
    int rc = NRS_OK;
    if (!w)
        return NRS_OK;
    nrs_wk_nccl_free(w);
    if (w->u) {
        /* A transfer still posted (an aborted run's send no peer will
         * match) is released here: its endpoint then closes forcibly and
         * its requests end as cancelled. */
        if (w->xport_ucx && w->x.ops)
            nrs_xport_ucx_cancel(&w->x);
        nrs_ucx_disconnect(w->u, 2.0);
        /* nobody tears down an endpoint another still reads from */
        if (w->r && fini_barrier(w, err, sizeof err))
            rc = nrs_wk_seterr(w, NRS_ERR_RDV, "%s", err);
        if (w->xport_ucx && w->x.ops)
            nrs_xport_ucx_detach(&w->x); /* the state is freed below, after UCX */
        nrs_ucx_fini(w->u);
        w->u = NULL;
    }
    /* Only once UCX is gone: no request of it can still read or write the
     * state's memory (its transport's mem_free does not need UCX). */
    nrs_wk_free_state(w);
    if (w->x.ops)
        nrs_xport_close(&w->x);
    nrs_rdv_fini(w->r);
    if (w->ctl_fd >= 0)
        close(w->ctl_fd);
    free(w->perm);
    free(w->leaving);
    free(w->gone);
    free(w->dead);
    free(w->waiting);
    free(w->agree_mem);
    free(w->cbuf);
    free(w->gsend);
    free(w->pend);
    free(w->ckpt_dir);
    free(w->world_pend);
    free(w->present);
    if (rc) /* the handle goes: its message stays (last_error(NULL)) */
        nrs_wk_seterr(NULL, rc, "nrs_worker_finalize: %s", w->err);
    free(w);
    return rc;
}

int nrs_worker_gpu(const nrs_worker_t *w)
{
    int rc;
    if ((rc = nrs_wk_unusable(w, __func__)))
        return rc;
    return w->have_plan ? w->my_gpu : -1;
}

int nrs_worker_plan(const nrs_worker_t *w, nrs_plan_t *out)
{
    int rc;
    if ((rc = nrs_wk_unusable(w, __func__)))
        return rc;
    if (!out || !w->have_plan)
        return nrs_wk_seterr(w, NRS_ERR_INVAL, "nrs_worker_plan: %s", !out ? "out is NULL"
                             : "no plan yet");
    *out = w->plan;
    return NRS_OK;
}
