// End-to-end: what a publication into a root depends on is checked at its
// commit, not only when it starts (format/root_commit.hpp). A second actor
// changes the root while a publication is stopped at one of its write steps
// (HFDELTA_FAULT_MODE=hold): a withdrawal of its base, another publisher
// taking its number. Every outcome leaves a root every host can follow: the
// publication refused (nothing of it in the root), or published before the
// change and then reported by it.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>
#include <functional>

#include "e2e_util.hpp"
#include "hfdelta/checkpoint.hpp"
#include "hfdelta/error.hpp"
#include "hfdelta/publisher.hpp"
#include "hfdelta/sharded_publisher.hpp"
#include "hfdelta/withdraw.hpp"
#include "util/io.hpp"

using namespace e2e;

namespace {

constexpr int kOutOfOrder = static_cast<int>(hfdelta::Exit::out_of_order);
constexpr int kExists = static_cast<int>(hfdelta::Exit::exists);

// ROOT with versions 1 and 2 of series `s` (saves 0..2).
void publish_two(const fs::path& s, const fs::path& root) {
  fs::create_directories(root);
  for (int v = 1; v <= 2; ++v)
    E2E_REQUIRE_CODE(diff({"-q", "--no-sync", save_dir(s, v - 1).string(), save_dir(s, v).string(), root.string()}), 0);
}

// Names in ROOT that are not hidden (published and withdrawn versions).
std::vector<std::string> visible(const fs::path& root) {
  std::vector<std::string> out;
  for (const std::string& n : list_names(root))
    if (n[0] != '.') out.push_back(n);
  return out;
}

bool has(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

// A host at version 1 (save 1 of `s`) pulls ROOT: it must reach `want`'s bytes.
void host_from_1_reaches(const fs::path& s, const fs::path& root, const fs::path& want, const fs::path& local) {
  require_init(save_dir(s, 1), local, "1");
  pull(root, local);
  E2E_CHECK_TREE_EQUAL(local, want);
}

// Withdraws version 2 of ROOT while ARGS (a publication of version 3 on it)
// is held at write step `step`. Checks what both leave; returns false once
// the publication ran to its end before reaching the step.
bool withdraw_during(const std::vector<std::string>& args, long step, const fs::path& root) {
  CAPTURE(step);
  json w;
  const Signalled p = hold_at_step(args, step, [&] {
    const RunResult r = diff({"--json", "--no-sync", "--withdraw", version_dir(root, 2).string()});
    REQUIRE_MESSAGE(r.code == 0, r.describe());
    w = parse_json(r.out);
  });
  INFO("publication: exit " << p.code << "\n" << p.err << "\nwithdrawal: " << w.dump());
  const std::vector<std::string> names = visible(root);
  if (p.code == 0) {
    // Published before the withdrawal: the withdrawal names it.
    CHECK(has(names, "weight_v000003"));
    if (p.paused) {
      bool named = false;
      for (const json& v : w["stranded"]) named = named || v == "000003";
      CHECK_MESSAGE(named, "a version on the withdrawn base, published before it, must be reported stranded");
    }
  } else {
    // Refused at its commit: nothing of it in the root a host could take.
    CHECK(p.code == kOutOfOrder);
    CHECK(contains(p.err, "withdrawn"));
    CHECK(!has(names, "weight_v000003"));
    CHECK(!has(names, "delta_v000003"));
  }
  for (const std::string& n : list_names(root)) CHECK_MESSAGE(!contains(n, ".tmp-"), "left behind: " << n);
  return p.paused;
}

// Runs `held(step)` (false: the command ran to its end before that step) at
// write steps 1 and 2, every 10th, then every step of the last 10 before the
// end, so that the steps around the commit are never skipped; with
// HFDELTA_COMMIT_SWEEP=all (the `commit-sweep` test, suite crash), at every
// step (every HFDELTA_CRASH_STRIDE-th, where that is set, as the sanitizer
// run sets it). Returns how many steps held.
int sweep_steps(const std::function<bool(long)>& held) {
  const char* all = std::getenv("HFDELTA_COMMIT_SWEEP");
  const long stride = all && std::string(all) == "all"
                          ? Sampling("HFDELTA_CRASH_STRIDE", "HFDELTA_CRASH_OFFSET").stride  // the sanitizer run's: 10
                          : 10;
  int n = 0;
  long step = 1;
  for (;; step += step < 2 ? 1 : stride) {
    if (!held(step)) break;
    ++n;
  }
  for (long k = std::max(3L, step - stride + 1); k < step; ++k) n += held(k);
  return n;
}

}  // namespace

TEST_CASE("commit: a withdrawal of the base at any write step of delta-diff is refused at the commit or reported") {
  TempDir t;
  const fs::path s = gen_series(t / "series", 4);
  const fs::path seed = t / "seed";
  publish_two(s, seed);
  int refused = 0;
  const int steps = sweep_steps([&](long step) {
    const fs::path root = t / ("root-" + std::to_string(step));
    copy_tree(seed, root);
    const std::vector<std::string> args{
        diff_bin(), "-q", "--no-sync", save_dir(s, 2).string(), save_dir(s, 3).string(), root.string()};
    if (!withdraw_during(args, step, root)) return false;
    refused += !fs::exists(version_dir(root, 3));
    // The operator's next move: publish on the newest version left (1).
    // Hosts at 1 reach save 3; the version's number is past the withdrawn 2
    // and, where it was withdrawn too, past 3.
    if (!fs::exists(version_dir(root, 3))) {
      E2E_REQUIRE_CODE(diff({"-q", "--no-sync", save_dir(s, 1).string(), save_dir(s, 3).string(), root.string()}), 0);
      host_from_1_reaches(s, root, save_dir(s, 3), t / ("host-" + std::to_string(step)));
    }
    fs::remove_all(root);
    return true;
  });
  CHECK(steps >= 5);
  CHECK_MESSAGE(refused >= steps - 2, refused << " of " << steps << " held steps refused");
}

TEST_CASE("commit: a withdrawal of the base during --full BASE NEW ROOT leaves no delta on it") {
  TempDir t;
  const fs::path s = gen_series(t / "series", 4);
  const fs::path seed = t / "seed";
  publish_two(s, seed);
  sweep_steps([&](long step) {
    const fs::path root = t / ("root-" + std::to_string(step));
    copy_tree(seed, root);
    const std::vector<std::string> args{
        diff_bin(), "-q", "--no-sync", "--full", save_dir(s, 2).string(), save_dir(s, 3).string(), root.string()};
    CAPTURE(step);
    bool delta_before = false;  // the delta on 2 beside the full version was in place before 2 was withdrawn
    const Signalled p = hold_at_step(args, step, [&] {
      delta_before = fs::exists(root / "delta_v000003");
      E2E_REQUIRE_CODE(diff({"-q", "--no-sync", "--withdraw", version_dir(root, 2).string()}), 0);
    });
    if (!p.paused) return false;
    INFO(p.err);
    // A delta on 2 published after 2 was withdrawn is what no host can take.
    if (!delta_before) CHECK(p.code == kOutOfOrder);
    if (p.code != 0) {
      CHECK(p.code == kOutOfOrder);
      CHECK(!fs::exists(version_dir(root, 3)));
      CHECK(!fs::exists(root / "delta_v000003"));
      // The message's advice: the full version alone.
      E2E_REQUIRE_CODE(diff({"-q", "--no-sync", "--full", save_dir(s, 3).string(), root.string()}), 0);
    }
    // Either way a host at 1 reaches save 3 (through the full version).
    host_from_1_reaches(s, root, save_dir(s, 3), t / ("host-" + std::to_string(step)));
    fs::remove_all(root);
    return true;
  });
}

TEST_CASE("commit: another publisher taking the number at any write step is refused, naming its version and time") {
  TempDir t;
  const fs::path s = gen_series(t / "series", 4);
  const fs::path other = gen_series(t / "other", 4, {"--seed", "7"});
  const fs::path seed = t / "seed";
  publish_two(s, seed);
  sweep_steps([&](long step) {
    const fs::path root = t / ("root-" + std::to_string(step));
    copy_tree(seed, root);
    const std::vector<std::string> args{
        diff_bin(), "-q", "--no-sync", save_dir(s, 2).string(), save_dir(s, 3).string(), root.string()};
    CAPTURE(step);
    RunResult second;
    const Signalled p = hold_at_step(args, step, [&] {
      // A job restarted while its old one still runs: the same base, other weights.
      second = diff({"-q", "--no-sync", save_dir(s, 2).string(), save_dir(other, 3).string(), root.string()});
    });
    if (!p.paused) return false;
    INFO("held: exit " << p.code << "\n" << p.err << "\nsecond: " << second.describe());
    // Exactly one version 3, and nothing above it.
    CHECK(visible(root) == std::vector<std::string>{"weight_v000001", "weight_v000002", "weight_v000003"});
    if (second.code == 0) {
      CHECK(p.code == kExists);
      CHECK(contains(p.err, "weight_v000003"));
      CHECK(contains(p.err, "another publisher"));
      CHECK(contains(p.err, " UTC, "));
      CHECK(contains(p.err, "stop one of them"));
    } else {
      CHECK(p.code == 0);  // the held one had renamed: the second publishes on 3, from other bytes
    }
    for (const std::string& n : list_names(root)) CHECK_MESSAGE(!contains(n, ".tmp-"), "left behind: " << n);
    fs::remove_all(root);
    return true;
  });
}

TEST_CASE("commit: a BASE that is not the newest version is refused before anything is written") {
  TempDir t;
  const fs::path s = gen_series(t / "series", 4);
  const fs::path root = t / "root";
  publish_two(s, root);
  const std::vector<std::string> before = list_names(root);
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"--base-version", "1", save_dir(s, 1).string(), save_dir(s, 3).string(),
                                 root.string()},
        std::vector<std::string>{"--base-version", "1", save_dir(s, 1).string(), save_dir(s, 3).string(),
                                 version_dir(root, 3).string()},
        std::vector<std::string>{"--full", "--base-version", "1", save_dir(s, 1).string(), save_dir(s, 3).string(),
                                 root.string()}}) {
    const RunResult r = diff(args);
    CHECK(r.code == kOutOfOrder);
    CHECK_MESSAGE(contains(r.err, "the newest version of the root is 000002"), r.describe());
    CHECK(list_names(root) == before);
  }
  // Every version withdrawn but 1: a publication on withdrawn 2 is refused too.
  E2E_REQUIRE_CODE(diff({"-q", "--withdraw", version_dir(root, 2).string()}), 0);
  const RunResult r = diff({"--base-version", "2", save_dir(s, 2).string(), save_dir(s, 3).string(), root.string()});
  CHECK(r.code == kOutOfOrder);
  CHECK_MESSAGE(contains(r.err, "was withdrawn"), r.describe());
}

