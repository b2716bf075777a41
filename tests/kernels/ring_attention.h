// Context-parallel (ring) attention assembled from a backend's span ops, on one process:
// the reference procedure the CPU and CUDA span tests run (tests/kernels/
// attention_span_test.cc, tests/kernels_cuda/attention_span_test.cc), written against the
// op table alone so that it runs on either backend.
//
// The sequence is cut into 2cp chunks at `bounds` (chunk c holds positions [bounds[c],
// bounds[c+1]); sizes may differ, so Tq != Tk in most pairs). Rank r holds chunks r and
// 2cp-1-r (the causal load-balanced layout of PyTorch's context parallelism: every rank
// gets one early and one late chunk), concatenated as its local sequence. Forward: each
// rank starts its running state empty (span_init); at ring step s = 0 .. cp-1 it holds
// the keys and values of rank (r - s) mod cp, as if passed one rank along the ring per
// step, and merges its two query chunks with their two kv chunks (four span_forward
// calls, a pair wholly in the future returning at once); then span_finalize. Backward:
// span_dot once per rank, then the same ring with span_backward, dk and dv accumulating
// into the owner's buffers in step order, as if they travelled with k and v. Results are
// gathered back to the global layout.
#ifndef MP_TESTS_KERNELS_RING_ATTENTION_H
#define MP_TESTS_KERNELS_RING_ATTENTION_H

#include <cstddef>
#include <cstring>
#include <vector>

#include "kernels/ops.h"

namespace mp_test {

struct RingProblem {
  int B, T, nh, nkv, hd;
  std::vector<int> bounds;          // 2cp + 1 chunk boundaries, 0 .. T
  std::vector<float> q, k, v, dout; // global (B, T, heads, hd), host fp32
};

struct RingResult {
  std::vector<float> out, lse, dq, dk, dv; // global layouts; lse (B, nh, T)
};

// 2cp chunk boundaries of T positions, as even as possible, the longer chunks first.
inline std::vector<int> even_bounds(int T, int cp) {
  std::vector<int> b(2 * cp + 1, 0);
  for (int c = 0; c < 2 * cp; c++) b[c + 1] = b[c] + T / (2 * cp) + (c < T % (2 * cp) ? 1 : 0);
  return b;
}

// The monolithic forward and backward of p's whole sequence on a host backend (the CPU's):
// the reference the ring is held to. With out_bf16 the backward runs on the forward output
// rounded to bf16, as a bf16 device stores it.
inline mp_status monolithic_attention(const mp_backend *be, mp_kctx *kc, const RingProblem &p,
                                      bool out_bf16, RingResult *r) {
  const size_t nq = p.q.size(), nk = p.k.size();
  r->out.assign(nq, 0.0f);
  r->lse.assign((size_t)p.B * p.nh * p.T, 0.0f);
  r->dq.assign(nq, 0.0f);
  r->dk.assign(nk, 0.0f);
  r->dv.assign(nk, 0.0f);
  mp_status st = be->attention_forward(kc, r->out.data(), r->lse.data(), p.q.data(), p.k.data(),
                                       p.v.data(), p.B, p.T, p.nh, p.nkv, p.hd, p.hd);
  if (st) return st;
  std::vector<float> out = r->out;
  if (out_bf16)
    for (float &x : out) x = mp_bf16_to_f32(mp_bf16_from_f32(x));
  return be->attention_backward(kc, r->dq.data(), r->dk.data(), r->dv.data(), p.dout.data(),
                                p.q.data(), p.k.data(), p.v.data(), out.data(), r->lse.data(), p.B,
                                p.T, p.nh, p.nkv, p.hd, p.hd);
}

class RingAttention {
 public:
  RingAttention(const mp_backend *be, mp_kctx *kc) : be_(be), kc_(kc) {}
  ~RingAttention() {
    for (void *p : allocs_) be_->free(kc_, p);
  }

