/* Step schedule builder: a hybrid model's Mamba-2 layer (exec/model.h), forward and
 * backward, as Megatron-Core's MambaLayer runs it (megatron/core/ssm/mamba_layer.py and
 * mamba_mixer.py at core_v0.14.0, its training path mamba_split_conv1d_scan_combined):
 *
 *   norm        the pre-norm on the residual stream's [Ts, H]
 *   in_proj     column-parallel [T, H] -> [T, in/tp] (z, x, B, C, dt of the rank's heads and
 *               groups), the TP region entered (SP: all-gather)
 *   conv1d      depthwise causal conv of conv_kernel taps over x, B, C ([T, cd/tp]) and SiLU
 *   SSD scan    the chunked state-space-dual scan (Dao and Gu 2024, arXiv 2405.21060, sec. 6
 *               and its Listing 1), on chunks of Q = chunk_size tokens per head:
 *                 CB = C B^T per chunk and group          [Q, N] x [N, Q]
 *                 Y_diag = (L o CB) X per chunk and head  [Q, Q] x [Q, P]
 *                 states = B^T (decay o X) per chunk and head [N, Q] x [Q, P]
 *                 Y_off = C states per chunk and head     [Q, N] x [N, P]
 *               priced as the simulator prices batched GEMMs of those shapes (no published
 *               kernel timing is used: the GEMM bound of its tiles), its element-wise parts
 *               (dt's softplus, the decays' cumulative sums and exponentials, D x X, the
 *               inter-chunk recurrence) as one pass over its inputs and output at HBM speed
 *   norm(y, z)  RMSNorm of y gated by SiLU(z), per group of d_inner / n_groups
 *   out_proj    row-parallel [T, di/tp] -> [T, H], the region closed (SP: reduce-scatter)
 *   residual    the add
 * Backward: each GEMM's two gradients, the element-wise parts' backward reading twice what
 * the forward read. Megatron's own FLOP count (model_hybrid.c) prices the scan at 7 d_in N a
 * token; the ops here count the Listing's matmuls, 2 Q (G N + di) + 4 N di a token. */
#include "exec/schedule_internal.h"

/* The SSD scan's matmuls (the file comment); bwd: each one's two gradients. */
static void ssd_gemms(gen *g, mp_variant v) {
  const shapes *sh = &g->sh;
  const int64_t Q = sh->mb_chunk, N = sh->mb_state, P = sh->mb_head_dim;
  const int64_t chunks = (sh->tokens + Q - 1) / Q, n = v == MP_VAR_FWD ? 1 : 2;
  for (int64_t r = 0; r < n; r++) {
    gemm(g, v, -1, (double)Q, Q, N, chunks * sh->mb_groups, MP_DTYPE_BF16);
    gemm(g, v, -1, (double)Q, P, Q, chunks * sh->mb_heads, MP_DTYPE_BF16);
    gemm(g, v, -1, (double)N, P, Q, chunks * sh->mb_heads, MP_DTYPE_BF16);
    gemm(g, v, -1, (double)Q, P, N, chunks * sh->mb_heads, MP_DTYPE_BF16);
  }
}

/* The scan's element-wise parts: read x, B, C (the conv's output) and dt, write y (bf16);
 * the decays per chunk position and head in fp32. Backward reads and writes twice as much. */
static void ssd_elementwise(gen *g, mp_variant v) {
  const shapes *sh = &g->sh;
  const int64_t T = sh->tokens;
  const double bytes = 2.0 * (double)(T * (sh->mb_conv + sh->mb_heads + sh->mb_inner)) + 8.0 * (double)(T * sh->mb_heads);
  elementwise(g, MP_KERNEL_ACTIVATION, v, -1, T * sh->mb_inner, v == MP_VAR_FWD ? 4.0 : 8.0,
              v == MP_VAR_FWD ? bytes : 2.0 * bytes);
}

/* conv1d with its SiLU on [T, cd]: conv_kernel multiply-adds an element and the SiLU's four;
 * one read and one write in bf16 (the weights are small); backward the input and weight
 * gradients, reading the input and the output gradient. */
static void conv(gen *g, mp_variant v) {
  const shapes *sh = &g->sh;
  const int64_t e = sh->tokens * sh->mb_conv;
  const double f = 2.0 * (double)sh->mb_kernel + 4.0;
  elementwise(g, MP_KERNEL_ACTIVATION, v, MP_MOD_MAMBA_CONV, e, v == MP_VAR_FWD ? f : 2.0 * f,
              v == MP_VAR_FWD ? 4.0 * (double)e : 6.0 * (double)e);
}

/* The gated RMSNorm: y x SiLU(z), its sum of squares per group and the scale; reads y and z,
 * writes out_proj's input (and an fp32 rstd a group); backward reads y, z and the output
 * gradient, writes y's and z's gradients. */
static void gated_norm(gen *g, mp_variant v) {
  const shapes *sh = &g->sh;
  const int64_t e = sh->tokens * sh->mb_inner;
  elementwise(g, MP_KERNEL_NORM, v, MP_MOD_MAMBA_NORM, e, v == MP_VAR_FWD ? 8.0 : 16.0,
              (v == MP_VAR_FWD ? 6.0 : 10.0) * (double)e + 4.0 * (double)(sh->tokens * sh->mb_groups));
}

