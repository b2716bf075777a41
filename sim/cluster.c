/* GPU and cluster profiles (see cluster.h). */
#include "sim/cluster.h"

#include <stdio.h>
#include <string.h>

#include "common/json.h"
#include "common/validate.h"
#include "data/load.h"

/* Other names the GPU profiles go by: the names people rent them by (h100, a100, ...:
 * the part's most common form, the SXM board with its largest memory) and the datasheet's
 * memory, form factor and power limit spelled out, as published measurements name the part
 * (shared/validation writes a100-80gb-sxm and h100-96gb-500w). Each maps to the profile of
 * the same part; names and aliases match ignoring case and the separators - _ . and space
 * (data/embedded.h). */
static const char *const k_gpu_alias[][2] = {
    {"h100", "h100-sxm"},                {"h100-80gb", "h100-sxm"},
    {"h100-80gb-sxm", "h100-sxm"},       {"h100-sxm-80gb", "h100-sxm"},
    {"h100-sxm5", "h100-sxm"},           {"h100-80gb-sxm-700w", "h100-sxm"},
    {"h100-sxm-700w", "h100-sxm"},       {"h100-94gb-500w", "h100-96gb-500w"},
    {"h100-95gb-500w", "h100-96gb-500w"}, {"h100-96gb-sxm-500w", "h100-96gb-500w"},
    {"h100-pcie-80gb", "h100-pcie"},     {"h100-80gb-pcie", "h100-pcie"},
    {"h100-nvl-94gb", "h100-nvl"},       {"h100-94gb-nvl", "h100-nvl"},
    {"a100", "a100-80gb-sxm"},           {"a100-80gb", "a100-80gb-sxm"},
    {"a100-sxm-80gb", "a100-80gb-sxm"},  {"a100-sxm4-80gb", "a100-80gb-sxm"},
    {"a100-40gb", "a100-40gb-sxm"},      {"a100-sxm-40gb", "a100-40gb-sxm"},
    {"a100-sxm4-40gb", "a100-40gb-sxm"}, {"h200-141gb-sxm", "h200"},
    {"h200-sxm", "h200"},                {"h200-141gb", "h200"},
    {"b200-180gb-sxm", "b200"},          {"b200-sxm", "b200"},
    {"l40s-48gb", "l40s"},               {"mi300x-192gb", "mi300x"},
    {"instinct-mi300x", "mi300x"},       {"h800-sxm", "h800"},
    {"h800-80gb-sxm", "h800"},           {"h800-sxm5", "h800"},
};

/* "kernel_eff" (cluster.h, mp_kernel_eff): optional as a whole, a profile without it
 * stating no kernel fractions; inside it bf16_gemm, flash_attention and a non-empty source
 * naming where the figures come from are required, fp8_gemm wherever the GPU has an fp8
 * peak, fp4_gemm optional (mp_gpu_validate checks the ranges). */
static mp_status kernel_eff_from_json(mp_ctx *ctx, const cJSON *j, const char *origin, mp_gpu *g) {
  const cJSON *ke = cJSON_GetObjectItemCaseSensitive(j, "kernel_eff");
  if (ke == NULL) return MP_OK;
  if (!cJSON_IsObject(ke))
    return mp_error(ctx, MP_ERR_INVALID, "%s: 'kernel_eff' must be an object of bf16_gemm, fp8_gemm, "
                    "flash_attention and source", origin);
  char sub[256];
  snprintf(sub, sizeof sub, "%s: kernel_eff", origin);
  mp_kernel_eff *k = &g->kernel_eff;
  MP_CHECK(mp_json_get_f64(ctx, ke, sub, "bf16_gemm", 1, &k->bf16_gemm));
  MP_CHECK(mp_json_get_f64(ctx, ke, sub, "fp8_gemm", g->peak_tflops[MP_DTYPE_FP8_E4M3] > 0, &k->fp8_gemm));
  MP_CHECK(mp_json_get_f64(ctx, ke, sub, "flash_attention", 1, &k->flash_attention));
  MP_CHECK(mp_json_get_f64(ctx, ke, sub, "fp4_gemm", 0, &k->fp4_gemm));
  const cJSON *src = cJSON_GetObjectItemCaseSensitive(ke, "source");
  if (!cJSON_IsString(src) || src->valuestring[0] == '\0')
    return mp_error(ctx, MP_ERR_INVALID, "%s: missing 'source': name the measurements the kernel fractions "
                    "come from", sub);
  return MP_OK;
}

