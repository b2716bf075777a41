/* The step lines of torchtitan and Megatron-LM logs (app/import_log.h). */
#include "app/import_log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/arena.h"
#include "common/file.h"
#include "planner/store.h"

/* One line of the log with its ANSI colour sequences (ESC [ ... letter) removed and the
 * thousands separators of torchtitan's tps kept (they are read by number() below). */
static void clean_line(const char *s, size_t len, char *out, size_t cap) {
  size_t n = 0;
  for (size_t i = 0; i < len && n + 1 < cap; i++) {
    if (s[i] == '\033' && i + 1 < len && s[i + 1] == '[') {
      i += 2;
      while (i < len && !((s[i] >= 'A' && s[i] <= 'Z') || (s[i] >= 'a' && s[i] <= 'z'))) i++;
      continue;
    }
    out[n++] = s[i];
  }
  out[n] = '\0';
}

/* The number after key in line ("tps: 8,123" -> 8123), or -1 when the key is absent. */
static double number(const char *line, const char *key) {
  const char *p = strstr(line, key);
  if (p == NULL) return -1;
  p += strlen(key);
  while (*p == ' ') p++;
  char digits[64];
  size_t n = 0;
  for (; *p && n + 1 < sizeof digits && (strchr("0123456789.eE+-,", *p)); p++)
    if (*p != ',') digits[n++] = *p;
  digits[n] = '\0';
  char *end = NULL;
  const double x = strtod(digits, &end);
  return end == digits ? -1 : x;
}

/* A torchtitan step line into *s (validation lines, "validate step:", are not steps). */
static int torchtitan_step(const char *line, int64_t tokens_per_step, int n_gpus, mp_log_step *s) {
  const char *p = strstr(line, "step:");
  if (p == NULL || strstr(line, "validate step:") || !strstr(line, "loss:") || !strstr(line, "tps:")) return 0;
  const double step = number(p, "step:"), loss = number(p, "loss:"), tps = number(p, "tps:");
  if (step < 0 || loss < 0 || !(tps > 0)) return 0;
  const double mem_gib = number(p, "memory:");
  s->step = (int64_t)step;
  s->loss = loss;
  s->grad_norm = number(p, "grad_norm:") > 0 ? number(p, "grad_norm:") : 0;
  s->tokens_per_s = tps * n_gpus;
  s->step_time_s = (double)tokens_per_step / s->tokens_per_s;
  s->peak_mem_bytes = mem_gib > 0 ? (int64_t)(mem_gib * 1073741824.0) : 0;
  return 1;
}

/* A Megatron-LM iteration line into *s. */
static int megatron_step(const char *line, int64_t tokens_per_step, mp_log_step *s) {
  const char *p = strstr(line, " iteration ");
  const double ms = number(line, "elapsed time per iteration (ms):");
  if (p == NULL || !(ms > 0)) return 0;
  const double it = number(p, " iteration "), loss = number(line, "lm loss:");
  if (it < 0) return 0;
  s->step = (int64_t)it;
  s->loss = loss > 0 ? loss : 0;
  s->grad_norm = number(line, "grad norm:") > 0 ? number(line, "grad norm:") : 0;
  s->step_time_s = ms / 1e3;
  s->tokens_per_s = (double)tokens_per_step / s->step_time_s;
  s->peak_mem_bytes = 0;
  return 1;
}

