#include "util/util.h"

#include <stdarg.h>
#include <stdio.h>
#include <time.h>

double nrs_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double awake_last, awake_skipped;

double nrs_awake_s(void)
{
    double now = nrs_now_s();
    if (awake_last > 0 && now - awake_last > NRS_AWAKE_GAP_S)
        awake_skipped += now - awake_last;
    awake_last = now;
    return now - awake_skipped;
}

double nrs_awake_skipped_s(void)
{
    return awake_skipped;
}

int nrs_awake_slice_ms(double left)
{
    if (!(left > 0))
        return 0;
    return left < NRS_AWAKE_SLICE_S ? (int)(left * 1000) + 1 : (int)(NRS_AWAKE_SLICE_S * 1000);
}

void nrs_nap_us(long us)
{
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

void nrs_seterr(char *err, size_t len, const char *fmt, ...)
{
    va_list ap;
    if (!err || !len)
        return;
    va_start(ap, fmt);
    vsnprintf(err, len, fmt, ap);
    va_end(ap);
}

void nrs_log_line(FILE *f, const char *s)
{
    for (const unsigned char *p = (const unsigned char *)s; *p; p++)
        if (*p < 0x20 || *p == 0x7f)
            fprintf(f, "\\x%02x", *p);
        else
            fputc(*p, f);
    fputc('\n', f);
    fflush(f);
}
