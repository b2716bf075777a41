/* meshplan explain's "context parallel", "routed experts" and "pipeline" sections (explain.h): how the
 * context-parallel ring runs for the plan's memory model and stack, and the rank's
 * pipeline (the layer split, the warm-up and in-flight chunks of the stack's schedule
 * implementation, the bubble, the boundary transfers), each said in one sentence that the
 * text and the JSON report both print. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app/commands.h"
#include "app/explain.h"

/* Megatron-Core's all_gather and a2a forms (exec/schedule_cp_te.c): what moves per layer,
 * each collective waited for where it is issued; kb, vb, qb, ob: the rank's K, V, Q and
 * output bytes. */
static void te_cp_note(const mp_plan *p, double kb, double vb, double qb, double ob, char *buf, size_t cap) {
  const int cp = p->mesh.size[MP_DIM_CP];
  char a[32], b[32], c[32];
  if (p->opts.cp_comm == MP_CP_COMM_ALL_GATHER) {
    mp_explain_fmt_bytes(cp * (kb + vb), a, sizeof a);
    snprintf(buf, cap,
             "K and V of the kv heads all-gathered before the attention (%s gathered a layer, held "
             "through it), again in backward, and dK, dV reduce-scattered after it, each collective "
             "waited for where it is issued, in the critical path (Megatron-Core's --cp-comm-type "
             "all_gather: Transformer Engine's AttnFuncWithCPAndKVAllGather, Llama 3's form; "
             "gradients all-reduced over dp_replicate x cp)", a);
    return;
  }
  mp_explain_fmt_bytes(qb + kb + vb, a, sizeof a);
  mp_explain_fmt_bytes(ob, b, sizeof b);
  mp_explain_fmt_bytes(2.0 * ob + qb + kb + vb, c, sizeof c);
  snprintf(buf, cap,
           "Q, K and V all-to-all'd to the whole sequence on %lld of the rank's heads (%s a rank), "
           "the output back (%s), in backward the output and its gradient, then dQ, dK, dV (%s), each "
           "waited for where it is issued (Megatron-Core's --cp-comm-type a2a: Transformer Engine's "
           "AttnFuncWithCPAndQKVOA2A, DeepSpeed-Ulysses' form; gradients all-reduced over "
           "dp_replicate x cp)",
           (long long)(p->model.n_heads / p->mesh.size[MP_DIM_TP] / cp), a, b, c);
}

