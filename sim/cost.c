/* What each op of a schedule costs, and the schedule compiled into the engine's form
 * (engine.h) with those costs.
 *
 * Compute ops: a roofline with the stack's efficiencies, max(flops / (peak x efficiency),
 * bytes / (HBM x hbm_eff)) + the stack's kernel overhead. A GEMM's efficiency follows the
 * curve eff_max x / (x + half_mnk) of its size x = m n k, times the stack's by-shape
 * correction where it has one (sim/gemm_table.h); a grouped expert GEMM's tokens are padded
 * to the stack's tile first (grouped_padding); attention at the bf16 peak x attention_eff or
 * the stack's fraction for the call's span (attn_rate_of), efficiencies carried from the
 * stack's fit GPU by the ratio of kernel fractions (sim/stack.h, mp_stack_kernel_scale_of),
 * plus the softmax exponentials' exposed time where the GPU states its MUFU rate (attn_exps);
 * element-wise ops, norms and the optimizer at the fp32 peak (CUDA cores).
 * Communication ops: the alpha-beta model of sim/network.c on the link of the op's
 * group, with the stack's link efficiency and per-collective overhead.
 *
 * Invariant: every cost is computed with the same operations in the same order wherever
 * it is needed (op_costs holds per-GPU, per-stack products worked out once), so the
 * planner's results are identical to the bit across runs and threads. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sim/engine.h"
#include "sim/gemm_table.h"
#include "sim/stack.h"
#include "sim/workspace.h"

/* ---- compute ------------------------------------------------------------------------ */

double mp_sim_peak_flops(const mp_gpu *g, int dtype) {
  double p = dtype < MP_DTYPE_COUNT ? g->peak_tflops[dtype] : 0.0;
  if (p <= 0) p = g->peak_tflops[MP_DTYPE_BF16];
  return p * 1e12;
}

/* The per-GPU, per-stack constants of mp_sim_compute_op_s, worked out once per schedule:
 * the same products of the same operands, so the same values to the bit. */
typedef struct op_costs {
  double hbm;                    /* achieved HBM bytes/s */
  double peak[MP_DTYPE_COUNT];   /* peak_flops of each dtype */
  int has_peak[MP_DTYPE_COUNT];  /* the GPU states a positive peak for the dtype */
  double attn_rate;              /* bf16 peak x attention_eff */
  double attn_flash;             /* the flash ratio attention's efficiencies are carried by */
  const mp_stack_profile *stack; /* its attention_by_span, where it states one */
  double attn_exp_flops;         /* an exponential's exposed time in FLOPs (attn_exps) */
  double gemm_eff_max, fp8_gemm_eff_max, half_mnk, kernel_overhead_s;
  double block_eff_max[MP_FP8_BLOCK_MX + 1]; /* float8 GEMMs' ceilings by mp_op.fp8_block (block_ceiling) */
  double fp4_peak, fp4_eff_max;  /* NVFP4 GEMMs (mp_op.fp4): the FP4 peak and its ceiling */
  const mp_gemm_table *gemm_table;     /* the stack's by-shape correction (bf16), or NULL */
  const mp_gemm_table *fp8_gemm_table; /* the same for float8 GEMMs, or NULL */
  double hbm_k[MP_KERNEL_COUNT];   /* per kernel class: hbm, or its own efficiency's */
  int tile_m, tile_k;              /* the stack's grouped-GEMM tile (token rows, reduction) */
  int grouped_streams;             /* its per-expert kernels' streams (0: one kernel) */
  double wgrad_accum_bytes;        /* bytes an element a fused weight-gradient accumulation
                                      adds over a bf16 write (mp_sim_wgrad_accum_bytes) */
} op_costs;

/* An efficiency carried from the stack's fit GPU to this one (sim/stack.h): eff x ratio,
 * at most the whole peak. A ratio of 1 (the fit GPU, or no fit GPU) leaves eff to the bit. */
static double carried_eff(double eff, double ratio) {
  const double e = eff * ratio;
  return e > 1.0 ? 1.0 : e;
}

/* Block-scaled float8 GEMMs' ceiling (mp_op.fp8_block): the stack's bf16 one (carried to the
 * GPU) x their stated speed over bf16 r x bf16 / fp8 peak, at most the per-tensor one (Hopper's
 * scale the fp32 partial sums each 128-deep K block, MXFP8's read an E8M0 scale per 32 along
 * K: work per-tensor kernels do not have). None stated: the per-tensor ceiling. */
static double block_ceiling(const op_costs *k, double r) {
  const double f8 = k->peak[MP_DTYPE_FP8_E4M3];
  if (!(r > 0) || !(f8 > 0)) return k->fp8_gemm_eff_max;
  const double e = k->gemm_eff_max * r * k->peak[MP_DTYPE_BF16] / f8;
  return e < k->fp8_gemm_eff_max ? e : k->fp8_gemm_eff_max;
}

/* The ceiling of NVFP4 GEMMs (mp_op.fp4) against the GPU's FP4 peak: the stack's bf16
 * ceiling carried to the GPU times the GPU's NVFP4 GEMM fraction over its bf16 one
 * (kernel_eff.fp4_gemm / bf16_gemm, both from the GPU profile's published measurements):
 * the stack's kernels reach the same share of what the GPU's NVFP4 kernels reach as of its
 * bf16 ones. 0 where the profile states none (mp_sim_fp4_check refuses such a plan). */
static double fp4_ceiling(const op_costs *k, const mp_gpu *g) {
  const mp_kernel_eff *e = &g->kernel_eff;
  if (!(e->fp4_gemm > 0) || !(e->bf16_gemm > 0)) return 0.0;
  return carried_eff(k->gemm_eff_max, e->fp4_gemm / e->bf16_gemm);
}

/* The costs of ops on GPU g under stack p, for plan's options where they price an op (NULL:
 * the defaults). */
static void op_costs_init(op_costs *k, const mp_gpu *g, const mp_stack_profile *p, const mp_plan *plan) {
  k->hbm = g->hbm_GBps * 1e9 * p->hbm_eff;
  for (int d = 0; d < MP_DTYPE_COUNT; d++) {
    k->peak[d] = mp_sim_peak_flops(g, d);
    k->has_peak[d] = !(g->peak_tflops[d] <= 0);
  }
  /* the one place a stack's kernel efficiencies meet the GPU they run on */
  mp_stack_kernel_scale sc;
  mp_stack_kernel_scale_of(p, g, &sc);
  k->attn_rate = mp_sim_peak_flops(g, MP_DTYPE_BF16) * carried_eff(p->attention_eff, sc.flash);
  k->attn_flash = sc.flash;
  k->stack = p;
  k->attn_exp_flops = mp_gpu_attn_exp_flops(g);
  k->gemm_eff_max = carried_eff(p->gemm_eff_max, sc.gemm);
  k->fp8_gemm_eff_max = carried_eff(p->fp8_gemm_eff_max, sc.fp8_gemm);
  k->block_eff_max[0] = k->fp8_gemm_eff_max;
  k->block_eff_max[MP_FP8_BLOCK_HOPPER] = block_ceiling(k, p->fp8_block_gemm_vs_bf16);
  k->block_eff_max[MP_FP8_BLOCK_MX] = block_ceiling(k, p->mxfp8_gemm_vs_bf16);
  k->fp4_peak = g->fp4_tflops * 1e12;
  k->fp4_eff_max = fp4_ceiling(k, g);
  k->half_mnk = p->gemm_eff_half_mnk;
  k->kernel_overhead_s = p->kernel_overhead_s;
  k->gemm_table = p->gemm_table;
  k->fp8_gemm_table = p->fp8_gemm_table;
  for (int c = 0; c < MP_KERNEL_COUNT; c++)
    k->hbm_k[c] = g->hbm_GBps * 1e9 * (p->hbm_eff_kernel[c] > 0 ? p->hbm_eff_kernel[c] : p->hbm_eff);
  k->tile_m = p->grouped_tile_m;
  k->tile_k = p->grouped_tile_k;
  k->grouped_streams = p->grouped_streams;
  k->wgrad_accum_bytes = mp_sim_wgrad_accum_bytes(p, plan);
}

