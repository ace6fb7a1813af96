/* PMIx rendezvous (rdv.h, docs/protocol-dataplane.md §1). */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <pmix.h>

#include "util/util.h"
#include "rdv/rdv.h"

/* A PMIx callback lands in PMIx's progress thread; we poll its flag. The
 * tracker lives until nrs_rdv_fini, so a callback that fires after we gave
 * up waiting still writes to valid memory. */
typedef struct rdv_trk {
    struct rdv_trk *next;
    atomic_int done;
    pmix_status_t status;
    pmix_value_t *val; /* Get_nb result, ours to release */
    /* what a Get_nb reads after it returned (PMIx 4.2 thread-shifts the
     * request): valid until the callback fired */
    char key[NRS_RDV_KEY_MAX];
    pmix_info_t info[1];
    bool has_info;
    bool spare; /* the handle's spare (nrs_rdv.spare): back to it, not freed */
} rdv_trk_t;

typedef struct {
    char key[NRS_RDV_KEY_MAX];
    void *blob;
    size_t len;
} rdv_local_t;

struct nrs_rdv {
    pmix_proc_t me;
    int size;
    bool singleton;
    bool broken; /* a fence timed out: PMIx may still hold it, no more fences */
    nrs_rdv_progress_fn progress;
    void *progress_arg;
    rdv_trk_t *trks;
    size_t evhdlr_id;
    bool evhdlr_ok;
    atomic_uchar *failed; /* [size] set by the event handler */
    unsigned char *absent; /* [size] dead, and missing from a gather (so from every later one) */
    atomic_int nfailed;
    rdv_local_t *local;   /* singleton store */
    size_t nlocal;
    /* What a gather's contribution (put, commit, fence) needs besides PMIx
     * itself, had with the handle: a rank that could not contribute for
     * want of memory paired its next fence with the others' gather (PMIx
     * fences match by participants). */
    int *part;            /* [size + 1] the participants */
    pmix_proc_t *procs;   /* [size + 1] the fence's process list */
    rdv_trk_t *spare;     /* a tracker when none can be had; NULL while in use */
    unsigned nposts;      /* gather posts so far (test hook NRS_RDV_NOMEM) */
};

static void poll_once(nrs_rdv_t *r)
{
    int did = r->progress ? r->progress(r->progress_arg) : 0;
    if (did <= 0)
        nrs_nap_us(50);
}

/* A tracker; without memory (nomem: the test hook says so) the spare. */
static rdv_trk_t *trk_new(nrs_rdv_t *r, bool nomem)
{
    rdv_trk_t *t = nomem ? NULL : calloc(1, sizeof(*t));
    if (!t && r->spare) {
        t = r->spare;
        r->spare = NULL;
        memset(t, 0, sizeof(*t));
        t->spare = true;
    }
    if (!t)
        return NULL;
    atomic_init(&t->done, 0);
    t->next = r->trks;
    r->trks = t;
    return t;
}

/* Release a tracker whose callback has fired; one still in flight stays. */
static void trk_drop(nrs_rdv_t *r, rdv_trk_t *t)
{
    if (!atomic_load(&t->done))
        return;
    for (rdv_trk_t **p = &r->trks; *p; p = &(*p)->next)
        if (*p == t) {
            *p = t->next;
            break;
        }
    if (t->val)
        PMIX_VALUE_RELEASE(t->val);
    if (t->has_info)
        PMIX_INFO_DESTRUCT(&t->info[0]);
    if (t->spare)
        r->spare = t;
    else
        free(t);
}

static void op_cb(pmix_status_t st, void *cbdata)
{
    rdv_trk_t *t = cbdata;
    t->status = st;
    atomic_store(&t->done, 1);
}

/* Get_nb answers so far, in this process: a wait on many gets is bounded by
 * the time without any answer, not by their number. */
static atomic_uint answers;

static void value_cb(pmix_status_t st, pmix_value_t *kv, void *cbdata)
{
    rdv_trk_t *t = cbdata;
    atomic_fetch_add(&answers, 1);
    t->status = st;
    /* PMIx 4.2 hands the value over ("protect the value" in
     * pmix_client_get.c): it is ours to release. */
    if (kv && st == PMIX_SUCCESS)
        t->val = kv;
    else if (kv)
        PMIX_VALUE_RELEASE(kv);
    atomic_store(&t->done, 1);
}

/* ---- failures reported by the resource manager -------------------------------- */

