// A recording fake of the CUDA driver, for testing kpack on machines without a GPU.
//
// libkpack_fake_cuda.so is loaded exactly like libcuda.so.1 (point KPACK_CUDA_DRIVER or the
// runtime's driver-path option at it): it exports cuGetProcAddress_v2 (and the older
// cuGetProcAddress), which serves its own implementation of every function in
// src/driver/driver_symbols.h with the same PFN_cu<name>_v<version> type. A test links the
// same .so to reach the control API below; dlopen of the same file returns the already
// loaded object, so both see one state.
//
// What it models, briefly (fake_driver.cc has the details):
//  - cuGetProcAddress serves a function only at the ABI version driver_symbols.h names: an
//    older version gets CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT, a newer one
//    CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND (the fake cannot vouch for a newer ABI).
//  - cuInit first; everything except cuGetErrorName/String and cuDriverGetVersion fails
//    with CUDA_ERROR_NOT_INITIALIZED before it.
//  - Devices as configured; one primary context per device with a retain count, plus
//    contexts made with cuCtxCreate; a per-thread context stack. As in libcuda, a thread
//    has no current context until it makes one current (cuCtxSetCurrent/PushCurrent/
//    Create). Every context has a process-unique id (cuCtxGetId), every stream too
//    (cuStreamGetId). CUdevice handles are the ordinals plus SetDeviceHandleOffset's
//    offset (0 by default, as libcuda's are in practice), so code that takes an ordinal
//    for a handle shows up. With SetHandleReuse(true), a new context or stream takes the
//    address of the last one destroyed, as a heap allocator may hand it out again.
//  - Libraries and modules are parsed with kpack's cubin reader (anything else is
//    CUDA_ERROR_INVALID_IMAGE); kernels answer param info, attributes and launches from the
//    parsed layout. A cubin for arch >= 90 runs only on exactly that compute capability, an
//    older one on the same major with minor <= the device's: otherwise
//    CUDA_ERROR_NO_BINARY_FOR_GPU from cuLibraryGetKernel (no device fits),
//    cuModuleLoadData, cuKernelGetFunction and launches (the current device does not fit).
//  - Device memory is host memory (256-byte aligned), so copies and memsets really happen.
//    The image pointer given to cuLibraryLoadData/cuModuleLoadData must cover the whole
//    cubin: like the real driver, the fake reads its extent from the ELF headers.
//    Pinned host memory (cuMemAllocHost) is host memory, tracked until cuMemFreeHost.
//    Asynchronous copies run when issued, on a live stream of the current context, and
//    are refused on a capturing stream (memcpy nodes are not modelled).
//  - Launches are validated like the real driver (context, handle, grid and block limits,
//    dynamic shared memory limit, parameter buffer size, cluster shape) and recorded in a
//    ring of the last kLaunchRingCapacity launches. The launch path does not allocate
//    (except to grow a capture graph past 64 launches).
//  - Stream capture records launches into a graph; cuGraphLaunch replays them, recording
//    each again. cuGraphLaunch into a capturing stream fails with
//    CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and invalidates the capture, as on the real
//    driver (580). While a capture is active, the "potentially unsafe" calls -- cuMemAlloc/
//    Free, synchronous copies, memset, cuCtxSynchronize, loading code (cuLibraryLoadData,
//    cuModuleLoadData, a context's first cuKernelGetFunction of a kernel),
//    cuGraphInstantiateWithFlags and
//    cuGraphExecDestroy -- fail with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED (and invalidate
//    the calling thread's capture) as the capture modes and the calling thread's
//    interaction mode (cuThreadExchangeStreamCaptureMode, per thread, GLOBAL by default)
//    dictate, by the rule that function's documentation states.
//    cuStreamGetCaptureInfo reports the capture's id and graph. User objects are
//    reference-counted; a graph holds the references given to it (cuGraphRetainUserObject),
//    every executable instantiated from it one more per object, and the destructor runs
//    when the last reference goes, on the driver's thread (below), and before the call
//    that dropped the reference returns -- unless SetAsyncDestructors(true), where that
//    call returns at once, as libcuda's does.
//  - The driver's thread: libcuda runs host functions (cuLaunchHostFunc) and user-object
//    destructors on an internal thread, one at a time, and GPU work queued behind a host
//    function waits for it. The fake has one such thread, running in the order queued:
//    host functions, destructors, and the emulated kernels of launches (and graph
//    launches) made on a stream while earlier work of that stream is queued there. So a
//    host function that waits (say for a test's latch) models GPU work in flight on its
//    stream. Synchronizing calls wait for the work queued before them: cuMemFree,
//    cuCtxSynchronize, the synchronous copies and memset, cuStreamSynchronize on the
//    legacy stream (all of it), cuStreamSynchronize of a stream (that stream's). A wait
//    that lasts longer than the deadlock timeout (20 s; SetDeadlockTimeout) is what on a
//    GPU never ends -- a host function or destructor blocked the driver's thread, e.g. on
//    a lock the waiting thread holds: it is recorded as a fault (Faults()) and the call
//    fails with CUDA_ERROR_LAUNCH_TIMEOUT. One FIFO serves all streams (stricter ordering
//    than a GPU's, never looser). Host functions inside a capture are not modelled
//    (CUDA_ERROR_NOT_SUPPORTED).
//  - Graphs built node by node (cuGraphCreate, cuGraphAddKernelNode with a kernel node's
//    function, grid, block, shared bytes and parameters, cuGraphKernelNodeSetAttribute,
//    cuGraphExecKernelNodeSetParams): each node is validated like a launch; its i-th node
//    is the graph's i-th launch (dependencies must be earlier nodes, so that order is a
//    topological one). Edges are recorded with their data (GraphEdges): those of
//    cuGraphAddKernelNode's dependencies are full ones; cuGraphAddDependencies (the CUDA
//    12.3 form, with CUgraphEdgeData) checks the data as the API documents it, so
//    programmatic (PDL) edges show with their type and port. Replays run nodes in order
//    whatever the edge type. An executable copies the nodes at instantiation; setting a node's
//    parameters there changes only that executable and is recorded (NodeUpdates()).
//    cuGraphLaunch replays any graph's launches like the captured ones. Events record the
//    host's time (work runs when issued); cuMemGetInfo reports 4 GiB minus live bytes.
//  - Kernel emulation: a test may register a host function per entry symbol
//    (SetKernelEmulator); the fake runs it for every launch that executes (an uncaptured
//    launch, or a graph replay), after the launch is recorded, with the launch's grid,
//    block and parameter bytes. Emulators reach device memory through DeviceMemory(),
//    which checks that the range lies in one live allocation; an access outside records a
//    fault (Faults()) and, like an illegal address on a GPU, makes every later
//    synchronization and copy fail with CUDA_ERROR_ILLEGAL_ADDRESS until Reset().
//  - cuGetErrorName/String name an unknown code CUDA_ERROR_UNKNOWN / "unknown error" and
//    succeed, where the real driver fails with CUDA_ERROR_INVALID_VALUE and a null string.
//  - A handle that is not live (never created, destroyed, unloaded) is answered with
//    CUDA_ERROR_INVALID_HANDLE; a handle bound to another context than the current one
//    with CUDA_ERROR_INVALID_CONTEXT. Destroyed objects are kept until Reset() so their
//    addresses are not reused by new handles.
//
// Thread safety: every driver function and every control function may be called from any
// thread, except Reset() and SetDevices(), which need the fake to be otherwise idle.

