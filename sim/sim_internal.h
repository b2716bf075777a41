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

/* Per-file parts of mp_sim_thread_release. */
void mp_sim_network_release(void);
void mp_sim_plan_release(void);

#endif
