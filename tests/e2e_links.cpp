// End-to-end: hard links. A LOCAL made with `cp -al` (from a base checkpoint,
// or as a backup of another LOCAL) shares inodes with the other tree; a patch
// written through them would change that tree too. `--init` gives LOCAL its
// own copies; delta-apply refuses a shared weight file before writing.
// Copy-on-write clones (`cp --reflink`) share blocks, not inodes, and stay
// allowed: they are tested on XFS in a loop-mounted image.
#include <doctest/doctest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "e2e_util.hpp"

using namespace e2e;

namespace {

// `cp -al FROM TO`, as an operator would make a cheap copy.
void cp_al(const fs::path& from, const fs::path& to) {
  const RunResult r = run({"/bin/cp", "-al", from.string(), to.string()});
  E2E_REQUIRE_CODE(r, 0);
}

nlink_t links_of(const fs::path& p) {
  struct stat st {};
  REQUIRE(::lstat(p.c_str(), &st) == 0);
  return st.st_nlink;
}

std::vector<fs::path> weight_files(const fs::path& dir) {
  std::vector<fs::path> v;
  for (const auto& f : list_files(dir))
    if (f.size() > 12 && f.substr(f.size() - 12) == ".safetensors" && f.find('/') == std::string::npos)
      v.push_back(dir / f);
  REQUIRE(!v.empty());
  return v;
}

struct Setup {
  TempDir t;
  fs::path series, root;
  Setup() {
    series = gen_series(t / "series", 2, {"--max-shard-size", "600KB"});
    root = t / "root";
    fs::create_directories(root);
    require_diff(save_dir(series, 0), save_dir(series, 1), version_dir(root, 1), "auto");
  }
};

}  // namespace

TEST_CASE("hard links: --init over a cp -al copy of the base gives LOCAL its own files") {
  Setup s;
  const fs::path base = s.t / "base";
  copy_tree(save_dir(s.series, 0), base);
  const fs::path local = s.t / "local";
  cp_al(base, local);
  for (const auto& w : weight_files(local)) REQUIRE(links_of(w) == 2);

  // The bytes already match: --init used to keep the shared files. (--force:
  // the copy has no .weight_sync/ yet, so it is not a LOCAL.)
  const RunResult init = apply({"--json", "--init", "--force", base.string(), local.string()});
  E2E_REQUIRE_CODE(init, 0);
  for (const auto& w : weight_files(local)) CHECK_MESSAGE(links_of(w) == 1, w.string() << " is still shared");
  for (const auto& w : weight_files(base)) CHECK(links_of(w) == 1);

  E2E_REQUIRE_CODE(apply({"-q", version_dir(s.root, 1).string(), local.string()}), 0);
  const TreeDiff b = tree_equal(base, save_dir(s.series, 0));
  CHECK_MESSAGE(b.equal, "the base checkpoint changed:\n" << b.report());
  const TreeDiff l = tree_equal(local, save_dir(s.series, 1));
  CHECK_MESSAGE(l.equal, l.report());
}

