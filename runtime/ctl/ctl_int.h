/* Internals of the controller state, shared by ctl.c (behaviour) and
 * ctl_report.c (status rendering). Not a public interface. */
#ifndef NRS_CTL_INT_H
#define NRS_CTL_INT_H

#include "ctl/ctl.h"

enum { DEC_MAX = 16, DQ_MAX = 16, CONNS_MAX = 65536 };
enum { TR_IDLE, TR_PREPARE, TR_COMMIT };
enum { TRP_NONE, TRP_WAIT, TRP_DONE }; /* nrs_conn_t.tr_state */
enum { NRS_CTL_GATHER_MAX = 32, NRS_CTL_GATHER_BYTES = 64 << 20 }; /* open at once, held */
/* gathers one rank may have contributed to and not had answered: a rank waits
 * for each answer, so a few; more is a rank filling the slots of the others */
enum { NRS_CTL_GATHER_PER_RANK = 4 };
/* hosts of joiners that left the line without a GPU, remembered (ctl.c) */
enum { NRS_CTL_LINE_HOSTS = 256 };

typedef struct nrs_gather nrs_gather_t;

typedef struct {
    long step;
    char source[48];
    nrs_trigger_t trigger;
    bool planned, admitted, forced;
    bool retune; /* micro-batches only: free, not a transition (nrs_adapt_retune) */
    double saving_s, horizon_steps, cost_s, makespan_s;
    int lost_boxes; /* > 0: state that survives nowhere (checkpoint needed) */
    unsigned from_epoch, to_epoch;
    char why[320];
} decision_t;

typedef struct {
    nrs_msg_delta_t *m;
    nrs_conn_t *from; /* NULL once it has gone */
} queued_delta_t;

struct nrs_ctl {
    nrs_ctl_opts_t o;
    char job[NRS_PROTO_STR_MAX];
    char secret[NRS_PROTO_TOKEN_MAX];
    bool has_secret;
    double now, t_start;
    unsigned long serial;

    nrs_adapt_t a;     /* a.plan: the committed plan, or the proposed one while tr != IDLE */
    nrs_work_t work;   /* conditions the ranks report */
    int alloc_gpus;    /* GPUs of the allocation now */
    uint64_t generation;
    int rz_lost[NRS_PROTO_MAX_LOST]; /* GPUs of the committed plan gone, not yet planned away */
    int rz_nlost;
    bool retry;        /* decide again at retry_at (after an abort) */
    double retry_at, retry_backoff_s;

    nrs_conn_t **conns;
    int nconns, cap_conns;
    nrs_conn_t **by_gpu; /* workers by GPU index of the committed plan */
    /* [NRS_PROTO_MAX_GPUS]: host each GPU's worker named in its HELLO, kept after
     * it disconnects (a dead node's ranks are gone before its LOST delta comes) */
    char (*gpu_host)[NRS_PROTO_STR_MAX];
    int nworkers;

    /* The step being gathered. */
    long step_cur, step_closed;
    long stop_step; /* steps up to this one spanned a stop: not measured */
    int step_n;
    bool step_seen[NRS_MS_COUNT];
    double step_max[NRS_MS_COUNT];
    double resp_sum;
    int resp_n;
    uint32_t step_flags;

    /* The transition in flight. */
    int tr;
    nrs_adapt_t tr_saved; /* the adaptation state before it: restored on ABORT */
    unsigned tr_epoch;
    unsigned announced; /* the newest epoch ever announced (aborted ones too) */
    bool tr_forced;
    bool tr_retune; /* micro-batches only: announced and committed like a
                     * transition (the ranks switch at one step), but its
                     * graph is empty: its time calibrates nothing */
    bool tr_stopped; /* the job was stopped during it: neither does its time */
    int tr_lost[NRS_PROTO_MAX_LOST];
    int tr_nlost;
    int tr_waiting, tr_parts;
    /* GPUs of the announced plan whose ranks gave up after COMMIT: lost once
     * the commit completes (their nodes are fine: no watcher reports them) */
    int gu_gpu[NRS_PROTO_MAX_LOST];
    int ngu;
    /* GPUs of the announced plan whose participant left after COMMIT, with the
     * host it named: gpu_host once the commit completes (a joiner's host is
     * in no gpu_host of the committed plan), for the LOST that follows */
    struct nrs_ctl_tr_host { int gpu; char host[NRS_PROTO_STR_MAX]; } *trh;
    int ntrh, cap_trh;
    double tr_t0, tr_deadline, tr_makespan;

