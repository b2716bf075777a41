/* kernel_dump: runs every CPU kernel forward and backward on inputs drawn from a seed and
 * writes inputs, outputs and gradients to one file for tests/reference/kernels_ref.py,
 * which recomputes them with torch.autograd.
 *
 * Usage: kernel_dump OUT_PATH [SEED]
 *
 * File format "MPKD" version 1, little-endian throughout:
 *   char magic[4] = "MPKD"; u32 version = 1; u32 count;
 *   count times: u32 name_len; char name[name_len] (no NUL, "op.tensor");
 *                u32 dtype (0 = f32, 1 = i32); u32 ndim; u32 dims[ndim];
 *                the elements, row-major, 4 bytes each.
 * Scalars (eps, k, learning rate...) are 1-element tensors. Gradients named d<x> are the
 * gradient of L = sum(out * dout) (dout dumped too) with respect to x, starting from
 * zero buffers. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu.h"

static FILE *g_out;
static uint32_t g_count;
static uint64_t g_rng;

static float urand(float lo, float hi) {
  g_rng ^= g_rng << 13;
  g_rng ^= g_rng >> 7;
  g_rng ^= g_rng << 17;
  return lo + (hi - lo) * (float)((g_rng >> 11) & 0xFFFFFF) / (float)0x1000000;
}

static float *fvec(size_t n, float lo, float hi) {
  float *v = (float *)malloc(sizeof(float) * (n ? n : 1));
  for (size_t i = 0; i < n; i++) v[i] = urand(lo, hi);
  return v;
}

static float *zeros(size_t n) { return (float *)calloc(n ? n : 1, sizeof(float)); }

static void put_u32(uint32_t x) {
  unsigned char b[4] = {(unsigned char)x, (unsigned char)(x >> 8), (unsigned char)(x >> 16),
                        (unsigned char)(x >> 24)};
  fwrite(b, 1, 4, g_out);
}

/* dims: up to 4, terminated by 0. */
static void put(const char *name, int dtype, const void *data, int d0, int d1, int d2, int d3) {
  int dims[4] = {d0, d1, d2, d3}, nd = 0;
  size_t n = 1;
  while (nd < 4 && dims[nd] > 0) n *= (size_t)dims[nd++];
  put_u32((uint32_t)strlen(name));
  fwrite(name, 1, strlen(name), g_out);
  put_u32((uint32_t)dtype);
  put_u32((uint32_t)nd);
  for (int i = 0; i < nd; i++) put_u32((uint32_t)dims[i]);
  const uint32_t *w = (const uint32_t *)data; /* f32 and i32 are both 4-byte words */
  for (size_t i = 0; i < n; i++) put_u32(w[i]);
  g_count++;
}
#define PUTF(name, p, ...) put(name, 0, p, __VA_ARGS__)
#define PUTI(name, p, ...) put(name, 1, p, __VA_ARGS__)

static void put_scalar(const char *name, float x) { put(name, 0, &x, 1, 0, 0, 0); }

