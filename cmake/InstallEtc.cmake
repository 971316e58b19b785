# Runs at install time (cmake --install, cpack): lays out what depends on the install prefix
# chosen then, not at configure time. AGW_SOURCE_DIR, AGW_BINARY_DIR and AGW_BINDIR are set by
# cmake/Install.cmake; file(INSTALL) adds $DESTDIR itself and records each file in the manifest.
#   ETC = /etc when the prefix is /usr (the .deb), else PREFIX/etc
if(CMAKE_INSTALL_PREFIX STREQUAL "/usr")
  set(AGW_ETC /etc)
else()
  set(AGW_ETC "${CMAKE_INSTALL_PREFIX}/etc")
endif()
set(AGGWAY_BIN "${CMAKE_INSTALL_PREFIX}/${AGW_BINDIR}/aggway")
set(AGGWAY_SCRIPTS "${AGW_ETC}/aggway/scripts")
set(AGGWAY_LOG_DIR /var/log/aggway)

string(RANDOM LENGTH 12 agw_run)
set(out "${AGW_BINARY_DIR}/deploy-configured/${agw_run}")
configure_file("${AGW_SOURCE_DIR}/deploy/systemd/aggway.service.in" "${out}/aggway.service" @ONLY)
configure_file("${AGW_SOURCE_DIR}/deploy/logrotate/aggway.in" "${out}/aggway" @ONLY)

file(INSTALL DESTINATION "${AGW_ETC}/aggway" TYPE DIRECTORY FILES "${AGW_SOURCE_DIR}/scripts"
  FILES_MATCHING PATTERN "*.lua")
file(INSTALL DESTINATION "${AGW_ETC}/logrotate.d" TYPE FILE FILES "${out}/aggway")
file(INSTALL DESTINATION "${CMAKE_INSTALL_PREFIX}/lib/systemd/system" TYPE FILE FILES "${out}/aggway.service")
file(REMOVE_RECURSE "${out}")
