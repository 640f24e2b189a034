// Publishing into a root: atomic and never replacing a version, also on a
// filesystem that rejects rename flags (a bindfs FUSE mount the test makes
// itself, which answers EINVAL to RENAME_NOREPLACE as the NFS and CephFS
// clients do); the root kept consistent (version names, --delta-version, newest + 1,
// ROOT given as OUT); and an empty or current root is no error for a pull.
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "e2e_util.hpp"

using namespace e2e;

namespace {

#define CHECK_ERR_MENTIONS(res, text) \
  CHECK_MESSAGE(contains((res).err, (text)), "stderr should mention \"" << (text) << "\"\n" << (res).describe())

// Exit status of a spawned child.
int wait_code(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

bool is_mount_point(const fs::path& dir) {
  struct stat a {
  }, b{};
  return ::stat(dir.c_str(), &a) == 0 && ::stat(dir.parent_path().c_str(), &b) == 0 && a.st_dev != b.st_dev;
}

// renameat2(RENAME_NOREPLACE) of a fresh directory inside `dir`: 0 or errno.
int noreplace_errno(const fs::path& dir) {
  const fs::path a = dir / ".probe-a", b = dir / ".probe-b";
  fs::create_directories(a);
  const int rc = ::renameat2(AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), RENAME_NOREPLACE);
  const int e = rc == 0 ? 0 : errno;
  boost::system::error_code ec;
  fs::remove_all(a, ec);
  fs::remove_all(b, ec);
  return e;
}

// `bindfs BACKING MNT`, a FUSE filesystem that passes every call through to
// BACKING but rejects rename flags (EINVAL), as the NFS and CephFS clients
// do; mounted for the object's lifetime, unmounted in every case. (`rclone
// mount` rejects them too, but its write cache loses files that are renamed
// with their directory while still uploading, so it cannot hold a version.)
class FuseMount {
 public:
  FuseMount(const fs::path& backing, const fs::path& mnt) : mnt_(mnt) {
    const std::string bindfs = system_tool("bindfs");
    unmount_ = system_tool("fusermount3");
    if (unmount_.empty()) unmount_ = system_tool("fusermount");
    if (::access("/dev/fuse", R_OK | W_OK) != 0)
      why_ = "/dev/fuse is not usable (" + std::string(std::strerror(errno)) + ")";
    else if (bindfs.empty())
      why_ = "bindfs is not installed (scripts/setup.sh installs it)";
    else if (unmount_.empty())
      why_ = "fusermount3 is not installed (scripts/setup.sh installs fuse3)";
    if (!why_.empty()) return;
    fs::create_directories(backing);
    fs::create_directories(mnt);
    const RunResult r = run({bindfs, backing.string(), mnt.string()});  // returns once mounted
    if (r.code != 0)
      why_ = r.cmdline + ": exit " + std::to_string(r.code) + ": " + first_line(r.err);
    else if (!is_mount_point(mnt))
      why_ = r.cmdline + ": nothing mounted";
  }
  ~FuseMount() {
    if (is_mount_point(mnt_) && run({unmount_, "-u", mnt_.string()}).code != 0) run({unmount_, "-uz", mnt_.string()});
  }
  FuseMount(const FuseMount&) = delete;
  FuseMount& operator=(const FuseMount&) = delete;

  bool mounted() const { return why_.empty(); }
  const std::string& why() const { return why_; }

