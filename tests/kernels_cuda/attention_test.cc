// CUDA attention (kernels/cuda/attention.cu and attention_fa2.cu) against the CPU
// reference backend, through the CUDA backend table: the tensor-core (FlashAttention-2)
// kernels for head dims 32, 64, 96 and 128, the scalar fallback, and the two against each
// other on the device. Skips without CUDA or without a device.
//
// Inputs are drawn at random and rounded to bf16 on the host; the CPU reference runs in
// fp32 on exactly those values. Forward outputs are poisoned with 0xFF bytes (NaN in bf16
// and fp32) before the op runs, and every error measure returns infinity on a NaN or inf,
// so an unwritten element fails. Bounds (relative L2 over the whole tensor):
//   out: 1e-2. The kernel rounds the probabilities to bf16 before P V and the result once
//     more; each rounding is <= 2^-9 ~ 2e-3 relative per element, independent across
//     elements, so ~3e-3 is expected; a wrong index, a missed tile or a wrong mask gives
//     errors of order 1.
//   lse: 1e-4. fp32 scores from exact bf16 products, fp32 sums of <= 1024 terms
//     (~1e-6 relative) and a 2-ulp exp2.
//   dq, dk, dv: 1e-2 of the norm of the fresh gradient (not of the total, so the prior
//     cannot hide an error). P and dS are rounded to bf16 as GEMM operands and the sum
//     prior + fresh once more: three roundings of ~2e-3 each.
//   Backward outputs start from a random non-zero prior of the fresh gradient's RMS, so
//   a kernel that overwrote instead of adding (+=) is off by ~100 % of the fresh norm.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cpu/cpu.h"
#include "kernels/cuda/attention_hooks.h"  // force_scalar, tile configurations (CUDA builds)
#include "kernels/cuda/cuda.h"
#include "tests/test_rng.h"
#include "tests/kernels_cuda/cuda_fixture.h"

