// The training loop's files and formulas, unit by unit: the checkpoint checksum against
// xxHash's reference vectors, LR schedules against values derived by hand, token shards
// (uint16, uint32, by glob) and the loader's order and slices, safetensors written and
// read (F32, BF16, F16, malformed files refused), Hugging Face names.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <vector>

#include "exec/runtime/ckpt.h"
#include "exec/runtime/dataset.h"
#include "exec/runtime/hf.h"
#include "exec/runtime/lr.h"
#include "exec/runtime/safetensors.h"
#include "tests/runtime/file_util.h"

namespace {

// ---- checksum ------------------------------------------------------------------------------

TEST(CkptHash, XxHash64ReferenceVectors) {
  // xxhsum -H64 (Debian's xxhash 0.8.1) of "", "abc" and "meshplan"
  EXPECT_EQ(mp_ckpt_hash64("", 0), 0xef46db3751d8e999ull);
  EXPECT_EQ(mp_ckpt_hash64("abc", 3), 0x44bc2cf5ad770999ull);
  EXPECT_EQ(mp_ckpt_hash64("meshplan", 8), 0x26b55a202eec5061ull);
}

TEST(CkptResolve, MissingFolderAndEmptyFolder) {
  Ctx c;
  char out[MP_CKPT_PATH_MAX];
  const std::string none = TmpDir() + "/no_such_ckpt";
  EXPECT_EQ(mp_ckpt_resolve(&c.c, none.c_str(), out, sizeof out), MP_ERR_NOT_FOUND);
  EXPECT_NE(std::string(c.msg()).find("does not exist"), std::string::npos) << c.msg();
}

// ---- LR schedules (lr.h): lr 1, min 0.1, 2 warmup steps, 12 steps ------------------------

TEST(Lr, WarmupThenEachShape) {
  mp_lr_schedule s = {MP_LR_COSINE, 1.0, 0.1, 2, 12, 0.5};
  EXPECT_DOUBLE_EQ(mp_lr_at(&s, 1), 0.5);  // 1 * 1/2
  EXPECT_DOUBLE_EQ(mp_lr_at(&s, 2), 1.0);
  // cosine at p = (7 - 2) / 10 = 0.5: 0.1 + 0.9 * (1 + cos(pi/2)) / 2 = 0.55
  EXPECT_NEAR(mp_lr_at(&s, 7), 0.55, 1e-15);
  EXPECT_NEAR(mp_lr_at(&s, 12), 0.1, 1e-15);
  EXPECT_NEAR(mp_lr_at(&s, 20), 0.1, 1e-15);  // past the end: the floor
  s.kind = MP_LR_LINEAR;                      // 1 + (0.1 - 1) * 0.5
  EXPECT_NEAR(mp_lr_at(&s, 7), 0.55, 1e-15);
  EXPECT_NEAR(mp_lr_at(&s, 12), 0.1, 1e-15);
  s.kind = MP_LR_WSD;  // D = 12 - round(0.5 * 10) = 7: stable through step 7
  EXPECT_DOUBLE_EQ(mp_lr_at(&s, 7), 1.0);
  // step 8: q = 1/5, 0.1 + 0.9 * (1 - sqrt(0.2)) = 0.5975077...
  EXPECT_NEAR(mp_lr_at(&s, 8), 0.1 + 0.9 * (1.0 - std::sqrt(0.2)), 1e-15);
  EXPECT_NEAR(mp_lr_at(&s, 12), 0.1, 1e-15);
  s.kind = MP_LR_CONSTANT;
  EXPECT_DOUBLE_EQ(mp_lr_at(&s, 12), 1.0);
  s.warmup = 0;  // no warmup: step 1 runs at the schedule's value
  EXPECT_DOUBLE_EQ(mp_lr_at(&s, 1), 1.0);
}

// The shapes at p = 0.25 and 0.75, where cosine, linear and a square root differ (at p = 0.5
// and 1 cosine and linear agree). lr 1, min 0.1, no warmup, 8 steps: p = step / 8.
//   cosine: 0.1 + 0.45 (1 + cos(pi p)): p = 1/4 -> 0.1 + 0.45 (1 + 0.70710678) = 0.86819805,
//           p = 3/4 -> 0.1 + 0.45 (1 - 0.70710678) = 0.23180195
//   linear: 1 - 0.9 p: 0.775 and 0.325
//   wsd with decay_frac 0.5: D = 8 - round(0.5 x 8) = 4, q = (step - 4) / 4: step 5 ->
//           0.1 + 0.9 (1 - sqrt(1/4)) = 0.55, step 7 -> 0.1 + 0.9 (1 - sqrt(3/4)) = 0.22057714
TEST(Lr, AsymmetricPointsTellTheShapesApart) {
  mp_lr_schedule s = {MP_LR_COSINE, 1.0, 0.1, 0, 8, 0.5};
  EXPECT_NEAR(mp_lr_at(&s, 2), 0.86819805153394639, 1e-12);
  EXPECT_NEAR(mp_lr_at(&s, 6), 0.23180194846605361, 1e-12);
  s.kind = MP_LR_LINEAR;
  EXPECT_NEAR(mp_lr_at(&s, 2), 0.775, 1e-12);
  EXPECT_NEAR(mp_lr_at(&s, 6), 0.325, 1e-12);
  s.kind = MP_LR_WSD;
  EXPECT_DOUBLE_EQ(mp_lr_at(&s, 4), 1.0);
  EXPECT_NEAR(mp_lr_at(&s, 5), 0.55, 1e-12);
  EXPECT_NEAR(mp_lr_at(&s, 7), 0.22057713659400527, 1e-12);
  // with 4 warmup steps over 12, p = (step - 4) / 8 again: the same values 4 steps later
  s = {MP_LR_COSINE, 1.0, 0.1, 4, 12, 0.5};
  EXPECT_NEAR(mp_lr_at(&s, 3), 0.75, 1e-12);  // warmup: 3/4 of the peak
  EXPECT_NEAR(mp_lr_at(&s, 6), 0.86819805153394639, 1e-12);
  EXPECT_NEAR(mp_lr_at(&s, 10), 0.23180194846605361, 1e-12);
}

// Whether a resumed run's schedule changed for the steps it runs: the formulas of lr.h read
// off. A constant schedule has no total and no floor in its formula, so --steps 20 -> 30
// changes nothing; a warmup that ended before step 10 in both does not either; a cosine's
// p = (s - W) / (S - W) moves with S, and a wsd's decay start D with its share.
TEST(Lr, SameAfterAStepReadsTheFormulas) {
  const mp_lr_schedule c20 = {MP_LR_CONSTANT, 1e-3, 0, 4, 20, 0.2}, c30 = {MP_LR_CONSTANT, 1e-3, 5e-4, 2, 30, 0.2};
  EXPECT_TRUE(mp_lr_same_after(&c20, &c30, 10));   // totals, floors and ended warmups
  EXPECT_FALSE(mp_lr_same_after(&c20, &c30, 3));   // step 4 is warmup in one, not the other
  mp_lr_schedule c_lr = c20;
  c_lr.lr = 2e-3;
  EXPECT_FALSE(mp_lr_same_after(&c20, &c_lr, 10));
  const mp_lr_schedule cos20 = {MP_LR_COSINE, 1e-3, 1e-4, 4, 20, 0.2}, cos30 = {MP_LR_COSINE, 1e-3, 1e-4, 4, 30, 0.2};
  EXPECT_TRUE(mp_lr_same_after(&cos20, &cos20, 10));
  EXPECT_FALSE(mp_lr_same_after(&cos20, &cos30, 10));
  EXPECT_NE(mp_lr_at(&cos20, 11), mp_lr_at(&cos30, 11));  // and indeed the rates part
  EXPECT_FALSE(mp_lr_same_after(&c20, &cos20, 10));
  mp_lr_schedule w1 = {MP_LR_WSD, 1e-3, 1e-4, 4, 20, 0.2}, w2 = w1;
  w2.decay_frac = 0.5;
  EXPECT_FALSE(mp_lr_same_after(&w1, &w2, 10));
  EXPECT_TRUE(mp_lr_same_after(&w1, &w1, 10));
}

TEST(Lr, NamesAndRefusals) {
  Ctx c;
  mp_lr_kind k;
  ASSERT_EQ(mp_lr_kind_parse(&c.c, "wsd", &k), MP_OK);
  EXPECT_EQ(k, MP_LR_WSD);
  EXPECT_STREQ(mp_lr_kind_name(MP_LR_COSINE), "cosine");
  EXPECT_EQ(mp_lr_kind_parse(&c.c, "step", &k), MP_ERR_USAGE);
  mp_lr_schedule s = {MP_LR_COSINE, 1e-3, 1e-2, 0, 10, 0.2};  // floor above the peak
  EXPECT_EQ(mp_lr_validate(&c.c, &s), MP_ERR_USAGE);
  s = {MP_LR_COSINE, 1e-3, 0, 11, 10, 0.2};  // warmup past the end
  EXPECT_EQ(mp_lr_validate(&c.c, &s), MP_ERR_USAGE);
  s = {MP_LR_WSD, 1e-3, 0, 1, 10, 0.0};  // no decay share
  EXPECT_EQ(mp_lr_validate(&c.c, &s), MP_ERR_USAGE);
}

// ---- token shards and the loader ----------------------------------------------------------

// 2 shards of 33 and 17 tokens, token i = i (+ 1000 in the second, uint32 only)
TEST(Dataset, Uint16AndUint32ShardsByGlob) {
  Ctx c;
  const std::string d = TmpDir() + "/ds";
  ASSERT_EQ(system(("rm -rf " + d + " && mkdir -p " + d).c_str()), 0);
  std::vector<uint32_t> a(33), b(17);
  for (uint32_t i = 0; i < 33; i++) a[i] = i;
  for (uint32_t i = 0; i < 17; i++) b[i] = 70000 + i;  // needs uint32
  ASSERT_EQ(mp_shard_write(&c.c, (d + "/p0.bin").c_str(), a.data(), 33, 2), MP_OK) << c.msg();
  EXPECT_EQ(mp_shard_write(&c.c, (d + "/p1.bin").c_str(), b.data(), 17, 2), MP_ERR_INVALID);  // 70000 > uint16
  ASSERT_EQ(mp_shard_write(&c.c, (d + "/p1.bin").c_str(), b.data(), 17, 4), MP_OK) << c.msg();
  mp_dataset *ds = nullptr;
  // seq 8: 33 tokens hold (33 - 1) / 8 = 4 sequences, 17 hold 2
  ASSERT_EQ(mp_dataset_open(&c.c, (d + "/p*.bin").c_str(), 8, 100000, 0, 1, &ds), MP_OK) << c.msg();
  EXPECT_EQ(mp_dataset_files(ds), 2);
  EXPECT_EQ(mp_dataset_sequences(ds), 6);
  EXPECT_EQ(mp_dataset_tokens(ds), 50);
  int w = 0;
  mp_dataset_file(ds, 1, &w);
  EXPECT_EQ(w, 4);
  std::vector<int32_t> out(3 * 9);
  // sequences 3, 4, 5: tokens 24..32 of p0, then 0..8 and 8..16 of p1
  ASSERT_EQ(mp_dataset_batch(&c.c, ds, 3, 3, 0, 1, out.data()), MP_OK);
  EXPECT_EQ(out[0], 24);
  EXPECT_EQ(out[8], 32);
  EXPECT_EQ(out[9], 70000);
  EXPECT_EQ(out[18], 70008);
  EXPECT_EQ(out[26], 70016);
  // position 6 wraps to the next epoch: sequence 0 again
  ASSERT_EQ(mp_dataset_batch(&c.c, ds, 6, 1, 0, 1, out.data()), MP_OK);
  EXPECT_EQ(out[0], 0);
  mp_dataset_destroy(ds);
  // an id beyond the vocabulary: the file and position are named
  EXPECT_EQ(mp_dataset_open(&c.c, (d + "/p*.bin").c_str(), 8, 70010, 0, 1, &ds), MP_ERR_INVALID);
  EXPECT_NE(std::string(c.msg()).find("p1.bin: token id 70010 at position 10"), std::string::npos) << c.msg();
  EXPECT_EQ(mp_dataset_open(&c.c, (d + "/none*.bin").c_str(), 8, 0, 0, 1, &ds), MP_ERR_NOT_FOUND);
  // a header that lies about the length, and a file that is not a shard
  std::string bad(1024 + 10, '\0');
  int32_t hdr[3] = {20240520, 1, 6};  // 6 tokens of 2 bytes, but 10 bytes follow
  memcpy(&bad[0], hdr, sizeof hdr);
  WriteBytes(d + "/bad.bin", bad);
  EXPECT_EQ(mp_dataset_open(&c.c, (d + "/bad.bin").c_str(), 2, 0, 0, 1, &ds), MP_ERR_INVALID);
  EXPECT_NE(std::string(c.msg()).find("header says 6 tokens"), std::string::npos) << c.msg();
  hdr[0] = 12345;
  memcpy(&bad[0], hdr, sizeof hdr);
  WriteBytes(d + "/bad.bin", bad);
  EXPECT_EQ(mp_dataset_open(&c.c, (d + "/bad.bin").c_str(), 2, 0, 0, 1, &ds), MP_ERR_INVALID);
  EXPECT_NE(std::string(c.msg()).find("not a token shard"), std::string::npos) << c.msg();
}

// 1000 tokens, seq 4: 249 sequences; sequence i starts with token 4i
TEST(Dataset, ShuffleIsAPermutationPerEpochAndSlicesSplitTheBatch) {
  Ctx c;
  mp_corpus corp = {};
  std::vector<uint16_t> toks(1000);
  for (int i = 0; i < 1000; i++) toks[i] = (uint16_t)i;
  corp.tokens = toks.data();
  corp.n_tokens = 1000;
  mp_dataset *a = nullptr, *b = nullptr, *other = nullptr, *plain = nullptr;
  ASSERT_EQ(mp_dataset_from_corpus(&c.c, &corp, 4, 1, 7, &a), MP_OK);
  ASSERT_EQ(mp_dataset_from_corpus(&c.c, &corp, 4, 1, 7, &b), MP_OK);
  ASSERT_EQ(mp_dataset_from_corpus(&c.c, &corp, 4, 1, 8, &other), MP_OK);
  ASSERT_EQ(mp_dataset_from_corpus(&c.c, &corp, 4, 0, 7, &plain), MP_OK);
  const int S = 249;
  ASSERT_EQ(mp_dataset_sequences(a), S);
  std::vector<int32_t> ea(S * 5), eb(S * 5), eo(S * 5), e2(S * 5), ep(S * 5);
  ASSERT_EQ(mp_dataset_batch(&c.c, a, 0, S, 0, 1, ea.data()), MP_OK);
  ASSERT_EQ(mp_dataset_batch(&c.c, b, 0, S, 0, 1, eb.data()), MP_OK);
  ASSERT_EQ(mp_dataset_batch(&c.c, other, 0, S, 0, 1, eo.data()), MP_OK);
  ASSERT_EQ(mp_dataset_batch(&c.c, a, S, S, 0, 1, e2.data()), MP_OK);  // epoch 1
  ASSERT_EQ(mp_dataset_batch(&c.c, plain, 0, S, 0, 1, ep.data()), MP_OK);
  std::set<int> seen;
  for (int j = 0; j < S; j++) {
    EXPECT_EQ(ea[j * 5] % 4, 0);
    EXPECT_EQ(ea[j * 5 + 4], ea[j * 5] + 4);  // whole windows
    seen.insert(ea[j * 5]);
    EXPECT_EQ(ep[j * 5], 4 * j);  // unshuffled: in order
  }
  EXPECT_EQ((int)seen.size(), S) << "every sequence once per epoch";
  EXPECT_EQ(ea, eb) << "the order depends only on the seed";
  EXPECT_NE(ea, eo) << "another seed, another order";
  EXPECT_NE(ea, e2) << "another epoch, another order";
  // data-parallel slices: rank d of 3 takes sequences d*2 .. d*2 + 1 of a batch of 6
  std::vector<int32_t> whole(6 * 5), part(2 * 5);
  ASSERT_EQ(mp_dataset_batch(&c.c, a, 10, 6, 0, 1, whole.data()), MP_OK);
  for (int d = 0; d < 3; d++) {
    ASSERT_EQ(mp_dataset_batch(&c.c, a, 10, 6, d, 3, part.data()), MP_OK);
    EXPECT_TRUE(std::equal(part.begin(), part.end(), whole.begin() + d * 10)) << "rank " << d;
  }
  EXPECT_EQ(mp_dataset_batch(&c.c, a, 0, 5, 0, 3, part.data()), MP_ERR_INVALID);  // 5 over 3 ranks
  mp_dataset_destroy(a);
  mp_dataset_destroy(b);
  mp_dataset_destroy(other);
  mp_dataset_destroy(plain);
}

// ---- safetensors -------------------------------------------------------------------------

TEST(Safetensors, WriteThenReadBoxes) {
  Ctx c;
  const std::string p = TmpDir() + "/w.safetensors";
  const char *names[2] = {"a.weight", "b"};
  const int ndims[2] = {2, 1};
  const int64_t shapes[2][MP_ST_MAX_NDIM] = {{3, 4}, {5}};
  cJSON *meta = cJSON_CreateObject();
  cJSON_AddStringToObject(meta, "format", "pt");
  mp_st_writer *w = nullptr;
  ASSERT_EQ(mp_st_writer_open(&c.c, p.c_str(), 2, names, ndims, shapes, MP_ST_F32, meta, &w), MP_OK) << c.msg();
  cJSON_Delete(meta);
  std::vector<float> a(12), b(5);
  for (int i = 0; i < 12; i++) a[i] = 0.5f * i;
  for (int i = 0; i < 5; i++) b[i] = -1.0f * i;
  ASSERT_EQ(mp_st_writer_put(&c.c, w, a.data()), MP_OK);
  ASSERT_EQ(mp_st_writer_put(&c.c, w, b.data()), MP_OK);
  ASSERT_EQ(mp_st_writer_close(&c.c, w, 1), MP_OK) << c.msg();
  // the header's length field says where the data starts: 8-byte aligned
  std::ifstream f(p, std::ios::binary);
  uint64_t n = 0;
  f.read((char *)&n, 8);
  EXPECT_EQ(n % 8, 0u);
  mp_st_set *s = nullptr;
  ASSERT_EQ(mp_st_open(&c.c, p.c_str(), &s), MP_OK) << c.msg();
  ASSERT_EQ(mp_st_count(s), 2);
  const mp_st_tensor *t = mp_st_find(s, "a.weight");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->shape[0], 3);
  EXPECT_EQ(t->shape[1], 4);
  // rows 1..2, columns 2..3: elements 6, 7, 10, 11
  const int64_t off[2] = {1, 2}, len[2] = {2, 2};
  float box[4];
  ASSERT_EQ(mp_st_read_box(&c.c, s, t, off, len, box), MP_OK);
  EXPECT_EQ(box[0], 3.0f);
  EXPECT_EQ(box[1], 3.5f);
  EXPECT_EQ(box[2], 5.0f);
  EXPECT_EQ(box[3], 5.5f);
  mp_st_close(s);
}

