// The SMoE example (examples/smoe): every gradient of the layer and of the byte-level model against central
// differences in double precision, for each kind of router; training that learns; determinism; the corpus.
#include <catch2/catch.hpp>

#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#if defined(_OPENMP)
#include <omp.h>
#endif

#include "byte_lm.hpp"
#include "paired.hpp"
#include "corpus.hpp"
#include "routers.hpp"
#include "svg.hpp"
#include "train.hpp"

namespace {

using smoe::Index;
using smoe::Mat;
template <class Policy>
using Router = ssr::Router<Policy, ssr::CpuBackend<double>>;

constexpr double step_size = 1e-6;

// Runs a test on one OpenMP thread: these models are far too small for threads to pay, and on a busy machine
// waking them dominates. (Results do not depend on it: the determinism test compares thread counts.)
struct OneThread {
#if defined(_OPENMP)
  int saved = omp_get_max_threads();
  OneThread() { omp_set_num_threads(1); }
  ~OneThread() { omp_set_num_threads(saved); }
#endif
};

// Compares a gradient with central differences of loss(), entry by entry. A perturbation that changes which
// experts are selected leaves the function's smooth piece: such entries (should_skip() after the +h or -h
// evaluation) are counted and skipped.
struct GradientCheck {
  int checked = 0, skipped = 0;

