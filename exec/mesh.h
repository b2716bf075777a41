/* Device mesh: the GPUs (or MPI ranks) laid out as [pp, dp_replicate, dp_shard, cp, tp],
 * row-major with tp innermost, so a TP group is consecutive ranks (one NVLink domain).
 *
 * Expert parallelism is carved out of dp_shard: ep divides dp_shard and the dp_shard
 * coordinate s splits as s = efsdp * ep + e (ep innermost). The EP group varies e; the
 * expert-FSDP group (where expert weights are sharded) varies efsdp, size dp_shard / ep.
 *
 * Example (tested): 8 ranks as [dp_shard=2, tp=4] give TP groups {0,1,2,3},{4,5,6,7} and
 * FSDP groups {0,4},{1,5},{2,6},{3,7}. */
#ifndef MP_EXEC_MESH_H
#define MP_EXEC_MESH_H

#include <stddef.h>

#include "common/limits.h"
#include "common/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mp_mesh_dim {
  MP_DIM_PP = 0,
  MP_DIM_DP_REPLICATE,
  MP_DIM_DP_SHARD,
  MP_DIM_CP,
  MP_DIM_TP,
  MP_MESH_NDIMS
} mp_mesh_dim;

typedef enum mp_group {
  MP_GROUP_PP = 0,
  MP_GROUP_DP_REPLICATE,
  MP_GROUP_DP_SHARD, /* FSDP group of dense parameters (when cp == 1) */
  MP_GROUP_CP,
  MP_GROUP_TP,
  MP_GROUP_EP,       /* expert parallel: part of dp_shard */
  MP_GROUP_EFSDP,    /* expert-FSDP: dp_shard / ep */
  MP_GROUP_DP,       /* dp_replicate x dp_shard: every data-parallel rank (loss mean) */
  MP_GROUP_FSDP,     /* dp_shard x cp: where dense parameters are sharded (torchtitan) */
  MP_GROUP_DP_CP,    /* dp_replicate x dp_shard x cp: Megatron-LM's data-parallel group with
                        context parallelism, over which replicated gradients are all-reduced */
  MP_GROUP_WORLD,
  MP_GROUP_COUNT
} mp_group;

typedef struct mp_mesh {
  int size[MP_MESH_NDIMS]; /* each >= 1 */
  int ep;                  /* >= 1, divides size[MP_DIM_DP_SHARD] */
} mp_mesh;

/* The most ranks a mesh may have: common/limits.h's bound on GPUs in one job. */
#define MP_MESH_MAX_WORLD ((int)MP_LIM_GPUS)

const char *mp_mesh_dim_name(mp_mesh_dim d);
const char *mp_group_name(mp_group g);

/* All dims 1. */
void mp_mesh_init(mp_mesh *m);
/* Parses "dp_shard=4,tp=2,ep=2" (dims: pp, dp_replicate, dp_shard, cp, tp, ep; dp_rep is
 * accepted for dp_replicate). A size of -1 for one dim means "the rest of world_size"
 * (world_size > 0 required then). Unknown dims, repeated dims, sizes outside
 * 1..MP_MESH_MAX_WORLD and meshes of more than MP_MESH_MAX_WORLD ranks are MP_ERR_INVALID
 * with a message naming them. */
mp_status mp_mesh_parse(mp_ctx *ctx, const char *spec, int world_size, mp_mesh *out);
/* ep divides dp_shard; world fits. */
mp_status mp_mesh_validate(mp_ctx *ctx, const mp_mesh *m);
int mp_mesh_world(const mp_mesh *m);
/* "dp_shard=4,tp=2" (dims of size 1 left out; "single" when all are 1). */
void mp_mesh_format(const mp_mesh *m, char *buf, size_t cap);

void mp_mesh_coords(const mp_mesh *m, int rank, int coords[MP_MESH_NDIMS]);
int mp_mesh_rank_of(const mp_mesh *m, const int coords[MP_MESH_NDIMS]);
/* e and efsdp parts of the rank's dp_shard coordinate. */
int mp_mesh_ep_index(const mp_mesh *m, int rank);
int mp_mesh_efsdp_index(const mp_mesh *m, int rank);

int mp_mesh_group_size(const mp_mesh *m, mp_group g);
/* Writes the ranks of rank's group of kind g in increasing order into ranks (capacity
 * mp_mesh_group_size) and returns their count. */
int mp_mesh_group_ranks(const mp_mesh *m, mp_group g, int rank, int *ranks);
/* rank's position within its group. */
int mp_mesh_group_index(const mp_mesh *m, mp_group g, int rank);
/* Which group of kind g rank is in: 0 .. world/group_size-1 (an MPI_Comm_split color). */
int mp_mesh_group_id(const mp_mesh *m, mp_group g, int rank);

#ifdef __cplusplus
}
#endif
#endif
