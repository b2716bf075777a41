/* GPU and cluster profiles (see cluster.h). */
#include "exec/cluster.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/json.h"
#include "data/embedded.h"

int mp_dtype_bytes(mp_dtype t) {
  switch (t) {
    case MP_DTYPE_FP32:
    case MP_DTYPE_TF32:
      return 4;
    case MP_DTYPE_BF16:
    case MP_DTYPE_FP16:
      return 2;
    default:
      return 1;
  }
}

const char *mp_dtype_name(mp_dtype t) {
  static const char *n[] = {"fp32", "tf32", "bf16", "fp16", "fp8_e4m3", "fp8_e5m2"};
  return t < MP_DTYPE_COUNT ? n[t] : "?";
}

static int is_path(const char *s) {
  size_t n = strlen(s);
  return strchr(s, '/') != NULL || (n > 5 && strcmp(s + n - 5, ".json") == 0);
}

/* Loads the JSON of kind/name (embedded) or a path; *origin gets a name for messages. */
static mp_status load_json(mp_ctx *ctx, const char *kind, const char *what, const char *name,
                           cJSON **out, char *origin, size_t cap) {
  if (is_path(name)) {
    snprintf(origin, cap, "%s", name);
    return mp_json_parse_file(ctx, name, out);
  }
  const char *text = mp_data_find(kind, name);
  if (text == NULL) {
    char names[1024];
    mp_data_list_names(kind, names, sizeof names);
    return mp_error(ctx, MP_ERR_NOT_FOUND, "unknown %s '%s'; known: %s (or give a path to a .json file)",
                    what, name, names);
  }
  snprintf(origin, cap, "%s.json", name);
  return mp_json_parse(ctx, text, origin, out);
}

static mp_status gpu_from_json(mp_ctx *ctx, const cJSON *j, const char *origin, mp_gpu *g) {
  memset(g, 0, sizeof *g);
  MP_CHECK(mp_json_get_str(ctx, j, origin, "name", 1, g->name, sizeof g->name));
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
  MP_CHECK(mp_json_get_f64(ctx, j, origin, "mem_gib", 1, &g->mem_gib));
  MP_CHECK(mp_json_get_f64(ctx, j, origin, "hbm_GBps", 1, &g->hbm_GBps));
  MP_CHECK(mp_json_get_f64(ctx, j, origin, "nvlink_GBps_per_dir", 1, &g->nvlink_GBps_per_dir));
  MP_CHECK(mp_json_get_f64(ctx, j, origin, "runtime_overhead_gib", 0, &g->runtime_overhead_gib));
  MP_CHECK(mp_json_get_int(ctx, j, origin, "compute_capability", 0, &g->compute_capability));
  const cJSON *src = cJSON_GetObjectItemCaseSensitive(j, "source");
  if (cJSON_IsString(src)) snprintf(g->source, sizeof g->source, "%s", src->valuestring);
  if (g->peak_tflops[MP_DTYPE_BF16] <= 0 || g->mem_gib <= 0 || g->hbm_GBps <= 0)
    return mp_error(ctx, MP_ERR_INVALID,
                    "%s: peak_tflops.bf16, mem_gib and hbm_GBps must be positive", origin);
  return MP_OK;
}

mp_status mp_gpu_load(mp_ctx *ctx, const char *name_or_path, mp_gpu *out) {
  cJSON *j = NULL;
  char origin[512];
  MP_CHECK(load_json(ctx, "gpus", "GPU", name_or_path, &j, origin, sizeof origin));
  mp_status st = gpu_from_json(ctx, j, origin, out);
  cJSON_Delete(j);
  return st;
}

mp_status mp_cluster_load(mp_ctx *ctx, const char *name_or_path, mp_cluster *out) {
  cJSON *j = NULL;
  char origin[512], gpu[64];
  MP_CHECK(load_json(ctx, "clusters", "cluster", name_or_path, &j, origin, sizeof origin));
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
  if (c.gpus_per_node <= 0 || c.n_nodes <= 0) {
    st = mp_error(ctx, MP_ERR_INVALID, "%s: gpus_per_node and n_nodes must be positive", origin);
    goto done;
  }
  st = mp_gpu_load(ctx, gpu, &c.gpu);
  if (st != MP_OK) {
    mp_error_prefix(ctx, "%s: key 'gpu'", origin);
    goto done;
  }
  *out = c;
done:
  cJSON_Delete(j);
  return st;
}

mp_status mp_cluster_make(mp_ctx *ctx, const char *gpu, int n_gpus, int gpus_per_node,
                          mp_cluster *out) {
  if (n_gpus <= 0 || gpus_per_node <= 0)
    return mp_error(ctx, MP_ERR_INVALID, "--gpus and --gpus-per-node must be positive");
  if (n_gpus > gpus_per_node && n_gpus % gpus_per_node != 0)
    return mp_error(ctx, MP_ERR_INVALID,
                    "--gpus=%d is not a multiple of --gpus-per-node=%d; give whole nodes", n_gpus,
                    gpus_per_node);
  mp_cluster c;
  memset(&c, 0, sizeof c);
  MP_CHECK(mp_gpu_load(ctx, gpu, &c.gpu));
  c.gpus_per_node = n_gpus < gpus_per_node ? n_gpus : gpus_per_node;
  c.n_nodes = n_gpus / c.gpus_per_node;
  c.intra_node_GBps_per_gpu = c.gpu.nvlink_GBps_per_dir;
  c.inter_node_Gbitps_per_gpu = 400.0;
  c.intra_node_latency_us = 3.0;
  c.inter_node_latency_us = 10.0;
  snprintf(c.name, sizeof c.name, "%dx%s", n_gpus, c.gpu.name);
  *out = c;
  return MP_OK;
}

int mp_cluster_n_gpus(const mp_cluster *c) { return c->gpus_per_node * c->n_nodes; }

int mp_gpu_is_cpu(const mp_gpu *g) { return g->compute_capability == 0; }

int mp_gpu_has_float8(const mp_gpu *g) {
  return g->peak_tflops[MP_DTYPE_FP8_E4M3] > 0 && (g->compute_capability >= 89 || mp_gpu_is_cpu(g));
}

double mp_cluster_inter_GBps(const mp_cluster *c) { return c->inter_node_Gbitps_per_gpu / 8.0; }
