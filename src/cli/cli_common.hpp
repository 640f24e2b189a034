// What both commands share: error reporting and exit codes, thread count.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "hfdelta/error.hpp"

namespace hfdelta::cli {

// Parses argv with `app`, runs `body`, and turns every failure into a one-line
// message on stderr ("PROG: error: ...") and the documented exit code.
int run(CLI::App& app, int argc, char** argv, const std::function<void()>& body);

// Runs `command` (given as `option`) with /bin/sh -c, extra environment
// variables added; throws Error(code) unless it exits 0.
void run_shell(const std::string& command, const std::vector<std::pair<std::string, std::string>>& env, Exit code,
               const std::string& option);

// Human-readable byte count ("1.23 GiB").
std::string human_bytes(double n);

}  // namespace hfdelta::cli
