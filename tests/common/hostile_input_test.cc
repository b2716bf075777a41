// common/checked.h, common/validate.h, common/file.h and common/json.h: overflow-safe size
// arithmetic, range checks with one message form, inputs that are regular files only, and
// JSON that means one thing to every reader.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "common/checked.h"
#include "common/file.h"
#include "common/json.h"
#include "common/validate.h"

namespace {

std::string TmpDir() {
  const char *t = getenv("TEST_TMPDIR");
  std::string base = t ? t : "/tmp";
  static int n = 0;
  std::string d = base + "/hostile_test." + std::to_string(getpid()) + "." + std::to_string(n++);
  mkdir(d.c_str(), 0700);
  return d;
}

TEST(Checked, ProductsThatFitAndThatDoNot) {
  int64_t p = 0;
  EXPECT_EQ(mp_mul_i64(1 << 20, 1 << 20, &p), 0);
  EXPECT_EQ(p, int64_t(1) << 40);
  // 2^62 x 2 = 2^63 does not fit (INT64_MAX = 2^63 - 1): the issue's --global-batch
  // 4611686018427387904 doubled by the micro-batch loop.
  EXPECT_NE(mp_mul_i64(int64_t(1) << 62, 2, &p), 0);
  EXPECT_NE(mp_mul_i64(-(int64_t(1) << 62), 4, &p), 0);
  EXPECT_EQ(mp_mul_i64(-(int64_t(1) << 62), 2, &p), 0);  // INT64_MIN itself fits
  EXPECT_EQ(p, INT64_MIN);
  EXPECT_NE(mp_add_i64(INT64_MAX, 1, &p), 0);
  EXPECT_EQ(mp_add_i64(INT64_MAX - 1, 1, &p), 0);
  size_t z = 0;
  EXPECT_NE(mp_mul_size(SIZE_MAX / 2 + 1, 2, &z), 0);
  EXPECT_EQ(mp_mul_size(SIZE_MAX / 2, 2, &z), 0);
  EXPECT_NE(mp_add_size(SIZE_MAX, 1, &z), 0);
  // batch x seq x d_model x 4 bytes of a 9223372036854775807-token sequence
  const int64_t v[4] = {4, INT64_MAX, 4096, 4};
  EXPECT_NE(mp_prod_i64(v, 4, &p), 0);
  const int64_t w[3] = {8, 8192, 16384};  // 2^3 x 2^13 x 2^14 = 2^30
  ASSERT_EQ(mp_prod_i64(w, 3, &p), 0);
  EXPECT_EQ(p, int64_t(1) << 30);
  EXPECT_EQ(mp_prod_i64(w, 0, &p), 0);
  EXPECT_EQ(p, 1);
  EXPECT_EQ(mp_mul_i64_max(1 << 16, 1 << 16, int64_t(1) << 32, &p), 0);
  EXPECT_NE(mp_mul_i64_max(1 << 16, (1 << 16) + 1, int64_t(1) << 32, &p), 0);
}

TEST(Validate, IntegerRangeMessageNamesFieldValueAndRange) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  EXPECT_EQ(mp_check_i64(&ctx, "m.json", "d_model", 4096, 1, MP_LIM_D_MODEL), MP_OK);
  EXPECT_EQ(mp_check_i64(&ctx, "m.json", "d_model", 3000000000LL, 1, MP_LIM_D_MODEL), MP_ERR_INVALID);
  EXPECT_STREQ(mp_errmsg(&ctx), "m.json: d_model = 3000000000 is out of range; accepted 1..1048576");
  EXPECT_EQ(mp_check_i64(&ctx, nullptr, "--seq", 0, 1, MP_LIM_SEQ), MP_ERR_INVALID);
  EXPECT_STREQ(mp_errmsg(&ctx), "--seq = 0 is out of range; accepted 1..16777216");
}