/* The main_grad a fused weight-gradient accumulation reads and writes has the run's gradient
 * dtype: Megatron-LM allocates it as fp32 under grad_reduce_in_fp32 and as the parameter's
 * dtype without it (--grad-reduce-in-bf16, NeMo's grad_reduce_in_fp32=False: the plan's
 * fsdp.reduce_dtype; megatron/core/distributed/distributed_data_parallel.py core_v0.14.0,
 * grad_dtype, and Megatron FSDP's main_grads_dtype alike), and Transformer Engine's
 * weight-gradient GEMM writes it in that dtype with accumulate (out_dtype = main_grad.dtype,
 * out = main_grad: transformer_engine/pytorch/module/linear.py and layernorm_linear.py v2.5;
 * grouped_linear.py hands the main_grads themselves as the outputs). So an element costs a
 * read and a write of that dtype: 8 bytes in fp32, 6 more than the bf16 write mp_gemm_bytes
 * counts; 4 in bf16, 2 more. */
double mp_sim_wgrad_accum_bytes(const mp_stack_profile *p, const mp_plan *plan) {
  if (!p->wgrad_accum_fp32 || (plan && plan->opts.ddp.wgrad_unfused)) return 0.0;
  const mp_dtype main_grad = plan ? plan->opts.fsdp.reduce_dtype : MP_DTYPE_FP32;
  return 2.0 * (double)mp_dtype_bytes(main_grad) - 2.0;
}

/* The HBM bytes of an op. A weight gradient accumulated into the main_grad (sim.h,
 * wgrad_accum_fp32) reads and writes its [m x n] output per expert in the main_grad's dtype:
 * wgrad_accum_bytes more an element than the 2 of the bf16 write mp_gemm_bytes counts. */
static double op_bytes(const mp_op *op, const op_costs *k) {
  if (!(k->wgrad_accum_bytes > 0.0) || op->kernel != MP_KERNEL_GEMM || op->variant != MP_VAR_WGRAD)
    return op->bytes;
  const double batch = (double)(op->batch > 0 ? op->batch : 1);
  return op->bytes + k->wgrad_accum_bytes * (double)op->m * (double)op->n * batch;
}

/* A grouped expert GEMM (mp_op.grouped) is one launch over `batch` experts, each its own
 * problem: forward and input gradient [rows x k] x [k x n], weight gradient [m x tokens] x
 * [tokens x n]. Its kernel covers each expert's tokens in whole tiles (CUTLASS's grouped
 * GEMM and PyTorch's torch._grouped_mm assign each problem its own tiles; the stack's tile,
 * sim.h), so the MMA work is that of the tokens rounded up to the tile: *size (m n k x
 * batch, which the efficiency curve reads: the tiles of every expert fill the GPU together
 * in the one launch) and *flops become the padded ones where the tile pads. The bytes stay
 * the op's: each expert's weights read once and its real rows (the tile's padding rows are
 * masked, not loaded). */
static void grouped_padding(const mp_op *op, const op_costs *k, double *size, double *flops) {
  const int wgrad = op->variant == MP_VAR_WGRAD;
  const int tile = wgrad ? k->tile_k : k->tile_m;
  const int64_t t = wgrad ? op->k : op->m;
  if (tile <= 1 || t <= 0 || t % tile == 0) return;
  const int64_t padded = (t + tile - 1) / tile * tile;
  const double batch = (double)(op->batch > 0 ? op->batch : 1);
  const double m = (double)(wgrad ? op->m : padded), kk = (double)(wgrad ? padded : op->k);
  *size = m * (double)op->n * kk * batch;
  *flops = 2.0 * *size;
}

/* The kernels a grouped expert GEMM launches. Under a stack of grouped_gemm_streams s > 0
 * (sim.h) each of its `batch` experts is its own GEMM kernel: Transformer Engine's
 * GroupedLinear (transformer_engine/pytorch/module/grouped_linear.py, v2.2, the release
 * Megatron-MoE-ModelZoo's container installs) hands general_grouped_gemm one GEMM per
 * expert, and nvte_multi_stream_cublas_gemm (transformer_engine/common/gemm/
 * cublaslt_gemm.cu) launches each with nvte_cublas_gemm on compute stream i % num_streams,
 * num_streams = 4 (include/transformer_engine/gemm.h). So the op pays the launch overhead
 * once per expert: the streams overlap the kernels on the GPU, but one host thread issues
 * them in turn, each nvte_cublas_gemm creating its cuBLASLt descriptors and querying
 * cublasLtMatmulAlgoGetHeuristic before its cublasLtMatmul. And the kernels that fill the
 * GPU together are the min(batch, s) in flight, not all of them: the efficiency curve reads
 * *size (the padded m n k x batch) of that many experts. The FLOPs and bytes stay the op's.
 * A grouped float8 cast (mp_op.grouped on an FP8_CAST: Transformer Engine's GroupedLinear
 * quantizing expert by expert, exec/schedule_ops.c te_expert_casts) launches `batch`
 * kernels whatever the streams. Otherwise one kernel. */
static int64_t launches_of(const mp_op *op, int streams) {
  const int64_t batch = op->batch > 0 ? op->batch : 1;
  if (op->grouped && op->kernel == MP_KERNEL_FP8_CAST) return batch; /* a quantize an expert */
  return op->grouped && streams > 0 && op->kernel == MP_KERNEL_GEMM ? batch : 1;
}

static double grouped_launches(const mp_op *op, const op_costs *k, double *size) {
  const int64_t launches = launches_of(op, k->grouped_streams);
  if (launches <= 1) return 1.0;
  const int64_t in_flight = launches < k->grouped_streams ? launches : k->grouped_streams;
  *size = *size / (double)launches * (double)in_flight;
  return (double)launches;
}

double mp_sim_op_launches(const mp_op *op, const mp_stack_profile *p) {
  return (double)launches_of(op, p->grouped_streams);
}

/* An attention op's rate: a call over op->n keys at the stack's fraction for that span and
 * pass where it states them (attention_by_span), carried as attention_eff is; else
 * attention_eff's. */
static double attn_rate_of(const mp_op *op, const op_costs *k) {
  if (!(k->stack->attn_span_n > 0) || op->n <= 0) return k->attn_rate;
  const double eff = mp_stack_attention_eff(k->stack, (double)op->n, op->variant != MP_VAR_FWD);
  return k->peak[MP_DTYPE_BF16] * carried_eff(eff, k->attn_flash);
}

