#define _GNU_SOURCE
/* nereus-controller: one per job. Loads the spec, plans epoch 1, then serves
 * ranks, the allocation watcher and the CLI until SIGTERM/SIGINT/SIGHUP. */
#include "config.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctl/auth.h"
#include "ctl/loop.h"

static const char usage[] =
    "Usage: nereus-controller [OPTIONS] SPEC\n"
    "\n"
    "The per-job controller: cost model, calibration, planner and admission\n"
    "(runtime/adapt), epochs and transitions (prepare, commit, abort).\n"
    "\n"
    "  -d, --socket-dir DIR     per-job directory of the unix socket (created 0700;\n"
    "                           refused if it exists with another owner or mode);\n"
    "                           default $NEREUS_SOCKET_DIR\n"
    "  -g, --gpus N             GPUs at start (default cluster.nodes * gpus_per_node)\n"
    "  -t, --tcp HOST:PORT      also listen on TCP for remote ranks (port 0: any)\n"
    "  -s, --secret-file F      per-job secret remote peers present (needed by --tcp)\n"
    "  -j, --job ID             job id peers must name (default $SLURM_JOB_ID, else any)\n"
    "  -l, --log FILE           append the log there too (default: stderr only)\n"
    "  -H, --hello-timeout S    drop peers silent for S s after connecting (5)\n"
    "  -F, --frame-timeout S    drop peers whose frame stays incomplete S s (10)\n"
    "  -T, --transition-timeout S\n"
    "                           abort a transition whose ranks do not prepare in S s (60)\n"
    "  -h, --help               show this help\n"
    "  -V, --version            print the version\n"
    "\n"
    "Exit status: 0 after SIGTERM/SIGINT/SIGHUP (socket removed), 1 set-up failed,\n"
    "2 usage.\n"
    "Protocol: docs/protocol.md.\n";

typedef struct {
    FILE *a, *b;
} tee_t;

static ssize_t tee_write(void *cookie, const char *buf, size_t n)
{
    tee_t *t = cookie;
    fwrite(buf, 1, n, t->a);
    if (t->b)
        fwrite(buf, 1, n, t->b);
    return (ssize_t)n;
}

static int tee_flush(void *cookie)
{
    tee_t *t = cookie;
    fflush(t->a);
    if (t->b)
        fflush(t->b);
    return 0;
}

static ssize_t tee_write_flush(void *cookie, const char *buf, size_t n)
{
    ssize_t k = tee_write(cookie, buf, n);
    tee_flush(cookie);
    return k;
}

static int seconds(const char *opt, const char *v, double *out)
{
    char *end;
    errno = 0;
    double d = strtod(v, &end);
    if (errno || *end || end == v || !(d > 0 && d <= 86400)) {
        fprintf(stderr, "nereus-controller: %s: '%s' is not a number of seconds in (0, 86400]\n",
                opt, v);
        return -1;
    }
    *out = d;
    return 0;
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"socket-dir", required_argument, NULL, 'd'}, {"gpus", required_argument, NULL, 'g'},
        {"tcp", required_argument, NULL, 't'},        {"secret-file", required_argument, NULL, 's'},
        {"job", required_argument, NULL, 'j'},        {"log", required_argument, NULL, 'l'},
        {"hello-timeout", required_argument, NULL, 'H'},
        {"frame-timeout", required_argument, NULL, 'F'},
        {"transition-timeout", required_argument, NULL, 'T'},
        {"help", no_argument, NULL, 'h'},             {"version", no_argument, NULL, 'V'},
        {NULL, 0, NULL, 0}};
    static nrs_spec_t spec;
    static char secret[NRS_PROTO_TOKEN_MAX];
    nrs_loop_opts_t lo = {0};
    nrs_ctl_opts_t co;
    const char *secret_file = NULL, *log_path = NULL, *job = getenv("SLURM_JOB_ID");
    double hello = 5, frame = 10, trans = 60;
    long gpus = 0;
    char err[NRS_ERR_MAX + 256];
    int ch;

    lo.socket_dir = getenv("NEREUS_SOCKET_DIR");
    while ((ch = getopt_long(argc, argv, "d:g:t:s:j:l:H:F:T:hV", opts, NULL)) != -1) {
        char *end;
        switch (ch) {
        case 'd': lo.socket_dir = optarg; break;
        case 'g':
            errno = 0;
            gpus = strtol(optarg, &end, 10);
            if (errno || *end || end == optarg || gpus < 1 || gpus > NRS_PROTO_MAX_GPUS) {
                fprintf(stderr, "nereus-controller: --gpus: '%s' is not in 1..%d\n", optarg,
                        NRS_PROTO_MAX_GPUS);
                return 2;
            }
            break;
        case 't': lo.tcp = optarg; break;
        case 's': secret_file = optarg; break;
        case 'j': job = optarg; break;
        case 'l': log_path = optarg; break;
        case 'H': if (seconds("--hello-timeout", optarg, &hello)) return 2; break;
        case 'F': if (seconds("--frame-timeout", optarg, &frame)) return 2; break;
        case 'T': if (seconds("--transition-timeout", optarg, &trans)) return 2; break;
        case 'h': fputs(usage, stdout); return 0;
        case 'V': printf("nereus-controller %s\n", PACKAGE_VERSION); return 0;
        default: fputs(usage, stderr); return 2;
        }
    }
    if (optind != argc - 1) {
        fputs(usage, stderr);
        return 2;
    }
    if (!lo.socket_dir || !*lo.socket_dir) {
        fprintf(stderr, "nereus-controller: no --socket-dir and no $NEREUS_SOCKET_DIR\n");
        return 2;
    }
    if (lo.tcp && !secret_file) {
        fprintf(stderr, "nereus-controller: --tcp needs --secret-file (remote peers authenticate)\n");
        return 2;
    }
    if (nrs_spec_load(argv[optind], &spec, err, sizeof(err)) != 0) {
        fprintf(stderr, "nereus-controller: %s\n", err);
        return 1;
    }
    if (secret_file && nrs_auth_load_secret(secret_file, secret, sizeof(secret), err, sizeof(err))) {
        fprintf(stderr, "nereus-controller: %s\n", err);
        return 1;
    }
    tee_t tee = {stderr, NULL};
    if (log_path && !(tee.b = fopen(log_path, "ae"))) {
        fprintf(stderr, "nereus-controller: %s: %s\n", log_path, strerror(errno));
        return 1;
    }
    cookie_io_functions_t io = {.write = tee_write_flush};
    FILE *log = fopencookie(&tee, "w", io);
    if (!log) {
        fprintf(stderr, "nereus-controller: cannot set up the log\n");
        return 1;
    }
    setvbuf(log, NULL, _IOLBF, 0);
    nrs_ctl_opts_init(&co, &spec);
    co.gpus = (int)gpus;
    co.job = job ? job : "";
    co.secret = secret_file ? secret : NULL;
    co.hello_timeout_s = hello;
    co.frame_timeout_s = frame;
    co.transition_timeout_s = trans;
    co.log = log;
    lo.log = log;
    int rc = nrs_loop_run(&lo, &co, err, sizeof(err));
    if (rc != 0)
        fprintf(log, "nereus-controller: %s\n", err);
    fclose(log);
    if (tee.b)
        fclose(tee.b);
    return rc == 0 ? 0 : 1;
}
