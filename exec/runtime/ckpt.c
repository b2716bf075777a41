/* Distributed checkpoints: hashing, durable files and folders, the atomic save (ckpt.h
 * states the format and the protocol).
 *
 * Durability: every file of a checkpoint is written to its final name inside the
 * temporary folder and fsynced before the barrier; the manifest goes to a temporary name,
 * is fsynced and renamed; the folder is renamed and its parent fsynced. So a kill -9 (or
 * a power loss after the rename returns) never leaves a step_N without its manifest or a
 * manifest without its shards. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/assert.h"
#include "common/file.h"
#include "common/json.h"
#include "exec/runtime/ckpt_internal.h"

static mp_ckpt_hook_fn g_hook;
static void *g_hook_arg;

void mp_ckpt_set_hook(mp_ckpt_hook_fn fn, void *arg) {
  g_hook = fn;
  g_hook_arg = arg;
}

static void hook(const char *point, int rank, int64_t step) {
  if (g_hook) g_hook(point, rank, step, g_hook_arg);
}

/* ---- files and folders ----------------------------------------------------------------- */

static mp_status write_all(mp_ctx *ctx, int fd, const void *p, size_t n, const char *path) {
  const char *b = p;
  while (n > 0) {
    ssize_t w = write(fd, b, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return mp_error_write(ctx, w < 0 ? errno : ENOSPC, path); /* 0 bytes: no room */
    b += w;
    n -= (size_t)w;
  }
  return MP_OK;
}

static mp_status fsync_path(mp_ctx *ctx, const char *path) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return mp_error(ctx, MP_ERR_IO, "%s: cannot open to sync: %s", path, strerror(errno));
  int rc = fsync(fd);
  close(fd);
  return rc == 0 ? MP_OK : mp_error(ctx, MP_ERR_IO, "%s: fsync failed: %s", path, strerror(errno));
}

/* path written whole through path.tmp, fsynced, then renamed over path. */
static mp_status write_durable(mp_ctx *ctx, const char *path, const void *data, size_t n) {
  char tmp[MP_CKPT_PATH_MAX + 8];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return mp_error(ctx, MP_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
  mp_status st = write_all(ctx, fd, data, n, tmp);
  if (st == MP_OK && fsync(fd) != 0) st = mp_error(ctx, MP_ERR_IO, "%s: fsync failed: %s", tmp, strerror(errno));
  close(fd);
  if (st == MP_OK && rename(tmp, path) != 0)
    st = mp_error(ctx, MP_ERR_IO, "%s: rename failed: %s", path, strerror(errno));
  if (st != MP_OK) unlink(tmp);
  return st;
}

/* mkdir -p */
static mp_status make_dirs(mp_ctx *ctx, const char *dir) {
  char p[MP_CKPT_PATH_MAX];
  if (snprintf(p, sizeof p, "%s", dir) >= (int)sizeof p)
    return mp_error(ctx, MP_ERR_INVALID, "checkpoint folder name too long: %s", dir);
  for (char *s = p + 1;; s++) {
    const int end = *s == 0;
    if (*s == '/' || end) {
      *s = 0;
      if (mkdir(p, 0777) != 0 && errno != EEXIST)
        return mp_error(ctx, MP_ERR_IO, "cannot create checkpoint folder %s: %s", p, strerror(errno));
      if (end) break;
      *s = '/';
    }
  }
  struct stat sb;
  if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
    return mp_error(ctx, MP_ERR_IO, "checkpoint folder %s is not a folder; choose another --checkpoint-dir", dir);
  return MP_OK;
}

/* Removes a checkpoint folder (its files, then itself): checkpoint folders hold files only. */
static mp_status remove_step_dir(mp_ctx *ctx, const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return errno == ENOENT ? MP_OK : mp_error(ctx, MP_ERR_IO, "%s: cannot list: %s", dir, strerror(errno));
  struct dirent *e;
  char p[MP_CKPT_PATH_MAX + 300];
  mp_status st = MP_OK;
  while ((e = readdir(d)) != NULL) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
    snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
    if (unlink(p) != 0 && st == MP_OK) st = mp_error(ctx, MP_ERR_IO, "%s: cannot remove: %s", p, strerror(errno));
  }
  closedir(d);
  if (st == MP_OK && rmdir(dir) != 0) st = mp_error(ctx, MP_ERR_IO, "%s: cannot remove: %s", dir, strerror(errno));
  return st;
}

