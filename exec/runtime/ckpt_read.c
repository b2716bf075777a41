/* Distributed checkpoints: the manifest, reading a box of a saved tensor by byte ranges,
 * and the load into a runtime of any mesh (ckpt.h states the format).
 *
 * A box is read shard by shard: its intersection with the shard is a set of runs, one per
 * index of the leading dims, each contiguous in the shard (row-major). A run is copied
 * from the checksum chunks that hold it; a chunk is read with one pread and verified
 * before any of its bytes is used, and the last chunk read is kept, so runs that share a
 * chunk read it once. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "common/assert.h"
#include "common/checked.h"
#include "common/file.h"
#include "common/json.h"
#include "common/limits.h"
#include "exec/runtime/ckpt_internal.h"

uint64_t mp_ckpt_hash64(const void *data, size_t n) { return (uint64_t)XXH64(data, n, 0); }

/* ---- the manifest ------------------------------------------------------------------------- */

static mp_status bad(mp_ctx *ctx, const char *dir, const char *what) {
  return mp_error(ctx, MP_ERR_INVALID, "%s/manifest.json: %s; the checkpoint is damaged: resume from another step",
                  dir, what);
}

/* The manifest's numbers are whole and in stated ranges before any arithmetic: a
 * hostile or damaged manifest could otherwise hold 1e300 (a double that no int64 holds),
 * negative sizes, or offsets whose sums leave int64. Sizes and offsets stay within 2^53
 * (a double's exact integers, and 2^53 bytes = 8 PiB, beyond any file); their products
 * are formed with common/checked.h. */
#define CKPT_MAX_BYTES (1LL << 53)
/* Checksum chunks: the writer uses MP_CKPT_CHUNK_BYTES; 1 GiB bounds the one buffer of a
 * chunk that a read allocates. */
#define CKPT_MAX_CHUNK (1LL << 30)
/* The sequences a run can have consumed: MP_LIM_STEPS steps of MP_LIM_GLOBAL_BATCH. */
#define CKPT_MAX_CONSUMED (MP_LIM_STEPS * MP_LIM_GLOBAL_BATCH)

static int get_i64(const cJSON *o, const char *key, int64_t hi, int64_t *out) {
  return mp_json_int_in(cJSON_GetObjectItem(o, key), 0, hi, out);
}

/* A box's or shape's dims: 1 to 3 whole numbers in lo..CKPT_MAX_BYTES (dims past n: 1),
 * n equal to *ndim when it is set. */
static int get_dims(const cJSON *o, const char *key, int64_t lo, int64_t *out, int *ndim) {
  const cJSON *a = cJSON_GetObjectItem(o, key), *v;
  const int n = cJSON_GetArraySize(a);
  if (!cJSON_IsArray(a) || n < 1 || n > 3 || (*ndim && *ndim != n)) return 0;
  int d = 0;
  cJSON_ArrayForEach(v, a) if (!mp_json_int_in(v, lo, CKPT_MAX_BYTES, &out[d++])) return 0;
  for (; d < 3; d++) out[d] = 1;
  *ndim = n;
  return 1;
}

static int is_hex16(const char *h) { return h && strlen(h) == 16 && strspn(h, "0123456789abcdefABCDEF") == 16; }

