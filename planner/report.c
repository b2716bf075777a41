/* A search's results as `plan` reports them (see report.h). */
#include "planner/report.h"

#include <cjson/cJSON.h>
#include <stdio.h>

static const char *const k_mem_keys[MP_MEM_COUNT] = {
    "params_bytes", "optimizer_bytes", "grads_bytes", "gathered_bytes", "activations_bytes",
    "temp_bytes", "comm_bytes", "fp8_bytes", "logits_bytes"};

/* The rules that rejected candidates, largest count first (ties: rule order). */
int mp_reject_order_by_count(const int64_t by[MP_REJECT_COUNT], int order[MP_REJECT_COUNT]) {
  int n = 0;
  for (int r = 1; r < MP_REJECT_COUNT; r++)
    if (by[r]) order[n++] = r;
  for (int i = 1; i < n; i++)
    for (int j = i; j > 0 && by[order[j]] > by[order[j - 1]]; j--) {
      int t = order[j];
      order[j] = order[j - 1];
      order[j - 1] = t;
    }
  return n;
}

cJSON *mp_reject_counts_json(const mp_search *s) {
  int64_t by[MP_REJECT_COUNT];
  int order[MP_REJECT_COUNT];
  mp_search_reject_counts(s, by);
  const int n = mp_reject_order_by_count(by, order);
  cJSON *arr = cJSON_CreateArray();
  for (int i = 0; arr && i < n; i++) {
    cJSON *o = cJSON_CreateObject();
    if (!o) break;
    cJSON_AddStringToObject(o, "rule", mp_reject_name((mp_reject)order[i]));
    cJSON_AddStringToObject(o, "words", mp_reject_words((mp_reject)order[i]));
    cJSON_AddNumberToObject(o, "count", (double)by[order[i]]);
    cJSON_AddItemToArray(arr, o);
  }
  return arr;
}

cJSON *mp_candidate_json(const mp_candidate *c, int64_t rank, double price) {
  cJSON *j = cJSON_CreateObject(), *mesh = cJSON_CreateObject(), *mem = cJSON_CreateObject();
  if (!j || !mesh || !mem) {
    cJSON_Delete(j);
    cJSON_Delete(mesh);
    cJSON_Delete(mem);
    return NULL;
  }
  cJSON_AddNumberToObject(j, "rank", (double)rank);
  if (c->plan_id) cJSON_AddNumberToObject(j, "plan_id", (double)c->plan_id);
  cJSON_AddNumberToObject(mesh, "dp_replicate", c->mesh.size[MP_DIM_DP_REPLICATE]);
  cJSON_AddNumberToObject(mesh, "dp_shard", c->mesh.size[MP_DIM_DP_SHARD]);
  cJSON_AddNumberToObject(mesh, "tp", c->mesh.size[MP_DIM_TP]);
  cJSON_AddNumberToObject(mesh, "ep", c->mesh.ep);
  /* the expert grid's etp (1: experts whole on a rank), 0 EP inside dp_shard */
  cJSON_AddNumberToObject(mesh, "etp", mp_mesh_grid_etp(&c->mesh));
  cJSON_AddNumberToObject(mesh, "pp", c->mesh.size[MP_DIM_PP]);
  cJSON_AddNumberToObject(mesh, "cp", c->mesh.size[MP_DIM_CP]);
  cJSON_AddNumberToObject(mesh, "dopt", mp_mesh_dopt(&c->mesh)); /* distributed-optimizer instances */
  cJSON_AddItemToObject(j, "mesh", mesh);
  char ac[32];
  mp_candidate_ac_str(c, ac, sizeof ac);
  cJSON_AddNumberToObject(mesh, "pp_virtual", c->pp_virtual);
  cJSON_AddBoolToObject(mesh, "pp_split_embedding_loss", c->pp_split);
  cJSON_AddStringToObject(j, "ac", ac);
  cJSON_AddBoolToObject(j, "sp", c->sp);
  cJSON_AddBoolToObject(j, "fp8", c->fp8);
  cJSON_AddNumberToObject(j, "micro_batch", (double)c->micro_batch);
  cJSON_AddBoolToObject(j, "reshard_after_forward", c->reshard);
  cJSON_AddBoolToObject(j, "vocab_padded", c->pads_vocab);
  cJSON_AddNumberToObject(j, "step_time_s", c->res.step_time_s);
  cJSON_AddNumberToObject(j, "tokens_per_s_per_gpu", c->res.tokens_per_s_per_gpu);
  cJSON_AddNumberToObject(j, "mfu", c->res.mfu);
  if (price > 0) cJSON_AddNumberToObject(j, "tokens_per_dollar", mp_tokens_per_dollar(c, price));
  cJSON_AddNumberToObject(j, "peak_mem_bytes", (double)c->res.peak_mem_bytes);
  cJSON_AddNumberToObject(j, "capacity_bytes", (double)c->res.capacity_bytes);
  cJSON_AddBoolToObject(j, "fits", c->res.fits);
  for (int k = 0; k < MP_MEM_COUNT; k++)
    cJSON_AddNumberToObject(mem, k_mem_keys[k], (double)c->res.mem_at_peak[k]);
  cJSON_AddNumberToObject(mem, "overhead_bytes", (double)c->res.overhead_bytes);
  cJSON_AddItemToObject(j, "mem_at_peak", mem);
  cJSON_AddNumberToObject(j, "compute_s", c->res.compute_s);
  cJSON_AddNumberToObject(j, "exposed_comm_s", c->res.exposed_comm_s);
  cJSON_AddNumberToObject(j, "bubble_s", c->res.bubble_s);
  return j;
}

double mp_train_days(const mp_candidate *c, int64_t n_gpus, double tokens) {
  const double rate = c->res.tokens_per_s_per_gpu * (double)n_gpus;
  return rate > 0 ? tokens / rate / 86400.0 : 0;
}

double mp_train_cost(const mp_candidate *c, double tokens, double price_per_gpu_hour) {
  const double t = c->res.tokens_per_s_per_gpu;
  return t > 0 && price_per_gpu_hour > 0 ? tokens / t / 3600.0 * price_per_gpu_hour : 0;
}

void mp_train_json(cJSON *o, const mp_candidate *c, int64_t n_gpus, double tokens, double price_per_gpu_hour) {
  cJSON_AddNumberToObject(o, "train_days", mp_train_days(c, n_gpus, tokens));
  if (price_per_gpu_hour > 0) cJSON_AddNumberToObject(o, "train_cost_usd", mp_train_cost(c, tokens, price_per_gpu_hour));
}

void mp_plan_row_settings_str(const mp_plan_row *r, char *buf, size_t cap) {
  char nccl[48] = "the newest NCCL modelled", loss[40] = "", load[40] = "", cap_s[48] = "";
  const int v = r->nccl_version; /* major x 10000 + minor x 100 + patch */
  if (v > 0) snprintf(nccl, sizeof nccl, "NCCL %d.%d.%d", v / 10000, v / 100 % 100, v % 100);
  if (r->loss_chunks > 1) snprintf(loss, sizeof loss, ", loss in %d chunks", r->loss_chunks);
  if (r->moe_imbalance > 1) snprintf(load, sizeof load, ", expert imbalance %g", r->moe_imbalance);
  if (r->moe_capacity_factor > 0) snprintf(cap_s, sizeof cap_s, ", expert capacity factor %g", r->moe_capacity_factor);
  snprintf(buf, cap, "stack %s, %s%s%s%s", r->stack[0] ? r->stack : "not recorded", nccl, loss, load, cap_s);
}
