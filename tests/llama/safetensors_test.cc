// The safetensors reader: a valid file read back, then one test per hostile file, each
// error naming the file and the tensor at fault.

#include "safetensors.h"

#include <unistd.h>

#include <cstring>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "test_files.h"

namespace kpack::llama {
namespace {

using ::kpack::llama::testing::Safetensors;
using ::kpack::llama::testing::SafetensorsOf;
using ::kpack::llama::testing::TempDir;
using ::kpack::llama::testing::TensorSpec;
using ::kpack::llama::testing::WriteFile;
using ::testing::HasSubstr;

class LlamaSafetensorsTest : public ::testing::Test {
 protected:
  // Writes `bytes` as a file and opens it; the error, or OK.
  absl::Status OpenBytes(const std::string& bytes) {
    WriteFile(path_, bytes);
    absl::StatusOr<SafetensorsFile> f = SafetensorsFile::Open(path_);
    return f.ok() ? absl::OkStatus() : f.status();
  }
  // A file whose header is `header` and whose data region is `data_bytes` zero bytes.
  absl::Status OpenHeader(const std::string& header, size_t data_bytes) {
    return OpenBytes(Safetensors(header, std::string(data_bytes, '\0')));
  }

  TempDir dir_;
  std::string path_ = dir_.file("model.safetensors");
};

TEST_F(LlamaSafetensorsTest, ReadsTensorsAndMetadata) {
  std::string a_bytes(2 * 3 * 2, '\0');
  for (size_t i = 0; i < a_bytes.size(); ++i) a_bytes[i] = static_cast<char>(i + 1);
  WriteFile(path_, SafetensorsOf({{"b.weight", {"F32", {4}, ""}},
                                  {"a.weight", {"BF16", {2, 3}, a_bytes}},
                                  {"empty", {"BF16", {0, 5}, ""}}},
                                 {{"format", "pt"}}));
  absl::StatusOr<SafetensorsFile> f = SafetensorsFile::Open(path_);
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_EQ(f->tensors().size(), 3u);
  EXPECT_EQ(f->tensors()[0].name, "a.weight");  // sorted by name
  const TensorInfo* a = f->Find("a.weight");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->dtype, "BF16");
  EXPECT_EQ(a->dtype_size, 2u);
  EXPECT_EQ(a->shape, (std::vector<int64_t>{2, 3}));
  ASSERT_EQ(f->Data(*a).size(), a_bytes.size());
  EXPECT_EQ(std::memcmp(f->Data(*a).data(), a_bytes.data(), a_bytes.size()), 0);
  EXPECT_EQ(f->Find("b.weight")->bytes(), 16u);
  EXPECT_EQ(f->Find("empty")->bytes(), 0u);
  EXPECT_EQ(f->Find("c.weight"), nullptr);
  EXPECT_EQ(f->metadata().at("format"), "pt");
  EXPECT_EQ(f->path(), path_);
}

TEST_F(LlamaSafetensorsTest, MissingFileIsNotFound) {
  absl::StatusOr<SafetensorsFile> f = SafetensorsFile::Open(dir_.file("absent.safetensors"));
  EXPECT_EQ(f.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(f.status().message(), HasSubstr("absent.safetensors"));
}

TEST_F(LlamaSafetensorsTest, ShorterThanTheHeaderLength) {
  for (size_t n : {0, 1, 7}) {
    const absl::Status s = OpenBytes(std::string(n, '\x10'));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), HasSubstr(path_ + ": truncated: " + std::to_string(n) + " bytes"));
  }
}

TEST_F(LlamaSafetensorsTest, HeaderLengthPastTheFile) {
  const absl::Status s = OpenBytes(Safetensors("{}", "", /*header_length=*/1000));
  EXPECT_THAT(s.message(), HasSubstr("header length 1000 runs past the file's 10 bytes"));
  // A length near 2^64 must not wrap.
  EXPECT_THAT(OpenBytes(Safetensors("{}", "", ~uint64_t{0} - 4)).message(),
              HasSubstr("runs past the file"));
}

TEST_F(LlamaSafetensorsTest, HeaderAboveTheFormatsLimit) {
  // A sparse file of 128 MB whose header claims 110 MB: refused before parsing.
  WriteFile(path_, Safetensors("{}", "", 110'000'000));
  ASSERT_EQ(truncate(path_.c_str(), 128 << 20), 0);
  absl::StatusOr<SafetensorsFile> f = SafetensorsFile::Open(path_);
  EXPECT_THAT(f.status().message(), HasSubstr("exceeds the format's limit of 100000000 bytes"));
}

TEST_F(LlamaSafetensorsTest, MalformedJson) {
  const absl::Status s = OpenHeader(R"({"a": {"dtype": "BF16", "shape": [1]})", 0);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("header is not valid JSON"));
  EXPECT_THAT(OpenHeader("[]", 0).message(), HasSubstr("header is not a JSON object"));
  EXPECT_THAT(OpenHeader("", 0).message(), HasSubstr("header is not valid JSON"));
}

