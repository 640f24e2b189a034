// Full versions published by hfdelta, and the delta beside a full version
// (ROOT/delta_vNNNNNN) that lets a host one version behind skip the copy.
// Their completion markers: completion_marker.hpp; the names of both and
// check_out_apart: version.hpp.
#pragma once

#include <cstdint>

#include <boost/filesystem/path.hpp>

#include "hfdelta/diff.hpp"

namespace hfdelta {

struct FullSummary {
  std::uint64_t version = 0;
  std::uint64_t files = 0, bytes = 0;
  double seconds = 0;
};

// Publishes checkpoint `src` as the full version `out` (which must not
// exist): copied into a hidden directory beside it, its marker written,
// flushed (if `sync`), then renamed into place (publish_dir). Refuses an
// SRC without weight files or that is a delta (Error(bad_input)).
FullSummary publish_full(const boost::filesystem::path& src, const boost::filesystem::path& out, std::uint64_t version,
                         bool sync, int threads);

// Publishes the delta BASE -> SRC beside full version `full_out`
// (ROOT/delta_vNNNNNN, version opts.version), before the full version
// itself: written under a hidden name, then renamed. A sidecar already there
// with the same index (left by an interrupted run of the same publication)
// is kept; one with another index is Error(exists). Returns its path.
boost::filesystem::path publish_sidecar(const boost::filesystem::path& base, const boost::filesystem::path& src,
                                        const boost::filesystem::path& full_out, const DiffOptions& opts,
                                        DiffSummary& summary);

}  // namespace hfdelta
