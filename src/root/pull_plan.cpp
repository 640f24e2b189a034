#include "root/pull_plan.hpp"

#include <utility>

#include "hfdelta/error.hpp"
#include "util/io.hpp"

namespace hfdelta {

namespace fs = boost::filesystem;

std::string withdrawn_held(const fs::path& root, std::uint64_t v) {
  return "version " + format_version(v) + ", which LOCAL holds, was withdrawn from " + root.string() +
         " (bad weights?); take a full version published after it (delta-diff --full NEW ROOT on the publishing "
         "side, then pull again), or re-initialise LOCAL from a good checkpoint (delta-apply --init CHECKPOINT "
         "LOCAL --init-version M)";
}

namespace {

// One version of a delta path: the delta that reaches it.
struct DeltaLink {
  std::uint64_t version;
  fs::path dir;
  DeltaIndex idx;
  bool sidecar = false;
};

// The deltas from `from` to `want` through every complete version between
// (a full version by the delta beside it), each on the one before: withdrawn
// numbers are skipped. None, with `why`, if a version has no such delta,
// does not connect, or is `refused`.
std::optional<std::vector<DeltaLink>> delta_path(const RootView& v, std::uint64_t from, std::uint64_t want,
                                                 const std::set<std::uint64_t>& refused, std::string& why) {
  std::vector<DeltaLink> links;
  std::uint64_t cur = from;
  if (v.withdrawn.count(from)) {
    why = withdrawn_held(v.root, from);
    return std::nullopt;
  }
  for (const VersionDir& d : v.versions) {
    if (d.version <= from || d.version > want) continue;
    if (refused.count(d.version)) {
      why = "version " + format_version(d.version) + " was refused";
      return std::nullopt;
    }
    std::optional<DeltaIndex> idx = v.index_of(d);
    fs::path dir = d.path;
    bool side = false;
    if (!idx) {
      if (const auto sc = v.sidecar_for(d.version)) idx = read_index_if_delta(*sc), dir = *sc, side = true;
      if (!idx) {
        why = "version " + format_version(d.version) + " is a full version with no delta beside it";
        return std::nullopt;
      }
    }
    if (idx->version != d.version || idx->base_version != cur) {
      why = dir.string() + ": records version " + format_version(idx->version) + " on base " +
            format_version(idx->base_version) + ", but the version before it is " + format_version(cur);
      if (idx->base_version > cur && idx->base_version < d.version)
        why += " (version " + format_version(idx->base_version) + " is " +
               (v.withdrawn.count(idx->base_version) ? "withdrawn" : "missing: pruned?") + ")";
      return std::nullopt;
    }
    links.push_back({d.version, dir, std::move(*idx), side});
    cur = d.version;
  }
  if (cur != want) {
    why = "version " + format_version(want) + " cannot be reached from " + format_version(from);
    return std::nullopt;
  }
  return links;
}

std::uint64_t cost_of(const std::vector<DeltaLink>& links) {
  std::uint64_t c = 0;
  for (const DeltaLink& l : links) c += tree_bytes(l.dir);
  return c;
}

// Opens every delta of a path whole (damage is found here, before LOCAL is
// touched); none, with `why`, if one is damaged (`damage`: the error, thrown
// as it is when no full version can be taken).
std::optional<std::vector<OpenDelta>> open_path(std::vector<DeltaLink>& links, std::string& why,
                                                std::optional<Error>& damage) {
  std::vector<OpenDelta> out;
  for (DeltaLink& l : links) {
    try {
      out.push_back(open_delta(l.dir, std::move(l.idx)));
    } catch (const Error& e) {
      if (e.code() != Exit::bad_input && e.code() != Exit::unsupported) throw;
      why = e.what();
      damage = e;
      return std::nullopt;
    }
  }
  return out;
}

}  // namespace

PullPlan plan_pull(const RootView& v, std::optional<std::uint64_t> local_version, std::uint64_t want,
                   const fs::path& local, const std::set<std::uint64_t>& refused) {
  const fs::path& root = v.root;
  const VersionDir* full = v.newest_full(want);
  if (!full && !local_version)
    fail(Exit::out_of_order, local,
         "has no version, and " + root.string() + " has no full version at or below " + format_version(want) +
             "; initialise it with --init");
  std::string why_deltas, why_full;
  std::optional<std::vector<DeltaLink>> deltas, after_full;
  if (local_version) deltas = delta_path(v, *local_version, want, refused, why_deltas);
  if (full) after_full = delta_path(v, full->version, want, refused, why_full);
  PullPlan p;
  // The bytes a path reads from ROOT: walked to choose when there are two
  // paths, else once the one path has opened; never twice.
  auto full_cost = [&] { return tree_bytes(full->path) + cost_of(*after_full); };
  std::optional<std::uint64_t> deltas_bytes, full_bytes;
  if (deltas && after_full) {
    full_bytes = full_cost();
    deltas_bytes = cost_of(*deltas);
  }
  const bool full_wins = after_full && (!deltas || *full_bytes < *deltas_bytes);
  std::optional<Error> damage;
  if (!full_wins && deltas) {
    std::optional<std::vector<OpenDelta>> opened = open_path(*deltas, why_deltas, damage);
    if (opened) {
      for (const DeltaLink& l : *deltas) p.sidecars += l.sidecar;
      p.bytes = deltas_bytes ? *deltas_bytes : cost_of(*deltas);
      p.chain = std::move(*opened);
      return p;
    }
    deltas.reset();
  }
  if (!after_full && damage) throw *damage;  // a damaged delta and nothing else to take: its own error
  if (!after_full) {
    const std::string& why = local_version ? why_deltas : why_full;
    fail(refused.empty() ? Exit::out_of_order : Exit::verify_failed, root,
         "cannot reach version " + format_version(want) + ": " + why +
             (full ? "" : "; no full version to start from either (publish one: delta-diff --full NEW ROOT)"));
  }
  std::optional<std::vector<OpenDelta>> opened = open_path(*after_full, why_full, damage);
  if (!opened) throw *damage;
  p.full = full;
  if (auto m = v.markers.find(full->version); m != v.markers.end() && m->second.full) p.full_marker = &m->second;
  for (const DeltaLink& l : *after_full) p.sidecars += l.sidecar;
  p.bytes = full_bytes ? *full_bytes : full_cost();
  p.chain = std::move(*opened);
  if (local_version && !deltas) p.fallback = why_deltas + "; took full version " + format_version(full->version);
  return p;
}

}  // namespace hfdelta
