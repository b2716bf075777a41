/* Stack profiles (see stack.h): loading and validation. */
#include "sim/stack.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/json.h"
#include "common/validate.h"
#include "data/load.h"
#include "exec/rules.h"

/* An efficiency in (0, 1]. */
static mp_status get_eff(mp_ctx *ctx, const cJSON *j, const char *origin, const char *key,
                         double *out) {
  MP_CHECK(mp_json_get_f64(ctx, j, origin, key, 1, out));
  return mp_check_f64(ctx, origin, key, *out, 0, 1, MP_RANGE_OPEN_LO);
}

/* One of `names` (n of them) for key, or MP_ERR_INVALID listing them; a missing key leaves
 * *out. */
static mp_status get_choice(mp_ctx *ctx, const cJSON *j, const char *origin, const char *key,
                            const char *const *names, int n, int *out) {
  char v[32] = "";
  MP_CHECK(mp_json_get_str(ctx, j, origin, key, 0, v, sizeof v));
  if (v[0] == '\0') return MP_OK;
  for (int i = 0; i < n; i++)
    if (strcmp(v, names[i]) == 0) {
      *out = i;
      return MP_OK;
    }
  char list[128] = "";
  for (int i = 0; i < n; i++)
    snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "", names[i]);
  return mp_error(ctx, MP_ERR_INVALID, "%s: %s '%s' is unknown; choose %s", origin, key, v, list);
}

/* A boolean key (default dflt) that names one memory model's mechanism: read into *out,
 * and refused with "<origin>: <claim>; the <model> memory model <tail>: remove the key"
 * where a profile of another memory model sets it away from its default. */
static mp_status owned_bool(mp_ctx *ctx, const cJSON *j, const char *origin, const char *key,
                            int dflt, mp_mem_model owner, const mp_stack_profile *p,
                            const char *claim, const char *tail, int *out) {
  *out = dflt;
  MP_CHECK(mp_json_get_bool(ctx, j, origin, key, 0, out));
  if (*out != dflt && p->mem_model != owner)
    return mp_error(ctx, MP_ERR_INVALID, "%s: %s; the %s memory model %s: remove the key", origin,
                    claim, mp_mem_model_name(p->mem_model), tail);
  return MP_OK;
}

/* The SMs a flex-dispatcher backend's kernels take (key deepep_sms or hybridep_sms; 0 when
 * absent), a megatron stack's only. */
static mp_status read_dispatcher_sms(mp_ctx *ctx, const cJSON *j, const char *origin, const char *key,
                                     const char *backend, const mp_stack_profile *p, int *out) {
  *out = 0;
  MP_CHECK(mp_json_get_int(ctx, j, origin, key, 0, out));
  MP_CHECK(mp_check_i64(ctx, origin, key, *out, 0, 1024));
  if (*out > 0 && p->mem_model != MP_MEM_MODEL_MEGATRON)
    return mp_error(ctx, MP_ERR_INVALID, "%s: %s is Megatron-Core's %s dispatcher's; the %s memory model does "
                    "not run it: remove the key", origin, key, backend, mp_mem_model_name(p->mem_model));
  return MP_OK;
}

/* What the stack runs (stack.h, sim.h's mp_stack_profile): attention, loss, SP and the AC
 * policies, with their defaults by memory model. */
