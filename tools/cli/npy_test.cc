#include "npy.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kpack::cli {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// Exact bytes written by numpy 2.4.6 (np.save, or numpy.lib.format.write_array for the
// 2.0 and 3.0 files), generated once and pasted here so the tests need no Python.
// array([[0., 1., 2.], [3., 4., 5.]], dtype=float32)
constexpr char kNumpyF32[] =
    "\223NUMPY\001\000v\000"
    "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }     "
    "                                                     \n"
    "\000\000\000\000\000\000\200\077\000\000\000\100\000\000\100\100"
    "\000\000\200\100\000\000\240\100";

// array([ -1, 0, 127], dtype=int8)
constexpr char kNumpyI8[] =
    "\223NUMPY\001\000v\000"
    "{'descr': '|i1', 'fortran_order': False, 'shape': (3,), }       "
    "                                                     \n"
    "\377\000\177";

// array(True)
constexpr char kNumpyBoolScalar[] =
    "\223NUMPY\001\000v\000"
    "{'descr': '|b1', 'fortran_order': False, 'shape': (), }         "
    "                                                     \n"
    "\001";

// array([], shape=(0, 4), dtype=uint16)
constexpr char kNumpyU16Empty[] =
    "\223NUMPY\001\000v\000"
    "{'descr': '<u2', 'fortran_order': False, 'shape': (0, 4), }     "
    "                                                     \n";

// array([ 1.5 , -2.25])
constexpr char kNumpyF64V2[] =
    "\223NUMPY\002\000t\000\000\000"
    "{'descr': '<f8', 'fortran_order': False, 'shape': (2,), }       "
    "                                                   \n"
    "\000\000\000\000\000\000\370\077\000\000\000\000\000\000\002\300";

// array([ 1, -2], dtype=int32)
constexpr char kNumpyI32V3[] =
    "\223NUMPY\003\000t\000\000\000"
    "{'descr': '<i4', 'fortran_order': False, 'shape': (2,), }       "
    "                                                   \n"
    "\001\000\000\000\376\377\377\377";

// array([[1., 3.], [2., 4.]], dtype=float16)
constexpr char kNumpyF16Fortran[] =
    "\223NUMPY\001\000v\000"
    "{'descr': '<f2', 'fortran_order': True, 'shape': (2, 2), }      "
    "                                                     \n"
    "\000\074\000\100\000\102\000\104";

// array([1, 2], dtype='>i4')
constexpr char kNumpyBigEndian[] =
    "\223NUMPY\001\000v\000"
    "{'descr': '>i4', 'fortran_order': False, 'shape': (2,), }       "
    "                                                     \n"
    "\000\000\000\001\000\000\000\002";

// array([(0., 0)], dtype=[('a', '<f4'), ('b', '<i2')])
constexpr char kNumpyStructured[] =
    "\223NUMPY\001\000v\000"
    "{'descr': [('a', '<f4'), ('b', '<i2')], 'fortran_order': False, "
    "'shape': (1,), }                                     \n"
    "\000\000\000\000\000\000";

// array([], shape=(0, 123456789), dtype=uint8)
constexpr char kNumpyU8WideEmpty[] =
    "\223NUMPY\001\000v\000"
    "{'descr': '|u1', 'fortran_order': False, 'shape': (0, 123456789)"
    ", }                                                  \n";

// array([], shape=(2, 0, 3, 4, 5), dtype=int64)
constexpr char kNumpyI64Empty5d[] =
    "\223NUMPY\001\000v\000"
    "{'descr': '<i8', 'fortran_order': False, 'shape': (2, 0, 3, 4, 5"
    "), }                                                 \n";

// array([], dtype=bool)
constexpr char kNumpyBoolEmpty[] =
    "\223NUMPY\001\000v\000"
    "{'descr': '|b1', 'fortran_order': False, 'shape': (0,), }       "
    "                                                     \n";

// array([], shape=(0, 1, 1, 1, 1, 10, 12345, 1234567, 1234567), dtype=float32)
constexpr char kNumpyF32PadFull[] =
    "\223NUMPY\001\000\266\000"
    "{'descr': '<f4', 'fortran_order': False, 'shape': (0, 1, 1, 1, 1"
    ", 10, 12345, 1234567, 1234567), }                               "
    "                                                     \n";