 private:
  fs::path mnt_;
  std::string unmount_, why_;
};

// Hidden names in ROOT: temporary directories a publication left behind.
std::vector<std::string> hidden_names(const fs::path& root) {
  std::vector<std::string> out;
  for (const auto& n : list_names(root))
    if (n.front() == '.') out.push_back(n);
  return out;
}

// Two delta-diffs publishing the same version at once: their exit codes, sorted.
std::vector<int> publish_twice(const fs::path& base, const fs::path& target, const fs::path& out) {
  std::vector<pid_t> pids;
  for (int i = 0; i < 2; ++i) pids.push_back(spawn({diff_bin(), "-q", base.string(), target.string(), out.string()}));
  std::vector<int> codes;
  for (pid_t p : pids) codes.push_back(wait_code(p));
  std::sort(codes.begin(), codes.end());
  return codes;
}

// On ROOT (on whatever filesystem it is): version 1 published and pulled,
// then versions 2..4 each published by two delta-diffs at once (by name, or
// with ROOT given as OUT), each pulled: one publisher wins, the other exits 7,
// the version is whole, nothing is left behind, LOCAL converges.
void publish_and_pull(const fs::path& series, const fs::path& root, const fs::path& local) {
  require_init(save_dir(series, 0), local);
  const RunResult first =
      diff({"-q", save_dir(series, 0).string(), save_dir(series, 1).string(), version_dir(root, 1).string()});
  E2E_REQUIRE_CODE(first, 0);
  CHECK(pull(root, local)["to_version"] == "000001");
  E2E_CHECK_TREE_EQUAL(local, save_dir(series, 1));
  for (int v = 2; v <= 4; ++v) {
    const bool by_root = v % 2 == 1;
    const std::string how = by_root ? "ROOT given as OUT" : "named";
    INFO("version " << v << ", " << how);
    const std::vector<int> codes =
        publish_twice(save_dir(series, v - 1), save_dir(series, v), by_root ? root : version_dir(root, v));
    CHECK(codes == std::vector<int>{0, 7});
    CHECK(hidden_names(root).empty());
    CHECK(list_names(root).size() == static_cast<std::size_t>(v));
    E2E_CHECK_CODE(diff({"-q", "--inspect", version_dir(root, v).string()}), 0);
    CHECK(delta_index(version_dir(root, v))["metadata"]["version"] == v6(v));
    CHECK(pull(root, local)["to_version"] == v6(v));
    E2E_CHECK_TREE_EQUAL(local, save_dir(series, v));
  }
}

}  // namespace

TEST_CASE("publishing on the local filesystem: two publishers of one version, one wins, the other exits 7") {
  TempDir t;
  const fs::path series = gen_series(t / "series", 4);
  fs::create_directories(t / "root");
  publish_and_pull(series, t / "root", t / "local");
}

TEST_CASE("publishing on a FUSE mount that rejects rename flags (bindfs, as NFS): atomic, one publisher wins") {
  TempDir t;
  const fs::path series = gen_series(t / "series", 4);
  const FuseMount m(t / "backing", t / "mnt");
  if (!m.mounted()) {
    MESSAGE("skipped: cannot mount a FUSE filesystem: " << m.why());
    return;
  }
  const int e = noreplace_errno(t / "mnt");
  CHECK_MESSAGE(e == EINVAL, "renameat2(RENAME_NOREPLACE) on the bindfs mount: "
                                 << (e ? std::strerror(e) : "succeeded") << "; the portable path is not exercised");
  fs::create_directories(t / "mnt" / "root");
  publish_and_pull(series, t / "mnt" / "root", t / "local");
  // What the mount shows is what its backing directory holds.
  CHECK(list_names(t / "backing" / "root") == list_names(t / "mnt" / "root"));
  // Anything already at OUT is refused there too, and left as it was.
  write_file(t / "mnt" / "root" / "weight_v000005", "a file\n");
  const RunResult r = diff(
      {save_dir(series, 3).string(), save_dir(series, 4).string(), (t / "mnt" / "root" / "weight_v000005").string()});
  E2E_CHECK_CODE(r, 7);
  CHECK(read_file(t / "mnt" / "root" / "weight_v000005") == "a file\n");
  CHECK(hidden_names(t / "mnt" / "root").empty());
}

// ---- the root stays consistent ------------------------------------------------------

namespace {

// A series of 3 saves, ROOT with version 1 published, LOCAL at version 0.
struct Published {
  TempDir t;
  fs::path series, root, local;
  Published() {
    series = gen_series(t / "series", 3);
    root = t / "root";
    local = t / "local";
    fs::create_directories(root);
    E2E_REQUIRE_CODE(diff({"-q", save(0), save(1), version_dir(root, 1).string()}), 0);
    require_init(save_dir(series, 0), local);
  }
  std::string save(int i) const { return save_dir(series, i).string(); }
};

}  // namespace

