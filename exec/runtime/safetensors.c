/* safetensors reader and writer (see safetensors.h). The host is little-endian (x86-64,
 * aarch64), as the format's data. */
#define _GNU_SOURCE
#include "common/file.h"
#include "exec/runtime/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/checked.h"
#include "common/json.h"
#include "kernels/ops.h"

typedef struct st_file {
  char *path;
  const unsigned char *map;
  size_t len;
  size_t data; /* offset of the data: 8 + N */
  int mapped;  /* map is this reader's mapping (else borrowed bytes) */
} st_file;

struct mp_st_set {
  st_file *files;
  int n_files;
  mp_st_tensor *t;
  int n, cap;
  const mp_st_tensor **by_name; /* t sorted by name (mp_st_find's binary search) */
};

static const char *const k_dtypes[] = {"F32", "BF16", "F16"};
static const int k_dtype_bytes[] = {4, 2, 2};

/* ---- reading ------------------------------------------------------------------------------ */

static mp_status map_file(mp_ctx *ctx, const char *path, st_file *f) {
  int fd = -1;
  int64_t size = 0;
  MP_CHECK(mp_file_open_input(ctx, path, &fd, &size)); /* regular files only */
  f->len = (size_t)size;
  if (size < 8) { /* parse_header refuses it; an empty file cannot be mapped */
    close(fd);
    f->map = (const unsigned char *)"";
    return MP_OK;
  }
  void *m = mmap(NULL, f->len, PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  if (m == MAP_FAILED) return mp_error(ctx, MP_ERR_IO, "%s: cannot map: %s", path, strerror(errno));
  f->map = m;
  f->mapped = 1;
  return MP_OK;
}

static mp_status add_entry(mp_ctx *ctx, mp_st_set *s, int file, const cJSON *e) {
  const st_file *f = &s->files[file];
  const char *dt = cJSON_GetStringValue(cJSON_GetObjectItem(e, "dtype"));
  const cJSON *shape = cJSON_GetObjectItem(e, "shape"), *offs = cJSON_GetObjectItem(e, "data_offsets");
  if (s->n == s->cap) {
    s->cap = s->cap ? 2 * s->cap : 64;
    mp_st_tensor *nt = realloc(s->t, (size_t)s->cap * sizeof *nt);
    MP_CHECK_ALLOC(ctx, nt);
    s->t = nt;
  }
  mp_st_tensor *t = &s->t[s->n];
  memset(t, 0, sizeof *t);
  t->file = file;
  int dtype = -1;
  for (int k = 0; dt && k < 3; k++)
    if (strcmp(dt, k_dtypes[k]) == 0) dtype = k;
  if (dtype < 0)
    return mp_error(ctx, MP_ERR_UNSUPPORTED, "%s: tensor %s has dtype %s; meshplan reads F32, BF16 and F16", f->path,
                    e->string, dt ? dt : "(none)");
  t->dtype = (mp_st_dtype)dtype;
  t->ndim = cJSON_GetArraySize(shape);
  if (!cJSON_IsArray(shape) || t->ndim > MP_ST_MAX_NDIM || !cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2)
    return mp_error(ctx, MP_ERR_INVALID, "%s: tensor %s: malformed shape or data_offsets", f->path, e->string);
  /* whole numbers within 2^53 (a double's exact integers; no file is near 2^53 bytes),
   * their product and byte count checked: a header could say 1e300 or [2^40, 2^40] */
  const int64_t data_bytes = (int64_t)(f->len - f->data);
  int64_t numel = 1, bytes = 0, d = 0;
  const cJSON *v;
  cJSON_ArrayForEach(v, shape) {
    if (!mp_json_int_in(v, 0, 1LL << 53, &t->shape[d]) || mp_mul_i64(numel, t->shape[d], &numel))
      return mp_error(ctx, MP_ERR_INVALID, "%s: tensor %s: shape entry %d is not a size (a whole number in 0..2^53 "
                      "whose product fits)", f->path, e->string, (int)d);
    d++;
  }
  if (!mp_json_int_in(cJSON_GetArrayItem(offs, 0), 0, data_bytes, &t->begin) ||
      !mp_json_int_in(cJSON_GetArrayItem(offs, 1), t->begin, data_bytes, &t->end) ||
      mp_mul_i64(numel, k_dtype_bytes[dtype], &bytes) || t->end - t->begin != bytes)
    return mp_error(ctx, MP_ERR_INVALID, "%s: tensor %s: data_offsets do not hold its %lld elements of %d bytes "
                    "inside the file's %lld data bytes; the file is truncated or corrupt", f->path, e->string,
                    (long long)numel, k_dtype_bytes[dtype], (long long)data_bytes);
  t->name = strdup(e->string);
  MP_CHECK_ALLOC(ctx, t->name);
  s->n++;
  return MP_OK;
}

static int by_begin(const void *a, const void *b) {
  const mp_st_tensor *x = a, *y = b;
  if (x->file != y->file) return x->file - y->file;
  return x->begin < y->begin ? -1 : x->begin > y->begin;
}

/* A new file entry of s (zeroed), named path. */
static mp_status add_file(mp_ctx *ctx, mp_st_set *s, const char *path, st_file **out) {
  st_file *nf = realloc(s->files, (size_t)(s->n_files + 1) * sizeof *nf);
  MP_CHECK_ALLOC(ctx, nf);
  s->files = nf;
  *out = &s->files[s->n_files++];
  memset(*out, 0, sizeof **out);
  (*out)->path = strdup(path);
  MP_CHECK_ALLOC(ctx, (*out)->path);
  return MP_OK;
}

/* File fi's header (its bytes map/len are set), its tensors appended to s. Shared by the
 * mapped files and the bytes entry point. */
static mp_status parse_header(mp_ctx *ctx, mp_st_set *s, int fi) {
  st_file *f = &s->files[fi];
  const char *path = f->path;
  if (f->len < 8)
    return mp_error(ctx, MP_ERR_INVALID, "%s: too short for a safetensors file (an 8-byte header length)", path);
  uint64_t n;
  memcpy(&n, f->map, 8);
  if (n > MP_ST_HEADER_MAX || n > f->len - 8)
    return mp_error(ctx, MP_ERR_INVALID, "%s: header length %llu does not fit the file (%zu bytes); not a safetensors "
                    "file, or truncated", path, (unsigned long long)n, f->len);
  f->data = 8 + (size_t)n;
  /* through the one JSON entry point: a tensor named twice is refused there, not read as
   * the first of two as cJSON would and the Python reader would not */
  char origin[600];
  snprintf(origin, sizeof origin, "%s (its JSON header)", path);
  cJSON *h = NULL;
  MP_CHECK(mp_json_parse_len(ctx, (const char *)f->map + 8, (size_t)n, origin, &h));
  const int first = s->n;
  mp_status st = MP_OK;
  const cJSON *e;
  cJSON_ArrayForEach(e, h) {
    if (st != MP_OK) break;
    if (strcmp(e->string, "__metadata__") != 0) st = add_entry(ctx, s, fi, e);
  }
  cJSON_Delete(h);
  MP_CHECK(st);
  /* no holes, no overlaps: sorted by offset, each begins where the last ended */
  if (s->n > first) qsort(s->t + first, (size_t)(s->n - first), sizeof *s->t, by_begin); /* s->t: NULL for none */
  int64_t at = 0;
  for (int i = first; i < s->n; i++) {
    if (s->t[i].begin != at)
      return mp_error(ctx, MP_ERR_INVALID, "%s: tensor %s starts at data byte %lld but the previous one ends at %lld "
                      "(a hole or an overlap); the file is corrupt", path, s->t[i].name, (long long)s->t[i].begin,
                      (long long)at);
    at = s->t[i].end;
  }
  return MP_OK;
}

/* One file, mapped, its tensors appended to s. */
static mp_status read_file(mp_ctx *ctx, mp_st_set *s, const char *path) {
  st_file *f;
  MP_CHECK(add_file(ctx, s, path, &f));
  MP_CHECK(map_file(ctx, path, f));
  return parse_header(ctx, s, s->n_files - 1);
}

static mp_status read_index(mp_ctx *ctx, mp_st_set *s, const char *folder, const char *index) {
  cJSON *root = NULL;
  MP_CHECK(mp_json_parse_file(ctx, index, &root));
  const cJSON *wm = cJSON_GetObjectItem(root, "weight_map");
  mp_status st = cJSON_IsObject(wm) ? MP_OK : mp_error(ctx, MP_ERR_INVALID, "%s: no \"weight_map\" object", index);
  /* each file once, in the order the map first names it */
  const cJSON *e;
  cJSON_ArrayForEach(e, wm) {
    if (st != MP_OK) break;
    const char *fn = cJSON_GetStringValue(e);
    if (!fn || strchr(fn, '/')) {
      st = mp_error(ctx, MP_ERR_INVALID, "%s: tensor %s maps to a bad file name", index, e->string);
      break;
    }
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", folder, fn);
    int seen = 0;
    for (int f = 0; f < s->n_files && !seen; f++) seen = strcmp(s->files[f].path, p) == 0;
    if (!seen) st = read_file(ctx, s, p);
  }
  cJSON_Delete(root);
  return st;
}

static int by_name(const void *a, const void *b) {
  return strcmp((*(const mp_st_tensor *const *)a)->name, (*(const mp_st_tensor *const *)b)->name);
}

/* The index by name, and a name given twice (in one header or in two files of a folder)
 * refused: sorted, so a header of millions of entries is indexed and checked in n log n. */
static mp_status index_names(mp_ctx *ctx, mp_st_set *s, const char *path) {
  const mp_st_tensor **v = malloc((size_t)(s->n + 1) * sizeof *v);
  MP_CHECK_ALLOC(ctx, v);
  for (int i = 0; i < s->n; i++) v[i] = &s->t[i];
  if (s->n > 1) qsort(v, (size_t)s->n, sizeof *v, by_name);
  s->by_name = v;
  for (int i = 1; i < s->n; i++)
    if (strcmp(v[i - 1]->name, v[i]->name) == 0)
      return mp_error(ctx, MP_ERR_INVALID, "%s: tensor %s appears twice", path, v[i]->name);
  return MP_OK;
}

/* The checks across files, then *out = s; s is closed on failure. */
static mp_status finish(mp_ctx *ctx, mp_st_set *s, const char *path, mp_status st, mp_st_set **out) {
  if (st == MP_OK) st = index_names(ctx, s, path);
  if (st != MP_OK) {
    mp_st_close(s);
    return st;
  }
  *out = s;
  return MP_OK;
}

mp_status mp_st_open(mp_ctx *ctx, const char *path, mp_st_set **out) {
  *out = NULL;
  mp_st_set *s = calloc(1, sizeof *s);
  MP_CHECK_ALLOC(ctx, s);
  struct stat sb;
  mp_status st;
  if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
    char idx[4096], one[4096];
    snprintf(idx, sizeof idx, "%s/model.safetensors.index.json", path);
    snprintf(one, sizeof one, "%s/model.safetensors", path);
    if (access(idx, R_OK) == 0)
      st = read_index(ctx, s, path, idx);
    else if (access(one, R_OK) == 0)
      st = read_file(ctx, s, one);
    else
      st = mp_error(ctx, MP_ERR_NOT_FOUND, "%s holds neither model.safetensors nor model.safetensors.index.json",
                    path);
  } else {
    st = read_file(ctx, s, path);
  }
  return finish(ctx, s, path, st, out);
}

