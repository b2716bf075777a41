// tests/mpi_gtest.h.
#include "tests/mpi_gtest.h"

#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>
#include <cstdlib>

#include "exec/comm/comm.h"

namespace mp_test {
namespace {

class WorldVerdict : public ::testing::EmptyTestEventListener {
 public:
  explicit WorldVerdict(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult &r) override {
    if (r.failed() && rank_ != 0)  // rank 0's default printer shows its own failures
      fprintf(stderr, "[rank %d] %s:%d: %s\n", rank_, r.file_name() ? r.file_name() : "?", r.line_number(),
              r.summary());
  }
  void OnTestEnd(const ::testing::TestInfo &t) override {
    int mine = t.result()->Failed() ? 1 : 0, any = 0;
    MPI_Allreduce(&mine, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (any && !mine)
      fprintf(stderr, "[rank %d] %s.%s passed here but failed on another rank\n", rank_, t.test_suite_name(),
              t.name());
    failed_ |= any;
  }
  int failed() const { return failed_; }

 private:
  int rank_;
  int failed_ = 0;
};

}  // namespace

int MpiMain(int *argc, char ***argv, const char *name, bool mpi_optional, int *rank, int *world,
            bool *launched) {
  ::testing::InitGoogleTest(argc, *argv);
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  *rank = 0;
  *world = 1;
  const bool mpi = !mpi_optional || getenv("OMPI_COMM_WORLD_SIZE") != nullptr || getenv("PMI_SIZE") != nullptr;
  if (launched) *launched = mpi;
  WorldVerdict *verdict = nullptr;
  if (mpi) {
    if (mp_comm_mpi_init(&ctx, argc, argv) != MP_OK) {
      fprintf(stderr, "%s: MPI init failed: %s\n", name, mp_errmsg(&ctx));
      return 1;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, rank);
    MPI_Comm_size(MPI_COMM_WORLD, world);
    ::testing::TestEventListeners &ls = ::testing::UnitTest::GetInstance()->listeners();
    if (*rank != 0) delete ls.Release(ls.default_result_printer());
    verdict = new WorldVerdict(*rank);
    ls.Append(verdict);  // the listeners own it
  }
  const int rc = RUN_ALL_TESTS();
  int any = rc != 0 || (verdict && verdict->failed());
  if (mpi) {
    int mine = any;
    MPI_Allreduce(&mine, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  }
  if (*rank == 0) printf("%s: world %d: %s\n", name, *world, any ? "FAILED on some rank" : "all passed");
  mp_comm_mpi_finalize(&ctx);
  return any ? 1 : 0;
}

}  // namespace mp_test
