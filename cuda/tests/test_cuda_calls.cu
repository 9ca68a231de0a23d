// What the CUDA backend promises an engine beyond the property tests: half and bfloat16 logits through
// Router, all of a call's work on the caller's stream and none on the default stream, capture of unchecked
// calls in a CUDA graph (which also proves they allocate nothing and never wait), repeatable bits, its own
// kernels giving the bits of the Thrust items they stand in for, and its own workspace across streams,
// devices and captures.
#include <catch2/catch.hpp>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <chrono>
#include <thread>
#include <utility>
#include <vector>

#include <thrust/system/cuda/execution_policy.h>

#include "ssr/backend/thrust/algorithms.hpp"
#include "ssr/cuda/softmax_topk.cuh"
#include "support.hpp"

using ssr::Context;
using ssr::index_t;
using Options = ssr::CallOptions<cudaStream_t>;

namespace {

// Device memory for one call's logits and outputs, filled from the host.
template <class In>
struct DeviceCall {
  index_t m, n, k;
  test::Bytes logits, experts, weights, load;
  DeviceCall(const std::vector<In>& s, index_t m_, index_t n_, index_t k_)
      : m(m_), n(n_), k(k_), logits(s.size() * sizeof(In), 0), experts(m * k * 4, 0xff), weights(m * k * 4, 0xff),
        load(n * 4, 0xff) {
    test::cuda_ok(cudaMemcpy(logits.data(), s.data(), s.size() * sizeof(In), cudaMemcpyHostToDevice), "upload");
  }
  ssr::ConstMatrixView<In> in() { return {static_cast<const In*>(logits.data()), m, n}; }
  ssr::RouteOutputs<float> out() {
    return {{static_cast<std::int32_t*>(experts.data()), m, k}, {static_cast<float*>(weights.data()), m, k},
            {static_cast<std::int32_t*>(load.data()), n}};
  }
};

template <class Half>
std::vector<Half> rounded(const std::vector<float>& s, std::vector<float>& back) {
  std::vector<Half> h(s.size());
  back.resize(s.size());
  for (std::size_t e = 0; e < s.size(); ++e) {
    h[e] = Half(s[e]);
    back[e] = static_cast<float>(h[e]);
  }
  return h;
}

template <class Half>
void require_low_precision_routes_as_float() {
  const index_t m = 3000, n = 16, k = 2;
  std::vector<float> back;
  const auto h = rounded<Half>(test::random_logits<float>(m, n, 2.0, 11, 3.0), back);
  for (const double p : {0.0, 1.0}) {
    const auto policy = ssr::make_ssr(2, ssr::Cost::softmax, p, {0.5, 1e-6, 100}, 0.2);
    ssr::Router<ssr::SSRPolicy, ssr::CudaBackend<float>> router(policy);
    DeviceCall<Half> a(h, m, n, k);
    DeviceCall<float> b(back, m, n, k);
    const auto ia = router.route(a.in(), Context::train(3), a.out(), Options{}.waiting());
    const auto ib = router.route(b.in(), Context::train(3), b.out(), Options{}.waiting());
    INFO("p " << p);
    CHECK(ia.iterations == ib.iterations);
    CHECK(a.experts.read() == b.experts.read());
    CHECK(a.weights.read() == b.weights.read());
    CHECK(a.load.read() == b.load.read());
  }
}

// The fused noisy softmax top-k (its row shift by a group of lanes) against the Thrust backend's row items,
// on logits with ties and signed zeros, in rows that leave groups without a row in the last warp: the
// same bytes.
template <class T>
void require_fused_softmax_matches_row_items() {
  namespace alg = ssr::thrust_algorithms;
  const index_t m = 1001;
  for (const index_t n : {1, 2, 3, 5, 16, 17, 40, 64, 65, 130, 608}) {
    auto s = test::random_logits<T>(m, n, 2.0, static_cast<unsigned>(n), 1.0);
    for (std::size_t e = 0; e < s.size(); ++e) {
      s[e] = std::round(s[e] * 4) / 4;  // many ties within a row
      if (e % 7 == 3) s[e] = e % 2 ? T(0) : -T(0);
    }
    test::Bytes logits(s.size() * sizeof(T), 0);
    test::cuda_ok(cudaMemcpy(logits.data(), s.data(), s.size() * sizeof(T), cudaMemcpyHostToDevice), "upload");
    const ssr::ConstMatrixView<T> in{static_cast<const T*>(logits.data()), m, n};
    for (const auto& [cost, alpha] : {std::pair{ssr::Cost::linear, 0.4}, std::pair{ssr::Cost::softmax, 0.1}}) {
      ssr::RouteSpec soft;
      soft.path = ssr::Path::softmax;
      soft.cost = cost;
      soft.noise_alpha = alpha;
      const ssr::Context ctx = ssr::Context::train(3, 0, 5);
      soft.k = static_cast<int>(std::min<index_t>(n, 3));
      const std::size_t chosen = static_cast<std::size_t>(m * soft.k);
      test::Bytes ea(chosen * 4, 0xff), eb(chosen * 4, 0xff), wa(chosen * sizeof(T), 0xff), wb(chosen * sizeof(T), 0xff),
          na(s.size() * sizeof(T), 0xff), nb(s.size() * sizeof(T), 0xff);
      ssr::cuda::softmax_topk(in, soft, ctx,
                              ssr::MatrixView<std::int32_t>{static_cast<std::int32_t*>(ea.data()), m, soft.k},
                              ssr::MatrixView<T>{static_cast<T*>(wa.data()), m, soft.k},
                              ssr::MatrixView<T>{static_cast<T*>(na.data()), m, n}, cudaStream_t{});
      const ssr::RouteOutputs<T> out_b{{static_cast<std::int32_t*>(eb.data()), m, soft.k},
                                       {static_cast<T*>(wb.data()), m, soft.k},
                                       {},
                                       {},
                                       {static_cast<T*>(nb.data()), m, n}};
      alg::softmax_topk(thrust::cuda::par, soft, ctx, in, out_b);
      test::cuda_ok(cudaDeviceSynchronize(), "softmax top-k");
      INFO("n " << n << ", cost " << ssr::to_string(cost) << ", alpha " << alpha);
      CHECK(ea.read() == eb.read());
      CHECK(wa.read() == wb.read());
      CHECK(na.read() == nb.read());
    }
  }
}

std::vector<std::int32_t> as_ints(const test::Bytes& bytes) {
  const std::vector<unsigned char> raw = bytes.read();
  std::vector<std::int32_t> ints(raw.size() / 4);
  std::memcpy(ints.data(), raw.data(), ints.size() * 4);
  return ints;
}

__global__ void spin_until_set(volatile int* flag) {
  while (*flag == 0) __nanosleep(1000);
}

}  // namespace

