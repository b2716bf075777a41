/* A calibration's use by the simulator: its rates written into a CPU profile and a
 * cluster, its fit into the stack profile of the kernels it measured, the newest one of
 * a device loaded from the planner database, and its one-line summary.
 *
 * Invariant: a cuda calibration never changes a GPU profile (its efficiencies are
 * relative to that profile's datasheet peaks); a cpu one changes only CPU profiles and
 * the meshplan-cpu stack. */
#include "calib/calibrate.h"

#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "calib/store.h"

double mp_calib_gemm_peak_flops(const mp_calib *c) {
  double p = 0;
  for (int i = 0; i < c->n_gemm; i++)
    if (c->gemm[i].flops_per_s > p) p = c->gemm[i].flops_per_s;
  return p;
}

double mp_calib_cpu_peak_flops(const mp_calib *c) {
  /* with a fit, the curve's efficiencies are relative to ref_bf16: the profile must hold
   * the same figure or every GEMM would be off by their ratio */
  if (c->fit.gemm_eff_max > 0 && c->ref_bf16_tflops > 0) return c->ref_bf16_tflops * 1e12;
  return mp_calib_gemm_peak_flops(c);
}

const mp_calib_coll_fit *mp_calib_link_fit(const mp_calib *c) {
  const mp_calib_coll_fit *best = NULL;
  for (int i = 0; i < c->n_coll; i++)
    if (c->coll[i].coll == MP_CALIB_ALL_REDUCE && c->coll[i].beta_GBps > 0 &&
        (best == NULL || c->coll[i].group_size > best->group_size))
      best = &c->coll[i];
  return best;
}

static void apply_gpu(const mp_calib *c, mp_gpu *g, const mp_calib_coll_fit *link) {
  double peak = mp_calib_cpu_peak_flops(c);
  if (peak > 0)
    for (int d = 0; d < MP_DTYPE_COUNT; d++) g->peak_tflops[d] = peak * 1e-12;
  /* the fit's hbm_eff is relative to ref_hbm, which is this copy figure */
  if (c->copy_GBps > 0) g->hbm_GBps = c->copy_GBps;
  if (link) g->nvlink_GBps_per_dir = link->beta_GBps;
  snprintf(g->source, sizeof g->source, "calibration #%lld of %s (%d threads x %d ranks) on %s at %s",
           (long long)c->id, c->device, c->threads, c->world, c->host, c->created_at);
}

void mp_calib_apply(const mp_calib *c, mp_gpu *gpu, mp_cluster *cluster) {
  /* cuda: the profile keeps its datasheet figures, which the fit is relative to; what
   * was measured reaches the simulator through the stack (mp_calib_apply_stack). */
  if (strcmp(c->device, "cuda") == 0) return;
  const mp_calib_coll_fit *link = mp_calib_link_fit(c);
  if (gpu) apply_gpu(c, gpu, link);
  if (cluster) {
    apply_gpu(c, &cluster->gpu, link);
    if (link) {
      /* The simulator has one intra-node bandwidth and latency for every group size and
       * collective: the all-reduce fit of the largest group stands for all of them (the
       * other fits stay in the database). */
      cluster->intra_node_GBps_per_gpu = link->beta_GBps;
      cluster->intra_node_latency_us = link->alpha_s * 1e6;
    }
  }
}

mp_status mp_calib_apply_checked(mp_ctx *ctx, const mp_calib *c, mp_gpu *gpu, mp_cluster *cluster) {
  const int cpu = strcmp(c->device, "cpu") == 0;
  const mp_gpu *targets[2] = {gpu, cluster ? &cluster->gpu : NULL};
  if (strcmp(c->device, "cuda") == 0) {
    /* The efficiencies are relative to one datasheet: only that profile can take them. */
    for (int i = 0; i < 2; i++)
      if (targets[i] && (mp_gpu_is_cpu(targets[i]) || strcmp(targets[i]->name, c->gpu_profile) != 0))
        return mp_error(ctx, MP_ERR_INVALID, "calibration #%lld was measured on %s and fitted against profile %s, "
                        "but the profile here is %s; simulate with --gpu %s (or a cluster of them) or drop "
                        "--calibration", (long long)c->id, c->gpu_name, c->gpu_profile, targets[i]->name,
                        c->gpu_profile);
    mp_calib_apply(c, gpu, cluster);
    return MP_OK;
  }
  for (int i = 0; i < 2; i++)
    if (targets[i] && cpu != mp_gpu_is_cpu(targets[i]))
      return mp_error(ctx, MP_ERR_INVALID, "calibration #%lld was measured on %s but profile %s is %s; simulate "
                      "with a CPU profile (--cluster cpu-local or --gpu cpu) or drop --calibration",
                      (long long)c->id, c->device, targets[i]->name, cpu ? "a GPU" : "the CPU");
  mp_calib_apply(c, gpu, cluster);
  return MP_OK;
}