/* The softmax exponentials of a fused attention core (m tokens, k = head_dim), in the FLOPs
 * their exposed time is worth at the op's rate (sim/cluster.h, mp_gpu_attn_exp_flops): one
 * a score element in each pass, whose forward FLOPs are 2 x (head_dim + v_head_dim) an
 * element, the backward's twice those (exec/schedule_block.c), v_head_dim taken as head_dim.
 * 0 on a GPU stating none, and for the ring's merge kernels (k = 0). */
static double attn_exps(const mp_op *op, const op_costs *k) {
  if (!(k->attn_exp_flops > 0) || op->k <= 0) return 0.0;
  const double per_elem = (op->variant == MP_VAR_BWD ? 8.0 : 4.0) * (double)op->k;
  return op->flops / per_elem * k->attn_exp_flops;
}

/* An op's time at the whole GPU: *flops_s its arithmetic (tensor or CUDA cores), *bytes_s its
 * HBM traffic, *launch_s its launches' overhead; it takes max(flops, bytes) + launch. */
static inline void op_compute_parts(const mp_op *op, const op_costs *k, double *flops_s, double *bytes_s,
                                    double *launch_s) {
  const double hbm = op->kernel < MP_KERNEL_COUNT ? k->hbm_k[op->kernel] : k->hbm;
  double t_bytes = hbm > 0 ? op_bytes(op, k) / hbm : 0.0, t_flops, launches = 1.0;
  const int dt = op->dtype < MP_DTYPE_COUNT ? op->dtype : MP_DTYPE_BF16;
  int fp8 = op->dtype == MP_DTYPE_FP8_E4M3 || op->dtype == MP_DTYPE_FP8_E5M2;
  if (op->kernel == MP_KERNEL_GEMM) {
    double size = (double)op->m * (double)op->n * (double)op->k *
                  (double)(op->batch > 0 ? op->batch : 1);
    double flops = op->flops;
    if (op->grouped) grouped_padding(op, k, &size, &flops);
    launches = grouped_launches(op, k, &size);
    const double f8_max = k->block_eff_max[op->fp8_block <= MP_FP8_BLOCK_MX ? op->fp8_block : 0];
    double eff = (fp8 ? f8_max : k->gemm_eff_max) * size / (size + k->half_mnk);
    const mp_gemm_table *table = fp8 ? k->fp8_gemm_table : k->gemm_table;
    if (fp8 && !k->has_peak[op->dtype]) /* no fp8 units: runs as bf16 (not measured so) */
      eff = k->gemm_eff_max * size / (size + k->half_mnk);
    else if (table && op->batch <= 1 && !op->grouped) /* measured by shape: batch-1 dense GEMMs */
      eff *= mp_gemm_table_factor(table, op->variant, (double)op->m, (double)op->n,
                                  (double)op->k);
    if (op->fp4 && k->fp4_peak > 0 && k->fp4_eff_max > 0) /* NVFP4: the FP4 tensor cores */
      eff = k->fp4_eff_max * size / (size + k->half_mnk);
    /* peak_flops of an unknown dtype is the bf16 one (dt) */
    const double peak = op->fp4 && k->fp4_peak > 0 && k->fp4_eff_max > 0 ? k->fp4_peak : k->peak[dt];
    t_flops = eff > 0 ? flops / (peak * eff) : 0.0;
  } else if (op->kernel == MP_KERNEL_ATTENTION) {
    t_flops = mp_attn_fp8_flops(fp8, op->flops, attn_exps(op, k)) / attn_rate_of(op, k);
  } else {
    /* element-wise, norms, optimizer: CUDA cores, no tensor cores; Transformer Engine's
     * grouped expert casts a kernel an expert (launches_of) */
    t_flops = op->flops / k->peak[MP_DTYPE_FP32];
    launches = (double)launches_of(op, k->grouped_streams);
  }
  *flops_s = t_flops;
  *bytes_s = t_bytes;
  *launch_s = launches * k->kernel_overhead_s;
}

/* A compute op's time, max(arithmetic, HBM) + launches, and in *sm_bound (where given)
 * whether that time is its arithmetic (flops-bound): such a kernel's CTAs fill every SM in
 * waves, so one that runs beside a collective's kernel runs on the SMs that kernel leaves
 * (sim/engine.c, contended_end). A bandwidth-bound kernel is taken to keep its pace there:
 * fewer SMs still draw the HBM bandwidth it is bound by. */
static inline double op_compute_s(const mp_op *op, const op_costs *k, int *sm_bound) {
  double t_flops, t_bytes, t_launch;
  op_compute_parts(op, k, &t_flops, &t_bytes, &t_launch);
  if (sm_bound) *sm_bound = t_flops > 0.0 && t_flops >= t_bytes;
  return (t_flops > t_bytes ? t_flops : t_bytes) + t_launch;
}

double mp_sim_compute_op_in_plan_s(const mp_op *op, const mp_gpu *g, const mp_stack_profile *p,
                                   const mp_plan *plan) {
  op_costs k;
  op_costs_init(&k, g, p, plan);
  return op_compute_s(op, &k, NULL);
}

double mp_sim_compute_op_s(const mp_op *op, const mp_gpu *g, const mp_stack_profile *p) {
  return mp_sim_compute_op_in_plan_s(op, g, p, NULL);
}

mp_status mp_sim_resolve_stack(mp_ctx *ctx, const mp_sim_config *cfg, const mp_stack_profile **out) {
  if (cfg->stack) {
    *out = cfg->stack;
    return MP_OK;
  }
  /* mp_stack_default reads only whether the GPU is a CPU: that bit keys the profile kept */
  mp_sim_workspace *ws = cfg->ws;
  int i = !mp_gpu_is_cpu(&cfg->cluster->gpu);
  if (!ws->default_loaded[i]) {
    MP_CHECK(mp_stack_default(ctx, &cfg->cluster->gpu, &ws->default_stack[i]));
    ws->default_loaded[i] = 1;
  }
  *out = &ws->default_stack[i];
  return MP_OK;
}

/* ---- the schedule compiled ---------------------------------------------------------- */

/* The scaled delta of a memory event (ACTIVATIONS by the stack's saved_act_factor, except
 * tensors every stack keeps, MP_MEM_KEPT: a checkpoint's input, an AC policy's forced
 * saves): the same rounding for an ALLOC and its FREE, so levels stay balanced. */
static int64_t mem_scaled(int cat, int kept, int64_t delta, double act_factor) {
  if (cat == MP_MEM_ACTIVATIONS && act_factor != 1.0 && !kept)
    delta = delta > 0 ? (int64_t)((double)delta * act_factor)
                      : -(int64_t)((double)-delta * act_factor);
  return delta;
}

/* A collective's priced time within one schedule (comm_duration): a function of its
 * group, collective, member count and bytes alone, the link, stack, GPU and plan being the
 * schedule's. A schedule repeats the same collectives block after block, so each distinct
 * one is priced once; n 0 marks an empty slot (a stored collective has n >= 2). */
#define COMM_MEMO_SLOTS 64
typedef struct comm_memo {
  uint64_t bytes_bits; /* the op's bytes, bit for bit (no rounding can alias two keys) */
  double dur;
  int n;
  int16_t group, coll; /* coll: the op's mp_coll, and 256 where it averages (mp_op.avg) */
} comm_memo;

