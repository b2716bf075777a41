/* The NCCL entry points of comm.h and comm_backend.h for builds without NCCL.
 *
 * exec/comm/BUILD compiles this file instead of comm_nccl.c when @local_cuda found no NCCL
 * (or no CUDA toolkit, or MESHPLAN_NO_CUDA=1), so callers link in every build and learn at
 * run time that the backend is absent; mp_comm_create_for_device then stages through MPI. */
#include "exec/comm/comm_backend.h"

int mp_comm_nccl_built(void) { return 0; }

mp_status mp_comm_create_nccl(mp_ctx *ctx, const mp_mesh *mesh, int cuda_device,
                              void *cuda_stream, mp_comm **out) {
  (void)mesh, (void)cuda_device, (void)cuda_stream;
  *out = NULL;
  return mp_error(ctx, MP_ERR_UNSUPPORTED,
                  "the NCCL backend is not available: meshplan was built without NCCL (nccl.h "
                  "and libnccl were not found under $CUDA_HOME, /usr/local/cuda or /usr); use "
                  "mp_comm_create_for_device, which stages device buffers through MPI");
}

mp_status mp_comm_nccl_node_gpus(mp_ctx *ctx, int device, mp_comm_node_gpus *out) {
  (void)device, (void)out;
  return mp_error(ctx, MP_ERR_UNSUPPORTED,
                  "telling GPUs apart needs the CUDA runtime: meshplan was built without NCCL");
}

int mp_comm_nccl_comm_count(const mp_comm *c) {
  (void)c;
  return 0;
}
