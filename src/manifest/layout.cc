// A variant's parameter layout in the manifest: one slot per call parameter that Triton
// passes (eq1 parameters are compiled away), a tensor descriptor's parts together, then the
// hidden scratch pointers, in Triton's order, each at an aligned offset of the right size
// inside the parameter limit. The cubin's own record of the layout is checked against
// this one when the pack is read (pack/files.h).

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "manifest/parse.h"
#include "util/status_macros.h"

namespace kpack::internal {
namespace {

// The parts a descriptor expands into, in order (DescPart).
std::vector<std::pair<DescPart, int>> DescParts(const TensorDescSpec& d) {
  const int rank = static_cast<int>(d.block.size());
  std::vector<std::pair<DescPart, int>> parts;
  if (d.tma) {
    parts.push_back({DescPart::kTma, 0});
  } else {
    parts.push_back({DescPart::kBase, 0});
    for (int i = 0; i < rank; ++i) parts.push_back({DescPart::kBaseShape, i});
    for (int i = 0; i < rank; ++i) parts.push_back({DescPart::kBaseStrides, i});
    parts.push_back({DescPart::kPadding, 0});
  }
  for (int i = 0; i < rank; ++i) parts.push_back({DescPart::kShape, i});
  for (int i = 0; i < rank; ++i) parts.push_back({DescPart::kStrides, i});
  return parts;
}

}  // namespace

absl::Status ParseLayout(const json& v, const Where& where, const KernelSpec& kernel,
                         VariantSpec& variant) {
  KPACK_ASSIGN_OR_RETURN(const json* layout, Field(v, "layout", where));
  if (!layout->is_array()) {
    return where.Error("layout", absl::StrCat("expected an array, got ", TypeOf(*layout)));
  }
  absl::flat_hash_map<absl::string_view, int> arg_index;
  for (size_t a = 0; a < kernel.args.size(); ++a) {
    arg_index[kernel.params[kernel.args[a]].name] = static_cast<int>(a);
  }
  std::vector<bool> arg_seen(kernel.args.size(), false);
  bool global_seen = false, profile_seen = false;
  // Triton's ordinals are the call parameters in declaration order, then its hidden
  // pointers, global scratch first. Offsets and sizes alone cannot tell two same-size
  // parameters (or the two scratch pointers) apart, so the order is checked by name: a
  // swap would pass every other check and launch with the arguments exchanged.
  int last_arg_slot = -1;      // layout index of the latest call parameter's slot
  int first_hidden_slot = -1;  // layout index of the first hidden pointer's slot
  // A tensor descriptor's slots come together, its parts in DescParts order: the one being
  // read, and how many of its parts are read.
  const TensorDescSpec* desc = nullptr;
  std::vector<std::pair<DescPart, int>> desc_parts;
  size_t desc_read = 0;
  int first_tma_slot = -1;
  auto unfinished = [&](absl::string_view field) {
    const auto [part, index] = desc_parts[desc_read];
    return where.Error(field, absl::StrCat("tensordesc parameter '", kernel.arg(desc->arg).name,
                                           "' lacks its part '", DescPartName(part, index),
                                           "' (its slots are ", desc_parts.size(),
                                           " consecutive parts; docs/pack-format.md)"));
  };
  int64_t end = 0;
  for (size_t i = 0; i < layout->size(); ++i) {
    const json& s = (*layout)[i];
    std::string field = absl::StrCat("layout[", i, "]");
    if (!s.is_object()) {
      return where.Error(field, absl::StrCat("expected an object, got ", TypeOf(s)));
    }
    KPACK_RETURN_IF_ERROR(CheckKeys(s, where, field, {"param", "offset", "size", "part"}));
    SlotSpec slot;
    KPACK_ASSIGN_OR_RETURN(std::string param, GetString(s, "param", where));
    KPACK_ASSIGN_OR_RETURN(int64_t offset, GetInt(s, "offset", where, 0, kMaxParamBytes));
    KPACK_ASSIGN_OR_RETURN(int64_t size, GetInt(s, "size", where, 1, kMaxParamBytes));
    KPACK_ASSIGN_OR_RETURN(std::string part, GetString(s, "part", where, /*required=*/false));
    const bool continues = desc != nullptr && desc_read < desc_parts.size() &&
                           param == kernel.arg(desc->arg).name;
    if (desc != nullptr && desc_read < desc_parts.size() && !continues) {
      return unfinished(absl::StrCat(field, ".param"));
    }
    uint32_t expected_size = 8;
    uint32_t align = 0;  // 0: the slot's size
    std::string what;
    if (continues) {
      slot.kind = SlotKind::kArg;
      slot.arg = desc->arg;
    } else if (param == "$global_scratch" || param == "$profile_scratch") {
      bool& seen = param == "$global_scratch" ? global_seen : profile_seen;
      if (seen) {
        return where.Error(absl::StrCat(field, ".param"), absl::StrCat(param, " appears twice"));
      }
      seen = true;
      if (param == "$global_scratch" && profile_seen) {
        return where.Error(
            absl::StrCat(field, ".param"),
            absl::StrCat("$global_scratch comes after $profile_scratch (layout[", first_hidden_slot,
                         "]); Triton passes global scratch first, so the two would be exchanged"));
      }
      if (first_hidden_slot < 0) first_hidden_slot = static_cast<int>(i);
      slot.kind = param == "$global_scratch" ? SlotKind::kGlobalScratch : SlotKind::kProfileScratch;
      what = absl::StrCat("hidden pointer ", param);
    } else {
      auto it = arg_index.find(param);
      if (it == arg_index.end()) {
        return where.Error(absl::StrCat(field, ".param"),
                           absl::StrCat("'", param,
                                        "' is not a call parameter of the kernel "
                                        "(constexprs are not in the layout)"));
      }
      if (arg_seen[it->second]) {
        return where.Error(absl::StrCat(field, ".param"),
                           absl::StrCat("parameter '", param, "' appears twice"));
      }
      arg_seen[it->second] = true;
      if (first_hidden_slot >= 0) {
        return where.Error(
            absl::StrCat(field, ".param"),
            absl::StrCat("parameter '", param, "' comes after the hidden pointer ",
                         SlotName(kernel, variant.layout[first_hidden_slot]), " (layout[",
                         first_hidden_slot, "]); Triton passes its hidden pointers last"));
      }
      if (last_arg_slot >= 0 && variant.layout[last_arg_slot].arg > it->second) {
        const std::string& before = kernel.arg(variant.layout[last_arg_slot].arg).name;
        return where.Error(
            absl::StrCat(field, ".param"),
            absl::StrCat("parameter '", param, "' comes after '", before, "' (layout[",
                         last_arg_slot, "]), but the kernel declares '", param,
                         "' first; slots follow the declaration order of the call parameters"));
      }
      last_arg_slot = static_cast<int>(i);
      slot.kind = SlotKind::kArg;
      slot.arg = it->second;
      const ParamSpec& p = kernel.arg(it->second);
      if (HasAssumption(variant, it->second, Assumption::kEq1)) {
        return where.Error(absl::StrCat(field, ".param"),
                           absl::StrCat("parameter '", p.name,
                                        "' is assumed eq1, so Triton "
                                        "compiled it away and it can have no slot"));
      }
      if (p.type == ParamType::kTensorDesc) {
        desc = FindDesc(variant, it->second);
        desc_parts = DescParts(*desc);
        desc_read = 0;
      } else {
        ParamType type = variant.arg_types[it->second];
        expected_size = SlotSize(type);
        what = absl::StrCat("parameter '", p.name, "' of type ",
                            type == p.type ? p.type_name : std::string(TypeName(type)));
      }
    }
    if (slot.kind == SlotKind::kArg && kernel.arg(slot.arg).type == ParamType::kTensorDesc) {
      const auto [want, index] = desc_parts[desc_read++];
      const std::string want_name = DescPartName(want, index);
      if (part != want_name) {
        return where.Error(
            absl::StrCat(field, ".part"),
            absl::StrCat(part.empty() ? "missing" : absl::StrCat("'", part, "'"), ": expected '",
                         want_name, "', part ", desc_read, " of ", desc_parts.size(),
                         " of tensordesc parameter '", param, "' (",
                         desc->tma ? "lowered to TMA" : "no TMA metadata", ")"));
      }
      slot.part = want;
      slot.part_index = index;
      expected_size = DescPartSize(want);
      what = absl::StrCat("part '", want_name, "' of tensordesc parameter '", param, "'");
      // A CUtensorMap wants a 64-byte aligned constant-bank address; the buffer offset
      // that gives depends on where the bank's parameters start (ptxas puts the first one
      // at 48 on sm_90), so only a multiple of 16 is checked here, and the common offset
      // modulo 64 below.
      if (want == DescPart::kTma) align = 16;
    } else if (!part.empty()) {
      return where.Error(absl::StrCat(field, ".part"),
                         absl::StrCat("only the slots of a tensordesc parameter have a part; '",
                                      param, "' is not one"));
    }
    if (size != expected_size) {
      return where.Error(absl::StrCat(field, ".size"),
                         absl::StrCat("expected ", expected_size, " for ", what, ", got ", size));
    }
    if (align == 0) align = static_cast<uint32_t>(size);
    if (offset % align != 0) {
      return where.Error(absl::StrCat(field, ".offset"),
                         absl::StrCat(offset, " is not aligned to ", align == size ? "the slot size " : "", align));
    }
    if (offset < end) {
      return where.Error(absl::StrCat(field, ".offset"),
                         absl::StrCat(offset,
                                      " overlaps or precedes the previous slot, "
                                      "which ends at ",
                                      end));
    }
    end = offset + size;
    if (end > kMaxParamBytes) {
      return where.Error(absl::StrCat(field, ".offset"),
                         absl::StrCat("the slot ends at byte ", end, ", past the ", kMaxParamBytes,
                                      "-byte parameter limit"));
    }
    slot.offset = static_cast<uint32_t>(offset);
    slot.size = static_cast<uint32_t>(size);
    if (slot.part == DescPart::kTma) {
      if (first_tma_slot < 0) {
        first_tma_slot = static_cast<int>(i);
        variant.tma_offset_mod64 = slot.offset % 64;
      } else if (slot.offset % 64 != variant.tma_offset_mod64) {
        const SlotSpec& first = variant.layout[first_tma_slot];
        return where.Error(
            absl::StrCat(field, ".offset"),
            absl::StrCat(offset, " is ", offset % 64, " modulo 64, but the CUtensorMap slot of '",
                         kernel.arg(first.arg).name, "' (layout[", first_tma_slot, "]) is at ",
                         first.offset, ", ", variant.tma_offset_mod64,
                         " modulo 64: kpack encodes every CUtensorMap in place, 64-byte aligned, "
                         "so a variant's must share their offset modulo 64"));
      }
    }
    variant.layout.push_back(slot);
  }
  if (desc != nullptr && desc_read < desc_parts.size()) return unfinished("layout");
  for (size_t a = 0; a < arg_seen.size(); ++a) {
    if (!arg_seen[a] && !HasAssumption(variant, static_cast<int>(a), Assumption::kEq1)) {
      return where.Error("layout",
                         absl::StrCat("call parameter '", kernel.params[kernel.args[a]].name,
                                      "' has no slot (only an eq1 parameter may "
                                      "lack one)"));
    }
  }
  variant.param_bytes = static_cast<uint32_t>(end);
  return absl::OkStatus();
}

}  // namespace kpack::internal
