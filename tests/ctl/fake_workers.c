/* Test driver: N synthetic ranks (one process, one connection each) that
 * report synthetic stage times and follow the controller's epochs; or one
 * misbehaving peer (--bad MODE) checking that the controller answers it with
 * an ERROR or drops it. Exit 0 when what was expected happened. */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "ctl/client.h"
#include "fake_common.h"

static const char usage[] =
    "usage: fake_workers (--socket-dir D | --tcp H:P [--token-file F]) --nranks M\n"
    "         [--ranks N] [--first R] [--gpn G] [--steps S] [--interval-ms I]\n"
    "         [--factor F] [--gen-factor F] [--response-len L] [--grow G]\n"
    "         [--expect-epoch E] [--expect-retired K] [--timeout T] [--prepare-status S]\n"
    "         [--prepare-fails N] [--no-ack] [--gather-len L] [--verbose]\n"
    "       fake_workers --socket-dir D --bad garbage|midframe|slowloris|badversion|\n"
    "         hugelen|nohello|beforehello|badhello|badreport [--timeout T]\n"
    "       fake_workers --socket-dir D --bad hold --ranks N [--timeout T]\n"
    "       fake_workers --socket-dir D --bad halfclose [--timeout T]\n"
    "       fake_workers --socket-dir D --bad lategather|forgedhost --nranks M [--timeout T]\n";

static int read_token(const char *path, char *out, size_t cap)
{
    FILE *f = fopen(path, "r");
    if (!f || !fgets(out, (int)cap, f)) {
        if (f)
            fclose(f);
        return -1;
    }
    fclose(f);
    out[strcspn(out, "\n")] = 0;
    return 0;
}

/* Waits for the controller's reaction: 0 when it sent ERROR or closed. */
static int expect_drop(int fd, double timeout, const char *mode)
{
    uint8_t *buf = malloc(NRS_PROTO_HDR + NRS_PROTO_MAX_PAYLOAD);
    nrs_hdr_t h;
    char err[256];
    int rc = -1;
    double t0 = fw_now();
    while (buf && fw_now() - t0 < timeout) {
        if (nrs_client_recv(fd, buf, NRS_PROTO_HDR + NRS_PROTO_MAX_PAYLOAD, &h,
                            timeout - (fw_now() - t0), err, sizeof(err)) != 0) {
            if (strstr(err, "closed")) {
                printf("bad peer %s: connection closed by the controller\n", mode);
                rc = 0;
            } else {
                printf("bad peer %s: %s\n", mode, err);
            }
            break;
        }
        if (h.type == NRS_MSG_ERROR) {
            nrs_msg_error_t e;
            if (nrs_dec_error(buf + NRS_PROTO_HDR, h.length, &e, NULL, 0) == 0)
                printf("bad peer %s: ERROR %s: %s (after %.2f s)\n", mode,
                       nrs_perr_name((int)e.code), e.text, fw_now() - t0);
            rc = 0;
            break;
        }
    }
    free(buf);
    return rc;
}

/* N peers that connect and say nothing, held for secs, then closed: more of
 * them than the controller's fd table holds leaves the rest in its listen
 * backlog (the controller must neither spin nor stop accepting). */
static int hold_peers(const char *dir, int n, double secs)
{
    char err[512];
    int *fds = calloc((size_t)n, sizeof(int)), got = 0;
    for (int i = 0; fds && i < n; i++) {
        if ((fds[got] = nrs_client_connect_unix(dir, err, sizeof(err))) < 0) {
            fprintf(stderr, "hold: connection %d: %s\n", i, err);
            break;
        }
        got++;
    }
    printf("hold: %d connection(s) open for %.1f s\n", got, secs);
    usleep((useconds_t)(secs * 1e6));
    for (int i = 0; i < got; i++)
        close(fds[i]);
    free(fds);
    return got == n ? 0 : 1;
}

/* A CLI that sends HELLO and STATUS_REQ, then half-closes (shutdown(SHUT_WR)):
 * its reply must still come, whole, before the controller closes. */