mp_status mp_st_from_bytes(mp_ctx *ctx, const void *bytes, size_t len, const char *origin, mp_st_set **out) {
  *out = NULL;
  mp_st_set *s = calloc(1, sizeof *s);
  MP_CHECK_ALLOC(ctx, s);
  st_file *f;
  mp_status st = add_file(ctx, s, origin, &f);
  if (st == MP_OK) {
    f->map = bytes;
    f->len = len;
    st = parse_header(ctx, s, 0);
  }
  return finish(ctx, s, origin, st, out);
}

void mp_st_close(mp_st_set *s) {
  if (!s) return;
  for (int f = 0; f < s->n_files; f++) {
    if (s->files[f].mapped) munmap((void *)s->files[f].map, s->files[f].len);
    free(s->files[f].path);
  }
  for (int i = 0; i < s->n; i++) free(s->t[i].name);
  free(s->files);
  free(s->t);
  free(s->by_name);
  free(s);
}

int mp_st_count(const mp_st_set *s) { return s->n; }
const mp_st_tensor *mp_st_tensor_at(const mp_st_set *s, int i) { return &s->t[i]; }
const char *mp_st_file_of(const mp_st_set *s, const mp_st_tensor *t) { return s->files[t->file].path; }

const mp_st_tensor *mp_st_find(const mp_st_set *s, const char *name) {
  int lo = 0, hi = s->n - 1;
  while (lo <= hi) {
    const int mid = lo + (hi - lo) / 2, c = strcmp(s->by_name[mid]->name, name);
    if (c == 0) return s->by_name[mid];
    if (c < 0)
      lo = mid + 1;
    else
      hi = mid - 1;
  }
  return NULL;
}

