/* --from and --from-args: Megatron-LM core_v0.14.0's pretrain_gpt.py arguments into a plan
 * (app/from_config.h).
 *
 * Flags, defaults and meanings from NVIDIA/Megatron-LM tag core_v0.14.0 (23e00ed0),
 * megatron/training/arguments.py. The text is split as a shell would split a plain command
 * line (quotes, backslash-newline, # comments); a launcher's words before pretrain_gpt.py
 * (torchrun and its flags) are skipped. Megatron-LM's arguments name no model, so the model
 * is the --model given, its shape checked against the shape flags, or else the one model of
 * data/models with that shape. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app/from_internal.h"
#include "data/embedded.h"
#include "sim/stack.h"

#define MG_MAX_TOKENS 512

typedef struct mg_args {
  char *buf;                     /* the tokens, NUL-separated */
  const char *flag[MG_MAX_TOKENS];
  const char *val[MG_MAX_TOKENS]; /* NULL for a switch */
  int nval[MG_MAX_TOKENS];         /* the words of a list flag's value (MG_LIST), else 1 */
  int n;
} mg_args;

enum { MG_MAP = 0, MG_IGNORE, MG_LIST };
/* Every flag read: whether it takes a value, and whether it is mapped or changes no cost. */
static const struct {
  const char *flag;
  int value, role;
} k_flags[] = {
    {"--num-layers", 1, MG_MAP}, {"--hidden-size", 1, MG_MAP}, {"--ffn-hidden-size", 1, MG_MAP},
    {"--num-attention-heads", 1, MG_MAP}, {"--num-query-groups", 1, MG_MAP}, {"--kv-channels", 1, MG_MAP},
    {"--seq-length", 1, MG_MAP}, {"--max-position-embeddings", 1, MG_MAP}, {"--vocab-size", 1, MG_MAP},
    {"--position-embedding-type", 1, MG_MAP}, {"--rotary-base", 1, MG_MAP}, {"--normalization", 1, MG_MAP},
    {"--norm-epsilon", 1, MG_MAP}, {"--tensor-model-parallel-size", 1, MG_MAP},
    {"--pipeline-model-parallel-size", 1, MG_MAP}, {"--num-virtual-stages-per-pipeline-rank", 1, MG_MAP},
    {"--num-layers-per-virtual-pipeline-stage", 1, MG_MAP}, {"--context-parallel-size", 1, MG_MAP},
    {"--decoder-first-pipeline-num-layers", 1, MG_MAP}, {"--decoder-last-pipeline-num-layers", 1, MG_MAP},
    {"--pipeline-model-parallel-layout", 1, MG_MAP},
    {"--cp-comm-type", 1, MG_LIST}, {"--expert-model-parallel-size", 1, MG_MAP},
    {"--expert-tensor-parallel-size", 1, MG_MAP}, {"--micro-batch-size", 1, MG_MAP},
    {"--global-batch-size", 1, MG_MAP}, {"--recompute-granularity", 1, MG_MAP}, {"--recompute-method", 1, MG_MAP},
    {"--recompute-num-layers", 1, MG_MAP}, {"--recompute-modules", 1, MG_LIST}, {"--fp8-format", 1, MG_MAP},
    {"--fp8-recipe", 1, MG_MAP}, {"--fp8-param-gather", 0, MG_MAP},
    {"--reuse-grad-buf-for-mxfp8-param-ag", 0, MG_IGNORE}, /* the path --fp8-param-gather's MXFP8 is priced on */
    {"--fp8-dot-product-attention", 0, MG_MAP},
    {"--attention-backend", 1, MG_MAP}, {"--transformer-impl", 1, MG_MAP},
    {"--group-query-attention", 0, MG_MAP}, {"--swiglu", 0, MG_MAP}, {"--disable-bias-linear", 0, MG_MAP},
    {"--add-qkv-bias", 0, MG_MAP}, {"--qk-layernorm", 0, MG_MAP},
    {"--untie-embeddings-and-output-weights", 0, MG_MAP}, {"--sequence-parallel", 0, MG_MAP},
    {"--use-distributed-optimizer", 0, MG_MAP}, {"--overlap-grad-reduce", 0, MG_MAP},
    {"--overlap-param-gather", 0, MG_MAP}, {"--tp-comm-overlap", 0, MG_MAP}, {"--bf16", 0, MG_MAP},
    {"--use-flash-attn", 0, MG_MAP}, {"--use-mcore-models", 0, MG_IGNORE},
    {"--cross-entropy-loss-fusion", 0, MG_MAP}, {"--cross-entropy-fusion-impl", 1, MG_MAP},
    {"--ddp-average-in-collective", 0, MG_MAP}, {"--no-check-for-nan-in-loss-and-grad", 0, MG_MAP},
    {"--grad-reduce-in-bf16", 0, MG_MAP}, {"--align-param-gather", 0, MG_MAP},
    {"--no-gradient-accumulation-fusion", 0, MG_MAP},
    {"--ddp-bucket-size", 1, MG_MAP},
    {"--enable-cuda-graph", 0, MG_MAP}, {"--external-cuda-graph", 0, MG_MAP}, {"--cuda-graph-scope", 1, MG_LIST},
    {"--cuda-graph-impl", 1, MG_MAP},
    /* the eager steps before the graphs are captured are not the steady state priced */
    {"--cuda-graph-warmup-steps", 1, MG_IGNORE},
    /* Megatron FSDP (--use-custom-fsdp its name before core_v0.14), and the checkpoint format
     * it asks for, which changes no step's cost */
    {"--use-megatron-fsdp", 0, MG_MAP}, {"--use-custom-fsdp", 0, MG_MAP},
    {"--data-parallel-sharding-strategy", 1, MG_MAP}, {"--fsdp-double-buffer", 0, MG_MAP},
    {"--num-distributed-optimizer-instances", 1, MG_MAP},
    {"--ckpt-format", 1, MG_IGNORE},
    {"--mtp-num-layers", 1, MG_MAP}, {"--mtp-loss-scaling-factor", 1, MG_IGNORE},
    /* CPU offloading of activations: core_v0.16.0's argument (arguments.py turns cpu_offloading
     * on where it is > 0); core_v0.14.0 sets it in TransformerConfig only */
    {"--cpu-offloading-num-layers", 1, MG_MAP},
    /* the experts and the latent attention */
    {"--num-experts", 1, MG_MAP}, {"--moe-ffn-hidden-size", 1, MG_MAP}, {"--moe-router-topk", 1, MG_MAP},
    {"--moe-shared-expert-intermediate-size", 1, MG_MAP}, {"--moe-layer-freq", 1, MG_MAP},
    {"--moe-router-pre-softmax", 0, MG_MAP}, {"--moe-router-num-groups", 1, MG_MAP},
    {"--moe-router-group-topk", 1, MG_MAP}, {"--moe-router-score-function", 1, MG_MAP},
    {"--moe-grouped-gemm", 0, MG_MAP}, {"--moe-token-dispatcher-type", 1, MG_MAP}, {"--moe-enable-deepep", 0, MG_MAP},
    {"--overlap-moe-expert-parallel-comm", 0, MG_MAP}, {"--multi-latent-attention", 0, MG_MAP},
    {"--moe-expert-capacity-factor", 1, MG_MAP}, {"--moe-pad-expert-input-to-capacity", 0, MG_MAP},
    {"--q-lora-rank", 1, MG_MAP}, {"--kv-lora-rank", 1, MG_MAP}, {"--qk-head-dim", 1, MG_MAP},
    {"--qk-pos-emb-head-dim", 1, MG_MAP}, {"--v-head-dim", 1, MG_MAP},
    /* the load-balancing loss's kind and weight move gradients, not cost */
    {"--moe-router-load-balancing-type", 1, MG_IGNORE}, {"--moe-aux-loss-coeff", 1, MG_IGNORE},
    /* which tokens a full expert drops (by probability or position) moves no cost */
    {"--moe-token-drop-policy", 1, MG_IGNORE},
    /* RoPE's scaling (YaRN or none) moves the angles, not cost */
    {"--rope-type", 1, MG_IGNORE},
    /* no cost: the learning rate and optimizer hyper-parameters, data, tokenizer, paths,
     * logging, the run's length, timeouts */
    {"--lr", 1, MG_IGNORE}, {"--min-lr", 1, MG_IGNORE}, {"--lr-decay-style", 1, MG_IGNORE},
    {"--lr-decay-iters", 1, MG_IGNORE}, {"--lr-warmup-iters", 1, MG_IGNORE}, {"--lr-warmup-fraction", 1, MG_IGNORE},
    {"--weight-decay", 1, MG_IGNORE}, {"--clip-grad", 1, MG_IGNORE}, {"--adam-beta1", 1, MG_IGNORE},
    {"--adam-beta2", 1, MG_IGNORE}, {"--adam-eps", 1, MG_IGNORE}, {"--init-method-std", 1, MG_IGNORE},
    {"--seed", 1, MG_IGNORE}, {"--data-path", 1, MG_IGNORE}, {"--split", 1, MG_IGNORE},
    {"--tokenizer-type", 1, MG_IGNORE}, {"--tokenizer-model", 1, MG_IGNORE}, {"--vocab-file", 1, MG_IGNORE},
    {"--merge-file", 1, MG_IGNORE}, {"--save", 1, MG_IGNORE}, {"--load", 1, MG_IGNORE},
    {"--save-interval", 1, MG_IGNORE}, {"--eval-interval", 1, MG_IGNORE}, {"--eval-iters", 1, MG_IGNORE},
    {"--log-interval", 1, MG_IGNORE}, {"--tensorboard-dir", 1, MG_IGNORE}, {"--wandb-project", 1, MG_IGNORE},
    {"--wandb-exp-name", 1, MG_IGNORE}, {"--train-iters", 1, MG_IGNORE}, {"--train-samples", 1, MG_IGNORE},
    {"--exit-duration-in-mins", 1, MG_IGNORE}, {"--distributed-timeout-minutes", 1, MG_IGNORE},
    {"--data-cache-path", 1, MG_IGNORE}, {"--num-workers", 1, MG_IGNORE}, {"--log-throughput", 0, MG_IGNORE},
    {"--log-timers-to-tensorboard", 0, MG_IGNORE}, {"--log-memory-to-tensorboard", 0, MG_IGNORE},
    {"--no-load-optim", 0, MG_IGNORE}, {"--no-load-rng", 0, MG_IGNORE}, {"--mock-data", 0, MG_IGNORE},
};

