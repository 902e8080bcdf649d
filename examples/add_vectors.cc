// README.md, "Using it"; the example in include/kpack/runtime.h is a part of it.
#include "examples.h"

#include <kpack/kpack.h>

// out[i] = x[i] + y[i] for i < n, with the `add` kernel of the pack in `dir` (x, y, out:
// device buffers of n floats; stream: a stream of the calling thread's current context).
absl::Status AddVectors(std::string_view dir, CUstream stream, CUdeviceptr x, CUdeviceptr y,
                        CUdeviceptr out, int n) {
  // Open reads and checks the whole pack: a real program opens once and keeps rt and add.
  absl::StatusOr<kpack::Runtime> rt = kpack::Runtime::Open(dir);
  if (!rt.ok()) return rt.status();                     // UNAVAILABLE without a driver, ...
  absl::StatusOr<kpack::Kernel> add = rt->Find("add");  // resolve the name once
  if (!add.ok()) return add.status();
  // Call parameters in declaration order, constexprs omitted; checked against the types.
  const kpack::Grid grid{static_cast<uint32_t>((n + 1023) / 1024)};
  return add->Launch(grid, stream, x, y, out, n);
}
