/* Synthetic ranks over the real protocol (see fake_common.h). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ctl/client.h"
#include "fake_common.h"

double fw_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void queue(fw_rank_t *r, const uint8_t *b, int n)
{
    if (n < 0 || nrs_conn_queue(r->c, b, (size_t)n) != 0) {
        fprintf(stderr, "fake rank %d: cannot queue a frame\n", r->rank);
        r->dead = true;
    }
}

int fw_connect(fw_fleet_t *f, const char *dir, const char *hostport, const char *token, int first,
               int n, int nranks, int gpn)
{
    char err[512];
    f->r = calloc((size_t)n, sizeof(f->r[0]));
    f->n = 0;
    if (!f->r)
        return -1;
    for (int i = 0; i < n; i++) {
        fw_rank_t *r = &f->r[i];
        int fd = hostport ? nrs_client_connect_tcp(hostport, err, sizeof(err))
                          : nrs_client_connect_unix(dir, err, sizeof(err));
        if (fd < 0) {
            fprintf(stderr, "fake rank %d: %s\n", first + i, err);
            return -1;
        }
        r->c = nrs_conn_new(fd, fw_now());
        r->rank = first + i;
        snprintf(r->host, sizeof(r->host), "node%d", r->rank / (gpn > 0 ? gpn : 1));
        f->n++;
        nrs_msg_hello_t h;
        uint8_t buf[512];
        memset(&h, 0, sizeof(h));
        h.role = NRS_ROLE_WORKER;
        h.rank = r->rank;
        h.nranks = nranks;
        snprintf(h.host, sizeof(h.host), "%s", r->host);
        snprintf(h.token, sizeof(h.token), "%s", token ? token : "");
        if (nrs_client_send(fd, buf, nrs_enc_hello(buf, sizeof(buf), &h), err, sizeof(err)) != 0) {
            fprintf(stderr, "fake rank %d: %s\n", r->rank, err);
            return -1;
        }
        fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    }
    return 0;
}

static void ack(fw_fleet_t *f, fw_rank_t *r, unsigned epoch, unsigned phase, int status)
{
    nrs_msg_ack_t a = {epoch, phase, status, phase == NRS_MSG_COMMIT ? f->transition_s : 0};
    uint8_t buf[64];
    queue(r, buf, nrs_enc_ack(buf, sizeof(buf), &a));
}

static void handle(fw_fleet_t *f, fw_rank_t *r, const nrs_hdr_t *h, const uint8_t *p)
{
    char why[256];
    switch (h->type) {
    case NRS_MSG_PLAN: {
        nrs_msg_plan_t *m = malloc(sizeof(*m));
        if (!m || nrs_dec_plan(p, h->length, m, why, sizeof(why)) != 0) {
            fprintf(stderr, "fake rank %d: bad PLAN: %s\n", r->rank, m ? why : "oom");
            r->dead = true;
            free(m);
            return;
        }
        r->plans++;
        if (m->flags & NRS_PLAN_TRANSITION) {
            r->pending = m->plan.epoch;
            r->pend_plan = m->plan;
            r->pend_nlost = m->nlost < 64 ? m->nlost : 64;
            memcpy(r->pend_lost, m->lost, sizeof(int) * (size_t)r->pend_nlost);
        } else {
            r->plan = m->plan;
            r->epoch = m->plan.epoch;
        }
        if (f->verbose)
            printf("rank %d: PLAN epoch %u%s%s (prev %u, %d GPUs lost, %d GPUs)\n", r->rank,
                   m->plan.epoch, m->flags & NRS_PLAN_TRANSITION ? " transition" : "",
                   m->flags & NRS_PLAN_FORCED ? " forced" : "", m->prev_epoch, m->nlost,
                   m->plan.total_gpus);
        free(m);
        return;
    }
    case NRS_MSG_PREPARE:
    case NRS_MSG_COMMIT:
    case NRS_MSG_ABORT: {
        nrs_msg_epoch_t m;
        if (nrs_dec_epoch(h->type, p, h->length, &m, why, sizeof(why)) != 0) {
            fprintf(stderr, "fake rank %d: bad %s: %s\n", r->rank, nrs_msg_name(h->type), why);
            r->dead = true;
            return;
        }
        if (h->type == NRS_MSG_PREPARE) {
            r->prepares++;
            if (!f->no_ack) {
                int st = 3;
                if (m.epoch == r->pending)
                    st = f->prepare_fails < 0 || (long)r->prepares <= f->prepare_fails
                             ? f->prepare_status : 0;
                ack(f, r, m.epoch, NRS_MSG_PREPARE, st);
            }
        } else if (h->type == NRS_MSG_COMMIT) {
            r->commits++;
            if (m.epoch == r->pending) {
                r->plan = r->pend_plan;
                r->epoch = r->pending;
                /* Survivors-first renumbering: the rank's new GPU. */
                int below = 0;
                for (int i = 0; i < r->pend_nlost; i++)
                    below += r->pend_lost[i] < r->rank;
                r->rank -= below;
                r->step = -1;
            }
            r->pending = 0;
            ack(f, r, m.epoch, NRS_MSG_COMMIT, 0);
        } else {
            r->aborts++;
            r->pending = 0;
        }
        if (f->verbose)
            printf("rank %d: %s epoch %u %s\n", r->rank, nrs_msg_name(h->type), m.epoch, m.text);
        return;
    }
    case NRS_MSG_GATHERED: {
        nrs_msg_gathered_t m;
        if (r->gather != 1 || nrs_dec_gathered(p, h->length, &m, why, sizeof(why)) != 0 ||
            m.len != f->gather_len) {
            fprintf(stderr, "fake rank %d: unexpected or bad GATHERED\n", r->rank);
            r->gather = -1;
            return;
        }
        for (uint32_t i = 0; i < m.count; i++) {
            int32_t rr;
            const uint8_t *d;
            nrs_gathered_entry(&m, i, &rr, &d);
            if (rr < r->gather_next) { /* ascending, each rank once */
                fprintf(stderr, "fake rank %d: rank %d's entry out of order or twice\n", r->rank,
                        rr);
                r->gather = -1;
            }
            r->gather_next = rr + 1;
            for (uint32_t j = 0; j < m.len && r->gather == 1; j++)
                if (d[j] != (uint8_t)(rr * 131 + j * 7 + 3)) {
                    fprintf(stderr, "fake rank %d: rank %d's entry differs at byte %u\n",
                            r->rank, rr, j);
                    r->gather = -1;
                }
            r->gather_seen++;
        }
        if (!(h->flags & NRS_FLAG_MORE) && r->gather == 1)
            r->gather = r->gather_seen == f->gather_want ? 2 : -1;
        return;
    }
    case NRS_MSG_ERROR: {
        nrs_msg_error_t e;
        if (nrs_dec_error(p, h->length, &e, why, sizeof(why)) != 0)
            snprintf(e.text, sizeof(e.text), "(malformed error)");
        snprintf(r->error, sizeof(r->error), "%s", e.text);
        r->retired = true;
        r->dead = true;
        if (f->verbose)
            printf("rank %d: ERROR %s\n", r->rank, e.text);
        return;
    }
    default:
        fprintf(stderr, "fake rank %d: unexpected %s\n", r->rank, nrs_msg_name(h->type));
        r->dead = true;
    }
}