  // rows: the rows of value to check (all when empty).
  template <class Loss, class Flipped>
  void check(const std::string& name, Mat<double>& value, const Mat<double>& grad, Loss&& loss, Flipped&& flipped,
             const std::vector<bool>& rows = {}) {
    for (Index i = 0; i < value.size(); ++i) {
      if (!rows.empty() && !rows[static_cast<std::size_t>(i / value.cols())]) continue;
      double& v = value.data()[i];
      const double saved = v;
      v = saved + step_size;
      const double up = loss();
      const bool flip_up = flipped();
      v = saved - step_size;
      const double down = loss();
      const bool flip_down = flipped();
      v = saved;
      if (flip_up || flip_down) {
        ++skipped;
        continue;
      }
      const double numeric = (up - down) / (2 * step_size), analytic = grad.data()[i];
      INFO(name << "[" << i << "]: analytic " << analytic << ", central difference " << numeric);
      REQUIRE(std::abs(numeric - analytic) <= 1e-6 + 1e-5 * std::abs(analytic));
      ++checked;
    }
  }
};

void randomise(std::vector<smoe::Tensor<double>> tensors, smoe::Rng& rng) {
  for (auto& t : tensors)
    for (Index i = 0; i < t.value->size(); ++i) t.value->data()[i] = 0.6 * rng.normal();
}

// One SMoE layer, loss sum(Y .* R) + aux: gradients of the gate, noise gate, every expert's weights and
// biases, and the input. fd_routing: route afresh under each perturbation, or replay the base routing
// (the function whose gradient backward gives when the router's weights pass no gradient).
template <class Policy>
GradientCheck check_layer(const Policy& policy, smoe::LayerOptions options, smoe::Routing fd_routing,
                          int bias_steps = 0) {
  const Index m = 12, d = 5, h = 6, n = 4;
  smoe::Rng rng(11);
  smoe::SmoeLayer<double> layer(d, h, n, options, rng);
  randomise(layer.tensors(""), rng);
  Mat<double> x = smoe::random_normal<double>(m, d, 1.0, rng), r = smoe::random_normal<double>(m, d, 1.0, rng);
  Router<Policy> router(policy, ssr::CpuBackend<double>(1));
  smoe::Pass pass{ssr::Context::train(/*step=*/3, /*layer=*/1, /*seed=*/5), /*gate_noise=*/true, smoe::Routing::route};
  for (int b = 0; b < bias_steps; ++b) {  // a bias that is not zero
    smoe::LayerCache<double> warm;
    layer.forward(router, x, pass, warm);
    layer.update_bias(warm);
  }

  smoe::LayerCache<double> base;
  layer.forward(router, x, pass, base);
  Mat<double> grad_x;
  layer.backward(router, base, r, grad_x);

  pass.routing = fd_routing;
  smoe::LayerCache<double> probe;
  auto loss = [&] {
    probe = base;
    const Mat<double> y = layer.forward(router, x, pass, probe);
    return y.cwiseProduct(r).sum() + layer.aux_loss(probe);
  };
  auto flipped = [&] { return probe.experts != base.experts; };
  GradientCheck gc;
  for (auto& t : layer.tensors("")) gc.check(t.name, *t.value, *t.grad, loss, flipped);
  gc.check("x", x, grad_x, loss, flipped);
  REQUIRE(gc.skipped * 50 <= gc.checked);
  return gc;
}

// The byte-level model (two SMoE layers), loss cross-entropy + aux: the embedding, every layer's tensors
// and the read-out.
template <class Policy>
GradientCheck check_model(const Policy& policy, smoe::LayerOptions options, smoe::Routing fd_routing,
                          double momentum = 0, double gamma = 1) {
  smoe::ModelOptions mo;
  mo.context = 2;
  mo.dim = 4;
  mo.hidden = 5;
  mo.experts = 4;
  mo.layers = 3;
  mo.layer = options;
  mo.momentum = momentum;
  mo.step_size = gamma;
  smoe::ByteLM<double> model(mo, 3);
  smoe::Rng rng(17);
  const smoe::Batch batch = smoe::sample_batch(smoe::generate_corpus(4000, 1), 10, mo.context, rng);
  Router<Policy> router(policy, ssr::CpuBackend<double>(1));
  smoe::Pass pass{ssr::Context::train(7, 0, 2), true, smoe::Routing::route};
  model.zero_grad();
  model.forward(router, batch, pass);
  model.backward(router);
  std::vector<smoe::IndexMat> base_experts;
  for (int l = 0; l < model.layers(); ++l) base_experts.push_back(model.cache(l).experts);

  pass.routing = fd_routing;
  auto loss = [&] { return model.forward(router, batch, pass); };
  auto flipped = [&] {
    for (int l = 0; l < model.layers(); ++l)
      if (model.cache(l).experts != base_experts[static_cast<std::size_t>(l)]) return true;
    return false;
  };
  // Embedding rows of bytes the batch does not read have no effect on the loss: their gradient must be 0.
  std::vector<bool> used(static_cast<std::size_t>(mo.context * 256), false);
  for (Index i = 0; i < batch.size(); ++i)
    for (int c = 0; c < mo.context; ++c) used[static_cast<std::size_t>(c * 256 + batch.context(i, c))] = true;
  GradientCheck gc;
  for (auto& t : model.tensors()) {
    if (t.name != "embedding") {
      gc.check(t.name, *t.value, *t.grad, loss, flipped);
      continue;
    }
    gc.check(t.name, *t.value, *t.grad, loss, flipped, used);
    for (Index r = 0; r < t.grad->rows(); ++r)
      if (!used[static_cast<std::size_t>(r)]) REQUIRE(t.grad->row(r).isZero(0));
  }
  REQUIRE(gc.skipped * 50 <= gc.checked);
  return gc;
}

smoe::LayerOptions with_aux(bool on, bool noisy_gating = false) {
  smoe::LayerOptions o;
  o.load_balancing = on ? 0.3 : 0;  // large weights so that a wrong auxiliary gradient cannot hide
  o.z_loss = on ? 0.2 : 0;
  o.noisy_gating = noisy_gating;
  return o;
}

const ssr::SinkhornTopK sinkhorn_scores(2, ssr::Cost::linear, {1.0, 1e-4, 100}, ssr::Weights::scores);
const ssr::SinkhornTopK sinkhorn_plan(2, ssr::Cost::linear, {0.5, 1e-4, 100}, ssr::Weights::plan);

}  // namespace

