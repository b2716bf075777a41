/* Chrome trace export of a simulated timeline (chrome://tracing, Perfetto).
 *
 * {"traceEvents": [...], "displayTimeUnit": "ms"}: one complete event ("ph": "X") per op
 * instance, pid 0, tid = the stream (named by "thread_name" metadata events), ts and dur
 * in microseconds, name = the op's FQN (mp_op_name), args = kernel or collective, bytes,
 * FLOPs, micro-batch. Ops of one stream run one after another in the simulation, so the
 * events of a track never partially overlap. The memory events make a counter track
 * ("ph": "C", name "memory (GiB)"): after each allocation or free, the bytes every
 * category the step uses holds, in GiB to 1e-4, as the simulator counts them (Perfetto
 * stacks the series), so
 * the peak the result reports is the counter's highest total (less the runtime overhead
 * and fragmentation, which are no events). Written atomically (mp_write_file_atomic). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/json.h"
#include "sim/sim.h"
#include "sim/sim_internal.h"

/* One sample of the memory counter at time t_s: the level of every category the trace
 * uses (used: bit c), in GiB to 1e-4 (0.1 MiB: short numbers keep the trace small). */
static int counter_event(cJSON *evs, double t_s, const int64_t level[MP_MEM_COUNT], unsigned used) {
  cJSON *j = cJSON_CreateObject(), *a = cJSON_CreateObject();
  if (!j || !a) {
    cJSON_Delete(j);
    cJSON_Delete(a);
    return 0;
  }
  cJSON_AddStringToObject(j, "name", "memory (GiB)");
  cJSON_AddStringToObject(j, "ph", "C");
  cJSON_AddNumberToObject(j, "pid", 0);
  cJSON_AddNumberToObject(j, "ts", t_s * 1e6);
  for (int c = 0; c < MP_MEM_COUNT; c++)
    if (used & (1u << c))
      cJSON_AddNumberToObject(a, mp_mem_cat_name((mp_mem_cat)c), round((double)level[c] / 1073741824.0 * 1e4) / 1e4);
  cJSON_AddItemToObject(j, "args", a);
  cJSON_AddItemToArray(evs, j);
  return 1;
}

