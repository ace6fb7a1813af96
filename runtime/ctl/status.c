/* nereus status [--json] [--socket-dir DIR]: the controller's own report
 * (epoch, plan table, rank health, decisions, calibration, transitions). */
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ctl/client.h"
#include "ctl/ctl_cmd.h"

static const char status_usage[] =
    "Usage: nereus status [-j|--json] [-d|--socket-dir DIR] [-t|--timeout SECONDS]\n"
    "\n"
    "Ask the job's controller for its state: the epoch and plan table, the health\n"
    "of every rank (age of its last report), the last decisions (saving per step,\n"
    "horizon, transition cost, admitted or not), the calibration error of every\n"
    "model-stage and the time spent in transitions.\n"
    "\n"
    "  -j, --json               print one JSON object\n"
    "  -d, --socket-dir DIR     the controller's job directory (default $NEREUS_SOCKET_DIR)\n"
    "  -t, --timeout SECONDS    wait at most that long for the connection, for the\n"
    "                           controller to take the request and for each part\n"
    "                           of the answer\n"
    "                           (in (0, 3600]; default 10)\n"
    "  -h, --help               show this help\n"
    "\n"
    "Exit status: 0 the state was printed, 1 the controller could not be reached\n"
    "or refused, 2 usage error.\n";

/* Reads STATUS chunks up to the last one and prints them; 0 or -1. */
static int print_reply(int fd, double timeout, char *err, size_t el)
{
    uint8_t *buf = malloc(NRS_PROTO_HDR + NRS_PROTO_MAX_PAYLOAD);
    nrs_hdr_t h;
    size_t total = 0;
    int rc = -1;
    if (!buf) {
        snprintf(err, el, "out of memory");
        return -1;
    }
    for (;;) {
        if (nrs_client_recv(fd, buf, NRS_PROTO_HDR + NRS_PROTO_MAX_PAYLOAD, &h, timeout, err, el))
            break;
        const uint8_t *p = buf + NRS_PROTO_HDR;
        if (h.type == NRS_MSG_ERROR) {
            nrs_msg_error_t e;
            if (nrs_dec_error(p, h.length, &e, NULL, 0) == 0)
                snprintf(err, el, "the controller refused: %s: %s", nrs_perr_name((int)e.code),
                         e.text);
            else
                snprintf(err, el, "the controller sent a malformed ERROR");
            break;
        }
        const char *text;
        size_t len;
        if (h.type != NRS_MSG_STATUS || nrs_dec_status(p, h.length, &text, &len, NULL, 0) != 0) {
            snprintf(err, el, "unexpected %s from the controller", nrs_msg_name(h.type));
            break;
        }
        total += len;
        if (total > (64u << 20)) {
            snprintf(err, el, "status reply larger than 64 MiB");
            break;
        }
        fwrite(text, 1, len, stdout);
        if (!(h.flags & NRS_FLAG_MORE)) {
            rc = 0;
            break;
        }
    }
    free(buf);
    return rc;
}

int nrs_cmd_status(int argc, char **argv)
{
    static const struct option opts[] = {{"json", no_argument, NULL, 'j'},
                                          {"socket-dir", required_argument, NULL, 'd'},
                                          {"timeout", required_argument, NULL, 't'},
                                          {"help", no_argument, NULL, 'h'},
                                          {NULL, 0, NULL, 0}};
    const char *dir = NULL;
    bool json = false;
    double timeout = 10;
    char err[1280];
    int ch;
    optind = 1;
    opterr = 0;
    while ((ch = getopt_long(argc, argv, "jd:t:h", opts, NULL)) != -1) {
        char *end;
        switch (ch) {
        case 'j': json = true; break;
        case 'd': dir = optarg; break;
        case 't':
            timeout = strtod(optarg, &end);
            if (end == optarg || *end || !(timeout > 0 && timeout <= 3600)) {
                fprintf(stderr, "nereus status: --timeout: '%s' is not in (0, 3600]\n", optarg);
                return 2;
            }
            break;
        case 'h': fputs(status_usage, stdout); return 0;
        default:
            fprintf(stderr, "nereus status: unknown or incomplete option '%s'\n%s", argv[optind - 1],
                    status_usage);
            return 2;
        }
    }
    if (optind != argc) {
        fprintf(stderr, "nereus status: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (!(dir = nrs_client_socket_dir(dir))) {
        fprintf(stderr, "nereus status: no --socket-dir and no $NEREUS_SOCKET_DIR\n");
        return 2;
    }
    int fd = nrs_client_connect_unix_within(dir, timeout, err, sizeof(err));
    if (fd < 0) {
        fprintf(stderr, "nereus status: %s\n", err);
        return 1;
    }
    nrs_msg_status_req_t rq = {json ? NRS_STATUS_JSON : 0};
    uint8_t buf[64];
    int rc = nrs_client_hello(fd, NRS_ROLE_CLI, err, sizeof(err));
    if (rc == 0)
        rc = nrs_client_send(fd, buf, nrs_enc_status_req(buf, sizeof(buf), &rq), err, sizeof(err));
    if (rc != 0)
        nrs_client_refusal(fd, err, sizeof(err));
    else
        rc = print_reply(fd, timeout, err, sizeof(err));
    close(fd);
    if (rc != 0) {
        fflush(stdout);
        fprintf(stderr, "nereus status: %s\n", err);
        return 1;
    }
    return 0;
}
