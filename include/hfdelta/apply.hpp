// delta-apply: bring a host-local checkpoint to a version, in place.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <boost/filesystem/path.hpp>

#include "hfdelta/error.hpp"

namespace hfdelta {

struct ApplyOptions {
  double lock_timeout = -1;  // seconds; < 0 waits forever
  bool sync = true;          // flush data before recording a version
  int threads = 0;           // 0: all cores
  // Let --init replace a non-empty directory that is not a LOCAL (no
  // .weight_sync/state.json); refused otherwise (Error(exists)).
  bool force = false;
  // Run after a successful operation (no-op included) while the lock is
  // still held, e.g. to have the engine reload before another apply starts.
  // An Error(then_failed), Error(peers_unready) or Error(128 + N) (a stop
  // signal ended it) it throws is not thrown on: it is kept in
  // ApplyResult::then_error (and then_code), with the result of the
  // operation it followed.
  std::function<void(std::uint64_t version)> then;
  // --root: a version directory without a completion marker is not published
  // yet (storage where files arrive one by one: an object store). Without it,
  // a version without a marker is taken as it is (a filesystem's rename
  // publishes it whole; the plain slime layout has none); one with a marker
  // is always checked against it.
  bool require_marker = false;
};

// Where an operation's wall time went, in seconds, phase by phase. The
// first four come before the `then` hook, while an engine still serves the
// old weights; `then` is the hook itself (an engine's reload: its pause).
// Every instant from the lock request to the end belongs to one phase, so
// lock + read + patch + sync is the whole time before the hook.
struct PhaseTimes {
  double lock = 0;             // waiting for LOCAL's lock, rolling back an interrupted apply
  double read = 0;             // reading LOCAL's state, ROOT and the deltas or SRC; checking, planning
  double patch = 0;            // staging, journaling and writing LOCAL, reading it back to check
  double sync = 0;             // flushing the journal and LOCAL, recording checksums, committing
  std::optional<double> then;  // the `then` hook; none when none ran
  double before_then() const { return lock + read + patch + sync; }
};

// One version's own share of the phases (a pull applies several; reading
// ROOT and opening the deltas is done once for all and counts in the
// totals only).
struct VersionPhases {
  std::uint64_t version = 0;
  bool full = false;  // a full version copied, not a delta applied
  double read = 0, patch = 0, sync = 0;
};

struct ApplyResult {
  std::optional<std::uint64_t> from_version;  // none: LOCAL was new
  std::uint64_t to_version = 0;
  std::vector<std::uint64_t> applied;        // versions applied, in order (a full version counts)
  std::optional<std::uint64_t> rolled_back;  // an interrupted apply of this version was undone first
  bool noop = false;
  bool record_rewritten =
      false;  // --init found SRC's bytes in place and only rewrote a missing or damaged checksum record
  std::uint64_t tensors_patched = 0;
  std::uint64_t delta_bytes = 0;  // bytes of delta entries read
  std::uint64_t files_written = 0, files_removed = 0;
  double seconds = 0;
  // pull only: how many versions ROOT publishes, and the newest (none:
  // nothing published yet, which is a no-op, not an error).
  std::optional<std::uint64_t> published, newest;
  // Nothing published and LOCAL never initialised: to_version means nothing,
  // and the `then` hook does not run (there is no version to reload).
  bool no_version = false;
  // pull only: the first version above LOCAL that is not completely there
  // yet (its marker or a file it lists still missing: `waiting_for`); the
  // pull stops below it.
  std::optional<std::uint64_t> not_published_yet;
  std::string waiting_for;
  // pull only: the full version copied (none: deltas only), and the deltas
  // taken from beside a full version (ROOT/delta_vNNNNNN) instead of copying it.
  std::optional<std::uint64_t> full_copied;
  std::uint64_t sidecars_applied = 0;
  std::uint64_t root_bytes = 0;  // size of the version directories the pull read
  // pull only: why the deltas from LOCAL's version were not taken (a version
  // pruned, withdrawn, damaged, or refused by LOCAL) and a full version was;
  // empty if they were.
  std::string fallback;
  // pull only: complete versions above `not_published_yet`. A version
  // stuck incomplete below complete ones was most likely cut short (its
  // publisher died): it blocks every host until withdrawn.
  std::vector<std::uint64_t> newer_complete;
  // pull only: the newest complete version above LOCAL's version when the
  // pull started (none: none); how far LOCAL is behind what it could take.
  std::optional<std::uint64_t> newest_complete;
  // The `then` hook failed or was stopped by a signal (its message, and the
  // exit code it maps to); the operation itself succeeded.
  std::optional<std::string> then_error;
  Exit then_code = Exit::then_failed;
  PhaseTimes phases;
  std::vector<VersionPhases> version_phases;  // in the order applied
};

// Every operation below first checks its paths, creating nothing: LOCAL must
// exist (except for --init) and must not be a delta version or a publication
// root, DELTA and ROOT must not be a LOCAL (the arguments look swapped;
// Error(bad_input)). Then it takes LOCAL's lock, then first undoes whatever an
// interrupted earlier run left half done (see journal.hpp), then works inside
// a transaction of its own: it either completes or LOCAL is as it was.

// Makes LOCAL an exact copy of the full checkpoint SRC and records `version`.
// Refuses an SRC without weight files, a delta version, or SRC and LOCAL
// that are the same directory or one inside the other (Error(bad_input)),
// and a non-empty LOCAL that is not one unless opts.force (Error(exists)).
// With SRC's bytes already in place it still rewrites a missing or damaged
// checksum record of `version`.
ApplyResult init_local(const boost::filesystem::path& src, const boost::filesystem::path& local, std::uint64_t version,
                       const ApplyOptions& opts);

// Applies one delta version directory on top of LOCAL's version.
ApplyResult apply_delta(const boost::filesystem::path& delta, const boost::filesystem::path& local,
                        const ApplyOptions& opts);

// Brings LOCAL to `target` (default: newest version under ROOT) following the
// pull rules: the deltas from LOCAL's version, or the newest full version at
// or below the target and the deltas after it, whichever reads fewer bytes;
// the full version wherever the deltas cannot be taken (a version pruned,
// withdrawn or damaged, a delta LOCAL refuses), saying why in `fallback`.
// Each version is committed as it is applied: a pull that fails keeps the
// versions before the one that failed (the error names that version and the
// one LOCAL keeps). A ROOT with nothing published, without `target`, is a
// no-op.
ApplyResult pull(const boost::filesystem::path& root, const boost::filesystem::path& local,
                 std::optional<std::uint64_t> target, const ApplyOptions& opts);

struct LocalStatus {
  std::optional<std::uint64_t> version;  // none: never initialised
  std::optional<std::uint64_t> pending;  // an apply of this version was interrupted
};

// LOCAL's recorded state, read under the lock, changing nothing. An
// interrupted apply shows as `pending`; the next apply rolls it back first.
LocalStatus local_status(const boost::filesystem::path& local, const ApplyOptions& opts);

// Only the recovery step: rolls back an interrupted apply, if any.
ApplyResult recover_local(const boost::filesystem::path& local, const ApplyOptions& opts);

}  // namespace hfdelta
