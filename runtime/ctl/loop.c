/* epoll event loop of nereus-controller. Level-triggered; a peer is closed
 * only between batches of events (never while an event may still name it);
 * output queued by the controller is flushed after each batch. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/timerfd.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "ctl/auth.h"
#include "ctl/loop.h"
#include "util/util.h"

enum { TAG_UNIX = 1, TAG_TCP, TAG_SIGNAL, TAG_TIMER };
enum { TICK_MS = 100, EVENTS = 256, READS_PER_EVENT = 32 };

typedef struct {
    int ep, ufd, tfd, sfd, timfd;
    nrs_ctl_t *ctl;
    nrs_conn_t **dirty;
    int ndirty, cap_dirty;
    int max_conns;
    bool stopping, oom;
    bool continued; /* a SIGCONT came: the controller had been stopped */
    bool full;      /* the listeners are disarmed: the fd table (or memory) ran out */
    bool full_said; /* that was logged, and no peer was accepted since */
    /* TCP peers that have not said HELLO (nor been closed): at max_pre the
     * TCP listener is disarmed (tcp_held) until one says HELLO or goes, so
     * a remote host connecting in a loop cannot take the fd table from the
     * job's own peers (the unix socket's: ranks, watcher, CLI) */
    int npre, max_pre;
    bool tcp_held;
    double last_held;
    uid_t uid;
    char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
    char contact[sizeof(((struct sockaddr_un *)0)->sun_path) + 16]; /* DIR/ctl.tcp, written */
    FILE *log;
    double t0, last_full;
    double skipped; /* nrs_awake_skipped_s() at the last look */
} loop_t;

double nrs_loop_now(void)
{
    return nrs_awake_s(); /* read at every tick (TICK_MS < NRS_AWAKE_SLICE_S) */
}

/* One log line. Control bytes are written as \xNN: the text may carry what a
 * peer sent (the host of its HELLO), and a newline in it would forge a line. */
