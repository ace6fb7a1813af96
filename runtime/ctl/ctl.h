/* The controller's state: peers, the adaptation loop (runtime/adapt: the one
 * policy), epochs and the prepare/commit/abort of transitions. Free of I/O:
 * the event loop (loop.c) feeds it bytes and flushes what it queues, the fuzz
 * target and the unit tests drive it directly. */
#ifndef NRS_CTL_CTL_H
#define NRS_CTL_CTL_H

#include <stdbool.h>
#include <stdio.h>

#include "adapt/adapt.h"
#include "ctl/conn.h"

typedef struct {
    const nrs_spec_t *spec;
    int gpus;                    /* GPUs at start; 0: cluster.nodes * gpus_per_node */
    int max_gpus;                /* refuse growth past this; 0: NRS_PROTO_MAX_GPUS */
    const char *job;             /* job id; "" accepts any HELLO job id */
    const char *secret;          /* per-job token for TCP peers; NULL refuses them */
    double hello_timeout_s;      /* a peer must say HELLO within this */
    double frame_timeout_s;      /* a started frame must complete within this */
    double transition_timeout_s; /* every rank must ACK a phase within this */
    FILE *log;                   /* decisions and events; NULL: silent */
    /* Called whenever output was queued on a connection (the loop flushes it). */
    void (*on_output)(void *arg, nrs_conn_t *c);
    void *arg;
} nrs_ctl_opts_t;

void nrs_ctl_opts_init(nrs_ctl_opts_t *o, const nrs_spec_t *spec);

typedef struct nrs_ctl nrs_ctl_t;

/* Plans the first epoch. 0, or -1 with err. */
int nrs_ctl_new(nrs_ctl_t **out, const nrs_ctl_opts_t *o, double now, char *err, size_t errlen);
void nrs_ctl_free(nrs_ctl_t *c);

/* A new connection (the loop has checked a unix peer's uid): 0, or -1 when
 * the controller's table is full (close it). */
int nrs_ctl_attach(nrs_ctl_t *c, nrs_conn_t *k, double now);
/* Handle every complete frame in k's input buffer. */
void nrs_ctl_input(nrs_ctl_t *c, nrs_conn_t *k, double now);
/* k is about to be closed and freed (EOF, error, or state DEAD/CLOSING done). */
void nrs_ctl_detach(nrs_ctl_t *c, nrs_conn_t *k, double now);
/* Time-outs of peers and transitions; retries after an abort. */
void nrs_ctl_tick(nrs_ctl_t *c, double now);
/* The controller was stopped with its job (a Slurm suspend) and resumed
 * now (the loop reads its SIGCONT), `seconds` of it left out of now
 * (util.h's nrs_awake_s): no time-out counts them. Here what the ranks
 * measured across the stop is set aside: the step open then (or the next
 * one) and a transition in flight calibrate nothing. */
void nrs_ctl_stopped(nrs_ctl_t *c, double now, double seconds);

/* Status report as text or JSON (the body of a STATUS reply). */
void nrs_ctl_status(nrs_ctl_t *c, bool json, double now, FILE *out);

/* Connections the controller holds (its table), for the loop's shutdown. */
int nrs_ctl_nconns(const nrs_ctl_t *c);
nrs_conn_t *nrs_ctl_conn(const nrs_ctl_t *c, int i);

/* Introspection (tests, bench). */
unsigned nrs_ctl_epoch(const nrs_ctl_t *c);         /* committed */
unsigned nrs_ctl_pending_epoch(const nrs_ctl_t *c); /* 0: no transition */
int nrs_ctl_nworkers(const nrs_ctl_t *c);
unsigned long nrs_ctl_reports(const nrs_ctl_t *c);
const nrs_adapt_t *nrs_ctl_adapt(const nrs_ctl_t *c);

#endif
