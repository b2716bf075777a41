/* Element types of tensors and of the arithmetic that reads them: what a GEMM computes in,
 * what a collective moves, what a buffer holds. */
#ifndef MP_EXEC_DTYPE_H
#define MP_EXEC_DTYPE_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mp_dtype {
  MP_DTYPE_FP32 = 0,
  MP_DTYPE_TF32,
  MP_DTYPE_BF16,
  MP_DTYPE_FP16,
  MP_DTYPE_FP8_E4M3,
  MP_DTYPE_FP8_E5M2,
  MP_DTYPE_COUNT
} mp_dtype;

/* Bytes per element (float8: 1). */
int mp_dtype_bytes(mp_dtype t);
const char *mp_dtype_name(mp_dtype t);

#ifdef __cplusplus
}
#endif
#endif
