/* The worker API (include/nereus/nereus.h, docs/worker-api.md). */
#define _GNU_SOURCE
#include <config.h>

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "ctl/client.h"
#include "ctl/proto.h"
#include "adapt/adapt.h"
#include "emu/geometry.h"
#include "emu/graph.h"
#include "emu/pattern.h"
#include "emu/xport.h"
#include "rdv/rdv.h"
#include "util/util.h"
#include "worker/ckpt.h"
#include "worker/dtrans.h"
#include "worker/worker.h"
#include "xfer/ucx.h"
#include "xfer/xport_ucx.h"
#ifdef HAVE_NCCL
#include "xfer/nccl.h"
#endif

struct nrs_worker {
    nrs_spec_t spec;
    nrs_rdv_t *r;
    nrs_ucx_t *u;
    nrs_xport_t x;
    int xport_ucx;
    int me, n;
    double timeout_s;
    nrs_plan_t plan;
    int have_plan, broken;
    nrs_emu_state_t st; /* the current plan's state, every rank's buffers */
    nrs_xmem_t *mem;    /* [st.nbuf]: this rank's (host) memory, ptr NULL elsewhere */
    void **dev;         /* [st.nbuf]: CUDA copies when mem_kind == NRS_MEM_CUDA */
    int *mine;          /* indices into st.buf of this rank's buffers */
    int nmine;
    int mem_kind, allocated;
    int cuda_dev;       /* the CUDA device this rank's state lives on */
    unsigned attempt;
    nrs_dtrans_result_t last;
    int have_last;
    /* reports */
    nrs_worker_report_t rep;
    nrs_report_fn sink;
    void *sink_arg;
    nrs_worker_report_hook_fn hook;
    void *hook_arg;
    int ctl_fd; /* control channel to nereus-controller, -1 if none */
    char ctl_err[384];
    int *perm;  /* [n]: perm[g] = rank holding GPU g of the current plan (g < total_gpus),
                 * then the ranks holding nothing, in order */
    int my_gpu; /* this rank's GPU in the current plan, -1: none */
    uint8_t *cbuf;          /* a frame from the controller */
    nrs_msg_plan_t *pend;   /* PLAN(TRANSITION) waiting for its PREPARE */
    int have_pend, retired, ponr_acked;
    unsigned ctl_epoch;     /* epoch of the transition being run for the controller */
    /* the per-step weight sync of the current epoch (nrs_emu_weight_sync) */
    nrs_emu_graph_t *sg;    /* its graph, built once per epoch */
    int *stmap;             /* [sg->nold]: train weight -> index into st.buf */
    int *sgidx;             /* [sg->nnew]: generation buffer -> index into st.buf (kept in
                             * place on a train buffer, or persistent on its own pool), -1 */
    nrs_xmem_t *sgmem;      /* [sg->nnew]: generation buffers the sync allocated (sgidx -1) */
    int synced;             /* the generation buffers hold this epoch's sync */
    unsigned sync_n, agree_n, sync_sample;
    long long sync_steps, sync_failed, sync_bytes, sync_last_bytes, sync_sampled;
    double sync_last_s, sync_total_s;
    int defer;              /* control frames: keep a PREPARE for the step's agreement */
    unsigned prep_epoch;    /* the PREPARE kept, 0: none */
    unsigned char *leaving; /* [n]: ranks that said at a step boundary they are retired */
    unsigned char *gone;    /* [n]: ranks of the plan whose agreement value never came (dead) */
    unsigned char *dead;    /* [n]: ranks out of the job for good (lost GPUs of a committed
                             * epoch, or gone): never waited for again */
    int coll_ctl;           /* collectives through the controller's GATHER, not PMIx fences */
    char *ckpt_dir;         /* checkpoints (ckpt.h), NULL: none */
    int joiner;             /* this rank came with a join step (NEREUS_JOIN) */
    unsigned world_gen;     /* generations of the world this rank is in */
    nrs_msg_world_t *world_pend; /* a WORLD read, kept for the step agreement */
    int join_step;          /* joiner: the job's step when it joined; -1 */
    unsigned agreed_world;  /* the newest world generation a rank of the plan has */
    int last_step;          /* the last step reported */
    long restored_step;     /* the last transition restored this step's checkpoint; -1 */
    unsigned char *present; /* broken: [st.nbuf] 1 = complete on some survivor (census) */
    char err[640];
};

/* The message of the last call of this thread that failed without a handle
 * to keep it (init, finalize, a NULL handle): nrs_worker_last_error(NULL).
 * Per thread: a handle is driven by one thread. */
static _Thread_local char tls_err[640];

/* Every failure says why, in w's message or (w NULL) the thread's. The
 * message is the one part of a handle that const accessors write too. */
