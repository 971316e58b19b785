# Install layout, packaging and the deploy/ files (docs/operations.md "Deploying").
#
#   cmake --install build [--prefix P]  (or DESTDIR=stage cmake --install build) lays out:
#     P/bin/aggway                            the binary
#     P/share/aggway/lua/agg/*.lua            the Lua runtime, found relative to the binary
#                                             (gateway/deploy/runtime_dir.h: the lookup order)
#     P/share/aggway/monitoring/              Grafana dashboard, Prometheus alert rules
#     P/share/man/man1/aggway.1               the man page
#     ETC/aggway/scripts/                     the example scripts folder (gateway.lua + pages)
#     ETC/logrotate.d/aggway                  log rotation with SIGUSR1
#     P/lib/systemd/system/aggway.service     the unit, its paths filled in for P and ETC
#   ETC is /etc when P is /usr (the .deb, Debian policy), else P/etc.
#   cd build && cpack -G DEB  builds aggway_VERSION_ARCH.deb for /usr with the Debian libraries
#   aggway links with as dependencies (dpkg-shlibdeps) and ETC's files as conffiles.
include(GNUInstallDirs)
set(AGW_VERSION 0.1.0)

# Where the binary finds its runtime: installed, relative to itself; in the build tree it was
# built in, the source tree's lua/ (so the tests run what they change).
file(RELATIVE_PATH AGW_LUA_RELDIR ${CMAKE_INSTALL_FULL_BINDIR} ${CMAKE_INSTALL_FULL_DATADIR}/aggway/lua)
target_compile_definitions(aggcore PUBLIC AGW_VERSION="${AGW_VERSION}" AGW_LUA_RELDIR="${AGW_LUA_RELDIR}"
  AGW_BUILD_DIR="${CMAKE_BINARY_DIR}" AGW_BUILD_LUA_DIR="${CMAKE_SOURCE_DIR}/lua")

install(TARGETS aggway RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY ${CMAKE_SOURCE_DIR}/lua/ DESTINATION ${CMAKE_INSTALL_DATADIR}/aggway/lua
  FILES_MATCHING PATTERN "*.lua")
install(FILES ${CMAKE_SOURCE_DIR}/deploy/grafana/aggway-dashboard.json
  ${CMAKE_SOURCE_DIR}/deploy/prometheus/aggway-alerts.yml
  DESTINATION ${CMAKE_INSTALL_DATADIR}/aggway/monitoring)
install(FILES ${CMAKE_SOURCE_DIR}/deploy/aggway.1 DESTINATION ${CMAKE_INSTALL_MANDIR}/man1)
install(FILES ${CMAKE_SOURCE_DIR}/README.md DESTINATION ${CMAKE_INSTALL_DOCDIR})
install(FILES ${CMAKE_SOURCE_DIR}/docs/guide.md ${CMAKE_SOURCE_DIR}/docs/api.md ${CMAKE_SOURCE_DIR}/docs/operations.md
              ${CMAKE_SOURCE_DIR}/docs/performance.md DESTINATION ${CMAKE_INSTALL_DOCDIR}/docs)
# etc/, the unit and logrotate: paths decided at install time (--prefix, CPack), see InstallEtc.cmake
install(CODE "set(AGW_SOURCE_DIR \"${CMAKE_SOURCE_DIR}\")
  set(AGW_BINARY_DIR \"${CMAKE_BINARY_DIR}\")
  set(AGW_BINDIR \"${CMAKE_INSTALL_BINDIR}\")")
install(SCRIPT ${CMAKE_SOURCE_DIR}/cmake/InstallEtc.cmake)

# the .deb (cpack -G DEB in the build folder)
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME aggway)
set(CPACK_PACKAGE_VERSION ${AGW_VERSION})
set(CPACK_PACKAGE_CONTACT "aggway maintainers <aggway@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "scriptable API aggregation gateway (h2o, LuaJIT, libev)")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_SET_DESTDIR ON)  # install with DESTDIR and prefix /usr (not the build's), so etc/ goes to /etc
set(CPACK_INSTALL_PREFIX /usr)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION net)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)          # Depends: the libraries the binary links with
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "lua-busted") # aggway test
set(CPACK_DEBIAN_PACKAGE_SUGGESTS "redis-server, logrotate")
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA ${CMAKE_SOURCE_DIR}/deploy/debian/conffiles)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
include(CPack)

# tests of the install layout, the package and the deploy/ files
add_test(NAME deploy.install COMMAND python3 ${CMAKE_SOURCE_DIR}/tests/deploy/test_install.py)
add_test(NAME deploy.package COMMAND python3 ${CMAKE_SOURCE_DIR}/tests/deploy/test_package.py)
add_test(NAME deploy.files COMMAND python3 ${CMAKE_SOURCE_DIR}/tests/deploy/test_deploy_files.py)
# tools/demo in a network namespace of its own (its ports are fixed)
add_test(NAME deploy.demo COMMAND python3 ${CMAKE_SOURCE_DIR}/tests/deploy/test_demo.py)
# each installs from (or builds in) this build folder: one at a time
set_tests_properties(deploy.install deploy.package deploy.files deploy.demo PROPERTIES TIMEOUT 300 RESOURCE_LOCK aggway_install
  ENVIRONMENT "AGGWAY_BIN=$<TARGET_FILE:aggway>;AGGWAY_MOCK_BIN=${CMAKE_BINARY_DIR}/aggway-mock;AGGWAY_SOURCE_DIR=${CMAKE_SOURCE_DIR};AGGWAY_BUILD_DIR=${CMAKE_BINARY_DIR}")
