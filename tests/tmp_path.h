// Paths in the test's temporary directory (Bazel's TEST_TMPDIR, else /tmp).
#ifndef MP_TESTS_TMP_PATH_H
#define MP_TESTS_TMP_PATH_H

#include <unistd.h>

#include <cstdlib>
#include <string>

inline std::string TmpDir() {
  const char *t = getenv("TEST_TMPDIR");
  return t ? t : "/tmp";
}

// TmpDir()/name with no SQLite database there: the file and its -wal and -shm companions
// removed, so each test opens a fresh one.
inline std::string FreshDbPath(const std::string &name) {
  const std::string p = TmpDir() + "/" + name;
  unlink(p.c_str());
  unlink((p + "-wal").c_str());
  unlink((p + "-shm").c_str());
  return p;
}

#endif
