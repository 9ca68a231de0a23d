// After warm-up, a routing call and its backward on the CPU allocate nothing: every heap allocation of the
// process (malloc and its relatives, which operator new and Eigen use) is counted while a call runs. And an
// allocation that fails (the allocator refusing large blocks) is an ssr::RuntimeError, not a crash.
#include <catch2/catch.hpp>

#include <ssr/router.hpp>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <vector>

extern "C" {
void* __libc_malloc(std::size_t);
void* __libc_calloc(std::size_t, std::size_t);
void* __libc_realloc(void*, std::size_t);
void* __libc_memalign(std::size_t, std::size_t);
}

namespace {
std::atomic<bool> counting{false};
std::atomic<long> allocations{0};
std::atomic<std::size_t> refused_from{SIZE_MAX};  // blocks of this many bytes or more are refused
void* counted(void* p) {
  if (counting.load(std::memory_order_relaxed)) allocations.fetch_add(1, std::memory_order_relaxed);
  return p;
}
bool refused(std::size_t size) { return size >= refused_from.load(std::memory_order_relaxed); }
}  // namespace

// The process's allocation functions, forwarding to glibc's, counting, and refusing when told to.
extern "C" {
void* malloc(std::size_t size) noexcept { return refused(size) ? nullptr : counted(__libc_malloc(size)); }
void* calloc(std::size_t count, std::size_t size) noexcept {
  return refused(count * size) ? nullptr : counted(__libc_calloc(count, size));
}
void* realloc(void* p, std::size_t size) noexcept { return refused(size) ? nullptr : counted(__libc_realloc(p, size)); }
void* aligned_alloc(std::size_t alignment, std::size_t size) noexcept {
  return refused(size) ? nullptr : counted(__libc_memalign(alignment, size));
}
void* memalign(std::size_t alignment, std::size_t size) noexcept {
  return refused(size) ? nullptr : counted(__libc_memalign(alignment, size));
}
int posix_memalign(void** p, std::size_t alignment, std::size_t size) noexcept {
  *p = refused(size) ? nullptr : counted(__libc_memalign(alignment, size));
  return *p ? 0 : 12;  // ENOMEM
}
}

namespace {

// Allocations made by f.
template <class F>
long allocations_in(F&& f) {
  allocations = 0;
  counting = true;
  f();
  counting = false;
  return allocations.load();
}

template <class T, class Policy>
void require_no_allocation(const Policy& policy, ssr::index_t m, ssr::index_t n, int threads) {
  const int k = policy.resolve(ssr::Context{}).k;
  std::vector<T> s(static_cast<std::size_t>(m * n)), w(static_cast<std::size_t>(m * k)), g(w.size(), T(1)),
      grad(s.size()), plan(s.size());
  for (std::size_t e = 0; e < s.size(); ++e) s[e] = static_cast<T>((e * 7919) % 101) / T(17);
  std::vector<std::int32_t> experts(w.size()), load(static_cast<std::size_t>(n));
  ssr::Router<Policy, ssr::CpuBackend<T>> router(policy, ssr::CpuBackend<T>(threads));
  const ssr::RouteOutputs<T> out{{experts.data(), m, k}, {w.data(), m, k}, {load.data(), n}, {plan.data(), m, n}};
  int paths[2] = {0, 0};  // softmax, Sinkhorn
  auto call = [&](std::uint64_t step) {
    const auto info = router.route({s.data(), m, n}, ssr::Context::train(step, 0, 1), out);
    ++paths[info.path == ssr::Path::softmax ? 0 : 1];
    router.backward(info, {{}, {experts.data(), m, k}, {w.data(), m, k}, {g.data(), m, k}, {grad.data(), m, n}});
  };
  for (std::uint64_t step = 0; step < 4; ++step) call(step);  // warm-up: both paths of a selective policy
  INFO("m " << m << " n " << n << " threads " << threads);
  constexpr bool selective = std::is_same<Policy, ssr::SSRPolicy>::value;
  if (selective) REQUIRE((paths[0] > 0 && paths[1] > 0));
  const int warm[2] = {paths[0], paths[1]};
  for (std::uint64_t step = 4; step < 12; ++step) REQUIRE(allocations_in([&] { call(step); }) == 0);
  if (selective) REQUIRE((paths[0] > warm[0] && paths[1] > warm[1]));  // the calls measured took both too
  // With the caller's workspace, even the first call of a fresh router allocates nothing.
  std::vector<unsigned char> workspace(router.workspace_bytes(m, n));
  ssr::Router<Policy, ssr::CpuBackend<T>> fresh(policy, ssr::CpuBackend<T>(threads));
  REQUIRE(allocations_in([&] {
            fresh.route({s.data(), m, n}, ssr::Context::train(0, 0, 1), out,
                        ssr::CallOptions<ssr::HostStream>{}.using_workspace({workspace.data(), workspace.size()}));
          }) == 0);
}

}  // namespace