void mp_sched_mamba_fwd(gen *g, const part_deps *pd) {
  const shapes *sh = &g->sh;
  const int64_t T = sh->tokens, H = sh->d_model;
  attach(g, pd, PART_ATTN);
  mp_sched_norm_fwd(g, MP_MOD_ATTN_NORM, sh->tokens_sp, H);
  const int32_t in = g->n_ops;
  mp_sched_tp_region_in_fwd(g, sh->tp_opens_mamba, MP_MOD_MAMBA_IN, mp_sched_f8_input(g, MP_MOD_MAMBA_IN));
  mp_sched_linear_fwd(g, MP_MOD_MAMBA_IN, (double)T, sh->mb_in, H, 1);
  if (sh->tp_opens_mamba) mp_sched_fuse_tp(g, in, MP_FUSE_GATHER, MP_VAR_FWD);
  conv(g, MP_VAR_FWD);
  ssd_gemms(g, MP_VAR_FWD);
  ssd_elementwise(g, MP_VAR_FWD);
  gated_norm(g, MP_VAR_FWD);
  const int32_t out = g->n_ops;
  mp_sched_linear_fwd(g, MP_MOD_MAMBA_OUT, (double)T, H, sh->mb_inner, 1);
  mp_sched_tp_region_out_fwd(g, sh->tp_closes_mamba, MP_MOD_MAMBA_OUT);
  if (sh->tp_closes_mamba) mp_sched_fuse_tp(g, out, MP_FUSE_SCATTER, MP_VAR_FWD);
  mp_sched_residual(g, MP_VAR_FWD, sh->tokens_sp * H);
}

void mp_sched_mamba_bwd(gen *g, const part_deps *pd) {
  const shapes *sh = &g->sh;
  const int64_t T = sh->tokens, H = sh->d_model;
  attach(g, pd, PART_ATTN);
  const int32_t out = g->n_ops;
  mp_sched_tp_region_out_bwd(g, sh->tp_closes_mamba, MP_MOD_MAMBA_OUT);
  mp_sched_linear_bwd(g, MP_MOD_MAMBA_OUT, (double)T, H, sh->mb_inner, 1);
  if (sh->tp_closes_mamba) mp_sched_fuse_tp(g, out, MP_FUSE_GATHER, MP_VAR_DGRAD);
  gated_norm(g, MP_VAR_BWD);
  ssd_elementwise(g, MP_VAR_BWD);
  ssd_gemms(g, MP_VAR_DGRAD);
  conv(g, MP_VAR_BWD);
  const int32_t first = g->n_ops, ag = mp_sched_mg_regather(g, sh->tp_opens_mamba, MP_MOD_MAMBA_IN);
  mp_sched_linear_bwd(g, MP_MOD_MAMBA_IN, (double)T, sh->mb_in, H, 1);
  mp_sched_mg_regather_wait(g, ag, first);
  mp_sched_tp_region_in_bwd(g, sh->tp_opens_mamba, MP_MOD_MAMBA_IN);
  if (sh->tp_opens_mamba) mp_sched_bulk_tp(g, first, MP_MOD_MAMBA_IN);
  mp_sched_norm_bwd(g, MP_MOD_ATTN_NORM, sh->tokens_sp, H);
  if (!g->ms->runtime) mp_sched_residual(g, MP_VAR_BWD, sh->tokens_sp * H);
}

/* What a Mamba-2 layer saves for its backward under Megatron-Core (MambaMixer.forward,
 * megatron/core/ssm/mamba_mixer.py at core_v0.14.0, its use_mamba_mem_eff_path default):
 *   in_proj (TELayerNormColumnParallelLinear, the pre-norm fused in): its norm's input (the
 *     layer input, counted as the block's x), the norm's statistics (`stats`) and its saved
 *     input, the normed x (`in`)
 *   mamba_split_conv1d_scan_combined, called without rmsnorm_weight and outproj_weight
 *     (mamba_ssm/ops/triton/ssd_combined.py, MambaSplitConv1dScanCombinedFn.forward,
 *     state-spaces/mamba e9594ce): ctx.save_for_backward keeps zxbcdt, in_proj's output
 *     [T, in/tp], and out_x, the scan's output before the gate [T, di/tp] (the conv, x, B,
 *     C and the chunk states are recomputed in its backward); it returns out = out_x x
 *     SiLU(z), a second [T, di/tp] (_chunk_scan_fwd allocates out and out_x apart)
 *   self.norm, mamba_ssm's gated RMSNorm called without z (layernorm_gated.py, LayerNormFn:
 *     save_for_backward(x, weight, bias, mean, rstd, z)): its input, that gated out, and an
 *     fp32 rstd a group and token, 4 T G/tp
 *   out_proj (TERowParallelLinear): its input, the norm's output [T, di/tp] (`out_in`
 *     bytes: 2 T di/tp in bf16, less under Transformer Engine's float8: schedule_act.c)
 * bf16 tensors, 2 bytes an element. */
int64_t mp_sched_mamba_saved(const shapes *sh, int64_t stats, int64_t in, int64_t out_in) {
  const int64_t T = sh->tokens;
  return stats + in + 2 * T * sh->mb_in + 2 * 2 * T * sh->mb_inner + 4 * T * sh->mb_groups + out_in;
}
