/* libFuzzer harness: the safetensors reader and the Hugging Face name mapping
 * (`meshplan train --init-from PATH`).
 *
 * Input: a .safetensors file's bytes, read through mp_st_from_bytes (the parsing of a
 * mapped file). An input that starts with '{' is a Hugging Face folder instead: the text
 * up to the first NUL is its model.safetensors.index.json, the bytes after it the file
 * a.safetensors, beside a fixed valid b.safetensors; the folder is written to a temporary
 * directory and read through mp_st_open, as --init-from reads one.
 *
 * On an accepted input, what `train` would do with it:
 *   - every tensor converted to fp32 whole (refused beyond 3 dims), each element compared
 *     bit for bit (NaN with NaN) with an independent conversion of its bytes found from
 *     the header's offsets (F32 as is, BF16 as the high half of an F32, F16 by its
 *     sign/exponent/mantissa with ldexp); a box of it (a rank's tile) against the whole;
 *   - the load of every rank of a micro dense and a micro MoE model (Mixtral names) on a
 *     mesh with tp, FSDP or ep (tests/fuzz/fuzz_runtime.h) through mp_hf_load_set, each
 *     tile written compared with the elements the tensor named by mp_hf_name holds.
 * Every refusal must be one line. */
#define _GNU_SOURCE
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "exec/runtime/hf.h"
#include "exec/runtime/safetensors.h"
#include "tests/fuzz/fuzz_runtime.h"
#include "tests/fuzz/fuzz_util.h"

/* The models the load is tried with: the dims of the seed files that scripts/fuzz writes with
 * `meshplan train` and `meshplan export` (fuzz-micro) and a Mixtral-style MoE. */
static const char *const k_models[] = {
    "{\"name\": \"fuzz-micro\", \"family\": \"llama\", \"vocab\": 32, \"d_model\": 8, \"n_layers\": 1, "
    "\"n_heads\": 2, \"n_kv_heads\": 2, \"head_dim\": 4, \"d_ff\": 16, \"max_seq\": 8, \"norm_eps\": 1e-5, "
    "\"rope_theta\": 10000.0}",
    "{\"name\": \"fuzz-micro-moe\", \"family\": \"llama\", \"vocab\": 32, \"d_model\": 8, \"n_layers\": 1, "
    "\"n_heads\": 2, \"n_kv_heads\": 2, \"head_dim\": 4, \"d_ff\": 16, \"max_seq\": 8, \"norm_eps\": 1e-5, "
    "\"rope_theta\": 10000.0, \"moe\": {\"n_experts\": 4, \"top_k\": 2, \"d_ff_expert\": 8, \"norm_topk_prob\": true}}",
};
static const struct {
  const char *spec;
  int world;
} k_meshes[] = {{"tp=1", 1}, {"tp=2", 2}, {"dp_shard=2", 2}, {"ep=2,dp_shard=2", 2}};
#define N_MODELS 2
#define N_MESHES 4
static mp_plan *g_plans[N_MODELS][N_MESHES]; /* NULL where the mesh does not apply */

static char g_dir[256]; /* the folder of the index mode */
static unsigned char g_fixed[256];
static size_t g_fixed_len;

/* The file bytes of the current input, by path (mp_st_file_of). */
static const unsigned char *g_a;
static size_t g_a_len;
static const char *g_single; /* the bytes mode's origin */

static void write_file(const char *path, const void *b, size_t n) {
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(b, 1, n, f) != n || fclose(f) != 0) abort();
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc, (void)argv;
  for (int m = 0; m < N_MODELS; m++)
    for (int k = 0; k < N_MESHES; k++) {
      mp_ctx ctx;
      mp_ctx_init(&ctx);
      if (fuzz_runtime_plan(&ctx, k_models[m], k_meshes[k].spec, k_meshes[k].world, &g_plans[m][k]) != MP_OK)
        g_plans[m][k] = NULL;
    }
  FUZZ_ASSERT(g_plans[0][0] && g_plans[0][1] && g_plans[0][2] && g_plans[1][0] && g_plans[1][3]);
  const char *tmp = getenv("TMPDIR");
  snprintf(g_dir, sizeof g_dir, "%s/fuzz_safetensors.XXXXXX", tmp ? tmp : "/tmp");
  if (!mkdtemp(g_dir)) abort();
  /* b.safetensors: one F32 tensor [2, 2] */
  const char *hdr = "{\"fixed.weight\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]}}";
  const uint64_t n = strlen(hdr);
  memcpy(g_fixed, &n, 8);
  memcpy(g_fixed + 8, hdr, n);
  const float v[4] = {1.0f, -2.0f, 0.5f, 3.0f};
  memcpy(g_fixed + 8 + n, v, sizeof v);
  g_fixed_len = 8 + n + sizeof v;
  char p[300];
  snprintf(p, sizeof p, "%s/b.safetensors", g_dir);
  write_file(p, g_fixed, g_fixed_len);
  return 0;
}