TEST_CASE(
    "delta-diff refuses an OUT that would make the root inconsistent: its exit code, a message naming it, nothing "
    "created") {
  Published p;
  const std::string S1 = p.save(1), S2 = p.save(2);
  const fs::path R = p.root;
  std::vector<std::string> args;
  int want = 0;
  std::string mention;
  SUBCASE("seven digits") {
    args = {S1, S2, (R / "weight_v0000002").string()}, want = 2, mention = "weight_v0000002\" is not a version name";
  }
  SUBCASE("one digit") {
    args = {S1, S2, (R / "weight_v2").string()}, want = 2, mention = "weight_v2\" is not a version name";
  }
  SUBCASE("letters after the digits") {
    args = {S1, S2, (R / "weight_v000002x").string()}, want = 2, mention = "is not a version name";
  }
  SUBCASE("--delta-version disagreeing with the name") {
    args = {"--delta-version", "3", S1, S2, (R / "weight_v000002").string()}, want = 2,
    mention = "disagrees with the name";
  }
  SUBCASE("a version that skips one") {
    args = {S1, S2, (R / "weight_v000003").string()}, want = 4,
    mention = "newest published is 000001, so the next is 000002";
  }
  SUBCASE("a version already passed") {
    E2E_REQUIRE_CODE(diff({"-q", S1, S2, (R / "weight_v000002").string()}), 0);
    fs::remove_all(R / "weight_v000001");  // as a prune would
    args = {S1, S2, (R / "weight_v000001").string()}, want = 4, mention = "is not the next version";
  }
  SUBCASE("the version published already") {
    args = {p.save(0), S1, (R / "weight_v000001").string()}, want = 7, mention = "already exists";
  }
  SUBCASE("ROOT with a --delta-version that is not its next") {
    args = {"--delta-version", "5", S1, S2, R.string()}, want = 4, mention = "is not the next version";
  }
  SUBCASE("an existing directory that is no root (a checkpoint)") {
    args = {p.save(0), S1, S2}, want = 3, mention = "not a publication root";
  }
  SUBCASE("the root's parent: the root in it is named, no version beside it suggested") {
    args = {S1, S2, p.t.path().string()}, want = 3,
    mention = R.string() + " is a publication root: publish into it with delta-diff BASE NEW " + R.string();
  }
  SUBCASE("a path that does not exist and is no version name") {
    args = {S1, S2, (p.t / "roots-typo").string()}, want = 2, mention = "give --delta-version";
  }
  INFO("delta-diff " << [&] {
    std::string s;
    for (const auto& a : args) s += a + " ";
    return s;
  }());
  const Snapshot root_before = snapshot(R), series_before = snapshot(p.series);
  const auto top_before = list_names(p.t.path());
  const RunResult r = diff(args);
  E2E_CHECK_CODE(r, want);
  CHECK_ERR_MENTIONS(r, mention);
  const auto d = snapshot_diff(root_before, snapshot(R), "before", "after");
  CHECK_MESSAGE(d.empty(), (d.empty() ? "" : d.front()));
  CHECK(hidden_names(R).empty());
  CHECK(snapshot(p.series) == series_before);
  CHECK(list_names(p.t.path()) == top_before);
}

TEST_CASE("delta-diff with ROOT given as OUT publishes ROOT's newest version + 1; trailing slashes are harmless") {
  Published p;
  // ROOT, with a trailing slash on every path: version 2.
  const RunResult r = diff({"--json", p.save(1) + "/", p.save(2) + "//", p.root.string() + "/"});
  E2E_REQUIRE_CODE(r, 0);
  const json j = parse_json(r.out);
  CHECK(j["out"] == version_dir(p.root, 2).string());
  CHECK(j["version"] == "000002");
  CHECK(j["base_version"] == "000001");
  CHECK(list_names(p.root) == std::vector<std::string>{"weight_v000001", "weight_v000002"});
  // A pull with slashes too converges.
  E2E_REQUIRE_CODE(apply({"-q", "--root", p.root.string() + "/", p.local.string() + "/"}), 0);
  E2E_CHECK_TREE_EQUAL(p.local, save_dir(p.series, 2));
  // A named OUT with a trailing slash is that OUT.
  const fs::path other = p.t / "other";
  fs::create_directories(other);
  E2E_REQUIRE_CODE(diff({"-q", p.save(0), p.save(1), version_dir(other, 1).string() + "/"}), 0);
  CHECK(list_names(other) == std::vector<std::string>{"weight_v000001"});
}

