/* The weight file: full (gathered) fp32 tensors by FQN, for the PyTorch reference
 * (tests/reference/model_ref.py) and for comparing gradients between plans.
 *
 * Format, version 1, all integers little-endian:
 *   offset 0   char[4]  magic "MPWT"
 *          4   uint32   version (1)
 *          8   uint32   count (tensors that follow)
 *   then count records:
 *              uint32   name_len;  char name[name_len]   (FQN, no terminator)
 *              uint32   ndim (1..3); int64 shape[ndim]
 *              float32  data[prod(shape)]               (row-major)
 * Files are written whole and atomically (mp_write_file_atomic): a reader never sees a
 * half-written file. */
#ifndef MP_EXEC_RUNTIME_WEIGHTS_H
#define MP_EXEC_RUNTIME_WEIGHTS_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MP_WFILE_MAGIC "MPWT"
#define MP_WFILE_VERSION 1u

typedef struct mp_wfile {
  unsigned char *buf;
  size_t len, cap;
  uint32_t count;
} mp_wfile;

void mp_wfile_init(mp_wfile *w);
void mp_wfile_free(mp_wfile *w);
mp_status mp_wfile_add(mp_ctx *ctx, mp_wfile *w, const char *name, int ndim, const int64_t *shape,
                       const float *data);
mp_status mp_wfile_write(mp_ctx *ctx, const mp_wfile *w, const char *path);

/* One tensor of a file read back (points into the reader's buffer). */
typedef struct mp_wtensor {
  char name[128];
  int ndim;
  int64_t shape[3];
  int64_t numel;
  const float *data;
} mp_wtensor;

/* Reads and validates a whole file (magic, version, sizes against the file length).
 * *tensors and *raw are malloc'ed; free both. */
mp_status mp_wfile_read(mp_ctx *ctx, const char *path, mp_wtensor **tensors, int *count, char **raw);

#ifdef __cplusplus
}
#endif
#endif