    queued_delta_t dq[DQ_MAX];
    int ndq;
    bool dq_running; /* run_queued_deltas is applying them */

    decision_t dec[DEC_MAX];
    char last_fail[NRS_ERR_MAX]; /* the last 'cannot plan' (logged once) */
    int ndec;
    unsigned long tr_started, tr_committed, tr_aborted;
    unsigned long tr_retunes; /* of those committed, re-tunes */
    double tr_total_s, tr_last_s;
    unsigned long reports, frames, dropped;

    /* The job's world of ranks: the first step's, then joiners (an expansion's
     * join step) at world ranks join_base .. join_base + join_m - 1. */
    int world;
    unsigned world_gen;
    int join_base, join_m, join_have;
    /* Hosts of joiners that left the line without ever holding a GPU (gone,
     * or retired by a delta), and hosts of GPUs planned away without a delta
     * (their rank gone, or left without a place by a plan of whole nodes),
     * the last NRS_CTL_LINE_HOSTS: as gpu_host for the plan's GPUs, a LOST
     * of a node whose ranks went first, or the same LOST from a second
     * source, names a known host. line_gpus: of those hosts' GPUs, how many
     * alloc_gpus still counts (ranks left without a place): out of it when
     * a REMOVE or LOST names the host. */
    char line_host[NRS_CTL_LINE_HOSTS][NRS_PROTO_STR_MAX];
    int line_gpus[NRS_CTL_LINE_HOSTS];
    int nline_host, line_host_next;
    nrs_conn_t **by_rank; /* [NRS_PROTO_MAX_RANKS]: the connection of each world rank */

    /* The ranks' all-gathers in progress (gather.c). */
    nrs_gather_t *gather[NRS_CTL_GATHER_MAX];
    int ngather;
    struct nrs_gather_done *gather_done; /* the last ones completed: who took part */
    unsigned long gathers, gathers_short; /* answered; of them without every participant */
    unsigned long stale_reports;          /* REPORTs of a step already reported: ignored */
    unsigned char *rank_gone; /* [NRS_PROTO_MAX_RANKS]: a worker of that rank left */
};

/* ctl.c, for gather.c */
void nrs_ctl_log(nrs_ctl_t *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void nrs_ctl_send(nrs_ctl_t *c, nrs_conn_t *k, const uint8_t *frame, int n);
/* n bytes of s from off, by reference (s stays the caller's). */
void nrs_ctl_send_shared(nrs_ctl_t *c, nrs_conn_t *k, nrs_shared_t *s, size_t off, int n);
void nrs_ctl_refuse(nrs_ctl_t *c, nrs_conn_t *k, int code, const char *why);

/* The world gather of generation gen completed (gather.c -> ctl.c). */
/* The world gather of generation gen completed; in[r] (n of them; NULL: all):
 * rank r took part. Only joiners that did take GPUs; the others are dropped. */
void nrs_ctl_world_ready(nrs_ctl_t *c, unsigned gen, const unsigned char *in, int n);

/* gather.c */
void nrs_ctl_on_gather(nrs_ctl_t *c, nrs_conn_t *k, const uint8_t *p, size_t n);
void nrs_ctl_gather_gone(nrs_ctl_t *c, int rank);
void nrs_ctl_gather_tick(nrs_ctl_t *c);
void nrs_ctl_gather_free(nrs_ctl_t *c);


extern const char *const nrs_ctl_trigger_names[];

#endif
