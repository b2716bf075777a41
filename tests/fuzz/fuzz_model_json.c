/* libFuzzer harness: the model loader on any JSON text (meshplan's format, or a Hugging
 * Face config.json detected by its keys), as `meshplan plan --model FILE` reads it. An
 * accepted model must satisfy exec/model.h's invariants and every count of it must be
 * computable without overflow (UBSan reports a signed overflow as an error). */
#include "exec/model.h"
#include "tests/fuzz/fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *text = fuzz_text(data, size);
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_model m;
  mp_status st = mp_model_from_text(&ctx, text, "fuzz.json", &m);
  fuzz_check_refusal(&ctx, st);
  if (st == MP_OK) {
    FUZZ_ASSERT(m.vocab > 0 && m.d_model > 0 && m.n_layers > 0 && m.n_layers <= MP_MAX_LAYERS);
    FUZZ_ASSERT(m.n_heads > 0 && m.n_kv_heads > 0 && m.n_heads % m.n_kv_heads == 0 && m.head_dim > 0);
    const int64_t total = mp_model_param_count(&m), active = mp_model_active_param_count(&m);
    FUZZ_ASSERT(total > 0 && active > 0 && active <= total);
    FUZZ_ASSERT(mp_model_n_moe_layers(&m) <= m.n_layers);
    for (int64_t l = 0; l < m.n_layers; l++) FUZZ_ASSERT(mp_model_block_params(&m, l) > 0);
    const double f = mp_model_flops_per_token(&m, m.max_seq);
    FUZZ_ASSERT(f > 0);
    /* the step sizes the CLI asks for next: accepted ones must come with products that fit */
    mp_ctx_init(&ctx);
    const int64_t seqs[3] = {1, m.max_seq, (int64_t)data[0] << 16};
    for (int i = 0; i < 3; i++) {
      mp_status s2 = mp_model_check_step(&ctx, &m, seqs[i], 1 + (size > 1 ? data[1] : 0), 1 << 12);
      fuzz_check_refusal(&ctx, s2);
    }
  }
  free(text);
  return 0;
}
