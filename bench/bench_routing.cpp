// Micro-benchmarks, all in one run: the Sinkhorn solve (per solve and per iteration), the same number of
// iterations of a straightforward two-pass scaling loop and of a straightforward log-domain loop, the
// machine's single-pass read bound over the same m x n matrix, the float exp of as many elements (the
// setup's exp bound), and the routing throughput of every policy.
//
// Every shape of docs/performance.md is registered. Without --benchmark_filter the run leaves out
// m = 10^6 and the Sinkhorn grid's n >= 128 at m = 65536 (minutes each); pass a filter to run them, e.g.
// --benchmark_filter=/1000000/ or --benchmark_filter=. for everything. docs/performance.md gives the
// filter of each table.
#include <benchmark/benchmark.h>

#include <ssr/router.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
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

// Counters of a loop that makes `passes` passes over an m x n matrix of T per benchmark iteration:
// ns per element and pass, and GB/s of the matrix read.
template <class T>
void pass_counters(benchmark::State& state, double passes, ssr::index_t m, ssr::index_t n) {
  const double elems = passes * static_cast<double>(m * n);
  state.counters["ns_per_element_iteration"] =
      benchmark::Counter(elems * 1e-9, benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
  state.counters["GB/s"] = benchmark::Counter(elems * sizeof(T) * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

// A converged solve through the Router: costs, iterations to tol = 1e-4 (at most 100), top-k and plan
// weights. Arguments: m, n, 1000 * xi, cost (0 linear, 1 softmax). The per-iteration counters divide the
// whole solve by its iterations, so they include the setup and the final plan.
template <class T>
void BM_SinkhornSolve(benchmark::State& state) {
  const ssr::index_t m = state.range(0), n = state.range(1), k = 2;
  const double xi = static_cast<double>(state.range(2)) / 1000;
  const auto cost = state.range(3) ? ssr::Cost::softmax : ssr::Cost::linear;
  const auto s = logits<T>(m, n);
  ssr::Router<ssr::SinkhornTopK, ssr::CpuBackend<T>> router(ssr::SinkhornTopK(k, cost, {xi, 1e-4, 100}, ssr::Weights::plan));
  std::vector<std::int32_t> experts(static_cast<std::size_t>(m * k));
  std::vector<T> weights(static_cast<std::size_t>(m * k));
  const auto route = [&] {
    return router.route({s.data(), m, n}, ssr::Context::train(0), {{experts.data(), m, k}, {weights.data(), m, k}});
  };
  // One call untimed: the router's workspace is allocated and first touched there, as on an engine's
  // first step. Timed, it made a repetition of a few calls slower, the more so on two threads (65536 x 256
  // in the thread grid: 20 ms a call against 11.7 ms): page faults, and the compaction that huge pages can
  // ask of the kernel.
  ssr::RouteInfo info = route();
  for (auto _ : state) {
    info = route();
    benchmark::DoNotOptimize(weights.data());
  }
  state.counters["sinkhorn_iterations"] = info.iterations;
  state.counters["marginal_error"] = info.marginal_error;
  state.counters["ns_per_iteration"] =
      benchmark::Counter(info.iterations * 1e-9, benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
  pass_counters<T>(state, info.iterations, m, n);
}

// Exactly `iters` Sinkhorn iterations of each implementation on the same costs (xi = 0.5, linear): the
// library's solver against a straightforward two-pass scaling loop and a straightforward log-domain loop.
// Arguments: m, n, iterations. The cost of one iteration is the slope (t(21) - t(1)) / 20. The peers build
// their kernel outside the timed loop; the library builds it on every call, and (t(1) - slope) is what it
// spends outside its iterations.
void BM_LibraryIterations(benchmark::State& state) {
  const ssr::index_t m = state.range(0), n = state.range(1), k = 2;
  const int iters = static_cast<int>(state.range(2));
  const auto s = logits<float>(m, n);
  ssr::Router<ssr::SinkhornTopK, ssr::CpuBackend<float>> router(ssr::SinkhornTopK(k, ssr::Cost::linear, {0.5, 1e-30, iters}));
  std::vector<std::int32_t> experts(static_cast<std::size_t>(m * k));
  std::vector<float> weights(static_cast<std::size_t>(m * k));
  const auto route = [&] {
    router.route({s.data(), m, n}, ssr::Context::train(0), {{experts.data(), m, k}, {weights.data(), m, k}});
  };
  route();  // untimed (see BM_SinkhornSolve)
  for (auto _ : state) {
    route();
    benchmark::DoNotOptimize(weights.data());
  }
  pass_counters<float>(state, iters, m, n);
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
  pass_counters<float>(state, iters, m, n);
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
  pass_counters<float>(state, iters, m, n);
}

// The read bound: one pass summing the m x n floats into 8 independent vectors of lanes (no dependency
// chain longer than one add per 8 vectors), the least any iteration over the matrix can cost; in the
// instruction set the library's kernels take on this processor (ssr::cpu::with_isa).
float read_sum(const float* p, std::size_t count) {
  return ssr::cpu::with_isa([&](auto /*isa*/) SSR_INLINE_LAMBDA {
    using V = ssr::cpu::Lanes<float>;
    constexpr std::size_t width = ssr::cpu::lanes, chunk = 8 * width;
    V acc[8] = {};
    std::size_t e = 0;
    for (; e + chunk <= count; e += chunk)
      for (std::size_t v = 0; v < 8; ++v) {
        V x;
        ssr::cpu::read(p + e + v * width, x);
        acc[v] += x;
      }
    float lanes[8 * width];
    std::memcpy(lanes, acc, sizeof lanes);
    float total = 0;
    for (const float l : lanes) total += l;
    for (; e < count; ++e) total += p[e];
    return total;
  });
}

template <class T>
void BM_ReadBound(benchmark::State& state) {
  static_assert(std::is_same<T, float>::value, "the read bound of float matrices");
  const ssr::index_t m = state.range(0), n = state.range(1);
  const auto s = logits<T>(m, n);
  // On whole cache lines, as the solver's Q is: a vector load never spans two lines (where it would, the
  // read takes up to twice as long, by where the allocator happened to put the matrix); and from 2 MiB on,
  // on huge pages where Linux grants them, as the solver's own workspace is (ssr/detail/aligned.hpp).
  ssr::detail::AlignedBuffer<float> q;
  float* data = q.reserve(s.size());
  std::copy(s.begin(), s.end(), data);
  for (auto _ : state) {
    float total = read_sum(data, s.size());
    benchmark::DoNotOptimize(total);
  }
  pass_counters<T>(state, 1, m, n);
}

// The exp bound: the float exp that a solve's setup takes once per element (Q = exp(K + h - c), the lanes
// of ssr::cpu::exp_lanes in the instruction set this processor takes) from one m x n buffer into another: a
// read, an exp and a write an element, the least a setup that reads the logits once and writes Q can cost
// (bench/roofline.py).
void BM_ExpBound(benchmark::State& state) {
  const ssr::index_t m = state.range(0), n = state.range(1);
  auto k = logits<float>(m, n);
  for (auto& e : k) e = std::min(e, 0.0f);  // K <= 0, as the kernel makes it
  std::vector<float> q(k.size());
  const std::size_t whole = k.size() / ssr::cpu::lanes * ssr::cpu::lanes;
  for (auto _ : state) {
    ssr::cpu::with_isa([&](auto isa) SSR_INLINE_LAMBDA {
      ssr::cpu::Lanes<float> x, y;
      for (std::size_t e = 0; e < whole; e += ssr::cpu::lanes) {
        ssr::cpu::read(k.data() + e, x);
        ssr::cpu::exp_lanes<ssr::cpu::Lanes<float>, decltype(isa)>(x, y);
        ssr::cpu::write(q.data() + e, y);
      }
    });
    for (std::size_t e = whole; e < k.size(); ++e) q[e] = ssr::math::exp_as<float>(k[e]);
    benchmark::DoNotOptimize(q.data());
    benchmark::ClobberMemory();
  }
  pass_counters<float>(state, 1, m, n);
}

// The pass in cache: the solver's pass (ssr::cpu::pass_block, as a solve calls it: a block of
// math::sum_block_rows(n) rows at a time, subnormals flushed) over one block of Q held in tiles, swept
// again for each block of an m x n matrix: what an iteration costs the core when every read finds its data
// in L1, the pass's own floor (bench/roofline.py).
void BM_PassInCache(benchmark::State& state) {
  constexpr ssr::index_t tile = ssr::CpuTuning::tile;
  const ssr::index_t m = state.range(0), n = state.range(1);
  const ssr::index_t per_block = ssr::math::sum_block_rows(n), blocks = ssr::math::sum_blocks(m, n);
  const ssr::index_t rows = std::min(m, per_block), last = m - (blocks - 1) * per_block;  // last: the last block's
  const ssr::index_t tiles = ssr::CpuTuning::tiles(rows), last_tiles = ssr::CpuTuning::tiles(last);
  const auto s = logits<float>(rows, n);
  // Q = exp(S - max S) in tiles, as the setup makes it (every row holds a 1), and v = 1 (the first pass).
  ssr::detail::AlignedBuffer<float> q_buffer, v_buffer, sum_buffer, part_buffer;
  float* q = q_buffer.reserve(static_cast<std::size_t>(tiles * tile * n));
  std::fill(q, q + tiles * tile * n, 0.0f);
  for (ssr::index_t i = 0; i < rows; ++i) {
    const float* row = s.data() + i * n;
    const float top = *std::max_element(row, row + n);
    for (ssr::index_t j = 0; j < n; ++j) q[(i / tile * n + j) * tile + i % tile] = std::exp(row[j] - top);
  }
  float* v = v_buffer.reserve(static_cast<std::size_t>(n));
  std::fill(v, v + n, 1.0f);
  float* row_sum = sum_buffer.reserve(static_cast<std::size_t>(tiles * tile));
  float* part = part_buffer.reserve(static_cast<std::size_t>(n));
  for (auto _ : state) {
    const ssr::cpu::FlushSubnormals flush;
    for (ssr::index_t blk = 0; blk < blocks; ++blk) {
      ssr::cpu::with_isa([&](auto isa) SSR_INLINE_LAMBDA {
        ssr::cpu::pass_block<float, decltype(isa)>(q, v, n, blk + 1 < blocks ? tiles : last_tiles, row_sum, part);
      });
      benchmark::DoNotOptimize(part);
    }
    benchmark::ClobberMemory();
  }
  pass_counters<float>(state, 1, m, n);
}

// One double exp at a time over 2^16 values in [-20, 0] (a softmax's shifted logits), as the scalar
// definitions take it: math::exp (argument 0; in a baseline build its copy compiled for FMA where the
// processor has it) against the platform's std::exp (argument 1). Time per value: the counter ns_per_exp.
void BM_ScalarExp(benchmark::State& state) {
  std::vector<double> x(std::size_t{1} << 16);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = -20.0 * static_cast<double>(i) / static_cast<double>(x.size());
  const bool platform = state.range(0) != 0;
  for (auto _ : state) {
    double sum = 0;
    for (const double v : x) sum += platform ? std::exp(v) : ssr::math::exp(v);
    benchmark::DoNotOptimize(sum);
  }
  state.counters["ns_per_exp"] = benchmark::Counter(
      static_cast<double>(x.size()), benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}

// Routing throughput of a policy (training calls; the step advances every call, so a selective policy
// takes the Sinkhorn path with its probability p). Arguments: m, n, k.
template <class Policy>
void run_policy(benchmark::State& state, const Policy& policy) {
  const ssr::index_t m = state.range(0), n = state.range(1), k = state.range(2);
  const auto s = logits<float>(m, n);
  ssr::Router<Policy, ssr::CpuBackend<float>> router(policy);
  std::vector<std::int32_t> experts(static_cast<std::size_t>(m * k)), load(static_cast<std::size_t>(n));
  std::vector<float> weights(static_cast<std::size_t>(m * k));
  std::uint64_t step = 0, sinkhorn_calls = 0;
  const auto route = [&](std::uint64_t at) {
    return router.route({s.data(), m, n}, ssr::Context::train(at),
                        {{experts.data(), m, k}, {weights.data(), m, k}, {load.data(), n}});
  };
  route(0);  // untimed (see BM_SinkhornSolve); the timed calls start again from step 0
  for (auto _ : state) {
    sinkhorn_calls += route(step++).path == ssr::Path::sinkhorn;
    benchmark::DoNotOptimize(weights.data());
  }
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(m), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["sinkhorn_share"] = static_cast<double>(sinkhorn_calls) / static_cast<double>(std::max<std::uint64_t>(step, 1));
}

int k_of(benchmark::State& state) { return static_cast<int>(state.range(2)); }

// Softmax top-k a row at a time (math::softmax_row, the CPU backend's path where its tiles do not apply:
// k > 8, selection by scores, bias or groups), on one thread: against BM_Route_SoftmaxTopK, what the tiles
// are worth. Arguments: m, n, k.
void BM_SoftmaxRowByRow(benchmark::State& state) {
  const ssr::index_t m = state.range(0), n = state.range(1), k = state.range(2);
  const auto s = logits<float>(m, n);
  std::vector<std::int32_t> experts(static_cast<std::size_t>(m * k));
  std::vector<float> weights(static_cast<std::size_t>(m * k));
  ssr::RouteSpec spec;
  spec.k = static_cast<int>(k);
  for (auto _ : state) {
    for (ssr::index_t i = 0; i < m; ++i)
      ssr::math::softmax_row<float>(spec, ssr::Context{}, s.data() + i * n, i, n, experts.data() + i * k,
                                    weights.data() + i * k, nullptr);
    benchmark::DoNotOptimize(weights.data());
  }
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(m), benchmark::Counter::kIsIterationInvariantRate);
}

void BM_Route_SoftmaxTopK(benchmark::State& state) { run_policy(state, ssr::SoftmaxTopK(k_of(state))); }
void BM_Route_SinkhornTopK_PlanWeights(benchmark::State& state) {
  run_policy(state, ssr::SinkhornTopK(k_of(state), ssr::Cost::linear, {}, ssr::Weights::plan));
}
void BM_Route_SinkhornTopK_ScoreWeights(benchmark::State& state) {
  run_policy(state, ssr::SinkhornTopK(k_of(state), ssr::Cost::linear, {}, ssr::Weights::scores));
}
void BM_Route_NoisySoftmaxTopK(benchmark::State& state) {
  run_policy(state, ssr::NoisyCost<ssr::SoftmaxTopK>(ssr::SoftmaxTopK(k_of(state)), 1.0, 1.0));
}
void BM_Route_NoisySinkhornTopK(benchmark::State& state) {
  run_policy(state, ssr::NoisyCost<ssr::SinkhornTopK>(ssr::SinkhornTopK(k_of(state), ssr::Cost::linear, {}, ssr::Weights::plan), 1.0, 1.0));
}
// SSR-S with noise (DESIGN: the softmax cost): its common path and its Sinkhorn path.
void BM_Route_NoisySoftmaxTopK_SoftmaxCost(benchmark::State& state) {
  run_policy(state, ssr::NoisyCost<ssr::SoftmaxTopK>(ssr::SoftmaxTopK(k_of(state), ssr::Cost::softmax), 1.0, 1.0));
}
void BM_Route_NoisySinkhornTopK_SoftmaxCost(benchmark::State& state) {
  run_policy(state, ssr::NoisyCost<ssr::SinkhornTopK>(
                        ssr::SinkhornTopK(k_of(state), ssr::Cost::softmax, {}, ssr::Weights::plan), 1.0, 1.0));
}
void BM_Route_SSR_p0001(benchmark::State& state) { run_policy(state, ssr::make_ssr(k_of(state), ssr::Cost::linear, 1e-3)); }
void BM_Route_SSR_p1(benchmark::State& state) { run_policy(state, ssr::make_ssr(k_of(state), ssr::Cost::linear, 1.0)); }

const long kMs[] = {4096, 24576, 65536, 1000000};
const long kNs[] = {8, 16, 128, 256};

void solve_grid(benchmark::internal::Benchmark* b) {
  for (long m : kMs)
    for (long n : kNs)
      for (long xi : {1000, 500, 100, 50})
        for (long cost : {0, 1}) b->Args({m, n, xi, cost});
}
void iteration_grid(benchmark::internal::Benchmark* b) {
  for (long m : kMs)
    for (long n : kNs)
      for (long iters : {1, 21}) b->Args({m, n, iters});
}
void matrix_grid(benchmark::internal::Benchmark* b) {
  for (long m : kMs)
    for (long n : kNs) b->Args({m, n});
}
// The paper's shape first, then Mixtral, Switch and DeepSeek-V3.
void policy_shapes(benchmark::internal::Benchmark* b) {
  b->Args({24576, 16, 2})->Args({24576, 8, 2})->Args({24576, 128, 1})->Args({24576, 256, 8});
}

}  // namespace

BENCHMARK_TEMPLATE(BM_SinkhornSolve, float)->Apply(solve_grid)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_LibraryIterations)->Apply(iteration_grid)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_TwoPassScaling)->Apply(iteration_grid)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_LogDomainStraightforward)->Apply(iteration_grid)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_TEMPLATE(BM_ReadBound, float)->Apply(matrix_grid)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_ExpBound)->Apply(matrix_grid)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_PassInCache)->Apply(matrix_grid)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_ScalarExp)->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_Route_SoftmaxTopK)->Apply(policy_shapes)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_SoftmaxRowByRow)->Apply(policy_shapes)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_Route_NoisySoftmaxTopK)->Apply(policy_shapes)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_Route_SinkhornTopK_PlanWeights)->Apply(policy_shapes)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_Route_SinkhornTopK_ScoreWeights)->Apply(policy_shapes)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_Route_NoisySinkhornTopK)->Apply(policy_shapes)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_Route_NoisySoftmaxTopK_SoftmaxCost)->Apply(policy_shapes)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_Route_NoisySinkhornTopK_SoftmaxCost)->Apply(policy_shapes)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_Route_SSR_p0001)->Apply(policy_shapes)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_Route_SSR_p1)->Apply(policy_shapes)->Unit(benchmark::kMicrosecond)->UseRealTime();

// Without a filter, leave out the heavy shapes (see the top of this file).
int main(int argc, char** argv) {
  std::vector<char*> args(argv, argv + argc);
  bool filtered = false;
  for (int a = 1; a < argc; ++a) filtered = filtered || std::strncmp(argv[a], "--benchmark_filter", 18) == 0;
  std::string default_filter = "--benchmark_filter=-/1000000/|BM_SinkhornSolve<float>/65536/(128|256)/";
  if (!filtered) args.push_back(&default_filter[0]);
  int count = static_cast<int>(args.size());
  benchmark::Initialize(&count, args.data());
  if (benchmark::ReportUnrecognizedArguments(count, args.data())) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
