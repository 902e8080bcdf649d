// Assertions for kpack's fuzz targets: a failed check prints what broke and aborts, which
// libFuzzer reports as a crash and saves as an artifact.

#ifndef KPACK_TESTS_FUZZ_FUZZ_CHECK_H_
#define KPACK_TESTS_FUZZ_FUZZ_CHECK_H_

#include <cstdio>
#include <cstdlib>

#define KPACK_FUZZ_CHECK(cond)                                                                 \
  do {                                                                                         \
    if (!(cond)) {                                                                             \
      std::fprintf(stderr, "%s:%d: KPACK_FUZZ_CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                            \
    }                                                                                          \
  } while (0)

#endif  // KPACK_TESTS_FUZZ_FUZZ_CHECK_H_
