// kpack's spdlog logger and KPACK_LOG_LEVEL (log.h).

#include "util/log.h"

#include <cstdlib>
#include <memory>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"

namespace kpack::internal {

absl::StatusOr<spdlog::level::level_enum> LogLevelFromEnvironment() {
  const char* env = std::getenv("KPACK_LOG_LEVEL");
  if (env == nullptr || env[0] == '\0') return spdlog::level::warn;
  // spdlog::level::from_str answers "off" for a name it does not know; the names are
  // matched here instead so that a typo is an error rather than silence.
  struct Name {
    std::string_view name;
    spdlog::level::level_enum level;
  };
  static constexpr Name kNames[] = {
      {"trace", spdlog::level::trace}, {"debug", spdlog::level::debug},
      {"info", spdlog::level::info},   {"warn", spdlog::level::warn},
      {"warning", spdlog::level::warn}, {"error", spdlog::level::err},
      {"err", spdlog::level::err},     {"critical", spdlog::level::critical},
      {"off", spdlog::level::off},
  };
  for (const Name& n : kNames) {
    if (n.name == env) return n.level;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("KPACK_LOG_LEVEL='", env,
                   "' is not a log level: use trace, debug, info, warn, error, critical or "
                   "off, or unset it for the default (warn)"));
}

spdlog::logger& Log() {
  static spdlog::logger* const logger = [] {
    std::shared_ptr<spdlog::logger> l = spdlog::get("kpack");
    if (l == nullptr) l = spdlog::stderr_color_mt("kpack");
    l->set_level(LogLevelFromEnvironment().value_or(spdlog::level::warn));
    return l.get();  // the registry keeps it alive
  }();
  return *logger;
}

}  // namespace kpack::internal
