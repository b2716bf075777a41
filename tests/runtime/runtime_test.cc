// Tests of the CPU training runtime (exec/runtime/): tracked allocator, plan-independent
// initialization, weight files, data (Markov corpus, llm.c shards, batch slicing), and
// single-rank training (loss falls toward the corpus's entropy floor; measured peak
// memory equals the hand-derived allocation timeline).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "exec/comm/comm.h"
#include "exec/plan.h"
#include "exec/runtime/alloc.h"
#include "exec/runtime/data.h"
#include "exec/runtime/init.h"
#include "exec/runtime/runtime.h"
#include "exec/runtime/weights.h"
#include "kernels/cpu/cpu.h"

namespace {

struct Ctx {
  mp_ctx ctx;
  Ctx() { mp_ctx_init(&ctx); }
  mp_ctx *operator&() { return &ctx; }
  const char *msg() const { return mp_errmsg(&ctx); }
};

mp_model Model(const char *name) {
  Ctx c;
  mp_model m;
  EXPECT_EQ(mp_model_load(&c, name, &m), MP_OK) << c.msg();
  return m;
}

mp_plan *Plan(const mp_model &m, const char *mesh, int64_t seq, int64_t mb, int64_t gb,
              mp_ac_mode ac = MP_AC_NONE, int fp8 = 0) {
  Ctx c;
  mp_mesh me;
  EXPECT_EQ(mp_mesh_parse(&c, mesh, 0, &me), MP_OK) << c.msg();
  mp_plan_options o;
  mp_plan_options_init(&o);
  o.seq = seq;
  o.micro_batch = mb;
  o.global_batch = gb;
  o.ac = ac;
  o.fp8 = fp8;
  o.sp = 0; /* the runtime runs tp in the all-reduce form */
  mp_plan *p = nullptr;
  EXPECT_EQ(mp_build_plan(&c, &m, &me, &o, &p), MP_OK) << mesh << ": " << c.msg();
  return p;
}

// A single-rank runtime with its plan, comm and backend.
struct Rt {
  Ctx c;
  mp_model model;
  mp_plan *plan = nullptr;
  mp_comm *comm = nullptr;
  mp_kctx kc{};
  mp_runtime *rt = nullptr;
  Rt(const char *model_name, int64_t seq, int64_t mb, int64_t gb, mp_ac_mode ac = MP_AC_NONE,
     float lr = 1e-3f, int fp8 = 0, int f8_codes = 0) {
    model = Model(model_name);
    plan = Plan(model, "dp_shard=1", seq, mb, gb, ac, fp8);
    mp_mesh one;
    mp_mesh_init(&one);
    EXPECT_EQ(mp_comm_create_single(&c, &one, &comm), MP_OK) << c.msg();
    kc.err = &c;
    EXPECT_EQ(mp_backend_cpu()->init(&kc, 0), MP_OK);
    mp_runtime_options o;
    mp_runtime_options_init(&o);
    o.lr = lr;
    o.f8_codes = f8_codes;
    EXPECT_EQ(mp_runtime_create(&c, plan, comm, mp_backend_cpu(), &kc, &o, &rt), MP_OK) << c.msg();
  }
  ~Rt() {
    mp_runtime_destroy(rt);
    mp_comm_destroy(comm);
    mp_plan_destroy(plan);
  }
};

// ---- tracked allocator -------------------------------------------------------------------

TEST(Alloc, CountsExactBytesPerCategoryAndPeak) {
  Ctx c;
  mp_kctx kc{&c, nullptr, 0};
  mp_talloc *a = nullptr;
  ASSERT_EQ(mp_talloc_create(&c, mp_backend_cpu(), &kc, &a), MP_OK);
  void *p1, *p2, *p3;
  ASSERT_EQ(mp_talloc_alloc(&c, a, MP_MEM_PARAMS, 100, &p1), MP_OK);
  ASSERT_EQ(mp_talloc_alloc(&c, a, MP_MEM_ACTIVATIONS, 1000, &p2), MP_OK);
  ASSERT_EQ(mp_talloc_alloc(&c, a, MP_MEM_ACTIVATIONS, 24, &p3), MP_OK);
  EXPECT_EQ(static_cast<unsigned char *>(p2)[999], 0);  // zero-filled
  EXPECT_EQ(mp_talloc_current_total(a), 1124);
  EXPECT_EQ(mp_talloc_current_bytes(a, MP_MEM_ACTIVATIONS), 1024);
  ASSERT_EQ(mp_talloc_free(&c, a, p2), MP_OK);
  EXPECT_EQ(mp_talloc_current_total(a), 124);
  EXPECT_EQ(mp_talloc_peak_total(a), 1124);
  EXPECT_EQ(mp_talloc_peak_bytes(a, MP_MEM_ACTIVATIONS), 1024);
  mp_talloc_reset_peak(a);
  EXPECT_EQ(mp_talloc_peak_total(a), 124);
  // A double free is detected, not silently accepted.
  EXPECT_EQ(mp_talloc_free(&c, a, p2), MP_ERR_INTERNAL);
  void *z = reinterpret_cast<void *>(0x1);
  EXPECT_EQ(mp_talloc_alloc(&c, a, MP_MEM_TEMP, 0, &z), MP_OK);
  EXPECT_EQ(z, nullptr);
  EXPECT_EQ(mp_talloc_live_blocks(a), 2);
  ASSERT_EQ(mp_talloc_free(&c, a, p1), MP_OK);
  ASSERT_EQ(mp_talloc_free(&c, a, p3), MP_OK);
  EXPECT_EQ(mp_talloc_current_total(a), 0);
  mp_talloc_destroy(a);
}

// ---- initialization ---------------------------------------------------------------------

TEST(Init, KindsAndScalesFollowPyTorchDefaults) {
  mp_model m = Model("tiny-dense");
  mp_plan *p = Plan(m, "dp_shard=1", 32, 1, 1);
  ASSERT_NE(p, nullptr);
  const mp_param &q = p->params[mp_plan_find_param(p, "layers.0.attention.q_proj.weight")];
  const mp_param &emb = p->params[mp_plan_find_param(p, "tok_embeddings.weight")];
  const mp_param &nrm = p->params[mp_plan_find_param(p, "layers.1.ffn_norm.weight")];
  EXPECT_EQ(mp_init_value(7, &nrm, 5), 1.0f);
  // Linear: U(-1/sqrt(64), 1/sqrt(64)): bound 0.125, variance 0.125^2 / 3.
  double s = 0, s2 = 0, mx = 0;
  const int64_t n = mp_param_numel(&q);
  for (int64_t i = 0; i < n; i++) {
    double v = mp_init_value(7, &q, i);
    s += v;
    s2 += v * v;
    mx = std::max(mx, std::fabs(v));
  }
  EXPECT_LE(mx, 0.125);
  EXPECT_GT(mx, 0.12);
  EXPECT_NEAR(s / n, 0.0, 0.005);
  EXPECT_NEAR(s2 / n, 0.125 * 0.125 / 3, 0.0005);
  // Embedding: N(0, 0.02^2).
  s = s2 = 0;
  const int64_t ne = mp_param_numel(&emb);
  for (int64_t i = 0; i < ne; i++) {
    double v = mp_init_value(7, &emb, i);
    s += v;
    s2 += v * v;
  }
  EXPECT_NEAR(s / ne, 0.0, 0.0005);
  EXPECT_NEAR(std::sqrt(s2 / ne), 0.02, 0.0005);
  // Different seeds and different FQNs give different values.
  EXPECT_NE(mp_init_value(7, &q, 3), mp_init_value(8, &q, 3));
  const mp_param &k = p->params[mp_plan_find_param(p, "layers.0.attention.k_proj.weight")];
  EXPECT_NE(mp_init_value(7, &q, 3), mp_init_value(7, &k, 3));
  mp_plan_destroy(p);
}

// Every rank of every mesh fills its tile with exactly the values the single-rank runtime
// holds at the same global indices.
TEST(Init, IndependentOfPlan) {
  Rt one("tiny-moe", 32, 1, 1);
  ASSERT_NE(one.rt, nullptr);
  const mp_plan *p1 = one.plan;
  std::map<std::string, std::vector<float>> full;
  for (int i = 0; i < p1->n_params; i++) {
    int64_t off[3], len[3];
    int64_t n = mp_runtime_param_tile(one.rt, i, off, len);
    ASSERT_EQ(n, mp_param_numel(&p1->params[i])) << p1->params[i].fqn;  // world 1: whole tensors
    std::vector<float> v(n);
    ASSERT_EQ(mp_runtime_read_param(&one.c, one.rt, i, v.data()), MP_OK);
    full[p1->params[i].fqn] = v;
  }
  mp_model m = Model("tiny-moe");
  const char *meshes[] = {"dp_shard=4", "tp=2", "dp_shard=2,tp=2", "dp_shard=4,ep=2", "dp_replicate=2,dp_shard=2"};
  int tiles_checked = 0;
  for (const char *mesh : meshes) {
    mp_plan *p = Plan(m, mesh, 32, 1, 4);
    ASSERT_NE(p, nullptr);
    const int world = mp_mesh_world(&p->mesh);
    for (int r = 0; r < world; r++)
      for (int i = 0; i < p->n_params; i++) {
        const mp_param &prm = p->params[i];
        int64_t off[3], len[3];
        if (!mp_param_tile(p, &prm, r, off, len)) continue;
        int64_t n = 1;
        for (int d = 0; d < prm.ndim; d++) n *= len[d];
        std::vector<float> tile(n);
        mp_init_fill_block(1234, &prm, off, len, tile.data());
        const std::vector<float> &ref = full.at(prm.fqn);
        // Walk the tile's elements and map each to its global row-major index.
        int64_t l[3] = {1, 1, 1}, o[3] = {0, 0, 0}, g[3] = {1, 1, 1};
        for (int d = 0; d < prm.ndim; d++) {
          l[3 - prm.ndim + d] = len[d];
          o[3 - prm.ndim + d] = off[d];
          g[3 - prm.ndim + d] = prm.shape[d];
        }
        int64_t t = 0;
        for (int64_t a = 0; a < l[0]; a++)
          for (int64_t b = 0; b < l[1]; b++)
            for (int64_t cc = 0; cc < l[2]; cc++, t++) {
              int64_t gi = ((o[0] + a) * g[1] + o[1] + b) * g[2] + o[2] + cc;
              ASSERT_EQ(tile[t], ref[gi]) << mesh << " rank " << r << " " << prm.fqn << " global " << gi;
            }
        tiles_checked++;
      }
    mp_plan_destroy(p);
  }
  EXPECT_GT(tiles_checked, 100);
}

// ---- weight file ------------------------------------------------------------------------

TEST(Weights, RoundTripAndRejectsCorruption) {
  Ctx c;
  mp_wfile w;
  mp_wfile_init(&w);
  const int64_t s1[2] = {2, 3}, s2[1] = {4};
  const float a[6] = {1, 2, 3, 4, 5, 6}, b[4] = {-1, 0.5f, 0, 7};
  ASSERT_EQ(mp_wfile_add(&c, &w, "x.weight", 2, s1, a), MP_OK);
  ASSERT_EQ(mp_wfile_add(&c, &w, "norm.weight", 1, s2, b), MP_OK);
  // Hand-derived size: 12 header + (4 + 8 + 4 + 16 + 24) + (4 + 11 + 4 + 8 + 16).
  EXPECT_EQ(w.len, 12u + 56u + 43u);
  std::string path = std::string(getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp") + "/w.bin";
  ASSERT_EQ(mp_wfile_write(&c, &w, path.c_str()), MP_OK) << c.msg();
  mp_wtensor *t;
  int n;
  char *raw;
  ASSERT_EQ(mp_wfile_read(&c, path.c_str(), &t, &n, &raw), MP_OK) << c.msg();
  ASSERT_EQ(n, 2);
  EXPECT_STREQ(t[0].name, "x.weight");
  EXPECT_EQ(t[0].shape[1], 3);
  EXPECT_EQ(t[1].data[3], 7.0f);
  free(t);
  free(raw);
  // Truncated file: refused.
  FILE *f = fopen(path.c_str(), "wb");
  fwrite(w.buf, 1, w.len - 3, f);
  fclose(f);
  EXPECT_EQ(mp_wfile_read(&c, path.c_str(), &t, &n, &raw), MP_ERR_INVALID);
  mp_wfile_free(&w);
}

// ---- data --------------------------------------------------------------------------------

TEST(Data, MarkovEntropyMatchesTheSampledCorpus) {
  Ctx c;
  double h1;
  ASSERT_EQ(mp_markov_entropy(&c, 16, 1, 3, &h1), MP_OK);
  EXPECT_EQ(h1, 0.0);  // one successor per state: deterministic
  mp_corpus corp;
  ASSERT_EQ(mp_corpus_synthetic(&c, 32, 3, 400000, 5, &corp), MP_OK) << c.msg();
  EXPECT_GT(corp.entropy_nats, 0.0);
  EXPECT_LT(corp.entropy_nats, std::log(3.0) + 1e-12);
  // Empirical conditional entropy of the sample (independent estimate).
  std::vector<double> cnt(32 * 32, 0), row(32, 0);
  for (int64_t i = 0; i + 1 < corp.n_tokens; i++) {
    cnt[corp.tokens[i] * 32 + corp.tokens[i + 1]] += 1;
    row[corp.tokens[i]] += 1;
  }
  double h = 0, total = (double)corp.n_tokens - 1;
  for (int a = 0; a < 32; a++)
    for (int b = 0; b < 32; b++)
      if (cnt[a * 32 + b] > 0) h -= cnt[a * 32 + b] / total * std::log(cnt[a * 32 + b] / row[a]);
  EXPECT_NEAR(h, corp.entropy_nats, 0.01);
  mp_corpus_free(&corp);
}

TEST(Data, ShardRoundTripAndBatchSlices) {
  Ctx c;
  mp_corpus corp{};
  std::vector<uint16_t> toks(50);
  for (int i = 0; i < 50; i++) toks[i] = (uint16_t)(i * 7 % 50);
  corp.tokens = toks.data();
  corp.n_tokens = 50;
  std::string path = std::string(getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp") + "/shard.bin";
  ASSERT_EQ(mp_corpus_write_shard(&c, &corp, path.c_str()), MP_OK);
  mp_corpus back;
  ASSERT_EQ(mp_corpus_read_shard(&c, path.c_str(), &back), MP_OK) << c.msg();
  ASSERT_EQ(back.n_tokens, 50);
  for (int i = 0; i < 50; i++) ASSERT_EQ(back.tokens[i], toks[i]);
  // seq 4, global batch 4, 2 dp ranks; step 3: global sequences 12..15 start at
  // (g*4) mod 46: 48 mod 46 = 2, 52 mod 46 = 6, 56 mod 46 = 10, 60 mod 46 = 14.
  // dp rank 1 takes sequences 14 and 15: starts 10 and 14.
  int32_t out[2 * 5];
  ASSERT_EQ(mp_corpus_batch(&c, &back, 3, 4, 4, 1, 2, out), MP_OK);
  for (int t = 0; t < 5; t++) {
    EXPECT_EQ(out[t], toks[10 + t]);
    EXPECT_EQ(out[5 + t], toks[14 + t]);
  }
  EXPECT_EQ(mp_corpus_batch(&c, &back, 0, 3, 4, 0, 2, out), MP_ERR_INVALID);  // 3 over 2 ranks
  mp_corpus_free(&back);
  // A file with the wrong magic is refused.
  FILE *f = fopen(path.c_str(), "r+b");
  int32_t bad = 12345;
  fwrite(&bad, 4, 1, f);
  fclose(f);
  EXPECT_EQ(mp_corpus_read_shard(&c, path.c_str(), &back), MP_ERR_INVALID);
}

// ---- training ----------------------------------------------------------------------------

// On the synthetic Markov corpus (fanout 4 over 256 tokens) the cross-entropy starts at
// about ln(256) = 5.55 and can never go below the chain's entropy rate H (1.25 for seed
// 1234). After 120 steps of 256 tokens it must have learned most of the bigram table:
// well below ln(V) - 2.5 and within 1 nat of H (an untrained model sits 4.3 nats above).
TEST(Train, LossFallsTowardEntropyFloor) {
  Rt r("tiny-dense", 32, 8, 8, MP_AC_NONE, 1e-2f);
  ASSERT_NE(r.rt, nullptr);
  mp_corpus corp;
  ASSERT_EQ(mp_corpus_synthetic(&r.c, 256, 4, 1 << 16, 1234, &corp), MP_OK);
  const double H = corp.entropy_nats, lnV = std::log(256.0);
  std::vector<int32_t> batch(8 * 33);
  double first = 0, last10 = 0;
  const int steps = 120;
  for (int s = 0; s < steps; s++) {
    ASSERT_EQ(mp_corpus_batch(&r.c, &corp, s, 8, 32, 0, 1, batch.data()), MP_OK);
    mp_step_result res;
    ASSERT_EQ(mp_runtime_step(&r.c, r.rt, batch.data(), &res), MP_OK) << r.c.msg();
    ASSERT_TRUE(std::isfinite(res.loss));
    if (s == 0) first = res.ce_loss;
    if (s >= steps - 10) last10 += res.ce_loss / 10;
  }
  EXPECT_NEAR(first, lnV, 0.3);
  EXPECT_LT(last10, lnV - 2.5);
  EXPECT_LT(last10, H + 1.0);
  EXPECT_GT(last10, H - 0.1);  // nothing beats the floor (up to sampling noise)
  mp_corpus_free(&corp);
}

// Hand-derived allocation timeline of one step of tiny-dense, B=2, T=32 (N=64 tokens; every
// tensor size is a multiple of 16 floats, so the 64-byte carving adds no padding), AC none.
// The runtime documents its order (exec/runtime/runtime_step.c): the peak is the larger of
//   (a) the head's backward: every forward tensor + dlogits + dres + dxf
//   (b) the last block's backward: blocks + x[0..L-1] + dres + the block workspace
// on top of the resident state.
TEST(Train, PeakMemoryEqualsHandDerivedTimeline) {
  const int64_t B = 2, T = 32, N = B * T, C = 64, nh = 8, nkv = 4, hd = 8, F = 192, V = 256, L = 2;
  const int64_t QD = nh * hd, KD = nkv * hd;
  Rt r("tiny-dense", T, B, B);
  ASSERT_NE(r.rt, nullptr);
  int64_t P = 0;  // tiny-dense parameters
  P += V * C;                                                        // tok_embeddings
  P += L * (C + QD * C + 2 * KD * C + C * QD + C + 3 * F * C);       // blocks
  P += C + V * C;                                                    // norm, output
  ASSERT_EQ(P, mp_model_param_count(&r.model));
  // scalars: 8 float8 amax/scale slots + one sum-of-squares slot per parameter tensor
  // (embedding, 9 per block, final norm, head) + 4 forward float8 amax per block
  const int64_t n_tensors = 1 + 9 * L + 2;
  const int64_t resident = 4 * P * 4 + 2 * T * (hd / 2) * 4 + (8 + n_tensors + 4 * L) * 4;  // w g m v, rope, scalars
  const mp_talloc *ta = mp_runtime_allocator(r.rt);
  EXPECT_EQ(mp_talloc_current_total(ta), resident);
  const int64_t block = (N * C + N + N * QD + 2 * N * KD + N * C + N * C + N + 3 * N * F) * 4;
  const int64_t core = (N * QD + B * nh * T) * 4;
  const int64_t xs = (L + 1) * N * C * 4;
  const int64_t toks = 2 * N * 4;
  const int64_t head = (N * C + N) * 4;                      // xf, rstdf
  const int64_t logits = (N * V + N + N + 16) * 4;           // logits, losses, lse, mean
  const int64_t fwd = toks + xs + L * (block + core) + head + logits;
  const int64_t peak_a = fwd + N * V * 4 + 2 * N * C * 4;
  const int64_t ws = (N * C + 3 * N * QD + 3 * N * KD + 3 * N * F) * 4;  // dxn; datt dq dqp; dk dv dkp; dh dg du
  const int64_t peak_b = toks + (xs - N * C * 4) + L * (block + core) + N * C * 4 + ws;
  const int64_t want = resident + std::max(peak_a, peak_b);
  std::vector<int32_t> batch(B * (T + 1));
  for (size_t i = 0; i < batch.size(); i++) batch[i] = (int32_t)(i * 37 % V);
  mp_step_result res;
  ASSERT_EQ(mp_runtime_step(&r.c, r.rt, batch.data(), &res), MP_OK) << r.c.msg();
  EXPECT_EQ(res.peak_bytes, want) << "peak_a " << peak_a << " peak_b " << peak_b;
  // Everything transient was freed: only the resident state remains.
  EXPECT_EQ(mp_talloc_current_total(ta), resident);
  EXPECT_EQ(mp_talloc_current_bytes(ta, MP_MEM_ACTIVATIONS), 0);
  EXPECT_EQ(mp_talloc_peak_bytes(ta, MP_MEM_PARAMS), P * 4);
  EXPECT_EQ(mp_talloc_peak_bytes(ta, MP_MEM_OPTIMIZER), 2 * P * 4);
}

// Activation checkpointing trades memory for recomputation without changing the numbers:
// the same gradients bit for bit (the kernels are deterministic), and a lower peak of
// saved activations for full AC than selective-core, and selective-core than none.
TEST(Train, CheckpointingKeepsGradientsAndLowersActivationPeak) {
  std::vector<float> ref;
  int64_t act_peak[3];
  const mp_ac_mode modes[3] = {MP_AC_NONE, MP_AC_SELECTIVE_CORE, MP_AC_FULL};
  for (int k = 0; k < 3; k++) {
    Rt r("tiny-moe", 32, 2, 4, modes[k]);
    ASSERT_NE(r.rt, nullptr);
    std::vector<int32_t> batch(4 * 33);
    for (size_t i = 0; i < batch.size(); i++) batch[i] = (int32_t)((i * 97 + 11) % 256);
    mp_step_result res;
    ASSERT_EQ(mp_runtime_forward_backward(&r.c, r.rt, batch.data(), &res), MP_OK) << r.c.msg();
    act_peak[k] = mp_talloc_peak_bytes(mp_runtime_allocator(r.rt), MP_MEM_ACTIVATIONS);
    std::vector<float> all;
    for (int i = 0; i < r.plan->n_params; i++) {
      std::vector<float> g(mp_param_numel(&r.plan->params[i]));
      ASSERT_EQ(mp_runtime_read_grad(&r.c, r.rt, i, g.data()), MP_OK);
      all.insert(all.end(), g.begin(), g.end());
    }
    if (k == 0) {
      ref = all;
    } else {
      ASSERT_EQ(all.size(), ref.size());
      for (size_t i = 0; i < all.size(); i++) ASSERT_EQ(all[i], ref[i]) << "ac mode " << k << " element " << i;
    }
  }
  EXPECT_LT(act_peak[1], act_peak[0]);
  EXPECT_LT(act_peak[2], act_peak[1]);
}

// Float8 Linears as GEMMs on codes (the CUDA path's algorithm: shared activation operands,
// the amax from RMSNorm's and SwiGLU's kernels and kept from the forward for the weight
// gradients, input gradients added by the GEMM) against the fp32 emulation, which computes
// every amax afresh from the tensor and fake-quantizes: the same quantized values and the
// same sums, so the same gradients and losses. A stale or wrong amax changes a scale, hence
// most codes, by far more than the tolerance.
TEST(Train, Float8OnCodesMatchesTheEmulation) {
  for (mp_ac_mode ac : {MP_AC_NONE, MP_AC_FULL}) {
    SCOPED_TRACE(mp_ac_mode_name(ac));
    Rt emu("tiny-dense", 32, 2, 4, ac, 1e-3f, 1, 0), codes("tiny-dense", 32, 2, 4, ac, 1e-3f, 1, 1);
    ASSERT_NE(emu.rt, nullptr);
    ASSERT_NE(codes.rt, nullptr);
    int n8 = 0;
    for (int i = 0; i < codes.plan->n_params; i++) n8 += codes.plan->params[i].float8;
    ASSERT_EQ(n8, 2 * 7);  // q k v o gate up down in each of the two blocks
    std::vector<int32_t> batch(4 * 33);
    for (size_t i = 0; i < batch.size(); i++) batch[i] = (int32_t)((i * 97 + 11) % 256);
    for (int step = 0; step < 3; step++) {
      mp_step_result re, rc;
      ASSERT_EQ(mp_runtime_forward_backward(&emu.c, emu.rt, batch.data(), &re), MP_OK) << emu.c.msg();
      ASSERT_EQ(mp_runtime_forward_backward(&codes.c, codes.rt, batch.data(), &rc), MP_OK) << codes.c.msg();
      EXPECT_NEAR(rc.loss, re.loss, 1e-6 * std::fabs(re.loss)) << "step " << step;
      double worst = 0.0, scale = 0.0;
      for (int i = 0; i < codes.plan->n_params; i++) {
        std::vector<float> ge(mp_param_numel(&emu.plan->params[i])), gc(ge.size());
        ASSERT_EQ(mp_runtime_read_grad(&emu.c, emu.rt, i, ge.data()), MP_OK);
        ASSERT_EQ(mp_runtime_read_grad(&codes.c, codes.rt, i, gc.data()), MP_OK);
        for (size_t j = 0; j < ge.size(); j++) {
          worst = std::max(worst, (double)std::fabs(gc[j] - ge[j]));
          scale = std::max(scale, (double)std::fabs(ge[j]));
        }
      }
      ASSERT_GT(scale, 0.0);
      EXPECT_LE(worst, 1e-5 * scale) << "step " << step;
      ASSERT_EQ(mp_runtime_optimizer_step(&emu.c, emu.rt, &re), MP_OK) << emu.c.msg();
      ASSERT_EQ(mp_runtime_optimizer_step(&codes.c, codes.rt, &rc), MP_OK) << codes.c.msg();
    }
  }
}

// f8_codes on a backend without float8 GEMMs on codes is refused at creation, by name.
TEST(Train, Float8OnCodesNeedsTheGemmOnCodes) {
  Ctx c;
  mp_model m = Model("tiny-dense");
  mp_plan *p = Plan(m, "dp_shard=1", 32, 2, 4, MP_AC_NONE, 1);
  mp_mesh one;
  mp_mesh_init(&one);
  mp_comm *comm = nullptr;
  ASSERT_EQ(mp_comm_create_single(&c, &one, &comm), MP_OK) << c.msg();
  mp_kctx kc{};
  kc.err = &c;
  ASSERT_EQ(mp_backend_cpu()->init(&kc, 0), MP_OK);
  mp_backend no_f8 = *mp_backend_cpu();
  no_f8.matmul_f8 = nullptr;
  mp_runtime_options o;
  mp_runtime_options_init(&o);
  o.f8_codes = 1;
  mp_runtime *rt = nullptr;
  EXPECT_EQ(mp_runtime_create(&c, p, comm, &no_f8, &kc, &o, &rt), MP_ERR_UNSUPPORTED);
  EXPECT_NE(std::string(c.msg()).find("matmul_f8"), std::string::npos) << c.msg();
  EXPECT_EQ(rt, nullptr);
  mp_comm_destroy(comm);
  mp_plan_destroy(p);
}

TEST(Train, RefusesWhatItCannotRun) {
  Ctx c;
  mp_mesh one;
  mp_mesh_init(&one);
  mp_comm *comm;
  ASSERT_EQ(mp_comm_create_single(&c, &one, &comm), MP_OK);
  mp_kctx kc{&c, nullptr, 0};
  mp_runtime_options o;
  mp_runtime_options_init(&o);
  mp_runtime *rt = nullptr;
  {  // a mesh of 2 ranks in a job of 1
    mp_model m = Model("tiny-dense");
    mp_plan *p = Plan(m, "dp_shard=2", 32, 1, 2);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(mp_runtime_create(&c, p, comm, mp_backend_cpu(), &kc, &o, &rt), MP_ERR_INVALID);
    EXPECT_NE(std::string(c.msg()).find("mpirun -np 2"), std::string::npos) << c.msg();
    EXPECT_EQ(rt, nullptr);
    mp_plan_destroy(p);
  }
  {  // a model family the runtime does not implement
    mp_model m = Model("gpt2-124m");
    mp_plan *p = Plan(m, "dp_replicate=1", 32, 1, 1);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(mp_runtime_create(&c, p, comm, mp_backend_cpu(), &kc, &o, &rt), MP_ERR_UNSUPPORTED);
    EXPECT_NE(std::string(c.msg()).find("llama family"), std::string::npos) << c.msg();
    mp_plan_destroy(p);
  }
  mp_comm_destroy(comm);
}

}  // namespace