TEST_CASE("hard links: delta-apply refuses a LOCAL weight file with more than one link, before writing") {
  Setup s;
  const fs::path local = s.t / "local";
  require_init(save_dir(s.series, 0), local);
  // A cheap backup of LOCAL, as an operator might keep before an update.
  const fs::path backup = s.t / "backup";
  cp_al(local, backup);
  const Snapshot backup_before = snapshot(backup, false);

  const std::vector<std::pair<std::string, std::vector<std::string>>> forms = {
      {"a delta", {"-q", version_dir(s.root, 1).string(), local.string()}},
      {"a delta, --no-sync", {"-q", "--no-sync", version_dir(s.root, 1).string(), local.string()}},
      {"--root", {"-q", "--root", s.root.string(), local.string()}},
  };
  for (const auto& [form, args] : forms) {
    const std::string& name = form;  // clang 14 cannot capture a structured binding (INFO)
    INFO(name);
    const LocalSnapshot before(local);
    const RunResult r = apply(args);
    CHECK_MESSAGE(r.code == 3, r.describe());
    CHECK_MESSAGE(contains(r.err, "hard links"), r.describe());
    CHECK_MESSAGE(contains(r.err, "--init"), r.describe());
    bool named = false;
    for (const auto& w : weight_files(local)) named = named || contains(r.err, w.string());
    CHECK_MESSAGE(named, r.describe());
    const TreeDiff d = before.compare();
    CHECK_MESSAGE(d.equal, d.report());
    CHECK(!has_txn(local));
    CHECK(snapshot_diff(backup_before, snapshot(backup, false), "backup before", "backup now").empty());
  }

  // The fix the message gives: --init copies the shared files, then the
  // apply goes through and the backup keeps the old bytes.
  E2E_REQUIRE_CODE(apply({"-q", "--init", save_dir(s.series, 0).string(), local.string()}), 0);
  for (const auto& w : weight_files(local)) CHECK(links_of(w) == 1);
  E2E_REQUIRE_CODE(apply({"-q", version_dir(s.root, 1).string(), local.string()}), 0);
  const TreeDiff l = tree_equal(local, save_dir(s.series, 1));
  CHECK_MESSAGE(l.equal, l.report());
  CHECK(snapshot_diff(backup_before, snapshot(backup, false), "backup before", "backup now").empty());
  const TreeDiff b = tree_equal(backup, save_dir(s.series, 0));
  CHECK_MESSAGE(b.equal, b.report());
}

// Modification times of LOCAL's files: a step written and rolled back
// leaves the bytes as they were, but not these.
static std::map<std::string, std::int64_t> mtimes(const fs::path& dir) {
  std::map<std::string, std::int64_t> m;
  for (const auto& f : list_files(dir)) {
    struct stat st {};
    REQUIRE(::stat((dir / f).c_str(), &st) == 0);
    m[f] = st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec;
  }
  return m;
}

TEST_CASE(
    "hard links: a --root chain refuses a shared weight file before its first step; a full version in it copies") {
  TempDir t;
  const fs::path series = gen_series(t / "series", 2, {"--max-shard-size", "600KB"});
  const fs::path root = t / "root", full_root = t / "full-root";
  fs::create_directories(root);
  fs::create_directories(full_root);
  require_diff(save_dir(series, 0), save_dir(series, 1), version_dir(root, 1), "auto");
  require_diff(save_dir(series, 1), save_dir(series, 2), version_dir(root, 2), "auto");
  copy_tree(save_dir(series, 1), version_dir(full_root, 1));
  require_diff(save_dir(series, 1), save_dir(series, 2), version_dir(full_root, 2), "auto");

  const fs::path local = t / "local";
  require_init(save_dir(series, 0), local);
  // One weight file, the last, linked to a copy kept elsewhere.
  const fs::path shared = weight_files(local).back();
  const fs::path other = t / "kept.safetensors";
  REQUIRE(::link(shared.c_str(), other.c_str()) == 0);
  const Bytes kept = read_bytes(other);

  const LocalSnapshot before(local);
  const auto times = mtimes(local);
  const RunResult r = apply({"-q", "--root", root.string(), local.string()});
  CHECK_MESSAGE(r.code == 3, r.describe());
  CHECK_MESSAGE(contains(r.err, shared.string()), r.describe());
  const TreeDiff d = before.compare();
  CHECK_MESSAGE(d.equal, d.report());
  CHECK_MESSAGE(mtimes(local) == times, "a file of LOCAL was written before the refusal");
  CHECK(!has_txn(local));
  CHECK(read_bytes(other) == kept);

  // A chain that starts with a full version gives LOCAL its own copies first.
  E2E_REQUIRE_CODE(apply({"-q", "--root", full_root.string(), local.string()}), 0);
  const TreeDiff l = tree_equal(local, save_dir(series, 2));
  CHECK_MESSAGE(l.equal, l.report());
  for (const auto& w : weight_files(local)) CHECK(links_of(w) == 1);
  CHECK(read_bytes(other) == kept);
}

