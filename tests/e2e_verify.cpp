// delta-apply --verify: LOCAL re-hashed against the checksums recorded for its
// version, after every way of reaching a version, and every way of breaking it.
#include <doctest/doctest.h>

#include <signal.h>

#include <functional>

#include "e2e_util.hpp"

using namespace e2e;

namespace {

struct Verified {
  int code = -1;
  json j;
};

Verified verify(const fs::path& local) {
  const RunResult r = apply({"--verify", "--json", local.string()});
  Verified v;
  v.code = r.code;
  if (!r.out.empty()) v.j = parse_json(r.out);
  return v;
}

// A series, a ROOT with deltas 1, 2 (default encoding), a full version 3 and
// a --no-sync-applied delta 4, and a LOCAL initialised from save 0.
struct Setup {
  TempDir t;
  fs::path series, root, local;
  Setup() {
    series = gen_series(t / "series", 4, {"--max-shard-size", "600KB"});
    root = t / "root";
    fs::create_directories(root);
    for (int v = 1; v <= 4; ++v) {
      if (v == 3) {
        copy_tree(save_dir(series, 3), version_dir(root, 3));
        continue;
      }
      E2E_REQUIRE_CODE(
          diff({"-q", save_dir(series, v - 1).string(), save_dir(series, v).string(), version_dir(root, v).string()}),
          0);
    }
    local = t / "local";
    E2E_REQUIRE_CODE(apply({"-q", "--init", save_dir(series, 0).string(), local.string()}), 0);
  }
};

// delta-apply ARGS with write steps failing from the N-th on in `mode`
// (HFDELTA_FAULT_MODE: kill, error, persist).
RunResult apply_faulty(const std::vector<std::string>& args, long at, const char* mode) {
  ScopedEnv a("HFDELTA_FAULT_AT", std::to_string(at));
  ScopedEnv m("HFDELTA_FAULT_MODE", mode);
  return apply(args);
}

}  // namespace

TEST_CASE("--verify: clean after --init, a delta, a --root chain through a full version, and a --no-sync apply") {
  Setup s;
  Verified v = verify(s.local);
  CHECK(v.code == 0);
  CHECK(v.j["state"] == "clean");
  CHECK(v.j["version"] == "000000");
  CHECK(v.j["tensors"].get<int>() > 10);
  CHECK(v.j["weight_files"].get<int>() >= 2);
  CHECK(v.j["problems"].empty());

  E2E_REQUIRE_CODE(apply({"-q", version_dir(s.root, 1).string(), s.local.string()}), 0);
  v = verify(s.local);
  CHECK(v.code == 0);
  CHECK(v.j["version"] == "000001");

  E2E_REQUIRE_CODE(apply({"-q", "--root", s.root.string(), "--target", "3", s.local.string()}), 0);
  v = verify(s.local);
  CHECK(v.code == 0);
  CHECK(v.j["version"] == "000003");

  E2E_REQUIRE_CODE(apply({"-q", "--no-sync", version_dir(s.root, 4).string(), s.local.string()}), 0);
  v = verify(s.local);
  CHECK(v.code == 0);
  CHECK(v.j["version"] == "000004");
  CHECK(tree_equal(s.local, save_dir(s.series, 4)).equal);
  // Only the current version's record is kept.
  CHECK(list_names(s.local / ".weight_sync" / "checksums") == std::vector<std::string>{"000004.json"});

  // The human form names the state; --verify changes nothing.
  const Snapshot before = snapshot(s.local);
  const RunResult r = apply({"--verify", s.local.string()});
  E2E_REQUIRE_CODE(r, 0);
  CHECK(r.out.find("clean, version 000004") != std::string::npos);
  CHECK(snapshot_diff(before, snapshot(s.local)).empty());
}

