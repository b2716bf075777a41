/* Status codes and error messages (see status.h). */
#include "common/status.h"

#include <stdio.h>
#include <string.h>

void mp_ctx_init(mp_ctx *ctx) {
  ctx->last = MP_OK;
  ctx->msg[0] = '\0';
}

/* A message is one line of text whatever it quotes: a file's key or value, a flag, a path
 * may hold newlines or terminal escapes, which would split the line or drive the
 * terminal. Line breaks and tabs become spaces, other control bytes '?'; UTF-8 is kept. */
static void one_line(char *s) {
  for (unsigned char *p = (unsigned char *)s; *p; p++) {
    if (*p == '\n' || *p == '\r' || *p == '\t') *p = ' ';
    else if (*p < 0x20 || *p == 0x7f) *p = '?';
  }
}

mp_status mp_verror(mp_ctx *ctx, mp_status code, const char *fmt, va_list ap) {
  if (ctx == NULL) return code;
  ctx->last = code;
  vsnprintf(ctx->msg, sizeof ctx->msg, fmt, ap);
  one_line(ctx->msg);
  return code;
}

mp_status mp_error(mp_ctx *ctx, mp_status code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  mp_verror(ctx, code, fmt, ap);
  va_end(ap);
  return code;
}

const char *mp_errmsg(const mp_ctx *ctx) { return ctx ? ctx->msg : ""; }

void mp_error_prefix(mp_ctx *ctx, const char *fmt, ...) {
  if (ctx == NULL) return;
  char prefix[MP_ERRMSG_MAX], old[MP_ERRMSG_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(prefix, sizeof prefix, fmt, ap);
  va_end(ap);
  memcpy(old, ctx->msg, sizeof old);
  snprintf(ctx->msg, sizeof ctx->msg, "%s: %s", prefix, old);
  one_line(ctx->msg);
}

const char *mp_status_name(mp_status s) {
  switch (s) {
    case MP_OK: return "ok";
    case MP_ERR_INVALID: return "invalid input";
    case MP_ERR_USAGE: return "usage";
    case MP_ERR_NOT_FOUND: return "not found";
    case MP_ERR_IO: return "i/o";
    case MP_ERR_NOMEM: return "out of memory";
    case MP_ERR_ORDER: return "pass order";
    case MP_ERR_UNSUPPORTED: return "unsupported";
    case MP_ERR_DB: return "database";
    case MP_ERR_CUDA: return "cuda";
    case MP_ERR_NCCL: return "nccl";
    case MP_ERR_MPI: return "mpi";
    case MP_ERR_TIMEOUT: return "timeout";
    case MP_ERR_NOSPACE: return "no space";
    case MP_ERR_INTERNAL: return "internal";
  }
  return "unknown";
}

int mp_status_exit_code(mp_status s) {
  switch (s) {
    case MP_OK: return 0;
    case MP_ERR_INVALID:
    case MP_ERR_USAGE:
    case MP_ERR_NOT_FOUND:
    case MP_ERR_ORDER:
    case MP_ERR_IO:
    case MP_ERR_DB:
    case MP_ERR_UNSUPPORTED:
      return 2;
    default:
      return 1;
  }
}