/* "attention_exp" (cluster.h, mp_attn_exp): optional as a whole; inside it every figure
 * and a non-empty source naming where they come from are required (ranges: attn_exp_validate). */
static mp_status attn_exp_from_json(mp_ctx *ctx, const cJSON *j, const char *origin, mp_gpu *g) {
  const cJSON *ae = cJSON_GetObjectItemCaseSensitive(j, "attention_exp");
  if (ae == NULL) return MP_OK;
  char sub[256];
  snprintf(sub, sizeof sub, "%s: attention_exp", origin);
  if (!cJSON_IsObject(ae))
    return mp_error(ctx, MP_ERR_INVALID, "%s must be an object of ex2_per_clk, bf16_flops_per_clk, exposed, "
                    "ref_eff and source", sub);
  mp_attn_exp *a = &g->attn_exp;
  MP_CHECK(mp_json_get_f64(ctx, ae, sub, "ex2_per_clk", 1, &a->ex2_per_clk));
  MP_CHECK(mp_json_get_f64(ctx, ae, sub, "bf16_flops_per_clk", 1, &a->bf16_flops_per_clk));
  MP_CHECK(mp_json_get_f64(ctx, ae, sub, "exposed", 1, &a->exposed));
  MP_CHECK(mp_json_get_f64(ctx, ae, sub, "ref_eff", 1, &a->ref_eff));
  const cJSON *src = cJSON_GetObjectItemCaseSensitive(ae, "source");
  if (!cJSON_IsString(src) || src->valuestring[0] == '\0')
    return mp_error(ctx, MP_ERR_INVALID, "%s: missing 'source': name the measurements the figures come from", sub);
  return MP_OK;
}

/* attention_exp: none stated (all 0), or ex2_per_clk and bf16_flops_per_clk in (0, 1e5],
 * exposed in [0, 1] (a share of the exponentials' issue time) and ref_eff in (0, 1]. */
static mp_status attn_exp_validate(mp_ctx *ctx, const mp_gpu *g, const char *origin) {
  const mp_attn_exp *a = &g->attn_exp;
  if (a->ex2_per_clk == 0 && a->bf16_flops_per_clk == 0 && a->exposed == 0 && a->ref_eff == 0) return MP_OK;
  MP_CHECK(mp_check_f64(ctx, origin, "attention_exp.ex2_per_clk", a->ex2_per_clk, 0, 1e5, MP_RANGE_OPEN_LO));
  MP_CHECK(mp_check_f64(ctx, origin, "attention_exp.bf16_flops_per_clk", a->bf16_flops_per_clk, 0, 1e5,
                        MP_RANGE_OPEN_LO));
  MP_CHECK(mp_check_f64(ctx, origin, "attention_exp.exposed", a->exposed, 0, 1, MP_RANGE_CLOSED));
  return mp_check_f64(ctx, origin, "attention_exp.ref_eff", a->ref_eff, 0, 1, MP_RANGE_OPEN_LO);
}

double mp_gpu_attn_exp_flops(const mp_gpu *g) {
  const mp_attn_exp *a = &g->attn_exp;
  if (!(a->ex2_per_clk > 0)) return 0.0;
  return a->exposed * a->bf16_flops_per_clk / a->ex2_per_clk * a->ref_eff;
}

