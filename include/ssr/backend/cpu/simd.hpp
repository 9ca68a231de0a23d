// The CPU backend's vector forms of the scalar mathematics in ssr/math/, over rows padded to a multiple of
// CpuTuning::pad elements (aligned, so Eigen runs whole packets whatever the caller's alignment). Each
// mirrors one scalar definition, and tests/test_cpu_simd.cpp holds it to that definition:
//   kernel_row  = math::cost_row + math::kernel_row, bit for bit;
//   topk_row    = math::topk, the same experts in the same order;
//   exp_row     = std::exp within 2 float ulps (float), Eigen's exp (double);
//   pass_rows   = the scaled row update t = Q_i * v, r = sum t, plan row t / r, the same bits for every width.
#pragma once

#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "ssr/backend/cpu/tuning.hpp"
#include "ssr/math/cost.hpp"
#include "ssr/spec.hpp"
#include "ssr/view.hpp"

namespace ssr {
namespace cpu {

template <class T>
struct Simd {
  static constexpr index_t W = CpuTuning::pad;
  using Row = Eigen::Array<T, 1, Eigen::Dynamic>;
  using Chunk = Eigen::Array<T, W, 1>;
  using DChunk = Eigen::Array<double, W, 1>;
  // Rows of padded buffers start at multiples of W elements of an aligned workspace: 32-byte aligned.
  template <class A>
  using At = Eigen::Map<A, Eigen::Aligned32>;

  // out = exp(in) for np elements, a multiple of W. Floats: Cody-Waite reduction to r in [-ln2/2, ln2/2]
  // and a degree-7 polynomial (relative error below 1e-7), 2^k put in the exponent bits; inputs below -88
  // (-inf included) give 0 or the subnormals just above it, never NaN; NaN (unchecked non-finite logits)
  // is read as -88, so no conversion is undefined. Doubles: Eigen's exp.
  static void exp_row(const T* in, T* out, index_t np) {
    if constexpr (std::is_same<T, float>::value) {
      using Bits = Eigen::Array<std::int32_t, W, 1>;
      for (index_t c = 0; c < np; c += W) {
        // Eigen's max follows std::max: max(-88, NaN) is -88.
        const Chunk x = Chunk::Constant(-88.0f).max(At<const Chunk>(in + c)).min(88.0f);
        const Chunk kf = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // round(x / ln2)
        const Chunk r = (x - kf * 0.693359375f) - kf * -2.12194440e-4f;
        Chunk y = r * 1.9875691500e-4f + 1.3981999507e-3f;
        y = y * r + 8.3334519073e-3f;
        y = y * r + 4.1665795894e-2f;
        y = y * r + 1.6666665459e-1f;
        y = y * r + 5.0000001201e-1f;
        const Chunk p = (y * r) * r + r + 1.0f;
        const Bits bits = (kf.template cast<std::int32_t>() + 127).template shiftLeft<23>();  // 2^k; 0 for k = -127
        Chunk scale;
        std::memcpy(scale.data(), bits.data(), sizeof(T) * W);
        At<Chunk>(out + c) = p * scale;
      }
    } else {
      for (index_t c = 0; c < np; c += W) At<Chunk>(out + c) = At<const Chunk>(in + c).exp();
    }
  }

  // Row i of the kernel padded with -inf: k[j] = math::kernel_value(x_j, math::kernel_shift(x), xi) with
  // x_j = math::cost_value(math::shifted_cost(S_ij), z_j), in chunks of W doubles. s_buf (np elements of
  // T) and x (np doubles) are scratch; z is the noise padded with zeros, or null.
  static void kernel_row(const T* s, index_t n, index_t np, const RouteSpec& spec, const double* z, T* s_buf, double* x,
                         T* kernel) {
    const double bound = math::cost_bound<T>(), xi = spec.sinkhorn.xi;
    if (n != np) {  // a padded copy, whose padding changes no maximum
      std::copy(s, s + n, s_buf);
      std::fill(s_buf + n, s_buf + np, -std::numeric_limits<T>::infinity());
      s = s_buf;
    }
    using In = Eigen::Map<const Chunk>;  // the caller's rows may lie anywhere
    Chunk smax = In(s);
    for (index_t c = W; c < np; c += W) smax = smax.max(In(s + c));  // exact: any order gives the same
    const auto top = static_cast<double>(smax.maxCoeff());
    // Without noise the row's largest x is the +0 of its top element, so the kernel shift
    // max(-bound, max x) is 0 and K = clamp(x / xi) needs no second pass: (x - 0) / xi is x / xi.
    // Each Eigen expression holds one scalar type, so that it runs in packets; conversions are plain loops.
    if (spec.cost == Cost::linear && !z) {
      for (index_t c = 0; c < np; c += W) {
        DChunk xc;
        for (index_t l = 0; l < W; ++l) xc[l] = static_cast<double>(s[c + l]);
        xc = ((xc - top).max(-bound).min(bound) / xi).max(-bound).min(0.0);
        for (index_t l = 0; l < W; ++l) kernel[c + l] = static_cast<T>(xc[l]);
      }
    } else {
      if (spec.cost == Cost::linear) {
        for (index_t j = 0; j < np; ++j) x[j] = static_cast<double>(s[j]);
        for (index_t c = 0; c < np; c += W) At<DChunk>(x + c) -= top;
      } else {
        double sum = 0;
        for (index_t j = 0; j < n; ++j) sum += (x[j] = std::exp(static_cast<double>(s[j]) - top));
        std::fill(x + n, x + np, -std::numeric_limits<double>::infinity());  // stays -inf: -inf / sum - shift
        const double shift = 1.0 / sum;
        for (index_t c = 0; c < np; c += W) At<DChunk>(x + c) = At<const DChunk>(x + c) / sum - shift;
      }
      // The padding's x is -inf before clamping and -bound after: it changes no maximum, even where noise
      // pushes every real x of the row below the softmax cost's -1/sum (found by fuzz_route).
      DChunk xmax = DChunk::Constant(-bound);
      for (index_t c = 0; c < np; c += W) {
        DChunk xc = At<const DChunk>(x + c).max(-bound).min(bound);
        if (z) xc = (xc + At<const DChunk>(z + c).max(-bound).min(bound)).max(-bound).min(bound);
        At<DChunk>(x + c) = xc;
        xmax = xmax.max(xc);
      }
      const double xtop = xmax.maxCoeff();
      for (index_t c = 0; c < np; c += W)
        At<DChunk>(x + c) = ((At<const DChunk>(x + c) - xtop) / xi).max(-bound).min(0.0);
      for (index_t j = 0; j < np; ++j) kernel[j] = static_cast<T>(x[j]);
    }
    for (index_t j = n; j < np; ++j) kernel[j] = -std::numeric_limits<T>::infinity();
  }

