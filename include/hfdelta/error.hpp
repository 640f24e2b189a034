// Errors and the exit codes the commands map them to.
#pragma once

#include <stdexcept>
#include <string>

namespace hfdelta {

// Exit codes are part of the CLI contract (documented in the man pages):
// scripts and cron jobs branch on them, so values never change meaning.
enum class Exit : int {
  ok = 0,
  failure = 1,          // I/O error or anything unexpected
  usage = 2,            // bad command line
  bad_input = 3,        // malformed safetensors, index, delta or checkpoint
  out_of_order = 4,     // delta's base is not the local version / missing version
  verify_failed = 5,    // checksum mismatch after patching, or base mismatch
  unsupported = 6,      // change the delta format cannot express (yet)
  exists = 7,           // output directory already exists
  lock_timeout = 8,     // could not take the local lock in time
  then_failed = 9,      // the --then command failed (the apply itself succeeded)
  interrupted = 10,     // --status: an apply was interrupted; the next run rolls it back
  uninitialised = 11,   // --status: LOCAL has no recorded version
  corrupt = 12,         // --verify: LOCAL's bytes differ from its version's recorded checksums
  hook_published = 13,  // delta-diff --post-publish failed (the version stays published)
  hook_pre_read = 14,   // delta-apply --pre-read failed (LOCAL untouched)
  peers_unready = 15,   // delta-apply --peers: a peer did not hold the version in time (--then not run)
  fleet_alert = 16,     // delta-apply --fleet: a host past --fail-behind or --fail-stale
};

// Every error carries the exit code it maps to and a message that names the
// file and the broken rule, so a failing cron job explains itself.
class Error : public std::runtime_error {
 public:
  Error(Exit code, const std::string& message) : std::runtime_error(message), code_(code) {}
  Exit code() const noexcept { return code_; }

 private:
  Exit code_;
};

[[noreturn]] inline void fail(Exit code, const std::string& message) { throw Error(code, message); }

}  // namespace hfdelta
