/* Time and transient memory of one model-stage under a layout.
 * docs/cost-model.md §4 (train, infer), §5 (generate), §6 (communication).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "model/model_int.h"

/* What every stage formula needs, computed once per call. */
typedef struct {
    const nrs_cluster_t *c;
    const nrs_model_t *m;
    nrs_layout_t l;
    double prompt, resp, seq; /* tokens */
    int samples_r;            /* sequences of the busiest dp replica */
    int ls;                   /* layers of the busiest pipeline stage */
    double b;                 /* bytes per element of the dtype */
    double h, q;              /* hidden; query width heads * head_dim */
    double mm;                /* matmul parameters of the slowest stage (all tp ranks) */
    double stage_flops;       /* FLOP/s of one stage: tp * peak * efficiency */
} ctx_t;

/* Time split as nrs_stage_cost_t reports it. */
typedef struct {
    double compute, memory, comm, bubble;
} parts_t;

/* In int64: a + b - 1 overflows int for a near INT_MAX (samples may be). */
static int ceil_div(int a, int b)
{
    return (int)(((int64_t)a + b - 1) / b);
}

static double link_Bps(const nrs_cluster_t *c, int span)
{
    return (span <= c->gpus_per_node ? c->intra_gbps : c->inter_gbps) * NRS_MDL_GB;
}

static double link_lat(const nrs_cluster_t *c, int span)
{
    return span <= c->gpus_per_node ? NRS_MDL_LAT_INTRA_S : NRS_MDL_LAT_INTER_S;
}

/* Ring all-reduce among n GPUs laid out over `span` consecutive GPUs: each link
 * carries 2(n-1)/n of the message (Patarasuk & Yuan 2009). The group crosses a
 * node boundary when span > gpus_per_node, and then runs at NIC speed. */
static double allreduce_s(const nrs_cluster_t *c, int n, double bytes, int span)
{
    if (n <= 1)
        return 0;
    return link_lat(c, span) + 2.0 * (n - 1) / n * bytes / link_Bps(c, span);
}

static double p2p_s(const nrs_cluster_t *c, double bytes, int span)
{
    return link_lat(c, span) + bytes / link_Bps(c, span);
}

/* fp32 logits of `tokens` tokens on one tensor rank (vocab-parallel head). */
static double logits_bytes(const ctx_t *x, double tokens)
{
    return tokens * nrs_mdl_head_width(x->m, x->l.tp) * 4.0;
}

/* Tensor-parallel all-reduces of one micro-batch through the stage's layers
 * plus its pipeline p2p transfers (scatter/gather: 1/tp of the activations per
 * rank, Narayanan et al. 2021 §4.1). */
static double mb_comm_s(const ctx_t *x, double tokens, int ar_per_layer, int p2p_per_mb)
{
    const nrs_layout_t *l = &x->l;
    double msg = tokens * x->h * x->b;
    double t = x->ls * ar_per_layer * allreduce_s(x->c, l->tp, msg, l->tp);

    if (l->pp > 1)
        t += p2p_per_mb * p2p_s(x->c, msg / l->tp, l->tp * l->pp);
    return t;
}

/* Bytes the Adam step reads and writes per parameter: master, m and v read and
 * written, gradient read, new weights written (an fp32 model also reads them). */
static double adam_touch_bytes(const nrs_model_t *m)
{
    double b = nrs_dtype_bytes(m->dtype);
    double extra = m->dtype == NRS_DTYPE_FP32 ? b : 0;

    return 2.0 * nrs_mdl_opt_bytes_per_param(m->dtype) + 2.0 * b + extra;
}

/* ZeRO-3: one all-gather (or reduce-scatter) of the stage's parameters over the
 * dp group, layer by layer: every rank receives (dp-1)/dp of them (Rajbhandari
 * et al. 2020 §7.2.2), one collective per layer. */
static double z3_collective_s(const ctx_t *x, double p_gpu)
{
    const nrs_layout_t *l = &x->l;
    int span = l->tp * l->pp * l->dp;

    if (l->dp <= 1)
        return 0;
    return x->ls * link_lat(x->c, span) +
           (l->dp - 1.0) / l->dp * p_gpu * x->b / link_Bps(x->c, span);
}

/* ZeRO-3: bytes of the gathered (whole-over-dp) parameters alive at once: the
 * layer being computed and the prefetched next one, plus the output head. */
static double z3_gathered_bytes(const ctx_t *x)
{
    nrs_mdl_params_t layer = nrs_mdl_layer_params(x->m);
    double head = x->m->value_head ? 2.0 * x->h : (double)x->m->vocab * x->h / x->l.tp + x->h;

    if (x->l.dp <= 1)
        return 0;
    return x->b * (NRS_MDL_Z3_LIVE_LAYERS * nrs_mdl_per_gpu(x->m, layer, x->l.tp) + head);
}

