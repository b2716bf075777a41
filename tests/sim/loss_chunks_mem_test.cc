// torchtitan's ChunkedLossWrapper (plan loss_chunks) through the simulator: llama3.1-8b on
// FSDP 8 (torchtitan-eager, H100 96 GB at 500 W), two sequences of 8192 a micro-batch,
// op-level selective AC. Unchunked the peak is in the head's backward with the eager
// cross-entropy's three fp32 [T, V] tensors, 12 T V = 25,216,155,648 bytes of logits
// (sim_plan_test's TorchtitanLlama8bFsdp8ByteForByte). In 8 chunks the head's logits at
// their most are 12 (T/8) V + 6 T H = 3,554,672,640 bytes (schedule/loss_chunks_test), so the
// peak falls outside the head and holds no logits, and it falls by at most the
// 25,216,155,648 - 3,554,672,640 bytes the head gave up. The search's memory-first stop
// reaches the same verdict, peak and step time.
#include <gtest/gtest.h>

#include "tests/sim/plan_case.h"

namespace {

void Llama8bFsdp8(PlanCase *s, int chunks) {
  ASSERT_EQ(mp_stack_load(&s->ctx, "torchtitan-eager", &s->prof), MP_OK);
  ASSERT_EQ(mp_cluster_make(&s->ctx, "h100-96gb-500w", 8, 8, &s->c), MP_OK);
  mp_stack_plan_options(&s->prof, &s->c.gpu, &s->o);
  s->o.seq = 8192;
  s->o.micro_batch = 2;
  s->o.global_batch = 16;
  s->o.ac = MP_AC_SELECTIVE_OP;
  s->o.loss_chunks = chunks;
}

TEST(LossChunksSim, PeakLeavesTheHead) {
  PlanCase one("llama3.1-8b", "h100-8", "dp_shard=8"), eight("llama3.1-8b", "h100-8", "dp_shard=8");
  ASSERT_NO_FATAL_FAILURE(Llama8bFsdp8(&one, 1));
  ASSERT_NO_FATAL_FAILURE(Llama8bFsdp8(&eight, 8));
  const mp_sim_result r1 = one.Sim(), r8 = eight.Sim();
  EXPECT_EQ(r1.mem_at_peak[MP_MEM_LOGITS], 25216155648LL);
  EXPECT_EQ(r8.mem_at_peak[MP_MEM_LOGITS], 0);
  int64_t a1 = 0, a8 = 0;
  for (int c = 0; c < MP_MEM_COUNT; c++) {
    a1 += r1.mem_at_peak[c];
    a8 += r8.mem_at_peak[c];
  }
  EXPECT_LT(a8, a1);
  EXPECT_GE(a8, a1 - (25216155648LL - 3554672640LL));
  EXPECT_LT(r8.peak_mem_bytes, r1.peak_mem_bytes);
  eight.ExpectMemoryFirstAgrees("llama3.1-8b fsdp 8, 8 loss chunks");
}

}  // namespace
