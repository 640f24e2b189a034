#include "root/root_view.hpp"

#include <algorithm>
#include <utility>

namespace hfdelta {

namespace fs = boost::filesystem;

std::optional<std::uint64_t> RootListing::newest() const {
  if (all.empty()) return std::nullopt;
  return all.back().version;
}

const std::optional<DeltaIndex>& RootListing::index_of(const VersionDir& d) const {
  auto it = indexes_.find(d.version);
  if (it == indexes_.end()) it = indexes_.emplace(d.version, read_index_if_delta(d.path)).first;
  return it->second;
}

bool RootListing::is_full(const VersionDir& d) const {
  if (auto it = indexes_.find(d.version); it != indexes_.end()) return !it->second;
  return !is_delta_dir(d.path);
}

bool RootListing::is_full_version(const VersionDir& d, bool require_marker) const {
  return is_full(d) && check_complete(d.path, require_marker).complete;
}

RootListing list_root(const fs::path& root) {
  RootListing l;
  l.root = root;
  l.all = scan_root(root);
  l.sidecars = scan_sidecars(root);
  l.withdrawn = scan_withdrawn(root);
  return l;
}

bool RootView::is_complete(std::uint64_t v) const {
  auto has = [v](const std::vector<VersionDir>& list) {
    return std::any_of(list.begin(), list.end(), [v](const VersionDir& d) { return d.version == v; });
  };
  return has(versions) || has(beyond);
}

std::optional<std::uint64_t> newest_published(const fs::path& root) {
  const std::vector<VersionDir> all = scan_root(root);
  if (all.empty()) return std::nullopt;
  return all.back().version;
}

std::optional<std::uint64_t> RootView::newest_complete() const {
  if (!beyond.empty()) return beyond.back().version;
  if (!versions.empty()) return versions.back().version;
  return std::nullopt;
}

const VersionDir* RootView::newest_full(std::uint64_t at_most) const {
  // Complete already; each index read here is kept for the deltas' path.
  for (const std::vector<VersionDir>* list : {&beyond, &versions})
    for (auto it = list->rbegin(); it != list->rend(); ++it)
      if (it->version <= at_most && !index_of(*it)) return &*it;
  return nullptr;
}

std::optional<fs::path> RootView::sidecar_for(std::uint64_t v) const {
  auto s = sidecars.find(v);
  if (s == sidecars.end() || !check_complete(s->second, markers_required).complete) return std::nullopt;
  return s->second;
}

RootView view_root(const fs::path& root, std::optional<std::uint64_t> above, bool require_marker) {
  RootView v;
  v.root = root;
  v.all = scan_root(root);
  v.markers_required = require_marker;
  for (const VersionDir& d : v.all) {
    if (above && d.version <= *above) continue;
    Completeness c = check_complete(d.path, require_marker);
    if (v.incomplete) {
      if (c.complete) v.beyond.push_back(d);
      continue;
    }
    if (!c.complete) {
      v.incomplete = d.version;
      v.waiting_for = d.path.string() + ": " + c.missing + " is not there yet";
      continue;
    }
    if (c.marker) v.markers.emplace(d.version, std::move(*c.marker));
    v.versions.push_back(d);
  }
  // Listed after the versions were looked at: a withdrawal meanwhile is seen.
  v.sidecars = scan_sidecars(root);
  v.withdrawn = scan_withdrawn(root);
  return v;
}

}  // namespace hfdelta
