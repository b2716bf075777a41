/* GPU profiles (data/gpus) and clusters (data/clusters): the simulator's inputs.
 *
 * Units are in the names: TFLOP/s dense peaks per dtype, GiB of memory, GB/s (1e9 bytes)
 * of HBM and NVLink bandwidth per direction, Gbit/s of inter-node bandwidth per GPU. */
#ifndef MP_SIM_CLUSTER_H
#define MP_SIM_CLUSTER_H

#include <stdint.h>

#include "common/status.h"
#include "exec/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif


/* The fraction of a GPU's dense peak that the reference kernels reach on it, from
 * published measurements (each GPU profile's "kernel_eff" object names its sources): a
 * stack's efficiencies are fractions of peak on the GPU it was fitted on, and these carry
 * them to another GPU (sim/stack.h, mp_stack_kernel_scale). 0: not stated. */
typedef struct mp_kernel_eff {
  double bf16_gemm;       /* large bf16 GEMMs (cuBLAS), of the bf16 peak */
  double fp8_gemm;        /* large float8 GEMMs, of the fp8 peak; 0 without fp8 units */
  double flash_attention; /* FlashAttention-2 forward + backward, causal, of the bf16 peak */
  double fp4_gemm;        /* large NVFP4 GEMMs (block-scaled E2M1), of the fp4 peak; 0 where the
                             GPU has no FP4 tensor cores or the profile states none */
} mp_kernel_eff;

/* Softmax's exponentials in fused attention, where the GPU profile states them (JSON
 * "attention_exp", optional; all 0: none stated, attention priced at its FLOPs alone). On
 * Blackwell the tensor cores outrun the special-function units that evaluate exp2
 * (MUFU.EX2): one exponential per score element in each pass, against 4 x head_dim FLOPs
 * of the two forward GEMMs, and the kernel's second GEMM waits on the softmax of its tile
 * (NVIDIA Technical Blog, Making Softmax More Efficient with NVIDIA Blackwell Ultra, 2026).
 * The GPU evaluates peak_bf16 / bf16_flops_per_clk x ex2_per_clk exponentials a second
 * (SMs x clock cancel); the reference kernel leaves `exposed` of that issue time outside
 * its tensor-core time, which runs at ref_eff of the bf16 peak (meshplan's FLOP count). */
typedef struct mp_attn_exp {
  double ex2_per_clk;       /* MUFU.EX2 results a clock an SM */
  double bf16_flops_per_clk; /* dense bf16 tensor-core FLOPs a clock an SM */
  double exposed;           /* share of the exp2 issue time not hidden under the GEMMs */
  double ref_eff;           /* the reference kernel's tensor-core part, of the bf16 peak */
} mp_attn_exp;

/* What a GPU is programmed through, which decides whether meshplan's runtime can drive it
 * (CUDA for --device cuda, the CPU runtime for the CPU profile). A GPU without CUDA (AMD's,
 * ROCm) is planned and simulated only. The JSON's "api"; absent: CUDA with a compute
 * capability, the CPU without one (MP_GPU_API_AUTO, which structs built by hand get too). */
typedef enum mp_gpu_api {
  MP_GPU_API_AUTO = 0,
  MP_GPU_API_CUDA,
  MP_GPU_API_ROCM,
  MP_GPU_API_CPU
} mp_gpu_api;

