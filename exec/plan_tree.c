/* The plan's meta module tree: every parameter of the model with its FQN and global shape in
 * forward order (embeddings, blocks 0..L-1, final norm, output), replicated on every axis,
 * and the pipeline stage each lives on (the driver: plan.c). */
#include "exec/plan_internal.h"

/* The builder's state: the tree goes into `params` (capacity cap), the FQNs into `arena`. */
typedef struct builder {
  mp_arena *arena;
  mp_param *params;
  int n;
  int cap;
} builder;

static mp_param *add_param(builder *b, mp_module mod, int layer, mp_param_role role, int ndim,
                           int64_t d0, int64_t d1, int64_t d2) {
  if (b->n >= b->cap) return NULL;
  mp_param *prm = &b->params[b->n++];
  const char *mname = mp_module_name(mod);
  prm->module_fqn = layer >= 0 ? mp_arena_printf(b->arena, "layers.%d.%s", layer, mname)
                               : mp_arena_strdup(b->arena, mname);
  if (prm->module_fqn == NULL) return NULL;
  prm->fqn = mp_arena_printf(b->arena, "%s.%s", prm->module_fqn,
                             role == MP_ROLE_WEIGHT ? "weight" : "bias");
  if (prm->fqn == NULL) return NULL;
  prm->module = mod;
  prm->role = role;
  prm->layer = layer;
  prm->ndim = ndim;
  int64_t d[3] = {d0, d1, d2};
  for (int i = 0; i < MP_MAX_NDIM; i++) {
    prm->shape[i] = i < ndim ? d[i] : 1;
    prm->tp_shape[i] = prm->shape[i];
  }
  for (int a = 0; a < MP_AXIS_COUNT; a++) {
    prm->place[a].kind = MP_PLACEMENT_REPLICATE;
    prm->place[a].dim = -1;
  }
  prm->tp_style = MP_TP_NONE;
  prm->is_linear = role == MP_ROLE_WEIGHT && ndim >= 2 && mod != MP_MOD_TOK_EMBEDDINGS &&
                   mod != MP_MOD_POS_EMBEDDINGS && mod != MP_MOD_MAMBA_CONV;
  prm->is_expert = mod == MP_MOD_EXPERTS_GATE || mod == MP_MOD_EXPERTS_UP ||
                   mod == MP_MOD_EXPERTS_DOWN;
  prm->float8 = 0;
  prm->fsdp_unit = -1;
  prm->fsdp_group = MP_GROUP_FSDP;
  prm->pp_stage = 0;
  return prm;
}

#define ADD(...)                                                  \
  do {                                                            \
    if (add_param(b, __VA_ARGS__) == NULL) return -1;             \
  } while (0)

/* A Linear [out, in] and its bias [out] when `bias`. */
#define LINEAR(mod, layer, out, in, bias)                          \
  do {                                                             \
    ADD(mod, layer, MP_ROLE_WEIGHT, 2, (out), (in), 1);            \
    if (bias) ADD(mod, layer, MP_ROLE_BIAS, 1, (out), 1, 1);       \
  } while (0)

/* A norm [n]; a LayerNorm has a bias too (mp_model_norm_has_bias). */
#define NORM(mod, layer, n, bias)                                  \
  do {                                                             \
    ADD(mod, layer, MP_ROLE_WEIGHT, 1, (n), 1, 1);                 \
    if (bias) ADD(mod, layer, MP_ROLE_BIAS, 1, (n), 1, 1);         \
  } while (0)

/* Upper bound on parameters: 2 embeddings + 2 head + per block at most
 * 2 norms x 2 + 4 attention Linear x 2 + 2 qk norms + 3 MLP x 2 + router + 3 experts +
 * 3 shared = 26 (MLA: 5 Linears and 2 norms in place of 4 Linears with biases); round up;
 * an MTP module's block and 3 norms x 2 + eh_proj. */
static int tree_cap(const mp_model *m) { return (int)(8 + 32 * m->n_layers + 40 * m->mtp_layers); }

/* Multi-head latent attention's modules of block l in forward order (exec/model.h): the
 * query path, the key/value path, o_proj. 0, or -1 when out of memory. */
static int mla_tree(builder *b, const mp_model *m, int l) {
  const int64_t H = m->d_model, nh = m->n_heads, ql = m->q_lora_rank, kvl = m->kv_lora_rank;
  if (ql > 0) {
    LINEAR(MP_MOD_Q_A, l, ql, H, 0);
    NORM(MP_MOD_Q_A_NORM, l, ql, 0);
    LINEAR(MP_MOD_Q_B, l, nh * m->head_dim, ql, 0);
  } else {
    LINEAR(MP_MOD_Q, l, nh * m->head_dim, H, 0);
  }
  LINEAR(MP_MOD_KV_A, l, kvl + m->qk_rope_head_dim, H, 0);
  NORM(MP_MOD_KV_A_NORM, l, kvl, 0);
  LINEAR(MP_MOD_KV_B, l, nh * (m->qk_nope_head_dim + m->v_head_dim), kvl, 0);
  LINEAR(MP_MOD_O, l, H, nh * m->v_head_dim, 0);
  return 0;
}

