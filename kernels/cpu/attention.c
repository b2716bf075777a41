/* Causal attention with grouped-query heads, fp32 (kernels/ops.h): attention_forward and
 * attention_backward, and the span ops of ring attention, on one code path: a monolithic
 * call is the span whose one chunk is the whole sequence at position 0.
 *
 * Queries and keys have hd features per head, values and the output hv (equal but under
 * multi-head latent attention, DeepSeek-V2 arXiv 2405.04434 section 2.1, whose softmax scale
 * is 1/sqrt of the query/key head, qk_nope + qk_rope).
 *
 * Forward, per (batch, query head h, query i of the q chunk): scores s_j = <q_i, k_j> /
 * sqrt(hd) over the visible keys of the kv chunk (kv_pos + j <= q_pos + i), m = max_j s_j,
 * o = sum_j e^(s_j - m) v_j / sum_j e^(s_j - m) (the sum of weights in double) and
 * l = m + log sum_j e^(s_j - m). attention_forward writes o and l. attention_span_forward
 * merges them into the running state (acc, lse) in double: lse' = log(e^lse + e^l) =
 * max(lse, l) + log1p(e^-|lse - l|), acc' = acc e^(lse - lse') + o e^(l - lse'); an empty
 * state (lse = -inf) takes o and l as they are, so the first pair of a row writes exactly
 * what attention_forward writes, and a row with no visible key is not touched.
 *
 * Backward, per pair, from the final lse: p_j = e^(s_j - lse), and the softmax identity
 *   ds_j = p_j (<dout_i, v_j> - D_i),   D_i = <dout_i, out_i> = sum_j p_j <dout_i, v_j>
 * over every key of every chunk; then dq_i += ds_j k_j / sqrt(hd), dk_j += ds_j q_i /
 * sqrt(hd), dv_j += p_j dout_i. attention_backward computes D_i in place, the span op reads
 * it from span_dot, which sums the same products in the same order.
 *
 * Threads: the forward parallelises over (batch, head, query), each thread owning its
 * rows of out (acc) and lse and keeping one score row of Tk floats; the backward over
 * (batch, kv head): a thread owns dk, dv of that kv head's rows of the kv chunk and dq of
 * the query heads that read it, so there are no races and every sum has a fixed order.
 * A pair of less than PARALLEL_MIN_WORK multiply-adds (B nh Tq Tk hd, the rectangle)
 * runs on the calling thread: a ring makes 4cp^2 calls per layer and direction, small
 * ones with short chunks, and a team's fork and join costs more than such a call (on a
 * loaded machine a time slice per call, when the team's other threads wait for a core).
 * The results do not depend on it. */
#include <math.h>
#include <stdlib.h>

#include "kernels/cpu/internal.h"

/* Work (multiply-adds) below which a call stays on one thread; the element-wise kernels'
 * threshold (kernels/cpu/residual.c), 2^18. */
#define PARALLEL_MIN_WORK 262144.0

/* Whether a pair is worth a thread team. */
static int parallel_pair(const mp_attn_span *sp) {
  return (double)sp->B * sp->nh * sp->Tq * (double)sp->Tk * sp->hd >= PARALLEL_MIN_WORK;
}

/* The one chunk of a monolithic call. */
static mp_attn_span whole_sequence(int B, int T, int nh, int nkv, int hd) {
  mp_attn_span sp = {B, nh, nkv, hd, T, 0, T, 0, T, 0, T, 0};
  return sp;
}

/* One pair's forward with hv features per value head (the span ops': hd): merge = 0 writes
 * o and l into acc and lse (attention_forward, acc being out), 1 merges them into the
 * running state. */
