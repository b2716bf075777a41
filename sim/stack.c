/* Stack profiles (see stack.h): loading and validation. */
#include "sim/stack.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/json.h"
#include "common/validate.h"
#include "data/embedded.h"

static int is_path(const char *s) {
  size_t n = strlen(s);
  return strchr(s, '/') != NULL || (n > 5 && strcmp(s + n - 5, ".json") == 0);
}

/* An efficiency in (0, 1]. */
static mp_status get_eff(mp_ctx *ctx, const cJSON *j, const char *origin, const char *key,
                         double *out) {
  MP_CHECK(mp_json_get_f64(ctx, j, origin, key, 1, out));
  return mp_check_f64(ctx, origin, key, *out, 0, 1, MP_RANGE_OPEN_LO);
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
  char mm[32] = "torchtitan";
  MP_CHECK_GOTO(mp_json_get_str(ctx, j, origin, "memory_model", 0, mm, sizeof mm), st, done);
  if (strcmp(mm, "torchtitan") == 0) {
    p.mem_model = MP_MEM_MODEL_TORCHTITAN;
  } else if (strcmp(mm, "meshplan-cpu") == 0) {
    p.mem_model = MP_MEM_MODEL_MESHPLAN_CPU;
  } else if (strcmp(mm, "meshplan-cuda") == 0) {
    p.mem_model = MP_MEM_MODEL_MESHPLAN_CUDA;
  } else {
    st = mp_error(ctx, MP_ERR_INVALID,
                  "%s: memory_model '%s' is unknown; choose torchtitan, meshplan-cpu or "
                  "meshplan-cuda",
                  origin, mm);
    goto done;
  }
  p.kernel_overhead_s = kern_us * 1e-6;
  p.comm_overhead_s = comm_us * 1e-6;
  *out = p;
done:
  cJSON_Delete(j);
  return st;
}

void mp_stack_plan_options(const mp_stack_profile *p, mp_plan_options *o) {
  o->mem_model = p->mem_model;
  if (p->mem_model == MP_MEM_MODEL_MESHPLAN_CPU) {
    o->fsdp.param_dtype = MP_DTYPE_FP32;
    o->master_dtype = MP_DTYPE_FP32;
  } else if (p->mem_model == MP_MEM_MODEL_MESHPLAN_CUDA) {
    o->fsdp.param_dtype = MP_DTYPE_BF16;
    o->master_dtype = MP_DTYPE_FP32;
  }
}

mp_status mp_stack_load(mp_ctx *ctx, const char *name_or_path, mp_stack_profile *out) {
  if (is_path(name_or_path)) {
    char *text = NULL;
    size_t len = 0;
    MP_CHECK(mp_read_file_max(ctx, name_or_path, MP_FILE_MAX_CONFIG_BYTES, &text, &len));
    mp_status st = mp_stack_from_text(ctx, text, name_or_path, out);
    free(text);
    return st;
  }
  const char *text = mp_data_find("stacks", name_or_path);
  if (text == NULL) {
    char names[1024];
    mp_data_list_names("stacks", names, sizeof names);
    return mp_error(ctx, MP_ERR_NOT_FOUND,
                    "unknown stack profile '%s'; known: %s (or give a path to a .json file)",
                    name_or_path, names);
  }
  char origin[128];
  snprintf(origin, sizeof origin, "%s.json", name_or_path);
  return mp_stack_from_text(ctx, text, origin, out);
}

/* GPUs default to torchtitan-compile: the one GPU stack whose efficiencies were checked
 * against published measurements (meshplan validate). meshplan-cuda stays stated, not
 * measured, until `meshplan calibrate --device cuda` has run on real hardware, so it is
 * chosen only on request (--stack meshplan-cuda). */
mp_status mp_stack_default(mp_ctx *ctx, const mp_gpu *gpu, mp_stack_profile *out) {
  return mp_stack_load(ctx, mp_gpu_is_cpu(gpu) ? "meshplan-cpu" : "torchtitan-compile",
                       out);
}