// ---- symbolic links: Hugging Face hub cache snapshots as sources -----------------

namespace {

// Lays out `saves` as huggingface_hub lays out its cache for one model repo:
// CACHE/models--ORG--NAME/{blobs/<hash>, refs/main, snapshots/<commit>/<file>},
// each snapshot file a relative symlink to its blob (blobs shared between
// revisions when the bytes are the same). Returns the snapshot directories.
std::vector<fs::path> make_hf_cache(const fs::path& cache, const std::vector<fs::path>& saves) {
  const fs::path repo = cache / "models--hfdelta--tiny";
  std::vector<fs::path> snapshots;
  std::string commit;
  for (std::size_t r = 0; r < saves.size(); ++r) {
    commit = xxh3_hex("revision " + std::to_string(r)) + "01234567";  // 40 hex digits, like a git commit
    const fs::path snap = repo / "snapshots" / commit;
    for (const auto& rel : list_files(saves[r])) {
      const Bytes b = read_bytes(saves[r] / rel);
      // LFS files are named by their sha256 (64 hex digits), others by a git sha1 (40).
      std::string blob = xxh3_hex(b) + xxh3_hex(rel);
      if (rel.size() < 12 || rel.substr(rel.size() - 12) != ".safetensors") blob.resize(40);
      if (!fs::exists(repo / "blobs" / blob)) write_bytes(repo / "blobs" / blob, b);
      std::string up = "../..";
      for (char c : rel)
        if (c == '/') up += "/..";
      fs::create_directories((snap / rel).parent_path());
      fs::create_symlink(up + "/blobs/" + blob, snap / rel);
    }
    snapshots.push_back(snap);
  }
  write_file(repo / "refs" / "main", commit);
  return snapshots;
}

// Every entry below dir (files, directories, links), relative, sorted.
std::vector<std::string> all_entries(const fs::path& dir) {
  std::vector<std::string> v;
  for (fs::recursive_directory_iterator it(dir), end; it != end; ++it)
    v.push_back(it->path().lexically_relative(dir).generic_string());
  std::sort(v.begin(), v.end());
  return v;
}

}  // namespace

