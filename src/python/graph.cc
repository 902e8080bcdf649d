// kpack.graph: kpack::StepGraph (kpack/graph.h) for Python, over kpack.BoundLaunch objects.
//
//   g = kpack.graph([norm, qkv, scores, out])      # BoundLaunches, in launch order
//   for m in sizes:
//       qkv.set("M", m); ...                        # this step's sizes and tensors
//       g.replay()                                  # patch the changed nodes, launch
//
// The names follow the C++ ones: replay, build, pin_grid, signature, stats (every field
// of StepGraph::Stats), graphs (every field of GraphInfo), and unseen, whose values are
// StepGraph::Unseen's without the k: 'build', 'error', 'launch_eagerly' ('eager', the old
// spelling, still works with a DeprecationWarning).
//
// A nanobind class; replay() is one C call that holds the GIL, like a launch. The garbage
// collector sees the bound launches a graph holds.

#include "graph.h"

#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "bound.h"
#include "errors.h"
#include "grid.h"
#include "kpack/kpack.h"

namespace nb = nanobind;

namespace kpack::python {
namespace {

struct UnseenName {
  StepGraph::Unseen value;
  const char* name;
};
constexpr UnseenName kUnseen[] = {
    {StepGraph::Unseen::kBuild, "build"},
    {StepGraph::Unseen::kError, "error"},
    {StepGraph::Unseen::kLaunchEagerly, "launch_eagerly"},
};

StepGraph::Unseen ParseUnseen(const std::string& unseen) {
  for (const UnseenName& u : kUnseen) {
    if (unseen == u.name) return u.value;
  }
  if (unseen == "eager") {
    if (PyErr_WarnEx(PyExc_DeprecationWarning,
                     "kpack.graph: unseen='eager' is now spelled 'launch_eagerly' "
                     "(StepGraph::Unseen::kLaunchEagerly)",
                     1) != 0) {
      throw nb::python_error();
    }
    return StepGraph::Unseen::kLaunchEagerly;
  }
  throw nb::value_error(
      ("unseen must be 'build', 'error' or 'launch_eagerly', got '" + unseen + "'").c_str());
}

const char* UnseenText(StepGraph::Unseen unseen) {
  for (const UnseenName& u : kUnseen) {
    if (unseen == u.value) return u.name;
  }
  return "?";
}

// A StepGraph and the kpack.BoundLaunch objects it relies on (their arguments' tensors
// and, through their kernels, the runtime stay alive with them). The graph is declared
// last so that it is destroyed first, while the runtime still lives; the garbage collector
// may clear it (tp_clear) to break a cycle, after which the object refuses to work.
struct PyStepGraph {
  nb::list launches;
  StepGraph::Unseen unseen = StepGraph::Unseen::kBuild;
  std::optional<StepGraph> graph;

