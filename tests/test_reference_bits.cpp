// Every backend gives the bits of a scalar reference composed here from the definitions of ssr/math/ (a row
// at a time, every sum in its defined order): the same experts, weights, plan, noise, load, iterations and
// error, and the same dL/dS, over both costs, noise, both weight rules, sigmoid scores, exact ties, k on
// either side of the CPU's tiles, float and double. On the GPU nvcc may fuse a product and a sum that the
// host keeps apart (-fmad), which a solve's iterations carry further; until a device run pins that down,
// the Sinkhorn path is left there to test_agreement's tolerances.
#include <catch2/catch.hpp>

#include <ssr/math/backward.hpp>
#include <ssr/math/rows.hpp>
#include <ssr/math/sinkhorn.hpp>
#include <ssr/math/sinkhorn_scaled.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "support.hpp"

using ssr::Context;
using ssr::Cost;
using ssr::index_t;

namespace {

// The reference's Sinkhorn solve: the scaled form of math/sinkhorn_scaled.hpp, row by row.
template <class T>
void reference_solve(const ssr::RouteSpec& spec, const Context& ctx, const std::vector<T>& s, index_t m, index_t n,
                     test::Routed<T>& r) {
  namespace math = ssr::math;
  const auto at = [n](index_t i, index_t j) { return static_cast<std::size_t>(i * n + j); };
  std::vector<T> k(s.size()), q(s.size()), top(m), row_sum(m), inv(m), gt(n, 0), h(n, 0), v(n, 1);
  std::vector<double> g(n, 0.0), colsum(n);
  for (index_t i = 0; i < m; ++i) math::kernel_row<T>(spec, ctx, &s[at(i, 0)], i, n, &k[at(i, 0)], &r.noise[at(i, 0)]);
  const math::ColumnTarget target = math::column_target(m, n);
  const index_t rows = math::sum_block_rows(n), blocks = math::sum_blocks(m, n);
  std::vector<T> part(static_cast<std::size_t>(blocks * n));
  bool absorb = true;
  for (int iterations = 1;; ++iterations) {
    for (index_t i = 0; absorb && i < m; ++i) {
      math::row_shift_of(
          n, [&](index_t j, T& x) { x = k[at(i, j)]; }, [&](index_t j, T& x) { x = h[j]; }, top[i]);
      for (index_t j = 0; j < n; ++j) q[at(i, j)] = math::exp_as<T>((k[at(i, j)] + h[j]) - top[i]);
    }
    for (index_t b = 0; b < blocks; ++b) {
      const index_t first = b * rows, last = std::min(m, first + rows);
      for (index_t i = first; i < last; ++i) {
        math::row_sum_of(
            n, [&](index_t j, T& x) { x = q[at(i, j)]; }, [&](index_t j, T& x) { x = v[j]; }, math::Fused{},
            row_sum[i]);
        math::inverse_row_sum_of<T>(row_sum[i], inv[i]);
      }
      for (index_t j = 0; j < n; ++j) {
        T lane[math::sum_lanes] = {};
        for (index_t i = first; i < last; ++i)
          lane[(i - first) % math::sum_lanes] = std::fma(q[at(i, j)], inv[i], lane[(i - first) % math::sum_lanes]);
        part[static_cast<std::size_t>(b * n + j)] = math::fold_lanes(lane) * v[j];
      }
    }
    double error_sum = 0;
    for (index_t j = 0; j < n; ++j) {
      colsum[j] = 0;
      for (index_t b = 0; b < blocks; ++b) colsum[j] += static_cast<double>(part[static_cast<std::size_t>(b * n + j)]);
      error_sum += math::column_error(colsum[j], target);
    }
    r.info.iterations = iterations;
    r.info.marginal_error = math::marginal_error(error_sum, m);
    if (math::stop(r.info.marginal_error, iterations, spec.sinkhorn)) break;
    for (index_t j = 0; j < n; ++j)
      g[j] = !math::takes_log_update<T>(colsum[j], false)
                 ? math::next_column_potential<T>(g[j], colsum[j], target)
                 : math::recovered_column_potential<T>(
                       m, [&](index_t i) { return static_cast<double>(k[at(i, j)]) + math::row_potential(top[i], row_sum[i]); },
                       target);
    absorb = false;
    for (index_t j = 0; j < n; ++j) {
      gt[j] = static_cast<T>(g[j]);
      absorb = absorb || math::absorbs(gt[j], h[j]);
    }
    if (absorb) h = gt;
    for (index_t j = 0; j < n; ++j) v[j] = math::scaling(gt[j], h[j]);
  }
  for (index_t i = 0; i < m; ++i)
    math::solved_row<T>(
        spec, n, [&](index_t j) { return q[at(i, j)]; }, [&](index_t j) { return k[at(i, j)]; }, v.data(), gt.data(),
        row_sum[i], &s[at(i, 0)], &r.experts[static_cast<std::size_t>(i * r.k)],
        &r.weights[static_cast<std::size_t>(i * r.k)], &r.plan[at(i, 0)]);
}

// The reference's outputs of the call policy makes for ctx, and its dL/dS for dL/dw = g.
template <class T, class Policy>
std::pair<test::Routed<T>, std::vector<T>> reference(const Policy& policy, const std::vector<T>& s, index_t m,
                                                     index_t n, const Context& ctx, const std::vector<T>& g) {
  const ssr::RouteSpec spec = policy.resolve(ctx);
  test::Routed<T> r(m, n, spec.k);
  r.info = ssr::initial_info(spec);
  if (spec.path == ssr::Path::sinkhorn) {
    reference_solve(spec, ctx, s, m, n, r);
    r.info.converged = ssr::math::converged(r.info.marginal_error, spec.sinkhorn);
  } else {
    for (index_t i = 0; i < m; ++i)
      ssr::math::softmax_row<T>(
          spec, ctx, &s[static_cast<std::size_t>(i * n)], i, n, &r.experts[static_cast<std::size_t>(i * r.k)],
          &r.weights[static_cast<std::size_t>(i * r.k)], &r.noise[static_cast<std::size_t>(i * n)]);
  }
  std::fill(r.load.begin(), r.load.end(), 0);
  for (const std::int32_t e : r.experts) ++r.load[static_cast<std::size_t>(e)];
  std::vector<T> grad(s.size(), T(0));
  if (r.info.weights == ssr::Weights::scores)
    for (index_t i = 0; i < m; ++i) {
      const std::int32_t* e = &r.experts[static_cast<std::size_t>(i * r.k)];
      const T *w = &r.weights[static_cast<std::size_t>(i * r.k)], *gi = &g[static_cast<std::size_t>(i * r.k)];
      const T* si = &s[static_cast<std::size_t>(i * n)];
      T* out = &grad[static_cast<std::size_t>(i * n)];
      ssr::math::backward_row(
          spec.select.score, static_cast<int>(r.k), [&](int c) { return w[c]; }, [&](int c) { return gi[c]; },
          [&](int c) { return si[e[c]]; }, [&](int c, double d) { out[e[c]] = static_cast<T>(d); });
    }
  return {std::move(r), std::move(grad)};
}

// Whether a and b hold the same bits, any NaN being equal to any NaN (its sign and payload are the
// hardware's, not the library's).
template <class T>
bool same_values(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t e = 0; e < a.size(); ++e)
    if (!(std::isnan(a[e]) && std::isnan(b[e])) && std::memcmp(&a[e], &b[e], sizeof(T)) != 0) return false;
  return true;
}