/* The links of the groups a schedule's collectives run on, each looked up once, with their
 * ring channels (mp_sim_nccl_ring_channels under the stack's cap) and the collectives'
 * priced times. */
typedef struct link_set {
  const mp_sim_link *given; /* the caller's, or NULL: looked up */
  const mp_cluster *cl;
  const mp_mesh *mesh;
  const mp_plan *plan;
  int rank;
  mp_sim_link link[MP_GROUP_COUNT];
  unsigned have;
  int channels[MP_GROUP_COUNT];
  unsigned have_channels;
  comm_memo memo[COMM_MEMO_SLOTS];
} link_set;

/* A memory event: its category and scaled delta (ALLOC raises, FREE lowers; outside the
 * categories it has no effect). */
int64_t mp_sim_mem_delta(const mp_op *op, double act_factor) {
  return mem_scaled(op->mem_cat, op->variant == MP_MEM_KEPT, op->type == MP_OP_ALLOC ? op->mem_bytes : -op->mem_bytes,
                    act_factor);
}

static inline void compile_mem(const mp_op *op, double act_factor, cop *c) {
  c->kind = COP_NOMEM;
  if (op->mem_cat >= MP_MEM_COUNT) return;
  c->mem_cat = (int8_t)op->mem_cat;
  c->mem_delta = mp_sim_mem_delta(op, act_factor);
  c->kind = c->mem_delta > 0 ? COP_ALLOC : COP_FREE;
}

/* A timed op's kind and its cross-stream dependencies; seg_of_first is the first op of
 * its segment (a MP_DEP_PREV_REP dependency on an earlier op of the same segment reads
 * that op's previous instance). Returns 1 when a dependency names a later op. */
static inline int compile_deps(const mp_schedule *s, int32_t i, int32_t seg_of_first, cop *cops) {
  const mp_op *op = &s->ops[i];
  cop *c = &cops[i];
  int fwd_dep = 0;
  c->kind = op->type == MP_OP_COMPUTE
                ? (c->stream != MP_STREAM_COMPUTE ? COP_OTHER
                   : op->phase == MP_PHASE_OPTIMIZER ? COP_OPT : COP_COMPUTE)
                : COP_COMM;
  for (int d = 0; d < op->n_dep && d < MP_OP_MAX_DEPS; d++) {
    const int32_t j = op->dep[d];
    if (j < 0 || j >= s->n_ops) continue;
    /* An op on the same stream ended (any instance of it) no later than the stream's
     * free time, which the op waits for anyway: end times never exceed their stream's
     * free time (both start equal, an op ends at start + dur >= the free time it
     * sets, skips add the same shift to both, and rounding is monotone), so such a
     * dependency never moves a start; dropping it leaves every result unchanged. */
    const int js = s->ops[j].stream < MP_STREAM_COUNT ? s->ops[j].stream : MP_STREAM_COMPUTE;
    if (js == c->stream) continue;
    const unsigned bit = 1u << c->n_dep;
    if (op->dep_flags[d] & MP_DEP_PREV_REP) {
      c->dep_skip0 |= (uint8_t)bit;
      if (j >= seg_of_first && j < i) c->dep_prev |= (uint8_t)bit;
    }
    c->dep[c->n_dep++] = j;
    /* the ops some dependency reads keep their end times */
    if (j < i)
      cops[j].keep_end = 1;
    else
      fwd_dep = 1;
  }
  return fwd_dep;
}

/* A collective's duration on its group's link (none for a collective of one rank). */
static inline mp_status comm_duration(mp_ctx *ctx, link_set *ls, const mp_op *op, const mp_stack_profile *prof,
                                      double *dur) {
  int g = op->group < MP_GROUP_COUNT ? op->group : MP_GROUP_WORLD;
  if (!(ls->have & (1u << g))) {
    MP_CHECK(mp_sim_link_of(ctx, ls->given, ls->cl, ls->mesh, (mp_group)g, ls->rank, &ls->link[g]));
    ls->have |= 1u << g;
  }
  const int p2p = op->coll == MP_COLL_SEND || op->coll == MP_COLL_RECV || op->coll == MP_COLL_SENDRECV;
  const mp_sim_link *l = &ls->link[g];
  /* a two-member collective (the first and last pipeline stages) runs on the group's link */
  const int n = op->peer == MP_PEER_ENDS && l->n > 1 ? 2 : l->n;
  if (n <= 1) {
    *dur = 0.0;
    return MP_OK;
  }
  uint64_t bits;
  memcpy(&bits, &op->bytes, sizeof bits);
  const uint64_t h = (bits ^ (bits >> 29) ^ ((uint64_t)g << 7) ^ ((uint64_t)op->coll << 3) ^ (uint64_t)n) *
                     0x9E3779B97F4A7C15ull;
  comm_memo *m = &ls->memo[h >> 58]; /* the top 6 bits: COMM_MEMO_SLOTS slots */
  if (m->n == n && m->bytes_bits == bits && m->group == g && m->coll == (op->coll | op->avg << 8)) {
    *dur = m->dur;
    return MP_OK;
  }
  if (op->coll == MP_COLL_ALL_TO_ALL) {
    double nic, nvl;
    const mp_moe_dispatcher d = g == MP_GROUP_EP ? ls->plan->opts.moe_dispatcher : MP_MOE_DISPATCH_ALLTOALL;
    mp_sim_ep_shares_etp(l, &ls->plan->model, d, ls->plan->mesh.etp, &nic, &nvl);
    *dur = (mp_moe_dispatch_by_node(d) ? mp_sim_deepep_s : mp_sim_alltoall_s)(op->bytes, l, prof->link_eff, nic, nvl) +
           prof->comm_overhead_s;
  } else if (mp_gpu_is_cpu(&ls->cl->gpu))
    *dur = mp_sim_collective_s((mp_coll)op->coll, op->bytes, p2p ? 2 : n, l->GBps * prof->link_eff, l->lat_s) +
           prof->comm_overhead_s;
  else
    *dur = mp_sim_nccl_collective_s((mp_coll)op->coll, op->bytes, p2p ? 2 : n, l, l->GBps * prof->link_eff,
                                    &ls->cl->gpu, prof->nccl_version, op->avg) +
           prof->comm_overhead_s;
  *m = (comm_memo){bits, *dur, n, (int16_t)g, (int16_t)(op->coll | op->avg << 8)};
  return MP_OK;
}

/* The ring channels of group g's communicator under the stack's cap, counted once. */
static int group_channels(link_set *ls, const mp_stack_profile *prof, mp_group g) {
  if (!(ls->have_channels & (1u << g))) {
    ls->channels[g] = mp_sim_nccl_ring_channels(&ls->cl->gpu, &ls->link[g], mp_sim_nccl_cap(prof, g));
    ls->have_channels |= 1u << g;
  }
  return ls->channels[g];
}

/* NCCL's ring collectives (all-gather, reduce-scatter, all-reduce, broadcast): a kernel of
 * a CTA per channel. Sends, receives and all-to-alls run on NCCL's peer-to-peer channels,
 * whose SMs are not priced. */
static int is_ring_coll(int coll) {
  return coll == MP_COLL_ALL_GATHER || coll == MP_COLL_REDUCE_SCATTER || coll == MP_COLL_ALL_REDUCE ||
         coll == MP_COLL_BROADCAST;
}

