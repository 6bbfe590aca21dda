# CUDA backend build settings (included from the top-level CMakeLists.txt when DSV4_CUDA=ON).
# Kernels are compiled ahead of time for exactly the parts we support; there is no run-time compilation.
#   sm_90a  : H100 / H200 (Hopper)
#   sm_120a : RTX 50 / RTX PRO 6000 (Blackwell consumer, ~99 KB shared memory per block)
#   sm_121a : GB10 / DGX Spark
# Override with -DCMAKE_CUDA_ARCHITECTURES=90a to build one target only (faster device builds).
if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES OR CMAKE_CUDA_ARCHITECTURES STREQUAL "")
  set(CMAKE_CUDA_ARCHITECTURES "90a;120a;121a")
endif()
enable_language(CUDA)
find_package(CUDAToolkit REQUIRED)
# C++17 for device code: CMake releases before 3.26 do not know nvcc's C++20 flag, and the kernels need nothing newer.
set(CMAKE_CUDA_STANDARD 17)
set(CMAKE_CUDA_STANDARD_REQUIRED ON)
# -Wall etc. from add_compile_options are host-compiler flags; pass them through for .cu files only as
# -Xcompiler would be noisy, so CUDA sources get their own small set.
set(DSV4_CUDA_FLAGS --expt-relaxed-constexpr -lineinfo -Xptxas=-warn-spills)

# The top level adds host warning flags (-Wall -Wextra ...) with add_compile_options, which nvcc rejects.
# Called from a directory holding .cu files: keep those options for C++ sources only.
function(dsv4_cuda_host_flags_only)
  get_directory_property(opts COMPILE_OPTIONS)
  set(guarded "")
  foreach(o IN LISTS opts)
    list(APPEND guarded "$<$<COMPILE_LANGUAGE:CXX>:${o}>")
  endforeach()
  set_directory_properties(PROPERTIES COMPILE_OPTIONS "${guarded}")
endfunction()
