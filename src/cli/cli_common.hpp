// What both commands share: error reporting and exit codes, thread count.
#pragma once

#include <functional>
#include <string>

#include <CLI/CLI.hpp>

namespace hfdelta::cli {

// Parses argv with `app`, runs `body`, and turns every failure into a one-line
// message on stderr ("PROG: error: ...") and the documented exit code.
int run(CLI::App& app, int argc, char** argv, const std::function<void()>& body);

// Human-readable byte count ("1.23 GiB").
std::string human_bytes(double n);

}  // namespace hfdelta::cli
