// What the CPU backend's vector code written over GNU vectors (exp.hpp, pass.hpp, topk.hpp, columns.hpp,
// cost_tiles.hpp, noise.hpp, finite.hpp) builds on: whether the compiler has vector extensions, the widest
// vector the build compiles to one register, and the AVX2 and AVX-512 paths that a baseline x86-64 build
// (SSE2) takes at run time where the processor has them; any_lane, which reads a comparison's lanes;
// lane-wise fused multiply-adds (FusedOwn and its kin, Fused over vectors of doubles); conversions between
// float and double lanes (widen, narrow); subnormals flushed for a scope (FlushSubnormals); and prefetch,
// of a line or of a stretch spread over a loop's steps (Ahead).
//
// Such code declares its vector types inside each function (SSR_LANES), passes no vector to a function
// (one crossing a function boundary in a build without its registers changes the ABI), and its functions
// are inlined into their callers (SSR_LANES_INLINE), the AVX2 ones included. Every lane takes the same
// operations in the same order, so the width changes no bit; the AVX2 and AVX-512 paths fuse no product
// into a sum that the formula does not fuse itself, so both give the baseline's bits. Formulas written with
// fused multiply-adds (FusedOwn, Fused: the same bits wherever they are computed), such as the float
// exp and the scaled pass, take AVX2 with FMA, or AVX-512.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#if defined(__GNUC__) && !defined(__CUDACC__) && (defined(__x86_64__) || defined(__i386__))
#include <immintrin.h>
#endif

// SSR_NO_VECTOR_EXTENSIONS (or Eigen's EIGEN_DONT_VECTORIZE) asks for one lane at a time. So does nvcc:
// its front end (CUDA 13) drops a vector attribute whose size depends on a template argument, which
// would make single floats of the vectors. The two forms live in different inline namespaces
// (SSR_LANES_NAMESPACE), so that a program with both kinds of translation units keeps both.
#if defined(__GNUC__) && !defined(__CUDACC__) && !defined(SSR_NO_VECTOR_EXTENSIONS) && !defined(EIGEN_DONT_VECTORIZE)
#define SSR_VECTOR_EXTENSIONS 1
#define SSR_LANES_INLINE __attribute__((always_inline)) inline
#define SSR_LANES_ALWAYS_INLINE __attribute__((always_inline))  // for a lambda: after its parameters
#define SSR_LANES_NAMESPACE gnu_vectors
#else
#define SSR_LANES_INLINE inline
#define SSR_LANES_ALWAYS_INLINE
#define SSR_LANES_NAMESPACE one_lane
#endif
// Lanes are shuffled with __builtin_shufflevector where the compiler has it (GCC 12, Clang); code without
// it takes the same values through scalars.
#if defined(SSR_VECTOR_EXTENSIONS) && defined(__has_builtin)
#if __has_builtin(__builtin_shufflevector)
#define SSR_SHUFFLE_VECTOR 1
#endif
#endif
#if defined(SSR_VECTOR_EXTENSIONS) && (defined(__x86_64__) || defined(__i386__)) && !defined(__AVX2__)
#define SSR_DISPATCH_AVX2 1
#define SSR_TARGET_AVX2 __attribute__((target("avx2")))
// The float exp, defined with fused multiply-adds, and the code that inlines it: AVX2 and FMA.
#define SSR_TARGET_AVX2_FMA __attribute__((target("avx2,fma")))
#if defined(__GNUC__) && !defined(__clang__)
// GCC also compiles the loops that gain most from wide vectors (the scaled pass, the float exp) for
// AVX-512 (F, VL, BW, DQ: every processor with AVX-512 but the first Xeon Phis). AVX-512F has fused
// multiply-adds, which GCC's default -ffp-contract=fast would put in place of products added to sums:
// other bits than the baseline's; fp-contract=off keeps every path's bits the same (the float exp's
// fused multiply-adds are its formula's own, std::fma). Clang, which fuses within an expression by
// default and has no such attribute, keeps the AVX2 path.
#define SSR_DISPATCH_AVX512 1
#define SSR_TARGET_AVX512 \
  __attribute__((target("avx2,avx512f,avx512vl,avx512bw,avx512dq"), optimize("fp-contract=off")))
