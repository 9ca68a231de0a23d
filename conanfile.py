# Conan 2 recipe: the header-only library, with optional components.
import os

from conan import ConanFile
from conan.tools.files import copy


class SsrConan(ConanFile):
    name = "ssr"
    version = "0.1.0"
    package_type = "header-library"
    description = "Selective Sinkhorn Routing for sparse Mixture-of-Experts: token-to-expert routing"
    license = "MIT"
    topics = ("mixture-of-experts", "routing", "sinkhorn", "optimal-transport", "header-only")
    settings = "os", "arch", "compiler", "build_type"
    options = {"with_cuda": [True, False], "with_xtensor": [True, False], "with_openmp": [True, False]}
    default_options = {"with_cuda": False, "with_xtensor": False, "with_openmp": True}
    exports_sources = "include/*", "cuda/include/*", "LICENSE"
    no_copy_source = True

    def requirements(self):
        self.requires("eigen/3.4.0")
        self.requires("random123/1.14.0")
        if self.options.with_xtensor:
            self.requires("xtensor/0.24.3")

    def package_id(self):
        self.info.clear()

    def package(self):
        copy(self, "*.hpp", os.path.join(self.source_folder, "include"), os.path.join(self.package_folder, "include"))
        if self.options.with_cuda:
            copy(self, "*.cuh", os.path.join(self.source_folder, "cuda", "include"), os.path.join(self.package_folder, "include"))
        copy(self, "LICENSE", self.source_folder, os.path.join(self.package_folder, "licenses"))

    def package_info(self):
        self.cpp_info.set_property("cmake_file_name", "ssr")
        core = self.cpp_info.components["core"]
        core.set_property("cmake_target_name", "ssr::ssr")
        core.bindirs = []
        core.libdirs = []
        core.requires = ["eigen::eigen", "random123::random123"]
        if self.options.with_openmp:
            core.cxxflags = ["-fopenmp"]
            core.exelinkflags = ["-fopenmp"]
            core.sharedlinkflags = ["-fopenmp"]
        if self.options.with_cuda:  # the CUDA toolkit (with CCCL) comes from the system
            cu = self.cpp_info.components["cuda"]
            cu.set_property("cmake_target_name", "ssr::cuda")
            cu.bindirs = []
            cu.libdirs = []
            cu.requires = ["core"]
        if self.options.with_xtensor:
            xt = self.cpp_info.components["xtensor"]
            xt.set_property("cmake_target_name", "ssr::xtensor")
            xt.bindirs = []
            xt.libdirs = []
            xt.requires = ["core", "xtensor::xtensor"]
