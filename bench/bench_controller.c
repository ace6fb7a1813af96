/* bench_controller: controller overhead per step with N simulated ranks (one
 * unix-socket connection each, the real protocol) reporting every step.
 * Starts nereus-controller, runs S steps as fast as the controller absorbs
 * them, and prints messages per second and controller CPU time per step
 * (from /proc/PID/stat), with that CPU time as a share of a 10 s step.
 * A run in which a rank got no plan or the controller did not take every
 * report sent prints no figures and exits 1 (--help).
 *   bench_controller CONTROLLER SPEC [RANKS=1024] [STEPS=50] */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ctl/client.h"
#include "../tests/ctl/fake_common.h"

static double cpu_s(pid_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f || !fgets(buf, sizeof(buf), f)) {
        if (f)
            fclose(f);
        return -1;
    }
    fclose(f);
    char *p = strrchr(buf, ')'); /* fields after the command name */
    unsigned long ut = 0, st = 0;
    if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2)
        return -1;
    return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

/* Reports the controller has taken, from its JSON status. */
static long reports_seen(const char *dir)
{
    char err[256];
    int fd = nrs_client_connect_unix(dir, err, sizeof(err));
    if (fd < 0)
        return -1;
    static uint8_t buf[NRS_PROTO_HDR + NRS_PROTO_MAX_PAYLOAD];
    nrs_msg_status_req_t q = {NRS_STATUS_JSON};
    nrs_hdr_t h;
    long n = -1;
    static char all[8 << 20];
    size_t len = 0;
    if (nrs_client_hello(fd, NRS_ROLE_CLI, err, sizeof(err)) == 0 &&
        nrs_client_send(fd, buf, nrs_enc_status_req(buf, sizeof(buf), &q), err, sizeof(err)) == 0)
        while (nrs_client_recv(fd, buf, sizeof(buf), &h, 30, err, sizeof(err)) == 0 &&
               h.type == NRS_MSG_STATUS) {
            if (len + h.length < sizeof(all) - 1) {
                memcpy(all + len, buf + NRS_PROTO_HDR, h.length);
                len += h.length;
            }
            if (!(h.flags & NRS_FLAG_MORE))
                break;
        }
    all[len] = 0;
    const char *p = strstr(all, "\"counters\":{\"reports\":");
    if (p)
        n = atol(p + strlen("\"counters\":{\"reports\":"));
    close(fd);
    return n;
}

/* A count on the command line: digits only, in [min, max]. */
static int parse_count(const char *s, long min, long max, int *out)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (end == s || *end || *s == '-' || *s == '+' || v < min || v > max)
        return -1;
    *out = (int)v;
    return 0;
}

/* One descriptor per rank, in this process: raise the soft limit toward
 * the hard one (a default soft limit of 1,024 is short of 1,024 ranks). */
static int want_fds(long n)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl))
        return -1;
    if (rl.rlim_cur != RLIM_INFINITY && (long)rl.rlim_cur < n) {
        rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || (long)rl.rlim_max > n ? (rlim_t)n
                                                                            : rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
        getrlimit(RLIMIT_NOFILE, &rl);
    }
    return rl.rlim_cur == RLIM_INFINITY || (long)rl.rlim_cur >= n ? 0 : -1;
}

/* The controller's log (its stderr) and the last line of it, for a failure. */
static void last_line(const char *path, char *line, size_t len)
{
    char buf[1024];
    FILE *f = fopen(path, "r");
    snprintf(line, len, "(no output)");
    while (f && fgets(buf, sizeof(buf), f))
        if (buf[0] && buf[0] != '\n') {
            buf[strcspn(buf, "\n")] = 0;
            snprintf(line, len, "%.400s", buf); /* a long line cut */
        }
    if (f)
        fclose(f);
}

/* Ranks of the fleet whose report of step went out (fw_report skips a rank
 * without a plan or amid a transition; a failed send marks it dead). */
static long reports_sent(const fw_fleet_t *f, long step)
{
    long n = 0;
    for (int i = 0; i < f->n; i++)
        n += !f->r[i].dead && f->r[i].step == step;
    return n;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: bench_controller CONTROLLER SPEC [RANKS] [STEPS]\n"
               "  RANKS fake ranks (default 1024, one unix-socket connection each) report\n"
               "  STEPS steps (default 50) to the nereus-controller at CONTROLLER, started\n"
               "  with --gpus RANKS on SPEC; prints its CPU time per step and per report.\n"
               "exit status: 0; 1 when the run failed (a rank without a plan, a report the\n"
               "controller did not take, the controller gone): no figures then; 2 usage\n");
}

