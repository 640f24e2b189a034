// What makes a version directory under a publication root whole: its
// completion marker, written by the publisher and checked by readers; full
// versions published by hfdelta; and the delta beside a full version
// (ROOT/delta_vNNNNNN) that lets a host one version behind skip the copy.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <boost/filesystem/path.hpp>

#include "hfdelta/diff.hpp"
#include "hfdelta/hash.hpp"
#include "hfdelta/version.hpp"

namespace hfdelta {

// The completion marker: the last file a publisher adds to a version
// directory. It lists every other file with its size and checksum, so that a
// reader of storage where files arrive one by one, in any order (an object
// store), can tell a version still arriving from a damaged one.
inline constexpr const char* kCompleteFile = "hfdelta_complete.json";

struct MarkedFile {
  std::uint64_t size = 0;
  Hash128 hash;
};

struct CompletionMarker {
  std::uint64_t version = 0;
  bool full = false;                          // an ordinary checkpoint, not a delta
  std::map<std::string, MarkedFile> files;   // relative path -> size, checksum
  std::uint64_t bytes = 0;                    // sum of the sizes
};

// Lists and hashes every regular file below `dir` (the marker excepted) and
// writes `dir/hfdelta_complete.json` (flushed if `sync`). Returns it.
CompletionMarker write_marker(const boost::filesystem::path& dir, std::uint64_t version, bool full, bool sync,
                              int threads);

// File `p` has the size and checksum its marker entry records.
bool matches_marker(const boost::filesystem::path& p, const MarkedFile& want);

// Whether a reader may take a version directory: complete (marker present,
// every file it lists present at its full size), or not published yet (the
// reason says what is missing). A marker that does not parse is damage
// (Error(bad_input)), not an upload in progress: it is written whole.
struct Completeness {
  bool complete = false;
  std::string missing;                      // when not complete: what is not there yet
  std::optional<CompletionMarker> marker;   // none: the directory has no marker
};
// `required`: a directory without a marker is not published yet (else it is
// taken as it is: a root of the plain slime layout, or of an older hfdelta).
Completeness check_complete(const boost::filesystem::path& dir, bool required);

// The delta beside full version N: ROOT/delta_vNNNNNN (version N on base
// N - 1). Named apart from weight_v* so that readers of the plain slime
// layout never see it.
std::string sidecar_dirname(std::uint64_t v);
// Sidecar deltas under ROOT, by version.
std::map<std::uint64_t, boost::filesystem::path> scan_sidecars(const boost::filesystem::path& root);

// Refuses (Error(bad_input), naming both paths) an OUT (a version directory
// or a publication root; it need not exist) that is one of the checkpoints
// `inputs` (role, path: "BASE", "NEW") or lies inside one: a root inside a
// save is copied into every later delta as the save's files, and every host
// would get it inside its LOCAL. Reads only names, so it runs before
// anything is created.
void check_out_apart(const boost::filesystem::path& out,
                     const std::vector<std::pair<std::string, boost::filesystem::path>>& inputs);

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