TEST_CASE("smoe layer: every gradient matches central differences", "[smoe]") {
  const OneThread one;
  for (const bool aux : {false, true}) {
    DYNAMIC_SECTION("softmax top-k, auxiliary losses " << (aux ? "on" : "off")) {
      check_layer(ssr::SoftmaxTopK(2), with_aux(aux), smoe::Routing::route);
    }
    DYNAMIC_SECTION("trainable noisy gating, auxiliary losses " << (aux ? "on" : "off")) {
      check_layer(ssr::SoftmaxTopK(2), with_aux(aux, true), smoe::Routing::route);
    }
    DYNAMIC_SECTION("Sinkhorn with score weights, auxiliary losses " << (aux ? "on" : "off")) {
      check_layer(sinkhorn_scores, with_aux(aux), smoe::Routing::route);
    }
    DYNAMIC_SECTION("Sinkhorn with plan weights (stop-gradient), auxiliary losses " << (aux ? "on" : "off")) {
      check_layer(sinkhorn_plan, with_aux(aux), smoe::Routing::replay);
    }
    DYNAMIC_SECTION("SSR-S with noise, Sinkhorn path, auxiliary losses " << (aux ? "on" : "off")) {
      check_layer(ssr::make_ssr(2, ssr::Cost::softmax, 1.0, {0.1, 1e-4, 100}, 0.05), with_aux(aux), smoe::Routing::replay);
    }
  }
}

TEST_CASE("smoe layer: gradients with capacity, sigmoid scores, bias, groups and the sequence-wise loss", "[smoe]") {
  const OneThread one;
  smoe::LayerOptions o = with_aux(true);
  o.capacity = 0.75;  // ceil(0.75 * 12 * 2 / 4) = 5 tokens per expert: some assignments are dropped
  o.sequence_balance = 0.4;
  o.seq_len = 4;
  o.bias_rate = 0.05;
  const ssr::SoftmaxTopK grouped(2, ssr::Cost::linear, {ssr::Score::sigmoid, 2, 1});
  check_layer(grouped, o, smoe::Routing::route, 3);
  check_layer(ssr::SoftmaxTopK(2, ssr::Cost::linear, {ssr::Score::sigmoid, 1, 1}), o, smoe::Routing::route, 3);
  check_layer(ssr::SoftmaxTopK(2), o, smoe::Routing::route);

  // The dropped assignments are those over capacity, and they reach no expert.
  smoe::Rng rng(3);
  smoe::SmoeLayer<double> layer(5, 6, 4, o, rng);
  const Mat<double> x = smoe::random_normal<double>(40, 5, 1.0, rng);
  Router<ssr::SoftmaxTopK> router(ssr::SoftmaxTopK(2));
  smoe::LayerCache<double> c;
  layer.forward(router, x, {ssr::Context::train(0), false, smoe::Routing::route}, c);
  const Index capacity = ssr::expert_capacity(0.75, 40, 2, 4);
  Index over = 0;
  for (const std::int32_t l : c.load) over += std::max<Index>(0, l - capacity);
  REQUIRE(over > 0);
  REQUIRE(c.dropped == over);
  REQUIRE(c.offsets.back() == 80 - over);
  layer.forward(router, x, {ssr::Context::train(0), false, smoe::Routing::route, /*capacity=*/false}, c);
  REQUIRE(c.dropped == 0);
}

TEST_CASE("smoe layer: plan weights pass the gate no gradient but the auxiliary losses'", "[smoe]") {
  const Index m = 16, d = 3, n = 4;
  for (const bool aux : {false, true}) {
    smoe::Rng rng(5);
    smoe::SmoeLayer<double> layer(d, 4, n, with_aux(aux), rng);
    const Mat<double> x = smoe::random_normal<double>(m, d, 1.0, rng), r = smoe::random_normal<double>(m, d, 1.0, rng);
    Router<ssr::SinkhornTopK> router(sinkhorn_plan);
    smoe::LayerCache<double> c;
    layer.forward(router, x, {ssr::Context::train(0), false, smoe::Routing::route}, c);
    Mat<double> grad_x;
    layer.backward(router, c, r, grad_x);
    const Mat<double>& grad_gate = *layer.tensors("")[0].grad;
    if (aux) {
      const Mat<double> aux_only = (layer.options().load_balancing * c.load_balancing_grad +
                                    layer.options().z_loss * c.z_loss_grad).transpose() * x;
      REQUIRE(grad_gate.isApprox(aux_only, 1e-12));
    } else {
      REQUIRE(grad_gate.isZero(0));
    }
  }
}

