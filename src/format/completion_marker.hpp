// The completion marker: the last file a publisher adds to a version
// directory. It lists every other file with its size and checksum, so that a
// reader of storage where files arrive one by one, in any order (an object
// store), can tell a version still arriving from a damaged one.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include <boost/filesystem/path.hpp>

#include "hfdelta/hash.hpp"

namespace hfdelta {

inline constexpr const char* kCompleteFile = "hfdelta_complete.json";

struct MarkedFile {
  std::uint64_t size = 0;
  Hash128 hash;
};

struct CompletionMarker {
  std::uint64_t version = 0;
  bool full = false;                        // an ordinary checkpoint, not a delta
  std::map<std::string, MarkedFile> files;  // relative path -> size, checksum
  std::uint64_t bytes = 0;                  // sum of the sizes
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
  std::string missing;                     // when not complete: what is not there yet
  std::optional<CompletionMarker> marker;  // none: the directory has no marker
};
// `required`: a directory without a marker is not published yet (else it is
// taken as it is: a root of the plain slime layout, or of an older hfdelta).
Completeness check_complete(const boost::filesystem::path& dir, bool required);

}  // namespace hfdelta