/* PMIx event handlers carry no user pointer: one context per process. */
static nrs_rdv_t *ev_ctx;

static void ev_handler(size_t id, pmix_status_t status, const pmix_proc_t *source,
                       pmix_info_t info[], size_t ninfo, pmix_info_t *results, size_t nresults,
                       pmix_event_notification_cbfunc_fn_t cbfunc, void *cbdata)
{
    nrs_rdv_t *r = ev_ctx;
    (void)id, (void)results, (void)nresults, (void)source;
    for (size_t i = 0; r && i < ninfo; i++) {
        if (strcmp(info[i].key, PMIX_EVENT_AFFECTED_PROC) || info[i].value.type != PMIX_PROC)
            continue;
        const pmix_proc_t *p = info[i].value.data.proc;
        if (PMIX_CHECK_NSPACE(p->nspace, r->me.nspace) && p->rank < (pmix_rank_t)r->size &&
            !atomic_exchange(&r->failed[p->rank], 1)) {
            atomic_fetch_add(&r->nfailed, 1);
            fprintf(stderr, "nereus: rdv: rank %u reported failed by the resource manager (%s)\n",
                    p->rank, PMIx_Error_string(status));
        }
    }
    if (cbfunc)
        cbfunc(PMIX_EVENT_ACTION_COMPLETE, NULL, 0, NULL, NULL, cbdata);
}

static void reg_cb(pmix_status_t st, size_t refid, void *cbdata)
{
    nrs_rdv_t *r = ev_ctx;
    rdv_trk_t *t = cbdata;
    if (st == PMIX_SUCCESS && r)
        r->evhdlr_id = refid;
    t->status = st;
    atomic_store(&t->done, 1);
}

static void register_failures(nrs_rdv_t *r)
{
    /* static: PMIx 4.2 reads them in its own thread, perhaps after we gave up */
    static pmix_status_t codes[] = {PMIX_ERR_PROC_ABORTED, PMIX_ERR_PROC_ABORTED_BY_SIG,
                                    PMIX_PROC_TERMINATED, PMIX_ERR_PROC_TERM_WO_SYNC};
    rdv_trk_t *t = trk_new(r, false);
    if (!t)
        return;
    ev_ctx = r;
    pmix_status_t st = PMIx_Register_event_handler(codes, sizeof codes / sizeof codes[0], NULL, 0,
                                                   ev_handler, reg_cb, t);
    double end = nrs_awake_s() + 5.0;
    if (st == PMIX_SUCCESS)
        while (!atomic_load(&t->done) && nrs_awake_s() < end)
            nrs_nap_us(50);
    r->evhdlr_ok = st == PMIX_SUCCESS && atomic_load(&t->done) && t->status == PMIX_SUCCESS;
    trk_drop(r, t);
}

/* ---- init ------------------------------------------------------------------------- */

static int job_size(nrs_rdv_t *r)
{
    pmix_proc_t wild;
    pmix_value_t *v = NULL;
    int n = -1;
    PMIX_LOAD_PROCID(&wild, r->me.nspace, PMIX_RANK_WILDCARD);
    if (PMIx_Get(&wild, PMIX_JOB_SIZE, NULL, 0, &v) == PMIX_SUCCESS && v) {
        if (v->type == PMIX_UINT32)
            n = (int)v->data.uint32;
        PMIX_VALUE_RELEASE(v);
    }
    return n;
}

int nrs_rdv_init(nrs_rdv_t **out, char *err, size_t errlen)
{
    nrs_rdv_t *r = calloc(1, sizeof(*r));
    if (!r) {
        nrs_seterr(err, errlen, "rdv: out of memory");
        return -1;
    }
    pmix_status_t st = PMIx_Init(&r->me, NULL, 0);
    if (st == PMIX_ERR_UNREACH) {
        r->singleton = true;
    } else if (st != PMIX_SUCCESS) {
        nrs_seterr(err, errlen, "rdv: PMIx_Init: %s", PMIx_Error_string(st));
        free(r);
        return -1;
    }
    r->size = r->singleton ? 1 : job_size(r);
    if (r->size < 1) { /* a PMIx library running without a server of ours */
        r->singleton = true;
        r->size = 1;
    }
    if (r->singleton)
        r->me.rank = 0;
    r->failed = calloc((size_t)r->size, sizeof(*r->failed));
    r->absent = calloc((size_t)r->size, 1);
    r->part = calloc((size_t)r->size + 1, sizeof(*r->part));
    r->procs = calloc((size_t)r->size + 1, sizeof(*r->procs));
    r->spare = calloc(1, sizeof(*r->spare));
    if (!r->failed || !r->absent || !r->part || !r->procs || !r->spare) {
        free(r->failed);
        free(r->absent);
        free(r->part);
        free(r->procs);
        free(r->spare);
        nrs_seterr(err, errlen, "rdv: out of memory");
        PMIx_Finalize(NULL, 0);
        free(r);
        return -1;
    }
    if (!r->singleton)
        register_failures(r);
    *out = r;
    return 0;
}

