/* nereus-worker: a synthetic PPO/GRPO job over the public worker API
 * (include/nereus/nereus.h): the template for integrating a real trainer.
 * See usage() and docs/worker-api.md §5. */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "nereus/cost.h"
#include "nereus/nereus.h"
#include "nereus/plan.h"
#include "nereus/spec.h"

static void usage(FILE *f)
{
    fprintf(f,
"NAME\n"
"    nereus-worker - a synthetic PPO/GRPO job over the Nereus worker API\n"
"\n"
"SYNOPSIS\n"
"    nereus-worker [--spec FILE] [--steps N] [--step-ms M] [--response-len A]\n"
"                  [--max-response-len B] [--gpus-per-host G] [--quiet-s S]\n"
"                  [--checkpoint-dir DIR] [--checkpoint-every K] [--join]\n"
"\n"
"DESCRIPTION\n"
"    One rank of a job (start one per GPU: srun, or tests/mp/pmix_srv). Each rank\n"
"    holds real EMU state of the spec's models scaled down by\n"
"    runtime.emulation_scale, filled with a deterministic pattern. Every step it\n"
"    sleeps for the true time of a virtual cluster (the cost model's predicted\n"
"    stage times at the step's response length, times per-stage factors),\n"
"    scaled so the first step takes M ms, reports the true stage times and the\n"
"    response length (which grows linearly from A to B over the N steps),\n"
"    takes the transitions the controller announces (the ranks agree at each\n"
"    step boundary on when), then runs the actor's weight sync (actor.train's\n"
"    weights -> actor.generate's, nrs_emu_weight_sync, over the transport) and\n"
"    checks one generation shard. At the end it verifies every shard's\n"
"    checksum and prints 'verified N shards, 0 mismatches', then every\n"
"    generation shard's: 'weight sync: S steps, B bytes, F failed, T s/step;\n"
"    verified K generation shards, 0 mismatches'.\n"
"\n"
"    With $NEREUS_SOCKET_DIR (or $NEREUS_JOB_DIR) the plan comes from\n"
"    nereus-controller; without, the rank plans for itself (nrs_plan_best on\n"
"    the job's ranks) and never changes epoch.\n"
"\n"
"OPTIONS\n"
"    --spec FILE           job spec (default $NEREUS_SPEC)\n"
"    --steps N             steps to run (default workload.steps)\n"
"    --step-ms M           wall time of the first step, ms (default 30)\n"
"    --response-len A      response length at step 0 (default workload.response_len)\n"
"    --max-response-len B  at the last step (default workload.max_response_len)\n"
"    --gpus-per-host G     name this rank's host node<rank/G> in its HELLO\n"
"                          ($NEREUS_HOSTNAME), for one-machine tests of\n"
"                          multi-node jobs\n"
"    --quiet-s S           after the last step, keep following the controller\n"
"                          until it is quiet for S s (default 2)\n"
"    --checkpoint-dir DIR  where checkpoints go (default $NEREUS_CHECKPOINT_DIR);\n"
"                          a transition whose state survives on no replica\n"
"                          restores the newest one (prints 'restored ... from\n"
"                          the checkpoint of step S')\n"
"    --checkpoint-every K  a checkpoint every K steps (default 0: none; needs a\n"
"                          directory)\n"
"    --join                these ranks join a running job ($NEREUS_JOIN=1): a\n"
"                          join step launched on nodes an expansion added; they\n"
"                          wait for the job's controller to connect them to the\n"
"                          job's ranks, start at the job's current step and take\n"
"                          GPUs at its next epoch\n"
"    -h, --help            this text\n"
"\n"
"ENVIRONMENT\n"
"    NEREUS_EMU_FACTORS    true/predicted time per model-stage of the virtual\n"
"                          cluster, e.g. 'actor.generate=1.4,critic.train=0.9'\n"
"                          (default actor.generate=1.3, others 1)\n"
"    NEREUS_TRACE_SYNC     1: print every step's weight sync time and bytes\n"
"    NEREUS_SOCKET_DIR, NEREUS_JOB_ID, NEREUS_TOKEN, NRS_WORKER_TIMEOUT, UCX_*:\n"
"                          see docs/worker-api.md\n"
"\n"
"EXIT STATUS\n"
"    0 every checksum verified; 1 a mismatch or a failure (also: the\n"
"    controller was lost during the run); 2 usage;\n"
"    3 a transition failed past its point of no return; 4 retired by the\n"
"    controller (its node left the job).\n");
}

