/* The fits: the alpha-beta model of each collective's times, and the stack fit shared
 * by both devices (the GEMM curve, the by-shape correction, attention, HBM, float8), with
 * a cpu calibration's refit at a run's sizes. docs/calibration.md, "The fit", gives the
 * models and the reasons for them.
 *
 * Invariant: every fit reads only the calibration's points and ref_* figures; none
 * measures or writes anything but its output. */
#include "calib/calibrate.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- collectives: alpha and beta ------------------------------------------------------ */

mp_status mp_calib_fit(mp_ctx *ctx, mp_calib_coll_fit *f) {
  const int g = f->group_size;
  const double bf = mp_calib_bw_factor(f->coll, g), cs = mp_calib_lat_steps(f->coll, g);
  if (f->n_sizes < 1 || g < 2)
    return mp_error(ctx, MP_ERR_INVALID, "calibrate: a %s fit needs a group of >= 2 ranks and >= 1 size",
                    mp_calib_coll_name(f->coll));
  /* Minimise sum_i (1 - u_i b - v_i a)^2 with u_i = x_i / t_i, v_i = c / t_i, x_i = f bytes_i:
   * the relative error of t = x b + c a, b = 1/beta (s/byte), a = alpha (s). */
  double suu = 0, suv = 0, svv = 0, su = 0, sv = 0;
  for (int i = 0; i < f->n_sizes; i++) {
    if (!(f->time_s[i] > 0) || !(f->bytes[i] > 0))
      return mp_error(ctx, MP_ERR_INVALID, "calibrate: %s at %.0f bytes took %g s; sizes and times must be > 0",
                      mp_calib_coll_name(f->coll), f->bytes[i], f->time_s[i]);
    double x = bf * f->bytes[i];
    f->busbw_GBps[i] = x / f->time_s[i] * 1e-9;
    double u = x / f->time_s[i], v = cs / f->time_s[i];
    suu += u * u;
    suv += u * v;
    svv += v * v;
    su += u;
    sv += v;
  }
  double det = suu * svv - suv * suv, a = 0, b = 0;
  if (f->n_sizes >= 2 && det > 1e-12 * suu * svv) {
    b = (su * svv - sv * suv) / det;
    a = (suu * sv - suv * su) / det;
  }
  if (!(a > 0) || !(b > 0)) { /* one size, or the intercept came out negative: through the origin */
    a = 0;
    b = su / suu;
  }
  f->alpha_s = a;
  f->beta_GBps = 1.0 / b * 1e-9;
  return MP_OK;
}

/* ---- the stack fit (both devices) ----------------------------------------------------- */

static int is_linear_pass(int pass) {
  return pass == MP_CALIB_GEMM_FWD || pass == MP_CALIB_GEMM_DGRAD || pass == MP_CALIB_GEMM_WGRAD;
}

/* What the simulator calls compute: the measured time less the launch figure that it
 * adds to every op. At least half the time stays: the launch figure is another kernel's
 * median, and its noise must not leave a point with no time at all. */
static double compute_time(double t_s, double overhead_s) {
  double c = t_s - overhead_s;
  return c > 0.5 * t_s ? c : 0.5 * t_s;
}

/* The curve's compute time for a GEMM of `flops` and size x = N K M. */
static double curve_time(double flops, double x, double peak, double eff_max, double half) {
  return flops / (peak * eff_max) * (1.0 + half / x);
}

/* A fitted curve and what it is relative to: the bf16 one (ref_bf16, gemm_eff_max) or the
 * float8 one (ref_fp8, fp8_gemm_eff_max), with the one knee and the launch figure the
 * simulator adds to every op. */
typedef struct gemm_curve {
  double peak, eff_max, half, ovh;
} gemm_curve;

static gemm_curve bf16_curve(const mp_calib *c) {
  gemm_curve cv = {c->ref_bf16_tflops * 1e12, c->fit.gemm_eff_max, c->fit.gemm_eff_half_mnk, c->launch_s};
  return cv;
}