void mp_explain_cp_note(const mp_plan *p, char *buf, size_t cap) {
  buf[0] = '\0';
  const int cp = p->mesh.size[MP_DIM_CP], tp = p->mesh.size[MP_DIM_TP];
  if (cp <= 1) return;
  const mp_model *m = &p->model;
  const int64_t T = p->opts.seq / cp * p->opts.micro_batch;
  const int mla = mp_model_is_mla(m);
  int n = snprintf(buf, cap,
                   "cp=%d: %s with causal load balancing, the sequence in %d chunks, "
                   "rank i holding chunks i and %d - i (%lld tokens a micro-batch); ",
                   cp, p->opts.cp_comm == MP_CP_COMM_P2P ? "ring attention" : "context parallelism", 2 * cp,
                   2 * cp - 1, (long long)T);
  if (n < 0 || (size_t)n >= cap) return;
  if (mp_mem_model_is_runtime(p->opts.mem_model)) {
    snprintf(buf + n, cap - (size_t)n,
             "the rank's K and V (its %lld kv heads) passed to the next rank after every step, "
             "and in backward their gradients too, each transfer blocking (meshplan's runtime)",
             (long long)(m->n_kv_heads / tp));
    return;
  }
  int64_t kw, vw;
  const int mg = p->opts.mem_model == MP_MEM_MODEL_MEGATRON;
  mp_cp_ring_widths(m, tp, mg, &kw, &vw);
  const double kv = 2.0 * (double)(T * (kw + vw));
  const mp_cp_rotate rot = p->opts.cp_rotate;
  char a[32], g[32], d[32], moved[320];
  mp_explain_fmt_bytes(kv, a, sizeof a);
  mp_explain_fmt_bytes(2.0 * kv, d, sizeof d);
  mp_explain_fmt_bytes(kv * mp_cp_ring_kv_units(cp, rot, mg), g, sizeof g);
  if (mg && p->opts.cp_comm != MP_CP_COMM_P2P) {
    const int64_t qh = mla ? m->qk_nope_head_dim + m->qk_rope_head_dim : m->head_dim;
    const int64_t oh = mla ? m->v_head_dim : m->head_dim;
    te_cp_note(p, 2.0 * (double)(T * kw), 2.0 * (double)(T * vw), 2.0 * (double)T * (double)(m->n_heads / tp * qh),
               2.0 * (double)T * (double)(m->n_heads / tp * oh), buf + n, cap - (size_t)n);
    return;
  }
  if (mg) {
    snprintf(buf + n, cap - (size_t)n,
             "K and V %s (%s a rank), passed to the next rank before every step but the last, "
             "each transfer beside that step's attention and waited for by the next step (%s "
             "held: every step's K, V buffer is kept until the pass ends), the fp32 dK, dV (%s) "
             "passed to the next rank after every backward step (Megatron-LM's context "
             "parallelism: Transformer Engine's p2p ring; gradients all-reduced over "
             "dp_replicate x cp)",
             mla ? "at their decompressed widths" : "of the kv heads", a, g, d);
    return;
  }
  const int sync = p->opts.cp_wait_at_issue;
  if (rot == MP_CP_ROTATE_ALLTOALL) {
    snprintf(moved, sizeof moved,
             " (%s a rank), copied and passed to the next rank before every step but the last, "
             "each transfer %s and waited for by the next step (%s held: the K, V in use, the "
             "copy sent, the one arriving)",
             a, sync ? "between two steps" : "beside that step's attention", g);
  } else {
    mp_explain_fmt_bytes(kv * cp, g, sizeof g); /* the gathered ones, the send buffer aside */
    snprintf(moved, sizeof moved,
             ", all-gathered on the CP group once per pass (%s a rank, %s gathered and held "
             "through the ring; %s)",
             a, g, sync ? "before step 0" : "only step 0 hides the gather");
  }
  snprintf(buf + n, cap - (size_t)n,
           "K and V %s%s, the fp32 dK, dV (%s) passed to the next rank after every backward step "
           "(torchtitan's %s%s rotate method)%s",
           mla ? "at their decompressed widths" : "expanded to every query head", moved, d,
           mla ? "" : "repeat_kv and ", mp_cp_rotate_name(rot),
           sync ? "; the ring is compiled with its block (torch.compile), where each of these "
                  "collectives is waited for where it is issued, so none runs beside an "
                  "attention step"
                : "");
}

/* DualPipe's part of e->pp_note: the rank's second model stage and the overlap. */
static void dualpipe_note(explain *e, int pp, int stage) {
  int64_t l0, l1;
  mp_plan_chunk_layers(e->plan, pp - 1 - stage, 0, &l0, &l1);
  const size_t at = strlen(e->pp_note);
  snprintf(e->pp_note + at, sizeof e->pp_note - at,
           "; DualPipe (DeepSeek-V3 sec. 3.2.1, deepseek-ai/DualPipe): half the micro-batches enter at "
           "the last stage and run on this rank through layers %lld-%lld (stage %d's), so it holds "
           "two stages' parameters, and in the steady state each forward of one direction runs "
           "overlapped with a backward of the other, their all-to-alls beside each other's compute "
           "(the zero-bubble W split is not modelled)",
           (long long)l0, (long long)l1 - 1, pp - 1 - stage);
}

/* The schedule's name in the note: "interleaved 1F1B x2", "ZBV zero bubble", ... */
static void sched_name(const mp_plan *p, int v, char *buf, size_t cap) {
  const mp_pp_schedule k = p->opts.pp_schedule;
  if (k == MP_PP_INTERLEAVED && v > 1) snprintf(buf, cap, "interleaved 1F1B x%d", v);
  else if (k == MP_PP_INTERLEAVED_ZB) snprintf(buf, cap, "interleaved zero bubble (ZB-H1) x%d", v);
  else snprintf(buf, cap, "%s", k == MP_PP_GPIPE ? "GPipe" : k == MP_PP_DUALPIPE ? "DualPipe"
                                 : k == MP_PP_ZBV ? "ZBV zero bubble (2 chunks a rank in a V)" : "1F1B");
}

