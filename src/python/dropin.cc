// The drop-in's C half; see dropin.h for the protocol with kpack/_dropin.py.

#include "dropin.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/optimization.h"
#include "absl/container/flat_hash_map.h"
#include "convert.h"
#include "kernel.h"
#include "vectorcall.h"

namespace nb = nanobind;

namespace kpack::python {
namespace {

// How calls of one shape (positional count, keyword names) bind, and their targets.
struct Shape {
  Py_ssize_t nargs = 0;
  PyObject* kwnames = nullptr;   // strong, or null for positional calls
  PyObject* info = nullptr;      // strong: the resolver's shape object
  PyObject* reason = nullptr;    // strong: every call of this shape falls back
  PyObject* defaults = nullptr;  // strong tuple
  PyObject* targets = nullptr;   // strong dict: key tuple -> kernel object | reason str
  std::vector<Py_ssize_t> key_pos;
  std::vector<Py_ssize_t> call_pos;  // >= 0: vectorcall position; -1-d: defaults[d]
  std::vector<size_t> dtype_params;  // indices into call_pos
  // The last key and its target (strong): a repeated call compares instead of hashing.
  std::vector<PyObject*> last_key;
  std::vector<uint16_t> last_dtypes;
  PyObject* last_target = nullptr;

  ~Shape() {
    Py_XDECREF(kwnames);
    Py_XDECREF(info);
    Py_XDECREF(reason);
    Py_XDECREF(defaults);
    Py_XDECREF(targets);
    for (PyObject* o : last_key) Py_XDECREF(o);
    Py_XDECREF(last_target);
  }
};

// One Triton kernel object (JITFunction or Autotuner) the drop-in has seen.
struct Entry {
  PyObject* fn = nullptr;      // strong
  PyObject* info = nullptr;    // strong; null: pass every call through, uncounted
  PyObject* reason = nullptr;  // strong: every call falls back
  PyObject* hooks = nullptr;   // strong list: the function's pre-run hooks
  std::vector<std::unique_ptr<Shape>> shapes;
  uint64_t kpack_calls = 0;
  uint64_t fallback_calls = 0;

  ~Entry() {
    Py_XDECREF(fn);
    Py_XDECREF(info);
    Py_XDECREF(reason);
    Py_XDECREF(hooks);
  }
};

PyObject* DropInVectorcall(PyObject* self, PyObject* const* args, size_t nargsf,
                           PyObject* kwnames);

// kpack._kpack.DropIn: a nanobind class with a hand-written vectorcall (vectorcall.h).
struct DropInObject {
  vectorcallfunc vectorcall = DropInVectorcall;
  nb::object resolver;
  nb::object original;  // Triton's KernelInterface.__getitem__
  absl::flat_hash_map<PyObject*, std::unique_ptr<Entry>> entries;