/* Handle the frames that can be read now; EOF or an error marks r dead. */
static int read_frames(fw_fleet_t *f, fw_rank_t *r)
{
    int frames = 0;
    for (;;) {
        ssize_t k = nrs_conn_read(r->c, fw_now());
        if (k == 0 || k == -1) {
            r->dead = true;
            break;
        }
        nrs_hdr_t h;
        const uint8_t *p;
        int rc;
        while (!r->dead && (rc = nrs_conn_frame(r->c, &h, &p)) != 0) {
            if (rc < 0) {
                fprintf(stderr, "fake rank %d: bad frame header\n", r->rank);
                r->dead = true;
                break;
            }
            handle(f, r, &h, p);
            frames++;
            nrs_conn_consume(r->c, &h, fw_now());
        }
        if (k == -2 || r->dead)
            break;
    }
    return frames;
}

/* A send failed: the controller may have closed after an ERROR ("rank
 * retired") this rank has not read yet; read what it left, as the real
 * worker does (nrs_client_refusal), then the rank is gone. */
static void send_failed(fw_fleet_t *f, fw_rank_t *r)
{
    nrs_conn_clear_out(r->c);
    read_frames(f, r);
    r->dead = true;
}

static int drain(fw_fleet_t *f, fw_rank_t *r)
{
    int frames = read_frames(f, r);
    if (!r->dead && nrs_conn_flush(r->c) < 0)
        send_failed(f, r);
    return frames;
}