static mp_status parse_shard(mp_ctx *ctx, mp_ckpt_manifest *m, const mp_ckpt_tensor *t, const cJSON *js,
                             mp_ckpt_shard *s) {
  int nd = t->ndim;
  int64_t file = -1;
  char what[600];
  snprintf(what, sizeof what, "a shard of tensor %s is malformed", t->name);
  if (!get_i64(js, "file", (int64_t)m->n_files - 1, &file) || !get_dims(js, "offset", 0, s->off, &nd) ||
      !get_dims(js, "len", 1, s->len, &nd) || !get_i64(js, "byte_offset", CKPT_MAX_BYTES, &s->byte_offset))
    return bad(ctx, m->dir, what);
  s->file = (int)file;
  if (nd < 3) s->off[2] = 0;
  if (nd < 2) s->off[1] = 0;
  int64_t numel = 1, bytes, end;
  for (int d = 0; d < 3; d++) /* off + len: both within 2^53, so no overflow */
    if (s->off[d] + s->len[d] > t->shape[d] || mp_mul_i64(numel, s->len[d], &numel)) return bad(ctx, m->dir, what);
  if (mp_mul_i64(numel, 4, &bytes) || mp_add_i64(s->byte_offset, bytes, &end) || end > m->file_bytes[s->file]) {
    snprintf(what, sizeof what, "tensor %s's shard of %lld elements from byte %lld does not fit %s, which holds %lld "
             "bytes: the file is truncated", t->name, (long long)numel, (long long)s->byte_offset, m->files[s->file],
             (long long)m->file_bytes[s->file]);
    return mp_error(ctx, MP_ERR_INVALID, "%s/%s: %s; resume from another step", m->dir, m->files[s->file], what);
  }
  const cJSON *ch = cJSON_GetObjectItem(js, "xxh64"), *h;
  s->n_chunks = cJSON_GetArraySize(ch);
  if (!cJSON_IsArray(ch) || s->n_chunks != (bytes + m->chunk_bytes - 1) / m->chunk_bytes)
    return bad(ctx, m->dir, what);
  s->chunks = mp_arena_alloc(m->arena, (size_t)s->n_chunks * sizeof *s->chunks);
  MP_CHECK_ALLOC(ctx, s->chunks);
  int k = 0;
  cJSON_ArrayForEach(h, ch) {
    const char *hex = cJSON_GetStringValue(h);
    if (!is_hex16(hex)) return bad(ctx, m->dir, what);
    s->chunks[k++] = strtoull(hex, NULL, 16);
  }
  return MP_OK;
}

/* A file name of the step folder: a plain name, never a path out of it (no '/', not "."
 * or ".."), at most NAME_MAX bytes. */
static int plain_name(const char *n) {
  return n && n[0] && !strchr(n, '/') && strcmp(n, ".") != 0 && strcmp(n, "..") != 0 && strlen(n) <= 255;
}

static mp_status parse_files(mp_ctx *ctx, mp_ckpt_manifest *m) {
  const cJSON *files = cJSON_GetObjectItem(m->root, "files"), *fo;
  if (!cJSON_IsArray(files)) return bad(ctx, m->dir, "\"files\" is not a list");
  m->n_files = cJSON_GetArraySize(files);
  m->files = mp_arena_alloc(m->arena, (size_t)(m->n_files + 1) * sizeof *m->files);
  m->file_bytes = mp_arena_alloc(m->arena, (size_t)(m->n_files + 1) * sizeof *m->file_bytes);
  MP_CHECK_ALLOC(ctx, m->files);
  MP_CHECK_ALLOC(ctx, m->file_bytes);
  int f = 0;
  cJSON_ArrayForEach(fo, files) {
    const char *name = cJSON_GetStringValue(cJSON_GetObjectItem(fo, "name"));
    int64_t want = 0;
    if (!plain_name(name) || !get_i64(fo, "bytes", CKPT_MAX_BYTES, &want))
      return bad(ctx, m->dir, "a file entry is malformed (a plain file name of the step folder and its bytes)");
    m->files[f] = mp_arena_strdup(m->arena, name);
    MP_CHECK_ALLOC(ctx, m->files[f]);
    char p[MP_CKPT_PATH_MAX + 300];
    snprintf(p, sizeof p, "%s/%s", m->dir, name);
    struct stat sb;
    if (stat(p, &sb) != 0) return mp_error(ctx, MP_ERR_INVALID, "%s: missing (%s); the checkpoint is incomplete: "
                                           "resume from another step", p, strerror(errno));
    if (!S_ISREG(sb.st_mode))
      return mp_error(ctx, MP_ERR_INVALID, "%s: not a regular file; the checkpoint is damaged: resume from another "
                      "step", p);
    m->file_bytes[f] = (int64_t)sb.st_size;
    if (m->file_bytes[f] > want)
      return mp_error(ctx, MP_ERR_INVALID, "%s: %lld bytes, but the manifest says %lld; the checkpoint is damaged",
                      p, (long long)m->file_bytes[f], (long long)want);
    f++;
  }
  return MP_OK;
}

