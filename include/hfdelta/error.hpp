// Errors and the exit codes the commands map them to.
#pragma once

#include <concepts>
#include <stdexcept>
#include <string>
#include <utility>

namespace hfdelta {

// Exit codes are part of the CLI contract (documented in the man pages):
// scripts and cron jobs branch on them, so values never change meaning.
enum class Exit : int {
  ok = 0,
  failure = 1,
  usage = 2,
  bad_input = 3,
  out_of_order = 4,
  verify_failed = 5,
  unsupported = 6,
  exists = 7,
  lock_timeout = 8,
  then_failed = 9,
  interrupted = 10,
  uninitialised = 11,
  corrupt = 12,
  hook_published = 13,
  hook_pre_read = 14,
  peers_unready = 15,
  fleet_alert = 16,
};

// One row of the exit-code table: the code, its stable name (the --json
// error's "kind"), the Python exception class that stands for it and what it
// means. The man pages' EXIT STATUS sections, the README's table and
// python/hfdelta/errors.py are checked against this table
// (tests/test_errors.cpp, tests/python/test_errors.py).
struct ExitCode {
  Exit code;
  const char* kind;
  const char* python_class;
  const char* meaning;
};

inline constexpr ExitCode kExitCodes[] = {
    {Exit::ok, "ok", "", "success"},
    {Exit::failure, "failure", "Failure", "an I/O error or anything unexpected"},
    {Exit::usage, "usage", "UsageError", "a bad command line or argument"},
    {Exit::bad_input, "bad_input", "BadInput", "malformed safetensors, index, delta or checkpoint"},
    {Exit::out_of_order, "out_of_order", "OutOfOrder",
     "a delta's base is not LOCAL's version, or a version is missing"},
    {Exit::verify_failed, "verify_failed", "VerifyFailed", "a checksum mismatch after patching, or a base mismatch"},
    {Exit::unsupported, "unsupported", "Unsupported", "a change the format cannot express, or a delta too new"},
    {Exit::exists, "exists", "Exists", "the output exists already"},
    {Exit::lock_timeout, "lock_timeout", "LockTimeout", "LOCAL's lock was not had in time"},
    {Exit::then_failed, "then_failed", "ThenFailed", "the --then command failed (the apply succeeded)"},
    {Exit::interrupted, "interrupted", "Interrupted", "an apply was interrupted; the next run rolls it back"},
    {Exit::uninitialised, "uninitialised", "Uninitialised", "LOCAL has no recorded version"},
    {Exit::corrupt, "corrupt", "Corrupt", "LOCAL's bytes differ from its version's checksums"},
    {Exit::hook_published, "post_publish_failed", "PostPublishFailed", "--post-publish failed (the version stays)"},
    {Exit::hook_pre_read, "pre_read_failed", "PreReadFailed", "--pre-read failed (LOCAL untouched)"},
    {Exit::peers_unready, "peers_not_ready", "PeersNotReady", "a peer did not hold the version in time"},
    {Exit::fleet_alert, "fleet_alert", "FleetAlert", "a host is past --fail-behind or --fail-stale"},
};

// The stable name of an exit code ("bad_input", ...); above 128, a stop
// signal: "stopped"; an unknown code: "failure".
constexpr const char* exit_kind(int code) {
  for (const ExitCode& e : kExitCodes)
    if (static_cast<int>(e.code) == code) return e.kind;
  return code > 128 ? "stopped" : "failure";
}

// Every error carries the exit code it maps to, a message that names the file
// and the broken rule, so a failing cron job explains itself, and that file
// as a field of its own (--json's error.path, Python's HfdeltaError.path).
class Error : public std::runtime_error {
 public:
  Error(Exit code, const std::string& message, std::string path = {})
      : std::runtime_error(message), code_(code), path_(std::move(path)) {}
  Exit code() const noexcept { return code_; }
  const char* kind() const noexcept { return exit_kind(static_cast<int>(code_)); }
  // The file or directory the error is about; "" when it is about none.
  const std::string& path() const noexcept { return path_; }
  // Names the file of an error raised without one, by the layer that knows
  // which file it was reading (the codecs know only the bytes).
  void set_path_if_none(const std::string& path) {
    if (path_.empty()) path_ = path;
  }

 private:
  Exit code_;
  std::string path_;
};

[[noreturn]] inline void fail(Exit code, const std::string& message) { throw Error(code, message); }

// An error about `path`: its message is "PATH: PROBLEM".
[[noreturn]] inline void fail(Exit code, const std::string& path, const std::string& problem) {
  throw Error(code, path + ": " + problem, path);
}

// A path object (boost::filesystem::path, std::filesystem::path) as `path`.
template <class Path>
requires requires(const Path& p) {
  { p.string() } -> std::convertible_to<std::string>;
}
[[noreturn]] void fail(Exit code, const Path& path, const std::string& problem) { fail(code, path.string(), problem); }

// The same error as `e` (its code and path), with another message.
[[noreturn]] inline void fail_again(const Error& e, const std::string& message) {
  throw Error(e.code(), message, e.path());
}

// f(); an error it raises without a path is about `path`.
template <class F>
decltype(auto) about_file(const std::string& path, F&& f) {
  try {
    return std::forward<F>(f)();
  } catch (Error& e) {
    e.set_path_if_none(path);
    throw;
  }
}

}  // namespace hfdelta
