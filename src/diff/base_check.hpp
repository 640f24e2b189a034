// What a version of a publication root leaves on a host, as far as the
// version records it, and the check that a checkpoint holds those bytes:
// every publisher (delta-diff into a root, --full BASE NEW, the publisher
// from memory) runs it on its base before it publishes the next version, so
// that nothing is published that would not turn the newest version into NEW.
// Private to the library.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <boost/filesystem/path.hpp>

#include "delta/parts.hpp"
#include "format/completion_marker.hpp"
#include "hfdelta/checkpoint.hpp"
#include "hfdelta/hash.hpp"

namespace hfdelta {

struct VersionBytes {
  std::uint64_t version = 0;
  boost::filesystem::path dir;
  bool recorded = false;                   // false: nothing checkable (a plain slime-layout delta)
  std::map<std::string, Hash128> tensors;  // tensor -> checksum of its bytes at the version
  // A tensor whose entry records only regions' checksums (a parts entry):
  // the tensor as a matrix, and each region's checksum (row-major bytes).
  struct Regions {
    MatrixShape m;
    std::vector<std::pair<Region, Hash128>> sums;
  };
  std::map<std::string, Regions> regions;
  std::map<std::string, Hash128> headers;               // weight file -> checksum of its 8-byte length and header
  std::map<std::string, std::optional<Hash128>> files;  // other file -> its checksum; none: absent at the version
  std::map<std::string, MarkedFile> full;               // a full version: every file, as its marker lists it
};

// Reads what version `v` of `root` records (a delta: each entry's new
// checksum, or its regions' for a parts entry, its built and rewritten
// headers, its carried and removed files;
// a full version: its completion marker). Error(bad_input) if it cannot be
// read: a damaged version is withdrawn (delta-diff --withdraw), not built on.
VersionBytes recorded_bytes(const boost::filesystem::path& root, std::uint64_t v);

// The checksum of a tensor of the checkpoint as the caller read it, if it
// did (none: read it here).
using KnownHash = std::function<std::optional<Hash128>(const std::string& tensor)>;

// Checks that checkpoint `c` (`role`: "BASE", "mirror ...") holds the bytes
// `want` records; Error(verify_failed) naming the first difference, the
// version expected and what to do.
void check_holds(const Checkpoint& c, const std::string& role, const VersionBytes& want, const KnownHash& known,
                 int threads);

}  // namespace hfdelta
