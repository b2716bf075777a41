/* libFuzzer harness: the checkpoint manifest reader and the shard reads of a load
 * (`meshplan train --resume`, `meshplan export --checkpoint`).
 *
 * Input: manifest.json's text up to the first NUL, parsed by mp_ckpt_manifest_parse (the
 * parsing of mp_ckpt_manifest_read) in a temporary step folder; after the NUL, up to four
 * shard files, each a little-endian uint32 length and that many bytes (cut at the input's
 * end), written there as in_0.bin .. in_3.bin. When MESHPLAN_FUZZ_CKPT names a real
 * checkpoint's step folder (scripts/fuzz writes one with `meshplan train` on tiny-dense,
 * too big for an input), its rank_*.bin files are linked into the folder as well, so that
 * its manifest, mutated, reads real shards.
 *
 * On an accepted manifest, what a load does with it:
 *   - the invariants the reader promises: every shard's box inside its tensor, its bytes
 *     inside its file, one checksum per chunk;
 *   - every tensor read whole through mp_ckpt_read_box, each element compared bit for bit
 *     with the element found independently: the last shard whose box holds it, the byte at
 *     byte_offset + 4 x its row-major index in the shard, asserted inside the file; a read
 *     that succeeds must have found every element in some shard;
 *   - the load of every rank of a mesh (tp, FSDP) of the checkpoint's model through
 *     mp_ckpt_load_parsed (tests/fuzz/fuzz_runtime.h), each tile written compared the
 *     same way.
 * Every refusal must be one line. */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "exec/runtime/ckpt.h"
#include "exec/runtime/ckpt_internal.h"
#include "tests/fuzz/fuzz_runtime.h"
#include "tests/fuzz/fuzz_util.h"

#define MAX_IN 4
#define MAX_FIXTURE 16

/* The models a load is tried with: fuzz-micro (the model of the seed corpus) and, with
 * the fixture, tiny-dense (data/models/tiny-dense.json's dims). */
static const char *const k_micro =
    "{\"name\": \"fuzz-micro\", \"family\": \"llama\", \"vocab\": 32, \"d_model\": 8, \"n_layers\": 1, "
    "\"n_heads\": 2, \"n_kv_heads\": 2, \"head_dim\": 4, \"d_ff\": 16, \"max_seq\": 8, \"norm_eps\": 1e-5, "
    "\"rope_theta\": 10000.0}";
static const char *const k_tiny =
    "{\"name\": \"tiny-dense\", \"family\": \"llama\", \"vocab\": 256, \"d_model\": 64, \"n_layers\": 2, "
    "\"n_heads\": 8, \"n_kv_heads\": 4, \"head_dim\": 8, \"d_ff\": 192, \"max_seq\": 64, \"norm_eps\": 1e-5, "
    "\"rope_theta\": 10000.0}";
static const struct {
  const char *spec;
  int world;
} k_meshes[] = {{"tp=1", 1}, {"tp=2", 2}, {"dp_shard=2", 2}};
#define N_MESHES 3
static mp_plan *g_micro[N_MESHES], *g_tiny[N_MESHES];

static char g_dir[256];
/* The files a manifest may name: the input's and the fixture's. */
typedef struct known_file {
  char name[64];
  const uint8_t *b;
  size_t len;
} known_file;
static known_file g_files[MAX_IN + MAX_FIXTURE];
static int g_n_fixture;

static void write_file(const char *path, const void *b, size_t n) {
  FILE *f = fopen(path, "wb");
  if (!f || (n && fwrite(b, 1, n, f) != n) || fclose(f) != 0) abort();
}