typedef struct mp_gpu {
  char name[64];
  mp_gpu_api api;
  double peak_tflops[MP_DTYPE_COUNT]; /* dense; float8 dtypes share the fp8 figure */
  double fp4_tflops;           /* dense NVFP4 tensor-core peak (JSON peak_tflops.fp4, optional;
                                  0: no FP4 tensor cores, Blackwell's are the first) */
  double mem_gib;
  double hbm_GBps;
  double nvlink_GBps_per_dir;
  double host_link_GBps_per_dir; /* GB/s one way between the GPU and its host's memory when
                                    every GPU of the node copies at once (JSON
                                    "host_link_GBps_per_dir", optional, its source in
                                    "host_link_source"; 0: not stated): what Megatron-Core's CPU
                                    offloading copies over (sim/sim.c) */
  double runtime_overhead_gib; /* CUDA context, NCCL buffers, allocator reserve */
  int compute_capability;      /* CUDA's, 90 for sm_90; 0 for the CPU profile and a GPU
                                  without CUDA */
  int sms;                     /* streaming multiprocessors (0: the profile states none) */
  int nvlink_domain;           /* GPUs one NVLink switch fabric joins as the part is sold
                                  (GB200 NVL72: 72), a cluster's default; 0: the node */
  double host_launch_scale;    /* the host's time to issue one framework launch over a DGX
                                  H100 host's (its Xeon 8480C), where the stack's
                                  host_launch_us was measured: a Grace superchip's CPU takes
                                  2.75x (JSON "host_launch_scale", optional; 0: not stated,
                                  an x86 host as the DGX's, 1) */
  char source[256];
  mp_kernel_eff kernel_eff;    /* all 0: the profile states none (JSON "kernel_eff" absent) */
  mp_attn_exp attn_exp;        /* all 0: the profile states none (JSON "attention_exp") */
} mp_gpu;

typedef struct mp_cluster {
  char name[64];
  mp_gpu gpu;
  int gpus_per_node;
  int n_nodes;
  /* GPUs joined by one NVLink domain across nodes (GB200 NVL72: 72, of trays of 4; NVL36x2:
   * 36); 0 or at most gpus_per_node: the node. Which groups run on NVLink and which on the
   * NICs (mp_cluster_nvlink_domain, sim/network.c). */
  int nvlink_domain;
  double intra_node_GBps_per_gpu;   /* per direction */
  double inter_node_Gbitps_per_gpu; /* NIC rate per GPU */
  /* a step of a send, an all-to-all or a broadcast, and of every collective on the CPU
   * runtime's MPI; NCCL's all-gather, reduce-scatter and all-reduce take NCCL's own
   * latencies instead (sim/network.c) */
  double intra_node_latency_us;
  double inter_node_latency_us;
  double price_per_gpu_hour; /* 0: unknown */
} mp_cluster;

/* By name (data/gpus stem) or path to a JSON file. */
mp_status mp_gpu_load(mp_ctx *ctx, const char *name_or_path, mp_gpu *out);
/* Parses a GPU profile from JSON text; origin names it in messages. */
mp_status mp_gpu_from_text(mp_ctx *ctx, const char *text, const char *origin, mp_gpu *out);
/* By name (data/clusters stem) or path. */
mp_status mp_cluster_load(mp_ctx *ctx, const char *name_or_path, mp_cluster *out);
/* Parses a cluster from JSON text; its "gpu" is loaded by name or path (mp_gpu_load). */
mp_status mp_cluster_from_text(mp_ctx *ctx, const char *text, const char *origin,
                               mp_cluster *out);
/* A cluster of n_gpus (1..2^20) GPUs of the named type, gpus_per_node (1..4096) per node,
 * with the GPU's NVLink inside a node (and across the nodes of the GPU's nvlink_domain) and
 * 400 Gbit/s per GPU between nodes unless told otherwise. */
mp_status mp_cluster_make(mp_ctx *ctx, const char *gpu, int64_t n_gpus, int64_t gpus_per_node,
                          mp_cluster *out);
