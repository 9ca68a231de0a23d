// The CPU Sinkhorn solver: stabilised scaling with absorption into log-domain potentials.
//
// The plan is Pi_ij = exp(K_ij + f_i + g_j), K = cost / xi with each row's maximum at 0. The solver keeps
// Q_ij = exp(K_ij + h_j - c_i) for an absorbed copy h of g and c_i = max_j (K_ij + h_j), and the scaling
// v = exp(g - h), so an iteration needs no exp: for each row, t = Q_i * v, r = sum t, the row's plan is
// t / r (row sum exactly 1, f_i = -(c_i + log r)), and t / r goes straight into the column sums, which give
// both the error and the next g. One pass over Q.
// Q <= 1 with a 1 in every row, and v stays within exp(+-bound): when some |g_j - h_j| grows past the
// bound, h absorbs g and Q is recomputed (one exp pass). So r never overflows or underflows. A column
// whose sum underflows is summed in the log domain: g_j = log(m/n) - logsumexp_i(K_ij + f_i).
// The setup builds K and Q row by row and makes the first pass on the way; the final plan, top-k and
// weights are the last pass's t / r, from Q and v without exp, except for rows whose chosen experts' Q
// underflowed, which are redone in the log domain.
#pragma once

#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "ssr/backend/cpu_tuning.hpp"
#include "ssr/detail/aligned.hpp"
#include "ssr/detail/cost.hpp"
#include "ssr/detail/parallel.hpp"
#include "ssr/detail/topk.hpp"
#include "ssr/detail/weights.hpp"
#include "ssr/spec.hpp"
#include "ssr/view.hpp"

namespace ssr {

template <class T>
class CpuSinkhorn {
 public:
  std::size_t workspace_bytes() const {
    return (logk_.capacity() + q_.capacity() + v_.capacity() + gt_.capacity() + ht_.capacity() + partial_.capacity() +
            scratch_.capacity() + row_top_.capacity() + row_sum_.capacity()) * sizeof(T) +
           (g_.capacity() + colsum_.capacity() + xbuf_.capacity()) * sizeof(double);
  }