void nrs_rdv_fini(nrs_rdv_t *r)
{
    if (!r)
        return;
    if (r->evhdlr_ok)
        PMIx_Deregister_event_handler(r->evhdlr_id, NULL, NULL);
    PMIx_Finalize(NULL, 0);
    if (ev_ctx == r)
        ev_ctx = NULL;
    while (r->trks) {
        rdv_trk_t *t = r->trks;
        r->trks = t->next;
        if (t->val)
            PMIX_VALUE_RELEASE(t->val);
        if (t->has_info)
            PMIX_INFO_DESTRUCT(&t->info[0]);
        free(t);
    }
    for (size_t i = 0; i < r->nlocal; i++)
        free(r->local[i].blob);
    free(r->local);
    free(r->failed);
    free(r->absent);
    free(r->part);
    free(r->procs);
    free(r->spare);
    free(r);
}

int nrs_rdv_rank(const nrs_rdv_t *r) { return (int)r->me.rank; }
int nrs_rdv_size(const nrs_rdv_t *r) { return r->size; }
bool nrs_rdv_is_singleton(const nrs_rdv_t *r) { return r->singleton; }
const char *nrs_rdv_nspace(const nrs_rdv_t *r) { return r->me.nspace; }

void nrs_rdv_set_progress(nrs_rdv_t *r, nrs_rdv_progress_fn fn, void *arg)
{
    r->progress = fn;
    r->progress_arg = arg;
}

bool nrs_rdv_peer_failed(const nrs_rdv_t *r, int rank)
{
    return rank >= 0 && rank < r->size && atomic_load(&r->failed[rank]);
}

int nrs_rdv_first_failed(const nrs_rdv_t *r)
{
    if (!atomic_load(&r->nfailed))
        return -1;
    for (int i = 0; i < r->size; i++)
        if (atomic_load(&r->failed[i]))
            return i;
    return -1;
}

int nrs_rdv_key(char *buf, size_t len, uint64_t epoch, const char *name)
{
    int n = snprintf(buf, len, "nrs.e%llu.%s", (unsigned long long)epoch, name);
    return n < 0 || (size_t)n >= len || (size_t)n >= PMIX_MAX_KEYLEN ? -1 : 0;
}

/* ---- put / commit ------------------------------------------------------------------ */

static int local_put(nrs_rdv_t *r, const char *key, const void *blob, size_t len)
{
    void *copy = malloc(len ? len : 1);
    rdv_local_t *v = realloc(r->local, (r->nlocal + 1) * sizeof(*v));
    if (!copy || !v) {
        free(copy);
        if (v)
            r->local = v;
        return -1;
    }
    r->local = v;
    memcpy(copy, blob, len);
    v = &r->local[r->nlocal++];
    snprintf(v->key, sizeof v->key, "%s", key);
    v->blob = copy;
    v->len = len;
    return 0;
}

int nrs_rdv_put(nrs_rdv_t *r, uint64_t epoch, const char *name, const void *blob, size_t len,
                char *err, size_t errlen)
{
    char key[NRS_RDV_KEY_MAX];
    if (nrs_rdv_key(key, sizeof key, epoch, name)) {
        nrs_seterr(err, errlen, "rdv: key for '%s' too long", name);
        return -1;
    }
    if (r->singleton) {
        if (local_put(r, key, blob, len)) {
            nrs_seterr(err, errlen, "rdv: out of memory");
            return -1;
        }
        return 0;
    }
    pmix_value_t v;
    pmix_byte_object_t bo = {.bytes = (char *)blob, .size = len};
    PMIX_VALUE_LOAD(&v, &bo, PMIX_BYTE_OBJECT); /* copies */
    pmix_status_t st = PMIx_Put(PMIX_GLOBAL, key, &v);
    PMIX_VALUE_DESTRUCT(&v);
    if (st != PMIX_SUCCESS) {
        nrs_seterr(err, errlen, "rdv: PMIx_Put(%s): %s", key, PMIx_Error_string(st));
        return -1;
    }
    return 0;
}

