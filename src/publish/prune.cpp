#include "hfdelta/prune.hpp"

#include <algorithm>
#include <ctime>

#include <boost/filesystem/operations.hpp>
#include <nlohmann/json.hpp>

#include "hfdelta/checkpoint.hpp"
#include "hfdelta/error.hpp"
#include "hfdelta/version.hpp"
#include "root/root_view.hpp"
#include "util/io.hpp"

namespace hfdelta {

namespace fs = boost::filesystem;
using nlohmann::json;

namespace {

// A directory this tool hid on an earlier run: ".pruned.NAME.tmp-XXXXXXXX".
bool is_prune_leftover(const fs::directory_entry& e) {
  const std::string name = e.path().filename().string();
  boost::system::error_code ec;
  return name.rfind(kPrunedPrefix, 0) == 0 && name.find(".tmp-") != std::string::npos &&
         fs::is_directory(e.symlink_status(ec));
}

// The newest modification time in a tree: a publication still being
// written keeps touching some file of its temporary directory.
std::time_t newest_mtime(const fs::path& dir) {
  boost::system::error_code ec;
  std::time_t t = fs::last_write_time(dir, ec);
  for (fs::recursive_directory_iterator it(dir, ec), end; it != end && !ec; it.increment(ec)) {
    boost::system::error_code e2;
    const std::time_t m = fs::last_write_time(it->path(), e2);
    if (!e2) t = std::max(t, m);
  }
  return t;
}

// The temporary directory of a publication (delta-diff, --squash) that was
// killed before its rename: ".NAME.tmp-XXXXXXXX", untouched for
// kStaleTempAge. A younger one may belong to a run still in progress.
bool is_stale_publication(const fs::directory_entry& e, std::time_t now) {
  const std::string name = e.path().filename().string();
  boost::system::error_code ec;
  return name.size() > 1 && name[0] == '.' && name.rfind(kPrunedPrefix, 0) != 0 &&
         name.find(".tmp-") != std::string::npos && fs::is_directory(e.symlink_status(ec)) &&
         now - newest_mtime(e.path()) >= kStaleTempAge;
}

// For the report only: an unreadable directory counts as nothing.
std::uint64_t reported_bytes(const fs::path& dir) {
  try {
    return tree_bytes(dir);
  } catch (const Error&) {
    return 0;
  }
}

}  // namespace

PruneResult prune_root(const fs::path& root, const PruneOptions& opts) {
  PruneResult r;
  r.root = root;
  r.keep_from = opts.keep_from;
  r.dry_run = opts.dry_run;
  // A version without a marker counts as complete: the plain layout has none.
  const RootListing listing = list_root(root);
  std::vector<PrunedVersion> versions;
  for (const VersionDir& d : listing.all)  // a full version still arriving is no base to prune onto
    versions.push_back({d.version, d.path, listing.is_full_version(d, false)});

  {
    boost::system::error_code ec;
    const std::time_t now = std::time(nullptr);
    for (fs::directory_iterator it(root, ec), end; it != end && !ec; it.increment(ec))
      if (is_prune_leftover(*it) || is_stale_publication(*it, now)) r.leftovers.push_back(it->path());
    if (ec) fail(Exit::failure, root, "cannot list directory: " + ec.message());
    std::sort(r.leftovers.begin(), r.leftovers.end());
  }

  // A pull to any target T >= keep_from starts from the newest full version
  // at or below T above LOCAL (at least this one), or from LOCAL itself when
  // that is newer; either way it reads nothing older than this one.
  const PrunedVersion* full = nullptr;
  for (const PrunedVersion& d : versions)
    if (d.full && (!opts.keep_from || d.version <= *opts.keep_from)) full = &d;
  if (full) {
    r.base_full = full->version;
    // Once the older versions are gone this is the only way in for a new
    // host: refuse to prune onto a full version that cannot be read.
    open_checkpoint(full->path);
  }
  for (const PrunedVersion& d : versions) (full && d.version < full->version ? r.removed : r.kept).push_back(d);
  // The delta beside a full version goes with it: a host one version behind
  // a kept full version still needs it, one behind a removed one cannot exist.
  for (const auto& [v, path] : listing.sidecars)
    (full && v < full->version ? r.removed : r.kept).push_back({v, path, false, true});
  // A withdrawn version below the kept full version: no pull can need it,
  // and the kept full version's number keeps the numbering past it.
  if (full)
    for (const std::uint64_t v : listing.withdrawn) {
      if (v >= full->version) continue;
      for (const std::string& name : {withdrawn_dirname(v), "withdrawn_" + sidecar_dirname(v)})
        if (exists_nofollow(root / name)) r.removed.push_back({v, root / name, false, false, true});
    }
  for (const auto& d : r.removed) r.bytes_removed += reported_bytes(d.path);
  for (const auto& p : r.leftovers) r.bytes_removed += reported_bytes(p);
  if (opts.dry_run) return r;

  // Hide every doomed version first, oldest first: a rename is atomic, so a
  // reader scanning ROOT sees a version whole or not at all, never half deleted.
  std::vector<fs::path> hidden;
  for (const auto& d : r.removed) {
    // temp_path_beside adds the leading dot itself.
    const fs::path tmp = temp_path_beside(root / (std::string(kPrunedPrefix + 1) + d.path.filename().string()));
    try {
      rename_path(d.path, tmp);
    } catch (const Error&) {
      if (!exists_nofollow(d.path)) continue;  // a concurrent prune took it first
      throw;
    }
    hidden.push_back(tmp);
  }
  if (opts.sync && !hidden.empty()) sync_dir(root);

  std::string errors;
  hidden.insert(hidden.end(), r.leftovers.begin(), r.leftovers.end());
  for (const auto& p : hidden) {
    boost::system::error_code ec;
    fs::remove_all(p, ec);
    if (ec) errors += (errors.empty() ? "" : "; ") + p.string() + ": " + ec.message();
  }
  if (!errors.empty())
    fail(Exit::failure, "cannot remove " + errors + " (hidden already; the next prune removes what is left)");
  return r;
}

json prune_json(const PruneResult& r) {
  auto versions = [](const std::vector<PrunedVersion>& v) {
    json a = json::array();
    for (const auto& d : v)
      a.push_back({{"version", format_version(d.version)},
                   {"full", d.full},
                   {"sidecar", d.sidecar},
                   {"withdrawn", d.withdrawn},
                   {"path", d.path.string()}});
    return a;
  };
  json left = json::array();
  for (const auto& p : r.leftovers) left.push_back(p.string());
  return {{"root", r.root.string()},
          {"dry_run", r.dry_run},
          {"keep_from", r.keep_from ? json(format_version(*r.keep_from)) : json(nullptr)},
          {"base_full", r.base_full ? json(format_version(*r.base_full)) : json(nullptr)},
          {"removed", versions(r.removed)},
          {"kept", versions(r.kept)},
          {"leftovers", std::move(left)},
          {"bytes_removed", r.bytes_removed}};
}

}  // namespace hfdelta
