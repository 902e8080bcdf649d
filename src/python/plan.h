// What a kernel object knows about its call parameters, read once when it is made: each
// parameter's kind (how a Python value converts), its element type as DLPack spells it
// (for the tensor dtype check), and the tables between Triton's and DLPack's type names.

#ifndef KPACK_SRC_PYTHON_PLAN_H_
#define KPACK_SRC_PYTHON_PLAN_H_

#include <Python.h>
#include <nanobind/nanobind.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dlpack.h"
#include "kpack/kpack.h"
#include "meta.h"

namespace kpack::python {

enum class ParamKind : uint8_t { kPointer, kInt, kFloat, kBool, kTensorDesc };

struct ParamPlan {
  ParamKind kind = ParamKind::kPointer;
  bool check_dtype = false;  // pointers, descriptors' bases: the element type has a DLPack
  DLDataType dtype{};        // equivalent, which is this
  int desc_index = -1;       // tensordesc: its number among the kernel's descriptors
  int desc_rank = 0;         // tensordesc: the block's rank
  std::string name;
  std::string type;          // Triton type, as in the manifest
  nanobind::object py_name;  // interned, for keyword matching
};

struct KernelPlan {
  Kernel kernel;
  std::string name;
  std::vector<ParamPlan> params;  // call parameters, in launch order
  size_t num_descs = 0;           // tensordesc parameters among them
  KernelMeta meta;                // introspection (meta.h)
};

// The plan of `kernel`. Needs the GIL; throws nanobind's python_error on failure.
std::shared_ptr<const KernelPlan> MakePlan(Kernel kernel);

// DLPack's spelling of a Triton pointer's element type ("*fp32" -> float 32), if any.
// Triton names bool tensors `*u1` (`*i1` is accepted too); `*k` marks a constant pointer.
std::optional<DLDataType> PointeeDType(std::string_view type);

// A DLPack dtype's name as torch spells it ("float32"), for messages.
const char* DTypeName(DLDataType d);

}  // namespace kpack::python

#endif  // KPACK_SRC_PYTHON_PLAN_H_
