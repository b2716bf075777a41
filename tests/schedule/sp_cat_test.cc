// The copies around torchtitan's sequence-parallel collectives (exec/schedule_ops.c, sp_cat,
// fused_shard_copy, fused_partials_sum), derived by hand from the source:
//
// torchtitan's TP plan (models/llama3/parallelize_llama.py at 820504e, the torchtitan of its
// June 2025 AsyncTP benchmark) shards the [batch, seq, H] residual stream as Shard(1):
// PrepareModuleInput(Shard(1) -> Replicate) before attention and feed_forward, and
// RowwiseParallel(output_layouts=Shard(1)) on wo and w2. DTensor redistributes through
// torch/distributed/_functional_collectives.py, whose NCCL calls work on dim 0:
//   all_gather_tensor(x, gather_dim=1):  out = all_gather(x); cat(chunk(out, tp), dim=1)
//   reduce_scatter_tensor(x, scatter_dim=1):  reduce_scatter(cat(chunk(x, tp, dim=1)))
// So every Shard(1) collective has a copy of the whole gathered (or to-be-scattered) [T, H]
// tensor: read and written, 2 x element size x T x H bytes. Per block, unfused:
//   forward   attention in (all-gather, cat after), wo out (cat, reduce-scatter),
//             feed_forward in, w2 out: 4 copies;
//   backward  wo's and w2's output gradient (Shard(1) -> Replicate: all-gather, cat after);
//             the regions' input gradients (Partial -> Shard(1): reduce-scatter) have none:
//             Inductor writes the sum of the input-gradient GEMMs in the concatenated order.
// Under torchao's float8 TP the gathered input and output gradient are float8: 1 byte.
// AsyncTP (torch/distributed/_symmetric_memory/__init__.py) takes the chunk + cat into its
// fused ops; each fused all-gather copies the rank's shard into its symmetric buffer first
// (2 x e x T/tp x H), each fused reduce-scatter sums the tp partials after its chunks
// (T x H read, T/tp x H written, 2 bytes each), and with more than one sequence the fused
// all-gather's sequence-major output is copied for the bf16 weight gradients (4 T H each,
// the region's input and its output gradient).
//
// Fixture: llama3.1-8b (H = 4096) on dp_shard=2 x tp=8, micro-batch 2 of 1,024 tokens:
// T = 2,048 tokens, n = T H = 8,388,608 elements, the shard T/tp x H = n / 8.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "built.h"

using namespace sched_test;

namespace {

constexpr double kN = 2048.0 * 4096.0;

// Layer 0's TP-region events in `phase`, in issue order: the TP all-gathers and
// reduce-scatters ("AG", "RS"), the copies ("cp") and the fused reduce-scatters' sums
// ("sum") of the region Linears, each with its module and bytes.
struct Ev {
  std::string what;
  int module;
  double bytes;
};

bool Region(int m) { return m == MP_MOD_Q || m == MP_MOD_O || m == MP_MOD_UP || m == MP_MOD_DOWN; }

bool Head(int m) { return m == MP_MOD_TOK_EMBEDDINGS || m == MP_MOD_OUTPUT; }

// head: the embedding's and the output Linear's events instead (outside the blocks)
std::vector<Ev> Events(const mp_schedule *s, mp_phase phase, bool head = false) {
  std::vector<Ev> v;
  for (const Inst &x : Expand(s)) {
    const mp_op *op = x.op;
    if (op->phase != phase || (head ? !Head(op->module) : x.layer != 0 || !Region(op->module))) continue;
    if (op->type == MP_OP_COMM && op->group == MP_GROUP_TP && op->coll == MP_COLL_ALL_GATHER)
      v.push_back({"AG", op->module, op->bytes});
    else if (op->type == MP_OP_COMM && op->group == MP_GROUP_TP && op->coll == MP_COLL_REDUCE_SCATTER)
      v.push_back({"RS", op->module, op->bytes});
    else if (op->type == MP_OP_COMPUTE && op->kernel == MP_KERNEL_COPY)
      v.push_back({"cp", op->module, op->bytes});
    else if (op->type == MP_OP_COMPUTE && op->kernel == MP_KERNEL_RESIDUAL)
      v.push_back({"sum", op->module, op->bytes});
  }
  return v;
}

void ExpectEvents(const std::vector<Ev> &got, const std::vector<Ev> &want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); i++) {
    EXPECT_EQ(got[i].what, want[i].what) << "event " << i;
    EXPECT_EQ(got[i].module, want[i].module) << "event " << i;
    EXPECT_DOUBLE_EQ(got[i].bytes, want[i].bytes) << "event " << i;
  }
}

