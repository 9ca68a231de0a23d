// ssr-route's output directory: a run's outputs written as one set, and the JSON summary's numbers.
#pragma once

#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <system_error>

#include <xtensor/xtensor.hpp>

#include "npy.hpp"
#include "options.hpp"

namespace ssr_route {

namespace fs = std::filesystem;

inline std::string json_number(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

// The files ssr-route writes in its output directory.
inline bool is_output_name(const std::string& name) {
  return name == "experts.npy" || name == "weights.npy" || name == "grad_logits.npy" || name == "noise.npy" ||
         name == "plan.npy";
}

// Checks that dir can take a run's outputs: absent, or a directory holding ssr-route's outputs only (a run
// replaces the whole directory, so other files in it would be lost).
inline void check_output_dir(const fs::path& dir) {
  std::error_code ec;
  const fs::file_status st = fs::status(dir, ec);
  if (!fs::exists(st)) return;
  if (!fs::is_directory(st)) throw UsageError("--out '" + dir.string() + "' exists and is not a directory");
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (!is_output_name(entry.path().filename().string()))
      throw UsageError("--out '" + dir.string() + "' holds '" + entry.path().filename().string() +
                       "', which is not an ssr-route output; a run replaces the whole directory: give another");
  }
}

// The outputs of a run, written as one set: every file goes to a fresh staging directory beside DIR, which
// then takes DIR's place in one step (renameat2's RENAME_EXCHANGE; where the filesystem lacks it, DIR is
// renamed away first, so for an instant there is none). A crash, a kill or a full disk thus leaves DIR with
// the previous outputs or none, never a mix or a partial set.
class Output {
 public:
  explicit Output(const fs::path& dir) : dir_(normal(dir)) {
    check_output_dir(dir_);
    if (!dir_.parent_path().empty()) fs::create_directories(dir_.parent_path());
    staging_ = dir_.parent_path() / ("." + dir_.filename().string() + ".ssr-route-" + std::to_string(::getpid()));
    fs::remove_all(staging_);
    if (!fs::create_directory(staging_)) throw UsageError("cannot create '" + staging_.string() + "'");
  }
  Output(const Output&) = delete;
  Output& operator=(const Output&) = delete;
  ~Output() {
    std::error_code ec;
    fs::remove_all(staging_, ec);  // the new files of a failed run, or the previous ones after a commit
  }

  template <class T>
  void add(const std::string& name, const xt::xtensor<T, 2>& array) {
    write_npy(staging_ / name, array);
  }

  void commit() {
    if (::renameat2(AT_FDCWD, staging_.c_str(), AT_FDCWD, dir_.c_str(), RENAME_EXCHANGE) == 0) return;
    if (errno == ENOENT && ::rename(staging_.c_str(), dir_.c_str()) == 0) return;  // no previous outputs
    if (errno != EINVAL && errno != ENOSYS && errno != ENOENT) fail();
    const fs::path old = staging_.string() + ".old";
    if (::rename(dir_.c_str(), old.c_str()) != 0 && errno != ENOENT) fail();
    if (::rename(staging_.c_str(), dir_.c_str()) != 0) fail();
    std::error_code ec;
    fs::remove_all(old, ec);
  }

 private:
  static fs::path normal(const fs::path& dir) {
    fs::path p = fs::absolute(dir).lexically_normal();
    return p.has_filename() ? p : p.parent_path();
  }
  [[noreturn]] void fail() const {
    throw UsageError("cannot move the outputs into '" + dir_.string() + "': " + std::strerror(errno));
  }

  fs::path dir_, staging_;
};

}  // namespace ssr_route
