/* The pipeline schedules a plan runs (mp_plan_options.pp_schedule): their names, the
 * CLI's and torch.distributed.pipelining's, and which split the backward. The orders
 * themselves: exec/schedule_pp.c (mp_pp_order). */
#ifndef MP_EXEC_PLAN_PP_H
#define MP_EXEC_PLAN_PP_H

/* DUALPIPE: DeepSeek-V3's bidirectional schedule (arXiv 2412.19437, sec. 3.2.1; reference
 * code github.com/deepseek-ai/DualPipe, dualpipe/dualpipe.py): micro-batches fed from both
 * ends, rank s holding model stage s of one direction and stage pp - 1 - s of the other
 * (exec/schedule_pp.c, sim/pipeline.c).
 * ZBV and INTERLEAVED_ZB: torch.distributed.pipelining's zero-bubble schedules
 * (ScheduleZBVZeroBubble, ScheduleInterleavedZeroBubble, schedules.py, PyTorch v2.6 to
 * v2.8; Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, arXiv 2401.10241): the
 * backward split into the input gradient (B) and the weight gradient (W), W deferred into
 * what would be bubbles. ZBV holds two model chunks a rank in a V (rank s: model stages s and
 * 2 pp - 1 - s); INTERLEAVED_ZB holds pp_virtual looped chunks (c x pp + s). */
typedef enum mp_pp_schedule {
  MP_PP_1F1B = 0, MP_PP_INTERLEAVED, MP_PP_GPIPE, MP_PP_DUALPIPE, MP_PP_ZBV, MP_PP_INTERLEAVED_ZB
} mp_pp_schedule;
/* The schedule splits a backward into B and W steps (the zero-bubble ones). */
static inline int mp_pp_schedule_splits_w(mp_pp_schedule k) {
  return k == MP_PP_ZBV || k == MP_PP_INTERLEAVED_ZB;
}
/* "1f1b", "interleaved", "gpipe", "dualpipe", "zbv", "interleaved_zb" ("?" out of range),
 * the names the CLI and the validation CSV use. */
static inline const char *mp_pp_schedule_name(mp_pp_schedule k) {
  static const char *const names[] = {"1f1b", "interleaved", "gpipe", "dualpipe", "zbv", "interleaved_zb"};
  return (unsigned)k <= MP_PP_INTERLEAVED_ZB ? names[k] : "?";
}
/* The schedule named s into *out: mp_pp_schedule_name's names, or torch.distributed.
 * pipelining's names of the same schedules, case-insensitive as its get_schedule_class
 * matches them (1F1B, Interleaved1F1B, GPipe, ZBVZeroBubble, InterleavedZeroBubble; torchtitan's
 * parallelism.pipeline_parallel_schedule): 1, or 0 for any other string (*out untouched);
 * the caller words the refusal. */
int mp_pp_schedule_parse(const char *s, mp_pp_schedule *out);

#endif /* MP_EXEC_PLAN_PP_H */
