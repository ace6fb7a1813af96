/* Connection output bounds (runtime/ctl/conn.c): a status reply larger than
 * NRS_CONN_OUT_MAX, queued at once in chunks, reaches a peer that reads it;
 * what piles up beyond the bound between messages is still refused.
 * Client time-outs (runtime/ctl/client.c): a connect to a listener whose
 * backlog is full, unix or TCP, and a send to a peer that does not read,
 * give up within the time-out. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "ctl/client.h"
#include "util/util.h"

#include "ctl/conn.h"
#include "ctl/proto.h"

#define CAP (NRS_PROTO_HDR + NRS_PROTO_MAX_PAYLOAD)
static uint8_t buf[CAP];
static char text[NRS_PROTO_MAX_PAYLOAD];

/* Queue a status reply of len bytes the way the controller does (chunks of
 * NRS_PROTO_MAX_PAYLOAD, MORE on each but the last): 0, or -1 at the first
 * chunk refused. */
static int queue_reply(nrs_conn_t *c, size_t len)
{
    size_t off = 0;
    do {
        size_t k = len - off < sizeof(text) ? len - off : sizeof(text);
        uint32_t fl = off + k < len ? NRS_FLAG_MORE : 0;
        int n = nrs_enc_status(buf, sizeof(buf), text, k, fl);
        assert_true(n > 0);
        if (nrs_conn_queue(c, buf, (size_t)n) != 0)
            return -1;
        off += k;
    } while (off < len);
    return 0;
}

static size_t drain(nrs_conn_t *c)
{
    size_t got = 0, k;
    while ((k = nrs_conn_take(c, buf, sizeof(buf))) > 0)
        got += k;
    return got;
}

static void test_large_reply_passes(void **st)
{
    (void)st;
    memset(text, 'x', sizeof(text));
    nrs_conn_t *c = nrs_conn_new(-1, 0);
    assert_non_null(c);
    /* 20 MiB of status: more than NRS_CONN_OUT_MAX, all of it queued */
    size_t len = 20u << 20, frames = (len + sizeof(text) - 1) / sizeof(text);
    assert_int_equal(queue_reply(c, len), 0);
    assert_int_equal(nrs_conn_pending(c), len + frames * NRS_PROTO_HDR);
    assert_int_equal(drain(c), len + frames * NRS_PROTO_HDR);
    /* read: the next reply is taken as well */
    assert_int_equal(queue_reply(c, len), 0);
    /* not read: the next message finds more than the bound pending */
    int n = nrs_enc_status(buf, sizeof(buf), "x", 1, 0);
    assert_int_equal(nrs_conn_queue(c, buf, (size_t)n), -1);
    nrs_conn_free(c);
}

static void test_bounds_kept(void **st)
{
    (void)st;
    memset(text, 'x', sizeof(text));
    nrs_conn_t *c = nrs_conn_new(-1, 0);
    assert_non_null(c);
    /* single frames piling up: refused once they pass NRS_CONN_OUT_MAX */
    int n = nrs_enc_status(buf, sizeof(buf), text, sizeof(text), 0);
    size_t queued = 0;
    while (nrs_conn_queue(c, buf, (size_t)n) == 0)
        queued += (size_t)n;
    assert_true(queued <= NRS_CONN_OUT_MAX);
    assert_true(queued + 2 * (size_t)n > NRS_CONN_OUT_MAX);
    nrs_conn_clear_out(c);
    /* one message, however long, stops at NRS_CONN_OUT_MAX + NRS_CONN_MSG_MAX */
    assert_int_equal(queue_reply(c, (size_t)NRS_CONN_OUT_MAX + NRS_CONN_MSG_MAX + (1u << 20)), -1);
    assert_true(nrs_conn_pending(c) <= (size_t)NRS_CONN_OUT_MAX + NRS_CONN_MSG_MAX);
    assert_true(nrs_conn_pending(c) > (size_t)NRS_CONN_MSG_MAX);
    nrs_conn_free(c);
}

/* Connect non-blocking to sa until the listener's backlog is full (unix:
 * EAGAIN; TCP: a few past the accept queue, whose SYNs are then dropped). */
