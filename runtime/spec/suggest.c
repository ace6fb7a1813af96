/* "did you mean" suggestions: optimal-string-alignment (Damerau) distance. */
#include <ctype.h>
#include <string.h>

#include "spec/spec_internal.h"

enum { SUGGEST_MAX_LEN = 64 }; /* longer words are never close to a key */

static int lower(char ch)
{
    return tolower((unsigned char)ch);
}

static size_t min3(size_t a, size_t b, size_t c)
{
    size_t m = a < b ? a : b;
    return m < c ? m : c;
}

size_t nrs_edit_distance(const char *a, size_t alen, const char *b, size_t blen, size_t cap)
{
    if (alen > SUGGEST_MAX_LEN || blen > SUGGEST_MAX_LEN)
        return cap + 1;
    size_t diff = alen > blen ? alen - blen : blen - alen;
    if (diff > cap)
        return cap + 1;

    /* three rows: i-2, i-1, i */
    size_t rows[3][SUGGEST_MAX_LEN + 1];
    for (size_t j = 0; j <= blen; j++)
        rows[1][j] = j;
    for (size_t i = 1; i <= alen; i++) {
        size_t *cur = rows[(i + 1) % 3], *prev = rows[i % 3], *pp = rows[(i + 2) % 3];
        cur[0] = i;
        for (size_t j = 1; j <= blen; j++) {
            size_t cost = lower(a[i - 1]) == lower(b[j - 1]) ? 0 : 1;
            cur[j] = min3(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost);
            if (i > 1 && j > 1 && lower(a[i - 1]) == lower(b[j - 2]) &&
                lower(a[i - 2]) == lower(b[j - 1]) && pp[j - 2] + 1 < cur[j])
                cur[j] = pp[j - 2] + 1;
        }
    }
    size_t dist = rows[(alen + 1) % 3][blen];
    return dist > cap ? cap + 1 : dist;
}

const char *nrs_suggest(const char *s, size_t len, const char *const *names, size_t n)
{
    /* a third of the word, at least one edit and at most three */
    size_t cap = len / 3;
    if (cap < 1)
        cap = 1;
    if (cap > 3)
        cap = 3;
    const char *best = NULL;
    size_t best_d = cap + 1;
    for (size_t i = 0; i < n; i++) {
        if (!names[i])
            continue;
        size_t d = nrs_edit_distance(s, len, names[i], strlen(names[i]), cap);
        if (d < best_d) {
            best_d = d;
            best = names[i];
        }
    }
    return best;
}