// The BF16 writer rounds to nearest even, as torch's .to(torch.bfloat16): bf16 keeps fp32's
// top 16 bits, so 1 + 2^-8 lies halfway between 1.0 (0x3F80) and 1 + 2^-7 (0x3F81) and goes
// to the even 0x3F80; 1 + 3 x 2^-8 lies halfway between 0x3F81 and 0x3F82 and goes to the
// even 0x3F82; 1 + 2^-8 + 2^-20 is past halfway: 0x3F81; -2.5 is exact: 0xC020.
TEST(Safetensors, Bf16WriterRoundsToNearestEven) {
  Ctx c;
  const std::string p = TmpDir() + "/bf16.safetensors";
  const char *names[1] = {"x"};
  const int ndims[1] = {1};
  const int64_t shapes[1][MP_ST_MAX_NDIM] = {{4}};
  mp_st_writer *w = nullptr;
  ASSERT_EQ(mp_st_writer_open(&c.c, p.c_str(), 1, names, ndims, shapes, MP_ST_BF16, nullptr, &w), MP_OK) << c.msg();
  const float x[4] = {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, 1.0f + 0x1p-8f + 0x1p-20f, -2.5f};
  ASSERT_EQ(mp_st_writer_put(&c.c, w, x), MP_OK);
  ASSERT_EQ(mp_st_writer_close(&c.c, w, 1), MP_OK) << c.msg();
  std::ifstream f(p, std::ios::binary);
  std::string b((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  uint64_t n = 0;
  memcpy(&n, b.data(), 8);
  ASSERT_EQ(b.size(), 8 + n + 8);  // four 2-byte values
  EXPECT_NE(b.find("\"dtype\":\"BF16\""), std::string::npos);
  uint16_t got[4];
  memcpy(got, b.data() + 8 + n, 8);
  EXPECT_EQ(got[0], 0x3F80);
  EXPECT_EQ(got[1], 0x3F82);
  EXPECT_EQ(got[2], 0x3F81);
  EXPECT_EQ(got[3], 0xC020);
}

// A file by hand: a BF16 and an F16 tensor of two elements each.
std::string Handmade(const std::string &header, const std::string &data) {
  std::string out(8, '\0');
  uint64_t n = header.size();
  memcpy(&out[0], &n, 8);
  return out + header + data;
}

TEST(Safetensors, Bf16AndF16ConvertAndMalformedFilesAreRefused) {
  Ctx c;
  const std::string p = TmpDir() + "/h.safetensors";
  // bf16 1.5 = 0x3FC0, -2 = 0xC000; f16 1.5 = 0x3E00, the smallest subnormal 0x0001 = 2^-24
  const uint16_t vals[4] = {0x3FC0, 0xC000, 0x3E00, 0x0001};
  std::string data((const char *)vals, 8);
  WriteBytes(p, Handmade("{\"x\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[0,4]},"
                         "\"y\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[4,8]}}", data));
  mp_st_set *s = nullptr;
  ASSERT_EQ(mp_st_open(&c.c, p.c_str(), &s), MP_OK) << c.msg();
  float v[2];
  const int64_t off[1] = {0}, len[1] = {2};
  ASSERT_EQ(mp_st_read_box(&c.c, s, mp_st_find(s, "x"), off, len, v), MP_OK);
  EXPECT_EQ(v[0], 1.5f);
  EXPECT_EQ(v[1], -2.0f);
  ASSERT_EQ(mp_st_read_box(&c.c, s, mp_st_find(s, "y"), off, len, v), MP_OK);
  EXPECT_EQ(v[0], 1.5f);
  EXPECT_EQ(v[1], std::ldexp(1.0f, -24));
  mp_st_close(s);
  // a hole between tensors, offsets past the end, a length that does not fit the shape,
  // a header longer than the file, an unknown dtype
  const struct {
    std::string header, why;
  } bad[] = {
      {"{\"x\":{\"dtype\":\"BF16\",\"shape\":[1],\"data_offsets\":[2,4]}}", "starts at data byte 2"},
      {"{\"x\":{\"dtype\":\"BF16\",\"shape\":[8],\"data_offsets\":[0,16]}}", "truncated or corrupt"},
      {"{\"x\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[0,4]}}", "truncated or corrupt"},
      {"{\"x\":{\"dtype\":\"I8\",\"shape\":[8],\"data_offsets\":[0,8]}}", "dtype I8"},
  };
  for (const auto &b : bad) {
    WriteBytes(p, Handmade(b.header, data));
    EXPECT_NE(mp_st_open(&c.c, p.c_str(), &s), MP_OK) << b.header;
    EXPECT_NE(std::string(c.msg()).find(b.why), std::string::npos) << c.msg();
  }
  std::string lie = Handmade("{}", data);
  uint64_t big = 1u << 20;
  memcpy(&lie[0], &big, 8);
  WriteBytes(p, lie);
  EXPECT_EQ(mp_st_open(&c.c, p.c_str(), &s), MP_ERR_INVALID);
  EXPECT_NE(std::string(c.msg()).find("does not fit the file"), std::string::npos) << c.msg();
}

// ---- Hugging Face names ------------------------------------------------------------------

TEST(HfNames, LlamaAndMixtral) {
  char out[256];
  const struct {
    const char *ours, *hf;
  } cases[] = {
      {"tok_embeddings.weight", "model.embed_tokens.weight"},
      {"norm.weight", "model.norm.weight"},
      {"output.weight", "lm_head.weight"},
      {"layers.0.attention_norm.weight", "model.layers.0.input_layernorm.weight"},
      {"layers.11.attention.q_proj.weight", "model.layers.11.self_attn.q_proj.weight"},
      {"layers.3.attention.o_proj.weight", "model.layers.3.self_attn.o_proj.weight"},
      {"layers.3.ffn_norm.weight", "model.layers.3.post_attention_layernorm.weight"},
      {"layers.3.mlp.down_proj.weight", "model.layers.3.mlp.down_proj.weight"},
      {"layers.1.moe.router.weight", "model.layers.1.block_sparse_moe.gate.weight"},
  };
  for (const auto &k : cases) {
    ASSERT_TRUE(mp_hf_name(k.ours, 0, out, sizeof out)) << k.ours;
    EXPECT_STREQ(out, k.hf);
  }
  ASSERT_TRUE(mp_hf_is_experts("layers.1.moe.experts.gate_proj.weight"));
  ASSERT_TRUE(mp_hf_name("layers.1.moe.experts.gate_proj.weight", 5, out, sizeof out));
  EXPECT_STREQ(out, "model.layers.1.block_sparse_moe.experts.5.w1.weight");
  ASSERT_TRUE(mp_hf_name("layers.1.moe.experts.up_proj.weight", 0, out, sizeof out));
  EXPECT_STREQ(out, "model.layers.1.block_sparse_moe.experts.0.w3.weight");
  ASSERT_TRUE(mp_hf_name("layers.1.moe.experts.down_proj.weight", 7, out, sizeof out));
  EXPECT_STREQ(out, "model.layers.1.block_sparse_moe.experts.7.w2.weight");
  EXPECT_FALSE(mp_hf_name("layers.1.moe.shared_expert.up_proj.weight", 0, out, sizeof out));
}

// DeepSeek-V2's names (deepseek-ai/DeepSeek-V2-Lite's model.safetensors.index.json) and its
// interleaved RoPE rows: tiny-mla-q has 4 heads of qk_nope 8 + qk_rope 4 and a kv latent of
// 16, so our rope row 8 + i of head h is DeepSeek's row 8 + 2i (i < 2) or 8 + 2(i - 2) + 1,
// and kv_a_proj_with_mqa's rope rows 16.. likewise.
TEST(HfNames, DeepSeekV2) {
  Ctx c;
  mp_model m;
  ASSERT_EQ(mp_model_load(&c.c, "tiny-mla-q", &m), MP_OK) << c.msg();
  char out[256];
  const struct {
    const char *ours, *hf;
  } cases[] = {
      {"layers.0.attention.q_a_proj.weight", "model.layers.0.self_attn.q_a_proj.weight"},
      {"layers.0.attention.q_a_layernorm.weight", "model.layers.0.self_attn.q_a_layernorm.weight"},
      {"layers.0.attention.q_b_proj.weight", "model.layers.0.self_attn.q_b_proj.weight"},
      {"layers.2.attention.kv_a_proj_with_mqa.weight", "model.layers.2.self_attn.kv_a_proj_with_mqa.weight"},
      {"layers.2.attention.kv_a_layernorm.weight", "model.layers.2.self_attn.kv_a_layernorm.weight"},
      {"layers.2.attention.kv_b_proj.weight", "model.layers.2.self_attn.kv_b_proj.weight"},
      {"layers.2.moe.router.weight", "model.layers.2.mlp.gate.weight"},
      {"layers.2.moe.shared_expert.up_proj.weight", "model.layers.2.mlp.shared_experts.up_proj.weight"},
      {"layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.gate_proj.weight"},
      {"output.weight", "lm_head.weight"},
  };
  for (const auto &k : cases) {
    ASSERT_TRUE(mp_hf_model_name(&m, k.ours, 0, out, sizeof out)) << k.ours;
    EXPECT_STREQ(out, k.hf);
  }
  ASSERT_TRUE(mp_hf_model_name(&m, "layers.1.moe.experts.down_proj.weight", 6, out, sizeof out));
  EXPECT_STREQ(out, "model.layers.1.mlp.experts.6.down_proj.weight");
  const char *qb = "layers.1.attention.q_b_proj.weight", *kva = "layers.1.attention.kv_a_proj_with_mqa.weight";
  EXPECT_TRUE(mp_hf_rows_moved(&m, qb));
  EXPECT_FALSE(mp_hf_rows_moved(&m, "layers.1.attention.kv_b_proj.weight"));
  const int64_t q_rows[][2] = {{7, 7}, {8, 8}, {9, 10}, {10, 9}, {11, 11}, {12 + 9, 12 + 10}, {12 + 10, 12 + 9}};
  for (const auto &r : q_rows) EXPECT_EQ(mp_hf_row(&m, qb, r[0]), r[1]) << r[0];
  const int64_t kv_rows[][2] = {{15, 15}, {16, 16}, {17, 18}, {18, 17}, {19, 19}};
  for (const auto &r : kv_rows) EXPECT_EQ(mp_hf_row(&m, kva, r[0]), r[1]) << r[0];
}

}  // namespace
