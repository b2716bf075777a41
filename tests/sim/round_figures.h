// Round-number stack and cluster figures that the simulator's hand calculations share
// (sim_core_test, stack_test, sm_contention_test), and the simulation call they share.
#ifndef MP_TESTS_SIM_ROUND_FIGURES_H
#define MP_TESTS_SIM_ROUND_FIGURES_H

#include <cstdio>
#include <cstring>

#include <gtest/gtest.h>

#include "sim/sim.h"

// A stack profile with round numbers so hand calculations stay simple.
inline mp_stack_profile Profile() {
  mp_stack_profile p;
  memset(&p, 0, sizeof p);
  snprintf(p.name, sizeof p.name, "test");
  p.gemm_eff_max = 0.5;
  p.gemm_eff_half_mnk = 0.0;
  p.fp8_gemm_eff_max = 0.25;
  p.attention_eff = 0.4;
  p.hbm_eff = 0.5;
  p.link_eff = 1.0;
  p.kernel_overhead_s = 0.0;
  p.comm_overhead_s = 0.0;
  p.frag_factor = 1.0;
  return p;
}

// NCCL's latency of a bulk (Simple, ring) collective of the 8 GPUs of a node of Cluster()
// (sim/network.c after NVIDIA/nccl v2.27.7-1 src/graph/tuning.cc): baseLat 8.4 us and an
// NVLink step of 3.4 us a rank, 7 steps for an all-gather or reduce-scatter (32.2 us), 14
// for an all-reduce (56.0 us). A collective of a few hundred microseconds or more there
// takes Simple's full bandwidth over LL128's 0.92 (a 8 % longer transfer for a 5 us
// shorter latency), so it takes this latency plus its bytes at the link's bandwidth.
constexpr double kNodeGatherLat = 8.4e-6 + 7 * 3.4e-6;
constexpr double kNodeAllReduceLat = 8.4e-6 + 14 * 3.4e-6;

// One node of 8 GPUs: 1000 TFLOP/s bf16, 2000 fp8, 100 fp32, 1000 GB/s HBM, 80 GiB,
// NVLink 100 GB/s, 10 GB/s between nodes (80 Gbit/s), the links' latencies 0 (a
// collective's is NCCL's, above).
inline mp_cluster Cluster(int gpus = 8, int per_node = 8) {
  mp_cluster c;
  memset(&c, 0, sizeof c);
  snprintf(c.name, sizeof c.name, "test");
  c.gpu.peak_tflops[MP_DTYPE_BF16] = 1000;
  c.gpu.peak_tflops[MP_DTYPE_FP16] = 1000;
  c.gpu.peak_tflops[MP_DTYPE_FP32] = 100;
  c.gpu.peak_tflops[MP_DTYPE_TF32] = 100;
  c.gpu.peak_tflops[MP_DTYPE_FP8_E4M3] = 2000;
  c.gpu.peak_tflops[MP_DTYPE_FP8_E5M2] = 2000;
  c.gpu.mem_gib = 80;
  c.gpu.hbm_GBps = 1000;
  c.gpu.nvlink_GBps_per_dir = 100;
  c.gpu.runtime_overhead_gib = 0;
  c.gpu.compute_capability = 90;
  c.gpus_per_node = per_node;
  c.n_nodes = gpus / per_node;
  c.intra_node_GBps_per_gpu = 100;
  c.inter_node_Gbitps_per_gpu = 80;
  return c;
}


// Simulates s on c with p (with a trace, discarded, where trace is 1: the engine's op-by-op
// path), failing the test on an error.
inline mp_sim_result SimulateSchedule(const mp_schedule *s, const mp_cluster &c, const mp_stack_profile &p,
                                      int trace = 0) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_sim_config cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.cluster = &c;
  cfg.stack = &p;
  cfg.record_trace = trace;
  mp_sim_result r;
  memset(&r, 0, sizeof r);
  mp_sim_trace *t = NULL;
  EXPECT_EQ(mp_simulate(&ctx, s, &cfg, &r, trace ? &t : NULL), MP_OK) << mp_errmsg(&ctx);
  mp_sim_trace_destroy(t);
  return r;
}

#endif
