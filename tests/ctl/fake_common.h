/* A fleet of synthetic ranks in one process, each with its own connection to
 * the controller, speaking the real protocol: HELLO, PLAN, REPORT of synthetic
 * stage times, ACK of PREPARE and COMMIT. Shared by tests/ctl/fake_workers
 * and bench/bench_controller. */
#ifndef NRS_FAKE_COMMON_H
#define NRS_FAKE_COMMON_H

#include <stdbool.h>
#include <stdint.h>

#include "ctl/conn.h"

typedef struct {
    nrs_conn_t *c;
    int rank;
    char host[NRS_PROTO_STR_MAX];
    unsigned epoch;   /* committed epoch this rank runs */
    unsigned pending; /* epoch announced with a transition, 0 none */
    nrs_plan_t plan, pend_plan;
    int pend_nlost;
    int pend_lost[64];
    bool dead;        /* connection gone */
    bool retired;     /* the controller sent ERROR */
    char error[NRS_PROTO_TEXT_MAX];
    long step;
    unsigned long plans, prepares, commits, aborts;
    int gather;           /* fw_gather: 1 waiting, 2 whole and right, -1 wrong */
    uint32_t gather_seen; /* entries of the answer so far */
    int32_t gather_next;  /* the lowest rank the next entry may be */
} fw_rank_t;

typedef struct {
    fw_rank_t *r;
    int n;
    int prepare_status; /* ACK status for PREPARE (0 ok) */
    int prepare_fails;  /* that many PREPAREs get prepare_status, then 0 (-1: all) */
    bool no_ack;        /* never answer PREPARE */
    double transition_s;
    bool verbose;
    uint32_t gather_len, gather_want; /* fw_gather: bytes per rank, entries */
} fw_fleet_t;

/* Connect n ranks first..first+n-1 of nranks, gpn per host "nodeK"; tcp and
 * token are used when hostport is not NULL. 0 or -1 (message on stderr). */
int fw_connect(fw_fleet_t *f, const char *dir, const char *hostport, const char *token, int first,
               int n, int nranks, int gpn);
/* Poll every connection up to timeout_ms and handle what arrived; number of
 * frames handled. */
int fw_pump(fw_fleet_t *f, int timeout_ms);
/* Every live rank reports `step`: each model-stage of its plan took
 * ms_time * factor (gen_factor for actor.generate). */
void fw_report(fw_fleet_t *f, long step, double factor, double gen_factor, double response_len);
/* Flush queued output (blocking up to timeout_ms). */
void fw_flush(fw_fleet_t *f, int timeout_ms);
/* Every live rank contributes len bytes (a pattern of its rank) to the
 * gather (key, name) of nranks ranks and waits for the answer, up to
 * timeout_ms: how many ranks got it whole, every live rank's entry right. */
int fw_gather(fw_fleet_t *f, uint64_t key, const char *name, uint32_t len, int nranks,
              int timeout_ms);
int fw_live(const fw_fleet_t *f);
void fw_close(fw_fleet_t *f);
double fw_now(void);

#endif
