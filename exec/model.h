/* Model specification: the architecture of a transformer, loaded from meshplan's JSON
 * (data/models/<name>.json) or from a Hugging Face config.json.
 *
 * Families:
 *   gpt   : LayerNorm (with bias), learned positions, GELU MLP (up, down), multi-head
 *           attention, biases on every Linear (GPT-2).
 *   llama : RMSNorm, RoPE, SwiGLU MLP (gate, up, down), grouped-query attention, no biases
 *           (Qwen2: q/k/v biases; Qwen3: per-head RMSNorm on q and k).
 * The dense MLP's activation and the norms' kind take the family's unless the file names
 * them ("mlp", "norm"): Nemotron-4 (arXiv 2402.16819 sec. 2) is the llama family with a
 * squared-ReLU MLP (up, down) and LayerNorms.
 * Mixture-of-experts is built on the llama family: routed experts of size d_ff_expert,
 * optional shared experts, a router Linear [n_experts, d_model], top-k softmax routing.
 * Multi-head latent attention (MLA; DeepSeek-V2, arXiv 2405.04434 section 2.1, and V3,
 * arXiv 2412.19437) replaces q/k/v on the llama family when kv_lora_rank > 0:
 *   q   q_lora_rank > 0: q_a_proj [q_lora_rank, H] -> q_a_layernorm [q_lora_rank] ->
 *       q_b_proj [n_heads x (qk_nope + qk_rope), q_lora_rank]; q_lora_rank == 0: q_proj
 *       [n_heads x (qk_nope + qk_rope), H]
 *   kv  kv_a_proj_with_mqa [kv_lora_rank + qk_rope, H] -> kv_a_layernorm [kv_lora_rank] on
 *       the latent -> kv_b_proj [n_heads x (qk_nope + v_head_dim), kv_lora_rank]; the rope
 *       part is one key head shared by every head
 *   o   o_proj [H, n_heads x v_head_dim]
 * head_dim is then the query/key head, qk_nope + qk_rope, and n_kv_heads == n_heads (the
 * decompressed keys and values are per head).
 *
 * Invariant after a successful load: every size is positive and within the bounds of
 * common/limits.h, n_kv_heads divides n_heads, and moe_layer[l] is set exactly for the
 * layers whose MLP is a MoE. */
#ifndef MP_EXEC_MODEL_H
#define MP_EXEC_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "common/limits.h"
#include "common/status.h"

struct cJSON;

