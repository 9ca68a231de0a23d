// One MoE block's routing as a CUDA engine runs it (docs/howto-cuda-engine.md): the engine's stream, a
// workspace it allocates once, training calls that never wait for the GPU, the backward, and evaluation
// replayed from a CUDA graph. Experts, load, weights and dL/dS are compared with the CPU backend's on the
// same logits; the program exits 1 where they differ more than the GPU's guarantee allows, 77 without a GPU.
#include <ssr/backend/cpu.hpp>
#include <ssr/cuda/backend.cuh>
#include <ssr/random.hpp>
#include <ssr/router.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
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

template <class V>
V* device_copy(const std::vector<V>& host, cudaStream_t stream) {
  V* device = nullptr;
  check(cudaMallocAsync(&device, host.size() * sizeof(V), stream), "allocate");
  check(cudaMemcpyAsync(device, host.data(), host.size() * sizeof(V), cudaMemcpyHostToDevice, stream), "copy");
  return device;
}

// The largest difference between two arrays, relative to the magnitude of each value (at least 1).
double largest_difference(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, std::abs(double(a[i]) - double(b[i])) / std::max(1.0, std::abs(double(b[i]))));
  return worst;
}

template <class V>
std::vector<V> host_copy(const V* device, std::size_t count, cudaStream_t stream) {
  std::vector<V> host(count);
  check(cudaMemcpyAsync(host.data(), device, count * sizeof(V), cudaMemcpyDeviceToHost, stream), "copy back");
  check(cudaStreamSynchronize(stream), "synchronize");
  return host;
}

}  // namespace

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::puts("no CUDA device: nothing to run");
    return 77;
  }
  const ssr::index_t m = 8192, n = 64, k = 2;  // tokens of the micro-batch, experts, experts per token
  std::vector<float> logits(static_cast<std::size_t>(m * n));
  for (std::size_t i = 0; i < logits.size(); ++i)
    logits[i] = static_cast<float>(2 * ssr::random::normal(/*seed=*/7, 0, 0, i));

  // SSR-L with p = 0.1 here (the paper's 1e-3 would rarely show the Sinkhorn path in a few steps).
  const ssr::SSRPolicy policy = ssr::make_ssr(k, ssr::Cost::linear, /*p=*/0.1);
  ssr::Router<ssr::SSRPolicy, ssr::CudaBackend<float>> router(policy);
  ssr::Router<ssr::SSRPolicy, ssr::CpuBackend<float>> reference(policy);

  // The engine's stream and buffers; the workspace is sized once for either path, so no call allocates.
  cudaStream_t stream;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  float* d_logits = device_copy(logits, stream);
  std::int32_t *d_experts = nullptr, *d_load = nullptr;
  float *d_weights = nullptr, *d_grad_weights = nullptr, *d_grad_logits = nullptr;
  check(cudaMallocAsync(&d_experts, m * k * sizeof(std::int32_t), stream), "allocate");
  check(cudaMallocAsync(&d_load, n * sizeof(std::int32_t), stream), "allocate");
  check(cudaMallocAsync(&d_weights, m * k * sizeof(float), stream), "allocate");
  check(cudaMallocAsync(&d_grad_logits, m * n * sizeof(float), stream), "allocate");
  const std::vector<float> grad_weights(static_cast<std::size_t>(m * k), 1.0f / static_cast<float>(m));  // dL/dw
  d_grad_weights = device_copy(grad_weights, stream);
  const std::size_t bytes = router.workspace_bytes(m, n);
  void* workspace = nullptr;
  check(cudaMallocAsync(&workspace, bytes, stream), "allocate workspace");

  // The engine validated its logits: unchecked calls never wait for the GPU.
  const auto options = ssr::CallOptions<cudaStream_t>{}.on(stream).using_workspace({workspace, bytes}).unchecked();
  const ssr::RouteOutputs<float> out{{d_experts, m, k}, {d_weights, m, k}, {d_load, n}};
  std::vector<std::int32_t> experts(static_cast<std::size_t>(m * k)), load(static_cast<std::size_t>(n));
  std::vector<float> weights(static_cast<std::size_t>(m * k)), grad_logits(static_cast<std::size_t>(m * n));
  const ssr::RouteOutputs<float> host_out{{experts.data(), m, k}, {weights.data(), m, k}, {load.data(), n}};
  int differences = 0;

  for (std::uint64_t step = 0; step < 20; ++step) {
    const ssr::Context ctx = ssr::Context::train(step, /*layer=*/0);
    ssr::RouteInfo info = router.route({d_logits, m, n}, ctx, out, options);
    router.wait(info, options);  // only to print the solve's statistics: training needs no wait
    // ... the engine enqueues the dispatch and the experts on the stream here ...
    router.backward(info, {{}, {d_experts, m, k}, {d_weights, m, k}, {d_grad_weights, m, k}, {d_grad_logits, m, n}},
                    options);

    const ssr::RouteInfo expected = reference.route({logits.data(), m, n}, ctx, host_out);
    reference.backward(
        expected,
        {{}, {experts.data(), m, k}, {weights.data(), m, k}, {grad_weights.data(), m, k}, {grad_logits.data(), m, n}});
    // The GPU's guarantee (docs/backends.md): the same experts and load; values within what nvcc's fused
    // multiply-adds can move (2e-6 for the results of a solve), the iterations within one.
    const bool same_choice = host_copy(d_experts, experts.size(), stream) == experts &&
                             host_copy(d_load, load.size(), stream) == load &&
                             std::abs(info.iterations - expected.iterations) <= 1;
    const double apart =
        std::max(largest_difference(host_copy(d_weights, weights.size(), stream), weights),
                 largest_difference(host_copy(d_grad_logits, grad_logits.size(), stream), grad_logits));
    const bool agrees = same_choice && apart <= 2e-6;
    differences += agrees ? 0 : 1;
    std::printf("step %2llu: %-8s %2d iterations, experts and load %s, weights and dL/dS within %.1e of the CPU's\n",
                static_cast<unsigned long long>(step), ssr::to_string(info.path), info.iterations,
                same_choice ? "the CPU's" : "DIFFERENT", apart);
  }

  // Evaluation (softmax top-k, no noise, no coin) captured once in a graph and replayed each batch.
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), "begin capture");
  router.route({d_logits, m, n}, ssr::Context::eval(), out, options);
  check(cudaStreamEndCapture(stream, &graph), "end capture");
  check(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  check(cudaMemsetAsync(d_experts, 0xff, m * k * sizeof(std::int32_t), stream), "clear");
  check(cudaGraphLaunch(exec, stream), "replay");
  reference.route({logits.data(), m, n}, ssr::Context::eval(), host_out);
  const bool same = host_copy(d_experts, experts.size(), stream) == experts &&
                    largest_difference(host_copy(d_weights, weights.size(), stream), weights) <= 2e-6;
  differences += same ? 0 : 1;
  std::printf("evaluation from a CUDA graph: experts and weights %s the CPU's\n", same ? "agree with" : "DIFFER from");

  check(cudaGraphExecDestroy(exec), "destroy");
  check(cudaGraphDestroy(graph), "destroy");
  for (void* p : {static_cast<void*>(d_logits), static_cast<void*>(d_experts), static_cast<void*>(d_load),
                  static_cast<void*>(d_weights), static_cast<void*>(d_grad_weights), static_cast<void*>(d_grad_logits),
                  workspace})
    check(cudaFreeAsync(p, stream), "free");
  check(cudaStreamSynchronize(stream), "synchronize");
  check(cudaStreamDestroy(stream), "destroy stream");
  std::printf("%d difference(s) from the CPU backend\n", differences);
  return differences == 0 ? 0 : 1;
}
