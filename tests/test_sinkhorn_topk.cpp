// Sinkhorn top-k: the plan's marginals, agreement with a reference solver, Proposition 1, numerics.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <type_traits>
#include <utility>

#include "reference.hpp"
#include "support.hpp"

using ssr::Context;
using ssr::Cost;
using ssr::index_t;
using ssr::SinkhornTopK;

namespace {

// Normalised L1 column error of a plan, in double.
template <class T>
double column_error(const test::Routed<T>& r) {
  double err = 0;
  for (index_t j = 0; j < r.n; ++j) {
    double col = 0;
    for (index_t i = 0; i < r.m; ++i) col += r.plan_at(i, j);
    err += std::abs(col - static_cast<double>(r.m) / static_cast<double>(r.n));
  }
  return err / static_cast<double>(r.m);
}

// The route without the plan asked (nor the noise): the CPU then takes its final top-k by groups of tiles.
// The same experts, weights (bit for bit) and iterations as the route with the plan, `with_plan`.
void require_same_without_plan(const SinkhornTopK& policy, const std::vector<float>& s, index_t m, index_t n, index_t k,
                               int threads, const test::Routed<float>& with_plan) {
  test::Router<SinkhornTopK, float> router(policy, threads);
  test::Routed<float> r(m, n, k);
  auto outputs = r.outputs();
  outputs.plan = {};
  outputs.noise = {};
  r.info = router.route({s.data(), m, n}, Context::train(0), outputs);
  REQUIRE(r.info.iterations == with_plan.info.iterations);
  REQUIRE(r.experts == with_plan.experts);
  REQUIRE(std::memcmp(r.weights.data(), with_plan.weights.data(), r.weights.size() * sizeof(float)) == 0);
}

}  // namespace

TEMPLATE_TEST_CASE("the plan has unit rows and columns within tol", "[sinkhorn]", float, double) {
  const index_t m = 3001, n = 16;
  const auto cost = GENERATE(Cost::linear, Cost::softmax);
  const double xi = GENERATE(0.5, 0.1);
  const auto s = test::random_logits<TestType>(m, n, 2.0, 7, 4.0);
  const double tol = 1e-4;
  const auto r = test::route(SinkhornTopK(2, cost, {xi, tol, 1000}), s, m, n, Context::train(0));
  REQUIRE(r.info.path == ssr::Path::sinkhorn);
  REQUIRE(r.info.converged);
  REQUIRE(r.info.iterations >= 1);
  const double row_tol = std::is_same<TestType, float>::value ? 1e-5 : 1e-12;
  for (index_t i = 0; i < m; ++i) {
    double sum = 0;
    for (index_t j = 0; j < n; ++j) sum += r.plan_at(i, j);
    REQUIRE(std::abs(sum - 1) < row_tol);
  }
  const double err = column_error(r);
  CHECK(err < tol);
  CHECK(err == Approx(r.info.marginal_error).margin(std::is_same<TestType, float>::value ? 2e-5 : 1e-12));
}

TEST_CASE("the plan matches a straightforward log-domain Sinkhorn", "[sinkhorn]") {
  const index_t m = 500, n = 8;
  const auto cost = GENERATE(Cost::linear, Cost::softmax);
  const double xi = GENERATE(1.0, 0.5, 0.1, 0.02);  // at 0.02 the scalings are absorbed into Q repeatedly
  const auto s = test::random_logits<double>(m, n, 1.5, 11, 3.0);
  const double tol = 1e-11;
  const auto r = test::route(SinkhornTopK(2, cost, {xi, tol, 100000}), s, m, n, Context::train(0));
  REQUIRE(r.info.converged);
  const auto ref = test::reference_sinkhorn(test::reference_costs(s, m, n, cost), m, n, xi, tol, 100000).plan;
  double worst = 0;
  for (index_t i = 0; i < m * n; ++i) worst = std::max(worst, std::abs(ref[i] - r.plan[i]));
  CHECK(worst < 1e-9);
}

