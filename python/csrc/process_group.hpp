// A torch.distributed process group as the ranks of one routing problem (ssr::Communicator): its
// all-reduces run on tensors over the solve's own buffers, in place. Gloo groups serve the CPU kernels,
// NCCL groups the CUDA kernels (the group orders its collectives after the current stream's work). And
// the kernels' common step: the router, the context, and the checks agreed on by the group's ranks.
#pragma once

#include <ATen/ATen.h>
#include <ssr/communicator.hpp>
#include <ssr/error.hpp>
#include <ssr/policy/selective.hpp>
#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "args.hpp"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

namespace ssr_torch {

template <class Stream>
class ProcessGroupCommunicator final : public ssr::Communicator<Stream> {
 public:
  // The group registered under name (ProcessGroup.group_name in Python); buffers live on device.
  ProcessGroupCommunicator(const std::string& name, c10::Device device)
      : group_(c10d::resolve_process_group(name)), device_(device) {}

  int rank() const override { return group_->getRank(); }
  int size() const override { return group_->getSize(); }

  void sum(std::int64_t* data, std::size_t count, Stream /*stream*/) const override {
    all_reduce(data, count, at::kLong, c10d::ReduceOp::SUM);
  }
  void max(double* data, std::size_t count, Stream /*stream*/) const override {
    all_reduce(data, count, at::kDouble, c10d::ReduceOp::MAX);
  }
  void sum_on_host(std::int64_t* data, std::size_t count, Stream stream) const override {
    if (device_.is_cpu()) return sum(data, count, stream);
    const at::Tensor host = at::from_blob(data, {static_cast<int64_t>(count)}, at::kLong);
    std::vector<at::Tensor> tensors{host.to(device_)};
    group_->allreduce(tensors, options(c10d::ReduceOp::SUM))->wait();
    host.copy_(tensors[0]);  // a copy to host memory waits for the reduction
  }

 private:
  static c10d::AllreduceOptions options(c10d::ReduceOp::RedOpType op) {
    c10d::AllreduceOptions o;
    o.reduceOp = c10d::ReduceOp(op);
    return o;
  }
  void all_reduce(void* data, std::size_t count, at::ScalarType type, c10d::ReduceOp::RedOpType op) const {
    std::vector<at::Tensor> tensors{
        at::from_blob(data, {static_cast<int64_t>(count)}, at::TensorOptions().dtype(type).device(device_))};
    group_->allreduce(tensors, options(op))->wait();
  }

  c10::intrusive_ptr<c10d::ProcessGroup> group_;
  c10::Device device_;
};

// What a kernel returns: experts, weights, load and info.
using Routed = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

// A kernel's call made ready (checked, its memory allocated): it routes over the ranks given, or alone.
template <class Communicator>
using RouteCall = std::function<Routed(const Communicator*)>;

// Runs prepare(policy, context), which checks the tensors and allocates what the call needs, then the call
// it returns. The options decide the path, the same on every rank; the tensors and first rows may differ,
// so with a group, on the Sinkhorn path, the first row's check and prepare are agreed on by the ranks before
// the call's first collective (and the library's own checks after): an error, or a failed allocation, on
// one rank is an error on every rank. The call gets no ranks without a group and on the softmax path, which
// does not communicate.
template <class Stream, class Prepare>
Routed route_in_group(const RouteArgs& args, const std::string& group, c10::Device device, Stream stream,
                      const Prepare& prepare) {
  try {
    const ssr::SSRPolicy policy = args.policy_value();
    const ssr::Context ctx = args.context();
    RouteCall<ProcessGroupCommunicator<Stream>> call;
    const auto checks = [&] { call = prepare(policy, args.placed(ctx)); };
    std::optional<ProcessGroupCommunicator<Stream>> ranks;
    if (!group.empty() && policy.resolve(ctx).path == ssr::Path::sinkhorn) {
      ranks.emplace(group, device);
      ssr::agree(*ranks, stream, 0, checks);
    } else {
      checks();
    }
    return call(ranks ? &*ranks : nullptr);
  } catch (const ssr::Error& e) {
    TORCH_CHECK(false, e.what());
  }
}

}  // namespace ssr_torch
