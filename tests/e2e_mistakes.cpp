// End-to-end: operator mistakes (swapped or mistyped paths, a save still being
// written, a share not mounted). Each is refused before anything is created or
// changed anywhere, or, for delta-diff's doubts about a valid delta, warned about.
#include <doctest/doctest.h>

#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <iterator>

#include "e2e_util.hpp"
#include "hfdelta/error.hpp"
#include "hfdelta/publisher.hpp"

using namespace e2e;

namespace {

#define CHECK_ERR_MENTIONS(res, text) \
  CHECK_MESSAGE(contains((res).err, (text)), "stderr should mention \"" << (text) << "\"\n" << (res).describe())

// Everything below a directory: every path (directories, and the lock file
// that snapshot() leaves out, included) and every file's bytes. Taken of a
// test's whole temporary directory, it shows that a command created, removed
// or changed nothing anywhere.
struct Tree {
  fs::path dir;
  std::vector<std::string> paths;
  Snapshot files;
  explicit Tree(const fs::path& d) : dir(d), files(snapshot(d, true)) {
    for (auto it = fs::recursive_directory_iterator(d); it != fs::recursive_directory_iterator(); ++it)
      paths.push_back(fs::relative(it->path(), d).generic_string());
    std::sort(paths.begin(), paths.end());
  }
  // Differences from the tree as it is now, one a line (empty: none).
  std::string changes() const {
    const Tree now(dir);
    std::string out;
    std::vector<std::string> d;
    std::set_symmetric_difference(paths.begin(), paths.end(), now.paths.begin(), now.paths.end(),
                                  std::back_inserter(d));
    for (const auto& p : d) out += p + ": created or removed\n";
    for (const auto& line : snapshot_diff(files, now.files, "before", "after")) out += line + "\n";
    return out;
  }
};

#define CHECK_NOTHING_CHANGED(tree)              \
  do {                                           \
    const std::string e2e_c_ = (tree).changes(); \
    CHECK_MESSAGE(e2e_c_.empty(), e2e_c_);       \
  } while (0)

// Saves 0 to 2, delta 1 published under ROOT, LOCAL initialised from save 0.
struct Setup {
  TempDir t;
  fs::path series, root, local;
  Setup() {
    series = gen_series(t / "series", 2);
    root = t / "root";
    local = t / "local";
    fs::create_directories(root);
    E2E_REQUIRE_CODE(diff({"-q", save(0).string(), save(1).string(), delta().string()}), 0);
    E2E_REQUIRE_CODE(apply({"-q", "--init", save(0).string(), local.string()}), 0);
  }
  fs::path save(int i) const { return save_dir(series, i); }
  fs::path delta() const { return version_dir(root, 1); }
};

}  // namespace

// ---- --init deletes only what it owns ---------------------------------------------

TEST_CASE(
    "mistakes: --init into a non-empty directory that is not a LOCAL: exit 7, nothing touched; --force replaces it") {
  Setup s;
  // A trainer's checkpoint with a file of its own, and a directory of other models.
  const fs::path trainer = s.t / "trainer", models = s.t / "models";
  copy_tree(s.save(1), trainer);
  write_file(trainer / "optimizer.pt", "optimizer state");
  write_file(models / "a" / "model.safetensors", "model a");
  write_file(models / "b" / "config.json", "{}");

  std::vector<std::string> args;
  fs::path victim;
  int code = 7;
  std::string mention = "--force";
  SUBCASE("--init LOCAL SRC, swapped: named as swapped, not answered with --force") {
    args = {"--init", s.local.string(), trainer.string()}, victim = trainer, code = 3, mention = "swapped";
  }
  SUBCASE("--init SRC into a directory of other models") {
    args = {"--init", s.save(0).string(), models.string()}, victim = models;
  }
  const Tree before(s.t.path());
  const RunResult r = apply(args);
  E2E_CHECK_CODE(r, code);
  CHECK_ERR_MENTIONS(r, victim.string());
  CHECK_ERR_MENTIONS(r, mention);
  if (code == 3) {
    CHECK_ERR_MENTIONS(r, s.local.string());
    CHECK_MESSAGE(!contains(r.err, "--force"), r.describe());
  }
  CHECK_NOTHING_CHANGED(before);

  // Asked for explicitly, it is replaced.
  args.insert(args.begin(), "--force");
  E2E_CHECK_CODE(apply(args), 0);
  CHECK(fs::exists(victim / ".weight_sync" / "state.json"));
  CHECK_FALSE(fs::exists(victim / "optimizer.pt"));

  // An empty directory, or one holding only hfdelta's state (a first --init
  // rolled back), needs no --force.
  const fs::path fresh = s.t / "fresh", stateonly = s.t / "state-only";
  fs::create_directories(fresh);
  write_file(stateonly / ".weight_sync" / "lock", "");
  for (const auto& dir : {fresh, stateonly}) {
    E2E_CHECK_CODE(apply({"-q", "--init", s.save(0).string(), dir.string()}), 0);
    E2E_CHECK_TREE_EQUAL(dir, s.save(0));
  }
}

