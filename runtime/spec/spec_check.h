/* Field indexes of the spec tables (shared by the schema and the cross-field
 * checks, which report errors at the marks the walk recorded). */
#ifndef NRS_SPEC_CHECK_H
#define NRS_SPEC_CHECK_H

#include "spec/spec_internal.h"

enum {
    NRS_ROOT_CLUSTER, NRS_ROOT_MODELS, NRS_ROOT_ALGORITHM, NRS_ROOT_WORKLOAD,
    NRS_ROOT_POLICY, NRS_ROOT_RUNTIME, NRS_ROOT_N
};
enum {
    NRS_CL_GPU, NRS_CL_GPU_MEM, NRS_CL_PEAK, NRS_CL_HBM, NRS_CL_GPN, NRS_CL_NODES,
    NRS_CL_INTRA, NRS_CL_INTER, NRS_CL_HOST, NRS_CL_EFF, NRS_CL_TP_ACROSS, NRS_CL_N
};
enum {
    NRS_MD_PRESET, NRS_MD_LAYERS, NRS_MD_HIDDEN, NRS_MD_FFN, NRS_MD_HEADS, NRS_MD_KV_HEADS,
    NRS_MD_VOCAB, NRS_MD_DTYPE, NRS_MD_TIED, NRS_MD_LAYOUT, NRS_MD_N
};
enum { NRS_TP, NRS_PP, NRS_TP_PP_N };
enum { NRS_AL_NAME, NRS_AL_REWARD, NRS_AL_KL, NRS_AL_N };
enum {
    NRS_WL_BATCH, NRS_WL_SAMPLES, NRS_WL_PROMPT, NRS_WL_RESPONSE, NRS_WL_MAX_RESPONSE,
    NRS_WL_EPOCHS, NRS_WL_STEPS, NRS_WL_MICRO, NRS_WL_N
};
enum {
    NRS_PO_HORIZON, NRS_PO_MIN_GAIN, NRS_PO_MARGIN, NRS_PO_HYSTERESIS, NRS_PO_CALIB,
    NRS_PO_DRIFT, NRS_PO_POLL, NRS_PO_N
};
enum {
    NRS_RT_TRANSPORTS, NRS_RT_HEADROOM, NRS_RT_EMU_SCALE, NRS_RT_ZERO1, NRS_RT_RECOMPUTE,
    NRS_RT_VERIFY, NRS_RT_ZERO3, NRS_RT_OFFLOAD, NRS_RT_WSYNC, NRS_RT_N
};

/* Cross-field rules: models the algorithm needs, divisibility of dims and
 * layouts, workload and memory consistency. 0 or -1 with the error in c->d. */
int nrs_spec_check(nrs_sctx_t *c, nrs_spec_t *s);

#endif
