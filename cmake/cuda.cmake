# ssr::cuda, the CUDA backend's target: enables the CUDA language (for ssr's own targets only; consumers of
# ssr::cuda enable it themselves), finds the toolkit and its CCCL. Included by the top-level CMakeLists.txt
# with SSR_ENABLE_CUDA, and by python/ for the operators' CUDA kernels.
include_guard(GLOBAL)
if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
  set(CMAKE_CUDA_ARCHITECTURES 80 90)
endif()
enable_language(CUDA)
find_package(CUDAToolkit REQUIRED)
find_package(CCCL CONFIG REQUIRED HINTS "${CUDAToolkit_LIBRARY_DIR}/cmake")
get_filename_component(ssr_cuda_include "${CMAKE_CURRENT_LIST_DIR}/../cuda/include" ABSOLUTE)
add_library(ssr_cuda INTERFACE)
add_library(ssr::cuda ALIAS ssr_cuda)
set_target_properties(ssr_cuda PROPERTIES EXPORT_NAME cuda)
target_include_directories(ssr_cuda INTERFACE
  $<BUILD_INTERFACE:${ssr_cuda_include}>
  $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
target_link_libraries(ssr_cuda INTERFACE ssr::ssr CCCL::CCCL CUDA::toolkit CUDA::cudart)
target_compile_options(ssr_cuda INTERFACE $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr>)
