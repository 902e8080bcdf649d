// The one list of CUDA driver functions kpack uses. Each line is
//   KPACK_DRIVER_SYMBOL(name, version)
// where `name` is the driver function without its `cu` prefix and `version` is the CUDA
// version whose semantics we ask cuGetProcAddress for; the field type is cudaTypedefs.h's
// PFN_cu<name>_v<version>, so the prototype and the requested ABI can never disagree.
//
// Adding a function: add one line here. Nothing else declares driver entry points; the
// fake driver used by the CPU tests serves exactly this list too, and the runtime's
// fault-injection test (tests/unit/driver_fault_test.cc) refuses to build a list of
// faults that misses one: every function kpack's library calls must fail in turn there,
// and the ones only kpack's tools and tests call must be shown never to be called by it.
//
// No include guard: this file is an X-macro list and is meant to be included repeatedly.

// Error strings first: every later failure message uses them.
KPACK_DRIVER_SYMBOL(GetErrorName, 6000)
KPACK_DRIVER_SYMBOL(GetErrorString, 6000)
KPACK_DRIVER_SYMBOL(Init, 2000)
KPACK_DRIVER_SYMBOL(DriverGetVersion, 2020)
KPACK_DRIVER_SYMBOL(DeviceGet, 2000)
KPACK_DRIVER_SYMBOL(DeviceGetCount, 2000)
KPACK_DRIVER_SYMBOL(DeviceGetAttribute, 2000)
KPACK_DRIVER_SYMBOL(DeviceGetName, 2000)
KPACK_DRIVER_SYMBOL(DevicePrimaryCtxRetain, 7000)
KPACK_DRIVER_SYMBOL(DevicePrimaryCtxRelease, 11000)
KPACK_DRIVER_SYMBOL(CtxGetCurrent, 4000)
KPACK_DRIVER_SYMBOL(CtxSetCurrent, 4000)
KPACK_DRIVER_SYMBOL(CtxGetDevice, 2000)
KPACK_DRIVER_SYMBOL(CtxGetId, 12000)
KPACK_DRIVER_SYMBOL(CtxPushCurrent, 4000)
KPACK_DRIVER_SYMBOL(CtxPopCurrent, 4000)
KPACK_DRIVER_SYMBOL(CtxSynchronize, 2000)
KPACK_DRIVER_SYMBOL(CtxCreate, 12050)
KPACK_DRIVER_SYMBOL(CtxDestroy, 4000)
KPACK_DRIVER_SYMBOL(LibraryLoadData, 12000)
KPACK_DRIVER_SYMBOL(LibraryUnload, 12000)
KPACK_DRIVER_SYMBOL(LibraryGetKernel, 12000)
KPACK_DRIVER_SYMBOL(KernelGetAttribute, 12000)
KPACK_DRIVER_SYMBOL(KernelSetAttribute, 12000)
KPACK_DRIVER_SYMBOL(KernelGetParamInfo, 12040)
KPACK_DRIVER_SYMBOL(KernelGetFunction, 12000)
KPACK_DRIVER_SYMBOL(ModuleLoadData, 2000)
KPACK_DRIVER_SYMBOL(ModuleUnload, 2000)
KPACK_DRIVER_SYMBOL(ModuleGetFunction, 2000)
KPACK_DRIVER_SYMBOL(LaunchKernelEx, 11060)
// Host tensor descriptors: the launch encodes each CUtensorMap (src/launch/tensordesc.h).
KPACK_DRIVER_SYMBOL(TensorMapEncodeTiled, 12000)
KPACK_DRIVER_SYMBOL(MemAlloc, 3020)
KPACK_DRIVER_SYMBOL(MemFree, 3020)
KPACK_DRIVER_SYMBOL(MemcpyHtoD, 3020)
KPACK_DRIVER_SYMBOL(MemcpyDtoH, 3020)
KPACK_DRIVER_SYMBOL(MemsetD8, 3020)
KPACK_DRIVER_SYMBOL(StreamCreate, 2000)
KPACK_DRIVER_SYMBOL(StreamDestroy, 4000)
KPACK_DRIVER_SYMBOL(StreamSynchronize, 2000)
KPACK_DRIVER_SYMBOL(StreamGetCtx, 9020)
KPACK_DRIVER_SYMBOL(StreamGetId, 12000)
KPACK_DRIVER_SYMBOL(StreamBeginCapture, 10010)
KPACK_DRIVER_SYMBOL(StreamEndCapture, 10000)
KPACK_DRIVER_SYMBOL(StreamIsCapturing, 10000)
KPACK_DRIVER_SYMBOL(StreamGetCaptureInfo, 12030)
// The calling thread's capture interaction mode: kpack::StepGraph builds its graphs, and a
// thread's exit frees its per-thread scratch (launch/scratch.cc), in RELAXED mode, so that
// another thread's capture neither refuses nor is invalidated by them.
KPACK_DRIVER_SYMBOL(ThreadExchangeStreamCaptureMode, 10010)
KPACK_DRIVER_SYMBOL(UserObjectCreate, 11030)
KPACK_DRIVER_SYMBOL(UserObjectRelease, 11030)
KPACK_DRIVER_SYMBOL(GraphRetainUserObject, 11030)
// Host functions on a stream: the tests' model of GPU work still in flight (a stream
// held behind a host function), for scratch that must outlive it.
KPACK_DRIVER_SYMBOL(LaunchHostFunc, 10000)
KPACK_DRIVER_SYMBOL(GraphInstantiateWithFlags, 11040)
KPACK_DRIVER_SYMBOL(GraphLaunch, 10000)
KPACK_DRIVER_SYMBOL(GraphDestroy, 10000)
KPACK_DRIVER_SYMBOL(GraphExecDestroy, 10000)
// CUDA graphs built node by node (kpack::StepGraph, src/graph/).
KPACK_DRIVER_SYMBOL(GraphCreate, 10000)
KPACK_DRIVER_SYMBOL(GraphAddKernelNode, 12000)
KPACK_DRIVER_SYMBOL(GraphKernelNodeSetAttribute, 11000)
KPACK_DRIVER_SYMBOL(GraphExecKernelNodeSetParams, 12000)
// Edges with data (CUDA 12.3): programmatic (PDL) edges between a step graph's nodes.
KPACK_DRIVER_SYMBOL(GraphAddDependencies, 12030)
// Events and memory info: the graph benchmark's GPU times and device memory (bench/).
KPACK_DRIVER_SYMBOL(EventCreate, 2000)
KPACK_DRIVER_SYMBOL(EventRecord, 2000)
KPACK_DRIVER_SYMBOL(EventSynchronize, 2000)
KPACK_DRIVER_SYMBOL(EventElapsedTime, 2000)
KPACK_DRIVER_SYMBOL(EventDestroy, 4000)
KPACK_DRIVER_SYMBOL(MemGetInfo, 3020)
// Pinned host memory and stream-ordered copies: the Llama engine reads each step's tokens
// back a step late without stalling the stream (examples/llama).
KPACK_DRIVER_SYMBOL(MemAllocHost, 3020)
KPACK_DRIVER_SYMBOL(MemFreeHost, 2000)
KPACK_DRIVER_SYMBOL(MemcpyHtoDAsync, 3020)
KPACK_DRIVER_SYMBOL(MemcpyDtoHAsync, 3020)
