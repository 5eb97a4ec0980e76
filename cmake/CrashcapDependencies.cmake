# Every dependency is a Debian package installed by `./dev setup`.
find_package(CapnProto CONFIG REQUIRED)
find_package(PkgConfig REQUIRED)
pkg_check_modules(ZSTD REQUIRED IMPORTED_TARGET libzstd)
pkg_check_modules(XXHASH REQUIRED IMPORTED_TARGET libxxhash)
pkg_check_modules(LIBZIP REQUIRED IMPORTED_TARGET libzip)  # crashcap pack --zip
find_package(fmt CONFIG REQUIRED)
find_package(nlohmann_json CONFIG REQUIRED)
find_package(CLI11 CONFIG REQUIRED)
find_package(Threads REQUIRED)

set(CRASHCAP_HAVE_TORCH OFF)
if(NOT CRASHCAP_WITH_TORCH STREQUAL "OFF")
  if(CRASHCAP_WITH_TORCH STREQUAL "ON")
    find_package(Torch CONFIG)
    if(NOT Torch_FOUND)
      message(FATAL_ERROR "CRASHCAP_WITH_TORCH=ON but LibTorch was not found. "
        "Install Debian's libtorch-dev (./dev setup) or pass -DCMAKE_PREFIX_PATH=/path/to/libtorch.")
    endif()
  else()
    find_package(Torch CONFIG QUIET)
  endif()
  if(Torch_FOUND)
    set(CRASHCAP_HAVE_TORCH ON)
    # Torch's config hands out its flags as a string; keep them off targets that do not link it.
    message(STATUS "crashcap: LibTorch ${Torch_VERSION} found")
    # LibTorch 2.14's headers refuse C++17 (#error); 2.6's take it. For a version between them
    # that needs C++20, configure with -DCMAKE_CXX_STANDARD=20.
    if(Torch_VERSION VERSION_GREATER_EQUAL 2.14 AND CMAKE_CXX_STANDARD LESS 20)
      set(CMAKE_CXX_STANDARD 20)
      message(STATUS "crashcap: building as C++20, as LibTorch ${Torch_VERSION} requires")
    endif()
  else()
    message(STATUS "crashcap: LibTorch not found; building without the LibTorch parts")
  endif()
endif()

# crashcap_torch_pch(TARGET): TARGET's sources compile against the one precompiled LibTorch header
# (<torch/torch.h>), which crashcap::formats_torch, the lowest LibTorch library, builds. Such a
# header is about 700 MB with debug information and 40 s of one core to build: one per target made
# the build's precompiled headers 4.6 GB of its 7 GB, and that once filled a CI machine's disk.
# GCC takes a precompiled header only where it was built with the same -fPIC/-fPIE, so the
# libraries (position-independent code) share it; an executable with one LibTorch source gains
# nothing from a header it would build for that source alone.
function(crashcap_torch_pch target)
  target_precompile_headers(${target} REUSE_FROM crashcap_formats_torch)
endfunction()

# CUPTI (the kernel tracer arrives with its issue): AUTO probes, ON requires, OFF skips.
# Nothing links it yet; the result is recorded so `crashcap doctor` and the tracer can use it.
set(CRASHCAP_HAVE_CUPTI OFF)
if(NOT CRASHCAP_WITH_CUPTI STREQUAL "OFF")
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND AND TARGET CUDA::cupti)
    set(CRASHCAP_HAVE_CUPTI ON)
    message(STATUS "crashcap: CUPTI found (CUDA ${CUDAToolkit_VERSION})")
  elseif(CRASHCAP_WITH_CUPTI STREQUAL "ON")
    message(FATAL_ERROR "CRASHCAP_WITH_CUPTI=ON but CUPTI was not found. Install the CUDA toolkit "
      "(with extras/CUPTI) in its standard location or pass -DCUDAToolkit_ROOT=/path/to/cuda.")
  else()
    message(STATUS "crashcap: CUPTI not found; the kernel tracer will be built as unavailable")
  endif()
endif()
