/* Calibration: measured rates of this machine and how they reach the simulator.
 *
 * Offers: the default points of each device and their FLOP and byte counts
 * (mp_calib_options_init_*, mp_calib_*_flops); the measurement, on the CPU (kernels, copy,
 * MPI collectives) or one CUDA GPU (mp_calib_measure); the fits of what was measured
 * (mp_calib_fit for the collectives' alpha-beta model, mp_calib_fit_stack for the kernels'
 * efficiencies, mp_calib_fit_run at a run's sizes); and their application to a GPU
 * profile, a cluster and a stack profile (mp_calib_apply*). calib/store.h keeps
 * calibrations in the planner database.
 *
 * docs/calibration.md says what is measured on each device, how, and the models of the
 * fits; its section names ("CUDA", "The fit") are cited below.
 *
 * Invariants: every figure is > 0 when present; gemm[], f8[] and coll[] are in
 * measurement order (load returns them in the order saved). */
#ifndef MP_CALIB_CALIBRATE_H
#define MP_CALIB_CALIBRATE_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "sim/cluster.h"
#include "exec/comm/comm.h"
#include "exec/model.h"
#include "kernels/ops.h"
#include "sim/gemm_table.h"
#include "sim/sim.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MP_CALIB_MAX_GEMM 128
#define MP_CALIB_MAX_SIZES 8
#define MP_CALIB_MAX_GROUPS 8
#define MP_CALIB_MAX_ATTN 16
#define MP_CALIB_MAX_F8 MP_CALIB_MAX_GEMM /* the bf16 grid again, in float8 */
#define MP_CALIB_MAX_BW 48

/* The collectives calibrated (the simulator's ring model covers these four). */
typedef enum mp_calib_coll {
  MP_CALIB_ALL_REDUCE = 0,
  MP_CALIB_ALL_GATHER,
  MP_CALIB_REDUCE_SCATTER,
  MP_CALIB_ALL_TO_ALL,
  MP_CALIB_COLL_COUNT
} mp_calib_coll;

const char *mp_calib_coll_name(mp_calib_coll c); /* "all_reduce", ... */
/* The ring factors of sim/network.c: bandwidth factor f and latency steps c for n ranks. */
double mp_calib_bw_factor(mp_calib_coll c, int n);
double mp_calib_lat_steps(mp_calib_coll c, int n);

/* Which GEMM of a Linear layer a point times. */
typedef enum mp_calib_gemm_pass {
  MP_CALIB_GEMM_FWD = 0, /* matmul_forward: out = inp W^T, 2NKM FLOP */
  MP_CALIB_GEMM_BWD,     /* matmul_backward with dinp and dweight (the CPU's), 4NKM */
  MP_CALIB_GEMM_DGRAD,   /* matmul_backward, dinp only: dinp += dout W, 2NKM */
  MP_CALIB_GEMM_WGRAD,   /* matmul_backward, dweight only: dW += dout^T inp (fp32), 2NKM */
  MP_CALIB_GEMM_PASS_COUNT
} mp_calib_gemm_pass;

const char *mp_calib_gemm_pass_name(int pass); /* "fwd", "bwd", "dgrad", "wgrad"; "?" */
double mp_calib_gemm_flops(int pass, int N, int K, int M); /* 2NKM, 4NKM for bwd */

typedef struct mp_calib_gemm {
  int pass;     /* mp_calib_gemm_pass */
  int N, K, M;  /* out (N, M) = inp (N, K) weight (M, K)^T */
  double flops_per_s;
} mp_calib_gemm;

/* The point of a GEMM of pass at N x K x M that took time_s per call. */
mp_calib_gemm mp_calib_gemm_point(int pass, int N, int K, int M, double time_s);

typedef struct mp_calib_attn {
  int backward;             /* 0: attention_forward; 1: attention_backward */
  int B, T, nh, nkv, hd;
  double flops_per_s;       /* simulator FLOPs (mp_calib_attn_flops) per second */
} mp_calib_attn;

