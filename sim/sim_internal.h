/* Internals shared by the simulator's files (not an interface for other modules). */
#ifndef MP_SIM_SIM_INTERNAL_H
#define MP_SIM_SIM_INTERNAL_H

#include <stdint.h>

#include "sim/sim.h"

/* One simulated op instance on the timeline. */
typedef struct mp_sim_event {
  double start_s, dur_s;
  int32_t op;    /* index into the schedule's ops */
  int32_t layer; /* the instance's block index (-1 outside blocks) */
  int32_t micro; /* -1 for prologue / optimizer */
} mp_sim_event;

/* Names are formatted only when the trace is written (mp_op_name), never while
 * simulating; so the schedule must outlive the trace. */
struct mp_sim_trace {
  const mp_schedule *s;
  mp_sim_event *ev;
  size_t n, cap;
};

/* mp_simulate with the links of every group (indexed by mp_group, as mp_sim_group_link
 * gives them for the schedule's rank) looked up beforehand; links NULL looks them up. */
mp_status mp_simulate_with_links(mp_ctx *ctx, const mp_schedule *s, const mp_sim_config *cfg,
                                 const mp_sim_link *links, mp_sim_result *out,
                                 mp_sim_trace **trace);

/* The link of group g for `rank`: links[g] when the caller looked the links up
 * beforehand (links not NULL), else mp_sim_group_link. */
mp_status mp_sim_link_of(mp_ctx *ctx, const mp_sim_link *links, const mp_cluster *c, const mp_mesh *mesh,
                         mp_group g, int rank, mp_sim_link *out);

/* Per-file parts of mp_sim_thread_release. */
void mp_sim_network_release(void);
void mp_sim_plan_release(void);

#endif