static double train_transient(const ctx_t *x, const nrs_runtime_t *rt)
{
    const nrs_layout_t *l = &x->l;
    double act = nrs_mdl_act_token_layer(x->m, l->tp);
    /* Full recompute keeps only each layer's input (2sbh, Korthikanti et al.
     * 2022) and re-materialises one layer at a time during backward. */
    double stored = rt->recompute ? 2.0 * x->h / l->tp : act;
    double work = rt->recompute ? l->mb * x->seq * act : 0;
    /* 1F1B: the first stage holds pp micro-batches, the last one; never more
     * sequences than the replica has. */
    double inflight = fmin((double)l->pp * l->mb, x->samples_r);
    double first = inflight * x->seq * x->ls * stored + work;
    /* fp32 logits and their gradient for the loss. */
    double last = l->mb * x->seq * x->ls * stored + work + 2.0 * logits_bytes(x, l->mb * x->seq);

    return fmax(first, last) + (rt->zero3 ? z3_gathered_bytes(x) : 0);
}

static void cost_train(const ctx_t *x, const nrs_spec_t *s, nrs_stage_cost_t *o)
{
    const nrs_layout_t *l = &x->l;
    /* double: ep * sequences or ep * micro-batches overflows int (up to 1024
     * epochs times 2^31 sequences). */
    double ep = s->workload.ppo_epochs > 0 ? s->workload.ppo_epochs : 1;
    int nmb = ceil_div(x->samples_r, l->mb);
    double rc = s->runtime.recompute ? 4.0 / 3.0 : 1.0;
    /* Narayanan et al. 2021: 6 FLOPs per matmul parameter per token (fwd + bwd),
     * attention scores and context 12 * layers * (heads*hd) * seq^2 per sequence;
     * full recompute adds one forward (x 4/3). */
    double flops_seq = rc * (6.0 * x->mm * x->seq + 12.0 * x->ls * x->q * x->seq * x->seq);
    /* Megatron: 2 all-reduces forward, 2 backward per layer (+2 recompute). */
    double mb_comm = mb_comm_s(x, l->mb * x->seq, s->runtime.recompute ? 6 : 4, 2);
    double p_gpu = nrs_mdl_per_gpu(x->m, nrs_mdl_stage_weights(x->m, l->pp), l->tp);
    const nrs_runtime_t *rt = &s->runtime;
    double opt_params = p_gpu / nrs_mdl_zero_o(rt, l);

    o->compute_s = ep * x->samples_r * flops_seq / x->stage_flops;
    double pipe_comm = ep * nmb * mb_comm;
    /* Bubble (pp-1)/m of the pipelined work (Narayanan et al. 2021 §2.2). */
    o->bubble_s = (o->compute_s + pipe_comm) * (l->pp - 1) / nmb;
    if (rt->zero3) {
        /* DeepSpeed ZeRO-3 gathers the parameters before each forward and each
         * backward of every micro-batch (prefetched: hidden behind that
         * micro-batch's compute up to its length) and reduce-scatters the
         * gradients after each backward (not overlapped: overlap_comm off). */
        double z = z3_collective_s(x, p_gpu), mb_compute = o->compute_s / (ep * nmb);
        o->comm_s = pipe_comm + ep * nmb * (fmax(0, 2.0 * z - mb_compute) + z);
    } else {
        /* Gradient all-reduce (ZeRO-1: reduce-scatter + all-gather, same bytes),
         * once per optimizer step, one step per ppo epoch. */
        o->comm_s = pipe_comm +
                    ep * allreduce_s(x->c, l->dp, p_gpu * x->b, l->tp * l->pp * l->dp);
    }
    if (rt->offload_optimizer) {
        /* ZeRO-Offload: this rank's gradient shard goes to the host, CPU Adam
         * updates the fp32 master, the new bf16 weights come back. */
        double host_Bps = x->c->host_gbps * NRS_MDL_GB;
        double adam_pps = NRS_MDL_CPU_ADAM_HOST_PPS / x->c->gpus_per_node;
        o->comm_s += ep * 2.0 * opt_params * x->b / host_Bps;
        o->memory_s = ep * opt_params / adam_pps;
    } else {
        /* The optimizer step is memory-bound. */
        o->memory_s = ep * opt_params * adam_touch_bytes(x->m) / (x->c->hbm_gbps * NRS_MDL_GB);
    }
    o->trans_bytes = train_transient(x, rt);
}