/* Forward 2 B T^2 nh hd, backward twice that (exec/schedule.c's causal counts). */
double mp_calib_attn_flops(int backward, int B, int T, int nh, int hd);

/* Memory-bound kernels timed for the HBM efficiency (copy is the reference). cuda times
 * the first five; cpu every one. Stored by name: the values may grow, never reorder. */
typedef enum mp_calib_bw_kernel {
  MP_CALIB_BW_RMSNORM_FWD = 0, /* (rows, cols) bf16: 4 bytes per element */
  MP_CALIB_BW_RMSNORM_BWD,     /* 6 bytes per element */
  MP_CALIB_BW_SWIGLU_FWD,      /* 6 bytes per element of the output */
  MP_CALIB_BW_SWIGLU_BWD,      /* 10 bytes per element */
  MP_CALIB_BW_ADAMW,           /* 28 bytes per parameter (7 fp32 tensors) */
  MP_CALIB_BW_ROPE_FWD,        /* (tokens, heads x hd): 4 bytes per element */
  MP_CALIB_BW_ROPE_BWD,        /* 4 bytes per element */
  MP_CALIB_BW_CE_FWD,          /* cross-entropy (tokens, vocab): 10 bytes per logit */
  MP_CALIB_BW_CE_BWD,          /* 8 bytes per logit */
  MP_CALIB_BW_RESIDUAL,        /* residual add (accumulate): 6 bytes per element */
  MP_CALIB_BW_COUNT
} mp_calib_bw_kernel;
#define MP_CALIB_BW_CUDA_COUNT 5 /* rmsnorm_fwd .. adamw */

const char *mp_calib_bw_name(int k); /* "rmsnorm_fwd", ...; "?" */
/* Bytes the simulator counts for kernel k over `elems` elements (exec/schedule.c). */
double mp_calib_bw_bytes(int k, double elems);
/* FLOPs the simulator counts for kernel k over `elems` elements (exec/schedule.c): its
 * element-wise time is max(flops / fp32 peak, bytes / (hbm x hbm_eff)). */
double mp_calib_bw_flops(int k, double elems);

typedef struct mp_calib_bw {
  int kernel;   /* mp_calib_bw_kernel */
  double elems; /* elements per call */
  double GBps;  /* mp_calib_bw_bytes / time / 1e9 */
} mp_calib_bw;

/* What the simulator takes from a calibration's kernels: the meshplan-cuda or meshplan-cpu
 * stack profile's figures (sim/sim.h), relative to the figures ref_* of the calibration.
 * A figure that was not measured is 0 (the stack keeps its stated one). */
typedef struct mp_calib_stack_fit {
  double gemm_eff_max, gemm_eff_half_mnk;
  double gemm_curve_rms;  /* rms relative time error of the curve over the bf16 points */
  double gemm_table_rms;  /* the same, curve x nearest-shape correction, leave one out */
  int gemm_table;         /* 1: the simulator applies the by-shape correction */
  double fp8_gemm_eff_max;
  double fp8_gemm_curve_rms; /* rms relative time error of the float8 curve over the f8 points */
  double fp8_gemm_table_rms; /* the same with the float8 by-shape correction, leave one out */
  int fp8_gemm_table;        /* 1: the simulator applies the float8 by-shape correction */
  double attention_eff;
  double hbm_eff;
  double kernel_overhead_us;
  /* cpu, for a run only (mp_calib_fit_run; not stored): each element-wise kernel class's
   * own efficiency from its points (norm: RMSNorm; activation: SwiGLU; rope; loss:
   * cross-entropy; optimizer: AdamW; residual), 0 where its points say nothing at the run's
   * sizes (the class then takes hbm_eff) */
  double hbm_eff_kernel[MP_KERNEL_COUNT];
} mp_calib_stack_fit;

