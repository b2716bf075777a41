/* The plan's internals shared by its files (the driver: plan.c; the tree: plan_tree.c). */
#ifndef MP_EXEC_PLAN_INTERNAL_H
#define MP_EXEC_PLAN_INTERNAL_H

#include "exec/plan.h"

/* Builds m's module tree into *params, allocated from arena with room for the last stage's
 * embedding copy after it (mp_plan_tree_add_tied_copy), and its count into *n. Everything mp_plan_create sets but pp_stage
 * (which depends on the mesh: mp_plan_tree_set_stages). FQNs are formatted into arena once
 * per tree: per plan by mp_plan_create, per model by mp_plan_template_create. 0, or -1 when
 * out of memory. */
int mp_plan_tree_build(mp_arena *arena, const mp_model *m, mp_param **params, int *n);
/* Under pp > 1, a tied model or (untied, not DualPipe) one with MTP modules: appends the
 * last stage's copy of tok_embeddings.weight. */
void mp_plan_tree_add_tied_copy(mp_plan *p);
/* Sets every parameter's pipeline stage from p's mesh and layout. */
void mp_plan_tree_set_stages(mp_plan *p);

#endif /* MP_EXEC_PLAN_INTERNAL_H */