/* The ranges of common/limits.h, each failure naming the field, its value and the range:
 * peaks (TFLOP/s) in (0, 1e5] (fp8: [0, 1e5], 0 when there is none), mem_gib in
 * (0, 65536], hbm_GBps in (0, 1e6], nvlink_GBps_per_dir in (0, 1e5], runtime_overhead_gib
 * in [0, mem_gib), compute_capability in 0..200, kernel_eff's fractions in [0, 1] (all
 * three 0, or bf16_gemm and flash_attention in (0, 1] and fp8_gemm in (0, 1] exactly when
 * the fp8 peak is positive), nvlink_domain in 0..2^20; a cluster's gpus_per_node in
 * 1..4096 and at most 2^20 GPUs, nvlink_domain in 0..2^20, link bandwidths in (0, 1e5] (a link without bandwidth is refused, not
 * costed as free), latencies in [0, 1e6] us, price in [0, 1e4]. The loaders call them; so
 * must code that changes a loaded profile from user input. */
mp_status mp_gpu_validate(mp_ctx *ctx, const mp_gpu *g, const char *origin);
mp_status mp_cluster_validate(mp_ctx *ctx, const mp_cluster *c, const char *origin);
int mp_cluster_n_gpus(const mp_cluster *c);
/* The ranks of one NVLink domain as the simulator lays a job out (consecutive ranks, the
 * mesh's order): the node where nvlink_domain is 0 or at most gpus_per_node, the whole
 * cluster where it holds every GPU, else the largest whole number of nodes, at most
 * nvlink_domain GPUs, that divides the cluster's nodes, so that every domain holds the same
 * share of a regular group (a 256-GPU job of 4-GPU trays in NVL72 racks: 64 a rack). */
int mp_cluster_nvlink_domain(const mp_cluster *c);
/* g's api with MP_GPU_API_AUTO resolved (CUDA with a compute capability, else the CPU). */
mp_gpu_api mp_gpu_api_of(const mp_gpu *g);
/* "cuda", "rocm" or "cpu". */
const char *mp_gpu_api_name(mp_gpu_api a);
/* The CPU profile: meshplan's CPU runtime, not a GPU. */
int mp_gpu_is_cpu(const mp_gpu *g);
/* Whether meshplan's runtime can drive g: a CUDA GPU (--device cuda) or the CPU profile. */
int mp_gpu_runtime_drives(const mp_gpu *g);
/* MP_OK when the runtime `runtime` (the meshplan-cuda stack's, "meshplan's CUDA runtime")
 * can run on g, i.e. g has CUDA; else MP_ERR_USAGE naming g and its api: "GPU mi300x has no
 * CUDA (rocm): meshplan's CUDA runtime cannot drive it; it is planned and simulated only
 * (under a torchtitan or Megatron stack)". */
mp_status mp_gpu_check_cuda(mp_ctx *ctx, const mp_gpu *g, const char *runtime);
/* Float8 GEMMs are available: an fp8 peak and compute capability >= 8.9, a ROCm GPU with an
 * fp8 peak (torchao's float8 runs there in its fnuz formats), or the CPU profile, where the
 * CPU runtime emulates float8 exactly (at its fp32 rate). */
int mp_gpu_has_float8(const mp_gpu *g);
/* The exposed time of one attention exponential in FLOP-equivalents at the reference
 * kernel's tensor-core rate: exposed x bf16_flops_per_clk / ex2_per_clk x ref_eff (an
 * exponential's exposed issue time, exposed / (peak x ex2_per_clk / bf16_flops_per_clk),
 * times that rate, peak x ref_eff). 0 where the profile states no attention_exp. */
double mp_gpu_attn_exp_flops(const mp_gpu *g);

/* A fused attention core's price in FLOPs at its bf16 rate: `flops` of tensor-core work plus
 * `exp_flops`, its exponentials' exposed time (mp_gpu_attn_exp_flops each). fp8: cuDNN's FP8
 * kernel (Transformer Engine's fp8_dpa), whose tensor-core part runs faster and whose
 * exponentials stay more exposed (sim/cluster.c states the factors and their source). */
double mp_attn_fp8_flops(int fp8, double flops, double exp_flops);
/* Inter-node bandwidth in GB/s per GPU. */
double mp_cluster_inter_GBps(const mp_cluster *c);

#ifdef __cplusplus
}
#endif
#endif