int nrs_rdv_commit(nrs_rdv_t *r, char *err, size_t errlen)
{
    if (r->singleton)
        return 0;
    pmix_status_t st = PMIx_Commit();
    if (st != PMIX_SUCCESS) {
        nrs_seterr(err, errlen, "rdv: PMIx_Commit: %s", PMIx_Error_string(st));
        return -1;
    }
    return 0;
}

/* ---- fence -------------------------------------------------------------------------- */

static int first_failed_in(const nrs_rdv_t *r, const int *ranks, int nranks)
{
    if (!ranks)
        return nrs_rdv_first_failed(r);
    for (int i = 0; i < nranks; i++)
        if (nrs_rdv_peer_failed(r, ranks[i]))
            return ranks[i];
    return -1;
}

/* -------------------------------------------------------------------------- */

/* Append "a, b, c-d" style rank lists to buf. */
static void list_ranks(char *buf, size_t len, const unsigned char *mark, int n, int *count)
{
    size_t l = strlen(buf);
    int shown = 0;
    *count = 0;
    for (int i = 0; i < n; i++) {
        if (!mark[i])
            continue;
        (*count)++;
        if (shown < 16 && l < len) {
            l += (size_t)snprintf(buf + l, len - l, "%s%d", shown ? ", " : "", i);
            shown++;
        }
    }
    if (*count > shown && l < len)
        snprintf(buf + l, len - l, ", ... (%d in all)", *count);
}

static rdv_trk_t *get_post(nrs_rdv_t *r, int rank, const char *key, double timeout_s,
                           char *err, size_t errlen);

/* Which participants (ranks[nranks], NULL: all) never published (epoch,
 * name): ask every peer at once, bounded. */
static void find_missing(nrs_rdv_t *r, const int *ranks, int nranks, const char *key,
                         double timeout_s, unsigned char *missing)
{
    rdv_trk_t **t = calloc((size_t)r->size, sizeof(*t));
    unsigned char *in = calloc((size_t)r->size, 1);
    char e[128];
    if (!t || !in) {
        free(t);
        free(in);
        return;
    }
    for (int i = 0; i < (ranks ? nranks : r->size); i++)
        if (!ranks || (ranks[i] >= 0 && ranks[i] < r->size))
            in[ranks ? ranks[i] : i] = 1;
    for (int i = 0; i < r->size; i++)
        if (in[i] && i != (int)r->me.rank && !(t[i] = get_post(r, i, key, timeout_s, e, sizeof e)))
            missing[i] = 1;
    double end = nrs_awake_s() + timeout_s + 0.5;
    for (int i = 0; i < r->size; i++) {
        if (!t[i])
            continue;
        while (!atomic_load(&t[i]->done) && nrs_awake_s() < end)
            poll_once(r);
        missing[i] = !atomic_load(&t[i]->done) || t[i]->status != PMIX_SUCCESS;
        trk_drop(r, t[i]);
    }
    free(t);
    free(in);
}

/* survivors: do not give up on a rank known dead, and take the server's
 * PMIX_ERR_PARTIAL_SUCCESS (a participant went away) as done. */