/* The bubble of equal stages over the busy time and its formula: DualPipe's (pp / 2 - 1)(F&B
 * + B) with F = B, F&B = 2F (nothing hidden) over m (F + B) (deepseek-ai/DualPipe's README
 * table, without the W split); the zero-bubble schedules' fill alone, (pp - 1) F over v m
 * (F + B + W) with F = B = W (tests/sim/pipeline_test.cc; the paper's ZB-H1 (p - 1)(F + B
 * - W)); the interleaved schedule's (pp - 1) / (v m), 1F1B's and GPipe's (pp - 1) / m. */
static double pp_bubble(const mp_plan *p, int v, int64_t m, const char **formula) {
  const int pp = p->mesh.size[MP_DIM_PP];
  const mp_pp_schedule k = p->opts.pp_schedule;
  if (k == MP_PP_DUALPIPE) {
    *formula = "(pp / 2 - 1)(F&B + B) / (m (F + B))";
    return (double)(pp / 2 - 1) * 1.5 / (double)m;
  }
  if (mp_pp_schedule_splits_w(k)) {
    *formula = "(pp - 1) / (3 v m) with F = B = W";
    return (double)(pp - 1) / (3.0 * v * (double)m);
  }
  const int interleaved = k == MP_PP_INTERLEAVED && v > 1;
  *formula = interleaved ? "(pp - 1) / (v m)" : "(pp - 1) / m";
  return (double)(pp - 1) / (double)((interleaved ? v : 1) * m);
}

/* With pp > 1, the rank's pipeline: the layer split, its stage's warm-up and in-flight
 * chunks walking mp_pp_order as the stack's implementation runs it, the bubble of equal
 * stages and what crosses a stage boundary; e->pp_note the sentence. */
