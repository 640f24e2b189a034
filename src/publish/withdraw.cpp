#include "hfdelta/withdraw.hpp"

#include <algorithm>

#include <boost/filesystem/operations.hpp>
#include <nlohmann/json.hpp>

#include "hfdelta/checkpoint.hpp"
#include "hfdelta/delta_format.hpp"
#include "hfdelta/error.hpp"
#include "hfdelta/version.hpp"
#include "root/root_view.hpp"
#include "util/io.hpp"

namespace hfdelta {

namespace fs = boost::filesystem;
using json = nlohmann::json;

namespace {

constexpr const char* kWithdrawnSidecarPrefix = "withdrawn_";

// Versions of ROOT published on `v`.
std::vector<std::uint64_t> built_on(const fs::path& root, std::uint64_t v) {
  std::vector<std::uint64_t> out;
  const RootListing listing = list_root(root);
  for (const VersionDir& d : listing.all) {
    if (d.version <= v) continue;
    try {
      if (const auto& idx = listing.index_of(d); idx && idx->base_version == v) out.push_back(d.version);
    } catch (const Error&) {  // a damaged newer version: reached by no one anyway
    }
  }
  return out;
}

// Hidden directories of publications of a version above `v` under way in
// ROOT: ".weight_vN.tmp-...", ".delta_vN.tmp-..." (delta-diff, --full,
// Publisher) and ".shard_vN.tmp-..." (ShardedPublisher). Listed after the
// rename: a publication that has not renamed yet is seen here, one that
// has is seen by built_on.
std::vector<fs::path> publishing_above(const fs::path& root, std::uint64_t v) {
  std::vector<fs::path> out;
  boost::system::error_code ec;
  for (fs::directory_iterator it(root, ec), end; it != end && !ec; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const auto tmp = name.find(".tmp-");
    if (name.empty() || name[0] != '.' || tmp == std::string::npos) continue;
    const std::string stem = name.substr(1, tmp - 1);
    for (const char* prefix : {"weight_v", "delta_v", "shard_v"})
      if (const auto n = version_from_name(stem, prefix); n && *n > v) out.push_back(it->path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

WithdrawResult withdraw_version(const fs::path& dir_arg, bool sync) {
  const fs::path dir = fs::absolute(strip_trailing_slashes(dir_arg.string()));
  const std::string name = dir.filename().string();
  const auto v = version_from_dirname(name);
  if (!v || version_dirname(*v) != name)
    fail(Exit::usage, dir_arg,
         "give the version directory to withdraw, ROOT/weight_vNNNNNN (weight_v and "
         "six digits)");
  WithdrawResult r;
  r.root = dir.parent_path();
  r.version = *v;
  r.withdrawn = r.root / withdrawn_dirname(*v);
  require_dir(r.root, "give a version directory of an existing publication root");
  if (exists_nofollow(r.root / kStateDir) || exists_nofollow(dir / kStateDir))
    fail(Exit::bad_input, dir,
         std::string("is in a LOCAL checkpoint (it has ") + kStateDir + "/), not a publication root");
  const fs::path side = r.root / sidecar_dirname(*v);
  const fs::path side_to = r.root / (std::string(kWithdrawnSidecarPrefix) + sidecar_dirname(*v));
  if (!exists_nofollow(dir)) {
    if (!exists_nofollow(r.withdrawn))
      fail(Exit::bad_input, dir, "no such version (nor withdrawn) in " + r.root.string());
    r.already = !exists_nofollow(side);
  } else {
    if (exists_nofollow(r.withdrawn))
      fail(Exit::exists, r.withdrawn, "already exists beside " + dir.string() + "; move one of them away by hand");
    rename_path(dir, r.withdrawn);  // the one step that takes it back: atomic
  }
  // The delta beside a full version goes too: its own number's bytes.
  if (exists_nofollow(side) && !exists_nofollow(side_to)) rename_path(side, side_to);
  if (exists_nofollow(side_to)) r.sidecar = side_to;
  if (sync && !r.already) sync_dir(r.root);
  r.stranded = built_on(r.root, *v);
  r.in_flight = publishing_above(r.root, *v);
  r.newest = newest_published(r.root);
  return r;
}

json withdraw_json(const WithdrawResult& r) {
  json stranded = json::array();
  for (const auto v : r.stranded) stranded.push_back(format_version(v));
  json in_flight = json::array();
  for (const auto& p : r.in_flight) in_flight.push_back(p.string());
  return {{"root", r.root.string()},
          {"version", format_version(r.version)},
          {"withdrawn", r.withdrawn.string()},
          {"sidecar", r.sidecar ? json(r.sidecar->string()) : json(nullptr)},
          {"already_withdrawn", r.already},
          {"stranded", std::move(stranded)},
          {"in_flight", in_flight},
          {"next_base", r.newest ? json(format_version(*r.newest)) : json(nullptr)}};
}

}  // namespace hfdelta
