/* Blocking peer helpers with poll()-based time-outs. */
#define _GNU_SOURCE
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "util/util.h"
#include "ctl/auth.h"
#include "ctl/client.h"

/* SO_SNDTIMEO bounds a blocking connect (unix: while the listener's backlog
 * is full; TCP: the SYN retries) and each send; 0 s: no bound. */
static int set_sndtimeo(int fd, double s)
{
    struct timeval tv = {0, 0};
    if (s > 0) {
        tv.tv_sec = (time_t)s;
        tv.tv_usec = (suseconds_t)((s - (double)tv.tv_sec) * 1e6);
        if (tv.tv_sec == 0 && tv.tv_usec == 0)
            tv.tv_usec = 1;
    }
    return setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

/* connect() within the fd's send time-out: 0, or -1 with errno (ETIMEDOUT
 * once it passed: Linux says EINPROGRESS for TCP, EAGAIN for unix). */
static int connect_bounded(int fd, const struct sockaddr *sa, socklen_t len)
{
    int rc;
    do
        rc = connect(fd, sa, len);
    while (rc != 0 && errno == EINTR);
    if (rc != 0 && (errno == EINPROGRESS || errno == EAGAIN || errno == EWOULDBLOCK))
        errno = ETIMEDOUT;
    return rc;
}

int nrs_client_connect_unix_within(const char *dir, double timeout_s, char *err, size_t errlen)
{
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof(sa));
    sa.sun_family = AF_UNIX;
    if (nrs_auth_socket_path(dir, sa.sun_path, sizeof(sa.sun_path)) != 0) {
        snprintf(err, errlen, "%s: path too long for a unix socket", dir);
        return -1;
    }
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || set_sndtimeo(fd, timeout_s) != 0 ||
        connect_bounded(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
        if (errno == ETIMEDOUT)
            snprintf(err, errlen, "cannot connect to the controller at %s: no connection within "
                     "%g s (its backlog is full)", sa.sun_path, timeout_s);
        else
            snprintf(err, errlen, "cannot connect to the controller at %s: %s", sa.sun_path,
                     strerror(errno));
        if (fd >= 0)
            close(fd);
        return -1;
    }
    return fd;
}

int nrs_client_connect_tcp_within(const char *hostport, double timeout_s, char *err,
                                  size_t errlen)
{
    char host[256];
    struct addrinfo hints, *res = NULL, *ai;
    const char *colon = strrchr(hostport, ':');
    if (!colon || (size_t)(colon - hostport) >= sizeof(host)) {
        snprintf(err, errlen, "%s: expected HOST:PORT", hostport);
        return -1;
    }
    memcpy(host, hostport, (size_t)(colon - hostport));
    host[colon - hostport] = 0;
    memset(&hints, 0, sizeof(hints));
    hints.ai_socktype = SOCK_STREAM;
    int gai = getaddrinfo(host, colon + 1, &hints, &res);
    if (gai != 0) {
        snprintf(err, errlen, "%s: %s", hostport, gai_strerror(gai));
        return -1;
    }
    /* one deadline for every address the name has */
    double deadline = nrs_now_s() + timeout_s, left = timeout_s;
    int fd = -1, e = 0;
    for (ai = res; ai && left > 0; ai = ai->ai_next, left = deadline - nrs_now_s()) {
        fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd >= 0 && set_sndtimeo(fd, left) == 0 &&
            connect_bounded(fd, ai->ai_addr, ai->ai_addrlen) == 0)
            break;
        e = errno;
        if (fd >= 0)
            close(fd);
        fd = -1;
    }
    if (fd < 0 && (e == ETIMEDOUT || e == 0))
        snprintf(err, errlen, "cannot connect to %s: no connection within %g s", hostport,
                 timeout_s);
    else if (fd < 0)
        snprintf(err, errlen, "cannot connect to %s: %s", hostport, strerror(e));
    else
        set_sndtimeo(fd, timeout_s); /* what is left of it bounded the connect */
    freeaddrinfo(res);
    return fd;
}

/* The bounded connect, then sends without a bound (the peer's pace, as
 * before): ranks keep their fd for the whole job. */
static int unbound_sends(int fd)
{
    if (fd >= 0)
        set_sndtimeo(fd, 0);
    return fd;
}

int nrs_client_connect_unix(const char *dir, char *err, size_t errlen)
{
    return unbound_sends(nrs_client_connect_unix_within(dir, NRS_CLIENT_CONNECT_S, err, errlen));
}

