/* The tokenizer of an export (hf.h): where the training data's tokenizer.json is, its
 * special tokens, and the files transformers' AutoTokenizer reads beside the weights.
 *
 * scripts/tokenize writes tokenizer.json beside the shards it makes and puts the
 * end-of-text token before every document, so that token is the documents' separator:
 * the end-of-sequence token, and the beginning-of-sequence one too unless the tokenizer has
 * its own (GPT-2's convention: bos = eos = <|endoftext|>). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/file.h"
#include "common/json.h"
#include "exec/runtime/hf.h"

/* The names scripts/tokenize looks for (EOT_NAMES), in its order; then the beginnings. */
static const char *const k_eos[] = {"<|endoftext|>", "<|end_of_text|>", "</s>"};
static const char *const k_bos[] = {"<|begin_of_text|>", "<s>"};

int mp_hf_tokenizer_beside_data(const mp_ckpt_manifest *man, char *out, size_t cap) {
  const char *data = cJSON_GetStringValue(cJSON_GetObjectItem(man->meta.train, "data"));
  if (!data || strcmp(data, "synthetic") == 0) return 0;
  const char *slash = strrchr(data, '/');
  const int dir_len = slash ? (int)(slash - data) : 0;
  if (slash && strcspn(data, "*?[") < (size_t)dir_len) return 0; /* a glob in the folder */
  snprintf(out, cap, "%.*s%stokenizer.json", dir_len, data, slash ? "/" : "");
  return access(out, R_OK) == 0;
}

/* The id of token `name`: an added token's, else the model's vocabulary entry; -1 none. */
static int64_t token_id(const cJSON *root, const char *name) {
  const cJSON *t;
  cJSON_ArrayForEach(t, cJSON_GetObjectItem(root, "added_tokens")) {
    const cJSON *id = cJSON_GetObjectItem(t, "id");
    const char *c = cJSON_GetStringValue(cJSON_GetObjectItem(t, "content"));
    if (c && strcmp(c, name) == 0 && cJSON_IsNumber(id)) return (int64_t)id->valuedouble;
  }
  const cJSON *v = cJSON_GetObjectItem(cJSON_GetObjectItem(root, "model"), "vocab");
  const cJSON *id = cJSON_IsObject(v) ? cJSON_GetObjectItem(v, name) : NULL;
  return cJSON_IsNumber(id) ? (int64_t)id->valuedouble : -1;
}

/* The largest id the tokenizer can produce: its vocabulary's (an object of ids, or a list
 * whose index is the id) and its added tokens'. */
static int64_t max_id(const cJSON *root) {
  int64_t hi = -1;
  const cJSON *t, *v = cJSON_GetObjectItem(cJSON_GetObjectItem(root, "model"), "vocab");
  if (cJSON_IsArray(v)) hi = cJSON_GetArraySize(v) - 1;
  if (cJSON_IsObject(v)) {
    cJSON_ArrayForEach(t, v) if (cJSON_IsNumber(t) && t->valuedouble > hi) hi = (int64_t)t->valuedouble;
  }
  cJSON_ArrayForEach(t, cJSON_GetObjectItem(root, "added_tokens")) {
    const cJSON *id = cJSON_GetObjectItem(t, "id");
    if (cJSON_IsNumber(id) && id->valuedouble > hi) hi = (int64_t)id->valuedouble;
  }
  return hi;
}

/* The first of names the tokenizer has into *name and *id. */
static void first_of(const cJSON *root, const char *const *names, int n, char *name, size_t cap, int64_t *id) {
  for (int i = 0; i < n && *id < 0; i++) {
    *id = token_id(root, names[i]);
    if (*id >= 0) snprintf(name, cap, "%s", names[i]);
  }
}

mp_status mp_hf_tokenizer_read(mp_ctx *ctx, const char *path, int64_t vocab, mp_hf_special *out) {
  memset(out, 0, sizeof *out);
  out->bos_id = out->eos_id = -1;
  char *text = NULL;
  MP_CHECK(mp_read_file(ctx, path, &text, NULL));
  cJSON *root = NULL;
  mp_status st = mp_json_parse(ctx, text, path, &root);
  free(text);
  MP_CHECK(st);
  const int64_t hi = max_id(root);
  if (hi < 0 || hi >= vocab)
    st = mp_error(ctx, MP_ERR_INVALID, "%s: %s; the model's vocabulary is %lld: it is not this model's tokenizer",
                  path, hi < 0 ? "no vocabulary (model.vocab)" : "ids reach beyond it", (long long)vocab);
  first_of(root, k_eos, 3, out->eos, sizeof out->eos, &out->eos_id);
  first_of(root, k_bos, 2, out->bos, sizeof out->bos, &out->bos_id);
  if (out->bos_id < 0 && out->eos_id >= 0) {
    snprintf(out->bos, sizeof out->bos, "%s", out->eos);
    out->bos_id = out->eos_id;
  }
  cJSON_Delete(root);
  return st;
}

/* A name as JSON: the string, or null when the tokenizer has none. */
static void add_token(cJSON *o, const char *key, const char *name, int64_t id) {
  if (id >= 0)
    cJSON_AddStringToObject(o, key, name);
  else
    cJSON_AddNullToObject(o, key);
}

/* o printed into dir/name (atomic), then deleted. */
static mp_status write_json(mp_ctx *ctx, const char *dir, const char *name, cJSON *o) {
  char *text = o ? cJSON_Print(o) : NULL;
  cJSON_Delete(o);
  MP_CHECK_ALLOC(ctx, text);
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  mp_status st = mp_write_file_atomic(ctx, path, text, strlen(text));
  free(text);
  return st;
}

mp_status mp_hf_tokenizer_write(mp_ctx *ctx, const char *path, const mp_hf_special *sp, int64_t max_seq,
                                const char *out_dir) {
  char *text = NULL, dst[4096];
  size_t len = 0;
  MP_CHECK(mp_read_file(ctx, path, &text, &len));
  snprintf(dst, sizeof dst, "%s/tokenizer.json", out_dir);
  mp_status st = mp_write_file_atomic(ctx, dst, text, len);
  free(text);
  MP_CHECK(st);
  /* PreTrainedTokenizerFast reads tokenizer.json as it is; the class named so that
   * AutoTokenizer does not take the config's model_type (llama) for a SentencePiece one */
  cJSON *c = cJSON_CreateObject(), *m = cJSON_CreateObject();
  if (c) {
    cJSON_AddStringToObject(c, "tokenizer_class", "PreTrainedTokenizerFast");
    add_token(c, "bos_token", sp->bos, sp->bos_id);
    add_token(c, "eos_token", sp->eos, sp->eos_id);
    cJSON_AddNumberToObject(c, "model_max_length", (double)max_seq);
    cJSON_AddBoolToObject(c, "clean_up_tokenization_spaces", 0);
  }
  if (m) {
    add_token(m, "bos_token", sp->bos, sp->bos_id);
    add_token(m, "eos_token", sp->eos, sp->eos_id);
  }
  st = write_json(ctx, out_dir, "tokenizer_config.json", c);
  if (st == MP_OK) st = write_json(ctx, out_dir, "special_tokens_map.json", m);
  else cJSON_Delete(m);
  return st;
}
