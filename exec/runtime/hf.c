/* Hugging Face names, config.json, initialization from safetensors and export of a
 * checkpoint (see hf.h). */
#define _GNU_SOURCE
#include "exec/runtime/hf.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/json.h"
#include "exec/plan.h"
#include "exec/runtime/ckpt_internal.h"
#include "exec/runtime/safetensors.h"

/* ---- names ----------------------------------------------------------------------------- */

/* Our module path inside a block -> transformers'. */
static const mp_hf_pair k_block[] = {
    {"attention_norm", "input_layernorm"},
    {"attention.q_proj", "self_attn.q_proj"},
    {"attention.k_proj", "self_attn.k_proj"},
    {"attention.v_proj", "self_attn.v_proj"},
    {"attention.o_proj", "self_attn.o_proj"},
    {"attention.q_norm", "self_attn.q_norm"},
    {"attention.k_norm", "self_attn.k_norm"},
    {"ffn_norm", "post_attention_layernorm"},
    {"mlp.gate_proj", "mlp.gate_proj"},
    {"mlp.up_proj", "mlp.up_proj"},
    {"mlp.down_proj", "mlp.down_proj"},
    {"moe.router", "block_sparse_moe.gate"},
};
/* Mixtral's expert weights: w1 gate, w3 up, w2 down. */
static const mp_hf_pair k_experts[] = {
    {"moe.experts.gate_proj", "w1"},
    {"moe.experts.up_proj", "w3"},
    {"moe.experts.down_proj", "w2"},
};
static const mp_hf_names k_names = {k_block, k_experts, sizeof k_block / sizeof k_block[0],
                                    sizeof k_experts / sizeof k_experts[0], "block_sparse_moe.experts"};

int mp_hf_is_experts(const char *fqn) { return strstr(fqn, ".moe.experts.") != NULL; }

int mp_hf_block_path(const char *fqn, int *layer, const char **path, size_t *len) {
  int n = 0;
  if (sscanf(fqn, "layers.%d.%n", layer, &n) != 1 || n == 0) return 0;
  const char *rest = fqn + n, *dot = strrchr(rest, '.');
  if (!dot || strcmp(dot, ".weight") != 0) return 0;
  *path = rest;
  *len = (size_t)(dot - rest);
  return 1;
}

int mp_hf_path_is(const char *path, size_t len, const char *name) {
  return strlen(name) == len && strncmp(path, name, len) == 0;
}

int mp_hf_name_by(const mp_hf_names *t, const char *fqn, int expert, char *out, size_t cap) {
  if (strcmp(fqn, "tok_embeddings.weight") == 0) return snprintf(out, cap, "model.embed_tokens.weight") > 0;
  if (strcmp(fqn, "norm.weight") == 0) return snprintf(out, cap, "model.norm.weight") > 0;
  if (strcmp(fqn, "output.weight") == 0) return snprintf(out, cap, "lm_head.weight") > 0;
  int layer;
  const char *path;
  size_t len;
  if (!mp_hf_block_path(fqn, &layer, &path, &len)) return 0;
  for (size_t i = 0; i < t->n_block; i++)
    if (mp_hf_path_is(path, len, t->block[i].ours))
      return snprintf(out, cap, "model.layers.%d.%s.weight", layer, t->block[i].hf) > 0;
  for (size_t i = 0; i < t->n_experts; i++)
    if (mp_hf_path_is(path, len, t->experts[i].ours))
      return snprintf(out, cap, "model.layers.%d.%s.%d.%s.weight", layer, t->experts_path, expert,
                      t->experts[i].hf) > 0;
  return 0;
}

int mp_hf_name(const char *fqn, int expert, char *out, size_t cap) {
  return mp_hf_name_by(&k_names, fqn, expert, out, cap);
}

/* ---- config.json ---------------------------------------------------------------------------- */

/* The key of field f in the config.json the export writes: Llama's names (the hf column of
 * MP_MODEL_FIELDS), Mixtral's for the experts' count and loss weight. */
static const char *export_key(mp_model_field f) {
  if (f == MP_MODEL_FIELD_n_experts) return "num_local_experts";
  if (f == MP_MODEL_FIELD_aux_loss_coef) return "router_aux_loss_coef";
  return mp_model_field_hf_key(f);
}

