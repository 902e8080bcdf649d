#include "npy.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <system_error>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "util/status_macros.h"

namespace kpack::cli {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicLen = 6;
// NumPy 2.x allows up to 64 dimensions.
constexpr size_t kMaxDims = 64;
// Longest header accepted. numpy.load itself refuses headers over 10000 bytes by default;
// every array this reader supports has a header of well under 2 KiB. The cap bounds the
// parser's memory on hostile input.
constexpr size_t kMaxHeaderLen = 65535;
// Nesting limit for header values, so hostile headers cannot exhaust the stack.
constexpr int kMaxDepth = 32;
// numpy.lib.format.ARRAY_ALIGN and GROWTH_AXIS_MAX_DIGITS.
constexpr size_t kArrayAlign = 64;
constexpr size_t kGrowthAxisMaxDigits = 21;

// Text from the file, made safe for an error message: printable ASCII as is (backslash
// doubled), everything else as \xNN.
std::string Printable(absl::string_view text) {
  std::string out;
  for (char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '\\') {
      out += "\\\\";
    } else if (u >= 0x20 && u < 0x7f) {
      out.push_back(c);
    } else {
      constexpr char kHex[] = "0123456789abcdef";
      out += "\\x";
      out.push_back(kHex[u >> 4]);
      out.push_back(kHex[u & 0xf]);
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------
// dtypes

// A supported dtype: `descr` is the normalized form (see NpyArray::dtype), `numpy_descr`
// the form numpy writes, `name` the user-facing name.
struct DtypeInfo {
  absl::string_view name;
  absl::string_view descr;
  absl::string_view numpy_descr;
  size_t itemsize;
};

constexpr DtypeInfo kDtypes[] = {
    {"float16", "<f2", "<f2", 2}, {"float32", "<f4", "<f4", 4}, {"float64", "<f8", "<f8", 8},
    {"int8", "<i1", "|i1", 1},    {"int16", "<i2", "<i2", 2},   {"int32", "<i4", "<i4", 4},
    {"int64", "<i8", "<i8", 8},   {"uint8", "<u1", "|u1", 1},   {"uint16", "<u2", "<u2", 2},
    {"uint32", "<u4", "<u4", 4},  {"uint64", "<u8", "<u8", 8},  {"bool", "|b1", "|b1", 1},
};

std::string SupportedList() {
  std::vector<absl::string_view> names;
  for (const DtypeInfo& d : kDtypes) names.push_back(d.name);
  return absl::StrJoin(names, ", ");
}

// Looks up a descr such as "<f4", "|u1", "=i2", "f8", "?" or "b1". On failure returns an
// error message (without the file name) explaining why.
absl::StatusOr<const DtypeInfo*> LookupDescr(absl::string_view descr) {
  absl::string_view rest = descr;
  char order = '=';
  if (!rest.empty() && (rest[0] == '<' || rest[0] == '>' || rest[0] == '|' || rest[0] == '=')) {
    order = rest[0];
    rest.remove_prefix(1);
  }
  if (rest == "?") rest = "b1";
  std::string quoted = absl::StrCat("'", Printable(descr), "'");
  if (rest.empty()) return absl::InvalidArgumentError(absl::StrCat("empty dtype ", quoted));
  switch (rest[0]) {
    case 'O':
      return absl::InvalidArgumentError(
          absl::StrCat("object dtype ", quoted, " is not supported (no pickled data)"));
    case 'V':
      return absl::InvalidArgumentError(
          absl::StrCat("void/structured dtype ", quoted, " is not supported"));
    default:
      break;
  }
  for (const DtypeInfo& d : kDtypes) {
    if (rest != d.descr.substr(1)) continue;
    if (order == '>' && d.itemsize > 1) {
      return absl::InvalidArgumentError(absl::StrCat("big-endian dtype ", quoted,
                                                     " is not supported; convert it with .astype('",
                                                     d.descr, "')"));
    }
    return &d;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unsupported dtype ", quoted, " (supported: ", SupportedList(), ")"));
}

absl::StatusOr<const DtypeInfo*> LookupDtype(absl::string_view name) {
  for (const DtypeInfo& d : kDtypes) {
    if (name == d.name) return &d;
  }
  return LookupDescr(name);
}

// ---------------------------------------------------------------------------------------
// Header parsing: the Python literal subset numpy writes.

struct PyValue {
  enum class Kind { kString, kInt, kBool, kNone, kTuple, kList, kDict };
  Kind kind = Kind::kNone;
  std::string str;
  int64_t integer = 0;
  bool boolean = false;
  std::vector<PyValue> items;  // tuple/list elements; dict keys and values alternating
};

class HeaderParser {
 public:
  explicit HeaderParser(absl::string_view text) : text_(text) {}

  // Parses the whole header: one dict, then only whitespace.
  absl::StatusOr<std::vector<std::pair<std::string, PyValue>>> ParseHeader() {
    SkipSpace();
    if (!Consume('{')) return Error("expected '{' at the start of the header");
    std::vector<std::pair<std::string, PyValue>> entries;
    std::vector<PyValue> flat;
    KPACK_RETURN_IF_ERROR(ParseDictBody(flat, 0));
    for (size_t i = 0; i + 1 < flat.size(); i += 2) {
      entries.emplace_back(std::move(flat[i].str), std::move(flat[i + 1]));
    }
    SkipSpace();
    if (pos_ != text_.size()) return Error("unexpected text after the header dict");
    return entries;
  }

 private:
  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrCat("malformed header: ", what, " (at offset ", pos_, " of the header)"));
  }

  bool AtEnd() const { return pos_ >= text_.size(); }
  char Peek() const { return AtEnd() ? '\0' : text_[pos_]; }
  bool Consume(char c) {
    if (AtEnd() || text_[pos_] != c) return false;
    ++pos_;
    return true;
  }
  void SkipSpace() {
    while (!AtEnd() && (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\n' ||
                        text_[pos_] == '\r' || text_[pos_] == '\f' || text_[pos_] == '\v')) {
      ++pos_;
    }
  }
  static bool IsIdentChar(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
  }

  // After '{': entries up to and including '}'. Keys must be strings.
  absl::Status ParseDictBody(std::vector<PyValue>& out, int depth) {
    while (true) {
      SkipSpace();
      if (Consume('}')) return absl::OkStatus();
      if (Peek() != '\'' && Peek() != '"' && Peek() != 'u' && Peek() != 'b') {
        return Error("expected a quoted key or '}'");
      }
      PyValue key;
      KPACK_RETURN_IF_ERROR(ParseValue(key, depth + 1));
      if (key.kind != PyValue::Kind::kString) return Error("dict keys must be strings");
      SkipSpace();
      if (!Consume(':')) return Error("expected ':' after a dict key");
      PyValue value;
      KPACK_RETURN_IF_ERROR(ParseValue(value, depth + 1));
      out.push_back(std::move(key));
      out.push_back(std::move(value));
      SkipSpace();
      if (Consume('}')) return absl::OkStatus();
      if (!Consume(',')) return Error("expected ',' or '}' in the dict");
    }
  }

  // After '(' or '[': elements up to and including `close`, with an optional trailing
  // comma. Sets *saw_comma when any comma appeared (to tell "(3)" from "(3,)").
  absl::Status ParseSequence(char close, std::vector<PyValue>& out, bool* saw_comma, int depth) {
    *saw_comma = false;
    while (true) {
      SkipSpace();
      if (Consume(close)) return absl::OkStatus();
      PyValue item;
      KPACK_RETURN_IF_ERROR(ParseValue(item, depth + 1));
      out.push_back(std::move(item));
      SkipSpace();
      if (Consume(close)) return absl::OkStatus();
      if (!Consume(','))
        return Error(absl::StrCat("expected ',' or '", std::string(1, close), "'"));
      *saw_comma = true;
    }
  }

  absl::Status ParseString(PyValue& out) {
    // Optional u/b prefix (Python 2 era writers).
    if (Peek() == 'u' || Peek() == 'b') ++pos_;
    char quote = Peek();
    if (quote != '\'' && quote != '"') return Error("expected a quoted string");
    ++pos_;
    std::string s;
    while (true) {
      if (AtEnd()) return Error("unterminated string");
      char c = text_[pos_++];
      if (c == quote) break;
      if (c == '\n') return Error("newline inside a string");
      if (c == '\\') {
        if (AtEnd()) return Error("unterminated string");
        c = text_[pos_++];  // \' \" \\ and anything else: the next character, literally
      }
      s.push_back(c);
    }
    out.kind = PyValue::Kind::kString;
    out.str = std::move(s);
    return absl::OkStatus();
  }

  absl::Status ParseInt(PyValue& out) {
    bool negative = Consume('-');
    if (!negative) Consume('+');
    SkipSpace();
    if (Peek() < '0' || Peek() > '9') return Error("expected a digit");
    uint64_t magnitude = 0;
    const uint64_t limit =
        negative ? uint64_t{1} << 63 : static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
    while (Peek() >= '0' && Peek() <= '9') {
      uint64_t digit = static_cast<uint64_t>(Peek() - '0');
      if (magnitude > (limit - digit) / 10) return Error("integer out of range");
      magnitude = magnitude * 10 + digit;
      ++pos_;
    }
    if (Peek() == 'L' || Peek() == 'l') ++pos_;  // Python 2 long literal, e.g. 3L
    if (IsIdentChar(Peek()) || Peek() == '.') return Error("malformed integer");
    out.kind = PyValue::Kind::kInt;
    out.integer = negative ? static_cast<int64_t>(0 - magnitude) : static_cast<int64_t>(magnitude);
    return absl::OkStatus();
  }

  absl::Status ParseValue(PyValue& out, int depth) {
    if (depth > kMaxDepth) return Error("values nested too deeply");
    SkipSpace();
    if (AtEnd()) return Error("unexpected end of header");
    char c = Peek();
    if (c == '\'' || c == '"') return ParseString(out);
    if ((c == 'u' || c == 'b') && pos_ + 1 < text_.size() &&
        (text_[pos_ + 1] == '\'' || text_[pos_ + 1] == '"')) {
      return ParseString(out);
    }
    if (c == '-' || c == '+' || (c >= '0' && c <= '9')) return ParseInt(out);
    if (c == '(' || c == '[') {
      ++pos_;
      bool saw_comma = false;
      std::vector<PyValue> items;
      KPACK_RETURN_IF_ERROR(ParseSequence(c == '(' ? ')' : ']', items, &saw_comma, depth));
      if (c == '(' && items.size() == 1 && !saw_comma) {
        out = std::move(items[0]);  // parenthesized expression, not a tuple
        return absl::OkStatus();
      }
      out.kind = c == '(' ? PyValue::Kind::kTuple : PyValue::Kind::kList;
      out.items = std::move(items);
      return absl::OkStatus();
    }
    if (c == '{') {
      ++pos_;
      out.kind = PyValue::Kind::kDict;
      return ParseDictBody(out.items, depth);
    }
    size_t start = pos_;
    while (IsIdentChar(Peek())) ++pos_;
    absl::string_view word = text_.substr(start, pos_ - start);
    if (word == "True" || word == "False") {
      out.kind = PyValue::Kind::kBool;
      out.boolean = word == "True";
      return absl::OkStatus();
    }
    if (word == "None") {
      out.kind = PyValue::Kind::kNone;
      return absl::OkStatus();
    }
    pos_ = start;
    return Error("expected a string, integer, True, False, None, tuple, list or dict");
  }

  absl::string_view text_;
  size_t pos_ = 0;
};

std::string ShapeString(const std::vector<int64_t>& shape) {
  if (shape.size() == 1) return absl::StrCat("(", shape[0], ",)");
  return absl::StrCat("(", absl::StrJoin(shape, ", "), ")");
}

// Byte size of `shape` with elements of `itemsize` bytes. Fails if the byte size of the
// non-zero dimensions alone would overflow int64, so that any partial product of the
// dimensions (as NpyArray::size computes it) is representable too.
absl::StatusOr<int64_t> CheckedByteSize(const std::vector<int64_t>& shape, size_t itemsize) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  if (shape.size() > kMaxDims) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shape has ", shape.size(), " dimensions; at most ", kMaxDims, " are supported"));
  }
  int64_t nonzero_bytes = static_cast<int64_t>(itemsize);
  bool any_zero = false;
  for (int64_t d : shape) {
    if (d < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("shape ", ShapeString(shape), " has a negative dimension"));
    }
    if (d == 0) {
      any_zero = true;
      continue;
    }
    if (nonzero_bytes > kMax / d) {
      return absl::InvalidArgumentError(
          absl::StrCat("shape ", ShapeString(shape), " is too large (byte size overflows)"));
    }
    nonzero_bytes *= d;
  }
  return any_zero ? 0 : nonzero_bytes;
}

