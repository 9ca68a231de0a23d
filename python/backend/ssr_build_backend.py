"""The package's build backend: scikit-build-core's, with one line naming a missing or too old CMake and
where to get it. The other prerequisites are checked by the CMake configuration (CMakeLists.txt)."""
import sys

from scikit_build_core import build as _backend
from scikit_build_core.build import *  # noqa: F401,F403  the hooks this module does not wrap
from scikit_build_core.errors import CMakeNotFoundError


def _naming_cmake(hook):
    def run(*args, **kwargs):
        try:
            return hook(*args, **kwargs)
        except CMakeNotFoundError as err:
            sys.exit(f"ssr-torch needs CMake >= 3.21: {err} (Debian/Ubuntu: cmake; or pip install cmake)")

    run.__name__ = run.__qualname__ = hook.__name__
    run.__doc__ = hook.__doc__
    return run


for _name in ("build_wheel", "build_editable", "build_sdist", "prepare_metadata_for_build_wheel",
              "prepare_metadata_for_build_editable"):
    if hasattr(_backend, _name):
        globals()[_name] = _naming_cmake(getattr(_backend, _name))
