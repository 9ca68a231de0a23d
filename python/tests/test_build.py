"""The pip build's configuration: a missing prerequisite stops it with one line naming it and its
Debian/Ubuntu package, a CUDA torch without nvcc builds the CPU kernels with a warning and a note the
package reports at runtime, and a missing CMake is named by the build backend."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import ssr_torch

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(shutil.which("cmake") is None or not (ROOT / "pyproject.toml").is_file(),
                                reason="needs cmake and the source tree")


def configure(build, *options, env=None):
    """Configures the project as pip install does (pyproject.toml's cmake.define): (exit status, output)."""
    result = subprocess.run(["cmake", "-S", str(ROOT), "-B", str(build), "-G", "Ninja", "-DSSR_BUILD_PYTHON=ON", "-DSSR_BUILD_TESTS=OFF",
                             "-DSSR_BUILD_EXAMPLES=OFF", "-DSSR_BUILD_BENCHMARKS=OFF", "-DSSR_INSTALL=OFF",
                             "-DSSR_ENABLE_XTENSOR=OFF", f"-DPython_EXECUTABLE={sys.executable}", *options],
                            capture_output=True, text=True, timeout=120, env=dict(os.environ, **(env or {})))
    return result.returncode, result.stdout + result.stderr


def one_line(output, start):
    """The message line that starts with `start`, checking that it is the error's whole text."""
    lines = output.splitlines()
    found = [i for i, line in enumerate(lines) if line.strip().startswith(start)]
    assert len(found) == 1, output
    assert lines[found[0] + 1].strip() in ("", "Call Stack (most recent call first):"), output
    return lines[found[0]]


@pytest.fixture(scope="module")
def cuda_torch_without_nvcc(tmp_path_factory):
    """A build tree configured against a torch that reports CUDA 12.8, with no CUDA compiler to be found:
    (build directory, configure output). The stand-in torch answers what the configuration asks."""
    fake = tmp_path_factory.mktemp("fake")
    (fake / "torch").mkdir()
    (fake / "torch" / "__init__.py").write_text("from . import _C, version\n")
    (fake / "torch" / "_C.py").write_text("_GLIBCXX_USE_CXX11_ABI = True\n")
    (fake / "torch" / "version.py").write_text('cuda = "12.8"\n')
    build = tmp_path_factory.mktemp("build")
    env = {"PYTHONPATH": str(fake), "CUDACXX": str(fake / "no-nvcc")}
    status, output = configure(build, env=env)
    assert status == 0, output
    status_on, output_on = configure(tmp_path_factory.mktemp("build-on"), "-DSSR_PYTHON_CUDA=ON", env=env)
    assert status_on != 0
    return build, output, output_on


def test_a_cuda_torch_without_nvcc_builds_the_cpu_kernels_and_says_so(cuda_torch_without_nvcc):
    build, output, output_on = cuda_torch_without_nvcc
    line = one_line(output, "ssr_torch: the CUDA kernels were not built")
    assert "CUDA 12.8" in line and "nvcc" in line and "CUDACXX" in line and "SSR_PYTHON_CUDA=ON" in line
    facts = {}
    exec((build / "python" / "ssr_torch" / "_build.py").read_text(), facts)
    assert facts["BACKENDS"] == ("cpu",) and facts["MISSING"]["cuda"] in line
    line = one_line(output_on, "SSR_PYTHON_CUDA=ON: no CUDA compiler (nvcc) found")
    assert "nvidia-cuda-toolkit" in line


@pytest.mark.parametrize("package, message, debian", [
    ("Eigen3", "ssr needs Eigen 3.4, not found", "libeigen3-dev"),
    ("Random123", "ssr needs Random123, not found", "librandom123-dev"),
    ("OpenMP", "ssr needs OpenMP for", "-DSSR_ENABLE_OPENMP=OFF"),
])
def test_a_missing_package_stops_the_configuration_with_one_line(cuda_torch_without_nvcc, package, message, debian):
    build = cuda_torch_without_nvcc[0]  # configured: the compiler's checks are cached
    status, output = configure(build, *(f"-DCMAKE_DISABLE_FIND_PACKAGE_{name}={'ON' if name == package else 'OFF'}"
                                        for name in ("Eigen3", "Random123", "OpenMP")))
    assert status != 0
    assert debian in one_line(output, message)


def test_a_missing_compiler_stops_the_configuration_with_one_line(tmp_path):
    status, output = configure(tmp_path, env={"CXX": str(tmp_path / "no-compiler")})
    assert status != 0
    assert "(Debian/Ubuntu: g++" in one_line(output, "ssr needs a C++17 compiler, no working one found")


def test_the_build_backend_names_a_missing_cmake(tmp_path, monkeypatch):
    pytest.importorskip("scikit_build_core")
    monkeypatch.syspath_prepend(str(ROOT / "python" / "backend"))
    import ssr_build_backend

    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("CMAKE_EXECUTABLE", str(tmp_path / "no-cmake"))
    with pytest.raises(SystemExit) as stopped:
        ssr_build_backend.prepare_metadata_for_build_wheel(str(tmp_path))
    message = str(stopped.value)
    assert message.startswith("ssr-torch needs CMake >= 3.21: ") and "Debian/Ubuntu: cmake" in message
    assert "\n" not in message


def test_the_package_reports_its_backends():
    backends, missing = ssr_torch.backends(), ssr_torch.missing_backends()
    assert backends[0] == "cpu" and set(backends) | set(missing) == {"cpu", "cuda"}
    assert all(isinstance(note, str) and "\n" not in note for note in missing.values())
