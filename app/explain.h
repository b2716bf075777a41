/* meshplan explain's state, shared by its files:
 *   cmd_explain.c    the options, the stack and cluster predicted on, the plan, the rank's
 *                    schedule simulated with its trace
 *   explain_notes.c  the "context parallel" and "pipeline" sections: how the ring runs, the
 *                    rank's pipeline facts and the sentences that say them
 *   explain_text.c   the text report: header, passes, parameter table, FSDP units, totals,
 *                    tile diagram, step schedule and summary
 *   explain_json.c   the same as one JSON document (--json) */
#ifndef MP_APP_EXPLAIN_H
#define MP_APP_EXPLAIN_H

#include <stddef.h>
#include <stdint.h>

#include "exec/model.h"
#include "exec/plan.h"
#include "exec/schedule.h"
#include "sim/sim.h"
#include "sim/stack.h"

struct cJSON;

typedef struct explain {
  mp_plan *plan;
  int rank;
  int world;
  const char *param_fqn;
  int schedule;
  int summary;
  int json;
  double *dur;         /* --schedule, --summary: per op of the schedule, its predicted s */
  mp_sim_busy busy;    /* the predicted step's busy time by class */
  mp_sim_result res;   /* the predicted step */
  char predicted_on[200]; /* "8 x h100-sxm, stack torchtitan-compile" */
  char kernels[512];      /* how the stack's kernel efficiencies carry to the GPU (sim/stack.h) */
  struct cJSON *kernels_json;  /* the same for --json (mp_cmd_kernel_scale_json), owned */
  int64_t local_batch; /* sequences per data-parallel rank per step */
  int64_t n_micro;     /* micro-batches per step */
  /* pp > 1: the rank's pipeline (mp_explain_pipeline_facts) */
  char pp_note[1536];
  char mb_rule[300];      /* the stack's pipeline micro-batching (mp_cmd_stack_micro_batch) */
  mp_pp_flavor pp_flavor;
  int pp_warmup;          /* forwards before the rank's first backward */
  int64_t pp_inflight;    /* the most chunk activations the rank holds at once */
  double pp_bubble;       /* (pp - 1) / m, or / (v m) interleaved: equal stages' idle share */
  double pp_send_bytes;   /* one stage boundary's activation (or its gradient) per micro-batch */
  double pp_chunk_layers[MP_MAX_LAYERS]; /* layers of model chunk k = c x pp + s */
  int pp_chunks;
  mp_cluster cluster;     /* the cluster predicted on and the stack (explain_stack) */
  mp_stack_profile prof;
} explain;

/* "512 B", "1.50 KiB", "2.00 GiB": bytes in the largest binary unit that keeps them >= 1. */
void mp_explain_fmt_bytes(double b, char *buf, size_t cap);

/* With cp > 1, how the attention core runs (exec/schedule_cp.c's ring, as the plan's memory
 * model runs it): the load-balanced chunks, what travels and by which collective. "" with
 * cp = 1. */
void mp_explain_cp_note(const mp_plan *p, char *buf, size_t cap);

/* With routed experts (and not under meshplan's runtime, which runs a GEMM per expert and
 * source rank): the slowest EP rank's grouped expert GEMMs as the simulator prices them
 * (exec/schedule_prep.c's rows, sim/cost.c's tile padding) and its load. */
typedef struct mp_explain_moe {
  int64_t experts_local;  /* routed experts on the rank */
  double rows;            /* rows per expert per micro-batch (mp_sched_moe_rows) */
  double load;            /* those rows over the balanced ones */
  int64_t rows_computed;  /* rows padded to the stack's tile */
  int tile_m;             /* the stack's grouped-GEMM row tile (0: none) */
  double grouped_eff;     /* the forward gate GEMM's useful FLOPs over peak x its time */
  double dense_eff;       /* the same FLOPs as one dense GEMM of all the rows */
  int fp8;                /* the experts run float8 */
  int64_t dispatch_rows;  /* rows (token copies) the rank's dispatch sends a micro-batch under
                             balanced routing: its routed tokens x top_k, x etp under the flex
                             dispatcher with etp > 1 (exec/schedule_ops.c, mp_sched_flex_etp) */
  int64_t etp_gather_rows; /* rows the expert-TP all-gather makes of them (the all-to-all
                             dispatcher under etp > 1, etp x dispatch_rows); 0 where none runs */
} mp_explain_moe;
/* The facts and the sentence (buf; "" and 0 without routed experts or under the runtime). */
int mp_explain_moe_note(const explain *e, mp_explain_moe *f, char *buf, size_t cap);

/* With pp > 1, the rank's pipeline into e's pp_* fields and e->pp_note (the sentence);
 * needs e->plan, e->rank and e->n_micro. MP_ERR_INVALID where the schedule refuses the
 * micro-batch count (the interleaved schedule's groups of pp). */
mp_status mp_explain_pipeline_facts(mp_ctx *ctx, explain *e, const mp_stack_profile *prof);

/* The report as text on stdout; prm (--param's parameter) and sched (--schedule,
 * --summary) may be NULL. */
void mp_explain_print_text(const explain *e, const mp_param *prm, const mp_schedule *sched);

/* The report as one JSON document on stdout; prm and sched as for mp_explain_print_text. */
void mp_explain_print_json(const explain *e, const mp_param *prm, const mp_schedule *sched);

#endif /* MP_APP_EXPLAIN_H */
