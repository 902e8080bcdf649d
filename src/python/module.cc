// kpack._kpack, the Python extension: the module, its Runtime class (the object under
// kpack.open's Pack) and the registration of the rest. The Python API on top (kpack.open,
// kpack.Pack) is src/python/kpack/__init__.py.
//
// The files of src/python, by concern:
//   errors      kpack.Error and its subclasses; the one mapping from absl::Status
//   interned    the strings the launch path compares with
//   plan        what a kernel object knows of its parameters; Triton/DLPack type tables
//   streams     the current device, the stream= parser and a launch's default stream
//   convert     Python arguments into kpack::Args (the launch path's conversion)
//   grid        the grid parser (kernel[grid], grid=, set_grid, pin_grid)
//   scratch_callable  scratch= callables as kpack::ScratchAllocators
//   vectorcall  nanobind classes with a hand-written call; the per-call launch types
//   kernel      kpack.Kernel and kpack.GridLaunch: the eager launch
//   bound       kpack.BoundLaunch: bind and b()
//   graph       kpack.graph and kpack.StepGraph
//   dropin      the drop-in's C half (kpack._kpack.DropIn)
//   meta        kpack.Param, kpack.Variant and the meta dict of a callable grid
//   tensordesc  Triton TensorDescriptors as tensordesc arguments
//   native      the launch entry for native code (kpack.torch's C++ ops): native_api.h
// Test-only code (tensor stand-ins) is not here: tests/python/kpack_testing.cc.

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

#include "bound.h"
#include "dropin.h"
#include "errors.h"
#include "graph.h"
#include "interned.h"
#include "kernel.h"
#include "native.h"
#include "kpack/kpack.h"
#include "runtime_state.h"
#include "streams.h"

namespace nb = nanobind;

namespace kpack::python {
namespace {

RuntimeState* Open(const std::string& dir, bool preload, std::optional<std::string> driver,
                   bool nvtx) {
  Options options;
  options.driver_path = driver.value_or("");
  options.preload = preload;
  options.nvtx = nvtx;
  return new RuntimeState{ValueOrThrow(Runtime::Open(dir, options)), dir};
}

nb::object KernelObject(nb::pointer_and_handle<RuntimeState> self, const std::string& name) {
  return NewKernelObject(self.h, self.p, ValueOrThrow(self.p->runtime.Find(name)));
}

// The calling thread's current device, or None when no CUDA context is current.
std::optional<int> CurrentDeviceOrNone(const RuntimeState& s) {
  absl::StatusOr<int> device = s.runtime.CurrentDevice();
  if (device.ok()) return *device;
  if (device.status().code() == absl::StatusCode::kFailedPrecondition) return std::nullopt;
  Throw(device.status());
}

// Runtime::Stats, every field: a new field must be added here.
static_assert(sizeof(Runtime::Stats) == 6 * sizeof(size_t),
              "Runtime::Stats changed: expose every field in Runtime.stats()");

nb::dict Stats(const RuntimeState& s) {
  const Runtime::Stats st = s.runtime.stats();
  nb::dict d;
  d["libraries_loaded"] = st.libraries_loaded;
  d["scratch_arenas"] = st.scratch_arenas;
  d["scratch_reserved"] = st.scratch_reserved;
  d["scratch_in_graphs"] = st.scratch_in_graphs;
  d["scratch_idle"] = st.scratch_idle;
  d["scratch_bytes"] = st.scratch_bytes;
  return d;
}

}  // namespace
}  // namespace kpack::python

NB_MODULE(_kpack, m) {
  using namespace kpack::python;  // NOLINT(build/namespaces)
  m.doc() = "kpack's extension module; use the kpack package (kpack.open).";
  // Packs registered as torch ops live in torch's dispatcher until the interpreter exits;
  // nanobind's report of them at exit would be noise.
  nb::set_leak_warnings(false);
  if (!InternStrings() || !InitErrors(m.ptr())) throw nb::python_error();
  InitKernel(m);
  InitBound(m);
  InitGraph(m);
  InitDropIn(m);
  InitNative(m);

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
          "preload", [](RuntimeState& s) { ThrowIfError(s.runtime.Preload()); },
          "Load every variant now (needs a current CUDA context); required before CUDA "
          "graph capture.")
      .def(
          "use_device", [](const RuntimeState& s, int device) {
            ThrowIfError(s.runtime.UseDevice(device));
          },
          nb::arg("device"),
          "use_device(device): make the device's primary context current on the calling "
          "thread (Runtime::UseDevice).")
      .def("current_device", &CurrentDeviceOrNone,
           "current_device() -> int or None: the device of the calling thread's current CUDA "
           "context (Runtime::CurrentDevice), None when no context is current.")
      .def(
          "reserve_scratch",
          [](RuntimeState& s, size_t bytes, nb::handle stream) {
            ThrowIfError(s.runtime.ReserveScratch(StreamOrDefault(s, stream), bytes));
          },
          nb::arg("bytes"), nb::arg("stream").none() = nb::none(),
          "reserve_scratch(bytes, stream=None): Runtime::ReserveScratch on `stream` (the "
          "forms a launch's stream= takes; None: the stream a launch without stream= would "
          "use).")
      .def(
          "release_scratch",
          [](RuntimeState& s, nb::handle stream) {
            ThrowIfError(s.runtime.ReleaseScratch(StreamOrDefault(s, stream)));
          },
          nb::arg("stream").none() = nb::none(),
          "release_scratch(stream=None): Runtime::ReleaseScratch on `stream` (as "
          "reserve_scratch takes it).")
      .def("stats", &Stats,
           "stats() -> dict of Runtime::Stats: libraries_loaded, scratch_arenas, "
           "scratch_reserved, scratch_in_graphs, scratch_idle, scratch_bytes.");

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
}