TEST_CASE("with float logits the plan is the log-domain Sinkhorn's within float's precision", "[sinkhorn]") {
  // The float solve's own kernel: the linear cost's (its bits where 1 / xi is a power of two), and on the
  // CPU the softmax cost's in float (within (n + 8) 2^-24 / xi of the double kernel). K in float carries
  // about 2^-24 |K| and |K| grows as 1 / xi, so the bound does; on these logits the softmax cost's plan lands
  // at a quarter of the linear cost's distance or less (3.5e-6 at xi = 0.1, n = 16, against 1.9e-5).
  const index_t m = 500;
  const index_t n = GENERATE(8, 16);
  const auto cost = GENERATE(Cost::linear, Cost::softmax);
  const double xi = GENERATE(1.0, 0.5, 0.1, 0.02);
  const auto s = test::random_logits<float>(m, n, 1.5, 11, 3.0);
  const auto r = test::route(SinkhornTopK(2, cost, {xi, 1e-6, 100000}), s, m, n, Context::train(0));
  REQUIRE(r.info.converged);
  const auto ref =
      test::reference_sinkhorn(test::reference_costs({s.begin(), s.end()}, m, n, cost), m, n, xi, 1e-11, 100000).plan;
  double worst = 0;
  for (index_t i = 0; i < m * n; ++i) worst = std::max(worst, std::abs(ref[i] - static_cast<double>(r.plan[i])));
  INFO("n " << n << " cost " << ssr::to_string(cost) << " xi " << xi);
  CHECK(worst < 4e-6 / xi);
}

TEST_CASE("plan weights are the KL-optimal weights on the chosen experts (Proposition 1)", "[sinkhorn]") {
  const index_t m = 400, n = 16, k = 4;
  const auto s = test::random_logits<double>(m, n, 1.0, 3);
  const auto r = test::route(SinkhornTopK(k), s, m, n, Context::train(0));
  std::mt19937 gen(5);
  std::uniform_real_distribution<double> u(0.01, 1.0);
  for (index_t i = 0; i < m; ++i) {
    // KL(q || Pi_i) for q supported on the chosen experts.
    auto kl = [&](const std::vector<double>& q) {
      double d = 0;
      for (index_t t = 0; t < k; ++t) d += q[t] * std::log(q[t] / r.plan_at(i, r.expert(i, t)));
      return d;
    };
    std::vector<double> w(k), q(k);
    double mass = 0;
    for (index_t t = 0; t < k; ++t) {
      w[t] = r.weight(i, t);
      mass += r.plan_at(i, r.expert(i, t));
    }
    const double best = kl(w);
    CHECK(best == Approx(-std::log(mass)).margin(1e-12));  // the closed-form minimum
    for (int trial = 0; trial < 20; ++trial) {
      double z = 0;
      for (auto& x : q) z += (x = u(gen));
      for (auto& x : q) x /= z;
      REQUIRE(kl(q) >= best - 1e-12);
    }
  }
}

TEST_CASE("experts are the plan's top-k, by descending plan value, distinct", "[sinkhorn]") {
  const index_t m = 1000, n = 32, k = 3;
  const auto s = test::random_logits<float>(m, n, 3.0, 9);
  const auto r = test::route(SinkhornTopK(k), s, m, n, Context::train(0));
  for (index_t i = 0; i < m; ++i) {
    std::vector<float> row(r.plan.begin() + i * n, r.plan.begin() + (i + 1) * n);
    std::vector<float> sorted = row;
    std::sort(sorted.begin(), sorted.end(), std::greater<float>());
    for (index_t t = 0; t < k; ++t) {
      REQUIRE(row[r.expert(i, t)] == sorted[t]);
      for (index_t u = 0; u < t; ++u) REQUIRE(r.expert(i, u) != r.expert(i, t));
    }
  }
}

