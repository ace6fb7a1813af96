/* Nereus SPANK plugin: the entry points Slurm calls, dispatched on the
 * context to the file that does the work (job_epilog: slurmd.c). A context we have nothing to do
 * in returns success, so a job without --nereus is untouched. */
#include "nrs_spank.h"

SPANK_PLUGIN(nereus, 1)

int slurm_spank_init(spank_t sp, int ac, char **av)
{
    switch (spank_context()) {
    case S_CTX_LOCAL:
    case S_CTX_ALLOCATOR:
        return nrs_submit_init(sp, ac, av);
    case S_CTX_REMOTE:
        return nrs_remote_init(sp, ac, av);
    case S_CTX_SLURMD:
        return nrs_slurmd_init(sp, ac, av);
    default:
        return 0;
    }
}

int slurm_spank_init_post_opt(spank_t sp, int ac, char **av)
{
    switch (spank_context()) {
    case S_CTX_LOCAL:
    case S_CTX_ALLOCATOR:
        return nrs_submit_post_opt(sp, ac, av);
    case S_CTX_REMOTE:
        return nrs_remote_post_opt(sp, ac, av);
    default:
        return 0;
    }
}

int slurm_spank_user_init(spank_t sp, int ac, char **av)
{
    if (spank_context() != S_CTX_REMOTE)
        return 0;
    return nrs_remote_user_init(sp, ac, av);
}

int slurm_spank_task_exit(spank_t sp, int ac, char **av)
{
    if (spank_context() != S_CTX_REMOTE)
        return 0;
    return nrs_remote_task_exit(sp, ac, av);
}

int slurm_spank_exit(spank_t sp, int ac, char **av)
{
    if (spank_context() != S_CTX_REMOTE)
        return 0;
    return nrs_remote_exit(sp, ac, av);
}

/* Prolog/epilog context (run by slurmd as root). Never fails: an error in an
 * epilog would drain the node. */
int slurm_spank_job_epilog(spank_t sp, int ac, char **av)
{
    if (spank_context() == S_CTX_JOB_SCRIPT)
        nrs_epilog(sp, ac, av);
    return 0;
}
