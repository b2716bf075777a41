/* The store's row readers (see store_internal.h): a runs row, a plans row with its
 * prediction, the AC policy's stored name back to its code. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "planner/store_internal.h"

void mp_store_col_text(sqlite3_stmt *q, int i, char *out, size_t cap) {
  const unsigned char *t = sqlite3_column_text(q, i);
  snprintf(out, cap, "%s", t ? (const char *)t : "");
}

void mp_store_read_run(sqlite3_stmt *q, mp_run_row *r) {
  memset(r, 0, sizeof *r);
  r->id = sqlite3_column_int64(q, 0);
  mp_store_col_text(q, 1, r->created_at, sizeof r->created_at);
  mp_store_col_text(q, 2, r->model, sizeof r->model);
  mp_store_col_text(q, 3, r->cluster, sizeof r->cluster);
  mp_store_col_text(q, 4, r->gpu, sizeof r->gpu);
  mp_store_col_text(q, 5, r->objective, sizeof r->objective);
  mp_store_col_text(q, 6, r->tool_version, sizeof r->tool_version);
  r->n_gpus = sqlite3_column_int(q, 7);
  r->seq = sqlite3_column_int64(q, 8);
  r->global_batch = sqlite3_column_int64(q, 9);
  r->n_candidates = sqlite3_column_int64(q, 10);
  r->n_pruned = sqlite3_column_int64(q, 11);
  r->n_evaluated = sqlite3_column_int64(q, 12);
  r->n_feasible = sqlite3_column_int64(q, 13);
  r->best_plan_id = sqlite3_column_int64(q, 14);
  r->wall_s = sqlite3_column_double(q, 15);
  r->best_step_time_s = sqlite3_column_double(q, 16);
  /* NULL: a planner run, committed whole; 'running' left behind: the process died */
  const unsigned char *ts = sqlite3_column_text(q, 17);
  const char *s = ts ? (const char *)ts : "complete";
  snprintf(r->status, sizeof r->status, "%s", strcmp(s, "running") == 0 ? "incomplete" : s);
  mp_store_col_text(q, 18, r->logged, sizeof r->logged);
}

/* The policy of a stored ac text ("selective-op", "full:4"), its block frequency into
 * *every; -1 for an unknown one. */
static int ac_code(const char *s, int *every) {
  *every = 1;
  if (strncmp(s, "full:", 5) == 0) {
    *every = atoi(s + 5);
    return MP_AC_FULL;
  }
  for (int i = 0; i < MP_AC_COUNT; i++)
    if (strcmp(s, mp_search_ac_name(i)) == 0) return i;
  return -1;
}

/* One row of a plans query (MP_STORE_PLAN_COLS) into *r: the plan and its
 * prediction; the measured figures zero. */
void mp_store_read_plan(sqlite3_stmt *q, mp_plan_row *r) {
  memset(r, 0, sizeof *r);
  int c = 0;
  r->id = sqlite3_column_int64(q, c++);
  r->run_id = sqlite3_column_int64(q, c++);
  r->index = sqlite3_column_int64(q, c++);
  r->rank = sqlite3_column_int64(q, c++);
  r->pp = sqlite3_column_int(q, c++);
  r->dp_replicate = sqlite3_column_int(q, c++);
  r->dp_shard = sqlite3_column_int(q, c++);
  r->cp = sqlite3_column_int(q, c++);
  r->tp = sqlite3_column_int(q, c++);
  r->ep = sqlite3_column_int(q, c++);
  const unsigned char *ac = sqlite3_column_text(q, c++);
  r->ac = ac_code(ac ? (const char *)ac : "", &r->ac_every);
  r->fp8 = sqlite3_column_int(q, c++);
  r->reshard = sqlite3_column_int(q, c++);
  r->evaluated = sqlite3_column_int(q, c++);
  r->feasible = sqlite3_column_int(q, c++);
  r->micro_batch = sqlite3_column_int64(q, c++);
  r->sp = sqlite3_column_int(q, c++);
  r->pp_virtual = sqlite3_column_int(q, c++);
  r->global_batch = sqlite3_column_int64(q, c++);
  r->pp_split = sqlite3_column_int(q, c++);
  r->etp = sqlite3_column_int(q, c++);
  r->dopt = sqlite3_column_int(q, c++);
  r->loss_chunks = sqlite3_column_int(q, c++);
  r->nccl_version = sqlite3_column_int(q, c++);
  mp_store_col_text(q, c++, r->stack, sizeof r->stack);
  r->moe_imbalance = sqlite3_column_double(q, c++);
  r->moe_capacity_factor = sqlite3_column_double(q, c++);
  mp_store_col_text(q, c++, r->fp8_recipe, sizeof r->fp8_recipe);
  r->mtp_layers = sqlite3_column_int(q, c++);
  mp_store_col_text(q, c++, r->reject_rule, sizeof r->reject_rule);
  mp_store_col_text(q, c++, r->reject_reason, sizeof r->reject_reason);
  r->step_time_s = sqlite3_column_double(q, c++);
  r->tokens_per_s_per_gpu = sqlite3_column_double(q, c++);
  r->mfu = sqlite3_column_double(q, c++);
  r->compute_s = sqlite3_column_double(q, c++);
  r->exposed_comm_s = sqlite3_column_double(q, c++);
  r->bubble_s = sqlite3_column_double(q, c++);
  r->peak_mem_bytes = sqlite3_column_int64(q, c++);
  r->capacity_bytes = sqlite3_column_int64(q, c++);
  r->alloc_peak_bytes = sqlite3_column_int64(q, c++);
}
