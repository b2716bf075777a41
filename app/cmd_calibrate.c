/* meshplan calibrate: measures this machine (calib/calibrate.h) and saves the figures in
 * the planner database, where `meshplan simulate --calibration DB` (and the trainer) picks
 * the newest one of the device up.
 *
 * --device cpu: world size 1 runs without mpirun (no MPI at all: the "single"
 * communicator), which measures the CPU backend's kernels (launch, GEMM, attention,
 * element-wise) and the copy, and fits the meshplan-cpu stack to them. Under `mpirun -np
 * N` every rank measures together and the collectives are timed per group size too;
 * rank 0 prints and writes the database. As in `meshplan train`, the checks that need no
 * measurement (device, options) happen on every rank before any communication, so a bad
 * command line ends every rank at once.
 *
 * --device cuda: one process, one GPU, no MPI. The device and the GPU profile the fit is
 * relative to are checked before the database is touched, so a machine without a GPU
 * gets one line and exit status 2, and no file is created or written. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "calib/calibrate.h"
#include "calib/store.h"
#include "exec/comm/comm.h"
#include "exec/mesh.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cuda/cuda.h"
#include "app/commands.h"
#include "sim/stack.h"

static mp_opt k_opts[] = {
    {"--device", "D", "cpu, or cuda / cuda:N for GPU N (default cpu)", NULL},
    MP_OPT_DB("that stores the calibration (default meshplan.db)"),
    {"--reps", "N", "timed repetitions per figure, median taken (default 5 on cpu, 7 on cuda; 3 with --quick)", NULL},
    MP_OPT_GPU_OF_DEVICE("the efficiencies are relative to"),
    {"--quick", NULL, "a reduced set of shapes (seconds, a rougher fit)", NULL},
    MP_OPT_JSON("the calibration"),
    MP_OPT_END,
};

static mp_cmd_spec k_spec = {
    "calibrate", "Measure this machine for the simulator: the CPU kernels (fitted into the meshplan-cpu stack), "
    "memory and collective rates, or the efficiencies of meshplan's CUDA kernels on a GPU.",
    "--device cpu|cuda[:N] [--db PATH] [--reps N] [--gpu TYPE] [--quick] [--json]   "
    "(mpirun -np N meshplan calibrate --device cpu ... for collectives)",
    k_opts, 0};

static void size_label(double bytes, char *buf, size_t cap) {
  if (bytes >= 1048576.0)
    snprintf(buf, cap, "%g MiB", bytes / 1048576.0);
  else if (bytes >= 1024.0)
    snprintf(buf, cap, "%g KiB", bytes / 1024.0);
  else
    snprintf(buf, cap, "%g B", bytes);
}

/* The GEMM curve's prediction of a point, launch included, as the simulator makes it. */
static double curve_pred_s(const mp_calib *c, int pass, int N, int K, int M, double peak, double eff_max,
                           double half) {
  const double flops = mp_calib_gemm_flops(pass, N, K, M), x = (double)N * K * M;
  return flops / (peak * eff_max) * (1.0 + half / x) + c->launch_s;
}

/* The GEMM points g[n] beside a curve of the fit (eff_max and the knee; rate x scale in
 * unit, efficiency against peak, the curve's efficiency there and its time error). */
static void print_gemm_points(const mp_calib *c, const mp_calib_gemm *g, int n, double peak, double eff_max,
                              double scale, const char *unit) {
  const double half = c->fit.gemm_eff_half_mnk;
  printf("  %-6s %6s %6s %6s %9s %7s %7s %7s\n", "pass", "N", "K", "M", unit, "eff", "curve", "err %");
  for (int i = 0; i < n; i++) {
    const double flops = mp_calib_gemm_flops(g[i].pass, g[i].N, g[i].K, g[i].M), t = flops / g[i].flops_per_s;
    const double x = (double)g[i].N * g[i].K * g[i].M;
    const double pred = curve_pred_s(c, g[i].pass, g[i].N, g[i].K, g[i].M, peak, eff_max, half);
    printf("  %-6s %6d %6d %6d %9.2f %7.3f %7.3f %+7.1f\n", mp_calib_gemm_pass_name(g[i].pass), g[i].N, g[i].K,
           g[i].M, g[i].flops_per_s * scale, g[i].flops_per_s / peak, eff_max * x / (x + half), 100.0 * (pred - t) / t);
  }
}