static mp_status span_forward(mp_kctx *kc, float *acc, float *lse, const float *q,
                              const float *k, const float *v, const mp_attn_span *sp, int hv,
                              int merge, const char *op) {
  if (!mp_attn_span_active(sp)) return MP_OK;
  const int B = sp->B, nh = sp->nh, nkv = sp->nkv, hd = sp->hd, Tq = sp->Tq, Tk = sp->Tk;
  const int grp = nh / nkv;
  const float scale = 1.0f / sqrtf((float)hd);
  /* row strides: q and k hd per head, v and the output hv */
  const size_t qs = (size_t)nh * hd, ks = (size_t)nkv * hd, vs = (size_t)nkv * hv, os = (size_t)nh * hv;
  int failed = 0;
#pragma omp parallel if (parallel_pair(sp))
  {
    /* Tk scores, then (merging) the pair's output row. */
    float *s = (float *)malloc(((size_t)Tk + (size_t)hv) * sizeof(float));
    if (!s) {
#pragma omp atomic write
      failed = 1;
    }
#pragma omp for collapse(3) schedule(dynamic, 4)
    for (int b = 0; b < B; b++)
      for (int h = 0; h < nh; h++)
        for (int i = 0; i < Tq; i++) {
          const int n = mp_attn_span_visible(sp, i);
          if (!s || n == 0) continue;
          const int g = h / grp;
          const size_t qr = (size_t)b * sp->Sq + sp->q_row + i;
          const float *qt = q + qr * qs + (size_t)h * hd;
          const float *kb = k + ((size_t)b * sp->Sk + sp->kv_row) * ks + (size_t)g * hd;
          const float *vb = v + ((size_t)b * sp->Sk + sp->kv_row) * vs + (size_t)g * hv;
          float m = -INFINITY;
          for (int j = 0; j < n; j++) {
            const float *kj = kb + (size_t)j * ks;
            float d = 0.0f;
            for (int x = 0; x < hd; x++) d += qt[x] * kj[x];
            s[j] = d * scale;
            if (s[j] > m) m = s[j];
          }
          double sum = 0.0;
          for (int j = 0; j < n; j++) {
            s[j] = expf(s[j] - m);
            sum += s[j];
          }
          const float inv = (float)(1.0 / sum);
          float *lr = lse + ((size_t)b * nh + h) * sp->Sq + sp->q_row + i;
          float *ar = acc + qr * os + (size_t)h * hv;
          const int fresh = !merge || *lr == -INFINITY;
          float *o = fresh ? ar : s + Tk;
          for (int x = 0; x < hv; x++) o[x] = 0.0f;
          for (int j = 0; j < n; j++) {
            const float *vj = vb + (size_t)j * vs;
            float p = s[j] * inv;
            for (int x = 0; x < hv; x++) o[x] += p * vj[x];
          }
          const float l = m + (float)log(sum);
          if (fresh) {
            *lr = l;
            continue;
          }
          /* With e = e^-|lse - l|: lse' = max + log1p(e), and the weights e^(lse - lse'),
           * e^(l - lse') are 1 / (1 + e) for the larger and e / (1 + e) for the other. */
          const double a = *lr, e = exp(-fabs(a - (double)l)), big = 1.0 / (1.0 + e);
          const double wa = a >= l ? big : e * big, wl = a >= l ? e * big : big;
          for (int x = 0; x < hv; x++) ar[x] = (float)(wa * ar[x] + wl * o[x]);
          *lr = (float)((a >= l ? a : l) + log1p(e));
        }
    free(s);
  }
  if (failed) return mp_error(kc->err, MP_ERR_NOMEM, "%s: out of memory for a score row of "
                              "%d floats", op, Tk + hv);
  return MP_OK;
}

/* One pair's backward from the final lse, hv features per value head; D NULL: D_i =
 * <dout_i, out_i> in place. */
