// kpack's one named spdlog logger ("kpack"). Used at load time only, never on a launch.
// Its level comes from KPACK_LOG_LEVEL: trace, debug, info, warn (or warning), error (or
// err), critical or off; unset or empty: warn. Any other value is refused by
// Runtime::Open (INVALID_ARGUMENT naming the accepted levels), so a typo cannot silently
// turn logging off.

#ifndef KPACK_SRC_UTIL_LOG_H_
#define KPACK_SRC_UTIL_LOG_H_

#include "absl/status/statusor.h"
#include "spdlog/common.h"
#include "spdlog/logger.h"

namespace kpack::internal {

// The level KPACK_LOG_LEVEL asks for (warn when unset or empty); INVALID_ARGUMENT naming
// the value and the accepted levels when it names none.
absl::StatusOr<spdlog::level::level_enum> LogLevelFromEnvironment();

// The logger, created at first use with LogLevelFromEnvironment()'s level (warn if that
// is an error: Open has refused it by then).
spdlog::logger& Log();

}  // namespace kpack::internal

#endif  // KPACK_SRC_UTIL_LOG_H_
