// The extension's interned strings; see interned.h.

#include "interned.h"

#include "dlpack.h"

namespace kpack::python {

Interned g_str;

bool InternStrings() {
  struct Entry {
    PyObject** slot;
    const char* text;
  };
  const Entry entries[] = {
      {&g_str.data_ptr, "data_ptr"},
      {&g_str.dlpack, "__dlpack__"},
      {&g_str.dlpack_device, "__dlpack_device__"},
      {&g_str.exchange_api, kExchangeApiAttr},
      {&g_str.stream, "stream"},
      {&g_str.scratch, "scratch"},
      {&g_str.grid, "grid"},
      {&g_str.cuda_stream, "cuda_stream"},
      {&g_str.cuda_stream_protocol, "__cuda_stream__"},
      {&g_str.torch, "torch"},
      {&g_str.tensor, "Tensor"},
      {&g_str.c, "_C"},
      {&g_str.cuda_get_current_raw_stream, "_cuda_getCurrentRawStream"},
      {&g_str.torch_cuda, "torch.cuda"},
      {&g_str.initialized, "_initialized"},
  };
  for (const Entry& e : entries) {
    *e.slot = PyUnicode_InternFromString(e.text);
    if (*e.slot == nullptr) return false;
  }
  return true;
}

}  // namespace kpack::python