typedef struct mp_calib_coll_fit {
  mp_calib_coll coll;
  int group_size;
  int n_sizes;
  double bytes[MP_CALIB_MAX_SIZES];      /* payload as sim/network.c defines it */
  double time_s[MP_CALIB_MAX_SIZES];     /* per call */
  double busbw_GBps[MP_CALIB_MAX_SIZES]; /* f x bytes / time */
  double alpha_s;                        /* fitted per-step latency */
  double beta_GBps;                      /* fitted bus bandwidth */
} mp_calib_coll_fit;

typedef struct mp_calib {
  int64_t id;          /* database row group id (0: not stored) */
  char created_at[32]; /* ISO 8601 UTC */
  char device[16];     /* "cpu" or "cuda" */
  char host[64];
  int threads; /* OpenMP threads per rank (cuda: 1) */
  int world;   /* MPI ranks that ran the calibration (cuda: 1) */
  int n_gemm;
  mp_calib_gemm gemm[MP_CALIB_MAX_GEMM];
  double copy_GBps; /* read + write bytes per second / 1e9 */
  int n_coll;
  mp_calib_coll_fit coll[MP_CALIB_MAX_GROUPS * MP_CALIB_COLL_COUNT];

  /* ---- cuda only (zero / empty on the CPU) ---- */
  char gpu_name[96];      /* the device's own name ("NVIDIA H100 80GB HBM3") */
  char gpu_profile[64];   /* data/gpus profile the efficiencies are relative to */
  int compute_capability; /* 90 for sm_90 */
  /* ---- the kernels and their fit: cuda, and cpu calibrations with a kernel fit (a cpu
   * one of GEMM and copy only holds none of these: all zero, the stack is left alone) ---- */
  /* what the efficiencies are relative to: cuda, that profile's datasheet figures; cpu,
   * the GEMM peak (every dtype) and the copy bandwidth that mp_calib_apply writes into
   * the CPU profile */
  double ref_bf16_tflops, ref_fp8_tflops, ref_hbm_GBps;
  double launch_s;        /* per call of a kernel doing no work */
  int n_attn;
  mp_calib_attn attn[MP_CALIB_MAX_ATTN];
  int n_bw;
  mp_calib_bw bw[MP_CALIB_MAX_BW];
  /* ---- cuda only ---- */
  int n_f8;
  mp_calib_gemm f8[MP_CALIB_MAX_F8]; /* float8 GEMMs of pass FWD, DGRAD or WGRAD (a
                                        calibration may hold FWD only) */
  char f8_unavailable[256];   /* why float8 was not measured; "" when it was */
  char attn_unavailable[256]; /* why attention was not measured; "" when it was */
  mp_calib_stack_fit fit;     /* mp_calib_fit_stack; stored with the points */
} mp_calib;

/* A GEMM to time: pass (mp_calib_gemm_pass) and the Linear's N, K, M. */
typedef struct mp_calib_gemm_shape {
  int pass, N, K, M;
} mp_calib_gemm_shape;

typedef struct mp_calib_options {
  int reps;   /* timed repetitions per figure (median); >= 1 */
  int n_gemm; /* shapes below; 0: the device's defaults */
  mp_calib_gemm_shape gemm[MP_CALIB_MAX_GEMM]; /* pass: cpu any; cuda FWD, DGRAD, WGRAD */
  int n_sizes; /* collective payload sizes in bytes; 0: the defaults */
  double sizes_bytes[MP_CALIB_MAX_SIZES];
  int64_t copy_bytes; /* copy buffer size; 0: the device's default */
  /* cuda only; 0 / "": the defaults */
  int device;       /* CUDA device ordinal */
  char gpu_profile[128]; /* data/gpus stem or path; "": the one matching the device's name */
  int n_attn;
  struct {
    int B, T, nh, nkv, hd;
  } attn[MP_CALIB_MAX_ATTN];
  int n_f8;
  mp_calib_gemm_shape f8[MP_CALIB_MAX_F8]; /* pass FWD, DGRAD or WGRAD; sizes multiples of 16 */
  int norm_rows, norm_cols; /* rmsnorm (N, C) */
  int64_t swiglu_elems, adamw_elems;
  /* cpu only; 0: the defaults. Element-wise points: kernel (mp_calib_bw_kernel) on rows x
   * cols elements: rmsnorm (N, C), swiglu (N, F), RoPE (tokens, heads x hd) with head
   * dimension hd, cross-entropy (tokens, vocab), AdamW and residual rows x cols. */
  int n_bw;
  struct {
    int kernel, rows, cols, hd;
  } bw[MP_CALIB_MAX_BW];
} mp_calib_options;

