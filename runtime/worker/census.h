/* runtime/worker/census: who holds what once a rank is lost past the point of
 * no return (docs/worker-api.md §5).
 *
 * Every survivor contributes one bit per buffer it owns, in buffer-id order,
 * so a rank's part is ceil(owned / 8) bytes whatever the plan's size (a bit
 * per buffer of the whole graph was 340 KB per rank at 1,024 GPUs, over the
 * gather's 32 KB per rank from ~128 GPUs on). Every rank builds the same
 * index from the same graph and owner map, so parts decode the same way
 * everywhere and every survivor computes the same census.
 */
#ifndef NRS_WORKER_CENSUS_H
#define NRS_WORKER_CENSUS_H

#include <stddef.h>
#include <stdint.h>

#include "emu/graph.h"

typedef struct {
    int nranks;
    int32_t *off; /* [nranks + 1]: rank i owns ids[off[i] .. off[i + 1]) */
    int32_t *ids; /* buffer ids by owner, in id order */
    size_t len;   /* bytes of every rank's part: the largest owner's, rounded up */
} nrs_census_t;

/* Index the buffers of g by owner (owner(arg, id): a rank in 0..nranks-1, or
 * -1 for none). 0, or -1 out of memory. */
int nrs_census_init(nrs_census_t *c, const nrs_emu_graph_t *g, int nranks,
                    int (*owner)(const void *arg, int32_t id), const void *arg);
void nrs_census_free(nrs_census_t *c);

/* Rank's part (c->len bytes) from held[id] (1 = complete here; g->nbuf). */
void nrs_census_pack(const nrs_census_t *c, int rank, const unsigned char *held,
                     unsigned char *part);
/* OR rank's part into all[id]. */
void nrs_census_unpack(const nrs_census_t *c, int rank, const unsigned char *part,
                       unsigned char *all);

typedef struct {
    long long present, rebuildable, lost;
    int32_t first_lost[3]; /* the first lost new buffers (ids), -1 */
} nrs_census_count_t;

/* Classify every new-state buffer of g from all[] (some survivor holds it
 * complete): present (it, or the old buffer it is kept in, is held),
 * rebuildable (a grad, which starts at zero; another new buffer with the same
 * box is held; or every region it receives has a held source), else lost.
 * present_out (g->nnew, may be NULL) gets 1 for present. 0, or -1 out of
 * memory. */
int nrs_census_classify(const nrs_emu_graph_t *g, const unsigned char *all,
                        unsigned char *present_out, nrs_census_count_t *out);

/* The classification's memory for g, had before the parts are gathered: a
 * survivor that could not classify what it gathered would hold a census of
 * its own. NULL: out of memory. */
typedef struct nrs_census_work nrs_census_work_t;
nrs_census_work_t *nrs_census_work_new(const nrs_emu_graph_t *g);
void nrs_census_work_free(nrs_census_work_t *wk);
/* nrs_census_classify in wk (from nrs_census_work_new(g)): it cannot fail. */
void nrs_census_classify_in(nrs_census_work_t *wk, const nrs_emu_graph_t *g,
                            const unsigned char *all, unsigned char *present_out,
                            nrs_census_count_t *out);

#endif