// A literal's bytes, without the terminating NUL.
template <size_t N>
std::span<const std::byte> Bytes(const char (&literal)[N]) {
  return {reinterpret_cast<const std::byte*>(literal), N - 1};
}

template <size_t N>
std::vector<std::byte> ByteVector(const char (&literal)[N]) {
  auto span = Bytes(literal);
  return {span.begin(), span.end()};
}

std::vector<std::byte> ToBytes(absl::string_view s) {
  const auto* p = reinterpret_cast<const std::byte*>(s.data());
  return {p, p + s.size()};
}

template <typename T>
std::vector<T> Values(const NpyArray& a) {
  EXPECT_EQ(a.data.size() % sizeof(T), 0u);
  std::vector<T> out(a.data.size() / sizeof(T));
  if (!out.empty()) std::memcpy(out.data(), a.data.data(), a.data.size());
  return out;
}

template <typename T>
std::vector<std::byte> RawBytes(const std::vector<T>& values) {
  std::vector<std::byte> out(values.size() * sizeof(T));
  if (!out.empty()) std::memcpy(out.data(), values.data(), out.size());
  return out;
}

// A .npy file with the given header dict text and data, header padded as numpy does.
std::vector<std::byte> MakeNpy(absl::string_view dict, absl::string_view data = "", int major = 1) {
  const size_t prefix = major == 1 ? 10 : 12;
  std::string header(dict);
  header.append(63 - (prefix + header.size()) % 64, ' ');
  header.push_back('\n');
  std::string out("\x93NUMPY", 6);
  out.push_back(static_cast<char>(major));
  out.push_back('\0');
  for (size_t i = 0; i < prefix - 8; ++i) {
    out.push_back(static_cast<char>((header.size() >> (8 * i)) & 0xff));
  }
  absl::StrAppend(&out, header, data);
  return ToBytes(out);
}

std::string TempPath(absl::string_view name) {
  return absl::StrCat(::testing::TempDir(), "/npy_test_", name);
}

std::vector<std::byte> ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return ToBytes(absl::string_view(chars.data(), chars.size()));
}

void WriteAll(const std::string& path, std::span<const std::byte> bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

// --- Reading files numpy wrote ------------------------------------------------------------

TEST(ParseNpyTest, ReadsNumpyFloat32Matrix) {
  auto a = ParseNpy(Bytes(kNumpyF32), "f32.npy");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->dtype, "<f4");
  EXPECT_THAT(a->shape, ElementsAre(2, 3));
  EXPECT_EQ(a->itemsize(), 4u);
  EXPECT_EQ(a->size(), 6);
  EXPECT_THAT(Values<float>(*a), ElementsAre(0, 1, 2, 3, 4, 5));
}

TEST(ParseNpyTest, ReadsNumpyInt8AndNormalizesDescr) {
  auto a = ParseNpy(Bytes(kNumpyI8), "i8.npy");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->dtype, "<i1");  // numpy writes '|i1'
  EXPECT_THAT(a->shape, ElementsAre(3));
  EXPECT_THAT(Values<int8_t>(*a), ElementsAre(-1, 0, 127));
}

TEST(ParseNpyTest, ReadsNumpyBoolScalar) {
  auto a = ParseNpy(Bytes(kNumpyBoolScalar), "b.npy");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->dtype, "|b1");
  EXPECT_THAT(a->shape, IsEmpty());
  EXPECT_EQ(a->size(), 1);
  EXPECT_THAT(a->data, ElementsAre(std::byte{1}));
}

TEST(ParseNpyTest, ReadsNumpyEmptyArrays) {
  auto a = ParseNpy(Bytes(kNumpyU16Empty), "u16.npy");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->dtype, "<u2");
  EXPECT_THAT(a->shape, ElementsAre(0, 4));
  EXPECT_EQ(a->size(), 0);
  EXPECT_THAT(a->data, IsEmpty());

  auto b = ParseNpy(Bytes(kNumpyI64Empty5d), "i64.npy");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_THAT(b->shape, ElementsAre(2, 0, 3, 4, 5));
  EXPECT_EQ(b->size(), 0);
}