static int fence(nrs_rdv_t *r, const int *ranks, int nranks, bool survivors, bool nomem,
                 uint64_t epoch, const char *name, double timeout_s, char *err, size_t errlen)
{
    if (r->singleton)
        return 0;
    if (r->broken) {
        nrs_seterr(err, errlen, "rdv: an earlier fence failed; rendezvous is unusable");
        return -1;
    }
    /* Every rank, listed one by one, is the whole job: say so with the
     * wildcard. Slurm 22.05's PMIx plugin mishandles explicit rank lists
     * ("unexpected contrib", "no process controlled by this slurmstepd"). */
    if (ranks && nranks == r->size) {
        bool all = true;
        for (int i = 0; i < nranks && all; i++)
            all = ranks[i] == i;
        if (all)
            ranks = NULL;
    }
    pmix_proc_t *procs = r->procs; /* PMIx copies it */
    pmix_info_t info[1];
    bool collect = true;
    rdv_trk_t *t = trk_new(r, nomem);
    if (!t) {
        nrs_seterr(err, errlen, "rdv: out of memory");
        return -1;
    }
    if (ranks)
        for (int i = 0; i < nranks; i++)
            PMIX_LOAD_PROCID(&procs[i], r->me.nspace, (pmix_rank_t)ranks[i]);
    else
        PMIX_LOAD_PROCID(&procs[0], r->me.nspace, PMIX_RANK_WILDCARD);
    PMIX_INFO_LOAD(&info[0], PMIX_COLLECT_DATA, &collect, PMIX_BOOL);
    pmix_status_t st = PMIx_Fence_nb(procs, ranks ? (size_t)nranks : 1, info, 1, op_cb, t);
    PMIX_INFO_DESTRUCT(&info[0]);
    if (st == PMIX_OPERATION_SUCCEEDED) {
        t->status = PMIX_SUCCESS;
        atomic_store(&t->done, 1);
    } else if (st != PMIX_SUCCESS) {
        atomic_store(&t->done, 1);
        trk_drop(r, t);
        nrs_seterr(err, errlen, "rdv: PMIx_Fence_nb: %s", PMIx_Error_string(st));
        return -1;
    }
    double start = nrs_awake_s(), end = start + timeout_s;
    int dead = -1;
    while (!atomic_load(&t->done) && nrs_awake_s() < end &&
           (survivors || (dead = first_failed_in(r, ranks, nranks)) < 0))
        poll_once(r);
    if (atomic_load(&t->done)) {
        st = t->status;
        trk_drop(r, t);
        if (survivors && st == PMIX_ERR_PARTIAL_SUCCESS)
            return 0;
        if (st != PMIX_SUCCESS) {
            if (name)
                nrs_seterr(err, errlen, "rdv: %s of epoch %llu: %s",
                           survivors ? "survivors' fence" : "fence", (unsigned long long)epoch,
                           PMIx_Error_string(st));
            else
                nrs_seterr(err, errlen, "rdv: %s: %s", survivors ? "survivors' fence" : "fence",
                           PMIx_Error_string(st));
            return -1;
        }
        return 0;
    }
    r->broken = true;
    if (dead >= 0) {
        nrs_seterr(err, errlen, "rdv: fence of epoch %llu abandoned: rank %d died (reported by the "
               "resource manager)", (unsigned long long)epoch, dead);
        return -1;
    }
    const char *what = survivors ? "survivors' fence" : "fence";
    if (!name) { /* no key to ask for: who is missing is unknown */
        nrs_seterr(err, errlen, "rdv: %s timed out after %.1f s", what, timeout_s);
        return -1;
    }
    char key[NRS_RDV_KEY_MAX];
    unsigned char *missing = calloc((size_t)r->size, 1);
    int count = 0;
    if (missing && !nrs_rdv_key(key, sizeof key, epoch, name)) {
        find_missing(r, ranks, nranks, key, 1.0, missing);
        char list[256] = "";
        list_ranks(list, sizeof list, missing, r->size, &count);
        if (count) {
            nrs_seterr(err, errlen, "rdv: %s of epoch %llu timed out after %.1f s: rank%s %s "
                   "never arrived (no '%s')", what, (unsigned long long)epoch, timeout_s,
                   count > 1 ? "s" : "", list, key);
            free(missing);
            return -1;
        }
        free(missing);
        nrs_seterr(err, errlen, "rdv: %s of epoch %llu timed out after %.1f s (every rank "
                   "published '%s': the resource manager's collective is stuck)", what,
                   (unsigned long long)epoch, timeout_s, key);
        return -1;
    }
    free(missing);
    nrs_seterr(err, errlen, "rdv: %s of epoch %llu timed out after %.1f s", what,
               (unsigned long long)epoch, timeout_s);
    return -1;
}

int nrs_rdv_fence(nrs_rdv_t *r, uint64_t epoch, const char *name, double timeout_s, char *err,
                  size_t errlen)
{
    return fence(r, NULL, 0, false, false, epoch, name, timeout_s, err, errlen);
}

int nrs_rdv_fence_survivors(nrs_rdv_t *r, const int *ranks, int nranks, double timeout_s,
                            char *err, size_t errlen)
{
    return fence(r, ranks, ranks ? nranks : 0, true, false, 0, NULL, timeout_s, err, errlen);
}

/* ---- get ---------------------------------------------------------------------------- */

