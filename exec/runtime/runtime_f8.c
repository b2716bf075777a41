/* The training runtime: Linear layers, with float8 emulated or as GEMMs on codes
 * (runtime_internal.h lists the runtime's files).
 *
 * torchao's Float8Linear with tensorwise dynamic scales: forward y = q4(x) q4(W)^T,
 * backward dx = q5(dy) q4(W), dW = q5(dy)^T q4(x) (q4: E4M3, q5: E5M2). The amax is over
 * the whole logical tensor: under tp the local pieces are reduced with an all-reduce MAX,
 * so every plan quantizes exactly as the single-rank run does.
 *   Emulated (a backend whose X is fp32, the CPU reference): fake quantization
 *     (dequantize(quantize(x))) of each operand into FP8 scratch, then the fp32 GEMM.
 *   On codes (a backend whose X is not fp32, cuBLASLt; or the option f8_codes): real
 *     float8 GEMMs. backward's B = W^T codes for dx, A = dy^T and B = x^T codes for dW
 *     (cuBLASLt's float8 GEMM wants both operands K-contiguous). A tensor is read once for
 *     its amax and once for its codes (f8_quantize_t writes both orientations in that
 *     pass); an activation read by several Linears of a block is quantized once inside the
 *     block's scope; an amax is taken from the kernel that produced the tensor (RMSNorm,
 *     SwiGLU) or kept from the forward for the weight gradients; a weight that is not
 *     FSDP-sharded keeps its codes until the next optimizer step changes it. */
#include "exec/runtime/runtime_internal.h"

/* The known amax of x (n elements), or NULL (codes path only; see f8_known). */
static f8_known *f8_known_of(mp_runtime *rt, const void *x, size_t n) {
  for (int i = 0; i < rt->f8k_n; i++)
    if (rt->f8k[i].x == x && rt->f8k[i].n == n) return &rt->f8k[i];
  return NULL;
}

/* Records that *amax holds x's amax (reduced over tp or not). Forgotten at the scope's end;
 * a full table just means the consumer reads x for its amax again. */
void mp_rt_f8_known_set(mp_runtime *rt, const void *x, size_t n, float *amax, int reduced) {
  f8_known *k = f8_known_of(rt, x, n);
  if (!k && rt->f8k_n < F8_KNOWN_MAX) k = &rt->f8k[rt->f8k_n++];
  if (k) *k = (f8_known){x, n, amax, reduced};
}

/* The scale of x (n elements, X) into scale: its amax all-reduced (MAX) over tp, the
 * tensor's dynamic tensorwise scale as the single-rank run would compute it. The amax is
 * read from a known one (f8_known) when there is one, else computed into amax. */
static mp_status f8_scale(mp_ctx *ctx, mp_runtime *rt, float *amax, float *scale, const void *x, size_t n,
                          mp_f8_format fmt) {
  f8_known *k = f8_known_of(rt, x, n);
  if (k) {
    amax = k->amax;
  } else {
    BE(f8_amax(rt->kc, amax, x, n));
  }
  if (rt->tp > 1 && !(k && k->reduced))
    MP_CHECK(mp_comm_all_reduce(ctx, rt->comm, MP_GROUP_TP, amax, amax, 1, MP_COMM_DTYPE_FP32, MP_COMM_OP_MAX));
  if (k) k->reduced = 1;
  BE(f8_scale_from_amax(rt->kc, scale, amax, fmt));
  return MP_OK;
}

/* CPU: fake quantization (dequantize(quantize(x))) into out, the exact emulation. */
static mp_status f8_fake(mp_ctx *ctx, mp_runtime *rt, void *out, const void *x, size_t n, mp_f8_format fmt) {
  float *amax = rt->scalar, *scale = rt->scalar + 1;
  MP_CHECK(f8_scale(ctx, rt, amax, scale, x, n, fmt));
  BE(f8_fake_quantize(rt->kc, out, x, scale, n, fmt));
  return MP_OK;
}

/* The backend emulates float8 (fake quantization + its matmul) when its X tensors are
 * fp32 (the CPU reference), and runs float8 GEMMs on codes otherwise (cuBLASLt); the
 * option f8_codes runs the codes path on fp32 X too (the CPU check of the CUDA path). */
static int f8_emulated(const mp_runtime *rt) { return !rt->f8_codes; }

/* Quantizes x (R, C) into o: codes (want_q) and/or transposed codes (want_qt). amax_to:
 * where a computed amax goes (NULL: the operand's own slot). */
