/* nereus-watcher: the job's allocation watcher and the launcher of its
 * controller (DESIGN §2 rule 2, §8). Started by the SPANK plugin on the job's
 * first node, as the job's user, as a child of slurmstepd (so that Slurm's
 * process tracking sees it and its child); never daemonizes.
 *
 *   nereus-watcher --socket-dir DIR --job ID --runtime-dir RT
 *                  [--interval S] [--slurm-conf F] SPEC
 *
 * 1. snapshot the job with libslurm slurm_load_job (nodes, num_nodes,
 *    resize_time, state); start RT/nereus-controller --socket-dir DIR --job ID
 *    --gpus num_nodes*gpus_per_node SPEC as its child, stderr in
 *    DIR/controller.log;
 * 2. every S seconds, load the job again; when its node list changes, send
 *    the controller a DELTA (hosts gone that slurmctld reports DOWN, FAIL or
 *    not responding: LOST; other hosts gone: REMOVE; new hosts: ADD);
 * 3. when the job ends (or on SIGTERM), stop the controller (SIGTERM, then
 *    SIGKILL after 3 s) and exit. If the controller dies, exit too.
 *
 * With --hint NODE it is instead a released node's one-shot hint (see
 * nrw_hint below): the same delta, sent from that node's job_epilog.
 *
 * Hosts are sent by name first; a controller that knows no rank on them (no
 * workers connected, or workers that name their host differently) refuses
 * with "unknown host", and we resend the same release as GPU indices: the
 * node's position in the node order of the controller's committed epoch,
 * times gpus_per_node (srun's block layout). That order is the node list the
 * controller was started with (epoch 1); the controller renumbers its GPUs
 * only when a new epoch commits (survivors keep their order, new GPUs come
 * last), so we keep the order each announced epoch will have and adopt it
 * once a reply shows that epoch committed. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <slurm/slurm.h>
#include <slurm/slurm_errno.h>

#include "ctl/client.h"
#include "ctl/proto.h"
#include "nereus/spec.h"

enum { NRW_MAX_NODES = 4096, NRW_HOST_MAX = NRS_PROTO_STR_MAX };

typedef struct {
    char names[NRW_MAX_NODES][NRW_HOST_MAX];
    int n;
} nrw_hosts_t;

typedef struct {
    const char *socket_dir, *job_str, *runtime_dir, *slurm_conf, *spec_path;
    const char *tcp; /* the controller also listens there (--tcp), NULL: not */
    uint32_t job_id;
    double interval;
    int gpus_per_node;
    pid_t ctl;
    nrw_hosts_t base;    /* node order the controller's GPU indices follow: */
    unsigned base_epoch; /* ... those of its committed epoch base_epoch */
    nrw_hosts_t order;   /* node order after every delta sent so far */
    nrw_hosts_t next;    /* the order of epoch next_epoch, announced, */
    unsigned next_epoch; /* not yet committed (0: none) */
    nrw_hosts_t current; /* the allocation as the controller counts it */
    time_t resize_time;
    nrw_hosts_t tried;     /* the allocation of a change not all applied, */
    int retries;           /* ... sent that many times (0: none pending) */
    double retry_at;       /* ... to be sent again then (nrw_now_ms) */
    double recv_timeout;   /* seconds to wait for a DELTA_REPLY */
    const char *hint_node; /* --hint NODE: a released node's hint, not the watcher */
} nrw_t;

static volatile sig_atomic_t nrw_stop;
static char nrw_prefix[160]; /* "hint from n3 (task_exit): " */
static FILE *nrw_also;       /* hint: the job's watcher.log too */

static void nrw_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void nrw_log(const char *fmt, ...)
{
    char ts[32];
    time_t now = time(NULL);
    struct tm tm;
    va_list ap;

    strftime(ts, sizeof(ts), "%Y-%m-%dT%H:%M:%S", localtime_r(&now, &tm));
    for (FILE *f = stderr; f != NULL; f = f == stderr ? nrw_also : NULL) {
        fprintf(f, "%s nereus-watcher[%d]: %s", ts, (int)getpid(), nrw_prefix);
        va_start(ap, fmt);
        vfprintf(f, fmt, ap);
        va_end(ap);
        fputc('\n', f);
        fflush(f);
    }
}

static void nrw_on_signal(int sig)
{
    nrw_stop = sig;
}

/* The signals that stop the watcher (nrw_on_signal). */
static void nrw_stop_signals(sigset_t *set)
{
    sigemptyset(set);
    sigaddset(set, SIGTERM);
    sigaddset(set, SIGINT);
    sigaddset(set, SIGHUP);
}

/* ---- the job, from slurmctld ------------------------------------------------ */

static int nrw_hosts_parse(const char *list, nrw_hosts_t *out)
{
    hostlist_t hl = slurm_hostlist_create(list ? list : "");
    char *h;

    out->n = 0;
    if (hl == NULL)
        return -1;
    while ((h = slurm_hostlist_shift(hl)) != NULL) {
        if (out->n < NRW_MAX_NODES)
            snprintf(out->names[out->n++], NRW_HOST_MAX, "%s", h);
        free(h);
    }
    slurm_hostlist_destroy(hl);
    return 0;
}

static int nrw_hosts_find(const nrw_hosts_t *h, const char *name)
{
    for (int i = 0; i < h->n; i++)
        if (strcmp(h->names[i], name) == 0)
            return i;
    return -1;
}

static const char *nrw_state_name(uint32_t state)
{
    static const char *const names[] = {"PENDING",  "RUNNING", "SUSPENDED", "COMPLETED",
                                        "CANCELLED", "FAILED",  "TIMEOUT",   "NODE_FAIL",
                                        "PREEMPTED", "BOOT_FAIL", "DEADLINE", "OOM"};
    uint32_t base = state & JOB_STATE_BASE;

    if (state & JOB_COMPLETING)
        return "COMPLETING";
    return base < sizeof(names) / sizeof(names[0]) ? names[base] : "UNKNOWN";
}

