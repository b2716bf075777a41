// Regressions of the training loop's readers, each an input the libFuzzer harnesses
// (tests/fuzz/fuzz_dataset.c, fuzz_safetensors.c, fuzz_ckpt_manifest.c) found mishandled:
// undefined behaviour (a double no int64 holds cast to one, a signed overflow, an
// unaligned load, a null pointer offset) or an accepted input that loads wrong data. Each
// test states what went wrong and asserts the refusal or the right result.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "exec/runtime/ckpt.h"
#include "exec/runtime/dataset.h"
#include "exec/runtime/safetensors.h"
#include "tests/runtime/file_util.h"

namespace {

std::string Shard(const std::vector<uint32_t> &tokens, int width) {
  std::string b(1024 + tokens.size() * width, '\0');
  const int32_t hdr[3] = {width == 2 ? MP_SHARD_MAGIC : MP_SHARD32_MAGIC,
                          width == 2 ? MP_SHARD_VERSION : MP_SHARD32_VERSION, (int32_t)tokens.size()};
  memcpy(&b[0], hdr, sizeof hdr);
  for (size_t i = 0; i < tokens.size(); i++) memcpy(&b[1024 + i * width], &tokens[i], width);
  return b;
}

// ---- token shards ----------------------------------------------------------------------------

// A shard given as bytes at an odd address (inside a larger buffer, as the harness frames
// its files) was read with 4-byte loads at unaligned addresses (UB); the batch is the same
// as from an aligned copy. Tokens 0..19, seq 4: sequence 2 is tokens 8..12.
TEST(DatasetRegress, UnalignedBytesReadTheSameTokens) {
  Ctx c;
  std::vector<uint32_t> t(20);
  for (uint32_t i = 0; i < 20; i++) t[i] = 100000 + i;
  const std::string s = Shard(t, 4);
  std::string framed = "x" + s;  // the shard at offset 1
  for (const char *b : {(const char *)s.data(), (const char *)framed.data() + 1}) {
    const void *bytes[1] = {b};
    const size_t lens[1] = {s.size()};
    const char *names[1] = {"s.bin"};
    mp_dataset *d = nullptr;
    ASSERT_EQ(mp_dataset_from_bytes(&c.c, 1, bytes, lens, names, 4, 0, 0, 1, &d), MP_OK) << c.msg();
    int32_t out[5];
    ASSERT_EQ(mp_dataset_batch(&c.c, d, 2, 1, 0, 1, out), MP_OK) << c.msg();
    for (int i = 0; i < 5; i++) EXPECT_EQ(out[i], 100008 + i);
    mp_dataset_destroy(d);
  }
}

// A uint32 shard may hold ids up to 2^32 - 1; without a vocabulary to check against, an
// id of 2^31 came out of the int32 batch as -2147483648. 2^31 - 1 is the largest kept.
TEST(DatasetRegress, IdsBeyondInt32AreRefusedWithoutAVocabulary) {
  Ctx c;
  const std::string ok = Shard({1, 2, 0x7fffffffu}, 4), bad = Shard({1, 0x80000000u, 2}, 4);
  const char *names[1] = {"big.bin"};
  mp_dataset *d = nullptr;
  const void *b1[1] = {ok.data()};
  const size_t l1[1] = {ok.size()};
  ASSERT_EQ(mp_dataset_from_bytes(&c.c, 1, b1, l1, names, 2, 0, 0, 1, &d), MP_OK) << c.msg();
  int32_t out[3];
  ASSERT_EQ(mp_dataset_batch(&c.c, d, 0, 1, 0, 1, out), MP_OK);
  EXPECT_EQ(out[2], 0x7fffffff);
  mp_dataset_destroy(d);
  const void *b2[1] = {bad.data()};
  const size_t l2[1] = {bad.size()};
  EXPECT_EQ(mp_dataset_from_bytes(&c.c, 1, b2, l2, names, 2, 0, 0, 1, &d), MP_ERR_INVALID);
  EXPECT_TRUE(c.says("big.bin: token id 2147483648 at position 1 does not fit the int32 ids")) << c.msg();
}

// A data position near 2^63 (a checkpoint's data_consumed) overflowed the sequence number
// position + rank * local + j (signed overflow, then a negative index into the order).
TEST(DatasetRegress, APositionWhoseSequencesOverflowIsRefused) {
  Ctx c;
  const std::string s = Shard({1, 2, 3, 4, 5, 6, 7, 8, 9}, 2);
  const void *b[1] = {s.data()};
  const size_t l[1] = {s.size()};
  const char *names[1] = {"s.bin"};
  mp_dataset *d = nullptr;
  ASSERT_EQ(mp_dataset_from_bytes(&c.c, 1, b, l, names, 2, 0, 1, 1, &d), MP_OK) << c.msg();
  int32_t out[4 * 3];
  EXPECT_EQ(mp_dataset_batch(&c.c, d, INT64_MAX - 1, 4, 0, 2, out), MP_ERR_INVALID);
  EXPECT_TRUE(c.says("overflows")) << c.msg();
  // the largest position that fits is served: 4 sequences from INT64_MAX - 4
  EXPECT_EQ(mp_dataset_batch(&c.c, d, INT64_MAX - 4, 4, 1, 2, out), MP_OK) << c.msg();
  mp_dataset_destroy(d);
}

// ---- safetensors -----------------------------------------------------------------------------

std::string Handmade(const std::string &header, const std::string &data) {
  std::string out(8, '\0');
  const uint64_t n = header.size();
  memcpy(&out[0], &n, 8);
  return out + header + data;
}

// A header without tensors: the offset check sorted a null array (qsort(NULL + 0), UB).
// It is a valid file of no tensors.
TEST(SafetensorsRegress, AHeaderWithoutTensorsIsAnEmptySet) {
  Ctx c;
  const std::string f = Handmade("{\"__metadata__\":{\"format\":\"pt\"}}", "");
  mp_st_set *s = nullptr;
  ASSERT_EQ(mp_st_from_bytes(&c.c, f.data(), f.size(), "e.safetensors", &s), MP_OK) << c.msg();
  EXPECT_EQ(mp_st_count(s), 0);
  mp_st_close(s);
}

// Shapes and offsets were cast from doubles unchecked: 1e300 (no int64 holds it, UB), a
// product of dims that overflows int64, strings or fractions read as 0. Each is refused.
TEST(SafetensorsRegress, ShapesAndOffsetsMustBeWholeSizes) {
  Ctx c;
  const std::string data(16, '\0');
  const struct {
    const char *header, *why;
  } bad[] = {
      {"{\"x\":{\"dtype\":\"F32\",\"shape\":[1e300],\"data_offsets\":[0,16]}}", "shape entry 0 is not a size"},
      {"{\"x\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,16]}}",
       "shape entry 1 is not a size"},
      {"{\"x\":{\"dtype\":\"F32\",\"shape\":[2.5],\"data_offsets\":[0,16]}}", "shape entry 0 is not a size"},
      {"{\"x\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[\"0\",16]}}", "data_offsets do not hold"},
      {"{\"x\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,1e300]}}", "data_offsets do not hold"},
      {"{\"x\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[-16,0]}}", "data_offsets do not hold"},
  };
  for (const auto &b : bad) {
    const std::string f = Handmade(b.header, data);
    mp_st_set *s = nullptr;
    EXPECT_EQ(mp_st_from_bytes(&c.c, f.data(), f.size(), "h.safetensors", &s), MP_ERR_INVALID) << b.header;
    EXPECT_TRUE(c.says(b.why)) << c.msg();
  }
}

// One header naming a tensor twice (JSON allows a repeated key): refused by name, as
// across the files of a folder; the header is parsed through common/json.c, which refuses
// a key given twice in any of its objects. A tensor's own entry with "dtype" twice was
// read as its first (BF16 data read as F32) where Python's reader takes the last.
TEST(SafetensorsRegress, ANameTwiceInOneHeaderIsRefused) {
  Ctx c;
  const std::string f = Handmade("{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                                 "\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}",
                                 std::string(16, '\0'));
  mp_st_set *s = nullptr;
  EXPECT_EQ(mp_st_from_bytes(&c.c, f.data(), f.size(), "d.safetensors", &s), MP_ERR_INVALID);
  EXPECT_TRUE(c.says("d.safetensors (its JSON header): key \"x\" appears twice (line 1); remove one")) << c.msg();
  const std::string g = Handmade("{\"x\":{\"dtype\":\"F32\",\"shape\":[4],\n\"dtype\":\"BF16\",\"data_offsets\":[0,8]}}",
                                 std::string(8, '\0'));
  EXPECT_EQ(mp_st_from_bytes(&c.c, g.data(), g.size(), "g.safetensors", &s), MP_ERR_INVALID);
  EXPECT_TRUE(c.says("g.safetensors (its JSON header): key \"dtype\" appears twice (line 2); remove one"))
      << c.msg();
  // the header may be padded with spaces (the format's alignment), not followed by text
  const std::string pad = Handmade("{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}   ",
                                   std::string(8, '\0'));
  ASSERT_EQ(mp_st_from_bytes(&c.c, pad.data(), pad.size(), "p.safetensors", &s), MP_OK) << c.msg();
  mp_st_close(s);
  const std::string more = Handmade("{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}{}",
                                    std::string(8, '\0'));
  EXPECT_EQ(mp_st_from_bytes(&c.c, more.data(), more.size(), "m.safetensors", &s), MP_ERR_INVALID);
  EXPECT_TRUE(c.says("m.safetensors (its JSON header): malformed JSON at line 1, column 55")) << c.msg();
}