static void lg(loop_t *L, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void lg(loop_t *L, const char *fmt, ...)
{
    char line[1024];
    if (!L->log)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    fprintf(L->log, "nereus-controller: [%.3f] ", nrs_loop_now() - L->t0);
    nrs_log_line(L->log, line);
}

static void on_output(void *arg, nrs_conn_t *k)
{
    loop_t *L = arg;
    if (L->stopping || k->dirty)
        return;
    if (L->ndirty == L->cap_dirty) {
        int cap = L->cap_dirty ? 2 * L->cap_dirty : 256;
        nrs_conn_t **p = realloc(L->dirty, sizeof(*p) * (size_t)cap);
        if (!p) { /* the peer is flushed when the socket next wakes us */
            L->oom = true;
            return;
        }
        L->dirty = p;
        L->cap_dirty = cap;
    }
    k->dirty = true;
    L->dirty[L->ndirty++] = k;
}

static void set_events(loop_t *L, nrs_conn_t *k, unsigned ev)
{
    if (k->ev == ev)
        return;
    struct epoll_event e = {.events = ev, .data.ptr = k};
    if (epoll_ctl(L->ep, EPOLL_CTL_MOD, k->fd, &e) == 0)
        k->ev = ev;
}

/* Arm or disarm both listeners (they share the fd table). A listener with a
 * peer pending stays readable while accept fails with EMFILE: left armed,
 * the level-triggered epoll_wait would return at once forever. */
static void arm(loop_t *L, int fd, uint64_t tag, bool on)
{
    struct epoll_event e = {.events = on ? EPOLLIN : 0, .data.u64 = tag};
    if (fd >= 0)
        epoll_ctl(L->ep, EPOLL_CTL_MOD, fd, &e);
}

static void arm_listeners(loop_t *L, bool on)
{
    arm(L, L->ufd, TAG_UNIX, on);
    arm(L, L->tfd, TAG_TCP, on && !L->tcp_held);
    L->full = !on;
}

/* Hold (or take again) TCP peers in the listener's backlog. */
static void hold_tcp(loop_t *L, bool held)
{
    if (L->tfd < 0 || L->tcp_held == held)
        return;
    L->tcp_held = held;
    arm(L, L->tfd, TAG_TCP, !held && !L->full);
}

/* k is past HELLO, or gone: one TCP peer fewer before HELLO. */
static void uncount_pre(loop_t *L, nrs_conn_t *k)
{
    if (!k->pre_hello)
        return;
    k->pre_hello = false;
    L->npre--;
    if (L->tcp_held && L->npre < L->max_pre && !L->stopping)
        hold_tcp(L, false);
}

static void close_conn(loop_t *L, nrs_conn_t *k, double now)
{
    epoll_ctl(L->ep, EPOLL_CTL_DEL, k->fd, NULL);
    close(k->fd);
    uncount_pre(L, k);
    nrs_ctl_detach(L->ctl, k, now);
    nrs_conn_free(k);
    if (L->full && !L->stopping) /* an fd is free again: a pending peer may have it */
        arm_listeners(L, true);
}

/* Flush what the controller queued; close peers that are done or broken. */
static void service(loop_t *L, double now)
{
    while (L->ndirty > 0) {
        nrs_conn_t *k = L->dirty[--L->ndirty];
        k->dirty = false;
        if (k->state != NRS_CONN_DEAD) {
            int rc = nrs_conn_flush(k);
            if (rc < 0)
                k->state = NRS_CONN_DEAD;
            else if (rc == 1)
                set_events(L, k, k->state == NRS_CONN_CLOSING ? EPOLLOUT : EPOLLIN | EPOLLOUT);
            else if (k->state == NRS_CONN_CLOSING)
                k->state = NRS_CONN_DEAD;
            else
                set_events(L, k, EPOLLIN);
        }
        if (k->state == NRS_CONN_DEAD)
            close_conn(L, k, now);
    }
}

static void refuse(loop_t *L, int fd, int code, const char *text)
{
    nrs_msg_error_t e;
    uint8_t buf[NRS_PROTO_HDR + 8 + NRS_PROTO_TEXT_MAX];
    e.code = (uint32_t)code;
    snprintf(e.text, sizeof(e.text), "%s", text);
    int n = nrs_enc_error(buf, sizeof(buf), &e);
    if (n > 0 && send(fd, buf, (size_t)n, MSG_NOSIGNAL | MSG_DONTWAIT) < 0)
        (void)0; /* best effort: the peer is refused either way */
    close(fd);
    (void)L;
}

static void on_accept(loop_t *L, int lfd, bool tcp, double now)
{
    for (;;) {
        if (tcp && L->npre >= L->max_pre) { /* the rest wait in the backlog */
            if (!L->tcp_held && now - L->last_held > 5) { /* at most every 5 s */
                lg(L, "%d TCP peers have not said HELLO: not accepting more for now", L->npre);
                L->last_held = now;
            }
            hold_tcp(L, true);
            return;
        }
        int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
                /* no fd (or memory) for the peer now: wait for a peer to close
                 * or the next tick, the peers pending stay in the backlog */
                if (!L->full_said && now - L->last_full > 5) {
                    lg(L, "accept: %s: not accepting peers for now (they wait in the backlog)",
                       strerror(errno));
                    L->last_full = now;
                    L->full_said = true;
                }
                arm_listeners(L, false);
            }
            return;
        }
        if (L->full_said) {
            lg(L, "accepting peers again");
            L->full_said = false;
        }
        if (nrs_ctl_nconns(L->ctl) >= L->max_conns) {
            refuse(L, fd, NRS_PERR_REFUSED, "too many connections");
            continue;
        }
        uid_t uid = (uid_t)-1;
        if (!tcp && (nrs_auth_peer_uid(fd, &uid) != 0 || uid != L->uid)) {
            lg(L, "refused a local peer of uid %d (controller runs as uid %u)", (int)uid,
               (unsigned)L->uid);
            refuse(L, fd, NRS_PERR_AUTH, "peer uid differs from the controller's");
            continue;
        }
        if (tcp) {
            int one = 1;
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        }
        nrs_conn_t *k = nrs_conn_new(fd, now);
        if (!k || nrs_ctl_attach(L->ctl, k, now) != 0) {
            nrs_conn_free(k);
            refuse(L, fd, NRS_PERR_INTERNAL, "controller cannot take more peers");
            continue;
        }
        k->tcp = tcp;
        k->uid = uid;
        struct epoll_event e = {.events = EPOLLIN, .data.ptr = k};
        if (epoll_ctl(L->ep, EPOLL_CTL_ADD, fd, &e) != 0) {
            k->state = NRS_CONN_DEAD;
            on_output(L, k);
            continue;
        }
        k->ev = EPOLLIN;
        if (tcp) {
            k->pre_hello = true;
            L->npre++;
        }
    }
}

