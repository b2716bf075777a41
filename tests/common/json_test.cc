// common/json.h: parsing with line/column, getters with messages naming origin and key,
// whole-file reads and atomic writes.
#include <gtest/gtest.h>

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "common/json.h"

namespace {

bool Contains(const std::string &s, const std::string &sub) {
  return s.find(sub) != std::string::npos;
}

std::string TmpDir() {
  const char *t = getenv("TEST_TMPDIR");
  std::string base = t ? t : "/tmp";
  static int n = 0;
  std::string d = base + "/json_test." + std::to_string(getpid()) + "." + std::to_string(n++);
  mkdir(d.c_str(), 0700);
  return d;
}

std::string Slurp(const std::string &path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

int CountEntries(const std::string &dir) {
  DIR *d = opendir(dir.c_str());
  int n = 0;
  while (struct dirent *e = readdir(d))
    if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) n++;
  closedir(d);
  return n;
}

struct JsonTest : ::testing::Test {
  mp_ctx ctx;
  cJSON *j = nullptr;
  void SetUp() override {
    mp_ctx_init(&ctx);
    const char *text =
        "{\"i\": 42, \"neg\": -7, \"frac\": 2.5, \"big\": 1e300, \"huge_int\": 4294967296,"
        " \"s\": \"hello\", \"b\": true, \"f\": 0.125, \"n\": null, \"arr\": [1], \"obj\": {}}";
    ASSERT_EQ(mp_json_parse(&ctx, text, "t.json", &j), MP_OK) << mp_errmsg(&ctx);
  }
  void TearDown() override { cJSON_Delete(j); }
  std::string msg() const { return mp_errmsg(&ctx); }
};

TEST_F(JsonTest, IntegerGetters) {
  int64_t v = 0;
  ASSERT_EQ(mp_json_get_i64(&ctx, j, "t.json", "i", 1, &v), MP_OK);
  EXPECT_EQ(v, 42);
  ASSERT_EQ(mp_json_get_i64(&ctx, j, "t.json", "neg", 1, &v), MP_OK);
  EXPECT_EQ(v, -7);
  ASSERT_EQ(mp_json_get_i64(&ctx, j, "t.json", "huge_int", 1, &v), MP_OK);
  EXPECT_EQ(v, 4294967296LL);
  int i = 0;
  ASSERT_EQ(mp_json_get_int(&ctx, j, "t.json", "i", 1, &i), MP_OK);
  EXPECT_EQ(i, 42);
}

TEST_F(JsonTest, MissingRequiredKeyNamesOriginAndKey) {
  int64_t v = 5;
  EXPECT_EQ(mp_json_get_i64(&ctx, j, "t.json", "n_heads", 1, &v), MP_ERR_INVALID);
  EXPECT_EQ(msg(), "t.json: missing required key 'n_heads'");
  EXPECT_EQ(v, 5);
  // null counts as missing
  EXPECT_EQ(mp_json_get_i64(&ctx, j, "t.json", "n", 1, &v), MP_ERR_INVALID);
  EXPECT_TRUE(Contains(msg(), "'n'"));
}

TEST_F(JsonTest, MissingOptionalKeyLeavesDefault) {
  int64_t v = 5;
  double d = 1.5;
  int b = 1, i = 9;
  char s[8] = "dflt";
  EXPECT_EQ(mp_json_get_i64(&ctx, j, "t.json", "absent", 0, &v), MP_OK);
  EXPECT_EQ(mp_json_get_f64(&ctx, j, "t.json", "absent", 0, &d), MP_OK);
  EXPECT_EQ(mp_json_get_bool(&ctx, j, "t.json", "absent", 0, &b), MP_OK);
  EXPECT_EQ(mp_json_get_int(&ctx, j, "t.json", "n", 0, &i), MP_OK);
  EXPECT_EQ(mp_json_get_str(&ctx, j, "t.json", "absent", 0, s, sizeof s), MP_OK);
  EXPECT_EQ(v, 5);
  EXPECT_EQ(d, 1.5);
  EXPECT_EQ(b, 1);
  EXPECT_EQ(i, 9);
  EXPECT_STREQ(s, "dflt");
}

TEST_F(JsonTest, WrongTypeIsAnErrorEvenWhenOptional) {
  int64_t v = 0;
  EXPECT_EQ(mp_json_get_i64(&ctx, j, "t.json", "s", 0, &v), MP_ERR_INVALID);
  EXPECT_EQ(msg(), "t.json: key 's': expected an integer, got a string");
  double d = 0;
  EXPECT_EQ(mp_json_get_f64(&ctx, j, "t.json", "b", 0, &d), MP_ERR_INVALID);
  EXPECT_EQ(msg(), "t.json: key 'b': expected a number, got a boolean");
  int b = 0;
  EXPECT_EQ(mp_json_get_bool(&ctx, j, "t.json", "i", 0, &b), MP_ERR_INVALID);
  EXPECT_EQ(msg(), "t.json: key 'i': expected true or false, got a number");
  char s[16];
  EXPECT_EQ(mp_json_get_str(&ctx, j, "t.json", "arr", 0, s, sizeof s), MP_ERR_INVALID);
  EXPECT_EQ(msg(), "t.json: key 'arr': expected a string, got an array");
  EXPECT_EQ(mp_json_get_str(&ctx, j, "t.json", "obj", 1, s, sizeof s), MP_ERR_INVALID);
  EXPECT_TRUE(Contains(msg(), "got an object"));
}

TEST_F(JsonTest, FractionalAndOversizedIntegersAreRejected) {
  int64_t v = 0;
  EXPECT_EQ(mp_json_get_i64(&ctx, j, "t.json", "frac", 1, &v), MP_ERR_INVALID);
  EXPECT_EQ(msg(), "t.json: key 'frac': expected an integer, got a fractional number");
  // 1e300 is integral as a double but does not fit an int64.
  EXPECT_EQ(mp_json_get_i64(&ctx, j, "t.json", "big", 1, &v), MP_ERR_INVALID);
  int i = 0;
  EXPECT_EQ(mp_json_get_int(&ctx, j, "t.json", "huge_int", 1, &i), MP_ERR_INVALID);
  EXPECT_TRUE(Contains(msg(), "4294967296 is out of range")) << msg();
}

TEST_F(JsonTest, DoublesBoolsStrings) {
  double d = 0;
  ASSERT_EQ(mp_json_get_f64(&ctx, j, "t.json", "f", 1, &d), MP_OK);
  EXPECT_EQ(d, 0.125);
  ASSERT_EQ(mp_json_get_f64(&ctx, j, "t.json", "i", 1, &d), MP_OK);  // an integer is a number
  EXPECT_EQ(d, 42.0);
  int b = 0;
  ASSERT_EQ(mp_json_get_bool(&ctx, j, "t.json", "b", 1, &b), MP_OK);
  EXPECT_EQ(b, 1);
  char s[6];  // "hello" needs exactly 6 bytes
  ASSERT_EQ(mp_json_get_str(&ctx, j, "t.json", "s", 1, s, sizeof s), MP_OK);
  EXPECT_STREQ(s, "hello");
}

TEST_F(JsonTest, TooLongStringIsAnErrorAndLeavesBufferAlone) {
  char s[5] = "abcd";
  EXPECT_EQ(mp_json_get_str(&ctx, j, "t.json", "s", 1, s, sizeof s), MP_ERR_INVALID);
  EXPECT_EQ(msg(), "t.json: key 's': string longer than 4 characters");
  EXPECT_STREQ(s, "abcd");
}

TEST(JsonParse, MalformedJsonNamesLineAndColumn) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  cJSON *j = nullptr;
  // Line 3 is `  "b": ]`: the stray ']' is its 8th character.
  const char *text = "{\n  \"a\": 1,\n  \"b\": ]\n}\n";
  EXPECT_EQ(mp_json_parse(&ctx, text, "bad.json", &j), MP_ERR_INVALID);
  EXPECT_EQ(j, nullptr);
  EXPECT_STREQ(mp_errmsg(&ctx), "bad.json: malformed JSON at line 3, column 8; fix the file");
}