/* Splits text into words as a shell splits a plain command line. */
static mp_status split(mp_ctx *ctx, const char *text, const char *origin, char *buf, const char **words, int *n) {
  *n = 0;
  char *o = buf;
  for (const char *p = text; *p;) {
    if (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n' || (*p == '\\' && p[1] == '\n')) {
      p += *p == '\\' ? 2 : 1;
      continue;
    }
    if (*p == '#') {
      p += strcspn(p, "\n");
      continue;
    }
    if (*n >= MG_MAX_TOKENS) return mp_error(ctx, MP_ERR_USAGE, "%s: more than %d words", origin, MG_MAX_TOKENS);
    words[(*n)++] = o;
    while (*p && !strchr(" \t\r\n", *p)) {
      if (*p == '\'' || *p == '"') {
        const char q = *p++;
        while (*p && *p != q) *o++ = *p++;
        if (*p != q) return mp_error(ctx, MP_ERR_USAGE, "%s: unterminated quote", origin);
        p++;
      } else if (*p == '\\' && p[1]) {
        p++;
        *o++ = *p++;
      } else {
        *o++ = *p++;
      }
    }
    *o++ = '\0';
  }
  return MP_OK;
}

/* The words as flags and values; a launcher's words before pretrain_gpt.py dropped; every
 * flag known (ignored ones noted), any other refused. */
static mp_status parse(mp_ctx *ctx, const char *text, const char *origin, mg_args *a, mp_from_plan *p) {
  const char *w[MG_MAX_TOKENS];
  int n = 0;
  a->buf = malloc(strlen(text) + 1);
  if (a->buf == NULL) return mp_error(ctx, MP_ERR_NOMEM, "out of memory");
  MP_CHECK(split(ctx, text, origin, a->buf, w, &n));
  int i = 0;
  for (int k = 0; k < n; k++) {
    const size_t len = strlen(w[k]);
    if (len >= 15 && strcmp(w[k] + len - 15, "pretrain_gpt.py") == 0) i = k + 1;
  }
  a->n = 0;
  while (i < n) {
    const char *f = w[i++];
    size_t k = 0;
    while (k < sizeof k_flags / sizeof k_flags[0] && strcmp(k_flags[k].flag, f) != 0) k++;
    if (strncmp(f, "--", 2) != 0)
      return mp_error(ctx, MP_ERR_USAGE, "%s: '%s' is not a flag of pretrain_gpt.py", origin, f);
    if (strcmp(f, "--use-torch-fsdp2") == 0)
      return mp_error(ctx, MP_ERR_USAGE, "%s: --use-torch-fsdp2 runs PyTorch's FSDP2 inside Megatron-LM, "
                      "which meshplan does not price; plan FSDP as torchtitan (--from a torchtitan TOML)", origin);
    if (k == sizeof k_flags / sizeof k_flags[0])
      return mp_error(ctx, MP_ERR_USAGE, "%s: %s is not a Megatron-LM core_v0.14.0 flag meshplan reads; it "
                      "may change cost, so it is refused: remove it", origin, f);
    const char *v = NULL;
    int words = 1;
    if (k_flags[k].value) { /* nargs: the words up to the next flag, joined by the first one's NULs */
      if (i >= n || strncmp(w[i], "--", 2) == 0)
        return mp_error(ctx, MP_ERR_USAGE, "%s: %s needs a value", origin, f);
      v = w[i++];
      int more = 0;
      while (i < n && strncmp(w[i], "--", 2) != 0) i++, more++;
      words += more;
      if (more && k_flags[k].role == MG_MAP)
        return mp_error(ctx, MP_ERR_USAGE, "%s: %s %s and %d more: meshplan reads one value there", origin,
                        f, v, more);
    }
    if (k_flags[k].role == MG_IGNORE) {
      mp_from_ignore(p, f);
      continue;
    }
    a->flag[a->n] = f;
    a->nval[a->n] = words;
    a->val[a->n++] = v;
  }
  return MP_OK;
}

/* The last value of flag (argparse's rule), or NULL; has: whether it is given at all. */
static const char *get(const mg_args *a, const char *flag, int *has) {
  const char *v = NULL;
  int h = 0;
  for (int i = 0; i < a->n; i++)
    if (strcmp(a->flag[i], flag) == 0) v = a->val[i], h = 1;
  if (has) *has = h;
  return v;
}
static int has(const mg_args *a, const char *flag) {
  int h = 0;
  (void)get(a, flag, &h);
  return h;
}

/* The last value of a list flag (MG_LIST), its words joined by spaces into buf; NULL when
 * absent. The words lie one after another in a->buf, each ended by its NUL. */
