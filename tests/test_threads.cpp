// Many Routers routing at once from several threads, each thread its own Router (a Router holds its
// workspace and must not route from two threads at once): every result equals the sequential run's, bit
// for bit. Built under ThreadSanitizer by scripts/tsan.sh.
#include <catch2/catch.hpp>

#include <ssr/router.hpp>

#include <cstring>
#include <thread>
#include <vector>

#include "support.hpp"

namespace {

// One thread's work: its own router and calls over several shapes, steps and both paths of SSR.
std::vector<test::Routed<float>> work(int id, int threads_per_router) {
  ssr::Router<ssr::SSRPolicy> router(ssr::make_ssr(2, ssr::Cost::linear, 0.5, {}, 0.2), ssr::CpuBackend<float>(threads_per_router));
  std::vector<test::Routed<float>> results;
  for (int call = 0; call < 6; ++call) {
    const ssr::index_t m = 200 + 37 * ((id + call) % 5), n = 8 + 4 * (call % 3);
    const auto s = test::random_logits<float>(m, n, 1.0, static_cast<unsigned>(10 * id + call), 2.0);
    results.emplace_back(m, n, 2);
    results.back().info = router.route({s.data(), m, n}, ssr::Context::train(static_cast<std::uint64_t>(call), 0, 3),
                                       results.back().outputs());
  }
  return results;
}

}  // namespace

TEST_CASE("routers on several threads at once give the sequential results", "[threads]") {
  const int threads = 6;
  for (int per_router : {1, 2}) {
    std::vector<std::vector<test::Routed<float>>> sequential, concurrent(threads);
    for (int id = 0; id < threads; ++id) sequential.push_back(work(id, per_router));
    std::vector<std::thread> pool;
    for (int id = 0; id < threads; ++id) pool.emplace_back([&, id] { concurrent[static_cast<std::size_t>(id)] = work(id, per_router); });
    for (auto& t : pool) t.join();
    for (int id = 0; id < threads; ++id) {
      for (std::size_t c = 0; c < sequential[static_cast<std::size_t>(id)].size(); ++c)
        test::require_identical(sequential[static_cast<std::size_t>(id)][c], concurrent[static_cast<std::size_t>(id)][c]);
    }
  }
}
