/* Files a user names, opened safely.
 *
 * Inputs are regular files only: a path that stat shows is not one is refused without
 * being opened (a device is never opened), and the open itself uses O_NONBLOCK (opening a
 * FIFO for reading would otherwise wait for a writer forever) and is checked again with
 * fstat on the descriptor, which closes the window between the two; a directory, FIFO,
 * device or socket is refused with MP_ERR_INVALID naming what it is. Every "cannot open / read / write" is
 * an error naming the path and the system's reason (strerror); a missing input is
 * MP_ERR_NOT_FOUND, any other failure MP_ERR_IO; all of them exit 2 (status.h).
 *
 * Outputs are written to <path>.tmp.<pid> and renamed over path, so a reader never sees a
 * half-written file; an existing path that is not a regular file is refused first. A
 * write that runs out of room (mp_error_write) is MP_ERR_NOSPACE, exit 1: the input was
 * fine, the disk, the quota or the process's file size limit was not. */
#ifndef MP_COMMON_FILE_H
#define MP_COMMON_FILE_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The most mp_read_file reads: an llm.c token shard's header and 2^31 uint16 tokens fit. */
#define MP_FILE_MAX_BYTES (1LL << 33)
/* The most a configuration file (model, cluster, GPU, stack JSON; validate's CSV) may
 * hold: published Hugging Face config.json files are a few KiB. */
#define MP_FILE_MAX_CONFIG_BYTES (64LL << 20)

/* Opens path for reading when it is a regular file: *fd (close it) and its size. */
mp_status mp_file_open_input(mp_ctx *ctx, const char *path, int *fd, int64_t *size);
/* Reads a whole regular file of at most max_bytes into a malloc'd NUL-terminated buffer;
 * a bigger file is MP_ERR_INVALID saying so. len may be NULL. */
mp_status mp_read_file_max(mp_ctx *ctx, const char *path, int64_t max_bytes, char **out,
                           size_t *len);
/* mp_read_file_max with MP_FILE_MAX_BYTES. */
mp_status mp_read_file(mp_ctx *ctx, const char *path, char **out, size_t *len);
/* MP_OK when path does not exist or is a regular file (a database that SQLite will open or
 * create there); a directory, FIFO, device or socket is MP_ERR_INVALID. */
mp_status mp_file_check_regular_or_absent(mp_ctx *ctx, const char *path);
/* The failure of a write to path with errno err, as every writer reports it: ENOSPC and
 * EDQUOT "no space left writing PATH (...)" and EFBIG "file size limit exceeded writing
 * PATH (ulimit -f)", both MP_ERR_NOSPACE; any other "PATH: write failed: <strerror>",
 * MP_ERR_IO. Returns the status. */
mp_status mp_error_write(mp_ctx *ctx, int err, const char *path);
/* Writes to path.tmp.<pid> then renames, so readers never see a half-written file. */
mp_status mp_write_file_atomic(mp_ctx *ctx, const char *path, const void *data, size_t len);

#ifdef __cplusplus
}
#endif
#endif