TEST_CASE("half and bfloat16 logits route through Router as float logits of the same values", "[cuda]") {
  require_low_precision_routes_as_float<__half>();
  require_low_precision_routes_as_float<__nv_bfloat16>();
}

TEST_CASE("the fused softmax top-k gives the bits of the Thrust row items", "[cuda]") {
  require_fused_softmax_matches_row_items<float>();
  require_fused_softmax_matches_row_items<double>();
}

TEST_CASE("the cooperative Sinkhorn solve and its fallback of one launch a step give the same bits", "[cuda]") {
  for (const index_t n : {4, 16, 130}) {
    const index_t m = 3001, k = 2;
    const auto s = test::random_logits<float>(m, n, 2.0, 7, 1.0);
    ssr::Router<ssr::SinkhornTopK, ssr::CudaBackend<float>> router(
        ssr::SinkhornTopK(k, ssr::Cost::softmax, {0.1, 1e-6, 200}));
    DeviceCall<float> a(s, m, n, k), b(s, m, n, k);
    const auto ia = router.route(a.in(), Context::train(0), a.out(), Options{}.waiting());
    ssr::CudaTuning::force_sinkhorn_steps = true;
    const test::OnExit restore{[] { ssr::CudaTuning::force_sinkhorn_steps = false; }};
    const auto ib = router.route(b.in(), Context::train(0), b.out(), Options{}.waiting());
    INFO("n " << n);
    CHECK(ia.iterations > 1);
    CHECK(ia.iterations == ib.iterations);
    CHECK(ia.marginal_error == ib.marginal_error);
    CHECK(a.experts.read() == b.experts.read());
    CHECK(a.weights.read() == b.weights.read());
    CHECK(a.load.read() == b.load.read());
  }
}

