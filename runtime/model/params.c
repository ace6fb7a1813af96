/* Parameter counts and how they fall on pipeline stages and tensor ranks.
 * docs/cost-model.md §2.
 */
#include "model/model_int.h"

int nrs_dtype_bytes(nrs_dtype_t d)
{
    return d == NRS_DTYPE_FP32 ? 4 : 2;
}

double nrs_mdl_opt_bytes_per_param(nrs_dtype_t d)
{
    /* Rajbhandari et al. 2020 (ZeRO), mixed-precision Adam K = 12: fp32 master
     * copy + fp32 m + fp32 v. An fp32 model is its own master copy. */
    return d == NRS_DTYPE_FP32 ? 8.0 : 12.0;
}

void nrs_calib_init(nrs_calib_t *c)
{
    for (int i = 0; i < NRS_MS_COUNT; i++)
        c->stage[i] = 1.0;
    c->sync = 1.0;
}

void nrs_work_from_spec(const nrs_spec_t *s, nrs_work_t *w)
{
    /* 0 means "unset": the loader's default is 1 response per prompt. */
    int spp = s->workload.samples_per_prompt > 0 ? s->workload.samples_per_prompt : 1;

    w->samples = s->workload.global_batch * spp;
    w->prompt_len = s->workload.prompt_len;
    w->response_len = s->workload.response_len;
}

double nrs_mdl_tensor_count(const nrs_model_t *m)
{
    /* Hugging Face Llama naming: 9 tensors a layer, embed_tokens, norm, lm_head
     * (none when tied to the embedding; a value head is one tensor too). */
    return 9.0 * m->layers + 2.0 + ((m->tied_embeddings && !m->value_head) ? 0 : 1);
}

double nrs_mdl_zero_w(const nrs_runtime_t *rt, const nrs_layout_t *l)
{
    return rt->zero3 ? l->dp : 1;
}

double nrs_mdl_zero_o(const nrs_runtime_t *rt, const nrs_layout_t *l)
{
    return rt->zero3 || rt->zero1 ? l->dp : 1;
}

int nrs_mdl_dims_ok(const nrs_model_t *m)
{
    return m->layers > 0 && m->hidden > 0 && m->ffn > 0 && m->heads > 0 && m->kv_heads > 0 &&
                   m->vocab > 0
               ? 0
               : -1;
}

int nrs_mdl_tp_pp_ok(const nrs_model_t *m, int tp, int pp)
{
    if (tp < 1 || pp < 1 || pp > m->layers || m->heads % tp != 0)
        return -1;
    /* GQA: tp either splits the kv heads or replicates whole ones (tp > kv). */
    if (m->kv_heads % tp != 0 && tp % m->kv_heads != 0)
        return -1;
    return 0;
}

double nrs_mdl_head_dim(const nrs_model_t *m)
{
    return (double)m->hidden / m->heads;
}

int nrs_mdl_stage_layers(const nrs_model_t *m, int pp)
{
    return (m->layers + pp - 1) / pp;
}

/* kv heads one tensor rank holds: a share of them, or one replicated head when
 * tp > kv_heads (Megatron/vLLM replicate kv heads in that case). */
static double kv_heads_per_gpu(const nrs_model_t *m, int tp)
{
    return m->kv_heads >= tp ? (double)m->kv_heads / tp : 1.0;
}

/* The larger part of x split over tp ranks by n rows (geometry.c's balanced
 * split: ceil(n / tp) rows on the first ranks). */
static double split_part(double x, int n, int tp)
{
    return n % tp ? x / n * ((n + tp - 1) / tp) : x / tp;
}

double nrs_mdl_per_gpu(const nrs_model_t *m, nrs_mdl_params_t p, int tp)
{
    /* With tp > kv heads a rank holds one whole kv head (runtime/emu/geometry.c),
     * not 1/tp of them all: kv/tp would undercount what the rank allocates. */
    double kv = m->kv_heads >= tp ? p.kv / tp : p.kv / m->kv_heads;

    return p.sharded / tp + split_part(p.ffn, m->ffn, tp) + split_part(p.vocab, m->vocab, tp) +
           kv + p.replicated;
}

double nrs_mdl_total(nrs_mdl_params_t p)
{
    return p.sharded + p.ffn + p.vocab + p.kv + p.replicated;
}

nrs_mdl_params_t nrs_mdl_layer_params(const nrs_model_t *m)
{
    double h = m->hidden, hd = nrs_mdl_head_dim(m);
    double q = m->heads * hd, kv = m->kv_heads * hd;
    /* q and o projections are h x q, k and v are h x kv (GQA); SwiGLU has gate,
     * up and down (3 h x ffn); two RMSNorm weight vectors. No biases (Llama). */
    nrs_mdl_params_t p = {
        .sharded = h * q + q * h,
        .ffn = 3.0 * h * m->ffn,
        .kv = 2.0 * h * kv,
        .replicated = 2.0 * h,
    };
    return p;
}

