/* The search's fix (search.h): the dims and options a search is pinned to, and their
 * "key=value,..." spelling (--fix, --why). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/limits.h"
#include "planner/search.h"

void mp_search_fix_init(mp_search_fix *f) {
  f->pp = f->dp_replicate = f->dp_shard = f->cp = f->tp = f->ep = f->etp = f->dopt = -1;
  f->ac = f->ac_every = f->fp8 = f->reshard = f->sp = f->pp_virtual = -1;
  f->micro_batch = -1;
}

/* The integer field key names, NULL for ac, micro_batch and unknown keys. */
static int *int_slot(mp_search_fix *f, const char *key) {
  if (strcmp(key, "pp") == 0) return &f->pp;
  if (strcmp(key, "dp_replicate") == 0 || strcmp(key, "dp_rep") == 0) return &f->dp_replicate;
  if (strcmp(key, "dp_shard") == 0) return &f->dp_shard;
  if (strcmp(key, "cp") == 0) return &f->cp;
  if (strcmp(key, "tp") == 0) return &f->tp;
  if (strcmp(key, "ep") == 0) return &f->ep;
  if (strcmp(key, "etp") == 0) return &f->etp;
  if (strcmp(key, "dopt") == 0) return &f->dopt;
  if (strcmp(key, "fp8") == 0) return &f->fp8;
  if (strcmp(key, "reshard") == 0) return &f->reshard;
  if (strcmp(key, "sp") == 0) return &f->sp;
  if (strcmp(key, "pp_virtual") == 0 || strcmp(key, "v") == 0) return &f->pp_virtual;
  return NULL;
}

mp_status mp_search_fix_parse(mp_ctx *ctx, const char *spec, mp_search_fix *f) {
  char buf[512];
  if (!spec || strlen(spec) >= sizeof buf)
    return mp_error(ctx, MP_ERR_USAGE, "--fix: expected key=value[,key=value...], e.g. tp=8,pp=1");
  strcpy(buf, spec);
  char *save = NULL;
  for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    char *eq = strchr(tok, '=');
    if (!eq || eq == tok || !eq[1])
      return mp_error(ctx, MP_ERR_USAGE, "--fix: '%s' is not key=value (e.g. tp=8)", tok);
    *eq = 0;
    const char *key = tok, *val = eq + 1;
    if (strcmp(key, "ac") == 0) {
      int ac = -1, every = 1;
      for (int i = 0; i < MP_AC_COUNT; i++)
        if (strcmp(val, mp_ac_mode_name((mp_ac_mode)i)) == 0) ac = i;
      char *end = NULL;
      if (ac < 0 && strncmp(val, "full:", 5) == 0) {
        long n = strtol(val + 5, &end, 10);
        if (end != val + 5 && *end == '\0' && n >= 1 && n <= 65535) ac = MP_AC_FULL, every = (int)n;
      }
      if (ac < 0)
        return mp_error(ctx, MP_ERR_USAGE, "--fix: ac=%s; use none, selective, selective-op, "
                        "selective-core, full or full:N", val);
      if (f->ac >= 0) return mp_error(ctx, MP_ERR_USAGE, "--fix: ac given twice");
      f->ac = ac;
      f->ac_every = every;
      continue;
    }
    char *end = NULL;
    errno = 0;
    long long v = strtoll(val, &end, 10);
    if (*end || v < 0 || errno != 0)
      return mp_error(ctx, MP_ERR_USAGE, "--fix: %s=%s is not a non-negative integer", key, val);
    int *slot = int_slot(f, key);
    if (strcmp(key, "micro_batch") == 0 || strcmp(key, "mb") == 0) {
      if (f->micro_batch >= 0) return mp_error(ctx, MP_ERR_USAGE, "--fix: %s given twice", key);
      if (v < 1 || v > MP_LIM_GLOBAL_BATCH)
        return mp_error(ctx, MP_ERR_USAGE, "--fix: %s=%s out of range (1..%lld)", key, val,
                        (long long)MP_LIM_GLOBAL_BATCH);
      f->micro_batch = v;
      continue;
    }
    if (!slot)
      return mp_error(ctx, MP_ERR_USAGE,
                      "--fix: unknown key '%s'; keys: pp, dp_replicate, dp_shard, cp, tp, ep, etp, dopt, ac, "
                      "fp8, micro_batch, reshard, sp, pp_virtual", key);
    if (*slot >= 0) return mp_error(ctx, MP_ERR_USAGE, "--fix: %s given twice", key);
    /* etp: N >= 1 the expert grid with each expert split over N ranks (exec/mesh.h), 0 EP
     * inside dp_shard */
    int is_bool = slot == &f->fp8 || slot == &f->reshard || slot == &f->sp;
    if (slot == &f->etp) {
      if (v > MP_MESH_MAX_WORLD)
        return mp_error(ctx, MP_ERR_USAGE, "--fix: etp=%s out of range (0: EP inside dp_shard, else 1..%d)", val,
                        MP_MESH_MAX_WORLD);
      f->etp = (int)v;
      continue;
    }
    if (slot == &f->pp_virtual && (v < 1 || v > MP_PP_MAX_VIRTUAL))
      return mp_error(ctx, MP_ERR_USAGE, "--fix: %s=%s out of range (1 .. %d)", key, val,
                      MP_PP_MAX_VIRTUAL);
    if (is_bool ? v > 1 : (v < 1 || v > MP_MESH_MAX_WORLD))
      return is_bool ? mp_error(ctx, MP_ERR_USAGE, "--fix: %s=%s out of range (0 or 1)", key, val)
                     : mp_error(ctx, MP_ERR_USAGE, "--fix: %s=%s out of range (1..%d)", key, val,
                                MP_MESH_MAX_WORLD);
    *slot = (int)v;
  }
  return MP_OK;
}
