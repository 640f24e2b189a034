// End-to-end: runs of delta-apply against one LOCAL serialise on its lock;
// --then runs while the lock is held; --status and --recover report and undo
// an interrupted apply; --no-sync applies the same bytes.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <thread>

#include "e2e_util.hpp"

extern char** environ;

using namespace e2e;

namespace {

// A tiny series with versions 1 and 2 published as deltas, and LOCAL at version 0.
struct Setup {
  TempDir t;
  fs::path series, root, local;
  Setup() {
    series = gen_series(t / "series", 2, {"--max-shard-size", "600KB"});
    root = t / "root";
    local = t / "local";
    fs::create_directories(root);
    for (int v = 1; v <= 2; ++v)
      E2E_REQUIRE_CODE(
          diff({"-q", save_dir(series, v - 1).string(), save_dir(series, v).string(), version_dir(root, v).string()}),
          0);
    E2E_REQUIRE_CODE(apply({"-q", "--init", save_dir(series, 0).string(), local.string()}), 0);
  }
  fs::path delta(int v) const { return version_dir(root, v); }
};

json parse_out(const RunResult& r) {
  try {
    return json::parse(r.out);
  } catch (const std::exception&) {
    FAIL("not JSON on stdout:\n" << r.describe());
  }
  return json();
}

}  // namespace

TEST_CASE("concurrency: two appliers on one LOCAL serialise on its lock") {
  Setup s;
  const fs::path mark = s.t / "then-started", done = s.t / "then-done";
  Background first({"--then", "touch " + sh_quote(mark.string()) + "; sleep 2; touch " + sh_quote(done.string()),
                    s.delta(1).string(), s.local.string()},
                   s.t.path());
  REQUIRE_MESSAGE(wait_for_file(mark, first), "the first apply never reached its --then command\n" << first.output());
  // The first apply has committed version 1 and still holds the lock.
  CHECK(state_json(s.local) == json{{"version", "000001"}});

  SUBCASE("a second apply with --lock-timeout gives up with exit 8, changing nothing") {
    const LocalSnapshot snap(s.local);
    const RunResult r = apply({"--lock-timeout", "0.3", "--root", s.root.string(), s.local.string()});
    E2E_CHECK_CODE(r, 8);
    CHECK_MESSAGE(contains(r.err, "lock"), r.describe());
    E2E_CHECK_UNCHANGED(snap);
    CHECK_FALSE(fs::exists(done));  // it gave up while the first still held the lock
    CHECK(first.wait() == 0);
  }
  SUBCASE("a second apply without a timeout waits, then succeeds as a no-op") {
    const RunResult r = apply({"--json", s.delta(1).string(), s.local.string()});
    E2E_CHECK_CODE(r, 0);
    // It got the lock only after the first's --then had finished.
    CHECK(fs::exists(done));
    const json j = parse_out(r);
    CHECK(j["noop"] == true);
    CHECK(j["applied"] == json::array());
    CHECK(first.wait() == 0);
  }
  SUBCASE("a second apply of the next version waits, then applies it") {
    const RunResult r = apply({"-q", s.delta(2).string(), s.local.string()});
    E2E_CHECK_CODE(r, 0);
    CHECK(fs::exists(done));
    CHECK(first.wait() == 0);
    CHECK(state_json(s.local) == json{{"version", "000002"}});
    E2E_CHECK_TREE_EQUAL(s.local, save_dir(s.series, 2));
  }
  CHECK_MESSAGE(first.wait() == 0, first.output());
  CHECK_FALSE(has_txn(s.local));
}

TEST_CASE("concurrency: --then runs under the lock with HFDELTA_LOCAL and HFDELTA_VERSION") {
  Setup s;
  const fs::path out = s.t / "then.out";
  // Inside the hook, the lock is still held: a --status that may not wait gives up.
  const std::string hook =
      "printf '%s\\n%s\\n' \"$HFDELTA_VERSION\" \"$HFDELTA_LOCAL\" > " + sh_quote(out.string()) +
      "; \"$HFDELTA_APPLY\" --status --lock-timeout 0 \"$HFDELTA_LOCAL\" >/dev/null 2>&1; echo $? >> " +
      sh_quote(out.string());
  {
    const RunResult r = apply({"-q", "--then", hook, "--root", s.root.string(), s.local.string()});
    E2E_REQUIRE_CODE(r, 0);
    CHECK(read_file(out) == "000002\n" + s.local.string() + "\n8\n");
    CHECK(state_json(s.local) == json{{"version", "000002"}});
  }
  {  // after a no-op too
    fs::remove(out);
    const RunResult r = apply({"-q", "--then", hook, s.delta(2).string(), s.local.string()});
    E2E_REQUIRE_CODE(r, 0);
    CHECK(read_file(out) == "000002\n" + s.local.string() + "\n8\n");
  }
  {  // and after --init
    fs::remove(out);
    const RunResult r = apply(
        {"-q", "--then", hook, "--init", "--init-version", "5", save_dir(s.series, 1).string(), s.local.string()});
    E2E_REQUIRE_CODE(r, 0);
    CHECK(read_file(out) == "000005\n" + s.local.string() + "\n8\n");
  }
  // Once delta-apply has exited the lock is free again.
  E2E_CHECK_CODE(apply({"--status", "--lock-timeout", "0", s.local.string()}), 0);
}

