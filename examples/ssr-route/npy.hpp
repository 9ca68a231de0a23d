// ssr-route's .npy files: reading a 2-d matrix of either float dtype, every file checked completely first,
// and writing one with every write checked.
#pragma once

#include <ssr/view.hpp>

#include <xtensor/xtensor.hpp>

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#include "options.hpp"

#if defined(__has_include)
#if __has_include(<sys/mman.h>) && __has_include(<fcntl.h>) && __has_include(<unistd.h>)
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>
#define SSR_ROUTE_HAS_MMAP 1
#endif
#endif
#ifndef SSR_ROUTE_HAS_MMAP
#define SSR_ROUTE_HAS_MMAP 0
#endif

namespace ssr_route {

namespace fs = std::filesystem;

// A .npy file's header, checked completely against the file before anything is read: the magic string,
// the version, the header's syntax (a Python dict of exactly 'descr', 'fortran_order' and 'shape'), the
// dtype and its byte order, the shape, and the byte size it implies against the file's size. Every
// malformed file is a UsageError naming the file and what is wrong.
struct NpyHeader {
  bool big_endian = false;
  bool fortran_order = false;
  int itemsize = 0;  // 4: float32, 8: float64
  std::vector<std::uint64_t> shape;
  std::uint64_t data_offset = 0;
};

namespace npy_detail {

// The dict literal of a .npy header, read strictly.
class HeaderParser {
 public:
  HeaderParser(std::string text, std::string path) : s_(std::move(text)), path_(std::move(path)) {}

  NpyHeader parse() {
    NpyHeader h;
    bool descr = false, order = false, shape = false;
    expect('{');
    for (;;) {
      skip_spaces();
      if (peek() == '}') break;
      const std::string key = quoted();
      expect(':');
      if (key == "descr" && !descr) {
        descr = true;
        dtype(quoted(), h);
      } else if (key == "fortran_order" && !order) {
        order = true;
        h.fortran_order = boolean();
      } else if (key == "shape" && !shape) {
        shape = true;
        h.shape = tuple();
      } else {
        fail((descr && key == "descr") || (order && key == "fortran_order") || (shape && key == "shape")
                 ? "its header repeats the key '" + key + "'"
                 : "its header has the unknown key '" + key + "'");
      }
      skip_spaces();
      if (peek() == ',') ++i_;
    }
    expect('}');
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t')) ++i_;
    if (i_ + 1 != s_.size() || s_[i_] != '\n') fail("its header does not end with a newline after the dict");
    if (!descr || !order || !shape) {
      fail(std::string("its header lacks the key '") + (!descr ? "descr" : !order ? "fortran_order" : "shape") + "'");
    }
    return h;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const { throw UsageError("'" + path_ + "': " + what); }
  char peek() const { return i_ < s_.size() ? s_[i_] : '\0'; }
  void skip_spaces() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t')) ++i_;
  }
  void expect(char c) {
    skip_spaces();
    if (peek() != c) fail(std::string("its header is not a .npy dict (expected '") + c + "' at byte " + std::to_string(i_) + ")");
    ++i_;
  }
  std::string quoted() {
    skip_spaces();
    const char q = peek();
    if (q != '\'' && q != '"') fail("its header is not a .npy dict (expected a quoted key or value at byte " + std::to_string(i_) + ")");
    const std::size_t close = s_.find(q, i_ + 1);
    if (close == std::string::npos) fail("its header has an unterminated string");
    std::string out = s_.substr(i_ + 1, close - i_ - 1);
    i_ = close + 1;
    return out;
  }
  bool boolean() {
    skip_spaces();
    for (const auto& word : {std::make_pair("True", true), std::make_pair("False", false)}) {
      const std::string w = word.first;
      if (s_.compare(i_, w.size(), w) == 0) {
        i_ += w.size();
        return word.second;
      }
    }
    fail("its fortran_order is neither True nor False");
  }
  std::vector<std::uint64_t> tuple() {
    std::vector<std::uint64_t> dims;
    expect('(');
    for (;;) {
      skip_spaces();
      if (peek() == ')') break;
      if (peek() < '0' || peek() > '9') fail("its shape is not a tuple of non-negative integers");
      std::uint64_t d = 0;
      while (peek() >= '0' && peek() <= '9') {
        const auto digit = static_cast<std::uint64_t>(peek() - '0');
        if (d > (std::numeric_limits<std::uint64_t>::max() - digit) / 10) fail("its shape has a dimension beyond 2^64");
        d = d * 10 + digit;
        ++i_;
      }
      dims.push_back(d);
      skip_spaces();
      if (peek() == ',') {
        ++i_;
      } else if (peek() != ')') {
        fail("its shape is not a tuple of non-negative integers");
      }
    }
    ++i_;
    return dims;
  }
  void dtype(const std::string& d, NpyHeader& h) const {
    if (d == "<f4" || d == ">f4" || d == "<f8" || d == ">f8") {
      h.big_endian = d[0] == '>';
      h.itemsize = d[2] - '0';
    } else {
      fail("dtype '" + d + "'; expected float32 or float64 ('<f4', '>f4', '<f8' or '>f8')");
    }
  }