TEST_CASE("--verify: every kind of damage is exit 12 and named") {
  Setup s;
  E2E_REQUIRE_CODE(apply({"-q", version_dir(s.root, 1).string(), s.local.string()}), 0);
  const fs::path pristine = s.t / "pristine";
  copy_tree(s.local, pristine);
  std::string weight;
  for (const auto& f : list_files(s.local))
    if (f.size() > 12 && f.substr(f.size() - 12) == ".safetensors") weight = f;
  REQUIRE(!weight.empty());

  struct Damage {
    const char* name;
    std::function<void(const fs::path&)> apply;
    const char* expect;  // in some problem line
  };
  const std::vector<Damage> damages = {
      {"a flipped byte in the last tensor of a weight file",
       [&](const fs::path& l) {
         Bytes b = read_bytes(l / weight);
         b[b.size() - 2] ^= 0x40;
         write_bytes(l / weight, b);
       },
       "has checksum"},
      {"a changed config.json",
       [](const fs::path& l) {
         json c = read_json(l / "config.json");
         c["edited"] = true;
         write_json(l / "config.json", c);
       },
       "config.json: contents differ"},
      {"a stray file", [](const fs::path& l) { write_file(l / "stray.bin", "x"); },
       "stray.bin: file not in the record"},
      {"a missing file", [](const fs::path& l) { fs::remove(l / "generation_config.json"); },
       "generation_config.json: file of version 000001 is missing"},
      {"a weight file cut short",
       [&](const fs::path& l) {
         Bytes b = read_bytes(l / weight);
         b.resize(b.size() - 7);
         write_bytes(l / weight, b);
       },
       weight.c_str()},
  };
  for (const auto& d : damages) {
    CAPTURE(d.name);
    fs::remove_all(s.local);
    copy_tree(pristine, s.local);
    REQUIRE(verify(s.local).code == 0);
    d.apply(s.local);
    const Verified v = verify(s.local);
    CHECK(v.code == 12);
    CHECK(v.j["state"] == "corrupt");
    std::string all;
    for (const auto& p : v.j["problems"]) all += p.get<std::string>() + "\n";
    CHECK_MESSAGE(all.find(d.expect) != std::string::npos, all);
    // Re-initialising from the version's full checkpoint repairs it.
    E2E_REQUIRE_CODE(apply({"-q", "--init", "--init-version", "1", save_dir(s.series, 1).string(), s.local.string()}),
                     0);
    CHECK(verify(s.local).code == 0);
  }
}

TEST_CASE("--verify: interrupted, uninitialised, and no record") {
  Setup s;
  // An apply killed half way: interrupted (10), and --verify leaves the
  // transaction for the next apply to roll back.
  // The first write step at which a kill leaves a journal (earlier kills
  // leave LOCAL as it was, with no transaction to finish).
  for (int step = 1; step < 200 && !has_journal(s.local); ++step) {
    ScopedEnv at("HFDELTA_FAULT_AT", std::to_string(step));
    ScopedEnv mode("HFDELTA_FAULT_MODE", "kill");
    const RunResult r = apply({"-q", version_dir(s.root, 1).string(), s.local.string()});
    REQUIRE(r.code != 0);
  }
  REQUIRE(has_journal(s.local));
  const Verified v = verify(s.local);
  CHECK(v.code == 10);
  CHECK(v.j["state"] == "interrupted");
  CHECK(has_journal(s.local));
  E2E_REQUIRE_CODE(apply({"-q", version_dir(s.root, 1).string(), s.local.string()}), 0);
  CHECK(verify(s.local).code == 0);

  // Never initialised.
  fs::create_directories(s.t / "empty");
  const Verified e = verify(s.t / "empty");
  CHECK(e.code == 11);
  CHECK(e.j["state"] == "uninitialised");

  // A LOCAL whose version has no record (set up by a tool that keeps none).
  fs::remove_all(s.local / ".weight_sync" / "checksums");
  const RunResult r = apply({"--verify", s.local.string()});
  CHECK(r.code == 3);
  CHECK(r.err.find("no checksums are recorded for version 000001") != std::string::npos);
  // The next apply records them again, from LOCAL itself.
  E2E_REQUIRE_CODE(apply({"-q", version_dir(s.root, 2).string(), s.local.string()}), 0);
  CHECK(verify(s.local).code == 0);
}