TEST(ParseNpyTest, ReadsNumpyVersion2And3) {
  auto a = ParseNpy(Bytes(kNumpyF64V2), "v2.npy");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->dtype, "<f8");
  EXPECT_THAT(a->shape, ElementsAre(2));
  EXPECT_THAT(Values<double>(*a), ElementsAre(1.5, -2.25));

  auto b = ParseNpy(Bytes(kNumpyI32V3), "v3.npy");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->dtype, "<i4");
  EXPECT_THAT(Values<int32_t>(*b), ElementsAre(1, -2));
}

TEST(ReadNpyTest, ReadsFromDisk) {
  const std::string path = TempPath("disk_f32.npy");
  WriteAll(path, Bytes(kNumpyF32));
  auto a = ReadNpy(path);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->dtype, "<f4");
  EXPECT_THAT(a->shape, ElementsAre(2, 3));
  EXPECT_THAT(Values<float>(*a), ElementsAre(0, 1, 2, 3, 4, 5));
}

// --- Writing --------------------------------------------------------------------------------

TEST(WriteNpyTest, ByteIdenticalToNumpy) {
  struct Case {
    const char* name;
    std::span<const std::byte> bytes;
  };
  const Case cases[] = {
      {"f32", Bytes(kNumpyF32)},
      {"i8", Bytes(kNumpyI8)},
      {"bool_scalar", Bytes(kNumpyBoolScalar)},
      {"u16_empty", Bytes(kNumpyU16Empty)},
      {"u8_wide_empty", Bytes(kNumpyU8WideEmpty)},
      {"i64_empty_5d", Bytes(kNumpyI64Empty5d)},
      {"bool_empty", Bytes(kNumpyBoolEmpty)},
      {"f32_pad_full", Bytes(kNumpyF32PadFull)},  // numpy pads a full 64 when aligned
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    auto a = ParseNpy(c.bytes, c.name);
    ASSERT_TRUE(a.ok()) << a.status();
    const std::string path = TempPath(absl::StrCat("numpy_", c.name, ".npy"));
    ASSERT_TRUE(WriteNpy(path, *a).ok());
    std::vector<std::byte> written = ReadAll(path);
    EXPECT_EQ(written, std::vector<std::byte>(c.bytes.begin(), c.bytes.end()));
  }
}

TEST(WriteNpyTest, RoundTripsDtypesAndShapes) {
  std::mt19937 rng(1234);
  const std::vector<std::vector<int64_t>> shapes = {
      {},     {1},        {7}, {3, 4}, {2, 3, 5}, {0}, {4, 0, 2}, {1, 1, 1, 1, 1, 1, 1, 1},
      {1000}, {123457, 1}};
  const std::vector<std::string> dtypes = {"float16", "float32", "float64", "int8",
                                           "int16",   "int32",   "int64",   "uint8",
                                           "uint16",  "uint32",  "uint64",  "bool"};
  int n = 0;
  for (const std::string& dtype : dtypes) {
    for (const std::vector<int64_t>& shape : shapes) {
      SCOPED_TRACE(absl::StrCat(dtype, " shape #", n));
      NpyArray a;
      a.dtype = *DtypeDescr(dtype);
      a.shape = shape;
      a.data.resize(a.itemsize() * static_cast<size_t>(a.size()));
      for (std::byte& b : a.data) b = std::byte(dtype == "bool" ? rng() & 1 : rng() & 0xff);
      const std::string path = TempPath(absl::StrCat("rt_", n++, ".npy"));
      ASSERT_TRUE(WriteNpy(path, a).ok());

      std::vector<std::byte> file = ReadAll(path);
      ASSERT_GE(file.size(), 10u);
      EXPECT_EQ(file[6], std::byte{1});  // version 1.0
      EXPECT_EQ(file[7], std::byte{0});
      const size_t header_len = static_cast<size_t>(file[8]) | static_cast<size_t>(file[9]) << 8;
      EXPECT_EQ((10 + header_len) % 64, 0u);
      EXPECT_EQ(file[10 + header_len - 1], std::byte{'\n'});
      EXPECT_EQ(file.size(), 10 + header_len + a.data.size());

      auto b = ReadNpy(path);
      ASSERT_TRUE(b.ok()) << b.status();
      EXPECT_EQ(b->dtype, a.dtype);
      EXPECT_EQ(b->shape, a.shape);
      EXPECT_EQ(b->data, a.data);
    }
  }
}