TEST_CASE("mistakes: --init from an SRC that cannot be copied into LOCAL: exit 3, nothing created or changed") {
  Setup s;
  const fs::path empty = s.t / "unmounted", partial = s.t / "partial", fresh = s.t / "new-host" / "model";
  fs::create_directories(empty);
  write_file(partial / "config.json", read_file(s.save(1) / "config.json"));
  copy_tree(s.save(0), s.local / "sub");  // a checkpoint inside LOCAL (extra files of LOCAL's)

  std::vector<std::string> args;
  std::string mention;
  SUBCASE("an empty SRC (a share not mounted) over LOCAL") {
    args = {"--init", empty.string(), s.local.string()}, mention = "no weight files";
  }
  SUBCASE("an SRC with no weight files (a save being written) into a new LOCAL") {
    args = {"--init", partial.string(), fresh.string()}, mention = "no weight files";
  }
  SUBCASE("a delta version as SRC into a new LOCAL") {
    args = {"--init", s.delta().string(), fresh.string()}, mention = "delta version";
  }
  SUBCASE("SRC is LOCAL") {
    args = {"--init", s.local.string(), (s.t / "." / "local").string()}, mention = "same directory";
  }
  SUBCASE("SRC inside LOCAL") {
    args = {"--init", (s.local / "sub").string(), s.local.string()}, mention = "inside LOCAL";
  }
  SUBCASE("LOCAL inside SRC, not there yet") {
    args = {"--init", s.save(0).string(), (s.save(0) / "copy").string()}, mention = "inside SRC";
  }
  const Tree before(s.t.path());
  const RunResult r = apply(args);
  E2E_CHECK_CODE(r, 3);
  CHECK_ERR_MENTIONS(r, mention);
  CHECK_NOTHING_CHANGED(before);
}

// ---- delta-diff refuses what cannot be a checkpoint, and doubts what looks wrong --------

TEST_CASE(
    "mistakes: delta-diff of a NEW without weight files or of a delta version: exit 3 naming it, nothing published") {
  Setup s;
  const fs::path partial = s.t / "step_0200", out = version_dir(s.root, 2);
  write_file(partial / "config.json", read_file(s.save(1) / "config.json"));
  fs::path base = s.save(1), next = partial, named = partial;
  SUBCASE("NEW without weight files (a save still being written)") {}
  SUBCASE("NEW empty") { fs::remove_all(partial), fs::create_directories(partial); }
  SUBCASE("a delta version as BASE") { base = s.delta(), next = s.save(1), named = s.delta(); }
  SUBCASE("a delta version as NEW") { base = s.save(0), next = s.delta(), named = s.delta(); }
  const Tree before(s.t.path());
  const RunResult r = diff({base.string(), next.string(), out.string()});
  E2E_CHECK_CODE(r, 3);
  CHECK_ERR_MENTIONS(r, named.string());
  CHECK_NOTHING_CHANGED(before);
}

