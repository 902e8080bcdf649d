// kpack.Kernel and kpack.GridLaunch: the eager launch, and the kernel's slow methods
// (nanobind). See kernel.h.

#include "kernel.h"

#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/optimization.h"
#include "bound.h"
#include "errors.h"
#include "grid.h"
#include "meta.h"
#include "scratch_callable.h"
#include "vectorcall.h"

namespace nb = nanobind;

namespace kpack::python {
namespace {

PyTypeObject* g_kernel_type = nullptr;
PyTypeObject* g_grid_type = nullptr;
PyTypeObject* g_variant_stats_type = nullptr;

// kernel[grid]: made per launch of that form, so a hand-written type (vectorcall.h).
struct GridObject {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  PyObject* kernel;  // strong: a kpack.Kernel
  Grid grid;
  PyObject* grid_fn;  // strong; a callable grid, else null
};

// ---------------------------------------------------------------- the launch

PyObject* LaunchCall(KernelObj* k, const Grid* grid, PyObject* grid_fn, PyObject* const* args,
                     size_t nargs, PyObject* kwnames) {
  const KernelPlan& p = *k->plan;
  CallArgs a(p.params.size(), p.num_descs);
  CallState st{k->rt};
  if (!PrepareCall(p, args, nargs, kwnames, grid_fn != nullptr, &st, &a)) return nullptr;
  CUstream stream;
  if (!ResolveStream(*k->rt, &st, &stream)) return nullptr;
  if (!MaybePreload(k->rt, st.device)) return nullptr;
  Grid g;
  if (!GridKeyword(p, st, &grid, &grid_fn, &g)) return nullptr;
  if (grid_fn != nullptr) {
    if (!EvalGridFn(p, grid_fn, a.span(), a.objects(), &g)) return nullptr;
    grid = &g;
  }
  PyObject* scratch_fn = ScratchFn(*k, st);
  if (ABSL_PREDICT_TRUE(scratch_fn == nullptr)) {
    const absl::Status s = grid != nullptr ? p.kernel.LaunchArgs(*grid, stream, a.span())
                                           : p.kernel.LaunchArgs(stream, a.span());
    if (ABSL_PREDICT_FALSE(!s.ok())) return RaiseStatus(s);
    Py_RETURN_NONE;
  }
  PyScratch scratch;
  scratch.fn = scratch_fn;
  const ScratchAllocator allocator = scratch.allocator();
  const absl::Status s = grid != nullptr ? p.kernel.LaunchArgs(*grid, stream, a.span(), allocator)
                                         : p.kernel.LaunchArgs(stream, a.span(), allocator);
  return LaunchResult(s, &scratch);
}

PyObject* KernelVectorcall(PyObject* self, PyObject* const* args, size_t nargsf,
                           PyObject* kwnames) {
  return LaunchCall(Self<KernelObj>(self), nullptr, nullptr, args, PyVectorcall_NARGS(nargsf),
                    kwnames);
}

PyObject* GridVectorcall(PyObject* self, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  auto* g = reinterpret_cast<GridObject*>(self);
  return LaunchCall(Self<KernelObj>(g->kernel), &g->grid, g->grid_fn, args,
                    PyVectorcall_NARGS(nargsf), kwnames);
}

// ---------------------------------------------------------------- kernel[grid]

PyObject* KernelGetItem(PyObject* self, PyObject* grid_obj) {
  Grid grid;
  PyObject* fn = nullptr;
  if (PyCallable_Check(grid_obj)) {
    fn = grid_obj;
  } else if (!ParseGrid(grid_obj, &grid)) {
    return nullptr;
  }
  GridObject* g = PyObject_GC_New(GridObject, g_grid_type);
  if (g == nullptr) return nullptr;
  g->vectorcall = GridVectorcall;
  g->kernel = Py_NewRef(self);
  g->grid = grid;
  g->grid_fn = Py_XNewRef(fn);
  PyObject_GC_Track(reinterpret_cast<PyObject*>(g));
  return reinterpret_cast<PyObject*>(g);
}

PyObject* GridRepr(PyObject* self) {
  auto* g = reinterpret_cast<GridObject*>(self);
  const std::string& name = Self<KernelObj>(g->kernel)->plan->name;
  if (g->grid_fn != nullptr) {
    return PyUnicode_FromFormat("<kpack kernel '%s' with grid %R>", name.c_str(), g->grid_fn);
  }
  return PyUnicode_FromFormat("<kpack kernel '%s' with grid (%u, %u, %u)>", name.c_str(),
                              g->grid.x, g->grid.y, g->grid.z);
}

PyObject* GridBind(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  auto* g = reinterpret_cast<GridObject*>(self);
  return BindCall(g->kernel, &g->grid, g->grid_fn, args, static_cast<size_t>(nargs), kwnames);
}

PyMethodDef g_grid_methods[] = {
    {"bind", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(GridBind)),
     METH_FASTCALL | METH_KEYWORDS,
     "bind(*args, stream=None) -> BoundLaunch with this grid (a callable grid is evaluated "
     "once, now)."},
    {nullptr, nullptr, 0, nullptr},
};

// ---------------------------------------------------------------- kpack.Kernel's GC

int KernelTraverse(PyObject* self, visitproc visit, void* arg) {
  Py_VISIT(Py_TYPE(self));
  if (!nb::inst_ready(self)) return 0;
  KernelObj* k = Self<KernelObj>(self);
  Py_VISIT(k->owner.ptr());
  Py_VISIT(k->scratch.ptr());
  return 0;
}

int KernelClear(PyObject* self) {
  // Only the scratch callable: the runtime and plan stay valid while the object lives.
  if (nb::inst_ready(self)) Self<KernelObj>(self)->scratch.reset();
  return 0;
}

// ---------------------------------------------------------------- slow methods

nb::object Steal(PyObject* o) {
  if (o == nullptr) throw nb::python_error();
  return nb::steal(o);
}

nb::object MakeKernelObj(nb::handle owner, RuntimeState* rt,
                         std::shared_ptr<const KernelPlan> plan, nb::object scratch) {
  nb::object o = nb::inst_alloc(nb::handle(reinterpret_cast<PyObject*>(g_kernel_type)));
  new (Self<KernelObj>(o.ptr()))
      KernelObj{KernelVectorcall, nb::borrow(owner), rt, std::move(plan), std::move(scratch)};
  nb::inst_mark_ready(o);
  return o;
}

nb::dict Stats(const KernelObj& k) {
  nb::dict d;
  for (const Kernel::VariantStats& v : k.plan->kernel.variant_stats()) {
    nb::object s = Steal(PyStructSequence_New(g_variant_stats_type));
    PyStructSequence_SetItem(s.ptr(), 0, PyLong_FromUnsignedLongLong(v.launches));
    PyStructSequence_SetItem(s.ptr(), 1, PyLong_FromUnsignedLongLong(v.fallback_launches));
    if (PyErr_Occurred()) throw nb::python_error();
    d[nb::str(v.variant.data(), v.variant.size())] = s;
  }
  return d;
}

nb::str SelectVariant(const KernelObj& k, nb::args args, nb::kwargs kwargs) {
  const VectorcallArgs v(args, kwargs);
  CallArgs a(k.plan->params.size(), k.plan->num_descs);
  CallState st{k.rt};
  if (!PrepareCall(*k.plan, v.data(), v.nargs(), v.kwnames(), false, &st, &a)) {
    throw nb::python_error();
  }
  const std::string_view chosen = ValueOrThrow(k.plan->kernel.SelectVariant(a.span()));
  return nb::str(chosen.data(), chosen.size());
}

nb::object Restrict(const KernelObj& k, nb::handle variants, bool ignore_buckets) {
  if (PyUnicode_Check(variants.ptr())) {
    throw nb::type_error("restrict() takes a list of variant names, not a str");
  }
  std::vector<std::string> names;
  for (nb::handle name : nb::iter(variants)) {
    if (!PyUnicode_Check(name.ptr())) {
      throw nb::type_error("restrict() takes a list of variant names (str)");
    }
    names.push_back(nb::cast<std::string>(name));
  }
  const Kernel view = ValueOrThrow(k.plan->kernel.Restrict(names, ignore_buckets));
  return MakeKernelObj(k.owner, k.rt, MakePlan(view), k.scratch);
}

nb::object WithScratch(const KernelObj& k, nb::handle allocator) {
  if (!allocator.is_none() && !PyCallable_Check(allocator.ptr())) {
    PyErr_Format(PyExc_TypeError, "with_scratch() takes a callable (nbytes, align, stream) or "
                 "None, got %.200s", Py_TYPE(allocator.ptr())->tp_name);
    throw nb::python_error();
  }
  return MakeKernelObj(k.owner, k.rt, k.plan,
                       allocator.is_none() ? nb::object() : nb::borrow(allocator));
}

nb::object Bind(nb::pointer_and_handle<KernelObj> self, nb::args args, nb::kwargs kwargs) {
  const VectorcallArgs v(args, kwargs);
  return Steal(BindCall(self.h.ptr(), nullptr, nullptr, v.data(), v.nargs(), v.kwnames()));
}

PyStructSequence_Field g_variant_stats_fields[] = {
    {"launches", "launches of this variant since the pack was opened"},
    {"fallback_launches",
     "of which a more specialized variant of the same bucket could not take the arguments"},
    {nullptr, nullptr},
};
PyStructSequence_Desc g_variant_stats_desc = {"kpack.VariantStats", "Launch counters.",
                                              g_variant_stats_fields, 2};

}  // namespace

