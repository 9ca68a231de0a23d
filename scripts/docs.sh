#!/usr/bin/env bash
# Builds the documentation site into site/: the pages of docs/, the C++ reference (Doxygen), the Python
# API (docstrings) and the tools' options (their --help). Fails on any warning, broken link or anchor.
# Needs doxygen (scripts/install-deps.sh --docs) and Python's venv; builds the two tools in the build directory
# (argument 1, default build) and installs mkdocs into .venv (docs/requirements.txt) when they are missing.
set -euo pipefail
cd "$(dirname "$0")/.."
build=$(realpath "${1:-build}")
python=${SSR_DOCS_PYTHON:-.venv/bin/python}
doxygen=${SSR_DOXYGEN:-doxygen}
command -v "$doxygen" >/dev/null || { echo "docs.sh: doxygen is missing: bash scripts/install-deps.sh --docs" >&2; exit 1; }
for tool in ssr-route ssr-smoe-demo; do
  if [ ! -x "$build/examples/$tool" ]; then
    [ -f "$build/CMakeCache.txt" ] ||
      cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSSR_BUILD_TESTS=OFF -DSSR_BUILD_BENCHMARKS=OFF
    cmake --build "$build" --target ssr-route ssr-smoe-demo
  fi
done
[ -x "$python" ] || { python3 -m venv .venv && python=.venv/bin/python; }
if ! "$python" -c "import material, mkdocstrings_handlers.python" 2>/dev/null; then
  "$python" -m pip install --quiet --disable-pip-version-check -r docs/requirements.txt
fi
NO_MKDOCS_2_WARNING=1 SSR_DOCS_BUILD="$build" SSR_DOXYGEN="$doxygen" "$python" -m mkdocs build --strict --clean
echo "docs.sh: site/index.html"