static gemm_curve fp8_curve(const mp_calib *c) {
  gemm_curve cv = {c->ref_fp8_tflops * 1e12, c->fit.fp8_gemm_eff_max, c->fit.gemm_eff_half_mnk, c->launch_s};
  return cv;
}

/* A point a by-shape table takes: one of the schedule's three GEMMs, with a rate. */
static int table_takes(const mp_calib_gemm *g) { return is_linear_pass(g->pass) && g->flops_per_s > 0; }

/* rms of (curve + launch - measured) / measured over the points of g with a rate (0
 * without one). */
static double curve_rms(const mp_calib_gemm *g, int n, const gemm_curve *cv) {
  double se = 0;
  int k = 0;
  for (int i = 0; i < n; i++) {
    if (!(g[i].flops_per_s > 0)) continue;
    const double flops = mp_calib_gemm_flops(g[i].pass, g[i].N, g[i].K, g[i].M);
    const double x = (double)g[i].N * g[i].K * g[i].M, t = flops / g[i].flops_per_s;
    const double e = (curve_time(flops, x, cv->peak, cv->eff_max, cv->half) + cv->ovh - t) / t;
    se += e * e;
    k++;
  }
  return k > 0 ? sqrt(se / k) : 0.0;
}

/* The curve's least squares without the ceiling: E and h of eff(x) = E x / (x + h)
 * against peak_flops (h >= 0; E may exceed 1). sp, spq, ... are returned for the refit
 * at E = 1. */
typedef struct curve_sums {
  double spp, spq, sqq, sp, sq;
} curve_sums;

static mp_status curve_lsq(mp_ctx *ctx, const mp_calib_gemm *g, int n, double peak_flops, double overhead_s,
                           double *E, double *h, curve_sums *out) {
  if (n < 1 || !(peak_flops > 0))
    return mp_error(ctx, MP_ERR_INVALID, "calibrate: the GEMM curve needs >= 1 point and a peak (got %d, %g)", n,
                    peak_flops);
  /* pred/meas of point i = a p_i + b q_i with a = 1/E, b = h/E, y_i = tc_i peak / flops_i
   * (the inverse of its efficiency), p_i = 1/y_i, q_i = 1/(x_i y_i): minimise
   * sum (a p_i + b q_i - 1)^2, the relative error of the compute time. */
  curve_sums z = {0, 0, 0, 0, 0};
  for (int i = 0; i < n; i++) {
    const double flops = mp_calib_gemm_flops(g[i].pass, g[i].N, g[i].K, g[i].M);
    const double x = (double)g[i].N * g[i].K * g[i].M;
    if (!(g[i].flops_per_s > 0) || !(x > 0))
      return mp_error(ctx, MP_ERR_INVALID, "calibrate: GEMM %s %dx%dx%d has rate %g; rates must be > 0",
                      mp_calib_gemm_pass_name(g[i].pass), g[i].N, g[i].K, g[i].M, g[i].flops_per_s);
    const double tc = compute_time(flops / g[i].flops_per_s, overhead_s);
    const double y = tc * peak_flops / flops, p = 1.0 / y, q = 1.0 / (x * y);
    z.spp += p * p;
    z.spq += p * q;
    z.sqq += q * q;
    z.sp += p;
    z.sq += q;
  }
  double det = z.spp * z.sqq - z.spq * z.spq, a = 0, b = 0;
  if (n >= 2 && det > 1e-12 * z.spp * z.sqq) {
    a = (z.sp * z.sqq - z.sq * z.spq) / det;
    b = (z.spp * z.sq - z.spq * z.sp) / det;
  }
  if (!(a > 0) || !(b > 0)) { /* one point, one size, or small GEMMs faster than the line: no knee */
    b = 0;
    a = z.sp / z.spp;
  }
  *E = 1.0 / a;
  *h = b / a;
  if (out) *out = z;
  return MP_OK;
}

