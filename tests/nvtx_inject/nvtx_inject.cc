// kpack_nvtx_inject: an NVTX injection library that records domain ranges for
// tests. See nvtx_inject.h for how a test loads and reads it.
//
// NVTX protocol, as implemented by nvtx3's nvtxDetail/nvtxInit.h and
// nvtxImpl.h: at the first NVTX call, each NVTX instance (every shared object
// that includes the header-only NVTX has its own, with hidden globals) dlopens
// $NVTX_INJECTION64_PATH and calls InitializeInjectionNvtx2 with its
// nvtxGetExportTable. From the NVTX_ETID_CALLBACKS table,
// GetModuleFunctionTable gives, per callback module, an array of pointers to
// the instance's function pointer slots; writing a slot routes that API to us.
// Slots left untouched become no-ops. Returning 0 makes NVTX undo everything
// and run as no-ops.

#include "nvtx_inject/nvtx_inject.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

// A tool takes only NVTX's types and declarations: with the implementation,
// this library would carry a private NVTX instance of its own.
#define NVTX_NO_IMPL
#include <nvtx3/nvToolsExt.h>

namespace kpack {
namespace {

// Handles are small integers cast to NVTX's opaque pointer types: never null
// (null is NVTX's "default domain" / "no tool"), never dereferenced, and never
// reused, so a stale or foreign handle simply fails to resolve. Domains and
// strings share one counter so passing one kind where the other belongs also
// fails to resolve.
using HandleId = std::uintptr_t;

HandleId IdOf(const void* handle) { return reinterpret_cast<HandleId>(handle); }

template <typename Handle>
Handle HandleFor(HandleId id) {
  return reinterpret_cast<Handle>(id);
}

class Recorder {
 public:
  nvtxDomainHandle_t CreateDomain(const char* name) {
    std::string key = name != nullptr ? name : "";
    std::lock_guard<std::mutex> lock(mutex_);
    // One handle per name, like a profiler: every NVTX instance in the process
    // (the library's and the test's) then sees the same "kpack" domain.
    auto [it, inserted] = domain_by_name_.try_emplace(key, next_handle_);
    if (inserted) {
      domain_names_.emplace(next_handle_++, std::move(key));
    }
    return HandleFor<nvtxDomainHandle_t>(it->second);
  }

  void DestroyDomain(nvtxDomainHandle_t domain) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto name = domain_names_.find(IdOf(domain));
    if (name == domain_names_.end()) return;
    domain_by_name_.erase(name->second);
    domain_names_.erase(name);
    // NVTX ties registered strings to their domain's lifetime.
    std::erase_if(strings_, [domain](const auto& entry) {
      return entry.second.domain == IdOf(domain);
    });
  }

  nvtxStringHandle_t RegisterString(nvtxDomainHandle_t domain,
                                    const char* text) {
    std::lock_guard<std::mutex> lock(mutex_);
    const HandleId id = next_handle_++;
    strings_.emplace(id, RegisteredString{IdOf(domain), text ? text : ""});
    return HandleFor<nvtxStringHandle_t>(id);
  }

  // Returns the 0-based level of the range opened, as NVTX specifies.
  int Push(nvtxDomainHandle_t domain, const nvtxEventAttributes_t* attrs) {
    const uint64_t thread = CurrentThread();
    std::optional<std::string> domain_name;
    std::optional<std::string> text;
    std::lock_guard<std::mutex> lock(mutex_);
    if (auto name = domain_names_.find(IdOf(domain));
        name != domain_names_.end()) {
      domain_name = name->second;
    }
    if (attrs != nullptr &&
        attrs->messageType == NVTX_MESSAGE_TYPE_REGISTERED) {
      auto registered = strings_.find(IdOf(attrs->message.registered));
      if (registered != strings_.end() &&
          registered->second.domain == IdOf(domain)) {
        text = registered->second.text;
      }
    }
    pushes_.push_back(&events_.emplace_back(
        Event{true, thread, std::move(domain_name), std::move(text)}));
    int& depth = depth_by_thread_[thread];
    max_depth_ = std::max(max_depth_, ++depth);
    return depth - 1;
  }

