// exec/cluster.h: every GPU and cluster profile loads; mp_cluster_make; unknown names.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "data/embedded.h"
#include "sim/cluster.h"

namespace {

bool Contains(const std::string &s, const std::string &sub) {
  return s.find(sub) != std::string::npos;
}

TEST(Cluster, DtypeBytesAndNames) {
  EXPECT_EQ(mp_dtype_bytes(MP_DTYPE_FP32), 4);
  EXPECT_EQ(mp_dtype_bytes(MP_DTYPE_TF32), 4);
  EXPECT_EQ(mp_dtype_bytes(MP_DTYPE_BF16), 2);
  EXPECT_EQ(mp_dtype_bytes(MP_DTYPE_FP16), 2);
  EXPECT_EQ(mp_dtype_bytes(MP_DTYPE_FP8_E4M3), 1);
  EXPECT_EQ(mp_dtype_bytes(MP_DTYPE_FP8_E5M2), 1);
  EXPECT_STREQ(mp_dtype_name(MP_DTYPE_BF16), "bf16");
  EXPECT_STREQ(mp_dtype_name(MP_DTYPE_FP8_E4M3), "fp8_e4m3");
}

// The names ../shared/validation/ uses, the GPUs people rent, plus the CPU profile.
TEST(Cluster, EveryGpuProfileLoads) {
  for (const char *name : {"a100-80gb-sxm", "a100-40gb-sxm", "h100-sxm", "h100-pcie", "h100-nvl", "h100-96gb-500w",
                           "h200", "h800", "b200", "gb200", "l40s", "mi300x", "cpu"})
    EXPECT_NE(mp_data_find("gpus", name), nullptr) << name;
  size_t n = 0;
  const mp_data_entry *e = mp_data_entries(&n);
  int gpus = 0;
  for (size_t i = 0; i < n; i++) {
    if (strcmp(e[i].kind, "gpus") != 0) continue;
    gpus++;
    SCOPED_TRACE(e[i].name);
    mp_ctx ctx;
    mp_ctx_init(&ctx);
    mp_gpu g;
    ASSERT_EQ(mp_gpu_load(&ctx, e[i].name, &g), MP_OK) << mp_errmsg(&ctx);
    EXPECT_STREQ(g.name, e[i].name);  // the file's name matches its stem
    EXPECT_GT(g.peak_tflops[MP_DTYPE_BF16], 0);
    EXPECT_GT(g.peak_tflops[MP_DTYPE_FP32], 0);
    EXPECT_GT(g.mem_gib, 0);
    EXPECT_GT(g.hbm_GBps, 0);
    EXPECT_GT(g.nvlink_GBps_per_dir, 0);
    EXPECT_GT(strlen(g.source), 0u);  // every hardware figure carries its source
    EXPECT_EQ(g.peak_tflops[MP_DTYPE_FP8_E4M3], g.peak_tflops[MP_DTYPE_FP8_E5M2]);
    if (strcmp(e[i].name, "cpu") != 0) {
      // a CUDA GPU names its compute capability; one without CUDA (ROCm) is no CPU
      if (mp_gpu_api_of(&g) == MP_GPU_API_CUDA) EXPECT_GE(g.compute_capability, 80);
      else EXPECT_EQ(mp_gpu_api_of(&g), MP_GPU_API_ROCM);
      EXPECT_FALSE(mp_gpu_is_cpu(&g));
      EXPECT_GT(g.kernel_eff.bf16_gemm, 0);  // measured, or borrowed with the reason stated
      // Tensor-core GPUs: bf16 dense peak well above fp32, fp8 at least bf16 where given.
      EXPECT_GT(g.peak_tflops[MP_DTYPE_BF16], g.peak_tflops[MP_DTYPE_FP32]);
    }
  }
  EXPECT_GE(gpus, 11);
}

// The datasheets' dense figures of the GPUs people rent (the sparse ones halved), and what
// the runtime can drive: NVIDIA A100 40GB SXM (312 bf16, 40 GB HBM2 at 1,555 GB/s, NVLink
// 600 GB/s both ways), H100 PCIe (1,513 sparse bf16 -> 756.5, 2 TB/s, PCIe Gen5 128 GB/s
// both ways between the node's cards), H100 NVL (1,671 -> 835.5, 94 GB at 3.9 TB/s), L40S
// (733 -> 362.05 bf16 (the datasheet's own dense figure), 1,466 -> 733 fp8, 48 GB GDDR6 at
// 864 GB/s, PCIe Gen4 64 GB/s both ways, sm_89), AMD MI300X (1,307.4 bf16, 2,614.9 fp8,
// 192 GB HBM3 at 5.3 TB/s, Infinity Fabric 896 GB/s aggregate both ways, no CUDA).
TEST(Cluster, RentedGpusFromTheirDatasheets) {
  struct Want {
    const char *name;
    double bf16, fp8, mem, hbm, link;
    int cc;
    mp_gpu_api api;
  } want[] = {{"a100-40gb-sxm", 312, 0, 40, 1555, 300, 80, MP_GPU_API_CUDA},
              {"h100-pcie", 756.5, 1513, 80, 2000, 64, 90, MP_GPU_API_CUDA},
              {"h100-nvl", 835.5, 1670.5, 94, 3900, 64, 90, MP_GPU_API_CUDA},
              // NVIDIA H800 datasheet (SXM5): the H100 SXM's compute, NVLink 400 GB/s both ways
              {"h800", 989.4, 1978.9, 80, 3350, 200, 90, MP_GPU_API_CUDA},
              {"l40s", 362.05, 733, 48, 864, 32, 89, MP_GPU_API_CUDA},
              // NVIDIA GB200 NVL72 datasheet: the rack's sparse figures / 2 / 72 GPUs
              {"gb200", 2500, 5000, 186, 8000, 900, 100, MP_GPU_API_CUDA},
              // NVIDIA DGX B200 datasheet (2,250 / 4,500 dense), HGX B200: 180 GB at 7.7 TB/s
              {"b200", 2250, 4500, 180, 7700, 900, 100, MP_GPU_API_CUDA},
              {"mi300x", 1307.4, 2614.9, 192, 5300, 448, 0, MP_GPU_API_ROCM}};
  for (const Want &w : want) {
    SCOPED_TRACE(w.name);
    mp_ctx ctx;
    mp_ctx_init(&ctx);
    mp_gpu g;
    ASSERT_EQ(mp_gpu_load(&ctx, w.name, &g), MP_OK) << mp_errmsg(&ctx);
    EXPECT_DOUBLE_EQ(g.peak_tflops[MP_DTYPE_BF16], w.bf16);
    EXPECT_DOUBLE_EQ(g.peak_tflops[MP_DTYPE_FP8_E4M3], w.fp8);
    EXPECT_DOUBLE_EQ(g.mem_gib, w.mem);
    EXPECT_DOUBLE_EQ(g.hbm_GBps, w.hbm);
    EXPECT_DOUBLE_EQ(g.nvlink_GBps_per_dir, w.link);
    EXPECT_EQ(g.compute_capability, w.cc);
    EXPECT_EQ(mp_gpu_api_of(&g), w.api);
    EXPECT_EQ(mp_gpu_runtime_drives(&g), w.api == MP_GPU_API_CUDA);
    EXPECT_EQ(mp_gpu_has_float8(&g), w.fp8 > 0);
  }
  // the runtime's CUDA stack is refused on a GPU without CUDA, by name
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_gpu g;
  ASSERT_EQ(mp_gpu_load(&ctx, "mi300x", &g), MP_OK);
  EXPECT_EQ(mp_gpu_check_cuda(&ctx, &g, "meshplan's CUDA runtime"), MP_ERR_USAGE);
  EXPECT_TRUE(Contains(mp_errmsg(&ctx), "GPU mi300x has no CUDA (rocm): meshplan's CUDA runtime cannot drive it"))
      << mp_errmsg(&ctx);
  ASSERT_EQ(mp_gpu_load(&ctx, "h100-pcie", &g), MP_OK);
  EXPECT_EQ(mp_gpu_check_cuda(&ctx, &g, "meshplan's CUDA runtime"), MP_OK);
  // "api" is cuda, rocm or cpu, and cuda needs its compute capability
  const char *base = "{\"name\": \"g\", \"peak_tflops\": {\"bf16\": 100, \"fp32\": 10}, \"mem_gib\": 16, "
                     "\"hbm_GBps\": 100, \"nvlink_GBps_per_dir\": 10, ";
  EXPECT_EQ(mp_gpu_from_text(&ctx, (std::string(base) + "\"api\": \"metal\"}").c_str(), "g.json", &g),
            MP_ERR_INVALID);
  EXPECT_TRUE(Contains(mp_errmsg(&ctx), "g.json: api = 'metal'; accepted cuda, rocm or cpu")) << mp_errmsg(&ctx);
  EXPECT_EQ(mp_gpu_from_text(&ctx, (std::string(base) + "\"api\": \"cuda\"}").c_str(), "g.json", &g),
            MP_ERR_INVALID);
  EXPECT_TRUE(Contains(mp_errmsg(&ctx), "api cuda needs its compute_capability")) << mp_errmsg(&ctx);
}

TEST(Cluster, H100FiguresFromTheDatasheet) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_gpu g;
  ASSERT_EQ(mp_gpu_load(&ctx, "h100-sxm", &g), MP_OK) << mp_errmsg(&ctx);
  // NVIDIA H100 SXM5 datasheet, dense: 989.4 TFLOP/s bf16, 80 GB HBM3 at 3.35 TB/s,
  // NVLink 4 900 GB/s bidirectional = 450 per direction.
  EXPECT_DOUBLE_EQ(g.peak_tflops[MP_DTYPE_BF16], 989.4);
  EXPECT_DOUBLE_EQ(g.mem_gib, 80.0);
  EXPECT_DOUBLE_EQ(g.hbm_GBps, 3350.0);
  EXPECT_DOUBLE_EQ(g.nvlink_GBps_per_dir, 450.0);
  EXPECT_EQ(g.compute_capability, 90);
}