TEST_CASE("commit: a Publisher whose base is withdrawn during its version publishes nothing") {
  TempDir t;
  const fs::path s = gen_series(t / "series", 3);
  const fs::path root = t / "root", mirror = t / "mirror";
  publish_two(s, root);
  require_init(save_dir(s, 0), mirror);
  hfdelta::PublisherOptions o;
  o.sync = false;
  o.background = false;
  hfdelta::MemoryPublisher p(root, mirror, o);  // caught up to 2
  REQUIRE(p.version() == 2);
  p.begin();  // checks the newest version: 2
  hfdelta::withdraw_version(version_dir(root, 2), false);
  const int code = code_of([&] { p.publish(true); });
  CHECK(code == kOutOfOrder);
  CHECK(visible(root) == std::vector<std::string>{"weight_v000001", "withdrawn_v000002"});
}

TEST_CASE("commit: a Publisher that lost the race says who won and when, and reopening is all it takes") {
  TempDir t;
  const fs::path s = gen_series(t / "series", 4);
  const fs::path root = t / "root", mirror = t / "mirror";
  fs::create_directories(root);
  require_init(save_dir(s, 0), mirror);
  hfdelta::PublisherOptions o;
  o.sync = false;
  o.background = false;
  auto give = [&](hfdelta::MemoryPublisher& p, const fs::path& save) {
    const hfdelta::Checkpoint c = hfdelta::open_checkpoint(save);
    std::vector<hfdelta::MappedFile> maps;
    for (const auto& sh : c.shards) maps.emplace_back(save / sh.file);
    for (std::size_t k = 0; k < c.shards.size(); ++k)
      for (const auto& ti : c.shards[k].header.tensors)
        p.put({ti.name, ti.dtype, ti.shape, maps[k].bytes(c.shards[k].header.file_offset(ti), ti.nbytes())});
  };
  {
    hfdelta::MemoryPublisher p(root, mirror, o);
    give(p, save_dir(s, 1));
    // Another writer (delta-diff, a restarted job) publishes version 1 first.
    E2E_REQUIRE_CODE(diff({"-q", "--no-sync", save_dir(s, 0).string(), save_dir(s, 2).string(), root.string()}), 0);
    std::string msg;
    try {
      p.publish(true);
    } catch (const hfdelta::Error& e) {
      CHECK(e.code() == hfdelta::Exit::exists);
      msg = e.what();
    }
    CHECK_MESSAGE(contains(msg, "weight_v000001"), msg);
    CHECK_MESSAGE(contains(msg, "another publisher"), msg);
    CHECK_MESSAGE(contains(msg, " UTC, "), msg);
    CHECK_MESSAGE(contains(msg, "opened again"), msg);
    // Going on without reopening is refused, never silently on the other's version.
    std::string again;
    try {
      p.begin();
      give(p, save_dir(s, 3));
    } catch (const hfdelta::Error& e) {
      CHECK(e.code() == hfdelta::Exit::exists);
      again = e.what();
    }
    CHECK_MESSAGE(contains(again, "open it again"), again);
    CHECK_MESSAGE(contains(again, " UTC, "), again);
  }
  // Reopened: caught up to the other's version 1, it publishes 2 on it.
  hfdelta::MemoryPublisher p(root, mirror, o);
  CHECK(p.version() == 1);
  give(p, save_dir(s, 3));
  CHECK(p.publish(true).out == version_dir(root, 2));
  const fs::path host = t / "host";
  require_init(save_dir(s, 0), host);
  pull(root, host);
  E2E_CHECK_TREE_EQUAL(host, save_dir(s, 3));
}

