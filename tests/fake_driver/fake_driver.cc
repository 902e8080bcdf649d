// The recording fake CUDA driver; fake_driver.h describes what it models.

#include "fake_driver.h"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <elf.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "cubin/cubin_reader.h"

namespace kpack::fake {
namespace {

// driver_symbols.h as data: Fn::k<name> indexes kFnNames and kFnVersions.
enum class Fn : int {
#define KPACK_DRIVER_SYMBOL(name, version) k##name,
#include "driver/driver_symbols.h"
#undef KPACK_DRIVER_SYMBOL
  kCount,
};
constexpr int kFnCount = static_cast<int>(Fn::kCount);

constexpr std::string_view kFnNames[] = {
#define KPACK_DRIVER_SYMBOL(name, version) #name,
#include "driver/driver_symbols.h"
#undef KPACK_DRIVER_SYMBOL
};

constexpr int kFnVersions[] = {
#define KPACK_DRIVER_SYMBOL(name, version) version,
#include "driver/driver_symbols.h"
#undef KPACK_DRIVER_SYMBOL
};

constexpr int kDriverVersion = 13000;
constexpr int kWarpSize = 32;
// Static plus dynamic shared memory a launch may use without opting in, per block.
constexpr int kDefaultSharedPerBlock = 48 * 1024;
constexpr unsigned kMaxBlockDimXY = 1024;
constexpr unsigned kMaxBlockDimZ = 64;
constexpr unsigned kMaxGridDimX = INT_MAX;
constexpr unsigned kMaxGridDimYZ = 65535;
constexpr uint64_t kPortableClusterSize = 8;
constexpr uint64_t kNonPortableClusterSize = 16;
constexpr int kMaxContextDepth = 64;
constexpr size_t kAllocationAlignment = 256;
// Device memory is host memory; this bounds what a runaway size can take from the host.
constexpr size_t kMaxLiveBytes = size_t{4} << 30;
constexpr uint64_t kMaxImageBytes = uint64_t{1} << 30;
// An `extra` array longer than this has lost its CU_LAUNCH_PARAM_END.
constexpr int kMaxExtraEntries = 16;
// Launches a capture graph holds before its first reallocation.
constexpr size_t kCaptureReserve = 64;
// Allocations before the allocation table first grows.
constexpr size_t kAllocationReserve = 1024;
// Fresh device memory is filled with this, so reading memory nobody wrote shows.
constexpr unsigned char kUninitializedByte = 0xa5;

[[noreturn]] void Die(std::string_view message) {
  std::fprintf(stderr, "kpack fake CUDA driver: %.*s\n", static_cast<int>(message.size()),
               message.data());
  std::abort();
}

int FnIndexOrDie(std::string_view fn) {
  for (int i = 0; i < kFnCount; ++i) {
    if (kFnNames[i] == fn) return i;
  }
  Die(std::string(fn) + " is not in driver_symbols.h (give the name without \"cu\")");
}

// std::mutex with thread-safety annotations. Not absl::Mutex: the Debian libabsl is built
// without TSan instrumentation, so TSan cannot see its synchronization and reports races
// on everything it guards.
class ABSL_LOCKABLE Mutex {
 public:
  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }

 private:
  std::mutex mu_;
};

class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

// Everything a handle can point at. A destroyed object is parked in State::retired, not
// freed, until Reset(), so a stale handle can never alias a newer object.
struct Object {
  virtual ~Object() = default;
};

// Ids for contexts, streams and captures: unique for the process, as libcuda's are.
std::atomic<uint64_t> g_next_id{1};
uint64_t NewId() { return g_next_id.fetch_add(1, std::memory_order_relaxed); }

struct Context : Object {
  int device = 0;  // ordinal
  int refcount = 0;
  bool primary = false;
  // Read without the lock by cuCtxGetId(NULL) on the thread that has it current.
  std::atomic<uint64_t> id{0};
  uint64_t legacy_stream_id = 0;  // cuStreamGetId of its NULL/legacy stream
};

struct Image;

// A kernel of a loaded library or module. CUkernel and CUfunction handles both point here.
struct Entry {
  Image* image = nullptr;
  std::string name;
  std::vector<internal::CubinParam> params;
  uint32_t param_bytes = 0;
  // (device, CUfunction_attribute) -> value, as set with cuKernelSetAttribute.
  absl::flat_hash_map<std::pair<int, int>, int> attributes;
};

// A loaded library (context-independent) or module (bound to the context it was loaded in).
struct Image : Object {
  int arch = 0;
  Context* module_context = nullptr;  // null for a library
  std::vector<std::unique_ptr<Entry>> entries;
};

struct UserObject : Object {
  void* ptr = nullptr;
  CUhostFn destroy = nullptr;
  unsigned refcount = 0;
};

// User-object references held by a graph or an executable graph.
using UserObjectRefs = absl::flat_hash_map<UserObject*, unsigned>;

struct Graph : Object {
  std::vector<LaunchRecord> launches;
  UserObjectRefs user_objects;
  bool built = false;  // by cuGraphCreate + cuGraphAddKernelNode: launches[i] is node i
  std::vector<GraphEdge> edges;  // of a built graph, in the order added
};

struct GraphExec : Object {
  std::vector<LaunchRecord> launches;
  std::vector<GraphEdge> edges;  // the source graph's at instantiation
  UserObjectRefs user_objects;
  const Graph* source = nullptr;  // the graph it was instantiated from (its nodes patch it)
  uint64_t id = 0;                // ExecId
};

// A kernel node of a graph built with cuGraphAddKernelNode: launches[index] of `graph`.
struct GraphNode : Object {
  Graph* graph = nullptr;
  size_t index = 0;
};

struct Event : Object {
  bool recorded = false;
  std::chrono::steady_clock::time_point when;
};

struct Stream : Object {
  Context* context = nullptr;
  uint64_t id = 0;
  CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;
  CUstreamCaptureMode capture_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
  std::thread::id capture_thread;
  uint64_t capture_id = 0;
  std::unique_ptr<Graph> capture_graph;
};

struct Allocation {
  CUdeviceptr base;
  size_t size;  // as requested
  const Context* context;
  uint64_t id;  // AllocationId: unique for the process, never reused like `base` may be
};

// The driver's own thread. libcuda runs host functions (cuLaunchHostFunc) and user-object
// destructors on an internal thread, one at a time, and GPU work queued behind a host
// function waits for it. The fake has one such thread, which runs in the order queued:
// host functions, user-object destructors, and the emulated kernels of launches made on a
// stream while earlier work of that stream was still queued here (the fake's "GPU work in
// flight"). A stream is known by its id (cuStreamGetId's; 0 for work of no stream).
// Synchronizing calls wait for the work queued before them (WaitFor). The queue is one
// FIFO for all streams: stricter ordering than a GPU's, never looser.
class DriverThread {
 public:
  // Queues `task` for stream `stream`; returns its ticket (tickets count up from 1).
  uint64_t Enqueue(uint64_t stream, std::function<void()> task) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!started_) {
      started_ = true;
      std::thread([this] { Run(); }).detach();  // lives as long as the process
    }
    queue_.push_back(std::move(task));
    ++queued_;
    if (stream != 0) last_of_stream_[stream] = queued_;
    pending_.store(queued_ - done_, std::memory_order_release);
    work_.notify_one();
    return queued_;
  }
  // Whether anything is queued or running: a lock-free check for the launch path.
  bool AnyPending() const { return pending_.load(std::memory_order_acquire) != 0; }
  // Whether work of `stream` is queued or running.
  bool Busy(uint64_t stream) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = last_of_stream_.find(stream);
    return it != last_of_stream_.end() && it->second > done_;
  }
  // The ticket of the last task queued for `stream`, or of any stream for 0.
  uint64_t LastTicket(uint64_t stream) {
    std::lock_guard<std::mutex> lock(mu_);
    if (stream == 0) return queued_;
    auto it = last_of_stream_.find(stream);
    return it == last_of_stream_.end() ? 0 : it->second;
  }
  // Waits until the task of `ticket` and all before it ran. False when that takes longer
  // than the deadlock timeout (on a GPU the wait would never end).
  bool WaitFor(uint64_t ticket) {
    std::unique_lock<std::mutex> lock(mu_);
    return done_cv_.wait_for(lock, timeout_, [&] { return done_ >= ticket; });
  }
  bool OnThisThread() {
    std::lock_guard<std::mutex> lock(mu_);
    return started_ && worker_ == std::this_thread::get_id();
  }
  std::chrono::milliseconds timeout() {
    std::lock_guard<std::mutex> lock(mu_);
    return timeout_;
  }
  void set_timeout(std::chrono::milliseconds timeout) {
    std::lock_guard<std::mutex> lock(mu_);
    timeout_ = timeout;
  }
  // For Reset, once the queue is drained: forgets the streams.
  void Forget() {
    std::lock_guard<std::mutex> lock(mu_);
    last_of_stream_.clear();
    timeout_ = kDefaultTimeout;
  }

 private:
  static constexpr std::chrono::milliseconds kDefaultTimeout{20000};

  void Run() {
    std::unique_lock<std::mutex> lock(mu_);
    worker_ = std::this_thread::get_id();
    for (;;) {
      work_.wait(lock, [&] { return !queue_.empty(); });
      std::function<void()> task = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      task();
      lock.lock();
      ++done_;
      pending_.store(queued_ - done_, std::memory_order_release);
      done_cv_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable work_;
  std::condition_variable done_cv_;
  std::deque<std::function<void()>> queue_;
  uint64_t queued_ = 0;  // tickets issued
  uint64_t done_ = 0;    // tasks run (in ticket order)
  std::atomic<uint64_t> pending_{0};
  absl::flat_hash_map<uint64_t, uint64_t> last_of_stream_;
  bool started_ = false;
  std::thread::id worker_;
  std::chrono::milliseconds timeout_ = kDefaultTimeout;
};

// Never destroyed, like State: its thread may run while the process exits.
DriverThread& Worker() {
  static DriverThread* const worker = new DriverThread();
  return *worker;
}

// A synchronizing call's wait for the work queued before it: everything (`stream` 0) or
// one stream's. Not on the driver's thread itself (a host function or destructor may not
// call CUDA; were it to, it would wait for itself). A wait past the deadlock timeout is
// recorded as a fault and fails the call.
CUresult WaitForQueued(std::string_view call, uint64_t stream = 0);

// User-object destructors that fell due during a call, queued once the call has released
// the fake's lock on the driver's thread (as libcuda runs them on a thread of its own).
// Unless SetAsyncDestructors is on, the call waits for them before it returns.
class Destructors {
 public:
  void Add(CUhostFn fn, void* ptr) { calls_.emplace_back(fn, ptr); }
  ~Destructors();

 private:
  std::vector<std::pair<CUhostFn, void*>> calls_;
};

struct Failure {
  int countdown;  // calls to let through first
  CUresult code;
};

// The live objects of one kind, keyed by the address their handles carry.
template <typename T>
class Registry {
 public:
  T* Add(std::unique_ptr<T> object) {
    T* raw = object.get();
    live_.emplace(raw, std::move(object));
    return raw;
  }
  T* Find(const void* handle) const {
    auto it = live_.find(handle);
    return it == live_.end() ? nullptr : it->second.get();
  }
  std::unique_ptr<T> Take(const void* handle) {
    auto it = live_.find(handle);
    std::unique_ptr<T> object = std::move(it->second);
    live_.erase(it);
    return object;
  }
  size_t size() const { return live_.size(); }
  void clear() { live_.clear(); }
  auto begin() { return live_.begin(); }
  auto end() { return live_.end(); }

 private:
  absl::flat_hash_map<const void*, std::unique_ptr<T>> live_;
};

struct State {
  State();

  Mutex mu;
  // Read without the lock on every call.
  std::atomic<bool> initialized{false};
  std::atomic<bool> launch_noop{false};
  std::atomic<bool> async_destructors{false};
  std::atomic<int> pending_failures{0};
  std::atomic<int> pending_hooks{0};
  std::array<std::atomic<int64_t>, kFnCount> calls{};
  // Bumped to empty every thread's context stack at once (Reset, SetDevices).
  std::atomic<uint64_t> generation{1};

  std::vector<DeviceConfig> devices ABSL_GUARDED_BY(mu);
  KernelLimits limits ABSL_GUARDED_BY(mu);
  int device_handle_offset ABSL_GUARDED_BY(mu) = 0;
  bool reuse_handles ABSL_GUARDED_BY(mu) = false;
  CUresult init_error ABSL_GUARDED_BY(mu) = CUDA_SUCCESS;
  std::array<std::vector<Failure>, kFnCount> failures ABSL_GUARDED_BY(mu);
  std::array<std::vector<std::function<void()>>, kFnCount> hooks ABSL_GUARDED_BY(mu);
  std::array<bool, kFnCount> hidden ABSL_GUARDED_BY(mu) = {};

  std::vector<Context*> primaries ABSL_GUARDED_BY(mu);  // by device
  Registry<Context> contexts ABSL_GUARDED_BY(mu);
  Registry<Image> images ABSL_GUARDED_BY(mu);
  absl::flat_hash_map<const void*, Entry*> entries ABSL_GUARDED_BY(mu);
  // cuKernelGetFunction handles: one per (library kernel, context), launchable only in
  // that context, like the real driver's context-bound CUfunction. The map owns the
  // handle objects (their addresses are the handles).
  // A destroyed context's handles are retired with it, never reused.
  struct BoundFunction : Object {
    Entry* entry = nullptr;
    Context* context = nullptr;
  };
  absl::flat_hash_map<std::pair<const Entry*, const Context*>, std::unique_ptr<BoundFunction>>
      bound_functions ABSL_GUARDED_BY(mu);
  absl::flat_hash_map<const void*, BoundFunction*> bound_by_handle ABSL_GUARDED_BY(mu);
  Registry<Stream> streams ABSL_GUARDED_BY(mu);
  Registry<Graph> graphs ABSL_GUARDED_BY(mu);
  Registry<GraphExec> execs ABSL_GUARDED_BY(mu);
  Registry<GraphNode> nodes ABSL_GUARDED_BY(mu);
  Registry<Event> events ABSL_GUARDED_BY(mu);
  std::vector<NodeUpdate> node_updates ABSL_GUARDED_BY(mu);
  int64_t graph_launches ABSL_GUARDED_BY(mu) = 0;
  Registry<UserObject> user_objects ABSL_GUARDED_BY(mu);
  std::vector<std::unique_ptr<Object>> retired ABSL_GUARDED_BY(mu);
  // Destroyed contexts and streams whose handles SetHandleReuse may hand out again.
  std::vector<std::unique_ptr<Context>> dead_contexts ABSL_GUARDED_BY(mu);
  std::vector<std::unique_ptr<Stream>> dead_streams ABSL_GUARDED_BY(mu);
  // cuStreamGetId of CU_STREAM_PER_THREAD: one id per (thread, context).
  absl::flat_hash_map<std::pair<std::thread::id, const Context*>, uint64_t> per_thread_stream_ids
      ABSL_GUARDED_BY(mu);
  int active_captures ABSL_GUARDED_BY(mu) = 0;

  absl::flat_hash_map<std::string, KernelEmulator> emulators ABSL_GUARDED_BY(mu);
  std::vector<std::string> faults ABSL_GUARDED_BY(mu);

  std::vector<Allocation> allocations ABSL_GUARDED_BY(mu);
  int64_t live_bytes ABSL_GUARDED_BY(mu) = 0;
  std::vector<void*> host_allocations ABSL_GUARDED_BY(mu);  // cuMemAllocHost

  std::vector<KernelAttributeSet> attribute_sets ABSL_GUARDED_BY(mu);
  int64_t library_loads ABSL_GUARDED_BY(mu) = 0;
  // Allocated once, so recording a launch never allocates.
  std::vector<LaunchRecord> ring ABSL_GUARDED_BY(mu);
  int64_t launch_count ABSL_GUARDED_BY(mu) = 0;
};

// A new context of `device` (an ordinal), or with SetHandleReuse the last destroyed one
// brought back under its old handle with a new id.
Context* NewContext(State& s, int device, bool primary) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
  std::unique_ptr<Context> context;
  if (s.reuse_handles && !s.dead_contexts.empty()) {
    context = std::move(s.dead_contexts.back());
    s.dead_contexts.pop_back();
  } else {
    context = std::make_unique<Context>();
  }
  context->device = device;
  context->refcount = 0;
  context->primary = primary;
  context->id.store(NewId(), std::memory_order_relaxed);
  context->legacy_stream_id = NewId();
  return s.contexts.Add(std::move(context));
}

