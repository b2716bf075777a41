// The meshplan runtime's activation bytes per block, derived by hand from what each tensor
// holds, against the schedule's meshplan-cpu memory events. The events are sized by the
// activation layout (exec/act_layout.h) that the runtime carves its buffers by, and the
// runtime's tracked allocator equals the events byte for byte (schedule_memory_test on one
// rank, parity_matrix.py on every plan of the matrix); so this test is the independent end
// of that chain: were a row of the layout wrong, prediction and measurement would still
// agree with each other, but not with the figures below.
//
// The rules the figures follow (fp32 on the CPU: 4 bytes an element; every tensor of a
// carved allocation rounded up to 64 bytes; N = micro-batch x seq / cp tokens on the rank,
// NS = N / tp rows of the residual stream under sequence parallelism, else N):
//   a block's saved tensors (BLOCK): the norms' outputs xn1, xn2 [N, C] (all-gathered under
//     SP: the colwise Linears' input), their rstds [NS], q [N, heads/tp x hd], k and v
//     [N, kv_heads/tp x hd], the attention's residual output xmid [NS, C] (the sequence
//     shard under SP), and the SwiGLU's gate, up and hidden [N, d_ff/tp];
//   the attention core (CORE): its output [N, heads/tp x hd] and log-sum-exp [B, heads/tp, S];
//   a residual-stream tensor x[l + 1] [NS, C];
//   the backward workspace (WS): dxn [N, C], datt, dq, dqp [N, heads/tp x hd], dk, dv, dkp
//     [N, kv_heads/tp x hd], dh, dg, du [N, d_ff/tp], and under SP dxs [NS, C];
//   under SP the boundary collectives' [N, C] side (SP_FULL); under cp the ring's forward
//     state (fp32 accumulator [N, heads x hd], the K, V held and arriving, 2 x [N, kv x hd] each).
// Seq 32, micro-batch 2, AC none.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "tests/schedule/built.h"