static void link_fixture(const char *src) {
  DIR *d = opendir(src);
  if (!d) {
    fprintf(stderr, "fuzz_ckpt_manifest: MESHPLAN_FUZZ_CKPT=%s cannot be listed\n", src);
    abort();
  }
  struct dirent *e;
  while ((e = readdir(d)) != NULL && g_n_fixture < MAX_FIXTURE) {
    if (strncmp(e->d_name, "rank_", 5) != 0 || !strstr(e->d_name, ".bin")) continue;
    char from[600], to[600];
    snprintf(from, sizeof from, "%s/%s", src, e->d_name);
    snprintf(to, sizeof to, "%s/%s", g_dir, e->d_name);
    const int fd = open(from, O_RDONLY);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) != 0 || sb.st_size == 0 || symlink(from, to) != 0) abort();
    known_file *k = &g_files[MAX_IN + g_n_fixture++];
    snprintf(k->name, sizeof k->name, "%s", e->d_name);
    k->len = (size_t)sb.st_size;
    k->b = mmap(NULL, k->len, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (k->b == MAP_FAILED) abort();
  }
  closedir(d);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc, (void)argv;
  for (int k = 0; k < N_MESHES; k++) {
    mp_ctx ctx;
    mp_ctx_init(&ctx);
    FUZZ_ASSERT(fuzz_runtime_plan(&ctx, k_micro, k_meshes[k].spec, k_meshes[k].world, &g_micro[k]) == MP_OK);
    FUZZ_ASSERT(fuzz_runtime_plan(&ctx, k_tiny, k_meshes[k].spec, k_meshes[k].world, &g_tiny[k]) == MP_OK);
  }
  const char *tmp = getenv("TMPDIR");
  snprintf(g_dir, sizeof g_dir, "%s/fuzz_ckpt.XXXXXX", tmp ? tmp : "/tmp");
  if (!mkdtemp(g_dir)) abort();
  const char *fx = getenv("MESHPLAN_FUZZ_CKPT");
  if (fx && *fx) link_fixture(fx);
  return 0;
}

static const known_file *file_of(const mp_ckpt_manifest *m, int f) {
  for (int i = 0; i < MAX_IN + g_n_fixture; i++)
    if (g_files[i].name[0] && strcmp(g_files[i].name, m->files[f]) == 0) return &g_files[i];
  return NULL;
}

/* ---- the independent reading ------------------------------------------------------------ */

/* Element (a, b, c) of tensor t: the last shard holding it, its 4 bytes asserted inside
 * the file. 0 when no shard holds it. */
static int ref_element(const mp_ckpt_manifest *m, const mp_ckpt_tensor *t, const int64_t g[3], uint32_t *bits) {
  for (int s = t->n_shards - 1; s >= 0; s--) {
    const mp_ckpt_shard *sh = &t->shards[s];
    int in = 1;
    for (int d = 0; d < 3; d++) in = in && g[d] >= sh->off[d] && g[d] < sh->off[d] + sh->len[d];
    if (!in) continue;
    const int64_t idx = ((g[0] - sh->off[0]) * sh->len[1] + (g[1] - sh->off[1])) * sh->len[2] + (g[2] - sh->off[2]);
    const int64_t at = sh->byte_offset + 4 * idx;
    const known_file *k = file_of(m, sh->file);
    FUZZ_ASSERT(k != NULL); /* a read that succeeded read a file the harness wrote */
    FUZZ_ASSERT(at >= 0 && (uint64_t)at + 4 <= k->len && at + 4 <= m->file_bytes[sh->file]);
    memcpy(bits, k->b + at, 4);
    return 1;
  }
  return 0;
}

/* The box off/len of t as read, element by element against ref_element. */
static void check_box(const mp_ckpt_manifest *m, const mp_ckpt_tensor *t, const int64_t off[3],
                      const int64_t len[3], const float *got) {
  int64_t i = 0;
  for (int64_t a = 0; a < len[0]; a++)
    for (int64_t b = 0; b < len[1]; b++)
      for (int64_t c = 0; c < len[2]; c++, i++) {
        const int64_t g[3] = {off[0] + a, off[1] + b, off[2] + c};
        uint32_t want, have;
        FUZZ_ASSERT(ref_element(m, t, g, &want)); /* no hole in what was read */
        memcpy(&have, &got[i], 4);
        FUZZ_ASSERT(have == want);
      }
}

static void check_invariants(const mp_ckpt_manifest *m) {
  for (int i = 0; i < m->n_tensors; i++) {
    const mp_ckpt_tensor *t = &m->tensors[i];
    FUZZ_ASSERT(t->ndim >= 1 && t->ndim <= 3);
    for (int s = 0; s < t->n_shards; s++) {
      const mp_ckpt_shard *sh = &t->shards[s];
      int64_t numel = 1;
      for (int d = 0; d < 3; d++) {
        FUZZ_ASSERT(sh->off[d] >= 0 && sh->len[d] >= 1 && sh->off[d] + sh->len[d] <= t->shape[d]);
        numel *= sh->len[d];
      }
      FUZZ_ASSERT(sh->file >= 0 && sh->file < m->n_files && sh->byte_offset >= 0);
      FUZZ_ASSERT(sh->byte_offset + 4 * numel <= m->file_bytes[sh->file]);
      FUZZ_ASSERT(sh->n_chunks == (4 * numel + m->chunk_bytes - 1) / m->chunk_bytes);
    }
  }
}

