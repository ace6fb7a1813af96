/* Table-driven walk of a YAML mapping into a C struct: one nrs_field_t per key
 * (type, offset, range), so each section of the spec is a table, not code. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "spec/spec_internal.h"

enum { PATH_MAX_LEN = 96, LIST_MAX_LEN = 256 };

int nrs_deref(nrs_sctx_t *c, int idx)
{
    const nrs_ynode_t *n = nrs_node(c, idx);
    if (n->kind != NRS_YN_ALIAS)
        return idx;
    if (++c->expansions > NRS_SPEC_MAX_ALIASES)
        return nrs_diag_at(&c->d, n->mark, "too many alias expansions (limit %d)",
                           NRS_SPEC_MAX_ALIASES);
    return n->target;
}

static const char *where(const char *path)
{
    return *path ? path : "the top level";
}

int nrs_type_error(nrs_sctx_t *c, const char *path, int node, const char *want)
{
    const nrs_ynode_t *n = nrs_node(c, node);
    nrs_ytype_t t = nrs_ynode_type(n);
    char q[NRS_QUOTE_MAX + 8];
    if (n->kind == NRS_YN_SCALAR && t != NRS_YT_NULL)
        return nrs_diag_at(&c->d, n->mark, "%s: expected %s, got %s '%s'", where(path), want,
                           nrs_ynode_what(n), nrs_quote(q, n->text, n->len));
    return nrs_diag_at(&c->d, n->mark, "%s: expected %s, got %s", where(path), want,
                       nrs_ynode_what(n));
}

static bool text_is(const nrs_ynode_t *n, const char *s)
{
    return n->kind == NRS_YN_SCALAR && strlen(s) == n->len && memcmp(s, n->text, n->len) == 0;
}

static void fmt_num(char *buf, size_t cap, double v)
{
    snprintf(buf, cap, "%.15g", v);
}

static int check_range(nrs_sctx_t *c, const char *path, const nrs_ynode_t *n,
                       const nrs_field_t *f, double v, bool interval)
{
    bool lo_bad = (f->flags & NRS_LO_OPEN) ? !(v > f->lo) : !(v >= f->lo);
    bool hi_bad = (f->flags & NRS_HI_OPEN) ? !(v < f->hi) : !(v <= f->hi);
    if (!lo_bad && !hi_bad)
        return 0;
    char lo[32], hi[32], q[NRS_QUOTE_MAX + 8];
    fmt_num(lo, sizeof(lo), f->lo);
    fmt_num(hi, sizeof(hi), f->hi);
    nrs_quote(q, n->text, n->len);
    if (interval)
        return nrs_diag_at(&c->d, n->mark, "%s must be in %c%s, %s%c, got %s", path,
                           (f->flags & NRS_LO_OPEN) ? '(' : '[', lo, hi,
                           (f->flags & NRS_HI_OPEN) ? ')' : ']', q);
    if (lo_bad)
        return nrs_diag_at(&c->d, n->mark, "%s must be %s %s, got %s", path,
                           (f->flags & NRS_LO_OPEN) ? ">" : ">=", lo, q);
    return nrs_diag_at(&c->d, n->mark, "%s must be %s %s, got %s", path,
                       (f->flags & NRS_HI_OPEN) ? "<" : "<=", hi, q);
}

static int get_int(nrs_sctx_t *c, const char *path, int node, const nrs_field_t *f, int *dst)
{
    const nrs_ynode_t *n = nrs_node(c, node);
    char q[NRS_QUOTE_MAX + 8];
    if (nrs_ynode_type(n) != NRS_YT_INT)
        return nrs_type_error(c, path, node, "an integer");
    errno = 0;
    char *end = NULL;
    long long v = strtoll(n->text, &end, 10);
    if (errno == ERANGE || v < -2147483647LL - 1 || v > 2147483647LL)
        return nrs_diag_at(&c->d, n->mark, "%s: integer out of range: %s", path,
                           nrs_quote(q, n->text, n->len));
    if (check_range(c, path, n, f, (double)v, false) < 0)
        return -1;
    *dst = (int)v;
    return 0;
}

static int get_dbl(nrs_sctx_t *c, const char *path, int node, const nrs_field_t *f, double *dst)
{
    const nrs_ynode_t *n = nrs_node(c, node);
    char q[NRS_QUOTE_MAX + 8];
    nrs_ytype_t t = nrs_ynode_type(n);
    if (t != NRS_YT_INT && t != NRS_YT_NUM)
        return nrs_type_error(c, path, node, "a number");
    errno = 0;
    char *end = NULL;
    double v = strtod(n->text, &end);
    if (errno == ERANGE || !isfinite(v))
        return nrs_diag_at(&c->d, n->mark, "%s: number out of range: %s", path,
                           nrs_quote(q, n->text, n->len));
    if (check_range(c, path, n, f, v, true) < 0)
        return -1;
    *dst = v;
    return 0;
}

static int get_bool(nrs_sctx_t *c, const char *path, int node, bool *dst)
{
    const nrs_ynode_t *n = nrs_node(c, node);
    if (nrs_ynode_type(n) != NRS_YT_BOOL)
        return nrs_type_error(c, path, node, "a boolean (true or false)");
    *dst = n->text[0] == 't' || n->text[0] == 'T';
    return 0;
}

int nrs_get_string(nrs_sctx_t *c, const char *path, int node, char *dst, size_t cap)
{
    const nrs_ynode_t *n = nrs_node(c, node);
    nrs_ytype_t t = nrs_ynode_type(n);
    if (n->kind != NRS_YN_SCALAR || t == NRS_YT_NULL)
        return nrs_type_error(c, path, node, "a string");
    if (memchr(n->text, '\0', n->len))
        return nrs_diag_at(&c->d, n->mark, "%s: string contains a NUL byte", path);
    /* the reader refuses raw control characters; escapes ("\e", "\x1b",
     * "\N") reach here, and a name with ESC [ 31m in it would colour every
     * log line and status table that prints it */
    for (size_t i = 0; i < n->len; i++) {
        const unsigned char *u = (const unsigned char *)n->text + i;
        if (u[0] < 0x20 || u[0] == 0x7f || (u[0] == 0xc2 && u[1] >= 0x80 && u[1] <= 0x9f) ||
            (u[0] == 0xe2 && u[1] == 0x80 && (u[2] == 0xa8 || u[2] == 0xa9)))
            return nrs_diag_at(&c->d, n->mark, "%s: string contains a control character",
                               path);
    }
    if (n->len >= cap)
        return nrs_diag_at(&c->d, n->mark, "%s: string too long (%zu bytes, max %zu)", path,
                           n->len, cap - 1);
    memcpy(dst, n->text, n->len + 1);
    return 0;
}