/* ---- CUDA graphs and the host's issue of kernels ---------------------------------------- */

/* The kernels of a TransformerLayer's _forward_attention (Megatron-Core transformer_layer.py,
 * core_v0.14.0): the input norm, q, k, v (and MLA's projections and norms), rotary embedding,
 * the attention, its CP ring's copies, o. The residual add after o is one kernel the op does
 * not tell apart from the MLP's; it is priced with the MLP's, eagerly. */
static int attention_kernel(const mp_op *op) {
  switch (op->module) {
    case MP_MOD_ATTN_NORM: case MP_MOD_Q: case MP_MOD_K: case MP_MOD_V: case MP_MOD_Q_NORM:
    case MP_MOD_K_NORM: case MP_MOD_O: case MP_MOD_Q_A: case MP_MOD_Q_A_NORM: case MP_MOD_Q_B:
    case MP_MOD_KV_A: case MP_MOD_KV_A_NORM: case MP_MOD_KV_B:
      return 1;
    default:
      break;
  }
  return op->kernel == MP_KERNEL_ATTENTION || op->kernel == MP_KERNEL_ROPE ||
         (op->module < 0 && op->kernel == MP_KERNEL_COPY);
}

/* The kernels the moe_router scopes add to the attention's graph (Megatron-Core core_v0.16.0
 * transformer_layer.py MoETransformerLayer, moe_layer.py route and shared_experts_compute):
 * the pre-MLP norm, the router's GEMM and its softmax, top-k and aux loss, and the shared
 * experts, which Megatron computes in the router's phase unless --moe-shared-expert-overlap
 * (off by default) hands them to the dispatcher. The preprocess's count kernels have no op
 * of their own (the router's op holds their time), so both scope lists capture these ops. */
static int router_kernel(const mp_op *op) {
  switch (op->module) {
    case MP_MOD_FFN_NORM: case MP_MOD_ROUTER: case MP_MOD_SHARED_GATE: case MP_MOD_SHARED_UP:
    case MP_MOD_SHARED_DOWN:
      return 1;
    default:
      return 0;
  }
}

/* Whether compute op `op` runs inside one of the plan's CUDA graphs (exec/plan.h,
 * mp_cuda_graphs): the full iteration's forward and backward passes (the optimizer outside);
 * per-layer graphs hold a block's kernels but not the data-parallel bucket hooks of the last
 * micro-batch (setup_manual_hooks: hooks run outside the graphs), attn scope only the
 * attention's, the moe_router scopes the attention's and the router's. */
static int op_captured(const mp_op *op, mp_cuda_graphs g) {
  if (g == MP_CUDA_GRAPHS_NONE || op->type != MP_OP_COMPUTE) return 0;
  if (op->phase != MP_PHASE_FORWARD && op->phase != MP_PHASE_BACKWARD && op->phase != MP_PHASE_RECOMPUTE)
    return 0;
  if (g == MP_CUDA_GRAPHS_ITERATION) return 1;
  if (op->layer < 0 || op->when == MP_WHEN_LAST_MICRO) return 0;
  if (g == MP_CUDA_GRAPHS_ROUTER || g == MP_CUDA_GRAPHS_PREPROCESS) return attention_kernel(op) || router_kernel(op);
  return g == MP_CUDA_GRAPHS_LAYERS || attention_kernel(op);
}

/* The host's time to issue a kernel: the stack's host_launch_s, measured on a DGX H100's
 * x86 host and scaled by the GPU's host (mp_gpu.host_launch_scale: a Grace CPU takes 2.75x),
 * or where the stack states none its kernel overhead (sim.h): the per-kernel framework and
 * launch work of eager PyTorch is the host's, which the sum-of-kernels model charges on the
 * stream. */
static double host_launch_s(const mp_stack_profile *p, const mp_gpu *g) {
  if (p->host_launch_s < 0) return p->kernel_overhead_s;
  return p->host_launch_s * (g->host_launch_scale > 0 ? g->host_launch_scale : 1.0);
}

/* After a host synchronisation (mp_op.host_sync) the stream holds no work: the GPU runs the
 * ops that follow as the host issues them. With the host issuing kernel k at H_k (the sum of
 * its launch times to k) and the stream's ops taking d_j, the stream ends at
 * max_k (H_k + d_k + ... + d_n): later than the sum of the d_j by
 * max_k (H_k - (d_1 + ... + d_{k-1})), which the synchronising op's duration takes on (the
 * chain after it shifts by as much). An op of L launches (a grouped GEMM's per-expert
 * kernels) issues them one by one, each a 1/L of its time: the term is largest at its first
 * or its last launch. A captured op's launches are its graph's one launch (attn scope: the
 * first captured op after an eager one). The window runs to the next synchronisation or the
 * segment's end, over the ops of every micro-batch; ops on other streams cost the host their
 * launch but hold no time on this stream. Where the window opens at a segment's start
 * instead (`drained` 0: the host may have run ahead, its queue unknown), only the rate
 * binds: the window takes max(0, H_n - (d_1 + ... + d_n)), the host's issue of the whole
 * window past the GPU's time for it. *first_op: the window's first op that holds time on
 * the compute stream (-1: none), which takes that wait. */
static double host_stall_s(const mp_schedule *s, int32_t from, int32_t end, const double *dur, const op_costs *k,
                           double h, mp_cuda_graphs graphs, int drained, int32_t *first_op) {
  double host = 0.0, gpu = 0.0, stall = 0.0;
  int in_graph = 0;
  *first_op = -1;
  for (int32_t j = from; j < end && (j == from || !s->ops[j].host_sync); j++) {
    const mp_op *op = &s->ops[j];
    if ((op->type != MP_OP_COMPUTE && op->type != MP_OP_COMM) || op->when != MP_WHEN_EVERY_MICRO) continue;
    const int captured = op_captured(op, graphs);
    double launches = op->type == MP_OP_COMPUTE ? (double)launches_of(op, k->grouped_streams) : 1.0;
    if (op->count > 1) launches *= op->count;
    if (captured) launches = in_graph ? 0.0 : 1.0;
    in_graph = captured;
    const int on_stream = op->stream == MP_STREAM_COMPUTE || op->stream >= MP_STREAM_COUNT;
    const double d = on_stream ? dur[j] : 0.0;
    if (on_stream && *first_op < 0) *first_op = j;
    if (launches <= 0.0) {
      gpu += d;
      continue;
    }
    if (drained) { /* the rate bound reads only the window's sums */
      const double first = host + h - gpu, last = host + launches * h - gpu - d * (launches - 1.0) / launches;
      if (first > stall) stall = first;
      if (last > stall) stall = last;
    }
    host += launches * h;
    gpu += d;
  }
  if (!drained) return host > gpu ? host - gpu : 0.0;
  return stall;
}

/* The host's issue of each window (host_stall_s): from every host synchronisation, and,
 * where the stack states its host issue time (host_launch_us, sim/stack.c), from every
 * segment's start (a layer's pass, or the ops outside the blocks) up to its first
 * synchronisation. Eager PyTorch issues each kernel from Python through the dispatcher
 * and the launch API on one host thread, so a pass whose kernels run shorter than their
 * issue runs at the host's pace whatever ran before it. */
