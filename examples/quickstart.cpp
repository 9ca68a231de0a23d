// The README's usage example: one MoE block's routing with SSR-L.
#include <ssr/router.hpp>

#include <cstdio>
#include <vector>

int main() {
  const ssr::index_t m = 1024, n = 16, k = 2;  // tokens, experts, experts per token
  std::vector<float> logits(m * n);            // S = X W_g^T, from your engine
  for (ssr::index_t i = 0; i < m * n; ++i) logits[i] = static_cast<float>((i * 7919) % 13) / 4.0f;

  // Sinkhorn (xi = 0.5, plan weights) on a fraction p of training steps, softmax top-k otherwise.
  ssr::Router<ssr::SSRPolicy> router(ssr::make_ssr(k, ssr::Cost::linear, /*p=*/1.0));
  std::vector<std::int32_t> experts(m * k), load(n);
  std::vector<float> weights(m * k);
  const ssr::RouteInfo info = router.route({logits.data(), m, n}, ssr::Context::train(/*step=*/0, /*layer=*/0),
                                           {{experts.data(), m, k}, {weights.data(), m, k}, {load.data(), n}});
  std::printf("path %s, %d iterations, column error %.2g\n", ssr::to_string(info.path), info.iterations,
              info.marginal_error);
}