  void solve(const RouteSpec& spec, ConstMatrixView<T> s, const RouteOutputs<T>& out, RouteInfo& info, int nt) {
    const index_t m = s.rows, n = s.cols, np = CpuTuning::padded(n);
    const index_t rows = CpuTuning::rows_per_block(n), blocks = (m + rows - 1) / rows;
    const auto mp = static_cast<std::size_t>(m * np), npz = static_cast<std::size_t>(np);
    T* logk = logk_.reserve(mp);
    T* q = q_.reserve(mp);
    T* v = v_.reserve(npz);
    T* gt = gt_.reserve(npz);  // g rounded to T: what both paths use
    T* ht = ht_.reserve(npz);  // h, the absorbed part of g
    T* partial = partial_.reserve(static_cast<std::size_t>(blocks * n));
    T* scratch = scratch_.reserve(4 * npz * static_cast<std::size_t>(nt));  // rows t, e, part and S per thread
    T* row_top = row_top_.reserve(static_cast<std::size_t>(m));  // c_i; f_i = -(row_top_i + log row_sum_i)
    T* row_sum = row_sum_.reserve(static_cast<std::size_t>(m));
    double* g = g_.reserve(static_cast<std::size_t>(n));
    double* colsum = colsum_.reserve(static_cast<std::size_t>(n));
    double* xbuf = xbuf_.reserve(2 * npz * static_cast<std::size_t>(nt));
    std::fill(g, g + n, 0.0);
    std::fill(gt, gt + np, T(0));
    std::fill(ht, ht + np, T(0));
    std::fill(v, v + n, T(1));
    std::fill(v + n, v + np, T(0));  // padding: t = Q * v is 0 there

    const double target = static_cast<double>(m) / static_cast<double>(n);
    // Below this a sum has lost precision to underflow, and the log domain takes over.
    const T tiny = static_cast<T>(std::sqrt(static_cast<double>(std::numeric_limits<T>::min())));
    bool done = false, absorb = false;
    int iterations = 0;
    double err = 0;

    SSR_OMP(parallel num_threads(nt))
    {
      const int tid = detail::thread_id();
      T* t_buf = scratch + 4 * tid * np;
      T* e_buf = t_buf + np;
      T* p_buf = e_buf + np;
      T* s_buf = p_buf + np;
      double* x = xbuf + 2 * np * tid;
      double* z = x + np;
      std::fill(z + n, z + np, 0.0);  // noise padding

      // One pass over the rows of block b: for each row t = Q_i * v, r = sum t, and the row's plan t / r
      // added into the block's column sums.
      auto pass = [&](index_t b) {
        const index_t i0 = b * rows, i1 = std::min(m, (b + 1) * rows);
        switch (np / W) {  // the common widths with their accumulators in registers; the same bits
          case 1: pass_block<1>(q, v, np, i0, i1, row_sum, p_buf); break;
          case 2: pass_block<2>(q, v, np, i0, i1, row_sum, p_buf); break;
          default: pass_block<0>(q, v, np, i0, i1, row_sum, p_buf); break;
        }
        std::copy(p_buf, p_buf + n, partial + b * n);
      };

      // K = cost / xi, padded with -inf; Q = exp(K) (h = 0, c = 0); and with it the first pass.
      SSR_OMP(for schedule(static))
      for (index_t b = 0; b < blocks; ++b) {
        for (index_t i = b * rows; i < std::min(m, (b + 1) * rows); ++i) {
          if (spec.noisy()) detail::noise_row(spec, i, n, z);
          T* krow = logk + i * np;
          kernel_row(s.row(i), n, np, spec, spec.noisy() ? z : nullptr, s_buf, x, krow);
          exp_row(krow, q + i * np, np);
          row_top[i] = T(0);
          if (!out.noise.empty()) {
            T* d = out.noise.row(i);
            for (index_t j = 0; j < n; ++j) d[j] = spec.noisy() ? static_cast<T>(z[j]) : T(0);
          }
        }
        pass(b);
      }

      // Row i in the log domain: a = K_i + g into t_buf, e = exp(a - max a) into e_buf; returns the sum
      // of e over the real columns, and max a in top.
      auto log_row = [&](index_t i, T& top) -> T {
        Aligned<Row> a(t_buf, 1, np), e(e_buf, 1, np);
        a = Aligned<const Row>(logk + i * np, 1, np) + Aligned<const Row>(gt, 1, np);
        top = a.maxCoeff();
        e = (a - top).exp();
        return e.head(n).sum();
      };

      for (;;) {
        SSR_OMP(single)
        {
          ++iterations;
          std::fill(colsum, colsum + n, 0.0);
          for (index_t b = 0; b < blocks; ++b)
            for (index_t j = 0; j < n; ++j) colsum[j] += partial[b * n + j];
          err = 0;
          for (index_t j = 0; j < n; ++j) err += std::abs(colsum[j] - target);
          err /= static_cast<double>(m);
          done = err < spec.sinkhorn.tol || iterations >= spec.sinkhorn.max_iters;
          if (!done) absorb = update_columns(logk, np, row_top, row_sum, m, n, target, tiny, colsum, g, gt, ht, v);
        }
        if (done) break;
        if (absorb) {
          SSR_OMP(for schedule(static))
          for (index_t i = 0; i < m; ++i) {
            Aligned<Row> a(t_buf, 1, np);
            a = Aligned<const Row>(logk + i * np, 1, np) + Aligned<const Row>(ht, 1, np);
            row_top[i] = a.maxCoeff();
            Aligned<Row>(q + i * np, 1, np) = (a - row_top[i]).exp();
          }
        }
        SSR_OMP(for schedule(static))
        for (index_t b = 0; b < blocks; ++b) pass(b);
      }

      // The plan of the last pass, t / r, from Q and v without exp: its top-k, weights and, when asked,
      // the plan itself. Where a chosen expert's Q has underflowed below tiny, the values near it have
      // lost precision and could tie, so that row is redone in the log domain, where the ranking is exact.
      SSR_OMP(for schedule(static))
      for (index_t i = 0; i < m; ++i) {
        std::int32_t* idx = out.experts.row(i);
        const T* qrow = q + i * np;
        for (index_t c = 0; c < np; c += W) At<Chunk>(t_buf + c) = At<const Chunk>(qrow + c) * At<const Chunk>(v + c);
        topk_row(t_buf, n, np, spec.k, idx);
        bool exact = true;
        for (int r = 0; r < spec.k; ++r) exact = exact && qrow[idx[r]] >= tiny;
        const T* p_row = t_buf;
        T inv = T(1) / row_sum[i];
        if (!exact) {
          T top;
          inv = T(1) / log_row(i, top);
          topk_row(t_buf, n, np, spec.k, idx);  // ranking by log Pi: exact where Pi would tie
          p_row = e_buf;
        }
        if (spec.weights == Weights::plan) {
          detail::plan_weights(p_row, idx, spec.k, out.weights.row(i));
        } else {
          detail::softmax_weights(s.row(i), idx, spec.k, out.weights.row(i));
        }
        if (!out.plan.empty()) {
          T* p = out.plan.row(i);
          for (index_t j = 0; j < n; ++j) p[j] = p_row[j] * inv;
        }
      }
    }
    info.iterations = iterations;
    info.marginal_error = err;
    info.converged = err < spec.sinkhorn.tol;
  }

