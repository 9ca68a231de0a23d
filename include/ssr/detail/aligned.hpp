// A cache-line aligned buffer that only grows: workspaces reuse it so repeated calls allocate nothing.
// On Linux a buffer of 2 MiB or more lies on whole 2 MiB pages and asks the kernel for transparent huge
// pages (madvise; granted where /sys/kernel/mm/transparent_hugepage/enabled is `madvise` or `always`): a
// pass over a matrix beyond the caches then crosses a page boundary, where the hardware prefetchers stop,
// every 2 MiB instead of every 4 KiB, and needs fewer page walks (1.1-1.4x an iteration over 24 MiB or
// more, docs/performance.md).
#pragma once

#include <cstddef>
#include <memory>
#include <new>

#if defined(__linux__)
#include <sys/mman.h>
#endif
#if defined(__linux__) && defined(MADV_HUGEPAGE)
#define SSR_HUGE_PAGES 1
#else
#define SSR_HUGE_PAGES 0
#endif

namespace ssr {
namespace detail {

template <class T>
class AlignedBuffer {
 public:
  static constexpr std::size_t alignment = 64;
  static constexpr std::size_t huge_page = std::size_t{2} << 20;

  AlignedBuffer() = default;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  AlignedBuffer(AlignedBuffer&&) noexcept = default;
  ~AlignedBuffer() = default;
  AlignedBuffer& operator=(AlignedBuffer&&) noexcept = default;

  // Makes room for n elements; contents are unspecified after a growth.
  T* reserve(std::size_t n) {
    if (n > capacity_) {
      const std::size_t bytes = n * sizeof(T);
      const bool huge = SSR_HUGE_PAGES && bytes >= huge_page;
      const std::size_t align = huge ? huge_page : alignment;
      const std::size_t whole = huge ? (bytes + huge_page - 1) / huge_page * huge_page : bytes;
      data_ = std::unique_ptr<T, Free>(static_cast<T*>(::operator new[](whole, std::align_val_t{align})),
                                       Free{std::align_val_t{align}});
#if SSR_HUGE_PAGES
      if (huge) madvise(data_.get(), whole, MADV_HUGEPAGE);  // advice: where refused, 4 KiB pages as before
#endif
      capacity_ = n;
    }
    return data_.get();
  }
  T* data() const { return data_.get(); }
  std::size_t capacity() const { return capacity_; }

 private:
  struct Free {
    std::align_val_t align{alignment};
    void operator()(T* p) const { ::operator delete[](p, align); }
  };
  std::unique_ptr<T, Free> data_;
  std::size_t capacity_ = 0;
};

}  // namespace detail
}  // namespace ssr
