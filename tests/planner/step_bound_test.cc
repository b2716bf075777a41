// The search's step bound (planner/search.h bound_top_k, sim/sim.h step_bound_s).
//
// Soundness: a stage run's lower bound of the step (mp_sim_stage_step_lb_s: n_micro x the
// stage's forward and backward per micro-batch, the all-to-all overlap's saving taken off)
// never exceeds the plan's simulated step. For every plan that fits in a search with
// pp > 1, simulated again with the bound set to its own step, no stage's bound may pass it:
// the plan is not bounded and gives the same step. Simulated with a bound of 1e-12 s the
// first stage's bound stops it, positive and at most the step.
//
// The search's micro-batch rule takes a smaller micro-batch's bounded stage run, scaled by
// the micro-batch ratio, as a bound of a sibling's step: its premise (every op on more rows
// no faster) is held by the pairs of plans that fit, each simulated again with a bound of
// 1e-12 s: the larger micro-batch's stage bound is never below the smaller one's scaled.
//
// Effect: the K best plans of a search with the bound are those of the search without it,
// in the same order with the same figures (the ranking's tie tolerance included), a plan
// simulated in full by both gives the same step, and a bounded plan that fits is slower per
// sequence than the K-th best by more than the tie tolerance; some candidates are bounded
// (else the comparisons say nothing).
//
// Rule: a candidate is handed at least the K-th best cost of all the plans that fit (with the
// tie tolerance), and a bounded one stopped in its own simulation or follows a bounded
// sibling that recomputes less.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "exec/model.h"
#include "planner/evaluate.h"
#include "planner/search.h"
#include "sim/cluster.h"

namespace {

struct Case {
  const char *model, *gpu;
  int gpus;
  int64_t seq, gb;
  const char *stack;
  int stride;  // the soundness check simulates every stride-th plan that fits with pp > 1 again
};

// The search of case k with bound_top_k top (0: off): its candidates and its ranked order.
// With check_bound, each plan that fits with pp > 1 is simulated again by a worker of the
// same evaluator with the two bounds above.
void Search(const Case &k, int top, int check_bound, std::vector<mp_candidate> *cands,
            std::vector<int64_t> *order, int64_t *checked = nullptr, std::vector<double> *lbs = nullptr) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_model m;
  mp_cluster c;
  ASSERT_EQ(mp_model_load(&ctx, k.model, &m), MP_OK) << mp_errmsg(&ctx);
  ASSERT_EQ(mp_cluster_make(&ctx, k.gpu, k.gpus, 8, &c), MP_OK) << mp_errmsg(&ctx);
  mp_sim_evaluator ev;
  ASSERT_EQ(mp_sim_evaluator_init(&ctx, &ev, &m, &c, k.seq, k.gb, 0.05, k.stack), MP_OK) << mp_errmsg(&ctx);
  ev.sim.memory_first = 1;
  mp_search_config cfg;
  mp_sim_search_config(&cfg, &ev, &c, 0.05);
  cfg.n_threads = 2;
  cfg.bound_top_k = top;
  mp_search *s = nullptr;
  ASSERT_EQ(mp_search_enumerate(&ctx, &cfg, &s), MP_OK) << mp_errmsg(&ctx);
  ASSERT_EQ(mp_search_run(&ctx, &cfg, s, nullptr, nullptr, nullptr, nullptr), MP_OK) << mp_errmsg(&ctx);
  int64_t *ord = nullptr, n_ord = 0;
  ASSERT_EQ(mp_search_rank(&ctx, s, MP_OBJECTIVE_TIME, 0.0, &ord, &n_ord), MP_OK) << mp_errmsg(&ctx);
  order->assign(ord, ord + n_ord);
  cands->assign(s->cands, s->cands + s->n);
  if (lbs) lbs->assign((size_t)s->n, 0.0);
  if (check_bound) {
    void *w = nullptr;
    ASSERT_EQ(mp_sim_evaluator_thread_init(&ev, &ctx, &w), MP_OK) << mp_errmsg(&ctx);
    mp_arena *scratch = mp_arena_create();
    int64_t seen = 0;
    for (int64_t i = 0; i < s->n; i++) {
      mp_candidate cd = s->cands[i];
      if (!cd.evaluated || cd.reject != MP_REJECT_NONE || cd.mesh.size[MP_DIM_PP] <= 1) continue;
      if (seen++ % k.stride != 0) continue;
      const std::string what = std::string(k.model) + " candidate " + std::to_string(i);
      mp_sim_result r;
      cd.step_bound_s = cd.res.step_time_s;
      ASSERT_EQ(mp_sim_evaluate(w, &ctx, scratch, &cd, &r), MP_OK) << mp_errmsg(&ctx);
      mp_arena_reset(scratch);
      EXPECT_EQ(r.bounded, 0) << what << ": a stage's bound " << r.step_lb_s << " s past the step "
                              << cd.res.step_time_s << " s";
      EXPECT_EQ(r.step_time_s, cd.res.step_time_s) << what;
      cd.step_bound_s = 1e-12;
      ASSERT_EQ(mp_sim_evaluate(w, &ctx, scratch, &cd, &r), MP_OK) << mp_errmsg(&ctx);
      mp_arena_reset(scratch);
      EXPECT_EQ(r.bounded, 1) << what;
      EXPECT_GT(r.step_lb_s, 0.0) << what;
      EXPECT_LE(r.step_lb_s, cd.res.step_time_s) << what;
      if (lbs) (*lbs)[(size_t)i] = r.step_lb_s;
      if (checked) (*checked)++;
    }
    mp_arena_destroy(scratch);
    mp_sim_evaluator_thread_done(w);
  }
  mp_search_destroy(s);
  mp_sim_evaluator_free(&ev);
}

