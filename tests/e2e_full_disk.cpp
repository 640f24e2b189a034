// End-to-end: delta-apply and delta-diff on a filesystem that is really full. LOCAL lives on
// a small tmpfs the test mounts itself, or on ext4 in a loop-mounted image; a
// filler file leaves a given number of bytes free, swept from none to just
// enough, so that ENOSPC lands in every phase of each kind of operation.
// After each failed run LOCAL must be byte-identical to its old version,
// recorded as such, with no journal left (a rollback needs no free space);
// once space is back the same command converges. On ext4, an apply is also
// stopped at every write step with not one block left for its rollback.
// Where the test cannot mount, it says why and skips.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <tuple>
#include <vector>

#include "e2e_util.hpp"

using namespace e2e;

namespace {

constexpr std::uint64_t kPage = 4096;

// What the small filesystem is: a tmpfs, or ext4 on a loop device, a block
// filesystem where a directory takes a block of its own, metadata needs
// blocks too and ENOSPC can surface at write, fallocate, fdatasync or close.
enum class FsKind { tmpfs, ext4 };

// A filesystem of `size` bytes mounted at `dir` for the object's lifetime.
class SmallFs {
 public:
  SmallFs(const fs::path& dir, std::uint64_t size, FsKind kind = FsKind::tmpfs) : dir_(dir), kind_(kind) {
    fs::create_directories(dir);
    if (kind == FsKind::tmpfs)
      mount_tmpfs(size);
    else
      mount_ext4(size);
  }
  ~SmallFs() {
    if (why_.empty()) unmount(dir_);
  }
  SmallFs(const SmallFs&) = delete;
  SmallFs& operator=(const SmallFs&) = delete;

  bool mounted() const { return why_.empty(); }
  const std::string& why() const { return why_; }
  std::string kind_name() const { return kind_ == FsKind::tmpfs ? "tmpfs" : "ext4"; }
  fs::path operator/(const std::string& rel) const { return dir_ / rel; }

