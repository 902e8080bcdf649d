// A model-based test of kpack's whole public API against the recording fake driver.
//
// Each seed drives long random sequences of operations -- open packs, find kernels, bind,
// set arguments (valid and invalid), launch eagerly (by name, by Kernel, BoundLaunch,
// Prepare), begin and end stream captures (global, thread-local, relaxed) and instantiate,
// launch and destroy the captured graphs, build and replay StepGraphs on several streams
// and threads (also inside a caller's capture), reserve and release scratch, create and
// destroy streams and threads (CU_STREAM_PER_THREAD from short-lived threads, threads
// with no context, concurrent bursts), destroy graphs and runtimes in random order --
// with driver faults injected at random (fake::FailNext) into the calls kpack makes. The
// operations run on worker threads, one at a time (a burst runs several at once), so a
// seed replays exactly. After every operation the model checks:
//
//  - every error is a clean absl::Status (a message, no exception) with a code the header
//    documents for that call, or the code of the injected driver fault; calls the headers
//    promise to succeed did;
//  - no capture was invalidated (the fake holds each capture's status), and no operation
//    on a capturing stream allocated, freed or loaded anything ("during a capture kpack
//    never loads a kernel and never allocates");
//  - a failed launch or replay launched nothing, a successful one exactly its launches (a
//    StepGraph replay one node per launch with a non-empty grid, as eagerly);
//  - scratch: every launch's scratch pointer (read from the parameter bytes the fake
//    recorded) lies in a live allocation, and no allocation serves two owners at once (a
//    stream's arena, a capture or captured graph, a StepGraph), except a graph a caller
//    captured around a StepGraph replay, which borrows the StepGraph's; each runtime's
//    Stats count at least as many arenas in graphs as the live graphs use, and a released
//    stream's or an exited thread's arenas are freed;
//  - nothing leaks: the fake's live graphs and executables are the model's plus two per
//    StepGraph graph, live user objects at most the arenas kpack counts in graphs, and
//    with no runtime and no graph left no allocation, library or user object remains;
//  - the kernels the fake emulates computed what the oracle (oracle.h) computes, byte for
//    byte, over every buffer.
//
// On failure it prints the seed, the failed check and the operation trace; `--seed N`
// replays it. Usage: kpack_model_test [--seed N | --seeds A-B] [--ops N] [--verbose].

#include <cuda.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "driver/driver.h"
#include "emulators.h"
#include "fake_driver.h"
#include "kpack/kpack.h"
#include "oracle.h"
#include "unit/fake_runtime.h"

// Under a sanitizer, its report ends the process: print the trace then too.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define KPACK_MODEL_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define KPACK_MODEL_SANITIZER 1
#endif
#endif
#ifdef KPACK_MODEL_SANITIZER
#include <sanitizer/common_interface_defs.h>
#endif

namespace kpack::model {
namespace {

using absl::StatusCode;

const internal::Driver& D() { return testing::FakeDriver(); }

// The model's own instantiation and destruction of executables: calls a capture in
// global mode forbids to other threads in the default interaction mode, so made in
// RELAXED mode, as the driver provides for work that is not captured.
CUresult Relaxed(const std::function<CUresult()>& call) {
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
  if (D().ThreadExchangeStreamCaptureMode(&mode) != CUDA_SUCCESS) return CUDA_ERROR_UNKNOWN;
  const CUresult r = call();
  D().ThreadExchangeStreamCaptureMode(&mode);
  return r;
}

// Checks turned off by --skip (to look past a known hole while exploring; CI skips none).
std::set<std::string>& Skipped() {
  static std::set<std::string> skipped;
  return skipped;
}
bool Skip(const char* check) { return Skipped().contains(check); }

// A failed check: the message, thrown to the seed's loop (on the main thread only).
struct Failure {
  std::string what;
};

[[noreturn]] void Fail(std::string what) { throw Failure{std::move(what)}; }

std::string Hex(uint64_t v) {
  char text[32];
  std::snprintf(text, sizeof(text), "0x%llx", static_cast<unsigned long long>(v));  // NOLINT
  return text;
}

// ---------------------------------------------------------------------------------------
// Worker threads. Each makes device 0's primary context current and then runs the tasks
// it is given, one at a time, while the main thread waits: the operations run on several
// threads (contexts, per-thread streams, capture modes are per thread) in a fixed order.

class Worker {
 public:
  explicit Worker(int id) : id_(id), thread_([this] { Loop(); }) {}
  ~Worker() { Stop(); }
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  int id() const { return id_; }

  // Runs `fn` on this thread and waits for it. An exception escaping `fn` (from kpack:
  // none may) comes back as a failure.
  void Run(const std::function<void()>& fn) {
    std::unique_lock<std::mutex> lock(mu_);
    task_ = &fn;
    error_.clear();
    cv_.notify_all();
    cv_.wait(lock, [this] { return task_ == nullptr; });
    if (!error_.empty()) Fail(error_);
  }
  // Starts `fn` without waiting (a burst); Wait() collects it.
  void Start(const std::function<void()>& fn) {
    std::lock_guard<std::mutex> lock(mu_);
    task_ = &fn;
    error_.clear();
    cv_.notify_all();
  }
  void Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return task_ == nullptr; });
    if (!error_.empty()) Fail(error_);
  }
  void Stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
      cv_.notify_all();
    }
    if (thread_.joinable()) thread_.join();
  }

 private:
  void Loop() {
    testing::UsePrimaryContext(0);
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      cv_.wait(lock, [this] { return stop_ || task_ != nullptr; });
      if (task_ == nullptr) return;
      const std::function<void()>* task = task_;
      lock.unlock();
      std::string error;
      try {
        (*task)();
      } catch (const Failure& f) {
        error = f.what;
      } catch (const std::exception& e) {
        error = absl::StrCat("an exception escaped: ", e.what());
      } catch (...) {
        error = "an exception escaped";
      }
      lock.lock();
      error_ = error;
      task_ = nullptr;
      cv_.notify_all();
    }
  }

  const int id_;
  std::mutex mu_;
  std::condition_variable cv_;
  const std::function<void()>* task_ = nullptr;
  std::string error_;
  bool stop_ = false;
  std::thread thread_;
};

// Runs `fn` on a fresh thread that exits afterwards: with device 0's primary context
// current, or with none.
void RunOnNewThread(bool with_context, const std::function<void()>& fn) {
  std::string error;
  std::thread t([&] {
    if (with_context) testing::UsePrimaryContext(0);
    try {
      fn();
    } catch (const Failure& f) {
      error = f.what;
    } catch (...) {
      error = "an exception escaped";
    }
  });
  t.join();
  if (!error.empty()) Fail(error);
}

// ---------------------------------------------------------------------------------------
// Driver faults: FailNext armed right before one kpack call on the calling thread, and
// whatever did not fire cancelled right after, so that no later call sees it.

// Every driver function kpack's library calls where a failure is reported (see
// tests/unit/driver_fault_test.cc's kLibrary), and the errors injected.
const std::vector<const char*>& FaultFunctions() {
  static const std::vector<const char*> fns = {
      "CtxGetCurrent", "CtxGetDevice", "CtxGetId", "CtxPushCurrent", "CtxPopCurrent",
      "DeviceGetAttribute", "LibraryLoadData", "LibraryGetKernel", "KernelGetAttribute",
      "KernelSetAttribute", "KernelGetParamInfo", "KernelGetFunction", "LaunchKernelEx",
      "MemAlloc", "MemFree", "StreamGetCtx", "StreamGetId", "StreamIsCapturing",
      "StreamGetCaptureInfo", "UserObjectCreate", "GraphRetainUserObject",
      "GraphInstantiateWithFlags", "GraphLaunch", "GraphCreate", "GraphAddKernelNode",
      "GraphKernelNodeSetAttribute", "GraphExecKernelNodeSetParams", "Init"};
  return fns;
}
const std::vector<CUresult>& FaultCodes() {
  static const std::vector<CUresult> codes = {CUDA_ERROR_OUT_OF_MEMORY, CUDA_ERROR_INVALID_VALUE,
                                              CUDA_ERROR_LAUNCH_FAILED, CUDA_ERROR_UNKNOWN,
                                              CUDA_ERROR_NOT_SUPPORTED};
  return codes;
}

// The calls a launch makes.
const std::vector<const char*>& LaunchFaults() {
  static const std::vector<const char*> fns = {
      "LaunchKernelEx", "MemAlloc", "StreamGetCaptureInfo", "StreamGetId", "CtxGetId",
      "StreamIsCapturing", "LibraryLoadData", "KernelGetFunction", "UserObjectCreate",
      "GraphRetainUserObject"};
  return fns;
}

struct Fault {
  bool armed = false;
  std::string fn;
  CUresult code = CUDA_SUCCESS;
  int skip = 0;
  bool fired = false;
  std::string Text() const {
    if (!armed) return "";
    return absl::StrCat(" [fault cu", fn, "=", static_cast<int>(code), " skip ", skip,
                        fired ? " fired]" : " unused]");
  }
};

// What a call may return.
struct Expect {
  std::set<StatusCode> allowed;  // error codes the header documents for the call
  bool must_ok = false;          // the headers promise success (unless a fault fired)
  std::optional<StatusCode> must_fail;
};

std::string CodeName(StatusCode c) { return absl::StatusCodeToString(c); }

// ---------------------------------------------------------------------------------------
// The model's objects. Ids are the model's, assigned in order, so that traces read the
// same on every run.

struct StreamRef {
  enum Kind { kReal, kNull, kLegacy, kPerThread };
  Kind kind = kNull;
  int id = -1;  // kReal: the model stream
};

struct StreamM {
  int id;
  CUstream h = nullptr;
  int capture = -1;  // the active capture on it
};

struct RuntimeM {
  int id;
  std::string pack;
  std::unique_ptr<Runtime> rt;
  bool preloaded = false;
  bool options_allocator = false;
  std::set<std::string> kernels_preloaded;
  std::map<int, Kernel> kernels;             // by index into Kernels()
  std::vector<std::pair<int, Kernel>> views;  // Restrict()ed handles, by kernel index
};

// A scratch allocator the model gives kpack (Options, launches, BoundLaunch): memory from
// a pool buffer the oracle does not compare (the scratch kernel writes there), or null.
// Thread-safe, as an Options-wide allocator must be (bursts launch from several threads).
struct UserAllocator {
  CUdeviceptr base = 0;
  uint64_t size = 0;
  std::atomic<uint64_t> next{0};
  bool fail = false;  // set before any launch, never changed
  static CUdeviceptr Allocate(size_t bytes, size_t align, CUstream, void* self) {
    auto* a = static_cast<UserAllocator*>(self);
    if (a->fail || bytes + align > a->size) return 0;
    const uint64_t start =
        a->next.fetch_add(bytes + align, std::memory_order_relaxed) % (a->size - bytes - align);
    return a->base + (start + align - 1) / align * align;
  }
};

struct BoundM {
  int id;
  int runtime;
  int kernel;  // index into Kernels()
  std::unique_ptr<BoundLaunch> b;
  std::vector<MArg> args;
  bool explicit_grid = false;
  Grid grid;
  StreamRef stream;
  int allocator = 0;  // 0: none; 1: the model's; 2: the model's, failing
};

struct CaptureM {
  int id;
  int stream;
  int thread;  // the worker that began it
  CUstreamCaptureMode mode;
  std::vector<Effect> effects;
  int nodes = 0;
  std::set<int> runtimes;          // whose launches it holds (or attempted)
  std::map<int, uint64_t> arena;   // per runtime: a lower bound of its scratch arena's size
};

struct GraphM {
  int id;
  CUgraph graph = nullptr;  // null once destroyed
  std::vector<CUgraphExec> execs;
  std::vector<Effect> effects;
  int nodes = 0;
  std::set<int> runtimes;
};

struct StepM {
  int id;
  int runtime;
  std::vector<int> bounds;
  std::unique_ptr<StepGraph> g;
  StepGraph::Unseen unseen = StepGraph::Unseen::kBuild;
  size_t max_graphs = 256;
  std::map<size_t, Grid> pins;
};

// A device allocation some launch used as scratch, and who uses it now.
struct AllocM {
  CUdeviceptr p;
  int runtime = -1;
  std::set<std::string> holders;
};

const char* ModeName(CUstreamCaptureMode m) {
  return m == CU_STREAM_CAPTURE_MODE_GLOBAL         ? "global"
         : m == CU_STREAM_CAPTURE_MODE_THREAD_LOCAL ? "thread_local"
                                                    : "relaxed";
}

const char* UnseenName(StepGraph::Unseen u) {
  return u == StepGraph::Unseen::kBuild ? "build"
         : u == StepGraph::Unseen::kError ? "error"
                                          : "eager";
}

constexpr size_t kStdFloats = 16384;     // standard buffers: 64 KiB
constexpr size_t kLargeFloats = 300000;  // for the upper buckets
constexpr int kStdBuffers = 8;
constexpr int kLargeBuffers = 3;
constexpr int kWorkers = 3;
constexpr uint64_t kScratchPerProgram = 128;  // testpack scratch: global_scratch_size

// Who launched what, for reading the records an operation leaves: per stream handle (a
// burst has several), else the defaults.
struct RecordCtx {
  int runtime = -1;
  int thread = -1;
  std::string replay_source;  // "sg:X" or "g:G": the graph a replay launched
};

class Model {
 public:
  Model(uint64_t seed, int ops, bool verbose) : seed_(seed), ops_(ops), verbose_(verbose), rng_(seed) {}
  ~Model();

  void Run();
  const std::vector<std::string>& trace() const { return trace_; }

 private:
  // ---- set-up and the main loop
  void SetUp();
  void TearDown();
  void ChooseWeights();
  bool Step();

  // ---- operations (each returns false when it does not apply now)
  bool OpOpen();
  bool OpOpenBad();
  bool OpDestroyRuntime();
  bool OpPreload();
  bool OpQuery();
  bool OpLaunch();
  bool OpBind();
  bool OpSet();
  bool OpBoundConfigure();
  bool OpBoundLaunch(bool prepare);
  bool OpDestroyBound();
  bool OpStreamCreate();
  bool OpStreamDestroy();
  bool OpReserve();
  bool OpRelease();
  bool OpCaptureBegin();
  bool OpCaptureEnd();
  bool OpGraphInstantiate();
  bool OpGraphLaunch();
  bool OpGraphDestroy();
  bool OpStepCreate();
  bool OpStepBuildOrReplay(bool replay);
  bool OpStepConfigure();
  bool OpStepDestroy();
  bool OpShortThread();
  bool OpNoContext();
  bool OpBurst();
  bool OpWorkerRestart();
  bool OpServeScenario();

  // ---- helpers
  void Note(const std::string& line);
  void BeginOp(const std::string& name, int thread);
  void EndOp();
  Worker& W(int thread);
  int PickThread(bool eager_ok_required);
  bool OwnNonRelaxedCapture(int thread) const;
  bool GlobalCaptureElsewhere(int thread) const;
  bool AnyGlobalCapture() const;
  int PickRuntime(const char* pack = nullptr);
  bool PickStream(StreamRef* out, bool allow_capturing, bool allow_pseudo);
  CUstream Handle(const StreamRef& s) const;
  std::string StreamText(const StreamRef& s) const;
  bool Capturing(const StreamRef& s) const;
  std::string EagerHolder(int runtime, const StreamRef& s, int thread) const;
  std::string StreamKey(int runtime, const StreamRef& s, int thread) const;
  Arg ToArg(const MArg& a) const;
  std::vector<Arg> ToArgs(const std::vector<MArg>& a) const;
  MArg PickPtr(int64_t elements, size_t elem_size, bool large = false,
               const std::vector<int>* from = nullptr);
  // Valid arguments (and a grid, when the kernel needs or gets one) for kernel `k`.
  void GenArgs(int k, std::vector<MArg>* args, bool* explicit_grid, Grid* grid,
               const std::vector<int>* outputs = nullptr, const std::vector<int>* inputs = nullptr);
  // Arguments kpack must refuse, and the code.
  StatusCode GenBadArgs(int k, std::vector<MArg>* args);
  Grid ExactGrid(int k, const std::vector<MArg>& args, bool explicit_grid, const Grid& grid) const;
  Expect LaunchExpect(int runtime, int k, const StreamRef& s, int thread, uint64_t programs,
                      int allocator);
  void AfterLaunch(bool ok, int runtime, int k, const StreamRef& s, int thread, uint64_t programs,
                   int allocator, const Effect& effect);
  void Emit(const StreamRef& s, const Effect& e);
  void CheckStatus(const char* call, const absl::Status& s, const Expect& e, const Fault& f);
  // Runs `call` on `thread` with a fault armed (when chosen) right before it.
  absl::Status Call(int thread, Fault* fault, const std::function<absl::Status()>& call);
  // A fault, `percent` of the time: in one of `likely` (the calls the operation makes)
  // more often than in any other.
  Fault MaybeFault(int percent, const std::vector<const char*>& likely = {});
  UserAllocator* Allocator(int kind);
  ScratchAllocator AllocatorFor(int kind);
  void DestroyStep(int id);
  void DestroyGraph(int id);
  void EndCapture(int id, int thread);
  void ThreadExited(int thread);
  uint64_t StreamArena(int runtime, const StreamRef& s, int thread) const;

  // ---- checks
  void CheckAll();
  void ScanRecords();
  void ScratchUse(const fake::LaunchRecord& r, const RecordCtx& ctx);
  void CheckMemory();
  void CheckCaptures();
  void CheckCounts();
  void DropHolder(const std::string& holder);
  void ReplaceHolder(const std::string& from, const std::string& to);

