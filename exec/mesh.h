/* Device mesh: the GPUs (or MPI ranks) laid out as [pp, dp_replicate, dp_shard, cp, tp],
 * row-major with tp innermost, so a TP group is consecutive ranks (one NVLink domain).
 *
 * Expert parallelism has two layouts:
 *  - inside dp_shard (ep divides dp_shard and etp is not given): the dp_shard coordinate s
 *    splits as s = efsdp * ep + e (ep innermost). The EP group varies e; the expert-FSDP
 *    group (where expert weights are sharded) varies efsdp, size dp_shard / ep.
 *  - the expert grid (etp given, or ep not dividing dp_shard): the experts' own grid
 *    [edp, ep, etp] over a pipeline stage's ranks, etp innermost, carved from the same ranks
 *    as the dense [dp_replicate, dp_shard, cp, tp] (Megatron-Core's expert RankGenerator,
 *    order "tp-ep-dp-pp", megatron/core/parallel_state.py, core_r0.12; torchtitan's EP
 *    borrowed from dp_shard x cp and, with expert_tensor_parallel_degree 1, tp,
 *    torchtitan/distributed/parallel_dims.py, v0.2). The expert-TP group (MP_GROUP_ETP) is
 *    etp consecutive ranks (etp = 1: experts whole on a rank; etp > 1: each local expert
 *    split over them, Megatron-Core's _EXPERT_TENSOR_PARALLEL_GROUP), the EP group ep ranks
 *    etp apart (_EXPERT_MODEL_PARALLEL_GROUP); ep x etp divides dp_shard x cp x tp (the
 *    expert-FSDP group then varies the rest of it, size dp_shard x cp x tp / (ep x etp), and
 *    dp_replicate replicates) or is a multiple of it dividing the stage (EP reaches into
 *    dp_replicate: Megatron's EP 8 over a data-parallel group of 8). The expert-DP group
 *    (MP_GROUP_EDP, _EXPERT_DATA_PARALLEL_GROUP: the stage's ranks holding the same expert
 *    slices, size stage / (ep x etp)) is where DDP reduces the experts' gradients.
 *    Example (tested): 16 ranks as [dp_shard=4, tp=4] with ep=2, etp=4 (NeMo's Llama 4
 *    layout in small) give ETP groups {0..3}, {4..7}, .., EP groups {0,4}, {1,5}, ..,
 *    expert-DP groups {0,8}, {1,9}, ...
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
  MP_GROUP_EP,       /* expert parallel: part of dp_shard, or of the stage (expert grid) */
  MP_GROUP_EFSDP,    /* expert-FSDP: dp_shard / ep (expert grid: dp_shard x cp x tp / ep) */
  MP_GROUP_DP,       /* dp_replicate x dp_shard: every data-parallel rank (loss mean) */
  MP_GROUP_FSDP,     /* dp_shard x cp: where dense parameters are sharded (torchtitan) */
  MP_GROUP_DP_CP,    /* dp_replicate x dp_shard x cp: Megatron-LM's data-parallel group with
                        context parallelism, over which replicated gradients are all-reduced */
  MP_GROUP_WORLD,
  MP_GROUP_EDP,      /* expert-DP: the ranks of a stage holding the same experts (DDP reduces
                        the experts' gradients over it, as Megatron-Core's expert_data_parallel
                        group) */
  MP_GROUP_ETP,      /* expert tensor parallel: the expert grid's innermost etp ranks, over which
                        each local expert is split (Megatron-Core's expert_tensor_parallel group);
                        one rank inside dp_shard or with etp = 1 */
  MP_GROUP_DOPT,     /* one distributed-optimizer instance: dp_replicate / dopt consecutive
                        dp_replicate coordinates x dp_shard x cp (Megatron-Core's
                        intra_partial_data_parallel_group_with_cp, the data-parallel-with-cp
                        ranks cut into dopt consecutive slices, parallel_state.py core_v0.14.0);
                        the whole dp_cp group with one instance */
  MP_GROUP_DOPT_INTER, /* across the instances: the ranks at the same place in each
                        (get_inter_distributed_optimizer_instance_group, size dopt); the
                        routed experts' inter-instance group is the same ranks (see EDOPT) */
  MP_GROUP_EDOPT,    /* the routed experts' part of one instance: the expert-DP group cut into
                        dopt slices of consecutive members (Megatron-Core's
                        _INTRA_PARTIAL_EXPERT_DATA_PARALLEL_GROUP, create_hierarchical_groups
                        with sizes [edp / dopt, dopt], parallel_state.py core_v0.14.0); its
                        second level (members edp / dopt apart: ranks a stage / dopt apart) is
                        dopt_inter, the one inter-instance group Megatron uses for the dense
                        and the expert buckets alike; the whole expert-DP group with one
                        instance */
  MP_GROUP_COUNT
} mp_group;

