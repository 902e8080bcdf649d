#include "cubin/cubin_reader.h"

#include <gelf.h>
#include <libelf.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <memory>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace kpack::internal {
namespace {

static_assert(std::endian::native == std::endian::little,
              "cubins are little-endian; the record decoding below reads them natively");

// The SM architecture lives in e_flags, in one of two layouts told apart by
// e_ident[EI_ABIVERSION] (read off Triton 3.6's ptxas 12.8 / 12.9 and CUDA 13.0's ptxas
// and nvcc; the names are LLVM's EF_CUDA_* constants):
//   ABI version < 8 (OSABI 0x33): SM in bits 0..7 (EF_CUDA_SM); bit 8 texture mode, bit 10
//     64-bit addresses, bit 11 the sm_XXa variant, bits 16..23 the virtual (PTX) arch.
//     Triton 3.6, sm_90a: 0x005a0d5a; sm_80: 0x00500550.
//   ABI version 8 (OSABI 0x41): SM in bits 8..15 (EF_CUDA_SM_MASK), virtual arch in bits
//     16..23; the low byte holds flags. CUDA 13 ptxas, sm_90a: 0x09005a04; Triton's
//     ptxas-blackwell, sm_100a: 0x0900640a.
// Reading the wrong layout yields a plausible-looking but wrong number (the texture flags
// read as "sm_13"), so the layout is chosen by the ABI version, never guessed from values.
constexpr unsigned kFirstAbiVersionWithSmInBits8To15 = 8;

// st_other bit ptxas sets on kernel entries. Device functions kept out of line in
// relocatable (-rdc) cubins are global STT_FUNC symbols with their own .nv.info and .text
// sections too, but lack this bit; the driver cannot launch them.
constexpr unsigned char kStoCudaEntry = 0x10;

// `.nv.info.<kernel>` is a packed sequence of little-endian records, no padding:
//   u8 format; u8 attribute; u16 value;
// For format EIFMT_SVAL (0x04), `value` is the byte length of a payload that follows the
// 4-byte header. Formats EIFMT_NVAL (0x01, no value), EIFMT_BVAL (0x02, a byte) and
// EIFMT_HVAL (0x03, a half word) carry their value inline: the record is the 4 bytes.
//
// Attribute EIATTR_KPARAM_INFO (0x17) is an SVAL record, one per parameter, in descending
// ordinal order; its 12-byte payload is
//   u32 index;    // always 0 in every cubin seen; ignored
//   u16 ordinal;  // position in the signature
//   u16 offset;   // byte offset in the parameter buffer
//   u32 info;     // bits 0..7: log2 of the pointee alignment, 8..11: space,
//                 // 12..16: constant bank, 17: 0 for a parameter passed in a constant
//                 // bank (the only kind seen), 18..31: the parameter's size in bytes.
// Checked against cuobjdump -elf: Triton 3.6 add_kernel gives ordinal/offset/size
// 0/0/8 1/8/8 2/16/8 3/24/4 4/32/8 5/40/8 (info 0x0021f400 for a pointer, 0x0011f000 for
// the i32); i8/i16/fp16/i64/fp64/i1 scalars give sizes 1/2/2/8/8/1, and hand-written PTX
// with a 128-byte and a 4000-byte .param gives 128 (at offset 48) and 4000.
constexpr uint8_t kEifmtNval = 0x01;
constexpr uint8_t kEifmtHval = 0x03;
constexpr uint8_t kEifmtSval = 0x04;
constexpr uint8_t kEiattrKparamInfo = 0x17;
constexpr size_t kRecordHeaderSize = 4;
constexpr size_t kKparamInfoSize = 12;
constexpr int kKparamSizeShift = 18;

constexpr absl::string_view kInfoPrefix = ".nv.info.";

absl::Status Malformed(absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("not a valid cubin: ", why));
}