Opts Torchtitan(int64_t micro_batch, int64_t seq) {
  Opts o;
  o.mesh = "dp_shard=2,tp=8";
  o.micro_batch = micro_batch;
  o.seq = seq;
  return o;
}

// An unfused block whose regions gather e bytes an element (bf16 2, float8 1): forward, the
// gathers move e n and their cats read and write e n each (2 e n); wo's and w2's bf16
// outputs cat (4n) before their reduce-scatters (2n).
std::vector<Ev> UnfusedForward(double e) {
  return {{"AG", MP_MOD_Q, e * kN},     {"cp", MP_MOD_Q, 2 * e * kN},  {"cp", MP_MOD_O, 4 * kN},
          {"RS", MP_MOD_O, 2 * kN},     {"AG", MP_MOD_UP, e * kN},     {"cp", MP_MOD_UP, 2 * e * kN},
          {"cp", MP_MOD_DOWN, 4 * kN},  {"RS", MP_MOD_DOWN, 2 * kN}};
}

// Backward: the output gradients' gathers (e n) with their cats (2 e n); the input
// gradients' reduce-scatters (2n) without one (their sum writes the concatenated order).
std::vector<Ev> UnfusedBackward(double e) {
  return {{"AG", MP_MOD_DOWN, e * kN}, {"cp", MP_MOD_DOWN, 2 * e * kN}, {"RS", MP_MOD_UP, 2 * kN},
          {"AG", MP_MOD_O, e * kN},    {"cp", MP_MOD_O, 2 * e * kN},    {"RS", MP_MOD_Q, 2 * kN}};
}

}  // namespace

TEST(SpCat, EachUnfusedCollectiveOfABlockHasItsCatCopy) {
  Built b;
  Build(&b, Torchtitan(2, 1024));
  ExpectEvents(Events(b.s, MP_PHASE_FORWARD), UnfusedForward(2));
  ExpectEvents(Events(b.s, MP_PHASE_BACKWARD), UnfusedBackward(2));
}

TEST(SpCat, Float8GathersCatOneByteAnElement) {
  // torchao's float8 TP gathers the input cast to E4M3 and the output gradient cast to E5M2
  // on the shard; wo's and w2's outputs stay bf16
  Built b;
  Opts o = Torchtitan(2, 1024);
  o.fp8 = 1;
  Build(&b, o);
  ExpectEvents(Events(b.s, MP_PHASE_FORWARD), UnfusedForward(1));
  ExpectEvents(Events(b.s, MP_PHASE_BACKWARD), UnfusedBackward(1));
}

TEST(SpCat, SelectiveOpRecomputesTheGathersWithTheirCats) {
  Built b;
  Opts o = Torchtitan(2, 1024);
  o.ac = MP_AC_SELECTIVE_OP;
  Build(&b, o);
  // torchtitan's _save_list keeps the reduce-scatters' outputs, not the all-gathers'
  ExpectEvents(Events(b.s, MP_PHASE_RECOMPUTE), {{"AG", MP_MOD_Q, 2 * kN},
                                                 {"cp", MP_MOD_Q, 4 * kN},
                                                 {"AG", MP_MOD_UP, 2 * kN},
                                                 {"cp", MP_MOD_UP, 4 * kN}});
}

