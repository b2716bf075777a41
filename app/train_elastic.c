/* meshplan train --elastic: a supervisor that launches the ranks, watches them, and on a
 * failure re-plans for the ranks left and resumes from the newest checkpoint, without a
 * person acting (docs/runtime.md, "Elastic training", is the protocol).
 *
 * Why a flag of train and not a `meshplan run` command: every option of a run (the model,
 * the data, the schedule, the checkpoints) is train's and goes to the ranks unchanged; the
 * supervisor owns only the launch and the plan, so it lives beside them (TorchElastic's
 * `torchrun` is likewise the training command's launcher, not a separate tool).
 *
 * An attempt: the plan (the --mesh given for the first, else the planner's best plan the
 * runtime executes on the world, mp_train_plan_world), with the global batch kept, so that
 * gradient accumulation absorbs a smaller data-parallel size; then the launcher (mpirun,
 * or srun inside a Slurm allocation; elastic.h builds its command line) running
 * `meshplan train` with that plan and `--resume latest` (which skips a damaged newest
 * checkpoint). The supervisor reads the ranks' output as it comes (passed on unchanged):
 * rank 0's step lines say how far the attempt got. When the launcher fails:
 *   - rank 0 wrote "diverged" into the status file: a NaN or Inf stop, not retried (the
 *     same data would diverge again), exit 1;
 *   - exit status 2: the ranks refused the request (a usage or input error), exit 2;
 *   - otherwise a rank was lost (killed, or stopped and reported by the others after
 *     MESHPLAN_COMM_TIMEOUT_S): one rank fewer, unless that is below --min-ranks (exit 1,
 *     the checkpoints untouched) or --max-restarts are used up (exit 1).
 * On one machine every rank is a process of the same host, so the supervisor counts one
 * rank lost per failed attempt; a failure that took several would fail the next attempt
 * too and cost one more each time.
 *
 * Invariants: the global batch, the seed and the data (hence the data order, a function of
 * the global sequence index only: exec/runtime/dataset.h) are the same in every attempt;
 * the supervisor never writes a checkpoint, only the ranks do (atomically, ckpt.h). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/timeutil.h"
#include "app/elastic.h"
#include "app/train_job.h"

#define ELASTIC_MAX_ARGS 256
#define ELASTIC_PROBE_MAX_BYTES (64LL << 20) /* the write probe's largest file */

typedef struct line_buf {
  char text[8192];
  size_t used;
} line_buf;

typedef struct elastic {
  train_job *j;
  const mp_cmd_call *call;
  int world, min_ranks, max_restarts, pin;
  int spares;   /* --spares left in reserve */
  int failures; /* restarts after a failure so far (a spare's rejoining is not one) */
  long long ckpt_every; /* --checkpoint-every, or 0: Young/Daly per attempt */
  long long steps;
  double mtbf_rank_s;
  int64_t global_batch;
  char status_path[4096], exe[4096];
  /* what the attempts saw */
  int64_t last_step;   /* the last step completed by any attempt (0: none) */
  double last_step_at; /* when (mp_elastic_epoch_s) */
  int timed_out, killed, stepped; /* in the attempt now ending */
  int quiet; /* --quiet: the ranks print their step lines for the supervisor, which keeps them */
  line_buf out, err; /* the launcher's stdout and stderr, a partial line each */
} elastic;

/* ---- the request ---------------------------------------------------------------------- */