static int halfclose_peer(const char *dir, double timeout)
{
    char err[512];
    uint8_t b[512], *buf = malloc(NRS_PROTO_HDR + NRS_PROTO_MAX_PAYLOAD);
    nrs_msg_hello_t h;
    nrs_msg_status_req_t q = {NRS_STATUS_JSON};
    nrs_hdr_t hd;
    int fd = nrs_client_connect_unix(dir, err, sizeof(err)), rc = 1, n;
    size_t text = 0;
    if (fd < 0 || !buf) {
        fprintf(stderr, "halfclose: %s\n", fd < 0 ? err : "out of memory");
        free(buf);
        return 1;
    }
    memset(&h, 0, sizeof(h));
    h.role = NRS_ROLE_CLI;
    n = nrs_enc_hello(b, sizeof(b), &h);
    n += nrs_enc_status_req(b + n, sizeof(b) - (size_t)n, &q);
    if (send(fd, b, (size_t)n, MSG_NOSIGNAL) != n || shutdown(fd, SHUT_WR) != 0) {
        fprintf(stderr, "halfclose: send: %s\n", strerror(errno));
    } else {
        while (nrs_client_recv(fd, buf, NRS_PROTO_HDR + NRS_PROTO_MAX_PAYLOAD, &hd, timeout, err,
                               sizeof(err)) == 0) {
            if (hd.type != NRS_MSG_STATUS) {
                printf("halfclose: got %s\n", nrs_msg_name(hd.type));
                break;
            }
            text += hd.length;
            if (!(hd.flags & NRS_FLAG_MORE)) {
                rc = 0;
                break;
            }
        }
        printf("halfclose: %s, %zu bytes of status%s%s\n", rc ? "reply lost" : "reply whole",
               text, rc ? ": " : "", rc ? err : "");
    }
    close(fd);
    free(buf);
    return rc;
}

/* The last rank of nranks, named on a host with a newline and a forged log
 * line in it: it gets its plan and hangs up (the controller logs that). */
static int forged_host(const char *dir, int nranks, double timeout)
{
    static uint8_t b[NRS_PROTO_HDR + NRS_PROTO_MAX_PAYLOAD];
    nrs_msg_hello_t hm;
    nrs_hdr_t h;
    char err[512];
    int fd = nrs_client_connect_unix(dir, err, sizeof(err)), rc = 1;
    memset(&hm, 0, sizeof(hm));
    hm.role = NRS_ROLE_WORKER;
    hm.rank = nranks - 1;
    hm.nranks = nranks;
    snprintf(hm.host, sizeof(hm.host), "node0\nnereus-controller: [0.000] FORGED");
    if (fd >= 0 && nrs_client_send(fd, b, nrs_enc_hello(b, sizeof(b), &hm), err, sizeof(err)) == 0 &&
        nrs_client_recv(fd, b, sizeof(b), &h, timeout, err, sizeof(err)) == 0)
        rc = h.type == NRS_MSG_PLAN ? 0 : 1;
    printf("forgedhost: %s\n", rc ? err : "got the plan, hanging up");
    if (fd >= 0)
        close(fd);
    return rc;
}

/* Rank 0 and rank 1 of nranks (the others left out): rank 0 contributes to a
 * gather of 1 s and is answered without rank 1 at its deadline; rank 1's late
 * contribution must not open a second gather of the same (key, name) with
 * another answer: it is refused at once. */