static int by_name(const void *a, const void *b) {
  return strcmp((*(const mp_ckpt_tensor *const *)a)->name, (*(const mp_ckpt_tensor *const *)b)->name);
}

/* Each tensor is listed once: a second entry would be read by no load (mp_ckpt_find finds
 * the first) and written twice by an export. Sorted once, so n log n. */
static mp_status check_unique(mp_ctx *ctx, mp_ckpt_manifest *m) {
  const mp_ckpt_tensor **by = mp_arena_alloc(m->arena, (size_t)(m->n_tensors + 1) * sizeof *by);
  MP_CHECK_ALLOC(ctx, by);
  for (int i = 0; i < m->n_tensors; i++) by[i] = &m->tensors[i];
  qsort(by, (size_t)m->n_tensors, sizeof *by, by_name);
  for (int i = 1; i < m->n_tensors; i++)
    if (strcmp(by[i - 1]->name, by[i]->name) == 0) {
      char what[600];
      snprintf(what, sizeof what, "tensor %s is listed twice", by[i]->name);
      return bad(ctx, m->dir, what);
    }
  return MP_OK;
}

static mp_status parse_tensors(mp_ctx *ctx, mp_ckpt_manifest *m) {
  const cJSON *ts = cJSON_GetObjectItem(m->root, "tensors"), *tj;
  if (!cJSON_IsArray(ts)) return bad(ctx, m->dir, "\"tensors\" is not a list");
  m->n_tensors = cJSON_GetArraySize(ts);
  m->tensors = mp_arena_alloc(m->arena, (size_t)(m->n_tensors + 1) * sizeof *m->tensors);
  MP_CHECK_ALLOC(ctx, m->tensors);
  int i = 0;
  cJSON_ArrayForEach(tj, ts) {
    mp_ckpt_tensor *t = &m->tensors[i++];
    t->name = cJSON_GetStringValue(cJSON_GetObjectItem(tj, "name"));
    const char *dtype = cJSON_GetStringValue(cJSON_GetObjectItem(tj, "dtype"));
    t->ndim = 0;
    int64_t numel;
    if (!t->name || !dtype || strcmp(dtype, "F32") != 0 || !get_dims(tj, "shape", 1, t->shape, &t->ndim) ||
        mp_prod_i64(t->shape, 3, &numel) || numel > CKPT_MAX_BYTES / 4)
      return bad(ctx, m->dir, "a tensor entry is malformed (name, dtype F32, a shape of 1 to 3 positive dims)");
    const cJSON *sh = cJSON_GetObjectItem(tj, "shards"), *sj;
    if (!cJSON_IsArray(sh)) return bad(ctx, m->dir, "a tensor entry has no list of shards");
    t->n_shards = cJSON_GetArraySize(sh);
    t->shards = mp_arena_alloc(m->arena, (size_t)(t->n_shards + 1) * sizeof *t->shards);
    MP_CHECK_ALLOC(ctx, t->shards);
    int k = 0;
    cJSON_ArrayForEach(sj, sh) MP_CHECK(parse_shard(ctx, m, t, sj, &t->shards[k++]));
  }
  return check_unique(ctx, m);
}

/* The seed as the writer prints it: decimal digits of a uint64. */
static int parse_seed(const char *s, uint64_t *out) {
  if (!s || !s[0] || strlen(s) > 20 || strspn(s, "0123456789") != strlen(s)) return 0;
  errno = 0;
  *out = strtoull(s, NULL, 10);
  return errno == 0;
}