TEST_CASE("experts and weights are the same with the plan asked and without, at any tolerance and limit",
          "[sinkhorn]") {
  // Without the plan the CPU takes the top-k a group of tiles at a time, and a pass that looks like the last
  // takes it as it goes over Q, kept where that pass was the last; with the plan, row by row after the last
  // pass. Tolerances across each iteration's error and limits of 1 to 4 iterations make passes taken for the
  // last that were not, and the reverse. Two threads split a solve of 131072 elements or more (CpuTuning):
  // at n = 16 from 8192 rows, at n = 130 from 1009, where at m = 1201 (three tiles a block, 26 blocks of
  // 51 for the first thread) they split a group of four tiles. Every share here walks its blocks forward and
  // backward in turn (CpuTuning::alternate_max_bytes), so the passes taken for the last go both ways; a walk
  // forward only (a share over 4 MiB) runs the forward one alone.
  const auto shape =
      GENERATE(table<index_t, index_t>({{5, 37}, {5, 9001}, {16, 37}, {16, 9001}, {130, 37}, {130, 1201}}));
  const index_t n = std::get<0>(shape), m = std::get<1>(shape);
  const int threads = GENERATE(1, 2);
  const auto cost = GENERATE(Cost::linear, Cost::softmax);
  const auto s = test::random_logits<float>(m, n, 2.0, 17, 3.0);
  std::vector<std::pair<double, int>> stops;  // (tol, max_iters)
  for (int i = 0; i < 16; i += test::sanitized ? 2 : 1) stops.emplace_back(0.5 * std::pow(0.6, i), 1000);
  for (int limit = 1; limit <= 4; ++limit) stops.emplace_back(1e-30, limit);
  for (const index_t k : {index_t{1}, index_t{2}, std::min<index_t>(n, 8)})
    for (const auto weights : {ssr::Weights::plan, ssr::Weights::scores})
      for (const auto& stop : stops) {
        const SinkhornTopK policy(static_cast<int>(k), cost, {0.5, stop.first, stop.second}, weights);
        const auto with_plan = test::route(policy, s, m, n, Context::train(0), threads);
        INFO("n " << n << " m " << m << " threads " << threads << " k " << k << " tol " << stop.first << " limit "
                  << stop.second);
        require_same_without_plan(policy, s, m, n, k, threads, with_plan);
      }
}

TEST_CASE("rows whose chosen Q underflowed are routed alone, as with the plan asked", "[sinkhorn]") {
  // At small xi many rows' chosen Q fall below the underflow threshold; without the plan the CPU takes their
  // group's top-k by tiles and redoes those rows alone in the log domain, with the plan every row goes alone.
  const double xi = GENERATE(0.1, 0.05);
  const int threads = GENERATE(1, 2);
  const index_t m = 9001, n = 16;
  const auto s = test::random_logits<float>(m, n, 2.0, 23, 3.0);
  for (const index_t k : {index_t{1}, index_t{2}, index_t{5}})
    for (const auto weights : {ssr::Weights::plan, ssr::Weights::scores}) {
      const SinkhornTopK policy(static_cast<int>(k), Cost::linear, {xi, 1e-4, 100}, weights);
      const auto with_plan = test::route(policy, s, m, n, Context::train(0), threads);
      INFO("xi " << xi << " threads " << threads << " k " << k);
      require_same_without_plan(policy, s, m, n, k, threads, with_plan);
    }
}

TEST_CASE("Sinkhorn balances the load that softmax top-k leaves skewed", "[sinkhorn]") {
  const index_t m = 4096, n = 16;
  const auto s = test::random_logits<float>(m, n, 1.0, 21, 6.0);  // experts with low index are favoured
  const auto soft = test::route(ssr::SoftmaxTopK(2), s, m, n, Context::train(0));
  const auto sink = test::route(SinkhornTopK(2), s, m, n, Context::train(0));
  const auto a = ssr::load_stats({soft.load.data(), n}), b = ssr::load_stats({sink.load.data(), n});
  CHECK(a.max_over_mean > 3.0);
  CHECK(b.max_over_mean < 1.3);
  CHECK(b.empty_experts == 0);
}