// ---------------------------------------------------------------- shared with bind

absl::Status PreloadOnFirstUse(RuntimeState* rt, int device) {
  if (ABSL_PREDICT_TRUE(!rt->preload_on_first_use)) return absl::OkStatus();
  if (device < 0) {  // no tensor named the device (raw pointers): the current context's
    absl::StatusOr<int> current = rt->runtime.CurrentDevice();
    if (!current.ok()) return absl::OkStatus();  // no context current: the launch says so
    device = *current;
  }
  if (device >= 64 || (rt->preloaded_devices.load(std::memory_order_relaxed) >> device & 1) != 0) {
    return absl::OkStatus();
  }
  if (absl::Status s = rt->runtime.Preload(); !s.ok()) return s;
  rt->preloaded_devices.fetch_or(uint64_t{1} << device, std::memory_order_relaxed);
  return absl::OkStatus();
}

bool MaybePreload(RuntimeState* rt, int device) {
  if (absl::Status s = PreloadOnFirstUse(rt, device); ABSL_PREDICT_FALSE(!s.ok())) {
    RaiseStatus(s);
    return false;
  }
  return true;
}

bool EvalGridFn(const KernelPlan& p, PyObject* grid_fn, std::span<const Arg> args,
                PyObject* const* objects, Grid* grid) {
  PyObject* meta = p.meta.GridMeta(p.kernel, args, objects);
  if (meta == nullptr) return false;
  PyObject* r = PyObject_CallOneArg(grid_fn, meta);
  Py_DECREF(meta);
  if (r == nullptr) return false;
  const bool ok = ParseGrid(r, grid);
  Py_DECREF(r);
  return ok;
}

