// sim/stack.h mp_stack_attention_eff and sim/cost.c: a stack that states its attention kernel's
// measured rate by the span of each call (attention_by_span) prices an attention core at the
// fraction for the op's span (op.n, the keys it covers), interpolated in log2 of the span and
// held at the end points, the backward converted from the measurement's FLOP count (2.5 times
// the forward's) to meshplan's (twice), times its sustained share, carried to another GPU by
// the flash ratio; attention's element-wise ops (n 0) and a stack without the table keep
// attention_eff. Each figure against a hand calculation; the loader's refusals.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>

#include "sim/cluster.h"
#include "sim/sim.h"
#include "sim/stack.h"
#include "tests/sim/round_figures.h"

namespace {

// Profile() (attention_eff 0.4) with a table: spans 1024, 4096 and 16384 keys, forward
// 0.4, 0.6, 0.7 and backward (the measurement's count) 0.5, 0.55, 0.6 of the bf16 peak,
// sustained 0.8.
mp_stack_profile SpanProfile() {
  mp_stack_profile p = Profile();
  p.attn_span_n = 3;
  const double span[] = {1024, 4096, 16384}, fwd[] = {0.4, 0.6, 0.7}, bwd[] = {0.5, 0.55, 0.6};
  for (int i = 0; i < 3; i++) p.attn_span[i] = span[i], p.attn_span_fwd[i] = fwd[i], p.attn_span_bwd[i] = bwd[i];
  p.attn_span_sustained = 0.8;
  return p;
}

// An attention core over n keys, 4e12 FLOPs forward (8e12 backward, meshplan's count), a
// token byte count so the FLOP time is the op's.
mp_op Core(int64_t n, mp_variant v) {
  mp_op o;
  memset(&o, 0, sizeof o);
  o.type = MP_OP_COMPUTE;
  o.kernel = MP_KERNEL_ATTENTION;
  o.variant = v;
  o.dtype = MP_DTYPE_BF16;
  o.m = n, o.n = n, o.k = 128, o.batch = 8;
  o.flops = v == MP_VAR_FWD ? 4e12 : 8e12;
  o.bytes = 1e3;
  return o;
}

TEST(AttentionSpan, FractionBySpanAndPass) {
  const mp_stack_profile p = SpanProfile();
  // at a stated span: forward 0.6 x 0.8 = 0.48; backward 0.55 x 0.8 / 1.25 = 0.352
  EXPECT_DOUBLE_EQ(mp_stack_attention_eff(&p, 4096, 0), 0.6 * 0.8);
  EXPECT_DOUBLE_EQ(mp_stack_attention_eff(&p, 4096, 1), 0.55 * 0.8 / 1.25);
  // 2048 lies halfway from 1024 to 4096 in log2: (0.4 + 0.6) / 2 = 0.5 forward, 0.525 back
  EXPECT_NEAR(mp_stack_attention_eff(&p, 2048, 0), 0.5 * 0.8, 1e-15);
  EXPECT_NEAR(mp_stack_attention_eff(&p, 2048, 1), 0.525 * 0.8 / 1.25, 1e-15);
  // 8192, halfway from 4096 to 16384: 0.65 forward
  EXPECT_NEAR(mp_stack_attention_eff(&p, 8192, 0), 0.65 * 0.8, 1e-15);
  // outside the table the end points hold: 512 keys at 1024's, 65536 at 16384's
  EXPECT_DOUBLE_EQ(mp_stack_attention_eff(&p, 512, 0), 0.4 * 0.8);
  EXPECT_DOUBLE_EQ(mp_stack_attention_eff(&p, 65536, 1), 0.6 * 0.8 / 1.25);
  // no span (an element-wise op) or no table: attention_eff
  EXPECT_DOUBLE_EQ(mp_stack_attention_eff(&p, 0, 0), 0.4);
  const mp_stack_profile flat = Profile();
  EXPECT_DOUBLE_EQ(mp_stack_attention_eff(&flat, 4096, 1), 0.4);
}

// The op's time on the round-number GPU (1000 TFLOP/s bf16): forward over 4096 keys at
// 0.48 of it, 4e12 / 4.8e14 = 8.333 ms; its backward, 8e12 FLOPs at 0.352, 22.73 ms, which
// is the measurement's own 1e13 FLOPs (2.5 x 4e12) at 0.55 x 0.8 = 0.44: 1e13 / 4.4e14.
// Over 8192 keys the forward takes 4e12 / (1e15 x 0.52) = 7.692 ms. An element-wise op of
// the attention class (n 0) at attention_eff 0.4: 4e12 / 4e14 = 10 ms, as a stack without
// the table prices every attention op.
TEST(AttentionSpan, OpTimeByHand) {
  const mp_stack_profile p = SpanProfile(), flat = Profile();
  const mp_gpu g = Cluster().gpu;
  mp_op f = Core(4096, MP_VAR_FWD), b = Core(4096, MP_VAR_BWD), f8k = Core(8192, MP_VAR_FWD);
  EXPECT_NEAR(mp_sim_compute_op_s(&f, &g, &p), 4e12 / 4.8e14, 1e-12);
  EXPECT_NEAR(mp_sim_compute_op_s(&b, &g, &p), 1e13 / 4.4e14, 1e-12);
  EXPECT_NEAR(mp_sim_compute_op_s(&f8k, &g, &p), 4e12 / 5.2e14, 1e-12);
  mp_op e = Core(4096, MP_VAR_FWD);
  e.n = 0;
  EXPECT_NEAR(mp_sim_compute_op_s(&e, &g, &p), 10e-3, 1e-12);
  EXPECT_NEAR(mp_sim_compute_op_s(&f, &g, &flat), 10e-3, 1e-12);
}

// Carried to another GPU as attention_eff is: fitted on "x" (flash 0.31), run on "y" (flash
// 0.62), x2: the 4096-key forward at 0.48 x 2 = 0.96 of the peak, 4e12 / 9.6e14 = 4.167 ms;
// the 16384-key forward at 0.7 x 0.8 x 2 = 1.12, held at the whole peak: 4 ms.
TEST(AttentionSpan, CarriedByTheFlashRatio) {
  mp_stack_profile p = SpanProfile();
  snprintf(p.fit_gpu, sizeof p.fit_gpu, "x");
  p.fit_kernel_eff = {0.8, 0.75, 0.31};
  mp_gpu y = Cluster().gpu;
  snprintf(y.name, sizeof y.name, "y");
  y.kernel_eff = {0.96, 0.6, 0.62};
  mp_op f = Core(4096, MP_VAR_FWD), f16k = Core(16384, MP_VAR_FWD);
  EXPECT_NEAR(mp_sim_compute_op_s(&f, &y, &p), 4e12 / 9.6e14, 1e-12);
  EXPECT_NEAR(mp_sim_compute_op_s(&f16k, &y, &p), 4e-3, 1e-12);
}

// cuDNN's published figures on the H100 SXM (989.4 TFLOP/s bf16; NVIDIA/cudnn-frontend
// 3929da2, the H200 sweep: 673 TFLOP/s forward and 579 backward at 16,384 tokens, 0.6802 and
// 0.5852 of the peak) with a sustained share of 0.8534: Qwen3-235B-A22B's attention core at
// seq 16K under TP 4 (16 query heads of 128 on the rank, 16,384 tokens, 8,192 keys a query
// on average): 2 x 16384 x 8192 x 16 x 256 = 1.0995e12 FLOPs forward at 989.4e12 x 0.6802 x
// 0.8534 = 5.743e14 FLOP/s, 1.914 ms; the backward's 2.199e12 (meshplan's count) at 989.4e12
// x 0.5852 x 0.8534 / 1.25 = 3.953e14, 5.563 ms.
TEST(AttentionSpan, OneCoreOnTheH100) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_gpu h100;
  ASSERT_EQ(mp_gpu_load(&ctx, "h100-sxm", &h100), MP_OK) << mp_errmsg(&ctx);
  mp_stack_profile p = Profile();
  p.attn_span_n = 5;
  const double span[] = {2048, 4096, 8192, 16384, 32768};
  const double fwd[] = {0.4892, 0.5973, 0.6509, 0.6802, 0.6954}, bwd[] = {0.374, 0.4791, 0.5468, 0.5852, 0.5872};
  for (int i = 0; i < 5; i++) p.attn_span[i] = span[i], p.attn_span_fwd[i] = fwd[i], p.attn_span_bwd[i] = bwd[i];
  p.attn_span_sustained = 0.8534;
  const double flops = 2.0 * 16384 * 8192 * 16 * 256;
  mp_op f = Core(16384, MP_VAR_FWD), b = Core(16384, MP_VAR_BWD);
  f.flops = flops, b.flops = 2.0 * flops;
  EXPECT_NEAR(mp_sim_compute_op_s(&f, &h100, &p), 1.914e-3, 1e-6);
  EXPECT_NEAR(mp_sim_compute_op_s(&b, &h100, &p), 5.563e-3, 1e-6);
}