  const uint64_t seed_;
  const int ops_;
  const bool verbose_;
  Rng rng_;
  std::vector<std::string> trace_;
  int op_index_ = 0;

  // Per operation.
  struct Op {
    std::string name;
    int thread = -1;
    int64_t launch_mark = 0;
    int64_t expected_records = -1;  // -1: not checked
    bool targets_capture = false;
    std::map<std::string, int64_t> calls;  // driver call counts at the start
    RecordCtx ctx;
    std::map<CUstream, RecordCtx> per_stream;
  } op_;

  std::vector<std::pair<int, std::function<bool()>>> ops_table_;
  // A scenario's choices for the next operation (-1 / empty: the operation chooses), and
  // what the last ones made.
  int focus_step_ = -1, focus_thread_ = -1, focus_capture_ = -1, focus_graph_ = -1;
  std::optional<StreamRef> focus_stream_;
  int last_capture_ = -1, last_graph_ = -1;
  std::vector<std::unique_ptr<Worker>> workers_;
  int next_thread_ = 0;
  std::vector<CUdeviceptr> buffers_;  // device copies of memory_.bytes
  std::set<uint64_t> user_allocations_;
  Memory memory_;
  CUdeviceptr pool_ = 0;  // the user allocators' memory
  UserAllocator allocators_[3];
  uint32_t scratch_offset_ = 0;  // testpack scratch's $global_scratch slot
  bool large_dirty_ = true;

  int next_id_ = 0;
  std::map<int, RuntimeM> runtimes_;
  std::map<int, StreamM> streams_;
  std::map<int, BoundM> bounds_;
  std::map<int, CaptureM> captures_;
  std::map<int, GraphM> graphs_;
  std::map<int, StepM> steps_;
  std::map<uint64_t, AllocM> allocs_;  // by fake::AllocationId
  // Lower bounds of stream arenas and capture reservations, by StreamKey.
  std::map<std::string, uint64_t> arena_lb_;
  std::map<std::string, uint64_t> reserved_lb_;
  // Stream keys that may hold an arena, per runtime (for Stats::scratch_arenas).
  std::map<int, std::set<std::string>> arena_keys_;
};

// ---------------------------------------------------------------------------------------
// Infrastructure

Model::~Model() {
  // A failed seed leaves objects behind: drop them before the fake is reset.
  for (auto& [id, s] : steps_) s.g.reset();
  for (auto& [id, b] : bounds_) b.b.reset();
  for (auto& [id, r] : runtimes_) r.rt.reset();
  for (auto& w : workers_) w->Stop();
}

void Model::Note(const std::string& line) {
  std::string text = absl::StrCat("#", op_index_, " [t", op_.thread, "] ", line);
  if (verbose_) std::fprintf(stderr, "%s\n", text.c_str());
  trace_.push_back(std::move(text));
}

Worker& Model::W(int thread) {
  for (auto& w : workers_) {
    if (w->id() == thread) return *w;
  }
  Fail(absl::StrCat("no worker t", thread));
}

bool Model::OwnNonRelaxedCapture(int thread) const {
  for (const auto& [id, c] : captures_) {
    if (c.thread == thread && c.mode != CU_STREAM_CAPTURE_MODE_RELAXED) return true;
  }
  return false;
}

bool Model::GlobalCaptureElsewhere(int thread) const {
  for (const auto& [id, c] : captures_) {
    if (c.thread != thread && c.mode == CU_STREAM_CAPTURE_MODE_GLOBAL) return true;
  }
  return false;
}

bool Model::AnyGlobalCapture() const {
  for (const auto& [id, c] : captures_) {
    if (c.mode == CU_STREAM_CAPTURE_MODE_GLOBAL) return true;
  }
  return false;
}

// A worker; one without a capture of its own that forbids unsafe calls when the operation
// works outside a capture (its allocations would invalidate the thread's own capture, the
// caller's doing, not kpack's). -1 when there is none.
int Model::PickThread(bool outside_capture) {
  std::vector<int> ok;
  for (auto& w : workers_) {
    if (!outside_capture || !OwnNonRelaxedCapture(w->id())) ok.push_back(w->id());
  }
  return ok.empty() ? -1 : rng_.Pick(ok);
}

int Model::PickRuntime(const char* pack) {
  std::vector<int> ids;
  for (const auto& [id, r] : runtimes_) {
    if (pack == nullptr || r.pack == pack) ids.push_back(id);
  }
  return ids.empty() ? -1 : rng_.Pick(ids);
}

CUstream Model::Handle(const StreamRef& s) const {
  switch (s.kind) {
    case StreamRef::kReal:
      return streams_.at(s.id).h;
    case StreamRef::kNull:
      return nullptr;
    case StreamRef::kLegacy:
      return CU_STREAM_LEGACY;
    case StreamRef::kPerThread:
      return CU_STREAM_PER_THREAD;
  }
  return nullptr;
}

std::string Model::StreamText(const StreamRef& s) const {
  switch (s.kind) {
    case StreamRef::kReal:
      return absl::StrCat("s", s.id, Capturing(s) ? "(capturing)" : "");
    case StreamRef::kNull:
      return "null";
    case StreamRef::kLegacy:
      return "legacy";
    case StreamRef::kPerThread:
      return "per_thread";
  }
  return "?";
}

bool Model::Capturing(const StreamRef& s) const {
  return s.kind == StreamRef::kReal && streams_.at(s.id).capture >= 0;
}

bool Model::PickStream(StreamRef* out, bool allow_capturing, bool allow_pseudo) {
  std::vector<StreamRef> options;
  for (const auto& [id, s] : streams_) {
    if (s.capture >= 0 && !allow_capturing) continue;
    options.push_back({StreamRef::kReal, id});
    if (s.capture >= 0) options.push_back({StreamRef::kReal, id});  // captures: more often
  }
  if (allow_pseudo) {
    options.push_back({StreamRef::kNull, -1});
    if (rng_.Percent(50)) options.push_back({StreamRef::kLegacy, -1});
    if (rng_.Percent(50)) options.push_back({StreamRef::kPerThread, -1});
  }
  if (options.empty()) return false;
  *out = rng_.Pick(options);
  return true;
}

// The owner of a stream's arena as kpack keys it: per real stream, per context for the
// legacy stream (one context here), per thread for CU_STREAM_PER_THREAD.
std::string Model::StreamKey(int runtime, const StreamRef& s, int thread) const {
  switch (s.kind) {
    case StreamRef::kReal:
      return absl::StrCat("st:", runtime, ":", s.id);
    case StreamRef::kNull:
    case StreamRef::kLegacy:
      return absl::StrCat("lg:", runtime);
    case StreamRef::kPerThread:
      return absl::StrCat("pt:", runtime, ":", thread);
  }
  return "?";
}

std::string Model::EagerHolder(int runtime, const StreamRef& s, int thread) const {
  if (Capturing(s)) return absl::StrCat("cap:", streams_.at(s.id).capture);
  return StreamKey(runtime, s, thread);
}

uint64_t Model::StreamArena(int runtime, const StreamRef& s, int thread) const {
  auto it = arena_lb_.find(StreamKey(runtime, s, thread));
  return it == arena_lb_.end() ? 0 : it->second;
}

Arg Model::ToArg(const MArg& a) const {
  switch (a.kind) {
    case MArg::kPtr:
      return Arg(static_cast<CUdeviceptr>(buffers_[a.buf] + a.off));
    case MArg::kI32:
      return Arg(static_cast<int32_t>(a.i));
    case MArg::kI64:
      return Arg(a.i);
    case MArg::kF32:
      return Arg(static_cast<float>(a.f));
    case MArg::kF64:
      return Arg(a.f);
    case MArg::kHalf:
      return Arg(kpack::Half{a.bits});
    case MArg::kBf16:
      return Arg(kpack::BFloat16{a.bits});
    case MArg::kBool:
      return Arg(a.i != 0);
  }
  return Arg(0);
}

std::vector<Arg> Model::ToArgs(const std::vector<MArg>& a) const {
  std::vector<Arg> out;
  for (const MArg& m : a) out.push_back(ToArg(m));
  return out;
}

UserAllocator* Model::Allocator(int kind) { return kind == 0 ? nullptr : &allocators_[kind]; }

ScratchAllocator Model::AllocatorFor(int kind) {
  if (kind == 0) return {};
  return {&UserAllocator::Allocate, &allocators_[kind]};
}

Fault Model::MaybeFault(int percent, const std::vector<const char*>& likely) {
  Fault f;
  if (!rng_.Percent(percent)) return f;
  f.armed = true;
  f.fn = !likely.empty() && rng_.Percent(60) ? rng_.Pick(likely) : rng_.Pick(FaultFunctions());
  f.code = rng_.Pick(FaultCodes());
  f.skip = static_cast<int>(rng_.Pick(std::vector<int64_t>{0, 0, 0, 1, 2}));
  return f;
}

absl::Status Model::Call(int thread, Fault* fault, const std::function<absl::Status()>& call) {
  absl::Status status;
  W(thread).Run([&] {
    if (fault != nullptr && fault->armed) fake::FailNext(fault->fn, fault->code, fault->skip);
    status = call();
    const int unused = fake::CancelFailures();
    if (fault != nullptr && fault->armed) fault->fired = unused == 0;
  });
  return status;
}

void Model::CheckStatus(const char* call, const absl::Status& s, const Expect& e, const Fault& f) {
  const std::string where = absl::StrCat(call, f.Text());
  if (s.ok()) {
    if (e.must_fail.has_value()) {
      Fail(absl::StrCat(where, " succeeded, but must fail with ", CodeName(*e.must_fail)));
    }
    return;
  }
  if (s.message().empty()) Fail(absl::StrCat(where, ": an error without a message: ", s.ToString()));
  std::set<StatusCode> allowed = e.allowed;
  if (e.must_fail.has_value()) allowed = {*e.must_fail};
  if (f.fired) allowed.insert(internal::StatusCodeForCuResult(f.code));
  if (!allowed.contains(s.code())) {
    std::vector<std::string> names;
    for (StatusCode c : allowed) names.push_back(CodeName(c));
    Fail(absl::StrCat(where, " returned ", s.ToString(), "; the header documents only [",
                      absl::StrJoin(names, ", "), "] for it here"));
  }
  if (e.must_ok && !f.fired) Fail(absl::StrCat(where, " must succeed here, returned ", s.ToString()));
}

std::map<std::string, int>& OpCounts() {
  static std::map<std::string, int> counts;
  return counts;
}

void Model::BeginOp(const std::string& name, int thread) {
  ++OpCounts()[name];
  op_ = Op();
  op_.name = name;
  op_.thread = thread;
  op_.launch_mark = fake::LaunchCount();
  for (const char* fn : {"MemAlloc", "MemFree", "LibraryLoadData", "KernelGetFunction"}) {
    op_.calls[fn] = fake::CallCount(fn);
  }
}

void Model::EndOp() { CheckAll(); }

// ---------------------------------------------------------------------------------------
// Arguments

MArg Model::PickPtr(int64_t elements, size_t elem_size, bool large, const std::vector<int>* from) {
  std::vector<int> candidates;
  if (from != nullptr) {
    candidates = *from;
  } else if (large) {
    for (int b = kStdBuffers; b < kStdBuffers + kLargeBuffers; ++b) candidates.push_back(b);
  } else {
    for (int b = 0; b < kStdBuffers; ++b) candidates.push_back(b);
  }
  const int buf = rng_.Pick(candidates);
  const uint64_t bytes = static_cast<uint64_t>(std::max<int64_t>(elements, 0)) * elem_size;
  // 64 bytes keeps every div16 assumption; one or three elements break the pointer's
  // (an element stays aligned to its size, as a tensor's is).
  const int64_t e = static_cast<int64_t>(elem_size);
  std::vector<int64_t> offs = {0, 0, 64, 256, e, 3 * e};
  uint64_t off = static_cast<uint64_t>(rng_.Pick(offs));
  if (off + bytes > memory_.size(buf)) off = 0;
  return MArg::Ptr(buf, off);
}

void Model::GenArgs(int k, std::vector<MArg>* args, bool* explicit_grid, Grid* grid,
                    const std::vector<int>* outputs, const std::vector<int>* inputs) {
  const KernelDef& def = Kernels()[k];
  auto in = [&](int64_t n, size_t size, bool large = false) { return PickPtr(n, size, large, inputs); };
  auto out = [&](int64_t n, size_t size, bool large = false) { return PickPtr(n, size, large, outputs); };
  auto size_n = [&](int64_t max) {
    const int64_t edges[] = {0, 1, 15, 16, 1000, 1024, 1025, 4095, 4096, 4097};
    const int64_t n = rng_.Percent(40) ? edges[rng_.Index(10)] : rng_.Range(0, max);
    return std::min(n, max);
  };
  const int64_t cap = static_cast<int64_t>(kStdFloats) - 64;
  const bool restricted = outputs != nullptr || inputs != nullptr;  // standard buffers only
  args->clear();
  *explicit_grid = !def.expr_grid;
  *grid = Grid{1, 1, 1};
  switch (def.sem) {
    case Sem::kAdd:
    case Sem::kPdl:
    case Sem::kCluster:
    case Sem::kScalars: {
      const int64_t n = size_n(cap);
      const uint32_t need = Cdiv(n, def.sem == Sem::kScalars ? 256 : 1024);
      *grid = Grid{static_cast<uint32_t>(std::max<int64_t>(
          0, need + rng_.Pick(std::vector<int64_t>{0, 0, 0, 1, -1, -int64_t{need}})))};
      if (def.sem == Sem::kAdd) {
        *args = {in(n, 4), in(n, 4), out(n, 4), MArg::I32(n)};
      } else if (def.sem == Sem::kScalars) {
        *args = {in(n, 4), out(n, 4), MArg::I32(n), MArg::F32(rng_.SmallFloat()),
                 MArg::F32(rng_.SmallFloat()), MArg::F64(rng_.SmallFloat()),
                 MArg::Bool(rng_.Percent(50)), MArg::I64(rng_.Range(-(int64_t{1} << 40), int64_t{1} << 40))};
      } else {
        *args = {in(n, 4), out(n, 4), MArg::I32(n)};
      }
      return;
    }
    case Sem::kScratch: {
      const int64_t M = rng_.Range(0, 70), N = rng_.Range(0, 70);
      const int64_t stride = std::max<int64_t>(N, 1) + rng_.Range(0, 8);
      const int64_t extent = M > 0 && N > 0 ? (M - 1) * stride + N : 0;
      *grid = Grid{static_cast<uint32_t>(rng_.Range(0, 3)), static_cast<uint32_t>(rng_.Range(0, 3)),
                   1};
      *args = {in(extent, 4), out(extent, 4), MArg::I32(M), MArg::I32(N), MArg::I32(stride)};
      return;
    }
    case Sem::kAxpy: {
      const bool large = !restricted && rng_.Percent(3);
      const int64_t stride = large ? 1 : rng_.Pick(std::vector<int64_t>{1, 1, 1, 2, 3});
      const int64_t n = large ? rng_.Range(262145, 290000) : size_n(cap / stride);
      *args = {in(n > 0 ? (n - 1) * stride + 1 : 0, 4, large), in(n, 4, large), out(n, 4, large),
               MArg::I32(n), MArg::I32(stride), MArg::F32(rng_.SmallFloat())};
      return;
    }
    case Sem::kVectorAdd: {
      const bool large = !restricted && rng_.Percent(4);
      const int64_t n = large ? rng_.Range(65537, 290000) : size_n(cap);
      *args = {in(n, 4, large), in(n, 4, large), out(n, 4, large), MArg::I32(n)};
      if (rng_.Percent(25)) {  // an explicit grid, as for a recorded call
        *explicit_grid = true;
        *grid = Grid{static_cast<uint32_t>(Cdiv(n, 1024) + rng_.Range(0, 1))};
      }
      return;
    }
    case Sem::kFill: {
      const int64_t n = rng_.Range(0, 2048);
      *grid = Grid{static_cast<uint32_t>(std::max<int64_t>(0, Cdiv(n, 128) + rng_.Range(-1, 1)))};
      *args = {out(n, 2), out(n, 2), out(n, 4), out(n, 8), MArg::I32(n),
               MArg::Half(static_cast<uint16_t>(rng_.Next())), MArg::Bf16(static_cast<uint16_t>(rng_.Next())),
               MArg::F32(rng_.SmallFloat()), MArg::F64(rng_.SmallFloat())};
      return;
    }
  }
}

// An i32 parameter that no variant widens (axpy's n has an i64 variant in its last
// bucket, so its stride), for values out of range.
size_t I32Index(Sem sem) {
  switch (sem) {
    case Sem::kAdd:
    case Sem::kVectorAdd:
      return 3;
    case Sem::kAxpy:
    case Sem::kFill:
      return 4;
    default:
      return 2;
  }
}

StatusCode Model::GenBadArgs(int k, std::vector<MArg>* args) {
  bool explicit_grid;
  Grid grid;
  GenArgs(k, args, &explicit_grid, &grid);
  const KernelDef& def = Kernels()[k];
  switch (rng_.Range(0, 4)) {
    case 0:  // one argument too few
      args->pop_back();
      return StatusCode::kInvalidArgument;
    case 1:  // one too many
      args->push_back(MArg::I32(1));
      return StatusCode::kInvalidArgument;
    case 2:  // a float for a pointer
      (*args)[0] = MArg::F32(1.5);
      return StatusCode::kInvalidArgument;
    case 3: {  // an i32 out of range, or a pointer for an i32
      const size_t at = I32Index(def.sem);
      (*args)[at] = rng_.Percent(50) ? MArg::I64(int64_t{1} << 40) : MArg::Ptr(0, 0);
      return StatusCode::kInvalidArgument;
    }
    default:
      if (def.sem == Sem::kScalars) {  // beyond fp16's range: Triton raises OverflowError
        (*args)[5] = MArg::F64(1e6);
        return StatusCode::kInvalidArgument;
      }
      args->clear();
      return StatusCode::kInvalidArgument;
  }
}