std::string ElfError() {
  const char* message = elf_errmsg(-1);
  return message != nullptr ? message : "unknown libelf error";
}

template <typename T>
T Load(std::span<const std::byte> bytes, size_t at) {
  T value;
  std::memcpy(&value, bytes.data() + at, sizeof(T));
  return value;
}

// Whether [offset, offset + size) lies within an image of `image_size` bytes.
bool Within(uint64_t image_size, uint64_t offset, uint64_t size) {
  return offset <= image_size && size <= image_size - offset;
}

struct ElfDeleter {
  void operator()(Elf* elf) const { elf_end(elf); }
};

absl::StatusOr<int> ArchFromHeader(const GElf_Ehdr& header) {
  const unsigned abi_version = header.e_ident[EI_ABIVERSION];
  const uint32_t flags = header.e_flags;
  const int sm =
      abi_version >= kFirstAbiVersionWithSmInBits8To15 ? (flags >> 8) & 0xff : flags & 0xff;
  // Every real SM number has a major version >= 1; a smaller one means the flags are not
  // the layout the ABI version promises.
  if (sm < 10) {
    return Malformed(absl::StrCat("e_flags 0x", absl::Hex(flags), " with ELF ABI version ",
                                  abi_version, " names SM architecture ", sm,
                                  ", which no GPU has"));
  }
  return sm;
}

// Decodes the KPARAM_INFO records of one `.nv.info.<kernel>` section.
absl::StatusOr<std::vector<CubinParam>> ReadParams(std::span<const std::byte> info,
                                                   absl::string_view kernel) {
  std::vector<CubinParam> params;
  size_t pos = 0;
  while (pos < info.size()) {
    const size_t record = pos;
    if (info.size() - pos < kRecordHeaderSize) {
      return Malformed(absl::StrCat(".nv.info.", kernel, ": the record at byte ", record,
                                    " is cut off by the end of the section"));
    }
    const auto format = Load<uint8_t>(info, pos);
    const auto attribute = Load<uint8_t>(info, pos + 1);
    const auto value = Load<uint16_t>(info, pos + 2);
    pos += kRecordHeaderSize;
    if (format >= kEifmtNval && format <= kEifmtHval) {
      if (attribute == kEiattrKparamInfo) {
        return Malformed(absl::StrCat(".nv.info.", kernel, ": the KPARAM_INFO record at byte ",
                                      record, " has no payload (format ", format, ")"));
      }
      continue;
    }
    if (format != kEifmtSval) {
      // The record's length depends on its format, so nothing after it can be found.
      return Malformed(absl::StrCat(".nv.info.", kernel, ": the record at byte ", record,
                                    " has unknown format ", format));
    }
    if (value > info.size() - pos) {
      return Malformed(absl::StrCat(".nv.info.", kernel, ": the record at byte ", record,
                                    " claims ", value, " payload bytes but only ",
                                    info.size() - pos, " remain in the section"));
    }
    const std::span<const std::byte> payload = info.subspan(pos, value);
    pos += value;
    if (attribute != kEiattrKparamInfo) continue;
    if (payload.size() < kKparamInfoSize) {
      return Malformed(absl::StrCat(".nv.info.", kernel, ": the KPARAM_INFO record at byte ",
                                    record, " has ", payload.size(), " payload bytes, not ",
                                    kKparamInfoSize));
    }
    params.push_back({.ordinal = Load<uint16_t>(payload, 4),
                      .offset = Load<uint16_t>(payload, 6),
                      .size = Load<uint32_t>(payload, 8) >> kKparamSizeShift});
  }
  std::sort(params.begin(), params.end(),
            [](const CubinParam& a, const CubinParam& b) { return a.ordinal < b.ordinal; });
  // Callers index parameters by ordinal (cuKernelGetParamInfo's paramIndex), so a gap or a
  // repeat would make the layout ambiguous.
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i].ordinal != i) {
      return Malformed(absl::StrCat(".nv.info.", kernel, ": parameter ordinals must be 0..",
                                    params.size() - 1, " once each, but ordinal ",
                                    params[i].ordinal, " is at position ", i));
    }
  }
  return params;
}

