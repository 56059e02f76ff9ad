# `cmake --install` and CPack's Debian package (README.md "Install"): the
# binaries, the built-in profiles and examples (the binaries embed the profiles;
# the files are there to read and copy), the Python client with its stubs and
# moeplan.torch where it was built, and the README. Nothing installed points
# back at the source or build tree (tests/install/install_test.sh checks it from
# an empty directory).
include(GNUInstallDirs)
# Two packages: moeplan (everything but moeplan.torch) and moeplan-torch (the
# extension, which needs Debian's libtorch, a gigabyte users of the planner alone
# should not have to take).
set(CMAKE_INSTALL_DEFAULT_COMPONENT_NAME main)

# Debian's python3 reads /usr/lib/python3/dist-packages; for another prefix,
# put PREFIX/${MOEPLAN_INSTALL_PYTHONDIR} on PYTHONPATH.
set(MOEPLAN_INSTALL_PYTHONDIR "lib/python3/dist-packages" CACHE STRING
    "Where the Python client and moeplan.torch go, relative to the install prefix")

install(TARGETS moeplan moeplan-server moeplan-profile moeplan-exec
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/calibration/profiles/
        DESTINATION ${CMAKE_INSTALL_DATADIR}/moeplan/profiles
        FILES_MATCHING PATTERN "*.json" PATTERN "measured" EXCLUDE)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/examples/
        DESTINATION ${CMAKE_INSTALL_DATADIR}/moeplan/examples
        PATTERN "__pycache__" EXCLUDE)
# client/python in the build tree: moeplan_client.py, moeplan_schedules.py, the
# generated moeplan.v1 stubs and, where built, moeplan.torch with its _C.so.
install(DIRECTORY ${CMAKE_BINARY_DIR}/client/python/
        DESTINATION ${MOEPLAN_INSTALL_PYTHONDIR}
        PATTERN "__pycache__" EXCLUDE PATTERN "*.pyc" EXCLUDE PATTERN "torch" EXCLUDE)
if(MOEPLAN_TORCH_BUILT)
  install(DIRECTORY ${CMAKE_BINARY_DIR}/client/python/moeplan/torch
          DESTINATION ${MOEPLAN_INSTALL_PYTHONDIR}/moeplan COMPONENT torch
          PATTERN "__pycache__" EXCLUDE PATTERN "*.pyc" EXCLUDE)
endif()
install(FILES ${PROJECT_SOURCE_DIR}/README.md DESTINATION ${CMAKE_INSTALL_DOCDIR})

# cpack -G DEB (in the build directory): moeplan_VERSION_amd64.deb and, where
# moeplan.torch is built, moeplan-torch_VERSION_amd64.deb. Shared-library
# dependencies come from dpkg-shlibdeps; the Python client needs Debian's grpcio
# and protobuf, the profiler and executor an MPI launcher.
set(CPACK_PACKAGE_NAME moeplan)
set(CPACK_PACKAGE_VENDOR "moeplan")
set(CPACK_PACKAGE_CONTACT "moeplan developers <moeplan@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
    "Performance simulator and schedule planner for distributed MoE training")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_GENERATOR DEB)
set(CPACK_STRIP_FILES ON)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION science)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL main)
set(CPACK_DEBIAN_MAIN_PACKAGE_NAME moeplan)
set(CPACK_DEBIAN_MAIN_PACKAGE_DEPENDS "python3, python3-grpcio, python3-protobuf")
set(CPACK_DEBIAN_MAIN_PACKAGE_RECOMMENDS "openmpi-bin")
if(MOEPLAN_TORCH_BUILT)
  list(APPEND CPACK_COMPONENTS_ALL torch)
  set(CPACK_DEBIAN_TORCH_PACKAGE_NAME moeplan-torch)
  set(CPACK_DEBIAN_TORCH_PACKAGE_DEPENDS "moeplan (= ${PROJECT_VERSION}), python3-torch")
  set(CPACK_COMPONENT_TORCH_DESCRIPTION "moeplan.torch: the moeplan executor as a PyTorch extension")
endif()
set(CPACK_DEBIAN_COMPRESSION_TYPE gzip)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
include(CPack)
