// The checks a publication into a root makes at its start and its commit
// (see root_commit.hpp).
#include "format/root_commit.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <set>
#include <string>
#include <vector>

#include "format/completion_marker.hpp"
#include "hfdelta/error.hpp"
#include "hfdelta/version.hpp"
#include "util/io.hpp"

namespace hfdelta {

namespace fs = boost::filesystem;

namespace {

// ROOT's versions as a publication sees them.
struct RootNow {
  std::optional<std::uint64_t> newest;  // published
  std::set<std::uint64_t> withdrawn;
};

RootNow look(const fs::path& root) {
  RootNow r;
  if (const std::vector<VersionDir> v = scan_root(root); !v.empty()) r.newest = v.back().version;
  r.withdrawn = scan_withdrawn(root);
  return r;
}

// The highest number used, and the directory that holds it.
fs::path highest_dir(const fs::path& root, const RootNow& r, std::uint64_t& used) {
  used = r.newest.value_or(0);
  if (!r.withdrawn.empty() && (!r.newest || *r.withdrawn.rbegin() > used)) {
    used = *r.withdrawn.rbegin();
    return root / withdrawn_dirname(used);
  }
  return root / version_dirname(used);
}

[[noreturn]] void taken(const PublishExpectation& e, const RootNow& r) {
  std::uint64_t used = 0;
  const fs::path dir = highest_dir(e.root, r, used);
  const bool gone = dir.filename() == withdrawn_dirname(used);
  fail(Exit::exists, dir,
       "version " + format_version(used) + " was " + (gone ? "published and withdrawn" : "published") +
           " by another publisher while version " + format_version(e.version) + " was being written (" +
           published_when(dir) +
           "); nothing was published. Two publishers on one root (often a job restarted while its old one "
           "still runs): stop one of them. The one that goes on publishes on version " +
           (r.newest ? format_version(*r.newest) : std::string("0")) +
           ": delta-diff with that version's save as BASE, a Publisher or ShardedPublisher opened again "
           "(opening catches its mirror up from ROOT)");
}

std::string next_step(const RootNow& r) {
  return r.newest ? "publish on version " + format_version(*r.newest) +
                        " (its save as BASE), or publish NEW as a full version (delta-diff --full NEW ROOT)"
                  : "publish NEW as a full version (delta-diff --full NEW ROOT)";
}

[[noreturn]] void base_withdrawn(const PublishExpectation& e, const RootNow& r, bool at_commit) {
  fail(Exit::out_of_order, e.root / withdrawn_dirname(*e.base),
       "version " + format_version(*e.base) + ", the base of version " + format_version(e.version) + ", was withdrawn" +
           (at_commit ? " while version " + format_version(e.version) + " was being written" : std::string()) +
           "; no host could apply a version on it (hosts that applied it are refused, the others skip it); "
           "nothing was published: " +
           next_step(r));
}

[[noreturn]] void not_newest(const PublishExpectation& e, const RootNow& r) {
  fail(Exit::out_of_order, e.root,
       "version " + format_version(e.version) + " would be published on version " + format_version(*e.base) +
           ", but the newest version of the root is " + format_version(*r.newest) + ": hosts at " +
           format_version(*r.newest) + " could not apply it, and hosts below would stop at it; " +
           "a version is published on the newest; nothing was published: " + next_step(r));
}

}  // namespace

std::string published_when(const fs::path& dir) {
  struct stat st {};
  if (::lstat((dir / kCompleteFile).c_str(), &st) != 0 && ::lstat(dir.c_str(), &st) != 0) return "time unknown";
  const std::time_t t = st.st_mtim.tv_sec;
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  char when[64];
  std::strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S UTC", &tm);
  const long long ago = static_cast<long long>(std::time(nullptr) - t);
  return std::string(when) + ", " + std::to_string(ago) + " s ago";
}

void check_publishable(const PublishExpectation& e, bool at_commit) {
  if (e.root.empty()) return;
  const RootNow r = look(e.root);
  if (at_commit &&
      ((r.newest && *r.newest >= e.version) || (!r.withdrawn.empty() && *r.withdrawn.rbegin() >= e.version)))
    taken(e, r);
  if (!e.base) return;
  if (r.withdrawn.count(*e.base) && r.newest != e.base) base_withdrawn(e, r, at_commit);
  if (r.newest && *r.newest != *e.base) not_newest(e, r);
}

void check_published(const PublishExpectation& e, const fs::path& out) {
  if (e.root.empty() || !e.base) return;
  if (exists_nofollow(e.root / version_dirname(*e.base)) || !exists_nofollow(e.root / withdrawn_dirname(*e.base)))
    return;
  const std::string name = out.filename().string();
  const fs::path to =
      e.root / (name == version_dirname(e.version) ? withdrawn_dirname(e.version) : "withdrawn_" + name);
  rename_path(out, to);
  sync_dir(e.root);
  fail(Exit::out_of_order, out,
       "its base, version " + format_version(*e.base) +
           ", was withdrawn as it was renamed into place, so it is withdrawn too (" + to.string() +
           "): no host could apply it; " + next_step(look(e.root)));
}

}  // namespace hfdelta

namespace hfdelta {

void publish_checked(const fs::path& tmp, const fs::path& out, const PublishExpectation& e) {
  check_publishable(e, true);  // what the rename depends on, as late as it can be looked at
  try {
    publish_dir(tmp, out);
  } catch (const Error& err) {
    if (err.code() == Exit::exists) check_publishable(e, true);  // taken in between: by whom, when
    throw;
  }
  check_published(e, out);
}

}  // namespace hfdelta
