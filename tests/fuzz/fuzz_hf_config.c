/* libFuzzer harness: the Hugging Face config.json importer (`meshplan plan --hf-config
 * FILE`): llama, mistral, qwen2/3 and their MoE variants, mixtral, gpt2. Accepted configs
 * must give a model whose counts are computable without overflow. */
#include "exec/model.h"
#include "tests/fuzz/fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *text = fuzz_text(data, size);
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_model m;
  mp_status st = mp_model_from_hf_text(&ctx, text, "config.json", &m);
  fuzz_check_refusal(&ctx, st);
  if (st == MP_OK) {
    FUZZ_ASSERT(m.n_heads > 0 && m.head_dim > 0 && m.n_heads % m.n_kv_heads == 0);
    FUZZ_ASSERT(mp_model_param_count(&m) >= mp_model_active_param_count(&m));
    FUZZ_ASSERT(mp_model_flops_per_token(&m, m.max_seq) > 0);
    if (m.n_experts > 0) FUZZ_ASSERT(m.top_k >= 1 && m.top_k <= m.n_experts);
  }
  free(text);
  return 0;
}
