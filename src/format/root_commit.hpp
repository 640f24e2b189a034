// What publishing a version into a publication root depends on, and its
// checks. Another actor may change the root while a publication runs (a
// withdrawal of its base, another publisher taking its number), so each
// check is made when the publication starts, to refuse early, and again
// right before its rename, which is when it counts (docs/format.md,
// "Publishing into a root").
#pragma once

#include <cstdint>
#include <optional>

#include <boost/filesystem/path.hpp>

namespace hfdelta {

struct PublishExpectation {
  boost::filesystem::path root;
  std::uint64_t version = 0;
  // The version the new one is published on; none for a full version,
  // which depends on no other.
  std::optional<std::uint64_t> base;
};

// Refuses, with what changed and what to do (nothing is published):
// - with `at_commit`, the version's number taken meanwhile, published or
//   withdrawn (Error(exists), naming that version and when it appeared);
// - a base that is not ROOT's newest published version, or that was
//   withdrawn (Error(out_of_order)): no host could ever apply the version.
void check_publishable(const PublishExpectation& e, bool at_commit);

// Right after `out` was renamed into place: a base withdrawn between the
// check at the commit and the rename strands `out`, so `out` is withdrawn
// too and Error(out_of_order) says so. A withdrawal after this check finds
// `out` itself (delta-diff --withdraw lists it as stranded).
void check_published(const PublishExpectation& e, const boost::filesystem::path& out);

// Publishes the finished directory `tmp` as `out` (publish_dir) between the
// two checks above; a rename refused because `out` appeared meanwhile says
// who took the number and when (Error(exists)).
void publish_checked(const boost::filesystem::path& tmp, const boost::filesystem::path& out,
                     const PublishExpectation& e);

// When `dir` (a version directory) appeared: its completion marker's time,
// or the directory's, as "2026-11-28 21:40:03 UTC, 12 s ago".
std::string published_when(const boost::filesystem::path& dir);

}  // namespace hfdelta
