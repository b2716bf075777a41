// The step program (exec/schedule.h, mp_schedule_step_program): what the runtime executes
// for one micro-batch, read from the schedule. tiny-dense has 2 layers; with FSDP its
// units are 0 = the root (embeddings, final norm, head), 1 = layer 0, 2 = layer 1.
// Expected programs, by hand from the runtime's order (runtime_step.c, the actions):
//   - the residual stream x[0..2] is freed top down: x[2] after the head's backward, x[l]
//     after block l's backward, x[0] after the embedding's;
//   - AC selective-core drops each block's attention core after its forward and recomputes it
//     before the block's backward; full drops the core and the block and recomputes both;
//   - FSDP on 2 ranks, CPU (blocking MPI): each block gathers its own units right before
//     its forward; resharded, they are released after it and gathered again before the
//     backward; each unit's gradients are reduce-scattered after its backward (grad_end),
//     the root's after the embedding's; without resharding the gathered units stay until
//     their gradients are reduced;
//   - FSDP on 2 ranks, CUDA (NCCL overlap): block l + 1's gather goes out before block l's
//     forward (block 0's before the embedding), the top block gathers its own units again
//     for the backward and each block prefetches the next one down; each unit's
//     reduce-scatter completes when the next one goes out, the last at the end;
//   - pipeline stages (pp=2: stage 0 holds the embedding and layer 0, stage 1 layer 1 and the
//     head): stage 0 sends x[1] after its forward and receives dL/dx[1] before its
//     backward; stage 1 receives x[1] into its stage input and sends dL/dx[1] back after
//     block 1's backward, then frees x[1]; every action carries its chunk step (chunk,
//     forward or backward), the interleaved schedule's two chunks per stage in order.
#include <gtest/gtest.h>

#include <string>

#include "exec/schedule.h"

namespace {

std::string Program(const char *mesh_s, mp_ac_mode ac, int reshard, mp_mem_model mm, int rank = 0,
                    const char *model = "tiny-dense", int virt = 1, bool steps = false) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_model m;
  EXPECT_EQ(mp_model_load(&ctx, model, &m), MP_OK) << mp_errmsg(&ctx);
  mp_mesh mesh;
  EXPECT_EQ(mp_mesh_parse(&ctx, mesh_s, 0, &mesh), MP_OK) << mp_errmsg(&ctx);
  mp_plan_options o;
  mp_plan_options_init(&o);
  o.seq = 32;
  o.micro_batch = 2;
  o.global_batch = 2 * mp_mesh_group_size(&mesh, MP_GROUP_DP);
  o.ac = ac;
  o.fsdp.reshard_after_forward = reshard;
  o.mem_model = mm;
  if (virt > 1) {
    o.pp_schedule = MP_PP_INTERLEAVED;
    o.pp_virtual = virt;
    o.global_batch *= 2; /* micro-batches in groups of pp */
  }
  mp_plan *p = nullptr;
  EXPECT_EQ(mp_build_plan(&ctx, &m, &mesh, &o, &p), MP_OK) << mp_errmsg(&ctx);
  if (p == nullptr) return "";
  mp_arena *a = mp_arena_create();
  mp_schedule *s = nullptr;
  std::string out;
  mp_step_action *prog = nullptr;
  int32_t n = 0;
  mp_status st = mp_schedule_build(&ctx, p, rank, MP_SCHEDULE_EXPANDED, a, &s);
  if (st == MP_OK) st = mp_schedule_step_program(&ctx, s, a, &prog, &n);
  if (st != MP_OK) out = std::string("error: ") + mp_errmsg(&ctx);
  for (int32_t i = 0; i < n; i++) {
    if (i) out += ' ';
    out += mp_step_act_name(prog[i].kind);
    const int k = prog[i].kind;
    if (k == MP_ACT_GATHER || k == MP_ACT_BLOCK_FWD || k == MP_ACT_BLOCK_BWD || k == MP_ACT_FREE_CORE ||
        k == MP_ACT_FREE_BLOCK || k == MP_ACT_RELEASE || k == MP_ACT_GRAD_BEGIN || k == MP_ACT_GRAD_END)
      out += ":" + std::to_string(prog[i].a);
    if (k == MP_ACT_RECOMPUTE) out += ":" + std::to_string(prog[i].a) + (prog[i].b ? "full" : "core");
    if (k == MP_ACT_RECV_X || k == MP_ACT_SEND_X || k == MP_ACT_RECV_DX || k == MP_ACT_SEND_DX)
      out += ":" + std::to_string(prog[i].a);
    if (steps) out += std::string("@") + (prog[i].bwd ? "B" : "F") + std::to_string(prog[i].chunk);
  }
  mp_arena_destroy(a);
  mp_plan_destroy(p);
  return out;
}