Grid Model::ExactGrid(int k, const std::vector<MArg>& args, bool explicit_grid, const Grid& grid) const {
  if (explicit_grid) return grid;
  const int64_t n = std::max<int64_t>(SizeArg(Kernels()[k].sem, args), 0);
  if (Kernels()[k].sem == Sem::kVectorAdd) return Grid{Cdiv(n, 1024)};
  return Grid{n > 0 ? Cdiv(n, 256) : 0};  // axpy: only whether it is empty matters here
}

// What a valid launch of kernel `k` of `runtime` on `s` from `thread` may return.
Expect Model::LaunchExpect(int runtime, int k, const StreamRef& s, int thread, uint64_t programs,
                           int allocator) {
  const KernelDef& def = Kernels()[k];
  const RuntimeM& r = runtimes_.at(runtime);
  Expect e;
  e.allowed = {StatusCode::kInvalidArgument, StatusCode::kFailedPrecondition,
               StatusCode::kResourceExhausted};
  const bool scratch = def.scratch && programs > 0;
  const bool kpack_arena = scratch && allocator == 0 && !r.options_allocator;
  const uint64_t need = programs * kScratchPerProgram;
  if (scratch && allocator == 2) {
    // The caller's allocator returns null: RESOURCE_EXHAUSTED (loading comes first, and
    // inside a capture or during another thread's global capture may be refused first).
    if ((Capturing(s) || GlobalCaptureElsewhere(thread)) && !r.preloaded &&
        !r.kernels_preloaded.contains(def.name)) {
      e.allowed = {StatusCode::kFailedPrecondition, StatusCode::kResourceExhausted};
      return e;
    }
    e.must_fail = StatusCode::kResourceExhausted;
    return e;
  }
  const bool loaded = r.preloaded || r.kernels_preloaded.contains(def.name);
  if (!Capturing(s)) {
    // Allocating or loading is forbidden while another thread captures in global mode:
    // FAILED_PRECONDITION then (the driver's refusal), unless nothing needs either.
    e.must_ok = !GlobalCaptureElsewhere(thread) ||
                (loaded && !(kpack_arena && need > StreamArena(runtime, s, thread)));
    return e;
  }
  const CaptureM& c = captures_.at(streams_.at(s.id).capture);
  bool arena = !kpack_arena;
  if (kpack_arena) {
    auto it = c.arena.find(runtime);
    if (it != c.arena.end()) {
      arena = need <= it->second;
    } else {
      auto res = reserved_lb_.find(StreamKey(runtime, s, thread));
      arena = res != reserved_lb_.end() && need <= res->second;
    }
  }
  e.must_ok = loaded && arena;
  if (!e.must_ok) e.allowed = {StatusCode::kFailedPrecondition};
  return e;
}

void Model::Emit(const StreamRef& s, const Effect& e) {
  for (const MArg& a : e.args) large_dirty_ |= a.kind == MArg::kPtr && a.buf >= kStdBuffers;
  if (!InBounds(memory_, e.sem, e.args, e.grid)) {
    Fail(absl::StrCat("the model made an out-of-bounds launch ", ArgsText(e.args), GridText(e.grid)));
  }
  if (Capturing(s)) {
    captures_.at(streams_.at(s.id).capture).effects.push_back(e);
  } else {
    Apply(memory_, e);
  }
}

// The model's state after a launch of kernel `k` on `s` returned (ok or not).
void Model::AfterLaunch(bool ok, int runtime, int k, const StreamRef& s, int thread,
                        uint64_t programs, int allocator, const Effect& effect) {
  const KernelDef& def = Kernels()[k];
  const bool kpack_arena =
      def.scratch && programs > 0 && allocator == 0 && !runtimes_.at(runtime).options_allocator;
  const uint64_t need = programs * kScratchPerProgram;
  if (Capturing(s)) {
    CaptureM& c = captures_.at(streams_.at(s.id).capture);
    c.runtimes.insert(runtime);
    if (kpack_arena) {
      const std::string key = StreamKey(runtime, s, thread);
      auto it = c.arena.find(runtime);
      if (it == c.arena.end()) {
        auto res = reserved_lb_.find(key);
        const bool reserved = res != reserved_lb_.end() && need <= res->second;
        if (ok) c.arena[runtime] = reserved ? res->second : need;
        // Taken by the capture if it fitted; unknown otherwise (a failed launch may have
        // taken it too).
        if (reserved || !ok) reserved_lb_.erase(key);
      }
    }
    if (ok && programs > 0) ++c.nodes;
  } else if (kpack_arena) {
    // A launch the driver refused may have made the stream's arena first.
    const std::string key = StreamKey(runtime, s, thread);
    arena_keys_[runtime].insert(key);
    if (ok) arena_lb_[key] = std::max(arena_lb_[key], need);
  }
  if (ok) {
    Emit(s, effect);
    op_.expected_records = programs > 0 ? 1 : 0;
  } else {
    op_.expected_records = 0;
  }
}

// ---------------------------------------------------------------------------------------
// Checks

void Model::CheckAll() {
  const std::vector<std::string> faults = fake::Faults();
  if (!faults.empty()) Fail(absl::StrCat("emulated kernels touched memory not theirs: ", faults[0]));
  if (op_.targets_capture) {
    for (const auto& [fn, before] : op_.calls) {
      if (fake::CallCount(fn) != before) {
        Fail(absl::StrCat("an operation on a capturing stream called cu", fn, " ",
                          fake::CallCount(fn) - before, " times: during a capture kpack must "
                          "never allocate, free or load"));
      }
    }
  }
  CheckCaptures();
  ScanRecords();
  CheckMemory();
  CheckCounts();
}

void Model::CheckCaptures() {
  for (const auto& [id, c] : captures_) {
    const CUstreamCaptureStatus status = fake::CaptureStatus(streams_.at(c.stream).h);
    if (status != CU_STREAM_CAPTURE_STATUS_ACTIVE) {
      Fail(absl::StrCat("capture c", id, " (", ModeName(c.mode), ", stream s", c.stream,
                        ", begun on t", c.thread, ") is ",
                        status == CU_STREAM_CAPTURE_STATUS_INVALIDATED ? "invalidated" : "gone",
                        " after ", op_.name));
    }
  }
}

void Model::ScanRecords() {
  const int64_t end = fake::LaunchCount();
  const int64_t count = end - op_.launch_mark;
  if (op_.expected_records >= 0 && count != op_.expected_records) {
    Fail(absl::StrCat(op_.name, " left ", count, " launch records in the driver; expected ",
                      op_.expected_records));
  }
  if (count > fake::kLaunchRingCapacity) Fail("more launches in one operation than the ring keeps");
  for (int64_t i = op_.launch_mark; i < end; ++i) {
    const fake::LaunchRecord r = fake::GetLaunch(i);
    if (std::strcmp(r.entry.data(), "scratch_kernel") != 0) continue;
    auto it = op_.per_stream.find(r.stream);
    ScratchUse(r, it != op_.per_stream.end() ? it->second : op_.ctx);
  }
}

// One launch record of the scratch kernel: whose arena its scratch pointer is in, and
// whether that allocation serves anyone else.
void Model::ScratchUse(const fake::LaunchRecord& r, const RecordCtx& ctx) {
  CUdeviceptr p;
  std::memcpy(&p, r.params.data() + scratch_offset_, 8);
  const uint64_t a = fake::AllocationId(p);
  const std::string what = absl::StrCat(r.graph_replay ? "graph replay" : "launch",
                                        r.captured ? " captured" : "", " of scratch_kernel on stream ",
                                        Hex(reinterpret_cast<uintptr_t>(r.stream)));
  if (a == 0) Fail(absl::StrCat(what, " uses scratch ", Hex(p), ", outside every live allocation"));
  if (user_allocations_.contains(a)) {
    if (r.graph_replay && absl::StartsWith(ctx.replay_source, "sg:")) {
      Fail(absl::StrCat(what, ": a StepGraph node uses a BoundLaunch's ScratchAllocator "
                              "memory, but graph.h says the graph owns its scratch"));
    }
    return;
  }
  // The stream record's model stream, for captures.
  int capture = -1;
  for (const auto& [id, s] : streams_) {
    if (s.h == r.stream && s.capture >= 0) capture = s.capture;
  }
  AllocM& alloc = allocs_[a];
  alloc.p = p;
  if (alloc.runtime < 0) alloc.runtime = ctx.runtime;
  auto others = [&](const std::string& except) {
    std::vector<std::string> v;
    for (const std::string& h : alloc.holders) {
      if (h != except) v.push_back(h);
    }
    return absl::StrJoin(v, ", ");
  };
  auto take = [&](const std::string& holder) {
    if (alloc.holders.contains(holder)) return;
    if (!alloc.holders.empty()) {
      Fail(absl::StrCat(what, " uses scratch allocation ", a, " (", Hex(p), ") as ", holder,
                        "'s, while it still belongs to ", others(holder),
                        ": scratch used after it returned to the pool, or shared"));
    }
    alloc.holders.insert(holder);
  };
  if (r.graph_replay) {
    // (A graph launch cannot be captured: the driver refuses it.)
    if (r.captured) Fail(absl::StrCat(what, ": a graph launch went into a capture"));
    take(ctx.replay_source);
    return;
  }
  if (r.captured) {
    if (capture < 0) Fail(absl::StrCat(what, ": captured, but the model knows no capture"));
    take(absl::StrCat("cap:", capture));
    return;
  }
  // Eager: the stream's arena.
  StreamRef s;
  if (r.stream == nullptr) {
    s = {StreamRef::kNull, -1};
  } else if (r.stream == CU_STREAM_LEGACY) {
    s = {StreamRef::kLegacy, -1};
  } else if (r.stream == CU_STREAM_PER_THREAD) {
    s = {StreamRef::kPerThread, -1};
  } else {
    for (const auto& [id, st] : streams_) {
      if (st.h == r.stream) s = {StreamRef::kReal, id};
    }
    if (s.kind != StreamRef::kReal) Fail(absl::StrCat(what, ": on a stream the model does not know"));
  }
  take(StreamKey(ctx.runtime, s, ctx.thread));
}

void Model::DropHolder(const std::string& holder) {
  for (auto& [a, alloc] : allocs_) alloc.holders.erase(holder);
}

void Model::ReplaceHolder(const std::string& from, const std::string& to) {
  for (auto& [a, alloc] : allocs_) {
    if (alloc.holders.erase(from) > 0) alloc.holders.insert(to);
  }
}

void Model::CheckMemory() {
  // The large buffers (4 MB, slow to compare under a sanitizer) when the model wrote them
  // in this operation, and every 25 operations.
  const bool large = large_dirty_ || op_index_ % 25 == 0;
  large_dirty_ = false;
  for (size_t b = 0; b < buffers_.size(); ++b) {
    if (b >= static_cast<size_t>(kStdBuffers) && !large) continue;
    const std::vector<uint8_t>& want = memory_.bytes[b];
    const auto* got = static_cast<const uint8_t*>(fake::DeviceMemory(buffers_[b], want.size(), "model check"));
    if (got == nullptr) Fail(absl::StrCat("buffer b", b, " is not device memory any more"));
    if (std::memcmp(got, want.data(), want.size()) == 0) continue;
    // Word by word, a NaN equal to any NaN: which payload an operation on two NaNs keeps
    // depends on the order the compiler gave its operands (fill's raw fp16 bits make NaNs
    // when other kernels read them as floats).
    size_t at = 0;
    float g = 0, w = 0;
    for (; at + 4 <= want.size(); at += 4) {
      if (std::memcmp(got + at, want.data() + at, 4) == 0) continue;
      std::memcpy(&g, got + at, 4);
      std::memcpy(&w, want.data() + at, 4);
      if (!(std::isnan(g) && std::isnan(w))) break;
    }
    if (at + 4 > want.size()) continue;
    Fail(absl::StrCat("buffer b", b, " differs from the oracle at byte ", at, ": device holds ",
                      g, " (", Hex(got[at] | got[at + 1] << 8 | got[at + 2] << 16 | uint32_t{got[at + 3]} << 24),
                      "), the model ", w));
  }
}

void Model::CheckCounts() {
  // Forget allocations that were freed.
  for (auto it = allocs_.begin(); it != allocs_.end();) {
    it = fake::AllocationId(it->second.p) == it->first ? std::next(it) : allocs_.erase(it);
  }
  // Graphs: the model's, plus a graph and an executable per StepGraph graph.
  int64_t graphs = 0;
  for (const auto& [id, g] : graphs_) graphs += (g.graph != nullptr) + static_cast<int64_t>(g.execs.size());
  for (const auto& [id, s] : steps_) graphs += 2 * static_cast<int64_t>(s.g->graphs().size());
  if (fake::LiveGraphs() != graphs) {
    Fail(absl::StrCat("the driver holds ", fake::LiveGraphs(), " graphs and executables; the "
                      "model accounts for ", graphs, " (a graph leaked or was destroyed early)"));
  }
  // Arenas in graphs, per runtime: kpack counts at least the allocations live graphs use.
  size_t in_graphs = 0;
  for (auto& [id, r] : runtimes_) {
    const Runtime::Stats stats = r.rt->stats();
    in_graphs += stats.scratch_in_graphs;
    std::set<uint64_t> used;
    for (const auto& [a, alloc] : allocs_) {
      if (alloc.runtime != id) continue;
      for (const std::string& h : alloc.holders) {
        if (absl::StartsWith(h, "cap:") || absl::StartsWith(h, "g:") || absl::StartsWith(h, "sg:")) {
          used.insert(a);
        }
      }
    }
    if (used.size() > stats.scratch_in_graphs) {
      std::vector<std::string> list;
      for (uint64_t a : used) {
        list.push_back(absl::StrCat(a, " (", absl::StrJoin(allocs_[a].holders, ", "), ")"));
      }
      Fail(absl::StrCat("runtime r", id, ": live graphs use ", used.size(),
                        " scratch allocations [", absl::StrJoin(list, "; "),
                        "] but Stats::scratch_in_graphs is ", stats.scratch_in_graphs,
                        " (scratch_idle ", stats.scratch_idle,
                        "): an arena a live graph uses went back to the pool"));
    }
    if (stats.scratch_arenas > arena_keys_[id].size()) {
      Fail(absl::StrCat("runtime r", id, ": Stats::scratch_arenas is ", stats.scratch_arenas,
                        ", but only ", arena_keys_[id].size(), " streams may hold one [",
                        absl::StrJoin(arena_keys_[id], ", "),
                        "] (an exited thread's or a released stream's arena was kept)"));
    }
  }
  if (fake::LiveUserObjects() > static_cast<int>(in_graphs)) {
    Fail(absl::StrCat("the driver holds ", fake::LiveUserObjects(),
                      " user objects, but the runtimes count only ", in_graphs,
                      " arenas in graphs: a user object leaked"));
  }
  if (runtimes_.empty() && graphs_.empty() && captures_.empty()) {
    if (fake::LiveAllocations() != static_cast<int64_t>(user_allocations_.size())) {
      Fail(absl::StrCat("no runtime and no graph is left, but the driver holds ",
                        fake::LiveAllocations() - static_cast<int64_t>(user_allocations_.size()),
                        " allocations besides the model's buffers: scratch leaked"));
    }
    if (fake::LiveUserObjects() != 0 || fake::LoadedLibraries() != 0) {
      Fail(absl::StrCat("no runtime is left, but ", fake::LiveUserObjects(), " user objects and ",
                        fake::LoadedLibraries(), " libraries live on"));
    }
  }
}

// ---------------------------------------------------------------------------------------
// Set-up, the loop, tear-down

void Model::SetUp() {
  fake::Reset();
  fake::SetDeviceHandleOffset(1000);
  fake::SetHandleReuse(true);
  conformance::RegisterKernelEmulators();
  // Kernels the oracle does not compute run nothing.
  for (const char* entry : {"matmul_kernel", "softmax_kernel", "scalars_kernel", "layer_norm_kernel"}) {
    fake::SetKernelEmulator(entry, nullptr);
  }
  for (int i = 0; i < kWorkers; ++i) workers_.push_back(std::make_unique<Worker>(next_thread_++));
  op_.thread = 0;
  Note(absl::StrCat("seed ", seed_));
  // The buffers, filled with random floats through host memory (the fake's device memory).
  W(0).Run([&] {
    auto alloc = [&](size_t bytes) {
      CUdeviceptr p = 0;
      if (D().MemAlloc(&p, bytes) != CUDA_SUCCESS) Fail("cuMemAlloc of a model buffer");
      user_allocations_.insert(fake::AllocationId(p));
      return p;
    };
    for (int b = 0; b < kStdBuffers + kLargeBuffers; ++b) {
      const size_t floats = b < kStdBuffers ? kStdFloats : kLargeFloats;
      buffers_.push_back(alloc(floats * 4));
      memory_.bytes.emplace_back(floats * 4);
    }
    pool_ = alloc(1 << 20);
  });
  for (size_t b = 0; b < buffers_.size(); ++b) {
    std::vector<uint8_t>& bytes = memory_.bytes[b];
    for (size_t i = 0; i < bytes.size() / 4; ++i) {
      const float v = rng_.SmallFloat();
      std::memcpy(bytes.data() + i * 4, &v, 4);
    }
    std::memcpy(fake::DeviceMemory(buffers_[b], bytes.size(), "model set-up"), bytes.data(), bytes.size());
  }
  for (int i = 1; i < 3; ++i) {
    allocators_[i].base = pool_;
    allocators_[i].size = 1 << 20;
    allocators_[i].fail = i == 2;
  }
  auto pack = Pack::Read(KPACK_TEST_PACK_DIR);
  if (!pack.ok()) Fail(pack.status().ToString());
  for (const LayoutSlotInfo& slot : (*pack->Find("scratch"))->variants[0].layout) {
    if (slot.name == "$global_scratch") scratch_offset_ = slot.offset;
  }
}

