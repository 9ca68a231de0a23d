// ssr-smoe-demo: trains the same byte-level SMoE language model with each router of the paper's Table 1
// and of today's engines (same seed, same data), with an expert capacity that makes imbalance cost tokens,
// and compares validation bits per byte (clean, attacked, without capacity, balanced at inference), expert
// load, dropped tokens, Sinkhorn calls, step time and the blocks' output norms. Writes per-step metrics as
// CSV and the expert load and loss over training as SVG charts.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include <unistd.h>
#if defined(_OPENMP)
#include <omp.h>
#endif

#include "corpus.hpp"
#include "paired.hpp"
#include "routers.hpp"
#include "svg.hpp"
#include "train.hpp"

namespace {

struct Args {
  smoe::TrainOptions train;
  smoe::ModelOptions model;
  smoe::RouterSettings routers;
  std::vector<std::string> names;
  int seeds = 1;
  int threads = 1;
  std::string out = "smoe-out", csv, data, json;
};

// The generated corpus: 1 MiB from a fixed seed, the same text whatever --seed says.
constexpr std::size_t corpus_bytes = 1 << 20;
constexpr std::uint64_t corpus_seed = 2024;

const char* usage =
    "usage: ssr-smoe-demo [options]\n"
    "  --steps N       training steps per router (default 800)\n"
    "  --routers LIST  comma-separated subset of the routers below (default: all)\n"
    "  --p P           SSR's Sinkhorn probability per layer and step (default 0.05, scaled for short runs)\n"
    "  --noise A       cost noise alpha of the -noise SSR variants (default 0.05)\n"
    "  --xi XI         the Sinkhorn routers' xi (default: each one's own, in its description below)\n"
    "  --seeds N       repeat with seeds S, S+1, ..., print mean +- standard deviation, and each router's\n"
    "                  difference to softmax top-k (and softmax+lb) seed by seed, with its 95% interval (default 1)\n"
    "  --seed S        first seed (default 0)\n"
    "  --batch M       tokens per step (default 256)\n"
    "  --seq-len L     a batch is M / L sequences of L consecutive predictions (the last shorter where L does\n"
    "                  not divide M), L <= M (default 32)\n"
    "  --capacity F    expert capacity factor: at most ceil(F k M / n) tokens per expert and step, the rest\n"
    "                  skip it; 0: no limit (default 1)\n"
    "  --momentum MU   Momentum SMoE: p_l = -SMoE_l(x_l) + MU p_(l-1), x_(l+1) = x_l - GAMMA p_l (default 0)\n"
    "  --step-size G   GAMMA of Momentum SMoE (default 1)\n"
    "  --attack R      also validate on the validation text with a fraction R of its bytes randomised (default 0.1)\n"
    "  --threads N     OpenMP threads, used where the work pays for them (default 1; at the default model size\n"
    "                  nothing does, and 2 threads run as fast as 1)\n"
    "  --data FILE     train on FILE (90% train, 10% validation) instead of the generated corpus\n"
    "  --out DIR       output directory (default smoe-out)\n"
    "  --csv PATH      per-step metrics (default DIR/steps.csv)\n"
    "  --json PATH     every router's results per seed and the paired differences, as JSON\n"
    "routers:\n";

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

// A number option's value, all of it: "1e3" for --steps or "256k" for --batch is an error, not 1 or 256.
template <class Parse>
auto number(const std::string& flag, const std::string& value, Parse parse) {
  std::size_t used = 0;
  try {
    const auto v = parse(value, &used);
    const bool negative_unsigned = std::is_unsigned_v<decltype(v)> && value.find('-') != std::string::npos;
    if (used == value.size() && !negative_unsigned) return v;
  } catch (const std::exception&) {  // std::invalid_argument or std::out_of_range: named below
  }
  throw std::invalid_argument(flag + " takes a number, not '" + value + "'");
}

Args parse(int argc, char** argv) {
  Args a;
  a.train.steps = 800;
  a.train.eval_every = 200;
  a.train.seq_len = 32;
  a.train.attack = 0.1;
  a.routers.capacity = 1.0;
  for (const auto& r : smoe::router_names()) a.names.push_back(r.name);
  const auto as_int = [](const std::string& v, std::size_t* n) { return std::stoi(v, n); };
  const auto as_long = [](const std::string& v, std::size_t* n) { return std::stol(v, n); };
  const auto as_real = [](const std::string& v, std::size_t* n) { return std::stod(v, n); };
  const auto as_unsigned = [](const std::string& v, std::size_t* n) { return std::stoull(v, n); };
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      std::cout << usage;
      for (const auto& r : smoe::router_names()) std::cout << "  " << r.name << ": " << r.description << "\n";
      std::exit(0);
    }
    if (i + 1 >= argc) throw std::invalid_argument(flag + " needs a value (see --help)");
    const std::string value = argv[++i];
    if (flag == "--steps") a.train.steps = number(flag, value, as_int);
    else if (flag == "--routers") a.names = split_list(value);
    else if (flag == "--p") a.routers.p = number(flag, value, as_real);
    else if (flag == "--noise") a.routers.noise_alpha = number(flag, value, as_real);
    else if (flag == "--xi") a.routers.xi = number(flag, value, as_real);
    else if (flag == "--seeds") a.seeds = number(flag, value, as_int);
    else if (flag == "--seed") a.train.seed = number(flag, value, as_unsigned);
    else if (flag == "--batch") a.train.batch = number(flag, value, as_long);
    else if (flag == "--seq-len") a.train.seq_len = number(flag, value, as_long);
    else if (flag == "--capacity") a.routers.capacity = number(flag, value, as_real);
    else if (flag == "--momentum") a.model.momentum = number(flag, value, as_real);
    else if (flag == "--step-size") a.model.step_size = number(flag, value, as_real);
    else if (flag == "--attack") a.train.attack = number(flag, value, as_real);
    else if (flag == "--threads") a.threads = number(flag, value, as_int);
    else if (flag == "--data") a.data = value;
    else if (flag == "--out") a.out = value;
    else if (flag == "--csv") a.csv = value;
    else if (flag == "--json") a.json = value;
    else throw std::invalid_argument("unknown option " + flag + " (see --help)");
  }
  if (a.train.steps < 1 || a.seeds < 1 || a.train.batch < 1 || a.threads < 1 || a.train.seq_len < 1)
    throw std::invalid_argument("--steps, --seeds, --batch, --seq-len and --threads must be at least 1");
  if (a.train.seq_len > a.train.batch) throw std::invalid_argument("--seq-len must not exceed --batch (a batch's predictions)");
  if (!(a.routers.capacity >= 0) || !std::isfinite(a.routers.capacity))
    throw std::invalid_argument("--capacity must be finite and >= 0");
  if (!(a.train.attack >= 0 && a.train.attack <= 1)) throw std::invalid_argument("--attack must lie in [0, 1]");
  if (!(a.routers.xi >= 0) || !std::isfinite(a.routers.xi)) throw std::invalid_argument("--xi must be > 0 (or 0: each router's own)");
  if (!(a.routers.noise_alpha >= 0) || !std::isfinite(a.routers.noise_alpha))
    throw std::invalid_argument("--noise must be finite and >= 0");
  if (!std::isfinite(a.model.momentum) || !std::isfinite(a.model.step_size))
    throw std::invalid_argument("--momentum and --step-size must be finite");
  for (const std::string& name : a.names) smoe::with_router(name, a.routers, [](auto&&...) {});  // names exist
  for (std::size_t i = 0; i < a.names.size(); ++i)
    if (std::find(a.names.begin(), a.names.begin() + static_cast<std::ptrdiff_t>(i), a.names[i]) !=
        a.names.begin() + static_cast<std::ptrdiff_t>(i))
      throw std::invalid_argument("--routers names " + a.names[i] + " twice");
  if (a.csv.empty()) a.csv = a.out + "/steps.csv";
  return a;
}

