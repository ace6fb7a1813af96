/* Spec diagnostics: one line "FILE:LINE:COL: message", whatever the input bytes. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "spec/spec_internal.h"

/* A message must stay one printable line even when it echoes user bytes:
 * C0 controls, DEL, the C1 controls (NEL among them) and the line and
 * paragraph separators each become one '?'. */
static void flatten(char *s)
{
    const unsigned char *p = (const unsigned char *)s;
    char *o = s;
    while (*p) {
        size_t n = 0;
        if (*p < 0x20 || *p == 0x7f)
            n = 1;
        else if (p[0] == 0xc2 && p[1] >= 0x80 && p[1] <= 0x9f)
            n = 2;
        else if (p[0] == 0xe2 && p[1] == 0x80 && (p[2] == 0xa8 || p[2] == 0xa9))
            n = 3;
        if (n) {
            *o++ = '?';
            p += n;
        } else {
            *o++ = (char)*p++;
        }
    }
    *o = '\0';
}

int nrs_diag_at(nrs_diag_t *d, nrs_mark_t m, const char *fmt, ...)
{
    if (d->failed)
        return -1;
    d->failed = true;
    if (!d->err || d->errlen == 0)
        return -1;

    int line = m.line > 0 ? m.line : 1;
    int col = m.col > 0 ? m.col : 1;
    int k = snprintf(d->err, d->errlen, "%s:%d:%d: ", d->file ? d->file : "<spec>", line, col);
    if (k >= 0 && (size_t)k < d->errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(d->err + k, d->errlen - (size_t)k, fmt, ap);
        va_end(ap);
    }
    flatten(d->err);
    return -1;
}

const char *nrs_quote(char buf[NRS_QUOTE_MAX + 8], const char *s, size_t len)
{
    size_t o = 0;
    size_t i = 0;
    for (; i < len && o < NRS_QUOTE_MAX; i++) {
        unsigned char ch = (unsigned char)s[i];
        buf[o++] = (ch < 0x20 || ch == 0x7f) ? '?' : (char)ch;
    }
    if (i < len) {
        /* never leave half a UTF-8 sequence before the ellipsis */
        while (o > 0 && ((unsigned char)buf[o - 1] & 0xC0) == 0x80)
            o--;
        if (o > 0 && ((unsigned char)buf[o - 1] & 0xC0) == 0xC0)
            o--;
        memcpy(buf + o, "...", 3);
        o += 3;
    }
    buf[o] = '\0';
    return buf;
}