mp_status mp_calib_fit_gemm_curve(mp_ctx *ctx, const mp_calib_gemm *g, int n, double peak_flops,
                                  double overhead_s, double *eff_max, double *half_mnk, double *rms_rel) {
  double E, h;
  curve_sums z;
  MP_CHECK(curve_lsq(ctx, g, n, peak_flops, overhead_s, &E, &h, &z));
  if (E > 1.0) {
    /* The datasheet peak is the ceiling: E = 1 (a = 1), h refitted alone. */
    E = 1.0;
    h = z.sqq > 0 ? (z.sq - z.spq) / z.sqq : 0.0; /* argmin_b sum (p + b q - 1)^2 */
    if (!(h > 0)) h = 0;
  }
  *eff_max = E;
  *half_mnk = h;
  if (rms_rel) {
    const gemm_curve cv = {peak_flops, E, h, overhead_s};
    *rms_rel = curve_rms(g, n, &cv);
  }
  return MP_OK;
}

/* The schedule's (variant, m, n, k) of a Linear GEMM (exec/schedule.c linear_fwd /
 * linear_bwd): forward [N, K] x [K, M]; dgrad [N, M] x [M, K]; wgrad [M, N] x [N, K]. */
static void sched_shape(int pass, int N, int K, int M, int *variant, double *m, double *n, double *k) {
  switch (pass) {
    case MP_CALIB_GEMM_DGRAD:
      *variant = MP_VAR_DGRAD, *m = N, *n = K, *k = M;
      break;
    case MP_CALIB_GEMM_WGRAD:
      *variant = MP_VAR_WGRAD, *m = M, *n = K, *k = N;
      break;
    default:
      *variant = MP_VAR_FWD, *m = N, *n = M, *k = K;
      break;
  }
}

/* One point of a table: log2(measured / curve efficiency), at the schedule's shape. */
static void table_point(const mp_calib_gemm *g, const gemm_curve *cv, mp_gemm_table_point *pt) {
  const double flops = mp_calib_gemm_flops(g->pass, g->N, g->K, g->M);
  const double x = (double)g->N * g->K * g->M;
  const double tc = compute_time(flops / g->flops_per_s, cv->ovh);
  const double tcurve = curve_time(flops, x, cv->peak, cv->eff_max, cv->half);
  int variant;
  double m, n, k;
  sched_shape(g->pass, g->N, g->K, g->M, &variant, &m, &n, &k);
  pt->variant = variant;
  pt->lm = log2(m);
  pt->ln = log2(n);
  pt->lk = log2(k);
  pt->log2_ratio = log2(tcurve / tc);
}

_Static_assert(MP_CALIB_MAX_GEMM <= MP_GEMM_TABLE_MAX && MP_CALIB_MAX_F8 <= MP_GEMM_TABLE_MAX,
               "a table holds every GEMM point of a calibration");

/* Every point of g a table takes, in order, against cv (empty without a curve). */
static void table_build(const mp_calib_gemm *g, int n, const gemm_curve *cv, mp_gemm_table *t) {
  memset(t, 0, sizeof *t);
  if (!(cv->peak > 0) || !(cv->eff_max > 0)) return;
  for (int i = 0; i < n && t->n < MP_GEMM_TABLE_MAX; i++)
    if (table_takes(&g[i])) table_point(&g[i], cv, &t->pt[t->n++]);
}

void mp_calib_gemm_table(const mp_calib *c, mp_gemm_table *t) {
  const gemm_curve cv = bf16_curve(c);
  table_build(c->gemm, c->n_gemm, &cv, t);
}

void mp_calib_fp8_gemm_table(const mp_calib *c, mp_gemm_table *t) {
  const gemm_curve cv = fp8_curve(c);
  table_build(c->f8, c->n_f8, &cv, t);
}

/* Leave-one-out check of a by-shape correction: each point of g the table takes,
 * predicted by the curve times the correction of the other points, against its
 * measurement (launch included), into *rms (the rms relative error; a point with no
 * neighbour is predicted by the curve). */
