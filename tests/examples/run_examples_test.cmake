# Installs the kpack build tree into a scratch prefix, then configures, builds (warnings
# as errors) and runs examples/ against it with find_package(kpack), with one compiler:
#   app PACK_DIR              UNAVAILABLE without a driver, else the pack's kernels
#   KPACK_CUDA_DRIVER=fake app PACK_DIR    the pack's kernels, `add` with 4 arguments
# Variables: KPACK_BINARY_DIR EXAMPLES_DIR WORK_DIR CXX LAUNCHER CUDA_ROOT GENERATOR
#            PACK_DIR FAKE_DRIVER
file(REMOVE_RECURSE ${WORK_DIR})
set(prefix ${WORK_DIR}/prefix)
execute_process(COMMAND ${CMAKE_COMMAND} --install ${KPACK_BINARY_DIR} --prefix ${prefix}
                OUTPUT_QUIET RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "cmake --install failed: ${rc}")
endif()
set(args -S ${EXAMPLES_DIR} -B ${WORK_DIR}/build -G ${GENERATOR}
         -DCMAKE_CXX_COMPILER=${CXX} -DCMAKE_PREFIX_PATH=${prefix}
         "-DCMAKE_CXX_FLAGS=-Wall -Wextra -Werror")
if(LAUNCHER)
  list(APPEND args -DCMAKE_CXX_COMPILER_LAUNCHER=${LAUNCHER})
endif()
if(CUDA_ROOT)
  list(APPEND args -DCUDAToolkit_ROOT=${CUDA_ROOT})
endif()
execute_process(COMMAND ${CMAKE_COMMAND} ${args} RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "configuring examples/ with find_package(kpack) (${CXX}) failed: ${rc}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build ${WORK_DIR}/build RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "building examples/ with ${CXX} failed: ${rc}")
endif()

execute_process(COMMAND ${WORK_DIR}/build/app ${PACK_DIR} RESULT_VARIABLE rc
                OUTPUT_VARIABLE out ERROR_VARIABLE err)
message(STATUS "app ${PACK_DIR}:\n${out}${err}")
# The driver-free description comes first whatever the machine has, then Open's answer.
if(NOT rc EQUAL 0 OR NOT out MATCHES "^add: 1 variants\n" OR
   NOT out MATCHES "\n(UNAVAILABLE: no CUDA driver|add: 4 args\n)")
  message(FATAL_ERROR "app: exit ${rc}; expected the pack's description, then UNAVAILABLE "
                      "or the kernel list")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -E env KPACK_CUDA_DRIVER=${FAKE_DRIVER}
                        ${WORK_DIR}/build/app ${PACK_DIR}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message(STATUS "KPACK_CUDA_DRIVER=${FAKE_DRIVER} app ${PACK_DIR}:\n${out}${err}")
if(NOT rc EQUAL 0 OR NOT out MATCHES "(^|\n)add: 4 args\n")
  message(FATAL_ERROR "app with the fake driver: exit ${rc}; expected `add: 4 args`")
endif()