/* CPU defaults (mp_calib_options_init_cpu(o, 0)): reps 5; GEMMs fwd, dgrad and wgrad at
 * the tiny models' Linears (256 tokens: 256x64x64, 256x64x32, 256x64x192, 256x192x64,
 * 256x64x256, 256x64x8; the experts' 64x64x32 and 64x32x64), and 512x256x256,
 * 512x256x1024, 512x1024x256, 1024x512x512, 1024x1024x1024, 1024x1024x4096, 1024x4096x1024;
 * attention (B, T, nh, nkv, hd) (4, 64, 8, 4, 8), (4, 128, 8, 4, 8), (4, 256, 8, 4, 16),
 * (2, 256, 8, 4, 64), (1, 512, 8, 4, 64); every element-wise kernel at the tiny models'
 * size, 2^18 and 2^22 elements; payloads 256 B, 4 KiB, 64 KiB, 1 MiB, 8 MiB; copy 64 MiB.
 * quick: reps 3, the GEMMs 256x64x192, 256x192x64, 256x64x256, 1024x1024x1024, attention
 * (4, 64, 8, 4, 8) and (2, 256, 8, 4, 64), the element-wise kernels at the tiny size
 * only, copy 16 MiB: a check in a second or two, a rougher fit. */
void mp_calib_options_init_cpu(mp_calib_options *o, int quick);
/* mp_calib_options_init_cpu(o, 0). */
void mp_calib_options_init(mp_calib_options *o);
/* CUDA defaults: reps 7; the 81 GEMM points of docs/calibration.md, "CUDA"; attention
 * (B, T) in {(16, 1024), (8, 2048), (4, 4096), (2, 8192)} with nh 16, nkv 8, hd 128, and
 * (8, 2048) with nh 32, nkv 8, hd 64; float8 the same 81 shapes and passes as bf16 (every size a
 * multiple of 16; about 1 to 2 s on an H100: a float8 point costs less than its bf16
 * one); rmsnorm 8192 x 4096, swiglu 8192 x 14336, AdamW 2^26 parameters, copy 256 MiB.
 * quick: one token count (2048), (K, M) in {2048^2, 4096^2, 4096x14336} for bf16 and
 * float8 alike (9 points each), two attention points, reps 3: a check in seconds, a
 * rougher fit. */
void mp_calib_options_init_cuda(mp_calib_options *o, int quick);

/* Measures on every rank of comm (collective over comm's world when its backend is
 * "mpi": every rank must call it). be is the CPU backend, or the CUDA backend with a
 * world of 1 (kc initialised either way). Sub-group communicators are created from
 * MPI_COMM_WORLD and freed before returning. Ends with mp_calib_fit_stack. opts NULL: the
 * device's defaults; a group of opts with no points (n_gemm, n_attn, n_bw 0): that
 * group's defaults. */
mp_status mp_calib_measure(mp_ctx *ctx, mp_comm *comm, const mp_backend *be, mp_kctx *kc,
                           const mp_calib_options *opts, mp_calib *out);

/* ---- CUDA ---------------------------------------------------------------------------- */

/* What the CUDA runtime says of one device. */
typedef struct mp_calib_device {
  char name[96];
  int compute_capability; /* major * 10 + minor */
  double mem_bytes;
  int n_sms;
} mp_calib_device;

