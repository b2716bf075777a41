/* Network model: alpha-beta cost of one collective, and the link a mesh group runs on.
 *
 * Collective time (nccl-tests' bus-bandwidth convention, ring algorithms):
 *   all-reduce        2(n-1)/n x bytes / bw + 2(n-1) x latency
 *   all-gather, reduce-scatter, all-to-all
 *                      (n-1)/n x bytes / bw +  (n-1) x latency
 *   send, recv, sendrecv  bytes / bw + latency (a ring shift sends and receives at once
 *                      over the two directions of its links)
 *   broadcast          bytes / bw + (n-1) x latency (pipelined ring)
 * `bytes` is the op's payload as exec/schedule.h defines it (the full tensor for
 * all-gather, reduce-scatter and all-reduce; what a rank sends for all-to-all and send).
 *
 * NCCL (the GPU clusters' collectives) prices an all-gather, reduce-scatter or all-reduce
 * by its own tuning model and runs the fastest of its algorithms (ring, and for the
 * all-reduce the double binary tree) and protocols (LL, LL128, Simple) at each size
 * (src/graph/tuning.cc, v2.27.7-1; mp_sim_nccl_collective_s below): a launch latency, a
 * latency a ring step that is NVLink's for the steps inside a node and the network's only
 * for the nodes - 1 steps a ring laid out node by node crosses between nodes (twice that
 * for an all-reduce), and the bytes at the protocol's share of the link's bandwidth (Simple
 * the whole, LL128 0.92, LL half, capped). The tree climbs a node's chain and log2(nodes)
 * levels between nodes, twice; PAT (from NCCL 2.23, where the run's version has it:
 * pat_bw_share), for one rank a node, pays log2(nodes) network hops and a short step a rank.
 * Small collectives of large groups take LL or the tree, bulk ones Simple on the ring; the
 * CPU runtime's MPI collectives, broadcasts, sends and all-to-alls keep the alpha-beta model
 * above on the link's latency a step.
 *
 * Group link. A group that stays inside one node runs on NVLink (the cluster's
 * intra_node_GBps_per_gpu, intra-node latency). A group with one member per node runs on
 * the NIC (mp_cluster_inter_GBps, inter-node latency). A group with several members per
 * node and several nodes is hierarchical: NCCL runs one ring per rail (one per local GPU
 * of the group), so every GPU still forwards the whole ring traffic over NVLink while the
 * inter-node share of each node is spread over its `per_node` NICs; the ring is bounded by
 * the slower of the two: bw = min(intra, per_node x inter), with the inter-node latency per
 * step. Groups are regular (products of mesh dims), so every node holds the same number of
 * members as the node of the rank asked about.
 *
 * NVLink domains. Where an NVLink switch fabric joins GPUs across hosts (GB200 NVL72: 18
 * trays of 4 GPUs in one domain; the cluster's nvlink_domain), "node" above means the
 * domain: a group inside one rack runs on NVLink whatever trays it spans, and only a group
 * spanning domains reaches the NICs. NCCL does the same with multi-node NVLink (MNNVL,
 * v2.27.7-1): src/mnnvl.cc ncclMnnvlCheck gathers the ranks sharing its fabric cluster UUID
 * and clique id into comm->clique; src/graph/topo.cc ncclTopoGetSystem fuses the topology
 * of the clique's ranks, not the host's, into one system; src/init.cc counts nNodes as the
 * distinct first ranks of the rings (topoRanks.ringRecv[0]), one per fused system: a clique
 * is one node to the ring, the tree and the tuning model's latencies. The mesh's ranks are
 * laid out consecutively, tp innermost, so a domain holds consecutive ranks.
 *
 * All-to-all across nodes. The ring bound above does not hold for an all-to-all: every rank
 * sends at once, so a node's NICs carry all of its members' inter-node traffic and none is
 * left to share. A rank sends bytes / n to each member: (per_node - 1) / n of its bytes over
 * NVLink, (n - per_node) / n through its own NIC (NCCL's all-to-all posts one send per
 * peer; with PXN the inter-node sends leave by the NIC of the peer's rail, the same load per
 * NIC under this symmetric traffic); the two run side by side, so the slower bounds it. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sim/sim.h"
#include "sim/sim_internal.h"

double mp_sim_collective_s(mp_coll c, double bytes, int n, double bw_GBps, double lat_s) {
  if (bw_GBps <= 0) return 0.0;
  double bw = bw_GBps * 1e9;
  if (c == MP_COLL_SEND || c == MP_COLL_RECV || c == MP_COLL_SENDRECV) return bytes / bw + lat_s;
  if (n <= 1) return 0.0;
  double f = (double)(n - 1) / (double)n;
  switch (c) {
    case MP_COLL_ALL_REDUCE:
      return 2.0 * f * bytes / bw + 2.0 * (n - 1) * lat_s;
    case MP_COLL_ALL_GATHER:
    case MP_COLL_REDUCE_SCATTER:
    case MP_COLL_ALL_TO_ALL:
      return f * bytes / bw + (n - 1) * lat_s;
    case MP_COLL_BROADCAST:
      return bytes / bw + (n - 1) * lat_s;
    default:
      return 0.0;
  }
}

/* Groups up to this size are listed (on the stack) to count a node's members. */
#define SMALL_GROUP 64