  DropInObject(nb::object r, nb::object o) : resolver(std::move(r)), original(std::move(o)) {}
  DropInObject(const DropInObject&) = delete;
  DropInObject& operator=(const DropInObject&) = delete;
};

// fn[grid]: made per call of that form, so a hand-written type (vectorcall.h).
struct LaunchObject {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  PyObject* table;  // strong: the kpack._kpack.DropIn, which owns `entry`
  Entry* entry;
  PyObject* grid;  // strong
};

DropInObject* Table(const LaunchObject* l) { return Self<DropInObject>(l->table); }

PyObject* LaunchVectorcall(PyObject* self, PyObject* const* args, size_t nargsf,
                           PyObject* kwnames);

// The dtype code of a None argument (kpack/_dropin.py's NONE_DTYPE): no DLPack dtype is
// (255, 255). The resolver picks for it a kernel that has the parameter as a constexpr
// None, so the argument is not passed to it.
constexpr uint16_t kNoneDType = 0xFFFF;

PyTypeObject* g_launch_type = nullptr;
PyObject* g_hooks_reason = nullptr;  // "it has pre-run hooks"
PyObject* g_unhashable_reason = nullptr;

// The resolver's method `name` called with `args`; new reference or null.
template <typename... A>
PyObject* Ask(const DropInObject* d, const char* name, A... args) {
  return PyObject_CallMethod(d->resolver.ptr(), name, std::string(sizeof...(A), 'O').c_str(),
                             args...);
}

// ---------------------------------------------------------------- fn[grid]

Entry* FindEntry(DropInObject* d, PyObject* fn) {
  auto it = d->entries.find(fn);
  if (ABSL_PREDICT_TRUE(it != d->entries.end())) return it->second.get();
  PyObject* r = Ask(d, "function", fn);
  if (r == nullptr) return nullptr;
  auto e = std::make_unique<Entry>();
  e->fn = Py_NewRef(fn);
  if (r != Py_None) {
    PyObject *info, *reason, *hooks;
    if (!PyArg_ParseTuple(r, "OOO!:resolver.function", &info, &reason, &PyList_Type, &hooks)) {
      Py_DECREF(r);
      return nullptr;
    }
    e->info = Py_NewRef(info);
    e->reason = reason == Py_None ? nullptr : Py_NewRef(reason);
    e->hooks = Py_NewRef(hooks);
  }
  Py_DECREF(r);
  // The resolver ran Python code, which may have made this entry meanwhile; the first
  // one stays (launchers of it may be alive).
  if (auto again = d->entries.find(fn); again != d->entries.end()) return again->second.get();
  Entry* raw = e.get();
  d->entries.emplace(fn, std::move(e));  // the entry holds `fn`, so its address stays unique
  return raw;
}

PyObject* DropInVectorcall(PyObject* self, PyObject* const* args, size_t nargsf,
                           PyObject* kwnames) {
  DropInObject* d = Self<DropInObject>(self);
  if (PyVectorcall_NARGS(nargsf) != 2 || kwnames != nullptr) {
    PyErr_SetString(PyExc_TypeError, "__getitem__(kernel, grid) takes 2 arguments");
    return nullptr;
  }
  PyObject* fn = args[0];
  Entry* e = FindEntry(d, fn);
  if (e == nullptr) return nullptr;
  if (e->info == nullptr) {
    return PyObject_CallFunctionObjArgs(d->original.ptr(), fn, args[1], nullptr);
  }
  LaunchObject* l = PyObject_GC_New(LaunchObject, g_launch_type);
  if (l == nullptr) return nullptr;
  l->vectorcall = nullptr;  // set once the members are
  l->table = Py_NewRef(self);
  l->entry = e;
  l->grid = Py_NewRef(args[1]);
  l->vectorcall = LaunchVectorcall;
  PyObject_GC_Track(reinterpret_cast<PyObject*>(l));
  return reinterpret_cast<PyObject*>(l);
}

// Bound to an instance (kernel.__getitem__ looked up by name): a method over it.
PyObject* DropInDescrGet(PyObject* self, PyObject* obj, PyObject*) {
  if (obj == nullptr || obj == Py_None) return Py_NewRef(self);
  return PyMethod_New(self, obj);
}

// ---------------------------------------------------------------- the call

// Triton's own launch of this call (its JIT), after the resolver has counted and warned
// (or raised, strict).
PyObject* Fallback(LaunchObject* l, PyObject* reason, PyObject* const* args, size_t nargsf,
                   PyObject* kwnames) {
  DropInObject* d = Table(l);
  Entry* e = l->entry;
  PyObject* r = Ask(d, "fallback", e->info, reason);
  if (r == nullptr) return nullptr;
  Py_DECREF(r);
  ++e->fallback_calls;
  PyObject* proxy = PyObject_CallFunctionObjArgs(d->original.ptr(), e->fn, l->grid, nullptr);
  if (proxy == nullptr) return nullptr;
  PyObject* result = PyObject_Vectorcall(proxy, args, nargsf, kwnames);
  Py_DECREF(proxy);
  return result;
}

// Keyword names that are the same objects: a call site's constant tuple, or (for a call
// with **kwargs, whose tuple is new each time) the same interned strings.
bool SameNames(PyObject* a, PyObject* b) {
  if (a == b) return true;
  if (a == nullptr || b == nullptr || PyTuple_GET_SIZE(a) != PyTuple_GET_SIZE(b)) return false;
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(a); ++i) {
    if (PyTuple_GET_ITEM(a, i) != PyTuple_GET_ITEM(b, i)) return false;
  }
  return true;
}

Shape* FindShape(LaunchObject* l, Py_ssize_t nargs, PyObject* kwnames) {
  Entry* e = l->entry;
  for (const std::unique_ptr<Shape>& s : e->shapes) {
    if (s->nargs != nargs) continue;
    if (s->kwnames == kwnames) return s.get();
    if (s->kwnames != nullptr && kwnames != nullptr) {
      const int eq = PyObject_RichCompareBool(s->kwnames, kwnames, Py_EQ);
      if (eq < 0) return nullptr;
      if (eq == 1) return s.get();
    }
  }
  PyObject* n = PyLong_FromSsize_t(nargs);
  if (n == nullptr) return nullptr;
  PyObject* r = Ask(Table(l), "shape", e->info, n, kwnames != nullptr ? kwnames : Py_None);
  Py_DECREF(n);
  if (r == nullptr) return nullptr;
  auto s = std::make_unique<Shape>();
  s->nargs = nargs;
  s->kwnames = Py_XNewRef(kwnames);
  if (PyUnicode_Check(r)) {
    s->reason = r;
  } else {
    PyObject *info, *key_pos, *call_pos, *defaults, *dtype_params;
    const bool ok = PyArg_ParseTuple(r, "OO!O!O!O!:resolver.shape", &info, &PyTuple_Type,
                                     &key_pos, &PyTuple_Type, &call_pos, &PyTuple_Type,
                                     &defaults, &PyTuple_Type, &dtype_params);
    if (ok) {
      s->info = Py_NewRef(info);
      s->defaults = Py_NewRef(defaults);
      s->targets = PyDict_New();
      for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(key_pos); ++i) {
        s->key_pos.push_back(PyLong_AsSsize_t(PyTuple_GET_ITEM(key_pos, i)));
      }
      for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(call_pos); ++i) {
        s->call_pos.push_back(PyLong_AsSsize_t(PyTuple_GET_ITEM(call_pos, i)));
      }
      for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(dtype_params); ++i) {
        s->dtype_params.push_back(PyLong_AsSize_t(PyTuple_GET_ITEM(dtype_params, i)));
      }
      s->last_key.assign(s->key_pos.size(), nullptr);
      s->last_dtypes.assign(s->dtype_params.size(), 0);
    }
    Py_DECREF(r);
    if (!ok || s->targets == nullptr || PyErr_Occurred()) return nullptr;
    const Py_ssize_t limit = nargs + (kwnames != nullptr ? PyTuple_GET_SIZE(kwnames) : 0);
    for (Py_ssize_t p : s->key_pos) {
      if (p < 0 || p >= limit) {
        PyErr_SetString(PyExc_RuntimeError, "kpack drop-in: resolver.shape: bad key position");
        return nullptr;
      }
    }
    for (Py_ssize_t p : s->call_pos) {
      if (p >= limit || (p < 0 && -1 - p >= PyTuple_GET_SIZE(s->defaults))) {
        PyErr_SetString(PyExc_RuntimeError, "kpack drop-in: resolver.shape: bad call position");
        return nullptr;
      }
    }
    for (size_t i : s->dtype_params) {
      if (i >= s->call_pos.size()) {
        PyErr_SetString(PyExc_RuntimeError, "kpack drop-in: resolver.shape: bad dtype param");
        return nullptr;
      }
    }
  }
  e->shapes.push_back(std::move(s));
  return e->shapes.back().get();
}

