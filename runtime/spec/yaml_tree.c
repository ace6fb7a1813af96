/* A small YAML tree built from libyaml events, with the input bounds enforced
 * while parsing: depth, node count, anchors and aliases, no tags, one document.
 * Aliases are kept as references (never copied); the walker counts every
 * dereference, so no input can make the loader expand a "billion laughs". */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <yaml.h>

#include "spec/spec_internal.h"

typedef struct {
    nrs_ytree_t *t;
    nrs_diag_t *d;
    int open[NRS_SPEC_MAX_DEPTH + 1]; /* open collections */
    char *open_anchor[NRS_SPEC_MAX_DEPTH + 1];
    int depth;
    int docs;
} builder_t;

static nrs_mark_t mark_of(yaml_mark_t m)
{
    nrs_mark_t r = {(int)m.line + 1, (int)m.column + 1};
    if (m.line >= 0x7fffffff || m.column >= 0x7fffffff)
        r = (nrs_mark_t){0, 0};
    return r;
}

/* The character at u[i] (of len bytes, already checked by the reader, as
 * everything before a reader error is) and its size in bytes. */
static uint32_t char_at(const unsigned char *u, size_t len, size_t i, yaml_encoding_t enc,
                        size_t *n)
{
    uint32_t c;
    if (enc == YAML_UTF16LE_ENCODING || enc == YAML_UTF16BE_ENCODING) {
        if (i + 1 >= len) {
            *n = 1;
            return 0;
        }
        c = enc == YAML_UTF16LE_ENCODING ? u[i] | (uint32_t)u[i + 1] << 8
                                         : (uint32_t)u[i] << 8 | u[i + 1];
        *n = c >= 0xD800 && c < 0xDC00 && i + 3 < len ? 4 : 2; /* a surrogate pair */
        return c;
    }
    c = u[i];
    *n = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    if (i + *n > len)
        *n = 1;
    else if (*n == 2)
        c = (c & 0x1F) << 6 | (u[i + 1] & 0x3F);
    else if (*n == 3)
        c = (c & 0x0F) << 12 | (uint32_t)(u[i + 1] & 0x3F) << 6 | (u[i + 2] & 0x3F);
    return c;
}

/* Reader errors (bad UTF-8, control characters) carry a byte offset only:
 * count characters and line breaks up to it as libyaml's marks do (the BOM
 * is no column; CR LF, CR, LF, NEL, LS and PS are breaks; UTF-16 in 2-byte
 * units). */
static nrs_mark_t mark_of_offset(const char *buf, size_t len, size_t off, yaml_encoding_t enc)
{
    const unsigned char *u = (const unsigned char *)buf;
    nrs_mark_t m = {1, 1};
    bool utf16 = enc == YAML_UTF16LE_ENCODING || enc == YAML_UTF16BE_ENCODING, cr = false;
    size_t i = 0, n;
    if (off > len)
        off = len;
    if (utf16 && len >= 2 && ((u[0] == 0xFF && u[1] == 0xFE) || (u[0] == 0xFE && u[1] == 0xFF)))
        i = 2;
    else if (!utf16 && len >= 3 && u[0] == 0xEF && u[1] == 0xBB && u[2] == 0xBF)
        i = 3;
    for (; i < off; i += n) {
        uint32_t c = char_at(u, len, i, enc, &n);
        if (c == '\n' && cr) {
            /* the LF of a CR LF: one break */
        } else if (c == '\n' || c == '\r' || c == 0x85 || c == 0x2028 || c == 0x2029) {
            m.line++;
            m.col = 1;
        } else {
            m.col++;
        }
        cr = c == '\r';
    }
    return m;
}