TEST_CASE("smoe byte LM: gradients of embedding, layers and read-out match central differences", "[smoe]") {
  const OneThread one;
  SECTION("softmax top-k") { check_model(ssr::SoftmaxTopK(2), with_aux(false), smoe::Routing::route); }
  SECTION("softmax top-k with load-balancing and z-loss") {
    check_model(ssr::SoftmaxTopK(2), with_aux(true), smoe::Routing::route);
  }
  SECTION("trainable noisy gating with auxiliary losses") {
    check_model(ssr::SoftmaxTopK(2), with_aux(true, true), smoe::Routing::route);
  }
  SECTION("Sinkhorn with score weights") { check_model(sinkhorn_scores, with_aux(true), smoe::Routing::route); }
  SECTION("SSR-L, Sinkhorn path (plan weights, stop-gradient)") {
    check_model(ssr::make_ssr(2, ssr::Cost::linear, 1.0, {0.5, 1e-4, 100}), with_aux(true), smoe::Routing::replay);
  }
  SECTION("Momentum SMoE (mu 0.6, gamma 0.8)") {
    check_model(ssr::SoftmaxTopK(2), with_aux(true), smoe::Routing::route, 0.6, 0.8);
    check_model(sinkhorn_scores, with_aux(false), smoe::Routing::route, 0.9, 1.3);
  }
}

namespace {

smoe::ModelOptions tiny_model() {
  smoe::ModelOptions mo;
  mo.context = 3;
  mo.dim = 24;
  mo.hidden = 32;
  mo.experts = 4;
  mo.layers = 1;
  return mo;
}

smoe::TrainOptions tiny_training(int steps, std::uint64_t seed = 0) {
  smoe::TrainOptions to;
  to.steps = steps;
  to.batch = 64;
  to.seed = seed;
  to.eval_tokens = 2048;
  return to;
}

const smoe::Corpus& tiny_corpus() {
  static const smoe::Corpus corpus = smoe::Corpus::split(smoe::generate_corpus(60000, 1), 3);
  return corpus;
}

}  // namespace

TEST_CASE("smoe byte LM: a few hundred Adam steps cut the loss by a clear margin", "[smoe]") {
  const OneThread one;
  for (const std::string name : {"softmax", "ssr-l"}) {
    DYNAMIC_SECTION(name) {
      smoe::RouterSettings settings;
      settings.p = 0.1;
      smoe::with_router(name, settings, [&](const auto& policy, const smoe::LayerOptions& layer) {
        smoe::ModelOptions mo = tiny_model();
        mo.layer = layer;
        const smoe::RunResult r = smoe::train<float>(policy, mo, tiny_corpus(), tiny_training(300));
        const double first = r.history.front().train_bits, valid = r.eval_softmax.bits_per_byte;
        INFO("first batch " << first << " bits/byte, validation after 300 steps " << valid);
        REQUIRE(first > 7.5);  // about log2(256) = 8 before training
        REQUIRE(valid < first - 4.0);
        REQUIRE(std::isfinite(r.eval_sinkhorn.bits_per_byte));
      });
    }
  }
}

TEST_CASE("smoe byte LM: training is deterministic for a seed, across runs and thread counts", "[smoe]") {
  const auto policy = ssr::make_ssr(2, ssr::Cost::softmax, 0.3, {0.1, 1e-4, 100}, 0.05);
  smoe::ModelOptions mo = tiny_model();
  mo.layers = 2;
  mo.layer.noisy_gating = true;
  auto run = [&](std::uint64_t seed) { return smoe::train<float>(policy, mo, tiny_corpus(), tiny_training(12, seed)); };
  auto losses = [](const smoe::RunResult& r) {
    std::vector<double> v;
    for (const auto& s : r.history) v.push_back(s.train_bits);
    v.push_back(r.eval_softmax.bits_per_byte);
    v.push_back(r.eval_sinkhorn.bits_per_byte);
    return v;
  };
  smoe::RunResult a, again, other_seed;
  {
    const OneThread one;
    a = run(4);
    again = run(4);
    other_seed = run(5);
  }
  REQUIRE(a.sinkhorn_calls > 0);
  REQUIRE(losses(again) == losses(a));
  REQUIRE(losses(other_seed) != losses(a));
#if defined(_OPENMP)
  const int threads = omp_get_max_threads();
  omp_set_num_threads(2);
  const smoe::RunResult two_threads = run(4);
  omp_set_num_threads(threads);
  REQUIRE(losses(two_threads) == losses(a));
#endif
}