static void join_names(char *buf, size_t cap, const char *const *names, size_t n)
{
    size_t o = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < n && o < cap; i++) {
        if (!names[i])
            continue;
        int k = snprintf(buf + o, cap - o, "%s%s", o ? ", " : "", names[i]);
        if (k < 0)
            break;
        o += (size_t)k;
    }
}

int nrs_get_enum(nrs_sctx_t *c, const char *path, int node, const nrs_enum_t *enums, int *dst)
{
    const nrs_ynode_t *n = nrs_node(c, node);
    const char *names[NRS_MAX_FIELDS];
    size_t k = 0;
    if (n->kind != NRS_YN_SCALAR || nrs_ynode_type(n) == NRS_YT_NULL)
        return nrs_type_error(c, path, node, "a name");
    for (const nrs_enum_t *e = enums; e->name && k < NRS_MAX_FIELDS; e++, k++) {
        names[k] = e->name;
        if (strlen(e->name) == n->len && strncasecmp(e->name, n->text, n->len) == 0) {
            *dst = e->value;
            return 0;
        }
    }
    char list[LIST_MAX_LEN], q[NRS_QUOTE_MAX + 8];
    join_names(list, sizeof(list), names, k);
    const char *s = nrs_suggest(n->text, n->len, names, k);
    nrs_quote(q, n->text, n->len);
    if (s)
        return nrs_diag_at(&c->d, n->mark,
                           "%s: unknown value '%s'; did you mean '%s'? (one of: %s)", path, q, s,
                           list);
    return nrs_diag_at(&c->d, n->mark, "%s: unknown value '%s' (one of: %s)", path, q, list);
}

