/* Names of roles and model-stages, and which model-stages a job runs. */
#include "nereus/spec.h"

static const char *const role_names[NRS_ROLE_COUNT] = {"actor", "critic", "ref", "reward"};

static const struct {
    const char *name;
    nrs_role_t role;
    nrs_stage_t stage;
} ms_table[NRS_MS_COUNT] = {
    [NRS_MS_ACTOR_GENERATE] = {"actor.generate", NRS_ROLE_ACTOR, NRS_STAGE_GENERATE},
    [NRS_MS_ACTOR_INFER] = {"actor.infer", NRS_ROLE_ACTOR, NRS_STAGE_INFER},
    [NRS_MS_CRITIC_INFER] = {"critic.infer", NRS_ROLE_CRITIC, NRS_STAGE_INFER},
    [NRS_MS_REF_INFER] = {"ref.infer", NRS_ROLE_REF, NRS_STAGE_INFER},
    [NRS_MS_REWARD_INFER] = {"reward.infer", NRS_ROLE_REWARD, NRS_STAGE_INFER},
    [NRS_MS_ACTOR_TRAIN] = {"actor.train", NRS_ROLE_ACTOR, NRS_STAGE_TRAIN},
    [NRS_MS_CRITIC_TRAIN] = {"critic.train", NRS_ROLE_CRITIC, NRS_STAGE_TRAIN},
};

const char *nrs_role_name(nrs_role_t r)
{
    return (unsigned)r < NRS_ROLE_COUNT ? role_names[r] : "?";
}

const char *nrs_ms_name(nrs_ms_t ms)
{
    return (unsigned)ms < NRS_MS_COUNT ? ms_table[ms].name : "?";
}

nrs_role_t nrs_ms_role(nrs_ms_t ms)
{
    return ms_table[ms].role;
}

nrs_stage_t nrs_ms_stage(nrs_ms_t ms)
{
    return ms_table[ms].stage;
}

bool nrs_spec_has_ms(const nrs_spec_t *s, nrs_ms_t ms)
{
    return s->models[ms_table[ms].role].present;
}