  // Runs forward and backward; the first failing op's status is returned (message on
  // kc->err). Backward gradients start from zero.
  mp_status run(const RingProblem &p, RingResult *res) {
    const int cp = (int)p.bounds.size() / 2;
    const size_t qw = (size_t)p.nh * p.hd, kw = (size_t)p.nkv * p.hd;
    std::vector<Rank> ranks(cp);
    for (int r = 0; r < cp; r++) {
      Rank &k = ranks[r];
      k.chunk[0] = r;
      k.chunk[1] = 2 * cp - 1 - r;
      k.row[0] = 0;
      k.row[1] = len(p, k.chunk[0]);
      k.L = k.row[1] + len(p, k.chunk[1]);
      const size_t nq = (size_t)p.B * k.L * qw, nk = (size_t)p.B * k.L * kw;
      const size_t nl = (size_t)p.B * p.nh * k.L;
      mp_status st = MP_OK;
      if ((st = put_x(&k.q, local(p, k, p.q, qw))) || (st = put_x(&k.k, local(p, k, p.k, kw))) ||
          (st = put_x(&k.v, local(p, k, p.v, kw))) ||
          (st = put_x(&k.dout, local(p, k, p.dout, qw))) ||
          (st = alloc(&k.acc, nq * 4)) || (st = alloc(&k.lse, nl * 4)) ||
          (st = alloc(&k.D, nl * 4)) || (st = alloc(&k.out, nq * xs())) ||
          (st = zeros(&k.dq, nq * xs())) || (st = zeros(&k.dk, nk * xs())) ||
          (st = zeros(&k.dv, nk * xs())))
        return st;
      if ((st = be_->attention_span_init(kc_, (float *)k.lse, nl))) return st;
    }
    mp_status st = each_pair(p, ranks, [&](const Rank &me, const Rank &kv, const mp_attn_span &sp) {
      return be_->attention_span_forward(kc_, (float *)me.acc, (float *)me.lse, me.q, kv.k, kv.v,
                                         &sp);
    });
    if (st) return st;
    for (const Rank &me : ranks) {
      mp_status st = be_->attention_span_finalize(kc_, me.out, (const float *)me.acc,
                                                  (const float *)me.lse, p.B, me.L, p.nh, p.hd);
      if (!st) st = be_->attention_span_dot(kc_, (float *)me.D, me.dout, me.out, p.B, me.L, p.nh,
                                            p.hd);
      if (st) return st;
    }
    st = each_pair(p, ranks, [&](const Rank &me, const Rank &kv, const mp_attn_span &sp) {
      return be_->attention_span_backward(kc_, me.dq, kv.dk, kv.dv, me.dout, me.q, kv.k, kv.v,
                                          (const float *)me.lse, (const float *)me.D, &sp);
    });
    if (st) return st;
    res->out.assign((size_t)p.B * p.T * qw, 0.0f);
    res->lse.assign((size_t)p.B * p.nh * p.T, 0.0f);
    res->dq.assign((size_t)p.B * p.T * qw, 0.0f);
    res->dk.assign((size_t)p.B * p.T * kw, 0.0f);
    res->dv.assign((size_t)p.B * p.T * kw, 0.0f);
    for (const Rank &me : ranks) {
      const size_t nq = (size_t)p.B * me.L * qw, nk = (size_t)p.B * me.L * kw;
      std::vector<float> h;
      if ((st = get_x(me.out, nq, &h))) return st;
      global(p, me, h, qw, &res->out);
      if ((st = get_x(me.dq, nq, &h))) return st;
      global(p, me, h, qw, &res->dq);
      if ((st = get_x(me.dk, nk, &h))) return st;
      global(p, me, h, kw, &res->dk);
      if ((st = get_x(me.dv, nk, &h))) return st;
      global(p, me, h, kw, &res->dv);
      h.assign((size_t)p.B * p.nh * me.L, 0.0f);
      if ((st = be_->synchronize(kc_)) ||
          (st = be_->memcpy_d2h(kc_, h.data(), me.lse, h.size() * 4)))
        return st;
      for (int b = 0; b < p.B; b++)
        for (int hh = 0; hh < p.nh; hh++)
          for (int c = 0; c < 2; c++)
            for (int t = 0; t < len(p, me.chunk[c]); t++)
              res->lse[((size_t)b * p.nh + hh) * p.T + p.bounds[me.chunk[c]] + t] =
                  h[((size_t)b * p.nh + hh) * me.L + me.row[c] + t];
    }
    return MP_OK;
  }