mp_status mp_import_log_parse(mp_ctx *ctx, const char *text, const char *origin, int64_t tokens_per_step,
                              int n_gpus, mp_log_step **steps, int64_t *n, const char **framework) {
  *steps = NULL;
  *n = 0;
  *framework = NULL;
  int64_t cap = 0, mg_mem = 0;
  int tt = 0, mg = 0;
  for (const char *p = text; *p;) {
    const size_t len = strcspn(p, "\n");
    char line[4096];
    clean_line(p, len, line, sizeof line);
    p += len + (p[len] == '\n');
    const double reserved_mb = strstr(line, "memory (MB)") ? number(line, "max reserved:") : -1;
    if (reserved_mb > 0) mg_mem = (int64_t)(reserved_mb * 1048576.0); /* report_memory's MB are MiB */
    mp_log_step s;
    memset(&s, 0, sizeof s);
    const int is_tt = torchtitan_step(line, tokens_per_step, n_gpus, &s);
    const int is_mg = !is_tt && megatron_step(line, tokens_per_step, &s);
    if (!is_tt && !is_mg) continue;
    tt |= is_tt;
    mg |= is_mg;
    if (*n == cap) {
      cap = cap ? 2 * cap : 64;
      mp_log_step *g = realloc(*steps, (size_t)cap * sizeof *g);
      if (g == NULL) {
        free(*steps);
        *steps = NULL;
        return mp_error(ctx, MP_ERR_NOMEM, "out of memory reading %s", origin);
      }
      *steps = g;
    }
    (*steps)[(*n)++] = s;
  }
  if (tt && mg) return mp_error(ctx, MP_ERR_INVALID, "%s holds torchtitan and Megatron-LM step lines; one run's "
                                "log at a time", origin);
  if (*n == 0)
    return mp_error(ctx, MP_ERR_INVALID, "%s has no torchtitan (\"step: N  loss: X ... tps: Z\") or Megatron-LM "
                    "(\"iteration N/ M | ... elapsed time per iteration (ms): X\") step line", origin);
  for (int64_t i = 0; mg && mg_mem > 0 && i < *n; i++) (*steps)[i].peak_mem_bytes = mg_mem;
  *framework = tt ? "torchtitan" : "Megatron-LM";
  return MP_OK;
}

static int cmp_double(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

mp_status mp_import_log_store(mp_ctx *ctx, struct mp_store *st, struct mp_arena *a, int64_t run_id, int64_t rank,
                              const char *path, char *summary, size_t cap) {
  mp_run_row run;
  MP_CHECK(mp_store_get_run(ctx, st, run_id, &run));
  mp_plan_row *rows = NULL;
  int64_t n_rows = 0;
  MP_CHECK(mp_store_top_plans(ctx, st, run_id, rank, a, &rows, &n_rows));
  if (n_rows < rank)
    return mp_error(ctx, MP_ERR_NOT_FOUND, "run %lld has %lld ranked plans, no rank %lld", (long long)run_id,
                    (long long)n_rows, (long long)rank);
  const mp_plan_row *plan = &rows[rank - 1];
  char *text = NULL;
  MP_CHECK(mp_read_file_max(ctx, path, MP_FILE_MAX_BYTES, &text, NULL));
  mp_log_step *steps = NULL;
  int64_t n = 0;
  const char *fw = NULL;
  const int64_t gb = plan->global_batch > 0 ? plan->global_batch : run.global_batch;
  mp_status s = mp_import_log_parse(ctx, text, path, gb * run.seq, run.n_gpus, &steps, &n, &fw);
  free(text);
  double *times = s == MP_OK ? malloc((size_t)n * sizeof *times) : NULL;
  if (s == MP_OK && times == NULL) s = mp_error(ctx, MP_ERR_NOMEM, "out of memory");
  char device[600];
  snprintf(device, sizeof device, "%s log %s", fw ? fw : "", path);
  for (int64_t i = 0; s == MP_OK && i < n; i++) {
    const mp_measurement m = {plan->id, steps[i].step, steps[i].step_time_s, steps[i].peak_mem_bytes, steps[i].loss,
                              steps[i].tokens_per_s, device, 0, 0, 0, steps[i].grad_norm, 0};
    s = mp_store_add_measurement(ctx, st, &m);
    times[i] = steps[i].step_time_s;
  }
  if (s == MP_OK) {
    qsort(times, (size_t)n, sizeof *times, cmp_double);
    snprintf(summary, cap, "imported %lld steps of %s (%s) as measurements of run %lld's plan %lld (plan id %lld): "
             "median step %.4f s, predicted %.4f s", (long long)n, path, fw, (long long)run_id, (long long)rank,
             (long long)plan->id, n % 2 ? times[n / 2] : 0.5 * (times[n / 2 - 1] + times[n / 2]), plan->step_time_s);
  }
  free(times);
  free(steps);
  return s;
}
