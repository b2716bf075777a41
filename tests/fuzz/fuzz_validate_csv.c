/* libFuzzer harness: the rows of `meshplan validate FILE.csv` (app/validate_csv.h),
 * read and range-checked as the command reads them before it simulates anything. Every
 * accepted row must hold values within the ranges the header states, and a global_batch
 * that is local_batch on each data-parallel rank. */
#include "common/limits.h"
#include "app/validate_csv.h"
#include "tests/fuzz/fuzz_util.h"

#include <math.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *text = fuzz_text(data, size);
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_vrow *rows = NULL;
  int n = 0;
  mp_status st = mp_vcsv_read(&ctx, text, "fuzz.csv", &rows, &n);
  fuzz_check_refusal(&ctx, st);
  if (st == MP_OK) {
    FUZZ_ASSERT(n >= 1 && n <= MP_VCSV_MAX_ROWS && rows != NULL);
    for (int i = 0; i < n; i++) {
      const mp_vrow *r = &rows[i];
      FUZZ_ASSERT(isfinite(r->value) && r->value > 0);
      FUZZ_ASSERT(r->inter_node_gbps == 0 || (isfinite(r->inter_node_gbps) && r->inter_node_gbps > 0));
      FUZZ_ASSERT(r->gpus >= 1 && r->gpus <= MP_LIM_GPUS && r->seq >= 1 && r->seq <= MP_LIM_SEQ);
      FUZZ_ASSERT(r->micro_batch == 0 || (r->micro_batch >= 1 && r->local_batch % r->micro_batch == 0));
      /* local_batch is one data-parallel rank's share of global_batch (each factor <= 2^24 or 2^20) */
      FUZZ_ASSERT((double)r->local_batch * (double)r->dp_replicate * (double)r->dp_shard == (double)r->global_batch);
      FUZZ_ASSERT(r->sp >= -1 && r->sp <= 1 && r->pp_virtual >= 0);
      FUZZ_ASSERT(r->fp8 == 0 || r->fp8 == 1);
      FUZZ_ASSERT(r->model[0] && r->gpu[0] && r->stack[0] && r->line >= 2);
    }
  }
  free(rows);
  free(text);
  return 0;
}