mp_status mp_explain_pipeline_facts(mp_ctx *ctx, explain *e, const mp_stack_profile *prof) {
  const mp_plan *p = e->plan;
  const int pp = p->mesh.size[MP_DIM_PP], v = mp_plan_virtual_stages(p);
  e->pp_note[0] = '\0';
  if (pp <= 1) return MP_OK;
  e->pp_flavor = prof->pp_flavor;
  const int stage = mp_plan_rank_stage(p, e->rank);
  e->pp_chunks = pp * v;
  for (int c = 0; c < v; c++)
    for (int s = 0; s < pp; s++) {
      int64_t l0, l1;
      mp_plan_chunk_layers(p, s, c, &l0, &l1);
      e->pp_chunk_layers[mp_plan_chunk_index(p, s, c)] = (double)(l1 - l0);
    }
  const size_t n = (size_t)(3 * e->n_micro * v); /* a zero-bubble order's F, B and W */
  mp_pp_step *ord = malloc(n * sizeof *ord);
  if (ord == NULL) return mp_error(ctx, MP_ERR_NOMEM, "out of memory for the pipeline order");
  int64_t got = 0;
  mp_status st = mp_pp_order(ctx, p->opts.pp_schedule, e->pp_flavor, pp, v, e->n_micro, stage, ord, &got);
  if (st != MP_OK) {
    free(ord);
    return st;
  }
  e->pp_warmup = 0;
  while (e->pp_warmup < got && !ord[e->pp_warmup].bwd) e->pp_warmup++;
  e->pp_inflight = mp_pp_inflight(ord, got);
  free(ord);
  const int interleaved = (p->opts.pp_schedule == MP_PP_INTERLEAVED || p->opts.pp_schedule == MP_PP_INTERLEAVED_ZB) && v > 1;
  const int dual = p->opts.pp_schedule == MP_PP_DUALPIPE, zb = mp_pp_schedule_splits_w(p->opts.pp_schedule);
  const char *formula = NULL;
  e->pp_bubble = pp_bubble(p, v, e->n_micro, &formula);
  const int tp = p->mesh.size[MP_DIM_TP];
  int64_t T = p->opts.micro_batch * (p->opts.seq / p->mesh.size[MP_DIM_CP]);
  if (p->opts.sp && tp > 1) T /= tp;
  e->pp_send_bytes = (double)T * (double)p->model.d_model * 2.0;
  char split[256], mine[160], sb[32];
  mp_cmd_fmt_runs(e->pp_chunk_layers, e->pp_chunks, "%.0f", split, sizeof split);
  size_t u = 0;
  mine[0] = '\0';
  for (int c = 0; c < v && u < sizeof mine; c++) {
    int64_t l0, l1;
    mp_plan_chunk_layers(p, stage, c, &l0, &l1);
    if (l1 > l0)
      u += (size_t)snprintf(mine + u, sizeof mine - u, "%s%lld-%lld", c ? " and " : "", (long long)l0,
                            (long long)l1 - 1);
    else /* a stated layout's empty first or last chunk */
      u += (size_t)snprintf(mine + u, sizeof mine - u, "%s%s", c ? " and " : "",
                            c == 0 && stage == 0 ? "the embedding alone" : "the head and loss alone");
  }
  mp_explain_fmt_bytes(e->pp_send_bytes, sb, sizeof sb);
  char sched[64];
  sched_name(p, v, sched, sizeof sched);
  snprintf(e->pp_note, sizeof e->pp_note,
           "pp=%d, %s as %s runs it (stack %s), %lld micro-batches a step; layers %s over the "
           "%d model chunks%s%s; rank %d (stage %d) holds layers %s, runs %d forwards before its "
           "first backward and holds at most %lld chunk activations (micro-batch x chunk); "
           "bubble with equal stages %s = %.3f of the busy time; a stage boundary "
           "passes the %s activation forward and its gradient back, %s a micro-batch each way",
           pp, sched,
           dual ? "deepseek-ai/DualPipe" : e->pp_flavor == MP_PP_FLAVOR_TORCH ? "torch.distributed.pipelining" : "Megatron-LM",
           prof->name, (long long)e->n_micro, split, e->pp_chunks,
           interleaved ? ", chunk c x pp + s on stage s" : p->opts.pp_schedule == MP_PP_ZBV ? ", chunks s and 2 pp - 1 - s on stage s" : "",
           p->opts.n_pp_layers > 0 ? ", as stated (--pp-layers or --pp-layout)"
           : p->model.n_layers % e->pp_chunks ? ", the remainder one each to the chunks after the "
                                                "first (torchtitan's split)"
                                              : "",
           e->rank, stage, mine, e->pp_warmup,
           (long long)e->pp_inflight,
           formula, e->pp_bubble, p->opts.sp && tp > 1 ? "[T/tp, H] bf16" : "[T, H] bf16", sb);
  if (dual) dualpipe_note(e, pp, stage);
  if (zb) {
    const size_t at = strlen(e->pp_note);
    snprintf(e->pp_note + at, sizeof e->pp_note - at,
             "; each backward runs as B (the input gradient) and, later, W (the weight-gradient GEMMs) "
             "filling what would be bubbles (Qi et al., arXiv 2401.10241), a chunk's activations held "
             "until its W (torch's stage_backward_input keeps the graph for stage_backward_weight)");
  }
  return MP_OK;
}

/* The forward gate GEMM of the rank's experts, as exec/schedule_block.c writes it: `local`
 * experts of `rows` rows (grouped), or all their rows as one GEMM with one weight (dense). */
