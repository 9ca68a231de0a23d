// A cache-line aligned buffer that only grows: workspaces reuse it so repeated calls allocate nothing.
#pragma once

#include <cstddef>
#include <memory>
#include <new>

namespace ssr {
namespace detail {

template <class T>
class AlignedBuffer {
 public:
  static constexpr std::size_t alignment = 64;

  AlignedBuffer() = default;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  AlignedBuffer(AlignedBuffer&&) noexcept = default;
  ~AlignedBuffer() = default;
  AlignedBuffer& operator=(AlignedBuffer&&) noexcept = default;

  // Makes room for n elements; contents are unspecified after a growth.
  T* reserve(std::size_t n) {
    if (n > capacity_) {
      data_.reset(static_cast<T*>(::operator new[](n * sizeof(T), std::align_val_t{alignment})));
      capacity_ = n;
    }
    return data_.get();
  }
  T* data() const { return data_.get(); }
  std::size_t capacity() const { return capacity_; }

 private:
  struct Free {
    void operator()(T* p) const { ::operator delete[](p, std::align_val_t{alignment}); }
  };
  std::unique_ptr<T, Free> data_;
  std::size_t capacity_ = 0;
};

}  // namespace detail
}  // namespace ssr
