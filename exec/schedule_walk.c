/* Walking a step schedule: the expanding iterator, dependency resolution, per-step totals,
 * names, and the self-check (memory replay and dependency order).
 *
 * The iterator expands segments into op instances in issue order; instance indices are
 * the same in both modes (segment first_index + rep x n_ops + pos), which is what makes
 * a COMPACT schedule comparable op by op with its EXPANDED twin. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "exec/schedule.h"

void mp_schedule_iter_begin(const mp_schedule *s, mp_schedule_iter *it) {
  memset(it, 0, sizeof *it);
  it->s = s;
  it->seg = 0;
  it->rep = 0;
  it->pos = -1;
  it->index = -1;
  it->layer = -1;
  it->unit = -1;
}

int mp_schedule_iter_next(mp_schedule_iter *it) {
  const mp_schedule *s = it->s;
  if (it->seg >= s->n_segs) return 0;
  it->pos++;
  while (it->seg < s->n_segs) {
    const mp_segment *sg = &s->segs[it->seg];
    if (it->pos < sg->n_ops) break;
    it->pos = 0;
    if (++it->rep >= sg->repeat) {
      it->rep = 0;
      it->seg++;
    }
  }
  if (it->seg >= s->n_segs) {
    it->op = NULL;
    return 0;
  }
  const mp_segment *sg = &s->segs[it->seg];
  it->op = &s->ops[sg->first_op + it->pos];
  it->layer = it->op->layer < 0 ? it->op->layer : it->op->layer + it->rep * sg->layer_step;
  it->unit = it->op->unit < 0 ? it->op->unit : it->op->unit + it->rep * sg->unit_step;
  it->index++;
  return 1;
}

/* Segment holding op index i (segments cover ops in order). */
static int32_t seg_of(const mp_schedule *s, int32_t i) {
  int32_t lo = 0, hi = s->n_segs - 1;
  while (lo < hi) {
    int32_t mid = (lo + hi + 1) / 2;
    if (s->segs[mid].first_op <= i) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

int64_t mp_schedule_iter_dep(const mp_schedule_iter *it, int i) {
  const mp_schedule *s = it->s;
  if (it->op == NULL || i < 0 || i >= it->op->n_dep) return -1;
  const int32_t d = it->op->dep[i];
  if (d < 0 || d >= s->n_ops) return -1;
  const int32_t ds = seg_of(s, d);
  const mp_segment *sg = &s->segs[ds];
  int32_t rep;
  if (ds == it->seg) {
    rep = it->rep - ((it->op->dep_flags[i] & MP_DEP_PREV_REP) ? 1 : 0);
    if (rep < 0) return -1;
  } else {
    rep = sg->repeat - 1;
  }
  return sg->first_index + (int64_t)rep * sg->n_ops + (d - sg->first_op);
}

void mp_schedule_totals_compute(const mp_schedule *s, mp_schedule_totals *out) {
  memset(out, 0, sizeof *out);
  for (int32_t g = 0; g < s->n_segs; g++) {
    const mp_segment *sg = &s->segs[g];
    for (int32_t i = sg->first_op; i < sg->first_op + sg->n_ops; i++) {
      const mp_op *op = &s->ops[i];
      const double per_step = op->when == MP_WHEN_EVERY_MICRO ? (double)s->n_micro : 1.0;
      const double mult = per_step * (double)sg->repeat * (op->count > 1 ? op->count : 1);
      if (op->type == MP_OP_COMPUTE) {
        out->flops += mult * op->flops;
      } else if (op->type == MP_OP_COMM && op->coll < MP_COLL_COUNT && op->group < MP_GROUP_COUNT) {
        out->comm_bytes[op->coll][op->group] += mult * op->bytes;
        out->n_comm[op->coll][op->group] += (int64_t)mult;
      }
    }
  }
}

/* ---- names ---------------------------------------------------------------------------- */

const char *mp_kernel_name(mp_kernel k) {
  static const char *n[MP_KERNEL_COUNT] = {
      "embedding", "norm",     "rope",      "attention", "gemm",      "activation", "residual",
      "router",    "permute",  "unpermute", "loss",      "fp8_cast",  "grad_norm",  "optimizer",
      "copy"};
  return (unsigned)k < MP_KERNEL_COUNT ? n[k] : "?";
}

const char *mp_coll_name(mp_coll c) {
  static const char *n[MP_COLL_COUNT] = {"all_gather", "reduce_scatter", "all_reduce",
                                         "all_to_all", "send",           "recv",
                                         "broadcast",  "sendrecv"};
  return (unsigned)c < MP_COLL_COUNT ? n[c] : "?";
}

const char *mp_mem_cat_name(mp_mem_cat c) {
  static const char *n[MP_MEM_COUNT] = {"params", "optimizer", "grads", "gathered", "activations",
                                        "temp",   "comm",      "fp8",   "logits"};
  return (unsigned)c < MP_MEM_COUNT ? n[c] : "?";
}

const char *mp_phase_name(mp_phase p) {
  static const char *n[MP_PHASE_COUNT] = {"prologue", "forward", "recompute", "backward",
                                          "optimizer"};
  return (unsigned)p < MP_PHASE_COUNT ? n[p] : "?";
}

const char *mp_stream_name(mp_stream s) {
  static const char *n[MP_STREAM_COUNT] = {"compute", "gather", "reduce", "p2p"};
  return (unsigned)s < MP_STREAM_COUNT ? n[s] : "?";
}

static const char *variant_name(const mp_op *op) {
  if (op->kernel == MP_KERNEL_GEMM)
    return op->variant == MP_VAR_FWD ? "fwd" : op->variant == MP_VAR_DGRAD ? "dgrad" : "wgrad";
  return op->variant == MP_VAR_FWD ? "fwd" : "bwd";
}

/* "layers.3" or "" (layer < 0) followed by a separator when needed. */
static int prefix(char *buf, size_t cap, int32_t layer) {
  if (layer < 0) return 0;
  int n = snprintf(buf, cap, "layers.%d", (int)layer);
  return n < 0 ? 0 : n;
}

/* The FSDP unit an op at `layer` refers to: the first repetition's unit name with the
 * layer number replaced ("layers.0.moe" -> "layers.5.moe"). */
static void unit_name(const mp_schedule *s, const mp_op *op, int32_t layer, char *buf, size_t cap) {
  const mp_plan *p = s->plan;
  if (op->unit < 0 || p == NULL || op->unit >= p->n_units || p->units == NULL) {
    if (layer >= 0) snprintf(buf, cap, "layers.%d", (int)layer);
    else snprintf(buf, cap, "root");
    return;
  }
  const char *name = p->units[op->unit].name;
  if (layer < 0 || strncmp(name, "layers.", 7) != 0) {
    snprintf(buf, cap, "%s", name);
    return;
  }
  const char *rest = name + 7;
  while (*rest >= '0' && *rest <= '9') rest++;
  snprintf(buf, cap, "layers.%d%s", (int)layer, rest);
}

void mp_op_name(const mp_schedule *s, const mp_op *op, int32_t layer, char *buf, size_t cap) {
  if (cap == 0) return;
  buf[0] = 0;
  char where[160];
  where[0] = 0;
  int n = prefix(where, sizeof where, layer);
  if (op->module >= 0 && op->module < MP_MOD_COUNT)
    snprintf(where + n, sizeof where - (size_t)n, "%s%s", n ? "." : "",
             mp_module_name((mp_module)op->module));
  switch (op->type) {
    case MP_OP_COMPUTE: {
      const char *what = mp_kernel_name((mp_kernel)op->kernel);
      if (op->module < 0 && op->kernel == MP_KERNEL_ATTENTION) what = "attention core";
      if (where[0])
        snprintf(buf, cap, "%s %s %s%s", where, what, variant_name(op),
                 op->phase == MP_PHASE_RECOMPUTE ? " (recompute)" : "");
      else
        snprintf(buf, cap, "%s %s%s", what, variant_name(op),
                 op->phase == MP_PHASE_RECOMPUTE ? " (recompute)" : "");
      break;
    }
    case MP_OP_COMM:
      if (op->unit >= 0) {
        char un[160];
        unit_name(s, op, layer, un, sizeof un);
        snprintf(buf, cap, "%s %s %s", un, mp_coll_name((mp_coll)op->coll),
                 mp_group_name((mp_group)op->group));
      } else {
        snprintf(buf, cap, "%s%s%s %s", where, where[0] ? " " : "", mp_coll_name((mp_coll)op->coll),
                 mp_group_name((mp_group)op->group));
      }
      break;
    case MP_OP_ALLOC:
    case MP_OP_FREE: {
      char un[160];
      if (op->unit >= 0) unit_name(s, op, layer, un, sizeof un);
      else snprintf(un, sizeof un, "%s", where);
      snprintf(buf, cap, "%s%s%s %s", un, un[0] ? " " : "", op->type == MP_OP_ALLOC ? "alloc" : "free",
               mp_mem_cat_name((mp_mem_cat)op->mem_cat));
      break;
    }
    default: snprintf(buf, cap, "?"); break;
  }
}

/* ---- self-check ------------------------------------------------------------------------- */

typedef struct live_buf {
  int32_t buf, layer, unit;
  uint8_t cat;
  int64_t bytes;
  int used;
} live_buf;

mp_status mp_schedule_check(mp_ctx *ctx, const mp_schedule *s) {
  int64_t cat[MP_MEM_COUNT] = {0};
  size_t cap = 256, n = 0;
  live_buf *live = malloc(sizeof(live_buf) * cap);
  if (live == NULL) return mp_error(ctx, MP_ERR_NOMEM, "out of memory checking the schedule");
  mp_status st = MP_OK;
  char name[256];
  mp_schedule_iter it;
  mp_schedule_iter_begin(s, &it);
  while (mp_schedule_iter_next(&it)) {
    const mp_op *op = it.op;
    for (int i = 0; i < op->n_dep; i++) {
      const int64_t d = mp_schedule_iter_dep(&it, i);
      if (d >= it.index) {
        mp_op_name(s, op, it.layer, name, sizeof name);
        st = mp_error(ctx, MP_ERR_INTERNAL, "schedule op %lld (%s) depends on a later op %lld",
                      (long long)it.index, name, (long long)d);
        goto out;
      }
    }
    if (op->stream >= MP_STREAM_COUNT || op->phase >= MP_PHASE_COUNT) {
      st = mp_error(ctx, MP_ERR_INTERNAL, "schedule op %lld has stream %d phase %d",
                    (long long)it.index, op->stream, op->phase);
      goto out;
    }
    if (op->type == MP_OP_ALLOC) {
      if (n == cap) {
        live_buf *m = realloc(live, sizeof(live_buf) * cap * 2);
        if (m == NULL) {
          st = mp_error(ctx, MP_ERR_NOMEM, "out of memory checking the schedule");
          goto out;
        }
        live = m;
        cap *= 2;
      }
      live[n++] = (live_buf){op->buf, it.layer, it.unit, op->mem_cat, op->mem_bytes, 0};
      cat[op->mem_cat] += op->mem_bytes;
    } else if (op->type == MP_OP_FREE) {
      long j;
      for (j = (long)n - 1; j >= 0; j--)
        if (!live[j].used && live[j].buf == op->buf && live[j].layer == it.layer &&
            live[j].unit == it.unit)
          break;
      if (j < 0) {
        mp_op_name(s, op, it.layer, name, sizeof name);
        st = mp_error(ctx, MP_ERR_INTERNAL, "schedule op %lld (%s) frees buffer %d never allocated",
                      (long long)it.index, name, op->buf);
        goto out;
      }
      live_buf *b = &live[j];
      if (b->cat != op->mem_cat || b->bytes != op->mem_bytes) {
        mp_op_name(s, op, it.layer, name, sizeof name);
        st = mp_error(ctx, MP_ERR_INTERNAL,
                      "schedule op %lld (%s) frees %lld bytes of %s; allocated %lld of %s",
                      (long long)it.index, name, (long long)op->mem_bytes,
                      mp_mem_cat_name((mp_mem_cat)op->mem_cat), (long long)b->bytes,
                      mp_mem_cat_name((mp_mem_cat)b->cat));
        goto out;
      }
      b->used = 1;
      cat[op->mem_cat] -= op->mem_bytes;
      if (cat[op->mem_cat] < 0) {
        st = mp_error(ctx, MP_ERR_INTERNAL, "schedule memory of %s goes negative at op %lld",
                      mp_mem_cat_name((mp_mem_cat)op->mem_cat), (long long)it.index);
        goto out;
      }
    }
  }
  for (int c = 0; c < MP_MEM_COUNT; c++)
    if (cat[c] != s->resident_bytes[c]) {
      st = mp_error(ctx, MP_ERR_INTERNAL,
                    "schedule memory of %s ends the step at %lld bytes, resident is %lld",
                    mp_mem_cat_name((mp_mem_cat)c), (long long)cat[c],
                    (long long)s->resident_bytes[c]);
      goto out;
    }
out:
  free(live);
  return st;
}