#ifndef KPACK_TESTS_FAKE_DRIVER_FAKE_DRIVER_H_
#define KPACK_TESTS_FAKE_DRIVER_FAKE_DRIVER_H_

#include <cuda.h>

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#define KPACK_FAKE_EXPORT __attribute__((visibility("default")))

namespace kpack::fake {

struct DeviceConfig {
  int cc_major = 9;
  int cc_minor = 0;
  int max_shared_memory_per_block_optin = 232448;
  int max_threads_per_block = 1024;
  int multiprocessor_count = 132;
  std::string name = "Fake H200";
};

// What every loaded kernel reports; there is no real compiler output to read them from.
struct KernelLimits {
  int max_threads_per_block = 1024;  // CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK
  int static_shared_bytes = 0;       // CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES
  int num_regs = 32;                 // CU_FUNC_ATTRIBUTE_NUM_REGS
};

inline constexpr int kMaxRecordedLaunchAttrs = 8;
inline constexpr size_t kMaxRecordedParamBytes = 4096;
inline constexpr size_t kMaxRecordedEntryName = 256;
inline constexpr int64_t kLaunchRingCapacity = 1024;
inline constexpr unsigned kMaxRecordedParams = 64;

// One accepted cuLaunchKernelEx, or one kernel replayed by cuGraphLaunch.
struct LaunchRecord {
  std::array<char, kMaxRecordedEntryName> entry;  // NUL-terminated symbol, truncated if long
  std::array<unsigned, 3> grid;
  std::array<unsigned, 3> block;
  unsigned shared_bytes;
  CUstream stream;
  CUcontext context;
  CUfunction function;    // as passed: a CUfunction, or a CUkernel cast to one
  bool params_via_extra;  // passed as a CU_LAUNCH_PARAM_BUFFER_POINTER buffer
  bool captured;          // issued into a capturing stream: added to its graph, not run
  bool graph_replay;      // issued by cuGraphLaunch
  unsigned num_attrs;     // as passed; only the first kMaxRecordedLaunchAttrs are copied
  std::array<CUlaunchAttribute, kMaxRecordedLaunchAttrs> attrs;
  size_t param_size;  // the kernel's parameter buffer size
  unsigned num_params;  // the kernel's parameters, and the (offset, size) of the first 64
  std::array<std::array<uint16_t, 2>, kMaxRecordedParams> param_layout;
  // The parameter buffer as the kernel would see it (bytes between parameters are zero
  // when passed as kernelParams). Only the first kMaxRecordedParamBytes are kept.
  std::array<std::byte, kMaxRecordedParamBytes> params;
};

// A successful cuKernelSetAttribute.
struct KernelAttributeSet {
  std::string entry;
  CUfunction_attribute attribute;
  int value;
  CUdevice device;
};

// Back to the initial state: one default device, not initialized, no contexts current on
// any thread, everything freed and unloaded, counters, failures, hooks, hidden symbols,
// emulators and faults cleared, launch no-op, handle reuse and async destructors off,
// device handle offset 0, default kernel limits and deadlock timeout. What is queued on
// the driver's thread runs first. Ids keep counting: they stay unique for the process.
KPACK_FAKE_EXPORT void Reset();

// Replaces the devices (an empty list makes cuInit fail with CUDA_ERROR_NO_DEVICE). Drops
// the primary contexts and every thread's context stack. Call it before the code under test
// runs.
KPACK_FAKE_EXPORT void SetDevices(const std::vector<DeviceConfig>& devices);

KPACK_FAKE_EXPORT void SetKernelLimits(const KernelLimits& limits);

// `fn` is a driver_symbols.h name, without "cu" (e.g. "MemAlloc"); an unknown name aborts.
// The (skip + 1)-th next call of `fn` returns `code` without doing anything. Several
// pending failures for one function count down independently; when two fall due on the
// same call, both are used up and the earlier-registered code is returned.
KPACK_FAKE_EXPORT void FailNext(std::string_view fn, CUresult code, int skip = 0);

// Drops every pending FailNext failure and returns how many there were (0: all fired).
KPACK_FAKE_EXPORT int CancelFailures();

// cuGetProcAddress reports `fn` as missing (CUDA_ERROR_NOT_FOUND).
KPACK_FAKE_EXPORT void HideSymbol(std::string_view fn);

// cuInit returns `code` (e.g. CUDA_ERROR_NO_DEVICE) and leaves the driver uninitialized;
// CUDA_SUCCESS restores normal behaviour.
KPACK_FAKE_EXPORT void SetInitError(CUresult code);

// CUdevice handles become ordinal + offset (cuDeviceGet's answer); every function taking
// a CUdevice refuses a plain ordinal then, unless it happens to be a valid handle too.
KPACK_FAKE_EXPORT void SetDeviceHandleOffset(int offset);

// On: user-object destructors are queued on the driver's thread and the call that drops
// the last reference returns at once, as with libcuda (off: it waits for them).
KPACK_FAKE_EXPORT void SetAsyncDestructors(bool on);

// Waits until everything queued on the driver's thread has run (a deadlock past the
// timeout is recorded as a fault). Not from the driver's thread.
KPACK_FAKE_EXPORT void DrainDriverThread();

// How long a synchronizing call waits for the driver's thread before it reports a
// deadlock (default 20 s; Reset restores it).
KPACK_FAKE_EXPORT void SetDeadlockTimeout(std::chrono::milliseconds timeout);

// The next call of `fn` (a driver_symbols.h name, as in FailNext), on whichever thread
// makes it, first runs `hook` there (without the fake's lock: it may call the driver),
// then does its work. To place something exactly inside another call, e.g. a graph
// destroyed while a cuMemFree is under way.
KPACK_FAKE_EXPORT void OnNextCall(std::string_view fn, std::function<void()> hook);

// On: a context or stream created after one of its kind was destroyed gets the
// destroyed one's handle (the most recently destroyed first), with a new id.
KPACK_FAKE_EXPORT void SetHandleReuse(bool on);

// A launch of entry symbol `entry` as an emulator sees it.
struct EmulatedLaunch {
  const char* entry;
  std::array<unsigned, 3> grid;
  std::array<unsigned, 3> block;
  CUstream stream;
  const std::byte* params;  // the kernel's parameter buffer
  size_t param_size;
  unsigned num_params;  // as the cubin declares them, hidden ones included
  const std::array<uint16_t, 2>* param_layout;  // (offset, size) per parameter
  // The parameter of type T at `offset` in the buffer.
  template <typename T>
  T Param(size_t offset) const {
    T v{};
    if (offset + sizeof(T) <= param_size) std::memcpy(&v, params + offset, sizeof(T));
    return v;
  }
  // Parameter `index` (in the cubin's order) as a T; it must be sizeof(T) bytes wide.
  template <typename T>
  T Arg(unsigned index) const {
    if (index >= num_params || param_layout[index][1] != sizeof(T)) std::abort();
    return Param<T>(param_layout[index][0]);
  }
};
using KernelEmulator = void (*)(const EmulatedLaunch& launch);

// Runs `emulator` for every executing launch of `entry` (null: no emulation).
KPACK_FAKE_EXPORT void SetKernelEmulator(std::string_view entry, KernelEmulator emulator);

// For emulators: the host address of device range [pointer, pointer + bytes) when it lies
// in one live allocation; otherwise null, and a fault naming `what` is recorded.
KPACK_FAKE_EXPORT void* DeviceMemory(CUdeviceptr pointer, size_t bytes, std::string_view what);
template <typename T>
T* DeviceArray(CUdeviceptr pointer, size_t count, std::string_view what) {
  return static_cast<T*>(DeviceMemory(pointer, count * sizeof(T), what));
}

// Emulation faults since Reset(), one message each.
KPACK_FAKE_EXPORT std::vector<std::string> Faults();

// A process-unique id of the live allocation that holds device address `pointer` (0 when
// none does). Unlike an address, an id is never given to a later allocation: it tells
// memory freed and allocated again at the same address apart.
KPACK_FAKE_EXPORT uint64_t AllocationId(CUdeviceptr pointer);

// On: cuLaunchKernelEx and cuGraphLaunch return CUDA_SUCCESS right after the init check
// (and, for cuGraphLaunch, the null check) and record nothing; only CallCount
// ("LaunchKernelEx", "GraphLaunch") sees them. For benchmarks. The environment
// variable KPACK_FAKE_LAUNCH_NOOP=1 turns it on when the fake is first used (Reset turns
// it off again).
KPACK_FAKE_EXPORT void SetLaunchNoop(bool on);

// Calls of `fn` (a driver_symbols.h name, as in FailNext) since Reset(), failed ones too.
KPACK_FAKE_EXPORT int64_t CallCount(std::string_view fn);

// Launches recorded since Reset() (captured ones and graph replays included).
KPACK_FAKE_EXPORT int64_t LaunchCount();

// The i-th recorded launch, 0-based. Aborts unless LaunchCount() - kLaunchRingCapacity
// <= i < LaunchCount().
KPACK_FAKE_EXPORT LaunchRecord GetLaunch(int64_t i);

KPACK_FAKE_EXPORT std::vector<KernelAttributeSet> KernelAttributeSets();

// Device allocations not yet freed, and their requested bytes.
KPACK_FAKE_EXPORT int64_t LiveAllocations();
KPACK_FAKE_EXPORT int64_t LiveBytes();
// Pinned host allocations (cuMemAllocHost) not yet freed.
KPACK_FAKE_EXPORT int64_t LiveHostAllocations();

// Libraries and modules loaded and not unloaded; successful loads of either since Reset().
KPACK_FAKE_EXPORT int LoadedLibraries();
KPACK_FAKE_EXPORT int64_t LibraryLoads();

// The retain count of `device`'s primary context (-1 for no such device).
KPACK_FAKE_EXPORT int PrimaryContextRefCount(int device);

// Streams not destroyed; graphs plus graph execs not destroyed; user objects whose
// destructor has not run.
KPACK_FAKE_EXPORT int LiveStreams();
KPACK_FAKE_EXPORT int LiveGraphs();
KPACK_FAKE_EXPORT int LiveUserObjects();

// A stream's capture status as the driver holds it (NONE for a default or dead stream),
// read without a driver call: nothing is counted, failed or invalidated.
KPACK_FAKE_EXPORT CUstreamCaptureStatus CaptureStatus(CUstream stream);

// The id cuCtxGetId reports for `context` (0 if it is not a live context).
KPACK_FAKE_EXPORT uint64_t ContextId(CUcontext context);

// ---- Tensor maps: cuTensorMapEncodeTiled.
//
// Each call is checked against the requirements the driver API documents (the map
// 64-byte aligned; rank 1..5, at least 3 when interleaved; the address 16-byte aligned (32
// for 32B interleave); dimensions in [1, 2^32]; strides multiples of 16 below 2^40; box
// dimensions in [1, 256], the innermost a multiple of 16 bytes and within the swizzle
// span; element strides in [1, 8]; NaN fill only for floating-point types): a call that
// fails one returns CUDA_ERROR_INVALID_VALUE and writes nothing. Every call is recorded
// (the last 256). A successful one fills the 128-byte map with a blob that
// DecodeTensorMap reads back.

// One cuTensorMapEncodeTiled call, its arrays innermost dimension first, as passed.
struct TensorMapEncode {
  uintptr_t tensor_map;  // the address the map was (to be) written to
  CUtensorMapDataType data_type;
  uint32_t rank;
  CUdeviceptr address;
  std::array<uint64_t, 5> dims;
  std::array<uint64_t, 4> strides;  // bytes; rank - 1 of them
  std::array<uint32_t, 5> box;
  std::array<uint32_t, 5> element_strides;
  CUtensorMapInterleave interleave;
  CUtensorMapSwizzle swizzle;
  CUtensorMapL2promotion l2_promotion;
  CUtensorMapFloatOOBfill oob_fill;
  bool ok;  // passed the checks (and the map was written)
};

// Calls since Reset(), failed ones included.
KPACK_FAKE_EXPORT int64_t TensorMapEncodeCount();
// The i-th call, 0-based; aborts unless it is among the last 256.
KPACK_FAKE_EXPORT TensorMapEncode GetTensorMapEncode(int64_t i);
// The encode a map written by the fake describes (its arguments; tensor_map is `map`);
// false when `map` holds no such blob.
KPACK_FAKE_EXPORT bool DecodeTensorMap(const void* map, TensorMapEncode* out);

// ---- Graphs built node by node (cuGraphCreate, cuGraphAddKernelNode, ...) ----

// One successful cuGraphExecKernelNodeSetParams.
struct NodeUpdate {
  uint64_t exec;        // ExecId of the executable graph changed
  size_t node;          // the node's index in its graph: the order nodes were added
  LaunchRecord launch;  // what the node launches from now on (stream null)
};

// Node parameter updates since Reset(), in order: all of them up to 2 * kLaunchRingCapacity,
// beyond that at least the last kLaunchRingCapacity.
KPACK_FAKE_EXPORT std::vector<NodeUpdate> NodeUpdates();
// Successful cuGraphLaunch calls since Reset().
KPACK_FAKE_EXPORT int64_t GraphLaunches();
// A process-unique id of a live executable graph (0 if `exec` is not one).
KPACK_FAKE_EXPORT uint64_t ExecId(CUgraphExec exec);
// The launches of a live graph (built: one per node, in the order added) or executable
// (with the node updates applied); empty if there is none.
KPACK_FAKE_EXPORT std::vector<LaunchRecord> GraphNodes(CUgraph graph);
KPACK_FAKE_EXPORT std::vector<LaunchRecord> ExecNodes(CUgraphExec exec);
// The live executable graphs, oldest first.
KPACK_FAKE_EXPORT std::vector<CUgraphExec> LiveExecs();

// One edge of a built graph: node indices (the order nodes were added) and its data.
struct GraphEdge {
  size_t from = 0;
  size_t to = 0;
  unsigned char from_port = 0;  // CU_GRAPH_KERNEL_NODE_PORT_*
  unsigned char type = 0;       // CUgraphDependencyType
};
// The edges of a live built graph or executable (the graph's at instantiation), in the
// order added; empty if there is none.
KPACK_FAKE_EXPORT std::vector<GraphEdge> GraphEdges(CUgraph graph);
KPACK_FAKE_EXPORT std::vector<GraphEdge> ExecEdges(CUgraphExec exec);

// The calling thread's stream capture interaction mode.
KPACK_FAKE_EXPORT CUstreamCaptureMode ThreadCaptureMode();

}  // namespace kpack::fake

#endif  // KPACK_TESTS_FAKE_DRIVER_FAKE_DRIVER_H_