static float half_to_f32(uint16_t h) {
  const uint32_t sign = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 0x1f, m = h & 0x3ff;
  uint32_t bits;
  if (e == 0 && m == 0) {
    bits = sign;
  } else if (e == 0) { /* subnormal: m * 2^-24 */
    float v = (float)m * (1.0f / 16777216.0f);
    return sign ? -v : v;
  } else if (e == 31) {
    bits = sign | 0x7f800000u | (m << 13);
  } else {
    bits = sign | ((e + 112) << 23) | (m << 13);
  }
  float v;
  memcpy(&v, &bits, 4);
  return v;
}

static void convert(const unsigned char *src, mp_st_dtype dt, int64_t n, float *dst) {
  if (dt == MP_ST_F32) {
    memcpy(dst, src, (size_t)n * 4);
    return;
  }
  for (int64_t i = 0; i < n; i++) {
    uint16_t h;
    memcpy(&h, src + 2 * i, 2);
    if (dt == MP_ST_BF16) {
      const uint32_t bits = (uint32_t)h << 16;
      memcpy(&dst[i], &bits, 4);
    } else {
      dst[i] = half_to_f32(h);
    }
  }
}

mp_status mp_st_read_box(mp_ctx *ctx, const mp_st_set *s, const mp_st_tensor *t, const int64_t *off,
                         const int64_t *len, float *dst) {
  int64_t o[3] = {0, 0, 0}, l[3] = {1, 1, 1}, sh[3] = {1, 1, 1};
  if (t->ndim > 3) return mp_error(ctx, MP_ERR_UNSUPPORTED, "tensor %s has %d dims (at most 3 read)", t->name, t->ndim);
  const int lead = 3 - t->ndim; /* right-align: a 2-D tensor is [1, R, C] */
  for (int d = 0; d < t->ndim; d++) {
    o[lead + d] = off[d];
    l[lead + d] = len[d];
    sh[lead + d] = t->shape[d];
    if (off[d] < 0 || len[d] < 0 || off[d] + len[d] > t->shape[d])
      return mp_error(ctx, MP_ERR_INTERNAL, "tensor %s: box outside the tensor", t->name);
  }
  const unsigned char *base = s->files[t->file].map + s->files[t->file].data + t->begin;
  const int eb = k_dtype_bytes[t->dtype];
  for (int64_t a = 0; a < l[0]; a++)
    for (int64_t b = 0; b < l[1]; b++) {
      const int64_t src = ((o[0] + a) * sh[1] + o[1] + b) * sh[2] + o[2];
      convert(base + src * eb, t->dtype, l[2], dst + (a * l[1] + b) * l[2]);
    }
  return MP_OK;
}