static mp_status read_runs(mp_ctx *ctx, const cJSON *j, const char *origin, mp_stack_profile *p) {
  static const char *const attn[] = {"flash", "materialized"};
  static const char *const loss[] = {"eager", "fused", "inplace"};
  int a = MP_ATTN_FLASH, l = p->mem_model == MP_MEM_MODEL_MEGATRON ? MP_LOSS_INPLACE : MP_LOSS_EAGER;
  MP_CHECK(get_choice(ctx, j, origin, "attention", attn, 2, &a));
  MP_CHECK(get_choice(ctx, j, origin, "loss", loss, 3, &l));
  p->attn = (mp_attn_impl)a;
  p->loss = (mp_loss_impl)l;
  p->sp = 1; /* every stack's TP runs SP unless its profile says otherwise (llm.c) */
  MP_CHECK(mp_json_get_bool(ctx, j, origin, "sequence_parallel", 0, &p->sp));
  MP_CHECK(mp_json_get_bool(ctx, j, origin, "dp_overlap", 0, &p->dp_overlap));
  MP_CHECK(owned_bool(ctx, j, origin, "distributed_optimizer", 0, MP_MEM_MODEL_MEGATRON, p,
                      "distributed_optimizer is Megatron-LM's", "does not run it", &p->dist_opt));
  static const char *const ppmb[] = {"unstated", "stages"};
  p->pp_mb_stages = 0;
  MP_CHECK(get_choice(ctx, j, origin, "pp_microbatches", ppmb, 2, &p->pp_mb_stages));
  static const char *const ppo[] = {"megatron", "torch"};
  int flavor = MP_PP_FLAVOR_MEGATRON;
  MP_CHECK(get_choice(ctx, j, origin, "pp_order", ppo, 2, &flavor));
  p->pp_flavor = (mp_pp_flavor)flavor;
  const char *const rot[] = {mp_cp_rotate_name(MP_CP_ROTATE_ALLGATHER),
                             mp_cp_rotate_name(MP_CP_ROTATE_ALLTOALL)};
  int rotate = MP_CP_ROTATE_ALLGATHER;
  if (mp_mem_model_is_runtime(p->mem_model) && cJSON_GetObjectItemCaseSensitive(j, "cp_rotate"))
    return mp_error(ctx, MP_ERR_INVALID, "%s: cp_rotate names PyTorch's context-parallel ring; the "
                    "meshplan runtimes run their own, which shifts K and V to the next rank every "
                    "step: remove the key", origin);
  MP_CHECK(get_choice(ctx, j, origin, "cp_rotate", rot, 2, &rotate));
  p->cp_rotate = (mp_cp_rotate)rotate;
  char rec[32] = "";
  MP_CHECK(mp_json_get_str(ctx, j, origin, "fp8_recipe", 0, rec, sizeof rec));
  p->fp8_recipe = MP_FP8_DEFAULT;
  if (rec[0] != '\0' && !mp_fp8_recipe_parse(rec, &p->fp8_recipe))
    return mp_error(ctx, MP_ERR_INVALID, "%s: fp8_recipe '%s' is unknown; choose tensorwise (or "
                    "current), delayed, rowwise, mxfp8, blockwise or nvfp4", origin, rec);
  if (p->fp8_recipe != MP_FP8_DEFAULT) {
    mp_status st = mp_rule_fp8_recipe_check(ctx, p->mem_model, p->fp8_recipe, 0);
    if (st != MP_OK) {
      mp_error_prefix(ctx, "%s: key 'fp8_recipe'", origin);
      return st;
    }
  }
  MP_CHECK(owned_bool(ctx, j, origin, "async_tp", 0, MP_MEM_MODEL_TORCHTITAN, p,
                      "async_tp is torchtitan's AsyncTP", "does not run it", &p->async_tp));
  int cp_overlap;
  MP_CHECK(owned_bool(ctx, j, origin, "cp_overlap", 1, MP_MEM_MODEL_TORCHTITAN, p,
                      "cp_overlap false names torchtitan's compiled ring, whose collectives wait "
                      "where issued",
                      "runs its own", &cp_overlap));
  p->cp_sync = !cp_overlap;
  MP_CHECK(owned_bool(ctx, j, origin, "tp_comm_overlap", 0, MP_MEM_MODEL_MEGATRON, p,
                      "tp_comm_overlap is Megatron-Core's (Transformer Engine's userbuffers)",
                      "does not run it", &p->tp_comm_overlap));
  if (p->tp_comm_overlap) p->async_tp = 1;
  MP_CHECK(read_dispatcher_sms(ctx, j, origin, "deepep_sms", "DeepEP", p, &p->deepep_sms));
  MP_CHECK(read_dispatcher_sms(ctx, j, origin, "hybridep_sms", "HybridEP", p, &p->hybridep_sms));
  p->ac_policies = p->mem_model == MP_MEM_MODEL_TORCHTITAN
                       ? (1u << MP_AC_NONE) | (1u << MP_AC_SELECTIVE_OP) | (1u << MP_AC_FULL)
                       : (1u << MP_AC_NONE) | (1u << MP_AC_SELECTIVE_CORE) | (1u << MP_AC_FULL);
  const cJSON *acs = cJSON_GetObjectItemCaseSensitive(j, "ac_policies");
  if (acs == NULL) return MP_OK;
  if (!cJSON_IsArray(acs) || cJSON_GetArraySize(acs) == 0)
    return mp_error(ctx, MP_ERR_INVALID, "%s: ac_policies must be a non-empty array of AC policy "
                    "names", origin);
  p->ac_policies = 0;
  const cJSON *e;
  cJSON_ArrayForEach(e, acs) {
    mp_ac_mode m;
    if (!cJSON_IsString(e) || mp_ac_mode_parse(ctx, e->valuestring, &m) != MP_OK)
      return mp_error(ctx, MP_ERR_INVALID, "%s: ac_policies: '%s' is not an AC policy; choose "
                      "none, selective, selective-op, selective-core or full", origin,
                      cJSON_IsString(e) ? e->valuestring : "(not a string)");
    p->ac_policies |= 1u << m;
  }
  return MP_OK;
}

