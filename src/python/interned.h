// The Python strings the extension compares with or looks up by (attribute, method and
// keyword names), interned once at import so that the launch path never makes one.

#ifndef KPACK_SRC_PYTHON_INTERNED_H_
#define KPACK_SRC_PYTHON_INTERNED_H_

#include <Python.h>

namespace kpack::python {

struct Interned {
  PyObject* data_ptr;
  PyObject* dlpack;                 // __dlpack__
  PyObject* dlpack_device;          // __dlpack_device__
  PyObject* exchange_api;           // __dlpack_c_exchange_api__
  PyObject* stream;                 // the stream= keyword, and __dlpack__(stream=)
  PyObject* scratch;                // the scratch= keyword
  PyObject* grid;                   // the grid= keyword
  PyObject* cuda_stream;            // torch.cuda.Stream.cuda_stream
  PyObject* cuda_stream_protocol;   // __cuda_stream__
  PyObject* torch;
  PyObject* tensor;                 // torch.Tensor
  PyObject* c;                      // torch._C
  PyObject* cuda_get_current_raw_stream;
  PyObject* torch_cuda;             // "torch.cuda", the module's name in sys.modules
  PyObject* initialized;            // torch.cuda._initialized
};
extern Interned g_str __attribute__((visibility("hidden")));

// False with a Python exception set.
bool InternStrings();

}  // namespace kpack::python

#endif  // KPACK_SRC_PYTHON_INTERNED_H_
