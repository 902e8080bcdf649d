#include "graph/bucket_graph.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/launch.h"
#include "util/bytes.h"
#include "util/status_macros.h"

namespace kpack::internal {
namespace {

// Where the measuring pass pretends scratch lives: aligned to any alignment a pack may
// ask (4096), and far from real addresses. Replaced by the graph's buffer afterwards.
constexpr CUdeviceptr kMeasureBase = CUdeviceptr{1} << 44;

// A ScratchAllocator laying out one node's scratch kinds one after another from offset
// 0 at their alignments (FillScratch asks global, then profile); `end` keeps the most any
// node needs. The nodes run one after another, so they all share one buffer.
// A layout past kMaxEnd (more than any device holds) is refused as an allocator refuses,
// with a null pointer (`refused` says why), so the offsets never wrap.
struct ScratchLayout {
  static constexpr uint64_t kMaxEnd = uint64_t{1} << 62;
  uint64_t offset = 0;
  uint64_t end = 0;
  bool refused = false;
  static CUdeviceptr Allocate(size_t bytes, size_t align, CUstream, void* self) {
    auto* l = static_cast<ScratchLayout*>(self);
    const uint64_t start = (l->offset + align - 1) / align * align;  // offset <= kMaxEnd
    if (bytes > kMaxEnd || start > kMaxEnd - bytes) {
      l->refused = true;
      return 0;
    }
    l->offset = start;
    const CUdeviceptr p = kMeasureBase + l->offset;
    l->offset += bytes;
    l->end = std::max(l->end, l->offset);
    return p;
  }
};

std::string LaunchName(size_t i, const VariantData& v) {
  return absl::StrCat("step graph launch ", i, " (", Describe(v), ")");
}

// Whether a launch of this config is a PDL launch (Triton's launch_pdl): it may start
// while the kernel before it finishes, and waits for it in its code (gdc_wait).
bool IsPdl(const CUlaunchConfig& config) {
  for (unsigned a = 0; a < config.numAttrs; ++a) {
    if (config.attrs[a].id == CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION &&
        config.attrs[a].value.programmaticStreamSerializationAllowed != 0) {
      return true;
    }
  }
  return false;
}

}  // namespace

absl::StatusOr<std::unique_ptr<BucketGraph>> BucketGraph::Build(
    const RuntimeImpl& rt, std::span<BoundState* const> launches, const Signature& signature,
    uint64_t context, CUstream stream, bool programmatic_edges, bool* pdl_refused) {
  const auto start = std::chrono::steady_clock::now();
  const Driver& d = rt.driver();
  // Loaded here rather than by Prepare, whose capture check asks about the stream: the
  // caller vouched that its stream is not captured, and another stream's capture does not
  // concern a load made in RELAXED mode.
  for (size_t i = 0; i < launches.size(); ++i) {
    if (signature[i].empty()) continue;
    absl::StatusOr<CUfunction> loaded = rt.Load(*launches[i]->variant);
    if (!loaded.ok()) {
      return absl::Status(loaded.status().code(),
                          absl::StrCat(LaunchName(i, *launches[i]->variant), ": ",
                                       loaded.status().message()));
    }
  }
  std::unique_ptr<BucketGraph> g(new BucketGraph(d));
  g->signature_ = signature;
  KPACK_RETURN_IF_ERROR(d.Check(d.GraphCreate(&g->graph_, 0), "cuGraphCreate for a step graph"));

  // Each node's function, config and bytes, with scratch laid out from kMeasureBase.
  std::vector<RuntimeImpl::DriverLaunch> prepared(launches.size());
  ScratchLayout layout;
  const ScratchAllocator measure{&ScratchLayout::Allocate, &layout};
  for (size_t i = 0; i < launches.size(); ++i) {
    if (signature[i].empty()) continue;
    const BoundState& st = *launches[i];
    Node node;
    node.launch = i;
    node.param_bytes = st.variant->param_bytes;
    node.bytes.assign(st.buf, st.buf + node.param_bytes);
    node.version = st.version;
    layout.offset = 0;
    absl::Status s = rt.Prepare(*st.variant, signature[i].grid, stream, &measure,
                                node.bytes.data(), &prepared[i]);
    if (!s.ok() && layout.refused) {
      return absl::ResourceExhaustedError(
          absl::StrCat(LaunchName(i, *st.variant), ": its scratch memory for grid (",
                       signature[i].grid.x, ", ", signature[i].grid.y, ", ",
                       signature[i].grid.z, ") passes 2^62 bytes"));
    }
    if (!s.ok()) {
      return absl::Status(s.code(), absl::StrCat(LaunchName(i, *st.variant), ": ", s.message()));
    }
    const VariantData& v = *st.variant;
    for (auto [offset, size] : {std::pair{v.global_scratch_offset, v.global_scratch_size},
                                std::pair{v.profile_scratch_offset, v.profile_scratch_size}}) {
      if (offset < 0 || size == 0) continue;
      CUdeviceptr value;
      std::memcpy(&value, node.bytes.data() + offset, 8);
      if (value != 0) node.scratch[node.num_scratch++] = {static_cast<uint32_t>(offset), value};
    }
    g->nodes_.push_back(std::move(node));
  }

  if (layout.end > 0) {
    KPACK_ASSIGN_OR_RETURN(const CUdeviceptr base,
                           rt.scratch().ForGraph(g->graph_, context, layout.end));
    g->scratch_bytes_ = layout.end;
    for (Node& node : g->nodes_) {
      for (int k = 0; k < node.num_scratch; ++k) {
        auto& [offset, value] = node.scratch[k];
        value = base + (value - kMeasureBase);
        std::memcpy(node.bytes.data() + offset, &value, 8);
      }
    }
  }

  CUgraphNode previous = nullptr;
  for (Node& node : g->nodes_) {
    const RuntimeImpl::DriverLaunch& p = prepared[node.launch];
    const VariantData& v = *launches[node.launch]->variant;
    node.params.func = p.function;
    node.params.gridDimX = p.config.gridDimX;
    node.params.gridDimY = p.config.gridDimY;
    node.params.gridDimZ = p.config.gridDimZ;
    node.params.blockDimX = p.config.blockDimX;
    node.params.blockDimY = p.config.blockDimY;
    node.params.blockDimZ = p.config.blockDimZ;
    node.params.sharedMemBytes = p.config.sharedMemBytes;
    size_t size = node.param_bytes;
    void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, node.bytes.data(),
                     CU_LAUNCH_PARAM_BUFFER_SIZE, &size, CU_LAUNCH_PARAM_END};
    CUDA_KERNEL_NODE_PARAMS_v2 params = node.params;
    params.extra = size != 0 ? extra : nullptr;
    // A PDL launch after another node: a programmatic edge, added below (the stream
    // launch's programmatic serialization is, in a graph, the edge's type, as the CUDA
    // programming guide maps it: from the PROGRAMMATIC port, which fires when every block
    // of the node before has called gdc_launch_dependents or exited). Else a full edge.
    const bool pdl = programmatic_edges && previous != nullptr && IsPdl(p.config);
    const bool full = previous != nullptr && !pdl;
    KPACK_RETURN_IF_ERROR(d.Check(
        d.GraphAddKernelNode(&node.handle, g->graph_, full ? &previous : nullptr, full ? 1 : 0,
                             &params),
        absl::StrCat("cuGraphAddKernelNode for ", LaunchName(node.launch, v))));
    if (pdl) {
      CUgraphEdgeData edge{};
      edge.from_port = CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC;
      edge.type = CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC;
      KPACK_RETURN_IF_ERROR(d.Check(
          d.GraphAddDependencies(g->graph_, &previous, &node.handle, &edge, 1),
          absl::StrCat("cuGraphAddDependencies (a programmatic edge) for ",
                       LaunchName(node.launch, v))));
      ++g->programmatic_edges_;
    }
    for (unsigned a = 0; a < p.config.numAttrs; ++a) {
      const CUlaunchAttribute& attr = p.config.attrs[a];
      // A launch attribute only; in a graph it is the edge's type (above).
      if (attr.id == CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION) continue;
      KPACK_RETURN_IF_ERROR(d.Check(
          d.GraphKernelNodeSetAttribute(node.handle, attr.id, &attr.value),
          absl::StrCat("cuGraphKernelNodeSetAttribute (attribute ", attr.id, ") for ",
                       LaunchName(node.launch, v))));
    }
    previous = node.handle;
  }
  if (const CUresult r = d.GraphInstantiateWithFlags(&g->exec_, g->graph_, 0);
      r != CUDA_SUCCESS) {
    g->exec_ = nullptr;
    if (pdl_refused != nullptr) *pdl_refused = g->programmatic_edges_ > 0 && MayRefusePdl(r);
    return d.Error(r, absl::StrCat("cuGraphInstantiateWithFlags for a step graph of ",
                                   g->nodes_.size(), " nodes (", g->programmatic_edges_,
                                   " programmatic edges)"));
  }
  g->build_us_ =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
  return g;
}