TEMPLATE_TEST_CASE("score weights are the softmax of the logits over the plan's experts", "[sinkhorn]", float, double) {
  using T = TestType;
  const index_t m = 300, n = 8;
  const index_t k = GENERATE(2, 3, 8);
  const auto s = test::random_logits<T>(m, n, 2.0, 4, 3.0);
  const auto r = test::route(SinkhornTopK(static_cast<int>(k), Cost::linear, {}, ssr::Weights::scores), s, m, n,
                             Context::train(0));
  REQUIRE(r.info.weights == ssr::Weights::scores);
  const double ulps = 4 * static_cast<double>(std::numeric_limits<T>::epsilon());
  for (index_t i = 0; i < m; ++i) {
    const auto logit = [&](index_t t) { return static_cast<double>(s[i * n + r.expert(i, t)]); };
    double top = logit(0), z = 0;
    for (index_t t = 1; t < k; ++t) top = std::max(top, logit(t));
    for (index_t t = 0; t < k; ++t) z += std::exp(logit(t) - top);
    for (index_t t = 0; t < k; ++t)
      REQUIRE(static_cast<double>(r.weight(i, t)) == Approx(std::exp(logit(t) - top) / z).epsilon(ulps));
  }
}

TEST_CASE("identical rows give a uniform plan and ties go to the lower index", "[sinkhorn]") {
  const index_t m = 64, n = 8;
  std::vector<float> s(m * n, 0.25f);
  const auto r = test::route(SinkhornTopK(3), s, m, n, Context::train(0));
  for (index_t i = 0; i < m; ++i) {
    for (index_t t = 0; t < 3; ++t) REQUIRE(r.expert(i, t) == t);
    for (index_t j = 0; j < n; ++j) REQUIRE(r.plan_at(i, j) == Approx(1.0 / n).epsilon(1e-6));
  }
  CHECK(r.info.iterations == 1);
}

TEMPLATE_TEST_CASE("no NaN or Inf at extreme logit scales and regularisations", "[sinkhorn][numerics]", float, double) {
  const index_t m = 257, n = 16, k = 2;
  for (double scale : {1e-3, 1e-1, 1.0, 1e2, 1e4}) {
    for (double xi : {1e-3, 1e-2, 0.1, 0.5, 1.0, 10.0}) {
      for (Cost cost : {Cost::linear, Cost::softmax}) {
        const auto s = test::random_logits<TestType>(m, n, scale, 13, 2.0);
        const auto r = test::route(SinkhornTopK(k, cost, {xi, 1e-4, 100}), s, m, n, Context::train(0));
        INFO("scale " << scale << " xi " << xi << " cost " << ssr::to_string(cost));
        REQUIRE(std::isfinite(r.info.marginal_error));
        for (index_t i = 0; i < m; ++i) {
          double row = 0;
          for (index_t j = 0; j < n; ++j) {
            REQUIRE(std::isfinite(r.plan_at(i, j)));
            REQUIRE(r.plan_at(i, j) >= 0);
            row += r.plan_at(i, j);
          }
          REQUIRE(row == Approx(1).epsilon(1e-4));
          REQUIRE(std::isfinite(r.weight(i, 0)));
          REQUIRE(r.weight(i, 0) + r.weight(i, 1) == Approx(1).epsilon(1e-5));
          REQUIRE(r.expert(i, 0) != r.expert(i, 1));
        }
      }
    }
  }
}

TEMPLATE_TEST_CASE("no NaN or Inf at the limits of the floating-point range", "[sinkhorn][numerics]", float, double) {
  const index_t m = 40, n = 4;
  const TestType big = std::numeric_limits<TestType>::max();
  std::vector<TestType> s(m * n);
  for (index_t i = 0; i < m * n; ++i) s[i] = (i % 3 == 0) ? big : (i % 3 == 1 ? -big : std::numeric_limits<TestType>::min());
  for (double xi : {1e-30, 1e-3, 1.0, 1e30}) {
    const auto r = test::route(ssr::NoisyCost<SinkhornTopK>(SinkhornTopK(2, Cost::linear, {xi, 1e-4, 50}), 1e3, 1e3), s, m,
                               n, Context::train(0));
    for (auto p : r.plan) REQUIRE(std::isfinite(p));
    for (auto w : r.weights) REQUIRE(std::isfinite(w));
    REQUIRE(std::isfinite(r.info.marginal_error));
    // The softmax cost without noise (the CPU's float kernel for float logits).
    const auto q = test::route(SinkhornTopK(2, Cost::softmax, {xi, 1e-4, 50}), s, m, n, Context::train(0));
    INFO("softmax cost, xi " << xi);
    for (auto p : q.plan) REQUIRE(std::isfinite(p));
    for (auto w : q.weights) REQUIRE(std::isfinite(w));
    REQUIRE(std::isfinite(q.info.marginal_error));
  }
}