  // Returns the 0-based level of the range closed, or -1 for a pop with no
  // open range on this thread; the pop is still logged so pop_count exposes
  // the imbalance.
  int Pop() {
    const uint64_t thread = CurrentThread();
    std::lock_guard<std::mutex> lock(mutex_);
    events_.push_back(Event{false, thread, std::nullopt, std::nullopt});
    ++pop_count_;
    int& depth = depth_by_thread_[thread];
    if (depth == 0) return -1;
    return --depth;
  }

  void Reset() {
    std::lock_guard<std::mutex> lock(mutex_);
    events_.clear();
    pushes_.clear();
    pop_count_ = 0;
    depth_by_thread_.clear();
    max_depth_ = 0;
  }

  size_t PushCount() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return pushes_.size();
  }

  size_t PopCount() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return pop_count_;
  }

  const char* PushText(size_t i) const {
    std::lock_guard<std::mutex> lock(mutex_);
    return i < pushes_.size() ? CStr(pushes_[i]->text) : nullptr;
  }

  const char* PushDomain(size_t i) const {
    std::lock_guard<std::mutex> lock(mutex_);
    return i < pushes_.size() ? CStr(pushes_[i]->domain) : nullptr;
  }

  int MaxDepth() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return max_depth_;
  }

  size_t EventCount() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return events_.size();
  }

  int EventIsPush(size_t i) const {
    std::lock_guard<std::mutex> lock(mutex_);
    return i < events_.size() ? events_[i].is_push : -1;
  }

  uint64_t EventThread(size_t i) const {
    std::lock_guard<std::mutex> lock(mutex_);
    return i < events_.size() ? events_[i].thread : 0;
  }

 private:
  struct Event {
    bool is_push;
    uint64_t thread;
    // Push only; empty when unresolved (see nvtx_inject.h).
    std::optional<std::string> domain;
    std::optional<std::string> text;
  };

  struct RegisteredString {
    HandleId domain;
    std::string text;
  };

  // The kernel's thread id, the one profilers and debuggers show.
  static uint64_t CurrentThread() { return static_cast<uint64_t>(gettid()); }

  static const char* CStr(const std::optional<std::string>& s) {
    return s ? s->c_str() : nullptr;
  }

  mutable std::mutex mutex_;
  HandleId next_handle_ = 1;
  std::unordered_map<std::string, HandleId> domain_by_name_;
  std::unordered_map<HandleId, std::string> domain_names_;
  std::unordered_map<HandleId, RegisteredString> strings_;
  // A deque, so the strings handed out by PushText/PushDomain and the
  // pointers in pushes_ stay put while other threads append.
  std::deque<Event> events_;
  std::vector<const Event*> pushes_;
  size_t pop_count_ = 0;
  std::unordered_map<uint64_t, int> depth_by_thread_;
  int max_depth_ = 0;
};

// Never destroyed: NVTX calls can arrive from other threads or static
// destructors while the process exits.
Recorder& GetRecorder() {
  static Recorder* const recorder = new Recorder;
  return *recorder;
}

std::atomic<bool> initialized{false};

nvtxDomainHandle_t NVTX_API DomainCreateA(const char* name) {
  return GetRecorder().CreateDomain(name);
}

void NVTX_API DomainDestroy(nvtxDomainHandle_t domain) {
  GetRecorder().DestroyDomain(domain);
}

nvtxStringHandle_t NVTX_API DomainRegisterStringA(nvtxDomainHandle_t domain,
                                                  const char* text) {
  return GetRecorder().RegisterString(domain, text);
}

int NVTX_API DomainRangePushEx(nvtxDomainHandle_t domain,
                               const nvtxEventAttributes_t* attrs) {
  return GetRecorder().Push(domain, attrs);
}

int NVTX_API DomainRangePop(nvtxDomainHandle_t /*domain*/) {
  return GetRecorder().Pop();
}

// The explicit template argument makes the compiler check each callback
// against the slot's real signature before the cast erases it.
template <typename SlotType>
NvtxFunctionPointer Erase(SlotType callback) {
  return reinterpret_cast<NvtxFunctionPointer>(callback);
}