// Whether `a` is `b` as a key value: identical, or equal and of the same type (True is
// not 1 for Triton: they compile differently). -1 with an exception set.
int SameValue(PyObject* a, PyObject* b) {
  if (a == b) return 1;
  if (b == nullptr || Py_TYPE(a) != Py_TYPE(b)) return 0;
  return PyObject_RichCompareBool(a, b, Py_EQ);
}

// The call's target: the last one when the key repeats, else from the shape's table,
// else from the resolver. Borrowed (held by the shape), or null with an exception set.
PyObject* Target(LaunchObject* l, Shape* s, PyObject* const* args, PyObject* const* call,
                 uint16_t* dtypes) {
  bool same = s->last_target != nullptr;
  for (size_t i = 0; i < s->key_pos.size(); ++i) {
    if (!same) break;
    const int r = SameValue(args[s->key_pos[i]], s->last_key[i]);
    if (r < 0) return nullptr;
    same = r == 1;
  }
  for (size_t i = 0; i < s->dtype_params.size(); ++i) {
    uint8_t code = 0, bits = 0;
    PyObject* arg = call[s->dtype_params[i]];
    dtypes[i] = arg == Py_None                     ? kNoneDType
                : TensorDType(arg, &code, &bits) ? static_cast<uint16_t>(code << 8 | bits)
                                                 : 0;
    same = same && dtypes[i] == s->last_dtypes[i];
  }
  if (ABSL_PREDICT_TRUE(same)) return s->last_target;

  const size_t nkey = s->key_pos.size(), ndt = s->dtype_params.size();
  PyObject* values = PyTuple_New(static_cast<Py_ssize_t>(nkey));
  PyObject* types = PyTuple_New(static_cast<Py_ssize_t>(ndt));
  PyObject* key = nullptr;
  PyObject* target = nullptr;
  if (values != nullptr && types != nullptr) {
    for (size_t i = 0; i < nkey; ++i) {
      PyTuple_SET_ITEM(values, static_cast<Py_ssize_t>(i), Py_NewRef(args[s->key_pos[i]]));
    }
    bool ok = true;
    for (size_t i = 0; ok && i < ndt; ++i) {
      PyObject* t = PyLong_FromLong(dtypes[i]);
      ok = t != nullptr;
      if (ok) PyTuple_SET_ITEM(types, static_cast<Py_ssize_t>(i), t);
    }
    // The values' Python types join the key: 1, 1.0 and True are equal and hash alike in
    // a dict, but are different constexprs (Triton compiles each apart).
    PyObject* value_types = ok ? PyTuple_New(static_cast<Py_ssize_t>(nkey)) : nullptr;
    for (size_t i = 0; value_types != nullptr && i < nkey; ++i) {
      PyTuple_SET_ITEM(value_types, static_cast<Py_ssize_t>(i),
                       Py_NewRef(reinterpret_cast<PyObject*>(Py_TYPE(args[s->key_pos[i]]))));
    }
    if (value_types != nullptr) {
      key = PyTuple_Pack(3, values, types, value_types);
      Py_DECREF(value_types);
    }
  }
  if (key != nullptr) {
    target = PyDict_GetItemWithError(s->targets, key);  // borrowed
    if (target == nullptr && PyErr_ExceptionMatches(PyExc_TypeError)) {
      PyErr_Clear();  // an unhashable constexpr: no cache, no kpack
      target = g_unhashable_reason;
    } else if (target == nullptr && !PyErr_Occurred()) {
      PyObject* r = Ask(Table(l), "target", l->entry->info, s->info, values, types);
      if (r != nullptr) {
        if (!PyUnicode_Check(r) && !IsKernelObject(r)) {
          PyErr_Format(PyExc_TypeError, "kpack drop-in: resolver.target returned %.200s",
                       Py_TYPE(r)->tp_name);
        } else if (PyDict_SetItem(s->targets, key, r) == 0) {
          target = r;  // the dict holds it
        }
        Py_DECREF(r);
      }
    }
  }
  Py_XDECREF(values);
  Py_XDECREF(types);
  Py_XDECREF(key);
  if (target == nullptr) return nullptr;
  // Remember it (strong references: the values may be temporaries of the caller's).
  for (size_t i = 0; i < nkey; ++i) Py_XSETREF(s->last_key[i], Py_NewRef(args[s->key_pos[i]]));
  for (size_t i = 0; i < ndt; ++i) s->last_dtypes[i] = dtypes[i];
  Py_XSETREF(s->last_target, Py_NewRef(target));
  return target;
}

