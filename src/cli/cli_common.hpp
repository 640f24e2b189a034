// What both commands share: error reporting and exit codes, thread count.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "hfdelta/error.hpp"

namespace hfdelta::cli {

// Prints `j` as the command's one JSON object on stdout, with "schema" and
// "ok" (true unless `j` says otherwise) added (hfdelta::json_report).
void print_json(nlohmann::json j);

// Parses argv with `app`, runs `body`, and turns every failure into a one-line
// message on stderr ("PROG: error: ...") and the documented exit code; with
// `*json_out` (--json), also into one JSON object on stdout (unless `body`
// printed one already): {"schema", "ok": false, "exit_code", "error": {"kind",
// "message", "path"}} (hfdelta::error_json). Output that cannot be written to stdout (a full disk,
// a closed pipe) is an error too.
int run(CLI::App& app, int argc, char** argv, const std::function<void()>& body, const bool* json_out = nullptr);

// For options taking a count or version number (--target N, --keep-from N):
// decimal digits only, so that "-1" is a usage error instead of wrapping to
// 2^64 - 1, and "000010" is ten, not octal. Leading zeros are dropped
// before CLI11 converts the value.
CLI::Validator whole_number();
// For --lock-timeout SECONDS: a number >= 0 ("-1" is a usage error; leave
// the option out to wait forever). `otherwise`: what leaving it out does.
CLI::Validator seconds(std::string_view otherwise = "leave it out to wait");
// --level, --threads (after whole_number) and --encoding: the library's
// rules (hfdelta/option_rules.hpp), shown in --help as CLI11's Range and
// IsMember show theirs.
CLI::Validator level();
CLI::Validator threads();
CLI::Validator encoding();

// Shows hfdelta::progress on stderr while it lives, from a thread of its
// own: redrawn in place about 5 times a second on a terminal, a line every
// 2 s otherwise (a log). `enabled`: --progress, or stderr is a terminal;
// never with -q or --json (the caller decides).
class ProgressLine {
 public:
  explicit ProgressLine(bool enabled);
  ~ProgressLine();
  // Clears the line and stops showing: before a summary or a --then command
  // writes to the terminal. Called for the live one by run_shell and print_json.
  void stop();
  static void stop_current();
  ProgressLine(const ProgressLine&) = delete;
  ProgressLine& operator=(const ProgressLine&) = delete;

 private:
  struct State;
  std::unique_ptr<State> s_;
};

// Whether to show progress: asked for, or stderr is a terminal; never
// quiet or with --json.
bool progress_wanted(bool asked, bool quiet, bool json);

// How a command run_shell ran ended, when a stop signal came.
struct ShellStop {
  int signal = 0;                  // the stop signal (0: none came)
  bool started = false;            // false: it came first, and the command was not run
  std::optional<int> exit_status;  // its shell (/bin/sh -c CMD) exited, with this status
  int ended_by = 0;                // or a signal ended the shell
  bool killed = false;             // a process of its group still ran after the grace: the group was killed
  double grace = 0;                // the seconds it was given
};

// How a stopped command ended: "was passed SIGTERM; all its processes ended within 60 s (its shell: exit status 143)"
std::string describe(const ShellStop& s);

// An Error whose message already says what the stop left: run() adds nothing.
class StopReported : public Error {
 public:
  using Error::Error;
};

// Runs `command` (given as `option`) with /bin/sh -c, extra environment
// variables added, its standard output sent to our standard error (stdout
// carries only the command's own report); throws Error(code) unless it exits 0.
// With `grace` (delta-apply's hooks) the command runs in a process group of its
// own, and a stop signal (hfdelta/signals.hpp) is passed on to that group, so
// that a reload script's trap runs and resumes its engine, and the script's
// own children (curl) stop too; the command is then waited for until no
// process of its group is left, and a group still running `*grace` seconds
// later is killed (SIGKILL). A signal that came before the command would start
// keeps it from starting. Either way it then throws Error(128 + N), `*stopped`
// saying how the command ended. Without `grace` a stop waits for the command.
void run_shell(const std::string& command, const std::vector<std::pair<std::string, std::string>>& env, Exit code,
               const std::string& option, std::optional<double> grace = std::nullopt, ShellStop* stopped = nullptr);

// delta-apply's default --stop-grace: longer than the contrib reload scripts
// take to resume their engine after a signal (one request, 30 s at most), well
// inside the systemd units' TimeoutStopSec (contrib/systemd).
constexpr double kStopGrace = 60;

// Human-readable byte count ("1.23 GiB").
std::string human_bytes(double n);

// "1 tensor", "2 tensors": a count and its noun, plural but for one.
std::string count(std::uint64_t n, const std::string& noun);

// hfdelta's version, as --version prints it.
const char* program_version();

}  // namespace hfdelta::cli
