// Bit-identical results across thread counts, repeated calls, caller alignment and row strides.
#include <catch2/catch.hpp>

#include <cstring>

#include "support.hpp"

using ssr::Context;
using ssr::Cost;
using ssr::index_t;

namespace {

template <class T>
void require_identical(const test::Routed<T>& a, const test::Routed<T>& b) {
  REQUIRE(a.experts == b.experts);
  REQUIRE(std::memcmp(a.weights.data(), b.weights.data(), a.weights.size() * sizeof(T)) == 0);
  REQUIRE(std::memcmp(a.plan.data(), b.plan.data(), a.plan.size() * sizeof(T)) == 0);
  REQUIRE(std::memcmp(a.noise.data(), b.noise.data(), a.noise.size() * sizeof(T)) == 0);
  REQUIRE(a.load == b.load);
  REQUIRE(a.info.iterations == b.info.iterations);
  REQUIRE(a.info.marginal_error == b.info.marginal_error);
}

}  // namespace

TEMPLATE_TEST_CASE("1, 2 and 3 threads give identical bits", "[determinism]", float, double) {
  const index_t m = 5003, n = GENERATE(8, 16, 100);
  const auto s = test::random_logits<TestType>(m, n, 2.0, 77, 3.0);
  const auto ssr_policy = ssr::make_ssr(2, Cost::softmax, 1.0, {0.1, 1e-6, 60}, 0.2, 1.0);
  const auto one = test::route(ssr_policy, s, m, n, Context::train(9, 1, 5), 1);
  REQUIRE(one.info.path == ssr::Path::sinkhorn);
  require_identical(one, test::route(ssr_policy, s, m, n, Context::train(9, 1, 5), 2));
  require_identical(one, test::route(ssr_policy, s, m, n, Context::train(9, 1, 5), 3));
  const ssr::NoisyCost<ssr::SoftmaxTopK> noisy(ssr::SoftmaxTopK(2), 1.0, 1.0);
  require_identical(test::route(noisy, s, m, n, Context::train(9), 1), test::route(noisy, s, m, n, Context::train(9), 3));
}

TEST_CASE("repeated calls reuse the workspace and give identical bits", "[determinism]") {
  const index_t m = 3000, n = 16, k = 2;
  const auto s = test::random_logits<float>(m, n, 1.0, 5);
  test::Router<ssr::SinkhornTopK, float> router{ssr::SinkhornTopK(k)};
  test::Routed<float> a(m, n, k), b(m, n, k);
  a.info = router.route({s.data(), m, n}, Context::train(0), a.outputs());
  const auto bytes = router.backend().held_workspace_bytes();
  CHECK(bytes > 0);
  b.info = router.route({s.data(), m, n}, Context::train(0), b.outputs());
  CHECK(router.backend().held_workspace_bytes() == bytes);
  b.noise = a.noise;
  require_identical(a, b);
  test::Routed<float> c(m / 2, n, k);  // a smaller call fits in the same workspace
  c.info = router.route({s.data(), m / 2, n}, Context::train(0), c.outputs());
  CHECK(router.backend().held_workspace_bytes() == bytes);
}

TEST_CASE("results do not depend on the alignment or row stride of the caller's buffers", "[determinism]") {
  const index_t m = 777, n = 16, stride = 21;
  const auto s = test::random_logits<float>(m, n, 1.0, 5);
  std::vector<float> strided(m * stride + 1, 1e30f);
  for (index_t i = 0; i < m; ++i)
    for (index_t j = 0; j < n; ++j) strided[1 + i * stride + j] = s[i * n + j];  // off by one float: misaligned
  const auto policy = ssr::make_ssr(2, Cost::linear, 1.0, {}, 0.1, 1.0);
  const auto a = test::route(policy, s, m, n, Context::train(1));
  test::Router<ssr::SSRPolicy, float> router(policy);
  test::Routed<float> b(m, n, 2);
  b.info = router.route({strided.data() + 1, m, n, stride}, Context::train(1), b.outputs());
  require_identical(a, b);
}
