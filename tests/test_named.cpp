// Routers by name (ssr/named.hpp), and backward without a Router.
#include <catch2/catch.hpp>

#include "support.hpp"

using Catch::Matchers::Contains;
using ssr::Context;
using ssr::index_t;

TEST_CASE("a router by name routes as the policy it names", "[named]") {
  const index_t m = 500, n = 8;
  const auto s = test::random_logits<float>(m, n, 1.0, 4, 3.0);
  ssr::RouterConfig config;
  config.k = 3;
  config.cost = ssr::Cost::softmax;
  config.sinkhorn = {0.2, 1e-5, 80};
  config.weights = ssr::Weights::scores;
  config.noise_alpha = 0.1;
  config.noise_sigma = 2;
  const ssr::NoisyCost<ssr::SoftmaxTopK> softmax(ssr::SoftmaxTopK(3, ssr::Cost::softmax), 0.1, 2);
  const ssr::NoisyCost<ssr::SinkhornTopK> sinkhorn(ssr::SinkhornTopK(3, ssr::Cost::softmax, config.sinkhorn, config.weights), 0.1, 2);
  int rare = 0;
  for (std::uint64_t step = 4; step < 10; ++step) {  // coins 0.145, 0.011, 0.185, 0.218, 0.714, 0.499
    const Context ctx = Context::train(step, 2, 9);
    config.router = "softmax";
    CHECK(test::route(ssr::make_policy(config), s, m, n, ctx).weights == test::route(softmax, s, m, n, ctx).weights);
    config.router = "sinkhorn";
    CHECK(test::route(ssr::make_policy(config), s, m, n, ctx).weights == test::route(sinkhorn, s, m, n, ctx).weights);
    for (const char* name : {"ssr", "selective"}) {
      config.router = name;
      config.p = 0.5;
      const auto policy = ssr::make_policy(config);
      const auto r = test::route(policy, s, m, n, ctx);
      const auto expected = policy.rare_path(ctx) ? test::route(sinkhorn, s, m, n, ctx) : test::route(softmax, s, m, n, ctx);
      CHECK(r.weights == expected.weights);
      rare += policy.rare_path(ctx) ? 1 : 0;
    }
  }
  REQUIRE(rare > 0);  // the selective routers took both paths over these steps
  REQUIRE(rare < 12);
}

TEST_CASE("a bad name or value is named in the error", "[named][errors]") {
  ssr::RouterConfig config;
  config.router = "sinkorn";
  CHECK_THROWS_WITH(ssr::make_policy(config), Contains("router = sinkorn"));
  config.router = "sinkhorn";
  config.p = 2;  // checked whatever the router: a typo there is still a mistake
  CHECK_THROWS_WITH(ssr::make_policy(config), Contains("p = 2"));
  config.p = 0.5;
  config.sinkhorn.xi = 0;
  CHECK_THROWS_WITH(ssr::make_policy(config), Contains("xi = 0"));
  CHECK_THROWS_WITH(ssr::parse_cost("quadratic"), Contains("cost = quadratic"));
  CHECK_THROWS_WITH(ssr::parse_weights("plans"), Contains("weights = plans"));
  CHECK(ssr::parse_cost("softmax") == ssr::Cost::softmax);
  CHECK(ssr::parse_weights("scores") == ssr::Weights::scores);
}

TEST_CASE("backward needs only the backend and the RouteInfo", "[named][backward]") {
  const index_t m = 50, n = 8, k = 2;
  const auto s = test::random_logits<double>(m, n, 1.0, 5);
  const auto g = test::random_logits<double>(m, k, 1.0, 6);
  ssr::Router<ssr::SoftmaxTopK, ssr::CpuBackend<double>> router(ssr::SoftmaxTopK(2));
  test::Routed<double> r(m, n, k);
  const auto info = router.route({s.data(), m, n}, Context::train(0), r.outputs());
  std::vector<double> a(m * n), b(m * n);
  router.backward(info, {{}, {r.experts.data(), m, k}, {r.weights.data(), m, k}, {g.data(), m, k}, {a.data(), m, n}});
  ssr::CpuBackend<double> backend;  // a fresh backend: nothing of the router is needed
  ssr::backward(backend, info,
                {{}, {r.experts.data(), m, k}, {r.weights.data(), m, k}, {g.data(), m, k}, {b.data(), m, n}});
  CHECK(a == b);
  CHECK_THROWS_WITH(
      ssr::backward(backend, info,
                    {{}, {r.experts.data(), m, k}, {r.weights.data(), m, k}, {g.data(), m, k}, {b.data(), m - 1, n}}),
      Contains("grad_logits has shape 49x8, expected 50x8"));
}