TEST_CASE("symbolic links: a Hugging Face hub cache snapshot as SRC of --init, and as BASE and NEW of delta-diff") {
  TempDir t;
  const fs::path series = gen_series(t / "series", 2, {"--max-shard-size", "600KB"});
  // A file in a subdirectory too, as some repos have.
  for (int i = 0; i < 2; ++i) write_file(save_dir(series, i) / "tokenizer" / "vocab.txt", "a b c " + std::to_string(i));
  const fs::path cache = t / "hub";
  const auto snaps = make_hf_cache(cache, {save_dir(series, 0), save_dir(series, 1)});
  REQUIRE(fs::is_symlink(fs::symlink_status(snaps[0] / "config.json")));
  const auto cache_before = snapshot(cache, false);
  const auto cache_entries = all_entries(cache);
  const auto outside_before = list_names(t.path());

  // --init from the snapshot: LOCAL gets regular files with the blobs' bytes.
  const fs::path local = t / "local";
  const RunResult init = apply({"--json", "--init", snaps[0].string(), local.string()});
  E2E_REQUIRE_CODE(init, 0);
  const TreeDiff li = tree_equal(local, save_dir(series, 0));
  CHECK_MESSAGE(li.equal, li.report());
  for (const auto& rel : list_files(local)) CHECK_MESSAGE(!fs::is_symlink(fs::symlink_status(local / rel)), rel);
  CHECK(list_names(t.path()).size() == outside_before.size() + 1);  // LOCAL and nothing else

  // delta-diff of two snapshots: the same delta as of plain copies.
  const fs::path root = t / "root", plain_root = t / "plain-root";
  fs::create_directories(root);
  fs::create_directories(plain_root);
  const RunResult d =
      diff({"-q", "--encoding", "auto", snaps[0].string(), snaps[1].string(), version_dir(root, 1).string()});
  E2E_REQUIRE_CODE(d, 0);
  require_diff(save_dir(series, 0), save_dir(series, 1), version_dir(plain_root, 1), "auto");
  for (const auto& entry : ops_of(delta_index(version_dir(root, 1)))) {
    const auto& file = entry.first;  // plain references: CHECK_MESSAGE captures them
    const auto& op = entry.second;
    CHECK_MESSAGE(file.find("..") == std::string::npos, file << ": " << op);
  }
  const TreeDiff same = tree_equal(version_dir(root, 1), version_dir(plain_root, 1));
  CHECK_MESSAGE(same.equal, "delta of the snapshots differs from the delta of plain copies:\n" << same.report());

  // The delta applies to the LOCAL made from the snapshot.
  E2E_REQUIRE_CODE(apply({"-q", version_dir(root, 1).string(), local.string()}), 0);
  const TreeDiff la = tree_equal(local, save_dir(series, 1));
  CHECK_MESSAGE(la.equal, la.report());

  // Nothing in the cache was written: same entries, same bytes.
  CHECK(all_entries(cache) == cache_entries);
  CHECK(snapshot_diff(cache_before, snapshot(cache, false), "cache before", "cache now").empty());

  // --init into LOCAL again from the next snapshot: still files of its own.
  E2E_REQUIRE_CODE(apply({"-q", "--init", "--init-version", "2", snaps[1].string(), local.string()}), 0);
  for (const auto& rel : list_files(local)) CHECK_MESSAGE(!fs::is_symlink(fs::symlink_status(local / rel)), rel);

  // A symlinked directory inside a source is refused, naming it.
  const fs::path linked = t / "linked";
  copy_tree(save_dir(series, 0), linked);
  fs::remove_all(linked / "tokenizer");
  fs::create_directory_symlink(save_dir(series, 0) / "tokenizer", linked / "tokenizer");
  const RunResult r = diff({"-q", linked.string(), save_dir(series, 1).string(), version_dir(root, 2).string()});
  CHECK_MESSAGE(r.code == 3, r.describe());
  CHECK_MESSAGE(contains(r.err, (linked / "tokenizer").string()), r.describe());
}

TEST_CASE("symbolic links: LOCAL keeps refusing them") {
  TempDir t;
  const fs::path series = gen_series(t / "series", 2);
  const fs::path root = t / "root";
  fs::create_directories(root);
  require_diff(save_dir(series, 0), save_dir(series, 1), version_dir(root, 1), "auto");
  const fs::path local = t / "local";
  require_init(save_dir(series, 0), local);
  // A weight file of LOCAL replaced by a link to a copy elsewhere.
  const fs::path w = weight_files(local).front();
  const fs::path elsewhere = t / "elsewhere.safetensors";
  fs::copy_file(w, elsewhere);
  fs::remove(w);
  fs::create_symlink(elsewhere, w);
  const Bytes outside = read_bytes(elsewhere);
  const RunResult r = apply({"-q", version_dir(root, 1).string(), local.string()});
  CHECK_MESSAGE(r.code == 3, r.describe());
  CHECK_MESSAGE(contains(r.err, w.string()), r.describe());
  CHECK(read_bytes(elsewhere) == outside);
}