static const char *get_list(const mg_args *a, const char *flag, char *buf, size_t cap) {
  int at = -1;
  for (int i = 0; i < a->n; i++)
    if (strcmp(a->flag[i], flag) == 0) at = i;
  if (at < 0 || a->val[at] == NULL) return NULL;
  size_t u = 0;
  const char *w = a->val[at];
  buf[0] = '\0';
  for (int k = 0; k < a->nval[at] && u < cap; k++, w += strlen(w) + 1)
    u += (size_t)snprintf(buf + u, cap - u, "%s%s", k ? " " : "", w);
  return buf;
}

/* An integer flag (absent: dflt) in lo..hi. */
static mp_status get_int(mp_ctx *ctx, const mg_args *a, const char *origin, const char *flag, int64_t dflt,
                         int64_t lo, int64_t hi, int64_t *out) {
  const char *v = get(a, flag, NULL);
  *out = dflt;
  if (v == NULL) return MP_OK;
  char *end = NULL;
  const long long x = strtoll(v, &end, 10);
  if (end == v || *end || x < lo || x > hi)
    return mp_error(ctx, MP_ERR_USAGE, "%s: %s %s: expected an integer in %lld..%lld", origin, flag, v,
                    (long long)lo, (long long)hi);
  *out = x;
  return MP_OK;
}

/* Megatron-LM's --moe-layer-freq pattern (arguments.py moe_freq_type, a Python list
 * expression of 0s and 1s) for the forms it documents: lists, their sums, and a list or a
 * parenthesised sum times an integer, e.g. "([1]*3+[0]*1)*3". Appends to out[*n] up to cap;
 * returns the rest of the text, or NULL where it is not of that form. */
static const char *freq_sum(const char *s, unsigned char *out, int64_t *n, int64_t cap);
static const char *freq_term(const char *s, unsigned char *out, int64_t *n, int64_t cap) {
  const int64_t start = *n;
  if (*s == '(') {
    s = freq_sum(s + 1, out, n, cap);
    if (s == NULL || *s != ')') return NULL;
    s++;
  } else if (*s == '[') {
    do {
      s++;
      if ((*s != '0' && *s != '1') || *n >= cap) return NULL;
      out[(*n)++] = (unsigned char)(*s++ - '0');
    } while (*s == ',');
    if (*s++ != ']') return NULL;
  } else {
    return NULL;
  }
  while (*s == '*') {
    char *end = NULL;
    const long long k = strtoll(s + 1, &end, 10);
    const int64_t len = *n - start;
    if (end == s + 1 || k < 1 || start + len * k > cap) return NULL;
    for (int64_t r = 1; r < k; r++) memcpy(out + start + r * len, out + start, (size_t)len);
    *n = start + len * k;
    s = end;
  }
  return s;
}
static const char *freq_sum(const char *s, unsigned char *out, int64_t *n, int64_t cap) {
  s = freq_term(s, out, n, cap);
  while (s && *s == '+') s = freq_term(s + 1, out, n, cap);
  return s;
}

/* The experts (--num-experts and the --moe-* shape flags; Megatron-LM's defaults: top-2,
 * the expert width the dense one, every layer an expert layer) and the latent attention
 * (--multi-latent-attention with its defaults: kv rank 32, q/k heads 128 + 64 of RoPE,
 * values 128, q_proj without --q-lora-rank) into s. */
static mp_status read_moe_mla(mp_ctx *ctx, const mg_args *a, const char *origin, mp_model *s) {
  MP_CHECK(get_int(ctx, a, origin, "--num-experts", 0, 1, MP_LIM_EXPERTS, &s->n_experts));
  if (s->n_experts) {
    const char *sc = get(a, "--moe-router-score-function", NULL);
    if (sc && strcmp(sc, "softmax") != 0)
      return mp_error(ctx, MP_ERR_USAGE, "%s: --moe-router-score-function %s: meshplan's router takes a softmax",
                      origin, sc);
    MP_CHECK(get_int(ctx, a, origin, "--moe-router-topk", 2, 1, s->n_experts, &s->top_k));
    MP_CHECK(get_int(ctx, a, origin, "--moe-ffn-hidden-size", s->d_ff, 1, 1 << 24, &s->d_ff_expert));
    MP_CHECK(get_int(ctx, a, origin, "--moe-shared-expert-intermediate-size", 0, 1, 1 << 24, &s->d_ff_shared));
    MP_CHECK(get_int(ctx, a, origin, "--moe-router-num-groups", 0, 1, s->n_experts, &s->n_group));
    MP_CHECK(get_int(ctx, a, origin, "--moe-router-group-topk", s->n_group, 1, s->n_group ? s->n_group : 1,
                     &s->topk_group));
    s->norm_topk_prob = !has(a, "--moe-router-pre-softmax");
    const char *f = get(a, "--moe-layer-freq", NULL);
    if (f == NULL) f = "1";
    int64_t n = 0;
    char *end = NULL;
    const long long every = strchr(f, '[') ? 0 : strtoll(f, &end, 10);
    if (every >= 1 && end && *end == '\0') { /* an int N: layer l is an expert layer when l % N == 0 */
      for (n = 0; n < s->n_layers; n++) s->moe_layer[n] = n % every == 0;
    } else if (every != 0 || !(f = freq_sum(f, s->moe_layer, &n, MP_MAX_LAYERS)) || *f || n != s->n_layers) {
      return mp_error(ctx, MP_ERR_USAGE, "%s: --moe-layer-freq %s: an integer or a pattern of 0s and 1s, one a "
                      "layer (%lld), as ([0]*3+[1]*58)", origin, get(a, "--moe-layer-freq", NULL) ? get(a, "--moe-layer-freq", NULL) : "1",
                      (long long)s->n_layers);
    }
  }
  if (!has(a, "--multi-latent-attention")) return MP_OK;
  MP_CHECK(get_int(ctx, a, origin, "--q-lora-rank", 0, 1, 1 << 20, &s->q_lora_rank));
  MP_CHECK(get_int(ctx, a, origin, "--kv-lora-rank", 32, 1, 1 << 20, &s->kv_lora_rank));
  MP_CHECK(get_int(ctx, a, origin, "--qk-head-dim", 128, 1, 1 << 16, &s->qk_nope_head_dim));
  MP_CHECK(get_int(ctx, a, origin, "--qk-pos-emb-head-dim", 64, 1, 1 << 16, &s->qk_rope_head_dim));
  MP_CHECK(get_int(ctx, a, origin, "--v-head-dim", 128, 1, 1 << 16, &s->v_head_dim));
  s->head_dim = s->qk_nope_head_dim + s->qk_rope_head_dim;
  s->n_kv_heads = s->n_heads;
  return MP_OK;
}

/* The model the shape flags describe, as meshplan's fields (Megatron-LM's defaults where a
 * flag is absent: --ffn-hidden-size 4 x hidden, with --swiglu two thirds of that rounded
 * down to a multiple of 64; --kv-channels hidden / heads; --rotary-base 10000). */