static int local_get(nrs_rdv_t *r, const char *key, void **blob, size_t *len)
{
    for (size_t i = 0; i < r->nlocal; i++)
        if (!strcmp(r->local[i].key, key)) {
            *blob = malloc(r->local[i].len ? r->local[i].len : 1);
            if (!*blob)
                return -1;
            memcpy(*blob, r->local[i].blob, r->local[i].len);
            *len = r->local[i].len;
            return 0;
        }
    return -1;
}

/* A get in two halves, so that many can be in flight at once: get_post asks
 * PMIx for rank's (epoch, name) (locally first, then its server, bounded by
 * timeout_s), get_take hands over what came. */
static rdv_trk_t *get_post(nrs_rdv_t *r, int rank, const char *key, double timeout_s,
                           char *err, size_t errlen)
{
    pmix_proc_t p;
    int tmo = timeout_s < 1 ? 1 : (int)(timeout_s + 0.999);
    rdv_trk_t *t = trk_new(r, false);
    if (!t) {
        nrs_seterr(err, errlen, "rdv: out of memory");
        return NULL;
    }
    PMIX_LOAD_PROCID(&p, r->me.nspace, (pmix_rank_t)rank);
    snprintf(t->key, sizeof t->key, "%s", key);
    PMIX_INFO_LOAD(&t->info[0], PMIX_TIMEOUT, &tmo, PMIX_INT);
    t->has_info = true;
    pmix_status_t st = PMIx_Get_nb(&p, t->key, t->info, 1, value_cb, t);
    if (st != PMIX_SUCCESS) {
        atomic_store(&t->done, 1);
        trk_drop(r, t);
        nrs_seterr(err, errlen, "rdv: PMIx_Get_nb(rank %d, %s): %s", rank, key,
                   PMIx_Error_string(st));
        return NULL;
    }
    return t;
}

/* 0 with *blob (malloc'd) and *len, or -1 saying why; t is released (or
 * left to nrs_rdv_fini while PMIx still holds it). */
static int get_take(nrs_rdv_t *r, rdv_trk_t *t, int rank, const char *key, void **blob,
                    size_t *len, char *err, size_t errlen)
{
    if (!atomic_load(&t->done)) {
        trk_drop(r, t); /* stays until fini: PMIx still holds it */
        nrs_seterr(err, errlen, "rdv: rank %d's '%s' %s", rank, key,
                   nrs_rdv_peer_failed(r, rank) ? "unavailable: the rank died" : "timed out");
        return -1;
    }
    int rc = -1;
    if (t->status != PMIX_SUCCESS)
        nrs_seterr(err, errlen, "rdv: rank %d never published '%s': %s", rank, key,
                   PMIx_Error_string(t->status));
    else if (!t->val || t->val->type != PMIX_BYTE_OBJECT)
        nrs_seterr(err, errlen, "rdv: rank %d's '%s' is not a byte object", rank, key);
    else if (!(*blob = malloc(t->val->data.bo.size ? t->val->data.bo.size : 1)))
        nrs_seterr(err, errlen, "rdv: out of memory");
    else {
        memcpy(*blob, t->val->data.bo.bytes, t->val->data.bo.size);
        *len = t->val->data.bo.size;
        rc = 0;
    }
    trk_drop(r, t);
    return rc;
}

/* One get; the wait also ends when the rank is reported dead, after up to
 * 1.5 s more for what PMIx already holds of it (it published and fenced
 * before it died: a rank told of the death between the fence and its gets
 * must read it as the others do). */
int nrs_rdv_get(nrs_rdv_t *r, int rank, uint64_t epoch, const char *name, void **blob,
                size_t *len, double timeout_s, char *err, size_t errlen)
{
    char key[NRS_RDV_KEY_MAX];
    if (nrs_rdv_key(key, sizeof key, epoch, name) || rank < 0 || rank >= r->size) {
        nrs_seterr(err, errlen, "rdv: bad get (rank %d of %d, '%s')", rank, r->size, name);
        return -1;
    }
    if (r->singleton) {
        if (local_get(r, key, blob, len)) {
            nrs_seterr(err, errlen, "rdv: '%s' was never put", key);
            return -1;
        }
        return 0;
    }
    rdv_trk_t *t = get_post(r, rank, key, timeout_s, err, errlen);
    if (!t)
        return -1;
    double end = nrs_awake_s() + timeout_s + 0.5, grace = 0;
    while (!atomic_load(&t->done) && nrs_awake_s() < end) {
        if (nrs_rdv_peer_failed(r, rank)) {
            if (!grace)
                grace = nrs_awake_s() + 1.5;
            else if (nrs_awake_s() > grace)
                break;
        }
        poll_once(r);
    }
    return get_take(r, t, rank, key, blob, len, err, errlen);
}

