/* Model presets: dims of published checkpoints (from their Hugging Face
 * config.json: num_hidden_layers, hidden_size, intermediate_size,
 * num_attention_heads, num_key_value_heads, vocab_size, tie_word_embeddings). */
#include <ctype.h>
#include <stdio.h>
#include <string.h>

#include "spec/spec_internal.h"

typedef struct {
    const char *name;
    int layers, hidden, ffn, heads, kv_heads, vocab;
    bool tied;
} preset_t;

static const preset_t presets[] = {
    /* name            layers hidden   ffn  heads kv  vocab   tied */
    {"llama3.2-1b",      16,  2048,  8192,  32,  8, 128256, true},
    {"llama3.2-3b",      28,  3072,  8192,  24,  8, 128256, true},
    {"llama3-8b",        32,  4096, 14336,  32,  8, 128256, false},
    {"llama3.1-8b",      32,  4096, 14336,  32,  8, 128256, false},
    {"llama3-70b",       80,  8192, 28672,  64,  8, 128256, false},
    {"llama3.1-70b",     80,  8192, 28672,  64,  8, 128256, false},
    {"qwen2.5-0.5b",     24,   896,  4864,  14,  2, 151936, true},
    {"qwen2.5-1.5b",     28,  1536,  8960,  12,  2, 151936, true},
    {"qwen2.5-7b",       28,  3584, 18944,  28,  4, 152064, false},
    {"qwen2.5-14b",      48,  5120, 13824,  40,  8, 152064, false},
    {"qwen2.5-32b",      64,  5120, 27648,  40,  8, 152064, false},
    {"qwen2.5-72b",      80,  8192, 29568,  64,  8, 152064, false},
};

enum { NPRESETS = sizeof(presets) / sizeof(presets[0]) };

static const char *const preset_names[NPRESETS + 1] = {
    "llama3.2-1b", "llama3.2-3b", "llama3-8b",   "llama3.1-8b", "llama3-70b",  "llama3.1-70b",
    "qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-7b", "qwen2.5-14b", "qwen2.5-32b", "qwen2.5-72b",
    NULL,
};

static bool strip_prefix(char *s, const char *prefix)
{
    size_t n = strlen(prefix);
    if (strncmp(s, prefix, n) != 0)
        return false;
    memmove(s, s + n, strlen(s + n) + 1);
    return true;
}

static bool strip_suffix(char *s, const char *suffix)
{
    size_t n = strlen(suffix), len = strlen(s);
    if (len < n || strcmp(s + len - n, suffix) != 0)
        return false;
    s[len - n] = '\0';
    return true;
}

/* Lower-case, drop '-', '_', '.', ' ', and an optional "meta" prefix and
 * "instruct"/"chat" suffix (same dims as the base model). */
void nrs_preset_normalize(const char *name, size_t len, char *out, size_t cap)
{
    size_t o = 0;
    for (size_t i = 0; i < len && o + 1 < cap; i++) {
        char ch = name[i];
        if (ch == '-' || ch == '_' || ch == '.' || ch == ' ')
            continue;
        out[o++] = (char)tolower((unsigned char)ch);
    }
    if (cap > 0)
        out[o] = '\0';
    if (cap == 0)
        return;
    strip_prefix(out, "meta");
    if (!strip_suffix(out, "instruct"))
        strip_suffix(out, "chat");
}

int nrs_preset_lookup(const char *name, nrs_model_t *out)
{
    char want[NRS_NAME_MAX * 2], have[NRS_NAME_MAX];
    if (!name)
        return -1;
    size_t len = strlen(name);
    if (len >= NRS_NAME_MAX * 2)
        return -1;
    nrs_preset_normalize(name, len, want, sizeof(want));
    for (size_t i = 0; i < NPRESETS; i++) {
        const preset_t *p = &presets[i];
        nrs_preset_normalize(p->name, strlen(p->name), have, sizeof(have));
        if (strcmp(want, have) != 0)
            continue;
        if (out) {
            snprintf(out->preset, sizeof(out->preset), "%s", p->name);
            out->layers = p->layers;
            out->hidden = p->hidden;
            out->ffn = p->ffn;
            out->heads = p->heads;
            out->kv_heads = p->kv_heads;
            out->vocab = p->vocab;
            out->tied_embeddings = p->tied;
            out->dtype = NRS_DTYPE_BF16;
        }
        return 0;
    }
    return -1;
}

const char *const *nrs_preset_names(void)
{
    return preset_names;
}