int main(int argc, char **argv)
{
    int ranks = 1024, steps = 50, st = 0;
    if (argc > 1 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
        usage(stdout);
        return 0;
    }
    if (argc < 3 || argc > 5 || (argc > 3 && parse_count(argv[3], 1, 1 << 20, &ranks)) ||
        (argc > 4 && parse_count(argv[4], 1, 1 << 20, &steps))) {
        usage(stderr);
        return 2;
    }
    if (want_fds(ranks + 64)) {
        fprintf(stderr, "bench_controller: %d ranks need %d descriptors: over the hard limit\n",
                ranks, ranks + 64);
        return 1;
    }
    char dir[] = "/tmp/nrs-bench.XXXXXX", sock[64], gpus[16], log[64], line[512];
    if (!mkdtemp(dir))
        return 1;
    snprintf(sock, sizeof(sock), "%s/s", dir);
    snprintf(log, sizeof(log), "%s/controller.log", dir);
    snprintf(gpus, sizeof(gpus), "%d", ranks);
    pid_t pid = fork();
    if (pid == 0) {
        if (!freopen(log, "w", stderr))
            _exit(127);
        execl(argv[1], argv[1], "--socket-dir", sock, "--gpus", gpus, argv[2], (char *)NULL);
        fprintf(stderr, "cannot run %s\n", argv[1]);
        fflush(stderr); /* freopen made it a buffered file; _exit does not flush */
        _exit(127);
    }
    const char *why = NULL;
    for (int i = 0; i < 100 && reports_seen(sock) < 0; i++) {
        if (waitpid(pid, &st, WNOHANG) == pid) {
            pid = -1;
            why = "the controller exited before it listened";
            break;
        }
        usleep(100000);
    }
    fw_fleet_t f;
    memset(&f, 0, sizeof(f));
    double t0 = fw_now(), t_conn = 0, wall = 0, cpu = 0;
    long want = 0, seen = -1;
    int got = 0;
    if (!why && fw_connect(&f, sock, NULL, NULL, 0, ranks, ranks, 8) != 0)
        why = "the ranks could not all connect";
    while (!why && got < ranks && fw_now() - t0 < 30) {
        fw_pump(&f, 20);
        got = 0;
        for (int i = 0; i < f.n; i++)
            got += f.r[i].epoch > 0;
    }
    if (!why && got < ranks) {
        snprintf(line, sizeof(line), "%d of %d ranks got a plan in 30 s", got, ranks);
        why = line;
    }
    if (!why) {
        t_conn = fw_now() - t0;
        double c0 = cpu_s(pid), w0 = fw_now();
        for (int s = 1; s <= steps; s++) { /* steps from 1: r->step 0 is "none yet" */
            fw_report(&f, s, 1.0, 1.0, 1024);
            fw_flush(&f, 5000);
            fw_pump(&f, 0);
            want += reports_sent(&f, s);
        }
        while ((seen = reports_seen(sock)) >= 0 && seen < want && fw_now() - w0 < 60)
            usleep(50000); /* status replies cost the controller CPU too: poll rarely */
        wall = fw_now() - w0;
        cpu = cpu_s(pid) - c0;
        if (c0 < 0 || cpu < 0)
            why = "the controller's CPU time could not be read";
        else if (seen != want || want != (long)ranks * steps) {
            snprintf(line, sizeof(line),
                     "the controller took %ld reports of %ld sent (%ld wanted: %d ranks x %d "
                     "steps) in 60 s",
                     seen, want, (long)ranks * steps, ranks, steps);
            why = line;
        }
    }
    fw_close(&f);
    if (pid > 0) {
        kill(pid, SIGTERM);
        waitpid(pid, &st, 0);
        if (!why && !(WIFEXITED(st) && WEXITSTATUS(st) == 0))
            why = "the controller did not exit 0 on SIGTERM";
    }
    if (why) {
        char tail[512];
        last_line(log, tail, sizeof(tail));
        fprintf(stderr, "bench_controller: %s: no figures (controller: %s)\n", why, tail);
    } else {
        printf("bench_controller: %d ranks over the unix socket, %d steps, %ld reports taken "
               "(%ld sent)\n", ranks, steps, seen, want);
        printf("  connect + HELLO + first PLAN of all ranks: %.3f s\n", t_conn);
        printf("  reports: %.0f messages/s (wall %.3f s)\n", seen / wall, wall);
        printf("  controller CPU: %.3f s total, %.3f ms per step (%d reports each), %.2f us per "
               "report\n", cpu, 1e3 * cpu / steps, ranks, 1e6 * cpu / seen);
        printf("  share of a 10 s step: %.4f%%\n", 100 * (cpu / steps) / 10.0);
    }
    unlink(log);
    rmdir(dir);
    return why ? 1 : 0;
}