static void price_host_issue(const mp_schedule *s, const op_costs *k, double h, int rate, cop *cops, double *dur) {
  const mp_cuda_graphs graphs = s->plan->opts.cuda_graphs;
  const int syncs = mp_moe_host_sync(&s->plan->model, &s->plan->opts);
  for (int32_t si = 0; si < s->n_segs; si++) {
    const int32_t first = s->segs[si].first_op, end = first + s->segs[si].n_ops;
    /* without synchronisations the only window is the segment's own (rate) */
    const int32_t stop = syncs ? end : first + 1;
    for (int32_t i = first; i < stop; i++) {
      const int sync = syncs && s->ops[i].host_sync;
      if (!sync && !(rate && i == first)) continue;
      int32_t at = -1;
      const double wait = host_stall_s(s, i, end, dur, k, h, graphs, sync, &at);
      if (sync) at = i;
      if (at < 0 || wait <= 0.0) continue;
      dur[at] += wait;
      cops[at].dur = dur[at];
    }
  }
}

/* A GEMM of a fused AsyncTP pair run as tp chunks of its tokens (rows): tp launches, each
 * reading the whole weight. */
static double chunked_gemm_s(const mp_op *op, int tp, const op_costs *k) {
  mp_op ch = *op;
  ch.m = (op->m + tp - 1) / tp;
  ch.flops = op->flops / tp;
  ch.bytes = mp_gemm_bytes((double)ch.m, (double)op->n, (double)op->k,
                           (double)(op->batch > 0 ? op->batch : 1), mp_dtype_bytes((mp_dtype)op->dtype));
  return tp * op_compute_s(&ch, k, NULL);
}

/* Past the last op of fused collective i's pair, walking `step` (1: an all-gather's GEMMs
 * after it, -1: a reduce-scatter's before it): the next collective on the compute stream
 * other than an all-reduce, or the schedule's end (-1 or n_ops). */
static int32_t pair_end(const mp_schedule *s, int32_t i, int step) {
  int32_t j = i + step;
  for (; j >= 0 && j < s->n_ops; j += step) {
    const mp_op *x = &s->ops[j];
    if (x->type == MP_OP_COMM && x->stream == MP_STREAM_COMPUTE && x->coll != MP_COLL_ALL_REDUCE) break;
  }
  return j;
}

/* Collective i keeps the part of its time the GEMMs beside it do not hide. */
static void keep_unhidden(cop *cops, double *dur, int32_t i, double hidden) {
  const double left = dur[i] - hidden;
  dur[i] = cops[i].dur = left > 0.0 ? left : 0.0;
}

/* The time from its start of a GEMM of d (whole-GPU time) that starts t after a collective
 * of C holding the SMs that leave it rate r of its pace: d / r where it ends within the
 * collective (d <= (C - t) r), else the collective's rest plus the work left at full pace. */
static double beside_s(double d, double t, double C, double r) {
  if (!(t < C) || r >= 1.0) return d;
  const double within = (C - t) * r;
  return d <= within ? d / r : (C - t) + (d - within);
}

/* The userbuffers GEMM (sim.h, mp_ub_gemm) of a TP overlap's collective: the attention's
 * (its norm, q, k, v and o, MLA's projections) or the MLP's, by the pair's kind and phase. */
static mp_ub_gemm ub_gemm(const mp_op *op) {
  const int m = op->module;
  const int attn = m == MP_MOD_ATTN_NORM || (m >= MP_MOD_Q && m <= MP_MOD_O) || (m >= MP_MOD_Q_A && m <= MP_MOD_KV_B);
  if (op->fused == MP_FUSE_SCATTER) return attn ? MP_UB_PROJ_FPROP : MP_UB_FC2_FPROP;
  if (op->fused == MP_FUSE_GATHER) {
    if (op->phase == MP_PHASE_BACKWARD) return attn ? MP_UB_PROJ_DGRAD : MP_UB_FC2_DGRAD;
    return attn ? MP_UB_QKV_FPROP : MP_UB_FC1_FPROP;
  }
  if (op->coll == MP_COLL_ALL_GATHER) return attn ? MP_UB_QKV_DGRAD : MP_UB_FC1_DGRAD;
  return attn ? MP_UB_QKV_WGRAD : MP_UB_FC1_WGRAD;
}

/* The time of a GEMM of d (whole-GPU time) that starts t into its userbuffers collective of
 * C under overlap o on a GPU of S SMs. Transformer Engine launches every GEMM of an overlap
 * on _math_sms = set_sm_margin ? sm_count - num_comm_sm : sm_count (transformer_engine/
 * common/comm_gemm_overlap/comm_gemm_overlap.cpp, CommOverlapCore, v2.0 e5cc6c2): with the
 * margin the GEMM runs on the S - num_sm SMs left throughout; without it on every SM, the
 * communication kernel's num_sm CTAs (userbuffers' sms) holding theirs while it runs
 * (beside_s); ring_exchange's sends run on the copy engines (use_ce, base.py add_ub's
 * default) and hold no SM. */
static double ub_gemm_s(double d, double t, double C, mp_ub_overlap o, int S) {
  if (o.sms <= 0 || S <= o.sms) return d;
  if (o.margin) return d * (double)S / (double)(S - o.sms);
  if (o.method == MP_UB_RING_EXCHANGE) return d;
  return beside_s(d, t, C, (double)(S - o.sms) / (double)S);
}

/* AsyncTP's fused pairs (mp_fuse, exec/schedule.h): the GEMMs run as tp chunks, and the
 * collective's time shows only where it exceeds the chunks it runs beside. An all-gather's
 * tp - 1 copies go with chunks 1..tp-1 of the GEMMs after it (chunk 0, the rank's own
 * shard, needs no copy: fused_all_gather_matmul); a reduce-scatter's sends go with the
 * chunks after the first of the GEMMs before it (fused_matmul_reduce_scatter). So a pair
 * takes max(G, G / tp + C) for chunked GEMMs G and the collective's own time C, of which
 * the collective's op keeps max(0, C - G (tp - 1) / tp). A pair ends at the next collective
 * on the compute stream other than an all-reduce: under SP (which AsyncTP needs) the
 * all-reduces inside a region are the 4-byte amaxes of float8 casts (schedule_ops.c), which
 * scale the GEMMs' operands and run before the fused op, not between its chunks.
 * Under Transformer Engine's userbuffers (Megatron-Core's --tp-comm-overlap) each chunk runs
 * at the pace its GEMM's overlap leaves it (ub_gemm_s; the stack's default config, or the
 * run's own: mp_sim_ub_overlap): TE's default "pipeline" reduce-scatter is a kernel of
 * num_sm SMs with set_sm_margin, its "ring_exchange" copies run on the copy engines. A
 * ring_exchange reduce-scatter ends in a reduction on the compute stream
 * (CommOverlapP2PBase::split_overlap_rs, v2.0: reduce_bf16 or reduce_fp8_in_bf16_out over
 * the tp partial outputs the ring left in the buffer): it reads the whole output (the
 * collective's payload) and writes the rank's shard, at the GPU's achieved HBM bandwidth. */