TEST_CASE("mistakes: delta-diff warns when most elements changed or the delta outweighs NEW's weights, and publishes") {
  Setup s;
  // None for an ordinary step, nor from --inspect or --squash.
  const RunResult d = diff({"-q", s.save(1).string(), s.save(2).string(), version_dir(s.root, 2).string()});
  E2E_CHECK_CODE(d, 0);
  CHECK_MESSAGE(d.err.empty(), d.describe());
  const RunResult i = diff({"-q", "--inspect", version_dir(s.root, 2).string()});
  E2E_CHECK_CODE(i, 0);
  CHECK_MESSAGE(i.err.empty(), i.describe());
  const RunResult q =
      diff({"-q", "--squash", s.delta().string(), version_dir(s.root, 2).string(), (s.t / "squashed").string()});
  E2E_CHECK_CODE(q, 0);
  CHECK_MESSAGE(q.err.empty(), q.describe());

  const fs::path out = s.t / "out" / "weight_v000003";
  fs::create_directories(out.parent_path());
  fs::path base, next;
  std::string mention;
  SUBCASE("another model as NEW: more than half of the elements changed") {
    base = s.save(1), next = gen_series(s.t / "other", 0, {"--seed", "7"}) / "save_000", mention = "more than half";
  }
  SUBCASE("a delta larger than NEW's weights (a large file changed beside small weights)") {
    base = s.t / "a", next = s.t / "b";
    const Bytes w(64, 1);
    write_safetensors(base / "model.safetensors", {{"w", "U8", {64}, w}});
    write_safetensors(next / "model.safetensors", {{"w", "U8", {64}, w}});
    std::string big;
    for (int k = 0; k < 20000; ++k) big += std::to_string(k * 2654435761u);
    write_file(base / "tokenizer.json", "{}");
    write_file(next / "tokenizer.json", big);
    mention = "larger than NEW's weights";
  }
  const RunResult r = diff({"-q", base.string(), next.string(), out.string()});
  E2E_CHECK_CODE(r, 0);
  CHECK_ERR_MENTIONS(r, "delta-diff: warning: " + out.string());
  CHECK_ERR_MENTIONS(r, mention);
  CHECK(fs::is_directory(out));
}

// ---- nothing is created before the arguments are checked ---------------------------

TEST_CASE(
    "mistakes: swapped paths (a version or root where LOCAL belongs, a LOCAL where DELTA or ROOT belongs): exit 3") {
  Setup s;
  const fs::path other = s.t / "other-local";
  E2E_REQUIRE_CODE(apply({"-q", "--init", s.save(0).string(), other.string()}), 0);
  std::vector<std::string> args;
  SUBCASE("delta-apply LOCAL DELTA") { args = {s.local.string(), s.delta().string()}; }
  SUBCASE("delta-apply --root LOCAL ROOT") { args = {"--root", s.local.string(), s.root.string()}; }
  SUBCASE("delta-apply --root ROOT DELTA") { args = {"--root", s.root.string(), s.delta().string()}; }
  SUBCASE("delta-apply LOCAL LOCAL") { args = {other.string(), s.local.string()}; }
  SUBCASE("delta-apply --init SRC ROOT --force") { args = {"--init", "--force", s.save(0).string(), s.root.string()}; }
  SUBCASE("delta-apply --status DELTA") { args = {"--status", s.delta().string()}; }
  SUBCASE("delta-apply --verify ROOT") { args = {"--verify", s.root.string()}; }
  const Tree before(s.t.path());
  const RunResult r = apply(args);
  E2E_CHECK_CODE(r, 3);
  CHECK_ERR_MENTIONS(r, "swapped");
  CHECK_NOTHING_CHANGED(before);
}

TEST_CASE(
    "mistakes: a LOCAL that does not exist is refused by every form but --init, pointing to --init, creating nothing") {
  Setup s;
  const fs::path typo = s.t / "loacl" / "model";
  std::vector<std::string> args;
  int code = 0;
  SUBCASE("apply") { args = {s.delta().string(), typo.string()}, code = 4; }
  SUBCASE("--root") { args = {"--root", s.root.string(), typo.string()}, code = 4; }
  SUBCASE("--status") { args = {"--status", typo.string()}, code = 11; }
  SUBCASE("--verify") { args = {"--verify", typo.string()}, code = 11; }
  SUBCASE("--recover") { args = {"--recover", typo.string()}, code = 11; }
  const Tree before(s.t.path());
  const RunResult r = apply(args);
  E2E_CHECK_CODE(r, code);
  CHECK_ERR_MENTIONS(r, "delta-apply --init SRC " + typo.string());
  CHECK_NOTHING_CHANGED(before);
}

TEST_CASE("mistakes: --status, --verify and --recover on a directory never initialised create no .weight_sync") {
  Setup s;
  const fs::path plain = s.t / "plain";
  copy_tree(s.save(0), plain);
  std::vector<std::string> args;
  int code = 0;
  SUBCASE("--status") { args = {"--status", plain.string()}, code = 11; }
  SUBCASE("--verify") { args = {"--verify", plain.string()}, code = 11; }
  SUBCASE("--recover") { args = {"--recover", plain.string()}, code = 0; }
  const Tree before(s.t.path());
  E2E_CHECK_CODE(apply(args), code);
  CHECK_NOTHING_CHANGED(before);
}