static mp_status table_loo_rms(mp_ctx *ctx, const mp_calib_gemm *g, int n, const gemm_curve *cv, double *rms) {
  mp_gemm_table *all = malloc(sizeof *all), *rest = malloc(sizeof *rest);
  if (!all || !rest) {
    free(all);
    free(rest);
    return mp_error(ctx, MP_ERR_NOMEM, "calibrate: out of memory for the by-shape GEMM check");
  }
  table_build(g, n, cv, all);
  double se = 0;
  int j = 0; /* index of the current point in `all` (the same order) */
  for (int i = 0; i < n && j < all->n; i++) {
    if (!table_takes(&g[i])) continue;
    rest->n = 0;
    for (int q = 0; q < all->n; q++)
      if (q != j) rest->pt[rest->n++] = all->pt[q];
    const double flops = mp_calib_gemm_flops(g[i].pass, g[i].N, g[i].K, g[i].M);
    const double x = (double)g[i].N * g[i].K * g[i].M, t = flops / g[i].flops_per_s;
    int variant;
    double m, nn, k;
    sched_shape(g[i].pass, g[i].N, g[i].K, g[i].M, &variant, &m, &nn, &k);
    const double f = mp_gemm_table_factor(rest, variant, m, nn, k);
    const double pred = curve_time(flops, x, cv->peak, cv->eff_max, cv->half) / f + cv->ovh;
    se += (pred - t) / t * ((pred - t) / t);
    j++;
  }
  free(all);
  free(rest);
  *rms = j > 0 ? sqrt(se / j) : 0.0;
  return MP_OK;
}

/* Whether a by-shape correction is worth using: it predicts shapes it did not see
 * clearly better than its curve, by a tenth and by a percentage point of time at least
 * (less is timing noise, and a table the curve would do as well is a complication for
 * nothing). */
static int table_pays(double curve_rms_rel, double table_rms_rel) {
  return table_rms_rel < 0.9 * curve_rms_rel && curve_rms_rel - table_rms_rel > 0.01;
}

/* 1/c minimising sum_i (c w_i - 1)^2, c = sum w / sum w^2: the efficiency E that makes
 * the relative time errors of points of efficiencies w_i (each measured against E = 1)
 * smallest, every point weighing the same. 0 when there is no point. */
static double eff_lsq(double sw, double sww) { return sw > 0 ? sww / sw : 0.0; }

/* The cpu fits of one figure E (attention_eff, hbm_eff) minimise the weighted squared
 * log ratio of predicted to measured time, sum_i v_i log^2(pred_i / t_i): an over- and an
 * under-prediction by the same factor cost the same. (The relative error (pred - t) / t
 * caps an under-prediction's cost at 1 and not an over-prediction's, so with the CPU
 * kernels' tenfold spread of rates it fits the fastest kernels and under-predicts the
 * rest: on tiny-dense, 0.46 ms of element-wise time against 1.34 ms measured.) With
 * pred_i = x_i / E, log E is the weighted mean of log(x_i / t_i), the weighted geometric
 * mean of the points' efficiencies.
 *
 * hbm_eff: the simulator costs an element-wise op as max(flops / peak, bytes / (hbm E))
 * (sim/cost.c), so the fit predicts each point the same way: pred_i = max(F_i, B_i c),
 * c = 1/E, F_i the flops term and B_i the bytes term at E = 1. Between two breakpoints
 * F_i / B_i the points in the bytes regime are fixed and the sum is a quadratic in
 * log c; its minimum, clamped to the interval, is a candidate, and the best candidate
 * over the intervals is the exact minimum. A point whose flops term exceeds its time at
 * any E says nothing of E. Returns 0 when no point weighs anything. */