static int late_gather(const char *dir, int nranks, double timeout)
{
    static nrs_msg_gather_t m;
    static uint8_t b[NRS_PROTO_HDR + NRS_PROTO_MAX_PAYLOAD], buf[NRS_PROTO_HDR + NRS_PROTO_MAX_PAYLOAD];
    int fd[2] = {-1, -1}, rc = 1;
    char err[512];
    nrs_hdr_t h;
    for (int i = 0; i < 2; i++) {
        nrs_msg_hello_t hm;
        memset(&hm, 0, sizeof(hm));
        hm.role = NRS_ROLE_WORKER;
        hm.rank = i;
        hm.nranks = nranks;
        snprintf(hm.host, sizeof(hm.host), "node0");
        if ((fd[i] = nrs_client_connect_unix(dir, err, sizeof(err))) < 0 ||
            nrs_client_send(fd[i], b, nrs_enc_hello(b, sizeof(b), &hm), err, sizeof(err)) != 0 ||
            nrs_client_recv(fd[i], buf, sizeof(buf), &h, timeout, err, sizeof(err)) != 0 ||
            h.type != NRS_MSG_PLAN) {
            printf("lategather: rank %d: no PLAN: %s\n", i, err);
            goto out;
        }
    }
    memset(&m, 0, sizeof(m));
    m.key = 42;
    snprintf(m.name, sizeof(m.name), "vote");
    m.timeout_ms = 1000;
    m.nranks = nranks;
    for (int r = 2; r < nranks && m.nout < NRS_GATHER_MAX_OUT; r++)
        m.out[m.nout++] = r;
    m.len = 1;
    for (int i = 0; i < 2; i++) {
        uint8_t v = (uint8_t)('A' + i);
        double t0 = fw_now();
        m.data = &v;
        if (nrs_client_send(fd[i], b, nrs_enc_gather(b, sizeof(b), &m), err, sizeof(err)) != 0 ||
            nrs_client_recv(fd[i], buf, sizeof(buf), &h, timeout, err, sizeof(err)) != 0) {
            printf("lategather: rank %d: %s\n", i, err);
            goto out;
        }
        double dt = fw_now() - t0;
        nrs_msg_gathered_t g;
        nrs_msg_error_t e;
        if (h.type == NRS_MSG_GATHERED &&
            nrs_dec_gathered(buf + NRS_PROTO_HDR, h.length, &g, err, sizeof(err)) == 0) {
            printf("lategather: rank %d: GATHERED of %u rank(s) after %.2f s\n", i, g.count, dt);
            if (i == 1 || g.count != 1) /* a second answer to one gather */
                goto out;
        } else if (h.type == NRS_MSG_ERROR &&
                   nrs_dec_error(buf + NRS_PROTO_HDR, h.length, &e, NULL, 0) == 0) {
            printf("lategather: rank %d: ERROR %s: %s (after %.2f s)\n", i,
                   nrs_perr_name((int)e.code), e.text, dt);
            rc = i == 1 && e.code == NRS_PERR_REFUSED && dt < 0.5 ? 0 : 1;
        } else {
            printf("lategather: rank %d: unexpected %s\n", i, nrs_msg_name(h.type));
            goto out;
        }
    }
out:
    for (int i = 0; i < 2; i++)
        if (fd[i] >= 0)
            close(fd[i]);
    return rc;
}

