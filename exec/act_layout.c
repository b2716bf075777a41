/* The activation layout table laid out (act_layout.h): offsets by the carving rule. */
#include "exec/act_layout.h"

#include <string.h>

#include "common/assert.h"

/* Allocations carved into several tensors; the others hold one tensor each. */
static const unsigned char k_carved[MP_ACT_ALLOC_COUNT] = {
    [MP_ACT_ALLOC_BLOCK] = 1, [MP_ACT_ALLOC_CORE] = 1,  [MP_ACT_ALLOC_WS] = 1,
    [MP_ACT_ALLOC_EPA] = 1,   [MP_ACT_ALLOC_EP_WS] = 1, [MP_ACT_ALLOC_HEAD] = 1,
    [MP_ACT_ALLOC_LOGITS] = 1, [MP_ACT_ALLOC_CP_FWD] = 1, [MP_ACT_ALLOC_CP_BWD] = 1,
};

static int exists(const mp_act_dims *d, int moe, mp_act_when w) {
  switch (w) {
    case MP_ACT_WHEN_ALWAYS: return 1;
    case MP_ACT_WHEN_DENSE: return !moe;
    case MP_ACT_WHEN_MOE: return moe;
    case MP_ACT_WHEN_MOE_LOCAL: return moe && d->ep <= 1;
    case MP_ACT_WHEN_SHARED: return moe && d->Fs > 0;
    case MP_ACT_WHEN_MOE_EP: return moe && d->ep > 1;
    case MP_ACT_WHEN_TP: return d->tp > 1;
    case MP_ACT_WHEN_SP: return d->sp;
    case MP_ACT_WHEN_CP: return d->cp > 1;
    case MP_ACT_WHEN_DEVMEM: return !d->host_mem;
    case MP_ACT_WHEN_GQA: return !d->mla;
    case MP_ACT_WHEN_MLA: return d->mla;
    case MP_ACT_WHEN_MLA_Q: return d->mla && d->QL > 0;
  }
  return 0;
}

static int64_t elt_bytes(const mp_act_dims *d, mp_act_elt e) {
  return e == MP_ACT_ELT_X ? d->xs : 4;
}

/* Appends a tensor of `bytes` to allocation a; *off receives its offset. */
static void place(mp_act_layout *l, size_t *off, mp_act_alloc a, int64_t bytes) {
  MP_ASSERT(bytes >= 0, "allocation %d, %lld bytes: a tensor's size is never negative", (int)a, (long long)bytes);
  if (k_carved[a]) {
    *off = l->bytes[a];
    l->bytes[a] += (size_t)mp_act_align64(bytes);
    MP_ASSERT(*off % 64 == 0 && l->bytes[a] >= *off + (size_t)bytes,
              "each tensor starts on a 64-byte boundary past the one before it");
  } else {
    /* an allocation that is not carved holds one tensor at offset 0: a second row would
     * alias the first */
    MP_ASSERT(l->bytes[a] == 0, "allocation %d has two tensors but is not carved", (int)a);
    *off = 0;
    l->bytes[a] += (size_t)bytes;
  }
}

void mp_act_layout_fill(mp_act_layout *l, const mp_act_dims *d, int moe) {
  /* the names the table's counts use */
  const int64_t B = d->B, S = d->S, N = d->N, NS = d->NS, NR = d->NR, C = d->C, NH = d->NH, F = d->F,
                E = d->E, K = d->K, Fe = d->Fe, Fs = d->Fs, Vl = d->Vl, R = d->R, RB = d->RB, L = d->L,
                NP = d->NP, QD = d->NH * d->HD, KD = d->NKV * d->HD, QL = d->QL, KL = d->KL,
                DN = d->DN, DR = d->DR, DV = d->DV ? d->DV : d->HD, RD = d->RD ? d->RD : d->HD,
                VD = d->NKV * DV, AD = d->NH * DV;
  memset(l, 0, sizeof *l);
#define MP_ACT_PLACE_(name, alloc, count, elt, when)                                     \
  if (exists(d, moe, MP_ACT_WHEN_##when))                                                \
    place(l, &l->name, MP_ACT_ALLOC_##alloc, (int64_t)(count) * elt_bytes(d, MP_ACT_ELT_##elt));
  MP_ACT_TENSORS(MP_ACT_PLACE_)
#undef MP_ACT_PLACE_
  for (int a = 0; a < MP_ACT_ALLOC_COUNT; a++)
    MP_ASSERT(!k_carved[a] || l->bytes[a] % 64 == 0, "carved allocation %d ends on a 64-byte boundary", a);
}

int64_t mp_act_resident_bytes(const mp_act_layout *l) {
  return (int64_t)(l->bytes[MP_ACT_ALLOC_ROPE_COS] + l->bytes[MP_ACT_ALLOC_ROPE_SIN] +
                   l->bytes[MP_ACT_ALLOC_SCALARS] + l->bytes[MP_ACT_ALLOC_STAGE]);
}
