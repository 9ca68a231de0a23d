// The bits of CPU Sinkhorn routes that take the solver's rare paths, as one hash a case: built at two
// revisions, `diff` of the two outputs says whether a change kept every bit. The cases: float logits, the
// linear cost, xi 0.5 and 1 (the float kernel); logit scales up to 1e4 (rows whose chosen experts' Q
// underflows, absorption) and a column every token disfavours by 1e4 (the log-domain column update);
// one and two threads; then the softmax cost (its float kernel) at xi 0.5 and 0.3; both costs also at xi
// 0.2, 0.1 and 0.05 (subnormal products in the pass, many rows below the underflow threshold, the linear
// kernel in double). Each hash covers the experts, weights and plan, the tiles' top-k path (no plan asked),
// the same with softmax score weights, the iterations and the error. Then noisy routes
// (NoisyCost over softmax top-k and over Sinkhorn top-k with plan and with softmax score weights; both costs, xi 0.5
// and 0.3): experts, weights, the noise output and, for Sinkhorn, the plan, on one and two threads.
#include <ssr/router.hpp>

#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

namespace {

// FNV-1a over the bytes of v, continuing from h.
template <class V>
std::uint64_t hash(std::uint64_t h, const std::vector<V>& v) {
  const auto* c = reinterpret_cast<const unsigned char*>(v.data());
  for (std::size_t e = 0; e < v.size() * sizeof(V); ++e) h = (h ^ c[e]) * 1099511628211ull;
  return h;
}

}  // namespace

