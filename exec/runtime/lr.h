/* Learning-rate schedules: the learning rate of optimizer step s (1-based: the first step
 * is s = 1), a pure function of s and the schedule, so a resumed run recomputes exactly
 * what the straight run used from the step count a checkpoint restores.
 *
 * With peak lr, floor min_lr, W warmup steps and S total steps (the run's --steps):
 *   warmup (every kind), s <= W:   lr * s / W
 *       (linear warmup as in nanoGPT's get_lr and llm.c's, 1-based so step 1 is not 0)
 *   constant:                      lr
 *   cosine:   min_lr + (lr - min_lr) * (1 + cos(pi * p)) / 2,   p = (s - W) / (S - W)
 *       (Loshchilov & Hutter, "SGDR", ICLR 2017, without restarts; nanoGPT, llm.c)
 *   linear:   lr + (min_lr - lr) * p
 *       (linear decay to min_lr, Megatron-LM's lr_decay_style=linear)
 *   wsd:      warmup, stable at lr until D = S - round(decay_frac * (S - W)), then
 *             min_lr + (lr - min_lr) * (1 - sqrt(q)),   q = (s - D) / (S - D)
 *       (warmup-stable-decay of MiniCPM, Hu et al. 2024; the 1 - sqrt cooldown and the 20 %
 *        default share are Hägele et al., "Scaling Laws and Compute-Optimal Training
 *        Beyond Fixed Training Durations", NeurIPS 2024, whose cooldown study found
 *        1 - sqrt best among the shapes tried)
 * p and q are clamped to [0, 1]: steps past S stay at min_lr. */
#ifndef MP_EXEC_RUNTIME_LR_H
#define MP_EXEC_RUNTIME_LR_H

#include <stdint.h>

#include "common/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mp_lr_kind { MP_LR_CONSTANT = 0, MP_LR_COSINE, MP_LR_LINEAR, MP_LR_WSD, MP_LR_COUNT } mp_lr_kind;

typedef struct mp_lr_schedule {
  mp_lr_kind kind;
  double lr, min_lr;
  int64_t warmup, total;
  double decay_frac; /* wsd: the share of the post-warmup steps spent decaying */
} mp_lr_schedule;

/* "constant", "cosine", "linear", "wsd". */
const char *mp_lr_kind_name(mp_lr_kind k);
/* MP_ERR_USAGE naming the choices when name is none of them. */
mp_status mp_lr_kind_parse(mp_ctx *ctx, const char *name, mp_lr_kind *out);
/* Checks the schedule: lr >= 0, 0 <= min_lr <= lr, 0 <= warmup <= total, total >= 1,
 * decay_frac in (0, 1]. Messages name the flag to change. */
mp_status mp_lr_validate(mp_ctx *ctx, const mp_lr_schedule *s);
/* The learning rate of step s (1-based). */
double mp_lr_at(const mp_lr_schedule *s, int64_t step);
/* 1 when a and b give every step after `step` the same learning rate: the same kind and
 * peak; warmups that differ only where both have ended by then; for the decaying kinds the
 * same floor, total and warmup (they set p), and for wsd the same decay share. A constant
 * schedule's total and floor never matter. */
int mp_lr_same_after(const mp_lr_schedule *a, const mp_lr_schedule *b, int64_t step);

#ifdef __cplusplus
}
#endif
#endif
