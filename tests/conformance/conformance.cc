#include "conformance.h"

#include <algorithm>
#include <random>
#include <utility>

#include "gpu_env.h"

namespace kpack::conformance {

void ConformanceTest::SetUp() {
  const absl::Status status = GetParam().backend->SetUp();
  KPACK_SKIP_WITHOUT_GPU(status);
  set_up_ = true;
  CU_ASSERT(d().CtxGetCurrent(&primary_));
  ASSERT_NE(primary_, nullptr) << "the backend must make device 0's primary context current";
  main_ = NewStreams();
}

void ConformanceTest::TearDown() {
  if (!set_up_) return;
  Sync();
  for (CUdeviceptr p : allocations_) EXPECT_EQ(d().MemFree(p), CUDA_SUCCESS);
  for (const Streams& s : streams_) {
    for (CUstream stream : {s.stream, s.capture, s.replay}) {
      EXPECT_EQ(d().StreamDestroy(stream), CUDA_SUCCESS);
    }
  }
  GetParam().backend->TearDown();
}

Options ConformanceTest::options() const {
  Options o;
  o.driver_path = GetParam().backend->driver_path();
  return o;
}

std::unique_ptr<Runtime> ConformanceTest::Open(const std::string& dir, Options options) {
  absl::StatusOr<Runtime> rt = Runtime::Open(dir, options);
  EXPECT_TRUE(rt.ok()) << dir << ": " << rt.status();
  if (!rt.ok()) return nullptr;
  return std::make_unique<Runtime>(*std::move(rt));
}

Streams ConformanceTest::NewStreams() {
  Streams s;
  // Non-blocking: a legacy-stream operation of another thread must not wait on (and
  // invalidate) a capture. Alloc and Upload finish their legacy-stream work before they
  // return, so the kernels see the inputs anyway.
  for (CUstream* stream : {&s.stream, &s.capture, &s.replay}) {
    EXPECT_EQ(d().StreamCreate(stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  }
  streams_.push_back(s);
  return s;
}

CUstream ConformanceTest::NewStream() { return NewStreams().stream; }

void ConformanceTest::DestroyStreams(const Streams& streams) {
  for (CUstream stream : {streams.stream, streams.capture, streams.replay}) {
    EXPECT_EQ(d().StreamDestroy(stream), CUDA_SUCCESS);
  }
  std::erase_if(streams_, [&](const Streams& s) { return s.stream == streams.stream; });
}

absl::Status ConformanceTest::Run(Runtime& rt,
                                  const std::function<absl::Status(CUstream)>& launch) {
  return Run(rt, main_, launch);
}

absl::Status ConformanceTest::Run(Runtime& rt, const Streams& streams,
                                  const std::function<absl::Status(CUstream)>& launch) {
  if (!capture()) return launch(streams.stream);
  // What the API asks before a capture: everything loaded in this context, and scratch
  // reserved for the captured stream.
  if (absl::Status s = rt.Preload(); !s.ok()) return s;
  if (absl::Status s = rt.ReserveScratch(streams.capture, kCaptureScratch); !s.ok()) return s;
  // Thread-local: tests that capture on several threads at once must not forbid each
  // other's allocations. (Captures in global mode are tested on their own.)
  if (CUresult r = d().StreamBeginCapture(streams.capture, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
      r != CUDA_SUCCESS) {
    return absl::InternalError("cuStreamBeginCapture failed: " + std::to_string(r));
  }
  const absl::Status launched = launch(streams.capture);
  CUgraph graph = nullptr;
  const CUresult ended = d().StreamEndCapture(streams.capture, &graph);
  // Whatever kpack returned, the caller's capture must still be valid.
  EXPECT_EQ(ended, CUDA_SUCCESS) << "the capture was invalidated; launch: " << launched;
  if (ended != CUDA_SUCCESS) return absl::InternalError("the capture was invalidated");
  CUgraphExec exec = nullptr;
  CUresult r = d().GraphInstantiateWithFlags(&exec, graph, 0);
  if (r == CUDA_SUCCESS) r = d().GraphLaunch(exec, streams.replay);
  if (r == CUDA_SUCCESS) r = d().StreamSynchronize(streams.replay);
  EXPECT_EQ(r, CUDA_SUCCESS) << "instantiating, replaying or synchronizing the graph";
  if (exec != nullptr) EXPECT_EQ(d().GraphExecDestroy(exec), CUDA_SUCCESS);
  EXPECT_EQ(d().GraphDestroy(graph), CUDA_SUCCESS);
  return launched;
}

CUdeviceptr ConformanceTest::Alloc(size_t bytes) {
  CUdeviceptr p = 0;
  EXPECT_EQ(d().MemAlloc(&p, std::max<size_t>(bytes, 1)), CUDA_SUCCESS);
  EXPECT_EQ(d().MemsetD8(p, 0xff, bytes), CUDA_SUCCESS);
  EXPECT_EQ(d().StreamSynchronize(nullptr), CUDA_SUCCESS);  // the memset may be async
  allocations_.push_back(p);
  return p;
}

void ConformanceTest::Sync() {
  for (const Streams& s : streams_) {
    for (CUstream stream : {s.stream, s.replay}) {
      EXPECT_EQ(d().StreamSynchronize(stream), CUDA_SUCCESS);
    }
  }
  EXPECT_EQ(d().StreamSynchronize(CU_STREAM_PER_THREAD), CUDA_SUCCESS);
  EXPECT_EQ(d().StreamSynchronize(nullptr), CUDA_SUCCESS);
}

std::vector<float> ConformanceTest::RandomFloats(size_t n, uint32_t seed, float lo, float hi) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

}  // namespace kpack::conformance