/* "wgrad_accum_fp32" (optional, default false, the megatron memory model only): weight
 * gradients added into the fp32 main_grad; "ddp_scale_grads" and "ddp_check_grads" (the
 * same): what Megatron-LM's DDP does to a bucket before reducing it (sim.h). */
/* The SMs the stack's collectives hold beside its kernels (sim.h: ub_sms, nccl_sm_contention,
 * nccl_max_ctas), and whether its column-parallel input gradients' collectives run beside the
 * weight-gradient GEMMs (tp_dgrad_async). */
static mp_status read_comm_sms(mp_ctx *ctx, const cJSON *j, const char *origin, mp_stack_profile *p) {
  p->ub_sms = 0;
  MP_CHECK(mp_json_get_int(ctx, j, origin, "ub_sms", 0, &p->ub_sms));
  MP_CHECK(mp_check_i64(ctx, origin, "ub_sms", p->ub_sms, 0, 1024));
  if (p->ub_sms > 0 && !p->tp_comm_overlap)
    return mp_error(ctx, MP_ERR_INVALID, "%s: ub_sms is Transformer Engine's userbuffers' (tp_comm_overlap); "
                    "set tp_comm_overlap true or remove the key", origin);
  p->nccl_sm_contention = 0;
  MP_CHECK(mp_json_get_bool(ctx, j, origin, "nccl_sm_contention", 0, &p->nccl_sm_contention));
  p->nccl_max_ctas = 0;
  MP_CHECK(mp_json_get_int(ctx, j, origin, "nccl_max_ctas", 0, &p->nccl_max_ctas));
  MP_CHECK(mp_check_i64(ctx, origin, "nccl_max_ctas", p->nccl_max_ctas, 0, 64));
  return owned_bool(ctx, j, origin, "tp_dgrad_async", 0, MP_MEM_MODEL_MEGATRON, p,
                    "tp_dgrad_async is Transformer Engine's Linear backward under Megatron-Core", "does not run it",
                    &p->tp_dgrad_async);
}

static mp_status read_wgrad_accum(mp_ctx *ctx, const cJSON *j, const char *origin, mp_stack_profile *p) {
  MP_CHECK(owned_bool(ctx, j, origin, "ddp_scale_grads", 0, MP_MEM_MODEL_MEGATRON, p,
                      "ddp_scale_grads is Megatron-LM's DDP", "does not run it", &p->ddp_scale_grads));
  MP_CHECK(owned_bool(ctx, j, origin, "ddp_check_grads", 0, MP_MEM_MODEL_MEGATRON, p,
                      "ddp_check_grads is Megatron-LM's DDP", "does not run it", &p->ddp_check_grads));
  MP_CHECK(owned_bool(ctx, j, origin, "te_layer_spec", 0, MP_MEM_MODEL_MEGATRON, p,
                      "te_layer_spec is Megatron-Core's Transformer Engine layer spec", "does not run it",
                      &p->te_layer_spec));
  return owned_bool(ctx, j, origin, "wgrad_accum_fp32", 0, MP_MEM_MODEL_MEGATRON, p,
                    "wgrad_accum_fp32 is Megatron-LM's gradient accumulation fusion", "does not run it",
                    &p->wgrad_accum_fp32);
}

/* "grouped_gemm_tile_m" and "grouped_gemm_tile_k" (optional, 0..1024; 0: no padding): the
 * tile of the stack's grouped expert GEMMs; "grouped_gemm_streams" (optional, 0..64; 0: one
 * kernel over the experts): the streams its per-expert kernels go round; and
 * "fp8_block_gemm_vs_bf16" and "mxfp8_gemm_vs_bf16" (optional, 0..4; 0: none stated): its
 * Hopper block-scaled and its MXFP8 float8 GEMMs' speed over its bf16 ones (sim.h). */