/* A by-shape correction's verdict (the leave-one-out check). */
static void print_table_verdict(double table_rms, int used) {
  printf("  by shape, leave one out (nearest measured shape of the pass within 4x): rms time error %.1f %%: the "
         "simulator uses %s\n\n", 100.0 * table_rms, used ? "the curve with the by-shape correction"
                                                            : "the curve alone");
}

/* The bf16 GEMM points beside the fit's curve, then the curve and the by-shape
 * correction's verdict. */
static void print_gemm_rows(const mp_calib *c, double peak, double scale, const char *unit) {
  const mp_calib_stack_fit *f = &c->fit;
  print_gemm_points(c, c->gemm, c->n_gemm, peak, f->gemm_eff_max, scale, unit);
  printf("  curve: gemm_eff_max %.3f, gemm_eff_half_mnk %.3g (rms time error %.1f %%)\n", f->gemm_eff_max,
         f->gemm_eff_half_mnk, 100.0 * f->gemm_curve_rms);
  print_table_verdict(f->gemm_table_rms, f->gemm_table);
}

/* The cpu kernels and their fit (a calibration of GEMM and copy only has neither). */
static void print_cpu_kernels(const mp_calib *c) {
  const mp_calib_stack_fit *f = &c->fit;
  const double peak = c->ref_bf16_tflops * 1e12, hbm = c->ref_hbm_GBps;
  printf("every kernel figure: median of the repetitions, per call in a loop of back-to-back calls\n");
  printf("kernel call: %.3f us per call of a kernel doing no work (kernel_overhead_us)\n\n", c->launch_s * 1e6);
  printf("GEMM, fp32 CPU backend (eff = rate / peak; curve = the fit's efficiency there; err = the curve's time "
         "error)\n");
  printf("  peak (every dtype's peak_tflops under --calibration): %.2f GFLOP/s\n", peak * 1e-9);
  print_gemm_rows(c, peak, 1e-9, "GFLOP/s");
  printf("attention, causal (FLOPs as the simulator counts them: forward 2 B T^2 nh hd, backward twice)\n");
  printf("  %-4s %4s %6s %4s %4s %4s %9s %7s %7s\n", "pass", "B", "T", "nh", "nkv", "hd", "GFLOP/s", "eff", "err %");
  for (int i = 0; i < c->n_attn; i++) {
    const mp_calib_attn *a = &c->attn[i];
    const double flops = mp_calib_attn_flops(a->backward, a->B, a->T, a->nh, a->hd), t = flops / a->flops_per_s;
    const double pred = f->attention_eff > 0 ? flops / (peak * f->attention_eff) + c->launch_s : 0.0;
    printf("  %-4s %4d %6d %4d %4d %4d %9.2f %7.3f %+7.1f\n", a->backward ? "bwd" : "fwd", a->B, a->T, a->nh, a->nkv,
           a->hd, a->flops_per_s * 1e-9, a->flops_per_s / peak, 100.0 * (pred - t) / t);
  }
  printf("  attention_eff %.3f (every point weighing the same; a run refits it at its sizes)\n\n", f->attention_eff);
  printf("element-wise kernels (bytes as the simulator counts them; err = the fit's time error, max(flops at the "
         "peak, bytes at hbm_eff x copy) + the call)\n");
  printf("  %-12s %10s %9s %8s %7s\n", "kernel", "elements", "GB/s", "of copy", "err %");
  for (int i = 0; i < c->n_bw; i++) {
    const mp_calib_bw *b = &c->bw[i];
    const double bytes = mp_calib_bw_bytes(b->kernel, b->elems), t = bytes / (b->GBps * 1e9);
    const double tb = f->hbm_eff > 0 && hbm > 0 ? bytes / (hbm * 1e9 * f->hbm_eff) : 0.0;
    const double tf = mp_calib_bw_flops(b->kernel, b->elems) / peak;
    const double pred = (tb > tf ? tb : tf) + c->launch_s;
    printf("  %-12s %10.0f %9.2f %8.2f %+7.1f\n", mp_calib_bw_name(b->kernel), b->elems, b->GBps,
           hbm > 0 ? b->GBps / hbm : 0.0, 100.0 * (pred - t) / t);
  }
  printf("  hbm_eff %.3f (relative to the copy, every point weighing the same; a run refits it at its sizes)\n\n", f->hbm_eff);
}

