/* nereus delta --add N | --remove HOSTS | --lost HOSTS: a resource delta for
 * the controller, from tests or launchers other than Slurm (the Slurm watcher
 * sends the same message). Prints the controller's answer. */
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ctl/client.h"
#include "ctl/ctl_cmd.h"

static const char delta_usage[] =
    "Usage: nereus delta (--add N | --remove HOSTS | --lost HOSTS | --lost-gpus LIST\n"
    "                     | --remove-gpus LIST) [--generation G] [--socket-dir DIR]\n"
    "                     [--timeout SECONDS]\n"
    "\n"
    "Tell the job's controller that the allocation changed: N whole nodes added,\n"
    "nodes released (--remove) or failed (--lost), given as comma-separated host\n"
    "names of ranks, or as GPU indices of the current epoch. The controller re-plans\n"
    "(a loss forces a new epoch) and answers.\n"
    "\n"
    "  -a, --add N              N whole nodes added (1..4096)\n"
    "  -r, --remove HOSTS       nodes released, comma-separated host names\n"
    "  -l, --lost HOSTS         nodes failed, comma-separated host names\n"
    "  -L, --lost-gpus LIST     GPUs failed, comma-separated indices of the current epoch\n"
    "  -R, --remove-gpus LIST   GPUs released, comma-separated indices of the current epoch\n"
    "  -g, --generation G       the source's generation number (must grow;\n"
    "                           default: the controller's next)\n"
    "  -d, --socket-dir DIR     the controller's job directory (default $NEREUS_SOCKET_DIR)\n"
    "  -t, --timeout SECONDS    wait at most that long for the answer (in (0, 3600];\n"
    "                           default 120: a delta that comes during a commit is\n"
    "                           answered once the commit completes, which the\n"
    "                           controller waits for up to its --transition-timeout, 60 s)\n"
    "  -h, --help               show this help\n"
    "\n"
    "Give exactly one of -a, -r, -l, -L, -R. Exit status: 0 the controller applied\n"
    "the delta, 1 it rejected it or could not be reached, 2 usage error.\n";