// Names are found through a sorted index (a header of millions of entries was searched,
// and checked for repeats, in quadratic time): 2,000 tensors in descending order, each
// found at its own offsets, a missing name not found.
TEST(SafetensorsRegress, EveryNameOfALargeHeaderIsFound) {
  Ctx c;
  const int n = 2000;
  std::string h = "{";
  for (int i = n - 1; i >= 0; i--) {
    h += "\"t" + std::to_string(i) + "\":{\"dtype\":\"F16\",\"shape\":[1],\"data_offsets\":[" +
         std::to_string(2 * i) + "," + std::to_string(2 * i + 2) + "]}";
    h += i ? "," : "}";
  }
  const std::string f = Handmade(h, std::string(2 * n, '\0'));
  mp_st_set *s = nullptr;
  ASSERT_EQ(mp_st_from_bytes(&c.c, f.data(), f.size(), "big.safetensors", &s), MP_OK) << c.msg();
  for (int i = 0; i < n; i++) {
    const mp_st_tensor *t = mp_st_find(s, ("t" + std::to_string(i)).c_str());
    ASSERT_NE(t, nullptr) << i;
    EXPECT_EQ(t->begin, 2 * i);
  }
  EXPECT_EQ(mp_st_find(s, "t2000"), nullptr);
  EXPECT_EQ(mp_st_find(s, ""), nullptr);
  mp_st_close(s);
}

