// Triton's host tensor descriptors (triton.tools.tensor_descriptor.TensorDescriptor) as
// arguments of `tensordesc` parameters: the Python side of kpack::TensorDesc.
//
// A descriptor argument is any object with `base` (a tensor, converted like a pointer
// argument: device and dtype checked against the descriptor's element type), `shape` and
// `strides` (sequences of ints, as many as the parameter's block has dimensions) and
// optionally `padding` ("zero", the default, or "nan"). Its `block_shape` is not read:
// the block shape is the chosen variant's, as compiled (an autotuned kernel's configs
// differ in it; Triton's tutorials set it per config in a pre_hook, which kpack does not
// run). Triton's own checks on the values (alignment, last stride 1, ...) are the
// runtime's, at launch: kpack::InvalidArgumentError (ValueError) naming the parameter.

#ifndef KPACK_SRC_PYTHON_TENSORDESC_H_
#define KPACK_SRC_PYTHON_TENSORDESC_H_

#include <Python.h>

#include <cstddef>
#include <memory>
#include <string>

#include "kpack/arg.h"

namespace kpack::python {

// Reads `o`'s shape, strides and padding into `desc` (whose rank becomes `rank`) and
// returns its `base` (a new reference) for the caller to convert like a pointer argument;
// null with a Python exception set when `o` is not a descriptor (TypeError) or its
// shape, strides or padding are malformed (ValueError). `label` prefixes the messages.
PyObject* ReadTensorDescriptor(PyObject* o, int rank, const std::string& label, TensorDesc* desc);

// Room for the TensorDescs of one call's descriptor arguments, which kpack::Args point
// at until the call returns: inline for the common case, on the heap beyond (such a call
// allocates). Uninitialized; each is constructed when its argument is converted.
class DescStorage {
 public:
  static constexpr size_t kInline = 8;
  explicit DescStorage(size_t n) {
    if (n > kInline) heap_ = std::make_unique<TensorDesc[]>(n);
  }
  DescStorage(const DescStorage&) = delete;
  DescStorage& operator=(const DescStorage&) = delete;
  // Storage for descriptor number `i`.
  void* slot(size_t i) {
    return heap_ ? static_cast<void*>(&heap_[i]) : static_cast<void*>(inline_ + i * sizeof(TensorDesc));
  }

 private:
  alignas(TensorDesc) unsigned char inline_[kInline * sizeof(TensorDesc)];
  std::unique_ptr<TensorDesc[]> heap_;
};

}  // namespace kpack::python

#endif  // KPACK_SRC_PYTHON_TENSORDESC_H_
