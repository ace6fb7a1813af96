/* The controller's status report (the body of a STATUS reply): epoch, plan
 * table, per-rank health, the last decisions with their numbers, calibration
 * error per model-stage, time spent in transitions. Text or JSON. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ctl/ctl_int.h"

#define STALE_S 60.0

/* A peer's text (a host name) as JSON: control bytes and bytes over 0x7e as
 * \u00XX, so the reply is valid JSON whatever the peer sent. */
static void json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            fprintf(f, "\\%c", ch);
        else if (ch < 0x20 || ch >= 0x7f)
            fprintf(f, "\\u%04x", ch);
        else
            fputc(ch, f);
    }
    fputc('"', f);
}

/* A peer's text for the table: every byte not printable ASCII as '?' (an
 * escape sequence would reach the terminal of whoever runs nereus status). */
static const char *text_str(const char *s, char *out, size_t n)
{
    size_t i = 0;
    for (; s[i] && i + 1 < n; i++)
        out[i] = (unsigned char)s[i] < 0x20 || (unsigned char)s[i] >= 0x7f ? '?' : s[i];
    out[i] = 0;
    return out;
}

static const char *health(const nrs_conn_t *k, double now)
{
    if (k->nreports == 0)
        return "silent";
    return now - k->t_report > STALE_S ? "stale" : "ok";
}

static const char *phase_name(int tr)
{
    return tr == TR_PREPARE ? "prepare" : tr == TR_COMMIT ? "commit" : "idle";
}

/* The plan's JSON without nrs_plan_print_json's trailing newline. */
static void plan_json(FILE *f, const nrs_spec_t *s, const nrs_plan_t *p)
{
    char *t = NULL;
    size_t n = 0;
    FILE *m = open_memstream(&t, &n);
    if (!m) {
        fputs("null", f);
        return;
    }
    nrs_plan_print_json(m, s, p);
    fclose(m);
    while (n > 0 && (t[n - 1] == '\n' || t[n - 1] == ' '))
        t[--n] = 0;
    fputs(n ? t : "null", f);
    free(t);
}

static void status_json(nrs_ctl_t *c, double now, FILE *f)
{
    const nrs_spec_t *s = c->o.spec;
    const nrs_plan_t *cur = c->tr != TR_IDLE ? &c->tr_saved.plan : &c->a.plan;
    const nrs_calibrator_t *cal = &c->a.cal;
    nrs_calib_t fac;

    fputs("{\"job\":", f);
    json_str(f, c->job);
    fprintf(f, ",\"uptime_s\":%.3f,\"epoch\":%u,\"pending_epoch\":", now - c->t_start, cur->epoch);
    if (c->tr != TR_IDLE)
        fprintf(f, "%u", c->tr_epoch);
    else
        fputs("null", f);
    fprintf(f, ",\"transition_phase\":\"%s\",\"gpus\":%d,\"lost_gpus_pending\":%d,"
               "\"generation\":%llu,\"step\":%ld,\"response_len\":%.6g,\"nworkers\":%d,"
               "\"connections\":%d,\"plan\":",
            phase_name(c->tr), c->alloc_gpus, c->rz_nlost, (unsigned long long)c->generation,
            c->step_closed, c->work.response_len, c->nworkers, c->nconns);
    plan_json(f, s, cur);
    if (c->tr != TR_IDLE) {
        fputs(",\"pending_plan\":", f);
        plan_json(f, s, &c->a.plan);
    }
    fputs(",\"workers\":[", f);
    for (int g = 0, n = 0; g < NRS_PROTO_MAX_GPUS && n < c->nworkers; g++) {
        const nrs_conn_t *k = c->by_gpu[g];
        if (!k)
            continue;
        fprintf(f, "%s{\"rank\":%d,\"host\":", n++ ? "," : "", g);
        json_str(f, k->host);
        fprintf(f, ",\"transport\":\"%s\",\"last_step\":%ld,\"reports\":%lu,\"report_age_s\":",
                k->tcp ? "tcp" : "unix", k->last_step, k->nreports);
        if (k->nreports)
            fprintf(f, "%.3f", now - k->t_report);
        else
            fputs("null", f);
        fprintf(f, ",\"health\":\"%s\"}", health(k, now));
    }
    fputs("],\"decisions\":[", f);
    for (int i = 0; i < c->ndec; i++) {
        const decision_t *d = &c->dec[i];
        fprintf(f, "%s{\"step\":%ld,\"source\":", i ? "," : "", d->step);
        json_str(f, d->source);
        fprintf(f, ",\"trigger\":\"%s\",\"planned\":%s,\"admitted\":%s,\"forced\":%s,"
                   "\"retune\":%s,\"saving_s\":%.6g,\"horizon_steps\":%.6g,\"cost_s\":%.6g,"
                   "\"makespan_s\":%.6g,\"lost_boxes\":%d,\"from_epoch\":%u,\"to_epoch\":%u,\"why\":",
                nrs_ctl_trigger_names[d->trigger], d->planned ? "true" : "false",
                d->admitted ? "true" : "false", d->forced ? "true" : "false",
                d->retune ? "true" : "false", d->saving_s,
                d->horizon_steps, d->cost_s, d->makespan_s, d->lost_boxes, d->from_epoch, d->to_epoch);
        json_str(f, d->why);
        fputc('}', f);
    }
    nrs_calibrator_factors(cal, &fac);
    fputs("],\"calibration\":{", f);
    for (int ms = 0, n = 0; ms < NRS_MS_COUNT; ms++) {
        if (!cur->has[ms])
            continue;
        fprintf(f, "%s\"%s\":{\"error\":%.6g,\"factor\":%.6g,\"samples\":%d}", n++ ? "," : "",
                nrs_ms_name((nrs_ms_t)ms), nrs_calibrator_error(cal, (nrs_ms_t)ms), fac.stage[ms],
                cal->n[ms]);
    }
    fprintf(f, ",\"sync\":{\"error\":%.6g,\"factor\":%.6g,\"samples\":%d}}", cal->sync_err, fac.sync,
            cal->sync_n);
    fprintf(f, ",\"transitions\":{\"started\":%lu,\"committed\":%lu,\"aborted\":%lu,"
               "\"retunes\":%lu,\"total_s\":%.6g,\"last_s\":%.6g,\"share_of_uptime\":%.6g}",
            c->tr_started, c->tr_committed, c->tr_aborted, c->tr_retunes, c->tr_total_s,
            c->tr_last_s,
            now > c->t_start ? c->tr_total_s / (now - c->t_start) : 0.0);
    fprintf(f, ",\"counters\":{\"reports\":%lu,\"frames\":%lu,\"dropped\":%lu,\"gathers\":%lu,"
               "\"gathers_short\":%lu,\"stale_reports\":%lu}}\n",
            c->reports, c->frames, c->dropped, c->gathers, c->gathers_short, c->stale_reports);
}