static void price_fused(const mp_schedule *s, const mp_stack_profile *prof, int S, const op_costs *k,
                        const op_costs *kg, cop *cops, double *dur) {
  const mp_cuda_graphs graphs = s->plan->opts.cuda_graphs;
  const int tp = s->plan->mesh.size[MP_DIM_TP];
  for (int32_t i = 0; i < s->n_ops; i++) {
    const mp_op *op = &s->ops[i];
    if (op->type != MP_OP_COMM || op->fused == MP_FUSE_NONE || op->fused == MP_FUSE_BULK) continue;
    const int step = op->fused == MP_FUSE_GATHER ? 1 : -1;
    const mp_ub_overlap o = mp_sim_ub_overlap(prof, ub_gemm(op));
    const double C = dur[i];
    double g = 0.0;
    for (int32_t j = i + step, end = pair_end(s, i, step); j != end; j += step) {
      const mp_op *x = &s->ops[j];
      if (x->type != MP_OP_COMPUTE || x->fused != op->fused || x->layer != op->layer) continue;
      const op_costs *kx = op_captured(x, graphs) ? kg : k;
      const double d = chunked_gemm_s(x, tp, kx) * (x->count > 1 ? x->count : 1);
      dur[j] = cops[j].dur = ub_gemm_s(d, g, C, o, S);
      g += dur[j];
    }
    keep_unhidden(cops, dur, i, g * (tp - 1) / tp);
    if (op->fused == MP_FUSE_SCATTER && o.method == MP_UB_RING_EXCHANGE && prof->tp_comm_overlap && k->hbm > 0)
      dur[i] = cops[i].dur = dur[i] + op->bytes * (1.0 + 1.0 / tp) / k->hbm + k->kernel_overhead_s;
  }
}

/* Transformer Engine's bulk overlaps (MP_FUSE_BULK, exec/schedule.h): the all-gather runs
 * beside the input-gradient GEMMs after it, the reduce-scatter beside the weight-gradient
 * GEMMs before it (up to the pair's other collective), each GEMM at the pace its overlap
 * leaves it (ub_gemm_s: whole on the SMs the userbuffers kernel leaves under set_sm_margin,
 * beside its CTAs without) and the compute stream waiting for the collective where they end
 * (CommOverlapBase::bulk_overlap): a pair takes max(T, C) for the GEMMs' time T and the
 * collective's own time C, of which the collective's op keeps max(0, C - T). */
static void price_bulk(const mp_schedule *s, const mp_stack_profile *prof, int S, cop *cops, double *dur) {
  for (int32_t i = 0; i < s->n_ops; i++) {
    const mp_op *op = &s->ops[i];
    if (op->type != MP_OP_COMM || op->fused != MP_FUSE_BULK) continue;
    const int gather = op->coll == MP_COLL_ALL_GATHER, step = gather ? 1 : -1;
    const mp_variant v = gather ? MP_VAR_DGRAD : MP_VAR_WGRAD;
    const mp_ub_overlap o = mp_sim_ub_overlap(prof, ub_gemm(op));
    const double C = dur[i];
    double g = 0.0;
    for (int32_t j = i + step, end = pair_end(s, i, step); j != end; j += step) {
      const mp_op *x = &s->ops[j];
      if (x->type != MP_OP_COMPUTE || x->fused != MP_FUSE_BULK || x->variant != v || x->layer != op->layer)
        continue;
      dur[j] = cops[j].dur = ub_gemm_s(dur[j], g, C, o, S);
      g += dur[j];
    }
    keep_unhidden(cops, dur, i, g);
  }
}

/* Whether `module` belongs to the column-parallel region whose input gradient's collective
 * names `opener` (mp_sched_tp_region_in_bwd: the region's first Linear): Megatron-Core's
 * linear_qkv (q, k, v), linear_fc1 (gate, up), the shared experts' linear_fc1, and the output
 * layer (the head, or the tied embedding as the head). */
static int in_region(int opener, int module) {
  switch (opener) {
    case MP_MOD_Q: return module == MP_MOD_Q || module == MP_MOD_K || module == MP_MOD_V;
    case MP_MOD_UP: return module == MP_MOD_GATE || module == MP_MOD_UP;
    case MP_MOD_SHARED_UP: return module == MP_MOD_SHARED_GATE || module == MP_MOD_SHARED_UP;
    case MP_MOD_OUTPUT: case MP_MOD_TOK_EMBEDDINGS: return module == opener;
    default: return 0;
  }
}

/* Transformer Engine's Linear backward without the bulk overlaps (the stack's
 * tp_dgrad_async; _LayerNormLinear.backward, transformer_engine/pytorch/module/
 * layernorm_linear.py v2.2 to v2.8, and _Linear.backward in linear.py alike; Megatron-Core's
 * own output layer, LinearWithGradAccumulationAndAsyncCommunication.backward in
 * megatron/core/tensor_parallel/layers.py core_v0.14.0, in the same order): once a
 * column-parallel region's input-gradient GEMM ends, NCCL reduce-scatters its output under SP
 * (all-reduces it without) with async_op=True, the weight-gradient GEMM runs on the compute
 * stream beside it, and dgrad_work.wait() after that GEMM makes the stream wait for the
 * collective. The collective's kernel holds a CTA's SM per channel of its communicator (`sms`
 * of the GPU's S, where the stack prices that contention), so a flops-bound GEMM beside it
 * runs at r = (S - sms) / S of its pace (sim/engine.c, contended_end), a bandwidth-bound one
 * at its own (the cop's sm_bound, op_compute_s). The region's weight-gradient GEMMs, walked from the collective's
 * start, take T in all (beside_s), and the collective's op keeps max(0, C - T) of its time C:
 * the pair takes max(T, C). The region's ops are those of its modules before the collective,
 * back to the first op of another module on the compute stream; its input-gradient GEMMs run
 * before the collective starts wherever they sit among them. torchtitan's eager DTensor path
 * has no such pair: autograd's mm backward computes both gradients before the redistribute's
 * backward issues the collective, which the next op waits for. */
static void price_async_dgrad(const mp_schedule *s, int sms, int gpu_sms, cop *cops, double *dur) {
  const double r = sms > 0 && gpu_sms > sms ? (double)(gpu_sms - sms) / (double)gpu_sms : 1.0;
  for (int32_t i = 0; i < s->n_ops; i++) {
    const mp_op *op = &s->ops[i];
    if (op->type != MP_OP_COMM || op->group != MP_GROUP_TP || op->stream != MP_STREAM_COMPUTE ||
        op->phase != MP_PHASE_BACKWARD || (op->coll != MP_COLL_REDUCE_SCATTER && op->coll != MP_COLL_ALL_REDUCE) ||
        op->fused != MP_FUSE_NONE || !in_region(op->module, op->module) || !(dur[i] > 0.0))
      continue;
    int32_t first = i;
    for (int32_t j = i - 1; j >= 0; j--) {
      const mp_op *x = &s->ops[j];
      if (x->type == MP_OP_ALLOC || x->type == MP_OP_FREE || x->stream != MP_STREAM_COMPUTE) continue;
      if (x->type != MP_OP_COMPUTE || x->layer != op->layer || x->phase != op->phase ||
          !in_region(op->module, x->module))
        break;
      first = j;
    }
    double t = 0.0;
    for (int32_t j = first; j < i; j++) {
      const mp_op *x = &s->ops[j];
      if (x->type != MP_OP_COMPUTE || x->stream != MP_STREAM_COMPUTE || x->kernel != MP_KERNEL_GEMM ||
          x->variant != MP_VAR_WGRAD)
        continue;
      dur[j] = cops[j].dur = beside_s(dur[j], t, dur[i], cops[j].sm_bound ? r : 1.0);
      t += dur[j];
    }
    keep_unhidden(cops, dur, i, t);
  }
}

