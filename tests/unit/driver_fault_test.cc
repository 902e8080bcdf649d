// Driver faults: every call kpack's library makes to the CUDA driver fails in turn, and
// the result must be a clean status naming the call (or success where kpack can do
// without it), a runtime that still works afterwards, and nothing leaked.
//
// The list of calls is not written by hand: it is driver_symbols.h, every function the
// driver table has. Each must be classified below, and the classification is checked
// against what the library really calls (counted by the fake driver while the library
// runs each operation): a function added to driver_symbols.h without a line here fails
// the build of this list, and one the library starts calling in a new place fails the
// classification check until it is covered.

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "fake_driver.h"
#include "fake_runtime.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kpack/kpack.h"

namespace kpack {
namespace {

using ::kpack::testing::FakeDriver;
using ::kpack::testing::OpenFake;
using ::testing::HasSubstr;

// How kpack's library uses a driver function.
enum class Use {
  kLibrary,       // called by the library; a failure is reported (or survived)
  kCleanup,       // called only where a failure cannot be reported: destruction, undoing
  kErrorText,     // formats error messages; a failure leaves a generic text
  kToolsOrTests,  // only kpack's tools and tests call it; the library never does
};

struct Classified {
  const char* fn;
  Use use;
};

// One line per driver_symbols.h function. (The static_assert below counts them.)
constexpr Classified kClassified[] = {
    {"GetErrorName", Use::kErrorText},
    {"GetErrorString", Use::kErrorText},
    {"Init", Use::kLibrary},
    {"DriverGetVersion", Use::kToolsOrTests},  // kpack doctor
    {"DeviceGet", Use::kLibrary},  // Runtime::CurrentDevice, UseDevice
    {"DeviceGetCount", Use::kLibrary},  // Runtime::CurrentDevice, UseDevice
    {"DeviceGetAttribute", Use::kLibrary},
    {"DeviceGetName", Use::kToolsOrTests},
    {"DevicePrimaryCtxRetain", Use::kLibrary},  // Runtime::UseDevice
    {"DevicePrimaryCtxRelease", Use::kToolsOrTests},
    {"CtxGetCurrent", Use::kLibrary},
    {"CtxSetCurrent", Use::kLibrary},  // Runtime::UseDevice
    {"CtxGetDevice", Use::kLibrary},
    {"CtxGetId", Use::kLibrary},
    {"CtxPushCurrent", Use::kLibrary},
    {"CtxPopCurrent", Use::kLibrary},
    {"CtxSynchronize", Use::kToolsOrTests},
    {"CtxCreate", Use::kToolsOrTests},
    {"CtxDestroy", Use::kToolsOrTests},
    {"LibraryLoadData", Use::kLibrary},
    {"LibraryUnload", Use::kCleanup},
    {"LibraryGetKernel", Use::kLibrary},
    {"KernelGetAttribute", Use::kLibrary},
    {"KernelSetAttribute", Use::kLibrary},
    {"KernelGetParamInfo", Use::kLibrary},
    {"KernelGetFunction", Use::kLibrary},
    {"ModuleLoadData", Use::kToolsOrTests},
    {"ModuleUnload", Use::kToolsOrTests},
    {"ModuleGetFunction", Use::kToolsOrTests},
    {"LaunchKernelEx", Use::kLibrary},
    {"TensorMapEncodeTiled", Use::kLibrary},
    {"MemAlloc", Use::kLibrary},
    {"MemFree", Use::kCleanup},
    {"MemcpyHtoD", Use::kToolsOrTests},
    {"MemcpyDtoH", Use::kToolsOrTests},
    {"MemsetD8", Use::kToolsOrTests},
    {"StreamCreate", Use::kToolsOrTests},
    {"StreamDestroy", Use::kToolsOrTests},
    {"StreamSynchronize", Use::kToolsOrTests},
    {"StreamGetCtx", Use::kLibrary},
    {"StreamGetId", Use::kLibrary},
    {"StreamBeginCapture", Use::kToolsOrTests},
    {"StreamEndCapture", Use::kToolsOrTests},
    {"StreamIsCapturing", Use::kLibrary},
    {"StreamGetCaptureInfo", Use::kLibrary},
    // kpack::StepGraph builds relaxed; a thread's exit frees its arenas relaxed too
    {"ThreadExchangeStreamCaptureMode", Use::kLibrary},
    {"UserObjectCreate", Use::kLibrary},
    {"UserObjectRelease", Use::kCleanup},
    {"GraphRetainUserObject", Use::kLibrary},
    {"LaunchHostFunc", Use::kToolsOrTests},  // stream work held in flight, in tests
    {"GraphInstantiateWithFlags", Use::kLibrary},  // kpack::StepGraph
    {"GraphLaunch", Use::kLibrary},
    {"GraphDestroy", Use::kCleanup},
    {"GraphExecDestroy", Use::kCleanup},
    {"GraphCreate", Use::kLibrary},
    {"GraphAddKernelNode", Use::kLibrary},
    {"GraphKernelNodeSetAttribute", Use::kLibrary},
    {"GraphExecKernelNodeSetParams", Use::kLibrary},
    {"GraphAddDependencies", Use::kLibrary},  // programmatic (PDL) edges
    {"EventCreate", Use::kToolsOrTests},  // bench/graph_bench
    {"EventRecord", Use::kToolsOrTests},
    {"EventSynchronize", Use::kToolsOrTests},
    {"EventElapsedTime", Use::kToolsOrTests},
    {"EventDestroy", Use::kToolsOrTests},
    {"MemGetInfo", Use::kToolsOrTests},
    {"MemAllocHost", Use::kToolsOrTests},  // examples/llama
    {"MemFreeHost", Use::kToolsOrTests},
    {"MemcpyHtoDAsync", Use::kToolsOrTests},
    {"MemcpyDtoHAsync", Use::kToolsOrTests},
};

constexpr const char* kSymbols[] = {
#define KPACK_DRIVER_SYMBOL(name, version) #name,
#include "driver/driver_symbols.h"
#undef KPACK_DRIVER_SYMBOL
};
static_assert(std::size(kSymbols) == std::size(kClassified),
              "driver_symbols.h and kClassified differ: classify every driver function here");

std::optional<Use> UseOf(std::string_view fn) {
  for (const Classified& c : kClassified) {
    if (c.fn == fn) return c.use;
  }
  return std::nullopt;
}

const CUdeviceptr kX = 0x7f0000001000, kOut = 0x7f0000003000;
constexpr size_t kReserve = 1 << 20;

// What an operation works on. The harness (Setup) may call the driver; only Run's calls
// are the library's.
struct World {
  std::optional<Runtime> rt;
  CUcontext context = nullptr;  // current on the harness's thread
  CUstream stream = nullptr;
  CUcontext second = nullptr;
  bool capturing = false;
  // A step (add, cluster: node attributes, scratch: a graph-owned buffer) and its graph.
  std::vector<BoundLaunch> step;
  std::optional<StepGraph> graph;
};

void MakeStream(World& w) {
  ASSERT_EQ(FakeDriver().StreamCreate(&w.stream, 0), CUDA_SUCCESS);
}
void Open(World& w) {
  auto rt = OpenFake();
  ASSERT_TRUE(rt.ok()) << rt.status();
  w.rt.emplace(*std::move(rt));
  ASSERT_EQ(FakeDriver().CtxGetCurrent(&w.context), CUDA_SUCCESS);
}
absl::Status LaunchAdd(Runtime& rt, CUstream s) {
  return rt.Launch("add", Grid{1}, s, kX, kX, kOut, 1);
}
absl::Status LaunchScratch(Runtime& rt, CUstream s) {
  return rt.Launch("scratch", Grid{2, 2}, s, kX, kOut, 64, 64, 64);
}
// A scratch launch on the per-thread stream of a thread that then exits: its exit frees
// the arena, where a failure cannot be reported.
absl::Status LaunchOnAThreadThatExits(World& w) {
  absl::Status status;
  std::thread([&] {
    if (const CUresult r = FakeDriver().CtxPushCurrent(w.context); r != CUDA_SUCCESS) {
      status = FakeDriver().Error(r, "cuCtxPushCurrent");
      return;
    }
    status = LaunchScratch(*w.rt, CU_STREAM_PER_THREAD);
  }).join();
  return status;
}
// kernels/descpack's copy_tma: two CUtensorMaps encoded per launch.
absl::Status LaunchDescriptors(Runtime& rt, CUstream s) {
  const TensorDesc in = TensorDesc::RowMajor(kX, {64, 128});
  const TensorDesc out = TensorDesc::RowMajor(kOut, {64, 128});
  return rt.Launch("copy_tma", s, in, out, 64, 128);
}

// Opens the runtime and a stream, then adds add(n = 2048) and `second` to the step.
void BindAddAnd(World& w, const char* second) {
  Open(w);
  MakeStream(w);
  const Runtime& rt = *w.rt;
  auto add = rt.Find("add")->BindArgs(Grid{2}, w.stream, kX, kX, kOut, 2048);
  ASSERT_TRUE(add.ok()) << add.status();
  w.step.push_back(*std::move(add));
  auto more = std::string_view(second) == "pdl"
                  ? rt.Find("pdl")->BindArgs(Grid{1}, w.stream, kOut, kX, 1024)
                  : rt.Find("cluster")->BindArgs(Grid{1}, w.stream, kX, kOut, 1024);
  ASSERT_TRUE(more.ok()) << more.status();
  w.step.push_back(*std::move(more));
}
void BindStep(World& w) {
  BindAddAnd(w, "cluster");
  auto scratch = w.rt->Find("scratch")->BindArgs(Grid{2, 2}, w.stream, kX, kOut, 64, 64, 64);
  ASSERT_TRUE(scratch.ok());
  w.step.push_back(*std::move(scratch));
}
// A step whose second launch is a PDL launch: its graph has a programmatic edge.
void BindPdlStep(World& w) { BindAddAnd(w, "pdl"); }
// Builds the step's graph, replays it, patches one node and replays it again.
absl::Status BuildAndReplay(World& w) {
  std::vector<BoundLaunch*> step;
  for (BoundLaunch& b : w.step) step.push_back(&b);
  absl::StatusOr<StepGraph> graph = StepGraph::Create(step);
  if (!graph.ok()) return graph.status();
  w.graph.emplace(*std::move(graph));
  if (absl::Status s = w.graph->Replay(w.stream); !s.ok()) return s;
  if (absl::Status s = w.step[0].Set(3, 1024); !s.ok()) return s;
  return w.graph->Replay(w.stream);
}
void DropStep(World& w) {
  w.graph.reset();
  w.step.clear();
}

struct Operation {
  const char* name;
  void (*setup)(World&);
  absl::Status (*run)(World&);
  void (*teardown)(World&) = nullptr;
  bool retry = true;  // run again after a fault, expecting success
};

const Operation kOperations[] = {
    {"open", [](World&) {},
     [](World& w) {
       auto rt = OpenFake();
       if (rt.ok()) w.rt.emplace(*std::move(rt));
       return rt.status();
     }},
    {"first launch", Open, [](World& w) { return LaunchAdd(*w.rt, nullptr); }},
    {"first launch, > 48 KiB shared", Open,
     [](World& w) {
       return w.rt->Launch("matmul", Grid{1, 1}, nullptr, kX, kX, kOut, 1, 1, 1, 1, 1, 1, 1, 1,
                           1);
     }},
    {"preload", Open, [](World& w) { return w.rt->Preload(); }},
    {"launch with tensor descriptors",
     [](World& w) {
       auto rt = OpenFake(KPACK_DESC_PACK_DIR);
       ASSERT_TRUE(rt.ok()) << rt.status();
       w.rt.emplace(*std::move(rt));
     },
     [](World& w) { return LaunchDescriptors(*w.rt, nullptr); }},
    {"launch in a second context",
     [](World& w) {
       Open(w);
       ASSERT_TRUE(LaunchAdd(*w.rt, nullptr).ok());
       CUdevice device;
       ASSERT_EQ(FakeDriver().DeviceGet(&device, 0), CUDA_SUCCESS);
       ASSERT_EQ(FakeDriver().CtxCreate(&w.second, nullptr, 0, device), CUDA_SUCCESS);
     },
     [](World& w) { return LaunchAdd(*w.rt, nullptr); },
     [](World& w) { FakeDriver().CtxDestroy(w.second); }},
    {"scratch launch on a stream",
     [](World& w) {
       Open(w);
       MakeStream(w);
     },
     [](World& w) { return LaunchScratch(*w.rt, w.stream); }},
    {"scratch launch on CU_STREAM_PER_THREAD", Open,
     [](World& w) { return LaunchScratch(*w.rt, CU_STREAM_PER_THREAD); }},
    {"reserve scratch",
     [](World& w) {
       Open(w);
       MakeStream(w);
     },
     [](World& w) { return w.rt->ReserveScratch(w.stream, kReserve); }},
    {"scratch launch in a capture",
     [](World& w) {
       Open(w);
       MakeStream(w);
       ASSERT_TRUE(w.rt->Preload().ok());
       ASSERT_TRUE(w.rt->ReserveScratch(w.stream, kReserve).ok());
       ASSERT_EQ(FakeDriver().StreamBeginCapture(w.stream, CU_STREAM_CAPTURE_MODE_GLOBAL),
                 CUDA_SUCCESS);
       w.capturing = true;
     },
     [](World& w) { return LaunchScratch(*w.rt, w.stream); },
     [](World& w) {
       CUgraph graph = nullptr;
       ASSERT_EQ(FakeDriver().StreamEndCapture(w.stream, &graph), CUDA_SUCCESS);
       ASSERT_EQ(FakeDriver().GraphDestroy(graph), CUDA_SUCCESS);
     }},
    {"release scratch",
     [](World& w) {
       Open(w);
       MakeStream(w);
       ASSERT_TRUE(LaunchScratch(*w.rt, w.stream).ok());
     },
     [](World& w) { return w.rt->ReleaseScratch(w.stream); }},
    {"step graph: build, replay, patch, replay", BindStep, BuildAndReplay, DropStep},
    {"a thread's exit frees its per-thread arena", Open, LaunchOnAThreadThatExits},
    // A refused instantiation or patch falls back to full edges here: the operation may
    // succeed where the one above fails.
    {"step graph with a programmatic edge", BindPdlStep, BuildAndReplay, DropStep},
    {"destroy",
     [](World& w) {
       Open(w);
       MakeStream(w);
       ASSERT_TRUE(LaunchAdd(*w.rt, nullptr).ok());
       ASSERT_TRUE(LaunchScratch(*w.rt, w.stream).ok());
       ASSERT_TRUE(w.rt->ReserveScratch(w.stream, kReserve).ok());
     },
     [](World& w) {
       w.rt.reset();
       return absl::OkStatus();
     },
     nullptr, /*retry=*/false},
    {"current device, first time in a context", Open,
     [](World& w) { return w.rt->CurrentDevice().status(); }},
    {"use device", Open, [](World& w) { return w.rt->UseDevice(0); }},
};

// Driver calls per function while `op` runs, without faults.
std::map<std::string, int64_t> CallsDuring(const Operation& op) {
  testing::ResetFake();
  World w;
  op.setup(w);
  std::map<std::string, int64_t> before, calls;
  for (const char* fn : kSymbols) before[fn] = fake::CallCount(fn);
  const absl::Status s = op.run(w);
  EXPECT_TRUE(s.ok()) << op.name << ": " << s;
  for (const char* fn : kSymbols) {
    if (int64_t n = fake::CallCount(fn) - before[fn]; n > 0) calls[fn] = n;
  }
  if (op.teardown != nullptr) op.teardown(w);
  w.rt.reset();
  fake::Reset();
  return calls;
}

class DriverFaultTest : public ::testing::Test {
 protected:
  void TearDown() override { fake::Reset(); }
};

// Cleanup calls no operation's clean run makes: cuUserObjectRelease (only when handing an
// arena to a graph failed: AGraphThatCannotTakeItsArenaGivesItBack), and the destruction of
// a StepGraph's graphs (when building one failed midway, and in ~StepGraph, whose failure
// could not be reported and would leave the graph and its scratch behind; the StepGraph
// tests check that destroying one leaves no graph or user object).
const std::set<std::string_view> kOnlyWhenSomethingFails = {"UserObjectRelease", "GraphDestroy",
                                                            "GraphExecDestroy"};

TEST_F(DriverFaultTest, EveryDriverFunctionIsClassifiedByWhatTheLibraryCalls) {
  for (const char* fn : kSymbols) {
    EXPECT_TRUE(UseOf(fn).has_value()) << "cu" << fn << " is not classified";
  }
  std::set<std::string> called;
  for (const Operation& op : kOperations) {
    for (const auto& [fn, n] : CallsDuring(op)) called.insert(fn);
  }
  for (const Classified& c : kClassified) {
    if (c.use == Use::kToolsOrTests) {
      EXPECT_FALSE(called.contains(c.fn))
          << "the library calls cu" << c.fn << ": classify it and cover it with a fault";
    } else if (c.use != Use::kErrorText && !kOnlyWhenSomethingFails.contains(c.fn)) {
      EXPECT_TRUE(called.contains(c.fn))
          << "cu" << c.fn << " is classified as used, but no operation here calls it";
    }
  }
}

// Every call of every library function in every operation fails in turn (one fault per
// run): the operation either fails with a status naming the call, or succeeds; it then
// succeeds when run again; and once the runtime is destroyed nothing it allocated or
// loaded is left, unless the fault hit the destruction itself.
TEST_F(DriverFaultTest, EachCallFailingGivesACleanStatusAndLeaksNothing) {
  std::set<std::string> reported;
  int cases = 0;
  for (const Operation& op : kOperations) {
    for (const auto& [fn, n] : CallsDuring(op)) {
      for (int k = 0; k < n; ++k) {
        SCOPED_TRACE(std::string(op.name) + ": call " + std::to_string(k + 1) + " of cu" + fn);
        ++cases;
        testing::ResetFake();
        World w;
        op.setup(w);
        fake::FailNext(fn, CUDA_ERROR_INVALID_VALUE, k);
        const absl::Status s = op.run(w);
        if (!s.ok()) {
          EXPECT_THAT(std::string(s.message()), HasSubstr("cu" + fn)) << s;
          EXPECT_THAT(std::string(s.message()), HasSubstr("CUDA_ERROR_INVALID_VALUE")) << s;
          reported.insert(fn);
        }
        if (op.retry) EXPECT_TRUE(op.run(w).ok()) << "after the fault";
        if (op.teardown != nullptr) op.teardown(w);
        w.rt.reset();
        if (std::string_view(op.name) != "destroy") {
          EXPECT_EQ(fake::LiveAllocations(), 0);
          EXPECT_EQ(fake::LoadedLibraries(), 0);
          EXPECT_EQ(fake::LiveUserObjects(), 0);
        }
      }
    }
  }
  EXPECT_GT(cases, 50);
  for (const Classified& c : kClassified) {
    if (c.use == Use::kLibrary) {
      EXPECT_TRUE(reported.contains(c.fn)) << "no failure of cu" << c.fn << " was reported";
    }
  }
}

// cuUserObjectRelease runs only when handing an arena to a graph failed: the arena must
// come back to the pool, and the capture must stay usable.
TEST_F(DriverFaultTest, AGraphThatCannotTakeItsArenaGivesItBack) {
  testing::ResetFake();
  World w;
  kOperations[9].setup(w);  // a reserved arena, a capture begun
  ASSERT_STREQ(kOperations[9].name, "scratch launch in a capture");
  fake::FailNext("GraphRetainUserObject", CUDA_ERROR_INVALID_VALUE);
  absl::Status s = LaunchScratch(*w.rt, w.stream);
  EXPECT_THAT(std::string(s.message()), HasSubstr("cuGraphRetainUserObject"));
  EXPECT_EQ(fake::CallCount("UserObjectRelease"), 1);
  EXPECT_EQ(w.rt->stats().scratch_idle, 1u) << "the arena is back in the pool";
  EXPECT_EQ(w.rt->stats().scratch_in_graphs, 0u);
  EXPECT_TRUE(LaunchScratch(*w.rt, w.stream).ok()) << "and the capture can take it again";
  EXPECT_EQ(w.rt->stats().scratch_in_graphs, 1u);
  kOperations[9].teardown(w);
  EXPECT_EQ(w.rt->stats().scratch_idle, 1u) << "the destroyed graph returned it";
  w.rt.reset();
  EXPECT_EQ(fake::LiveAllocations(), 0);
}

// The error text functions failing leave a message with the code's number.
TEST_F(DriverFaultTest, ErrorTextSurvivesItsOwnFailure) {
  testing::ResetFake();
  auto rt = OpenFake();
  ASSERT_TRUE(rt.ok());
  fake::FailNext("LaunchKernelEx", CUDA_ERROR_INVALID_VALUE);
  fake::FailNext("GetErrorName", CUDA_ERROR_INVALID_VALUE);
  fake::FailNext("GetErrorString", CUDA_ERROR_INVALID_VALUE);
  absl::Status s = LaunchAdd(*rt, nullptr);
  EXPECT_THAT(std::string(s.message()), HasSubstr("cuLaunchKernelEx for kernel 'add'"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("CUDA error (1)"));
}

}  // namespace
}  // namespace kpack
