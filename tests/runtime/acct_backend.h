/* A test-only kernel backend that counts memory and computes nothing: the "acct"
 * (accounting) backend. It is the CPU backend's table (host memory, the same allocation,
 * copy and zero-fill hooks) with X tensors in bf16, as on CUDA, and every compute op and
 * dtype conversion a no-op returning MP_OK. The runtime (exec/runtime/) runs on
 * it as it runs on the GPU: its name is not "cpu", so the runtime treats its memory as
 * device memory (the staging buffer of host-value collectives is allocated), X tensors
 * are 2 bytes, compute copies of the fp32 masters are made, and float8 runs its GEMMs on
 * codes (not the fp32 emulation). The tracked allocator therefore measures, byte for byte,
 * what the CUDA runtime allocates, while tensor values are meaningless: a model the size
 * of a GPU run costs a CPU test only its memory, never its FLOPs.
 *
 * Values are never read back for control flow except MoE expert row counts: moe_plan
 * writes zero rows for every expert (the loops of no-op expert GEMMs are then empty). EP
 * sizes its expert-side buffers from the rows received, so EP plans measure nothing
 * meaningful here (the memory models assume balanced routing there).
 *
 * Invariant: every op of kernels/ops.h but the memory hooks is replaced; init refuses to
 * start (naming the count) when ops.h gains an op this file does not know, so a new kernel
 * cannot silently run the CPU code on bf16 buffers. */
#ifndef MP_TESTS_RUNTIME_ACCT_BACKEND_H
#define MP_TESTS_RUNTIME_ACCT_BACKEND_H

#include "kernels/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The accounting backend: name "acct", x_dtype MP_KDTYPE_BF16, memory hooks of the CPU
 * backend (host memory, zero-fill included). */
const mp_backend *mp_backend_acct(void);

/* The same with zero-fill and copies no-ops as well: no page of a buffer is ever touched,
 * so a run that allocates more than the machine's memory still runs (Linux overcommits
 * untouched pages) and a GPU-sized model costs only its host-side initialization. Copies
 * to the host read nothing (the runtime's host copies of losses and MoE row counts keep
 * what they held). For plans larger than a test should touch; the counts are the same. */
const mp_backend *mp_backend_acct_untouched(void);

#ifdef __cplusplus
}
#endif
#endif
