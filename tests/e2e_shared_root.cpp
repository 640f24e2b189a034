// End-to-end: a publication root as shared storage sees it. Completion
// markers (a version still arriving is "not published yet", a damaged one is
// exit 3), full versions published by delta-diff with the delta beside them,
// the pull that reads fewer bytes, the hooks, and prune keeping what hosts need.
#include <doctest/doctest.h>

#include <signal.h>

#include "e2e_util.hpp"

using namespace e2e;

namespace {

#define CHECK_ERR_MENTIONS(res, text) \
  CHECK_MESSAGE(contains((res).err, (text)), "stderr should mention \"" << (text) << "\"\n" << (res).describe())

fs::path sidecar_dir(const fs::path& root, int v) { return root / ("delta_v" + v6(v)); }

// A root of `n` versions of series `s`: deltas, but version `full` (if any)
// published with --full BASE NEW (the full version and the delta beside it).
void publish_series(const fs::path& s, const fs::path& root, int n, int full) {
  fs::create_directories(root);
  for (int v = 1; v <= n; ++v) {
    std::vector<std::string> args{"-q", save_dir(s, v - 1).string(), save_dir(s, v).string(), root.string()};
    if (v == full) args.insert(args.begin(), "--full");
    E2E_REQUIRE_CODE(diff(args), 0);
  }
}

json marker(const fs::path& dir) { return read_json(dir / "hfdelta_complete.json"); }

// Full version `dir` holds exactly checkpoint `save`'s files, and its marker.
void check_full_version(const fs::path& dir, const fs::path& save) {
  TempDir t;
  copy_tree(dir, t / "copy");
  REQUIRE(fs::remove(t / "copy" / "hfdelta_complete.json"));
  E2E_CHECK_TREE_EQUAL(t / "copy", save);
}

// delta-apply --root, failing or not; LOCAL must exist.
RunResult pull_raw(const fs::path& root, const fs::path& local, const std::vector<std::string>& extra = {}) {
  std::vector<std::string> args{"--json", "--root", root.string()};
  args.insert(args.end(), extra.begin(), extra.end());
  args.push_back(local.string());
  return apply(args);
}

}  // namespace