mp_status mp_hf_config(mp_ctx *ctx, const mp_model *m, cJSON **out) {
  *out = NULL;
  if (mp_model_is_mla(m)) return mp_hf_deepseek_config(ctx, m, out);
  if (m->family != MP_FAMILY_LLAMA || m->bias || m->qkv_bias || m->qk_norm || !mp_model_mlp_gated(m) ||
      mp_model_norm(m) != MP_NORM_RMS || m->attn_chunk > 0)
    return mp_error(ctx, MP_ERR_UNSUPPORTED, "model %s: export writes Llama and Mixtral configs; this model has "
                    "biases, q/k norms, LayerNorms, a non-gated MLP or chunked attention", m->name);
  const int moe = mp_model_is_moe(m);
  if (moe && (m->n_shared_experts > 0 || mp_model_n_moe_layers(m) != m->n_layers || !m->norm_topk_prob))
    return mp_error(ctx, MP_ERR_UNSUPPORTED, "model %s: an MoE exports as Mixtral, which has every layer MoE, "
                    "renormalised top-k and no shared expert; this model differs (transformers has no "
                    "architecture for it)", m->name);
  /* in the export's key order; Mixtral's intermediate_size is the expert's */
  static const mp_model_field dims[] = {
      MP_MODEL_FIELD_vocab,    MP_MODEL_FIELD_d_model,  MP_MODEL_FIELD_d_ff,     MP_MODEL_FIELD_n_layers,
      MP_MODEL_FIELD_n_heads,  MP_MODEL_FIELD_n_kv_heads, MP_MODEL_FIELD_head_dim, MP_MODEL_FIELD_max_seq,
      MP_MODEL_FIELD_norm_eps, MP_MODEL_FIELD_rope_theta, MP_MODEL_FIELD_tied_embeddings};
  static const mp_model_field experts[] = {MP_MODEL_FIELD_n_experts, MP_MODEL_FIELD_top_k,
                                           MP_MODEL_FIELD_aux_loss_coef};
  cJSON *c = cJSON_CreateObject();
  MP_CHECK_ALLOC(ctx, c);
  cJSON *arch = cJSON_AddArrayToObject(c, "architectures");
  cJSON_AddItemToArray(arch, cJSON_CreateString(moe ? "MixtralForCausalLM" : "LlamaForCausalLM"));
  cJSON_AddStringToObject(c, "model_type", moe ? "mixtral" : "llama");
  for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++)
    mp_model_field_to_json(c, export_key(dims[i]), m,
                           moe && dims[i] == MP_MODEL_FIELD_d_ff ? MP_MODEL_FIELD_d_ff_expert : dims[i]);
  cJSON_AddStringToObject(c, "hidden_act", "silu");
  cJSON_AddBoolToObject(c, "attention_bias", 0);
  cJSON_AddStringToObject(c, "torch_dtype", "float32");
  if (moe) {
    for (size_t i = 0; i < sizeof experts / sizeof experts[0]; i++)
      mp_model_field_to_json(c, export_key(experts[i]), m, experts[i]);
  } else {
    cJSON_AddBoolToObject(c, "mlp_bias", 0);
  }
  *out = c;
  return MP_OK;
}

/* The fields that decide the checkpoint's tensors and forward, named as the export names
 * them (the expert's intermediate_size told apart from the dense one). */
mp_status mp_hf_check_config(mp_ctx *ctx, const mp_model *hf, const mp_model *m, const char *origin) {
  static const mp_model_field same[] = {
      MP_MODEL_FIELD_vocab,           MP_MODEL_FIELD_d_model,  MP_MODEL_FIELD_n_layers,   MP_MODEL_FIELD_n_heads,
      MP_MODEL_FIELD_n_kv_heads,      MP_MODEL_FIELD_head_dim, MP_MODEL_FIELD_d_ff,       MP_MODEL_FIELD_tied_embeddings,
      MP_MODEL_FIELD_norm_eps,        MP_MODEL_FIELD_rope_theta, MP_MODEL_FIELD_n_experts, MP_MODEL_FIELD_top_k,
      MP_MODEL_FIELD_d_ff_expert,     MP_MODEL_FIELD_q_lora_rank, MP_MODEL_FIELD_kv_lora_rank,
      MP_MODEL_FIELD_qk_nope_head_dim, MP_MODEL_FIELD_qk_rope_head_dim, MP_MODEL_FIELD_v_head_dim,
      MP_MODEL_FIELD_n_shared_experts, MP_MODEL_FIELD_d_ff_shared};
  const int i = mp_model_first_difference(hf, m, same, (int)(sizeof same / sizeof same[0]));
  if (i < 0) return MP_OK;
  const mp_model_field f = same[i];
  return mp_error(ctx, MP_ERR_INVALID, "%s: %s is %g but model %s has %g; drop --model to train the config's "
                  "model, or init from a checkpoint of %s", origin,
                  f == MP_MODEL_FIELD_d_ff_expert ? "expert intermediate_size" : export_key(f),
                  mp_model_field_value(hf, f), m->name, mp_model_field_value(m, f), m->name);
}