TEST(WriteNpyTest, AcceptsUserDtypeNamesAndUnnormalizedDescrs) {
  NpyArray a;
  a.dtype = "float32";
  a.shape = {2};
  a.data = RawBytes(std::vector<float>{1.0f, -3.5f});
  const std::string path = TempPath("user_name.npy");
  ASSERT_TRUE(WriteNpy(path, a).ok());
  auto b = ReadNpy(path);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->dtype, "<f4");
  EXPECT_THAT(Values<float>(*b), ElementsAre(1.0f, -3.5f));

  a.dtype = "|u1";
  a.data.resize(2);
  ASSERT_TRUE(WriteNpy(path, a).ok());
  b = ReadNpy(path);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->dtype, "<u1");
}

TEST(WriteNpyTest, RejectsBadArrays) {
  const std::string path = TempPath("bad_write.npy");
  NpyArray a;
  a.dtype = "complex64";
  a.shape = {1};
  a.data.resize(8);
  absl::Status s = WriteNpy(path, a);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr(path));
  EXPECT_THAT(std::string(s.message()), HasSubstr("unsupported dtype"));

  a.dtype = "<f4";
  a.shape = {3};
  s = WriteNpy(path, a);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("data is 8 bytes but shape (3,) of <f4 needs 12"));

  a.shape = {-2};
  s = WriteNpy(path, a);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("negative dimension"));

  a.shape = {int64_t{1} << 40, int64_t{1} << 40};
  s = WriteNpy(path, a);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("overflows"));

  a.shape = {2};
  s = WriteNpy(TempPath("no_such_dir/x.npy"), a);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(s.message()), HasSubstr("no_such_dir/x.npy"));
}

// --- Dtype names ----------------------------------------------------------------------------

TEST(DtypeTest, MapsNamesAndDescrs) {
  const std::pair<const char*, const char*> cases[] = {
      {"float16", "<f2"}, {"float32", "<f4"}, {"float64", "<f8"}, {"int8", "<i1"},
      {"int16", "<i2"},   {"int32", "<i4"},   {"int64", "<i8"},   {"uint8", "<u1"},
      {"uint16", "<u2"},  {"uint32", "<u4"},  {"uint64", "<u8"},  {"bool", "|b1"},
      {"<f4", "<f4"},     {"|i1", "<i1"},     {"|u1", "<u1"},     {">i1", "<i1"},
      {"=i2", "<i2"},     {"f8", "<f8"},      {"|b1", "|b1"},     {"<b1", "|b1"},
      {"?", "|b1"},       {"<u8", "<u8"},
  };
  for (const auto& [name, descr] : cases) {
    auto d = DtypeDescr(name);
    ASSERT_TRUE(d.ok()) << name << ": " << d.status();
    EXPECT_EQ(*d, descr) << name;
  }
  for (const char* bad : {"", "float", "float128", "<f16", ">f4", ">i8", "<c8", "|O", "<U3", "|S5",
                          "|V8", "<M8[ns]", "int", "f4 ", "<<f4", "Float32"}) {
    auto d = DtypeDescr(bad);
    EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument) << "'" << bad << "'";
  }
  EXPECT_THAT(std::string(DtypeDescr(">f4").status().message()), HasSubstr("big-endian"));
  EXPECT_THAT(std::string(DtypeDescr("|O").status().message()), HasSubstr("object"));
  EXPECT_THAT(std::string(DtypeDescr("complex64").status().message()), HasSubstr("float32"));
}

TEST(DtypeTest, ItemSizes) {
  EXPECT_EQ(DescrItemSize("<f2"), 2u);
  EXPECT_EQ(DescrItemSize("<f4"), 4u);
  EXPECT_EQ(DescrItemSize("<f8"), 8u);
  EXPECT_EQ(DescrItemSize("<i1"), 1u);
  EXPECT_EQ(DescrItemSize("|u1"), 1u);
  EXPECT_EQ(DescrItemSize("<i8"), 8u);
  EXPECT_EQ(DescrItemSize("<u4"), 4u);
  EXPECT_EQ(DescrItemSize("|b1"), 1u);
  EXPECT_EQ(DescrItemSize("uint16"), 2u);
  EXPECT_EQ(DescrItemSize("<c8"), 0u);
  EXPECT_EQ(DescrItemSize(">f4"), 0u);
  EXPECT_EQ(DescrItemSize(""), 0u);
  NpyArray a;
  a.dtype = "nonsense";
  EXPECT_EQ(a.itemsize(), 0u);
}