// What the header says, and where the data lies.
struct ParsedHeader {
  std::string dtype;
  std::vector<int64_t> shape;
  size_t data_offset = 0;
  size_t nbytes = 0;
};

absl::StatusOr<ParsedHeader> ParseHeaderAndCheck(std::span<const std::byte> bytes) {
  auto u8 = [&](size_t i) { return static_cast<uint8_t>(bytes[i]); };
  if (bytes.size() < kMagicLen || std::memcmp(bytes.data(), kMagic, kMagicLen) != 0) {
    return absl::InvalidArgumentError(
        "not a .npy file (bad magic: expected the file to start with \"\\x93NUMPY\")");
  }
  if (bytes.size() < kMagicLen + 2) {
    return absl::InvalidArgumentError("truncated: file ends inside the version field");
  }
  const uint8_t major = u8(6), minor = u8(7);
  size_t len_size;
  if (major == 1 && minor == 0) {
    len_size = 2;
  } else if ((major == 2 || major == 3) && minor == 0) {
    len_size = 4;
  } else {
    return absl::InvalidArgumentError(absl::StrCat("unsupported .npy format version ", major, ".",
                                                   minor, " (supported: 1.0, 2.0, 3.0)"));
  }
  const size_t header_start = kMagicLen + 2 + len_size;
  if (bytes.size() < header_start) {
    return absl::InvalidArgumentError("truncated: file ends inside the header length field");
  }
  size_t header_len = 0;
  for (size_t i = 0; i < len_size; ++i) header_len |= static_cast<size_t>(u8(8 + i)) << (8 * i);
  if (header_len > bytes.size() - header_start) {
    return absl::InvalidArgumentError(absl::StrCat("truncated: header length is ", header_len,
                                                   " bytes but only ", bytes.size() - header_start,
                                                   " bytes follow the header length field"));
  }
  if (header_len > kMaxHeaderLen) {
    return absl::InvalidArgumentError(absl::StrCat("header is ", header_len, " bytes; at most ",
                                                   kMaxHeaderLen, " are supported"));
  }
  absl::string_view header(reinterpret_cast<const char*>(bytes.data() + header_start), header_len);

  HeaderParser parser(header);
  auto entries = parser.ParseHeader();
  if (!entries.ok()) {
    constexpr size_t kShow = 200;
    absl::string_view shown = absl::StripTrailingAsciiWhitespace(header);
    return absl::InvalidArgumentError(absl::StrCat(entries.status().message(), "; header: \"",
                                                   Printable(shown.substr(0, kShow)),
                                                   shown.size() > kShow ? "...\"" : "\""));
  }

  const PyValue* descr = nullptr;
  const PyValue* fortran = nullptr;
  const PyValue* shape = nullptr;
  for (const auto& [key, value] : *entries) {
    const PyValue** slot = key == "descr"           ? &descr
                           : key == "fortran_order" ? &fortran
                           : key == "shape"         ? &shape
                                                    : nullptr;
    if (slot == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("unexpected key '", Printable(key),
                       "' in the header (expected exactly 'descr', 'fortran_order' and 'shape')"));
    }
    if (*slot != nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("duplicate key '", Printable(key), "' in the header"));
    }
    *slot = &value;
  }
  for (auto [value, key] : {std::pair{descr, "descr"}, std::pair{fortran, "fortran_order"},
                            std::pair{shape, "shape"}}) {
    if (value == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("header lacks the key '", key, "'"));
    }
  }

  ParsedHeader out;
  if (descr->kind == PyValue::Kind::kList || descr->kind == PyValue::Kind::kTuple ||
      descr->kind == PyValue::Kind::kDict) {
    return absl::InvalidArgumentError(
        "structured dtypes (record arrays with named fields) are not supported");
  }
  if (descr->kind != PyValue::Kind::kString) {
    return absl::InvalidArgumentError("header key 'descr' must be a string");
  }
  KPACK_ASSIGN_OR_RETURN(const DtypeInfo* info, LookupDescr(descr->str));
  out.dtype = std::string(info->descr);

  if (fortran->kind != PyValue::Kind::kBool) {
    return absl::InvalidArgumentError("header key 'fortran_order' must be True or False");
  }
  if (fortran->boolean) {
    return absl::InvalidArgumentError(
        "Fortran-order (column-major) arrays are not supported; save a C-order array, e.g. "
        "np.save(path, np.ascontiguousarray(a))");
  }

  if (shape->kind != PyValue::Kind::kTuple && shape->kind != PyValue::Kind::kList) {
    return absl::InvalidArgumentError("header key 'shape' must be a tuple of integers");
  }
  if (shape->items.size() > kMaxDims) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shape has ", shape->items.size(), " dimensions; at most ", kMaxDims, " are supported"));
  }
  for (const PyValue& d : shape->items) {
    if (d.kind != PyValue::Kind::kInt) {
      return absl::InvalidArgumentError("header key 'shape' must be a tuple of integers");
    }
    out.shape.push_back(d.integer);
  }
  KPACK_ASSIGN_OR_RETURN(const int64_t nbytes, CheckedByteSize(out.shape, info->itemsize));

  out.data_offset = header_start + header_len;
  const size_t available = bytes.size() - out.data_offset;
  if (static_cast<uint64_t>(nbytes) > available) {
    return absl::InvalidArgumentError(
        absl::StrCat("truncated data: shape ", ShapeString(out.shape), " of ", out.dtype, " needs ",
                     nbytes, " bytes but only ", available, " follow the header"));
  }
  if (static_cast<uint64_t>(nbytes) < available) {
    return absl::InvalidArgumentError(absl::StrCat(
        available - static_cast<size_t>(nbytes), " unexpected bytes after the data (shape ",
        ShapeString(out.shape), " of ", out.dtype, " is ", nbytes, " bytes)"));
  }
  out.nbytes = static_cast<size_t>(nbytes);
  return out;
}

