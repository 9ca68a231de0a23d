// The README's usage example: one MoE block's routing with SSR-L over training steps.
#include <ssr/router.hpp>

#include <cstdint>
#include <cstdio>
#include <vector>

int main() {
  const ssr::index_t m = 1024, n = 16, k = 2;  // tokens, experts, experts per token
  std::vector<float> logits(m * n);            // S = X W_g^T, from your engine
  for (ssr::index_t i = 0; i < m * n; ++i) logits[i] = static_cast<float>((i * 7919) % 13) / 4.0f;

  // SSR-L with the paper's p = 1e-3: each training call takes the Sinkhorn path (xi = 0.5, plan weights)
  // with probability p, a coin drawn from (seed, layer, step); the other calls, and evaluation, softmax top-k.
  ssr::Router<ssr::SSRPolicy> router(ssr::make_ssr(k, ssr::Cost::linear, /*p=*/1e-3));
  std::vector<std::int32_t> experts(m * k), load(n);
  std::vector<float> weights(m * k);
  std::uint64_t sinkhorn_steps = 0;
  for (std::uint64_t step = 0; step < 2000; ++step) {  // one call a training step (here on the same logits)
    const ssr::RouteInfo info = router.route({logits.data(), m, n}, ssr::Context::train(step, /*layer=*/0),
                                             {{experts.data(), m, k}, {weights.data(), m, k}, {load.data(), n}});
    // info.path: the path this step took; on the Sinkhorn path info.iterations and info.marginal_error too.
    if (info.path == ssr::Path::sinkhorn) {
      ++sinkhorn_steps;
      std::printf("step %llu: path sinkhorn, %d iterations, column error %.2g\n", static_cast<unsigned long long>(step),
                  info.iterations, info.marginal_error);
    }
  }
  std::printf("%llu of 2000 training steps took the Sinkhorn path, the others softmax top-k\n",
              static_cast<unsigned long long>(sinkhorn_steps));
  return sinkhorn_steps > 0 ? 0 : 1;
}