mp_status mp_sim_link_of(mp_ctx *ctx, const mp_sim_link *links, const mp_cluster *c, const mp_mesh *mesh,
                         mp_group g, int rank, mp_sim_link *out) {
  if (links == NULL) return mp_sim_group_link(ctx, c, mesh, g, rank, out);
  *out = links[g];
  return MP_OK;
}

mp_status mp_sim_group_link(mp_ctx *ctx, const mp_cluster *c, const mp_mesh *mesh, mp_group g,
                            int rank, mp_sim_link *out) {
  (void)ctx; /* nothing fails: the status is the interface's */
  int n = mp_mesh_group_size(mesh, g);
  out->n = n;
  /* A "node" here is an NVLink domain: the host, or the NVLink switch fabric's ranks
   * across hosts (mp_cluster_nvlink_domain), which NCCL also counts as one node. */
  int gpn = mp_cluster_nvlink_domain(c);
  /* Members on rank's node: the node's ranks that share rank's group (its group id),
   * counted over the node (gpn ranks) instead of listing the group (up to the world). */
  int node = rank / gpn, per_node = 0;
  const int world = mp_mesh_world(mesh), id = mp_mesh_group_id(mesh, g, rank);
  const int lo = node * gpn, hi = lo + gpn < world ? lo + gpn : world;
  if (n <= gpn && n <= SMALL_GROUP) {
    /* a small group: listing it is cheaper than walking the node (the same members) */
    int ranks[SMALL_GROUP];
    mp_mesh_group_ranks(mesh, g, rank, ranks);
    for (int i = 0; i < n; i++) per_node += (ranks[i] / gpn == node);
  } else {
    for (int r = lo; r < hi; r++) per_node += mp_mesh_group_id(mesh, g, r) == id;
  }
  if (per_node < 1) per_node = 1;
  out->per_node = per_node;
  out->nodes = (n + per_node - 1) / per_node;
  double intra = c->intra_node_GBps_per_gpu, inter = mp_cluster_inter_GBps(c);
  out->intra_GBps = intra;
  out->inter_GBps = inter;
  if (out->nodes <= 1) {
    out->GBps = intra;
    out->lat_s = c->intra_node_latency_us * 1e-6;
  } else if (per_node == 1) {
    out->GBps = inter;
    out->lat_s = c->inter_node_latency_us * 1e-6;
  } else {
    double h = per_node * inter;
    out->GBps = h < intra ? h : intra;
    out->lat_s = c->inter_node_latency_us * 1e-6;
  }
  return MP_OK;
}

double mp_sim_alltoall_s(double bytes, const mp_sim_link *l, double eff, double nic_share, double nvl_share) {
  if (l->nodes <= 1 || l->per_node <= 1)
    return mp_sim_collective_s(MP_COLL_ALL_TO_ALL, bytes, l->n, l->GBps * eff, l->lat_s);
  if (l->intra_GBps <= 0 || l->inter_GBps <= 0 || eff <= 0) return 0.0;
  const double nvl = nvl_share * bytes / (l->intra_GBps * eff * 1e9);
  const double nic = nic_share * bytes / (l->inter_GBps * eff * 1e9);
  return (nvl > nic ? nvl : nic) + (l->n - 1) * l->lat_s;
}