namespace {

using Vec = std::vector<float>;

using mp_test::Rng;
using mp_test::bf;
using mp_test::rand_bf16;

using mp_test::rel_err;
using mp_test::rel_l2;

struct Shape {
  int B, T, nh, nkv, hd;
};

std::string name_of(const Shape &s) {
  return "B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) + " nh=" +
         std::to_string(s.nh) + " nkv=" + std::to_string(s.nkv) + " hd=" + std::to_string(s.hd);
}

// Every T of interest (1, a ragged 7, one tile, one tile + 1, two tiles, ragged 300, many
// tiles) for both main head dims, batch 1 and 3, GQA ratios nh/nkv of 1, 2 and 4; then
// the other tensor-core head dims, 32 and 96.
const Shape kShapes[] = {
    {1, 1, 4, 4, 64},     {3, 7, 4, 2, 64},    {1, 64, 8, 2, 64},    {3, 65, 4, 1, 64},
    {3, 128, 4, 4, 64},   {3, 300, 4, 2, 64},  {1, 1024, 4, 1, 64},  {1, 1, 4, 4, 128},
    {3, 7, 4, 2, 128},    {1, 64, 8, 2, 128},  {3, 65, 4, 1, 128},   {3, 128, 4, 4, 128},
    {3, 300, 4, 2, 128},  {1, 1024, 4, 1, 128}, {1, 1024, 2, 2, 128}, {2, 200, 4, 2, 96},
    {2, 77, 2, 1, 32}};

// One problem: bf16-rounded inputs and the CPU's results (forward, then backward on the
// bf16-rounded forward output, as the device stores it).
struct Problem {
  Shape s;
  size_t nq, nkv, nl;
  Vec q, k, v, dout, out, lse, gq, gk, gv;
};

Problem make_problem(const Shape &s, uint64_t seed, float spread, const mp_backend *cpu,
                     mp_kctx *cpu_kc, bool backward) {
  Problem p;
  p.s = s;
  p.nq = (size_t)s.B * s.T * s.nh * s.hd;
  p.nkv = (size_t)s.B * s.T * s.nkv * s.hd;
  p.nl = (size_t)s.B * s.nh * s.T;
  Rng r(seed);
  // Spread 2: scores ~ N(0, 1.3^2), a peaked but not one-hot softmax.
  p.q = rand_bf16(r, p.nq, -spread, spread);
  p.k = rand_bf16(r, p.nkv, -spread, spread);
  p.v = rand_bf16(r, p.nkv, -1, 1);
  p.dout = rand_bf16(r, p.nq, -1, 1);
  p.out.assign(p.nq, 0.0f);
  p.lse.assign(p.nl, 0.0f);
  EXPECT_EQ(cpu->attention_forward(cpu_kc, p.out.data(), p.lse.data(), p.q.data(), p.k.data(),
                                   p.v.data(), s.B, s.T, s.nh, s.nkv, s.hd, s.hd), MP_OK);
  if (!backward) return p;
  for (auto &x : p.out) x = bf(x);
  p.gq.assign(p.nq, 0.0f);
  p.gk.assign(p.nkv, 0.0f);
  p.gv.assign(p.nkv, 0.0f);
  EXPECT_EQ(cpu->attention_backward(cpu_kc, p.gq.data(), p.gk.data(), p.gv.data(),
                                    p.dout.data(), p.q.data(), p.k.data(), p.v.data(),
                                    p.out.data(), p.lse.data(), s.B, s.T, s.nh, s.nkv, s.hd, s.hd),
            MP_OK);
  return p;
}

// A random bf16 prior with the RMS of g.
Vec prior_like(Rng &r, const Vec &g) {
  double ss = 0;
  for (float x : g) ss += (double)x * x;
  const float rms = (float)std::sqrt(ss / (g.empty() ? 1 : g.size()));
  Vec p(g.size());
  // Uniform on [-a, a] has RMS a / sqrt(3).
  for (auto &x : p) x = bf(r.uni(-1.7320508f * rms, 1.7320508f * rms));
  return p;
}

Vec sum(const Vec &a, const Vec &b) {
  Vec s(a.size());
  for (size_t i = 0; i < a.size(); i++) s[i] = a[i] + b[i];
  return s;
}

class CudaAttention : public mp_test::CudaVsCpu {
 protected:
  void TearDown() override {
#ifdef MP_HAVE_CUDA
    if (ready) {
      mp_cuda_attention_force_scalar(0);
      for (int k : {MP_FA2_FWD, MP_FA2_DKDV, MP_FA2_DQ}) mp_cuda_attention_fa2_force_config(k, -1);
    }
#endif
    CudaVsCpu::TearDown();
  }

  // Runs the device forward on p's inputs (q skewed by `skew` bytes) into poisoned
  // outputs; returns out and lse.
  void forward(const Problem &p, Vec *out, Vec *lse, size_t skew = 0) {
    const Shape &s = p.s;
    void *d_out = poisoned(p.nq * 2);
    float *d_lse = (float *)poisoned(p.nl * 4);
    ASSERT_EQ(be->attention_forward(&kc, d_out, d_lse, dev_x(p.q, skew), dev_x(p.k),
                                    dev_x(p.v), s.B, s.T, s.nh, s.nkv, s.hd, s.hd), MP_OK)
        << mp_errmsg(&err) << " " << name_of(s);
    *out = get_x(d_out, p.nq);
    *lse = get_f32(d_lse, p.nl);
  }