  std::string s_, path_;
  std::size_t i_ = 0;
};

inline std::uint64_t little_endian(const unsigned char* b, int width) {
  std::uint64_t v = 0;
  for (int i = width - 1; i >= 0; --i) v = v * 256 + b[i];
  return v;
}

}  // namespace npy_detail

// Reads and checks the header of a .npy file of file_size bytes from in, at its start (see NpyHeader);
// path names the file in errors.
inline NpyHeader read_npy_header(std::istream& in, std::uint64_t file_size, const std::string& path) {
  const auto fail = [&](const std::string& what) -> void { throw UsageError("'" + path + "': " + what); };
  unsigned char lead[12] = {};
  in.read(reinterpret_cast<char*>(lead), 10);
  if (!in || std::memcmp(lead, "\x93NUMPY", 6) != 0) fail("not a .npy file (no \\x93NUMPY magic string)");
  const int major = lead[6], minor = lead[7];
  if ((major < 1 || major > 3) || minor != 0)
    fail("unsupported .npy version " + std::to_string(major) + "." + std::to_string(minor) + " (1.0, 2.0 and 3.0 are read)");
  const int width = major == 1 ? 2 : 4;
  if (width == 4) in.read(reinterpret_cast<char*>(lead + 10), 2);
  if (!in) fail("truncated in its header");
  const std::uint64_t header_len = npy_detail::little_endian(lead + 8, width);
  const std::uint64_t data_offset = 8 + static_cast<std::uint64_t>(width) + header_len;
  if (data_offset > file_size)
    fail("its header of " + std::to_string(header_len) + " bytes runs past the end of the file (" + std::to_string(file_size) + " bytes)");
  std::string text(header_len, '\0');
  in.read(&text[0], static_cast<std::streamsize>(header_len));
  if (!in) fail("cannot read its header");
  NpyHeader h = npy_detail::HeaderParser(std::move(text), path).parse();
  h.data_offset = data_offset;
  // The byte size the shape implies, without overflow, against what the file holds.
  std::uint64_t bytes = static_cast<std::uint64_t>(h.itemsize);
  std::string shape;
  for (const std::uint64_t d : h.shape) {
    shape += (shape.empty() ? "" : ", ") + std::to_string(d);
    if (d != 0 && bytes > std::numeric_limits<std::uint64_t>::max() / d) fail("its shape (" + shape + ", ...) overflows 64-bit sizes");
    bytes *= d;
  }
  const std::uint64_t data = file_size - data_offset;
  if (data != bytes) {
    fail(std::string(data < bytes ? "truncated" : "longer than its shape") + ": shape (" + shape + ") of float" +
         std::to_string(8 * h.itemsize) + " needs " + std::to_string(bytes) + " bytes of data, the file has " +
         std::to_string(data));
  }
  return h;
}

// The size of the file at path, for read_npy_header.
inline std::uint64_t file_size_of(const std::string& path) {
  std::error_code ec;
  const std::uint64_t size = fs::file_size(path, ec);
  if (ec) throw UsageError("'" + path + "': cannot read its size (" + ec.message() + ")");
  return size;
}

inline NpyHeader read_npy_header(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UsageError("cannot open '" + path + "'");
  return read_npy_header(in, file_size_of(path), path);
}

// The rows and columns of a checked header with `dims` dimensions (1: one row), in the index range.
inline std::pair<std::uint64_t, std::uint64_t> matrix_shape(const NpyHeader& h, const std::string& path, const char* what,
                                                            std::size_t dims) {
  if (h.shape.size() != dims)
    throw UsageError(std::string(what) + " '" + path + "' has " + std::to_string(h.shape.size()) + " dimensions; expected " +
                     std::to_string(dims));
  const std::uint64_t rows = dims == 1 ? 1 : h.shape[0], cols = h.shape[dims - 1];
  if (rows > static_cast<std::uint64_t>(std::numeric_limits<ssr::index_t>::max()) ||
      cols > static_cast<std::uint64_t>(std::numeric_limits<ssr::index_t>::max()))
    throw UsageError(std::string(what) + " '" + path + "' has a dimension beyond the index range");
  return {rows, cols};
}

// Whether the data of a file with header h is T in C order and the host's byte order (little-endian:
// x86-64, aarch64), as numpy writes it, so that it can be used as it lies.
template <class T>
bool holds_native(const NpyHeader& h) {
  return !h.big_endian && !h.fortran_order && h.itemsize == static_cast<int>(sizeof(T));
}

// A 2-d float32 or float64 .npy file of file_size bytes read from in as a row-major T matrix: any byte
// order, C or Fortran order; with dims = 1, a 1-d file read as a matrix of one row. what and path name
// the file in errors.
template <class T>
xt::xtensor<T, 2> read_matrix(std::istream& in, std::uint64_t file_size, const std::string& path, const char* what,
                              std::size_t dims = 2) {
  const NpyHeader h = read_npy_header(in, file_size, path);
  const auto [rows, cols] = matrix_shape(h, path, what, dims);
  const std::uint64_t count = rows * cols;
  xt::xtensor<T, 2> out({static_cast<std::size_t>(rows), static_cast<std::size_t>(cols)});
  const auto read = [&](void* to, std::uint64_t bytes) {
    in.read(static_cast<char*>(to), static_cast<std::streamsize>(bytes));
    if (!in) throw UsageError(std::string(what) + " '" + path + "': cannot read its data");
  };
  // Such a file is read straight into the matrix: no second copy of the data, no pass over it (the whole
  // program 2.0-2.8x as fast at 10^6 x 16: docs/performance.md, one thread and two).
  if (holds_native<T>(h)) {
    read(out.data(), count * sizeof(T));
    return out;
  }
  std::vector<unsigned char> raw(static_cast<std::size_t>(count) * static_cast<std::size_t>(h.itemsize));
  read(raw.data(), raw.size());
  const int size = h.itemsize;
  for (std::uint64_t e = 0; e < count; ++e) {
    unsigned char b[8];
    for (int i = 0; i < size; ++i) b[i] = raw[e * size + static_cast<std::uint64_t>(h.big_endian ? size - 1 - i : i)];
    // Host byte order is little-endian (x86-64, aarch64): b now holds the value in it.
    double v;
    if (size == 4) {
      float f;
      std::memcpy(&f, b, 4);
      v = f;
    } else {
      std::memcpy(&v, b, 8);
    }
    const std::uint64_t r = h.fortran_order ? e % rows : e / cols, c = h.fortran_order ? e / rows : e % cols;
    // A double beyond T's range becomes an infinity (as IEEE rounding gives; the cast itself would be
    // undefined), for the router's checks to reject.
    const bool beyond = std::isfinite(v) && std::fabs(v) > static_cast<double>(std::numeric_limits<T>::max());
    out(r, c) = beyond ? std::copysign(std::numeric_limits<T>::infinity(), static_cast<T>(v > 0 ? 1 : -1)) : static_cast<T>(v);
  }
  return out;
}

template <class T>
xt::xtensor<T, 2> load_matrix(const std::string& path, const char* what, std::size_t dims = 2) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UsageError(std::string(what) + ": cannot open '" + path + "'");
  return read_matrix<T>(in, file_size_of(path), path, what, dims);
}