TEST_CASE(
    "symbolic links: a link anywhere inside LOCAL is refused by every form, nothing moved or written through it") {
  TempDir t;
  const fs::path series = gen_series(t / "series", 2);
  const fs::path root = t / "root";
  fs::create_directories(root);
  require_diff(save_dir(series, 0), save_dir(series, 1), version_dir(root, 1), "auto");
  // What the links point to, outside LOCAL.
  write_file(t / "outside.txt", "not LOCAL's");
  write_file(t / "elsewhere" / "x.txt", "not LOCAL's either");
  const auto outside_before = snapshot(t / "elsewhere", false);

  // Links that are no file of SRC nor of the delta: --init used to take one
  // for its target ("../outside.txt") and move that into its journal, and
  // the other forms went through.
  const std::vector<std::pair<std::string, std::string>> links = {
      {"notes.txt", "../outside.txt"},
      {"extra", "../elsewhere"},
      {"sub/deep.txt", "../../outside.txt"},
  };
  for (const auto& link : links) {
    const std::string& name = link.first;  // plain references: INFO captures them
    const std::string& target = link.second;
    INFO(name << " -> " << target);
    const fs::path local = t / "local";
    fs::remove_all(local);
    require_init(save_dir(series, 0), local);
    fs::create_directories((local / name).parent_path());
    fs::create_symlink(target, local / name);
    const std::vector<std::pair<std::string, std::vector<std::string>>> forms = {
        {"a delta", {"-q", version_dir(root, 1).string(), local.string()}},
        {"a delta, --no-sync", {"-q", "--no-sync", version_dir(root, 1).string(), local.string()}},
        {"--root", {"-q", "--root", root.string(), local.string()}},
        {"--init of the next save",
         {"-q", "--init", "--init-version", "1", save_dir(series, 1).string(), local.string()}},
        {"--init of the same save", {"-q", "--init", save_dir(series, 0).string(), local.string()}},
    };
    for (const auto& [what, args] : forms) {
      const std::string& form = what;  // clang 14 cannot capture a structured binding (INFO)
      INFO(form);
      const LocalSnapshot before(local);
      const RunResult r = apply(args);
      CHECK_MESSAGE(r.code == 3, r.describe());
      CHECK_MESSAGE(contains(r.err, (local / name).string() + ": is a symlink"), r.describe());
      const TreeDiff d = before.compare();
      CHECK_MESSAGE(d.equal, d.report());
      CHECK(!has_txn(local));
      CHECK(read_file(t / "outside.txt") == "not LOCAL's");
      CHECK(snapshot_diff(outside_before, snapshot(t / "elsewhere", false), "before", "now").empty());
    }
    // --verify names the link, not its target.
    const RunResult v = apply({"--verify", local.string()});
    CHECK_MESSAGE(v.code != 0, v.describe());
    CHECK_MESSAGE(contains(v.out + v.err, (local / name).string() + ":"), v.describe());
  }
}

TEST_CASE("symbolic links: a dangling link, a link to a directory or to a device in a source is refused, naming it") {
  TempDir t;
  const fs::path series = gen_series(t / "series", 2);
  fs::create_directories(t / "dir");
  const std::vector<std::tuple<std::string, fs::path, std::string>> links = {
      {"dangling.txt", t / "nothing", "is a dangling symlink"},
      {"loop.txt", "loop.txt", "is a dangling symlink"},
      {"tokenizer", t / "dir", "is a symlink to a directory"},
      {"null.txt", "/dev/null", "not a regular file (a symlink to /dev/null)"},
  };
  for (const auto& link : links) {
    const auto& [name, target, says] = link;
    const std::string target_text = target.string();  // INFO captures by reference: no structured binding
    INFO(std::get<0>(link) << " -> " << target_text);
    const fs::path src = t / "src";
    fs::remove_all(src);
    copy_tree(save_dir(series, 0), src);
    fs::create_symlink(target, src / name);
    const fs::path local = t / "local";
    const RunResult init = apply({"-q", "--init", src.string(), local.string()});
    CHECK_MESSAGE(init.code == 3, init.describe());
    CHECK_MESSAGE(contains(init.err, (src / name).string() + ": " + says), init.describe());
    CHECK(!fs::exists(local / "config.json"));
    fs::create_directories(t / "root");
    const fs::path out = t / "root" / "weight_v000001";
    const RunResult d = diff({"-q", src.string(), save_dir(series, 1).string(), out.string()});
    CHECK_MESSAGE(d.code == 3, d.describe());
    CHECK_MESSAGE(contains(d.err, (src / name).string() + ": " + says), d.describe());
    CHECK(!fs::exists(out));
  }
}