// ---- checkpoint manifests ----------------------------------------------------------------------

// A step folder with one file of 16 floats (i = 0..15) and one tensor "w" of shape
// [4, 4] whose shards the test gives: (row offset, rows, byte offset) each, the checksum
// of each shard's bytes computed here with the reader's own xxHash64 (tested against the
// reference vectors in train_io_test).
struct Ckpt {
  std::string dir;
  std::vector<float> v;
  Ckpt(const std::string &name) : dir(TmpDir() + "/" + name), v(16) {
    if (system(("rm -rf " + dir + " && mkdir -p " + dir).c_str()) != 0) ADD_FAILURE() << "cannot make " << dir;
    for (int i = 0; i < 16; i++) v[i] = (float)i;
    WriteBytes(dir + "/rank_00000.bin", std::string((const char *)v.data(), 64));
  }
  std::string Shard(int row, int rows, int byte_offset) const {
    char hex[20];
    snprintf(hex, sizeof hex, "%016llx",
             (unsigned long long)mp_ckpt_hash64((const char *)v.data() + byte_offset, (size_t)rows * 16));
    return "{\"file\": 0, \"offset\": [" + std::to_string(row) + ", 0], \"len\": [" + std::to_string(rows) +
           ", 4], \"byte_offset\": " + std::to_string(byte_offset) + ", \"xxh64\": [\"" + hex + "\"]}";
  }
  // The manifest with `top` in place of the top-level numbers and files, and these shards.
  std::string Manifest(const std::string &shards, const std::string &top = "") const {
    const std::string dflt = "\"step\": 1, \"data_consumed\": 4, \"seed\": \"1234\", \"chunk_bytes\": 1048576, "
                             "\"files\": [{\"name\": \"rank_00000.bin\", \"bytes\": 64}]";
    return "{\"format\": \"meshplan-checkpoint\", \"version\": 1, " + (top.empty() ? dflt : top) +
           ", \"tensors\": [{\"name\": \"w\", \"dtype\": \"F32\", \"shape\": [4, 4], \"shards\": [" + shards + "]}]}";
  }
};