static void status_text(nrs_ctl_t *c, double now, FILE *f)
{
    const nrs_spec_t *s = c->o.spec;
    const nrs_plan_t *cur = c->tr != TR_IDLE ? &c->tr_saved.plan : &c->a.plan;
    const nrs_calibrator_t *cal = &c->a.cal;
    nrs_calib_t fac;

    fprintf(f, "job %s: epoch %u", c->job[0] ? c->job : "(any)", cur->epoch);
    if (c->tr != TR_IDLE)
        fprintf(f, " (transition to epoch %u: %s)", c->tr_epoch, phase_name(c->tr));
    fprintf(f, ", %d GPUs, step %ld, %d workers, %d connections, up %.1f s\n\n", c->alloc_gpus,
            c->step_closed, c->nworkers, c->nconns, now - c->t_start);
    nrs_plan_print(f, s, cur);
    fprintf(f, "\nranks: %-6s %-20s %-9s %10s %8s %s\n", "rank", "host", "transport", "last step",
            "age (s)", "health");
    for (int g = 0, n = 0; g < NRS_PROTO_MAX_GPUS && n < c->nworkers; g++) {
        const nrs_conn_t *k = c->by_gpu[g];
        if (!k)
            continue;
        n++;
        char host[sizeof(k->host)];
        text_str(k->host, host, sizeof(host));
        if (k->nreports)
            fprintf(f, "       %-6d %-20s %-9s %10ld %8.1f %s\n", g, host, k->tcp ? "tcp" : "unix",
                    k->last_step, now - k->t_report, health(k, now));
        else
            fprintf(f, "       %-6d %-20s %-9s %10s %8s %s\n", g, host, k->tcp ? "tcp" : "unix",
                    "-", "-", health(k, now));
    }
    fprintf(f, "\ndecisions (latest last):\n");
    if (!c->ndec)
        fprintf(f, "  none yet\n");
    for (int i = 0; i < c->ndec; i++) {
        const decision_t *d = &c->dec[i];
        fprintf(f, "  [%s] %s: %s%s, saving %.4f s/step over %.1f steps vs cost %.3f s; epoch %u -> %u: %s\n",
                d->source, nrs_ctl_trigger_names[d->trigger],
                !d->planned ? "kept" : d->admitted ? "admitted" : "rejected",
                d->forced ? " (forced)" : d->retune ? " (re-tune)" : "", d->saving_s,
                d->horizon_steps, d->cost_s, d->from_epoch, d->to_epoch, d->why);
    }
    nrs_calibrator_factors(cal, &fac);
    fprintf(f, "\ncalibration error per model-stage:\n");
    for (int ms = 0; ms < NRS_MS_COUNT; ms++)
        if (cur->has[ms])
            fprintf(f, "  %-16s %6.1f%%  (factor %.3f, %d samples)\n", nrs_ms_name((nrs_ms_t)ms),
                    100 * nrs_calibrator_error(cal, (nrs_ms_t)ms), fac.stage[ms], cal->n[ms]);
    fprintf(f, "  %-16s %6.1f%%  (factor %.3f, %d samples)\n", "transitions", 100 * cal->sync_err,
            fac.sync, cal->sync_n);
    fprintf(f, "\ntransitions: %lu started, %lu committed (%lu micro-batch re-tunes), %lu "
               "aborted; %.3f s in transitions (last %.3f s, %.4f%% of uptime)\n",
            c->tr_started, c->tr_committed, c->tr_retunes, c->tr_aborted, c->tr_total_s,
            c->tr_last_s,
            now > c->t_start ? 100 * c->tr_total_s / (now - c->t_start) : 0.0);
    fprintf(f, "counters: %lu reports, %lu frames, %lu peers dropped, %lu gathers (%lu without "
               "every participant), %lu stale reports ignored\n",
            c->reports, c->frames, c->dropped, c->gathers, c->gathers_short, c->stale_reports);
}

void nrs_ctl_status(nrs_ctl_t *c, bool json, double now, FILE *out)
{
    if (json)
        status_json(c, now, out);
    else
        status_text(c, now, out);
}
