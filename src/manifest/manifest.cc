// The manifest as a document: its format and top-level fields, and its kernels, each
// parsed and validated apart (kernel.cc), on several threads when the text is large.
//
// JSON parsing and validation are most of what reading a large manifest costs, and both
// are independent per kernel. One parser does all of it, nlohmann_json's. Its SAX parser
// makes one pass over the whole text on the calling thread: it checks the syntax (so a
// syntax error anywhere is reported, with nlohmann's message, before any field's problem,
// as a parse of the whole text reports it) and hands each element of the top-level
// "kernels" array, as soon as the element ends, to another thread, which parses that
// element's text alone and validates it. Then the rest of the document, that array
// emptied, is parsed and checked. The pass builds nothing, so it costs about 40% of a
// whole-text parse, and the kernels are parsed meanwhile. ParseManifestWhole, the whole
// text parsed on one thread, is the reference the tests and the manifest fuzzer hold
// ParseManifest to.

#include "manifest/manifest.h"

#include <cstddef>
#include <deque>
#include <functional>
#include <iterator>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "manifest/parse.h"
#include "nlohmann/json.hpp"
#include "util/parallel.h"
#include "util/status_macros.h"

namespace kpack::internal {
namespace {

// N of "kpack/N" when this reader understands it, else 0.
int FormatVersion(absl::string_view format) {
  for (int v = kMinFormat; v <= kMaxFormat; ++v) {
    if (format == absl::StrCat("kpack/", v)) return v;
  }
  return 0;
}

// The top level: format, known keys, generator, and a "kernels" array (whose elements the
// caller parses). Returns the Where the kernels are named under.
absl::StatusOr<Where> ParseTop(const json& doc, absl::string_view file, ManifestSpec& manifest) {
  if (!doc.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(file, ": expected a JSON object at the top level, got ", TypeOf(doc)));
  }
  Where top{std::string(file)};
  KPACK_ASSIGN_OR_RETURN(std::string format, GetString(doc, "format", top));
  const int version = FormatVersion(format);
  if (version == 0) {
    return top.Error("format", absl::StrCat("unsupported pack format '", format,
                                            "'; this runtime reads 'kpack/", kMinFormat,
                                            "' to 'kpack/", kMaxFormat, "'"));
  }
  top = Where(std::string(file), version);
  KPACK_RETURN_IF_ERROR(CheckKeys(doc, top, "the manifest", {"format", "generator", "kernels"}));
  manifest.format_version = version;
  KPACK_ASSIGN_OR_RETURN(manifest.generator, GetString(doc, "generator", top, /*required=*/false));
  KPACK_ASSIGN_OR_RETURN(const json* kernels, Field(doc, "kernels", top));
  if (!kernels->is_array()) {
    return top.Error("kernels", absl::StrCat("expected an array, got ", TypeOf(*kernels)));
  }
  return top;
}

// Appends the kernels parsed in manifest order, stopping at the first error or duplicate.
absl::Status AddKernels(std::vector<absl::StatusOr<KernelSpec>>& kernels, const Where& top,
                        ManifestSpec& manifest) {
  if (kernels.empty()) return top.Error("kernels", "the pack has no kernels");
  absl::flat_hash_set<absl::string_view> names;
  manifest.kernels.reserve(kernels.size());
  for (size_t i = 0; i < kernels.size(); ++i) {
    if (!kernels[i].ok()) return kernels[i].status();
    manifest.kernels.push_back(*std::move(kernels[i]));
    if (!names.insert(manifest.kernels.back().name).second) {
      return top.Error(absl::StrCat("kernels[", i, "].name"),
                       absl::StrCat("duplicate kernel '", manifest.kernels.back().name, "'"));
    }
  }
  return absl::OkStatus();
}

absl::Status NotJson(absl::string_view file, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(file, ": not valid JSON: ", what));
}

// ---- The kernels, parsed as the SAX pass finds them.

// An input iterator over the text for nlohmann's parser that publishes, in `*read`, how
// far the parser has read. nlohmann's lexer hands a bracket ('{', '}', '[', ']') to the
// SAX handler as soon as it has read it, without reading ahead (it reads one character
// past a number or literal only, never past a bracket), so at start_object/start_array
// the parser has read just past the opening bracket, and at end_object/end_array just past
// the closing one. Every span taken this way is checked to start and end with a bracket,
// so a parser that behaved otherwise would be noticed, not trusted.
class Cursor {
 public:
  using iterator_category = std::input_iterator_tag;
  using value_type = char;
  using difference_type = std::ptrdiff_t;
  using pointer = const char*;
  using reference = const char&;

  Cursor(const char* at, const char** read) : at_(at), read_(read) {}
  reference operator*() const { return *at_; }
  Cursor& operator++() {
    *read_ = ++at_;
    return *this;
  }
  Cursor operator++(int) {
    Cursor before = *this;
    ++*this;
    return before;
  }
  bool operator==(const Cursor& other) const { return at_ == other.at_; }
  bool operator!=(const Cursor& other) const { return at_ != other.at_; }