typedef enum { NRW_JOB_RUNNING, NRW_JOB_ENDED, NRW_JOB_UNKNOWN } nrw_job_state_t;

/* Load the job: RUNNING with *hosts filled, ENDED, or UNKNOWN (slurmctld did
 * not answer: try again next time). */
static nrw_job_state_t nrw_load(nrw_t *w, nrw_hosts_t *hosts, time_t *resize_time, char *state,
                                size_t n)
{
    job_info_msg_t *msg = NULL;
    nrw_job_state_t rc = NRW_JOB_UNKNOWN;

    snprintf(state, n, "unknown");
    if (slurm_load_job(&msg, w->job_id, SHOW_DETAIL) != SLURM_SUCCESS) {
        int e = slurm_get_errno();
        snprintf(state, n, "%s", slurm_strerror(e));
        return e == ESLURM_INVALID_JOB_ID ? NRW_JOB_ENDED : NRW_JOB_UNKNOWN;
    }
    if (msg == NULL || msg->record_count < 1)
        goto out;
    slurm_job_info_t *j = &msg->job_array[0];
    uint32_t base = j->job_state & JOB_STATE_BASE;
    snprintf(state, n, "%s", nrw_state_name(j->job_state));
    if ((j->job_state & JOB_COMPLETING) || (base != JOB_RUNNING && base != JOB_SUSPENDED)) {
        rc = NRW_JOB_ENDED;
        goto out;
    }
    if (nrw_hosts_parse(j->nodes, hosts) != 0)
        goto out;
    if (hosts->n != (int)j->num_nodes)
        nrw_log("job %u: num_nodes %u but %d hosts in '%s'", w->job_id, j->num_nodes, hosts->n,
                j->nodes ? j->nodes : "");
    *resize_time = j->resize_time;
    rc = NRW_JOB_RUNNING;
out:
    slurm_free_job_info_msg(msg);
    return rc;
}

/* Open path in the job directory (the user's own, but a step's tasks may have
 * put anything there): never blocking in open() on a FIFO, never through a
 * link, only a regular file of ours; blocking again on return. fd, or -1
 * with errno (EINVAL: not a regular file of ours). */
static int nrw_open_file(const char *path, int flags, mode_t mode)
{
    struct stat st;
    int fd = open(path, flags | O_NONBLOCK | O_NOFOLLOW | O_NOCTTY | O_CLOEXEC, mode), fl, e;

    if (fd < 0) {
        if (errno == ENXIO) /* a FIFO without a reader (O_WRONLY), a socket */
            errno = EINVAL;
        return -1;
    }
    if (fstat(fd, &st) != 0)
        e = errno;
    else if (!S_ISREG(st.st_mode) || st.st_uid != geteuid())
        e = EINVAL;
    else if ((fl = fcntl(fd, F_GETFL)) < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0)
        e = errno;
    else
        return fd;
    close(fd);
    errno = e;
    return -1;
}

static const char *nrw_open_err(int e)
{
    return e == EINVAL ? "not a regular file of this user's" : strerror(e);
}

/* ---- the controller --------------------------------------------------------- */

/* The job's secret for ranks that reach the controller over TCP: DIR/secret,
 * 0600, 32 random bytes in hex; they learn it from a rank on this node. */
static int nrw_write_secret(const nrw_t *w, char *path, size_t n)
{
    unsigned char r[32];
    char hex[65];
    snprintf(path, n, "%s/secret", w->socket_dir);
    int u = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (u < 0 || read(u, r, sizeof(r)) != (ssize_t)sizeof(r)) {
        if (u >= 0)
            close(u);
        nrw_log("/dev/urandom: %s", strerror(errno));
        return -1;
    }
    close(u);
    for (int i = 0; i < 32; i++)
        snprintf(hex + 2 * i, 3, "%02x", r[i]);
    unlink(path);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0 || write(fd, hex, 64) != 64 || write(fd, "\n", 1) != 1) {
        nrw_log("%s: %s", path, strerror(errno));
        if (fd >= 0)
            close(fd);
        return -1;
    }
    close(fd);
    return 0;
}

static int nrw_spawn_controller(nrw_t *w, int gpus)
{
    char prog[4096], gpus_s[16], log[4096], secret[4200];
    pid_t pid;

    snprintf(prog, sizeof(prog), "%s/nereus-controller", w->runtime_dir);
    snprintf(log, sizeof(log), "%s/controller.log", w->socket_dir);
    snprintf(gpus_s, sizeof(gpus_s), "%d", gpus);
    char *argv[16];
    int a = 0;
    argv[a++] = prog;
    argv[a++] = "--socket-dir";
    argv[a++] = (char *)w->socket_dir;
    argv[a++] = "--job";
    argv[a++] = (char *)w->job_str;
    if (gpus > 0) {
        argv[a++] = "--gpus";
        argv[a++] = gpus_s;
    }
    if (w->tcp && nrw_write_secret(w, secret, sizeof(secret)) == 0) {
        argv[a++] = "--tcp";
        argv[a++] = (char *)w->tcp;
        argv[a++] = "--secret-file";
        argv[a++] = secret;
    }
    argv[a++] = (char *)w->spec_path;
    argv[a] = NULL;
    int fd = nrw_open_file(log, O_WRONLY | O_CREAT | O_APPEND, 0600);

    if (fd < 0) {
        nrw_log("%s: %s", log, nrw_open_err(errno));
        return -1;
    }
    pid_t parent = getpid();
    pid = fork();
    if (pid < 0) {
        nrw_log("fork: %s", strerror(errno));
        close(fd);
        return -1;
    }
    if (pid == 0) {
        /* The plugin stops only the watcher (SIGKILL at worst): never leave
         * the controller behind it. getppid() closes the race with a
         * watcher killed before prctl. */
        if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent)
            _exit(127);
        dup2(fd, 2);
        execv(prog, argv);
        fprintf(stderr, "nereus-watcher: cannot run %s: %s\n", prog, strerror(errno));
        _exit(127);
    }
    close(fd);
    w->ctl = pid;
    nrw_log("job %u: started %s (pid %d, %s GPUs), log %s", w->job_id, prog, (int)pid,
            gpus > 0 ? gpus_s : "the spec's", log);
    return 0;
}