void Model::Run() {
  SetUp();
  ChooseWeights();
  for (op_index_ = 1; op_index_ <= ops_; ++op_index_) {
    int tries = 0;
    while (!Step()) {
      if (++tries > 200) Fail("no operation applies");
    }
  }
  ++op_index_;
  TearDown();
}

// The operations and their weights. Each seed scales them at random ("swarm testing":
// a seed that seldom destroys runtimes builds deeper state, one that captures a lot
// reaches more capture paths); the core ones stay possible in every seed.
void Model::ChooseWeights() {
  struct Choice {
    int weight;
    bool core;
    std::function<bool()> op;
  };
  const std::vector<Choice> choices = {
      {4, true, [this] { return OpOpen(); }},
      {1, false, [this] { return OpOpenBad(); }},
      {2, false, [this] { return OpDestroyRuntime(); }},
      {3, false, [this] { return OpPreload(); }},
      {3, false, [this] { return OpQuery(); }},
      {14, true, [this] { return OpLaunch(); }},
      {7, true, [this] { return OpBind(); }},
      {8, false, [this] { return OpSet(); }},
      {3, false, [this] { return OpBoundConfigure(); }},
      {6, false, [this] { return OpBoundLaunch(false); }},
      {2, false, [this] { return OpBoundLaunch(true); }},
      {2, false, [this] { return OpDestroyBound(); }},
      {3, true, [this] { return OpStreamCreate(); }},
      {2, false, [this] { return OpStreamDestroy(); }},
      {4, false, [this] { return OpReserve(); }},
      {2, false, [this] { return OpRelease(); }},
      {5, false, [this] { return OpCaptureBegin(); }},
      {4, true, [this] { return OpCaptureEnd(); }},
      {3, false, [this] { return OpGraphInstantiate(); }},
      {4, false, [this] { return OpGraphLaunch(); }},
      {3, false, [this] { return OpGraphDestroy(); }},
      {4, true, [this] { return OpStepCreate(); }},
      {2, false, [this] { return OpStepBuildOrReplay(false); }},
      {8, true, [this] { return OpStepBuildOrReplay(true); }},
      {3, false, [this] { return OpStepConfigure(); }},
      {2, false, [this] { return OpStepDestroy(); }},
      {3, false, [this] { return OpShortThread(); }},
      {1, false, [this] { return OpNoContext(); }},
      {1, false, [this] { return OpBurst(); }},
      {1, false, [this] { return OpWorkerRestart(); }},
      {2, false, [this] { return OpServeScenario(); }},
  };
  std::vector<std::string> scaled;
  for (const Choice& c : choices) {
    int factor = static_cast<int>(rng_.Pick(std::vector<int64_t>{0, 1, 1, 2, 4}));
    if (c.core) factor = std::max(factor, 1);
    ops_table_.push_back({c.weight * factor, c.op});
  }
}

bool Model::Step() {
  int total = 0;
  for (const auto& [weight, op] : ops_table_) total += weight;
  int pick = static_cast<int>(rng_.Range(0, total - 1));
  for (const auto& [weight, op] : ops_table_) {
    if (pick < weight) return op();
    pick -= weight;
  }
  return false;
}

void Model::TearDown() {
  const int t = workers_.front()->id();
  BeginOp("tear-down", t);
  // Captures first (on their threads), then everything in a random order that keeps the
  // headers' rules: StepGraphs before their BoundLaunches, both and the graphs that hold
  // a runtime's scratch before the runtime.
  while (!captures_.empty()) {
    const int id = captures_.begin()->first;
    EndCapture(id, captures_.at(id).thread);
  }
  op_.thread = t;
  while (!steps_.empty() || !graphs_.empty()) {
    std::vector<std::pair<int, int>> items;
    for (const auto& [id, s] : steps_) items.push_back({0, id});
    for (const auto& [id, g] : graphs_) items.push_back({1, id});
    const std::pair<int, int> item = rng_.Pick(items);
    const int kind = item.first, id = item.second;
    if (kind == 0) {
      Note(absl::StrCat("tear-down: destroy step graph x", id));
      DestroyStep(id);
    } else {
      Note(absl::StrCat("tear-down: destroy graph g", id));
      DestroyGraph(id);
    }
  }
  while (!bounds_.empty() || !runtimes_.empty()) {
    std::vector<std::pair<int, int>> items;
    for (const auto& [id, b] : bounds_) items.push_back({0, id});
    for (const auto& [id, r] : runtimes_) {
      bool free = true;
      for (const auto& [bid, b] : bounds_) free &= b.runtime != id;
      if (free) items.push_back({1, id});
    }
    const std::pair<int, int> item = rng_.Pick(items);  // (no structured binding: clang 14
    const int kind = item.first, id = item.second;     // cannot capture one in a lambda)
    if (kind == 0) {
      Note(absl::StrCat("tear-down: destroy bound launch l", id));
      W(t).Run([&] { bounds_.at(id).b.reset(); });
      bounds_.erase(id);
    } else {
      Note(absl::StrCat("tear-down: destroy runtime r", id));
      W(t).Run([&] { runtimes_.at(id).rt.reset(); });
      runtimes_.erase(id);
      for (auto& [a, alloc] : allocs_) {
        if (alloc.runtime == id && fake::AllocationId(alloc.p) == a) {
          Fail(absl::StrCat("runtime r", id, " destroyed, but its scratch allocation ", a,
                            " (used by ", absl::StrJoin(alloc.holders, ", "), ") is not freed"));
        }
      }
    }
    CheckCounts();
  }
  W(t).Run([&] {
    for (const auto& [id, s] : streams_) {
      if (D().StreamDestroy(s.h) != CUDA_SUCCESS) Fail("cuStreamDestroy");
    }
  });
  streams_.clear();
  allocs_.clear();
  arena_keys_.clear();
  large_dirty_ = true;
  CheckAll();
  for (auto& w : workers_) w->Stop();
  workers_.clear();
  RunOnNewThread(true, [&] {
    for (CUdeviceptr p : buffers_) D().MemFree(p);
    D().MemFree(pool_);
  });
  if (fake::LiveAllocations() != 0 || fake::LiveGraphs() != 0 || fake::LiveUserObjects() != 0 ||
      fake::LoadedLibraries() != 0 || fake::LiveStreams() != 0) {
    Fail(absl::StrCat("after tear-down the driver still holds ", fake::LiveAllocations(),
                      " allocations, ", fake::LiveGraphs(), " graphs, ", fake::LiveUserObjects(),
                      " user objects, ", fake::LoadedLibraries(), " libraries, ",
                      fake::LiveStreams(), " streams"));
  }
}

// ---------------------------------------------------------------------------------------
// Operations: runtimes and kernels

std::string PackDir(const std::string& pack) {
  if (pack == "testpack") return KPACK_TEST_PACK_DIR;
  if (pack == "dispatchpack") return KPACK_DISPATCH_PACK_DIR;
  if (pack == "graphpack") return KPACK_GRAPH_PACK_DIR;
  return KPACK_SCALAR_PACK_DIR;
}

bool Model::OpOpen() {
  if (runtimes_.size() >= 4) return false;
  const int t = PickThread(true);
  if (t < 0) return false;
  static const std::vector<std::string> kPacks = {"testpack", "testpack", "dispatchpack",
                                                  "graphpack", "graphpack", "scalarpack"};
  const std::string pack = rng_.Pick(kPacks);
  Options o = testing::FakeOptions();
  o.preload = rng_.Percent(30);
  o.nvtx = rng_.Percent(50);
  const bool allocator = pack == "testpack" && rng_.Percent(15);
  if (allocator) o.scratch_allocator = AllocatorFor(1);
  Fault f = MaybeFault(10, {"Init", "LibraryLoadData", "KernelGetFunction"});
  BeginOp("open", t);
  const int id = next_id_++;
  Note(absl::StrCat("r", id, " = Runtime::Open(", pack, ", preload=", o.preload,
                    allocator ? ", Options::scratch_allocator" : "", ")", f.Text()));
  absl::StatusOr<Runtime> rt = absl::UnknownError("not run");
  const absl::Status s = Call(t, &f, [&] {
    rt = Runtime::Open(PackDir(pack), o);
    return rt.status();
  });
  Expect e;
  e.allowed = {StatusCode::kUnavailable, StatusCode::kInvalidArgument, StatusCode::kNotFound,
               StatusCode::kUnimplemented};
  if (o.preload) e.allowed.insert(StatusCode::kFailedPrecondition);  // Preload's own errors
  e.must_ok = !o.preload || !GlobalCaptureElsewhere(t);
  CheckStatus("Runtime::Open", s, e, f);
  op_.expected_records = 0;
  if (s.ok()) {
    RuntimeM& r = runtimes_[id];
    r.id = id;
    r.pack = pack;
    r.rt = std::make_unique<Runtime>(*std::move(rt));
    r.preloaded = o.preload;
    r.options_allocator = allocator;
    for (size_t k = 0; k < Kernels().size(); ++k) {
      if (Kernels()[k].pack != pack) continue;
      absl::StatusOr<Kernel> kernel = r.rt->Find(Kernels()[k].name);
      if (!kernel.ok()) Fail(absl::StrCat("Find(", Kernels()[k].name, "): ", kernel.status().ToString()));
      r.kernels[static_cast<int>(k)] = *kernel;
    }
  }
  EndOp();
  return true;
}

bool Model::OpOpenBad() {
  const int t = PickThread(true);
  if (t < 0) return false;
  BeginOp("open (bad)", t);
  const bool no_driver = rng_.Percent(50);
  Options o = testing::FakeOptions();
  std::string dir = KPACK_TEST_PACK_DIR;
  if (no_driver) {
    o.driver_path = "/nonexistent/libcuda.so.1";
  } else {
    dir += "/no_such_pack";
  }
  Note(absl::StrCat("Runtime::Open(", no_driver ? "testpack, driver /nonexistent" : "no_such_pack", ")"));
  const absl::Status s = Call(t, nullptr, [&] { return Runtime::Open(dir, o).status(); });
  Expect e;
  e.must_fail = no_driver ? StatusCode::kUnavailable : StatusCode::kNotFound;
  CheckStatus("Runtime::Open", s, e, Fault());
  op_.expected_records = 0;
  EndOp();
  return true;
}

void Model::EndCapture(int id, int thread) {
  const CaptureM c = captures_.at(id);
  CUgraph g = nullptr;
  CUresult r = CUDA_SUCCESS;
  W(thread).Run([&] { r = D().StreamEndCapture(streams_.at(c.stream).h, &g); });
  captures_.erase(id);
  streams_.at(c.stream).capture = -1;
  if (r != CUDA_SUCCESS) {
    Fail(absl::StrCat("cuStreamEndCapture of capture c", id, " (", ModeName(c.mode), ", stream s",
                      c.stream, ") returned ", static_cast<int>(r), ": it was invalidated"));
  }
  const int gid = next_id_++;
  GraphM& gm = graphs_[gid];
  gm.id = gid;
  gm.graph = g;
  gm.effects = c.effects;
  gm.nodes = c.nodes;
  gm.runtimes = c.runtimes;
  last_graph_ = gid;
  Note(absl::StrCat("end capture c", id, " on t", thread, " -> graph g", gid, " of ", c.nodes, " nodes"));
  if (static_cast<int>(fake::GraphNodes(g).size()) != c.nodes) {
    Fail(absl::StrCat("the graph of capture c", id, " has ", fake::GraphNodes(g).size(),
                      " nodes; the model captured ", c.nodes, " launches"));
  }
  ReplaceHolder(absl::StrCat("cap:", id), absl::StrCat("g:", gid));
}

void Model::DestroyGraph(int id) {
  GraphM& g = graphs_.at(id);
  W(workers_.front()->id()).Run([&] {
    for (CUgraphExec e : g.execs) {
      if (Relaxed([&] { return D().GraphExecDestroy(e); }) != CUDA_SUCCESS) {
        Fail("cuGraphExecDestroy");
      }
    }
    if (g.graph != nullptr && D().GraphDestroy(g.graph) != CUDA_SUCCESS) Fail("cuGraphDestroy");
  });
  graphs_.erase(id);
  DropHolder(absl::StrCat("g:", id));
}

void Model::DestroyStep(int id) {
  W(workers_.front()->id()).Run([&] { steps_.at(id).g.reset(); });
  steps_.erase(id);
  DropHolder(absl::StrCat("sg:", id));
}

bool Model::OpDestroyRuntime() {
  // cuMemFree during another thread's global capture is refused (the arenas would leak):
  // the caller's doing, so not done here.
  if (runtimes_.empty() || AnyGlobalCapture()) return false;
  const int t = PickThread(true);
  if (t < 0) return false;
  const int id = PickRuntime();
  BeginOp("destroy runtime", t);
  Note(absl::StrCat("destroy runtime r", id, " and what depends on it, in a random order"));
  std::vector<int> ending;
  for (const auto& [cid, c] : captures_) {
    if (c.runtimes.contains(id)) ending.push_back(cid);
  }
  for (int cid : ending) {
    const CaptureM& c = captures_.at(cid);
    EndCapture(cid, c.mode == CU_STREAM_CAPTURE_MODE_RELAXED ? t : c.thread);
  }
  op_.thread = t;
  std::vector<std::pair<int, int>> first, second;
  for (const auto& [sid, s] : steps_) {
    if (s.runtime == id) first.push_back({0, sid});
  }
  for (const auto& [gid, g] : graphs_) {
    if (g.runtimes.contains(id)) first.push_back({1, gid});
  }
  for (const auto& [bid, b] : bounds_) {
    if (b.runtime == id) second.push_back({2, bid});
  }
  for (auto* list : {&first, &second}) {
    for (size_t i = list->size(); i > 1; --i) std::swap((*list)[i - 1], (*list)[rng_.Index(i)]);
    for (const std::pair<int, int>& item : *list) {
      const int kind = item.first, oid = item.second;
      if (kind == 0) {
        Note(absl::StrCat("  destroy step graph x", oid));
        DestroyStep(oid);
      } else if (kind == 1) {
        Note(absl::StrCat("  destroy graph g", oid));
        DestroyGraph(oid);
      } else {
        Note(absl::StrCat("  destroy bound launch l", oid));
        W(t).Run([&] { bounds_.at(oid).b.reset(); });
        bounds_.erase(oid);
      }
    }
  }
  W(t).Run([&] { runtimes_.at(id).rt.reset(); });
  runtimes_.erase(id);
  for (const auto& [a, alloc] : allocs_) {
    if (alloc.runtime == id && fake::AllocationId(alloc.p) == a) {
      Fail(absl::StrCat("runtime r", id, " destroyed, but its scratch allocation ", a, " (used by ",
                        absl::StrJoin(alloc.holders, ", "), ") is not freed"));
    }
  }
  for (auto* m : {&arena_lb_, &reserved_lb_}) {
    for (auto it = m->begin(); it != m->end();) {
      const bool mine = absl::StartsWith(it->first, absl::StrCat("st:", id, ":")) ||
                        absl::StartsWith(it->first, absl::StrCat("pt:", id, ":")) ||
                        it->first == absl::StrCat("lg:", id);
      it = mine ? m->erase(it) : std::next(it);
    }
  }
  arena_keys_.erase(id);
  op_.expected_records = 0;
  EndOp();
  return true;
}

bool Model::OpPreload() {
  const int r = PickRuntime();
  const int t = PickThread(true);
  if (r < 0 || t < 0) return false;
  RuntimeM& rt = runtimes_.at(r);
  const bool one = rng_.Percent(50);
  const int k = one ? std::next(rt.kernels.begin(), rng_.Index(rt.kernels.size()))->first : -1;
  Fault f = MaybeFault(15, {"LibraryLoadData", "LibraryGetKernel", "KernelGetFunction",
                            "KernelGetParamInfo", "KernelSetAttribute", "CtxGetDevice"});
  BeginOp("preload", t);
  Note(absl::StrCat(one ? absl::StrCat("r", r, ".", Kernels()[k].name, ".Preload()")
                        : absl::StrCat("r", r, ".Preload()"), f.Text()));
  const absl::Status s = Call(t, &f, [&] {
    return one ? rt.kernels.at(k).Preload() : rt.rt->Preload();
  });
  Expect e;
  e.allowed = {StatusCode::kFailedPrecondition};
  e.must_ok = !GlobalCaptureElsewhere(t);  // loading is forbidden then
  CheckStatus("Preload", s, e, f);
  if (s.ok()) {
    if (one) {
      rt.kernels_preloaded.insert(Kernels()[k].name);
    } else {
      rt.preloaded = true;
    }
  }
  op_.expected_records = 0;
  EndOp();
  return true;
}

