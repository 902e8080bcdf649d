#include "graph/bucket_graph.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/launch.h"
#include "util/status_macros.h"

namespace kpack::internal {
namespace {

// Where the measuring pass pretends scratch lives: aligned to any alignment a pack may
// ask (4096), and far from real addresses. Replaced by the graph's buffer afterwards.
constexpr CUdeviceptr kMeasureBase = CUdeviceptr{1} << 44;

// A ScratchAllocator laying out one node's scratch kinds one after another from offset
// 0 at their alignments (FillScratch asks global, then profile); `end` keeps the most any
// node needs. The nodes run one after another, so they all share one buffer.
struct ScratchLayout {
  uint64_t offset = 0;
  uint64_t end = 0;
  static CUdeviceptr Allocate(size_t bytes, size_t align, CUstream, void* self) {
    auto* l = static_cast<ScratchLayout*>(self);
    l->offset = (l->offset + align - 1) / align * align;
    const CUdeviceptr p = kMeasureBase + l->offset;
    l->offset += bytes;
    l->end = std::max(l->end, l->offset);
    return p;
  }
};

std::string LaunchName(size_t i, const VariantData& v) {
  return absl::StrCat("step graph launch ", i, " (", Describe(v), ")");
}

}  // namespace

absl::StatusOr<std::unique_ptr<BucketGraph>> BucketGraph::Build(
    const RuntimeImpl& rt, std::span<BoundState* const> launches, const Signature& signature,
    uint64_t context) {
  const auto start = std::chrono::steady_clock::now();
  const Driver& d = rt.driver();
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
    layout.offset = 0;
    absl::Status s = rt.Prepare(*st.variant, signature[i].grid, nullptr, &measure,
                                node.bytes.data(), &prepared[i]);
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
    KPACK_RETURN_IF_ERROR(d.Check(
        d.GraphAddKernelNode(&node.handle, g->graph_, previous == nullptr ? nullptr : &previous,
                             previous == nullptr ? 0 : 1, &params),
        absl::StrCat("cuGraphAddKernelNode for ", LaunchName(node.launch, v))));
    for (unsigned a = 0; a < p.config.numAttrs; ++a) {
      const CUlaunchAttribute& attr = p.config.attrs[a];
      // In a graph, programmatic serialization is a kind of edge; a full edge (the one
      // above) is correct, only without the overlap.
      if (attr.id == CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION) continue;
      KPACK_RETURN_IF_ERROR(d.Check(
          d.GraphKernelNodeSetAttribute(node.handle, attr.id, &attr.value),
          absl::StrCat("cuGraphKernelNodeSetAttribute (attribute ", attr.id, ") for ",
                       LaunchName(node.launch, v))));
    }
    previous = node.handle;
  }
  KPACK_RETURN_IF_ERROR(d.Check(d.GraphInstantiateWithFlags(&g->exec_, g->graph_, 0),
                                absl::StrCat("cuGraphInstantiateWithFlags for a step graph of ",
                                             g->nodes_.size(), " nodes")));
  g->build_us_ =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
  return g;
}

BucketGraph::~BucketGraph() {
  if (exec_ != nullptr) driver_.GraphExecDestroy(exec_);
  if (graph_ != nullptr) driver_.GraphDestroy(graph_);
}

absl::Status BucketGraph::Patch(std::span<BoundState* const> launches, uint64_t* patched) {
  *patched = 0;
  for (Node& node : nodes_) {
    const BoundState& st = *launches[node.launch];
    const std::byte* current = st.buf;
    if (node.num_scratch != 0) {  // the node's own scratch pointers, not the launch's
      std::memcpy(staging_, st.buf, node.param_bytes);
      for (int k = 0; k < node.num_scratch; ++k) {
        std::memcpy(staging_ + node.scratch[k].first, &node.scratch[k].second, 8);
      }
      current = staging_;
    }
    if (std::memcmp(current, node.bytes.data(), node.param_bytes) == 0) continue;
    size_t size = node.param_bytes;
    void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, const_cast<std::byte*>(current),
                     CU_LAUNCH_PARAM_BUFFER_SIZE, &size, CU_LAUNCH_PARAM_END};
    node.params.extra = extra;
    const CUresult r = driver_.GraphExecKernelNodeSetParams(exec_, node.handle, &node.params);
    node.params.extra = nullptr;
    if (ABSL_PREDICT_FALSE(r != CUDA_SUCCESS)) {
      return driver_.Error(r, absl::StrCat("cuGraphExecKernelNodeSetParams for ",
                                           LaunchName(node.launch, *st.variant)));
    }
    std::memcpy(node.bytes.data(), current, node.param_bytes);
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
