// kpack.BoundLaunch: bind, the relaunch b(), and the slow methods (nanobind). See bound.h.

#include "bound.h"

#include <nanobind/stl/string.h>

#include <memory>
#include <new>
#include <optional>
#include <string>
#include <utility>

#include "absl/base/optimization.h"
#include "convert.h"
#include "errors.h"
#include "grid.h"
#include "kernel.h"
#include "scratch_callable.h"
#include "streams.h"
#include "vectorcall.h"

namespace nb = nanobind;

namespace kpack::python {
namespace {

struct BoundObj {
  vectorcallfunc vectorcall;
  nb::object kernel;  // the kpack.Kernel object: its plan and runtime
  KernelObj* k = nullptr;
  nb::object args;  // list: the argument objects, kept alive while the launch may use them
  nb::object scratch_fn;               // the scratch callable, or null
  std::unique_ptr<PyScratch> scratch;  // over scratch_fn, when there is one
  // How each call finds its stream: explicit (fixed at bind or set_stream), else the
  // producer's current stream of `device` through `api`, else torch's, else legacy.
  bool stream_explicit = false;
  const DLPackExchangeAPI* api = nullptr;
  int32_t device = -1;
  CUstream last_stream = nullptr;
  std::optional<BoundLaunch> bound;  // last: destroyed first, while the runtime lives
};

PyTypeObject* g_bound_type = nullptr;

PyObject* BoundVectorcall(PyObject* self, PyObject* const* args, size_t nargsf,
                          PyObject* kwnames);

// b(): relaunches. Unless the stream was given at bind, it follows the current stream
// (torch's, for torch tensors) like an eager call: one C call per launch.
PyObject* BoundVectorcall(PyObject* self, PyObject* const* args, size_t nargsf,
                          PyObject* kwnames) {
  BoundObj* b = Self<BoundObj>(self);
  if (PyVectorcall_NARGS(nargsf) != 0 || kwnames != nullptr) {
    PyErr_SetString(PyExc_TypeError,
                    "a bound launch takes no arguments; change them with .set(name, value)");
    return nullptr;
  }
  RuntimeState* rt = b->k->rt;
  if (b->device >= 0) {  // its tensors' device must be current, as for an eager call
    int current = -1;
    bool have_context = false;
    if (!CurrentDevice(*rt, b->device, &current, &have_context)) return nullptr;
    if (ABSL_PREDICT_FALSE(current != b->device)) {
      ValueErrorF("kernel '%s': the bound launch's tensors are on cuda:%d but the current "
                  "device is cuda:%d (use torch.cuda.set_device or `with "
                  "torch.cuda.device(...)`)",
                  b->k->plan->name.c_str(), static_cast<int>(b->device), current);
      return nullptr;
    }
  }
  if (!MaybePreload(rt, b->device)) return nullptr;
  if (!b->stream_explicit) {
    CUstream stream;
    if (!DefaultStream(*rt, b->api, b->device, &stream)) return nullptr;
    if (stream != b->last_stream) {
      b->bound->set_stream(stream);
      b->last_stream = stream;
    }
  }
  return LaunchResult(b->bound->Launch(), b->scratch.get());
}

int BoundTraverse(PyObject* self, visitproc visit, void* arg) {
  Py_VISIT(Py_TYPE(self));
  if (!nb::inst_ready(self)) return 0;
  BoundObj* b = Self<BoundObj>(self);
  Py_VISIT(b->kernel.ptr());
  Py_VISIT(b->args.ptr());
  Py_VISIT(b->scratch_fn.ptr());
  return 0;
}

// b.set(name_or_index, value)
void Set(BoundObj& b, nb::handle which, nb::handle value) {
  const KernelPlan& p = *b.k->plan;
  size_t index = p.params.size();
  if (PyUnicode_Check(which.ptr())) {
    for (size_t i = 0; i < p.params.size(); ++i) {
      if (PyUnicode_Compare(which.ptr(), p.params[i].py_name.ptr()) == 0) index = i;
    }
    if (index == p.params.size()) {
      PyErr_Format(PyExc_KeyError, "kernel '%s' has no call parameter %R (%s)", p.name.c_str(),
                   which.ptr(), p.meta.signature.c_str());
      throw nb::python_error();
    }
  } else if (PyLong_Check(which.ptr()) && !PyBool_Check(which.ptr())) {
    const Py_ssize_t i = PyLong_AsSsize_t(which.ptr());
    if (i == -1 && PyErr_Occurred()) throw nb::python_error();
    if (i < 0 || static_cast<size_t>(i) >= p.params.size()) {
      PyErr_Format(PyExc_IndexError, "kernel '%s' has %zu call parameters; no index %zd",
                   p.name.c_str(), p.params.size(), i);
      throw nb::python_error();
    }
    index = static_cast<size_t>(i);
  } else {
    PyErr_Format(PyExc_TypeError, "set() takes a parameter name or index, got %.200s",
                 Py_TYPE(which.ptr())->tp_name);
    throw nb::python_error();
  }
  CallState st{b.k->rt};
  st.device = b.device;
  DescStorage descs(p.num_descs);  // a descriptor lives until Set has copied it
  st.descs = &descs;
  Arg a(0);
  if (!ConvertArg(p, index, value.ptr(), &st, &a)) throw nb::python_error();
  ThrowIfError(b.bound->Set(index, a));
  if (PyList_SetItem(b.args.ptr(), static_cast<Py_ssize_t>(index), Py_NewRef(value.ptr())) != 0) {
    throw nb::python_error();
  }
  if (b.api == nullptr && st.api != nullptr) b.api = st.api;
  if (b.device < 0) b.device = st.device;
}

void SetStream(BoundObj& b, nb::handle stream) {
  if (stream.is_none()) {
    b.stream_explicit = false;  // follow the current stream again
    return;
  }
  CUstream s;
  if (!ParseStream(stream.ptr(), &s)) throw nb::python_error();
  b.bound->set_stream(s);
  b.stream_explicit = true;
  b.last_stream = s;
}

}  // namespace

PyObject* BindCall(PyObject* kernel, const Grid* grid, PyObject* grid_fn, PyObject* const* args,
                   size_t nargs, PyObject* kwnames) {
  KernelObj* k = Self<KernelObj>(kernel);
  const KernelPlan& p = *k->plan;
  const size_t n = p.params.size();
  CallArgs a(n, p.num_descs);
  CallState st{k->rt};
  if (!PrepareCall(p, args, nargs, kwnames, true, &st, &a)) return nullptr;
  CUstream stream;
  if (!ResolveStream(*k->rt, &st, &stream)) return nullptr;
  if (!MaybePreload(k->rt, st.device)) return nullptr;
  const std::span<const Arg> span = a.span();
  PyObject** objects = a.objects();
  Grid g;
  if (!GridKeyword(p, st, &grid, &grid_fn, &g)) return nullptr;
  if (grid_fn != nullptr) {
    if (!EvalGridFn(p, grid_fn, span, objects, &g)) return nullptr;
    grid = &g;
  }
  absl::StatusOr<BoundLaunch> bound =
      grid != nullptr ? p.kernel.Bind(*grid, stream, span) : p.kernel.Bind(stream, span);
  if (!bound.ok()) return RaiseStatus(bound.status());
  try {
    nb::list kept;
    for (size_t i = 0; i < n; ++i) kept.append(nb::handle(objects[i]));
    nb::object o = nb::inst_alloc(nb::handle(reinterpret_cast<PyObject*>(g_bound_type)));
    BoundObj* b = new (Self<BoundObj>(o.ptr())) BoundObj{};
    b->vectorcall = BoundVectorcall;
    b->kernel = nb::borrow(kernel);
    b->k = k;
    b->args = std::move(kept);
    b->stream_explicit = st.has_explicit_stream;
    b->api = st.api;
    b->device = st.device;
    b->last_stream = stream;
    b->bound.emplace(*std::move(bound));
    if (PyObject* fn = ScratchFn(*k, st); fn != nullptr) {
      b->scratch_fn = nb::borrow(fn);
      b->scratch = std::make_unique<PyScratch>();
      b->scratch->fn = fn;
      b->bound->set_scratch_allocator(b->scratch->allocator());
    }
    nb::inst_mark_ready(o);
    return o.release().ptr();
  } catch (nb::python_error& e) {
    e.restore();
    return nullptr;
  }
}

BoundLaunch* AsBoundLaunch(PyObject* object) {
  if (g_bound_type == nullptr || Py_TYPE(object) != g_bound_type) return nullptr;
  BoundObj* b = Self<BoundObj>(object);
  return b->bound.has_value() ? &*b->bound : nullptr;
}

bool BoundStream(PyObject* bound, PyObject* stream, CUstream* out) {
  if (stream != nullptr && stream != Py_None) return ParseStream(stream, out);
  BoundObj* b = Self<BoundObj>(bound);  // as BoundVectorcall picks it
  if (b->stream_explicit) {
    *out = b->last_stream;
    return true;
  }
  return DefaultStream(*b->k->rt, b->api, b->device, out);
}

void ReleaseBoundScratch(PyObject* bound) {
  BoundObj* b = Self<BoundObj>(bound);
  if (b->scratch != nullptr) b->scratch->Release();
}

void InitBound(nb::module_& m) {
  nb::class_<BoundObj> cls(
      m, "BoundLaunch",
      nb::type_slots(VectorcallClassSlots<BoundObj>(
          {{Py_tp_traverse, reinterpret_cast<void*>(BoundTraverse)}})),
      nb::is_final(),
      "A launch whose arguments are checked, dispatched and packed: b() launches it.");
  FinishVectorcallClass<BoundObj>(cls);
  cls.attr("__module__") = "kpack";  // the public name: kpack.BoundLaunch
  g_bound_type = reinterpret_cast<PyTypeObject*>(cls.ptr());
  cls.def("set", &Set, nb::arg("name_or_index"), nb::arg("value"),
          "set(name_or_index, value): replace one argument (checked like at bind; a value "
          "that changes the bucket or an assumption selects the variant again).")
      .def(
          "set_grid", [](BoundObj& b, nb::handle grid) { b.bound->set_grid(GridArg(grid)); },
          nb::arg("grid"), "set_grid(grid): an int or a 1-3 tuple.")
      .def("set_stream", &SetStream, nb::arg("stream").none(),
           "set_stream(stream): launch on this stream from now on; None: follow the current "
           "stream again.")
      .def_prop_ro(
          "args", [](const BoundObj& b) { return nb::tuple(b.args); },
          "the bound argument objects")
      .def_prop_ro(
          "kernel", [](const BoundObj& b) { return b.kernel; }, "the kernel")
      .def("__repr__", [](const BoundObj& b) {
        return "<kpack bound launch of kernel '" + b.k->plan->name + "'>";
      });
}

}  // namespace kpack::python
