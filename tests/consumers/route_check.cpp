// A consumer's program: route a skewed batch with SSR's Sinkhorn step and check the result.
#include <ssr/router.hpp>
#ifdef SSR_CONSUMER_XTENSOR
#include <ssr/xtensor.hpp>
#include <xtensor/xtensor.hpp>
#endif

#include <cmath>
#include <cstdio>
#include <vector>

int main() {
  const ssr::index_t m = 512, n = 8, k = 2;
  std::vector<float> logits(m * n);
  for (ssr::index_t i = 0; i < m; ++i)
    for (ssr::index_t j = 0; j < n; ++j) logits[i * n + j] = static_cast<float>((i * 31 + j * 17) % 11) / 5.0f - 0.5f * static_cast<float>(j);
  ssr::Router<ssr::SSRPolicy> router(ssr::make_ssr(k, ssr::Cost::linear, 1.0));
  std::vector<std::int32_t> experts(m * k), load(n);
  std::vector<float> weights(m * k);
#ifdef SSR_CONSUMER_XTENSOR
  xt::xtensor<float, 2> x({std::size_t(m), std::size_t(n)});
  std::copy(logits.begin(), logits.end(), x.begin());
  const auto in = ssr::view(x);
#else
  const ssr::ConstMatrixView<float> in(logits.data(), m, n);
#endif
  const auto info = router.route(in, ssr::Context::train(0), {{experts.data(), m, k}, {weights.data(), m, k}, {load.data(), n}});
  const auto stats = ssr::load_stats({load.data(), n});
  for (ssr::index_t i = 0; i < m; ++i)
    if (std::abs(weights[i * k] + weights[i * k + 1] - 1.0f) > 1e-5f) return std::puts("weights do not sum to 1"), 1;
  if (info.path != ssr::Path::sinkhorn || !info.converged || stats.max_over_mean > 1.5)
    return std::printf("unbalanced: max/mean %g\n", stats.max_over_mean), 1;
  std::printf("routed %ld tokens: %d iterations, max/mean load %.3f\n", static_cast<long>(m), info.iterations, stats.max_over_mean);
  return 0;
}
