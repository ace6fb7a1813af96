/* Internal interfaces of the spec loader: diagnostics, suggestions, the YAML
 * tree and the table-driven walker. Nothing here is exported. */
#ifndef NRS_SPEC_INTERNAL_H
#define NRS_SPEC_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "nereus/spec.h"

enum {
    NRS_SPEC_MAX_NODES = 1 << 16, /* YAML nodes per document; a real spec has < 300 */
    NRS_SPEC_MAX_ANCHORS = NRS_SPEC_MAX_ALIASES,
    NRS_QUOTE_MAX = 48 /* bytes of a scalar echoed in a message */
};

/* ---- diagnostics (diag.c) ------------------------------------------------ */

typedef struct {
    int line, col; /* 1-based; 0 = unknown */
} nrs_mark_t;

/* The first error wins; later ones are dropped so the root cause is reported. */
typedef struct {
    const char *file;
    char *err;
    size_t errlen;
    bool failed;
} nrs_diag_t;

/* Format "FILE:LINE:COL: msg" into d->err (once). Always returns -1. */
int nrs_diag_at(nrs_diag_t *d, nrs_mark_t m, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Printable, truncated, single-line copy of len bytes of s; returns buf. */
const char *nrs_quote(char buf[NRS_QUOTE_MAX + 8], const char *s, size_t len);

/* ---- suggestions (suggest.c) --------------------------------------------- */

/* Optimal-string-alignment (Damerau) distance, case-insensitive, capped at cap+1. */
size_t nrs_edit_distance(const char *a, size_t alen, const char *b, size_t blen, size_t cap);

/* The closest of names[0..n) (NULL entries skipped) to s, or NULL if none is close. */
const char *nrs_suggest(const char *s, size_t len, const char *const *names, size_t n);

/* ---- YAML tree (yaml_tree.c) --------------------------------------------- */

typedef enum { NRS_YN_SCALAR, NRS_YN_MAP, NRS_YN_SEQ, NRS_YN_ALIAS } nrs_yn_kind_t;

typedef struct {
    nrs_yn_kind_t kind;
    bool plain;        /* scalar written without quotes (type resolution applies) */
    nrs_mark_t mark;   /* start of the node */
    char *text;        /* scalar: NUL-terminated copy (may hold inner NULs) */
    size_t len;        /* scalar: length of text */
    int first, last;   /* collection: children (maps: key, value, key, value...) */
    int next;          /* next sibling */
    int count;         /* collection: number of children */
    int target;        /* alias: anchored node */
} nrs_ynode_t;

typedef struct {
    nrs_ynode_t *v;
    int n, cap;
    int root; /* -1 when the stream holds no document */
    char *anchor[NRS_SPEC_MAX_ANCHORS];
    int anchor_node[NRS_SPEC_MAX_ANCHORS];
    int nanchors;
    int naliases;
} nrs_ytree_t;

/* Parse one YAML document of buf into t (bounded: depth, nodes, anchors,
 * aliases, no tags, one document). 0 or -1 with the error in d. Always call
 * nrs_ytree_free afterwards. */
int nrs_ytree_parse(nrs_ytree_t *t, const char *buf, size_t len, nrs_diag_t *d);
void nrs_ytree_free(nrs_ytree_t *t);

/* YAML 1.2 core-schema resolution of a node (quoted scalars are strings). */
typedef enum {
    NRS_YT_NULL, NRS_YT_BOOL, NRS_YT_INT, NRS_YT_NUM, NRS_YT_STR, NRS_YT_MAP, NRS_YT_SEQ
} nrs_ytype_t;
nrs_ytype_t nrs_ynode_type(const nrs_ynode_t *n);

/* "a mapping", "a sequence", "null", "a boolean", "an integer", "a number", "a string". */
const char *nrs_ynode_what(const nrs_ynode_t *n);

/* ---- table-driven walker (walk.c) ---------------------------------------- */

typedef struct nrs_sctx nrs_sctx_t;
typedef struct nrs_field nrs_field_t;

typedef struct {
    const char *name;
    int value;
} nrs_enum_t;

typedef enum { NRS_F_INT, NRS_F_DBL, NRS_F_BOOL, NRS_F_STR, NRS_F_ENUM, NRS_F_FN } nrs_ftype_t;

enum {
    NRS_REQUIRED = 1u << 0,
    NRS_LO_OPEN = 1u << 1, /* value must be > lo (else >= lo) */
    NRS_HI_OPEN = 1u << 2  /* value must be < hi (else <= hi) */
};

/* Custom value handler: key and val are resolved node indexes. */
typedef int (*nrs_field_fn)(nrs_sctx_t *c, const char *path, int key, int val, void *dst,
                            const nrs_field_t *f);

struct nrs_field {
    const char *name;
    nrs_ftype_t type;
    size_t off; /* into the struct being filled */
    unsigned flags;
    double lo, hi;
    const nrs_enum_t *enums; /* NRS_F_ENUM: {NULL, 0}-terminated */
    nrs_field_fn fn;         /* NRS_F_FN */
    int aux;                 /* free for fn */
};

enum { NRS_MAX_FIELDS = 16 };

/* What a mapping walk saw: which fields, and where (for later cross-checks). */
typedef struct {
    uint32_t bits;
    nrs_mark_t map;
    nrs_mark_t key[NRS_MAX_FIELDS];
    nrs_mark_t val[NRS_MAX_FIELDS];
} nrs_seen_t;

static inline bool nrs_seen(const nrs_seen_t *s, int field)
{
    return (s->bits >> field) & 1u;
}

/* Loader state, shared by the walker and the section handlers. */
struct nrs_sctx {
    nrs_diag_t d;
    nrs_ytree_t t;
    int expansions; /* alias dereferences so far */
    int role;       /* model being walked */
    nrs_seen_t root, cluster, models, algorithm, workload, policy, runtime;
    nrs_seen_t model[NRS_ROLE_COUNT];
    nrs_seen_t layout[NRS_ROLE_COUNT];
    nrs_seen_t tp_pp[NRS_ROLE_COUNT][3]; /* by NRS_STAGE_* */
};

/* Follow an alias (counted against NRS_SPEC_MAX_ALIASES); -1 on error. */
int nrs_deref(nrs_sctx_t *c, int idx);

static inline const nrs_ynode_t *nrs_node(const nrs_sctx_t *c, int idx)
{
    return &c->t.v[idx];
}

/* Walk mapping node `node` against fields[0..n): unknown keys (with suggestion),
 * duplicate keys, wrong types, ranges, missing required keys. */
int nrs_walk_map(nrs_sctx_t *c, int node, const char *path, const nrs_field_t *fields,
                 size_t n, void *base, nrs_seen_t *seen);

/* Type errors shared with handlers: "PATH: expected WANT, got WHAT 'text'". */
int nrs_type_error(nrs_sctx_t *c, const char *path, int node, const char *want);

/* Enum scalar (case-insensitive) into *dst; unknown names get a suggestion. */
int nrs_get_enum(nrs_sctx_t *c, const char *path, int node, const nrs_enum_t *enums, int *dst);

/* Scalar of a string field into dst[cap]; checks type, NULs and length. */
int nrs_get_string(nrs_sctx_t *c, const char *path, int node, char *dst, size_t cap);

/* ---- presets (presets.c) ------------------------------------------------- */

/* Canonical spelling of a preset name ("Meta-Llama-3-8B-Instruct" -> "llama38b"). */
enum { NRS_MAX_PRESETS = 32 };
void nrs_preset_normalize(const char *name, size_t len, char *out, size_t cap);

#endif