namespace {

// `dir` and every entry below it as `ls -laR --full-time` shows them: type and
// mode, size, mtime to the nanosecond. Whatever a run creates, removes or
// writes there (even a .weight_sync/ made and removed again: the directory's
// mtime moves) changes it.
std::map<std::string, std::string> listing(const fs::path& dir) {
  std::map<std::string, std::string> out;
  const auto add = [&](const fs::path& p, const std::string& rel) {
    struct stat st {};
    REQUIRE(::lstat(p.c_str(), &st) == 0);
    char mtime[48];
    std::snprintf(mtime, sizeof mtime, "%lld.%09ld", static_cast<long long>(st.st_mtim.tv_sec), st.st_mtim.tv_nsec);
    out[rel] = "mode " + std::to_string(st.st_mode) + ", " + std::to_string(st.st_size) + " bytes, mtime " + mtime;
  };
  add(dir, ".");
  for (fs::recursive_directory_iterator it(dir), end; it != end; ++it)
    add(it->path(), fs::relative(it->path(), dir).generic_string());
  return out;
}

std::string listing_changes(const std::map<std::string, std::string>& before,
                            const std::map<std::string, std::string>& after) {
  std::string out;
  for (const auto& [rel, was] : before) {
    const auto it = after.find(rel);
    if (it == after.end())
      out += rel + ": removed\n";
    else if (it->second != was)
      out += rel + ": " + was + " -> " + it->second + "\n";
  }
  for (const auto& [rel, now] : after)
    if (!before.count(rel)) out += rel + ": created (" + now + ")\n";
  return out;
}

}  // namespace

TEST_CASE(
    "mistakes: a training save given as LOCAL: every form that refuses it, or has nothing to do, creates nothing") {
  Setup s;
  // A trainer's save: a checkpoint with files of its own, no .weight_sync/.
  const fs::path save = s.t / "trainer" / "step_0200";
  copy_tree(s.save(1), save);
  write_file(save / "optimizer.pt", "optimizer state");
  const fs::path empty_root = s.t / "empty-root", reports = s.t / "reports";
  fs::create_directories(empty_root);
  fs::create_directories(reports);
  // A leader of an engine across hosts, at version 1, reporting into DIR.
  E2E_REQUIRE_CODE(
      apply({"-q", "--root", s.root.string(), "--report-to", reports.string(), "--host", "leader", s.local.string()}),
      0);

  std::vector<std::string> args;
  int code = 4;
  std::string mention = "--init";
  const std::string R = s.root.string(), S = save.string();
  SUBCASE("a delta") { args = {s.delta().string(), S}; }
  SUBCASE("--root: no full version to start from") { args = {"--root", R, S}; }
  SUBCASE("--root --target of a version not published") { args = {"--root", R, "--target", "9", S}, mention = "9"; }
  SUBCASE("--root with nothing published yet (exit 0)") {
    args = {"--root", empty_root.string(), S}, code = 0, mention = "";
  }
  SUBCASE("--root --report-to") { args = {"--root", R, "--report-to", reports.string(), "--host", "h", S}; }
  SUBCASE("--root --report-to --follow") {
    args = {"--root", R, "--report-to", reports.string(), "--host", "h", "--follow", "leader", S};
  }
  SUBCASE("--root --then") { args = {"--root", R, "--then", "true", S}; }
  SUBCASE("--root --metrics") { args = {"--root", R, "--metrics", (s.t / "pull.prom").string(), S}; }
  SUBCASE("--init without --force") { args = {"--init", s.save(0).string(), S}, code = 7, mention = "--force"; }
  SUBCASE("--status") { args = {"--status", S}, code = 11, mention = ""; }
  SUBCASE("--verify") { args = {"--verify", S}, code = 11, mention = ""; }
  SUBCASE("--recover") { args = {"--recover", S}, code = 0, mention = ""; }
  // A form that would write (a full version copied over it, --init --force)
  // still refuses a link in it before anything is created.
  SUBCASE("a symlink in it: a full version pulled, copied by hand, --init --force") {
    fs::create_symlink("optimizer.pt", save / "latest");
    const fs::path full_root = s.t / "full-root";
    fs::create_directories(full_root);
    E2E_REQUIRE_CODE(diff({"-q", "--full", s.save(0).string(), s.save(1).string(), full_root.string()}), 0);
    code = 3, mention = "symlink";
    const fs::path full = version_dir(full_root, 1);
    for (const auto& a : std::vector<std::vector<std::string>>{
             {"--root", full_root.string(), S}, {full.string(), S}, {"--init", "--force", s.save(0).string(), S}}) {
      const auto before = listing(save);
      const RunResult r = apply(a);
      E2E_CHECK_CODE(r, code);
      CHECK_ERR_MENTIONS(r, mention);
      CHECK_MESSAGE(listing_changes(before, listing(save)).empty(), listing_changes(before, listing(save)));
    }
    args = {"--root", full_root.string(), S};
  }
  const auto before = listing(save);
  const Tree tree(save);
  const RunResult r = apply(args);
  E2E_CHECK_CODE(r, code);
  if (!mention.empty()) CHECK_ERR_MENTIONS(r, mention);
  const std::string changes = listing_changes(before, listing(save));
  CHECK_MESSAGE(changes.empty(), changes << r.describe());
  CHECK_NOTHING_CHANGED(tree);
  CHECK_FALSE(fs::exists(save / ".weight_sync"));
}

