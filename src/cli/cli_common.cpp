#include "cli_common.hpp"

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <mutex>
#include <optional>
#include <string_view>
#include <thread>

#include "forms.hpp"
#include "hfdelta/error.hpp"
#include "hfdelta/option_rules.hpp"
#include "hfdelta/progress.hpp"
#include "hfdelta/report_json.hpp"
#include "hfdelta/signals.hpp"

namespace hfdelta::cli {

namespace {

bool json_printed = false;  // this process printed its one JSON object

// --json given on a command line that did not parse.
bool json_in_argv(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], "--json") == 0) return true;
  return false;
}

int report(const std::string& prog, int code, const std::string& msg, bool json, const std::string& path = {}) {
  if (!msg.empty()) std::cerr << prog << ": error: " << msg << "\n";
  if (json && !json_printed) {
    print_json(error_json(code, msg, path));
  }
  return code;
}

// A report that could not be written is a failure, not a silent success.
int check_stdout(const std::string& prog, int code) {
  std::cout.flush();
  if (std::fflush(stdout) == 0 && !std::ferror(stdout) && std::cout.good()) return code;
  std::cerr << prog << ": error: cannot write to standard output: " << std::strerror(errno ? errno : EIO) << "\n";
  return code ? code : static_cast<int>(Exit::failure);
}

}  // namespace

// ---- progress ----------------------------------------------------------------

namespace {
std::atomic<ProgressLine*> g_current{nullptr};  // the one showing, for stop_current
}  // namespace

struct ProgressLine::State {
  std::mutex mu;
  std::condition_variable cv;
  bool stop = false, tty = false, drawn = false;
  std::thread thread;
};

namespace {

std::string progress_text(const progress::Snapshot& s, double rate, bool tty) {
  char line[200];
  const double pct = s.total ? 100.0 * double(std::min(s.done, s.total)) / double(s.total) : 0.0;
  const double left = rate > 0 && s.total > s.done ? double(s.total - s.done) / rate : 0;
  if (!s.bytes)
    std::snprintf(line, sizeof line, "%s: %llu of %llu entries (%.0f%%), %.0f s left", s.what,
                  static_cast<unsigned long long>(s.done), static_cast<unsigned long long>(s.total), pct, left);
  else
    std::snprintf(line, sizeof line, "%s: %s of %s (%.0f%%), %s/s, %.0f s left", s.what,
                  human_bytes(double(s.done)).c_str(), human_bytes(double(s.total)).c_str(), pct,
                  human_bytes(rate).c_str(), left);
  return tty ? std::string("\r\033[K") + line : std::string(line) + "\n";
}

}  // namespace

bool progress_wanted(bool asked, bool quiet, bool json) {
  return !quiet && !json && (asked || ::isatty(STDERR_FILENO));
}

ProgressLine::ProgressLine(bool enabled) {
  if (!enabled) return;
  s_ = std::make_unique<State>();
  s_->tty = ::isatty(STDERR_FILENO);
  g_current = this;
  s_->thread = std::thread([st = s_.get()] {
    using namespace std::chrono;
    const auto period = st->tty ? milliseconds(200) : milliseconds(2000);
    std::uint64_t phase = 0, last_done = 0;
    bool shown = false;  // the current phase's state as last printed
    auto last_t = steady_clock::now();
    double rate = 0;
    std::unique_lock lock(st->mu);
    while (!st->cv.wait_for(lock, period, [&] { return st->stop; })) {
      const progress::Snapshot s = progress::snapshot();
      if (!s.what) continue;
      const auto now = steady_clock::now();
      if (s.phase != phase) phase = s.phase, last_done = 0, rate = 0, last_t = now, shown = false;
      if (shown && s.done == last_done) continue;  // nothing moved (a --then command may be writing)
      shown = true;
      const double dt = duration<double>(now - last_t).count();
      if (dt > 0) rate = rate ? 0.7 * rate + 0.3 * double(s.done - last_done) / dt : double(s.done - last_done) / dt;
      last_done = s.done, last_t = now;
      std::fputs(progress_text(s, rate, st->tty).c_str(), stderr);
      st->drawn = true;
    }
    if (st->tty && st->drawn) std::fputs("\r\033[K", stderr);  // the summary follows on a clean line
  });
}