static mp_status span_backward(mp_kctx *kc, float *dq, float *dk, float *dv, const float *dout,
                               const float *q, const float *k, const float *v,
                               const float *out, const float *lse, const float *D,
                               const mp_attn_span *sp, int hv, const char *op) {
  if (!mp_attn_span_active(sp)) return MP_OK;
  const int B = sp->B, nh = sp->nh, nkv = sp->nkv, hd = sp->hd, Tq = sp->Tq, Tk = sp->Tk;
  const int grp = nh / nkv;
  const float scale = 1.0f / sqrtf((float)hd);
  const size_t qs = (size_t)nh * hd, ks = (size_t)nkv * hd, vs = (size_t)nkv * hv, os = (size_t)nh * hv;
  int failed = 0;
#pragma omp parallel if (parallel_pair(sp))
  {
    float *p = (float *)malloc((size_t)Tk * sizeof(float));
    if (!p) {
#pragma omp atomic write
      failed = 1;
    }
#pragma omp for collapse(2) schedule(dynamic, 1)
    for (int b = 0; b < B; b++)
      for (int g = 0; g < nkv; g++) {
        if (!p) continue;
        const size_t kvo = ((size_t)b * sp->Sk + sp->kv_row) * ks + (size_t)g * hd;
        const size_t vo = ((size_t)b * sp->Sk + sp->kv_row) * vs + (size_t)g * hv;
        const float *kb = k + kvo, *vb = v + vo;
        float *dkb = dk + kvo, *dvb = dv + vo;
        for (int h = g * grp; h < (g + 1) * grp; h++)
          for (int i = 0; i < Tq; i++) {
            const int n = mp_attn_span_visible(sp, i);
            const size_t lr = ((size_t)b * nh + h) * sp->Sq + sp->q_row + i;
            if (n == 0 || lse[lr] == -INFINITY) continue;
            const size_t qo = ((size_t)b * sp->Sq + sp->q_row + i) * qs + (size_t)h * hd;
            const size_t oo = ((size_t)b * sp->Sq + sp->q_row + i) * os + (size_t)h * hv;
            const float *qt = q + qo, *gt = dout + oo;
            const float l = lse[lr];
            float Di = 0.0f;
            if (D) {
              Di = D[lr];
            } else {
              const float *ot = out + oo;
              for (int x = 0; x < hv; x++) Di += gt[x] * ot[x];
            }
            for (int j = 0; j < n; j++) {
              const float *kj = kb + (size_t)j * ks;
              float d = 0.0f;
              for (int x = 0; x < hd; x++) d += qt[x] * kj[x];
              p[j] = expf(d * scale - l);
            }
            float *dqt = dq + qo;
            for (int j = 0; j < n; j++) {
              const size_t jo = (size_t)j * ks, jv = (size_t)j * vs;
              const float *kj = kb + jo, *vj = vb + jv;
              float dp = 0.0f;
              for (int x = 0; x < hv; x++) dp += gt[x] * vj[x];
              float ds = p[j] * (dp - Di) * scale;
              float *dkj = dkb + jo, *dvj = dvb + jv;
              for (int x = 0; x < hd; x++) {
                dqt[x] += ds * kj[x];
                dkj[x] += ds * qt[x];
              }
              for (int x = 0; x < hv; x++) dvj[x] += p[j] * gt[x];
            }
          }
      }
    free(p);
  }
  if (failed) return mp_error(kc->err, MP_ERR_NOMEM, "%s: out of memory for a probability "
                              "row of %d floats", op, Tk);
  return MP_OK;
}

mp_status mp_cpu_attention_forward(mp_kctx *kc, void *out, float *lse, const void *q,
                                   const void *k, const void *v, int B, int T, int nh,
                                   int nkv, int hd, int hv) {
  MP_KREQUIRE(kc, B >= 0 && T >= 0 && nh > 0 && nkv > 0 && hd > 0 && hv > 0 && nh % nkv == 0,
                 "attention_forward");
  const mp_attn_span sp = whole_sequence(B, T, nh, nkv, hd);
  return span_forward(kc, (float *)out, lse, (const float *)q, (const float *)k,
                      (const float *)v, &sp, hv, 0, "attention_forward");
}

