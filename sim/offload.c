/* Megatron-Core's CPU offloading priced (the plan's cpu_offload_layers; what it moves and
 * frees is the schedule's, exec/schedule_act.c offload_act).
 *
 * Transformer Engine runs it (transformer_engine/pytorch/cpu_offload.py, v2.8,
 * AsyncDoubleBufferGroupOffloadHandler, the handler Megatron-Core's get_cpu_offload_context
 * creates, transformer_block.py core_v0.14.0): each of the first N layers is a group; after a
 * layer's forward its commit (group_prefetch_offload_commit_async) runs. Group 0's copy to the
 * host starts after layer 0's forward; at the commit of layer w[k] (layer_window_map, below)
 * the compute stream and the device-to-host stream wait for each other, group k's GPU tensors
 * are released and group k + 1's copy starts. So group k's copy runs on its own stream beside
 * the forward of layers s_k + 1 .. w[k] (s_0 = 0, s_k = w[k - 1]), one group in flight at a
 * time, and shows only where it takes longer. Backward mirrors it on the host-to-device
 * stream: as the backward reaches layer w[k] the compute stream waits for the copies issued
 * before and group k's copy back starts, to be waited for at layer w[k - 1] (group 0: before
 * layer 0's backward), beside the backward of the same layers. Each copy takes its bytes over
 * the GPU's host link one way (host_link_GBps_per_dir); a micro-batch pays the sum of what
 * its 2N copies show, every micro-batch alike. */
#include <string.h>

#include "sim/engine.h"
#include "sim/sim_internal.h"

int32_t mp_sim_offload_window(int32_t layers, int32_t n, int32_t k) {
  int32_t w = 0, c = 0;
  for (int32_t i = 0; i <= k; i++) {
    w = (layers / n) * (i + 1) - 1;
    if (i < layers % n) {
      w += i + 1;
      c = i + 1;
    } else {
      w += c;
    }
  }
  return w;
}

/* Each block layer's compute-stream time of one micro-batch's forward (t[0]) and backward
 * (t[1]) from the compiled ops of its segment's repetition. */
static void layer_times(const mp_schedule *s, const cop *cops, double t[2][MP_MAX_LAYERS]) {
  for (int32_t i = 0; i < s->n_segs; i++) {
    const mp_segment *g = &s->segs[i];
    if (g->layer_step == 0 || (g->phase != MP_PHASE_FORWARD && g->phase != MP_PHASE_BACKWARD)) continue;
    int32_t l0 = -1;
    double one = 0.0;
    for (int32_t j = g->first_op; j < g->first_op + g->n_ops; j++) {
      if (l0 < 0 && s->ops[j].layer >= 0) l0 = s->ops[j].layer;
      if ((cops[j].kind == COP_COMPUTE || cops[j].kind == COP_COMM) && cops[j].stream == MP_STREAM_COMPUTE &&
          cops[j].when == MP_WHEN_EVERY_MICRO)
        one += cops[j].dur;
    }
    for (int32_t r = 0; l0 >= 0 && r < g->repeat; r++) {
      const int32_t l = l0 + r * g->layer_step;
      if (l >= 0 && l < MP_MAX_LAYERS) t[g->phase == MP_PHASE_BACKWARD][l] += one;
    }
  }
}

double mp_sim_offload_exposed_s(int32_t layers, int32_t n, double copy_s, const double t_fwd[],
                                const double t_bwd[]) {
  double exposed = 0.0;
  for (int32_t k = 0, s_k = 0; k < n; k++) {
    const int32_t w = mp_sim_offload_window(layers, n, k);
    double f = 0.0, b = 0.0;
    for (int32_t j = s_k + 1; j <= w; j++) f += t_fwd[j], b += t_bwd[j];
    if (copy_s > f) exposed += copy_s - f;
    if (copy_s > b) exposed += copy_s - b;
    s_k = w;
  }
  return exposed;
}

mp_status mp_sim_offload(mp_ctx *ctx, const mp_schedule *s, const cop *cops, const mp_gpu *gpu, int64_t n_micro,
                         mp_sim_result *r) {
  const int32_t n = s->plan->opts.cpu_offload_layers, L = (int32_t)s->plan->model.n_layers;
  if (n <= 0 || s->offload_bytes <= 0) return MP_OK;
  if (!(gpu->host_link_GBps_per_dir > 0))
    return mp_error(ctx, MP_ERR_INVALID, "CPU offloading on %s: its GPU profile states no host link "
                    "(host_link_GBps_per_dir) to price the copies over", gpu->name);
  double t[2][MP_MAX_LAYERS] = {{0}};
  layer_times(s, cops, t);
  const double copy_s = (double)s->offload_bytes / (gpu->host_link_GBps_per_dir * 1e9);
  r->offload_exposed_s = (double)n_micro * mp_sim_offload_exposed_s(L, n, copy_s, t[0], t[1]);
  r->step_time_s += r->offload_exposed_s;
  r->exposed_comm_s += r->offload_exposed_s;
  return MP_OK;
}
