/* Pipeline layouts in Megatron-LM's notation (--pipeline-model-parallel-layout, Megatron-Core
 * docs "Custom Pipeline Model Parallel Layout"): virtual stages in model order split by '|',
 * each a string of symbols, E the embedding, t a transformer layer, m an MTP layer, L the
 * head and loss; a symbol or a parenthesised group followed by *N repeats N times; commas
 * and spaces are cosmetic. DeepSeek-V3 on pp 16 x vpp 2: "Et*3|(tt|)*29,t|mL". Stage k of the
 * list is model chunk k: pipeline rank k mod pp, its chunk k / pp. (The documentation's own
 * example, "Et*3|(tt|)*29,m|L", puts the MTP layer on the stage before the loss, which
 * validate_layer_layout's rule forbids and meshplan refuses.)
 *
 * meshplan reads a layout into the plan's per-chunk layer counts (mp_plan_options.pp_layers)
 * and writes one back from them. The embedding is always on the first chunk and the head on
 * the last, so the layout must say so; MTP layers (m) go on the last virtual stage after its
 * layers, as Megatron-Core requires (pipeline_parallel_layer_layout.py, validate_layer_layout,
 * core_v0.14.0), where meshplan places them; their count is checked against the model's by
 * the plan.
 *
 * Also here, as it reads the same per-chunk layers: the AC policy a block runs under the
 * plan's recompute method, which counts layers within a model chunk. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "exec/plan.h"
#include "exec/rules.h"

/* The expanded layout, at most this many symbols (a layer, a separator, E or L each one). */
#define LAYOUT_MAX (4 * MP_PP_MAX_LAYOUT + 4 * MP_MAX_LAYERS)

typedef struct {
  mp_ctx *ctx;
  const char *src; /* the layout as given, for messages */
  const char *p;   /* the next character to read */
  char *out;       /* the expansion */
  size_t n;
} lexer;

static mp_status bad(lexer *x, const char *what) {
  return mp_error(x->ctx, MP_ERR_USAGE,
                  "pipeline layout '%s': %s at offset %d; write virtual stages split by '|' of E "
                  "(embedding), t (layer), m (MTP layer) and L (loss), with X*N or (...)*N repeats, e.g. "
                  "\"Et*3|(tt|)*29,m|L\"",
                  x->src, what, (int)(x->p - x->src));
}

static void skip_cosmetic(lexer *x) {
  while (*x->p == ',' || *x->p == ' ') x->p++;
}

/* *N after a symbol or group: repeats out[from, n) N - 1 more times. */
static mp_status repeat(lexer *x, size_t from) {
  skip_cosmetic(x);
  if (*x->p != '*') return MP_OK;
  x->p++;
  char *end = NULL;
  const long k = strtol(x->p, &end, 10);
  if (end == x->p || k < 1 || k > LAYOUT_MAX) return bad(x, "expected a count of 1 or more after '*'");
  x->p = end;
  const size_t len = x->n - from;
  if (len * (size_t)(k - 1) > LAYOUT_MAX - x->n) return bad(x, "the layout expands beyond meshplan's limit");
  for (long i = 1; i < k; i++, x->n += len) memmove(x->out + x->n, x->out + from, len);
  return MP_OK;
}

/* A sequence of symbols and groups up to ')' (depth > 0) or the end. */
static mp_status sequence(lexer *x, int depth) {
  if (depth > 8) return bad(x, "groups nested more than 8 deep");
  for (;;) {
    skip_cosmetic(x);
    const char c = *x->p;
    if (c == '\0' || c == ')') return depth > 0 && c == '\0' ? bad(x, "a '(' without its ')'")
                                      : depth == 0 && c == ')' ? bad(x, "a ')' without its '('")
                                                               : MP_OK;
    const size_t from = x->n;
    if (c == '(') {
      x->p++;
      MP_CHECK(sequence(x, depth + 1));
      x->p++; /* the ')' */
    } else if (strchr("EtmL|", c) != NULL) {
      if (x->n == LAYOUT_MAX) return bad(x, "the layout expands beyond meshplan's limit");
      x->out[x->n++] = c;
      x->p++;
    } else {
      return bad(x, "an unknown symbol");
    }
    MP_CHECK(repeat(x, from));
  }
}

/* The expanded stages into per-chunk layer counts. */
static mp_status count_stages(lexer *x, mp_plan_options *o) {
  int n = 0, e_at = -1, l_at = -1, layers = 0, m_at = -1, mtp = 0;
  for (size_t i = 0; i <= x->n; i++) {
    const char c = i < x->n ? x->out[i] : '|';
    if (c == 'E') e_at = e_at < 0 ? n : -2;
    else if (c == 'L') l_at = l_at < 0 ? n : -2;
    else if (c == 't' && mtp > 0 && m_at == n)
      return mp_error(x->ctx, MP_ERR_USAGE, "pipeline layout '%s': a layer (t) after an MTP layer (m); the "
                      "MTP layers follow the model's layers", x->src);
    else if (c == 't') layers++;
    else if (c == 'm') m_at = m_at < 0 || m_at == n ? n : -2, mtp++;
    if (c != '|') continue;
    if (n == MP_PP_MAX_LAYOUT)
      return mp_error(x->ctx, MP_ERR_USAGE, "pipeline layout '%s': more than %d virtual stages", x->src,
                      MP_PP_MAX_LAYOUT);
    if (layers > MP_MAX_LAYERS) return bad(x, "a stage with more layers than a model has");
    o->pp_layers[n++] = (int16_t)layers;
    layers = 0;
  }
  if (e_at != 0 || l_at != n - 1)
    return mp_error(x->ctx, MP_ERR_USAGE, "pipeline layout '%s': the embedding (E) goes once on the first "
                    "virtual stage and the loss (L) once on the last, where meshplan places them", x->src);
  if (mtp > 0 && m_at != n - 1)
    return mp_error(x->ctx, MP_ERR_USAGE, "pipeline layout '%s': the MTP layers (m) go together on the last "
                    "virtual stage, with the loss (L), where Megatron-Core and meshplan place them", x->src);
  o->n_pp_layers = n;
  o->pp_mtp = mtp;
  o->pp_mtp_stated = 1;
  return MP_OK;
}