const Case kCases[] = {
    {"tiny-moe-pp", "h100-sxm", 16, 256, 64, nullptr, 1},
    {"llama3.1-70b", "h100-sxm", 64, 8192, 128, nullptr, 1},
    {"deepseek-v2-lite", "h100-sxm", 32, 4096, 64, "megatron-core", 1},
    // DeepSeek-V3's pre-training batch and sequence (its technical report, sec. 4.2); about
    // 9,000 of its plans fit, every ninth (in enumeration order, so every mesh family) is
    // simulated again, which keeps the test's run in the sanitizer build short
    {"deepseek-v3", "h800", 2048, 4096, 15360, "megatron-core", 9},
};

}  // namespace

// d and c of one family (the same mesh, chunks, split and SP, float8 and reshard), d at a
// smaller micro-batch with AC none or c's policy, every block: the pairs the search's
// micro-batch rule (search_run.c sibling_step_lb) reads.
bool SmallerSibling(const mp_candidate &d, const mp_candidate &c) {
  return memcmp(&d.mesh, &c.mesh, sizeof d.mesh) == 0 && d.pp_virtual == c.pp_virtual &&
         d.pp_split == c.pp_split && d.sp == c.sp && d.fp8 == c.fp8 && d.reshard == c.reshard &&
         d.micro_batch < c.micro_batch && d.ac_every <= 1 && c.ac_every <= 1 &&
         (d.ac == c.ac || d.ac == MP_AC_NONE);
}

TEST(StepBound, AStageBoundNeverExceedsTheStep) {
  int64_t pairs = 0;
  for (const Case &k : kCases) {
    std::vector<mp_candidate> cands;
    std::vector<int64_t> order;
    std::vector<double> lbs;
    int64_t checked = 0;
    Search(k, 0, 1, &cands, &order, &checked, &lbs);
    EXPECT_GT(checked, 10) << k.model << ": too few plans with pp > 1 fit to say anything";
    // The micro-batch rule's premise: c's micro-batch of r times d's sequences runs 1/r as
    // many micro-batches (the same batch), each no faster than d's, so c's stage bound is
    // at least d's x (c's batch / d's) / r. Checked over the plans both simulated again.
    for (size_t j = 0; j < cands.size(); j++) {
      if (!(lbs[j] > 0.0)) continue;
      for (size_t i = j; i-- > 0 && memcmp(&cands[i].mesh, &cands[j].mesh, sizeof cands[i].mesh) == 0;) {
        if (!(lbs[i] > 0.0) || !SmallerSibling(cands[i], cands[j])) continue;
        const double scaled = lbs[i] * ((double)cands[j].global_batch / (double)cands[i].global_batch) *
                              ((double)cands[i].micro_batch / (double)cands[j].micro_batch);
        EXPECT_GE(lbs[j], scaled) << k.model << " candidates " << i << " (mb " << cands[i].micro_batch
                                  << ") and " << j << " (mb " << cands[j].micro_batch << ")";
        pairs++;
      }
    }
  }
  EXPECT_GT(pairs, 100) << "too few pairs of micro-batches to say anything of the premise";
}

