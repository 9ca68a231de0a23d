// How one call runs, as the engine that makes it decides: the stream its work is ordered on (GPU), the
// scratch memory it uses, whether it scans its inputs, and whether it waits for its results.
#pragma once

#include <cstddef>

#include "ssr/communicator.hpp"

namespace ssr {

// The stream type of host backends, which run a call on the calling thread (and its OpenMP team).
struct HostStream {};

// Caller-owned scratch memory of a call: `bytes` bytes at `data`, any alignment, in the backend's memory
// space (device memory for a GPU backend). Query the size with Router::workspace_bytes.
struct Workspace {
  void* data = nullptr;
  std::size_t bytes = 0;

  bool empty() const { return data == nullptr; }
};

template <class Stream>
struct CallOptions {
  // GPU backends: every kernel and copy of the call is ordered on this stream (default: the default
  // stream). Host backends: unused.
  Stream stream{};
  // Caller scratch of at least workspace_bytes(...) bytes. Empty: the backend's own, which grows on the
  // first call of a shape and is reused after, so a warmed-up call allocates nothing.
  Workspace workspace{};
  // Scan the logits (route) or weights and gradients (backward) and throw ssr::Error at a non-finite
  // value before anything is written. A GPU reads one flag back for it, which waits for the stream: an
  // engine that has validated its inputs turns it off for a call that never waits.
  bool check_finite = true;
  // GPU backends: return only once the call's work is done and its RouteInfo is complete. Otherwise the
  // call returns once its work is queued (see RouteInfo::pending).
  bool wait = false;
  // Ranks that route shards of one problem (each with its Context::first_row): the Sinkhorn path balances
  // the plan over all of them. Null: this process alone. The softmax path never communicates.
  const Communicator<Stream>* communicator = nullptr;

  // Builders, for one-line options: CallOptions<S>().on(stream).using_workspace(ws).unchecked().
  CallOptions& on(Stream s) {
    stream = s;
    return *this;
  }
  CallOptions& using_workspace(Workspace w) {
    workspace = w;
    return *this;
  }
  CallOptions& unchecked() {
    check_finite = false;
    return *this;
  }
  CallOptions& waiting() {
    wait = true;
    return *this;
  }
  CallOptions& across(const Communicator<Stream>& ranks) {
    communicator = &ranks;
    return *this;
  }
};

}  // namespace ssr
