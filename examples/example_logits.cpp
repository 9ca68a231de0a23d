// ssr-example-logits: writes an m x n float32 logits matrix to a .npy file, with experts of uneven
// popularity (expert j's logits are shifted by -skew * j / n), as a router sees early in training.
#include <xtensor/xnpy.hpp>
#include <xtensor/xtensor.hpp>

#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>

int main(int argc, char** argv) {
  long m = 24576, n = 16;
  double skew = 4.0;
  unsigned long seed = 0;
  std::string out;
  for (int a = 1; a < argc; ++a) {
    const std::string arg = argv[a];
    if (a + 1 >= argc) {
      std::fprintf(stderr, "ssr-example-logits: %s needs a value\n", arg.c_str());
      return 2;
    }
    const char* v = argv[++a];
    if (arg == "--rows") m = std::strtol(v, nullptr, 10);
    else if (arg == "--experts") n = std::strtol(v, nullptr, 10);
    else if (arg == "--skew") skew = std::strtod(v, nullptr);
    else if (arg == "--seed") seed = std::strtoul(v, nullptr, 10);
    else if (arg == "--out") out = v;
    else {
      std::fprintf(stderr, "ssr-example-logits: unknown option %s\n"
                   "usage: ssr-example-logits --out FILE.npy [--rows M] [--experts N] [--skew X] [--seed S]\n", arg.c_str());
      return 2;
    }
  }
  if (out.empty() || m < 1 || n < 1) {
    std::fprintf(stderr, "usage: ssr-example-logits --out FILE.npy [--rows M] [--experts N] [--skew X] [--seed S]\n");
    return 2;
  }
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> normal;
  xt::xtensor<float, 2> logits({static_cast<std::size_t>(m), static_cast<std::size_t>(n)});
  for (long i = 0; i < m; ++i)
    for (long j = 0; j < n; ++j)
      logits(i, j) = static_cast<float>(normal(gen) - skew * static_cast<double>(j) / static_cast<double>(n));
  xt::dump_npy(out, logits);
  std::printf("wrote %ld x %ld logits to %s\n", m, n, out.c_str());
}