/* The step of a folder name "step_NNNNNNNN" (exactly), or -1. */
static int64_t step_of(const char *name) {
  if (strncmp(name, "step_", 5) != 0 || strlen(name) != 13) return -1;
  int64_t v = 0;
  for (const char *c = name + 5; *c; c++) {
    if (*c < '0' || *c > '9') return -1;
    v = v * 10 + (*c - '0');
  }
  return v;
}

static int has_manifest(const char *dir) {
  char p[MP_CKPT_PATH_MAX + 32];
  snprintf(p, sizeof p, "%s/manifest.json", dir);
  return access(p, R_OK) == 0;
}

/* The complete steps under dir, ascending (malloc'd; *n of them). */
static mp_status list_steps(mp_ctx *ctx, const char *dir, int64_t **steps, int *n) {
  *steps = NULL;
  *n = 0;
  DIR *d = opendir(dir);
  if (!d) return mp_error(ctx, errno == ENOENT ? MP_ERR_NOT_FOUND : MP_ERR_IO, "%s: cannot list: %s", dir,
                          strerror(errno));
  int cap = 0;
  struct dirent *e;
  char p[MP_CKPT_PATH_MAX + 300];
  mp_status st = MP_OK;
  while ((e = readdir(d)) != NULL && st == MP_OK) {
    const int64_t s = step_of(e->d_name);
    snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
    if (s < 0 || !has_manifest(p)) continue;
    if (*n == cap) {
      cap = cap ? 2 * cap : 16;
      int64_t *ns = realloc(*steps, (size_t)cap * sizeof *ns);
      if (!ns) {
        st = mp_error(ctx, MP_ERR_NOMEM, "out of memory listing %s", dir);
        break;
      }
      *steps = ns;
    }
    int i = (*n)++;
    while (i > 0 && (*steps)[i - 1] > s) { /* insertion: a few folders */
      (*steps)[i] = (*steps)[i - 1];
      i--;
    }
    (*steps)[i] = s;
  }
  closedir(d);
  return st;
}

mp_status mp_ckpt_list(mp_ctx *ctx, const char *dir, int64_t **steps, int *n) {
  return list_steps(ctx, dir, steps, n);
}

mp_status mp_ckpt_resolve(mp_ctx *ctx, const char *path, char *out, size_t cap) {
  if (has_manifest(path)) {
    snprintf(out, cap, "%s", path);
    return MP_OK;
  }
  int64_t *steps;
  int n;
  mp_status st = list_steps(ctx, path, &steps, &n);
  if (st == MP_ERR_NOT_FOUND)
    return mp_error(ctx, MP_ERR_NOT_FOUND, "checkpoint %s does not exist; give --checkpoint-dir or a step folder",
                    path);
  MP_CHECK(st);
  if (n == 0) {
    free(steps);
    return mp_error(ctx, MP_ERR_NOT_FOUND, "%s holds no complete checkpoint (no step_N folder with a manifest.json)",
                    path);
  }
  snprintf(out, cap, "%s/step_%08lld", path, (long long)steps[n - 1]);
  free(steps);
  return MP_OK;
}

/* Removes all but the newest keep steps, and folders a killed save or rename left. */
static mp_status prune(mp_ctx *ctx, const char *dir, int keep) {
  DIR *d = opendir(dir);
  if (!d) return mp_error(ctx, MP_ERR_IO, "%s: cannot list: %s", dir, strerror(errno));
  struct dirent *e;
  char p[MP_CKPT_PATH_MAX + 300];
  mp_status st = MP_OK;
  while ((e = readdir(d)) != NULL && st == MP_OK)
    if (strncmp(e->d_name, ".old_step_", 10) == 0) {
      snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
      st = remove_step_dir(ctx, p);
    }
  closedir(d);
  MP_CHECK(st);
  if (keep <= 0) return MP_OK;
  int64_t *steps;
  int n;
  MP_CHECK(list_steps(ctx, dir, &steps, &n));
  for (int i = 0; i < n - keep && st == MP_OK; i++) {
    snprintf(p, sizeof p, "%s/step_%08lld", dir, (long long)steps[i]);
    st = remove_step_dir(ctx, p);
  }
  free(steps);
  return st;
}

/* ---- the save ------------------------------------------------------------------------------ */

static cJSON *i64_array(const int64_t *v, int n) {
  cJSON *a = cJSON_CreateArray();
  for (int i = 0; a && i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber((double)v[i]));
  return a;
}

/* A save's state on one rank: its folder names and the index it builds. */
typedef struct save_job {
  mp_runtime *rt;
  int rank, world;
  int64_t step;
  char dir[MP_CKPT_PATH_MAX], tmp[MP_CKPT_PATH_MAX], final[MP_CKPT_PATH_MAX];
} save_job;