static void print_table(const mp_calib *c, const char *db, int local_ranks) {
  char line[768];
  mp_calib_summary(c, line, sizeof line);
  printf("calibration %s\n", line);
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  if (cores > 0 && (long)local_ranks * c->threads > cores)
    printf("note: %d ranks x %d threads on %ld cores: oversubscribed, and the figures include that contention; "
           "calibrate with the OMP_NUM_THREADS that training uses (e.g. %ld)\n",
           local_ranks, c->threads, cores, cores / local_ranks > 0 ? cores / local_ranks : 1);
  printf("saved to %s (meshplan simulate ... --calibration %s applies it)\n\n", db, db);
  if (c->fit.gemm_eff_max > 0) {
    print_cpu_kernels(c);
  } else {
    printf("GEMM, fp32 CPU backend (median of reps, %d thread%s per rank)\n", c->threads, c->threads == 1 ? "" : "s");
    printf("  %-6s %6s %6s %6s %10s\n", "pass", "N", "K", "M", "GFLOP/s");
    for (int i = 0; i < c->n_gemm; i++) {
      const mp_calib_gemm *g = &c->gemm[i];
      printf("  %-6s %6d %6d %6d %10.2f\n", mp_calib_gemm_pass_name(g->pass), g->N, g->K, g->M, g->flops_per_s * 1e-9);
    }
    printf("  peak (every dtype's peak_tflops under --calibration): %.2f GFLOP/s\n\n",
           mp_calib_cpu_peak_flops(c) * 1e-9);
  }
  printf("memory copy: %.2f GB/s (bytes read + written; hbm_GBps under --calibration)\n", c->copy_GBps);
  if (c->fit.gemm_eff_max > 0) {
    mp_ctx ctx;
    mp_ctx_init(&ctx);
    mp_stack_profile st;
    if (mp_stack_load(&ctx, "meshplan-cpu", &st) == MP_OK) {
      const mp_calib_stack_fit *f = &c->fit;
      printf("\nmeshplan-cpu under --calibration (stated without it):\n");
      printf("  gemm_eff_max %.3f (%.3f), gemm_eff_half_mnk %.3g (%.3g), attention_eff %.3f (%.3f), hbm_eff %.3f "
             "(%.3f), fp8_gemm_eff_max %.3f (%.3f), kernel_overhead_us %.3f (%.3f)\n", f->gemm_eff_max,
             st.gemm_eff_max, f->gemm_eff_half_mnk, st.gemm_eff_half_mnk, f->attention_eff, st.attention_eff,
             f->hbm_eff, st.hbm_eff, f->fp8_gemm_eff_max, st.fp8_gemm_eff_max, f->kernel_overhead_us,
             st.kernel_overhead_s * 1e6);
    }
  }
  if (c->n_coll == 0) {
    printf("\ncollectives: not measured with 1 rank (mpirun -np N meshplan calibrate ... measures them)\n");
    return;
  }
  printf("\ncollectives: bus GB/s per payload (nccl-tests convention), alpha-beta fit\n"
         "  t = f*bytes/beta + c*alpha (all_reduce f = 2(g-1)/g, c = 2(g-1); others (g-1)/g, g-1)\n");
  const mp_calib_coll_fit *f0 = &c->coll[0];
  printf("  %5s %-15s", "group", "collective");
  for (int k = 0; k < f0->n_sizes; k++) {
    char lab[32];
    size_label(f0->bytes[k], lab, sizeof lab);
    printf(" %9s", lab);
  }
  printf(" %10s %9s %10s\n", "small us", "alpha us", "beta GB/s");
  for (int i = 0; i < c->n_coll; i++) {
    const mp_calib_coll_fit *f = &c->coll[i];
    printf("  %5d %-15s", f->group_size, mp_calib_coll_name(f->coll));
    for (int k = 0; k < f->n_sizes; k++) printf(" %9.3f", f->busbw_GBps[k]);
    printf(" %10.1f %9.2f %10.3f\n", f->time_s[0] * 1e6, f->alpha_s * 1e6, f->beta_GBps);
  }
  const mp_calib_coll_fit *l = mp_calib_link_fit(c);
  if (l)
    printf("\nsimulator link (one intra-node bandwidth and latency): the all_reduce fit at %d ranks, %.3f GB/s, "
           "%.2f us\n", l->group_size, l->beta_GBps, l->alpha_s * 1e6);
}