static double hbm_fit_log(const double *F, const double *B, const double *t, const double *v, int n) {
  double cuts[MP_CALIB_MAX_BW + 2];
  int nc = 0;
  cuts[nc++] = 0.0;
  for (int i = 0; i < n; i++)
    if (v[i] > 0 && F[i] > 0 && B[i] > 0) cuts[nc++] = F[i] / B[i];
  cuts[nc++] = INFINITY;
  for (int i = 1; i < nc; i++) /* n <= MP_CALIB_MAX_BW: insertion sort */
    for (int j = i; j > 0 && cuts[j] < cuts[j - 1]; j--) {
      double x = cuts[j];
      cuts[j] = cuts[j - 1];
      cuts[j - 1] = x;
    }
  double best_c = 0, best = INFINITY;
  for (int k = 0; k + 1 < nc; k++) {
    const double lo = cuts[k], hi = cuts[k + 1];
    if (!(hi > lo)) continue;
    const double mid = isinf(hi) ? (lo > 0 ? 2 * lo : 1.0) : 0.5 * (lo + hi);
    double sv = 0, svl = 0; /* log c = -sum v log(B / t) / sum v over the bytes regime */
    for (int i = 0; i < n; i++)
      if (v[i] > 0 && B[i] * mid >= F[i]) {
        sv += v[i];
        svl += v[i] * log(B[i] / t[i]);
      }
    double c = sv > 0 ? exp(-svl / sv) : hi;
    if (c < lo) c = lo;
    if (c > hi) c = hi;
    if (!(c > 0) || isinf(c)) continue;
    double se = 0;
    for (int i = 0; i < n; i++) {
      if (!(v[i] > 0)) continue;
      const double e = log((B[i] * c > F[i] ? B[i] * c : F[i]) / t[i]);
      se += v[i] * e * e;
    }
    if (se < best) {
      best = se;
      best_c = c;
    }
  }
  return best_c > 0 ? 1.0 / best_c : 0.0;
}

/* Weight of a point at log2 distance d from the run's size: 1 at the run's size, fading
 * to 0 at MP_CALIB_RUN_REACH octaves (as the by-shape GEMM correction fades). */
static double run_weight(double d) {
  d = fabs(d);
  return d < MP_CALIB_RUN_REACH ? 1.0 - d / MP_CALIB_RUN_REACH : 0.0;
}

/* Elements of kernel k's tensor in a step of run (see mp_calib_run). */
static double run_elems(const mp_calib_run *r, int k) {
  const double tp = r->tp > 1 ? r->tp : 1;
  switch (k) {
    case MP_CALIB_BW_SWIGLU_FWD:
    case MP_CALIB_BW_SWIGLU_BWD: return r->tokens * (double)r->d_ff / tp;
    case MP_CALIB_BW_ROPE_FWD:
    case MP_CALIB_BW_ROPE_BWD: return r->tokens * (double)(r->n_heads * r->head_dim) / tp;
    case MP_CALIB_BW_CE_FWD:
    case MP_CALIB_BW_CE_BWD: return r->tokens * (double)r->vocab;
    case MP_CALIB_BW_ADAMW: return (double)r->d_model * (double)r->d_ff / tp;
    default: return r->tokens * (double)r->d_model; /* rmsnorm, residual */
  }
}

/* attention_eff and hbm_eff of a cpu calibration against its ref_*, every point weighing
 * the same (run NULL) or by its distance from the run's sizes; a figure keeps 0 when no
 * point weighs anything. */
/* The schedule's kernel class of an element-wise calibration kernel. */
static int bw_kernel_class(int k) {
  switch (k) {
    case MP_CALIB_BW_RMSNORM_FWD:
    case MP_CALIB_BW_RMSNORM_BWD: return MP_KERNEL_NORM;
    case MP_CALIB_BW_SWIGLU_FWD:
    case MP_CALIB_BW_SWIGLU_BWD: return MP_KERNEL_ACTIVATION;
    case MP_CALIB_BW_ADAMW: return MP_KERNEL_OPTIMIZER;
    case MP_CALIB_BW_ROPE_FWD:
    case MP_CALIB_BW_ROPE_BWD: return MP_KERNEL_ROPE;
    case MP_CALIB_BW_CE_FWD:
    case MP_CALIB_BW_CE_BWD: return MP_KERNEL_LOSS;
    case MP_CALIB_BW_RESIDUAL: return MP_KERNEL_RESIDUAL;
    default: return -1;
  }
}

