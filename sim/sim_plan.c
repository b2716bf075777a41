/* mp_simulate_plan: plan -> compact schedule(s) -> simulation, in one call.
 *
 * Without pipeline parallelism rank 0 stands for every rank (ranks of one plan differ
 * only in which shard they hold; the last FSDP ranks may hold a little less, never more).
 * With pp > 1 the first rank of every stage is simulated: the step is as slow as the
 * slowest stage (each result already carries the bubble), memory is the largest stage's
 * (stage 0 holds the most micro-batches in flight under 1F1B). Schedules are built in a
 * per-thread arena that is reset, not freed, between calls. */
#include <string.h>

#include "sim/sim.h"

static _Thread_local mp_arena *g_arena;

mp_status mp_simulate_plan(mp_ctx *ctx, const mp_model *m, const mp_mesh *mesh,
                           const mp_plan_options *opts, const mp_sim_config *cfg,
                           mp_sim_result *out) {
  if (g_arena == NULL) {
    g_arena = mp_arena_create();
    if (g_arena == NULL) return mp_error(ctx, MP_ERR_NOMEM, "out of memory creating an arena");
  }
  mp_plan *p = NULL;
  MP_CHECK(mp_build_plan(ctx, m, mesh, opts, &p));
  mp_status st = MP_OK;
  int pp = mesh->size[MP_DIM_PP];
  mp_sim_result best, r;
  memset(&best, 0, sizeof best);
  for (int stage = 0; stage < pp; stage++) {
    int coords[MP_MESH_NDIMS] = {0};
    coords[MP_DIM_PP] = stage;
    int rank = mp_mesh_rank_of(mesh, coords);
    mp_arena_reset(g_arena);
    mp_schedule *s = NULL;
    MP_CHECK_GOTO(mp_schedule_build(ctx, p, rank, MP_SCHEDULE_COMPACT, g_arena, &s), st, done);
    MP_CHECK_GOTO(mp_simulate(ctx, s, cfg, &r, NULL), st, done);
    if (stage == 0) {
      best = r;
      continue;
    }
    if (r.step_time_s > best.step_time_s) {
      /* time figures from the slowest stage, memory from the fullest */
      mp_sim_result t = r;
      t.peak_mem_bytes = best.peak_mem_bytes;
      memcpy(t.mem_at_peak, best.mem_at_peak, sizeof t.mem_at_peak);
      t.overhead_bytes = best.overhead_bytes;
      t.fits = best.fits;
      best = t;
    }
    if (r.peak_mem_bytes > best.peak_mem_bytes) {
      best.peak_mem_bytes = r.peak_mem_bytes;
      memcpy(best.mem_at_peak, r.mem_at_peak, sizeof best.mem_at_peak);
      best.overhead_bytes = r.overhead_bytes;
      best.fits = r.fits;
    }
  }
  *out = best;
done:
  mp_arena_reset(g_arena);
  mp_plan_destroy(p);
  return st;
}