static int split_hosts(const char *arg, nrs_msg_delta_t *m)
{
    char *dup = strdup(arg), *save = NULL;
    if (!dup)
        return -1;
    for (char *t = strtok_r(dup, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (m->nhosts == NRS_PROTO_MAX_HOSTS || strlen(t) >= NRS_PROTO_STR_MAX) {
            free(dup);
            return -1;
        }
        snprintf(m->hosts[m->nhosts++], NRS_PROTO_STR_MAX, "%s", t);
    }
    free(dup);
    return m->nhosts > 0 ? 0 : -1;
}

static int split_gpus(const char *arg, nrs_msg_delta_t *m)
{
    const char *p = arg;
    while (*p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (errno || end == p || v < 0 || v >= NRS_PROTO_MAX_GPUS || m->ngpus == NRS_PROTO_MAX_LOST ||
            (*end && *end != ','))
            return -1;
        m->gpus[m->ngpus++] = (int32_t)v;
        p = *end ? end + 1 : end;
    }
    return m->ngpus > 0 ? 0 : -1;
}

static int exchange(const char *dir, const nrs_msg_delta_t *m, double timeout,
                    nrs_msg_delta_reply_t *r, char *err, size_t el)
{
    int fd = nrs_client_connect_unix_within(dir, timeout, err, el);
    if (fd < 0)
        return -1;
    uint8_t *buf = malloc(NRS_PROTO_HDR + NRS_PROTO_MAX_PAYLOAD);
    nrs_hdr_t h;
    int rc = buf ? nrs_client_hello(fd, NRS_ROLE_CLI, err, el) : -1;
    if (rc == 0)
        rc = nrs_client_send(fd, buf, nrs_enc_delta(buf, NRS_PROTO_HDR + NRS_PROTO_MAX_PAYLOAD, m),
                             err, el);
    if (rc != 0 && buf)
        nrs_client_refusal(fd, err, el);
    else if (rc == 0)
        rc = nrs_client_recv(fd, buf, NRS_PROTO_HDR + NRS_PROTO_MAX_PAYLOAD, &h, timeout, err, el);
    if (rc != 0 && buf && strstr(err, "timed out")) /* it may be queued, not lost */
        snprintf(err, el, "no answer from the controller within %g s: the delta may still be "
                 "applied (one sent during a commit is answered when the commit completes)",
                 timeout);
    if (rc == 0) {
        const uint8_t *p = buf + NRS_PROTO_HDR;
        nrs_msg_error_t e;
        if (h.type == NRS_MSG_ERROR && nrs_dec_error(p, h.length, &e, NULL, 0) == 0) {
            snprintf(err, el, "the controller refused: %s: %s", nrs_perr_name((int)e.code), e.text);
            rc = -1;
        } else if (h.type != NRS_MSG_DELTA_REPLY ||
                   nrs_dec_delta_reply(p, h.length, r, NULL, 0) != 0) {
            snprintf(err, el, "unexpected %s from the controller", nrs_msg_name(h.type));
            rc = -1;
        }
    }
    free(buf);
    close(fd);
    return rc;
}

int nrs_cmd_delta(int argc, char **argv)
{
    static const struct option opts[] = {{"add", required_argument, NULL, 'a'},
                                          {"remove", required_argument, NULL, 'r'},
                                          {"lost", required_argument, NULL, 'l'},
                                          {"lost-gpus", required_argument, NULL, 'L'},
                                          {"remove-gpus", required_argument, NULL, 'R'},
                                          {"generation", required_argument, NULL, 'g'},
                                          {"socket-dir", required_argument, NULL, 'd'},
                                          {"timeout", required_argument, NULL, 't'},
                                          {"help", no_argument, NULL, 'h'},
                                          {NULL, 0, NULL, 0}};
    nrs_msg_delta_t *m = calloc(1, sizeof(*m));
    nrs_msg_delta_reply_t r;
    const char *dir = NULL;
    char err[1280];
    double timeout = 120;
    int ch, kinds = 0, rc = 2;
    if (!m)
        return 1;
    optind = 1;
    opterr = 0;
    while ((ch = getopt_long(argc, argv, "a:r:l:L:R:g:d:t:h", opts, NULL)) != -1) {
        char *end;
        switch (ch) {
        case 'a':
            kinds++;
            m->kind = NRS_DELTA_ADD;
            errno = 0;
            long v = strtol(optarg, &end, 10);
            if (errno || *end || end == optarg || v < 1 || v > 4096) {
                fprintf(stderr, "nereus delta: --add: '%s' is not a node count in 1..4096\n", optarg);
                goto out;
            }
            m->add_nodes = (uint32_t)v;
            break;
        case 'r':
        case 'l':
            kinds++;
            m->kind = ch == 'l' ? NRS_DELTA_LOST : NRS_DELTA_REMOVE;
            if (split_hosts(optarg, m) != 0) {
                fprintf(stderr, "nereus delta: '%s': expected HOST[,HOST...] (at most %d, each < %d bytes)\n",
                        optarg, NRS_PROTO_MAX_HOSTS, NRS_PROTO_STR_MAX);
                goto out;
            }
            break;
        case 'L':
        case 'R':
            kinds++;
            m->kind = ch == 'L' ? NRS_DELTA_LOST : NRS_DELTA_REMOVE;
            if (split_gpus(optarg, m) != 0) {
                fprintf(stderr, "nereus delta: '%s': expected GPU[,GPU...]\n", optarg);
                goto out;
            }
            break;
        case 'g':
            errno = 0;
            m->generation = strtoull(optarg, &end, 10);
            /* strtoull takes "-1" as 2^64-1: a generation no later delta could grow past */
            if (errno || *end || end == optarg || m->generation == 0 ||
                !isdigit((unsigned char)optarg[0])) {
                fprintf(stderr, "nereus delta: --generation: '%s' is not a positive integer\n", optarg);
                goto out;
            }
            break;
        case 'd': dir = optarg; break;
        case 't':
            timeout = strtod(optarg, &end);
            if (end == optarg || *end || !(timeout > 0 && timeout <= 3600)) {
                fprintf(stderr, "nereus delta: --timeout: '%s' is not in (0, 3600]\n", optarg);
                goto out;
            }
            break;
        case 'h': fputs(delta_usage, stdout); rc = 0; goto out;
        default:
            fprintf(stderr, "nereus delta: unknown or incomplete option '%s'\n%s", argv[optind - 1],
                    delta_usage);
            goto out;
        }
    }
    if (optind != argc) {
        fprintf(stderr, "nereus delta: unexpected argument '%s'\n", argv[optind]);
        goto out;
    }
    if (kinds != 1) {
        fprintf(stderr, "nereus delta: give exactly one of --add, --remove, --lost, --lost-gpus, --remove-gpus\n");
        goto out;
    }
    if (!(dir = nrs_client_socket_dir(dir))) {
        fprintf(stderr, "nereus delta: no --socket-dir and no $NEREUS_SOCKET_DIR\n");
        goto out;
    }
    if (exchange(dir, m, timeout, &r, err, sizeof(err)) != 0) {
        fprintf(stderr, "nereus delta: %s\n", err);
        rc = 1;
        goto out;
    }
    if (r.new_epoch)
        printf("%s: generation %llu, epoch %u -> %u: %s\n", r.accepted ? "accepted" : "rejected",
               (unsigned long long)r.generation, r.epoch, r.new_epoch, r.text);
    else
        printf("%s: generation %llu, epoch %u: %s\n", r.accepted ? "accepted" : "rejected",
               (unsigned long long)r.generation, r.epoch, r.text);
    rc = r.accepted ? 0 : 1;
out:
    free(m);
    return rc;
}