/* cuDNN's FP8 fused attention against its bf16 kernel at the same shape: the tensor-core
 * part FP8_DPA_TC times faster, the exposed time of the softmax's exponentials FP8_DPA_EXP
 * times the bf16 one (the MUFU rate is the same in FP8; the faster MMAs hide less of it).
 * Fitted as the GPU profiles' attention_exp is (data/gpus/b200.json) over cudnn-frontend's
 * SDPA training benchmark at fb682ce (benchmark/sdpa_benchmark_training/results/llama3.1,
 * cuDNN 9.22, frontend 1.21.1: 64 query and 8 key-value heads, head dim 128, sequence 8192,
 * batch 2, causal top_left, forward + non-deterministic backward), the GB300 doubling the
 * GB200's MUFU.EX2 rate at the same bf16 and fp8 peaks:
 *   bf16: GB200 1.397 + 4.127 = 5.524 ms, GB300 1.185 + 3.832 = 5.017 ms
 *         exposed exponentials E = 2 x (5.524 - 5.017) = 1.014 ms, tensor cores 4.510 ms
 *   fp8:  GB200 1.074 + 3.781 = 4.855 ms, GB300 0.759 + 3.087 = 3.846 ms
 *         E8 = 2 x (4.855 - 3.846) = 2.018 ms, tensor cores 2.837 ms
 * FP8_DPA_TC = 4.510 / 2.837 = 1.590; FP8_DPA_EXP = 2.018 / 1.014 = 1.990. The kernels take
 * float8 q, k, v (and output gradient): the casts are priced apart (exec/schedule_block.c). */
#define FP8_DPA_TC (4.510 / 2.837)
#define FP8_DPA_EXP (2.018 / 1.014)

double mp_attn_fp8_flops(int fp8, double flops, double exp_flops) {
  if (fp8) return flops / FP8_DPA_TC + exp_flops * FP8_DPA_EXP;
  return flops + exp_flops;
}

/* "api": cuda, rocm or cpu; absent: MP_GPU_API_AUTO (cluster.h). */
static mp_status api_from_json(mp_ctx *ctx, const cJSON *j, const char *origin, mp_gpu *g) {
  char api[16] = "";
  MP_CHECK(mp_json_get_str(ctx, j, origin, "api", 0, api, sizeof api));
  if (api[0] == '\0') g->api = MP_GPU_API_AUTO;
  else if (strcmp(api, "cuda") == 0) g->api = MP_GPU_API_CUDA;
  else if (strcmp(api, "rocm") == 0) g->api = MP_GPU_API_ROCM;
  else if (strcmp(api, "cpu") == 0) g->api = MP_GPU_API_CPU;
  else
    return mp_error(ctx, MP_ERR_INVALID, "%s: api = '%s'; accepted cuda, rocm or cpu", origin, api);
  return MP_OK;
}

