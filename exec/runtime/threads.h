/* OpenMP threads for a CPU rank: as many as the cores this rank may use without
 * oversubscribing the ranks beside it on the node.
 *
 * OpenMP's default is one thread per logical CPU of the process's affinity mask; with
 * several MPI ranks on a node and no binding (mpirun --bind-to none, or ranks bound to a
 * socket they share), every rank starts that many threads and they oversubscribe the
 * cores (4 ranks on 2 cores ran 20x slower than with one thread each). The rule:
 *   threads = max(1, min(cores in the rank's affinity mask,
 *                        cores of the machine / ranks on this node))
 * counting physical cores (hwloc's HWLOC_OBJ_CORE inside the allowed cpuset, so a cgroup
 * limit counts too): the runtime's GEMMs and element-wise loops gain nothing from a
 * second hardware thread of a core. Ranks on this node come from the launcher:
 * OMPI_COMM_WORLD_LOCAL_SIZE (OpenMPI), MPI_LOCALNRANKS (MPICH, Intel MPI), else 1. An
 * explicit OMP_NUM_THREADS is honoured as it is. */
#ifndef MP_EXEC_RUNTIME_THREADS_H
#define MP_EXEC_RUNTIME_THREADS_H

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mp_threads_choice {
  int threads;      /* what OpenMP runs with now */
  int from_env;     /* OMP_NUM_THREADS was set: left as it is */
  int cores_bound;  /* physical cores in the affinity mask (0: unknown) */
  int cores_total;  /* physical cores of the machine (allowed ones) */
  int local_ranks;  /* ranks on this node */
} mp_threads_choice;

/* Applies the rule above (omp_set_num_threads) unless OMP_NUM_THREADS is set, and says
 * what it chose. */
void mp_threads_configure(mp_threads_choice *out);
/* The ranks on this node from the launcher's environment (1 without one). */
int mp_threads_local_ranks(void);

#ifdef __cplusplus
}
#endif
#endif
