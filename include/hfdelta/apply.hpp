// delta-apply: bring a host-local checkpoint to a version, in place.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include <boost/filesystem/path.hpp>

namespace hfdelta {

struct ApplyOptions {
  double lock_timeout = -1;  // seconds; < 0 waits forever
  bool sync = true;          // flush data before recording a version
  int threads = 0;           // 0: all cores
  // Run after a successful operation (no-op included) while the lock is
  // still held, e.g. to have the engine reload before another apply starts.
  std::function<void(std::uint64_t version)> then;
};

struct ApplyResult {
  std::optional<std::uint64_t> from_version;  // none: LOCAL was new
  std::uint64_t to_version = 0;
  std::vector<std::uint64_t> applied;  // versions applied, in order (a full version counts)
  std::optional<std::uint64_t> rolled_back;  // an interrupted apply of this version was undone first
  bool noop = false;
  std::uint64_t tensors_patched = 0;
  std::uint64_t delta_bytes = 0;     // bytes of delta entries read
  std::uint64_t files_written = 0, files_removed = 0;
  double seconds = 0;
};

// Every operation below takes LOCAL's lock, then first undoes whatever an
// interrupted earlier run left half done (see journal.hpp), then works inside
// a transaction of its own: it either completes or LOCAL is as it was.

// Makes LOCAL an exact copy of the full checkpoint SRC and records `version`.
ApplyResult init_local(const boost::filesystem::path& src, const boost::filesystem::path& local,
                       std::uint64_t version, const ApplyOptions& opts);

// Applies one delta version directory on top of LOCAL's version.
ApplyResult apply_delta(const boost::filesystem::path& delta, const boost::filesystem::path& local,
                        const ApplyOptions& opts);

// Brings LOCAL to `target` (default: newest version under ROOT) following the
// pull rules: the newest full version above LOCAL's resets it, deltas follow.
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