std::string SpanJson(const std::string &table) {
  return "{\"name\":\"x\",\"gemm_eff_max\":0.5,\"gemm_eff_half_mnk\":0,\"fp8_gemm_eff_max\":0.5,"
         "\"attention_eff\":0.5,\"hbm_eff\":0.5,\"link_eff\":0.5,\"kernel_overhead_us\":0,"
         "\"comm_overhead_us\":0,\"frag_factor\":1,\"source\":\"s\",\"attention_by_span\":" + table + "}";
}

TEST(AttentionSpan, LoadsAndRefuses) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_stack_profile p;
  ASSERT_EQ(mp_stack_from_text(&ctx,
                               SpanJson("{\"span\":[1024,4096],\"fwd\":[0.4,0.6],\"bwd\":[0.5,0.55],"
                                        "\"sustained\":0.8,\"source\":\"m\"}").c_str(),
                               "x.json", &p),
            MP_OK)
      << mp_errmsg(&ctx);
  EXPECT_EQ(p.attn_span_n, 2);
  EXPECT_DOUBLE_EQ(p.attn_span[1], 4096);
  EXPECT_DOUBLE_EQ(p.attn_span_bwd[0], 0.5);
  EXPECT_DOUBLE_EQ(p.attn_span_sustained, 0.8);
  // sustained is optional (1)
  ASSERT_EQ(mp_stack_from_text(&ctx, SpanJson("{\"span\":[1024],\"fwd\":[0.4],\"bwd\":[0.5],\"source\":\"m\"}").c_str(),
                               "x.json", &p),
            MP_OK);
  EXPECT_DOUBLE_EQ(p.attn_span_sustained, 1.0);
  const struct {
    const char *table, *msg;
  } bad[] = {
      {"{\"span\":[4096,1024],\"fwd\":[0.4,0.6],\"bwd\":[0.5,0.55],\"source\":\"m\"}",
       "x.json: attention_by_span: span must ascend (span[1] 1024 after 4096)"},
      {"{\"span\":[1024,4096],\"fwd\":[0.4],\"bwd\":[0.5,0.55],\"source\":\"m\"}",
       "x.json: attention_by_span: fwd has 1 entries where span has 2"},
      {"{\"span\":[1024],\"fwd\":[1.2],\"bwd\":[0.5],\"source\":\"m\"}",
       "x.json: attention_by_span: fwd[0] must be a number in (0, 1]"},
      {"{\"span\":[1024],\"fwd\":[0.4],\"bwd\":[0.5]}", "x.json: attention_by_span: source must name the measurement"},
      {"{\"span\":[],\"fwd\":[],\"bwd\":[],\"source\":\"m\"}",
       "x.json: attention_by_span: span must be an array of 1 to 12 numbers"},
      {"[1024]", "x.json: attention_by_span must be an object {\"span\", \"fwd\", \"bwd\", \"source\"}"},
  };
  for (const auto &b : bad) {
    EXPECT_EQ(mp_stack_from_text(&ctx, SpanJson(b.table).c_str(), "x.json", &p), MP_ERR_INVALID) << b.table;
    EXPECT_STREQ(mp_errmsg(&ctx), b.msg);
  }
  EXPECT_EQ(mp_stack_from_text(&ctx,
                               SpanJson("{\"span\":[1024],\"fwd\":[0.4],\"bwd\":[0.5],\"sustained\":0,\"source\":\"m\"}")
                                   .c_str(),
                               "x.json", &p),
            MP_ERR_INVALID);
}

}  // namespace