static void on_conn(loop_t *L, nrs_conn_t *k, uint32_t ev, double now)
{
    if (k->state == NRS_CONN_DEAD)
        return;
    if ((ev & (EPOLLIN | EPOLLHUP | EPOLLERR)) && k->state < NRS_CONN_CLOSING) {
        for (int i = 0; i < READS_PER_EVENT && k->state < NRS_CONN_CLOSING; i++) {
            ssize_t r = nrs_conn_read(k, now);
            if (r == -2)
                break;
            if (r <= 0) {
                if (k->in_len > 0)
                    lg(L, "peer #%lu disconnected mid-frame (%zu bytes pending)", k->serial,
                       k->in_len);
                else if (k->role == NRS_ROLE_WORKER)
                    lg(L, "worker rank %d@%s disconnected", k->gpu, k->host);
                k->state = NRS_CONN_DEAD;
                if (r == 0 && nrs_conn_pending(k) > 0) {
                    /* EOF may be a half-close (shutdown(SHUT_WR) after a
                     * STATUS_REQ): flush the reply first; a peer that does not
                     * read it is closed after the CLOSING bound (2 s) */
                    k->state = NRS_CONN_CLOSING;
                    k->t_closing = now;
                }
                break;
            }
            nrs_ctl_input(L->ctl, k, now);
            if (k->state == NRS_CONN_READY)
                uncount_pre(L, k);
        }
        if (k->state >= NRS_CONN_CLOSING)
            on_output(L, k);
    } else if (k->state == NRS_CONN_CLOSING && (ev & (EPOLLHUP | EPOLLERR))) {
        k->state = NRS_CONN_DEAD;
    }
    if (ev & EPOLLOUT || k->state == NRS_CONN_DEAD)
        on_output(L, k);
}

static int listen_unix(loop_t *L, const char *dir, char *err, size_t el)
{
    struct sockaddr_un sa;
    struct stat st;
    if (nrs_auth_socket_dir(dir, err, el) != 0)
        return -1;
    if (nrs_auth_socket_path(dir, L->path, sizeof(L->path)) != 0) {
        snprintf(err, el, "%s: path too long for a unix socket", dir);
        return -1;
    }
    memset(&sa, 0, sizeof(sa));
    sa.sun_family = AF_UNIX;
    memcpy(sa.sun_path, L->path, strlen(L->path) + 1);
    if (lstat(L->path, &st) == 0) {
        if (!S_ISSOCK(st.st_mode)) {
            snprintf(err, el, "%s exists and is not a socket", L->path);
            return -1;
        }
        int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        bool live = probe >= 0 && connect(probe, (struct sockaddr *)&sa, sizeof(sa)) == 0;
        if (probe >= 0)
            close(probe);
        if (live) {
            snprintf(err, el, "%s: another controller is running there", L->path);
            return -1;
        }
        unlink(L->path); /* stale, from a controller that died */
    }
    L->ufd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (L->ufd < 0) {
        snprintf(err, el, "socket: %s", strerror(errno));
        return -1;
    }
    mode_t old = umask(0177);
    int rc = bind(L->ufd, (struct sockaddr *)&sa, sizeof(sa));
    umask(old);
    if (rc != 0) { /* what is at the path is not ours (another controller bound it since
                    * the probe above): closed here, so that nrs_loop_run leaves it */
        snprintf(err, el, "%s: %s", L->path, strerror(errno));
        close(L->ufd);
        L->ufd = -1;
        return -1;
    }
    if (listen(L->ufd, 4096) != 0) {
        snprintf(err, el, "%s: %s", L->path, strerror(errno));
        return -1;
    }
    lg(L, "listening on %s", L->path);
    return 0;
}

