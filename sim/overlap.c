/* Expert-parallel all-to-all overlap across micro-batches: what a stage saves when the
 * forward of one micro-batch and the backward of another run as one combined step, each
 * one's all-to-alls on a communication stream beside the other's computation.
 *
 * The combined step (DeepSeek-V3, arXiv 2412.19437, sec. 3.2.1 and its Figure 4; Megatron-
 * Core's --overlap-moe-expert-parallel-comm, megatron/core/pipeline_parallel/
 * combined_1f1b.py and models/common/model_chunk_schedule_plan.py, core_v0.14): a MoE layer's
 * forward is attention (and the router), dispatch, experts, combine; its backward is
 * combine's backward, the experts' backward, dispatch's backward, attention's backward.
 * Paired layer by layer, the two streams run
 *   forward attention      beside  backward combine
 *   backward experts       beside  forward dispatch
 *   forward experts        beside  backward dispatch
 *   backward attention     beside  forward combine
 * so each of the four phases takes the longer of its two sides. A direction's compute is
 * cut into pieces by its EP all-to-alls, in the order the step runs them: the forward's
 * pieces fc[0..nf] around nf all-to-alls fa[] (dispatch, combine, dispatch, ...), the
 * backward's bc[0..nb] around ba[] (combine's backward, dispatch's backward, ...); fc[2j]
 * is layer j's attention (with what ran since the last combine), fc[2j+1] its experts;
 * bc[0] is what runs before the first layer's combine (the loss, the last layer's post-
 * combine part), bc[2j+1] layer j's experts, bc[2j+2] its attention and the next layer's
 * post-combine part. Pairing L = min(nf, nb) / 2 layers:
 *   combined = bc[0] + sum_j<L [max(fc[2j], ba[2j]) + max(bc[2j+1], fa[2j])
 *                               + max(fc[2j+1], ba[2j+1]) + max(bc[2j+2], fa[2j+1])]
 *              + the unpaired rest, in series
 * and the saving is the serial sum less that. The paired compute runs on the SMs the
 * communication kernels leave it: DeepEP's take a fixed number (the stack's deepep_sms,
 * Megatron-Core's moe_deepep_num_sms; DeepSeek-V3 sec. 3.2.2: 20 of the H800's 132), so
 * beside them compute takes sms / (sms - deepep_sms) as long (`slow`), which can cost more
 * than the overlap hides (a negative saving). NCCL's all-to-all states no SM count and is
 * priced without one. */
#include <string.h>

#include "sim/engine.h"
#include "sim/sim_internal.h"

double mp_sim_a2a_overlap_save_s(const double *fc, const double *fa, int nf, const double *bc,
                                 const double *ba, int nb, double slow) {
  double serial = 0.0;
  for (int i = 0; i <= nf; i++) serial += fc[i] + (i < nf ? fa[i] : 0.0);
  for (int i = 0; i <= nb; i++) serial += bc[i] + (i < nb ? ba[i] : 0.0);
  const int L = (nf < nb ? nf : nb) / 2;
  if (L == 0) return 0.0;
#define MAX2(a, b) ((a) > (b) ? (a) : (b))
  double t = bc[0];
  for (int j = 0; j < L; j++)
    t += MAX2(slow * fc[2 * j], ba[2 * j]) + MAX2(slow * bc[2 * j + 1], fa[2 * j]) +
         MAX2(slow * fc[2 * j + 1], ba[2 * j + 1]) + MAX2(slow * bc[2 * j + 2], fa[2 * j + 1]);
#undef MAX2
  for (int i = 2 * L; i <= nf; i++) t += fc[i] + (i < nf ? fa[i] : 0.0);
  for (int i = 2 * L + 1; i <= nb; i++) t += bc[i];
  for (int i = 2 * L; i < nb; i++) t += ba[i];
  return serial - t;
}

/* Pieces of one direction. */
typedef struct pieces {
  double c[2 * MP_MAX_LAYERS + 1], a[2 * MP_MAX_LAYERS];
  int n; /* all-to-alls */
} pieces;

static int is_ep_a2a(const mp_op *op) {
  return op->type == MP_OP_COMM && op->coll == MP_COLL_ALL_TO_ALL && op->group == MP_GROUP_EP;
}

/* One repetition of a segment's ops into p: the compute stream's kernels and collectives
 * of every micro-batch (a middle one's), cut at the EP all-to-alls. */
static void add_rep(const mp_schedule *s, const cop *cops, const mp_segment *g, pieces *p) {
  for (int32_t i = g->first_op; i < g->first_op + g->n_ops; i++) {
    const cop *c = &cops[i];
    if (c->when != MP_WHEN_EVERY_MICRO || c->stream != MP_STREAM_COMPUTE) continue;
    if (c->kind != COP_COMPUTE && c->kind != COP_COMM) continue;
    if (is_ep_a2a(&s->ops[i])) {
      if (p->n == 2 * MP_MAX_LAYERS) return;
      p->a[p->n++] = c->dur;
      p->c[p->n] = 0.0;
    } else {
      p->c[p->n] += c->dur;
    }
  }
}

double mp_sim_a2a_overlap_chunk_s(const mp_schedule *s, const cop *cops, int chunk, double slow) {
  pieces f, b;
  memset(&f, 0, sizeof f);
  memset(&b, 0, sizeof b);
  for (int32_t i = 0; i < s->n_segs; i++) {
    const mp_segment *g = &s->segs[i];
    if (g->chunk != chunk || g->phase == MP_PHASE_PROLOGUE || g->phase == MP_PHASE_OPTIMIZER) continue;
    pieces *p = g->phase == MP_PHASE_FORWARD ? &f : &b;
    for (int32_t r = 0; r < (g->repeat > 0 ? g->repeat : 1); r++) add_rep(s, cops, g, p);
  }
  return mp_sim_a2a_overlap_save_s(f.c, f.a, f.n, b.c, b.a, b.n, slow);
}