void nrs_rdv_free_blobs(nrs_rdv_t *r, void **blobs, size_t *lens)
{
    for (int i = 0; blobs && i < r->size; i++)
        free(blobs[i]);
    free(blobs);
    free(lens);
}

int nrs_rdv_allgather(nrs_rdv_t *r, uint64_t epoch, const char *name, const void *blob,
                      size_t len, void ***blobs, size_t **lens, double timeout_s, char *err,
                      size_t errlen)
{
    void **b = calloc((size_t)r->size, sizeof(*b));
    size_t *l = calloc((size_t)r->size, sizeof(*l));
    double end = nrs_awake_s() + timeout_s;
    if (!b || !l) {
        free(b);
        free(l);
        nrs_seterr(err, errlen, "rdv: out of memory");
        return -1;
    }
    if (nrs_rdv_put(r, epoch, name, blob, len, err, errlen) || nrs_rdv_commit(r, err, errlen) ||
        nrs_rdv_fence(r, epoch, name, timeout_s, err, errlen))
        goto fail;
    for (int i = 0; i < r->size; i++) {
        if (i == (int)r->me.rank) {
            if (!(b[i] = malloc(len ? len : 1))) {
                nrs_seterr(err, errlen, "rdv: out of memory");
                goto fail;
            }
            memcpy(b[i], blob, len);
            l[i] = len;
            continue;
        }
        double left = end - nrs_awake_s();
        if (nrs_rdv_get(r, i, epoch, name, &b[i], &l[i], left > 1 ? left : 1, err, errlen))
            goto fail;
    }
    *blobs = b;
    *lens = l;
    return 0;
fail:
    nrs_rdv_free_blobs(r, b, l);
    return -1;
}

/* ---- a fixed-size all-gather over the survivors ------------------------------------ */

/* The participants: every rank not in out. The ranks known dead stay in the
 * list: when each rank learns of a death is its own affair, and ranks whose
 * lists differ would wait for each other's fences for ever. The server
 * completes it without the dead. */
static int participants(const nrs_rdv_t *r, const int *out, int nout, int *part)
{
    int n = r->size, np = 0;
    for (int i = 0; i < n; i++) {
        bool skip = false;
        for (int k = 0; k < nout && !skip; k++)
            skip = out[k] == i;
        if (!skip)
            part[np++] = i;
    }
    return np;
}

/* NRS_RDV_NOMEM=RANK:N: rank RANK's Nth gather post (from 0) can have no
 * memory of its own (a tracker: the handle's spare): the tests' check that
 * it still contributes. */
static bool nomem_hook(nrs_rdv_t *r)
{
    const char *k = getenv("NRS_RDV_NOMEM");
    char *end;
    unsigned n = r->nposts++;
    return k && strtol(k, &end, 10) == (long)r->me.rank && *end == ':' &&
           strtoul(end + 1, NULL, 10) == n;
}

int nrs_rdv_gather_post(nrs_rdv_t *r, uint64_t key, const char *name, const void *mine,
                        size_t len, const int *out, int nout, double timeout_s, char *err,
                        size_t errlen)
{
    bool nomem = nomem_hook(r);
    int np = participants(r, out, nout, r->part);
    /* every rank of the job: the wildcard fence; a time-out names who never
     * published (key, name) */
    if (nrs_rdv_put(r, key, name, mine, len, err, errlen) || nrs_rdv_commit(r, err, errlen) ||
        fence(r, nout ? r->part : NULL, nout ? np : 0, true, nomem, key, name, timeout_s, err,
              errlen))
        return -1;
    return 0;
}

/* Rank i's bytes from t into all and got[] (len of them, else not got); a
 * rank known dead whose bytes did not come is absent from now on. */
static void take_part(nrs_rdv_t *r, rdv_trk_t *t, int i, const char *k, size_t len, void *all,
                      unsigned char *got)
{
    void *b = NULL;
    size_t bl = 0;
    char e[128];
    if (!get_take(r, t, i, k, &b, &bl, e, sizeof e) && bl == len) {
        memcpy((char *)all + (size_t)i * len, b, len);
        got[i] = 1;
    } else if (nrs_rdv_peer_failed(r, i)) {
        r->absent[i] = 1;
    }
    free(b);
}