#define SSR_TARGET_AVX512_FMA \
  __attribute__((target("avx2,fma,avx512f,avx512vl,avx512bw,avx512dq"), optimize("fp-contract=off")))
#endif
#endif

// SSR_LANES_AVX2 and SSR_LANES_AVX512, where defined, mark a function that calls AVX2-and-FMA or AVX-512
// intrinsics (an instruction the vector extensions do not express): the path's target where a baseline
// build takes it at run time, nothing where the build's own target has them (SSR_LANES_OWN_AVX2,
// SSR_LANES_OWN_AVX512: a native build's widest vectors). Such a function is compiled on its own; the
// compiler inlines it once its caller sits in the path's function.
#if defined(SSR_VECTOR_EXTENSIONS) && (defined(__x86_64__) || defined(__i386__))
#if defined(__AVX2__) && defined(__FMA__)
#define SSR_LANES_OWN_AVX2 1
#define SSR_LANES_AVX2
#elif defined(SSR_DISPATCH_AVX2)
#define SSR_LANES_AVX2 SSR_TARGET_AVX2_FMA
#endif
#if defined(__AVX512F__)
#define SSR_LANES_OWN_AVX512 1
#define SSR_LANES_AVX512
#elif defined(SSR_DISPATCH_AVX512)
#define SSR_LANES_AVX512 SSR_TARGET_AVX512_FMA
#endif
#endif

// SSR_UNROLL before a loop over a fixed, small number of vectors unrolls it, so that its arrays of vectors
// stay in registers: GCC unrolls such loops at -O3 but not at -O2, where the arrays would live in memory
// (an iteration of the scaled pass took up to 3 times as long: docs/performance.md). nvcc, whose front end
// does not know the pragma, compiles this code a lane at a time (above): nothing to unroll.
#if defined(__GNUC__) && !defined(__CUDACC__)
#define SSR_UNROLL _Pragma("GCC unroll 16")
#else
#define SSR_UNROLL
#endif

// SSR_LANES(Name, T, L) declares Name, a vector of L lanes of T, inside a function (a GNU vector type
// passed as a template argument loses its attribute, so each function declares its own); without
// vector extensions, T itself (L must then be 1).
#if defined(SSR_VECTOR_EXTENSIONS)
#define SSR_LANES(Name, T, L) typedef T Name __attribute__((vector_size((L) * sizeof(T))))  // NOLINT
#else
#define SSR_LANES(Name, T, L)                                    \
  static_assert((L) == 1, "one lane without vector extensions"); \
  using Name = T
#endif

// SSR_LANES_FUSED(T, L, y, a, b, c): y = a * b + c rounded once (a fused multiply-add) in each of the L lanes
// of T in vectors a, b, c and y: std::fma a lane, which the vectoriser makes one instruction a vector where
// the target has FMA (the AVX2 and AVX-512 paths, AArch64), exact everywhere but slow without it. A
// statement over arrays, as no vector is passed to a function (and GCC reads no lane of a vector whose
// width is a template's argument); the copies stay in registers. FusedOwn, FusedAvx2 and FusedAvx512 take
// the instruction itself where the target has it: GCC tuned for 256-bit vectors (-march=native on recent
// Intel cores) leaves a 512-bit vector's lanes one at a time here.
#define SSR_LANES_FUSED(T, L, y, a, b, c)                                       \
  do {                                                                          \
    T y_[L], a_[L], b_[L], c_[L];                                               \
    std::memcpy(a_, &(a), sizeof a_);                                           \
    std::memcpy(b_, &(b), sizeof b_);                                           \
    std::memcpy(c_, &(c), sizeof c_);                                           \
    for (int l_ = 0; l_ < (L); ++l_) y_[l_] = std::fma(a_[l_], b_[l_], c_[l_]); \
    std::memcpy(&(y), y_, sizeof y_);                                           \
  } while (false)

