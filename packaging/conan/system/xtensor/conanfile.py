# xtensor from the system (Debian: xtensor-dev), for building ssr's Conan package without a remote.
from conan import ConanFile
from conan.tools.system.package_manager import Apt


class XtensorSystemConan(ConanFile):
    name = "xtensor"
    package_type = "header-library"
    description = "xtensor and xtl headers installed by the system package manager"
    license = "BSD-3-Clause"

    def package_id(self):
        self.info.clear()

    def system_requirements(self):
        Apt(self).install(["xtensor-dev"], check=True)

    def package_info(self):
        self.cpp_info.bindirs = []
        self.cpp_info.libdirs = []
        self.cpp_info.includedirs = ["/usr/include"]
        self.cpp_info.set_property("cmake_file_name", "xtensor")
        self.cpp_info.set_property("cmake_target_name", "xtensor")