/* Checks that CUDA device `device` can be calibrated and describes it. Without one:
 * MP_ERR_UNSUPPORTED with one line naming what is missing ("no CUDA device visible
 * (cudaGetDeviceCount: ...); run on a machine with an NVIDIA GPU", or a build without
 * CUDA). Touches nothing else (no file, no database). */
mp_status mp_calib_cuda_probe(mp_ctx *ctx, int device, mp_calib_device *out);

/* The data/gpus profile whose datasheet describes a device, from its name, compute
 * capability and memory: "h100-sxm", "h100-96gb-500w", "h200", "a100-80gb-sxm", "b200";
 * NULL when none does for sure (PCIe and NVL parts, GH200, 40 GB A100s, others): the
 * caller then asks for --gpu. */
const char *mp_calib_gpu_profile_for(const char *device_name, int compute_capability,
                                     double mem_bytes);

/* The GPU profile a calibration of dev is fitted against: `requested` (a data/gpus stem
 * or a JSON path; NULL or "": mp_calib_gpu_profile_for). MP_ERR_USAGE when none matches
 * the device's name (pass --gpu), MP_ERR_INVALID when the profile's compute capability
 * is not the device's (its datasheet would be another GPU's). */
mp_status mp_calib_cuda_profile(mp_ctx *ctx, const mp_calib_device *dev, const char *requested, mp_gpu *out);

/* The measurement on the GPU (mp_calib_measure's cuda half; kc initialised on
 * opts->device). Fills everything but id and fit; fp8 and attention errors are recorded,
 * not returned. */
mp_status mp_calib_measure_cuda(mp_ctx *ctx, const mp_backend *be, mp_kctx *kc,
                                const mp_calib_options *opts, mp_calib *out);

/* ---- the fit (docs/calibration.md, "The fit") ------------------------------------------ */

/* The GEMM curve over n points against peak_flops, each point's time less overhead_s.
 * rms_rel (may be NULL): rms of (predicted - measured) / measured time, overhead
 * included in both. MP_ERR_INVALID for n < 1 or a rate that is not positive. */
mp_status mp_calib_fit_gemm_curve(mp_ctx *ctx, const mp_calib_gemm *g, int n, double peak_flops,
                                  double overhead_s, double *eff_max, double *half_mnk,
                                  double *rms_rel);
/* The sizes of the run a cpu calibration is applied to (mp_calib_apply_stack_run): the
 * CPU kernels' rates change with the size more than one figure can hold (an element-wise
 * kernel runs on one thread up to 2^14..2^16 elements and on the team above; attention
 * with 8-wide heads reaches half the rate of 64-wide ones), so attention_eff and hbm_eff
 * are refitted with the points near the run's sizes weighing most. */
typedef struct mp_calib_run {
  double tokens; /* per micro-batch on one rank: micro-batch x seq */
  int64_t seq, d_model, d_ff, vocab, n_heads, head_dim;
  int tp; /* the run's tensor-parallel degree (its shards are 1/tp wide); 1 when unknown */
} mp_calib_run;
#define MP_CALIB_RUN_REACH 2.0 /* octaves at which a point stops weighing: a factor of 4, as sim/gemm_table.h */

/* The run of m at micro_batch x seq tokens per rank and tensor parallelism tp (<= 1: 1). */
void mp_calib_run_init(mp_calib_run *r, const mp_model *m, int64_t micro_batch, int64_t seq, int tp);

/* c->fit, with a cpu calibration's attention_eff and hbm_eff refitted for run (see
 * "The fit"): each point weighs 1 - d / MP_CALIB_RUN_REACH (0 beyond), d the largest
 * log2 distance from the run's size (attention: T from seq and hd from head_dim;
 * element-wise: the elements from the run's tensor of that kernel: tokens x d_model for
 * rmsnorm and the residual, x d_ff / tp for swiglu, x n_heads hd / tp for RoPE, x vocab
 * for cross-entropy, d_model x d_ff / tp parameters for AdamW). A figure no point weighs
 * keeps the stored fit's. run NULL, or a cuda calibration: c->fit as stored. */