TEST_CASE("a warmed-up call allocates nothing", "[allocation]") {
  const auto noisy_ssr = ssr::make_ssr(2, ssr::Cost::softmax, 0.5, {0.5, 1e-4, 50}, 0.3);
  for (const auto& shape : {std::pair<ssr::index_t, ssr::index_t>{300, 8}, {20000, 16}, {3000, 100}}) {
    for (int threads : {1, 2}) {
      require_no_allocation<float>(ssr::SoftmaxTopK(2), shape.first, shape.second, threads);
      require_no_allocation<float>(noisy_ssr, shape.first, shape.second, threads);
      require_no_allocation<double>(noisy_ssr, shape.first, shape.second, threads);
      require_no_allocation<float>(ssr::SinkhornTopK(4, ssr::Cost::linear, {0.1, 1e-4, 50}, ssr::Weights::scores),
                                   shape.first, shape.second, threads);
    }
  }
}

TEST_CASE("the counter sees allocations", "[allocation]") {
  void* (*volatile allocate)(std::size_t) = std::malloc;  // calls the compiler cannot elide
  int* (*volatile make)() = [] { return new int(3); };
  CHECK(allocations_in([&] { std::free(allocate(10)); }) == 1);
  CHECK(allocations_in([&] { delete make(); }) == 1);
}

TEST_CASE("an allocation that fails is an ssr::RuntimeError, nothing is written, and the router works after",
          "[allocation]") {
  const ssr::index_t m = 20000, n = 16, k = 2;
  std::vector<float> s(static_cast<std::size_t>(m * n), 0.25f), w(static_cast<std::size_t>(m * k), -1.0f);
  std::vector<std::int32_t> experts(w.size(), -1), load(static_cast<std::size_t>(n), -1);
  const ssr::RouteOutputs<float> out{{experts.data(), m, k}, {w.data(), m, k}, {load.data(), n}};
  for (int threads : {1, 2}) {
    ssr::Router<ssr::SinkhornTopK> router{ssr::SinkhornTopK(static_cast<int>(k)), ssr::CpuBackend<float>(threads)};
    refused_from = router.workspace_bytes(m, n) / 2;  // the call's own workspace cannot be had
    try {
      router.route({s.data(), m, n}, ssr::Context::train(0), out);
      refused_from = SIZE_MAX;
      FAIL("the call succeeded without its workspace");
    } catch (const ssr::RuntimeError& e) {
      refused_from = SIZE_MAX;
      CHECK(std::string(e.what()).find("cannot allocate") != std::string::npos);
    }
    CHECK(experts[0] == -1);
    CHECK(load[0] == -1);
    const auto info = router.route({s.data(), m, n}, ssr::Context::train(0), out);
    CHECK(info.path == ssr::Path::sinkhorn);
    CHECK(load[0] + load[1] > 0);
    std::fill(experts.begin(), experts.end(), -1);
    std::fill(load.begin(), load.end(), -1);
  }
}
