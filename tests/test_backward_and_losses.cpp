// Gradients against central finite differences: routing weights, load-balancing loss, z-loss.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <vector>

#include "support.hpp"

using ssr::Context;
using ssr::index_t;

TEST_CASE("softmax top-k backward matches finite differences", "[backward]") {
  test::check_weights_gradient(ssr::SoftmaxTopK(2), Context::train(0));
}

TEST_CASE("noisy softmax top-k backward matches finite differences (noise is a constant)", "[backward]") {
  test::check_weights_gradient(ssr::NoisyCost<ssr::SoftmaxTopK>(ssr::SoftmaxTopK(2), 0.5, 1.0), Context::train(4));
}

TEST_CASE("Sinkhorn with score weights passes the softmax gradient", "[backward]") {
  test::check_weights_gradient(ssr::SinkhornTopK(2, ssr::Cost::linear, {0.5, 1e-10, 1000}, ssr::Weights::scores),
                         Context::train(0));
}

TEST_CASE("Sinkhorn with plan weights passes no gradient (stop-gradient)", "[backward]") {
  const index_t m = 20, n = 8, k = 2;
  const auto s = test::random_logits<float>(m, n, 1.0, 1);
  const auto g = test::random_logits<float>(m, k, 1.0, 2);
  test::Router<ssr::SinkhornTopK, float> router(ssr::SinkhornTopK(2));
  test::Routed<float> r(m, n, k);
  const auto info = router.route({s.data(), m, n}, Context::train(0), r.outputs());
  std::vector<float> grad(m * n, 5.0f);
  router.backward(info,
                  {{}, {r.experts.data(), m, k}, {r.weights.data(), m, k}, {g.data(), m, k}, {grad.data(), m, n}});
  CHECK(grad == std::vector<float>(m * n, 0.0f));
}

TEST_CASE("load-balancing loss and z-loss gradients match finite differences", "[losses]") {
  const index_t m = 30, n = 6, k = 2;
  auto s = test::random_logits<double>(m, n, 1.5, 41, 2.0);
  const auto r = test::route(ssr::SoftmaxTopK(k), s, m, n, Context::train(0));
  const ssr::ConstMatrixView<std::int32_t> experts(r.experts.data(), m, k);
  std::vector<double> lb_grad(m * n), z_grad(m * n);
  const double lb = ssr::load_balancing_loss<double>({s.data(), m, n}, experts, {lb_grad.data(), m, n});
  const double z = ssr::z_loss<double>({s.data(), m, n}, {z_grad.data(), m, n});
  CHECK(lb >= 1.0 - 1e-12);  // n * sum f_j P_j is 1 for a perfectly balanced router, more when skewed
  CHECK(z > 0);
  const ssr::ConstMatrixView<double> logits(s.data(), m, n);
  test::require_central_differences(s, lb_grad, [&] { return ssr::load_balancing_loss(logits, experts); }, 1e-8);
  test::require_central_differences(s, z_grad, [&] { return ssr::z_loss(logits); }, 1e-8);
}

TEST_CASE("the load-balancing loss is n * sum f_j P_j", "[losses]") {
  // Two tokens, two experts, k = 1, uniform logits: f = (1/2, 1/2), P = (1/2, 1/2), loss = 2 * 1/2 = 1.
  std::vector<float> s = {0, 0, 0, 0};
  std::vector<std::int32_t> e = {0, 1};
  CHECK(ssr::load_balancing_loss<float>({s.data(), 2, 2}, {e.data(), 2, 1}) == Approx(1.0));
  e = {0, 0};  // all to expert 0: f = (1, 0), loss = 2 * 1/2 = 1 still, since P is uniform
  CHECK(ssr::load_balancing_loss<float>({s.data(), 2, 2}, {e.data(), 2, 1}) == Approx(1.0));
  s = {3, 0, 3, 0};  // P_0 = e^3/(1+e^3)
  CHECK(ssr::load_balancing_loss<float>({s.data(), 2, 2}, {e.data(), 2, 1}) == Approx(2 * std::exp(3.0) / (1 + std::exp(3.0))));
  CHECK(ssr::z_loss<float>({s.data(), 2, 2}) == Approx(std::pow(std::log(1 + std::exp(3.0)), 2)));
}

TEMPLATE_TEST_CASE("backward of extreme gradients has no NaN: a zero weight passes zero", "[backward][numerics]", float,
                   double) {
  // One dominant logit gives weights (1, 0, 0, 0); dL/dw of +-max makes g - sum_r w_r g_r overflow, which
  // times a zero weight was a NaN (found by fuzz_route).
  using T = TestType;
  const index_t m = 3, n = 4, k = 4;
  const T big = std::numeric_limits<T>::max();
  std::vector<T> s = {0, 10, 30, big, 1, 2, 3, 4, -big, 0, 0, big};
  std::vector<T> g = {big, -big, big, -big, 1, -1, 2, -2, -big, -big, big, big};
  test::Router<ssr::SoftmaxTopK, T> router(ssr::SoftmaxTopK(static_cast<int>(k)));
  test::Routed<T> r(m, n, k);
  r.info = router.route({s.data(), m, n}, Context::train(0), r.outputs());
  std::vector<T> grad(static_cast<std::size_t>(m * n));
  router.backward(r.info,
                  {{}, {r.experts.data(), m, k}, {r.weights.data(), m, k}, {g.data(), m, k}, {grad.data(), m, n}});
  for (index_t i = 0; i < m; ++i) {
    for (index_t a = 0; a < k; ++a) {
      const T gs = grad[static_cast<std::size_t>(i * n + r.expert(i, a))];
      INFO("row " << i << " rank " << a << " weight " << r.weight(i, a) << " dL/dS " << gs);
      CHECK(!std::isnan(gs));
      if (r.weight(i, a) == 0) CHECK(gs == 0);
    }
  }
}