// A GPU profile by name, loaded or the test failed.
static mp_gpu LoadGpu(const char *name) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_gpu g;
  memset(&g, 0, sizeof g);
  EXPECT_EQ(mp_gpu_load(&ctx, name, &g), MP_OK) << mp_errmsg(&ctx);
  return g;
}

// The SM counts the collectives' SM contention divides (sim/engine.c): the H100 SXM5's 132
// of the GH100's 144 (NVIDIA H100 architecture whitepaper); the B200's two dies of 80 SMs
// with 74 enabled on each, 2 x 74 = 148 (Chips and Cheese, "Nvidia's B200: Keeping the CUDA
// Juggernaut Rolling", 2025); the GB300's 160 (NVIDIA Technical Blog, Inside NVIDIA Blackwell
// Ultra, 2025: 160 SMs across its two dies). The GB200 profile cites no count for its part
// and states none, so no contention is priced on it.
TEST(Cluster, SmCountsFromTheirSources) {
  struct { const char *gpu; int sms; } want[] = {
      {"h100-sxm", 132}, {"b200", 2 * 74}, {"gb200", 0}, {"gb300", 160}};
  for (auto &w : want) {
    SCOPED_TRACE(w.gpu);
    EXPECT_EQ(LoadGpu(w.gpu).sms, w.sms);
  }
}