/* Output head as held by the last stage: lm head (vocab x hidden, sharded by tp,
 * a copy of the embedding when tied) or value head (hidden x 1, replicated),
 * plus the final norm. */
static nrs_mdl_params_t head_params(const nrs_model_t *m)
{
    double h = m->hidden;
    nrs_mdl_params_t p = {.replicated = h};

    if (m->value_head)
        p.replicated += h;
    else
        p.vocab += (double)m->vocab * h;
    return p;
}

double nrs_cost_params(const nrs_model_t *m)
{
    nrs_mdl_params_t layer = nrs_mdl_layer_params(m), head = head_params(m);
    double emb = (double)m->vocab * m->hidden;
    double total = emb + m->layers * nrs_mdl_total(layer) + nrs_mdl_total(head);

    /* A tied lm head is the embedding matrix: count it once. */
    if (m->tied_embeddings && !m->value_head)
        total -= emb;
    return total;
}

nrs_mdl_params_t nrs_mdl_stage_weights(const nrs_model_t *m, int pp)
{
    nrs_mdl_params_t layer = nrs_mdl_layer_params(m), head = head_params(m);
    double ls = nrs_mdl_stage_layers(m, pp), emb = (double)m->vocab * m->hidden;
    nrs_mdl_params_t p = {.sharded = ls * layer.sharded,
                          .ffn = ls * layer.ffn,
                          .kv = ls * layer.kv,
                          .replicated = ls * layer.replicated};

    if (pp == 1) {
        /* One stage holds everything; a tied head shares the embedding. */
        p.vocab += emb + ((m->tied_embeddings && !m->value_head) ? 0 : head.vocab);
        p.replicated += head.replicated;
        return p;
    }
    /* First stage: embedding; last: head and final norm (a tied head is a copy,
     * Megatron keeps one on each end). The heavier end is the most loaded GPU;
     * both ends are assumed to get ceil(layers/pp) layers (upper bound). */
    if (emb >= nrs_mdl_total(head)) {
        p.vocab += emb;
    } else {
        p.vocab += head.vocab;
        p.replicated += head.replicated;
    }
    return p;
}

nrs_mdl_params_t nrs_mdl_stage_matmul(const nrs_model_t *m, int pp)
{
    nrs_mdl_params_t layer = nrs_mdl_layer_params(m), head = head_params(m);
    double ls = nrs_mdl_stage_layers(m, pp);
    /* The last stage (layers + head) is the slowest; with pp = 1 it is all. */
    nrs_mdl_params_t p = {.sharded = ls * layer.sharded,
                          .ffn = ls * layer.ffn,
                          .vocab = head.vocab,
                          .kv = ls * layer.kv,
                          .replicated = ls * layer.replicated + head.replicated};
    return p;
}

double nrs_mdl_head_width(const nrs_model_t *m, int tp)
{
    return m->value_head ? 1.0 : (double)m->vocab / tp;
}

double nrs_mdl_act_token_layer(const nrs_model_t *m, int tp)
{
    double h = m->hidden, hd = nrs_mdl_head_dim(m), q = m->heads * hd;
    /* Korthikanti et al. 2022 §4.1 counting, applied to a Llama block, 2-byte
     * activations, sequence parallel (everything / tp):
     *   RMSNorm inputs 2h+2h, qkv and MLP linear inputs 2h+2h,
     *   q, k, v for attention backward 2(q + 2kv), attention output 2q
     *   (FlashAttention: no s x s scores are stored), SwiGLU gate, up,
     *   silu(gate) and down input 4 x 2 ffn.  => 8h + 4q + 8ffn (+ 4kv). */
    double sharded = (8.0 * h + 4.0 * q + 8.0 * m->ffn) / tp;
    double kv = 4.0 * kv_heads_per_gpu(m, tp) * hd;

    return sharded + kv;
}

double nrs_cost_kv_token_bytes(const nrs_model_t *m, int tp, int pp)
{
    if (nrs_mdl_dims_ok(m) != 0 || nrs_mdl_tp_pp_ok(m, tp, pp) != 0)
        return -1;
    /* PagedAttention (Kwon et al. 2023): K and V, per layer, per kv head, head_dim
     * elements each. */
    return 2.0 * nrs_mdl_stage_layers(m, pp) * kv_heads_per_gpu(m, tp) * nrs_mdl_head_dim(m) *
           nrs_dtype_bytes(m->dtype);
}
