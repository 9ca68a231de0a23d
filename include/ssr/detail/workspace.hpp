// Workspace layout: a backend lays out its buffers by taking them one after the other from a Carve.
// The same code measures a layout (no base: workspace_bytes) and places it (a base: the call), so the
// size a caller is told is the size the call uses.
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>

#include "ssr/call.hpp"
#include "ssr/error.hpp"

namespace ssr {
namespace detail {

class Carve {
 public:
  // Every buffer starts at a multiple of this (vector loads on the CPU, coalesced access on a GPU).
  static constexpr std::size_t alignment = 256;

  Carve() = default;
  // Places buffers in [base, base + bytes), base aligned up first.
  Carve(void* base, std::size_t bytes) {
    const auto address = reinterpret_cast<std::uintptr_t>(base);
    const std::size_t skip = (alignment - address % alignment) % alignment;
    base_ = static_cast<unsigned char*>(base) + skip;
    end_ = bytes > skip ? bytes - skip : 0;
  }

  // count elements of V: null while measuring.
  template <class V>
  V* take(std::size_t count) {
    offset_ = (offset_ + alignment - 1) / alignment * alignment;
    V* p = base_ ? reinterpret_cast<V*>(base_ + offset_) : nullptr;
    offset_ += count * sizeof(V);
    if (base_ && offset_ > end_) fail("workspace overrun: ", offset_, " bytes taken from ", end_);
    return p;
  }

  // The bytes a caller must provide for what was taken: the layout plus the room to align any base.
  std::size_t bytes() const { return offset_ + alignment - 1; }

 private:
  unsigned char* base_ = nullptr;
  std::size_t offset_ = 0;
  std::size_t end_ = 0;
};

// Throws unless the caller's workspace holds the `needed` bytes a call's layout measured.
inline void require_workspace(const Workspace& w, std::size_t needed) {
  require(w.bytes >= needed, "workspace.bytes", w.bytes, "the call needs ", needed, " bytes (Router::workspace_bytes)");
}

// The layout of a call in its workspace: the caller's (checked to hold the `needed` bytes), or else the
// backend's own, which grow(needed) makes room for and returns. A failed allocation is a RuntimeError.
template <class Grow>
Carve carve_workspace(const Workspace& caller, std::size_t needed, Grow&& grow) {
  if (!caller.empty()) {
    require_workspace(caller, needed);
    return Carve(caller.data, caller.bytes);
  }
  void* own = nullptr;
  try {
    own = grow(needed);
  } catch (const std::bad_alloc&) {
    throw RuntimeError(concat("cannot allocate ", needed, " bytes of workspace (free memory, or pass a workspace)"));
  }
  return Carve(own, needed);
}

}  // namespace detail
}  // namespace ssr