TEST(Cluster, EveryClusterProfileLoads) {
  size_t n = 0;
  const mp_data_entry *e = mp_data_entries(&n);
  int clusters = 0;
  for (size_t i = 0; i < n; i++) {
    if (strcmp(e[i].kind, "clusters") != 0) continue;
    clusters++;
    SCOPED_TRACE(e[i].name);
    mp_ctx ctx;
    mp_ctx_init(&ctx);
    mp_cluster c;
    ASSERT_EQ(mp_cluster_load(&ctx, e[i].name, &c), MP_OK) << mp_errmsg(&ctx);
    EXPECT_STREQ(c.name, e[i].name);
    EXPECT_GT(c.gpus_per_node, 0);
    EXPECT_GT(c.n_nodes, 0);
    EXPECT_EQ(mp_cluster_n_gpus(&c), c.gpus_per_node * c.n_nodes);
    EXPECT_GT(c.intra_node_GBps_per_gpu, 0);
    EXPECT_GT(c.inter_node_Gbitps_per_gpu, 0);
    EXPECT_GT(c.intra_node_latency_us, 0);
    EXPECT_GT(c.inter_node_latency_us, 0);
    EXPECT_GT(c.gpu.mem_gib, 0);  // the GPU it names was loaded
  }
  EXPECT_GE(clusters, 2);
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_cluster c;
  ASSERT_EQ(mp_cluster_load(&ctx, "h100-8", &c), MP_OK) << mp_errmsg(&ctx);
  EXPECT_EQ(mp_cluster_n_gpus(&c), 8);
  EXPECT_STREQ(c.gpu.name, "h100-sxm");
  // 400 Gbit/s per GPU is 50 GB/s.
  EXPECT_DOUBLE_EQ(mp_cluster_inter_GBps(&c), c.inter_node_Gbitps_per_gpu / 8.0);
  ASSERT_EQ(mp_cluster_load(&ctx, "cpu-local", &c), MP_OK) << mp_errmsg(&ctx);
  EXPECT_STREQ(c.gpu.name, "cpu");
}

