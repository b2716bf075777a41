// The checkpoint reader's boxes (exec/runtime/ckpt.h, mp_ckpt_read_box) in one process,
// against a checkpoint written by hand: every element's value is its global index, so a
// box read under any mesh can be checked element by element without the writer.
//
// Tensors (fp32), and how their shards cut them (as the meshes that write them do):
//   w [7, 9]      rows [0, 3) x cols [0, 4), rows [0, 3) x cols [4, 9) (a rowwise TP split:
//                 the second shard starts mid-row), rows [3, 7) x all cols (an uneven FSDP
//                 split: 3 rows, then 4);
//   e [3, 5, 4]   experts [0, 2) whole, then expert 2 split at row 2 of 5 (rows [0, 2) and
//                 [2, 5)): shards starting mid-matrix;
//   b [10]        [0, 4), [4, 10) (a padded FSDP shard's real part).
// chunk_bytes is 12 (3 floats), so rows of 4 or 5 floats cross checksum chunks.
// value(w[i][j]) = 1000 + 100 i + j, value(e[x][i][j]) = 2000 + 100 x + 10 i + j,
// value(b[i]) = 3000 + i.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "exec/runtime/ckpt.h"
#include "tests/runtime/file_util.h"

namespace {

struct Box {
  int64_t off[3], len[3];
};

struct Tensor {
  const char *name;
  int ndim;
  int64_t shape[3];
  std::vector<Box> shards;
  float (*value)(int64_t, int64_t, int64_t);
};

float WVal(int64_t i, int64_t j, int64_t) { return (float)(1000 + 100 * i + j); }
float EVal(int64_t x, int64_t i, int64_t j) { return (float)(2000 + 100 * x + 10 * i + j); }
float BVal(int64_t i, int64_t, int64_t) { return (float)(3000 + i); }

const int64_t kChunk = 12;

std::vector<Tensor> Tensors() {
  return {
      {"w", 2, {7, 9, 1}, {{{0, 0, 0}, {3, 4, 1}}, {{0, 4, 0}, {3, 5, 1}}, {{3, 0, 0}, {4, 9, 1}}}, WVal},
      {"e", 3, {3, 5, 4}, {{{0, 0, 0}, {2, 5, 4}}, {{2, 0, 0}, {1, 2, 4}}, {{2, 2, 0}, {1, 3, 4}}}, EVal},
      {"b", 1, {10, 1, 1}, {{{0, 0, 0}, {4, 1, 1}}, {{4, 0, 0}, {6, 1, 1}}}, BVal},
  };
}

std::string Dims(const int64_t *v, int n) {
  std::string s = "[";
  for (int d = 0; d < n; d++) s += (d ? "," : "") + std::to_string(v[d]);
  return s + "]";
}

// Writes every shard into one file, in order, with its chunk checksums, and the manifest.
std::string WriteCheckpoint(const std::vector<Tensor> &ts) {
  const std::string dir = TmpDir() + "/ckpt_read_test_step";
  std::string cmd = "rm -rf '" + dir + "' && mkdir -p '" + dir + "'";
  EXPECT_EQ(system(cmd.c_str()), 0);
  std::string data, tensors;
  for (const Tensor &t : ts) {
    std::string shards;
    for (const Box &b : t.shards) {
      std::string bytes;
      for (int64_t a = 0; a < b.len[0]; a++)
        for (int64_t c = 0; c < b.len[1]; c++)
          for (int64_t d = 0; d < b.len[2]; d++) {
            const float v = t.value(b.off[0] + a, b.off[1] + c, b.off[2] + d);
            bytes.append((const char *)&v, 4);
          }
      std::string sums;
      for (size_t o = 0; o < bytes.size(); o += kChunk) {
        char h[20];
        const size_t n = bytes.size() - o < (size_t)kChunk ? bytes.size() - o : (size_t)kChunk;
        snprintf(h, sizeof h, "%016llx", (unsigned long long)mp_ckpt_hash64(bytes.data() + o, n));
        sums += std::string(sums.empty() ? "" : ",") + "\"" + h + "\"";
      }
      shards += std::string(shards.empty() ? "" : ",") + "{\"file\":0,\"offset\":" + Dims(b.off, t.ndim) +
                ",\"len\":" + Dims(b.len, t.ndim) + ",\"byte_offset\":" + std::to_string(data.size()) +
                ",\"xxh64\":[" + sums + "]}";
      data += bytes;
    }
    tensors += std::string(tensors.empty() ? "" : ",") + "{\"name\":\"" + t.name + "\",\"dtype\":\"F32\",\"shape\":" +
               Dims(t.shape, t.ndim) + ",\"shards\":[" + shards + "]}";
  }
  WriteBytes(dir + "/rank_00000.bin", data);
  WriteBytes(dir + "/manifest.json",
             "{\"format\":\"" MP_CKPT_FORMAT "\",\"version\":" + std::to_string(MP_CKPT_VERSION) +
                 ",\"step\":1,\"data_consumed\":0,\"seed\":\"1\",\"chunk_bytes\":" + std::to_string(kChunk) +
                 ",\"files\":[{\"name\":\"rank_00000.bin\",\"bytes\":" + std::to_string(data.size()) +
                 "}],\"tensors\":[" + tensors + "]}");
  return dir;
}

class CkptRead : public ::testing::Test {
 protected:
  void SetUp() override {
    ts_ = Tensors();
    dir_ = WriteCheckpoint(ts_);
    ASSERT_EQ(mp_ckpt_manifest_read(&c_.c, dir_.c_str(), &m_), MP_OK) << c_.msg();
  }
  void TearDown() override { mp_ckpt_manifest_free(&m_); }

