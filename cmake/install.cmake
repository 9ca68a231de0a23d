# Installs the headers and a relocatable CMake package (find_package(ssr 0.1 CONFIG [COMPONENTS xtensor]))
# and exports the build tree, so find_package also works against a build directory.
include(CMakePackageConfigHelpers)

set(SSR_CONFIG_DIR "${CMAKE_INSTALL_DATADIR}/cmake/ssr")

install(DIRECTORY "${PROJECT_SOURCE_DIR}/include/ssr" DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}")
install(TARGETS ssr EXPORT ssrTargets)
install(EXPORT ssrTargets NAMESPACE ssr:: DESTINATION "${SSR_CONFIG_DIR}")
export(EXPORT ssrTargets NAMESPACE ssr:: FILE "${PROJECT_BINARY_DIR}/ssrTargets.cmake")
if(SSR_HAS_XTENSOR)
  install(TARGETS ssr_xtensor EXPORT ssrXtensorTargets)
  install(EXPORT ssrXtensorTargets NAMESPACE ssr:: DESTINATION "${SSR_CONFIG_DIR}")
  export(EXPORT ssrXtensorTargets NAMESPACE ssr:: FILE "${PROJECT_BINARY_DIR}/ssrXtensorTargets.cmake")
endif()

if(SSR_ENABLE_CUDA)
  install(DIRECTORY "${PROJECT_SOURCE_DIR}/cuda/include/ssr/cuda" DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}/ssr")
  install(TARGETS ssr_cuda EXPORT ssrCudaTargets)
  install(EXPORT ssrCudaTargets NAMESPACE ssr:: DESTINATION "${SSR_CONFIG_DIR}")
  export(EXPORT ssrCudaTargets NAMESPACE ssr:: FILE "${PROJECT_BINARY_DIR}/ssrCudaTargets.cmake")
endif()

if(SSR_ENABLE_MPI)
  install(FILES "${PROJECT_SOURCE_DIR}/mpi/include/ssr/mpi.hpp" DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}/ssr")
  install(TARGETS ssr_mpi EXPORT ssrMpiTargets)
  install(EXPORT ssrMpiTargets NAMESPACE ssr:: DESTINATION "${SSR_CONFIG_DIR}")
  export(EXPORT ssrMpiTargets NAMESPACE ssr:: FILE "${PROJECT_BINARY_DIR}/ssrMpiTargets.cmake")
endif()

configure_package_config_file("${PROJECT_SOURCE_DIR}/cmake/ssrConfig.cmake.in" "${PROJECT_BINARY_DIR}/ssrConfig.cmake"
  INSTALL_DESTINATION "${SSR_CONFIG_DIR}")
write_basic_package_version_file("${PROJECT_BINARY_DIR}/ssrConfigVersion.cmake"
  COMPATIBILITY SameMajorVersion ARCH_INDEPENDENT)
configure_file("${PROJECT_SOURCE_DIR}/cmake/FindRandom123.cmake" "${PROJECT_BINARY_DIR}/FindRandom123.cmake" COPYONLY)
install(FILES "${PROJECT_BINARY_DIR}/ssrConfig.cmake" "${PROJECT_BINARY_DIR}/ssrConfigVersion.cmake"
  "${PROJECT_SOURCE_DIR}/cmake/FindRandom123.cmake" DESTINATION "${SSR_CONFIG_DIR}")
install(FILES "${PROJECT_SOURCE_DIR}/LICENSE" DESTINATION "${CMAKE_INSTALL_DATADIR}/doc/ssr")
