// What a family's module tells kernels/build.py about its instruction-set paths, the same way in every
// family: the capability names and bits (cpu_isa.h), those this CPU has, and the family's paths, each a
// name and the capabilities it needs (scalar, needing none, is implied). build.py self-checks each path
// this CPU runs against scalar and hands every entry the `caps` that serve; entries check them here.
#pragma once
#include "cpu_isa.h"
#include "torch_lite.h"

#include <string>
#include <utility>
#include <vector>

struct IsaPath {
  const char* name;  // a capability name of cpu_isa.h: the one the path adds (the self-check disables it)
  int64_t needs;
};

// An entry's check of the caps it was handed: only capabilities this CPU has.
inline void check_caps(int64_t caps, const char* what) {
  TORCH_CHECK(cpu_runs(caps), what, ": capabilities ", caps, " include some this CPU lacks (it has ", cpu_caps(), ")");
}

// capabilities() -> [(name, bit)], cpu_capabilities() -> this CPU's mask, paths() -> [(name, needs)] in
// the order the self-check visits them.
template <size_t N>
inline void def_isa_paths(py::module& m, const IsaPath (&paths)[N]) {
  std::vector<std::pair<std::string, int64_t>> names, table;
  for (const CapName& c : CAP_NAMES) names.emplace_back(c.name, c.bit);
  for (const IsaPath& p : paths) table.emplace_back(p.name, p.needs);
  m.def("capabilities", [names] { return names; }, "the capability names and their bits (cpu_isa.h)");
  m.def("cpu_capabilities", &cpu_caps, "the capabilities this CPU has, as a mask");
  m.def("paths", [table] { return table; }, "this family's paths beside scalar: (name, the capabilities it needs)");
}
