# Eigen from the system (Debian: libeigen3-dev), for building ssr's Conan package without a remote.
from conan import ConanFile
from conan.tools.system.package_manager import Apt


class EigenSystemConan(ConanFile):
    name = "eigen"
    package_type = "header-library"
    description = "Eigen headers installed by the system package manager"
    license = "MPL-2.0"

    def package_id(self):
        self.info.clear()

    def system_requirements(self):
        Apt(self).install(["libeigen3-dev"], check=True)

    def package_info(self):
        self.cpp_info.bindirs = []
        self.cpp_info.libdirs = []
        self.cpp_info.includedirs = ["/usr/include/eigen3"]
        self.cpp_info.set_property("cmake_file_name", "Eigen3")
        self.cpp_info.set_property("cmake_target_name", "Eigen3::Eigen")
