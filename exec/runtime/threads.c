/* OpenMP threads per rank (see threads.h). */
#include "exec/runtime/threads.h"

#include <hwloc.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

static int env_int(const char *name) {
  const char *v = getenv(name);
  if (!v || !*v) return 0;
  char *end;
  long n = strtol(v, &end, 10);
  return *end == 0 && n > 0 && n < 1 << 20 ? (int)n : 0;
}

int mp_threads_local_ranks(void) {
  int n = env_int("OMPI_COMM_WORLD_LOCAL_SIZE");
  if (!n) n = env_int("MPI_LOCALNRANKS");
  return n > 0 ? n : 1;
}

/* Physical cores of the machine and of this process's binding (hwloc). */
static void count_cores(int *total, int *bound) {
  *total = *bound = 0;
  hwloc_topology_t topo;
  if (hwloc_topology_init(&topo) != 0) return;
  if (hwloc_topology_load(topo) == 0) {
    *total = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE);
    hwloc_bitmap_t set = hwloc_bitmap_alloc();
    if (set && hwloc_get_cpubind(topo, set, HWLOC_CPUBIND_PROCESS) == 0)
      *bound = hwloc_get_nbobjs_inside_cpuset_by_type(topo, set, HWLOC_OBJ_CORE);
    hwloc_bitmap_free(set);
  }
  hwloc_topology_destroy(topo);
}

void mp_threads_configure(mp_threads_choice *out) {
  memset(out, 0, sizeof *out);
  out->local_ranks = mp_threads_local_ranks();
  count_cores(&out->cores_total, &out->cores_bound);
  const char *env = getenv("OMP_NUM_THREADS");
  if (env && *env) {
    out->from_env = 1;
    out->threads = omp_get_max_threads();
    return;
  }
  int t = out->cores_total > 0 ? out->cores_total / out->local_ranks : omp_get_num_procs() / out->local_ranks;
  if (out->cores_bound > 0 && out->cores_bound < t) t = out->cores_bound;
  if (t < 1) t = 1;
  omp_set_num_threads(t);
  out->threads = t;
}
