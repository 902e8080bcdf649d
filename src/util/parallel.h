// A parallel loop for Open's independent pieces of work (each kernel's JSON, each
// variant's cubin), so that a large pack opens in a fraction of the serial time.

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

// How many threads `work` units deserve when a thread is worth starting only for at least
// `per_thread` units: at least 1, at most the machine's cores and 8.
unsigned ThreadsFor(size_t work, size_t per_thread);

}  // namespace kpack::internal

#endif  // KPACK_SRC_UTIL_PARALLEL_H_