mp_status mp_pp_layout_parse(mp_ctx *ctx, const char *s, mp_plan_options *o) {
  lexer x = {ctx, s, s, malloc(LAYOUT_MAX), 0};
  if (x.out == NULL) return mp_error(ctx, MP_ERR_NOMEM, "out of memory reading a pipeline layout");
  mp_status st = sequence(&x, 0);
  if (st == MP_OK) st = count_stages(&x, o);
  free(x.out);
  return st;
}

/* Chunk k's symbols: E on the first, its layers, the MTP layers and L on the last. */
static int stage_text(const mp_plan_options *o, int k, char *buf, size_t cap) {
  const int t = o->pp_layers[k], last = k == o->n_pp_layers - 1, m = last ? o->pp_mtp : 0;
  return snprintf(buf, cap, "%s%s%.0d%s%s%.0d%s%s", k == 0 ? "E" : "", t == 1 ? "t" : t > 1 ? "t*" : "",
                  t > 1 ? t : 0, t > 1 && last ? "," : "", m == 1 ? "m" : m > 1 ? "m*" : "", m > 1 ? m : 0,
                  m > 1 ? "," : "", last ? "L" : "");
}

int mp_pp_layout_format(const mp_plan_options *o, char *buf, size_t cap) {
  size_t n = 0;
  buf[0] = '\0';
  for (int k = 0; k < o->n_pp_layers;) {
    char a[32], b[32];
    stage_text(o, k, a, sizeof a);
    int run = 1; /* equal stages after k, the last excepted (it carries the L) */
    while (k + run < o->n_pp_layers - 1 && k > 0 && (stage_text(o, k + run, b, sizeof b), strcmp(a, b) == 0))
      run++;
    const int last = k + run == o->n_pp_layers;
    const int w = run > 1 ? snprintf(buf + n, cap - n, "(%s|)*%d", a, run)
                          : snprintf(buf + n, cap - n, "%s%s", a, last ? "" : "|");
    if (w < 0 || (size_t)w >= cap - n) return -1;
    n += (size_t)w;
    k += run;
  }
  return (int)n;
}

int mp_pp_layout_embedding_loss(int64_t n_layers, int pp, int v, mp_plan_options *o) {
  if (!mp_rule_pp_split_ok(n_layers, pp, v)) return 0;
  const int64_t K = (int64_t)pp * v, per = (n_layers + 2) / K;
  o->n_pp_layers = (int)K;
  for (int64_t k = 0; k < K; k++) o->pp_layers[k] = (int16_t)(per - (k == 0) - (k == K - 1));
  return 1;
}

/* ---- the recompute method, per model chunk ---------------------------------------------- */

/* The trunk layers [*l0, *l1) of the model chunk holding `layer`: 1, or 0 for a layer no chunk
 * holds (an MTP module, past the trunk). */
static int chunk_of(const mp_plan *p, int64_t layer, int64_t *l0, int64_t *l1) {
  const int pp = p->mesh.size[MP_DIM_PP] > 0 ? p->mesh.size[MP_DIM_PP] : 1, v = mp_plan_virtual_stages(p);
  for (int s = 0; s < pp; s++)
    for (int c = 0; c < v; c++) {
      mp_plan_chunk_layers(p, s, c, l0, l1);
      if (layer >= *l0 && layer < *l1) return 1;
    }
  return 0;
}

mp_ac_mode mp_plan_layer_ac(const mp_plan *p, int64_t layer) {
  const mp_plan_options *o = &p->opts;
  if (o->ac != MP_AC_FULL) return o->ac;
  if (o->recompute_method == MP_RECOMPUTE_BLOCK) {
    /* Megatron-Core checkpoints layer_idx < recompute_num_layers of the chunk's block
     * (transformer_block.py _checkpointed_forward, core_v0.14.0; its fp8 skip of layers whose
     * input needs no gradient leaves a trained embedding's stage alone) */
    int64_t l0, l1;
    if (chunk_of(p, layer, &l0, &l1) && layer - l0 >= o->recompute_num_layers) return MP_AC_NONE;
    return o->ac;
  }
  if (o->recompute_method == MP_RECOMPUTE_NONE && o->ac_every > 1 && (layer + 1) % o->ac_every != 0)
    return MP_AC_NONE;
  return o->ac;
}

int mp_plan_layer_rc_group(const mp_plan *p, int64_t layer, int64_t *first, int64_t *n) {
  const mp_plan_options *o = &p->opts;
  int64_t l0, l1;
  if (o->ac != MP_AC_FULL || o->recompute_method != MP_RECOMPUTE_UNIFORM || o->recompute_num_layers < 1 ||
      !chunk_of(p, layer, &l0, &l1))
    return 0;
  /* custom(layer_idx, layer_idx + recompute_num_layers) from layer_idx 0 in steps of the count
   * (transformer_block.py, core_v0.14.0); the plan refuses a count not dividing the chunk */
  *first = l0 + (layer - l0) / o->recompute_num_layers * o->recompute_num_layers;
  *n = o->recompute_num_layers;
  return 1;
}
