// The ring's per-step gradient accumulation in backward (exec/schedule_cp.c,
// grads_accumulate), derived by hand from PyTorch's _templated_ring_attention_backward
// (torch/distributed/tensor/experimental/_attention.py, PyTorch 2.5-2.6 as torchtitan
// 9dec370 ran it; _cp_options.convert_to_f32 True by default):
//
//   grad_query = torch.zeros_like(query, dtype=torch.float32)   (and grad_key, grad_value)
//   for i in range(size):
//       grad_query_, grad_key_, grad_value_ = flash backward of step i      (bf16)
//       i == 0: grad_key += grad_key_; grad_value += grad_value_
//       i > 0:  grad_key, grad_value = the fp32 ones that arrived; += this step's
//               (_partial_update on the first key chunk when i <= rank)
//       send cat(grad_key, grad_value) to the next rank
//       i <= rank: grad_query += grad_query_
//       else:      grad_query = _partial_update(grad_query, grad_query_, idx=1, add=True)
//
// Bytes per element: the zeroed fp32 accumulator taking a bf16 step gradient writes 4 and
// reads 2 (6); adding a bf16 step gradient into an fp32 accumulator reads 4 + 2 and writes
// 4 (10; _partial_update adds into one chunk and cats both back, writing the whole tensor:
// the same bytes within the chunk's half of the bf16 read); the dK, dV that arrived take
// 12 (as the ring prices them for every stack: the arrived fp32 read, the sum written, the
// step's read).
//
// Fixture: llama3.1-8b (32 heads of 128, 8 kv heads) on dp_shard=2 x cp=4, seq 8192: a rank
// holds T = 2048 tokens; dQ is T x 4096 wide; torchtitan's repeat_kv makes dK and dV T x
// 4096 each (kw = vw = 4096), 8 kv heads of 128 (1024) before it.
#include <gtest/gtest.h>

#include <vector>

#include "built.h"

using namespace sched_test;

namespace {

constexpr double kT = 2048, kQ = 4096, kKw = 4096, kVw = 4096, kKv = 1024;

// Layer 5's backward element-wise attention ops (the accumulations and the final cast), in
// issue order; ring steps carry n > 0 (the keys), element-wise ops n = 0.
std::vector<const mp_op *> BackwardElementwise(const mp_schedule *s) {
  std::vector<const mp_op *> v;
  for (const Inst &x : Expand(s))
    if (x.layer == 5 && x.op->phase == MP_PHASE_BACKWARD && x.op->type == MP_OP_COMPUTE &&
        x.op->kernel == MP_KERNEL_ATTENTION && x.op->n == 0)
      v.push_back(x.op);
  return v;
}

}  // namespace

TEST(CpRing, TorchRingAccumulatesDqInFp32AfterEveryStep) {
  Built b;
  Opts o;
  o.mesh = "dp_shard=2,cp=4";
  Build(&b, o);
  const std::vector<const mp_op *> v = BackwardElementwise(b.s);
  ASSERT_EQ(v.size(), 4u + 1u) << "one accumulation a step, then the cast";
  // step 0: the zeroed fp32 dQ, dK, dV take the step's bf16 gradients
  EXPECT_EQ(v[0]->m, (int64_t)(kT * (kQ + kKw + kVw)));
  EXPECT_DOUBLE_EQ(v[0]->bytes, 6.0 * kT * (kQ + kKw + kVw));  // 301,989,888
  // steps 1-3: dQ += the step's (10 bytes), the arrived dK, dV + the step's (12)
  for (int i = 1; i < 4; i++) {
    EXPECT_EQ(v[i]->m, (int64_t)(kT * (kQ + kKw + kVw))) << i;
    EXPECT_DOUBLE_EQ(v[i]->bytes, 10.0 * kT * kQ + 12.0 * kT * (kKw + kVw)) << i;  // 285,212,672
  }
  // after the ring: dQ, dK, dV cast to bf16 (4 + 2) and repeat_kv's backward summing each
  // group of 4 heads into the kv heads (the expanded read, the grouped written, bf16)
  EXPECT_DOUBLE_EQ(v[4]->bytes, 6.0 * kT * (kQ + kKw + kVw) + 2.0 * kT * (kKw + kVw + 2 * kKv));
  // the fp32 accumulators the ring holds: dQ, dK, dV
  int64_t temp = 0;
  for (const Inst &x : Expand(b.s))
    if (x.layer == 5 && x.op->phase == MP_PHASE_BACKWARD && x.op->type == MP_OP_ALLOC &&
        x.op->mem_cat == MP_MEM_TEMP && x.op->mem_bytes == (int64_t)(4 * kT * (kQ + kKw + kVw)))
      temp++;
  EXPECT_EQ(temp, 1);
}

TEST(CpRing, CompactFoldedRoundsKeepTheAccumulatedBytes) {
  // cp = 8 folds steps 2..6 into one op of count 5 (ring_rounds): the same bytes as the
  // expanded ring, 6 T (q + kw + vw) + 7 x (10 T q + 12 T (kw + vw)) a layer. T = 8192 / 8.
  const double T = 1024;
  double sum[2] = {0, 0};
  for (int compact = 0; compact <= 1; compact++) {
    Built b;
    Opts o;
    o.mesh = "cp=8";
    o.mode = compact ? MP_SCHEDULE_COMPACT : MP_SCHEDULE_EXPANDED;
    Build(&b, o);
    const std::vector<const mp_op *> v = BackwardElementwise(b.s);
    for (size_t i = 0; i + 1 < v.size(); i++) sum[compact] += (v[i]->count > 1 ? v[i]->count : 1) * v[i]->bytes;
  }
  const double want = 6.0 * T * (kQ + kKw + kVw) + 7.0 * (10.0 * T * kQ + 12.0 * T * (kKw + kVw));
  EXPECT_DOUBLE_EQ(sum[0], want);
  EXPECT_DOUBLE_EQ(sum[1], want);
}

TEST(CpRing, TransformerEngineRingKeepsItsAccumulation) {
  // Megatron-LM's ring (Transformer Engine's p2p, grouped K and V of 8 kv heads, no
  // repeat_kv) on dp_replicate=2 x cp=4: after steps 1-3 the dK, dV that arrived plus the
  // step's, 12 T (1024 + 1024) bytes, nothing at step 0, and the final cast of dQ, dK, dV
  // (no repeat_kv backward): the fp32 dQ accumulation is PyTorch's ring's alone.
  Built b;
  Opts o;
  o.mesh = "dp_replicate=2,cp=4";
  o.mem_model = MP_MEM_MODEL_MEGATRON;
  o.cp_rotate = MP_CP_ROTATE_ALLTOALL;
  Build(&b, o);
  const std::vector<const mp_op *> v = BackwardElementwise(b.s);
  ASSERT_EQ(v.size(), 3u + 1u);
  for (int i = 0; i < 3; i++) {
    EXPECT_EQ(v[i]->m, (int64_t)(kT * 2 * kKv)) << i;
    EXPECT_DOUBLE_EQ(v[i]->bytes, 12.0 * kT * 2 * kKv) << i;
  }
  EXPECT_DOUBLE_EQ(v[3]->bytes, 6.0 * kT * (kQ + 2 * kKv));
}
