// hfdelta._core: the hfdelta library for the Python package (see
// python/hfdelta/_core.pyi for what it holds, hfdelta/__init__.py for the API).
#include <nanobind/nanobind.h>

#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include "bindings.hpp"
#include "hfdelta/encodings.hpp"
#include "hfdelta/report_json.hpp"

namespace {

// The table of encodings (include/hfdelta/encodings.hpp), one tuple a row:
// what hfdelta.ENCODINGS holds.
nanobind::list encodings() {
  nanobind::list out;
  for (const hfdelta::EncodingInfo& e : hfdelta::kEncodings)
    out.append(nanobind::make_tuple(std::string(e.name), std::string(e.magic), e.code, e.revision, e.chunked,
                                    e.needs_base, e.whole_delta, e.in_parts));
  return out;
}

}  // namespace

NB_MODULE(_core, m) {
  m.doc() = "hfdelta's library: one function per delta-diff and delta-apply form (use the hfdelta package's API)";
  m.attr("__version__") = HFDELTA_PY_VERSION;
  m.attr("JSON_SCHEMA") = hfdelta::kJsonSchema;  // the "schema" of every result
  m.def("encodings", &encodings,
        "The table of encodings: (name, magic, code, revision, chunked, needs_base, whole_delta, in_parts) each.");
  hfdelta::python::bind_errors(m);
  hfdelta::python::bind_forms(m);
  bind_publisher(m);
  bind_sharded(m);
}
