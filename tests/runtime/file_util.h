// What the training loop's file tests share: an mp_ctx with its message and writing bytes
// to a file (paths in the test's temporary directory: tests/tmp_path.h).
#ifndef MP_TESTS_RUNTIME_FILE_UTIL_H
#define MP_TESTS_RUNTIME_FILE_UTIL_H

#include <cstdlib>
#include <fstream>
#include <string>

#include "common/status.h"
#include "tests/tmp_path.h"

struct Ctx {
  mp_ctx c;
  Ctx() { mp_ctx_init(&c); }
  const char *msg() const { return mp_errmsg(&c); }
  bool says(const std::string &s) const { return std::string(msg()).find(s) != std::string::npos; }
};

inline void WriteBytes(const std::string &path, const std::string &bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(bytes.data(), (std::streamsize)bytes.size());
}

#endif
