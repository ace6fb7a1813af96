/* Transitions of CUDA state over NCCL (runtime/xfer/xport_nccl): the
 * participants choose together, per transition, whether the bytes move GPU
 * to GPU or through the host copies over UCX (docs/worker-api.md §4.1). */
#define _GNU_SOURCE
#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/util.h"
#include "worker/worker_int.h"

#ifdef HAVE_NCCL
#include "xfer/nccl.h"
#include "xfer/xport_nccl.h"

struct nrs_wk_nccl {
    nrs_nccl_t *c;
    int *members; /* worker ranks of c, ascending (c's rank i is members[i]) */
    int nmembers;
    int refused;  /* NCCL could not be set up for this job: staging from now on */
    nrs_xport_t x;
};

/* The communicator gone: aborted first (its other members are leaving it too,
 * and a finalize would wait for them), or finalized. */
static void end_comm(struct nrs_wk_nccl *N, int abort)
{
    if (abort)
        nrs_nccl_abort(N->c);
    nrs_nccl_fini(N->c);
    N->c = NULL;
}

static void drop_comm(struct nrs_wk_nccl *N, int abort)
{
    nrs_xport_close(&N->x);
    end_comm(N, abort);
    free(N->members);
    N->members = NULL;
    N->nmembers = 0;
}

void nrs_wk_nccl_free(nrs_worker_t *w)
{
    if (!w->nccl)
        return;
    drop_comm(w->nccl, 0);
    free(w->nccl);
    w->nccl = NULL;
}

static bool is_out(const int *out, int nout, int r)
{
    for (int i = 0; i < nout; i++)
        if (out[i] == r)
            return true;
    return false;
}

/* One int per participant through the step gather; 1 only when every
 * participant's came and is nonzero. */
static int all_yes(nrs_worker_t *w, uint64_t key, const char *name, int32_t mine, const int *out,
                   int nout)
{
    return nrs_wk_coll_i32(w, key, name, mine, out, nout, NRS_WK_ALL);
}

/* The ranks taking part, ascending; how many. */
static int participants(const nrs_worker_t *w, const int *out, int nout, int *part)
{
    int np = 0;
    for (int r = 0; r < w->n; r++)
        if (!is_out(out, nout, r))
            part[np++] = r;
    return np;
}

static int same_members(const struct nrs_wk_nccl *N, const int *part, int np)
{
    return N->c && !nrs_nccl_aborted(N->c) && N->nmembers == np &&
           !memcmp(N->members, part, (size_t)np * sizeof(int));
}

/* Survivors of N's communicator that take part: shrink, when they are all of
 * the participants and some members are gone. 1 done, 0 not applicable, -1 failed. */
static int try_shrink(nrs_worker_t *w, struct nrs_wk_nccl *N, const int *part, int np, char *err,
                      size_t errlen)
{
    if (!N->c || nrs_nccl_aborted(N->c) || np >= N->nmembers)
        return 0;
    int *ex = malloc((size_t)N->nmembers * sizeof(*ex)), nex = 0, j = 0;
    if (!ex)
        return -1;
    for (int i = 0; i < N->nmembers; i++) {
        if (j < np && part[j] == N->members[i])
            j++;
        else
            ex[nex++] = i;
    }
    if (j < np) { /* a participant is not a member: a new communicator */
        free(ex);
        return 0;
    }
    nrs_nccl_t *s = NULL;
    int rc = nrs_nccl_shrink(N->c, ex, nex, &s, w->timeout_s, err, errlen);
    free(ex);
    nrs_nccl_fini(N->c); /* shrunk (or failed): done either way */
    N->c = s;
    return rc ? -1 : s ? 1 : -1;
}

/* A fresh communicator of the participants: the lowest one's unique id
 * through the step gather. 0, or -1. */