PyObject* LaunchVectorcall(PyObject* self, PyObject* const* args, size_t nargsf,
                           PyObject* kwnames) {
  auto* l = reinterpret_cast<LaunchObject*>(self);
  Entry* e = l->entry;
  if (ABSL_PREDICT_FALSE(e->reason != nullptr)) return Fallback(l, e->reason, args, nargsf, kwnames);
  if (ABSL_PREDICT_FALSE(PyList_GET_SIZE(e->hooks) != 0)) {
    return Fallback(l, g_hooks_reason, args, nargsf, kwnames);
  }
  const Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
  Shape* s = nullptr;
  for (const std::unique_ptr<Shape>& c : e->shapes) {  // the common case: by identity
    if (c->nargs == nargs && SameNames(c->kwnames, kwnames)) s = c.get();
  }
  if (ABSL_PREDICT_FALSE(s == nullptr)) {
    s = FindShape(l, nargs, kwnames);
    if (s == nullptr) return nullptr;
  }
  if (ABSL_PREDICT_FALSE(s->reason != nullptr)) return Fallback(l, s->reason, args, nargsf, kwnames);

  constexpr size_t kInline = 40;
  const size_t n = s->call_pos.size(), ndt = s->dtype_params.size();
  PyObject* inline_call[kInline];
  uint16_t inline_dtypes[kInline];
  std::unique_ptr<PyObject*[]> heap_call;
  std::unique_ptr<uint16_t[]> heap_dtypes;
  PyObject** call = inline_call;
  uint16_t* dtypes = inline_dtypes;
  if (ABSL_PREDICT_FALSE(n > kInline || ndt > kInline)) {
    heap_call.reset(new PyObject*[n]);
    heap_dtypes.reset(new uint16_t[ndt]);
    call = heap_call.get();
    dtypes = heap_dtypes.get();
  }
  for (size_t i = 0; i < n; ++i) {
    const Py_ssize_t p = s->call_pos[i];
    call[i] = p >= 0 ? args[p] : PyTuple_GET_ITEM(s->defaults, -1 - p);
  }
  PyObject* target = Target(l, s, args, call, dtypes);
  if (target == nullptr) return nullptr;
  if (ABSL_PREDICT_FALSE(PyUnicode_Check(target))) {
    return Fallback(l, target, args, nargsf, kwnames);
  }
  // A None argument is a constexpr None of the target kernel: it is not passed.
  bool none = false;
  for (size_t i = 0; i < ndt; ++i) {
    if (ABSL_PREDICT_FALSE(dtypes[i] == kNoneDType)) {
      call[s->dtype_params[i]] = nullptr;
      none = true;
    }
  }
  size_t launched = n;
  if (ABSL_PREDICT_FALSE(none)) launched = std::remove(call, call + n, nullptr) - call;
  PyObject* r = LaunchObjects(target, l->grid, call, launched);
  if (r != nullptr) ++e->kpack_calls;
  return r;
}

