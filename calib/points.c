/* What a calibration measures: the names and the FLOP and byte counts of its points, as
 * the simulator counts them (exec/schedule.c), and each device's default points
 * (calibrate.h lists them; docs/calibration.md says why these), the header every
 * measurement starts a calibration with, and the buffer sizes its GEMM and attention
 * points need. */
#include "calib/calibrate.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "calib/calib_internal.h"
#include "common/timeutil.h"

const char *mp_calib_coll_name(mp_calib_coll c) {
  switch (c) {
    case MP_CALIB_ALL_REDUCE: return "all_reduce";
    case MP_CALIB_ALL_GATHER: return "all_gather";
    case MP_CALIB_REDUCE_SCATTER: return "reduce_scatter";
    case MP_CALIB_ALL_TO_ALL: return "all_to_all";
    default: return "?";
  }
}

double mp_calib_bw_factor(mp_calib_coll c, int n) {
  if (n <= 1) return 0.0;
  double f = (double)(n - 1) / (double)n;
  return c == MP_CALIB_ALL_REDUCE ? 2.0 * f : f;
}

double mp_calib_lat_steps(mp_calib_coll c, int n) {
  if (n <= 1) return 0.0;
  return c == MP_CALIB_ALL_REDUCE ? 2.0 * (n - 1) : (double)(n - 1);
}

const char *mp_calib_gemm_pass_name(int pass) {
  switch (pass) {
    case MP_CALIB_GEMM_FWD: return "fwd";
    case MP_CALIB_GEMM_BWD: return "bwd";
    case MP_CALIB_GEMM_DGRAD: return "dgrad";
    case MP_CALIB_GEMM_WGRAD: return "wgrad";
    default: return "?";
  }
}

double mp_calib_gemm_flops(int pass, int N, int K, int M) {
  return (pass == MP_CALIB_GEMM_BWD ? 4.0 : 2.0) * (double)N * (double)K * (double)M;
}

mp_calib_gemm mp_calib_gemm_point(int pass, int N, int K, int M, double time_s) {
  mp_calib_gemm g = {pass, N, K, M, mp_calib_gemm_flops(pass, N, K, M) / time_s};
  return g;
}

double mp_calib_attn_flops(int backward, int B, int T, int nh, int hd) {
  /* exec/schedule.c attn_fwd_flops: 2 x tokens x seq x heads x hd, tokens = B T */
  double f = 2.0 * (double)B * (double)T * (double)T * (double)nh * (double)hd;
  return backward ? 2.0 * f : f;
}

const char *mp_calib_bw_name(int k) {
  switch (k) {
    case MP_CALIB_BW_RMSNORM_FWD: return "rmsnorm_fwd";
    case MP_CALIB_BW_RMSNORM_BWD: return "rmsnorm_bwd";
    case MP_CALIB_BW_SWIGLU_FWD: return "swiglu_fwd";
    case MP_CALIB_BW_SWIGLU_BWD: return "swiglu_bwd";
    case MP_CALIB_BW_ADAMW: return "adamw";
    case MP_CALIB_BW_ROPE_FWD: return "rope_fwd";
    case MP_CALIB_BW_ROPE_BWD: return "rope_bwd";
    case MP_CALIB_BW_CE_FWD: return "ce_fwd";
    case MP_CALIB_BW_CE_BWD: return "ce_bwd";
    case MP_CALIB_BW_RESIDUAL: return "residual";
    default: return "?";
  }
}

double mp_calib_bw_bytes(int k, double elems) {
  /* exec/schedule.c: norm_fwd 4e, norm_bwd 6e, swiglu 6e / 10e, BYTES_ADAMW 28, rope 4e
   * both ways, loss 10 (forward) and 8 (backward) per logit, residual 6e */
  static const double per[MP_CALIB_BW_COUNT] = {4.0, 6.0, 6.0, 10.0, 28.0, 4.0, 4.0, 10.0, 8.0, 6.0};
  return k >= 0 && k < MP_CALIB_BW_COUNT ? per[k] * elems : 0.0;
}

/* n attention points (B, T, nh, nkv, hd) into o. */
static void set_attn(mp_calib_options *o, const int (*a)[5], int n) {
  o->n_attn = n;
  for (int i = 0; i < n; i++) {
    o->attn[i].B = a[i][0];
    o->attn[i].T = a[i][1];
    o->attn[i].nh = a[i][2];
    o->attn[i].nkv = a[i][3];
    o->attn[i].hd = a[i][4];
  }
}

