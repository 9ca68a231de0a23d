// SSR_HD marks functions that run on the host and, under nvcc, on the device too. SSR_INLINE marks what
// the CPU backend's vector kernels inline into functions compiled for another instruction set (a vector
// passed to a function compiled for another target would change the call's ABI).
#pragma once

#if defined(__CUDACC__)
#define SSR_HD __host__ __device__
#else
#define SSR_HD
#endif

#if defined(__GNUC__) && !defined(__CUDACC__)
#define SSR_INLINE __attribute__((always_inline)) inline
#define SSR_INLINE_LAMBDA __attribute__((always_inline))  // after a lambda's parameters
#else
#define SSR_INLINE inline
#define SSR_INLINE_LAMBDA
#endif

// SSR_LANES_BEGIN and SSR_LANES_END enclose code instantiated with the CPU backend's vectors, whose
// functions take and return them by value: GCC notes that this changes the ABI of a call compiled without
// the vectors' registers (-Wpsabi), but each such function is inlined (SSR_INLINE), so no call is left.
// GCC 12 also takes a vector built from a broadcast scalar (U{} + x) for uninitialised once inlined into an
// AVX2 kernel (-Wmaybe-uninitialized); the sanitizer builds and the tests see what that would hide.
#if defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__)
#define SSR_LANES_BEGIN                                                        \
  _Pragma("GCC diagnostic push") _Pragma("GCC diagnostic ignored \"-Wpsabi\"") \
      _Pragma("GCC diagnostic ignored \"-Wmaybe-uninitialized\"")
#define SSR_LANES_END _Pragma("GCC diagnostic pop")
#else
#define SSR_LANES_BEGIN
#define SSR_LANES_END
#endif
