// kpack verify PACK: everything Runtime::Open checks without a GPU (kpack::Pack), each
// problem on its own line; then, where a driver and device exist, every variant loaded and
// checked by the driver (cuKernelGetParamInfo, shared memory, threads, arch).

#include <ostream>
#include <string>
#include <vector>

#include "commands.h"
#include "driver/driver.h"
#include "kpack/kpack.h"

namespace kpack::cli {
namespace {

// Loads every variant through the driver on device 0. Returns false when no driver or
// device could be used (reported, not a failure: verify is an offline check first).
bool CheckWithDriver(const VerifyOptions& o, std::ostream& out,
                     std::vector<std::string>& problems) {
  auto driver = internal::Driver::Load(o.driver);
  if (!driver.ok()) {
    out << "driver checks skipped: " << driver.status().message() << "\n";
    return false;
  }
  const internal::Driver& d = **driver;
  CUdevice device;
  CUcontext ctx;
  if (d.DeviceGet(&device, 0) != CUDA_SUCCESS ||
      d.DevicePrimaryCtxRetain(&ctx, device) != CUDA_SUCCESS ||
      d.CtxSetCurrent(ctx) != CUDA_SUCCESS) {
    out << "driver checks skipped: cannot make device 0's primary context current\n";
    return false;
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
    if (CheckWithDriver(o, out, problems) && problems.empty()) {
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