static mp_status read_shape(mp_ctx *ctx, const mg_args *a, const char *origin, mp_model *s) {
  memset(s, 0, sizeof *s);
  int64_t groups = 0;
  MP_CHECK(get_int(ctx, a, origin, "--num-layers", 0, 1, MP_MAX_LAYERS, &s->n_layers));
  MP_CHECK(get_int(ctx, a, origin, "--hidden-size", 0, 1, 1 << 20, &s->d_model));
  MP_CHECK(get_int(ctx, a, origin, "--num-attention-heads", 0, 1, 1 << 16, &s->n_heads));
  if (!s->n_layers || !s->d_model || !s->n_heads)
    return mp_error(ctx, MP_ERR_USAGE, "%s: --num-layers, --hidden-size and --num-attention-heads are needed "
                    "to know the model", origin);
  const int swiglu = has(a, "--swiglu");
  const int64_t ffn = swiglu ? (4 * s->d_model * 2 / 3) / 64 * 64 : 4 * s->d_model;
  MP_CHECK(get_int(ctx, a, origin, "--ffn-hidden-size", ffn, 1, 1 << 24, &s->d_ff));
  MP_CHECK(get_int(ctx, a, origin, "--num-query-groups", 1, 1, s->n_heads, &groups));
  s->n_kv_heads = has(a, "--group-query-attention") ? groups : s->n_heads;
  MP_CHECK(get_int(ctx, a, origin, "--kv-channels", s->d_model / s->n_heads, 1, 1 << 16, &s->head_dim));
  int64_t seq = 0, theta = 0;
  MP_CHECK(get_int(ctx, a, origin, "--seq-length", 0, 1, 1 << 24, &seq));
  MP_CHECK(get_int(ctx, a, origin, "--max-position-embeddings", seq, 1, 1 << 24, &s->max_seq));
  MP_CHECK(get_int(ctx, a, origin, "--vocab-size", 0, 1, 1 << 22, &s->vocab));
  MP_CHECK(get_int(ctx, a, origin, "--rotary-base", 10000, 1, 1LL << 40, &theta));
  s->rope_theta = (double)theta;
  const char *pos = get(a, "--position-embedding-type", NULL), *norm = get(a, "--normalization", NULL);
  const int rope = pos && strcmp(pos, "rope") == 0, rms = norm && strcmp(norm, "RMSNorm") == 0;
  if (rope && rms && swiglu) s->family = MP_FAMILY_LLAMA;
  else if (!rope && !rms && !swiglu && (!pos || strcmp(pos, "learned_absolute") == 0)) s->family = MP_FAMILY_GPT;
  else
    return mp_error(ctx, MP_ERR_USAGE, "%s: --position-embedding-type %s, --normalization %s%s: meshplan "
                    "models rope, RMSNorm and SwiGLU (llama) or learned_absolute, LayerNorm and GeLU (GPT)", origin,
                    pos ? pos : "learned_absolute", norm ? norm : "LayerNorm", swiglu ? ", --swiglu" : "");
  s->bias = !has(a, "--disable-bias-linear");
  s->qkv_bias = has(a, "--add-qkv-bias");
  s->qk_norm = has(a, "--qk-layernorm");
  s->tied_embeddings = !has(a, "--untie-embeddings-and-output-weights");
  return read_moe_mla(ctx, a, origin, s);
}

/* The first expert or latent-attention flag on which model m differs from the shape s, or
 * NULL. Megatron-LM states the shared experts by their whole width alone. */
static const char *differs_moe_mla(const mp_model *m, const mp_model *s) {
  if (mp_model_is_moe(m) != mp_model_is_moe(s) || m->n_experts != s->n_experts) return "--num-experts";
  if (mp_model_is_moe(m)) {
    if (m->d_ff_expert != s->d_ff_expert) return "--moe-ffn-hidden-size";
    if (m->top_k != s->top_k) return "--moe-router-topk";
    if ((m->n_shared_experts > 0 ? m->d_ff_shared : 0) != s->d_ff_shared) return "--moe-shared-expert-intermediate-size";
    if (memcmp(m->moe_layer, s->moe_layer, (size_t)m->n_layers)) return "--moe-layer-freq";
    if (m->norm_topk_prob != s->norm_topk_prob) return "--moe-router-pre-softmax";
    if (m->n_group != s->n_group || (m->n_group && m->topk_group != s->topk_group)) return "--moe-router-num-groups";
  }
  if (mp_model_is_mla(m) != mp_model_is_mla(s)) return "--multi-latent-attention";
  if (!mp_model_is_mla(m)) return NULL;
  if (m->q_lora_rank != s->q_lora_rank) return "--q-lora-rank";
  if (m->kv_lora_rank != s->kv_lora_rank) return "--kv-lora-rank";
  if (m->qk_nope_head_dim != s->qk_nope_head_dim) return "--qk-head-dim";
  if (m->qk_rope_head_dim != s->qk_rope_head_dim) return "--qk-pos-emb-head-dim";
  if (m->v_head_dim != s->v_head_dim) return "--v-head-dim";
  return NULL;
}

/* The first flag on which model m differs from the shape s, or NULL. The dense width counts
 * where a layer is dense. */
static const char *differs(const mp_model *m, const mp_model *s) {
  if (m->sliding_window > 0) return "--num-layers (a model without sliding-window attention)";
  if (m->attn_chunk > 0) return "--num-layers (a model without chunked attention)";
  if (m->n_layers != s->n_layers) return "--num-layers";
  if (m->d_model != s->d_model) return "--hidden-size";
  const char *x = differs_moe_mla(m, s);
  if (x) return x;
  if (m->d_ff != s->d_ff && (!mp_model_is_moe(m) || mp_model_n_moe_layers(m) < m->n_layers)) return "--ffn-hidden-size";
  if (m->n_heads != s->n_heads) return "--num-attention-heads";
  if (m->n_kv_heads != s->n_kv_heads) return "--num-query-groups";
  if (m->head_dim != s->head_dim) return "--kv-channels";
  if (m->max_seq != s->max_seq) return "--max-position-embeddings";
  if (s->vocab && m->vocab != s->vocab) return "--vocab-size";
  if (m->family != s->family) return "--position-embedding-type";
  if (s->family == MP_FAMILY_LLAMA && (int64_t)m->rope_theta != (int64_t)s->rope_theta) return "--rotary-base";
  if (m->bias != s->bias) return "--disable-bias-linear";
  if (m->qkv_bias != s->qkv_bias) return "--add-qkv-bias";
  if (m->qk_norm != s->qk_norm) return "--qk-layernorm";
  if (m->tied_embeddings != s->tied_embeddings) return "--untie-embeddings-and-output-weights";
  return NULL;
}

/* The given model checked against the shape, or the one model of data/models with it. */
static mp_status find_model(mp_ctx *ctx, const mg_args *a, const char *origin, const mp_model *given,
                            mp_from_plan *p) {
  mp_model s;
  MP_CHECK(read_shape(ctx, a, origin, &s));
  if (given) {
    const char *d = differs(given, &s);
    if (d)
      return mp_error(ctx, MP_ERR_USAGE, "%s: %s disagrees with --model %s; the arguments describe another "
                      "model", origin, d, given->name);
    p->model[0] = '\0';
    return MP_OK;
  }
  size_t n = 0;
  const mp_data_entry *e = mp_data_entries(&n);
  char found[512] = "";
  int hits = 0;
  for (size_t i = 0; i < n; i++) {
    mp_model m;
    mp_ctx quiet;
    mp_ctx_init(&quiet);
    if (strcmp(e[i].kind, "models") != 0 || mp_model_load(&quiet, e[i].name, &m) != MP_OK || differs(&m, &s)) continue;
    if (hits++ == 0) snprintf(p->model, sizeof p->model, "%s", e[i].name);
    snprintf(found + strlen(found), sizeof found - strlen(found), "%s%s", hits > 1 ? ", " : "", e[i].name);
  }
  if (hits == 1) return MP_OK;
  return mp_error(ctx, MP_ERR_USAGE, "%s: %s model in data/models has the shape of these arguments (%lld "
                  "layers, hidden %lld, ffn %lld, %lld heads, %lld query groups, %lld positions)%s%s; pass --model M",
                  origin, hits ? "more than one" : "no", (long long)s.n_layers, (long long)s.d_model,
                  (long long)s.d_ff, (long long)s.n_heads, (long long)s.n_kv_heads, (long long)s.max_seq,
                  hits ? ": " : "", found);
}