static void print_table_cuda(const mp_calib *c, const char *db) {
  char line[768];
  const mp_calib_stack_fit *f = &c->fit;
  mp_calib_summary(c, line, sizeof line);
  printf("calibration %s\n", line);
  printf("saved to %s (meshplan simulate --gpu %s --stack meshplan-cuda --calibration %s applies it)\n\n", db,
         c->gpu_profile, db);
  printf("efficiencies are relative to the %s profile's datasheet figures: bf16 %.1f TFLOP/s, fp8 %.1f TFLOP/s, "
         "HBM %.0f GB/s\n", c->gpu_profile, c->ref_bf16_tflops, c->ref_fp8_tflops, c->ref_hbm_GBps);
  printf("every figure: median of the repetitions, per call in a loop of back-to-back calls (CUDA events)\n\n");
  printf("kernel launch: %.2f us per call of an empty kernel (kernel_overhead_us)\n\n", c->launch_s * 1e6);

  const double peak = c->ref_bf16_tflops * 1e12;
  printf("GEMM, bf16 (eff = rate / datasheet; curve = the fit's efficiency there; err = the curve's time error)\n");
  print_gemm_rows(c, peak, 1e-12, "TFLOP/s");

  printf("attention, causal (FLOPs as the simulator counts them: forward 2 B T^2 nh hd, backward twice)\n");
  if (c->n_attn == 0) {
    printf("  not measured: %s (attention_eff stays the stack's)\n\n",
           c->attn_unavailable[0] ? c->attn_unavailable : "no points");
  } else {
    printf("  %-4s %4s %6s %4s %4s %4s %9s %7s\n", "pass", "B", "T", "nh", "nkv", "hd", "TFLOP/s", "eff");
    for (int i = 0; i < c->n_attn; i++) {
      const mp_calib_attn *a = &c->attn[i];
      printf("  %-4s %4d %6d %4d %4d %4d %9.1f %7.3f\n", a->backward ? "bwd" : "fwd", a->B, a->T, a->nh, a->nkv,
             a->hd, a->flops_per_s * 1e-12, a->flops_per_s / peak);
    }
    printf("  attention_eff %.3f (FLOP total over time total)\n\n", f->attention_eff);
  }

  printf("memory bandwidth (bytes as the simulator counts them)\n");
  printf("  %-12s %12s %9s %8s %10s\n", "kernel", "elements", "GB/s", "of copy", "of HBM");
  printf("  %-12s %12s %9.0f %8.2f %10.3f\n", "copy (d2d)", "-", c->copy_GBps, 1.0, c->copy_GBps / c->ref_hbm_GBps);
  for (int i = 0; i < c->n_bw; i++) {
    const mp_calib_bw *b = &c->bw[i];
    printf("  %-12s %12.0f %9.0f %8.2f %10.3f\n", mp_calib_bw_name(b->kernel), b->elems, b->GBps,
           c->copy_GBps > 0 ? b->GBps / c->copy_GBps : 0.0, b->GBps / c->ref_hbm_GBps);
  }
  printf("  hbm_eff %.3f (the kernels' bytes over their time, against the datasheet; the copy is the reference)\n\n",
         f->hbm_eff);

  printf("float8 GEMM as the runtime runs it: fwd E4M3 x E4M3 (fast accumulation), dgrad and wgrad E5M2 x E4M3 "
         "(eff against the fp8 datasheet peak; curve and err as for bf16)\n");
  if (c->n_f8 == 0) {
    printf("  not measured: %s (fp8_gemm_eff_max stays the stack's)\n\n",
           c->f8_unavailable[0] ? c->f8_unavailable : "no points");
  } else {
    print_gemm_points(c, c->f8, c->n_f8, c->ref_fp8_tflops * 1e12, f->fp8_gemm_eff_max, 1e-12, "TFLOP/s");
    printf("  curve: fp8_gemm_eff_max %.3f with the bf16 curve's half_mnk (rms time error %.1f %%)\n",
           f->fp8_gemm_eff_max, 100.0 * f->fp8_gemm_curve_rms);
    print_table_verdict(f->fp8_gemm_table_rms, f->fp8_gemm_table);
  }

  /* what --calibration changes, beside what the stack states without it */
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_stack_profile st;
  if (mp_stack_load(&ctx, "meshplan-cuda", &st) == MP_OK) {
    printf("meshplan-cuda under --calibration (stated without it):\n");
    printf("  gemm_eff_max %.3f (%.3f), gemm_eff_half_mnk %.3g (%.3g), attention_eff ", f->gemm_eff_max,
           st.gemm_eff_max, f->gemm_eff_half_mnk, st.gemm_eff_half_mnk);
    if (f->attention_eff > 0) printf("%.3f", f->attention_eff);
    else printf("kept");
    printf(" (%.3f), hbm_eff %.3f (%.3f), fp8_gemm_eff_max ", st.attention_eff, f->hbm_eff, st.hbm_eff);
    if (f->fp8_gemm_eff_max > 0) printf("%.3f", f->fp8_gemm_eff_max);
    else printf("kept");
    printf(" (%.3f), kernel_overhead_us %.2f (%.2f)\n", st.fp8_gemm_eff_max, f->kernel_overhead_us,
           st.kernel_overhead_s * 1e6);
  }
}

