// kpack.graph: kpack::StepGraph (kpack/graph.h) for Python, over kpack.BoundLaunch objects.
//
//   g = kpack.graph([norm, qkv, scores, out])      # BoundLaunches, in launch order
//   for m in sizes:
//       qkv.set("M", m); ...                        # this step's sizes and tensors
//       g.replay()                                  # patch the changed nodes, launch
//
// A slow-path object (nanobind); replay() is one C call that holds the GIL, like a launch.

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

#include "graph/graph_grid.h"
#include "kpack/kpack.h"
#include "launcher.h"

namespace nb = nanobind;

namespace kpack::python {
namespace {

[[noreturn]] void Throw(const absl::Status& status) {
  RaiseStatus(status);
  throw nb::python_error();
}

StepGraph::Unseen ParseUnseen(const std::string& unseen) {
  if (unseen == "build") return StepGraph::Unseen::kBuild;
  if (unseen == "error") return StepGraph::Unseen::kError;
  if (unseen == "eager") return StepGraph::Unseen::kLaunchEagerly;
  throw nb::value_error(
      ("unseen must be 'build', 'error' or 'eager', got '" + unseen + "'").c_str());
}

const char* UnseenName(StepGraph::Unseen unseen) {
  switch (unseen) {
    case StepGraph::Unseen::kBuild:
      return "build";
    case StepGraph::Unseen::kError:
      return "error";
    case StepGraph::Unseen::kLaunchEagerly:
      return "eager";
  }
  return "?";
}

// A StepGraph and the Python objects it relies on: the kpack.BoundLaunch objects (their
// arguments' tensors and, through their kernels, the runtime stay alive with them). The
// graph is declared last so that it is destroyed first, while the runtime still lives.
struct PyStepGraph {
  nb::list launches;
  StepGraph::Unseen unseen;
  StepGraph graph;
};

PyStepGraph* MakeGraph(nb::sequence launches, const std::string& unseen, size_t max_graphs) {
  nb::list kept;
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
    kept.append(item);
    ++i;
  }
  StepGraph::Options options;
  options.unseen = ParseUnseen(unseen);
  options.max_graphs = max_graphs;
  absl::StatusOr<StepGraph> graph = StepGraph::Create(step, options);
  if (!graph.ok()) Throw(graph.status());
  return new PyStepGraph{std::move(kept), options.unseen, *std::move(graph)};
}

Grid ParseGrid(nb::handle grid) {
  std::vector<uint32_t> dims;
  if (nb::isinstance<nb::int_>(grid)) {
    dims.push_back(nb::cast<uint32_t>(grid));
  } else {
    for (nb::handle d : nb::cast<nb::sequence>(grid)) dims.push_back(nb::cast<uint32_t>(d));
  }
  if (dims.empty() || dims.size() > 3) throw nb::value_error("a grid has 1 to 3 dimensions");
  dims.resize(3, 1);
  return Grid{dims[0], dims[1], dims[2]};
}

}  // namespace