/* The controller has exited (reaped): log how. */
static bool nrw_controller_gone(nrw_t *w)
{
    int st;
    pid_t p = waitpid(w->ctl, &st, WNOHANG);

    if (p == 0)
        return false;
    if (p == w->ctl) {
        if (WIFEXITED(st))
            nrw_log("the controller exited with status %d (see controller.log)", WEXITSTATUS(st));
        else if (WIFSIGNALED(st))
            nrw_log("the controller was killed by signal %d", WTERMSIG(st));
    }
    w->ctl = 0;
    return true;
}

static void nrw_stop_controller(nrw_t *w)
{
    if (w->ctl <= 0)
        return;
    kill(w->ctl, SIGTERM);
    for (int i = 0; i < 60; i++) {
        if (nrw_controller_gone(w))
            return;
        usleep(50000);
    }
    nrw_log("the controller ignored SIGTERM for 3 s: SIGKILL");
    kill(w->ctl, SIGKILL);
    waitpid(w->ctl, NULL, 0);
    w->ctl = 0;
}

static void nrw_hosts_drop(nrw_hosts_t *h, const char *name)
{
    int at = nrw_hosts_find(h, name);

    if (at < 0)
        return;
    memmove(h->names[at], h->names[at + 1], (size_t)(h->n - at - 1) * sizeof(h->names[0]));
    h->n--;
}

/* A reply says the controller's committed epoch is `epoch`: if that is the
 * epoch announced last, its node order is now the one GPU indices follow. */
static void nrw_sync_epoch(nrw_t *w, unsigned epoch)
{
    if (w->next_epoch != 0 && epoch >= w->next_epoch) {
        w->base = w->next;
        w->base_epoch = epoch;
        w->next_epoch = 0;
    }
}

/* The controller applied a delta (w->order already includes it) and
 * answered: committed epoch `epoch`, announced `new_epoch` (0: none). */
static void nrw_applied(nrw_t *w, unsigned epoch, unsigned new_epoch)
{
    unsigned known = w->next_epoch > w->base_epoch ? w->next_epoch : w->base_epoch;

    if (new_epoch != 0) { /* it takes effect when that epoch commits */
        nrw_sync_epoch(w, epoch);
        w->next = w->order;
        w->next_epoch = new_epoch;
    } else if (epoch > known) { /* decided and committed at once */
        w->base = w->order;
        w->base_epoch = epoch;
        w->next_epoch = 0;
    } else { /* plan kept: the numbering stays */
        nrw_sync_epoch(w, epoch);
    }
}

/* HELLO as a watcher; a hint names the released node it comes from (the
 * controller logs it with the delta). */
static int nrw_hello(const nrw_t *w, int fd, char *text, size_t tl)
{
    nrs_msg_hello_t m;
    uint8_t buf[512];

    memset(&m, 0, sizeof(m));
    m.role = NRS_ROLE_WATCHER;
    snprintf(m.job, sizeof(m.job), "%s", w->job_str);
    if (w->hint_node != NULL)
        snprintf(m.host, sizeof(m.host), "%s", w->hint_node);
    else if (gethostname(m.host, sizeof(m.host)) != 0)
        m.host[0] = '\0';
    m.host[sizeof(m.host) - 1] = '\0';
    return nrs_client_send(fd, buf, nrs_enc_hello(buf, sizeof(buf), &m), text, tl);
}

enum { NRW_REPLY_S = 120 }; /* seconds a DELTA waits for its reply (not a hint's) */

/* One DELTA and its reply; 0 when the controller applied it. text gets the
 * controller's answer or why there was none; *r (if not NULL) the reply, its
 * epoch 0 when there was none. */
static int nrw_send_delta(const nrw_t *w, const nrs_msg_delta_t *m, char *text, size_t tl,
                          nrs_msg_delta_reply_t *reply)
{
    uint8_t *buf = malloc(NRS_PROTO_HDR + NRS_PROTO_MAX_PAYLOAD);
    const size_t cap = NRS_PROTO_HDR + NRS_PROTO_MAX_PAYLOAD;
    nrs_msg_delta_reply_t r;
    nrs_msg_error_t e;
    nrs_hdr_t h;
    int fd = -1, rc = -1;

    if (reply != NULL)
        memset(reply, 0, sizeof(*reply));
    if (buf == NULL) {
        snprintf(text, tl, "out of memory");
        return -1;
    }
    fd = nrs_client_connect_unix(w->socket_dir, text, tl);
    if (fd < 0)
        goto out;
    if (nrw_hello(w, fd, text, tl) != 0 ||
        nrs_client_send(fd, buf, nrs_enc_delta(buf, cap, m), text, tl) != 0) {
        nrs_client_refusal(fd, text, tl);
        goto out;
    }
    /* A delta that comes during a COMMIT is answered once the commit
     * completes, which the controller (started with its default
     * --transition-timeout, 60 s) waits for up to 60 s: one given up on sooner
     * is still applied, and its retry then names hosts the controller no
     * longer knows (their GPU indices would name other nodes). */
    if (nrs_client_recv(fd, buf, cap, &h, w->recv_timeout > 0 ? w->recv_timeout : NRW_REPLY_S,
                        text, tl) != 0)
        goto out;
    if (h.type == NRS_MSG_ERROR && nrs_dec_error(buf + NRS_PROTO_HDR, h.length, &e, NULL, 0) == 0) {
        snprintf(text, tl, "refused: %s: %s", nrs_perr_name((int)e.code), e.text);
        goto out;
    }
    if (h.type != NRS_MSG_DELTA_REPLY ||
        nrs_dec_delta_reply(buf + NRS_PROTO_HDR, h.length, &r, NULL, 0) != 0) {
        snprintf(text, tl, "unexpected %s from the controller", nrs_msg_name(h.type));
        goto out;
    }
    snprintf(text, tl, "%s: generation %llu, epoch %u%s%.0u: %s",
             r.accepted ? "accepted" : "rejected", (unsigned long long)r.generation, r.epoch,
             r.new_epoch ? " -> " : "", r.new_epoch, r.text);
    rc = r.accepted ? 0 : -1;
    if (reply != NULL)
        *reply = r;
out:
    if (fd >= 0)
        close(fd);
    free(buf);
    return rc;
}

