// Tests the fake driver through the same door the kpack runtime uses: dlopen by path,
// cuGetProcAddress_v2, and every function of driver_symbols.h at its listed version.

#include "fake_driver.h"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <dlfcn.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <new>
#include <set>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

// Counts operator new calls in the whole process, the fake's included, as the kpack
// runtime's allocation tests do. Every form is replaced so that no allocation escapes the
// count. (Under clang's TSan this needs -shared-libsan: its static runtime defines these
// operators too.)
namespace {

std::atomic<int64_t> g_heap_allocations{0};

void* Allocate(std::size_t size, std::size_t alignment = alignof(std::max_align_t)) {
  g_heap_allocations.fetch_add(1, std::memory_order_relaxed);
  size = size == 0 ? 1 : size;
  if (alignment <= alignof(std::max_align_t)) return std::malloc(size);
  return std::aligned_alloc(alignment, (size + alignment - 1) / alignment * alignment);
}

void* AllocateOrThrow(std::size_t size, std::size_t alignment = alignof(std::max_align_t)) {
  if (void* p = Allocate(size, alignment)) return p;
  throw std::bad_alloc();
}

}  // namespace

// GCC 12 flags free() of memory from these operator new forms, which is exactly the
// pairing intended here.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void* operator new(std::size_t n) { return AllocateOrThrow(n); }
void* operator new[](std::size_t n) { return AllocateOrThrow(n); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept { return Allocate(n); }
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept { return Allocate(n); }
void* operator new(std::size_t n, std::align_val_t a) {
  return AllocateOrThrow(n, static_cast<std::size_t>(a));
}
void* operator new[](std::size_t n, std::align_val_t a) {
  return AllocateOrThrow(n, static_cast<std::size_t>(a));
}
void* operator new(std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  return Allocate(n, static_cast<std::size_t>(a));
}
void* operator new[](std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  return Allocate(n, static_cast<std::size_t>(a));
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
#pragma GCC diagnostic pop

namespace kpack::fake {
namespace {

using ::testing::ElementsAre;
using ::testing::StrEq;

struct Api {
#define KPACK_DRIVER_SYMBOL(name, version) PFN_cu##name##_v##version name = nullptr;
#include "driver/driver_symbols.h"
#undef KPACK_DRIVER_SYMBOL
};

using GetProcAddressFn = CUresult (*)(const char*, void**, int, cuuint64_t,
                                      CUdriverProcAddressQueryResult*);

struct Symbol {
  const char* name;
  int version;
};
constexpr Symbol kSymbols[] = {
#define KPACK_DRIVER_SYMBOL(name, version) {"cu" #name, version},
#include "driver/driver_symbols.h"
#undef KPACK_DRIVER_SYMBOL
};

// add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK) from Triton 3.6, sm_90a: parameters at
// 0/8, 8/8, 16/8, 24/4, then Triton's hidden scratch pointers at 32/8 and 40/8.
constexpr size_t kAddParamBytes = 48;

std::vector<char> ReadFixture() {
  std::ifstream file(KPACK_TESTDATA_DIR "/add.cubin", std::ios::binary);
  return std::vector<char>((std::istreambuf_iterator<char>(file)),
                           std::istreambuf_iterator<char>());
}

// The add_kernel fixture with its e_flags rewritten to a Triton sm_80 cubin's.
std::vector<char> Sm80Fixture() {
  std::vector<char> image = ReadFixture();
  const uint32_t flags = 0x00500550;
  std::memcpy(image.data() + 48, &flags, sizeof(flags));
  return image;
}

std::array<std::byte, kAddParamBytes> AddParams(CUdeviceptr x, CUdeviceptr y, CUdeviceptr out,
                                                int32_t n) {
  std::array<std::byte, kAddParamBytes> buffer{};
  std::memcpy(buffer.data() + 0, &x, 8);
  std::memcpy(buffer.data() + 8, &y, 8);
  std::memcpy(buffer.data() + 16, &out, 8);
  std::memcpy(buffer.data() + 24, &n, 4);
  return buffer;
}

CUlaunchConfig Config(CUstream stream, unsigned grid_x = 4, unsigned block_x = 128) {
  CUlaunchConfig config{};
  config.gridDimX = grid_x;
  config.gridDimY = 1;
  config.gridDimZ = 1;
  config.blockDimX = block_x;
  config.blockDimY = 1;
  config.blockDimZ = 1;
  config.hStream = stream;
  return config;
}

class FakeDriverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Reset();
    handle_ = dlopen(KPACK_FAKE_CUDA_PATH, RTLD_NOW | RTLD_LOCAL);
    ASSERT_NE(handle_, nullptr) << dlerror();
    get_proc_ = reinterpret_cast<GetProcAddressFn>(dlsym(handle_, "cuGetProcAddress_v2"));
    ASSERT_NE(get_proc_, nullptr);
#define KPACK_DRIVER_SYMBOL(name, version)                                              \
  {                                                                                     \
    void* fn = nullptr;                                                                 \
    CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;        \
    ASSERT_EQ(get_proc_("cu" #name, &fn, version, CU_GET_PROC_ADDRESS_DEFAULT, &found), \
              CUDA_SUCCESS)                                                             \
        << #name;                                                                       \
    ASSERT_EQ(found, CU_GET_PROC_ADDRESS_SUCCESS) << #name;                             \
    ASSERT_NE(fn, nullptr) << #name;                                                    \
    cu.name = reinterpret_cast<PFN_cu##name##_v##version>(fn);                          \
  }
#include "driver/driver_symbols.h"
#undef KPACK_DRIVER_SYMBOL
    image_ = ReadFixture();
    ASSERT_FALSE(image_.empty());
  }

  void TearDown() override {
    if (handle_ != nullptr) dlclose(handle_);
  }

  // cuInit, and device 0's primary context made current (a fresh thread has none).
  void Init() {
    ASSERT_EQ(cu.Init(0), CUDA_SUCCESS);
    CUdevice device;
    ASSERT_EQ(cu.DeviceGet(&device, 0), CUDA_SUCCESS);
    CUcontext primary;
    ASSERT_EQ(cu.DevicePrimaryCtxRetain(&primary, device), CUDA_SUCCESS);
    ASSERT_EQ(cu.CtxSetCurrent(primary), CUDA_SUCCESS);
  }

  // Initializes and loads the fixture as a library; sets library_ and kernel_.
  void LoadAdd() {
    Init();
    ASSERT_EQ(
        cu.LibraryLoadData(&library_, image_.data(), nullptr, nullptr, 0, nullptr, nullptr, 0),
        CUDA_SUCCESS);
    ASSERT_EQ(cu.LibraryGetKernel(&kernel_, library_, "add_kernel"), CUDA_SUCCESS);
    ASSERT_EQ(cu.KernelGetFunction(&function_, kernel_), CUDA_SUCCESS);
  }

  CUresult LaunchExtra(const CUlaunchConfig& config, std::array<std::byte, kAddParamBytes>& params,
                       size_t size = kAddParamBytes) {
    void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, params.data(), CU_LAUNCH_PARAM_BUFFER_SIZE,
                     &size, CU_LAUNCH_PARAM_END};
    return cu.LaunchKernelEx(&config, function_, nullptr, extra);
  }

  // A graph of one add_kernel launch captured on `stream` (grid x `grid_x`), and its
  // executable. After LoadAdd.
  void CaptureAdd(CUstream stream, unsigned grid_x, CUgraph* graph, CUgraphExec* exec) {
    ASSERT_EQ(cu.StreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
    auto params = AddParams(1, 2, 3, 100);
    ASSERT_EQ(LaunchExtra(Config(stream, grid_x), params), CUDA_SUCCESS);
    ASSERT_EQ(cu.StreamEndCapture(stream, graph), CUDA_SUCCESS);
    ASSERT_EQ(cu.GraphInstantiateWithFlags(exec, *graph, 0), CUDA_SUCCESS);
  }

  Api cu;
  void* handle_ = nullptr;
  GetProcAddressFn get_proc_ = nullptr;
  std::vector<char> image_;
  CUlibrary library_ = nullptr;
  CUkernel kernel_ = nullptr;
  CUfunction function_ = nullptr;
};

TEST_F(FakeDriverTest, DlopenFindsTheLinkedLibrary) {
  // One object, hence one state shared by the control API and the driver functions.
  EXPECT_EQ(reinterpret_cast<void*>(get_proc_), reinterpret_cast<void*>(&cuGetProcAddress_v2));
}

TEST_F(FakeDriverTest, ServesEachSymbolOnlyAtItsListedVersion) {
  for (const Symbol& symbol : kSymbols) {
    SCOPED_TRACE(symbol.name);
    void* fn = reinterpret_cast<void*>(1);
    CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SUCCESS;
    EXPECT_EQ(get_proc_(symbol.name, &fn, symbol.version - 1, 0, &found), CUDA_ERROR_NOT_FOUND);
    EXPECT_EQ(found, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
    EXPECT_EQ(fn, nullptr);
    EXPECT_EQ(get_proc_(symbol.name, &fn, symbol.version + 1, 0, &found), CUDA_ERROR_NOT_FOUND);
    EXPECT_EQ(found, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
  }
  void* fn = nullptr;
  CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SUCCESS;
  EXPECT_EQ(get_proc_("cuNoSuchFunction", &fn, 13000, 0, &found), CUDA_ERROR_NOT_FOUND);
  EXPECT_EQ(found, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);

  // The older export, without the status argument, serves the same table.
  using GetProcAddressV1 = CUresult (*)(const char*, void**, int, cuuint64_t);
  auto v1 = reinterpret_cast<GetProcAddressV1>(dlsym(handle_, "cuGetProcAddress"));
  ASSERT_NE(v1, nullptr);
  ASSERT_EQ(v1("cuMemAlloc", &fn, 3020, 0), CUDA_SUCCESS);
  EXPECT_EQ(fn, reinterpret_cast<void*>(cu.MemAlloc));
}

TEST_F(FakeDriverTest, HiddenSymbolIsMissing) {
  HideSymbol("LaunchKernelEx");
  void* fn = nullptr;
  CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SUCCESS;
  EXPECT_EQ(get_proc_("cuLaunchKernelEx", &fn, 11060, 0, &found), CUDA_ERROR_NOT_FOUND);
  EXPECT_EQ(found, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
  EXPECT_EQ(fn, nullptr);
}

TEST_F(FakeDriverTest, RequiresInitFirst) {
  int count = -1;
  EXPECT_EQ(cu.DeviceGetCount(&count), CUDA_ERROR_NOT_INITIALIZED);
  CUdeviceptr pointer;
  EXPECT_EQ(cu.MemAlloc(&pointer, 16), CUDA_ERROR_NOT_INITIALIZED);
  // These work before cuInit, as in the real driver.
  int version = 0;
  EXPECT_EQ(cu.DriverGetVersion(&version), CUDA_SUCCESS);
  EXPECT_EQ(version, 13000);
  const char* name = nullptr;
  EXPECT_EQ(cu.GetErrorName(CUDA_ERROR_NOT_INITIALIZED, &name), CUDA_SUCCESS);

  EXPECT_EQ(cu.Init(1), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu.Init(0), CUDA_SUCCESS);
  EXPECT_EQ(cu.DeviceGetCount(&count), CUDA_SUCCESS);
  EXPECT_EQ(count, 1);
}

TEST_F(FakeDriverTest, InitCanFail) {
  SetInitError(CUDA_ERROR_NO_DEVICE);
  EXPECT_EQ(cu.Init(0), CUDA_ERROR_NO_DEVICE);
  int count;
  EXPECT_EQ(cu.DeviceGetCount(&count), CUDA_ERROR_NOT_INITIALIZED);

  SetInitError(CUDA_SUCCESS);
  SetDevices({});
  EXPECT_EQ(cu.Init(0), CUDA_ERROR_NO_DEVICE);
}

TEST_F(FakeDriverTest, ErrorNamesAndStrings) {
  const char* text = nullptr;
  ASSERT_EQ(cu.GetErrorName(CUDA_ERROR_NO_BINARY_FOR_GPU, &text), CUDA_SUCCESS);
  EXPECT_THAT(text, StrEq("CUDA_ERROR_NO_BINARY_FOR_GPU"));
  ASSERT_EQ(cu.GetErrorString(CUDA_ERROR_INVALID_VALUE, &text), CUDA_SUCCESS);
  EXPECT_THAT(text, StrEq("invalid argument"));
  // 1000 is no CUresult, yet within the enum's range (casting a larger value is UB).
  ASSERT_EQ(cu.GetErrorName(static_cast<CUresult>(1000), &text), CUDA_SUCCESS);
  EXPECT_THAT(text, StrEq("CUDA_ERROR_UNKNOWN"));
  EXPECT_EQ(cu.GetErrorName(CUDA_SUCCESS, nullptr), CUDA_ERROR_INVALID_VALUE);
}

TEST_F(FakeDriverTest, DeviceProperties) {
  SetDevices({DeviceConfig{}, DeviceConfig{.cc_major = 8, .cc_minor = 6, .name = "Fake A40"}});
  Init();
  int count = 0;
  ASSERT_EQ(cu.DeviceGetCount(&count), CUDA_SUCCESS);
  EXPECT_EQ(count, 2);
  CUdevice device;
  EXPECT_EQ(cu.DeviceGet(&device, 2), CUDA_ERROR_INVALID_DEVICE);
  ASSERT_EQ(cu.DeviceGet(&device, 1), CUDA_SUCCESS);

  auto attribute = [&](CUdevice_attribute which, CUdevice dev) {
    int value = -1;
    EXPECT_EQ(cu.DeviceGetAttribute(&value, which, dev), CUDA_SUCCESS) << which;
    return value;
  };
  EXPECT_EQ(attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 0), 9);
  EXPECT_EQ(attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, 0), 0);
  EXPECT_EQ(attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device), 8);
  EXPECT_EQ(attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device), 6);
  EXPECT_EQ(attribute(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, 0), 232448);
  EXPECT_EQ(attribute(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, 0), 1024);
  EXPECT_EQ(attribute(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 0), 132);
  int value;
  EXPECT_EQ(cu.DeviceGetAttribute(&value, CU_DEVICE_ATTRIBUTE_ECC_ENABLED, 0),
            CUDA_ERROR_INVALID_VALUE);

  char name[64];
  ASSERT_EQ(cu.DeviceGetName(name, sizeof(name), 0), CUDA_SUCCESS);
  EXPECT_THAT(name, StrEq("Fake H200"));
  ASSERT_EQ(cu.DeviceGetName(name, 5, 1), CUDA_SUCCESS);
  EXPECT_THAT(name, StrEq("Fake"));
}

TEST_F(FakeDriverTest, ContextsArePerThread) {
  ASSERT_EQ(cu.Init(0), CUDA_SUCCESS);
  CUcontext primary = nullptr;
  ASSERT_EQ(cu.DevicePrimaryCtxRetain(&primary, 0), CUDA_SUCCESS);
  EXPECT_EQ(PrimaryContextRefCount(0), 1);

  // As in libcuda, a thread has no current context until it makes one current.
  CUcontext current = primary;
  ASSERT_EQ(cu.CtxGetCurrent(&current), CUDA_SUCCESS);
  EXPECT_EQ(current, nullptr);
  unsigned long long id = 0;  // NOLINT(runtime/int)
  EXPECT_EQ(cu.CtxGetId(nullptr, &id), CUDA_ERROR_INVALID_CONTEXT);
  CUdevice device = -1;
  EXPECT_EQ(cu.CtxGetDevice(&device), CUDA_ERROR_INVALID_CONTEXT);
  EXPECT_EQ(cu.CtxPopCurrent(&current), CUDA_ERROR_INVALID_CONTEXT);

  ASSERT_EQ(cu.CtxPushCurrent(primary), CUDA_SUCCESS);
  ASSERT_EQ(cu.CtxGetDevice(&device), CUDA_SUCCESS);
  EXPECT_EQ(device, 0);
  std::thread([&] {
    CUcontext other = primary;
    EXPECT_EQ(cu.CtxGetCurrent(&other), CUDA_SUCCESS);
    EXPECT_EQ(other, nullptr);
    EXPECT_EQ(cu.CtxSetCurrent(primary), CUDA_SUCCESS);
    EXPECT_EQ(cu.CtxGetCurrent(&other), CUDA_SUCCESS);
    EXPECT_EQ(other, primary);
  }).join();
  ASSERT_EQ(cu.CtxPopCurrent(&current), CUDA_SUCCESS);
  EXPECT_EQ(current, primary);

  // cuCtxSetCurrent replaces the top of the stack; null pops it.
  ASSERT_EQ(cu.CtxSetCurrent(primary), CUDA_SUCCESS);
  ASSERT_EQ(cu.CtxGetCurrent(&current), CUDA_SUCCESS);
  EXPECT_EQ(current, primary);
  ASSERT_EQ(cu.CtxSetCurrent(nullptr), CUDA_SUCCESS);
  ASSERT_EQ(cu.CtxGetCurrent(&current), CUDA_SUCCESS);
  EXPECT_EQ(current, nullptr);
  EXPECT_EQ(cu.CtxSetCurrent(reinterpret_cast<CUcontext>(&current)), CUDA_ERROR_INVALID_CONTEXT);

  EXPECT_EQ(cu.DevicePrimaryCtxRelease(0), CUDA_SUCCESS);
  EXPECT_EQ(PrimaryContextRefCount(0), 0);
  EXPECT_EQ(cu.DevicePrimaryCtxRelease(0), CUDA_ERROR_INVALID_CONTEXT);
}

TEST_F(FakeDriverTest, ContextIdsAreUniqueAndDestroyTakesEverythingWithIt) {
  Init();
  CUcontext primary = nullptr;
  ASSERT_EQ(cu.CtxGetCurrent(&primary), CUDA_SUCCESS);
  unsigned long long primary_id = 0, id = 0;  // NOLINT(runtime/int)
  ASSERT_EQ(cu.CtxGetId(nullptr, &primary_id), CUDA_SUCCESS);
  ASSERT_EQ(cu.CtxGetId(primary, &id), CUDA_SUCCESS);
  EXPECT_EQ(id, primary_id);
  EXPECT_EQ(ContextId(primary), primary_id);
  EXPECT_EQ(cu.CtxDestroy(primary), CUDA_ERROR_INVALID_CONTEXT) << "a primary context";

  // cuCtxCreate pushes the new context; cuCtxDestroy pops it and frees what it owned.
  SetHandleReuse(true);
  CUdevice device;
  ASSERT_EQ(cu.DeviceGet(&device, 0), CUDA_SUCCESS);
  CUcontext created = nullptr;
  EXPECT_EQ(cu.CtxCreate(&created, nullptr, 1, device), CUDA_ERROR_INVALID_VALUE);
  ASSERT_EQ(cu.CtxCreate(&created, nullptr, 0, device), CUDA_SUCCESS);
  CUcontext current = nullptr;
  ASSERT_EQ(cu.CtxGetCurrent(&current), CUDA_SUCCESS);
  EXPECT_EQ(current, created);
  unsigned long long created_id = 0;  // NOLINT(runtime/int)
  ASSERT_EQ(cu.CtxGetId(nullptr, &created_id), CUDA_SUCCESS);
  EXPECT_NE(created_id, primary_id);
  ASSERT_EQ(cu.LibraryLoadData(&library_, image_.data(), nullptr, nullptr, 0, nullptr, nullptr, 0),
            CUDA_SUCCESS);
  ASSERT_EQ(cu.LibraryGetKernel(&kernel_, library_, "add_kernel"), CUDA_SUCCESS);
  CUfunction in_created = nullptr;
  ASSERT_EQ(cu.KernelGetFunction(&in_created, kernel_), CUDA_SUCCESS);
  CUdeviceptr memory;
  ASSERT_EQ(cu.MemAlloc(&memory, 64), CUDA_SUCCESS);
  CUstream stream;
  ASSERT_EQ(cu.StreamCreate(&stream, 0), CUDA_SUCCESS);
  EXPECT_EQ(LiveAllocations(), 1);

  ASSERT_EQ(cu.CtxDestroy(created), CUDA_SUCCESS);
  ASSERT_EQ(cu.CtxGetCurrent(&current), CUDA_SUCCESS);
  EXPECT_EQ(current, primary) << "popped";
  EXPECT_EQ(LiveAllocations(), 0);
  EXPECT_EQ(LiveStreams(), 0);
  EXPECT_EQ(cu.CtxGetId(created, &id), CUDA_ERROR_CONTEXT_IS_DESTROYED);

  // With handle reuse the next context gets the same handle, but a new id, and none of
  // the old one's functions.
  CUcontext again = nullptr;
  ASSERT_EQ(cu.CtxCreate(&again, nullptr, 0, device), CUDA_SUCCESS);
  EXPECT_EQ(again, created);
  ASSERT_EQ(cu.CtxGetId(nullptr, &id), CUDA_SUCCESS);
  EXPECT_NE(id, created_id);
  EXPECT_NE(id, primary_id);
  auto params = AddParams(0, 0, 0, 0);
  function_ = in_created;
  EXPECT_EQ(LaunchExtra(Config(nullptr), params), CUDA_ERROR_INVALID_HANDLE)
      << "a CUfunction of the destroyed context";
  ASSERT_EQ(cu.KernelGetFunction(&function_, kernel_), CUDA_SUCCESS);
  EXPECT_EQ(LaunchExtra(Config(nullptr), params), CUDA_SUCCESS);
  ASSERT_EQ(cu.CtxDestroy(again), CUDA_SUCCESS);
}

TEST_F(FakeDriverTest, DeviceHandlesNeedNotBeOrdinals) {
  SetDevices({DeviceConfig{}, DeviceConfig{.cc_major = 8, .cc_minor = 6}});
  SetDeviceHandleOffset(100);
  ASSERT_EQ(cu.Init(0), CUDA_SUCCESS);
  CUdevice device;
  ASSERT_EQ(cu.DeviceGet(&device, 1), CUDA_SUCCESS);
  EXPECT_EQ(device, 101);
  int value = 0;
  EXPECT_EQ(cu.DeviceGetAttribute(&value, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 1),
            CUDA_ERROR_INVALID_DEVICE)
      << "an ordinal is not a handle";
  ASSERT_EQ(cu.DeviceGetAttribute(&value, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device),
            CUDA_SUCCESS);
  EXPECT_EQ(value, 8);
  CUcontext context;
  ASSERT_EQ(cu.DevicePrimaryCtxRetain(&context, device), CUDA_SUCCESS);
  ASSERT_EQ(cu.CtxSetCurrent(context), CUDA_SUCCESS);
  CUdevice current = -1;
  ASSERT_EQ(cu.CtxGetDevice(&current), CUDA_SUCCESS);
  EXPECT_EQ(current, 101);
  EXPECT_EQ(PrimaryContextRefCount(1), 1) << "the control API speaks ordinals";
}

TEST_F(FakeDriverTest, LibraryKernelsAnswerFromTheCubin) {
  LoadAdd();
  EXPECT_EQ(LoadedLibraries(), 1);
  EXPECT_EQ(LibraryLoads(), 1);
  std::vector<std::pair<int, int>> layout;
  for (size_t i = 0;; ++i) {
    size_t offset = 0, size = 0;
    const CUresult r = cu.KernelGetParamInfo(kernel_, i, &offset, &size);
    if (r == CUDA_ERROR_INVALID_VALUE) break;
    ASSERT_EQ(r, CUDA_SUCCESS);
    layout.emplace_back(static_cast<int>(offset), static_cast<int>(size));
  }
  EXPECT_THAT(layout, ElementsAre(std::pair(0, 8), std::pair(8, 8), std::pair(16, 8),
                                  std::pair(24, 4), std::pair(32, 8), std::pair(40, 8)));

  CUkernel missing;
  EXPECT_EQ(cu.LibraryGetKernel(&missing, library_, "mul_kernel"), CUDA_ERROR_NOT_FOUND);

  ASSERT_EQ(cu.LibraryUnload(library_), CUDA_SUCCESS);
  EXPECT_EQ(LoadedLibraries(), 0);
  EXPECT_EQ(cu.LibraryUnload(library_), CUDA_ERROR_INVALID_HANDLE);
  size_t offset;
  EXPECT_EQ(cu.KernelGetParamInfo(kernel_, 0, &offset, nullptr), CUDA_ERROR_INVALID_HANDLE);
}

TEST_F(FakeDriverTest, RejectsInvalidImages) {
  Init();
  CUlibrary library;
  const std::string text(256, 'x');
  EXPECT_EQ(cu.LibraryLoadData(&library, text.data(), nullptr, nullptr, 0, nullptr, nullptr, 0),
            CUDA_ERROR_INVALID_IMAGE);
  std::vector<char> corrupt = image_;
  corrupt[18] = 62;  // e_machine = EM_X86_64
  EXPECT_EQ(cu.LibraryLoadData(&library, corrupt.data(), nullptr, nullptr, 0, nullptr, nullptr, 0),
            CUDA_ERROR_INVALID_IMAGE);
  CUmodule module;
  EXPECT_EQ(cu.ModuleLoadData(&module, text.data()), CUDA_ERROR_INVALID_IMAGE);
  EXPECT_EQ(LibraryLoads(), 0);
}

TEST_F(FakeDriverTest, ArchitectureMustMatchADevice) {
  SetDevices({DeviceConfig{.cc_major = 8, .cc_minor = 6}});
  Init();
  CUlibrary library;
  ASSERT_EQ(cu.LibraryLoadData(&library, image_.data(), nullptr, nullptr, 0, nullptr, nullptr, 0),
            CUDA_SUCCESS);
  CUkernel kernel;
  // sm_90a runs on 9.0 only.
  EXPECT_EQ(cu.LibraryGetKernel(&kernel, library, "add_kernel"), CUDA_ERROR_NO_BINARY_FOR_GPU);
  CUmodule module;
  EXPECT_EQ(cu.ModuleLoadData(&module, image_.data()), CUDA_ERROR_NO_BINARY_FOR_GPU);

  // sm_80 runs on 8.6 (same major, lower minor) but not on 9.0.
  const std::vector<char> sm80 = Sm80Fixture();
  ASSERT_EQ(cu.LibraryLoadData(&library, sm80.data(), nullptr, nullptr, 0, nullptr, nullptr, 0),
            CUDA_SUCCESS);
  EXPECT_EQ(cu.LibraryGetKernel(&kernel, library, "add_kernel"), CUDA_SUCCESS);
  Reset();
  Init();
  ASSERT_EQ(cu.LibraryLoadData(&library, sm80.data(), nullptr, nullptr, 0, nullptr, nullptr, 0),
            CUDA_SUCCESS);
  EXPECT_EQ(cu.LibraryGetKernel(&kernel, library, "add_kernel"), CUDA_ERROR_NO_BINARY_FOR_GPU);
}

TEST_F(FakeDriverTest, KernelAttributes) {
  LoadAdd();
  auto get = [&](CUfunction_attribute which) {
    int value = -1;
    EXPECT_EQ(cu.KernelGetAttribute(&value, which, kernel_, 0), CUDA_SUCCESS) << which;
    return value;
  };
  EXPECT_EQ(get(CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK), 1024);
  EXPECT_EQ(get(CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES), 0);
  EXPECT_EQ(get(CU_FUNC_ATTRIBUTE_NUM_REGS), 32);
  EXPECT_EQ(get(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES), 48 * 1024);
  SetKernelLimits({.max_threads_per_block = 256, .static_shared_bytes = 1024, .num_regs = 64});
  EXPECT_EQ(get(CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK), 256);
  EXPECT_EQ(get(CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES), 1024);
  EXPECT_EQ(get(CU_FUNC_ATTRIBUTE_NUM_REGS), 64);
  EXPECT_EQ(get(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES), 47 * 1024);

  // Up to the opt-in limit minus static shared memory.
  EXPECT_EQ(cu.KernelSetAttribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                  232448 - 1024 + 1, kernel_, 0),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(
      cu.KernelSetAttribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 100000, kernel_, 0),
      CUDA_SUCCESS);
  EXPECT_EQ(get(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES), 100000);
  EXPECT_EQ(cu.KernelSetAttribute(CU_FUNC_ATTRIBUTE_NUM_REGS, 8, kernel_, 0),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu.KernelSetAttribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 1, kernel_, 1),
            CUDA_ERROR_INVALID_DEVICE);

  const std::vector<KernelAttributeSet> sets = KernelAttributeSets();
  ASSERT_EQ(sets.size(), 1u);
  EXPECT_EQ(sets[0].entry, "add_kernel");
  EXPECT_EQ(sets[0].attribute, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES);
  EXPECT_EQ(sets[0].value, 100000);
  EXPECT_EQ(sets[0].device, 0);
}