/* ---- writing ------------------------------------------------------------------------------ */

struct mp_st_writer {
  char path[4096], tmp[4200];
  FILE *f;
  int n, next;
  int64_t *numel;
  mp_st_dtype dtype;
  uint16_t *half; /* BF16: a tensor's rounded values before they are written */
};

mp_status mp_st_writer_open(mp_ctx *ctx, const char *path, int n, const char *const *names, const int *ndims,
                            const int64_t (*shapes)[MP_ST_MAX_NDIM], mp_st_dtype dtype, const cJSON *metadata,
                            mp_st_writer **out) {
  *out = NULL;
  cJSON *h = cJSON_CreateObject();
  MP_CHECK_ALLOC(ctx, h);
  if (metadata) cJSON_AddItemToObject(h, "__metadata__", cJSON_Duplicate(metadata, 1));
  mp_st_writer *w = calloc(1, sizeof *w);
  int64_t *numel = calloc((size_t)(n > 0 ? n : 1), sizeof *numel);
  int64_t at = 0;
  for (int i = 0; w && numel && i < n; i++) {
    cJSON *e = cJSON_AddObjectToObject(h, names[i]);
    cJSON_AddStringToObject(e, "dtype", k_dtypes[dtype]);
    cJSON *sh = cJSON_AddArrayToObject(e, "shape"), *of = cJSON_AddArrayToObject(e, "data_offsets");
    numel[i] = 1;
    for (int d = 0; d < ndims[i]; d++) {
      cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)shapes[i][d]));
      numel[i] *= shapes[i][d];
    }
    cJSON_AddItemToArray(of, cJSON_CreateNumber((double)at));
    at += numel[i] * k_dtype_bytes[dtype];
    cJSON_AddItemToArray(of, cJSON_CreateNumber((double)at));
  }
  char *text = w && numel ? cJSON_PrintUnformatted(h) : NULL;
  cJSON_Delete(h);
  if (!text) {
    free(w);
    free(numel);
    return mp_error(ctx, MP_ERR_NOMEM, "safetensors: out of memory for the header of %s", path);
  }
  w->numel = numel;
  w->n = n;
  w->dtype = dtype;
  snprintf(w->path, sizeof w->path, "%s", path);
  snprintf(w->tmp, sizeof w->tmp, "%s.tmp", path);
  size_t hl = strlen(text), padded = (hl + 7) / 8 * 8; /* the data starts 8-byte aligned */
  w->f = fopen(w->tmp, "wb");
  mp_status st = w->f ? MP_OK : mp_error(ctx, MP_ERR_IO, "%s: cannot create: %s", w->tmp, strerror(errno));
  const uint64_t n64 = padded;
  if (st == MP_OK && (fwrite(&n64, 8, 1, w->f) != 1 || fwrite(text, 1, hl, w->f) != hl))
    st = mp_error_write(ctx, errno, w->tmp);
  for (size_t i = hl; st == MP_OK && i < padded; i++)
    if (fputc(' ', w->f) == EOF) st = mp_error_write(ctx, errno, w->tmp);
  free(text);
  if (st != MP_OK) {
    mp_st_writer_close(ctx, w, 0);
    return st;
  }
  *out = w;
  return MP_OK;
}