TEST_CASE(
    "--full BASE NEW ROOT: the delta beside the full version first, both with markers; hosts take the cheaper path") {
  TempDir t;
  const fs::path s = gen_series(t / "series", 6, {"--lr", "1e-3"});
  const fs::path root = t / "root";
  publish_series(s, root, 3, 0);
  const RunResult r =
      diff({"--json", "--full", save_dir(s, 3).string(), save_dir(s, 4).string(), root.string(), "--post-publish",
            "echo \"$HFDELTA_NAME $HFDELTA_VERSION $HFDELTA_ROOT\" >> " + (t / "hooks").string() +
                "; test -f \"$HFDELTA_VERSION_PATH/hfdelta_complete.json\""});
  E2E_REQUIRE_CODE(r, 0);
  const json j = parse_json(r.out);
  CHECK(j["version"] == "000004");
  CHECK(j["full"] == true);
  CHECK(j["sidecar"]["out"] == sidecar_dir(root, 4).string());
  CHECK(j["sidecar"]["base_version"] == "000003");
  // The hook ran for each directory once it was published, the delta first.
  CHECK(read_file(t / "hooks") ==
        "delta_v000004 000004 " + root.string() + "\nweight_v000004 000004 " + root.string() + "\n");
  for (int v = 5; v <= 6; ++v)
    E2E_REQUIRE_CODE(diff({"-q", save_dir(s, v - 1).string(), save_dir(s, v).string(), root.string()}), 0);

  // The full version is an ordinary checkpoint plus its marker; the delta beside it is version 4 on 3.
  check_full_version(version_dir(root, 4), save_dir(s, 4));
  CHECK(marker(version_dir(root, 4))["kind"] == "full");
  CHECK(marker(version_dir(root, 4))["files"].size() == list_files(save_dir(s, 4)).size());
  CHECK(marker(sidecar_dir(root, 4))["kind"] == "delta");
  CHECK(delta_index(sidecar_dir(root, 4))["metadata"]["base_version"] == "000003");
  CHECK(marker(version_dir(root, 1))["version"] == "000001");

  SUBCASE("a host one version behind the full version fetches only the delta beside it") {
    const fs::path local = t / "near";
    require_init(save_dir(s, 3), local, "3");
    const json p = pull(root, local);
    CHECK(p["full_copied"].is_null());
    CHECK(p["sidecars_applied"] == 1);
    CHECK(p["applied"] == json::array({"000004", "000005", "000006"}));
    CHECK(p["root_bytes"].get<std::uint64_t>() < tree_size(version_dir(root, 4)));
    E2E_CHECK_TREE_EQUAL(local, save_dir(s, 6));
  }
  SUBCASE("a new host starts from the full copy") {
    const json p = pull(root, t / "new");
    CHECK(p["full_copied"] == "000004");
    CHECK(p["applied"] == json::array({"000004", "000005", "000006"}));
    E2E_CHECK_TREE_EQUAL(t / "new", save_dir(s, 6));
  }
  SUBCASE("a host far behind starts from the full copy when that reads fewer bytes") {
    const fs::path local = t / "far";
    require_init(save_dir(s, 0), local, "0");
    std::uint64_t deltas = 0;
    for (int v = 1; v <= 6; ++v) deltas += tree_size(v == 4 ? sidecar_dir(root, 4) : version_dir(root, v));
    const std::uint64_t full =
        tree_size(version_dir(root, 4)) + tree_size(version_dir(root, 5)) + tree_size(version_dir(root, 6));
    REQUIRE(full < deltas);  // the series is made so: large steps
    const json p = pull(root, local);
    CHECK(p["full_copied"] == "000004");
    CHECK(p["root_bytes"] == full);
    E2E_CHECK_TREE_EQUAL(local, save_dir(s, 6));
  }
  SUBCASE("a reader of the plain slime layout (no delta_v*) copies the full version, as before") {
    fs::remove_all(sidecar_dir(root, 4));
    const fs::path local = t / "plain";
    require_init(save_dir(s, 3), local, "3");
    const json p = pull(root, local);
    CHECK(p["full_copied"] == "000004");
    E2E_CHECK_TREE_EQUAL(local, save_dir(s, 6));
  }
  SUBCASE("--prune keeps the full version and the delta beside it, removes what is older") {
    const RunResult pr = diff({"--json", "--prune", root.string()});
    E2E_REQUIRE_CODE(pr, 0);
    CHECK(list_names(root) ==
          std::vector<std::string>{"delta_v000004", "weight_v000004", "weight_v000005", "weight_v000006"});
    const fs::path local = t / "after-prune";
    require_init(save_dir(s, 3), local, "3");
    CHECK(pull(root, local)["sidecars_applied"] == 1);
    E2E_CHECK_TREE_EQUAL(local, save_dir(s, 6));
  }
}

TEST_CASE("--full NEW ROOT: a full version alone; refused sources create nothing") {
  TempDir t;
  const fs::path s = gen_series(t / "series", 2);
  const fs::path root = t / "root";
  publish_series(s, root, 1, 0);
  E2E_REQUIRE_CODE(diff({"-q", "--full", save_dir(s, 2).string(), root.string()}), 0);
  CHECK_FALSE(fs::exists(sidecar_dir(root, 2)));
  check_full_version(version_dir(root, 2), save_dir(s, 2));
  const Snapshot before = snapshot(root);
  E2E_CHECK_CODE(diff({"--full", version_dir(root, 1).string(), root.string()}), 3);            // a delta
  E2E_CHECK_CODE(diff({"--full", (t / "missing").string(), root.string()}), 2);                 // no such path
  E2E_CHECK_CODE(diff({"--full", save_dir(s, 2).string(), version_dir(root, 2).string()}), 7);  // exists
  E2E_CHECK_CODE(diff({"--full", save_dir(s, 2).string(), version_dir(root, 4).string()}), 4);  // not next
  CHECK(snapshot(root) == before);
}

