// Text to train on: a corpus generated here from a seed, or any file; its split into training and
// validation bytes; and the batches the model reads.
#pragma once

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

#include "byte_lm.hpp"
#include "rng.hpp"

namespace smoe {

namespace detail {

// Pseudo-words from syllables of the given consonants and vowels, 1 to 3 syllables each.
inline std::vector<std::string> make_vocabulary(std::size_t size, const std::string& consonants,
                                                const std::string& vowels, Rng& rng) {
  std::vector<std::string> words;
  while (words.size() < size) {
    std::string w;
    const auto syllables = 1 + rng.below(3);
    for (std::uint64_t s = 0; s < syllables; ++s) {
      w += consonants[rng.below(consonants.size())];
      w += vowels[rng.below(vowels.size())];
    }
    if (std::find(words.begin(), words.end(), w) == words.end()) words.push_back(w);
  }
  return words;
}

// Index r with probability proportional to 1 / (r + 1): a few words are frequent, most are rare.
inline std::size_t zipf(std::size_t size, Rng& rng) {
  double total = 0;
  for (std::size_t r = 0; r < size; ++r) total += 1.0 / static_cast<double>(r + 1);
  double u = rng.uniform() * total;
  for (std::size_t r = 0; r < size; ++r)
    if ((u -= 1.0 / static_cast<double>(r + 1)) < 0) return r;
  return size - 1;
}

}  // namespace detail

// Segments of four registers with disjoint alphabets and their own grammar, one to a line, in random order:
//   prose   lower-case sentences over a Zipf-distributed pseudo-word vocabulary: "kelo mi ta ruse."
//   sums    correct additions of numbers below 1000: "417+38=455;"
//   genome  a sticky Markov chain over A, C, G, T
//   markup  tags around upper-case words: <li n="7">ZOR QUAX</li>
// Predicting a byte well needs a different skill in each register, so experts gain by specialising.
inline std::string generate_corpus(std::size_t bytes, std::uint64_t seed) {
  Rng rng(seed);
  const auto prose_words = detail::make_vocabulary(300, "bdfgklmnprstvz", "aeiou", rng);
  const auto markup_words = detail::make_vocabulary(40, "QWXZJHY", "UOA", rng);
  const char* tags[] = {"li", "td", "em", "a"};
  const std::string bases = "ACGT";
  std::string text;
  while (text.size() < bytes) {
    const auto length = 80 + rng.below(240);
    const std::size_t end = text.size() + length;
    switch (rng.below(4)) {
      case 0:  // prose
        while (text.size() < end) {
          const auto words = 3 + rng.below(8);
          for (std::uint64_t w = 0; w < words; ++w) {
            text += prose_words[detail::zipf(prose_words.size(), rng)];
            text += w + 1 < words ? " " : ". ";
          }
        }
        break;
      case 1:  // sums
        while (text.size() < end) {
          const auto a = rng.below(1000), b = rng.below(1000);
          text += std::to_string(a) + "+" + std::to_string(b) + "=" + std::to_string(a + b) + ";";
        }
        break;
      case 2: {  // genome: each base is mostly followed by its successor in a fixed cycle
        std::size_t base = rng.below(4);
        while (text.size() < end) {
          text += bases[base];
          base = rng.uniform() < 0.7 ? (base + 1) % 4 : rng.below(4);
        }
        break;
      }
      default:  // markup
        while (text.size() < end) {
          const std::string tag = tags[rng.below(4)];
          text += "<" + tag + " n=\"" + std::to_string(rng.below(10)) + "\">";
          const auto words = 1 + rng.below(3);
          for (std::uint64_t w = 0; w < words; ++w)
            text += (w ? " " : "") + markup_words[detail::zipf(markup_words.size(), rng)];
          text += "</" + tag + ">";
        }
    }
    text += '\n';
  }
  text.resize(bytes);
  return text;
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// The first 90% of the bytes train, the last 10% validate.
struct Corpus {
  std::string train, valid;

  static Corpus split(const std::string& text, int context) {
    const std::size_t cut = text.size() - text.size() / 10;
    Corpus c{text.substr(0, cut), text.substr(cut)};
    if (c.valid.size() <= static_cast<std::size_t>(context) + 1)
      throw std::runtime_error("the text is too short: " + std::to_string(text.size()) + " bytes");
    return c;
  }
};

namespace detail {
inline void fill_row(const std::string& text, std::size_t position, int context, Batch& b, Index i) {
  for (int c = 0; c < context; ++c) b.context(i, c) = static_cast<unsigned char>(text[position - 1 - static_cast<std::size_t>(c)]);
  b.targets[static_cast<std::size_t>(i)] = static_cast<unsigned char>(text[position]);
}
}  // namespace detail

// m predictions in sequences of seq_len consecutive positions (m / seq_len of them, the last one shorter
// when seq_len does not divide m), each starting at a position drawn uniformly from the text; seq_len = 1
// draws every position alone.
inline Batch sample_batch(const std::string& text, Index m, int context, Rng& rng, Index seq_len = 1) {
  Batch b{IndexMat(m, context), std::vector<std::int32_t>(static_cast<std::size_t>(m))};
  const auto length = static_cast<std::size_t>(std::max<Index>(1, seq_len));
  const auto first = static_cast<std::size_t>(context);
  if (text.size() < first + length)
    throw std::invalid_argument("a text of " + std::to_string(text.size()) + " bytes holds no " + std::to_string(first) +
                                " bytes of context and a sequence of " + std::to_string(length) + " predictions");
  const std::size_t span = text.size() - first - (length - 1);  // the starts that fit
  for (Index i = 0; i < m; i += static_cast<Index>(length)) {
    const std::size_t start = first + rng.below(span);
    for (Index t = 0; t < static_cast<Index>(length) && i + t < m; ++t)
      detail::fill_row(text, start + static_cast<std::size_t>(t), context, b, i + t);
  }
  return b;
}

// The text with a seeded fraction `rate` of its bytes replaced by uniformly random bytes: the byte-level
// analogue of an attacked validation set (a perturbed input, the clean next byte to predict is gone too).
inline std::string attack(std::string text, double rate, std::uint64_t seed) {
  if (!(rate >= 0 && rate <= 1)) throw std::invalid_argument("the attack rate must lie in [0, 1]");
  Rng rng(seed);
  for (char& c : text)
    if (rng.uniform() < rate) c = static_cast<char>(rng.below(256));
  return text;
}

// Batches of about m predictions covering the text from its start, at most max_tokens in all, every
// prediction once. The predictions form sequences of seq_len consecutive positions, and batch b holds the
// sequences b, b + B, b + 2B, ... of the B batches: with seq_len < m a batch mixes sequences from across
// the text, as a deployed model's batches mix requests; seq_len = m gives consecutive batches.
inline std::vector<Batch> sequential_batches(const std::string& text, Index m, int context, Index max_tokens,
                                             Index seq_len = 0) {
  const Index total = std::max<Index>(0, std::min(static_cast<Index>(text.size()) - context, max_tokens));
  const Index length = seq_len > 0 ? std::min(seq_len, m) : m, sequences = (total + length - 1) / length;
  const Index per_batch = std::max<Index>(1, m / length), count = (sequences + per_batch - 1) / per_batch;
  std::vector<Batch> batches;
  for (Index b = 0; b < count; ++b) {
    std::vector<Index> positions;
    for (Index q = b; q < sequences; q += count)
      for (Index t = q * length; t < std::min(total, (q + 1) * length); ++t) positions.push_back(context + t);
    const auto rows = static_cast<Index>(positions.size());
    Batch batch{IndexMat(rows, context), std::vector<std::int32_t>(static_cast<std::size_t>(rows))};
    for (Index i = 0; i < rows; ++i)
      detail::fill_row(text, static_cast<std::size_t>(positions[static_cast<std::size_t>(i)]), context, batch, i);
    batches.push_back(std::move(batch));
  }
  return batches;
}

}  // namespace smoe