static void cpu_kernel_fit(const mp_calib *c, const mp_calib_run *run, double *attention_eff, double *hbm_eff,
                           double *hbm_eff_kernel) {
  const double peak = c->ref_bf16_tflops * 1e12, hbm = c->ref_hbm_GBps * 1e9;
  const double ovh = c->launch_s > 0 ? c->launch_s : 0.0;
  *attention_eff = *hbm_eff = 0;
  if (!(peak > 0)) return;
  double sv = 0, svl = 0;
  for (int i = 0; i < c->n_attn; i++) {
    const mp_calib_attn *a = &c->attn[i];
    if (!(a->flops_per_s > 0)) continue;
    double v = 1.0;
    if (run)
      v = run_weight(fmax(fabs(log2((double)a->T / (double)run->seq)),
                          fabs(log2((double)a->hd / (double)run->head_dim))));
    const double flops = mp_calib_attn_flops(a->backward, a->B, a->T, a->nh, a->hd);
    sv += v;
    svl += v * log(flops / (peak * compute_time(flops / a->flops_per_s, ovh)));
  }
  if (sv > 0) *attention_eff = fmin(exp(svl / sv), 1.0);
  if (!(hbm > 0)) return;
  double F[MP_CALIB_MAX_BW], B[MP_CALIB_MAX_BW], T[MP_CALIB_MAX_BW], V[MP_CALIB_MAX_BW];
  int K[MP_CALIB_MAX_BW];
  int n = 0;
  for (int i = 0; i < c->n_bw && n < MP_CALIB_MAX_BW; i++) {
    const mp_calib_bw *b = &c->bw[i];
    if (!(b->GBps > 0) || !(b->elems > 0)) continue;
    const double bytes = mp_calib_bw_bytes(b->kernel, b->elems);
    F[n] = mp_calib_bw_flops(b->kernel, b->elems) / peak; /* element-wise ops at the fp32 peak */
    B[n] = bytes / hbm;
    T[n] = compute_time(bytes / (b->GBps * 1e9), ovh);
    V[n] = run ? run_weight(log2(b->elems / run_elems(run, b->kernel))) : 1.0;
    K[n] = bw_kernel_class(b->kernel);
    n++;
  }
  *hbm_eff = hbm_fit_log(F, B, T, V, n);
  if (hbm_eff_kernel == NULL) return;
  /* each class alone: its points keep their weights, the others weigh nothing */
  for (int k = 0; k < MP_KERNEL_COUNT; k++) {
    double Vk[MP_CALIB_MAX_BW];
    int any = 0;
    for (int i = 0; i < n; i++) {
      Vk[i] = K[i] == k ? V[i] : 0.0;
      any |= Vk[i] > 0;
    }
    hbm_eff_kernel[k] = any ? hbm_fit_log(F, B, T, Vk, n) : 0.0;
  }
}

/* The references of a cpu fit (see calibrate.h, "The fit"): the GEMM peak is the fastest
 * curve point, or the curve's asymptote when that is higher (the curve then has E = 1
 * exactly, never clamped); every dtype has it (the CPU computes in fp32); HBM is the
 * copy. */
static mp_status cpu_refs(mp_ctx *ctx, mp_calib *c, const mp_calib_gemm *pts, int n, double ovh) {
  double p0 = 0;
  for (int i = 0; i < n; i++)
    if (pts[i].flops_per_s > p0) p0 = pts[i].flops_per_s;
  double E = 0, h = 0;
  MP_CHECK(curve_lsq(ctx, pts, n, p0, ovh, &E, &h, NULL));
  const double peak = E > 1.0 ? p0 * E : p0;
  c->ref_bf16_tflops = c->ref_fp8_tflops = peak * 1e-12;
  c->ref_hbm_GBps = c->copy_GBps;
  return MP_OK;
}

