// End-to-end: SIGINT, SIGTERM and SIGHUP, and what killed runs leave.
// HFDELTA_FAULT_MODE=pause stops a process (SIGSTOP) at write step N; the
// test sends it a signal there and continues it, for every N. delta-apply
// must roll back and exit 128 + signal with a message (or finish, if the
// signal came after its commit); delta-diff and --squash must remove their
// temporary directory. A run waiting for the lock stops too. The --then
// command starts with no signal blocked. Temporary files of killed runs are
// removed: delta-apply's own by the next apply, publications' by --prune
// once they are old enough.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <ctime>
#include <functional>
#include <string>
#include <vector>

#include <boost/filesystem/operations.hpp>

#include "e2e_util.hpp"

using namespace e2e;

namespace {

constexpr int kSignals[] = {SIGTERM, SIGINT, SIGHUP};

std::string signame(int sig) { return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "SIGHUP"; }

// Runs argv paused at write step `step`, sends it there one of the three
// signals (in turn by step), continues it and waits for it to exit.
Signalled signal_in_turn(const std::vector<std::string>& argv, int step) {
  const Signalled s = signal_at_step(argv, step, kSignals[step % 3]);
  if (!s.paused)
    REQUIRE_MESSAGE(s.code == 0, "not stopped at write step " << step << ", exit " << s.code << ": " << s.err);
  return s;
}

// Hidden temporary entries (".NAME.tmp-*") anywhere below dir.
std::vector<std::string> temp_entries(const fs::path& dir) {
  std::vector<std::string> v;
  for (fs::recursive_directory_iterator it(dir), end; it != end; ++it) {
    const std::string name = it->path().filename().string();
    if (name.size() > 1 && name[0] == '.' && name.find(".tmp-") != std::string::npos)
      v.push_back(it->path().lexically_relative(dir).generic_string());
  }
  return v;
}

struct Setup {
  std::unique_ptr<TempDir> t = scratch_dir();
  fs::path series, root, start;
  Setup() {
    series = gen_series(t->path() / "series", 3, {"--max-shard-size", "600KB"});
    root = t->path() / "root";
    fs::create_directories(root);
    for (int v = 1; v <= 3; ++v)
      require_diff(save_dir(series, v - 1), save_dir(series, v), version_dir(root, v), v == 2 ? "auto" : "xor");
    start = t->path() / "start";
    require_init(save_dir(series, 0), start);
  }
};

// Every write step of an apply form: interrupted ones roll back in full.
// A --root pull commits each version as it goes: `kept` lists the versions
// an interrupted one may leave LOCAL at besides the old one.
void sweep_apply(Setup& s, const std::string& name, const std::vector<std::string>& opts, const fs::path& old_tree,
                 const std::string& old_version, const fs::path& new_tree, const std::string& new_version,
                 const fs::path& start, const std::map<std::string, fs::path>& kept = {}) {
  const fs::path local = s.t->path() / "local";
  int interrupted = 0, step = 1;
  for (;; ++step) {
    fs::remove_all(local);
    copy_tree(start, local);
    std::vector<std::string> argv{apply_bin()};
    argv.insert(argv.end(), opts.begin(), opts.end());
    argv.push_back(local.string());
    const Signalled r = signal_in_turn(argv, step);
    const int sig = kSignals[step % 3];
    INFO(name << ", " << signame(sig) << " at write step " << step << ": exit " << r.code << "\n" << r.err);
    if (!r.paused) break;  // fewer steps: it ran to the end
    if (r.code == 0) {     // the signal came after the commit: the version is applied
      CHECK(tree_equal(local, new_tree).equal);
      CHECK(state_version(local) == new_version);
    } else {
      ++interrupted;
      CHECK(r.code == 128 + sig);
      CHECK(contains(r.err, "interrupted by " + signame(sig)));
      CHECK(contains(r.err, "rolled back"));
      const std::string now = state_version(local);
      const bool moved = now != old_version && kept.count(now);
      const TreeDiff d = tree_equal(local, moved ? kept.at(now) : old_tree);
      CHECK_MESSAGE(d.equal, d.report());
      CHECK(state_version(local) == (moved ? now : old_version));
      CHECK_FALSE(has_txn(local));
      CHECK(apply({"--status", local.string()}).code == (old_version.empty() && !moved ? 11 : 0));
    }
    CHECK(temp_entries(local).empty());
  }
  MESSAGE(name << ": " << step - 1 << " write steps, " << interrupted << " interrupted and rolled back");
  CHECK(interrupted > 0);
}

// Every write step of a publication: an interrupted one leaves ROOT as it was.
void sweep_publish(const std::string& name, const fs::path& seed, const fs::path& scratch,
                   const std::function<std::vector<std::string>(const fs::path& root)>& args, const std::string& out) {
  const fs::path root = scratch / "pub";
  int interrupted = 0, step = 1;
  for (;; ++step) {
    fs::remove_all(root);
    copy_tree(seed, root);
    const Snapshot before = snapshot(root, false);
    std::vector<std::string> argv{diff_bin()};
    for (const auto& a : args(root)) argv.push_back(a);
    const Signalled r = signal_in_turn(argv, step);
    const int sig = kSignals[step % 3];
    INFO(name << ", " << signame(sig) << " at write step " << step << ": exit " << r.code << "\n" << r.err);
    if (!r.paused) break;  // fewer steps: it ran to the end
    if (r.code == 0) {
      CHECK(fs::is_directory(root / out));
    } else {
      ++interrupted;
      CHECK(r.code == 128 + sig);
      CHECK(contains(r.err, "interrupted by " + signame(sig)));
      CHECK(contains(r.err, "no temporary directory left"));
      CHECK(list_names(root) == list_names(seed));
      CHECK(snapshot_diff(before, snapshot(root, false), "ROOT before", "ROOT after").empty());
    }
  }
  MESSAGE(name << ": " << step - 1 << " write steps, " << interrupted << " interrupted and cleaned up");
  CHECK(interrupted > 0);
}

}  // namespace