/* After a commit (or a partial one) at step s: the step this rank goes on
 * from. A joiner in line (*in_line: no GPU yet) counts steps of its own, ahead
 * of the job's (it takes part in no step agreement), so it takes the job's
 * step at every commit; the commit that gives it a GPU ends its time in line. */
static int take_job_step(const nrs_worker_t *w, int *in_line, int s)
{
    int j = nrs_worker_job_step(w);
    if (!*in_line || j < 0)
        return s;
    if (nrs_worker_gpu(w) >= 0) {
        *in_line = 0;
        printf("rank %d: step %d: placed at the job's step %d: continues from it\n",
               nrs_worker_rank(w), s, j);
    }
    return j;
}

static void sleep_s(double s)
{
    if (s <= 0)
        return;
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

static void factors(double *f)
{
    for (int ms = 0; ms < NRS_MS_COUNT; ms++)
        f[ms] = ms == NRS_MS_ACTOR_GENERATE ? 1.3 : 1.0;
    const char *e = getenv("NEREUS_EMU_FACTORS");
    char buf[512], *save = NULL;
    if (!e)
        return;
    snprintf(buf, sizeof buf, "%s", e);
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(t, '=');
        if (!eq)
            continue;
        *eq = 0;
        for (int ms = 0; ms < NRS_MS_COUNT; ms++)
            if (!strcmp(t, nrs_worker_ms_name(ms)) && atof(eq + 1) > 0)
                f[ms] = atof(eq + 1);
    }
}

/* True seconds of each model-stage of plan p at response length rl. */
static double true_times(const nrs_spec_t *s, const nrs_plan_t *p, double rl, const double *f,
                         double *t)
{
    nrs_work_t wk;
    double sum = 0;
    nrs_work_from_spec(s, &wk);
    wk.response_len = rl;
    for (int ms = 0; ms < NRS_MS_COUNT; ms++) {
        nrs_stage_cost_t c;
        t[ms] = 0;
        if (!p->has[ms] || nrs_cost_stage(s, (nrs_ms_t)ms, &p->layout[ms], &wk, NULL, &c))
            continue;
        t[ms] = c.time_s * f[ms] > 1e-6 ? c.time_s * f[ms] : 1e-6;
        sum += t[ms];
    }
    return sum;
}

/* The rest of step s's boundary, after its transition if any: the actor's
 * train -> generate weight sync of the current plan, then the checkpoint.
 * Every rank of the plan runs it at step s, a rank placed after its own last
 * step too (it then goes on at s + 1). 1 on a mismatch (exit status), else 0. */
static int step_tail(nrs_worker_t *w, int s, int steps, int ck_every, int trace_sync,
                     int *sync_err)
{
    nrs_plan_t p;
    int rc, me = nrs_worker_rank(w), bad = 0;
    nrs_worker_plan(w, &p);
    if (p.has[NRS_MS_ACTOR_TRAIN] && p.has[NRS_MS_ACTOR_GENERATE]) {
        rc = nrs_worker_weight_sync(w);
        bad = rc == NRS_ERR_VERIFY;
        if (rc && (bad || !(*sync_err)++))
            printf("rank %d: step %d: weight sync: %s: %s\n", me, s, nrs_worker_strerror(rc),
                   nrs_worker_last_error(w));
        if (!rc && trace_sync)
            printf("rank %d: step %d: weight sync %.6f s, %.0f bytes\n", me, s,
                   nrs_worker_sync_stat(w, NRS_SS_LAST_S),
                   nrs_worker_sync_stat(w, NRS_SS_LAST_BYTES));
    }
    if (!bad && ck_every > 0 && (s + 1) % ck_every == 0 && s + 1 < steps &&
        (rc = nrs_worker_checkpoint(w, s + 1)))
        printf("rank %d: step %d: %s: %s\n", me, s, nrs_worker_strerror(rc),
               nrs_worker_last_error(w));
    return bad;
}

/* Option opt's number in [lo, hi] (a whole one where whole), else a usage
 * error: atoi and atof read "abc" as 0. */