/* One shard's entry in the rank's index: its box, offset and chunk checksums. */
static mp_status add_entry(mp_ctx *ctx, cJSON *entries, const char *name, const int64_t *off, const int64_t *len,
                           int ndim, int64_t byte_offset, const float *data, int64_t numel) {
  cJSON *e = cJSON_CreateObject(), *ch = NULL;
  if (e) {
    cJSON_AddItemToArray(entries, e);
    cJSON_AddStringToObject(e, "tensor", name);
    cJSON_AddItemToObject(e, "offset", i64_array(off, ndim));
    cJSON_AddItemToObject(e, "len", i64_array(len, ndim));
    cJSON_AddNumberToObject(e, "byte_offset", (double)byte_offset);
    ch = cJSON_AddArrayToObject(e, "xxh64");
  }
  if (!e || !ch) return mp_error(ctx, MP_ERR_NOMEM, "checkpoint: out of memory for the index");
  const size_t bytes = (size_t)numel * sizeof(float);
  for (size_t o = 0; o < bytes || (o == 0 && bytes == 0); o += MP_CKPT_CHUNK_BYTES) {
    const size_t n = bytes - o < MP_CKPT_CHUNK_BYTES ? bytes - o : MP_CKPT_CHUNK_BYTES;
    char hex[20];
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)mp_ckpt_hash64((const char *)data + o, n));
    cJSON_AddItemToArray(ch, cJSON_CreateString(hex));
    if (bytes == 0) break;
  }
  return MP_OK;
}

