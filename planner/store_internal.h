/* The store's row readers (planner/store.c's queries name these columns and read their rows
 * with these): a runs row, a plans row beside its prediction, and a text column. Internal to
 * planner/store.c and store_rows.c; the rows' meaning is planner/store.h's. */
#ifndef MP_PLANNER_STORE_INTERNAL_H
#define MP_PLANNER_STORE_INTERNAL_H

#include <sqlite3.h>
#include <stddef.h>

#include "planner/store.h"

/* The columns mp_store_read_run reads, runs r beside its best plan's prediction p. */
#define MP_STORE_RUN_COLS                                                                              \
  "r.id, r.created_at, r.model, r.cluster, r.gpu, r.objective, r.tool_version, r.n_gpus,"     \
  " r.seq, r.global_batch, coalesce(r.n_candidates,0), coalesce(r.n_pruned,0),"              \
  " coalesce(r.n_evaluated,0), coalesce(r.n_feasible,0), coalesce(r.best_plan_id,0),"        \
  " coalesce(r.wall_s,0), coalesce(p.step_time_s,0), r.train_status, coalesce(r.logged,'all')" \
  " FROM runs r LEFT JOIN predictions p ON p.plan_id = r.best_plan_id"

/* The columns mp_store_read_plan reads, plans pl beside its predictions pr (NULL, read as 0, for a
 * plan never evaluated). */
#define MP_STORE_PLAN_COLS                                                                                          \
  "pl.id, pl.run_id, pl.idx, coalesce(pl.rank, 0), pl.pp, pl.dp_replicate, pl.dp_shard, pl.cp, pl.tp,"      \
  " pl.ep, pl.ac, pl.fp8, pl.reshard, pl.evaluated, pl.feasible, pl.micro_batch, pl.sp, pl.pp_virtual,"    \
  " coalesce(pl.global_batch, 0), pl.pp_split, pl.etp, pl.dopt, pl.loss_chunks, pl.nccl_version, pl.stack," \
  " pl.moe_imbalance, pl.moe_capacity_factor, pl.fp8_recipe, coalesce(pl.mtp_layers, -1),"                                                             \
  " coalesce(pl.reject_rule,''), coalesce(pl.reject_reason,''), pr.step_time_s,"                           \
  " pr.tokens_per_s_per_gpu, pr.mfu, pr.compute_s, pr.exposed_comm_s, pr.bubble_s,"                        \
  " pr.peak_mem_bytes, pr.capacity_bytes, pr.peak_mem_bytes - coalesce(pr.mem_overhead_bytes, 0)"

/* Column i of q's row as text into out ("" for NULL), cut to cap. */
void mp_store_col_text(sqlite3_stmt *q, int i, char *out, size_t cap);
/* One row of a runs query (MP_STORE_RUN_COLS) into *r. */
void mp_store_read_run(sqlite3_stmt *q, mp_run_row *r);
/* One row of a plans query (MP_STORE_PLAN_COLS) into *r: the plan and its prediction; the
 * measured figures zero. */
void mp_store_read_plan(sqlite3_stmt *q, mp_plan_row *r);

#endif
