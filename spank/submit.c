/* Submission side: srun (local context) and sbatch/salloc (allocator
 * context). The --nereus callback only records the value (options.c: a later
 * one overrides it, as sbatch's command line does #SBATCH's); init_post_opt,
 * which Slurm calls once every option is in and before any allocation
 * exists, checks the last one and refuses the submission if it is bad. */
#include <stdlib.h>

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

/* Refuse the submission as Slurm does when an option's callback fails: the
 * same message after ours, exit status 255. A failed init_post_opt is not
 * enough: Slurm 22.05 ignores it for an "optional" plugin (srun, sbatch and
 * salloc went on and made the job), and stops only for a "required" one.
 * Nothing exists yet to undo: Slurm calls it before asking for an
 * allocation (srun, salloc) or submitting (sbatch). */
static void nrs_submit_refuse(void)
{
    if (nrs_spank_opt.bare)
        slurm_error("Invalid --nereus option");
    else
        slurm_error("Invalid --nereus argument: %s", nrs_spank_opt.arg);
    exit(255);
}

int nrs_submit_post_opt(spank_t sp, int ac, char **av)
{
    (void)ac;
    (void)av;
    if (!nrs_spank_opt.given)
        return 0;
    if (nrs_spank_opt_check() < 0)
        nrs_submit_refuse();
    /* Prolog/epilog see it as SPANK_NEREUS_SPEC: which file, resolved by the
     * check where relative paths mean what the user meant. */
    if (nrs_spank_opt.abs[0] != '\0' &&
        spank_job_control_setenv(sp, "NEREUS_SPEC", nrs_spank_opt.abs, 1) != ESPANK_SUCCESS)
        nrs_debug("job control environment not available here");
    nrs_verbose("job spec %s is valid", nrs_spank_opt.arg);
    return 0;
}
