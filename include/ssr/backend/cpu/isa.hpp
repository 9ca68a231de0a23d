// The instruction sets the CPU backend's kernels are compiled for, and its one run-time dispatch.
// Baseline: the build's own target (x86-64's SSE2 by default; with -march=native, whatever it has).
// Avx2: AVX2 with FMA, compiled into a baseline x86-64 build with a target attribute and taken where the
// processor has it. A kernel is written once over the lanes (lanes.hpp) and an instruction set's
// operations: with_isa(f) runs f(Baseline{}) or, compiled for AVX2, f(Avx2{}); every function f reaches
// is inlined into that one, so the whole kernel takes the target's instructions. Neither fuses a product
// into a sum that the formula does not fuse itself (fp-contract=off), so every set gives the same bits.
// SSR_CPU_ISA=baseline (or avx2) in the environment, or use_isa(), picks one for the process.
// Defining SSR_CPU_DISPATCH=0 compiles the baseline alone: half the code and the compile time, for a
// program that never runs on AVX2, or builds for it (-march), or checks the kernels' memory accesses.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "ssr/backend/cpu/lanes.hpp"
#include "ssr/error.hpp"
#include "ssr/math/exp.hpp"

#ifndef SSR_CPU_DISPATCH
#define SSR_CPU_DISPATCH 1
#endif
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#if defined(__AVX2__) && defined(__FMA__)
#if SSR_CPU_DISPATCH
#define SSR_CPU_OWN_AVX2 1  // the build's own target has AVX2 and FMA
#endif
#define SSR_CPU_TARGET_AVX2
#elif SSR_CPU_DISPATCH
#define SSR_CPU_DISPATCH_AVX2 1
#define SSR_CPU_TARGET_AVX2 __attribute__((target("avx2,fma")))
#endif
#endif
#if defined(__GNUC__) && !defined(__CUDACC__)
// Every call a kernel makes is inlined into its entry, the intrinsics' wrappers included.
#ifndef SSR_CPU_FLATTEN
#define SSR_CPU_FLATTEN __attribute__((flatten))
#endif
#else
#define SSR_CPU_FLATTEN
#endif
#if defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__)
#define SSR_CPU_NO_CONTRACT __attribute__((optimize("fp-contract=off")))
#else
#define SSR_CPU_NO_CONTRACT  // Clang fuses only within an expression: kernels keep products apart
#endif

