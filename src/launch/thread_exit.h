// Calls an owner back when a thread that asked for it exits: how the arenas of a
// thread's CU_STREAM_PER_THREAD stream are freed with the thread (scratch.h).
//
// Owns: nothing of the threads; each watching thread holds (in a thread-local list,
// from its first Watch to its exit) a weak reference to this hook's shared state, so a
// thread may exit before or after the hook is closed or destroyed.
//
// Thread safety: Watch and Close may be called from any thread. `on_exit` runs on the
// exiting thread, during its thread-local destruction, at most once per thread and hook,
// never after Close has returned, and with no lock of this hook held (it may make
// driver calls that wait for the GPU). Close waits for callbacks already running, so it
// must not be called from `on_exit`, nor while holding a lock `on_exit` takes.

#ifndef KPACK_SRC_LAUNCH_THREAD_EXIT_H_
#define KPACK_SRC_LAUNCH_THREAD_EXIT_H_

#include <cstdint>
#include <memory>

namespace kpack::internal {

class ThreadExitHook {
 public:
  // `on_exit(token, context)`: the exiting thread's ThreadToken (stream_key.h).
  using Callback = void (*)(void* context, uint64_t token);
  ThreadExitHook(Callback on_exit, void* context);
  ~ThreadExitHook();  // Close()
  ThreadExitHook(const ThreadExitHook&) = delete;
  ThreadExitHook& operator=(const ThreadExitHook&) = delete;

  // Has `on_exit` run when the calling thread exits. Allocates the first time per thread
  // and hook (not for the launch path's steady state). A thread whose thread-local
  // storage is already being destroyed is not watched (its arenas then stay until
  // ReleaseScratch or the Runtime's destruction).
  void Watch();
  // No callback starts after this returns; waits for those running. Idempotent.
  void Close();

  struct Shared;  // what a watching thread holds (thread_exit.cc)

 private:
  std::shared_ptr<Shared> shared_;
};

}  // namespace kpack::internal

#endif  // KPACK_SRC_LAUNCH_THREAD_EXIT_H_