// The bytes of a section, or an error if libelf cannot produce them (out of the file,
// SHT_NOBITS...).
absl::StatusOr<std::span<const std::byte>> SectionBytes(Elf_Scn* section, absl::string_view name) {
  GElf_Shdr header;
  if (gelf_getshdr(section, &header) == nullptr) {
    return Malformed(absl::StrCat("section ", name, ": ", ElfError()));
  }
  if (header.sh_size == 0) return std::span<const std::byte>();
  Elf_Data* data = elf_getdata(section, nullptr);
  if (data == nullptr || data->d_buf == nullptr) {
    return Malformed(absl::StrCat("section ", name, " has no readable contents (",
                                  data == nullptr ? ElfError() : "SHT_NOBITS", ")"));
  }
  return std::span<const std::byte>(static_cast<const std::byte*>(data->d_buf), data->d_size);
}

}  // namespace

absl::StatusOr<CubinInfo> ReadCubin(std::span<const std::byte> image) {
  if (image.size() < sizeof(Elf64_Ehdr)) {
    return Malformed(absl::StrCat("the image is ", image.size(),
                                  " bytes, shorter than an ELF64 header (", sizeof(Elf64_Ehdr),
                                  " bytes)"));
  }
  const auto* ident = reinterpret_cast<const unsigned char*>(image.data());
  if (std::memcmp(ident, ELFMAG, SELFMAG) != 0) {
    return Malformed("it does not start with the ELF magic \\x7fELF");
  }
  if (ident[EI_CLASS] != ELFCLASS64 || ident[EI_DATA] != ELFDATA2LSB) {
    return Malformed("it is not a little-endian ELF64 file, which every cubin is");
  }

  static const bool libelf_ready = elf_version(EV_CURRENT) != EV_NONE;
  if (!libelf_ready) return absl::InternalError("libelf does not support ELF version 1");
  // elf_memory takes a writable buffer and may convert data in place; a private copy keeps
  // the caller's bytes untouched. It must outlive `elf`.
  std::vector<char> copy(image.size());
  std::memcpy(copy.data(), image.data(), image.size());
  std::unique_ptr<Elf, ElfDeleter> elf(elf_memory(copy.data(), copy.size()));
  if (elf == nullptr || elf_kind(elf.get()) != ELF_K_ELF) {
    return Malformed(absl::StrCat("libelf cannot read it: ", ElfError()));
  }
  GElf_Ehdr header;
  if (gelf_getehdr(elf.get(), &header) == nullptr) {
    return Malformed(absl::StrCat("its ELF header is unreadable: ", ElfError()));
  }
  if (header.e_machine != EM_CUDA) {
    return Malformed(
        absl::StrCat("e_machine is ", header.e_machine, ", not EM_CUDA (", EM_CUDA, ")"));
  }
  absl::StatusOr<int> arch = ArchFromHeader(header);
  if (!arch.ok()) return arch.status();
  // libelf reads only what is asked of it, so a truncated file would otherwise pass as long
  // as the cut fell in parts this reader never looks at (code, program headers).
  if (!Within(image.size(), header.e_phoff, uint64_t{header.e_phnum} * header.e_phentsize)) {
    return Malformed("its program header table runs past the end of the image (truncated?)");
  }

  size_t names_index;
  if (elf_getshdrstrndx(elf.get(), &names_index) != 0) {
    return Malformed(absl::StrCat("it has no section-name table: ", ElfError()));
  }
  Elf_Scn* symtab = nullptr;
  GElf_Shdr symtab_header{};
  // Keys point into `copy`, which outlives the map.
  absl::flat_hash_map<absl::string_view, Elf_Scn*> info_sections;
  for (Elf_Scn* section = elf_nextscn(elf.get(), nullptr); section != nullptr;
       section = elf_nextscn(elf.get(), section)) {
    GElf_Shdr section_header;
    if (gelf_getshdr(section, &section_header) == nullptr) {
      return Malformed(absl::StrCat("a section header is unreadable: ", ElfError()));
    }
    if (section_header.sh_type != SHT_NOBITS &&
        !Within(image.size(), section_header.sh_offset, section_header.sh_size)) {
      return Malformed(absl::StrCat("section ", elf_ndxscn(section),
                                    " runs past the end of the image (truncated?)"));
    }
    if (section_header.sh_type == SHT_SYMTAB) {
      if (symtab != nullptr) return Malformed("it has two symbol tables");
      symtab = section;
      symtab_header = section_header;
      continue;
    }
    const char* name = elf_strptr(elf.get(), names_index, section_header.sh_name);
    if (name == nullptr) {
      return Malformed(absl::StrCat("section ", elf_ndxscn(section),
                                    " has a name outside the section-name table"));
    }
    absl::string_view kernel = name;
    if (!absl::ConsumePrefix(&kernel, kInfoPrefix)) continue;
    if (!info_sections.emplace(kernel, section).second) {
      return Malformed(absl::StrCat("it has two sections named ", name));
    }
  }
  if (symtab == nullptr) return Malformed("it has no symbol table (.symtab)");
  Elf_Data* symbols = elf_getdata(symtab, nullptr);
  if (symbols == nullptr || (symbols->d_size > 0 && symbols->d_buf == nullptr)) {
    return Malformed(absl::StrCat("its symbol table is unreadable: ", ElfError()));
  }
  const size_t symbol_count = symbols->d_size / sizeof(Elf64_Sym);

  CubinInfo info;
  info.arch = *arch;
  absl::flat_hash_set<absl::string_view> seen;
  for (size_t i = 0; i < symbol_count; ++i) {
    GElf_Sym symbol;
    if (gelf_getsym(symbols, static_cast<int>(i), &symbol) == nullptr) {
      return Malformed(absl::StrCat("symbol ", i, " is unreadable: ", ElfError()));
    }
    if (GELF_ST_TYPE(symbol.st_info) != STT_FUNC || GELF_ST_BIND(symbol.st_info) != STB_GLOBAL ||
        (symbol.st_other & kStoCudaEntry) == 0) {
      continue;
    }
    const char* name = elf_strptr(elf.get(), symtab_header.sh_link, symbol.st_name);
    if (name == nullptr || name[0] == '\0') {
      return Malformed(absl::StrCat("kernel symbol ", i, " has no name in the string table"));
    }
    const absl::string_view kernel = name;
    if (!seen.insert(kernel).second) {
      return Malformed(absl::StrCat("it has two kernels named '", kernel, "'"));
    }
    auto section = info_sections.find(kernel);
    if (section == info_sections.end()) {
      return Malformed(absl::StrCat("kernel '", kernel, "' has no .nv.info.", kernel,
                                    " section, which holds its parameter layout"));
    }
    absl::StatusOr<std::span<const std::byte>> bytes =
        SectionBytes(section->second, absl::StrCat(kInfoPrefix, kernel));
    if (!bytes.ok()) return bytes.status();
    absl::StatusOr<std::vector<CubinParam>> params = ReadParams(*bytes, kernel);
    if (!params.ok()) return params.status();
    info.kernels.push_back({.name = std::string(kernel), .params = *std::move(params)});
  }
  std::sort(info.kernels.begin(), info.kernels.end(),
            [](const CubinKernel& a, const CubinKernel& b) { return a.name < b.name; });
  return info;
}

uint32_t ParamBufferSize(const CubinKernel& kernel) {
  uint32_t end = 0;
  for (const CubinParam& param : kernel.params) end = std::max(end, param.offset + param.size);
  return end;
}

}  // namespace kpack::internal