/* The rank's tiles into rank_R.bin and their index into rank_R.json (both fsynced). */
static mp_status write_rank_files(mp_ctx *ctx, save_job *sj) {
  const mp_plan *plan = mp_runtime_plan(sj->rt);
  char path[MP_CKPT_PATH_MAX + 32], name[512];
  snprintf(path, sizeof path, "%s/rank_%05d.bin", sj->tmp, sj->rank);
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return mp_error(ctx, MP_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
  cJSON *idx = cJSON_CreateObject(), *entries = cJSON_AddArrayToObject(idx, "entries");
  mp_status st = entries ? MP_OK : mp_error(ctx, MP_ERR_NOMEM, "checkpoint: out of memory");
  int64_t pos = 0, owned = 0, done = 0;
  for (int i = 0; i < plan->n_params; i++) owned += mp_runtime_param_owner(sj->rt, i);
  float *buf = NULL;
  for (int i = 0; i < plan->n_params && st == MP_OK; i++) {
    if (!mp_runtime_param_owner(sj->rt, i)) continue;
    const mp_param *p = &plan->params[i];
    int64_t off[MP_MAX_NDIM], len[MP_MAX_NDIM];
    const int64_t numel = mp_runtime_param_tile(sj->rt, i, off, len);
    for (int d = 0; d < p->ndim; d++)
      MP_ASSERT(off[d] >= 0 && len[d] >= 0 && off[d] + len[d] <= p->shape[d],
                "%s, dim %d: a shard is a box inside its tensor (the load reads it so)", p->fqn, d);
    float *nb = realloc(buf, (size_t)numel * sizeof(float));
    if (!nb) {
      st = mp_error(ctx, MP_ERR_NOMEM, "checkpoint: out of memory for %s", p->fqn);
      break;
    }
    buf = nb;
    for (int k = 0; k < MP_STATE_COUNT && st == MP_OK; k++) {
      st = mp_runtime_read_state(ctx, sj->rt, i, (mp_state_kind)k, buf);
      ckpt_tensor_name(name, sizeof name, p->fqn, (mp_state_kind)k);
      if (st == MP_OK) st = write_all(ctx, fd, buf, (size_t)numel * sizeof(float), path);
      MP_ASSERT(st != MP_OK || lseek(fd, 0, SEEK_CUR) == (off_t)(pos + numel * (int64_t)sizeof(float)),
                "%s: the index's byte_offset is where the shard's bytes went (shards follow each other)", name);
      if (st == MP_OK) st = add_entry(ctx, entries, name, off, len, p->ndim, pos, buf, numel);
      pos += numel * (int64_t)sizeof(float);
    }
    if (++done == (owned + 1) / 2) hook("shard_half", sj->rank, sj->step);
  }
  free(buf);
  if (st == MP_OK && fsync(fd) != 0) st = mp_error(ctx, MP_ERR_IO, "%s: fsync failed: %s", path, strerror(errno));
  close(fd);
  cJSON_AddNumberToObject(idx, "bytes", (double)pos);
  char *text = st == MP_OK ? cJSON_PrintUnformatted(idx) : NULL;
  cJSON_Delete(idx);
  if (st == MP_OK && !text) st = mp_error(ctx, MP_ERR_NOMEM, "checkpoint: out of memory for the index");
  snprintf(path, sizeof path, "%s/rank_%05d.json", sj->tmp, sj->rank);
  if (st == MP_OK) st = write_durable(ctx, path, text, strlen(text));
  free(text);
  return st;
}

/* Rank 0: every rank's index merged into the manifest's tensors (plan order, then state). */
static mp_status merge_indexes(mp_ctx *ctx, save_job *sj, cJSON *man) {
  const mp_plan *plan = mp_runtime_plan(sj->rt);
  cJSON *files = cJSON_AddArrayToObject(man, "files"), *tensors = cJSON_AddArrayToObject(man, "tensors");
  if (!files || !tensors) return mp_error(ctx, MP_ERR_NOMEM, "checkpoint: out of memory for the manifest");
  char name[512], path[MP_CKPT_PATH_MAX + 32];
  /* the tensors, with empty shard lists, in a fixed order */
  for (int i = 0; i < plan->n_params; i++)
    for (int k = 0; k < MP_STATE_COUNT; k++) {
      const mp_param *p = &plan->params[i];
      if (p->tied_copy) continue; /* a tied head copy is the embedding, saved once (never owned) */
      cJSON *t = cJSON_CreateObject();
      if (!t) return mp_error(ctx, MP_ERR_NOMEM, "checkpoint: out of memory for the manifest");
      ckpt_tensor_name(name, sizeof name, p->fqn, (mp_state_kind)k);
      cJSON_AddStringToObject(t, "name", name);
      cJSON_AddStringToObject(t, "dtype", "F32");
      cJSON_AddItemToObject(t, "shape", i64_array(p->shape, p->ndim));
      cJSON_AddArrayToObject(t, "shards");
      cJSON_AddItemToArray(tensors, t);
    }
  for (int r = 0; r < sj->world; r++) {
    snprintf(path, sizeof path, "%s/rank_%05d.json", sj->tmp, r);
    cJSON *idx = NULL;
    MP_CHECK(mp_json_parse_file(ctx, path, &idx));
    cJSON *f = cJSON_CreateObject();
    snprintf(name, sizeof name, "rank_%05d.bin", r);
    cJSON_AddStringToObject(f, "name", name);
    cJSON_AddItemToObject(f, "bytes", cJSON_DetachItemFromObject(idx, "bytes"));
    cJSON_AddItemToArray(files, f);
    cJSON *e, *entries = cJSON_GetObjectItem(idx, "entries");
    while (entries && (e = cJSON_DetachItemFromArray(entries, 0)) != NULL) {
      const char *tn = cJSON_GetStringValue(cJSON_GetObjectItem(e, "tensor"));
      cJSON *t = NULL;
      cJSON_ArrayForEach(t, tensors) {
        if (tn && strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(t, "name")), tn) == 0) break;
      }
      if (!t) {
        cJSON_Delete(e);
        cJSON_Delete(idx);
        return mp_error(ctx, MP_ERR_INTERNAL, "%s: tensor %s is not the plan's", path, tn ? tn : "?");
      }
      cJSON_DeleteItemFromObject(e, "tensor");
      cJSON_AddNumberToObject(e, "file", r);
      cJSON_AddItemToArray(cJSON_GetObjectItem(t, "shards"), e);
    }
    cJSON_Delete(idx);
  }
  return MP_OK;
}