mp_status mp_ckpt_manifest_parse(mp_ctx *ctx, const char *step_dir, const char *text, mp_ckpt_manifest *m) {
  memset(m, 0, sizeof *m);
  snprintf(m->dir, sizeof m->dir, "%s", step_dir);
  char p[MP_CKPT_PATH_MAX + 32];
  snprintf(p, sizeof p, "%s/manifest.json", step_dir);
  m->arena = mp_arena_create();
  MP_CHECK_ALLOC(ctx, m->arena);
  MP_CHECK(mp_json_parse(ctx, text, p, &m->root));
  const char *fmt = cJSON_GetStringValue(cJSON_GetObjectItem(m->root, "format"));
  const cJSON *ver = cJSON_GetObjectItem(m->root, "version");
  if (!fmt || strcmp(fmt, MP_CKPT_FORMAT) != 0 || !cJSON_IsNumber(ver))
    return mp_error(ctx, MP_ERR_INVALID, "%s: not a meshplan checkpoint manifest (format \"%s\")", p,
                    MP_CKPT_FORMAT);
  if (ver->valuedouble != MP_CKPT_VERSION)
    return mp_error(ctx, MP_ERR_INVALID, "%s: checkpoint version %g; this meshplan reads version %d", p,
                    ver->valuedouble, MP_CKPT_VERSION);
  const char *seed = cJSON_GetStringValue(cJSON_GetObjectItem(m->root, "seed"));
  if (!get_i64(m->root, "step", MP_LIM_STEPS, &m->meta.step) ||
      !get_i64(m->root, "data_consumed", CKPT_MAX_CONSUMED, &m->meta.data_consumed) ||
      !parse_seed(seed, &m->meta.seed) || !get_i64(m->root, "chunk_bytes", CKPT_MAX_CHUNK, &m->chunk_bytes) ||
      m->chunk_bytes < 4 || m->chunk_bytes % 4)
    return bad(ctx, step_dir, "step (0..2^24), data_consumed (0..2^48), seed (decimal) or chunk_bytes (a multiple "
               "of 4 in 4..2^30) is missing or malformed");
  m->meta.train = cJSON_GetObjectItem(m->root, "train");
  MP_CHECK(parse_files(ctx, m));
  return parse_tensors(ctx, m);
}

mp_status mp_ckpt_manifest_read(mp_ctx *ctx, const char *step_dir, mp_ckpt_manifest *m) {
  memset(m, 0, sizeof *m);
  char p[MP_CKPT_PATH_MAX + 32];
  snprintf(p, sizeof p, "%s/manifest.json", step_dir);
  char *text = NULL;
  MP_CHECK(mp_read_file_max(ctx, p, MP_CKPT_MANIFEST_MAX_BYTES, &text, NULL)); /* regular files only */
  mp_status st = mp_ckpt_manifest_parse(ctx, step_dir, text, m);
  free(text);
  return st;
}

void mp_ckpt_manifest_free(mp_ckpt_manifest *m) {
  if (!m) return;
  cJSON_Delete(m->root);
  mp_arena_destroy(m->arena);
  memset(m, 0, sizeof *m);
}

const mp_ckpt_tensor *mp_ckpt_find(const mp_ckpt_manifest *m, const char *name) {
  for (int i = 0; i < m->n_tensors; i++)
    if (strcmp(m->tensors[i].name, name) == 0) return &m->tensors[i];
  return NULL;
}

/* ---- reading boxes ------------------------------------------------------------------------ */

/* The open files and the last chunk read and verified. */
typedef struct box_reader {
  const mp_ckpt_manifest *m;
  int *fds;
  char *chunk;
  int c_file, c_shard_idx;
  int64_t c_byte_offset, c_k; /* which chunk the buffer holds (c_k < 0: none) */
} box_reader;