/* ---- initialization from safetensors --------------------------------------------------------- */

/* Tensor hf_name of the set, checked to have shape (ndim, shape). */
static mp_status find_tensor(mp_ctx *ctx, const mp_st_set *s, const char *path, const char *hf_name, const char *fqn,
                             int ndim, const int64_t *shape, const mp_st_tensor **out) {
  const mp_st_tensor *t = mp_st_find(s, hf_name);
  if (!t)
    return mp_error(ctx, MP_ERR_INVALID, "%s: no tensor %s (our %s); the file is not a Llama-style checkpoint of "
                    "this model", path, hf_name, fqn);
  int same = t->ndim == ndim;
  for (int d = 0; d < ndim && same; d++) same = t->shape[d] == shape[d];
  if (!same)
    return mp_error(ctx, MP_ERR_INVALID, "%s: tensor %s has shape [%lld, %lld] (%d dims) but the model needs "
                    "[%lld, %lld] (%d dims); the file is another model's or vocabulary's", mp_st_file_of(s, t),
                    hf_name, (long long)t->shape[0], (long long)(t->ndim > 1 ? t->shape[1] : 0), t->ndim,
                    (long long)shape[0], (long long)(ndim > 1 ? shape[1] : 0), ndim);
  *out = t;
  return MP_OK;
}

/* Parameter i's tile: read straight (a 1-D or 2-D tensor), or expert by expert (3-D). */
static mp_status load_param(mp_ctx *ctx, mp_runtime *rt, const mp_st_set *s, const char *path, int i, float *buf) {
  const mp_param *p = mp_plan_param_source(mp_runtime_plan(rt), i); /* a tied head copy: the embedding's */
  int64_t off[MP_MAX_NDIM], len[MP_MAX_NDIM];
  if (mp_runtime_param_tile(rt, i, off, len) == 0) return MP_OK;
  char name[512];
  const mp_st_tensor *t;
  const mp_model *m = &mp_runtime_plan(rt)->model;
  if (!mp_hf_is_experts(p->fqn)) {
    if (!mp_hf_model_name(m, p->fqn, 0, name, sizeof name))
      return mp_error(ctx, MP_ERR_UNSUPPORTED, "%s has no Hugging Face name (shared experts); init such a model from "
                      "a meshplan checkpoint (--resume)", p->fqn);
    MP_CHECK(find_tensor(ctx, s, path, name, p->fqn, p->ndim, p->shape, &t));
    if (!mp_hf_rows_moved(m, p->fqn)) {
      MP_CHECK(mp_st_read_box(ctx, s, t, off, len, buf));
    } else { /* row by row through the checkpoint's order (hf_deepseek.c) */
      for (int64_t r = 0; r < len[0]; r++) {
        const int64_t o[2] = {mp_hf_row(m, p->fqn, off[0] + r), off[1]}, n[2] = {1, len[1]};
        MP_CHECK(mp_st_read_box(ctx, s, t, o, n, buf + r * len[1]));
      }
    }
  } else {
    const int64_t per = len[1] * len[2];
    for (int64_t e = 0; e < len[0]; e++) {
      mp_hf_model_name(m, p->fqn, (int)(off[0] + e), name, sizeof name);
      MP_CHECK(find_tensor(ctx, s, path, name, p->fqn, 2, p->shape + 1, &t));
      MP_CHECK(mp_st_read_box(ctx, s, t, off + 1, len + 1, buf + e * per));
    }
  }
  return mp_runtime_write_state(ctx, rt, i, MP_STATE_PARAM, buf);
}

