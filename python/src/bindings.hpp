// The parts of the extension module hfdelta._core, each binding one concern;
// module.cpp's NB_MODULE calls them in order.
#pragma once

#include <optional>
#include <string>

#include <nanobind/nanobind.h>

#include "hfdelta/encodings.hpp"

namespace hfdelta::python {

// hfdelta::Error (and any other C++ exception of the library) as the Python
// exception of its exit code (hfdelta.errors), with kind, message and path as
// the CLI's --json error object has them; error_kind and the exit-code table.
void bind_errors(nanobind::module_& m);

// One function per CLI form: paths as str, options as the CLI's, the result
// as the CLI's --json object (a JSON string). hfdelta/_api.py wraps them.
void bind_forms(nanobind::module_& m);

// The options both the forms and the publisher take, named as Python names
// them and checked by the library's rules (hfdelta/option_rules.hpp), as the
// CLI checks its options (Error(usage) otherwise): the zstd level (none:
// each frame kind's default, kDefaultLevel, which check_level returns), threads,
// an encoding name (none is "auto"), and a lock timeout (none: wait
// forever, -1 for the library).
int check_level(std::optional<int> level);
void check_threads(int threads);
double lock_seconds(std::optional<double> lock_timeout);
std::optional<Encoding> encoding_of(const std::string& name);

}  // namespace hfdelta::python

// The publisher's binding (publisher_binding.cpp).
void bind_publisher(nanobind::module_& m);
// The sharded publisher's core (sharded_binding.cpp).
void bind_sharded(nanobind::module_& m);