static mp_status read_policies(elastic *e) {
  train_job *j = e->j;
  mp_ctx *ctx = j->ctx;
  long long ranks = 0, min_r = 1, max_r = 3, spares = 0;
  double mtbf_h = MP_ELASTIC_DEFAULT_MTBF_H;
  MP_CHECK(mp_args_int(ctx, j->spec, "--ranks", 1, MP_MESH_MAX_WORLD, &ranks));
  MP_CHECK(mp_args_int(ctx, j->spec, "--min-ranks", 1, MP_MESH_MAX_WORLD, &min_r));
  MP_CHECK(mp_args_int(ctx, j->spec, "--max-restarts", 0, 1000000, &max_r));
  MP_CHECK(mp_args_int(ctx, j->spec, "--spares", 0, MP_MESH_MAX_WORLD, &spares));
  e->spares = (int)spares;
  MP_CHECK(mp_args_double(ctx, j->spec, "--mtbf-hours", 0, 1e12, MP_RANGE_OPEN_LO, &mtbf_h));
  MP_CHECK(mp_args_int(ctx, j->spec, "--checkpoint-every", 1, MP_LIM_STEPS, &e->ckpt_every));
  e->steps = 20;
  MP_CHECK(mp_args_int(ctx, j->spec, "--steps", 1, MP_LIM_STEPS, &e->steps));
  e->min_ranks = (int)min_r;
  e->max_restarts = (int)max_r;
  e->mtbf_rank_s = mtbf_h * 3600.0;
  e->pin = mp_args_has(j->spec, "--mesh");
  e->quiet = mp_args_has(j->spec, "--quiet");
  const int mesh_world = e->pin ? mp_mesh_world(&j->mesh) : 0;
  if (e->pin && ranks && ranks != mesh_world)
    return mp_error(ctx, MP_ERR_USAGE, "--ranks %lld but --mesh has %d ranks; give one of them", ranks, mesh_world);
  e->world = e->pin ? mesh_world : (int)ranks;
  if (e->world < 1)
    return mp_error(ctx, MP_ERR_USAGE, "--elastic needs the ranks to launch: --ranks N, or a --mesh");
  if (e->world < e->min_ranks)
    return mp_error(ctx, MP_ERR_USAGE, "--min-ranks %d is more than the %d ranks launched; lower it", e->min_ranks,
                    e->world);
  return MP_OK;
}

/* What --elastic needs and what it refuses, before anything is launched (exit 2). */
static mp_status read_request(elastic *e) {
  train_job *j = e->j;
  mp_ctx *ctx = j->ctx;
  if (j->launch.under_mpi)
    return mp_error(ctx, MP_ERR_USAGE, "--elastic launches the ranks itself; run it without mpirun or srun");
  if (!mp_args_get(j->spec, "--checkpoint-dir"))
    return mp_error(ctx, MP_ERR_USAGE, "--elastic resumes from checkpoints; give --checkpoint-dir D");
  static const char *const refused[] = {"--plan-id", "--eval-only", "--dump-grads", "--dump-logits", "--profile"};
  for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++)
    if (mp_args_has(j->spec, refused[i]))
      return mp_error(ctx, MP_ERR_USAGE, "--elastic re-plans each attempt: %s is not supervised; drop it or "
                      "run train without --elastic", refused[i]);
  MP_CHECK(mp_train_read(j));
  MP_CHECK(read_policies(e));
  const ssize_t n = readlink("/proc/self/exe", e->exe, sizeof e->exe - 1);
  if (n <= 0) return mp_error(ctx, MP_ERR_IO, "--elastic: cannot find this program (/proc/self/exe): %s",
                              strerror(errno));
  e->exe[n] = '\0';
  const char *tmp = getenv("TMPDIR");
  snprintf(e->status_path, sizeof e->status_path, "%s/meshplan-elastic-%d.status", tmp && *tmp ? tmp : "/tmp",
           (int)getpid());
  unlink(e->status_path);
  return MP_OK;
}

/* ---- the checkpoint interval ------------------------------------------------------------ */

/* Seconds to write `bytes` to dir, measured by writing min(bytes, 64 MiB) of zeros to a
 * temporary file there with fsync and scaling; 0 when it cannot be measured. */
static double probe_write_s(const char *dir, int64_t bytes) {
  char path[4200];
  snprintf(path, sizeof path, "%s/.elastic_write_probe.%d", dir, (int)getpid());
  const int64_t n = bytes < ELASTIC_PROBE_MAX_BYTES ? bytes : ELASTIC_PROBE_MAX_BYTES;
  static char zeros[1 << 16];
  const int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd < 0 || n <= 0) {
    if (fd >= 0) close(fd);
    return 0;
  }
  const double t0 = mp_now_s();
  int64_t done = 0;
  while (done < n) {
    const ssize_t w = write(fd, zeros, (size_t)(n - done < (int64_t)sizeof zeros ? n - done : (int64_t)sizeof zeros));
    if (w <= 0) break;
    done += w;
  }
  const int ok = done == n && fsync(fd) == 0;
  const double dt = mp_now_s() - t0;
  close(fd);
  unlink(path);
  return ok ? dt * (double)bytes / (double)n : 0;
}