static int by_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Every tensor of the file is the model's (a rotary inv_freq buffer excepted): the
 * model's Hugging Face names sorted once, each tensor's looked up, so a header of
 * millions of entries is checked in n log n. */
static mp_status check_unused(mp_ctx *ctx, const mp_runtime *rt, const mp_st_set *s, const char *path) {
  const mp_plan *plan = mp_runtime_plan(rt);
  size_t n = 0;
  for (int i = 0; i < plan->n_params; i++)
    n += mp_hf_is_experts(plan->params[i].fqn) ? (size_t)plan->params[i].shape[0] : 1;
  char **names = calloc(n + 1, sizeof *names), name[512];
  MP_CHECK_ALLOC(ctx, names);
  size_t k = 0;
  mp_status st = MP_OK;
  for (int i = 0; i < plan->n_params && st == MP_OK; i++) {
    const mp_param *p = &plan->params[i];
    const int ne = mp_hf_is_experts(p->fqn) ? (int)p->shape[0] : 1;
    for (int e = 0; e < ne && st == MP_OK; e++)
      if (mp_hf_model_name(&plan->model, p->fqn, e, name, sizeof name) && !(names[k++] = strdup(name)))
        st = mp_error(ctx, MP_ERR_NOMEM, "out of memory for the names of model %s", plan->model.name);
  }
  if (k > 1) qsort(names, k, sizeof *names, by_str);
  for (int t = 0; t < mp_st_count(s) && st == MP_OK; t++) {
    const char *tn = mp_st_tensor_at(s, t)->name;
    if (!strstr(tn, "rotary_emb.inv_freq") && !bsearch(&tn, names, k, sizeof *names, by_str))
      st = mp_error(ctx, MP_ERR_INVALID, "%s: tensor %s is not a parameter of model %s; the file is another "
                    "model's", path, tn, plan->model.name);
  }
  for (size_t i = 0; i < k; i++) free(names[i]);
  free(names);
  return st;
}

typedef struct hf_src {
  const mp_st_set *s;
  const char *path;
} hf_src;

static mp_status load_tile(mp_ctx *ctx, mp_runtime *rt, int i, float *buf, void *arg) {
  const hf_src *src = arg;
  return load_param(ctx, rt, src->s, src->path, i, buf);
}

mp_status mp_hf_load_set(mp_ctx *ctx, mp_runtime *rt, const mp_st_set *s, const char *origin) {
  hf_src src = {s, origin};
  MP_CHECK(check_unused(ctx, rt, s, origin));
  return mp_ckpt_each_tile(ctx, rt, load_tile, &src);
}

static mp_status load_local(mp_ctx *ctx, mp_runtime *rt, const char *path) {
  mp_st_set *s = NULL;
  MP_CHECK(mp_st_open(ctx, path, &s));
  mp_status st = mp_hf_load_set(ctx, rt, s, path);
  mp_st_close(s);
  return st;
}

mp_status mp_hf_load(mp_ctx *ctx, mp_runtime *rt, const char *path) {
  return mp_runtime_agree(ctx, rt, load_local(ctx, rt, path), "reading the --init-from weights");
}

/* ---- export ------------------------------------------------------------------------------- */

/* The exported tensors: every master weight of the checkpoint (experts one per expert). */
typedef struct export_list {
  int n;
  char **names;
  int *ndims;
  int64_t (*shapes)[MP_ST_MAX_NDIM];
  const mp_ckpt_tensor **src;
  int *expert; /* -1: the whole tensor */
} export_list;

static void export_list_free(export_list *l) {
  for (int i = 0; i < l->n; i++) free(l->names[i]);
  free(l->names);
  free(l->ndims);
  free(l->shapes);
  free(l->src);
  free(l->expert);
}

