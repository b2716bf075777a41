/* libFuzzer harness: the command-line parser (app/args.h) on any argv (the input
 * split at NUL bytes), against `meshplan train`'s option table, then every number read
 * with its range as the commands read them. An accepted number must lie in its range and
 * be finite; a refusal must be one line. */
#include <math.h>

#include "common/limits.h"
#include "app/args.h"
#include "app/options.h"
#include "tests/fuzz/fuzz_util.h"

static mp_opt k_opts[] = {
    MP_OPT_MODEL("tiny-dense"), MP_OPT_MESH(""), MP_OPT_SEQ("64"), MP_OPT_MICRO_BATCH("4"),
    MP_OPT_GLOBAL_BATCH("8"),   MP_OPT_FP8(""),  {"--lr", "LR", "learning rate", NULL},
    {"--steps", "K", "steps", NULL}, MP_OPT_END,
};
static mp_cmd_spec k_spec = {"train", "fuzz", "[options]", k_opts, 2};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *buf = fuzz_text(data, size);
  char *argv[64];
  int argc = 0;
  for (size_t i = 0; i <= size && argc < 64;) {
    argv[argc++] = buf + i;
    i += strlen(buf + i) + 1;
  }
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  const char *pos[4];
  int n_pos = 0, help = 0;
  mp_status st = mp_args_parse(&ctx, &k_spec, argc, argv, pos, &n_pos, &help);
  fuzz_check_refusal(&ctx, st);
  if (st == MP_OK) {
    FUZZ_ASSERT(n_pos >= 0 && n_pos <= 2);
    long long v = -7;
    st = mp_args_int(&ctx, &k_spec, "--seq", 1, MP_LIM_SEQ, &v);
    fuzz_check_refusal(&ctx, st);
    if (st == MP_OK && mp_args_has(&k_spec, "--seq")) FUZZ_ASSERT(v >= 1 && v <= MP_LIM_SEQ);
    v = -7;
    st = mp_args_int(&ctx, &k_spec, "--steps", 1, MP_LIM_STEPS, &v);
    fuzz_check_refusal(&ctx, st);
    if (st == MP_OK && mp_args_has(&k_spec, "--steps")) FUZZ_ASSERT(v >= 1 && v <= MP_LIM_STEPS);
    double x = -7;
    st = mp_args_double(&ctx, &k_spec, "--lr", 0, MP_LIM_LR, MP_RANGE_CLOSED, &x);
    fuzz_check_refusal(&ctx, st);
    if (st == MP_OK && mp_args_has(&k_spec, "--lr")) FUZZ_ASSERT(isfinite(x) && x >= 0 && x <= MP_LIM_LR);
  }
  free(buf);
  return 0;
}
