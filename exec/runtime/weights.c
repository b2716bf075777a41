/* Weight file writer and reader (format in weights.h). The host is little-endian (x86-64,
 * aarch64), so integers are copied as they are; a big-endian host is refused at read. */
#include "exec/runtime/weights.h"

#include <stdlib.h>
#include <string.h>

#include "common/json.h"

void mp_wfile_init(mp_wfile *w) { memset(w, 0, sizeof *w); }
void mp_wfile_free(mp_wfile *w) {
  free(w->buf);
  mp_wfile_init(w);
}

static mp_status put(mp_ctx *ctx, mp_wfile *w, const void *p, size_t n) {
  if (w->len + n > w->cap) {
    size_t cap = w->cap ? w->cap : 4096;
    while (cap < w->len + n) cap *= 2;
    unsigned char *b = realloc(w->buf, cap);
    MP_CHECK_ALLOC(ctx, b);
    w->buf = b;
    w->cap = cap;
  }
  memcpy(w->buf + w->len, p, n);
  w->len += n;
  return MP_OK;
}

mp_status mp_wfile_add(mp_ctx *ctx, mp_wfile *w, const char *name, int ndim, const int64_t *shape,
                       const float *data) {
  if (w->len == 0) {
    uint32_t v = MP_WFILE_VERSION, c = 0;
    MP_CHECK(put(ctx, w, MP_WFILE_MAGIC, 4));
    MP_CHECK(put(ctx, w, &v, 4));
    MP_CHECK(put(ctx, w, &c, 4));
  }
  if (ndim < 1 || ndim > 3)
    return mp_error(ctx, MP_ERR_INTERNAL, "weight file: tensor %s has ndim %d (1..3)", name, ndim);
  uint32_t nl = (uint32_t)strlen(name), nd = (uint32_t)ndim;
  int64_t numel = 1;
  for (int i = 0; i < ndim; i++) numel *= shape[i];
  MP_CHECK(put(ctx, w, &nl, 4));
  MP_CHECK(put(ctx, w, name, nl));
  MP_CHECK(put(ctx, w, &nd, 4));
  MP_CHECK(put(ctx, w, shape, (size_t)ndim * 8));
  MP_CHECK(put(ctx, w, data, (size_t)numel * 4));
  w->count++;
  memcpy(w->buf + 8, &w->count, 4);
  return MP_OK;
}

mp_status mp_wfile_write(mp_ctx *ctx, const mp_wfile *w, const char *path) {
  if (w->len == 0) {
    unsigned char hdr[12];
    uint32_t v = MP_WFILE_VERSION, c = 0;
    memcpy(hdr, MP_WFILE_MAGIC, 4);
    memcpy(hdr + 4, &v, 4);
    memcpy(hdr + 8, &c, 4);
    return mp_write_file_atomic(ctx, path, hdr, sizeof hdr);
  }
  return mp_write_file_atomic(ctx, path, w->buf, w->len);
}

/* The file's header at b (len bytes): the magic and the version; *count the tensors it
 * says follow. */
static mp_status read_header(mp_ctx *ctx, const char *path, const char *b, size_t len,
                             uint32_t *count) {
  uint32_t v;
  if (len < 12 || memcmp(b, MP_WFILE_MAGIC, 4) != 0)
    return mp_error(ctx, MP_ERR_INVALID, "%s: not a meshplan weight file (magic MPWT missing)", path);
  memcpy(&v, b + 4, 4);
  memcpy(count, b + 8, 4);
  if (v != MP_WFILE_VERSION)
    return mp_error(ctx, MP_ERR_INVALID, "%s: weight file version %u; this build reads version %u", path, v,
                    MP_WFILE_VERSION);
  return MP_OK;
}

/* The tensor record at b + *pos (name, dims, shape, then the data) into *t, with the data's
 * file offset in t->data until align_data copies it; *pos moves past the record. 0 where
 * the record is malformed or runs past len. */
static int read_record(const char *b, size_t len, size_t *pos, mp_wtensor *t) {
  size_t p = *pos;
  uint32_t nl, nd;
  if (p + 4 > len) return 0;
  memcpy(&nl, b + p, 4);
  p += 4;
  if (nl >= sizeof t->name || p + nl + 4 > len) return 0;
  memcpy(t->name, b + p, nl);
  t->name[nl] = 0;
  p += nl;
  memcpy(&nd, b + p, 4);
  p += 4;
  if (nd < 1 || nd > 3 || p + 8 * nd > len) return 0;
  t->ndim = (int)nd;
  t->numel = 1;
  for (uint32_t d = 0; d < nd; d++) {
    memcpy(&t->shape[d], b + p, 8);
    p += 8;
    if (t->shape[d] < 0) return 0;
    t->numel *= t->shape[d];
  }
  if (p + (size_t)t->numel * 4 > len) return 0;
  t->data = (const float *)(uintptr_t)p; /* the file offset until align_data copies it */
  p += (size_t)t->numel * 4;
  *pos = p;
  return 1;
}

/* Tensor data follows variable-length names, so it is not 4-byte aligned in the file;
 * reading floats there is undefined behaviour. Copies every tensor into an aligned region
 * appended to the same buffer *b (len bytes of file; one free for the caller), which may
 * move. */
static mp_status align_data(mp_ctx *ctx, char **b, size_t len, mp_wtensor *t, uint32_t c) {
  size_t base = (len + 16) & ~(size_t)15, total = 0;
  for (uint32_t i = 0; i < c; i++) total += (size_t)t[i].numel * 4;
  char *nb = realloc(*b, base + total + 1);
  if (!nb) return mp_error(ctx, MP_ERR_NOMEM, "weight file: out of memory");
  *b = nb;
  size_t at = base;
  for (uint32_t i = 0; i < c; i++) {
    size_t off = (size_t)(uintptr_t)t[i].data, n = (size_t)t[i].numel * 4;
    memcpy(nb + at, nb + off, n);
    t[i].data = (const float *)(void *)(nb + at);
    at += n;
  }
  return MP_OK;
}

mp_status mp_wfile_read(mp_ctx *ctx, const char *path, mp_wtensor **tensors, int *count, char **raw) {
  const uint32_t one = 1;
  if (*(const unsigned char *)&one != 1)
    return mp_error(ctx, MP_ERR_UNSUPPORTED, "weight file: big-endian hosts are not supported");
  char *b = NULL;
  size_t len = 0;
  *tensors = NULL;
  *count = 0;
  *raw = NULL;
  MP_CHECK(mp_read_file(ctx, path, &b, &len));
  uint32_t c = 0;
  mp_wtensor *t = NULL;
  mp_status st = read_header(ctx, path, b, len, &c);
  if (st != MP_OK) goto fail;
  t = calloc(c ? c : 1, sizeof *t);
  if (!t) {
    st = mp_error(ctx, MP_ERR_NOMEM, "weight file: out of memory");
    goto fail;
  }
  size_t pos = 12;
  for (uint32_t i = 0; i < c; i++)
    if (!read_record(b, len, &pos, &t[i])) goto trunc;
  if (pos != len) goto trunc;
  st = align_data(ctx, &b, len, t, c);
  if (st != MP_OK) goto fail;
  *tensors = t;
  *count = (int)c;
  *raw = b;
  return MP_OK;
trunc:
  st = mp_error(ctx, MP_ERR_INVALID, "%s: weight file truncated or corrupt (sizes do not add up)", path);
fail:
  free(t);
  free(b);
  return st;
}