// --- Header tolerance -----------------------------------------------------------------------

TEST(ParseNpyTest, ToleratesHeaderVariants) {
  struct Case {
    const char* dict;
    std::vector<int64_t> shape;
  };
  const Case cases[] = {
      {"{'shape': (2,), 'fortran_order': False, 'descr': '<i2'}", {2}},
      {"{\"descr\": \"<i2\", \"fortran_order\": False, \"shape\": (2,)}", {2}},
      {"{'descr':'<i2','fortran_order':False,'shape':(2,),}", {2}},
      {"  {  'descr' : '<i2' ,\n 'fortran_order' : False , 'shape' : ( 2 , ) , }  ", {2}},
      {"{'descr': '<i2', 'fortran_order': False, 'shape': (1, 2)}", {1, 2}},
      {"{'descr': '<i2', 'fortran_order': False, 'shape': (1, 2,)}", {1, 2}},
      {"{'descr': '<i2', 'fortran_order': False, 'shape': [2]}", {2}},
      {"{'descr': '<i2', 'fortran_order': False, 'shape': (2L,)}", {2}},
      {"{u'descr': u'<i2', 'fortran_order': False, 'shape': (2,)}", {2}},
      {"{'descr': '=i2', 'fortran_order': False, 'shape': (2,)}", {2}},
      {"{'descr': '<i2', 'fortran_order': False, 'shape': ((2),)}", {2}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.dict);
    auto a = ParseNpy(MakeNpy(c.dict, std::string(4, '\x01')), "variant.npy");
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_EQ(a->dtype, "<i2");
    EXPECT_EQ(a->shape, c.shape);
    EXPECT_EQ(a->data.size(), 4u);
  }
  // Scalar, and a header with no newline or padding at all.
  auto scalar = ParseNpy(
      MakeNpy("{'descr': '<f8', 'fortran_order': False, 'shape': ()}", std::string(8, '\0')),
      "scalar.npy");
  ASSERT_TRUE(scalar.ok()) << scalar.status();
  EXPECT_THAT(scalar->shape, IsEmpty());
  const std::string dict = "{'descr': '|u1', 'fortran_order': False, 'shape': (1,)}";
  std::string raw("\x93NUMPY\x01\x00", 8);
  raw.push_back(static_cast<char>(dict.size()));
  raw.push_back('\0');
  raw += dict;
  raw.push_back('\x7f');
  auto bare = ParseNpy(ToBytes(raw), "bare.npy");
  ASSERT_TRUE(bare.ok()) << bare.status();
  EXPECT_THAT(bare->data, ElementsAre(std::byte{0x7f}));
}

// --- Rejections -----------------------------------------------------------------------------

void ExpectInvalid(std::span<const std::byte> bytes, absl::string_view problem) {
  auto a = ParseNpy(bytes, "input.npy");
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument) << a.status();
  EXPECT_THAT(std::string(a.status().message()), HasSubstr("input.npy: "));
  EXPECT_THAT(std::string(a.status().message()), HasSubstr(problem));
}

std::vector<std::byte> WithDict(absl::string_view dict, absl::string_view data = "") {
  return MakeNpy(dict, data);
}

TEST(ParseNpyTest, RejectsBadMagicAndVersion) {
  ExpectInvalid({}, "bad magic");
  ExpectInvalid(ToBytes("\x93NUMP"), "bad magic");
  ExpectInvalid(ToBytes("PK\x03\x04 this is a zip"), "bad magic");
  ExpectInvalid(ToBytes(absl::string_view("\x93NUMPY\x01", 7)), "version field");
  ExpectInvalid(ToBytes(absl::string_view("\x93NUMPY\x01\x00\x10", 9)), "header length field");
  ExpectInvalid(ToBytes(absl::string_view("\x93NUMPY\x02\x00\x10\x00\x00", 11)),
                "header length field");
  ExpectInvalid(ToBytes(absl::string_view("\x93NUMPY\x04\x00\x00\x00\x00\x00", 12)),
                "unsupported .npy format version 4.0");
  ExpectInvalid(ToBytes(absl::string_view("\x93NUMPY\x01\x01\x00\x00", 10)),
                "unsupported .npy format version 1.1");
  ExpectInvalid(ToBytes(absl::string_view("\x93NUMPY\x00\x00\x00\x00", 10)),
                "unsupported .npy format version 0.0");
  ExpectInvalid(ToBytes(absl::string_view("\x93NUMPY\x01\x00\xff\x00{}", 12)),
                "header length is 255 bytes but only 2");
  ExpectInvalid(ToBytes(absl::string_view("\x93NUMPY\x02\x00\xff\xff\xff\xff{}", 14)),
                "header length is 4294967295 bytes");
}