TEST_CASE("smoe corpus: generated text is reproducible, has four registers, and its sums are correct", "[smoe]") {
  const std::string text = smoe::generate_corpus(20000, 9);
  REQUIRE(text.size() == 20000);
  REQUIRE(smoe::generate_corpus(20000, 9) == text);
  REQUIRE(smoe::generate_corpus(20000, 10) != text);
  for (const char* marker : {". ", "</", "ACG", "="}) REQUIRE(text.find(marker) != std::string::npos);
  // Every complete "a+b=c;" is a correct sum.
  int sums = 0;
  for (std::size_t at = text.find('+'); at != std::string::npos; at = text.find('+', at + 1)) {
    std::size_t begin = at;
    while (begin > 0 && std::isdigit(static_cast<unsigned char>(text[begin - 1]))) --begin;
    long a = 0, b = 0, c = 0;
    int used = 0;
    if (begin == at || std::sscanf(text.c_str() + begin, "%ld+%ld=%ld;%n", &a, &b, &c, &used) != 3 || used == 0) continue;
    if (begin > 0 && text[begin - 1] != ';' && text[begin - 1] != '\n') continue;  // a clipped first operand
    REQUIRE(a + b == c);
    ++sums;
  }
  REQUIRE(sums > 50);
}

TEST_CASE("smoe corpus: split and batches", "[smoe]") {
  const smoe::Corpus c = smoe::Corpus::split(std::string(1000, 'a') + std::string(100, 'b'), 4);
  REQUIRE(c.train.size() == 990);
  REQUIRE(c.valid.size() == 110);
  const auto batches = smoe::sequential_batches(c.valid, 32, 4, 1000);
  Index tokens = 0;
  for (const auto& b : batches) tokens += b.size();
  REQUIRE(tokens == 106);  // every position after the first 4
  REQUIRE(batches.back().targets.back() == 'b');
  REQUIRE(batches.front().context(0, 3) == 'a');  // context(i, c): c + 1 bytes back

  // Batches of sequences: each of 8 rows of consecutive positions, and validation batches that mix
  // sequences from across the text, every position once.
  smoe::Rng rng(1);
  const std::string text = smoe::generate_corpus(5000, 2);
  const smoe::Batch b = smoe::sample_batch(text, 32, 4, rng, 8);
  for (Index i = 0; i < 32; ++i)
    if (i % 8 != 7) REQUIRE(b.context(i + 1, 0) == b.targets[static_cast<std::size_t>(i)]);
  // A text that holds the context and one sequence exactly: every draw is that window; one byte less, an error.
  const smoe::Batch whole = smoe::sample_batch(text.substr(0, 12), 8, 4, rng, 8);
  for (Index i = 0; i < 8; ++i) REQUIRE(whole.targets[static_cast<std::size_t>(i)] == text[static_cast<std::size_t>(4 + i)]);
  REQUIRE_THROWS_WITH(smoe::sample_batch(text.substr(0, 11), 8, 4, rng, 8),
                      Catch::Contains("11 bytes") && Catch::Contains("4 bytes of context and a sequence of 8"));
  const auto mixed = smoe::sequential_batches(text, 64, 4, 1000, 16);
  // Every prediction once: the batches' (context, target) windows are, as a multiset, those of positions
  // 4 .. 1003 (equal windows are interchangeable predictions).
  using Window = std::array<int, 5>;
  const auto window_at = [&](std::size_t p) {
    return Window{static_cast<unsigned char>(text[p - 1]), static_cast<unsigned char>(text[p - 2]),
                  static_cast<unsigned char>(text[p - 3]), static_cast<unsigned char>(text[p - 4]),
                  static_cast<unsigned char>(text[p])};
  };
  std::map<Window, int> expected, got;
  for (std::size_t p = 4; p < 1004; ++p) ++expected[window_at(p)];
  for (const auto& batch : mixed) {
    REQUIRE(batch.size() <= 64);
    for (Index i = 0; i < batch.size(); ++i)
      ++got[Window{batch.context(i, 0), batch.context(i, 1), batch.context(i, 2), batch.context(i, 3),
                   batch.targets[static_cast<std::size_t>(i)]}];
  }
  REQUIRE(got == expected);
  REQUIRE(mixed.size() == 16);  // 1000 predictions, 63 sequences of 16, 4 per batch

  // The attacked text: a seeded fraction of its bytes replaced, the rest untouched.
  const std::string clean = smoe::generate_corpus(100000, 3);
  REQUIRE(smoe::attack(clean, 0, 1) == clean);
  const std::string attacked = smoe::attack(clean, 0.1, 1);
  REQUIRE(smoe::attack(clean, 0.1, 1) == attacked);
  REQUIRE(smoe::attack(clean, 0.1, 2) != attacked);
  std::size_t changed = 0;
  for (std::size_t i = 0; i < clean.size(); ++i) changed += clean[i] != attacked[i];
  REQUIRE(changed > 9000);   // 10% drawn, of which 1/256 keep their byte by chance
  REQUIRE(changed < 10600);

  const std::string shakespeare = SSR_SHARED_DATA "/tinyshakespeare.txt";  // beside the project, when present
  if (std::filesystem::exists(shakespeare)) {
    const smoe::Corpus s = smoe::Corpus::split(smoe::read_file(shakespeare), 4);
    REQUIRE(s.train.size() + s.valid.size() == 1115394);
    REQUIRE(s.valid.size() == 111539);
  }
}