static int fresh(nrs_worker_t *w, struct nrs_wk_nccl *N, uint64_t key, const char *tag,
                 const int *out, int nout, int me, int np, char *err, size_t errlen)
{
    unsigned char id[NRS_NCCL_ID_BYTES] = {0};
    unsigned char *all = calloc((size_t)w->n, NRS_NCCL_ID_BYTES), *got = calloc((size_t)w->n, 1);
    char name[64];
    int lead = -1, rc = -1;
    for (int r = 0; r < w->n && lead < 0; r++)
        if (!is_out(out, nout, r))
            lead = r;
    snprintf(name, sizeof name, "nccl.id.%s", tag);
    if (!all || !got || (w->me == lead && nrs_nccl_unique_id(id, err, errlen)) ||
        nrs_wk_coll_gather(w, key, name, id, sizeof id, out, nout, all, got, err, errlen))
        goto out;
    if (!got[lead]) {
        nrs_seterr(err, errlen, "nccl: no unique id from rank %d", lead);
        goto out;
    }
    memcpy(id, all + (size_t)lead * NRS_NCCL_ID_BYTES, sizeof id);
    if (N->c) /* other members: it has no future */
        end_comm(N, 1);
    rc = nrs_nccl_init(&N->c, me, np, w->cuda_dev, id, w->timeout_s, err, errlen);
out:
    free(all);
    free(got);
    return rc;
}

int nrs_wk_nccl_choose(nrs_worker_t *w, const nrs_emu_graph_t *g, uint64_t key,
                       const int *out, int nout)
{
    const char *env = getenv("NRS_WORKER_NCCL");
    struct nrs_wk_nccl *N = w->nccl;
    char err[512] = "", tag[32];
    int *part = malloc((size_t)w->n * sizeof(*part)), np, me = -1;
    if (!part)
        return 0;
    np = participants(w, out, nout, part);
    for (int i = 0; i < np; i++)
        if (part[i] == w->me)
            me = i;
    if (N && same_members(N, part, np)) { /* every participant knows it is still good */
        free(part);
        return 1;
    }
    /* Every rank has the same graph: host buffers in it decide for all. */
    int host_bufs = 0;
    for (size_t i = 0; i < g->nbuf && !host_bufs; i++)
        host_bufs = g->buf[i].b.gpu < 0;
    bool spec_no = w->spec.runtime.transports && !(w->spec.runtime.transports & NRS_XFER_NCCL);
    int able = w->mem_kind == NRS_MEM_CUDA && me >= 0 && !host_bufs && !(N && N->refused) &&
               !(env && !strcmp(env, "0")) && !spec_no;
    if (!N && able && !(N = w->nccl = calloc(1, sizeof(*N))))
        able = 0;
    snprintf(tag, sizeof tag, "%u", w->attempt);
    char name[64];
    snprintf(name, sizeof name, "nccl.ok.%s", tag);
    if (!all_yes(w, key, name, able, out, nout)) {
        if (N && N->c)
            drop_comm(N, 1); /* its members may differ next time: never a stale one */
        free(part);
        return 0;
    }
    nrs_xport_close(&N->x); /* it names the communicator about to go */
    /* a shrink when only some of the members remain; if it fails anywhere
     * (the parent's own error, say), a fresh communicator after all */
    int rc = try_shrink(w, N, part, np, err, sizeof err), ok;
    snprintf(name, sizeof name, "nccl.shrunk.%s", tag); /* every participant votes */
    ok = all_yes(w, key, name, rc == 1, out, nout);
    if (!ok && N->c)
        end_comm(N, 1);
    if (!ok) {
        rc = fresh(w, N, key, tag, out, nout, me, np, err, sizeof err) ? -1 : 1;
        snprintf(name, sizeof name, "nccl.up.%s", tag);
        ok = all_yes(w, key, name, rc == 1, out, nout);
    }
    if (ok) {
        free(N->members);
        N->members = part;
        N->nmembers = np;
        int *cr = malloc((size_t)w->n * sizeof(*cr));
        for (int r = 0; cr && r < w->n; r++)
            cr[r] = -1;
        for (int i = 0; cr && i < np; i++)
            cr[part[i]] = i;
        ok = cr && !nrs_xport_nccl_open(&N->x, N->c, w->cuda_dev, nrs_wk_owner_rank, w, cr, w->n,
                                        w->timeout_s);
        free(cr);
        if (ok) {
            fprintf(stderr, "nereus: worker[%d]: transitions of GPU state over NCCL (%d ranks)\n",
                    w->me, np);
            return 1;
        }
        part = NULL; /* now N->members */
    }
    fprintf(stderr, "nereus: worker[%d]: GPU state stages through host memory: %s\n", w->me,
            rc == 1 ? (ok ? "out of memory" : "NCCL failed on another rank") : err);
    drop_comm(N, 1);
    N->refused = 1;
    free(part);
    return 0;
}