// A 2-d .npy file of T in C order and the host's byte order, mapped read-only: the router reads the page
// cache's pages where they lie, with no copy into fresh pages the kernel would first clear. Empty where
// the file holds anything else, its data is not aligned for T, or it cannot be mapped (then the caller
// reads it). As with any mapping, the file must not shrink while mapped (a page past its end is SIGBUS).
template <class T>
class MappedMatrix {
 public:
  MappedMatrix() = default;
  MappedMatrix(const MappedMatrix&) = delete;
  MappedMatrix& operator=(const MappedMatrix&) = delete;
  MappedMatrix(MappedMatrix&& o) noexcept { swap(o); }
  MappedMatrix& operator=(MappedMatrix&& o) noexcept {
    swap(o);
    return *this;
  }
  ~MappedMatrix() {
#if SSR_ROUTE_HAS_MMAP
    if (base_ != nullptr) munmap(base_, bytes_);
#endif
  }

  // Maps path when it holds such a matrix; a malformed file is a UsageError naming it, what and path.
  static MappedMatrix map(const std::string& path, const char* what) {
    MappedMatrix m;
#if SSR_ROUTE_HAS_MMAP
    std::ifstream in(path, std::ios::binary);
    if (!in) return m;  // the reader names the error
    const std::uint64_t size = file_size_of(path);
    const NpyHeader h = read_npy_header(in, size, path);
    const auto [rows, cols] = matrix_shape(h, path, what, 2);
    if (!holds_native<T>(h) || h.data_offset % alignof(T) != 0) return m;
    const int fd = open(path.c_str(), O_RDONLY);
    if (fd < 0) return m;
    int flags = MAP_PRIVATE;
#ifdef MAP_POPULATE
    flags |= MAP_POPULATE;  // the whole file's pages mapped at once rather than a fault at a time
#endif
    void* base = mmap(nullptr, static_cast<std::size_t>(size), PROT_READ, flags, fd, 0);
    close(fd);  // the mapping keeps the file
    if (base == MAP_FAILED) return m;
    m.base_ = base;
    m.bytes_ = static_cast<std::size_t>(size);
    m.data_ = reinterpret_cast<const T*>(static_cast<const unsigned char*>(base) + h.data_offset);
    m.rows_ = static_cast<ssr::index_t>(rows);
    m.cols_ = static_cast<ssr::index_t>(cols);
#else
    (void)path;
    (void)what;
#endif
    return m;
  }