// ---- --init repairs the checksum record -----------------------------------------------

TEST_CASE("mistakes: --init rewrites a missing or damaged checksum record when LOCAL's bytes already match") {
  Setup s;
  const fs::path record = s.local / ".weight_sync" / "checksums" / "000000.json";
  REQUIRE(fs::exists(record));
  int verify_code = 0;
  SUBCASE("missing") { fs::remove(record), verify_code = 3; }
  SUBCASE("not JSON") { write_file(record, "garbage"), verify_code = 3; }
  SUBCASE("a wrong checksum") {
    json j = read_json(record);
    j["files"]["config.json"]["hash"] = std::string(32, '0');
    write_json(record, j);
    verify_code = 12;
  }
  const RunResult v = apply({"--verify", s.local.string()});
  E2E_CHECK_CODE(v, verify_code);
  if (verify_code == 3) CHECK_ERR_MENTIONS(v, "--init");

  const Snapshot files = snapshot(s.local, false);
  const RunResult r = apply({"--json", "--init", s.save(0).string(), s.local.string()});
  E2E_REQUIRE_CODE(r, 0);
  const json j = parse_json(r.out);
  CHECK(j["noop"] == false);
  CHECK(j["record_rewritten"] == true);
  CHECK(j["files_written"] == 0);
  CHECK(snapshot(s.local, false) == files);
  E2E_CHECK_CODE(apply({"--verify", s.local.string()}), 0);

  const RunResult again = apply({"--init", s.save(0).string(), s.local.string()});
  E2E_CHECK_CODE(again, 0);
  CHECK_MESSAGE(contains(again.out, "already at version 000000"), again.describe());
}

// ---- a publication root inside a checkpoint, or a root not created yet -------------------

TEST_CASE("mistakes: a root or OUT inside BASE or NEW is refused (exit 3, naming both), for the delta and --full") {
  Setup s;
  // Copies, so that a root inside them can be shown to be refused.
  const fs::path base = s.t / "base", next = s.t / "new";
  copy_tree(s.save(1), base);
  copy_tree(s.save(2), next);
  std::vector<std::string> args;
  fs::path out, inside;
  std::string role = "NEW";
  SUBCASE("BASE NEW NEW/weights, not there yet") { out = next / "weights", inside = next; }
  SUBCASE("BASE NEW NEW/weights, created empty") {
    out = next / "weights", inside = next;
    fs::create_directories(out);
  }
  SUBCASE("BASE NEW NEW/weights/weight_v000001") {
    fs::create_directories(next / "weights");
    out = next / "weights" / "weight_v000001", inside = next;
  }
  SUBCASE("BASE NEW BASE/weights") {
    out = base / "weights", inside = base, role = "BASE";
    fs::create_directories(out);
  }
  SUBCASE("--full NEW NEW/weights") {
    out = next / "weights", inside = next, args = {"--full"};
    fs::create_directories(out);
  }
  SUBCASE("--full BASE NEW NEW/weights") {
    out = next / "weights", inside = next, args = {"--full", base.string()};
    fs::create_directories(out);
  }
  SUBCASE("--full BASE NEW BASE/sub/weights") {
    out = base / "sub" / "weights", inside = base, role = "BASE", args = {"--full", base.string()};
    fs::create_directories(out);
  }
  if (args.empty() || args.front() != "--full") args.push_back(base.string());
  args.push_back(next.string());
  args.push_back(out.string());
  const Tree before(s.t.path());
  const RunResult r = diff(args);
  E2E_CHECK_CODE(r, 3);
  CHECK_ERR_MENTIONS(r, out.string());
  CHECK_ERR_MENTIONS(r, "inside " + role + " " + inside.string());
  CHECK_NOTHING_CHANGED(before);
}

