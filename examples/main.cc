// `app PACK_DIR`: describes the pack with no driver (kpack::Pack: kernels and their
// variant counts), then opens it through the installed kpack and lists its kernels with
// their argument counts (exit 0). Without a CUDA driver Open is UNAVAILABLE, the
// documented answer there: app prints it and exits 0 too. Any other error exits 1.
// The README's examples (add_vectors.cc, matmul.cc) need device memory to run; building
// this project compiles them and links them (object files are linked whole) against the
// installed package.
#include <cstdio>
#include <string>

#include <kpack/kpack.h>

#include "examples.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s PACK_DIR\n", argv[0]);
    return 2;
  }
  if (absl::Status described = DescribePack(argv[1]); !described.ok()) {
    std::printf("%s\n", described.ToString().c_str());
    return 1;
  }
  absl::StatusOr<kpack::Runtime> rt = kpack::Runtime::Open(argv[1]);
  if (!rt.ok()) {
    std::printf("%s\n", rt.status().ToString().c_str());
    return rt.status().code() == absl::StatusCode::kUnavailable ? 0 : 1;
  }
  for (const std::string& name : rt->kernel_names()) {
    absl::StatusOr<kpack::Kernel> k = rt->Find(name);
    if (!k.ok()) {
      std::printf("%s\n", k.status().ToString().c_str());
      return 1;
    }
    std::printf("%s: %zu args\n", name.c_str(), k->num_args());
    if (name.starts_with("matmul")) PrintVariantStats(*k);
  }
  return 0;
}
