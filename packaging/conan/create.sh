#!/usr/bin/env bash
# Builds and tests ssr's Conan package offline: the dependencies are the system's (recipes beside this
# script), test_package/ builds a program against the package and runs it. Conan comes from PyPI.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
export CONAN_HOME="${CONAN_HOME:-$root/build/conan-home}"
conan profile detect --force >/dev/null
for dep in eigen:3.4.0 random123:1.14.0 xtensor:0.24.3; do
  conan export "$root/packaging/conan/system" --name "${dep%%:*}" --version "${dep##*:}" >/dev/null
done
conan create "$root" --no-remote --build=missing -s build_type=Release "$@"
