// libFuzzer target: Router::route and ssr::backward on the CPU backend, through every router by name, with
// arbitrary shapes, strides, parameters and values (infinities, NaN, denormals, huge and tiny xi), and then,
// from the bytes left, the same logits under a selection of today's engines (sigmoid scores, groups, an
// expert bias of any values). A call either succeeds or throws ssr::Error before writing; a successful call
// on finite logits gives experts in range, each at most once per row, finite weights summing to 1 per row,
// and a load that counts them; a float backward rounds the double backward's values. Then, from the bytes
// left, the same configuration on thousands of rows and two threads. (What came later comes last, so
// that earlier inputs decode as they did.)
#include <fuzzer/FuzzedDataProvider.h>
#include <ssr/router.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <type_traits>
#include <vector>

namespace {

// A property that failed: named on stderr, then a crash for libFuzzer to keep the input.
#define SSR_FUZZ_CHECK(condition)                                                         \
  do {                                                                                    \
    if (!(condition)) {                                                                   \
      std::fprintf(stderr, "fuzz_route: %s failed (line %d)\n", #condition, __LINE__);  \
      __builtin_trap();                                                                   \
    }                                                                                     \
  } while (false)

template <class T>
T any_value(FuzzedDataProvider& in) {
  switch (in.ConsumeIntegralInRange<int>(0, 9)) {
    case 0: return std::numeric_limits<T>::quiet_NaN();
    case 1: return std::numeric_limits<T>::infinity() * (in.ConsumeBool() ? 1 : -1);
    case 2: return std::numeric_limits<T>::denorm_min() * in.ConsumeIntegralInRange<int>(-3, 3);
    case 3: return std::numeric_limits<T>::max() * (in.ConsumeBool() ? 1 : -1);
    case 4: {  // any bit pattern
      T v;
      const auto bits = in.ConsumeBytes<unsigned char>(sizeof(T));
      std::vector<unsigned char> b(sizeof(T), 0);
      std::copy(bits.begin(), bits.end(), b.begin());
      std::memcpy(&v, b.data(), sizeof(T));
      return v;
    }
    default: return static_cast<T>(in.ConsumeFloatingPointInRange<double>(-30.0, 30.0));
  }
}

// The properties of a successful call on finite logits.
template <class T>
void check_outputs(const std::vector<std::int32_t>& experts, const std::vector<T>& weights,
                   const std::vector<std::int32_t>& load, ssr::index_t m, ssr::index_t n, ssr::index_t k) {
  std::vector<std::int64_t> counted(static_cast<std::size_t>(n), 0);
  for (ssr::index_t i = 0; i < m; ++i) {
    double sum = 0;
    for (ssr::index_t a = 0; a < k; ++a) {
      const std::int32_t e = experts[static_cast<std::size_t>(i * k + a)];
      SSR_FUZZ_CHECK(e >= 0 && e < n);
      for (ssr::index_t b = 0; b < a; ++b) SSR_FUZZ_CHECK(experts[static_cast<std::size_t>(i * k + b)] != e);
      const T w = weights[static_cast<std::size_t>(i * k + a)];
      SSR_FUZZ_CHECK(std::isfinite(w) && w >= 0);
      sum += static_cast<double>(w);
      ++counted[static_cast<std::size_t>(e)];
    }
    SSR_FUZZ_CHECK(std::fabs(sum - 1) < 1e-3);
  }
  for (ssr::index_t j = 0; j < n; ++j) SSR_FUZZ_CHECK(counted[static_cast<std::size_t>(j)] == load[static_cast<std::size_t>(j)]);
}

double any_parameter(FuzzedDataProvider& in) {
  static const double picks[] = {0.5,  1e-300, 1e-30, 1e-6, 1e-3, 0.1,  1.0, 10.0, 1e6, 1e30, 1e300, 0.0, -1.0,
                                 std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN()};
  return in.ConsumeBool() ? in.PickValueInArray(picks) : in.ConsumeFloatingPoint<double>();
}

// The fuzzed logits: m x n with a row stride, and whether every value is finite.
template <class T>
struct Logits {
  ssr::index_t m, n, stride;
  std::vector<T> values;
  bool finite;
  ssr::ConstMatrixView<T> view() const { return {values.data(), m, n, stride}; }
};

// One call of a named router: its outputs, filled with a marker, so that a call that throws can be seen
// to have written nothing. Null when the configuration is invalid.
template <class T>
struct Call {
  using Router = ssr::Router<ssr::SSRPolicy, ssr::CpuBackend<T>>;
  Router router;
  ssr::index_t m, n, k;
  std::vector<std::int32_t> experts, load;
  std::vector<T> weights;
  typename Router::options_type options{};

  Call(const ssr::SSRPolicy& policy, ssr::index_t m_, ssr::index_t n_, ssr::index_t k_, bool checked, int threads)
      : router(policy, ssr::CpuBackend<T>(threads)), m(m_), n(n_), k(k_), experts(static_cast<std::size_t>(m * k), -7),
        load(static_cast<std::size_t>(n), -7), weights(static_cast<std::size_t>(m * k)) {
    if (!checked) options.unchecked();
  }
  ssr::RouteOutputs<T> outputs() { return {{experts.data(), m, k}, {weights.data(), m, k}, {load.data(), n}}; }

  static std::unique_ptr<Call> of(const ssr::RouterConfig& config, ssr::index_t m, ssr::index_t n, bool checked,
                                  int threads = 1) {
    try {
      return std::make_unique<Call>(ssr::make_policy(config), m, n, config.k, checked, threads);
    } catch (const ssr::Error&) {
      return nullptr;
    }
  }

  // Routes; false when the call threw, having written nothing.
  bool route(ssr::ConstMatrixView<T> logits, const ssr::Context& ctx, ssr::RouteOutputs<T> out, ssr::RouteInfo& info) {
    try {
      info = router.route(logits, ctx, out, options);
      return true;
    } catch (const ssr::Error&) {
      SSR_FUZZ_CHECK(experts.empty() || experts[0] == -7);  // nothing written before an error
      return false;
    }
  }
};

// For float: backward again in double on the same values (each float exact in double) gives dL/dS whose
// rounding to float is the float call's, bit for bit (backward computes in double and rounds once).
template <class T>
void check_against_double(const ssr::RouterConfig& config, const ssr::RouteInfo& info, const Logits<T>& s,
                          const std::vector<std::int32_t>& experts, const std::vector<T>& weights,
                          const std::vector<T>& grad_w, const std::vector<T>& grad_s, ssr::index_t k) {
  if constexpr (std::is_same<T, float>::value) {
    const ssr::index_t m = s.m, n = s.n;
    const std::vector<double> logits(s.values.begin(), s.values.end()), w(weights.begin(), weights.end()),
        g(grad_w.begin(), grad_w.end());
    std::vector<double> grad(static_cast<std::size_t>(m * n));
    ssr::Router<ssr::SSRPolicy, ssr::CpuBackend<double>> router(ssr::make_policy(config), ssr::CpuBackend<double>(1));
    router.backward(info,
                    {{logits.data(), m, n, s.stride},
                     {experts.data(), m, k},
                     {w.data(), m, k},
                     {g.data(), m, k},
                     {grad.data(), m, n}},
                    ssr::CallOptions<ssr::HostStream>{}.unchecked());
    for (std::size_t e = 0; e < grad.size(); ++e) {
      const float want = static_cast<float>(grad[e]);
      SSR_FUZZ_CHECK(std::memcmp(&want, &grad_s[e], sizeof want) == 0 || (std::isnan(want) && std::isnan(grad_s[e])));
    }
  }
}

// Every router by name on the logits, then the backward of that call on arbitrary dL/dw.
template <class T>
void route_and_backward(FuzzedDataProvider& in, const ssr::RouterConfig& config, const Logits<T>& s,
                        const ssr::Context& ctx, bool checked, int threads = 1) {
  const auto call = Call<T>::of(config, s.m, s.n, checked, threads);
  if (!call) return;
  const ssr::index_t m = s.m, n = s.n, k = call->k;
  std::vector<T> plan(static_cast<std::size_t>(m * n)), noise(static_cast<std::size_t>(m * n));
  ssr::RouteOutputs<T> out = call->outputs();
  if (in.ConsumeBool()) out.plan = {plan.data(), m, n};
  if (in.ConsumeBool()) out.noise = {noise.data(), m, n};
  ssr::RouteInfo info;
  if (!call->route(s.view(), ctx, out, info)) return;
  SSR_FUZZ_CHECK(!checked || s.finite);
  if (s.finite) check_outputs(call->experts, call->weights, call->load, m, n, k);

  std::vector<T> grad_w(static_cast<std::size_t>(m * k)), grad_s(static_cast<std::size_t>(m * n));
  bool grad_finite = true;
  for (auto& g : grad_w) {
    g = in.remaining_bytes() > 0 ? any_value<T>(in) : T(1);
    grad_finite = grad_finite && std::isfinite(g);
  }
  try {
    call->router.backward(
        info,
        {{}, {call->experts.data(), m, k}, {call->weights.data(), m, k}, {grad_w.data(), m, k}, {grad_s.data(), m, n}},
        call->options);
  } catch (const ssr::Error&) {
    SSR_FUZZ_CHECK(!s.finite || !grad_finite || !checked);
    return;
  }
  if (s.finite && grad_finite) {
    for (const T g : grad_s) SSR_FUZZ_CHECK(!std::isnan(g));
  }
  check_against_double(config, info, s, call->experts, call->weights, grad_w, grad_s, k);
}

// The logits again under a selection: score, groups (valid or not) and an expert bias of any values; the
// backward, given the logits, on bounded dL/dw is finite.
template <class T>
void route_selection(FuzzedDataProvider& in, ssr::RouterConfig config, const Logits<T>& s, const ssr::Context& ctx,
                     bool checked) {
  config.select.score = in.ConsumeBool() ? ssr::Score::sigmoid : ssr::Score::softmax;
  config.select.n_groups = in.ConsumeIntegralInRange<int>(0, 9);
  config.select.topk_groups = in.ConsumeIntegralInRange<int>(-1, 10);
  if (in.ConsumeBool()) config.noise_alpha = 0;
  std::vector<float> bias(in.ConsumeBool() ? static_cast<std::size_t>(s.n) : 0);
  for (float& b : bias) b = in.remaining_bytes() > 0 ? any_value<float>(in) : 0.0f;
  const auto call = Call<T>::of(config, s.m, s.n, checked);
  if (!call) return;
  const ssr::index_t m = s.m, n = s.n, k = call->k;
  ssr::RouteInfo info;
  if (!call->route(s.view(), bias.empty() ? ctx : ctx.with_bias({bias.data(), n}), call->outputs(), info)) return;
  if (!s.finite) return;
  check_outputs(call->experts, call->weights, call->load, m, n, k);
  std::vector<T> grad_w(static_cast<std::size_t>(m * k)), grad_s(static_cast<std::size_t>(m * n));
  for (auto& g : grad_w) g = in.remaining_bytes() > 0 ? static_cast<T>(in.ConsumeFloatingPointInRange<double>(-1e3, 1e3)) : T(1);
  call->router.backward(info,
                        {s.view(),
                         {call->experts.data(), m, k},
                         {call->weights.data(), m, k},
                         {grad_w.data(), m, k},
                         {grad_s.data(), m, n}},
                        call->options);
  for (const T g : grad_s) SSR_FUZZ_CHECK(std::isfinite(g));
  check_against_double(config, info, s, call->experts, call->weights, grad_w, grad_s, k);
}

// The same configuration on many rows and two threads: the thread teams, blocks and groups of tiles that
// few rows never reach. The logits are drawn from a small generator seeded by the input, some of them
// replaced by the input's own values, so that an input of a few bytes reaches thousands of rows.
template <class T>
void route_large(FuzzedDataProvider& in, const ssr::RouterConfig& config, const ssr::Context& ctx, bool checked) {
  // Up to 3 * 10^5 elements, so that a solve of 120 iterations under the sanitizers stays near a second.
  const ssr::index_t m = in.ConsumeIntegralInRange<ssr::index_t>(1000, 20000);
  const ssr::index_t n = in.ConsumeIntegralInRange<ssr::index_t>(1, std::min<ssr::index_t>(140, 300000 / m));
  const double scale = any_parameter(in);
  std::uint64_t state = in.ConsumeIntegral<std::uint64_t>() | 1;
  Logits<T> s{m, n, n, std::vector<T>(static_cast<std::size_t>(m * n)), true};
  for (T& v : s.values) {
    state ^= state << 13;  // xorshift64
    state ^= state >> 7;
    state ^= state << 17;
    v = static_cast<T>(scale * (static_cast<double>(state >> 11) / 9007199254740992.0 - 0.5));
  }
  for (int e = 0; e < 16 && in.remaining_bytes() > 0; ++e)
    s.values[in.ConsumeIntegralInRange<std::size_t>(0, s.values.size() - 1)] = any_value<T>(in);
  for (const T v : s.values) s.finite = s.finite && std::isfinite(v);
  route_and_backward(in, config, s, ctx, checked, 2);
}

template <class T>
void fuzz(FuzzedDataProvider& in) {
  const ssr::index_t m = in.ConsumeIntegralInRange<ssr::index_t>(0, 48), n = in.ConsumeIntegralInRange<ssr::index_t>(1, 40);
  const ssr::index_t stride = n + in.ConsumeIntegralInRange<ssr::index_t>(0, 3);
  ssr::RouterConfig config;
  static const char* const routers[] = {"softmax", "sinkhorn", "ssr", "selective"};
  config.router = in.PickValueInArray(routers);
  config.k = in.ConsumeIntegralInRange<int>(-1, static_cast<int>(n) + 1);
  config.cost = in.ConsumeBool() ? ssr::Cost::linear : ssr::Cost::softmax;
  config.weights = in.ConsumeBool() ? ssr::Weights::plan : ssr::Weights::scores;
  config.sinkhorn = {any_parameter(in), any_parameter(in), in.ConsumeIntegralInRange<int>(-1, 120)};
  config.p = in.ConsumeBool() ? in.ConsumeProbability<double>() : any_parameter(in);
  config.noise_alpha = in.ConsumeBool() ? 0.0 : any_parameter(in);
  config.noise_sigma = in.ConsumeBool() ? 1.0 : any_parameter(in);
  const bool training = in.ConsumeBool(), checked = in.ConsumeBool();
  const ssr::Context ctx = training ? ssr::Context::train(in.ConsumeIntegral<std::uint32_t>(), in.ConsumeIntegral<std::uint32_t>(),
                                                          in.ConsumeIntegral<std::uint32_t>())
                                    : ssr::Context::eval();
  Logits<T> s{m, n, stride, std::vector<T>(static_cast<std::size_t>(m * stride)), true};
  for (ssr::index_t i = 0; i < m; ++i) {
    for (ssr::index_t j = 0; j < n; ++j) {
      const T v = in.remaining_bytes() > 0 ? any_value<T>(in) : T(0);
      s.values[static_cast<std::size_t>(i * stride + j)] = v;
      s.finite = s.finite && std::isfinite(v);
    }
  }
  route_and_backward(in, config, s, ctx, checked);
  if (in.remaining_bytes() > 0) route_selection(in, config, s, ctx, checked);
  if (in.remaining_bytes() > 0 && in.ConsumeBool()) route_large<T>(in, config, ctx, checked);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider in(data, size);
  if (in.ConsumeBool()) {
    fuzz<float>(in);
  } else {
    fuzz<double>(in);
  }
  return 0;
}