/* Rank 0: the manifest (written last inside the folder), the rename, the pruning. */
static mp_status publish(mp_ctx *ctx, save_job *sj, int keep, const mp_ckpt_meta *meta) {
  const mp_plan *plan = mp_runtime_plan(sj->rt);
  cJSON *man = cJSON_CreateObject();
  MP_CHECK_ALLOC(ctx, man);
  char mesh[128];
  mp_mesh_format(&plan->mesh, mesh, sizeof mesh);
  cJSON_AddStringToObject(man, "format", MP_CKPT_FORMAT);
  cJSON_AddNumberToObject(man, "version", MP_CKPT_VERSION);
  cJSON_AddNumberToObject(man, "step", (double)meta->step);
  cJSON_AddNumberToObject(man, "data_consumed", (double)meta->data_consumed);
  char seed[24];
  snprintf(seed, sizeof seed, "%llu", (unsigned long long)meta->seed);
  cJSON_AddStringToObject(man, "seed", seed); /* a string: a double holds 53 bits */
  cJSON_AddStringToObject(man, "saved_by_mesh", mesh);
  cJSON_AddNumberToObject(man, "chunk_bytes", MP_CKPT_CHUNK_BYTES);
  cJSON_AddItemToObject(man, "model", mp_model_to_json(&plan->model));
  if (meta->train) cJSON_AddItemToObject(man, "train", cJSON_Duplicate(meta->train, 1));
  mp_status st = merge_indexes(ctx, sj, man);
  char *text = st == MP_OK ? cJSON_Print(man) : NULL;
  cJSON_Delete(man);
  if (st == MP_OK && !text) st = mp_error(ctx, MP_ERR_NOMEM, "checkpoint: out of memory for the manifest");
  char path[MP_CKPT_PATH_MAX + 32], old[MP_CKPT_PATH_MAX + 32];
  snprintf(path, sizeof path, "%s/manifest.json", sj->tmp);
  if (st == MP_OK) st = write_durable(ctx, path, text, strlen(text));
  free(text);
  for (int r = 0; r < sj->world && st == MP_OK; r++) { /* merged: the indexes go */
    snprintf(path, sizeof path, "%s/rank_%05d.json", sj->tmp, r);
    unlink(path);
  }
  MP_CHECK(st);
  hook("manifest_written", sj->rank, sj->step);
  /* a step saved again (a resumed run passing it) replaces the old folder */
  snprintf(old, sizeof old, "%s/.old_step_%08lld", sj->dir, (long long)sj->step);
  if (access(sj->final, F_OK) == 0 && rename(sj->final, old) != 0)
    return mp_error(ctx, MP_ERR_IO, "%s: cannot move the old checkpoint aside: %s", sj->final, strerror(errno));
  if (rename(sj->tmp, sj->final) != 0)
    return mp_error(ctx, MP_ERR_IO, "%s: rename to %s failed: %s", sj->tmp, sj->final, strerror(errno));
  MP_CHECK(fsync_path(ctx, sj->dir));
  hook("renamed", sj->rank, sj->step);
  return prune(ctx, sj->dir, keep);
}

mp_status mp_ckpt_save(mp_ctx *ctx, mp_runtime *rt, const char *dir, int keep, const mp_ckpt_meta *meta,
                       char *saved, size_t cap) {
  save_job sj = {rt, mp_comm_world_rank(mp_runtime_comm(rt)), mp_comm_world_size(mp_runtime_comm(rt)), meta->step,
                 "", "", ""};
  if (snprintf(sj.dir, sizeof sj.dir, "%s", dir) >= (int)sizeof sj.dir - 32)
    return mp_error(ctx, MP_ERR_INVALID, "checkpoint folder name too long: %s", dir);
  snprintf(sj.tmp, sizeof sj.tmp, "%s/.tmp_step_%08lld", dir, (long long)meta->step);
  snprintf(sj.final, sizeof sj.final, "%s/step_%08lld", dir, (long long)meta->step);
  mp_status st = MP_OK;
  if (sj.rank == 0) {
    st = make_dirs(ctx, dir);
    if (st == MP_OK) st = remove_step_dir(ctx, sj.tmp); /* a killed save's leftovers */
    if (st == MP_OK && mkdir(sj.tmp, 0777) != 0)
      st = mp_error(ctx, MP_ERR_IO, "cannot create %s: %s", sj.tmp, strerror(errno));
  }
  MP_CHECK(mp_runtime_agree(ctx, rt, st, "creating the checkpoint folder"));
  hook("begin", sj.rank, sj.step);
  st = write_rank_files(ctx, &sj);
  if (st == MP_OK) hook("shards_written", sj.rank, sj.step);
  st = mp_runtime_agree(ctx, rt, st, "writing the checkpoint's shards");
  if (st == MP_OK) st = mp_runtime_agree(ctx, rt, sj.rank == 0 ? publish(ctx, &sj, keep, meta) : MP_OK,
                                         "publishing the checkpoint");
  if (st != MP_OK && sj.rank == 0) { /* every rank is past its writing: a failed save leaves no half folder */
    mp_ctx c2;
    mp_ctx_init(&c2);
    remove_step_dir(&c2, sj.tmp);
  }
  MP_CHECK(st);
  if (saved) snprintf(saved, cap, "%s", sj.final);
  return MP_OK;
}