TEMPLATE_TEST_CASE("an expert no token favours still gets its share in few iterations", "[sinkhorn][numerics]", float, double) {
  // Expert n-1 trails every token's best expert by 1e4 / xi: its plan column underflows to zero at first,
  // and the solver must recover its potential in the log domain rather than creep towards it.
  const index_t m = 1024, n = 8;
  auto s = test::random_logits<TestType>(m, n, 1.0, 3);
  for (index_t i = 0; i < m; ++i) s[i * n + n - 1] = static_cast<TestType>(s[i * n] - 1e4);
  const auto r = test::route(SinkhornTopK(2, Cost::linear, {1.0, 1e-4, 100}), s, m, n, Context::train(0));
  CHECK(r.info.converged);
  CHECK(r.load[n - 1] > 0);
}

TEST_CASE("evaluation routes by softmax top-k without Sinkhorn", "[sinkhorn]") {
  const index_t m = 200, n = 8;
  const auto s = test::random_logits<float>(m, n, 1.0, 2, 4.0);
  const auto sink = test::route(SinkhornTopK(2), s, m, n, Context::eval());
  const auto soft = test::route(ssr::SoftmaxTopK(2), s, m, n, Context::eval());
  CHECK(sink.info.path == ssr::Path::softmax);
  CHECK(sink.experts == soft.experts);
  CHECK(sink.weights == soft.weights);
}

TEMPLATE_TEST_CASE("the solve stops where the reference does, with its error", "[sinkhorn]", float, double) {
  // The stopping rule of DESIGN section 1: after each iteration (rows exact) the normalised L1 column error;
  // stop when it is below tol or after max_iters. In double the library runs the reference's iterations; in
  // float its column sums carry float rounding, which may move an error lying near tol across it.
  using T = TestType;
  const bool exact = std::is_same<T, double>::value;
  const index_t m = 500;
  const index_t n = GENERATE(8, 16);
  const auto cost = GENERATE(Cost::linear, Cost::softmax);
  const double xi = GENERATE(1.0, 0.5, 0.1);
  const auto s = test::random_logits<T>(m, n, 1.5, 29, 3.0);
  const auto c = test::reference_costs({s.begin(), s.end()}, m, n, cost);
  for (const auto& stop : {std::pair<double, int>{1e-5, 1000}, {1e-30, 3}}) {
    const auto r = test::route(SinkhornTopK(2, cost, {xi, stop.first, stop.second}), s, m, n, Context::train(0));
    const auto ref = test::reference_sinkhorn(c, m, n, xi, stop.first, stop.second);
    INFO("n " << n << " cost " << ssr::to_string(cost) << " xi " << xi << " tol " << stop.first << " reference "
              << ref.iterations << " iterations, err " << ref.err << "; library " << r.info.iterations << ", "
              << r.info.marginal_error);
    if (exact || stop.second == 3) {
      REQUIRE(r.info.iterations == ref.iterations);
      CHECK(r.info.marginal_error == Approx(ref.err).epsilon(exact ? 1e-8 : 1e-2).margin(exact ? 1e-15 : 1e-7));
    } else {
      REQUIRE(std::abs(r.info.iterations - ref.iterations) <= 1);
    }
    CHECK(r.info.converged == (r.info.marginal_error < stop.first));
  }
}

