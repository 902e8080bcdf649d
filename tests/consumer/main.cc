// Opens a pack through the installed kpack. With no driver it must say so (UNAVAILABLE);
// with one it must find the kernel. Exit 0 only for one of those two outcomes.
#include <cstdio>

#include "kpack/kpack.h"

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  absl::StatusOr<kpack::Runtime> rt = kpack::Runtime::Open(argv[1]);
  if (!rt.ok()) {
    std::printf("%s\n", rt.status().ToString().c_str());
    return rt.status().code() == absl::StatusCode::kUnavailable ? 0 : 1;
  }
  absl::StatusOr<kpack::Kernel> add = rt->Find("add");
  std::printf("kernel add: %s, %zu args\n", add.ok() ? "found" : "missing",
              add.ok() ? add->num_args() : 0);
  return add.ok() && add->num_args() == 4 ? 0 : 1;
}
