// The CUDA kernel of torch.ops.ssr.replay_weights (replay.cpp): one thread a token, math::score_weights of
// its recorded experts' logits, on PyTorch's current stream. Nothing is read back, so that a replayed call
// can be captured in a CUDA graph: a token with an expert outside [0, n) gets NaN weights instead of a
// check that would wait for the device.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <torch/library.h>

#include <cstdint>
#include <limits>
#include <string>

#include <ssr/cuda/check.cuh>
#include <ssr/cuda/scalar.cuh>
#include <ssr/math/weights.hpp>
#include <ssr/named.hpp>

namespace ssr_torch {
namespace {

using at::Tensor;

template <class T, class In, class Index>
__global__ void replay_rows(const In* s, const Index* e, T* w, int64_t m, int64_t n, int64_t k, ssr::Score score) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= m) return;
  const In* row = s + i * n;
  const Index* chosen = e + i * k;
  T* out = w + i * k;
  bool valid = true;
  for (int64_t r = 0; r < k; ++r) valid = valid && chosen[r] >= 0 && chosen[r] < n;
  if (!valid) {
    for (int64_t r = 0; r < k; ++r) out[r] = std::numeric_limits<T>::quiet_NaN();
    return;
  }
  ssr::math::score_weights(
      score, static_cast<int>(k), [&](int r) { return ssr::detail::to_double(row[chosen[r]]); },
      [out](int r, double v) { out[r] = static_cast<T>(v); });
}

template <class T, class In>
void launch(const Tensor& s, const Tensor& e, Tensor& w, ssr::Score score, cudaStream_t stream) {
  const int64_t m = s.size(0), n = s.size(1), k = e.size(1);
  constexpr int threads = 256;
  const auto blocks = static_cast<unsigned>((m + threads - 1) / threads);
  const auto* logits = static_cast<const In*>(s.const_data_ptr());
  if (e.scalar_type() == at::kLong) {
    replay_rows<<<blocks, threads, 0, stream>>>(logits, e.const_data_ptr<int64_t>(), w.data_ptr<T>(), m, n, k, score);
  } else {
    replay_rows<<<blocks, threads, 0, stream>>>(logits, e.const_data_ptr<int32_t>(), w.data_ptr<T>(), m, n, k, score);
  }
  ssr::cuda::check(cudaGetLastError(), "replay_weights");
}

Tensor replay_weights_cuda(const Tensor& logits, const Tensor& experts, std::string score) {
  TORCH_CHECK(logits.dim() == 2 && experts.dim() == 2 && experts.size(0) == logits.size(0),
              "ssr.replay_weights: logits (tokens x experts) and experts (tokens x k) must be 2-d with the same "
              "tokens, got ",
              logits.sizes(), " and ", experts.sizes());
  const at::ScalarType type = logits.scalar_type();
  TORCH_CHECK(type == at::kFloat || type == at::kDouble || type == at::kHalf || type == at::kBFloat16,
              "ssr.replay_weights: logits on a GPU must be float32, float64, float16 or bfloat16, got ", type);
  TORCH_CHECK(experts.scalar_type() == at::kInt || experts.scalar_type() == at::kLong,
              "ssr.replay_weights: experts must be int32 or int64, got ", experts.scalar_type());
  TORCH_CHECK(experts.device() == logits.device(), "ssr.replay_weights: experts must be on the logits' device");
  const int64_t m = logits.size(0), n = logits.size(1), k = experts.size(1);
  TORCH_CHECK(k >= 1 && k <= n, "ssr.replay_weights: k = ", k, " experts a token, of ", n);
  ssr::Score route_score{};
  try {
    route_score = ssr::parse_score(score);
  } catch (const ssr::Error& err) {
    TORCH_CHECK(false, err.what());
  }
  const c10::cuda::CUDAGuard device(logits.device());
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream(logits.get_device()).stream();
  const Tensor s = logits.contiguous(), e = experts.contiguous();
  Tensor w = at::empty({m, k}, s.options().dtype(type == at::kDouble ? at::kDouble : at::kFloat));
  if (m == 0) return w;
  switch (type) {
    case at::kDouble:
      launch<double, double>(s, e, w, route_score, stream);
      break;
    case at::kHalf:
      launch<float, __half>(s, e, w, route_score, stream);
      break;
    case at::kBFloat16:
      launch<float, __nv_bfloat16>(s, e, w, route_score, stream);
      break;
    default:
      launch<float, float>(s, e, w, route_score, stream);
      break;
  }
  return w;
}

}  // namespace
}  // namespace ssr_torch

TORCH_LIBRARY_IMPL(ssr, CUDA, m) { m.impl("replay_weights", &ssr_torch::replay_weights_cuda); }