TEST_CASE("columns in the log domain: the cooperative solve, its fallback and the CPU agree", "[cuda]") {
  // The last expert trails every token's first by 1e4: its column underflows and takes its potential from
  // the lanes of its logsumexp (LogLanes, then ColumnUpdate), on both GPU paths.
  for (const index_t n : {4, 16, 130}) {
    const index_t m = 3001, k = 2;
    auto s = test::random_logits<float>(m, n, 2.0, 8, 1.0);
    for (index_t i = 0; i < m; ++i)
      s[static_cast<std::size_t>(i * n + n - 1)] = s[static_cast<std::size_t>(i * n)] - 1e4f;
    const ssr::SinkhornTopK policy(k, ssr::Cost::linear, {1.0, 1e-6, 200});
    ssr::Router<ssr::SinkhornTopK, ssr::CudaBackend<float>> router(policy);
    DeviceCall<float> a(s, m, n, k), b(s, m, n, k);
    const auto ia = router.route(a.in(), Context::train(0), a.out(), Options{}.waiting());
    ssr::CudaTuning::force_sinkhorn_steps = true;
    const test::OnExit restore{[] { ssr::CudaTuning::force_sinkhorn_steps = false; }};
    const auto ib = router.route(b.in(), Context::train(0), b.out(), Options{}.waiting());
    const auto host = test::route(policy, s, m, n, Context::train(0));
    INFO("n " << n);
    CHECK(ia.converged);
    CHECK(ia.iterations == ib.iterations);
    CHECK(ia.marginal_error == ib.marginal_error);
    CHECK(a.experts.read() == b.experts.read());
    CHECK(a.weights.read() == b.weights.read());
    const std::vector<unsigned char> bytes = a.load.read();
    std::vector<std::int32_t> load(static_cast<std::size_t>(n));
    std::memcpy(load.data(), bytes.data(), bytes.size());
    CHECK(load == host.load);
    CHECK(load[static_cast<std::size_t>(n - 1)] > 0);
    CHECK(std::abs(ia.iterations - host.info.iterations) <= 1);
  }
}

TEST_CASE("a call runs on the caller's stream and puts nothing on the default stream", "[cuda][stream]") {
  const index_t m = 5000, n = 16, k = 2;
  const auto s = test::random_logits<float>(m, n, 1.0, 4, 2.0);
  cudaStream_t stream;
  test::cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  ssr::Router<ssr::SSRPolicy, ssr::CudaBackend<float>> router(ssr::make_ssr(k, ssr::Cost::linear, 1.0, {0.5, 1e-6, 100}, 0.1));
  DeviceCall<float> call(s, m, n, k);
  const auto expected = test::route(router.policy(), s, m, n, Context::train(0));
  router.route(call.in(), Context::train(0), call.out(), Options{}.on(stream).waiting());  // warm-up: workspace, tuning

  // The legacy default stream waits on a flag the host sets: any work of the call queued there would wait too.
  int* flag = nullptr;
  test::cuda_ok(cudaHostAlloc(&flag, sizeof(int), cudaHostAllocMapped), "cudaHostAlloc");
  *flag = 0;
  int* device_flag = nullptr;
  test::cuda_ok(cudaHostGetDevicePointer(&device_flag, flag, 0), "device pointer");
  spin_until_set<<<1, 1, 0, 0>>>(device_flag);
  std::atomic<bool> finished{false};
  std::thread watchdog([&] {  // a call stuck behind the spinner is released after 20 s, and fails below
    for (int t = 0; t < 200 && !finished; ++t) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    *static_cast<volatile int*>(flag) = 1;
  });
  const auto start = std::chrono::steady_clock::now();
  ssr::RouteInfo info = router.route(call.in(), Context::train(0), call.out(), Options{}.on(stream));  // checked
  router.wait(info, Options{}.on(stream));
  std::vector<std::int32_t> experts(static_cast<std::size_t>(m * k));
  test::cuda_ok(cudaMemcpyAsync(experts.data(), call.experts.data(), experts.size() * 4, cudaMemcpyDeviceToHost, stream), "copy");
  test::cuda_ok(cudaStreamSynchronize(stream), "sync");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  finished = true;
  watchdog.join();
  *static_cast<volatile int*>(flag) = 1;
  test::cuda_ok(cudaDeviceSynchronize(), "spinner");
  CHECK(seconds < 10);
  CHECK(info.iterations == expected.info.iterations);
  CHECK(experts == expected.experts);
  cudaFreeHost(flag);
  cudaStreamDestroy(stream);
}