TEST(Cluster, MakeFromAGpuName) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_cluster c;
  ASSERT_EQ(mp_cluster_make(&ctx, "h200", 64, 8, &c), MP_OK) << mp_errmsg(&ctx);
  EXPECT_EQ(c.gpus_per_node, 8);
  EXPECT_EQ(c.n_nodes, 8);
  EXPECT_EQ(mp_cluster_n_gpus(&c), 64);
  EXPECT_STREQ(c.gpu.name, "h200");
  EXPECT_EQ(c.intra_node_GBps_per_gpu, c.gpu.nvlink_GBps_per_dir);
  EXPECT_DOUBLE_EQ(c.inter_node_Gbitps_per_gpu, 400.0);
  EXPECT_DOUBLE_EQ(mp_cluster_inter_GBps(&c), 50.0);
  EXPECT_STREQ(c.name, "64xh200");
  // Fewer GPUs than a node: one partial node.
  ASSERT_EQ(mp_cluster_make(&ctx, "a100-80gb-sxm", 4, 8, &c), MP_OK) << mp_errmsg(&ctx);
  EXPECT_EQ(c.gpus_per_node, 4);
  EXPECT_EQ(c.n_nodes, 1);
}

TEST(Cluster, MakeRejectsPartialNodesAndNonPositiveCounts) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_cluster c;
  EXPECT_EQ(mp_cluster_make(&ctx, "h100-sxm", 12, 8, &c), MP_ERR_INVALID);
  EXPECT_TRUE(Contains(mp_errmsg(&ctx), "--gpus=12 is not a multiple of --gpus-per-node=8"))
      << mp_errmsg(&ctx);
  EXPECT_EQ(mp_cluster_make(&ctx, "h100-sxm", 0, 8, &c), MP_ERR_INVALID);
  EXPECT_EQ(mp_cluster_make(&ctx, "h100-sxm", 8, 0, &c), MP_ERR_INVALID);
  EXPECT_EQ(mp_cluster_make(&ctx, "v100", 8, 8, &c), MP_ERR_NOT_FOUND);
  EXPECT_TRUE(Contains(mp_errmsg(&ctx), "unknown GPU 'v100'")) << mp_errmsg(&ctx);
}

// A GPU is found by its profile's stem ignoring case and the separators - _ . and space,
// and by the datasheet names published measurements use (memory, form factor, power limit
// spelled out); the profile loaded is the part's own.
TEST(Cluster, GpuByItsOtherNames) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_gpu g;
  const char *const want[][2] = {{"H100-SXM", "h100-sxm"},          {"h100-80gb-sxm", "h100-sxm"},
                                 {"H100_80GB_SXM", "h100-sxm"},     {"h100 sxm5", "h100-sxm"},
                                 {"h100-94gb-500w", "h100-96gb-500w"}, {"A100-SXM4-80GB", "a100-80gb-sxm"},
                                 {"h200-141gb-sxm", "h200"},        {"B200", "b200"},
                                 // the names people rent them by
                                 {"h100", "h100-sxm"},              {"H100", "h100-sxm"},
                                 {"a100", "a100-80gb-sxm"},         {"a100-40gb", "a100-40gb-sxm"},
                                 {"H100 PCIe", "h100-pcie"},        {"h100-nvl", "h100-nvl"},
                                 {"h200", "h200"},                  {"L40S", "l40s"},
                                 {"MI300X", "mi300x"},              {"H800-SXM5", "h800"}};
  for (const auto &w : want) {
    ASSERT_EQ(mp_gpu_load(&ctx, w[0], &g), MP_OK) << w[0] << ": " << mp_errmsg(&ctx);
    EXPECT_STREQ(g.name, w[1]) << w[0];
  }
  // a name alike to none stays unknown, and the message lists the profiles and names the
  // common and datasheet forms
  EXPECT_EQ(mp_gpu_load(&ctx, "h100-sxm6", &g), MP_ERR_NOT_FOUND);
  EXPECT_TRUE(Contains(mp_errmsg(&ctx), "known: a100-40gb-sxm, a100-80gb-sxm")) << mp_errmsg(&ctx);
  EXPECT_TRUE(Contains(mp_errmsg(&ctx), "mi300x")) << mp_errmsg(&ctx);
  EXPECT_TRUE(Contains(mp_errmsg(&ctx), "or a common or datasheet name such as h100, a100 or h100-80gb-sxm"))
      << mp_errmsg(&ctx);
}