/* DeepEP (deepseek-ai/DeepEP's normal kernels, as DeepSeek-V3 describes them, arXiv
 * 2412.19437 sec. 3.2.2): a token goes over the network once to each remote node holding
 * one of its experts, to the GPU of its own rail there, which forwards it over NVLink to
 * the experts on that node; inside one node (csrc/kernels/intranode.cu of DeepEP's April
 * 2025 tree, which Megatron-Core's flex dispatcher calls) a token goes once to each other
 * GPU holding one of its experts (is_token_in_rank), the GPU expanding it to its experts
 * itself (Megatron-Core's get_permuted_hidden_states_by_experts): one copy a rank, whatever
 * the number of its experts the token picked. Under balanced routing a token's top_k experts
 * are drawn uniformly from those of the D holders (nodes, or the GPUs of a one-node group)
 * its routing may use: every holder of the group, or with group-limited routing (n_group
 * groups, topk_group used) those of topk_group groups, D = min(holders, topk_group x
 * max(1, holders / n_group)). Of D holders of e experts each, a given one holds none of the
 * k experts with probability C(De - e, k) / C(De, k), so a token reaches D (1 - that)
 * holders; its own is one of them with probability 1/holders of that count, leaving
 * (1 - 1/holders) of it remote. Each remote holder costs one copy of the token where the
 * all-to-all's bytes count top_k: across nodes the NIC's share is remote / top_k and
 * NVLink carries every copy but those landing on the GPU they arrive at, (per_node - 1) /
 * per_node of the bytes; inside one node NVLink's share is remote / top_k. Returns the
 * D (1 - that) holders a token reaches. */
static double holders_reached(int holders, const mp_model *m) {
  int D = holders;
  if (m->n_group > 0) {
    const int per_group = holders / (int)m->n_group > 1 ? holders / (int)m->n_group : 1;
    const int64_t lim = m->topk_group * per_group;
    if (lim < D) D = (int)lim;
  }
  const double e = (double)m->n_experts / holders, pool = D * e;
  double none = 1.0; /* a given candidate holder holds none of the k experts */
  for (int64_t i = 0; i < m->top_k; i++) none *= (pool - e - (double)i) / (pool - (double)i);
  if (none < 0) none = 0;
  return D * (1.0 - none);
}

void mp_sim_ep_shares(const mp_sim_link *l, const mp_model *m, mp_moe_dispatcher d, double *nic_share,
                      double *nvl_share) {
  mp_sim_ep_shares_etp(l, m, d, 1, nic_share, nvl_share);
}

/* Under expert tensor parallelism the flex dispatcher's group is the expert-TP x EP one
 * (token_dispatcher.py MoEFlexTokenDispatcher, core_v0.14.0): each EP rank of l stands for
 * the etp consecutive ranks of its expert-TP group (exec/mesh.h: etp innermost, inside a
 * node), a token reaching each of them once its EP shard holds one of its experts, so the
 * bytes count top_k x etp copies of a token. Inside one node a token reaches R shards
 * (holders_reached over the ep shards), R x etp ranks, its own rank among them with
 * probability R / ep: R (etp - 1/ep) copies leave the GPU, all on NVLink, a share of that
 * over top_k x etp (etp 1: R (1 - 1/ep) over top_k, as above). Across nodes the network
 * copy still goes once to each remote node reached (the etp slices of an expert on one
 * node), a share of top_k x etp; inside the node NVLink carries every copy but those
 * landing on the GPU they arrive at, (pn etp - 1) / (pn etp) with pn the EP ranks a node. */