TEST_CASE("a version still arriving is not published yet; a damaged complete one is exit 3") {
  TempDir t;
  const fs::path s = gen_series(t / "series", 3);
  const fs::path root = t / "root", staged = t / "staged";
  publish_series(s, root, 2, 0);
  fs::create_directories(staged);
  E2E_REQUIRE_CODE(diff({"-q", save_dir(s, 2).string(), save_dir(s, 3).string(), (staged / "weight_v000003").string()}),
                   0);
  const fs::path local = t / "local";
  require_init(save_dir(s, 0), local, "0");
  REQUIRE(pull(root, local)["to_version"] == "000002");
  const fs::path v3 = version_dir(root, 3);
  const std::string weights = "model-00000-of-00001.safetensors";

  auto not_yet = [&](const std::string& why, const std::vector<std::string>& extra = {}) {
    LocalSnapshot ls(local);
    const RunResult r = pull_raw(root, local, extra);
    E2E_CHECK_CODE(r, 0);
    const json j = parse_json(r.out);
    CHECK(j["noop"] == true);
    CHECK(j["to_version"] == "000002");
    CHECK(j["not_published_yet"] == "000003");
    CHECK_MESSAGE(contains(j["waiting_for"].get<std::string>(), why), j.dump());
    E2E_CHECK_UNCHANGED(ls);
    std::vector<std::string> human{"--root", root.string(), local.string()};
    human.insert(human.end(), extra.begin(), extra.end());
    const RunResult h = apply(human);
    CHECK(contains(h.out, "version 000003 is not published yet"));
  };
  SUBCASE("marker there, a file it lists missing (objects arrive in any order)") {
    copy_tree(staged / "weight_v000003", v3);
    fs::remove(v3 / weights);
    not_yet(weights + " is not there yet");
    SUBCASE("or still short") {
      write_bytes(v3 / weights, Bytes(100, 0));
      not_yet(weights + " (100 of");
    }
  }
  SUBCASE("every file there but the marker, with --require-marker") {
    copy_tree(staged / "weight_v000003", v3);
    fs::remove(v3 / "hfdelta_complete.json");
    not_yet("hfdelta_complete.json", {"--require-marker"});
  }
  SUBCASE("--require-marker in a root whose versions have none") {
    for (int v = 1; v <= 2; ++v) fs::remove(version_dir(root, v) / "hfdelta_complete.json");
    copy_tree(staged / "weight_v000003", v3);
    fs::remove(v3 / "hfdelta_complete.json");
    not_yet("hfdelta_complete.json", {"--require-marker"});
    // Without the flag, versions without markers are taken as they are (the plain slime layout).
    CHECK(pull(root, local)["to_version"] == "000003");
    return;
  }
  SUBCASE("--target the version still arriving") {
    copy_tree(staged / "weight_v000003", v3);
    fs::remove(v3 / weights);
    not_yet("not there yet", {"--target", "3"});
  }
  // Once the upload finishes, the next run applies it.
  fs::remove_all(v3);
  copy_tree(staged / "weight_v000003", v3);
  CHECK(pull(root, local)["to_version"] == "000003");
  E2E_CHECK_TREE_EQUAL(local, save_dir(s, 3));
}

TEST_CASE("damaged complete versions: a delta, and a full version a new host copies, are exit 3 with LOCAL unchanged") {
  TempDir t;
  const fs::path s = gen_series(t / "series", 3);
  const fs::path root = t / "root";
  publish_series(s, root, 3, 2);
  auto flip = [](const fs::path& p) {
    Bytes b = read_bytes(p);
    b[b.size() - 3] ^= 0x40;
    write_bytes(p, b);
  };
  SUBCASE("a delta: same size, other bytes") {
    const fs::path local = t / "local";
    require_init(save_dir(s, 2), local, "2");
    flip(version_dir(root, 3) / "model-00000-of-00001.safetensors");
    LocalSnapshot ls(local);
    const RunResult r = pull_raw(root, local);
    E2E_CHECK_CODE(r, 3);  // found by the delta's own checks, as without a marker
    E2E_CHECK_UNCHANGED(ls);
  }
  SUBCASE("a full version's weight file") {
    const fs::path local = t / "new";
    fs::create_directories(local);
    for (const auto& f : list_files(version_dir(root, 2)))
      if (f.size() > 12 && f.substr(f.size() - 12) == ".safetensors") flip(version_dir(root, 2) / f);
    LocalSnapshot ls(local);
    const RunResult r = pull_raw(root, local);
    E2E_CHECK_CODE(r, 3);
    CHECK_ERR_MENTIONS(r, "damaged");
    E2E_CHECK_UNCHANGED(ls);
  }
}

