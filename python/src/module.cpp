// hfdelta._core: the hfdelta library for the Python package (see
// python/hfdelta/_core.pyi for what it holds, hfdelta/__init__.py for the API).
#include <nanobind/nanobind.h>

#include "bindings.hpp"
#include "hfdelta/report_json.hpp"

NB_MODULE(_core, m) {
  m.doc() = "hfdelta's library: one function per delta-diff and delta-apply form (use the hfdelta package's API)";
  m.attr("__version__") = HFDELTA_PY_VERSION;
  m.attr("JSON_SCHEMA") = hfdelta::kJsonSchema;  // the "schema" of every result
  hfdelta::python::bind_errors(m);
  hfdelta::python::bind_forms(m);
  bind_publisher(m);
  bind_sharded(m);
}
