/* meshplan report --import-log: the step lines of a torchtitan or Megatron-LM training log as
 * measurements of a planned run's plan, so `report --run ID` shows them beside the
 * prediction.
 *
 * torchtitan v0.2.0 (torchtitan/components/metrics.py, MetricsProcessor.log):
 *   "step: 10  loss:  7.1234  grad_norm:  1.2345  memory: 45.67GiB(57.06%)  tps: 8,123  ..."
 * (ANSI colours allowed), tps being tokens per second per device; Megatron-LM core_v0.14.0
 * (megatron/training/training.py, training_log and report_memory):
 *   " [...] iteration       10/    1000 | ... | elapsed time per iteration (ms): 1234.5 | ...
 *    | lm loss: 7.123456E+00 | ... | grad norm: 1.234 | ..."
 *   "[Rank 0] (after 10 iterations) memory (MB) | allocated: ... | max reserved: 46123.0"
 * Lines of neither kind are skipped (a log holds much else); a log with no step line is an
 * error. */
#ifndef MP_APP_IMPORT_LOG_H
#define MP_APP_IMPORT_LOG_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mp_log_step {
  int64_t step;
  double loss;           /* the step's training loss */
  double grad_norm;      /* 0 where the line has none */
  double step_time_s;    /* Megatron: elapsed per iteration; torchtitan: from tps (below) */
  double tokens_per_s;   /* the whole job's */
  int64_t peak_mem_bytes; /* reserved; 0 when the log states none */
} mp_log_step;

/* Parses text (origin names it) into a malloc'd array (*steps, *n; the caller frees) and
 * names its framework ("torchtitan", "Megatron-LM"). tokens_per_step (global batch x seq)
 * and n_gpus turn a rate into a step time and back: torchtitan's tps x n_gpus is the job's
 * tokens/s and tokens_per_step / that the step time; Megatron's tokens/s is tokens_per_step
 * / the step time. */
mp_status mp_import_log_parse(mp_ctx *ctx, const char *text, const char *origin, int64_t tokens_per_step,
                              int n_gpus, mp_log_step **steps, int64_t *n, const char **framework);

/* Reads the log at path and stores each step as a measurement (mp_store_add_measurement) of
 * the plan ranked `rank` (from 1) in planner run run_id, its device "torchtitan log PATH" or
 * "Megatron-LM log PATH"; a line of what was imported (the steps, the median step time beside
 * the prediction) into summary. MP_ERR_NOT_FOUND for a run or rank the database lacks. */
struct mp_store;
struct mp_arena;
mp_status mp_import_log_store(mp_ctx *ctx, struct mp_store *st, struct mp_arena *a, int64_t run_id, int64_t rank,
                              const char *path, char *summary, size_t cap);

#ifdef __cplusplus
}
#endif
#endif