template <class T, class Policy>
void require_reference_bits(const Policy& policy, const std::vector<T>& s, index_t m, index_t n, const Context& ctx,
                            bool checked = true) {
  const ssr::RouteSpec spec = policy.resolve(ctx);
#if defined(SSR_TEST_CUDA)
  if (spec.path == ssr::Path::sinkhorn) return;
#endif
  const auto g = test::random_logits<T>(m, spec.k, 1.0, 5);
  const auto want = reference(policy, s, m, n, ctx, g);
  test::Router<Policy, T> router(policy);
  test::Routed<T> got(m, n, spec.k);
  typename test::Router<Policy, T>::options_type options{};
  options.check_finite = checked;
  got.info = router.route({s.data(), m, n}, ctx, got.outputs(), options);
  if (checked) {
    test::require_identical(want.first, got);
  } else {
    const test::Routed<T>& r = want.first;
    REQUIRE(got.experts == r.experts);
    REQUIRE(same_values(got.weights, r.weights));
    REQUIRE(same_values(got.plan, r.plan));
    REQUIRE(same_values(got.noise, r.noise));
    REQUIRE(got.load == r.load);
    REQUIRE(got.info.iterations == r.info.iterations);
    REQUIRE(got.info.converged == r.info.converged);
    REQUIRE(same_values(std::vector<double>{got.info.marginal_error}, std::vector<double>{r.info.marginal_error}));
  }
  std::vector<T> grad(s.size());
  router.backward(got.info,
                  {{s.data(), m, n},
                   {got.experts.data(), m, spec.k},
                   {got.weights.data(), m, spec.k},
                   {g.data(), m, spec.k},
                   {grad.data(), m, n}},
                  options);
  REQUIRE(same_values(grad, want.second));
}

}  // namespace