  // Runs the device backward on p's inputs (the CPU's lse and bf16 out) from the given
  // priors; returns the accumulated dq, dk, dv.
  void backward(const Problem &p, const Vec &sq, const Vec &sk, const Vec &sv, Vec *dq, Vec *dk,
                Vec *dv, void **raw = nullptr) {
    const Shape &s = p.s;
    void *d_dq = dev_x(sq), *d_dk = dev_x(sk), *d_dv = dev_x(sv);
    ASSERT_EQ(be->attention_backward(&kc, d_dq, d_dk, d_dv, dev_x(p.dout), dev_x(p.q),
                                     dev_x(p.k), dev_x(p.v), dev_x(p.out), dev_f32(p.lse), s.B,
                                     s.T, s.nh, s.nkv, s.hd, s.hd), MP_OK)
        << mp_errmsg(&err) << " " << name_of(s);
    *dq = get_x(d_dq, p.nq);
    *dk = get_x(d_dk, p.nkv);
    *dv = get_x(d_dv, p.nkv);
    if (raw) {
      raw[0] = d_dq;
      raw[1] = d_dk;
      raw[2] = d_dv;
    }
  }

  void check_forward(const Shape &s, uint64_t seed, float spread) {
    Problem p = make_problem(s, seed, spread, cpu, &cpu_kc, false);
    Vec out, lse;
    forward(p, &out, &lse);
    EXPECT_LE(rel_l2(out, p.out), 1e-2) << "out " << name_of(s);
    EXPECT_LE(rel_l2(lse, p.lse), 1e-4) << "lse " << name_of(s);
  }

