# Runs COMMAND (a ;-list, with ENV as NAME=VALUE;... in front) and fails unless it exits
# with RC and its stdout matches OUT (a regex). ctest's PASS_REGULAR_EXPRESSION would
# ignore the exit code, which is half of what these tests check.
execute_process(COMMAND ${CMAKE_COMMAND} -E env ${ENV} ${COMMAND}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message(STATUS "exit ${rc}\nstdout:\n${out}stderr:\n${err}")
if(NOT rc STREQUAL RC)
  message(FATAL_ERROR "expected exit ${RC}, got ${rc}")
endif()
if(NOT out MATCHES "${OUT}")
  message(FATAL_ERROR "stdout does not match: ${OUT}")
endif()
