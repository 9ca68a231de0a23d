// The cost noise alpha * eps_ij, eps ~ N(0, sigma^2): element (i, j) is number i * n + j of the call's
// Philox stream (seed, layer, step) of the call's Context, i the token's global row (Context::first_row +
// its row in the call), so every backend, thread count and sharding over ranks draws the same numbers.
#pragma once

#include <cstdint>

#include "ssr/context.hpp"
#include "ssr/detail/hd.hpp"
#include "ssr/math/numeric.hpp"
#include "ssr/random.hpp"
#include "ssr/spec.hpp"
#include "ssr/view.hpp"

namespace ssr {
namespace math {

// The stream element of the call's row `row` (from 0) and expert j.
SSR_HD inline std::uint64_t element_index(const Context& ctx, index_t row, index_t n, index_t j) {
  return (ctx.first_row + static_cast<std::uint64_t>(row)) * static_cast<std::uint64_t>(n) +
         static_cast<std::uint64_t>(j);
}

// alpha * eps of the call's element (row, j).
SSR_HD inline double noise_value(const RouteSpec& spec, const Context& ctx, index_t row, index_t n, index_t j) {
  return spec.noise_alpha * spec.noise_sigma *
         random::normal(ctx.seed, ctx.layer, ctx.step, element_index(ctx, row, n, j));
}

// z(j) = noise_value(spec, ctx, row, n, j) for the elements of a row, keeping the last block of four
// normals, so that a pass over the row in order draws each block once (random::normal draws a block to
// return one of it).
class RowNoise {
 public:
  SSR_HD RowNoise(const RouteSpec& spec, const Context& ctx, index_t row, index_t n)
      : ctx_(ctx), scale_(spec.noise_alpha * spec.noise_sigma), row_(row), n_(n) {}

  SSR_HD double operator()(index_t j) const {
    const std::uint64_t e = element_index(ctx_, row_, n_, j);
    if ((e >> 2) != loaded_) {
      loaded_ = e >> 2;
      random::normals4(ctx_.seed, ctx_.layer, ctx_.step, loaded_, block_);
    }
    return scale_ * block_[e & 3u];
  }

 private:
  Context ctx_;
  double scale_;
  index_t row_, n_;
  mutable double block_[4] = {0, 0, 0, 0};
  mutable std::uint64_t loaded_ = ~std::uint64_t{0};
};

// z[j] = noise_value(spec, ctx, row, n, j) for the n elements of a row, each block of four normals drawn once.
SSR_HD inline void noise_row(const RouteSpec& spec, const Context& ctx, index_t row, index_t n, double* z) {
  const RowNoise noise(spec, ctx, row, n);
  for (index_t j = 0; j < n; ++j) z[j] = noise(j);
}

// The noise output of a drawn z, in T: the noise the cost adds, which clamps it to [-B, B] (cost.hpp), so
// that a huge alpha writes no infinity.
template <class T>
SSR_HD T noise_output_value(double z) {
  const double bound = cost_bound<T>();
  return static_cast<T>(z < -bound ? -bound : (z > bound ? bound : z));
}

// The noise output of element j: z(j) where the call draws noise, 0 where it does not.
template <class T, class Noise>
SSR_HD T noise_output_at(const RouteSpec& spec, const Noise& z, index_t j) {
  return spec.noisy() ? noise_output_value<T>(z(j)) : T(0);
}

// The noise output of a row of n elements: out[j] = noise_output_at(j).
template <class T, class Noise>
SSR_HD void noise_output(const RouteSpec& spec, index_t n, const Noise& z, T* out) {
  for (index_t j = 0; j < n; ++j) out[j] = noise_output_at<T>(spec, z, j);
}

}  // namespace math
}  // namespace ssr
