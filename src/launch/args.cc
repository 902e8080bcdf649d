// The out-of-line half of argument packing (args.h): the names of Arg kinds and the error
// for an argument its slot refuses, built only on failure.

#include "launch/args.h"

#include <bit>

#include "absl/strings/str_cat.h"

namespace kpack {

const char* ArgKindName(Arg::Kind kind) {
  switch (kind) {
    case Arg::Kind::kHostTypedPointer:
      return "a pointer";
    case Arg::Kind::kDevicePtr:
      return "a CUdeviceptr";
    case Arg::Kind::kSigned:
      return "a signed integer";
    case Arg::Kind::kUnsigned:
      return "an unsigned integer";
    case Arg::Kind::kBool:
      return "a bool";
    case Arg::Kind::kFloat32:
      return "a float";
    case Arg::Kind::kFloat64:
      return "a double";
    case Arg::Kind::kHalf:
      return "a kpack::Half";
    case Arg::Kind::kBFloat16:
      return "a kpack::BFloat16";
    case Arg::Kind::kTensorDesc:
      return "a kpack::TensorDesc";
  }
  return "an unknown value";
}

namespace internal {

absl::Status ArgError(absl::string_view kernel, size_t index, absl::string_view param,
                      absl::string_view type_name, const Arg& arg) {
  std::string value;
  switch (arg.kind()) {
    case Arg::Kind::kSigned:
      value = absl::StrCat(" ", static_cast<int64_t>(arg.bits()));
      break;
    case Arg::Kind::kUnsigned:
    case Arg::Kind::kDevicePtr:
      value = absl::StrCat(" ", arg.bits());
      break;
    case Arg::Kind::kFloat32:
      value = absl::StrCat(" ", std::bit_cast<float>(static_cast<uint32_t>(arg.bits())));
      break;
    case Arg::Kind::kFloat64:
      value = absl::StrCat(" ", std::bit_cast<double>(arg.bits()));
      break;
    default:
      break;
  }
  const bool integer_kind = arg.kind() == Arg::Kind::kSigned ||
                            arg.kind() == Arg::Kind::kUnsigned ||
                            arg.kind() == Arg::Kind::kDevicePtr;
  const bool integer_param = !type_name.empty() && (type_name[0] == 'i' || type_name[0] == 'u') &&
                             type_name != "i1" && type_name != "u1";
  const bool float_kind = arg.kind() == Arg::Kind::kFloat32 || arg.kind() == Arg::Kind::kFloat64;
  absl::string_view why;
  if (integer_kind && integer_param) why = " that does not fit";
  // The only float a float parameter refuses: one past fp16's range, for which Triton's
  // launcher (PyFloat_Pack2) raises OverflowError too.
  if (float_kind && type_name == "fp16") why = " beyond fp16's largest value 65504";
  return absl::InvalidArgumentError(absl::StrCat("kernel '", kernel, "': argument ", index, " ('",
                                                 param, "') expects ", type_name, ", got ",
                                                 ArgKindName(arg.kind()), value, why));
}

}  // namespace internal
}  // namespace kpack