TEST_CASE(
    "mistakes: a ROOT that does not exist yet: every form that publishes says to create the root first (exit 2)") {
  Setup s;
  const fs::path missing = s.t / "weights";
  std::vector<std::string> args;
  std::string hint = "create the publication root first (mkdir -p " + missing.string() + ")";
  SUBCASE("BASE NEW ROOT") { args = {s.save(1).string(), s.save(2).string(), missing.string()}; }
  SUBCASE("--full NEW ROOT") { args = {"--full", s.save(2).string(), missing.string()}; }
  SUBCASE("--full BASE NEW ROOT") { args = {"--full", s.save(1).string(), s.save(2).string(), missing.string()}; }
  SUBCASE("BASE NEW ROOT/weight_v000001") {
    args = {s.save(1).string(), s.save(2).string(), (missing / "weight_v000001").string()};
  }
  SUBCASE("--prune ROOT: nothing to create, the share may not be mounted") {
    args = {"--prune", missing.string()}, hint = "is the share mounted?";
  }
  const Tree before(s.t.path());
  const RunResult r = diff(args);
  E2E_CHECK_CODE(r, 2);
  CHECK_ERR_MENTIONS(r, missing.string() + ": does not exist");
  CHECK_ERR_MENTIONS(r, hint);
  CHECK_NOTHING_CHANGED(before);
}

// ---- the Publisher refuses what the commands refuse, before it creates anything --------------

namespace {

// MemoryPublisher(root, mirror) opened and closed; the code and message of
// what it raised (code -1: it opened).
std::pair<int, std::string> open_publisher(const fs::path& root, const fs::path& mirror) {
  hfdelta::PublisherOptions o;
  o.sync = false;
  o.background = false;
  o.lock_timeout = 5;
  try {
    hfdelta::MemoryPublisher p(root, mirror, o);
  } catch (const hfdelta::Error& e) {
    return {static_cast<int>(e.code()), e.what()};
  }
  return {-1, ""};
}

}  // namespace

TEST_CASE("mistakes: Publisher(root, mirror) with wrong paths is refused before anything is created in either") {
  Setup s;
  const fs::path empty_root = s.t / "empty-root", mirror = s.t / "mirror";
  fs::create_directories(empty_root);
  require_init(s.save(0), mirror);
  fs::path root, mir;
  int code = 3;
  std::vector<std::string> mentions;
  SUBCASE("swapped, the root still empty (would create ROOT/.weight_sync/, stranding every host)") {
    root = mirror, mir = empty_root, mentions = {mirror.string(), "swapped"};
  }
  SUBCASE("swapped, the root publishing versions") {
    root = mirror, mir = s.root, mentions = {mirror.string(), "swapped"};
  }
  SUBCASE("a host's LOCAL as the root (would publish weight_v000001 into it)") {
    root = s.local, mir = mirror, mentions = {s.local.string(), "swapped"};
  }
  SUBCASE("the mirror as the root too") { root = mirror, mir = mirror, mentions = {mirror.string()}; }
  SUBCASE("a root inside the mirror") {
    fs::create_directories(mirror / "weights");
    root = mirror / "weights", mir = mirror,
    mentions = {(mirror / "weights").string(), "inside mirror " + mirror.string()};
  }
  SUBCASE("the mirror inside the root") {
    const fs::path inner = empty_root / "mirror";
    require_init(s.save(0), inner);
    root = empty_root, mir = inner, mentions = {inner.string(), "inside ROOT " + empty_root.string()};
  }
  SUBCASE("a mirror never initialised (would create MIRROR/.weight_sync/)") {
    const fs::path plain = s.t / "plain";
    copy_tree(s.save(0), plain);
    root = empty_root, mir = plain, code = 11,
    mentions = {plain.string(), "delta-apply --init CHECKPOINT " + plain.string()};
  }
  SUBCASE("a root that does not exist") {
    root = s.t / "typo", mir = mirror, code = 2, mentions = {"create the publication root first"};
  }
  const Tree before(s.t.path());
  // Not a structured binding: doctest's CHECK_MESSAGE captures them in a lambda (clang 14 refuses that).
  const auto opened = open_publisher(root, mir);
  const int got = opened.first;
  const std::string& message = opened.second;
  CHECK_MESSAGE(got == code, "Publisher(" << root << ", " << mir << "): " << (got < 0 ? "opened" : message));
  for (const auto& m : mentions) CHECK_MESSAGE(contains(message, m), message << "\nshould mention \"" << m << "\"");
  CHECK_NOTHING_CHANGED(before);
  // Every host still pulls from the root.
  const fs::path host = s.t / "host";
  require_init(s.save(0), host);
  E2E_CHECK_CODE(apply({"-q", "--root", s.root.string(), host.string()}), 0);
}