TEST_CASE("signals: delta-apply rolls back and exits 128 + N at every write step") {
  Setup s;
  const fs::path s0 = save_dir(s.series, 0), s1 = save_dir(s.series, 1), s3 = save_dir(s.series, 3);
  sweep_apply(s, "xor delta", {"-q", version_dir(s.root, 1).string()}, s0, "000000", s1, "000001", s.start);
  sweep_apply(s, "xor delta, --no-sync", {"-q", "--no-sync", version_dir(s.root, 1).string()}, s0, "000000", s1,
              "000001", s.start);
  sweep_apply(s, "--root chain 0 -> 3", {"-q", "--threads", "2", "--root", s.root.string()}, s0, "000000", s3, "000003",
              s.start, {{"000001", save_dir(s.series, 1)}, {"000002", save_dir(s.series, 2)}});
  const fs::path empty = s.t->path() / "empty";
  fs::create_directories(empty);
  sweep_apply(s, "--init", {"-q", "--init", s1.string()}, empty, "", s1, "000000", empty);
}

TEST_CASE("signals: delta-diff and --squash remove their temporary directory at every write step") {
  Setup s;
  const fs::path empty = s.t->path() / "empty-root";
  fs::create_directories(empty);
  sweep_publish(
      "delta-diff", empty, s.t->path(),
      [&s](const fs::path& root) {
        return std::vector<std::string>{"-q", save_dir(s.series, 0).string(), save_dir(s.series, 1).string(),
                                        version_dir(root, 1).string()};
      },
      "weight_v000001");
  sweep_publish(
      "--squash", s.root, s.t->path(),
      [](const fs::path& root) {
        return std::vector<std::string>{"-q", "--squash", version_dir(root, 1).string(), version_dir(root, 3).string(),
                                        (root / "catchup").string()};
      },
      "catchup");
}