static int syntax_error(builder_t *b, yaml_parser_t *p, const char *buf, size_t len)
{
    switch (p->error) {
    case YAML_MEMORY_ERROR:
        return nrs_diag_at(b->d, (nrs_mark_t){1, 1}, "out of memory while parsing YAML");
    case YAML_READER_ERROR:
    {
        nrs_mark_t m = mark_of_offset(buf, len, p->problem_offset, p->encoding);
        const char *what = p->problem ? p->problem : "unreadable";
        /* libyaml gives the octet for the UTF-8 octet problems and the decoded
         * character for the others (a control character, a surrogate, U+FFFE) */
        if (p->problem_value == -1)
            return nrs_diag_at(b->d, m, "invalid input: %s", what);
        if (strstr(what, "octet") ||
            (p->problem_value < 0x80 && p->encoding == YAML_UTF8_ENCODING))
            return nrs_diag_at(b->d, m, "invalid input: %s (byte 0x%02x)", what,
                               (unsigned)p->problem_value & 0xff);
        return nrs_diag_at(b->d, m, "invalid input: %s (U+%04X)", what,
                           (unsigned)p->problem_value);
    }
    default:
        break;
    }
    nrs_mark_t m = mark_of(p->problem_mark);
    if (p->context) {
        nrs_mark_t cm = mark_of(p->context_mark);
        return nrs_diag_at(b->d, m, "YAML syntax error: %s (%s at %d:%d)",
                           p->problem ? p->problem : "invalid YAML", p->context, cm.line, cm.col);
    }
    return nrs_diag_at(b->d, m, "YAML syntax error: %s", p->problem ? p->problem : "invalid YAML");
}

static int new_node(builder_t *b, nrs_yn_kind_t kind, yaml_mark_t m)
{
    nrs_ytree_t *t = b->t;
    if (t->n >= NRS_SPEC_MAX_NODES)
        return nrs_diag_at(b->d, mark_of(m), "too many YAML nodes (limit %d)", NRS_SPEC_MAX_NODES);
    if (t->n == t->cap) {
        int cap = t->cap ? t->cap * 2 : 64;
        nrs_ynode_t *v = realloc(t->v, (size_t)cap * sizeof(*v));
        if (!v)
            return nrs_diag_at(b->d, mark_of(m), "out of memory");
        t->v = v;
        t->cap = cap;
    }
    int idx = t->n++;
    t->v[idx] = (nrs_ynode_t){.kind = kind, .mark = mark_of(m), .first = -1, .last = -1,
                              .next = -1, .target = -1};
    return idx;
}

/* Link a finished-or-opened node into its parent (or make it the root). */
static void attach(builder_t *b, int idx)
{
    nrs_ytree_t *t = b->t;
    if (b->depth == 0) {
        t->root = idx;
        return;
    }
    nrs_ynode_t *parent = &t->v[b->open[b->depth - 1]];
    if (parent->last < 0)
        parent->first = idx;
    else
        t->v[parent->last].next = idx;
    parent->last = idx;
    parent->count++;
}

/* Anchors are registered when their node is complete, so an alias can never
 * point into a collection that contains it (no cycles). */
static int add_anchor(builder_t *b, char *name, int idx, yaml_mark_t m)
{
    nrs_ytree_t *t = b->t;
    if (t->nanchors >= NRS_SPEC_MAX_ANCHORS) {
        free(name);
        return nrs_diag_at(b->d, mark_of(m), "too many anchors (limit %d)", NRS_SPEC_MAX_ANCHORS);
    }
    t->anchor[t->nanchors] = name;
    t->anchor_node[t->nanchors] = idx;
    t->nanchors++;
    return 0;
}

static int take_anchor(builder_t *b, const yaml_char_t *anchor, char **out, yaml_mark_t m)
{
    *out = NULL;
    if (!anchor)
        return 0;
    *out = strdup((const char *)anchor);
    if (!*out)
        return nrs_diag_at(b->d, mark_of(m), "out of memory");
    return 0;
}

static int reject_tag(builder_t *b, const yaml_char_t *tag, yaml_mark_t m)
{
    if (!tag)
        return 0;
    char q[NRS_QUOTE_MAX + 8];
    return nrs_diag_at(b->d, mark_of(m), "YAML tags are not supported (found '%s')",
                       nrs_quote(q, (const char *)tag, strlen((const char *)tag)));
}