/* The stack the arguments run (the unfused attention or Megatron-LM's local layers: the
 * megatron-lm profile, Transformer Engine's: megatron-core), and the switches that profile
 * prices, which must be the arguments' own, but for --tp-comm-overlap: a store_true switch,
 * off unless given (megatron/training/arguments.py, core_v0.14.0), so its absence under tp > 1
 * with SP reads as the plan without it (--no-async-tp) and only its presence on a stack that
 * cannot run it is refused. */
static mp_status read_stack(mp_ctx *ctx, const mg_args *a, const char *origin, mp_from_plan *p) {
  const char *be = get(a, "--attention-backend", NULL), *impl = get(a, "--transformer-impl", NULL);
  if ((be && strcmp(be, "unfused") && strcmp(be, "flash") && strcmp(be, "fused") && strcmp(be, "auto")) ||
      (impl && strcmp(impl, "transformer_engine") && strcmp(impl, "local")))
    return mp_error(ctx, MP_ERR_USAGE, "%s: --attention-backend %s, --transformer-impl %s: meshplan prices "
                    "unfused or flash attention", origin, be ? be : "auto", impl ? impl : "transformer_engine");
  const int lm = (be && strcmp(be, "unfused") == 0) || (impl && strcmp(impl, "local") == 0);
  snprintf(p->stack, sizeof p->stack, "%s", lm ? "megatron-lm" : "megatron-core");
  mp_stack_profile prof;
  MP_CHECK(mp_stack_load(ctx, p->stack, &prof));
  const int tp_sp = p->tp > 1 && p->sp > 0;
  /* optim_grads_params turns both overlaps on itself (megatron_fsdp.py, core_v0.14.0) */
  const int mfsdp_overlap = strcmp(p->mfsdp_strategy, "optim_grads_params") == 0;
  const struct {
    const char *flag;
    int priced, given;
  } sw[] = {
      {"--use-distributed-optimizer", prof.dist_opt, has(a, "--use-distributed-optimizer")},
      {"--overlap-grad-reduce", prof.dp_overlap, has(a, "--overlap-grad-reduce") || mfsdp_overlap},
      {"--overlap-param-gather", prof.dp_overlap && prof.dist_opt, has(a, "--overlap-param-gather") || mfsdp_overlap},
      {"--tp-comm-overlap", prof.tp_comm_overlap && tp_sp && has(a, "--tp-comm-overlap"),
       has(a, "--tp-comm-overlap") && tp_sp},
  };
  for (size_t i = 0; i < sizeof sw / sizeof sw[0]; i++)
    if (sw[i].priced != sw[i].given)
      return mp_error(ctx, MP_ERR_USAGE, "%s: %s %s, but meshplan's %s stack (%s) prices it %s; %s it", origin,
                      sw[i].flag, sw[i].given ? "is given" : "is absent", p->stack,
                      lm ? "--attention-backend unfused" : "Transformer Engine's attention", sw[i].priced ? "on" : "off",
                      sw[i].priced ? "add" : "remove");
  p->async_tp = prof.tp_comm_overlap && tp_sp && !has(a, "--tp-comm-overlap") ? -1 : 0;
  /* the cross-entropy's kernels (megatron/core/models/common/language_module/
   * language_module.py): Megatron's eager steps, or with --cross-entropy-loss-fusion its
   * compiled ones (native) or Transformer Engine's (te) */
  const char *ce = get(a, "--cross-entropy-fusion-impl", NULL);
  if (ce && strcmp(ce, "native") != 0 && strcmp(ce, "te") != 0 && has(a, "--cross-entropy-loss-fusion"))
    return mp_error(ctx, MP_ERR_USAGE, "%s: --cross-entropy-fusion-impl %s: meshplan prices Megatron-Core's "
                    "native and Transformer Engine's (te) fused cross-entropy", origin, ce);
  p->ce_fusion = has(a, "--cross-entropy-loss-fusion") ? (ce && strcmp(ce, "te") == 0 ? 2 : 1) : 0;
  p->ddp_average = has(a, "--ddp-average-in-collective");
  p->ddp_no_check = has(a, "--no-check-for-nan-in-loss-and-grad");
  p->ddp_align = has(a, "--align-param-gather");
  p->wgrad_unfused = has(a, "--no-gradient-accumulation-fusion");
  p->grad_bf16 = has(a, "--grad-reduce-in-bf16");
  return get_int(ctx, a, origin, "--ddp-bucket-size", 0, 1, MP_LIM_PARAMS, &p->ddp_bucket);
}

/* --pipeline-model-parallel-layout (megatron/core/transformer/pipeline_parallel_layer_layout.py,
 * core_v0.14.0): every virtual stage's layers; its virtual stages per rank are the layout's
 * stages over pp, which --num-virtual-stages-per-pipeline-rank may only repeat. */
static mp_status read_layout(mp_ctx *ctx, const mg_args *a, const char *origin, const char *layout,
                             mp_from_plan *p) {
  mp_plan_options o;
  mp_plan_options_init(&o);
  if (mp_pp_layout_parse(ctx, layout, &o) != MP_OK) {
    mp_error_prefix(ctx, "%s: --pipeline-model-parallel-layout", origin);
    return MP_ERR_USAGE;
  }
  const int v = o.n_pp_layers / p->pp;
  if (o.n_pp_layers % p->pp || (has(a, "--num-virtual-stages-per-pipeline-rank") && v != p->pp_virtual) ||
      has(a, "--num-layers-per-virtual-pipeline-stage"))
    return mp_error(ctx, MP_ERR_USAGE, "%s: --pipeline-model-parallel-layout has %d stages: a multiple of pp=%d, "
                    "the virtual stages per rank, which the layout sets alone", origin, o.n_pp_layers, p->pp);
  if (o.pp_mtp != p->mtp_layers) /* validate_layer_layout's rule */
    return mp_error(ctx, MP_ERR_USAGE, "%s: --pipeline-model-parallel-layout names %d MTP layers (m) but "
                    "--mtp-num-layers is %lld; Megatron-Core needs them equal", origin, o.pp_mtp,
                    (long long)p->mtp_layers);
  p->pp_virtual = v;
  p->pp_schedule = p->pp > 1 && v > 1 ? MP_PP_INTERLEAVED : MP_PP_1F1B;
  size_t n = 0;
  for (int k = 0; k < o.n_pp_layers; k++) {
    n += (size_t)snprintf(p->pp_layers + n, sizeof p->pp_layers - n, "%s%d", k ? "," : "", o.pp_layers[k]);
    if (n >= sizeof p->pp_layers) return mp_error(ctx, MP_ERR_USAGE, "%s: too many pipeline stages", origin);
  }
  return MP_OK;
}

/* Megatron-LM's uneven first and last stages (--decoder-first-pipeline-num-layers,
 * --decoder-last-pipeline-num-layers; megatron/core/transformer/transformer_block.py, core_v0.14.0:
 * the other stages split the remaining layers evenly) as each stage's layer count. */
