/* bench_controller: controller overhead per step with N simulated ranks (one
 * unix-socket connection each, the real protocol) reporting every step.
 * Starts nereus-controller, runs S steps as fast as the controller absorbs
 * them, and prints messages per second and controller CPU time per step
 * (from /proc/PID/stat), with that CPU time as a share of a 10 s step.
 *   bench_controller CONTROLLER SPEC [RANKS=1024] [STEPS=50] */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: bench_controller CONTROLLER SPEC [RANKS] [STEPS]\n");
        return 2;
    }
    int ranks = argc > 3 ? atoi(argv[3]) : 1024, steps = argc > 4 ? atoi(argv[4]) : 50;
    char dir[] = "/tmp/nrs-bench.XXXXXX", sock[64], gpus[16];
    if (!mkdtemp(dir))
        return 1;
    snprintf(sock, sizeof(sock), "%s/s", dir);
    snprintf(gpus, sizeof(gpus), "%d", ranks);
    pid_t pid = fork();
    if (pid == 0) {
        freopen("/dev/null", "w", stderr);
        execl(argv[1], argv[1], "--socket-dir", sock, "--gpus", gpus, argv[2], (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 100 && reports_seen(sock) < 0; i++)
        usleep(100000);
    fw_fleet_t f;
    memset(&f, 0, sizeof(f));
    double t0 = fw_now();
    if (fw_connect(&f, sock, NULL, NULL, 0, ranks, ranks, 8) != 0) {
        kill(pid, SIGTERM);
        return 1;
    }
    for (int got = 0; got < ranks && fw_now() - t0 < 30;) {
        fw_pump(&f, 20);
        got = 0;
        for (int i = 0; i < f.n; i++)
            got += f.r[i].epoch > 0;
    }
    double t_conn = fw_now() - t0;
    double c0 = cpu_s(pid), w0 = fw_now();
    long want = 0;
    for (int s = 0; s < steps; s++) {
        fw_report(&f, s, 1.0, 1.0, 1024);
        fw_flush(&f, 5000);
        fw_pump(&f, 0);
        want += fw_live(&f);
    }
    long seen;
    while ((seen = reports_seen(sock)) >= 0 && seen < want && fw_now() - w0 < 60)
        usleep(50000); /* status replies cost the controller CPU too: poll rarely */
    double wall = fw_now() - w0, cpu = cpu_s(pid) - c0;
    printf("bench_controller: %d ranks over the unix socket, %d steps, %ld reports taken (%ld sent)\n",
           ranks, steps, seen, want);
    printf("  connect + HELLO + first PLAN of all ranks: %.3f s\n", t_conn);
    printf("  reports: %.0f messages/s (wall %.3f s)\n", seen / wall, wall);
    printf("  controller CPU: %.3f s total, %.3f ms per step (%d reports each), %.2f us per report\n",
           cpu, 1e3 * cpu / steps, ranks, 1e6 * cpu / (seen > 0 ? seen : 1));
    printf("  share of a 10 s step: %.4f%%\n", 100 * (cpu / steps) / 10.0);
    fw_close(&f);
    kill(pid, SIGTERM);
    int st;
    waitpid(pid, &st, 0);
    rmdir(dir);
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 1;
}
