// kpack._kpack._testing: tensor stand-ins for the CPU tests and the no-GPU overhead
// benchmark. Not part of the API.
//
// FakeTensor(ptr, device_type=2, device_id=0, code=2, bits=32, lanes=1, fail=False): its
// type carries a `__dlpack_c_exchange_api__` capsule, as torch.Tensor does, implemented in
// C (so that timing it measures kpack, not a Python callback). `dltensor_from_py_object_
// no_sync` reports the given pointer, device and dtype (or fails with RuntimeError when
// `fail`); `current_work_stream` reports the stream set with set_current_stream(handle,
// device=0). FakeManagedTensor is the same through a table without
// `dltensor_from_py_object_no_sync` (the managed, owning export instead). counters()
// counts the calls of every table function; reset_counters() zeroes them.

#ifndef KPACK_SRC_PYTHON_TESTING_H_
#define KPACK_SRC_PYTHON_TESTING_H_

#include <Python.h>

namespace kpack::python {

bool InitTesting(PyObject* module);

}  // namespace kpack::python

#endif  // KPACK_SRC_PYTHON_TESTING_H_
