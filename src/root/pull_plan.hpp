// What a pull to a version reads from a publication root: the deltas from
// LOCAL's version, or a full version and the deltas after it, whichever
// reads fewer bytes and can be taken (docs/format.md, "Reading a
// root"). Planned from a RootView, reading only; delta-apply's pull runs it.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <boost/filesystem/path.hpp>

#include "delta/delta_reader.hpp"
#include "root/root_view.hpp"

namespace hfdelta {

struct PullPlan {
  const VersionDir* full = nullptr;  // the full version to copy first, if any
  const CompletionMarker* full_marker = nullptr;
  std::vector<OpenDelta> chain;  // each delta after it (or after LOCAL's version), opened and checked whole
  std::uint64_t sidecars = 0;    // of those, deltas beside full versions
  std::uint64_t bytes = 0;       // of the directories it reads from ROOT
  std::string fallback;          // why the deltas from LOCAL's version could not be taken (a full version is)
};

// The pull from `local_version` (none: a LOCAL with no version) to `want`
// that reads fewer bytes: the deltas from LOCAL's version on (taking the
// delta beside each full version on the way), or the newest full version at
// or below `want` and the deltas after it. Withdrawn numbers are skipped
// (the next version is published on the one below them). Where the deltas
// from LOCAL cannot be taken (a version pruned, withdrawn, damaged, or
// `refused`: LOCAL refused it earlier in this pull) a full version is, and
// the plan says why. Every delta of the chosen path is opened whole before
// LOCAL is touched. Throws, naming `local` or ROOT, when `want` cannot be
// reached.
PullPlan plan_pull(const RootView& v, std::optional<std::uint64_t> local_version, std::uint64_t want,
                   const boost::filesystem::path& local, const std::set<std::uint64_t>& refused);

// What to do when LOCAL holds version `v`, which was withdrawn from `root`.
std::string withdrawn_held(const boost::filesystem::path& root, std::uint64_t v);

}  // namespace hfdelta
