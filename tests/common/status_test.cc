// common/status.h: messages on the context, prefixing, exit codes and the MP_CHECK macros.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "common/status.h"

namespace {

TEST(Status, InitLeavesNoMessage) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  EXPECT_EQ(ctx.last, MP_OK);
  EXPECT_STREQ(mp_errmsg(&ctx), "");
  EXPECT_STREQ(mp_errmsg(nullptr), "");
}

TEST(Status, ErrorRecordsCodeAndFormattedMessage) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_status s = mp_error(&ctx, MP_ERR_INVALID, "tp=%d does not divide n_kv_heads=%d", 3, 8);
  EXPECT_EQ(s, MP_ERR_INVALID);
  EXPECT_EQ(ctx.last, MP_ERR_INVALID);
  EXPECT_STREQ(mp_errmsg(&ctx), "tp=3 does not divide n_kv_heads=8");
  // A later error replaces the message (the last error is the one kept).
  mp_error(&ctx, MP_ERR_IO, "second");
  EXPECT_EQ(ctx.last, MP_ERR_IO);
  EXPECT_STREQ(mp_errmsg(&ctx), "second");
}

TEST(Status, ErrorOnNullContextStillReturnsCode) {
  EXPECT_EQ(mp_error(nullptr, MP_ERR_NOMEM, "x"), MP_ERR_NOMEM);
  mp_error_prefix(nullptr, "ignored");  // must not crash
}

TEST(Status, LongMessageIsTruncatedNotOverflowed) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  std::string big(3 * MP_ERRMSG_MAX, 'x');
  mp_error(&ctx, MP_ERR_INVALID, "%s", big.c_str());
  EXPECT_EQ(std::string(mp_errmsg(&ctx)).size(), (size_t)MP_ERRMSG_MAX - 1);
}

TEST(Status, PrefixAddsContextInFront) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_error(&ctx, MP_ERR_INVALID, "key 'n_heads': expected an integer");
  mp_error_prefix(&ctx, "reading %s", "x.json");
  EXPECT_STREQ(mp_errmsg(&ctx), "reading x.json: key 'n_heads': expected an integer");
  mp_error_prefix(&ctx, "outer");
  EXPECT_STREQ(mp_errmsg(&ctx), "outer: reading x.json: key 'n_heads': expected an integer");
  EXPECT_EQ(ctx.last, MP_ERR_INVALID);  // prefixing keeps the code
}

TEST(Status, PrefixOfAFullMessageStaysBounded) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  std::string big(MP_ERRMSG_MAX - 1, 'y');
  mp_error(&ctx, MP_ERR_INVALID, "%s", big.c_str());
  mp_error_prefix(&ctx, "pre");
  std::string m = mp_errmsg(&ctx);
  EXPECT_EQ(m.size(), (size_t)MP_ERRMSG_MAX - 1);
  EXPECT_EQ(m.substr(0, 5), "pre: ");
}

// status.h: 2 when the user must change what they gave (command line, file contents, a
// path, a database, a request this build cannot do); 1 when accepted work failed.
TEST(Status, ExitCodes) {
  EXPECT_EQ(mp_status_exit_code(MP_OK), 0);
  EXPECT_EQ(mp_status_exit_code(MP_ERR_USAGE), 2);
  EXPECT_EQ(mp_status_exit_code(MP_ERR_INVALID), 2);
  EXPECT_EQ(mp_status_exit_code(MP_ERR_NOT_FOUND), 2);  // a misspelt model name is input
  EXPECT_EQ(mp_status_exit_code(MP_ERR_ORDER), 2);      // passes in a wrong order: user input
  EXPECT_EQ(mp_status_exit_code(MP_ERR_IO), 2);         // cannot open/write a path given
  EXPECT_EQ(mp_status_exit_code(MP_ERR_DB), 2);         // a --db that cannot be used
  EXPECT_EQ(mp_status_exit_code(MP_ERR_UNSUPPORTED), 2);  // --device cuda without a GPU
  EXPECT_EQ(mp_status_exit_code(MP_ERR_NOMEM), 1);
  EXPECT_EQ(mp_status_exit_code(MP_ERR_CUDA), 1);
  EXPECT_EQ(mp_status_exit_code(MP_ERR_NCCL), 1);
  EXPECT_EQ(mp_status_exit_code(MP_ERR_MPI), 1);
  EXPECT_EQ(mp_status_exit_code(MP_ERR_TIMEOUT), 1);
  EXPECT_EQ(mp_status_exit_code(MP_ERR_NOSPACE), 1);    // a full disk: the input was fine
  EXPECT_EQ(mp_status_exit_code(MP_ERR_INTERNAL), 1);
}