TEST_F(LlamaSafetensorsTest, EntryNotAnObject) {
  EXPECT_THAT(OpenHeader(R"({"model.norm.weight": [1, 2]})", 0).message(),
              HasSubstr("tensor 'model.norm.weight' is not a JSON object"));
}

TEST_F(LlamaSafetensorsTest, MissingDtype) {
  EXPECT_THAT(OpenHeader(R"({"w": {"shape": [2], "data_offsets": [0, 4]}})", 4).message(),
              HasSubstr("tensor 'w' has no \"dtype\" string"));
}

TEST_F(LlamaSafetensorsTest, UnknownDtype) {
  const absl::Status s =
      OpenHeader(R"({"w": {"dtype": "BF17", "shape": [2], "data_offsets": [0, 4]}})", 4);
  EXPECT_THAT(s.message(),
              HasSubstr(path_ + ": tensor 'w' has an unknown or unsupported dtype 'BF17'"));
}

TEST_F(LlamaSafetensorsTest, BadShape) {
  EXPECT_THAT(OpenHeader(R"({"w": {"dtype": "BF16", "shape": [2, -1], "data_offsets": [0, 4]}})", 4)
                  .message(),
              HasSubstr("tensor 'w' has a shape entry that is not a non-negative integer"));
  EXPECT_THAT(
      OpenHeader(R"({"w": {"dtype": "BF16", "shape": "2", "data_offsets": [0, 4]}})", 4).message(),
      HasSubstr("tensor 'w' has no \"shape\" array"));
}

TEST_F(LlamaSafetensorsTest, BadOffsets) {
  EXPECT_THAT(
      OpenHeader(R"({"w": {"dtype": "BF16", "shape": [2], "data_offsets": [0]}})", 4).message(),
      HasSubstr("tensor 'w' has no \"data_offsets\" pair"));
  EXPECT_THAT(
      OpenHeader(R"({"w": {"dtype": "BF16", "shape": [2], "data_offsets": [4, 0]}})", 4).message(),
      HasSubstr("tensor 'w' has data_offsets [4, 0] that end before they begin"));
}

TEST_F(LlamaSafetensorsTest, OffsetsPastTheData) {
  // The header promises 8 bytes; the file was cut after 6.
  const absl::Status s =
      OpenHeader(R"({"w": {"dtype": "BF16", "shape": [4], "data_offsets": [0, 8]}})", 6);
  EXPECT_THAT(s.message(), HasSubstr("tensor 'w' has data_offsets [0, 8] past the data region's 6 "
                                     "bytes (the file is truncated"));
}

TEST_F(LlamaSafetensorsTest, OffsetsDisagreeWithDtypeAndShape) {
  const absl::Status s =
      OpenHeader(R"({"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 12]}})", 12);
  EXPECT_THAT(s.message(), HasSubstr("tensor 'w' has data_offsets [0, 12] covering 12 bytes, but "
                                     "dtype F32 and shape [2, 3] need 24"));
  // Element counts that overflow 64 bits do not wrap into a match.
  EXPECT_THAT(OpenHeader(R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296],
                              "data_offsets": [0, 0]}})",
                         0)
                  .message(),
              HasSubstr("need more than 2^64"));
}

TEST_F(LlamaSafetensorsTest, OverlappingTensors) {
  const absl::Status s =
      OpenHeader(R"({"a": {"dtype": "BF16", "shape": [4], "data_offsets": [0, 8]},
                                       "b": {"dtype": "BF16", "shape": [4], "data_offsets": [4, 12]}})",
                 12);
  EXPECT_THAT(s.message(),
              HasSubstr("tensor 'b' (data_offsets [4, 12]) overlaps tensor 'a' ([0, 8])"));
}

TEST_F(LlamaSafetensorsTest, BytesBelongingToNoTensor) {
  const absl::Status gap =
      OpenHeader(R"({"a": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]},
                                         "b": {"dtype": "BF16", "shape": [2], "data_offsets": [6, 10]}})",
                 10);
  EXPECT_THAT(gap.message(),
              HasSubstr("tensor 'b' (data_offsets [6, 10]) leaves bytes [4, 6) of the data region "
                        "unused after tensor 'a'"));
  EXPECT_THAT(
      OpenHeader(R"({"a": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]}})", 9).message(),
      HasSubstr("the data region has 5 bytes after the last tensor's data"));
}

TEST_F(LlamaSafetensorsTest, MetadataMustBeStrings) {
  EXPECT_THAT(OpenHeader(R"({"__metadata__": {"format": 1}})", 0).message(),
              HasSubstr("__metadata__ entry 'format' is not a string"));
  EXPECT_THAT(OpenHeader(R"({"__metadata__": "pt"})", 0).message(),
              HasSubstr("__metadata__ is not a JSON object"));
}

}  // namespace
}  // namespace kpack::llama
