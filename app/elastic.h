/* The parts of `meshplan train --elastic` (app/train_elastic.c) that decide without
 * launching anything, apart so that tests check them: the launcher's command line (mpirun,
 * or srun inside a Slurm allocation), the checkpoint interval of Young and Daly, the lines
 * of the ranks' output the supervisor follows, and the restart's description handed to the
 * resumed process.
 *
 * The protocol these serve is in docs/runtime.md ("Elastic training"). */
#ifndef MP_APP_ELASTIC_H
#define MP_APP_ELASTIC_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The environment the supervisor sets for each attempt's ranks. */
#define MP_ELASTIC_ENV_ATTEMPT "MESHPLAN_ELASTIC_ATTEMPT" /* 0 the first launch, then 1, 2... */
#define MP_ELASTIC_ENV_RESTART "MESHPLAN_ELASTIC_RESTART" /* mp_elastic_restart, as text */
#define MP_ELASTIC_ENV_STATUS "MESHPLAN_ELASTIC_STATUS"   /* a file rank 0 writes "diverged" into */
#define MP_ELASTIC_ENV_GROW "MESHPLAN_ELASTIC_GROW"       /* set: stop at the next checkpoint, a spare rejoins */
/* The ranks' exit status when they stopped at a checkpoint for a spare to rejoin (sysexits.h's
 * EX_TEMPFAIL: the work is not done, and going on is expected). */
#define MP_ELASTIC_EXIT_REGROW 75

/* The default failure rate, per rank: Llama 3 405B's training (Dubey et al. 2024, "The Llama
 * 3 Herd of Models", section 3.3.4) saw 419 unexpected interruptions in 54 days on 16,384
 * GPUs, one per 54 x 24 x 16384 / 419 = 50,677 GPU-hours. */
#define MP_ELASTIC_DEFAULT_MTBF_H (54.0 * 24.0 * 16384.0 / 419.0)

/* The wall clock, seconds since the epoch (CLOCK_REALTIME): the supervisor and the resumed
 * process are different processes, so a failure's time crosses between them in it. */
double mp_elastic_epoch_s(void);

/* Which launcher starts an attempt's ranks. */
typedef enum mp_elastic_launcher {
  MP_ELASTIC_MPIRUN, /* Open MPI's mpirun on this machine */
  MP_ELASTIC_SRUN,   /* Slurm's srun inside the allocation (SLURM_JOB_ID is set) */
} mp_elastic_launcher;

/* One attempt's launch. */
typedef struct mp_elastic_launch {
  mp_elastic_launcher launcher;
  int world;              /* ranks to start */
  int as_root;            /* mpirun: the caller is root (--allow-run-as-root) */
  const char *exe;        /* the meshplan binary */
  char *const *train_args; /* train's arguments for the attempt (after "train") */
  int n_train_args;
} mp_elastic_launch;

/* The launcher from the environment: srun when SLURM_JOB_ID is set, else mpirun. */
mp_elastic_launcher mp_elastic_launcher_from_env(void);

/* The launch's argv, NULL-terminated, into out (cap entries); the world's digits go into
 * num (numcap bytes), which must outlive out. Returns the count before the NULL, or -1
 * when cap is too small.
 *   mpirun [--allow-run-as-root] --oversubscribe --bind-to none -np W EXE train ARGS...
 *   srun --ntasks=W --kill-on-bad-exit=1 EXE train ARGS...
 * --oversubscribe: a machine with fewer cores than ranks still runs them (the tests');
 * --kill-on-bad-exit: Slurm ends the step when one task fails, as mpirun does. */
int mp_elastic_launch_argv(const mp_elastic_launch *l, const char **out, int cap, char *num, size_t numcap);

/* Young's optimal checkpoint interval (Young 1974, "A first order approximation to the
 * optimum checkpoint interval", CACM 17(9)), which Daly 2006 (FGCS 22(3)) shows is the
 * first-order term of the optimum: sqrt(2 x write_s x mtbf_s), seconds of work between
 * checkpoints. 0 when an input is not positive. */
double mp_elastic_young_daly_s(double write_s, double mtbf_s);
/* The checkpoint interval plan states for its best plan (one line, no newline, into buf): a
 * checkpoint holds the weights and AdamW's two moments in fp32 (12 bytes a parameter),
 * written in parallel by all n_gpus at the 122 MB/s a GPU of Llama 3's storage (Tectonic's
 * 2 TB/s sustained over 16,384 GPUs, Dubey et al. 2024, sec. 3.3.1); the job's MTBF is the
 * 50,677 GPU-hours between interruptions Llama 3 measured (419 in 54 days on 16,384 GPUs,
 * sec. 3.3.4) over n_gpus; step_s the plan's predicted step. */
void mp_elastic_plan_interval_str(int64_t params, int n_gpus, double step_s, char *buf, size_t cap);
/* That interval in steps of step_s, at least 1 and at most max_steps (>= 1). */
int64_t mp_elastic_interval_steps(double write_s, double mtbf_s, double step_s, int64_t max_steps);

/* The ranks' lines the supervisor follows (rank 0's, as train prints them):
 *   "step N  loss ..." a step completed: *step = N, returns 1;
 *   "resumed from DIR: step N ..." the attempt resumed from step N: *step = N, returns 2;
 * anything else returns 0. */
int mp_elastic_parse_line(const char *line, int64_t *step);

/* What the supervisor tells a resumed process about the failure before it. */
typedef struct mp_elastic_restart {
  int attempt;               /* this attempt (>= 1) */
  int64_t failed_after_step; /* the last step the failed attempt completed */
  double failed_at;          /* when the failure was seen, seconds since the epoch */
  char old_mesh[64];         /* the failed attempt's mesh */
  char reason[96];           /* in words, no '|' */
} mp_elastic_restart;
/* As one environment value: "ATTEMPT|FAILED_AFTER|FAILED_AT|OLD_MESH|REASON". */
void mp_elastic_restart_format(const mp_elastic_restart *r, char *buf, size_t cap);
/* Parses that value; 0 when it is malformed. */
int mp_elastic_restart_parse(const char *s, mp_elastic_restart *out);

#ifdef __cplusplus
}
#endif
#endif
