// Reading a whole pack: the one code path behind kpack::Pack::Read, Pack::Verify and
// Runtime::Open. It makes every check that needs no device: the manifest, every cubin
// (files, sha256, ELF against the manifest), every variant's grid expressions compiled and
// every kernel's dispatch table built. What it builds for the launch path (the dispatch
// tables, the compiled grids, the cubin bytes) is handed to the Runtime, so Open does not
// repeat any of it.

#ifndef KPACK_SRC_PACK_PACK_STATE_H_
#define KPACK_SRC_PACK_PACK_STATE_H_

#include <array>
#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "dispatch/dispatch.h"
#include "dispatch/grid_expr.h"
#include "kpack/pack.h"
#include "manifest/manifest.h"

namespace kpack::internal {

// What a kpack::Pack shares between its copies (and a Runtime with its Pack): the parsed
// manifest and its public description. Immutable once built.
struct PackState {
  std::string dir;  // canonical absolute path of the pack directory
  ManifestSpec manifest;
  std::vector<KernelInfo> kernels;  // parallel to manifest.kernels
};

// What Open keeps beyond the description, per kernel.
struct VariantTables {
  std::vector<std::byte> cubin;  // the checked image (empty unless asked to keep it)
  std::array<GridExpr, 3> grid;  // the kernel's grid expressions for this variant (x, y, z)
};
struct KernelTables {
  DispatchTable dispatch;
  std::vector<VariantTables> variants;  // parallel to KernelSpec::variants
};

struct ReadPackResult {
  std::shared_ptr<PackState> state;
  std::vector<KernelTables> tables;  // parallel to state->manifest.kernels
};

struct ReadPackOptions {
  // Keep every cubin's bytes in the result (for the driver); else each is dropped once
  // checked.
  bool keep_cubins = false;
  // Null: stop at the first problem and return it. Else append every problem (each as
  // the status that stopping would have returned) and go on past a variant's or a
  // kernel's problem; the result is then complete only if nothing was appended. A
  // manifest that does not parse is returned as the error either way.
  std::vector<absl::Status>* problems = nullptr;
  // Threads for the per-kernel and per-variant work; 0: as many as help (ThreadsFor).
  unsigned threads = 0;
};

absl::StatusOr<ReadPackResult> ReadPack(absl::string_view dir, const ReadPackOptions& options);

// The public description of a validated kernel.
KernelInfo DescribeKernel(const KernelSpec& kernel);

// The Pack handle around a state (the runtime makes one from what it opened).
struct PackAccess {
  static Pack Make(std::shared_ptr<const PackState> state) { return Pack(std::move(state)); }
  static const PackState& State(const Pack& pack) { return *pack.state_; }
};

}  // namespace kpack::internal

#endif  // KPACK_SRC_PACK_PACK_STATE_H_