TEST_CASE("concurrency: a failing --then exits 9 and the version stays applied") {
  Setup s;
  SUBCASE("exit status") {
    const RunResult r = apply({"--then", "exit 3", s.delta(1).string(), s.local.string()});
    E2E_CHECK_CODE(r, 9);
    CHECK_MESSAGE(contains(r.err, "exit 3"), r.describe());
  }
  SUBCASE("killed by a signal") {
    const RunResult r = apply({"--then", "kill -9 $$", s.delta(1).string(), s.local.string()});
    E2E_CHECK_CODE(r, 9);
  }
  CHECK(state_json(s.local) == json{{"version", "000001"}});
  E2E_CHECK_TREE_EQUAL(s.local, save_dir(s.series, 1));
  CHECK_FALSE(has_txn(s.local));
  E2E_CHECK_CODE(apply({"--status", s.local.string()}), 0);
}

TEST_CASE("concurrency: --status and --recover") {
  Setup s;
  SUBCASE("uninitialised: exit 11") {
    const fs::path empty = s.t / "empty";
    fs::create_directories(empty);
    const RunResult r = apply({"--status", "--json", empty.string()});
    E2E_CHECK_CODE(r, 11);
    const json j = parse_out(r);
    CHECK(j["state"] == "uninitialised");
    CHECK(j["version"].is_null());
    CHECK(j["pending"].is_null());
  }
  SUBCASE("after --init: exit 0") {
    const RunResult r = apply({"--status", "--json", s.local.string()});
    E2E_CHECK_CODE(r, 0);
    const json j = parse_out(r);
    CHECK(j["state"] == "clean");
    CHECK(j["version"] == "000000");
    CHECK(j["pending"].is_null());
    CHECK(j["local"] == s.local.string());
  }
  SUBCASE("after a kill mid-apply: exit 10, and --recover brings version 0 back") {
    // Kill at successive write steps until one leaves the apply marked pending.
    const fs::path start = s.t / "start";
    copy_tree(s.local, start);
    long at = 0;
    for (long n = 1; n <= 1000 && at == 0; ++n) {
      fs::remove_all(s.local);
      copy_tree(start, s.local);
      ScopedEnv f("HFDELTA_FAULT_AT", std::to_string(n)), m("HFDELTA_FAULT_MODE", "kill");
      const RunResult r = apply({s.delta(1).string(), s.local.string()});
      REQUIRE_MESSAGE(r.code == 128 + SIGKILL, r.describe());
      if (state_json(s.local).contains("pending")) at = n;
    }
    REQUIRE(at > 0);
    INFO("killed at write step " << at);
    CHECK(state_json(s.local) == json{{"version", "000000"}, {"pending", "000001"}});

    RunResult r = apply({"--status", "--json", s.local.string()});
    E2E_CHECK_CODE(r, 10);
    json j = parse_out(r);
    CHECK(j["state"] == "interrupted");
    CHECK(j["version"] == "000000");
    CHECK(j["pending"] == "000001");
    E2E_CHECK_CODE(apply({"--status", s.local.string()}), 10);  // --status itself changes nothing

    r = apply({"--recover", "--json", s.local.string()});
    E2E_CHECK_CODE(r, 0);
    j = parse_out(r);
    CHECK(j["rolled_back"] == "000001");
    CHECK(j["to_version"] == "000000");
    CHECK(j["applied"] == json::array());
    E2E_CHECK_CODE(apply({"--status", s.local.string()}), 0);
    CHECK(state_json(s.local) == json{{"version", "000000"}});
    E2E_CHECK_TREE_EQUAL(s.local, save_dir(s.series, 0));
    CHECK_FALSE(has_txn(s.local));

    // Nothing left to recover; --recover never applies anything.
    r = apply({"--recover", "--json", s.local.string()});
    E2E_CHECK_CODE(r, 0);
    CHECK(parse_out(r)["rolled_back"].is_null());
    CHECK(state_json(s.local) == json{{"version", "000000"}});
  }
}

TEST_CASE("concurrency: --no-sync applies the same bytes") {
  Setup s;
  E2E_REQUIRE_CODE(apply({"-q", "--no-sync", s.delta(1).string(), s.local.string()}), 0);
  CHECK(state_json(s.local) == json{{"version", "000001"}});
  E2E_CHECK_TREE_EQUAL(s.local, save_dir(s.series, 1));
  E2E_REQUIRE_CODE(apply({"-q", "--no-sync", "--root", s.root.string(), s.local.string()}), 0);
  CHECK(state_json(s.local) == json{{"version", "000002"}});
  E2E_CHECK_TREE_EQUAL(s.local, save_dir(s.series, 2));
  const fs::path other = s.t / "other";
  E2E_REQUIRE_CODE(apply({"-q", "--no-sync", "--init", save_dir(s.series, 1).string(), other.string()}), 0);
  E2E_CHECK_TREE_EQUAL(other, save_dir(s.series, 1));
  CHECK_FALSE(has_txn(s.local));
  CHECK_FALSE(has_txn(other));
}
