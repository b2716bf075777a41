// The schedule's memory events replayed in issue order, independently of the simulator:
// the total's peak and each category's own high-water mark. For the tests that hold the
// schedule's memory models to the runtime's tracked allocator.
#ifndef MP_TESTS_RUNTIME_SCHEDULE_REPLAY_H
#define MP_TESTS_RUNTIME_SCHEDULE_REPLAY_H

#include <cstdint>

#include "exec/schedule.h"

namespace mp_test {

// *peak: the largest total of live bytes; cat_max (if not null): per category.
inline void Replay(const mp_schedule *s, int64_t *peak, int64_t *cat_max = nullptr) {
  int64_t cur = 0, cat[MP_MEM_COUNT] = {0};
  *peak = 0;
  if (cat_max)
    for (int c = 0; c < MP_MEM_COUNT; c++) cat_max[c] = 0;
  mp_schedule_iter it;
  mp_schedule_iter_begin(s, &it);
  while (mp_schedule_iter_next(&it)) {
    const int64_t d = it.op->type == MP_OP_ALLOC ? it.op->mem_bytes : it.op->type == MP_OP_FREE ? -it.op->mem_bytes : 0;
    if (!d) continue;
    cur += d;
    if (cur > *peak) *peak = cur;
    if (it.op->mem_cat >= MP_MEM_COUNT) continue;
    cat[it.op->mem_cat] += d;
    if (cat_max && cat[it.op->mem_cat] > cat_max[it.op->mem_cat]) cat_max[it.op->mem_cat] = cat[it.op->mem_cat];
  }
}

inline int64_t ReplayPeak(const mp_schedule *s) {
  int64_t peak = 0;
  Replay(s, &peak);
  return peak;
}

}  // namespace mp_test

#endif