mp_status mp_calib_apply_stack(mp_ctx *ctx, const mp_calib *c, mp_stack_profile *stack, mp_calib_tables *tables) {
  return mp_calib_apply_stack_run(ctx, c, NULL, stack, tables);
}

mp_status mp_calib_apply_stack_run(mp_ctx *ctx, const mp_calib *c, const mp_calib_run *run,
                                   mp_stack_profile *stack, mp_calib_tables *tables) {
  const int cpu = strcmp(c->device, "cpu") == 0;
  mp_calib_stack_fit fit;
  mp_calib_fit_run(c, run, &fit);
  const mp_calib_stack_fit *f = &fit;
  if (cpu) {
    /* the fit describes meshplan's CPU kernels; another stack's figures are its own, and
     * a calibration without a fit leaves the stated meshplan-cpu figures */
    if (strcmp(stack->name, "meshplan-cpu") != 0 || !(f->gemm_eff_max > 0)) return MP_OK;
  } else if (strcmp(c->device, "cuda") != 0) {
    return MP_OK;
  } else if (strcmp(stack->name, "meshplan-cuda") != 0) {
    return mp_error(ctx, MP_ERR_INVALID, "calibration #%lld measured meshplan's CUDA kernels: it applies to the "
                    "meshplan-cuda stack, not %s; pass --stack meshplan-cuda or drop --calibration",
                    (long long)c->id, stack->name);
  }
  if (!(f->gemm_eff_max > 0))
    return mp_error(ctx, MP_ERR_INVALID, "calibration #%lld holds no GEMM fit; run meshplan calibrate --device "
                    "cuda again", (long long)c->id);
  stack->gemm_eff_max = f->gemm_eff_max;
  stack->gemm_eff_half_mnk = f->gemm_eff_half_mnk;
  /* measured on the GPU the stack runs on: no fit GPU to carry the figures from */
  stack->fit_gpu[0] = '\0';
  /* figures not measured (0) keep the stack's stated ones */
  if (f->fp8_gemm_eff_max > 0) stack->fp8_gemm_eff_max = f->fp8_gemm_eff_max;
  if (f->attention_eff > 0) stack->attention_eff = f->attention_eff;
  if (f->hbm_eff > 0) stack->hbm_eff = f->hbm_eff;
  for (int k = 0; k < MP_KERNEL_COUNT; k++) stack->hbm_eff_kernel[k] = f->hbm_eff_kernel[k];
  if (f->kernel_overhead_us > 0) stack->kernel_overhead_s = f->kernel_overhead_us * 1e-6;
  /* the tables are made from c's points and stored fit (f's GEMM figures are c->fit's:
   * mp_calib_fit_run refits only attention and the element-wise kernels) */
  stack->gemm_table = NULL;
  stack->fp8_gemm_table = NULL;
  if (tables && f->gemm_table) {
    mp_calib_gemm_table(c, &tables->bf16);
    stack->gemm_table = &tables->bf16;
  }
  if (tables && f->fp8_gemm_table && f->fp8_gemm_eff_max > 0) {
    mp_calib_fp8_gemm_table(c, &tables->fp8);
    stack->fp8_gemm_table = &tables->fp8;
  }
  if (cpu)
    snprintf(stack->source, sizeof stack->source,
             "calibration #%lld of cpu (%d threads x %d ranks) on %s at %s; GEMM %s; attention and element-wise %s",
             (long long)c->id, c->threads, c->world, c->host, c->created_at,
             stack->gemm_table ? "curve with the by-shape correction" : "curve",
             run ? "at the run's sizes" : "over every size");
  else
    snprintf(stack->source, sizeof stack->source,
             "calibration #%lld of cuda on %s (%s datasheet peaks) on %s at %s; GEMM %s; float8 GEMM %s",
             (long long)c->id, c->gpu_name, c->gpu_profile, c->host, c->created_at,
             stack->gemm_table ? "curve with the by-shape correction" : "curve",
             !(f->fp8_gemm_eff_max > 0) ? "as stated (not measured)"
             : stack->fp8_gemm_table   ? "curve with the by-shape correction"
                                       : "curve");
  return MP_OK;
}

