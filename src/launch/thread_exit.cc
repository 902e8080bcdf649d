#include "launch/thread_exit.h"

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <utility>
#include <vector>

#include "launch/stream_key.h"

namespace kpack::internal {

struct ThreadExitHook::Shared {
  std::mutex mu;  // guards `closed` and `running`
  std::condition_variable idle;
  bool closed = false;
  int running = 0;  // callbacks under way
  const Callback on_exit;
  void* const context;
  Shared(Callback callback, void* ctx) : on_exit(callback), context(ctx) {}
};

namespace {

// Set once the thread's Watched list is destroyed: trivially destructible, so it can be
// read during thread exit after the list is gone.
thread_local bool tls_exiting = false;

// The hooks the thread watches, called back by its thread-local destruction.
struct Watched {
  std::vector<std::weak_ptr<ThreadExitHook::Shared>> hooks;
  ~Watched();
};
thread_local Watched tls_watched;

// Runs `shared`'s callback for the exiting thread unless the hook is closed; Close waits
// for it meanwhile.
void RunOnExit(ThreadExitHook::Shared& shared, uint64_t token) {
  {
    std::lock_guard<std::mutex> lock(shared.mu);
    if (shared.closed) return;
    ++shared.running;
  }
  shared.on_exit(shared.context, token);
  std::lock_guard<std::mutex> lock(shared.mu);
  if (--shared.running == 0) shared.idle.notify_all();
}

Watched::~Watched() {
  tls_exiting = true;
  const uint64_t token = ThreadToken();
  for (const std::weak_ptr<ThreadExitHook::Shared>& weak : hooks) {
    if (std::shared_ptr<ThreadExitHook::Shared> shared = weak.lock()) RunOnExit(*shared, token);
  }
}

}  // namespace

ThreadExitHook::ThreadExitHook(Callback on_exit, void* context)
    : shared_(std::make_shared<Shared>(on_exit, context)) {}

ThreadExitHook::~ThreadExitHook() { Close(); }

void ThreadExitHook::Watch() {
  if (tls_exiting) return;
  std::vector<std::weak_ptr<Shared>>& hooks = tls_watched.hooks;
  // Hooks of destroyed runtimes go: a long-lived thread that serves many keeps a short list.
  std::erase_if(hooks, [](const std::weak_ptr<Shared>& weak) { return weak.expired(); });
  const bool watched = std::any_of(hooks.begin(), hooks.end(), [&](const auto& weak) {
    return !weak.owner_before(shared_) && !shared_.owner_before(weak);
  });
  if (!watched) hooks.push_back(shared_);
}

void ThreadExitHook::Close() {
  std::unique_lock<std::mutex> lock(shared_->mu);
  shared_->closed = true;
  shared_->idle.wait(lock, [&] { return shared_->running == 0; });
}

}  // namespace kpack::internal