/* A node slurmctld took from the job because it failed (DOWN, FAIL, not
 * responding), not because the job was shrunk: its state is lost. */
static bool nrw_node_failed(const char *name)
{
    node_info_msg_t *ni = NULL;
    bool failed = false;

    if (slurm_load_node_single(&ni, (char *)name, SHOW_ALL) == SLURM_SUCCESS && ni != NULL &&
        ni->record_count > 0) {
        uint32_t st = ni->node_array[0].node_state;
        failed = (st & NODE_STATE_BASE) == NODE_STATE_DOWN || (st & NODE_STATE_FAIL) ||
                 (st & NODE_STATE_NO_RESPOND);
    }
    slurm_free_node_info_msg(ni);
    return failed;
}

/* Released (REMOVE) or failed (LOST) hosts gone->names[off..], at most a
 * DELTA's worth: by name, else (no rank known there) as GPU indices. */
static void nrw_delta_remove(nrw_t *w, const nrw_hosts_t *gone, int off, uint32_t kind)
{
    const char *what = kind == NRS_DELTA_LOST ? "LOST" : "REMOVE";
    nrs_msg_delta_t *m = calloc(1, sizeof(*m));
    char names[1024] = "", text[NRS_PROTO_TEXT_MAX + 128];
    nrs_msg_delta_reply_t r;
    size_t used = 0;

    if (m == NULL)
        return;
    m->kind = kind;
    int end = gone->n - off > NRS_PROTO_MAX_HOSTS ? off + NRS_PROTO_MAX_HOSTS : gone->n;
    for (int i = off; i < end; i++) {
        snprintf(m->hosts[m->nhosts++], NRS_PROTO_STR_MAX, "%s", gone->names[i]);
        if (used < sizeof(names))
            used += (size_t)snprintf(names + used, sizeof(names) - used, "%s%s",
                                     i > off ? "," : "", gone->names[i]);
    }
    int rc = nrw_send_delta(w, m, text, sizeof(text), &r);
    bool by_name = rc == 0;
    nrw_log("%s %s hosts %s: %s", w->hint_node ? "hint" : "delta", what, names, text);
    if (r.epoch != 0)
        nrw_sync_epoch(w, r.epoch);
    if (rc != 0 && strstr(text, "unknown host") != NULL && w->gpus_per_node > 0) {
        /* Indices of the committed epoch; rz_lost-style: the controller
         * counts them in that epoch's numbering until the next commits. */
        m->nhosts = 0;
        for (int i = off; i < end; i++) {
            int at = nrw_hosts_find(&w->base, gone->names[i]);
            for (int g = 0; at >= 0 && g < w->gpus_per_node && m->ngpus < NRS_PROTO_MAX_LOST; g++)
                m->gpus[m->ngpus++] = at * w->gpus_per_node + g;
            if (at < 0)
                nrw_log("delta %s: %s has no GPU index in epoch %u (added since)", what,
                        gone->names[i], w->base_epoch);
        }
        if (m->ngpus > 0) {
            rc = nrw_send_delta(w, m, text, sizeof(text), &r);
            nrw_log("delta %s as %d GPU index(es) from %d (the place of %s in the node "
                    "order of epoch %u): %s",
                    what, m->ngpus, (int)m->gpus[0], names, w->base_epoch, text);
        }
    }
    if (rc == 0) { /* the controller no longer counts them */
        for (int i = off; i < end; i++)
            if (by_name || nrw_hosts_find(&w->base, gone->names[i]) >= 0)
                nrw_hosts_drop(&w->order, gone->names[i]);
        nrw_applied(w, r.epoch, r.new_epoch);
    } else if (r.epoch != 0) {
        nrw_sync_epoch(w, r.epoch);
    }
    free(m);
}

/* 0 when the controller applied the ADD (the new hosts are then in order). */
static int nrw_delta_add(nrw_t *w, const nrw_hosts_t *added)
{
    nrs_msg_delta_t m;
    nrs_msg_delta_reply_t r;
    char text[NRS_PROTO_TEXT_MAX + 128];

    memset(&m, 0, sizeof(m));
    m.kind = NRS_DELTA_ADD;
    m.add_nodes = (uint32_t)added->n;
    int rc = nrw_send_delta(w, &m, text, sizeof(text), &r);
    nrw_log("delta ADD %d node(s) (%s%s): %s", added->n, added->names[0],
            added->n > 1 ? ", ..." : "", text);
    if (rc != 0) { /* not counted: sent again at a later poll (nrw_on_change) */
        if (r.epoch != 0)
            nrw_sync_epoch(w, r.epoch);
        return -1;
    }
    /* New GPUs come after the survivors' in the next epoch's numbering. */
    for (int i = 0; i < added->n && w->order.n < NRW_MAX_NODES; i++)
        if (nrw_hosts_find(&w->order, added->names[i]) < 0)
            snprintf(w->order.names[w->order.n++], NRW_HOST_MAX, "%s", added->names[i]);
    nrw_applied(w, r.epoch, r.new_epoch);
    return 0;
}

/* ---- the node order, shared with hints ------------------------------------
 *
 * A released node's hint (nereus-watcher --hint, run by the plugin there)
 * sends the controller the same kind of delta as we do, and renumbers the
 * controller's GPUs the same way; so both keep the node orders (base, next,
 * order) in DIR/watcher.nodes, read and written under an flock of
 * DIR/watcher.nodes.lock around each delta. A host still in our last view
 * of the allocation but no longer in `order` was removed by a hint. */
enum { NRW_LOCK_WAIT_MS = 5000 };

static double nrw_now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void nrw_path(char *out, size_t n, const nrw_t *w, const char *name)
{
    snprintf(out, n, "%s/%s", w->socket_dir, name);
}