// ---------------------------------------------------------------- object plumbing

int DropInTraverse(PyObject* self, visitproc visit, void* arg) {
  Py_VISIT(Py_TYPE(self));
  if (!nb::inst_ready(self)) return 0;
  DropInObject* d = Self<DropInObject>(self);
  Py_VISIT(d->resolver.ptr());
  Py_VISIT(d->original.ptr());
  for (const auto& [fn, e] : d->entries) {
    Py_VISIT(e->fn);
    Py_VISIT(e->info);
    Py_VISIT(e->reason);
    Py_VISIT(e->hooks);
    for (const std::unique_ptr<Shape>& s : e->shapes) {
      Py_VISIT(s->info);
      Py_VISIT(s->targets);
      Py_VISIT(s->last_target);
      for (PyObject* o : s->last_key) Py_VISIT(o);
    }
  }
  return 0;
}

// Breaks cycles through the resolver (which reaches the installation, and so this table):
// the entries' own references are to objects the collector can clear itself, and live
// launchers of an entry may still read it.
int DropInClear(PyObject* self) {
  if (!nb::inst_ready(self)) return 0;
  DropInObject* d = Self<DropInObject>(self);
  d->resolver.reset();
  d->original.reset();
  return 0;
}

// stats() -> [(fn, kpack_calls, fallback_calls), ...] for the functions seen.
nb::list DropInStats(const DropInObject& d) {
  nb::list list;
  for (const auto& [fn, e] : d.entries) {
    if (e->info == nullptr) continue;
    list.append(nb::make_tuple(nb::handle(e->fn), e->kpack_calls, e->fallback_calls));
  }
  return list;
}

PyObject* LaunchRepr(PyObject* self) {
  auto* l = reinterpret_cast<LaunchObject*>(self);
  return PyUnicode_FromFormat("<kpack drop-in launch of %R with grid %R>", l->entry->fn,
                              l->grid != nullptr ? l->grid : Py_None);
}

}  // namespace

void InitDropIn(nb::module_& m) {
  g_hooks_reason = PyUnicode_InternFromString(
      "it has pre-run hooks (JITFunction.add_pre_run_hook), which only Triton's launcher runs");
  g_unhashable_reason = PyUnicode_InternFromString(
      "a constexpr or launch option value of the call is not hashable");
  g_launch_type = MakeLaunchType<LaunchObject, &LaunchObject::table, &LaunchObject::grid>(
      "kpack.DropInLaunch", {{Py_tp_repr, reinterpret_cast<void*>(LaunchRepr)}},
      "kernel[grid] under kpack.install: call it with the kernel's arguments.");
  if (g_hooks_reason == nullptr || g_unhashable_reason == nullptr || g_launch_type == nullptr) {
    throw nb::python_error();
  }
  // A method descriptor: `fn[grid]` calls it as (fn, grid), with no bound method made.
  nb::class_<DropInObject> cls(
      m, "DropIn",
      nb::type_slots(VectorcallClassSlots<DropInObject>(
          {{Py_tp_traverse, reinterpret_cast<void*>(DropInTraverse)},
           {Py_tp_clear, reinterpret_cast<void*>(DropInClear)},
           {Py_tp_descr_get, reinterpret_cast<void*>(DropInDescrGet)}})),
      nb::is_final(),
      "DropIn(resolver, original): installed as Triton's KernelInterface.__getitem__ by "
      "kpack.install (see kpack/_dropin.py).");
  FinishVectorcallClass<DropInObject>(cls, Py_TPFLAGS_METHOD_DESCRIPTOR);
  cls.def(nb::init<nb::object, nb::object>(), nb::arg("resolver"), nb::arg("original"))
      .def("stats", &DropInStats,
           "stats() -> [(function, kpack_calls, fallback_calls)] for every function seen.");
}

}  // namespace kpack::python