static mp_status read_grouped_tile(mp_ctx *ctx, const cJSON *j, const char *origin, mp_stack_profile *p) {
  p->grouped_tile_m = p->grouped_tile_k = p->grouped_streams = 0;
  MP_CHECK(mp_json_get_int(ctx, j, origin, "grouped_gemm_tile_m", 0, &p->grouped_tile_m));
  MP_CHECK(mp_check_i64(ctx, origin, "grouped_gemm_tile_m", p->grouped_tile_m, 0, 1024));
  MP_CHECK(mp_json_get_int(ctx, j, origin, "grouped_gemm_tile_k", 0, &p->grouped_tile_k));
  MP_CHECK(mp_check_i64(ctx, origin, "grouped_gemm_tile_k", p->grouped_tile_k, 0, 1024));
  MP_CHECK(mp_json_get_int(ctx, j, origin, "grouped_gemm_streams", 0, &p->grouped_streams));
  MP_CHECK(mp_check_i64(ctx, origin, "grouped_gemm_streams", p->grouped_streams, 0, 64));
  p->fp8_block_gemm_vs_bf16 = p->mxfp8_gemm_vs_bf16 = 0.0;
  MP_CHECK(mp_json_get_f64(ctx, j, origin, "fp8_block_gemm_vs_bf16", 0, &p->fp8_block_gemm_vs_bf16));
  MP_CHECK(mp_check_f64(ctx, origin, "fp8_block_gemm_vs_bf16", p->fp8_block_gemm_vs_bf16, 0, 4, MP_RANGE_CLOSED));
  MP_CHECK(mp_json_get_f64(ctx, j, origin, "mxfp8_gemm_vs_bf16", 0, &p->mxfp8_gemm_vs_bf16));
  return mp_check_f64(ctx, origin, "mxfp8_gemm_vs_bf16", p->mxfp8_gemm_vs_bf16, 0, 4, MP_RANGE_CLOSED);
}

/* "graph_kernel_overhead_us" and "host_launch_us" (optional, 0..MP_LIM_OVERHEAD_US): -1 s
 * where absent (sim.h: no CUDA graphs stated; the kernel overhead issues a kernel). */
static mp_status read_launch_costs(mp_ctx *ctx, const cJSON *j, const char *origin, mp_stack_profile *p) {
  double graph_us = -1.0, host_us = -1.0;
  MP_CHECK(mp_json_get_f64(ctx, j, origin, "graph_kernel_overhead_us", 0, &graph_us));
  if (graph_us != -1.0)
    MP_CHECK(mp_check_f64(ctx, origin, "graph_kernel_overhead_us", graph_us, 0, MP_LIM_OVERHEAD_US, MP_RANGE_CLOSED));
  MP_CHECK(mp_json_get_f64(ctx, j, origin, "host_launch_us", 0, &host_us));
  if (host_us != -1.0)
    MP_CHECK(mp_check_f64(ctx, origin, "host_launch_us", host_us, 0, MP_LIM_OVERHEAD_US, MP_RANGE_CLOSED));
  p->graph_kernel_overhead_s = graph_us < 0 ? -1.0 : graph_us * 1e-6;
  p->host_launch_s = host_us < 0 ? -1.0 : host_us * 1e-6;
  return MP_OK;
}

/* One array of "attention_by_span" (where: its name in messages): n numbers, each in (lo, hi]. */
static mp_status span_array(mp_ctx *ctx, const cJSON *o, const char *where, const char *key, double lo,
                            double hi, double *out, int *n) {
  const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, key);
  if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) < 1 || cJSON_GetArraySize(a) > MP_ATTN_SPAN_MAX)
    return mp_error(ctx, MP_ERR_INVALID, "%s: %s must be an array of 1 to %d numbers", where, key,
                    MP_ATTN_SPAN_MAX);
  int i = 0;
  const cJSON *e;
  cJSON_ArrayForEach(e, a) {
    if (!cJSON_IsNumber(e) || !(e->valuedouble > lo) || !(e->valuedouble <= hi))
      return mp_error(ctx, MP_ERR_INVALID, "%s: %s[%d] must be a number in (%g, %g]", where, key, i, lo, hi);
    out[i++] = e->valuedouble;
  }
  if (*n > 0 && i != *n)
    return mp_error(ctx, MP_ERR_INVALID, "%s: %s has %d entries where span has %d", where, key, i, *n);
  *n = i;
  return MP_OK;
}

/* "attention_by_span" (optional; sim.h, mp_stack_profile.attn_span): spans ascending, a
 * forward and a backward fraction at each, and the measurement's source. */
