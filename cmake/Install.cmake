# Installs the library with an exported CMake package: find_package(tensorwire).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)
# Every build installs it (`make build` then `cmake --install build`, Python extension or
# not), except pip's: scikit-build-core (SKBUILD) installs into the wheel, which gets only
# the extension and the command (python/CMakeLists.txt).
if(NOT SKBUILD)
  install(TARGETS tensorwire EXPORT tensorwireTargets
          ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
          LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
  install(DIRECTORY include/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
  install(EXPORT tensorwireTargets NAMESPACE tensorwire::
          DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/tensorwire)
  configure_package_config_file(cmake/tensorwireConfig.cmake.in
    ${CMAKE_CURRENT_BINARY_DIR}/tensorwireConfig.cmake
    INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/tensorwire)
  write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/tensorwireConfigVersion.cmake
    COMPATIBILITY SameMinorVersion)
  install(FILES ${CMAKE_CURRENT_BINARY_DIR}/tensorwireConfig.cmake
                ${CMAKE_CURRENT_BINARY_DIR}/tensorwireConfigVersion.cmake
                cmake/UcxRoot.cmake
          DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/tensorwire)
  if(TENSORWIRE_TOOLS)
    install(TARGETS tensorwire_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
  endif()
endif()
