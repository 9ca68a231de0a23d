// Noise on the cost (Proposition 3's selection probabilities) and the selective coin.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "reference.hpp"
#include "ssr/math/noise.hpp"
#include "support.hpp"

using ssr::Context;
using ssr::Cost;
using ssr::index_t;
using ssr::NoisyCost;
using ssr::SinkhornTopK;
using ssr::SoftmaxTopK;

namespace {

double normal_cdf(double x) { return 0.5 * std::erfc(-x / std::sqrt(2.0)); }

// P(expert j has the largest c_l + s * eps_l), eps i.i.d. N(0, 1):
// the integral over z of phi(z) prod_{l != j} Phi(z + (c_j - c_l) / s), by the trapezoid rule.
double top1_probability(const std::vector<double>& c, std::size_t j, double s) {
  const double h = 1e-3;
  double total = 0;
  for (double z = -12; z <= 12; z += h) {
    double prod = std::exp(-0.5 * z * z) / std::sqrt(2 * M_PI);
    for (std::size_t l = 0; l < c.size(); ++l)
      if (l != j) prod *= normal_cdf(z + (c[j] - c[l]) / s);
    total += prod * h;
  }
  return total;
}

// A route that took the Sinkhorn path with a finite column error, each of its m rows' k weights finite and
// summing to 1.
template <class T>
void require_finite_sinkhorn_route(const test::Routed<T>& out, index_t m, int k) {
  REQUIRE(out.info.path == ssr::Path::sinkhorn);
  CHECK(std::isfinite(out.info.marginal_error));
  for (index_t i = 0; i < m; ++i) {
    double sum = 0;
    for (index_t r = 0; r < k; ++r) {
      REQUIRE(std::isfinite(out.weight(i, r)));
      sum += static_cast<double>(out.weight(i, r));
    }
    CHECK(sum == Approx(1.0).epsilon(1e-3));
  }
}

// Every noise output finite, within the cost's clamp (ssr::math::cost_bound), some of it at the bound.
template <class T>
void require_noise_within_cost_bound(const test::Routed<T>& out) {
  const auto bound = static_cast<T>(ssr::math::cost_bound<T>());
  bool at_bound = false;
  for (const T z : out.noise) {
    REQUIRE((std::isfinite(z) && std::abs(z) <= bound));
    at_bound = at_bound || std::abs(z) == bound;
  }
  CHECK(at_bound);
}

}  // namespace

TEST_CASE("top-1 frequencies under noise match Proposition 3", "[noise]") {
  const std::vector<double> c = {0.3, 0.0, -0.2, 0.5, 0.45};
  const index_t m = 200000, n = static_cast<index_t>(c.size());
  std::vector<double> s(m * n);
  for (index_t i = 0; i < m; ++i)
    for (index_t j = 0; j < n; ++j) s[i * n + j] = c[j];
  const double alpha = 0.4, sigma = 0.75;
  const auto r = test::route(NoisyCost<SoftmaxTopK>(SoftmaxTopK(1), alpha, sigma), s, m, n, Context::train(17, 2, 99));
  for (index_t j = 0; j < n; ++j) {
    const double expected = top1_probability(c, j, alpha * sigma);
    const double observed = static_cast<double>(r.load[j]) / static_cast<double>(m);
    const double sd = std::sqrt(expected * (1 - expected) / static_cast<double>(m));
    INFO("expert " << j << " expected " << expected << " observed " << observed);
    CHECK(std::abs(observed - expected) < 5 * sd);
  }
  // Two experts: the closed form Phi((c_1 - c_2) / (sqrt 2 alpha sigma)).
  CHECK(top1_probability({0.3, 0.0}, 0, alpha * sigma) == Approx(normal_cdf(0.3 / (std::sqrt(2.0) * alpha * sigma))).epsilon(1e-6));
}

TEST_CASE("the dumped noise is alpha times N(0, sigma^2), independent across elements", "[noise]") {
  const index_t m = 20000, n = 16;
  const double alpha = 0.3, sigma = 2.0;
  const auto s = test::random_logits<double>(m, n, 1.0, 1);
  const auto r = test::route(NoisyCost<SoftmaxTopK>(SoftmaxTopK(2), alpha, sigma), s, m, n, Context::train(5));
  double sum = 0, sq = 0, lag = 0;
  for (index_t e = 0; e < m * n; ++e) {
    sum += r.noise[e];
    sq += r.noise[e] * r.noise[e];
    if (e > 0) lag += r.noise[e] * r.noise[e - 1];
  }
  const double count = static_cast<double>(m * n), var = alpha * alpha * sigma * sigma;
  CHECK(std::abs(sum / count) < 5 * std::sqrt(var / count));
  CHECK(std::abs(sq / count - var) < 5 * var * std::sqrt(2 / count));
  CHECK(std::abs(lag / count) < 5 * var / std::sqrt(count));
}

