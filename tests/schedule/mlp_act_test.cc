// A non-gated MLP of the llama family in the step schedule (Nemotron-4, arXiv 2402.16819
// sec. 2: squared ReLU on up's output, no gate; LayerNorms): the ops one block runs, their
// FLOPs and bytes, and the activations it saves under Megatron-LM's memory model, by hand.
#include <gtest/gtest.h>

#include "exec/plan.h"
#include "exec/schedule.h"
#include "tests/schedule/built.h"

namespace {

using namespace sched_test;

// nemotron4-15b (H 6144, 48 heads of 128, 8 KV heads, d_ff 24576) at tp=8 with sequence
// parallelism, micro-batch 1, seq 4096: T = 4096 tokens, the rank's d_ff 3072. Block 3's
// forward runs up [T, 3072] x [3072, 6144]^T (2 x 4096 x 3072 x 6144 = 154,618,822,656
// FLOPs), no gate, and one squared ReLU over T x 3072 = 12,582,912 elements: 2 FLOPs each
// (a max and a multiply), 2 bytes read and 2 written; its backward 3 FLOPs each (a max,
// two multiplies), reading the input and the output gradient and writing the input gradient.
TEST(MlpAct, SquaredReluIsOneElementwiseOpWithoutGate) {
  Built b;
  Opts o = Megatron("tp=8");
  o.model = "nemotron4-15b";
  Build(&b, o);
  const int64_t e = 4096LL * 3072;
  int up = 0, gate = 0, act_fwd = 0, act_bwd = 0;
  for (const Inst &x : Expand(b.s)) {
    if (x.layer != 3 || x.op->type != MP_OP_COMPUTE) continue;
    gate += x.op->module == MP_MOD_GATE;
    if (x.op->kernel == MP_KERNEL_GEMM && x.op->module == MP_MOD_UP && x.op->variant == MP_VAR_FWD) {
      up++;
      EXPECT_DOUBLE_EQ(x.op->flops, 2.0 * 4096 * 3072 * 6144);
    }
    if (x.op->kernel != MP_KERNEL_ACTIVATION || x.op->module != MP_MOD_UP) continue;
    if (x.op->variant == MP_VAR_FWD) {
      act_fwd++;
      EXPECT_EQ(x.op->m, e);
      EXPECT_DOUBLE_EQ(x.op->flops, 2.0 * (double)e);
      EXPECT_DOUBLE_EQ(x.op->bytes, 4.0 * (double)e);
    } else {
      act_bwd++;
      EXPECT_DOUBLE_EQ(x.op->flops, 3.0 * (double)e);
      EXPECT_DOUBLE_EQ(x.op->bytes, 6.0 * (double)e);
    }
  }
  EXPECT_EQ(gate, 0);
  EXPECT_EQ(up, 1);
  EXPECT_EQ(act_fwd, 1);
  EXPECT_EQ(act_bwd, 1);
}

// What block 3 saves, Megatron-LM's list (schedule_act.c, block_act_mg), tp=8 with SP,
// flash attention, no AC, T = 4096, Ts = 512, H = 6144; per rank q 768, kv 128 features,
// 6 heads, d_ff 3072; LayerNorm statistics (mean and rstd, fp32) 8 bytes a token:
//   block input        2 Ts H                                   =  6,291,456
//   attention  norm stats 8 Ts 4,096; q/k/v input 2 Ts H 6,291,456; q, k 2T(768 + 128)
//              7,340,032; v 2T x 128 1,048,576; log-sum-exp 4 T x 6 98,304; o's input
//              2T x 768 6,291,456                                  = 21,073,920
//   MLP        norm input 2 Ts H 6,291,456; stats 4,096; up's input 2 Ts H 6,291,456;
//              up's output (the squared ReLU's input) and down's input 2 x 2T x 3072
//              50,331,648                                          = 62,918,656
//   total 90,284,032. SwiGLU's MLP of the same d_ff would save gate, up, silu(gate) and the
//   product, 4 x 2T x 3072: 50,331,648 more; RMSNorms 4 bytes a token less each.
TEST(MlpAct, SquaredReluSavesUpAndDownInputs) {
  Built b;
  Opts o = Megatron("tp=8");
  o.model = "nemotron4-15b";
  Build(&b, o);
  EXPECT_EQ(SavedByBlock(b.s, 3), 90284032);
}

}  // namespace