// Two shards that overlap by a row and leave a row out hold as many elements as the
// tensor: the count check passed and the load returned a tensor whose last row was never
// written (whatever the buffer held). Shards rows 0..1 and 1..2, row 3 missing.
TEST(CkptRegress, OverlappingShardsThatHideAHoleAreRefused) {
  Ctx c;
  Ckpt k("ck_overlap");
  mp_ckpt_manifest m;
  // rows 1..2 of the tensor stored as their own bytes (16..47), so every checksum matches
  const std::string text = k.Manifest(k.Shard(0, 2, 0) + ", " + k.Shard(1, 2, 16));
  ASSERT_EQ(mp_ckpt_manifest_parse(&c.c, k.dir.c_str(), text.c_str(), &m), MP_OK) << c.msg();
  const mp_ckpt_tensor *t = mp_ckpt_find(&m, "w");
  const int64_t off[3] = {0, 0, 0}, len[3] = {4, 4, 1};
  std::vector<float> got(16, -1.0f);
  EXPECT_EQ(mp_ckpt_read_box(&c.c, &m, t, off, len, got.data()), MP_ERR_INVALID);
  EXPECT_TRUE(c.says("tensor w: shards 0 and 1 overlap")) << c.msg();
  // a box that meets only the first shard is read (the overlap is outside it)
  const int64_t len1[3] = {1, 4, 1};
  ASSERT_EQ(mp_ckpt_read_box(&c.c, &m, t, off, len1, got.data()), MP_OK) << c.msg();
  EXPECT_EQ(got[3], 3.0f);
  mp_ckpt_manifest_free(&m);
  // the same rows as two disjoint shards read whole, and a missing row is named
  const std::string whole = k.Manifest(k.Shard(0, 2, 0) + ", " + k.Shard(2, 2, 32));
  ASSERT_EQ(mp_ckpt_manifest_parse(&c.c, k.dir.c_str(), whole.c_str(), &m), MP_OK) << c.msg();
  ASSERT_EQ(mp_ckpt_read_box(&c.c, &m, mp_ckpt_find(&m, "w"), off, len, got.data()), MP_OK) << c.msg();
  for (int i = 0; i < 16; i++) EXPECT_EQ(got[i], (float)i);
  mp_ckpt_manifest_free(&m);
  const std::string hole = k.Manifest(k.Shard(0, 2, 0) + ", " + k.Shard(3, 1, 48));
  ASSERT_EQ(mp_ckpt_manifest_parse(&c.c, k.dir.c_str(), hole.c_str(), &m), MP_OK) << c.msg();
  EXPECT_EQ(mp_ckpt_read_box(&c.c, &m, mp_ckpt_find(&m, "w"), off, len, got.data()), MP_ERR_INVALID);
  EXPECT_TRUE(c.says("the shards hold 12 of the 16 elements")) << c.msg();
  mp_ckpt_manifest_free(&m);
}

