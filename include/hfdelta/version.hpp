// Version numbers and version directories under a publication root.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <boost/filesystem/path.hpp>

namespace hfdelta {

// "000007": zero-padded to six digits, as the delta format writes versions.
std::string format_version(std::uint64_t v);
// Parses a version string (digits only); throws Error(bad_input) naming `what`.
std::uint64_t parse_version(std::string_view s, const std::string& what);
// "weight_v000007" -> 7; anything else -> nullopt.
std::optional<std::uint64_t> version_from_dirname(std::string_view name);
// The same for another prefix ("delta_v000007" with "delta_v"): at least six
// digits after `prefix`, nothing else.
std::optional<std::uint64_t> version_from_name(std::string_view name, std::string_view prefix);
std::string version_dirname(std::uint64_t v);
// "withdrawn_v000007": version 7 withdrawn from its root (delta-diff
// --withdraw). Named apart from weight_v* so that no reader takes it; its
// number is never published again.
std::string withdrawn_dirname(std::uint64_t v);
// Withdrawn versions under ROOT.
std::set<std::uint64_t> scan_withdrawn(const boost::filesystem::path& root);

// The delta beside full version N: ROOT/delta_vNNNNNN (version N on base
// N - 1). Named apart from weight_v* so that readers of the plain slime
// layout never see it.
std::string sidecar_dirname(std::uint64_t v);
// Sidecar deltas under ROOT, by version.
std::map<std::uint64_t, boost::filesystem::path> scan_sidecars(const boost::filesystem::path& root);

struct VersionDir {
  std::uint64_t version = 0;
  boost::filesystem::path path;
};

// Published versions under ROOT, ascending. Temporary directories of a
// publication in progress never match the version pattern, so they are
// skipped. No index is read: whether a version is full or a delta is the
// delta format's to tell (is_delta_dir, read_index_if_delta).
std::vector<VersionDir> scan_root(const boost::filesystem::path& root);

// Refuses (Error(bad_input), naming both paths) an OUT (a version directory
// or a publication root; it need not exist) that is one of the checkpoints
// `inputs` (role, path: "BASE", "NEW") or lies inside one: a root inside a
// save is copied into every later delta as the save's files, and every host
// would get it inside its LOCAL. Reads only names, so it runs before
// anything is created.
void check_out_apart(const boost::filesystem::path& out,
                     const std::vector<std::pair<std::string, boost::filesystem::path>>& inputs);

// `p` without trailing slashes ("/" stays "/"), so that "ROOT/" and
// "ROOT/weight_v000001/" name what "ROOT" and "ROOT/weight_v000001" name.
boost::filesystem::path strip_trailing_slashes(const std::string& p);

// Where delta-diff publishes, and as which version.
struct PublishTarget {
  boost::filesystem::path out;
  std::uint64_t version = 0;
  // OUT lies in a publication root that publishes versions already: its
  // newest (the base the new version must be published on; none when every
  // version of it was withdrawn) and the root itself.
  std::optional<std::uint64_t> newest;
  boost::filesystem::path root;
};

// Resolves delta-diff's OUT argument `arg` and --delta-version `given`, reading
// only names, and keeps a publication root consistent:
// - an existing directory not named weight_v*: a publication root if it holds
//   a published version or nothing but hidden entries (Error(bad_input)
//   otherwise: a checkpoint or a typo is no root); OUT is ROOT/weight_vNNNNNN
//   for the highest version number it has used + 1 (1 in an empty root;
//   withdrawn versions count as used);
// - a name starting with "weight_v": it must be exactly version_dirname of
//   its number (six digits, zero-padded; Error(usage)), agree with `given`
//   (Error(usage)) and, when OUT's parent already publishes versions, be the
//   highest number used + 1 (Error(out_of_order)); OUT must not exist
//   (Error(exists), checked before the order);
// - any other name: a delta outside any root; `given` is required (Error(usage);
//   for a path that does not exist, the message says to create the
//   publication root first: most often the root was meant).
PublishTarget publish_target(const boost::filesystem::path& arg, std::optional<std::uint64_t> given);

}  // namespace hfdelta