/* The kernels and the fit (cuda; cpu with a fit), and what only cuda has. */
static void json_kernels(cJSON *j, const mp_calib *c) {
  const int cuda = strcmp(c->device, "cuda") == 0;
  if (cuda) {
    cJSON_AddStringToObject(j, "gpu_name", c->gpu_name);
    cJSON_AddStringToObject(j, "gpu_profile", c->gpu_profile);
    cJSON_AddNumberToObject(j, "compute_capability", c->compute_capability);
  }
  cJSON_AddNumberToObject(j, "ref_bf16_tflops", c->ref_bf16_tflops);
  cJSON_AddNumberToObject(j, "ref_fp8_tflops", c->ref_fp8_tflops);
  cJSON_AddNumberToObject(j, "ref_hbm_GBps", c->ref_hbm_GBps);
  cJSON_AddNumberToObject(j, "launch_s", c->launch_s);
  cJSON *as = cJSON_AddArrayToObject(j, "attention");
  for (int i = 0; as && i < c->n_attn; i++) {
    const mp_calib_attn *a = &c->attn[i];
    cJSON *o = cJSON_CreateObject();
    if (!o) break;
    cJSON_AddStringToObject(o, "pass", a->backward ? "bwd" : "fwd");
    cJSON_AddNumberToObject(o, "B", a->B);
    cJSON_AddNumberToObject(o, "T", a->T);
    cJSON_AddNumberToObject(o, "nh", a->nh);
    cJSON_AddNumberToObject(o, "nkv", a->nkv);
    cJSON_AddNumberToObject(o, "hd", a->hd);
    cJSON_AddNumberToObject(o, "flops_per_s", a->flops_per_s);
    cJSON_AddItemToArray(as, o);
  }
  if (c->attn_unavailable[0]) cJSON_AddStringToObject(j, "attention_unavailable", c->attn_unavailable);
  cJSON *bs = cJSON_AddArrayToObject(j, "bandwidth");
  for (int i = 0; bs && i < c->n_bw; i++) {
    cJSON *o = cJSON_CreateObject();
    if (!o) break;
    cJSON_AddStringToObject(o, "kernel", mp_calib_bw_name(c->bw[i].kernel));
    cJSON_AddNumberToObject(o, "elements", c->bw[i].elems);
    cJSON_AddNumberToObject(o, "GBps", c->bw[i].GBps);
    cJSON_AddItemToArray(bs, o);
  }
  cJSON *fs = cuda ? cJSON_AddArrayToObject(j, "f8_gemm") : NULL;
  for (int i = 0; fs && i < c->n_f8; i++) {
    cJSON *o = cJSON_CreateObject();
    if (!o) break;
    cJSON_AddStringToObject(o, "pass", mp_calib_gemm_pass_name(c->f8[i].pass));
    cJSON_AddNumberToObject(o, "N", c->f8[i].N);
    cJSON_AddNumberToObject(o, "K", c->f8[i].K);
    cJSON_AddNumberToObject(o, "M", c->f8[i].M);
    cJSON_AddNumberToObject(o, "flops_per_s", c->f8[i].flops_per_s);
    cJSON_AddItemToArray(fs, o);
  }
  if (c->f8_unavailable[0]) cJSON_AddStringToObject(j, "f8_unavailable", c->f8_unavailable);
  cJSON *f = cJSON_AddObjectToObject(j, "fit");
  if (f) {
    cJSON_AddNumberToObject(f, "gemm_eff_max", c->fit.gemm_eff_max);
    cJSON_AddNumberToObject(f, "gemm_eff_half_mnk", c->fit.gemm_eff_half_mnk);
    cJSON_AddNumberToObject(f, "gemm_curve_rms", c->fit.gemm_curve_rms);
    cJSON_AddNumberToObject(f, "gemm_table_rms", c->fit.gemm_table_rms);
    cJSON_AddBoolToObject(f, "gemm_table", c->fit.gemm_table);
    cJSON_AddNumberToObject(f, "fp8_gemm_eff_max", c->fit.fp8_gemm_eff_max);
    if (cuda) {
      cJSON_AddNumberToObject(f, "fp8_gemm_curve_rms", c->fit.fp8_gemm_curve_rms);
      cJSON_AddNumberToObject(f, "fp8_gemm_table_rms", c->fit.fp8_gemm_table_rms);
      cJSON_AddBoolToObject(f, "fp8_gemm_table", c->fit.fp8_gemm_table);
    }
    cJSON_AddNumberToObject(f, "attention_eff", c->fit.attention_eff);
    cJSON_AddNumberToObject(f, "hbm_eff", c->fit.hbm_eff);
    cJSON_AddNumberToObject(f, "kernel_overhead_us", c->fit.kernel_overhead_us);
  }
}