// A number as the stream writes it ("0.05", not "0.050000").
std::string shortest(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

// Mean and sample standard deviation, printed as "mean" or "mean ± sd".
std::string summary(const std::vector<double>& v, int decimals) {
  double mean = 0, var = 0;
  for (double x : v) mean += x / static_cast<double>(v.size());
  for (double x : v) var += (x - mean) * (x - mean);
  char buf[64];
  if (v.size() < 2) {
    std::snprintf(buf, sizeof buf, "%.*f", decimals, mean);
  } else {
    std::snprintf(buf, sizeof buf, "%.*f ± %.*f", decimals, mean, decimals, std::sqrt(var / static_cast<double>(v.size() - 1)));
  }
  return buf;
}

std::vector<double> moving_average(const std::vector<double>& y, std::size_t window) {
  std::vector<double> out(y.size());
  double sum = 0;
  for (std::size_t i = 0; i < y.size(); ++i) {
    sum += y[i];
    if (i >= window) sum -= y[i - window];
    out[i] = sum / static_cast<double>(std::min(i + 1, window));
  }
  return out;
}

class Progress {
 public:
  explicit Progress(int total) : total_(total), tty_(isatty(2) != 0), start_(Clock::now()) {}
  void update(const std::string& router, std::uint64_t seed, int step, double bits) {
    const bool last = step + 1 == total_;
    const int every = tty_ ? 10 : std::max(1, total_ / 5);  // a log file gets a few lines, a terminal a live one
    if (!last && (step + 1) % every != 0) return;
    const double elapsed = std::chrono::duration<double>(Clock::now() - start_).count();
    std::fprintf(stderr, "%s%-13s seed %llu  step %5d/%d  loss %.3f bits/byte  %6.1f s%s", tty_ ? "\r" : "",
                 router.c_str(), static_cast<unsigned long long>(seed), step + 1, total_, bits, elapsed,
                 tty_ && !last ? "" : "\n");
    std::fflush(stderr);
  }

 private:
  using Clock = std::chrono::steady_clock;
  int total_;
  bool tty_;
  Clock::time_point start_;
};

using smoe::Index;

struct RouterRuns {
  std::string name;
  std::vector<smoe::RunResult> runs;  // one per seed
};

// Each router's training loss minus the reference's, seed by seed, each seed's difference smoothed; per
// step the mean over seeds and its 95% interval (paired t), for the loss chart.
std::vector<smoe::Series> loss_differences(const std::vector<RouterRuns>& results, const RouterRuns& reference,
                                           std::size_t window) {
  std::vector<smoe::Series> out;
  for (const RouterRuns& rr : results) {
    if (&rr == &reference) continue;
    std::vector<std::vector<double>> seeds;  // smoothed differences, one per seed
    for (std::size_t s = 0; s < rr.runs.size(); ++s) {
      std::vector<double> d(rr.runs[s].history.size());
      for (std::size_t i = 0; i < d.size(); ++i)
        d[i] = rr.runs[s].history[i].train_bits - reference.runs[s].history[i].train_bits;
      seeds.push_back(moving_average(d, window));
    }
    smoe::Series series{rr.name, {}, {}, {}};
    const std::vector<double> zeros(seeds.size(), 0.0);
    for (std::size_t i = 0; i < seeds.front().size(); ++i) {
      std::vector<double> at(seeds.size());
      for (std::size_t s = 0; s < seeds.size(); ++s) at[s] = seeds[s][i];
      const smoe::PairedDifference d = smoe::paired_difference(at, zeros);
      series.y.push_back(d.mean);
      if (d.known()) {
        series.low.push_back(d.low);
        series.high.push_back(d.high);
      }
    }
    out.push_back(std::move(series));
  }
  return out;
}

using Columns = std::map<std::string, std::vector<double>>;

// A router's results, one value per seed under each metric's name.
Columns columns_of(const RouterRuns& rr, int layers, bool attacked, double vanilla_ms) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  Columns col;
  for (const smoe::RunResult& r : rr.runs) {
      col["bpb"].push_back(r.eval_softmax.bits_per_byte);
      col["bpb_attacked"].push_back(attacked ? r.eval_attacked.bits_per_byte : nan);  // JSON null: not run
      col["bpb_free"].push_back(r.eval_no_capacity.bits_per_byte);
      col["bpb_sk"].push_back(r.eval_sinkhorn.bits_per_byte);
      col["drop_train"].push_back(100 * r.train_dropped);
      col["drop_val"].push_back(100 * r.eval_softmax.dropped);
      for (int l = 0; l < layers; ++l)
        col["norm" + std::to_string(l)].push_back(r.eval_softmax.output_norm[static_cast<std::size_t>(l)]);
      col["train_mm"].push_back(r.train_max_over_mean);
      col["val_mm"].push_back(r.eval_softmax.max_over_mean);
      col["val_cv"].push_back(r.eval_softmax.cv);
      col["empty"].push_back(r.eval_softmax.empty_experts);
      col["sinkhorn"].push_back(r.sinkhorn_calls);
      col["ms"].push_back(1e3 * r.seconds_per_step);
      col["routing_ms"].push_back(1e3 * r.routing_seconds_per_step);
      if (vanilla_ms > 0) col["ratio"].push_back(1e3 * r.seconds_per_step / vanilla_ms);
    }
  return col;
}