/* --checkpoint-every, or Young/Daly's interval for this world (printed): the write time
 * of one rank's share of the weights and AdamW's two moments (fp32: 12 bytes a parameter)
 * measured in --checkpoint-dir, the job's MTBF the rank's over the world, the planner's
 * predicted step time. */
static long long ckpt_interval(elastic *e, int world) {
  if (e->ckpt_every > 0) return e->ckpt_every;
  train_job *j = e->j;
  const char *dir = mp_args_get(j->spec, "--checkpoint-dir");
  mkdir(dir, 0777); /* the ranks would create it; the probe writes there first */
  const int64_t bytes = mp_model_param_count(&j->model) * 12 / world;
  const double write_s = probe_write_s(dir, bytes), mtbf_s = e->mtbf_rank_s / world;
  const double step_s = j->pick.step_time_s;
  const long long k = (long long)mp_elastic_interval_steps(write_s, mtbf_s, step_s, e->steps);
  if (write_s <= 0) {
    printf("elastic: checkpoint at the last step only: the write time could not be measured in %s; give "
           "--checkpoint-every N\n", dir);
    return k;
  }
  printf("elastic: checkpoint every %lld step%s: Young/Daly sqrt(2 x C x MTBF) = %.1f s with C = %.2f ms (%.2f MiB "
         "per rank written to %s), MTBF = %.1f h (%g h per rank over %d ranks), predicted step %.2f ms%s\n",
         k, k == 1 ? "" : "s", mp_elastic_young_daly_s(write_s, mtbf_s), write_s * 1e3, bytes / 1048576.0, dir,
         mtbf_s / 3600.0, e->mtbf_rank_s / 3600.0, world, step_s * 1e3,
         k == e->steps ? " (capped at --steps)" : "");
  return k;
}

/* ---- an attempt's command line ------------------------------------------------------------ */

/* The options the supervisor sets itself for each attempt: the ranks do not see the user's. */
static int supervised(const char *name) {
  static const char *const own[] = {"--elastic", "--ranks", "--min-ranks", "--max-restarts", "--mtbf-hours",
                                    "--mesh", "--ep", "--auto", "--resume", "--global-batch",
                                    "--global-batch-tokens", "--micro-batch", "--checkpoint-every", "--ac",
                                    "--pp-schedule", "--pp-virtual", "--quiet", "--spares"};
  for (size_t i = 0; i < sizeof own / sizeof own[0]; i++)
    if (strcmp(name, own[i]) == 0) return 1;
  return 0;
}

/* Whether option `name` of train takes the next argument as its value. */
static int takes_value(const mp_cmd_spec *spec, const char *name) {
  for (const mp_opt *o = spec->opts; o->name; o++)
    if (strcmp(o->name, name) == 0) return o->metavar && o->metavar[0] != '[';
  return 0;
}

/* The user's arguments less the supervised ones, into out (strings not copied). */
static int user_args(const elastic *e, const char **out, int cap) {
  int n = 0;
  for (int i = 0; i < e->call->argc && n < cap; i++) {
    const char *a = e->call->argv[i];
    char name[64];
    snprintf(name, sizeof name, "%.*s", (int)strcspn(a, "="), a);
    const int has_eq = strchr(a, '=') != NULL && strncmp(a, "--", 2) == 0;
    const int skip_next = !has_eq && takes_value(e->j->spec, name);
    if (!supervised(name)) {
      out[n++] = a;
      if (skip_next && i + 1 < e->call->argc && n < cap) out[n++] = e->call->argv[i + 1];
    }
    if (skip_next) i++;
  }
  return n;
}

/* The attempt's train arguments: the user's, then the plan's (mesh, micro-batch, AC,
 * pipeline schedule), the kept global batch, the interval, and --resume. */