TEST_CASE("noise streams depend on seed, layer and step, and only on them", "[noise]") {
  const index_t m = 100, n = 8;
  const auto s = test::random_logits<float>(m, n, 1.0, 1);
  const NoisyCost<SoftmaxTopK> policy(SoftmaxTopK(2), 1.0, 1.0);
  const auto base = test::route(policy, s, m, n, Context::train(1, 2, 3));
  CHECK(test::route(policy, s, m, n, Context::train(1, 2, 3)).noise == base.noise);
  CHECK(test::route(policy, s, m, n, Context::train(2, 2, 3)).noise != base.noise);
  CHECK(test::route(policy, s, m, n, Context::train(1, 3, 3)).noise != base.noise);
  CHECK(test::route(policy, s, m, n, Context::train(1, 2, 4)).noise != base.noise);
}

TEST_CASE("a row's noise read in order, backwards or again gives each element's noise_value bits", "[noise]") {
  ssr::RouteSpec spec;
  spec.noise_alpha = 0.7;
  spec.noise_sigma = 1.3;
  const Context ctx = Context::train(5, 2, 9).at_row(1001);
  for (const ssr::index_t n : {1, 3, 8, 17}) {
    for (const ssr::index_t row : {0, 1, 6}) {
      const ssr::math::RowNoise z(spec, ctx, row, n);
      std::vector<double> forwards, backwards;
      for (ssr::index_t j = 0; j < n; ++j) forwards.push_back(z(j));
      for (ssr::index_t j = n; j-- > 0;) backwards.push_back(z(j));
      for (ssr::index_t j = 0; j < n; ++j) {
        const double expected = ssr::math::noise_value(spec, ctx, row, n, j);
        INFO("n " << n << " row " << row << " j " << j);
        CHECK(forwards[static_cast<std::size_t>(j)] == expected);
        CHECK(backwards[static_cast<std::size_t>(n - 1 - j)] == expected);
      }
    }
  }
}

TEST_CASE("the selective policy takes the Sinkhorn path with frequency p", "[selective]") {
  const double p = GENERATE(0.0, 0.01, 0.2, 1.0);
  const auto policy = ssr::make_ssr(2, Cost::linear, p);
  test::Router<ssr::SSRPolicy, float> router(policy);
  const int steps = 40000;
  int rare = 0;
  for (int step = 0; step < steps; ++step) rare += router.resolve(Context::train(step, 1, 7)).path == ssr::Path::sinkhorn;
  const double sd = std::sqrt(p * (1 - p) / steps);
  INFO("p " << p << " observed " << double(rare) / steps);
  CHECK(std::abs(double(rare) / steps - p) <= 5 * sd);
  // Routing a call agrees with the resolved path.
  const auto s = test::random_logits<float>(64, 8, 1.0, 2);
  for (int step = 0; step < 50; ++step) {
    const auto r = test::route(policy, s, 64, 8, Context::train(step, 1, 7));
    REQUIRE(r.info.path == router.resolve(Context::train(step, 1, 7)).path);
  }
}

TEST_CASE("layers draw independent coins", "[selective]") {
  const auto policy = ssr::make_ssr(2, Cost::linear, 0.5);
  int both = 0;
  const int steps = 20000;
  for (int step = 0; step < steps; ++step)
    both += policy.rare_path(Context::train(step, 0)) && policy.rare_path(Context::train(step, 1));
  CHECK(std::abs(double(both) / steps - 0.25) < 5 * std::sqrt(0.25 * 0.75 / steps));
}

TEST_CASE("evaluation ignores seed, noise and p", "[selective][noise]") {
  const index_t m = 300, n = 16;
  const auto s = test::random_logits<float>(m, n, 1.0, 6, 3.0);
  const auto plain = test::route(SoftmaxTopK(2), s, m, n, Context::eval());
  for (std::uint32_t seed : {0u, 1u, 12345u}) {
    Context ctx = Context::eval();
    ctx.seed = seed;
    ctx.step = seed * 7;
    const auto r = test::route(ssr::make_ssr(2, Cost::softmax, 1.0, {}, 5.0, 1.0), s, m, n, ctx);
    CHECK(r.info.path == ssr::Path::softmax);
    CHECK(r.experts == plain.experts);
    CHECK(r.weights == plain.weights);
    CHECK(r.noise == std::vector<float>(m * n, 0.0f));
  }
}