 private:
  struct Rank {
    int chunk[2], row[2], L; // global chunk ids, their first local rows, local length
    void *q, *k, *v, *dout, *acc, *lse, *D, *out, *dq, *dk, *dv;
  };

  static int len(const RingProblem &p, int c) { return p.bounds[c + 1] - p.bounds[c]; }

  // Calls f(me, kv, span) for every pair in ring order: step s, rank r holding the kv of
  // rank (r - s) mod cp, its two query chunks against those two kv chunks; stops at the
  // first status that is not MP_OK.
  template <class F>
  static mp_status each_pair(const RingProblem &p, const std::vector<Rank> &ranks, F f) {
    const int cp = (int)ranks.size();
    for (int s = 0; s < cp; s++)
      for (int r = 0; r < cp; r++) {
        const Rank &me = ranks[r], &kv = ranks[(r - s + cp) % cp];
        for (int a = 0; a < 2; a++)
          for (int b = 0; b < 2; b++) {
            mp_status st = f(me, kv, span(p, me, a, kv, b));
            if (st) return st;
          }
      }
    return MP_OK;
  }

  // The pair (query chunk a of `me`, kv chunk b of `kv`).
  static mp_attn_span span(const RingProblem &p, const Rank &me, int a, const Rank &kv, int b) {
    mp_attn_span sp;
    sp.B = p.B;
    sp.nh = p.nh;
    sp.nkv = p.nkv;
    sp.hd = p.hd;
    sp.Sq = me.L;
    sp.q_row = me.row[a];
    sp.Tq = len(p, me.chunk[a]);
    sp.q_pos = p.bounds[me.chunk[a]];
    sp.Sk = kv.L;
    sp.kv_row = kv.row[b];
    sp.Tk = len(p, kv.chunk[b]);
    sp.kv_pos = p.bounds[kv.chunk[b]];
    return sp;
  }

  // The rank's local rows of a global (B, T, w) tensor, and back.
  static std::vector<float> local(const RingProblem &p, const Rank &me, const std::vector<float> &g,
                                  size_t w) {
    std::vector<float> l((size_t)p.B * me.L * w);
    for (int b = 0; b < p.B; b++)
      for (int c = 0; c < 2; c++)
        std::memcpy(&l[((size_t)b * me.L + me.row[c]) * w],
                    &g[((size_t)b * p.T + p.bounds[me.chunk[c]]) * w],
                    (size_t)len(p, me.chunk[c]) * w * sizeof(float));
    return l;
  }
  static void global(const RingProblem &p, const Rank &me, const std::vector<float> &l, size_t w,
                     std::vector<float> *g) {
    for (int b = 0; b < p.B; b++)
      for (int c = 0; c < 2; c++)
        std::memcpy(&(*g)[((size_t)b * p.T + p.bounds[me.chunk[c]]) * w],
                    &l[((size_t)b * me.L + me.row[c]) * w],
                    (size_t)len(p, me.chunk[c]) * w * sizeof(float));
  }

  size_t xs() const { return mp_kdtype_bytes(be_->x_dtype); }
  mp_status alloc(void **p, size_t bytes) {
    mp_status st = be_->alloc(kc_, p, bytes ? bytes : 64);
    if (!st) allocs_.push_back(*p);
    return st;
  }
  mp_status zeros(void **p, size_t bytes) {
    mp_status st = alloc(p, bytes);
    return st ? st : be_->memset_zero(kc_, *p, bytes ? bytes : 64);
  }
  mp_status put_x(void **p, const std::vector<float> &h) {
    mp_status st = alloc(p, h.size() * xs());
    return st ? st : be_->to_device_f32(kc_, *p, h.data(), h.size());
  }
  mp_status get_x(const void *p, size_t n, std::vector<float> *h) {
    h->assign(n, 0.0f);
    mp_status st = be_->synchronize(kc_);
    return st ? st : be_->from_device_f32(kc_, h->data(), p, n);
  }

  const mp_backend *be_;
  mp_kctx *kc_;
  std::vector<void *> allocs_;
};

}  // namespace mp_test

#endif
