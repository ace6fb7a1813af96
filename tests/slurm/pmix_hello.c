/* tests/slurm: one PMIx rendezvous across the local cluster. Every rank puts
 * the name of its node, fences with data collection, and reads every peer's.
 * Prints "pmix_hello: rank R/N on NODE: N peers on NODES" and exits 0 when it
 * saw all of them. Run by srun --mpi=pmix (tests/slurm/test_pmix.sh). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <pmix.h>

#define KEY "nrs.slurm.node"

static int fail(const char *what, pmix_status_t rc)
{
    fprintf(stderr, "pmix_hello: %s: %s\n", what, PMIx_Error_string(rc));
    return 1;
}

int main(void)
{
    pmix_proc_t me, wild, peer;
    pmix_value_t val, *got = NULL;
    pmix_info_t info;
    const char *node = getenv("SLURMD_NODENAME");
    char nodes[4096] = "";
    uint32_t size;
    bool collect = true;
    pmix_status_t rc;

    if ((rc = PMIx_Init(&me, NULL, 0)) != PMIX_SUCCESS)
        return fail("PMIx_Init", rc);
    PMIX_PROC_CONSTRUCT(&wild);
    PMIX_LOAD_PROCID(&wild, me.nspace, PMIX_RANK_WILDCARD);
    if ((rc = PMIx_Get(&wild, PMIX_JOB_SIZE, NULL, 0, &got)) != PMIX_SUCCESS)
        return fail("PMIx_Get(job size)", rc);
    size = got->data.uint32;
    PMIX_VALUE_RELEASE(got);

    val.type = PMIX_STRING;
    val.data.string = (char *)(node ? node : "?");
    if ((rc = PMIx_Put(PMIX_GLOBAL, KEY, &val)) != PMIX_SUCCESS)
        return fail("PMIx_Put", rc);
    if ((rc = PMIx_Commit()) != PMIX_SUCCESS)
        return fail("PMIx_Commit", rc);
    PMIX_INFO_LOAD(&info, PMIX_COLLECT_DATA, &collect, PMIX_BOOL);
    if ((rc = PMIx_Fence(&wild, 1, &info, 1)) != PMIX_SUCCESS)
        return fail("PMIx_Fence", rc);

    for (uint32_t r = 0; r < size; r++) {
        PMIX_LOAD_PROCID(&peer, me.nspace, r);
        if ((rc = PMIx_Get(&peer, KEY, NULL, 0, &got)) != PMIX_SUCCESS)
            return fail("PMIx_Get(peer)", rc);
        if (strlen(nodes) + strlen(got->data.string) + 2 < sizeof(nodes)) {
            strcat(nodes, r ? "," : "");
            strcat(nodes, got->data.string);
        }
        PMIX_VALUE_RELEASE(got);
    }
    printf("pmix_hello: rank %u/%u on %s: %u peers on %s\n", me.rank, size, node ? node : "?",
           size, nodes);
    PMIx_Finalize(NULL, 0);
    return 0;
}