/* The TP collectives that run beside GEMMs: under the plan's fused TP collectives (AsyncTP,
 * --tp-comm-overlap) the fused pairs and the bulk overlaps, each GEMM on the SMs the stack's
 * userbuffers leave; otherwise, under a stack whose Linear backward issues the input
 * gradient's collective asynchronously, that collective beside the weight-gradient GEMMs, on
 * the SMs its TP communicator's channels leave where the contention is priced. */
static void price_tp_overlaps(const mp_schedule *s, const mp_stack_profile *prof, link_set *ls,
                              const op_costs *kc, const op_costs *kg, int contended, cop *cops, double *dur) {
  const int tp = s->plan->mesh.size[MP_DIM_TP], S = ls->cl->gpu.sms;
  if (tp <= 1) return;
  if (s->plan->opts.tp_comm_fused) {
    price_fused(s, prof, S, kc, kg, cops, dur);
    price_bulk(s, prof, S, cops, dur);
  } else if (prof->tp_dgrad_async && (ls->have & (1u << MP_GROUP_TP))) {
    const int sms = contended ? group_channels(ls, prof, MP_GROUP_TP) : 0;
    price_async_dgrad(s, sms, S, cops, dur);
  }
}

/* The SMs op's cop holds or loses: a ring collective beside the compute stream holds an SM
 * per NCCL channel while it runs; the compute stream's flops-bound kernels lose those SMs
 * (engine.c). None unless `contended` (the stack prices the contention on a
 * GPU that states its SM count). */
static void op_sms(const mp_op *op, cop *c, link_set *ls, const mp_stack_profile *prof, int sm_bound,
                   int contended) {
  c->sms = 0;
  c->sm_bound = 0;
  if (!contended) return;
  const mp_group g = op->group < MP_GROUP_COUNT ? (mp_group)op->group : MP_GROUP_WORLD;
  if (op->type == MP_OP_COMM && c->stream != MP_STREAM_COMPUTE && c->dur > 0.0 && is_ring_coll(op->coll))
    c->sms = (uint8_t)group_channels(ls, prof, g);
  else if (op->type == MP_OP_COMPUTE && c->stream == MP_STREAM_COMPUTE)
    c->sm_bound = (uint8_t)sm_bound;
}

/* The costs of a kernel captured in one of the plan's CUDA graphs: the eager ones with the
 * stack's in-graph kernel overhead, which a stack must state for graphs to be priced. */
static mp_status graph_costs(mp_ctx *ctx, const mp_stack_profile *prof, mp_cuda_graphs graphs, const op_costs *kc,
                             op_costs *kg) {
  *kg = *kc;
  if (graphs == MP_CUDA_GRAPHS_NONE) return MP_OK;
  if (!(prof->graph_kernel_overhead_s >= 0))
    return mp_error(ctx, MP_ERR_INVALID, "CUDA graphs (%s) under stack %s, which states no in-graph kernel "
                    "overhead (graph_kernel_overhead_us); choose a stack that states it or no CUDA graphs",
                    mp_cuda_graphs_name(graphs), prof->name);
  kg->kernel_overhead_s = prof->graph_kernel_overhead_s;
  return MP_OK;
}

mp_status mp_sim_compile_ops(mp_ctx *ctx, const mp_schedule *s, const mp_cluster *cl, const mp_stack_profile *prof,
                             const mp_sim_link *links, sim_bufs *b, double p2p[2]) {
  const mp_mesh *mesh = &s->plan->mesh;
  link_set ls;
  memset(&ls, 0, sizeof ls);
  ls.given = links;
  ls.cl = cl;
  ls.mesh = mesh;
  ls.plan = s->plan;
  ls.rank = s->rank;
  const double act_factor = prof->saved_act_factor > 0 ? prof->saved_act_factor : 1.0;
  op_costs kc, kg;
  op_costs_init(&kc, &cl->gpu, prof, s->plan);
  const mp_cuda_graphs graphs = s->plan->opts.cuda_graphs;
  MP_CHECK(graph_costs(ctx, prof, graphs, &kc, &kg));
  const int contended = prof->nccl_sm_contention && cl->gpu.sms > 0 && !mp_gpu_is_cpu(&cl->gpu);
  cop *cops = b->cops;
  double *dur = b->dur;
  uint8_t *seg_plain = b->prog->seg_plain;
  int fwd_dep = 0;
  p2p[0] = p2p[1] = 0.0;
  /* The segment each op belongs to decides which instance a MP_DEP_PREV_REP dependency
   * reads: the previous repetition's for ops earlier in the same segment. */
  int32_t seg_of_first = 0, seg_end = 0, si = 0;
  for (int32_t i = 0; i < s->n_ops; i++) {
    const mp_op *op = &s->ops[i];
    while (i >= seg_end && si < s->n_segs) {
      seg_of_first = s->segs[si].first_op;
      seg_end = s->segs[si].first_op + s->segs[si].n_ops;
      si++;
    }
    if (i >= seg_end) seg_of_first = i; /* an op outside every segment never runs */
    else if (op->when != MP_WHEN_EVERY_MICRO) seg_plain[si - 1] = 0;
    cop *c = &cops[i];
    c->stream = op->stream < MP_STREAM_COUNT ? op->stream : MP_STREAM_COMPUTE;
    c->when = op->when;
    c->mem_cat = -1;
    c->mem_delta = 0;
    c->n_dep = 0;
    c->dep_skip0 = c->dep_prev = 0;
    c->keep_end = 0;
    if (op->type == MP_OP_ALLOC || op->type == MP_OP_FREE)
      compile_mem(op, act_factor, c);
    else
      fwd_dep |= compile_deps(s, i, seg_of_first, cops);
    double d = 0.0;
    int sm_bound = 0;
    if (op->type == MP_OP_COMPUTE) {
      d = op_compute_s(op, op_captured(op, graphs) ? &kg : &kc, &sm_bound);
    } else if (op->type == MP_OP_COMM) {
      MP_CHECK(comm_duration(ctx, &ls, op, prof, &d));
      /* a pipeline transfer: the timeline's, between stages (sim/pipeline.c) */
      if (op->group == MP_GROUP_PP && (op->coll == MP_COLL_SEND || op->coll == MP_COLL_RECV)) {
        if (op->coll == MP_COLL_SEND) p2p[op->phase != MP_PHASE_FORWARD] = d;
        d = 0.0;
      }
    }
    if (op->count > 1) d *= op->count;
    dur[i] = d;
    c->dur = d;
    op_sms(op, c, &ls, prof, sm_bound, contended);
  }
  price_tp_overlaps(s, prof, &ls, &kc, &kg, contended, cops, dur);
  if (mp_moe_host_sync(&s->plan->model, &s->plan->opts) || prof->host_launch_s >= 0)
    price_host_issue(s, &kc, host_launch_s(prof, &cl->gpu), prof->host_launch_s >= 0, cops, dur);
  /* a malformed forward dependency still reads a kept end */
  if (fwd_dep)
    for (int32_t i = 0; i < s->n_ops; i++)
      for (int d = 0; d < cops[i].n_dep; d++) cops[cops[i].dep[d]].keep_end = 1;
  return MP_OK;
}