void mp_calib_run_init(mp_calib_run *r, const mp_model *m, int64_t micro_batch, int64_t seq, int tp) {
  memset(r, 0, sizeof *r);
  r->tokens = (double)micro_batch * (double)seq;
  r->seq = seq;
  r->d_model = m->d_model;
  r->d_ff = m->d_ff;
  r->vocab = m->vocab;
  r->n_heads = m->n_heads;
  r->head_dim = m->head_dim;
  r->tp = tp > 1 ? tp : 1;
}

void mp_calib_fit_run(const mp_calib *c, const mp_calib_run *run, mp_calib_stack_fit *out) {
  *out = c->fit;
  if (run == NULL || strcmp(c->device, "cpu") != 0 || !(c->fit.gemm_eff_max > 0)) return;
  if (!(run->tokens > 0) || run->seq < 1 || run->head_dim < 1 || run->d_model < 1) return;
  double attn = 0, hbm = 0;
  cpu_kernel_fit(c, run, &attn, &hbm, out->hbm_eff_kernel);
  if (attn > 0) out->attention_eff = attn;
  if (hbm > 0) out->hbm_eff = hbm;
}

/* bf16: the efficiency curve through the linear passes' points pts[0..n) and the by-shape
 * table's leave-one-out error, against the GPU profile's bf16 peak. */
static mp_status fit_bf16_gemm(mp_ctx *ctx, mp_calib *c, const mp_calib_gemm *pts, int n,
                               double ovh) {
  mp_calib_stack_fit *f = &c->fit;
  const double peak = c->ref_bf16_tflops * 1e12;
  if (!(peak > 0))
    return mp_error(ctx, MP_ERR_INVALID, "calibrate: calibration of %s has no reference bf16 peak; it needs "
                    "the GPU profile it is relative to", c->gpu_name[0] ? c->gpu_name : c->device);
  if (n == 0)
    return mp_error(ctx, MP_ERR_INVALID, "calibrate: no bf16 GEMM point (fwd, dgrad or wgrad) to fit the "
                    "efficiency curve to");
  MP_CHECK(mp_calib_fit_gemm_curve(ctx, pts, n, peak, ovh, &f->gemm_eff_max, &f->gemm_eff_half_mnk,
                                   &f->gemm_curve_rms));
  f->kernel_overhead_us = ovh * 1e6;
  const gemm_curve cv = bf16_curve(c);
  MP_CHECK(table_loo_rms(ctx, c->gemm, c->n_gemm, &cv, &f->gemm_table_rms));
  f->gemm_table = table_pays(f->gemm_curve_rms, f->gemm_table_rms);
  return MP_OK;
}

/* float8 on a GPU, every point (forward, dgrad, wgrad): the bf16 curve's knee (the stack
 * has one knee), the fp8 peak; minimise sum (w_i / E - 1)^2 with w_i = the curve's time at
 * E = 1 over the measured compute time (w_i is the point's efficiency as the curve's shape
 * sees it). Then the float8 by-shape correction against that curve, kept on the same terms
 * as the bf16 one: what one number cannot say (the passes differ: fast accumulation in the
 * forward only, an fp32 output for wgrad) the points of each pass say by shape. Nothing
 * without points or without the profile's fp8 peak. */
static mp_status fit_fp8_gemm(mp_ctx *ctx, mp_calib *c, double ovh) {
  mp_calib_stack_fit *f = &c->fit;
  const double peak8 = c->ref_fp8_tflops * 1e12;
  if (!(c->n_f8 > 0 && peak8 > 0)) return MP_OK;
  double sw = 0, sww = 0;
  for (int i = 0; i < c->n_f8; i++) {
    const mp_calib_gemm *g = &c->f8[i];
    if (!(g->flops_per_s > 0)) continue;
    const double flops = mp_calib_gemm_flops(g->pass, g->N, g->K, g->M);
    const double x = (double)g->N * g->K * g->M;
    const double w = curve_time(flops, x, peak8, 1.0, f->gemm_eff_half_mnk) / compute_time(flops / g->flops_per_s, ovh);
    sw += w;
    sww += w * w;
  }
  f->fp8_gemm_eff_max = eff_lsq(sw, sww);
  if (f->fp8_gemm_eff_max > 1.0) f->fp8_gemm_eff_max = 1.0;
  if (f->fp8_gemm_eff_max > 0) {
    const gemm_curve cv8 = fp8_curve(c);
    f->fp8_gemm_curve_rms = curve_rms(c->f8, c->n_f8, &cv8);
    MP_CHECK(table_loo_rms(ctx, c->f8, c->n_f8, &cv8, &f->fp8_gemm_table_rms));
    f->fp8_gemm_table = table_pays(f->fp8_gemm_curve_rms, f->fp8_gemm_table_rms);
  }
  return MP_OK;
}