void mp_calib_fit_run(const mp_calib *c, const mp_calib_run *run, mp_calib_stack_fit *out);

/* Fills c->fit from c's points and ref_* (attention, bandwidth and float8 figures stay 0
 * when not measured). cuda: GEMM points of pass FWD, DGRAD or WGRAD are required, and
 * the reference peaks (MP_ERR_INVALID otherwise). cpu: sets ref_* first (see "The fit");
 * a calibration without such GEMM points (GEMM and copy only, or BWD points only) gets no fit
 * (all zero: the stack keeps its stated figures), which is not an error. */
mp_status mp_calib_fit_stack(mp_ctx *ctx, mp_calib *c);
/* The by-shape correction of c's bf16 GEMM points (sim/gemm_table.h), from c->fit's
 * curve against ref_bf16. */
void mp_calib_gemm_table(const mp_calib *c, mp_gemm_table *t);
/* The same for c's float8 points (c->f8), from c->fit's float8 curve (fp8_gemm_eff_max,
 * gemm_eff_half_mnk) against ref_fp8; empty without float8 points or that curve. */
void mp_calib_fp8_gemm_table(const mp_calib *c, mp_gemm_table *t);

/* Fits alpha and beta of f->bytes/time_s (n_sizes >= 1) into f->alpha_s, f->beta_GBps and
 * fills f->busbw_GBps. MP_ERR_INVALID when a time or size is not positive. */
mp_status mp_calib_fit(mp_ctx *ctx, mp_calib_coll_fit *f);

/* The largest GEMM rate measured (any pass). 0 when none was measured. */
double mp_calib_gemm_peak_flops(const mp_calib *c);
/* The GEMM rate a cpu calibration writes into the CPU profile as its peak: ref_bf16 when
 * the calibration holds a fit (the curve's efficiencies are relative to it), else the
 * largest measured (a calibration without a fit: the stated stack scales small GEMMs down). */
double mp_calib_cpu_peak_flops(const mp_calib *c);
/* The fit the cluster's single intra-node link takes: all-reduce (the collective
 * nccl-tests quote) at the largest group measured; NULL when world was 1. */
const mp_calib_coll_fit *mp_calib_link_fit(const mp_calib *c);

/* Writes the measured figures into a CPU profile. gpu (may be NULL): peak_tflops of every
 * dtype = mp_calib_cpu_peak_flops (the CPU computes everything in fp32), hbm_GBps = copy_GBps,
 * source notes the calibration; and, when a link fit exists, nvlink_GBps_per_dir = its
 * beta. cluster (may be NULL): its embedded gpu the same way, and, with a link fit,
 * intra_node_GBps_per_gpu = beta and intra_node_latency_us = alpha. Nothing else
 * changes (name, memory, node layout, inter-node figures, price). */
void mp_calib_apply(const mp_calib *c, mp_gpu *gpu, mp_cluster *cluster);

/* mp_calib_apply after checking that the profile can take this calibration: a "cpu"
 * calibration goes only onto a CPU profile (compute_capability 0), a "cuda" one only
 * onto the GPU profile it was fitted against (same name), else MP_ERR_INVALID naming the
 * profile. A cuda calibration changes nothing in the GPU profile: its datasheet peaks
 * are what the stack efficiencies are relative to (mp_calib_apply_stack carries them). */
mp_status mp_calib_apply_checked(mp_ctx *ctx, const mp_calib *c, mp_gpu *gpu, mp_cluster *cluster);

/* Storage for a calibration's by-shape corrections, which a stack profile points into
 * (mp_calib_apply_stack): it must outlive every use of that profile. Plain data; a copy
 * of the profile still points at the original. */
