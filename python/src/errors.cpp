// C++ exceptions as the Python exceptions of hfdelta.errors.
#include <new>
#include <stdexcept>
#include <string>

#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include "bindings.hpp"
#include "hfdelta/error.hpp"

namespace nb = nanobind;

namespace hfdelta::python {

namespace {

// Sets the Python error for an error's fields: the exception hfdelta.errors
// makes for them.
void raise_hfdelta_error(int code, const std::string& message, const std::string& path) {
  try {
    const nb::module_ errors = nb::module_::import_("hfdelta.errors");
    const nb::object exc =
        errors.attr("_from_code")(code, message, exit_kind(code), path.empty() ? nb::none() : nb::cast(path));
    PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
  } catch (nb::python_error& e) {
    e.restore();  // hfdelta.errors itself failed: say so rather than hide it
  }
}

void translate(const std::exception_ptr& p, void*) {
  try {
    std::rethrow_exception(p);
  } catch (const Error& e) {
    raise_hfdelta_error(static_cast<int>(e.code()), e.what(), e.path());
  } catch (const std::bad_alloc&) {
    throw;                             // nanobind's own translator: MemoryError
  } catch (const std::exception& e) {  // as the CLI: anything unexpected is exit 1
    raise_hfdelta_error(static_cast<int>(Exit::failure), e.what(), "");
  }
}

}  // namespace

void bind_errors(nb::module_& m) {
  nb::register_exception_translator(translate);
  m.def(
      "error_kind", [](int code) { return std::string(exit_kind(code)); }, nb::arg("exit_code"),
      "The stable name of an exit code, as the CLI's --json error object has it (\"bad_input\", ...).");
  m.def(
      "exit_codes",
      [] {
        nb::list out;
        for (const ExitCode& e : kExitCodes)
          out.append(nb::make_tuple(static_cast<int>(e.code), e.kind, e.python_class, e.meaning));
        return out;
      },
      "The exit-code table (include/hfdelta/error.hpp): (code, kind, Python class, meaning) for each code.");
}

}  // namespace hfdelta::python
