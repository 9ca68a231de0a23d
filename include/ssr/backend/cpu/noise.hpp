// The CPU backend's cost noise of rows, several Philox blocks at a time, into tiles by columns (a tile's
// column of eight rows, then the next column: the layout of Simd::load_tiles): math::noise_row's values, bit
// for bit, written once over GNU vectors (lanes.hpp) of L blocks, and with AVX2 and FMA or AVX-512 where a
// baseline x86-64 build runs on a processor that has them.
//
// Each lane draws one block of four normals: Philox4x32-10 (Random123's rounds and constants, its 32-bit
// words held in 64-bit lanes), the uniforms as random::uniform_open takes them, then the two Box-Muller
// pairs of math::normal_pair_of, whose formula is written over lanes; each normal is multiplied by alpha *
// sigma as math::noise_row does. A few draws' uniforms are taken before their normals. The callers draw
// tiles of rows at once: a row alone (n / 4 blocks) would fill half an AVX-512 vector at n = 16.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "ssr/backend/cpu/lanes.hpp"
#include "ssr/math/noise.hpp"
#include "ssr/math/normal_pair.hpp"
#include "ssr/random.hpp"
#include "ssr/spec.hpp"
#include "ssr/view.hpp"

namespace ssr {
namespace cpu {
namespace noise {
inline namespace SSR_LANES_NAMESPACE {

// y = sqrt(x) in each of L lanes (std::sqrt a lane: correctly rounded everywhere; its errno branch keeps
// the loop a lane at a time).
template <int L>
struct SqrtLanes {
  using D = typename lanes::Doubles<L>::Double;
  SSR_LANES_INLINE void operator()(D& y, const D& x) const {
    double a[L];
    std::memcpy(a, &x, sizeof a);
    for (int l = 0; l < L; ++l) a[l] = std::sqrt(a[l]);
    std::memcpy(&y, a, sizeof a);
  }
};

// One vsqrtpd of 4 or 8 doubles (and below, one vpmuludq): functions of their own, which the always-inlined
// formula calls (lanes.hpp's SSR_LANES_AVX2 and SSR_LANES_AVX512: for the paths a baseline build takes at
// run time, or as the build's own code where its target has the instructions).
#if defined(SSR_LANES_AVX2)
SSR_LANES_AVX2 inline void sqrt_avx2(lanes::Doubles<4>::Double& y, const lanes::Doubles<4>::Double& x) {
  __m256d v;
  std::memcpy(&v, &x, sizeof v);
  v = _mm256_sqrt_pd(v);
  std::memcpy(&y, &v, sizeof v);
}
struct SqrtAvx2 {
  SSR_LANES_INLINE void operator()(lanes::Doubles<4>::Double& y, const lanes::Doubles<4>::Double& x) const {
    sqrt_avx2(y, x);
  }
};
#endif
#if defined(SSR_LANES_AVX512)
SSR_LANES_AVX512 inline void sqrt_avx512(lanes::Doubles<8>::Double& y, const lanes::Doubles<8>::Double& x) {
  __m512d v;
  std::memcpy(&v, &x, sizeof v);
  v = _mm512_mask_sqrt_pd(v, 0xff, v);  // every lane (_mm512_sqrt_pd reads an undefined vector: GCC 12 warns)
  std::memcpy(&y, &v, sizeof v);
}
struct SqrtAvx512 {
  SSR_LANES_INLINE void operator()(lanes::Doubles<8>::Double& y, const lanes::Doubles<8>::Double& x) const {
    sqrt_avx512(y, x);
  }
};
#endif

// y = (a mod 2^32) * b in each of L 64-bit lanes, b < 2^32: Philox's products, whose operands fit in 32 bits.
// GCC makes a 64-bit product of these vectors (vpmullq, three micro-operations and 15 cycles with AVX-512;
// three vpmuludq and their shifts with AVX2), where one vpmuludq does: MulAvx2 and MulAvx512 take it.
template <int L>
struct MulLow {
  using U = typename lanes::Doubles<L>::Bits;
  SSR_LANES_INLINE void operator()(U& y, const U& a, std::uint32_t b) const { y = (a & 0xffffffffu) * b; }
};
#if defined(SSR_LANES_AVX2)
SSR_LANES_AVX2 inline void mul_low_avx2(lanes::Doubles<4>::Bits& y, const lanes::Doubles<4>::Bits& a, std::uint32_t b) {
  const lanes::Doubles<4>::Bits spread = lanes::Doubles<4>::Bits{} + b;
  __m256i v, c;
  std::memcpy(&v, &a, sizeof v);
  std::memcpy(&c, &spread, sizeof c);
  v = _mm256_mul_epu32(v, c);
  std::memcpy(&y, &v, sizeof v);
}
struct MulAvx2 {
  SSR_LANES_INLINE void operator()(lanes::Doubles<4>::Bits& y, const lanes::Doubles<4>::Bits& a,
                                   std::uint32_t b) const {
    mul_low_avx2(y, a, b);
  }
};
#endif
#if defined(SSR_LANES_AVX512)
SSR_LANES_AVX512 inline void mul_low_avx512(lanes::Doubles<8>::Bits& y, const lanes::Doubles<8>::Bits& a,
                                            std::uint32_t b) {
  const lanes::Doubles<8>::Bits spread = lanes::Doubles<8>::Bits{} + b;
  __m512i v, c;
  std::memcpy(&v, &a, sizeof v);
  std::memcpy(&c, &spread, sizeof c);
  v = _mm512_mask_mul_epu32(v, 0xff, v, c);  // every lane, as sqrt_avx512
  std::memcpy(&y, &v, sizeof v);
}
struct MulAvx512 {
  SSR_LANES_INLINE void operator()(lanes::Doubles<8>::Bits& y, const lanes::Doubles<8>::Bits& a,
                                   std::uint32_t b) const {
    mul_low_avx512(y, a, b);
  }
};
#endif

// The square root and the product of L lanes in the build's own code: one instruction where there is one
// above, else a lane at a time (the square root) and GCC's product.
template <int L>
struct Own {
  using Sqrt = SqrtLanes<L>;
  using Mul = MulLow<L>;
};
#if defined(SSR_LANES_AVX2)
template <>
struct Own<4> {
  using Sqrt = SqrtAvx2;
  using Mul = MulAvx2;
};
#endif
#if defined(SSR_LANES_AVX512)
template <>
struct Own<8> {
  using Sqrt = SqrtAvx512;
  using Mul = MulAvx512;
};
#endif

constexpr index_t tile = 8;  // rows a tile (Simd<T>::tile)

// Doubles in the build's widest vector, at most a tile's column (1 without vector extensions).
constexpr int widest = lanes::widest_lanes<double>(static_cast<int>(tile));

// The uniforms of each of L lanes' blocks: Philox4x32-10 with counter (block, step) and key (seed, layer),
// as random::draw, each word w taken as random::uniform_open takes it, (w + 0.5) / 2^32 (a function, not a
// lambda: a lambda's body is compiled for the build's own target, not the path's).
template <int L, class Mul>
SSR_LANES_INLINE void uniforms(const RouteSpec& spec, const typename lanes::Doubles<L>::Bits& block,
                               typename lanes::Doubles<L>::Double (&u)[4], const Mul& mul) {
  using U = typename lanes::Doubles<L>::Bits;
  const std::uint64_t mask = 0xffffffffu;
  U c0 = block & mask, c1 = block >> 32, c2 = U{} + (spec.step & mask), c3 = U{} + (spec.step >> 32);
  std::uint32_t k0 = spec.seed, k1 = spec.layer;
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {  // the key's bump between rounds
      k0 += PHILOX_W32_0;
      k1 += PHILOX_W32_1;
    }
    U p0, p1;
    mul(p0, c0, PHILOX_M4x32_0);
    mul(p1, c2, PHILOX_M4x32_1);
    const U next0 = (p1 >> 32) ^ c1 ^ k0, next2 = (p0 >> 32) ^ c3 ^ k1;
    c1 = p1 & mask;
    c3 = p0 & mask;
    c0 = next0;
    c2 = next2;
  }
  const U words[4] = {c0, c1, c2, c3};  // w as a double through 2^52's low bits
  for (int w = 0; w < 4; ++w) {
    const U bits = words[w] | 0x4330000000000000ull;
    std::memcpy(&u[w], &bits, sizeof bits);
    u[w] = ((u[w] - 4503599627370496.0) + 0.5) * (1.0 / 4294967296.0);
  }
}

// The four normals of L lanes' blocks from their uniforms: two Box-Muller pairs, times alpha * sigma.
template <int L, class Sqrt>
SSR_LANES_INLINE void normals(const RouteSpec& spec, const typename lanes::Doubles<L>::Double (&u)[4],
                              typename lanes::Doubles<L>::Double (&normal)[4], const Sqrt& sqrt) {
  using D = typename lanes::Doubles<L>::Double;
  using U = typename lanes::Doubles<L>::Bits;
  math::normal_pair_of<D, U>(u[0], u[1], normal[0], normal[1], lanes::Fused<L>{}, sqrt);
  math::normal_pair_of<D, U>(u[2], u[3], normal[2], normal[3], lanes::Fused<L>{}, sqrt);
  const double scale = spec.noise_alpha * spec.noise_sigma;
  for (auto& v : normal) v = scale * v;
}

// z[(r / tile * n + j) * tile + r % tile] = math::noise_value(spec, row0 + r, n, j) for r < rows and j < n,
// L blocks of four at a time; a last, partial tile's other rows are zeros. Where every row starts a block
// (n a multiple of 4), lane l takes row r0 + l's block at columns [j, j + 4): word w of the L lanes is then
// column j + w of L consecutive rows, one vector in the tiles. Else the blocks follow each other in the
// stream (one run of it: the rows' elements follow each other) and each element goes to its place.
template <int L, class Sqrt, class Mul>
SSR_LANES_INLINE void tiles_in_lanes(const RouteSpec& spec, index_t row0, index_t rows, index_t n, double* z,
                                     const Sqrt& sqrt, const Mul& mul) {
  using D = typename lanes::Doubles<L>::Double;
  using U = typename lanes::Doubles<L>::Bits;
  const std::uint64_t e0 = math::element_index(spec, row0, n, 0);
  std::uint64_t lanes_from_0[L];
  for (int l = 0; l < L; ++l) lanes_from_0[l] = static_cast<std::uint64_t>(l);
  U lane_of;
  std::memcpy(&lane_of, lanes_from_0, sizeof lane_of);
  D normal[4];
  // Draws whose Philox rounds run side by side before their normals: a block's ten rounds are one chain of
  // dependent products, which its normals waited on (4 of them: 1.09-1.16x a noisy route; 6 gained nothing).
  constexpr index_t chain = 4;
  if (n % 4 == 0 && tile % L == 0) {  // rows of whole blocks (e0 = (first_row + row0) n is a multiple of 4)
    // The draws go row group by row group (L rows), four columns at a time.
    const auto un = static_cast<std::uint64_t>(n);
    const index_t whole = (rows + tile - 1) / tile * tile;  // rows of whole tiles
    index_t r0 = 0, j = 0;                                  // the next draw's rows and columns
    // The element index of column 0 of rows [r0, r0 + L) (modulo 2^64, as the stream's).
    U first = (lane_of + (spec.first_row + static_cast<std::uint64_t>(row0))) * un;
    while (r0 < whole) {
      index_t r[chain], c[chain], count = 0;
      D u[chain][4];
      for (; count < chain && r0 < whole; ++count) {
        r[count] = r0;
        c[count] = j;
        uniforms<L>(spec, (first + static_cast<std::uint64_t>(j)) >> 2, u[count], mul);  // wrapping as the stream's
        if ((j += 4) == n) {
          j = 0;
          r0 += L;
          first += static_cast<std::uint64_t>(L) * un;
        }
      }
      for (index_t d = 0; d < count; ++d) {
        double* at = z + (r[d] / tile * n + c[d]) * tile + r[d] % tile;  // column c of rows [r, r + L)
        normals<L>(spec, u[d], normal, sqrt);
        if (r[d] + L > rows) {  // rows past the last: zeros
          const auto real = lane_of + static_cast<std::uint64_t>(r[d]) < U{} + static_cast<std::uint64_t>(rows);
          for (auto& v : normal) v = real ? v : D{};
        }
        for (int w = 0; w < 4; ++w) std::memcpy(at + w * tile, &normal[w], sizeof(D));
      }
    }
    return;
  }
  // Blocks from e0's (its element `skip` of it), as many as hold the rows; a block's index is its first
  // element's over 4, so the stream wraps at 2^62 blocks as its 64-bit element index does at 2^64.
  const std::uint64_t skip = e0 & 3u, count = static_cast<std::uint64_t>(rows) * static_cast<std::uint64_t>(n),
                      blocks = (skip + count + 3) / 4, last_block = (std::uint64_t{1} << 62) - 1;
  index_t r = 0, j = 0;  // the row and column of the next element to write
  double* row = z;       // where row r's column 0 lies
  const auto chained = static_cast<std::uint64_t>(chain) * L;
  for (std::uint64_t b0 = 0; b0 < blocks; b0 += chained) {  // `chain` draws of L blocks, as above
    const index_t here = static_cast<index_t>(std::min(chained, blocks - b0) + L - 1) / L;
    D u[chain][4];
    for (index_t d = 0; d < here; ++d)
      uniforms<L>(spec, (lane_of + ((e0 >> 2) + b0 + static_cast<std::uint64_t>(d) * L)) & last_block, u[d], mul);
    for (index_t d = 0; d < here; ++d) {
      const std::uint64_t b = b0 + static_cast<std::uint64_t>(d) * L;
      normals<L>(spec, u[d], normal, sqrt);
      double value[4][L];
      std::memcpy(value, normal, sizeof value);
      // Element `at` of these L blocks (4 l + w) is value[w][l], the element 4 b + at - skip from e0's; the
      // rows' take theirs, in order.
      const std::uint64_t from = b == 0 ? skip : 0,
                          to = std::min<std::uint64_t>(std::uint64_t{4} * L, skip + count - 4 * b);
      for (std::uint64_t at = from; at < to; ++at) {
        row[j * tile] = value[at & 3u][at >> 2];
        if (++j == n) {
          j = 0;
          ++r;
          row = z + (r / tile * n) * tile + r % tile;
        }
      }
    }
  }
  if (rows % tile != 0)
    for (index_t q = rows % tile; q < tile; ++q)
      for (index_t c = 0; c < n; ++c) z[(rows / tile * n + c) * tile + q] = 0.0;
}

#if defined(SSR_DISPATCH_AVX2)
SSR_TARGET_AVX2_FMA inline void tiles_avx2(const RouteSpec& spec, index_t row0, index_t rows, index_t n, double* z) {
  tiles_in_lanes<4>(spec, row0, rows, n, z, SqrtAvx2{}, MulAvx2{});
}
#endif
#if defined(SSR_DISPATCH_AVX512)
SSR_TARGET_AVX512_FMA inline void tiles_avx512(const RouteSpec& spec, index_t row0, index_t rows, index_t n,
                                               double* z) {
  tiles_in_lanes<8>(spec, row0, rows, n, z, SqrtAvx512{}, MulAvx512{});
}
#endif

// The noise of `rows` rows from row0 into tiles (see tiles_in_lanes) on the widest path this processor runs;
// a build with FMA of its own takes its widest vectors; without FMA, one lane (the formula's std::fma a
// call each, exact but slow).
inline void tiles(const RouteSpec& spec, index_t row0, index_t rows, index_t n, double* z) {
#if defined(SSR_DISPATCH_AVX512)
  if (lanes::has_avx512()) return tiles_avx512(spec, row0, rows, n, z);
#endif
#if defined(SSR_DISPATCH_AVX2)
  if (lanes::has_avx2_fma()) return tiles_avx2(spec, row0, rows, n, z);
#endif
#if defined(__FMA__) && defined(SSR_VECTOR_EXTENSIONS)
  tiles_in_lanes<widest>(spec, row0, rows, n, z, Own<widest>::Sqrt{}, Own<widest>::Mul{});
#else
  tiles_in_lanes<1>(spec, row0, rows, n, z, SqrtLanes<1>{}, MulLow<1>{});
#endif
}

}  // namespace SSR_LANES_NAMESPACE
}  // namespace noise
}  // namespace cpu
}  // namespace ssr