 private:
  const char* at_;
  const char** read_;
};

// One element of a top-level "kernels" array, and what parsing it gave.
struct KernelElement {
  size_t index = 0;  // in its array
  // An object or array element's text, brackets included; empty for a scalar, which is
  // held in `scalar` instead (ParseKernel refuses it, naming its type).
  absl::string_view text;
  json scalar;
  int version = 0;  // the format it is parsed for (see KernelFinder)
  absl::StatusOr<KernelSpec> kernel;
};

bool Bracketed(absl::string_view text) {
  return text.size() >= 2 && (text.front() == '{' || text.front() == '[') &&
         (text.back() == '}' || text.back() == ']');
}

// Parses one element for the format `version` (`file` names the manifest in messages).
void ParseElement(KernelElement& e, absl::string_view file) {
  const Where top(std::string(file), e.version);
  if (e.text.empty()) {
    e.kernel = ParseKernel(e.scalar, top, e.index);
    return;
  }
  const json k = json::parse(e.text.begin(), e.text.end(), nullptr, /*allow_exceptions=*/false);
  if (k.is_discarded() || !Bracketed(e.text)) {
    // The SAX pass accepted the whole text, so its elements parse alone: this is the
    // parser's position contract (Cursor) failing.
    e.kernel = absl::InternalError(absl::StrCat(
        file, ": nlohmann_json ", NLOHMANN_JSON_VERSION_MAJOR, ".", NLOHMANN_JSON_VERSION_MINOR,
        ".", NLOHMANN_JSON_VERSION_PATCH, " reported positions that are not kernels[", e.index,
        "]'s brackets; src/manifest/manifest.cc (Cursor) needs adapting to it"));
    return;
  }
  e.kernel = ParseKernel(k, top, e.index);
}

// The SAX handler. It follows the nesting depth, notes the top-level object's "format",
// and posts each element of the array that is the value of its key "kernels" as soon as
// the element ends, for another thread to parse. The format is the one seen before the
// array (the usual order; kMaxFormat when none was): ParseManifest parses again any
// element whose format the document's turns out to differ from. A key given twice keeps
// its last value, as in nlohmann's DOM.
class KernelFinder : public nlohmann::json_sax<json> {
 public:
  // `post` is called during the pass only.
  KernelFinder(absl::string_view text, const char* const* read,
               std::function<void(KernelElement*)> post)
      : text_(text), read_(read), post_(std::move(post)) {}

  // Every element posted (the last "kernels" array's are the final ones), in order.
  std::deque<KernelElement>& elements() { return elements_; }
  bool found() const { return found_; }  // the (last) top-level "kernels" is an array
  size_t first() const { return first_; }  // its first element in elements()
  size_t array_begin() const { return array_begin_; }
  size_t array_end() const { return array_end_; }
  const std::string& error() const { return error_; }

  bool null() override { return Scalar(nullptr); }
  bool boolean(bool value) override { return Scalar(value); }
  bool number_integer(number_integer_t value) override { return Scalar(value); }
  bool number_unsigned(number_unsigned_t value) override { return Scalar(value); }
  bool number_float(number_float_t value, const string_t&) override { return Scalar(value); }
  bool string(string_t& value) override {
    const bool format = AtTop(kFormat);
    Scalar(value);
    if (format) format_ = value;
    return true;
  }
  bool binary(binary_t&) override { return true; }  // not in JSON text
  bool key(string_t& key) override {
    if (depth_ == 1 && top_is_object_) {
      top_key_ = key == "kernels" ? kKernels : key == "format" ? kFormat : kOther;
    }
    return true;
  }
  bool start_object(std::size_t) override { return Open(false); }
  bool start_array(std::size_t) override { return Open(true); }
  bool end_object() override { return Close(); }
  bool end_array() override { return Close(); }
  bool parse_error(std::size_t, const std::string&,
                   const nlohmann::detail::exception& e) override {
    error_ = e.what();
    return false;
  }

 private:
  enum TopKey { kOther, kKernels, kFormat };

  size_t Position() const { return static_cast<size_t>(*read_ - text_.data()); }
  // A value starting here is the top-level object's value of `key`.
  bool AtTop(TopKey key) const { return depth_ == 1 && top_is_object_ && top_key_ == key; }
  // A value starts: the top-level "kernels" (whose last value counts), or an element.
  void Starts(bool is_array) {
    if (AtTop(kFormat)) format_.clear();  // string() sets it again if it is one
    if (!AtTop(kKernels)) return;
    found_ = is_array;
    in_kernels_ = is_array;
    first_ = elements_.size();
    const int version = FormatVersion(format_);
    version_ = version != 0 ? version : kMaxFormat;
  }
  void Post(absl::string_view text, json scalar) {
    KernelElement& e = elements_.emplace_back();
    e.index = elements_.size() - 1 - first_;
    e.text = text;
    e.scalar = std::move(scalar);
    e.version = version_;
    post_(&e);
  }
  template <typename T>
  bool Scalar(T&& value) {
    Starts(false);
    if (in_kernels_ && depth_ == 2) Post({}, json(std::forward<T>(value)));
    return true;
  }
  bool Open(bool is_array) {
    if (depth_ == 0) top_is_object_ = !is_array;
    Starts(is_array);
    const size_t at = Position() - 1;  // the opening bracket (see Cursor)
    if (in_kernels_ && depth_ == 1) array_begin_ = at;
    if (in_kernels_ && depth_ == 2) element_begin_ = at;
    ++depth_;
    return true;
  }
  bool Close() {
    --depth_;
    if (in_kernels_ && depth_ == 2) {
      Post(text_.substr(element_begin_, Position() - element_begin_), nullptr);
    }
    if (in_kernels_ && depth_ == 1) {
      array_end_ = Position();
      in_kernels_ = false;
    }
    return true;
  }

