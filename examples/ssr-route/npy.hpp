// ssr-route's files: reading a 2-d .npy matrix of either float dtype, and writing outputs atomically.
#pragma once

#include <xtensor/xarray.hpp>
#include <xtensor/xnpy.hpp>
#include <xtensor/xtensor.hpp>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "options.hpp"

namespace ssr_route {

namespace fs = std::filesystem;

// The dtype ('<f4', '<f8', ...) in a .npy header.
inline std::string npy_dtype(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UsageError("cannot open '" + path + "'");
  char magic[8] = {};
  in.read(magic, 8);
  if (!in || std::string(magic, 6) != "\x93NUMPY") throw UsageError("'" + path + "' is not a .npy file");
  std::size_t len = 0;
  unsigned char b[4] = {};
  const int width = magic[6] == 1 ? 2 : 4;
  in.read(reinterpret_cast<char*>(b), width);
  for (int i = width - 1; i >= 0; --i) len = len * 256 + b[i];
  std::string header(len, '\0');
  in.read(&header[0], static_cast<std::streamsize>(len));
  const auto key = header.find("'descr'");
  const auto q1 = header.find('\'', header.find(':', key) + 1), q2 = header.find('\'', q1 + 1);
  if (!in || key == std::string::npos || q1 == std::string::npos || q2 == std::string::npos)
    throw UsageError("'" + path + "' has an unreadable .npy header");
  return header.substr(q1 + 1, q2 - q1 - 1);
}

// A 2-d .npy file as a row-major T matrix, whatever its floating-point dtype.
template <class T>
xt::xtensor<T, 2> load_matrix(const std::string& path, const char* what) {
  const std::string dtype = npy_dtype(path);
  xt::xarray<T> a;
  if (dtype == "<f4" || dtype == "|f4") {
    a = xt::load_npy<float>(path);
  } else if (dtype == "<f8" || dtype == "|f8") {
    a = xt::load_npy<double>(path);
  } else {
    throw UsageError(std::string(what) + " '" + path + "' has dtype " + dtype + "; expected float32 or float64");
  }
  if (a.dimension() != 2)
    throw UsageError(std::string(what) + " '" + path + "' has " + std::to_string(a.dimension()) + " dimensions; expected 2");
  return a;
}

inline std::string json_number(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

// Files are written under temporary names and renamed once all are complete.
class Output {
 public:
  explicit Output(fs::path dir) : dir_(std::move(dir)) {}
  ~Output() {
    for (const auto& f : pending_) fs::remove(f.first);
  }
  template <class E>
  void add(const std::string& name, const E& array) {
    fs::create_directories(dir_);
    const fs::path tmp = dir_ / ("." + name + ".tmp" + std::to_string(::getpid()));
    xt::dump_npy(tmp.string(), array);
    pending_.push_back({tmp, dir_ / name});
  }
  void commit() {
    for (const auto& f : pending_) fs::rename(f.first, f.second);
    pending_.clear();
  }

 private:
  fs::path dir_;
  std::vector<std::pair<fs::path, fs::path>> pending_;
};

}  // namespace ssr_route
