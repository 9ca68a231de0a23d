#!/usr/bin/env bash
# Installs the Debian packages ssr builds, tests and benchmarks with. Safe to run again.
# --python adds Python's venv and headers, for the PyTorch package (scripts/python-env.sh installs torch
# from PyPI into .venv); --lint adds clang-format and clang-tidy (-DSSR_LINT=ON); --mpi adds Open MPI
# (-DSSR_ENABLE_MPI=ON); --fuzz adds clang, its sanitizer runtimes and LLVM's OpenMP (the fuzz and tsan
# presets); --docs adds Doxygen and Python's venv (scripts/docs.sh).
set -euo pipefail
packages=(cmake ninja-build g++ libeigen3-dev xtensor-dev catch2 librandom123-dev libbenchmark-dev)
for option in "$@"; do
  case "$option" in
    --python) packages+=(python3-venv python3-dev) ;;
    --lint) packages+=(clang-format clang-tidy) ;;
    --mpi) packages+=(libopenmpi-dev openmpi-bin) ;;
    --fuzz) packages+=(clang libclang-rt-14-dev libomp-14-dev) ;;
    --docs) packages+=(doxygen python3-venv) ;;
    *) echo "install-deps.sh: unknown option $option" >&2; exit 2 ;;
  esac
done
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