const mp_mem_model kCpu = MP_MEM_MODEL_MESHPLAN_CPU, kCuda = MP_MEM_MODEL_MESHPLAN_CUDA;

}  // namespace

TEST(StepProgram, OneRankEveryAcMode) {
  EXPECT_EQ(Program("dp_shard=1", MP_AC_NONE, 1, kCpu),
            "tokens embed_fwd block_fwd:0 block_fwd:1 head_fwd head_bwd free_x block_bwd:1 free_x block_bwd:0 "
            "embed_bwd free_x free_tokens");
  EXPECT_EQ(Program("dp_shard=1", MP_AC_SELECTIVE_CORE, 1, kCpu),
            "tokens embed_fwd block_fwd:0 free_core:0 block_fwd:1 free_core:1 head_fwd head_bwd free_x "
            "recompute:1core block_bwd:1 free_x recompute:0core block_bwd:0 embed_bwd free_x free_tokens");
  EXPECT_EQ(Program("dp_shard=1", MP_AC_FULL, 1, kCpu),
            "tokens embed_fwd block_fwd:0 free_core:0 free_block:0 block_fwd:1 free_core:1 free_block:1 head_fwd "
            "head_bwd free_x recompute:1full block_bwd:1 free_x recompute:0full block_bwd:0 embed_bwd free_x "
            "free_tokens");
  // one rank on the CUDA model: nothing is sharded, so nothing to prefetch either
  EXPECT_EQ(Program("dp_shard=1", MP_AC_NONE, 1, kCuda), Program("dp_shard=1", MP_AC_NONE, 1, kCpu));
}

TEST(StepProgram, FsdpBlockingResharded) {
  EXPECT_EQ(Program("dp_shard=2", MP_AC_NONE, 1, kCpu),
            "tokens gather:-1 embed_fwd gather:0 block_fwd:0 release:1 gather:1 block_fwd:1 release:2 head_fwd "
            "grad_begin:0 head_bwd free_x gather:1 grad_begin:2 block_bwd:1 grad_end:2 release:2 free_x gather:0 "
            "grad_begin:1 block_bwd:0 grad_end:1 release:1 embed_bwd free_x grad_end:0 release:0 free_tokens");
}

TEST(StepProgram, FsdpBlockingKeptGathered) {
  EXPECT_EQ(Program("dp_shard=2", MP_AC_NONE, 0, kCpu),
            "tokens gather:-1 embed_fwd gather:0 block_fwd:0 gather:1 block_fwd:1 head_fwd grad_begin:0 head_bwd "
            "free_x grad_begin:2 block_bwd:1 grad_end:2 release:2 free_x grad_begin:1 block_bwd:0 grad_end:1 "
            "release:1 embed_bwd free_x grad_end:0 release:0 free_tokens");
}

