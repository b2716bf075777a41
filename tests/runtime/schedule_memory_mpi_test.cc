// The CUDA runtime's memory model (MP_MEM_MODEL_MESHPLAN_CUDA) on several ranks, where FSDP
// shards, gathers and reduce-scatters: every rank's predicted peak (its own schedule,
// replayed) equals its tracked allocator's, per category, on the accounting backend
// (acct_backend.h: bf16 X tensors, no-op kernels) under mpirun. The GPU runtime runs NCCL
// (overlap: the next unit's gather prefetched, reduce-scatters finished one unit later),
// which needs GPUs; here the "mpi" backend's blocking table runs under the name "nccl", so
// the runtime takes its overlap path with every collective complete at once. Allocation is
// on the host in issue order either way, so the allocator sees what it sees on NCCL.
//
// Also here, since it needs the same 4 ranks: float8 on codes (the CUDA path's algorithm,
// mp_runtime_options.f8_codes) on the CPU backend under tp, against the fp32 emulation of
// the same plan: the amax all-reduced over tp once, whether it came from a fused kernel, the
// forward, or an f8_amax pass.
//
// One binary, run by run_mpi_test.sh under mpirun; its main initializes MPI and all-reduces
// the verdict so that a failure on any rank fails every rank.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "exec/comm/comm_backend.h"
#include "exec/runtime/runtime.h"
#include "exec/schedule.h"
#include "kernels/cpu/cpu.h"
#include "sim/stack.h"
#include "tests/mpi_gtest.h"
#include "tests/runtime/acct_backend.h"
#include "tests/runtime/schedule_replay.h"

