// Independent references for the property tests, written from DESIGN section 1 and the papers rather
// than from the library: the costs c(S), a straightforward log-domain Sinkhorn with the library's stopping
// rule, and the cost noise drawn from Random123's Philox4x32-10 by a Box-Muller transform in long double.
#pragma once

#include <Random123/philox.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include <ssr/spec.hpp>

namespace test {

// c(S) in double: S itself (linear) or the row softmax (softmax).
inline std::vector<double> reference_costs(const std::vector<double>& s, ssr::index_t m, ssr::index_t n,
                                           ssr::Cost cost) {
  std::vector<double> c(s.size());
  for (ssr::index_t i = 0; i < m; ++i) {
    const double* row = &s[static_cast<std::size_t>(i * n)];
    const double top = *std::max_element(row, row + n);
    double z = 0;
    for (ssr::index_t j = 0; j < n; ++j) z += std::exp(row[j] - top);
    for (ssr::index_t j = 0; j < n; ++j)
      c[static_cast<std::size_t>(i * n + j)] = cost == ssr::Cost::linear ? row[j] : std::exp(row[j] - top) / z;
  }
  return c;
}

// What reference_sinkhorn returns: the plan (m x n), the iterations it ran and its last error.
struct ReferenceSolve {
  std::vector<double> plan;
  int iterations = 0;
  double err = 0;
};

// Entropic OT of the costs c (m x n) at xi, every update a full log-sum-exp over a row or a column. An
// iteration makes the rows exact (f), then measures err = sum_j |colsum_j - m/n| / m; it stops when
// err < tol or after max_iters iterations, else sets g so that the columns sum to m/n. The plan is the
// last iteration's, rows exact.
inline ReferenceSolve reference_sinkhorn(const std::vector<double>& c, ssr::index_t m, ssr::index_t n, double xi,
                                         double tol, int max_iters) {
  const auto at = [n](ssr::index_t i, ssr::index_t j) { return static_cast<std::size_t>(i * n + j); };
  const auto lse = [](const std::vector<double>& v) {
    const double top = *std::max_element(v.begin(), v.end());
    double sum = 0;
    for (double x : v) sum += std::exp(x - top);
    return top + std::log(sum);
  };
  std::vector<double> f(static_cast<std::size_t>(m)), g(static_cast<std::size_t>(n), 0.0);
  std::vector<double> row(static_cast<std::size_t>(n)), col(static_cast<std::size_t>(m));
  ReferenceSolve out;
  const double mass = static_cast<double>(m) / static_cast<double>(n);
  for (;;) {
    for (ssr::index_t i = 0; i < m; ++i) {
      for (ssr::index_t j = 0; j < n; ++j) row[j] = c[at(i, j)] / xi + g[j];
      f[i] = -lse(row);
    }
    ++out.iterations;
    double err = 0;
    std::vector<double> logsum(static_cast<std::size_t>(n));
    for (ssr::index_t j = 0; j < n; ++j) {
      for (ssr::index_t i = 0; i < m; ++i) col[i] = c[at(i, j)] / xi + f[i];
      logsum[j] = lse(col);
      err += std::abs(std::exp(logsum[j] + g[j]) - mass);
    }
    out.err = err / static_cast<double>(m);
    if (out.err < tol || out.iterations >= max_iters) break;
    for (ssr::index_t j = 0; j < n; ++j) g[j] = std::log(mass) - logsum[j];
  }
  out.plan.resize(c.size());
  for (ssr::index_t i = 0; i < m; ++i)
    for (ssr::index_t j = 0; j < n; ++j) out.plan[at(i, j)] = std::exp(c[at(i, j)] / xi + g[j] + f[i]);
  return out;
}

// Standard normal number `element` of the stream (seed, layer, step): Philox4x32-10 with key (seed, layer)
// and counter (block lo, block hi, step lo, step hi) for block = element / 4; its words w0..w3 as uniforms
// (w + 1/2) / 2^32 make two Box-Muller pairs, sqrt(-2 ln u0) (cos 2 pi u1, sin 2 pi u1) and the same of
// (u2, u3); the element is lane element % 4 of the four.
inline double reference_normal(std::uint32_t seed, std::uint32_t layer, std::uint64_t step, std::uint64_t element) {
  const std::uint64_t block = element / 4;
  const r123::Philox4x32::ctr_type ctr = {{static_cast<std::uint32_t>(block), static_cast<std::uint32_t>(block >> 32),
                                           static_cast<std::uint32_t>(step), static_cast<std::uint32_t>(step >> 32)}};
  const r123::Philox4x32::key_type key = {{seed, layer}};
  const auto words = r123::Philox4x32()(ctr, key);
  const std::size_t pair = static_cast<std::size_t>(element % 4) / 2;
  const long double u1 = (static_cast<long double>(words[2 * pair]) + 0.5L) / 4294967296.0L;
  const long double u2 = (static_cast<long double>(words[2 * pair + 1]) + 0.5L) / 4294967296.0L;
  const long double radius = std::sqrt(-2 * std::log(u1)), angle = 2 * 3.14159265358979323846264338327950288L * u2;
  return static_cast<double>(element % 2 == 0 ? radius * std::cos(angle) : radius * std::sin(angle));
}

}  // namespace test