TEST(JsonParse, MissingCommaAndTrailingGarbage) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  cJSON *j = nullptr;
  // Line 2 `"a": 1 "b": 2`: cJSON stops at the '"' that should have been a ',' (column 8).
  EXPECT_EQ(mp_json_parse(&ctx, "{\n\"a\": 1 \"b\": 2}", "m.json", &j), MP_ERR_INVALID);
  EXPECT_TRUE(Contains(mp_errmsg(&ctx), "m.json: malformed JSON at line 2, column 8"))
      << mp_errmsg(&ctx);
  // A complete object followed by more text is malformed too (require_null_terminated).
  EXPECT_EQ(mp_json_parse(&ctx, "{}\n}", "g.json", &j), MP_ERR_INVALID);
  EXPECT_TRUE(Contains(mp_errmsg(&ctx), "g.json: malformed JSON at line 2, column 1"))
      << mp_errmsg(&ctx);
  EXPECT_EQ(mp_json_parse(&ctx, "", "e.json", &j), MP_ERR_INVALID);
  EXPECT_TRUE(Contains(mp_errmsg(&ctx), "e.json: malformed JSON at line 1, column 1"));
}

TEST(JsonParse, TopLevelMustBeAnObject) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  cJSON *j = nullptr;
  EXPECT_EQ(mp_json_parse(&ctx, "[1, 2]", "a.json", &j), MP_ERR_INVALID);
  EXPECT_STREQ(mp_errmsg(&ctx), "a.json: expected a JSON object at the top level");
  EXPECT_EQ(j, nullptr);
}

