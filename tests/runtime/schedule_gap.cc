// Diagnostic (not a test): replays exec/schedule.c's ALLOC/FREE events for a world-size-1
// plan and prints its peak per category beside the runtime's measured peaks, so the gap
// between the schedule's memory model and the CPU runtime is visible while the runtime
// is not yet schedule-driven. Usage: schedule_gap [model] [ac: none|selective|full]
#include <cstdio>
#include <cstring>
#include <vector>

#include "exec/comm/comm.h"
#include "exec/runtime/runtime.h"
#include "exec/schedule.h"
#include "kernels/cpu/cpu.h"

int main(int argc, char **argv) {
  const char *model = argc > 1 ? argv[1] : "tiny-dense";
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_model m;
  if (mp_model_load(&ctx, model, &m) != MP_OK) return fprintf(stderr, "%s\n", mp_errmsg(&ctx)), 1;
  mp_mesh mesh;
  mp_mesh_init(&mesh);
  mp_plan_options o;
  mp_plan_options_init(&o);
  o.seq = 32;
  o.micro_batch = 2;
  o.global_batch = 2;
  if (argc > 2) mp_ac_mode_parse(&ctx, argv[2], &o.ac);
  o.fsdp.param_dtype = MP_DTYPE_FP32;
  mp_plan *p;
  if (mp_build_plan(&ctx, &m, &mesh, &o, &p) != MP_OK) return fprintf(stderr, "%s\n", mp_errmsg(&ctx)), 1;
  mp_arena *a = mp_arena_create();
  mp_schedule *s;
  if (mp_schedule_build(&ctx, p, 0, MP_SCHEDULE_EXPANDED, a, &s) != MP_OK)
    return fprintf(stderr, "schedule: %s\n", mp_errmsg(&ctx)), 1;
  int64_t cur[MP_MEM_COUNT] = {0}, peak[MP_MEM_COUNT] = {0}, tot = 0, ptot = 0;
  mp_schedule_iter it;
  mp_schedule_iter_begin(s, &it);
  while (mp_schedule_iter_next(&it)) {
    const mp_op *op = it.op;
    if (op->type != MP_OP_ALLOC && op->type != MP_OP_FREE) continue;
    int64_t d = op->type == MP_OP_ALLOC ? op->mem_bytes : -op->mem_bytes;
    cur[op->mem_cat] += d;
    tot += d;
    if (cur[op->mem_cat] > peak[op->mem_cat]) peak[op->mem_cat] = cur[op->mem_cat];
    if (tot > ptot) ptot = tot;
  }
  mp_comm *comm;
  mp_comm_create_single(&ctx, &mesh, &comm);
  mp_kctx kc{&ctx, nullptr, 0};
  mp_runtime_options ro;
  mp_runtime_options_init(&ro);
  mp_runtime *rt;
  if (mp_runtime_create(&ctx, p, comm, mp_backend_cpu(), &kc, &ro, &rt) != MP_OK)
    return fprintf(stderr, "runtime: %s\n", mp_errmsg(&ctx)), 1;
  std::vector<int32_t> batch(2 * 33, 1);
  mp_step_result r;
  if (mp_runtime_step(&ctx, rt, batch.data(), &r) != MP_OK) return fprintf(stderr, "%s\n", mp_errmsg(&ctx)), 1;
  const mp_talloc *ta = mp_runtime_allocator(rt);
  printf("%-12s %14s %14s\n", "category", "schedule", "runtime");
  for (int c = 0; c < MP_MEM_COUNT; c++)
    printf("%-12s %14lld %14lld\n", mp_talloc_cat_name((mp_mem_cat)c), (long long)peak[c],
           (long long)mp_talloc_peak_bytes(ta, (mp_mem_cat)c));
  printf("%-12s %14lld %14lld\n", "total", (long long)ptot, (long long)mp_talloc_peak_total(ta));
  mp_runtime_destroy(rt);
  mp_comm_destroy(comm);
  mp_arena_destroy(a);
  mp_plan_destroy(p);
  return 0;
}
