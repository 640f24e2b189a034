// delta-apply: bring a host-local checkpoint to a version, in place.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include <boost/filesystem/path.hpp>

namespace hfdelta {

struct ApplyOptions {
  double lock_timeout = -1;  // seconds; < 0 waits forever
  bool sync = true;          // flush data before recording a version
  int threads = 0;           // 0: all cores
};

struct ApplyResult {
  std::optional<std::uint64_t> from_version;  // none: LOCAL was new
  std::uint64_t to_version = 0;
  std::vector<std::uint64_t> applied;  // versions applied, in order (a full version counts)
  bool noop = false;
  std::uint64_t tensors_patched = 0;
  std::uint64_t delta_bytes = 0;     // bytes of delta entries read
  std::uint64_t files_written = 0, files_removed = 0;
  double seconds = 0;
};

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

}  // namespace hfdelta