static mp_status read_stage_layers(mp_ctx *ctx, const mg_args *a, const char *origin, int64_t layers,
                                   mp_from_plan *p) {
  int64_t first, last;
  MP_CHECK(get_int(ctx, a, origin, "--decoder-first-pipeline-num-layers", 0, 0, MP_MAX_LAYERS, &first));
  MP_CHECK(get_int(ctx, a, origin, "--decoder-last-pipeline-num-layers", 0, 0, MP_MAX_LAYERS, &last));
  p->pp_layers[0] = '\0';
  const char *layout = get(a, "--pipeline-model-parallel-layout", NULL);
  if (layout) {
    if (first || last)
      return mp_error(ctx, MP_ERR_USAGE, "%s: --pipeline-model-parallel-layout and --decoder-first/last-pipeline-"
                      "num-layers both place the layers; give one", origin);
    return read_layout(ctx, a, origin, layout, p);
  }
  if (!first && !last) return MP_OK;
  const int pp = p->pp, middle = pp - (first ? 1 : 0) - (last ? 1 : 0);
  const int64_t rest = layers - first - last;
  if (pp < 2 || p->pp_virtual > 1 || middle < 1 || rest < middle || rest % middle)
    return mp_error(ctx, MP_ERR_USAGE, "%s: --decoder-first/last-pipeline-num-layers: the other %d stages must "
                    "split the remaining %lld layers evenly, without virtual stages (pp=%d)", origin, middle,
                    (long long)rest, pp);
  size_t n = 0;
  for (int s = 0; s < pp; s++) {
    const int64_t k = s == 0 && first ? first : s == pp - 1 && last ? last : rest / middle;
    n += (size_t)snprintf(p->pp_layers + n, sizeof p->pp_layers - n, "%s%lld", s ? "," : "", (long long)k);
    if (n >= sizeof p->pp_layers) return mp_error(ctx, MP_ERR_USAGE, "%s: too many pipeline stages", origin);
  }
  return MP_OK;
}

/* The experts' grid and dispatch (megatron/core/transformer/moe/, core_v0.14.0): each expert
 * split over --expert-tensor-parallel-size ranks (Megatron-LM's default is the tp size;
 * meshplan's etp=N in --mesh, exec/mesh.h; 1: whole on a rank) as grouped GEMMs (--moe-grouped-gemm; without it Megatron-LM loops over its
 * local experts), moved across EP ranks by the alltoall dispatcher or DeepEP's (flex with
 * --moe-enable-deepep; the default allgather dispatcher sends every token to every EP rank). */
static mp_status read_experts(mp_ctx *ctx, const mg_args *a, const char *origin, int64_t tp, int64_t ep,
                              mp_from_plan *p) {
  int64_t etp;
  MP_CHECK(get_int(ctx, a, origin, "--expert-tensor-parallel-size", tp, 1, 1 << 20, &etp));
  if (!has(a, "--num-experts")) {
    if (ep > 1 || has(a, "--moe-enable-deepep") || has(a, "--overlap-moe-expert-parallel-comm"))
      return mp_error(ctx, MP_ERR_USAGE, "%s: --expert-model-parallel-size, --moe-enable-deepep or "
                      "--overlap-moe-expert-parallel-comm without --num-experts: a dense model has no experts", origin);
    return MP_OK;
  }
  if (etp > 1) p->etp = (int)etp; /* the expert grid [edp, ep, etp] (parallel_state.py) */
  if (!has(a, "--moe-grouped-gemm"))
    return mp_error(ctx, MP_ERR_USAGE, "%s: no --moe-grouped-gemm: Megatron-LM would loop over its local experts, "
                    "meshplan prices them as grouped GEMMs; add --moe-grouped-gemm", origin);
  const char *d = get(a, "--moe-token-dispatcher-type", NULL);
  if (d == NULL) d = "allgather"; /* arguments.py's default */
  const int deepep = has(a, "--moe-enable-deepep");
  if (deepep != (strcmp(d, "flex") == 0) || (ep > 1 && strcmp(d, "alltoall") != 0 && !deepep))
    return mp_error(ctx, MP_ERR_USAGE, "%s: --moe-token-dispatcher-type %s%s: meshplan prices the alltoall "
                    "dispatcher, or flex with --moe-enable-deepep", origin, d, deepep ? " --moe-enable-deepep" : "");
  p->moe_deepep = deepep;
  p->moe_a2a_overlap = has(a, "--overlap-moe-expert-parallel-comm");
  const char *cf = get(a, "--moe-expert-capacity-factor", NULL);
  char *end = NULL;
  if (cf && !(strtod(cf, &end) > 0.0 && end != cf && *end == '\0'))
    return mp_error(ctx, MP_ERR_USAGE, "%s: --moe-expert-capacity-factor %s: a positive number", origin, cf);
  if (cf) snprintf(p->capacity_factor, sizeof p->capacity_factor, "%s", cf);
  p->pad_to_capacity = has(a, "--moe-pad-expert-input-to-capacity");
  return MP_OK;
}

/* --cp-comm-type (nargs '+': one type for every layer, or one a layer) into p->cp_comm_type:
 * a single type, or the same one for every layer; per-layer mixes are refused by name. */
static mp_status read_cp_comm(mp_ctx *ctx, const mg_args *a, const char *origin, mp_from_plan *p) {
  char list[256];
  const char *types = get_list(a, "--cp-comm-type", list, sizeof list);
  if (types == NULL) return MP_OK;
  const size_t first = strcspn(types, " ");
  for (const char *w = types; *w; w += strcspn(w, " "), w += *w == ' ')
    if (strcspn(w, " ") != first || strncmp(w, types, first) != 0)
      return mp_error(ctx, MP_ERR_USAGE, "%s: --cp-comm-type %s: a type a layer is not modelled; give one "
                      "type for every layer", origin, types);
  snprintf(p->cp_comm_type, sizeof p->cp_comm_type, "%.*s", (int)first, types);
  mp_cp_comm c;
  if (!mp_cp_comm_parse(p->cp_comm_type, &c))
    return mp_error(ctx, MP_ERR_USAGE, "%s: --cp-comm-type %s: choose p2p, all_gather, a2a or a2a+p2p", origin,
                    p->cp_comm_type);
  return MP_OK;
}

/* Megatron FSDP (--use-megatron-fsdp or --use-custom-fsdp): the data parallelism over
 * dp_shard, with its --data-parallel-sharding-strategy (Megatron's default no_shard, which
 * simulate then refuses, pointing to dp_replicate) and --fsdp-double-buffer;
 * --num-distributed-optimizer-instances N its hybrid sharding, dp_replicate = N instances of
 * dp_shard = dp / N (parallel_state.py at core_v0.14.0 cuts the dp x cp ranks into N
 * consecutive intra-instance groups, the inter-instance group striding them). Without
 * FSDP the same flag is the distributed optimizer's instances: the mesh's dopt=N. */