static int print_json(const mp_calib *c, const char *db) {
  cJSON *j = cJSON_CreateObject();
  if (j == NULL) return 1;
  cJSON_AddNumberToObject(j, "id", (double)c->id);
  cJSON_AddStringToObject(j, "db", db);
  cJSON_AddStringToObject(j, "created_at", c->created_at);
  cJSON_AddStringToObject(j, "device", c->device);
  cJSON_AddStringToObject(j, "host", c->host);
  cJSON_AddNumberToObject(j, "threads", c->threads);
  cJSON_AddNumberToObject(j, "world", c->world);
  cJSON *gs = cJSON_AddArrayToObject(j, "gemm");
  for (int i = 0; gs && i < c->n_gemm; i++) {
    cJSON *g = cJSON_CreateObject();
    if (!g) break;
    cJSON_AddStringToObject(g, "op", c->gemm[i].pass == MP_CALIB_GEMM_FWD ? "matmul_forward" : "matmul_backward");
    cJSON_AddStringToObject(g, "pass", mp_calib_gemm_pass_name(c->gemm[i].pass));
    cJSON_AddNumberToObject(g, "N", c->gemm[i].N);
    cJSON_AddNumberToObject(g, "K", c->gemm[i].K);
    cJSON_AddNumberToObject(g, "M", c->gemm[i].M);
    cJSON_AddNumberToObject(g, "flops_per_s", c->gemm[i].flops_per_s);
    cJSON_AddItemToArray(gs, g);
  }
  cJSON_AddNumberToObject(j, "gemm_peak_flops_per_s", strcmp(c->device, "cpu") == 0 ? mp_calib_cpu_peak_flops(c)
                                                                                  : mp_calib_gemm_peak_flops(c));
  cJSON_AddNumberToObject(j, "copy_GBps", c->copy_GBps);
  cJSON *cs = cJSON_AddArrayToObject(j, "collectives");
  for (int i = 0; cs && i < c->n_coll; i++) {
    const mp_calib_coll_fit *f = &c->coll[i];
    cJSON *o = cJSON_CreateObject();
    if (!o) break;
    cJSON_AddStringToObject(o, "collective", mp_calib_coll_name(f->coll));
    cJSON_AddNumberToObject(o, "group_size", f->group_size);
    cJSON *pts = cJSON_AddArrayToObject(o, "points");
    for (int k = 0; pts && k < f->n_sizes; k++) {
      cJSON *p = cJSON_CreateObject();
      if (!p) break;
      cJSON_AddNumberToObject(p, "bytes", f->bytes[k]);
      cJSON_AddNumberToObject(p, "time_s", f->time_s[k]);
      cJSON_AddNumberToObject(p, "busbw_GBps", f->busbw_GBps[k]);
      cJSON_AddItemToArray(pts, p);
    }
    cJSON_AddNumberToObject(o, "alpha_s", f->alpha_s);
    cJSON_AddNumberToObject(o, "beta_GBps", f->beta_GBps);
    cJSON_AddItemToArray(cs, o);
  }
  if (strcmp(c->device, "cuda") == 0 || c->fit.gemm_eff_max > 0) json_kernels(j, c);
  return mp_cmd_print_json(j);
}