/* A hybrid model's Mamba-2 layer (its norm and mixer, Megatron-Core's MambaLayer with
 * MambaMixer, mamba_layer.py and mamba_mixer.py at core_v0.14.0; Hugging Face NemotronH's
 * backbone.layers.N.mixer names) or MLP layer (ffn_norm and the MLP). 0, or -1 when out of
 * memory. */
static int hybrid_tree(builder *b, const mp_model *m, int l) {
  const int64_t H = m->d_model, nh = m->mamba_num_heads, cd = mp_model_mamba_conv_dim(m);
  if (!mp_model_layer_has_mamba(m, l)) {
    NORM(MP_MOD_FFN_NORM, l, H, 0);
    LINEAR(MP_MOD_UP, l, m->d_ff, H, 0);
    LINEAR(MP_MOD_DOWN, l, H, m->d_ff, 0);
    return 0;
  }
  NORM(MP_MOD_ATTN_NORM, l, H, 0);
  LINEAR(MP_MOD_MAMBA_IN, l, mp_model_mamba_in_rows(m), H, 0);
  ADD(MP_MOD_MAMBA_CONV, l, MP_ROLE_WEIGHT, 2, cd, m->conv_kernel, 1);
  ADD(MP_MOD_MAMBA_CONV, l, MP_ROLE_BIAS, 1, cd, 1, 1);
  NORM(MP_MOD_MAMBA_DT_BIAS, l, nh, 0);
  NORM(MP_MOD_MAMBA_A_LOG, l, nh, 0);
  NORM(MP_MOD_MAMBA_D, l, nh, 0);
  NORM(MP_MOD_MAMBA_NORM, l, mp_model_mamba_d_inner(m), 0);
  LINEAR(MP_MOD_MAMBA_OUT, l, H, mp_model_mamba_d_inner(m), 0);
  return 0;
}

/* Block l's modules in forward order: its norms, attention, and MLP or MoE (a hybrid
 * model's layer: one of them). 0, or -1 when out of memory. */
static int block_tree(builder *b, const mp_model *m, int l) {
  const int64_t H = m->d_model, hd = m->head_dim;
  const int64_t q_out = m->n_heads * hd, kv_out = m->n_kv_heads * hd;
  const int gpt = m->family == MP_FAMILY_GPT;
  const int lbias = gpt && m->bias;          /* biases on every Linear */
  const int qkvb = lbias || m->qkv_bias;     /* biases on q/k/v */
  const int nbias = mp_model_norm_has_bias(m);
  if (mp_model_is_hybrid(m) && !mp_model_layer_has_attn(m, l)) return hybrid_tree(b, m, l);
  NORM(MP_MOD_ATTN_NORM, l, H, nbias);
  if (mp_model_is_mla(m)) {
    if (mla_tree(b, m, l) < 0) return -1;
  } else {
    LINEAR(MP_MOD_Q, l, q_out, H, qkvb);
    LINEAR(MP_MOD_K, l, kv_out, H, qkvb);
    LINEAR(MP_MOD_V, l, kv_out, H, qkvb);
    if (m->qk_norm) {
      NORM(MP_MOD_Q_NORM, l, hd, 0);
      NORM(MP_MOD_K_NORM, l, hd, 0);
    }
    LINEAR(MP_MOD_O, l, H, q_out, lbias);
  }
  if (!mp_model_layer_has_mlp(m, l)) return 0; /* a hybrid model's attention layer */
  NORM(MP_MOD_FFN_NORM, l, H, nbias);
  if (mp_model_layer_is_moe(m, l)) {
    const int64_t E = m->n_experts, fe = m->d_ff_expert;
    LINEAR(MP_MOD_ROUTER, l, E, H, 0);
    ADD(MP_MOD_EXPERTS_GATE, l, MP_ROLE_WEIGHT, 3, E, fe, H);
    ADD(MP_MOD_EXPERTS_UP, l, MP_ROLE_WEIGHT, 3, E, fe, H);
    ADD(MP_MOD_EXPERTS_DOWN, l, MP_ROLE_WEIGHT, 3, E, H, fe);
    if (m->n_shared_experts > 0) {
      const int64_t fs = m->d_ff_shared;
      LINEAR(MP_MOD_SHARED_GATE, l, fs, H, 0);
      LINEAR(MP_MOD_SHARED_UP, l, fs, H, 0);
      LINEAR(MP_MOD_SHARED_DOWN, l, H, fs, 0);
    }
  } else {
    if (mp_model_mlp_gated(m)) LINEAR(MP_MOD_GATE, l, m->d_ff, H, 0);
    LINEAR(MP_MOD_UP, l, m->d_ff, H, lbias);
    LINEAR(MP_MOD_DOWN, l, H, m->d_ff, lbias);
  }
  return 0;
}

/* 0 on success, -1 when out of memory (or capacity). The MTP modules (layers n_layers ..)
 * follow the trunk in forward order: enorm, hnorm, eh_proj [H, 2H] without bias, the block,
 * the module's final norm (Megatron-Core's MultiTokenPredictionLayer, core_v0.14.0). */