void mp_calib_options_init_cpu(mp_calib_options *o, int quick) {
  memset(o, 0, sizeof *o);
  o->reps = quick ? 3 : 5;
  /* the tiny models at 4 sequences of 64 tokens: q/o, k/v, gate/up, down, the LM head,
   * the router; their experts at 64 rows (256 x top-2 / 8); then training-sized shapes
   * (a CPU's GEMM rate rises with the size, then its caches run out) */
  static const int shapes[][3] = {{256, 64, 64},     {256, 64, 32},      {256, 64, 192},   {256, 192, 64},
                                  {256, 64, 256},    {256, 64, 8},       {64, 64, 32},     {64, 32, 64},
                                  {512, 256, 256},   {512, 256, 1024},   {512, 1024, 256}, {1024, 512, 512},
                                  {1024, 1024, 1024}, {1024, 1024, 4096}, {1024, 4096, 1024}};
  static const int quick_shapes[][3] = {{256, 64, 192}, {256, 192, 64}, {256, 64, 256}, {1024, 1024, 1024}};
  static const int passes[] = {MP_CALIB_GEMM_FWD, MP_CALIB_GEMM_DGRAD, MP_CALIB_GEMM_WGRAD};
  const int (*sh)[3] = quick ? quick_shapes : shapes;
  const int n_sh = quick ? 4 : (int)(sizeof shapes / sizeof shapes[0]);
  int n = 0;
  for (int i = 0; i < n_sh; i++)
    for (int p = 0; p < 3; p++) {
      o->gemm[n].pass = passes[p];
      o->gemm[n].N = sh[i][0];
      o->gemm[n].K = sh[i][1];
      o->gemm[n].M = sh[i][2];
      n++;
    }
  o->n_gemm = n;
  /* the tiny models' attention (hd 8) at 64 to 256 tokens, then wider heads */
  static const int attn[][5] = {{4, 64, 8, 4, 8}, {4, 128, 8, 4, 8}, {4, 256, 8, 4, 16}, {2, 256, 8, 4, 64},
                                {1, 512, 8, 4, 64}};
  static const int attn_quick[][5] = {{4, 64, 8, 4, 8}, {2, 256, 8, 4, 64}};
  set_attn(o, quick ? attn_quick : attn, quick ? 2 : 5);
  /* Element-wise: the tiny models' tensor (256 tokens, d_model 64, d_ff 192, 8 heads of
   * 8, vocabulary 256; AdamW on the gate's 64 x 192), 2^18 elements (cache-resident; the
   * kernels go parallel above 2^14 to 2^16 elements) and 2^22 (16 MiB in fp32: DRAM).
   * Forward before backward at each size: the backward reads what the forward saved. */
  static const int bw[][4][3] = {
      /* kernel pair: tiny, 2^18, 2^22 as (rows, cols) (hd for RoPE below) */
      {{256, 64}, {1024, 256}, {4096, 1024}},  /* rmsnorm */
      {{256, 192}, {1024, 256}, {4096, 1024}}, /* swiglu */
      {{256, 64}, {1024, 256}, {4096, 1024}},  /* rope: tokens x (heads x hd) */
      {{256, 256}, {512, 512}, {1024, 4096}},  /* cross-entropy: tokens x vocab */
  };
  static const int pairs[][2] = {{MP_CALIB_BW_RMSNORM_FWD, MP_CALIB_BW_RMSNORM_BWD},
                                 {MP_CALIB_BW_SWIGLU_FWD, MP_CALIB_BW_SWIGLU_BWD},
                                 {MP_CALIB_BW_ROPE_FWD, MP_CALIB_BW_ROPE_BWD},
                                 {MP_CALIB_BW_CE_FWD, MP_CALIB_BW_CE_BWD}};
  static const int singles[][3][2] = {
      {{64, 192}, {512, 512}, {2048, 2048}}, /* adamw */
      {{256, 64}, {1024, 256}, {4096, 1024}}, /* residual */
  };
  static const int single_kernel[] = {MP_CALIB_BW_ADAMW, MP_CALIB_BW_RESIDUAL};
  const int n_sizes = quick ? 1 : 3;
  n = 0;
  for (int z = 0; z < n_sizes; z++) {
    for (int k = 0; k < 4; k++)
      for (int d = 0; d < 2; d++) {
        o->bw[n].kernel = pairs[k][d];
        o->bw[n].rows = bw[k][z][0];
        o->bw[n].cols = bw[k][z][1];
        o->bw[n].hd = k == 2 ? (z == 0 ? 8 : 64) : 0;
        n++;
      }
    for (int k = 0; k < 2; k++) {
      o->bw[n].kernel = single_kernel[k];
      o->bw[n].rows = singles[k][z][0];
      o->bw[n].cols = singles[k][z][1];
      n++;
    }
  }
  o->n_bw = n;
  static const double sizes[] = {256, 4096, 65536, 1048576, 8388608};
  o->n_sizes = (int)(sizeof sizes / sizeof sizes[0]);
  memcpy(o->sizes_bytes, sizes, sizeof sizes);
  o->copy_bytes = quick ? (int64_t)16 << 20 : (int64_t)64 << 20;
}

void mp_calib_options_init(mp_calib_options *o) { mp_calib_options_init_cpu(o, 0); }