static mp_status read_attention_by_span(mp_ctx *ctx, const cJSON *j, const char *origin, mp_stack_profile *p) {
  const cJSON *o = cJSON_GetObjectItemCaseSensitive(j, "attention_by_span");
  p->attn_span_n = 0;
  if (o == NULL) return MP_OK;
  char where[300];
  snprintf(where, sizeof where, "%s: attention_by_span", origin);
  if (!cJSON_IsObject(o))
    return mp_error(ctx, MP_ERR_INVALID, "%s must be an object {\"span\", \"fwd\", \"bwd\", \"source\"}", where);
  int n = 0;
  MP_CHECK(span_array(ctx, o, where, "span", 0, 1e9, p->attn_span, &n));
  for (int i = 1; i < n; i++)
    if (!(p->attn_span[i] > p->attn_span[i - 1]))
      return mp_error(ctx, MP_ERR_INVALID, "%s: span must ascend (span[%d] %g after %g)", where, i,
                      p->attn_span[i], p->attn_span[i - 1]);
  MP_CHECK(span_array(ctx, o, where, "fwd", 0, 1, p->attn_span_fwd, &n));
  MP_CHECK(span_array(ctx, o, where, "bwd", 0, 1, p->attn_span_bwd, &n));
  const cJSON *s = cJSON_GetObjectItemCaseSensitive(o, "source");
  if (!cJSON_IsString(s) || s->valuestring[0] == '\0')
    return mp_error(ctx, MP_ERR_INVALID, "%s: source must name the measurement", where);
  p->attn_span_sustained = 1.0;
  MP_CHECK(mp_json_get_f64(ctx, o, where, "sustained", 0, &p->attn_span_sustained));
  MP_CHECK(mp_check_f64(ctx, where, "sustained", p->attn_span_sustained, 0, 1, MP_RANGE_OPEN_LO));
  p->attn_span_n = n;
  return MP_OK;
}

/* "fit_gpu" (optional): the data/gpus profile the efficiencies were fitted on, whose
 * kernel fractions it must state (mp_stack_kernel_scale_of divides by them). */
static mp_status read_fit_gpu(mp_ctx *ctx, const cJSON *j, const char *origin, mp_stack_profile *p) {
  MP_CHECK(mp_json_get_str(ctx, j, origin, "fit_gpu", 0, p->fit_gpu, sizeof p->fit_gpu));
  if (p->fit_gpu[0] == '\0') return MP_OK;
  mp_gpu g;
  mp_status st = mp_gpu_load(ctx, p->fit_gpu, &g);
  if (st != MP_OK) {
    mp_error_prefix(ctx, "%s: key 'fit_gpu'", origin);
    return st;
  }
  if (!(g.kernel_eff.bf16_gemm > 0))
    return mp_error(ctx, MP_ERR_INVALID, "%s: fit_gpu '%s' states no kernel_eff, so the stack's efficiencies "
                    "cannot be carried to other GPUs; add kernel_eff to that GPU profile or drop fit_gpu",
                    origin, p->fit_gpu);
  p->fit_kernel_eff = g.kernel_eff;
  return MP_OK;
}

/* "gemm_fit" (optional, after fit_gpu): {"gpu": a data/gpus stem other than fit_gpu,
 * "gemm_eff_max": the GEMM efficiency fitted on that GPU's rows}. */
static mp_status read_gemm_fit(mp_ctx *ctx, const cJSON *j, const char *origin, mp_stack_profile *p) {
  const cJSON *o = cJSON_GetObjectItemCaseSensitive(j, "gemm_fit");
  if (o == NULL) return MP_OK;
  if (!cJSON_IsObject(o))
    return mp_error(ctx, MP_ERR_INVALID, "%s: gemm_fit must be an object {\"gpu\": ..., \"gemm_eff_max\": ...}",
                    origin);
  if (p->fit_gpu[0] == '\0')
    return mp_error(ctx, MP_ERR_INVALID, "%s: gemm_fit restates the GEMM efficiency on a GPU the stack's "
                    "efficiencies are carried to from fit_gpu; name fit_gpu, or state the efficiencies "
                    "without either", origin);
  char where[300];
  snprintf(where, sizeof where, "%s: gemm_fit", origin);
  MP_CHECK(mp_json_get_str(ctx, o, where, "gpu", 1, p->gemm_fit_gpu, sizeof p->gemm_fit_gpu));
  MP_CHECK(get_eff(ctx, o, where, "gemm_eff_max", &p->gemm_fit_eff_max));
  if (strcmp(p->gemm_fit_gpu, p->fit_gpu) == 0)
    return mp_error(ctx, MP_ERR_INVALID, "%s: gpu '%s' is fit_gpu itself: its GEMM efficiency is gemm_eff_max",
                    where, p->gemm_fit_gpu);
  mp_gpu g;
  mp_status st = mp_gpu_load(ctx, p->gemm_fit_gpu, &g);
  if (st != MP_OK) mp_error_prefix(ctx, "%s", where);
  return st;
}

