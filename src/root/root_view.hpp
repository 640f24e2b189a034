// A publication root as its readers see it: the one model of a root that
// pull, prune, withdraw, the mirror, the fleet view, host reports, peers and
// metrics ask, so that which versions a reader may take is written once
// (docs/format.md, "Reading a root"). Reads only; the rules of
// publishing into a root are version.hpp's (numbering) and root_commit.hpp's
// (the checks at the commit).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <boost/filesystem/path.hpp>

#include "format/completion_marker.hpp"
#include "hfdelta/delta_format.hpp"
#include "hfdelta/version.hpp"

namespace hfdelta {

// What ROOT holds, by name: its published versions, the deltas beside full
// versions and the withdrawn numbers. Nothing is read but names until a
// version is asked about.
struct RootListing {
  boost::filesystem::path root;
  std::vector<VersionDir> all;                                // every published version, ascending
  std::map<std::uint64_t, boost::filesystem::path> sidecars;  // the delta beside full version N
  std::set<std::uint64_t> withdrawn;                          // delta-diff --withdraw

  // The newest published version (none: none).
  std::optional<std::uint64_t> newest() const;
  // Version `d`'s delta index; none for a full version. Read on first use
  // and kept: a pull plans more than once (from LOCAL, from a full version,
  // again after a refusal). Throws what read_index_if_delta throws.
  const std::optional<DeltaIndex>& index_of(const VersionDir& d) const;
  // Whether version `d` is not a delta (docs/format.md, "Full versions and
  // delta versions"): its index, if already read, or any delta key in it
  // (is_delta_dir: an index that does not convert still makes a delta, so a
  // damaged delta is never taken for a full version). Converts nothing.
  bool is_full(const VersionDir& d) const;
  // A full version: not a delta, and complete (check_complete: its marker
  // is read only for a full version). What --prune may keep as the oldest.
  bool is_full_version(const VersionDir& d, bool require_marker) const;

 private:
  mutable std::map<std::uint64_t, std::optional<DeltaIndex>> indexes_;
};

RootListing list_root(const boost::filesystem::path& root);

// ROOT's newest published version (none: none), reading only its names.
std::optional<std::uint64_t> newest_published(const boost::filesystem::path& root);

// What a reader may take of ROOT above version `above` (none: all of it):
// the complete versions up to the first one still arriving, and those
// complete beyond it. Versions at or below `above` are not looked at.
struct RootView : RootListing {
  bool markers_required = false;                      // --require-marker: a version without a marker is still arriving
  std::vector<VersionDir> versions;                   // complete, ascending, up to `incomplete`
  std::map<std::uint64_t, CompletionMarker> markers;  // of `versions`
  std::optional<std::uint64_t> incomplete;            // the first version not completely there
  std::string waiting_for;                            // what it lacks
  std::vector<VersionDir> beyond;                     // complete versions above `incomplete`: a stall, not an upload?

  // Whether version `v` (above `above`) is completely there.
  bool is_complete(std::uint64_t v) const;
  // The newest complete version (none: none).
  std::optional<std::uint64_t> newest_complete() const;
  // The newest full version (complete, and not a delta) at or below
  // `at_most` (none: none): where a pull to `at_most` may start when it
  // cannot start from its LOCAL. Reads each index through index_of, newest
  // first: a delta whose index does not convert stops it with that error.
  const VersionDir* newest_full(std::uint64_t at_most) const;
  // The complete delta beside full version `v`, if any.
  std::optional<boost::filesystem::path> sidecar_for(std::uint64_t v) const;
};

RootView view_root(const boost::filesystem::path& root, std::optional<std::uint64_t> above, bool require_marker);

}  // namespace hfdelta