  // math::topk over a padded row whose padding never exceeds a real element (0 after real elements >= 0,
  // or -inf). For small k, k rounds of a vector maximum, each taking the first index that attains it (the
  // lower index wins ties) and setting it aside; x is restored after. Otherwise insertion, where a chunk
  // of W elements none of which beats the current k-th is skipped with one vector maximum.
  static void topk_row(T* x, index_t n, index_t np, int k, std::int32_t* idx) {
    if (k <= 4) {
      T kept[4];
      int r = 0;
      for (; r < k; ++r) {
        Chunk top = At<const Chunk>(x);
        for (index_t c = W; c < np; c += W) top = top.max(At<const Chunk>(x + c));
        const T best = top.maxCoeff();
        index_t j = 0;
        if (n <= 32) {  // short rows: a scan without branches, from the end so the first match stays
          j = n;
          for (index_t l = n; l-- > 0;) j = x[l] == best ? l : j;
        } else {
          while (j < n && !(x[j] == best)) ++j;
        }
        if (j == n) break;  // only padding left: cannot happen, as real elements are at least the padding
        idx[r] = static_cast<std::int32_t>(j);
        kept[r] = x[j];
        x[j] = -std::numeric_limits<T>::infinity();
      }
      for (int l = 0; l < r; ++l) x[idx[l]] = kept[l];
      if (r == k) return;
    }
    int count = 0;
    for (index_t j0 = 0; j0 < n; j0 += W) {
      if (count == k && !(At<const Chunk>(x + j0).maxCoeff() > x[idx[k - 1]])) continue;
      for (index_t j = j0; j < std::min(n, j0 + W); ++j) {
        const T value = x[j];
        if (count == k && !(value > x[idx[k - 1]])) continue;
        int pos = count < k ? count++ : k - 1;
        while (pos > 0 && value > x[idx[pos - 1]]) {
          idx[pos] = idx[pos - 1];
          --pos;
        }
        idx[pos] = static_cast<std::int32_t>(j);
      }
    }
  }

  // Rows [i0, i1) of one scaled pass: t = Q_i * v, r = sum t (into row_sum), and the block's column sums
  // of the plan rows t / r (into part, np elements). The common widths (C chunks a row) keep v and the
  // sums in registers; C = 0 takes any width. All do the same operations in the same order.
  template <int C>
  static void pass_rows(const T* q, const T* v, index_t np, index_t i0, index_t i1, T* row_sum, T* part) {
    if constexpr (C > 0) {
      Chunk vc[C], acc_part[C];
      for (int c = 0; c < C; ++c) {
        vc[c] = At<const Chunk>(v + c * W);
        acc_part[c].setZero();
      }
      for (index_t i = i0; i < i1; ++i) {
        const T* qrow = q + i * np;
        Chunk t[C];
        Chunk acc = Chunk::Zero();
        for (int c = 0; c < C; ++c) {
          t[c] = At<const Chunk>(qrow + c * W) * vc[c];
          acc += t[c];
        }
        const T r = acc.sum();  // >= exp(-bound): Q has a 1 in the row
        const T inv = T(1) / r;
        for (int c = 0; c < C; ++c) acc_part[c] += t[c] * inv;
        row_sum[i] = r;
      }
      for (int c = 0; c < C; ++c) At<Chunk>(part + c * W) = acc_part[c];
    } else {
      std::fill(part, part + np, T(0));
      for (index_t i = i0; i < i1; ++i) {
        const T* qrow = q + i * np;
        Chunk acc = Chunk::Zero();
        for (index_t c = 0; c < np; c += W) acc += At<const Chunk>(qrow + c) * At<const Chunk>(v + c);
        const T r = acc.sum();
        const T inv = T(1) / r;
        for (index_t c = 0; c < np; c += W)
          At<Chunk>(part + c) += (At<const Chunk>(qrow + c) * At<const Chunk>(v + c)) * inv;
        row_sum[i] = r;
      }
    }
  }

  // pass_rows with the width picked at run time: the widths with a register form take it.
  static void pass(const T* q, const T* v, index_t np, index_t i0, index_t i1, T* row_sum, T* part) {
    switch (np / W) {
      case 1:
        pass_rows<1>(q, v, np, i0, i1, row_sum, part);
        break;
      case 2:
        pass_rows<2>(q, v, np, i0, i1, row_sum, part);
        break;
      default:
        pass_rows<0>(q, v, np, i0, i1, row_sum, part);
        break;
    }
  }
};

}  // namespace cpu
}  // namespace ssr
