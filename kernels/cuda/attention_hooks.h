/* Test and tuning hooks of the CUDA attention kernels (attention.cu, attention_fa2.cu), C
 * callable, for tests/kernels_cuda/attention_test.cc and bench/attention_bench.c. They
 * change process-wide choices of the kernels; the runtime never calls them. Defined only
 * in a CUDA build (MP_HAVE_CUDA): callers use them under that macro.
 *
 * force_scalar(1) routes attention through the scalar kernels, (0) returns to the default
 * (MP_ATTENTION_KERNEL=scalar in the environment, read once).
 *
 * Tile configurations of the tensor-core kernels: MP_FA2_FWD, MP_FA2_DKDV, MP_FA2_DQ have
 * n_configs(kernel) configurations each; the environment (MP_ATTENTION_FWD_CFG,
 * MP_ATTENTION_DKDV_CFG, MP_ATTENTION_DQ_CFG, read once) selects one for head dims 64 and
 * 128 (unset: the tuned default measured on an H100; 32 and 96 always run 0).
 * force_config(kernel, cfg) overrides the environment (cfg -1: back to it); config(kernel)
 * is the one in effect (-2: unset, the tuned default; -1: the environment names no
 * configuration, an error at the next call).
 * bwd_kernels(mask) makes attention_backward launch only the kernels whose bit
 * (1u << MP_FA2_DKDV, 1u << MP_FA2_DQ, 1u << MP_FA2_DOT for D = rowsum(dout * out)) is
 * set, 0 = all: leaving the dot kernel out reuses the D left in the context's scratch by
 * the previous backward, so it is for timing one kernel right after a full backward.
 * config_info describes configuration cfg at head dim 64 or 128 ("BM128 BN64 8w Qreg
 * 1st") and reports its registers, shared memory, local (spill) bytes and resident
 * blocks per SM on kc's device (0 where it does not fit). */
#ifndef MP_KERNELS_CUDA_ATTENTION_HOOKS_H
#define MP_KERNELS_CUDA_ATTENTION_HOOKS_H

#include <stddef.h>

#include "common/status.h"
#include "kernels/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { MP_FA2_FWD = 0, MP_FA2_DKDV = 1, MP_FA2_DQ = 2, MP_FA2_DOT = 3 };

void mp_cuda_attention_force_scalar(int on);
int mp_cuda_attention_fa2_n_configs(int kernel);
int mp_cuda_attention_fa2_config(int kernel);
void mp_cuda_attention_fa2_force_config(int kernel, int cfg);
void mp_cuda_attention_fa2_bwd_kernels(unsigned mask);
mp_status mp_cuda_attention_fa2_config_info(mp_kctx *kc, int kernel, int cfg, int hd,
                                            char *desc, size_t desc_bytes, int *regs,
                                            int *smem_bytes, int *local_bytes,
                                            int *blocks_per_sm);

#ifdef __cplusplus
}
#endif
#endif