void mp_sim_ep_shares_etp(const mp_sim_link *l, const mp_model *m, mp_moe_dispatcher d, int etp,
                          double *nic_share, double *nvl_share) {
  const double n = l->n > 0 ? l->n : 1, pn = l->per_node > 0 ? l->per_node : 1;
  *nic_share = (n - pn) / n;
  *nvl_share = (pn - 1) / n;
  if (!mp_moe_dispatch_by_node(d) || m->top_k < 1) return;
  const int holders = l->nodes > 1 ? l->nodes : l->n;
  if (holders <= 1 || m->n_experts < holders) return;
  const double x = etp > 1 ? etp : 1, copies = (double)m->top_k * x;
  const double reached = holders_reached(holders, m);
  if (l->nodes > 1) {
    *nic_share = reached * (1.0 - 1.0 / holders) / copies;
    *nvl_share = (pn * x - 1) / (pn * x);
  } else {
    *nvl_share = reached * (x - 1.0 / holders) / copies;
  }
}

/* DeepEP's dispatch or combine: one kernel whose channels serve every peer at once
 * (csrc/kernels/intranode.cu and internode.cu: warps per destination rank, RDMA sender
 * warps per remote node), so the bytes on NVLink and on the NIC run side by side, the slower
 * bounding it, behind one step of the link's latency, where NCCL's all-to-all is counted
 * in n - 1 steps (mp_sim_alltoall_s). */
double mp_sim_deepep_s(double bytes, const mp_sim_link *l, double eff, double nic_share, double nvl_share) {
  if (l->intra_GBps <= 0 || eff <= 0) return 0.0;
  const double nvl = nvl_share * bytes / (l->intra_GBps * eff * 1e9);
  const double nic = l->inter_GBps > 0 ? nic_share * bytes / (l->inter_GBps * eff * 1e9) : 0.0;
  return (nvl > nic ? nvl : nic) + l->lat_s;
}

/* ---- NCCL's ring channels ------------------------------------------------------------ */

/* The speeds (GB/s a channel) NCCL 2.21's graph search tries, fastest first
 * (src/graph/search.cc, v2.21.5-1): inside a node and across nodes, before and from sm90. */
static const double kIntraSm80[] = {40, 30, 20, 18, 15, 12, 10, 9, 7, 6, 5, 4, 3};
static const double kIntraSm90[] = {60, 50, 40, 30, 24, 20, 15, 12, 11, 6, 3};
static const double kInterSm80[] = {48, 30, 28, 24, 20, 18, 15, 12, 10, 9, 7, 6, 5, 4, 3, 2.4, 1.2, 0.24, 0.12};
static const double kInterSm90[] = {48, 45, 42, 40, 30, 24, 22, 20, 17.5, 15, 12, 6, 3, 2.4, 1.2, 0.24, 0.12};
#define NSPEED(a) ((int)(sizeof(a) / sizeof((a)[0])))
/* src/init.cc: the ring search looks for at most MAXCHANNELS / 2 = 16 rings; src/include/
 * device.h: MAXCHANNELS 32 */
#define NCCL_SEARCH_MAX 16
#define NCCL_MAXCHANNELS 32

/* Inside a node: the speed and ring count the search keeps, the most channels x speed within
 * the GPU's NVLink bandwidth (links x NCCL's per-link figure, src/graph/topo.h:
 * SM80_NVLINK_BW 20, SM90_NVLINK_BW 20.6); it starts at the first speed within it and tries
 * slower ones while they are over 0.49 of the best found, stopping at one that fills it. */
static int intra_rings(const mp_gpu *g, int sm90, double *speed) {
  /* NVLink 3 and 4 carry 25 GB/s a link and direction: the A100's 12 links, the H100's 18 */
  const int links = (int)floor(g->nvlink_GBps_per_dir / 25.0 + 0.5);
  const double total = links * (sm90 ? 20.6 : 20.0);
  const double *sp = sm90 ? kIntraSm90 : kIntraSm80;
  const int ns = sm90 ? NSPEED(kIntraSm90) : NSPEED(kIntraSm80);
  int best = 0;
  *speed = sp[ns - 1];
  for (int i = 0; i < ns; i++) {
    if (sp[i] > total) continue;
    if (best > 0 && !(sp[i] / *speed > 0.49)) break;
    int n = (int)(total / sp[i]);
    if (n > NCCL_SEARCH_MAX) n = NCCL_SEARCH_MAX;
    if (n * sp[i] > best * *speed) {
      best = n;
      *speed = sp[i];
    }
    if (best * *speed >= total) break;
  }
  return best > 0 ? best : 1;
}