TEST_CASE("delta-diff with an empty ROOT, or one holding only hidden entries, publishes version 1") {
  TempDir t;
  const fs::path series = gen_series(t / "series", 1);
  const fs::path root = t / "root";
  fs::create_directories(root);
  SUBCASE("empty") {}
  SUBCASE("only a hidden leftover") { fs::create_directories(root / ".weight_v000001.tmp-00000001"); }
  E2E_REQUIRE_CODE(diff({"-q", save_dir(series, 0).string(), save_dir(series, 1).string(), root.string()}), 0);
  CHECK(fs::is_directory(version_dir(root, 1)));
  E2E_CHECK_CODE(diff({"-q", "--inspect", version_dir(root, 1).string()}), 0);
}

// ---- an empty or current root is no error for a pull ------------------------------------

TEST_CASE("delta-apply --root with nothing published: exit 0, said plainly, LOCAL unchanged") {
  TempDir t;
  const fs::path series = gen_series(t / "series", 0);
  const fs::path root = t / "root", local = t / "local", hook_ran = t / "hook-ran";
  fs::create_directories(root);
  fs::create_directories(local);
  const std::string hook = "echo \"$HFDELTA_VERSION\" > " + hook_ran.string();
  SUBCASE("LOCAL at version 0") {
    require_init(save_dir(series, 0), local);
    const LocalSnapshot snap(local);
    const RunResult r = apply({"--root", root.string(), local.string()});
    E2E_CHECK_CODE(r, 0);
    CHECK_MESSAGE(contains(r.out, "nothing published yet"), r.describe());
    const RunResult js = apply({"--json", "--root", root.string(), local.string(), "--then", hook});
    E2E_REQUIRE_CODE(js, 0);
    const json j = parse_json(js.out.substr(js.out.find('{')));
    CHECK(j["noop"] == true);
    CHECK(j["from_version"] == "000000");
    CHECK(j["to_version"] == "000000");
    CHECK(j["versions_published"] == 0);
    CHECK(j["newest_version"].is_null());
    CHECK(j["behind"] == 0);
    CHECK(j["was_behind"] == 0);
    CHECK(read_file(hook_ran) == "000000\n");  // --then runs, as after any run with nothing to do
    E2E_CHECK_UNCHANGED(snap);
  }
  SUBCASE("a new host: LOCAL an empty directory") {
    const RunResult js = apply({"--json", "--root", root.string(), local.string(), "--then", hook});
    E2E_REQUIRE_CODE(js, 0);
    const json j = parse_json(js.out);
    CHECK(j["from_version"].is_null());
    CHECK(j["to_version"].is_null());
    CHECK(j["versions_published"] == 0);
    CHECK(j["was_behind"].is_null());
    CHECK(!fs::exists(hook_ran));  // no version to reload
    CHECK(state_version(local).empty());
  }
  SUBCASE("a --target is still required to be published") {
    require_init(save_dir(series, 0), local);
    E2E_CHECK_CODE(apply({"-q", "--root", root.string(), "--target", "1", local.string()}), 4);
  }
}

TEST_CASE("delta-apply --root --json says how many versions are published and how far behind LOCAL is") {
  Published p;
  E2E_REQUIRE_CODE(diff({"-q", p.save(1), p.save(2), p.root.string()}), 0);  // version 2
  json j = pull(p.root, p.local, {"--target", "1"});
  CHECK(j["versions_published"] == 2);
  CHECK(j["newest_version"] == "000002");
  CHECK(j["was_behind"] == 2);
  CHECK(j["behind"] == 1);
  j = pull(p.root, p.local);
  CHECK(j["was_behind"] == 1);
  CHECK(j["behind"] == 0);
  const RunResult r = apply({"--root", p.root.string(), p.local.string()});
  E2E_CHECK_CODE(r, 0);
  CHECK_MESSAGE(contains(r.out, "already at the newest version 000002"), r.describe());
  j = pull(p.root, p.local);
  CHECK(j["noop"] == true);
  CHECK(j["was_behind"] == 0);
  CHECK(j["behind"] == 0);
}