TEST(Validate, FloatRangeRefusesNanInfAndTheOpenEnd) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  EXPECT_EQ(mp_check_f64(&ctx, "c.json", "bw", 0.0, 0, 100, MP_RANGE_OPEN_LO), MP_ERR_INVALID);
  EXPECT_STREQ(mp_errmsg(&ctx), "c.json: bw = 0 is out of range; accepted (0, 100]");
  EXPECT_EQ(mp_check_f64(&ctx, "c.json", "bw", NAN, 0, 100, MP_RANGE_OPEN_LO), MP_ERR_INVALID);
  EXPECT_STREQ(mp_errmsg(&ctx), "c.json: bw = nan is not a finite number; accepted (0, 100]");
  EXPECT_EQ(mp_check_f64(&ctx, "c.json", "bw", INFINITY, 0, INFINITY, MP_RANGE_CLOSED), MP_ERR_INVALID);
  EXPECT_EQ(mp_check_f64(&ctx, "c.json", "bw", 100, 0, 100, MP_RANGE_OPEN_LO), MP_OK);
  EXPECT_EQ(mp_check_f64(&ctx, "c.json", "h", 1.0, 0, 1, MP_RANGE_OPEN_HI), MP_ERR_INVALID);
  EXPECT_STREQ(mp_errmsg(&ctx), "c.json: h = 1 is out of range; accepted [0, 1)");
  EXPECT_EQ(mp_check_f64(&ctx, "c.json", "lat", -1.0, 0, 10, MP_RANGE_CLOSED), MP_ERR_INVALID);
  EXPECT_EQ(mp_check_f64(&ctx, "c.json", "lat", 0.0, 0, 10, MP_RANGE_CLOSED), MP_OK);
}

TEST(Json, InfinityIsNotANumberWeAccept) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  cJSON *j = nullptr;
  ASSERT_EQ(mp_json_parse(&ctx, "{\"x\": 1e999, \"y\": -1e999}", "t.json", &j), MP_OK);
  double d = 3;
  EXPECT_EQ(mp_json_get_f64(&ctx, j, "t.json", "x", 1, &d), MP_ERR_INVALID);
  EXPECT_STREQ(mp_errmsg(&ctx), "t.json: key 'x': expected a finite number, got inf");
  EXPECT_EQ(mp_json_get_f64(&ctx, j, "t.json", "y", 1, &d), MP_ERR_INVALID);
  EXPECT_EQ(d, 3);
  cJSON_Delete(j);
}

// A key given twice: cJSON keeps both members and its lookups return the first, Python's
// json (transformers, the scripts that write these files) keeps the last, so the same file
// meant two models. Every reader parses through mp_json_parse, which refuses it, naming
// the key and the line of its second occurrence.
std::string ParseError(const std::string &text) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  cJSON *j = nullptr;
  const mp_status st = mp_json_parse(&ctx, text.c_str(), "t.json", &j);
  cJSON_Delete(j);
  return st == MP_OK ? "OK" : mp_errmsg(&ctx);
}

TEST(Json, AKeyGivenTwiceIsRefusedWithItsLine) {
  EXPECT_EQ(ParseError("{\"n_heads\": 32,\n \"d_model\": 4096,\n \"n_heads\": 8}"),
            "t.json: key \"n_heads\" appears twice (line 3); remove one");
  // at any depth: in an object inside an array inside an object
  EXPECT_EQ(ParseError("{\"t\": [{\"k\": 1},\n {\"k\": 1,\n\n \"k\": 2}]}"),
            "t.json: key \"k\" appears twice (line 4); remove one");
  // the same key spelled with an escape is the same key to both readers
  EXPECT_EQ(ParseError("{\"a\": 1, \"\\u0061\": 2}"), "t.json: key \"a\" appears twice (line 1); remove one");
  // the repeat met first in the text is named: the inner one, before the outer's second "a"
  EXPECT_EQ(ParseError("{\"a\": {\"b\": 1,\n \"b\": 2},\n \"a\": 3}"),
            "t.json: key \"b\" appears twice (line 2); remove one");
  EXPECT_EQ(ParseError("{\"a\": 1,\n \"z\": {\"b\": 1,\n \"b\": 2},\n \"a\": 3}"),
            "t.json: key \"b\" appears twice (line 3); remove one");
  // strings holding braces, brackets, commas and escaped quotes do not lose the line
  EXPECT_EQ(ParseError("\xEF\xBB\xBF{\"s\": \"}{,[\\\"\", \"u\": [1, \"]\", {\"v\": \"\\\\\"}],\n \"s\": 2}"),
            "t.json: key \"s\" appears twice (line 2); remove one");
  // a large object (sorted, not compared pairwise): 100 keys, k50 again on the last line
  std::string big = "{";
  for (int i = 0; i < 100; i++) big += "\"k" + std::to_string(i) + "\": " + std::to_string(i) + ",\n";
  big += "\"k50\": 0}";
  EXPECT_EQ(ParseError(big), "t.json: key \"k50\" appears twice (line 101); remove one");
  // keys that differ (in case only, or in separate objects) are not repeats
  EXPECT_EQ(ParseError("{\"a\": 1, \"A\": 2, \"o\": {\"a\": 3}, \"p\": [{\"a\": 1}, {\"a\": 2}]}"), "OK");
  big.resize(big.rfind(",\n\"k50\""));
  EXPECT_EQ(ParseError(big + "}"), "OK");
}