SSR_LANES_BEGIN
namespace ssr {
namespace cpu {

enum class Isa { baseline, avx2 };

inline const char* to_string(Isa isa) { return isa == Isa::baseline ? "baseline" : "avx2"; }

// The operations of the build's own target, a lane at a time where the vector extensions have no
// operator: fma(y, a, b, c) (std::fma: one instruction where the target fuses, else exact in software),
// sqrt (correctly rounded), mul (the 64-bit product of 32-bit operands) and lookup (math::eighths); and
// `piece`, the bytes of a register, in which vectors are compared (math::by_pieces).
struct Baseline {
  static constexpr Isa isa = Isa::baseline;
  // The widest register of the build's target, the pieces vectors are compared in (math/lanes.hpp).
#if defined(__AVX512F__)
  static constexpr int piece = 64;
#elif defined(__AVX__)
  static constexpr int piece = 32;
#else
  static constexpr int piece = 16;
#endif
  struct Fma {
    static constexpr int piece = Baseline::piece;
    template <class V>
    SSR_INLINE void operator()(V& y, const V& a, const V& b, const V& c) const {
      for (int l = 0; l < count_of<V>; ++l) y[l] = std::fma(a[l], b[l], c[l]);
    }
  };
  struct Sqrt {
    SSR_INLINE void operator()(Half<double>& y, const Half<double>& x) const {
      for (int l = 0; l < half; ++l) y[l] = std::sqrt(x[l]);
    }
  };
  struct Mul {
    SSR_INLINE void operator()(Half<std::uint64_t>& y, const Half<std::uint64_t>& a, std::uint32_t b) const {
      y = (a & 0xffffffffu) * b;
    }
  };
  struct Lookup {
    SSR_INLINE void operator()(const Lanes<std::int32_t>& i, Lanes<float>& y) const {
      for (int l = 0; l < lanes; ++l) y[l] = math::eighths[i[l] & 7];
    }
  };
};

#if defined(SSR_CPU_DISPATCH_AVX2) || defined(SSR_CPU_OWN_AVX2)
// The same operations in AVX2 and FMA instructions: a float lane vector is one register, a double or
// 64-bit integer one two halves. Not forced inline: a generic kernel calls them before it is itself inlined
// into its AVX2 entry (with_isa), where the compiler then inlines them.
SSR_CPU_TARGET_AVX2 inline void fmadd_avx2(__m256& x, const __m256& p, const __m256& q) {
  x = _mm256_fmadd_ps(x, p, q);
}
SSR_CPU_TARGET_AVX2 inline void fmadd_avx2(__m256d& x, const __m256d& p, const __m256d& q) {
  x = _mm256_fmadd_pd(x, p, q);
}
// The AVX2 register of floats or doubles (a specialisation: as a template argument its attributes drop).
template <class L>
struct Avx2Register;
template <>
struct Avx2Register<float> {
  using type = __m256;
};
template <>
struct Avx2Register<double> {
  using type = __m256d;
};
// y = a * b + c for a vector of floats or doubles of whole registers, a register at a time.
template <class V>
SSR_CPU_TARGET_AVX2 void fma_avx2(V& y, const V& a, const V& b, const V& c) {
  using R = typename Avx2Register<math::lane_t<V>>::type;
  constexpr int n = static_cast<int>(sizeof(V)) / 32;  // 32 bytes a register
  R x[n], p[n], q[n];
  std::memcpy(x, &a, sizeof x);
  std::memcpy(p, &b, sizeof p);
  std::memcpy(q, &c, sizeof q);
  for (int r = 0; r < n; ++r) fmadd_avx2(x[r], p[r], q[r]);
  std::memcpy(&y, x, sizeof x);
}
SSR_CPU_TARGET_AVX2 inline void sqrt_avx2(Half<double>& y, const Half<double>& x) {
  __m256d v;
  std::memcpy(&v, &x, sizeof v);
  v = _mm256_sqrt_pd(v);
  std::memcpy(&y, &v, sizeof v);
}
SSR_CPU_TARGET_AVX2 inline void mul_avx2(Half<std::uint64_t>& y, const Half<std::uint64_t>& a, std::uint32_t b) {
  __m256i v;
  std::memcpy(&v, &a, sizeof v);
  v = _mm256_mul_epu32(v, _mm256_set1_epi64x(static_cast<long long>(b)));
  std::memcpy(&y, &v, sizeof v);
}
SSR_CPU_TARGET_AVX2 inline void lookup_avx2(Lanes<float>& y, const Lanes<std::int32_t>& i) {
  __m256i index;
  std::memcpy(&index, &i, sizeof index);
  const __m256 found = _mm256_permutevar8x32_ps(_mm256_loadu_ps(math::eighths), index);
  std::memcpy(&y, &found, sizeof y);
}

struct Avx2 {
  static constexpr Isa isa = Isa::avx2;
  static constexpr int piece = 32;
  struct Fma {
    static constexpr int piece = Avx2::piece;
    template <class V>
    SSR_INLINE void operator()(V& y, const V& a, const V& b, const V& c) const {
      fma_avx2(y, a, b, c);
    }
  };
  struct Sqrt {
    SSR_INLINE void operator()(Half<double>& y, const Half<double>& x) const { sqrt_avx2(y, x); }
  };
  struct Mul {
    SSR_INLINE void operator()(Half<std::uint64_t>& y, const Half<std::uint64_t>& a, std::uint32_t b) const {
      mul_avx2(y, a, b);
    }
  };
  struct Lookup {
    SSR_INLINE void operator()(const Lanes<std::int32_t>& i, Lanes<float>& y) const { lookup_avx2(y, i); }
  };
};
#endif

// Whether this program has kernels for the instruction set and this processor runs it; asked once.
inline bool runs(Isa isa) {
#if defined(SSR_CPU_DISPATCH_AVX2)
  static const bool avx2 = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") != 0 && __builtin_cpu_supports("fma") != 0;
  }();
  return isa == Isa::baseline || avx2;
#elif defined(SSR_CPU_OWN_AVX2)
  return true;
#else
  return isa == Isa::baseline;
#endif
}

namespace detail {
// The set kernels take: SSR_CPU_ISA's where set (an error if this processor cannot run it), else the widest.
inline Isa& chosen_isa() {
  static Isa chosen = [] {
    const char* name = std::getenv("SSR_CPU_ISA");
    const Isa widest = runs(Isa::avx2) ? Isa::avx2 : Isa::baseline;
    if (name == nullptr || *name == '\0') return widest;
    const std::string want(name);
    ssr::detail::require(
        want == "baseline" || (want == "avx2" && runs(Isa::avx2)), "SSR_CPU_ISA", want,
        "must be baseline or, where this program has AVX2 kernels and the processor AVX2 and FMA, avx2");
    return want == "avx2" ? Isa::avx2 : Isa::baseline;
  }();
  return chosen;
}
}  // namespace detail

inline Isa current_isa() { return detail::chosen_isa(); }

// Makes every later call take `isa` (for tests and measurements; not while another thread routes).
inline void use_isa(Isa isa) {
  ssr::detail::require(runs(isa), "isa", to_string(isa),
                       "is not one this program has kernels for and this processor runs");
  detail::chosen_isa() = isa;
}

#if defined(SSR_CPU_DISPATCH_AVX2)
template <class F>
SSR_CPU_TARGET_AVX2 SSR_CPU_NO_CONTRACT SSR_CPU_FLATTEN auto run_avx2(const F& f) {
  return f(Avx2{});
}
#endif
template <class F>
SSR_CPU_NO_CONTRACT SSR_CPU_FLATTEN auto run_own(const F& f) {
#if defined(SSR_CPU_OWN_AVX2)
  if (current_isa() == Isa::avx2) return f(Avx2{});
#endif
  return f(Baseline{});
}

// f(ops) with the operations of the instruction set this process takes; f and all it calls are inlined.
template <class F>
auto with_isa(const F& f) {
#if defined(SSR_CPU_DISPATCH_AVX2)
  if (current_isa() == Isa::avx2) return run_avx2(f);
#endif
  return run_own(f);
}

}  // namespace cpu
}  // namespace ssr
SSR_LANES_END