mp_status mp_stack_from_text(mp_ctx *ctx, const char *text, const char *origin,
                             mp_stack_profile *out) {
  cJSON *j = NULL;
  MP_CHECK(mp_json_parse(ctx, text, origin, &j));
  mp_stack_profile p;
  memset(&p, 0, sizeof p); /* gemm_table, fp8_gemm_table NULL: only a calibration sets them */
  mp_status st;
  double kern_us = 0, comm_us = 0;
  MP_CHECK_GOTO(mp_json_get_str(ctx, j, origin, "name", 1, p.name, sizeof p.name), st, done);
  MP_CHECK_GOTO(get_eff(ctx, j, origin, "gemm_eff_max", &p.gemm_eff_max), st, done);
  MP_CHECK_GOTO(mp_json_get_f64(ctx, j, origin, "gemm_eff_half_mnk", 1, &p.gemm_eff_half_mnk),
                st, done);
  MP_CHECK_GOTO(get_eff(ctx, j, origin, "fp8_gemm_eff_max", &p.fp8_gemm_eff_max), st, done);
  MP_CHECK_GOTO(get_eff(ctx, j, origin, "attention_eff", &p.attention_eff), st, done);
  MP_CHECK_GOTO(get_eff(ctx, j, origin, "hbm_eff", &p.hbm_eff), st, done);
  /* optional: the one-pass device copies' own fraction of HBM bandwidth, where hbm_eff is an
   * effective figure for unfused chains counted at fused bytes (torchtitan-eager) */
  MP_CHECK_GOTO(mp_json_get_f64(ctx, j, origin, "copy_hbm_eff", 0, &p.hbm_eff_kernel[MP_KERNEL_COPY]), st, done);
  MP_CHECK_GOTO(mp_check_f64(ctx, origin, "copy_hbm_eff", p.hbm_eff_kernel[MP_KERNEL_COPY], 0, 1, MP_RANGE_CLOSED),
                st, done);
  MP_CHECK_GOTO(get_eff(ctx, j, origin, "link_eff", &p.link_eff), st, done);
  MP_CHECK_GOTO(mp_json_get_f64(ctx, j, origin, "kernel_overhead_us", 1, &kern_us), st, done);
  MP_CHECK_GOTO(mp_json_get_f64(ctx, j, origin, "comm_overhead_us", 1, &comm_us), st, done);
  MP_CHECK_GOTO(mp_json_get_f64(ctx, j, origin, "frag_factor", 1, &p.frag_factor), st, done);
  MP_CHECK_GOTO(mp_json_get_str(ctx, j, origin, "source", 1, p.source, sizeof p.source), st,
                done);
  MP_CHECK_GOTO(mp_check_f64(ctx, origin, "gemm_eff_half_mnk", p.gemm_eff_half_mnk, 0,
                             MP_LIM_HALF_MNK, MP_RANGE_CLOSED), st, done);
  MP_CHECK_GOTO(mp_check_f64(ctx, origin, "kernel_overhead_us", kern_us, 0, MP_LIM_OVERHEAD_US,
                             MP_RANGE_CLOSED), st, done);
  MP_CHECK_GOTO(mp_check_f64(ctx, origin, "comm_overhead_us", comm_us, 0, MP_LIM_OVERHEAD_US,
                             MP_RANGE_CLOSED), st, done);
  MP_CHECK_GOTO(mp_check_f64(ctx, origin, "frag_factor", p.frag_factor, 1, MP_LIM_FRAG,
                             MP_RANGE_CLOSED), st, done);
  p.saved_act_factor = 1.0;
  MP_CHECK_GOTO(mp_json_get_f64(ctx, j, origin, "saved_act_factor", 0, &p.saved_act_factor), st,
                done);
  MP_CHECK_GOTO(mp_check_f64(ctx, origin, "saved_act_factor", p.saved_act_factor, 0, 1,
                             MP_RANGE_OPEN_LO), st, done);
  static const char *const allocators[] = {"tracked", "pytorch-expandable"};
  MP_CHECK_GOTO(get_choice(ctx, j, origin, "allocator", allocators, 2, &p.alloc_replay), st, done);
  char mm[32] = "torchtitan";
  MP_CHECK_GOTO(mp_json_get_str(ctx, j, origin, "memory_model", 0, mm, sizeof mm), st, done);
  p.mem_model = MP_MEM_MODEL_COUNT;
  for (int m = 0; m < MP_MEM_MODEL_COUNT; m++)
    if (strcmp(mm, mp_mem_model_name((mp_mem_model)m)) == 0) p.mem_model = (mp_mem_model)m;
  if (p.mem_model == MP_MEM_MODEL_COUNT) {
    st = mp_error(ctx, MP_ERR_INVALID,
                  "%s: memory_model '%s' is unknown; choose torchtitan, meshplan-cpu, "
                  "meshplan-cuda or megatron",
                  origin, mm);
    goto done;
  }
  MP_CHECK_GOTO(read_runs(ctx, j, origin, &p), st, done);
  MP_CHECK_GOTO(read_comm_sms(ctx, j, origin, &p), st, done);
  MP_CHECK_GOTO(read_fit_gpu(ctx, j, origin, &p), st, done);
  MP_CHECK_GOTO(read_attention_by_span(ctx, j, origin, &p), st, done);
  MP_CHECK_GOTO(read_gemm_fit(ctx, j, origin, &p), st, done);
  MP_CHECK_GOTO(read_grouped_tile(ctx, j, origin, &p), st, done);
  MP_CHECK_GOTO(read_wgrad_accum(ctx, j, origin, &p), st, done);
  MP_CHECK_GOTO(read_launch_costs(ctx, j, origin, &p), st, done);
  p.kernel_overhead_s = kern_us * 1e-6;
  p.comm_overhead_s = comm_us * 1e-6;
  *out = p;
done:
  cJSON_Delete(j);
  return st;
}