mp_status mp_calib_load_apply(mp_ctx *ctx, const char *db_path, const char *device, mp_gpu *gpu,
                              mp_cluster *cluster) {
  return mp_calib_load_apply_stack(ctx, db_path, device, gpu, cluster, NULL, NULL, NULL);
}

mp_status mp_calib_load_apply_stack(mp_ctx *ctx, const char *db_path, const char *device, mp_gpu *gpu,
                                    mp_cluster *cluster, mp_stack_profile *stack, mp_calib_tables *tables,
                                    mp_calib *out) {
  mp_calib *c = malloc(sizeof *c);
  MP_CHECK_ALLOC(ctx, c);
  mp_status s = mp_calib_store_load(ctx, db_path, device, c);
  if (s == MP_OK) s = mp_calib_apply_checked(ctx, c, gpu, cluster);
  if (s == MP_OK && stack) s = mp_calib_apply_stack(ctx, c, stack, tables);
  if (s == MP_OK && out) *out = *c;
  free(c);
  return s;
}

void mp_calib_summary(const mp_calib *c, char *buf, size_t cap) {
  if (strcmp(c->device, "cuda") == 0) {
    const mp_calib_stack_fit *f = &c->fit;
    int n = snprintf(buf, cap, "#%lld cuda on %s, %s (%s, sm_%d), %s: gemm_eff_max %.3f half_mnk %.3g%s",
                     (long long)c->id, c->host, c->gpu_name, c->gpu_profile, c->compute_capability, c->created_at,
                     f->gemm_eff_max, f->gemm_eff_half_mnk, f->gemm_table ? " (+ by shape)" : "");
    if (n < 0 || (size_t)n >= cap) return;
    char a[32] = "not measured", f8[32] = "not measured";
    if (f->attention_eff > 0) snprintf(a, sizeof a, "%.3f", f->attention_eff);
    if (f->fp8_gemm_eff_max > 0) snprintf(f8, sizeof f8, "%.3f", f->fp8_gemm_eff_max);
    snprintf(buf + n, cap - (size_t)n,
             ", attention_eff %s, hbm_eff %.3f, fp8_gemm_eff_max %s%s, kernel_overhead %.2f us", a, f->hbm_eff, f8,
             f->fp8_gemm_eff_max > 0 && f->fp8_gemm_table ? " (+ by shape)" : "", f->kernel_overhead_us);
    return;
  }
  const mp_calib_coll_fit *link = mp_calib_link_fit(c);
  int n = snprintf(buf, cap, "#%lld %s on %s, %d thread%s x %d rank%s, %s: GEMM %.2f GFLOP/s, copy %.2f GB/s",
                   (long long)c->id, c->device, c->host, c->threads, c->threads == 1 ? "" : "s", c->world,
                   c->world == 1 ? "" : "s", c->created_at, mp_calib_cpu_peak_flops(c) * 1e-9, c->copy_GBps);
  if (n < 0 || (size_t)n >= cap) return;
  if (c->fit.gemm_eff_max > 0) {
    const mp_calib_stack_fit *f = &c->fit;
    int m = snprintf(buf + n, cap - (size_t)n,
                     ", gemm_eff_max %.2f half_mnk %.2g%s, attention_eff %.3f, hbm_eff %.3f, kernel_overhead %.2f us",
                     f->gemm_eff_max, f->gemm_eff_half_mnk, f->gemm_table ? " (+ by shape)" : "", f->attention_eff,
                     f->hbm_eff, f->kernel_overhead_us);
    if (m < 0 || (size_t)m >= cap - (size_t)n) return;
    n += m;
  }
  if (link)
    snprintf(buf + n, cap - (size_t)n, ", link %.3f GB/s %.2f us (all_reduce, %d ranks)", link->beta_GBps,
             link->alpha_s * 1e6, link->group_size);
  else
    snprintf(buf + n, cap - (size_t)n, ", link not measured (1 rank)");
}

int mp_calib_threads_now(void) { return omp_get_max_threads(); }