TEST_CASE("unchecked calls are captured in a CUDA graph and replay exactly", "[cuda][graph]") {
  const index_t m = 4096, n = 16, k = 2;
  const auto s = test::random_logits<float>(m, n, 1.0, 6, 3.0);
  cudaStream_t stream;
  test::cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  // The softmax path, and a Sinkhorn solve of a fixed 20 iterations (a tolerance it cannot reach).
  for (const double p : {0.0, 1.0}) {
    const auto policy = ssr::make_ssr(k, ssr::Cost::linear, p, {0.5, 1e-300, 20}, 0.1);
    ssr::Router<ssr::SSRPolicy, ssr::CudaBackend<float>> router(policy);
    const auto expected = test::route(policy, s, m, n, Context::train(2));
    DeviceCall<float> call(s, m, n, k);
    const auto options = Options{}.on(stream).unchecked();
    router.route(call.in(), Context::train(2), call.out(), options);  // warm-up: the workspace is allocated here
    test::cuda_ok(cudaStreamSynchronize(stream), "warm-up");
    const auto held = router.backend().held_workspace_bytes();

    // Global capture mode: a cudaMalloc, a host wait or work on another stream would end the capture in an error.
    cudaGraph_t graph;
    test::cuda_ok(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), "begin capture");
    const ssr::RouteInfo info = router.route(call.in(), Context::train(2), call.out(), options);
    test::cuda_ok(cudaStreamEndCapture(stream, &graph), "end capture");
    cudaGraphExec_t exec;
    test::cuda_ok(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
    test::cuda_ok(cudaMemsetAsync(call.experts.data(), 0xff, m * k * 4, stream), "clear");
    test::cuda_ok(cudaGraphLaunch(exec, stream), "launch");
    test::cuda_ok(cudaStreamSynchronize(stream), "replay");
    INFO("p " << p);
    CHECK(router.backend().held_workspace_bytes() == held);
    std::vector<std::int32_t> experts(static_cast<std::size_t>(m * k));
    test::cuda_ok(cudaMemcpy(experts.data(), call.experts.data(), experts.size() * 4, cudaMemcpyDeviceToHost), "copy");
    CHECK(experts == expected.experts);
    if (p == 1.0) {
      REQUIRE(!info.complete());
      ssr::SolveStats stats{};
      test::cuda_ok(cudaMemcpy(&stats, info.pending, sizeof stats, cudaMemcpyDeviceToHost), "stats");
      CHECK(stats.iterations == 20);
      CHECK(stats.converged == 0);
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
  cudaStreamDestroy(stream);
}

TEST_CASE("two backends give the same bits: no order of addition depends on scheduling", "[cuda]") {
  const index_t m = 24576, n = 16;
  const auto s = test::random_logits<float>(m, n, 1.0, 9, 3.0);
  const auto policy = ssr::SinkhornTopK(2, ssr::Cost::softmax, {0.1, 1e-6, 100});
  const auto a = test::route(policy, s, m, n, Context::train(1)), b = test::route(policy, s, m, n, Context::train(1));
  CHECK(a.weights == b.weights);
  CHECK(a.plan == b.plan);
  CHECK(a.info.marginal_error == b.info.marginal_error);
}

TEST_CASE("a CUDA runtime failure is an ssr::cuda::CudaError, a RuntimeError and no argument error", "[cuda]") {
  try {
    ssr::cuda::check(cudaErrorMemoryAllocation, "a test");
    FAIL("no error");
  } catch (const ssr::cuda::CudaError& e) {
    CHECK(e.code() == cudaErrorMemoryAllocation);
    CHECK(std::string(e.what()).find("CUDA error in a test") != std::string::npos);
  }
  // A valid shape whose own workspace the device cannot hold (2^36 x 16 floats, unchecked so that nothing
  // reads the logits first): the allocation fails with the outputs untouched, and the router works after.
  DeviceCall<float> call(std::vector<float>(64 * 16, 0.5f), 64, 16, 2);
  ssr::Router<ssr::SinkhornTopK, ssr::CudaBackend<float>> router(ssr::SinkhornTopK(2));
  const index_t huge = index_t{1} << 36;
  const ssr::RouteOutputs<float> out{{static_cast<std::int32_t*>(call.experts.data()), huge, 2},
                                     {static_cast<float*>(call.weights.data()), huge, 2}};
  CHECK_THROWS_AS(router.route({static_cast<const float*>(call.logits.data()), huge, 16}, Context::train(0), out,
                               Options{}.unchecked()),
                  ssr::RuntimeError);
  cudaGetLastError();  // the failed allocation's error is not sticky; clear it for what follows
  const auto info = router.route(call.in(), Context::train(0), call.out(), Options{}.waiting());
  CHECK(info.path == ssr::Path::sinkhorn);
}

TEST_CASE("the own workspace grows after its last call's stream is destroyed", "[cuda][workspace]") {
  const index_t n = 16, k = 2;
  ssr::Router<ssr::SinkhornTopK, ssr::CudaBackend<float>> router{ssr::SinkhornTopK(k)};
  for (const index_t m : {500, 20000}) {  // the second call needs more: the block of the first is freed
    const auto s = test::random_logits<float>(m, n, 1.0, 12, 2.0);
    cudaStream_t stream;
    test::cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
    DeviceCall<float> call(s, m, n, k);
    const auto info = router.route(call.in(), Context::train(0), call.out(), Options{}.on(stream).waiting());
    test::cuda_ok(cudaStreamDestroy(stream), "destroy");  // before the next call, which grows the workspace
    const auto expected = test::route(router.policy(), s, m, n, Context::train(0));
    INFO("m " << m);
    CHECK(info.iterations == expected.info.iterations);
    CHECK(as_ints(call.experts) == expected.experts);
  }
  test::cuda_ok(cudaDeviceSynchronize(), "after");
}

TEST_CASE("a call whose own workspace must grow inside a capture fails naming the remedy", "[cuda][workspace]") {
  const index_t m = 1000, n = 16, k = 2;
  const auto s = test::random_logits<float>(m, n, 1.0, 13, 2.0);
  cudaStream_t stream;
  test::cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  ssr::Router<ssr::SinkhornTopK, ssr::CudaBackend<float>> router{ssr::SinkhornTopK(k)};
  DeviceCall<float> call(s, m, n, k);
  cudaGraph_t graph = nullptr;
  test::cuda_ok(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), "begin capture");
  CHECK_THROWS_WITH(router.route(call.in(), Context::train(0), call.out(), Options{}.on(stream).unchecked()),
                    Catch::Matchers::Contains("make one call of this shape on the device before capturing") &&
                        Catch::Matchers::Contains("CallOptions::using_workspace"));
  cudaStreamEndCapture(stream, &graph);
  if (graph != nullptr) cudaGraphDestroy(graph);
  (void)cudaGetLastError();
  CHECK(router.backend().held_workspace_bytes() == 0);
  // Warmed up outside the capture, the same call is captured.
  router.route(call.in(), Context::train(0), call.out(), Options{}.on(stream).unchecked().waiting());
  test::cuda_ok(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), "begin capture");
  CHECK_NOTHROW(router.route(call.in(), Context::train(0), call.out(), Options{}.on(stream).unchecked()));
  test::cuda_ok(cudaStreamEndCapture(stream, &graph), "end capture");
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

TEST_CASE("the solve of one launch a step, on a stream of its own above 608 experts, stops once it converges",
          "[cuda][stream]") {
  const index_t m = 4096, n = 1024, k = 8;
  const auto s = test::random_logits<float>(m, n, 1.0, 14, 2.0);
  const ssr::SinkhornTopK policy(k, ssr::Cost::softmax, {0.5, 1e-4, 1000});
  ssr::Router<ssr::SinkhornTopK, ssr::CudaBackend<float>> router(policy);
  cudaStream_t stream;
  test::cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  DeviceCall<float> a(s, m, n, k), b(s, m, n, k);
  const auto ia = router.route(a.in(), Context::train(0), a.out(), Options{}.on(stream).waiting());
  ssr::CudaTuning::force_sinkhorn_steps = true;
  const test::OnExit restore{[] { ssr::CudaTuning::force_sinkhorn_steps = false; }};
  const auto start = std::chrono::steady_clock::now();
  const auto ib = router.route(b.in(), Context::train(0), b.out(), Options{}.on(stream));
  CHECK(ib.complete());  // the host read the decision, so no launch was queued past it
  test::cuda_ok(cudaStreamSynchronize(stream), "sync");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  REQUIRE(ia.converged);
  CHECK(ia.iterations < 1000);
  CHECK(ib.iterations == ia.iterations);
  CHECK(ib.marginal_error == ia.marginal_error);
  CHECK(a.experts.read() == b.experts.read());
  CHECK(a.weights.read() == b.weights.read());
  CHECK(seconds < 10);
  cudaStreamDestroy(stream);
}

TEST_CASE("calls on two devices each get their own workspace on that device", "[cuda][workspace]") {
  int devices = 0;
  test::cuda_ok(cudaGetDeviceCount(&devices), "device count");
  if (devices < 2) {
    WARN("one device: not run");
    return;
  }
  const index_t m = 3000, n = 16, k = 2;
  const auto s = test::random_logits<float>(m, n, 1.0, 15, 2.0);
  ssr::Router<ssr::SinkhornTopK, ssr::CudaBackend<float>> router{ssr::SinkhornTopK(k)};
  const auto expected = test::route(router.policy(), s, m, n, Context::train(0));
  for (const int device : {0, 1, 0}) {
    test::cuda_ok(cudaSetDevice(device), "cudaSetDevice");
    DeviceCall<float> call(s, m, n, k);
    router.route(call.in(), Context::train(0), call.out(), Options{}.waiting());
    INFO("device " << device);
    CHECK(as_ints(call.experts) == expected.experts);
  }
  test::cuda_ok(cudaSetDevice(0), "cudaSetDevice");
}