/* Saves cal in db and prints it (table or --json). */
static mp_status save_and_print(mp_ctx *ctx, const char *db, mp_calib *cal, int local_ranks) {
  MP_CHECK(mp_calib_store_save(ctx, db, cal));
  if (mp_args_has(&k_spec, "--json")) {
    if (print_json(cal, db) != 0) return mp_error(ctx, MP_ERR_NOMEM, "out of memory printing JSON");
  } else if (strcmp(cal->device, "cuda") == 0) {
    print_table_cuda(cal, db);
  } else {
    print_table(cal, db, local_ranks);
  }
  return MP_OK;
}

/* --reps over the device's default, into o. */
static mp_status read_reps(mp_ctx *ctx, mp_calib_options *o) {
  long long reps = o->reps;
  /* each rep is a timed call; 10^4 of the slowest point take minutes already */
  MP_CHECK(mp_args_int(ctx, &k_spec, "--reps", 1, 10000, &reps));
  o->reps = (int)reps;
  return MP_OK;
}

/* The exit code of a failed calibration (mp_status_exit_code). quiet: another rank reports
 * it. */
static int fail(const mp_ctx *ctx, mp_status st, int quiet) {
  return quiet ? mp_status_exit_code(st) : mp_cmd_fail(ctx, st);
}

/* --device cuda[:N]: one GPU, no MPI. The device and the profile are checked before the
 * database: a machine without a GPU gets one line, and no file is created. */
static int calibrate_cuda(mp_ctx *ctx, int device) {
  mp_status st = MP_OK;
  mp_comm *comm = NULL;
  mp_kctx kc = {ctx, NULL, 0};
  const mp_backend *be = NULL;
  int be_up = 0;
  mp_calib *cal = NULL;
  mp_calib_options o;
  mp_calib_options_init_cuda(&o, mp_args_has(&k_spec, "--quick"));
  o.device = device;
  MP_CHECK_GOTO(read_reps(ctx, &o), st, out);
  const char *gpu = mp_args_get(&k_spec, "--gpu");
  if (gpu) snprintf(o.gpu_profile, sizeof o.gpu_profile, "%s", gpu);
  const char *db = mp_cmd_db_path(&k_spec);
  mp_launch launch;
  mp_cmd_launch(&launch);
  if (launch.world > 1) {
    st = mp_error(ctx, MP_ERR_USAGE, "--device cuda measures one GPU; run it as one process "
                  "(without mpirun), once per GPU type");
    goto out;
  }
  mp_calib_device dev;
  mp_gpu prof;
  MP_CHECK_GOTO(mp_calib_cuda_probe(ctx, device, &dev), st, out);
  MP_CHECK_GOTO(mp_calib_cuda_profile(ctx, &dev, o.gpu_profile, &prof), st, out);
  snprintf(o.gpu_profile, sizeof o.gpu_profile, "%s", gpu ? gpu : prof.name);
  be = mp_cuda_backend();
  if (be == NULL) {
    st = mp_error(ctx, MP_ERR_UNSUPPORTED, "this meshplan was built without CUDA; rebuild with the CUDA toolkit");
    goto out;
  }
  MP_CHECK_GOTO(mp_calib_store_check(ctx, db), st, out);
  mp_mesh mesh;
  mp_mesh_init(&mesh);
  MP_CHECK_GOTO(mp_comm_create_single(ctx, &mesh, &comm), st, out);
  MP_CHECK_GOTO(be->init(&kc, device), st, out);
  be_up = 1;
  cal = malloc(sizeof *cal);
  if (cal == NULL) {
    st = mp_error(ctx, MP_ERR_NOMEM, "out of memory");
    goto out;
  }
  fprintf(stderr, "calibrating %s against the %s datasheet: %d GEMM, %d attention, %d float8 points, %d reps\n",
          dev.name, prof.name, o.n_gemm, 2 * o.n_attn, o.n_f8, o.reps);
  MP_CHECK_GOTO(mp_calib_measure(ctx, comm, be, &kc, &o, cal), st, out);
  st = save_and_print(ctx, db, cal, 1);
out:
  if (be_up) be->shutdown(&kc);
  mp_comm_destroy(comm);
  free(cal);
  return st == MP_OK ? 0 : fail(ctx, st, 0);
}

/* The communicator of a cpu calibration: MPI over the ranks mpirun started (one dp_shard
 * group of them all), or "single" when the process runs alone. */