int mp_sim_nccl_ring_channels(const mp_gpu *g, const mp_sim_link *l, int max_ctas) {
  const int sm90 = g->compute_capability >= 90;
  double speed;
  int search;
  if (l->nodes <= 1) {
    search = intra_rings(g, sm90, &speed);
  } else {
    /* across nodes a ring enters and leaves each node by a NIC: one ring per NIC of the
     * group's members on a node (one NIC a GPU, rail by rail), at the first speed within it */
    const double *sp = sm90 ? kInterSm90 : kInterSm80;
    const int ns = sm90 ? NSPEED(kInterSm90) : NSPEED(kInterSm80);
    int i = 0;
    while (i < ns - 1 && sp[i] > l->inter_GBps) i++;
    speed = sp[i];
    search = l->per_node < NCCL_SEARCH_MAX ? l->per_node : NCCL_SEARCH_MAX;
  }
  /* ncclTopoDupChannels: rings of 25 GB/s or more are doubled at half the speed, except on
   * sm90 below 50 GB/s with more than 4 of them */
  if (speed >= 25.0 && !(g->compute_capability > 80 && speed < 50.0 && search > 4)) {
    search = 2 * search < NCCL_SEARCH_MAX ? 2 * search : NCCL_SEARCH_MAX;
    speed /= 2.0;
  }
  /* src/graph/connect.cc ncclTopoPostset doubles the channels again; on sm90 across nodes
   * with rings over 45 GB/s and fewer than 16 channels, once more */
  int ch = 2 * search < NCCL_MAXCHANNELS ? 2 * search : NCCL_MAXCHANNELS;
  if (sm90 && l->nodes > 1 && speed > 45.0 && ch < 16) ch *= 2;
  if (max_ctas > 0 && ch > max_ctas) ch = max_ctas;
  return ch;
}

int mp_sim_nccl_cap(const mp_stack_profile *p, mp_group g) {
  if (p->nccl_max_ctas > 0) return p->nccl_max_ctas;
  return g < MP_GROUP_COUNT ? p->nccl_group_ctas[g] : 0;
}

/* Megatron-Core's communicator names (parallel_state.py get_nccl_options, core_v0.14.0) and
 * the groups of the schedule that run on them: "dp" the data-parallel group without CP;
 * "dp_cp" the one with CP, on which its DDP reduces and gathers (distributed_data_parallel.py:
 * dp_cp_group, also at cp 1, where the schedule names it dp_replicate, exec/pass_ddp.c), and
 * on which Megatron FSDP gathers and reduce-scatters the dense weights (the schedule's fsdp
 * group: mcore_fsdp_adapter.py, core_v0.14.0 and core_v0.16.0, builds its device mesh's
 * dp_cp dimension from get_data_parallel_group(with_context_parallel=True)); "ep_dp" the
 * experts' data-parallel group, which also carries Megatron FSDP's expert weights (the
 * schedule's efsdp group: core_v0.16.0's adapter builds expt_dp from
 * get_expert_data_parallel_group()). */
static const struct {
  const char *name;
  mp_group g[3];
  int n;
} kNcclComms[] = {
    {"dp", {MP_GROUP_DP}, 1},
    {"dp_cp", {MP_GROUP_DP_CP, MP_GROUP_DP_REPLICATE, MP_GROUP_FSDP}, 3},
    {"tp", {MP_GROUP_TP}, 1},
    {"cp", {MP_GROUP_CP}, 1},
    {"pp", {MP_GROUP_PP}, 1},
    {"ep", {MP_GROUP_EP}, 1},
    {"ep_dp", {MP_GROUP_EDP, MP_GROUP_EFSDP}, 2},
};