typedef struct mp_mesh {
  int size[MP_MESH_NDIMS]; /* each >= 1 */
  int ep;                  /* >= 1 (see the layouts above) */
  int etp;                 /* expert tensor parallelism: 0 not given, else its size (the expert
                              grid; each local expert split over etp ranks) */
  int dopt;                /* Megatron-Core's distributed-optimizer instances
                              (--num-distributed-optimizer-instances): dp_replicate cut into dopt
                              blocks of consecutive coordinates (groups MP_GROUP_DOPT and
                              MP_GROUP_DOPT_INTER), the expert-DP group likewise (MP_GROUP_EDOPT);
                              0 or 1: one instance. A layout of the ranks, as etp is: "dopt=N"
                              in the mesh spec */
} mp_mesh;

/* The most ranks a mesh may have: common/limits.h's bound on GPUs in one job. */
#define MP_MESH_MAX_WORLD ((int)MP_LIM_GPUS)

const char *mp_mesh_dim_name(mp_mesh_dim d);
const char *mp_group_name(mp_group g);

/* All dims 1. */
void mp_mesh_init(mp_mesh *m);
/* Parses "dp_shard=4,tp=2,ep=2" (dims: pp, dp_replicate, dp_shard, cp, tp, ep, etp, dopt; dp_rep is
 * accepted for dp_replicate). A size of -1 for one dim means "the rest of world_size"
 * (world_size > 0 required then). Unknown dims, repeated dims, sizes outside
 * 1..MP_MESH_MAX_WORLD and meshes of more than MP_MESH_MAX_WORLD ranks are MP_ERR_INVALID
 * with a message naming them. */
mp_status mp_mesh_parse(mp_ctx *ctx, const char *spec, int world_size, mp_mesh *out);
/* ep fits one of the layouts above; world fits; dopt divides dp_replicate and, with ep > 1,
 * the expert-DP size. */
mp_status mp_mesh_validate(mp_ctx *ctx, const mp_mesh *m);
/* 1 when the experts use their own grid (etp given, or ep not dividing dp_shard). */
int mp_mesh_expert_grid(const mp_mesh *m);
int mp_mesh_world(const mp_mesh *m);
/* The distributed-optimizer instances: dopt, 1 where it is 0. */
int mp_mesh_dopt(const mp_mesh *m);
/* The experts' etp as --fix and plan --json name it: 0 with ep inside dp_shard, else the
 * expert grid's etp (1: experts whole on a rank, whether etp was given as 1 or not at all). */
int mp_mesh_grid_etp(const mp_mesh *m);
/* Where the routed experts' gradients are summed over their replicas once reduce-scattered
 * over MP_GROUP_EFSDP: MP_GROUP_DP_REPLICATE, or MP_GROUP_EDP where the expert grid reaches
 * into dp_replicate (ep x etp a multiple of dp_shard x cp x tp: the expert-FSDP group is one
 * rank and the expert-DP group, Megatron-Core's _EXPERT_DATA_PARALLEL_GROUP, the stage's
 * ranks holding the same experts, fewer than dp_replicate's). */
mp_group mp_mesh_expert_replica_group(const mp_mesh *m);
/* "dp_shard=4,tp=2" (dims of size 1 left out; "single" when all are 1; dopt=N when N > 1). */
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
