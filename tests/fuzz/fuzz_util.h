/* Helpers shared by the libFuzzer harnesses (tests/fuzz/fuzz_*.c, built by scripts/fuzz).
 *
 * A harness feeds one input to one parser the way the CLI does, then, when the parser
 * accepts it, exercises what the CLI would do next with the result (counts, products,
 * lookups), so that a value the parser lets through but later code cannot handle shows up
 * as an AddressSanitizer or UndefinedBehaviorSanitizer report (overflow included), not as
 * a wrong figure. A refusal must be a status with a one-line message: fuzz_check_refusal
 * aborts (a crash libFuzzer reports) when it is not. */
#ifndef MP_TESTS_FUZZ_FUZZ_UTIL_H
#define MP_TESTS_FUZZ_FUZZ_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"

/* The input as a NUL-terminated string (malloc'd; free it). Embedded NULs end the text
 * early, as they do for a file read by mp_read_file and parsed as text. */
static inline char *fuzz_text(const uint8_t *data, size_t size) {
  char *t = (char *)malloc(size + 1);
  if (t == NULL) abort();
  memcpy(t, data, size);
  t[size] = '\0';
  return t;
}

/* A refusal: a status other than MP_OK with a message of one non-empty line. */
static inline void fuzz_check_refusal(const mp_ctx *ctx, mp_status st) {
  if (st == MP_OK) return;
  const char *m = mp_errmsg(ctx);
  if (m[0] == '\0' || strchr(m, '\n') != NULL) {
    fprintf(stderr, "refusal without a one-line message (status %d): \"%s\"\n", (int)st, m);
    abort();
  }
}

/* A broken invariant found by a harness. */
#define FUZZ_ASSERT(cond)                                                         \
  do {                                                                            \
    if (!(cond)) {                                                                \
      fprintf(stderr, "%s:%d: invariant failed: %s\n", __FILE__, __LINE__, #cond); \
      abort();                                                                    \
    }                                                                             \
  } while (0)

#endif