// The entry point for bytes without a NUL (a safetensors header inside its file): the
// same refusals, the length respected, nothing but whitespace after the value.
TEST(Json, ParseLenReadsExactlyItsBytes) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  cJSON *j = nullptr;
  const char buf[] = "{\"x\": 1}   {\"y\": 2}";  // the first 11 bytes: an object and spaces
  ASSERT_EQ(mp_json_parse_len(&ctx, buf, 11, "h", &j), MP_OK) << mp_errmsg(&ctx);
  EXPECT_EQ(cJSON_GetArraySize(j), 1);
  cJSON_Delete(j);
  EXPECT_EQ(mp_json_parse_len(&ctx, buf, sizeof buf - 1, "h", &j), MP_ERR_INVALID);
  EXPECT_STREQ(mp_errmsg(&ctx), "h: malformed JSON at line 1, column 12; fix the file");
  EXPECT_EQ(mp_json_parse_len(&ctx, buf, 5, "h", &j), MP_ERR_INVALID);  // cut inside the object
  const char twice[] = "{\"x\": 1, \"x\": 2}";
  EXPECT_EQ(mp_json_parse_len(&ctx, twice, sizeof twice - 1, "h", &j), MP_ERR_INVALID);
  EXPECT_STREQ(mp_errmsg(&ctx), "h: key \"x\" appears twice (line 1); remove one");
  EXPECT_EQ(mp_json_parse_len(&ctx, "[1]", 3, "h", &j), MP_ERR_INVALID);
  EXPECT_STREQ(mp_errmsg(&ctx), "h: expected a JSON object at the top level");
}

// A FIFO with no writer: fopen would block forever; the input opener refuses it at once.
TEST(InputFile, FifoIsRefusedWithoutBlocking) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  std::string fifo = TmpDir() + "/model.json";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  alarm(10);  // a regression would block in open(): fail the test instead of hanging it
  char *text = nullptr;
  size_t len = 0;
  EXPECT_EQ(mp_read_file(&ctx, fifo.c_str(), &text, &len), MP_ERR_INVALID);
  alarm(0);
  EXPECT_EQ(std::string(mp_errmsg(&ctx)),
            fifo + ": is a named pipe (FIFO), not a regular file; give the path of a file");
  cJSON *j = nullptr;
  EXPECT_EQ(mp_json_parse_file(&ctx, fifo.c_str(), &j), MP_ERR_INVALID);
  EXPECT_EQ(mp_file_check_regular_or_absent(&ctx, fifo.c_str()), MP_ERR_INVALID);
}

TEST(InputFile, DevicesDirectoriesAndSocketsAreRefused) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  char *text = nullptr;
  size_t len = 0;
  EXPECT_EQ(mp_read_file(&ctx, "/dev/null", &text, &len), MP_ERR_INVALID);
  EXPECT_NE(std::string(mp_errmsg(&ctx)).find("/dev/null: is a character device"), std::string::npos);
  EXPECT_EQ(mp_read_file(&ctx, "/dev/zero", &text, &len), MP_ERR_INVALID);
  std::string dir = TmpDir();
  EXPECT_EQ(mp_read_file(&ctx, dir.c_str(), &text, &len), MP_ERR_INVALID);
  EXPECT_EQ(mp_file_check_regular_or_absent(&ctx, dir.c_str()), MP_ERR_INVALID);
  EXPECT_NE(std::string(mp_errmsg(&ctx)).find("is a directory"), std::string::npos);
  std::string sock = dir + "/s";
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  snprintf(a.sun_path, sizeof a.sun_path, "%s", sock.c_str());
  if (sock.size() < sizeof a.sun_path && bind(fd, (sockaddr *)&a, sizeof a) == 0) {
    EXPECT_EQ(mp_read_file(&ctx, sock.c_str(), &text, &len), MP_ERR_INVALID);
    EXPECT_NE(std::string(mp_errmsg(&ctx)).find("is a socket"), std::string::npos);
  }
  close(fd);
  // absent: fine for a database SQLite will create; a missing input is NOT_FOUND
  EXPECT_EQ(mp_file_check_regular_or_absent(&ctx, (dir + "/new.db").c_str()), MP_OK);
  EXPECT_EQ(mp_read_file(&ctx, (dir + "/none").c_str(), &text, &len), MP_ERR_NOT_FOUND);
}

