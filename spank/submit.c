/* Submission side: srun (local context) and sbatch/salloc (allocator
 * context). The --nereus callback has already refused a bad spec by the time
 * init_post_opt runs; that refusal is what stops the submission, because
 * Slurm ignores hook failures of an "optional" plugin but never an option
 * callback's. */
#include "nrs_spank.h"

int nrs_submit_init(spank_t sp, int ac, char **av)
{
    /* Register first: with a broken config --nereus must still be known, so
     * that it is refused with the reason rather than "unrecognized option". */
    if (nrs_spank_options_register(sp) < 0)
        return -1;
    /* A broken config fails no srun/sbatch/salloc: the --nereus callback
     * refuses only what asks for Nereus. */
    (void)nrs_spank_config_parse(ac, av);
    return 0;
}

int nrs_submit_post_opt(spank_t sp, int ac, char **av)
{
    (void)ac;
    (void)av;
    if (!nrs_spank_opt.given)
        return 0;
    /* Prolog/epilog see it as SPANK_NEREUS_SPEC: which file, resolved by the
     * --nereus callback where relative paths mean what the user meant. */
    if (nrs_spank_opt.abs[0] != '\0' &&
        spank_job_control_setenv(sp, "NEREUS_SPEC", nrs_spank_opt.abs, 1) != ESPANK_SUCCESS)
        nrs_debug("job control environment not available here");
    nrs_verbose("job spec %s is valid", nrs_spank_opt.arg);
    return 0;
}
