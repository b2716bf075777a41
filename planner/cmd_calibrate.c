/* meshplan calibrate: measures this machine's CPU profile (planner/calibrate.h) and saves
 * it in the planner database, where `meshplan simulate --calibration DB` (and the trainer)
 * picks the newest one up.
 *
 * World size 1 runs without mpirun (no MPI at all: the "single" communicator), which
 * measures GEMM and copy rates only. Under `mpirun -np N` every rank measures together
 * and the collectives are timed per group size; rank 0 prints and writes the database.
 * As in `meshplan train`, the checks that need no measurement (device, options) happen on
 * every rank before any communication, so a bad command line ends every rank at once. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "exec/comm/comm.h"
#include "exec/mesh.h"
#include "kernels/cpu/cpu.h"
#include "planner/calib_store.h"
#include "planner/calibrate.h"
#include "planner/commands.h"

static mp_opt k_opts[] = {
    {"--device", "D", "cpu (cuda comes with the GPU runtime issue) (default cpu)", NULL},
    {"--db", "PATH", "planner database that stores the calibration (default meshplan.db)", NULL},
    {"--reps", "N", "timed repetitions per figure, median taken (default 5)", NULL},
    {"--json", NULL, "print one JSON object instead of the table", NULL},
    {NULL, NULL, NULL, NULL},
};

static mp_cmd_spec k_spec = {
    "calibrate", "Measure GEMM rates, memory and collective bandwidths of this machine for the simulator.",
    "--device cpu [--db PATH] [--reps N] [--json]   (mpirun -np N meshplan calibrate ... for collectives)",
    k_opts, 0};

static void size_label(double bytes, char *buf, size_t cap) {
  if (bytes >= 1048576.0)
    snprintf(buf, cap, "%g MiB", bytes / 1048576.0);
  else if (bytes >= 1024.0)
    snprintf(buf, cap, "%g KiB", bytes / 1024.0);
  else
    snprintf(buf, cap, "%g B", bytes);
}

static void print_table(const mp_calib *c, const char *db, int local_ranks) {
  char line[512];
  mp_calib_summary(c, line, sizeof line);
  printf("calibration %s\n", line);
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  if (cores > 0 && (long)local_ranks * c->threads > cores)
    printf("note: %d ranks x %d threads on %ld cores: oversubscribed, and the figures include that contention; "
           "calibrate with the OMP_NUM_THREADS that training uses (e.g. %ld)\n",
           local_ranks, c->threads, cores, cores / local_ranks > 0 ? cores / local_ranks : 1);
  printf("saved to %s (meshplan simulate ... --calibration %s applies it)\n\n", db, db);
  printf("GEMM, fp32 CPU backend (median of reps, %d thread%s per rank)\n", c->threads, c->threads == 1 ? "" : "s");
  printf("  %-16s %6s %6s %6s %10s\n", "op", "N", "K", "M", "GFLOP/s");
  for (int i = 0; i < c->n_gemm; i++) {
    const mp_calib_gemm *g = &c->gemm[i];
    printf("  %-16s %6d %6d %6d %10.2f\n", g->backward ? "matmul_backward" : "matmul_forward", g->N, g->K, g->M,
           g->flops_per_s * 1e-9);
  }
  printf("  peak (every dtype's peak_tflops under --calibration): %.2f GFLOP/s\n\n",
         mp_calib_gemm_peak_flops(c) * 1e-9);
  printf("memory copy: %.2f GB/s (bytes read + written; hbm_GBps under --calibration)\n", c->copy_GBps);
  if (c->n_coll == 0) {
    printf("\ncollectives: not measured with 1 rank (mpirun -np N meshplan calibrate ... measures them)\n");
    return;
  }
  printf("\ncollectives: bus GB/s per payload (nccl-tests convention), alpha-beta fit\n"
         "  t = f*bytes/beta + c*alpha (all_reduce f = 2(g-1)/g, c = 2(g-1); others (g-1)/g, g-1)\n");
  const mp_calib_coll_fit *f0 = &c->coll[0];
  printf("  %5s %-15s", "group", "collective");
  for (int k = 0; k < f0->n_sizes; k++) {
    char lab[32];
    size_label(f0->bytes[k], lab, sizeof lab);
    printf(" %9s", lab);
  }
  printf(" %10s %9s %10s\n", "small us", "alpha us", "beta GB/s");
  for (int i = 0; i < c->n_coll; i++) {
    const mp_calib_coll_fit *f = &c->coll[i];
    printf("  %5d %-15s", f->group_size, mp_calib_coll_name(f->coll));
    for (int k = 0; k < f->n_sizes; k++) printf(" %9.3f", f->busbw_GBps[k]);
    printf(" %10.1f %9.2f %10.3f\n", f->time_s[0] * 1e6, f->alpha_s * 1e6, f->beta_GBps);
  }
  const mp_calib_coll_fit *l = mp_calib_link_fit(c);
  if (l)
    printf("\nsimulator link (one intra-node bandwidth and latency): the all_reduce fit at %d ranks, %.3f GB/s, "
           "%.2f us\n", l->group_size, l->beta_GBps, l->alpha_s * 1e6);
}

static int print_json(const mp_calib *c, const char *db) {
  cJSON *j = cJSON_CreateObject();
  if (j == NULL) return 1;
  cJSON_AddNumberToObject(j, "id", (double)c->id);
  cJSON_AddStringToObject(j, "db", db);
  cJSON_AddStringToObject(j, "created_at", c->created_at);
  cJSON_AddStringToObject(j, "device", c->device);
  cJSON_AddStringToObject(j, "host", c->host);
  cJSON_AddNumberToObject(j, "threads", c->threads);
  cJSON_AddNumberToObject(j, "world", c->world);
  cJSON *gs = cJSON_AddArrayToObject(j, "gemm");
  for (int i = 0; gs && i < c->n_gemm; i++) {
    cJSON *g = cJSON_CreateObject();
    if (!g) break;
    cJSON_AddStringToObject(g, "op", c->gemm[i].backward ? "matmul_backward" : "matmul_forward");
    cJSON_AddNumberToObject(g, "N", c->gemm[i].N);
    cJSON_AddNumberToObject(g, "K", c->gemm[i].K);
    cJSON_AddNumberToObject(g, "M", c->gemm[i].M);
    cJSON_AddNumberToObject(g, "flops_per_s", c->gemm[i].flops_per_s);
    cJSON_AddItemToArray(gs, g);
  }
  cJSON_AddNumberToObject(j, "gemm_peak_flops_per_s", mp_calib_gemm_peak_flops(c));
  cJSON_AddNumberToObject(j, "copy_GBps", c->copy_GBps);
  cJSON *cs = cJSON_AddArrayToObject(j, "collectives");
  for (int i = 0; cs && i < c->n_coll; i++) {
    const mp_calib_coll_fit *f = &c->coll[i];
    cJSON *o = cJSON_CreateObject();
    if (!o) break;
    cJSON_AddStringToObject(o, "collective", mp_calib_coll_name(f->coll));
    cJSON_AddNumberToObject(o, "group_size", f->group_size);
    cJSON *pts = cJSON_AddArrayToObject(o, "points");
    for (int k = 0; pts && k < f->n_sizes; k++) {
      cJSON *p = cJSON_CreateObject();
      if (!p) break;
      cJSON_AddNumberToObject(p, "bytes", f->bytes[k]);
      cJSON_AddNumberToObject(p, "time_s", f->time_s[k]);
      cJSON_AddNumberToObject(p, "busbw_GBps", f->busbw_GBps[k]);
      cJSON_AddItemToArray(pts, p);
    }
    cJSON_AddNumberToObject(o, "alpha_s", f->alpha_s);
    cJSON_AddNumberToObject(o, "beta_GBps", f->beta_GBps);
    cJSON_AddItemToArray(cs, o);
  }
  char *text = cJSON_Print(j);
  cJSON_Delete(j);
  if (text == NULL) return 1;
  printf("%s\n", text);
  free(text);
  return 0;
}

int mp_cmd_calibrate(int argc, char **argv) {
  const char *pos[1];
  int n_pos, done;
  int rc = mp_cmd_parse(&k_spec, argc, argv, pos, &n_pos, &done);
  if (done) return rc;
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_status st = MP_OK;
  mp_comm *comm = NULL;
  int mpi = 0, rank = 0, be_up = 0;
  mp_kctx kc = {&ctx, NULL, 0};
  const mp_backend *be = mp_backend_cpu();
  mp_calib cal;

  const char *device = mp_args_get(&k_spec, "--device");
  if (device && strcmp(device, "cpu") != 0) {
    if (strcmp(device, "cuda") == 0)
      st = mp_error(&ctx, MP_ERR_UNSUPPORTED, "calibrate --device cuda is not available in this build: it comes "
                    "with the GPU runtime issue; use --device cpu");
    else
      st = mp_error(&ctx, MP_ERR_USAGE, "meshplan calibrate: --device %s: choose cpu or cuda", device);
    goto out;
  }
  mp_calib_options o;
  mp_calib_options_init(&o);
  long long reps = o.reps;
  MP_CHECK_GOTO(mp_args_int(&ctx, &k_spec, "--reps", 1, &reps), st, out);
  o.reps = (int)reps;
  const char *db = mp_args_get(&k_spec, "--db");
  if (!db) db = "meshplan.db";

  mp_launch launch;
  mp_cmd_launch(&launch);
  mpi = launch.under_mpi;
  mp_mesh mesh;
  mp_mesh_init(&mesh);
  if (mpi) {
    /* The mesh must match the world: ask MPI how many ranks it started. */
    MP_CHECK_GOTO(mp_comm_mpi_init(&ctx, NULL, NULL), st, out);
    int world = 1;
    if (MPI_Comm_size(MPI_COMM_WORLD, &world) != MPI_SUCCESS) {
      st = mp_error(&ctx, MP_ERR_MPI, "calibrate: MPI_Comm_size failed");
      goto out;
    }
    mesh.size[MP_DIM_DP_SHARD] = world;
    MP_CHECK_GOTO(mp_comm_create_mpi(&ctx, &mesh, &comm), st, out);
  } else {
    MP_CHECK_GOTO(mp_comm_create_single(&ctx, &mesh, &comm), st, out);
  }
  rank = mp_comm_world_rank(comm);
  {
    /* Rank 0 checks the database before minutes of measuring; every rank learns the
     * verdict from one all-reduce, so all stop together and none waits on another. */
    int64_t bad = 0;
    mp_status st0 = MP_OK;
    if (rank == 0) {
      st0 = mp_calib_store_check(&ctx, db);
      bad = st0 != MP_OK;
    }
    MP_CHECK_GOTO(mp_comm_all_reduce(&ctx, comm, MP_GROUP_WORLD, &bad, &bad, 1, MP_COMM_DTYPE_INT64,
                                     MP_COMM_OP_MAX), st, out);
    if (bad) {
      st = rank == 0 ? st0 : mp_error(&ctx, MP_ERR_INVALID, "calibrate: rank 0 could not use the database");
      goto out;
    }
  }
  MP_CHECK_GOTO(be->init(&kc, 0), st, out);
  be_up = 1;
  MP_CHECK_GOTO(mp_calib_measure(&ctx, comm, be, &kc, &o, &cal), st, out);
  if (rank == 0) {
    MP_CHECK_GOTO(mp_calib_store_save(&ctx, db, &cal), st, out);
    if (mp_args_has(&k_spec, "--json")) {
      if (print_json(&cal, db) != 0) st = mp_error(&ctx, MP_ERR_NOMEM, "calibrate: out of memory printing JSON");
    } else {
      print_table(&cal, db, mp_comm_local_size(comm));
    }
  }
out:
  if (be_up) be->shutdown(&kc);
  mp_comm_destroy(comm);
  if (mpi) {
    mp_ctx c2;
    mp_ctx_init(&c2);
    mp_comm_mpi_finalize(&c2);
  }
  if (st == MP_OK) return 0;
  /* Other ranks stay quiet unless their error is their own (rank 0 reports the shared one). */
  if (rank == 0 || st != MP_ERR_INVALID) mp_cmd_fail(&ctx, st);
  /* As meshplan plan: a database that cannot be used or a device this build lacks is
   * something the user fixes on the command line. */
  return st == MP_ERR_DB || st == MP_ERR_UNSUPPORTED ? 2 : mp_status_exit_code(st);
}