/* The lock's fd, or -1 (not got within wait_ms: go on without it). */
static int nrw_state_lock(const nrw_t *w, double wait_ms)
{
    char path[4096];
    double deadline = nrw_now_ms() + wait_ms;
    int fd;

    nrw_path(path, sizeof(path), w, "watcher.nodes.lock");
    fd = nrw_open_file(path, O_RDWR | O_CREAT, 0600);
    if (fd < 0) {
        nrw_log("%s: %s", path, nrw_open_err(errno));
        return -1;
    }
    while (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        if ((errno != EWOULDBLOCK && errno != EINTR) || nrw_now_ms() >= deadline) {
            nrw_log("%s: not locked within %.0f ms: %s", path, wait_ms, strerror(errno));
            close(fd);
            return -1;
        }
        usleep(10000);
    }
    return fd;
}

static void nrw_state_unlock(int fd)
{
    if (fd >= 0)
        close(fd); /* drops the flock */
}

static void nrw_hosts_write(FILE *f, const char *tag, long epoch, const nrw_hosts_t *h)
{
    fprintf(f, "%s", tag);
    if (epoch >= 0)
        fprintf(f, " %ld", epoch);
    fprintf(f, " %d", h->n);
    for (int i = 0; i < h->n; i++)
        fprintf(f, " %s", h->names[i]);
    fputc('\n', f);
}

static void nrw_state_save(const nrw_t *w)
{
    char path[4096], tmp[4096];
    FILE *f;
    int fd;

    nrw_path(path, sizeof(path), w, "watcher.nodes");
    nrw_path(tmp, sizeof(tmp), w, "watcher.nodes.tmp");
    unlink(tmp);
    fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0 || (f = fdopen(fd, "w")) == NULL) {
        nrw_log("%s: %s", tmp, strerror(errno));
        if (fd >= 0)
            close(fd);
        return;
    }
    fprintf(f, "nereus-watcher-nodes 1\ngpus_per_node %d\n", w->gpus_per_node);
    nrw_hosts_write(f, "base", w->base_epoch, &w->base);
    nrw_hosts_write(f, "next", w->next_epoch, &w->next);
    nrw_hosts_write(f, "order", -1, &w->order);
    if (fclose(f) != 0 || rename(tmp, path) != 0) {
        nrw_log("%s: %s", path, strerror(errno));
        unlink(tmp);
    }
}

/* One "TAG [EPOCH] N HOST..." line (its words from strtok_r). */
static int nrw_hosts_read(char *line, const char *tag, unsigned *epoch, nrw_hosts_t *h)
{
    char *save = NULL, *t = strtok_r(line, " \n", &save), *end;
    long n;

    if (t == NULL || strcmp(t, tag) != 0)
        return -1;
    if (epoch != NULL) {
        if ((t = strtok_r(NULL, " \n", &save)) == NULL)
            return -1;
        *epoch = (unsigned)strtoul(t, &end, 10);
        if (*end)
            return -1;
    }
    if ((t = strtok_r(NULL, " \n", &save)) == NULL)
        return -1;
    n = strtol(t, &end, 10);
    if (*end || n < 0 || n > NRW_MAX_NODES)
        return -1;
    h->n = 0;
    while (h->n < n && (t = strtok_r(NULL, " \n", &save)) != NULL)
        snprintf(h->names[h->n++], NRW_HOST_MAX, "%s", t);
    return h->n == n ? 0 : -1;
}

/* 0 and w's node orders replaced by the file's, or -1 (w untouched). */
static int nrw_state_load(nrw_t *w)
{
    static nrw_hosts_t base, next, order;
    char path[4096], *line = NULL;
    size_t cap = 0;
    unsigned be = 0, ne = 0;
    int gpn = 0, rc = -1;
    FILE *f;

    nrw_path(path, sizeof(path), w, "watcher.nodes");
    int fd = nrw_open_file(path, O_RDONLY, 0);
    if (fd < 0 || (f = fdopen(fd, "r")) == NULL) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    if (getline(&line, &cap, f) < 0 || strcmp(line, "nereus-watcher-nodes 1\n") != 0 ||
        getline(&line, &cap, f) < 0 || sscanf(line, "gpus_per_node %d", &gpn) != 1 ||
        gpn < 0 || gpn > NRS_PROTO_MAX_GPUS || /* a file of the user's: indices from it */
        getline(&line, &cap, f) < 0 || nrw_hosts_read(line, "base", &be, &base) != 0 ||
        getline(&line, &cap, f) < 0 || nrw_hosts_read(line, "next", &ne, &next) != 0 ||
        getline(&line, &cap, f) < 0 || nrw_hosts_read(line, "order", NULL, &order) != 0)
        goto out;
    w->gpus_per_node = gpn;
    w->base = base;
    w->base_epoch = be;
    w->next = next;
    w->next_epoch = ne;
    w->order = order;
    rc = 0;
out:
    free(line);
    fclose(f);
    return rc;
}

/* The allocation changed from w->current (what the controller counts) to
 * now: tell the controller. w->current then has what it took: a host whose
 * REMOVE or LOST was applied (it left `order`: by us or by a hint) goes, the
 * hosts of an applied ADD come in; the rest stay as they were, so the next
 * poll sees them differ again and sends them again (a delta that failed,
 * "busy", no answer, is never lost; the controller takes a repeated REMOVE or
 * LOST as a no-op). 0: everything was applied. */