static int attempt_args(const elastic *e, int attempt, long long every, const char **out, char (*buf)[64]) {
  const train_job *j = e->j;
  int n = user_args(e, out, ELASTIC_MAX_ARGS - 16), b = 0;
  mp_mesh_format(&j->mesh, buf[b], 64);
  if (mp_mesh_world(&j->mesh) > 1) out[n++] = "--mesh", out[n++] = buf[b++];
  snprintf(buf[b], 64, "%lld", (long long)j->po.micro_batch);
  out[n++] = "--micro-batch", out[n++] = buf[b++];
  snprintf(buf[b], 64, "%lld", (long long)e->global_batch);
  out[n++] = "--global-batch", out[n++] = buf[b++];
  snprintf(buf[b], 64, "%lld", every);
  out[n++] = "--checkpoint-every", out[n++] = buf[b++];
  if (j->po.ac_every > 1)
    snprintf(buf[b], 64, "%s:%d", mp_ac_mode_name(j->po.ac), j->po.ac_every);
  else
    snprintf(buf[b], 64, "%s", mp_ac_mode_name(j->po.ac));
  out[n++] = "--ac", out[n++] = buf[b++];
  /* the schedule the plan has: the user's on attempt 0, the planner's pick after */
  if (j->mesh.size[MP_DIM_PP] > 1 && j->po.pp_schedule == MP_PP_INTERLEAVED) {
    snprintf(buf[b], 64, "%d", j->po.pp_virtual);
    out[n++] = "--pp-schedule", out[n++] = "interleaved", out[n++] = "--pp-virtual", out[n++] = buf[b++];
  } else if (j->mesh.size[MP_DIM_PP] > 1 && j->po.pp_schedule == MP_PP_GPIPE) {
    out[n++] = "--pp-schedule", out[n++] = "gpipe";
  }
  const char *res = mp_args_get(j->spec, "--resume");
  if (attempt > 0 || res) out[n++] = "--resume", out[n++] = attempt > 0 ? "latest" : res;
  return n;
}

/* ---- running an attempt ----------------------------------------------------------------- */

/* One whole line of the ranks' output: passed on, and read for progress and causes. */
static void on_line(elastic *e, const char *line, size_t len, int is_err) {
  int64_t step = 0;
  const int kind = is_err ? 0 : mp_elastic_parse_line(line, &step);
  if (!(e->quiet && kind == 1)) {
    fwrite(line, 1, len, is_err ? stderr : stdout);
    fflush(is_err ? stderr : stdout);
  }
  if (kind == 1) {
    e->last_step = step;
    e->last_step_at = mp_elastic_epoch_s();
    e->stepped = 1;
  }
  if (strstr(line, "did not complete within")) e->timed_out = 1; /* exec/comm's timeout */
  if (strstr(line, "exited on signal") || strstr(line, "killed by signal")) e->killed = 1; /* mpirun, srun */
}

/* Reads what fd has into lb, handing on each whole line (a line longer than the buffer in
 * pieces); returns 0 at end of file. */
static int pump(elastic *e, int fd, line_buf *lb, int is_err) {
  const ssize_t r = read(fd, lb->text + lb->used, sizeof lb->text - 1 - lb->used);
  if (r < 0 && (errno == EINTR || errno == EAGAIN)) return 1;
  if (r <= 0) {
    if (lb->used) on_line(e, lb->text, lb->used, is_err);
    lb->used = 0;
    return 0;
  }
  lb->used += (size_t)r;
  lb->text[lb->used] = '\0';
  char *start = lb->text, *nl;
  while ((nl = memchr(start, '\n', lb->used - (size_t)(start - lb->text)))) {
    const char keep = nl[1];
    nl[1] = '\0';
    on_line(e, start, (size_t)(nl - start + 1), is_err);
    nl[1] = keep;
    start = nl + 1;
  }
  size_t rest = lb->used - (size_t)(start - lb->text);
  if (rest == sizeof lb->text - 1) { /* no newline in a full buffer */
    on_line(e, lb->text, rest, is_err);
    rest = 0;
  }
  memmove(lb->text, start, rest);
  lb->used = rest;
  return 1;
}

