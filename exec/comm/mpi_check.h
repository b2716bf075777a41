/* MP_MPI_CHECK: an MPI error code becomes our MP_ERR_MPI with the failing call, file:line and
 * MPI_Error_string on ctx (NCCLCHECK style: the trail says where it broke).
 *
 * Only meaningful with MPI_ERRORS_RETURN on the communicator involved (mp_comm_mpi_init
 * sets it on MPI_COMM_WORLD, and communicators split from it inherit it); under MPI's
 * default MPI_ERRORS_ARE_FATAL an error aborts the job before the macro sees it. */
#ifndef MP_EXEC_COMM_MPI_CHECK_H
#define MP_EXEC_COMM_MPI_CHECK_H

#include <mpi.h>

#include "common/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Records "file:line: call failed: <MPI_Error_string> (MPI error class N)" and returns
 * MP_ERR_MPI. */
mp_status mp_mpi_error(mp_ctx *ctx, int mpi_rc, const char *file, int line, const char *call);

#define MP_MPI_CHECK(ctx, call)                                                  \
  do {                                                                           \
    int mp_mpi_rc_ = (call);                                                     \
    if (mp_mpi_rc_ != MPI_SUCCESS)                                               \
      return mp_mpi_error((ctx), mp_mpi_rc_, __FILE__, __LINE__, #call);         \
  } while (0)

/* On failure stores MP_ERR_MPI in st and jumps to label (one cleanup path). */
#define MP_MPI_CHECK_GOTO(ctx, call, st, label)                                  \
  do {                                                                           \
    int mp_mpi_rc_ = (call);                                                     \
    if (mp_mpi_rc_ != MPI_SUCCESS) {                                             \
      (st) = mp_mpi_error((ctx), mp_mpi_rc_, __FILE__, __LINE__, #call);         \
      goto label;                                                                \
    }                                                                            \
  } while (0)

#ifdef __cplusplus
}
#endif
#endif