mp_status mp_st_writer_put(mp_ctx *ctx, mp_st_writer *w, const float *data) {
  if (w->next >= w->n) return mp_error(ctx, MP_ERR_INTERNAL, "safetensors: more tensors than declared");
  const size_t n = (size_t)w->numel[w->next++];
  if (w->dtype == MP_ST_F32) return fwrite(data, 4, n, w->f) == n ? MP_OK : mp_error_write(ctx, errno, w->tmp);
  uint16_t *h = realloc(w->half, (n ? n : 1) * sizeof *h);
  MP_CHECK_ALLOC(ctx, h);
  w->half = h;
  /* round to nearest even, as torch's .to(torch.bfloat16) */
  for (size_t i = 0; i < n; i++) h[i] = mp_bf16_from_f32(data[i]);
  return fwrite(h, 2, n, w->f) == n ? MP_OK : mp_error_write(ctx, errno, w->tmp);
}

mp_status mp_st_writer_close(mp_ctx *ctx, mp_st_writer *w, int commit) {
  if (!w) return MP_OK;
  mp_status st = MP_OK;
  if (commit && w->next != w->n)
    st = mp_error(ctx, MP_ERR_INTERNAL, "safetensors: %d of %d tensors written", w->next, w->n);
  if (w->f) {
    if (st == MP_OK && commit && (fflush(w->f) != 0 || fsync(fileno(w->f)) != 0))
      st = mp_error_write(ctx, errno, w->tmp);
    if (fclose(w->f) != 0 && st == MP_OK && commit) st = mp_error_write(ctx, errno, w->tmp);
  }
  if (st == MP_OK && commit && rename(w->tmp, w->path) != 0)
    st = mp_error(ctx, MP_ERR_IO, "%s: rename failed: %s", w->path, strerror(errno));
  if (st != MP_OK || !commit) unlink(w->tmp);
  free(w->numel);
  free(w->half);
  free(w);
  return st;
}