TEST(SpCat, AsyncTpFusedOpsCopyTheShardAndSumThePartials) {
  Built b;
  Opts o = Torchtitan(2, 1024);
  o.async_tp = 1;
  Build(&b, o);
  // the shard into the symmetric buffer (2 x 2 x n / 8), no cat; the partials' sum reads
  // n and writes n / 8, 2 bytes each
  ExpectEvents(Events(b.s, MP_PHASE_FORWARD), {{"cp", MP_MOD_Q, kN / 2},
                                               {"AG", MP_MOD_Q, 2 * kN},
                                               {"RS", MP_MOD_O, 2 * kN},
                                               {"sum", MP_MOD_O, 2 * (kN + kN / 8)},
                                               {"cp", MP_MOD_UP, kN / 2},
                                               {"AG", MP_MOD_UP, 2 * kN},
                                               {"RS", MP_MOD_DOWN, 2 * kN},
                                               {"sum", MP_MOD_DOWN, 2 * (kN + kN / 8)}});
  // two sequences: the sequence-major gathered gradient and the region's gathered input
  // copied for the weight gradients (4n each); the input gradients' reduce-scatters unfused
  ExpectEvents(Events(b.s, MP_PHASE_BACKWARD), {{"cp", MP_MOD_DOWN, kN / 2},
                                                {"AG", MP_MOD_DOWN, 2 * kN},
                                                {"cp", MP_MOD_DOWN, 4 * kN},
                                                {"cp", MP_MOD_UP, 4 * kN},
                                                {"RS", MP_MOD_UP, 2 * kN},
                                                {"cp", MP_MOD_O, kN / 2},
                                                {"AG", MP_MOD_O, 2 * kN},
                                                {"cp", MP_MOD_O, 4 * kN},
                                                {"cp", MP_MOD_Q, 4 * kN},
                                                {"RS", MP_MOD_Q, 2 * kN}});
}

TEST(SpCat, AsyncTpOneSequenceGathersInTokenOrder) {
  Built b;
  Opts o = Torchtitan(1, 2048);  // the same T, one sequence: movedim over batch 1 is a view
  o.async_tp = 1;
  Build(&b, o);
  ExpectEvents(Events(b.s, MP_PHASE_BACKWARD), {{"cp", MP_MOD_DOWN, kN / 2},
                                                {"AG", MP_MOD_DOWN, 2 * kN},
                                                {"RS", MP_MOD_UP, 2 * kN},
                                                {"cp", MP_MOD_O, kN / 2},
                                                {"AG", MP_MOD_O, 2 * kN},
                                                {"RS", MP_MOD_Q, 2 * kN}});
}

TEST(SpCat, MegatronGathersTheSequenceDimZeroWithoutCopies) {
  // Megatron-LM's activations are [seq, batch, H]: its SP gathers and scatters dim 0
  Built b;
  Opts o = Megatron("dp_replicate=2,tp=8");
  o.micro_batch = 2;
  Build(&b, o);
  for (mp_phase ph : {MP_PHASE_FORWARD, MP_PHASE_BACKWARD}) {
    const std::vector<Ev> v = Events(b.s, ph);
    // two gathers and two reduce-scatters a pass (and backward's re-gathers of the inputs)
    ASSERT_GE(v.size(), 4u);
    for (const Ev &e : v) EXPECT_NE(e.what, "cp") << "module " << e.module;
  }
}

TEST(SpCat, TheEagerHeadCopiesAroundEachCollective) {
  // tok_embeddings (RowwiseParallel, output Shard(1)) and output (ColwiseParallel, input
  // Shard(1)) run eagerly: the embedding's reduce-scatter and the output's input-gradient
  // reduce-scatter copy their inputs as well
  Built b;
  Build(&b, Torchtitan(2, 1024));
  ExpectEvents(Events(b.s, MP_PHASE_FORWARD, true), {{"cp", MP_MOD_TOK_EMBEDDINGS, 4 * kN},
                                                     {"RS", MP_MOD_TOK_EMBEDDINGS, 2 * kN},
                                                     {"AG", MP_MOD_OUTPUT, 2 * kN},
                                                     {"cp", MP_MOD_OUTPUT, 4 * kN}});
  ExpectEvents(Events(b.s, MP_PHASE_BACKWARD, true), {{"cp", MP_MOD_OUTPUT, 4 * kN},
                                                      {"RS", MP_MOD_OUTPUT, 2 * kN},
                                                      {"AG", MP_MOD_TOK_EMBEDDINGS, 2 * kN},
                                                      {"cp", MP_MOD_TOK_EMBEDDINGS, 4 * kN}});
}
