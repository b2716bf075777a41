/* libFuzzer harness: the stack profile loader (`--stack FILE`). An accepted profile must
 * hold efficiencies in (0, 1], overheads >= 0, a fragmentation factor >= 1, all finite, and
 * the kernel fractions of the fit GPU it names. */
#include <math.h>

#include "sim/stack.h"
#include "tests/fuzz/fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *text = fuzz_text(data, size);
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_stack_profile p;
  mp_status st = mp_stack_from_text(&ctx, text, "fuzz.json", &p);
  fuzz_check_refusal(&ctx, st);
  if (st == MP_OK) {
    const double eff[] = {p.gemm_eff_max, p.fp8_gemm_eff_max, p.attention_eff, p.hbm_eff, p.link_eff,
                          p.saved_act_factor};
    for (size_t i = 0; i < sizeof eff / sizeof eff[0]; i++) FUZZ_ASSERT(eff[i] > 0 && eff[i] <= 1);
    FUZZ_ASSERT(isfinite(p.gemm_eff_half_mnk) && p.gemm_eff_half_mnk >= 0);
    FUZZ_ASSERT(p.kernel_overhead_s >= 0 && p.comm_overhead_s >= 0 && isfinite(p.kernel_overhead_s));
    FUZZ_ASSERT(p.frag_factor >= 1 && isfinite(p.frag_factor));
    FUZZ_ASSERT(p.gemm_table == NULL && p.fp8_gemm_table == NULL);
    /* a fit GPU always brings the kernel fractions the scaling divides by */
    FUZZ_ASSERT(p.fit_gpu[0] == '\0' ? p.fit_kernel_eff.bf16_gemm == 0 : p.fit_kernel_eff.bf16_gemm > 0);
  }
  free(text);
  return 0;
}