TEST_CASE("commit: a sharded version whose base was withdrawn is refused for that reason, at the commit") {
  TempDir t;
  const fs::path s = gen_series(t / "series", 3);
  const fs::path root = t / "root", mirror = t / "mirror";
  publish_two(s, root);
  require_init(save_dir(s, 2), mirror, "2");
  const hfdelta::Checkpoint next = hfdelta::open_checkpoint(save_dir(s, 3));
  const fs::path stage = hfdelta::make_shard_stage(root, 3);
  std::vector<hfdelta::ShardPart> parts;
  {
    hfdelta::ShardWriter w(mirror, stage, 0, hfdelta::Encoding::sparse, 3);
    for (const auto& sh : next.shards) {
      const hfdelta::MappedFile m(save_dir(s, 3) / sh.file);
      for (const auto& ti : sh.header.tensors) {
        const hfdelta::MatrixShape ms = hfdelta::matrix_shape(ti.shape, hfdelta::dtype_size(ti.dtype));
        w.put(ti.name, ti.dtype, ti.shape, hfdelta::Region{0, ms.rows, 0, ms.cols},
              m.bytes(sh.header.file_offset(ti), ti.nbytes()));
      }
    }
    parts = w.finish(false);
  }
  REQUIRE(!parts.empty());
  hfdelta::withdraw_version(version_dir(root, 2), false);
  std::string msg;
  const int code = code_of([&] {
    try {
      hfdelta::commit_sharded(root, mirror, stage, 3, 2, parts, false);
    } catch (const hfdelta::Error& e) {
      msg = e.what();
      throw;
    }
  });
  CHECK(code == kOutOfOrder);
  CHECK_MESSAGE(contains(msg, "was withdrawn"), msg);
  CHECK_MESSAGE(!contains(msg, "another publisher"), msg);
  CHECK(!fs::exists(version_dir(root, 3)));
}