  void check_backward(const Shape &s, uint64_t seed, float spread) {
    Problem p = make_problem(s, seed, spread, cpu, &cpu_kc, true);
    Rng r(seed + 99);
    Vec sq = prior_like(r, p.gq), sk = prior_like(r, p.gk), sv = prior_like(r, p.gv);
    Vec dq, dk, dv;
    backward(p, sq, sk, sv, &dq, &dk, &dv);
    EXPECT_LE(rel_err(dq, sum(sq, p.gq), p.gq), 1e-2) << "dq " << name_of(s);
    EXPECT_LE(rel_err(dk, sum(sk, p.gk), p.gk), 1e-2) << "dk " << name_of(s);
    EXPECT_LE(rel_err(dv, sum(sv, p.gv), p.gv), 1e-2) << "dv " << name_of(s);
  }
};

TEST_F(CudaAttention, ForwardMatchesCpu) {
  for (const Shape &s : kShapes) check_forward(s, (uint64_t)s.T * 31 + s.hd + s.nh * 7 + s.B, 2);
}

TEST_F(CudaAttention, BackwardAccumulatesLikeCpu) {
  for (const Shape &s : kShapes)
    check_backward(s, (uint64_t)s.T * 17 + s.hd * 3 + s.nh * 5 + s.B, 2);
}

// Spread 5: scores ~ N(0, 8^2), so the running maximum jumps between key tiles and the
// online softmax rescales the accumulator by factors far from 1 (and underflows some
// probabilities to 0) on most rows.
TEST_F(CudaAttention, PeakedScoresMatchCpu) {
  const Shape shapes[] = {{2, 300, 4, 2, 128}, {1, 257, 4, 1, 64}};
  for (const Shape &s : shapes) {
    check_forward(s, 7 + s.hd, 5);
    check_backward(s, 11 + s.hd, 5);
  }
}

#ifdef MP_HAVE_CUDA
// The tensor-core kernels against the scalar ones on the same device, same inputs, in
// every compiled tile configuration of each kernel (attention_fa2.cu's tables, selected by
// the hook as MP_ATTENTION_*_CFG would; the other kernels at configuration 0). Shapes:
// ragged T, both tuned head dims, GQA ratios 1, 4 and 4 with 8 query tiles, so every
// configuration meets partial tiles, the diagonal and its pipeline's steady state. The
// backward configurations differ only in how many 16-row chunks a block or tile holds and
// sum them in the same order, so they must also reproduce configuration 0's bits.
TEST_F(CudaAttention, TensorCoreMatchesScalarKernel) {
  const Shape shapes[] = {{2, 200, 8, 2, 128}, {1, 130, 4, 4, 64}, {1, 1024, 4, 1, 128}};
  for (const Shape &s : shapes) {
    Problem p = make_problem(s, 5 + s.hd, 2, cpu, &cpu_kc, true);
    Rng r(3);
    Vec sq = prior_like(r, p.gq), sk = prior_like(r, p.gk), sv = prior_like(r, p.gv);
    Vec out_sc, lse_sc, cq, ck, cv;
    mp_cuda_attention_force_scalar(1);
    forward(p, &out_sc, &lse_sc);
    backward(p, sq, sk, sv, &cq, &ck, &cv);
    mp_cuda_attention_force_scalar(0);

    for (int c = 0; c < mp_cuda_attention_fa2_n_configs(MP_FA2_FWD); c++) {
      const std::string what = " fwd cfg " + std::to_string(c) + " " + name_of(s);
      mp_cuda_attention_fa2_force_config(MP_FA2_FWD, c);
      Vec out_tc, lse_tc;
      forward(p, &out_tc, &lse_tc);
      EXPECT_LE(rel_l2(out_tc, out_sc), 1e-2) << "out" << what;
      EXPECT_LE(rel_l2(lse_tc, lse_sc), 1e-4) << "lse" << what;
    }
    mp_cuda_attention_fa2_force_config(MP_FA2_FWD, -1);

    Vec q0, k0, v0; // configuration 0's gradients
    for (int kern : {MP_FA2_DKDV, MP_FA2_DQ})
      for (int c = kern == MP_FA2_DQ ? 1 : 0; c < mp_cuda_attention_fa2_n_configs(kern); c++) {
        const std::string what =
            (kern == MP_FA2_DKDV ? " dkdv cfg " : " dq cfg ") + std::to_string(c) + " " + name_of(s);
        mp_cuda_attention_fa2_force_config(kern, c);
        Vec tq, tk, tv;
        backward(p, sq, sk, sv, &tq, &tk, &tv);
        mp_cuda_attention_fa2_force_config(kern, -1);
        EXPECT_LE(rel_err(tq, cq, p.gq), 1e-2) << "dq" << what;
        EXPECT_LE(rel_err(tk, ck, p.gk), 1e-2) << "dk" << what;
        EXPECT_LE(rel_err(tv, cv, p.gv), 1e-2) << "dv" << what;
        if (q0.empty()) {
          q0 = tq;
          k0 = tk;
          v0 = tv;
        } else {
          EXPECT_TRUE(tq == q0 && tk == k0 && tv == v0) << "not configuration 0's bits:" << what;
        }
      }
  }
}
#endif

// No atomics: two runs give the same bits.
TEST_F(CudaAttention, BackwardIsBitwiseReproducible) {
  const Shape s = {2, 300, 8, 2, 128};
  Problem p = make_problem(s, 21, 2, cpu, &cpu_kc, true);
  Vec zq(p.nq, 0.0f), zkv(p.nkv, 0.0f), dq, dk, dv;
  void *a[3], *b[3];
  backward(p, zq, zkv, zkv, &dq, &dk, &dv, a);
  backward(p, zq, zkv, zkv, &dq, &dk, &dv, b);
  const size_t bytes[3] = {p.nq * 2, p.nkv * 2, p.nkv * 2};
  for (int i = 0; i < 3; i++)
    EXPECT_TRUE(get_bytes(a[i], bytes[i]) == get_bytes(b[i], bytes[i])) << "gradient " << i;
}

// q 4 bytes off 16-byte alignment: the tensor-core kernels (cp.async of 16 bytes) cannot
// take it, the scalar kernels do, and the result is the same.
TEST_F(CudaAttention, MisalignedInputUsesFallback) {
  const Shape s = {1, 70, 4, 2, 64};
  Problem p = make_problem(s, 13, 2, cpu, &cpu_kc, false);
  Vec out, lse;
  forward(p, &out, &lse, 4);
  EXPECT_LE(rel_l2(out, p.out), 1e-2);
  EXPECT_LE(rel_l2(lse, p.lse), 1e-4);
}

}  // namespace
