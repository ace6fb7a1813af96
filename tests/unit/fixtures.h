/* Specs built in code for unit tests, so suites do not depend on the loader. */
#ifndef NRS_TEST_FIXTURES_H
#define NRS_TEST_FIXTURES_H

#include <stdio.h>
#include <string.h>

#include "nereus/spec.h"

static inline void set_model(nrs_model_t *m, int layers, int hidden, int ffn, int heads, int kv, int vocab,
                      bool value_head)
{
    memset(m, 0, sizeof(*m));
    m->present = true;
    m->layers = layers;
    m->hidden = hidden;
    m->ffn = ffn;
    m->heads = heads;
    m->kv_heads = kv;
    m->vocab = vocab;
    m->dtype = NRS_DTYPE_BF16;
    m->value_head = value_head;
}

/* Llama-3-8B PPO on H100 nodes. */
static inline void spec_8b(nrs_spec_t *s, int nodes)
{
    memset(s, 0, sizeof(*s));
    snprintf(s->path, sizeof(s->path), "test-8b");
    s->cluster = (nrs_cluster_t){.gpu_mem_gib = 80, .peak_tflops = 989, .hbm_gbps = 3350,
                                 .gpus_per_node = 8, .nodes = nodes, .intra_gbps = 450,
                                 .inter_gbps = 50, .host_gbps = 25, .efficiency = 0.5};
    for (int r = 0; r < NRS_ROLE_COUNT; r++)
        set_model(&s->models[r], 32, 4096, 14336, 32, 8, 128256,
                  r == NRS_ROLE_CRITIC || r == NRS_ROLE_REWARD);
    s->algorithm = (nrs_algorithm_t){NRS_ALGO_PPO, true, true};
    s->workload = (nrs_workload_t){.global_batch = 256, .samples_per_prompt = 1, .prompt_len = 1024,
                                   .response_len = 1024, .max_response_len = 8192, .ppo_epochs = 1,
                                   .steps = 1000, .micro_batch_max = 64};
    s->runtime = (nrs_runtime_t){.transports = 7, .mem_headroom_gib = 2, .emulation_scale = 1e-3,
                                 .zero1 = true, .verify = true};
    s->policy = (nrs_policy_t){.horizon = 0, .min_gain = 0.02, .margin = 0.1, .hysteresis = 5,
                               .calib_alpha = 0.3, .drift_threshold = 0.15, .poll_interval = 2};
}

#endif