static int listen_tcp(loop_t *L, const char *hostport, char *err, size_t el)
{
    char host[256];
    struct addrinfo hints, *res = NULL;
    const char *colon = strrchr(hostport, ':');
    if (!colon || colon == hostport || (size_t)(colon - hostport) >= sizeof(host) || !colon[1]) {
        snprintf(err, el, "--tcp %s: expected HOST:PORT", hostport);
        return -1;
    }
    memcpy(host, hostport, (size_t)(colon - hostport));
    host[colon - hostport] = 0;
    memset(&hints, 0, sizeof(hints));
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    int gai = getaddrinfo(host, colon + 1, &hints, &res);
    if (gai != 0) {
        snprintf(err, el, "--tcp %s: %s", hostport, gai_strerror(gai));
        return -1;
    }
    L->tfd = socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    if (L->tfd < 0 || setsockopt(L->tfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
        bind(L->tfd, res->ai_addr, res->ai_addrlen) != 0 || listen(L->tfd, 4096) != 0) {
        snprintf(err, el, "--tcp %s: %s", hostport, strerror(errno));
        freeaddrinfo(res);
        return -1;
    }
    freeaddrinfo(res);
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    char hb[128] = "?", pb[16] = "?";
    if (getsockname(L->tfd, (struct sockaddr *)&ss, &sl) == 0)
        getnameinfo((struct sockaddr *)&ss, sl, hb, sizeof(hb), pb, sizeof(pb),
                    NI_NUMERICHOST | NI_NUMERICSERV);
    lg(L, "listening on tcp %s:%s", hb, pb);
    /* ranks that cannot reach the unix socket learn this contact from one that
     * can (docs/protocol.md §Transport): HOST:PORT, the host as others reach it */
    char me[256] = "", tmp[sizeof(L->contact) + 8];
    bool any = !strcmp(host, "0.0.0.0") || !strcmp(host, "::") || !strcmp(host, "*");
    if (any && gethostname(me, sizeof(me) - 1) != 0)
        me[0] = 0;
    char *slash = strrchr(L->path, '/');
    if (slash && (size_t)(slash - L->path) + 10 < sizeof(L->contact)) {
        snprintf(L->contact, sizeof(L->contact), "%.*s/ctl.tcp", (int)(slash - L->path), L->path);
        snprintf(tmp, sizeof(tmp), "%s.tmp", L->contact);
        int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
        FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
        if (!f || fprintf(f, "%s:%s\n", any ? (me[0] ? me : "localhost") : hb, pb) < 0 ||
            fclose(f) != 0 || rename(tmp, L->contact) != 0) {
            lg(L, "%s: %s (remote ranks will not find this controller)", L->contact,
               strerror(errno));
            if (!f && fd >= 0)
                close(fd);
            L->contact[0] = 0;
        }
    }
    return 0;
}

static int add_fd(loop_t *L, int fd, uint64_t tag)
{
    struct epoll_event e = {.events = EPOLLIN, .data.u64 = tag};
    return epoll_ctl(L->ep, EPOLL_CTL_ADD, fd, &e);
}

static int setup(loop_t *L, const nrs_loop_opts_t *o, char *err, size_t el)
{
    sigset_t set;
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    /* an eighth of the peers (or of the fd table) for unauthenticated ones:
     * a legitimate TCP rank says HELLO at once, so more than that before
     * HELLO is a flood, or a burst the loop catches up with in a moment */
    long nofile = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY
                      ? (long)rl.rlim_cur
                      : L->max_conns;
    L->max_pre = (int)((nofile < L->max_conns ? nofile : L->max_conns) / 8);
    if (L->max_pre < 16)
        L->max_pre = 16;
    signal(SIGPIPE, SIG_IGN);
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    /* a hang-up (the terminal of a controller started by hand closed) stops it
     * like SIGTERM, socket removed. Unblocked, it went to the handler libucs
     * installs for UCX_DEBUG_SIGNO (HUP by default), which only raises UCX's
     * log level to trace-data: the controller ran on, unnoticed */
    sigaddset(&set, SIGHUP);
    /* resumed from a stop (SIGSTOP: a Slurm suspend stops the job's
     * controller with its ranks): blocked, it resumes all the same, and
     * says so here (a stop is not a gap in the loop: planning may take long) */
    sigaddset(&set, SIGCONT);
    if (sigprocmask(SIG_BLOCK, &set, NULL) != 0 ||
        (L->sfd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC)) < 0) {
        snprintf(err, el, "signalfd: %s", strerror(errno));
        return -1;
    }
    struct itimerspec it = {{0, TICK_MS * 1000000L}, {0, TICK_MS * 1000000L}};
    L->timfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (L->timfd < 0 || timerfd_settime(L->timfd, 0, &it, NULL) != 0) {
        snprintf(err, el, "timerfd: %s", strerror(errno));
        return -1;
    }
    L->ep = epoll_create1(EPOLL_CLOEXEC);
    if (L->ep < 0) {
        snprintf(err, el, "epoll: %s", strerror(errno));
        return -1;
    }
    if (listen_unix(L, o->socket_dir, err, el) != 0)
        return -1;
    if (o->tcp && listen_tcp(L, o->tcp, err, el) != 0)
        return -1;
    if (add_fd(L, L->ufd, TAG_UNIX) || (L->tfd >= 0 && add_fd(L, L->tfd, TAG_TCP)) ||
        add_fd(L, L->sfd, TAG_SIGNAL) || add_fd(L, L->timfd, TAG_TIMER)) {
        snprintf(err, el, "epoll_ctl: %s", strerror(errno));
        return -1;
    }
    return 0;
}