static mp_status chunk_load(mp_ctx *ctx, box_reader *br, const mp_ckpt_tensor *t, const mp_ckpt_shard *s,
                            int64_t k, int64_t shard_bytes) {
  if (br->c_k == k && br->c_file == s->file && br->c_byte_offset == s->byte_offset) return MP_OK;
  MP_ASSERT(k >= 0 && k < s->n_chunks, "chunk %lld of %lld: the shard's chunks cover its bytes (checked at parse)",
            (long long)k, (long long)s->n_chunks);
  const mp_ckpt_manifest *m = br->m;
  if (br->fds[s->file] < 0) {
    char p[MP_CKPT_PATH_MAX + 300];
    snprintf(p, sizeof p, "%s/%s", m->dir, m->files[s->file]);
    int64_t size = 0;
    MP_CHECK(mp_file_open_input(ctx, p, &br->fds[s->file], &size)); /* regular files only */
  }
  const int64_t o = k * m->chunk_bytes, n = shard_bytes - o < m->chunk_bytes ? shard_bytes - o : m->chunk_bytes;
  int64_t got = 0;
  while (got < n) {
    ssize_t r = pread(br->fds[s->file], br->chunk + got, (size_t)(n - got), (off_t)(s->byte_offset + o + got));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0)
      return mp_error(ctx, MP_ERR_INVALID, "%s/%s: tensor %s: cannot read bytes %lld..%lld (%s); the file is "
                      "truncated: resume from another step", m->dir, m->files[s->file], t->name,
                      (long long)(s->byte_offset + o), (long long)(s->byte_offset + o + n),
                      r < 0 ? strerror(errno) : "end of file");
    got += r;
  }
  if (mp_ckpt_hash64(br->chunk, (size_t)n) != s->chunks[k])
    return mp_error(ctx, MP_ERR_INVALID, "%s/%s: tensor %s: checksum mismatch in bytes %lld..%lld; the checkpoint "
                    "is corrupt: resume from another step", m->dir, m->files[s->file], t->name,
                    (long long)(s->byte_offset + o), (long long)(s->byte_offset + o + n));
  br->c_file = s->file;
  br->c_byte_offset = s->byte_offset;
  br->c_k = k;
  return MP_OK;
}

/* n floats from element e of shard s into dst, through the verified chunks. */
static mp_status copy_run(mp_ctx *ctx, box_reader *br, const mp_ckpt_tensor *t, const mp_ckpt_shard *s, int64_t e,
                          int64_t n, float *dst) {
  const int64_t shard_bytes = s->len[0] * s->len[1] * s->len[2] * 4, cb = br->m->chunk_bytes;
  int64_t b = e * 4, end = (e + n) * 4;
  MP_ASSERT(e >= 0 && n >= 0 && end <= shard_bytes, "a run lies inside its shard");
  char *out = (char *)dst;
  while (b < end) {
    const int64_t k = b / cb, in_chunk = b - k * cb, take = (k + 1) * cb < end ? (k + 1) * cb - b : end - b;
    MP_CHECK(chunk_load(ctx, br, t, s, k, shard_bytes));
    memcpy(out, br->chunk + in_chunk, (size_t)take);
    out += take;
    b += take;
  }
  return MP_OK;
}

/* The intersection of box off/len with shard s: lo/hi per dim; 0 when empty. */
static int box_meet(const int64_t off[3], const int64_t len[3], const mp_ckpt_shard *s, int64_t lo[3], int64_t hi[3]) {
  for (int d = 0; d < 3; d++) {
    lo[d] = off[d] > s->off[d] ? off[d] : s->off[d];
    hi[d] = off[d] + len[d] < s->off[d] + s->len[d] ? off[d] + len[d] : s->off[d] + s->len[d];
    if (lo[d] >= hi[d]) return 0;
  }
  return 1;
}

/* No two shards of t overlap inside the box: with the count of elements read equal to
 * the box's, every element is then read exactly once (an overlap could otherwise make up
 * for a hole). Only the shards that meet the box are compared, so a rank of a mesh like
 * the saving one compares a few. */
static mp_status check_disjoint(mp_ctx *ctx, const mp_ckpt_manifest *m, const mp_ckpt_tensor *t,
                                const int64_t off[3], const int64_t len[3]) {
  int *meet = malloc((size_t)(t->n_shards + 1) * sizeof *meet), n = 0;
  if (!meet) return mp_error(ctx, MP_ERR_NOMEM, "checkpoint: out of memory reading %s", t->name);
  int64_t lo[3], hi[3], lo2[3], hi2[3];
  for (int s = 0; s < t->n_shards; s++)
    if (box_meet(off, len, &t->shards[s], lo, hi)) meet[n++] = s;
  mp_status st = MP_OK;
  for (int i = 0; i < n && st == MP_OK; i++) {
    box_meet(off, len, &t->shards[meet[i]], lo, hi);
    for (int j = i + 1; j < n && st == MP_OK; j++) {
      int64_t l3[3];
      for (int d = 0; d < 3; d++) l3[d] = hi[d] - lo[d];
      if (box_meet(lo, l3, &t->shards[meet[j]], lo2, hi2))
        st = mp_error(ctx, MP_ERR_INVALID, "%s/manifest.json: tensor %s: shards %d and %d overlap; the checkpoint is "
                      "damaged", m->dir, t->name, meet[i], meet[j]);
    }
  }
  free(meet);
  return st;
}