static int get_value(nrs_sctx_t *c, const char *path, int key, int val, void *dst,
                     const nrs_field_t *f)
{
    switch (f->type) {
    case NRS_F_INT:
        return get_int(c, path, val, f, dst);
    case NRS_F_DBL:
        return get_dbl(c, path, val, f, dst);
    case NRS_F_BOOL:
        return get_bool(c, path, val, dst);
    case NRS_F_STR:
        return nrs_get_string(c, path, val, dst, NRS_NAME_MAX);
    case NRS_F_ENUM: {
        int v = 0;
        if (nrs_get_enum(c, path, val, f->enums, &v) < 0)
            return -1;
        memcpy(dst, &v, sizeof(v)); /* enum fields of the spec are int-sized */
        return 0;
    }
    case NRS_F_FN:
        return f->fn(c, path, key, val, dst, f);
    }
    return -1;
}

static int unknown_key(nrs_sctx_t *c, const char *path, const nrs_ynode_t *k,
                       const nrs_field_t *fields, size_t n)
{
    const char *names[NRS_MAX_FIELDS];
    char list[LIST_MAX_LEN], q[NRS_QUOTE_MAX + 8];
    for (size_t i = 0; i < n; i++)
        names[i] = fields[i].name;
    nrs_quote(q, k->text, k->len);
    const char *s = nrs_suggest(k->text, k->len, names, n);
    if (s)
        return nrs_diag_at(&c->d, k->mark, "unknown key '%s' in %s; did you mean '%s'?", q,
                           where(path), s);
    join_names(list, sizeof(list), names, n);
    return nrs_diag_at(&c->d, k->mark, "unknown key '%s' in %s (valid keys: %s)", q, where(path),
                       list);
}

static int find_field(const nrs_ynode_t *k, const nrs_field_t *fields, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (text_is(k, fields[i].name))
            return (int)i;
    return -1;
}

int nrs_walk_map(nrs_sctx_t *c, int node, const char *path, const nrs_field_t *fields,
                 size_t n, void *base, nrs_seen_t *seen)
{
    const nrs_ynode_t *m = nrs_node(c, node);
    memset(seen, 0, sizeof(*seen));
    seen->map = m->mark;
    if (m->kind != NRS_YN_MAP)
        return nrs_type_error(c, path, node, "a mapping");

    for (int k = m->first; k >= 0;) {
        int v = nrs_node(c, k)->next; /* libyaml always pairs key and value */
        if (v < 0)
            return nrs_diag_at(&c->d, nrs_node(c, k)->mark, "%s: key without a value",
                               where(path));
        int next = nrs_node(c, v)->next;
        int key = nrs_deref(c, k);
        if (key < 0)
            return -1;
        const nrs_ynode_t *kn = nrs_node(c, key);
        if (kn->kind != NRS_YN_SCALAR)
            return nrs_diag_at(&c->d, nrs_node(c, k)->mark, "%s: expected a key name, got %s",
                               where(path), nrs_ynode_what(kn));
        int i = find_field(kn, fields, n);
        if (i < 0)
            return unknown_key(c, path, kn, fields, n);
        if (nrs_seen(seen, i))
            return nrs_diag_at(&c->d, nrs_node(c, k)->mark,
                               "duplicate key '%s' in %s (first at %d:%d)", fields[i].name,
                               where(path), seen->key[i].line, seen->key[i].col);
        seen->bits |= 1u << i;
        seen->key[i] = nrs_node(c, k)->mark;
        seen->val[i] = nrs_node(c, v)->mark;
        int val = nrs_deref(c, v);
        if (val < 0)
            return -1;
        char sub[PATH_MAX_LEN];
        snprintf(sub, sizeof(sub), "%s%s%s", path, *path ? "." : "", fields[i].name);
        if (get_value(c, sub, key, val, (char *)base + fields[i].off, &fields[i]) < 0)
            return -1;
        k = next;
    }

    for (size_t i = 0; i < n; i++)
        if ((fields[i].flags & NRS_REQUIRED) && !nrs_seen(seen, (int)i))
            return nrs_diag_at(&c->d, m->mark, "missing required key '%s' in %s", fields[i].name,
                               where(path));
    return 0;
}