static int nrw_on_change(nrw_t *w, const nrw_hosts_t *now)
{
    static nrw_hosts_t gone, lost, added, hinted[2]; /* [0] released, [1] failed */
    static nrw_hosts_t applied;
    bool all = true;
    int lock = nrw_state_lock(w, NRW_LOCK_WAIT_MS);

    if (lock >= 0 && nrw_state_load(w) != 0)
        nrw_log("%s/watcher.nodes unreadable: keeping our own node order", w->socket_dir);
    gone.n = lost.n = added.n = hinted[0].n = hinted[1].n = 0;
    for (int i = 0; i < w->current.n; i++) {
        const char *h = w->current.names[i];
        if (nrw_hosts_find(now, h) >= 0)
            continue;
        bool failed = nrw_node_failed(h);
        nrw_hosts_t *hl = &hinted[failed];
        if (nrw_hosts_find(&w->order, h) < 0) /* a released node's hint removed it */
            snprintf(hl->names[hl->n++], NRW_HOST_MAX, "%s", h);
        else if (failed)
            snprintf(lost.names[lost.n++], NRW_HOST_MAX, "%s", h);
        else
            snprintf(gone.names[gone.n++], NRW_HOST_MAX, "%s", h);
    }
    for (int i = 0; i < now->n; i++)
        if (nrw_hosts_find(&w->current, now->names[i]) < 0)
            snprintf(added.names[added.n++], NRW_HOST_MAX, "%s", now->names[i]);
    nrw_log("job %u: allocation changed: %d -> %d nodes (%d released, %d failed, %d added)",
            w->job_id, w->current.n, now->n, gone.n + hinted[0].n, lost.n + hinted[1].n,
            added.n);
    for (int k = 0; k < 2; k++) {
        char names[1024] = "";
        size_t used = 0;
        for (int i = 0; i < hinted[k].n && used < sizeof(names); i++)
            used += (size_t)snprintf(names + used, sizeof(names) - used, "%s%s", i ? "," : "",
                                     hinted[k].names[i]);
        if (hinted[k].n > 0)
            nrw_log("delta %s hosts %s: already sent by a hint from a released node (not resent)",
                    k ? "LOST" : "REMOVE", names);
    }
    for (int off = 0; off < lost.n; off += NRS_PROTO_MAX_HOSTS)
        nrw_delta_remove(w, &lost, off, NRS_DELTA_LOST);
    for (int off = 0; off < gone.n; off += NRS_PROTO_MAX_HOSTS)
        nrw_delta_remove(w, &gone, off, NRS_DELTA_REMOVE);
    applied.n = 0;
    for (int i = 0; i < w->current.n; i++) {
        const char *h = w->current.names[i];
        bool stays = nrw_hosts_find(now, h) >= 0;

        if (!stays && nrw_hosts_find(&w->order, h) < 0)
            continue; /* its REMOVE or LOST was applied */
        snprintf(applied.names[applied.n++], NRW_HOST_MAX, "%s", h);
        all = all && stays;
    }
    if (added.n > 0 && nrw_delta_add(w, &added) == 0)
        for (int i = 0; i < added.n && applied.n < NRW_MAX_NODES; i++)
            snprintf(applied.names[applied.n++], NRW_HOST_MAX, "%s", added.names[i]);
    else if (added.n > 0)
        all = false;
    w->current = applied;
    if (lock >= 0)
        nrw_state_save(w);
    nrw_state_unlock(lock);
    return all ? 0 : -1;
}

static bool nrw_hosts_same(const nrw_hosts_t *a, const nrw_hosts_t *b)
{
    bool same = a->n == b->n;

    for (int i = 0; same && i < a->n; i++)
        same = nrw_hosts_find(b, a->names[i]) >= 0;
    return same;
}

/* A change the controller did not take all of (nrw_on_change) is sent again
 * at the next poll, then 2, 4, ... polls later, at most NRW_RETRY_MAX_S
 * apart, as long as it is not taken; a new change of the allocation is sent
 * at once. */
enum { NRW_RETRY_MAX_S = 60 };

static void nrw_change(nrw_t *w, const nrw_hosts_t *now)
{
    double delay;

    if (w->retries > 0 && nrw_hosts_same(now, &w->tried) && nrw_now_ms() < w->retry_at)
        return;
    if (nrw_on_change(w, now) == 0) {
        w->retries = 0;
        return;
    }
    w->tried = *now;
    delay = w->interval * (double)(1 << (w->retries < 16 ? w->retries : 16));
    if (delay > NRW_RETRY_MAX_S)
        delay = w->interval > NRW_RETRY_MAX_S ? w->interval : NRW_RETRY_MAX_S;
    w->retries++;
    /* Half a poll early: the poll that comes on time is not skipped. */
    w->retry_at = nrw_now_ms() + (delay - w->interval / 2) * 1e3;
    nrw_log("job %u: the controller did not take every change (attempt %d): sent again in "
            "%.0f s", w->job_id, w->retries, delay);
}

/* Sleep s seconds, or until a stop signal (SIGTERM, SIGINT, SIGHUP), with no
 * lost wake-up: a signal handled between a check of nrw_stop and the start of
 * nanosleep() was seen by neither, and the watcher slept its whole interval
 * (up to an hour) while slurmstepd waited 3 s for it to stop, then SIGKILLed
 * it. Here the stop signals are blocked from the check until ppoll(), which
 * unblocks them atomically as it starts waiting: one that came in between is
 * pending and ends ppoll() at once. Outside the sleep they stay unblocked, so
 * nrw_stop is set as soon as one arrives. */
static void nrw_sleep(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    sigset_t stop, during;

    nrw_stop_signals(&stop);
    sigprocmask(SIG_BLOCK, &stop, &during);
    for (int sig = 1; sig < NSIG; sig++)
        if (sigismember(&stop, sig) == 1)
            sigdelset(&during, sig);
    if (!nrw_stop)
        ppoll(NULL, 0, &ts, &during); /* EINTR: a stop signal (or another) cut it short */
    sigprocmask(SIG_UNBLOCK, &stop, NULL);
}