  const absl::string_view text_;
  const char* const* read_;
  std::function<void(KernelElement*)> post_;
  size_t depth_ = 0;
  bool top_is_object_ = false;
  TopKey top_key_ = kOther;
  std::string format_;
  int version_ = kMaxFormat;
  bool found_ = false;
  bool in_kernels_ = false;
  size_t first_ = 0;
  size_t array_begin_ = 0, array_end_ = 0, element_begin_ = 0;
  std::deque<KernelElement> elements_;  // a deque: posted elements stay put
  std::string error_;
};

}  // namespace

absl::StatusOr<ManifestSpec> ParseManifest(absl::string_view text, absl::string_view file) {
  // The SAX pass on this thread, each kernel parsed on another as soon as it is found.
  const char* read = text.data();
  std::optional<KernelFinder> found;
  bool syntax_ok = false;
  constexpr size_t kBytesPerThread = 256 << 10;
  ParallelPipeline<KernelElement>(
      ThreadsFor(text.size(), kBytesPerThread),
      [&](const std::function<void(KernelElement*)>& post) {
        found.emplace(text, &read, post);
        const Cursor begin(text.data(), &read), end(text.data() + text.size(), &read);
        syntax_ok = json::sax_parse(begin, end, &*found);
      },
      [&](KernelElement* e) { ParseElement(*e, file); });
  KernelFinder& finder = *found;
  if (!syntax_ok) return NotJson(file, finder.error());

  // The document without its kernels (a value of valid JSON replaced by "[]" leaves valid
  // JSON, once the array's span is checked to be bracketed, as each element's was).
  std::string rest;
  if (finder.found()) {
    if (!Bracketed(text.substr(finder.array_begin(),
                               finder.array_end() - finder.array_begin()))) {
      return absl::InternalError(absl::StrCat(
          file, ": nlohmann_json reported positions that are not the kernels array's brackets; "
                "src/manifest/manifest.cc (Cursor) needs adapting to it"));
    }
    rest = absl::StrCat(text.substr(0, finder.array_begin()), "[]",
                        text.substr(finder.array_end()));
  }
  const absl::string_view rest_text = finder.found() ? absl::string_view(rest) : text;
  const json doc =
      json::parse(rest_text.begin(), rest_text.end(), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return NotJson(file, "the document without its kernels");
  ManifestSpec manifest;
  KPACK_ASSIGN_OR_RETURN(Where top, ParseTop(doc, file, manifest));

  // The final array's elements; those parsed for another format than the document's
  // again (a "format" after the kernels, or given twice).
  std::vector<KernelElement*> elements;
  for (size_t i = finder.first(); i < finder.elements().size(); ++i) {
    elements.push_back(&finder.elements()[i]);
  }
  ParallelFor(elements.size(), ThreadsFor(text.size(), kBytesPerThread), [&](size_t i) {
    if (elements[i]->version != top.version()) {
      elements[i]->version = top.version();
      ParseElement(*elements[i], file);
    }
    return true;
  });
  std::vector<absl::StatusOr<KernelSpec>> kernels;
  kernels.reserve(elements.size());
  for (KernelElement* e : elements) kernels.push_back(std::move(e->kernel));
  KPACK_RETURN_IF_ERROR(AddKernels(kernels, top, manifest));
  return manifest;
}

absl::StatusOr<ManifestSpec> ParseManifestWhole(absl::string_view text, absl::string_view file) {
  json doc;
  try {
    doc = json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    return NotJson(file, e.what());
  }
  ManifestSpec manifest;
  KPACK_ASSIGN_OR_RETURN(Where top, ParseTop(doc, file, manifest));
  const json& array = doc["kernels"];
  std::vector<absl::StatusOr<KernelSpec>> kernels;
  for (size_t i = 0; i < array.size(); ++i) {
    kernels.push_back(ParseKernel(array[i], top, i));
    if (!kernels.back().ok()) break;  // the first error is the one reported
  }
  KPACK_RETURN_IF_ERROR(AddKernels(kernels, top, manifest));
  return manifest;
}

}  // namespace kpack::internal