TEST(ParseNpyTest, RejectsNumpyFortranBigEndianAndStructured) {
  ExpectInvalid(Bytes(kNumpyF16Fortran), "Fortran-order");
  ExpectInvalid(Bytes(kNumpyBigEndian), "big-endian dtype '>i4'");
  ExpectInvalid(Bytes(kNumpyStructured), "structured dtypes");
}

TEST(ParseNpyTest, RejectsUnsupportedDtypes) {
  ExpectInvalid(WithDict("{'descr': '|O', 'fortran_order': False, 'shape': (1,)}", "\x80\x04"),
                "object dtype '|O'");
  ExpectInvalid(
      WithDict("{'descr': '<c8', 'fortran_order': False, 'shape': (1,)}", std::string(8, '\0')),
      "unsupported dtype '<c8'");
  ExpectInvalid(
      WithDict("{'descr': '<U3', 'fortran_order': False, 'shape': (1,)}", std::string(12, '\0')),
      "unsupported dtype '<U3'");
  ExpectInvalid(WithDict("{'descr': '|V4', 'fortran_order': False, 'shape': (1,)}", "abcd"),
                "void/structured");
  ExpectInvalid(
      WithDict("{'descr': '>f8', 'fortran_order': False, 'shape': (1,)}", std::string(8, '\0')),
      "big-endian");
  ExpectInvalid(WithDict("{'descr': {'names': ['a'], 'formats': ['<f4']}, "
                         "'fortran_order': False, 'shape': (1,)}",
                         "abcd"),
                "structured dtypes");
  ExpectInvalid(WithDict("{'descr': 4, 'fortran_order': False, 'shape': (1,)}", "abcd"),
                "'descr' must be a string");
}

TEST(ParseNpyTest, RejectsBadKeys) {
  ExpectInvalid(WithDict("{'descr': '<f4', 'shape': (1,)}", "abcd"),
                "lacks the key 'fortran_order'");
  ExpectInvalid(WithDict("{'fortran_order': False, 'shape': (1,)}", "abcd"),
                "lacks the key 'descr'");
  ExpectInvalid(WithDict("{'descr': '<f4', 'fortran_order': False}", "abcd"),
                "lacks the key 'shape'");
  ExpectInvalid(WithDict("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'x': 1}", "abcd"),
                "unexpected key 'x'");
  ExpectInvalid(
      WithDict("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'shape': (1,)}", "abcd"),
      "duplicate key 'shape'");
  ExpectInvalid(WithDict("{'descr': '<f4', 'fortran_order': 0, 'shape': (1,)}", "abcd"),
                "'fortran_order' must be True or False");
}

TEST(ParseNpyTest, RejectsBadShapes) {
  const std::string d = "{'descr': '<f4', 'fortran_order': False, 'shape': ";
  ExpectInvalid(WithDict(d + "(-1,)}"), "negative dimension");
  ExpectInvalid(WithDict(d + "(2.5,)}"), "malformed integer");
  ExpectInvalid(WithDict(d + "('2',)}"), "'shape' must be a tuple of integers");
  ExpectInvalid(WithDict(d + "(3)}", "abcdefghijkl"), "'shape' must be a tuple of integers");
  ExpectInvalid(WithDict(d + "None}"), "'shape' must be a tuple of integers");
  ExpectInvalid(WithDict(d + "(99999999999999999999,)}"), "integer out of range");
  ExpectInvalid(WithDict(d + "(9223372036854775807,)}"), "overflows");
  ExpectInvalid(WithDict(d + "(4294967296, 4294967296)}"), "overflows");
  ExpectInvalid(WithDict(d + "(0, 4294967296, 4294967296)}"), "overflows");
  ExpectInvalid(WithDict(d + "(1099511627776, 1099511627776, 0)}"), "overflows");
  std::string many = d + "(";
  for (int i = 0; i < 65; ++i) many += "1, ";
  ExpectInvalid(WithDict(many + ")}", "abcd"), "65 dimensions");
  // Large but representable: caught as truncated, without allocating.
  ExpectInvalid(WithDict(d + "(1000000000000,)}"), "truncated data");
}