namespace {

using sched_test::Built;
using sched_test::Expand;
using sched_test::Inst;
using sched_test::Opts;

// The sizes of the ALLOCs of `cat` in block 0's `phase`, sorted.
std::vector<int64_t> Allocs(const mp_schedule *s, mp_phase phase, mp_mem_cat cat) {
  std::vector<int64_t> v;
  for (const Inst &x : Expand(s))
    if (x.layer == 0 && x.op->phase == phase && x.op->type == MP_OP_ALLOC && x.op->mem_cat == cat)
      v.push_back(x.op->mem_bytes);
  std::sort(v.begin(), v.end());
  return v;
}

bool Has(const std::vector<int64_t> &v, int64_t bytes) { return std::find(v.begin(), v.end(), bytes) != v.end(); }

Opts Cpu(const char *model, const char *mesh, int64_t global_batch) {
  Opts o;
  o.model = model;
  o.mesh = mesh;
  o.mem_model = MP_MEM_MODEL_MESHPLAN_CPU;
  o.seq = 32;
  o.micro_batch = 2;
  o.global_batch = global_batch;
  return o;
}

// tiny-dense (d_model 64, 8 heads and 4 KV heads of 8, d_ff 192) on tp=2 with SP: N = 64,
// NS = 32; per rank 4 heads (q 32 wide), 2 KV heads (16 wide), d_ff 96.
//   BLOCK: xn1 64x64 = 16384 B, rstd1 32 -> 128, q 64x32 = 8192, k, v 64x16 = 4096 each,
//          xmid 32x64 = 8192, xn2 16384, rstd2 128, g, u, h 64x96 = 24576 each:
//          16384 + 128 + 8192 + 4096 + 4096 + 8192 + 16384 + 128 + 73728 = 131328
//   CORE:  att 64x32 = 8192, lse 2x4x32 = 1024: 9216
//   x:     32x64 = 8192
//   SP_FULL: 64x64 = 16384 (TEMP)
//   WS:    dxn 16384, datt, dq, dqp 8192 each, dk, dv, dkp 4096 each, dh, dg, du 24576
//          each, dxs 32x64 = 8192: 16384 + 24576 + 12288 + 73728 + 8192 = 135168 (TEMP)
TEST(RuntimeLayout, TensorParallelWithSequenceParallelism) {
  Built b;
  sched_test::Build(&b, Cpu("tiny-dense", "tp=2", 2));
  ASSERT_NE(b.s, nullptr);
  EXPECT_EQ(Allocs(b.s, MP_PHASE_FORWARD, MP_MEM_ACTIVATIONS), (std::vector<int64_t>{8192, 9216, 131328}));
  EXPECT_TRUE(Has(Allocs(b.s, MP_PHASE_FORWARD, MP_MEM_TEMP), 16384));
  EXPECT_TRUE(Has(Allocs(b.s, MP_PHASE_BACKWARD, MP_MEM_TEMP), 135168));
}

// Without SP (the all-reduce form) the residual stream keeps all N = 64 rows:
//   BLOCK: the same but rstd1, rstd2 64 -> 256 each and xmid 64x64 = 16384:
//          131328 + 2 x 128 + 8192 = 139776
//   x: 64x64 = 16384; WS without dxs: 126976
TEST(RuntimeLayout, TensorParallelWithoutSequenceParallelism) {
  Built b;
  Opts o = Cpu("tiny-dense", "tp=2", 2);
  o.sp = 0;
  sched_test::Build(&b, o);
  ASSERT_NE(b.s, nullptr);
  EXPECT_EQ(Allocs(b.s, MP_PHASE_FORWARD, MP_MEM_ACTIVATIONS), (std::vector<int64_t>{9216, 16384, 139776}));
  EXPECT_TRUE(Has(Allocs(b.s, MP_PHASE_BACKWARD, MP_MEM_TEMP), 126976));
}

// tiny-odd (d_model 48, 6 heads and 3 KV heads of 8, d_ff 136) on cp=2: seq 32 over 2 ranks,
// S = 16, N = NS = 32; q 48 wide, k and v 24.
//   BLOCK: xn1 32x48 = 6144, rstd1 32 -> 128, q 6144, k, v 32x24 = 3072 each, xmid 6144,
//          xn2 6144, rstd2 128, g, u, h 32x136 = 17408 each:
//          6144 + 128 + 6144 + 3072 + 3072 + 6144 + 6144 + 128 + 52224 = 83200
//   CORE:  att 6144, lse 2x6x16 = 768: 6912
//   x:     32x48 = 6144
//   CP_FWD: the fp32 accumulator 32x48 = 6144, K and V held and arriving 2 x 32x24 = 6144
//          each: 18432 (TEMP)
TEST(RuntimeLayout, ContextParallel) {
  Built b;
  sched_test::Build(&b, Cpu("tiny-odd", "cp=2", 2));
  ASSERT_NE(b.s, nullptr);
  EXPECT_EQ(Allocs(b.s, MP_PHASE_FORWARD, MP_MEM_ACTIVATIONS), (std::vector<int64_t>{6144, 6912, 83200}));
  EXPECT_TRUE(Has(Allocs(b.s, MP_PHASE_FORWARD, MP_MEM_TEMP), 18432));
}

// tiny-odd on dp_shard=3 (a global batch of 6: one micro-batch of 2 a rank): N = NS = 64.
//   BLOCK: xn1 64x48 = 12288, rstd1 256, q 12288, k, v 6144 each, xmid 12288, xn2 12288,
//          rstd2 256, g, u, h 64x136 = 34816 each: 166400
//   CORE:  att 12288, lse 2x6x32 = 1536: 13824; x: 12288
// and the block's FSDP unit gathered: one 64-byte-aligned slot of 3 padded shards a parameter
// (the shards: plan_test's PlanTinyOdd): q, o 3 x 768 x 4 = 9216 each, k, v 4608 each, gate,
// up 3 x 2208 x 4 = 26496 each, down 3 x 2176 x 4 = 26112, the norms 3 x 16 x 4 = 192 each:
// 18432 + 9216 + 52992 + 26112 + 384 = 107136.
TEST(RuntimeLayout, ShardedDataParallelOnUnevenSizes) {
  Built b;
  sched_test::Build(&b, Cpu("tiny-odd", "dp_shard=3", 6));
  ASSERT_NE(b.s, nullptr);
  EXPECT_EQ(Allocs(b.s, MP_PHASE_FORWARD, MP_MEM_ACTIVATIONS), (std::vector<int64_t>{12288, 13824, 166400}));
  bool gathered = false;
  for (int c = 0; c < MP_MEM_COUNT; c++) gathered |= Has(Allocs(b.s, MP_PHASE_FORWARD, (mp_mem_cat)c), 107136);
  EXPECT_TRUE(gathered) << "no allocation of the gathered unit (107136 bytes) in block 0's forward";
}

// tiny-moe (d_model 64, 8 experts of d_ff_expert 32, top_k 2) on dp_shard=2 x tp=2 x ep=2:
// each tp rank routes its sequence shard, NR = 64 / 2 = 32 tokens, so it sends (and, routing
// balanced, receives) R = 32 x 2 = 64 rows. With etp=1 each expert is whole on a rank:
//   EPA (the expert side, ACTIVATIONS): xr 64x64 = 16384, gate, up, hidden 64x32 = 8192
//          each: 40960
//   EP_OUT (the outputs before the combine, COMM): 64x64 = 16384
// With etp=2 (exec/runtime/runtime_etp.c) the expert-TP group of 2 all-gathers its ranks'
// received rows, R = 2 x 64 = 128, and each rank holds half of an expert's width, 16:
//   EPA: xr 128x64 = 32768, gate, up, hidden 128x16 = 8192 each: 57344
//   EP_OUT: the 128 rows' partial sums and one rank's block of 64 rows that the
//          reduce-scatter receives: (128 + 64) x 64 x 4 = 49152
TEST(RuntimeLayout, ExpertTensorParallelGathersTheGroupsRows) {
  Built one, two;
  sched_test::Build(&one, Cpu("tiny-moe", "dp_shard=2,tp=2,ep=2,etp=1", 4));
  sched_test::Build(&two, Cpu("tiny-moe", "dp_shard=2,tp=2,ep=2,etp=2", 4));
  ASSERT_NE(one.s, nullptr);
  ASSERT_NE(two.s, nullptr);
  EXPECT_TRUE(Has(Allocs(one.s, MP_PHASE_FORWARD, MP_MEM_ACTIVATIONS), 40960));
  EXPECT_TRUE(Has(Allocs(one.s, MP_PHASE_FORWARD, MP_MEM_COMM), 16384));
  EXPECT_TRUE(Has(Allocs(two.s, MP_PHASE_FORWARD, MP_MEM_ACTIVATIONS), 57344));
  EXPECT_TRUE(Has(Allocs(two.s, MP_PHASE_FORWARD, MP_MEM_COMM), 49152));
}

}  // namespace