TEST_CASE(
    "an interrupted LOCAL whose rollback fails again: journal kept and said so, --status 10, a clean run converges") {
  // A killed run left LOCAL interrupted; the next run (the delta again, or
  // --recover) meets a disk on which every write from some step on fails, so
  // its rollback of the interrupted apply fails part way. It must do nothing
  // else, say the journal is kept and what to do, leave --status at 10, and
  // once the disk is healed a plain run must converge. The delta turns a
  // directory into a file, so a rollback cut short leaves files and
  // directories half put back.
  const std::unique_ptr<TempDir> scratch = scratch_dir();  // thousands of flushes: in memory where it can
  const TempDir& t = *scratch;
  const fs::path series = gen_series(t / "series", 1, {"--max-shard-size", "600KB"});
  const fs::path base = t / "base", next = t / "next", root = t / "root", start = t / "start", local = t / "local";
  copy_tree(save_dir(series, 0), base);
  write_file(base / "layout" / "deep" / "readme.txt", "a directory that becomes a file\n");
  copy_tree(save_dir(series, 1), next);
  write_file(next / "layout", "now a file\n");
  fs::create_directories(root);
  require_diff(base, next, version_dir(root, 1), "xor");
  REQUIRE(require_init(base, start) == "000000");
  const std::vector<std::string> args{"-q", "--threads", "1", version_dir(root, 1).string(), local.string()};
  auto reset = [&](const fs::path& from) {
    fs::remove_all(local);
    copy_tree(from, local);
  };

  // The write steps at which a kill leaves a journal: the first and the last
  // (the apply done, its commit not) are the two ends of what there is to undo.
  std::vector<long> journaled;
  for (long step = 1;; ++step) {
    REQUIRE(step < 1000);
    reset(start);
    const RunResult r = apply_faulty(args, step, "kill");
    if (r.code == 0) break;
    REQUIRE(r.code == 128 + SIGKILL);
    if (has_journal(local)) journaled.push_back(step);
  }
  REQUIRE_FALSE(journaled.empty());

  // A run whose rollback of the interrupted apply failed: says so, keeps the
  // journal; the disk healed, the delta converges and reports what it undid.
  auto check_kept = [&](const RunResult& r) {
    CHECK(r.code == 1);
    CHECK(contains(r.err, "injected fault"));
    CHECK(contains(r.err, "undoing the apply an earlier run left interrupted"));
    CHECK(has_journal(local));
    CHECK(contains(r.err, "is left interrupted (--status exits 10) with its undo journal in .weight_sync/txn"));
    CHECK(contains(r.err, "the next delta-apply on it, or delta-apply --recover, finishes the rollback"));
    CHECK(apply({"--status", local.string()}).code == 10);
    const RunResult again = apply({"--json", "--threads", "1", version_dir(root, 1).string(), local.string()});
    E2E_CHECK_CODE(again, 0);
    if (again.code == 0) CHECK(parse_json(again.out).value("rolled_back", json()) == json("000001"));
    E2E_CHECK_TREE_EQUAL(local, next);
    CHECK(state_json(local) == json{{"version", "000001"}});
    CHECK_FALSE(has_txn(local));
  };
  int failed = 0;
  for (const long kill_at : {journaled.front(), journaled.back()}) {
    const fs::path interrupted = t / ("interrupted-" + std::to_string(kill_at));
    reset(start);
    REQUIRE(apply_faulty(args, kill_at, "kill").code == 128 + SIGKILL);
    copy_tree(local, interrupted);
    // --recover does nothing but the rollback: the first step at which its
    // faults come too late to stop it counts the rollback's write steps.
    long steps = 0;
    for (long n = 1;; ++n) {
      REQUIRE(n < 1000);
      reset(interrupted);
      const RunResult r = apply_faulty({"--recover", local.string()}, n, "persist");
      INFO("killed at write step " << kill_at << ", then --recover with every write failing from step " << n
                                   << " on: exit " << r.code << "\n"
                                   << r.err);
      if (r.code == 0) {
        steps = n - 1;
        break;
      }
      ++failed;
      check_kept(r);
    }
    // The delta again: its rollback of the interrupted apply comes first.
    for (long n = 1; n <= steps; n += 2) {
      reset(interrupted);
      const RunResult r = apply_faulty(args, n, "persist");
      INFO("killed at write step " << kill_at << ", then the delta again with every write failing from step " << n
                                   << " on: exit " << r.code << "\n"
                                   << r.err);
      ++failed;
      check_kept(r);
    }
  }
  MESSAGE("interrupted LOCAL (killed at write steps " << journaled.front() << " and " << journaled.back() << "): "
                                                      << failed << " runs whose rollback of it failed part way");
  CHECK(failed >= 4);
}
