# A header-only dependency taken from the system's packages (Debian), so ssr's Conan package builds
# without a remote. Exported once per dependency: conan export . --name eigen --version 3.4.0
from conan import ConanFile
from conan.tools.system.package_manager import Apt

# name: (Debian package, include directory, CMake file name, CMake target)
SYSTEM = {
    "eigen": ("libeigen3-dev", "/usr/include/eigen3", "Eigen3", "Eigen3::Eigen"),
    "random123": ("librandom123-dev", "/usr/include", "Random123", "Random123::Random123"),
    "xtensor": ("xtensor-dev", "/usr/include", "xtensor", "xtensor"),
}


class SystemHeadersConan(ConanFile):
    package_type = "header-library"
    description = "Headers installed by the system package manager"

    def package_id(self):
        self.info.clear()

    def system_requirements(self):
        Apt(self).install([SYSTEM[str(self.name)][0]], check=True)

    def package_info(self):
        _, include, file_name, target = SYSTEM[str(self.name)]
        self.cpp_info.bindirs = []
        self.cpp_info.libdirs = []
        self.cpp_info.includedirs = [include]
        self.cpp_info.set_property("cmake_file_name", file_name)
        self.cpp_info.set_property("cmake_target_name", target)
