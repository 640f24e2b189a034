#include "cli_common.hpp"

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>

#include "hfdelta/error.hpp"
#include "hfdelta/signals.hpp"

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
    std::string msg = e.what();
    if (static_cast<int>(e.code()) > 128)  // a stop signal (hfdelta/signals.hpp): say what it left
      msg += app.get_name() == "delta-apply" ? "; LOCAL is as it was (rolled back)"
                                             : "; stopped at a safe point, no temporary directory left";
    if (!msg.empty()) std::cerr << app.get_name() << ": error: " << msg << "\n";
    return static_cast<int>(e.code());
  } catch (const CLI::ParseError& e) {  // semantic usage errors raised after parsing
    std::cerr << app.get_name() << ": error: " << e.what() << "\n";
    return static_cast<int>(Exit::usage);
  } catch (const std::exception& e) {
    std::cerr << app.get_name() << ": error: " << e.what() << "\n";
    return static_cast<int>(Exit::failure);
  }
}

void run_shell(const std::string& command, const std::vector<std::pair<std::string, std::string>>& env, Exit code,
               const std::string& option) {
  std::vector<std::string> vars;
  for (char** e = environ; *e; ++e) vars.emplace_back(*e);
  for (const auto& [k, v] : env) vars.push_back(k + "=" + v);
  std::vector<char*> envp;
  for (auto& v : vars) envp.push_back(v.data());
  envp.push_back(nullptr);
  std::string sh = "/bin/sh", dash_c = "-c", cmd = command;
  char* argv[] = {sh.data(), dash_c.data(), cmd.data(), nullptr};
  std::fflush(stdout);
  // The command starts with no signal blocked, though delta-apply blocks the
  // stop signals (see hfdelta/signals.hpp).
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  const sigset_t none = unblocked_mask();
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK);
  pid_t pid;
  const int e = posix_spawn(&pid, "/bin/sh", nullptr, &attr, argv, envp.data());
  posix_spawnattr_destroy(&attr);
  if (e != 0) fail(code, option + ": cannot start /bin/sh: " + std::string(std::strerror(e)));
  int status = 0;
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) fail(code, option + ": waitpid: " + std::string(std::strerror(errno)));
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return;
  fail(code, option + " command failed (" +
                              (WIFEXITED(status) ? "exit status " + std::to_string(WEXITSTATUS(status))
                                                 : "signal " + std::to_string(WTERMSIG(status))) +
                              "): " + command);
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
