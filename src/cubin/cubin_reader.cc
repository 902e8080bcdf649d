// The cubin reader (cubin_reader.h): the ELF header's architecture, the section table and
// symbol table bounds-checked, and each entry's `.nv.info` records decoded.

#include "cubin/cubin_reader.h"

#include <elf.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <utility>
#include <vector>

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
// EIATTR_MAX_THREADS (0x05) and EIATTR_REQNTID (0x10): SVAL records whose 12-byte payload
// is three u32, x, y, z, from the PTX directives `.maxntid` and `.reqntid`. Checked
// against cuobjdump -elf: Triton 3.6 add_kernel with num_warps=4 has REQNTID 128 1 1, a
// num_warps=8 matmul 256 1 1.
constexpr uint8_t kEiattrMaxThreads = 0x05;
constexpr uint8_t kEiattrReqntid = 0x10;
constexpr size_t kBlockShapeSize = 12;
constexpr size_t kRecordHeaderSize = 4;
constexpr size_t kKparamInfoSize = 12;
constexpr int kKparamSizeShift = 18;

constexpr absl::string_view kInfoPrefix = ".nv.info.";

absl::Status Malformed(absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("not a valid cubin: ", why));
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

absl::StatusOr<int> ArchFromHeader(const Elf64_Ehdr& header) {
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

// Decodes the KPARAM_INFO, REQNTID and MAX_THREADS records of one `.nv.info.<kernel>`
// section into `out` (named already).
absl::Status ReadInfo(std::span<const std::byte> info, absl::string_view kernel,
                      CubinKernel& out) {
  std::vector<CubinParam>& params = out.params;
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
    if (attribute == kEiattrReqntid || attribute == kEiattrMaxThreads) {
      if (payload.size() != kBlockShapeSize) {
        return Malformed(absl::StrCat(".nv.info.", kernel, ": the ",
                                      attribute == kEiattrReqntid ? "REQNTID" : "MAX_THREADS",
                                      " record at byte ", record, " has ", payload.size(),
                                      " payload bytes, not ", kBlockShapeSize));
      }
      (attribute == kEiattrReqntid ? out.required_block : out.max_block) =
          std::array<uint32_t, 3>{Load<uint32_t>(payload, 0), Load<uint32_t>(payload, 4),
                                  Load<uint32_t>(payload, 8)};
      continue;
    }
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
  return absl::OkStatus();
}

// The image's section header table, every entry checked to lie inside the image.
class Sections {
 public:
  // Reads and bounds-checks the table (and the extended section count and name-table
  // index that ELF keeps in section 0 when the header's fields overflow).
  static absl::StatusOr<Sections> Read(std::span<const std::byte> image, const Elf64_Ehdr& header) {
    Sections s(image);
    if (header.e_shoff == 0) return s;  // no sections at all
    if (header.e_shentsize != sizeof(Elf64_Shdr)) {
      return Malformed(
          absl::StrCat("e_shentsize is ", header.e_shentsize, ", not ", sizeof(Elf64_Shdr)));
    }
    const uint64_t size = image.size();
    if (!Within(size, header.e_shoff, sizeof(Elf64_Shdr))) {
      return Malformed("its section header table starts past the end of the image (truncated?)");
    }
    s.table_ = header.e_shoff;
    uint64_t count = header.e_shnum;
    uint64_t names = header.e_shstrndx;
    const Elf64_Shdr first = s.Header(0);
    if (count == 0) count = first.sh_size;  // SHN_LORESERVE or more sections
    if (names == SHN_XINDEX) names = first.sh_link;
    if (count > (size - header.e_shoff) / sizeof(Elf64_Shdr)) {
      return Malformed(absl::StrCat("its ", count,
                                    " section headers run past the end of the image (truncated?)"));
    }
    s.count_ = count;
    for (uint64_t i = 1; i < count; ++i) {
      const Elf64_Shdr section = s.Header(i);
      if (section.sh_type != SHT_NOBITS && !Within(size, section.sh_offset, section.sh_size)) {
        return Malformed(absl::StrCat("section ", i, " (bytes ", section.sh_offset, " to ",
                                      section.sh_offset + section.sh_size,
                                      ") runs past the end of the image of ", size,
                                      " bytes (truncated?)"));
      }
    }
    if (names == SHN_UNDEF || names >= count || s.Header(names).sh_type != SHT_STRTAB) {
      return Malformed(absl::StrCat("it has no section-name table (index ", names, ")"));
    }
    s.names_ = names;
    return s;
  }

  uint64_t count() const { return count_; }
  uint64_t names() const { return names_; }
  Elf64_Shdr Header(uint64_t i) const {
    return Load<Elf64_Shdr>(image_, table_ + i * sizeof(Elf64_Shdr));
  }
  // The file bytes of section `i` (empty for SHT_NOBITS; Read checked the bounds).
  std::span<const std::byte> Bytes(uint64_t i) const {
    const Elf64_Shdr h = Header(i);
    if (h.sh_type == SHT_NOBITS) return {};
    return image_.subspan(h.sh_offset, h.sh_size);
  }
  // The NUL-terminated string at `offset` in string table `table`, or nullopt when
  // `table` is no string table or the string leaves it.
  std::optional<absl::string_view> String(uint64_t table, uint64_t offset) const {
    if (table == SHN_UNDEF || table >= count_ || Header(table).sh_type != SHT_STRTAB) {
      return std::nullopt;
    }
    const std::span<const std::byte> bytes = Bytes(table);
    if (offset >= bytes.size()) return std::nullopt;
    const char* begin = reinterpret_cast<const char*>(bytes.data()) + offset;
    const void* nul = std::memchr(begin, '\0', bytes.size() - offset);
    if (nul == nullptr) return std::nullopt;
    return absl::string_view(begin, static_cast<const char*>(nul) - begin);
  }

 private:
  explicit Sections(std::span<const std::byte> image) : image_(image) {}
  std::span<const std::byte> image_;
  uint64_t table_ = 0;
  uint64_t count_ = 0;
  uint64_t names_ = 0;
};

}  // namespace