absl::Status Annotate(const absl::Status& status, absl::string_view name) {
  return absl::Status(status.code(), absl::StrCat(name, ": ", status.message()));
}

// absl::ErrnoToStatus appends strerror; never let an unset errno turn into OK.
absl::Status IoError(int err, absl::string_view message) {
  return absl::ErrnoToStatus(err != 0 ? err : EIO, message);
}

}  // namespace

size_t NpyArray::itemsize() const { return DescrItemSize(dtype); }

int64_t NpyArray::size() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

absl::StatusOr<std::string> DtypeDescr(absl::string_view name) {
  auto info = LookupDtype(name);
  if (!info.ok()) return info.status();
  return std::string((*info)->descr);
}

size_t DescrItemSize(absl::string_view descr) {
  auto info = LookupDtype(descr);
  return info.ok() ? (*info)->itemsize : 0;
}

absl::StatusOr<NpyArray> ParseNpy(std::span<const std::byte> bytes, absl::string_view name) {
  auto header = ParseHeaderAndCheck(bytes);
  if (!header.ok()) return Annotate(header.status(), name);
  NpyArray array;
  array.dtype = std::move(header->dtype);
  array.shape = std::move(header->shape);
  auto begin = bytes.begin() + static_cast<std::ptrdiff_t>(header->data_offset);
  array.data.assign(begin, begin + static_cast<std::ptrdiff_t>(header->nbytes));
  return array;
}

