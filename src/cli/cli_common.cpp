#include "cli_common.hpp"

#include <cstdio>
#include <iostream>

#include "hfdelta/error.hpp"

namespace hfdelta::cli {

int run(CLI::App& app, int argc, char** argv, const std::function<void()>& body) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << app.get_name() << ": error: " << e.what() << "\n";
    std::cerr << "Run with --help for more information.\n";
    return static_cast<int>(Exit::usage);
  }
  try {
    body();
    return 0;
  } catch (const Error& e) {
    std::cerr << app.get_name() << ": error: " << e.what() << "\n";
    return static_cast<int>(e.code());
  } catch (const CLI::ParseError& e) {  // semantic usage errors raised after parsing
    std::cerr << app.get_name() << ": error: " << e.what() << "\n";
    return static_cast<int>(Exit::usage);
  } catch (const std::exception& e) {
    std::cerr << app.get_name() << ": error: " << e.what() << "\n";
    return static_cast<int>(Exit::failure);
  }
}

std::string human_bytes(double n) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (n >= 1024 && u < 4) n /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, u ? "%.2f %s" : "%.0f %s", n, units[u]);
  return buf;
}

}  // namespace hfdelta::cli
