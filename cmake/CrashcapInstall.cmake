# Installing crashcap, so a training program outside this tree can link the Recorder:
#
#   cmake --install build --prefix /opt/crashcap
#   # the program's CMakeLists.txt (configure with -DCMAKE_PREFIX_PATH=/opt/crashcap):
#   find_package(crashcap REQUIRED)
#   target_link_libraries(train PRIVATE crashcap::recorder)
#
# Installed: the `crashcap` and `crashcap-torch` executables, libcrashcap_inject.so, every library
# as a static archive with its public headers, and crashcapConfig.cmake, which finds the same
# dependencies this build used. docs/RECORDING.md ("Recording your own training").
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(CRASHCAP_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/crashcap)

# crashcap_library(TARGET NAME): TARGET is the library `crashcap::NAME` in this build and once
# installed. Its folder's include/ holds its public headers (the only include directory a user
# sees); the target joins the exported set.
function(crashcap_library target name)
  add_library(crashcap::${name} ALIAS ${target})
  set_target_properties(${target} PROPERTIES EXPORT_NAME ${name})
  target_include_directories(${target} PUBLIC
    $<BUILD_INTERFACE:${CMAKE_CURRENT_SOURCE_DIR}/include>
    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  install(TARGETS ${target} EXPORT crashcapTargets
    ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
    LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
  install(DIRECTORY include/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
endfunction()

# The package files; called once, after every library was declared.
function(crashcap_install_package)
  install(EXPORT crashcapTargets NAMESPACE crashcap:: DESTINATION ${CRASHCAP_INSTALL_CMAKEDIR})
  configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/crashcapConfig.cmake.in
    ${PROJECT_BINARY_DIR}/crashcapConfig.cmake INSTALL_DESTINATION ${CRASHCAP_INSTALL_CMAKEDIR}
    PATH_VARS CMAKE_INSTALL_BINDIR)
  write_basic_package_version_file(${PROJECT_BINARY_DIR}/crashcapConfigVersion.cmake
    COMPATIBILITY SameMinorVersion)
  install(FILES ${PROJECT_BINARY_DIR}/crashcapConfig.cmake ${PROJECT_BINARY_DIR}/crashcapConfigVersion.cmake
    DESTINATION ${CRASHCAP_INSTALL_CMAKEDIR})
endfunction()
