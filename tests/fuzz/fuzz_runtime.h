/* A stand-in for the training runtime in the harnesses of the readers that load into one
 * (fuzz_safetensors: `train --init-from`; fuzz_ckpt_manifest: `train --resume`).
 *
 * The readers call five functions of exec/runtime/runtime.h: the plan, a parameter's tile
 * on this rank, writing a state's tile, agreeing on a status over the ranks and setting
 * the step count. Linking the real runtime would bring in the kernels, the collectives and
 * MPI; these definitions give the readers the real plan (exec/plan.h, built for a model and
 * mesh) and the real tiles (mp_param_tile of one rank), as the runtime's param_place does,
 * and hand every written tile to the harness, which checks it against its own reading of
 * the input. One rank at a time: agreeing is the local status. */
#ifndef MP_TESTS_FUZZ_FUZZ_RUNTIME_H
#define MP_TESTS_FUZZ_FUZZ_RUNTIME_H

#include "exec/runtime/runtime.h"

/* Called with every tile written: parameter i, state k, the tile's box off/len (ndim of
 * the parameter) and its elements at src, row-major. */
typedef void (*fuzz_runtime_write_fn)(const mp_runtime *rt, int i, mp_state_kind k, const int64_t *off,
                                      const int64_t *len, const float *src, void *arg);

struct mp_runtime {
  const mp_plan *plan;
  int rank;
  int64_t steps;
  fuzz_runtime_write_fn on_write;
  void *arg;
};

/* Builds the plan of the model (meshplan's JSON) on the mesh spec over world ranks, with
 * FSDP when the mesh shards (as `train` builds it); MP_OK or a refusal. */
mp_status fuzz_runtime_plan(mp_ctx *ctx, const char *model_json, const char *mesh, int world, mp_plan **out);

#endif