TEST_CASE("large solves on two threads give the reference's plan, experts and weights", "[sinkhorn]") {
  // Shapes where two threads take a team, split the blocks and (at n = 130) a group of tiles, and at
  // xi = 0.05 rows whose chosen plan values underflow float; the reference runs as many iterations as the
  // library did, so the two plans differ by float rounding alone (K in float carries 2^-24 |K|, |K| ~ 1 / xi).
  const auto shape = GENERATE(table<index_t, index_t>({{9001, 16}, {1201, 130}}));
  const index_t m = std::get<0>(shape), n = std::get<1>(shape), k = 2;
  const double xi = GENERATE(0.5, 0.05);
  const auto weights = GENERATE(ssr::Weights::plan, ssr::Weights::scores);
  const auto s = test::random_logits<float>(m, n, 2.0, 41, 3.0);
  const auto r = test::route(SinkhornTopK(k, Cost::linear, {xi, 1e-4, 200}, weights), s, m, n, Context::train(0), 2);
  const auto ref =
      test::reference_sinkhorn(test::reference_costs({s.begin(), s.end()}, m, n, Cost::linear), m, n, xi, 0,
                               r.info.iterations);
  INFO("m " << m << " n " << n << " xi " << xi << " iterations " << r.info.iterations);
  const double tol = 4e-6 / xi;
  CHECK(r.info.marginal_error == Approx(ref.err).epsilon(0.05).margin(1e-6));
  double worst = 0;
  for (std::size_t e = 0; e < ref.plan.size(); ++e) worst = std::max(worst, std::abs(ref.plan[e] - r.plan[e]));
  CHECK(worst < tol);
  for (index_t i = 0; i < m; ++i) {
    const double* p = &ref.plan[static_cast<std::size_t>(i * n)];
    std::vector<double> sorted(p, p + n);
    std::sort(sorted.begin(), sorted.end(), std::greater<double>());
    double chosen = 0;
    for (index_t t = 0; t < k; ++t) {
      REQUIRE(p[r.expert(i, t)] >= sorted[t] - 2 * tol);  // the reference's top-k, up to a near tie
      chosen += p[r.expert(i, t)];
    }
    for (index_t t = 0; t < k && weights == ssr::Weights::plan; ++t)
      REQUIRE(r.weight(i, t) == Approx(p[r.expert(i, t)] / chosen).margin(2 * tol / chosen));
  }
}

TEMPLATE_TEST_CASE("each plan weight is its plan value over the chosen values' sum", "[sinkhorn]", float, double) {
  // Proposition 1's weights, expert by expert: the plan output and the weights both come from the same
  // values, each through a few roundings in T, so they agree within a few units in the last place of T;
  // where they come from log-plan values (xi = 0.05: rows whose chosen values underflowed), each exp also
  // carries its argument's rounding, |log p| units in the last place. Values below T's least normal number
  // have no relative precision left.
  using T = TestType;
  const index_t m = 2000, n = 16, k = 5;
  const double xi = GENERATE(0.5, 0.05);
  const auto cost = GENERATE(Cost::linear, Cost::softmax);
  const auto s = test::random_logits<T>(m, n, 2.0, 43, 3.0);
  const auto r = test::route(SinkhornTopK(k, cost, {xi, 1e-4, 100}), s, m, n, Context::train(0));
  const double eps = static_cast<double>(std::numeric_limits<T>::epsilon());
  const double least = static_cast<double>(std::numeric_limits<T>::min());
  for (index_t i = 0; i < m; ++i) {
    double chosen = 0;
    for (index_t t = 0; t < k; ++t) chosen += static_cast<double>(r.plan_at(i, r.expert(i, t)));
    for (index_t t = 0; t < k; ++t) {
      const double p = static_cast<double>(r.plan_at(i, r.expert(i, t)));
      INFO("xi " << xi << " cost " << ssr::to_string(cost) << " row " << i << " expert " << t);
      REQUIRE(static_cast<double>(r.weight(i, t)) ==
              Approx(p / chosen).epsilon(eps * (8 + 2 * std::abs(std::log(std::max(p, least))))).margin(least));
    }
  }
}