/* The intersection of the box with shard s, copied run by run; *covered += its elements. */
static mp_status read_shard_part(mp_ctx *ctx, box_reader *br, const mp_ckpt_tensor *t, const mp_ckpt_shard *s,
                                 const int64_t off[3], const int64_t len[3], float *dst, int64_t *covered) {
  int64_t lo[3], hi[3];
  if (!box_meet(off, len, s, lo, hi)) return MP_OK;
  const int64_t run = hi[2] - lo[2];
  for (int64_t a = lo[0]; a < hi[0]; a++)
    for (int64_t b = lo[1]; b < hi[1]; b++) {
      const int64_t src = ((a - s->off[0]) * s->len[1] + (b - s->off[1])) * s->len[2] + (lo[2] - s->off[2]);
      const int64_t dsti = ((a - off[0]) * len[1] + (b - off[1])) * len[2] + (lo[2] - off[2]);
      MP_ASSERT(dsti >= 0 && dsti + run <= len[0] * len[1] * len[2], "a run lies inside the box");
      MP_CHECK(copy_run(ctx, br, t, s, src, run, dst + dsti));
      *covered += run;
    }
  return MP_OK;
}

mp_status mp_ckpt_read_box(mp_ctx *ctx, const mp_ckpt_manifest *m, const mp_ckpt_tensor *t, const int64_t off[3],
                           const int64_t len[3], float *dst) {
  int64_t o3[3] = {0, 0, 0}, l3[3] = {1, 1, 1}, want = 1;
  for (int d = 0; d < t->ndim; d++) {
    o3[d] = off[d];
    l3[d] = len[d];
    want *= len[d];
    /* the caller's box lies inside the tensor (ckpt.h): the runtime's tiles and export's
     * tensors are taken from shapes already checked against the manifest's */
    MP_ASSERT(off[d] >= 0 && len[d] >= 0 && off[d] + len[d] <= t->shape[d], "tensor %s, dim %d: %lld + %lld of %lld",
              t->name, d, (long long)off[d], (long long)len[d], (long long)t->shape[d]);
  }
  MP_CHECK(check_disjoint(ctx, m, t, o3, l3));
  int64_t buf = 4; /* a chunk, or the biggest shard when that is smaller */
  for (int s = 0; s < t->n_shards; s++) {
    const mp_ckpt_shard *sh = &t->shards[s];
    const int64_t b = sh->len[0] * sh->len[1] * sh->len[2] * 4; /* within the file: checked by the parse */
    buf = b > buf ? b : buf;
  }
  buf = buf < m->chunk_bytes ? buf : m->chunk_bytes;
  box_reader br = {m, calloc((size_t)(m->n_files + 1), sizeof(int)), malloc((size_t)buf), -1, -1, -1, -1};
  if (!br.fds || !br.chunk) {
    free(br.fds);
    free(br.chunk);
    return mp_error(ctx, MP_ERR_NOMEM, "checkpoint: out of memory reading %s", t->name);
  }
  for (int f = 0; f < m->n_files; f++) br.fds[f] = -1;
  int64_t covered = 0;
  mp_status st = MP_OK;
  for (int s = 0; s < t->n_shards && st == MP_OK; s++) st = read_shard_part(ctx, &br, t, &t->shards[s], o3, l3, dst, &covered);
  for (int f = 0; f < m->n_files; f++)
    if (br.fds[f] >= 0) close(br.fds[f]);
  free(br.fds);
  free(br.chunk);
  MP_CHECK(st);
  /* check_disjoint let no two shards overlap inside the box, so no element was counted
   * twice: a shortfall is a hole, never hidden by an overlap */
  MP_ASSERT(covered <= want, "tensor %s: %lld elements covered of %lld", t->name, (long long)covered, (long long)want);
  if (covered != want)
    return mp_error(ctx, MP_ERR_INVALID, "%s/manifest.json: tensor %s: the shards hold %lld of the %lld elements "
                    "needed (missing shards); the checkpoint is damaged", m->dir, t->name,
                    (long long)covered, (long long)want);
  return MP_OK;
}