mp_status mp_sim_nccl_ctas_parse(mp_ctx *ctx, const char *text, int caps[MP_GROUP_COUNT]) {
  for (int g = 0; g < MP_GROUP_COUNT; g++) caps[g] = 0;
  const char *s = text;
  while (*s) {
    while (*s == ' ') s++;
    if (!*s) break;
    const char *item = s, *colon = NULL;
    while (*s && *s != ' ') {
      if (*s == ':' && !colon) colon = s;
      s++;
    }
    const int len = (int)(s - item);
    char *end = NULL;
    const long v = colon ? strtol(colon + 1, &end, 10) : 0;
    int k = -1;
    for (int i = 0; colon && i < (int)(sizeof kNcclComms / sizeof kNcclComms[0]); i++)
      if ((size_t)(colon - item) == strlen(kNcclComms[i].name) && !strncmp(item, kNcclComms[i].name, colon - item))
        k = i;
    if (k < 0 || end != s || v < 1 || v > 64)
      return mp_error(ctx, MP_ERR_USAGE, "NCCL CTA cap '%.*s': give name:max_ctas, a name of dp, dp_cp, tp, cp, "
                      "pp, ep, ep_dp (Megatron-Core's communicators) and 1 to 64 CTAs, items split by spaces",
                      len, item);
    for (int i = 0; i < kNcclComms[k].n; i++) caps[kNcclComms[k].g[i]] = (int)v;
  }
  return MP_OK;
}

/* ---- NCCL's cost model: algorithm, protocol, latency ------------------------------------ */

/* NCCL picks, per collective and size, the algorithm and protocol its tuning model prices
 * fastest, time = latency + bytes / algorithm bandwidth (src/graph/tuning.cc, v2.27.7-1,
 * ncclTopoTuneModel and ncclTopoGetAlgoTime; the ring's and the tree's LL, LL128 and Simple
 * latencies are those of v2.23 to v2.28, the ring's those of v2.21 too). Latencies in us,
 * [tree, ring][LL, LL128, Simple]: baseLat, a launch; hwLat over NVLink (a hop inside a
 * node) and over the network (a hop between nodes; graph->latencyInter, the network
 * plugin's own figure, is 0 for NCCL's IB and socket transports). */
enum { NCCL_TREE, NCCL_RING };
enum { NCCL_LL, NCCL_LL128, NCCL_SIMPLE, NCCL_NPROTO };
static const double kBaseLatUs[2][NCCL_NPROTO] = {{6.8, 14.0, 8.4}, {6.6, 14.0, 8.4}};
static const double kNvlLatUs[2][NCCL_NPROTO] = {{0.6, 1.25, 4.0}, {0.6, 1.9, 3.4}};
static const double kNetLatUs[2][NCCL_NPROTO] = {{5.0, 8.5, 14.0}, {2.7, 4.0, 14.0}};
/* getNetOverhead: a network post on x86 Intel hosts (the DGX's), 1 us; a ring across nodes
 * launches one a step, three for Simple, so no step of it costs less */
#define NCCL_NET_OVERHEAD_US 1.0
/* [Volta, Ampere, Hopper, Blackwell] x [1, 2, 3+ nodes]: LL's bandwidth cap (llMaxBws; across
 * nodes its first row, an Intel host's), the ring's LL128 and the tree's per channel
 * (perChMaxRingLL128Bws, perChMaxTreeBws, perChMaxTreeLL128Bws), GB/s */
static const double kLlMaxBw[4][3] = {{39.0, 39.0, 20.4}, {87.7, 22.5, 19.0}, {141.0, 45.0, 35.0},
                                      {282.0, 90.0, 70.0}};
static const double kRingLl128ChBw[4] = {20.0, 20.0, 36.7, 73.4};
static const double kTreeChBw[4][3] = {{26.5, 18.5, 10.0}, {24.0, 23.6, 17.8}, {38.7, 41.4, 36.0},
                                       {77.4, 82.8, 72.0}};
static const double kTreeLl128ChBw[4][3] = {{20.0, 20.0, 20.0}, {20.0, 20.0, 20.0}, {36.7, 36.7, 29.0},
                                            {73.4, 73.4, 58.0}};
/* treeCorrectionFactor: the tree's bandwidth at 64 B x 2^i, i < 23 (256 MiB) */
static const double kTreeCorrection[NCCL_NPROTO][23] = {
    {1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0},
    {1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0},
    {.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9}};

static int log2_floor(double x) {
  int l = 0;
  while (x >= 2.0) {
    x /= 2.0;
    l++;
  }
  return l;
}

/* The ring's latency (us): a step a rank, nsteps = 2(n-1) for an all-reduce, n-1 for the
 * others, of which the ring laid out node by node crosses the network nInterSteps =
 * 2(nodes-1), nodes-1 times; the others are NVLink hops, but no shorter than the network
 * post a step of a ring across nodes makes. With one rank a node every hop is the
 * network's, priced at the tree's network latency. */