TEST_CASE(
    "hooks: --post-publish failure exits 13 with the version published; --pre-read runs first, failure exits 14") {
  TempDir t;
  const fs::path s = gen_series(t / "series", 3);
  const fs::path root = t / "root";
  publish_series(s, root, 1, 0);

  SUBCASE("--post-publish fails after a delta: exit 13, the version stays published") {
    const RunResult r =
        diff({save_dir(s, 1).string(), save_dir(s, 2).string(), root.string(), "--post-publish", "exit 5"});
    E2E_CHECK_CODE(r, 13);
    CHECK_ERR_MENTIONS(r, "--post-publish command failed (exit status 5)");
    CHECK(fs::exists(version_dir(root, 2) / "hfdelta_complete.json"));
  }
  SUBCASE(
      "--post-publish fails on the delta beside a full version: the full one is not published; a re-run "
      "keeps that delta and finishes") {
    const std::vector<std::string> args{"--full",
                                        save_dir(s, 1).string(),
                                        save_dir(s, 2).string(),
                                        root.string(),
                                        "--post-publish",
                                        "test \"$HFDELTA_NAME\" != delta_v000002 || test -f " + (t / "ok").string()};
    E2E_CHECK_CODE(diff(args), 13);
    CHECK(fs::exists(sidecar_dir(root, 2)));
    CHECK_FALSE(fs::exists(version_dir(root, 2)));
    const std::string index = read_file(sidecar_dir(root, 2) / "model.safetensors.index.json");
    write_file(t / "ok", "");
    E2E_CHECK_CODE(diff(args), 0);
    CHECK(read_file(sidecar_dir(root, 2) / "model.safetensors.index.json") == index);
    check_full_version(version_dir(root, 2), save_dir(s, 2));
  }
  SUBCASE("a delta beside version N from another publisher: exit 7, nothing replaced") {
    E2E_REQUIRE_CODE(diff({"-q", save_dir(s, 0).string(), save_dir(s, 2).string(), sidecar_dir(root, 2).string(),
                           "--delta-version", "2", "--base-version", "1"}),
                     0);
    const Snapshot before = snapshot(root);
    const RunResult r = diff({"--full", save_dir(s, 1).string(), save_dir(s, 2).string(), root.string()});
    E2E_CHECK_CODE(r, 7);
    CHECK_ERR_MENTIONS(r, "another delta");
    CHECK(snapshot(root) == before);
  }
  SUBCASE("--pre-read runs before ROOT is read, with HFDELTA_ROOT and HFDELTA_LOCAL") {
    const fs::path local = t / "local";
    require_init(save_dir(s, 0), local, "0");
    // The hook brings version 2 into the root, as a sync from an object store would.
    fs::create_directories(t / "remote");
    E2E_REQUIRE_CODE(
        diff({"-q", save_dir(s, 1).string(), save_dir(s, 2).string(), (t / "remote" / "weight_v000002").string()}), 0);
    const RunResult r =
        pull_raw(root, local,
                 {"--pre-read", "test \"$HFDELTA_LOCAL\" = " + local.string() + " && cp -r " +
                                    (t / "remote" / "weight_v000002").string() + " \"$HFDELTA_ROOT\"/"});
    E2E_REQUIRE_CODE(r, 0);
    CHECK(parse_json(r.out)["to_version"] == "000002");
  }
  SUBCASE("--pre-read fails: exit 14, LOCAL untouched, ROOT not read") {
    const fs::path local = t / "local";
    require_init(save_dir(s, 0), local, "0");
    LocalSnapshot ls(local);
    const RunResult r = pull_raw(root, local, {"--pre-read", "exit 3"});
    E2E_CHECK_CODE(r, 14);
    CHECK_ERR_MENTIONS(r, "--pre-read command failed (exit status 3)");
    E2E_CHECK_UNCHANGED(ls);
  }
}

TEST_CASE(
    "a newer version published while delta-diff ROOT writes: the slower publisher exits 7, the root stays consistent") {
  TempDir t;
  const fs::path s = gen_series(t / "series", 3);
  const fs::path root = t / "root";
  publish_series(s, root, 1, 0);
  // Stopped at its first write step, version 2 already chosen; meanwhile another publisher takes 2.
  const Signalled r =
      signal_at_step({diff_bin(), save_dir(s, 1).string(), save_dir(s, 2).string(), root.string()}, 1, SIGCONT, [&] {
        // Not paused itself: the fault variables are for the first one only.
        E2E_REQUIRE_CODE(run({"/usr/bin/env", "-u", "HFDELTA_FAULT_AT", "-u", "HFDELTA_FAULT_MODE", diff_bin(), "-q",
                              save_dir(s, 1).string(), save_dir(s, 2).string(), root.string()}),
                         0);
      });
  REQUIRE(r.paused);
  CHECK(r.code == 7);
  CHECK(contains(r.err, "weight_v000002"));
  CHECK(list_names(root) == std::vector<std::string>{"weight_v000001", "weight_v000002"});
  const fs::path local = t / "local";
  require_init(save_dir(s, 0), local, "0");
  CHECK(pull(root, local)["to_version"] == "000002");
  E2E_CHECK_TREE_EQUAL(local, save_dir(s, 2));
}