/* Runs argv with its stdout and stderr through the supervisor; the exit status (128 + the
 * signal when killed), or -1 when it could not be started. */
static int run_launcher(elastic *e, const char *const *argv) {
  int po[2], pe[2];
  if (pipe(po) != 0) return -1;
  if (pipe(pe) != 0) {
    close(po[0]), close(po[1]);
    return -1;
  }
  fflush(stdout);
  fflush(stderr);
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(po[1], 1), dup2(pe[1], 2);
    close(po[0]), close(po[1]), close(pe[0]), close(pe[1]);
    execvp(argv[0], (char *const *)argv);
    fprintf(stderr, "meshplan train: --elastic: cannot run %s: %s\n", argv[0], strerror(errno));
    _exit(127);
  }
  close(po[1]), close(pe[1]);
  if (pid < 0) {
    close(po[0]), close(pe[0]);
    return -1;
  }
  e->out.used = e->err.used = 0;
  struct pollfd fds[2] = {{po[0], POLLIN, 0}, {pe[0], POLLIN, 0}};
  int open_n = 2;
  while (open_n > 0) {
    if (poll(fds, 2, -1) < 0 && errno != EINTR) break;
    for (int k = 0; k < 2; k++)
      if (fds[k].fd >= 0 && (fds[k].revents & (POLLIN | POLLHUP | POLLERR)) &&
          !pump(e, fds[k].fd, k ? &e->err : &e->out, k)) {
        close(fds[k].fd);
        fds[k].fd = -1;
        open_n--;
      }
  }
  for (int k = 0; k < 2; k++)
    if (fds[k].fd >= 0) close(fds[k].fd);
  int ws = 0;
  while (waitpid(pid, &ws, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(ws) ? WEXITSTATUS(ws) : WIFSIGNALED(ws) ? 128 + WTERMSIG(ws) : 1;
}

/* ---- the attempts ---------------------------------------------------------------------- */

/* The least common multiple of lo..hi: a global batch every data-parallel size from lo to
 * hi divides (one micro-batch of one sequence). */
static int64_t lcm_upto(int lo, int hi) {
  int64_t l = 1;
  for (int64_t k = lo; k <= hi && l < ((int64_t)1 << 40); k++) {
    int64_t a = l, b = k;
    while (b) {
      const int64_t t = a % b;
      a = b;
      b = t;
    }
    l = l / a * k;
  }
  return l;
}

/* The attempt's plan on `world` ranks (the --mesh given for the first when there is one,
 * else the planner's best executable plan) with the global batch kept, and its line. */
static mp_status plan_attempt(elastic *e, int attempt, int world) {
  train_job *j = e->j;
  if (e->global_batch) j->po.global_batch = e->global_batch; /* the first attempt's, kept */
  const int pin = attempt == 0 && e->pin;
  mp_status st = mp_train_plan_world(j, world, pin);
  if (st != MP_OK && !pin)
    return mp_error(j->ctx, MP_ERR_INVALID, "no plan the runtime executes on %d rank%s keeps the global batch of "
                    "%lld sequences and fits (%lld executable plans, none whose data-parallel size x micro-batch "
                    "divides it); give a --global-batch that every world from --min-ranks %d to %d ranks divides "
                    "(a multiple of %lld), or a higher --min-ranks", world, world == 1 ? "" : "s",
                    (long long)j->po.global_batch, (long long)j->pick.n_candidates, e->min_ranks, e->world,
                    (long long)lcm_upto(e->min_ranks, e->world));
  MP_CHECK(st);
  e->global_batch = j->po.global_batch;
  char mesh[64];
  mp_mesh_format(&j->mesh, mesh, sizeof mesh);
  const int64_t dp = mp_mesh_group_size(&j->mesh, MP_GROUP_DP);
  printf("elastic: attempt %d: %d rank%s on %s (%s), predicted step %.2f ms; global batch %lld kept: %lld "
         "micro-batch%s of %lld per data-parallel rank\n", attempt, world, world == 1 ? "" : "s", mesh,
         pin ? "--mesh" : "the planner's best executable plan", j->pick.step_time_s * 1e3,
         (long long)e->global_batch, (long long)(e->global_batch / (dp * j->po.micro_batch)),
         e->global_batch / (dp * j->po.micro_batch) == 1 ? "" : "es", (long long)j->po.micro_batch);
  return MP_OK;
}

/* Launches attempt `attempt` on `world` ranks; returns the launcher's exit status. */
static int launch(elastic *e, int attempt, int world, long long every) {
  const char *targs[ELASTIC_MAX_ARGS];
  char buf[8][64];
  const int nt = attempt_args(e, attempt, every, targs, buf);
  char attempt_s[16], num[32];
  snprintf(attempt_s, sizeof attempt_s, "%d", attempt);
  setenv(MP_ELASTIC_ENV_ATTEMPT, attempt_s, 1);
  setenv(MP_ELASTIC_ENV_STATUS, e->status_path, 1);
  mp_elastic_launch l = {mp_elastic_launcher_from_env(), world, geteuid() == 0, e->exe, (char *const *)targs, nt};
  const char *argv[ELASTIC_MAX_ARGS + 16];
  if (mp_elastic_launch_argv(&l, argv, ELASTIC_MAX_ARGS + 16, num, sizeof num) < 0) return -1;
  e->timed_out = e->killed = e->stepped = 0;
  return run_launcher(e, argv);
}

/* Why the attempt failed, in words (the restart's reason). A restart whose attempt failed
 * before its first step recorded no row: the next one's reason says it. */
static void failure_reason(const elastic *e, int attempt, int code, char *buf, size_t cap) {
  char during[64] = "";
  if (attempt > 0 && !e->stepped) snprintf(during, sizeof during, " during restart %d's recovery", attempt);
  if (e->timed_out)
    snprintf(buf, cap, "a rank stopped answering (MESHPLAN_COMM_TIMEOUT_S)%s", during);
  else if (e->killed || code > 128)
    snprintf(buf, cap, "a rank was killed%s", during);
  else
    snprintf(buf, cap, "the job failed (launcher exit status %d)%s", code, during);
}

/* The newest checkpoint step in --checkpoint-dir (0: none), for the stop lines. */
static long long newest_ckpt(const elastic *e) {
  mp_ctx c2;
  mp_ctx_init(&c2);
  int64_t *steps = NULL;
  int n = 0;
  long long s = 0;
  if (mp_ckpt_list(&c2, mp_args_get(e->j->spec, "--checkpoint-dir"), &steps, &n) == MP_OK && n > 0)
    s = (long long)steps[n - 1];
  free(steps);
  return s;
}

/* The next attempt's environment: the restart it records (MESHPLAN_ELASTIC_RESTART), and
 * whether it stops at its next checkpoint for a spare (MESHPLAN_ELASTIC_GROW: while the
 * world is below the launch's and the pool holds one). */
static void next_restart(elastic *e, int attempt, const char *reason) {
  char mesh[64], env[512];
  mp_mesh_format(&e->j->mesh, mesh, sizeof mesh);
  mp_elastic_restart r = {attempt + 1, e->last_step, e->last_step_at, "", ""};
  snprintf(r.old_mesh, sizeof r.old_mesh, "%s", mesh);
  snprintf(r.reason, sizeof r.reason, "%s", reason);
  mp_elastic_restart_format(&r, env, sizeof env);
  setenv(MP_ELASTIC_ENV_RESTART, env, 1);
}

/* After a failed attempt: whether to go on (1) or stop (0, with *code and the line said). */
static int decide(elastic *e, int attempt, int code, int *world, int *exit_code) {
  char reason[96];
  failure_reason(e, attempt, code, reason, sizeof reason);
  const char *ck = mp_args_get(e->j->spec, "--checkpoint-dir");
  if (access(e->status_path, F_OK) == 0) {
    fprintf(stderr, "meshplan train: --elastic: the run diverged (a NaN or Inf loss): not a rank failure, so not "
            "restarted; resume from %s/step_%08lld with a lower --lr or with --clip\n", ck, newest_ckpt(e));
    *exit_code = 1;
    return 0;
  }
  if (code == 2 || code < 0) { /* the ranks refused the request, or the launcher did not start */
    fprintf(stderr, "meshplan train: --elastic: attempt %d %s: not a rank failure, so not restarted\n", attempt,
            code < 0 ? "could not be launched" : "was refused (exit status 2, said above)");
    *exit_code = code < 0 ? 1 : 2;
    return 0;
  }
  printf("elastic: attempt %d failed after step %lld: %s\n", attempt, (long long)e->last_step, reason);
  *exit_code = 1;
  if (e->failures + 1 > e->max_restarts) {
    fprintf(stderr, "meshplan train: --elastic: %s after %d restart%s (--max-restarts %d): stopping; the newest "
            "checkpoint is %s/step_%08lld; raise --max-restarts or resume from it\n", reason, e->failures,
            e->failures == 1 ? "" : "s", e->max_restarts, ck, newest_ckpt(e));
    return 0;
  }
  if (*world - 1 < e->min_ranks) {
    fprintf(stderr, "meshplan train: --elastic: %s and %d rank%s would be left, below --min-ranks %d: stopping; "
            "nothing is lost: the newest checkpoint is %s/step_%08lld; resume from it when ranks are back, or "
            "lower --min-ranks\n", reason, *world - 1, *world - 1 == 1 ? "" : "s", e->min_ranks, ck, newest_ckpt(e));
    return 0;
  }
  (*world)--;
  e->failures++;
  next_restart(e, attempt, reason);
  printf("elastic: re-planning for %d rank%s%s\n", *world, *world == 1 ? "" : "s",
         e->spares > 0 ? "; a spare rejoins at the next checkpoint" : "");
  return 1;
}

/* After an attempt that stopped at a checkpoint for a spare: one rank more from the pool. */
static void grow_back(elastic *e, int attempt, int *world) {
  char reason[96];
  snprintf(reason, sizeof reason, "a spare rejoined at step %lld's checkpoint", (long long)e->last_step);
  (*world)++;
  e->spares--;
  next_restart(e, attempt, reason);
  printf("elastic: %s: growing back to %d rank%s\n", reason, *world, *world == 1 ? "" : "s");
}

int mp_train_elastic(train_job *j, const mp_cmd_call *call) {
  elastic *e = calloc(1, sizeof *e);
  if (!e) return mp_cmd_fail(j->ctx, mp_error(j->ctx, MP_ERR_NOMEM, "out of memory"));
  e->j = j;
  e->call = call;
  setvbuf(stdout, NULL, _IOLBF, 0); /* its lines in order with the ranks' and its errors */
  mp_status st = read_request(e);
  if (st == MP_OK) st = plan_attempt(e, 0, e->world);
  if (st != MP_OK) {
    free(e);
    return mp_cmd_fail(j->ctx, st);
  }
  int world = e->world, code = 0;
  unsetenv(MP_ELASTIC_ENV_RESTART);
  unsetenv(MP_ELASTIC_ENV_GROW);
  e->last_step_at = mp_elastic_epoch_s();
  for (int attempt = 0;; attempt++) {
    if (attempt > 0 && (st = plan_attempt(e, attempt, world)) != MP_OK) {
      mp_cmd_fail(j->ctx, st);
      code = 1; /* accepted work that cannot go on */
      break;
    }
    if (e->spares > 0 && world < e->world)
      setenv(MP_ELASTIC_ENV_GROW, "1", 1);
    else
      unsetenv(MP_ELASTIC_ENV_GROW);
    const int rc = launch(e, attempt, world, ckpt_interval(e, world));
    if (rc == MP_ELASTIC_EXIT_REGROW && getenv(MP_ELASTIC_ENV_GROW)) {
      grow_back(e, attempt, &world);
      continue;
    }
    if (rc == 0) {
      printf("elastic: done: step %lld reached on %d rank%s after %d restart%s\n", e->steps, world,
             world == 1 ? "" : "s", attempt, attempt == 1 ? "" : "s");
      code = 0;
      break;
    }
    if (!decide(e, attempt, rc, &world, &code)) break;
  }
  unlink(e->status_path);
  free(e);
  return code;
}