bool InstallCallbacks(NvtxGetExportTableFunc_t get_export_table) {
  if (get_export_table == nullptr) return false;
  const auto* callbacks = static_cast<const NvtxExportTableCallbacks*>(
      get_export_table(NVTX_ETID_CALLBACKS));
  if (callbacks == nullptr ||
      callbacks->struct_size < sizeof(NvtxExportTableCallbacks) ||
      callbacks->GetModuleFunctionTable == nullptr) {
    return false;
  }
  NvtxFunctionTable table = nullptr;
  unsigned int size = 0;
  if (!callbacks->GetModuleFunctionTable(NVTX_CB_MODULE_CORE2, &table, &size) ||
      table == nullptr) {
    return false;
  }
  const struct {
    NvtxCallbackIdCore2 id;
    NvtxFunctionPointer callback;
  } kSlots[] = {
      {NVTX_CBID_CORE2_DomainCreateA,
       Erase<nvtxDomainCreateA_impl_fntype>(&DomainCreateA)},
      {NVTX_CBID_CORE2_DomainDestroy,
       Erase<nvtxDomainDestroy_impl_fntype>(&DomainDestroy)},
      {NVTX_CBID_CORE2_DomainRegisterStringA,
       Erase<nvtxDomainRegisterStringA_impl_fntype>(&DomainRegisterStringA)},
      {NVTX_CBID_CORE2_DomainRangePushEx,
       Erase<nvtxDomainRangePushEx_impl_fntype>(&DomainRangePushEx)},
      {NVTX_CBID_CORE2_DomainRangePop,
       Erase<nvtxDomainRangePop_impl_fntype>(&DomainRangePop)},
  };
  for (const auto& slot : kSlots) {
    // `size` is the number of ids the NVTX instance knows (slot 0 unused); an
    // older instance may lack newer ones. A partial install is harmless:
    // returning 0 makes NVTX reset every slot to a no-op.
    if (static_cast<unsigned int>(slot.id) >= size ||
        table[slot.id] == nullptr) {
      return false;
    }
    *table[slot.id] = slot.callback;
  }

  // NVTX asks tools to report the NVTX version they were built against.
  const auto* version = static_cast<const NvtxExportTableVersionInfo*>(
      get_export_table(NVTX_ETID_VERSIONINFO));
  if (version != nullptr &&
      version->struct_size >= sizeof(NvtxExportTableVersionInfo) &&
      version->SetInjectionNvtxVersion != nullptr) {
    version->SetInjectionNvtxVersion(NVTX_VERSION);
  }
  return true;
}

}  // namespace
}  // namespace kpack

// NVTX looks this symbol up with dlsym, so it needs C linkage and default
// visibility. Called once per NVTX instance that initializes with this library
// injected; all of them share the one recorder.
extern "C" KPACK_NVTX_INJECT_API int InitializeInjectionNvtx2(
    NvtxGetExportTableFunc_t get_export_table) {
  if (!kpack::InstallCallbacks(get_export_table)) return 0;
  kpack::initialized.store(true);
  return 1;
}

extern "C" {

int kpack_nvtx_inject_initialized(void) {
  return kpack::initialized.load() ? 1 : 0;
}

void kpack_nvtx_inject_reset(void) { kpack::GetRecorder().Reset(); }

size_t kpack_nvtx_inject_push_count(void) {
  return kpack::GetRecorder().PushCount();
}

size_t kpack_nvtx_inject_pop_count(void) {
  return kpack::GetRecorder().PopCount();
}

const char* kpack_nvtx_inject_push_text(size_t i) {
  return kpack::GetRecorder().PushText(i);
}

const char* kpack_nvtx_inject_push_domain(size_t i) {
  return kpack::GetRecorder().PushDomain(i);
}

int kpack_nvtx_inject_max_depth(void) {
  return kpack::GetRecorder().MaxDepth();
}

size_t kpack_nvtx_inject_event_count(void) {
  return kpack::GetRecorder().EventCount();
}

int kpack_nvtx_inject_event_is_push(size_t i) {
  return kpack::GetRecorder().EventIsPush(i);
}

uint64_t kpack_nvtx_inject_event_thread(size_t i) {
  return kpack::GetRecorder().EventThread(i);
}

}  // extern "C"
