/* Calibration of the CPU profile: measured GEMM rates, memory copy bandwidth and MPI
 * collective bandwidth per group size, and how they replace the figures of a GPU profile
 * and a cluster (exec/cluster.h) so that the simulator predicts this machine.
 *
 * What is measured (mp_calib_measure):
 *   - GEMM: the CPU backend's matmul_forward (2NKM FLOP) and matmul_backward with both
 *     dinp and dweight (4NKM FLOP) at each shape, median of `reps` timed calls after one
 *     warm-up, with the OpenMP team the runtime uses (every thread).
 *   - Copy: memcpy of a buffer far larger than the caches, split over the OpenMP team;
 *     GB/s counts bytes read plus bytes written (STREAM's convention, and the simulator's:
 *     an op's `bytes` is what it reads and writes).
 *   - Collectives (world > 1 only): for each group size g in {2, 4, 8, ...} dividing the
 *     world, plus the world itself, the world is cut into world/g groups of g consecutive
 *     ranks (mesh dp_replicate = world/g, dp_shard = g) and every group runs all-reduce,
 *     all-gather, reduce-scatter and all-to-all at once, as they do in training. Each
 *     message size is timed over a loop of calls between barriers; the per-call median
 *     over `reps` loops, the slowest rank's, is the figure.
 *   With several ranks, GEMM and copy run on every rank at once (the per-rank rates of a
 *   training job on this machine) and the figures are the mean over ranks.
 *
 * Bus bandwidth follows nccl-tests and sim/network.c: with `bytes` the payload as the
 * simulator defines it (the full tensor for all-reduce, all-gather and reduce-scatter;
 * what one rank sends for all-to-all) and f = 2(g-1)/g for all-reduce, (g-1)/g otherwise,
 *   busbw = f x bytes / t,   and the alpha-beta model   t = f x bytes / beta + c x alpha,
 * c = 2(g-1) for all-reduce and (g-1) otherwise. alpha and beta are fitted by least
 * squares on relative error (each size weighs the same, so the small sizes fix alpha and
 * the large ones beta); a negative intercept is clamped to alpha = 0.
 *
 * Invariants: every figure is > 0 when present; gemm[] and coll[] are in measurement
 * order (load returns them in the order saved). */
#ifndef MP_PLANNER_CALIBRATE_H
#define MP_PLANNER_CALIBRATE_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "exec/cluster.h"
#include "exec/comm/comm.h"
#include "kernels/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MP_CALIB_MAX_GEMM 16
#define MP_CALIB_MAX_SIZES 8
#define MP_CALIB_MAX_GROUPS 8

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

typedef struct mp_calib_gemm {
  int backward; /* 0: matmul_forward (2NKM FLOP); 1: matmul_backward, dinp + dweight (4NKM) */
  int N, K, M;  /* out (N, M) = inp (N, K) weight (M, K)^T */
  double flops_per_s;
} mp_calib_gemm;

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
  char device[16];     /* "cpu" */
  char host[64];
  int threads; /* OpenMP threads per rank */
  int world;   /* MPI ranks that ran the calibration */
  int n_gemm;
  mp_calib_gemm gemm[MP_CALIB_MAX_GEMM];
  double copy_GBps; /* read + write bytes per second / 1e9 */
  int n_coll;
  mp_calib_coll_fit coll[MP_CALIB_MAX_GROUPS * MP_CALIB_COLL_COUNT];
} mp_calib;

typedef struct mp_calib_options {
  int reps;   /* timed repetitions per figure (median); >= 1 */
  int n_gemm; /* shapes below; 0: the defaults */
  struct {
    int backward, N, K, M;
  } gemm[MP_CALIB_MAX_GEMM];
  int n_sizes; /* collective payload sizes in bytes; 0: the defaults */
  double sizes_bytes[MP_CALIB_MAX_SIZES];
  int64_t copy_bytes; /* copy buffer size; 0: the default (64 MiB) */
} mp_calib_options;

/* Defaults: reps 5; GEMMs forward and backward at the tiny-dense model's shapes (256
 * tokens: 256x64x192, 256x192x64, 256x64x256) and at 512^3 and 1024^3; payloads 4 KiB,
 * 64 KiB, 1 MiB, 8 MiB; copy 64 MiB. */
void mp_calib_options_init(mp_calib_options *o);

/* Measures on every rank of comm (collective over comm's world when its backend is
 * "mpi": every rank must call it). be is the CPU backend (its kc initialised). Sub-group
 * communicators are created from MPI_COMM_WORLD and freed before returning. */
mp_status mp_calib_measure(mp_ctx *ctx, mp_comm *comm, const mp_backend *be, mp_kctx *kc,
                           const mp_calib_options *opts, mp_calib *out);

/* Fits alpha and beta of f->bytes/time_s (n_sizes >= 1) into f->alpha_s, f->beta_GBps and
 * fills f->busbw_GBps. MP_ERR_INVALID when a time or size is not positive. */
mp_status mp_calib_fit(mp_ctx *ctx, mp_calib_coll_fit *f);

/* The GEMM rate the simulator takes as the peak: the largest measured (the simulator's
 * stack profile scales small GEMMs down itself). 0 when none was measured. */
double mp_calib_gemm_peak_flops(const mp_calib *c);
/* The fit the cluster's single intra-node link takes: all-reduce (the collective
 * nccl-tests quote) at the largest group measured; NULL when world was 1. */
const mp_calib_coll_fit *mp_calib_link_fit(const mp_calib *c);

/* Writes the measured figures into a CPU profile. gpu (may be NULL): peak_tflops of every
 * dtype = the GEMM peak (the CPU computes everything in fp32), hbm_GBps = copy_GBps,
 * source notes the calibration; and, when a link fit exists, nvlink_GBps_per_dir = its
 * beta. cluster (may be NULL): its embedded gpu the same way, and, with a link fit,
 * intra_node_GBps_per_gpu = beta and intra_node_latency_us = alpha. Nothing else
 * changes (name, memory, node layout, inter-node figures, price). */
void mp_calib_apply(const mp_calib *c, mp_gpu *gpu, mp_cluster *cluster);

/* mp_calib_apply after checking that the profile can take this calibration: a "cpu"
 * calibration goes only onto a CPU profile (compute_capability 0), else MP_ERR_INVALID
 * naming the profile. */
mp_status mp_calib_apply_checked(mp_ctx *ctx, const mp_calib *c, mp_gpu *gpu, mp_cluster *cluster);

/* Loads the newest calibration of `device` from the database at db_path
 * (planner/calib_store.h) and applies it with mp_calib_apply_checked (gpu and cluster may
 * be NULL). Errors: MP_ERR_NOT_FOUND (no file, or no calibration of that device in it),
 * MP_ERR_DB (not a meshplan database), MP_ERR_INVALID (not a CPU profile). */
mp_status mp_calib_load_apply(mp_ctx *ctx, const char *db_path, const char *device, mp_gpu *gpu,
                              mp_cluster *cluster);

/* One line naming the calibration: "#3 cpu on host, 2 threads x 1 rank, 2026-11-02T10:00:00Z:
 * GEMM 41.2 GFLOP/s, copy 9.8 GB/s, link 3.10 GB/s 4.2 us (all_reduce, 2 ranks)". */
void mp_calib_summary(const mp_calib *c, char *buf, size_t cap);

#ifdef __cplusplus
}
#endif
#endif