static mp_status f8_quant(mp_ctx *ctx, mp_runtime *rt, f8_operand *o, const void *x, int R, int C, mp_f8_format fmt,
                          int want_q, int want_qt, void *mem, float *amax_to) {
  const size_t n = (size_t)R * C;
  const int owned = mem == NULL;
  const size_t ob = (size_t)mp_act_f8_operand_bytes((int64_t)n);
  if (owned) MP_CHECK(mp_talloc_alloc_uninit(ctx, rt->ta, MP_MEM_FP8, ob, &mem));
  uint8_t *base = mem;
  memset(o, 0, sizeof *o);
  o->mem = owned ? mem : NULL;
  o->src = x;
  o->R = R;
  o->C = C;
  o->fmt = (int)fmt;
  o->q = want_q ? base : NULL;
  o->qt = want_qt ? base + mp_act_f8_qt_offset((int64_t)n) : NULL;
  o->amax = F32(base + mp_act_f8_amax_offset((int64_t)n));
  MP_CHECK(f8_scale(ctx, rt, amax_to ? amax_to : o->amax, o->amax + 1, x, n, fmt));
  BE(f8_quantize_t(rt->kc, o->q, o->qt, x, o->amax + 1, R, C, fmt)); /* one pass, both orientations */
  return MP_OK;
}

void mp_rt_f8_scope_begin(mp_runtime *rt) {
  rt->f8_scope = 1;
  rt->f8_n = 0;
  rt->f8k_n = 0;
}

mp_status mp_rt_f8_scope_end(mp_ctx *ctx, mp_runtime *rt) {
  mp_status st = MP_OK;
  for (int i = 0; i < rt->f8_n; i++) {
    mp_status s2 = mp_talloc_free(ctx, rt->ta, rt->f8s[i].mem);
    if (st == MP_OK) st = s2;
  }
  rt->f8_n = 0;
  rt->f8_scope = 0;
  rt->f8k_n = 0;
  return st;
}

/* The operand of activation x (R, C) in fmt with the orientations asked for: from the open
 * scope when x was quantized there already (E4M3 activations only: output gradients are
 * read once), else quantized here; *tmp says whether the caller frees it (f8_release). */
static mp_status f8_act(mp_ctx *ctx, mp_runtime *rt, const void *x, int R, int C, mp_f8_format fmt, int want_q,
                        int want_qt, f8_operand *tmpbuf, float *amax_to, f8_operand **out) {
  const int share = rt->f8_scope && fmt == MP_F8_E4M3;
  if (share)
    for (int i = 0; i < rt->f8_n; i++) {
      f8_operand *o = &rt->f8s[i];
      if (o->src == x && o->R == R && o->C == C && o->fmt == (int)fmt && (!want_q || o->q) && (!want_qt || o->qt)) {
        *out = o;
        return MP_OK;
      }
    }
  f8_operand *o = share && rt->f8_n < F8_SCOPE_MAX ? &rt->f8s[rt->f8_n] : tmpbuf;
  MP_CHECK(f8_quant(ctx, rt, o, x, R, C, fmt, want_q, want_qt, NULL, amax_to));
  if (o != tmpbuf) rt->f8_n++;
  *out = o;
  return MP_OK;
}

static mp_status f8_release(mp_ctx *ctx, mp_runtime *rt, f8_operand *o, const f8_operand *tmpbuf) {
  if (o != tmpbuf || !o->mem) return MP_OK;
  mp_status st = mp_talloc_free(ctx, rt->ta, o->mem);
  o->mem = NULL;
  return st;
}

/* The codes of parameter (layer, m)'s compute weight (M, K), both orientations: cached in
 * the parameter when it is not FSDP-sharded (its cw is then stable until the optimizer
 * step), else quantized into tmpbuf (the gathered weight changes at every gather). */