static int fill_backlog(const struct sockaddr *sa, socklen_t len, int *held, int max)
{
    int n = 0;
    while (n < max) {
        int fd = socket(sa->sa_family, SOCK_STREAM | SOCK_NONBLOCK, 0);
        assert_true(fd >= 0);
        if (connect(fd, sa, len) != 0 && sa->sa_family == AF_UNIX) {
            close(fd);
            break;
        }
        held[n++] = fd;
    }
    return n;
}

/* A listener on DIR/ctl.sock in a new temporary dir (a controller that
 * accepts nobody); unix_done removes it. */
static int unix_listener(char *dir, struct sockaddr_un *sa, int backlog)
{
    assert_non_null(mkdtemp(dir));
    *sa = (struct sockaddr_un){.sun_family = AF_UNIX};
    snprintf(sa->sun_path, sizeof(sa->sun_path), "%s/ctl.sock", dir);
    int l = socket(AF_UNIX, SOCK_STREAM, 0);
    assert_int_equal(bind(l, (struct sockaddr *)sa, sizeof(*sa)), 0);
    assert_int_equal(listen(l, backlog), 0);
    return l;
}

static void unix_done(int l, const struct sockaddr_un *sa, const char *dir)
{
    close(l);
    unlink(sa->sun_path);
    rmdir(dir);
}

static void test_connect_unix_backlog_full(void **st)
{
    (void)st;
    char dir[] = "/tmp/nrs-conn-XXXXXX", err[512];
    int held[64];
    struct sockaddr_un sa;
    int l = unix_listener(dir, &sa, 0);
    int n = fill_backlog((struct sockaddr *)&sa, sizeof(sa), held, 64);
    double t0 = nrs_now_s();
    assert_int_equal(nrs_client_connect_unix_within(dir, 0.3, err, sizeof(err)), -1);
    double dt = nrs_now_s() - t0;
    assert_true(dt >= 0.25 && dt < 2);
    assert_non_null(strstr(err, "no connection within 0.3 s"));
    assert_null(strstr(err, "timed out")); /* nereus delta reads that as "sent" */
    for (int i = 0; i < n; i++)
        close(held[i]);
    unix_done(l, &sa, dir);
}

static void test_connect_tcp_backlog_full(void **st)
{
    (void)st;
    char hp[64], err[512];
    int held[8];
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof(sa);
    int l = socket(AF_INET, SOCK_STREAM, 0);
    assert_int_equal(bind(l, (struct sockaddr *)&sa, sizeof(sa)), 0);
    assert_int_equal(listen(l, 0), 0);
    assert_int_equal(getsockname(l, (struct sockaddr *)&sa, &sl), 0);
    snprintf(hp, sizeof(hp), "127.0.0.1:%u", ntohs(sa.sin_port));
    int n = fill_backlog((struct sockaddr *)&sa, sizeof(sa), held, 8);
    usleep(100000); /* their handshakes fill the accept queue */
    double t0 = nrs_now_s();
    int fd = nrs_client_connect_tcp_within(hp, 0.3, err, sizeof(err));
    double dt = nrs_now_s() - t0;
    assert_int_equal(fd, -1);
    assert_true(dt < 2);
    assert_non_null(strstr(err, "no connection within 0.3 s"));
    for (int i = 0; i < n; i++)
        close(held[i]);
    close(l);
}

static void test_send_not_read(void **st)
{
    (void)st;
    char dir[] = "/tmp/nrs-conn-XXXXXX", err[512];
    struct sockaddr_un sa;
    int l = unix_listener(dir, &sa, 4);
    int fd = nrs_client_connect_unix_within(dir, 0.3, err, sizeof(err));
    assert_true(fd >= 0);
    /* a peer that never reads: the socket buffers fill, then the send gives up */
    int n = nrs_enc_status(buf, sizeof(buf), text, sizeof(text), 0), rc = 0, i;
    double t0 = nrs_now_s();
    for (i = 0; i < 1000 && rc == 0; i++)
        rc = nrs_client_send(fd, buf, n, err, sizeof(err));
    assert_int_equal(rc, -1);
    assert_true(nrs_now_s() - t0 < 3);
    assert_non_null(strstr(err, "does not read"));
    close(fd);
    unix_done(l, &sa, dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_large_reply_passes),
        cmocka_unit_test(test_bounds_kept),
        cmocka_unit_test(test_connect_unix_backlog_full),
        cmocka_unit_test(test_connect_tcp_backlog_full),
        cmocka_unit_test(test_send_not_read),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