#ifdef __cplusplus
extern "C" {
#endif

#define MP_MAX_LAYERS 512
#define MP_NAME_MAX 96

typedef enum mp_family { MP_FAMILY_GPT = 0, MP_FAMILY_LLAMA = 1 } mp_family;

/* The dense MLP's activation, meshplan's key "mlp" (MP_MLP_FAMILY: the family's own, gpt
 * GELU, llama SwiGLU; mp_model_mlp resolves it). SwiGLU is gated (gate, up, down: 3 H d_ff
 * weights); GELU and squared ReLU are not (up, down: 2 H d_ff). Squared ReLU, relu(x)^2, is
 * Nemotron-4's (arXiv 2402.16819 sec. 2; So et al. 2021, Primer). Routed and shared experts
 * are SwiGLU whatever this says (a MoE model keeps the family's MLP). */
typedef enum mp_mlp { MP_MLP_FAMILY = 0, MP_MLP_SWIGLU, MP_MLP_GELU, MP_MLP_SQUARED_RELU } mp_mlp;
/* The norms' kind, meshplan's key "norm" (MP_NORM_FAMILY: gpt LayerNorm, llama RMSNorm;
 * mp_model_norm resolves it). A LayerNorm has a weight and a bias (Megatron-Core's
 * LayerNorm, Nemotron-4's LayerNorm1P), except in a gpt model with bias false (GPT-2's
 * bias=False variant has neither Linear nor LayerNorm biases); an RMSNorm has a weight. */
typedef enum mp_norm { MP_NORM_FAMILY = 0, MP_NORM_RMS, MP_NORM_LAYER } mp_norm;

/* The model's fields, one row each; mp_model's members are its rows. Derived from it:
 * meshplan's format read and written (data/models/README.md; mp_model_to_json), the ranges
 * mp_model_validate checks, the Hugging Face keys the llama-family readers and the export
 * use, and the field-by-field comparisons of a checkpoint's or a config's model with the
 * model given. What differs per consumer stays with it: which fields a comparison checks
 * and in what order, the rules between fields, each architecture's own key names.
 *
 *   field    the C member, and meshplan's JSON key (the same word)
 *   type     I64 (int64_t), BOOL (int, 0 or 1; JSON true or false) or F64 (double)
 *   obj      where meshplan's format has the key: TOP (the model object), MLA (its "mla"
 *            object), MOE (its "moe" object), MAMBA (its "mamba" object; in a Hugging Face
 *            nemotron_h config the top level)
 *   req      1: the key is required in its object; 0: absent or null gives the default
 *   default  an expression of m, the model being read (the rows before it are read)
 *   lo, hi   the accepted range (common/limits.h gives each bound's reason); ends: CLOSED
 *            [lo, hi] or OPEN_LO (lo, hi]
 *   check    where mp_model_validate checks the range: FIRST (every model, before any rule,
 *            in table order), MLA (models with MLA, in table order), MOE (MoE models,
 *            likewise), MAMBA (hybrid models with Mamba layers), RULE (by name, where the rules around it need it), NONE (a flag, or
 *            top_k, whose rule 1..n_experts has its own message)
 *   saved    1: mp_model_to_json writes it (the checkpoint manifest's model); 0: it does not:
 *            multi-head latent attention, which the runtime does not train, and
 *            sliding_window, which the manifest has never recorded (a model read back from
 *            a checkpoint has no window), and attn_chunk, which the runtime does not train
 *   hf       its key in Hugging Face's llama-family configs (LlamaConfig's names, which
 *            Mistral, Qwen2/3, Mixtral and DeepSeek-V2/V3 share where they have the field),
 *            or NULL where the architectures name it differently (each reader names it)
 *
 * The rows are in the order meshplan's format reads them: the attention's sizes, then
 * "mla" (whose head parts give head_dim's default), then the rest; in "moe",
 * first_dense_layers and layer_freq (which give moe_layer, not a row) are read between
 * d_ff_shared and aux_loss_coef. */
/* clang-format off */
#define MP_MODEL_FIELDS(F)                                                                                                                                                      \
  /* field            type  obj  req  default                     lo  hi                     ends     check  saved  hf                            meaning */                    \
  F(vocab,            I64,  TOP, 1,   0,                          1,  MP_LIM_VOCAB,          CLOSED,  FIRST, 1,     "vocab_size")              /* tokens in the vocabulary   */ \
  F(d_model,          I64,  TOP, 1,   0,                          1,  MP_LIM_D_MODEL,        CLOSED,  FIRST, 1,     "hidden_size")             /* hidden size H              */ \
  F(n_layers,         I64,  TOP, 1,   0,                          1,  MP_MAX_LAYERS,         CLOSED,  FIRST, 1,     "num_hidden_layers")       /* transformer blocks L       */ \
  F(n_heads,          I64,  TOP, 1,   0,                          1,  MP_LIM_HEADS,          CLOSED,  FIRST, 1,     "num_attention_heads")     /* query heads                */ \
  F(n_kv_heads,       I64,  TOP, 0,   m->n_heads,                 1,  m->n_heads,            CLOSED,  FIRST, 1,     "num_key_value_heads")     /* key/value heads            */ \
  /* multi-head latent attention (kv_lora_rank == 0: none); the head parts are per head */                                                                                      \
  F(q_lora_rank,      I64,  MLA, 0,   0,                          0,  MP_LIM_D_MODEL,        CLOSED,  MLA,   1,     "q_lora_rank")             /* query latent (0: q_proj)   */ \
  F(kv_lora_rank,     I64,  MLA, 1,   0,                          0,  MP_LIM_D_MODEL,        CLOSED,  RULE,  1,     "kv_lora_rank")            /* key/value latent           */ \
  F(qk_nope_head_dim, I64,  MLA, 1,   0,                          1,  MP_LIM_HEAD_DIM,       CLOSED,  MLA,   1,     "qk_nope_head_dim")        /* query/key part, no RoPE    */ \
  F(qk_rope_head_dim, I64,  MLA, 1,   0,                          2,  MP_LIM_HEAD_DIM,       CLOSED,  MLA,   1,     "qk_rope_head_dim")        /* ... with RoPE (shared key) */ \
  F(v_head_dim,       I64,  MLA, 1,   0,                          1,  MP_LIM_HEAD_DIM,       CLOSED,  MLA,   1,     "v_head_dim")              /* value head width           */ \
  /* head_dim's default, d_model / n_heads or MLA's qk_nope + qk_rope, is set before its row */                                                                                 \
  F(head_dim,         I64,  TOP, 0,   m->head_dim,                1,  MP_LIM_HEAD_DIM,       CLOSED,  FIRST, 1,     "head_dim")                /* query/key head width       */ \
  F(d_ff,             I64,  TOP, 0,   0,                          0,  MP_LIM_D_FF,           CLOSED,  RULE,  1,     "intermediate_size")       /* dense MLP hidden size      */ \
  F(max_seq,          I64,  TOP, 0,   2048,                       1,  MP_LIM_SEQ,            CLOSED,  FIRST, 1,     "max_position_embeddings") /* context length             */ \
  F(tied_embeddings,  BOOL, TOP, 0,   m->family == MP_FAMILY_GPT, 0,  1,                     CLOSED,  NONE,  1,     "tie_word_embeddings")     /* output = tok_embeddings    */ \
  F(bias,             BOOL, TOP, 0,   m->family == MP_FAMILY_GPT, 0,  1,                     CLOSED,  NONE,  1,     NULL)                      /* gpt: biases everywhere     */ \
  F(qkv_bias,         BOOL, TOP, 0,   0,                          0,  1,                     CLOSED,  NONE,  1,     "attention_bias")          /* Qwen2: q/k/v biases only   */ \
  F(qk_norm,          BOOL, TOP, 0,   0,                          0,  1,                     CLOSED,  NONE,  1,     NULL)                      /* Qwen3: RMSNorm on q and k  */ \
  /* sliding_window > 0: a query attends to the last sliding_window positions, itself included */                                                                               \
  /* (Mistral 7B, Jiang et al. 2023); 0: to the whole causal prefix */                                                                                                          \
  F(sliding_window,   I64,  TOP, 0,   0,                          0,  MP_LIM_SEQ,            CLOSED,  FIRST, 0,     "sliding_window")          /* attention window           */ \
  /* window_attn_skip_freq N > 0 with a sliding_window: every N-th block (1-based: N, 2N, ...) */                                                                                 \
  /* attends to the whole causal prefix (Megatron-Core's window_attn_skip_freq, utils.py */                                                                                      \
  /* is_layer_window_attention at core_v0.19.0; gpt-oss: 2); 0: every block windowed */                                                                                          \
  F(window_attn_skip_freq, I64, TOP, 0, 0,                        0,  MP_MAX_LAYERS,         CLOSED,  FIRST, 0,     NULL)                      /* full-attention block freq  */ \
  /* attn_chunk > 0: chunked attention (Llama 4, Hugging Face attention_chunk_size): three of */                                                                                \
  /* every four blocks attend within chunks of attn_chunk positions, the fourth (without RoPE) */                                                                                \
  /* to the whole prefix; modelled where the chunk holds the sequence (mp_model_check_step) */                                                                                   \
  F(attn_chunk,       I64,  TOP, 0,   0,                          0,  MP_LIM_SEQ,            CLOSED,  FIRST, 0,     NULL)                      /* attention chunk            */ \
  F(norm_eps,         F64,  TOP, 0,   1e-5,                       0,  1,                     OPEN_LO, RULE,  1,     "rms_norm_eps")            /* RMSNorm/LayerNorm epsilon  */ \
  F(rope_theta,       F64,  TOP, 0,   10000.0,                    0,  MP_LIM_ROPE_THETA,     OPEN_LO, RULE,  1,     "rope_theta")              /* RoPE base (llama)          */ \
  /* multi-token prediction (DeepSeek-V3, arXiv 2412.19437 sec. 2.2): MTP modules after the */                                                                                  \
  /* last block, each an enorm and hnorm, eh_proj [H, 2H], one block of the last block's kind, */                                                                                 \
  /* its own final norm, the shared output head and a second loss; 0: none */                                                                                                     \
  F(mtp_layers,       I64,  TOP, 0,   0,                          0,  MP_MAX_LAYERS - m->n_layers, CLOSED, FIRST, 0, NULL)                  /* MTP depth D                */ \
  /* mixture of experts (n_experts == 0: dense) */                                                                                                                              \
  F(n_experts,        I64,  MOE, 1,   0,                          0,  MP_LIM_EXPERTS,        CLOSED,  RULE,  1,     NULL)                      /* routed experts per layer   */ \
  F(top_k,            I64,  MOE, 1,   0,                          1,  m->n_experts,          CLOSED,  NONE,  1,     "num_experts_per_tok")     /* experts per token          */ \
  F(d_ff_expert,      I64,  MOE, 1,   0,                          1,  MP_LIM_D_FF,           CLOSED,  MOE,   1,     NULL)                      /* routed expert hidden size  */ \
  F(n_shared_experts, I64,  MOE, 0,   0,                          0,  MP_LIM_SHARED_EXPERTS, CLOSED,  MOE,   1,     "n_shared_experts")        /* experts every token uses   */ \
  F(d_ff_shared,      I64,  MOE, 0,   0,                          0,  MP_LIM_D_FF,           CLOSED,  MOE,   1,     NULL)                      /* all shared experts' width  */ \
  F(aux_loss_coef,    F64,  MOE, 0,   0.01,                       0,  1,                     CLOSED,  RULE,  1,     NULL)                      /* load-balancing loss        */ \
  F(norm_topk_prob,   BOOL, MOE, 0,   1,                          0,  1,                     CLOSED,  NONE,  1,     "norm_topk_prob")          /* renormalise top-k weights  */ \
  /* group-limited routing (DeepSeek-V3's node-limited routing, arXiv 2412.19437 sec. 2.1.2): */                                                                                \
  /* the experts in n_group equal groups, a token's top_k taken from its best topk_group groups; 0: none */                                                                       \
  F(n_group,          I64,  MOE, 0,   0,                          0,  m->n_experts,          CLOSED,  MOE,   0,     "n_group")                 /* expert groups (0: none)    */ \
  F(topk_group,       I64,  MOE, 0,   m->n_group,                 0,  m->n_group,            CLOSED,  MOE,   0,     "topk_group")              /* groups a token may use     */ \
  /* the Mamba-2 mixer of a hybrid model's M layers (Dao and Gu 2024, arXiv 2405.21060; Hugging */                                                                                \
  /* Face NemotronHConfig's keys; Megatron-Core's MambaMixer, mamba_mixer.py at core_v0.14.0) */                                                                                  \
  F(ssm_state_size,   I64,  MAMBA, 1, 0,                          1,  MP_LIM_HEAD_DIM,       CLOSED,  MAMBA, 1,     "ssm_state_size")          /* SSM state N per head       */ \
  F(mamba_num_heads,  I64,  MAMBA, 1, 0,                          1,  MP_LIM_HEADS,          CLOSED,  MAMBA, 1,     "mamba_num_heads")         /* SSM heads                  */ \
  F(mamba_head_dim,   I64,  MAMBA, 1, 0,                          1,  MP_LIM_HEAD_DIM,       CLOSED,  MAMBA, 1,     "mamba_head_dim")          /* features per SSM head P    */ \
  F(n_groups,         I64,  MAMBA, 0, 1,                          1,  m->mamba_num_heads,    CLOSED,  MAMBA, 1,     "n_groups")                /* B/C groups G               */ \
  F(conv_kernel,      I64,  MAMBA, 0, 4,                          1,  64,                    CLOSED,  MAMBA, 1,     "conv_kernel")             /* depthwise conv1d taps      */ \
  F(chunk_size,       I64,  MAMBA, 0, 128,                        1,  MP_LIM_SEQ,            CLOSED,  MAMBA, 1,     "chunk_size")              /* SSD chunk length Q         */ \
  F(expand,           I64,  MAMBA, 0, 2,                          1,  64,                    CLOSED,  MAMBA, 1,     "expand")                  /* d_inner / d_model          */
/* clang-format on */

#define MP_MODEL_CTYPE_I64 int64_t
#define MP_MODEL_CTYPE_BOOL int
#define MP_MODEL_CTYPE_F64 double

/* Invariant after a successful load: see the file comment. */
typedef struct mp_model {
  char name[MP_NAME_MAX];
  mp_family family;
  mp_mlp mlp;   /* the dense MLP's activation (MP_MLP_FAMILY: the family's) */
  mp_norm norm; /* the norms' kind (MP_NORM_FAMILY: the family's) */
#define MP_MODEL_MEMBER_(field, type, ...) MP_MODEL_CTYPE_##type field;
  MP_MODEL_FIELDS(MP_MODEL_MEMBER_)
#undef MP_MODEL_MEMBER_
  unsigned char moe_layer[MP_MAX_LAYERS]; /* 1: layer l's MLP is a MoE */
  /* A hybrid model's layer kinds (Megatron's hybrid_override_pattern, one character a layer:
   * MP_LAYER_MAMBA, MP_LAYER_ATTN, MP_LAYER_MLP); all MP_LAYER_BLOCK in a transformer */
  unsigned char layer_kind[MP_MAX_LAYERS];
} mp_model;

/* What layer l is (mp_model.layer_kind). A transformer's layers are blocks (attention and an
 * MLP or MoE, each behind its norm); a hybrid model's (Nemotron-H, arXiv 2504.03624 sec. 2.1;
 * Megatron-Core's MambaStack, megatron/core/ssm/mamba_block.py at core_v0.14.0) are one part
 * each behind its own norm: a Mamba-2 mixer, self-attention (no RoPE: Nemotron-H has no
 * position embedding) or a dense MLP. */
typedef enum mp_layer_kind {
  MP_LAYER_BLOCK = 0,
  MP_LAYER_MAMBA = 'M',
  MP_LAYER_ATTN = '*',
  MP_LAYER_MLP = '-'
} mp_layer_kind;

/* One value per row of MP_MODEL_FIELDS, in table order. */
typedef enum mp_model_field {
#define MP_MODEL_FIELD_ID_(field, ...) MP_MODEL_FIELD_##field,
  MP_MODEL_FIELDS(MP_MODEL_FIELD_ID_)
#undef MP_MODEL_FIELD_ID_
  MP_MODEL_FIELD_COUNT
} mp_model_field;

/* Row f's meshplan key (its C name) and its Hugging Face key (NULL: none in the table). */
const char *mp_model_field_key(mp_model_field f);
const char *mp_model_field_hf_key(mp_model_field f);
/* m's value of field f (a flag as 0 or 1; every integer in range is exact in a double). */
double mp_model_field_value(const mp_model *m, mp_model_field f);
/* The index in fields[0..n) of the first field on which a and b differ, or -1. */
int mp_model_first_difference(const mp_model *a, const mp_model *b, const mp_model_field *fields,
                              int n);
/* Adds m's field f to the JSON object o under key: a number, or a boolean for a flag. */
void mp_model_field_to_json(struct cJSON *o, const char *key, const mp_model *m, mp_model_field f);
/* m in meshplan's format, which mp_model_from_text reads back: name, family, the rows whose
 * saved column is 1 (an MLA model's "mla" object among them) and, for a MoE model, "moe" with the MoE layers as first_dense_layers
 * and layer_freq. NULL when out of memory. */
struct cJSON *mp_model_to_json(const mp_model *m);

/* Loads by name (a file stem under data/models, embedded in the binary, e.g.
 * "llama3.1-8b") or by path (anything containing '/' or ending in .json). The file may
 * be meshplan's format or a Hugging Face config.json (detected by its keys). */
mp_status mp_model_load(mp_ctx *ctx, const char *name_or_path, mp_model *out);
/* Parses JSON text; origin names it in messages. */
mp_status mp_model_from_text(mp_ctx *ctx, const char *text, const char *origin, mp_model *out);
/* Parses a Hugging Face config.json text explicitly (LlamaForCausalLM, Qwen2, Qwen3,
 * Qwen3MoE, Qwen2MoE, Mixtral, GPT2). */
mp_status mp_model_from_hf_text(mp_ctx *ctx, const char *text, const char *origin, mp_model *out);
/* Checks the invariants above and every field's range (common/limits.h: d_model <= 2^20,
 * vocab <= 2^22, max_seq <= 2^24, fewer than 2^50 parameters, finite positive norm_eps and
 * rope_theta, ...); a failure names the field, its value and the accepted range. Used by
 * the loaders and by code that builds specs. A head_dim the file leaves out must come out
 * whole: n_heads that do not divide d_model are refused by the loaders, not rounded. */
mp_status mp_model_validate(mp_ctx *ctx, const mp_model *m, const char *origin);
/* The step's sizes for m: seq in 1..2^24, micro_batch >= 1, global_batch in 1..2^24 (0: not
 * resolved yet, not checked), at most 2^32 tokens per step, and at most 2^40 elements in
 * one tensor of a micro-batch (micro_batch x seq x the widest per-token row: vocab, d_ff,
 * top_k x d_ff_expert, n_heads x head_dim, d_model). Within these, every size the plan,
 * the schedule and the simulator form fits in int64. MP_ERR_INVALID naming the limit.
 * Chunked attention (attn_chunk) is modelled where one chunk holds the sequence, where it is
 * the plain causal attention; a longer seq is MP_ERR_UNSUPPORTED: its blocks would attend
 * differently, which one attention for every block does not describe. */
mp_status mp_model_check_step(mp_ctx *ctx, const mp_model *m, int64_t seq, int64_t micro_batch,
                              int64_t global_batch);

int mp_model_is_moe(const mp_model *m);
/* The dense MLP's activation with the family's default resolved (never MP_MLP_FAMILY). */
mp_mlp mp_model_mlp(const mp_model *m);
/* 1 when the dense MLP is gated (SwiGLU: gate, up, down), 0 when it is up, down. */
int mp_model_mlp_gated(const mp_model *m);
/* The norms' kind with the family's default resolved (never MP_NORM_FAMILY). */
mp_norm mp_model_norm(const mp_model *m);
/* 1 when each norm has a bias beside its weight: a LayerNorm, except in a gpt model with
 * bias false (see mp_norm). */
int mp_model_norm_has_bias(const mp_model *m);
/* 1 when m has multi-head latent attention (kv_lora_rank > 0). */
int mp_model_is_mla(const mp_model *m);
/* Features per head of the values and of the attention output: v_head_dim under MLA, else
 * head_dim. */
int64_t mp_model_v_head_dim(const mp_model *m);
/* 1 when block `layer`'s MLP is a MoE; an MTP module's block (layer n_layers ..
 * n_layers + mtp_layers - 1) is of the last block's kind, as Megatron-Core builds it
 * (gpt_layer_specs.py's MTP block spec takes the decoder's last layer spec, core_v0.14.0). */
int mp_model_layer_is_moe(const mp_model *m, int64_t layer);
/* Blocks in the module tree: the trunk's n_layers and the MTP modules' blocks after them. */
int64_t mp_model_n_blocks(const mp_model *m);
/* 1 when block `layer` is an MTP module's (n_layers <= layer < mp_model_n_blocks). */
int mp_model_layer_is_mtp(const mp_model *m, int64_t layer);
/* Parameters of the mtp_layers MTP modules beyond the embedding and output head they share
 * with the main model: per module enorm and hnorm (a norm on H each), eh_proj [H, 2H] (no
 * bias), one block and its final norm (Megatron-Core's MultiTokenPredictionLayer,
 * multi_token_prediction.py at core_v0.14.0; DeepSeek-V3's: 11,610,067,968). */
int64_t mp_model_mtp_params(const mp_model *m);
int64_t mp_model_n_moe_layers(const mp_model *m);

/* ---- hybrid Mamba-Transformer models (exec/model_hybrid.c) ---- */
/* 1 when m's layers follow a hybrid pattern (layer_kind set). */
int mp_model_is_hybrid(const mp_model *m);
/* Layer l's kind (MP_LAYER_BLOCK outside a hybrid model or out of range). */
mp_layer_kind mp_model_layer_kind(const mp_model *m, int64_t layer);
/* 1 when layer l has an attention part (a block or a * layer), an MLP part (a block or a -
 * layer), a Mamba-2 mixer (an M layer). */
int mp_model_layer_has_attn(const mp_model *m, int64_t layer);
int mp_model_layer_has_mlp(const mp_model *m, int64_t layer);
int mp_model_layer_has_mamba(const mp_model *m, int64_t layer);
/* Layers of kind k in the pattern. */
int64_t mp_model_n_layers_of(const mp_model *m, mp_layer_kind k);
/* The Mamba-2 mixer's widths: d_inner = mamba_num_heads x mamba_head_dim; the conv's
 * channels x, B, C: d_inner + 2 n_groups ssm_state_size; in_proj's rows z, x, B, C, dt:
 * 2 d_inner + 2 n_groups ssm_state_size + mamba_num_heads. */
int64_t mp_model_mamba_d_inner(const mp_model *m);
int64_t mp_model_mamba_conv_dim(const mp_model *m);
int64_t mp_model_mamba_in_rows(const mp_model *m);
/* One Mamba-2 mixer's parameters (its pre-norm not counted): in_proj, conv1d weight and
 * bias, dt_bias, A_log, D, the gated RMSNorm's weight, out_proj. */
int64_t mp_model_mamba_params(const mp_model *m);
/* The pattern as Megatron writes it, into buf (n_layers characters and a NUL). */
void mp_model_pattern(const mp_model *m, char *buf, size_t cap);
/* Megatron-LM's training FLOPs per token for a hybrid model (num_floating_point_operations'
 * hybrid branch, megatron/training/training.py at core_v0.14.0), divided by batch x seq. */
double mp_model_hybrid_flops_per_token(const mp_model *m, int64_t seq);

/* Parameters of one block (attention, norms, MLP or MoE incl. router). */
int64_t mp_model_block_params(const mp_model *m, int64_t layer);
/* Embedding (+ positions for gpt). */
int64_t mp_model_embedding_params(const mp_model *m);
/* Output head (0 when tied) plus the final norm. */
int64_t mp_model_head_params(const mp_model *m);
/* Every parameter, counted once (tied weights once). */
int64_t mp_model_param_count(const mp_model *m);
/* Parameters a token touches: routed experts count top_k of n_experts; both embeddings
 * count (the input lookup's row and the output head; mp_model_matmul_param_count leaves
 * the input embedding out). */
int64_t mp_model_active_param_count(const mp_model *m);
/* The parameters a token's matmuls use: the active blocks and the output head (a tied
 * head's matrix too: its matmul runs), not the input embedding's row lookup nor learned
 * positions. DeepSeek's published activated counts are this one. */
int64_t mp_model_matmul_param_count(const mp_model *m);
/* Keys a query attends to on average in a causal sequence of seq tokens: seq / 2 (to
 * within a token: (seq + 1) / 2 exactly, the convention's seq / 2), or under a sliding
 * window W < seq, W - W^2 / (2 seq) (the first W queries see a growing prefix, the rest W
 * keys each); with window_attn_skip_freq N, the mean over the blocks of the windowed ones'
 * figure and, on every N-th block, seq / 2. */
double mp_model_attended_keys(const mp_model *m, int64_t seq);
/* 1 when the sliding window limits attention at this sequence length (seq > window): the
 * attention is then not the plain causal one. */
int mp_model_window_applies(const mp_model *m, int64_t seq);
/* Why meshplan's runtime does not train m at seq (its attention kernels, CPU and CUDA,
 * attend to the whole causal prefix; a window that applies would train a different model),
 * as one line for train's refusal and plan's runs column. */
void mp_model_window_refusal(const mp_model *m, int64_t seq, char *buf, size_t cap);
/* Training FLOPs per token (forward + backward), the torchtitan/PaLM convention:
 * 6 * (active params excluding the input embedding lookup) + 12 * L * n_heads * head_dim * seq,
 * where seq stands for twice the keys a query attends to (mp_model_attended_keys: seq
 * without a window, 2 W - W^2 / seq under a window W < seq). Under MLA QK^T runs over the
 * query/key head (head_dim = qk_nope + qk_rope) and attention x V over v_head_dim: the
 * attention term is 6 * L * n_heads * (head_dim + v_head_dim) * seq.
 * A tied head's matmul is counted (it runs), its embedding lookup is not. */
/* With MTP modules, Megatron's count (num_floating_point_operations in
 * megatron/training/training.py, core_v0.14.0) adds per module 6 x its block's active
 * parameters and attention, 6 x (3H norms + 2H^2 eh_proj) and 6 x H x vocab for its head. */
double mp_model_flops_per_token(const mp_model *m, int64_t seq);

#ifdef __cplusplus
}
#endif
#endif