  std::uint64_t available() const {
    struct statvfs sv {};
    REQUIRE(::statvfs(dir_.c_str(), &sv) == 0);
    return static_cast<std::uint64_t>(sv.f_bavail) * sv.f_frsize;
  }
  // Fills the filesystem but for `bytes` (whole pages). ext4 needs blocks of
  // its own for the filler's extents: fallocate stops short where it refuses,
  // and pages written one by one take the rest.
  void leave_free(std::uint64_t bytes) {
    free_all();
    const std::uint64_t avail = available();
    if (avail <= bytes) return;
    const int fd = ::open(filler().c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    REQUIRE(fd >= 0);
    std::uint64_t n = avail - bytes;
    int rc = 0;
    while ((rc = ::posix_fallocate(fd, 0, static_cast<off_t>(n))) == ENOSPC && kind_ == FsKind::ext4 && n > 64 * kPage)
      n -= 64 * kPage;
    if (kind_ == FsKind::ext4 && rc == ENOSPC) rc = 0;
    struct stat st {};
    REQUIRE(::fstat(fd, &st) == 0);
    const std::vector<char> page(kPage, 'f');
    for (off_t at = st.st_size;
         available() > bytes && ::pwrite(fd, page.data(), kPage, at) == static_cast<ssize_t>(kPage);)
      at += static_cast<off_t>(kPage);
    ::close(fd);
    REQUIRE_MESSAGE(rc == 0, "posix_fallocate on the small filesystem: " << std::strerror(rc));
  }
  void free_all() {
    fs::remove(filler());
    if (kind_ == FsKind::ext4) sync_fs();  // ext4 reuses freed blocks only once their removal commits
  }

 private:
  void mount_tmpfs(std::uint64_t size) {
    const std::string opts = "size=" + std::to_string(size) + ",mode=0755";
    if (::mount("tmpfs", dir_.c_str(), "tmpfs", 0, opts.c_str()) != 0) why_ = std::strerror(errno);
  }
  void mount_ext4(std::uint64_t size) {
    why_ = mount_loop_image(
        dir_, size, {"mkfs.ext4", "-q", "-F", "-b", "4096", "-m", "0", "-E", "lazy_itable_init=0,lazy_journal_init=0"});
  }
  void sync_fs() const {
    const int fd = ::open(dir_.c_str(), O_RDONLY | O_DIRECTORY);
    if (fd >= 0) ::syncfs(fd), ::close(fd);
  }
  fs::path filler() const { return dir_ / "filler"; }
  fs::path dir_;
  FsKind kind_;
  std::string why_;
};

// One command of delta-apply on a LOCAL that lives on the small filesystem.
struct Case {
  std::string name;
  fs::path start;               // LOCAL before the command ("" or an empty dir: none)
  fs::path old_tree, new_tree;  // the checkpoints LOCAL may hold after it
  std::string old_version, target;
  std::function<std::vector<std::string>(const fs::path& local)> args;
  // A --root pull commits each version as it goes: the versions a failed
  // run may leave LOCAL at besides the old one, with their checkpoints.
  std::map<std::string, fs::path> kept = {};
};

struct Outcome {
  int failed = 0, converged = 0;
  std::set<std::string> errors;  // what stopped the failed runs: the phases reached
};

void reset(SmallFs& small, const fs::path& local, const Case& c) {
  small.free_all();
  fs::remove_all(local);
  copy_tree(c.start, local);
}

// What a failure's message says was being written, without what varies
// from run to run (LOCAL's path, temp names, offsets).
std::string phase_of(const std::string& line, const fs::path& local) {
  std::string out;
  const std::string l = local.string();
  for (std::size_t i = 0; i < line.size();) {
    if (line.compare(i, l.size(), l) == 0) {
      out += "LOCAL", i += l.size();
    } else if (line.compare(i, 5, ".tmp-") == 0) {
      out += ".tmp-*", i += std::min<std::size_t>(13, line.size() - i);
    } else if (line.compare(i, 11, " at offset ") == 0) {
      break;
    } else {
      out += line[i++];
    }
  }
  return out;
}

json expected_state(const std::string& version) { return version.empty() ? json() : json{{"version", version}}; }

// Runs the command with `free_bytes` left; checks what it leaves, then that
// the same command converges once the space is back. Returns its exit code.
int run_with_free(SmallFs& small, const Case& c, std::uint64_t free_bytes, Outcome& o) {
  const fs::path local = small / "local";
  reset(small, local, c);
  small.leave_free(free_bytes);
  const RunResult r = apply(c.args(local));
  INFO(c.name << ", " << free_bytes << " bytes free: exit " << r.code << "\n" << r.err);
  if (r.code == 0) {
    const TreeDiff d = tree_equal(local, c.new_tree);
    CHECK_MESSAGE(d.equal, (d.equal ? "" : d.differences.front()));
    CHECK(state_json(local) == expected_state(c.target));
    CHECK_FALSE(has_txn(local));
    return 0;
  }
  ++o.failed;
  CHECK(r.code == 1);
  CHECK(contains(r.err, "No space left on device"));
  CHECK_FALSE(contains(r.err, "rolling it back failed"));
  o.errors.insert(phase_of(first_line(r.err), local));
  // Rolled back in full (or to a version the pull committed before the
  // failure), recorded as that version, no journal left.
  const std::string now = state_version(local);
  const bool kept = now != c.old_version && c.kept.count(now);
  const TreeDiff d = tree_equal(local, kept ? c.kept.at(now) : c.old_tree);
  CHECK_MESSAGE(d.equal,
                "LOCAL is not its old version after the failed run: " << (d.equal ? "" : d.differences.front()));
  CHECK(state_json(local) == expected_state(kept ? now : c.old_version));
  CHECK_FALSE(has_txn(local));
  const RunResult st = apply({"--status", local.string()});
  CHECK(st.code == (c.old_version.empty() && !kept ? 11 : 0));
  // Space back: the same command converges.
  small.free_all();
  const RunResult again = apply(c.args(local));
  CHECK_MESSAGE(again.code == 0, "re-run with space back: " << again.err);
  const TreeDiff d2 = tree_equal(local, c.new_tree);
  CHECK_MESSAGE(d2.equal, "after the re-run: " << (d2.equal ? "" : d2.differences.front()));
  CHECK(state_json(local) == expected_state(c.target));
  o.converged += again.code == 0 && d2.equal;
  return r.code;
}

// Runs one command with a given number of bytes free on the small
// filesystem; checks what it leaves and that it converges once the space is
// back. Returns its exit code.
using RunWithFree = std::function<int(SmallFs&, std::uint64_t free_bytes, Outcome&)>;

// Where a sweep runs, and how many phases (first lines of the failures'
// messages, less what varies) its failures must land in at least: more than
// one wherever the command has several writing phases a message tells apart.
struct SweepOpts {
  FsKind kind = FsKind::tmpfs;
  std::size_t phases = 2;
};

// The least free space (in pages) a command needs, found by bisection, then a
// sweep from none to that in about `points` steps, each page near the edge
// included. `size`: of the small filesystem's contents.
void sweep_free_space(const std::string& name, std::uint64_t size, const RunWithFree& run, SweepOpts opts = {},
                      int points = 24) {
  const std::unique_ptr<TempDir> t = scratch_dir();
  size = size / kPage * kPage + (1 << 20);
  // ext4's own journal, inode tables and bitmaps on top (its journal is 4 MiB on a filesystem this small).
  SmallFs small(*t / "mnt", size + (opts.kind == FsKind::ext4 ? 6 << 20 : 0), opts.kind);
  if (!small.mounted()) {
    MESSAGE("skipped " << name << ": cannot mount " << (opts.kind == FsKind::ext4 ? "ext4 on a loop device" : "a tmpfs")
                       << " (" << small.why() << "); run the tests as root");
    return;
  }
  Outcome o;
  std::uint64_t lo = 0, hi = size / kPage;  // fails with lo pages free, succeeds with hi
  {
    Outcome probe;
    REQUIRE_MESSAGE(run(small, hi * kPage, probe) == 0, name << ": fails even with the disk empty");
  }
  while (hi - lo > 1) {
    const std::uint64_t mid = (lo + hi) / 2;
    Outcome probe;
    (run(small, mid * kPage, probe) == 0 ? hi : lo) = mid;
  }
  std::set<std::uint64_t> pages{0, 1, 2, lo > 0 ? lo - 1 : 0, lo, hi};
  for (int i = 1; i < points; ++i) pages.insert(hi * i / points);
  for (const std::uint64_t p : pages) run(small, p * kPage, o);
  std::string phases;
  for (const auto& e : o.errors) phases += "\n  " + e;
  MESSAGE(name << " (" << small.kind_name() << "): needs " << hi << " pages free (" << hi * kPage << " bytes); "
               << pages.size() << " runs between none and that, " << o.failed
               << " failed with ENOSPC, cleaned up and converged " << o.converged
               << " times; failures seen at:" << phases);
  CHECK(o.failed == o.converged);
  CHECK(o.failed > 0);
  CHECK_MESSAGE(o.errors.size() >= opts.phases, name << ": the failures landed in " << o.errors.size()
                                                     << " phase(s), not at least " << opts.phases << ":" << phases);
}

void sweep(const Case& c, SweepOpts opts = {}) {
  sweep_free_space(
      c.name, tree_size(c.start) + 3 * tree_size(c.new_tree),
      [&c](SmallFs& small, std::uint64_t free_bytes, Outcome& o) { return run_with_free(small, c, free_bytes, o); },
      opts);
}

// delta-diff publishing into a ROOT on the small filesystem: a new version,
// or a squash of the versions already there.
struct PublishCase {
  std::string name;
  fs::path seed;       // ROOT's contents before the command
  fs::path reference;  // what the command publishes on a roomy disk
  std::string out;     // its name in ROOT
  std::function<std::vector<std::string>(const fs::path& root)> args;
};

// After a failed run: exit 1 with the reason, no temporary directory left,
// every published version as it was; with space back the same command
// publishes what it publishes on a roomy disk.
int publish_with_free(SmallFs& small, const PublishCase& c, std::uint64_t free_bytes, Outcome& o) {
  const fs::path root = small / "root";
  small.free_all();
  fs::remove_all(root);
  copy_tree(c.seed, root);
  const Snapshot before = snapshot(root, false);
  small.leave_free(free_bytes);
  const RunResult r = diff(c.args(root));
  INFO(c.name << ", " << free_bytes << " bytes free: exit " << r.code << "\n" << r.err);
  if (r.code == 0) {
    const TreeDiff d = tree_equal(root / c.out, c.reference);
    CHECK_MESSAGE(d.equal, (d.equal ? "" : d.differences.front()));
    return 0;
  }
  ++o.failed;
  CHECK(r.code == 1);
  CHECK(contains(r.err, "No space left on device"));
  o.errors.insert(phase_of(first_line(r.err), root));
  CHECK(list_names(root) == list_names(c.seed));  // no temporary directory left
  CHECK(snapshot_diff(before, snapshot(root, false), "ROOT before", "ROOT after").empty());
  small.free_all();
  const RunResult again = diff(c.args(root));
  CHECK_MESSAGE(again.code == 0, "re-run with space back: " << again.err);
  const TreeDiff d2 = tree_equal(root / c.out, c.reference);
  CHECK_MESSAGE(d2.equal, "after the re-run: " << (d2.equal ? "" : d2.differences.front()));
  o.converged += again.code == 0 && d2.equal;
  return r.code;
}

void sweep(const PublishCase& c, SweepOpts opts = {}) {
  sweep_free_space(
      c.name, tree_size(c.seed) + 4 * tree_size(c.reference),
      [&c](SmallFs& small, std::uint64_t free_bytes, Outcome& o) { return publish_with_free(small, c, free_bytes, o); },
      opts);
}

// Saves and deltas shared by the cases (on the usual scratch filesystem).
struct Inputs {
  std::unique_ptr<TempDir> t = scratch_dir();
  fs::path series, empty, start0, root_xor, root_auto, chain, v2_full, v3_new, st0, st1, st_start, root_struct,
      other_start;
  // A directory two levels deep that becomes a file of the same name: the
  // removal empties both directories, the rollback must bring them back.
  fs::path dir_base, dir_next, dir_start, root_dir, root_dir_auto;