TEST(Cluster, UnknownNamesListTheKnownOnes) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_gpu g;
  EXPECT_EQ(mp_gpu_load(&ctx, "h1000", &g), MP_ERR_NOT_FOUND);
  std::string m = mp_errmsg(&ctx);
  EXPECT_TRUE(Contains(m, "unknown GPU 'h1000'")) << m;
  EXPECT_TRUE(Contains(m, "h100-sxm")) << m;
  EXPECT_TRUE(Contains(m, "b200")) << m;
  mp_cluster c;
  EXPECT_EQ(mp_cluster_load(&ctx, "h100-9", &c), MP_ERR_NOT_FOUND);
  m = mp_errmsg(&ctx);
  EXPECT_TRUE(Contains(m, "unknown cluster 'h100-9'")) << m;
  EXPECT_TRUE(Contains(m, "h100-8")) << m;
  EXPECT_EQ(mp_gpu_load(&ctx, "/no/such/gpu.json", &g), MP_ERR_NOT_FOUND);
  EXPECT_TRUE(Contains(mp_errmsg(&ctx), "/no/such/gpu.json")) << mp_errmsg(&ctx);
}

// Hostile profiles: each field outside its range is refused with one line naming it, its
// value and the range (exec/cluster.h). The zero link bandwidth (communication
// costed as free) and negative latency (a negative step time ranked first) among them.
TEST(Cluster, OutOfRangeClusterFieldsAreRefused) {
  const std::string head = "{\"name\": \"x\", \"gpu\": \"h100-sxm\", ";
  struct { std::string body, want; } cases[] = {
      {"\"gpus_per_node\": 8, \"n_nodes\": 1, \"intra_node_GBps_per_gpu\": 0, \"inter_node_Gbitps_per_gpu\": 400}",
       "c.json: intra_node_GBps_per_gpu = 0 is out of range; accepted (0, 100000]"},
      {"\"gpus_per_node\": 8, \"n_nodes\": 2, \"intra_node_GBps_per_gpu\": 450, \"inter_node_Gbitps_per_gpu\": 0}",
       "c.json: inter_node_Gbitps_per_gpu = 0 is out of range; accepted (0, 100000]"},
      {"\"gpus_per_node\": 8, \"n_nodes\": 2, \"intra_node_GBps_per_gpu\": 450, \"inter_node_Gbitps_per_gpu\": 400,"
       " \"inter_node_latency_us\": -5}",
       "c.json: inter_node_latency_us = -5 is out of range; accepted [0, 1e+06]"},
      {"\"gpus_per_node\": 8, \"n_nodes\": 2, \"intra_node_GBps_per_gpu\": 450, \"inter_node_Gbitps_per_gpu\": 1e999}",
       "c.json: key 'inter_node_Gbitps_per_gpu': expected a finite number, got inf"},
      {"\"gpus_per_node\": 4096, \"n_nodes\": 1048576, \"intra_node_GBps_per_gpu\": 450, \"inter_node_Gbitps_per_gpu\": 400}",
       "c.json: gpus_per_node x n_nodes = 4294967296 GPUs is out of range; accepted 1..1048576"},
      {"\"gpus_per_node\": 0, \"n_nodes\": 1, \"intra_node_GBps_per_gpu\": 450, \"inter_node_Gbitps_per_gpu\": 400}",
       "c.json: gpus_per_node = 0 is out of range; accepted 1..4096"},
      {"\"gpus_per_node\": 8, \"n_nodes\": 1, \"intra_node_GBps_per_gpu\": 450, \"inter_node_Gbitps_per_gpu\": 400,"
       " \"price_per_gpu_hour\": -1}",
       "c.json: price_per_gpu_hour = -1 is out of range; accepted [0, 10000]"},
  };
  for (auto &c : cases) {
    mp_ctx ctx;
    mp_ctx_init(&ctx);
    mp_cluster cl;
    std::string text = head + c.body;
    EXPECT_EQ(mp_cluster_from_text(&ctx, text.c_str(), "c.json", &cl), MP_ERR_INVALID) << c.want;
    EXPECT_EQ(std::string(mp_errmsg(&ctx)).find(c.want), 0u) << mp_errmsg(&ctx);
  }
}

