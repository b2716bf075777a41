/* Internals shared by the calibration's files (not an interface for other modules). */
#ifndef MP_CALIB_CALIB_INTERNAL_H
#define MP_CALIB_CALIB_INTERNAL_H

#include "calib/calibrate.h"

/* Starts a calibration of `device` in *out: everything zeroed, then created_at (now),
 * device, host (this machine's name, "unknown" when it has none), threads and world. */
void mp_calib_begin(mp_calib *out, const char *device, int threads, int world);

/* The largest N x K (input), M x K (weight) and N x M (output) elements of n GEMM shapes,
 * at least 1 each: buffers of these sizes serve every shape's forward, dgrad and wgrad. */
void mp_calib_gemm_extents(const mp_calib_gemm_shape *g, int n, size_t *nk, size_t *mk, size_t *nm);
/* The largest query (B T nh hd), key/value (B T nkv hd) and softmax-statistics (B T nh)
 * elements of o's attention points, at least 1 each. */
void mp_calib_attn_extents(const mp_calib_options *o, size_t *q, size_t *kv, size_t *rows);

#endif