static mp_status gpu_from_json(mp_ctx *ctx, const cJSON *j, const char *origin, mp_gpu *g) {
  memset(g, 0, sizeof *g);
  MP_CHECK(mp_json_get_str(ctx, j, origin, "name", 1, g->name, sizeof g->name));
  MP_CHECK(api_from_json(ctx, j, origin, g));
  const cJSON *pk = cJSON_GetObjectItemCaseSensitive(j, "peak_tflops");
  if (!cJSON_IsObject(pk))
    return mp_error(ctx, MP_ERR_INVALID, "%s: missing required object 'peak_tflops'", origin);
  char sub[256];
  snprintf(sub, sizeof sub, "%s: peak_tflops", origin);
  double fp8 = 0;
  MP_CHECK(mp_json_get_f64(ctx, pk, sub, "bf16", 1, &g->peak_tflops[MP_DTYPE_BF16]));
  g->peak_tflops[MP_DTYPE_FP16] = g->peak_tflops[MP_DTYPE_BF16];
  MP_CHECK(mp_json_get_f64(ctx, pk, sub, "fp16", 0, &g->peak_tflops[MP_DTYPE_FP16]));
  MP_CHECK(mp_json_get_f64(ctx, pk, sub, "fp32", 1, &g->peak_tflops[MP_DTYPE_FP32]));
  g->peak_tflops[MP_DTYPE_TF32] = g->peak_tflops[MP_DTYPE_FP32];
  MP_CHECK(mp_json_get_f64(ctx, pk, sub, "tf32", 0, &g->peak_tflops[MP_DTYPE_TF32]));
  MP_CHECK(mp_json_get_f64(ctx, pk, sub, "fp8", 0, &fp8));
  g->peak_tflops[MP_DTYPE_FP8_E4M3] = g->peak_tflops[MP_DTYPE_FP8_E5M2] = fp8;
  MP_CHECK(mp_json_get_f64(ctx, pk, sub, "fp4", 0, &g->fp4_tflops));
  MP_CHECK(mp_json_get_f64(ctx, j, origin, "mem_gib", 1, &g->mem_gib));
  MP_CHECK(mp_json_get_f64(ctx, j, origin, "hbm_GBps", 1, &g->hbm_GBps));
  MP_CHECK(mp_json_get_f64(ctx, j, origin, "nvlink_GBps_per_dir", 1, &g->nvlink_GBps_per_dir));
  MP_CHECK(mp_json_get_f64(ctx, j, origin, "runtime_overhead_gib", 0, &g->runtime_overhead_gib));
  MP_CHECK(mp_json_get_int(ctx, j, origin, "compute_capability", 0, &g->compute_capability));
  MP_CHECK(mp_json_get_int(ctx, j, origin, "sms", 0, &g->sms));
  MP_CHECK(mp_check_i64(ctx, origin, "sms", g->sms, 0, 1024));
  MP_CHECK(mp_json_get_int(ctx, j, origin, "nvlink_domain", 0, &g->nvlink_domain));
  MP_CHECK(mp_json_get_f64(ctx, j, origin, "host_launch_scale", 0, &g->host_launch_scale));
  MP_CHECK(mp_json_get_f64(ctx, j, origin, "host_link_GBps_per_dir", 0, &g->host_link_GBps_per_dir));
  const cJSON *src = cJSON_GetObjectItemCaseSensitive(j, "source");
  if (cJSON_IsString(src)) snprintf(g->source, sizeof g->source, "%s", src->valuestring);
  MP_CHECK(kernel_eff_from_json(ctx, j, origin, g));
  MP_CHECK(attn_exp_from_json(ctx, j, origin, g));
  return mp_gpu_validate(ctx, g, origin);
}

/* kernel_eff: none stated (all 0), or each figure a fraction of its peak: bf16_gemm and
 * flash_attention in (0, 1], fp8_gemm in (0, 1] on a GPU with an fp8 peak and 0 on one
 * without (a fraction of no peak would scale nothing). */
static mp_status kernel_eff_validate(mp_ctx *ctx, const mp_gpu *g, const char *origin) {
  const mp_kernel_eff *k = &g->kernel_eff;
  if (k->bf16_gemm == 0 && k->fp8_gemm == 0 && k->flash_attention == 0) return MP_OK;
  MP_CHECK(mp_check_f64(ctx, origin, "kernel_eff.bf16_gemm", k->bf16_gemm, 0, 1, MP_RANGE_OPEN_LO));
  MP_CHECK(mp_check_f64(ctx, origin, "kernel_eff.flash_attention", k->flash_attention, 0, 1, MP_RANGE_OPEN_LO));
  if (g->peak_tflops[MP_DTYPE_FP8_E4M3] > 0)
    return mp_check_f64(ctx, origin, "kernel_eff.fp8_gemm", k->fp8_gemm, 0, 1, MP_RANGE_OPEN_LO);
  if (k->fp8_gemm != 0)
    return mp_error(ctx, MP_ERR_INVALID, "%s: kernel_eff.fp8_gemm = %g but peak_tflops.fp8 is 0 (no float8 "
                    "units); drop kernel_eff.fp8_gemm or state the fp8 peak", origin, k->fp8_gemm);
  return MP_OK;
}