bool Model::OpQuery() {
  const int r = PickRuntime();
  if (r < 0) return false;
  RuntimeM& rt = runtimes_.at(r);
  const auto& picked = *std::next(rt.kernels.begin(), rng_.Index(rt.kernels.size()));
  const int k = picked.first;
  const Kernel kernel = picked.second;
  const KernelDef& def = Kernels()[k];
  const int t = PickThread(false);
  BeginOp("query", t);
  op_.expected_records = 0;
  const int what = static_cast<int>(rng_.Range(0, 6));
  Expect e;
  absl::Status s;
  std::string text;
  std::vector<MArg> margs;
  bool explicit_grid;
  Grid grid;
  switch (what) {
    case 0:
      text = absl::StrCat("r", r, ".Find(\"no_such_kernel\")");
      e.must_fail = StatusCode::kNotFound;
      s = rt.rt->Find("no_such_kernel").status();
      break;
    case 1:
      text = absl::StrCat(def.name, ".ArgIndex(\"no_such_arg\")");
      e.must_fail = StatusCode::kNotFound;
      s = kernel.ArgIndex("no_such_arg").status();
      break;
    case 2: {
      const bool bad = rng_.Percent(40);
      StatusCode code = StatusCode::kOk;
      if (bad) {
        code = GenBadArgs(k, &margs);
      } else {
        GenArgs(k, &margs, &explicit_grid, &grid);
      }
      text = absl::StrCat(def.name, ".SelectVariant", ArgsText(margs));
      // The dispatch alone: a wrong count or arguments no variant takes fail; the other
      // arguments' types and ranges are a launch's checks (runtime.h).
      if (bad && margs.size() != kernel.num_args()) {
        e.must_fail = code;
      } else {
        e.allowed = {code};
      }
      e.must_ok = !bad;
      const std::vector<Arg> args = ToArgs(margs);
      s = kernel.SelectVariant(args).status();
      break;
    }
    case 3: {
      GenArgs(k, &margs, &explicit_grid, &grid);
      text = absl::StrCat(def.name, ".GridFor", ArgsText(margs));
      if (def.expr_grid) {
        e.must_ok = true;
      } else {
        e.must_fail = StatusCode::kFailedPrecondition;
      }
      const std::vector<Arg> args = ToArgs(margs);
      absl::StatusOr<Grid> g = kernel.GridFor(args);
      s = g.status();
      if (g.ok() && Programs(*g) != Programs(ExactGrid(k, margs, false, grid)) &&
          def.sem == Sem::kVectorAdd) {
        Fail(absl::StrCat(text, " = ", GridText(*g), "; the manifest says cdiv(n, 1024)"));
      }
      break;
    }
    case 4: {
      std::vector<std::string> names;
      for (const VariantInfo& v : kernel.info().variants) {
        if (rng_.Percent(50)) names.push_back(v.name);
      }
      if (rng_.Percent(10) && !names.empty()) names.push_back(names.front());  // twice
      const bool ignore = rng_.Percent(50);
      text = absl::StrCat(def.name, ".Restrict([", absl::StrJoin(names, ","), "], ignore_buckets=",
                          ignore, ")");
      e.allowed = {StatusCode::kInvalidArgument};
      absl::StatusOr<Kernel> view = kernel.Restrict(names, ignore);
      s = view.status();
      if (view.ok()) rt.views.push_back({k, *view});
      break;
    }
    case 5: {
      text = "Kernel().Launch(...)";
      e.must_fail = StatusCode::kFailedPrecondition;
      W(t).Run([&] { s = Kernel().Launch(Grid{1}, nullptr, 1); });
      break;
    }
    default: {
      text = absl::StrCat("r", r, " kernel_names, pack, info, variant_stats");
      if (rt.rt->kernel_names().size() != rt.rt->pack().kernels().size()) Fail("kernel_names");
      uint64_t launches = 0;
      for (const Kernel::VariantStats& v : kernel.variant_stats()) launches += v.launches;
      text += absl::StrCat(": ", def.name, " launched ", launches, " times");
      if (kernel.num_args() != kernel.info().call_params.size()) Fail("num_args");
      break;
    }
  }
  Note(absl::StrCat(text, " -> ", s.ok() ? "OK" : CodeName(s.code())));
  CheckStatus(text.c_str(), s, e, Fault());
  EndOp();
  return true;
}

// ---------------------------------------------------------------------------------------
// Operations: launches

bool Model::OpLaunch() {
  const int r = PickRuntime();
  if (r < 0) return false;
  RuntimeM& rt = runtimes_.at(r);
  int k;
  Kernel kernel;
  const bool view = !rt.views.empty() && rng_.Percent(20);
  if (view) {
    std::tie(k, kernel) = rng_.Pick(rt.views);
  } else {
    std::tie(k, kernel) = *std::next(rt.kernels.begin(), rng_.Index(rt.kernels.size()));
  }
  const KernelDef& def = Kernels()[k];
  StreamRef s;
  if (!PickStream(&s, true, true)) return false;
  const int t = PickThread(!Capturing(s));
  if (t < 0) return false;
  const bool valid = rng_.Percent(85);
  const bool by_name = !view && rng_.Percent(30);
  std::vector<MArg> margs;
  bool explicit_grid = false;
  Grid grid;
  StatusCode bad = StatusCode::kOk;
  if (valid) {
    GenArgs(k, &margs, &explicit_grid, &grid);
  } else {
    bad = GenBadArgs(k, &margs);
    explicit_grid = !def.expr_grid;
    grid = Grid{1};
  }
  const bool unknown_name = by_name && !valid && rng_.Percent(20);
  const int allocator = !by_name && def.scratch && rng_.Percent(30) ? (rng_.Percent(20) ? 2 : 1) : 0;
  const uint64_t programs = Programs(valid ? ExactGrid(k, margs, explicit_grid, grid) : grid);
  Fault f = MaybeFault(12, LaunchFaults());
  BeginOp("launch", t);
  op_.targets_capture = Capturing(s);
  op_.ctx = {r, t, ""};
  Note(absl::StrCat(valid ? "" : "(invalid) ",
                    by_name ? absl::StrCat("r", r, ".Launch(\"", unknown_name ? "nope" : def.name, "\", ")
                            : absl::StrCat(def.name, view ? "(view)" : "", ".Launch("),
                    explicit_grid ? absl::StrCat(GridText(grid), ", ") : "", StreamText(s), ", ",
                    ArgsText(margs), allocator ? absl::StrCat(", allocator ", allocator) : "", ")",
                    f.Text()));
  Expect e;
  if (!valid) {
    e.must_fail = unknown_name ? StatusCode::kNotFound : bad;
  } else {
    e = LaunchExpect(r, k, s, t, programs, allocator);
    if (view) {  // the view may not serve these arguments
      e.allowed.insert(StatusCode::kInvalidArgument);
      e.must_ok = false;
    }
  }
  const CUstream h = Handle(s);
  const absl::Status st = Call(t, &f, [&] {
    const std::vector<Arg> args = ToArgs(margs);
    const std::string name = unknown_name ? "nope" : def.name;
    if (by_name) {
      return explicit_grid ? rt.rt->LaunchArgs(name, grid, h, args) : rt.rt->LaunchArgs(name, h, args);
    }
    if (allocator != 0) {
      return explicit_grid ? kernel.LaunchArgs(grid, h, args, AllocatorFor(allocator))
                           : kernel.LaunchArgs(h, args, AllocatorFor(allocator));
    }
    return explicit_grid ? kernel.LaunchArgs(grid, h, args) : kernel.LaunchArgs(h, args);
  });
  CheckStatus("launch", st, e, f);
  const Grid exact = valid ? ExactGrid(k, margs, explicit_grid, grid) : grid;
  AfterLaunch(st.ok() && valid, r, k, s, t, programs, allocator, Effect{def.sem, margs, exact});
  if (!valid) op_.expected_records = 0;
  EndOp();
  return true;
}

bool Model::OpBind() {
  if (bounds_.size() >= 12) return false;
  const int r = PickRuntime();
  if (r < 0) return false;
  RuntimeM& rt = runtimes_.at(r);
  // Not from Restrict()ed views: a Set they refuse would leave the model's arguments
  // half changed.
  const bool view = false;
  const auto& picked = *std::next(rt.kernels.begin(), rng_.Index(rt.kernels.size()));
  const int k = picked.first;
  const Kernel kernel = picked.second;
  const KernelDef& def = Kernels()[k];
  StreamRef s;
  if (!PickStream(&s, rng_.Percent(15), true)) return false;
  const int t = PickThread(false);
  BoundM b;
  b.id = next_id_++;
  b.runtime = r;
  b.kernel = k;
  b.stream = s;
  const int variant = static_cast<int>(rng_.Range(0, 9));  // 0: bad args, 1: no grid, no expressions
  StatusCode bad = StatusCode::kOk;
  if (variant == 0) {
    bad = GenBadArgs(k, &b.args);
    b.explicit_grid = true;
    b.grid = Grid{1};
  } else {
    GenArgs(k, &b.args, &b.explicit_grid, &b.grid);
    if (variant == 1 && !def.expr_grid) b.explicit_grid = false;
  }
  BeginOp("bind", t);
  Note(absl::StrCat("l", b.id, " = ", def.name, view ? "(view)" : "", ".Bind(",
                    b.explicit_grid ? absl::StrCat(GridText(b.grid), ", ") : "", StreamText(s), ", ",
                    ArgsText(b.args), ")"));
  Expect e;
  if (variant == 0) {
    e.must_fail = bad;
  } else if (variant == 1 && !def.expr_grid) {
    e.must_fail = StatusCode::kFailedPrecondition;  // no grid expressions to evaluate
  } else if (view) {
    e.allowed = {StatusCode::kInvalidArgument};
  } else {
    e.must_ok = true;
  }
  absl::StatusOr<BoundLaunch> bound = absl::UnknownError("not run");
  const absl::Status st = Call(t, nullptr, [&] {
    const std::vector<Arg> args = ToArgs(b.args);
    bound = b.explicit_grid ? kernel.Bind(b.grid, Handle(s), args) : kernel.Bind(Handle(s), args);
    return bound.status();
  });
  CheckStatus("Bind", st, e, Fault());
  op_.expected_records = 0;
  if (st.ok()) {
    b.b = std::make_unique<BoundLaunch>(*std::move(bound));
    if (def.scratch && rng_.Percent(30)) {
      b.allocator = rng_.Percent(20) ? 2 : 1;
      b.b->set_scratch_allocator(AllocatorFor(b.allocator));
      Note(absl::StrCat("l", b.id, ".set_scratch_allocator(", b.allocator, ")"));
    }
    bounds_[b.id] = std::move(b);
  }
  EndOp();
  return true;
}

bool Model::OpSet() {
  if (bounds_.empty()) return false;
  BoundM& b = std::next(bounds_.begin(), rng_.Index(bounds_.size()))->second;
  const KernelDef& def = Kernels()[b.kernel];
  const int t = PickThread(false);
  BeginOp("set", t);
  op_.expected_records = 0;
  if (rng_.Percent(80)) {
    std::vector<MArg> fresh;
    bool explicit_grid;
    Grid grid;
    GenArgs(b.kernel, &fresh, &explicit_grid, &grid);
    std::vector<MArg> next = b.args;
    std::vector<size_t> changed;
    for (size_t i = 0; i < fresh.size(); ++i) {
      if (rng_.Percent(40)) {
        next[i] = fresh[i];
        changed.push_back(i);
      }
    }
    const Grid exact = ExactGrid(b.kernel, next, b.explicit_grid, b.grid);
    if (changed.empty() || !InBounds(memory_, def.sem, next, exact)) {
      next = fresh;
      changed.clear();
      for (size_t i = 0; i < fresh.size(); ++i) changed.push_back(i);
    }
    for (size_t i : changed) {
      Note(absl::StrCat("l", b.id, ".Set(", i, ", ", next[i].Text(), ")"));
      absl::Status st;
      W(t).Run([&] { st = b.b->Set(i, ToArg(next[i])); });
      Expect e;
      e.must_ok = true;
      CheckStatus("BoundLaunch::Set", st, e, Fault());
      b.args[i] = next[i];
    }
  } else {
    size_t index = rng_.Index(b.args.size());
    MArg value;
    Expect e;
    switch (rng_.Range(0, 2)) {
      case 0:
        index = b.args.size() + rng_.Index(3);
        value = MArg::I32(1);
        e.must_fail = StatusCode::kOutOfRange;
        break;
      case 1:
        index = 0;
        value = MArg::F32(2.5);  // every modeled kernel's first argument is a pointer
        e.must_fail = StatusCode::kInvalidArgument;
        break;
      default: {
        index = I32Index(def.sem);
        value = MArg::I64(int64_t{1} << 40);
        e.must_fail = StatusCode::kInvalidArgument;
        break;
      }
    }
    Note(absl::StrCat("l", b.id, ".Set(", index, ", ", value.Text(), ") (refused)"));
    absl::Status st;
    W(t).Run([&] { st = b.b->Set(index, ToArg(value)); });
    CheckStatus("BoundLaunch::Set", st, e, Fault());
  }
  EndOp();
  return true;
}

bool Model::OpBoundConfigure() {
  if (bounds_.empty()) return false;
  BoundM& b = std::next(bounds_.begin(), rng_.Index(bounds_.size()))->second;
  const KernelDef& def = Kernels()[b.kernel];
  const int t = PickThread(false);
  BeginOp("configure bound launch", t);
  op_.expected_records = 0;
  const int what = static_cast<int>(rng_.Range(0, 2));
  if (what == 0 && def.sem != Sem::kAxpy) {
    Grid g;
    if (def.sem == Sem::kScratch) {
      g = Grid{static_cast<uint32_t>(rng_.Range(0, 3)), static_cast<uint32_t>(rng_.Range(0, 3)), 1};
    } else {
      g = Grid{static_cast<uint32_t>(rng_.Range(0, 20)), static_cast<uint32_t>(rng_.Range(1, 2)), 1};
    }
    if (!InBounds(memory_, def.sem, b.args, g)) return false;
    Note(absl::StrCat("l", b.id, ".set_grid(", GridText(g), ")"));
    W(t).Run([&] { b.b->set_grid(g); });
    b.explicit_grid = true;
    b.grid = g;
  } else if (what == 1) {
    StreamRef s;
    if (!PickStream(&s, rng_.Percent(20), true)) return false;
    Note(absl::StrCat("l", b.id, ".set_stream(", StreamText(s), ")"));
    W(t).Run([&] { b.b->set_stream(Handle(s)); });
    b.stream = s;
  } else if (def.scratch) {
    b.allocator = static_cast<int>(rng_.Range(0, 2));
    Note(absl::StrCat("l", b.id, ".set_scratch_allocator(", b.allocator, ")"));
    W(t).Run([&] { b.b->set_scratch_allocator(AllocatorFor(b.allocator)); });
  } else {
    return false;
  }
  EndOp();
  return true;
}

bool Model::OpBoundLaunch(bool prepare) {
  if (bounds_.empty()) return false;
  BoundM& b = std::next(bounds_.begin(), rng_.Index(bounds_.size()))->second;
  const KernelDef& def = Kernels()[b.kernel];
  const StreamRef s = b.stream;
  const int t = PickThread(!Capturing(s));
  if (t < 0) return false;
  const Grid exact = ExactGrid(b.kernel, b.args, b.explicit_grid, b.grid);
  const uint64_t programs = Programs(exact);
  Fault f = MaybeFault(12, LaunchFaults());
  BeginOp(prepare ? "prepare bound launch" : "bound launch", t);
  op_.targets_capture = Capturing(s);
  op_.ctx = {b.runtime, t, ""};
  Note(absl::StrCat("l", b.id, prepare ? ".Prepare() + cuLaunchKernelEx" : ".Launch()", " (", def.name,
                    " on ", StreamText(s), ", ", ArgsText(b.args), ")", f.Text()));
  Expect e = LaunchExpect(b.runtime, b.kernel, s, t, programs, b.allocator);
  absl::Status st;
  CUresult sent = CUDA_SUCCESS;
  W(t).Run([&] {
    if (f.armed) fake::FailNext(f.fn, f.code, f.skip);
    if (!prepare) {
      st = b.b->Launch();
      f.fired = f.armed && fake::CancelFailures() == 0;
      fake::CancelFailures();
      return;
    }
    absl::StatusOr<PreparedLaunch> p = b.b->Prepare();
    f.fired = f.armed && fake::CancelFailures() == 0;
    fake::CancelFailures();
    st = p.status();
    if (p.ok() && p->function != nullptr) {
      sent = D().LaunchKernelEx(&p->config, p->function, nullptr, p->extra);
    }
  });
  CheckStatus(prepare ? "BoundLaunch::Prepare" : "BoundLaunch::Launch", st, e, f);
  if (sent != CUDA_SUCCESS) {
    Fail(absl::StrCat("cuLaunchKernelEx of what Prepare returned failed: ", static_cast<int>(sent)));
  }
  AfterLaunch(st.ok(), b.runtime, b.kernel, s, t, programs, b.allocator,
              Effect{def.sem, b.args, exact});
  EndOp();
  return true;
}

