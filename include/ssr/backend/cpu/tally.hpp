// The CPU backend's count of chosen experts (the load) for n <= 16 with AVX-512: eight entries a step in
// one vector's lanes, where counting an entry in memory takes a load, an add and a store, the store the
// bound (CpuBackend::count_load). Each 64-bit lane holds a 4-bit count of every expert, entry e adding
// 1 << 4e; the nibbles fold into bytes (even and odd experts) every 15 steps, before any can
// overflow, and the bytes spill into the 32-bit counts every 17 folds (at most 255). Integer sums: the same
// counts in any order. The shifts and the widening take their masked forms: the plain ones read an undefined
// vector, which GCC 12 warns of.
#pragma once

#include <cstdint>

#include "ssr/backend/cpu/lanes.hpp"
#include "ssr/view.hpp"

#if defined(SSR_DISPATCH_AVX512)
#define SSR_TALLY_AVX512 1
#define SSR_TALLY_TARGET SSR_TARGET_AVX512
#elif defined(SSR_VECTOR_EXTENSIONS) && defined(__AVX512F__) && defined(__AVX512BW__)
#define SSR_TALLY_AVX512 1
#define SSR_TALLY_TARGET
#endif

namespace ssr {
namespace cpu {
namespace tally {
inline namespace SSR_LANES_NAMESPACE {

constexpr index_t most_experts = 16;  // a nibble each in 64 bits
constexpr int steps_a_fold = 15;      // a nibble's largest count
constexpr int folds_a_spill = 17;     // 17 * 15 = 255, a byte's largest count

// One thread's counts in progress (zero to start).
struct Tally {
  alignas(64) std::uint64_t nibbles[8] = {}, even[8] = {}, odd[8] = {};
  int steps = 0, folds = 0;
};

// Whether this processor tallies n experts so.
inline bool available(index_t n) {
#if defined(SSR_TALLY_AVX512)
#if defined(SSR_DISPATCH_AVX512)
  if (!lanes::has_avx512()) return false;
#endif
  return n <= most_experts;
#else
  static_cast<void>(n);
  return false;
#endif
}

#if defined(SSR_TALLY_AVX512)
// The nibbles' counts added into the bytes: the even experts' into even, the odd ones' into odd.
SSR_TALLY_TARGET inline void fold(const __m512i& nibbles, __m512i& even, __m512i& odd) {
  const __m512i low = _mm512_set1_epi8(0x0f);
  even = _mm512_add_epi8(even, _mm512_and_si512(nibbles, low));
  odd = _mm512_add_epi8(odd, _mm512_and_si512(_mm512_maskz_srli_epi64(0xff, nibbles, 4), low));
}

// The bytes' counts added into count[j], j < n.
SSR_TALLY_TARGET inline void spill(const __m512i& even, const __m512i& odd, index_t n, std::int32_t* count) {
  alignas(64) std::uint8_t e[64], o[64];
  _mm512_store_si512(e, even);
  _mm512_store_si512(o, odd);
  for (index_t j = 0; j < n; ++j) {
    const std::uint8_t* b = j % 2 == 0 ? e : o;
    for (index_t l = 0; l < 8; ++l) count[j] += b[8 * l + j / 2];
  }
}

// Entries e[0, entries) (experts in [0, n), n <= 16) into t, whole steps of eight; the rest into count.
SSR_TALLY_TARGET inline void add(Tally& t, const std::int32_t* e, index_t entries, index_t n, std::int32_t* count) {
  const __m512i one = _mm512_set1_epi64(1);
  __m512i nibbles = _mm512_load_si512(t.nibbles), even = _mm512_load_si512(t.even), odd = _mm512_load_si512(t.odd);
  index_t x = 0;
  for (; x + 8 <= entries; x += 8) {
    const __m512i at = _mm512_maskz_cvtepu32_epi64(0xff, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(e + x)));
    nibbles = _mm512_add_epi64(nibbles, _mm512_maskz_sllv_epi64(0xff, one, _mm512_maskz_slli_epi64(0xff, at, 2)));
    if (++t.steps < steps_a_fold) continue;
    fold(nibbles, even, odd);
    nibbles = _mm512_setzero_si512();
    t.steps = 0;
    if (++t.folds < folds_a_spill) continue;
    spill(even, odd, n, count);
    even = odd = _mm512_setzero_si512();
    t.folds = 0;
  }
  for (; x < entries; ++x) ++count[e[x]];
  _mm512_store_si512(t.nibbles, nibbles);
  _mm512_store_si512(t.even, even);
  _mm512_store_si512(t.odd, odd);
}

// What t holds into count, t zero again.
SSR_TALLY_TARGET inline void finish(Tally& t, index_t n, std::int32_t* count) {
  __m512i even = _mm512_load_si512(t.even), odd = _mm512_load_si512(t.odd);
  fold(_mm512_load_si512(t.nibbles), even, odd);
  spill(even, odd, n, count);
  t = Tally{};
}
#else
inline void add(Tally& /*t*/, const std::int32_t* e, index_t entries, index_t /*n*/, std::int32_t* count) {
  for (index_t x = 0; x < entries; ++x) ++count[e[x]];
}
inline void finish(Tally& /*t*/, index_t /*n*/, std::int32_t* /*count*/) {}
#endif

}  // namespace SSR_LANES_NAMESPACE
}  // namespace tally
}  // namespace cpu
}  // namespace ssr

#undef SSR_TALLY_TARGET
#undef SSR_TALLY_AVX512