/* kernel_eff.fp4_gemm: 0, or in (0, 1] on a GPU with an fp4 peak. */
static mp_status fp4_eff_validate(mp_ctx *ctx, const mp_gpu *g, const char *origin) {
  const double e = g->kernel_eff.fp4_gemm;
  if (e != 0 && !(g->fp4_tflops > 0))
    return mp_error(ctx, MP_ERR_INVALID, "%s: kernel_eff.fp4_gemm = %g but peak_tflops.fp4 is 0 (no FP4 "
                    "tensor cores); drop kernel_eff.fp4_gemm or state the fp4 peak", origin, e);
  return e == 0 ? MP_OK : mp_check_f64(ctx, origin, "kernel_eff.fp4_gemm", e, 0, 1, MP_RANGE_OPEN_LO);
}

mp_status mp_gpu_validate(mp_ctx *ctx, const mp_gpu *g, const char *origin) {
  static const struct {
    mp_dtype t;
    const char *key;
  } peaks[] = {{MP_DTYPE_BF16, "peak_tflops.bf16"}, {MP_DTYPE_FP16, "peak_tflops.fp16"},
               {MP_DTYPE_FP32, "peak_tflops.fp32"}, {MP_DTYPE_TF32, "peak_tflops.tf32"}};
  for (size_t i = 0; i < sizeof peaks / sizeof peaks[0]; i++)
    MP_CHECK(mp_check_f64(ctx, origin, peaks[i].key, g->peak_tflops[peaks[i].t], 0, MP_LIM_TFLOPS,
                          MP_RANGE_OPEN_LO));
  /* 0: no float8 units */
  MP_CHECK(mp_check_f64(ctx, origin, "peak_tflops.fp8", g->peak_tflops[MP_DTYPE_FP8_E4M3], 0,
                        MP_LIM_TFLOPS, MP_RANGE_CLOSED));
  MP_CHECK(mp_check_f64(ctx, origin, "peak_tflops.fp4", g->fp4_tflops, 0, MP_LIM_TFLOPS, MP_RANGE_CLOSED));
  MP_CHECK(mp_check_f64(ctx, origin, "mem_gib", g->mem_gib, 0, MP_LIM_MEM_GIB, MP_RANGE_OPEN_LO));
  MP_CHECK(mp_check_f64(ctx, origin, "hbm_GBps", g->hbm_GBps, 0, MP_LIM_MEM_GBPS, MP_RANGE_OPEN_LO));
  MP_CHECK(mp_check_f64(ctx, origin, "nvlink_GBps_per_dir", g->nvlink_GBps_per_dir, 0,
                        MP_LIM_LINK_GBPS, MP_RANGE_OPEN_LO));
  MP_CHECK(mp_check_f64(ctx, origin, "host_link_GBps_per_dir", g->host_link_GBps_per_dir, 0, MP_LIM_LINK_GBPS,
                        MP_RANGE_CLOSED));
  /* the overhead must leave memory to plan with */
  MP_CHECK(mp_check_f64(ctx, origin, "runtime_overhead_gib", g->runtime_overhead_gib, 0, g->mem_gib,
                        MP_RANGE_OPEN_HI));
  MP_CHECK(mp_check_i64(ctx, origin, "compute_capability", g->compute_capability, 0,
                        MP_LIM_COMPUTE_CAPABILITY));
  MP_CHECK(mp_check_i64(ctx, origin, "nvlink_domain", g->nvlink_domain, 0, MP_LIM_GPUS));
  /* 0: not stated; else a host at most 100x slower or faster than the DGX H100's */
  if (g->host_launch_scale != 0)
    MP_CHECK(mp_check_f64(ctx, origin, "host_launch_scale", g->host_launch_scale, 0.01, 100, MP_RANGE_CLOSED));
  /* CUDA's compute capability is what the runtime's kernels and float8 are chosen by */
  if (g->api == MP_GPU_API_CUDA && g->compute_capability == 0)
    return mp_error(ctx, MP_ERR_INVALID, "%s: api cuda needs its compute_capability (90 for sm_90)", origin);
  MP_CHECK(fp4_eff_validate(ctx, g, origin));
  MP_CHECK(attn_exp_validate(ctx, g, origin));
  return kernel_eff_validate(ctx, g, origin);
}

