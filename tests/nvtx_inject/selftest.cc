// Checks kpack_nvtx_inject end to end: NVTX loads it through
// NVTX_INJECTION64_PATH, this test makes the same NVTX calls kpack's launcher
// makes, and the recorder, read through the linked C API, must have seen them.

#include <dlfcn.h>
#include <stdlib.h>
#include <unistd.h>

#include <barrier>
#include <cstdint>
#include <cstdlib>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nvtx3/nvToolsExt.h>

#include "nvtx_inject/nvtx_inject.h"

namespace kpack {
namespace {

constexpr char kInjectionEnv[] = "NVTX_INJECTION64_PATH";

// NVTX reads NVTX_INJECTION64_PATH once, at the process's first NVTX call, so
// every test that expects recording comes through here before touching NVTX,
// whatever order the tests run in. nvtxInitialize forces that first call.
bool InjectRecorder() {
  static const bool injected = [] {
    setenv(kInjectionEnv, KPACK_NVTX_INJECT_PATH, /*overwrite=*/1);
    nvtxInitialize(nullptr);
    return kpack_nvtx_inject_initialized() != 0;
  }();
  return injected;
}

nvtxEventAttributes_t RegisteredMessage(nvtxStringHandle_t message) {
  nvtxEventAttributes_t attrs = {};
  attrs.version = NVTX_VERSION;
  attrs.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
  attrs.messageType = NVTX_MESSAGE_TYPE_REGISTERED;
  attrs.message.registered = message;
  return attrs;
}

// One launch as kpack wraps it: a range named by the kernel's registered
// string.
void LaunchRange(nvtxDomainHandle_t domain, nvtxStringHandle_t kernel) {
  const nvtxEventAttributes_t attrs = RegisteredMessage(kernel);
  nvtxDomainRangePushEx(domain, &attrs);
  nvtxDomainRangePop(domain);
}

class NvtxInjectTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(InjectRecorder())
        << "NVTX did not call InitializeInjectionNvtx2 from "
        << KPACK_NVTX_INJECT_PATH;
    kpack_nvtx_inject_reset();
    domain_ = nvtxDomainCreateA("kpack");
    add_ = nvtxDomainRegisterStringA(domain_, "add");
  }

  nvtxDomainHandle_t domain_ = nullptr;
  nvtxStringHandle_t add_ = nullptr;
};

TEST_F(NvtxInjectTest, RecordsRegisteredLaunchRanges) {
  for (int i = 0; i < 3; ++i) LaunchRange(domain_, add_);

  ASSERT_EQ(kpack_nvtx_inject_push_count(), 3u);
  EXPECT_EQ(kpack_nvtx_inject_pop_count(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_STREQ(kpack_nvtx_inject_push_text(i), "add") << "push " << i;
    EXPECT_STREQ(kpack_nvtx_inject_push_domain(i), "kpack") << "push " << i;
  }
  EXPECT_EQ(kpack_nvtx_inject_max_depth(), 1);
  ASSERT_EQ(kpack_nvtx_inject_event_count(), 6u);
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(kpack_nvtx_inject_event_is_push(i), i % 2 == 0 ? 1 : 0)
        << "event " << i;
    EXPECT_EQ(kpack_nvtx_inject_event_thread(i),
              static_cast<uint64_t>(gettid()));
  }
}

TEST_F(NvtxInjectTest, SameDomainNameGivesSameHandle) {
  EXPECT_NE(domain_, nullptr);
  EXPECT_EQ(nvtxDomainCreateA("kpack"), domain_);
}

// A test that links the library and NVTX, which dlopens it by path, must share
// one recorder, or the test would read a copy that never records anything.
TEST_F(NvtxInjectTest, LinkedAndInjectedCopiesAreTheSame) {
  void* injected = dlopen(KPACK_NVTX_INJECT_PATH, RTLD_NOW | RTLD_NOLOAD);
  ASSERT_NE(injected, nullptr) << dlerror();
  EXPECT_EQ(dlsym(injected, "kpack_nvtx_inject_push_count"),
            reinterpret_cast<void*>(&kpack_nvtx_inject_push_count));
  dlclose(injected);
}

TEST_F(NvtxInjectTest, MessagesThatAreNotRegisteredInTheDomainHaveNoText) {
  nvtxEventAttributes_t ascii = {};
  ascii.version = NVTX_VERSION;
  ascii.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
  ascii.messageType = NVTX_MESSAGE_TYPE_ASCII;
  ascii.message.ascii = "add";
  nvtxDomainRangePushEx(domain_, &ascii);
  nvtxDomainRangePop(domain_);

  nvtxDomainHandle_t other = nvtxDomainCreateA("other");
  LaunchRange(other, add_);

  ASSERT_EQ(kpack_nvtx_inject_push_count(), 2u);
  EXPECT_EQ(kpack_nvtx_inject_push_text(0), nullptr);
  EXPECT_STREQ(kpack_nvtx_inject_push_domain(0), "kpack");
  EXPECT_EQ(kpack_nvtx_inject_push_text(1), nullptr);
  EXPECT_STREQ(kpack_nvtx_inject_push_domain(1), "other");
  nvtxDomainDestroy(other);
}

TEST_F(NvtxInjectTest, DepthIsCountedPerThread) {
  constexpr int kThreads = 2;
  // Both threads hold two nested ranges at the same moment, so a depth shared
  // across threads would reach 4.
  std::barrier both_nested(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      const nvtxEventAttributes_t attrs = RegisteredMessage(add_);
      EXPECT_EQ(nvtxDomainRangePushEx(domain_, &attrs), 0);
      EXPECT_EQ(nvtxDomainRangePushEx(domain_, &attrs), 1);
      both_nested.arrive_and_wait();
      EXPECT_EQ(nvtxDomainRangePop(domain_), 1);
      EXPECT_EQ(nvtxDomainRangePop(domain_), 0);
    });
  }
  for (std::thread& thread : threads) thread.join();

  EXPECT_EQ(kpack_nvtx_inject_push_count(), 4u);
  EXPECT_EQ(kpack_nvtx_inject_pop_count(), 4u);
  EXPECT_EQ(kpack_nvtx_inject_max_depth(), 2);
}

// Without a tool NVTX must stay a harmless no-op: kpack gets null handles and
// keeps running. Needs a process whose first NVTX call happens with the
// variable unset, so it runs in a fresh re-executed child ("threadsafe" death
// test style), not a fork of this process, where NVTX may be initialized
// already.
TEST(NvtxInjectDeathTest, WithoutInjectionNvtxIsANoOp) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        unsetenv(kInjectionEnv);
        nvtxDomainHandle_t domain = nvtxDomainCreateA("kpack");
        nvtxStringHandle_t add = nvtxDomainRegisterStringA(domain, "add");
        for (int i = 0; i < 3; ++i) LaunchRange(domain, add);
        const bool quiet = domain == nullptr && add == nullptr &&
                           kpack_nvtx_inject_initialized() == 0 &&
                           kpack_nvtx_inject_push_count() == 0;
        std::exit(quiet ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace kpack
