// GPU micro-benchmarks of the CUDA backend, timed with CUDA events: the fused softmax top-k kernel, a
// whole routing call, one fused Sinkhorn iteration and a converged Sinkhorn solve, beside the device's
// memory bandwidth measured in the same run (a device-to-device copy) and its theoretical peak.
// Counters: GB/s moved (bytes each kernel must read and write once), and that as a fraction of the copy
// bandwidth (frac_copy) and of the peak (frac_peak). cuda/bench/peers_cuda.py runs the PyTorch peers on
// the same shapes and prints the ratios.
#include <benchmark/benchmark.h>

#include <ssr/cuda/backend.cuh>
#include <ssr/random.hpp>
#include <ssr/router.hpp>

#include <cuda_bf16.h>
#include <thrust/device_vector.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/transform.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(status));
    std::exit(1);
  }
}

// Times what body enqueues on stream, per benchmark iteration.
class EventTimer {
 public:
  EventTimer() {
    check(cudaEventCreate(&start_), "event");
    check(cudaEventCreate(&stop_), "event");
  }
  ~EventTimer() {
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
  }
  template <class Body>
  void run(benchmark::State& state, cudaStream_t stream, Body body) {
    body();  // warm-up: first-touch allocations, module loading
    check(cudaStreamSynchronize(stream), "warm-up");
    for (auto _ : state) {
      check(cudaEventRecord(start_, stream), "record");
      body();
      check(cudaEventRecord(stop_, stream), "record");
      check(cudaEventSynchronize(stop_), "sync");
      float ms = 0;
      check(cudaEventElapsedTime(&ms, start_, stop_), "elapsed");
      state.SetIterationTime(static_cast<double>(ms) * 1e-3);
    }
  }

 private:
  cudaEvent_t start_, stop_;
};

struct Bandwidth {
  double peak = 0;  // bytes/s from the memory clock and bus width (0 if the device does not say)
  double copy = 0;  // bytes/s read + written by a large device-to-device copy
};

Bandwidth measure_bandwidth() {
  Bandwidth b;
  int dev = 0, clock_khz = 0, bus_bits = 0;
  check(cudaGetDevice(&dev), "device");
  if (cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, dev) == cudaSuccess &&
      cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, dev) == cudaSuccess)
    b.peak = 2.0 * clock_khz * 1e3 * bus_bits / 8;  // double data rate
  const std::size_t bytes = std::size_t(1) << 30;
  void *src = nullptr, *dst = nullptr;
  check(cudaMalloc(&src, bytes), "malloc");
  check(cudaMalloc(&dst, bytes), "malloc");
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  check(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice), "copy");
  float best = 1e30f;
  for (int r = 0; r < 10; ++r) {
    cudaEventRecord(start);
    cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice);
    cudaEventRecord(stop);
    cudaEventSynchronize(stop);
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    best = ms < best ? ms : best;
  }
  b.copy = 2.0 * static_cast<double>(bytes) / (static_cast<double>(best) * 1e-3);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaFree(src);
  cudaFree(dst);
  return b;
}

const Bandwidth& bandwidth() {
  static const Bandwidth b = measure_bandwidth();
  return b;
}