mp_status mp_cluster_validate(mp_ctx *ctx, const mp_cluster *c, const char *origin) {
  MP_CHECK(mp_check_i64(ctx, origin, "gpus_per_node", c->gpus_per_node, 1, MP_LIM_GPUS_PER_NODE));
  MP_CHECK(mp_check_i64(ctx, origin, "n_nodes", c->n_nodes, 1, MP_LIM_GPUS));
  if ((int64_t)c->gpus_per_node * c->n_nodes > MP_LIM_GPUS)
    return mp_error(ctx, MP_ERR_INVALID,
                    "%s: gpus_per_node x n_nodes = %lld GPUs is out of range; accepted 1..%lld",
                    origin, (long long)c->gpus_per_node * c->n_nodes, (long long)MP_LIM_GPUS);
  MP_CHECK(mp_check_i64(ctx, origin, "nvlink_domain", c->nvlink_domain, 0, MP_LIM_GPUS));
  /* a link of no bandwidth would make its collectives free, a negative latency a negative
   * step time */
  MP_CHECK(mp_check_f64(ctx, origin, "intra_node_GBps_per_gpu", c->intra_node_GBps_per_gpu, 0,
                        MP_LIM_LINK_GBPS, MP_RANGE_OPEN_LO));
  MP_CHECK(mp_check_f64(ctx, origin, "inter_node_Gbitps_per_gpu", c->inter_node_Gbitps_per_gpu, 0,
                        MP_LIM_LINK_GBPS, MP_RANGE_OPEN_LO));
  MP_CHECK(mp_check_f64(ctx, origin, "intra_node_latency_us", c->intra_node_latency_us, 0,
                        MP_LIM_LATENCY_US, MP_RANGE_CLOSED));
  MP_CHECK(mp_check_f64(ctx, origin, "inter_node_latency_us", c->inter_node_latency_us, 0,
                        MP_LIM_LATENCY_US, MP_RANGE_CLOSED));
  return mp_check_f64(ctx, origin, "price_per_gpu_hour", c->price_per_gpu_hour, 0, MP_LIM_PRICE,
                      MP_RANGE_CLOSED);
}

/* A profile's JSON to its struct (gpu_from_json, cluster_from_json). */
typedef mp_status (*from_json_fn)(mp_ctx *ctx, const cJSON *j, const char *origin, void *out);

/* What load_with's parse step turns a file's text into. */
typedef struct profile_parse {
  from_json_fn fn;
  void *out;
} profile_parse;

/* text as JSON, converted by fn. The profile's own messages name it by at most 511 bytes
 * of origin. */
static mp_status parse_profile(mp_ctx *ctx, const char *text, const char *origin, void *arg) {
  const profile_parse *p = (const profile_parse *)arg;
  cJSON *j = NULL;
  MP_CHECK(mp_json_parse(ctx, text, origin, &j));
  char name[512];
  snprintf(name, sizeof name, "%s", origin);
  mp_status st = p->fn(ctx, j, name, p->out);
  cJSON_Delete(j);
  return st;
}

/* The profile of text (origin names it) or, when text is NULL, of kind loaded by name or
 * path (data/load.h; a GPU also by a datasheet alias), converted into out by fn. */
static mp_status load_with(mp_ctx *ctx, const mp_data_kind *kind, const char *name,
                           const char *text, from_json_fn fn, void *out) {
  profile_parse p = {fn, out};
  if (text == NULL) return mp_data_load(ctx, kind, name, parse_profile, &p, NULL);
  char origin[512];
  snprintf(origin, sizeof origin, "%s", name);
  return parse_profile(ctx, text, origin, &p);
}

static const mp_data_kind k_gpus = {"gpus", "GPU", "known",
                                    ", or a common or datasheet name such as h100, a100 or h100-80gb-sxm",
                                    k_gpu_alias,
                                    sizeof k_gpu_alias / sizeof k_gpu_alias[0]};
