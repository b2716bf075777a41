/* Leveled logging to stderr (see log.h). */
#include "common/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int g_level = -1;

static void init_level(void) {
  if (g_level >= 0) return;
  g_level = MP_LOG_WARN;
  const char *e = getenv("MESHPLAN_LOG");
  if (e == NULL) return;
  if (strcmp(e, "error") == 0) g_level = MP_LOG_ERROR;
  else if (strcmp(e, "info") == 0) g_level = MP_LOG_INFO;
  else if (strcmp(e, "debug") == 0) g_level = MP_LOG_DEBUG;
}

void mp_log_set_level(mp_log_level level) { g_level = (int)level; }

mp_log_level mp_log_get_level(void) {
  init_level();
  return (mp_log_level)g_level;
}

void mp_log(mp_log_level level, const char *fmt, ...) {
  init_level();
  if ((int)level > g_level) return;
  static const char *names[] = {"error", "warn", "info", "debug"};
  fprintf(stderr, "meshplan: %s: ", names[level]);
  va_list ap;
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
}