TEMPLATE_TEST_CASE("every backend gives the bits of the scalar reference built from ssr/math", "[reference]", float,
                   double) {
  using T = TestType;
  const index_t n = GENERATE(3, 16, 33);
  const index_t m = 601;  // several blocks of the column sums, a last partial tile
  const bool ties = GENERATE(false, true);
  auto s = test::random_logits<T>(m, n, 2.0, static_cast<unsigned>(n + 100), 3.0);
  if (ties)  // exact ties: every row's values on a coarse grid, and whole rows alike
    for (index_t e = 0; e < m * n; ++e)
      s[static_cast<std::size_t>(e)] = e < 8 * n ? T(0.5) : std::round(s[static_cast<std::size_t>(e)] * T(2)) / T(2);
  const Context ctx = Context::train(11, 3, 5);
  const ssr::Selection sigmoid{ssr::Score::sigmoid, 1, 1};
  INFO("n " << n << " ties " << ties);
  for (const Cost cost : {Cost::linear, Cost::softmax}) {
    for (const int k : {1, 2, 9}) {
      if (k > n) continue;
      INFO("cost " << ssr::to_string(cost) << " k " << k);
      require_reference_bits(ssr::SoftmaxTopK(k, cost), s, m, n, ctx);
      require_reference_bits(ssr::SoftmaxTopK(k, cost, sigmoid), s, m, n, ctx);
      require_reference_bits(ssr::NoisyCost<ssr::SoftmaxTopK>(ssr::SoftmaxTopK(k, cost), 0.4, 1.0), s, m, n, ctx);
      for (const double xi : {0.5, 0.05})
        for (const auto weights : {ssr::Weights::plan, ssr::Weights::scores}) {
          INFO("xi " << xi << " weights " << ssr::to_string(weights));
          const ssr::SinkhornTopK sinkhorn(k, cost, {xi, 1e-6, 60}, weights);
          require_reference_bits(sinkhorn, s, m, n, ctx);
          require_reference_bits(ssr::NoisyCost<ssr::SinkhornTopK>(sinkhorn, 0.3, 1.0), s, m, n, ctx);
          require_reference_bits(ssr::SinkhornTopK(k, cost, {xi, 1e-6, 60}, weights, sigmoid), s, m, n, ctx);
        }
    }
  }
}

// Non-finite logits are the caller's to keep out when it turns the scan off; where a caller lets them in,
// every backend still routes them as the reference does (a NaN ranks as -inf).
TEMPLATE_TEST_CASE("every backend routes unchecked non-finite logits as the scalar reference", "[reference]", float,
                   double) {
  using T = TestType;
  const index_t m = 67, n = GENERATE(5, 16);
  auto s = test::random_logits<T>(m, n, 2.0, static_cast<unsigned>(n + 7), 1.0);
  const T nan = std::numeric_limits<T>::quiet_NaN(), inf = std::numeric_limits<T>::infinity();
  s[static_cast<std::size_t>(3 * n + 1)] = nan;
  s[static_cast<std::size_t>(9 * n)] = inf;
  s[static_cast<std::size_t>(20 * n + 2)] = -inf;
  for (index_t j = 0; j < n; ++j) s[static_cast<std::size_t>(40 * n + j)] = nan;  // a whole row
  const Context ctx = Context::train(2, 1, 9);
  INFO("n " << n);
  for (const Cost cost : {Cost::linear, Cost::softmax}) {
    INFO("cost " << ssr::to_string(cost));
    require_reference_bits(ssr::SoftmaxTopK(2, cost), s, m, n, ctx, false);
    require_reference_bits(ssr::NoisyCost<ssr::SoftmaxTopK>(ssr::SoftmaxTopK(2, cost), 0.4, 1.0), s, m, n, ctx, false);
    for (const auto weights : {ssr::Weights::plan, ssr::Weights::scores})
      require_reference_bits(ssr::SinkhornTopK(2, cost, {0.5, 1e-6, 20}, weights), s, m, n, ctx, false);
  }
}

// Columns no token favours: their plan sums underflow, so the solve recovers their potentials in the log
// domain (math::recovered_column_potential's lanes): the same bits on every backend, with lanes of
// several rows (m = 601) and lanes without any (m = 100).
TEMPLATE_TEST_CASE("every backend gives the reference's bits where columns take the log-domain update", "[reference]",
                   float, double) {
  using T = TestType;
  const index_t n = GENERATE(3, 16), m = GENERATE(100, 601);
  auto s = test::random_logits<T>(m, n, 2.0, static_cast<unsigned>(n + m), 1.0);
  for (index_t i = 0; i < m; ++i) {  // the last expert trails each token's first by 1e4, the one before by 300
    s[static_cast<std::size_t>(i * n + n - 1)] = static_cast<T>(s[static_cast<std::size_t>(i * n)] - 1e4);
    if (n > 3) s[static_cast<std::size_t>(i * n + n - 2)] = static_cast<T>(s[static_cast<std::size_t>(i * n)] - 300);
  }
  const Context ctx = Context::train(4, 0, 1);
  INFO("n " << n << " m " << m);
  for (const int k : {1, 2})
    for (const double xi : {1.0, 0.05})
      for (const auto weights : {ssr::Weights::plan, ssr::Weights::scores}) {
        INFO("k " << k << " xi " << xi << " weights " << ssr::to_string(weights));
        require_reference_bits(ssr::SinkhornTopK(k, Cost::linear, {xi, 1e-6, 40}, weights), s, m, n, ctx);
      }
}