TEST_CASE("mistakes: a publisher overtaken by another is told so on its first call, and reopening it catches up") {
  Setup s;
  const fs::path root = s.t / "shared", m1 = s.t / "mirror-1", m2 = s.t / "mirror-2";
  fs::create_directories(root);
  require_init(s.save(0), m1);
  require_init(s.save(0), m2);
  hfdelta::PublisherOptions o;
  o.sync = false;
  o.background = false;
  auto p2 = std::make_unique<hfdelta::MemoryPublisher>(root, m2, o);
  {
    hfdelta::MemoryPublisher p1(root, m1, o);
    p1.publish(true);  // version 1, every tensor unchanged
  }
  REQUIRE(fs::is_directory(version_dir(root, 1)));
  const Tree before(s.t.path());
  for (int call = 0; call < 2; ++call) {
    std::string message;
    try {
      call == 0 ? (void)p2->publish(true) : p2->begin();
    } catch (const hfdelta::Error& e) {
      CHECK(e.code() == hfdelta::Exit::exists);
      message = e.what();
    }
    INFO("call " << call << ": " << message);
    CHECK(contains(message, "published by another publisher"));
    CHECK(contains(message, "open it again"));
    CHECK(contains(message, m2.string()));
  }
  CHECK_NOTHING_CHANGED(before);
  p2.reset();
  hfdelta::MemoryPublisher again(root, m2, o);
  CHECK(again.opening().caught_up == std::vector<std::uint64_t>{1});
  CHECK(again.version() == 1);
  CHECK(again.publish(true).diff.version == 2);
}

// ---- numbers, help and the order of options --------------------------------------------

TEST_CASE("mistakes: a negative number is a usage error (exit 2), never wrapped") {
  Setup s;
  const fs::path fresh = s.t / "fresh";
  std::vector<std::string> args;
  bool of_diff = false;
  SUBCASE("--target -1") { args = {"--root", s.root.string(), "--target", "-1", s.local.string()}; }
  SUBCASE("--init-version -1") { args = {"--init", "--init-version", "-1", s.save(0).string(), fresh.string()}; }
  SUBCASE("--lock-timeout -1") { args = {"--lock-timeout", "-1", "--root", s.root.string(), s.local.string()}; }
  SUBCASE("--threads -1") { args = {"--threads", "-1", "--root", s.root.string(), s.local.string()}; }
  SUBCASE("--keep-from -1") { args = {"--prune", s.root.string(), "--keep-from", "-1"}, of_diff = true; }
  SUBCASE("--delta-version -1") {
    args = {"--delta-version", "-1", s.save(1).string(), s.save(2).string(), (s.t / "d").string()}, of_diff = true;
  }
  SUBCASE("--base-version -1") {
    args = {"--base-version", "-1", s.save(1).string(), s.save(2).string(), version_dir(s.root, 2).string()};
    of_diff = true;
  }
  const Tree before(s.t.path());
  const RunResult r = of_diff ? diff(args) : apply(args);
  E2E_CHECK_CODE(r, 2);
  CHECK_ERR_MENTIONS(r, "-1");
  CHECK_NOTHING_CHANGED(before);
}

TEST_CASE("mistakes: zero-padded numbers are decimal, as versions are written (000010 is ten, not octal)") {
  Setup s;
  const fs::path fresh = s.t / "fresh", out = s.t / "out" / "weight_v000010";
  fs::create_directories(out.parent_path());
  E2E_CHECK_CODE(apply({"-q", "--init", "--init-version", "000010", s.save(0).string(), fresh.string()}), 0);
  CHECK(state_version(fresh) == "000010");
  E2E_CHECK_CODE(diff({"-q", "--delta-version", "000010", "--base-version", "09", s.save(1).string(),
                       s.save(2).string(), out.string()}),
                 0);
  CHECK(delta_index(out)["metadata"]["base_version"] == "000009");
}

TEST_CASE("mistakes: -h with --json prints one JSON object holding the help") {
  for (const bool of_diff : {true, false}) {
    for (const std::vector<std::string>& args : {std::vector<std::string>{"-h", "--json"}, {"--json", "--help"}}) {
      const RunResult r = of_diff ? diff(args) : apply(args);
      E2E_CHECK_CODE(r, 0);
      json j;
      CHECK_NOTHROW(j = parse_json(r.out));
      CHECK_MESSAGE(j.value("ok", false), r.describe());
      CHECK(j.value("schema", 0) == 1);
      CHECK(contains(j.value("help", ""), "Usage:"));
    }
  }
}

