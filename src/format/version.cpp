#include "hfdelta/version.hpp"

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>

#include <boost/filesystem/operations.hpp>

#include "hfdelta/error.hpp"
#include "util/io.hpp"

namespace hfdelta {

namespace fs = boost::filesystem;

namespace {
constexpr std::string_view kPrefix = "weight_v";
constexpr std::string_view kWithdrawnPrefix = "withdrawn_v";
constexpr std::string_view kSidecarPrefix = "delta_v";
}  // namespace

std::string format_version(std::uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%06llu", static_cast<unsigned long long>(v));
  return buf;
}

namespace {
// Decimal digits to a number; nullopt for anything else or on overflow.
std::optional<std::uint64_t> parse_digits(std::string_view s) {
  if (s.empty()) return std::nullopt;
  std::uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    if (__builtin_mul_overflow(v, 10u, &v) || __builtin_add_overflow(v, static_cast<unsigned>(c - '0'), &v))
      return std::nullopt;
  }
  return v;
}
}  // namespace

std::uint64_t parse_version(std::string_view s, const std::string& what) {
  if (auto v = parse_digits(s)) return *v;
  fail(Exit::bad_input, what + ": version \"" + std::string(s) + "\" is not a decimal number");
}

std::optional<std::uint64_t> version_from_name(std::string_view name, std::string_view prefix) {
  if (name.size() < prefix.size() + 6 || name.substr(0, prefix.size()) != prefix) return std::nullopt;
  return parse_digits(name.substr(prefix.size()));
}

std::optional<std::uint64_t> version_from_dirname(std::string_view name) { return version_from_name(name, kPrefix); }

std::string version_dirname(std::uint64_t v) { return std::string(kPrefix) + format_version(v); }

std::string withdrawn_dirname(std::uint64_t v) { return std::string(kWithdrawnPrefix) + format_version(v); }

std::set<std::uint64_t> scan_withdrawn(const fs::path& root) {
  boost::system::error_code ec;
  std::set<std::uint64_t> out;
  for (fs::directory_iterator it(root, ec), end; it != end && !ec; it.increment(ec))
    if (const auto v = version_from_name(it->path().filename().string(), kWithdrawnPrefix)) out.insert(*v);
  if (ec) fail(Exit::failure, root, "cannot list directory: " + ec.message());
  return out;
}

std::string sidecar_dirname(std::uint64_t v) { return std::string(kSidecarPrefix) + format_version(v); }

std::map<std::uint64_t, fs::path> scan_sidecars(const fs::path& root) {
  std::map<std::uint64_t, fs::path> out;
  boost::system::error_code ec;
  for (fs::directory_iterator it(root, ec), end; it != end && !ec; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const auto v = version_from_name(name, kSidecarPrefix);
    if (v && sidecar_dirname(*v) == name && fs::is_directory(it->symlink_status())) out.emplace(*v, it->path());
  }
  if (ec) fail(Exit::failure, root, "cannot list directory: " + ec.message());
  return out;
}

std::vector<VersionDir> scan_root(const fs::path& root) {
  boost::system::error_code ec;
  require_dir(root, "give the publication root (is the share mounted?)");
  std::vector<VersionDir> out;
  for (fs::directory_iterator it(root, ec), end; it != end && !ec; it.increment(ec)) {
    const auto v = version_from_dirname(it->path().filename().string());
    if (!v || !fs::is_directory(it->path())) continue;
    for (const auto& o : out)
      if (o.version == *v)
        fail(Exit::bad_input, root,
             "version " + format_version(*v) + " is published twice (" + o.path.filename().string() + ", " +
                 it->path().filename().string() + ")");
    out.push_back({*v, it->path()});
  }
  if (ec) fail(Exit::failure, root, "cannot list directory: " + ec.message());
  std::sort(out.begin(), out.end(), [](const VersionDir& a, const VersionDir& b) { return a.version < b.version; });
  return out;
}

void check_out_apart(const fs::path& out, const std::vector<std::pair<std::string, fs::path>>& inputs) {
  for (const auto& [role, in] : inputs) {
    const Nesting n = nesting(out, in);
    if (n == Nesting::apart) continue;
    fail(Exit::bad_input, out,
         (n == Nesting::same ? "is " + role + " itself (" + in.string() + ")"
                             : "is inside " + role + " " + in.string()) +
             ": a publication root inside a checkpoint would be carried into every later delta as "
             "the checkpoint's files, and into every host's LOCAL; put the root outside BASE and NEW "
             "(nothing was written)");
  }
}

fs::path strip_trailing_slashes(const std::string& p) {
  std::string s = p;
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  return s;
}

namespace {

// A directory that holds nothing but hidden entries (temporary directories
// of publications, leftovers of a prune).
bool only_hidden(const fs::path& dir) {
  boost::system::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; it != end && !ec; it.increment(ec))
    if (it->path().filename().string().front() != '.') return false;
  if (ec) fail(Exit::failure, dir, "cannot list directory: " + ec.message());
  return true;
}

std::optional<std::uint64_t> newest_version(const fs::path& root) {
  const std::vector<VersionDir> versions = scan_root(root);
  if (versions.empty()) return std::nullopt;
  return versions.back().version;
}

