/* gnuplot plots of a planner run. Each plot is three files in the output folder: NAME.dat
 * (the data, with a header comment naming columns and units), NAME.gp (a gnuplot script
 * that reads NAME.dat by relative path, so `cd DIR && gnuplot NAME.gp` redraws it after a
 * user edits the style) and NAME.png (pngcairo), drawn by running gnuplot as a subprocess
 * in DIR. gnuplot's messages go to NAME.log.
 *
 *   candidates  the simulated candidates (those over memory an even sample of at most
 *               1,000): predicted step time vs peak memory per GPU,
 *               feasible and over-memory in different marks, the memory capacity as a
 *               vertical line, the chosen plan marked and labelled
 *   memory      stacked bars of the memory breakdown at the peak of the top plans
 *   timeline    the simulated step of the chosen plan, one row per stream, ops coloured
 *               by phase, read back from a Chrome trace JSON (sim's mp_sim_trace_write)
 *   loss, throughput
 *               a training run's measured steps: training loss and validation loss
 *               against the step (loss.png), tokens per second against the step with the
 *               predicted tokens per second as a line (throughput.png), where the run
 *               resumed from a checkpoint marked on both */
#ifndef MP_PLANNER_PLOT_H
#define MP_PLANNER_PLOT_H

#include "common/status.h"
#include "planner/search.h"

#ifdef __cplusplus
extern "C" {
#endif

/* MP_ERR_UNSUPPORTED naming the package (gnuplot-nox) when gnuplot is not on PATH. */
mp_status mp_plot_check_gnuplot(mp_ctx *ctx);
/* Runs `gnuplot script` with DIR as working directory; a failure quotes gnuplot's first
 * error line. */
mp_status mp_plot_run_gnuplot(mp_ctx *ctx, const char *dir, const char *script);

/* Creates DIR (one level) if missing. */
mp_status mp_plot_make_dir(mp_ctx *ctx, const char *dir);

/* candidates.{dat,gp,png}. order[0] is the chosen plan (n_order may be 0: none marked). */
mp_status mp_plot_candidates(mp_ctx *ctx, const char *dir, const mp_search *s,
                             const int64_t *order, int64_t n_order, double capacity_gib,
                             const char *title);
/* memory.{dat,gp,png}: the first k plans of order. */
mp_status mp_plot_memory(mp_ctx *ctx, const char *dir, const mp_search *s, const int64_t *order,
                         int64_t n_order, int k, double capacity_gib, const char *title);
/* timeline.{dat,gp,png} from the Chrome trace JSON at trace_path. */
mp_status mp_plot_timeline(mp_ctx *ctx, const char *dir, const char *trace_path,
                           const char *title);

/* One measured training step (meshplan report reads them from the database). */
typedef struct mp_plot_step {
  int64_t step;
  double loss, tokens_per_s;
  int has_eval;
  double eval_loss;
} mp_plot_step;
/* What a training run's plots draw beside its steps: the predicted tokens/s of its plan over
 * all ranks (0: none), drawn as a line on throughput.png, and the steps where the run resumed
 * from a checkpoint (each drawn as a mark on both plots just before the step). */
typedef struct mp_plot_training_marks {
  double predicted_tokens_per_s;
  const int64_t *resumed_at;
  int64_t n_resumed;
} mp_plot_training_marks;
/* loss.{dat,gp,png} and throughput.{dat,gp,png} of n steps (n >= 1); marks may be NULL. The
 * axes leave a margin around the points, so the last marker is drawn whole. */
/* memory_time.png (+ .dat, .gp): the memory of a simulated step over time from a Chrome
 * trace's memory counter (mp_sim_trace_write), categories stacked, with the usable
 * capacity (GiB) as a line; overhead_gib (the runtime's, not in the counter) is named. */
mp_status mp_plot_memory_time(mp_ctx *ctx, const char *dir, const char *trace_path, double capacity_gib,
                              double overhead_gib, const char *title);
mp_status mp_plot_training(mp_ctx *ctx, const char *dir, const mp_plot_step *steps, int64_t n,
                           const mp_plot_training_marks *marks, const char *title);

#ifdef __cplusplus
}
#endif
#endif