static int on_scalar(builder_t *b, yaml_event_t *ev)
{
    if (reject_tag(b, ev->data.scalar.tag, ev->start_mark) < 0)
        return -1;
    int idx = new_node(b, NRS_YN_SCALAR, ev->start_mark);
    if (idx < 0)
        return -1;
    nrs_ynode_t *n = &b->t->v[idx];
    size_t len = ev->data.scalar.length;
    n->text = malloc(len + 1);
    if (!n->text)
        return nrs_diag_at(b->d, mark_of(ev->start_mark), "out of memory");
    memcpy(n->text, ev->data.scalar.value, len);
    n->text[len] = '\0';
    n->len = len;
    n->plain = ev->data.scalar.style == YAML_PLAIN_SCALAR_STYLE;
    attach(b, idx);
    char *anchor;
    if (take_anchor(b, ev->data.scalar.anchor, &anchor, ev->start_mark) < 0)
        return -1;
    return anchor ? add_anchor(b, anchor, idx, ev->start_mark) : 0;
}

static int on_alias(builder_t *b, yaml_event_t *ev)
{
    nrs_ytree_t *t = b->t;
    const char *name = (const char *)ev->data.alias.anchor;
    char q[NRS_QUOTE_MAX + 8];
    if (++t->naliases > NRS_SPEC_MAX_ALIASES)
        return nrs_diag_at(b->d, mark_of(ev->start_mark), "too many aliases (limit %d)",
                           NRS_SPEC_MAX_ALIASES);
    int target = -1;
    for (int i = t->nanchors - 1; i >= 0 && target < 0; i--)
        if (strcmp(t->anchor[i], name) == 0)
            target = t->anchor_node[i];
    if (target < 0)
        return nrs_diag_at(b->d, mark_of(ev->start_mark),
                           "alias '*%s' refers to no complete anchor",
                           nrs_quote(q, name, strlen(name)));
    int idx = new_node(b, NRS_YN_ALIAS, ev->start_mark);
    if (idx < 0)
        return -1;
    t->v[idx].target = target;
    attach(b, idx);
    return 0;
}

static int on_start(builder_t *b, yaml_event_t *ev, nrs_yn_kind_t kind)
{
    const yaml_char_t *tag = kind == NRS_YN_MAP ? ev->data.mapping_start.tag
                                                : ev->data.sequence_start.tag;
    const yaml_char_t *anchor = kind == NRS_YN_MAP ? ev->data.mapping_start.anchor
                                                   : ev->data.sequence_start.anchor;
    if (reject_tag(b, tag, ev->start_mark) < 0)
        return -1;
    if (b->depth >= NRS_SPEC_MAX_DEPTH)
        return nrs_diag_at(b->d, mark_of(ev->start_mark), "nesting too deep (limit %d levels)",
                           NRS_SPEC_MAX_DEPTH);
    int idx = new_node(b, kind, ev->start_mark);
    if (idx < 0)
        return -1;
    attach(b, idx);
    if (take_anchor(b, anchor, &b->open_anchor[b->depth], ev->start_mark) < 0)
        return -1;
    b->open[b->depth++] = idx;
    return 0;
}

static int on_end(builder_t *b, yaml_event_t *ev)
{
    if (b->depth == 0) /* libyaml balances events; never trust it blindly */
        return nrs_diag_at(b->d, mark_of(ev->start_mark), "unbalanced YAML events");
    b->depth--;
    char *anchor = b->open_anchor[b->depth];
    b->open_anchor[b->depth] = NULL;
    return anchor ? add_anchor(b, anchor, b->open[b->depth], ev->start_mark) : 0;
}

static int on_event(builder_t *b, yaml_event_t *ev)
{
    switch (ev->type) {
    case YAML_DOCUMENT_START_EVENT:
        if (++b->docs > 1)
            return nrs_diag_at(b->d, mark_of(ev->start_mark),
                               "multiple YAML documents are not supported (one spec per file)");
        return 0;
    case YAML_SCALAR_EVENT:
        return on_scalar(b, ev);
    case YAML_ALIAS_EVENT:
        return on_alias(b, ev);
    case YAML_MAPPING_START_EVENT:
        return on_start(b, ev, NRS_YN_MAP);
    case YAML_SEQUENCE_START_EVENT:
        return on_start(b, ev, NRS_YN_SEQ);
    case YAML_MAPPING_END_EVENT:
    case YAML_SEQUENCE_END_EVENT:
        return on_end(b, ev);
    default:
        return 0;
    }
}

