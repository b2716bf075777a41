/* Megatron-Core's recompute vocabulary: its recompute modules under selective granularity and
 * its recompute method under full (exec/plan.h includes it; the AC pass, exec/pass_ac.c,
 * checks them, and the schedule applies them per block, exec/schedule_act.c). */
#ifndef MP_EXEC_PLAN_RECOMPUTE_H
#define MP_EXEC_PLAN_RECOMPUTE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Megatron-Core's recompute modules (--recompute-granularity selective --recompute-modules;
 * megatron/core/transformer/transformer_config.py, core_v0.14) beside AC none or selective-core
 * (its core_attn). layernorm, mla_up_proj and moe_act free their output once its consumer ran
 * and recompute it before its backward (CheckpointWithoutOutput); mlp, moe and shared_experts
 * checkpoint a whole module (tensor_parallel.checkpoint): its input kept, its forward re-run,
 * collectives included, before its backward. Bits of mp_plan_options.recompute_modules. */
typedef enum mp_rc_module {
  MP_RC_LAYERNORM = 0,  /* "layernorm": input_layernorm and pre_mlp_layernorm */
  MP_RC_MLA_UP_PROJ,    /* "mla_up_proj": MLA's latent norms, up projections and RoPE */
  MP_RC_MOE_ACT,        /* "moe_act": the routed experts' SwiGLU */
  MP_RC_MLP,            /* "mlp": a dense layer's MLP (transformer_layer.py: not a MoE layer's) */
  MP_RC_MOE,            /* "moe": a MoE layer whole, all-to-alls included (moe/moe_layer.py) */
  MP_RC_SHARED_EXPERTS, /* "shared_experts": a MoE layer's shared experts (moe_layer.py) */
  MP_RC_COUNT
} mp_rc_module;
/* modules (bits 1 << mp_rc_module) as Megatron names them, space-separated ("" for none). */
void mp_recompute_modules_format(uint32_t modules, char *buf, size_t cap);

/* Megatron-Core's --recompute-method under full AC (--recompute-granularity full), applied per
 * model chunk, a TransformerBlock of num_layers_per_pipeline_rank = len(self.layers) layers
 * (megatron/core/transformer/transformer_block.py _checkpointed_forward, core_v0.14.0):
 *   BLOCK    the chunk's first recompute_num_layers layers each checkpointed at its input,
 *            the rest keeping everything (a count past the chunk's layers recomputes them all)
 *   UNIFORM  the chunk's layers in groups of recompute_num_layers consecutive ones, each group
 *            checkpointed at its input: one saved input a group, every layer recomputed, the
 *            group's forward re-run whole before its backward (uniform 1 is meshplan's full)
 * NONE: meshplan's full (every block, or every ac_every-th). */
typedef enum mp_recompute_method {
  MP_RECOMPUTE_NONE = 0,
  MP_RECOMPUTE_BLOCK,
  MP_RECOMPUTE_UNIFORM
} mp_recompute_method;

/* "block", "uniform" ("" for NONE); mp_recompute_method_parse takes those names (1) or
 * returns 0 (*out untouched). */
const char *mp_recompute_method_name(mp_recompute_method m);
int mp_recompute_method_parse(const char *s, mp_recompute_method *out);

#ifdef __cplusplus
}
#endif

#endif /* MP_EXEC_PLAN_RECOMPUTE_H */
