// Version numbers and version directories under a publication root.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <boost/filesystem/path.hpp>

namespace hfdelta {

// "000007": zero-padded to six digits, as the delta format writes versions.
std::string format_version(std::uint64_t v);
// Parses a version string (digits only); throws Error(bad_input) naming `what`.
std::uint64_t parse_version(std::string_view s, const std::string& what);
// "weight_v000007" -> 7; anything else -> nullopt.
std::optional<std::uint64_t> version_from_dirname(std::string_view name);
std::string version_dirname(std::uint64_t v);

struct VersionDir {
  std::uint64_t version = 0;
  boost::filesystem::path path;
};

// Published versions under ROOT, ascending. Temporary directories of a
// publication in progress never match the version pattern, so they are
// skipped. No index is read: whether a version is full or a delta is the
// delta format's to tell (is_delta_dir, read_index_if_delta).
std::vector<VersionDir> scan_root(const boost::filesystem::path& root);

}  // namespace hfdelta