static mp_status read_megatron_fsdp(mp_ctx *ctx, const mg_args *a, const char *origin, mp_from_plan *p) {
  const char *s = get(a, "--data-parallel-sharding-strategy", NULL);
  int64_t inst;
  MP_CHECK(get_int(ctx, a, origin, "--num-distributed-optimizer-instances", 1, 1, 1 << 20, &inst));
  if (!has(a, "--use-megatron-fsdp") && !has(a, "--use-custom-fsdp")) {
    if (s || has(a, "--fsdp-double-buffer"))
      return mp_error(ctx, MP_ERR_USAGE, "%s: --data-parallel-sharding-strategy and --fsdp-double-buffer are "
                      "Megatron FSDP's: add --use-megatron-fsdp or drop them", origin);
    /* the distributed optimizer's instances: the mesh's dopt over dp_replicate (exec/mesh.h) */
    if (inst > 1 && !has(a, "--use-distributed-optimizer"))
      return mp_error(ctx, MP_ERR_USAGE, "%s: --num-distributed-optimizer-instances %lld without "
                      "--use-distributed-optimizer (Megatron asserts it, distributed_data_parallel.py): "
                      "add it or drop the instances", origin, (long long)inst);
    if (inst > 1 && p->dp_replicate % inst)
      return mp_error(ctx, MP_ERR_USAGE, "%s: --num-distributed-optimizer-instances %lld does not divide the "
                      "data parallelism %d (an instance that splits a cp group is not modelled)", origin,
                      (long long)inst, p->dp_replicate);
    p->dopt = inst > 1 ? (int)inst : 0;
    return MP_OK;
  }
  if (p->dp_replicate % inst)
    return mp_error(ctx, MP_ERR_USAGE, "%s: --num-distributed-optimizer-instances %lld does not divide the "
                    "data parallelism %d%s", origin, (long long)inst, p->dp_replicate,
                    ((int64_t)p->dp_replicate * p->cp) % inst ? " x cp, as Megatron asserts (parallel_state.py)"
                                                              : " (a cp group split between instances is not "
                                                                "modelled)");
  mp_mfsdp_strategy k = MP_MFSDP_NO_SHARD;
  if (s && !mp_mfsdp_strategy_parse(s, &k))
    return mp_error(ctx, MP_ERR_USAGE, "%s: --data-parallel-sharding-strategy %s: choose optim_grads_params, "
                    "optim_grads, optim or no_shard", origin, s);
  snprintf(p->mfsdp_strategy, sizeof p->mfsdp_strategy, "%s", mp_mfsdp_strategy_name(k));
  p->fsdp_double_buffer = has(a, "--fsdp-double-buffer");
  p->dp_shard = p->dp_replicate / (int)inst;
  p->dp_replicate = (int)inst;
  return MP_OK;
}

/* tp, pp (with its virtual stages), cp and the data parallelism that is the rest of world. */
static mp_status read_parallel(mp_ctx *ctx, const mg_args *a, const char *origin, int world, int64_t layers,
                               mp_from_plan *p) {
  int64_t tp, pp, cp, ep, v, lpv;
  MP_CHECK(get_int(ctx, a, origin, "--tensor-model-parallel-size", 1, 1, 1 << 20, &tp));
  MP_CHECK(get_int(ctx, a, origin, "--pipeline-model-parallel-size", 1, 1, 1 << 20, &pp));
  MP_CHECK(get_int(ctx, a, origin, "--context-parallel-size", 1, 1, 1 << 20, &cp));
  MP_CHECK(get_int(ctx, a, origin, "--expert-model-parallel-size", 1, 1, 1 << 20, &ep));
  MP_CHECK(get_int(ctx, a, origin, "--num-virtual-stages-per-pipeline-rank", 1, 1, MP_MAX_LAYERS, &v));
  MP_CHECK(get_int(ctx, a, origin, "--num-layers-per-virtual-pipeline-stage", 0, 1, MP_MAX_LAYERS, &lpv));
  MP_CHECK(read_cp_comm(ctx, a, origin, p));
  if (lpv && (layers % (pp * lpv) || has(a, "--num-virtual-stages-per-pipeline-rank")))
    return mp_error(ctx, MP_ERR_USAGE, "%s: --num-layers-per-virtual-pipeline-stage %lld: give it alone, "
                    "dividing the %lld layers over pp=%lld", origin, (long long)lpv, (long long)layers, (long long)pp);
  if (lpv) v = layers / (pp * lpv);
  if (world <= 0 || world % (tp * pp * cp))
    return mp_error(ctx, MP_ERR_USAGE, "%s: Megatron-LM's data parallelism is the world over tp x pp x cp "
                    "(%lld): give --gpus N or --cluster C with a multiple of it", origin, (long long)(tp * pp * cp));
  MP_CHECK(read_experts(ctx, a, origin, tp, ep, p));
  p->tp = (int)tp, p->pp = (int)pp, p->cp = (int)cp, p->ep = (int)ep, p->dp_shard = 1;
  p->dp_replicate = (int)(world / (tp * pp * cp));
  MP_CHECK(read_megatron_fsdp(ctx, a, origin, p));
  p->pp_schedule = pp > 1 && v > 1 ? MP_PP_INTERLEAVED : MP_PP_1F1B;
  p->pp_virtual = pp > 1 && v > 1 ? (int)v : 1;
  p->sp = tp > 1 ? has(a, "--sequence-parallel") : -1;
  return read_stage_layers(ctx, a, origin, layers, p);
}

/* --recompute-* and --fp8-* as meshplan's policy, recipe and float8 weights: selective granularity with its
 * modules (core_attn, Megatron-LM's default, is selective-core; layernorm, mla_up_proj and
 * moe_act the output-discarding modules, mlp, moe and shared_experts the checkpointed ones,
 * exec/plan.h), or full recompute under Megatron-Core's method (block or uniform, with its layer count). */
static mp_status read_ac_fp8(mp_ctx *ctx, const mg_args *a, const char *origin, mp_from_plan *p) {
  char list[128];
  const char *g = get(a, "--recompute-granularity", NULL), *m = get(a, "--recompute-method", NULL);
  const char *mods = get_list(a, "--recompute-modules", list, sizeof list);
  const char *n = get(a, "--recompute-num-layers", NULL);
  if (!g && (m || n || mods))
    return mp_error(ctx, MP_ERR_USAGE, "%s: --recompute-method, --recompute-num-layers or "
                    "--recompute-modules without --recompute-granularity", origin);
  if (!g) {
    snprintf(p->ac, sizeof p->ac, "none");
  } else if (strcmp(g, "selective") == 0 && !m && !n) {
    mp_plan_options o;
    mp_plan_options_init(&o);
    o.ac = MP_AC_NONE;
    if (mp_recompute_modules_parse(ctx, mods ? mods : "core_attn", &o) != MP_OK) {
      mp_error_prefix(ctx, "%s: --recompute-modules", origin);
      return MP_ERR_USAGE;
    }
    snprintf(p->ac, sizeof p->ac, "%s", o.ac == MP_AC_SELECTIVE_CORE ? "selective-core" : "none");
    mp_recompute_modules_format(o.recompute_modules, p->recompute_modules, sizeof p->recompute_modules);
    for (char *c = p->recompute_modules; *c; c++)
      if (*c == ' ') *c = ','; /* the command line's list */
  } else if (strcmp(g, "full") == 0 && m && (!strcmp(m, "uniform") || !strcmp(m, "block")) && n && !mods) {
    /* uniform 1 is every layer checkpointed alone: meshplan's full */
    char *end = NULL;
    const long k = strtol(n, &end, 10);
    if (end == n || *end || k < 1 || k > MP_MAX_LAYERS)
      return mp_error(ctx, MP_ERR_USAGE, "%s: --recompute-num-layers %s: expected a layer count from 1 to %d",
                      origin, n, MP_MAX_LAYERS);
    snprintf(p->ac, sizeof p->ac, "full");
    if (strcmp(m, "uniform") || k > 1) {
      snprintf(p->recompute_method, sizeof p->recompute_method, "%s", m);
      p->recompute_num_layers = (int)k;
    }
  } else {
    return mp_error(ctx, MP_ERR_USAGE, "%s: --recompute-granularity %s%s%s%s%s: meshplan prices selective "
                    "recompute of its seven modules, and full recompute with --recompute-method block or "
                    "uniform and --recompute-num-layers", origin, g,
                    m ? " --recompute-method " : "", m ? m : "", n ? " --recompute-num-layers " : "", n ? n : "");
  }
  const char *fmt = get(a, "--fp8-format", NULL), *recipe = get(a, "--fp8-recipe", NULL);
  const char *fp4 = get(a, "--fp4-format", NULL); /* core_v0.15.0: e2m1, recipe nvfp4 alone */
  if (fp4 && (fmt || strcmp(fp4, "e2m1") != 0 || has(a, "--fp4-param-gather")))
    return mp_error(ctx, MP_ERR_USAGE, "%s: --fp4-format %s: meshplan prices e2m1 under the nvfp4 recipe, "
                    "without --fp8-format (Megatron-Core refuses both) or --fp4-param-gather", origin, fp4);
  if (!fmt && !fp4 && has(a, "--fp8-dot-product-attention"))
    return mp_error(ctx, MP_ERR_USAGE, "%s: --fp8-dot-product-attention without --fp8-format or --fp4-format: "
                    "Transformer Engine's float8 attention runs under a float8 recipe; add one", origin);
  p->fp8_dpa = has(a, "--fp8-dot-product-attention");
  if (fp4) {
    snprintf(p->fp8, sizeof p->fp8, "nvfp4");
    return MP_OK;
  }
  if (!fmt && has(a, "--fp8-param-gather"))
    return mp_error(ctx, MP_ERR_USAGE, "%s: --fp8-param-gather without --fp8-format: Megatron-Core refuses it "
                    "(fp8_param must be used together with fp8 mode); add --fp8-format hybrid", origin);
  if (!fmt) return MP_OK;
  if (strcmp(fmt, "hybrid") != 0)
    return mp_error(ctx, MP_ERR_USAGE, "%s: --fp8-format %s: meshplan prices hybrid (E4M3 forward, E5M2 "
                    "gradients)", origin, fmt);
  if (!recipe) recipe = "delayed"; /* arguments.py's default */
  if (strcmp(recipe, "tensorwise") && strcmp(recipe, "delayed") && strcmp(recipe, "mxfp8") && strcmp(recipe, "blockwise"))
    return mp_error(ctx, MP_ERR_USAGE, "%s: --fp8-recipe %s: tensorwise, delayed, mxfp8 or blockwise", origin,
                    recipe);
  snprintf(p->fp8, sizeof p->fp8, "%s", recipe);
  p->fp8_param_gather = has(a, "--fp8-param-gather");
  return MP_OK;
}

