/* libFuzzer harness: the cluster loader (`--cluster FILE`). Its "gpu" key names a GPU
 * profile (embedded, or a path: only regular files are opened). An accepted cluster must
 * satisfy the ranges of exec/cluster.h and give finite, positive bandwidths. */
#include <math.h>

#include "common/limits.h"
#include "sim/cluster.h"
#include "tests/fuzz/fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *text = fuzz_text(data, size);
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_cluster c;
  mp_status st = mp_cluster_from_text(&ctx, text, "fuzz.json", &c);
  fuzz_check_refusal(&ctx, st);
  if (st == MP_OK) {
    const int n = mp_cluster_n_gpus(&c);
    FUZZ_ASSERT(n >= 1 && n <= MP_LIM_GPUS);
    FUZZ_ASSERT(c.intra_node_GBps_per_gpu > 0 && isfinite(c.intra_node_GBps_per_gpu));
    const double inter = mp_cluster_inter_GBps(&c);
    FUZZ_ASSERT(inter > 0 && isfinite(inter));
    FUZZ_ASSERT(c.intra_node_latency_us >= 0 && c.inter_node_latency_us >= 0);
    FUZZ_ASSERT(mp_gpu_validate(&ctx, &c.gpu, "gpu") == MP_OK);
  }
  free(text);
  return 0;
}
