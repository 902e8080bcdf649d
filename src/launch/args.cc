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
    default:
      break;
  }
  bool integer_kind = arg.kind() == Arg::Kind::kSigned || arg.kind() == Arg::Kind::kUnsigned ||
                      arg.kind() == Arg::Kind::kDevicePtr;
  bool integer_param = !type_name.empty() && (type_name[0] == 'i' || type_name[0] == 'u') &&
                       type_name != "i1" && type_name != "u1";
  absl::string_view why = integer_kind && integer_param ? " that does not fit" : "";
  return absl::InvalidArgumentError(absl::StrCat("kernel '", kernel, "': argument ", index, " ('",
                                                 param, "') expects ", type_name, ", got ",
                                                 ArgKindName(arg.kind()), value, why));
}

}  // namespace internal
}  // namespace kpack