  bool empty() const { return base_ == nullptr; }
  const T* data() const { return data_; }
  ssr::index_t rows() const { return rows_; }
  ssr::index_t cols() const { return cols_; }

 private:
  void swap(MappedMatrix& o) noexcept {
    std::swap(base_, o.base_);
    std::swap(bytes_, o.bytes_);
    std::swap(data_, o.data_);
    std::swap(rows_, o.rows_);
    std::swap(cols_, o.cols_);
  }
  void* base_ = nullptr;
  std::size_t bytes_ = 0;
  const T* data_ = nullptr;
  ssr::index_t rows_ = 0, cols_ = 0;
};

// A 1-d float32 or float64 .npy file as a vector of T.
template <class T>
std::vector<T> load_vector(const std::string& path, const char* what) {
  const xt::xtensor<T, 2> row = load_matrix<T>(path, what, 1);
  return std::vector<T>(row.begin(), row.end());
}

// The dtype string of a .npy file of T.
template <class T>
const char* npy_descr() {
  static_assert(std::is_same<T, float>::value || std::is_same<T, double>::value || std::is_same<T, std::int32_t>::value,
                "ssr-route writes float32, float64 and int32 arrays");
  return std::is_same<T, float>::value ? "<f4" : std::is_same<T, double>::value ? "<f8" : "<i4";
}

// Writes a row-major matrix as a .npy file (version 1.0, little-endian: the host's order), checking every
// write: a full disk, a file size limit or an unwritable directory is an error naming the file.
template <class T>
void write_npy(const fs::path& path, const xt::xtensor<T, 2>& a) {
  std::string header = std::string("{'descr': '") + npy_descr<T>() + "', 'fortran_order': False, 'shape': (" +
                       std::to_string(a.shape()[0]) + ", " + std::to_string(a.shape()[1]) + "), }";
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::string lead("\x93NUMPY\x01\x00", 8);
  lead += static_cast<char>(header.size() & 0xff);
  lead += static_cast<char>((header.size() >> 8) & 0xff);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << lead << header;
  out.write(reinterpret_cast<const char*>(a.data()), static_cast<std::streamsize>(a.size() * sizeof(T)));
  out.close();
  if (!out) throw UsageError("cannot write '" + path.string() + "': " + std::strerror(errno));
}

}  // namespace ssr_route