bool Model::OpDestroyBound() {
  std::vector<int> free;
  for (const auto& [id, b] : bounds_) {
    bool used = false;
    for (const auto& [sid, s] : steps_) {
      used |= std::find(s.bounds.begin(), s.bounds.end(), id) != s.bounds.end();
    }
    if (!used) free.push_back(id);
  }
  if (free.empty()) return false;
  const int id = rng_.Pick(free);
  const int t = PickThread(false);
  BeginOp("destroy bound launch", t);
  Note(absl::StrCat("destroy bound launch l", id));
  W(t).Run([&] { bounds_.at(id).b.reset(); });
  bounds_.erase(id);
  op_.expected_records = 0;
  EndOp();
  return true;
}

// ---------------------------------------------------------------------------------------
// Operations: streams and scratch

bool Model::OpStreamCreate() {
  if (streams_.size() >= 6) return false;
  const int t = PickThread(false);
  BeginOp("create stream", t);
  const int id = next_id_++;
  CUstream h = nullptr;
  W(t).Run([&] {
    if (D().StreamCreate(&h, 0) != CUDA_SUCCESS) Fail("cuStreamCreate");
  });
  streams_[id] = StreamM{id, h, -1};
  Note(absl::StrCat("s", id, " = cuStreamCreate() (", Hex(reinterpret_cast<uintptr_t>(h)), ")"));
  op_.expected_records = 0;
  EndOp();
  return true;
}

bool Model::OpStreamDestroy() {
  std::vector<int> ids;
  for (const auto& [id, s] : streams_) {
    if (s.capture < 0) ids.push_back(id);
  }
  if (ids.empty()) return false;
  const int id = rng_.Pick(ids);
  const int t = PickThread(false);
  BeginOp("destroy stream", t);
  Note(absl::StrCat("cuStreamDestroy(s", id, ") (its bound launches go to the null stream)"));
  for (auto& entry : bounds_) {
    BoundM& b = entry.second;
    if (b.stream.kind == StreamRef::kReal && b.stream.id == id) {
      W(t).Run([&] { b.b->set_stream(nullptr); });
      b.stream = {StreamRef::kNull, -1};
    }
  }
  W(t).Run([&] {
    if (D().StreamDestroy(streams_.at(id).h) != CUDA_SUCCESS) Fail("cuStreamDestroy");
  });
  streams_.erase(id);
  // kpack keeps a destroyed stream's arena until the runtime goes (or a new stream comes
  // with its handle): its key stays in arena_keys_; the model forgets its sizes.
  for (auto* m : {&arena_lb_, &reserved_lb_}) {
    for (auto it = m->begin(); it != m->end();) {
      const bool match = absl::StartsWith(it->first, "st:") &&
                         absl::EndsWith(it->first, absl::StrCat(":", id));
      it = match ? m->erase(it) : std::next(it);
    }
  }
  op_.expected_records = 0;
  EndOp();
  return true;
}

bool Model::OpReserve() {
  const int r = PickRuntime();
  StreamRef s;
  if (r < 0 || !PickStream(&s, rng_.Percent(20), true)) return false;
  const int t = PickThread(!Capturing(s));
  if (t < 0) return false;
  const uint64_t bytes = static_cast<uint64_t>(
      rng_.Pick(std::vector<int64_t>{0, 128, 256, 512, 1152, 4096, 8192, 20000}));
  Fault f = MaybeFault(12, {"MemAlloc", "StreamGetCtx", "StreamGetId", "StreamGetCaptureInfo",
                            "CtxPushCurrent", "CtxPopCurrent"});
  BeginOp("reserve scratch", t);
  op_.targets_capture = Capturing(s);
  Note(absl::StrCat("r", r, ".ReserveScratch(", StreamText(s), ", ", bytes, ")", f.Text()));
  Expect e;
  if (Capturing(s) && bytes > 0) {
    e.must_fail = StatusCode::kFailedPrecondition;
  } else if (Capturing(s)) {
    e.must_ok = true;  // nothing to reserve: a no-op on any stream (runtime.h)
  } else {
    e.allowed = {StatusCode::kFailedPrecondition, StatusCode::kResourceExhausted};
    // It may allocate, which another thread's global capture forbids.
    e.must_ok = bytes == 0 || !GlobalCaptureElsewhere(t);
  }
  const CUstream h = Handle(s);
  const absl::Status st = Call(t, &f, [&] { return runtimes_.at(r).rt->ReserveScratch(h, bytes); });
  CheckStatus("ReserveScratch", st, e, f);
  const std::string key = StreamKey(r, s, t);
  if (bytes > 0 && !Capturing(s)) {
    arena_keys_[r].insert(key);  // even a failed reservation may have grown the arena
    if (st.ok()) {
      arena_lb_[key] = std::max(arena_lb_[key], bytes);
      if (s.kind == StreamRef::kReal) reserved_lb_[key] = std::max(reserved_lb_[key], bytes);
    } else {
      reserved_lb_.erase(key);
    }
  }
  op_.expected_records = 0;
  EndOp();
  return true;
}

bool Model::OpRelease() {
  const int r = PickRuntime();
  StreamRef s;
  if (r < 0 || !PickStream(&s, rng_.Percent(15), true)) return false;
  const int t = PickThread(!Capturing(s));
  if (t < 0) return false;
  Fault f = MaybeFault(10, {"MemFree", "StreamGetCtx", "StreamGetId", "CtxGetId"});
  BeginOp("release scratch", t);
  op_.targets_capture = Capturing(s);
  Note(absl::StrCat("r", r, ".ReleaseScratch(", StreamText(s), ")", f.Text()));
  Expect e;
  if (Capturing(s)) {
    e.must_fail = StatusCode::kFailedPrecondition;
  } else {
    e.must_ok = true;
  }
  const CUstream h = Handle(s);
  const absl::Status st = Call(t, &f, [&] { return runtimes_.at(r).rt->ReleaseScratch(h); });
  CheckStatus("ReleaseScratch", st, e, f);
  if (st.ok() && !Capturing(s)) {
    const std::string key = StreamKey(r, s, t);
    // Freed now, unless the driver refused cuMemFree (a global capture, a fault): then
    // the runtime frees it at its end.
    if (!AnyGlobalCapture() && !f.fired) {
      for (const auto& [a, alloc] : allocs_) {
        if (alloc.holders.contains(key) && fake::AllocationId(alloc.p) == a) {
          Fail(absl::StrCat("ReleaseScratch(", StreamText(s), ") returned OK, but the stream's "
                            "scratch allocation ", a, " is not freed"));
        }
      }
    }
    DropHolder(key);
    arena_lb_.erase(key);
    reserved_lb_.erase(key);
    arena_keys_[r].erase(key);
  }
  op_.expected_records = 0;
  EndOp();
  return true;
}

// ---------------------------------------------------------------------------------------
// Operations: captures and captured graphs

bool Model::OpCaptureBegin() {
  if (captures_.size() >= 3) return false;
  std::vector<int> ids;
  for (const auto& [id, s] : streams_) {
    if (s.capture < 0) ids.push_back(id);
  }
  if (ids.empty()) return false;
  const int sid = focus_stream_.has_value() ? focus_stream_->id : rng_.Pick(ids);
  const int t = focus_thread_ >= 0 ? focus_thread_ : PickThread(false);
  const CUstreamCaptureMode mode = rng_.Pick(std::vector<CUstreamCaptureMode>{
      CU_STREAM_CAPTURE_MODE_GLOBAL, CU_STREAM_CAPTURE_MODE_GLOBAL,
      CU_STREAM_CAPTURE_MODE_THREAD_LOCAL, CU_STREAM_CAPTURE_MODE_RELAXED});
  BeginOp("begin capture", t);
  op_.expected_records = 0;
  // As runtime.h asks before a capture: Preload and ReserveScratch (half the time; the
  // other half tests the refusals).
  const int r = PickRuntime();
  if (r >= 0 && rng_.Percent(50) && !OwnNonRelaxedCapture(t) && !GlobalCaptureElsewhere(t)) {
    const uint64_t bytes = static_cast<uint64_t>(rng_.Pick(std::vector<int64_t>{128, 1152, 4096}));
    Note(absl::StrCat("r", r, ".Preload(); r", r, ".ReserveScratch(s", sid, ", ", bytes, ")"));
    absl::Status a, b;
    W(t).Run([&] {
      a = runtimes_.at(r).rt->Preload();
      b = runtimes_.at(r).rt->ReserveScratch(streams_.at(sid).h, bytes);
    });
    Expect e;
    e.must_ok = true;
    CheckStatus("Preload", a, e, Fault());
    CheckStatus("ReserveScratch", b, e, Fault());
    runtimes_.at(r).preloaded = true;
    const std::string key = StreamKey(r, {StreamRef::kReal, sid}, t);
    arena_keys_[r].insert(key);
    arena_lb_[key] = std::max(arena_lb_[key], bytes);
    reserved_lb_[key] = std::max(reserved_lb_[key], bytes);
  }
  const int id = next_id_++;
  CUresult res = CUDA_SUCCESS;
  W(t).Run([&] { res = D().StreamBeginCapture(streams_.at(sid).h, mode); });
  if (res != CUDA_SUCCESS) Fail(absl::StrCat("cuStreamBeginCapture: ", static_cast<int>(res)));
  CaptureM c;
  c.id = id;
  c.stream = sid;
  c.thread = t;
  c.mode = mode;
  captures_[id] = c;
  streams_.at(sid).capture = id;
  last_capture_ = id;
  Note(absl::StrCat("c", id, " = cuStreamBeginCapture(s", sid, ", ", ModeName(mode), ")"));
  EndOp();
  return true;
}

bool Model::OpCaptureEnd() {
  if (captures_.empty()) return false;
  const int id = focus_capture_ >= 0 ? focus_capture_
                                     : std::next(captures_.begin(), rng_.Index(captures_.size()))->first;
  const CaptureM& c = captures_.at(id);
  const int t = c.mode == CU_STREAM_CAPTURE_MODE_RELAXED ? PickThread(false) : c.thread;
  BeginOp("end capture", t);
  EndCapture(id, t);
  op_.expected_records = 0;
  EndOp();
  return true;
}

bool Model::OpGraphInstantiate() {
  std::vector<int> ids;
  for (const auto& [id, g] : graphs_) {
    if (g.graph != nullptr && g.execs.size() < 2) ids.push_back(id);
  }
  if (ids.empty()) return false;
  const int id = focus_graph_ >= 0 ? focus_graph_ : rng_.Pick(ids);
  const int t = PickThread(false);
  BeginOp("instantiate graph", t);
  Note(absl::StrCat("cuGraphInstantiate(g", id, ")"));
  CUgraphExec exec = nullptr;
  W(t).Run([&] {
    if (Relaxed([&] { return D().GraphInstantiateWithFlags(&exec, graphs_.at(id).graph, 0); }) !=
        CUDA_SUCCESS) {
      Fail("cuGraphInstantiateWithFlags");
    }
  });
  graphs_.at(id).execs.push_back(exec);
  op_.expected_records = 0;
  EndOp();
  return true;
}

bool Model::OpGraphLaunch() {
  std::vector<int> ids;
  for (const auto& [id, g] : graphs_) {
    bool alive = !g.execs.empty();
    for (int r : g.runtimes) alive &= runtimes_.contains(r);  // their kernels must live
    if (alive) ids.push_back(id);
  }
  // Not into a capture: the driver refuses to capture a graph launch (and invalidates the
  // capture), the caller's mistake.
  StreamRef s;
  if (ids.empty() || !PickStream(&s, false, true)) return false;
  const int id = focus_graph_ >= 0 ? focus_graph_ : rng_.Pick(ids);
  if (std::find(ids.begin(), ids.end(), id) == ids.end()) return false;
  GraphM& g = graphs_.at(id);
  const CUgraphExec exec = rng_.Pick(g.execs);
  const int t = PickThread(false);
  BeginOp("launch graph", t);
  op_.ctx = {-1, t, absl::StrCat("g:", id)};
  Note(absl::StrCat("cuGraphLaunch(g", id, ", ", StreamText(s), ")"));
  CUresult res = CUDA_SUCCESS;
  W(t).Run([&] { res = D().GraphLaunch(exec, Handle(s)); });
  if (res != CUDA_SUCCESS) Fail(absl::StrCat("cuGraphLaunch: ", static_cast<int>(res)));
  for (const Effect& e : g.effects) Emit(s, e);
  op_.expected_records = g.nodes;
  EndOp();
  return true;
}

bool Model::OpGraphDestroy() {
  if (graphs_.empty()) return false;
  const int id = focus_graph_ >= 0 ? focus_graph_
                                   : std::next(graphs_.begin(), rng_.Index(graphs_.size()))->first;
  GraphM& g = graphs_.at(id);
  const int t = PickThread(false);
  BeginOp("destroy graph", t);
  op_.expected_records = 0;
  if (!g.execs.empty() && (g.graph == nullptr || rng_.Percent(50))) {
    const size_t i = rng_.Index(g.execs.size());
    Note(absl::StrCat("cuGraphExecDestroy(an executable of g", id, ")"));
    W(t).Run([&] {
      if (Relaxed([&] { return D().GraphExecDestroy(g.execs[i]); }) != CUDA_SUCCESS) {
        Fail("cuGraphExecDestroy");
      }
    });
    g.execs.erase(g.execs.begin() + static_cast<std::ptrdiff_t>(i));
  } else if (g.graph != nullptr) {
    Note(absl::StrCat("cuGraphDestroy(g", id, ")"));
    W(t).Run([&] {
      if (D().GraphDestroy(g.graph) != CUDA_SUCCESS) Fail("cuGraphDestroy");
    });
    g.graph = nullptr;
  }
  if (g.graph == nullptr && g.execs.empty()) {
    graphs_.erase(id);
    DropHolder(absl::StrCat("g:", id));
  }
  EndOp();
  return true;
}

// ---------------------------------------------------------------------------------------
// Operations: StepGraphs

bool Model::OpStepCreate() {
  if (steps_.size() >= 5) return false;
  std::map<int, std::vector<int>> by_runtime;
  for (const auto& [id, b] : bounds_) by_runtime[b.runtime].push_back(id);
  if (by_runtime.empty()) return false;
  const int r = std::next(by_runtime.begin(), rng_.Index(by_runtime.size()))->first;
  std::vector<int> pool = by_runtime.at(r);
  for (size_t i = pool.size(); i > 1; --i) std::swap(pool[i - 1], pool[rng_.Index(i)]);
  pool.resize(std::min<size_t>(pool.size(), static_cast<size_t>(rng_.Range(1, 4))));
  StepM x;
  x.id = next_id_++;
  x.runtime = r;
  x.bounds = pool;
  x.unseen = rng_.Pick(std::vector<StepGraph::Unseen>{
      StepGraph::Unseen::kBuild, StepGraph::Unseen::kBuild, StepGraph::Unseen::kBuild,
      StepGraph::Unseen::kError, StepGraph::Unseen::kLaunchEagerly});
  x.max_graphs = static_cast<size_t>(rng_.Pick(std::vector<int64_t>{256, 256, 256, 1, 2, 3}));
  std::vector<BoundLaunch*> step;
  for (int id : x.bounds) step.push_back(bounds_.at(id).b.get());
  // 1 in 8: a step the header refuses.
  const int bad = rng_.Percent(12) ? static_cast<int>(rng_.Range(0, 3)) : -1;
  std::string why;
  if (bad == 0) {
    step.clear();
    why = " (empty)";
  } else if (bad == 1) {
    step.push_back(step.front());
    why = " (a launch twice)";
  } else if (bad == 2) {
    step.insert(step.begin() + static_cast<std::ptrdiff_t>(rng_.Index(step.size())), nullptr);
    why = " (a null launch)";
  } else if (bad == 3) {
    int other = -1;
    for (const auto& [rid, ids] : by_runtime) {
      if (rid != r) other = ids.front();
    }
    if (other < 0) return false;
    step.push_back(bounds_.at(other).b.get());
    why = " (launches of two runtimes)";
  }
  const int t = PickThread(false);
  BeginOp("create step graph", t);
  op_.expected_records = 0;
  std::vector<std::string> names;
  for (int id : x.bounds) names.push_back(absl::StrCat("l", id));
  Note(absl::StrCat("x", x.id, " = StepGraph::Create([", absl::StrJoin(names, ", "), "]", why,
                    ", unseen=", UnseenName(x.unseen), ", max_graphs=", x.max_graphs, ")"));
  StepGraph::Options options;
  options.unseen = x.unseen;
  options.max_graphs = x.max_graphs;
  absl::StatusOr<StepGraph> g = absl::UnknownError("not run");
  const absl::Status st = Call(t, nullptr, [&] {
    g = StepGraph::Create(step, options);
    return g.status();
  });
  Expect e;
  if (bad >= 0) {
    e.must_fail = StatusCode::kInvalidArgument;
  } else {
    e.must_ok = true;
  }
  CheckStatus("StepGraph::Create", st, e, Fault());
  if (st.ok()) {
    x.g = std::make_unique<StepGraph>(*std::move(g));
    steps_[x.id] = std::move(x);
  }
  EndOp();
  return true;
}