TEST(ParseNpyTest, RejectsTruncatedAndTrailingData) {
  std::vector<std::byte> full = ByteVector(kNumpyF32);
  ExpectInvalid(std::span(full).first(full.size() - 1),
                "truncated data: shape (2, 3) of <f4 needs 24 bytes but only 23");
  ExpectInvalid(std::span(full).first(128), "needs 24 bytes but only 0");
  ExpectInvalid(std::span(full).first(100), "truncated: header length is 118 bytes");
  full.push_back(std::byte{0});
  ExpectInvalid(full, "1 unexpected bytes after the data");
}

TEST(ParseNpyTest, RejectsMalformedHeaders) {
  ExpectInvalid(WithDict(""), "expected '{'");
  ExpectInvalid(WithDict("[]"), "expected '{'");
  ExpectInvalid(WithDict("{'descr': '<f4', 'fortran_order': False, 'shape': (1,)"),
                "malformed header");
  ExpectInvalid(WithDict("{'descr': '<f4, 'fortran_order': False, 'shape': (1,)}"),
                "malformed header");
  ExpectInvalid(WithDict("{'descr' '<f4', 'fortran_order': False, 'shape': (1,)}"), "expected ':'");
  ExpectInvalid(WithDict("{'descr': '<f4' 'fortran_order': False, 'shape': (1,)}"),
                "expected ',' or '}'");
  ExpectInvalid(WithDict("{descr: '<f4', 'fortran_order': False, 'shape': (1,)}"),
                "expected a quoted key");
  ExpectInvalid(WithDict("{'descr': '<f4', 'fortran_order': false, 'shape': (1,)}"),
                "expected a string, integer");
  ExpectInvalid(WithDict("{'descr': '<f4', 'fortran_order': False, 'shape': (1,)} x"),
                "unexpected text after the header dict");
  ExpectInvalid(WithDict("{'descr': '<f4', 'fortran_order': False, 'shape': (1,,)}"),
                "malformed header");
  ExpectInvalid(WithDict(std::string(60000, '(')), "expected '{'");
  ExpectInvalid(WithDict("{'shape': " + std::string(60000, '(')), "nested too deeply");
  {
    std::vector<std::byte> huge = MakeNpy(std::string(70000, ' '), "", 2);
    ExpectInvalid(huge, "bytes; at most 65535 are supported");
  }
  ExpectInvalid(WithDict("{'descr': " + std::string(5000, '[') + "}"), "nested too deeply");
  // The offending header is quoted, escaped, in the message.
  ExpectInvalid(WithDict("{'descr': '<f4', \x01}"), "header: \"{'descr': '<f4', \\x01}\"");
}

TEST(ReadNpyTest, ErrorsNameTheFile) {
  auto missing = ReadNpy(TempPath("does_not_exist.npy"));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("does_not_exist.npy"));

  auto missing_dir = ReadNpy(TempPath("no_such_dir/x.npy"));
  EXPECT_EQ(missing_dir.status().code(), absl::StatusCode::kNotFound);

  auto dir = ReadNpy(::testing::TempDir());
  EXPECT_EQ(dir.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(dir.status().message()), HasSubstr("directory"));

  const std::string fortran = TempPath("fortran.npy");
  WriteAll(fortran, Bytes(kNumpyF16Fortran));
  auto f = ReadNpy(fortran);
  EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(f.status().message()), HasSubstr(fortran + ": Fortran-order"));

  const std::string truncated = TempPath("truncated.npy");
  WriteAll(truncated, Bytes(kNumpyF32).first(140));
  auto t = ReadNpy(truncated);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(t.status().message()), HasSubstr(truncated + ": truncated data"));

  const std::string empty = TempPath("empty.npy");
  WriteAll(empty, {});
  auto e = ReadNpy(empty);
  EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(e.status().message()), HasSubstr("bad magic"));
}

// --- Hostile input --------------------------------------------------------------------------