typedef struct mp_calib_tables {
  mp_gemm_table bf16; /* stack->gemm_table */
  mp_gemm_table fp8;  /* stack->fp8_gemm_table */
} mp_calib_tables;

/* A calibration's fit into the stack profile of the kernels it measured (cuda:
 * meshplan-cuda; cpu: meshplan-cpu): gemm_eff_max, gemm_eff_half_mnk, hbm_eff,
 * kernel_overhead, and fp8_gemm_eff_max and attention_eff where measured; source names
 * the calibration. tables (may be NULL): tables->bf16 filled with the bf16 by-shape
 * correction and pointed at by stack->gemm_table when fit.gemm_table says the simulator
 * uses it, tables->fp8 with the float8 one and stack->fp8_gemm_table when
 * fit.fp8_gemm_table says so (and float8 was measured); a pointer not set is NULL (tables
 * NULL: both). Link, comm and memory figures stay. A cpu calibration leaves any other
 * stack alone (its rates went into the CPU profile; that stack's efficiencies are its
 * own), and so does a cpu calibration without a fit. MP_ERR_INVALID: a cuda
 * calibration and a stack other than meshplan-cuda, or a fit without a GEMM curve. */
mp_status mp_calib_apply_stack(mp_ctx *ctx, const mp_calib *c, mp_stack_profile *stack,
                               mp_calib_tables *tables);
/* mp_calib_apply_stack with the fit of mp_calib_fit_run(c, run) (run may be NULL). */
mp_status mp_calib_apply_stack_run(mp_ctx *ctx, const mp_calib *c, const mp_calib_run *run,
                                   mp_stack_profile *stack, mp_calib_tables *tables);

/* Loads the newest calibration of `device` from the database at db_path
 * (calib/store.h) and applies it with mp_calib_apply_checked (gpu and cluster may
 * be NULL). Errors: MP_ERR_NOT_FOUND (no file, or no calibration of that device in it),
 * MP_ERR_DB (not a meshplan database), MP_ERR_INVALID (a profile of the wrong kind). */
mp_status mp_calib_load_apply(mp_ctx *ctx, const char *db_path, const char *device, mp_gpu *gpu,
                              mp_cluster *cluster);
/* mp_calib_load_apply, then mp_calib_apply_stack onto stack (may be NULL) with tables;
 * out (may be NULL) receives the calibration applied. */
mp_status mp_calib_load_apply_stack(mp_ctx *ctx, const char *db_path, const char *device, mp_gpu *gpu,
                                    mp_cluster *cluster, mp_stack_profile *stack, mp_calib_tables *tables,
                                    mp_calib *out);

/* One line naming the calibration: "#3 cpu on host, 2 threads x 1 rank, 2026-11-02T10:00:00Z:
 * GEMM 41.2 GFLOP/s, copy 9.8 GB/s, link 3.10 GB/s 4.2 us (all_reduce, 2 ranks)" (with a
 * fit: ", gemm_eff_max 0.91 half_mnk 2.1e+05, attention_eff 0.120, hbm_eff 0.640,
 * kernel_overhead 0.03 us" after the copy); for
 * cuda "#4 cuda on host, NVIDIA H100 80GB HBM3 (h100-sxm, sm_90), <time>: gemm_eff_max
 * 0.780 half_mnk 1.9e+09, attention_eff 0.520, hbm_eff 0.850, fp8_gemm_eff_max 0.610,
 * kernel_overhead 2.9 us", each of gemm_eff_max and fp8_gemm_eff_max followed by
 * " (+ by shape)" when the simulator applies that by-shape correction. */
void mp_calib_summary(const mp_calib *c, char *buf, size_t cap);
/* The OpenMP threads this process's kernels run with (what a cpu calibration records as
 * threads): a run with another count is predicted from rates it did not measure. */
int mp_calib_threads_now(void);

#ifdef __cplusplus
}
#endif
#endif