TEST(StepBound, TheShownPlansAreTheSearchWithoutIt) {
  const int top = 10;
  int64_t bounded_all = 0, fit_bounded = 0;
  for (const Case &k : kCases) {
    std::vector<mp_candidate> a, b;
    std::vector<int64_t> oa, ob;
    Search(k, 0, 0, &a, &oa);
    Search(k, top, 0, &b, &ob);
    ASSERT_EQ(a.size(), b.size());
    const size_t n = oa.size() < (size_t)top ? oa.size() : (size_t)top;
    ASSERT_GE(ob.size(), n) << k.model;
    // the K-th best cost of the search without the bound (by cost, not the tie order)
    std::vector<double> costs;
    for (int64_t i : oa) costs.push_back(a[(size_t)i].res.step_time_s / (double)a[(size_t)i].global_batch);
    std::sort(costs.begin(), costs.end());
    const double kth = costs.size() >= (size_t)top ? costs[(size_t)top - 1] : 1e300;
    for (size_t r = 0; r < n; r++) {
      ASSERT_EQ(oa[r], ob[r]) << k.model << " rank " << r + 1;
      EXPECT_EQ(a[(size_t)oa[r]].res.step_time_s, b[(size_t)ob[r]].res.step_time_s) << k.model << " rank " << r + 1;
      EXPECT_EQ(a[(size_t)oa[r]].res.peak_mem_bytes, b[(size_t)ob[r]].res.peak_mem_bytes) << k.model;
    }
    for (size_t i = 0; i < b.size(); i++) {
      bounded_all += b[i].reject == MP_REJECT_BOUNDED;
      // a plan that fits in both searches is simulated in full in both: the same step
      if (a[i].reject == MP_REJECT_NONE && b[i].reject == MP_REJECT_NONE) {
        EXPECT_EQ(a[i].res.step_time_s, b[i].res.step_time_s) << k.model << " candidate " << i;
      }
      // a bounded plan that fits is slower per sequence than the tenth best plan by more
      // than the tie tolerance: its step is at least its bound, which passed a K-th best
      // of part of the plans, at least the K-th best of all
      if (b[i].reject == MP_REJECT_BOUNDED && a[i].reject == MP_REJECT_NONE && a[i].evaluated) {
        EXPECT_GT(a[i].res.step_time_s / (double)a[i].global_batch, kth * (1.0 + MP_RANK_TIE_TOL))
            << k.model << " candidate " << i;
        fit_bounded++;
      }
    }
  }
  EXPECT_GT(bounded_all, 100) << "the bound stopped too few simulations to say anything";
  EXPECT_GT(fit_bounded, 100) << "too few bounded plans fit to say anything";
}

namespace {

// AC policy q recomputes a subset of what p recomputes (planner/search.h's dominance order:
// none inside every other, selective-core inside selective, every policy but full inside full).
bool RecomputesLess(int q, int p) {
  if (q == p) return false;
  if (q == MP_AC_NONE) return true;
  if (p != MP_AC_FULL) return q == MP_AC_SELECTIVE_CORE && p == MP_AC_SELECTIVE;
  return true;
}

// a and b differ in their AC policy and micro-batch at most.
bool Kin(const mp_candidate &a, const mp_candidate &b) {
  return memcmp(&a.mesh, &b.mesh, sizeof a.mesh) == 0 && a.pp_virtual == b.pp_virtual && a.pp_split == b.pp_split &&
         a.sp == b.sp && a.fp8 == b.fp8 && a.reshard == b.reshard;
}

// a and b differ in their AC policy at most.
bool Siblings(const mp_candidate &a, const mp_candidate &b) { return Kin(a, b) && a.micro_batch == b.micro_batch; }

// The lower bound of c's step that bounded sibling d gives by the micro-batch rule
// (search.h): d's stage bound per sequence, d a smaller micro-batch with c's policy or one
// recomputing less; 0 where d gives none.
double WiderBound(const mp_candidate &d, const mp_candidate &c) {
  if (!Kin(d, c) || d.reject != MP_REJECT_BOUNDED || !(d.res.step_lb_s > 0.0) || d.micro_batch >= c.micro_batch ||
      d.ac_every > 1 || c.ac_every > 1 || (d.ac != c.ac && !RecomputesLess(d.ac, c.ac)))
    return 0.0;
  return d.res.step_lb_s * ((double)c.global_batch / (double)d.global_batch) *
         ((double)d.micro_batch / (double)c.micro_batch);
}

}  // namespace

