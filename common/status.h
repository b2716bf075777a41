/* Status codes and the per-context error message.
 *
 * Every library function that can fail returns an mp_status and, on failure, leaves a
 * one-line message on its mp_ctx saying what is wrong and what to do. Library code never
 * exits; the CLI's main maps codes to exit status (mp_status_exit_code).
 * The MP_CHECK family passes a failure up unchanged (the message of the innermost
 * failure is kept, which is the most specific one). */
#ifndef MP_COMMON_STATUS_H
#define MP_COMMON_STATUS_H

#include <stdarg.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mp_status {
  MP_OK = 0,
  MP_ERR_INVALID,     /* bad input: malformed file, impossible value, wrong mesh */
  MP_ERR_USAGE,       /* bad command line */
  MP_ERR_NOT_FOUND,   /* a named model, GPU, cluster, file or run does not exist */
  MP_ERR_IO,          /* a file could not be read or written */
  MP_ERR_NOMEM,       /* an allocation failed */
  MP_ERR_ORDER,       /* sharding passes applied in a wrong order or combination */
  MP_ERR_UNSUPPORTED, /* valid request that this build or device cannot do */
  MP_ERR_DB,          /* SQLite failure or corrupt database */
  MP_ERR_CUDA,
  MP_ERR_NCCL,
  MP_ERR_MPI,
  MP_ERR_TIMEOUT,     /* a collective did not complete within the deadline: a peer rank is
                         stuck or dead (exec/comm); the job must end (MPI_Abort) */
  MP_ERR_NOSPACE,     /* a write ran out of room: the disk or quota is full (ENOSPC,
                         EDQUOT) or the file passed the process's size limit (EFBIG,
                         ulimit -f); the input was fine, the run failed */
  MP_ERR_INTERNAL     /* a broken invariant: a bug in meshplan */
} mp_status;

#define MP_ERRMSG_MAX 1024

/* Carries the last error. One per thread of work; cheap to put on the stack. */
typedef struct mp_ctx {
  mp_status last;
  char msg[MP_ERRMSG_MAX];
} mp_ctx;

void mp_ctx_init(mp_ctx *ctx);
/* Records code and a printf-style message on ctx and returns code. The message is kept to
 * one line of text: line breaks and tabs in what it quotes become spaces, other control
 * characters '?' (input can hold anything; the message goes to a terminal). */
mp_status mp_error(mp_ctx *ctx, mp_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
mp_status mp_verror(mp_ctx *ctx, mp_status code, const char *fmt, va_list ap);
/* The message of the last error ("" when none). */
const char *mp_errmsg(const mp_ctx *ctx);
/* Prefixes the current message with more context: "reading x.json: <old message>". */
void mp_error_prefix(mp_ctx *ctx, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
const char *mp_status_name(mp_status s);
/* Process exit code for a status. 2: the user must change something they gave: the
 * command line, a file's contents, a path that cannot be opened, read or written
 * (MP_ERR_IO), a database that cannot be used (MP_ERR_DB), a request this build or machine
 * cannot do (MP_ERR_UNSUPPORTED). 1: the work that was accepted failed: out of memory,
 * out of disk (MP_ERR_NOSPACE), CUDA, NCCL or MPI errors, a collective's timeout, a bug. */
int mp_status_exit_code(mp_status s);

#define MP_CHECK(expr)                      \
  do {                                      \
    mp_status mp_check_s_ = (expr);         \
    if (mp_check_s_ != MP_OK) return mp_check_s_; \
  } while (0)

/* On failure stores the status in `st` and jumps to `label` (one cleanup path). */
#define MP_CHECK_GOTO(expr, st, label) \
  do {                                 \
    (st) = (expr);                     \
    if ((st) != MP_OK) goto label;     \
  } while (0)

/* Allocation checks: out of memory is an error, not a crash. */
#define MP_CHECK_ALLOC(ctx, ptr)                                                     \
  do {                                                                               \
    if ((ptr) == NULL)                                                               \
      return mp_error((ctx), MP_ERR_NOMEM, "%s:%d: out of memory allocating %s",     \
                      __FILE__, __LINE__, #ptr);                                     \
  } while (0)

#ifdef __cplusplus
}
#endif
#endif