static int num(const char *opt, const char *arg, double lo, double hi, bool whole, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(arg, &end);
    if (errno || end == arg || *end || !(v >= lo && v <= hi) || (whole && v != (double)(long)v)) {
        fprintf(stderr, "nereus-worker: --%s: '%s' is not %s in [%.15g, %.15g]\n", opt, arg,
                whole ? "an integer" : "a number", lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

int main(int argc, char **argv)
{
    static const struct option lo[] = {{"spec", 1, 0, 's'},       {"steps", 1, 0, 'n'},
                                       {"step-ms", 1, 0, 'm'},    {"response-len", 1, 0, 'a'},
                                       {"max-response-len", 1, 0, 'b'},
                                       {"gpus-per-host", 1, 0, 'g'}, {"quiet-s", 1, 0, 'q'},
                                       {"checkpoint-dir", 1, 0, 'd'},
                                       {"checkpoint-every", 1, 0, 'k'},
                                       {"join", 0, 0, 'j'},
                                       {"help", 0, 0, 'h'},       {0, 0, 0, 0}};
    const char *spec_path = getenv("NEREUS_SPEC");
    int steps = -1, gph = 0, c, ck_every = 0, badarg = 0;
    const char *ck_dir = getenv("NEREUS_CHECKPOINT_DIR");
    double step_ms = 30, r0 = -1, r1 = -1, quiet = 2, v = 0;
    while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        switch (c) {
        case 's': spec_path = optarg; break;
        case 'n': badarg |= num("steps", optarg, 0, 1e9, true, &v), steps = (int)v; break;
        case 'm': badarg |= num("step-ms", optarg, 1e-3, 3.6e6, false, &step_ms); break;
        case 'a': badarg |= num("response-len", optarg, 1, 1e9, false, &r0); break;
        case 'b': badarg |= num("max-response-len", optarg, 1, 1e9, false, &r1); break;
        case 'g': badarg |= num("gpus-per-host", optarg, 1, 1e6, true, &v), gph = (int)v; break;
        case 'q': badarg |= num("quiet-s", optarg, 0, 1e6, false, &quiet); break;
        case 'd': ck_dir = optarg; break;
        case 'k': badarg |= num("checkpoint-every", optarg, 0, 1e9, true, &v), ck_every = (int)v; break;
        case 'j': setenv("NEREUS_JOIN", "1", 1); break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (badarg) /* said which */
        return 2;
    if (optind < argc) {
        fprintf(stderr, "nereus-worker: unexpected argument '%s' (--help)\n", argv[optind]);
        return 2;
    }
    if (!spec_path || step_ms <= 0 || quiet < 0 || ck_every < 0 ||
        (ck_every > 0 && !(ck_dir && *ck_dir))) {
        fprintf(stderr, "nereus-worker: %s\n", !spec_path ? "no spec: --spec FILE or NEREUS_SPEC"
                : ck_every > 0 && !(ck_dir && *ck_dir)
                    ? "--checkpoint-every needs --checkpoint-dir (or $NEREUS_CHECKPOINT_DIR)"
                    : "bad arguments (--help)");
        return 2;
    }
    nrs_spec_t spec; /* at full size: the cost model's times and the workload */
    char err[512];
    if (nrs_spec_load(spec_path, &spec, err, sizeof err)) {
        fprintf(stderr, "nereus-worker: %s\n", err);
        return 1;
    }
    if (steps < 0)
        steps = spec.workload.steps;
    if (r0 < 0)
        r0 = spec.workload.response_len;
    if (r1 < 0)
        r1 = spec.workload.max_response_len;
    if (gph > 0) { /* before init: the HELLO carries it */
        const char *pr = getenv("PMIX_RANK");
        char host[64];
        snprintf(host, sizeof host, "node%d", (pr ? atoi(pr) : 0) / gph);
        setenv("NEREUS_HOSTNAME", host, 1);
    }

    /* the state: the spec's models scaled by runtime.emulation_scale, as every
     * rank of the job (Python ones too) takes it */
    nrs_worker_t *w = NULL;
    int rc = nrs_worker_init_emulated(&w, spec_path);
    if (rc) {
        fprintf(stderr, "nereus-worker: init: %s: %s\n", nrs_worker_strerror(rc),
                nrs_worker_last_error(w));
        nrs_worker_finalize(w);
        return 1;
    }
    if (ck_dir && *ck_dir)
        nrs_worker_set_checkpoint_dir(w, ck_dir);
    int me = nrs_worker_rank(w), n = nrs_worker_size(w);
    int controlled = !strcmp(nrs_worker_control(w), "connected");
    if (controlled) {
        rc = nrs_worker_control_plan(w, 30);
    } else {
        nrs_plan_req_t req;
        nrs_plan_t p;
        nrs_plan_req_init(&req, &spec);
        req.gpus = n;
        rc = nrs_plan_best(&spec, &req, &p, err, sizeof err) ? NRS_ERR_PLAN : 0;
        if (!rc) {
            p.epoch = 1;
            rc = nrs_worker_set_plan(w, &p);
        } else {
            fprintf(stderr, "nereus-worker: rank %d: no plan: %s\n", me, err);
        }
    }
    if (!rc)
        rc = nrs_worker_alloc_state(w, NRS_MEM_AUTO, 1);
    if (rc) {
        fprintf(stderr, "nereus-worker: rank %d: %s: %s (control: %s)\n", me,
                nrs_worker_strerror(rc), nrs_worker_last_error(w), nrs_worker_control(w));
        nrs_worker_finalize(w);
        return rc == NRS_ERR_RETIRED ? 4 : 1;
    }
    printf("rank %d of %d: pid %ld, epoch %d, GPU %d, %d buffer(s), control %s, %d step(s)\n",
           me, n, (long)getpid(), nrs_worker_epoch(w), nrs_worker_gpu(w),
           nrs_worker_nbuffers(w), nrs_worker_control(w), steps);
    fflush(stdout);

    double f[NRS_MS_COUNT], t[NRS_MS_COUNT];
    factors(f);
    /* wall seconds per true second: the first step takes step_ms */
    double scale = -1;
    int ntrans = 0, exitc = 0, sync_err = 0, partial = 0;
    int trace_sync = getenv("NEREUS_TRACE_SYNC") && atoi(getenv("NEREUS_TRACE_SYNC"));
    int s0 = nrs_worker_joined_at(w) > 0 ? nrs_worker_joined_at(w) : 0;
    if (nrs_worker_joined_at(w) >= 0)
        printf("rank %d of %d: joined the job at step %d\n", me, n, s0);
    /* a joiner in line (no GPU) counts steps of its own: at every commit it
     * takes the job's, announced when a commit (or a partial one) places it */
    int in_line = nrs_worker_joined_at(w) >= 0 && nrs_worker_gpu(w) < 0;
again:
    for (int s = s0; s < steps && !exitc; s++) {
        double rl = steps > 1 ? r0 + (r1 - r0) * s / (steps - 1) : r0;
        /* the current plan: this rank's roles come from it; the times from the cost model */
        nrs_plan_t p;
        nrs_worker_plan(w, &p);
        double sum = true_times(&spec, &p, rl, f, t);
        if (scale < 0)
            scale = sum > 0 ? step_ms / 1000.0 / sum : 0;
        sleep_s(sum * scale);
        for (int ms = 0; ms < NRS_MS_COUNT; ms++)
            if (p.has[ms])
                nrs_worker_report_stage(w, ms, t[ms]);
        nrs_worker_report_step(w, s, rl);
        rc = nrs_worker_control_step(w);
        if (rc == 1) {
            ntrans++;
            partial = 0;
            printf("rank %d: step %d: epoch %d committed (GPU %d, %d buffer(s), %.3f s)\n", me, s,
                   nrs_worker_epoch(w), nrs_worker_gpu(w), nrs_worker_nbuffers(w),
                   nrs_worker_transition_stat(w, NRS_TS_SECONDS));
            s = take_job_step(w, &in_line, s);
            if (nrs_worker_transition_stat(w, NRS_TS_RESTORED_STEP) >= 0)
                printf("rank %d: step %d: %s\n", me, s, nrs_worker_last_error(w));
        } else if (rc == NRS_ERR_ABORTED) {
            printf("rank %d: step %d: transition aborted, staying on epoch %d: %s\n", me, s,
                   nrs_worker_epoch(w), nrs_worker_last_error(w));
        } else if (rc == NRS_ERR_PARTIAL) {
            printf("rank %d: step %d: %s\n", me, s, nrs_worker_last_error(w));
            s = take_job_step(w, &in_line, s);
            if (controlled) { /* the controller's next epoch rebuilds or restores it */
                printf("rank %d: step %d: waiting for the recovery (replicas, else the "
                       "checkpoint)\n", me, s);
                partial = 1;
            } else {
                exitc = 3;
            }
        } else if (rc == NRS_ERR_RETIRED) {
            printf("rank %d: step %d: retired: %s\n", me, s, nrs_worker_last_error(w));
            /* only finalize is allowed now: what the step's other calls say */
            int rs = nrs_worker_report_step(w, s, 0), ws = nrs_worker_weight_sync(w);
            printf("rank %d: step %d: after retirement: report_step: %s, weight_sync: %s\n", me,
                   s, nrs_worker_strerror(rs), nrs_worker_strerror(ws));
            exitc = 4;
        } else if (rc < 0) {
            printf("rank %d: step %d: %s: %s\n", me, s, nrs_worker_strerror(rc),
                   nrs_worker_last_error(w));
        }
        /* after the train phase (and the step boundary's transition, if
         * any): actor.train's weights -> actor.generate's, then the checkpoint */
        if (!exitc)
            exitc = step_tail(w, s, steps, ck_every, trace_sync, &sync_err);
        fflush(stdout);
    }
    /* follow the controller until it is quiet: a transition decided on the last
     * steps is a collective every rank must take part in */
    if (in_line && controlled && !exitc) {
        printf("rank %d: its steps done, in line: following the controller (%g s quiet "
               "at most)\n", me, quiet);
        fflush(stdout);
    }
    for (double end = quiet; controlled && !exitc && end > 0;) {
        rc = nrs_worker_control_poll(w, 0.1);
        end -= 0.1;
        if (rc == 1) {
            ntrans++;
            end = quiet;
            printf("rank %d: after the last step: epoch %d committed (GPU %d)\n", me,
                   nrs_worker_epoch(w), nrs_worker_gpu(w));
            int was = in_line, s = take_job_step(w, &in_line, steps);
            if (was && !in_line && s + 1 < steps) { /* placed: the job's steps are not done */
                /* the others are at the rest of step s's boundary */
                if ((exitc = step_tail(w, s, steps, ck_every, trace_sync, &sync_err)))
                    break;
                s0 = s + 1;
                goto again;
            }
        } else if (rc == NRS_ERR_PARTIAL) {
            exitc = 3;
        } else if (rc == NRS_ERR_RETIRED) {
            exitc = 4;
        } else if (rc == NRS_ERR_ABORTED) {
            end = quiet;
        }
    }
    if (!exitc && partial) {
        printf("rank %d: epoch %d: the state is still partial: no recovery came\n", me,
               nrs_worker_epoch(w));
        exitc = 3;
    }
    if (!exitc) {
        long long ver = 0, bad = 0;
        rc = nrs_worker_verify_state(w, &ver, &bad);
        printf("rank %d: epoch %d, %d transition(s): verified %lld shards, %lld mismatches\n", me,
               nrs_worker_epoch(w), ntrans, ver, bad);
        exitc = rc ? 1 : 0;
        nrs_plan_t p;
        nrs_worker_plan(w, &p);
        if (p.has[NRS_MS_ACTOR_TRAIN] && p.has[NRS_MS_ACTOR_GENERATE] && nrs_worker_gpu(w) >= 0) {
            long long gver = 0, gbad = 0;
            /* a transition after the last step: its generation buffers are not filled yet */
            rc = nrs_worker_verify_generation(w, &gver, &gbad);
            if (rc == NRS_ERR_INVAL && !nrs_worker_weight_sync(w))
                rc = nrs_worker_verify_generation(w, &gver, &gbad);
            double n_ok = nrs_worker_sync_stat(w, NRS_SS_STEPS);
            printf("rank %d: weight sync: %.0f steps, %.0f bytes, %.0f failed, %.6f s/step; "
                   "verified %lld generation shards, %lld mismatches (%.0f sampled); %.0f bytes "
                   "hashed\n", me, n_ok,
                   nrs_worker_sync_stat(w, NRS_SS_BYTES), nrs_worker_sync_stat(w, NRS_SS_FAILED),
                   n_ok > 0 ? nrs_worker_sync_stat(w, NRS_SS_TOTAL_S) / n_ok : 0.0, gver, gbad,
                   nrs_worker_sync_stat(w, NRS_SS_SAMPLED),
                   nrs_worker_sync_stat(w, NRS_SS_BYTES_VERIFIED));
            printf("rank %d: weight syncs with nothing to move (no vote): %.0f\n", me,
                   nrs_worker_sync_stat(w, NRS_SS_NO_VOTE));
            if (rc == NRS_ERR_VERIFY)
                exitc = 1;
        }
    }
    /* a job that lost its controller ran on without adaptation, and its
     * collectives through the controller failed: not a success */
    if (controlled && !exitc && strcmp(nrs_worker_control(w), "connected") != 0) {
        printf("rank %d: the controller was lost during the run: %s\n", me,
               nrs_worker_control(w));
        exitc = 1;
    }
    fflush(stdout);
    rc = nrs_worker_finalize(w);
    return exitc ? exitc : rc ? 1 : 0;
}