 private:
  static constexpr index_t W = CpuTuning::pad;
  using Row = Eigen::Array<T, 1, Eigen::Dynamic>;
  using Chunk = Eigen::Array<T, W, 1>;
  using DChunk = Eigen::Array<double, W, 1>;
  // Rows of padded buffers start at multiples of W elements of an AlignedBuffer: 32-byte aligned.
  template <class A>
  using Aligned = Eigen::Map<A, Eigen::Aligned32>;
  template <class A>
  using At = Eigen::Map<A, Eigen::Aligned32>;

  // Rows [i0, i1) of one pass: t = Q_i * v, r = sum t (row_sum), part += t / r for the block's column sums.
  // C > 0: rows of C chunks, v and part held in registers; C = 0: any width, part in memory. Both do the
  // same operations in the same order.
  template <int C>
  static void pass_block(const T* q, const T* v, index_t np, index_t i0, index_t i1, T* row_sum, T* part_buf) {
    if constexpr (C > 0) {
      Chunk vc[C], part[C];
      for (int c = 0; c < C; ++c) {
        vc[c] = At<const Chunk>(v + c * W);
        part[c].setZero();
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
        for (int c = 0; c < C; ++c) part[c] += t[c] * inv;
        row_sum[i] = r;
      }
      for (int c = 0; c < C; ++c) At<Chunk>(part_buf + c * W) = part[c];
    } else {
      std::fill(part_buf, part_buf + np, T(0));
      for (index_t i = i0; i < i1; ++i) {
        const T* qrow = q + i * np;
        Chunk acc = Chunk::Zero();
        for (index_t c = 0; c < np; c += W) acc += At<const Chunk>(qrow + c) * At<const Chunk>(v + c);
        const T r = acc.sum();
        const T inv = T(1) / r;
        for (index_t c = 0; c < np; c += W) At<Chunk>(part_buf + c) += (At<const Chunk>(qrow + c) * At<const Chunk>(v + c)) * inv;
        row_sum[i] = r;
      }
    }
  }

  // out = exp(in) for np elements, a multiple of W. Floats: Cody-Waite reduction to r in [-ln2/2, ln2/2] and a degree-7
  // polynomial (relative error below 1e-7), 2^k put in the exponent bits; inputs below -88 (-inf
  // included) give 0 or the subnormals just above it, never NaN. Doubles: Eigen's exp.
  static void exp_row(const T* in, T* out, index_t np) {
    if constexpr (std::is_same<T, float>::value) {
      using Bits = Eigen::Array<std::int32_t, W, 1>;
      for (index_t c = 0; c < np; c += W) {
        const Chunk x = At<const Chunk>(in + c).max(-88.0f).min(88.0f);
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
        At<Chunk> o(out + c);
        o = p * scale;
      }
    } else {
      for (index_t c = 0; c < np; c += W) {
        At<Chunk> o(out + c);
        o = At<const Chunk>(in + c).exp();
      }
    }
  }