TEST_CASE("paired differences: Student's t quantiles and the interval of a known sample", "[smoe]") {
  // Quantiles to four places (R: qt(0.975, df)).
  for (const auto& [df, q] : std::vector<std::pair<int, double>>{
           {1, 12.7062}, {2, 4.3027}, {9, 2.2622}, {30, 2.0423}, {31, 2.0395}, {40, 2.0211}, {120, 1.9799}})
    CHECK(smoe::t_quantile_975(df) == Approx(q).margin(1e-4));
  CHECK_THROWS(smoe::t_quantile_975(0));
  // Differences 0.5, 1.0, 0.1: mean 0.5333, sd 0.4509, interval mean -+ 4.3027 sd / sqrt(3).
  const auto d = smoe::paired_difference({1.0, 2.0, 3.0}, {0.5, 1.0, 2.9});
  CHECK(d.mean == Approx(0.5333333333));
  CHECK(d.low == Approx(-0.5868264).margin(1e-4));
  CHECK(d.high == Approx(1.6534931).margin(1e-4));
  CHECK_FALSE(d.excludes_zero());
  CHECK(smoe::paired_difference({1.1, 2.11, 3.12}, {1.0, 2.0, 3.0}).excludes_zero());  // 0.11 -+ 0.025
  const auto one = smoe::paired_difference({2.0}, {1.5});
  CHECK(one.mean == 0.5);
  CHECK_FALSE(one.known());
  CHECK(std::isnan(one.low));
  CHECK_THROWS(smoe::paired_difference({1.0}, {1.0, 2.0}));
}

TEST_CASE("a chart's title puts its parenthesis on a second line, whole", "[smoe][svg]") {
  const auto chart = [](const std::string& title) {
    const std::string path = (std::filesystem::temp_directory_path() / "ssr-test-chart.svg").string();
    smoe::write_line_chart(path, title, "step", "value", {{"a", {1.0, 2.0, 3.0}, {}, {}}});
    std::ifstream in(path);
    const std::string svg((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::remove(path.c_str());
    return svg;
  };
  const std::string both = chart("Expert load (mean of 8 seeds)");
  CHECK(both.find(">Expert load</text>") != std::string::npos);
  CHECK(both.find(">mean of 8 seeds</text>") != std::string::npos);
  CHECK(chart("Expert load").find(">Expert load</text>") != std::string::npos);
  CHECK(chart("Loss (unclosed").find(">unclosed</text>") != std::string::npos);  // no letter lost
}