const nrs_xport_t *nrs_wk_nccl_xport(const nrs_worker_t *w)
{
    return &((struct nrs_wk_nccl *)w->nccl)->x;
}

static void nccl_cancel(void *arg) { nrs_xport_nccl_cancel(arg); }
static const char *nccl_error(const nrs_xport_t *x) { return nrs_xport_nccl_error(x); }
static bool ucx_gone(void *arg, int rank) { return nrs_ucx_check_peer(arg, rank); }

void nrs_wk_nccl_opts(nrs_worker_t *w, nrs_dtrans_opts_t *o)
{
    struct nrs_wk_nccl *N = w->nccl;
    o->cancel = nccl_cancel;
    o->cancel_arg = &N->x;
    o->xport_error = nccl_error;
    if (w->u) { /* UCX carries no bytes now: it still watches the peers */
        o->peer_failed = ucx_gone;
        o->peer_arg = w->u;
    }
}

void nrs_wk_nccl_preconnect(nrs_worker_t *w, const nrs_emu_graph_t *g)
{
    struct nrs_wk_nccl *N = w->nccl;
    if (nrs_xport_nccl_preconnect(&N->x, g, w->timeout_s))
        fprintf(stderr, "nereus: worker[%d]: %s\n", w->me, nrs_xport_nccl_error(&N->x));
}

void nrs_wk_nccl_after(nrs_worker_t *w, int outcome)
{
    struct nrs_wk_nccl *N = w->nccl;
    if (!N)
        return;
    if (outcome == NRS_DT_COMMITTED)
        nrs_xport_nccl_release(&N->x);
    else /* every participant drops it alike */
        drop_comm(N, 1);
}

void nrs_wk_nccl_wrap(nrs_xmem_t *m, void *dev, int owner, size_t bytes)
{
    nrs_xport_nccl_wrap(m, dev, owner, bytes);
}

#else /* no NCCL: GPU state, if any, always stages through host memory */

void nrs_wk_nccl_free(nrs_worker_t *w) { (void)w; }
int nrs_wk_nccl_choose(nrs_worker_t *w, const nrs_emu_graph_t *g, uint64_t key, const int *out,
                       int nout)
{
    (void)w, (void)g, (void)key, (void)out, (void)nout;
    return 0;
}
const nrs_xport_t *nrs_wk_nccl_xport(const nrs_worker_t *w)
{
    (void)w;
    return NULL;
}
void nrs_wk_nccl_opts(nrs_worker_t *w, nrs_dtrans_opts_t *o) { (void)w, (void)o; }
void nrs_wk_nccl_preconnect(nrs_worker_t *w, const nrs_emu_graph_t *g) { (void)w, (void)g; }
void nrs_wk_nccl_after(nrs_worker_t *w, int outcome) { (void)w, (void)outcome; }
void nrs_wk_nccl_wrap(nrs_xmem_t *m, void *dev, int owner, size_t bytes)
{
    (void)m, (void)dev, (void)owner, (void)bytes;
}
#endif
