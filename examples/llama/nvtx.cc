#include "nvtx.h"

#include <cstdlib>
#include <string_view>

#if KPACK_ENABLE_NVTX
#include <nvtx3/nvToolsExt.h>
#endif

namespace kpack::llama {
namespace {

constexpr const char* kNames[Nvtx::kCount] = {
    "prefill", "decode step", "set batch", "bind bucket", "replay",
    "launch",  "readback",    "wait",      "sequence",
};

}  // namespace

Nvtx::Nvtx(bool enabled) {
#if KPACK_ENABLE_NVTX
  const char* env = std::getenv("KPACK_NVTX");
  if (!enabled || (env != nullptr && std::string_view(env) == "0")) return;
  auto domain = nvtxDomainCreateA("kpack-llama");
  domain_ = domain;
  for (int i = 0; i < kCount; ++i) names_[i] = nvtxDomainRegisterStringA(domain, kNames[i]);
#else
  (void)enabled;
#endif
}

Nvtx::~Nvtx() {
#if KPACK_ENABLE_NVTX
  if (domain_ != nullptr) nvtxDomainDestroy(static_cast<nvtxDomainHandle_t>(domain_));
#endif
}

void Nvtx::Push(Name name, int64_t payload) const {
#if KPACK_ENABLE_NVTX
  if (domain_ == nullptr) return;
  nvtxEventAttributes_t attrs = {};
  attrs.version = NVTX_VERSION;
  attrs.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
  attrs.messageType = NVTX_MESSAGE_TYPE_REGISTERED;
  attrs.message.registered = static_cast<nvtxStringHandle_t>(names_[name]);
  attrs.payloadType = NVTX_PAYLOAD_TYPE_INT64;
  attrs.payload.llValue = payload;
  nvtxDomainRangePushEx(static_cast<nvtxDomainHandle_t>(domain_), &attrs);
#else
  (void)name;
  (void)payload;
#endif
}

void Nvtx::Pop() const {
#if KPACK_ENABLE_NVTX
  if (domain_ != nullptr) nvtxDomainRangePop(static_cast<nvtxDomainHandle_t>(domain_));
#endif
}

}  // namespace kpack::llama
