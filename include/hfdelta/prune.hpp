// delta-diff --prune: remove the version directories of a publication root
// that no `delta-apply --root` pull to a kept version can need.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <boost/filesystem/path.hpp>
#include <nlohmann/json_fwd.hpp>

#include "hfdelta/version.hpp"

namespace hfdelta {

struct PruneOptions {
  // Hosts must stay able to pull to every version >= keep_from (and to the
  // newest). None: from the newest full version.
  std::optional<std::uint64_t> keep_from;
  bool dry_run = false;  // decide and report, change nothing
  bool sync = true;      // flush ROOT after hiding the doomed versions
};

// A published version and what it is.
struct PrunedVersion {
  std::uint64_t version = 0;
  boost::filesystem::path path;
  bool full = false;       // an ordinary checkpoint, not a delta
  bool sidecar = false;    // ROOT/delta_vNNNNNN, the delta beside full version NNNNNN
  bool withdrawn = false;  // ROOT/withdrawn_vNNNNNN (delta-diff --withdraw), with its sidecar if any
};

struct PruneResult {
  boost::filesystem::path root;
  std::optional<std::uint64_t> keep_from;  // as asked (none: the newest full version)
  // The full version every kept pull can start from: the newest full version
  // at or below keep_from. None: there is none, so nothing is removed (hosts
  // initialised outside ROOT need every delta).
  std::optional<std::uint64_t> base_full;
  std::vector<PrunedVersion> removed;  // ascending; with dry_run: would be removed
  std::vector<PrunedVersion> kept;     // ascending
  // Hidden directories removed: of an interrupted prune, and temporary
  // directories of publications killed at least kStaleTempAge ago.
  std::vector<boost::filesystem::path> leftovers;
  std::uint64_t bytes_removed = 0;  // files of `removed` and `leftovers`
  bool dry_run = false;
};

// Prefix of the hidden name a doomed version is renamed to before it is
// deleted: ".pruned.weight_vNNNNNN.tmp-XXXXXXXX". Nothing else writes such
// names, so a later prune may delete them; the hidden names of a publication
// in progress (".weight_vNNNNNN.tmp-...") are left until kStaleTempAge old.
inline constexpr const char* kPrunedPrefix = ".pruned.";

// How long the temporary directory of a publication (".NAME.tmp-*", left by
// a delta-diff or --squash that was killed) must have been untouched before
// a prune removes it: longer than any publication takes to write a file.
inline constexpr long kStaleTempAge = 6 * 3600;  // seconds

// Keeps the newest full version at or below keep_from (the newest full
// version by default) and every version after it; everything older goes,
// withdrawn versions older than it too (their numbers stay used: a newer
// version always exists).
// Each doomed directory is first renamed to a hidden name beside it (one
// atomic step: a reader scanning ROOT sees it whole or not at all), then
// deleted. Checks the kept full version is a readable checkpoint before
// removing anything. Throws Error: bad_input for a ROOT or full version it
// cannot read, failure for an I/O error (directories already hidden are
// cleaned by the next prune).
PruneResult prune_root(const boost::filesystem::path& root, const PruneOptions& opts);

// The documented JSON form (man delta-diff, PRUNE OUTPUT).
nlohmann::json prune_json(const PruneResult& r);

}  // namespace hfdelta