#define CHECK(call)                                                              \
  do {                                                                           \
    if ((call) != MP_OK) {                                                       \
      fprintf(stderr, "kernel_dump: %s failed: %s\n", #call, mp_errmsg(&err));   \
      return 1;                                                                  \
    }                                                                            \
  } while (0)

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: kernel_dump OUT_PATH [SEED]\n");
    return 2;
  }
  g_rng = 88172645463325252ull ^ (argc > 2 ? strtoull(argv[2], NULL, 10) : 1);
  g_out = fopen(argv[1], "wb");
  if (!g_out) {
    fprintf(stderr, "kernel_dump: cannot open %s for writing\n", argv[1]);
    return 1;
  }
  mp_ctx err;
  mp_ctx_init(&err);
  mp_kctx kc = {&err, NULL, 0};
  const mp_backend *be = mp_backend_cpu();
  fwrite("MPKD", 1, 4, g_out);
  put_u32(1);
  put_u32(0); /* count, patched at the end */

  { /* embedding, whole and a vocab-parallel shard [4, 9) */
    int N = 9, C = 7, V = 11;
    int32_t tok[9] = {3, 10, 0, 3, 7, 5, 3, 8, 4};
    float *wte = fvec((size_t)V * C, -1, 1), *dout = fvec((size_t)N * C, -1, 1);
    float *out = zeros((size_t)N * C), *dwte = zeros((size_t)V * C);
    CHECK(be->embedding_forward(&kc, out, tok, wte, N, C, 0, V));
    CHECK(be->embedding_backward(&kc, dwte, dout, tok, N, C, 0, V));
    PUTI("embedding.tokens", tok, N, 0, 0, 0);
    PUTF("embedding.wte", wte, V, C, 0, 0);
    PUTF("embedding.dout", dout, N, C, 0, 0);
    PUTF("embedding.out", out, N, C, 0, 0);
    PUTF("embedding.dwte", dwte, V, C, 0, 0);
    float *outs = zeros((size_t)N * C), *dws = zeros((size_t)5 * C);
    CHECK(be->embedding_forward(&kc, outs, tok, wte + 4 * C, N, C, 4, 9));
    CHECK(be->embedding_backward(&kc, dws, dout, tok, N, C, 4, 9));
    PUTF("embedding.shard_out", outs, N, C, 0, 0);
    PUTF("embedding.shard_dwte", dws, 5, C, 0, 0);
  }
  { /* layernorm */
    int N = 5, C = 13;
    float eps = 1e-5f;
    float *x = fvec((size_t)N * C, -2, 3), *w = fvec(C, 0.5f, 1.5f), *b = fvec(C, -1, 1);
    float *dout = fvec((size_t)N * C, -1, 1), *out = zeros((size_t)N * C), *mean = zeros(N),
          *rstd = zeros(N), *dx = zeros((size_t)N * C), *dw = zeros(C), *db = zeros(C);
    CHECK(be->layernorm_forward(&kc, out, mean, rstd, x, w, b, N, C, eps));
    CHECK(be->layernorm_backward(&kc, dx, dw, db, dout, x, w, mean, rstd, N, C));
    put_scalar("layernorm.eps", eps);
    PUTF("layernorm.x", x, N, C, 0, 0);
    PUTF("layernorm.w", w, C, 0, 0, 0);
    PUTF("layernorm.b", b, C, 0, 0, 0);
    PUTF("layernorm.dout", dout, N, C, 0, 0);
    PUTF("layernorm.out", out, N, C, 0, 0);
    PUTF("layernorm.dx", dx, N, C, 0, 0);
    PUTF("layernorm.dw", dw, C, 0, 0, 0);
    PUTF("layernorm.db", db, C, 0, 0, 0);
  }
  { /* rmsnorm */
    int N = 6, C = 11;
    float eps = 1e-6f;
    float *x = fvec((size_t)N * C, -2, 2), *w = fvec(C, 0.5f, 1.5f);
    float *dout = fvec((size_t)N * C, -1, 1), *out = zeros((size_t)N * C), *rstd = zeros(N),
          *dx = zeros((size_t)N * C), *dw = zeros(C);
    CHECK(be->rmsnorm_forward(&kc, out, rstd, x, w, N, C, eps));
    CHECK(be->rmsnorm_backward(&kc, dx, dw, dout, x, w, rstd, N, C));
    put_scalar("rmsnorm.eps", eps);
    PUTF("rmsnorm.x", x, N, C, 0, 0);
    PUTF("rmsnorm.w", w, C, 0, 0, 0);
    PUTF("rmsnorm.dout", dout, N, C, 0, 0);
    PUTF("rmsnorm.out", out, N, C, 0, 0);
    PUTF("rmsnorm.dx", dx, N, C, 0, 0);
    PUTF("rmsnorm.dw", dw, C, 0, 0, 0);
  }
  { /* rope */
    int B = 2, T = 5, nh = 3, hd = 8;
    float theta = 500000.0f;
    size_t n = (size_t)B * T * nh * hd;
    float *cs = zeros((size_t)T * hd / 2), *sn = zeros((size_t)T * hd / 2);
    mp_rope_tables(cs, sn, T, hd, theta, 0);
    float *x = fvec(n, -1, 1), *dout = fvec(n, -1, 1), *out = zeros(n), *dx = zeros(n);
    CHECK(be->rope_forward(&kc, out, x, cs, sn, B, T, nh, hd));
    CHECK(be->rope_backward(&kc, dx, dout, cs, sn, B, T, nh, hd));
    put_scalar("rope.theta", theta);
    PUTF("rope.x", x, B, T, nh, hd);
    PUTF("rope.dout", dout, B, T, nh, hd);
    PUTF("rope.out", out, B, T, nh, hd);
    PUTF("rope.dx", dx, B, T, nh, hd);
  }
  { /* attention, grouped-query */
    int B = 2, T = 7, nh = 4, nkv = 2, hd = 5;
    size_t nq = (size_t)B * T * nh * hd, nk = (size_t)B * T * nkv * hd;
    float *q = fvec(nq, -1, 1), *k = fvec(nk, -1, 1), *v = fvec(nk, -1, 1),
          *dout = fvec(nq, -1, 1);
    float *out = zeros(nq), *lse = zeros((size_t)B * nh * T), *dq = zeros(nq), *dk = zeros(nk),
          *dv = zeros(nk);
    CHECK(be->attention_forward(&kc, out, lse, q, k, v, B, T, nh, nkv, hd, hd));
    CHECK(be->attention_backward(&kc, dq, dk, dv, dout, q, k, v, out, lse, B, T, nh, nkv, hd, hd));
    PUTF("attention.q", q, B, T, nh, hd);
    PUTF("attention.k", k, B, T, nkv, hd);
    PUTF("attention.v", v, B, T, nkv, hd);
    PUTF("attention.dout", dout, B, T, nh, hd);
    PUTF("attention.out", out, B, T, nh, hd);
    PUTF("attention.lse", lse, B, nh, T, 0);
    PUTF("attention.dq", dq, B, T, nh, hd);
    PUTF("attention.dk", dk, B, T, nkv, hd);
    PUTF("attention.dv", dv, B, T, nkv, hd);
  }
  { /* span attention: query chunks and kv chunks inside longer tensors, merged in turn.
     * q (B, Sq=9): chunk Q1 rows 2..7 at positions 10..15, chunk Q0 rows 0..1 at 0..1, row
     * 8 in no chunk. k, v (B, Sk=11): chunk A rows 0..4 at positions 3..7 (before every
     * query of Q1), chunk B rows 5..10 at 12..17 (crossing Q1's diagonal), and chunk C,
     * rows 0..4 again at 16..20 (after every query of Q1: a pair that does nothing). Q0
     * sees no key of A or B: its rows and row 8 stay empty. */
    int B = 2, Sq = 9, Sk = 11, nh = 4, nkv = 2, hd = 5;
    enum { NPAIRS = 5 };
    /* q_row, Tq, q_pos, kv_row, Tk, kv_pos */
    int32_t pairs[NPAIRS][6] = {{2, 6, 10, 0, 5, 3}, {2, 6, 10, 5, 6, 12}, {2, 6, 10, 0, 5, 16},
                                {0, 2, 0, 0, 5, 3}, {0, 2, 0, 5, 6, 12}};
    size_t nq = (size_t)B * Sq * nh * hd, nk = (size_t)B * Sk * nkv * hd, nl = (size_t)B * nh * Sq;
    float *q = fvec(nq, -1.5f, 1.5f), *k = fvec(nk, -1.5f, 1.5f), *v = fvec(nk, -1, 1),
          *dout = fvec(nq, -1, 1);
    float *acc = zeros(nq), *lse = zeros(nl), *out = zeros(nq), *D = zeros(nl), *dq = zeros(nq),
          *dk = zeros(nk), *dv = zeros(nk);
    CHECK(be->attention_span_init(&kc, lse, nl));
    for (int i = 0; i < NPAIRS; i++) {
      mp_attn_span sp = {B, nh, nkv, hd, Sq, pairs[i][0], pairs[i][1], pairs[i][2],
                         Sk, pairs[i][3], pairs[i][4], pairs[i][5]};
      CHECK(be->attention_span_forward(&kc, acc, lse, q, k, v, &sp));
    }
    CHECK(be->attention_span_finalize(&kc, out, acc, lse, B, Sq, nh, hd));
    CHECK(be->attention_span_dot(&kc, D, dout, out, B, Sq, nh, hd));
    for (int i = 0; i < NPAIRS; i++) {
      mp_attn_span sp = {B, nh, nkv, hd, Sq, pairs[i][0], pairs[i][1], pairs[i][2],
                         Sk, pairs[i][3], pairs[i][4], pairs[i][5]};
      CHECK(be->attention_span_backward(&kc, dq, dk, dv, dout, q, k, v, lse, D, &sp));
    }
    PUTI("span.pairs", pairs, NPAIRS, 6, 0, 0);
    PUTF("span.q", q, B, Sq, nh, hd);
    PUTF("span.k", k, B, Sk, nkv, hd);
    PUTF("span.v", v, B, Sk, nkv, hd);
    PUTF("span.dout", dout, B, Sq, nh, hd);
    PUTF("span.out", out, B, Sq, nh, hd);
    PUTF("span.lse", lse, B, nh, Sq, 0);
    PUTF("span.D", D, B, nh, Sq, 0);
    PUTF("span.dq", dq, B, Sq, nh, hd);
    PUTF("span.dk", dk, B, Sk, nkv, hd);
    PUTF("span.dv", dv, B, Sk, nkv, hd);
  }
  { /* gelu and swiglu */
    int N = 3, H = 17;
    size_t n = (size_t)N * H;
    float *x = fvec(n, -4, 4), *g = fvec(n, -4, 4), *u = fvec(n, -2, 2), *dout = fvec(n, -1, 1);
    float *out = zeros(n), *dx = zeros(n), *o2 = zeros(n), *dg = zeros(n), *du = zeros(n);
    CHECK(be->gelu_forward(&kc, out, x, n));
    CHECK(be->gelu_backward(&kc, dx, dout, x, n));
    CHECK(be->swiglu_forward(&kc, o2, g, u, n));
    CHECK(be->swiglu_backward(&kc, dg, du, dout, g, u, n));
    PUTF("gelu.x", x, N, H, 0, 0);
    PUTF("gelu.dout", dout, N, H, 0, 0);
    PUTF("gelu.out", out, N, H, 0, 0);
    PUTF("gelu.dx", dx, N, H, 0, 0);
    PUTF("swiglu.gate", g, N, H, 0, 0);
    PUTF("swiglu.up", u, N, H, 0, 0);
    PUTF("swiglu.dout", dout, N, H, 0, 0);
    PUTF("swiglu.out", o2, N, H, 0, 0);
    PUTF("swiglu.dgate", dg, N, H, 0, 0);
    PUTF("swiglu.dup", du, N, H, 0, 0);
  }
  { /* matmul (Linear with bias), crossing the GEMM's blocking edges */
    int N = 79, K = 263, M = 137;
    float *x = fvec((size_t)N * K, -1, 1), *W = fvec((size_t)M * K, -1, 1), *b = fvec(M, -1, 1),
          *dout = fvec((size_t)N * M, -1, 1);
    float *out = zeros((size_t)N * M), *dx = zeros((size_t)N * K), *dW = zeros((size_t)M * K),
          *db = zeros(M);
    CHECK(be->matmul_forward(&kc, out, x, W, b, N, K, M));
    CHECK(be->matmul_backward(&kc, dx, dW, db, dout, x, W, N, K, M));
    PUTF("matmul.x", x, N, K, 0, 0);
    PUTF("matmul.w", W, M, K, 0, 0);
    PUTF("matmul.b", b, M, 0, 0, 0);
    PUTF("matmul.dout", dout, N, M, 0, 0);
    PUTF("matmul.out", out, N, M, 0, 0);
    PUTF("matmul.dx", dx, N, K, 0, 0);
    PUTF("matmul.dw", dW, M, K, 0, 0);
    PUTF("matmul.db", db, M, 0, 0, 0);
  }
  { /* router + aux loss + permute/unpermute: one MoE dispatch and combine */
    int N = 6, E = 8, k = 2, C = 5, norm = 1;
    float alpha = 0.01f;
    float *logits = fvec((size_t)N * E, -2, 2), *dw_up = fvec((size_t)N * k, -1, 1);
    float *probs = zeros((size_t)N * E), *w = zeros((size_t)N * k), *f = zeros(E);
    int32_t *idx = (int32_t *)calloc((size_t)N * k, 4), *perm = (int32_t *)calloc((size_t)N * k, 4),
            *inv = (int32_t *)calloc((size_t)N * k, 4), *counts = (int32_t *)calloc(E, 4);
    float aux = 0;
    CHECK(be->router_forward(&kc, probs, idx, w, logits, N, E, k, norm));
    CHECK(be->router_aux_loss_forward(&kc, &aux, f, probs, idx, N, E, k));
    float *dprobs = zeros((size_t)N * E), *dlogits = zeros((size_t)N * E);
    CHECK(be->router_aux_loss_backward(&kc, dprobs, f, alpha, N, E));
    CHECK(be->router_backward(&kc, dlogits, dw_up, dprobs, probs, idx, N, E, k, norm));
    put_scalar("router.k", (float)k);
    put_scalar("router.norm", (float)norm);
    put_scalar("router.alpha", alpha);
    PUTF("router.logits", logits, N, E, 0, 0);
    PUTF("router.dtopk_w", dw_up, N, k, 0, 0);
    PUTF("router.probs", probs, N, E, 0, 0);
    PUTI("router.topk_idx", idx, N, k, 0, 0);
    PUTF("router.topk_w", w, N, k, 0, 0);
    put_scalar("router.aux", aux);
    PUTF("router.dlogits", dlogits, N, E, 0, 0);
    /* Permute x by expert; combine independent random expert outputs y with w; then send
     * the combine's dy back through permute_backward (as if the experts were identity). */
    CHECK(be->moe_plan(&kc, perm, inv, counts, idx, N, E, k));
    float *x = fvec((size_t)N * C, -1, 1), *xp = zeros((size_t)N * k * C),
          *y = fvec((size_t)N * k * C, -1, 1), *out = zeros((size_t)N * C),
          *dout = fvec((size_t)N * C, -1, 1), *dy = zeros((size_t)N * k * C),
          *dw = zeros((size_t)N * k), *dx = zeros((size_t)N * C);
    CHECK(be->permute_forward(&kc, xp, x, perm, N, k, C));
    CHECK(be->unpermute_forward(&kc, out, y, w, inv, N, k, C));
    CHECK(be->unpermute_backward(&kc, dy, dw, dout, y, w, inv, N, k, C));
    CHECK(be->permute_backward(&kc, dx, dy, inv, N, k, C));
    PUTI("permute.perm", perm, N * k, 0, 0, 0);
    PUTI("permute.counts", counts, E, 0, 0, 0);
    PUTF("permute.x", x, N, C, 0, 0);
    PUTF("permute.xp", xp, N * k, C, 0, 0);
    PUTF("permute.y", y, N * k, C, 0, 0);
    PUTF("permute.dout", dout, N, C, 0, 0);
    PUTF("permute.out", out, N, C, 0, 0);
    PUTF("permute.dy", dy, N * k, C, 0, 0);
    PUTF("permute.dw", dw, N, k, 0, 0);
    PUTF("permute.dx_from_dy", dx, N, C, 0, 0);
  }
  { /* cross-entropy, mean over valid rows, one ignored row */
    int N = 7, V = 23;
    float *logits = fvec((size_t)N * V, -3, 3);
    int32_t tgt[7] = {3, 22, -100, 0, 9, 3, 14};
    float *losses = zeros(N), *lse = zeros(N), *dl = zeros((size_t)N * V), mean = 0;
    CHECK(be->cross_entropy_forward(&kc, losses, &mean, lse, logits, tgt, N, V));
    CHECK(be->ce_backward(&kc, dl, logits, lse, tgt, 1.0f / 6, N, V, 0));
    PUTF("ce.logits", logits, N, V, 0, 0);
    PUTI("ce.targets", tgt, N, 0, 0, 0);
    PUTF("ce.losses", losses, N, 0, 0, 0);
    put_scalar("ce.loss", mean);
    PUTF("ce.dlogits", dl, N, V, 0, 0);
  }
  { /* AdamW: three steps, clip scale 0.7 on step 2 */
    size_t n = 29;
    float lr = 3e-3f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
    float *p = fvec(n, -1, 1), *m = zeros(n), *v = zeros(n);
    PUTF("adamw.p0", p, (int)n, 0, 0, 0);
    char name[32];
    for (int s = 1; s <= 3; s++) {
      float *g = fvec(n, -1, 1), gs = s == 2 ? 0.7f : 1.0f;
      CHECK(be->adamw_update(&kc, p, g, m, v, n, lr, b1, b2, eps, wd, s, gs));
      snprintf(name, sizeof name, "adamw.g%d", s);
      PUTF(name, g, (int)n, 0, 0, 0);
      snprintf(name, sizeof name, "adamw.scale%d", s);
      put_scalar(name, gs);
    }
    PUTF("adamw.p3", p, (int)n, 0, 0, 0);
    put_scalar("adamw.lr", lr);
    put_scalar("adamw.beta1", b1);
    put_scalar("adamw.beta2", b2);
    put_scalar("adamw.eps", eps);
    put_scalar("adamw.wd", wd);
    float ss = 0;
    CHECK(be->sum_squares(&kc, &ss, p, n));
    put_scalar("adamw.p3_sumsq", ss);
  }
  fseek(g_out, 8, SEEK_SET);
  put_u32(g_count);
  if (fclose(g_out) != 0) {
    fprintf(stderr, "kernel_dump: write to %s failed\n", argv[1]);
    return 1;
  }
  printf("kernel_dump: wrote %u tensors to %s\n", g_count, argv[1]);
  return 0;
}