// Parsing must either fail cleanly or produce a consistent array no larger than the input.
void ParseAndCheck(std::span<const std::byte> bytes) {
  auto a = ParseNpy(bytes, "fuzz.npy");
  if (!a.ok()) {
    EXPECT_FALSE(a.status().message().empty());
    return;
  }
  ASSERT_NE(a->itemsize(), 0u);
  ASSERT_GE(a->size(), 0);
  EXPECT_EQ(a->data.size(), a->itemsize() * static_cast<size_t>(a->size()));
  EXPECT_LE(a->data.size(), bytes.size());
}

TEST(ParseNpyTest, HostileInputNeverCrashes) {
  const std::vector<std::vector<std::byte>> seeds = {
      ByteVector(kNumpyF32),        ByteVector(kNumpyI8),         ByteVector(kNumpyBoolScalar),
      ByteVector(kNumpyU16Empty),   ByteVector(kNumpyF64V2),      ByteVector(kNumpyI32V3),
      ByteVector(kNumpyF16Fortran), ByteVector(kNumpyStructured), ByteVector(kNumpyF32PadFull),
  };
  std::mt19937 rng(20240601);
  int accepted = 0;
  for (const std::vector<std::byte>& seed : seeds) {
    // Every truncation.
    for (size_t n = 0; n <= seed.size(); ++n) ParseAndCheck(std::span(seed).first(n));
    // Every single-bit flip.
    std::vector<std::byte> mutated = seed;
    for (size_t i = 0; i < seed.size(); ++i) {
      for (int bit = 0; bit < 8; ++bit) {
        mutated[i] ^= std::byte(1 << bit);
        auto a = ParseNpy(mutated, "flip.npy");
        if (a.ok()) {
          ++accepted;
          EXPECT_EQ(a->data.size(), a->itemsize() * static_cast<size_t>(a->size()));
        }
        mutated[i] = seed[i];
      }
    }
    // Random multi-byte corruption, mostly of the header, with interesting byte values.
    const char interesting[] = "(),:'\"{}[]-0123456789 \n\\\x00\xff\x80TrueFalseNoneL";
    for (int iter = 0; iter < 3000; ++iter) {
      mutated = seed;
      const int edits = 1 + static_cast<int>(rng() % 8);
      for (int e = 0; e < edits; ++e) {
        const size_t limit = std::min<size_t>(mutated.size(), 140);
        const size_t pos = rng() % limit;
        switch (rng() % 4) {
          case 0:
            mutated[pos] = std::byte(rng() & 0xff);
            break;
          case 1:
            mutated[pos] = std::byte(interesting[rng() % (sizeof(interesting) - 1)]);
            break;
          case 2:
            mutated.erase(mutated.begin() + static_cast<std::ptrdiff_t>(pos));
            break;
          default:
            mutated.insert(mutated.begin() + static_cast<std::ptrdiff_t>(pos),
                           std::byte(interesting[rng() % (sizeof(interesting) - 1)]));
            break;
        }
      }
      ParseAndCheck(mutated);
    }
  }
  // Flipping bits in the data section leaves valid files, so some were accepted.
  EXPECT_GT(accepted, 0);
}

TEST(ParseNpyTest, HostileHeadersFromTokenSoupNeverCrash) {
  const char* tokens[] = {"{",
                          "}",
                          "(",
                          ")",
                          "[",
                          "]",
                          ",",
                          ":",
                          " ",
                          "'descr'",
                          "'shape'",
                          "'fortran_order'",
                          "'<f4'",
                          "'|b1'",
                          "'>i8'",
                          "True",
                          "False",
                          "None",
                          "0",
                          "1",
                          "-1",
                          "3L",
                          "9223372036854775807",
                          "99999999999999999999",
                          "'",
                          "\"",
                          "\\",
                          "u'",
                          "\n"};
  std::mt19937 rng(7);
  for (int iter = 0; iter < 20000; ++iter) {
    std::string dict;
    const int n = static_cast<int>(rng() % 40);
    for (int i = 0; i < n; ++i) dict += tokens[rng() % std::size(tokens)];
    std::string data(rng() % 16, '\x01');
    ParseAndCheck(MakeNpy(dict, data, 1 + static_cast<int>(rng() % 3)));
  }
}

}  // namespace
}  // namespace kpack::cli