/* ---- the independent conversion ---------------------------------------------------------- */

static float ref_f16(uint16_t h) {
  const int e = (h >> 10) & 31, m = h & 1023;
  float v;
  if (e == 0)
    v = ldexpf((float)m, -24);
  else if (e == 31)
    v = m ? NAN : INFINITY;
  else
    v = ldexpf((float)(1024 + m), e - 25);
  return h >> 15 ? -v : v;
}

static float ref_value(const unsigned char *p, mp_st_dtype dt) {
  float f;
  uint16_t h;
  if (dt == MP_ST_F32) {
    memcpy(&f, p, 4);
    return f;
  }
  memcpy(&h, p, 2);
  if (dt == MP_ST_F16) return ref_f16(h);
  const uint32_t bits = (uint32_t)h << 16;
  memcpy(&f, &bits, 4);
  return f;
}

static int same_float(float a, float b) { return (isnan(a) && isnan(b)) || memcmp(&a, &b, 4) == 0; }

/* The bytes of the file holding t and where its data starts. */
static const unsigned char *file_bytes(const mp_st_set *s, const mp_st_tensor *t, size_t *len) {
  const char *path = mp_st_file_of(s, t);
  const unsigned char *b;
  if (g_single && strcmp(path, g_single) == 0) {
    b = g_a;
    *len = g_a_len;
  } else if (strstr(path, "/a.safetensors")) {
    b = g_a;
    *len = g_a_len;
  } else {
    FUZZ_ASSERT(strstr(path, "/b.safetensors") != NULL);
    b = g_fixed;
    *len = g_fixed_len;
  }
  return b;
}

/* Element e (row-major) of t by the reference conversion, its bytes asserted in the file. */
static float ref_element(const mp_st_set *s, const mp_st_tensor *t, int64_t e) {
  size_t len;
  const unsigned char *b = file_bytes(s, t, &len);
  uint64_t n;
  memcpy(&n, b, 8);
  const size_t eb = t->dtype == MP_ST_F32 ? 4 : 2;
  const size_t at = 8 + (size_t)n + (size_t)t->begin + (size_t)e * eb;
  FUZZ_ASSERT(8 + n <= len && at + eb <= 8 + n + (size_t)t->end && (size_t)t->end + 8 + n <= len);
  return ref_value(b + at, t->dtype);
}

/* ---- every tensor to fp32 ------------------------------------------------------------------ */

static void check_tensor(const mp_st_set *s, const mp_st_tensor *t, const uint8_t *sel) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  int64_t off[MP_ST_MAX_NDIM] = {0}, len[MP_ST_MAX_NDIM], numel = 1;
  for (int d = 0; d < t->ndim; d++) {
    len[d] = t->shape[d];
    numel *= t->shape[d];
  }
  FUZZ_ASSERT(t->begin >= 0 && t->end - t->begin == numel * (t->dtype == MP_ST_F32 ? 4 : 2));
  float *all = malloc((size_t)(numel ? numel : 1) * sizeof *all);
  if (!all) abort();
  mp_status st = mp_st_read_box(&ctx, s, t, off, len, all);
  fuzz_check_refusal(&ctx, st);
  if (st != MP_OK) {
    FUZZ_ASSERT(t->ndim > 3);
    free(all);
    return;
  }
  for (int64_t e = 0; e < numel; e++) FUZZ_ASSERT(same_float(all[e], ref_element(s, t, e)));
  /* a box: from sel[d] within each dim, to the end or half way */
  if (t->ndim >= 1 && numel > 0) {
    int64_t bn = 1;
    for (int d = 0; d < t->ndim; d++) {
      off[d] = sel[d % 4] % t->shape[d];
      len[d] = (sel[(d + 1) % 4] & 1) ? t->shape[d] - off[d] : (t->shape[d] - off[d] + 1) / 2;
      bn *= len[d];
    }
    float *box = malloc((size_t)(bn ? bn : 1) * sizeof *box);
    if (!box) abort();
    mp_ctx_init(&ctx);
    FUZZ_ASSERT(mp_st_read_box(&ctx, s, t, off, len, box) == MP_OK);
    const int nd = t->ndim;
    const int64_t l1 = nd >= 2 ? len[nd - 2] : 1, l2 = len[nd - 1];
    const int64_t s1 = nd >= 2 ? t->shape[nd - 2] : 1, s2 = t->shape[nd - 1];
    for (int64_t i = 0; i < bn; i++) { /* box element i -> the tensor's element */
      const int64_t c = i % l2, r = (i / l2) % l1, a = i / (l1 * l2);
      const int64_t o0 = nd == 3 ? off[0] : 0, o1 = nd >= 2 ? off[nd - 2] : 0, o2 = off[nd - 1];
      const int64_t g = ((o0 + a) * s1 + (o1 + r)) * s2 + (o2 + c);
      FUZZ_ASSERT(same_float(box[i], all[g]));
    }
    free(box);
  }
  free(all);
}

