// Micro-benchmarks: a Sinkhorn solve and its cost per iteration, softmax top-k routing, and the
// machine's single-pass read bound over the same m x n matrix, all in one run.
#include <benchmark/benchmark.h>

#include <ssr/router.hpp>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

namespace {

template <class T>
std::vector<T> logits(ssr::index_t m, ssr::index_t n) {
  std::mt19937_64 gen(1);
  std::normal_distribution<double> normal;
  std::vector<T> s(static_cast<std::size_t>(m * n));
  for (ssr::index_t i = 0; i < m; ++i)
    for (ssr::index_t j = 0; j < n; ++j)
      s[static_cast<std::size_t>(i * n + j)] = static_cast<T>(normal(gen) - 4.0 * static_cast<double>(j) / static_cast<double>(n));
  return s;
}

// Arguments: m, n, 1000 * xi, cost (0 linear, 1 softmax).
template <class T>
void BM_SinkhornSolve(benchmark::State& state) {
  const ssr::index_t m = state.range(0), n = state.range(1), k = 2;
  const double xi = static_cast<double>(state.range(2)) / 1000;
  const auto cost = state.range(3) ? ssr::Cost::softmax : ssr::Cost::linear;
  const auto s = logits<T>(m, n);
  ssr::Router<ssr::SinkhornTopK, ssr::CpuBackend<T>> router(ssr::SinkhornTopK(k, cost, {xi, 1e-4, 100}));
  std::vector<std::int32_t> experts(static_cast<std::size_t>(m * k));
  std::vector<T> weights(static_cast<std::size_t>(m * k));
  ssr::RouteInfo info;
  for (auto _ : state) {
    info = router.route({s.data(), m, n}, ssr::Context::train(0), {{experts.data(), m, k}, {weights.data(), m, k}});
    benchmark::DoNotOptimize(weights.data());
  }
  // Per-iteration figures divide the whole solve (costs, iterations, final plan) by the iteration count.
  const double iters = info.iterations, elems = static_cast<double>(m * n);
  state.counters["iterations"] = iters;
  state.counters["solve_ns_per_iteration"] =
      benchmark::Counter(iters * 1e-9, benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
  state.counters["solve_ns_per_element_iteration"] =
      benchmark::Counter(iters * elems * 1e-9, benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
  state.counters["solve_GB/s"] = benchmark::Counter(iters * elems * sizeof(T) * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

template <class T>
void BM_SoftmaxTopK(benchmark::State& state) {
  const ssr::index_t m = state.range(0), n = state.range(1), k = state.range(2);
  const auto s = logits<T>(m, n);
  ssr::Router<ssr::SoftmaxTopK, ssr::CpuBackend<T>> router(ssr::SoftmaxTopK(static_cast<int>(k)));
  std::vector<std::int32_t> experts(static_cast<std::size_t>(m * k));
  std::vector<T> weights(static_cast<std::size_t>(m * k));
  for (auto _ : state) {
    router.route({s.data(), m, n}, ssr::Context::train(0), {{experts.data(), m, k}, {weights.data(), m, k}});
    benchmark::DoNotOptimize(weights.data());
  }
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(m), benchmark::Counter::kIsIterationInvariantRate);
}

// Exactly `iters` Sinkhorn iterations of each implementation, on the same costs: the library's solver
// against a straightforward two-pass scaling loop and a straightforward log-domain loop. Arguments:
// m, n, iterations. Setup (the kernel) is outside the timed loop for the peers and inside for the library
// (which builds it on every call), so the library's figure is an upper bound on its iteration cost.
void BM_LibraryIterations(benchmark::State& state) {
  const ssr::index_t m = state.range(0), n = state.range(1), k = 2;
  const int iters = static_cast<int>(state.range(2));
  const auto s = logits<float>(m, n);
  ssr::Router<ssr::SinkhornTopK, ssr::CpuBackend<float>> router(ssr::SinkhornTopK(k, ssr::Cost::linear, {0.5, 1e-30, iters}));
  std::vector<std::int32_t> experts(static_cast<std::size_t>(m * k));
  std::vector<float> weights(static_cast<std::size_t>(m * k));
  for (auto _ : state) {
    router.route({s.data(), m, n}, ssr::Context::train(0), {{experts.data(), m, k}, {weights.data(), m, k}});
    benchmark::DoNotOptimize(weights.data());
  }
  state.counters["ns_per_element_iteration"] = benchmark::Counter(
      static_cast<double>(iters * m * n) * 1e-9, benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}

// Scaling form, as usually written: K = exp(C / xi) once; each iteration one pass for u = 1 / (K v) and
// one for v = (m/n) / (K^T u). Overflows for small xi; shown for speed only.
void BM_TwoPassScaling(benchmark::State& state) {
  const ssr::index_t m = state.range(0), n = state.range(1);
  const int iters = static_cast<int>(state.range(2));
  auto kmat = logits<float>(m, n);
  for (auto& x : kmat) x = std::exp(x / 0.5f);
  std::vector<float> u(static_cast<std::size_t>(m)), v(static_cast<std::size_t>(n), 1.0f), col(static_cast<std::size_t>(n));
  const float target = static_cast<float>(m) / static_cast<float>(n);
  for (auto _ : state) {
    std::fill(v.begin(), v.end(), 1.0f);
    for (int it = 0; it < iters; ++it) {
      for (ssr::index_t i = 0; i < m; ++i) {
        float r = 0;
        for (ssr::index_t j = 0; j < n; ++j) r += kmat[i * n + j] * v[j];
        u[i] = 1.0f / r;
      }
      std::fill(col.begin(), col.end(), 0.0f);
      for (ssr::index_t i = 0; i < m; ++i)
        for (ssr::index_t j = 0; j < n; ++j) col[j] += kmat[i * n + j] * u[i];
      for (ssr::index_t j = 0; j < n; ++j) v[j] = target / col[j];
    }
    benchmark::DoNotOptimize(v.data());
  }
  state.counters["ns_per_element_iteration"] = benchmark::Counter(
      static_cast<double>(iters * m * n) * 1e-9, benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}

// Log domain, as usually written: each iteration a row log-sum-exp pass and a column log-sum-exp pass.
void BM_LogDomainStraightforward(benchmark::State& state) {
  const ssr::index_t m = state.range(0), n = state.range(1);
  const int iters = static_cast<int>(state.range(2));
  auto kmat = logits<float>(m, n);
  for (auto& x : kmat) x /= 0.5f;
  std::vector<float> f(static_cast<std::size_t>(m)), g(static_cast<std::size_t>(n)), top(static_cast<std::size_t>(n)),
      sum(static_cast<std::size_t>(n));
  const float log_target = std::log(static_cast<float>(m) / static_cast<float>(n));
  for (auto _ : state) {
    std::fill(g.begin(), g.end(), 0.0f);
    for (int it = 0; it < iters; ++it) {
      for (ssr::index_t i = 0; i < m; ++i) {
        float t = -INFINITY, acc = 0;
        for (ssr::index_t j = 0; j < n; ++j) t = std::max(t, kmat[i * n + j] + g[j]);
        for (ssr::index_t j = 0; j < n; ++j) acc += std::exp(kmat[i * n + j] + g[j] - t);
        f[i] = -(t + std::log(acc));
      }
      std::fill(top.begin(), top.end(), -INFINITY);
      std::fill(sum.begin(), sum.end(), 0.0f);
      for (ssr::index_t i = 0; i < m; ++i)
        for (ssr::index_t j = 0; j < n; ++j) top[j] = std::max(top[j], kmat[i * n + j] + f[i]);
      for (ssr::index_t i = 0; i < m; ++i)
        for (ssr::index_t j = 0; j < n; ++j) sum[j] += std::exp(kmat[i * n + j] + f[i] - top[j]);
      for (ssr::index_t j = 0; j < n; ++j) g[j] = log_target - top[j] - std::log(sum[j]);
    }
    benchmark::DoNotOptimize(g.data());
  }
  state.counters["ns_per_element_iteration"] = benchmark::Counter(
      static_cast<double>(iters * m * n) * 1e-9, benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}

// The read bound: one pass summing the m x n matrix, the least any iteration over it can cost.
template <class T>
void BM_ReadBound(benchmark::State& state) {
  const ssr::index_t m = state.range(0), n = state.range(1);
  const auto s = logits<T>(m, n);
  for (auto _ : state) {
    T acc[8] = {};
    for (std::size_t e = 0; e + 8 <= s.size(); e += 8)
      for (int l = 0; l < 8; ++l) acc[l] += s[e + static_cast<std::size_t>(l)];
    benchmark::DoNotOptimize(acc);
  }
  state.counters["GB/s"] = benchmark::Counter(static_cast<double>(m * n) * sizeof(T) * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

void shapes(benchmark::internal::Benchmark* b) {
  for (long n : {8, 16, 128, 256})
    for (long xi : {1000, 500, 100, 50})
      for (long cost : {0, 1}) b->Args({24576, n, xi, cost});
}

}  // namespace

BENCHMARK_TEMPLATE(BM_SinkhornSolve, float)->Apply(shapes)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_TEMPLATE(BM_SoftmaxTopK, float)->Args({24576, 16, 2})->Args({24576, 8, 2})->Args({24576, 128, 1})->Args({24576, 256, 8})->Unit(benchmark::kMicrosecond)->UseRealTime();
void iteration_shapes(benchmark::internal::Benchmark* b) {
  for (long n : {8, 16, 128, 256})
    for (long iters : {1, 21}) b->Args({24576, n, iters});
}
BENCHMARK(BM_LibraryIterations)->Apply(iteration_shapes)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_TwoPassScaling)->Apply(iteration_shapes)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_LogDomainStraightforward)->Apply(iteration_shapes)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_TEMPLATE(BM_ReadBound, float)->Args({24576, 8})->Args({24576, 16})->Args({24576, 128})->Args({24576, 256})->Unit(benchmark::kMicrosecond)->UseRealTime();

BENCHMARK_MAIN();