static mp_status f8_weight(mp_ctx *ctx, mp_runtime *rt, int layer, mp_module m, int M, int K, f8_operand *tmpbuf,
                           f8_operand **out) {
  rt_param *r = &rt->prm[*pslot(rt, layer, m)];
  if (r->sharded) {
    MP_CHECK(f8_quant(ctx, rt, tmpbuf, r->cw, M, K, MP_F8_E4M3, 1, 1, NULL, NULL));
    *out = tmpbuf;
    return MP_OK;
  }
  const size_t n = (size_t)M * K;
  const size_t ob = (size_t)mp_act_f8_operand_bytes((int64_t)n);
  if (!r->f8w) MP_CHECK(mp_talloc_alloc_uninit(ctx, rt->ta, MP_MEM_FP8, ob, (void **)&r->f8w));
  memset(tmpbuf, 0, sizeof *tmpbuf);
  if (!r->f8w_valid) {
    MP_CHECK(f8_quant(ctx, rt, tmpbuf, r->cw, M, K, MP_F8_E4M3, 1, 1, r->f8w, NULL));
    r->f8w_valid = 1;
  }
  tmpbuf->src = r->cw;
  tmpbuf->R = M;
  tmpbuf->C = K;
  tmpbuf->q = r->f8w;
  tmpbuf->qt = r->f8w + mp_act_f8_qt_offset((int64_t)n);
  tmpbuf->amax = F32(r->f8w + mp_act_f8_amax_offset((int64_t)n));
  tmpbuf->mem = NULL; /* the parameter's: not the caller's to free */
  *out = tmpbuf;
  return MP_OK;
}

/* The reduced amax of activation src (mp_module_f8_source) of block l from its forward,
 * kept for the block's backward. */
float *mp_rt_f8_fwd_slot(const mp_runtime *rt, int l, int src) { return rt->f8_fwd + 4 * (size_t)l + src; }

/* Where the producer of activation src of block l (RMSNorm, SwiGLU) writes its output's
 * amax in the same kernel, or NULL: the codes path with a backend that fuses it, and a
 * float8 Linear reading that activation. The caller then calls f8_produced. */
float *mp_rt_f8_fused_amax(const mp_runtime *rt, int l, int src, mp_module reader) {
  if (!rt->f8_codes || !F8(rt, l, reader)) return NULL;
  const mp_backend *be = rt->be;
  if (src == 3 ? !be->swiglu_forward_amax : !be->rmsnorm_forward_amax) return NULL;
  return mp_rt_f8_fwd_slot(rt, l, src);
}

void mp_rt_f8_produced(mp_runtime *rt, int l, int src, const void *x, size_t n) {
  mp_rt_f8_known_set(rt, x, n, mp_rt_f8_fwd_slot(rt, l, src), 0);
}

mp_status mp_rt_lin_fwd(mp_ctx *ctx, mp_runtime *rt, int l, mp_module mod, void *out, const void *inp, int N, int K,
                        int M) {
  const void *w = W(rt, l, mod);
  if (!F8(rt, l, mod)) {
    BE(matmul_forward(rt->kc, out, inp, w, NULL, N, K, M));
    return MP_OK;
  }
  const size_t nx = (size_t)N * K, nw = (size_t)M * K;
  mp_status st;
  if (f8_emulated(rt)) {
    float *buf;
    const size_t fb = (size_t)mp_act_f8_emul_fwd_floats((int64_t)nx, (int64_t)nw) * sizeof(float);
    MP_CHECK(mp_talloc_alloc(ctx, rt->ta, MP_MEM_FP8, fb, (void **)&buf));
    float *qw = buf + mp_act_align16((int64_t)nx);
    st = f8_fake(ctx, rt, buf, inp, nx, MP_F8_E4M3);
    if (st == MP_OK) st = f8_fake(ctx, rt, qw, w, nw, MP_F8_E4M3);
    if (st == MP_OK && rt->be->matmul_forward(rt->kc, out, buf, qw, NULL, N, K, M) != MP_OK)
      st = mp_error(ctx, MP_ERR_INTERNAL, "float8 linear forward: %s", mp_errmsg(rt->kc->err));
    mp_status s2 = mp_talloc_free(ctx, rt->ta, buf);
    MP_CHECK(st);
    return s2;
  }
  f8_operand xb, wb, *xo = NULL, *wo = NULL;
  memset(&xb, 0, sizeof xb);
  const int src = l >= 0 ? mp_module_f8_source(mod) : -1;
  st = f8_act(ctx, rt, inp, N, K, MP_F8_E4M3, 1, 0, &xb, src >= 0 ? mp_rt_f8_fwd_slot(rt, l, src) : NULL, &xo);
  if (st == MP_OK) st = f8_weight(ctx, rt, l, mod, M, K, &wb, &wo);
  if (st == MP_OK && rt->be->matmul_f8(rt->kc, out, NULL, xo->q, xo->amax + 1, MP_F8_E4M3, wo->q, wo->amax + 1,
                                       MP_F8_E4M3, N, K, M, MP_F8_GEMM_FAST_ACCUM) != MP_OK)
    st = mp_error(ctx, MP_ERR_INTERNAL, "float8 linear forward: %s", mp_errmsg(rt->kc->err));
  mp_status s2 = wo ? f8_release(ctx, rt, wo, &wb) : MP_OK;
  mp_status s3 = xo ? f8_release(ctx, rt, xo, &xb) : MP_OK;
  MP_CHECK(st);
  MP_CHECK(s2);
  return s3;
}