TEST(JsonFile, ReadParseAndErrors) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  std::string dir = TmpDir();
  std::string path = dir + "/m.json";
  {
    std::ofstream f(path);
    f << "{\"vocab\": 256}";
  }
  cJSON *j = nullptr;
  ASSERT_EQ(mp_json_parse_file(&ctx, path.c_str(), &j), MP_OK) << mp_errmsg(&ctx);
  int64_t v = 0;
  EXPECT_EQ(mp_json_get_i64(&ctx, j, path.c_str(), "vocab", 1, &v), MP_OK);
  EXPECT_EQ(v, 256);
  cJSON_Delete(j);

  char *text = nullptr;
  size_t len = 0;
  ASSERT_EQ(mp_read_file(&ctx, path.c_str(), &text, &len), MP_OK);
  EXPECT_EQ(len, 14u);
  EXPECT_STREQ(text, "{\"vocab\": 256}");
  free(text);

  std::string missing = dir + "/nope.json";
  EXPECT_EQ(mp_json_parse_file(&ctx, missing.c_str(), &j), MP_ERR_NOT_FOUND);
  EXPECT_TRUE(Contains(mp_errmsg(&ctx), missing + ": cannot open"));
  // A directory is not a file: an input error naming what it is, not a bogus size.
  EXPECT_EQ(mp_read_file(&ctx, dir.c_str(), &text, &len), MP_ERR_INVALID);
  EXPECT_TRUE(Contains(mp_errmsg(&ctx), "is a directory, not a regular file")) << mp_errmsg(&ctx);
}

TEST(JsonFile, MalformedFileNamesThePath) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  std::string path = TmpDir() + "/bad.json";
  {
    std::ofstream f(path);
    f << "{\"a\": 1,\n \"b\": tru}";  // 'tru' starts at line 2, column 7
  }
  cJSON *j = nullptr;
  EXPECT_EQ(mp_json_parse_file(&ctx, path.c_str(), &j), MP_ERR_INVALID);
  EXPECT_EQ(std::string(mp_errmsg(&ctx)),
            path + ": malformed JSON at line 2, column 7; fix the file");
}

TEST(WriteAtomic, WritesAndLeavesNoTempFile) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  std::string dir = TmpDir();
  std::string path = dir + "/out.txt";
  std::string data = "first version\n";
  ASSERT_EQ(mp_write_file_atomic(&ctx, path.c_str(), data.data(), data.size()), MP_OK)
      << mp_errmsg(&ctx);
  EXPECT_EQ(Slurp(path), data);
  EXPECT_EQ(CountEntries(dir), 1);  // no out.txt.tmp.<pid> left behind
  ASSERT_EQ(mp_write_file_atomic(&ctx, path.c_str(), "", 0), MP_OK);
  EXPECT_EQ(Slurp(path), "");
  EXPECT_EQ(CountEntries(dir), 1);
}

// Replacement by rename: a reader that opened the old file keeps reading the old contents in
// full, and the path then names a different inode. A truncate-and-rewrite would fail both.
TEST(WriteAtomic, ReplacesTheTargetByRename) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  std::string dir = TmpDir();
  std::string path = dir + "/db.json";
  std::string v1 = "{\"version\": 1, \"payload\": \"" + std::string(10000, 'a') + "\"}";
  std::string v2 = "{\"version\": 2}";
  ASSERT_EQ(mp_write_file_atomic(&ctx, path.c_str(), v1.data(), v1.size()), MP_OK);
  struct stat before, after;
  ASSERT_EQ(stat(path.c_str(), &before), 0);
  FILE *reader = fopen(path.c_str(), "rb");
  ASSERT_NE(reader, nullptr);
  ASSERT_EQ(mp_write_file_atomic(&ctx, path.c_str(), v2.data(), v2.size()), MP_OK);
  ASSERT_EQ(stat(path.c_str(), &after), 0);
  EXPECT_NE(before.st_ino, after.st_ino);
  std::string old;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, reader)) > 0) old.append(buf, n);
  fclose(reader);
  EXPECT_EQ(old, v1);
  EXPECT_EQ(Slurp(path), v2);
  EXPECT_EQ(CountEntries(dir), 1);
}

TEST(WriteAtomic, UnwritableDirectoryIsAnIoError) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  std::string path = TmpDir() + "/no/such/dir/out.txt";
  EXPECT_EQ(mp_write_file_atomic(&ctx, path.c_str(), "x", 1), MP_ERR_IO);
  EXPECT_TRUE(Contains(mp_errmsg(&ctx), "cannot create")) << mp_errmsg(&ctx);
}

TEST(WriteAtomic, TargetIsADirectoryFailsAndCleansUp) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  std::string dir = TmpDir();
  std::string target = dir + "/sub";
  mkdir(target.c_str(), 0700);
  std::string inner = target + "/keep";
  { std::ofstream f(inner); f << "k"; }
  // A directory is refused before anything is written: it stays, no temp file is left.
  EXPECT_EQ(mp_write_file_atomic(&ctx, target.c_str(), "x", 1), MP_ERR_IO);
  EXPECT_TRUE(Contains(mp_errmsg(&ctx), target + ": cannot write: it is a directory"))
      << mp_errmsg(&ctx);
  EXPECT_EQ(CountEntries(dir), 1);
  EXPECT_EQ(CountEntries(target), 1);
}

}  // namespace