  Inputs() {
    const TempDir& d = *t;
    series = gen_series(d / "series", 3, {"--max-shard-size", "600KB"});
    empty = d / "empty";
    fs::create_directories(empty);
    start0 = d / "start0";
    REQUIRE(require_init(save_dir(series, 0), start0) == "000000");
    root_xor = d / "root-xor";
    root_auto = d / "root-auto";
    chain = d / "root-chain";
    root_struct = d / "root-struct";
    for (const fs::path& r : {root_xor, root_auto, chain, root_struct}) fs::create_directories(r);
    require_diff(save_dir(series, 0), save_dir(series, 1), version_dir(root_xor, 1), "xor");
    require_diff(save_dir(series, 0), save_dir(series, 1), version_dir(root_auto, 1), "auto");
    std::tie(v2_full, v3_new) = make_full_version_chain(series, chain, d / "v3");
    // A structural delta: weight files built and swapped in, a header
    // rewritten, a weight file removed.
    st0 = d / "struct-0";
    st1 = d / "struct-1";
    write_structural_checkpoint(st0, 0);
    write_structural_checkpoint(st1, 1);
    require_diff(st0, st1, version_dir(root_struct, 1), "auto");
    st_start = d / "start-struct";
    REQUIRE(require_init(st0, st_start) == "000000");
    // LOCAL holding another model, with a stray file.
    const fs::path other = gen_series(d / "other", 0, {"--seed", "7"});
    other_start = d / "start-other";
    REQUIRE(require_init(save_dir(other, 0), other_start) == "000000");
    write_file(other_start / "stray.txt", "stray\n");
    dir_base = d / "dir-base";
    copy_tree(save_dir(series, 0), dir_base);
    write_file(dir_base / "layout" / "deep" / "readme.txt", "a directory that becomes a file\n");
    dir_next = d / "dir-next";
    copy_tree(save_dir(series, 1), dir_next);
    write_file(dir_next / "layout", "now a file\n");
    root_dir = d / "root-dir";
    root_dir_auto = d / "root-dir-auto";
    for (const fs::path& r : {root_dir, root_dir_auto}) fs::create_directories(r);
    require_diff(dir_base, dir_next, version_dir(root_dir, 1), "xor");
    require_diff(dir_base, dir_next, version_dir(root_dir_auto, 1), "auto");
    dir_start = d / "start-dir";
    REQUIRE(require_init(dir_base, dir_start) == "000000");
  }
};

Inputs& inputs() {
  static Inputs in;
  return in;
}

Case single(const std::string& name, const fs::path& delta, const std::vector<std::string>& opts) {
  const Inputs& in = inputs();
  return {name,
          in.start0,
          save_dir(in.series, 0),
          save_dir(in.series, 1),
          "000000",
          "000001",
          [delta, opts](const fs::path& local) {
            std::vector<std::string> a = opts;
            a.push_back(delta.string());
            a.push_back(local.string());
            return a;
          }};
}

}  // namespace

TEST_CASE("full disk: apply of an xor delta (journal written and flushed first)") {
  sweep(single("xor delta", version_dir(inputs().root_xor, 1), {"--threads", "1"}));
}

TEST_CASE("full disk: --no-sync one-pass apply of an auto (context) delta") {
  sweep(single("auto delta, --no-sync", version_dir(inputs().root_auto, 1), {"--no-sync", "--threads", "2"}));
}

TEST_CASE("full disk: apply of an auto (context) delta") {
  sweep(single("auto delta", version_dir(inputs().root_auto, 1), {"--threads", "2"}));
}

TEST_CASE("full disk: structural delta (build, header rewrite, remove)") {
  const Inputs& in = inputs();
  for (const bool no_sync : {false, true}) {
    Case c{no_sync ? "structural delta, --no-sync" : "structural delta",
           in.st_start,
           in.st0,
           in.st1,
           "000000",
           "000001",
           [&in, no_sync](const fs::path& local) {
             std::vector<std::string> a{version_dir(in.root_struct, 1).string(), local.string()};
             if (no_sync) a.insert(a.begin(), "--no-sync");
             return a;
           }};
    sweep(c);
  }
}

TEST_CASE("full disk: --root chain of 3 versions with a full version in the middle, synced and --no-sync") {
  const Inputs& in = inputs();
  for (const bool no_sync : {false, true})
    sweep({no_sync ? "--root chain 0 -> 3, --no-sync" : "--root chain 0 -> 3",
           in.start0,
           save_dir(in.series, 0),
           in.v3_new,
           "000000",
           "000003",
           [&in, no_sync](const fs::path& local) {
             std::vector<std::string> a{"--threads", "1", "--root", in.chain.string(), local.string()};
             if (no_sync) a.insert(a.begin(), "--no-sync");
             return a;
           },
           {{"000001", save_dir(in.series, 1)}, {"000002", in.v2_full}}});
}

TEST_CASE("full disk: --init into an empty LOCAL and over another model, synced and --no-sync") {
  const Inputs& in = inputs();
  for (const bool no_sync : {false, true}) {
    const std::string mode = no_sync ? ", --no-sync" : "";
    auto with_mode = [no_sync](std::vector<std::string> a) {
      if (no_sync) a.insert(a.begin(), "--no-sync");
      return a;
    };
    sweep({"--init into an empty LOCAL" + mode, in.empty, in.empty, save_dir(in.series, 1), "", "000000",
           [&in, with_mode](const fs::path& local) {
             return with_mode({"--init", save_dir(in.series, 1).string(), local.string()});
           }});
    sweep({"--init over another model" + mode, in.other_start, in.other_start, save_dir(in.series, 1), "000000",
           "000005", [&in, with_mode](const fs::path& local) {
             return with_mode({"--init", "--init-version", "5", save_dir(in.series, 1).string(), local.string()});
           }});
  }
}

// ext4 on a loop device: a block filesystem, where ENOSPC can come from a
// write, a fallocate, an fdatasync or a close, and a directory needs a block.
TEST_CASE("full disk: ext4, apply of a delta turning a directory into a file, journal first and --no-sync one pass") {
  const Inputs& in = inputs();
  for (const bool no_sync : {false, true}) {
    const fs::path delta = version_dir(no_sync ? in.root_dir_auto : in.root_dir, 1);
    sweep({no_sync ? "directory into a file, sparse delta, --no-sync" : "directory into a file, xor delta",
           in.dir_start, in.dir_base, in.dir_next, "000000", "000001",
           [delta, no_sync](const fs::path& local) {
             std::vector<std::string> a{"--threads", no_sync ? "2" : "1", delta.string(), local.string()};
             if (no_sync) a.insert(a.begin(), "--no-sync");
             return a;
           }},
          {FsKind::ext4});
  }
}

TEST_CASE("full disk: ext4 with not one block free, an apply stopped at any write step rolls back in full") {
  // The stop comes with the disk filled to the last block, so the rollback
  // has no space at all: it must put LOCAL back by renames and in-place
  // writes only, the directories the apply emptied included.
  const Inputs& in = inputs();
  const std::unique_ptr<TempDir> t = scratch_dir();
  SmallFs small(*t / "mnt", tree_size(in.dir_start) + 3 * tree_size(in.dir_next) + (8 << 20), FsKind::ext4);
  if (!small.mounted()) {
    MESSAGE("skipped: cannot mount ext4 on a loop device (" << small.why() << "); run the tests as root");
    return;
  }
  const fs::path local = small / "local";
  const std::vector<std::string> args{"--threads", "1", version_dir(in.root_dir, 1).string(), local.string()};
  int rolled_back = 0, emptied = 0;
  for (long step = 1;; ++step) {
    small.free_all();
    fs::remove_all(local);
    copy_tree(in.dir_start, local);
    bool gone = false;
    std::vector<std::string> argv{apply_bin()};
    argv.insert(argv.end(), args.begin(), args.end());
    const Signalled r = signal_at_step(argv, step, SIGTERM, [&] {
      gone = !fs::is_directory(local / "layout");  // set aside already: the rollback must bring it back
      small.leave_free(0);
    });
    INFO("stopped at write step " << step << " with no block free: exit " << r.code << "\n" << r.err);
    if (r.code == 0) {  // ran to the end, or stopped after its commit
      E2E_CHECK_TREE_EQUAL(local, in.dir_next);
      CHECK(state_json(local) == expected_state("000001"));
      if (!r.paused) break;
      continue;
    }
    ++rolled_back;
    emptied += gone;
    CHECK(r.code == 128 + SIGTERM);
    CHECK(contains(r.err, "rolled back"));
    CHECK_FALSE(contains(r.err, "rolling it back failed"));
    E2E_CHECK_TREE_EQUAL(local, in.dir_base);
    CHECK(state_json(local) == expected_state("000000"));
    CHECK_FALSE(has_txn(local));
    REQUIRE(step < 1000);
  }
  MESSAGE("ext4 with no block free: " << rolled_back << " applies stopped and rolled back, " << emptied
                                      << " of them with the emptied directories set aside");
  CHECK(emptied > 0);
}

TEST_CASE("full disk: delta-diff publishing a version, and --squash of a chain") {
  const Inputs& in = inputs();
  const TempDir t;
  // Roomy references, and a ROOT holding versions 1 to 3 to squash.
  const fs::path seed = t / "seed", empty = t / "empty", ref = t / "ref";
  for (const fs::path& d : {seed, empty, ref}) fs::create_directories(d);
  const std::vector<std::string> encodings{"xor", "xor", "auto"};  // xor masks compose in a scratch file
  for (int v = 1; v <= 3; ++v)
    require_diff(save_dir(in.series, v - 1), save_dir(in.series, v), version_dir(seed, v), encodings[v - 1]);
  for (const std::string enc : {"auto", "xor"}) {
    const fs::path reference = version_dir(ref / ("diff-" + enc), 1);
    fs::create_directories(reference.parent_path());
    require_diff(save_dir(in.series, 0), save_dir(in.series, 1), reference, enc);
    sweep(PublishCase{"delta-diff --encoding " + enc, empty, reference, "weight_v000001",
                      [&in, enc](const fs::path& root) {
                        return std::vector<std::string>{"-q",
                                                        "--encoding",
                                                        enc,
                                                        save_dir(in.series, 0).string(),
                                                        save_dir(in.series, 1).string(),
                                                        version_dir(root, 1).string()};
                      }});
  }
  {
    const fs::path reference = version_dir(ref / "diff-struct", 1);
    fs::create_directories(reference.parent_path());
    require_diff(in.st0, in.st1, reference, "auto");
    sweep(PublishCase{
        "delta-diff of a structural change", empty, reference, "weight_v000001", [&in](const fs::path& root) {
          return std::vector<std::string>{
              "-q", "--encoding", "auto", in.st0.string(), in.st1.string(), version_dir(root, 1).string()};
        }});
  }
  const fs::path squashed = ref / "squash";
  E2E_REQUIRE_CODE(
      diff({"-q", "--squash", version_dir(seed, 1).string(), version_dir(seed, 3).string(), squashed.string()}), 0);
  // Its scratch file is reserved whole before anything else is written, so
  // nearly every shortage shows there: one phase is all a sweep can expect.
  sweep(PublishCase{"--squash of versions 1 to 3", seed, squashed, "catchup",
                    [](const fs::path& root) {
                      return std::vector<std::string>{"-q", "--squash", version_dir(root, 1).string(),
                                                      version_dir(root, 3).string(), (root / "catchup").string()};
                    }},
        {FsKind::tmpfs, 1});
}