void CreatePrimaries(State& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
  for (size_t device = 0; device < s.devices.size(); ++device) {
    s.primaries.push_back(NewContext(s, static_cast<int>(device), /*primary=*/true));
  }
}

void ResetLocked(State& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
  for (const Allocation& allocation : s.allocations) {
    std::free(reinterpret_cast<void*>(allocation.base));
  }
  s.allocations.clear();
  s.live_bytes = 0;
  for (void* memory : s.host_allocations) std::free(memory);
  s.host_allocations.clear();
  s.streams.clear();
  s.graphs.clear();
  s.execs.clear();
  s.nodes.clear();
  s.events.clear();
  s.node_updates.clear();
  s.graph_launches = 0;
  s.user_objects.clear();  // destructors not run: the objects they would free are gone too
  s.entries.clear();
  s.bound_by_handle.clear();
  s.bound_functions.clear();
  s.images.clear();
  s.primaries.clear();
  s.contexts.clear();
  s.retired.clear();
  s.dead_contexts.clear();
  s.dead_streams.clear();
  s.per_thread_stream_ids.clear();
  s.active_captures = 0;
  s.reuse_handles = false;
  s.device_handle_offset = 0;
  s.devices = {DeviceConfig{}};
  CreatePrimaries(s);
  s.limits = KernelLimits{};
  s.init_error = CUDA_SUCCESS;
  s.emulators.clear();
  s.faults.clear();
  for (std::vector<Failure>& pending : s.failures) pending.clear();
  s.pending_failures.store(0);
  for (auto& hooks : s.hooks) hooks.clear();
  s.pending_hooks.store(0);
  s.async_destructors.store(false);
  s.hidden.fill(false);
  for (std::atomic<int64_t>& count : s.calls) count.store(0);
  s.attribute_sets.clear();
  s.library_loads = 0;
  s.launch_count = 0;
  s.initialized.store(false);
  s.launch_noop.store(false);
  s.generation.fetch_add(1);
}

State::State() : ring(kLaunchRingCapacity) {
  MutexLock lock(&mu);
  allocations.reserve(kAllocationReserve);
  ResetLocked(*this);
}

// Never destroyed: threads may still call into the fake while the process exits.
State& S() {
  static State* const state = [] {
    auto* s = new State();
    // For benchmarks run as separate programs (they cannot call SetLaunchNoop): measure
    // the caller's own cost per launch with the driver's part reduced to a counter.
    const char* noop = std::getenv("KPACK_FAKE_LAUNCH_NOOP");
    s->launch_noop.store(noop != nullptr && noop[0] == '1');
    return s;
  }();
  return *state;
}

CUresult WaitForQueued(std::string_view call, uint64_t stream) {
  DriverThread& worker = Worker();
  if (worker.OnThisThread()) return CUDA_SUCCESS;
  if (worker.WaitFor(worker.LastTicket(stream))) return CUDA_SUCCESS;
  State& s = S();
  MutexLock lock(&s.mu);
  s.faults.push_back(std::string(call) + " waited " + std::to_string(worker.timeout().count()) +
                     " ms for work queued on the driver's thread (host functions, user-object "
                     "destructors, kernels behind them) that did not finish: something running "
                     "there blocks (on a GPU, a deadlock)");
  return CUDA_ERROR_LAUNCH_TIMEOUT;
}

Destructors::~Destructors() {
  if (calls_.empty()) return;
  uint64_t ticket = 0;
  for (auto [fn, ptr] : calls_) {
    ticket = Worker().Enqueue(0, [fn = fn, ptr = ptr] { fn(ptr); });
  }
  if (S().async_destructors.load(std::memory_order_acquire) || Worker().OnThisThread()) return;
  if (!Worker().WaitFor(ticket)) {
    State& s = S();
    MutexLock lock(&s.mu);
    s.faults.push_back("a user-object destructor did not finish within " +
                       std::to_string(Worker().timeout().count()) +
                       " ms: something running on the driver's thread blocks");
  }
}

// Trivially constructible and destructible: no TLS guard, constructor or exit-time
// destructor runs, and the zeroed initial state means "stale generation, empty stack".
// `capture_mode` is the thread's stream capture interaction mode
// (cuThreadExchangeStreamCaptureMode); zero is CU_STREAM_CAPTURE_MODE_GLOBAL, the default.
struct ThreadContexts {
  uint64_t generation;
  int depth;
  std::array<Context*, kMaxContextDepth> stack;
  CUstreamCaptureMode capture_mode;
};
static_assert(CU_STREAM_CAPTURE_MODE_GLOBAL == 0);
thread_local ThreadContexts tls_contexts;

ThreadContexts& ThisThread(State& s) {
  const uint64_t generation = s.generation.load(std::memory_order_acquire);
  if (tls_contexts.generation != generation) {
    tls_contexts.generation = generation;
    tls_contexts.depth = 0;
    tls_contexts.capture_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
  }
  return tls_contexts;
}

// The calling thread's current context: the top of its stack, or none (as in libcuda,
// a thread starts with none). Needs no lock: the stack is the thread's own.
Context* CurrentContext(State& s) {
  ThreadContexts& thread = ThisThread(s);
  return thread.depth > 0 ? thread.stack[thread.depth - 1] : nullptr;
}

bool NeedsInit(Fn fn) {
  return fn != Fn::kInit && fn != Fn::kGetErrorName && fn != Fn::kGetErrorString &&
         fn != Fn::kDriverGetVersion;
}

// The prologue of every driver function: counts the call, applies FailNext, and refuses
// calls before cuInit as the real driver does.
CUresult Enter(Fn fn) {
  State& s = S();
  const int index = static_cast<int>(fn);
  s.calls[index].fetch_add(1, std::memory_order_relaxed);
  if (s.pending_hooks.load(std::memory_order_acquire) > 0) {
    std::function<void()> hook;
    {
      MutexLock lock(&s.mu);
      std::vector<std::function<void()>>& hooks = s.hooks[index];
      if (!hooks.empty()) {
        hook = std::move(hooks.front());
        hooks.erase(hooks.begin());
        s.pending_hooks.fetch_sub(1);
      }
    }
    if (hook) hook();  // without the lock: it may call the driver
  }
  if (s.pending_failures.load(std::memory_order_acquire) > 0) {
    MutexLock lock(&s.mu);
    std::optional<CUresult> fire;
    std::vector<Failure>& pending = s.failures[index];
    for (auto it = pending.begin(); it != pending.end();) {
      if (it->countdown-- > 0) {
        ++it;
        continue;
      }
      if (!fire.has_value()) fire = it->code;
      it = pending.erase(it);
      s.pending_failures.fetch_sub(1);
    }
    if (fire.has_value()) return *fire;
  }
  if (NeedsInit(fn) && !s.initialized.load(std::memory_order_acquire)) {
    return CUDA_ERROR_NOT_INITIALIZED;
  }
  return CUDA_SUCCESS;
}

// The ordinal of CUdevice handle `device`, or -1 when it is none.
int Ordinal(const State& s, CUdevice device) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
  const int64_t ordinal = int64_t{device} - s.device_handle_offset;
  return ordinal >= 0 && static_cast<size_t>(ordinal) < s.devices.size()
             ? static_cast<int>(ordinal)
             : -1;
}

CUdevice Handle(const State& s, int ordinal) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
  return ordinal + s.device_handle_offset;
}

// Whether a cubin for `arch` runs on `device`: an sm_90a-style cubin (arch >= 90) only on
// exactly that compute capability, an older one on the same major with minor <= the
// device's.
bool ArchRunsOn(int arch, const DeviceConfig& device) {
  if (arch >= 90) return arch == device.cc_major * 10 + device.cc_minor;
  return arch / 10 == device.cc_major && arch % 10 <= device.cc_minor;
}

bool IsDefaultStream(CUstream stream) {
  return stream == nullptr || stream == CU_STREAM_LEGACY || stream == CU_STREAM_PER_THREAD;
}

// A launch's or graph launch's stream: null for a default stream, else a live stream of
// the current context.
CUresult ResolveStream(State& s, CUstream handle, const Context* context, Stream** stream)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
  *stream = nullptr;
  if (IsDefaultStream(handle)) return CUDA_SUCCESS;
  *stream = s.streams.Find(handle);
  if (*stream == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if ((*stream)->context != context) return CUDA_ERROR_INVALID_CONTEXT;
  if ((*stream)->capture == CU_STREAM_CAPTURE_STATUS_INVALIDATED) {
    return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  }
  return CUDA_SUCCESS;
}

// For stream work the fake does not model inside a capture (memcpy and host nodes): the
// current context and ResolveStream's stream, or CUDA_ERROR_NOT_SUPPORTED on a capturing
// stream.
CUresult ResolveUncapturedStream(State& s, CUstream handle, const Context** context,
                                 Stream** stream) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
  *context = CurrentContext(s);
  if (*context == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if (CUresult r = ResolveStream(s, handle, *context, stream); r != CUDA_SUCCESS) return r;
  if (*stream != nullptr && (*stream)->capture != CU_STREAM_CAPTURE_STATUS_NONE) {
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  return CUDA_SUCCESS;
}

// The id of the stream `handle` (resolved to `stream`, null for a default stream) in
// `context`, as cuStreamGetId reports it: what the driver's thread knows work by.
uint64_t StreamIdentity(State& s, CUstream handle, const Context* context, const Stream* stream)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
  if (stream != nullptr) return stream->id;
  if (handle != CU_STREAM_PER_THREAD) return context->legacy_stream_id;
  uint64_t& per_thread = s.per_thread_stream_ids[{std::this_thread::get_id(), context}];
  if (per_thread == 0) per_thread = NewId();
  return per_thread;
}

// The real driver's rule for "potentially unsafe" calls (allocation, synchronous copies,
// synchronization, loading code, instantiating and destroying executable graphs) during
// stream capture, by the calling thread's interaction mode (cuThreadExchangeStreamCaptureMode,
// whose documentation states the rule): a GLOBAL thread (the default) may not make them
// while it runs a capture that is not RELAXED or while any other thread runs a GLOBAL
// one; a THREAD_LOCAL thread only while it runs a capture that is not RELAXED; a RELAXED
// thread always may. A forbidden call fails, and this thread's capture is invalidated.
CUresult CheckUnsafeCall(State& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
  if (s.active_captures == 0) return CUDA_SUCCESS;
  const CUstreamCaptureMode mode = ThisThread(s).capture_mode;
  if (mode == CU_STREAM_CAPTURE_MODE_RELAXED) return CUDA_SUCCESS;
  const std::thread::id self = std::this_thread::get_id();
  bool forbidden = false;
  for (auto& [handle, stream] : s.streams) {
    if (stream->capture != CU_STREAM_CAPTURE_STATUS_ACTIVE) continue;
    const bool mine = stream->capture_thread == self;
    if (mine && stream->capture_mode != CU_STREAM_CAPTURE_MODE_RELAXED) {
      stream->capture = CU_STREAM_CAPTURE_STATUS_INVALIDATED;
      forbidden = true;
    } else if (!mine && stream->capture_mode == CU_STREAM_CAPTURE_MODE_GLOBAL &&
               mode == CU_STREAM_CAPTURE_MODE_GLOBAL) {
      forbidden = true;
    }
  }
  return forbidden ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : CUDA_SUCCESS;
}

Entry* FindEntry(State& s, const void* handle) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
  auto it = s.entries.find(handle);
  return it == s.entries.end() ? nullptr : it->second;
}

// The cuKernel* functions take only library kernels.
Entry* FindLibraryEntry(State& s, CUkernel handle) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
  Entry* entry = FindEntry(s, handle);
  return entry != nullptr && entry->image->module_context == nullptr ? entry : nullptr;
}

Entry* FindByName(Image& image, const char* name) {
  for (const std::unique_ptr<Entry>& entry : image.entries) {
    if (entry->name == name) return entry.get();
  }
  return nullptr;
}

std::optional<int> SetAttribute(const Entry& entry, int device, CUfunction_attribute attribute) {
  auto it = entry.attributes.find({device, static_cast<int>(attribute)});
  if (it == entry.attributes.end()) return std::nullopt;
  return it->second;
}

int DynamicSharedLimit(const State& s, const Entry& entry, int device)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
  return SetAttribute(entry, device, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES)
      .value_or(kDefaultSharedPerBlock - s.limits.static_shared_bytes);
}

// cuLibraryLoadData and cuModuleLoadData take a bare pointer, so like the real driver the
// fake finds the image's end from its ELF headers: the furthest of the header tables and
// the section contents. 0 when `code` is not an ELF64 image or the extent is absurd.
size_t ElfImageExtent(const void* code) {
  const auto* bytes = static_cast<const unsigned char*>(code);
  // Compared byte by byte so that a short non-ELF buffer is not read past its first
  // mismatching byte.
  constexpr unsigned char kIdent[] = {ELFMAG0, ELFMAG1, ELFMAG2, ELFMAG3, ELFCLASS64};
  for (size_t i = 0; i < sizeof(kIdent); ++i) {
    if (bytes[i] != kIdent[i]) return 0;
  }
  Elf64_Ehdr header;
  std::memcpy(&header, bytes, sizeof(header));
  uint64_t end = sizeof(header);
  auto extend = [&end](uint64_t offset, uint64_t size) {
    if (offset > kMaxImageBytes || size > kMaxImageBytes - offset) return false;
    end = std::max(end, offset + size);
    return true;
  };
  if (!extend(header.e_phoff, uint64_t{header.e_phnum} * header.e_phentsize) ||
      !extend(header.e_shoff, uint64_t{header.e_shnum} * header.e_shentsize)) {
    return 0;
  }
  if (header.e_shentsize == sizeof(Elf64_Shdr)) {
    for (int i = 0; i < header.e_shnum; ++i) {
      Elf64_Shdr section;
      std::memcpy(&section, bytes + header.e_shoff + i * sizeof(section), sizeof(section));
      if (section.sh_type != SHT_NOBITS && !extend(section.sh_offset, section.sh_size)) {
        return 0;
      }
    }
  }
  return end;
}

// Parses and registers an image. `module_context` is null for a library.
CUresult LoadImage(State& s, const void* code, Context* module_context, Image** loaded)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
  const size_t size = ElfImageExtent(code);
  if (size == 0) return CUDA_ERROR_INVALID_IMAGE;
  absl::StatusOr<internal::CubinInfo> info =
      internal::ReadCubin(std::span(static_cast<const std::byte*>(code), size));
  if (!info.ok()) return CUDA_ERROR_INVALID_IMAGE;
  if (module_context != nullptr && !ArchRunsOn(info->arch, s.devices[module_context->device])) {
    return CUDA_ERROR_NO_BINARY_FOR_GPU;
  }
  auto image = std::make_unique<Image>();
  image->arch = info->arch;
  image->module_context = module_context;
  for (internal::CubinKernel& kernel : info->kernels) {
    auto entry = std::make_unique<Entry>();
    entry->image = image.get();
    entry->param_bytes = internal::ParamBufferSize(kernel);
    entry->name = std::move(kernel.name);
    entry->params = std::move(kernel.params);
    s.entries.emplace(entry.get(), entry.get());
    image->entries.push_back(std::move(entry));
  }
  ++s.library_loads;
  *loaded = s.images.Add(std::move(image));
  return CUDA_SUCCESS;
}

void UnloadImage(State& s, Image* image) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
  for (const std::unique_ptr<Entry>& entry : image->entries) s.entries.erase(entry.get());
  s.retired.push_back(s.images.Take(image));
}

// Retires the kernel nodes of a built graph (with the graph; fake_driver.cc's graph
// section).
void RetireNodes(State& s, const Graph* graph) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu);

// Appends to the ring; a launch into a capturing stream also goes into its graph.
void RecordLaunch(State& s, const LaunchRecord& record, Stream* stream)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
  LaunchRecord& slot = s.ring[s.launch_count % kLaunchRingCapacity];
  slot = record;
  if (stream != nullptr && stream->capture == CU_STREAM_CAPTURE_STATUS_ACTIVE) {
    slot.captured = true;
    stream->capture_graph->launches.push_back(slot);
  }
  ++s.launch_count;
}

// CUDA_ERROR_ILLEGAL_ADDRESS once an emulated kernel has touched memory it does not own:
// like a faulted GPU context, every later synchronization and copy reports it.
CUresult StickyError(const State& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
  return s.faults.empty() ? CUDA_SUCCESS : CUDA_ERROR_ILLEGAL_ADDRESS;
}