  // Reads box off/len of tensor k and checks every element against its value.
  void Expect(int k, Box b) {
    const Tensor &t = ts_[k];
    SCOPED_TRACE(std::string(t.name) + " box at " + Dims(b.off, t.ndim) + " of " + Dims(b.len, t.ndim));
    const mp_ckpt_tensor *ct = mp_ckpt_find(&m_, t.name);
    ASSERT_NE(ct, nullptr);
    std::vector<float> got((size_t)(b.len[0] * b.len[1] * b.len[2]), -1.0f);
    ASSERT_EQ(mp_ckpt_read_box(&c_.c, &m_, ct, b.off, b.len, got.data()), MP_OK) << c_.msg();
    size_t at = 0, bad = 0;
    for (int64_t a = 0; a < b.len[0]; a++)
      for (int64_t c = 0; c < b.len[1]; c++)
        for (int64_t d = 0; d < b.len[2]; d++, at++)
          if (got[at] != t.value(b.off[0] + a, b.off[1] + c, b.off[2] + d) && bad++ < 3)
            ADD_FAILURE() << "element (" << b.off[0] + a << "," << b.off[1] + c << "," << b.off[2] + d << "): got "
                          << got[at] << ", want " << t.value(b.off[0] + a, b.off[1] + c, b.off[2] + d);
  }

  Ctx c_;
  std::vector<Tensor> ts_;
  std::string dir_;
  mp_ckpt_manifest m_{};
};

// The whole of each tensor, as a one-rank load reads it.
TEST_F(CkptRead, WholeTensorsFromEveryShard) {
  Expect(0, {{0, 0, 0}, {7, 9, 1}});
  Expect(1, {{0, 0, 0}, {3, 5, 4}});
  Expect(2, {{0, 0, 0}, {10, 1, 1}});
}

// Boxes another mesh's ranks need: a rowwise TP tile (cols [3, 7): across the shards' mid-row
// seam at col 4) of rows [2, 5) (across the row seam at 3); a colwise TP tile; a dp_shard=3
// FSDP tile (ceil(7/3) = 3 rows: [3, 6), [6, 7)); single elements at the seams.
TEST_F(CkptRead, BoxesAcrossShardSeams) {
  Expect(0, {{2, 3, 0}, {3, 4, 1}});
  Expect(0, {{0, 4, 0}, {7, 5, 1}});
  Expect(0, {{3, 0, 0}, {3, 9, 1}});
  Expect(0, {{6, 0, 0}, {1, 9, 1}});
  Expect(0, {{2, 3, 0}, {1, 1, 1}});
  Expect(0, {{2, 4, 0}, {1, 1, 1}});
  Expect(0, {{3, 8, 0}, {1, 1, 1}});
}

// Expert boxes: ep=3's expert 2 (split mid-matrix in the file), experts [1, 3) (across
// the expert seam), rows [1, 4) x cols [1, 3) of every expert (a box inside each shard).
TEST_F(CkptRead, ExpertBoxesAcrossMidMatrixShards) {
  Expect(1, {{2, 0, 0}, {1, 5, 4}});
  Expect(1, {{1, 0, 0}, {2, 5, 4}});
  Expect(1, {{0, 1, 1}, {3, 3, 2}});
  Expect(1, {{2, 1, 3}, {1, 2, 1}});
}

TEST_F(CkptRead, OneDimensionalShards) {
  Expect(2, {{3, 0, 0}, {2, 1, 1}});
  Expect(2, {{4, 0, 0}, {6, 1, 1}});
  Expect(2, {{9, 0, 0}, {1, 1, 1}});
}

// A box no set of shards covers is refused, naming the tensor: drop w's second shard.
TEST_F(CkptRead, AHoleIsRefused) {
  mp_ckpt_tensor t = *mp_ckpt_find(&m_, "w");
  mp_ckpt_shard two[2] = {t.shards[0], t.shards[2]};
  t.shards = two;
  t.n_shards = 2;
  const int64_t off[3] = {0, 0, 0}, len[3] = {7, 9, 1};
  std::vector<float> got(63);
  EXPECT_EQ(mp_ckpt_read_box(&c_.c, &m_, &t, off, len, got.data()), MP_ERR_INVALID);
  EXPECT_TRUE(c_.says("tensor w: the shards hold 48 of the 63 elements needed")) << c_.msg();
}

}  // namespace
