/* Blocking peer helpers with poll()-based time-outs. */
#define _GNU_SOURCE
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "util/util.h"
#include "ctl/auth.h"
#include "ctl/client.h"

int nrs_client_connect_unix(const char *dir, char *err, size_t errlen)
{
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof(sa));
    sa.sun_family = AF_UNIX;
    if (nrs_auth_socket_path(dir, sa.sun_path, sizeof(sa.sun_path)) != 0) {
        snprintf(err, errlen, "%s: path too long for a unix socket", dir);
        return -1;
    }
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
        snprintf(err, errlen, "cannot connect to the controller at %s: %s", sa.sun_path,
                 strerror(errno));
        if (fd >= 0)
            close(fd);
        return -1;
    }
    return fd;
}

int nrs_client_connect_tcp(const char *hostport, char *err, size_t errlen)
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
    int fd = -1;
    for (ai = res; ai; ai = ai->ai_next) {
        fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen) == 0)
            break;
        if (fd >= 0)
            close(fd);
        fd = -1;
    }
    if (fd < 0)
        snprintf(err, errlen, "cannot connect to %s: %s", hostport, strerror(errno));
    freeaddrinfo(res);
    return fd;
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
        double left = deadline - nrs_now_s();
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int pr = left > 0 ? poll(&p, 1, (int)(left * 1000) + 1) : 0;
        if (pr < 0 && errno == EINTR)
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
    double deadline = nrs_now_s() + timeout_s;
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
