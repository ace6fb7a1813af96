/* slurmd context: nothing to do per job yet; parsing the arguments here
 * puts a misconfigured plugstack line in the slurmd log at start-up. */
#include "nrs_spank.h"

int nrs_slurmd_init(spank_t sp, int ac, char **av)
{
    (void)sp;
    return nrs_spank_config_parse(ac, av);
}
