// kpack verify PACK: everything Runtime::Open checks without a GPU (kpack::Pack), each
// problem on its own line; then, where a driver and device exist, every variant loaded and
// checked by the driver (cuKernelGetParamInfo, shared memory, threads, arch). A driver
// named with --driver (or $KPACK_CUDA_DRIVER) must load; the default one may be absent.

#include <cstdlib>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "commands.h"
#include "driver/driver.h"
#include "kpack/kpack.h"

namespace kpack::cli {
namespace {

// Whether the driver to load was named (--driver, or $KPACK_CUDA_DRIVER) rather than the
// default libcuda.so.1: a named driver must load, as doctor requires.
bool DriverNamed(const std::string& driver) {
  const char* env = std::getenv("KPACK_CUDA_DRIVER");
  return !driver.empty() || (env != nullptr && env[0] != '\0');
}

// Loads every variant through the driver on device 0. Returns false when no driver or
// device could be used: reported as a skip for the default driver (verify is an offline
// check first), as a problem for a named one.
bool CheckWithDriver(const VerifyOptions& o, std::ostream& out,
                     std::vector<std::string>& problems) {
  const bool named = DriverNamed(o.driver);
  auto unusable = [&](absl::string_view why) {
    if (named) {
      problems.push_back(absl::StrCat("driver: ", why));
    } else {
      out << "driver checks skipped: " << why << "\n";
    }
    return false;
  };
  auto driver = internal::Driver::Load(o.driver);
  if (!driver.ok()) return unusable(driver.status().message());
  const internal::Driver& d = **driver;
  CUdevice device;
  CUcontext ctx;
  if (d.DeviceGet(&device, 0) != CUDA_SUCCESS ||
      d.DevicePrimaryCtxRetain(&ctx, device) != CUDA_SUCCESS) {
    return unusable(absl::StrCat("driver '", d.path, "' has no usable device 0"));
  }
  if (d.CtxSetCurrent(ctx) != CUDA_SUCCESS) {
    d.DevicePrimaryCtxRelease(device);
    return unusable(absl::StrCat("cannot make device 0's primary context current in '", d.path,
                                 "'"));
  }
  Options options;
  options.driver_path = o.driver;
  auto rt = Runtime::Open(o.pack, options);
  if (!rt.ok()) {
    problems.push_back(std::string(rt.status().message()));
  } else {
    for (const std::string& name : rt->kernel_names()) {
      absl::Status s = rt->Find(name)->Preload();
      if (!s.ok()) problems.push_back(std::string(s.message()));
    }
  }
  d.DevicePrimaryCtxRelease(device);
  return true;
}

}  // namespace

int Verify(const VerifyOptions& o, std::ostream& out, std::ostream& err) {
  // Pack::Read is exactly what Runtime::Open checks before it needs a device; when it
  // fails, Pack::Verify lists every problem rather than the first.
  absl::StatusOr<Pack> pack = Pack::Read(o.pack);
  std::vector<std::string> problems;
  if (!pack.ok()) {
    for (const absl::Status& s : Pack::Verify(o.pack)) problems.push_back(std::string(s.message()));
    // Read and Verify are one code path; should they ever disagree, say so rather than
    // report a problem-free failure.
    if (problems.empty()) problems.push_back(std::string(pack.status().message()));
  } else {
    size_t variants = 0;
    for (const KernelInfo& k : pack->kernels()) variants += k.variants.size();
    const size_t kernels = pack->kernels().size();
    out << "offline: manifest, " << kernels << (kernels == 1 ? " kernel, " : " kernels, ")
        << variants << (variants == 1 ? " variant" : " variants")
        << " (cubin files, sha256, ELF arch, entry symbols, parameter layouts; grid "
           "expressions; dispatch tables): OK\n";
    if (o.offline) {
      out << "driver checks skipped: --offline\n";
    } else if (CheckWithDriver(o, out, problems) && problems.empty()) {
      out << "driver: " << (variants == 1 ? "the variant" : "all " + std::to_string(variants) +
                                                           " variants")
          << " loaded and checked on device 0: OK\n";
    }
  }
  for (const std::string& p : problems) err << "kpack verify: " << p << "\n";
  if (!problems.empty()) {
    err << "kpack verify: FAILED: " << problems.size() << " problem"
        << (problems.size() == 1 ? "" : "s") << "\n";
    return kFailed;
  }
  out << "OK: " << pack->dir() << "\n";
  return kOk;
}

}  // namespace kpack::cli