static int nrw_run(nrw_t *w)
{
    static nrw_hosts_t now;
    char state[128];
    time_t rt = 0;
    nrw_job_state_t js = NRW_JOB_UNKNOWN;

    /* The first snapshot sizes the controller; slurmctld may be slow. */
    for (int i = 0; i < 10 && !nrw_stop; i++) {
        js = nrw_load(w, &w->current, &w->resize_time, state, sizeof(state));
        if (js != NRW_JOB_UNKNOWN)
            break;
        nrw_sleep(0.5);
    }
    if (js == NRW_JOB_ENDED) {
        nrw_log("job %u already ended (%s)", w->job_id, state);
        return 0;
    }
    if (js == NRW_JOB_UNKNOWN)
        nrw_log("job %u: no answer from slurmctld (%s); starting with the spec's size", w->job_id,
                state);
    else
        nrw_log("job %u: %d node(s), resize_time %ld", w->job_id, w->current.n,
                (long)w->resize_time);
    w->base = w->current;
    w->order = w->current;
    w->base_epoch = 1;
    if (js == NRW_JOB_RUNNING) {
        int lock = nrw_state_lock(w, NRW_LOCK_WAIT_MS);
        nrw_state_save(w);
        nrw_state_unlock(lock);
    }
    int gpus = js == NRW_JOB_RUNNING ? w->current.n * w->gpus_per_node : 0;
    if (gpus > NRS_PROTO_MAX_GPUS)
        gpus = NRS_PROTO_MAX_GPUS;
    if (nrw_spawn_controller(w, gpus) != 0)
        return 1;
    while (!nrw_stop) {
        nrw_sleep(w->interval);
        if (nrw_stop || nrw_controller_gone(w))
            break;
        js = nrw_load(w, &now, &rt, state, sizeof(state));
        if (js == NRW_JOB_ENDED) {
            nrw_log("job %u ended (%s)", w->job_id, state);
            break;
        }
        if (js == NRW_JOB_UNKNOWN || nrw_stop) /* a stop during the RPC: no delta now */
            continue;
        if (w->current.n == 0) { /* no first snapshot: this is it */
            w->current = now;
            w->base = now;
            w->order = now;
            int lock = nrw_state_lock(w, NRW_LOCK_WAIT_MS);
            nrw_state_save(w);
            nrw_state_unlock(lock);
            continue;
        }
        bool same = nrw_hosts_same(&now, &w->current);
        if (rt != w->resize_time)
            nrw_log("job %u: resize_time %ld -> %ld", w->job_id, (long)w->resize_time, (long)rt);
        w->resize_time = rt;
        if (!same)
            nrw_change(w, &now);
        else
            w->retries = 0; /* what was pending is moot: the allocation is back */
    }
    if (nrw_stop)
        nrw_log("signal %d: stopping", (int)nrw_stop);
    bool had = w->ctl > 0;
    nrw_stop_controller(w);
    if (had)
        nrw_log("controller stopped; exiting");
    return 0;
}

/* ---- a released node's hint ----------------------------------------------
 *
 *   nereus-watcher --hint NODE --from HOOK --socket-dir DIR --job ID
 *                  [--nodes LIST] [--timeout S] [--slurm-conf F] [--report-end]
 *
 * Run by the plugin in job_epilog (on a node a shrink released, the job
 * still runs), as the job's user, for at most S seconds (<= 2). If the job's
 * controller is reachable from here (DIR/ctl.sock; on a real cluster it is
 * on another machine and is not, until it listens on TCP) and slurmctld says
 * the job runs without NODE, tell the controller at once that the hosts of
 * LIST (and NODE) no longer in the job are gone: the delta the watcher would
 * send at its next poll (LOST for nodes slurmctld reports failed, else
 * REMOVE), with the same bookkeeping (watcher.nodes), so that the watcher
 * does not send it again. Exit status: 0 done (sent, not needed, or
 * skipped), 3 the job no longer runs, 4 NODE is still in the job. */
enum { NRW_HINT_ENDED = 3, NRW_HINT_IN_JOB = 4 };

static int nrw_hint(nrw_t *w, const char *list, const char *from, double timeout, bool report_end)
{
    static nrw_hosts_t cand, now, gone, lost;
    char text[NRS_PROTO_TEXT_MAX + 128], state[128], log[4096];
    double deadline = nrw_now_ms() + timeout * 1e3;
    time_t rt = 0;
    int lock = -1, fd;
    bool loaded = false;

    snprintf(nrw_prefix, sizeof(nrw_prefix), "hint from %s (%s): ", w->hint_node, from);
    fd = nrs_client_connect_unix(w->socket_dir, text, sizeof(text));
    if (fd < 0) {
        nrw_log("the job's controller is not reachable from this node (%s): hint skipped "
                "(no TCP listener yet; the watcher's poll will see the change)",
                text);
        if (!report_end)
            return 0;
    } else {
        close(fd);
        nrw_path(log, sizeof(log), w, "watcher.log");
        int lfd = nrw_open_file(log, O_WRONLY | O_APPEND, 0);
        if (lfd >= 0 && (nrw_also = fdopen(lfd, "a")) == NULL)
            close(lfd);
    }
    nrw_job_state_t js = nrw_load(w, &now, &rt, state, sizeof(state));
    if (js == NRW_JOB_ENDED) {
        nrw_log("job %u no longer runs (%s): no hint", w->job_id, state);
        return NRW_HINT_ENDED;
    }
    if (js == NRW_JOB_UNKNOWN) {
        nrw_log("job %u: no answer from slurmctld (%s): no hint", w->job_id, state);
        return 0;
    }
    if (nrw_hosts_find(&now, w->hint_node) >= 0) {
        nrw_log("%s is still in job %u: no hint", w->hint_node, w->job_id);
        return NRW_HINT_IN_JOB;
    }
    if (fd < 0)
        return 0;
    nrw_hosts_parse(list, &cand);
    if (nrw_hosts_find(&cand, w->hint_node) < 0 && cand.n < NRW_MAX_NODES)
        snprintf(cand.names[cand.n++], NRW_HOST_MAX, "%s", w->hint_node);
    lock = nrw_state_lock(w, deadline - nrw_now_ms());
    if (lock < 0) {
        nrw_log("hint skipped (the watcher is sending a delta right now)");
        return 0;
    }
    loaded = nrw_state_load(w) == 0;
    if (!loaded)
        nrw_log("%s/watcher.nodes unreadable: by host name only", w->socket_dir);
    gone.n = lost.n = 0;
    for (int i = 0; i < cand.n; i++) {
        const char *h = cand.names[i];
        if (nrw_hosts_find(&now, h) >= 0)
            continue;
        if (loaded && nrw_hosts_find(&w->order, h) < 0) {
            nrw_log("hint %s: already removed (by the watcher or another hint)", h);
            continue;
        }
        if (nrw_node_failed(h))
            snprintf(lost.names[lost.n++], NRW_HOST_MAX, "%s", h);
        else
            snprintf(gone.names[gone.n++], NRW_HOST_MAX, "%s", h);
    }
    double left = (deadline - nrw_now_ms()) / 1e3;
    w->recv_timeout = left > 0.2 ? left : 0.2;
    for (int off = 0; off < lost.n; off += NRS_PROTO_MAX_HOSTS)
        nrw_delta_remove(w, &lost, off, NRS_DELTA_LOST);
    for (int off = 0; off < gone.n; off += NRS_PROTO_MAX_HOSTS)
        nrw_delta_remove(w, &gone, off, NRS_DELTA_REMOVE);
    if (loaded)
        nrw_state_save(w);
    nrw_state_unlock(lock);
    return 0;
}

