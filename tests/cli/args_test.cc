// app/args.h: flags with values, switches, --flag=value, positionals, usage errors that
// name the flag, and integer/number conversion.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "app/args.h"

namespace {

struct ArgsTest : ::testing::Test {
  mp_opt opts[5] = {
      {"--model", "M", "model name or path", nullptr},
      {"--gpus", "N", "number of GPUs", nullptr},
      {"--lr", "X", "learning rate", nullptr},
      {"--verbose", nullptr, "say more", nullptr},
      {nullptr, nullptr, nullptr, nullptr},
  };
  mp_cmd_spec spec = {"plan", "Rank meshes.", "[options] [OUT]", opts, 1};
  mp_ctx ctx;
  const char *pos[4] = {nullptr, nullptr, nullptr, nullptr};
  int n_pos = -1, help = -1;

  void SetUp() override { mp_ctx_init(&ctx); }
  mp_status Parse(std::vector<std::string> args) {
    std::vector<char *> argv;
    store_ = args;  // keep the strings alive: the parser stores pointers into argv
    for (auto &s : store_) argv.push_back(&s[0]);
    return mp_args_parse(&ctx, &spec, (int)argv.size(), argv.data(), pos, &n_pos, &help);
  }
  std::string msg() const { return mp_errmsg(&ctx); }
  std::vector<std::string> store_;
};

TEST_F(ArgsTest, NothingGiven) {
  ASSERT_EQ(Parse({}), MP_OK);
  EXPECT_EQ(n_pos, 0);
  EXPECT_EQ(help, 0);
  EXPECT_EQ(mp_args_get(&spec, "--model"), nullptr);
  EXPECT_FALSE(mp_args_has(&spec, "--verbose"));
}

TEST_F(ArgsTest, ValuesSwitchesAndEqualsForm) {
  ASSERT_EQ(Parse({"--model", "llama3.1-8b", "--gpus=16", "--verbose", "out.db"}), MP_OK)
      << msg();
  EXPECT_STREQ(mp_args_get(&spec, "--model"), "llama3.1-8b");
  EXPECT_STREQ(mp_args_get(&spec, "--gpus"), "16");
  EXPECT_STREQ(mp_args_get(&spec, "--verbose"), "1");
  EXPECT_TRUE(mp_args_has(&spec, "--verbose"));
  ASSERT_EQ(n_pos, 1);
  EXPECT_STREQ(pos[0], "out.db");
  EXPECT_EQ(mp_args_get(&spec, "--nonexistent"), nullptr);
}

// A metavar in quotes takes a command line of its own (--from-args '--tensor-model-parallel-size 2'):
// the next argument even when it opens with "--"; any other value-taking flag refuses it.
TEST_F(ArgsTest, QuotedMetavarTakesAFlagLikeValue) {
  mp_opt own[3] = {
      {"--from-args", "'ARGS'", "arguments of another program", nullptr},
      {"--model", "M", "model name or path", nullptr},
      {nullptr, nullptr, nullptr, nullptr},
  };
  mp_cmd_spec s2 = {"simulate", "Predict.", "[options]", own, 0};
  std::vector<std::string> args = {"--from-args", "--tensor-model-parallel-size 2 --bf16", "--model", "--x"};
  std::vector<char *> argv;
  for (auto &a : args) argv.push_back(&a[0]);
  EXPECT_EQ(mp_args_parse(&ctx, &s2, 2, argv.data(), pos, &n_pos, &help), MP_OK) << msg();
  EXPECT_STREQ(mp_args_get(&s2, "--from-args"), "--tensor-model-parallel-size 2 --bf16");
  EXPECT_EQ(mp_args_parse(&ctx, &s2, 4, argv.data(), pos, &n_pos, &help), MP_ERR_USAGE);
  EXPECT_NE(msg().find("--model needs a value"), std::string::npos) << msg();
}

TEST_F(ArgsTest, EqualsFormKeepsLaterEqualsSigns) {
  ASSERT_EQ(Parse({"--model=a=b"}), MP_OK);
  EXPECT_STREQ(mp_args_get(&spec, "--model"), "a=b");
}

TEST_F(ArgsTest, NegativeNumberIsAValueNotAFlag) {
  ASSERT_EQ(Parse({"--gpus", "-1"}), MP_OK) << msg();
  EXPECT_STREQ(mp_args_get(&spec, "--gpus"), "-1");
}

TEST_F(ArgsTest, LaterValueWins) {
  ASSERT_EQ(Parse({"--model", "a", "--model", "b"}), MP_OK);
  EXPECT_STREQ(mp_args_get(&spec, "--model"), "b");
}

TEST_F(ArgsTest, ValuesAreClearedBetweenParses) {
  ASSERT_EQ(Parse({"--model", "a", "--verbose"}), MP_OK);
  ASSERT_EQ(Parse({}), MP_OK);
  EXPECT_EQ(mp_args_get(&spec, "--model"), nullptr);
  EXPECT_EQ(mp_args_get(&spec, "--verbose"), nullptr);
}

TEST_F(ArgsTest, HelpFlag) {
  ASSERT_EQ(Parse({"--help"}), MP_OK);
  EXPECT_EQ(help, 1);
  ASSERT_EQ(Parse({"--model", "x", "-h"}), MP_OK);
  EXPECT_EQ(help, 1);
}

TEST_F(ArgsTest, UnknownFlagIsAUsageErrorNamingIt) {
  EXPECT_EQ(Parse({"--bogus"}), MP_ERR_USAGE);
  EXPECT_EQ(msg(), "unknown flag '--bogus'; see 'meshplan plan --help'");
  // The =value part is not part of the flag's name.
  EXPECT_EQ(Parse({"--bogus=3"}), MP_ERR_USAGE);
  EXPECT_EQ(msg(), "unknown flag '--bogus'; see 'meshplan plan --help'");
  // A prefix of a real flag is not that flag.
  EXPECT_EQ(Parse({"--mod", "x"}), MP_ERR_USAGE);
  EXPECT_NE(msg().find("'--mod'"), std::string::npos);
  EXPECT_EQ(Parse({"-x"}), MP_ERR_USAGE);
}

TEST_F(ArgsTest, MissingValueNamesFlagAndWhatItTakes) {
  EXPECT_EQ(Parse({"--model"}), MP_ERR_USAGE);
  EXPECT_EQ(msg(), "--model needs a value (M): model name or path");
  // Followed by another flag: still missing.
  EXPECT_EQ(Parse({"--model", "--verbose"}), MP_ERR_USAGE);
  EXPECT_EQ(msg(), "--model needs a value (M): model name or path");
  EXPECT_EQ(Parse({"--gpus="}), MP_ERR_USAGE);
  EXPECT_EQ(msg(), "--gpus needs a value (N): number of GPUs");
}

TEST_F(ArgsTest, SwitchTakesNoValue) {
  EXPECT_EQ(Parse({"--verbose=1"}), MP_ERR_USAGE);
  EXPECT_EQ(msg(), "--verbose takes no value");
}

TEST_F(ArgsTest, TooManyPositionals) {
  EXPECT_EQ(Parse({"a", "b"}), MP_ERR_USAGE);
  EXPECT_EQ(msg(), "unexpected argument 'b'; see 'meshplan plan --help'");
  spec.max_positional = 0;
  EXPECT_EQ(Parse({"a"}), MP_ERR_USAGE);
  EXPECT_EQ(msg(), "unexpected argument 'a'; see 'meshplan plan --help'");
}

// Messages carry no prefix: the command's failure path adds "meshplan plan: " once.
TEST_F(ArgsTest, IntParsing) {
  long long v = 7;
  ASSERT_EQ(Parse({}), MP_OK);
  EXPECT_EQ(mp_args_int(&ctx, &spec, "--gpus", 1, 1 << 20, &v), MP_OK);  // absent: unchanged
  EXPECT_EQ(v, 7);
  ASSERT_EQ(Parse({"--gpus", "16384"}), MP_OK);
  EXPECT_EQ(mp_args_int(&ctx, &spec, "--gpus", 1, 1 << 20, &v), MP_OK);
  EXPECT_EQ(v, 16384);
  for (const char *bad : {"12x", "", "1.5", "abc", "99999999999999999999", "0", "-3", "1048577",
                          "9223372036854775807"}) {
    v = 7;
    ASSERT_EQ(Parse({"--gpus", bad}), MP_OK) << bad;  // the parser keeps text; conversion judges
    EXPECT_EQ(mp_args_int(&ctx, &spec, "--gpus", 1, 1 << 20, &v), MP_ERR_USAGE) << bad;
    EXPECT_EQ(v, 7) << bad;
    EXPECT_EQ(msg(), std::string("--gpus '") + bad + "': expected an integer in 1..1048576");
  }
  ASSERT_EQ(Parse({"--gpus", "-3"}), MP_OK);
  EXPECT_EQ(mp_args_int(&ctx, &spec, "--gpus", -5, 5, &v), MP_OK);
  EXPECT_EQ(v, -3);
}

TEST_F(ArgsTest, DoubleParsing) {
  double x = 0.5;
  ASSERT_EQ(Parse({"--lr", "3e-4"}), MP_OK);
  EXPECT_EQ(mp_args_double(&ctx, &spec, "--lr", 0.0, 1.0, MP_RANGE_CLOSED, &x), MP_OK);
  EXPECT_DOUBLE_EQ(x, 3e-4);
  // strtod reads nan, inf and 1e999 (as inf): none is a finite number in the range
  for (const char *bad : {"fast", "1e-4x", "nan", "-nan", "inf", "1e999", "-1", "1000", "0x1p+4"}) {
    x = 0.5;
    ASSERT_EQ(Parse({"--lr", bad}), MP_OK) << bad;
    EXPECT_EQ(mp_args_double(&ctx, &spec, "--lr", 0.0, 1.0, MP_RANGE_CLOSED, &x), MP_ERR_USAGE) << bad;
    EXPECT_EQ(x, 0.5) << bad;
    EXPECT_EQ(msg(), std::string("--lr '") + bad + "': expected a number in [0, 1]");
  }
  ASSERT_EQ(Parse({"--lr", "0"}), MP_OK);
  EXPECT_EQ(mp_args_double(&ctx, &spec, "--lr", 0.0, 1.0, MP_RANGE_OPEN_LO, &x), MP_ERR_USAGE);
  EXPECT_EQ(msg(), "--lr '0': expected a number in (0, 1]");
}

TEST_F(ArgsTest, HelpListsEveryOptionFromTheTable) {
  char *buf = nullptr;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  mp_args_print_help(&spec, f);
  fclose(f);
  std::string h(buf, len);
  free(buf);
  EXPECT_EQ(h.rfind("usage: meshplan plan [options] [OUT]\n", 0), 0u) << h;
  EXPECT_NE(h.find("Rank meshes."), std::string::npos);
  EXPECT_NE(h.find("--model M"), std::string::npos);
  EXPECT_NE(h.find("--gpus N"), std::string::npos);
  EXPECT_NE(h.find("--verbose "), std::string::npos);
  EXPECT_NE(h.find("say more"), std::string::npos);
  EXPECT_NE(h.find("-h, --help"), std::string::npos);
}

}  // namespace