TEST(Cluster, OutOfRangeGpuFieldsAreRefused) {
  const std::string ok_peaks = "\"peak_tflops\": {\"bf16\": 989, \"fp32\": 67}, ";
  struct { std::string text, want; } cases[] = {
      {"{\"name\": \"g\", \"peak_tflops\": {\"bf16\": -1, \"fp32\": 67}, \"mem_gib\": 80,"
       " \"hbm_GBps\": 3350, \"nvlink_GBps_per_dir\": 450}",
       "g.json: peak_tflops.bf16 = -1 is out of range; accepted (0, 100000]"},
      {"{\"name\": \"g\", " + ok_peaks + "\"mem_gib\": 80, \"hbm_GBps\": 3350, \"nvlink_GBps_per_dir\": 0}",
       "g.json: nvlink_GBps_per_dir = 0 is out of range; accepted (0, 100000]"},
      {"{\"name\": \"g\", " + ok_peaks + "\"mem_gib\": 80, \"hbm_GBps\": 3350, \"nvlink_GBps_per_dir\": 450,"
       " \"runtime_overhead_gib\": 80}",
       "g.json: runtime_overhead_gib = 80 is out of range; accepted [0, 80)"},
      {"{\"name\": \"g\", " + ok_peaks + "\"mem_gib\": 1e6, \"hbm_GBps\": 3350, \"nvlink_GBps_per_dir\": 450}",
       "g.json: mem_gib = 1e+06 is out of range; accepted (0, 65536]"},
      {"{\"name\": \"g\", " + ok_peaks + "\"mem_gib\": 80, \"hbm_GBps\": 3350, \"nvlink_GBps_per_dir\": 450,"
       " \"compute_capability\": 9000}",
       "g.json: compute_capability = 9000 is out of range; accepted 0..200"},
  };
  for (auto &c : cases) {
    mp_ctx ctx;
    mp_ctx_init(&ctx);
    mp_gpu g;
    EXPECT_EQ(mp_gpu_from_text(&ctx, c.text.c_str(), "g.json", &g), MP_ERR_INVALID) << c.want;
    EXPECT_EQ(std::string(mp_errmsg(&ctx)), c.want);
  }
}

