/* The simulator's workspace as its files share it (not an interface for other modules;
 * sim.h has the contract): every buffer one simulation reuses, grouped by the file that
 * uses it. workspace.c creates and frees it and grows its buffers.
 *
 * Invariant: nothing here carries a result from one call to the next. Every buffer is
 * written before it is read within a call (its old contents are never looked at), and the
 * two things kept across calls are functions of their keys alone: the default stack profile
 * of one bit (CPU or GPU: mp_stack_default), and the pipeline orders of their (schedule,
 * flavor, pp, v, n_micro) (mp_pp_order), so a call's figures do not depend on what ran
 * before it. */
#ifndef MP_SIM_WORKSPACE_H
#define MP_SIM_WORKSPACE_H

#include <stddef.h>
#include <stdint.h>

#include "sim/engine.h"
#include "sim/sim_internal.h"

/* Every stage's pipeline order for one (schedule, flavor, pp, v, n_micro), as mp_pp_order
 * gives it: the planner's candidates of one mesh ask the timeline for the same few orders
 * (the timeline's periodic runs use micro-batch counts fixed by pp alone), so building them
 * once per worker saves recomputing them per candidate. */
typedef struct mp_sim_order_slot {
  int valid;
  mp_pp_schedule kind;
  mp_pp_flavor flavor;
  int pp, v;
  int64_t n_micro;
  mp_pp_step *steps;  /* (pp, 2 n_micro v) */
  size_t steps_cap;
  /* the timeline's steps in the order its sweeps ran them (sim/pipeline.c), which is the
   * orders' alone: n_rec of them, 0 until a timeline of this key has run */
  struct mp_pp_rec *rec;
  size_t rec_cap;
  int64_t n_rec;
} mp_sim_order_slot;

/* Orders kept: the timeline's three periodic runs of a pipeline and the full runs of a few
 * micro-batch counts (a mesh's candidates go through its micro-batch sizes, each under every
 * AC policy). */
#define MP_SIM_ORDER_SLOTS 16

struct mp_sim_workspace {
  /* engine.c: per op of the largest schedule seen */
  double *op_times;   /* (3, n_ops): duration, end of the current and the previous instance */
  size_t op_times_cap;
  cop *cops;          /* (n_ops) the ops compiled for the hot loop */
  size_t cops_cap;
  prog_buf prog;      /* the segments' programs */

  /* sim_plan.c: the stages of the largest plan seen */
  mp_arena *arena;    /* the schedules when the caller passes no scratch arena (reset
                         between stages and after the call); NULL until first needed */
  int *stage_buf;     /* (pp + 2 + n_params + 2 pp): stage offsets, block parameters by
                         stage, the stages selected, rep */
  size_t stage_buf_cap;
  mp_sim_stage *stages;            /* (n_selected) the stage runs */
  size_t stages_cap;
  const mp_sim_stage **stage_of;   /* (pp) the run standing for each stage */
  size_t stage_of_cap;

  /* pipeline.c: the timeline of the largest pipeline seen */
  double *ends;       /* (2 n_micro pp v + pp): step end times, then each stage's free time */
  size_t ends_cap;
  int64_t *pos;       /* (pp) each stage's next step */
  size_t pos_cap;
  mp_sim_order_slot order_slots[MP_SIM_ORDER_SLOTS]; /* every stage's orders, by key (the
                                                        timeline's and mp_sim_pp_held_extra's) */
  mp_sim_stage *dual; /* (pp) DualPipe's ranks, each two model stages (sim.c, dual_rank) */
  size_t dual_cap;
  int order_next;     /* the slot the next new key replaces (round robin) */

  /* cost.c: the default stack profile, [0] a CPU's, [1] a GPU's, loaded on first use */
  mp_stack_profile default_stack[2];
  int default_loaded[2];
};

/* Room for n elements of elem bytes at *p (capacity *cap, in elements): grown with realloc
 * (contents kept), never shrunk. 0 when out of memory (*p unchanged). */
int mp_sim_grow(void **p, size_t *cap, size_t n, size_t elem);

/* The config a call runs with: cfg when it names a workspace; else a copy of it in *local
 * with a temporary workspace. *use receives which (cfg itself when cfg is NULL: the call
 * then reports the missing config). Pair with mp_sim_ws_end. */
mp_status mp_sim_ws_begin(mp_ctx *ctx, const mp_sim_config *cfg, mp_sim_config *local,
                          const mp_sim_config **use);
/* Frees the temporary workspace mp_sim_ws_begin made, if it made one. */
void mp_sim_ws_end(const mp_sim_config *use, const mp_sim_config *cfg);

#endif