/* --enable-cuda-graph and --external-cuda-graph (core_v0.14.0), or --cuda-graph-impl local and
 * transformer_engine (core_v0.16.0), with --cuda-graph-scope (megatron/training/arguments.py,
 * transformer_config.py) as meshplan's scope (exec/plan.h, mp_cuda_graphs): Megatron's own
 * graphs are per layer unless the scope is full_iteration; Transformer Engine's per layer, or
 * the attention alone (attn), or on through a MoE layer's router (attn moe_router, with
 * moe_preprocess). Both at once Megatron refuses; Transformer Engine's with full_iteration
 * captures nothing Megatron defines; the local moe_router graphs (a router graph and a
 * postprocess graph, MoETransformerLayer) meshplan does not price. */
static mp_status read_cuda_graphs(mp_ctx *ctx, const mg_args *a, const char *origin, mp_from_plan *p) {
  const char *impl = get(a, "--cuda-graph-impl", NULL);
  if (impl && strcmp(impl, "none") && strcmp(impl, "local") && strcmp(impl, "transformer_engine"))
    return mp_error(ctx, MP_ERR_USAGE, "%s: --cuda-graph-impl %s: choose none, local or transformer_engine", origin, impl);
  const int local = has(a, "--enable-cuda-graph") || (impl && strcmp(impl, "local") == 0);
  const int external = has(a, "--external-cuda-graph") || (impl && strcmp(impl, "transformer_engine") == 0);
  char list[96];
  const char *given = get_list(a, "--cuda-graph-scope", list, sizeof list), *scope = given ? given : "full";
  static const char *const k_scopes[] = {"full", "attn", "full_iteration", "attn moe_router",
                                         "attn moe_router moe_preprocess"};
  int k = 0;
  while (k < 5 && strcmp(scope, k_scopes[k])) k++;
  if (k == 5)
    return mp_error(ctx, MP_ERR_USAGE, "%s: --cuda-graph-scope %s: choose full, attn, full_iteration, "
                    "'attn moe_router' or 'attn moe_router moe_preprocess'", origin, scope);
  if (local && external)
    return mp_error(ctx, MP_ERR_USAGE, "%s: --enable-cuda-graph and --external-cuda-graph: Megatron-LM refuses "
                    "both at once; give one", origin);
  if (external && k == 2)
    return mp_error(ctx, MP_ERR_USAGE, "%s: --external-cuda-graph captures layers (scope full or attn); the "
                    "full iteration is --enable-cuda-graph --cuda-graph-scope full_iteration", origin);
  if (local && k >= 3)
    return mp_error(ctx, MP_ERR_USAGE, "%s: --cuda-graph-scope %s with Megatron's local graphs: meshplan prices "
                    "the moe_router scopes as Transformer Engine's (--cuda-graph-impl transformer_engine)", origin, scope);
  const char *const names[] = {"layers", external ? "attn" : "layers", "iteration", "attn+moe_router",
                               "attn+moe_router+moe_preprocess"};
  snprintf(p->cuda_graphs, sizeof p->cuda_graphs, "%s", local || external ? names[k] : "");
  return MP_OK;
}

mp_status mp_from_megatron(mp_ctx *ctx, const char *text, const char *origin, int world, const mp_model *given,
                           mp_from_plan *p) {
  p->framework = "Megatron-LM core_v0.14.0";
  mg_args a;
  memset(&a, 0, sizeof a);
  mp_status st = parse(ctx, text, origin, &a, p);
  if (st == MP_OK) st = find_model(ctx, &a, origin, given, p);
  int64_t layers = 0;
  if (st == MP_OK) st = get_int(ctx, &a, origin, "--num-layers", 0, 1, MP_MAX_LAYERS, &layers);
  /* MTP modules: Megatron-Core builds none without the flag, whatever the model file says */
  if (st == MP_OK) st = get_int(ctx, &a, origin, "--mtp-num-layers", 0, 0, MP_MAX_LAYERS - layers, &p->mtp_layers);
  if (st == MP_OK) st = read_parallel(ctx, &a, origin, world, layers, p);
  if (st == MP_OK)
    st = get_int(ctx, &a, origin, "--cpu-offloading-num-layers", 0, 0, MP_MAX_LAYERS, &p->cpu_offload_layers);
  if (st == MP_OK) st = read_stack(ctx, &a, origin, p);
  if (st == MP_OK) st = read_ac_fp8(ctx, &a, origin, p);
  if (st == MP_OK) st = read_cuda_graphs(ctx, &a, origin, p);
  if (st == MP_OK) st = get_int(ctx, &a, origin, "--seq-length", 0, 1, 1 << 24, &p->seq);
  if (st == MP_OK && p->seq == 0) st = mp_error(ctx, MP_ERR_USAGE, "%s: --seq-length is needed", origin);
  if (st == MP_OK) st = get_int(ctx, &a, origin, "--micro-batch-size", 1, 1, 1 << 24, &p->micro_batch);
  const int64_t dp_mb = (int64_t)p->dp_replicate * p->dp_shard * p->micro_batch;
  if (st == MP_OK) st = get_int(ctx, &a, origin, "--global-batch-size", dp_mb, 1, 1 << 24, &p->global_batch);
  if (st == MP_OK && p->global_batch % dp_mb)
    st = mp_error(ctx, MP_ERR_USAGE, "%s: --global-batch-size %lld is not a multiple of --micro-batch-size x "
                  "data-parallel size (%lld)", origin, (long long)p->global_batch, (long long)dp_mb);
  p->reshard = -1; /* DDP: nothing to reshard */
  free(a.buf);
  return st;
}
