# Build options. Optional parts are AUTO|ON|OFF: AUTO probes, ON fails with a message
# that says what to install, OFF skips. Their defines stay PRIVATE to the targets using them.

set(CRASHCAP_WITH_TORCH AUTO CACHE STRING
  "Build the LibTorch parts (tensor bridge, .pt export, the recorder, the replayer): AUTO|ON|OFF")
set(CRASHCAP_WITH_CUPTI AUTO CACHE STRING
  "Build the CUPTI kernel tracer and libcrashcap_inject.so: AUTO|ON|OFF")
set(CRASHCAP_WITH_PYTHON AUTO CACHE STRING
  "Build the Python package (python/: the crashcap module over a pybind11 extension; needs LibTorch and the same torch in Python): AUTO|ON|OFF")
set(CRASHCAP_SANITIZE "" CACHE STRING
  "Sanitizers to build with, e.g. address,undefined (empty: none)")
# A training project that adds crashcap with add_subdirectory() gets the libraries and the CLI,
# not crashcap's own tests and benchmarks.
option(CRASHCAP_BUILD_TESTS "Build the Catch2 tests and the fuzz driver" ${PROJECT_IS_TOP_LEVEL})
option(CRASHCAP_BUILD_BENCH "Build the benchmarks in bench/" ${PROJECT_IS_TOP_LEVEL})
option(CRASHCAP_GPU_CHECK "Build the CUDA programs ./dev gpu-check runs (needs nvcc; a GPU to run them)" OFF)
option(CRASHCAP_LIBFUZZER "Build the fuzz targets with libFuzzer (needs clang)" OFF)

foreach(opt CRASHCAP_WITH_TORCH CRASHCAP_WITH_CUPTI CRASHCAP_WITH_PYTHON)
  set_property(CACHE ${opt} PROPERTY STRINGS AUTO ON OFF)
  if(NOT ${opt} MATCHES "^(AUTO|ON|OFF)$")
    message(FATAL_ERROR "${opt} must be AUTO, ON or OFF (got '${${opt}}')")
  endif()
endforeach()

if(CRASHCAP_SANITIZE)
  add_compile_options(-fsanitize=${CRASHCAP_SANITIZE} -fno-omit-frame-pointer)
  add_link_options(-fsanitize=${CRASHCAP_SANITIZE})
endif()

if(CRASHCAP_LIBFUZZER)
  # Coverage instrumentation for every library, so libFuzzer sees inside the readers; the
  # fuzz targets themselves link with -fsanitize=fuzzer (tests/fuzz).
  add_compile_options(-fsanitize=fuzzer-no-link)
endif()

add_compile_options(-Wall -Wextra -Wno-unused-parameter)