absl::StatusOr<NpyArray> ReadNpy(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": is a directory, not a .npy file"));
  }
  errno = 0;
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    int err = errno;
    if (err == ENOENT || err == ENOTDIR) {
      return absl::NotFoundError(absl::StrCat(path, ": no such file"));
    }
    return IoError(err, absl::StrCat(path, ": cannot open"));
  }
  // Read everything; works for pipes too. The file size is only a hint.
  std::vector<std::byte> buffer;
  uintmax_t hint = fs::is_regular_file(path, ec) ? fs::file_size(path, ec) : 0;
  if (ec) hint = 0;
  constexpr uintmax_t kMaxHint = uintmax_t{1} << 40;
  buffer.resize(static_cast<size_t>(std::min(hint, kMaxHint)) + 4096);
  size_t len = 0;
  while (true) {
    len += std::fread(buffer.data() + len, 1, buffer.size() - len, f);
    if (len < buffer.size()) break;
    buffer.resize(buffer.size() * 2);
  }
  const bool read_error = std::ferror(f) != 0;
  const int err = errno;
  std::fclose(f);
  if (read_error) return IoError(err, absl::StrCat(path, ": read error"));
  buffer.resize(len);

  auto header = ParseHeaderAndCheck(buffer);
  if (!header.ok()) return Annotate(header.status(), path);
  NpyArray array;
  array.dtype = std::move(header->dtype);
  array.shape = std::move(header->shape);
  // Drop the header in place rather than copying the data.
  buffer.erase(buffer.begin(), buffer.begin() + static_cast<std::ptrdiff_t>(header->data_offset));
  buffer.shrink_to_fit();
  array.data = std::move(buffer);
  return array;
}