/* dinp (N, K) += dout (N, M) W (M, K); the weight's gradient (M, K) += dout^T inp; dinp
 * may be NULL. */
mp_status mp_rt_lin_bwd(mp_ctx *ctx, mp_runtime *rt, int l, mp_module mod, void *dinp, const void *dout,
                        const void *inp, int N, int K, int M) {
  const void *w = W(rt, l, mod);
  float *dw = G(rt, l, mod);
  if (!F8(rt, l, mod)) {
    BE(matmul_backward(rt->kc, dinp, dw, NULL, dout, inp, w, N, K, M));
    return MP_OK;
  }
  const size_t nd = (size_t)N * M, nx = (size_t)N * K, nw = (size_t)M * K;
  mp_status st;
  if (f8_emulated(rt)) {
    float *buf;
    const size_t fb = (size_t)mp_act_f8_emul_bwd_floats((int64_t)nd, (int64_t)nx, (int64_t)nw) * sizeof(float);
    MP_CHECK(mp_talloc_alloc(ctx, rt->ta, MP_MEM_FP8, fb, (void **)&buf));
    float *qd = buf, *qx = buf + mp_act_align16((int64_t)nd), *qw = qx + mp_act_align16((int64_t)nx);
    st = f8_fake(ctx, rt, qd, dout, nd, MP_F8_E5M2);
    if (st == MP_OK) st = f8_fake(ctx, rt, qx, inp, nx, MP_F8_E4M3);
    if (st == MP_OK) st = f8_fake(ctx, rt, qw, w, nw, MP_F8_E4M3);
    if (st == MP_OK && rt->be->matmul_backward(rt->kc, dinp, dw, NULL, qd, qx, qw, N, K, M) != MP_OK)
      st = mp_error(ctx, MP_ERR_INTERNAL, "float8 linear backward: %s", mp_errmsg(rt->kc->err));
    mp_status s2 = mp_talloc_free(ctx, rt->ta, buf);
    MP_CHECK(st);
    return s2;
  }
  f8_operand db, wb, xb, *dyo = NULL, *wo = NULL, *xo = NULL;
  memset(&db, 0, sizeof db);
  memset(&xb, 0, sizeof xb);
  st = f8_act(ctx, rt, dout, N, M, MP_F8_E5M2, dinp != NULL, dw != NULL, &db, NULL, &dyo);
  if (st == MP_OK && dinp) { /* the GEMM adds into dinp (the contract here is +=) */
    st = f8_weight(ctx, rt, l, mod, M, K, &wb, &wo);
    if (st == MP_OK && rt->be->matmul_f8(rt->kc, dinp, NULL, dyo->q, dyo->amax + 1, MP_F8_E5M2, wo->qt, wo->amax + 1,
                                         MP_F8_E4M3, N, M, K, MP_F8_GEMM_ADD) != MP_OK)
      st = mp_error(ctx, MP_ERR_INTERNAL, "float8 linear backward (input gradient): %s", mp_errmsg(rt->kc->err));
  }
  if (st == MP_OK && dw) { /* x's amax: known from its forward (block_backward) */
    st = f8_act(ctx, rt, inp, N, K, MP_F8_E4M3, 0, 1, &xb, NULL, &xo);
    if (st == MP_OK && rt->be->matmul_f8(rt->kc, NULL, dw, dyo->qt, dyo->amax + 1, MP_F8_E5M2, xo->qt, xo->amax + 1,
                                         MP_F8_E4M3, M, N, K, 0) != MP_OK)
      st = mp_error(ctx, MP_ERR_INTERNAL, "float8 linear backward (weight gradient): %s", mp_errmsg(rt->kc->err));
  }
  mp_status s[3] = {wo ? f8_release(ctx, rt, wo, &wb) : MP_OK, xo ? f8_release(ctx, rt, xo, &xb) : MP_OK,
                    dyo ? f8_release(ctx, rt, dyo, &db) : MP_OK};
  MP_CHECK(st);
  for (int i = 0; i < 3; i++) MP_CHECK(s[i]);
  return MP_OK;
}