TEST_F(FakeDriverTest, LaunchWithExtraRecordsTheBuffer) {
  LoadAdd();
  CUstream stream;
  ASSERT_EQ(cu.StreamCreate(&stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  auto params = AddParams(0x1000, 0x2000, 0x3000, 4096);
  CUlaunchAttribute attrs[1] = {};
  attrs[0].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
  attrs[0].value.programmaticStreamSerializationAllowed = 1;
  CUlaunchConfig config = Config(stream);
  config.attrs = attrs;
  config.numAttrs = 1;
  ASSERT_EQ(LaunchExtra(config, params), CUDA_SUCCESS);

  ASSERT_EQ(LaunchCount(), 1);
  const LaunchRecord launch = GetLaunch(0);
  EXPECT_THAT(launch.entry.data(), StrEq("add_kernel"));
  EXPECT_THAT(launch.grid, ElementsAre(4, 1, 1));
  EXPECT_THAT(launch.block, ElementsAre(128, 1, 1));
  EXPECT_EQ(launch.shared_bytes, 0u);
  EXPECT_EQ(launch.stream, stream);
  CUcontext current;
  ASSERT_EQ(cu.CtxGetCurrent(&current), CUDA_SUCCESS);
  EXPECT_EQ(launch.context, current);
  EXPECT_EQ(launch.function, function_);
  EXPECT_TRUE(launch.params_via_extra);
  EXPECT_FALSE(launch.captured);
  EXPECT_FALSE(launch.graph_replay);
  ASSERT_EQ(launch.num_attrs, 1u);
  EXPECT_EQ(launch.attrs[0].id, CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION);
  EXPECT_EQ(launch.attrs[0].value.programmaticStreamSerializationAllowed, 1);
  ASSERT_EQ(launch.param_size, kAddParamBytes);
  EXPECT_EQ(std::memcmp(launch.params.data(), params.data(), kAddParamBytes), 0);
  ASSERT_EQ(cu.StreamDestroy(stream), CUDA_SUCCESS);
}

TEST_F(FakeDriverTest, LaunchWithKernelParamsPacksTheLayout) {
  LoadAdd();
  CUdeviceptr x = 0x1000, y = 0x2000, out = 0x3000, scratch = 0, profile = 0;
  int32_t n = 77;
  void* args[] = {&x, &y, &out, &n, &scratch, &profile};
  const CUlaunchConfig config = Config(nullptr);
  // A CUkernel cast to CUfunction launches too.
  ASSERT_EQ(cu.LaunchKernelEx(&config, reinterpret_cast<CUfunction>(kernel_), args, nullptr),
            CUDA_SUCCESS);
  const LaunchRecord launch = GetLaunch(0);
  EXPECT_FALSE(launch.params_via_extra);
  ASSERT_EQ(launch.param_size, kAddParamBytes);
  // Including the zero padding between n (ends at 28) and the scratch pointer (at 32).
  const auto expected = AddParams(x, y, out, n);
  EXPECT_EQ(std::memcmp(launch.params.data(), expected.data(), kAddParamBytes), 0);

  void* missing[] = {&x, &y, nullptr, &n, &scratch, &profile};
  EXPECT_EQ(cu.LaunchKernelEx(&config, function_, missing, nullptr), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu.LaunchKernelEx(&config, function_, nullptr, nullptr), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(LaunchCount(), 1);
}

TEST_F(FakeDriverTest, LaunchValidation) {
  LoadAdd();
  auto params = AddParams(0, 0, 0, 0);
  EXPECT_EQ(LaunchExtra(Config(nullptr, 1, 1025), params), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(LaunchExtra(Config(nullptr, 0), params), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(LaunchExtra(Config(nullptr), params, kAddParamBytes - 8), CUDA_ERROR_INVALID_VALUE);
  SetKernelLimits({.max_threads_per_block = 64});
  EXPECT_EQ(LaunchExtra(Config(nullptr, 1, 128), params), CUDA_ERROR_INVALID_VALUE);
  SetKernelLimits({});

  // Both argument forms at once.
  size_t size = kAddParamBytes;
  void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, params.data(), CU_LAUNCH_PARAM_BUFFER_SIZE,
                   &size, CU_LAUNCH_PARAM_END};
  void* args[6] = {};
  const CUlaunchConfig config = Config(nullptr);
  EXPECT_EQ(cu.LaunchKernelEx(&config, function_, args, extra), CUDA_ERROR_INVALID_VALUE);

  EXPECT_EQ(cu.LaunchKernelEx(&config, reinterpret_cast<CUfunction>(&size), nullptr, extra),
            CUDA_ERROR_INVALID_HANDLE);
  CUstream stream;
  ASSERT_EQ(cu.StreamCreate(&stream, 0), CUDA_SUCCESS);
  ASSERT_EQ(cu.StreamDestroy(stream), CUDA_SUCCESS);
  EXPECT_EQ(LaunchExtra(Config(stream), params), CUDA_ERROR_INVALID_HANDLE);

  ASSERT_EQ(cu.CtxSetCurrent(nullptr), CUDA_SUCCESS);
  EXPECT_EQ(LaunchExtra(Config(nullptr), params), CUDA_ERROR_INVALID_CONTEXT);
  EXPECT_EQ(LaunchCount(), 0);
}

TEST_F(FakeDriverTest, DynamicSharedMemoryNeedsTheAttributeOnThatDevice) {
  SetDevices({DeviceConfig{}, DeviceConfig{}});
  LoadAdd();
  auto params = AddParams(0, 0, 0, 0);
  CUlaunchConfig config = Config(nullptr);
  config.sharedMemBytes = 48 * 1024;
  EXPECT_EQ(LaunchExtra(config, params), CUDA_SUCCESS);
  config.sharedMemBytes = 64 * 1024;
  EXPECT_EQ(LaunchExtra(config, params), CUDA_ERROR_INVALID_VALUE);
  ASSERT_EQ(
      cu.KernelSetAttribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 100000, kernel_, 0),
      CUDA_SUCCESS);
  EXPECT_EQ(LaunchExtra(config, params), CUDA_SUCCESS);
  EXPECT_EQ(GetLaunch(1).shared_bytes, 64u * 1024);
  config.sharedMemBytes = 100001;
  EXPECT_EQ(LaunchExtra(config, params), CUDA_ERROR_INVALID_VALUE);

  // Device 1 was not opted in. (Its launches go through the context-free CUkernel: the
  // CUfunction from cuKernelGetFunction belongs to device 0's context.)
  CUcontext device1;
  ASSERT_EQ(cu.DevicePrimaryCtxRetain(&device1, 1), CUDA_SUCCESS);
  ASSERT_EQ(cu.CtxPushCurrent(device1), CUDA_SUCCESS);
  config.sharedMemBytes = 64 * 1024;
  EXPECT_EQ(LaunchExtra(config, params), CUDA_ERROR_INVALID_CONTEXT);
  function_ = reinterpret_cast<CUfunction>(kernel_);
  EXPECT_EQ(LaunchExtra(config, params), CUDA_ERROR_INVALID_VALUE);
  ASSERT_EQ(cu.CtxPopCurrent(nullptr), CUDA_SUCCESS);
  ASSERT_EQ(cu.DevicePrimaryCtxRelease(1), CUDA_SUCCESS);
}

TEST_F(FakeDriverTest, ClusterDimensionsMustDivideTheGrid) {
  LoadAdd();
  auto params = AddParams(0, 0, 0, 0);
  CUlaunchAttribute attrs[1] = {};
  attrs[0].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
  attrs[0].value.clusterDim.x = 2;
  attrs[0].value.clusterDim.y = 1;
  attrs[0].value.clusterDim.z = 1;
  CUlaunchConfig config = Config(nullptr, 3);
  config.attrs = attrs;
  config.numAttrs = 1;
  EXPECT_EQ(LaunchExtra(config, params), CUDA_ERROR_INVALID_CLUSTER_SIZE);
  config.gridDimX = 4;
  EXPECT_EQ(LaunchExtra(config, params), CUDA_SUCCESS);
  EXPECT_EQ(GetLaunch(0).attrs[0].value.clusterDim.x, 2u);

  attrs[0].value.clusterDim.x = 16;
  config.gridDimX = 32;
  EXPECT_EQ(LaunchExtra(config, params), CUDA_ERROR_INVALID_CLUSTER_SIZE);
  ASSERT_EQ(
      cu.KernelSetAttribute(CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1, kernel_, 0),
      CUDA_SUCCESS);
  EXPECT_EQ(LaunchExtra(config, params), CUDA_SUCCESS);
}

TEST_F(FakeDriverTest, ModuleApiMirrorsTheLibraryApi) {
  Init();
  CUmodule module;
  ASSERT_EQ(cu.ModuleLoadData(&module, image_.data()), CUDA_SUCCESS);
  EXPECT_EQ(LoadedLibraries(), 1);
  CUfunction function;
  EXPECT_EQ(cu.ModuleGetFunction(&function, module, "nope"), CUDA_ERROR_NOT_FOUND);
  ASSERT_EQ(cu.ModuleGetFunction(&function, module, "add_kernel"), CUDA_SUCCESS);
  auto params = AddParams(1, 2, 3, 4);
  size_t size = kAddParamBytes;
  void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, params.data(), CU_LAUNCH_PARAM_BUFFER_SIZE,
                   &size, CU_LAUNCH_PARAM_END};
  const CUlaunchConfig config = Config(nullptr);
  ASSERT_EQ(cu.LaunchKernelEx(&config, function, nullptr, extra), CUDA_SUCCESS);
  EXPECT_THAT(GetLaunch(0).entry.data(), StrEq("add_kernel"));
  // Module functions are not CUkernels.
  size_t offset;
  EXPECT_EQ(cu.KernelGetParamInfo(reinterpret_cast<CUkernel>(function), 0, &offset, nullptr),
            CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(cu.LibraryUnload(reinterpret_cast<CUlibrary>(module)), CUDA_ERROR_INVALID_HANDLE);
  ASSERT_EQ(cu.ModuleUnload(module), CUDA_SUCCESS);
  EXPECT_EQ(cu.LaunchKernelEx(&config, function, nullptr, extra), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(LoadedLibraries(), 0);

  ASSERT_EQ(cu.CtxSetCurrent(nullptr), CUDA_SUCCESS);
  EXPECT_EQ(cu.ModuleLoadData(&module, image_.data()), CUDA_ERROR_INVALID_CONTEXT);
}

TEST_F(FakeDriverTest, ModuleFunctionsBelongToTheirContext) {
  SetDevices({DeviceConfig{}, DeviceConfig{}});
  Init();
  CUmodule module;
  ASSERT_EQ(cu.ModuleLoadData(&module, image_.data()), CUDA_SUCCESS);
  CUfunction function;
  ASSERT_EQ(cu.ModuleGetFunction(&function, module, "add_kernel"), CUDA_SUCCESS);
  CUcontext device1;
  ASSERT_EQ(cu.DevicePrimaryCtxRetain(&device1, 1), CUDA_SUCCESS);
  ASSERT_EQ(cu.CtxPushCurrent(device1), CUDA_SUCCESS);
  CUdeviceptr x = 0, y = 0, out = 0, scratch = 0, profile = 0;
  int32_t n = 0;
  void* args[] = {&x, &y, &out, &n, &scratch, &profile};
  const CUlaunchConfig config = Config(nullptr);
  EXPECT_EQ(cu.LaunchKernelEx(&config, function, args, nullptr), CUDA_ERROR_INVALID_CONTEXT);
  ASSERT_EQ(cu.CtxPopCurrent(nullptr), CUDA_SUCCESS);
  EXPECT_EQ(cu.LaunchKernelEx(&config, function, args, nullptr), CUDA_SUCCESS);
  ASSERT_EQ(cu.ModuleUnload(module), CUDA_SUCCESS);
  ASSERT_EQ(cu.DevicePrimaryCtxRelease(1), CUDA_SUCCESS);
}

TEST_F(FakeDriverTest, FailNextAndCallCounts) {
  Init();
  FailNext("MemAlloc", CUDA_ERROR_OUT_OF_MEMORY, /*skip=*/1);
  CUdeviceptr a, b, c;
  EXPECT_EQ(cu.MemAlloc(&a, 64), CUDA_SUCCESS);
  EXPECT_EQ(cu.MemAlloc(&b, 64), CUDA_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(cu.MemAlloc(&c, 64), CUDA_SUCCESS);
  EXPECT_EQ(CallCount("MemAlloc"), 3);
  EXPECT_EQ(LiveAllocations(), 2);

  FailNext("Init", CUDA_ERROR_NO_DEVICE);
  EXPECT_EQ(cu.Init(0), CUDA_ERROR_NO_DEVICE);
  EXPECT_EQ(cu.Init(0), CUDA_SUCCESS);
  EXPECT_EQ(CallCount("Init"), 3);

  LoadAdd();
  FailNext("LaunchKernelEx", CUDA_ERROR_LAUNCH_FAILED);
  auto params = AddParams(0, 0, 0, 0);
  EXPECT_EQ(LaunchExtra(Config(nullptr), params), CUDA_ERROR_LAUNCH_FAILED);
  EXPECT_EQ(LaunchExtra(Config(nullptr), params), CUDA_SUCCESS);
  EXPECT_EQ(LaunchCount(), 1);
  EXPECT_EQ(CallCount("LaunchKernelEx"), 2);
  ASSERT_EQ(cu.MemFree(a), CUDA_SUCCESS);
  ASSERT_EQ(cu.MemFree(c), CUDA_SUCCESS);

  // Failures not yet due are dropped (and counted) by CancelFailures.
  FailNext("MemAlloc", CUDA_ERROR_OUT_OF_MEMORY);
  FailNext("MemFree", CUDA_ERROR_INVALID_VALUE, /*skip=*/3);
  EXPECT_EQ(cu.MemAlloc(&a, 64), CUDA_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(CancelFailures(), 1);
  EXPECT_EQ(CancelFailures(), 0);
  CUdeviceptr four[4];
  for (CUdeviceptr& p : four) ASSERT_EQ(cu.MemAlloc(&p, 64), CUDA_SUCCESS);
  for (CUdeviceptr p : four) EXPECT_EQ(cu.MemFree(p), CUDA_SUCCESS) << "a cancelled failure fired";
}

TEST_F(FakeDriverTest, MemoryIsHostBackedAndTracked) {
  Init();
  CUdeviceptr pointer = 0;
  ASSERT_EQ(cu.MemAlloc(&pointer, 1000), CUDA_SUCCESS);
  EXPECT_EQ(pointer % 256, 0u);
  EXPECT_EQ(LiveAllocations(), 1);
  EXPECT_EQ(LiveBytes(), 1000);

  std::vector<uint8_t> in(1000), out(1000);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<uint8_t>(i);
  ASSERT_EQ(cu.MemcpyHtoD(pointer, in.data(), in.size()), CUDA_SUCCESS);
  ASSERT_EQ(cu.MemsetD8(pointer + 10, 0xee, 5), CUDA_SUCCESS);
  ASSERT_EQ(cu.MemcpyDtoH(out.data(), pointer, out.size()), CUDA_SUCCESS);
  std::fill(in.begin() + 10, in.begin() + 15, 0xee);
  EXPECT_EQ(in, out);

  EXPECT_EQ(cu.MemcpyHtoD(pointer + 1, in.data(), 1000), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu.MemsetD8(pointer + 1000, 0, 1), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu.MemAlloc(&pointer, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu.MemFree(pointer + 8), CUDA_ERROR_INVALID_VALUE);
  ASSERT_EQ(cu.MemFree(pointer), CUDA_SUCCESS);
  EXPECT_EQ(cu.MemFree(pointer), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(LiveAllocations(), 0);
  EXPECT_EQ(LiveBytes(), 0);

  // Allocation ids: per allocation, for any address inside it, never given again.
  CUdeviceptr a, b;
  ASSERT_EQ(cu.MemAlloc(&a, 512), CUDA_SUCCESS);
  ASSERT_EQ(cu.MemAlloc(&b, 512), CUDA_SUCCESS);
  const uint64_t id = AllocationId(a);
  EXPECT_NE(id, 0u);
  EXPECT_EQ(AllocationId(a + 511), id);
  EXPECT_NE(AllocationId(b), id);
  EXPECT_EQ(AllocationId(a + 512), a + 512 == b ? AllocationId(b) : 0u);
  ASSERT_EQ(cu.MemFree(a), CUDA_SUCCESS);
  EXPECT_EQ(AllocationId(a), 0u);
  std::set<uint64_t> seen = {id, AllocationId(b)};
  for (int i = 0; i < 8; ++i) {  // the allocator may well hand `a`'s address out again
    ASSERT_EQ(cu.MemAlloc(&a, 512), CUDA_SUCCESS);
    EXPECT_TRUE(seen.insert(AllocationId(a)).second);
    ASSERT_EQ(cu.MemFree(a), CUDA_SUCCESS);
  }
  ASSERT_EQ(cu.MemFree(b), CUDA_SUCCESS);
}

TEST_F(FakeDriverTest, PinnedMemoryAndAsyncCopies) {
  Init();
  void* pinned = nullptr;
  ASSERT_EQ(cu.MemAllocHost(&pinned, 100), CUDA_SUCCESS);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(pinned) % 256, 0u);
  EXPECT_EQ(LiveHostAllocations(), 1);
  EXPECT_EQ(cu.MemAllocHost(&pinned, 0), CUDA_ERROR_INVALID_VALUE);
  CUdeviceptr device = 0;
  ASSERT_EQ(cu.MemAlloc(&device, 100), CUDA_SUCCESS);
  CUstream stream, capturing;
  ASSERT_EQ(cu.StreamCreate(&stream, 0), CUDA_SUCCESS);
  ASSERT_EQ(cu.StreamCreate(&capturing, 0), CUDA_SUCCESS);

  auto* bytes = static_cast<uint8_t*>(pinned);
  for (int i = 0; i < 100; ++i) bytes[i] = static_cast<uint8_t>(i);
  ASSERT_EQ(cu.MemcpyHtoDAsync(device, pinned, 100, stream), CUDA_SUCCESS);
  std::vector<uint8_t> out(100);
  ASSERT_EQ(cu.MemcpyDtoHAsync(out.data(), device, 100, nullptr), CUDA_SUCCESS);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(out[i], i);

  // Outside an allocation, a dead stream, a capturing stream: refused, nothing copied.
  EXPECT_EQ(cu.MemcpyHtoDAsync(device + 1, pinned, 100, stream), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu.MemcpyDtoHAsync(out.data(), device + 100, 1, stream), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu.MemcpyDtoHAsync(nullptr, device, 1, stream), CUDA_ERROR_INVALID_VALUE);
  ASSERT_EQ(cu.StreamBeginCapture(capturing, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  EXPECT_EQ(cu.MemcpyDtoHAsync(out.data(), device, 1, capturing), CUDA_ERROR_NOT_SUPPORTED);
  CUgraph graph = nullptr;
  ASSERT_EQ(cu.StreamEndCapture(capturing, &graph), CUDA_SUCCESS);
  ASSERT_EQ(cu.GraphDestroy(graph), CUDA_SUCCESS);
  ASSERT_EQ(cu.StreamDestroy(stream), CUDA_SUCCESS);
  EXPECT_EQ(cu.MemcpyHtoDAsync(device, pinned, 1, stream), CUDA_ERROR_INVALID_HANDLE);

  EXPECT_EQ(cu.MemFreeHost(bytes + 8), CUDA_ERROR_INVALID_VALUE);
  ASSERT_EQ(cu.MemFreeHost(pinned), CUDA_SUCCESS);
  EXPECT_EQ(cu.MemFreeHost(pinned), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(LiveHostAllocations(), 0);
  ASSERT_EQ(cu.MemFree(device), CUDA_SUCCESS);
  ASSERT_EQ(cu.StreamDestroy(capturing), CUDA_SUCCESS);
}

TEST_F(FakeDriverTest, CapturedLaunchesReplayWithTheGraph) {
  LoadAdd();
  CUstream stream, other;
  ASSERT_EQ(cu.StreamCreate(&stream, 0), CUDA_SUCCESS);
  ASSERT_EQ(cu.StreamCreate(&other, 0), CUDA_SUCCESS);
  EXPECT_EQ(cu.StreamBeginCapture(nullptr, CU_STREAM_CAPTURE_MODE_GLOBAL),
            CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  ASSERT_EQ(cu.StreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  EXPECT_EQ(cu.StreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_ERROR_ILLEGAL_STATE);
  CUstreamCaptureStatus status;
  ASSERT_EQ(cu.StreamIsCapturing(stream, &status), CUDA_SUCCESS);
  EXPECT_EQ(status, CU_STREAM_CAPTURE_STATUS_ACTIVE);

  auto params = AddParams(1, 2, 3, 100);
  ASSERT_EQ(LaunchExtra(Config(stream, 7), params), CUDA_SUCCESS);
  EXPECT_TRUE(GetLaunch(0).captured);
  CUgraph graph;
  ASSERT_EQ(cu.StreamEndCapture(stream, &graph), CUDA_SUCCESS);
  ASSERT_EQ(cu.StreamIsCapturing(stream, &status), CUDA_SUCCESS);
  EXPECT_EQ(status, CU_STREAM_CAPTURE_STATUS_NONE);

  CUgraphExec exec;
  ASSERT_EQ(cu.GraphInstantiateWithFlags(&exec, graph, 0), CUDA_SUCCESS);
  ASSERT_EQ(cu.GraphLaunch(exec, other), CUDA_SUCCESS);
  ASSERT_EQ(cu.GraphLaunch(exec, other), CUDA_SUCCESS);
  ASSERT_EQ(LaunchCount(), 3);
  for (int i = 1; i < 3; ++i) {
    const LaunchRecord replay = GetLaunch(i);
    EXPECT_TRUE(replay.graph_replay);
    EXPECT_FALSE(replay.captured);
    EXPECT_EQ(replay.stream, other);
    EXPECT_EQ(replay.grid[0], 7u);
    EXPECT_EQ(std::memcmp(replay.params.data(), params.data(), kAddParamBytes), 0);
  }
  EXPECT_EQ(LiveGraphs(), 2);
  ASSERT_EQ(cu.GraphExecDestroy(exec), CUDA_SUCCESS);
  ASSERT_EQ(cu.GraphDestroy(graph), CUDA_SUCCESS);
  EXPECT_EQ(cu.GraphDestroy(graph), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(LiveGraphs(), 0);
  ASSERT_EQ(cu.StreamDestroy(stream), CUDA_SUCCESS);
  ASSERT_EQ(cu.StreamDestroy(other), CUDA_SUCCESS);
  EXPECT_EQ(LiveStreams(), 0);
}

TEST_F(FakeDriverTest, StreamIdsAndCaptureInfo) {
  Init();
  CUstream a, b;
  ASSERT_EQ(cu.StreamCreate(&a, 0), CUDA_SUCCESS);
  ASSERT_EQ(cu.StreamCreate(&b, 0), CUDA_SUCCESS);
  unsigned long long id_a = 0, id_b = 0, legacy = 0, null_id = 0;  // NOLINT(runtime/int)
  ASSERT_EQ(cu.StreamGetId(a, &id_a), CUDA_SUCCESS);
  ASSERT_EQ(cu.StreamGetId(b, &id_b), CUDA_SUCCESS);
  ASSERT_EQ(cu.StreamGetId(CU_STREAM_LEGACY, &legacy), CUDA_SUCCESS);
  ASSERT_EQ(cu.StreamGetId(nullptr, &null_id), CUDA_SUCCESS);
  EXPECT_NE(id_a, id_b);
  EXPECT_EQ(legacy, null_id) << "NULL is the legacy stream";
  unsigned long long mine = 0, theirs = 0;  // NOLINT(runtime/int)
  ASSERT_EQ(cu.StreamGetId(CU_STREAM_PER_THREAD, &mine), CUDA_SUCCESS);
  CUcontext context;
  ASSERT_EQ(cu.CtxGetCurrent(&context), CUDA_SUCCESS);
  std::thread([&] {
    ASSERT_EQ(cu.CtxSetCurrent(context), CUDA_SUCCESS);
    ASSERT_EQ(cu.StreamGetId(CU_STREAM_PER_THREAD, &theirs), CUDA_SUCCESS);
  }).join();
  EXPECT_NE(mine, theirs) << "each thread has its own per-thread stream";

  // A destroyed stream's handle may come back (SetHandleReuse), with a new id.
  SetHandleReuse(true);
  ASSERT_EQ(cu.StreamDestroy(b), CUDA_SUCCESS);
  CUstream c;
  ASSERT_EQ(cu.StreamCreate(&c, 0), CUDA_SUCCESS);
  EXPECT_EQ(c, b);
  unsigned long long id_c = 0;  // NOLINT(runtime/int)
  ASSERT_EQ(cu.StreamGetId(c, &id_c), CUDA_SUCCESS);
  EXPECT_NE(id_c, id_b);

  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_ACTIVE;
  cuuint64_t capture = 0;
  CUgraph graph = nullptr;
  ASSERT_EQ(cu.StreamGetCaptureInfo(a, &status, &capture, &graph, nullptr, nullptr, nullptr),
            CUDA_SUCCESS);
  EXPECT_EQ(status, CU_STREAM_CAPTURE_STATUS_NONE);
  ASSERT_EQ(cu.StreamBeginCapture(a, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), CUDA_SUCCESS);
  ASSERT_EQ(cu.StreamGetCaptureInfo(a, &status, &capture, &graph, nullptr, nullptr, nullptr),
            CUDA_SUCCESS);
  EXPECT_EQ(status, CU_STREAM_CAPTURE_STATUS_ACTIVE);
  EXPECT_NE(capture, 0u);
  CUgraph ended = nullptr;
  ASSERT_EQ(cu.StreamEndCapture(a, &ended), CUDA_SUCCESS);
  EXPECT_EQ(ended, graph) << "the graph being captured is the one EndCapture returns";
  ASSERT_EQ(cu.StreamBeginCapture(a, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), CUDA_SUCCESS);
  cuuint64_t second = 0;
  ASSERT_EQ(cu.StreamGetCaptureInfo(a, &status, &second, nullptr, nullptr, nullptr, nullptr),
            CUDA_SUCCESS);
  EXPECT_NE(second, capture);
  CUgraph other = nullptr;
  ASSERT_EQ(cu.StreamEndCapture(a, &other), CUDA_SUCCESS);
  for (CUgraph g : {ended, other}) ASSERT_EQ(cu.GraphDestroy(g), CUDA_SUCCESS);
}

std::atomic<int> g_destroyed{0};
std::atomic<bool> g_destroyed_on_caller{false};
thread_local bool t_is_caller = false;
void CountDestroy(void* ptr) {
  g_destroyed.fetch_add(*static_cast<int*>(ptr));
  if (t_is_caller) g_destroyed_on_caller = true;
}

TEST_F(FakeDriverTest, UserObjectsLiveWhileAGraphOrExecutableHoldsThem) {
  Init();
  t_is_caller = true;
  g_destroyed = 0;
  g_destroyed_on_caller = false;
  int one = 1;
  CUuserObject object;
  EXPECT_EQ(cu.UserObjectCreate(&object, &one, CountDestroy, 1, 0), CUDA_ERROR_INVALID_VALUE);
  ASSERT_EQ(cu.UserObjectCreate(&object, &one, CountDestroy, 1, CU_USER_OBJECT_NO_DESTRUCTOR_SYNC),
            CUDA_SUCCESS);
  CUstream stream;
  ASSERT_EQ(cu.StreamCreate(&stream, 0), CUDA_SUCCESS);
  ASSERT_EQ(cu.StreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  CUstreamCaptureStatus status;
  CUgraph capturing = nullptr;
  ASSERT_EQ(cu.StreamGetCaptureInfo(stream, &status, nullptr, &capturing, nullptr, nullptr,
                                    nullptr),
            CUDA_SUCCESS);
  // The caller's reference moves to the graph being captured.
  ASSERT_EQ(cu.GraphRetainUserObject(capturing, object, 1, CU_GRAPH_USER_OBJECT_MOVE),
            CUDA_SUCCESS);
  CUgraph graph;
  ASSERT_EQ(cu.StreamEndCapture(stream, &graph), CUDA_SUCCESS);
  CUgraphExec exec;
  ASSERT_EQ(cu.GraphInstantiateWithFlags(&exec, graph, 0), CUDA_SUCCESS);
  ASSERT_EQ(cu.GraphDestroy(graph), CUDA_SUCCESS);
  EXPECT_EQ(g_destroyed.load(), 0) << "the executable still holds it";
  EXPECT_EQ(LiveUserObjects(), 1);
  ASSERT_EQ(cu.GraphExecDestroy(exec), CUDA_SUCCESS);
  EXPECT_EQ(g_destroyed.load(), 1) << "run before the last release returns";
  EXPECT_FALSE(g_destroyed_on_caller.load()) << "and on another thread";
  EXPECT_EQ(LiveUserObjects(), 0);

  // An invalidated capture drops what its graph held.
  ASSERT_EQ(cu.UserObjectCreate(&object, &one, CountDestroy, 2, CU_USER_OBJECT_NO_DESTRUCTOR_SYNC),
            CUDA_SUCCESS);
  ASSERT_EQ(cu.StreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  ASSERT_EQ(cu.StreamGetCaptureInfo(stream, &status, nullptr, &capturing, nullptr, nullptr,
                                    nullptr),
            CUDA_SUCCESS);
  ASSERT_EQ(cu.GraphRetainUserObject(capturing, object, 1, CU_GRAPH_USER_OBJECT_MOVE),
            CUDA_SUCCESS);
  CUdeviceptr pointer;
  EXPECT_EQ(cu.MemAlloc(&pointer, 16), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  EXPECT_EQ(cu.StreamEndCapture(stream, &graph), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  EXPECT_EQ(g_destroyed.load(), 1) << "one reference left";
  ASSERT_EQ(cu.UserObjectRelease(object, 1), CUDA_SUCCESS);
  EXPECT_EQ(g_destroyed.load(), 2);
  EXPECT_EQ(cu.UserObjectRelease(object, 1), CUDA_ERROR_INVALID_VALUE);
  t_is_caller = false;
}

// An emulated add_kernel: out[i] = x[i] + y[i] for i < n, one block of 1024 per program.
void EmulateAdd(const EmulatedLaunch& launch) {
  const int32_t n = launch.Param<int32_t>(24);
  const size_t count = std::min<size_t>(n, size_t{launch.grid[0]} * 1024);
  const float* x = DeviceArray<float>(launch.Param<CUdeviceptr>(0), count, "x");
  const float* y = DeviceArray<float>(launch.Param<CUdeviceptr>(8), count, "y");
  float* out = DeviceArray<float>(launch.Param<CUdeviceptr>(16), count, "out");
  if (x == nullptr || y == nullptr || out == nullptr) return;
  for (size_t i = 0; i < count; ++i) out[i] = x[i] + y[i];
}

TEST_F(FakeDriverTest, EmulatorsRunWhenALaunchExecutesNotWhenItIsCaptured) {
  LoadAdd();
  SetKernelEmulator("add_kernel", EmulateAdd);
  CUdeviceptr x, y, out;
  for (CUdeviceptr* p : {&x, &y, &out}) ASSERT_EQ(cu.MemAlloc(p, 16 * 4), CUDA_SUCCESS);
  std::vector<float> hx(16), hy(16), got(16, -1);
  for (int i = 0; i < 16; ++i) hx[i] = i, hy[i] = 100 * i;
  ASSERT_EQ(cu.MemcpyHtoD(x, hx.data(), 64), CUDA_SUCCESS);
  ASSERT_EQ(cu.MemcpyHtoD(y, hy.data(), 64), CUDA_SUCCESS);
  ASSERT_EQ(cu.MemsetD8(out, 0, 64), CUDA_SUCCESS);
  auto params = AddParams(x, y, out, 10);
  ASSERT_EQ(LaunchExtra(Config(nullptr, 1), params), CUDA_SUCCESS);
  ASSERT_EQ(cu.MemcpyDtoH(got.data(), out, 64), CUDA_SUCCESS);
  EXPECT_EQ(got[9], 909.0f);
  EXPECT_EQ(got[10], 0.0f) << "i >= n untouched";

  CUstream stream;
  ASSERT_EQ(cu.StreamCreate(&stream, 0), CUDA_SUCCESS);
  ASSERT_EQ(cu.MemsetD8(out, 0, 64), CUDA_SUCCESS);
  ASSERT_EQ(cu.StreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  params = AddParams(x, y, out, 16);
  ASSERT_EQ(LaunchExtra(Config(stream, 1), params), CUDA_SUCCESS);
  CUgraph graph;
  ASSERT_EQ(cu.StreamEndCapture(stream, &graph), CUDA_SUCCESS);
  ASSERT_EQ(cu.MemcpyDtoH(got.data(), out, 64), CUDA_SUCCESS);
  EXPECT_EQ(got[15], 0.0f) << "captured, not run";
  CUgraphExec exec;
  ASSERT_EQ(cu.GraphInstantiateWithFlags(&exec, graph, 0), CUDA_SUCCESS);
  ASSERT_EQ(cu.GraphLaunch(exec, nullptr), CUDA_SUCCESS);
  ASSERT_EQ(cu.MemcpyDtoH(got.data(), out, 64), CUDA_SUCCESS);
  EXPECT_EQ(got[15], 1515.0f) << "run by the replay";
  EXPECT_TRUE(Faults().empty());

  // n past the allocations: a fault, and every later synchronization fails.
  params = AddParams(x, y, out, 17);
  ASSERT_EQ(LaunchExtra(Config(nullptr, 1), params), CUDA_SUCCESS);
  ASSERT_EQ(Faults().size(), 3u) << "x, y and out";
  EXPECT_THAT(Faults()[0], ::testing::HasSubstr("x: 68 bytes at 0x"));
  EXPECT_EQ(cu.StreamSynchronize(stream), CUDA_ERROR_ILLEGAL_ADDRESS);
  EXPECT_EQ(cu.CtxSynchronize(), CUDA_ERROR_ILLEGAL_ADDRESS);
  EXPECT_EQ(cu.MemcpyDtoH(got.data(), out, 64), CUDA_ERROR_ILLEGAL_ADDRESS);
  ASSERT_EQ(cu.GraphExecDestroy(exec), CUDA_SUCCESS);
  ASSERT_EQ(cu.GraphDestroy(graph), CUDA_SUCCESS);
}

// A latch for host functions: the stream's later work stays queued until it opens.
struct Gate {
  std::atomic<bool> open{false};
  std::atomic<bool> ran_on_caller{false};
  std::thread::id caller = std::this_thread::get_id();
  static void Wait(void* gate) {
    auto* g = static_cast<Gate*>(gate);
    if (std::this_thread::get_id() == g->caller) g->ran_on_caller = true;
    g->open.wait(false);
  }
  void Open() {
    open = true;
    open.notify_all();
  }
};

// Work queued behind a host function waits for it, on its stream only; synchronizing
// calls wait for what they must, and a kernel's emulation runs when its turn comes.
TEST_F(FakeDriverTest, HostFunctionsHoldTheirStreamsLaterWork) {
  LoadAdd();
  SetKernelEmulator("add_kernel", EmulateAdd);
  CUdeviceptr x, y, out, other;
  for (CUdeviceptr* p : {&x, &y, &out, &other}) ASSERT_EQ(cu.MemAlloc(p, 16 * 4), CUDA_SUCCESS);
  std::vector<float> ones(16, 1.0f), got(16, -1);
  ASSERT_EQ(cu.MemcpyHtoD(x, ones.data(), 64), CUDA_SUCCESS);
  ASSERT_EQ(cu.MemcpyHtoD(y, ones.data(), 64), CUDA_SUCCESS);
  CUstream held, free_stream;
  ASSERT_EQ(cu.StreamCreate(&held, 0), CUDA_SUCCESS);
  ASSERT_EQ(cu.StreamCreate(&free_stream, 0), CUDA_SUCCESS);
  Gate gate;
  ASSERT_EQ(cu.LaunchHostFunc(held, &Gate::Wait, &gate), CUDA_SUCCESS);
  auto params = AddParams(x, y, out, 16);
  ASSERT_EQ(LaunchExtra(Config(held, 1), params), CUDA_SUCCESS);
  auto params2 = AddParams(x, y, other, 16);
  ASSERT_EQ(LaunchExtra(Config(free_stream, 1), params2), CUDA_SUCCESS);
  EXPECT_EQ(cu.StreamSynchronize(free_stream), CUDA_SUCCESS) << "another stream: no wait";
  EXPECT_EQ(LaunchCount(), 2) << "both recorded when issued";
  std::thread opener([&] { gate.Open(); });
  EXPECT_EQ(cu.StreamSynchronize(held), CUDA_SUCCESS) << "waits for the host function";
  opener.join();
  ASSERT_EQ(cu.MemcpyDtoH(got.data(), out, 64), CUDA_SUCCESS);
  EXPECT_EQ(got[15], 2.0f) << "the held kernel ran once its stream got to it";
  EXPECT_FALSE(gate.ran_on_caller.load()) << "on the driver's thread";
  EXPECT_TRUE(Faults().empty());
  EXPECT_EQ(cu.LaunchHostFunc(held, nullptr, nullptr), CUDA_ERROR_INVALID_VALUE);
}

// cuMemFree waits for the work queued before it; a wait that would never end on a GPU
// (the driver's thread blocked) is reported as a fault and fails the call.
TEST_F(FakeDriverTest, SynchronizingCallsWaitAndADeadlockIsAFault) {
  Init();
  CUdeviceptr pointer;
  ASSERT_EQ(cu.MemAlloc(&pointer, 64), CUDA_SUCCESS);
  Gate gate;
  ASSERT_EQ(cu.LaunchHostFunc(nullptr, &Gate::Wait, &gate), CUDA_SUCCESS);
  SetDeadlockTimeout(std::chrono::milliseconds(50));
  EXPECT_EQ(cu.CtxSynchronize(), CUDA_ERROR_LAUNCH_TIMEOUT);
  EXPECT_EQ(cu.MemFree(pointer), CUDA_ERROR_LAUNCH_TIMEOUT);
  EXPECT_EQ(LiveAllocations(), 1) << "not freed";
  ASSERT_EQ(Faults().size(), 2u);
  EXPECT_THAT(Faults()[1], ::testing::HasSubstr("cuMemFree waited 50 ms"));
  gate.Open();
  DrainDriverThread();
  Reset();
  Init();
  ASSERT_EQ(cu.MemAlloc(&pointer, 64), CUDA_SUCCESS);
  ASSERT_EQ(cu.LaunchHostFunc(nullptr, &Gate::Wait, &gate), CUDA_SUCCESS);  // open: runs
  EXPECT_EQ(cu.MemFree(pointer), CUDA_SUCCESS);
  EXPECT_TRUE(Faults().empty());
}

// With async destructors, the call that drops a user object's last reference returns at
// once (as libcuda's); the destructor runs on the driver's thread, in turn.
TEST_F(FakeDriverTest, AsyncDestructorsRunOnTheDriversThreadInTurn) {
  Init();
  SetAsyncDestructors(true);
  g_destroyed = 0;
  int one = 1;
  CUuserObject object;
  ASSERT_EQ(cu.UserObjectCreate(&object, &one, CountDestroy, 1, CU_USER_OBJECT_NO_DESTRUCTOR_SYNC),
            CUDA_SUCCESS);
  Gate gate;
  ASSERT_EQ(cu.LaunchHostFunc(nullptr, &Gate::Wait, &gate), CUDA_SUCCESS);
  ASSERT_EQ(cu.UserObjectRelease(object, 1), CUDA_SUCCESS) << "returns with the thread held";
  EXPECT_EQ(g_destroyed.load(), 0) << "queued behind the host function";
  EXPECT_EQ(LiveUserObjects(), 0);
  gate.Open();
  DrainDriverThread();
  EXPECT_EQ(g_destroyed.load(), 1);
}

// OnNextCall runs a hook inside the next call of one function, once.
TEST_F(FakeDriverTest, OnNextCallRunsAHookInsideTheNextCall) {
  Init();
  int runs = 0;
  CUdeviceptr inner = 0, pointer = 0;
  OnNextCall("MemAlloc", [&] {
    ++runs;
    EXPECT_EQ(cu.MemAlloc(&inner, 16), CUDA_SUCCESS) << "the hook may call the driver";
  });
  ASSERT_EQ(cu.MemAlloc(&pointer, 64), CUDA_SUCCESS);
  ASSERT_EQ(cu.MemAlloc(&pointer, 64), CUDA_SUCCESS);
  EXPECT_EQ(runs, 1);
  EXPECT_NE(inner, 0u);
  EXPECT_EQ(LiveAllocations(), 3);
}

TEST_F(FakeDriverTest, UnsafeCallsDuringCaptureInvalidateIt) {
  Init();
  CUstream stream;
  ASSERT_EQ(cu.StreamCreate(&stream, 0), CUDA_SUCCESS);
  EXPECT_EQ(CaptureStatus(stream), CU_STREAM_CAPTURE_STATUS_NONE);
  ASSERT_EQ(cu.StreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  EXPECT_EQ(CaptureStatus(stream), CU_STREAM_CAPTURE_STATUS_ACTIVE);
  EXPECT_EQ(CaptureStatus(nullptr), CU_STREAM_CAPTURE_STATUS_NONE);
  CUdeviceptr pointer;
  EXPECT_EQ(cu.MemAlloc(&pointer, 64), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  CUstreamCaptureStatus status;
  const int64_t calls = CallCount("StreamIsCapturing");
  EXPECT_EQ(CaptureStatus(stream), CU_STREAM_CAPTURE_STATUS_INVALIDATED);
  EXPECT_EQ(CallCount("StreamIsCapturing"), calls) << "CaptureStatus is no driver call";
  ASSERT_EQ(cu.StreamIsCapturing(stream, &status), CUDA_SUCCESS);
  EXPECT_EQ(status, CU_STREAM_CAPTURE_STATUS_INVALIDATED);
  CUgraph graph = reinterpret_cast<CUgraph>(&pointer);
  EXPECT_EQ(cu.StreamEndCapture(stream, &graph), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  EXPECT_EQ(graph, nullptr);

  // A relaxed capture allows it.
  ASSERT_EQ(cu.StreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
  ASSERT_EQ(cu.MemAlloc(&pointer, 64), CUDA_SUCCESS);
  EXPECT_EQ(cu.StreamSynchronize(stream), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  EXPECT_EQ(cu.StreamEndCapture(stream, &graph), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  ASSERT_EQ(cu.MemFree(pointer), CUDA_SUCCESS);
  ASSERT_EQ(cu.StreamDestroy(stream), CUDA_SUCCESS);
  EXPECT_EQ(LiveGraphs(), 0);
}

// The thread's interaction mode decides (cuThreadExchangeStreamCaptureMode's rule): a
// GLOBAL thread may not make unsafe calls while another thread captures in global mode, a
// THREAD_LOCAL or RELAXED one may; a RELAXED thread may even while it captures itself.
TEST_F(FakeDriverTest, UnsafeCallsFollowTheThreadsCaptureInteractionMode) {
  Init();
  CUcontext context;
  ASSERT_EQ(cu.CtxGetCurrent(&context), CUDA_SUCCESS);
  CUstream mine;
  ASSERT_EQ(cu.StreamCreate(&mine, 0), CUDA_SUCCESS);
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
  ASSERT_EQ(cu.ThreadExchangeStreamCaptureMode(&mode), CUDA_SUCCESS);
  EXPECT_EQ(mode, CU_STREAM_CAPTURE_MODE_GLOBAL) << "a thread starts in GLOBAL mode";
  EXPECT_EQ(ThreadCaptureMode(), CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
  const std::underlying_type_t<CUstreamCaptureMode> no_mode = 7;  // not a mode
  std::memcpy(&mode, &no_mode, sizeof(no_mode));
  EXPECT_EQ(cu.ThreadExchangeStreamCaptureMode(&mode), CUDA_ERROR_INVALID_VALUE);
  mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
  ASSERT_EQ(cu.ThreadExchangeStreamCaptureMode(&mode), CUDA_SUCCESS);

  for (CUstreamCaptureMode other_mode :
       {CU_STREAM_CAPTURE_MODE_GLOBAL, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL}) {
    CUstream stream = nullptr;
    std::atomic<int> stage{0};
    CUresult ended = CUDA_ERROR_UNKNOWN;
    std::thread other([&] {
      cu.CtxSetCurrent(context);
      cu.StreamCreate(&stream, CU_STREAM_NON_BLOCKING);
      cu.StreamBeginCapture(stream, other_mode);
      stage = 1;
      while (stage != 2) std::this_thread::yield();
      CUgraph graph = nullptr;
      ended = cu.StreamEndCapture(stream, &graph);
      if (graph != nullptr) cu.GraphDestroy(graph);
      cu.StreamDestroy(stream);
    });
    while (stage != 1) std::this_thread::yield();
    const bool global = other_mode == CU_STREAM_CAPTURE_MODE_GLOBAL;
    CUdeviceptr pointer = 0;
    EXPECT_EQ(cu.MemAlloc(&pointer, 64),
              global ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : CUDA_SUCCESS);
    if (pointer != 0) ASSERT_EQ(cu.MemFree(pointer), CUDA_SUCCESS);
    CUlibrary library = nullptr;
    EXPECT_EQ(cu.LibraryLoadData(&library, image_.data(), nullptr, nullptr, 0, nullptr, nullptr, 0),
              global ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : CUDA_SUCCESS);
    if (library != nullptr) ASSERT_EQ(cu.LibraryUnload(library), CUDA_SUCCESS);
    for (CUstreamCaptureMode own : {CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
                                    CU_STREAM_CAPTURE_MODE_RELAXED}) {
      mode = own;
      ASSERT_EQ(cu.ThreadExchangeStreamCaptureMode(&mode), CUDA_SUCCESS);
      pointer = 0;
      EXPECT_EQ(cu.MemAlloc(&pointer, 64), CUDA_SUCCESS) << own;
      EXPECT_EQ(cu.MemFree(pointer), CUDA_SUCCESS) << own;
      ASSERT_EQ(cu.ThreadExchangeStreamCaptureMode(&mode), CUDA_SUCCESS);
    }
    stage = 2;
    other.join();
    EXPECT_EQ(ended, CUDA_SUCCESS) << "another thread's refused call does not invalidate";
  }

  // This thread's own capture: RELAXED mode allows what GLOBAL mode forbids.
  ASSERT_EQ(cu.StreamBeginCapture(mine, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  mode = CU_STREAM_CAPTURE_MODE_RELAXED;
  ASSERT_EQ(cu.ThreadExchangeStreamCaptureMode(&mode), CUDA_SUCCESS);
  CUdeviceptr pointer = 0;
  EXPECT_EQ(cu.MemAlloc(&pointer, 64), CUDA_SUCCESS);
  EXPECT_EQ(cu.MemFree(pointer), CUDA_SUCCESS);
  ASSERT_EQ(cu.ThreadExchangeStreamCaptureMode(&mode), CUDA_SUCCESS);
  EXPECT_EQ(cu.MemAlloc(&pointer, 64), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  CUgraph graph = nullptr;
  EXPECT_EQ(cu.StreamEndCapture(mine, &graph), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  ASSERT_EQ(cu.StreamDestroy(mine), CUDA_SUCCESS);
}

// Loading code, instantiating and destroying executables are unsafe calls too; a graph
// launch cannot be captured at all.
TEST_F(FakeDriverTest, LoadingInstantiatingAndGraphLaunchesInACapture) {
  LoadAdd();
  CUstream stream;
  ASSERT_EQ(cu.StreamCreate(&stream, 0), CUDA_SUCCESS);
  CUgraph graph = nullptr;
  CUgraphExec exec = nullptr;
  ASSERT_NO_FATAL_FAILURE(CaptureAdd(stream, 1, &graph, &exec));

  struct Case {
    const char* what;
    std::function<CUresult()> call;
  };
  CUgraphExec second = nullptr;
  CUlibrary library = nullptr;
  CUmodule module = nullptr;
  const Case cases[] = {
      {"cuGraphLaunch", [&] { return cu.GraphLaunch(exec, stream); }},
      {"cuGraphInstantiateWithFlags",
       [&] { return cu.GraphInstantiateWithFlags(&second, graph, 0); }},
      {"cuGraphExecDestroy", [&] { return cu.GraphExecDestroy(exec); }},
      {"cuLibraryLoadData",
       [&] {
         return cu.LibraryLoadData(&library, image_.data(), nullptr, nullptr, 0, nullptr,
                                   nullptr, 0);
       }},
      {"cuModuleLoadData", [&] { return cu.ModuleLoadData(&module, image_.data()); }},
  };
  for (const Case& c : cases) {
    ASSERT_EQ(cu.StreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
    EXPECT_EQ(c.call(), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED) << c.what;
    CUgraph captured = nullptr;
    EXPECT_EQ(cu.StreamEndCapture(stream, &captured), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED)
        << c.what;
  }
  EXPECT_EQ(GraphLaunches(), 0);
  EXPECT_EQ(second, nullptr);
  EXPECT_EQ(library, nullptr);
  EXPECT_EQ(module, nullptr);
  ASSERT_EQ(cu.GraphLaunch(exec, stream), CUDA_SUCCESS) << "fine outside the capture";
  ASSERT_EQ(cu.GraphExecDestroy(exec), CUDA_SUCCESS);
  ASSERT_EQ(cu.GraphDestroy(graph), CUDA_SUCCESS);
  ASSERT_EQ(cu.StreamDestroy(stream), CUDA_SUCCESS);
}

// cuGraphAddDependencies records edges with their data and checks it as the API documents.
TEST_F(FakeDriverTest, EdgesOfBuiltGraphsKeepTheirTypeAndPort) {
  LoadAdd();
  CUgraph graph;
  ASSERT_EQ(cu.GraphCreate(&graph, 0), CUDA_SUCCESS);
  auto params = AddParams(1, 2, 3, 100);
  size_t size = kAddParamBytes;
  void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, params.data(), CU_LAUNCH_PARAM_BUFFER_SIZE,
                   &size, CU_LAUNCH_PARAM_END};
  CUDA_KERNEL_NODE_PARAMS_v2 node{};
  node.func = function_;
  node.gridDimX = node.gridDimY = node.gridDimZ = 1;
  node.blockDimX = 128;
  node.blockDimY = node.blockDimZ = 1;
  node.extra = extra;
  CUgraphNode n[3];
  ASSERT_EQ(cu.GraphAddKernelNode(&n[0], graph, nullptr, 0, &node), CUDA_SUCCESS);
  ASSERT_EQ(cu.GraphAddKernelNode(&n[1], graph, &n[0], 1, &node), CUDA_SUCCESS);
  ASSERT_EQ(cu.GraphAddKernelNode(&n[2], graph, nullptr, 0, &node), CUDA_SUCCESS);
  CUgraphEdgeData programmatic{};
  programmatic.from_port = CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC;
  programmatic.type = CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC;
  CUgraphEdgeData bad = programmatic;
  bad.from_port = CU_GRAPH_KERNEL_NODE_PORT_DEFAULT;  // programmatic needs a non-default port
  EXPECT_EQ(cu.GraphAddDependencies(graph, &n[1], &n[2], &bad, 1), CUDA_ERROR_INVALID_VALUE);
  bad = {};
  bad.from_port = CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC;  // and the port a programmatic edge
  EXPECT_EQ(cu.GraphAddDependencies(graph, &n[1], &n[2], &bad, 1), CUDA_ERROR_INVALID_VALUE);
  bad = programmatic;
  bad.to_port = 1;
  EXPECT_EQ(cu.GraphAddDependencies(graph, &n[1], &n[2], &bad, 1), CUDA_ERROR_INVALID_VALUE);
  bad = programmatic;
  bad.reserved[4] = 1;
  EXPECT_EQ(cu.GraphAddDependencies(graph, &n[1], &n[2], &bad, 1), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu.GraphAddDependencies(graph, &n[0], &n[1], nullptr, 1), CUDA_ERROR_INVALID_VALUE)
      << "that edge exists";
  EXPECT_EQ(cu.GraphAddDependencies(graph, &n[2], &n[2], &programmatic, 1),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu.GraphAddDependencies(graph, &n[2], &n[1], &programmatic, 1),
            CUDA_ERROR_NOT_SUPPORTED) << "a later node to an earlier one: not modelled";
  ASSERT_EQ(cu.GraphAddDependencies(graph, &n[1], &n[2], &programmatic, 1), CUDA_SUCCESS);
  const std::vector<GraphEdge> edges = GraphEdges(graph);
  ASSERT_EQ(edges.size(), 2u);
  EXPECT_EQ(edges[0].from, 0u);
  EXPECT_EQ(edges[0].to, 1u);
  EXPECT_EQ(edges[0].type, CU_GRAPH_DEPENDENCY_TYPE_DEFAULT);
  EXPECT_EQ(edges[1].from, 1u);
  EXPECT_EQ(edges[1].to, 2u);
  EXPECT_EQ(edges[1].type, CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC);
  EXPECT_EQ(edges[1].from_port, CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC);
  CUgraphExec exec;
  ASSERT_EQ(cu.GraphInstantiateWithFlags(&exec, graph, 0), CUDA_SUCCESS);
  EXPECT_EQ(ExecEdges(exec).size(), 2u);
  ASSERT_EQ(cu.GraphLaunch(exec, nullptr), CUDA_SUCCESS);
  EXPECT_EQ(LaunchCount(), 3) << "every node runs, in order, whatever its edges";
  ASSERT_EQ(cu.GraphExecDestroy(exec), CUDA_SUCCESS);
  ASSERT_EQ(cu.GraphDestroy(graph), CUDA_SUCCESS);
}

TEST_F(FakeDriverTest, LaunchNoopOnlyCounts) {
  LoadAdd();
  SetLaunchNoop(true);
  auto params = AddParams(0, 0, 0, 0);
  EXPECT_EQ(LaunchExtra(Config(nullptr), params), CUDA_SUCCESS);
  EXPECT_EQ(LaunchCount(), 0);
  EXPECT_EQ(CallCount("LaunchKernelEx"), 1);
}

TEST_F(FakeDriverTest, LaunchNoopOnlyCountsGraphLaunches) {
  LoadAdd();
  CUstream stream;
  ASSERT_EQ(cu.StreamCreate(&stream, 0), CUDA_SUCCESS);
  CUgraph graph = nullptr;
  CUgraphExec exec = nullptr;
  ASSERT_NO_FATAL_FAILURE(CaptureAdd(stream, 7, &graph, &exec));
  ASSERT_EQ(LaunchCount(), 1);  // the captured launch
  SetLaunchNoop(true);
  EXPECT_EQ(cu.GraphLaunch(exec, stream), CUDA_SUCCESS);
  EXPECT_EQ(LaunchCount(), 1) << "a no-op graph launch records no replayed launch";
  EXPECT_EQ(CallCount("GraphLaunch"), 1);
  SetLaunchNoop(false);
  ASSERT_EQ(cu.GraphLaunch(exec, stream), CUDA_SUCCESS);
  EXPECT_EQ(LaunchCount(), 2);
  ASSERT_EQ(cu.GraphExecDestroy(exec), CUDA_SUCCESS);
  ASSERT_EQ(cu.GraphDestroy(graph), CUDA_SUCCESS);
}

TEST_F(FakeDriverTest, LaunchPathDoesNotAllocate) {
  LoadAdd();
  CUstream stream;
  ASSERT_EQ(cu.StreamCreate(&stream, 0), CUDA_SUCCESS);
  ASSERT_EQ(cu.StreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  auto params = AddParams(1, 2, 3, 4);
  ASSERT_EQ(LaunchExtra(Config(stream), params), CUDA_SUCCESS);
  CUgraph graph;
  ASSERT_EQ(cu.StreamEndCapture(stream, &graph), CUDA_SUCCESS);
  CUgraphExec exec;
  ASSERT_EQ(cu.GraphInstantiateWithFlags(&exec, graph, 0), CUDA_SUCCESS);
  CUdeviceptr x = 0, y = 0, out = 0, scratch = 0, profile = 0;
  int32_t n = 0;
  void* args[] = {&x, &y, &out, &n, &scratch, &profile};
  const CUlaunchConfig config = Config(stream);

  const int64_t before = g_heap_allocations.load();
  for (int i = 0; i < 100; ++i) {
    ASSERT_EQ(LaunchExtra(config, params), CUDA_SUCCESS);
    ASSERT_EQ(cu.LaunchKernelEx(&config, function_, args, nullptr), CUDA_SUCCESS);
    ASSERT_EQ(cu.GraphLaunch(exec, stream), CUDA_SUCCESS);
  }
  EXPECT_EQ(g_heap_allocations.load() - before, 0);
  ASSERT_EQ(cu.GraphExecDestroy(exec), CUDA_SUCCESS);
  ASSERT_EQ(cu.GraphDestroy(graph), CUDA_SUCCESS);
  ASSERT_EQ(cu.StreamDestroy(stream), CUDA_SUCCESS);
}

TEST_F(FakeDriverTest, RingKeepsTheLastLaunches) {
  LoadAdd();
  auto params = AddParams(0, 0, 0, 0);
  const int64_t total = kLaunchRingCapacity + 10;
  for (int64_t i = 0; i < total; ++i) {
    ASSERT_EQ(LaunchExtra(Config(nullptr, static_cast<unsigned>(i + 1)), params), CUDA_SUCCESS);
  }
  ASSERT_EQ(LaunchCount(), total);
  EXPECT_EQ(GetLaunch(10).grid[0], 11u);
  EXPECT_EQ(GetLaunch(total - 1).grid[0], static_cast<unsigned>(total));
  // Re-executes the test binary for the death test instead of forking a threaded process.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(GetLaunch(9), "not among the retained launches");
}

TEST_F(FakeDriverTest, ConcurrentUseFromEightThreads) {
  LoadAdd();
  constexpr int kThreads = 8;
  constexpr int kLaunches = 500;
  CUcontext primary;
  ASSERT_EQ(cu.DevicePrimaryCtxRetain(&primary, 0), CUDA_SUCCESS);
  std::vector<CUstream> streams(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      ASSERT_EQ(cu.CtxPushCurrent(primary), CUDA_SUCCESS);
      ASSERT_EQ(cu.StreamCreate(&streams[t], 0), CUDA_SUCCESS);
      CUdeviceptr buffer;
      ASSERT_EQ(cu.MemAlloc(&buffer, 4096), CUDA_SUCCESS);
      auto params = AddParams(buffer, buffer, buffer, t);
      for (int i = 0; i < kLaunches; ++i) {
        ASSERT_EQ(LaunchExtra(Config(streams[t]), params), CUDA_SUCCESS);
      }
      ASSERT_EQ(cu.StreamSynchronize(streams[t]), CUDA_SUCCESS);
      ASSERT_EQ(cu.MemFree(buffer), CUDA_SUCCESS);
      ASSERT_EQ(cu.CtxPopCurrent(nullptr), CUDA_SUCCESS);
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(LaunchCount(), kThreads * kLaunches);
  EXPECT_EQ(CallCount("LaunchKernelEx"), kThreads * kLaunches);
  const std::set<CUstream> known(streams.begin(), streams.end());
  for (int64_t i = LaunchCount() - kLaunchRingCapacity; i < LaunchCount(); ++i) {
    EXPECT_TRUE(known.contains(GetLaunch(i).stream));
  }
  for (CUstream stream : streams) ASSERT_EQ(cu.StreamDestroy(stream), CUDA_SUCCESS);
  EXPECT_EQ(LiveAllocations(), 0);
  ASSERT_EQ(cu.DevicePrimaryCtxRelease(0), CUDA_SUCCESS);
}

}  // namespace
}  // namespace kpack::fake