bool GridKeyword(const KernelPlan& p, const CallState& st, const Grid** grid, PyObject** grid_fn,
                 Grid* storage) {
  if (st.grid == nullptr || st.grid == Py_None) return true;
  if (*grid != nullptr || *grid_fn != nullptr) {
    PyErr_Format(PyExc_TypeError, "kernel '%s': grid given twice (kernel[grid] and grid=)",
                 p.name.c_str());
    return false;
  }
  if (PyCallable_Check(st.grid)) {
    *grid_fn = st.grid;
    return true;
  }
  if (!ParseGrid(st.grid, storage)) return false;
  *grid = storage;
  return true;
}

PyObject* ScratchFn(const KernelObj& k, const CallState& st) {
  if (st.scratch != nullptr) return st.scratch == Py_None ? nullptr : st.scratch;
  return k.scratch.ptr();
}

// ---------------------------------------------------------------- objects

nb::object NewKernelObject(nb::handle owner, RuntimeState* rt, Kernel kernel) {
  return MakeKernelObj(owner, rt, MakePlan(kernel), nb::object());
}

bool IsKernelObject(PyObject* o) { return Py_TYPE(o) == g_kernel_type; }

PyObject* LaunchObjects(PyObject* kernel, PyObject* grid_obj, PyObject* const* args, size_t n) {
  KernelObj* k = Self<KernelObj>(kernel);
  if (grid_obj == Py_None) return LaunchCall(k, nullptr, nullptr, args, n, nullptr);
  if (PyCallable_Check(grid_obj)) return LaunchCall(k, nullptr, grid_obj, args, n, nullptr);
  Grid grid;
  if (!ParseGrid(grid_obj, &grid)) return nullptr;
  return LaunchCall(k, &grid, nullptr, args, n, nullptr);
}