  // Row i of the kernel, K = clamp((x - max(-bound, max x)) / xi, -bound, 0) with x = clamp(c(S_i) - max c + z,
  // -bound, bound), padded with -inf: bit for bit detail::cost_row followed by detail::kernel_row, in
  // fixed-size chunks of doubles. s_buf (np elements of T) and x (np doubles) are scratch; z is the noise,
  // padded with zeros, or null.
  static void kernel_row(const T* s, index_t n, index_t np, const RouteSpec& spec, const double* z, T* s_buf, double* x,
                         T* k) {
    const double bound = detail::cost_bound<T>(), xi = spec.sinkhorn.xi;
    if (n != np) {  // a padded copy, whose padding changes no maximum
      std::copy(s, s + n, s_buf);
      std::fill(s_buf + n, s_buf + np, -std::numeric_limits<T>::infinity());
      s = s_buf;
    }
    using In = Eigen::Map<const Chunk>;  // the caller's rows may lie anywhere
    Chunk smax = In(s);
    for (index_t c = W; c < np; c += W) smax = smax.max(In(s + c));  // exact: any order gives the same
    const double top = static_cast<double>(smax.maxCoeff());
    // Without noise the row's maximum of x is the +0 of its top element, so max(-bound, max x) is 0 and
    // K = clamp(x / xi) needs no second pass; (x - 0) / xi and x / xi are the same bits.
    // Each Eigen expression holds one scalar type, so that it runs in packets; conversions are plain loops.
    if (spec.cost == Cost::linear && !z) {
      for (index_t c = 0; c < np; c += W) {
        DChunk xc;
        for (index_t l = 0; l < W; ++l) xc[l] = static_cast<double>(s[c + l]);
        xc = ((xc - top).max(-bound).min(bound) / xi).max(-bound).min(0.0);
        for (index_t l = 0; l < W; ++l) k[c + l] = static_cast<T>(xc[l]);
      }
    } else {
      if (spec.cost == Cost::linear) {
        for (index_t j = 0; j < np; ++j) x[j] = static_cast<double>(s[j]);
        for (index_t c = 0; c < np; c += W) At<DChunk>(x + c) -= top;
      } else {
        double sum = 0;
        for (index_t j = 0; j < n; ++j) sum += (x[j] = std::exp(static_cast<double>(s[j]) - top));
        std::fill(x + n, x + np, 0.0);
        const double shift = 1.0 / sum;
        for (index_t c = 0; c < np; c += W) At<DChunk>(x + c) = At<const DChunk>(x + c) / sum - shift;  // softmax minus 1/sum
      }
      // The padding's x is -inf or -1/sum before clamping and at most max x after, so it changes no maximum.
      DChunk xmax = DChunk::Constant(-bound);
      for (index_t c = 0; c < np; c += W) {
        DChunk xc = At<const DChunk>(x + c);
        if (z) xc += At<const DChunk>(z + c);
        xc = xc.max(-bound).min(bound);
        At<DChunk>(x + c) = xc;
        xmax = xmax.max(xc);
      }
      const double xtop = xmax.maxCoeff();
      for (index_t c = 0; c < np; c += W) At<DChunk>(x + c) = ((At<const DChunk>(x + c) - xtop) / xi).max(-bound).min(0.0);
      for (index_t j = 0; j < np; ++j) k[j] = static_cast<T>(x[j]);
    }
    for (index_t j = n; j < np; ++j) k[j] = -std::numeric_limits<T>::infinity();
  }

  // detail::topk_row over a padded row whose padding never exceeds a real element (0 after real
  // elements >= 0, or -inf): the same choice. For small k, k rounds of a vector maximum, each taking the
  // first index that attains it (the lower index wins ties) and setting it aside; x is restored after.
  // Otherwise insertion, where a chunk of W elements none of which beats the current k-th is skipped
  // with one vector maximum.
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

  // g_j += log(m/n) - log(column sum j), which makes every column sum m/n; a column whose sum underflowed
  // gets g_j = log(m/n) - logsumexp_i(K_ij + f_i) instead. Then gt and v follow; returns true when h
  // absorbed g, so Q must be recomputed.
  static bool update_columns(const T* logk, index_t np, const T* row_top, const T* row_sum, index_t m, index_t n,
                             double target, T tiny, const double* colsum, double* g, T* gt, T* ht, T* v) {
    const double log_target = std::log(target), bound = detail::cost_bound<T>();
    for (index_t j = 0; j < n; ++j) {
      if (colsum[j] >= static_cast<double>(tiny)) {
        g[j] += log_target - std::log(colsum[j]);
        continue;
      }
      auto log_entry = [&](index_t i) {  // K_ij + f_i
        return static_cast<double>(logk[i * np + j]) - static_cast<double>(row_top[i]) -
               std::log(static_cast<double>(row_sum[i]));
      };
      double top = -std::numeric_limits<double>::infinity();
      for (index_t i = 0; i < m; ++i) top = std::max(top, log_entry(i));
      double sum = 0;
      for (index_t i = 0; i < m; ++i) sum += std::exp(log_entry(i) - top);
      g[j] = log_target - top - std::log(sum);
    }
    bool absorb = false;
    for (index_t j = 0; j < n; ++j) {
      g[j] = detail::clamp(g[j], -2 * bound, 2 * bound);
      gt[j] = static_cast<T>(g[j]);
      absorb = absorb || std::abs(static_cast<double>(gt[j]) - static_cast<double>(ht[j])) > CpuTuning::absorb_bound<T>();
    }
    if (absorb) std::copy(gt, gt + n, ht);
    for (index_t j = 0; j < n; ++j) v[j] = static_cast<T>(std::exp(static_cast<double>(gt[j]) - static_cast<double>(ht[j])));
    return absorb;
  }

  detail::AlignedBuffer<T> logk_, q_, v_, gt_, ht_, partial_, scratch_, row_top_, row_sum_;
  detail::AlignedBuffer<double> g_, colsum_, xbuf_;
};

}  // namespace ssr