bool Model::OpStepBuildOrReplay(bool replay) {
  if (steps_.empty()) return false;
  StepM& x = focus_step_ >= 0 ? steps_.at(focus_step_)
                              : std::next(steps_.begin(), rng_.Index(steps_.size()))->second;
  StreamRef s;
  if (replay && focus_stream_.has_value()) {
    s = *focus_stream_;
  } else if (replay && !PickStream(&s, rng_.Percent(50), true)) {
    return false;
  }
  const bool capturing = replay && Capturing(s);
  // graph.h: Build "works while any thread captures any stream"; a replay that builds
  // too; a replay on a capturing stream sends its launches into the capture.
  const int t = focus_thread_ >= 0 ? focus_thread_ : PickThread(replay && !capturing);
  if (t < 0) return false;
  const absl::StatusOr<std::string> sig = x.g->Signature();
  const std::vector<StepGraph::GraphInfo> before = x.g->graphs();
  const StepGraph::Stats stats_before = x.g->stats();
  bool is_new = sig.ok();
  for (const StepGraph::GraphInfo& info : before) is_new &= !(sig.ok() && info.signature == *sig);
  // The launches, in order: their exact grids decide which are sent (a graph has a node
  // exactly for each launch with a non-empty grid, as eagerly).
  struct L {
    BoundM* b;
    Grid exact;
    uint64_t programs;
  };
  std::vector<L> launches;
  int64_t nodes = 0;
  for (int id : x.bounds) {
    BoundM& b = bounds_.at(id);
    const Grid exact = ExactGrid(b.kernel, b.args, b.explicit_grid, b.grid);
    launches.push_back({&b, exact, Programs(exact)});
    nodes += Programs(exact) > 0;
  }
  // Sent launch by launch: eagerly for an unseen signature with kLaunchEagerly, and into
  // the capture on a capturing stream (whatever Unseen says).
  const bool eager = replay && sig.ok() &&
                     (capturing || (is_new && x.unseen == StepGraph::Unseen::kLaunchEagerly));
  for (const auto& [i, pin] : x.pins) {
    const BoundM& b = bounds_.at(x.bounds[i]);
    const Grid own = ExactGrid(b.kernel, b.args, false, b.grid);
    if (b.explicit_grid && Programs(b.grid) < Programs(own) && Skip("pin-below-expressions")) {
      return false;
    }
  }
  Expect e;
  e.allowed = {StatusCode::kInvalidArgument, StatusCode::kFailedPrecondition,
               StatusCode::kResourceExhausted};
  if (!sig.ok()) {
    e.must_fail = sig.status().code();  // "the error Replay would give"
  } else if (eager) {
    // Every launch prepared before any is sent: each as a launch on `s` would be (into a
    // capture: the variants loaded, the scratch from the allocator or the capture's arena).
    e.must_ok = true;
    std::map<int, uint64_t> arena;  // a capture arena each runtime takes on the way
    for (const L& l : launches) {
      Expect le = LaunchExpect(l.b->runtime, l.b->kernel, s, t, l.programs, l.b->allocator);
      const KernelDef& def = Kernels()[l.b->kernel];
      if (capturing && def.scratch && l.programs > 0 && l.b->allocator == 0 &&
          !runtimes_.at(l.b->runtime).options_allocator) {
        // The first such launch of a runtime takes the capture's arena (known, or the
        // reservation if it fits, or an idle one of at least its need); the next share it.
        const uint64_t need = l.programs * kScratchPerProgram;
        const CaptureM& c = captures_.at(streams_.at(s.id).capture);
        auto it = arena.find(l.b->runtime);
        if (it != arena.end()) {
          const RuntimeM& r = runtimes_.at(l.b->runtime);
          le.must_ok = (r.preloaded || r.kernels_preloaded.contains(def.name)) &&
                       need <= it->second;
        } else if (auto known = c.arena.find(l.b->runtime); known != c.arena.end()) {
          arena[l.b->runtime] = known->second;
        } else {
          auto res = reserved_lb_.find(StreamKey(l.b->runtime, s, t));
          arena[l.b->runtime] =
              res != reserved_lb_.end() && need <= res->second ? res->second : need;
        }
      }
      if (le.must_fail.has_value()) {
        e.must_fail.reset();
        e.allowed.insert(*le.must_fail);
      }
      e.must_ok &= le.must_ok && !le.must_fail.has_value();
    }
  } else if (!replay || (is_new && x.unseen == StepGraph::Unseen::kBuild)) {
    if (is_new && before.size() >= x.max_graphs) {
      e.must_fail = StatusCode::kResourceExhausted;
    } else {
      e.must_ok = true;  // graph.h: whatever any thread captures
    }
  } else if (is_new && x.unseen == StepGraph::Unseen::kError) {
    e.must_fail = StatusCode::kFailedPrecondition;
  } else {
    e.must_ok = true;
  }
  Fault f = MaybeFault(12, {"LaunchKernelEx", "GraphLaunch", "GraphExecKernelNodeSetParams",
                            "GraphCreate", "GraphAddKernelNode", "GraphInstantiateWithFlags",
                            "MemAlloc", "UserObjectCreate", "GraphRetainUserObject",
                            "StreamGetCaptureInfo", "StreamIsCapturing"});
  BeginOp(replay ? "replay step graph" : "build step graph", t);
  op_.targets_capture = capturing;
  op_.ctx = {x.runtime, t, absl::StrCat("sg:", x.id)};
  std::vector<std::string> state;
  for (const L& l : launches) {
    state.push_back(absl::StrCat("l", l.b->id, Kernels()[l.b->kernel].name, ArgsText(l.b->args),
                                 GridText(l.exact)));
  }
  Note(absl::StrCat("x", x.id, replay ? absl::StrCat(".Replay(", StreamText(s), ")") : ".Build()",
                    " signature ", sig.ok() ? *sig : sig.status().ToString(),
                    is_new ? " (new)" : " (built)", ", unseen=", UnseenName(x.unseen), "; ",
                    absl::StrJoin(state, "; "), f.Text()));
  const CUstream h = replay ? Handle(s) : nullptr;
  const absl::Status st = Call(t, &f, [&] { return replay ? x.g->Replay(h) : x.g->Build(); });
  CheckStatus(replay ? "StepGraph::Replay" : "StepGraph::Build", st, e, f);
  // Its graphs and counters.
  const std::vector<StepGraph::GraphInfo> after = x.g->graphs();
  const StepGraph::Stats stats = x.g->stats();
  const bool building = sig.ok() && is_new && !eager &&
                        (!replay || x.unseen == StepGraph::Unseen::kBuild);
  // A replay that fails after building (patching or launching) may keep what it built.
  const bool built = building && (st.ok() || after.size() == before.size() + 1);
  if (after.size() != before.size() + (built ? 1 : 0) ||
      stats.graphs_built != stats_before.graphs_built + (built ? 1 : 0)) {
    Fail(absl::StrCat("the step graph holds ", after.size(), " graphs (", stats.graphs_built,
                      " built); it held ", before.size(), " and this ", st.ok() ? "" : "failed ",
                      "call should have built ", built ? 1 : 0));
  }
  const bool ok_replay = replay && st.ok();
  if (stats.replays != stats_before.replays + (ok_replay && !eager ? 1 : 0) ||
      stats.eager_steps != stats_before.eager_steps + (ok_replay && eager && !capturing ? 1 : 0) ||
      stats.captured_steps != stats_before.captured_steps + (ok_replay && capturing ? 1 : 0)) {
    Fail(absl::StrCat("step graph counters: replays ", stats_before.replays, " -> ", stats.replays,
                      ", eager_steps ", stats_before.eager_steps, " -> ", stats.eager_steps,
                      ", captured_steps ", stats_before.captured_steps, " -> ",
                      stats.captured_steps));
  }
  if (capturing) captures_.at(streams_.at(s.id).capture).runtimes.insert(x.runtime);
  op_.expected_records = 0;
  // Sent: all on success; on failure nothing, except that a driver refusing
  // cuLaunchKernelEx part-way through an eager step leaves the launches before it sent.
  int64_t sent = replay && st.ok() ? nodes : 0;
  if (!st.ok() && eager && f.fired && f.fn == "LaunchKernelEx") {
    sent = fake::LaunchCount() - op_.launch_mark;
    if (sent >= nodes) Fail(absl::StrCat("a failed step sent all its ", nodes, " launches"));
  }
  if (replay && sent > 0) {
    int64_t left = sent;
    for (const L& l : launches) {
      if (l.programs == 0) continue;
      if (left-- == 0) break;
      const Effect effect{Kernels()[l.b->kernel].sem, l.b->args, l.exact};
      if (eager) {
        AfterLaunch(true, l.b->runtime, l.b->kernel, s, t, l.programs, l.b->allocator, effect);
      } else {
        Emit(s, effect);
      }
    }
  }
  if (eager && capturing && !st.ok()) {
    // A refused captured step may have taken the capture's reservation.
    for (const L& l : launches) reserved_lb_.erase(StreamKey(l.b->runtime, s, t));
  }
  op_.expected_records = sent;
  EndOp();
  return true;
}

bool Model::OpStepConfigure() {
  if (steps_.empty()) return false;
  StepM& x = std::next(steps_.begin(), rng_.Index(steps_.size()))->second;
  const int t = PickThread(false);
  BeginOp("configure step graph", t);
  op_.expected_records = 0;
  if (rng_.Percent(40)) {
    x.unseen = rng_.Pick(std::vector<StepGraph::Unseen>{
        StepGraph::Unseen::kBuild, StepGraph::Unseen::kError, StepGraph::Unseen::kLaunchEagerly});
    Note(absl::StrCat("x", x.id, ".set_unseen(", UnseenName(x.unseen), ")"));
    W(t).Run([&] { x.g->set_unseen(x.unseen); });
  } else if (rng_.Percent(70)) {
    const size_t i = rng_.Index(x.bounds.size() + 1);
    Grid g{static_cast<uint32_t>(rng_.Pick(std::vector<int64_t>{0, 1, 4, 16, 64, 300})), 1, 1};
    Expect e;
    if (i >= x.bounds.size() || g.x == 0 || !Kernels()[bounds_.at(x.bounds[i]).kernel].tolerant) {
      e.must_fail = StatusCode::kInvalidArgument;
    } else {
      e.must_ok = true;
    }
    Note(absl::StrCat("x", x.id, ".PinGrid(", i, ", ", GridText(g), ")"));
    absl::Status st;
    W(t).Run([&] { st = x.g->PinGrid(i, g); });
    CheckStatus("StepGraph::PinGrid", st, e, Fault());
    if (st.ok()) x.pins[i] = g;
  } else {
    const absl::StatusOr<std::string> sig = x.g->Signature();
    const StepGraph::Stats stats = x.g->stats();
    const std::vector<StepGraph::GraphInfo> graphs = x.g->graphs();
    uint64_t replays = 0, scratch = 0;
    for (const StepGraph::GraphInfo& info : graphs) {
      replays += info.replays;
      scratch += info.scratch_bytes;
    }
    Note(absl::StrCat("x", x.id, " signature ", sig.ok() ? *sig : sig.status().ToString(), ", ",
                      graphs.size(), " graphs, ", stats.replays, " replays"));
    if (stats.graphs_built != graphs.size() || stats.replays != replays ||
        stats.scratch_bytes != scratch) {
      Fail(absl::StrCat("x", x.id, ": stats() disagree with graphs(): built ", stats.graphs_built,
                        " vs ", graphs.size(), ", replays ", stats.replays, " vs ", replays,
                        ", scratch bytes ", stats.scratch_bytes, " vs ", scratch));
    }
  }
  EndOp();
  return true;
}

bool Model::OpStepDestroy() {
  if (steps_.empty()) return false;
  const int id = focus_step_ >= 0 ? focus_step_
                                  : std::next(steps_.begin(), rng_.Index(steps_.size()))->first;
  const int t = PickThread(false);
  BeginOp("destroy step graph", t);
  Note(absl::StrCat("destroy step graph x", id));
  W(t).Run([&] { steps_.at(id).g.reset(); });
  steps_.erase(id);
  DropHolder(absl::StrCat("sg:", id));
  op_.expected_records = 0;
  EndOp();
  return true;
}

// A serving engine's step, as issue 23 describes it: a StepGraph built ahead, replayed
// inside the engine's own capture, the captured graph instantiated and launched, and then
// the StepGraph and the captured graph destroyed in either order (the captured graph
// launched once more in between when it outlives the StepGraph). Each part is an
// operation of its own, checked like any other.
bool Model::OpServeScenario() {
  std::vector<int> candidates;
  for (const auto& [id, x] : steps_) {
    for (int b : x.bounds) {
      if (Kernels()[bounds_.at(b).kernel].scratch) candidates.push_back(id);
    }
  }
  if (candidates.empty()) {
    for (const auto& [id, x] : steps_) candidates.push_back(id);
  }
  std::vector<int> free;
  for (const auto& [id, s] : streams_) {
    if (s.capture < 0) free.push_back(id);
  }
  const int t = PickThread(true);
  if (candidates.empty() || free.empty() || captures_.size() >= 3 || t < 0) return false;
  const int x = rng_.Pick(candidates);
  const int sid = rng_.Pick(free);
  const bool step_first = rng_.Percent(50);
  Note(absl::StrCat("scenario: x", x, " built, replayed inside a capture on s", sid, ", then ",
                    step_first ? "the step graph destroyed before" : "after", " the captured graph"));
  struct Reset {
    Model* m;
    ~Reset() {
      m->focus_step_ = m->focus_thread_ = m->focus_capture_ = m->focus_graph_ = -1;
      m->focus_stream_.reset();
    }
  } reset{this};
  focus_step_ = x;
  focus_thread_ = t;
  if (!OpStepBuildOrReplay(false)) return true;
  focus_stream_ = StreamRef{StreamRef::kReal, sid};
  last_capture_ = -1;
  if (!OpCaptureBegin() || last_capture_ < 0) return true;
  ++op_index_;
  if (!OpStepBuildOrReplay(true)) return true;
  focus_capture_ = last_capture_;
  focus_thread_ = -1;
  focus_stream_.reset();
  last_graph_ = -1;
  ++op_index_;
  if (!OpCaptureEnd() || last_graph_ < 0) return true;
  focus_graph_ = last_graph_;
  ++op_index_;
  if (!OpGraphInstantiate()) return true;
  ++op_index_;
  OpGraphLaunch();
  ++op_index_;
  if (step_first) {
    OpStepDestroy();
    ++op_index_;
    OpGraphLaunch();
    ++op_index_;
  }
  while (graphs_.contains(focus_graph_)) OpGraphDestroy();
  if (!step_first && steps_.contains(x)) {
    ++op_index_;
    OpStepDestroy();
  }
  return true;
}

// ---------------------------------------------------------------------------------------
// Operations: threads