TEST(InputFile, UnreadableFileNamesPathAndReason) {
  if (geteuid() == 0) GTEST_SKIP() << "root reads files whatever their mode";
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  std::string p = TmpDir() + "/secret.json";
  { std::ofstream f(p); f << "{}"; }
  chmod(p.c_str(), 0);
  char *text = nullptr;
  EXPECT_EQ(mp_read_file(&ctx, p.c_str(), &text, nullptr), MP_ERR_IO);
  EXPECT_EQ(std::string(mp_errmsg(&ctx)), p + ": cannot open: Permission denied");
}

TEST(InputFile, SizeCapIsStated) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  std::string p = TmpDir() + "/big.json";
  { std::ofstream f(p); f << std::string(100, ' '); }
  char *text = nullptr;
  size_t len = 0;
  EXPECT_EQ(mp_read_file_max(&ctx, p.c_str(), 99, &text, &len), MP_ERR_INVALID);
  EXPECT_EQ(std::string(mp_errmsg(&ctx)), p + ": 100 bytes, more than the 99 this input may hold");
  ASSERT_EQ(mp_read_file_max(&ctx, p.c_str(), 100, &text, &len), MP_OK);
  EXPECT_EQ(len, 100u);
  free(text);
}

TEST(OutputFile, FifoTargetIsRefusedNotOpened) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  std::string fifo = TmpDir() + "/trace.json";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_EQ(mp_write_file_atomic(&ctx, fifo.c_str(), "x", 1), MP_ERR_IO);
  EXPECT_EQ(std::string(mp_errmsg(&ctx)),
            fifo + ": cannot write: it is a named pipe (FIFO), not a regular file; give a file path");
  struct stat sb;
  ASSERT_EQ(stat(fifo.c_str(), &sb), 0);
  EXPECT_TRUE(S_ISFIFO(sb.st_mode));  // left as it was
}

// A write that runs out of room is the run's failure (exit 1), named with its path: a full
// disk or quota, and the file size limit (ulimit -f). The disk cannot be filled here; the
// limit can: in a child with RLIMIT_FSIZE of 100 bytes and SIGXFSZ caught (as meshplan's
// main catches it), writing 1000 bytes fails with EFBIG and the writer says so.
TEST(OutputFile, NoRoomIsAFailureNamingThePath) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  EXPECT_EQ(mp_error_write(&ctx, ENOSPC, "/d/m.jsonl"), MP_ERR_NOSPACE);
  EXPECT_EQ(std::string(mp_errmsg(&ctx)).rfind("no space left writing /d/m.jsonl (", 0), 0u) << mp_errmsg(&ctx);
  EXPECT_EQ(mp_status_exit_code(MP_ERR_NOSPACE), 1);
  EXPECT_EQ(mp_error_write(&ctx, EDQUOT, "/d/m.jsonl"), MP_ERR_NOSPACE);
  EXPECT_EQ(mp_error_write(&ctx, EIO, "/d/m.jsonl"), MP_ERR_IO);
  EXPECT_EQ(std::string(mp_errmsg(&ctx)), std::string("/d/m.jsonl: write failed: ") + strerror(EIO));
  std::string p = TmpDir() + "/big.bin";
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = [](int) {};
    sigaction(SIGXFSZ, &sa, nullptr);
    struct rlimit rl = {100, 100};
    setrlimit(RLIMIT_FSIZE, &rl);
    std::string data(1000, 'x');
    mp_ctx c;
    mp_ctx_init(&c);
    const mp_status st = mp_write_file_atomic(&c, p.c_str(), data.data(), data.size());
    const bool named = std::string(mp_errmsg(&c)).rfind("file size limit exceeded writing " + p, 0) == 0;
    _exit(st == MP_ERR_NOSPACE && named ? 0 : 3);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_NE(access(p.c_str(), F_OK), 0);  // nothing left under the name, nor half a file
}

}  // namespace
