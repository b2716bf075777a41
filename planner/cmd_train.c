/* meshplan train: builds the plan for --model on --mesh and trains it with the runtime
 * (exec/runtime/) on the CPU backend, printing per step loss, step time, tokens/s and
 * peak memory; optionally writes the initial weights, the step-1 gradients, the losses
 * and the data used (for tests/reference/model_ref.py), and records measurements in the
 * planner's database.
 *
 * World size 1 runs without mpirun (the MPI-free "single" communicator). Under mpirun the
 * MPI communicator checks that the mesh matches the world on every rank, so a mismatch is
 * one clear error on every rank and none hangs. Multi-rank execution covers pure
 * dp_replicate in this build; other meshes are refused by the runtime on every rank. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/json.h"
#include "common/progress.h"
#include "exec/comm/comm.h"
#include "exec/mesh.h"
#include "exec/model.h"
#include "exec/plan.h"
#include "exec/runtime/data.h"
#include "exec/runtime/runtime.h"
#include "exec/runtime/weights.h"
#include "kernels/cpu/cpu.h"
#include "planner/commands.h"
#include "planner/store.h"

static mp_opt k_opts[] = {
    {"--model", "M", "model name (data/models stem) or JSON path (default tiny-dense)", NULL},
    {"--mesh", "MESH", "device mesh, e.g. dp_shard=2,tp=2 (default: every dim 1)", NULL},
    {"--ac", "MODE", "activation checkpointing: none, selective or full (default none; bare --ac=full)", NULL},
    {"--fp8", NULL, "float8 Linear layers (not in the CPU runtime yet)", NULL},
    {"--steps", "K", "training steps (default 20)", NULL},
    {"--seq", "S", "tokens per sequence (default: the model's max_seq)", NULL},
    {"--micro-batch", "B", "sequences per micro-batch per data-parallel rank (default 4)", NULL},
    {"--global-batch", "G", "sequences per step over all data-parallel ranks (default: micro-batch x dp)", NULL},
    {"--lr", "LR", "AdamW learning rate (default 1e-3)", NULL},
    {"--weight-decay", "WD", "AdamW weight decay on >= 2-D weights (default 0.1)", NULL},
    {"--clip", "NORM", "clip the global gradient norm to NORM; 0 disables (default 1.0)", NULL},
    {"--data", "SRC", "synthetic (Markov chain of known entropy) or an llm.c token shard path (default synthetic)", NULL},
    {"--fanout", "K", "successors per state of the synthetic chain (default 4)", NULL},
    {"--device", "D", "cpu or cuda (default cpu)", NULL},
    {"--db", "PATH", "record per-step measurements in this planner database (needs --plan-id)", NULL},
    {"--plan-id", "ID", "the plan (from meshplan plan --db) the measurements belong to", NULL},
    {"--auto", NULL, "plan for the current world size and train the best plan (not in this build)", NULL},
    {"--seed", "N", "initialization and data seed (default 1234)", NULL},
    {"--dump-weights", "PATH", "write the initial full weights (weight file, exec/runtime/weights.h)", NULL},
    {"--dump-grads", "PATH", "write the full gradients of step 1 (before clipping)", NULL},
    {"--dump-losses", "PATH", "write per-step losses as JSON", NULL},
    {"--dump-data", "PATH", "write the token corpus used, as an llm.c shard", NULL},
    {"--quiet", NULL, "print only the summary line", NULL},
    {NULL, NULL, NULL, NULL},
};

static mp_cmd_spec k_spec = {
    "train", "Train a model with a plan on CPUs (world size 1 without mpirun; mpirun for more ranks).",
    "--model M [--mesh MESH] [--ac MODE] [--steps K] [--seq S] [--micro-batch B] [--global-batch G] "
    "[--lr LR] [--data synthetic|PATH] [--device cpu|cuda] [--db PATH --plan-id ID] [--seed N] "
    "[--dump-weights PATH]",
    k_opts, 0};

static int use_mpi(void) {
  const char *v = getenv("OMPI_COMM_WORLD_SIZE");
  if (!v) v = getenv("PMI_SIZE");
  return v != NULL;
}

int mp_cmd_train(int argc, char **argv) {
  const char *pos[1];
  int n_pos, done;
  int rc = mp_cmd_parse(&k_spec, argc, argv, pos, &n_pos, &done);
  if (done) return rc;
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_status st = MP_OK;
  mp_model model;
  mp_mesh mesh;
  mp_plan *plan = NULL;
  mp_comm *comm = NULL;
  mp_runtime *rt = NULL;
  mp_store *store = NULL;
  mp_corpus corpus = {0};
  int32_t *batch = NULL;
  double *losses = NULL;
  int mpi = 0, rank = 0;
  mp_kctx kc = {&ctx, NULL, 0};
  const mp_backend *be = mp_backend_cpu();
  int be_up = 0;

  const char *device = mp_args_get(&k_spec, "--device");
  if (device && strcmp(device, "cpu") != 0) {
    if (strcmp(device, "cuda") == 0) {
      st = mp_error(&ctx, MP_ERR_UNSUPPORTED, "--device cuda is not available in this build (the CUDA runtime "
                    "comes with the GPU issue); use --device cpu");
    } else {
      st = mp_error(&ctx, MP_ERR_USAGE, "--device %s: choose cpu or cuda", device);
    }
    return mp_cmd_fail(&ctx, st);
  }
  if (mp_args_has(&k_spec, "--auto")) {
    st = mp_error(&ctx, MP_ERR_UNSUPPORTED, "--auto is not available in this build yet; give --mesh");
    return mp_cmd_fail(&ctx, st);
  }
  const char *db = mp_args_get(&k_spec, "--db");
  long long plan_id = 0;
  MP_CHECK_GOTO(mp_args_int(&ctx, &k_spec, "--plan-id", 1, &plan_id), st, out);
  if (db && !plan_id) {
    st = mp_error(&ctx, MP_ERR_USAGE, "--db needs --plan-id: the id of the plan (from `meshplan plan --db`) "
                  "that the measurements belong to");
    goto out;
  }

  const char *mname = mp_args_get(&k_spec, "--model");
  MP_CHECK_GOTO(mp_model_load(&ctx, mname ? mname : "tiny-dense", &model), st, out);
  const char *mspec = mp_args_get(&k_spec, "--mesh");
  if (mspec) {
    MP_CHECK_GOTO(mp_mesh_parse(&ctx, mspec, 0, &mesh), st, out);
  } else {
    mp_mesh_init(&mesh);
  }
  MP_CHECK_GOTO(mp_mesh_validate(&ctx, &mesh), st, out);

  /* Communicator first: a mesh that does not match the world fails on every rank. */
  mpi = use_mpi();
  if (mpi) {
    MP_CHECK_GOTO(mp_comm_create_mpi(&ctx, &mesh, &comm), st, out);
  } else {
    if (mp_mesh_world(&mesh) != 1) {
      char mb[128];
      mp_mesh_format(&mesh, mb, sizeof mb);
      st = mp_error(&ctx, MP_ERR_INVALID, "mesh %s has %d ranks but this process runs alone; launch it with "
                    "mpirun -np %d meshplan train ...", mb, mp_mesh_world(&mesh), mp_mesh_world(&mesh));
      goto out;
    }
    MP_CHECK_GOTO(mp_comm_create_single(&ctx, &mesh, &comm), st, out);
  }
  rank = mp_comm_world_rank(comm);
  const int dp = mp_comm_group_size(comm, MP_GROUP_DP), dp_index = mp_comm_group_index(comm, MP_GROUP_DP);

  mp_plan_options po;
  mp_plan_options_init(&po);
  long long steps = 20, seed = 1234, fanout = 4;
  MP_CHECK_GOTO(mp_args_int(&ctx, &k_spec, "--steps", 1, &steps), st, out);
  MP_CHECK_GOTO(mp_args_int(&ctx, &k_spec, "--seed", 0, &seed), st, out);
  MP_CHECK_GOTO(mp_args_int(&ctx, &k_spec, "--fanout", 1, &fanout), st, out);
  /* train's defaults: the model's whole context, 4 sequences per micro-batch, one
   * micro-batch per data-parallel rank */
  po.seq = model.max_seq;
  po.micro_batch = 4;
  MP_CHECK_GOTO(mp_cmd_plan_options(&ctx, &k_spec, &po), st, out);
  if (!po.global_batch) po.global_batch = po.micro_batch * dp;
  const long long seq = po.seq, mb = po.micro_batch, gb = po.global_batch;
  po.master_dtype = MP_DTYPE_FP32;
  po.fsdp.param_dtype = MP_DTYPE_FP32; /* the CPU runtime computes in fp32 */
  MP_CHECK_GOTO(mp_build_plan(&ctx, &model, &mesh, &po, &plan), st, out);

  mp_runtime_options ro;
  mp_runtime_options_init(&ro);
  ro.seed = (uint64_t)seed;
  double d;
  d = ro.lr;
  MP_CHECK_GOTO(mp_args_double(&ctx, &k_spec, "--lr", 0, &d), st, out);
  ro.lr = (float)d;
  d = ro.weight_decay;
  MP_CHECK_GOTO(mp_args_double(&ctx, &k_spec, "--weight-decay", 0, &d), st, out);
  ro.weight_decay = (float)d;
  d = ro.max_grad_norm;
  MP_CHECK_GOTO(mp_args_double(&ctx, &k_spec, "--clip", 0, &d), st, out);
  ro.max_grad_norm = (float)d;

  /* Data: every rank builds or reads the same corpus and takes its slice per step. */
  const char *data = mp_args_get(&k_spec, "--data");
  if (!data || strcmp(data, "synthetic") == 0) {
    int64_t need = (steps * gb + 1) * seq + 1;
    if (need < (1 << 16)) need = 1 << 16;
    MP_CHECK_GOTO(mp_corpus_synthetic(&ctx, model.vocab, (int)fanout, need, (uint64_t)seed, &corpus), st, out);
  } else {
    MP_CHECK_GOTO(mp_corpus_read_shard(&ctx, data, &corpus), st, out);
    if (corpus.vocab > model.vocab) {
      st = mp_error(&ctx, MP_ERR_INVALID, "%s holds token ids up to %lld but model %s has a vocabulary of %lld",
                    data, (long long)corpus.vocab - 1, model.name, (long long)model.vocab);
      goto out;
    }
  }
  const char *dump_data = mp_args_get(&k_spec, "--dump-data");
  if (dump_data && rank == 0) MP_CHECK_GOTO(mp_corpus_write_shard(&ctx, &corpus, dump_data), st, out);
  const char *dump_w = mp_args_get(&k_spec, "--dump-weights");
  if (dump_w && rank == 0) {
    mp_wfile w;
    mp_wfile_init(&w);
    st = mp_runtime_dump_init(&ctx, plan, (uint64_t)seed, &w);
    if (st == MP_OK) st = mp_wfile_write(&ctx, &w, dump_w);
    mp_wfile_free(&w);
    if (st != MP_OK) goto out;
  }

  MP_CHECK_GOTO(be->init(&kc, 0), st, out);
  be_up = 1;
  MP_CHECK_GOTO(mp_runtime_create(&ctx, plan, comm, be, &kc, &ro, &rt), st, out);
  if (db) MP_CHECK_GOTO(mp_store_open(&ctx, db, &store), st, out);

  const int quiet = mp_args_has(&k_spec, "--quiet");
  const int64_t lb = mp_runtime_local_batch(rt);
  batch = malloc((size_t)lb * (seq + 1) * sizeof *batch);
  losses = calloc((size_t)steps, sizeof *losses);
  if (!batch || !losses) {
    st = mp_error(&ctx, MP_ERR_NOMEM, "train: out of memory for the batch");
    goto out;
  }
  char mesh_s[128];
  mp_mesh_format(&mesh, mesh_s, sizeof mesh_s);
  if (rank == 0 && !quiet) {
    printf("train %s on mesh %s (%d rank%s), ac %s, seq %lld, micro-batch %lld, global batch %lld (%lld "
           "micro-batches), lr %g, data %s",
           model.name, mesh_s, mp_comm_world_size(comm), mp_comm_world_size(comm) == 1 ? "" : "s",
           mp_ac_mode_name(plan->ac), seq, mb, gb, (long long)mp_runtime_n_micro(rt), ro.lr,
           data ? data : "synthetic");
    if (corpus.entropy_nats >= 0) printf(" (entropy floor %.4f nats)", corpus.entropy_nats);
    printf("\n");
  }
  const char *dump_g = mp_args_get(&k_spec, "--dump-grads");
  double total_s = 0, tokens_all = 0;
  int64_t peak = 0;
  for (long long s = 0; s < steps; s++) {
    MP_CHECK_GOTO(mp_corpus_batch(&ctx, &corpus, s, gb, seq, dp_index, dp, batch), st, out);
    mp_step_result r;
    double t0 = mp_now_s();
    if (s == 0 && dump_g) {
      mp_talloc_reset_peak((mp_talloc *)mp_runtime_allocator(rt));
      MP_CHECK_GOTO(mp_runtime_forward_backward(&ctx, rt, batch, &r), st, out);
      mp_wfile w;
      mp_wfile_init(&w);
      st = mp_runtime_dump(&ctx, rt, 1, &w);
      if (st == MP_OK && rank == 0) st = mp_wfile_write(&ctx, &w, dump_g);
      mp_wfile_free(&w);
      if (st != MP_OK) goto out;
      t0 = mp_now_s(); /* the dump is not part of the step's time */
      MP_CHECK_GOTO(mp_runtime_optimizer_step(&ctx, rt, &r), st, out);
      r.peak_bytes = mp_talloc_peak_total(mp_runtime_allocator(rt));
    } else {
      MP_CHECK_GOTO(mp_runtime_step(&ctx, rt, batch, &r), st, out);
    }
    double dt = mp_now_s() - t0;
    double tok_s = (double)r.tokens * dp / dt;
    losses[s] = r.loss;
    if (s > 0) { /* step 1 carries first-touch page faults */
      total_s += dt;
      tokens_all += (double)r.tokens * dp;
    }
    if (r.peak_bytes > peak) peak = r.peak_bytes;
    if (rank == 0 && !quiet)
      printf("step %4lld  loss %.6f  (ce %.6f aux %.6f)  grad_norm %.4f  %.1f ms  %.0f tokens/s  peak %.3f MiB\n",
             s + 1, r.loss, r.ce_loss, r.aux_loss, r.grad_norm, dt * 1e3, tok_s, r.peak_bytes / 1048576.0);
    if (store && rank == 0) {
      mp_measurement me = {plan_id, s + 1, dt, r.peak_bytes, r.loss, tok_s, "cpu"};
      MP_CHECK_GOTO(mp_store_add_measurement(&ctx, store, &me), st, out);
    }
  }
  if (rank == 0) {
    printf("done: %lld steps, final loss %.6f, %.0f tokens/s (steps 2..%lld), peak memory %lld bytes per rank\n",
           steps, losses[steps - 1], total_s > 0 ? tokens_all / total_s : 0.0, steps, (long long)peak);
  }
  const char *dump_l = mp_args_get(&k_spec, "--dump-losses");
  if (dump_l && rank == 0) {
    size_t cap = 64 + (size_t)steps * 32, n = 0;
    char *js = malloc(cap);
    if (!js) {
      st = mp_error(&ctx, MP_ERR_NOMEM, "train: out of memory");
      goto out;
    }
    n += (size_t)snprintf(js + n, cap - n, "{\"losses\": [");
    for (long long s = 0; s < steps; s++)
      n += (size_t)snprintf(js + n, cap - n, "%s%.9g", s ? ", " : "", losses[s]);
    n += (size_t)snprintf(js + n, cap - n, "]}\n");
    st = mp_write_file_atomic(&ctx, dump_l, js, n);
    free(js);
    if (st != MP_OK) goto out;
  }
out:
  mp_store_close(store);
  mp_runtime_destroy(rt);
  if (be_up) be->shutdown(&kc);
  mp_comm_destroy(comm);
  if (mpi) {
    mp_ctx c2;
    mp_ctx_init(&c2);
    mp_comm_mpi_finalize(&c2);
  }
  mp_plan_destroy(plan);
  mp_corpus_free(&corpus);
  free(batch);
  free(losses);
  if (st != MP_OK) {
    if (rank == 0 || st != MP_ERR_UNSUPPORTED) return mp_cmd_fail(&ctx, st);
    return mp_status_exit_code(st);
  }
  return 0;
}