TEST(StepProgram, FsdpOverlapPrefetchesAndDefersReduceScatters) {
  EXPECT_EQ(Program("dp_shard=2", MP_AC_NONE, 1, kCuda),
            "tokens gather:-1 gather:0 embed_fwd gather:1 block_fwd:0 release:1 block_fwd:1 release:2 head_fwd "
            "grad_begin:0 head_bwd free_x gather:1 gather:0 grad_begin:2 block_bwd:1 grad_end:2 release:2 free_x "
            "grad_begin:1 block_bwd:0 rs_finish grad_end:1 release:1 embed_bwd free_x rs_finish grad_end:0 "
            "rs_finish release:0 free_tokens");
  // full AC on the same mesh, kept gathered: the recompute reads the gathered units
  EXPECT_EQ(Program("dp_shard=2", MP_AC_FULL, 0, kCuda),
            "tokens gather:-1 gather:0 embed_fwd gather:1 block_fwd:0 free_core:0 free_block:0 block_fwd:1 "
            "free_core:1 free_block:1 head_fwd grad_begin:0 head_bwd free_x grad_begin:2 recompute:1full "
            "block_bwd:1 grad_end:2 release:2 free_x grad_begin:1 recompute:0full block_bwd:0 rs_finish "
            "grad_end:1 release:1 embed_bwd free_x rs_finish grad_end:0 rs_finish release:0 free_tokens");
}

TEST(StepProgram, RefusesAScheduleWithoutARuntimeModel) {
  EXPECT_EQ(Program("dp_shard=1", MP_AC_NONE, 1, MP_MEM_MODEL_TORCHTITAN).rfind("error: step program: the schedule "
                                                                             "has no runtime memory model", 0),
            0u);
  EXPECT_STREQ(mp_step_act_name(MP_ACT_COUNT), "?");
}

TEST(StepProgram, PipelineStagesSendAndReceive) {
  EXPECT_EQ(Program("pp=2", MP_AC_NONE, 1, kCpu, 0),
            "tokens embed_fwd block_fwd:0 send_x:1 recv_dx:1 free_x block_bwd:0 embed_bwd free_x free_tokens");
  EXPECT_EQ(Program("pp=2", MP_AC_NONE, 1, kCpu, 1),
            "tokens recv_x:1 block_fwd:1 head_fwd head_bwd free_x block_bwd:1 send_dx:1 free_x free_tokens");
  // every action of a one-chunk stage is chunk 0's forward until the backward starts
  EXPECT_EQ(Program("pp=2", MP_AC_NONE, 1, kCpu, 1, "tiny-dense", 1, true),
            "tokens@F0 recv_x:1@F0 block_fwd:1@F0 head_fwd@F0 head_bwd@B0 free_x@B0 block_bwd:1@B0 send_dx:1@B0 "
            "free_x@B0 free_tokens@B0");
}

TEST(StepProgram, InterleavedChunksInOrder) {
  // tiny-tied, 4 layers on pp=2 x 2 chunks: stage 0 holds layers 0 (chunk 0) and 2 (chunk 1),
  // stage 1 layers 1 and 3 and the head (its copy of the embedding)
  EXPECT_EQ(Program("pp=2", MP_AC_NONE, 1, kCpu, 0, "tiny-tied", 2, true),
            "tokens@F0 embed_fwd@F0 block_fwd:0@F0 send_x:1@F0 recv_x:2@F1 block_fwd:2@F1 send_x:3@F1 "
            "recv_dx:3@B1 free_x@B1 block_bwd:2@B1 send_dx:2@B1 free_x@B1 recv_dx:1@B0 free_x@B0 "
            "block_bwd:0@B0 embed_bwd@B0 free_x@B0 free_tokens@B0");
  EXPECT_EQ(Program("pp=2", MP_AC_NONE, 1, kCpu, 1, "tiny-tied", 2, true),
            "tokens@F0 recv_x:1@F0 block_fwd:1@F0 send_x:2@F0 recv_x:3@F1 block_fwd:3@F1 head_fwd@F1 "
            "head_bwd@B1 free_x@B1 block_bwd:3@B1 send_dx:3@B1 free_x@B1 recv_dx:2@B0 free_x@B0 "
            "block_bwd:1@B0 send_dx:1@B0 free_x@B0 free_tokens@B0");
}