// A thread that launched on CU_STREAM_PER_THREAD is gone: runtime.h keys those arenas per
// thread, and a gone thread's must not be kept (issue 23.6).
void Model::ThreadExited(int thread) {
  if (Skip("thread-exit")) return;
  const std::string suffix = absl::StrCat(":", thread);
  std::set<std::string> keys;
  for (auto& [r, set] : arena_keys_) {
    for (auto it = set.begin(); it != set.end();) {
      if (absl::StartsWith(*it, "pt:") && absl::EndsWith(*it, suffix)) {
        keys.insert(*it);
        it = set.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (const std::string& key : keys) {
    arena_lb_.erase(key);
    // cuMemFree is refused during another thread's global capture: then it may wait.
    if (AnyGlobalCapture()) continue;
    for (const auto& [a, alloc] : allocs_) {
      if (alloc.holders.contains(key) && fake::AllocationId(alloc.p) == a) {
        Fail(absl::StrCat("thread t", thread, " exited, but its CU_STREAM_PER_THREAD scratch "
                          "allocation ", a, " (", key, ") is still allocated"));
      }
    }
  }
  for (const std::string& key : keys) DropHolder(key);
}

bool Model::OpShortThread() {
  const int r = rng_.Percent(70) && PickRuntime("testpack") >= 0 ? PickRuntime("testpack") : PickRuntime();
  if (r < 0) return false;
  RuntimeM& rt = runtimes_.at(r);
  const int t = next_thread_++;
  struct Plan {
    int k;
    StreamRef s;
    std::vector<MArg> args;
    bool explicit_grid;
    Grid grid;
    Grid exact;
    absl::Status status;
  };
  std::vector<Plan> plan(static_cast<size_t>(rng_.Range(1, 3)));
  for (Plan& p : plan) {
    const bool scratch = rt.kernels.contains(3) && rng_.Percent(70);
    p.k = scratch ? 3 : std::next(rt.kernels.begin(), rng_.Index(rt.kernels.size()))->first;
    p.s = rng_.Percent(75) ? StreamRef{StreamRef::kPerThread, -1} : StreamRef{StreamRef::kNull, -1};
    GenArgs(p.k, &p.args, &p.explicit_grid, &p.grid);
    p.exact = ExactGrid(p.k, p.args, p.explicit_grid, p.grid);
  }
  const bool release = rng_.Percent(30);
  BeginOp("short-lived thread", t);
  op_.ctx = {r, t, ""};
  std::vector<std::string> text;
  for (const Plan& p : plan) {
    text.push_back(absl::StrCat(Kernels()[p.k].name, ".Launch(",
                                p.explicit_grid ? absl::StrCat(GridText(p.grid), ", ") : "",
                                StreamText(p.s), ", ", ArgsText(p.args), ")"));
  }
  Note(absl::StrCat("new thread t", t, ": ", absl::StrJoin(text, "; "),
                    release ? "; ReleaseScratch(per_thread)" : "", "; exit"));
  absl::Status released;
  // The launches' records are read on the thread (the main thread waits), before a
  // release frees the arena they used.
  RunOnNewThread(true, [&] {
    int64_t records = 0;
    for (Plan& p : plan) {
      const std::vector<Arg> args = ToArgs(p.args);
      const Kernel& kernel = rt.kernels.at(p.k);
      p.status = p.explicit_grid ? kernel.LaunchArgs(p.grid, Handle(p.s), args)
                                 : kernel.LaunchArgs(Handle(p.s), args);
      const Expect e = LaunchExpect(r, p.k, p.s, t, Programs(p.exact), 0);
      CheckStatus("launch on a short-lived thread", p.status, e, Fault());
      AfterLaunch(p.status.ok(), r, p.k, p.s, t, Programs(p.exact), 0,
                  Effect{Kernels()[p.k].sem, p.args, p.exact});
      records += op_.expected_records;
    }
    op_.expected_records = records;
    ScanRecords();
    op_.launch_mark = fake::LaunchCount();
    op_.expected_records = 0;
    if (!release) return;
    released = rt.rt->ReleaseScratch(CU_STREAM_PER_THREAD);
    Expect e;
    e.must_ok = true;
    CheckStatus("ReleaseScratch(CU_STREAM_PER_THREAD)", released, e, Fault());
    const std::string key = StreamKey(r, {StreamRef::kPerThread, -1}, t);
    arena_keys_[r].erase(key);
    arena_lb_.erase(key);
    DropHolder(key);
  });
  ThreadExited(t);
  EndOp();
  return true;
}

bool Model::OpNoContext() {
  const int r = PickRuntime();
  if (r < 0) return false;
  RuntimeM& rt = runtimes_.at(r);
  const int what = static_cast<int>(rng_.Range(0, 6));
  const int t = next_thread_++;
  BeginOp("thread without a context", t);
  op_.expected_records = 0;
  std::function<absl::Status()> call;
  std::string text;
  std::vector<MArg> margs;
  bool explicit_grid;
  Grid grid;
  const auto& picked = *std::next(rt.kernels.begin(), rng_.Index(rt.kernels.size()));
  const int k = picked.first;
  const Kernel kernel = picked.second;
  GenArgs(k, &margs, &explicit_grid, &grid);
  std::vector<int> my_bounds;
  for (const auto& [id, b] : bounds_) {
    if (b.runtime == r) my_bounds.push_back(id);
  }
  std::vector<int> my_steps;
  for (const auto& [id, x] : steps_) my_steps.push_back(id);
  bool empty_grid = false;
  if (what == 0 || (what >= 3 && my_bounds.empty()) || (what >= 5 && my_steps.empty())) {
    text = absl::StrCat(Kernels()[k].name, ".Launch(",
                        explicit_grid ? absl::StrCat(GridText(grid), ", ") : "", "null, ",
                        ArgsText(margs), ")");
    empty_grid = Programs(ExactGrid(k, margs, explicit_grid, grid)) == 0;
    call = [&] {
      const std::vector<Arg> args = ToArgs(margs);
      return explicit_grid ? kernel.LaunchArgs(grid, nullptr, args) : kernel.LaunchArgs(nullptr, args);
    };
  } else if (what == 1) {
    text = absl::StrCat("r", r, ".Preload()");
    call = [&] { return rt.rt->Preload(); };
  } else if (what == 2) {
    text = absl::StrCat("r", r, ".ReserveScratch(null, 256)");
    call = [&] { return rt.rt->ReserveScratch(nullptr, 256); };
  } else if (what == 3) {
    const int id = rng_.Pick(my_bounds);
    const BoundM& b = bounds_.at(id);
    empty_grid = Programs(ExactGrid(b.kernel, b.args, b.explicit_grid, b.grid)) == 0;
    text = absl::StrCat("l", id, ".Launch()");
    call = [&, id] { return bounds_.at(id).b->Launch(); };
  } else if (what == 4) {
    const int id = rng_.Pick(my_bounds);
    text = absl::StrCat("StepGraph::Create([l", id, "])");
    call = [&, id] {
      BoundLaunch* step[] = {bounds_.at(id).b.get()};
      return StepGraph::Create(step).status();
    };
  } else {
    const int id = rng_.Pick(my_steps);
    const bool replay = what == 5;
    text = absl::StrCat("x", id, replay ? ".Replay(null)" : ".Build()");
    call = [&, id, replay] { return replay ? steps_.at(id).g->Replay(nullptr) : steps_.at(id).g->Build(); };
  }
  Note(absl::StrCat("new thread t", t, " without a CUDA context: ", text));
  absl::Status st;
  RunOnNewThread(false, [&] { st = call(); });
  Expect e;
  e.must_fail = StatusCode::kFailedPrecondition;
  if (empty_grid) {  // "A grid with zero programs launches nothing and returns OK"
    e.must_fail.reset();
    e.must_ok = true;
  }
  CheckStatus(text.c_str(), st, e, Fault());
  EndOp();
  return true;
}

// Several threads at once, each on its own stream and its own output buffer: eager
// launches through shared Kernels, and BoundLaunches and a StepGraph built and replayed
// there (kept afterwards). What each computes does not depend on the interleaving.
bool Model::OpBurst() {
  if (!captures_.empty() || runtimes_.empty() || bounds_.size() > 8 || steps_.size() > 3) {
    return false;
  }
  const size_t n = static_cast<size_t>(std::min<int64_t>(rng_.Range(2, 3), kWorkers));
  std::vector<int> buffers;
  for (int b = 0; b < kStdBuffers; ++b) buffers.push_back(b);
  for (size_t i = buffers.size(); i > 1; --i) std::swap(buffers[i - 1], buffers[rng_.Index(i)]);
  std::vector<int> inputs(buffers.begin() + static_cast<std::ptrdiff_t>(n), buffers.end());
  BeginOp("burst", -1);
  // Streams of their own.
  std::vector<int> streams;
  for (const auto& [id, s] : streams_) {
    if (streams.size() < n) streams.push_back(id);
  }
  while (streams.size() < n) {
    const int id = next_id_++;
    CUstream h = nullptr;
    W(workers_.front()->id()).Run([&] {
      if (D().StreamCreate(&h, 0) != CUDA_SUCCESS) Fail("cuStreamCreate");
    });
    streams_[id] = StreamM{id, h, -1};
    streams.push_back(id);
  }
  struct Action {
    int k;
    std::vector<MArg> args;
    bool explicit_grid;
    Grid grid;
    absl::Status status;
  };
  struct ThreadPlan {
    int thread;
    int runtime;
    StreamRef s;
    std::vector<int> outputs;
    std::vector<Action> eager;
    // A step: bound launches, replayed `replays` times with new arguments in between.
    std::vector<BoundM> bounds;
    std::vector<std::vector<std::vector<MArg>>> step_args;  // per replay, per launch
    int step_id = -1;
    std::unique_ptr<StepGraph> step;
    std::vector<absl::Status> statuses;
  };
  std::vector<ThreadPlan> plans(n);
  std::vector<std::string> text;
  for (size_t i = 0; i < n; ++i) {
    ThreadPlan& p = plans[i];
    p.thread = workers_[i]->id();
    p.runtime = PickRuntime();
    p.s = {StreamRef::kReal, streams[i]};
    p.outputs = {buffers[i]};
    RuntimeM& rt = runtimes_.at(p.runtime);
    std::vector<int> kernels;
    for (const auto& [k, kernel] : rt.kernels) {
      if (Kernels()[k].sem != Sem::kFill && Kernels()[k].sem != Sem::kScalars) kernels.push_back(k);
    }
    if (kernels.empty()) return false;
    std::vector<std::string> mine;
    for (int a = static_cast<int>(rng_.Range(1, 4)); a > 0; --a) {
      Action act;
      act.k = rng_.Pick(kernels);
      GenArgs(act.k, &act.args, &act.explicit_grid, &act.grid, &p.outputs, &inputs);
      mine.push_back(absl::StrCat(Kernels()[act.k].name, ArgsText(act.args)));
      p.eager.push_back(std::move(act));
    }
    if (rng_.Percent(60)) {
      p.step_id = next_id_++;
      std::vector<std::string> step_text;
      for (int j = static_cast<int>(rng_.Range(1, 2)); j > 0; --j) {
        BoundM b;
        b.id = next_id_++;
        b.runtime = p.runtime;
        b.kernel = rng_.Pick(kernels);
        b.stream = p.s;
        GenArgs(b.kernel, &b.args, &b.explicit_grid, &b.grid, &p.outputs, &inputs);
        step_text.push_back(absl::StrCat("l", b.id, "=", Kernels()[b.kernel].name));
        p.bounds.push_back(std::move(b));
      }
      for (int rep = 0; rep < 2; ++rep) {
        std::vector<std::vector<MArg>> per_launch;
        for (const BoundM& b : p.bounds) {
          std::vector<MArg> args;
          bool explicit_grid;
          Grid grid;
          GenArgs(b.kernel, &args, &explicit_grid, &grid, &p.outputs, &inputs);
          // Keep the bound grid: Set changes arguments only.
          if (!InBounds(memory_, Kernels()[b.kernel].sem, args,
                        ExactGrid(b.kernel, args, b.explicit_grid, b.grid))) {
            args = b.args;
          }
          per_launch.push_back(args);
        }
        p.step_args.push_back(per_launch);
      }
      std::vector<std::string> reps;
      for (const auto& per_launch : p.step_args) {
        std::vector<std::string> one;
        for (const auto& args : per_launch) one.push_back(ArgsText(args));
        reps.push_back(absl::StrJoin(one, " "));
      }
      mine.push_back(absl::StrCat("step x", p.step_id, "[", absl::StrJoin(step_text, ","),
                                  "] replayed with ", absl::StrJoin(reps, ", then ")));
    }
    text.push_back(absl::StrCat("t", p.thread, " on s", streams[i], " (r", p.runtime, ", out b",
                                buffers[i], "): ", absl::StrJoin(mine, ", ")));
  }
  Note(absl::StrCat("burst: ", absl::StrJoin(text, " | ")));
  std::vector<std::function<void()>> bodies(n);
  for (size_t i = 0; i < n; ++i) {
    ThreadPlan& p = plans[i];
    op_.per_stream[Handle(p.s)] = {p.runtime, p.thread, absl::StrCat("sg:", p.step_id)};
    bodies[i] = [this, &p] {
      RuntimeM& rt = runtimes_.at(p.runtime);
      const CUstream h = Handle(p.s);
      for (Action& a : p.eager) {
        const std::vector<Arg> args = ToArgs(a.args);
        const Kernel& kernel = rt.kernels.at(a.k);
        a.status = a.explicit_grid ? kernel.LaunchArgs(a.grid, h, args) : kernel.LaunchArgs(h, args);
      }
      if (p.step_id < 0) return;
      std::vector<BoundLaunch*> step;
      for (BoundM& b : p.bounds) {
        const std::vector<Arg> args = ToArgs(b.args);
        const Kernel& kernel = rt.kernels.at(b.kernel);
        absl::StatusOr<BoundLaunch> bound =
            b.explicit_grid ? kernel.Bind(b.grid, h, args) : kernel.Bind(h, args);
        p.statuses.push_back(bound.status());
        if (!bound.ok()) return;
        b.b = std::make_unique<BoundLaunch>(*std::move(bound));
        step.push_back(b.b.get());
      }
      absl::StatusOr<StepGraph> g = StepGraph::Create(step);
      p.statuses.push_back(g.status());
      if (!g.ok()) return;
      p.step = std::make_unique<StepGraph>(*std::move(g));
      for (const auto& per_launch : p.step_args) {
        for (size_t j = 0; j < p.bounds.size(); ++j) {
          for (size_t a = 0; a < per_launch[j].size(); ++a) {
            p.statuses.push_back(p.bounds[j].b->Set(a, ToArg(per_launch[j][a])));
          }
        }
        p.statuses.push_back(p.step->Replay(h));
      }
    };
  }
  for (size_t i = 0; i < n; ++i) workers_[i]->Start(bodies[i]);
  for (size_t i = 0; i < n; ++i) workers_[i]->Wait();
  int64_t records = 0;
  for (ThreadPlan& p : plans) {
    Expect e;
    e.must_ok = true;
    for (Action& a : p.eager) {
      CheckStatus("launch in a burst", a.status, e, Fault());
      const Grid exact = ExactGrid(a.k, a.args, a.explicit_grid, a.grid);
      AfterLaunch(true, p.runtime, a.k, p.s, p.thread, Programs(exact), 0,
                  Effect{Kernels()[a.k].sem, a.args, exact});
      records += op_.expected_records;
    }
    for (const absl::Status& s : p.statuses) CheckStatus("bind/create/set/replay in a burst", s, e, Fault());
    if (p.step_id < 0) continue;
    for (const auto& per_launch : p.step_args) {
      for (size_t j = 0; j < p.bounds.size(); ++j) {
        BoundM& b = p.bounds[j];
        b.args = per_launch[j];
        const Grid exact = ExactGrid(b.kernel, b.args, b.explicit_grid, b.grid);
        if (Programs(exact) > 0) {
          Emit(p.s, Effect{Kernels()[b.kernel].sem, b.args, exact});
          ++records;
        }
      }
    }
    StepM x;
    x.id = p.step_id;
    x.runtime = p.runtime;
    for (BoundM& b : p.bounds) {
      x.bounds.push_back(b.id);
      bounds_[b.id] = std::move(b);
    }
    x.g = std::move(p.step);
    steps_[x.id] = std::move(x);
  }
  op_.expected_records = records;
  EndOp();
  return true;
}

bool Model::OpWorkerRestart() {
  std::vector<int> ids;
  for (auto& w : workers_) {
    bool busy = false;
    for (const auto& [id, c] : captures_) busy |= c.thread == w->id();
    if (!busy) ids.push_back(w->id());
  }
  if (ids.empty()) return false;
  const int old = rng_.Pick(ids);
  BeginOp("restart worker", old);
  const int fresh = next_thread_++;
  Note(absl::StrCat("worker t", old, " exits; t", fresh, " replaces it"));
  for (auto& w : workers_) {
    if (w->id() != old) continue;
    w->Stop();
    w = std::make_unique<Worker>(fresh);
  }
  ThreadExited(old);
  op_.expected_records = 0;
  EndOp();
  return true;
}

// ---------------------------------------------------------------------------------------
// The driver of seeds

Model* g_current = nullptr;
uint64_t g_seed = 0;

void PrintTrace(const Model& m, FILE* out) {
  for (const std::string& line : m.trace()) std::fprintf(out, "  %s\n", line.c_str());
}

void OnDeath() {
  std::fprintf(stderr, "\nkpack_model_test: died during seed %llu; the operations so far:\n",
               static_cast<unsigned long long>(g_seed));  // NOLINT
  if (g_current != nullptr) PrintTrace(*g_current, stderr);
  std::fprintf(stderr, "replay: kpack_model_test --seed %llu\n",
               static_cast<unsigned long long>(g_seed));  // NOLINT
}

void OnSignal(int sig) {
  OnDeath();
  signal(sig, SIG_DFL);
  raise(sig);
}

}  // namespace
}  // namespace kpack::model

int main(int argc, char** argv) {
  using kpack::model::Failure;
  using kpack::model::Model;
  uint64_t first = 1, last = 8;
  int ops = 300;
  bool verbose = false, counts = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--seed") {
      first = last = std::stoull(next());
    } else if (a == "--seeds") {
      const std::string v = next();
      const size_t dash = v.find('-');
      first = std::stoull(v.substr(0, dash));
      last = dash == std::string::npos ? first : std::stoull(v.substr(dash + 1));
    } else if (a == "--ops") {
      ops = std::stoi(next());
    } else if (a == "--verbose") {
      verbose = true;
    } else if (a == "--counts") {
      counts = true;
    } else if (a == "--skip") {
      kpack::model::Skipped().insert(next());
    } else {
      std::fprintf(stderr,
                   "usage: %s [--seed N | --seeds A-B] [--ops N] [--verbose] [--skip CHECK]...\n"
                   "  Random sequences of kpack API calls against the fake driver, checked\n"
                   "  against a model after every call (tests/model/model_test.cc). --skip\n"
                   "  turns one check off, to look past a known failure while exploring.\n",
                   argv[0]);
      return 2;
    }
  }
#ifdef KPACK_MODEL_SANITIZER
  __sanitizer_set_death_callback(&kpack::model::OnDeath);
#endif
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) signal(sig, &kpack::model::OnSignal);
  int failed = 0;
  for (uint64_t seed = first; seed <= last; ++seed) {
    kpack::model::g_seed = seed;
    std::string failure;
    {
      Model m(seed, ops, verbose);
      kpack::model::g_current = &m;
      try {
        m.Run();
      } catch (const Failure& f) {
        failure = f.what;
      }
      if (!failure.empty()) {
        ++failed;
        std::fprintf(stdout, "FAILED seed %llu: %s\noperations:\n",
                     static_cast<unsigned long long>(seed), failure.c_str());  // NOLINT
        kpack::model::PrintTrace(m, stdout);
        std::fprintf(stdout, "FAILED seed %llu: %s\nreplay: %s --seed %llu --ops %d\n\n",
                     static_cast<unsigned long long>(seed), failure.c_str(), argv[0],  // NOLINT
                     static_cast<unsigned long long>(seed), ops);                     // NOLINT
      } else {
        std::fprintf(stdout, "seed %llu: %d operations OK\n",
                     static_cast<unsigned long long>(seed), ops);  // NOLINT
      }
      std::fflush(stdout);
      kpack::model::g_current = nullptr;
    }
    kpack::fake::Reset();
  }
  if (counts) {
    for (const auto& [name, n] : kpack::model::OpCounts()) std::fprintf(stdout, "%8d %s\n", n, name.c_str());
  }
  std::fprintf(stdout, "%d of %llu seeds failed\n", failed,
               static_cast<unsigned long long>(last - first + 1));  // NOLINT
  return failed == 0 ? 0 : 1;
}
