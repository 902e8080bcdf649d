#include "cubin/cubin_reader.h"

#include <elf.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kpack::internal {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

MATCHER_P3(IsParam, ordinal, offset, size, "") {
  return arg.ordinal == static_cast<uint32_t>(ordinal) &&
         arg.offset == static_cast<uint32_t>(offset) && arg.size == static_cast<uint32_t>(size);
}

// Triton 3.6 add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: constexpr) for sm_90a; see
// testdata/make_add_cubin.py.
std::vector<std::byte> Fixture() {
  std::ifstream file(KPACK_TESTDATA_DIR "/add.cubin", std::ios::binary);
  std::vector<char> chars((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  std::vector<std::byte> bytes(chars.size());
  std::memcpy(bytes.data(), chars.data(), chars.size());
  return bytes;
}

template <typename T>
void Store(std::vector<std::byte>& image, size_t at, T value) {
  std::memcpy(image.data() + at, &value, sizeof(T));
}

// Offset of the first occurrence of `needle` in `image` (the test fails if absent).
size_t Find(const std::vector<std::byte>& image, std::string_view needle) {
  const std::string_view haystack(reinterpret_cast<const char*>(image.data()), image.size());
  const size_t at = haystack.find(needle);
  EXPECT_NE(at, std::string_view::npos) << "fixture lacks " << needle;
  return at;
}

// The first KPARAM_INFO record header: format SVAL, attribute 0x17, 12 payload bytes.
size_t FirstKparamRecord(const std::vector<std::byte>& image) {
  return Find(image, std::string_view("\x04\x17\x0c\x00", 4));
}

void ExpectInvalid(const absl::StatusOr<CubinInfo>& result, std::string_view why) {
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(result.status().message(), HasSubstr(why));
}

TEST(CubinReaderTest, ReadsTritonAddKernel) {
  const std::vector<std::byte> image = Fixture();
  ASSERT_FALSE(image.empty());
  absl::StatusOr<CubinInfo> info = ReadCubin(image);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->arch, 90);
  ASSERT_EQ(info->kernels.size(), 1u);
  const CubinKernel& kernel = info->kernels[0];
  EXPECT_EQ(kernel.name, "add_kernel");
  // x, y, out, n, then Triton's hidden global_scratch and profile_scratch pointers.
  EXPECT_THAT(kernel.params, ElementsAre(IsParam(0, 0, 8), IsParam(1, 8, 8), IsParam(2, 16, 8),
                                         IsParam(3, 24, 4), IsParam(4, 32, 8), IsParam(5, 40, 8)));
  EXPECT_EQ(ParamBufferSize(kernel), 48u);
}

TEST(CubinReaderTest, DecodesBothEflagsLayouts) {
  std::vector<std::byte> image = Fixture();
  // ABI version 8 (CUDA 13 ptxas): the SM sits in bits 8..15. Value of a real sm_100a cubin.
  image[EI_ABIVERSION] = std::byte{8};
  Store<uint32_t>(image, offsetof(Elf64_Ehdr, e_flags), 0x0900640a);
  absl::StatusOr<CubinInfo> info = ReadCubin(image);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->arch, 100);

  // ABI version 7 (ptxas 12.x): the SM is the low byte. Value of a real Triton sm_80 cubin.
  image[EI_ABIVERSION] = std::byte{7};
  Store<uint32_t>(image, offsetof(Elf64_Ehdr, e_flags), 0x00500550);
  info = ReadCubin(image);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->arch, 80);

  // The old layout read as the new one gives a nonsense SM.
  image[EI_ABIVERSION] = std::byte{8};
  Store<uint32_t>(image, offsetof(Elf64_Ehdr, e_flags), 0x00000550);
  ExpectInvalid(ReadCubin(image), "SM architecture 5");
}

TEST(CubinReaderTest, RejectsEmpty) {
  ExpectInvalid(ReadCubin({}), "shorter than an ELF64 header");
}

TEST(CubinReaderTest, RejectsNonElf) {
  const std::string text(200, 'x');
  ExpectInvalid(ReadCubin(std::as_bytes(std::span(text))), "ELF magic");
}

TEST(CubinReaderTest, RejectsNonCudaElf) {
  std::vector<std::byte> image = Fixture();
  Store<uint16_t>(image, offsetof(Elf64_Ehdr, e_machine), EM_X86_64);
  ExpectInvalid(ReadCubin(image), "EM_CUDA");
}