TEST(Status, EveryCodeHasADistinctName) {
  std::set<std::string> names;
  for (int s = MP_OK; s <= MP_ERR_INTERNAL; s++) {
    std::string n = mp_status_name((mp_status)s);
    EXPECT_NE(n, "unknown") << s;
    names.insert(n);
  }
  EXPECT_EQ(names.size(), (size_t)(MP_ERR_INTERNAL + 1));
  EXPECT_STREQ(mp_status_name((mp_status)999), "unknown");
}

// The macros, used the way library code uses them.
int g_cleanups = 0;

mp_status Inner(mp_ctx *ctx, int fail) {
  if (fail) return mp_error(ctx, MP_ERR_NOT_FOUND, "inner: no such model");
  return MP_OK;
}

mp_status Outer(mp_ctx *ctx, int fail, int *reached) {
  *reached = 0;
  MP_CHECK(Inner(ctx, fail));
  *reached = 1;
  return MP_OK;
}

mp_status WithCleanup(mp_ctx *ctx, int fail) {
  mp_status st = MP_OK;
  MP_CHECK_GOTO(Inner(ctx, fail), st, done);
  st = MP_OK;
done:
  g_cleanups++;
  return st;
}

mp_status Alloc(mp_ctx *ctx, void *p) {
  MP_CHECK_ALLOC(ctx, p);
  return MP_OK;
}

TEST(Status, CheckPassesInnermostFailureUp) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  int reached = -1;
  EXPECT_EQ(Outer(&ctx, 0, &reached), MP_OK);
  EXPECT_EQ(reached, 1);
  EXPECT_EQ(Outer(&ctx, 1, &reached), MP_ERR_NOT_FOUND);
  EXPECT_EQ(reached, 0);
  EXPECT_STREQ(mp_errmsg(&ctx), "inner: no such model");
}

TEST(Status, CheckGotoRunsTheCleanupOnBothPaths) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  g_cleanups = 0;
  EXPECT_EQ(WithCleanup(&ctx, 0), MP_OK);
  EXPECT_EQ(WithCleanup(&ctx, 1), MP_ERR_NOT_FOUND);
  EXPECT_EQ(g_cleanups, 2);
}

TEST(Status, CheckAllocTurnsNullIntoNomem) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  int x = 0;
  EXPECT_EQ(Alloc(&ctx, &x), MP_OK);
  EXPECT_EQ(Alloc(&ctx, nullptr), MP_ERR_NOMEM);
  EXPECT_NE(std::string(mp_errmsg(&ctx)).find("out of memory"), std::string::npos);
}

// Hostile text quoted in a message (a JSON value, a flag, a path) cannot split the line or
// send escapes to the terminal: breaks become spaces, other control bytes '?', UTF-8 stays.
TEST(Status, MessagesAreOneLineOfText) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_error(&ctx, MP_ERR_INVALID, "key 'family': got \"%s\"", "g\n12\r\t\x1b[31mred\x7f \xc3\xa9");
  EXPECT_STREQ(mp_errmsg(&ctx), "key 'family': got \"g 12  ?[31mred? \xc3\xa9\"");
  mp_error_prefix(&ctx, "path\nwith break");
  EXPECT_EQ(std::string(mp_errmsg(&ctx)).find('\n'), std::string::npos);
  EXPECT_EQ(std::string(mp_errmsg(&ctx)).rfind("path with break: ", 0), 0u);
}

}  // namespace