static const mp_data_kind k_clusters = {"clusters", "cluster", "known", "", NULL, 0};

static mp_status gpu_fn(mp_ctx *ctx, const cJSON *j, const char *origin, void *out) {
  return gpu_from_json(ctx, j, origin, (mp_gpu *)out);
}

mp_status mp_gpu_from_text(mp_ctx *ctx, const char *text, const char *origin, mp_gpu *out) {
  return load_with(ctx, &k_gpus, origin, text, gpu_fn, out);
}

mp_status mp_gpu_load(mp_ctx *ctx, const char *name_or_path, mp_gpu *out) {
  return load_with(ctx, &k_gpus, name_or_path, NULL, gpu_fn, out);
}

/* The cluster described by j; its "gpu" is loaded by name or path (mp_gpu_load). */
static mp_status cluster_from_json(mp_ctx *ctx, const cJSON *j, const char *origin, mp_cluster *out) {
  char gpu[64];
  mp_cluster c;
  memset(&c, 0, sizeof c);
  mp_status st;
  MP_CHECK_GOTO(mp_json_get_str(ctx, j, origin, "name", 1, c.name, sizeof c.name), st, done);
  MP_CHECK_GOTO(mp_json_get_str(ctx, j, origin, "gpu", 1, gpu, sizeof gpu), st, done);
  MP_CHECK_GOTO(mp_json_get_int(ctx, j, origin, "gpus_per_node", 1, &c.gpus_per_node), st, done);
  MP_CHECK_GOTO(mp_json_get_int(ctx, j, origin, "n_nodes", 1, &c.n_nodes), st, done);
  MP_CHECK_GOTO(mp_json_get_f64(ctx, j, origin, "intra_node_GBps_per_gpu", 1,
                                &c.intra_node_GBps_per_gpu), st, done);
  MP_CHECK_GOTO(mp_json_get_f64(ctx, j, origin, "inter_node_Gbitps_per_gpu", 1,
                                &c.inter_node_Gbitps_per_gpu), st, done);
  c.intra_node_latency_us = 3.0;
  c.inter_node_latency_us = 10.0;
  MP_CHECK_GOTO(mp_json_get_f64(ctx, j, origin, "intra_node_latency_us", 0,
                                &c.intra_node_latency_us), st, done);
  MP_CHECK_GOTO(mp_json_get_f64(ctx, j, origin, "inter_node_latency_us", 0,
                                &c.inter_node_latency_us), st, done);
  MP_CHECK_GOTO(mp_json_get_f64(ctx, j, origin, "price_per_gpu_hour", 0, &c.price_per_gpu_hour),
                st, done);
  MP_CHECK_GOTO(mp_json_get_int(ctx, j, origin, "nvlink_domain", 0, &c.nvlink_domain), st, done);
  st = mp_gpu_load(ctx, gpu, &c.gpu);
  if (st != MP_OK) {
    mp_error_prefix(ctx, "%s: key 'gpu'", origin);
    goto done;
  }
  /* absent: the GPU's, as the part is sold */
  if (!cJSON_GetObjectItemCaseSensitive(j, "nvlink_domain")) c.nvlink_domain = c.gpu.nvlink_domain;
  MP_CHECK_GOTO(mp_cluster_validate(ctx, &c, origin), st, done);
  *out = c;
done:
  return st;
}

static mp_status cluster_fn(mp_ctx *ctx, const cJSON *j, const char *origin, void *out) {
  return cluster_from_json(ctx, j, origin, (mp_cluster *)out);
}

mp_status mp_cluster_from_text(mp_ctx *ctx, const char *text, const char *origin, mp_cluster *out) {
  return load_with(ctx, &k_clusters, origin, text, cluster_fn, out);
}

mp_status mp_cluster_load(mp_ctx *ctx, const char *name_or_path, mp_cluster *out) {
  return load_with(ctx, &k_clusters, name_or_path, NULL, cluster_fn, out);
}

