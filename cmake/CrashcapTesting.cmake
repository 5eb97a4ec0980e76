# One helper to add a Catch2 test binary; ctest runs it with a label per library.
if(CRASHCAP_BUILD_TESTS)
  enable_testing()
  find_package(Catch2 REQUIRED)
  include(Catch)
endif()

# crashcap_add_test(NAME name SOURCES a.cpp b.cpp LIBS lib... [LABELS l...] [TIMEOUT s])
function(crashcap_add_test)
  cmake_parse_arguments(T "" "NAME;TIMEOUT" "SOURCES;LIBS;LABELS" ${ARGN})
  add_executable(${T_NAME} ${T_SOURCES})
  target_link_libraries(${T_NAME} PRIVATE crashcap_test_main ${T_LIBS})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 600)
  endif()
  catch_discover_tests(${T_NAME}
    PROPERTIES LABELS "${T_LABELS}" TIMEOUT ${T_TIMEOUT}
    ENVIRONMENT "CRASHCAP_BIN=${CMAKE_BINARY_DIR}/bin;CRASHCAP_SOURCE_DIR=${CMAKE_SOURCE_DIR}")
endfunction()
