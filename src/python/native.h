// kpack._kpack's launch entry for native code (native_api.h): `_kpack._native_api()`.

#ifndef KPACK_SRC_PYTHON_NATIVE_H_
#define KPACK_SRC_PYTHON_NATIVE_H_

#include <nanobind/nanobind.h>

namespace kpack::python {

// Registers `_native_api` in `m`.
void InitNative(nanobind::module_& m);

}  // namespace kpack::python

#endif  // KPACK_SRC_PYTHON_NATIVE_H_
