// The CUDA backend with a communicator: one rank of a distributed problem routes as the single-process
// solve (the same rows, the Thrust path on the stream instead of the fused solve: experts identical,
// weights within 2e-6), through a loopback communicator and, with SSR_TEST_NCCL, through NCCL.
#include <catch2/catch.hpp>

#ifdef SSR_TEST_NCCL
#include <ssr/cuda/nccl.cuh>
#endif

#include <cmath>

#include "support.hpp"

using ssr::Context;
using ssr::index_t;

namespace {

// One rank: sums and maxima over ranks are the values themselves.
class Loopback final : public ssr::Communicator<cudaStream_t> {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void sum(std::int64_t* /*data*/, std::size_t /*count*/, cudaStream_t /*stream*/) const override {}
  void max(double* /*data*/, std::size_t /*count*/, cudaStream_t /*stream*/) const override {}
  void sum_on_host(std::int64_t* /*data*/, std::size_t /*count*/, cudaStream_t /*stream*/) const override {}
};

void require_one_rank_routes_alone(const ssr::Communicator<cudaStream_t>& ranks) {
  const index_t m = 3000, n = 16, k = 2;
  const auto s = test::random_logits<float>(m, n, 2.0, 8, 3.0);
  const ssr::NoisyCost<ssr::SinkhornTopK> policy(ssr::SinkhornTopK(2, ssr::Cost::linear, {0.5, 1e-6, 100}), 0.2, 1.0);
  const auto alone = test::route(policy, s, m, n, Context::train(4));
  test::Router<ssr::NoisyCost<ssr::SinkhornTopK>, float> router(policy);
  test::Routed<float> shared(m, n, k);
  shared.info = router.route({s.data(), m, n}, Context::train(4), shared.outputs(),
                             typename test::Router<ssr::NoisyCost<ssr::SinkhornTopK>, float>::options_type{}.across(ranks));
  CHECK(shared.info.complete());  // a distributed solve reads its decision every iteration
  CHECK(shared.info.iterations == alone.info.iterations);
  CHECK(shared.experts == alone.experts);
  CHECK(shared.noise == alone.noise);
  double worst = 0;
  for (std::size_t e = 0; e < shared.weights.size(); ++e)
    worst = std::max(worst, std::abs(static_cast<double>(shared.weights[e]) - alone.weights[e]));
  CHECK(worst <= 2e-6);
}

}  // namespace

TEST_CASE("one rank of a distributed problem routes as one process", "[cuda][distributed]") {
  require_one_rank_routes_alone(Loopback());
#ifdef SSR_TEST_NCCL
  ncclComm_t comm;
  const int device = 0;
  REQUIRE(ncclCommInitAll(&comm, 1, &device) == ncclSuccess);
  {
    const ssr::NcclCommunicator nccl(comm);
    CHECK(nccl.size() == 1);
    require_one_rank_routes_alone(nccl);
  }
  ncclCommDestroy(comm);
#endif
}