// Which candidates the bound may stop, per search.h's rule, with K = 10 shown plans.
//   - The bound a candidate is handed (step_bound_s, per step) is the K-th best cost (step per
//     sequence) of the chunks 8 before it, times 1 + MP_RANK_TIE_TOL, times its global batch:
//     the K-th best of part of the plans is at least the K-th best of all of them, which is
//     the K-th best that fits in this search (a bounded plan is never among the K, asserted
//     above). So step_bound_s >= kth x (1 + tol) x global_batch (up to rounding, 1e-12).
//   - A bounded candidate either stopped in its own simulation (res.bounded, its stage's
//     lower bound past its bound), or, not simulated, has a bounded sibling before it (the
//     same mesh, chunks, SP, fp8, reshard and micro-batch, one policy per layer) that
//     recomputes a subset of what it recomputes: more recompute is never faster. A sibling
//     recomputing more says nothing: the enumeration runs full before selective-core, so
//     full bounded beside a selective-core plan that fits is the case that matters.
//   - Or, not simulated, its lower bound (res.step_lb_s, past its bound) is the one a bounded
//     sibling before it with a smaller micro-batch gives (WiderBound: that sibling's stage
//     bound per sequence), the sibling's policy c's own or one recomputing less.
// Each kind occurs (else the checks say nothing). DeepSeek-V3's case is left to the tests
// above (its search is the longest).
TEST(StepBound, BoundedPlansFollowTheRule) {
  int64_t handed = 0, own = 0, sibling = 0, widened = 0;
  for (size_t c = 0; c + 1 < sizeof kCases / sizeof kCases[0]; c++) {
    const Case &k = kCases[c];
    std::vector<mp_candidate> b;
    std::vector<int64_t> ob;
    Search(k, 10, 0, &b, &ob);
    std::vector<double> costs;
    for (const mp_candidate &x : b)
      if (x.evaluated && x.reject == MP_REJECT_NONE) costs.push_back(x.res.step_time_s / (double)x.global_batch);
    std::sort(costs.begin(), costs.end());
    ASSERT_GE(costs.size(), 10u) << k.model;
    const double kth = costs[9];
    for (size_t i = 0; i < b.size(); i++) {
      const std::string what = std::string(k.model) + " candidate " + std::to_string(i);
      if (b[i].step_bound_s > 0.0) {
        EXPECT_GE(b[i].step_bound_s, kth * (1.0 + MP_RANK_TIE_TOL) * (double)b[i].global_batch * (1.0 - 1e-12))
            << what;
        handed++;
      }
      if (b[i].reject != MP_REJECT_BOUNDED) continue;
      if (b[i].res.bounded) {
        EXPECT_GT(b[i].res.step_lb_s, b[i].step_bound_s) << what;
        own++;
        continue;
      }
      if (b[i].res.step_lb_s > 0.0) {
        EXPECT_GT(b[i].res.step_lb_s, b[i].step_bound_s) << what;
        bool wider = false;
        for (size_t j = 0; j < i && !wider; j++) {
          const double lb = WiderBound(b[j], b[i]);
          wider = lb > 0.0 && std::fabs(lb - b[i].res.step_lb_s) <= 1e-12 * lb;
        }
        EXPECT_TRUE(wider) << what << " bounded by a smaller micro-batch's bound that no sibling gives";
        widened++;
        continue;
      }
      bool lighter = false;
      for (size_t j = 0; j < i && !lighter; j++)
        lighter = Siblings(b[j], b[i]) && b[j].reject == MP_REJECT_BOUNDED && b[i].ac_every <= 1 &&
                  b[j].ac_every <= 1 && RecomputesLess(b[j].ac, b[i].ac);
      EXPECT_TRUE(lighter) << what << " (ac " << (int)b[i].ac << ") bounded with neither a simulation nor a bounded "
                           << "sibling recomputing less";
      sibling++;
    }
  }
  EXPECT_GT(handed, 0);
  EXPECT_GT(own, 0);
  EXPECT_GT(sibling, 0);
  EXPECT_GT(widened, 0);
}
