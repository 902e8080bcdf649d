// kpack's one named spdlog logger ("kpack"). Used at load time only, never on a launch.
// Its level comes from KPACK_LOG_LEVEL (trace, debug, info, warn, error, off; default
// warn).

#ifndef KPACK_SRC_UTIL_LOG_H_
#define KPACK_SRC_UTIL_LOG_H_

#include "spdlog/logger.h"

namespace kpack::internal {

spdlog::logger& Log();

}  // namespace kpack::internal

#endif  // KPACK_SRC_UTIL_LOG_H_