// Drops the references in `refs`; objects left without one are retired and their
// destructors queued on `destructors`.
void ReleaseUserObjects(State& s, UserObjectRefs& refs, Destructors& destructors)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
  for (auto& [object, count] : refs) {
    object->refcount -= std::min(object->refcount, count);
    if (object->refcount == 0) {
      destructors.Add(object->destroy, object->ptr);
      s.retired.push_back(s.user_objects.Take(object));
    }
  }
  refs.clear();
}

void DestroyStream(State& s, Stream* stream, Destructors& destructors)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
  if (stream->capture != CU_STREAM_CAPTURE_STATUS_NONE) {
    --s.active_captures;
    stream->capture = CU_STREAM_CAPTURE_STATUS_NONE;
    if (stream->capture_graph != nullptr) {
      ReleaseUserObjects(s, stream->capture_graph->user_objects, destructors);
      s.retired.push_back(std::move(stream->capture_graph));
    }
  }
  s.dead_streams.push_back(s.streams.Take(stream));
}

// By string_view: a graph replay looks up every node's entry, and must not allocate a
// string for a name past the small-string size.
KernelEmulator FindEmulator(const State& s, absl::string_view entry)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
  auto it = s.emulators.find(entry);
  return it == s.emulators.end() ? nullptr : it->second;
}

// Runs an emulator on a recorded launch; called without the lock (it reaches memory
// through DeviceMemory, which takes it).
void Emulate(KernelEmulator emulator, const LaunchRecord& record) {
  emulator(EmulatedLaunch{record.entry.data(), record.grid, record.block, record.stream,
                          record.params.data(),
                          std::min(record.param_size, kMaxRecordedParamBytes),
                          std::min(record.num_params, kMaxRecordedParams),
                          record.param_layout.data()});
}

// ---------------------------------------------------------------------------------------
// The driver functions, one per driver_symbols.h line, named Fake<name>.

struct ErrorText {
  CUresult code;
  const char* name;
  const char* text;
};