static double ring_lat_us(int allreduce, int n, int nodes, int p) {
  const int nsteps = allreduce ? 2 * (n - 1) : n - 1;
  const int inter_steps = nodes <= 1 ? 0 : allreduce ? 2 * (nodes - 1) : nodes - 1;
  double intra = kNvlLatUs[NCCL_RING][p];
  if (nodes > 1) {
    const double post = NCCL_NET_OVERHEAD_US * (p == NCCL_SIMPLE ? 3.0 : 1.0);
    if (post > intra) intra = post;
  }
  const double inter = kNetLatUs[n == nodes ? NCCL_TREE : NCCL_RING][p];
  return kBaseLatUs[NCCL_RING][p] + (nsteps - inter_steps) * intra + inter_steps * inter;
}

/* The tree's (all-reduce only): up and down the chain of a node's n/nodes ranks and the
 * log2(nodes) levels of the tree across nodes. */
static double tree_lat_us(int n, int nodes, int p) {
  return kBaseLatUs[NCCL_TREE][p] +
         2.0 * ((n / nodes - 1) * kNvlLatUs[NCCL_TREE][p] + log2_floor(nodes) * kNetLatUs[NCCL_TREE][p]);
}

static double min2(double a, double b) { return a < b ? a : b; }

/* Whether NCCL version v (mp_stack_profile.nccl_version; 0 the newest) may run PAT on GPU
 * cc, and the share of the bus bandwidth its tuning model gives it; 0: no PAT. NCCL_ALGO_PAT
 * first ships in v2.23.4-1, the first 2.23 release (src/include/nccl_common.h; v2.22.3-1 has
 * no PAT); src/graph/tuning.cc, ncclPatEnable, from v2.23.4-1 to v2.30.7-1: one GPU a node
 * (nNodes == nRanks), Simple only, all-gather and reduce-scatter only, never widened; busBw
 * x .85 in v2.23.4-1, x .75 from v2.24.3-1; the minCompCap >= 60 check (CUDA atomics) from
 * v2.26.2-1. src/enqueue.cc (v2.23.4-1, v2.26.2-1, v2.27.7-1, v2.28.9-1, v2.30.7-1; the
 * algorithm loop of topoGetAlgoInfo) also skips PAT for a reduce-scatter whose device op is
 * PreMulSum or SumPostDiv: hostToDevRedOp makes ncclAvg PreMulSum (1/nRanks) on the float
 * types and SumPostDiv on the integers, and ncclRedOpCreatePreMulSum's ops are PreMulSum; the
 * caller's avg (mp_op.avg) says so. */
static double pat_bw_share(int v, int cc) {
  if (v == 0) v = 999999;
  if (v < 22300) return 0.0;
  if (v < 22400) return 0.85;
  if (v >= 22600 && cc < 60) return 0.0;
  return 0.75;
}

mp_status mp_sim_nccl_version_parse(mp_ctx *ctx, const char *text, int *version) {
  int part[3] = {0, 0, 0}, k = 0, ok = 1;
  const char *s = text;
  for (; ok && k < 3; k++) {
    long v = 0;
    const char *d = s;
    while (*s >= '0' && *s <= '9' && v < 1000) v = 10 * v + (*s++ - '0');
    ok = s > d && v <= 99 && (k > 0 || v >= 1);
    part[k] = (int)v;
    if (*s != '.' || k == 2) {
      k++;
      break;
    }
    s++;
  }
  if (!ok || k < 2 || *s)
    return mp_error(ctx, MP_ERR_USAGE, "NCCL version '%s': give X.Y or X.Y.Z as NCCL numbers its releases "
                    "(e.g. 2.21.5 or 2.23), each part below 100", text);
  *version = part[0] * 10000 + part[1] * 100 + part[2];
  return MP_OK;
}

