/* libFuzzer harness: the mesh spec parser (`--mesh dp_shard=4,tp=2,ep=2`). The first two
 * bytes choose the world size (0: unknown), the rest is the spec. An accepted mesh must be
 * valid, its world within MP_MESH_MAX_WORLD, and its groups consistent: every rank's group
 * of every kind lists group-size ranks in increasing order, inside the world, including
 * the rank itself at its group index; coordinates and ranks convert both ways. */
#include "exec/mesh.h"
#include "tests/fuzz/fuzz_util.h"

static void check_rank(const mp_mesh *m, int world, int rank, int *buf) {
  int c[MP_MESH_NDIMS];
  mp_mesh_coords(m, rank, c);
  FUZZ_ASSERT(mp_mesh_rank_of(m, c) == rank);
  for (int g = 0; g < MP_GROUP_COUNT; g++) {
    const int n = mp_mesh_group_size(m, (mp_group)g);
    FUZZ_ASSERT(n >= 1 && n <= world);
    FUZZ_ASSERT(mp_mesh_group_ranks(m, (mp_group)g, rank, buf) == n);
    for (int i = 0; i < n; i++) {
      FUZZ_ASSERT(buf[i] >= 0 && buf[i] < world);
      if (i > 0) FUZZ_ASSERT(buf[i] > buf[i - 1]);
    }
    const int idx = mp_mesh_group_index(m, (mp_group)g, rank);
    FUZZ_ASSERT(idx >= 0 && idx < n && buf[idx] == rank);
    const int id = mp_mesh_group_id(m, (mp_group)g, rank);
    FUZZ_ASSERT(id >= 0 && id < world / n);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 2) return 0;
  const int world = ((int)data[0] << 8 | data[1]) % 4097; /* 0 (unknown) .. 4096 */
  char *spec = fuzz_text(data + 2, size - 2);
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_mesh m;
  mp_status st = mp_mesh_parse(&ctx, spec, world, &m);
  fuzz_check_refusal(&ctx, st);
  if (st == MP_OK) {
    const int w = mp_mesh_world(&m);
    FUZZ_ASSERT(w >= 1 && w <= MP_MESH_MAX_WORLD && (world == 0 || w == world));
    FUZZ_ASSERT(mp_mesh_validate(&ctx, &m) == MP_OK);
    char f[256];
    mp_mesh_format(&m, f, sizeof f);
    mp_mesh again;
    FUZZ_ASSERT(mp_mesh_parse(&ctx, strcmp(f, "single") == 0 ? "tp=1" : f, w, &again) == MP_OK);
    FUZZ_ASSERT(memcmp(&again, &m, sizeof m) == 0);
    /* groups of a few ranks: the first, the last, one in the middle (a world of 2^20 ranks
     * would make every input slow) */
    if (w <= (1 << 16)) {
      int *buf = (int *)malloc((size_t)w * sizeof(int));
      if (buf == NULL) abort();
      check_rank(&m, w, 0, buf);
      check_rank(&m, w, w - 1, buf);
      check_rank(&m, w, w / 2, buf);
      free(buf);
    }
  }
  free(spec);
  return 0;
}