namespace ssr {
namespace cpu {
namespace lanes {

// The widest vector the build compiles to one register, in bytes: 64 (AVX-512), 32 (AVX), else 16 (SSE2,
// NEON); 0 without vector extensions.
#if !defined(SSR_VECTOR_EXTENSIONS)
constexpr int widest_bytes = 0;
#elif defined(__AVX512F__)
constexpr int widest_bytes = 64;
#elif defined(__AVX__)
constexpr int widest_bytes = 32;
#else
constexpr int widest_bytes = 16;
#endif

// Lanes of T in the build's widest vector, at most `most`; 1 without vector extensions.
template <class T>
constexpr int widest_lanes(int most) {
  const int fit = widest_bytes / static_cast<int>(sizeof(T));
  return widest_bytes == 0 ? 1 : (most < fit ? most : fit);
}

#if defined(SSR_DISPATCH_AVX2)
// Whether this processor (and its operating system) runs AVX2; asked once.
inline bool has_avx2() {
  static const bool yes = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") != 0;
  }();
  return yes;
}

// Whether this processor runs AVX2 and FMA (every x86-64 processor with AVX2 but a few has FMA too).
inline bool has_avx2_fma() {
  static const bool yes = has_avx2() && __builtin_cpu_supports("fma") != 0;
  return yes;
}
#endif

#if defined(SSR_DISPATCH_AVX512)
// Whether this processor (and its operating system) runs AVX-512 F, VL, BW and DQ, and FMA; asked once.
inline bool has_avx512() {
  static const bool yes = has_avx2_fma() && __builtin_cpu_supports("avx512f") != 0 &&
                          __builtin_cpu_supports("avx512vl") != 0 && __builtin_cpu_supports("avx512bw") != 0 &&
                          __builtin_cpu_supports("avx512dq") != 0;
  return yes;
}
#endif

inline namespace SSR_LANES_NAMESPACE {

// Whether any bit of a value (a vector, or a scalar) is set: on x86 its 16-byte halves OR-ed and compared
// with zero by words (SSE2, in every x86-64 build); elsewhere its bits OR-ed by words.
template <class Value>
SSR_LANES_INLINE bool any_bit(const Value& v) {
#if defined(__SSE2__)
  if constexpr (sizeof(Value) % 16 == 0) {
    __m128i chunk[sizeof(Value) / 16];
    std::memcpy(chunk, &v, sizeof v);
    for (std::size_t c = 1; c < sizeof(Value) / 16; ++c) chunk[0] = _mm_or_si128(chunk[0], chunk[c]);
    return _mm_movemask_epi8(_mm_cmpeq_epi32(chunk[0], _mm_setzero_si128())) != 0xffff;
  }
#endif
  using Word = std::conditional_t<sizeof(Value) % 8 == 0, std::uint64_t, std::uint32_t>;
  Word words[sizeof(Value) / sizeof(Word)];
  std::memcpy(words, &v, sizeof v);
  Word any = 0;
  for (const Word w : words) any |= w;
  return any != 0;
}

// Whether any lane of a comparison's result is true (a bool for one lane): a true lane has every bit set,
// a false one none. On x86 its 16-byte halves are OR-ed and their lanes' sign bits read at once (SSE2's
// movmskps, one instruction fewer than any_bit).
template <class Mask>
SSR_LANES_INLINE bool any_lane(const Mask& m) {
  if constexpr (std::is_same<Mask, bool>::value) {  // one lane without vector extensions
    return m;
  } else {
#if defined(__SSE2__)
    if constexpr (sizeof(Mask) % 16 == 0) {
      __m128 chunk[sizeof(Mask) / 16];
      std::memcpy(chunk, &m, sizeof m);
      for (std::size_t c = 1; c < sizeof(Mask) / 16; ++c) chunk[0] = _mm_or_ps(chunk[0], chunk[c]);
      return _mm_movemask_ps(chunk[0]) != 0;
    }
#endif
    return any_bit(m);
  }
}

// L lanes of doubles and of their bits, declared outside any template (a vector type whose width depends on
// a template's argument loses its width where it is itself a template's argument, as in math::exp_of's).
template <int L>
struct Doubles;
template <>
struct Doubles<1> {
  using Double = double;
  using Bits = std::uint64_t;
};
#if defined(SSR_VECTOR_EXTENSIONS)
template <>
struct Doubles<2> {
  typedef double Double __attribute__((vector_size(16)));       // NOLINT(modernize-use-using)
  typedef std::uint64_t Bits __attribute__((vector_size(16)));  // NOLINT(modernize-use-using)
};
template <>
struct Doubles<4> {
  typedef double Double __attribute__((vector_size(32)));       // NOLINT(modernize-use-using)
  typedef std::uint64_t Bits __attribute__((vector_size(32)));  // NOLINT(modernize-use-using)
};
template <>
struct Doubles<8> {
  typedef double Double __attribute__((vector_size(64)));       // NOLINT(modernize-use-using)
  typedef std::uint64_t Bits __attribute__((vector_size(64)));  // NOLINT(modernize-use-using)
};
#endif

// L values of T at p as L doubles (exact), and L doubles to T at p (rounded as static_cast rounds): one
// conversion a vector. A loop over the lanes would be left to the vectoriser, which leaves 512-bit vectors
// a lane at a time where the build is tuned for 256-bit ones (GCC's -march=native on recent Intel cores).
template <int L, class T>
SSR_LANES_INLINE void widen(const T* p, typename Doubles<L>::Double& v) {
#if defined(SSR_VECTOR_EXTENSIONS)
  if constexpr (L > 1) {
    SSR_LANES(N, T, L);
    N t;
    std::memcpy(&t, p, sizeof t);
    v = __builtin_convertvector(t, typename Doubles<L>::Double);
  } else
#endif
  {
    v = static_cast<double>(*p);
  }
}
template <int L, class T>
SSR_LANES_INLINE void narrow(const typename Doubles<L>::Double& v, T* p) {
#if defined(SSR_VECTOR_EXTENSIONS)
  if constexpr (L > 1) {
    SSR_LANES(N, T, L);
    const N t = __builtin_convertvector(v, N);
    std::memcpy(p, &t, sizeof t);
  } else
#endif
  {
    *p = static_cast<T>(v);
  }
}

// Fused multiply-adds a * b + c over whole vectors, rounded once in each lane, for code whose vectors' width
// is a template's argument: overloads of `apply` for each vector type (declared outside any template, so
// that a vector of a width fixed by a template's arguments finds its own), one instruction a vector where
// the path fuses, else std::fma a lane. FusedAvx2 and FusedAvx512 serve the paths compiled for AVX2 with
// FMA and for AVX-512; FusedOwn the build's own code.
#if defined(SSR_VECTOR_EXTENSIONS)
typedef float Floats4 __attribute__((vector_size(16)));   // NOLINT(modernize-use-using)
typedef float Floats8 __attribute__((vector_size(32)));   // NOLINT(modernize-use-using)
typedef float Floats16 __attribute__((vector_size(64)));  // NOLINT(modernize-use-using)
#endif

// L lanes of floats, as Doubles<L> (GCC also fails to match a float vector whose width is a template's
// argument, declared in the template, with FusedOwn's overloads).
template <int L>
struct Floats;
template <>
struct Floats<1> {
  using Float = float;
};
#if defined(SSR_VECTOR_EXTENSIONS)
template <>
struct Floats<4> {
  using Float = Floats4;
};
template <>
struct Floats<8> {
  using Float = Floats8;
};
template <>
struct Floats<16> {
  using Float = Floats16;
};
#endif

// y = std::fma(a, b, c), for a T.
template <class T>
SSR_LANES_INLINE void fused_one(T& y, const T& a, const T& b, const T& c) {
  y = std::fma(a, b, c);
}

#if defined(SSR_VECTOR_EXTENSIONS)
// y = std::fma(a, b, c) a lane, for a vector of T.
template <class T, class V>
SSR_LANES_INLINE void fused_lanes(V& y, const V& a, const V& b, const V& c) {
  SSR_LANES_FUSED(T, static_cast<int>(sizeof(V) / sizeof(T)), y, a, b, c);
}
#endif

// One overload of `apply` for vectors (or scalars) of type V, computed by `how`. (V names a type: it takes
// no parentheses.)
// NOLINTBEGIN(bugprone-macro-parentheses)
#define SSR_LANES_APPLY(V, how) \
  static SSR_LANES_INLINE void apply(V& y, const V& a, const V& b, const V& c) { (how)(y, a, b, c); }
// NOLINTEND(bugprone-macro-parentheses)

#if defined(SSR_LANES_AVX2)
SSR_LANES_AVX2 inline void fused_avx2(Floats8& y, const Floats8& a, const Floats8& b, const Floats8& c) {
  y = _mm256_fmadd_ps(a, b, c);
}
SSR_LANES_AVX2 inline void fused_avx2(Doubles<4>::Double& y, const Doubles<4>::Double& a, const Doubles<4>::Double& b,
                                      const Doubles<4>::Double& c) {
  y = _mm256_fmadd_pd(a, b, c);
}
struct FusedAvx2 {
  SSR_LANES_APPLY(Floats8, fused_avx2)
  SSR_LANES_APPLY(Doubles<4>::Double, fused_avx2)
};
#endif
#if defined(SSR_LANES_AVX512)
SSR_LANES_AVX512 inline void fused_avx512(Floats16& y, const Floats16& a, const Floats16& b, const Floats16& c) {
  y = _mm512_fmadd_ps(a, b, c);
}
SSR_LANES_AVX512 inline void fused_avx512(Doubles<8>::Double& y, const Doubles<8>::Double& a,
                                          const Doubles<8>::Double& b, const Doubles<8>::Double& c) {
  y = _mm512_fmadd_pd(a, b, c);
}
struct FusedAvx512 {
  SSR_LANES_APPLY(Floats16, fused_avx512)
  SSR_LANES_APPLY(Doubles<8>::Double, fused_avx512)
};
#endif

// The build's own code: one instruction a vector where its target fuses 32 or 64 bytes at once, the
// intrinsic itself (not left to the vectoriser, above).
struct FusedOwn {
  SSR_LANES_APPLY(float, fused_one<float>)
  SSR_LANES_APPLY(double, fused_one<double>)
#if defined(SSR_VECTOR_EXTENSIONS)
  SSR_LANES_APPLY(Floats4, fused_lanes<float>)
  SSR_LANES_APPLY(Doubles<2>::Double, fused_lanes<double>)
#if defined(SSR_LANES_OWN_AVX2)
  SSR_LANES_APPLY(Floats8, fused_avx2)
  SSR_LANES_APPLY(Doubles<4>::Double, fused_avx2)
#else
  SSR_LANES_APPLY(Floats8, fused_lanes<float>)
  SSR_LANES_APPLY(Doubles<4>::Double, fused_lanes<double>)
#endif
#if defined(SSR_LANES_OWN_AVX512)
  SSR_LANES_APPLY(Floats16, fused_avx512)
  SSR_LANES_APPLY(Doubles<8>::Double, fused_avx512)
#else
  SSR_LANES_APPLY(Floats16, fused_lanes<float>)
  SSR_LANES_APPLY(Doubles<8>::Double, fused_lanes<double>)
#endif
#endif
};

#undef SSR_LANES_APPLY

// y = a * b + c rounded once in each of L lanes of doubles (FusedOwn's), for the formulas written once over
// doubles and vectors of them (math::exp_of, math::normal_pair_of).
template <int L>
struct Fused {
  using D = typename Doubles<L>::Double;
  SSR_LANES_INLINE void operator()(D& y, const D& a, const D& b, const D& c) const { FusedOwn::apply(y, a, b, c); }
};

// While it lives, the calling thread's x86 floating-point unit flushes subnormal results to zero and reads
// subnormal inputs as zero (MXCSR's FTZ and DAZ); the caller's setting comes back after, with the
// exceptions' flags raised meanwhile. An operation on a subnormal takes a microcode assist of about a
// hundred cycles on x86 cores: a Sinkhorn pass at small xi, whose small Q_ij times v_j are subnormal, took
// three times as long. Elsewhere it does nothing.
class FlushSubnormals {
 public:
#if defined(__SSE2__)
  FlushSubnormals() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | flags); }
  ~FlushSubnormals() { _mm_setcsr(saved_ | (_mm_getcsr() & raised)); }
#else
  FlushSubnormals() = default;
  ~FlushSubnormals() = default;
#endif
  FlushSubnormals(const FlushSubnormals&) = delete;
  FlushSubnormals& operator=(const FlushSubnormals&) = delete;
  FlushSubnormals(FlushSubnormals&&) = delete;
  FlushSubnormals& operator=(FlushSubnormals&&) = delete;

#if defined(__SSE2__)
 private:
  static constexpr unsigned flags = 0x8040u;   // FTZ (bit 15) and DAZ (bit 6)
  static constexpr unsigned raised = 0x003fu;  // the exceptions' flags (bits 0-5), kept as raised
  unsigned saved_;
#endif
};

// Where a prefetch puts its line: the nearest cache, or L2 (and the levels beyond) but not L1, for data
// that would push out what L1 still has to serve (the Sinkhorn pass's next block: pass::scaled_in_lanes).
enum class Into { l1, l2 };

// Asks for the cache line at p to be read into the cache `into` ahead of its use (no fault, no effect on
// any value); nothing where the compiler has no such builtin.
template <Into into = Into::l1>
SSR_LANES_INLINE void prefetch(const void* p) {
#if defined(__GNUC__)
  __builtin_prefetch(p, 0, into == Into::l1 ? 3 : 2);
#else
  (void)p;
#endif
}

// A stretch of memory to bring into the caches while a loop works on other data, its lines spread evenly
// over the loop's steps, so that it is there when its own turn comes (the Sinkhorn setup reads the next
// block's logits from beyond L2 while it takes this block's exps). Empty by default: nothing asked.
class Ahead {
 public:
  static constexpr std::uintptr_t line = 64;  // bytes