static int build_tree(builder *b, const mp_model *m) {
  const int64_t H = m->d_model;
  const int gpt = m->family == MP_FAMILY_GPT;
  const int nbias = mp_model_norm_has_bias(m);
  ADD(MP_MOD_TOK_EMBEDDINGS, -1, MP_ROLE_WEIGHT, 2, m->vocab, H, 1);
  if (gpt) ADD(MP_MOD_POS_EMBEDDINGS, -1, MP_ROLE_WEIGHT, 2, m->max_seq, H, 1);
  for (int l = 0; l < (int)m->n_layers; l++)
    if (block_tree(b, m, l) < 0) return -1;
  for (int l = (int)m->n_layers; l < (int)mp_model_n_blocks(m); l++) {
    NORM(MP_MOD_MTP_ENORM, l, H, nbias);
    NORM(MP_MOD_MTP_HNORM, l, H, nbias);
    LINEAR(MP_MOD_MTP_EH_PROJ, l, H, 2 * H, 0);
    if (block_tree(b, m, l) < 0) return -1;
    NORM(MP_MOD_MTP_NORM, l, H, nbias);
  }
  NORM(MP_MOD_FINAL_NORM, -1, H, nbias);
  /* GPT-2's head has no bias, nor has Llama's. */
  if (!m->tied_embeddings) LINEAR(MP_MOD_OUTPUT, -1, m->vocab, H, 0);
  return 0;
}

#undef ADD
#undef LINEAR
#undef NORM

int mp_plan_tree_build(mp_arena *arena, const mp_model *m, mp_param **params, int *n) {
  builder b = {arena, NULL, 0, tree_cap(m)};
  b.params = mp_arena_alloc(arena, sizeof(mp_param) * (size_t)b.cap);
  if (b.params == NULL || build_tree(&b, m) != 0) return -1;
  *params = b.params;
  *n = b.n;
  return 0;
}

/* Pipeline stage of every parameter: blocks by their model chunk (mp_plan_layer_stage),
 * embeddings on the first stage, final norm and head (a tied model's copy of the embedding
 * among them) on the last. */
void mp_plan_tree_set_stages(mp_plan *p) {
  const int last = mp_plan_last_stage(p);
  for (int i = 0; i < p->n_params; i++) {
    mp_param *prm = &p->params[i];
    if (prm->layer >= 0) prm->pp_stage = mp_plan_layer_stage(p, prm->layer);
    else prm->pp_stage = (prm->module == MP_MOD_TOK_EMBEDDINGS || prm->module == MP_MOD_POS_EMBEDDINGS) &&
                                 !prm->tied_copy
                             ? 0
                             : last;
  }
}

/* The embedding copy the last stage holds under pp > 1 (the caller leaves room for one):
 *   tied: a copy of tok_embeddings.weight as its output head (Megatron-LM's shared embedding
 *     weight, kept in step by an all-reduce of the two copies' gradients), which the MTP
 *     modules' embedding lookup uses too;
 *   untied with MTP modules: a copy of tok_embeddings.weight for their lookup of the shifted
 *     tokens (Megatron-Core's gpt_model.py builds the embedding where `pre_process or
 *     mtp_process`, all-reduced with stage 0's like a tied embedding, core_v0.14.0); none
 *     under DualPipe, whose rank 0 holds the first and the last stage and so the one
 *     embedding both use (DeepSeek-V3 sec. 3.2.1: shared physically).
 * Appended after the final norm and head. */
void mp_plan_tree_add_tied_copy(mp_plan *p) {
  const int pp = p->mesh.size[MP_DIM_PP];
  const int mtp_copy = !p->model.tied_embeddings && p->model.mtp_layers > 0 && p->opts.pp_schedule != MP_PP_DUALPIPE;
  if ((!p->model.tied_embeddings && !mtp_copy) || pp <= 1) return;
  const mp_param *e = NULL;
  for (int i = 0; i < p->n_params && e == NULL; i++)
    if (p->params[i].module == MP_MOD_TOK_EMBEDDINGS && p->params[i].role == MP_ROLE_WEIGHT)
      e = &p->params[i];
  if (e == NULL) return;
  mp_param *c = &p->params[p->n_params++];
  *c = *e;
  c->tied_copy = 1;
  if (mtp_copy) {
    c->fqn = "mtp.tok_embeddings.weight";
    c->module_fqn = "mtp.tok_embeddings";
    mp_plan_note(p, "PP: MTP: stage %d holds a copy of stage 0's tok_embeddings.weight for the MTP modules' "
                    "embedding of the shifted tokens; the two copies' gradients are all-reduced every step",
                 pp - 1);
    return;
  }
  c->module = MP_MOD_OUTPUT;
  c->fqn = "output.weight";
  c->module_fqn = "output";
  c->is_linear = 1;
  mp_plan_note(p, "PP: tied embeddings: stage %d's output head is a copy of stage 0's "
                  "tok_embeddings.weight; the two copies' gradients are all-reduced every step",
               pp - 1);
}