static mp_status export_add(mp_ctx *ctx, export_list *l, int cap, const mp_model *m, const mp_ckpt_tensor *t,
                            int e) {
  char name[512];
  if (l->n >= cap) return mp_error(ctx, MP_ERR_INTERNAL, "export: more tensors than counted");
  if (!mp_hf_model_name(m, t->name, e < 0 ? 0 : e, name, sizeof name))
    return mp_error(ctx, MP_ERR_UNSUPPORTED, "checkpoint tensor %s has no Hugging Face name", t->name);
  const int i = l->n++;
  l->names[i] = strdup(name);
  MP_CHECK_ALLOC(ctx, l->names[i]);
  l->src[i] = t;
  l->expert[i] = e;
  l->ndims[i] = e < 0 ? t->ndim : t->ndim - 1;
  for (int d = 0; d < l->ndims[i]; d++) l->shapes[i][d] = t->shape[e < 0 ? d : d + 1];
  return MP_OK;
}

static mp_status export_collect(mp_ctx *ctx, const mp_ckpt_manifest *man, const mp_model *m, export_list *l) {
  int cap = 0;
  for (int i = 0; i < man->n_tensors; i++)
    if (strncmp(man->tensors[i].name, "optim.", 6) != 0)
      cap += mp_hf_is_experts(man->tensors[i].name) ? (int)man->tensors[i].shape[0] : 1;
  l->names = calloc((size_t)cap + 1, sizeof *l->names);
  l->ndims = calloc((size_t)cap + 1, sizeof *l->ndims);
  l->shapes = calloc((size_t)cap + 1, sizeof *l->shapes);
  l->src = calloc((size_t)cap + 1, sizeof *l->src);
  l->expert = calloc((size_t)cap + 1, sizeof *l->expert);
  if (!l->names || !l->ndims || !l->shapes || !l->src || !l->expert)
    return mp_error(ctx, MP_ERR_NOMEM, "export: out of memory");
  for (int i = 0; i < man->n_tensors; i++) {
    const mp_ckpt_tensor *t = &man->tensors[i];
    if (strncmp(t->name, "optim.", 6) == 0) continue;
    if (!mp_hf_is_experts(t->name)) {
      MP_CHECK(export_add(ctx, l, cap, m, t, -1));
      continue;
    }
    for (int e = 0; e < (int)t->shape[0]; e++) MP_CHECK(export_add(ctx, l, cap, m, t, e));
  }
  return MP_OK;
}

/* A tensor's rows into the checkpoint's order (hf_deepseek.c), through tmp (n floats). */
static void export_rows(const mp_model *m, const mp_ckpt_tensor *t, float *buf, float *tmp, int64_t n) {
  const int64_t cols = t->ndim > 1 ? t->shape[1] : 1, rows = n / cols;
  memcpy(tmp, buf, (size_t)n * sizeof(float));
  for (int64_t r = 0; r < rows; r++)
    memcpy(buf + mp_hf_row(m, t->name, r) * cols, tmp + r * cols, (size_t)cols * sizeof(float));
}

static mp_status export_weights(mp_ctx *ctx, const mp_ckpt_manifest *man, const mp_model *m, const char *path,
                                mp_st_dtype dtype) {
  export_list l;
  memset(&l, 0, sizeof l);
  mp_status st = export_collect(ctx, man, m, &l);
  mp_st_writer *w = NULL;
  cJSON *meta = cJSON_CreateObject();
  char step[32];
  snprintf(step, sizeof step, "%lld", (long long)man->meta.step);
  cJSON_AddStringToObject(meta, "format", "pt");
  cJSON_AddStringToObject(meta, "meshplan_step", step);
  if (st == MP_OK)
    st = mp_st_writer_open(ctx, path, l.n, (const char *const *)l.names, l.ndims,
                           (const int64_t(*)[MP_ST_MAX_NDIM])l.shapes, dtype, meta, &w);
  cJSON_Delete(meta);
  float *buf = NULL, *tmp = NULL;
  for (int i = 0; i < l.n && st == MP_OK; i++) {
    const mp_ckpt_tensor *t = l.src[i];
    int64_t off[3] = {0, 0, 0}, len[3] = {t->shape[0], t->shape[1], t->shape[2]}, n = 1;
    if (l.expert[i] >= 0) {
      off[0] = l.expert[i];
      len[0] = 1;
    }
    for (int d = 0; d < t->ndim; d++) n *= len[d];
    float *nb = realloc(buf, (size_t)n * sizeof(float)), *nt = nb ? realloc(tmp, (size_t)n * sizeof(float)) : NULL;
    if (nb) buf = nb;
    if (nt) tmp = nt;
    if (!nb || !nt) {
      st = mp_error(ctx, MP_ERR_NOMEM, "export: out of memory for %s", t->name);
      break;
    }
    st = mp_ckpt_read_box(ctx, man, t, off, len, buf);
    if (st == MP_OK && mp_hf_rows_moved(m, t->name)) export_rows(m, t, buf, tmp, n);
    if (st == MP_OK) st = mp_st_writer_put(ctx, w, buf);
  }
  free(buf);
  free(tmp);
  mp_status s2 = mp_st_writer_close(ctx, w, st == MP_OK);
  export_list_free(&l);
  return st != MP_OK ? st : s2;
}