/* The backward's FLOPs in a kernel benchmark's count over meshplan's: NVIDIA/cudnn-frontend
 * benchmark/sdpa_benchmark_training/benchmark_single_sdpa.py (3929da2, flops()) counts the
 * forward's two GEMMs at 2 (d_qk + d_vo) and the backward's five at 2 (3 d_qk + 2 d_vo) a
 * score, 2.5 times the forward's at equal head dims; meshplan's backward op carries twice the
 * forward's FLOPs (exec/schedule_block.c). */
#define ATTN_BWD_COUNT (2.5 / 2.0)

double mp_stack_attention_eff(const mp_stack_profile *p, double span, int bwd) {
  const int n = p->attn_span_n;
  if (n <= 0 || !(span > 0)) return p->attention_eff;
  const double *f = bwd ? p->attn_span_bwd : p->attn_span_fwd;
  const double scale = p->attn_span_sustained / (bwd ? ATTN_BWD_COUNT : 1.0);
  if (span <= p->attn_span[0]) return f[0] * scale;
  if (span >= p->attn_span[n - 1]) return f[n - 1] * scale;
  int i = 1;
  while (span > p->attn_span[i]) i++;
  const double t = log2(span / p->attn_span[i - 1]) / log2(p->attn_span[i] / p->attn_span[i - 1]);
  return (f[i - 1] + t * (f[i] - f[i - 1])) * scale;
}

/* Whether g is the stack's gemm_fit GPU, whose GEMM efficiency is stated, not carried. */
static int gemm_fitted_on(const mp_stack_profile *p, const mp_gpu *g) {
  return p->gemm_fit_gpu[0] != '\0' && strcmp(p->gemm_fit_gpu, g->name) == 0;
}

/* on / fit, or 1 where either is not stated */
static double eff_ratio(double on, double fit) { return on > 0 && fit > 0 ? on / fit : 1.0; }

void mp_stack_kernel_scale_of(const mp_stack_profile *p, const mp_gpu *g, mp_stack_kernel_scale *out) {
  out->gemm = out->fp8_gemm = out->flash = 1.0;
  out->scaled = p->fit_gpu[0] != '\0' && strcmp(p->fit_gpu, g->name) != 0;
  if (p->fit_gpu[0] == '\0') return;
  /* on the fit GPU itself each ratio is x / x, exactly 1 */
  out->gemm = eff_ratio(g->kernel_eff.bf16_gemm, p->fit_kernel_eff.bf16_gemm);
  out->fp8_gemm = eff_ratio(g->kernel_eff.fp8_gemm, p->fit_kernel_eff.fp8_gemm);
  out->flash = eff_ratio(g->kernel_eff.flash_attention, p->fit_kernel_eff.flash_attention);
  if (gemm_fitted_on(p, g)) out->gemm = p->gemm_fit_eff_max / p->gemm_eff_max;
}

/* Appends to the line in buf what g's softmax exponentials add to its attention (sim/cost.c
 * attn_exps), where its profile states attention_exp. */
static void attn_exp_format(const mp_gpu *g, char *buf, size_t cap) {
  const double x = mp_gpu_attn_exp_flops(g);
  const size_t n = strlen(buf);
  if (!(x > 0) || n >= cap) return;
  snprintf(buf + n, cap - n, "; attention's softmax exponentials %.1f FLOPs of tensor-core time each (MUFU.EX2 %g a "
           "clock an SM)", x, g->attn_exp.ex2_per_clk);
}