/* ---- the load ------------------------------------------------------------------------------ */

mp_status mp_ckpt_model(mp_ctx *ctx, const mp_ckpt_manifest *man, mp_model *out) {
  char origin[MP_CKPT_PATH_MAX + 48];
  snprintf(origin, sizeof origin, "%s/manifest.json: model", man->dir);
  char *text = cJSON_PrintUnformatted(cJSON_GetObjectItem(man->root, "model"));
  if (!text) return mp_error(ctx, MP_ERR_INVALID, "%s is missing", origin);
  mp_status st = mp_model_from_text(ctx, text, origin, out);
  free(text);
  return st;
}

/* The manifest's model against the plan's: names and shapes are checked per tensor; the
 * dims that change the forward without changing a shape are checked here. */
static mp_status check_model(mp_ctx *ctx, const mp_ckpt_manifest *m, const mp_model *model) {
  mp_model saved;
  MP_CHECK(mp_ckpt_model(ctx, m, &saved));
  static const mp_model_field forward[] = {MP_MODEL_FIELD_rope_theta, MP_MODEL_FIELD_norm_eps,
                                           MP_MODEL_FIELD_n_heads,    MP_MODEL_FIELD_n_kv_heads,
                                           MP_MODEL_FIELD_top_k,      MP_MODEL_FIELD_norm_topk_prob,
                                           MP_MODEL_FIELD_tied_embeddings};
  const int i = mp_model_first_difference(&saved, model, forward, (int)(sizeof forward / sizeof forward[0]));
  if (i < 0) return MP_OK;
  const mp_model_field f = forward[i];
  return mp_error(ctx, MP_ERR_INVALID, "%s/manifest.json: the checkpoint's model %s has %s = %g, model %s has %g; "
                  "resume with the model it was saved with", m->dir, saved.name, mp_model_field_key(f),
                  mp_model_field_value(&saved, f), model->name, mp_model_field_value(model, f));
}

/* Every tensor of the manifest is one the plan has (no tensor left behind unloaded). */
static mp_status check_names(mp_ctx *ctx, const mp_ckpt_manifest *m, const mp_plan *plan) {
  char name[512];
  for (int t = 0; t < m->n_tensors; t++) {
    int found = 0;
    for (int i = 0; i < plan->n_params && !found; i++)
      for (int k = 0; k < MP_STATE_COUNT && !found; k++) {
        ckpt_tensor_name(name, sizeof name, plan->params[i].fqn, (mp_state_kind)k);
        found = strcmp(name, m->tensors[t].name) == 0;
      }
    if (!found)
      return mp_error(ctx, MP_ERR_INVALID, "%s/manifest.json: tensor %s is not a parameter of model %s; the "
                      "checkpoint is another model's", m->dir, m->tensors[t].name, plan->model.name);
  }
  return MP_OK;
}

/* State k of parameter p in the checkpoint, with p's shape (model names the model p is
 * of, hint what to do when the shape differs). */
static mp_status find_state(mp_ctx *ctx, const mp_ckpt_manifest *m, const mp_param *p, int k, const char *model,
                            const char *hint, const mp_ckpt_tensor **out) {
  char name[512];
  ckpt_tensor_name(name, sizeof name, p->fqn, (mp_state_kind)k);
  const mp_ckpt_tensor *t = mp_ckpt_find(m, name);
  if (!t)
    return mp_error(ctx, MP_ERR_INVALID, "%s/manifest.json: tensor %s is missing; the checkpoint is another "
                    "model's or incomplete", m->dir, name);
  int same = t->ndim == p->ndim;
  for (int d = 0; d < p->ndim && same; d++) same = t->shape[d] == p->shape[d];
  if (!same)
    return mp_error(ctx, MP_ERR_INVALID, "%s/manifest.json: tensor %s has shape [%lld, %lld, %lld] (%d dims) "
                    "in the checkpoint but [%lld, %lld, %lld] (%d dims) in model %s; %s", m->dir, name,
                    (long long)t->shape[0], (long long)t->shape[1], (long long)t->shape[2], t->ndim,
                    (long long)p->shape[0], (long long)(p->ndim > 1 ? p->shape[1] : 1),
                    (long long)(p->ndim > 2 ? p->shape[2] : 1), p->ndim, model, hint);
  *out = t;
  return MP_OK;
}