// The highest number ROOT has used: a withdrawn version's number is never
// given again, so a host that applied it can never mistake another version
// for it.
std::optional<std::uint64_t> highest_used(const fs::path& root, std::optional<std::uint64_t> newest) {
  const std::set<std::uint64_t> w = scan_withdrawn(root);
  if (w.empty()) return newest;
  return std::max(newest.value_or(0), *w.rbegin());
}

// What the next number follows, for errors.
std::string used_phrase(std::optional<std::uint64_t> newest, std::uint64_t used) {
  if (newest == used) return "newest published is " + format_version(used);
  return "highest used is " + format_version(used) + ", withdrawn";
}

// The folders in DIR that are publication roots (they hold a version, or a
// withdrawn one): DIR given as ROOT may be a root's parent, named by mistake.
std::vector<fs::path> child_roots(const fs::path& dir) {
  std::vector<fs::path> roots;
  boost::system::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; it != end && !ec; it.increment(ec)) {
    boost::system::error_code sec;
    if (!fs::is_directory(it->path(), sec)) continue;
    try {
      if (!scan_root(it->path()).empty() || !scan_withdrawn(it->path()).empty()) roots.push_back(it->path());
    } catch (const Error&) {  // unreadable: not known to be a root
    }
  }
  std::sort(roots.begin(), roots.end());
  return roots;
}

// DIR is not empty and holds no version: not a root. Naming a version in it
// would start a second root beside the one it may hold, so that one is named.
[[noreturn]] void fail_not_a_root(const fs::path& dir, std::optional<std::uint64_t> given) {
  const std::vector<fs::path> roots = child_roots(dir);
  const std::string what =
      "is an existing directory but not a publication root (it holds no weight_vNNNNNN version "
      "and is not empty)";
  if (roots.size() == 1)
    fail(Exit::bad_input, dir,
         what + "; " + roots[0].string() + " is a publication root: publish into it with delta-diff BASE NEW " +
             roots[0].string() + " (nothing was written)");
  if (!roots.empty()) {
    std::string list;
    for (const fs::path& r : roots) list += (list.empty() ? "" : ", ") + r.string();
    fail(Exit::bad_input, dir,
         what + "; the folders " + list +
             " in it are publication roots: give the one to publish into as ROOT (nothing was written)");
  }
  fail(Exit::bad_input, dir,
       what + "; to publish into it, name the version: " + (dir / version_dirname(given.value_or(1))).string());
}

// ROOT given instead of OUT: the next version in it.
PublishTarget next_in_root(const fs::path& root, std::optional<std::uint64_t> given) {
  const auto newest = newest_version(root);
  const auto used = highest_used(root, newest);
  if (!used && !only_hidden(root)) fail_not_a_root(root, given);
  const std::uint64_t next = used ? *used + 1 : 1;
  if (given && *given != next)
    fail(Exit::out_of_order, root,
         "--delta-version " + format_version(*given) + " is not the next version (" +
             (used ? used_phrase(newest, *used) : "nothing published yet") + ", so the next is " +
             format_version(next) + ")");
  return {root / version_dirname(next), next, newest, root};
}

// OUT named weight_v...: canonical, agreeing with --delta-version, unused, next in its parent.
PublishTarget named_version(const fs::path& out, std::optional<std::uint64_t> given) {
  const std::string name = out.filename().string();
  const auto v = version_from_dirname(name);
  if (!v || version_dirname(*v) != name)
    fail(Exit::usage, out,
         "\"" + name +
             "\" is not a version name: weight_v and six digits, zero-padded "
             "(e.g. weight_v000001)");
  if (given && *given != *v)
    fail(Exit::usage, out,
         "--delta-version " + format_version(*given) + " disagrees with the name (version " + format_version(*v) + ")");
  boost::system::error_code ec;
  if (fs::exists(fs::symlink_status(out, ec))) fail(Exit::exists, out, "already exists; refusing to overwrite");
  const fs::path parent = out.parent_path().empty() ? fs::path(".") : out.parent_path();
  require_dir(parent, "create the publication root first (mkdir -p " + parent.string() + ")");
  const auto newest = newest_version(parent);
  const auto used = highest_used(parent, newest);
  if (used && *v != *used + 1)
    fail(Exit::out_of_order, out,
         "version " + format_version(*v) + " is not the next version of " + parent.string() + " (" +
             used_phrase(newest, *used) + ", so the next is " + format_version(*used + 1) + ")");
  return {out, *v, newest, parent};
}

}  // namespace

PublishTarget publish_target(const fs::path& arg, std::optional<std::uint64_t> given) {
  const std::string name = arg.filename().string();
  boost::system::error_code ec;
  const bool versionish = name.rfind(kPrefix, 0) == 0;
  if (!versionish && fs::is_directory(arg, ec)) return next_in_root(arg, given);
  if (versionish) return named_version(arg, given);
  if (!given) {
    if (!exists_nofollow(arg))  // most likely a root not created yet, or misspelled
      fail(Exit::usage, arg,
           "does not exist; create the publication root first (mkdir -p " + arg.string() +
               "), or, to write a delta outside any root, name it weight_vNNNNNN or give --delta-version");
    fail(Exit::usage, arg, "OUT is not named weight_vNNNNNN; give --delta-version");
  }
  return {arg, *given, std::nullopt, {}};
}

}  // namespace hfdelta
