/* runtime/rdv: rank rendezvous over PMIx (docs/protocol-dataplane.md).
 *
 * Each rank publishes small blobs (UCX worker addresses, NCCL unique ids)
 * under epoch-tagged keys "nrs.e<epoch>.<name>", commits, and meets the
 * others in a non-blocking fence whose wait loop keeps calling a progress
 * function, so outstanding UCX operations keep moving (a blocking fence
 * could deadlock a peer waiting on our software-emulated RMA over tcp).
 *
 * Every wait is bounded. A fence that does not complete in time fails with
 * an error naming the ranks whose key never appeared; a rank reported dead
 * by the resource manager (PMIx event) fails the wait at once, naming it.
 *
 * No PMIx server (PMIx_Init says PMIX_ERR_UNREACH) is a singleton: rank 0
 * of 1, every operation works locally.
 *
 * Not thread-safe: one thread drives a rendezvous context.
 */
#ifndef NRS_RDV_H
#define NRS_RDV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct nrs_rdv nrs_rdv_t;

/* Called repeatedly while a wait is pending; returns how much work it did
 * (0 = idle, the loop then naps ~50 us to leave the cores to the peers). */
typedef int (*nrs_rdv_progress_fn)(void *arg);

#define NRS_RDV_KEY_MAX 128

/* 0 and *out on success; -1 with err otherwise. */
int nrs_rdv_init(nrs_rdv_t **out, char *err, size_t errlen);
void nrs_rdv_fini(nrs_rdv_t *r);

int nrs_rdv_rank(const nrs_rdv_t *r);
int nrs_rdv_size(const nrs_rdv_t *r);
bool nrs_rdv_is_singleton(const nrs_rdv_t *r);
const char *nrs_rdv_nspace(const nrs_rdv_t *r);

void nrs_rdv_set_progress(nrs_rdv_t *r, nrs_rdv_progress_fn fn, void *arg);

/* "nrs.e<epoch>.<name>" into buf; -1 if it does not fit. */
int nrs_rdv_key(char *buf, size_t len, uint64_t epoch, const char *name);

/* Publish blob under (epoch, name), visible to every rank after the next
 * commit + fence. */
int nrs_rdv_put(nrs_rdv_t *r, uint64_t epoch, const char *name, const void *blob, size_t len,
                char *err, size_t errlen);
int nrs_rdv_commit(nrs_rdv_t *r, char *err, size_t errlen);

/* Fence over all ranks, collecting data; waits at most timeout_s. On time-out
 * the error names the ranks that never published (epoch, name) — pass the key
 * every rank put just before (name may be NULL: then it only says that it
 * timed out). */
int nrs_rdv_fence(nrs_rdv_t *r, uint64_t epoch, const char *name, double timeout_s, char *err,
                  size_t errlen);

/* Fence after a failure: the survivors agree that they are done. Over ranks
 * (NULL: all); a participant that died does not fail it (the PMIx server
 * completes the collective with PMIX_ERR_PARTIAL_SUCCESS once the dead
 * rank's connection is gone), only the time-out does (it has no key to ask
 * for: nrs_rdv_gather's fence names the ranks that never published). */
int nrs_rdv_fence_survivors(nrs_rdv_t *r, const int *ranks, int nranks, double timeout_s,
                            char *err, size_t errlen);

/* Peer's blob (malloc'd, caller frees). A rank reported dead gets up to 1.5 s more
 * for what PMIx holds of it (published and fenced before it died). */
int nrs_rdv_get(nrs_rdv_t *r, int rank, uint64_t epoch, const char *name, void **blob,
                size_t *len, double timeout_s, char *err, size_t errlen);

/* put + commit + fence + get of every rank's blob: blobs[i], lens[i] for
 * rank i (blobs[rank] is a copy of ours). Free with nrs_rdv_free_blobs. */
int nrs_rdv_allgather(nrs_rdv_t *r, uint64_t epoch, const char *name, const void *blob,
                      size_t len, void ***blobs, size_t **lens, double timeout_s, char *err,
                      size_t errlen);
void nrs_rdv_free_blobs(nrs_rdv_t *r, void **blobs, size_t *lens);

/* A fixed-size all-gather among every rank but out[nout] and those known
 * dead: each publishes len bytes under (key, name); after the survivors'
 * fence, got[i] = 1 and all + i * len hold rank i's bytes for each rank whose
 * bytes came (ours included), also when it died since: got[] is what PMIx
 * holds, the same on every rank, whatever each was told of deaths (a rank
 * that never committed costs a wait of up to 1.5 s, once). -1 with err when
 * the fence failed or out of memory.
 * The same signature as nrs_dtrans_opts_t.gather (another backend: the
 * controller). Its two halves, post (put, commit, fence) and read, are
 * apart for tests that let a death be known between them; post alone is a
 * contribution without the answer (a rank without the memory for it). Post
 * needs no memory of its own but PMIx's (the participants, the fence's
 * process list and a spare tracker are had with the handle): a rank that
 * left a fence out for want of memory paired its next one with the others'
 * gather. Test hook NRS_RDV_NOMEM=RANK:N: rank RANK's Nth post (from 0)
 * takes the spare tracker. */
int nrs_rdv_gather(nrs_rdv_t *r, uint64_t key, const char *name, const void *mine, size_t len,
                   const int *out, int nout, void *all, unsigned char *got, double timeout_s,
                   char *err, size_t errlen);
int nrs_rdv_gather_post(nrs_rdv_t *r, uint64_t key, const char *name, const void *mine,
                        size_t len, const int *out, int nout, double timeout_s, char *err,
                        size_t errlen);
int nrs_rdv_gather_read(nrs_rdv_t *r, uint64_t key, const char *name, const void *mine,
                        size_t len, const int *out, int nout, void *all, unsigned char *got,
                        char *err, size_t errlen);

/* Ranks the resource manager reported dead (PMIx events), for transports
 * that want a second opinion. */
bool nrs_rdv_peer_failed(const nrs_rdv_t *r, int rank);
int nrs_rdv_first_failed(const nrs_rdv_t *r); /* -1 if none */

#endif