absl::Status WriteNpy(const std::string& path, const NpyArray& array) {
  auto info_or = LookupDtype(array.dtype);
  if (!info_or.ok()) return Annotate(info_or.status(), path);
  const DtypeInfo& info = **info_or;
  auto nbytes_or = CheckedByteSize(array.shape, info.itemsize);
  if (!nbytes_or.ok()) return Annotate(nbytes_or.status(), path);
  const int64_t nbytes = *nbytes_or;
  if (array.data.size() != static_cast<uint64_t>(nbytes)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": data is ", array.data.size(),
                                                   " bytes but shape ", ShapeString(array.shape),
                                                   " of ", info.descr, " needs ", nbytes));
  }

  // Exactly what numpy (>= 1.24) writes: keys sorted, spare room for the first dimension
  // to grow, then spaces and a newline up to a multiple of 64 bytes (a full 64 spaces when
  // already aligned, as numpy does).
  std::string dict =
      absl::StrCat("{'descr': '", info.numpy_descr,
                   "', 'fortran_order': False, 'shape': ", ShapeString(array.shape), ", }");
  if (!array.shape.empty()) {
    const size_t digits = absl::StrCat(array.shape[0]).size();
    if (digits < kGrowthAxisMaxDigits) dict.append(kGrowthAxisMaxDigits - digits, ' ');
  }
  const size_t prefix_len = kMagicLen + 2 + 2;
  const size_t padding = kArrayAlign - (prefix_len + dict.size() + 1) % kArrayAlign;
  dict.append(padding, ' ');
  dict.push_back('\n');
  if (dict.size() > 0xffff) {
    // Unreachable with at most kMaxDims dimensions, but never write a wrong length.
    return absl::InvalidArgumentError(absl::StrCat(path, ": header too long for .npy 1.0"));
  }
  std::string prefix(kMagic, kMagicLen);
  prefix.push_back('\x01');
  prefix.push_back('\x00');
  prefix.push_back(static_cast<char>(dict.size() & 0xff));
  prefix.push_back(static_cast<char>(dict.size() >> 8));

  errno = 0;
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) {
    int err = errno;
    return IoError(err, absl::StrCat(path, ": cannot open for writing"));
  }
  bool ok = std::fwrite(prefix.data(), 1, prefix.size(), f) == prefix.size() &&
            std::fwrite(dict.data(), 1, dict.size(), f) == dict.size() &&
            (array.data.empty() ||
             std::fwrite(array.data.data(), 1, array.data.size(), f) == array.data.size());
  int err = ok ? 0 : errno;
  if (std::fclose(f) != 0 && ok) {
    ok = false;
    err = errno;
  }
  if (!ok) {
    std::remove(path.c_str());
    return IoError(err, absl::StrCat(path, ": write failed, partial file removed"));
  }
  return absl::OkStatus();
}

}  // namespace kpack::cli