static void cost_infer(const ctx_t *x, const nrs_spec_t *s, nrs_stage_cost_t *o)
{
    const nrs_layout_t *l = &x->l;
    int nmb = ceil_div(x->samples_r, l->mb);
    /* Forward only: a third of the training FLOPs. */
    double flops_seq = 2.0 * x->mm * x->seq + 4.0 * x->ls * x->q * x->seq * x->seq;
    double pipe_comm = nmb * mb_comm_s(x, l->mb * x->seq, 2, 1);

    o->compute_s = x->samples_r * flops_seq / x->stage_flops;
    o->bubble_s = (o->compute_s + pipe_comm) * (l->pp - 1) / nmb;
    o->comm_s = pipe_comm;
    o->memory_s = 0;
    /* Nothing is kept for backward: one layer's activations of one micro-batch,
     * plus the fp32 logits (log-probs of every token). */
    o->trans_bytes = l->mb * x->seq * nrs_mdl_act_token_layer(x->m, l->tp) +
                     logits_bytes(x, l->mb * x->seq);
    if (s->runtime.zero3) {
        /* One prefetched parameter all-gather per micro-batch's forward. */
        double p_gpu = nrs_mdl_per_gpu(x->m, nrs_mdl_stage_weights(x->m, l->pp), l->tp);
        o->comm_s += nmb * fmax(0, z3_collective_s(x, p_gpu) - o->compute_s / nmb);
        o->trans_bytes += z3_gathered_bytes(x);
    }
}

/* Integral over [x0, x1] of max(c0 + c1 x, m0 + m1 x), split into the parts
 * where compute (c) and memory (m) dominate. Both lines are exact per-step
 * decode costs at context length x. */
static void integrate_max(double c0, double c1, double m0, double m1, double x0, double x1,
                          double *ci, double *mi)
{
    double cut[3] = {x0, x1, x1};
    int n = 2;

    if (c1 != m1) {
        double xr = (m0 - c0) / (c1 - m1);
        if (xr > x0 && xr < x1) {
            cut[1] = xr;
            n = 3;
        }
    }
    *ci = *mi = 0;
    for (int i = 0; i + 1 < n; i++) {
        double a = cut[i], z = cut[i + 1], mid = 0.5 * (a + z);
        double cv = (c0 + c1 * mid) * (z - a), mv = (m0 + m1 * mid) * (z - a);
        if (cv >= mv)
            *ci += cv;
        else
            *mi += mv;
    }
}

/* Account `core` (compute or memory bound) to its part. */
static void add_core(parts_t *p, double c, double m, double k)
{
    if (c >= m)
        p->compute += k * c;
    else
        p->memory += k * m;
}

/* One round of generation: n sequences prefilled together, then decoded
 * response_len steps. With pp > 1 the n sequences go as g = min(pp, n) groups
 * that fill the pipeline; each decode step then takes pp stage-times, of which
 * pp - g are idle (the bubble). */
static void gen_round(const ctx_t *x, int n, parts_t *p)
{
    const nrs_layout_t *l = &x->l;
    int g = n < l->pp ? n : l->pp;
    double ng = (double)n / g;
    double hbm = x->c->hbm_gbps * NRS_MDL_GB;
    /* Weights one decode step streams: the slowest stage's matmul weights. */
    double w_read = nrs_mdl_per_gpu(x->m, nrs_mdl_stage_matmul(x->m, l->pp), l->tp) * x->b;
    double kv_tok = nrs_cost_kv_token_bytes(x->m, l->tp, l->pp);

    /* Prefill: compute-bound forward of ng * prompt tokens per group-stage. */
    double pf_c = ng * (2.0 * x->mm * x->prompt + 4.0 * x->ls * x->q * x->prompt * x->prompt) /
                  x->stage_flops;
    double pf_m = w_read / hbm;
    double pf_comm = mb_comm_s(x, ng * x->prompt, 2, 1);
    add_core(p, pf_c, pf_m, g);
    p->comm += g * pf_comm;
    p->bubble += (l->pp - 1) * (fmax(pf_c, pf_m) + pf_comm);

    /* Decode: per step max(compute, HBM traffic of weights + KV read) (roofline). */
    double ci, mi;
    integrate_max(2.0 * x->mm * ng / x->stage_flops, 4.0 * x->ls * x->q * ng / x->stage_flops,
                  w_read / hbm, ng * kv_tok / hbm, x->prompt, x->prompt + x->resp, &ci, &mi);
    double dc_comm = x->resp * mb_comm_s(x, ng, 2, 1);
    p->compute += g * ci;
    p->memory += g * mi;
    p->comm += g * dc_comm;
    p->bubble += (l->pp - g) * (ci + mi + dc_comm);
}