absl::StatusOr<CubinInfo> ReadCubin(std::span<const std::byte> image) {
  if (image.size() < sizeof(Elf64_Ehdr)) {
    return Malformed(absl::StrCat("the image is ", image.size(),
                                  " bytes, shorter than an ELF64 header (", sizeof(Elf64_Ehdr),
                                  " bytes)"));
  }
  const auto header = Load<Elf64_Ehdr>(image, 0);
  if (std::memcmp(header.e_ident, ELFMAG, SELFMAG) != 0) {
    return Malformed("it does not start with the ELF magic \\x7fELF");
  }
  if (header.e_ident[EI_CLASS] != ELFCLASS64 || header.e_ident[EI_DATA] != ELFDATA2LSB) {
    return Malformed("it is not a little-endian ELF64 file, which every cubin is");
  }
  if (header.e_machine != EM_CUDA) {
    return Malformed(
        absl::StrCat("e_machine is ", header.e_machine, ", not EM_CUDA (", EM_CUDA, ")"));
  }
  absl::StatusOr<int> arch = ArchFromHeader(header);
  if (!arch.ok()) return arch.status();
  // cuLibraryLoadData takes no size: the driver finds the image's extent in its headers
  // and reads that far. So every header and every part of the file they describe must lie
  // inside the bytes we have, including the parts this reader has no other use for.
  if (header.e_phnum != 0) {
    if (header.e_phentsize != sizeof(Elf64_Phdr)) {
      return Malformed(
          absl::StrCat("e_phentsize is ", header.e_phentsize, ", not ", sizeof(Elf64_Phdr)));
    }
    if (!Within(image.size(), header.e_phoff, uint64_t{header.e_phnum} * sizeof(Elf64_Phdr))) {
      return Malformed("its program header table runs past the end of the image (truncated?)");
    }
    for (uint64_t i = 0; i < header.e_phnum; ++i) {
      const auto segment = Load<Elf64_Phdr>(image, header.e_phoff + i * sizeof(Elf64_Phdr));
      if (!Within(image.size(), segment.p_offset, segment.p_filesz)) {
        return Malformed(absl::StrCat("segment ", i, " runs past the end of the image of ",
                                      image.size(), " bytes (truncated?)"));
      }
    }
  }
  absl::StatusOr<Sections> read = Sections::Read(image, header);
  if (!read.ok()) return read.status();
  const Sections& sections = *read;

  uint64_t symtab = 0;
  absl::flat_hash_map<absl::string_view, uint64_t> info_sections;  // views into `image`
  for (uint64_t i = 1; i < sections.count(); ++i) {
    const Elf64_Shdr section = sections.Header(i);
    if (section.sh_type == SHT_SYMTAB) {
      if (symtab != 0) return Malformed("it has two symbol tables");
      symtab = i;
      continue;
    }
    const std::optional<absl::string_view> name =
        sections.String(sections.names(), section.sh_name);
    if (!name.has_value()) {
      return Malformed(absl::StrCat("section ", i, " has a name outside the section-name table"));
    }
    absl::string_view kernel = *name;
    if (!absl::ConsumePrefix(&kernel, kInfoPrefix)) continue;
    if (!info_sections.emplace(kernel, i).second) {
      return Malformed(absl::StrCat("it has two sections named ", *name));
    }
  }
  if (symtab == 0) return Malformed("it has no symbol table (.symtab)");
  const Elf64_Shdr symtab_header = sections.Header(symtab);
  if (symtab_header.sh_entsize != sizeof(Elf64_Sym)) {
    return Malformed(absl::StrCat("its symbol table's entries are ", symtab_header.sh_entsize,
                                  " bytes, not ", sizeof(Elf64_Sym)));
  }
  const std::span<const std::byte> symbols = sections.Bytes(symtab);
  const size_t symbol_count = symbols.size() / sizeof(Elf64_Sym);

  CubinInfo info;
  info.arch = *arch;
  absl::flat_hash_set<absl::string_view> seen;
  for (size_t i = 0; i < symbol_count; ++i) {
    const auto symbol = Load<Elf64_Sym>(symbols, i * sizeof(Elf64_Sym));
    if (ELF64_ST_TYPE(symbol.st_info) != STT_FUNC || ELF64_ST_BIND(symbol.st_info) != STB_GLOBAL ||
        (symbol.st_other & kStoCudaEntry) == 0) {
      continue;
    }
    const std::optional<absl::string_view> name =
        sections.String(symtab_header.sh_link, symbol.st_name);
    if (!name.has_value() || name->empty()) {
      return Malformed(absl::StrCat("kernel symbol ", i, " has no name in the string table"));
    }
    const absl::string_view kernel = *name;
    if (!seen.insert(kernel).second) {
      return Malformed(absl::StrCat("it has two kernels named '", kernel, "'"));
    }
    auto section = info_sections.find(kernel);
    if (section == info_sections.end()) {
      return Malformed(absl::StrCat("kernel '", kernel, "' has no .nv.info.", kernel,
                                    " section, which holds its parameter layout"));
    }
    const Elf64_Shdr info_header = sections.Header(section->second);
    if (info_header.sh_type == SHT_NOBITS && info_header.sh_size != 0) {
      return Malformed(
          absl::StrCat("section .nv.info.", kernel, " has no readable contents (SHT_NOBITS)"));
    }
    CubinKernel& entry = info.kernels.emplace_back();
    entry.name = std::string(kernel);
    if (absl::Status s = ReadInfo(sections.Bytes(section->second), kernel, entry); !s.ok()) {
      return s;
    }
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
