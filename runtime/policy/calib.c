/* Online calibration: a multiplicative factor per model-stage (and one for
 * transitions), fitted in log space so that over- and under-predictions weigh
 * the same. The first 6/alpha samples (20 at the default alpha 0.3) are
 * averaged: the fastest unbiased start; after that an exponential average with
 * weight alpha/6 follows drift while keeping the noise of the estimate near
 * that of a 6/alpha-sample mean. Residuals beyond 3 robust
 * deviations are clipped (Huber-style), so one straggler step cannot drag the
 * factor. The factor applies to every layout of the stage: that is how the
 * model predicts layouts it has not run. */
#include <math.h>
#include <string.h>

#include "nereus/policy.h"

enum { CALIB_WARMUP = 5 };
#define CALIB_CLIP 3.0
#define CALIB_DEV0 0.1 /* initial robust scale: 10% */
/* |log factor| at most this: e^20 ~ 5e8, far beyond any real misprediction,
 * and small enough that exp() and every later sum stay finite. */
#define CALIB_LOG_MAX 20.0

static double clamp_log(double x)
{
    return x > CALIB_LOG_MAX ? CALIB_LOG_MAX : x < -CALIB_LOG_MAX ? -CALIB_LOG_MAX : x;
}

void nrs_calibrator_init(nrs_calibrator_t *c, double alpha)
{
    memset(c, 0, sizeof(*c));
    c->alpha = alpha > 0 && alpha <= 1 ? alpha : 0.3;
    for (int i = 0; i < NRS_MS_COUNT; i++)
        c->dev[i] = CALIB_DEV0;
    c->sync_dev = CALIB_DEV0;
}

/* Updates one (log factor, deviation, error, count) with a ratio sample. */
static void update(double alpha, double *log_f, double *dev, double *err, int *n, double measured,
                   double predicted)
{
    if (!(measured > 0) || !(predicted > 0) || !isfinite(measured) || !isfinite(predicted))
        return; /* garbage in: ignored, never propagated */
    /* the ratio of two finite positives can still over- or underflow */
    double x = log(measured / predicted);
    if (!isfinite(x))
        return;
    x = clamp_log(x);
    double r = x - *log_f;
    double calibrated_err = fabs(r);
    if (*n >= CALIB_WARMUP) {
        double lim = CALIB_CLIP * *dev;
        r = r > lim ? lim : r < -lim ? -lim : r;
    }
    double w = 1.0 / (*n + 1), floor = alpha / 6;
    if (w < floor)
        w = floor;
    *log_f = clamp_log(*log_f + w * r);
    *dev = (1 - w) * *dev + w * fabs(r) * 1.2533; /* mean |r| -> sigma for a normal */
    if (*dev < 1e-3)
        *dev = 1e-3;
    *err = *n == 0 ? calibrated_err : (1 - alpha) * *err + alpha * calibrated_err;
    (*n)++;
}

void nrs_calibrator_add(nrs_calibrator_t *c, nrs_ms_t ms, double measured_s, double predicted_s)
{
    if ((unsigned)ms >= NRS_MS_COUNT)
        return;
    update(c->alpha, &c->log_f[ms], &c->dev[ms], &c->err[ms], &c->n[ms], measured_s, predicted_s);
}

void nrs_calibrator_add_sync(nrs_calibrator_t *c, double measured_s, double predicted_s)
{
    update(c->alpha, &c->sync_log_f, &c->sync_dev, &c->sync_err, &c->sync_n, measured_s,
           predicted_s);
}

void nrs_calibrator_factors(const nrs_calibrator_t *c, nrs_calib_t *out)
{
    for (int i = 0; i < NRS_MS_COUNT; i++)
        out->stage[i] = exp(c->log_f[i]);
    out->sync = exp(c->sync_log_f);
}

double nrs_calibrator_error(const nrs_calibrator_t *c, nrs_ms_t ms)
{
    if ((unsigned)ms >= NRS_MS_COUNT || c->n[ms] == 0)
        return 0;
    return expm1(c->err[ms]);
}
