/* Internal invariants: MP_ASSERT(cond, fmt, ...) states a fact the code relies on and no
 * input can break, where it must hold; the message says which invariant (a printf format
 * and its arguments). A violation is a bug in meshplan, never bad input: input errors
 * stay an mp_status with a message (status.h), and library code never exits or aborts
 * for them.
 *
 * With MP_DEBUG defined (bazel --config=debug and --config=asan, .bazelrc) a false
 * condition prints one line to stderr and aborts, which gives a core, the sanitizers'
 * stack trace, or a death test's match:
 *   meshplan: internal invariant failed at exec/act_layout.c:48: *off % 64 == 0 (tensors
 *   start on 64-byte boundaries)
 *
 * Without MP_DEBUG (the release build) it compiles to nothing: neither the condition nor
 * the message's arguments are evaluated, so they may cost what they like but must not
 * have an effect the code needs. Both are still parsed and type-checked (the format
 * against its arguments too), and the variables they name count as used, so -Wall -Wextra
 * -Werror holds in every configuration. */
#ifndef MP_COMMON_ASSERT_H
#define MP_COMMON_ASSERT_H

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The failure. The line is formatted first and written with one call, so the lines of
 * several threads or ranks do not interleave. */
__attribute__((noreturn, cold, format(printf, 4, 5))) static inline void mp_assert_fail_(const char *file, int line,
                                                                                         const char *cond,
                                                                                         const char *fmt, ...) {
  char detail[512], msg[1200];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(detail, sizeof detail, fmt, ap);
  va_end(ap);
  snprintf(msg, sizeof msg, "meshplan: internal invariant failed at %s:%d: %s (%s)\n", file, line, cond, detail);
  fputs(msg, stderr);
  fflush(stderr);
  abort();
}

/* Type-checks the message in release builds; never called. */
__attribute__((format(printf, 1, 2))) static inline int mp_assert_unused_(const char *fmt, ...) {
  (void)fmt;
  return 0;
}

#ifdef MP_DEBUG
#define MP_ASSERT_ON 1
#define MP_ASSERT(cond, ...) ((cond) ? (void)0 : mp_assert_fail_(__FILE__, __LINE__, #cond, __VA_ARGS__))
#else
#define MP_ASSERT_ON 0
#define MP_ASSERT(cond, ...) ((void)(0 && (cond) && mp_assert_unused_(__VA_ARGS__)))
#endif

#ifdef __cplusplus
}
#endif
#endif