static void check_whole_tensors(const mp_ckpt_manifest *m) {
  for (int i = 0; i < m->n_tensors; i++) {
    const mp_ckpt_tensor *t = &m->tensors[i];
    const int64_t off[3] = {0, 0, 0}, len[3] = {t->shape[0], t->shape[1], t->shape[2]};
    const int64_t n = len[0] * len[1] * len[2];
    if (n > (1 << 22)) continue; /* the shards bound it only when they cover it */
    float *buf = malloc((size_t)n * sizeof *buf);
    if (!buf) abort();
    memset(buf, 0xff, (size_t)n * sizeof *buf); /* NaN: an element left unwritten shows */
    mp_ctx ctx;
    mp_ctx_init(&ctx);
    const mp_status st = mp_ckpt_read_box(&ctx, m, t, off, len, buf);
    fuzz_check_refusal(&ctx, st);
    if (st == MP_OK) check_box(m, t, off, len, buf);
    free(buf);
  }
}

/* ---- the load on every rank ---------------------------------------------------------------- */

/* The tile of parameter i's state k written by the load, against the checkpoint (arg). */
static void on_write(const mp_runtime *rt, int i, mp_state_kind k, const int64_t *off, const int64_t *len,
                     const float *src, void *arg) {
  const mp_ckpt_manifest *m = arg;
  const mp_param *p = &rt->plan->params[i];
  char name[512];
  ckpt_tensor_name(name, sizeof name, p->fqn, k);
  const mp_ckpt_tensor *t = mp_ckpt_find(m, name);
  FUZZ_ASSERT(t != NULL && t->ndim == p->ndim);
  int64_t o3[3] = {0, 0, 0}, l3[3] = {1, 1, 1};
  for (int d = 0; d < p->ndim; d++) {
    o3[d] = off[d];
    l3[d] = len[d];
  }
  check_box(m, t, o3, l3, src);
}

static void check_load(const mp_ckpt_manifest *m, unsigned pick) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_model saved;
  if (mp_ckpt_model(&ctx, m, &saved) != MP_OK) return;
  mp_plan *const *plans = strcmp(saved.name, "tiny-dense") == 0 ? g_tiny : g_micro;
  const int k = (int)(pick % N_MESHES); /* one mesh per input: tiny-dense's loads are MBs */
  for (int rank = 0; rank < k_meshes[k].world; rank++) {
    mp_runtime rt = {plans[k], rank, -1, on_write, (void *)m};
    mp_ckpt_meta meta;
    mp_ctx_init(&ctx);
    const mp_status st = mp_ckpt_load_parsed(&ctx, &rt, m, &meta);
    fuzz_check_refusal(&ctx, st);
    if (st != MP_OK) break;
    FUZZ_ASSERT(rt.steps == m->meta.step && meta.data_consumed == m->meta.data_consumed);
  }
}

/* ---- the input ------------------------------------------------------------------------------ */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const uint8_t *nul = memchr(data, 0, size);
  char *text = fuzz_text(data, nul ? (size_t)(nul - data) : size);
  const uint8_t *p = nul ? nul + 1 : data + size, *end = data + size;
  char path[400];
  for (int i = 0; i < MAX_IN; i++) {
    known_file *k = &g_files[i];
    snprintf(path, sizeof path, "%s/in_%d.bin", g_dir, i);
    if (end - p >= 4) {
      uint32_t l;
      memcpy(&l, p, 4);
      p += 4;
      k->len = l < (size_t)(end - p) ? l : (size_t)(end - p);
      k->b = p;
      p += k->len;
      snprintf(k->name, sizeof k->name, "in_%d.bin", i);
      write_file(path, k->b, k->len);
    } else {
      k->name[0] = '\0';
      unlink(path);
    }
  }
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_ckpt_manifest m;
  const mp_status st = mp_ckpt_manifest_parse(&ctx, g_dir, text, &m);
  fuzz_check_refusal(&ctx, st);
  if (st == MP_OK) {
    check_invariants(&m);
    check_whole_tensors(&m);
    check_load(&m, (unsigned)size);
  }
  mp_ckpt_manifest_free(&m);
  free(text);
  return 0;
}
