// kpack.Param, kpack.Variant (struct sequences) and the Python objects a kernel describes
// itself with, built from the public introspection API; see meta.h.

#include "meta.h"

#include <string_view>

#include "errors.h"
#include "kpack/pack.h"

namespace kpack::python {
namespace {

PyTypeObject* g_param_type = nullptr;
PyTypeObject* g_variant_type = nullptr;

// Fields past n_in_sequence are attributes only: a Param still unpacks as
// (name, type, constexpr), a Variant as its first ten fields.
PyStructSequence_Field g_param_fields[] = {
    {"name", "parameter name"},
    {"type", "Triton type, e.g. '*fp32', 'i32', 'constexpr'"},
    {"constexpr", "compiled into the variants, not passed at launch"},
    {"readonly", "a pointer the build spec declared the kernel never writes through (kpack/2)"},
    {nullptr, nullptr},
};
PyStructSequence_Desc g_param_desc = {"kpack.Param", "A kernel parameter.", g_param_fields, 3};

PyStructSequence_Field g_variant_fields[] = {
    {"name", "variant name"},
    {"bucket", "{param: (low, high)} inclusive, None unbounded; {} serves every bucket"},
    {"assumptions", "{param: ('div16' | 'eq1', ...)} that must hold for this variant"},
    {"num_warps", "threads per program / 32"},
    {"num_ctas", "cluster size along x"},
    {"num_stages", "software pipelining stages (informational)"},
    {"shared", "dynamic shared memory bytes"},
    {"constexprs", "{name: value} compiled into this variant"},
    {"arch", "compute capability the cubin was built for (90: sm_90a)"},
    {"arg_types", "Triton type of each call parameter in this variant"},
    {"global_scratch_size", "Triton global scratch bytes per program (0: none)"},
    {"profile_scratch_size", "Triton profile scratch bytes per program (0: none)"},
    {"launch_pdl", "launched with programmatic dependent launch"},
    {"launch_cooperative_grid", "launched as a cooperative grid"},
    {nullptr, nullptr},
};
PyStructSequence_Desc g_variant_desc = {"kpack.Variant", "A compiled variant of a kernel.",
                                        g_variant_fields, 10};

PyObject* Str(const std::string& s) {
  return PyUnicode_FromStringAndSize(s.data(), static_cast<Py_ssize_t>(s.size()));
}

PyObject* StrTuple(const std::vector<std::string>& items) {
  PyObject* t = PyTuple_New(static_cast<Py_ssize_t>(items.size()));
  for (size_t i = 0; t != nullptr && i < items.size(); ++i) {
    PyObject* s = Str(items[i]);
    if (s == nullptr) {
      Py_DECREF(t);
      return nullptr;
    }
    PyTuple_SET_ITEM(t, static_cast<Py_ssize_t>(i), s);
  }
  return t;
}

PyObject* OptInt(const std::optional<int64_t>& v) {
  return v ? PyLong_FromLongLong(*v) : Py_NewRef(Py_None);
}

// Sets field `i` of a struct sequence, stealing `v`; false when `v` is null.
bool SetField(PyObject* seq, Py_ssize_t i, PyObject* v) {
  if (v == nullptr) return false;
  PyStructSequence_SetItem(seq, i, v);
  return true;
}

bool DictSet(PyObject* d, const std::string& key, PyObject* v) {
  if (v == nullptr) return false;
  const int r = PyDict_SetItemString(d, key.c_str(), v);
  Py_DECREF(v);
  return r == 0;
}

}  // namespace

KernelMeta::~KernelMeta() {
  for (PyObject* d : constexprs_) Py_XDECREF(d);
}

void KernelMeta::Init(const Kernel& kernel) {
  for (size_t i = 0; i < kernel.num_args(); ++i) {
    call_names_.emplace_back(kernel.arg_name(i));
    signature += (i ? ", " : "") + call_names_.back();
  }
  const KernelInfo& info = kernel.info();
  for (const ParamInfo& p : info.params) {
    params_.push_back({p.name, p.type, p.is_constexpr, p.readonly});
  }
  grid_ = info.grid;
  source_qualname_ = info.source.qualname;
  source_sha256_ = info.source.sha256;
  autotune_key_ = info.autotune_key;
  for (const VariantInfo& v : info.variants) {
    VariantMeta m;
    m.name = v.name;
    for (size_t d = 0; d < v.bucket.size() && d < info.buckets.size(); ++d) {
      const std::vector<int64_t>& edges = info.buckets[d].edges;
      const size_t j = static_cast<size_t>(v.bucket[d]);
      VariantMeta::Range r{info.buckets[d].param, std::nullopt, std::nullopt};
      if (j > 0 && j - 1 < edges.size()) r.low = edges[j - 1] + 1;
      if (j < edges.size()) r.high = edges[j];
      m.bucket.push_back(std::move(r));
    }
    for (const AssumptionInfo& a : v.assumptions) m.assumptions.emplace_back(a.param, a.kind);
    m.num_warps = v.num_warps;
    m.num_ctas = v.num_ctas;
    m.num_stages = v.num_stages;
    m.arch = v.arch;
    m.shared = v.shared;
    m.constexprs_json = v.constexprs_json;
    m.arg_types = v.arg_types;
    m.global_scratch_size = v.global_scratch_size;
    m.profile_scratch_size = v.profile_scratch_size;
    m.launch_pdl = v.launch_pdl;
    m.launch_cooperative_grid = v.launch_cooperative_grid;
    has_scratch_ = has_scratch_ || v.global_scratch_size != 0 || v.profile_scratch_size != 0;
    variants_.push_back(std::move(m));
  }
  constexprs_.assign(variants_.size(), nullptr);
}

std::string KernelMeta::KeywordHint(const char* keyword) const {
  const std::string_view k = keyword != nullptr ? keyword : "";
  for (const ParamMeta& p : params_) {
    if (p.is_constexpr && p.name == k) {
      return " ('" + p.name + "' is a constexpr, compiled into the pack's variants; the "
             "launch picks the variant from the call arguments)";
    }
  }
  for (const char* option : {"num_warps", "num_ctas", "num_stages", "maxnreg"}) {
    if (k == option) {
      return " (launch options are fixed per variant in the pack: choose the variant with "
             "kernel.restrict(...))";
    }
  }
  return " (call parameters: " + signature + "; and stream=, scratch=, grid=)";
}

PyObject* KernelMeta::Params() const {
  PyObject* list = PyList_New(static_cast<Py_ssize_t>(params_.size()));
  if (list == nullptr) return nullptr;
  for (size_t i = 0; i < params_.size(); ++i) {
    PyObject* p = PyStructSequence_New(g_param_type);
    if (p == nullptr || !SetField(p, 0, Str(params_[i].name)) ||
        !SetField(p, 1, Str(params_[i].type)) ||
        !SetField(p, 2, PyBool_FromLong(params_[i].is_constexpr)) ||
        !SetField(p, 3, PyBool_FromLong(params_[i].readonly))) {
      Py_XDECREF(p);
      Py_DECREF(list);
      return nullptr;
    }
    PyList_SET_ITEM(list, static_cast<Py_ssize_t>(i), p);
  }
  return list;
}

PyObject* KernelMeta::Constexprs(size_t variant) const {
  if (constexprs_[variant] != nullptr) return constexprs_[variant];
  PyObject* json = PyImport_ImportModule("json");
  if (json == nullptr) return nullptr;
  PyObject* d = PyObject_CallMethod(json, "loads", "s", variants_[variant].constexprs_json.c_str());
  Py_DECREF(json);
  if (d == nullptr) return nullptr;
  constexprs_[variant] = d;
  return d;
}

PyObject* KernelMeta::Variants() const {
  PyObject* list = PyList_New(static_cast<Py_ssize_t>(variants_.size()));
  if (list == nullptr) return nullptr;
  for (size_t i = 0; i < variants_.size(); ++i) {
    const VariantMeta& v = variants_[i];
    PyObject* bucket = PyDict_New();
    PyObject* assumptions = PyDict_New();
    PyObject* out = PyStructSequence_New(g_variant_type);
    bool ok = bucket != nullptr && assumptions != nullptr && out != nullptr;
    for (size_t d = 0; ok && d < v.bucket.size(); ++d) {
      PyObject* lo = OptInt(v.bucket[d].low);
      PyObject* hi = OptInt(v.bucket[d].high);
      PyObject* range = lo && hi ? PyTuple_Pack(2, lo, hi) : nullptr;
      Py_XDECREF(lo);
      Py_XDECREF(hi);
      ok = DictSet(bucket, v.bucket[d].param, range);
    }
    for (size_t a = 0; ok && a < v.assumptions.size(); ++a) {
      // One tuple of kinds per parameter, in manifest order.
      PyObject* key = Str(v.assumptions[a].first);
      PyObject* kind = Str(v.assumptions[a].second);
      ok = key != nullptr && kind != nullptr;
      if (ok) {
        PyObject* old = PyDict_GetItemWithError(assumptions, key);
        PyObject* single = PyTuple_Pack(1, kind);
        PyObject* kinds = old == nullptr ? Py_XNewRef(single)
                                         : (single ? PySequence_Concat(old, single) : nullptr);
        Py_XDECREF(single);
        ok = kinds != nullptr && PyDict_SetItem(assumptions, key, kinds) == 0;
        Py_XDECREF(kinds);
      }
      Py_XDECREF(key);
      Py_XDECREF(kind);
    }
    PyObject* constexprs = ok ? Constexprs(i) : nullptr;
    PyObject* types = ok ? PyTuple_New(static_cast<Py_ssize_t>(v.arg_types.size())) : nullptr;
    for (size_t t = 0; types != nullptr && t < v.arg_types.size(); ++t) {
      PyObject* s = Str(v.arg_types[t]);
      if (s == nullptr) {
        Py_CLEAR(types);
        break;
      }
      PyTuple_SET_ITEM(types, static_cast<Py_ssize_t>(t), s);
    }
    ok = ok && constexprs != nullptr && types != nullptr && SetField(out, 0, Str(v.name)) &&
         SetField(out, 1, Py_NewRef(bucket)) && SetField(out, 2, Py_NewRef(assumptions)) &&
         SetField(out, 3, PyLong_FromLong(v.num_warps)) &&
         SetField(out, 4, PyLong_FromLong(v.num_ctas)) &&
         SetField(out, 5, PyLong_FromLong(v.num_stages)) &&
         SetField(out, 6, PyLong_FromUnsignedLong(v.shared)) &&
         SetField(out, 7, PyDict_Copy(constexprs)) && SetField(out, 8, PyLong_FromLong(v.arch)) &&
         SetField(out, 9, Py_NewRef(types)) &&
         SetField(out, 10, PyLong_FromUnsignedLong(v.global_scratch_size)) &&
         SetField(out, 11, PyLong_FromUnsignedLong(v.profile_scratch_size)) &&
         SetField(out, 12, PyBool_FromLong(v.launch_pdl)) &&
         SetField(out, 13, PyBool_FromLong(v.launch_cooperative_grid));
    Py_XDECREF(bucket);
    Py_XDECREF(assumptions);
    Py_XDECREF(types);
    if (!ok) {
      Py_XDECREF(out);
      Py_DECREF(list);
      return nullptr;
    }
    PyList_SET_ITEM(list, static_cast<Py_ssize_t>(i), out);
  }
  return list;
}

PyObject* KernelMeta::GridExpressions() const { return StrTuple(grid_); }

PyObject* KernelMeta::Source() const {
  if (source_qualname_.empty()) Py_RETURN_NONE;
  PyObject* q = Str(source_qualname_);
  PyObject* h = Str(source_sha256_);
  PyObject* t = q != nullptr && h != nullptr ? PyTuple_Pack(2, q, h) : nullptr;
  Py_XDECREF(q);
  Py_XDECREF(h);
  return t;
}

PyObject* KernelMeta::AutotuneKey() const { return StrTuple(autotune_key_); }

PyObject* KernelMeta::GridMeta(const Kernel& kernel, std::span<const Arg> args,
                               PyObject* const* objects) const {
  absl::StatusOr<std::string_view> chosen = kernel.SelectVariant(args);
  if (!chosen.ok()) return RaiseStatus(chosen.status());
  size_t v = 0;
  while (v < variants_.size() && variants_[v].name != *chosen) ++v;
  if (v == variants_.size()) {
    PyErr_Format(PyExc_RuntimeError, "kpack: selected variant '%.200s' is not described",
                 std::string(*chosen).c_str());
    return nullptr;
  }
  PyObject* constexprs = Constexprs(v);
  if (constexprs == nullptr) return nullptr;
  PyObject* meta = PyDict_Copy(constexprs);
  if (meta == nullptr) return nullptr;
  bool ok = true;
  for (size_t i = 0; ok && i < call_names_.size(); ++i) {
    ok = PyDict_SetItemString(meta, call_names_[i].c_str(), objects[i]) == 0;
  }
  ok = ok && DictSet(meta, "num_warps", PyLong_FromLong(variants_[v].num_warps)) &&
       DictSet(meta, "num_ctas", PyLong_FromLong(variants_[v].num_ctas)) &&
       DictSet(meta, "num_stages", PyLong_FromLong(variants_[v].num_stages));
  if (!ok) {
    Py_DECREF(meta);
    return nullptr;
  }
  return meta;
}

bool InitMetaTypes(PyObject* module) {
  g_param_type = PyStructSequence_NewType(&g_param_desc);
  g_variant_type = PyStructSequence_NewType(&g_variant_desc);
  if (g_param_type == nullptr || g_variant_type == nullptr) return false;
  return PyModule_AddObjectRef(module, "Param", reinterpret_cast<PyObject*>(g_param_type)) == 0 &&
         PyModule_AddObjectRef(module, "Variant", reinterpret_cast<PyObject*>(g_variant_type)) == 0;
}

}  // namespace kpack::python