TEST_CASE("signals: a delta-apply waiting for the lock stops; --then starts with no signal blocked") {
  Setup s;
  const fs::path local = s.t->path() / "local";
  copy_tree(s.start, local);
  // Another process holds the lock: this test, with flock.
  const fs::path lock = local / ".weight_sync" / "lock";
  const int fd = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC,
                        0644);  // not inherited: the loop below looks for the child's own
  REQUIRE(fd >= 0);
  REQUIRE(::flock(fd, LOCK_EX) == 0);
  const TempDir t;
  const int err_fd = ::open((t / "err").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  const pid_t pid = spawn({apply_bin(), "-q", version_dir(s.root, 1).string(), local.string()}, -1, err_fd);
  ::close(err_fd);
  // Until it waits: its lock file is open (seen in /proc), or a while.
  for (int i = 0; i < 500; ++i) {
    bool open_now = false;
    boost::system::error_code ec;
    for (fs::directory_iterator it("/proc/" + std::to_string(pid) + "/fd", ec), end; !ec && it != end; it.increment(ec))
      open_now = open_now || fs::read_symlink(it->path(), ec) == lock;
    if (open_now) break;
    ::usleep(10000);
  }
  ::kill(pid, SIGTERM);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  ::close(fd);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 128 + SIGTERM);
  CHECK(contains(read_file(t / "err"), "interrupted by SIGTERM"));
  CHECK(state_version(local) == "000000");
  CHECK(tree_equal(local, save_dir(s.series, 0)).equal);

  // --then: the command's signal mask is empty, so it stops on Ctrl-C.
  const fs::path mask = t / "mask";
  const RunResult r = apply({"-q", "--then", "grep SigBlk /proc/self/status > " + mask.string(),
                             version_dir(s.root, 1).string(), local.string()});
  E2E_REQUIRE_CODE(r, 0);
  CHECK(contains(read_file(mask), "0000000000000000"));
}

TEST_CASE("leftovers: delta-apply removes temporary files of killed runs; --prune removes old publication temp dirs") {
  Setup s;
  const fs::path local = s.t->path() / "local";
  // A kill at every write step, then the next run: nothing temporary stays.
  int step = 1;
  for (;; ++step) {
    fs::remove_all(local);
    copy_tree(s.start, local);
    RunResult r;
    {
      ScopedEnv at("HFDELTA_FAULT_AT", std::to_string(step));
      ScopedEnv mode("HFDELTA_FAULT_MODE", "kill");
      r = apply({"-q", "--root", s.root.string(), local.string()});
    }
    if (r.code == 0) break;
    const RunResult again = apply({"-q", "--root", s.root.string(), local.string()});
    INFO("killed at write step " << step << "; re-run: " << again.describe());
    CHECK(again.code == 0);
    CHECK(temp_entries(local).empty());
  }
  MESSAGE("delta-apply --root killed at each of " << step - 1 << " write steps; no temporary file outlived the re-run");
  // Leftovers made by hand, as a kill leaves them.
  write_file(local / ".weight_sync" / ".state.json.tmp-0badc0de", "{}");
  write_file(local / ".weight_sync" / "checksums" / ".000003.json.tmp-0badc0de", "{}");
  E2E_REQUIRE_CODE(apply({"-q", "--root", s.root.string(), local.string()}), 0);
  CHECK(temp_entries(local).empty());

  // A publication's temporary directory: kept while it may be in progress,
  // removed by --prune once untouched for 6 hours.
  const fs::path fresh = s.root / ".weight_v000004.tmp-00000001", stale = s.root / ".weight_v000005.tmp-00000002";
  write_file(fresh / "model.safetensors.index.json", "{}");
  write_file(stale / "model.safetensors.index.json", "{}");
  const std::time_t old = std::time(nullptr) - 7 * 3600;
  for (const fs::path& p : {stale / "model.safetensors.index.json", stale}) fs::last_write_time(p, old);
  const RunResult p = diff({"--prune", s.root.string(), "--json"});
  E2E_REQUIRE_CODE(p, 0);
  CHECK(!fs::exists(stale));
  CHECK(fs::exists(fresh));
  CHECK(contains(p.out, stale.filename().string()));
  for (int v = 1; v <= 3; ++v) CHECK(fs::is_directory(version_dir(s.root, v)));
}
