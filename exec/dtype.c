/* See dtype.h. */
#include "exec/dtype.h"

int mp_dtype_bytes(mp_dtype t) {
  switch (t) {
    case MP_DTYPE_FP32:
    case MP_DTYPE_TF32:
      return 4;
    case MP_DTYPE_BF16:
    case MP_DTYPE_FP16:
      return 2;
    default:
      return 1;
  }
}

const char *mp_dtype_name(mp_dtype t) {
  static const char *n[] = {"fp32", "tf32", "bf16", "fp16", "fp8_e4m3", "fp8_e5m2"};
  return t < MP_DTYPE_COUNT ? n[t] : "?";
}
