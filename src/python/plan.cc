// Kernel plans and the Triton/DLPack type tables; see plan.h.

#include "plan.h"

#include <algorithm>
#include <utility>

namespace nb = nanobind;

namespace kpack::python {

std::optional<DLDataType> PointeeDType(std::string_view type) {
  std::string_view t = type.substr(1);
  if (t.size() > 1 && t[0] == 'k') t.remove_prefix(1);
  struct Entry {
    std::string_view name;
    uint8_t code, bits;
  };
  static constexpr Entry kTable[] = {
      {"fp16", kDLFloat, 16},       {"bf16", kDLBfloat, 16},        {"fp32", kDLFloat, 32},
      {"fp64", kDLFloat, 64},       {"i8", kDLInt, 8},              {"i16", kDLInt, 16},
      {"i32", kDLInt, 32},          {"i64", kDLInt, 64},            {"u8", kDLUInt, 8},
      {"u16", kDLUInt, 16},         {"u32", kDLUInt, 32},           {"u64", kDLUInt, 64},
      {"u1", kDLBool, 8},           {"i1", kDLBool, 8},             {"fp8e4nv", kDLFloat8_e4m3fn, 8},
      {"fp8e5", kDLFloat8_e5m2, 8}, {"fp8e4b8", kDLFloat8_e4m3fnuz, 8},
      {"fp8e5b16", kDLFloat8_e5m2fnuz, 8},
  };
  for (const Entry& e : kTable) {
    if (e.name == t) return DLDataType{e.code, e.bits, 1};
  }
  return std::nullopt;  // fp8e4b15, void, ...: DLPack has no name for it; not checked
}

const char* DTypeName(DLDataType d) {
  auto by_bits = [&](const char* b8, const char* b16, const char* b32, const char* b64,
                     const char* other) {
    return d.bits == 8 ? b8 : d.bits == 16 ? b16 : d.bits == 32 ? b32 : d.bits == 64 ? b64 : other;
  };
  switch (d.code) {
    case kDLInt:
      return by_bits("int8", "int16", "int32", "int64", "int");
    case kDLUInt:
      return by_bits("uint8", "uint16", "uint32", "uint64", "uint");
    case kDLFloat:
      return by_bits("float", "float16", "float32", "float64", "float");
    case kDLBfloat:
      return "bfloat16";
    case kDLComplex:
      return "complex";
    case kDLBool:
      return "bool";
    case kDLFloat8_e4m3fn:
      return "float8_e4m3fn";
    case kDLFloat8_e4m3fnuz:
      return "float8_e4m3fnuz";
    case kDLFloat8_e5m2:
      return "float8_e5m2";
    case kDLFloat8_e5m2fnuz:
      return "float8_e5m2fnuz";
    default:
      return "another type";
  }
}

std::shared_ptr<const KernelPlan> MakePlan(Kernel kernel) {
  auto plan = std::make_shared<KernelPlan>();
  plan->kernel = kernel;
  plan->name = std::string(kernel.name());
  for (size_t i = 0; i < kernel.num_args(); ++i) {
    ParamPlan p;
    p.name = std::string(kernel.arg_name(i));
    p.type = std::string(kernel.arg_type(i));
    const std::string_view t = p.type;
    if (!t.empty() && t[0] == '*') {
      p.kind = ParamKind::kPointer;
      if (std::optional<DLDataType> d = PointeeDType(t)) {
        p.check_dtype = true;
        p.dtype = *d;
      }
    } else if (t == "i1" || t == "u1") {
      p.kind = ParamKind::kBool;
    } else if (t == "fp16" || t == "bf16" || t == "fp32" || t == "fp64") {
      p.kind = ParamKind::kFloat;
    } else if (t.starts_with("tensordesc<")) {
      // tensordesc<fp16[64, 128]>: its base tensor is checked like a `*fp16`'s.
      p.kind = ParamKind::kTensorDesc;
      const size_t open = t.find('[');
      const std::string pointer = std::string("*").append(t.substr(11, open - 11));
      if (std::optional<DLDataType> d = PointeeDType(pointer)) {
        p.check_dtype = true;
        p.dtype = *d;
      }
      p.desc_rank = static_cast<int>(std::count(t.begin(), t.end(), ',')) + 1;
      p.desc_index = static_cast<int>(plan->num_descs++);
    } else {
      p.kind = ParamKind::kInt;
    }
    p.py_name = nb::steal(PyUnicode_InternFromString(p.name.c_str()));
    if (!p.py_name.is_valid()) throw nb::python_error();
    plan->params.push_back(std::move(p));
  }
  plan->meta.Init(kernel);
  return plan;
}

}  // namespace kpack::python