#define KPACK_FAKE_ERROR(code, text) \
  { code, #code, text }
constexpr ErrorText kErrors[] = {
    KPACK_FAKE_ERROR(CUDA_SUCCESS, "no error"),
    KPACK_FAKE_ERROR(CUDA_ERROR_INVALID_VALUE, "invalid argument"),
    KPACK_FAKE_ERROR(CUDA_ERROR_OUT_OF_MEMORY, "out of memory"),
    KPACK_FAKE_ERROR(CUDA_ERROR_NOT_INITIALIZED, "initialization error"),
    KPACK_FAKE_ERROR(CUDA_ERROR_DEINITIALIZED, "driver shutting down"),
    KPACK_FAKE_ERROR(CUDA_ERROR_NOT_SUPPORTED, "operation not supported"),
    KPACK_FAKE_ERROR(CUDA_ERROR_NO_DEVICE, "no CUDA-capable device is detected"),
    KPACK_FAKE_ERROR(CUDA_ERROR_INVALID_DEVICE, "invalid device ordinal"),
    KPACK_FAKE_ERROR(CUDA_ERROR_INVALID_IMAGE, "device kernel image is invalid"),
    KPACK_FAKE_ERROR(CUDA_ERROR_INVALID_CONTEXT, "invalid device context"),
    KPACK_FAKE_ERROR(CUDA_ERROR_NO_BINARY_FOR_GPU,
                     "no kernel image is available for execution on the device"),
    KPACK_FAKE_ERROR(CUDA_ERROR_INVALID_PTX, "a PTX JIT compilation failed"),
    KPACK_FAKE_ERROR(CUDA_ERROR_INVALID_SOURCE, "device kernel image is invalid"),
    KPACK_FAKE_ERROR(CUDA_ERROR_INVALID_HANDLE, "invalid resource handle"),
    KPACK_FAKE_ERROR(CUDA_ERROR_ILLEGAL_STATE,
                     "the operation cannot be performed in the present state"),
    KPACK_FAKE_ERROR(CUDA_ERROR_NOT_FOUND, "named symbol not found"),
    KPACK_FAKE_ERROR(CUDA_ERROR_NOT_READY, "device not ready"),
    KPACK_FAKE_ERROR(CUDA_ERROR_ILLEGAL_ADDRESS, "an illegal memory access was encountered"),
    KPACK_FAKE_ERROR(CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, "too many resources requested for launch"),
    KPACK_FAKE_ERROR(CUDA_ERROR_LAUNCH_TIMEOUT, "the launch timed out and was terminated"),
    KPACK_FAKE_ERROR(CUDA_ERROR_LAUNCH_FAILED, "unspecified launch failure"),
    KPACK_FAKE_ERROR(CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE,
                     "too many blocks in cooperative launch"),
    KPACK_FAKE_ERROR(CUDA_ERROR_INVALID_CLUSTER_SIZE, "invalid cluster size"),
    KPACK_FAKE_ERROR(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
                     "operation not permitted when stream is capturing"),
    KPACK_FAKE_ERROR(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
                     "operation failed due to a previous error during capture"),
    KPACK_FAKE_ERROR(CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD,
                     "attempt to terminate a thread-local capture sequence from another "
                     "thread"),
    KPACK_FAKE_ERROR(CUDA_ERROR_CONTEXT_IS_DESTROYED, "context is destroyed"),
    KPACK_FAKE_ERROR(CUDA_ERROR_SYSTEM_DRIVER_MISMATCH,
                     "system has unsupported display driver / cuda driver combination"),
    KPACK_FAKE_ERROR(CUDA_ERROR_UNSUPPORTED_PTX_VERSION,
                     "the provided PTX was compiled with an unsupported toolchain."),
    KPACK_FAKE_ERROR(CUDA_ERROR_UNKNOWN, "unknown error"),
};
#undef KPACK_FAKE_ERROR

// The real driver fails for codes it does not know; the fake names them
// CUDA_ERROR_UNKNOWN so that messages stay readable.
const ErrorText& ErrorFor(CUresult code) {
  for (const ErrorText& error : kErrors) {
    if (error.code == code) return error;
  }
  return kErrors[std::size(kErrors) - 1];
}

CUresult FakeGetErrorName(CUresult error, const char** name) {
  if (CUresult r = Enter(Fn::kGetErrorName); r != CUDA_SUCCESS) return r;
  if (name == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *name = ErrorFor(error).name;
  return CUDA_SUCCESS;
}

CUresult FakeGetErrorString(CUresult error, const char** text) {
  if (CUresult r = Enter(Fn::kGetErrorString); r != CUDA_SUCCESS) return r;
  if (text == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *text = ErrorFor(error).text;
  return CUDA_SUCCESS;
}

CUresult FakeInit(unsigned int flags) {
  if (CUresult r = Enter(Fn::kInit); r != CUDA_SUCCESS) return r;
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  State& s = S();
  MutexLock lock(&s.mu);
  if (s.init_error != CUDA_SUCCESS) return s.init_error;
  if (s.devices.empty()) return CUDA_ERROR_NO_DEVICE;
  s.initialized.store(true, std::memory_order_release);
  return CUDA_SUCCESS;
}

CUresult FakeDriverGetVersion(int* version) {
  if (CUresult r = Enter(Fn::kDriverGetVersion); r != CUDA_SUCCESS) return r;
  if (version == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *version = kDriverVersion;
  return CUDA_SUCCESS;
}

CUresult FakeDeviceGet(CUdevice* device, int ordinal) {
  if (CUresult r = Enter(Fn::kDeviceGet); r != CUDA_SUCCESS) return r;
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  State& s = S();
  MutexLock lock(&s.mu);
  if (ordinal < 0 || static_cast<size_t>(ordinal) >= s.devices.size()) {
    return CUDA_ERROR_INVALID_DEVICE;
  }
  *device = Handle(s, ordinal);
  return CUDA_SUCCESS;
}

CUresult FakeDeviceGetCount(int* count) {
  if (CUresult r = Enter(Fn::kDeviceGetCount); r != CUDA_SUCCESS) return r;
  if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
  State& s = S();
  MutexLock lock(&s.mu);
  *count = static_cast<int>(s.devices.size());
  return CUDA_SUCCESS;
}

// Attributes the fake does not model fail with CUDA_ERROR_INVALID_VALUE, so that code
// starting to depend on a new one is noticed (and the fake extended) rather than fed 0.
CUresult FakeDeviceGetAttribute(int* value, CUdevice_attribute attribute, CUdevice device) {
  if (CUresult r = Enter(Fn::kDeviceGetAttribute); r != CUDA_SUCCESS) return r;
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  State& s = S();
  MutexLock lock(&s.mu);
  const int ordinal = Ordinal(s, device);
  if (ordinal < 0) return CUDA_ERROR_INVALID_DEVICE;
  const DeviceConfig& config = s.devices[ordinal];
  switch (attribute) {
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR:
      *value = config.cc_major;
      return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR:
      *value = config.cc_minor;
      return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN:
      *value = config.max_shared_memory_per_block_optin;
      return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK:
      *value = kDefaultSharedPerBlock;
      return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK:
      *value = config.max_threads_per_block;
      return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT:
      *value = config.multiprocessor_count;
      return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE:
      *value = kWarpSize;
      return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X:
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y:
      *value = kMaxBlockDimXY;
      return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z:
      *value = kMaxBlockDimZ;
      return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X:
      *value = kMaxGridDimX;
      return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y:
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z:
      *value = kMaxGridDimYZ;
      return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH:
      *value = 1;
      return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH:
      *value = config.cc_major >= 9 ? 1 : 0;
      return CUDA_SUCCESS;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
}

CUresult FakeDeviceGetName(char* name, int length, CUdevice device) {
  if (CUresult r = Enter(Fn::kDeviceGetName); r != CUDA_SUCCESS) return r;
  if (name == nullptr || length <= 0) return CUDA_ERROR_INVALID_VALUE;
  State& s = S();
  MutexLock lock(&s.mu);
  const int ordinal = Ordinal(s, device);
  if (ordinal < 0) return CUDA_ERROR_INVALID_DEVICE;
  const std::string& full = s.devices[ordinal].name;
  const size_t copied = std::min(full.size(), static_cast<size_t>(length) - 1);
  std::memcpy(name, full.data(), copied);
  name[copied] = '\0';
  return CUDA_SUCCESS;
}

CUresult FakeDevicePrimaryCtxRetain(CUcontext* context, CUdevice device) {
  if (CUresult r = Enter(Fn::kDevicePrimaryCtxRetain); r != CUDA_SUCCESS) return r;
  if (context == nullptr) return CUDA_ERROR_INVALID_VALUE;
  State& s = S();
  MutexLock lock(&s.mu);
  const int ordinal = Ordinal(s, device);
  if (ordinal < 0) return CUDA_ERROR_INVALID_DEVICE;
  ++s.primaries[ordinal]->refcount;
  *context = reinterpret_cast<CUcontext>(s.primaries[ordinal]);
  return CUDA_SUCCESS;
}

CUresult FakeDevicePrimaryCtxRelease(CUdevice device) {
  if (CUresult r = Enter(Fn::kDevicePrimaryCtxRelease); r != CUDA_SUCCESS) return r;
  State& s = S();
  MutexLock lock(&s.mu);
  const int ordinal = Ordinal(s, device);
  if (ordinal < 0) return CUDA_ERROR_INVALID_DEVICE;
  if (s.primaries[ordinal]->refcount == 0) return CUDA_ERROR_INVALID_CONTEXT;
  --s.primaries[ordinal]->refcount;
  return CUDA_SUCCESS;
}

CUresult FakeCtxGetCurrent(CUcontext* context) {
  if (CUresult r = Enter(Fn::kCtxGetCurrent); r != CUDA_SUCCESS) return r;
  if (context == nullptr) return CUDA_ERROR_INVALID_VALUE;
  // A thread-local read, as in the real driver: benchmarks of the launch path must not
  // measure (or contend on) the fake's lock.
  *context = reinterpret_cast<CUcontext>(CurrentContext(S()));
  return CUDA_SUCCESS;
}

// Replaces the top of the thread's stack; null pops it (a no-op on an empty stack).
CUresult FakeCtxSetCurrent(CUcontext handle) {
  if (CUresult r = Enter(Fn::kCtxSetCurrent); r != CUDA_SUCCESS) return r;
  State& s = S();
  MutexLock lock(&s.mu);
  ThreadContexts& thread = ThisThread(s);
  if (handle == nullptr) {
    if (thread.depth > 0) --thread.depth;
    return CUDA_SUCCESS;
  }
  Context* context = s.contexts.Find(handle);
  if (context == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if (thread.depth == 0) thread.depth = 1;
  thread.stack[thread.depth - 1] = context;
  return CUDA_SUCCESS;
}

CUresult FakeCtxGetDevice(CUdevice* device) {
  if (CUresult r = Enter(Fn::kCtxGetDevice); r != CUDA_SUCCESS) return r;
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  State& s = S();
  MutexLock lock(&s.mu);
  const Context* context = CurrentContext(s);
  if (context == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  *device = Handle(s, context->device);
  return CUDA_SUCCESS;
}

// cuCtxGetId(NULL) reads the current context's id without the lock, like cuCtxGetCurrent:
// kpack calls it on every launch.
CUresult FakeCtxGetId(CUcontext handle, unsigned long long* id) {  // NOLINT(runtime/int)
  if (CUresult r = Enter(Fn::kCtxGetId); r != CUDA_SUCCESS) return r;
  if (id == nullptr) return CUDA_ERROR_INVALID_VALUE;
  State& s = S();
  if (handle == nullptr) {
    const Context* current = CurrentContext(s);
    if (current == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
    *id = current->id.load(std::memory_order_relaxed);
    return CUDA_SUCCESS;
  }
  MutexLock lock(&s.mu);
  const Context* context = s.contexts.Find(handle);
  if (context == nullptr) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
  *id = context->id.load(std::memory_order_relaxed);
  return CUDA_SUCCESS;
}

CUresult FakeCtxPushCurrent(CUcontext handle) {
  if (CUresult r = Enter(Fn::kCtxPushCurrent); r != CUDA_SUCCESS) return r;
  if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
  State& s = S();
  MutexLock lock(&s.mu);
  Context* context = s.contexts.Find(handle);
  if (context == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  ThreadContexts& thread = ThisThread(s);
  // The stack is a fixed array so that no context call allocates; 64 deep is plenty.
  if (thread.depth == kMaxContextDepth) return CUDA_ERROR_OUT_OF_MEMORY;
  thread.stack[thread.depth++] = context;
  return CUDA_SUCCESS;
}

CUresult FakeCtxPopCurrent(CUcontext* popped) {
  if (CUresult r = Enter(Fn::kCtxPopCurrent); r != CUDA_SUCCESS) return r;
  State& s = S();
  MutexLock lock(&s.mu);
  ThreadContexts& thread = ThisThread(s);
  if (thread.depth == 0) return CUDA_ERROR_INVALID_CONTEXT;
  Context* top = thread.stack[--thread.depth];
  if (popped != nullptr) *popped = reinterpret_cast<CUcontext>(top);
  return CUDA_SUCCESS;
}

CUresult FakeCtxSynchronize() {
  if (CUresult r = Enter(Fn::kCtxSynchronize); r != CUDA_SUCCESS) return r;
  State& s = S();
  {
    MutexLock lock(&s.mu);
    if (CurrentContext(s) == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
    if (CUresult r = CheckUnsafeCall(s); r != CUDA_SUCCESS) return r;
  }
  if (CUresult r = WaitForQueued("cuCtxSynchronize"); r != CUDA_SUCCESS) return r;
  MutexLock lock(&s.mu);
  return StickyError(s);
}

// A new context on `device`, pushed onto the calling thread's stack (cuCtxCreate_v4;
// creation parameters are not modelled and must be null).
CUresult FakeCtxCreate(CUcontext* handle, CUctxCreateParams* params, unsigned int flags,
                       CUdevice device) {
  if (CUresult r = Enter(Fn::kCtxCreate); r != CUDA_SUCCESS) return r;
  if (handle == nullptr || params != nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  State& s = S();
  MutexLock lock(&s.mu);
  const int ordinal = Ordinal(s, device);
  if (ordinal < 0) return CUDA_ERROR_INVALID_DEVICE;
  ThreadContexts& thread = ThisThread(s);
  if (thread.depth == kMaxContextDepth) return CUDA_ERROR_OUT_OF_MEMORY;
  Context* context = NewContext(s, ordinal, /*primary=*/false);
  thread.stack[thread.depth++] = context;
  *handle = reinterpret_cast<CUcontext>(context);
  return CUDA_SUCCESS;
}

// Everything that belongs to a context goes with it: its streams (and their captures),
// modules, CUfunctions and memory. If it is current on the calling thread it is popped.
CUresult FakeCtxDestroy(CUcontext handle) {
  if (CUresult r = Enter(Fn::kCtxDestroy); r != CUDA_SUCCESS) return r;
  State& s = S();
  Destructors destructors;
  MutexLock lock(&s.mu);
  Context* context = s.contexts.Find(handle);
  if (context == nullptr || context->primary) return CUDA_ERROR_INVALID_CONTEXT;
  std::vector<const void*> streams;
  for (auto& [key, stream] : s.streams) {
    if (stream->context == context) streams.push_back(key);
  }
  for (const void* key : streams) DestroyStream(s, s.streams.Find(key), destructors);
  std::vector<Image*> modules;
  for (auto& [key, image] : s.images) {
    if (image->module_context == context) modules.push_back(image.get());
  }
  for (Image* image : modules) UnloadImage(s, image);
  for (auto it = s.bound_functions.begin(); it != s.bound_functions.end();) {
    if (it->first.second == context) {
      s.bound_by_handle.erase(it->second.get());
      s.retired.push_back(std::move(it->second));
      s.bound_functions.erase(it++);
    } else {
      ++it;
    }
  }
  for (size_t i = 0; i < s.allocations.size();) {
    if (s.allocations[i].context == context) {
      std::free(reinterpret_cast<void*>(s.allocations[i].base));
      s.live_bytes -= static_cast<int64_t>(s.allocations[i].size);
      s.allocations[i] = s.allocations.back();
      s.allocations.pop_back();
    } else {
      ++i;
    }
  }
  ThreadContexts& thread = ThisThread(s);
  if (thread.depth > 0 && thread.stack[thread.depth - 1] == context) --thread.depth;
  context->id.store(0, std::memory_order_relaxed);
  s.dead_contexts.push_back(s.contexts.Take(handle));
  return CUDA_SUCCESS;
}

CUresult FakeLibraryLoadData(CUlibrary* library, const void* code, CUjit_option* /*options*/,
                             void** /*option_values*/, unsigned int /*num_options*/,
                             CUlibraryOption* /*library_options*/, void** /*library_option_values*/,
                             unsigned int /*num_library_options*/) {
  if (CUresult r = Enter(Fn::kLibraryLoadData); r != CUDA_SUCCESS) return r;
  if (library == nullptr || code == nullptr) return CUDA_ERROR_INVALID_VALUE;
  State& s = S();
  MutexLock lock(&s.mu);
  if (CUresult r = CheckUnsafeCall(s); r != CUDA_SUCCESS) return r;
  Image* image = nullptr;
  if (CUresult r = LoadImage(s, code, nullptr, &image); r != CUDA_SUCCESS) return r;
  *library = reinterpret_cast<CUlibrary>(image);
  return CUDA_SUCCESS;
}

CUresult FakeLibraryUnload(CUlibrary library) {
  if (CUresult r = Enter(Fn::kLibraryUnload); r != CUDA_SUCCESS) return r;
  State& s = S();
  MutexLock lock(&s.mu);
  Image* image = s.images.Find(library);
  if (image == nullptr || image->module_context != nullptr) return CUDA_ERROR_INVALID_HANDLE;
  UnloadImage(s, image);
  return CUDA_SUCCESS;
}

CUresult FakeLibraryGetKernel(CUkernel* kernel, CUlibrary library, const char* name) {
  if (CUresult r = Enter(Fn::kLibraryGetKernel); r != CUDA_SUCCESS) return r;
  if (kernel == nullptr || name == nullptr) return CUDA_ERROR_INVALID_VALUE;
  State& s = S();
  MutexLock lock(&s.mu);
  Image* image = s.images.Find(library);
  if (image == nullptr || image->module_context != nullptr) return CUDA_ERROR_INVALID_HANDLE;
  Entry* entry = FindByName(*image, name);
  if (entry == nullptr) return CUDA_ERROR_NOT_FOUND;
  // With lazy loading the real driver loads the kernel's code here, which is when an
  // unusable architecture shows.
  const bool runs = std::any_of(s.devices.begin(), s.devices.end(),
                                [&](const DeviceConfig& d) { return ArchRunsOn(image->arch, d); });
  if (!runs) return CUDA_ERROR_NO_BINARY_FOR_GPU;
  *kernel = reinterpret_cast<CUkernel>(entry);
  return CUDA_SUCCESS;
}

CUresult FakeKernelGetAttribute(int* value, CUfunction_attribute attribute, CUkernel kernel,
                                CUdevice device_handle) {
  if (CUresult r = Enter(Fn::kKernelGetAttribute); r != CUDA_SUCCESS) return r;
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  State& s = S();
  MutexLock lock(&s.mu);
  const Entry* entry = FindLibraryEntry(s, kernel);
  if (entry == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  const int device = Ordinal(s, device_handle);
  if (device < 0) return CUDA_ERROR_INVALID_DEVICE;
  switch (attribute) {
    case CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK:
      *value = std::min(s.limits.max_threads_per_block, s.devices[device].max_threads_per_block);
      return CUDA_SUCCESS;
    case CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES:
      *value = s.limits.static_shared_bytes;
      return CUDA_SUCCESS;
    case CU_FUNC_ATTRIBUTE_NUM_REGS:
      *value = s.limits.num_regs;
      return CUDA_SUCCESS;
    case CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES:
    case CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES:
      *value = 0;
      return CUDA_SUCCESS;
    case CU_FUNC_ATTRIBUTE_PTX_VERSION:
    case CU_FUNC_ATTRIBUTE_BINARY_VERSION:
      *value = entry->image->arch;
      return CUDA_SUCCESS;
    case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES:
      *value = DynamicSharedLimit(s, *entry, device);
      return CUDA_SUCCESS;
    case CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT:
      *value = SetAttribute(*entry, device, attribute).value_or(-1);
      return CUDA_SUCCESS;
    case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH:
    case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_HEIGHT:
    case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_DEPTH:
    case CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED:
    case CU_FUNC_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE:
      *value = SetAttribute(*entry, device, attribute).value_or(0);
      return CUDA_SUCCESS;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
}

// Only the attributes the real driver lets one set; read-only ones are
// CUDA_ERROR_INVALID_VALUE there too.
CUresult FakeKernelSetAttribute(CUfunction_attribute attribute, int value, CUkernel kernel,
                                CUdevice device_handle) {
  if (CUresult r = Enter(Fn::kKernelSetAttribute); r != CUDA_SUCCESS) return r;
  State& s = S();
  MutexLock lock(&s.mu);
  Entry* entry = FindLibraryEntry(s, kernel);
  if (entry == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  const int device = Ordinal(s, device_handle);
  if (device < 0) return CUDA_ERROR_INVALID_DEVICE;
  bool valid = false;
  switch (attribute) {
    case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES:
      valid = value >= 0 && value <= s.devices[device].max_shared_memory_per_block_optin -
                                         s.limits.static_shared_bytes;
      break;
    case CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT:
      valid = value >= -1 && value <= 100;
      break;
    case CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED:
      valid = value == 0 || value == 1;
      break;
    case CU_FUNC_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE:
      valid = value >= CU_CLUSTER_SCHEDULING_POLICY_DEFAULT &&
              value <= CU_CLUSTER_SCHEDULING_POLICY_LOAD_BALANCING;
      break;
    case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH:
    case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_HEIGHT:
    case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_DEPTH:
      valid = value >= 0;
      break;
    default:
      break;
  }
  if (!valid) return CUDA_ERROR_INVALID_VALUE;
  entry->attributes[{device, static_cast<int>(attribute)}] = value;
  s.attribute_sets.push_back(
      {.entry = entry->name, .attribute = attribute, .value = value, .device = device_handle});
  return CUDA_SUCCESS;
}

CUresult FakeKernelGetParamInfo(CUkernel kernel, size_t index, size_t* offset, size_t* size) {
  if (CUresult r = Enter(Fn::kKernelGetParamInfo); r != CUDA_SUCCESS) return r;
  if (offset == nullptr) return CUDA_ERROR_INVALID_VALUE;
  State& s = S();
  MutexLock lock(&s.mu);
  const Entry* entry = FindLibraryEntry(s, kernel);
  if (entry == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (index >= entry->params.size()) return CUDA_ERROR_INVALID_VALUE;
  *offset = entry->params[index].offset;
  if (size != nullptr) *size = entry->params[index].size;
  return CUDA_SUCCESS;
}

// A CUfunction per (library kernel, context), launchable only in that context, like the
// real driver's; asking again in the same context gives the same handle.
CUresult FakeKernelGetFunction(CUfunction* function, CUkernel kernel) {
  if (CUresult r = Enter(Fn::kKernelGetFunction); r != CUDA_SUCCESS) return r;
  if (function == nullptr) return CUDA_ERROR_INVALID_VALUE;
  State& s = S();
  MutexLock lock(&s.mu);
  const Entry* entry = FindLibraryEntry(s, kernel);
  if (entry == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  const Context* context = CurrentContext(s);
  if (context == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if (!ArchRunsOn(entry->image->arch, s.devices[context->device])) {
    return CUDA_ERROR_NO_BINARY_FOR_GPU;
  }
  auto it = s.bound_functions.find(std::pair{entry, context});
  if (it == s.bound_functions.end()) {
    // The first call in a context loads the kernel there.
    if (CUresult r = CheckUnsafeCall(s); r != CUDA_SUCCESS) return r;
  }
  auto& bound = s.bound_functions[{entry, context}];
  if (bound == nullptr) {
    bound = std::make_unique<State::BoundFunction>();
    bound->entry = const_cast<Entry*>(entry);
    bound->context = const_cast<Context*>(context);
    s.bound_by_handle[bound.get()] = bound.get();
  }
  *function = reinterpret_cast<CUfunction>(bound.get());
  return CUDA_SUCCESS;
}

CUresult FakeModuleLoadData(CUmodule* module, const void* code) {
  if (CUresult r = Enter(Fn::kModuleLoadData); r != CUDA_SUCCESS) return r;
  if (module == nullptr || code == nullptr) return CUDA_ERROR_INVALID_VALUE;
  State& s = S();
  MutexLock lock(&s.mu);
  Context* context = CurrentContext(s);
  if (context == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if (CUresult r = CheckUnsafeCall(s); r != CUDA_SUCCESS) return r;
  Image* image = nullptr;
  if (CUresult r = LoadImage(s, code, context, &image); r != CUDA_SUCCESS) return r;
  *module = reinterpret_cast<CUmodule>(image);
  return CUDA_SUCCESS;
}

CUresult FakeModuleUnload(CUmodule module) {
  if (CUresult r = Enter(Fn::kModuleUnload); r != CUDA_SUCCESS) return r;
  State& s = S();
  MutexLock lock(&s.mu);
  Image* image = s.images.Find(module);
  if (image == nullptr || image->module_context == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  UnloadImage(s, image);
  return CUDA_SUCCESS;
}

CUresult FakeModuleGetFunction(CUfunction* function, CUmodule module, const char* name) {
  if (CUresult r = Enter(Fn::kModuleGetFunction); r != CUDA_SUCCESS) return r;
  if (function == nullptr || name == nullptr) return CUDA_ERROR_INVALID_VALUE;
  State& s = S();
  MutexLock lock(&s.mu);
  Image* image = s.images.Find(module);
  if (image == nullptr || image->module_context == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  Entry* entry = FindByName(*image, name);
  if (entry == nullptr) return CUDA_ERROR_NOT_FOUND;
  *function = reinterpret_cast<CUfunction>(entry);
  return CUDA_SUCCESS;
}

CUresult CheckShape(const State& s, const CUlaunchConfig& config, const Entry& entry, int device)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
  if (config.gridDimX == 0 || config.gridDimY == 0 || config.gridDimZ == 0 ||
      config.blockDimX == 0 || config.blockDimY == 0 || config.blockDimZ == 0 ||
      config.gridDimX > kMaxGridDimX || config.gridDimY > kMaxGridDimYZ ||
      config.gridDimZ > kMaxGridDimYZ || config.blockDimX > kMaxBlockDimXY ||
      config.blockDimY > kMaxBlockDimXY || config.blockDimZ > kMaxBlockDimZ) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  const uint64_t threads = uint64_t{config.blockDimX} * config.blockDimY * config.blockDimZ;
  const int max_threads =
      std::min(s.limits.max_threads_per_block, s.devices[device].max_threads_per_block);
  if (threads > static_cast<uint64_t>(max_threads)) return CUDA_ERROR_INVALID_VALUE;
  if (config.sharedMemBytes > static_cast<unsigned>(DynamicSharedLimit(s, entry, device))) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  for (unsigned i = 0; i < config.numAttrs; ++i) {
    const CUlaunchAttribute& attribute = config.attrs[i];
    if (attribute.id != CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION) continue;
    const auto& cluster = attribute.value.clusterDim;
    if (cluster.x == 0 || cluster.y == 0 || cluster.z == 0 || config.gridDimX % cluster.x != 0 ||
        config.gridDimY % cluster.y != 0 || config.gridDimZ % cluster.z != 0) {
      return CUDA_ERROR_INVALID_CLUSTER_SIZE;
    }
    const bool non_portable =
        SetAttribute(entry, device, CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED)
            .value_or(0) == 1;
    const uint64_t size = uint64_t{cluster.x} * cluster.y * cluster.z;
    if (size > (non_portable ? kNonPortableClusterSize : kPortableClusterSize)) {
      return CUDA_ERROR_INVALID_CLUSTER_SIZE;
    }
  }
  return CUDA_SUCCESS;
}

// Copies the arguments into record->params as the kernel's parameter buffer.
CUresult CopyParams(const Entry& entry, void** kernel_params, void** extra, LaunchRecord* record) {
  record->param_size = entry.param_bytes;
  if (kernel_params != nullptr && extra != nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (extra != nullptr) {
    record->params_via_extra = true;
    const void* buffer = nullptr;
    const size_t* size = nullptr;
    for (int i = 0;; i += 2) {
      if (i >= 2 * kMaxExtraEntries) return CUDA_ERROR_INVALID_VALUE;
      if (extra[i] == CU_LAUNCH_PARAM_END) break;
      if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER) {
        buffer = extra[i + 1];
      } else if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE) {
        size = static_cast<const size_t*>(extra[i + 1]);
      } else {
        return CUDA_ERROR_INVALID_VALUE;
      }
    }
    if (size == nullptr || *size != entry.param_bytes || (buffer == nullptr && *size > 0)) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    if (*size > 0) {
      std::memcpy(record->params.data(), buffer, std::min(*size, kMaxRecordedParamBytes));
    }
    return CUDA_SUCCESS;
  }
  if (entry.params.empty()) return CUDA_SUCCESS;
  if (kernel_params == nullptr) return CUDA_ERROR_INVALID_VALUE;
  for (const internal::CubinParam& param : entry.params) {
    const void* value = kernel_params[param.ordinal];
    if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (param.offset >= kMaxRecordedParamBytes) continue;
    std::memcpy(record->params.data() + param.offset, value,
                std::min<size_t>(param.size, kMaxRecordedParamBytes - param.offset));
  }
  return CUDA_SUCCESS;
}

CUresult ValidateAndRecordLaunch(State& s, const CUlaunchConfig& launch, CUfunction function,
                                 void** kernel_params, void** extra, LaunchRecord* out,
                                 KernelEmulator* emulator, uint64_t* stream_id);

// Runs emulated kernels now, or, when earlier work of their stream (`stream_id`, 0 when
// nothing is queued at all) is still queued on the driver's thread, behind it there.
void Execute(uint64_t stream_id, std::vector<std::pair<KernelEmulator, LaunchRecord>> kernels) {
  if (kernels.empty()) return;
  if (stream_id != 0 && Worker().Busy(stream_id)) {
    Worker().Enqueue(stream_id, [kernels = std::move(kernels)] {
      for (const auto& [emulator, record] : kernels) Emulate(emulator, record);
    });
    return;
  }
  for (const auto& [emulator, record] : kernels) Emulate(emulator, record);
}

CUresult FakeLaunchKernelEx(const CUlaunchConfig* config, CUfunction function, void** kernel_params,
                            void** extra) {
  if (CUresult r = Enter(Fn::kLaunchKernelEx); r != CUDA_SUCCESS) return r;
  State& s = S();
  if (s.launch_noop.load(std::memory_order_relaxed)) return CUDA_SUCCESS;
  if (config == nullptr || (config->numAttrs > 0 && config->attrs == nullptr)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  // On the stack, not the heap: the launch path must not allocate.
  LaunchRecord record{};
  KernelEmulator emulator = nullptr;
  uint64_t stream_id = 0;
  if (CUresult r = ValidateAndRecordLaunch(s, *config, function, kernel_params, extra, &record,
                                           &emulator, &stream_id);
      r != CUDA_SUCCESS) {
    return r;
  }
  if (emulator == nullptr) return CUDA_SUCCESS;
  if (stream_id == 0) {
    Emulate(emulator, record);  // nothing queued anywhere: no allocation
  } else {
    Execute(stream_id, {{emulator, record}});
  }
  return CUDA_SUCCESS;
}

// cuLaunchKernelEx's checks and recording, under the lock. `emulator`: the entry's
// emulator when the launch executes (is not captured); `stream_id`: the stream's id when
// the driver's thread has work queued (else 0).
CUresult ValidateAndRecordLaunch(State& s, const CUlaunchConfig& launch, CUfunction function,
                                 void** kernel_params, void** extra, LaunchRecord* out,
                                 KernelEmulator* emulator, uint64_t* stream_id) {
  const CUlaunchConfig* config = &launch;
  LaunchRecord& record = *out;
  MutexLock lock(&s.mu);
  Context* context = CurrentContext(s);
  if (context == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  const Entry* entry = FindEntry(s, function);
  const Context* module_context = nullptr;
  if (entry != nullptr) {
    module_context = entry->image->module_context;
  } else if (auto it = s.bound_by_handle.find(function); it != s.bound_by_handle.end()) {
    entry = it->second->entry;
    module_context = it->second->context;
  } else {
    return CUDA_ERROR_INVALID_HANDLE;
  }
  if (module_context != nullptr && module_context != context) return CUDA_ERROR_INVALID_CONTEXT;
  if (!ArchRunsOn(entry->image->arch, s.devices[context->device])) {
    return CUDA_ERROR_NO_BINARY_FOR_GPU;
  }
  Stream* stream = nullptr;
  if (CUresult r = ResolveStream(s, config->hStream, context, &stream); r != CUDA_SUCCESS) {
    return r;
  }
  if (CUresult r = CheckShape(s, *config, *entry, context->device); r != CUDA_SUCCESS) return r;

  const size_t name_size = std::min(entry->name.size(), kMaxRecordedEntryName - 1);
  std::memcpy(record.entry.data(), entry->name.data(), name_size);
  record.grid = {config->gridDimX, config->gridDimY, config->gridDimZ};
  record.block = {config->blockDimX, config->blockDimY, config->blockDimZ};
  record.shared_bytes = config->sharedMemBytes;
  record.stream = config->hStream;
  record.context = reinterpret_cast<CUcontext>(context);
  record.function = function;
  record.num_attrs = config->numAttrs;
  record.num_params = static_cast<unsigned>(entry->params.size());
  for (const internal::CubinParam& param : entry->params) {
    if (param.ordinal < kMaxRecordedParams) {
      record.param_layout[param.ordinal] = {static_cast<uint16_t>(param.offset),
                                            static_cast<uint16_t>(param.size)};
    }
  }
  const unsigned copied = std::min<unsigned>(config->numAttrs, kMaxRecordedLaunchAttrs);
  std::copy_n(config->attrs, copied, record.attrs.begin());
  if (CUresult r = CopyParams(*entry, kernel_params, extra, &record); r != CUDA_SUCCESS) {
    return r;
  }
  RecordLaunch(s, record, stream);
  const bool captured = stream != nullptr && stream->capture == CU_STREAM_CAPTURE_STATUS_ACTIVE;
  if (!captured) *emulator = FindEmulator(s, entry->name);
  if (*emulator != nullptr && Worker().AnyPending()) {
    *stream_id = StreamIdentity(s, config->hStream, context, stream);
  }
  return CUDA_SUCCESS;
}

CUresult FakeMemAlloc(CUdeviceptr* pointer, size_t size) {
  if (CUresult r = Enter(Fn::kMemAlloc); r != CUDA_SUCCESS) return r;
  if (pointer == nullptr || size == 0) return CUDA_ERROR_INVALID_VALUE;
  State& s = S();
  MutexLock lock(&s.mu);
  if (CurrentContext(s) == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if (CUresult r = CheckUnsafeCall(s); r != CUDA_SUCCESS) return r;
  if (size > kMaxLiveBytes - static_cast<size_t>(s.live_bytes)) return CUDA_ERROR_OUT_OF_MEMORY;
  const size_t rounded =
      (size + kAllocationAlignment - 1) / kAllocationAlignment * kAllocationAlignment;
  // malloc-family memory, not operator new, so tests counting allocations per launch do
  // not see device allocations as host ones.
  void* memory = std::aligned_alloc(kAllocationAlignment, rounded);
  if (memory == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
  std::memset(memory, kUninitializedByte, rounded);
  const auto base = reinterpret_cast<CUdeviceptr>(memory);
  s.allocations.push_back(
      {.base = base, .size = size, .context = CurrentContext(s), .id = NewId()});
  s.live_bytes += static_cast<int64_t>(size);
  *pointer = base;
  return CUDA_SUCCESS;
}

// Like cudaFree, cuMemFree synchronizes the device: it waits for the work queued before it.
CUresult FakeMemFree(CUdeviceptr pointer) {
  if (CUresult r = Enter(Fn::kMemFree); r != CUDA_SUCCESS) return r;
  State& s = S();
  {
    MutexLock lock(&s.mu);
    if (CurrentContext(s) == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
    if (CUresult r = CheckUnsafeCall(s); r != CUDA_SUCCESS) return r;
  }
  if (CUresult r = WaitForQueued("cuMemFree"); r != CUDA_SUCCESS) return r;
  MutexLock lock(&s.mu);
  auto it = std::find_if(s.allocations.begin(), s.allocations.end(),
                         [pointer](const Allocation& a) { return a.base == pointer; });
  if (it == s.allocations.end()) return CUDA_ERROR_INVALID_VALUE;
  std::free(reinterpret_cast<void*>(it->base));
  s.live_bytes -= static_cast<int64_t>(it->size);
  *it = s.allocations.back();
  s.allocations.pop_back();
  return CUDA_SUCCESS;
}

// [pointer, pointer + size) inside one live allocation: its host address (null for size 0).
CUresult LiveRange(const State& s, CUdeviceptr pointer, size_t size, void** host)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
  *host = nullptr;
  if (size == 0) return CUDA_SUCCESS;
  for (const Allocation& allocation : s.allocations) {
    if (pointer >= allocation.base && size <= allocation.size &&
        pointer - allocation.base <= allocation.size - size) {
      *host = reinterpret_cast<void*>(pointer);
      return CUDA_SUCCESS;
    }
  }
  return CUDA_ERROR_INVALID_VALUE;
}

// The checks shared by the synchronous memory functions: a context, no capture forbidding
// it, and [pointer, pointer + size) inside one live allocation. Returns the host address.
CUresult DeviceRange(State& s, CUdeviceptr pointer, size_t size, void** host)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
  if (CurrentContext(s) == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if (CUresult r = CheckUnsafeCall(s); r != CUDA_SUCCESS) return r;
  if (CUresult r = StickyError(s); r != CUDA_SUCCESS) return r;
  return LiveRange(s, pointer, size, host);
}

CUresult FakeMemcpyHtoD(CUdeviceptr destination, const void* source, size_t size) {
  if (CUresult r = Enter(Fn::kMemcpyHtoD); r != CUDA_SUCCESS) return r;
  // On the legacy stream: after the work queued before it.
  if (CUresult r = WaitForQueued("cuMemcpyHtoD"); r != CUDA_SUCCESS) return r;
  if (source == nullptr && size > 0) return CUDA_ERROR_INVALID_VALUE;
  State& s = S();
  MutexLock lock(&s.mu);
  void* host = nullptr;
  if (CUresult r = DeviceRange(s, destination, size, &host); r != CUDA_SUCCESS) return r;
  if (size > 0) std::memcpy(host, source, size);
  return CUDA_SUCCESS;
}

CUresult FakeMemcpyDtoH(void* destination, CUdeviceptr source, size_t size) {
  if (CUresult r = Enter(Fn::kMemcpyDtoH); r != CUDA_SUCCESS) return r;
  // On the legacy stream: after the work queued before it.
  if (CUresult r = WaitForQueued("cuMemcpyDtoH"); r != CUDA_SUCCESS) return r;
  if (destination == nullptr && size > 0) return CUDA_ERROR_INVALID_VALUE;
  State& s = S();
  MutexLock lock(&s.mu);
  void* host = nullptr;
  if (CUresult r = DeviceRange(s, source, size, &host); r != CUDA_SUCCESS) return r;
  if (size > 0) std::memcpy(destination, host, size);
  return CUDA_SUCCESS;
}

CUresult FakeMemsetD8(CUdeviceptr destination, unsigned char value, size_t count) {
  if (CUresult r = Enter(Fn::kMemsetD8); r != CUDA_SUCCESS) return r;
  // On the legacy stream: after the work queued before it.
  if (CUresult r = WaitForQueued("cuMemsetD8"); r != CUDA_SUCCESS) return r;
  State& s = S();
  MutexLock lock(&s.mu);
  void* host = nullptr;
  if (CUresult r = DeviceRange(s, destination, count, &host); r != CUDA_SUCCESS) return r;
  if (count > 0) std::memset(host, value, count);
  return CUDA_SUCCESS;
}

// Pinned host memory is plain host memory here; the fake only keeps track of it.
CUresult FakeMemAllocHost(void** pointer, size_t size) {
  if (CUresult r = Enter(Fn::kMemAllocHost); r != CUDA_SUCCESS) return r;
  if (pointer == nullptr || size == 0) return CUDA_ERROR_INVALID_VALUE;
  State& s = S();
  MutexLock lock(&s.mu);
  if (CurrentContext(s) == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if (CUresult r = CheckUnsafeCall(s); r != CUDA_SUCCESS) return r;
  if (size > kMaxLiveBytes) return CUDA_ERROR_OUT_OF_MEMORY;
  const size_t rounded =
      (size + kAllocationAlignment - 1) / kAllocationAlignment * kAllocationAlignment;
  void* memory = std::aligned_alloc(kAllocationAlignment, rounded);
  if (memory == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
  std::memset(memory, kUninitializedByte, rounded);
  s.host_allocations.push_back(memory);
  *pointer = memory;
  return CUDA_SUCCESS;
}

CUresult FakeMemFreeHost(void* pointer) {
  if (CUresult r = Enter(Fn::kMemFreeHost); r != CUDA_SUCCESS) return r;
  State& s = S();
  MutexLock lock(&s.mu);
  if (CurrentContext(s) == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if (CUresult r = CheckUnsafeCall(s); r != CUDA_SUCCESS) return r;
  auto it = std::find(s.host_allocations.begin(), s.host_allocations.end(), pointer);
  if (it == s.host_allocations.end()) return CUDA_ERROR_INVALID_VALUE;
  std::free(pointer);
  *it = s.host_allocations.back();
  s.host_allocations.pop_back();
  return CUDA_SUCCESS;
}

// The asynchronous copies run when issued, like launches: on a live stream of the current
// context (or a default stream), never into a capture (memcpy nodes are not modelled),
// the device range inside one live allocation. Legal while another stream captures.
CUresult AsyncCopy(Fn fn, CUstream handle, CUdeviceptr device, size_t size, void** host) {
  if (CUresult r = Enter(fn); r != CUDA_SUCCESS) return r;
  State& s = S();
  MutexLock lock(&s.mu);
  const Context* context = nullptr;
  Stream* stream = nullptr;
  if (CUresult r = ResolveUncapturedStream(s, handle, &context, &stream); r != CUDA_SUCCESS) {
    return r;
  }
  if (CUresult r = StickyError(s); r != CUDA_SUCCESS) return r;
  return LiveRange(s, device, size, host);
}

CUresult FakeMemcpyHtoDAsync(CUdeviceptr destination, const void* source, size_t size,
                             CUstream stream) {
  if (source == nullptr && size > 0) return CUDA_ERROR_INVALID_VALUE;
  void* host = nullptr;
  if (CUresult r = AsyncCopy(Fn::kMemcpyHtoDAsync, stream, destination, size, &host);
      r != CUDA_SUCCESS) {
    return r;
  }
  if (size > 0) std::memcpy(host, source, size);
  return CUDA_SUCCESS;
}

CUresult FakeMemcpyDtoHAsync(void* destination, CUdeviceptr source, size_t size, CUstream stream) {
  if (destination == nullptr && size > 0) return CUDA_ERROR_INVALID_VALUE;
  void* host = nullptr;
  if (CUresult r = AsyncCopy(Fn::kMemcpyDtoHAsync, stream, source, size, &host);
      r != CUDA_SUCCESS) {
    return r;
  }
  if (size > 0) std::memcpy(destination, host, size);
  return CUDA_SUCCESS;
}

CUresult FakeStreamCreate(CUstream* handle, unsigned int flags) {
  if (CUresult r = Enter(Fn::kStreamCreate); r != CUDA_SUCCESS) return r;
  if (handle == nullptr || (flags & ~CU_STREAM_NON_BLOCKING) != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  State& s = S();
  MutexLock lock(&s.mu);
  Context* context = CurrentContext(s);
  if (context == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  std::unique_ptr<Stream> stream;
  if (s.reuse_handles && !s.dead_streams.empty()) {
    stream = std::move(s.dead_streams.back());
    s.dead_streams.pop_back();
    *stream = Stream{};
  } else {
    stream = std::make_unique<Stream>();
  }
  stream->context = context;
  stream->id = NewId();
  *handle = reinterpret_cast<CUstream>(s.streams.Add(std::move(stream)));
  return CUDA_SUCCESS;
}

CUresult FakeStreamDestroy(CUstream handle) {
  if (CUresult r = Enter(Fn::kStreamDestroy); r != CUDA_SUCCESS) return r;
  State& s = S();
  Destructors destructors;
  MutexLock lock(&s.mu);
  Stream* stream = s.streams.Find(handle);
  if (stream == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  DestroyStream(s, stream, destructors);
  return CUDA_SUCCESS;
}

// Waits for the stream's work queued on the driver's thread (the legacy stream's: all of
// it, as the legacy stream waits for every blocking stream).
CUresult FakeStreamSynchronize(CUstream handle) {
  if (CUresult r = Enter(Fn::kStreamSynchronize); r != CUDA_SUCCESS) return r;
  State& s = S();
  uint64_t id = 0;
  {
    MutexLock lock(&s.mu);
    const Context* context = CurrentContext(s);
    Stream* stream = nullptr;
    if (IsDefaultStream(handle)) {
      if (context == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
    } else {
      stream = s.streams.Find(handle);
      if (stream == nullptr) return CUDA_ERROR_INVALID_HANDLE;
      if (stream->capture != CU_STREAM_CAPTURE_STATUS_NONE) {
        stream->capture = CU_STREAM_CAPTURE_STATUS_INVALIDATED;
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
      }
    }
    if (stream != nullptr || handle == CU_STREAM_PER_THREAD) {
      id = StreamIdentity(s, handle, stream != nullptr ? stream->context : context, stream);
    }
  }
  if (CUresult r = WaitForQueued("cuStreamSynchronize", id); r != CUDA_SUCCESS) return r;
  MutexLock lock(&s.mu);
  return StickyError(s);
}

// Queued on the driver's thread; later work of the stream runs after it. Host nodes in a
// capture are not modelled.
CUresult FakeLaunchHostFunc(CUstream handle, CUhostFn fn, void* data) {
  if (CUresult r = Enter(Fn::kLaunchHostFunc); r != CUDA_SUCCESS) return r;
  if (fn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  State& s = S();
  uint64_t id = 0;
  {
    MutexLock lock(&s.mu);
    const Context* context = nullptr;
    Stream* stream = nullptr;
    if (CUresult r = ResolveUncapturedStream(s, handle, &context, &stream); r != CUDA_SUCCESS) {
      return r;
    }
    id = StreamIdentity(s, handle, context, stream);
  }
  Worker().Enqueue(id, [fn, data] { fn(data); });
  return CUDA_SUCCESS;
}

// Real streams have their own id; the legacy stream one per context; the per-thread
// stream one per (thread, context). A capturing stream has none to give (see below).
CUresult FakeStreamGetId(CUstream handle, unsigned long long* id) {  // NOLINT(runtime/int)
  if (CUresult r = Enter(Fn::kStreamGetId); r != CUDA_SUCCESS) return r;
  if (id == nullptr) return CUDA_ERROR_INVALID_VALUE;
  State& s = S();
  MutexLock lock(&s.mu);
  if (IsDefaultStream(handle)) {
    const Context* current = CurrentContext(s);
    if (current == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
    *id = StreamIdentity(s, handle, current, nullptr);
    return CUDA_SUCCESS;
  }
  Stream* stream = s.streams.Find(handle);
  if (stream == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  // Seen on driver 580: asked of a capturing stream, cuStreamGetId fails with
  // CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and invalidates the capture.
  if (stream->capture != CU_STREAM_CAPTURE_STATUS_NONE) {
    stream->capture = CU_STREAM_CAPTURE_STATUS_INVALIDATED;
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  }
  *id = stream->id;
  return CUDA_SUCCESS;
}

CUresult FakeStreamGetCtx(CUstream handle, CUcontext* context) {
  if (CUresult r = Enter(Fn::kStreamGetCtx); r != CUDA_SUCCESS) return r;
  if (context == nullptr) return CUDA_ERROR_INVALID_VALUE;
  State& s = S();
  MutexLock lock(&s.mu);
  if (IsDefaultStream(handle)) {
    Context* current = CurrentContext(s);
    if (current == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
    *context = reinterpret_cast<CUcontext>(current);
    return CUDA_SUCCESS;
  }
  const Stream* stream = s.streams.Find(handle);
  if (stream == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  *context = reinterpret_cast<CUcontext>(stream->context);
  return CUDA_SUCCESS;
}

CUresult FakeStreamBeginCapture(CUstream handle, CUstreamCaptureMode mode) {
  if (CUresult r = Enter(Fn::kStreamBeginCapture); r != CUDA_SUCCESS) return r;
  if (mode != CU_STREAM_CAPTURE_MODE_GLOBAL && mode != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
      mode != CU_STREAM_CAPTURE_MODE_RELAXED) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  State& s = S();
  MutexLock lock(&s.mu);
  if (IsDefaultStream(handle)) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  Stream* stream = s.streams.Find(handle);
  if (stream == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (stream->capture != CU_STREAM_CAPTURE_STATUS_NONE) return CUDA_ERROR_ILLEGAL_STATE;
  stream->capture = CU_STREAM_CAPTURE_STATUS_ACTIVE;
  stream->capture_mode = mode;
  stream->capture_thread = std::this_thread::get_id();
  stream->capture_graph = std::make_unique<Graph>();
  stream->capture_graph->launches.reserve(kCaptureReserve);
  stream->capture_id = NewId();
  ++s.active_captures;
  return CUDA_SUCCESS;
}

CUresult FakeStreamEndCapture(CUstream handle, CUgraph* graph) {
  if (CUresult r = Enter(Fn::kStreamEndCapture); r != CUDA_SUCCESS) return r;
  if (graph == nullptr) return CUDA_ERROR_INVALID_VALUE;
  State& s = S();
  Destructors destructors;
  MutexLock lock(&s.mu);
  if (IsDefaultStream(handle)) return CUDA_ERROR_ILLEGAL_STATE;
  Stream* stream = s.streams.Find(handle);
  if (stream == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (stream->capture == CU_STREAM_CAPTURE_STATUS_NONE) return CUDA_ERROR_ILLEGAL_STATE;
  if (stream->capture_mode != CU_STREAM_CAPTURE_MODE_RELAXED &&
      stream->capture_thread != std::this_thread::get_id()) {
    return CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
  }
  const bool invalidated = stream->capture == CU_STREAM_CAPTURE_STATUS_INVALIDATED;
  stream->capture = CU_STREAM_CAPTURE_STATUS_NONE;
  --s.active_captures;
  if (invalidated) {
    *graph = nullptr;
    ReleaseUserObjects(s, stream->capture_graph->user_objects, destructors);
    s.retired.push_back(std::move(stream->capture_graph));
    return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  }
  *graph = reinterpret_cast<CUgraph>(s.graphs.Add(std::move(stream->capture_graph)));
  return CUDA_SUCCESS;
}

CUresult FakeStreamIsCapturing(CUstream handle, CUstreamCaptureStatus* status) {
  if (CUresult r = Enter(Fn::kStreamIsCapturing); r != CUDA_SUCCESS) return r;
  if (status == nullptr) return CUDA_ERROR_INVALID_VALUE;
  State& s = S();
  MutexLock lock(&s.mu);
  if (IsDefaultStream(handle)) {
    *status = CU_STREAM_CAPTURE_STATUS_NONE;
    return CUDA_SUCCESS;
  }
  const Stream* stream = s.streams.Find(handle);
  if (stream == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  *status = stream->capture;
  return CUDA_SUCCESS;
}

// Status, id and graph of a stream's capture; no dependency or edge data (kpack asks for
// none). The default streams report no capture.
CUresult FakeStreamGetCaptureInfo(CUstream handle, CUstreamCaptureStatus* status, cuuint64_t* id,
                                  CUgraph* graph, const CUgraphNode** dependencies,
                                  const CUgraphEdgeData** edges, size_t* num_dependencies) {
  if (CUresult r = Enter(Fn::kStreamGetCaptureInfo); r != CUDA_SUCCESS) return r;
  if (status == nullptr) return CUDA_ERROR_INVALID_VALUE;
  State& s = S();
  MutexLock lock(&s.mu);
  const Stream* stream = nullptr;
  if (!IsDefaultStream(handle)) {
    stream = s.streams.Find(handle);
    if (stream == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  }
  *status = stream != nullptr ? stream->capture : CU_STREAM_CAPTURE_STATUS_NONE;
  const bool active = *status == CU_STREAM_CAPTURE_STATUS_ACTIVE;
  if (id != nullptr && active) *id = stream->capture_id;
  if (graph != nullptr && active) *graph = reinterpret_cast<CUgraph>(stream->capture_graph.get());
  if (dependencies != nullptr && active) *dependencies = nullptr;
  if (edges != nullptr && active) *edges = nullptr;
  if (num_dependencies != nullptr && active) *num_dependencies = 0;
  return CUDA_SUCCESS;
}

CUresult FakeUserObjectCreate(CUuserObject* object, void* ptr, CUhostFn destroy,
                              unsigned int initial_refcount, unsigned int flags) {
  if (CUresult r = Enter(Fn::kUserObjectCreate); r != CUDA_SUCCESS) return r;
  // libcuda requires exactly this flag (destructors never synchronize with the GPU).
  if (object == nullptr || destroy == nullptr || initial_refcount == 0 ||
      flags != CU_USER_OBJECT_NO_DESTRUCTOR_SYNC) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  State& s = S();
  MutexLock lock(&s.mu);
  auto user = std::make_unique<UserObject>();
  user->ptr = ptr;
  user->destroy = destroy;
  user->refcount = initial_refcount;
  *object = reinterpret_cast<CUuserObject>(s.user_objects.Add(std::move(user)));
  return CUDA_SUCCESS;
}

CUresult FakeUserObjectRelease(CUuserObject object, unsigned int count) {
  if (CUresult r = Enter(Fn::kUserObjectRelease); r != CUDA_SUCCESS) return r;
  State& s = S();
  Destructors destructors;
  MutexLock lock(&s.mu);
  UserObject* user = s.user_objects.Find(object);
  if (user == nullptr || count == 0 || count > user->refcount) return CUDA_ERROR_INVALID_VALUE;
  UserObjectRefs refs{{user, count}};
  ReleaseUserObjects(s, refs, destructors);
  return CUDA_SUCCESS;
}

// `graph` may be a finished graph or one being captured (cuStreamGetCaptureInfo's).
CUresult FakeGraphRetainUserObject(CUgraph graph, CUuserObject object, unsigned int count,
                                   unsigned int flags) {
  if (CUresult r = Enter(Fn::kGraphRetainUserObject); r != CUDA_SUCCESS) return r;
  if (count == 0 || (flags != 0 && flags != CU_GRAPH_USER_OBJECT_MOVE)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  State& s = S();
  MutexLock lock(&s.mu);
  Graph* target = s.graphs.Find(graph);
  for (auto it = s.streams.begin(); target == nullptr && it != s.streams.end(); ++it) {
    if (it->second->capture_graph.get() == static_cast<const void*>(graph)) {
      target = it->second->capture_graph.get();
    }
  }
  UserObject* user = s.user_objects.Find(object);
  if (target == nullptr || user == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (flags == CU_GRAPH_USER_OBJECT_MOVE) {
    if (count > user->refcount) return CUDA_ERROR_INVALID_VALUE;  // more than the caller has
  } else {
    user->refcount += count;
  }
  target->user_objects[user] += count;
  return CUDA_SUCCESS;
}

CUresult FakeGraphInstantiateWithFlags(CUgraphExec* exec, CUgraph graph,
                                       unsigned long long flags) {  // NOLINT(runtime/int)
  if (CUresult r = Enter(Fn::kGraphInstantiateWithFlags); r != CUDA_SUCCESS) return r;
  constexpr unsigned long long kKnownFlags =  // NOLINT(runtime/int)
      CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH | CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD |
      CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH | CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY;
  if (exec == nullptr || graph == nullptr || (flags & ~kKnownFlags) != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  State& s = S();
  MutexLock lock(&s.mu);
  const Graph* source = s.graphs.Find(graph);
  if (source == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (CUresult r = CheckUnsafeCall(s); r != CUDA_SUCCESS) return r;
  auto instance = std::make_unique<GraphExec>();
  instance->launches = source->launches;
  instance->edges = source->edges;
  instance->source = source;
  instance->id = NewId();
  for (const auto& [user, count] : source->user_objects) {  // one reference per object
    ++user->refcount;
    instance->user_objects[user] = 1;
  }
  *exec = reinterpret_cast<CUgraphExec>(s.execs.Add(std::move(instance)));
  return CUDA_SUCCESS;
}

CUresult FakeGraphLaunch(CUgraphExec exec, CUstream handle) {
  if (CUresult r = Enter(Fn::kGraphLaunch); r != CUDA_SUCCESS) return r;
  if (exec == nullptr) return CUDA_ERROR_INVALID_VALUE;
  State& s = S();
  if (s.launch_noop.load(std::memory_order_relaxed)) return CUDA_SUCCESS;
  // Emulated kernels run after the lock is released, in the graph's order.
  std::vector<std::pair<KernelEmulator, LaunchRecord>> executed;
  uint64_t stream_id = 0;
  {
    MutexLock lock(&s.mu);
    const GraphExec* instance = s.execs.Find(exec);
    if (instance == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    const Context* context = CurrentContext(s);
    if (context == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
    Stream* stream = nullptr;
    if (CUresult r = ResolveStream(s, handle, context, &stream); r != CUDA_SUCCESS) return r;
    // An executable graph cannot be launched into a capture (measured on an H200 with
    // driver 580: CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED); like every operation a capture
    // refuses, it invalidates the capture.
    if (stream != nullptr && stream->capture == CU_STREAM_CAPTURE_STATUS_ACTIVE) {
      stream->capture = CU_STREAM_CAPTURE_STATUS_INVALIDATED;
      return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    ++s.graph_launches;
    for (const LaunchRecord& node : instance->launches) {
      LaunchRecord replay = node;
      replay.stream = handle;
      replay.captured = false;
      replay.graph_replay = true;
      RecordLaunch(s, replay, stream);
      if (KernelEmulator emulator = FindEmulator(s, absl::string_view(replay.entry.data()));
          emulator != nullptr) {
        executed.emplace_back(emulator, replay);
      }
    }
    if (Worker().AnyPending()) stream_id = StreamIdentity(s, handle, context, stream);
  }
  Execute(stream_id, std::move(executed));
  return CUDA_SUCCESS;
}

CUresult FakeGraphDestroy(CUgraph graph) {
  if (CUresult r = Enter(Fn::kGraphDestroy); r != CUDA_SUCCESS) return r;
  if (graph == nullptr) return CUDA_ERROR_INVALID_VALUE;
  State& s = S();
  Destructors destructors;
  MutexLock lock(&s.mu);
  Graph* target = s.graphs.Find(graph);
  if (target == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  ReleaseUserObjects(s, target->user_objects, destructors);
  RetireNodes(s, target);
  s.retired.push_back(s.graphs.Take(graph));
  return CUDA_SUCCESS;
}

CUresult FakeGraphExecDestroy(CUgraphExec exec) {
  if (CUresult r = Enter(Fn::kGraphExecDestroy); r != CUDA_SUCCESS) return r;
  if (exec == nullptr) return CUDA_ERROR_INVALID_VALUE;
  State& s = S();
  Destructors destructors;
  MutexLock lock(&s.mu);
  GraphExec* instance = s.execs.Find(exec);
  if (instance == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (CUresult r = CheckUnsafeCall(s); r != CUDA_SUCCESS) return r;
  ReleaseUserObjects(s, instance->user_objects, destructors);
  s.retired.push_back(s.execs.Take(exec));
  return CUDA_SUCCESS;
}

// ---------------------------------------------------------------------------------------
// Tensor maps (cuTensorMapEncodeTiled). Kept apart from State: the encode touches nothing
// else of the driver. Each call is validated against the requirements the CUDA driver API
// documents for cuTensorMapEncodeTiled (so that kpack's own checks and alignment are
// tested against the real rules), recorded in a ring (no allocation), and on success the
// 128-byte map is a recognizable blob that DecodeTensorMap reads back: emulators and tests
// can see what a kernel's CUtensorMap parameter describes.

constexpr char kTensorMapMagic[4] = {'k', 'p', 'T', 'M'};
constexpr int64_t kTensorMapRing = 256;

struct TensorMaps {
  Mutex mu;
  std::array<TensorMapEncode, kTensorMapRing> ring ABSL_GUARDED_BY(mu){};
  int64_t count ABSL_GUARDED_BY(mu) = 0;
};

TensorMaps& Maps() {
  static TensorMaps* const maps = new TensorMaps();
  return *maps;
}

// Bytes per element of a CUtensorMapDataType (0: not one the fake knows).
int TensorMapElementBytes(CUtensorMapDataType type) {
  switch (static_cast<int>(type)) {
    case CU_TENSOR_MAP_DATA_TYPE_UINT8:
      return 1;
    case CU_TENSOR_MAP_DATA_TYPE_UINT16:
    case CU_TENSOR_MAP_DATA_TYPE_FLOAT16:
    case CU_TENSOR_MAP_DATA_TYPE_BFLOAT16:
      return 2;
    case CU_TENSOR_MAP_DATA_TYPE_UINT32:
    case CU_TENSOR_MAP_DATA_TYPE_INT32:
    case CU_TENSOR_MAP_DATA_TYPE_FLOAT32:
    case CU_TENSOR_MAP_DATA_TYPE_FLOAT32_FTZ:
    case CU_TENSOR_MAP_DATA_TYPE_TFLOAT32:
    case CU_TENSOR_MAP_DATA_TYPE_TFLOAT32_FTZ:
      return 4;
    case CU_TENSOR_MAP_DATA_TYPE_UINT64:
    case CU_TENSOR_MAP_DATA_TYPE_INT64:
    case CU_TENSOR_MAP_DATA_TYPE_FLOAT64:
      return 8;
    default:
      return 0;
  }
}

bool IsFloatTensorMapType(CUtensorMapDataType type) {
  return type >= CU_TENSOR_MAP_DATA_TYPE_FLOAT16 && type <= CU_TENSOR_MAP_DATA_TYPE_TFLOAT32_FTZ;
}

// The documented requirements; CUDA_ERROR_INVALID_VALUE for any that fails.
bool ValidTensorMap(const TensorMapEncode& e) {
  const int elem = TensorMapElementBytes(e.data_type);
  if (e.tensor_map == 0 || e.tensor_map % 64 != 0 || elem == 0) return false;
  if (e.rank < 1 || e.rank > 5) return false;
  if (e.interleave != CU_TENSOR_MAP_INTERLEAVE_NONE && e.rank < 3) return false;
  const uint64_t address_align = e.interleave == CU_TENSOR_MAP_INTERLEAVE_32B ? 32 : 16;
  if (e.address % address_align != 0) return false;
  for (uint32_t i = 0; i < e.rank; ++i) {
    if (e.dims[i] == 0 || e.dims[i] > (uint64_t{1} << 32)) return false;
    if (e.box[i] == 0 || e.box[i] > 256) return false;
    if (e.element_strides[i] == 0 || e.element_strides[i] > 8) return false;
  }
  for (uint32_t i = 0; i + 1 < e.rank; ++i) {
    if (e.strides[i] % 16 != 0 || e.strides[i] >= (uint64_t{1} << 40)) return false;
  }
  if (e.interleave == CU_TENSOR_MAP_INTERLEAVE_NONE) {
    const uint64_t inner_bytes = uint64_t{e.box[0]} * elem;
    if (inner_bytes % 16 != 0) return false;
    const uint64_t span = e.swizzle == CU_TENSOR_MAP_SWIZZLE_32B    ? 32
                          : e.swizzle == CU_TENSOR_MAP_SWIZZLE_64B  ? 64
                          : e.swizzle == CU_TENSOR_MAP_SWIZZLE_128B ? 128
                                                                    : 0;
    if (span != 0 && inner_bytes > span) return false;
  }
  if (e.oob_fill == CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA &&
      !IsFloatTensorMapType(e.data_type)) {
    return false;
  }
  return true;
}

// The blob: magic, six small fields, the address, the dimensions, strides, box and
// element strides; 117 of the 128 bytes.
void WriteTensorMapBlob(const TensorMapEncode& e, std::byte* map) {
  std::memset(map, 0, 128);
  std::memcpy(map, kTensorMapMagic, 4);
  const uint8_t small[6] = {static_cast<uint8_t>(e.data_type),  static_cast<uint8_t>(e.rank),
                            static_cast<uint8_t>(e.interleave), static_cast<uint8_t>(e.swizzle),
                            static_cast<uint8_t>(e.l2_promotion),
                            static_cast<uint8_t>(e.oob_fill)};
  std::memcpy(map + 4, small, 6);
  std::memcpy(map + 12, &e.address, 8);
  std::memcpy(map + 20, e.dims.data(), 40);
  std::memcpy(map + 60, e.strides.data(), 32);
  std::memcpy(map + 92, e.box.data(), 20);
  for (int i = 0; i < 5; ++i) map[112 + i] = static_cast<std::byte>(e.element_strides[i]);
}

CUresult FakeTensorMapEncodeTiled(CUtensorMap* tensor_map, CUtensorMapDataType data_type,
                                  cuuint32_t rank, void* address, const cuuint64_t* dims,
                                  const cuuint64_t* strides, const cuuint32_t* box,
                                  const cuuint32_t* element_strides, CUtensorMapInterleave interleave,
                                  CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2_promotion,
                                  CUtensorMapFloatOOBfill oob_fill) {
  if (CUresult r = Enter(Fn::kTensorMapEncodeTiled); r != CUDA_SUCCESS) return r;
  if (dims == nullptr || box == nullptr || element_strides == nullptr ||
      (rank > 1 && strides == nullptr) || rank > 5) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  TensorMapEncode e{};
  e.tensor_map = reinterpret_cast<uintptr_t>(tensor_map);
  e.data_type = data_type;
  e.rank = rank;
  e.address = reinterpret_cast<CUdeviceptr>(address);
  for (uint32_t i = 0; i < rank; ++i) {
    e.dims[i] = dims[i];
    e.box[i] = box[i];
    e.element_strides[i] = element_strides[i];
    if (i + 1 < rank) e.strides[i] = strides[i];
  }
  e.interleave = interleave;
  e.swizzle = swizzle;
  e.l2_promotion = l2_promotion;
  e.oob_fill = oob_fill;
  e.ok = ValidTensorMap(e);
  TensorMaps& maps = Maps();
  MutexLock lock(&maps.mu);
  maps.ring[maps.count++ % kTensorMapRing] = e;
  if (!e.ok) return CUDA_ERROR_INVALID_VALUE;
  WriteTensorMapBlob(e, reinterpret_cast<std::byte*>(tensor_map));
  return CUDA_SUCCESS;
}

void ResetTensorMaps() {
  TensorMaps& maps = Maps();
  MutexLock lock(&maps.mu);
  maps.count = 0;
}

// Graphs built node by node (cuGraphCreate, cuGraphAddKernelNode, ...), as kpack::StepGraph
// builds them, and events. Kept apart from the capture functions above: a built graph's
// launches[i] is its i-th kernel node, added after its dependencies, so replaying the
// launches in order respects every edge. Each node is validated like a launch.

// The LaunchRecord of a kernel node's parameters in the current context, validated as
// cuLaunchKernelEx validates a launch (handle, context, arch, shape, parameter buffer).
CUresult NodeRecord(State& s, const CUDA_KERNEL_NODE_PARAMS_v2& params, LaunchRecord* record)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
  Context* context = CurrentContext(s);
  if (context == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  // Only `func` is modelled (the real driver also takes a CUkernel in `kern`).
  if (params.func == nullptr || params.kern != nullptr) return CUDA_ERROR_INVALID_VALUE;
  const Entry* entry = FindEntry(s, params.func);
  const Context* owner = nullptr;
  if (entry != nullptr) {
    owner = entry->image->module_context;
  } else if (auto it = s.bound_by_handle.find(params.func); it != s.bound_by_handle.end()) {
    entry = it->second->entry;
    owner = it->second->context;
  } else {
    return CUDA_ERROR_INVALID_HANDLE;
  }
  if (owner != nullptr && owner != context) return CUDA_ERROR_INVALID_CONTEXT;
  if (!ArchRunsOn(entry->image->arch, s.devices[context->device])) {
    return CUDA_ERROR_NO_BINARY_FOR_GPU;
  }
  CUlaunchConfig config{};
  config.gridDimX = params.gridDimX;
  config.gridDimY = params.gridDimY;
  config.gridDimZ = params.gridDimZ;
  config.blockDimX = params.blockDimX;
  config.blockDimY = params.blockDimY;
  config.blockDimZ = params.blockDimZ;
  config.sharedMemBytes = params.sharedMemBytes;
  if (CUresult r = CheckShape(s, config, *entry, context->device); r != CUDA_SUCCESS) return r;
  *record = LaunchRecord{};
  const size_t name_size = std::min(entry->name.size(), kMaxRecordedEntryName - 1);
  std::memcpy(record->entry.data(), entry->name.data(), name_size);
  record->grid = {params.gridDimX, params.gridDimY, params.gridDimZ};
  record->block = {params.blockDimX, params.blockDimY, params.blockDimZ};
  record->shared_bytes = params.sharedMemBytes;
  record->context = reinterpret_cast<CUcontext>(context);
  record->function = params.func;
  record->num_params = static_cast<unsigned>(entry->params.size());
  for (const internal::CubinParam& param : entry->params) {
    if (param.ordinal < kMaxRecordedParams) {
      record->param_layout[param.ordinal] = {static_cast<uint16_t>(param.offset),
                                             static_cast<uint16_t>(param.size)};
    }
  }
  return CopyParams(*entry, params.kernelParams, params.extra, record);
}

void RetireNodes(State& s, const Graph* graph) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
  std::vector<const void*> gone;
  for (auto& [handle, node] : s.nodes) {
    if (node->graph == graph) gone.push_back(handle);
  }
  for (const void* handle : gone) s.retired.push_back(s.nodes.Take(handle));
}

CUresult FakeGraphCreate(CUgraph* graph, unsigned int flags) {
  if (CUresult r = Enter(Fn::kGraphCreate); r != CUDA_SUCCESS) return r;
  if (graph == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  State& s = S();
  MutexLock lock(&s.mu);
  auto created = std::make_unique<Graph>();
  created->built = true;
  *graph = reinterpret_cast<CUgraph>(s.graphs.Add(std::move(created)));
  return CUDA_SUCCESS;
}

CUresult FakeGraphAddKernelNode(CUgraphNode* node, CUgraph graph, const CUgraphNode* dependencies,
                                size_t num_dependencies,
                                const CUDA_KERNEL_NODE_PARAMS_v2* params) {
  if (CUresult r = Enter(Fn::kGraphAddKernelNode); r != CUDA_SUCCESS) return r;
  if (node == nullptr || params == nullptr || (num_dependencies > 0 && dependencies == nullptr)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  State& s = S();
  MutexLock lock(&s.mu);
  Graph* target = s.graphs.Find(graph);
  if (target == nullptr || !target->built) return CUDA_ERROR_INVALID_HANDLE;
  for (size_t i = 0; i < num_dependencies; ++i) {
    const GraphNode* dependency = s.nodes.Find(dependencies[i]);
    if (dependency == nullptr || dependency->graph != target) return CUDA_ERROR_INVALID_VALUE;
  }
  LaunchRecord record;
  if (CUresult r = NodeRecord(s, *params, &record); r != CUDA_SUCCESS) return r;
  auto added = std::make_unique<GraphNode>();
  added->graph = target;
  added->index = target->launches.size();
  target->launches.push_back(record);
  for (size_t i = 0; i < num_dependencies; ++i) {
    target->edges.push_back({s.nodes.Find(dependencies[i])->index, added->index,
                             CU_GRAPH_KERNEL_NODE_PORT_DEFAULT, CU_GRAPH_DEPENDENCY_TYPE_DEFAULT});
  }
  *node = reinterpret_cast<CUgraphNode>(s.nodes.Add(std::move(added)));
  return CUDA_SUCCESS;
}

// Edges between existing kernel nodes of a built graph, with their data as the driver API
// documents it: to_port and the reserved bytes zero; a programmatic edge
// (CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC) only from the PROGRAMMATIC or LAUNCH_ORDER port,
// the PROGRAMMATIC port only on a programmatic edge; no edge twice, none from a node to
// itself. The fake replays nodes in the order they were added, so an edge must also go
// from an earlier node to a later one (CUDA_ERROR_NOT_SUPPORTED otherwise: the real driver
// takes any acyclic graph; kpack adds none other). All edges are checked before any is added.
CUresult FakeGraphAddDependencies(CUgraph graph, const CUgraphNode* from, const CUgraphNode* to,
                                  const CUgraphEdgeData* edge_data, size_t num_dependencies) {
  if (CUresult r = Enter(Fn::kGraphAddDependencies); r != CUDA_SUCCESS) return r;
  if (num_dependencies > 0 && (from == nullptr || to == nullptr)) return CUDA_ERROR_INVALID_VALUE;
  State& s = S();
  MutexLock lock(&s.mu);
  Graph* target = s.graphs.Find(graph);
  if (target == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!target->built) return CUDA_ERROR_NOT_SUPPORTED;  // captured graphs: not modelled
  std::vector<GraphEdge> added;
  for (size_t i = 0; i < num_dependencies; ++i) {
    const GraphNode* a = s.nodes.Find(from[i]);
    const GraphNode* b = s.nodes.Find(to[i]);
    if (a == nullptr || b == nullptr || a->graph != target || b->graph != target ||
        a->index == b->index) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    const CUgraphEdgeData data = edge_data != nullptr ? edge_data[i] : CUgraphEdgeData{};
    if (data.to_port != 0 || std::any_of(std::begin(data.reserved), std::end(data.reserved),
                                         [](unsigned char c) { return c != 0; })) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    switch (data.type) {
      case CU_GRAPH_DEPENDENCY_TYPE_DEFAULT:
        if (data.from_port == CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC) return CUDA_ERROR_INVALID_VALUE;
        break;
      case CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC:
        if (data.from_port != CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC &&
            data.from_port != CU_GRAPH_KERNEL_NODE_PORT_LAUNCH_ORDER) {
          return CUDA_ERROR_INVALID_VALUE;
        }
        break;
      default:
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (data.from_port > CU_GRAPH_KERNEL_NODE_PORT_LAUNCH_ORDER) return CUDA_ERROR_INVALID_VALUE;
    const GraphEdge edge{a->index, b->index, data.from_port, data.type};
    auto same = [&](const GraphEdge& e) { return e.from == edge.from && e.to == edge.to; };
    if (std::any_of(target->edges.begin(), target->edges.end(), same) ||
        std::any_of(added.begin(), added.end(), same)) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    if (a->index > b->index) return CUDA_ERROR_NOT_SUPPORTED;
    added.push_back(edge);
  }
  target->edges.insert(target->edges.end(), added.begin(), added.end());
  return CUDA_SUCCESS;
}

// Swaps the calling thread's capture interaction mode (see CheckUnsafeCall).
CUresult FakeThreadExchangeStreamCaptureMode(CUstreamCaptureMode* mode) {
  if (CUresult r = Enter(Fn::kThreadExchangeStreamCaptureMode); r != CUDA_SUCCESS) return r;
  if (mode == nullptr) return CUDA_ERROR_INVALID_VALUE;
  // Read as its integer: a caller's value outside the enum must be refused, not loaded as
  // a CUstreamCaptureMode (undefined behaviour, which UBSan reports).
  std::underlying_type_t<CUstreamCaptureMode> raw;
  std::memcpy(&raw, mode, sizeof(raw));
  if (raw != CU_STREAM_CAPTURE_MODE_GLOBAL && raw != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
      raw != CU_STREAM_CAPTURE_MODE_RELAXED) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  State& s = S();
  ThreadContexts& thread = ThisThread(s);
  std::swap(thread.capture_mode, *mode);
  return CUDA_SUCCESS;
}

// The attributes a kernel node takes; a launch-only one (programmatic stream
// serialization: in a graph that is an edge's type) is CUDA_ERROR_INVALID_VALUE.
CUresult FakeGraphKernelNodeSetAttribute(CUgraphNode node, CUkernelNodeAttrID attribute,
                                         const CUkernelNodeAttrValue_v1* value) {
  if (CUresult r = Enter(Fn::kGraphKernelNodeSetAttribute); r != CUDA_SUCCESS) return r;
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  switch (attribute) {
    case CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION:
    case CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE:
    case CU_LAUNCH_ATTRIBUTE_COOPERATIVE:
    case CU_LAUNCH_ATTRIBUTE_PRIORITY:
      break;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
  State& s = S();
  MutexLock lock(&s.mu);
  GraphNode* target = s.nodes.Find(node);
  if (target == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  LaunchRecord& record = target->graph->launches[target->index];
  if (attribute == CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION) {
    const auto& cluster = value->clusterDim;
    if (cluster.x == 0 || cluster.y == 0 || cluster.z == 0 || record.grid[0] % cluster.x != 0 ||
        record.grid[1] % cluster.y != 0 || record.grid[2] % cluster.z != 0) {
      return CUDA_ERROR_INVALID_CLUSTER_SIZE;
    }
  }
  unsigned i = 0;
  while (i < std::min<unsigned>(record.num_attrs, kMaxRecordedLaunchAttrs) &&
         record.attrs[i].id != attribute) {
    ++i;
  }
  if (i == kMaxRecordedLaunchAttrs) return CUDA_ERROR_INVALID_VALUE;
  record.attrs[i].id = attribute;
  record.attrs[i].value = *value;
  record.num_attrs = std::max(record.num_attrs, i + 1);
  return CUDA_SUCCESS;
}

// Replaces node `node`'s launch in `exec` (its attributes stay). The function may change
// but not its context, as in the real driver.
CUresult FakeGraphExecKernelNodeSetParams(CUgraphExec exec, CUgraphNode node,
                                          const CUDA_KERNEL_NODE_PARAMS_v2* params) {
  if (CUresult r = Enter(Fn::kGraphExecKernelNodeSetParams); r != CUDA_SUCCESS) return r;
  if (params == nullptr) return CUDA_ERROR_INVALID_VALUE;
  State& s = S();
  MutexLock lock(&s.mu);
  GraphExec* instance = s.execs.Find(exec);
  const GraphNode* target = s.nodes.Find(node);
  if (instance == nullptr || target == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (target->graph != instance->source) return CUDA_ERROR_INVALID_VALUE;
  LaunchRecord record;
  if (CUresult r = NodeRecord(s, *params, &record); r != CUDA_SUCCESS) return r;
  LaunchRecord& current = instance->launches[target->index];
  if (record.context != current.context) return CUDA_ERROR_INVALID_VALUE;
  record.num_attrs = current.num_attrs;
  record.attrs = current.attrs;
  current = record;
  // The most recent kLaunchRingCapacity are kept (benchmarks patch millions of times), in
  // storage reserved at the first update, so that later ones allocate nothing.
  if (s.node_updates.capacity() == 0) {
    s.node_updates.reserve(2 * static_cast<size_t>(kLaunchRingCapacity));
  }
  if (s.node_updates.size() >= 2 * static_cast<size_t>(kLaunchRingCapacity)) {
    s.node_updates.erase(s.node_updates.begin(), s.node_updates.begin() + kLaunchRingCapacity);
  }
  s.node_updates.push_back({instance->id, target->index, record});
  return CUDA_SUCCESS;
}

CUresult FakeEventCreate(CUevent* event, unsigned int flags) {
  if (CUresult r = Enter(Fn::kEventCreate); r != CUDA_SUCCESS) return r;
  if (event == nullptr) return CUDA_ERROR_INVALID_VALUE;
  State& s = S();
  MutexLock lock(&s.mu);
  if (CurrentContext(s) == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  *event = reinterpret_cast<CUevent>(s.events.Add(std::make_unique<Event>()));
  return CUDA_SUCCESS;
}

// Work runs when it is issued in the fake, so an event records the host's time.
CUresult FakeEventRecord(CUevent event, CUstream handle) {
  if (CUresult r = Enter(Fn::kEventRecord); r != CUDA_SUCCESS) return r;
  State& s = S();
  MutexLock lock(&s.mu);
  Event* target = s.events.Find(event);
  if (target == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  const Context* context = CurrentContext(s);
  if (context == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  Stream* stream = nullptr;
  if (CUresult r = ResolveStream(s, handle, context, &stream); r != CUDA_SUCCESS) return r;
  if (stream != nullptr && stream->capture != CU_STREAM_CAPTURE_STATUS_NONE) {
    return CUDA_ERROR_NOT_SUPPORTED;  // event nodes are not modelled
  }
  target->recorded = true;
  target->when = std::chrono::steady_clock::now();
  return CUDA_SUCCESS;
}

CUresult FakeEventSynchronize(CUevent event) {
  if (CUresult r = Enter(Fn::kEventSynchronize); r != CUDA_SUCCESS) return r;
  State& s = S();
  MutexLock lock(&s.mu);
  if (s.events.Find(event) == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  return StickyError(s);
}

CUresult FakeEventElapsedTime(float* milliseconds, CUevent start, CUevent end) {
  if (CUresult r = Enter(Fn::kEventElapsedTime); r != CUDA_SUCCESS) return r;
  if (milliseconds == nullptr) return CUDA_ERROR_INVALID_VALUE;
  State& s = S();
  MutexLock lock(&s.mu);
  const Event* a = s.events.Find(start);
  const Event* b = s.events.Find(end);
  if (a == nullptr || b == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (!a->recorded || !b->recorded) return CUDA_ERROR_INVALID_HANDLE;
  *milliseconds = std::chrono::duration<float, std::milli>(b->when - a->when).count();
  return CUDA_SUCCESS;
}

CUresult FakeEventDestroy(CUevent event) {
  if (CUresult r = Enter(Fn::kEventDestroy); r != CUDA_SUCCESS) return r;
  State& s = S();
  MutexLock lock(&s.mu);
  if (s.events.Find(event) == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  s.retired.push_back(s.events.Take(event));
  return CUDA_SUCCESS;
}

CUresult FakeMemGetInfo(size_t* free, size_t* total) {
  if (CUresult r = Enter(Fn::kMemGetInfo); r != CUDA_SUCCESS) return r;
  if (free == nullptr || total == nullptr) return CUDA_ERROR_INVALID_VALUE;
  State& s = S();
  MutexLock lock(&s.mu);
  if (CurrentContext(s) == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  *total = kMaxLiveBytes;
  *free = kMaxLiveBytes - static_cast<size_t>(s.live_bytes);
  return CUDA_SUCCESS;
}

// The table cuGetProcAddress serves. The static_cast to the list's PFN type is what keeps
// each Fake<name> in step with the ABI driver_symbols.h names: a mismatch does not compile.
void* const kFnPointers[] = {
#define KPACK_DRIVER_SYMBOL(name, version) \
  reinterpret_cast<void*>(static_cast<PFN_cu##name##_v##version>(&Fake##name)),
#include "driver/driver_symbols.h"
#undef KPACK_DRIVER_SYMBOL
};

CUresult GetProcAddress(const char* symbol, void** function, int cuda_version, cuuint64_t flags,
                        CUdriverProcAddressQueryResult* status) {
  auto answer = [status](CUdriverProcAddressQueryResult result) {
    if (status != nullptr) *status = result;
    return result == CU_GET_PROC_ADDRESS_SUCCESS ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
  };
  constexpr cuuint64_t kKnownFlags =
      CU_GET_PROC_ADDRESS_LEGACY_STREAM | CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
  if (symbol == nullptr || function == nullptr || (flags & ~kKnownFlags) != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  *function = nullptr;
  std::string_view name = symbol;
  if (!name.starts_with("cu")) return answer(CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
  name.remove_prefix(2);
  for (int i = 0; i < kFnCount; ++i) {
    if (kFnNames[i] != name) continue;
    State& s = S();
    {
      MutexLock lock(&s.mu);
      if (s.hidden[i]) return answer(CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
    }
    if (cuda_version < kFnVersions[i]) return answer(CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
    // A newer version may have a different ABI (cuCtxGetDevice at 13000 takes a context);
    // the fake implements exactly the one driver_symbols.h names.
    if (cuda_version > kFnVersions[i]) return answer(CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
    *function = kFnPointers[i];
    return answer(CU_GET_PROC_ADDRESS_SUCCESS);
  }
  return answer(CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
}

}  // namespace

// ---------------------------------------------------------------------------------------
// The control API.

void Reset() {
  // What is queued on the driver's thread runs first (it may reach the state).
  if (!Worker().OnThisThread()) Worker().WaitFor(Worker().LastTicket(0));
  Worker().Forget();
  {
    State& s = S();
    MutexLock lock(&s.mu);
    ResetLocked(s);
  }
  ResetTensorMaps();
}

void SetAsyncDestructors(bool on) { S().async_destructors.store(on, std::memory_order_release); }

void DrainDriverThread() {
  if (Worker().OnThisThread()) Die("DrainDriverThread on the driver's thread waits for itself");
  WaitForQueued("DrainDriverThread");
}

void SetDeadlockTimeout(std::chrono::milliseconds timeout) { Worker().set_timeout(timeout); }

void OnNextCall(std::string_view fn, std::function<void()> hook) {
  const int index = FnIndexOrDie(fn);
  State& s = S();
  MutexLock lock(&s.mu);
  s.hooks[index].push_back(std::move(hook));
  s.pending_hooks.fetch_add(1);
}

void SetDevices(const std::vector<DeviceConfig>& devices) {
  State& s = S();
  MutexLock lock(&s.mu);
  for (Context* primary : s.primaries) s.retired.push_back(s.contexts.Take(primary));
  s.primaries.clear();
  s.devices = devices;
  CreatePrimaries(s);
  s.generation.fetch_add(1);
}

void SetKernelLimits(const KernelLimits& limits) {
  State& s = S();
  MutexLock lock(&s.mu);
  s.limits = limits;
}

void FailNext(std::string_view fn, CUresult code, int skip) {
  const int index = FnIndexOrDie(fn);
  if (skip < 0) Die("FailNext: skip must be >= 0");
  State& s = S();
  MutexLock lock(&s.mu);
  s.failures[index].push_back({.countdown = skip, .code = code});
  s.pending_failures.fetch_add(1);
}

int CancelFailures() {
  State& s = S();
  MutexLock lock(&s.mu);
  int pending = 0;
  for (std::vector<Failure>& failures : s.failures) {
    pending += static_cast<int>(failures.size());
    failures.clear();
  }
  s.pending_failures.store(0);
  return pending;
}

void HideSymbol(std::string_view fn) {
  const int index = FnIndexOrDie(fn);
  State& s = S();
  MutexLock lock(&s.mu);
  s.hidden[index] = true;
}

void SetInitError(CUresult code) {
  State& s = S();
  MutexLock lock(&s.mu);
  s.init_error = code;
}

void SetDeviceHandleOffset(int offset) {
  State& s = S();
  MutexLock lock(&s.mu);
  s.device_handle_offset = offset;
}

void SetHandleReuse(bool on) {
  State& s = S();
  MutexLock lock(&s.mu);
  s.reuse_handles = on;
}

void SetKernelEmulator(std::string_view entry, KernelEmulator emulator) {
  State& s = S();
  MutexLock lock(&s.mu);
  if (emulator == nullptr) {
    s.emulators.erase(std::string(entry));
  } else {
    s.emulators[std::string(entry)] = emulator;
  }
}

void* DeviceMemory(CUdeviceptr pointer, size_t bytes, std::string_view what) {
  State& s = S();
  MutexLock lock(&s.mu);
  for (const Allocation& allocation : s.allocations) {
    if (pointer >= allocation.base && bytes <= allocation.size &&
        pointer - allocation.base <= allocation.size - bytes) {
      return reinterpret_cast<void*>(pointer);
    }
  }
  s.faults.push_back(std::string(what) + ": " + std::to_string(bytes) + " bytes at 0x" +
                     [&] {
                       char hex[32];
                       std::snprintf(hex, sizeof(hex), "%llx",
                                     static_cast<unsigned long long>(pointer));  // NOLINT
                       return std::string(hex);
                     }() +
                     " are outside every live allocation");
  return nullptr;
}

std::vector<std::string> Faults() {
  State& s = S();
  MutexLock lock(&s.mu);
  return s.faults;
}

uint64_t AllocationId(CUdeviceptr pointer) {
  State& s = S();
  MutexLock lock(&s.mu);
  for (const Allocation& allocation : s.allocations) {
    if (pointer >= allocation.base && pointer - allocation.base < allocation.size) {
      return allocation.id;
    }
  }
  return 0;
}

void SetLaunchNoop(bool on) { S().launch_noop.store(on); }

int64_t CallCount(std::string_view fn) { return S().calls[FnIndexOrDie(fn)].load(); }

int64_t LaunchCount() {
  State& s = S();
  MutexLock lock(&s.mu);
  return s.launch_count;
}

LaunchRecord GetLaunch(int64_t i) {
  State& s = S();
  MutexLock lock(&s.mu);
  if (i < 0 || i >= s.launch_count || i < s.launch_count - kLaunchRingCapacity) {
    Die("GetLaunch(" + std::to_string(i) + "): not among the retained launches (" +
        std::to_string(s.launch_count) + " recorded, the last " +
        std::to_string(kLaunchRingCapacity) + " kept)");
  }
  return s.ring[i % kLaunchRingCapacity];
}

std::vector<KernelAttributeSet> KernelAttributeSets() {
  State& s = S();
  MutexLock lock(&s.mu);
  return s.attribute_sets;
}

int64_t LiveAllocations() {
  State& s = S();
  MutexLock lock(&s.mu);
  return static_cast<int64_t>(s.allocations.size());
}

int64_t LiveBytes() {
  State& s = S();
  MutexLock lock(&s.mu);
  return s.live_bytes;
}

int64_t LiveHostAllocations() {
  State& s = S();
  MutexLock lock(&s.mu);
  return static_cast<int64_t>(s.host_allocations.size());
}

int LoadedLibraries() {
  State& s = S();
  MutexLock lock(&s.mu);
  return static_cast<int>(s.images.size());
}

int64_t LibraryLoads() {
  State& s = S();
  MutexLock lock(&s.mu);
  return s.library_loads;
}

int PrimaryContextRefCount(int device) {
  State& s = S();
  MutexLock lock(&s.mu);
  return device >= 0 && static_cast<size_t>(device) < s.primaries.size()
             ? s.primaries[device]->refcount
             : -1;
}

int LiveStreams() {
  State& s = S();
  MutexLock lock(&s.mu);
  return static_cast<int>(s.streams.size());
}

int LiveGraphs() {
  State& s = S();
  MutexLock lock(&s.mu);
  return static_cast<int>(s.graphs.size() + s.execs.size());
}

int LiveUserObjects() {
  State& s = S();
  MutexLock lock(&s.mu);
  return static_cast<int>(s.user_objects.size());
}

CUstreamCaptureStatus CaptureStatus(CUstream stream) {
  State& s = S();
  MutexLock lock(&s.mu);
  if (IsDefaultStream(stream)) return CU_STREAM_CAPTURE_STATUS_NONE;
  const Stream* found = s.streams.Find(stream);
  return found != nullptr ? found->capture : CU_STREAM_CAPTURE_STATUS_NONE;
}

// ---- tensor maps

int64_t TensorMapEncodeCount() {
  TensorMaps& maps = Maps();
  MutexLock lock(&maps.mu);
  return maps.count;
}

TensorMapEncode GetTensorMapEncode(int64_t i) {
  TensorMaps& maps = Maps();
  MutexLock lock(&maps.mu);
  if (i < 0 || i >= maps.count || i < maps.count - kTensorMapRing) {
    Die("GetTensorMapEncode(" + std::to_string(i) + "): not among the retained encodes (" +
        std::to_string(maps.count) + " recorded, the last " + std::to_string(kTensorMapRing) +
        " kept)");
  }
  return maps.ring[i % kTensorMapRing];
}

bool DecodeTensorMap(const void* map, TensorMapEncode* out) {
  const auto* b = static_cast<const std::byte*>(map);
  if (std::memcmp(b, kTensorMapMagic, 4) != 0) return false;
  TensorMapEncode e{};
  e.tensor_map = reinterpret_cast<uintptr_t>(map);
  uint8_t small[6];
  std::memcpy(small, b + 4, 6);
  e.data_type = static_cast<CUtensorMapDataType>(small[0]);
  e.rank = small[1];
  e.interleave = static_cast<CUtensorMapInterleave>(small[2]);
  e.swizzle = static_cast<CUtensorMapSwizzle>(small[3]);
  e.l2_promotion = static_cast<CUtensorMapL2promotion>(small[4]);
  e.oob_fill = static_cast<CUtensorMapFloatOOBfill>(small[5]);
  std::memcpy(&e.address, b + 12, 8);
  std::memcpy(e.dims.data(), b + 20, 40);
  std::memcpy(e.strides.data(), b + 60, 32);
  std::memcpy(e.box.data(), b + 92, 20);
  for (int i = 0; i < 5; ++i) e.element_strides[i] = static_cast<uint32_t>(b[112 + i]);
  e.ok = true;
  *out = e;
  return true;
}

uint64_t ContextId(CUcontext context) {
  State& s = S();
  MutexLock lock(&s.mu);
  const Context* found = s.contexts.Find(context);
  return found != nullptr ? found->id.load(std::memory_order_relaxed) : 0;
}

// ---- Graphs built node by node ----

std::vector<NodeUpdate> NodeUpdates() {
  State& s = S();
  MutexLock lock(&s.mu);
  return s.node_updates;
}

int64_t GraphLaunches() {
  State& s = S();
  MutexLock lock(&s.mu);
  return s.graph_launches;
}

uint64_t ExecId(CUgraphExec exec) {
  State& s = S();
  MutexLock lock(&s.mu);
  const GraphExec* instance = s.execs.Find(exec);
  return instance != nullptr ? instance->id : 0;
}

namespace {

// A copy of `field` of the live graph or executable `handle`; empty if there is none.
template <typename T, typename Object>
std::vector<T> CopyOf(Registry<Object> State::*registry, const void* handle,
                      std::vector<T> Object::*field) {
  State& s = S();
  MutexLock lock(&s.mu);
  const Object* found = (s.*registry).Find(handle);
  return found != nullptr ? found->*field : std::vector<T>{};
}

}  // namespace

std::vector<LaunchRecord> GraphNodes(CUgraph graph) {
  return CopyOf(&State::graphs, graph, &Graph::launches);
}
std::vector<LaunchRecord> ExecNodes(CUgraphExec exec) {
  return CopyOf(&State::execs, exec, &GraphExec::launches);
}
std::vector<GraphEdge> GraphEdges(CUgraph graph) {
  return CopyOf(&State::graphs, graph, &Graph::edges);
}
std::vector<GraphEdge> ExecEdges(CUgraphExec exec) {
  return CopyOf(&State::execs, exec, &GraphExec::edges);
}

CUstreamCaptureMode ThreadCaptureMode() { return ThisThread(S()).capture_mode; }

std::vector<CUgraphExec> LiveExecs() {
  State& s = S();
  MutexLock lock(&s.mu);
  std::vector<std::pair<uint64_t, CUgraphExec>> execs;
  for (auto& [handle, instance] : s.execs) {
    execs.emplace_back(instance->id, reinterpret_cast<CUgraphExec>(instance.get()));
  }
  std::sort(execs.begin(), execs.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<CUgraphExec> result;
  for (const auto& e : execs) result.push_back(e.second);
  return result;
}

}  // namespace kpack::fake

// The driver's exported entry points. cuda.h maps the name cuGetProcAddress to
// cuGetProcAddress_v2; the older export without the status argument keeps its plain name.
extern "C" {

KPACK_FAKE_EXPORT CUresult cuGetProcAddress_v2(const char* symbol, void** function,
                                               int cuda_version, cuuint64_t flags,
                                               CUdriverProcAddressQueryResult* status) {
  return kpack::fake::GetProcAddress(symbol, function, cuda_version, flags, status);
}

#undef cuGetProcAddress
KPACK_FAKE_EXPORT CUresult cuGetProcAddress(const char* symbol, void** function, int cuda_version,
                                            cuuint64_t flags) {
  return kpack::fake::GetProcAddress(symbol, function, cuda_version, flags, nullptr);
}

}  // extern "C"