static double gate_eff(const explain *e, double rows, int64_t local, int grouped, int fp8) {
  const mp_model *m = &e->plan->model;
  const int etp = e->plan->mesh.etp > 1 ? e->plan->mesh.etp : 1; /* an expert's gate on the rank: F / etp */
  const int dt = fp8 ? MP_DTYPE_FP8_E4M3 : MP_DTYPE_BF16;
  const double batch = grouped ? (double)local : 1.0, r = grouped ? rows : rows * (double)local;
  mp_op op;
  memset(&op, 0, sizeof op);
  op.type = MP_OP_COMPUTE;
  op.kernel = MP_KERNEL_GEMM;
  op.variant = MP_VAR_FWD;
  op.dtype = (uint8_t)dt;
  op.m = (int64_t)ceil(r);
  op.n = m->d_ff_expert / etp;
  op.k = m->d_model;
  op.batch = (int64_t)batch;
  op.flops = 2.0 * r * (double)op.n * (double)op.k * batch;
  op.bytes = mp_gemm_bytes(r, (double)op.n, (double)op.k, batch, mp_dtype_bytes((mp_dtype)dt));
  op.grouped = (uint8_t)grouped;
  const double t = mp_sim_compute_op_s(&op, &e->cluster.gpu, &e->prof) -
                   mp_sim_op_launches(&op, &e->prof) * e->prof.kernel_overhead_s;
  double peak = e->cluster.gpu.peak_tflops[dt] > 0 ? e->cluster.gpu.peak_tflops[dt] : e->cluster.gpu.peak_tflops[MP_DTYPE_BF16];
  return t > 0 && peak > 0 ? op.flops / (peak * 1e12 * t) : 0.0;
}

/* The routing's words: balanced or the imbalance, dropless or the capacity. */
static void routing_words(const mp_plan *p, int ep, double load, char *buf, size_t cap) {
  const mp_moe_routing *r = &p->opts.moe_routing;
  const double f = r->imbalance > 1.0 && ep > 1 ? r->imbalance : 1.0;
  int n = f > 1.0 ? snprintf(buf, cap, "imbalance %g: the slowest EP rank gets %g x the mean rows and every rank "
                                       "waits for it", f, f)
                  : snprintf(buf, cap, "balanced routing%s", r->imbalance > 1.0 ? " (an imbalance is moot at ep=1)" : "");
  if (n < 0 || (size_t)n >= cap) return;
  if (r->rank_capacity > 0.0)
    snprintf(buf + n, cap - (size_t)n, "; HybridEP rank capacity %g: a static buffer of %g x the rank's routed rows "
             "(the host reads no count), %g x the balanced rows kept%s", r->rank_capacity, r->rank_capacity, load,
             mp_sched_moe_align(p) > 1 ? ", each expert's padded to a multiple of 256 rows (float8)" : "");
  else if (r->capacity_factor > 0.0)
    snprintf(buf + n, cap - (size_t)n, "; capacity factor %g %s: each expert computes %g x the balanced rows, the "
             "all-to-all moves as much", r->capacity_factor,
             r->pad_to_capacity ? "padded to capacity" : (load < f ? "with the excess dropped" : "(nothing dropped)"), load);
  else
    snprintf(buf + n, cap - (size_t)n, "; dropless");
}

/* What the plan's CUDA graphs hold of a MoE layer (exec/plan.h, mp_cuda_graphs; sim/cost.c
 * op_captured), and whether the dispatcher's host synchronisation runs between them. */
static void graph_words(const mp_plan *p, char *buf, size_t cap) {
  const mp_cuda_graphs g = p->opts.cuda_graphs;
  const char *sync = mp_moe_host_sync(&p->model, &p->opts) ? " after the host reads the routed counts" : "";
  buf[0] = '\0';
  if (g == MP_CUDA_GRAPHS_ATTN)
    snprintf(buf, cap, "; CUDA graphs attn: each layer's attention in a graph, the MoE layer eager");
  else if (g == MP_CUDA_GRAPHS_ROUTER || g == MP_CUDA_GRAPHS_PREPROCESS)
    snprintf(buf, cap, "; CUDA graphs %s: each layer's attention, pre-MLP norm, router and shared experts in one "
             "graph, the dispatch, experts and combine eager%s", mp_cuda_graphs_name(g), sync);
  else if (g != MP_CUDA_GRAPHS_NONE)
    snprintf(buf, cap, "; CUDA graphs %s: the whole MoE layer captured (the dispatcher reads no count on the host)",
             mp_cuda_graphs_name(g));
}