/* The manifest's tensors against its model, as a load checks them against the model it
 * loads into: the plan of that model on one rank names every tensor the export needs and
 * its shape, so a missing, extra or misshapen tensor (or a "model" whose vocab or dims
 * disagree with the tensors, which would write a wrong config.json) is refused, never
 * exported for transformers to fill with its defaults. */
static mp_status check_manifest(mp_ctx *ctx, const mp_ckpt_manifest *man, const mp_model *m) {
  mp_mesh one;
  mp_mesh_init(&one);
  mp_plan_options po;
  mp_plan_options_init(&po);
  po.seq = m->max_seq;
  po.micro_batch = po.global_batch = 1;
  mp_plan *p = NULL;
  MP_CHECK(mp_build_plan(ctx, m, &one, &po, &p));
  mp_status st = mp_ckpt_check_plan(ctx, man, p, "the manifest's \"model\" disagrees with its tensors: the "
                                    "checkpoint is damaged");
  mp_plan_destroy(p);
  return st;
}

/* config.json's token ids and dtype: the tokenizer's (null without one) and the weights'. */
static void config_export(cJSON *cfg, const mp_hf_special *sp, mp_st_dtype dtype) {
  cJSON_ReplaceItemInObjectCaseSensitive(cfg, "torch_dtype",
                                         cJSON_CreateString(dtype == MP_ST_BF16 ? "bfloat16" : "float32"));
  if (sp->bos_id >= 0)
    cJSON_AddNumberToObject(cfg, "bos_token_id", (double)sp->bos_id);
  else
    cJSON_AddNullToObject(cfg, "bos_token_id");
  if (sp->eos_id >= 0)
    cJSON_AddNumberToObject(cfg, "eos_token_id", (double)sp->eos_id);
  else
    cJSON_AddNullToObject(cfg, "eos_token_id");
}

mp_status mp_hf_export(mp_ctx *ctx, const mp_ckpt_manifest *man, const char *out_dir,
                       const mp_hf_export_options *o, mp_hf_special *sp_out) {
  mp_model m;
  MP_CHECK(mp_ckpt_model(ctx, man, &m));
  mp_hf_special sp = {"", "", -1, -1};
  if (o->tokenizer) MP_CHECK(mp_hf_tokenizer_read(ctx, o->tokenizer, m.vocab, &sp));
  if (sp_out) *sp_out = sp;
  cJSON *cfg = NULL;
  MP_CHECK(mp_hf_config(ctx, &m, &cfg));
  config_export(cfg, &sp, o->dtype);
  mp_status st = check_manifest(ctx, man, &m);
  if (st != MP_OK) {
    cJSON_Delete(cfg);
    return st;
  }
  if (mkdir(out_dir, 0777) != 0 && errno != EEXIST)
    st = mp_error(ctx, MP_ERR_IO, "cannot create %s: %s", out_dir, strerror(errno));
  char path[4096];
  snprintf(path, sizeof path, "%s/model.safetensors", out_dir);
  if (st == MP_OK) st = export_weights(ctx, man, &m, path, o->dtype);
  char *text = st == MP_OK ? cJSON_Print(cfg) : NULL;
  cJSON_Delete(cfg);
  if (st == MP_OK && !text) st = mp_error(ctx, MP_ERR_NOMEM, "export: out of memory");
  snprintf(path, sizeof path, "%s/config.json", out_dir);
  if (st == MP_OK) st = mp_write_file_atomic(ctx, path, text, strlen(text));
  free(text);
  if (st == MP_OK && o->tokenizer) st = mp_hf_tokenizer_write(ctx, o->tokenizer, &sp, m.max_seq, out_dir);
  return st;
}