mp_status mp_sim_trace_write(mp_ctx *ctx, const mp_sim_trace *t, const char *path) {
  if (t == NULL || t->s == NULL)
    return mp_error(ctx, MP_ERR_INVALID,
                    "no trace recorded; simulate with record_trace set before writing %s", path);
  const mp_schedule *s = t->s;
  cJSON *root = cJSON_CreateObject(), *evs = cJSON_CreateArray();
  if (root == NULL || evs == NULL) {
    cJSON_Delete(root);
    cJSON_Delete(evs);
    return mp_error(ctx, MP_ERR_NOMEM, "out of memory building the trace");
  }
  cJSON_AddItemToObject(root, "traceEvents", evs);
  cJSON_AddStringToObject(root, "displayTimeUnit", "ms");
  int ok = 1;
  for (int st = 0; st < MP_STREAM_COUNT && ok; st++) {
    cJSON *m = cJSON_CreateObject(), *a = cJSON_CreateObject();
    ok = m && a;
    if (!ok) {
      cJSON_Delete(m);
      cJSON_Delete(a);
      break;
    }
    cJSON_AddStringToObject(m, "name", "thread_name");
    cJSON_AddStringToObject(m, "ph", "M");
    cJSON_AddNumberToObject(m, "pid", 0);
    cJSON_AddNumberToObject(m, "tid", st);
    cJSON_AddStringToObject(a, "name", mp_stream_name((mp_stream)st));
    cJSON_AddItemToObject(m, "args", a);
    cJSON_AddItemToArray(evs, m);
  }
  char name[256];
  int64_t level[MP_MEM_COUNT] = {0};
  unsigned used = 0;
  for (size_t i = 0; i < t->n; i++)
    if (t->ev[i].mem_cat >= 0 && t->ev[i].mem_cat < MP_MEM_COUNT && t->ev[i].mem_delta != 0)
      used |= 1u << t->ev[i].mem_cat;
  for (size_t i = 0; i < t->n && ok; i++) {
    const mp_sim_event *e = &t->ev[i];
    const mp_op *op = &s->ops[e->op];
    if (e->mem_cat >= 0 && e->mem_cat < MP_MEM_COUNT) {
      level[e->mem_cat] += e->mem_delta;
      /* one sample per instant: the events issued together (a block's frees) are one step */
      const mp_sim_event *nx = i + 1 < t->n ? &t->ev[i + 1] : NULL;
      if (!nx || nx->mem_cat < 0 || nx->start_s != e->start_s) ok = counter_event(evs, e->start_s, level, used);
      continue;
    }
    cJSON *j = cJSON_CreateObject(), *a = cJSON_CreateObject();
    ok = j && a;
    if (!ok) {
      cJSON_Delete(j);
      cJSON_Delete(a);
      break;
    }
    mp_op_name(s, op, e->layer, name, sizeof name);
    cJSON_AddStringToObject(j, "name", name);
    cJSON_AddStringToObject(j, "cat", op->type == MP_OP_COMM ? "comm" : "compute");
    cJSON_AddStringToObject(j, "ph", "X");
    cJSON_AddNumberToObject(j, "pid", 0);
    cJSON_AddNumberToObject(j, "tid", op->stream);
    cJSON_AddNumberToObject(j, "ts", e->start_s * 1e6);
    cJSON_AddNumberToObject(j, "dur", e->dur_s * 1e6);
    cJSON_AddStringToObject(a, "kind", op->type == MP_OP_COMM ? mp_coll_name((mp_coll)op->coll)
                                                              : mp_kernel_name((mp_kernel)op->kernel));
    cJSON_AddStringToObject(a, "phase", mp_phase_name((mp_phase)op->phase));
    cJSON_AddNumberToObject(a, "bytes", op->bytes);
    if (op->type == MP_OP_COMPUTE) cJSON_AddNumberToObject(a, "flops", op->flops);
    if (op->count > 1) cJSON_AddNumberToObject(a, "count", op->count); /* a folded run */
    cJSON_AddNumberToObject(a, "micro", e->micro);
    cJSON_AddItemToObject(j, "args", a);
    cJSON_AddItemToArray(evs, j);
  }
  char *text = ok ? cJSON_PrintUnformatted(root) : NULL;
  cJSON_Delete(root);
  if (text == NULL) return mp_error(ctx, MP_ERR_NOMEM, "out of memory writing the trace %s", path);
  mp_status st = mp_write_file_atomic(ctx, path, text, strlen(text));
  free(text);
  return st;
}

void mp_sim_trace_busy(const mp_sim_trace *t, mp_sim_busy *out) {
  memset(out, 0, sizeof *out);
  if (t == NULL || t->s == NULL) return;
  for (size_t i = 0; i < t->n; i++) {
    const mp_op *op = &t->s->ops[t->ev[i].op];
    if (t->ev[i].mem_cat >= 0) continue; /* memory events take no time */
    if (op->type == MP_OP_COMPUTE && op->kernel < MP_KERNEL_COUNT) {
      out->kernel_s[op->kernel] += t->ev[i].dur_s;
      out->kernel_n[op->kernel]++;
    } else if (op->type == MP_OP_COMM && op->group < MP_GROUP_COUNT) {
      out->comm_s[op->group] += t->ev[i].dur_s;
      out->comm_n[op->group]++;
    }
  }
}

void mp_sim_trace_op_durations(const mp_sim_trace *t, double *dur, int64_t n_ops) {
  for (int64_t i = 0; i < n_ops; i++) dur[i] = -1.0;
  if (t == NULL || t->s == NULL) return;
  for (size_t i = 0; i < t->n; i++) {
    const int32_t op = t->ev[i].op;
    if (op < 0 || op >= n_ops || dur[op] >= 0) continue;
    dur[op] = t->ev[i].mem_cat >= 0 ? 0.0 : t->ev[i].dur_s;
  }
}