  StepGraph& Get() {
    if (!graph.has_value()) throw nb::value_error("this StepGraph was cleared");
    return *graph;
  }
  const StepGraph& Get() const { return const_cast<PyStepGraph*>(this)->Get(); }
};

int GraphTraverse(PyObject* self, visitproc visit, void* arg) {
  Py_VISIT(Py_TYPE(self));
  if (!nb::inst_ready(self)) return 0;
  Py_VISIT(nb::inst_ptr<PyStepGraph>(self)->launches.ptr());
  return 0;
}

int GraphClear(PyObject* self) {
  if (!nb::inst_ready(self)) return 0;
  PyStepGraph* g = nb::inst_ptr<PyStepGraph>(self);
  g->graph.reset();  // before the launches it points at may go
  g->launches.clear();
  return 0;
}

const PyType_Slot kGraphSlots[] = {
    {Py_tp_traverse, reinterpret_cast<void*>(GraphTraverse)},
    {Py_tp_clear, reinterpret_cast<void*>(GraphClear)},
    {0, nullptr},
};

PyStepGraph MakeGraph(nb::sequence launches, const std::string& unseen, size_t max_graphs,
                      bool programmatic_edges) {
  PyStepGraph g;
  std::vector<BoundLaunch*> step;
  size_t i = 0;
  for (nb::handle item : launches) {
    BoundLaunch* b = AsBoundLaunch(item.ptr());
    if (b == nullptr) {
      throw nb::type_error(("kpack.graph: launch " + std::to_string(i) +
                            " is not a kpack.BoundLaunch (make one with kernel.bind(...))")
                               .c_str());
    }
    step.push_back(b);
    g.launches.append(item);
    ++i;
  }
  StepGraph::Options options;
  options.unseen = ParseUnseen(unseen);
  options.max_graphs = max_graphs;
  options.programmatic_edges = programmatic_edges;
  g.unseen = options.unseen;
  g.graph.emplace(ValueOrThrow(StepGraph::Create(step, options)));
  return g;
}

void Replay(PyStepGraph& g, nb::handle stream) {
  StepGraph& graph = g.Get();
  CUstream s = nullptr;
  if (!BoundStream(g.launches[0].ptr(), stream.ptr(), &s)) throw nb::python_error();
  const absl::Status status = graph.Replay(s);
  // An eager step (unseen='launch_eagerly') launched through the bound launches, whose
  // scratch callables hold what they handed out until now.
  for (nb::handle b : g.launches) ReleaseBoundScratch(b.ptr());
  ThrowIfError(status);  // a scratch callable's exception propagates as itself
}

// StepGraph::Stats and GraphInfo, every field: a new field must be added here.
static_assert(sizeof(StepGraph::Stats) == 9 * sizeof(uint64_t),
              "StepGraph::Stats changed: expose every field in StepGraph.stats()");
static_assert(sizeof(StepGraph::GraphInfo) == 2 * sizeof(std::string) + 5 * sizeof(uint64_t),
              "StepGraph::GraphInfo changed: expose every field in StepGraph.graphs()");

nb::dict Stats(const PyStepGraph& g) {
  const StepGraph::Stats s = g.Get().stats();
  nb::dict d;
  d["graphs_built"] = s.graphs_built;
  d["replays"] = s.replays;
  d["nodes_patched"] = s.nodes_patched;
  d["last_nodes_patched"] = s.last_nodes_patched;
  d["last_launches_resolved"] = s.last_launches_resolved;
  d["eager_steps"] = s.eager_steps;
  d["captured_steps"] = s.captured_steps;
  d["scratch_bytes"] = s.scratch_bytes;
  d["pdl_fallbacks"] = s.pdl_fallbacks;
  return d;
}

nb::list Graphs(const PyStepGraph& g) {
  nb::list out;
  for (const StepGraph::GraphInfo& info : g.Get().graphs()) {
    nb::dict d;
    d["signature"] = info.signature;
    d["nodes"] = info.nodes;
    d["scratch_bytes"] = info.scratch_bytes;
    d["build_us"] = info.build_us;
    d["replays"] = info.replays;
    d["programmatic_edges"] = info.programmatic_edges;
    d["pdl_fallback"] = info.pdl_fallback;
    out.append(d);
  }
  return out;
}

}  // namespace

void InitGraph(nb::module_& m) {
  nb::class_<PyStepGraph> cls(
      m, "StepGraph", nb::type_slots(kGraphSlots), nb::is_final(), nb::is_weak_referenceable(),
      "CUDA graphs of a step of bound launches, one per bucket signature, replayed with new "
      "sizes and tensors by patching only what changed (kpack/graph.h). Make one with "
      "kpack.graph().");
  cls.attr("__module__") = "kpack";  // the public name: kpack.StepGraph
  cls.def("replay", &Replay, nb::arg("stream") = nb::none(),
           "replay(stream=None): patch the nodes whose arguments changed and launch the graph "
           "of the launches' current bucket signature (built the first time it is seen, "
           "unless unseen says otherwise) on `stream` (the forms a launch's stream= takes; "
           "default: the stream the first bound launch would launch on if called now: "
           "torch's current stream for torch tensors).")
      .def(
          "build", [](PyStepGraph& g) { ThrowIfError(g.Get().Build()); },
          "build(): build the graph of the launches' current signature now, launching "
          "nothing (declare the shapes a step will take, then set unseen='error').")
      .def(
          "pin_grid",
          [](PyStepGraph& g, size_t launch, nb::handle grid) {
            ThrowIfError(g.Get().PinGrid(launch, GridArg(grid)));
          },
          nb::arg("launch"), nb::arg("grid"),
          "pin_grid(launch, grid): launch `launch` (an index) always with `grid` in the graphs "
          "(kernels whose pack has grid_tolerance only).")
      .def_prop_rw(
          "unseen", [](const PyStepGraph& g) { return std::string(UnseenText(g.unseen)); },
          [](PyStepGraph& g, const std::string& unseen) {
            g.unseen = ParseUnseen(unseen);
            g.Get().set_unseen(g.unseen);
          },
          "What replay() does with a signature no graph was built for "
          "(StepGraph::Unseen): 'build' (the default: build its graph), 'error' "
          "(kpack.FailedPreconditionError naming the launch and its bucket) or "
          "'launch_eagerly' (launch the step eagerly; counted in stats()['eager_steps']).")
      .def_prop_ro(
          "signature", [](const PyStepGraph& g) { return ValueOrThrow(g.Get().Signature()); },
          "The launches' current signature: 'kernel/variant[x,y,z]' per launch, '; '-joined.")
      .def_prop_ro(
          "launches", [](const PyStepGraph& g) { return nb::tuple(g.launches); },
          "The bound launches of the step, in order.")
      .def("stats", &Stats,
           "stats() -> dict of StepGraph::Stats: graphs_built, replays, nodes_patched (all "
           "replays), last_nodes_patched, last_launches_resolved, eager_steps, captured_steps, scratch_bytes, "
           "pdl_fallbacks.")
      .def("graphs", &Graphs,
           "graphs() -> one dict per graph built, in build order (StepGraph::GraphInfo): "
           "signature, nodes, scratch_bytes, build_us, replays, programmatic_edges, "
           "pdl_fallback.");

  m.def("graph", &MakeGraph, nb::arg("launches"), nb::arg("unseen") = "build",
        nb::arg("max_graphs") = 256, nb::arg("programmatic_edges") = true,
        "graph(launches, unseen='build', max_graphs=256, programmatic_edges=True) -> "
        "StepGraph over kpack.BoundLaunch objects (kernel.bind(...)) of one pack, in launch "
        "order. programmatic_edges=False gives PDL launches full edges (no overlap).");
  // The builder's grid proof (tools/kpack_tools/grid_proof.py) proves what this rule pads.
  m.def("graph_padding",
        [](const std::vector<int64_t>& edges, std::optional<int64_t> grid_max, size_t index) {
          return GraphPaddingInterval(edges, grid_max, index);
        },
        nb::arg("edges"), nb::arg("grid_max").none(), nb::arg("index"),
        "graph_padding(edges, grid_max, index) -> (low, high) or None: the values of bucket "
        "`index` of a bucket dimension that step graphs launch with the grid at `high` "
        "(kpack/graph.h, GraphPaddingInterval).");
}

}  // namespace kpack::python