int fw_pump(fw_fleet_t *f, int timeout_ms)
{
    struct pollfd *p = calloc((size_t)f->n, sizeof(*p));
    int *idx = calloc((size_t)f->n, sizeof(int)), np = 0, frames = 0;
    if (!p || !idx) {
        free(p);
        free(idx);
        return 0;
    }
    for (int i = 0; i < f->n; i++) {
        if (f->r[i].dead)
            continue;
        p[np].fd = f->r[i].c->fd;
        p[np].events = POLLIN | (nrs_conn_pending(f->r[i].c) ? POLLOUT : 0);
        idx[np++] = i;
    }
    if (np && poll(p, (nfds_t)np, timeout_ms) > 0)
        for (int j = 0; j < np; j++)
            if (p[j].revents)
                frames += drain(f, &f->r[idx[j]]);
    free(p);
    free(idx);
    return frames;
}

void fw_report(fw_fleet_t *f, long step, double factor, double gen_factor, double response_len)
{
    for (int i = 0; i < f->n; i++) {
        fw_rank_t *r = &f->r[i];
        if (r->dead || r->epoch == 0 || r->pending)
            continue;
        nrs_msg_report_t m;
        uint8_t buf[256];
        memset(&m, 0, sizeof(m));
        m.epoch = r->epoch;
        m.step = (uint32_t)step;
        m.response_len = response_len;
        for (int ms = 0; ms < NRS_MS_COUNT; ms++) {
            if (!r->plan.has[ms])
                continue;
            double t = r->plan.ms_time[ms] * (ms == NRS_MS_ACTOR_GENERATE ? gen_factor : factor);
            m.ms[m.nstages] = (uint8_t)ms;
            m.seconds[m.nstages++] = t > 1e-6 ? t : 1e-6;
        }
        queue(r, buf, nrs_enc_report(buf, sizeof(buf), &m));
        r->step = step;
        if (nrs_conn_flush(r->c) < 0)
            send_failed(f, r);
    }
}

void fw_flush(fw_fleet_t *f, int timeout_ms)
{
    double end = fw_now() + timeout_ms / 1000.0;
    for (;;) {
        bool left = false;
        for (int i = 0; i < f->n; i++) {
            fw_rank_t *r = &f->r[i];
            if (r->dead)
                continue;
            int rc = nrs_conn_flush(r->c);
            if (rc < 0)
                send_failed(f, r);
            left |= rc == 1;
        }
        if (!left || fw_now() > end)
            return;
        fw_pump(f, 5);
    }
}

int fw_gather(fw_fleet_t *f, uint64_t key, const char *name, uint32_t len, int nranks,
              int timeout_ms)
{
    static nrs_msg_gather_t m;
    uint8_t *b = malloc(NRS_PROTO_HDR + NRS_PROTO_MAX_PAYLOAD), *d = malloc(len + 1);
    double end = fw_now() + timeout_ms / 1000.0;
    int done = 0;
    if (!b || !d) {
        free(b);
        free(d);
        return 0;
    }
    memset(&m, 0, sizeof(m));
    m.key = key;
    snprintf(m.name, sizeof(m.name), "%s", name);
    m.timeout_ms = (uint32_t)timeout_ms;
    m.nranks = nranks;
    m.len = len;
    m.data = d;
    f->gather_len = len;
    f->gather_want = (uint32_t)fw_live(f);
    for (int i = 0; i < f->n; i++) {
        fw_rank_t *r = &f->r[i];
        if (r->dead)
            continue;
        for (uint32_t j = 0; j < len; j++)
            d[j] = (uint8_t)(r->rank * 131 + j * 7 + 3);
        r->gather = 1;
        r->gather_seen = 0;
        r->gather_next = 0;
        queue(r, b, nrs_enc_gather(b, NRS_PROTO_HDR + NRS_PROTO_MAX_PAYLOAD, &m));
        if (nrs_conn_flush(r->c) < 0)
            send_failed(f, r);
    }
    for (;;) {
        int waiting = 0;
        done = 0;
        for (int i = 0; i < f->n; i++) {
            waiting += !f->r[i].dead && f->r[i].gather == 1;
            done += f->r[i].gather == 2;
        }
        if (!waiting || fw_now() > end)
            break;
        fw_pump(f, 20);
    }
    free(b);
    free(d);
    return done;
}

int fw_live(const fw_fleet_t *f)
{
    int n = 0;
    for (int i = 0; i < f->n; i++)
        n += !f->r[i].dead;
    return n;
}

void fw_close(fw_fleet_t *f)
{
    for (int i = 0; i < f->n; i++) {
        close(f->r[i].c->fd);
        nrs_conn_free(f->r[i].c);
    }
    free(f->r);
    f->r = NULL;
    f->n = 0;
}
