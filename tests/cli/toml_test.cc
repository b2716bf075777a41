// app/toml.h: the TOML subset of torchtitan's job configs read into dotted keys, and
// everything outside the subset refused with its line, never skipped.
#include <gtest/gtest.h>

#include <string>

#include "app/toml.h"

namespace {

struct TomlTest : ::testing::Test {
  mp_ctx ctx;
  mp_toml t{};
  void SetUp() override { mp_ctx_init(&ctx); }
  void TearDown() override { mp_toml_free(&t); }
  mp_status Parse(const char *text) { return mp_toml_parse(&ctx, text, "c.toml", &t); }
};

// torchtitan's llama3_8b.toml (v0.2.0) in its forms: tables, a dotted table, comments after
// values, `enable=false` without spaces, an array over lines with a trailing comma.
TEST_F(TomlTest, ReadsTorchtitanConfig) {
  ASSERT_EQ(Parse("# NOTE: a preset\n[job]\ndump_folder = \"./outputs\"\n\n[training]\nlocal_batch_size = 1\n"
                  "seq_len = 8_192\nmax_norm = 1.0  # grad norm clipping\n[compile]\nenable=false\n"
                  "components = [\"model\",\n  \"loss\",  # both\n]\n[quantize.linear.float8]\n"
                  "filter_fqns = ['output']\n\"quoted key\".x = -3\n"),
            MP_OK)
      << mp_errmsg(&ctx);
  ASSERT_EQ(t.n, 8);
  const mp_toml_kv *kv = mp_toml_get(&t, "job.dump_folder");
  ASSERT_NE(kv, nullptr);
  EXPECT_EQ(kv->type, MP_TOML_STRING);
  EXPECT_STREQ(kv->str, "./outputs");
  kv = mp_toml_get(&t, "training.seq_len");
  ASSERT_NE(kv, nullptr);
  EXPECT_EQ(kv->type, MP_TOML_INT);
  EXPECT_EQ(kv->i, 8192);
  EXPECT_EQ(kv->line, 7);
  kv = mp_toml_get(&t, "training.max_norm");
  ASSERT_NE(kv, nullptr);
  EXPECT_EQ(kv->type, MP_TOML_FLOAT);
  EXPECT_DOUBLE_EQ(kv->f, 1.0);
  kv = mp_toml_get(&t, "compile.enable");
  ASSERT_NE(kv, nullptr);
  EXPECT_EQ(kv->type, MP_TOML_BOOL);
  EXPECT_EQ(kv->i, 0);
  kv = mp_toml_get(&t, "compile.components");
  ASSERT_NE(kv, nullptr);
  ASSERT_EQ(kv->type, MP_TOML_ARRAY);
  ASSERT_EQ(kv->n_items, 2);
  EXPECT_STREQ(kv->items[0], "model");
  EXPECT_STREQ(kv->items[1], "loss");
  kv = mp_toml_get(&t, "quantize.linear.float8.filter_fqns");
  ASSERT_NE(kv, nullptr);
  EXPECT_STREQ(kv->items[0], "output");
  kv = mp_toml_get(&t, "quantize.linear.float8.quoted key.x");
  ASSERT_NE(kv, nullptr);
  EXPECT_EQ(kv->i, -3);
}

TEST_F(TomlTest, EscapesInBasicStrings) {
  ASSERT_EQ(Parse("a = \"x\\\"y\\\\z\\tw\"\nb = 'C:\\path'\n"), MP_OK) << mp_errmsg(&ctx);
  EXPECT_STREQ(mp_toml_get(&t, "a")->str, "x\"y\\z\tw");
  EXPECT_STREQ(mp_toml_get(&t, "b")->str, "C:\\path");  // literal: no escapes
}

// Outside the subset: refused with the origin and the line, naming what is not read.
TEST_F(TomlTest, RefusesOutsideTheSubset) {
  const struct {
    const char *text, *want;
  } cases[] = {
      {"[a]\nx = 1\nx = 2\n", "c.toml:3: a.x is given twice"},
      {"[[layers]]\n", "c.toml:1: arrays of tables ([[...]]) are not read"},
      {"x = {a = 1}\n", "c.toml:1: x: inline tables are not read"},
      {"x = [[1], [2]]\n", "c.toml:1: x: nested arrays and inline tables are not read"},
      {"x = \"\"\"long\"\"\"\n", "c.toml:1: multi-line strings are not read"},
      {"x = 1979-05-27\n", "is not a string, number, boolean or array"},
      {"x = inf\n", "is not a string, number, boolean or array"},
      {"x = \"open\n", "c.toml:1: unterminated string"},
      {"x = 1 2\n", "c.toml:1: x: unexpected text after the value"},
      {"x 1\n", "c.toml:1: x: expected '=' after the key"},
      {"[a\n", "c.toml:1: expected ']' after the table's name"},
  };
  for (const auto &c : cases) {
    mp_toml_free(&t);
    EXPECT_EQ(Parse(c.text), MP_ERR_INVALID) << c.text;
    EXPECT_NE(std::string(mp_errmsg(&ctx)).find(c.want), std::string::npos) << c.text << ": " << mp_errmsg(&ctx);
  }
}

}  // namespace
