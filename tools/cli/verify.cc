// kpack verify PACK: everything that can be checked without a GPU, each problem on its
// own line; then, where a driver and device exist, every variant loaded and checked by
// the driver (cuKernelGetParamInfo, shared memory, threads, arch).

#include <algorithm>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "commands.h"
#include "cubin/cubin_reader.h"
#include "driver/driver.h"
#include "kpack/kpack.h"
#include "manifest/manifest.h"
#include "manifest/pack.h"

namespace kpack::cli {
namespace {

using internal::KernelSpec;
using internal::SlotSpec;
using internal::VariantSpec;

// The manifest's claims about one variant against its cubin's ELF.
void CheckVariant(const std::string& root, const KernelSpec& k, const VariantSpec& v,
                  std::vector<std::string>& problems) {
  const std::string where = absl::StrCat("kernel '", k.name, "' variant '", v.name, "'");
  auto bytes = internal::ReadVariantCubin(root, v, where);
  if (!bytes.ok()) {
    problems.push_back(std::string(bytes.status().message()));
    return;
  }
  auto cubin = internal::ReadCubin(*bytes);
  if (!cubin.ok()) {
    problems.push_back(absl::StrCat(where, ": cubin '", v.cubin,
                                    "' is not a valid cubin: ", cubin.status().message()));
    return;
  }
  if (cubin->arch != v.arch) {
    problems.push_back(absl::StrCat(where, ": arch: manifest says ", v.arch,
                                    ", the cubin's ELF header says ", cubin->arch));
  }
  auto entry = std::find_if(cubin->kernels.begin(), cubin->kernels.end(),
                            [&](const internal::CubinKernel& c) { return c.name == v.entry; });
  if (entry == cubin->kernels.end()) {
    std::vector<std::string> names;
    for (const auto& c : cubin->kernels) names.push_back(c.name);
    problems.push_back(
        absl::StrCat(where, ": entry '", v.entry,
                     "' is not a kernel of the cubin (it has: ", absl::StrJoin(names, ", "), ")"));
    return;
  }
  const size_t n = std::max(v.layout.size(), entry->params.size());
  for (size_t i = 0; i < n; ++i) {
    if (i >= v.layout.size()) {
      problems.push_back(absl::StrCat(where, ": parameter #", i, ": the cubin has it (offset ",
                                      entry->params[i].offset, " size ", entry->params[i].size,
                                      "), the manifest's layout does not"));
      continue;
    }
    const SlotSpec& s = v.layout[i];
    const std::string param = absl::StrCat("parameter '", internal::SlotName(k, s), "' (#", i, ")");
    if (i >= entry->params.size()) {
      problems.push_back(absl::StrCat(where, ": ", param, ": expected offset ", s.offset, " size ",
                                      s.size, ", the cubin has no such parameter"));
      continue;
    }
    const auto& c = entry->params[i];
    if (c.offset != s.offset || c.size != s.size) {
      problems.push_back(absl::StrCat(where, ": ", param, ": expected offset ", s.offset, " size ",
                                      s.size, " (manifest), found offset ", c.offset, " size ",
                                      c.size, " (cubin)"));
    }
  }
}

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
  std::string root;
  auto manifest = internal::ReadManifest(o.pack, &root);
  if (!manifest.ok()) {
    err << manifest.status().message() << "\n";
    err << "FAILED: the manifest is invalid\n";
    return kFailed;
  }
  std::vector<std::string> problems;
  size_t variants = 0;
  for (const KernelSpec& k : manifest->kernels) {
    for (const VariantSpec& v : k.variants) {
      CheckVariant(root, k, v, problems);
      ++variants;
    }
  }
  out << "offline: manifest, " << variants << " cubins (files, sha256, ELF arch, entry "
      << "symbols, parameter layouts)" << (problems.empty() ? ": OK" : "") << "\n";
  bool loaded = false;
  if (problems.empty()) {
    loaded = CheckWithDriver(o, out, problems);
    if (loaded && problems.empty()) {
      out << "driver: all " << variants << " variants loaded and checked on device 0: OK\n";
    }
  }
  for (const std::string& p : problems) err << p << "\n";
  if (!problems.empty()) {
    err << "FAILED: " << problems.size() << " problem" << (problems.size() == 1 ? "" : "s") << "\n";
    return kFailed;
  }
  out << "OK: " << root << "\n";
  return kOk;
}

}  // namespace kpack::cli
