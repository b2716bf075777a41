/* safetensors files (Hugging Face's format), read and written.
 *
 * Format (github.com/huggingface/safetensors, README "Format"): 8 bytes, a little-endian
 * uint64 N; N bytes of UTF-8 JSON, an object mapping each tensor name to {"dtype",
 * "shape", "data_offsets": [begin, end]} (byte offsets relative to the data that follows
 * the header) plus an optional "__metadata__" object of strings; the JSON may be padded
 * with spaces; then the data, little-endian, row-major. The tensors must cover the data
 * without holes or overlaps.
 *
 * Reading maps the file(s) and checks every entry (dtype known, offsets inside the file
 * and matching the shape, no overlaps or holes); F32, BF16 and F16 tensors are read into
 * fp32 by box (a rank reads only its tile's rows). A Hugging Face folder is read through
 * model.safetensors.index.json (its "weight_map" names the file of every tensor) or else
 * its model.safetensors.
 *
 * Writing streams: the header (every name, dtype and shape) first, then each tensor's
 * data in the same order, to PATH.tmp, fsynced and renamed when complete; the data comes
 * as fp32 and is written as F32, or as BF16 rounded to nearest even (torch's conversion). */
#ifndef MP_EXEC_RUNTIME_SAFETENSORS_H
#define MP_EXEC_RUNTIME_SAFETENSORS_H

#include <stdint.h>

#include <cjson/cJSON.h>

#include "common/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MP_ST_MAX_NDIM 4
#define MP_ST_HEADER_MAX (100u << 20) /* the reference implementation's limit on N */

typedef enum mp_st_dtype { MP_ST_F32 = 0, MP_ST_BF16, MP_ST_F16 } mp_st_dtype;

typedef struct mp_st_tensor {
  char *name;
  mp_st_dtype dtype;
  int ndim;
  int64_t shape[MP_ST_MAX_NDIM];
  int64_t begin, end; /* data offsets */
  int file;
} mp_st_tensor;

typedef struct mp_st_set mp_st_set;

/* A .safetensors file, or a folder holding model.safetensors.index.json or
 * model.safetensors. Errors name the file and what is wrong. */
mp_status mp_st_open(mp_ctx *ctx, const char *path, mp_st_set **out);
/* One file's bytes (len of them; borrowed: they must outlive the set), named origin in
 * messages: the checks of mp_st_open, the parsing shared (a mapped file is read as its
 * bytes). */
mp_status mp_st_from_bytes(mp_ctx *ctx, const void *bytes, size_t len, const char *origin, mp_st_set **out);
void mp_st_close(mp_st_set *s);
int mp_st_count(const mp_st_set *s);
const mp_st_tensor *mp_st_tensor_at(const mp_st_set *s, int i);
const mp_st_tensor *mp_st_find(const mp_st_set *s, const char *name);
const char *mp_st_file_of(const mp_st_set *s, const mp_st_tensor *t);
/* The box off/len (ndim of t) of tensor t, converted to fp32 into dst (row-major). */
mp_status mp_st_read_box(mp_ctx *ctx, const mp_st_set *s, const mp_st_tensor *t, const int64_t *off,
                         const int64_t *len, float *dst);

typedef struct mp_st_writer mp_st_writer;
/* Starts a file of n tensors of dtype (F32 or BF16; names, ndims, shapes
 * [n][MP_ST_MAX_NDIM]) and the metadata (string values; may be NULL). The data then comes
 * in order through put. */
mp_status mp_st_writer_open(mp_ctx *ctx, const char *path, int n, const char *const *names, const int *ndims,
                            const int64_t (*shapes)[MP_ST_MAX_NDIM], mp_st_dtype dtype, const cJSON *metadata,
                            mp_st_writer **out);
/* The next tensor's data (numel of its shape, fp32; rounded when the file is BF16). */
mp_status mp_st_writer_put(mp_ctx *ctx, mp_st_writer *w, const float *data);
/* commit = 1: checks every tensor came, fsyncs and renames into place; 0 (or a failure):
 * removes the temporary file. Frees w either way. */
mp_status mp_st_writer_close(mp_ctx *ctx, mp_st_writer *w, int commit);

#ifdef __cplusplus
}
#endif
#endif
