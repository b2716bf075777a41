/* Safe opening of the files a user names (see file.h). */
#define _GNU_SOURCE
#include "common/file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* What a non-regular file is, for the message. */
static const char *kind_of(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a named pipe (FIFO)";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  return "not a regular file";
}

static mp_status not_regular(mp_ctx *ctx, const char *path, mode_t m) {
  return mp_error(ctx, MP_ERR_INVALID, "%s: is %s, not a regular file; give the path of a file",
                  path, kind_of(m));
}

mp_status mp_file_open_input(mp_ctx *ctx, const char *path, int *fd_out, int64_t *size) {
  *fd_out = -1;
  /* stat first: a device is never opened (opening some has effects of its own, a hardware
   * watchdog's for one). Then the open itself with O_NONBLOCK, so that a path replaced by a
   * FIFO in between returns at once instead of waiting for a writer, and fstat on the
   * descriptor decides; regular files ignore the flag. */
  struct stat pre;
  if (stat(path, &pre) == 0 && !S_ISREG(pre.st_mode)) return not_regular(ctx, path, pre.st_mode);
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0)
    return mp_error(ctx, errno == ENOENT ? MP_ERR_NOT_FOUND : MP_ERR_IO, "%s: cannot open: %s", path,
                    strerror(errno));
  struct stat sb;
  if (fstat(fd, &sb) != 0) {
    int e = errno;
    close(fd);
    return mp_error(ctx, MP_ERR_IO, "%s: cannot open: %s", path, strerror(e));
  }
  if (!S_ISREG(sb.st_mode)) {
    close(fd);
    return not_regular(ctx, path, sb.st_mode);
  }
  *fd_out = fd;
  if (size) *size = (int64_t)sb.st_size;
  return MP_OK;
}

mp_status mp_read_file_max(mp_ctx *ctx, const char *path, int64_t max_bytes, char **out,
                           size_t *len) {
  int fd = -1;
  int64_t size = 0;
  MP_CHECK(mp_file_open_input(ctx, path, &fd, &size));
  if (size > max_bytes) {
    close(fd);
    return mp_error(ctx, MP_ERR_INVALID, "%s: %lld bytes, more than the %lld this input may hold",
                    path, (long long)size, (long long)max_bytes);
  }
  char *buf = malloc((size_t)size + 1);
  if (buf == NULL) {
    close(fd);
    return mp_error(ctx, MP_ERR_NOMEM, "%s: out of memory reading %lld bytes", path, (long long)size);
  }
  /* Reads what fstat reported; a file that grows meanwhile is read up to that size, one
   * that shrinks ends the read early (len says how much came). */
  size_t got = 0;
  while (got < (size_t)size) {
    ssize_t r = read(fd, buf + got, (size_t)size - got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      int e = errno;
      free(buf);
      close(fd);
      return mp_error(ctx, MP_ERR_IO, "%s: read failed: %s", path, strerror(e));
    }
    if (r == 0) break;
    got += (size_t)r;
  }
  close(fd);
  buf[got] = '\0';
  *out = buf;
  if (len) *len = got;
  return MP_OK;
}

mp_status mp_read_file(mp_ctx *ctx, const char *path, char **out, size_t *len) {
  return mp_read_file_max(ctx, path, MP_FILE_MAX_BYTES, out, len);
}

mp_status mp_file_check_regular_or_absent(mp_ctx *ctx, const char *path) {
  struct stat sb;
  if (stat(path, &sb) != 0) {
    if (errno == ENOENT) return MP_OK;
    return mp_error(ctx, MP_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
  }
  return S_ISREG(sb.st_mode) ? MP_OK : not_regular(ctx, path, sb.st_mode);
}

mp_status mp_error_write(mp_ctx *ctx, int err, const char *path) {
  if (err == ENOSPC || err == EDQUOT)
    return mp_error(ctx, MP_ERR_NOSPACE, "no space left writing %s (%s); free some or write elsewhere", path,
                    strerror(err));
  if (err == EFBIG)
    return mp_error(ctx, MP_ERR_NOSPACE, "file size limit exceeded writing %s (%s: the process's limit, "
                    "ulimit -f, or the file system's); raise it or write less", path, strerror(err));
  return mp_error(ctx, MP_ERR_IO, "%s: write failed: %s", path, strerror(err));
}

mp_status mp_write_file_atomic(mp_ctx *ctx, const char *path, const void *data, size_t len) {
  struct stat sb;
  if (stat(path, &sb) == 0 && !S_ISREG(sb.st_mode))
    return mp_error(ctx, MP_ERR_IO, "%s: cannot write: it is %s, not a regular file; give a file path",
                    path, kind_of(sb.st_mode));
  char tmp[4096];
  int n = snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
  if (n < 0 || (size_t)n >= sizeof tmp)
    return mp_error(ctx, MP_ERR_INVALID, "%s: path too long", path);
  FILE *f = fopen(tmp, "wb");
  if (f == NULL)
    return mp_error(ctx, MP_ERR_IO, "%s: cannot create %s: %s", path, tmp, strerror(errno));
  int ok = fwrite(data, 1, len, f) == len;
  ok = (fflush(f) == 0) && ok;
  ok = (fclose(f) == 0) && ok;
  if (!ok) {
    int e = errno;
    unlink(tmp);
    return mp_error_write(ctx, e, path);
  }
  if (rename(tmp, path) != 0) {
    int e = errno;
    unlink(tmp);
    return mp_error(ctx, MP_ERR_IO, "%s: rename from %s failed: %s", path, tmp, strerror(e));
  }
  return MP_OK;
}