static mp_status open_comm(mp_ctx *ctx, int under_mpi, mp_comm **comm) {
  mp_mesh mesh;
  mp_mesh_init(&mesh);
  if (!under_mpi) return mp_comm_create_single(ctx, &mesh, comm);
  /* The mesh must match the world: ask MPI how many ranks it started. */
  int world = 1;
  MP_CHECK(mp_comm_mpi_world(ctx, NULL, &world));
  mesh.size[MP_DIM_DP_SHARD] = world;
  return mp_comm_create_mpi(ctx, &mesh, comm);
}

/* Rank 0 checks the database before minutes of measuring; every rank learns the verdict
 * from one all-reduce, so all stop together and none waits on another. */
static mp_status check_db_everywhere(mp_ctx *ctx, mp_comm *comm, const char *db) {
  const int rank = mp_comm_world_rank(comm);
  int64_t bad = 0;
  mp_status st0 = MP_OK;
  if (rank == 0) {
    st0 = mp_calib_store_check(ctx, db);
    bad = st0 != MP_OK;
  }
  MP_CHECK(mp_comm_all_reduce(ctx, comm, MP_GROUP_WORLD, &bad, &bad, 1, MP_COMM_DTYPE_INT64, MP_COMM_OP_MAX));
  if (!bad) return MP_OK;
  return rank == 0 ? st0 : mp_error(ctx, MP_ERR_INVALID, "rank 0 could not use the database");
}

/* --device cpu: every rank measures; rank 0 saves and prints. */
static int calibrate_cpu(mp_ctx *ctx) {
  mp_status st = MP_OK;
  int reported = 0, code = 0;
  mp_comm *comm = NULL;
  int mpi = 0, rank = 0, be_up = 0;
  mp_kctx kc = {ctx, NULL, 0};
  const mp_backend *be = mp_backend_cpu();
  mp_calib cal;
  if (mp_args_has(&k_spec, "--gpu")) {
    st = mp_error(ctx, MP_ERR_USAGE, "--gpu is for --device cuda");
    goto out;
  }
  mp_calib_options o;
  mp_calib_options_init_cpu(&o, mp_args_has(&k_spec, "--quick"));
  MP_CHECK_GOTO(read_reps(ctx, &o), st, out);
  const char *db = mp_cmd_db_path(&k_spec);
  mp_launch launch;
  mp_cmd_launch(&launch);
  mpi = launch.under_mpi;
  MP_CHECK_GOTO(open_comm(ctx, mpi, &comm), st, out);
  rank = mp_comm_world_rank(comm);
  MP_CHECK_GOTO(check_db_everywhere(ctx, comm, db), st, out);
  MP_CHECK_GOTO(be->init(&kc, 0), st, out);
  be_up = 1;
  MP_CHECK_GOTO(mp_calib_measure(ctx, comm, be, &kc, &o, &cal), st, out);
  if (rank == 0) st = save_and_print(ctx, db, &cal, mp_comm_local_size(comm));
out:
  /* a stuck or dead peer: the job ends here (MPI_Finalize below would wait for it) */
  if (mpi && (st == MP_ERR_TIMEOUT || st == MP_ERR_MPI)) {
    code = mp_cmd_fail_job(ctx, st, 1);
    reported = 1;
  }
  if (be_up) be->shutdown(&kc);
  mp_comm_destroy(comm);
  if (mpi) {
    mp_ctx c2;
    mp_ctx_init(&c2);
    mp_comm_mpi_finalize(&c2);
  }
  /* Other ranks stay quiet unless their error is their own (rank 0 reports the shared one). */
  if (reported) return code;
  return st == MP_OK ? 0 : fail(ctx, st, rank != 0 && st == MP_ERR_INVALID);
}

static int run_calibrate(mp_ctx *ctx, const mp_cmd_call *call) {
  (void)call;
  const char *device = mp_args_get(&k_spec, "--device");
  if (device && strncmp(device, "cuda", 4) == 0) {
    char *end = NULL;
    long n = device[4] == ':' ? strtol(device + 5, &end, 10) : 0;
    if (device[4] == '\0' || (device[4] == ':' && end != device + 5 && *end == '\0' && n >= 0 && n < 1024))
      return calibrate_cuda(ctx, (int)n);
  }
  if (device && strcmp(device, "cpu") != 0)
    return fail(ctx, mp_error(ctx, MP_ERR_USAGE, "--device %s: choose cpu, cuda or cuda:N (N in 0..1023)", device), 0);
  return calibrate_cpu(ctx);
}

const mp_command mp_command_calibrate = {&k_spec, "measure GEMM rates and collective bandwidths for the simulator",
                                         run_calibrate};
