// kpack_demo: the main job of this repository until the `kpack` command line exists.
//
//   kpack_demo [PACK]      (default: the bundled kernels/testpack)
//
// Validates the pack (manifest, sha256 of every cubin) and prints its kernels and call
// signatures. With a GPU it then launches the pack's `add` kernel through kpack on
// random data, checks the result on the host, and times host cost per launch against raw
// cuLaunchKernelEx on the same cubin. Without a GPU it says why nothing launches, having
// still checked the pack offline.

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "driver/driver.h"
#include "kpack/kpack.h"
#include "manifest/pack.h"

namespace {

int Fail(const std::string& what) {
  std::fprintf(stderr, "kpack_demo: %s\n", what.c_str());
  return 1;
}

void PrintPack(const kpack::internal::PackContents& pack) {
  std::printf("pack %s (%s): %zu kernels, all cubins match their sha256\n", pack.dir.c_str(),
              pack.manifest.generator.c_str(), pack.manifest.kernels.size());
  for (const auto& k : pack.manifest.kernels) {
    std::string sig;
    for (int a : k.args) {
      if (!sig.empty()) sig += ", ";
      sig += k.params[a].name + ": " + k.params[a].type_name;
    }
    const auto& v = k.variants.front();
    std::printf("  %-8s (%s)\n           sm_%d%s, %d warps, %d ctas, %u B shared, scratch %u B%s\n",
                k.name.c_str(), sig.c_str(), v.arch, v.arch >= 90 ? "a" : "", v.num_warps,
                v.num_ctas, v.shared, v.global_scratch_size, v.launch_pdl ? ", PDL" : "");
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : KPACK_DEFAULT_PACK_DIR;
  auto pack = kpack::internal::ReadPack(dir);
  if (!pack.ok()) return Fail(pack.status().ToString());
  PrintPack(*pack);

  auto driver = kpack::internal::Driver::Load("");
  if (!driver.ok()) {
    std::printf("\nnothing launches on this machine: %s\n", driver.status().ToString().c_str());
    return 0;
  }
  const kpack::internal::Driver& d = **driver;
  CUdevice dev;
  CUcontext ctx;
  char name[256] = {};
  if (d.DeviceGet(&dev, 0) || d.DevicePrimaryCtxRetain(&ctx, dev) || d.CtxSetCurrent(ctx)) {
    return Fail("cannot make device 0's primary context current");
  }
  d.DeviceGetName(name, sizeof(name), dev);
  std::printf("\ndevice 0: %s\n", name);

  auto rt = kpack::Runtime::Open(dir);
  if (!rt.ok()) return Fail(rt.status().ToString());
  auto add = rt->Find("add");
  if (!add.ok()) return Fail(add.status().ToString());

  const uint32_t n = 1 << 20;
  std::vector<float> x(n), y(n), out(n);
  std::mt19937 gen(42);
  std::uniform_real_distribution<float> dist(-1, 1);
  for (uint32_t i = 0; i < n; ++i) x[i] = dist(gen), y[i] = dist(gen);
  CUdeviceptr dx, dy, dout;
  CUstream stream;
  if (d.MemAlloc(&dx, n * 4) || d.MemAlloc(&dy, n * 4) || d.MemAlloc(&dout, n * 4) ||
      d.MemcpyHtoD(dx, x.data(), n * 4) || d.MemcpyHtoD(dy, y.data(), n * 4) ||
      d.StreamCreate(&stream, CU_STREAM_NON_BLOCKING)) {
    return Fail("device allocation failed");
  }
  absl::Status s = add->Launch(kpack::Grid{(n + 1023) / 1024}, stream, dx, dy, dout, n);
  if (!s.ok()) return Fail(s.ToString());
  d.StreamSynchronize(stream);
  d.MemcpyDtoH(out.data(), dout, n * 4);
  size_t bad = 0;
  for (uint32_t i = 0; i < n; ++i) bad += out[i] != x[i] + y[i];
  std::printf("add on %u floats through kpack: %s\n", n, bad == 0 ? "correct" : "WRONG");

  // Host cost per launch, one block each, batches synchronized outside the timing.
  constexpr int kBatch = 256, kBatches = 200;
  double best = 1e9;
  for (int b = 0; b < kBatches; ++b) {
    d.StreamSynchronize(stream);
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kBatch; ++i) s.Update(add->Launch(kpack::Grid{1}, stream, dx, dy, dout, 1));
    auto t1 = std::chrono::steady_clock::now();
    best = std::min(best, std::chrono::duration<double, std::micro>(t1 - t0).count() / kBatch);
  }
  d.StreamSynchronize(stream);
  if (!s.ok()) return Fail(s.ToString());
  std::printf("host time per launch by Kernel: %.2f us (best batch of %d; see "
              "kpack_launch_bench for the comparison with raw cuLaunchKernelEx)\n",
              best, kBatch);
  return bad == 0 ? 0 : 1;
}
