/* libFuzzer harness: the GPU profile loader (`--gpu FILE`). An accepted profile must hold
 * finite, positive peaks, memory and bandwidths, leave memory to plan with, and state its
 * kernel fractions whole or not at all. */
#include <math.h>

#include "sim/cluster.h"
#include "tests/fuzz/fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *text = fuzz_text(data, size);
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_gpu g;
  mp_status st = mp_gpu_from_text(&ctx, text, "fuzz.json", &g);
  fuzz_check_refusal(&ctx, st);
  if (st == MP_OK) {
    for (int t = 0; t < MP_DTYPE_COUNT; t++) FUZZ_ASSERT(isfinite(g.peak_tflops[t]) && g.peak_tflops[t] >= 0);
    FUZZ_ASSERT(g.peak_tflops[MP_DTYPE_BF16] > 0 && g.mem_gib > 0 && g.hbm_GBps > 0 && g.nvlink_GBps_per_dir > 0);
    FUZZ_ASSERT(g.runtime_overhead_gib >= 0 && g.runtime_overhead_gib < g.mem_gib);
    /* the capacity the simulator derives: bytes of memory less the overhead */
    const double cap = (g.mem_gib - g.runtime_overhead_gib) * 1073741824.0;
    FUZZ_ASSERT(cap > 0 && cap < 9.2e18);
    (void)mp_gpu_has_float8(&g);
    /* kernel fractions: none stated, or bf16 GEMM and flash attention in (0, 1] and an fp8
     * fraction exactly where there is an fp8 peak */
    const mp_kernel_eff *k = &g.kernel_eff;
    FUZZ_ASSERT(k->bf16_gemm >= 0 && k->bf16_gemm <= 1 && k->fp8_gemm >= 0 && k->fp8_gemm <= 1 &&
                k->flash_attention >= 0 && k->flash_attention <= 1);
    FUZZ_ASSERT((k->bf16_gemm > 0) == (k->flash_attention > 0));
    if (k->bf16_gemm > 0) FUZZ_ASSERT((k->fp8_gemm > 0) == (g.peak_tflops[MP_DTYPE_FP8_E4M3] > 0));
  }
  free(text);
  return 0;
}