TEST_CASE("mistakes: every form takes its options in any order, its path after them too") {
  Setup s;
  const std::string delta = s.delta().string(), root = s.root.string();
  const Tree before(s.t.path());
  std::vector<std::vector<std::string>> same;  // command lines that must print the same
  std::string what;
  SUBCASE("--inspect --json DELTA") {
    what = "json",
    same = {{"--inspect", delta, "--json"}, {"--json", "--inspect", delta}, {"--inspect", "--json", delta}};
  }
  SUBCASE("--inspect -q DELTA") { what = "quiet", same = {{"--inspect", delta, "-q"}, {"--inspect", "-q", delta}}; }
  SUBCASE("--prune --dry-run ROOT") {
    what = "text",
    same = {{"--prune", root, "--dry-run"}, {"--prune", "--dry-run", root}, {"--dry-run", "--prune", root}};
  }
  SUBCASE("--prune --keep-from N --dry-run ROOT") {
    what = "text",
    same = {{"--prune", root, "--keep-from", "1", "--dry-run"}, {"--prune", "--keep-from", "1", "--dry-run", root}};
  }
  SUBCASE("--prune --json --dry-run ROOT") {
    what = "json", same = {{"--prune", root, "--json", "--dry-run"}, {"--prune", "--json", "--dry-run", root}};
  }
  std::vector<RunResult> runs;
  for (const auto& args : same) runs.push_back(diff(args));
  for (const auto& r : runs) {
    E2E_CHECK_CODE(r, 0);
    CHECK_MESSAGE(r.out == runs.front().out, r.describe() << "\nvs\n" << runs.front().describe());
    if (what == "json") CHECK_NOTHROW(parse_json(r.out));
    if (what == "quiet") CHECK(r.out.empty());
  }
  CHECK_NOTHING_CHANGED(before);

  // The path is still one: a second one is refused.
  const RunResult extra = diff({"--inspect", "--json", delta, root});
  E2E_CHECK_CODE(extra, 2);
  CHECK_ERR_MENTIONS(extra, "unexpected argument \"" + root + "\"");
  E2E_CHECK_CODE(diff({"--prune", "--dry-run"}), 2);
}

TEST_CASE("mistakes: delta-apply --root takes ROOT after other options too") {
  Setup s;
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"--root", "--json", s.root.string(), s.local.string()},
        {"--root", "-q", "--target", "1", s.root.string(), s.local.string()}}) {
    const fs::path host = s.t / "host";
    fs::remove_all(host);
    require_init(s.save(0), host);
    std::vector<std::string> a = args;
    a.back() = host.string();
    const RunResult r = apply(a);
    E2E_CHECK_CODE(r, 0);
    CHECK(state_version(host) == "000001");
  }
  const RunResult missing = apply({"--root", "--json", s.local.string()});
  E2E_CHECK_CODE(missing, 2);
  CHECK_ERR_MENTIONS(missing, "--root ROOT LOCAL");
}

TEST_CASE("mistakes: an option of another form is refused (exit 2), naming the forms that take it and this one") {
  TempDir t;
  const std::string local = (t / "local").string(), root = (t / "root").string();
  struct Case {
    RunResult r;
    std::string takes, not_this;
  };
  const std::vector<Case> cases{
      {apply({"--status", "--target", "1", local}), "delta-apply --root ROOT LOCAL", "delta-apply --status LOCAL"},
      {apply({"--recover", "--then", "true", local}), "delta-apply DELTA LOCAL", "delta-apply --recover LOCAL"},
      {diff({"--prune", root, "--level", "3"}), "delta-diff BASE NEW OUT", "delta-diff --prune ROOT"},
      {diff({"--squash-base", root, "a", "b", "c"}), "delta-diff --squash FIRST LAST OUT", "delta-diff BASE NEW OUT"},
  };
  for (const Case& c : cases) {
    E2E_CHECK_CODE(c.r, 2);
    CHECK_ERR_MENTIONS(c.r, "only " + c.takes);
    CHECK_ERR_MENTIONS(c.r, "not " + c.not_this);
  }
  // --help's usage line of each form lists exactly what the form takes.
  const RunResult help = apply({"--help"});
  CHECK(help.out.find("  delta-apply --status [OPTIONS] LOCAL\n") != std::string::npos);
  CHECK(help.out.find("  delta-apply --init [--init-version N] [--force] [--then CMD] [--metrics FILE] [OPTIONS] SRC "
                      "LOCAL\n") != std::string::npos);
}