static int seterr(const nrs_worker_t *w, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int seterr(const nrs_worker_t *w, int rc, const char *fmt, ...)
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
static int nohandle(const char *fn)
{
    return seterr(NULL, NRS_ERR_INVAL, "%s: no handle (NULL)", fn);
}

/* Once the controller retired this rank, every call but finalize says so. */
static int retired_err(nrs_worker_t *w, const char *fn)
{
    return seterr(w, NRS_ERR_RETIRED, "%s: retired by the controller (%s)", fn,
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
static const char *ucx_error(const nrs_xport_t *x) { return nrs_xport_ucx_error(x); }

static int owner_rank(void *arg, int owner)
{
    const nrs_worker_t *w = arg;
    if (w->n == 1)
        return 0; /* singleton: every GPU's memory is here (local transport) */
    if (owner < 0 || owner >= w->n)
        return -1;
    return w->perm ? w->perm[owner] : owner;
}

/* Rank r holds GPU r (a plan from nrs_worker_set_plan or the controller's HELLO answer). */
static void perm_identity(nrs_worker_t *w)
{
    for (int i = 0; w->perm && i < w->n; i++)
        w->perm[i] = i;
    w->my_gpu = w->n == 1 ? 0 : w->me;
}

static double env_double(const char *name, double dflt)
{
    const char *v = getenv(name);
    return v && *v ? atof(v) : dflt;
}

static int ctl_gather(void *arg, uint64_t key, const char *name, const void *mine, size_t len,
                      const int *out, int nout, void *all, unsigned char *got, double timeout_s,
                      char *err, size_t errlen);

/* Executor options every distributed run of this rank shares (transitions and
 * weight syncs alike). */
static void dtrans_opts(nrs_worker_t *w, nrs_dtrans_opts_t *o)
{
    nrs_dtrans_opts_init(o, w->me, w->n);
    o->owner_rank = owner_rank;
    o->owner_arg = w;
    o->timeout_s = w->timeout_s;
    o->window = (int)env_double("NRS_WORKER_WINDOW", 32);
    if (w->coll_ctl) {
        o->gather = ctl_gather;
        o->gather_arg = w;
    }
    if (w->xport_ucx) {
        o->cancel = ucx_cancel;
        o->cancel_arg = &w->x;
        o->peer_failed = ucx_dead;
        o->peer_arg = w->u;
        o->xport_error = ucx_error;
    }
}

/* The rendezvous whose failure reports speak of this job's ranks: a joiner's
 * PMIx namespace is its own step's, not the job's world. */
static nrs_rdv_t *job_rdv(const nrs_worker_t *w) { return w->joiner ? NULL : w->r; }

static int join(nrs_worker_t *w)
{
    char err[512];
    if (nrs_rdv_init(&w->r, err, sizeof err))
        return seterr(w, NRS_ERR_RDV, "%s", err);
    w->me = nrs_rdv_rank(w->r);
    w->n = nrs_rdv_size(w->r);
    if (w->joiner) { /* the world's transports come with the controller's WORLD */
        w->xport_ucx = 1;
        return 0;
    }
    const char *xp = getenv("NRS_WORKER_XPORT"); /* local | ucx; default by size */
    w->xport_ucx = xp ? !strcmp(xp, "ucx") : w->n > 1;
    if (!w->xport_ucx) {
        if (w->n > 1)
            return seterr(w, NRS_ERR_XPORT, "the local transport needs a job of one rank, "
                          "this one has %d", w->n);
        return nrs_xport_local_open(&w->x) ? seterr(w, NRS_ERR_NOMEM, "out of memory") : 0;
    }
    nrs_ucx_opts_t uo;
    nrs_ucx_opts_init(&uo);
    uo.op_timeout_s = w->timeout_s;
    const void *addr;
    size_t alen;
    void **addrs = NULL;
    size_t *lens = NULL;
    if (nrs_ucx_init(&w->u, w->me, w->n, &uo, err, sizeof err))
        return seterr(w, NRS_ERR_XPORT, "%s", err);
    nrs_rdv_set_progress(w->r, nrs_ucx_progress, w->u);
    nrs_ucx_set_probe(w->u, probe, w->r);
    nrs_ucx_address(w->u, &addr, &alen);
    if (nrs_rdv_allgather(w->r, 0, "ucx", addr, alen, &addrs, &lens, w->timeout_s, err,
                          sizeof err))
        return seterr(w, NRS_ERR_RDV, "%s", err);
    int rc = nrs_ucx_connect(w->u, addrs, lens, err, sizeof err);
    nrs_rdv_free_blobs(w->r, addrs, lens);
    if (rc)
        return seterr(w, NRS_ERR_XPORT, "%s", err);
    if (nrs_xport_ucx_open(&w->x, w->u, owner_rank, w))
        return seterr(w, NRS_ERR_NOMEM, "out of memory");
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

static void ctl_close(nrs_worker_t *w, const char *why);
static void ctl_send_failed(nrs_worker_t *w, const char *why);

static void ctl_report(nrs_worker_t *w, const nrs_worker_report_t *r)
{
    nrs_msg_report_t m;
    uint8_t buf[1024];
    char err[256];
    if (w->ctl_fd < 0)
        return;
    memset(&m, 0, sizeof m);
    m.epoch = r->epoch;
    m.step = r->step;
    m.flags = r->flags & (NRS_REPORT_MEM_HIGH | NRS_REPORT_MEM_FAILED);
    m.response_len = r->response_len;
    m.nstages = r->nstages;
    memcpy(m.ms, r->ms, sizeof m.ms);
    memcpy(m.seconds, r->seconds, sizeof m.seconds);
    int len = nrs_enc_report(buf, sizeof buf, &m);
    if (len < 0) {
        ctl_close(w, "REPORT: does not encode");
    } else if (nrs_client_send(w->ctl_fd, buf, len, err, sizeof err)) {
        char why[300];
        snprintf(why, sizeof why, "REPORT: %.280s", err);
        ctl_send_failed(w, why);
    }
}

static int join_world(nrs_worker_t *w);

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
        return seterr(w, NRS_ERR_RDV, "%s", err);
    const char *coll = getenv("NRS_WORKER_COLL");
    int allowed = !(coll && !strcmp(coll, "pmix"));
    for (int i = 0; allowed && w->ctl_fd < 0 && i < w->n; i++) {
        const char *c = l[i] == CONTACT ? (const char *)b[i] + 1 : "";
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
        return seterr(w, NRS_ERR_RDV, "%s", err);
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

/* A handle that holds nothing yet: finalize may take it as it is. */
static nrs_worker_t *worker_new(void)
{
    nrs_worker_t *w = calloc(1, sizeof(*w));
    if (!w)
        return NULL;
    w->timeout_s = env_double("NRS_WORKER_TIMEOUT", 30);
    w->ctl_fd = -1;
    w->restored_step = -1;
    w->join_step = -1;
    w->last_step = -1;
    w->my_gpu = -1;
    return w;
}

static int init_spec(nrs_worker_t **out, const nrs_spec_t *spec)
{
    nrs_worker_t *w = worker_new();
    *out = w;
    if (!w)
        return seterr(NULL, NRS_ERR_NOMEM, "nrs_worker_init: out of memory");
    if (spec)
        w->spec = *spec;
    const char *jn = getenv("NEREUS_JOIN");
    w->joiner = jn && *jn && strcmp(jn, "0");
    const char *ck = getenv("NEREUS_CHECKPOINT_DIR");
    if (ck && *ck && !(w->ckpt_dir = strdup(ck)))
        return seterr(w, NRS_ERR_NOMEM, "out of memory");
    int rc = join(w);
    if (!rc && (!(w->perm = calloc((size_t)w->n + 1, sizeof(int))) ||
                !(w->leaving = calloc((size_t)w->n + 1, 1)) ||
                !(w->gone = calloc((size_t)w->n + 1, 1)) ||
                !(w->dead = calloc((size_t)w->n + 1, 1))))
        rc = seterr(w, NRS_ERR_NOMEM, "out of memory");
    perm_identity(w);
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
        rc = join_world(w);
    }
    return rc;
}

/* An init that failed: its message outlives the handle (last_error(NULL)). */
static int init_failed(const nrs_worker_t *w, int rc)
{
    if (rc && w)
        seterr(NULL, rc, "%s", w->err);
    return rc;
}

int nrs_worker_init_spec(nrs_worker_t **out, const nrs_spec_t *spec)
{
    if (!out)
        return seterr(NULL, NRS_ERR_INVAL, "nrs_worker_init_spec: out is NULL");
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
        return seterr(NULL, NRS_ERR_INVAL, "%s: out is NULL", fn);
    *out = NULL;
    if (!spec_path)
        spec_path = getenv("NEREUS_SPEC");
    if (!spec_path)
        snprintf(err, sizeof err, "no job spec: pass a path or set NEREUS_SPEC");
    if (!spec_path || nrs_spec_load(spec_path, &s, err, sizeof err)) {
        if (!(*out = worker_new())) /* a handle that says why */
            return seterr(NULL, NRS_ERR_NOMEM, "%s: out of memory", fn);
        return init_failed(*out, seterr(*out, NRS_ERR_SPEC, "%s", err));
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
int nrs_worker_rank(const nrs_worker_t *w) { return w ? w->me : nohandle(__func__); }
int nrs_worker_size(const nrs_worker_t *w) { return w ? w->n : nohandle(__func__); }

int nrs_worker_is_singleton(const nrs_worker_t *w)
{
    if (!w) {
        nohandle(__func__);
        return 0;
    }
    return w->r && nrs_rdv_is_singleton(w->r);
}

const char *nrs_worker_transport(const nrs_worker_t *w)
{
    if (!w) {
        nohandle(__func__);
        return "none";
    }
    return w->xport_ucx ? "ucx" : "local";
}

const char *nrs_worker_control(const nrs_worker_t *w)
{
    if (!w) {
        nohandle(__func__);
        return "no handle";
    }
    return w->ctl_fd >= 0 ? "connected" : w->ctl_err[0] ? w->ctl_err : "none";
}
const char *nrs_worker_ms_name(int ms)
{
    return ms >= 0 && ms < NRS_MS_COUNT ? nrs_ms_name((nrs_ms_t)ms) : "?";
}

/* ---- state ---------------------------------------------------------------------------- */

static void sync_reset(nrs_worker_t *w)
{
    for (int j = 0; w->sg && w->sgmem && j < w->sg->nnew; j++)
        if (w->sgmem[j].ptr && w->x.ops)
            w->x.ops->mem_free(w->x.ctx, &w->sgmem[j]);
    nrs_emu_graph_free(w->sg);
    free(w->stmap);
    free(w->sgidx);
    free(w->sgmem);
    w->sg = NULL;
    w->stmap = w->sgidx = NULL;
    w->sgmem = NULL;
    w->synced = 0;
    w->sync_n = w->agree_n = 0;
    if (w->leaving)
        memset(w->leaving, 0, (size_t)w->n);
    if (w->gone)
        memset(w->gone, 0, (size_t)w->n);
}

static void free_state(nrs_worker_t *w)
{
    sync_reset(w);
    for (size_t i = 0; w->mem && i < w->st.nbuf; i++) {
        if (w->mem[i].ptr && w->x.ops)
            w->x.ops->mem_free(w->x.ctx, &w->mem[i]);
#ifdef HAVE_NCCL
        if (w->dev && w->dev[i])
            nrs_cuda_free(w->dev[i]);
#endif
    }
    free(w->mem);
    free(w->dev);
    free(w->mine);
    w->mem = NULL;
    w->dev = NULL;
    w->mine = NULL;
    w->nmine = 0;
    w->allocated = 0;
    nrs_emu_state_free(&w->st);
    memset(&w->st, 0, sizeof w->st);
}

static int buf_rank(const nrs_worker_t *w, const nrs_emu_buf_t *b)
{
    return owner_rank((void *)w, b->gpu);
}

/* The state of the current plan and which buffers are ours. */
static int index_state(nrs_worker_t *w)
{
    char err[512];
    w->st.max_gpu = -1;
    if (nrs_emu_state_build(&w->spec, &w->plan, NRS_EMU_SEL_PERSISTENT, NULL, 0, &w->st, err,
                            sizeof err))
        return seterr(w, NRS_ERR_PLAN, "%s", err);
    w->mem = calloc(w->st.nbuf + 1, sizeof(*w->mem));
    w->dev = calloc(w->st.nbuf + 1, sizeof(*w->dev));
    w->mine = calloc(w->st.nbuf + 1, sizeof(*w->mine));
    if (!w->mem || !w->dev || !w->mine)
        return seterr(w, NRS_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < w->st.nbuf; i++)
        if (buf_rank(w, &w->st.buf[i]) == w->me)
            w->mine[w->nmine++] = (int)i;
    return 0;
}

static int plan_ok(nrs_worker_t *w, const nrs_plan_t *p)
{
    if (!p)
        return seterr(w, NRS_ERR_INVAL, "no plan");
    if (w->n > 1 && p->total_gpus > w->n)
        return seterr(w, NRS_ERR_PLAN, "plan of epoch %u spans %d GPUs, the job has %d ranks",
                      p->epoch, p->total_gpus, w->n);
    return 0;
}

int nrs_worker_set_plan(nrs_worker_t *w, const nrs_plan_t *plan)
{
    int rc;
    if (!w)
        return nohandle(__func__);
    if ((rc = plan_ok(w, plan)))
        return rc;
    free_state(w);
    w->plan = *plan;
    w->have_plan = 1;
    w->broken = 0;
    w->rep.epoch = plan->epoch;
    perm_identity(w);
    return index_state(w);
}

int nrs_worker_epoch(const nrs_worker_t *w)
{
    if (!w)
        return nohandle(__func__);
    return w->have_plan ? (int)w->plan.epoch : -1;
}

/* Model-stage ms: 0 and this rank's coordinates, -1 if it does not run it. */
static int coords(const nrs_worker_t *w, int ms, int *t, int *p, int *d)
{
    if (!w->have_plan || ms < 0 || ms >= NRS_MS_COUNT || !w->plan.has[ms])
        return -1;
    const nrs_layout_t *l = &w->plan.layout[ms];
    int first = w->plan.pools[w->plan.pool_of[ms]].first_gpu;
    int idx = w->my_gpu - first;
    if (idx < 0 || idx >= l->tp * l->pp * l->dp)
        return -1;
    *d = idx / (l->tp * l->pp);
    *p = idx % (l->tp * l->pp) / l->tp;
    *t = idx % l->tp;
    return 0;
}

int nrs_worker_nroles(const nrs_worker_t *w)
{
    int n = 0, t, p, d;
    if (!w)
        return nohandle(__func__);
    for (int ms = 0; ms < NRS_MS_COUNT; ms++)
        n += !coords(w, ms, &t, &p, &d);
    return n;
}

/* An output the caller may leave NULL. */
static void put(int *out, int v)
{
    if (out)
        *out = v;
}

int nrs_worker_role(const nrs_worker_t *w, int i, int *ms, int *tp, int *pp, int *dp, int *t,
                    int *p, int *d)
{
    int ct, cp, cd;
    if (!w)
        return nohandle(__func__);
    for (int k = 0, j = i; k < NRS_MS_COUNT; k++) {
        if (coords(w, k, &ct, &cp, &cd) || j--)
            continue;
        const nrs_layout_t *l = &w->plan.layout[k];
        put(ms, k);
        put(tp, l->tp);
        put(pp, l->pp);
        put(dp, l->dp);
        put(t, ct);
        put(p, cp);
        put(d, cd);
        return NRS_OK;
    }
    return seterr(w, NRS_ERR_INVAL, "nrs_worker_role: role %d: this rank runs %d model-stage(s)%s",
                  i, nrs_worker_nroles(w), w->have_plan ? "" : " (no plan yet)");
}

int nrs_worker_group(const nrs_worker_t *w, int ms, int group, int *ranks, int max)
{
    int t, p, d, n = 0;
    if (!w)
        return nohandle(__func__);
    if (group < NRS_GROUP_TP || group > NRS_GROUP_DP)
        return seterr(w, NRS_ERR_INVAL, "nrs_worker_group: group %d: not NRS_GROUP_TP, _PP or _DP",
                      group);
    if (coords(w, ms, &t, &p, &d))
        return seterr(w, NRS_ERR_INVAL, "nrs_worker_group: model-stage %d (%s) is not run by "
                      "this rank%s", ms, nrs_worker_ms_name(ms),
                      w->have_plan ? "" : " (no plan yet)");
    if (!ranks)
        max = 0; /* the count only */
    const nrs_layout_t *l = &w->plan.layout[ms];
    int first = w->plan.pools[w->plan.pool_of[ms]].first_gpu;
    int len = group == NRS_GROUP_TP ? l->tp : group == NRS_GROUP_PP ? l->pp : l->dp;
    for (int k = 0; k < len; k++) {
        int tt = group == NRS_GROUP_TP ? k : t, pp = group == NRS_GROUP_PP ? k : p,
            dd = group == NRS_GROUP_DP ? k : d;
        if (n < max)
            ranks[n] = w->n == 1 ? first + dd * l->tp * l->pp + pp * l->tp + tt
                                 : owner_rank((void *)w, first + dd * l->tp * l->pp + pp * l->tp + tt);
        n++;
    }
    return n;
}

#ifdef HAVE_NCCL
/* This rank's node-local index: $NRS_CUDA_DEVICE (a device, not an index),
 * else the launcher's local rank (Slurm, torchrun, Open MPI), else -1. */
static long local_index(int *is_device)
{
    static const char *const vars[] = {"NRS_CUDA_DEVICE", "SLURM_LOCALID", "LOCAL_RANK",
                                       "OMPI_COMM_WORLD_LOCAL_RANK"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        char *end;
        long x = v && *v ? strtol(v, &end, 10) : -1;
        if (v && *v && !*end && x >= 0) {
            *is_device = i == 0;
            return x;
        }
    }
    return -1;
}

/* A GPU for this rank: the only one it sees (a launcher that binds one GPU
 * per task), else the one its local rank names (device = local rank mod the
 * GPUs seen, so the ranks of a node spread over its GPUs, not all on 0). */
static int cuda_ok(nrs_worker_t *w, char *why, size_t len)
{
    int n = 0, is_device = 0;
    if (nrs_cuda_device_count(&n, why, len) || n < 1)
        return 0;
    long local = local_index(&is_device);
    if (is_device && local >= n) {
        snprintf(why, len, "NRS_CUDA_DEVICE=%ld, but %d GPU(s) are visible", local, n);
        return 0;
    }
    w->cuda_dev = n == 1 || local < 0 ? 0 : (int)(local % n);
    return 1;
}
#endif

int nrs_worker_alloc_state(nrs_worker_t *w, int mem, int fill)
{
    if (!w)
        return nohandle(__func__);
    if (!w->have_plan || w->allocated || w->broken)
        return seterr(w, NRS_ERR_INVAL, "nrs_worker_alloc_state: %s",
                      w->allocated ? "state already allocated" : "no usable plan");
    w->mem_kind = NRS_MEM_HOST;
    w->err[0] = '\0';
    if (mem == NRS_MEM_CUDA || mem == NRS_MEM_AUTO) {
#ifdef HAVE_NCCL
        char why[256];
        if (cuda_ok(w, why, sizeof why))
            w->mem_kind = NRS_MEM_CUDA;
        else if (mem == NRS_MEM_CUDA)
            return seterr(w, NRS_ERR_UNSUPPORTED, "CUDA memory requested: %s", why);
        else
            seterr(w, NRS_OK, "state in host memory: %s", why);
#else
        if (mem == NRS_MEM_CUDA)
            return seterr(w, NRS_ERR_UNSUPPORTED, "CUDA memory requested: built without CUDA");
        seterr(w, NRS_OK, "state in host memory: built without CUDA");
#endif
    }
    for (int k = 0; k < w->nmine; k++) {
        int i = w->mine[k];
        const nrs_emu_buf_t *b = &w->st.buf[i];
        if (w->x.ops->mem_alloc(w->x.ctx, b->gpu, (size_t)b->bytes, &w->mem[i]))
            return seterr(w, NRS_ERR_NOMEM, "%lld bytes for buffer %d", (long long)b->bytes, i);
        if (fill)
            nrs_emu_pattern_fill(b, w->mem[i].ptr);
        else
            memset(w->mem[i].ptr, 0, (size_t)b->bytes);
#ifdef HAVE_NCCL
        char e[256];
        if (w->mem_kind == NRS_MEM_CUDA &&
            (nrs_cuda_alloc(w->cuda_dev, (size_t)b->bytes, &w->dev[i], e, sizeof e) ||
             nrs_cuda_copy(w->dev[i], w->mem[i].ptr, (size_t)b->bytes, 'h', e, sizeof e)))
            return seterr(w, NRS_ERR_NOMEM, "%s", e);
#endif
    }
    w->allocated = 1;
    return NRS_OK;
}

int nrs_worker_mem_kind(const nrs_worker_t *w)
{
    if (!w)
        return nohandle(__func__);
    return w->mem_kind ? w->mem_kind : NRS_MEM_HOST;
}

int nrs_worker_nbuffers(const nrs_worker_t *w)
{
    if (!w)
        return nohandle(__func__);
    return w->allocated ? w->nmine : 0;
}

/* Buffer i of this rank, or why there is none (fn: the call). */
static int buffer_ok(const nrs_worker_t *w, int i, const char *fn)
{
    if (!w)
        return nohandle(fn);
    if (!w->allocated)
        return seterr(w, NRS_ERR_INVAL, "%s: buffer %d: no state allocated", fn, i);
    if (i < 0 || i >= w->nmine)
        return seterr(w, NRS_ERR_INVAL, "%s: buffer %d: this rank holds %d buffer(s)", fn, i,
                      w->nmine);
    return NRS_OK;
}

/* Where state buffer k lives: device memory under NRS_MEM_CUDA. */
static char *buf_addr(const nrs_worker_t *w, int k)
{
    return w->mem_kind == NRS_MEM_CUDA ? w->dev[k] : w->mem[k].ptr;
}

int nrs_worker_buffer(const nrs_worker_t *w, int i, void **ptr, long long *bytes)
{
    int rc = buffer_ok(w, i, __func__);
    if (rc)
        return rc;
    int k = w->mine[i];
    if (ptr)
        *ptr = buf_addr(w, k);
    if (bytes)
        *bytes = w->st.buf[k].bytes;
    return NRS_OK;
}

int nrs_worker_buffer_desc(const nrs_worker_t *w, int i, int *role, int *tensor, int *kind,
                           int *r0, int *r1, int *c0, int *c1, int *esize)
{
    int rc = buffer_ok(w, i, __func__);
    if (rc)
        return rc;
    const nrs_emu_buf_t *b = &w->st.buf[w->mine[i]];
    put(role, b->role);
    put(tensor, b->tensor);
    put(kind, b->kind);
    put(r0, b->box.r0);
    put(r1, b->box.r1);
    put(c0, b->box.c0);
    put(c1, b->box.c1);
    put(esize, b->esize);
    return NRS_OK;
}

int nrs_worker_buffer_layer(const nrs_worker_t *w, int i, int layer, void **ptr, int *rows,
                            int *cols, long long *pitch, int *r0, int *c0)
{
    int rc = buffer_ok(w, i, __func__);
    if (rc)
        return rc;
    int k = w->mine[i];
    const nrs_emu_buf_t *b = &w->st.buf[k];
    nrs_emu_rect_t in, local;
    if (!nrs_emu_layer_part(&w->spec.models[b->role], b->tensor, &b->box, layer, &in, &local))
        return seterr(w, NRS_ERR_INVAL, "%s: buffer %d holds no part of layer %d", __func__, i,
                      layer);
    int64_t width = b->box.c1 - b->box.c0;
    if (ptr) {
        char *base = buf_addr(w, k);
        *ptr = base ? base + ((in.r0 - b->box.r0) * width + (in.c0 - b->box.c0)) * b->esize
                    : NULL;
    }
    put(rows, in.r1 - in.r0);
    put(cols, in.c1 - in.c0);
    if (pitch)
        *pitch = width * b->esize;
    put(r0, local.r0);
    put(c0, local.c0);
    return NRS_OK;
}

/* CUDA state: the host copies are what the transports move. */
static int sync_host(nrs_worker_t *w, char dir)
{
#ifdef HAVE_NCCL
    char e[256];
    for (int k = 0; w->mem_kind == NRS_MEM_CUDA && k < w->nmine; k++) {
        int i = w->mine[k];
        size_t n = (size_t)w->st.buf[i].bytes;
        if (!w->dev[i] && dir == 'h' && nrs_cuda_alloc(w->cuda_dev, n, &w->dev[i], e, sizeof e))
            return seterr(w, NRS_ERR_NOMEM, "%s", e);
        if (dir == 'd' ? nrs_cuda_copy(w->mem[i].ptr, w->dev[i], n, 'd', e, sizeof e)
                       : nrs_cuda_copy(w->dev[i], w->mem[i].ptr, n, 'h', e, sizeof e))
            return seterr(w, NRS_ERR_XPORT, "%s", e);
    }
#else
    (void)w, (void)dir;
#endif
    return 0;
}

/* Counts the caller may leave NULL: written where given, zero first. */
static void counts(long long *verified, long long *mismatches, long long v, long long m)
{
    if (verified)
        *verified = v;
    if (mismatches)
        *mismatches = m;
}

int nrs_worker_verify_state(const nrs_worker_t *w, long long *verified, long long *mismatches)
{
    int64_t maxb = 1;
    long long v = 0, m = 0;
    int rc;
    counts(verified, mismatches, 0, 0);
    if (!w)
        return nohandle(__func__);
    if (!w->allocated)
        return seterr(w, NRS_ERR_INVAL, "nrs_worker_verify_state: no state allocated");
    for (int k = 0; k < w->nmine; k++)
        if (w->st.buf[w->mine[k]].bytes > maxb)
            maxb = w->st.buf[w->mine[k]].bytes;
    unsigned char *scratch = malloc((size_t)maxb);
    if (!scratch)
        return seterr(w, NRS_ERR_NOMEM, "nrs_worker_verify_state: out of memory");
    if ((rc = sync_host((nrs_worker_t *)w, 'd'))) {
        free(scratch);
        return rc;
    }
    for (int k = 0; k < w->nmine; k++) {
        const nrs_emu_buf_t *b = &w->st.buf[w->mine[k]];
        const void *p = w->mem[w->mine[k]].ptr;
        v++;
        if (!p || nrs_emu_checksum(p, (size_t)b->bytes) != nrs_emu_pattern_checksum(b, scratch))
            m++;
    }
    free(scratch);
    counts(verified, mismatches, v, m);
    return m ? seterr(w, NRS_ERR_VERIFY, "nrs_worker_verify_state: %lld of %lld shard(s) do not "
                      "match the pattern", m, v) : NRS_OK;
}

/* ---- reports ------------------------------------------------------------------------ */

void nrs_worker_set_report_hook(nrs_worker_t *w, nrs_worker_report_hook_fn fn, void *arg)
{
    if (!w) {
        nohandle(__func__);
        return;
    }
    w->hook = fn;
    w->hook_arg = arg;
}

int nrs_worker_set_report_sink(nrs_worker_t *w, nrs_report_fn fn, void *arg)
{
    if (!w)
        return nohandle(__func__);
    w->sink = fn;
    w->sink_arg = arg;
    return NRS_OK;
}

int nrs_worker_report_stage(nrs_worker_t *w, int ms, double seconds)
{
    if (!w)
        return nohandle(__func__);
    if (ms < 0 || ms >= NRS_MS_COUNT)
        return seterr(w, NRS_ERR_INVAL, "nrs_worker_report_stage: model-stage %d: not an "
                      "nrs_ms_t (0..%d)", ms, NRS_MS_COUNT - 1);
    if (!(seconds >= 0))
        return seterr(w, NRS_ERR_INVAL, "nrs_worker_report_stage: %s: %g seconds",
                      nrs_worker_ms_name(ms), seconds);
    for (int i = 0; i < w->rep.nstages; i++)
        if (w->rep.ms[i] == ms) {
            w->rep.seconds[i] += seconds; /* the stage ran again this step */
            return NRS_OK;
        }
    w->rep.ms[w->rep.nstages] = (uint8_t)ms;
    w->rep.seconds[w->rep.nstages++] = seconds;
    return NRS_OK;
}

int nrs_worker_report_memory(nrs_worker_t *w, long long used_bytes, long long cap_bytes,
                             int alloc_failed)
{
    if (!w)
        return nohandle(__func__);
    if (used_bytes < 0 || cap_bytes < 0)
        return seterr(w, NRS_ERR_INVAL, "nrs_worker_report_memory: %lld bytes used of %lld: "
                      "negative", used_bytes, cap_bytes);
    w->rep.mem_used = used_bytes > w->rep.mem_used ? used_bytes : w->rep.mem_used;
    w->rep.mem_cap = cap_bytes;
    if (cap_bytes && used_bytes * 100 >= cap_bytes * 95)
        w->rep.flags |= 1u;
    if (alloc_failed)
        w->rep.flags |= 2u;
    return NRS_OK;
}

static void file_sink(const char *json)
{
    const char *f = getenv("NEREUS_REPORT_FILE");
    FILE *fp = f ? fopen(f, "a") : NULL;
    if (fp) {
        fprintf(fp, "%s\n", json);
        fclose(fp);
    }
}

int nrs_worker_report_step(nrs_worker_t *w, int step, double response_len)
{
    if (!w)
        return nohandle(__func__);
    if (step < 0 || !(response_len >= 0))
        return seterr(w, NRS_ERR_INVAL, "nrs_worker_report_step: step %d, response length %g: "
                      "negative", step, response_len);
    nrs_worker_report_t *r = &w->rep;
    char json[2048];
    w->last_step = step;
    r->rank = w->me;
    r->epoch = w->have_plan ? w->plan.epoch : 0;
    r->step = (uint32_t)step;
    r->response_len = response_len;
    int l = snprintf(json, sizeof json, "{\"type\":\"report\",\"rank\":%d,\"epoch\":%u,\"step\":%u,"
                     "\"flags\":%u,\"response_len\":%.6g,\"mem_used\":%lld,\"mem_cap\":%lld,"
                     "\"stages\":{", r->rank, r->epoch, r->step, r->flags, r->response_len,
                     r->mem_used, r->mem_cap);
    for (int i = 0; i < r->nstages && l < (int)sizeof json; i++)
        l += snprintf(json + l, sizeof json - (size_t)l, "%s\"%s\":%.9g", i ? "," : "",
                      nrs_ms_name((nrs_ms_t)r->ms[i]), r->seconds[i]);
    if (l < (int)sizeof json)
        snprintf(json + l, sizeof json - (size_t)l, "}}");
    if (w->hook)
        w->hook(w->hook_arg, r);
    ctl_report(w, r);
    if (w->sink)
        w->sink(w->sink_arg, json);
    else
        file_sink(json);
    memset(r, 0, sizeof(*r));
    return NRS_OK;
}

/* ---- transitions ------------------------------------------------------------------- */

/* NRS_WORKER_KILL=RANK:OPS (SIGKILL after OPS of its ops) or RANK:ponr (right
 * after the point-of-no-return vote): the tests' failure injection. */
static int64_t kill_hook(const nrs_worker_t *w)
{
    const char *k = getenv("NRS_WORKER_KILL");
    char *end;
    if (!k || strtol(k, &end, 10) != w->me || *end != ':')
        return -1;
    return !strcmp(end + 1, "ponr") ? -2 : strtoll(end + 1, NULL, 10);
}

/* A transition to next. gpu_map/lost: the controller's resize (survivors first,
 * adapt.h nrs_adapt_gpu_map), NULL/0 for none; ctl: the control channel runs
 * the PONR (ACK PREPARE, wait for COMMIT or ABORT). */
static int ctl_ponr(void *arg, char *why, size_t whylen);

static int restore(nrs_worker_t *w, const nrs_plan_t *next, const int *nperm, const int *out,
                   int nout);

static int do_transition(nrs_worker_t *w, const nrs_plan_t *next, const int *gpu_map,
                         const int *lost, int nlost, int ctl)
{
    char err[512];
    int rc;
    /* after a failure past the point of no return only a restore from a checkpoint
     * (a controller's transition) can make the state whole again */
    int recover = w->broken && ctl && (w->ckpt_dir || w->present);
    if (!w->have_plan || !w->allocated || (w->broken && !recover))
        return seterr(w, NRS_ERR_INVAL, w->broken ? "an earlier transition failed past its "
                      "point of no return (no checkpoint to restore)" : "no plan or no state");
    if ((rc = plan_ok(w, next)))
        return rc;
    if (next->epoch <= w->plan.epoch)
        return seterr(w, NRS_ERR_PLAN, "epoch %u is not after the current %u", next->epoch,
                      w->plan.epoch);
    nrs_emu_opts_t eo;
    nrs_emu_opts_init(&eo);
    eo.chunk_bytes = (int64_t)env_double("NRS_WORKER_CHUNK", 0);
    eo.gpu_map = gpu_map;
    eo.ngpu_map = gpu_map ? next->total_gpus : 0;
    eo.lost = lost;
    eo.nlost = nlost;
    /* a partial state: what no survivor holds complete is lost too (the census
     * told every rank the same); the rest is rebuilt from replicas */
    unsigned char *missing = NULL;
    if (w->broken && w->present && (missing = calloc(w->st.nbuf + 1, 1))) {
        for (size_t i = 0; i < w->st.nbuf; i++)
            missing[i] = !w->present[i];
        eo.missing = missing;
        eo.nmissing = w->st.nbuf;
    }
    int out_ranks[NRS_PROTO_MAX_LOST], nout = 0;
    int *nperm = calloc((size_t)w->n + 1, sizeof(int)), np = 0;
    if (!nperm)
        return seterr(w, NRS_ERR_NOMEM, "out of memory");
    /* The new numbering: GPU i of next is physical GPU gpu_map[i] of the current plan. */
    char *used = calloc((size_t)w->n + 1, 1);
    for (int i = 0; used && i < next->total_gpus; i++) {
        int phys = gpu_map ? gpu_map[i] : i;
        int r = phys >= 0 && phys < w->n ? (w->perm ? w->perm[phys] : phys) : -1;
        if (w->n == 1)
            r = 0;
        if (r < 0 || (w->n > 1 && used[r])) {
            free(used);
            free(nperm);
            return seterr(w, NRS_ERR_PLAN, "GPU %d of epoch %u has no rank of this job", i,
                          next->epoch);
        }
        used[r] = 1;
        if (np < w->n)
            nperm[np++] = r;
    }
    for (int i = 0; used && w->n > 1 && i < nlost; i++) {
        int r = lost[i] >= 0 && lost[i] < w->n && w->perm ? w->perm[lost[i]] : -1;
        if (r == w->me) {
            free(used);
            free(nperm);
            return seterr(w, NRS_ERR_PLAN, "this rank's GPU %d is lost in epoch %u", lost[i],
                          next->epoch);
        }
        if (r >= 0 && nout < NRS_PROTO_MAX_LOST)
            out_ranks[nout++] = r;
    }
    /* and the ranks the step agreement found dead or leaving (they hold no GPU of
     * the current plan any more: e.g. killed by a shrink two epochs ago) */
    for (int r = 0; used && w->n > 1 && r < w->n; r++) {
        int dup = r == w->me || used[r] || !(w->gone[r] || w->leaving[r] || w->dead[r]);
        for (int i = 0; !dup && i < nout; i++)
            dup = out_ranks[i] == r;
        if (!dup && nout < NRS_PROTO_MAX_LOST)
            out_ranks[nout++] = r;
    }
    for (int r = 0; used && r < w->n && w->n > 1; r++)
        if (!used[r])
            nperm[np++] = r;
    if (!used) {
        free(nperm);
        return seterr(w, NRS_ERR_NOMEM, "out of memory");
    }
    free(used);
    nrs_emu_graph_t *g = NULL;
    int grc = nrs_emu_transition(&w->spec, &w->plan, next, &eo, &g, err, sizeof err);
    w->restored_step = -1;
    free(missing);
    if (grc == NRS_EMU_ELOST && ctl && w->ckpt_dir) {
        nrs_emu_graph_free(g);
        rc = restore(w, next, nperm, out_ranks, nout);
        free(nperm);
        return rc;
    }
    if (grc) {
        nrs_emu_graph_free(g);
        free(nperm);
        return seterr(w, NRS_ERR_PLAN, "transition %u -> %u: %s", w->plan.epoch, next->epoch,
                      grc == NRS_EMU_ELOST ? "state lost on every replica" : err);
    }
    if ((size_t)g->nold != w->st.nbuf) {
        nrs_emu_graph_free(g);
        free(nperm);
        return seterr(w, NRS_ERR_PLAN, "graph and state disagree (%d vs %zu buffers)", g->nold,
                      w->st.nbuf);
    }
    if ((rc = sync_host(w, 'd'))) {
        nrs_emu_graph_free(g);
        free(nperm);
        return rc;
    }
    nrs_dtrans_opts_t o;
    dtrans_opts(w, &o);
    o.kill_after = kill_hook(w);
    o.attempt = w->attempt++;
    o.out_ranks = out_ranks;
    o.nout = nout;
    if (ctl) {
        o.at_ponr = ctl_ponr;
        o.ponr_arg = w;
    }
    nrs_xmem_t *nm = calloc((size_t)g->nnew + 1, sizeof(*nm));
    if (!nm) {
        nrs_emu_graph_free(g);
        free(nperm);
        return seterr(w, NRS_ERR_NOMEM, "out of memory");
    }
    unsigned char *present = calloc((size_t)g->nnew + 1, 1);
    o.present_out = present;
    int out = nrs_dtrans_run(g, next->epoch, &w->x, job_rdv(w), w->mem, nm, &o,
                             &w->last);
    size_t nnew = (size_t)g->nnew;
    w->have_last = 1;
    snprintf(w->err, sizeof w->err, "transition %u -> %u: %s", w->plan.epoch, next->epoch,
             w->last.msg);
    nrs_emu_graph_free(g);
    if (out == NRS_DT_ABORTED || out == NRS_DT_ERROR) {
        free(nm);
        free(nperm);
        free(present);
        return out == NRS_DT_ERROR ? NRS_ERR_NOMEM : NRS_ERR_ABORTED;
    }
    for (int i = 0; i < nout; i++) /* out of the job for good */
        w->dead[out_ranks[i]] = 1;
    /* committed or partial: the new state is what we hold now */
    for (size_t i = 0; i < w->st.nbuf; i++) /* old buffers left (partial only) */
        if (w->mem[i].ptr)
            w->x.ops->mem_free(w->x.ctx, &w->mem[i]);
    int mk = w->mem_kind;
    free_state(w);
    w->plan = *next;
    w->rep.epoch = next->epoch;
    memcpy(w->perm, nperm, sizeof(int) * (size_t)w->n);
    free(nperm);
    w->my_gpu = -1;
    for (int i = 0; i < next->total_gpus; i++)
        if (w->n == 1 || w->perm[i] == w->me)
            w->my_gpu = i;
    if (w->n == 1)
        w->my_gpu = 0;
    if ((rc = index_state(w))) {
        free(nm);
        return rc;
    }
    if (w->st.nbuf != nnew) { /* runtime/emu builds both the same way */
        free(nm);
        return seterr(w, NRS_ERR_PLAN, "new state has %zu buffers, the graph %zu", w->st.nbuf,
                      nnew);
    }
    memcpy(w->mem, nm, sizeof(*nm) * w->st.nbuf);
    free(nm);
    w->allocated = 1;
    w->mem_kind = mk;
    free(w->present);
    w->present = NULL;
    if (out == NRS_DT_PARTIAL) {
        w->broken = 1;
        if (present && nnew == w->st.nbuf)
            w->present = present, present = NULL;
        free(present);
        return NRS_ERR_PARTIAL;
    }
    free(present);
    w->broken = 0;
    return sync_host(w, 'h');
}

int nrs_worker_transition(nrs_worker_t *w, const nrs_plan_t *next)
{
    if (!w)
        return nohandle(__func__);
    return do_transition(w, next, NULL, NULL, 0, 0);
}


/* ---- checkpoints: write at a step boundary, restore when state is lost ------------- */

static int coll_gather(nrs_worker_t *w, uint64_t key, const char *name, const void *mine,
                       size_t len, const int *out, int nout, void *all, unsigned char *got,
                       char *err, size_t errlen);
static int plan_ranks(const nrs_worker_t *w, int *part);
static int plan_outsiders(const nrs_worker_t *w, const int *part, int np, bool skip_gone,
                          unsigned char *in, int *out);
static int someone_leaving(const nrs_worker_t *w);

int nrs_worker_set_checkpoint_dir(nrs_worker_t *w, const char *dir)
{
    if (!w)
        return nohandle(__func__);
    char *d = dir && *dir ? strdup(dir) : NULL;
    if (dir && *dir && !d)
        return seterr(w, NRS_ERR_NOMEM, "nrs_worker_set_checkpoint_dir: out of memory");
    free(w->ckpt_dir);
    w->ckpt_dir = d;
    return NRS_OK;
}

/* Every rank votes ok (0) or not under (key, name) among all ranks but out;
 * 0 when every participant's vote came and is 0. */
static int vote_all(nrs_worker_t *w, uint64_t key, const char *name, int32_t mine, const int *out,
                    int nout, char *why, size_t whylen)
{
    int32_t *all = calloc((size_t)w->n + 1, sizeof(int32_t));
    unsigned char *got = calloc((size_t)w->n + 1, 1), *skip = calloc((size_t)w->n + 1, 1);
    char err[384];
    int rc = -1;
    if (!all || !got || !skip) {
        snprintf(why, whylen, "out of memory");
        goto out;
    }
    if (coll_gather(w, key, name, &mine, sizeof mine, out, nout, all, got, err, sizeof err)) {
        snprintf(why, whylen, "%s", err);
        goto out;
    }
    for (int i = 0; i < nout; i++)
        skip[out[i]] = 1;
    for (int i = 0; i < w->n; i++)
        if (!skip[i] && (!got[i] || all[i])) {
            snprintf(why, whylen, "rank %d %s", i, got[i] ? "failed" : "did not vote (dead)");
            goto out;
        }
    rc = 0;
out:
    free(all);
    free(got);
    free(skip);
    return rc;
}

int nrs_worker_checkpoint(nrs_worker_t *w, long step)
{
    char err[512] = "", name[48];
    if (!w)
        return nohandle(__func__);
    if (step < 0)
        return seterr(w, NRS_ERR_INVAL, "nrs_worker_checkpoint: step %ld: negative", step);
    if (!w->ckpt_dir)
        return seterr(w, NRS_ERR_INVAL, "nrs_worker_checkpoint: no checkpoint directory "
                      "($NEREUS_CHECKPOINT_DIR)");
    if (!w->have_plan || !w->allocated || w->broken)
        return seterr(w, NRS_ERR_INVAL, "nrs_worker_checkpoint: no plan or no state");
    /* every rank of the plan takes part: a checkpoint without one is not one */
    int *part = calloc((size_t)w->n + 1, sizeof(int)), *out = calloc((size_t)w->n + 1, sizeof(int));
    unsigned char *in = calloc((size_t)w->n + 1, 1);
    void **bytes = calloc((size_t)w->nmine + 1, sizeof(void *));
    int nout = 0, rc = NRS_OK;
    if (!part || !out || !in || !bytes) {
        rc = seterr(w, NRS_ERR_NOMEM, "out of memory");
        goto done;
    }
    if (someone_leaving(w)) {
        rc = seterr(w, NRS_ERR_CHECKPOINT, "checkpoint of step %ld skipped: ranks of the plan "
                    "are retired or dead (the last one stays)", step);
        goto done;
    }
    nout = plan_outsiders(w, part, plan_ranks(w, part), false, in, out);
    if (w->n > 1 && !in[w->me])
        goto done; /* holds nothing of the plan */
    int32_t ok = 0;
    if ((rc = sync_host(w, 'd'))) { /* this rank votes no, with why */
        snprintf(err, sizeof err, "%.500s", w->err);
        ok = 1;
    }
    for (int k = 0; k < w->nmine; k++)
        bytes[k] = w->mem[w->mine[k]].ptr;
    if (!ok && nrs_ckpt_write(w->ckpt_dir, step, &w->st, w->mine, w->nmine, bytes, err, sizeof err))
        ok = 1;
    char why[512] = "";
    snprintf(name, sizeof name, "ck%ld", step);
    if (vote_all(w, (4ULL << 32) | w->plan.epoch, name, ok, out, nout, why, sizeof why)) {
        rc = seterr(w, NRS_ERR_CHECKPOINT, "checkpoint of step %ld not published: %s", step,
                    ok ? err : why);
        goto done;
    }
    int lowest = -1; /* the lowest rank of the plan publishes */
    for (int i = 0; i < w->n && lowest < 0; i++)
        if (in[i])
            lowest = i;
    if (lowest == w->me && nrs_ckpt_publish(w->ckpt_dir, step, err, sizeof err))
        rc = seterr(w, NRS_ERR_CHECKPOINT, "%s", err);
done:
    free(part);
    free(out);
    free(in);
    free(bytes);
    return rc;
}

/* A transition whose state survives nowhere: the new plan's buffers from the
 * newest checkpoint. Prepare (read everything), vote, the controller's PONR,
 * then the old state goes. Before the PONR an abort leaves it intact. */
static int restore(nrs_worker_t *w, const nrs_plan_t *next, const int *nperm, const int *out,
                   int nout)
{
    char err[512], why[512] = "", name[48];
    double t0 = nrs_now_s();
    long step = nrs_ckpt_latest(w->ckpt_dir);
    nrs_ckpt_t *ck = NULL;
    nrs_emu_state_t st2;
    memset(&st2, 0, sizeof st2);
    st2.max_gpu = -1;
    int g2 = -1, n2 = 0, rc = NRS_OK;
    int32_t ok = 0;
    for (int i = 0; i < next->total_gpus && w->n > 1; i++)
        if (nperm[i] == w->me)
            g2 = i;
    if (w->n == 1)
        g2 = 0;
    if (step < 0) {
        snprintf(err, sizeof err, "no checkpoint in %s", w->ckpt_dir);
        ok = 1;
    } else if (nrs_ckpt_open(&ck, w->ckpt_dir, step, err, sizeof err) ||
               nrs_emu_state_build(&w->spec, next, NRS_EMU_SEL_PERSISTENT, NULL, 0, &st2, err,
                                   sizeof err)) {
        ok = 1;
    }
    nrs_xmem_t *nm = calloc(st2.nbuf + 1, sizeof(*nm));
    long long nbytes = 0;
    if (!nm)
        ok = 1;
    for (size_t i = 0; !ok && i < st2.nbuf; i++) {
        const nrs_emu_buf_t *b = &st2.buf[i];
        if (b->gpu != g2)
            continue;
        if (w->x.ops->mem_alloc(w->x.ctx, b->gpu, (size_t)b->bytes, &nm[i])) {
            snprintf(err, sizeof err, "%lld bytes for buffer %zu", (long long)b->bytes, i);
            ok = 1;
        } else if (nrs_ckpt_fill(ck, b, nm[i].ptr, err, sizeof err)) {
            ok = 1;
        }
        n2++;
        nbytes += b->bytes;
    }
    nrs_ckpt_close(ck);
    snprintf(name, sizeof name, "rs%u", w->attempt++);
    if (vote_all(w, next->epoch, name, ok, out, nout, why, sizeof why) ||
        ctl_ponr(w, why, sizeof why)) {
        for (size_t i = 0; nm && i < st2.nbuf; i++)
            if (nm[i].ptr)
                w->x.ops->mem_free(w->x.ctx, &nm[i]);
        rc = seterr(w, NRS_ERR_ABORTED, "transition %u -> %u: state lost on every replica; "
                    "restore from %s%s: %s; aborted before the point of no return: old state "
                    "intact", w->plan.epoch, next->epoch, w->ckpt_dir,
                    step >= 0 ? "" : " (none)", ok ? err : why);
        goto out;
    }
    /* past the point of no return: the new state is the checkpoint's */
    for (int i = 0; i < nout; i++) /* out of the job for good */
        w->dead[out[i]] = 1;
    int mk = w->mem_kind;
    free_state(w);
    w->plan = *next;
    w->rep.epoch = next->epoch;
    memcpy(w->perm, nperm, sizeof(int) * (size_t)w->n);
    w->my_gpu = g2;
    if ((rc = index_state(w)))
        goto out;
    if (w->st.nbuf != st2.nbuf) {
        rc = seterr(w, NRS_ERR_PLAN, "restored state has %zu buffers, the plan %zu", st2.nbuf,
                    w->st.nbuf);
        goto out;
    }
    memcpy(w->mem, nm, sizeof(*nm) * st2.nbuf);
    memset(nm, 0, sizeof(*nm) * st2.nbuf);
    w->allocated = 1;
    w->mem_kind = mk;
    w->restored_step = step;
    w->broken = 0;
    free(w->present);
    w->present = NULL;
    memset(&w->last, 0, sizeof w->last);
    w->last.failed_rank = -1;
    w->last.total_s = nrs_now_s() - t0;
    w->have_last = 1;
    snprintf(w->last.msg, sizeof w->last.msg, "restored epoch %u from the checkpoint of step "
             "%ld: %d buffer(s), %lld bytes here", next->epoch, step, n2, nbytes);
    snprintf(w->err, sizeof w->err, "transition: %s", w->last.msg);
    rc = sync_host(w, 'h');
out:
    free(nm);
    nrs_emu_state_free(&st2);
    return rc;
}

/* ---- the control channel: plans, PREPARE / COMMIT / ABORT ------------------------ */

static void ctl_close(nrs_worker_t *w, const char *why)
{
    if (w->ctl_fd >= 0)
        close(w->ctl_fd);
    w->ctl_fd = -1;
    snprintf(w->ctl_err, sizeof w->ctl_err, "control channel: %.360s", why);
}

/* A send on the channel failed (why): the controller may have said why before
 * it closed (an ERROR, e.g. "rank retired", behind frames already queued), so
 * read what is left before closing; an ERROR retires this rank. */
static void ctl_send_failed(nrs_worker_t *w, const char *why)
{
    char said[NRS_PROTO_TEXT_MAX + 64];
    if (w->ctl_fd >= 0 && !nrs_client_refusal(w->ctl_fd, said, sizeof said)) {
        ctl_close(w, said);
        w->retired = 1;
        seterr(w, NRS_ERR_RETIRED, "%s", said);
        return;
    }
    ctl_close(w, why);
}

/* One frame within timeout_s (the wait for its first byte; the rest of a frame
 * must follow within NRS_WORKER_TIMEOUT): 1 with *h and the payload at
 * w->cbuf + NRS_PROTO_HDR, 0 on time-out, -1 when the channel is gone. */
static int ctl_recv(nrs_worker_t *w, double timeout_s, nrs_hdr_t *h)
{
    char err[256];
    if (w->ctl_fd < 0)
        return -1;
    if (!w->cbuf && !(w->cbuf = malloc(NRS_PROTO_HDR + NRS_PROTO_MAX_PAYLOAD)))
        return -1;
    struct pollfd p = {.fd = w->ctl_fd, .events = POLLIN};
    int pr;
    do
        pr = poll(&p, 1, timeout_s > 0 ? (int)(timeout_s * 1000) : 0);
    while (pr < 0 && errno == EINTR);
    if (pr == 0)
        return 0;
    if (pr < 0 || nrs_client_recv(w->ctl_fd, w->cbuf, NRS_PROTO_HDR + NRS_PROTO_MAX_PAYLOAD, h,
                                  w->timeout_s, err, sizeof err)) {
        ctl_close(w, pr < 0 ? "poll failed" : err);
        return -1;
    }
    return 1;
}

static void ctl_ack(nrs_worker_t *w, unsigned epoch, unsigned phase, int status, double seconds)
{
    nrs_msg_ack_t a = {epoch, phase, status, seconds > 0 ? seconds : 0};
    uint8_t buf[64];
    char err[256];
    if (w->ctl_fd >= 0 && nrs_client_send(w->ctl_fd, buf, nrs_enc_ack(buf, sizeof buf, &a), err,
                                          sizeof err))
        ctl_send_failed(w, err);
}

/* ERROR from the controller: this rank is retired (or refused). */
static int ctl_error(nrs_worker_t *w, const nrs_hdr_t *h)
{
    nrs_msg_error_t e;
    char why[NRS_PROTO_TEXT_MAX + 64];
    if (nrs_dec_error(w->cbuf + NRS_PROTO_HDR, h->length, &e, NULL, 0))
        snprintf(e.text, sizeof e.text, "(malformed ERROR)");
    snprintf(why, sizeof why, "the controller says %s: %s", nrs_perr_name((int)e.code), e.text);
    ctl_close(w, why);
    w->retired = 1;
    return seterr(w, NRS_ERR_RETIRED, "%s", why);
}

/* At the point of no return of a controller-driven transition: every rank has
 * voted yes; tell the controller, and go on only on its COMMIT. */
static int ctl_ponr(void *arg, char *why, size_t whylen)
{
    nrs_worker_t *w = arg;
    nrs_hdr_t h;
    double end = nrs_now_s() + 2 * w->timeout_s;
    ctl_ack(w, w->ctl_epoch, NRS_MSG_PREPARE, 0, 0);
    w->ponr_acked = 1;
    while (w->ctl_fd >= 0 && nrs_now_s() < end) {
        int k = ctl_recv(w, end - nrs_now_s(), &h);
        if (k <= 0)
            break;
        if (h.type == NRS_MSG_ERROR) {
            ctl_error(w, &h);
            snprintf(why, whylen, "%s", w->err);
            return -1;
        }
        if (h.type != NRS_MSG_COMMIT && h.type != NRS_MSG_ABORT)
            continue;
        nrs_msg_epoch_t m;
        if (nrs_dec_epoch(h.type, w->cbuf + NRS_PROTO_HDR, h.length, &m, NULL, 0) ||
            m.epoch != w->ctl_epoch)
            continue;
        if (h.type == NRS_MSG_COMMIT)
            return 0;
        snprintf(why, whylen, "the controller aborted epoch %u: %s", m.epoch, m.text);
        return -1;
    }
    snprintf(why, whylen, "no COMMIT from the controller for epoch %u (%s)", w->ctl_epoch,
             w->ctl_fd < 0 ? w->ctl_err : "timed out");
    return -1;
}

/* PREPARE(epoch): the transition the pending PLAN announced. */
static int ctl_prepare(nrs_worker_t *w, unsigned epoch)
{
    nrs_msg_plan_t *m = w->pend;
    if (!w->have_pend || m->plan.epoch != epoch || !w->have_plan || !w->allocated ||
        m->prev_epoch != w->plan.epoch) {
        ctl_ack(w, epoch, NRS_MSG_PREPARE, 3, 0);
        w->have_pend = 0;
        return seterr(w, NRS_ERR_PLAN, "PREPARE of epoch %u: no matching PLAN from epoch %d",
                      epoch, nrs_worker_epoch(w));
    }
    w->have_pend = 0;
    int *map = calloc((size_t)m->plan.total_gpus + 1, sizeof(int));
    if (!map) {
        ctl_ack(w, epoch, NRS_MSG_PREPARE, 2, 0);
        return seterr(w, NRS_ERR_NOMEM, "out of memory");
    }
    nrs_resize_t rz = {m->lost, m->nlost};
    nrs_adapt_gpu_map(w->plan.total_gpus, m->plan.total_gpus, m->nlost ? &rz : NULL, map);
    w->ctl_epoch = epoch;
    w->ponr_acked = 0;
    double t0 = nrs_now_s();
    int rc = do_transition(w, &m->plan, map, m->lost, m->nlost, 1);
    free(map);
    double dt = nrs_now_s() - t0;
    if (rc == NRS_OK) {
        ctl_ack(w, epoch, NRS_MSG_COMMIT, 0, dt);
        return 1;
    }
    if (rc == NRS_ERR_PARTIAL) {
        ctl_ack(w, epoch, NRS_MSG_COMMIT, 1, dt);
        return rc;
    }
    if (!w->ponr_acked) /* failed before the vote passed: the controller aborts */
        ctl_ack(w, epoch, NRS_MSG_PREPARE, rc == NRS_ERR_ABORTED ? 1 : 2, 0);
    if (w->retired)
        return NRS_ERR_RETIRED;
    return rc == NRS_ERR_ABORTED ? rc : NRS_ERR_ABORTED;
}

static int ctl_frame(nrs_worker_t *w, const nrs_hdr_t *h)
{
    char why[256];
    const uint8_t *p = w->cbuf + NRS_PROTO_HDR;
    switch (h->type) {
    case NRS_MSG_PLAN: {
        nrs_msg_plan_t *m = malloc(sizeof *m);
        int rc = NRS_OK;
        if (!m)
            return seterr(w, NRS_ERR_NOMEM, "out of memory");
        if (nrs_dec_plan(p, h->length, m, why, sizeof why)) {
            free(m);
            ctl_close(w, "malformed PLAN");
            return seterr(w, NRS_ERR_PLAN, "PLAN from the controller: %s", why);
        }
        if (m->flags & NRS_PLAN_TRANSITION) { /* kept for its PREPARE */
            free(w->pend);
            w->pend = m;
            w->have_pend = 1;
            return NRS_OK;
        }
        if (!w->have_plan) { /* the committed plan, answer to HELLO */
            rc = nrs_worker_set_plan(w, &m->plan);
            rc = rc ? rc : 2;
        } /* else: the plan we run, again */
        free(m);
        return rc;
    }
    case NRS_MSG_PREPARE: {
        nrs_msg_epoch_t m;
        if (nrs_dec_epoch(h->type, p, h->length, &m, why, sizeof why))
            return seterr(w, NRS_ERR_PLAN, "PREPARE: %s", why);
        if (w->defer) { /* nrs_worker_control_step runs it once every rank has agreed */
            w->prep_epoch = m.epoch;
            return NRS_OK;
        }
        return ctl_prepare(w, m.epoch);
    }
    case NRS_MSG_WORLD: {
        nrs_msg_world_t *m = malloc(sizeof *m);
        if (!m)
            return seterr(w, NRS_ERR_NOMEM, "out of memory");
        if (nrs_dec_world(p, h->length, m, why, sizeof why)) {
            free(m);
            ctl_close(w, "malformed WORLD");
            return seterr(w, NRS_ERR_PLAN, "WORLD from the controller: %s", why);
        }
        if (m->gen <= w->world_gen || m->rank != w->me) {
            free(m);
            return NRS_OK;
        }
        free(w->world_pend); /* switched at the next step boundary, by agreement */
        w->world_pend = m;
        return NRS_OK;
    }
    case NRS_MSG_ERROR:
        return ctl_error(w, h);
    default: /* late COMMIT/ABORT of a finished transition, status text */
        return NRS_OK;
    }
}

int nrs_worker_control_plan(nrs_worker_t *w, double timeout_s)
{
    nrs_hdr_t h;
    if (!w)
        return nohandle(__func__);
    if (w->retired)
        return retired_err(w, __func__);
    if (w->ctl_fd < 0)
        return seterr(w, NRS_ERR_INVAL, "nrs_worker_control_plan: no control channel: %s",
                      nrs_worker_control(w));
    double end = nrs_now_s() + timeout_s;
    while (!w->have_plan) {
        double left = end - nrs_now_s();
        int k = left > 0 ? ctl_recv(w, left, &h) : 0;
        if (k < 0)
            return w->retired ? retired_err(w, __func__)
                              : seterr(w, NRS_ERR_INVAL, "%s", w->ctl_err);
        if (k == 0)
            return seterr(w, NRS_ERR_PLAN, "no plan from the controller within %.1f s", timeout_s);
        int rc = ctl_frame(w, &h);
        if (rc < 0)
            return rc;
    }
    return NRS_OK;
}

int nrs_worker_control_poll(nrs_worker_t *w, double timeout_s)
{
    nrs_hdr_t h;
    int first = 1;
    if (!w)
        return nohandle(__func__);
    if (w->retired)
        return retired_err(w, __func__);
    while (w->ctl_fd >= 0) {
        int k = ctl_recv(w, first ? timeout_s : 0, &h);
        first = 0;
        if (k <= 0)
            return NRS_OK; /* nothing more, or the channel is gone: the job runs on */
        int rc = ctl_frame(w, &h);
        if (rc != NRS_OK && rc != 2)
            return rc; /* a transition ran (1, or its failure), or an error */
    }
    return NRS_OK;
}

double nrs_worker_transition_stat(const nrs_worker_t *w, int which)
{
    if (!w)
        nohandle(__func__);
    if (!w || !w->have_last) /* no transition yet: no rank failed, nothing restored */
        return which == NRS_TS_FAILED_RANK || which == NRS_TS_RESTORED_STEP ? -1 : 0;
    const nrs_dtrans_result_t *r = &w->last;
    switch (which) {
    case NRS_TS_SECONDS: return r->total_s;
    case NRS_TS_PREPARE_S: return r->prepare_s;
    case NRS_TS_EXECUTE_S: return r->execute_s;
    case NRS_TS_VOTE_S: return r->vote_s;
    case NRS_TS_COMMIT_S: return r->commit_s;
    case NRS_TS_BYTES_SENT: return (double)r->bytes_sent;
    case NRS_TS_BYTES_RECV: return (double)r->bytes_recv;
    case NRS_TS_TRANSFERS: return (double)r->xfers;
    case NRS_TS_MAX_INFLIGHT: return (double)r->max_inflight;
    case NRS_TS_FAILED_RANK: return r->failed_rank;
    case NRS_TS_PRESENT: return (double)r->present;
    case NRS_TS_REBUILDABLE: return (double)r->rebuildable;
    case NRS_TS_LOST: return (double)r->lost;
    case NRS_TS_RESTORED_STEP: return (double)w->restored_step;
    default: return 0;
    }
}

/* ---- collectives through the controller (GATHER / GATHERED) ------------------------ */

/* nrs_rdv_gather's contract over the control channel: the controller waits for
 * every participant or its channel's end, and gives all the same answer. */
static int ctl_gather(void *arg, uint64_t key, const char *name, const void *mine, size_t len,
                      const int *out, int nout, void *all, unsigned char *got, double timeout_s,
                      char *err, size_t errlen)
{
    nrs_worker_t *w = arg;
    nrs_msg_gather_t *m = calloc(1, sizeof(*m));
    uint8_t *buf = malloc(NRS_PROTO_HDR + NRS_PROTO_MAX_PAYLOAD);
    char why[256];
    int rc = -1, saved = w->defer;
    memset(got, 0, (size_t)w->n);
    if (!m || !buf) {
        snprintf(err, errlen, "gather %s: out of memory", name);
        goto out;
    }
    if (w->ctl_fd < 0) {
        snprintf(err, errlen, "gather %s: %s", name, w->ctl_err[0] ? w->ctl_err : "no control channel");
        goto out;
    }
    if (len > NRS_GATHER_DATA_MAX || nout > NRS_GATHER_MAX_OUT) {
        snprintf(err, errlen, "gather %s: %zu bytes, %d ranks out: too large for the control "
                 "channel", name, len, nout);
        goto out;
    }
    m->key = key;
    snprintf(m->name, sizeof m->name, "%s", name);
    m->timeout_ms = (uint32_t)(timeout_s > 0 ? timeout_s * 1000 : 30000);
    m->nranks = w->n;
    m->nout = nout;
    memcpy(m->out, out, sizeof(int32_t) * (size_t)nout);
    m->len = (uint32_t)len;
    m->data = mine;
    int n = nrs_enc_gather(buf, NRS_PROTO_HDR + NRS_PROTO_MAX_PAYLOAD, m);
    if (n < 0 || nrs_client_send(w->ctl_fd, buf, n, why, sizeof why)) {
        if (n >= 0)
            ctl_send_failed(w, why);
        snprintf(err, errlen, "gather %s: %s", name,
                 n < 0 ? "does not encode" : w->retired ? w->ctl_err : why);
        goto out;
    }
    /* the controller answers within timeout_s of the first contribution */
    double end = nrs_now_s() + 2 * (timeout_s > 0 ? timeout_s : 30) + 5;
    w->defer = 1; /* a PREPARE that comes meanwhile is kept for the step's agreement */
    for (;;) {
        nrs_hdr_t h;
        double left = end - nrs_now_s();
        int k = left > 0 ? ctl_recv(w, left, &h) : 0;
        if (k <= 0) {
            snprintf(err, errlen, "gather %s: %s", name,
                     k < 0 ? w->ctl_err : "no answer from the controller");
            goto out;
        }
        if (h.type == NRS_MSG_GATHERED) {
            nrs_msg_gathered_t g;
            if (nrs_dec_gathered(w->cbuf + NRS_PROTO_HDR, h.length, &g, why, sizeof why)) {
                ctl_close(w, "malformed GATHERED");
                snprintf(err, errlen, "gather %s: GATHERED: %s", name, why);
                goto out;
            }
            if (g.key != key || strcmp(g.name, name) || g.len != len)
                continue; /* an answer to an earlier gather this rank gave up on */
            for (uint32_t i = 0; i < g.count; i++) {
                int32_t r;
                const uint8_t *d;
                nrs_gathered_entry(&g, i, &r, &d);
                if (r < w->n) {
                    got[r] = 1;
                    if (len)
                        memcpy((char *)all + (size_t)r * len, d, len);
                }
            }
            if (!(h.flags & NRS_FLAG_MORE))
                break;
            continue;
        }
        if (h.type == NRS_MSG_ABORT && w->ctl_epoch && key == w->ctl_epoch) {
            nrs_msg_epoch_t a;
            if (!nrs_dec_epoch(h.type, w->cbuf + NRS_PROTO_HDR, h.length, &a, NULL, 0) &&
                a.epoch == w->ctl_epoch) {
                snprintf(err, errlen, "gather %s: the controller aborted epoch %u: %.300s", name,
                         a.epoch, a.text);
                goto out;
            }
            continue;
        }
        if (ctl_frame(w, &h) < 0 && (w->retired || w->ctl_fd < 0)) {
            snprintf(err, errlen, "gather %s: %s", name, w->ctl_err);
            goto out;
        }
    }
    rc = 0;
out:
    w->defer = saved;
    free(m);
    free(buf);
    return rc;
}

/* The collective the worker uses at step boundaries: the controller's, or
 * the PMIx rendezvous'. */
static int coll_gather(nrs_worker_t *w, uint64_t key, const char *name, const void *mine,
                       size_t len, const int *out, int nout, void *all, unsigned char *got,
                       char *err, size_t errlen)
{
    if (w->coll_ctl)
        return ctl_gather(w, key, name, mine, len, out, nout, all, got, w->timeout_s, err,
                          errlen);
    return nrs_rdv_gather(w->r, key, name, mine, len, out, nout, all, got, w->timeout_s, err,
                          errlen);
}

/* ---- a growing world: the ranks of a join step (docs/worker-api.md §7) ------------ */

enum { WORLD_BLOB = 8192, WORLD_HDR = 24 };

static void put_u32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static uint32_t get_u32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static int grow_arrays(nrs_worker_t *w, int size)
{
    int *perm = realloc(w->perm, sizeof(int) * ((size_t)size + 1));
    if (perm)
        w->perm = perm;
    unsigned char **a[3] = {&w->leaving, &w->gone, &w->dead};
    for (int k = 0; perm && k < 3; k++) {
        unsigned char *q = realloc(*a[k], (size_t)size + 1);
        if (!q)
            return -1;
        if (size > w->n)
            memset(q + w->n, 0, (size_t)(size - w->n) + 1);
        *a[k] = q;
    }
    return perm ? 0 : -1;
}

/* Every rank of the world (the first step's and the joiners) gives its
 * address and where it is; all compute the same ranks order and connect. */
static int world_switch(nrs_worker_t *w, const nrs_msg_world_t *m)
{
    char err[512], name[32];
    int size = m->size, rc = NRS_OK;
    unsigned char *mine = calloc(WORLD_BLOB, 1), *all = NULL, *got = NULL;
    void **addrs = NULL;
    size_t *lens = NULL;
    if (!mine || grow_arrays(w, size))
        return seterr(w, NRS_ERR_NOMEM, "out of memory");
    w->n = size;
    if (w->joiner && !w->u) {
        nrs_ucx_opts_t uo;
        nrs_ucx_opts_init(&uo);
        uo.op_timeout_s = w->timeout_s;
        w->me = m->rank;
        if (nrs_ucx_init(&w->u, w->me, size, &uo, err, sizeof err)) {
            rc = seterr(w, NRS_ERR_XPORT, "%s", err);
            goto out;
        }
    } else if (nrs_ucx_grow(w->u, size, err, sizeof err)) {
        rc = seterr(w, NRS_ERR_XPORT, "%s", err);
        goto out;
    }
    for (int i = 0; i < m->nout; i++)
        w->dead[m->out[i]] = 1;
    const void *addr;
    size_t alen;
    nrs_ucx_address(w->u, &addr, &alen);
    if (alen > WORLD_BLOB - WORLD_HDR) {
        rc = seterr(w, NRS_ERR_XPORT, "transport address of %zu bytes", alen);
        goto out;
    }
    put_u32(mine, (uint32_t)alen);
    put_u32(mine + 4, w->joiner && w->join_step < 0 ? 0 : (uint32_t)(w->my_gpu + 1));
    put_u32(mine + 8, w->attempt);
    put_u32(mine + 12, (uint32_t)(w->last_step + 1));
    put_u32(mine + 16, w->have_plan ? w->plan.epoch : 0);
    put_u32(mine + 20, w->joiner && w->join_step < 0 ? 1 : 0);
    memcpy(mine + WORLD_HDR, addr, alen);
    all = calloc((size_t)size, WORLD_BLOB);
    got = calloc((size_t)size + 1, 1);
    addrs = calloc((size_t)size + 1, sizeof(void *));
    lens = calloc((size_t)size + 1, sizeof(size_t));
    if (!all || !got || !addrs || !lens) {
        rc = seterr(w, NRS_ERR_NOMEM, "out of memory");
        goto out;
    }
    snprintf(name, sizeof name, "world%u", m->gen);
    if (coll_gather(w, NRS_WORLD_KEY | m->gen, name, mine, WORLD_BLOB, m->out, m->nout, all, got,
                    err, sizeof err)) {
        rc = seterr(w, NRS_ERR_RDV, "world %u: %s", m->gen, err);
        goto out;
    }
    /* ranks order: the current plan's GPUs, then the joiners, then the others */
    unsigned epoch = 0, attempt = 0;
    int step = -1, total = w->have_plan ? w->plan.total_gpus : 0, np = 0;
    unsigned char *placed = calloc((size_t)size + 1, 1);
    if (!placed) {
        rc = seterr(w, NRS_ERR_NOMEM, "out of memory");
        goto out;
    }
    for (int g = 0; g < total; g++)
        w->perm[g] = -1;
    for (int r = 0; r < size; r++) {
        const unsigned char *b = all + (size_t)r * WORLD_BLOB;
        if (!got[r]) {
            w->dead[r] = 1;
            nrs_ucx_mark_failed(w->u, r);
            continue;
        }
        uint32_t g1 = get_u32(b + 4);
        if (g1 && (int)g1 <= total) {
            w->perm[g1 - 1] = r;
            placed[r] = 1;
        }
        if (!get_u32(b + 20)) { /* a rank already in the world: its counters */
            attempt = get_u32(b + 8) > attempt ? get_u32(b + 8) : attempt;
            step = (int)get_u32(b + 12) > step ? (int)get_u32(b + 12) : step;
            epoch = get_u32(b + 16);
        }
        addrs[r] = (void *)(b + WORLD_HDR);
        lens[r] = get_u32(b);
    }
    np = total;
    for (int r = m->base; r < size; r++)
        if (!placed[r])
            w->perm[np++] = r, placed[r] = 1;
    for (int r = 0; r < size; r++)
        if (!placed[r])
            w->perm[np++] = r;
    free(placed);
    for (int g = 0; g < total; g++)
        if (w->perm[g] < 0) {
            rc = seterr(w, NRS_ERR_PLAN, "world %u: no rank holds GPU %d of epoch %u", m->gen, g,
                        w->plan.epoch);
            goto out;
        }
    if (w->have_plan && epoch && epoch != w->plan.epoch) {
        rc = seterr(w, NRS_ERR_PLAN, "world %u: the job is on epoch %u, this rank on %u", m->gen,
                    epoch, w->plan.epoch);
        goto out;
    }
    if (nrs_ucx_connect(w->u, addrs, lens, err, sizeof err)) {
        rc = seterr(w, NRS_ERR_XPORT, "world %u: %s", m->gen, err);
        goto out;
    }
    if (w->joiner && !w->x.ops) {
        w->attempt = attempt;
        w->join_step = step;
        w->my_gpu = -1;
        if (nrs_xport_ucx_open(&w->x, w->u, owner_rank, w)) {
            rc = seterr(w, NRS_ERR_NOMEM, "out of memory");
            goto out;
        }
    }
    w->world_gen = m->gen;
out:
    free(mine);
    free(all);
    free(got);
    free(addrs);
    free(lens);
    return rc;
}

/* A rank of a join step: HELLO as a joiner, wait for the world to be
 * complete (every joiner connected), join it, take the committed plan. */
static int join_world(nrs_worker_t *w)
{
    char why[256];
    nrs_hdr_t h;
    if (w->ctl_fd < 0)
        return seterr(w, NRS_ERR_INVAL, "a joining rank needs the job's controller: %s",
                      nrs_worker_control(w));
    double end = nrs_now_s() + env_double("NRS_WORKER_JOIN_TIMEOUT", 120);
    while (!w->world_gen) {
        double left = end - nrs_now_s();
        int k = left > 0 ? ctl_recv(w, left, &h) : 0;
        if (k <= 0)
            return seterr(w, NRS_ERR_RDV, "join: %s", k < 0 ? w->ctl_err
                          : "the controller never completed the world (do all ranks of the "
                            "join step run?)");
        const uint8_t *p = w->cbuf + NRS_PROTO_HDR;
        if (h.type == NRS_MSG_PLAN) {
            nrs_msg_plan_t *m = malloc(sizeof *m);
            if (m && !nrs_dec_plan(p, h.length, m, why, sizeof why) &&
                !(m->flags & NRS_PLAN_TRANSITION)) {
                w->plan = m->plan;
                w->have_plan = 1;
                w->rep.epoch = m->plan.epoch;
            }
            free(m);
        } else if (h.type == NRS_MSG_WORLD) {
            nrs_msg_world_t *m = malloc(sizeof *m);
            int rc = !m ? seterr(w, NRS_ERR_NOMEM, "out of memory")
                     : nrs_dec_world(p, h.length, m, why, sizeof why)
                         ? seterr(w, NRS_ERR_PLAN, "WORLD: %s", why)
                         : world_switch(w, m);
            free(m);
            if (rc)
                return rc;
        } else if (h.type == NRS_MSG_ERROR) {
            return ctl_error(w, &h);
        }
    }
    if (!w->have_plan)
        return seterr(w, NRS_ERR_PLAN, "join: no plan from the controller");
    free_state(w);
    w->my_gpu = -1;
    return index_state(w);
}

int nrs_worker_joined_at(const nrs_worker_t *w) { return w ? w->join_step : nohandle(__func__); }

/* ---- the step boundary and the per-step weight sync ----------------------------- */

/* Ranks of the current plan (they hold its GPUs) that have not said they leave. */
static int plan_ranks(const nrs_worker_t *w, int *part)
{
    int n = 0;
    for (int g = 0; g < w->plan.total_gpus && g < w->n; g++)
        if (w->n == 1 || !w->leaving[w->perm[g]])
            part[n++] = w->n == 1 ? 0 : w->perm[g];
    return w->n == 1 ? 1 : n;
}

/* Who is left out of a collective of the plan's ranks part[0, np): every other
 * rank, and with skip_gone the ones the step agreement found dead (never this
 * one). in[r] = 1 for the participants. Returns how many are out. */
static int plan_outsiders(const nrs_worker_t *w, const int *part, int np, bool skip_gone,
                          unsigned char *in, int *out)
{
    int nout = 0;
    for (int i = 0; i < np; i++)
        in[part[i]] = 1;
    for (int i = 0; i < w->n; i++)
        if (!in[i] || (skip_gone && w->gone[i] && i != w->me))
            out[nout++] = i;
    return nout;
}

static int someone_leaving(const nrs_worker_t *w)
{
    for (int g = 0; w->n > 1 && g < w->plan.total_gpus && g < w->n; g++)
        if (w->leaving[w->perm[g]] || w->gone[w->perm[g]])
            return 1;
    return 0;
}

#define AGREE_LEAVING 0x80000000u

/* Every rank of the plan publishes the PREPARE it holds (0: none), or that it
 * leaves (retired by the controller: AGREE_LEAVING); the largest epoch. The
 * ranks that leave are left out of every later collective of this epoch. */
static unsigned agree_prepare(nrs_worker_t *w, unsigned mine)
{
    char name[48], err[384];
    int *part = calloc((size_t)w->n + 1, sizeof(int)), *out = calloc((size_t)w->n + 1, sizeof(int));
    unsigned char *in = calloc((size_t)w->n + 1, 1), *got = calloc((size_t)w->n + 1, 1);
    uint32_t *all = calloc(2 * (size_t)w->n + 2, sizeof(uint32_t));
    unsigned best = mine;
    int nout = 0;
    if (!part || !out || !in || !got || !all)
        goto done;
    int np = plan_ranks(w, part);
    nout = plan_outsiders(w, part, np, true, in, out);
    uint64_t key = (2ULL << 32) | w->plan.epoch;
    snprintf(name, sizeof name, "ag%u", w->agree_n++);
    uint32_t v[2] = {mine, w->world_pend ? w->world_pend->gen : w->world_gen};
    w->agreed_world = v[1];
    if (coll_gather(w, key, name, v, sizeof v, out, nout, all, got, err, sizeof err))
        goto done;
    for (int i = 0; i < np; i++) {
        int r = part[i];
        if (r == w->me || w->gone[r])
            continue;
        if (!got[r]) {
            w->gone[r] = w->dead[r] = 1; /* the same on every rank: the gather collected it or not */
            continue;
        }
        if (all[2 * r + 1] > w->agreed_world)
            w->agreed_world = all[2 * r + 1];
        if (all[2 * r] & AGREE_LEAVING)
            w->leaving[r] = 1;
        else if (all[2 * r] > best)
            best = all[2 * r];
    }
done:
    free(part);
    free(out);
    free(in);
    free(got);
    free(all);
    return best & AGREE_LEAVING ? 0 : best;
}

int nrs_worker_control_step(nrs_worker_t *w)
{
    nrs_hdr_t h;
    int rc = NRS_OK;
    if (!w)
        return nohandle(__func__);
    int in_plan = w->n > 1 && w->have_plan && w->my_gpu >= 0 && w->allocated;
    if (w->retired) {
        if (in_plan && !w->leaving[w->me]) { /* told by a REPORT's refusal: say so */
            agree_prepare(w, AGREE_LEAVING);
            w->leaving[w->me] = 1;
        }
        return retired_err(w, __func__);
    }
    if (!in_plan)
        return nrs_worker_control_poll(w, 0); /* nobody to agree with */
    w->defer = 1;
    while (w->ctl_fd >= 0 && rc >= 0 && ctl_recv(w, 0, &h) > 0)
        rc = ctl_frame(w, &h);
    if (w->retired) { /* the others learn it here and stop waiting for this rank */
        w->defer = 0;
        agree_prepare(w, AGREE_LEAVING);
        w->leaving[w->me] = 1;
        return NRS_ERR_RETIRED;
    }
    if (rc < 0 && rc != NRS_ERR_PLAN) {
        w->defer = 0;
        return rc;
    }
    unsigned e = agree_prepare(w, w->prep_epoch);
    /* someone has it: it reaches this rank too (the controller sends it to all) */
    double end = nrs_now_s() + w->timeout_s;
    if (w->agreed_world > w->world_gen) { /* the world grew: everyone switches here */
        while ((!w->world_pend || w->world_pend->gen < w->agreed_world) && w->ctl_fd >= 0 &&
               nrs_now_s() < end) {
            int k = ctl_recv(w, end - nrs_now_s(), &h);
            if (k < 0)
                break;
            if (k > 0 && (rc = ctl_frame(w, &h)) < 0 && rc != NRS_ERR_PLAN)
                break;
        }
        nrs_msg_world_t *m = w->world_pend;
        w->world_pend = NULL;
        rc = m && m->gen == w->agreed_world ? world_switch(w, m)
                                             : seterr(w, NRS_ERR_RDV, "world %u: no WORLD from "
                                                      "the controller", w->agreed_world);
        free(m);
        if (rc) {
            w->defer = 0;
            return rc;
        }
    }
    while (e && w->prep_epoch != e && w->ctl_fd >= 0 && nrs_now_s() < end) {
        int k = ctl_recv(w, end - nrs_now_s(), &h);
        if (k < 0)
            break;
        if (k > 0 && (rc = ctl_frame(w, &h)) < 0 && rc != NRS_ERR_PLAN)
            break;
    }
    w->defer = 0;
    if (w->retired)
        return NRS_ERR_RETIRED;
    if (!e)
        return NRS_OK;
    if (w->prep_epoch != e) {
        w->prep_epoch = 0;
        return seterr(w, NRS_ERR_ABORTED, "epoch %u: the others have its PREPARE, this rank "
                      "has not (control: %s)", e, nrs_worker_control(w));
    }
    w->prep_epoch = 0;
    return ctl_prepare(w, e);
}

/* The persistent buffers of the actor's two engines, sorted by what a buffer
 * is, so that each of the sync graph's buffers finds its state buffer in
 * O(log n): a linear search per buffer was quadratic in the plan's size
 * (minutes per epoch at 1,024 GPUs). */
typedef struct {
    int32_t ms, gpu, role, tensor, kind;
    nrs_emu_rect_t box;
    int32_t idx;
} skey_t;

static skey_t state_key(const nrs_emu_buf_t *b, int ms, int32_t idx)
{
    return (skey_t){ms, b->gpu, b->role, b->tensor, b->kind, b->box, idx};
}

static int skey_cmp(const void *x, const void *y) /* idx last: the first of equals wins */
{
    const skey_t *a = x, *b = y;
    const int32_t ka[] = {a->ms, a->gpu, a->role, a->tensor, a->kind, a->box.r0, a->box.r1,
                          a->box.c0, a->box.c1, a->idx};
    const int32_t kb[] = {b->ms, b->gpu, b->role, b->tensor, b->kind, b->box.r0, b->box.r1,
                          b->box.c0, b->box.c1, b->idx};
    for (size_t i = 0; i < sizeof ka / sizeof ka[0]; i++)
        if (ka[i] != kb[i])
            return ka[i] < kb[i] ? -1 : 1;
    return 0;
}

static skey_t *state_index(const nrs_worker_t *w, size_t *n)
{
    skey_t *v = malloc(sizeof(*v) * (w->st.nbuf + 1));
    *n = 0;
    if (!v)
        return NULL;
    for (size_t i = 0; i < w->st.nbuf; i++) {
        int ms = w->st.eng[w->st.buf[i].engine].ms;
        if (ms == NRS_MS_ACTOR_TRAIN || ms == NRS_MS_ACTOR_GENERATE)
            v[(*n)++] = state_key(&w->st.buf[i], ms, (int32_t)i);
    }
    qsort(v, *n, sizeof(*v), skey_cmp);
    return v;
}

/* The persistent buffer of engine model-stage ms that b is, -1 if none. */
static int find_state(const skey_t *v, size_t n, const nrs_emu_buf_t *b, int ms)
{
    skey_t k = state_key(b, ms, -1); /* below every idx: the first of equals */
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (skey_cmp(&v[mid], &k) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo < n) {
        k.idx = v[lo].idx;
        if (!skey_cmp(&v[lo], &k))
            return v[lo].idx;
    }
    return -1;
}

static int sync_build(nrs_worker_t *w)
{
    char err[512];
    nrs_emu_opts_t eo;
    nrs_emu_opts_init(&eo);
    eo.chunk_bytes = (int64_t)env_double("NRS_WORKER_CHUNK", 0);
    if (nrs_emu_weight_sync(&w->spec, &w->plan, &eo, &w->sg, err, sizeof err))
        return seterr(w, NRS_ERR_PLAN, "weight sync of epoch %u: %s", w->plan.epoch, err);
    const nrs_emu_graph_t *g = w->sg;
    size_t nk = 0;
    skey_t *keys = state_index(w, &nk);
    w->stmap = calloc((size_t)g->nold + 1, sizeof(int));
    w->sgidx = calloc((size_t)g->nnew + 1, sizeof(int));
    w->sgmem = calloc((size_t)g->nnew + 1, sizeof(*w->sgmem));
    if (!keys || !w->stmap || !w->sgidx || !w->sgmem) {
        free(keys);
        return seterr(w, NRS_ERR_NOMEM, "out of memory");
    }
    for (int32_t i = 0; i < g->nold; i++)
        if ((w->stmap[i] = find_state(keys, nk, &g->buf[i].b, NRS_MS_ACTOR_TRAIN)) < 0 &&
            buf_rank(w, &g->buf[i].b) == w->me) {
            free(keys);
            return seterr(w, NRS_ERR_PLAN, "weight sync: train buffer %d is not in the state", i);
        }
    for (int32_t j = 0; j < g->nnew; j++) {
        const nrs_emu_gbuf_t *b = &g->buf[g->nold + j];
        w->sgidx[j] = b->alias >= 0 && b->alias < g->nold
                          ? w->stmap[b->alias]
                          : find_state(keys, nk, &b->b, NRS_MS_ACTOR_GENERATE);
    }
    free(keys);
    return 0;
}

static void *gen_ptr(const nrs_worker_t *w, int j)
{
    return w->sgidx[j] >= 0 ? w->mem[w->sgidx[j]].ptr : w->sgmem[j].ptr;
}

/* Generation buffer j of this rank against the pattern: 0 ok, 1 mismatch, -1 not here. */
static int gen_check(const nrs_worker_t *w, int j, unsigned char *scratch)
{
    const nrs_emu_buf_t *b = &w->sg->buf[w->sg->nold + j].b;
    if (buf_rank(w, b) != w->me)
        return -1;
    const void *p = gen_ptr(w, j);
    return !p || nrs_emu_checksum(p, (size_t)b->bytes) != nrs_emu_pattern_checksum(b, scratch);
}

static int64_t gen_max_bytes(const nrs_worker_t *w)
{
    int64_t m = 1;
    for (int32_t j = 0; j < w->sg->nnew; j++)
        if (w->sg->buf[w->sg->nold + j].b.bytes > m)
            m = w->sg->buf[w->sg->nold + j].b.bytes;
    return m;
}

int nrs_worker_weight_sync(nrs_worker_t *w)
{
    int rc;
    if (!w)
        return nohandle(__func__);
    if (!w->have_plan || !w->allocated || w->broken)
        return seterr(w, NRS_ERR_INVAL, "nrs_worker_weight_sync: %s", w->broken
                      ? "the state is partial (a transition failed past its point of no return)"
                      : "no plan or no state");
    if (!w->plan.has[NRS_MS_ACTOR_TRAIN] || !w->plan.has[NRS_MS_ACTOR_GENERATE])
        return seterr(w, NRS_ERR_PLAN, "nrs_worker_weight_sync: the plan of epoch %u has no "
                      "actor.train and actor.generate", w->plan.epoch);
    if (w->n > 1 && w->my_gpu < 0)
        return NRS_OK; /* not in the plan */
    if (someone_leaving(w)) {
        w->sync_failed++;
        return seterr(w, NRS_ERR_ABORTED, "weight sync of epoch %u: skipped, ranks of the plan "
                      "are retired or dead (waiting for the transition without them)",
                      w->plan.epoch);
    }
    if (!w->sg && (rc = sync_build(w))) {
        sync_reset(w);
        return rc;
    }
    const nrs_emu_graph_t *g = w->sg;
    nrs_xmem_t *om = calloc((size_t)g->nold + 1, sizeof(*om));
    nrs_xmem_t *nm = calloc((size_t)g->nnew + 1, sizeof(*nm));
    int *out = calloc((size_t)w->n + 1, sizeof(int)), nout = 0;
    if (!om || !nm || !out) {
        free(om);
        free(nm);
        free(out);
        return seterr(w, NRS_ERR_NOMEM, "out of memory");
    }
    for (int32_t i = 0; i < g->nold; i++)
        if (w->stmap[i] >= 0)
            om[i] = w->mem[w->stmap[i]];
    for (int g2 = w->plan.total_gpus; w->n > 1 && g2 < w->n; g2++)
        out[nout++] = w->perm[g2]; /* ranks without a GPU of the plan */
    if ((rc = sync_host(w, 'd'))) {
        free(om);
        free(nm);
        free(out);
        return rc;
    }
    nrs_dtrans_opts_t o;
    dtrans_opts(w, &o);
    /* tags: attempts 8-15 (a job's first 8 transitions use 0-7); keys: its own epoch
     * tag, one per sync, never a transition's */
    uint64_t tag = (1ULL << 63) | ((uint64_t)w->sync_n << 32) | w->plan.epoch;
    o.attempt = 8u | (w->sync_n++ & 7u);
    o.out_ranks = out;
    o.nout = nout;
    nrs_dtrans_result_t res;
    int oc = nrs_dtrans_run(g, tag, &w->x, job_rdv(w), om, nm, &o, &res);
    free(om);
    free(out);
    if (oc != NRS_DT_COMMITTED) { /* nothing old is freed by a sync: the state is intact */
        for (int32_t j = 0; j < g->nnew; j++)
            if (nm[j].ptr && !(g->buf[g->nold + j].alias >= 0))
                w->x.ops->mem_free(w->x.ctx, &nm[j]);
        free(nm);
        w->sync_failed++;
        return seterr(w, NRS_ERR_ABORTED, "weight sync of epoch %u: %s", w->plan.epoch, res.msg);
    }
    for (int32_t j = 0; j < g->nnew; j++) {
        if (g->buf[g->nold + j].alias >= 0)
            continue; /* the train buffer itself */
        if (w->sgidx[j] >= 0) { /* persistent on its own pool: the new contents replace it */
            nrs_xmem_t *m = &w->mem[w->sgidx[j]];
            if (m->ptr)
                w->x.ops->mem_free(w->x.ctx, m);
            *m = nm[j];
        } else {
            if (w->sgmem[j].ptr)
                w->x.ops->mem_free(w->x.ctx, &w->sgmem[j]);
            w->sgmem[j] = nm[j];
        }
    }
    free(nm);
    if ((rc = sync_host(w, 'h')))
        return rc;
    w->synced = 1;
    w->sync_steps++;
    w->sync_last_s = res.total_s;
    w->sync_total_s += res.total_s;
    w->sync_last_bytes = res.bytes_recv;
    w->sync_bytes += res.bytes_recv;
    /* one shard of this rank, a different one each step */
    int mine = 0;
    for (int32_t j = 0; j < g->nnew; j++)
        mine += buf_rank(w, &g->buf[g->nold + j].b) == w->me;
    if (!mine)
        return NRS_OK;
    unsigned char *scratch = malloc((size_t)gen_max_bytes(w));
    if (!scratch)
        return seterr(w, NRS_ERR_NOMEM, "nrs_worker_weight_sync: out of memory");
    int pick = (int)(w->sync_sample++ % (unsigned)mine), bad = 0;
    for (int32_t j = 0; j < g->nnew; j++) {
        if (buf_rank(w, &g->buf[g->nold + j].b) != w->me || pick--)
            continue;
        bad = gen_check(w, j, scratch) == 1;
        w->sync_sampled++;
        break;
    }
    free(scratch);
    return bad ? seterr(w, NRS_ERR_VERIFY, "weight sync of epoch %u: a generation shard does "
                        "not match", w->plan.epoch) : NRS_OK;
}

double nrs_worker_sync_stat(const nrs_worker_t *w, int which)
{
    if (!w) {
        nohandle(__func__);
        return 0;
    }
    switch (which) {
    case NRS_SS_STEPS: return (double)w->sync_steps;
    case NRS_SS_FAILED: return (double)w->sync_failed;
    case NRS_SS_BYTES: return (double)w->sync_bytes;
    case NRS_SS_LAST_S: return w->sync_last_s;
    case NRS_SS_LAST_BYTES: return (double)w->sync_last_bytes;
    case NRS_SS_TOTAL_S: return w->sync_total_s;
    case NRS_SS_SAMPLED: return (double)w->sync_sampled;
    default: return 0;
    }
}

int nrs_worker_verify_generation(nrs_worker_t *w, long long *verified, long long *mismatches)
{
    long long v = 0, m = 0;
    int rc;
    counts(verified, mismatches, 0, 0);
    if (!w)
        return nohandle(__func__);
    if (!w->sg || !w->synced)
        return seterr(w, NRS_ERR_INVAL, "nrs_worker_verify_generation: no weight sync since "
                      "epoch %d began: nothing to check", nrs_worker_epoch(w));
    unsigned char *scratch = malloc((size_t)gen_max_bytes(w));
    if (!scratch)
        return seterr(w, NRS_ERR_NOMEM, "nrs_worker_verify_generation: out of memory");
    if ((rc = sync_host(w, 'd'))) {
        free(scratch);
        return rc;
    }
    for (int32_t j = 0; j < w->sg->nnew; j++) {
        int r = gen_check(w, j, scratch);
        if (r < 0)
            continue;
        v++;
        m += r;
    }
    free(scratch);
    counts(verified, mismatches, v, m);
    return m ? seterr(w, NRS_ERR_VERIFY, "nrs_worker_verify_generation: %lld of %lld generation "
                      "shard(s) do not match the pattern", m, v) : NRS_OK;
}

/* ---- finalize ----------------------------------------------------------------------- */

/* Every rank still in the job (not retired, not known dead) is done. */
static int fini_barrier(nrs_worker_t *w, char *err, size_t errlen)
{
    if (!w->coll_ctl)
        return nrs_rdv_fence_survivors(w->r, NULL, 0, w->timeout_s, err, errlen);
    if (w->ctl_fd < 0)
        return 0; /* retired (or the controller is gone): nobody to wait for */
    int *out = calloc((size_t)w->n + 1, sizeof(int)), nout = 0;
    unsigned char *got = calloc((size_t)w->n + 1, 1), none = 0;
    int rc = -1;
    if (out && got) {
        for (int i = 0; i < w->n; i++)
            if (i != w->me && (w->leaving[i] || w->gone[i] || w->dead[i]))
                out[nout++] = i;
        rc = ctl_gather(w, 3ULL << 32, "fini", &none, 0, out, nout, &none, got, w->timeout_s,
                        err, errlen);
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
    free_state(w);
    if (w->x.ops)
        nrs_xport_close(&w->x);
    if (w->u) {
        nrs_ucx_disconnect(w->u, 2.0);
        /* nobody tears down an endpoint another still reads from */
        if (w->r && fini_barrier(w, err, sizeof err))
            rc = seterr(w, NRS_ERR_RDV, "%s", err);
        nrs_ucx_fini(w->u);
    }
    nrs_rdv_fini(w->r);
    if (w->ctl_fd >= 0)
        close(w->ctl_fd);
    free(w->perm);
    free(w->leaving);
    free(w->gone);
    free(w->dead);
    free(w->cbuf);
    free(w->pend);
    free(w->ckpt_dir);
    free(w->world_pend);
    free(w->present);
    if (rc) /* the handle goes: its message stays (last_error(NULL)) */
        seterr(NULL, rc, "nrs_worker_finalize: %s", w->err);
    free(w);
    return rc;
}

int nrs_worker_gpu(const nrs_worker_t *w)
{
    if (!w)
        return nohandle(__func__);
    return w->have_plan ? w->my_gpu : -1;
}

int nrs_worker_plan(const nrs_worker_t *w, nrs_plan_t *out)
{
    if (!w)
        return nohandle(__func__);
    if (!out || !w->have_plan)
        return seterr(w, NRS_ERR_INVAL, "nrs_worker_plan: %s", !out ? "out is NULL"
                      : "no plan yet");
    *out = w->plan;
    return NRS_OK;
}
