/* Distributed checkpoints: mesh-independent, sharded, atomic.
 *
 * A checkpoint is a folder DIR/step_NNNNNNNN (N: optimizer steps taken) holding
 *   rank_RRRRR.bin   the raw fp32 tiles rank R owns, one after another (no header)
 *   manifest.json    written last: the format and version, the step, the training state
 *                    (data position, seed, the caller's "train" object: schedule, data
 *                    files), the model's dims, and every tensor by name with its global
 *                    shape, dtype (F32) and shards: file, the shard's global box
 *                    (offset[], len[]), its byte offset in the file and one xxHash64 per
 *                    chunk_bytes of it
 * Tensor names are the plan's FQNs (exec/plan.h) for the fp32 master weights and
 * "optim.<fqn>.exp_avg" / "optim.<fqn>.exp_avg_sq" for AdamW's moments, as
 * torch.distributed.checkpoint names optimizer state by parameter FQN. Nothing in it
 * depends on the mesh that wrote it: a shard is a box of the global tensor.
 *
 * Who writes what: the one owner of each element (mp_runtime_param_owner: not a replica
 * over tp, dp_replicate or an unsharded FSDP group) writes its tile, real elements only
 * (FSDP's pad rows are not data). A rank that holds no part of a tensor (a pipeline stage
 * without it: mp_param_tile returns 0) writes nothing for it.
 *
 * Atomic save (collective over the world; every step agrees on failure over all ranks,
 * so a failing rank fails the save everywhere and none hangs):
 *   1. rank 0 creates DIR/.tmp_step_N (a stale one from a killed save is removed first)
 *   2. every rank writes and fsyncs its rank_R.bin and its index rank_R.json
 *   3. barrier; rank 0 merges the indexes into manifest.json (fsynced), renames
 *      .tmp_step_N to step_N, fsyncs DIR, and removes all but the newest `keep` steps
 *   4. barrier
 * A kill at any moment leaves every earlier step_N whole, and a step_N exists only with
 * its manifest: `latest` is the newest step_N folder. A save that fails (a full disk)
 * removes its temporary folder on rank 0 once every rank has agreed on the failure.
 *
 * Load (reshards): each rank needs, per parameter and state, the box of its own tile
 * (mp_param_tile under the loading mesh); it intersects that box with every saved shard
 * of the tensor and reads only the byte ranges of the intersection, rounded out to the
 * checksum chunks that hold them (each chunk read is verified), as
 * torch.distributed.checkpoint's planner reads only the overlapping regions. Any byte of
 * a shard is read, and so verified, by the rank(s) that need it. Refused with one line
 * naming the file and the tensor: a checksum mismatch, a truncated file, a tensor the
 * model lacks or does not have in the checkpoint, a shape that differs (another model
 * or vocabulary), shards that do not cover a tensor. */
#ifndef MP_EXEC_RUNTIME_CKPT_H
#define MP_EXEC_RUNTIME_CKPT_H

#include <stdint.h>

#include <cjson/cJSON.h>

#include "common/arena.h"
#include "common/status.h"
#include "exec/runtime/runtime.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MP_CKPT_FORMAT "meshplan-checkpoint"
#define MP_CKPT_VERSION 1
#define MP_CKPT_CHUNK_BYTES (1 << 20) /* bytes per checksum: the read granularity of a load */
#define MP_CKPT_PATH_MAX 1024
/* The most a manifest.json may hold. It lists one 19-byte hex checksum per MiB of state:
 * a 405B-parameter model's fp32 weights and AdamW moments (12 bytes a parameter, 4.9 TB)
 * take 4.6M of them, about 90 MB; 2^30 bytes leaves 10x. */
#define MP_CKPT_MANIFEST_MAX_BYTES (1LL << 30)

/* The training state saved beside the tensors. */
typedef struct mp_ckpt_meta {
  int64_t step;          /* optimizer steps taken (AdamW's t; the LR schedule's position) */
  int64_t data_consumed; /* training sequences consumed: the data loader's position */
  uint64_t seed;         /* initialization and data-order seed */
  cJSON *train;          /* the caller's state object (schedule, data files; may be NULL).
                            Save: borrowed. Load: owned by the manifest it came from */
} mp_ckpt_meta;

/* xxHash64 (seed 0) of n bytes: the chunk checksum. */
uint64_t mp_ckpt_hash64(const void *data, size_t n);

/* Saves rt's state as DIR/step_<meta->step> (collective over the world; see above) and
 * keeps the newest `keep` steps (keep <= 0: all). saved (cap bytes) gets the folder's
 * path. */
mp_status mp_ckpt_save(mp_ctx *ctx, mp_runtime *rt, const char *dir, int keep, const mp_ckpt_meta *meta,
                       char *saved, size_t cap);

/* The steps of the complete checkpoints in dir (step_N folders with a manifest.json),
 * ascending: *steps (malloc'd; free it) holds *n of them. MP_ERR_NOT_FOUND when dir does
 * not exist. A save that failed removes its temporary folder, so none is listed or left. */