ProgressLine::~ProgressLine() { stop(); }

void ProgressLine::stop() {
  ProgressLine* self = this;
  g_current.compare_exchange_strong(self, nullptr);
  if (!s_ || !s_->thread.joinable()) return;
  {
    std::lock_guard lock(s_->mu);
    s_->stop = true;
  }
  s_->cv.notify_all();
  s_->thread.join();
}

void ProgressLine::stop_current() {
  if (ProgressLine* p = g_current.exchange(nullptr)) p->stop();
}

CLI::Validator whole_number() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos)
          return "must be a whole number >= 0 in decimal digits, not \"" + s + "\"";
        s.erase(0, std::min(s.find_first_not_of('0'), s.size() - 1));  // "000010": ten, not octal
        return "";
      },
      "");
}

CLI::Validator seconds(std::string_view otherwise) {
  return CLI::Validator(
      [to_wait = std::string(otherwise)](std::string& s) -> std::string {
        char* end = nullptr;
        const double v = s.empty() ? -1 : std::strtod(s.c_str(), &end);
        if (s.empty() || end != s.c_str() + s.size() || !std::isfinite(v))
          return lock_timeout_rule(to_wait) + ", not \"" + s + "\"";
        return lock_timeout_problem(v, to_wait);
      },
      "");
}

namespace {

// An integer option's value as CLI11 converts it, if it does.
std::optional<long long> whole(const std::string& s) {
  long long v = 0;
  if (!CLI::detail::lexical_cast(s, v)) return std::nullopt;
  return v;
}

}  // namespace

CLI::Validator level() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        const std::optional<long long> v = whole(s);
        return v ? level_problem(*v) : level_rule() + ", not \"" + s + "\"";
      },
      "INT in [" + std::to_string(kMinLevel) + " - " + std::to_string(kMaxLevel) + "]");
}

CLI::Validator threads() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        const std::optional<long long> v = whole(s);
        return v ? threads_problem(*v) : "";  // not a number: CLI11's conversion says so
      },
      "");
}

CLI::Validator encoding() {
  std::string names;
  for (const std::string& n : encoding_names()) names += (names.empty() ? "" : ",") + n;
  return CLI::Validator([](std::string& s) -> std::string { return encoding_problem(s); }, "{" + names + "}");
}

void print_json(nlohmann::json j) {
  ProgressLine::stop_current();
  std::cout << json_report(std::move(j)).dump() << std::endl;
  json_printed = true;
}

namespace {

// --version: the program's version, alone on the command line. Given with
// anything else it is refused: before 0.2 it was the delta's number
// (now --delta-version, --init-version), and a script still passing it must
// not get "exit 0" for a command that did nothing.
int version_flag(const std::string& prog, int argc, char** argv, bool& handled) {
  bool given = false;
  for (int i = 1; i < argc; ++i) given |= std::strcmp(argv[i], "--version") == 0;
  handled = given;
  if (!given) return 0;
  if (argc == 2) {
    std::cout << prog << " (hfdelta) " << HFDELTA_PROGRAM_VERSION << std::endl;
    return check_stdout(prog, 0);
  }
  const std::string what = prog == "delta-apply"  ? "; the version number to write is --init-version N"
                           : prog == "delta-diff" ? "; the version number to write is --delta-version N"
                                                  : "";
  return check_stdout(
      prog, report(prog, static_cast<int>(Exit::usage),
                   "--version prints the program's version and takes nothing else" + what, json_in_argv(argc, argv)));
}

// An option the command's table lists as moved (Command::moved) on the
// command line (alone, or as --old=VALUE).
int moved_option(const std::string& prog, int argc, char** argv, bool& handled) {
  for (int i = 1; i < argc; ++i)
    for (const Moved& m : moved_options()) {
      const std::string_view a = argv[i];
      if (a != m.old_name && !a.starts_with(m.old_name + "=")) continue;
      handled = true;
      return check_stdout(prog, report(prog, static_cast<int>(Exit::usage), m.old_name + " is gone: " + m.now,
                                       json_in_argv(argc, argv)));
    }
  return 0;
}

// -h, --help: the text, or with --json, one JSON object holding it ("help"),
// as every --json run prints.
int help(const CLI::App& app, const CLI::Error& e, bool json) {
  if (!json) return app.exit(e);
  print_json({{"help", app.help()}});
  return 0;
}

}  // namespace