namespace {

int g_rank = 0, g_world = 1;

struct Case {
  const char *model, *mesh;
  mp_ac_mode ac;
  int fp8, reshard;
};

std::string Name(const Case &k) {
  const char *base = strrchr(k.model, '/');
  return std::string(base ? base + 1 : k.model) + " " + k.mesh + " ac=" + mp_ac_mode_name(k.ac) +
         (k.fp8 ? " fp8" : "") +
         (k.reshard ? "" : " no-reshard");
}

// The rank's schedule replayed in issue order: the whole peak and each category's.
using mp_test::Replay;

// The "mpi" backend's table under NCCL's name: the runtime's overlap path, blocking.
mp_comm_backend g_as_nccl;

void CheckCase(const Case &k) {
  SCOPED_TRACE(Name(k));
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_model m;
  ASSERT_EQ(mp_model_load(&ctx, k.model, &m), MP_OK) << mp_errmsg(&ctx);
  mp_mesh mesh;
  ASSERT_EQ(mp_mesh_parse(&ctx, k.mesh, 0, &mesh), MP_OK) << mp_errmsg(&ctx);
  ASSERT_EQ(mp_mesh_world(&mesh), g_world) << "run with mpirun -np " << mp_mesh_world(&mesh);
  mp_stack_profile prof;
  ASSERT_EQ(mp_stack_load(&ctx, "meshplan-cuda", &prof), MP_OK) << mp_errmsg(&ctx);
  mp_plan_options o;
  mp_plan_options_init(&o);
  o.seq = 32;
  o.micro_batch = 2;
  o.ac = k.ac;
  o.fp8 = k.fp8;
  o.fsdp.reshard_after_forward = k.reshard;
  mp_gpu gpu;
  EXPECT_EQ(mp_gpu_load(&ctx, "cpu", &gpu), MP_OK) << mp_errmsg(&ctx);
  mp_stack_plan_options(&prof, &gpu, &o);
  mp_plan *p = nullptr;
  ASSERT_EQ(mp_build_plan(&ctx, &m, &mesh, &o, &p), MP_OK) << mp_errmsg(&ctx);
  int64_t local_batch = 0, n_micro = 0;
  ASSERT_EQ(mp_plan_batch(&ctx, p, &local_batch, &n_micro), MP_OK) << mp_errmsg(&ctx);

  mp_arena *a = mp_arena_create();
  mp_schedule *se = nullptr, *sc = nullptr;
  ASSERT_EQ(mp_schedule_build(&ctx, p, g_rank, MP_SCHEDULE_EXPANDED, a, &se), MP_OK) << mp_errmsg(&ctx);
  ASSERT_EQ(mp_schedule_build(&ctx, p, g_rank, MP_SCHEDULE_COMPACT, a, &sc), MP_OK) << mp_errmsg(&ctx);
  EXPECT_EQ(mp_schedule_check(&ctx, se), MP_OK) << mp_errmsg(&ctx);
  EXPECT_EQ(mp_schedule_check(&ctx, sc), MP_OK) << mp_errmsg(&ctx);
  int64_t peak = 0, peak_c = 0, cat_max[MP_MEM_COUNT], cat_max_c[MP_MEM_COUNT];
  Replay(se, &peak, cat_max);
  Replay(sc, &peak_c, cat_max_c);
  EXPECT_EQ(peak, peak_c) << "expanded and compact schedules disagree";

  mp_comm *comm = nullptr;
  ASSERT_EQ(mp_comm_create_mpi(&ctx, &mesh, &comm), MP_OK) << mp_errmsg(&ctx);
  g_as_nccl = *comm->backend;
  g_as_nccl.name = "nccl";
  comm->backend = &g_as_nccl;
  const mp_backend *be = mp_backend_acct();
  mp_kctx kc{};
  kc.err = &ctx;
  ASSERT_EQ(be->init(&kc, 0), MP_OK) << mp_errmsg(&ctx);
  mp_runtime_options ro;
  mp_runtime_options_init(&ro);
  mp_runtime *rt = nullptr;
  ASSERT_EQ(mp_runtime_create(&ctx, p, comm, be, &kc, &ro, &rt), MP_OK) << mp_errmsg(&ctx);
  const mp_talloc *ta = mp_runtime_allocator(rt);
  std::vector<int32_t> batch((size_t)(local_batch * (o.seq + 1)));
  for (size_t i = 0; i < batch.size(); i++) batch[i] = (int32_t)((i * 97 + 11 + 7 * g_rank) % m.vocab);
  mp_step_result res;
  ASSERT_EQ(mp_runtime_step(&ctx, rt, batch.data(), &res), MP_OK) << mp_errmsg(&ctx);
  for (int c = 0; c < MP_MEM_COUNT; c++)
    EXPECT_EQ(se->resident_bytes[c], mp_talloc_current_bytes(ta, (mp_mem_cat)c))
        << "rank " << g_rank << " resident " << mp_mem_cat_name((mp_mem_cat)c);
  ASSERT_EQ(mp_runtime_step(&ctx, rt, batch.data(), &res), MP_OK) << mp_errmsg(&ctx);
  EXPECT_EQ(peak, res.peak_bytes) << "rank " << g_rank;
  for (int c = 0; c < MP_MEM_COUNT; c++)
    EXPECT_EQ(cat_max[c], mp_talloc_peak_bytes(ta, (mp_mem_cat)c))
        << "rank " << g_rank << " category " << mp_mem_cat_name((mp_mem_cat)c);
  if (g_rank == 0)
    printf("  %-52s rank 0 predicted %9lld measured %9lld bytes\n", Name(k).c_str(), (long long)peak,
           (long long)res.peak_bytes);

  mp_runtime_destroy(rt);
  be->shutdown(&kc);
  mp_comm_destroy(comm);
  mp_arena_destroy(a);
  mp_plan_destroy(p);
}

// tiny-dense with 5 layers: the compact schedule writes blocks 1..3 as one repeated
// segment, so the reduce-scatter in flight crosses repetitions of a segment too.
std::string FiveLayerModel() {
  const char *dir = getenv("TEST_TMPDIR");
  std::string path = std::string(dir ? dir : "/tmp") + "/tiny-dense-5-rank" + std::to_string(g_rank) + ".json";
  FILE *f = fopen(path.c_str(), "w");
  if (f) {
    fputs("{\"name\": \"tiny-dense-5\", \"family\": \"llama\", \"vocab\": 256, \"d_model\": 64, "
          "\"n_layers\": 5, \"n_heads\": 8, \"n_kv_heads\": 4, \"head_dim\": 8, \"d_ff\": 192, "
          "\"max_seq\": 64, \"tied_embeddings\": false, \"norm_eps\": 1e-5, \"rope_theta\": 10000.0, "
          "\"source\": \"tiny-dense with five layers (schedule_memory_mpi_test)\"}\n",
          f);
    fclose(f);
  }
  return path;
}

// Meshes of the world this binary runs in (4 ranks).
TEST(ScheduleMemoryMpi, CudaModelOnFsdpMeshes) {
  const mp_ac_mode modes[] = {MP_AC_NONE, MP_AC_SELECTIVE_CORE, MP_AC_FULL};
  const char *dense[] = {"dp_shard=4", "dp_shard=2,tp=2", "dp_replicate=2,dp_shard=2", "tp=4"};
  const std::string five = FiveLayerModel();
  for (const char *mesh : dense)
    for (mp_ac_mode ac : modes)
      for (int fp8 = 0; fp8 <= 1; fp8++) {
        CheckCase({"tiny-dense", mesh, ac, fp8, 1});
        CheckCase({five.c_str(), mesh, ac, fp8, 1});
      }
  for (mp_ac_mode ac : modes) {
    CheckCase({"tiny-dense", "dp_shard=4", ac, 1, 0});
    CheckCase({five.c_str(), "dp_shard=4", ac, 1, 0});
  }
  for (mp_ac_mode ac : modes)
    for (int fp8 = 0; fp8 <= 1; fp8++) {
      CheckCase({"tiny-moe", "dp_shard=4", ac, fp8, 1});
      CheckCase({"tiny-moe", "dp_shard=2,tp=2", ac, fp8, 1});
    }
  CheckCase({"tiny-moe", "dp_shard=4", MP_AC_NONE, 0, 0});
}

// Losses and gradient norms of 3 steps of mesh's float8 plan on the CPU backend, with the
// float8 Linears on codes (f8_codes) or emulated.
void Float8Steps(const char *mesh_spec, int f8_codes, double loss[3], double gnorm[3]) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_model m;
  ASSERT_EQ(mp_model_load(&ctx, "tiny-dense", &m), MP_OK) << mp_errmsg(&ctx);
  mp_mesh mesh;
  ASSERT_EQ(mp_mesh_parse(&ctx, mesh_spec, 0, &mesh), MP_OK) << mp_errmsg(&ctx);
  ASSERT_EQ(mp_mesh_world(&mesh), g_world);
  mp_plan_options o;
  mp_plan_options_init(&o);
  o.seq = 32;
  o.micro_batch = 2;
  o.fp8 = 1;
  o.sp = 0; /* the runtime runs tp in the all-reduce form */
  mp_plan *p = nullptr;
  ASSERT_EQ(mp_build_plan(&ctx, &m, &mesh, &o, &p), MP_OK) << mp_errmsg(&ctx);
  int64_t local_batch = 0, n_micro = 0;
  ASSERT_EQ(mp_plan_batch(&ctx, p, &local_batch, &n_micro), MP_OK) << mp_errmsg(&ctx);
  mp_comm *comm = nullptr;
  ASSERT_EQ(mp_comm_create_mpi(&ctx, &mesh, &comm), MP_OK) << mp_errmsg(&ctx);
  mp_kctx kc{};
  kc.err = &ctx;
  ASSERT_EQ(mp_backend_cpu()->init(&kc, 0), MP_OK);
  mp_runtime_options ro;
  mp_runtime_options_init(&ro);
  ro.f8_codes = f8_codes;
  mp_runtime *rt = nullptr;
  ASSERT_EQ(mp_runtime_create(&ctx, p, comm, mp_backend_cpu(), &kc, &ro, &rt), MP_OK) << mp_errmsg(&ctx);
  const int dp_idx = mp_comm_group_index(comm, MP_GROUP_DP);
  std::vector<int32_t> batch((size_t)(local_batch * (o.seq + 1)));
  for (size_t i = 0; i < batch.size(); i++) batch[i] = (int32_t)((i * 97 + 11 + 7 * dp_idx) % m.vocab);
  for (int step = 0; step < 3; step++) {
    mp_step_result res;
    ASSERT_EQ(mp_runtime_step(&ctx, rt, batch.data(), &res), MP_OK) << mp_errmsg(&ctx);
    loss[step] = res.loss;
    gnorm[step] = res.grad_norm;
  }
  mp_runtime_destroy(rt);
  mp_comm_destroy(comm);
  mp_plan_destroy(p);
}

TEST(Float8OnCodesMpi, MatchesTheEmulationUnderTp) {
  for (const char *mesh : {"dp_shard=2,tp=2", "tp=4"}) {
    SCOPED_TRACE(mesh);
    double le[3], ge[3], lc[3], gc[3];
    Float8Steps(mesh, 0, le, ge);
    if (HasFatalFailure()) return;
    Float8Steps(mesh, 1, lc, gc);
    if (HasFatalFailure()) return;
    for (int s = 0; s < 3; s++) {
      EXPECT_NEAR(lc[s], le[s], 1e-6 * le[s]) << "step " << s;
      EXPECT_NEAR(gc[s], ge[s], 1e-5 * ge[s]) << "step " << s;
    }
    if (g_rank == 0)
      printf("  %-18s float8 loss step 3: emulated %.9f, on codes %.9f\n", mesh, le[2], lc[2]);
  }
}

}  // namespace

int main(int argc, char **argv) {
  return mp_test::MpiMain(&argc, &argv, "schedule_memory_mpi_test", false, &g_rank, &g_world);
}