// The routers each router is compared with, seed by seed, where the run has them: softmax top-k, and the
// same with the load-balancing loss.
const char* const references[] = {"softmax", "softmax+lb"};

// The metrics compared seed by seed: column name, heading, decimals.
struct PairedMetric {
  const char* column;
  const char* heading;
  int decimals;
};
const PairedMetric paired_metrics[] = {{"bpb", "val bits/byte", 4},
                                       {"bpb_attacked", "attacked", 4},
                                       {"val_mm", "load max/mean, validation", 3},
                                       {"drop_val", "dropped %, validation", 2}};

// "+0.0123 [-0.0040, +0.0286]", with " *" where the interval excludes zero.
std::string interval(const smoe::PairedDifference& d, int decimals) {
  if (!d.known()) return "-";
  char buf[128];
  std::snprintf(buf, sizeof buf, "%+.*f [%+.*f, %+.*f]%s", decimals, d.mean, decimals, d.low, decimals, d.high,
                d.excludes_zero() ? " *" : "");
  return buf;
}

// Each router's paired differences to each reference the run has, as Markdown tables.
std::string paired_tables(const std::vector<RouterRuns>& results, std::map<std::string, Columns>& columns,
                          const Args& args) {
  std::ostringstream t;
  for (const char* ref : references) {
    if (columns.count(ref) == 0) continue;
    t << "\nPaired against " << ref << ": the mean difference over " << args.seeds << " seeds of "
      << args.train.steps << " steps (each router trained with the same seeds, data order and initialisation) "
      << "and its 95% interval (paired t, " << args.seeds - 1 << " degrees of freedom); * the interval excludes zero\n\n"
      << "| router |";
    for (const PairedMetric& metric : paired_metrics) t << " " << metric.heading << " |";
    t << "\n|---|";
    for (std::size_t i = 0; i < std::size(paired_metrics); ++i) t << "---|";
    t << "\n";
    for (const RouterRuns& rr : results) {
      if (rr.name == ref) continue;
      t << "| " << rr.name << " |";
      for (const PairedMetric& metric : paired_metrics) {
        const bool shown = args.train.attack > 0 || std::string(metric.column) != "bpb_attacked";
        t << " "
          << (shown ? interval(smoe::paired_difference(columns[rr.name][metric.column], columns[ref][metric.column]),
                               metric.decimals)
                    : std::string("-"))
          << " |";
      }
      t << "\n";
    }
  }
  return t.str();
}

