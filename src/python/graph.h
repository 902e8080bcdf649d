// kpack.graph and kpack.StepGraph (graph.cc): kpack::StepGraph for Python.

#ifndef KPACK_SRC_PYTHON_GRAPH_H_
#define KPACK_SRC_PYTHON_GRAPH_H_

#include <nanobind/nanobind.h>

namespace kpack::python {

// Registers StepGraph and graph() in the extension module `m`.
void InitGraph(nanobind::module_& m);

}  // namespace kpack::python

#endif  // KPACK_SRC_PYTHON_GRAPH_H_