BucketGraph::~BucketGraph() {
  RelaxedCaptureMode relaxed(driver_);
  if (exec_ != nullptr) driver_.GraphExecDestroy(exec_);
  if (graph_ != nullptr) driver_.GraphDestroy(graph_);
}

bool MayRefusePdl(CUresult r) {
  return r == CUDA_ERROR_NOT_SUPPORTED || r == CUDA_ERROR_INVALID_VALUE ||
         r == CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE;
}

absl::Status BucketGraph::Patch(std::span<BoundState* const> launches, uint64_t* patched,
                                bool* pdl_refused) {
  *patched = 0;
  for (Node& node : nodes_) {
    const BoundState& st = *launches[node.launch];
    if (st.version == node.version) continue;
    const std::byte* current = st.buf;
    if (node.num_scratch != 0) {  // the node's own scratch pointers, not the launch's
      std::memcpy(staging_, st.buf, node.param_bytes);
      for (int k = 0; k < node.num_scratch; ++k) {
        CopyBytes<8>(staging_ + node.scratch[k].first, &node.scratch[k].second);
      }
      current = staging_;
    }
    if (std::memcmp(current, node.bytes.data(), node.param_bytes) == 0) {
      node.version = st.version;
      continue;
    }
    size_t size = node.param_bytes;
    void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, const_cast<std::byte*>(current),
                     CU_LAUNCH_PARAM_BUFFER_SIZE, &size, CU_LAUNCH_PARAM_END};
    node.params.extra = extra;
    const CUresult r = driver_.GraphExecKernelNodeSetParams(exec_, node.handle, &node.params);
    node.params.extra = nullptr;
    if (ABSL_PREDICT_FALSE(r != CUDA_SUCCESS)) {
      if (pdl_refused != nullptr) *pdl_refused = programmatic_edges_ > 0 && MayRefusePdl(r);
      return driver_.Error(r, absl::StrCat("cuGraphExecKernelNodeSetParams for ",
                                           LaunchName(node.launch, *st.variant)));
    }
    std::memcpy(node.bytes.data(), current, node.param_bytes);
    node.version = st.version;
    ++*patched;
  }
  return absl::OkStatus();
}

absl::Status BucketGraph::Launch(CUstream stream) {
  const CUresult r = driver_.GraphLaunch(exec_, stream);
  if (ABSL_PREDICT_FALSE(r != CUDA_SUCCESS)) {
    return driver_.Error(r, absl::StrCat("cuGraphLaunch of a step graph of ", nodes_.size(),
                                         " nodes"));
  }
  ++replays_;
  return absl::OkStatus();
}

}  // namespace kpack::internal
