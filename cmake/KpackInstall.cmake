# `cmake --install` lays out a package that find_package(kpack) consumes:
#   include/kpack/*.h, lib/libkpack.a, lib/cmake/kpack/{kpackConfig,kpackConfigVersion,
#   kpackTargets}.cmake
include(CMakePackageConfigHelpers)

install(TARGETS kpack EXPORT kpackTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/kpack
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})

set(KPACK_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/kpack)
install(EXPORT kpackTargets NAMESPACE kpack:: DESTINATION ${KPACK_CMAKE_DIR})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/kpackConfig.cmake.in
  ${PROJECT_BINARY_DIR}/kpackConfig.cmake INSTALL_DESTINATION ${KPACK_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/kpackConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/kpackConfig.cmake
              ${PROJECT_BINARY_DIR}/kpackConfigVersion.cmake
        DESTINATION ${KPACK_CMAKE_DIR})