static void on_signal(loop_t *L)
{
    struct signalfd_siginfo si;
    while (read(L->sfd, &si, sizeof(si)) == (ssize_t)sizeof(si)) {
        if (si.ssi_signo == SIGCONT) {
            L->continued = true;
            continue;
        }
        char comm[64] = "?", path[64];
        snprintf(path, sizeof(path), "/proc/%u/comm", si.ssi_pid);
        FILE *f = fopen(path, "r");
        if (f) {
            if (fgets(comm, sizeof(comm), f))
                comm[strcspn(comm, "\n")] = 0;
            fclose(f);
        }
        lg(L, "signal %u from pid %u (%s): shutting down", si.ssi_signo, si.ssi_pid, comm);
        L->stopping = true;
    }
}

static void teardown(loop_t *L)
{
    double now = nrs_loop_now();
    L->stopping = true;
    if (L->ctl) {
        while (nrs_ctl_nconns(L->ctl) > 0)
            close_conn(L, nrs_ctl_conn(L->ctl, nrs_ctl_nconns(L->ctl) - 1), now);
        nrs_ctl_free(L->ctl);
    }
    if (L->ufd >= 0) {
        close(L->ufd);
        unlink(L->path);
    }
    if (L->contact[0])
        unlink(L->contact);
    int fds[] = {L->tfd, L->sfd, L->timfd, L->ep};
    for (size_t i = 0; i < sizeof(fds) / sizeof(fds[0]); i++)
        if (fds[i] >= 0)
            close(fds[i]);
    free(L->dirty);
}

int nrs_loop_run(const nrs_loop_opts_t *o, nrs_ctl_opts_t *co, char *err, size_t errlen)
{
    loop_t L;
    struct epoll_event ev[EVENTS];
    memset(&L, 0, sizeof(L));
    L.ep = L.ufd = L.tfd = L.sfd = L.timfd = -1;
    L.uid = geteuid();
    L.log = o->log;
    L.t0 = nrs_loop_now();
    L.skipped = nrs_awake_skipped_s();
    L.max_conns = o->max_conns > 0 ? o->max_conns : 60000;
    L.last_held = -1e9;
    L.last_full = -1e9;
    if (setup(&L, o, err, errlen) != 0) {
        if (L.ufd >= 0 && L.path[0]) { /* bound but failed later: not ours to leave */
            close(L.ufd);
            unlink(L.path);
            L.ufd = -1;
        }
        teardown(&L);
        return -1;
    }
    co->on_output = on_output;
    co->arg = &L;
    if (nrs_ctl_new(&L.ctl, co, nrs_loop_now(), err, errlen) != 0) {
        teardown(&L);
        return -1;
    }
    while (!L.stopping) {
        int n = epoll_wait(L.ep, ev, EVENTS, 1000);
        if (n < 0 && errno != EINTR) {
            lg(&L, "epoll_wait: %s", strerror(errno));
            break;
        }
        double now = nrs_loop_now();
        /* signals first: a SIGCONT before what the ranks sent after the resume */
        for (int i = 0; i < n; i++)
            if (ev[i].data.u64 == TAG_SIGNAL)
                on_signal(&L);
        if (L.continued) { /* the time it was stopped: left out of nrs_awake_s' */
            L.continued = false;
            nrs_ctl_stopped(L.ctl, now, nrs_awake_skipped_s() - L.skipped);
        }
        L.skipped = nrs_awake_skipped_s();
        for (int i = 0; i < n; i++) {
            uint64_t tag = ev[i].data.u64;
            if (tag == TAG_UNIX || tag == TAG_TCP) {
                on_accept(&L, tag == TAG_UNIX ? L.ufd : L.tfd, tag == TAG_TCP, now);
            } else if (tag == TAG_SIGNAL) {
                continue; /* read above */
            } else if (tag == TAG_TIMER) {
                uint64_t x;
                if (read(L.timfd, &x, sizeof(x)) < 0)
                    (void)0; /* nothing to do: the tick happens anyway */
                if (L.full) /* try again (fds may be free: not all are peers') */
                    arm_listeners(&L, true);
                nrs_ctl_tick(L.ctl, now);
            } else {
                on_conn(&L, ev[i].data.ptr, ev[i].events, now);
            }
        }
        if (L.oom) { /* a flush request got lost: look at every peer */
            L.oom = false;
            for (int i = 0; i < nrs_ctl_nconns(L.ctl); i++)
                on_output(&L, nrs_ctl_conn(L.ctl, i));
        }
        service(&L, now);
    }
    teardown(&L);
    lg(&L, "stopped");
    return 0;
}
