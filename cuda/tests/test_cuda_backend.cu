// CudaBackend against the CPU backend, on the GPU: the fused softmax top-k (float, and half / bfloat16
// logits against float logits rounded the same way) and the fused Sinkhorn solve, over a grid of shapes.
// Exit status 0 when every route agrees: identical experts and load; weights within 1e-6 (softmax, float),
// 1e-14 (softmax, double), 2e-6 (Sinkhorn, float) and 1e-10 (Sinkhorn, double).
// Built for sm_80 and sm_90 by CI (which has no GPU); run it where a GPU is.
#include <ssr/cuda/backend.cuh>
#include <ssr/router.hpp>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <thrust/device_vector.h>
#include <thrust/host_vector.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

namespace {

int failures = 0;

void expect(bool ok, const char* what, long m, long n) {
  if (!ok) {
    ++failures;
    std::printf("FAILED %s (m %ld, n %ld)\n", what, m, n);
  }
}

template <class T, class Policy>
void compare(const Policy& policy, ssr::index_t m, ssr::index_t n, double tol, unsigned seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<double> normal;
  std::vector<T> s(static_cast<std::size_t>(m * n));
  for (ssr::index_t e = 0; e < m * n; ++e) s[e] = static_cast<T>(normal(gen) - 3.0 * static_cast<double>(e % n) / n);
  const ssr::Context ctx = ssr::Context::train(3, 1, 7);
  const ssr::index_t k = policy.resolve(ctx).k;

  std::vector<std::int32_t> e_cpu(m * k), load_cpu(n);
  std::vector<T> w_cpu(m * k);
  ssr::Router<Policy, ssr::CpuBackend<T>> cpu(policy);
  cpu.route({s.data(), m, n}, ctx, {{e_cpu.data(), m, k}, {w_cpu.data(), m, k}, {load_cpu.data(), n}});

  thrust::device_vector<T> d_s(s.begin(), s.end()), d_w(m * k);
  thrust::device_vector<std::int32_t> d_e(m * k), d_load(n);
  ssr::Router<Policy, ssr::CudaBackend<T>> gpu(policy);
  gpu.route({thrust::raw_pointer_cast(d_s.data()), m, n}, ctx,
            {{thrust::raw_pointer_cast(d_e.data()), m, k}, {thrust::raw_pointer_cast(d_w.data()), m, k},
             {thrust::raw_pointer_cast(d_load.data()), n}});
  const thrust::host_vector<std::int32_t> e_gpu = d_e, load_gpu = d_load;
  const thrust::host_vector<T> w_gpu = d_w;
  // A second backend gives the same bits: no order of addition depends on scheduling.
  thrust::device_vector<T> d_w2(m * k);
  ssr::Router<Policy, ssr::CudaBackend<T>> again(policy);
  again.route({thrust::raw_pointer_cast(d_s.data()), m, n}, ctx,
              {{thrust::raw_pointer_cast(d_e.data()), m, k}, {thrust::raw_pointer_cast(d_w2.data()), m, k}});
  expect(thrust::host_vector<T>(d_w2) == w_gpu, "repeatable", m, n);
  bool experts_equal = true;
  double worst = 0;
  for (std::size_t i = 0; i < e_cpu.size(); ++i) {
    experts_equal = experts_equal && e_cpu[i] == e_gpu[i];
    worst = std::max(worst, std::abs(static_cast<double>(w_cpu[i]) - static_cast<double>(w_gpu[i])));
  }
  expect(experts_equal, "experts", m, n);
  if (worst > tol) std::printf("  weights differ by up to %.3g (tolerance %.3g)\n", worst, tol);
  expect(worst <= tol, "weights", m, n);
  expect(std::vector<std::int32_t>(load_gpu.begin(), load_gpu.end()) == load_cpu, "load", m, n);
}

// Half and bfloat16 logits route as float logits holding the same (rounded) values.
template <class Half>
void compare_low_precision(ssr::index_t m, ssr::index_t n, Half (*convert)(float), float (*back)(Half)) {
  std::mt19937 gen(11);
  std::normal_distribution<float> normal;
  std::vector<Half> h(m * n);
  std::vector<float> f(m * n);
  for (ssr::index_t e = 0; e < m * n; ++e) {
    h[e] = convert(normal(gen));
    f[e] = back(h[e]);
  }
  ssr::RouteSpec spec = ssr::SoftmaxTopK(2).resolve(ssr::Context::train(0));
  thrust::device_vector<Half> d_h(h.begin(), h.end());
  thrust::device_vector<float> d_f(f.begin(), f.end()), w_h(m * 2), w_f(m * 2);
  thrust::device_vector<std::int32_t> e_h(m * 2), e_f(m * 2);
  const auto ptr = [](auto& v) { return thrust::raw_pointer_cast(v.data()); };
  ssr::cuda::softmax_topk<Half, float>({ptr(d_h), m, n}, spec, {ptr(e_h), m, 2}, {ptr(w_h), m, 2}, {}, nullptr);
  ssr::cuda::softmax_topk<float, float>({ptr(d_f), m, n}, spec, {ptr(e_f), m, 2}, {ptr(w_f), m, 2}, {}, nullptr);
  cudaDeviceSynchronize();
  expect(thrust::host_vector<std::int32_t>(e_h) == thrust::host_vector<std::int32_t>(e_f), "low-precision experts", m, n);
  expect(thrust::host_vector<float>(w_h) == thrust::host_vector<float>(w_f), "low-precision weights", m, n);
}

}  // namespace

// --quick: a small grid, for compute-sanitizer runs.
int main(int argc, char** argv) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("no CUDA device\n");
    return 77;  // ctest SKIP_RETURN_CODE
  }
  const bool quick = argc > 1 && std::string(argv[1]) == "--quick";
  const std::vector<ssr::index_t> ms = quick ? std::vector<ssr::index_t>{300} : std::vector<ssr::index_t>{1000, 24576};
  const std::vector<ssr::index_t> ns = quick ? std::vector<ssr::index_t>{16, 100} : std::vector<ssr::index_t>{8, 16, 100, 128, 256, 512};
  for (ssr::index_t m : ms) {
    for (ssr::index_t n : ns) {
      // The fused kernel computes float weights in float arithmetic, the CPU in double: a few float ulps apart.
      compare<float>(ssr::SoftmaxTopK(2), m, n, 1e-6, 1);
      compare<float>(ssr::SoftmaxTopK(8), m, n, 1e-6, 2);
      compare<double>(ssr::SoftmaxTopK(2), m, n, 1e-14, 7);
      compare<float>(ssr::NoisyCost<ssr::SoftmaxTopK>(ssr::SoftmaxTopK(2), 0.2, 1.0), m, n, 1e-6, 3);
      compare<float>(ssr::SinkhornTopK(2), m, n, 2e-6, 4);
      compare<double>(ssr::SinkhornTopK(2, ssr::Cost::softmax, {0.1, 1e-6, 100}), m, n, 1e-10, 5);
      if (n >= 10) compare<float>(ssr::SoftmaxTopK(10), m, n, 1e-6, 6);  // k above the fused kernel's bound: the Thrust path
      compare_low_precision<__half>(m, n, __float2half, __half2float);
      compare_low_precision<__nv_bfloat16>(m, n, __float2bfloat16, __bfloat162float);
    }
  }
  std::printf("%d failures\n", failures);
  return failures == 0 ? 0 : 1;
}