double mp_sim_nccl_collective_s(mp_coll c, double bytes, int n, const mp_sim_link *l, double bw_GBps,
                                const mp_gpu *g, int nccl_version, int avg) {
  const int ring_coll = c == MP_COLL_ALL_REDUCE || c == MP_COLL_ALL_GATHER || c == MP_COLL_REDUCE_SCATTER;
  if (!ring_coll || n <= 1 || bw_GBps <= 0) return mp_sim_collective_s(c, bytes, n, bw_GBps, l->lat_s);
  /* a pair of the group (its first and last pipeline stages) spans two nodes when it does */
  mp_sim_link pair = *l;
  if (n != l->n) {
    pair.n = n;
    pair.nodes = l->nodes > 1 ? 2 : 1;
    pair.per_node = l->nodes > 1 ? 1 : 2;
  }
  const int nodes = pair.nodes > 1 ? pair.nodes : 1, ar = c == MP_COLL_ALL_REDUCE;
  const int cc = g->compute_capability;
  const int ci = cc >= 100 ? 3 : cc >= 90 ? 2 : cc >= 80 ? 1 : 0, ni = nodes <= 2 ? nodes - 1 : 2;
  const double ch = mp_sim_nccl_ring_channels(g, &pair, 0);
  const double ll_max = kLlMaxBw[nodes == 1 ? ci : 0][ni];
  const int no_pat = ar || (avg && c == MP_COLL_REDUCE_SCATTER) || pair.per_node != 1 || nodes <= 1;
  const double pat_share = no_pat ? 0.0 : pat_bw_share(nccl_version, cc);
  /* the ring's bus bandwidth moves (n-1)/n of the bytes a step pattern, twice for an
   * all-reduce; the tree's moves them twice (up and down) */
  const double ring_bytes = (ar ? 2.0 : 1.0) * (n - 1) / n * bytes, tree_bytes = 2.0 * bytes;
  /* treeCorrectionFactor's row: log2(bytes / 64), none under 64 bytes */
  const int lg = bytes >= 64.0 ? log2_floor(bytes / 64.0) : -1;
  double best = -1.0;
  for (int p = 0; p < NCCL_NPROTO; p++) {
    /* LL128 is on by default from sm70 over NVLink and GPU-Direct NICs */
    if (p == NCCL_LL128 && cc < 70) continue;
    double bw = bw_GBps; /* Simple's: the link's, which the stack's efficiency measures */
    if (p == NCCL_LL) bw = min2(ll_max, 0.5 * bw_GBps);
    if (p == NCCL_LL128) bw = min2(0.92 * bw_GBps, ch * kRingLl128ChBw[ci]);
    double lat = ring_lat_us(ar, n, nodes, p);
    /* the ring's plateau: an inter-node Simple all-reduce of 64 bytes or more a channel
     * and rank waits 1.4x its latency (sm80 and later; 1.9x before) */
    if (ar && p == NCCL_SIMPLE && nodes > 1 && bytes / (ch * n) >= 64.0) lat *= cc >= 80 ? 1.4 : 1.9;
    double t = lat * 1e-6 + ring_bytes / (bw * 1e9);
    /* PAT (pat_bw_share), Simple only, for an all-gather or reduce-scatter of one rank a
     * node: 8 us + log2(nodes) x net / 3.5 + 2.8 us a rank, the whole bytes at its share of bw */
    if (p == NCCL_SIMPLE && pat_share > 0) {
      const double pat = (8.0 + log2_floor(nodes) * kNetLatUs[NCCL_TREE][p] / 3.5 + 2.8 * n) * 1e-6 +
                         bytes / (pat_share * bw_GBps * 1e9);
      if (pat < t) t = pat;
    }
    if (best < 0 || t < best) best = t;
    if (!ar) continue;
    double tb = min2(0.92 * bw_GBps, ch * kTreeChBw[ci][ni]);
    if (p == NCCL_LL) tb = min2(tb / 3.8, ll_max);
    if (p == NCCL_LL128) tb = min2(tb * (nodes == 1 ? 7.0 / 9.0 : 120.0 / 128.0), ch * kTreeLl128ChBw[ci][ni]);
    if (lg >= 0 && lg < 23) tb *= kTreeCorrection[p][lg];
    const double tt = tree_lat_us(n, nodes, p) * 1e-6 + tree_bytes / (tb * 1e9);
    if (tt < best) best = tt;
  }
  return best;
}