// A JSON string: quotes, backslashes and control characters escaped (a file name may hold any of them).
void json_string(std::ostream& os, const std::string& s) {
  os << '"';
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      os << '\\' << c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
      os << buf;
    } else {
      os << c;
    }
  }
  os << '"';
}

void json_number(std::ostream& os, double v) {
  if (std::isfinite(v)) {
    os << v;
  } else {
    os << "null";
  }
}

// The setup, every router's values per seed, and the paired differences, as JSON.
void write_json(const std::string& path, const Args& args, const std::vector<RouterRuns>& results,
                std::map<std::string, Columns>& columns) {
  std::ofstream os(path);
  os.precision(10);
  os << "{\"seeds\": " << args.seeds << ", \"first_seed\": " << args.train.seed << ", \"steps\": " << args.train.steps
     << ", \"batch\": " << args.train.batch << ", \"p\": " << args.routers.p << ", \"xi\": " << args.routers.xi
     << ", \"noise_alpha\": " << args.routers.noise_alpha << ", \"capacity\": " << args.routers.capacity
     << ", \"data\": ";
  json_string(os, args.data.empty() ? "generated corpus" : args.data);
  os << ",\n \"routers\": {";
  for (std::size_t i = 0; i < results.size(); ++i) {
    os << (i ? ",\n  " : "\n  ") << "\"" << results[i].name << "\": {";
    bool first = true;
    for (const auto& [metric, values] : columns[results[i].name]) {
      os << (first ? "" : ", ") << "\"" << metric << "\": [";
      for (std::size_t s = 0; s < values.size(); ++s) {
        if (s) os << ", ";
        json_number(os, values[s]);
      }
      os << "]";
      first = false;
    }
    os << "}";
  }
  os << "},\n \"paired\": {";
  bool first_ref = true;
  for (const char* ref : references) {
    if (columns.count(ref) == 0) continue;
    os << (first_ref ? "\n  " : ",\n  ") << "\"" << ref << "\": {";
    first_ref = false;
    bool first_router = true;
    for (const RouterRuns& rr : results) {
      if (rr.name == ref) continue;
      os << (first_router ? "" : ", ") << "\"" << rr.name << "\": {";
      first_router = false;
      bool first_metric = true;
      for (const PairedMetric& metric : paired_metrics) {
        const smoe::PairedDifference d =
            smoe::paired_difference(columns[rr.name][metric.column], columns[ref][metric.column]);
        os << (first_metric ? "" : ", ") << "\"" << metric.column << "\": {\"mean\": ";
        json_number(os, d.mean);
        os << ", \"low\": ";
        json_number(os, d.low);
        os << ", \"high\": ";
        json_number(os, d.high);
        os << ", \"excludes_zero\": " << (d.excludes_zero() ? "true" : "false") << "}";
        first_metric = false;
      }
      os << "}";
    }
    os << "}";
  }
  os << "}}\n";
  if (!os) throw std::runtime_error("cannot write " + path);
}

}  // namespace