void mp_calib_options_init_cuda(mp_calib_options *o, int quick) {
  memset(o, 0, sizeof *o);
  o->reps = quick ? 3 : 7;
  /* Linear (in K, out M) of Llama models: q/o of 1B-, 8B- and 70B-class models, the MLP
   * up/down of the 1B (2048 x 8192) and 8B (4096 x 14336) models, a 32000 LM head. */
  static const int km[][2] = {{1024, 1024}, {2048, 2048}, {2048, 8192},  {8192, 2048}, {4096, 4096},
                               {4096, 14336}, {14336, 4096}, {4096, 32000}, {8192, 8192}};
  static const int km_quick[][2] = {{2048, 2048}, {4096, 4096}, {4096, 14336}};
  static const int tokens[] = {512, 2048, 8192}, tokens_quick[] = {2048};
  static const int passes[] = {MP_CALIB_GEMM_FWD, MP_CALIB_GEMM_DGRAD, MP_CALIB_GEMM_WGRAD};
  const int (*shapes)[2] = quick ? km_quick : km;
  const int n_shapes = quick ? 3 : 9, n_tok = quick ? 1 : 3;
  const int *tok = quick ? tokens_quick : tokens;
  int n = 0;
  for (int t = 0; t < n_tok; t++)
    for (int i = 0; i < n_shapes; i++)
      for (int p = 0; p < 3 && n < MP_CALIB_MAX_GEMM; p++) {
        o->gemm[n].pass = passes[p];
        o->gemm[n].N = tok[t];
        o->gemm[n].K = shapes[i][0];
        o->gemm[n].M = shapes[i][1];
        n++;
      }
  o->n_gemm = n;
  /* 16384 tokens per call at every sequence length, GQA 2:1 as the 1B model; hd 64 with
   * twice the heads keeps the width */
  static const int attn[][5] = {{16, 1024, 16, 8, 128}, {8, 2048, 16, 8, 128}, {4, 4096, 16, 8, 128},
                                {2, 8192, 16, 8, 128},  {8, 2048, 32, 8, 64}};
  static const int attn_quick[][5] = {{8, 2048, 16, 8, 128}, {2, 8192, 16, 8, 128}};
  set_attn(o, quick ? attn_quick : attn, quick ? 2 : 5);
  /* float8: the same shapes and passes, as the runtime calls matmul_f8 for a Linear
   * (every size above is a multiple of 16, as the kernel needs). A float8 point costs
   * less than its bf16 one (the loop is as long, the calls shorter): about 1 to 2 s more
   * on an H100. */
  o->n_f8 = o->n_gemm;
  for (int i = 0; i < o->n_gemm; i++) {
    o->f8[i].pass = o->gemm[i].pass;
    o->f8[i].N = o->gemm[i].N;
    o->f8[i].K = o->gemm[i].K;
    o->f8[i].M = o->gemm[i].M;
  }
  /* training-sized tensors, each far beyond the 50 MB L2 of an H100 */
  o->norm_rows = 8192;
  o->norm_cols = 4096;
  o->swiglu_elems = (int64_t)8192 * 14336;
  o->adamw_elems = (int64_t)1 << 26;
  o->copy_bytes = (int64_t)256 << 20;
}

double mp_calib_bw_flops(int k, double elems) {
  /* exec/schedule.c: FLOPS_NORM_FWD 4, _BWD 8, SWIGLU 5 / 8, ADAMW 16, ROPE 3 both ways,
   * LOSS 5 forward and 2 backward per logit, residual 1 */
  static const double per[MP_CALIB_BW_COUNT] = {4.0, 8.0, 5.0, 8.0, 16.0, 3.0, 3.0, 5.0, 2.0, 1.0};
  return k >= 0 && k < MP_CALIB_BW_COUNT ? per[k] * elems : 0.0;
}

void mp_calib_begin(mp_calib *out, const char *device, int threads, int world) {
  memset(out, 0, sizeof *out);
  mp_now_iso(out->created_at, sizeof out->created_at);
  snprintf(out->device, sizeof out->device, "%s", device);
  if (gethostname(out->host, sizeof out->host) != 0) snprintf(out->host, sizeof out->host, "unknown");
  out->host[sizeof out->host - 1] = '\0';
  out->threads = threads;
  out->world = world;
}

void mp_calib_gemm_extents(const mp_calib_gemm_shape *g, int n, size_t *nk, size_t *mk, size_t *nm) {
  *nk = *mk = *nm = 1;
  for (int i = 0; i < n; i++) {
    const size_t N = (size_t)g[i].N, K = (size_t)g[i].K, M = (size_t)g[i].M;
    if (N * K > *nk) *nk = N * K;
    if (M * K > *mk) *mk = M * K;
    if (N * M > *nm) *nm = N * M;
  }
}

void mp_calib_attn_extents(const mp_calib_options *o, size_t *q, size_t *kv, size_t *rows) {
  *q = *kv = *rows = 1;
  for (int i = 0; i < o->n_attn; i++) {
    const size_t B = (size_t)o->attn[i].B, T = (size_t)o->attn[i].T;
    if (B * T * o->attn[i].nh * o->attn[i].hd > *q) *q = B * T * o->attn[i].nh * o->attn[i].hd;
    if (B * T * o->attn[i].nkv * o->attn[i].hd > *kv) *kv = B * T * o->attn[i].nkv * o->attn[i].hd;
    if (B * T * o->attn[i].nh > *rows) *rows = B * T * o->attn[i].nh;
  }
}
