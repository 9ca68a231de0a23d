// The score functions and the selection rules of today's engines, one token's row at a time:
// score s(S) (softmax or sigmoid), selection by the biased scores s + b (auxiliary-loss-free balancing),
// and group-limited top-k (experts in equal consecutive groups; a group's score is the sum of its two
// highest biased scores; the experts of the best groups compete). docs/routers.md gives the sources.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

#include "ssr/detail/hd.hpp"
#include "ssr/math/cost.hpp"
#include "ssr/math/log.hpp"
#include "ssr/math/topk.hpp"
#include "ssr/spec.hpp"
#include "ssr/view.hpp"

namespace ssr {
namespace math {

// The most groups group-limited top-k takes: a row's kept groups fit one 64-bit mask.
constexpr int max_groups = 64;

// sigmoid(x), without overflow for any x (math::exp: the same bits on every backend).
SSR_HD inline double sigmoid(double x) {
  if (x >= 0) return 1 / (1 + math::exp(-x));
  const double e = math::exp(x);
  return e / (1 + e);
}

// log s(x) up to a per-row constant, what score weights take a softmax of: x for softmax scores (the
// row's normaliser cancels over the chosen experts), log sigmoid(x) = min(x, 0) - log(1 + exp(-|x|)) for
// sigmoid scores (math::log of a value in [1, 2]).
SSR_HD inline double log_score(Score score, double x) {
  if (score == Score::softmax) return x;
  const double tail = math::log(1 + math::exp(x < 0 ? x : -x));
  return x < 0 ? x - tail : -tail;
}

// d log s(x) / dx of an element-wise score: 1 for softmax scores (over the chosen experts they are
// exp(x) / sum), 1 - sigmoid(x) = sigmoid(-x) for sigmoid scores.
SSR_HD inline double log_score_slope(Score score, double x) { return score == Score::softmax ? 1.0 : sigmoid(-x); }

// What the scores of a row need besides its logits: for softmax scores its largest logit and normaliser.
// s(j) is logit j of the row, as a double.
template <class Logit>
SSR_HD CostShift score_shift(index_t n, Score score, const Logit& s) {
  return score == Score::softmax ? cost_shift(n, Cost::softmax, s) : CostShift{0, 1};
}

// s(x): softmax(S_i)_j = exp(x - top) / sum, or sigmoid(x).
SSR_HD inline double score_value(Score score, double x, const CostShift& shift) {
  return score == Score::softmax ? math::exp(x - shift.top) / shift.sum : sigmoid(x);
}

// The value the softmax path ranks expert j by, under a selection that is not plain top-k of the logits:
// s(S_ij) + b_j (b null: 0). NaN (an unchecked non-finite input) ranks last.
SSR_HD inline double selection_value(Score score, double x, const CostShift& shift, const float* bias, index_t j) {
  const double v = score_value(score, x, shift) + (bias ? static_cast<double>(bias[j]) : 0.0);
  return v == v ? v : -std::numeric_limits<double>::infinity();
}

// The groups a row keeps, as a bit mask: group g (experts [g * n / G, (g + 1) * n / G)) scores the sum
// of its two highest values (its one value if it has one expert), and the topk_groups best groups are
// kept, ties to the lower group index. value(j) is expert j's selection value.
template <class Value>
SSR_HD std::uint64_t kept_groups(index_t n, const Selection& sel, const Value& value) {
  double group[max_groups];
  const index_t size = n / sel.n_groups;
  for (int g = 0; g < sel.n_groups; ++g) {
    double first = -std::numeric_limits<double>::infinity(), second = first;
    for (index_t j = g * size; j < (g + 1) * size; ++j) {
      const double v = value(j);
      if (v > first) {
        second = first;
        first = v;
      } else if (v > second) {
        second = v;
      }
    }
    group[g] = size == 1 ? first : first + second;
  }
  std::uint64_t kept = 0;
  for (int g = 0; g < sel.n_groups; ++g) {
    int ahead = 0;
    for (int h = 0; h < sel.n_groups; ++h) ahead += ranks_before(group[h], h, group[g], g) ? 1 : 0;
    if (ahead < sel.topk_groups) kept |= std::uint64_t{1} << g;
  }
  return kept;
}

// idx[0, k) = the top-k of the row by value(j) (math::topk: ties to the lower index), among the experts
// of the kept groups when the selection is group-limited.
template <class Value>
SSR_HD void select_topk(index_t n, int k, const Selection& sel, std::int32_t* idx, const Value& value) {
  if (!sel.grouped()) {
    topk(n, k, idx, value);
    return;
  }
  const std::uint64_t kept = kept_groups(n, sel, value);
  const index_t size = n / sel.n_groups;
  topk(n, k, idx,
       [&](index_t j) { return (kept >> (j / size)) & 1 ? value(j) : -std::numeric_limits<double>::infinity(); });
}

// The softmax path's experts of one row, for any selection: top-k of the logits when plain (no noise:
// the noisy path ranks its cost), else select_topk of the selection values with the expert bias (null:
// none). s(j) is logit j as a double.
template <class Logit>
SSR_HD void select_row(const RouteSpec& spec, const float* bias, index_t n, std::int32_t* idx, const Logit& s) {
  if (spec.plain_selection(bias)) {
    topk(n, spec.k, idx, s);  // top-k of S and of c(S) agree
    return;
  }
  const CostShift shift = score_shift(n, spec.select.score, s);
  select_topk(n, spec.k, spec.select, idx,
              [&](index_t j) { return selection_value(spec.select.score, s(j), shift, bias, j); });
}

}  // namespace math
}  // namespace ssr
