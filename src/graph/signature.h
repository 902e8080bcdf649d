// A step's bucket signature: per launch, the variant it selected and the grid the graph
// launches it with. Two steps of one signature share an executable graph whose nodes
// differ only in their parameter bytes (see kpack/graph.h).

#ifndef KPACK_SRC_GRAPH_SIGNATURE_H_
#define KPACK_SRC_GRAPH_SIGNATURE_H_

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "kpack/arg.h"
#include "runtime/runtime_impl.h"

namespace kpack::internal {

struct LaunchShape {
  const VariantData* variant = nullptr;
  Grid grid;  // the graph's grid; an empty one means the launch has no node

  bool empty() const { return grid.x == 0 || grid.y == 0 || grid.z == 0; }
  friend bool operator==(const LaunchShape& a, const LaunchShape& b) {
    return a.variant == b.variant && a.grid.x == b.grid.x && a.grid.y == b.grid.y &&
           a.grid.z == b.grid.z;
  }
  template <typename H>
  friend H AbslHashValue(H h, const LaunchShape& s) {
    return H::combine(std::move(h), s.variant, s.grid.x, s.grid.y, s.grid.z);
  }
};

using Signature = std::vector<LaunchShape>;

// "kernel/variant[x,y,z]".
std::string ShapeText(const LaunchShape& shape);
// Every launch's ShapeText joined by "; ".
std::string SignatureText(const Signature& signature);
// "kernel 'K' variant 'V' (bucket: 17 <= M <= 64)" or "(no buckets)".
std::string DescribeShape(const LaunchShape& shape);

}  // namespace kpack::internal

#endif  // KPACK_SRC_GRAPH_SIGNATURE_H_