  Ahead() = default;
  // `rows` rows of `cols` elements of `size` bytes, `stride` elements apart; the gaps between the rows too.
  Ahead(const void* first, std::ptrdiff_t rows, std::ptrdiff_t cols, std::ptrdiff_t stride, std::size_t size) {
    if (rows <= 0 || cols <= 0) return;
    const auto begin = reinterpret_cast<std::uintptr_t>(first);
    const auto end = begin + static_cast<std::uintptr_t>((rows - 1) * stride + cols) * size;
    first_ = static_cast<const char*>(first);
    skew_ = begin % line;
    lines_ = (end - (begin - skew_) + line - 1) / line;
  }

  // Walks the stretch over `steps` steps of a loop: each step() asks for the lines due by then, the last
  // step the last line.
  class Spread {
   public:
    Spread(const Ahead& stretch, std::ptrdiff_t steps)
        : first_(stretch.first_),
          skew_(stretch.skew_),
          lines_(steps > 0 ? stretch.lines_ : 0),
          steps_(steps > 0 ? static_cast<std::uintptr_t>(steps) : 1) {}
    SSR_LANES_INLINE void step() {
      for (due_ += lines_; due_ >= steps_; due_ -= steps_, ++asked_)  // line i from its first byte in the stretch
        prefetch(first_ + (asked_ == 0 ? 0 : line * asked_ - skew_));
    }
    // The lines asked for so far, from the first.
    std::uintptr_t asked() const { return asked_; }

   private:
    const char* first_;
    std::uintptr_t skew_, lines_, steps_, due_ = 0, asked_ = 0;
  };

  bool empty() const { return lines_ == 0; }
  std::uintptr_t lines() const { return lines_; }
  std::uintptr_t first_line() const { return reinterpret_cast<std::uintptr_t>(first_) - skew_; }  // its address

 private:
  const char* first_ = nullptr;          // the stretch's first byte
  std::uintptr_t skew_ = 0, lines_ = 0;  // its offset in its line, and the lines from that line on
};

}  // namespace SSR_LANES_NAMESPACE
}  // namespace lanes
}  // namespace cpu
}  // namespace ssr