/* cuda: attention, the FLOP total over the time total, forward and backward together
 * (the large GPU shapes run at one rate) */
static void fit_cuda_attention(mp_calib *c, double ovh) {
  const double peak = c->ref_bf16_tflops * 1e12;
  double fl = 0, ts = 0;
  for (int i = 0; i < c->n_attn; i++) {
    const mp_calib_attn *a = &c->attn[i];
    if (!(a->flops_per_s > 0)) continue;
    const double flops = mp_calib_attn_flops(a->backward, a->B, a->T, a->nh, a->hd);
    fl += flops;
    ts += compute_time(flops / a->flops_per_s, ovh);
  }
  if (ts > 0) {
    c->fit.attention_eff = fl / (peak * ts);
    if (c->fit.attention_eff > 1.0) c->fit.attention_eff = 1.0;
  }
}

/* cuda: HBM, the element-wise kernels' bytes over their time, against the datasheet */
static void fit_cuda_hbm(mp_calib *c, double ovh) {
  double by = 0, ts = 0;
  for (int i = 0; i < c->n_bw; i++) {
    const mp_calib_bw *b = &c->bw[i];
    if (!(b->GBps > 0)) continue;
    const double bytes = mp_calib_bw_bytes(b->kernel, b->elems);
    by += bytes;
    ts += compute_time(bytes / (b->GBps * 1e9), ovh);
  }
  if (ts > 0 && c->ref_hbm_GBps > 0) {
    c->fit.hbm_eff = by / (c->ref_hbm_GBps * 1e9 * ts);
    if (c->fit.hbm_eff > 1.0) c->fit.hbm_eff = 1.0;
  }
}

mp_status mp_calib_fit_stack(mp_ctx *ctx, mp_calib *c) {
  mp_calib_stack_fit *f = &c->fit;
  memset(f, 0, sizeof *f);
  const int cpu = strcmp(c->device, "cpu") == 0;
  const double ovh = c->launch_s > 0 ? c->launch_s : 0.0;
  mp_calib_gemm pts[MP_CALIB_MAX_GEMM];
  int n = 0;
  for (int i = 0; i < c->n_gemm; i++)
    if (is_linear_pass(c->gemm[i].pass)) pts[n++] = c->gemm[i];
  if (cpu) {
    /* a cpu calibration without fwd/dgrad/wgrad points (GEMM and copy only, or BWD points only): no curve, no fit; the CPU
     * profile takes its largest rate and the stack keeps its stated figures */
    if (n == 0) return MP_OK;
    MP_CHECK(cpu_refs(ctx, c, pts, n, ovh));
  }
  MP_CHECK(fit_bf16_gemm(ctx, c, pts, n, ovh));
  if (cpu) {
    /* The CPU emulates float8 through its fp32 GEMM: the curve's own efficiency, no
     * points; then the log-ratio fits, every point weighing the same (cpu_kernel_fit) */
    f->fp8_gemm_eff_max = f->gemm_eff_max;
    cpu_kernel_fit(c, NULL, &f->attention_eff, &f->hbm_eff, NULL);
    return MP_OK;
  }
  MP_CHECK(fit_fp8_gemm(ctx, c, ovh));
  fit_cuda_attention(c, ovh);
  fit_cuda_hbm(c, ovh);
  return MP_OK;
}
