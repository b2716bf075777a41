/* Transformer Engine's userbuffers configuration, GEMM by GEMM (sim.h, mp_ub_overlap): what
 * Megatron-Core's --tp-comm-overlap-cfg (NeMo's TransformerLayerTPOverlapCfg) states for each
 * of the ten overlapped GEMMs of a transformer layer, and TE's own default where it states
 * none (transformer_engine/pytorch/module/base.py initialize_ub get_default_config, v2.0
 * e5cc6c2). sim/cost.c prices each fused pair and bulk overlap by its GEMM's entry. */
#include <stdlib.h>
#include <string.h>

#include "sim/sim.h"

static const char *const kUbNames[MP_UB_COUNT] = {
    "qkv_fprop", "fc1_fprop", "proj_fprop", "fc2_fprop", "proj_dgrad",
    "fc2_dgrad", "qkv_dgrad", "fc1_dgrad", "qkv_wgrad", "fc1_wgrad",
};
static const char *const kUbMethods[] = {"", "ring_exchange", "pipeline", "bulk"};

/* get_default_config: ring_exchange for qkv_fprop, fc1_fprop, proj_dgrad and fc2_dgrad
 * (num_sm 1, no SM margin, use_ce: the copies on the copy engines); pipeline for proj_fprop
 * and fc2_fprop and bulk for the rest, each with num_sm 16 (the stack's ub_sms) and
 * set_sm_margin. */
mp_ub_overlap mp_sim_ub_overlap(const mp_stack_profile *p, mp_ub_gemm g) {
  if (p->ub_cfg[g].method != MP_UB_UNSET) return p->ub_cfg[g];
  mp_ub_overlap o = {MP_UB_BULK, 1, (int16_t)p->ub_sms};
  if (g <= MP_UB_FC1_FPROP || g == MP_UB_PROJ_DGRAD || g == MP_UB_FC2_DGRAD) {
    o.method = MP_UB_RING_EXCHANGE;
    o.margin = 0;
    o.sms = 1;
  } else if (g == MP_UB_PROJ_FPROP || g == MP_UB_FC2_FPROP) {
    o.method = MP_UB_PIPELINE;
  }
  return o;
}

/* One `name:method[:num_sm:set_sm_margin]` item of `len` characters into cfg. */
static mp_status parse_item(mp_ctx *ctx, const char *item, int len, mp_ub_overlap cfg[MP_UB_COUNT]) {
  char buf[96];
  if (len >= (int)sizeof buf) len = (int)sizeof buf - 1;
  memcpy(buf, item, (size_t)len);
  buf[len] = '\0';
  char *f[4] = {buf, NULL, NULL, NULL};
  int n = 1;
  for (char *c = buf; *c && n < 4; c++)
    if (*c == ':') {
      *c = '\0';
      f[n++] = c + 1;
    }
  int g = -1, m = 0;
  for (int i = 0; i < MP_UB_COUNT; i++)
    if (!strcmp(f[0], kUbNames[i])) g = i;
  for (int i = 1; n > 1 && i < 4; i++)
    if (!strcmp(f[1], kUbMethods[i])) m = i;
  char *e1 = NULL, *e2 = NULL;
  const long sms = n == 4 ? strtol(f[2], &e1, 10) : 1;
  const long margin = n == 4 ? strtol(f[3], &e2, 10) : 0;
  const int whole = n == 4 ? (e1 != f[2] && !*e1 && e2 != f[3] && !*e2) : (n == 2 && m == MP_UB_RING_EXCHANGE);
  if (g < 0 || !m || !whole || sms < 0 || sms > 1024 || (margin != 0 && margin != 1))
    return mp_error(ctx, MP_ERR_USAGE, "userbuffers overlap '%.*s': give gemm:method:num_sm:set_sm_margin "
                    "(gemm one of qkv_fprop, fc1_fprop, proj_fprop, fc2_fprop, proj_dgrad, fc2_dgrad, qkv_dgrad, "
                    "fc1_dgrad, qkv_wgrad, fc1_wgrad; method ring_exchange, pipeline or bulk; set_sm_margin 0 "
                    "or 1), or gemm:ring_exchange for num_sm 1 without margin, items split by spaces", len, item);
  cfg[g].method = (uint8_t)m;
  cfg[g].sms = (int16_t)sms;
  cfg[g].margin = (uint8_t)margin;
  return MP_OK;
}

mp_status mp_sim_ub_cfg_parse(mp_ctx *ctx, const char *text, mp_ub_overlap cfg[MP_UB_COUNT]) {
  memset(cfg, 0, sizeof(mp_ub_overlap) * MP_UB_COUNT);
  const char *s = text;
  while (*s) {
    while (*s == ' ') s++;
    if (!*s) break;
    const char *item = s;
    while (*s && *s != ' ') s++;
    MP_CHECK(parse_item(ctx, item, (int)(s - item), cfg));
  }
  return MP_OK;
}