TEST_CASE("backward of gradients whose weighted sum overflows has no NaN", "[backward][numerics]") {
  // 17 equal weights fl(1/17) and one zero; dL/dw = DBL_MAX everywhere: sum_r w_r g_r, mathematically
  // DBL_MAX, rounded past it to inf, and the zero weight times inf was a NaN (found by fuzz_route).
  const index_t n = 18, k = 18;
  const double big = std::numeric_limits<double>::max();
  std::vector<double> s(n, 0.0), g(k, big);
  s[6] = -big;
  for (const ssr::Score score : {ssr::Score::softmax, ssr::Score::sigmoid}) {
    test::Router<ssr::SoftmaxTopK, double> router(ssr::SoftmaxTopK(static_cast<int>(k), ssr::Cost::linear, {score, 1, 1}));
    test::Routed<double> r(1, n, k);
    r.info = router.route({s.data(), 1, n}, Context::train(0), r.outputs());
    std::vector<double> grad(n);
    router.backward(
        r.info,
        {{s.data(), 1, n}, {r.experts.data(), 1, k}, {r.weights.data(), 1, k}, {g.data(), 1, k}, {grad.data(), 1, n}});
    for (index_t a = 0; a < k; ++a) {
      INFO(ssr::to_string(score) << " rank " << a << " weight " << r.weight(0, a) << " dL/dS " << grad[r.expert(0, a)]);
      CHECK(!std::isnan(grad[r.expert(0, a)]));
      if (r.weight(0, a) == 0) CHECK(grad[r.expert(0, a)] == 0);
    }
  }
}

TEMPLATE_TEST_CASE("backward adds the slots of a repeated expert, and gives NaN to a row naming an expert out of range",
                   "[backward]", float, double) {
  // Row 0 names expert 1 twice, each slot its own term (w = 1/2, 1/4, 1/4 for g = 1, 3, 4): dL/dS_1 adds
  // both slots' w (g - sum w g). Row 1 names expert 4 of 4, which an unchecked call leaves to the
  // backend: its row gets NaN and nothing outside the row is written. Row 3's zero weights with negative
  // dL/dw give w g - w dot = -0, written as such (bit identity with the row-by-row definition).
  using T = TestType;
  const index_t m = 4, n = 4, k = 3;
  std::vector<std::int32_t> e = {0, 1, 1, 2, 4, 0, 3, 2, 1, 0, 1, 2};
  std::vector<T> w = {0.5, 0.25, 0.25, 0.5, 0.25, 0.25, 0.5, 0.25, 0.25, 1, 0, 0};
  std::vector<T> g = {1, 3, 4, 1, 3, 4, 1, 3, 4, 1, -1, -1};
  using Router = test::Router<ssr::SoftmaxTopK, T>;
  Router router(ssr::SoftmaxTopK(static_cast<int>(k)));
  ssr::RouteInfo info;
  info.weights = ssr::Weights::scores;
  std::vector<T> grad(static_cast<std::size_t>(m * n), T(7));
  router.backward(info, {{}, {e.data(), m, k}, {w.data(), m, k}, {g.data(), m, k}, {grad.data(), m, n}},
                  typename Router::options_type{}.unchecked());
  const double dot = 0.5 * 1 + 0.25 * 3 + 0.25 * 4;
  CHECK(grad[0] == Approx(0.5 * (1 - dot)));
  CHECK(grad[1] == Approx(0.25 * (3 - dot) + 0.25 * (4 - dot)));
  CHECK(grad[2] == 0);
  CHECK(grad[3] == 0);
  for (index_t j = 0; j < n; ++j) CHECK(std::isnan(grad[static_cast<std::size_t>(n + j)]));
  CHECK(grad[8] == 0);
  CHECK(grad[9] == Approx(0.25 * (4 - dot)));
  CHECK(grad[10] == Approx(0.25 * (3 - dot)));
  CHECK(grad[11] == Approx(0.5 * (1 - dot)));
  CHECK(grad[12] == 0);
  CHECK((grad[13] == 0 && std::signbit(grad[13]) && grad[14] == 0 && std::signbit(grad[14])));
  CHECK(grad[15] == 0);
  CHECK_THROWS_WITH(router.backward(info, {{}, {e.data(), m, k}, {w.data(), m, k}, {g.data(), m, k}, {grad.data(), m, n}}),
                    Catch::Contains("experts(1, 1)"));
}