TEST_CASE("commit: a version withdrawn while a host applies it is rolled back at the host's commit") {
  TempDir t;
  const fs::path s = gen_series(t / "series", 3);
  const fs::path seed = t / "seed";
  publish_two(s, seed);
  int rolled_back = 0;
  sweep_steps([&](long step) {
    CAPTURE(step);
    const fs::path root = t / ("root-" + std::to_string(step)), local = t / ("host-" + std::to_string(step));
    copy_tree(seed, root);
    require_init(save_dir(s, 0), local);
    const Signalled p = hold_at_step({apply_bin(), "--no-sync", "--root", root.string(), local.string()}, step, [&] {
      E2E_REQUIRE_CODE(diff({"-q", "--no-sync", "--withdraw", version_dir(root, 2).string()}), 0);
    });
    if (!p.paused) return false;
    INFO(p.err);
    if (p.code == 0) {
      CHECK(state_version(local) == "000002");  // committed before the withdrawal
    } else {
      ++rolled_back;
      CHECK(p.code == kOutOfOrder);
      CHECK(contains(p.err, "withdrawn"));
      // Never left holding the withdrawn version: at 1 (committed before) or 0, clean.
      CHECK(state_version(local) != "000002");
      E2E_CHECK_CODE(apply({"--status", local.string()}), 0);
      // The next poll skips it: at version 1, byte for byte save 1.
      pull(root, local);
      CHECK(state_version(local) == "000001");
      E2E_CHECK_TREE_EQUAL(local, save_dir(s, 1));
    }
    fs::remove_all(root);
    fs::remove_all(local);
    return true;
  });
  CHECK(rolled_back > 0);
}