// Numbers of the manifest were cast from doubles unchecked (1e300: UB) or had no upper
// bound: a data position near 2^63 overflowed the loader, a byte offset near 2^63
// overflowed offset + bytes, chunk_bytes of 2^40 was one allocation of 1 TiB. File names
// "." and ".." named folders. Each is refused with the field named.
TEST(CkptRegress, NumbersAndNamesOutOfRangeAreRefused) {
  Ctx c;
  Ckpt k("ck_numbers");
  const std::string ok = k.Shard(0, 4, 0);
  auto top = [](const std::string &step, const std::string &consumed, const std::string &seed,
                const std::string &chunk, const std::string &file) {
    return "\"step\": " + step + ", \"data_consumed\": " + consumed + ", \"seed\": \"" + seed +
           "\", \"chunk_bytes\": " + chunk + ", \"files\": [{\"name\": \"" + file + "\", \"bytes\": 64}]";
  };
  const struct {
    std::string text, why;
  } bad[] = {
      {k.Manifest(ok, top("1e300", "4", "1234", "1048576", "rank_00000.bin")), "step (0..2^24)"},
      {k.Manifest(ok, top("1", "1e300", "1234", "1048576", "rank_00000.bin")), "data_consumed (0..2^48)"},
      {k.Manifest(ok, top("1", "1152921504606846976", "1234", "1048576", "rank_00000.bin")), "data_consumed"},
      {k.Manifest(ok, top("1", "4", "12ab", "1048576", "rank_00000.bin")), "seed (decimal)"},
      {k.Manifest(ok, top("1", "4", "99999999999999999999", "1048576", "rank_00000.bin")), "seed (decimal)"},
      {k.Manifest(ok, top("1", "4", "1234", "1099511627776", "rank_00000.bin")), "chunk_bytes"},
      {k.Manifest(ok, top("1", "4", "1234", "1048576", "..")), "a file entry is malformed"},
      {k.Manifest(ok, top("1", "4", "1234", "1048576", ".")), "a file entry is malformed"},
      {k.Manifest(ok, top("1", "4", "1234", "1048576", "../rank_00000.bin")), "a file entry is malformed"},
      {k.Manifest("{\"file\": 0, \"offset\": [0, 0], \"len\": [4, 4], \"byte_offset\": 9223372036854775807, "
                  "\"xxh64\": [\"0000000000000000\"]}"),
       "a shard of tensor w is malformed"},
      {k.Manifest("{\"file\": 0, \"offset\": [1e300, 0], \"len\": [4, 4], \"byte_offset\": 0, "
                  "\"xxh64\": [\"0000000000000000\"]}"),
       "a shard of tensor w is malformed"},
      {k.Manifest("{\"file\": 0, \"offset\": [0, 0], \"len\": [4, 4], \"byte_offset\": 0, "
                  "\"xxh64\": [\"-000000000000001\"]}"),
       "a shard of tensor w is malformed"},
  };
  for (const auto &b : bad) {
    mp_ckpt_manifest m;
    EXPECT_EQ(mp_ckpt_manifest_parse(&c.c, k.dir.c_str(), b.text.c_str(), &m), MP_ERR_INVALID) << b.text;
    EXPECT_TRUE(c.says(b.why)) << c.msg();
    mp_ckpt_manifest_free(&m);
  }
  // a tensor's shape of 1e300 (the tensor entry), and the valid manifest itself
  std::string shape = k.Manifest(ok);
  shape.replace(shape.find("[4, 4], \"shards\""), 6, "[1e300, 4]");
  mp_ckpt_manifest m;
  EXPECT_EQ(mp_ckpt_manifest_parse(&c.c, k.dir.c_str(), shape.c_str(), &m), MP_ERR_INVALID);
  EXPECT_TRUE(c.says("a tensor entry is malformed")) << c.msg();
  mp_ckpt_manifest_free(&m);
  ASSERT_EQ(mp_ckpt_manifest_parse(&c.c, k.dir.c_str(), k.Manifest(ok).c_str(), &m), MP_OK) << c.msg();
  EXPECT_EQ(m.meta.data_consumed, 4);
  EXPECT_EQ(m.meta.seed, 1234u);
  mp_ckpt_manifest_free(&m);
}

// A manifest key given twice: the first was read ("step": 1 resumed at step 1 where
// Python's json, reading the same manifest, says 7). Refused by the JSON layer.
TEST(CkptRegress, AKeyGivenTwiceIsRefused) {
  Ctx c;
  Ckpt k("ck_twice");
  std::string text = k.Manifest(k.Shard(0, 4, 0));
  text.replace(text.find("\"step\": 1, "), 11, "\"step\": 1,\n\"step\": 7, ");
  mp_ckpt_manifest m;
  EXPECT_EQ(mp_ckpt_manifest_parse(&c.c, k.dir.c_str(), text.c_str(), &m), MP_ERR_INVALID) << text;
  EXPECT_TRUE(c.says("manifest.json: key \"step\" appears twice (line 2); remove one")) << c.msg();
  mp_ckpt_manifest_free(&m);
}

}  // namespace