TEST(CubinReaderTest, RejectsTruncated) {
  const std::vector<std::byte> image = Fixture();
  for (size_t size : {size_t{10}, size_t{64}, size_t{200}, image.size() / 2, image.size() - 1}) {
    SCOPED_TRACE(size);
    const absl::StatusOr<CubinInfo> info = ReadCubin(std::span(image).first(size));
    ASSERT_FALSE(info.ok());
    EXPECT_EQ(info.status().code(), absl::StatusCode::kInvalidArgument);
  }
}

TEST(CubinReaderTest, RejectsKernelWithoutInfoSection) {
  std::vector<std::byte> image = Fixture();
  // Rename the section in the section-name table.
  Store<char>(image, Find(image, ".nv.info.add_kernel") + 9, 'A');
  ExpectInvalid(ReadCubin(image), "kernel 'add_kernel' has no .nv.info.add_kernel section");
}

TEST(CubinReaderTest, RejectsMissingSymbolTable) {
  std::vector<std::byte> image = Fixture();
  Elf64_Ehdr header;
  std::memcpy(&header, image.data(), sizeof(header));
  for (int i = 0; i < header.e_shnum; ++i) {
    const size_t type_at = header.e_shoff + i * header.e_shentsize + offsetof(Elf64_Shdr, sh_type);
    uint32_t type;
    std::memcpy(&type, image.data() + type_at, sizeof(type));
    if (type == SHT_SYMTAB) Store<uint32_t>(image, type_at, SHT_PROGBITS);
  }
  ExpectInvalid(ReadCubin(image), "no symbol table");
}

TEST(CubinReaderTest, RejectsKparamRecordPastSectionEnd) {
  std::vector<std::byte> image = Fixture();
  Store<uint16_t>(image, FirstKparamRecord(image) + 2, 0xfff0);
  ExpectInvalid(ReadCubin(image), "payload bytes but only");
}

TEST(CubinReaderTest, RejectsShortKparamPayload) {
  std::vector<std::byte> image = Fixture();
  // Claim 4 payload bytes: the rest of the old payload then reads as records of format 0.
  Store<uint16_t>(image, FirstKparamRecord(image) + 2, 4);
  ExpectInvalid(ReadCubin(image), "has 4 payload bytes, not 12");
}

TEST(CubinReaderTest, RejectsRepeatedOrdinal) {
  std::vector<std::byte> image = Fixture();
  // The first record describes ordinal 5; make it a second ordinal 4.
  Store<uint16_t>(image, FirstKparamRecord(image) + 4 + 4, 4);
  ExpectInvalid(ReadCubin(image), "ordinals must be 0..5 once each");
}

TEST(CubinReaderTest, RejectsUnknownRecordFormat) {
  std::vector<std::byte> image = Fixture();
  image[FirstKparamRecord(image)] = std::byte{0x09};
  ExpectInvalid(ReadCubin(image), "unknown format 9");
}

// A cheap stand-in for the fuzzer: corrupted and truncated fixtures must give a status,
// never a crash (run under ASan/UBSan to make that meaningful).
TEST(CubinReaderTest, SurvivesCorruption) {
  const std::vector<std::byte> fixture = Fixture();
  std::mt19937 rng(1234);
  int accepted = 0;
  for (int iteration = 0; iteration < 3000; ++iteration) {
    std::vector<std::byte> image = fixture;
    const int flips = 1 + static_cast<int>(rng() % 8);
    for (int i = 0; i < flips; ++i) {
      // Bias towards the headers, where a bad value reaches the most code.
      const size_t limit = (rng() % 2 == 0) ? 256 : image.size();
      image[rng() % limit] = static_cast<std::byte>(rng());
    }
    if (rng() % 4 == 0) image.resize(rng() % image.size());
    const absl::StatusOr<CubinInfo> info = ReadCubin(image);
    if (info.ok()) {
      ++accepted;
    } else {
      EXPECT_EQ(info.status().code(), absl::StatusCode::kInvalidArgument) << info.status();
    }
  }
  // Most single-byte changes land in code or padding and leave a valid cubin.
  EXPECT_GT(accepted, 0);
}

}  // namespace
}  // namespace kpack::internal
