/* The simulator's workspace (sim.h, mp_sim_workspace; layout in workspace.h): creation,
 * freeing, the growth of its buffers, and the temporary one a call without a workspace
 * runs in. */
#include <stdlib.h>
#include <string.h>

#include "sim/workspace.h"

mp_status mp_sim_workspace_create(mp_ctx *ctx, mp_sim_workspace **out) {
  *out = (mp_sim_workspace *)calloc(1, sizeof **out);
  if (*out == NULL)
    return mp_error(ctx, MP_ERR_NOMEM, "out of memory creating a simulator workspace");
  return MP_OK;
}

void mp_sim_workspace_destroy(mp_sim_workspace *ws) {
  if (ws == NULL) return;
  free(ws->op_times);
  free(ws->cops);
  free(ws->prog.keep);
  free(ws->prog.seg_plain);
  free(ws->prog.seg_step);
  free(ws->prog.steps);
  free(ws->prog.t);
  free(ws->prog.c);
  free(ws->prog.k);
  free(ws->prog.sb);
  free(ws->prog.m);
  mp_arena_destroy(ws->arena);
  free(ws->stage_buf);
  free(ws->stages);
  free((void *)ws->stage_of);
  free(ws->ends);
  free(ws->pos);
  free(ws->dual);
  for (int i = 0; i < MP_SIM_ORDER_SLOTS; i++) {
    free(ws->order_slots[i].steps);
    free(ws->order_slots[i].rec);
  }
  free(ws);
}

int mp_sim_grow(void **p, size_t *cap, size_t n, size_t elem) {
  if (n <= *cap) return 1;
  void *q = realloc(*p, n * elem);
  if (q == NULL) return 0;
  *p = q;
  *cap = n;
  return 1;
}

mp_status mp_sim_ws_begin(mp_ctx *ctx, const mp_sim_config *cfg, mp_sim_config *local,
                          const mp_sim_config **use) {
  *use = cfg;
  if (cfg == NULL || cfg->ws != NULL) return MP_OK;
  *local = *cfg;
  MP_CHECK(mp_sim_workspace_create(ctx, &local->ws));
  *use = local;
  return MP_OK;
}

void mp_sim_ws_end(const mp_sim_config *use, const mp_sim_config *cfg) {
  if (use != cfg) mp_sim_workspace_destroy(use->ws);
}