// The fractions of peak the reference kernels reach, as the GPU profiles cite them: bf16
// GEMMs as cuBLAS sustains them on random data under the part's power limit (an 8192^3
// torch.matmul on N(0,1) inputs: He 2024 on the A100, meshplan's power probe on the 700 W
// H100), float8 GEMMs as Bekman's MAMF table bursts them, FlashAttention-2 on the A100
// (Dao 2023: 50-73 %, 0.62 stated) and on the H100 (Shah et al. 2024: 35 %); on Blackwell
// the tensor-core part of cuDNN's fused attention, its exponentials priced apart.
TEST(Cluster, KernelFractionsFromTheirSources) {
  struct { const char *gpu; double bf16, fp8, flash; } want[] = {
      {"a100-80gb-sxm", 0.824, 0.0, 0.62},  // 257 / 312; no fp8 units
      {"h100-sxm", 0.685, 0.709, 0.35},     // 678 / 989.4; 1402.6 / 1979
      {"h100-96gb-500w", 0.685, 0.709, 0.35},  // the same silicon and kernels as the SXM
      {"h200", 0.685, 0.734, 0.35},         // the same die and limit as the SXM; 1453.4 / 1979
      {"b200", 0.602, 0.624, 0.400},        // the H100's x 2.0 (GEMMs) / 2.274; cuDNN's: below
      {"gb200", 0.602, 0.624, 0.400},       // the B200's: the same die
  };
  for (auto &w : want) {
    SCOPED_TRACE(w.gpu);
    const mp_gpu g = LoadGpu(w.gpu);
    EXPECT_DOUBLE_EQ(g.kernel_eff.bf16_gemm, w.bf16);
    EXPECT_DOUBLE_EQ(g.kernel_eff.fp8_gemm, w.fp8);
    EXPECT_DOUBLE_EQ(g.kernel_eff.flash_attention, w.flash);
    EXPECT_NE(strstr(mp_data_find("gpus", w.gpu), "\"kernel_eff\": {"), nullptr);
  }
  // the CPU profile states none: no stack is carried to or from it
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_gpu cpu;
  ASSERT_EQ(mp_gpu_load(&ctx, "cpu", &cpu), MP_OK) << mp_errmsg(&ctx);
  EXPECT_EQ(cpu.kernel_eff.bf16_gemm, 0.0);
  EXPECT_EQ(cpu.kernel_eff.flash_attention, 0.0);
}

// The B200's fractions are the H100's times the speed of the same library's kernels on the
// two GPUs over the ratio of their peaks: cuBLAS's BF16 and FP8 GEMMs run up to 2x as fast
// on the B200 as on the H100 (ThunderKittens on Blackwell, Hazy Research 2025; cuBLAS 12.9's
// FP4 at 4.6x Hopper's FP8 and 2.3x the B200's), where the peaks differ by 2250 / 989.4 =
// 4500 / 1978.9. The attention the stacks call is cuDNN's (Transformer Engine prefers it on
// Hopper and later): cuDNN 9.19.1 runs Llama 3.1's causal attention at sequence 8192,
// forward + backward, in 6.791 ms on the H200 (the H100's SMs at its peak) and 2.785 ms on
// the GB200, of which the GB300, with twice the exponential rate at the same peak, saves
// 0.217 ms, half the GB200's exposed exponentials: 2.351 ms of tensor-core work (cudnn-frontend
// sdpa_benchmark_training, df73764). flash_attention is that part: 0.35 x (6.791 / 2.351) /
// (2500 / 989.4) = 0.4001, the same fraction of the B200's peak.
TEST(Cluster, BlackwellFractionsAreTheH100sAtTheSameLibrariesSpeed) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_gpu h, b;
  ASSERT_EQ(mp_gpu_load(&ctx, "h100-sxm", &h), MP_OK) << mp_errmsg(&ctx);
  ASSERT_EQ(mp_gpu_load(&ctx, "b200", &b), MP_OK) << mp_errmsg(&ctx);
  const double bf16_peaks = 2250.0 / 989.4, fp8_peaks = 4500.0 / 1978.9;
  // the profiles state three digits: 0.685 x 0.8795 = 0.6024, 0.709 x 0.8795 = 0.6236,
  // 0.35 x 2.8886 / 2.5268 = 0.4001
  const double cudnn_tc = 6.791 / 2.351;
  EXPECT_NEAR(b.kernel_eff.bf16_gemm, 0.685 * 2.0 / bf16_peaks, 5e-4);
  EXPECT_NEAR(b.kernel_eff.fp8_gemm, 0.709 * 2.0 / fp8_peaks, 5e-4);
  EXPECT_NEAR(b.kernel_eff.flash_attention, 0.35 * cudnn_tc / (2500.0 / 989.4), 5e-4);
  // what a prediction sees: the B200's GEMM seconds per FLOP at half the H100's, its
  // attention's tensor-core part at 1 / 2.599 (0.400 x 2250 / (0.35 x 989.4)), the cuDNN
  // ratio at the B200's lower peak: 2.8886 x 2250 / 2500
  EXPECT_NEAR(b.peak_tflops[MP_DTYPE_BF16] * b.kernel_eff.bf16_gemm /
                  (h.peak_tflops[MP_DTYPE_BF16] * h.kernel_eff.bf16_gemm), 2.0, 2e-3);
  EXPECT_NEAR(b.peak_tflops[MP_DTYPE_FP8_E4M3] * b.kernel_eff.fp8_gemm /
                  (h.peak_tflops[MP_DTYPE_FP8_E4M3] * h.kernel_eff.fp8_gemm), 2.0, 2e-3);
  EXPECT_NEAR(b.peak_tflops[MP_DTYPE_BF16] * b.kernel_eff.flash_attention /
                  (h.peak_tflops[MP_DTYPE_BF16] * h.kernel_eff.flash_attention), cudnn_tc * 2250.0 / 2500.0, 2e-3);
}

