// Bit-identical results across thread counts, caller alignment and row strides (repeated calls: test_workspace).
#include <catch2/catch.hpp>

#include "support.hpp"

using ssr::Context;
using ssr::Cost;
using ssr::index_t;

TEMPLATE_TEST_CASE("1, 2 and 3 threads give identical bits", "[determinism]", float, double) {
  // Large enough that every path takes a team (CpuTuning), with a last, partial tile of rows. At n = 100 one
  // thread walks the Sinkhorn passes forward only, two or three walk their shares forward and backward in
  // turn (CpuTuning::alternate_max_bytes), and at n = 8 and 16 all do.
  const index_t m = 20011, n = GENERATE(8, 16, 100);
  const auto s = test::random_logits<TestType>(m, n, 2.0, 77, 3.0);
  const auto ssr_policy = ssr::make_ssr(2, Cost::softmax, 1.0, {0.1, 1e-6, 60}, 0.2, 1.0);
  const auto one = test::route(ssr_policy, s, m, n, Context::train(9, 1, 5), 1);
  REQUIRE(one.info.path == ssr::Path::sinkhorn);
  test::require_identical(one, test::route(ssr_policy, s, m, n, Context::train(9, 1, 5), 2));
  test::require_identical(one, test::route(ssr_policy, s, m, n, Context::train(9, 1, 5), 3));
  const ssr::SoftmaxTopK plain(2);
  test::require_identical(test::route(plain, s, m, n, Context::train(9), 1), test::route(plain, s, m, n, Context::train(9), 3));
  const ssr::NoisyCost<ssr::SoftmaxTopK> noisy(ssr::SoftmaxTopK(2), 1.0, 1.0);
  test::require_identical(test::route(noisy, s, m, n, Context::train(9), 1), test::route(noisy, s, m, n, Context::train(9), 3));
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
  test::require_identical(a, b);
}