TEMPLATE_TEST_CASE("extreme logits under a huge noise amplitude route without NaN", "[noise][numerics]", float, double) {
  // The logits +-max beside tiny and denormal ones make a shifted cost of -inf; a noise amplitude near
  // the type's maximum makes alpha * eps infinite. Each is clamped before they meet (found by fuzz_route).
  using T = TestType;
  const index_t m = 37, n = 34;
  std::vector<T> s(static_cast<std::size_t>(m * n), T(0));
  s[0] = std::numeric_limits<T>::denorm_min();
  s[2] = -std::numeric_limits<T>::max();
  s[3] = std::numeric_limits<T>::max();
  const double alpha = 0.5 * static_cast<double>(std::numeric_limits<T>::max());
  for (const int k : {2, 32}) {
    for (const double xi : {0.5, 1e30}) {
      const auto out = test::route(ssr::make_ssr(k, Cost::linear, 1.0, {xi, 0.5, 110}, alpha, 10.0), s, m, n,
                                   Context::train(2460215669ULL, 3654863366U, 960799413U));
      INFO("k " << k << " xi " << xi);
      require_finite_sinkhorn_route(out, m, k);
      require_noise_within_cost_bound(out);
    }
    // The softmax path (p = 0) writes the same noise, clamped as the cost clamps it.
    const auto soft = test::route(ssr::make_ssr(k, Cost::linear, 0.0, {}, alpha, 10.0), s, m, n,
                                  Context::train(2460215669ULL, 3654863366U, 960799413U));
    require_noise_within_cost_bound(soft);
    for (const T w : soft.weights) CHECK(std::isfinite(w));
  }
}

TEMPLATE_TEST_CASE("a softmax cost under noise far above the costs routes without NaN", "[noise][numerics]", float,
                   double) {
  // Noise of amplitude 1e3 and more puts every real cost of a row far below the softmax cost's range; the
  // rows of 34 experts do not fill whole vectors, so nothing of a row's padding may become its maximum
  // (found by fuzz_route: fuzz/regressions/route/nan-from-padding-maximum-under-noise).
  using T = TestType;
  const index_t m = 37, n = 34;
  const auto s = test::random_logits<T>(m, n, 2.0, 5);
  for (const double alpha : {1e3, 1e6}) {
    for (const int k : {1, 2, 8}) {
      const auto out = test::route(ssr::make_ssr(k, Cost::softmax, 1.0, {0.5, 1e-4, 100}, alpha, 1.0), s, m, n,
                                   Context::train(3, 1, 11));
      INFO("alpha " << alpha << " k " << k);
      require_finite_sinkhorn_route(out, m, k);
    }
  }
}

TEST_CASE("the stream is Random123's Philox4x32-10, and its first normals are pinned", "[noise]") {
  // Random123's known-answer vectors (kat_vectors: philox4x32, 10 rounds).
  const auto philox = [](r123::Philox4x32::ctr_type c, r123::Philox4x32::key_type k) { return r123::Philox4x32()(c, k); };
  CHECK(philox({{0, 0, 0, 0}}, {{0, 0}}) == r123::Philox4x32::ctr_type{{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}});
  CHECK(philox({{~0u, ~0u, ~0u, ~0u}}, {{~0u, ~0u}}) ==
        r123::Philox4x32::ctr_type{{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}});
  CHECK(philox({{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}}, {{0xa4093822, 0x299f31d0}}) ==
        r123::Philox4x32::ctr_type{{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}});
  // The library's words: key (seed, layer), counter (block lo, block hi, step lo, step hi).
  for (const std::uint64_t block : {std::uint64_t{0}, std::uint64_t{5}, std::uint64_t{0x1234567890ull}})
    CHECK(ssr::random::draw(11, 3, block, 0x99999999aull) ==
          philox({{static_cast<std::uint32_t>(block), static_cast<std::uint32_t>(block >> 32), 0x9999999au, 0x9u}},
                 {{11, 3}}));
  // The noise of a call: rows 1000 to 1002 of (seed 2026, layer 7, step 0x123456789abc), 5 experts, as
  // computed when the layout was fixed (elements 5000 to 5014 of the stream: blocks straddle rows).
  const index_t m = 3, n = 5;
  const double pinned[] = {-1.4545088213373469,  0.20749157154742609,  -0.84313255873823956, -1.0672859862581456,
                           -0.41216476113275585, 0.66680021264870504,  -0.89217248623849765, -0.027530830479751307,
                           0.5678595307112837,   0.62794696002013317,  1.6436591468708279,   -1.1780789531017657,
                           -1.1080256284059402,  -0.60123871367616188, -2.4690893141398917};
  const std::vector<double> s(m * n, 0.0);
  const auto r = test::route(NoisyCost<SoftmaxTopK>(SoftmaxTopK(2), 1.0, 1.0), s, m, n,
                             Context::train(0x123456789abcull, 7, 2026).at_row(1000));
  for (index_t e = 0; e < m * n; ++e) {
    INFO("element " << e);
    CHECK(r.noise[e] == pinned[e]);
    CHECK(r.noise[e] == Approx(test::reference_normal(2026, 7, 0x123456789abcull, 5000 + e)).epsilon(1e-13));
  }
}