/* The dispatch's words: the rows the rank sends, and under etp > 1 how they reach the
 * expert-TP group: the all-to-all dispatcher's all-gather over etp, or the flex dispatcher's
 * copy to each expert-TP rank (mp_sched_flex_etp, exec/schedule_ops.c). */
static void dispatch_words(const mp_plan *p, int ep, int etp, int64_t routed, mp_explain_moe *f, char *buf,
                           size_t cap) {
  const mp_moe_dispatcher d = p->opts.moe_dispatcher;
  const char *name = d == MP_MOE_DISPATCH_DEEPEP ? "DeepEP" : "HybridEP";
  const int flex = mp_moe_dispatch_by_node(d);
  f->dispatch_rows = ep > 1 ? routed * p->model.top_k * (flex ? etp : 1) : 0;
  f->etp_gather_rows = ep > 1 && etp > 1 && !flex ? routed * p->model.top_k * etp : 0;
  buf[0] = '\0';
  if (ep <= 1 || etp <= 1) return;
  if (flex)
    snprintf(buf, cap, "; %s sends %lld rows a micro-batch (%lld routed x etp %d: a copy to each expert-TP rank "
             "of the expert), no etp all-gather", name, (long long)f->dispatch_rows,
             (long long)(routed * p->model.top_k), etp);
  else
    snprintf(buf, cap, "; the all-to-all sends %lld rows a micro-batch, the etp all-gather makes them %lld",
             (long long)f->dispatch_rows, (long long)f->etp_gather_rows);
}

int mp_explain_moe_note(const explain *e, mp_explain_moe *f, char *buf, size_t cap) {
  buf[0] = '\0';
  memset(f, 0, sizeof *f);
  const mp_plan *p = e->plan;
  const mp_model *m = &p->model;
  if (!mp_model_is_moe(m) || mp_mem_model_is_runtime(p->opts.mem_model)) return 0;
  const int ep = p->mesh.ep > 1 && (p->applied & MP_PASS_EP) ? p->mesh.ep : 1;
  const int64_t T = p->opts.micro_batch * p->opts.seq / p->mesh.size[MP_DIM_CP];
  int etp_rows = 1; /* the rows the rank's experts see, as the schedule counts them */
  const int64_t own = mp_sched_moe_routed(p, T, &etp_rows), routed = own * etp_rows;
  f->rows = mp_sched_moe_rows(&p->opts.moe_routing, (double)routed, m->top_k, m->n_experts, ep, mp_sched_moe_align(p),
                              &f->load);
  f->experts_local = m->n_experts / ep;
  for (int i = 0; i < p->n_params; i++)
    if (p->params[i].module == MP_MOD_EXPERTS_GATE && p->params[i].role == MP_ROLE_WEIGHT) f->fp8 = p->params[i].float8;
  f->tile_m = e->prof.grouped_tile_m;
  const int64_t r = (int64_t)ceil(f->rows), t = f->tile_m > 1 ? f->tile_m : 1;
  f->rows_computed = (r + t - 1) / t * t;
  f->grouped_eff = gate_eff(e, f->rows, f->experts_local, 1, f->fp8);
  f->dense_eff = gate_eff(e, f->rows, f->experts_local, 0, f->fp8);
  char rw[400], gw[256], dw[256];
  routing_words(p, ep, f->load, rw, sizeof rw);
  graph_words(p, gw, sizeof gw);
  dispatch_words(p, ep, etp_rows, own, f, dw, sizeof dw);
  snprintf(buf, cap,
           "%lld experts a rank, %.1f rows each a micro-batch (%lld computed: %s); their grouped %s GEMMs reach "
           "%.1f %% of the peak, one dense GEMM of the same FLOPs %.1f %% (each expert's weights read once per "
           "GEMM); %s%s%s",
           (long long)f->experts_local, f->rows, (long long)f->rows_computed,
           f->tile_m > 1 ? "the stack's grouped GEMM pads each expert to its row tile" : "the stack states no tile",
           f->fp8 ? "float8" : "bf16", 100.0 * f->grouped_eff, 100.0 * f->dense_eff, rw, dw, gw);
  return 1;
}