mp_status mp_cpu_attention_backward(mp_kctx *kc, void *dq, void *dk, void *dv,
                                    const void *dout, const void *q, const void *k,
                                    const void *v, const void *out, const float *lse,
                                    int B, int T, int nh, int nkv, int hd, int hv) {
  MP_KREQUIRE(kc, B >= 0 && T >= 0 && nh > 0 && nkv > 0 && hd > 0 && hv > 0 && nh % nkv == 0,
                 "attention_backward");
  const mp_attn_span sp = whole_sequence(B, T, nh, nkv, hd);
  return span_backward(kc, (float *)dq, (float *)dk, (float *)dv, (const float *)dout,
                       (const float *)q, (const float *)k, (const float *)v,
                       (const float *)out, lse, NULL, &sp, hv, "attention_backward");
}

mp_status mp_cpu_attention_span_init(mp_kctx *kc, float *lse, size_t n) {
  MP_KREQUIRE(kc, lse || n == 0, "attention_span_init");
#pragma omp parallel for if (n > 262144)
  for (size_t i = 0; i < n; i++) lse[i] = -INFINITY;
  return MP_OK;
}

mp_status mp_cpu_attention_span_forward(mp_kctx *kc, float *acc, float *lse, const void *q,
                                        const void *k, const void *v, const mp_attn_span *sp) {
  MP_KREQUIRE(kc, mp_attn_span_ok(sp), "attention_span_forward");
  return span_forward(kc, acc, lse, (const float *)q, (const float *)k, (const float *)v, sp,
                      sp->hd, 1, "attention_span_forward");
}

mp_status mp_cpu_attention_span_finalize(mp_kctx *kc, void *out_, const float *acc,
                                         const float *lse, int B, int S, int nh, int hd) {
  MP_KREQUIRE(kc, B >= 0 && S >= 0 && nh > 0 && hd > 0, "attention_span_finalize");
  float *out = (float *)out_;
  const size_t rows = (size_t)B * S * nh;
#pragma omp parallel for if (rows * hd > 262144)
  for (size_t r = 0; r < rows; r++) {
    const size_t b = r / ((size_t)S * nh), t = r / nh % S, h = r % nh;
    const int empty = lse[(b * nh + h) * S + t] == -INFINITY;
    for (int x = 0; x < hd; x++) out[r * hd + x] = empty ? 0.0f : acc[r * hd + x];
  }
  return MP_OK;
}

mp_status mp_cpu_attention_span_dot(mp_kctx *kc, float *D, const void *dout_, const void *out_,
                                    int B, int S, int nh, int hd) {
  MP_KREQUIRE(kc, B >= 0 && S >= 0 && nh > 0 && hd > 0, "attention_span_dot");
  const float *dout = (const float *)dout_, *out = (const float *)out_;
  const size_t rows = (size_t)B * S * nh;
#pragma omp parallel for if (rows * hd > 262144)
  for (size_t r = 0; r < rows; r++) {
    const size_t b = r / ((size_t)S * nh), t = r / nh % S, h = r % nh;
    float d = 0.0f;
    for (int x = 0; x < hd; x++) d += dout[r * hd + x] * out[r * hd + x];
    D[(b * nh + h) * S + t] = d;
  }
  return MP_OK;
}

mp_status mp_cpu_attention_span_backward(mp_kctx *kc, void *dq, void *dk, void *dv,
                                         const void *dout, const void *q, const void *k,
                                         const void *v, const float *lse, const float *D,
                                         const mp_attn_span *sp) {
  MP_KREQUIRE(kc, mp_attn_span_ok(sp) && D, "attention_span_backward");
  return span_backward(kc, (float *)dq, (float *)dk, (float *)dv, (const float *)dout,
                       (const float *)q, (const float *)k, (const float *)v, NULL, lse, D, sp,
                       sp->hd, "attention_span_backward");
}
