#include "util/log.h"

#include <cstdlib>
#include <memory>

#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"

namespace kpack::internal {

spdlog::logger& Log() {
  static spdlog::logger* const logger = [] {
    std::shared_ptr<spdlog::logger> l = spdlog::get("kpack");
    if (l == nullptr) l = spdlog::stderr_color_mt("kpack");
    const char* level = std::getenv("KPACK_LOG_LEVEL");
    l->set_level(level != nullptr ? spdlog::level::from_str(level) : spdlog::level::warn);
    return l.get();  // the registry keeps it alive
  }();
  return *logger;
}

}  // namespace kpack::internal