TEMPLATE_TEST_CASE("the noise is alpha times sigma times the stream's Box-Muller normals", "[noise]", float, double) {
  // Element (i, j) of a call is number (first_row + i) n + j of its stream, on both paths; n = 13 makes
  // blocks of four straddle rows. Against Random123's words and a Box-Muller pair in long double.
  using T = TestType;
  const index_t m = 301;
  const index_t n = GENERATE(8, 13);
  const double alpha = 0.3, sigma = 1.7;
  const auto s = test::random_logits<T>(m, n, 1.0, 8);
  const Context ctx = Context::train(77, 5, 123).at_row(4000);
  const auto soft = test::route(NoisyCost<SoftmaxTopK>(SoftmaxTopK(2), alpha, sigma), s, m, n, ctx);
  const auto sink = test::route(NoisyCost<SinkhornTopK>(SinkhornTopK(2), alpha, sigma), s, m, n, ctx);
  const double ulps = std::is_same<T, float>::value ? 1e-6 : 1e-13;
  for (index_t i = 0; i < m; ++i)
    for (index_t j = 0; j < n; ++j) {
      const double z = alpha * sigma * test::reference_normal(123, 5, 77, static_cast<std::uint64_t>((4000 + i) * n + j));
      INFO("n " << n << " element (" << i << ", " << j << ")");
      REQUIRE(static_cast<double>(soft.noise[i * n + j]) == Approx(z).epsilon(ulps).margin(1e-300));
      REQUIRE(static_cast<double>(sink.noise[i * n + j]) == Approx(z).epsilon(ulps).margin(1e-300));
    }
}

TEST_CASE("noisy softmax top-k ranks c(S) plus the noise and weighs the clean logits", "[noise]") {
  const index_t m = 500, n = 16;
  const auto cost = GENERATE(Cost::linear, Cost::softmax);
  const int k = GENERATE(1, 3);
  const auto s = test::random_logits<double>(m, n, 1.0, 12, 2.0);
  const auto r = test::route(NoisyCost<SoftmaxTopK>(SoftmaxTopK(k, cost), 0.4, 1.0), s, m, n, Context::train(3, 1, 8));
  const auto c = test::reference_costs(s, m, n, cost);
  for (index_t i = 0; i < m; ++i) {
    std::vector<double> noisy(n);
    for (index_t j = 0; j < n; ++j) noisy[j] = c[i * n + j] + r.noise[i * n + j];
    std::vector<int> order(n);
    for (index_t j = 0; j < n; ++j) order[j] = static_cast<int>(j);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return noisy[a] > noisy[b]; });
    double top = -INFINITY, z = 0;
    for (int t = 0; t < k; ++t) top = std::max(top, s[i * n + order[t]]);
    for (int t = 0; t < k; ++t) z += std::exp(s[i * n + order[t]] - top);
    INFO("cost " << ssr::to_string(cost) << " k " << k << " row " << i);
    for (int t = 0; t < k; ++t) {
      REQUIRE(r.expert(i, t) == order[t]);
      REQUIRE(r.weight(i, t) == Approx(std::exp(s[i * n + order[t]] - top) / z).epsilon(1e-14));
    }
  }
}

TEST_CASE("noisy Sinkhorn solves the problem of c(S) plus the noise", "[noise][sinkhorn]") {
  const index_t m = 400, n = 8;
  const auto cost = GENERATE(Cost::linear, Cost::softmax);
  const double xi = GENERATE(0.5, 0.1);
  const auto s = test::random_logits<double>(m, n, 1.0, 14, 2.0);
  const double tol = 1e-11;
  const auto r = test::route(NoisyCost<SinkhornTopK>(SinkhornTopK(2, cost, {xi, tol, 100000}), 0.5, 1.0), s, m, n,
                             Context::train(6, 2, 1));
  REQUIRE(r.info.converged);
  auto c = test::reference_costs(s, m, n, cost);
  for (std::size_t e = 0; e < c.size(); ++e) c[e] += r.noise[e];
  const auto ref = test::reference_sinkhorn(c, m, n, xi, tol, 100000);
  double worst = 0;
  for (std::size_t e = 0; e < c.size(); ++e) worst = std::max(worst, std::abs(ref.plan[e] - r.plan[e]));
  INFO("cost " << ssr::to_string(cost) << " xi " << xi);
  CHECK(worst < 1e-9);
}
