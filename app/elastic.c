/* The deciding parts of train --elastic (elastic.h): the launcher's command line, Young and
 * Daly's interval, the ranks' lines, the restart's description. No I/O, no process. */
#include "app/elastic.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

double mp_elastic_epoch_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

mp_elastic_launcher mp_elastic_launcher_from_env(void) {
  const char *job = getenv("SLURM_JOB_ID");
  return job && *job ? MP_ELASTIC_SRUN : MP_ELASTIC_MPIRUN;
}

int mp_elastic_launch_argv(const mp_elastic_launch *l, const char **out, int cap, char *num, size_t numcap) {
  int n = 0;
  const int need = 9 + l->n_train_args; /* the longest prefix (mpirun as root) and NULL */
  if (cap < need) return -1;
  if (l->launcher == MP_ELASTIC_SRUN) {
    snprintf(num, numcap, "--ntasks=%d", l->world);
    out[n++] = "srun";
    out[n++] = num;
    out[n++] = "--kill-on-bad-exit=1";
  } else {
    snprintf(num, numcap, "%d", l->world);
    out[n++] = "mpirun";
    if (l->as_root) out[n++] = "--allow-run-as-root";
    out[n++] = "--oversubscribe";
    out[n++] = "--bind-to";
    out[n++] = "none";
    out[n++] = "-np";
    out[n++] = num;
  }
  out[n++] = l->exe;
  out[n++] = "train";
  for (int i = 0; i < l->n_train_args; i++) out[n++] = l->train_args[i];
  out[n] = NULL;
  return n;
}

double mp_elastic_young_daly_s(double write_s, double mtbf_s) {
  if (!(write_s > 0) || !(mtbf_s > 0)) return 0;
  return sqrt(2.0 * write_s * mtbf_s);
}

int64_t mp_elastic_interval_steps(double write_s, double mtbf_s, double step_s, int64_t max_steps) {
  if (max_steps < 1) max_steps = 1;
  const double t = mp_elastic_young_daly_s(write_s, mtbf_s);
  if (!(step_s > 0) || !(t > 0)) return max_steps;
  const double k = floor(t / step_s + 0.5);
  if (k < 1) return 1;
  return k >= (double)max_steps ? max_steps : (int64_t)k;
}

void mp_elastic_plan_interval_str(int64_t params, int n_gpus, double step_s, char *buf, size_t cap) {
  const double write_s = (double)params * 12.0 / (n_gpus > 0 ? n_gpus : 1) / 122e6;
  const double mtbf_s = 50677.0 * 3600.0 / (n_gpus > 0 ? n_gpus : 1), t = mp_elastic_young_daly_s(write_s, mtbf_s);
  const int64_t k = mp_elastic_interval_steps(write_s, mtbf_s, step_s, INT64_MAX);
  snprintf(buf, cap, "checkpoint every %lld step%s (%.0f s): Young/Daly sqrt(2 x C x MTBF) with C = %.1f s to write "
           "12 bytes a parameter over %d GPUs at 122 MB/s each, MTBF = %.2f h (Llama 3's 50,677 GPU-hours per "
           "interruption); train --elastic measures C", (long long)k, k == 1 ? "" : "s", t, write_s, n_gpus,
           mtbf_s / 3600.0);
}

int mp_elastic_parse_line(const char *line, int64_t *step) {
  long long s = 0;
  int end = 0;
  if (sscanf(line, "step %lld loss%n", &s, &end) == 1 && end > 0) {
    *step = s;
    return 1;
  }
  static const char prefix[] = "resumed from ";
  if (strncmp(line, prefix, sizeof prefix - 1) != 0) return 0;
  /* the folder may hold ": step " itself: the last one is train's */
  const char *at = NULL;
  for (const char *p = strstr(line, ": step "); p; p = strstr(p + 1, ": step ")) at = p;
  if (!at || sscanf(at, ": step %lld", &s) != 1) return 0;
  *step = s;
  return 2;
}

void mp_elastic_restart_format(const mp_elastic_restart *r, char *buf, size_t cap) {
  snprintf(buf, cap, "%d|%lld|%.3f|%s|%s", r->attempt, (long long)r->failed_after_step, r->failed_at, r->old_mesh,
           r->reason);
}

int mp_elastic_restart_parse(const char *s, mp_elastic_restart *out) {
  memset(out, 0, sizeof *out);
  long long after = 0;
  int used = 0;
  if (!s || sscanf(s, "%d|%lld|%lf|%n", &out->attempt, &after, &out->failed_at, &used) != 3 || used == 0) return 0;
  const char *mesh = s + used, *bar = strchr(mesh, '|');
  if (!bar || out->attempt < 1 || after < 0) return 0;
  snprintf(out->old_mesh, sizeof out->old_mesh, "%.*s", (int)(bar - mesh), mesh);
  snprintf(out->reason, sizeof out->reason, "%s", bar + 1);
  out->failed_after_step = after;
  return 1;
}