int run(CLI::App& app, int argc, char** argv, const std::function<void()>& body, const bool* json_out) {
  const std::string prog = app.get_name();
  app.add_flag("--version")->description("Print the program's version and exit");
  bool handled = false;
  if (const int code = version_flag(prog, argc, argv, handled); handled) return code;
  if (const int code = moved_option(prog, argc, argv, handled); handled) return code;
  if (const int code = completion_flag(argc, argv, handled); handled) return code;
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return check_stdout(prog, help(app, e, json_in_argv(argc, argv)));
  } catch (const CLI::CallForAllHelp& e) {
    return check_stdout(prog, help(app, e, json_in_argv(argc, argv)));
  } catch (const CLI::ParseError& e) {
    const int code = report(prog, static_cast<int>(Exit::usage), e.what(), json_in_argv(argc, argv));
    std::cerr << "Run with --help for more information.\n";
    return check_stdout(prog, code);
  }
  const bool json = json_out && *json_out;
  int code = 0;
  try {
    body();
  } catch (const Error& e) {
    std::string msg = e.what();
    if (static_cast<int>(e.code()) > 128 &&
        !dynamic_cast<const StopReported*>(&e))  // a stop signal (hfdelta/signals.hpp): say what it left
      msg += prog == "delta-apply" ? "; LOCAL is as it was (rolled back)"
                                   : "; stopped at a safe point, no temporary directory left";
    code = report(prog, static_cast<int>(e.code()), msg, json, e.path());
  } catch (const CLI::ParseError& e) {  // semantic usage errors raised after parsing
    code = report(prog, static_cast<int>(Exit::usage), e.what(), json);
  } catch (const std::exception& e) {
    code = report(prog, static_cast<int>(Exit::failure), e.what(), json);
  }
  return check_stdout(prog, code);
}

namespace {

// Passes a stop signal on to the command's process group `pgid` (the
// recorder thread of hfdelta/signals.hpp takes the signal; this thread looks
// for it 20 times a second). After one, the command is done only once every
// process of its group is gone: `/bin/sh -c CMD` dies of the signal at once,
// while the script it started still runs its trap (a reload script resuming
// its engine), and a service manager kills whatever is left when
// delta-apply exits. What still runs `grace` seconds after the signal is
// killed (SIGKILL to the group).
class StopForwarder {
 public:
  StopForwarder(pid_t pgid, double grace) : pgid_(pgid), grace_(grace), thread_([this] { watch(); }) {}
  ~StopForwarder() { finish(); }
  // Once the command's shell is reaped: waits for the rest of its group after
  // a stop; what happened.
  ShellStop finish() {
    {
      std::lock_guard lock(mu_);
      reaped_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
    return stop_;
  }
  StopForwarder(const StopForwarder&) = delete;
  StopForwarder& operator=(const StopForwarder&) = delete;

 private:
  // A process of the group is left (a zombie not yet reaped by its parent counts).
  bool group_alive() const { return ::kill(-pgid_, 0) == 0 || errno == EPERM; }

  void watch() {
    using clock = std::chrono::steady_clock;
    constexpr auto look = std::chrono::milliseconds(50);
    std::unique_lock lock(mu_);
    while (!reaped_) {
      if (const int sig = stop_signal()) {
        stop_.signal = sig;
        stop_.started = true;
        stop_.grace = grace_;
        ::kill(-pgid_, sig);
        break;
      }
      cv_.wait_for(lock, look);
    }
    if (!stop_.signal) return;
    const auto deadline =
        clock::now() + std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(grace_));
    // The group's id stays its own while a process of it lives, also once
    // its leader, the shell, is reaped.
    while (!reaped_ || group_alive()) {
      if (clock::now() >= deadline) {
        stop_.killed = true;
        ::kill(-pgid_, SIGKILL);
        return;
      }
      cv_.wait_until(lock, std::min(clock::now() + look, deadline));
    }
  }

