/* Learning-rate schedules (formulas and sources in lr.h). */
#include "exec/runtime/lr.h"

#include <math.h>
#include <string.h>

static const char *const k_names[MP_LR_COUNT] = {"constant", "cosine", "linear", "wsd"};

const char *mp_lr_kind_name(mp_lr_kind k) { return k >= 0 && k < MP_LR_COUNT ? k_names[k] : "?"; }

mp_status mp_lr_kind_parse(mp_ctx *ctx, const char *name, mp_lr_kind *out) {
  for (int k = 0; k < MP_LR_COUNT; k++)
    if (strcmp(name, k_names[k]) == 0) {
      *out = (mp_lr_kind)k;
      return MP_OK;
    }
  return mp_error(ctx, MP_ERR_USAGE, "--lr-schedule %s: choose constant, cosine, linear or wsd", name);
}

mp_status mp_lr_validate(mp_ctx *ctx, const mp_lr_schedule *s) {
  if (!(s->lr >= 0) || !isfinite(s->lr)) return mp_error(ctx, MP_ERR_USAGE, "--lr %g: give a finite lr >= 0", s->lr);
  if (!(s->min_lr >= 0) || s->min_lr > s->lr)
    return mp_error(ctx, MP_ERR_USAGE, "--min-lr %g: give a value in [0, --lr %g]", s->min_lr, s->lr);
  if (s->total < 1) return mp_error(ctx, MP_ERR_USAGE, "the schedule needs at least 1 step (--steps)");
  if (s->warmup < 0 || s->warmup > s->total)
    return mp_error(ctx, MP_ERR_USAGE, "--warmup %lld: give 0 .. --steps (%lld)", (long long)s->warmup,
                    (long long)s->total);
  if (s->kind == MP_LR_WSD && !(s->decay_frac > 0 && s->decay_frac <= 1))
    return mp_error(ctx, MP_ERR_USAGE, "--decay-frac %g: give a share in (0, 1]", s->decay_frac);
  return MP_OK;
}

static double clamp01(double x) { return x < 0 ? 0 : x > 1 ? 1 : x; }

double mp_lr_at(const mp_lr_schedule *s, int64_t step) {
  const int64_t W = s->warmup, S = s->total;
  if (W > 0 && step <= W) return s->lr * (double)step / (double)W;
  const double p = S > W ? clamp01((double)(step - W) / (double)(S - W)) : 1.0;
  switch (s->kind) {
    case MP_LR_COSINE: return s->min_lr + (s->lr - s->min_lr) * 0.5 * (1.0 + cos(M_PI * p));
    case MP_LR_LINEAR: return s->lr + (s->min_lr - s->lr) * p;
    case MP_LR_WSD: {
      const int64_t D = S - (int64_t)llround(s->decay_frac * (double)(S - W));
      if (step <= D) return s->lr;
      const double q = clamp01((double)(step - D) / (double)(S - D));
      return s->min_lr + (s->lr - s->min_lr) * (1.0 - sqrt(q));
    }
    default: return s->lr;
  }
}

int mp_lr_same_after(const mp_lr_schedule *a, const mp_lr_schedule *b, int64_t step) {
  if (a->kind != b->kind || a->lr != b->lr) return 0;
  const int64_t w = a->warmup > b->warmup ? a->warmup : b->warmup;
  if (a->warmup != b->warmup && (w > step || a->kind != MP_LR_CONSTANT)) return 0;
  if (a->kind == MP_LR_CONSTANT) return 1;
  if (a->min_lr != b->min_lr || a->total != b->total) return 0;
  return a->kind != MP_LR_WSD || a->decay_frac == b->decay_frac;
}
