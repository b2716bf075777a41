// FSDP2's copies on the compute stream, by hand. torch/distributed/fsdp/_fully_shard/
// _fsdp_collectives.py (torch main at 010ae4a8; _composable/fsdp/ in torch 2.4-2.5):
//   - foreach_all_gather gathers a unit's parameters into one flat buffer on the all-gather
//     stream; wait_for_unshard, on the current (compute) stream at the unit's first use,
//     runs foreach_all_gather_copy_out: the current stream waits for the gather, then one
//     split_with_sizes_copy reads the flat buffer and writes every parameter's own tensor,
//     2 x the gathered bytes of HBM traffic;
//   - foreach_reduce's copy-in chunk-cats the unit's unsharded gradients (param dtype) into
//     the reduce-scatter input (reduce dtype, the widening cast in the same kernel) on the
//     current stream before the reduce-scatter stream waits for it (torch 2.5 on; torch 2.4
//     ran it on the reduce-scatter stream with the current stream waiting for it): the
//     gradients' bytes read plus the input's written.
// FSDP1's flat parameter (fsdp.flat_params) is the gather's output: no copy-out. Its
// gradient is the flat parameter's: torch v2.2.0 _flat_param.py's _use_unsharded_views hands
// the forward each parameter as a torch.split view of it, so autograd's split_with_sizes
// backward cats the unit's gradients into it (FunctionsManual.cpp, split_with_sizes_backward)
// on the compute stream, in the param dtype whatever the reduce dtype.
#include <gtest/gtest.h>

#include <map>

#include "tests/schedule/built.h"

namespace {

using sched_test::Build;
using sched_test::Built;
using sched_test::Expand;
using sched_test::Inst;
using sched_test::Opts;

// Llama 2 7B (data/models/llama2-7b.json): a block's parameters 4 x 4096^2 + 3 x 11008 x
// 4096 + 2 x 4096 = 202,383,360 elements; the root unit's (embedding, head, final norm)
// 2 x 32000 x 4096 + 4096 = 262,148,096. Every dim 0 divides by 8: no shard padded.
const int64_t kBlock = 202383360LL, kRoot = 262148096LL;

Opts Fsdp2() {
  Opts o;
  o.model = "llama2-7b";
  o.mesh = "dp_shard=8";
  o.seq = 4096;
  return o;
}

struct Copies {
  std::map<int64_t, int> out_bytes, in_bytes;  // bytes -> count
  int out_fwd = 0, out_bwd = 0;
  int out_after_gather = 0, rs_after_in = 0;
};

Copies Count(const Built &b) {
  Copies c;
  const std::vector<Inst> v = Expand(b.s);
  std::map<int64_t, const Inst *> at;
  for (const Inst &x : v) at[x.index] = &x;
  for (const Inst &x : v) {
    const mp_op *op = x.op;
    if (op->type == MP_OP_COMPUTE && op->kernel == MP_KERNEL_COPY && op->unit >= 0) {
      EXPECT_EQ(op->stream, MP_STREAM_COMPUTE);
      if (op->variant == MP_VAR_FWD) {
        c.out_bytes[(int64_t)op->bytes]++;
        (op->phase == MP_PHASE_FORWARD ? c.out_fwd : c.out_bwd)++;
        for (int64_t d : x.deps)
          if (at[d]->op->type == MP_OP_COMM && at[d]->op->coll == MP_COLL_ALL_GATHER && at[d]->unit == x.unit)
            c.out_after_gather++;
      } else {
        c.in_bytes[(int64_t)op->bytes]++;
      }
    }
    if (op->type == MP_OP_COMM && op->coll == MP_COLL_REDUCE_SCATTER)
      for (int64_t d : x.deps)
        if (at[d]->op->kernel == MP_KERNEL_COPY && at[d]->op->type == MP_OP_COMPUTE && at[d]->unit == x.unit)
          c.rs_after_in++;
  }
  return c;
}

// Resharded after forward, each of the 32 blocks is gathered twice a step (forward and
// backward) and copied out after each gather: 64 copies of 2 x 2 x 202,383,360 =
// 809,533,440 bytes; the root once, 2 x 2 x 262,148,096 = 1,048,592,384 bytes. Each waits
// for its unit's all-gather.
TEST(Fsdp2Copies, CopyOutReadsAndWritesEveryGather) {
  Built b;
  Build(&b, Fsdp2());
  const Copies c = Count(b);
  EXPECT_EQ(c.out_bytes.size(), 2u);
  EXPECT_EQ(c.out_bytes.at(4 * kBlock), 64);
  EXPECT_EQ(c.out_bytes.at(4 * kRoot), 1);
  EXPECT_EQ(c.out_fwd, 33);
  EXPECT_EQ(c.out_bwd, 32);
  EXPECT_EQ(c.out_after_gather, 65);
}

// Gradients in bf16 reduced in fp32 (torchtitan's MixedPrecisionPolicy): a block's copy-in
// reads 2 and writes 4 bytes an element, 6 x 202,383,360 = 1,214,300,160 bytes; the root's
// 6 x 262,148,096 = 1,572,888,576. Each unit's reduce-scatter waits for its copy-in. Reduced
// in bf16, 4 bytes an element: 809,533,440 for a block.
TEST(Fsdp2Copies, CopyInCastsEveryReduceScatterInput) {
  Built b;
  Build(&b, Fsdp2());
  Copies c = Count(b);
  EXPECT_EQ(c.in_bytes.size(), 2u);
  EXPECT_EQ(c.in_bytes.at(6 * kBlock), 32);
  EXPECT_EQ(c.in_bytes.at(6 * kRoot), 1);
  EXPECT_EQ(c.rs_after_in, 33);
  Built h;
  Opts o = Fsdp2();
  o.reduce_dtype = MP_DTYPE_BF16;
  Build(&h, o);
  c = Count(h);
  EXPECT_EQ(c.in_bytes.at(4 * kBlock), 32);
}

// FSDP1's flat parameters: no copy-out; each unit's gradients cat into its flat gradient,
// 2 bytes read and 2 written an element in bf16 whether reduced in fp32 or bf16: a block
// 4 x 202,383,360 = 809,533,440 bytes, the root 4 x 262,148,096 = 1,048,592,384, each
// before its unit's reduce-scatter.
TEST(Fsdp2Copies, FlatParametersCatTheGradientsOnly) {
  for (mp_dtype rd : {MP_DTYPE_FP32, MP_DTYPE_BF16}) {
    Built b;
    Opts o = Fsdp2();
    o.flat_params = 1;
    o.reduce_dtype = rd;
    Build(&b, o);
    const Copies c = Count(b);
    EXPECT_TRUE(c.out_bytes.empty());
    EXPECT_EQ(c.in_bytes.size(), 2u);
    EXPECT_EQ(c.in_bytes.at(4 * kBlock), 32);
    EXPECT_EQ(c.in_bytes.at(4 * kRoot), 1);
    EXPECT_EQ(c.rs_after_in, 33);
  }
}

}  // namespace