mp_status mp_ckpt_check_plan(mp_ctx *ctx, const mp_ckpt_manifest *m, const mp_plan *plan, const char *hint) {
  MP_CHECK(check_names(ctx, m, plan));
  for (int i = 0; i < plan->n_params; i++) {
    if (plan->params[i].tied_copy) continue; /* the embedding, saved once */
    const mp_ckpt_tensor *t;
    for (int k = 0; k < MP_STATE_COUNT; k++)
      MP_CHECK(find_state(ctx, m, &plan->params[i], k, plan->model.name, hint, &t));
  }
  return MP_OK;
}

/* Parameter i's tile of every state, from the checkpoint into the runtime. */
static mp_status load_param(mp_ctx *ctx, mp_runtime *rt, const mp_ckpt_manifest *m, int i, float *buf) {
  const mp_param *p = mp_plan_param_source(mp_runtime_plan(rt), i); /* a tied head copy: the embedding's */
  int64_t off[MP_MAX_NDIM], len[MP_MAX_NDIM];
  if (mp_runtime_param_tile(rt, i, off, len) == 0) return MP_OK;
  for (int k = 0; k < MP_STATE_COUNT; k++) {
    const mp_ckpt_tensor *t;
    MP_CHECK(find_state(ctx, m, p, k, mp_runtime_plan(rt)->model.name,
                        "resume with the model (and vocabulary) it was saved with", &t));
    MP_CHECK(mp_ckpt_read_box(ctx, m, t, off, len, buf));
    MP_CHECK(mp_runtime_write_state(ctx, rt, i, (mp_state_kind)k, buf));
  }
  return MP_OK;
}

mp_status mp_ckpt_each_tile(mp_ctx *ctx, mp_runtime *rt, mp_ckpt_tile_fn fn, void *arg) {
  const mp_plan *plan = mp_runtime_plan(rt);
  mp_status st = MP_OK;
  float *buf = NULL;
  for (int i = 0; i < plan->n_params && st == MP_OK; i++) {
    int64_t off[MP_MAX_NDIM], len[MP_MAX_NDIM];
    const int64_t n = mp_runtime_param_tile(rt, i, off, len);
    float *nb = realloc(buf, (size_t)(n ? n : 1) * sizeof(float));
    if (!nb) {
      st = mp_error(ctx, MP_ERR_NOMEM, "out of memory for the tile of %s", plan->params[i].fqn);
      break;
    }
    buf = nb;
    st = fn(ctx, rt, i, buf, arg);
  }
  free(buf);
  return st;
}

static mp_status load_tile(mp_ctx *ctx, mp_runtime *rt, int i, float *buf, void *arg) {
  return load_param(ctx, rt, (const mp_ckpt_manifest *)arg, i, buf);
}

static mp_status load_local(mp_ctx *ctx, mp_runtime *rt, const mp_ckpt_manifest *m) {
  const mp_plan *plan = mp_runtime_plan(rt);
  MP_CHECK(check_model(ctx, m, &plan->model));
  MP_CHECK(check_names(ctx, m, plan));
  return mp_ckpt_each_tile(ctx, rt, load_tile, (void *)m);
}

mp_status mp_ckpt_load_parsed(mp_ctx *ctx, mp_runtime *rt, const mp_ckpt_manifest *man, mp_ckpt_meta *meta) {
  MP_CHECK(load_local(ctx, rt, man));
  mp_runtime_set_steps_done(rt, man->meta.step);
  *meta = man->meta;
  return MP_OK;
}

mp_status mp_ckpt_load(mp_ctx *ctx, mp_runtime *rt, const char *step_dir, mp_ckpt_manifest *man,
                       mp_ckpt_meta *meta) {
  mp_status st = mp_ckpt_manifest_read(ctx, step_dir, man);
  if (st == MP_OK) st = mp_ckpt_load_parsed(ctx, rt, man, meta);
  return mp_runtime_agree(ctx, rt, st, "loading the checkpoint");
}