TEST(Cluster, BadKernelFractionsAreRefused) {
  const std::string head = "{\"name\": \"g\", \"peak_tflops\": {\"bf16\": 989, \"fp32\": 67%s}, "
                           "\"mem_gib\": 80, \"hbm_GBps\": 3350, \"nvlink_GBps_per_dir\": 450, ";
  auto gpu = [&](const std::string &fp8, const std::string &ke) {
    std::string h = head;
    h.replace(h.find("%s"), 2, fp8);
    return h + "\"kernel_eff\": " + ke + "}";
  };
  const std::string src = ", \"source\": \"s\"}";
  struct { std::string text, want; } cases[] = {
      {gpu("", "{\"bf16_gemm\": 1.5, \"flash_attention\": 0.3" + src),
       "g.json: kernel_eff.bf16_gemm = 1.5 is out of range; accepted (0, 1]"},
      {gpu("", "{\"bf16_gemm\": 0.8, \"flash_attention\": 0" + src),
       "g.json: kernel_eff.flash_attention = 0 is out of range; accepted (0, 1]"},
      {gpu("", "{\"bf16_gemm\": 0.8" + src), "g.json: kernel_eff: missing required key 'flash_attention'"},
      {gpu(", \"fp8\": 1979", "{\"bf16_gemm\": 0.8, \"flash_attention\": 0.3" + src),
       "g.json: kernel_eff: missing required key 'fp8_gemm'"},
      {gpu("", "{\"bf16_gemm\": 0.8, \"fp8_gemm\": 0.7, \"flash_attention\": 0.3" + src),
       "g.json: kernel_eff.fp8_gemm = 0.7 but peak_tflops.fp8 is 0 (no float8 units); drop kernel_eff.fp8_gemm "
       "or state the fp8 peak"},
      {gpu("", "{\"bf16_gemm\": 0.8, \"flash_attention\": 0.3}"),
       "g.json: kernel_eff: missing 'source': name the measurements the kernel fractions come from"},
      {gpu("", "0.8"), "g.json: 'kernel_eff' must be an object of bf16_gemm, fp8_gemm, flash_attention and source"},
  };
  for (auto &c : cases) {
    mp_ctx ctx;
    mp_ctx_init(&ctx);
    mp_gpu g;
    EXPECT_EQ(mp_gpu_from_text(&ctx, c.text.c_str(), "g.json", &g), MP_ERR_INVALID) << c.text;
    EXPECT_EQ(std::string(mp_errmsg(&ctx)), c.want) << c.text;
  }
  // a GPU profile without kernel_eff loads, stating none
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_gpu g;
  std::string none = head;
  none.replace(none.find("%s"), 2, "");
  none.replace(none.rfind(", "), 2, "}");
  ASSERT_EQ(mp_gpu_from_text(&ctx, none.c_str(), "g.json", &g), MP_OK) << mp_errmsg(&ctx) << none;
  EXPECT_EQ(g.kernel_eff.bf16_gemm, 0.0);
}

TEST(Cluster, MakeBoundsTheGpuCount) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_cluster c;
  EXPECT_EQ(mp_cluster_make(&ctx, "h100-sxm", int64_t(1) << 21, 8, &c), MP_ERR_INVALID);
  EXPECT_STREQ(mp_errmsg(&ctx), "--gpus = 2097152 is out of range; accepted 1..1048576");
  EXPECT_EQ(mp_cluster_make(&ctx, "h100-sxm", 1 << 20, 8, &c), MP_OK) << mp_errmsg(&ctx);
  EXPECT_EQ(mp_cluster_n_gpus(&c), 1 << 20);
}

}  // namespace