int nrs_client_connect_tcp(const char *hostport, char *err, size_t errlen)
{
    return unbound_sends(nrs_client_connect_tcp_within(hostport, NRS_CLIENT_CONNECT_S, err,
                                                       errlen));
}

int nrs_client_send(int fd, const uint8_t *frame, int n, char *err, size_t errlen)
{
    if (n < 0) {
        snprintf(err, errlen, "message does not fit a frame");
        return -1;
    }
    for (int off = 0; off < n;) {
        ssize_t k = send(fd, frame + off, (size_t)(n - off), MSG_NOSIGNAL);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            /* the fd's send time-out (connect_*_within) passed: not
             * "timed out", which callers read as "sent, not answered" */
            snprintf(err, errlen, "send: the controller does not read its input");
            return -1;
        }
        if (k < 0) {
            snprintf(err, errlen, "send: %s", strerror(errno));
            return -1;
        }
        off += (int)k;
    }
    return 0;
}

static int read_full(int fd, uint8_t *b, size_t n, double deadline, char *err, size_t errlen)
{
    size_t got = 0;
    while (got < n) {
        /* awake time, in slices (util.h): a peer stopped with its job (a
         * Slurm suspend) that resumes has its answer read, not timed out */
        double left = deadline - nrs_awake_s();
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int pr = left > 0 ? poll(&p, 1, nrs_awake_slice_ms(left)) : 0;
        if ((pr < 0 && errno == EINTR) || (pr == 0 && left > 0)) /* the deadline decides */
            continue;
        if (pr <= 0) {
            snprintf(err, errlen, "no answer from the controller (timed out)");
            return -1;
        }
        ssize_t k = read(fd, b + got, n - got);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0) {
            snprintf(err, errlen, "the controller closed the connection%s",
                     k < 0 ? " (error)" : "");
            return -1;
        }
        got += (size_t)k;
    }
    return 0;
}

int nrs_client_recv(int fd, uint8_t *buf, size_t cap, nrs_hdr_t *h, double timeout_s, char *err,
                    size_t errlen)
{
    double deadline = nrs_awake_s() + timeout_s;
    if (cap < NRS_PROTO_HDR + NRS_PROTO_MAX_PAYLOAD) {
        snprintf(err, errlen, "receive buffer too small");
        return -1;
    }
    if (read_full(fd, buf, NRS_PROTO_HDR, deadline, err, errlen) != 0)
        return -1;
    int rc = nrs_proto_hdr_decode(buf, h);
    if (rc != 0) {
        snprintf(err, errlen, "bad frame from the controller: %s", nrs_perr_name(-rc));
        return -1;
    }
    return read_full(fd, buf + NRS_PROTO_HDR, h->length, deadline, err, errlen);
}

int nrs_client_refusal(int fd, char *err, size_t errlen)
{
    enum { FRAMES = 64 }; /* what the controller sent before it: PREPAREs, answers, ... */
    uint8_t *buf = malloc(NRS_PROTO_HDR + NRS_PROTO_MAX_PAYLOAD);
    nrs_hdr_t h;
    nrs_msg_error_t e;
    char why[256];
    int rc = -1;
    for (int i = 0; buf && rc && i < FRAMES; i++) {
        if (nrs_client_recv(fd, buf, NRS_PROTO_HDR + NRS_PROTO_MAX_PAYLOAD, &h, 1.0, why,
                            sizeof(why)))
            break;
        if (h.type == NRS_MSG_ERROR &&
            nrs_dec_error(buf + NRS_PROTO_HDR, h.length, &e, NULL, 0) == 0) {
            snprintf(err, errlen, "the controller refused: %s: %s", nrs_perr_name((int)e.code),
                     e.text);
            rc = 0;
        }
    }
    free(buf);
    return rc;
}

int nrs_client_hello(int fd, int role, char *err, size_t errlen)
{
    nrs_msg_hello_t m;
    uint8_t buf[512];
    memset(&m, 0, sizeof(m));
    m.role = (uint32_t)role;
    if (gethostname(m.host, sizeof(m.host)) != 0)
        m.host[0] = 0;
    m.host[sizeof(m.host) - 1] = 0;
    return nrs_client_send(fd, buf, nrs_enc_hello(buf, sizeof(buf), &m), err, errlen);
}

const char *nrs_client_socket_dir(const char *opt)
{
    if (opt && *opt)
        return opt;
    const char *e = getenv("NEREUS_SOCKET_DIR");
    return e && *e ? e : NULL;
}