static void kernel_scale_line(const mp_stack_profile *p, const mp_gpu *g, char *buf, size_t cap) {
  if (p->fit_gpu[0] == '\0') {
    snprintf(buf, cap, "%s: efficiencies as stated on every GPU (no fit GPU)", p->name);
    return;
  }
  mp_stack_kernel_scale k;
  mp_stack_kernel_scale_of(p, g, &k);
  if (!k.scaled) {
    snprintf(buf, cap, "%s fitted on %s: efficiencies as stated", p->name, p->fit_gpu);
    return;
  }
  if (!(g->kernel_eff.bf16_gemm > 0)) {
    snprintf(buf, cap, "%s fitted on %s; %s states no kernel_eff: efficiencies as stated", p->name, p->fit_gpu,
             g->name);
    return;
  }
  int n = snprintf(buf, cap, "%s fitted on %s; on %s GEMM x%.3f%s, flash attention x%.3f, fp8 GEMM ", p->name,
                   p->fit_gpu, g->name, k.gemm, gemm_fitted_on(p, g) ? " (fitted there)" : "", k.flash);
  if (n < 0 || (size_t)n >= cap) return;
  if (!(g->peak_tflops[MP_DTYPE_FP8_E4M3] > 0))
    snprintf(buf + n, cap - (size_t)n, "as bf16 (%s has no fp8 units)", g->name);
  else if (!(p->fit_kernel_eff.fp8_gemm > 0))
    snprintf(buf + n, cap - (size_t)n, "as stated (%s has no fp8 units to fit it on)", p->fit_gpu);
  else
    snprintf(buf + n, cap - (size_t)n, "x%.3f", k.fp8_gemm);
}

void mp_stack_kernel_scale_format(const mp_stack_profile *p, const mp_gpu *g, char *buf, size_t cap) {
  if (cap == 0) return;
  buf[0] = '\0';
  kernel_scale_line(p, g, buf, cap);
  attn_exp_format(g, buf, cap);
}

void mp_stack_plan_options(const mp_stack_profile *p, const mp_gpu *g, mp_plan_options *o) {
  o->mem_model = p->mem_model;
  o->fp8_opts.gpu_cc = g->compute_capability;
  o->attn = p->attn;
  o->loss = p->loss;
  o->dp = p->mem_model == MP_MEM_MODEL_MEGATRON ? MP_DP_DDP : MP_DP_FSDP;
  o->ddp.overlap = p->dp_overlap;
  o->ddp.shard_optimizer = p->dist_opt;
  o->ddp.scale_grads = p->ddp_scale_grads;
  o->ddp.check_grads = p->ddp_check_grads;
  if (p->tp_comm_overlap) o->tp_comm_fused = 1;
  o->te_spec = p->te_layer_spec;
  o->cp_rotate = p->cp_rotate;
  if (o->fp8_opts.recipe == MP_FP8_DEFAULT) o->fp8_opts.recipe = p->fp8_recipe;
  o->cp_wait_at_issue = p->cp_sync;
  if (!p->sp) o->sp = 0;
  if (p->mem_model == MP_MEM_MODEL_MEGATRON) {
    /* fp16/bf16 parameters beside fp32 master weights; gradients accumulated and
     * all-reduced in fp32 main_grad buffers */
    o->fsdp.param_dtype = MP_DTYPE_FP16;
    o->fsdp.reduce_dtype = MP_DTYPE_FP32;
    o->master_dtype = MP_DTYPE_FP32;
  }
  if (p->mem_model == MP_MEM_MODEL_MESHPLAN_CPU) {
    o->fsdp.param_dtype = MP_DTYPE_FP32;
    o->master_dtype = MP_DTYPE_FP32;
  } else if (p->mem_model == MP_MEM_MODEL_MESHPLAN_CUDA) {
    o->fsdp.param_dtype = MP_DTYPE_BF16;
    o->master_dtype = MP_DTYPE_FP32;
  }
}

static mp_status parse_stack(mp_ctx *ctx, const char *text, const char *origin, void *out) {
  return mp_stack_from_text(ctx, text, origin, (mp_stack_profile *)out);
}

mp_status mp_stack_load(mp_ctx *ctx, const char *name_or_path, mp_stack_profile *out) {
  static const mp_data_kind stacks = {"stacks", "stack profile", "known", "", NULL, 0};
  return mp_data_load(ctx, &stacks, name_or_path, parse_stack, out, NULL);
}

/* GPUs default to torchtitan-compile: the one GPU stack whose efficiencies were checked
 * against published measurements (meshplan validate). meshplan-cuda stays stated, not
 * measured, until `meshplan calibrate --device cuda` has run on real hardware, so it is
 * chosen only on request (--stack meshplan-cuda). */
mp_status mp_stack_default(mp_ctx *ctx, const mp_gpu *gpu, mp_stack_profile *out) {
  return mp_stack_load(ctx, mp_gpu_is_cpu(gpu) ? "meshplan-cpu" : "torchtitan-compile",
                       out);
}
