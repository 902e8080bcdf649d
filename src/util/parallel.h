// Parallel loops for Open's independent pieces of work (each kernel's JSON as the manifest
// is scanned, each variant's cubin), so that a large pack opens in a fraction of the
// serial time.

#ifndef KPACK_SRC_UTIL_PARALLEL_H_
#define KPACK_SRC_UTIL_PARALLEL_H_

#include <cstddef>
#include <functional>

namespace kpack::internal {

// Runs task(0) .. task(n - 1) on up to `threads` threads (the caller's included), claiming
// the indices in increasing order. Once a task returns false, no further task is started;
// those already claimed (every index below it) still finish, so "the first task that
// failed, in index order" is the same as in a serial run. Falls back to fewer threads (at
// worst the caller's alone) when the system will not start more.
void ParallelFor(size_t n, unsigned threads, const std::function<bool(size_t)>& task);

// Work found while it is being done. `produce(post)` runs on the calling thread and hands
// each item to `post` as soon as it is ready; `consume(item)` runs once for each posted
// item on one of up to `threads` threads (the caller's among them once `produce` has
// returned), items taken in the order they were posted. Returns when every posted item
// has been consumed. What the producer wrote to an item before posting it is visible to
// `consume`, and what `consume` wrote is visible to the caller afterwards; an item must
// stay where it is (e.g. in a std::deque, not a std::vector that grows) until then.
template <typename T>
void ParallelPipeline(unsigned threads,
                      const std::function<void(const std::function<void(T*)>& post)>& produce,
                      const std::function<void(T*)>& consume);

// ParallelPipeline without the item type.
void ParallelPipelineUntyped(
    unsigned threads, const std::function<void(const std::function<void(void*)>& post)>& produce,
    const std::function<void(void*)>& consume);

template <typename T>
void ParallelPipeline(unsigned threads,
                      const std::function<void(const std::function<void(T*)>& post)>& produce,
                      const std::function<void(T*)>& consume) {
  ParallelPipelineUntyped(
      threads,
      [&](const std::function<void(void*)>& post) { produce([&](T* item) { post(item); }); },
      [&](void* item) { consume(static_cast<T*>(item)); });
}

// How many threads `work` units deserve when a thread is worth starting only for at least
// `per_thread` units: at least 1, at most the machine's cores and 8.
unsigned ThreadsFor(size_t work, size_t per_thread);

}  // namespace kpack::internal

#endif  // KPACK_SRC_UTIL_PARALLEL_H_