void InitKernel(nb::module_& m) {
  g_grid_type = MakeLaunchType<GridObject, &GridObject::kernel, &GridObject::grid_fn>(
      "kpack.GridLaunch",
      {{Py_tp_repr, reinterpret_cast<void*>(GridRepr)}, {Py_tp_methods, g_grid_methods}},
      "kernel[grid]: call it with the kernel's arguments to launch with that grid.");
  g_variant_stats_type = PyStructSequence_NewType(&g_variant_stats_desc);
  if (g_grid_type == nullptr || g_variant_stats_type == nullptr || !InitMetaTypes(m.ptr())) {
    throw nb::python_error();
  }
  m.attr("GridLaunch") = nb::handle(reinterpret_cast<PyObject*>(g_grid_type));
  m.attr("VariantStats") = nb::handle(reinterpret_cast<PyObject*>(g_variant_stats_type));

  nb::class_<KernelObj> cls(
      m, "Kernel",
      nb::type_slots(VectorcallClassSlots<KernelObj>(
          {{Py_tp_traverse, reinterpret_cast<void*>(KernelTraverse)},
           {Py_tp_clear, reinterpret_cast<void*>(KernelClear)},
           {Py_mp_subscript, reinterpret_cast<void*>(KernelGetItem)}})),
      nb::is_final(),
      "A pack kernel. k(*args, stream=None, scratch=None, grid=None) launches with the "
      "manifest's grid expressions, or grid= (as k[grid](*args) does: an int, a 1-3 tuple, "
      "or a callable of the launch's meta dict); k.bind(*args) packs once for repeated "
      "launches.");
  FinishVectorcallClass<KernelObj>(cls);
  cls.attr("__module__") = "kpack";  // the public name: kpack.Kernel
  g_kernel_type = reinterpret_cast<PyTypeObject*>(cls.ptr());
  cls.def("bind", &Bind,
          "bind(*args, stream=None, scratch=None, grid=None) -> BoundLaunch: check, dispatch "
          "and pack the arguments once; b() relaunches them, b.set(name_or_index, value) "
          "changes one.")
      .def("stats", &Stats,
           "stats() -> {variant: VariantStats(launches, fallback_launches)}: launches since "
           "the pack was opened; fallbacks are launches that a more specialized variant of "
           "the same bucket could not take (e.g. a misaligned pointer).")
      .def("select_variant", &SelectVariant,
           "select_variant(*args) -> str: the variant these arguments would launch; "
           "launches nothing.")
      .def(
          "preload", [](const KernelObj& k) { ThrowIfError(k.plan->kernel.Preload()); },
          "preload(): load every variant of this kernel now (needs a current CUDA context).")
      .def("restrict", &Restrict, nb::arg("variants"), nb::arg("ignore_buckets") = false,
           "restrict(variants, ignore_buckets=False) -> Kernel launching only the named "
           "variants (kpack::Kernel::Restrict): chosen among them by bucket and "
           "specialization, or with ignore_buckets by specialization alone (a fixed "
           "configuration for every shape).")
      .def("with_scratch", &WithScratch, nb::arg("allocator").none(),
           "with_scratch(allocator) -> Kernel: this kernel with `allocator` as every "
           "launch's default scratch= (see the call's scratch=); None: kpack's own arenas.")
      .def_prop_ro(
          "name", [](const KernelObj& k) { return k.plan->name; }, "the kernel's name")
      .def_prop_ro(
          "params", [](const KernelObj& k) { return Steal(k.plan->meta.Params()); },
          "every parameter in declaration order: Param(name, type, constexpr); the call "
          "takes the non-constexpr ones")
      .def_prop_ro(
          "variants", [](const KernelObj& k) { return Steal(k.plan->meta.Variants()); },
          "the compiled variants: Variant(name, bucket, assumptions, num_warps, num_ctas, "
          "num_stages, shared, constexprs, arch, arg_types)")
      .def_prop_ro(
          "grid", [](const KernelObj& k) { return Steal(k.plan->meta.GridExpressions()); },
          "the manifest's grid expressions (x, y, z), empty if the kernel has none")
      .def_prop_ro(
          "source", [](const KernelObj& k) { return Steal(k.plan->meta.Source()); },
          "(qualname, sha256) of the @triton.jit function the pack was built or recorded "
          "from (kpack/2 `source`), or None")
      .def_prop_ro(
          "autotune_key",
          [](const KernelObj& k) { return Steal(k.plan->meta.AutotuneKey()); },
          "the triton.autotune key's parameter names a recorded autotuned function was "
          "tuned on (kpack/2 `autotune_key`), empty if none")
      .def_prop_ro(
          "has_scratch", [](const KernelObj& k) { return k.plan->meta.has_scratch(); },
          "whether a variant needs Triton global or profile scratch memory (see scratch=)")
      .def_prop_ro(
          "scratch",
          [](const KernelObj& k) -> nb::object {
            return k.scratch.is_valid() ? k.scratch : nb::none();
          },
          "the default scratch= allocator (with_scratch), or None")
      .def(
          "_native_handle",
          [](const KernelObj& k) { return reinterpret_cast<uintptr_t>(&k); },
          "_native_handle() -> int: this kernel's handle for _kpack._native_api()'s "
          "entries (src/python/native_api.h), valid while this object lives.")
      .def("__repr__", [](const KernelObj& k) {
        const KernelPlan& p = *k.plan;
        return "<kpack kernel '" + p.name + "'(" + p.meta.signature + ")>";
      });
}

}  // namespace kpack::python