static const char nrw_usage[] =
    "Usage: nereus-watcher --socket-dir DIR --job ID --runtime-dir RT [--interval S]\n"
    "                      [--slurm-conf FILE] [--tcp HOST:PORT|none] SPEC\n"
    "       nereus-watcher --hint NODE --from HOOK --socket-dir DIR --job ID\n"
    "                      [--nodes LIST] [--timeout S] [--slurm-conf FILE] [--report-end]\n"
    "Started by the Nereus SPANK plugin: runs RT/nereus-controller for job ID and\n"
    "sends it a resource delta whenever slurmctld's node list of the job changes.\n"
    "--tcp: the controller also listens there for ranks on other nodes, with a\n"
    "job secret in DIR/secret (default none).\n"
    "--hint: on a node leaving job ID, send that delta at once (at most S <= 2 s).\n";

int main(int argc, char **argv)
{
    static const struct option opts[] = {{"socket-dir", required_argument, NULL, 'd'},
                                          {"job", required_argument, NULL, 'j'},
                                          {"runtime-dir", required_argument, NULL, 'r'},
                                          {"interval", required_argument, NULL, 'i'},
                                          {"slurm-conf", required_argument, NULL, 'c'},
                                          {"hint", required_argument, NULL, 'H'},
                                          {"from", required_argument, NULL, 'f'},
                                          {"nodes", required_argument, NULL, 'n'},
                                          {"timeout", required_argument, NULL, 't'},
                                          {"report-end", no_argument, NULL, 'E'},
                                          {"tcp", required_argument, NULL, 'T'},
                                          {"help", no_argument, NULL, 'h'},
                                          {NULL, 0, NULL, 0}};
    static nrw_t w;
    static nrs_spec_t spec;
    char err[NRS_ERR_MAX], *end;
    struct sigaction sa;
    sigset_t stop;
    const char *from = "hook", *nodes = "";
    double timeout = 2;
    bool report_end = false;
    int ch, rc;

    w.interval = 2;
    while ((ch = getopt_long(argc, argv, "d:j:r:i:c:H:f:n:t:T:Eh", opts, NULL)) != -1) {
        switch (ch) {
        case 'T': w.tcp = strcmp(optarg, "none") ? optarg : NULL; break;
        case 'H': w.hint_node = optarg; break;
        case 'f': from = optarg; break;
        case 'n': nodes = optarg; break;
        case 'E': report_end = true; break;
        case 't':
            timeout = strtod(optarg, &end);
            if (*end || !(timeout >= 0.1 && timeout <= 2)) {
                fprintf(stderr, "nereus-watcher: --timeout: '%s' not in [0.1, 2]\n", optarg);
                return 2;
            }
            break;
        case 'd': w.socket_dir = optarg; break;
        case 'j': w.job_str = optarg; break;
        case 'r': w.runtime_dir = optarg; break;
        case 'c': w.slurm_conf = optarg; break;
        case 'i':
            w.interval = strtod(optarg, &end);
            if (*end || !(w.interval >= 0.1 && w.interval <= 3600)) {
                fprintf(stderr, "nereus-watcher: --interval: '%s' not in [0.1, 3600]\n", optarg);
                return 2;
            }
            break;
        case 'h': fputs(nrw_usage, stdout); return 0;
        default: fputs(nrw_usage, stderr); return 2;
        }
    }
    if (w.hint_node != NULL ? optind != argc || !w.socket_dir || !w.job_str || !w.hint_node[0]
                            : optind != argc - 1 || !w.socket_dir || !w.job_str || !w.runtime_dir) {
        fputs(nrw_usage, stderr);
        return 2;
    }
    w.spec_path = w.hint_node != NULL ? NULL : argv[optind];
    errno = 0;
    unsigned long id = strtoul(w.job_str, &end, 10);
    if (errno || *end || end == w.job_str || id == 0 || id > UINT32_MAX) {
        fprintf(stderr, "nereus-watcher: --job: '%s' is not a job id\n", w.job_str);
        return 2;
    }
    w.job_id = (uint32_t)id;
    if (w.hint_node != NULL) {
        /* Hard bound, whatever slurmctld or the controller do: SIGALRM's
         * default action ends us (the plugin also kills us at its limit). */
        alarm((unsigned)timeout + 1);
        signal(SIGPIPE, SIG_IGN);
        slurm_init(w.slurm_conf);
        rc = nrw_hint(&w, nodes, from, timeout, report_end);
        slurm_fini();
        return rc;
    }
    if (nrs_spec_load(w.spec_path, &spec, err, sizeof(err)) != 0) {
        nrw_log("%s", err);
        return 1;
    }
    w.gpus_per_node = spec.cluster.gpus_per_node;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = nrw_on_signal; /* no SA_RESTART: cut waits short */
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    nrw_stop_signals(&stop); /* deliverable whatever mask we were started with */
    sigprocmask(SIG_UNBLOCK, &stop, NULL);
    signal(SIGPIPE, SIG_IGN);
    slurm_init(w.slurm_conf);
    rc = nrw_run(&w);
    slurm_fini();
    return rc;
}
