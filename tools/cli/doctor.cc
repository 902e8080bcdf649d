// kpack doctor: can kpack launch here, and if not, why. Exit 0 only when a Runtime could
// open a pack and launch: a driver loads, has at least one device, and KPACK_LOG_LEVEL
// (which Open checks) is valid.

#include <cstdlib>
#include <ostream>
#include <string>

#include "commands.h"
#include "driver/driver.h"
#include "util/log.h"

namespace kpack::cli {

int Doctor(const DoctorOptions& o, std::ostream& out, std::ostream& err) {
#if KPACK_ENABLE_NVTX
  const char* nvtx_env = std::getenv("KPACK_NVTX");
  const char* injection = std::getenv("NVTX_INJECTION64_PATH");
  bool nvtx_on = !(nvtx_env != nullptr && std::string(nvtx_env) == "0");
  out << "NVTX: compiled in; " << (nvtx_on ? "on" : "off (KPACK_NVTX=0)") << "; "
      << (injection != nullptr && injection[0] != '\0'
              ? std::string("a tool is attached (NVTX_INJECTION64_PATH=") + injection + ")"
              : std::string("no profiler attached (NVTX_INJECTION64_PATH unset)"))
      << "\n";
#else
  out << "NVTX: compiled out (-DKPACK_ENABLE_NVTX=OFF)\n";
#endif
  std::string blocker;  // why nothing can launch although a driver loads
  const char* level = std::getenv("KPACK_LOG_LEVEL");
  if (auto parsed = internal::LogLevelFromEnvironment(); parsed.ok()) {
    out << "log level: "
        << (level != nullptr && level[0] != '\0' ? std::string(level) + " (KPACK_LOG_LEVEL)"
                                                  : std::string("warn (KPACK_LOG_LEVEL unset)"))
        << "\n";
  } else {
    out << "log level: " << parsed.status().message() << " (Runtime::Open refuses it)\n";
    blocker = "fix KPACK_LOG_LEVEL";
  }
  auto loaded = internal::Driver::Load(o.driver);
  if (!loaded.ok()) {
    out << "driver: not available: " << loaded.status().message() << "\n";
    out << "nothing can launch on this machine; packs can still be inspected and verified "
           "offline\n";
    return kFailed;
  }
  const internal::Driver& d = **loaded;
  int version = 0, count = 0;
  d.DriverGetVersion(&version);
  out << "driver: " << d.path << ", CUDA " << version / 1000 << "." << (version % 1000) / 10 << " ("
      << version << ")\n";
  if (d.DeviceGetCount(&count) != CUDA_SUCCESS) {
    err << "kpack doctor: cuDeviceGetCount failed\n";
    return kFailed;
  }
  out << "devices: " << count << "\n";
  if (count == 0) blocker = blocker.empty() ? "no device" : "no device; " + blocker;
  for (int i = 0; i < count; ++i) {
    CUdevice dev;
    char name[256] = {};
    int major = 0, minor = 0, sms = 0, optin = 0;
    d.DeviceGet(&dev, i);
    d.DeviceGetName(name, sizeof(name), dev);
    d.DeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev);
    d.DeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev);
    d.DeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev);
    d.DeviceGetAttribute(&optin, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, dev);
    out << "  device " << i << ": " << name << ", compute capability " << major << "." << minor
        << " (runs sm_" << major << minor << (major >= 9 ? "a" : "") << " cubins), " << sms
        << " SMs, " << optin << " B shared memory per block (opt-in)\n";
  }
  if (!blocker.empty()) {
    out << "nothing can launch: " << blocker << "\n";
    return kFailed;
  }
  return kOk;
}

}  // namespace kpack::cli