/* What PMIx holds decides got[], never what this rank alone knows of deaths,
 * so that the votes and the census of runtime/worker/dtrans.c come out the
 * same on every rank. Every participant's blob is asked for, also from a
 * rank known dead: a PMIx_Get looks locally first (what the fence's
 * PMIX_COLLECT_DATA brought), then asks the server, which keeps what a rank
 * committed after it died (a local peer's bytes stay with the server under
 * PMIx's hash store). A rank that voted and died since is counted on every
 * rank (its death fails what comes next, on every rank); one that died
 * before its commit is missing on every rank.
 *
 * The ranks not known dead are asked one after another, each bounded by
 * 1.5 s: PMIx 4.2's client talks to its server over TCP, and a second
 * request sent before the first is answered waited ~40 ms (8 ranks: 42 ms
 * for 7 gets at once, 4 ms one after another). Those known dead are asked
 * all at once after them, as some may never answer: the wait ends 1.5 s
 * after PMIx's last answer (PMIx's own time-out, 1 s and 1 s more per 100
 * of them, allows for many queued at a server). A rank known dead and found
 * missing is not asked again (it cannot be in a later gather either), so
 * only the first gather after a death pays that wait. */
int nrs_rdv_gather_read(nrs_rdv_t *r, uint64_t key, const char *name, const void *mine,
                        size_t len, const int *out, int nout, void *all, unsigned char *got,
                        char *err, size_t errlen)
{
    int n = r->size, *part = calloc((size_t)n + 1, sizeof(int));
    int *dead = calloc((size_t)n + 1, sizeof(int));
    rdv_trk_t **t = calloc((size_t)n + 1, sizeof(*t));
    char k[NRS_RDV_KEY_MAX], e[128];
    int rc = -1;
    memset(got, 0, (size_t)n);
    if (!part || !dead || !t) {
        nrs_seterr(err, errlen, "rdv: out of memory");
        goto out;
    }
    if (nrs_rdv_key(k, sizeof k, key, name)) {
        nrs_seterr(err, errlen, "rdv: bad gather name '%s'", name);
        goto out;
    }
    int np = participants(r, out, nout, part), nd = 0;
    for (int j = 0; j < np; j++) { /* ours, then the living, one by one */
        int i = part[j];
        if (i == (int)r->me.rank) {
            memcpy((char *)all + (size_t)i * len, mine, len);
            got[i] = 1;
            continue;
        }
        if (r->singleton || r->absent[i])
            continue;
        if (nrs_rdv_peer_failed(r, i)) {
            dead[nd++] = i; /* asked below */
            continue;
        }
        rdv_trk_t *ti = get_post(r, i, k, 1.0, e, sizeof e);
        double end = nrs_awake_s() + 1.5;
        while (ti && !atomic_load(&ti->done) && nrs_awake_s() < end)
            poll_once(r);
        if (ti)
            take_part(r, ti, i, k, len, all, got);
    }
    double tmo = 1 + nd / 100; /* the dead, all at once */
    for (int j = 0; j < nd; j++)
        t[j] = get_post(r, dead[j], k, tmo, e, sizeof e);
    double now = nrs_awake_s(), last = now, cap = now + tmo + 0.5;
    unsigned seen = atomic_load(&answers);
    for (int j = 0; j < nd; j++) {
        if (!t[j])
            continue;
        while (!atomic_load(&t[j]->done) && (now = nrs_awake_s()) < last + 1.5 && now < cap) {
            poll_once(r);
            unsigned a = atomic_load(&answers);
            if (a != seen) {
                seen = a;
                last = nrs_awake_s();
            }
        }
        take_part(r, t[j], dead[j], k, len, all, got);
    }
    rc = 0;
out:
    free(part);
    free(dead);
    free(t);
    return rc;
}

int nrs_rdv_gather(nrs_rdv_t *r, uint64_t key, const char *name, const void *mine, size_t len,
                   const int *out, int nout, void *all, unsigned char *got, double timeout_s,
                   char *err, size_t errlen)
{
    memset(got, 0, (size_t)r->size);
    if (nrs_rdv_gather_post(r, key, name, mine, len, out, nout, timeout_s, err, errlen))
        return -1;
    return nrs_rdv_gather_read(r, key, name, mine, len, out, nout, all, got, err, errlen);
}
