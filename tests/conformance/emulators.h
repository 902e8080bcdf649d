// Host emulators of the committed test packs' kernels for the recording fake driver
// (fake::SetKernelEmulator): their math is tools/README.md's. They reach device memory
// only through fake::DeviceArray, so an argument or scratch pointer outside the memory a
// kernel was given is a recorded fault (fake::Faults()).

#ifndef KPACK_TESTS_CONFORMANCE_EMULATORS_H_
#define KPACK_TESTS_CONFORMANCE_EMULATORS_H_

namespace kpack::conformance {

// Registers an emulator for every kernel entry of kernels/testpack, graphpack,
// dispatchpack, scalarpack, descpack and the example pack's TMA kernels. Call it after
// each fake::Reset(), which drops them.
void RegisterKernelEmulators();

}  // namespace kpack::conformance

#endif  // KPACK_TESTS_CONFORMANCE_EMULATORS_H_