mp_status mp_ckpt_list(mp_ctx *ctx, const char *dir, int64_t **steps, int *n);

/* The step folder that `path` names: path itself when it holds a manifest.json, else the
 * newest complete DIR/step_N under it. MP_ERR_NOT_FOUND when there is none. */
mp_status mp_ckpt_resolve(mp_ctx *ctx, const char *path, char *out, size_t cap);

/* A checkpoint's manifest, parsed (all memory in its arena). */
typedef struct mp_ckpt_shard {
  int file;              /* index into files */
  int64_t off[3], len[3];/* the box of the global tensor (dims past ndim: 0 and 1) */
  int64_t byte_offset;   /* in the file */
  int n_chunks;
  uint64_t *chunks;      /* xxHash64 per chunk_bytes of the shard's bytes */
} mp_ckpt_shard;

typedef struct mp_ckpt_tensor {
  const char *name;
  int ndim;
  int64_t shape[3];
  int n_shards;
  mp_ckpt_shard *shards;
} mp_ckpt_tensor;

typedef struct mp_ckpt_manifest {
  mp_arena *arena;
  cJSON *root;           /* the parsed manifest ("model", "train" objects) */
  char dir[MP_CKPT_PATH_MAX];
  mp_ckpt_meta meta;     /* meta.train points into root */
  int64_t chunk_bytes;
  int n_files;
  const char **files;    /* names in dir */
  int64_t *file_bytes;
  int n_tensors;
  mp_ckpt_tensor *tensors;
} mp_ckpt_manifest;

/* Reads and checks step_dir/manifest.json (format, version, each tensor listed once,
 * every shard inside its file and its tensor, file sizes on disk). */
mp_status mp_ckpt_manifest_read(mp_ctx *ctx, const char *step_dir, mp_ckpt_manifest *out);
/* The same from the manifest's text (NUL-terminated): the parsing of mp_ckpt_manifest_read,
 * the shard files still looked up in step_dir. out is to be freed on failure too. */
mp_status mp_ckpt_manifest_parse(mp_ctx *ctx, const char *step_dir, const char *text, mp_ckpt_manifest *out);
void mp_ckpt_manifest_free(mp_ckpt_manifest *m);
/* The checkpoint's model (the manifest's "model", meshplan's model format). */
mp_status mp_ckpt_model(mp_ctx *ctx, const mp_ckpt_manifest *m, mp_model *out);
/* The tensor named `name`, or NULL. */
const mp_ckpt_tensor *mp_ckpt_find(const mp_ckpt_manifest *m, const char *name);
/* Fills dst (row-major over len[0..ndim)) with the box off/len of tensor t, reading only
 * the chunks that hold it and verifying each. The box must lie inside t's shape (a caller's
 * bug otherwise: asserted in debug builds); the manifest's shards are input and checked. */
mp_status mp_ckpt_read_box(mp_ctx *ctx, const mp_ckpt_manifest *m, const mp_ckpt_tensor *t, const int64_t off[3],
                           const int64_t len[3], float *dst);

/* What a load checks before it reads, without a runtime: every tensor of the manifest is
 * a parameter (or moment) of plan, each one plan needs is there once with plan's shape,
 * naming the first that is not; hint ends the message of a shape that differs. */
mp_status mp_ckpt_check_plan(mp_ctx *ctx, const mp_ckpt_manifest *m, const mp_plan *plan, const char *hint);

/* Loads step_dir into rt (collective: the ranks agree on failure): every parameter's tile
 * and moments, AdamW's step count. The model must match (names, shapes and the dims in
 * the manifest's "model"). *meta gets the training state; meta->train points into *man,
 * which the caller frees (mp_ckpt_manifest_free) when done with it. */
mp_status mp_ckpt_load(mp_ctx *ctx, mp_runtime *rt, const char *step_dir, mp_ckpt_manifest *man,
                       mp_ckpt_meta *meta);
/* mp_ckpt_load's reading on this rank from a parsed manifest, without agreeing with the
 * other ranks. */
mp_status mp_ckpt_load_parsed(mp_ctx *ctx, mp_runtime *rt, const mp_ckpt_manifest *man, mp_ckpt_meta *meta);

/* Test hook (fault injection, as SQLite's): called at each named point of a save on every
 * rank: "begin" (the temporary folder exists), "shard_half" (half of the rank's tiles are
 * written), "shards_written" (the rank's files are complete, before the barrier),
 * "manifest_written" (rank 0, before the rename), "renamed" (rank 0, before pruning).
 * NULL turns it off. */
typedef void (*mp_ckpt_hook_fn)(const char *point, int rank, int64_t step, void *arg);
void mp_ckpt_set_hook(mp_ckpt_hook_fn fn, void *arg);

#ifdef __cplusplus
}
#endif
#endif