int main(int argc, char** argv) try {
  const Args args = parse(argc, argv);
  const auto wall_start = std::chrono::steady_clock::now();
#if defined(_OPENMP)
  omp_set_num_threads(args.threads);  // ssr's CPU backend and the experts' loop follow it, each where it pays
#endif
  // Eigen would split each product of a step over the threads; below about 16M multiply-adds per product
  // (this model's: at most batch x d x 256) forking costs more than it saves, so Eigen keeps them on one thread.
  const Index largest_product = args.train.batch * args.model.dim * std::max<Index>(args.model.hidden, 256);
  Eigen::setNbThreads(largest_product >= (Index{1} << 24) ? args.threads : 1);
  std::filesystem::create_directories(args.out);
  const std::filesystem::path csv_path(args.csv);
  if (csv_path.has_parent_path()) std::filesystem::create_directories(csv_path.parent_path());

  const std::string text = args.data.empty() ? smoe::generate_corpus(corpus_bytes, corpus_seed) : smoe::read_file(args.data);
  const smoe::Corpus corpus = smoe::Corpus::split(text, args.model.context);
  const smoe::ModelOptions& m = args.model;
  // As smoe::sequential_batches splits the validation text: every byte after the first context, whole
  // sequences per batch.
  const Index validation_predictions =
      std::max<Index>(0, std::min<Index>(static_cast<Index>(corpus.valid.size()) - m.context, args.train.eval_tokens));
  const Index validation_batch = args.train.batch / args.train.seq_len * args.train.seq_len;
  std::ostringstream setup;
  setup << "data: " << (args.data.empty() ? "generated corpus" : args.data) << ", " << corpus.train.size()
        << " training bytes, " << validation_predictions << " validation predictions\n"
        << "model: " << m.context << " context bytes, d = " << m.dim << ", " << m.layers << " SMoE layers of n = "
        << m.experts << " GELU experts (h = " << m.hidden << "), k = " << args.routers.k << "; Adam lr "
        << args.train.adam.lr << ", " << args.train.batch << " tokens per step, " << args.train.steps << " steps, "
        << args.seeds << (args.seeds == 1 ? " seed" : " seeds") << " from " << args.train.seed << "\n"
        << "SSR: Sinkhorn with probability p = " << args.routers.p << " per layer and step; noise alpha = "
        << args.routers.noise_alpha << " in the -noise variants; "
        << (args.routers.xi > 0 ? "xi = " + shortest(args.routers.xi) + " for every Sinkhorn router"
                                : std::string("each Sinkhorn router's own xi"))
        << "; expert bias rate " << args.routers.bias_rate << "\n"
        << "training batches of " << args.train.batch << " predictions in sequences of " << args.train.seq_len
        << ", validation batches of " << validation_batch << "; expert capacity factor " << args.routers.capacity
        << (args.routers.capacity > 0 ? "" : " (none)") << "; residual "
        << (args.model.momentum == 0 && args.model.step_size == 1
                ? std::string("plain")
                : "Momentum SMoE, mu = " + std::to_string(args.model.momentum) +
                      ", gamma = " + std::to_string(args.model.step_size))
        << "; attacked validation: " << args.train.attack << " of its bytes randomised\n";
  std::cout << setup.str() << std::flush;

  std::ofstream csv(args.csv);
  csv << "router,seed,step,train_bits_per_byte,aux_loss,load_max_over_mean,load_cv,empty_experts,dropped,"
         "sinkhorn_layers,step_ms,routing_ms,valid_bits_per_byte\n";
  std::vector<RouterRuns> results;
  for (const std::string& name : args.names) {
    RouterRuns rr{name, {}};
    for (int s = 0; s < args.seeds; ++s) {
      smoe::TrainOptions options = args.train;
      options.seed = args.train.seed + static_cast<std::uint64_t>(s);
      Progress progress(options.steps);
      smoe::with_router(name, args.routers, [&](const auto& policy, const smoe::LayerOptions& layer) {
        smoe::ModelOptions model = args.model;
        model.layer = layer;
        rr.runs.push_back(smoe::train(policy, model, corpus, options, [&](const smoe::StepRecord& r) {
          progress.update(name, options.seed, r.step, r.train_bits);
          csv << name << ',' << options.seed << ',' << r.step << ',' << r.train_bits << ',' << r.aux_loss << ','
              << r.max_over_mean << ',' << r.cv << ',' << r.empty_experts << ',' << r.dropped << ','
              << r.sinkhorn_layers << ','
              << 1e3 * r.seconds << ',' << 1e3 * r.routing_seconds << ',';
          if (std::isfinite(r.valid_bits)) csv << r.valid_bits;
          csv << '\n';
        }));
      });
    }
    results.push_back(std::move(rr));
  }
  csv.close();
  if (!csv) throw std::runtime_error("cannot write " + args.csv);

  // The table. Overheads are against softmax top-k's step time in this same run.
  double vanilla_ms = 0;
  for (const RouterRuns& rr : results)
    if (rr.name == "softmax")
      for (const auto& r : rr.runs) vanilla_ms += 1e3 * r.seconds_per_step / static_cast<double>(rr.runs.size());
  std::ostringstream table;
  table << "\n| router | val bits/byte | attacked | no capacity | Sinkhorn inference | dropped %, training | "
           "dropped %, validation | load max/mean, training | load max/mean, validation | load CV, validation | "
           "empty experts, validation | Sinkhorn calls | ms/step | vs softmax | routing ms/step |\n"
        << "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  std::ostringstream norms;
  norms << "\n| router |";
  for (int l = 0; l < m.layers; ++l) norms << " layer " << l << " |";
  norms << "\n|---|";
  for (int l = 0; l < m.layers; ++l) norms << "---|";
  norms << "\n";
  std::map<std::string, Columns> columns;  // router -> metric -> one value per seed
  for (const RouterRuns& rr : results) columns[rr.name] = columns_of(rr, m.layers, args.train.attack > 0, vanilla_ms);
  for (const RouterRuns& rr : results) {
    Columns& col = columns[rr.name];
    const bool attacked = args.train.attack > 0, capped = args.routers.capacity > 0;
    table << "| " << rr.name << " | " << summary(col["bpb"], 3) << " | "
          << (attacked ? summary(col["bpb_attacked"], 3) : std::string("-")) << " | "
          << (capped ? summary(col["bpb_free"], 3) : std::string("-")) << " | " << summary(col["bpb_sk"], 3) << " | "
          << summary(col["drop_train"], 1) << " | " << summary(col["drop_val"], 1) << " | " << summary(col["train_mm"], 2) << " | " << summary(col["val_mm"], 2) << " | " << summary(col["val_cv"], 2)
          << " | " << summary(col["empty"], 1) << " | " << summary(col["sinkhorn"], 0) << " / "
          << args.train.steps * m.layers << " | " << summary(col["ms"], 1) << " | "
          << (vanilla_ms > 0 ? summary(col["ratio"], 2) + "x" : std::string("-")) << " | "
          << summary(col["routing_ms"], 2) << " |\n";
    norms << "| " << rr.name << " |";
    for (int l = 0; l < m.layers; ++l) norms << " " << summary(col["norm" + std::to_string(l)], 3) << " |";
    norms << "\n";
  }
  const std::string paired = args.seeds >= 2 ? paired_tables(results, columns, args) : std::string();
  std::cout << table.str() << paired << "\nMean output norm |SMoE_l(x_l)| of each block on the validation text:\n"
            << norms.str() << std::flush;
  if (!args.json.empty()) write_json(args.json, args, results, columns);

  // Expert load over training: max/mean per step, mean over layers and seeds, smoothed.
  const auto steps = static_cast<std::size_t>(args.train.steps), window = std::max<std::size_t>(1, steps / 20);
  std::vector<smoe::Series> load, loss;
  for (const RouterRuns& rr : results) {
    std::vector<double> mm(steps, 0), bits(steps, 0);
    for (const smoe::RunResult& r : rr.runs)
      for (std::size_t i = 0; i < steps; ++i) {
        mm[i] += r.history[i].max_over_mean / static_cast<double>(rr.runs.size());
        bits[i] += r.history[i].train_bits / static_cast<double>(rr.runs.size());
      }
    load.push_back({rr.name, moving_average(mm, window), {}, {}});
    loss.push_back({rr.name, moving_average(bits, window), {}, {}});
  }
  const std::string load_svg = args.out + "/load.svg", loss_svg = args.out + "/loss.svg";
  const std::string smoothing = "moving average over " + std::to_string(window) + " steps";
  smoe::write_line_chart(load_svg, "Expert load during training (" + smoothing + ")", "training step",
                         "max / mean tokens per expert", load);
  const auto vanilla = std::find_if(results.begin(), results.end(), [](const RouterRuns& rr) { return rr.name == "softmax"; });
  if (vanilla != results.end() && results.size() > 1) {
    // The curves overlap after the first steps: draw each router's difference to softmax top-k instead.
    smoe::write_line_chart(loss_svg,
                           "Training loss minus softmax top-k's, seed by seed (" + smoothing +
                               (args.seeds >= 2 ? "; band: 95% interval over " + std::to_string(args.seeds) + " seeds)"
                                                : ")"),
                           "training step", "bits per byte, router - softmax", loss_differences(results, *vanilla, window),
                           /*zero_line=*/true);
  } else {
    smoe::write_line_chart(loss_svg, "Training loss (" + smoothing + ")", "training step", "bits per byte", loss);
  }
  std::ofstream summary(args.out + "/summary.md");
  summary << setup.str() << table.str() << paired << "\nMean output norm of each block:\n" << norms.str();
  if (!summary.flush()) throw std::runtime_error("cannot write " + args.out + "/summary.md");

  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
  std::cout << "\nval bits/byte: validation routed as deployed (evaluation path, with capacity); attacked: the same on "
               "the attacked text; no capacity: without dropping tokens.\n"
            << "dropped %: assignments over an expert's capacity, which skip it (the residual carries the token).\n"
            << "load max/mean: most tokens an expert gets over the mean (1 = balanced), per layer, mean over layers.\n"
            << "Sinkhorn inference: validation routed by Sinkhorn top-k (plan weights, xi = 0.5) on batches of "
            << args.train.batch / args.train.seq_len * args.train.seq_len << " tokens, no parameter update.\n"
            << "routing ms/step: gate products, router (route and backward), grouping by expert, auxiliary losses.\n"
            << "wrote " << args.csv << ", " << load_svg << ", " << loss_svg << ", " << args.out << "/summary.md"
            << (args.json.empty() ? "" : ", " + args.json)
            << " (" << static_cast<int>(wall + 0.5) << " s)\n";
} catch (const std::exception& e) {
  std::cerr << "ssr-smoe-demo: " << e.what() << "\n";
  return 2;
}