static int bad_peer(const char *dir, const char *mode, double timeout)
{
    char err[512];
    uint8_t buf[512];
    int fd = nrs_client_connect_unix(dir, err, sizeof(err)), n;
    if (fd < 0) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    nrs_msg_hello_t h;
    memset(&h, 0, sizeof(h));
    h.role = NRS_ROLE_WORKER;
    h.rank = 0;
    h.nranks = 1;
    snprintf(h.host, sizeof(h.host), "badhost");
    int rc = 1;
    if (!strcmp(mode, "garbage")) {
        for (int i = 0; i < 256; i++)
            buf[i] = (uint8_t)(i * 37 + 11);
        send(fd, buf, 256, MSG_NOSIGNAL);
        rc = expect_drop(fd, timeout, mode) ? 1 : 0;
    } else if (!strcmp(mode, "flood")) {
        uint8_t *junk = malloc(200000);
        unsigned x = 12345;
        for (int i = 0; junk && i < 200000; i++)
            junk[i] = (uint8_t)((x = x * 1103515245u + 12345u) >> 16);
        if (junk)
            send(fd, junk, 200000, MSG_NOSIGNAL | MSG_DONTWAIT);
        free(junk);
        rc = expect_drop(fd, timeout, mode) ? 1 : 0;
    } else if (!strcmp(mode, "midframe")) {
        n = nrs_enc_hello(buf, sizeof(buf), &h);
        send(fd, buf, (size_t)n / 2, MSG_NOSIGNAL); /* and hang up */
        printf("bad peer midframe: sent %d of %d bytes, closing\n", n / 2, n);
        rc = 0;
    } else if (!strcmp(mode, "slowloris")) {
        n = nrs_enc_hello(buf, sizeof(buf), &h);
        double t0 = fw_now();
        for (int i = 0; i < n - 1 && fw_now() - t0 < timeout; i++) {
            if (send(fd, buf + i, 1, MSG_NOSIGNAL) < 0)
                break;
            struct pollfd p = {.fd = fd, .events = POLLIN};
            if (poll(&p, 1, 1000) > 0)
                break; /* the controller answered */
        }
        rc = expect_drop(fd, timeout, mode) ? 1 : 0;
    } else if (!strcmp(mode, "badversion") || !strcmp(mode, "hugelen")) {
        n = nrs_enc_hello(buf, sizeof(buf), &h);
        if (mode[0] == 'b')
            buf[4] = 99; /* version */
        else
            buf[15] = 0x7f; /* length ~ 2 GiB */
        send(fd, buf, (size_t)n, MSG_NOSIGNAL);
        rc = expect_drop(fd, timeout, mode) ? 1 : 0;
    } else if (!strcmp(mode, "nohello")) {
        rc = expect_drop(fd, timeout, mode) ? 1 : 0;
    } else if (!strcmp(mode, "beforehello")) {
        nrs_msg_status_req_t q = {0};
        n = nrs_enc_status_req(buf, sizeof(buf), &q);
        send(fd, buf, (size_t)n, MSG_NOSIGNAL);
        rc = expect_drop(fd, timeout, mode) ? 1 : 0;
    } else if (!strcmp(mode, "badhello")) {
        n = nrs_enc_hello(buf, sizeof(buf), &h);
        buf[NRS_PROTO_HDR] = 9; /* role */
        send(fd, buf, (size_t)n, MSG_NOSIGNAL);
        rc = expect_drop(fd, timeout, mode) ? 1 : 0;
    } else if (!strcmp(mode, "badreport")) {
        h.role = NRS_ROLE_CLI;
        h.rank = h.nranks = 0;
        n = nrs_enc_hello(buf, sizeof(buf), &h);
        send(fd, buf, (size_t)n, MSG_NOSIGNAL);
        nrs_msg_report_t r;
        memset(&r, 0, sizeof(r));
        r.epoch = 1;
        n = nrs_enc_report(buf, sizeof(buf), &r); /* a CLI may not report */
        send(fd, buf, (size_t)n, MSG_NOSIGNAL);
        rc = expect_drop(fd, timeout, mode) ? 1 : 0;
    } else {
        fprintf(stderr, "unknown --bad mode '%s'\n", mode);
        rc = 2;
    }
    close(fd);
    return rc;
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"socket-dir", 1, NULL, 'd'}, {"tcp", 1, NULL, 't'},      {"token-file", 1, NULL, 'k'},
        {"ranks", 1, NULL, 'n'},      {"first", 1, NULL, 'f'},    {"nranks", 1, NULL, 'N'},
        {"gpn", 1, NULL, 'g'},        {"steps", 1, NULL, 's'},    {"interval-ms", 1, NULL, 'i'},
        {"factor", 1, NULL, 'x'},     {"gen-factor", 1, NULL, 'X'},
        {"response-len", 1, NULL, 'r'}, {"grow", 1, NULL, 'G'},  {"expect-epoch", 1, NULL, 'e'},
        {"expect-retired", 1, NULL, 'R'}, {"timeout", 1, NULL, 'T'},
        {"prepare-status", 1, NULL, 'p'}, {"no-ack", 0, NULL, 'A'}, {"bad", 1, NULL, 'b'},
        {"verbose", 0, NULL, 'v'},    {"gather-len", 1, NULL, 'L'}, {"prepare-fails", 1, NULL, 'P'},
        {NULL, 0, NULL, 0}};
    const char *dir = NULL, *tcp = NULL, *token_file = NULL, *bad = NULL;
    int n = 1, first = 0, nranks = -1, gpn = 8, steps = 0, interval = 50, expect_retired = -1;
    int gather_len = -1;
    double factor = 1, gen_factor = 1, resp = 0, grow = 0, timeout = 20;
    unsigned expect_epoch = 0;
    fw_fleet_t f;
    char token[NRS_PROTO_TOKEN_MAX] = "";
    int ch;
    memset(&f, 0, sizeof(f));
    f.prepare_fails = -1;
    while ((ch = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (ch) {
        case 'd': dir = optarg; break;
        case 't': tcp = optarg; break;
        case 'k': token_file = optarg; break;
        case 'n': n = atoi(optarg); break;
        case 'f': first = atoi(optarg); break;
        case 'N': nranks = atoi(optarg); break;
        case 'g': gpn = atoi(optarg); break;
        case 's': steps = atoi(optarg); break;
        case 'i': interval = atoi(optarg); break;
        case 'x': factor = atof(optarg); break;
        case 'X': gen_factor = atof(optarg); break;
        case 'r': resp = atof(optarg); break;
        case 'G': grow = atof(optarg); break;
        case 'e': expect_epoch = (unsigned)atoi(optarg); break;
        case 'R': expect_retired = atoi(optarg); break;
        case 'T': timeout = atof(optarg); break;
        case 'p': f.prepare_status = atoi(optarg); break;
        case 'P': f.prepare_fails = atoi(optarg); break;
        case 'A': f.no_ack = true; break;
        case 'b': bad = optarg; break;
        case 'v': f.verbose = true; break;
        case 'L': gather_len = atoi(optarg); break;
        default: fputs(usage, stderr); return 2;
        }
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    struct rlimit rl; /* a connection per rank */
    if (n > 200 && getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    if (bad && dir && !strcmp(bad, "hold"))
        return hold_peers(dir, n, timeout);
    if (bad && dir && !strcmp(bad, "halfclose"))
        return halfclose_peer(dir, timeout);
    if (bad && dir && !strcmp(bad, "lategather"))
        return nranks >= 2 ? late_gather(dir, nranks, timeout) : 2;
    if (bad && dir && !strcmp(bad, "forgedhost"))
        return nranks >= 1 ? forged_host(dir, nranks, timeout) : 2;
    if (bad)
        return dir ? bad_peer(dir, bad, timeout) : 2;
    if ((!dir && !tcp) || nranks < 1 || n < 1) {
        fputs(usage, stderr);
        return 2;
    }
    if (token_file && read_token(token_file, token, sizeof(token)) != 0) {
        fprintf(stderr, "cannot read %s\n", token_file);
        return 2;
    }
    f.transition_s = 0.05;
    double t0 = fw_now();
    if (fw_connect(&f, dir, tcp, token, first, n, nranks, gpn) != 0)
        return 1;
    /* Every rank must learn the current plan. */
    for (;;) {
        int have = 0;
        for (int i = 0; i < f.n; i++)
            have += f.r[i].epoch > 0 || f.r[i].dead;
        if (have == f.n || fw_now() - t0 > timeout)
            break;
        fw_pump(&f, 50);
    }
    for (int i = 0; i < f.n; i++)
        if (f.r[i].dead) {
            printf("rank %d: refused: %s\n", f.r[i].rank, f.r[i].error);
            fw_close(&f);
            return 1;
        }
    printf("%d ranks connected, epoch %u\n", f.n, f.r[0].epoch);
    if (gather_len >= 0) { /* one gather of every rank, its answer checked everywhere */
        double tg = fw_now();
        int got = fw_gather(&f, 7, "fw", (uint32_t)gather_len, nranks, (int)(timeout * 1000));
        printf("gather of %d x %d bytes: %d of %d rank(s) got the whole answer in %.3f s\n",
               f.n, gather_len, got, f.n, fw_now() - tg);
        int all = f.n;
        fw_close(&f);
        return got == all ? 0 : 1;
    }
    for (int s = 0; s < steps && fw_now() - t0 < timeout; s++) {
        fw_report(&f, s, factor, gen_factor, resp > 0 ? resp + grow * s : 0);
        double until = fw_now() + interval / 1000.0;
        while (fw_now() < until)
            fw_pump(&f, 10);
    }
    /* Then follow the controller until the expected epoch is everywhere. */
    int rc = 0;
    long step = steps;
    for (;;) {
        int live = 0, at = 0, retired = 0;
        for (int i = 0; i < f.n; i++) {
            live += !f.r[i].dead;
            at += !f.r[i].dead && f.r[i].epoch >= expect_epoch && !f.r[i].pending;
            retired += f.r[i].retired;
        }
        bool done = at == live && (expect_retired < 0 || retired == expect_retired);
        if (done && expect_epoch == 0 && expect_retired < 0)
            break;
        if (done) {
            printf("expected state reached: %d live ranks at epoch >= %u, %d retired\n", live,
                   expect_epoch, retired);
            break;
        }
        if (fw_now() - t0 > timeout) {
            printf("time-out: %d of %d live ranks at epoch >= %u, %d retired\n", at, live,
                   expect_epoch, retired);
            rc = 1;
            break;
        }
        fw_pump(&f, 20);
        /* Keep reporting on the new epoch (once in a while) like a real job. */
        static double last;
        if (fw_now() - last > interval / 1000.0) {
            fw_report(&f, step, factor, gen_factor, resp > 0 ? resp + grow * (double)step : 0);
            step++;
            last = fw_now();
        }
    }
    for (int i = 0; i < f.n; i++)
        printf("rank %d (%s): epoch %u, %lu plans, %lu prepares, %lu commits, %lu aborts%s%s\n",
               f.r[i].rank, f.r[i].host, f.r[i].epoch, f.r[i].plans, f.r[i].prepares,
               f.r[i].commits, f.r[i].aborts, f.r[i].retired ? ", retired: " : "",
               f.r[i].retired ? f.r[i].error : "");
    fw_close(&f);
    return rc;
}
