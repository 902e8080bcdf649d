// A valid kpack/1 manifest for the tests to start from and then break one field at a
// time: kernel "add" (x, y, out: *fp32; n: i32; BLOCK: constexpr) with one variant whose
// layout is Triton 3.6's for that signature (0/8, 8/8, 16/8, 24/4, 32/8, 40/8).

#ifndef KPACK_TESTS_UNIT_TEST_MANIFEST_JSON_H_
#define KPACK_TESTS_UNIT_TEST_MANIFEST_JSON_H_

#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "nlohmann/json.hpp"

namespace kpack::testing {

// A manifest broken in one place, for the parameterized error tests: what `mutate` does to
// a valid manifest, the status code the parse must give, and what its message must name.
struct BadCase {
  const char* name;
  void (*mutate)(nlohmann::json&);
  absl::StatusCode code;
  std::vector<std::string> mentions;
};
inline void PrintTo(const BadCase& c, std::ostream* os) { *os << c.name; }

inline nlohmann::json AddManifest(const std::string& sha256 = std::string(64, 'a'),
                                  const std::string& entry = "add_kernel") {
  using nlohmann::json;
  json variant = {
      {"name", "default"},
      {"cubin", "cubins/add/default.cubin"},
      {"sha256", sha256},
      {"entry", entry},
      {"arch", 90},
      {"constexprs", {{"BLOCK", 1024}}},
      {"num_warps", 4},
      {"num_ctas", 1},
      {"num_stages", 3},
      {"shared", 0},
      {"global_scratch_size", 0},
      {"global_scratch_align", 1},
      {"profile_scratch_size", 0},
      {"profile_scratch_align", 1},
      {"launch_pdl", false},
      {"launch_cooperative_grid", false},
      {"layout", json::array({
                     {{"param", "x_ptr"}, {"offset", 0}, {"size", 8}},
                     {{"param", "y_ptr"}, {"offset", 8}, {"size", 8}},
                     {{"param", "out_ptr"}, {"offset", 16}, {"size", 8}},
                     {{"param", "n"}, {"offset", 24}, {"size", 4}},
                     {{"param", "$global_scratch"}, {"offset", 32}, {"size", 8}},
                     {{"param", "$profile_scratch"}, {"offset", 40}, {"size", 8}},
                 })},
  };
  json kernel = {
      {"name", "add"},
      {"params", json::array({{{"name", "x_ptr"}, {"type", "*fp32"}},
                              {{"name", "y_ptr"}, {"type", "*fp32"}},
                              {{"name", "out_ptr"}, {"type", "*fp32"}},
                              {{"name", "n"}, {"type", "i32"}},
                              {{"name", "BLOCK"}, {"type", "constexpr"}}})},
      {"variants", json::array({variant})},
  };
  return json{{"format", "kpack/1"}, {"generator", "test"}, {"kernels", json::array({kernel})}};
}

}  // namespace kpack::testing

#endif  // KPACK_TESTS_UNIT_TEST_MANIFEST_JSON_H_