void bandwidth_counters(benchmark::State& state, double bytes_per_iteration) {
  state.counters["GB/s"] = benchmark::Counter(bytes_per_iteration * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  // Fractions: the rate divided by a constant, as counters so they print beside the rate.
  state.counters["frac_copy"] =
      benchmark::Counter(bytes_per_iteration / bandwidth().copy, benchmark::Counter::kIsIterationInvariantRate);
  if (bandwidth().peak > 0)
    state.counters["frac_peak"] =
        benchmark::Counter(bytes_per_iteration / bandwidth().peak, benchmark::Counter::kIsIterationInvariantRate);
}

// The same logits as bench/bench_routing.cpp and peers_cuda.py: N(0, 1) - 4 j / n, expert j less popular as j grows.
template <class T>
thrust::device_vector<T> logits(ssr::index_t m, ssr::index_t n) {
  thrust::device_vector<T> s(static_cast<std::size_t>(m * n));
  thrust::transform(thrust::counting_iterator<ssr::index_t>(0), thrust::counting_iterator<ssr::index_t>(m * n), s.begin(),
                    [n] __device__(ssr::index_t e) {
                      const double z = ssr::random::normal(1, 0, 0, static_cast<std::uint64_t>(e));
                      return static_cast<T>(z - 4.0 * static_cast<double>(e % n) / static_cast<double>(n));
                    });
  return s;
}

template <class V>
V* ptr(thrust::device_vector<V>& v) {
  return thrust::raw_pointer_cast(v.data());
}

// The fused softmax top-k kernel alone. Arguments: m, n, k.
template <class In>
void BM_FusedSoftmaxTopK(benchmark::State& state) {
  const ssr::index_t m = state.range(0), n = state.range(1), k = state.range(2);
  auto s = logits<In>(m, n);
  thrust::device_vector<std::int32_t> experts(m * k);
  thrust::device_vector<float> weights(m * k);
  const ssr::Context ctx = ssr::Context::train(0);
  const ssr::RouteSpec spec = ssr::SoftmaxTopK(static_cast<int>(k)).resolve(ctx);
  EventTimer timer;
  timer.run(state, nullptr, [&] {
    ssr::cuda::softmax_topk<In, float>({ptr(s), m, n}, spec, ctx, {ptr(experts), m, k}, {ptr(weights), m, k}, {},
                                       nullptr);
  });
  check(cudaGetLastError(), "softmax_topk");
  bandwidth_counters(state, static_cast<double>(m * n * sizeof(In) + m * k * (sizeof(std::int32_t) + sizeof(float))));
}

// A whole routing call as an engine makes it: softmax top-k and per-expert load, with the finiteness check
// (one read-back) when the last argument is 1, without it (nothing waits) when 0.
void BM_RouteSoftmaxTopK(benchmark::State& state) {
  const ssr::index_t m = state.range(0), n = state.range(1), k = state.range(2);
  auto s = logits<float>(m, n);
  thrust::device_vector<std::int32_t> experts(m * k), load(n);
  thrust::device_vector<float> weights(m * k);
  ssr::Router<ssr::SoftmaxTopK, ssr::CudaBackend<float>> router(ssr::SoftmaxTopK(static_cast<int>(k)));
  ssr::CallOptions<cudaStream_t> options;
  options.check_finite = state.range(3) != 0;
  EventTimer timer;
  timer.run(state, nullptr, [&] {
    router.route({ptr(s), m, n}, ssr::Context::train(0), {{ptr(experts), m, k}, {ptr(weights), m, k}, {ptr(load), n}},
                 options);
  });
}

// The fused solve's buffers for an m x n kernel at logk, in a device workspace of their own.
struct SolveWorkspace {
  thrust::device_vector<unsigned char> bytes;
  ssr::thrust_algorithms::SinkhornBuffers<float> buffers;
  SolveWorkspace(ssr::index_t m, ssr::index_t n, float* logk) {
    ssr::detail::Carve measure;
    ssr::thrust_algorithms::sinkhorn_layout<float>(measure, m, n);
    bytes.resize(measure.bytes());
    ssr::detail::Carve place(ptr(bytes), bytes.size());
    buffers = ssr::thrust_algorithms::sinkhorn_layout<float>(place, m, n);
    buffers.logk = logk;
  }
  // The iterations and error of the last solve.
  ssr::SolveStats stats() const {
    ssr::SolveStats last{};
    check(cudaMemcpy(&last, &buffers.state->stats, sizeof last, cudaMemcpyDeviceToHost), "stats");
    return last;
  }
};

// One Sinkhorn iteration of the fused solve (rows, columns, decision), from 20 iterations run with tol = 0
// (the solve's one exp pass, which builds Q from K, included). Arguments: m, n. Bytes: the m x n Q read once.
void BM_SinkhornIteration(benchmark::State& state) {
  const ssr::index_t m = state.range(0), n = state.range(1);
  constexpr int iterations = 20;
  auto logk = logits<float>(m, n);
  SolveWorkspace solve(m, n, ptr(logk));
  const auto& buffers = solve.buffers;
  if (!ssr::cuda::sinkhorn_solve<float>(buffers, m, n, {0.5, 1e-300, iterations}, nullptr)) {
    state.SkipWithError("the device cannot hold the solve's grid");
    return;
  }
  EventTimer timer;
  timer.run(state, nullptr, [&] { ssr::cuda::sinkhorn_solve<float>(buffers, m, n, {0.5, 1e-300, iterations}, nullptr); });
  if (solve.stats().iterations != iterations) state.SkipWithError("the solve did not run every iteration");
  state.counters["ns_per_iteration"] =
      benchmark::Counter(iterations * 1e-9, benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
  bandwidth_counters(state, static_cast<double>(iterations) * static_cast<double>(m * n) * sizeof(float));
}

// The fused solve alone, converged (tol 1e-4, at most 100 iterations) from a built kernel: the part of
// BM_SinkhornSolve's call that is the iterations. Arguments: m, n.
void BM_SinkhornConvergedSolve(benchmark::State& state) {
  const ssr::index_t m = state.range(0), n = state.range(1);
  constexpr float xi = 0.5f;  // the kernel S / xi, as the linear cost's route builds it
  auto logk = logits<float>(m, n);
  thrust::transform(logk.begin(), logk.end(), logk.begin(), [] __device__(float x) { return x / xi; });
  SolveWorkspace solve(m, n, ptr(logk));
  const auto& buffers = solve.buffers;
  if (!ssr::cuda::sinkhorn_solve<float>(buffers, m, n, {xi, 1e-4, 100}, nullptr)) {
    state.SkipWithError("the device cannot hold the solve's grid");
    return;
  }
  EventTimer timer;
  timer.run(state, nullptr, [&] { ssr::cuda::sinkhorn_solve<float>(buffers, m, n, {xi, 1e-4, 100}, nullptr); });
  state.counters["iterations"] = solve.stats().iterations;
}

// A converged Sinkhorn top-k route (tol 1e-4): finiteness check (when the last argument is 1), kernel build,
// iterations, plan top-k, load, sync. Arguments: m, n, k, 1000 * xi, check.
void BM_SinkhornSolve(benchmark::State& state) {
  const ssr::index_t m = state.range(0), n = state.range(1), k = state.range(2);
  const double xi = static_cast<double>(state.range(3)) / 1000;
  auto s = logits<float>(m, n);
  thrust::device_vector<std::int32_t> experts(m * k), load(n);
  thrust::device_vector<float> weights(m * k);
  ssr::Router<ssr::SinkhornTopK, ssr::CudaBackend<float>> router(ssr::SinkhornTopK(static_cast<int>(k), ssr::Cost::linear, {xi, 1e-4, 100}));
  ssr::RouteInfo info;
  ssr::CallOptions<cudaStream_t> options = ssr::CallOptions<cudaStream_t>{}.waiting();
  options.check_finite = state.range(4) != 0;
  EventTimer timer;
  timer.run(state, nullptr, [&] {
    info = router.route({ptr(s), m, n}, ssr::Context::train(0), {{ptr(experts), m, k}, {ptr(weights), m, k}, {ptr(load), n}},
                        options);
  });
  state.counters["iterations"] = info.iterations;
  state.counters["err"] = info.marginal_error;
}

void BM_CopyBandwidth(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(bandwidth().copy);
  state.counters["copy_GB/s"] = bandwidth().copy * 1e-9;
  state.counters["peak_GB/s"] = bandwidth().peak * 1e-9;
}

// The paper's shape (n = 16, k = 2), Mixtral (8, 2), Switch (128, 1), DeepSeek-V3 (256, 8); and the
// decode-sized batches of published fused routers (4096 x 128 and 8192 x 256, k = 8).
void routing_shapes(benchmark::internal::Benchmark* b) {
  for (const auto& nk : std::vector<std::pair<long, long>>{{16, 2}, {8, 2}, {128, 1}, {256, 8}}) {
    b->Args({24576, nk.first, nk.second});
    b->Args({1 << 20, nk.first, nk.second});
  }
  b->Args({4096, 128, 8});
  b->Args({8192, 256, 8});
}

}  // namespace

BENCHMARK(BM_CopyBandwidth)->Iterations(1);
BENCHMARK_TEMPLATE(BM_FusedSoftmaxTopK, float)->Apply(routing_shapes)->UseManualTime();
BENCHMARK_TEMPLATE(BM_FusedSoftmaxTopK, __nv_bfloat16)->Apply(routing_shapes)->UseManualTime();
BENCHMARK(BM_RouteSoftmaxTopK)
    ->ArgsProduct({{24576}, {16}, {2}, {0, 1}})->Args({24576, 8, 2, 1})->Args({24576, 128, 1, 1})->Args({24576, 256, 8, 1})
    ->UseManualTime();
BENCHMARK(BM_SinkhornIteration)->ArgsProduct({{24576, 1 << 20}, {8, 16, 128, 256}})->UseManualTime();
BENCHMARK(BM_SinkhornConvergedSolve)->Args({24576, 16})->Args({1 << 20, 16})->UseManualTime();
BENCHMARK(BM_SinkhornSolve)
    ->Args({24576, 16, 2, 500, 1})->Args({24576, 8, 2, 500, 1})->Args({24576, 128, 1, 500, 1})->Args({24576, 256, 8, 500, 1})
    ->Args({24576, 16, 2, 1000, 1})->Args({24576, 16, 2, 100, 1})->Args({1 << 20, 16, 2, 500, 1})
    ->Args({24576, 16, 2, 500, 0})
    ->UseManualTime();

BENCHMARK_MAIN();