/* ---- the load on every rank ---------------------------------------------------------------- */

/* The tile of parameter i written by the load, against the elements of its Hugging Face
 * tensor(s) in the set (arg): element (a, b, c) of the tile is global (off + (a, b, c)); a
 * routed-expert parameter [E, R, C] is one tensor [R, C] per expert. */
static void on_write(const mp_runtime *rt, int i, mp_state_kind k, const int64_t *off, const int64_t *len,
                     const float *src, void *arg) {
  const mp_st_set *s = arg;
  FUZZ_ASSERT(k == MP_STATE_PARAM);
  const mp_param *p = &rt->plan->params[i];
  int64_t numel = 1;
  for (int d = 0; d < p->ndim; d++) numel *= len[d];
  const int experts = mp_hf_is_experts(p->fqn);
  const int64_t L1 = p->ndim >= 2 ? len[p->ndim - 2] : 1, L2 = len[p->ndim - 1];
  const int64_t S2 = p->shape[p->ndim - 1];
  for (int64_t e = 0; e < numel; e++) {
    const int64_t c = e % L2, r = (e / L2) % L1, a = e / (L1 * L2);
    char name[512];
    int64_t g;
    if (experts) {
      FUZZ_ASSERT(mp_hf_name(p->fqn, (int)(off[0] + a), name, sizeof name));
      g = (off[1] + r) * S2 + off[2] + c;
    } else {
      FUZZ_ASSERT(mp_hf_name(p->fqn, 0, name, sizeof name));
      g = p->ndim >= 2 ? (off[0] + r) * S2 + off[1] + c : off[0] + c;
    }
    const mp_st_tensor *t = mp_st_find(s, name);
    FUZZ_ASSERT(t != NULL);
    FUZZ_ASSERT(same_float(src[e], ref_element(s, t, g)));
  }
}

static void check_loads(const mp_st_set *s) {
  for (int m = 0; m < N_MODELS; m++)
    for (int k = 0; k < N_MESHES; k++) {
      if (!g_plans[m][k]) continue;
      for (int rank = 0; rank < k_meshes[k].world; rank++) {
        mp_runtime rt = {g_plans[m][k], rank, 0, on_write, (void *)s};
        mp_ctx ctx;
        mp_ctx_init(&ctx);
        const mp_status st = mp_hf_load_set(&ctx, &rt, s, "fuzz");
        fuzz_check_refusal(&ctx, st);
        if (st != MP_OK) break; /* the other ranks refuse the same file alike */
      }
    }
}

/* ---- the input ------------------------------------------------------------------------------ */

static mp_status open_folder(mp_ctx *ctx, const uint8_t *data, size_t size, mp_st_set **out) {
  const uint8_t *nul = memchr(data, 0, size);
  const size_t tl = nul ? (size_t)(nul - data) : size;
  char p[300];
  snprintf(p, sizeof p, "%s/model.safetensors.index.json", g_dir);
  write_file(p, data, tl);
  g_a = nul ? nul + 1 : (const uint8_t *)"";
  g_a_len = nul ? size - tl - 1 : 0;
  snprintf(p, sizeof p, "%s/a.safetensors", g_dir);
  write_file(p, g_a, g_a_len);
  g_single = NULL;
  return mp_st_open(ctx, g_dir, out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_st_set *s = NULL;
  mp_status st;
  if (size > 0 && data[0] == '{') {
    st = open_folder(&ctx, data, size, &s);
  } else {
    g_a = data;
    g_a_len = size;
    g_single = "fuzz.safetensors";
    st = mp_st_from_bytes(&ctx, data, size, g_single, &s);
  }
  fuzz_check_refusal(&ctx, st);
  if (st != MP_OK) return 0;
  const uint8_t sel[4] = {size > 8 ? data[size - 1] : 0, size > 9 ? data[size - 2] : 1, size > 10 ? data[size - 3] : 0,
                          size > 11 ? data[size - 4] : 1};
  for (int i = 0; i < mp_st_count(s); i++) check_tensor(s, mp_st_tensor_at(s, i), sel);
  check_loads(s);
  mp_st_close(s);
  return 0;
}
