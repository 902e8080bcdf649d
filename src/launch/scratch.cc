#include "launch/scratch.h"

#include "absl/strings/str_cat.h"
#include "driver/capture_mode.h"
#include "util/status_macros.h"

namespace kpack::internal {

ScratchArenas::ScratchArenas(const Driver& driver)
    : driver_(driver),
      pool_(driver),
      streams_(pool_),
      graphs_(driver, pool_),
      thread_exits_(&ScratchArenas::OnThreadExit, this) {}

// No exit callback may reach the members once their destruction starts.
ScratchArenas::~ScratchArenas() { thread_exits_.Close(); }

absl::StatusOr<CUdeviceptr> ScratchArenas::Get(CUstream stream, uint64_t context, uint64_t bytes) {
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  cuuint64_t capture = 0;
  CUgraph graph = nullptr;
  CUresult r =
      driver_.StreamGetCaptureInfo(stream, &status, &capture, &graph, nullptr, nullptr, nullptr);
  if (r != CUDA_SUCCESS) return driver_.Error(r, "cuStreamGetCaptureInfo for scratch memory");
  if (status == CU_STREAM_CAPTURE_STATUS_ACTIVE) {
    return graphs_.ForCapture(CaptureKeyOf(stream, context), capture, graph, bytes);
  }
  if (status != CU_STREAM_CAPTURE_STATUS_NONE) {
    return absl::FailedPreconditionError(
        "the stream's capture has been invalidated; nothing is launched into it");
  }
  KPACK_ASSIGN_OR_RETURN(const StreamKey key, KeyOf(driver_, stream, context));
  const auto [aligned, size] = streams_.Find(key);
  if (aligned != 0 && size >= bytes) return aligned;
  return Grow(stream, key, bytes);
}

absl::StatusOr<CUdeviceptr> ScratchArenas::Grow(CUstream stream, const StreamKey& key,
                                                uint64_t bytes) {
  CUcontext current = nullptr;
  KPACK_RETURN_IF_ERROR(driver_.Check(driver_.CtxGetCurrent(&current), "cuCtxGetCurrent"));
  WatchThread(key);
  return streams_.Grow(stream, current, key, bytes);
}

absl::StatusOr<CUdeviceptr> ScratchArenas::ForGraph(CUgraph graph, uint64_t context, uint64_t bytes,
                                                    CUuserObject* object) {
  CUcontext current = nullptr;
  KPACK_RETURN_IF_ERROR(driver_.Check(driver_.CtxGetCurrent(&current), "cuCtxGetCurrent"));
  return graphs_.ForGraph(graph, current, context, bytes, object);
}

absl::StatusOr<std::pair<CUcontext, StreamKey>> ScratchArenas::OutsideCapture(
    CUstream stream, absl::string_view call) const {
  CUcontext context = nullptr;
  KPACK_RETURN_IF_ERROR(driver_.Check(driver_.StreamGetCtx(stream, &context), "cuStreamGetCtx"));
  unsigned long long context_id = 0;  // NOLINT(runtime/int)
  KPACK_RETURN_IF_ERROR(driver_.Check(driver_.CtxGetId(context, &context_id), "cuCtxGetId"));
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  KPACK_RETURN_IF_ERROR(driver_.Check(
      driver_.StreamGetCaptureInfo(stream, &status, nullptr, nullptr, nullptr, nullptr, nullptr),
      "cuStreamGetCaptureInfo"));
  if (status != CU_STREAM_CAPTURE_STATUS_NONE) {
    return absl::FailedPreconditionError(
        absl::StrCat(call,
                     " on a stream that is being captured: call it before cuStreamBeginCapture or "
                     "after cuStreamEndCapture (kpack never allocates or frees during a capture)"));
  }
  KPACK_ASSIGN_OR_RETURN(const StreamKey key, KeyOf(driver_, stream, context_id));
  return std::pair{context, key};
}

absl::Status ScratchArenas::Reserve(CUstream stream, uint64_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  KPACK_ASSIGN_OR_RETURN(const auto context_and_key, OutsideCapture(stream, "ReserveScratch"));
  const auto& [context, key] = context_and_key;
  WatchThread(key);
  // The stream's own arena...
  const auto [aligned, size] = streams_.Find(key);
  if (aligned == 0 || size < bytes) {
    KPACK_RETURN_IF_ERROR(streams_.Grow(stream, context, key, bytes).status());
  }
  // ...and one for the next capture on it.
  return graphs_.Reserve(context, key, CaptureKeyOf(stream, key.context), bytes);
}

absl::Status ScratchArenas::Release(CUstream stream) {
  KPACK_ASSIGN_OR_RETURN(const auto context_and_key, OutsideCapture(stream, "ReleaseScratch"));
  streams_.Release(context_and_key.second);
  graphs_.Release(context_and_key.second);
  return absl::OkStatus();
}

void ScratchArenas::WatchThread(const StreamKey& key) {
  if (key.kind == StreamKey::kPerThread) thread_exits_.Watch();
}

void ScratchArenas::OnThreadExit(void* self, uint64_t token) {
  auto* arenas = static_cast<ScratchArenas*>(self);
  // Nobody asked for these frees, so they must not disturb a capture another thread runs
  // in global mode (an unsafe call from a thread in the default global interaction mode
  // is refused, and documented to invalidate it): they run in relaxed mode, which is safe
  // since no capture uses a thread's per-thread arenas or reservation. Should the exchange
  // fail, a free that the driver then refuses is kept for the Runtime's destruction.
  RelaxedCaptureMode relaxed(arenas->driver_);
  arenas->streams_.ReleaseThread(token);
  arenas->graphs_.ReleaseThread(token);
}

ScratchArenas::Stats ScratchArenas::stats() const {
  const StreamArenas::Stats streams = streams_.stats();
  const GraphArenas::Stats graphs = graphs_.stats();
  const ArenaPool::Stats pool = pool_.stats();
  Stats stats;
  stats.stream_arenas = streams.arenas;
  stats.reserved = graphs.reserved;
  stats.in_graphs = pool.lent;
  stats.idle = pool.idle;
  stats.bytes = streams.bytes + graphs.bytes + pool.bytes;
  return stats;
}

}  // namespace kpack::internal