static void cost_generate(const ctx_t *x, nrs_stage_cost_t *o)
{
    const nrs_layout_t *l = &x->l;
    /* A replica cannot decode more sequences at once than it has. */
    int mb = l->mb < x->samples_r ? l->mb : x->samples_r;
    parts_t one = {0}, last = {0};

    gen_round(x, mb, &one);
    if (x->samples_r % mb)
        gen_round(x, x->samples_r % mb, &last);
    int full = x->samples_r / mb;
    o->compute_s = full * one.compute + last.compute;
    o->memory_s = full * one.memory + last.memory;
    o->comm_s = full * one.comm + last.comm;
    o->bubble_s = full * one.bubble + last.bubble;

    /* KV cache of mb sequences at full length (PagedAttention allocates as it
     * grows), one layer of prefill activations of one chunk, last-token logits. */
    double kv = mb * (x->prompt + x->resp) * nrs_cost_kv_token_bytes(x->m, l->tp, l->pp);
    double chunk = fmin(mb * x->prompt, NRS_MDL_PREFILL_CHUNK);
    o->trans_bytes = kv + chunk * nrs_mdl_act_token_layer(x->m, l->tp) + logits_bytes(x, mb);
}

static int cluster_ok(const nrs_cluster_t *c)
{
    return c->gpus_per_node >= 1 && c->peak_tflops > 0 && c->efficiency > 0 &&
                   c->hbm_gbps > 0 && c->intra_gbps > 0 && c->inter_gbps > 0
               ? 0
               : -1;
}

static int work_ok(const nrs_work_t *w)
{
    return w->samples >= 1 && isfinite(w->prompt_len) && isfinite(w->response_len) &&
                   w->prompt_len >= 0 && w->response_len >= 0 &&
                   w->prompt_len + w->response_len > 0
               ? 0
               : -1;
}

static int ctx_init(ctx_t *x, const nrs_spec_t *s, nrs_ms_t ms, const nrs_layout_t *l,
                    const nrs_work_t *w)
{
    const nrs_model_t *m = &s->models[nrs_ms_role(ms)];

    if (!m->present || nrs_mdl_dims_ok(m) != 0 || nrs_mdl_tp_pp_ok(m, l->tp, l->pp) != 0 ||
        l->dp < 1 || l->mb < 1 || cluster_ok(&s->cluster) != 0 || work_ok(w) != 0)
        return -1;
    /* Offloading needs a host link to price. */
    if (s->runtime.offload_optimizer && nrs_ms_stage(ms) == NRS_STAGE_TRAIN &&
        !(s->cluster.host_gbps > 0))
        return -1;
    x->c = &s->cluster;
    x->m = m;
    x->l = *l;
    x->prompt = w->prompt_len;
    x->resp = w->response_len;
    x->seq = x->prompt + x->resp;
    x->samples_r = ceil_div(w->samples, l->dp);
    /* Train and infer micro-batches larger than the replica's share are
     * pointless; generate caps mb at the share instead. */
    if (nrs_ms_stage(ms) != NRS_STAGE_GENERATE && l->mb > x->samples_r)
        return -1;
    x->ls = nrs_mdl_stage_layers(m, l->pp);
    x->b = nrs_dtype_bytes(m->dtype);
    x->h = m->hidden;
    x->q = m->heads * nrs_mdl_head_dim(m);
    nrs_mdl_params_t mm = nrs_mdl_stage_matmul(m, l->pp);
    x->mm = nrs_mdl_total(mm);
    /* tp > kv heads: every rank projects k and v for its own copy of a kv head,
     * so the tp ranks together do tp/kv times those FLOPs. */
    if (l->tp > m->kv_heads)
        x->mm += mm.kv * ((double)l->tp / m->kv_heads - 1.0);
    x->stage_flops = l->tp * s->cluster.peak_tflops * 1e12 * s->cluster.efficiency;
    return 0;
}

int nrs_cost_stage(const nrs_spec_t *s, nrs_ms_t ms, const nrs_layout_t *l,
                   const nrs_work_t *w, const nrs_calib_t *calib, nrs_stage_cost_t *out)
{
    ctx_t x;

    memset(out, 0, sizeof(*out));
    if ((unsigned)ms >= NRS_MS_COUNT || ctx_init(&x, s, ms, l, w) != 0)
        return -1;
    switch (nrs_ms_stage(ms)) {
    case NRS_STAGE_TRAIN:
        cost_train(&x, s, out);
        break;
    case NRS_STAGE_INFER:
        cost_infer(&x, s, out);
        break;
    case NRS_STAGE_GENERATE:
        cost_generate(&x, out);
        break;
    }
    double f = calib ? calib->stage[ms] : 1.0;
    out->time_s = (out->compute_s + out->memory_s + out->comm_s + out->bubble_s) * f;
    return 0;
}