mp_status mp_cluster_make(mp_ctx *ctx, const char *gpu, int64_t n_gpus, int64_t gpus_per_node,
                          mp_cluster *out) {
  MP_CHECK(mp_check_i64(ctx, NULL, "--gpus", n_gpus, 1, MP_LIM_GPUS));
  MP_CHECK(mp_check_i64(ctx, NULL, "--gpus-per-node", gpus_per_node, 1, MP_LIM_GPUS_PER_NODE));
  if (n_gpus > gpus_per_node && n_gpus % gpus_per_node != 0)
    return mp_error(ctx, MP_ERR_INVALID,
                    "--gpus=%lld is not a multiple of --gpus-per-node=%lld; give whole nodes",
                    (long long)n_gpus, (long long)gpus_per_node);
  mp_cluster c;
  memset(&c, 0, sizeof c);
  MP_CHECK(mp_gpu_load(ctx, gpu, &c.gpu));
  c.gpus_per_node = (int)(n_gpus < gpus_per_node ? n_gpus : gpus_per_node);
  c.n_nodes = (int)(n_gpus / c.gpus_per_node);
  c.intra_node_GBps_per_gpu = c.gpu.nvlink_GBps_per_dir;
  c.inter_node_Gbitps_per_gpu = 400.0;
  c.intra_node_latency_us = 3.0;
  c.inter_node_latency_us = 10.0;
  c.nvlink_domain = c.gpu.nvlink_domain;
  snprintf(c.name, sizeof c.name, "%lldx%s", (long long)n_gpus, c.gpu.name);
  *out = c;
  return MP_OK;
}

int mp_cluster_n_gpus(const mp_cluster *c) { return c->gpus_per_node * c->n_nodes; }

int mp_cluster_nvlink_domain(const mp_cluster *c) {
  const int gpn = c->gpus_per_node > 0 ? c->gpus_per_node : 1, world = mp_cluster_n_gpus(c);
  if (c->nvlink_domain <= gpn) return gpn;
  if (c->nvlink_domain >= world) return world;
  int k = c->nvlink_domain / gpn; /* nodes a domain, down to one that divides the nodes */
  while (k > 1 && c->n_nodes % k != 0) k--;
  return k * gpn;
}

mp_gpu_api mp_gpu_api_of(const mp_gpu *g) {
  if (g->api != MP_GPU_API_AUTO) return g->api;
  return g->compute_capability > 0 ? MP_GPU_API_CUDA : MP_GPU_API_CPU;
}

const char *mp_gpu_api_name(mp_gpu_api a) {
  switch (a) {
    case MP_GPU_API_CUDA: return "cuda";
    case MP_GPU_API_ROCM: return "rocm";
    case MP_GPU_API_CPU: return "cpu";
    default: return "auto";
  }
}

int mp_gpu_is_cpu(const mp_gpu *g) { return mp_gpu_api_of(g) == MP_GPU_API_CPU; }

int mp_gpu_runtime_drives(const mp_gpu *g) { return mp_gpu_api_of(g) != MP_GPU_API_ROCM; }

mp_status mp_gpu_check_cuda(mp_ctx *ctx, const mp_gpu *g, const char *runtime) {
  const mp_gpu_api a = mp_gpu_api_of(g);
  if (a == MP_GPU_API_CUDA) return MP_OK;
  return mp_error(ctx, MP_ERR_USAGE,
                  "GPU %s has no CUDA (%s): %s cannot drive it; it is planned and simulated only (under "
                  "a torchtitan or Megatron stack)", g->name, mp_gpu_api_name(a), runtime);
}

int mp_gpu_has_float8(const mp_gpu *g) {
  return g->peak_tflops[MP_DTYPE_FP8_E4M3] > 0 &&
         (g->compute_capability >= 89 || mp_gpu_api_of(g) == MP_GPU_API_ROCM || mp_gpu_is_cpu(g));
}

double mp_cluster_inter_GBps(const mp_cluster *c) { return c->inter_node_Gbitps_per_gpu / 8.0; }