void InitGraph(nb::module_& m) {
  nb::class_<PyStepGraph>(
      m, "StepGraph",
      "CUDA graphs of a step of bound launches, one per bucket signature, replayed with new "
      "sizes and tensors by patching only what changed (kpack/graph.h). Make one with "
      "kpack.graph().")
      .def(
          "replay",
          [](PyStepGraph& g, nb::handle stream) {
            CUstream s = nullptr;
            if (!StreamArg(g.launches[0].ptr(), stream.ptr(), &s)) throw nb::python_error();
            if (absl::Status st = g.graph.Replay(s); !st.ok()) Throw(st);
          },
          nb::arg("stream") = nb::none(),
          "replay(stream=None): patch the nodes whose arguments changed and launch the graph "
          "of the launches' current bucket signature (built the first time it is seen, unless "
          "unseen says otherwise) on `stream` (default: the stream the first bound launch "
          "would launch on if called now: torch's current stream for torch tensors).")
      .def(
          "build",
          [](PyStepGraph& g) {
            if (absl::Status st = g.graph.Build(); !st.ok()) Throw(st);
          },
          "build(): build the graph of the launches' current signature now, launching "
          "nothing (declare the shapes a step will take, then set unseen='error').")
      .def(
          "pin_grid",
          [](PyStepGraph& g, size_t launch, nb::handle grid) {
            if (absl::Status st = g.graph.PinGrid(launch, ParseGrid(grid)); !st.ok()) Throw(st);
          },
          nb::arg("launch"), nb::arg("grid"),
          "pin_grid(launch, grid): launch `launch` (an index) always with `grid` in the graphs "
          "(kernels whose pack has grid_tolerance only).")
      .def_prop_rw(
          "unseen", [](const PyStepGraph& g) { return std::string(UnseenName(g.unseen)); },
          [](PyStepGraph& g, const std::string& unseen) {
            g.unseen = ParseUnseen(unseen);
            g.graph.set_unseen(g.unseen);
          },
          "What replay() does with a signature no graph was built for: 'build' (default), "
          "'error' (kpack.FailedPreconditionError naming the launch and its bucket) or "
          "'eager' (launch the step eagerly; counted in stats()['eager_steps']).")
      .def_prop_ro(
          "signature",
          [](const PyStepGraph& g) {
            absl::StatusOr<std::string> s = g.graph.Signature();
            if (!s.ok()) Throw(s.status());
            return *s;
          },
          "The launches' current signature: 'kernel/variant[x,y,z]' per launch, '; '-joined.")
      .def_prop_ro("launches", [](const PyStepGraph& g) { return nb::tuple(g.launches); },
                   "The bound launches of the step, in order.")
      .def(
          "stats",
          [](const PyStepGraph& g) {
            const StepGraph::Stats s = g.graph.stats();
            nb::dict d;
            d["graphs_built"] = s.graphs_built;
            d["replays"] = s.replays;
            d["nodes_patched"] = s.nodes_patched;
            d["last_nodes_patched"] = s.last_nodes_patched;
            d["eager_steps"] = s.eager_steps;
            d["scratch_bytes"] = s.scratch_bytes;
            return d;
          },
          "Counters: graphs_built, replays, nodes_patched (all replays), last_nodes_patched, "
          "eager_steps, scratch_bytes.")
      .def(
          "graphs",
          [](const PyStepGraph& g) {
            nb::list out;
            for (const StepGraph::GraphInfo& info : g.graph.graphs()) {
              nb::dict d;
              d["signature"] = info.signature;
              d["nodes"] = info.nodes;
              d["scratch_bytes"] = info.scratch_bytes;
              d["build_us"] = info.build_us;
              d["replays"] = info.replays;
              out.append(d);
            }
            return out;
          },
          "One dict per graph built, in build order: signature, nodes, scratch_bytes, "
          "build_us, replays.");

  m.def("graph", &MakeGraph, nb::arg("launches"), nb::arg("unseen") = "build",
        nb::arg("max_graphs") = 256, nb::rv_policy::take_ownership,
        "graph(launches, unseen='build', max_graphs=256) -> StepGraph over kpack.BoundLaunch "
        "objects (kernel.bind(...)) of one pack, in launch order.");
  // The builder's grid proof (tools/kpack_tools/grid_proof.py) proves what this rule pads.
  m.def("graph_padding",
        [](const std::vector<int64_t>& edges, std::optional<int64_t> grid_max, size_t index) {
          return internal::PaddingInterval(edges, grid_max, index);
        },
        nb::arg("edges"), nb::arg("grid_max").none(), nb::arg("index"),
        "graph_padding(edges, grid_max, index) -> (low, high) or None: the values of bucket "
        "`index` of a bucket dimension that step graphs launch with the grid at `high` "
        "(src/graph/graph_grid.h, PaddingInterval).");
}

}  // namespace kpack::python