  pid_t pgid_;
  double grace_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool reaped_ = false;
  ShellStop stop_;
  std::thread thread_;  // last: started once the rest is set
};

// Waits for `pid` to exit and reaps it; its wait status.
int wait_command(pid_t pid, Exit code, const std::string& option) {
  int status = 0;
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) fail(code, option + ": waitpid: " + std::string(std::strerror(errno)));
  return status;
}

std::string ended(int status) {
  return WIFEXITED(status) ? "exit status " + std::to_string(WEXITSTATUS(status))
                           : "signal " + std::to_string(WTERMSIG(status));
}

}  // namespace

std::string describe(const ShellStop& s) {
  if (!s.started) return "was not run";
  char grace[32];
  std::snprintf(grace, sizeof grace, "%g s", s.grace);
  const std::string d = std::string("was passed ") + stop_signal_name(s.signal) + "; ";
  if (s.killed) return d + "still running " + grace + " later, it was killed (SIGKILL to its process group)";
  return d + "all its processes ended within " + grace + " (its shell: " +
         (s.exit_status ? "exit status " + std::to_string(*s.exit_status) : "signal " + std::to_string(s.ended_by)) +
         ")";
}

void run_shell(const std::string& command, const std::vector<std::pair<std::string, std::string>>& env, Exit code,
               const std::string& option, std::optional<double> grace, ShellStop* stopped) {
  const auto stop = [&](const ShellStop& s) {
    if (stopped) *stopped = s;
    fail(static_cast<Exit>(128 + s.signal),
         option + " command interrupted by " + stop_signal_name(s.signal) + ": it " + describe(s) + ": " + command);
  };
  if (grace && stop_signal()) {  // it came after the commit, before the command: do not start it
    ShellStop before;
    before.signal = stop_signal();
    before.grace = *grace;
    stop(before);
  }
  std::vector<std::string> vars;
  for (char** e = environ; *e; ++e) vars.emplace_back(*e);
  for (const auto& [k, v] : env) vars.push_back(k + "=" + v);
  std::vector<char*> envp;
  for (auto& v : vars) envp.push_back(v.data());
  envp.push_back(nullptr);
  ProgressLine::stop_current();  // the command writes to stderr too
  std::string sh = "/bin/sh", dash_c = "-c", cmd = command;
  char* argv[] = {sh.data(), dash_c.data(), cmd.data(), nullptr};
  std::fflush(stdout);
  // The command starts with no signal blocked, though delta-apply blocks the
  // stop signals (see hfdelta/signals.hpp); with `grace`, in a process group
  // of its own (so a terminal's Ctrl-C reaches it once, passed on).
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  const sigset_t none = unblocked_mask();
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setpgroup(&attr, 0);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | (grace ? POSIX_SPAWN_SETPGROUP : 0));
  posix_spawn_file_actions_t files;
  posix_spawn_file_actions_init(&files);
  posix_spawn_file_actions_adddup2(&files, STDERR_FILENO, STDOUT_FILENO);
  pid_t pid;
  const int e = posix_spawn(&pid, "/bin/sh", &files, &attr, argv, envp.data());
  posix_spawn_file_actions_destroy(&files);
  posix_spawnattr_destroy(&attr);
  if (e != 0) fail(code, option + ": cannot start /bin/sh: " + std::string(std::strerror(e)));
  std::optional<StopForwarder> forward;
  if (grace) forward.emplace(pid, *grace);
  const int status = wait_command(pid, code, option);
  if (forward) {
    ShellStop s = forward->finish();
    if (s.signal) {
      if (WIFEXITED(status))
        s.exit_status = WEXITSTATUS(status);
      else
        s.ended_by = WTERMSIG(status);
      stop(s);
    }
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return;
  fail(code, option + " command failed (" + ended(status) + "): " + command);
}

std::string human_bytes(double n) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (n >= 1024 && u < 4) n /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, u ? "%.2f %s" : "%.0f %s", n, units[u]);
  return buf;
}

std::string count(std::uint64_t n, const std::string& noun) {
  return std::to_string(n) + " " + noun + (n == 1 ? "" : "s");
}

const char* program_version() { return HFDELTA_PROGRAM_VERSION; }

}  // namespace hfdelta::cli