// ---- copy-on-write clones ------------------------------------------------------------

namespace {

// XFS with reflink on a loop device, mounted at `dir` for the object's
// lifetime: a filesystem where `cp --reflink=always` makes clones that share
// blocks but not inodes. why() says what stopped it.
class ReflinkFs {
 public:
  // 512 MB, sparse: XFS wants 300 MB at least.
  explicit ReflinkFs(const fs::path& dir)
      : dir_(dir), why_(mount_loop_image(dir, std::uint64_t{512} << 20, {"mkfs.xfs", "-q", "-f", "-m", "reflink=1"})) {}
  ~ReflinkFs() {
    if (why_.empty()) unmount(dir_);
  }
  ReflinkFs(const ReflinkFs&) = delete;
  ReflinkFs& operator=(const ReflinkFs&) = delete;

  bool mounted() const { return why_.empty(); }
  const std::string& why() const { return why_; }
  fs::path operator/(const std::string& rel) const { return dir_ / rel; }

 private:
  fs::path dir_;
  std::string why_;
};

// `cp -a --reflink=always FROM TO`: fails unless every file is a clone.
void cp_reflink(const fs::path& from, const fs::path& to) {
  const RunResult r = run({"/bin/cp", "-a", "--reflink=always", from.string(), to.string()});
  E2E_REQUIRE_CODE(r, 0);
}

}  // namespace

TEST_CASE(
    "copy-on-write clones: LOCALs cloned with cp --reflink are patched on their own, the other trees keep their "
    "bytes") {
  Setup s;
  const ReflinkFs xfs(s.t / "xfs");  // unmounted before s.t is removed
  if (!xfs.mounted()) {
    MESSAGE("skipped: cannot mount XFS with reflink on a loop device (" << xfs.why() << "); run the tests as root");
    return;
  }
  // A base checkpoint on the clone-capable filesystem, a LOCAL cloned from
  // it and recorded with --init (its bytes already match), and an
  // operator's backup of that LOCAL, cloned in turn.
  const fs::path base = xfs / "base", local = xfs / "local", backup = xfs / "backup", second = xfs / "second";
  copy_tree(save_dir(s.series, 0), base);
  cp_reflink(base, local);
  E2E_REQUIRE_CODE(apply({"-q", "--init", "--force", base.string(), local.string()}), 0);
  for (const auto& w : weight_files(local)) REQUIRE(links_of(w) == 1);
  cp_reflink(local, backup);
  cp_reflink(backup, second);

  // Both apply modes go through (no link is shared), and only the LOCAL
  // applied to changes.
  E2E_REQUIRE_CODE(apply({"-q", version_dir(s.root, 1).string(), local.string()}), 0);
  E2E_REQUIRE_CODE(apply({"-q", "--no-sync", version_dir(s.root, 1).string(), second.string()}), 0);
  for (const fs::path& l : {local, second}) {
    const TreeDiff d = tree_equal(l, save_dir(s.series, 1));
    CHECK_MESSAGE(d.equal, l.string() << ":\n" << d.report());
    E2E_CHECK_CODE(apply({"-q", "--verify", l.string()}), 0);
  }
  for (const fs::path& kept : {base, backup}) {
    const TreeDiff d = tree_equal(kept, save_dir(s.series, 0));
    CHECK_MESSAGE(d.equal, kept.string() << " changed:\n" << d.report());
  }
}
