"""MkDocs hooks that generate the reference pages from the code, so that they cannot drift from it.

* The C++ API reference: Doxygen over the public headers, rendered into the site under reference/cpp/.
  The headers' comments are plain `//` lines; scripts/doxygen_filter.py reads them as documentation comments.
* The options of the command-line tools: a page line `<!-- help: ssr-route -->` becomes the program's
  `--help` output, run from the build directory named by SSR_DOCS_BUILD (default: build).
"""

import os
import re
import subprocess
import sys
import tempfile

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HELP_MARKER = re.compile(r"^<!-- help: ([\w-]+) -->$", re.MULTILINE)
PROGRAMS = {"ssr-route": "examples/ssr-route", "ssr-smoe-demo": "examples/ssr-smoe-demo"}

DOXYGEN_CONFIG = """
PROJECT_NAME = ssr
PROJECT_BRIEF = "Selective Sinkhorn Routing for sparse Mixture-of-Experts: the C++ API"
INPUT = {root}/include/ssr {root}/cuda/include/ssr {root}/mpi/include/ssr
FILE_PATTERNS = *.hpp *.cuh
RECURSIVE = YES
EXCLUDE_PATTERNS = */detail/* */backend/cpu/* */backend/thrust/* */cuda/kernels/*
EXCLUDE_SYMBOLS = detail *::detail
STRIP_FROM_PATH = {root}/include {root}/cuda/include {root}/mpi/include
STRIP_FROM_INC_PATH = {root}/include {root}/cuda/include {root}/mpi/include
INPUT_FILTER = "{python} {root}/scripts/doxygen_filter.py"
FILTER_SOURCE_FILES = NO
OUTPUT_DIRECTORY = {out}
GENERATE_HTML = YES
HTML_OUTPUT = html
GENERATE_LATEX = NO
GENERATE_TREEVIEW = YES
DISABLE_INDEX = NO
EXTRACT_ALL = YES
EXTRACT_STATIC = YES
HIDE_UNDOC_MEMBERS = NO
SHOW_INCLUDE_FILES = YES
SOURCE_BROWSER = YES
MACRO_EXPANSION = YES
PREDEFINED = __CUDACC__ SSR_HD= SSR_HOST_DEVICE=
HAVE_DOT = NO
QUIET = YES
WARN_IF_UNDOCUMENTED = NO
WARN_IF_DOC_ERROR = YES
WARN_NO_PARAMDOC = NO
WARN_AS_ERROR = FAIL_ON_WARNINGS
"""


def run_doxygen(out):
    config = DOXYGEN_CONFIG.format(root=ROOT, out=out, python=sys.executable)
    result = subprocess.run([os.environ.get("SSR_DOXYGEN", "doxygen"), "-"], input=config, text=True, capture_output=True, cwd=ROOT)
    if result.returncode != 0 or result.stderr.strip():
        raise PluginError("Doxygen failed on the C++ headers:\n" + result.stderr)
    return os.path.join(out, "html")


# Doxygen's output lives until the site is written (on_post_build removes it).
OUTPUT = {}


def on_files(files, config):
    OUTPUT["doxygen"] = tempfile.TemporaryDirectory(prefix="ssr-doxygen-")
    html = run_doxygen(OUTPUT["doxygen"].name)
    for directory, _, names in os.walk(html):
        for name in names:
            path = os.path.join(directory, name)
            uri = "reference/cpp/" + os.path.relpath(path, html).replace(os.sep, "/")
            files.append(File.generated(config, uri, abs_src_path=path))
    return files


def program_help(name):
    build = os.environ.get("SSR_DOCS_BUILD", os.path.join(ROOT, "build"))
    program = os.path.join(build, PROGRAMS[name])
    if not os.access(program, os.X_OK):
        raise PluginError(f"{program} is not built: build it (cmake --build {build} --target {name}) or set "
                          "SSR_DOCS_BUILD to a build directory that has it")
    result = subprocess.run([program, "--help"], text=True, capture_output=True)
    if result.returncode != 0:
        raise PluginError(f"{program} --help failed (exit {result.returncode}):\n{result.stderr}")
    return result.stdout.rstrip()


def on_page_markdown(markdown, page, config, files):
    return HELP_MARKER.sub(lambda m: "```text\n" + program_help(m.group(1)) + "\n```", markdown)


def on_post_build(config):
    if "doxygen" in OUTPUT:
        OUTPUT.pop("doxygen").cleanup()