int main() {
  const ssr::index_t m = 9000, k = 2;
  for (const ssr::Cost cost : {ssr::Cost::linear, ssr::Cost::softmax})
    for (const ssr::index_t n : {4, 8, 16, 20, 128})
      for (const double scale : {1.0, 1e2, 1e4})
        for (const double xi : {0.5, cost == ssr::Cost::linear ? 1.0 : 0.3, 0.2, 0.1, 0.05})
          for (const bool disfavoured : {false, true})
            for (const int threads : {1, 2}) {
              if (cost == ssr::Cost::softmax && scale > 1e3) continue;
              std::mt19937_64 gen(static_cast<std::uint64_t>(n * 7 + disfavoured));
              std::normal_distribution<double> z;
              std::vector<float> s(static_cast<std::size_t>(m * n));
              for (std::size_t e = 0; e < s.size(); ++e)
                s[e] = static_cast<float>(scale * z(gen) - 2.0 * static_cast<double>(e % n) / static_cast<double>(n));
              if (disfavoured)
                for (ssr::index_t i = 0; i < m; ++i) s[i * n + n - 1] = s[i * n] - 1e4f;
              std::vector<std::int32_t> experts(m * k), tiles_experts(m * k);
              std::vector<float> weights(m * k), tiles_weights(m * k), plan(m * n);
              ssr::Router<ssr::SinkhornTopK, ssr::CpuBackend<float>> router(ssr::SinkhornTopK(k, cost, {xi, 1e-6, 100}),
                                                                            ssr::CpuBackend<float>(threads));
              const auto info = router.route({s.data(), m, n}, ssr::Context::train(0),
                                             {{experts.data(), m, k}, {weights.data(), m, k}, {}, {plan.data(), m, n}});
              router.route({s.data(), m, n}, ssr::Context::train(0),
                           {{tiles_experts.data(), m, k}, {tiles_weights.data(), m, k}});
              ssr::Router<ssr::SinkhornTopK, ssr::CpuBackend<float>> scores(
                  ssr::SinkhornTopK(k, cost, {xi, 1e-6, 100}, ssr::Weights::scores), ssr::CpuBackend<float>(threads));
              std::vector<std::int32_t> score_experts(m * k);
              std::vector<float> score_weights(m * k);
              scores.route({s.data(), m, n}, ssr::Context::train(0),
                           {{score_experts.data(), m, k}, {score_weights.data(), m, k}});
              std::uint64_t h = 1469598103934665603ull;
              h = hash(hash(hash(hash(hash(h, experts), weights), plan), tiles_experts), tiles_weights);
              h = hash(hash(h, score_experts), score_weights);
              h = hash(h, std::vector<double>{static_cast<double>(info.iterations), info.marginal_error});
              std::printf("%sn %3lld scale %5g xi %3g disfavoured %d threads %d: %3d iterations, hash %016llx\n",
                          cost == ssr::Cost::linear ? "" : "softmax cost ", static_cast<long long>(n), scale, xi,
                          disfavoured ? 1 : 0, threads, info.iterations, static_cast<unsigned long long>(h));
            }
  const ssr::index_t rows = 3001;  // a partial last tile
  for (const ssr::index_t n : {4, 8, 16, 20, 128})
    for (const ssr::Cost cost : {ssr::Cost::linear, ssr::Cost::softmax})
      for (const int policy : {0, 1, 2})  // softmax top-k; Sinkhorn with plan weights, with score weights
        for (const double xi : {0.5, 0.3})
          for (const int threads : {1, 2}) {
            if (policy == 0 && xi != 0.5) continue;  // no xi
            std::mt19937_64 gen(static_cast<std::uint64_t>(n * 11 + policy));
            std::normal_distribution<double> z;
            std::vector<float> s(static_cast<std::size_t>(rows * n));
            for (auto& e : s) e = static_cast<float>(3.0 * z(gen));
            std::vector<std::int32_t> experts(rows * k), tiles_experts(rows * k);
            std::vector<float> weights(rows * k), tiles_weights(rows * k), plan(rows * n), noise(rows * n);
            const ssr::Weights form = policy == 1 ? ssr::Weights::plan : ssr::Weights::scores;
            const ssr::Context ctx = ssr::Context::train(12345, 3, 7);
            ssr::RouteInfo info;
            if (policy == 0) {
              ssr::Router<ssr::NoisyCost<ssr::SoftmaxTopK>, ssr::CpuBackend<float>> router(
                  ssr::NoisyCost<ssr::SoftmaxTopK>(ssr::SoftmaxTopK(k, cost), 0.8, 1.0),
                  ssr::CpuBackend<float>(threads));
              router.route({s.data(), rows, n}, ctx,
                           {{experts.data(), rows, k}, {weights.data(), rows, k}, {}, {}, {noise.data(), rows, n}});
              router.route({s.data(), rows, n}, ctx,
                           {{tiles_experts.data(), rows, k}, {tiles_weights.data(), rows, k}});
            } else {
              ssr::Router<ssr::NoisyCost<ssr::SinkhornTopK>, ssr::CpuBackend<float>> router(
                  ssr::NoisyCost<ssr::SinkhornTopK>(ssr::SinkhornTopK(k, cost, {xi, 1e-6, 100}, form), 0.8, 1.0),
                  ssr::CpuBackend<float>(threads));
              info = router.route({s.data(), rows, n}, ctx,
                                  {{experts.data(), rows, k},
                                   {weights.data(), rows, k},
                                   {},
                                   {plan.data(), rows, n},
                                   {noise.data(), rows, n}});
              router.route({s.data(), rows, n}, ctx,
                           {{tiles_experts.data(), rows, k}, {tiles_weights.data(), rows, k}});
            }
            std::uint64_t h = 1469598103934665603ull;
            h = hash(hash(hash(hash(hash(hash(h, experts), weights), plan), noise), tiles_experts), tiles_weights);
            h = hash(h, std::vector<double>{static_cast<double>(info.iterations), info.marginal_error});
            std::printf("noisy %s n %3lld cost %s xi %3g threads %d: %3d iterations, hash %016llx\n",
                        policy == 0 ? "softmax top-k" : (policy == 1 ? "Sinkhorn plan" : "Sinkhorn score"),
                        static_cast<long long>(n), ssr::to_string(cost), xi, threads, info.iterations,
                        static_cast<unsigned long long>(h));
          }
}
