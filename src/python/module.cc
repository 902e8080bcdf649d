// kpack._kpack: the Python extension. Opening a pack and the slow, descriptive calls are
// nanobind bindings here; the launch objects are plain CPython types (launcher.h).
// The Python API on top (kpack.open, kpack.Pack) is src/python/kpack/__init__.py.

#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "driver/driver.h"
#include "graph.h"
#include "kpack/kpack.h"
#include "dropin.h"
#include "launcher.h"
#include "testing.h"

namespace nb = nanobind;

namespace kpack::python {
namespace {

[[noreturn]] void Throw(const absl::Status& status) {
  RaiseStatus(status);
  throw nb::python_error();
}

RuntimeState* Open(const std::string& dir, bool preload, std::optional<std::string> driver,
                   bool nvtx) {
  Options options;
  options.driver_path = driver.value_or("");
  options.preload = preload;
  options.nvtx = nvtx;
  absl::StatusOr<Runtime> rt = Runtime::Open(dir, options);
  if (!rt.ok()) Throw(rt.status());
  // The same library again (dlopen returns the loaded one): the launch objects read the
  // current context through it.
  absl::StatusOr<std::shared_ptr<const internal::Driver>> d =
      internal::Driver::Load(options.driver_path);
  if (!d.ok()) Throw(d.status());
  return new RuntimeState{std::move(*rt), std::move(*d), dir};
}

nb::object KernelObject(nb::pointer_and_handle<RuntimeState> self, const std::string& name) {
  absl::StatusOr<Kernel> k = self.p->runtime.Find(name);
  if (!k.ok()) Throw(k.status());
  PyObject* o = NewKernelObject(self.h.ptr(), self.p, *k);
  if (o == nullptr) throw nb::python_error();
  return nb::steal(o);
}

CUstream StreamArg(nb::handle stream) {
  if (stream.is_none()) return nullptr;
  if (!PyLong_Check(stream.ptr())) throw nb::type_error("stream must be an int CUstream or None");
  return reinterpret_cast<CUstream>(PyLong_AsVoidPtr(stream.ptr()));
}

}  // namespace
}  // namespace kpack::python

NB_MODULE(_kpack, m) {
  using namespace kpack::python;  // NOLINT(build/namespaces)
  m.doc() = "kpack's extension module; use the kpack package (kpack.open).";
  // Packs registered as torch ops live in torch's dispatcher until the interpreter exits;
  // nanobind's report of them at exit would be noise.
  nb::set_leak_warnings(false);
  if (!InitLaunchTypes(m.ptr()) || !InitDropIn(m.ptr())) throw nb::python_error();

  nb::class_<RuntimeState>(m, "Runtime",
                           "An open pack (kpack::Runtime). Use kpack.open(), which wraps it.")
      .def_static("open", &Open, nb::arg("dir"), nb::arg("preload") = false,
                  nb::arg("driver") = nb::none(), nb::arg("nvtx") = true,
                  nb::rv_policy::take_ownership,
                  "Runtime.open(dir, preload=False, driver=None, nvtx=True): read and check "
                  "the pack, load the CUDA driver (`driver`: a library path; default "
                  "$KPACK_CUDA_DRIVER, else libcuda.so.1).")
      .def_prop_ro("dir", [](const RuntimeState& s) { return s.dir; })
      .def_prop_rw(
          "preload_on_first_use", [](const RuntimeState& s) { return s.preload_on_first_use; },
          [](RuntimeState& s, bool on) { s.preload_on_first_use = on; },
          "Load every variant into a device's context at the first launch from Python there "
          "(kpack.open(preload='first_use')).")
      .def_prop_ro("kernel_names",
                   [](const RuntimeState& s) { return s.runtime.kernel_names(); })
      .def("kernel", &KernelObject, nb::arg("name"),
           "kernel(name) -> kpack.Kernel; NotFoundError naming the kernels there are.")
      .def(
          "preload",
          [](RuntimeState& s) {
            if (absl::Status st = s.runtime.Preload(); !st.ok()) Throw(st);
          },
          "Load every variant now (needs a current CUDA context); required before CUDA "
          "graph capture.")
      .def(
          "reserve_scratch",
          [](RuntimeState& s, size_t bytes, nb::handle stream) {
            if (absl::Status st = s.runtime.ReserveScratch(StreamArg(stream), bytes); !st.ok()) {
              Throw(st);
            }
          },
          nb::arg("bytes"), nb::arg("stream") = nb::none(),
          "Grow `stream`'s scratch arena to `bytes` (kernels with Triton global scratch).")
      .def("stats", [](const RuntimeState& s) {
        const kpack::Runtime::Stats st = s.runtime.stats();
        nb::dict d;
        d["libraries_loaded"] = st.libraries_loaded;
        d["scratch_arenas"] = st.scratch_arenas;
        d["scratch_bytes"] = st.scratch_bytes;
        return d;
      });

  InitGraph(m);

  // The one spelling of a bucket's range (kpack::DescribeBucket), for the pack tools
  // (tools/kpack_tools), so that their messages say what the runtime's say.
  m.def(
      "describe_bucket",
      [](const std::vector<std::pair<std::string, std::vector<int64_t>>>& dims,
         const std::vector<int>& index) {
        std::vector<kpack::BucketDimInfo> infos;
        for (const auto& [param, edges] : dims) infos.push_back({param, edges, std::nullopt});
        return kpack::DescribeBucket(infos, index);
      },
      nb::arg("dims"), nb::arg("index"),
      "describe_bucket(dims, index) -> str: a bucket in words, e.g. '17 <= M <= 64, N >= "
      "4097' (kpack::DescribeBucket): `dims` are (parameter, inclusive upper edges) pairs, "
      "`index` one bucket index per dim; 'every bucket' for no index, 'no buckets' for no "
      "dims.");

  nb::module_ testing = m.def_submodule(
      "_testing", "Test and benchmark helpers (tensor stand-ins); not part of the API.");
  if (!InitTesting(testing.ptr())) throw nb::python_error();
}