int nrs_ytree_parse(nrs_ytree_t *t, const char *buf, size_t len, nrs_diag_t *d)
{
    yaml_parser_t p;
    builder_t b = {.t = t, .d = d};
    int rc = -1;
    bool done = false;

    memset(t, 0, sizeof(*t));
    t->root = -1;
    if (!yaml_parser_initialize(&p))
        return nrs_diag_at(d, (nrs_mark_t){1, 1}, "out of memory");
    yaml_parser_set_input_string(&p, (const unsigned char *)buf, len);

    while (!done) {
        yaml_event_t ev;
        if (!yaml_parser_parse(&p, &ev)) {
            syntax_error(&b, &p, buf, len);
            goto fail;
        }
        done = ev.type == YAML_STREAM_END_EVENT;
        int r = on_event(&b, &ev);
        yaml_event_delete(&ev);
        if (r < 0)
            goto fail;
    }
    rc = 0;
fail:
    for (int i = 0; i < b.depth; i++)
        free(b.open_anchor[i]);
    yaml_parser_delete(&p);
    return rc;
}

void nrs_ytree_free(nrs_ytree_t *t)
{
    for (int i = 0; i < t->n; i++)
        free(t->v[i].text);
    free(t->v);
    for (int i = 0; i < t->nanchors; i++)
        free(t->anchor[i]);
    memset(t, 0, sizeof(*t));
    t->root = -1;
}

static bool is_word(const nrs_ynode_t *n, const char *const *words)
{
    for (; *words; words++)
        if (strlen(*words) == n->len && memcmp(*words, n->text, n->len) == 0)
            return true;
    return false;
}

static bool is_integer_text(const char *s, size_t len)
{
    size_t i = (len > 0 && (s[0] == '-' || s[0] == '+')) ? 1 : 0;
    if (i == len)
        return false;
    for (; i < len; i++)
        if (s[i] < '0' || s[i] > '9')
            return false;
    return true;
}

static bool is_number_text(const char *s, size_t len)
{
    size_t i = (len > 0 && (s[0] == '-' || s[0] == '+')) ? 1 : 0;
    size_t digits = 0;
    for (; i < len && s[i] >= '0' && s[i] <= '9'; i++)
        digits++;
    if (i < len && s[i] == '.')
        for (i++; i < len && s[i] >= '0' && s[i] <= '9'; i++)
            digits++;
    if (digits == 0)
        return false;
    if (i < len && (s[i] == 'e' || s[i] == 'E')) {
        i++;
        if (i < len && (s[i] == '-' || s[i] == '+'))
            i++;
        size_t ed = 0;
        for (; i < len && s[i] >= '0' && s[i] <= '9'; i++)
            ed++;
        if (ed == 0)
            return false;
    }
    return i == len;
}

nrs_ytype_t nrs_ynode_type(const nrs_ynode_t *n)
{
    static const char *const nulls[] = {"", "~", "null", "Null", "NULL", NULL};
    static const char *const bools[] = {"true", "True", "TRUE", "false", "False", "FALSE", NULL};
    if (n->kind == NRS_YN_MAP)
        return NRS_YT_MAP;
    if (n->kind == NRS_YN_SEQ)
        return NRS_YT_SEQ;
    if (n->kind != NRS_YN_SCALAR || !n->plain)
        return NRS_YT_STR;
    if (is_word(n, nulls))
        return NRS_YT_NULL;
    if (is_word(n, bools))
        return NRS_YT_BOOL;
    if (is_integer_text(n->text, n->len))
        return NRS_YT_INT;
    if (is_number_text(n->text, n->len))
        return NRS_YT_NUM;
    return NRS_YT_STR;
}

const char *nrs_ynode_what(const nrs_ynode_t *n)
{
    static const char *const what[] = {
        [NRS_YT_NULL] = "null",      [NRS_YT_BOOL] = "a boolean", [NRS_YT_INT] = "an integer",
        [NRS_YT_NUM] = "a number",   [NRS_YT_STR] = "a string",   [NRS_YT_MAP] = "a mapping",
        [NRS_YT_SEQ] = "a sequence",
    };
    return what[nrs_ynode_type(n)];
}
