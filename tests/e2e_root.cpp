// End-to-end: delta-apply --root, pulling from a publication root of full and
// delta versions.
#include <doctest/doctest.h>

#include <cstdio>

#include "e2e_util.hpp"

using namespace e2e;

namespace {

#define CHECK_ERR_MENTIONS(res, text) \
  CHECK_MESSAGE(contains((res).err, (text)), "stderr should mention \"" << (text) << "\"\n" << (res).describe())

// A full version: a plain copy of a checkpoint (its index has no delta_encoding).
void publish_full(const fs::path& root, int v, const fs::path& src) {
  copy_tree(src, version_dir(root, v));
  if (fs::exists(version_dir(root, v) / "model.safetensors.index.json"))
    REQUIRE_FALSE(delta_index(version_dir(root, v))["metadata"].contains("delta_encoding"));
}

void publish_delta(const fs::path& root, int v, const fs::path& base, const fs::path& target,
                   const std::string& encoding = "xor") {
  const RunResult r =
      diff({"-q", "--encoding", encoding, base.string(), target.string(), version_dir(root, v).string()});
  E2E_REQUIRE_CODE(r, 0);
}

json versions(std::initializer_list<const char*> v) {
  json a = json::array();
  for (const char* s : v) a.push_back(s);
  return a;
}

}  // namespace

TEST_CASE("--root from a fresh LOCAL: full version 1, then deltas 2..4") {
  TempDir t;
  const fs::path s = gen_series(t / "series", 4, {"--max-shard-size", "600KB"});
  const fs::path root = t / "root";
  fs::create_directories(root);
  publish_full(root, 1, save_dir(s, 1));
  for (int v = 2; v <= 4; ++v) publish_delta(root, v, save_dir(s, v - 1), save_dir(s, v), v == 3 ? "overwrite" : "xor");

  fs::path local;
  SUBCASE("LOCAL does not exist yet: refused, creating nothing, until the host creates it") {
    local = t / "new-host" / "model";
    const RunResult r = apply({"--root", root.string(), local.string()});
    E2E_CHECK_CODE(r, 4);
    CHECK_ERR_MENTIONS(r, "--init");
    CHECK_FALSE(fs::exists(t / "new-host"));
    fs::create_directories(local);
  }
  SUBCASE("LOCAL is an empty directory") {
    local = t / "local";
    fs::create_directories(local);
  }
  const json j = pull(root, local);
  CHECK(j["from_version"].is_null());
  CHECK(j["to_version"] == "000004");
  CHECK(j["applied"] == versions({"000001", "000002", "000003", "000004"}));
  CHECK(j["noop"] == false);
  CHECK(j["tensors_patched"].get<std::uint64_t>() > 0);
  E2E_CHECK_TREE_EQUAL(local, save_dir(s, 4));
  CHECK(state_json(local) == json{{"version", "000004"}});
}

TEST_CASE("--root --target 2 stops at 2; a later run without --target continues to the newest") {
  TempDir t;
  const fs::path s = gen_series(t / "series", 4, {"--max-shard-size", "600KB"});
  const fs::path root = t / "root", local = t / "local";
  fs::create_directories(root);
  publish_full(root, 1, save_dir(s, 1));
  for (int v = 2; v <= 4; ++v) publish_delta(root, v, save_dir(s, v - 1), save_dir(s, v));

  const json a = pull(root, local, {"--target", "2"});
  CHECK(a["to_version"] == "000002");
  CHECK(a["applied"] == versions({"000001", "000002"}));
  CHECK(state_json(local) == json{{"version", "000002"}});
  E2E_CHECK_TREE_EQUAL(local, save_dir(s, 2));

  const json b = pull(root, local);
  CHECK(b["from_version"] == "000002");
  CHECK(b["to_version"] == "000004");
  CHECK(b["applied"] == versions({"000003", "000004"}));
  CHECK(state_json(local) == json{{"version", "000004"}});
  E2E_CHECK_TREE_EQUAL(local, save_dir(s, 4));
}

TEST_CASE("a full version in the middle of the chain: LOCAL at 1 jumps to 3 by copy, then applies 4") {
  TempDir t;
  const fs::path s = gen_series(t / "series", 4, {"--max-shard-size", "600KB"});
  const fs::path root = t / "root", local = t / "local";
  fs::create_directories(root);
  publish_delta(root, 1, save_dir(s, 0), save_dir(s, 1));
  publish_delta(root, 2, save_dir(s, 1), save_dir(s, 2));
  // The full version 3 lacks a file LOCAL has (tokenizer_config.json); delta 4 brings it back.
  publish_full(root, 3, save_dir(s, 3));
  fs::remove(version_dir(root, 3) / "tokenizer_config.json");
  publish_delta(root, 4, version_dir(root, 3), save_dir(s, 4));

  E2E_REQUIRE_CODE(apply({"-q", "--init", save_dir(s, 0).string(), local.string()}), 0);
  E2E_REQUIRE_CODE(apply({"-q", version_dir(root, 1).string(), local.string()}), 0);
  REQUIRE(state_version(local) == "000001");
  write_file(local / "stale" / "notes.txt", "a file the full version does not have\n");
  write_file(local / ".weight_sync" / "keep.txt", "kept\n");

  SUBCASE("in two runs: to the full version, then on") {
    const json a = pull(root, local, {"--target", "3"});
    CHECK(a["from_version"] == "000001");
    CHECK(a["applied"] == versions({"000003"}));
    E2E_CHECK_TREE_EQUAL(local, version_dir(root, 3));
    CHECK_FALSE(fs::exists(local / "stale" / "notes.txt"));
    CHECK_FALSE(fs::exists(local / "tokenizer_config.json"));
    CHECK(state_json(local) == json{{"version", "000003"}});
    const json b = pull(root, local);
    CHECK(b["applied"] == versions({"000004"}));
  }
  SUBCASE("in one run") {
    const json a = pull(root, local);
    CHECK(a["from_version"] == "000001");
    CHECK(a["applied"] == versions({"000003", "000004"}));
  }
  E2E_CHECK_TREE_EQUAL(local, save_dir(s, 4));
  CHECK_FALSE(fs::exists(local / "stale" / "notes.txt"));
  CHECK(state_json(local) == json{{"version", "000004"}});
  CHECK(read_file(local / ".weight_sync" / "keep.txt") == "kept\n");
}

TEST_CASE("a full version directory given as DELTA resets LOCAL to it, as --init does") {
  TempDir t;
  const fs::path s = gen_series(t / "series", 2, {"--max-shard-size", "600KB"});
  const fs::path root = t / "root", local = t / "local";
  fs::create_directories(root);
  publish_full(root, 2, save_dir(s, 2));
  E2E_REQUIRE_CODE(apply({"-q", "--init", save_dir(s, 0).string(), local.string()}), 0);
  write_file(local / "extra.txt", "not in the full version\n");
  const RunResult r = apply({"--json", version_dir(root, 2).string(), local.string()});
  E2E_REQUIRE_CODE(r, 0);
  CHECK(parse_json(r.out)["applied"] == versions({"000002"}));
  E2E_CHECK_TREE_EQUAL(local, save_dir(s, 2));
  CHECK(state_json(local) == json{{"version", "000002"}});
}

TEST_CASE("a version missing from the chain: exit 4 and LOCAL unchanged") {
  TempDir t;
  const fs::path s = gen_series(t / "series", 4, {"--max-shard-size", "600KB"});
  const fs::path root = t / "root", local = t / "local";
  fs::create_directories(root);
  E2E_REQUIRE_CODE(apply({"-q", "--init", save_dir(s, 0).string(), local.string()}), 0);
  std::vector<std::string> extra;
  std::string missing;
  SUBCASE("the next version (1) is missing") {
    publish_delta(root, 2, save_dir(s, 1), save_dir(s, 2));
    publish_delta(root, 3, save_dir(s, 2), save_dir(s, 3));
    missing = "000001";
  }
  SUBCASE("a version in the middle (3) is missing") {
    publish_delta(root, 1, save_dir(s, 0), save_dir(s, 1));
    publish_delta(root, 2, save_dir(s, 1), save_dir(s, 2));
    publish_delta(root, 3, save_dir(s, 2), save_dir(s, 3));
    publish_delta(root, 4, save_dir(s, 3), save_dir(s, 4));
    fs::remove_all(version_dir(root, 3));  // lost: delta-diff publishes only the next version
    missing = "000003";
  }
  SUBCASE("the target is not published") {
    publish_delta(root, 1, save_dir(s, 0), save_dir(s, 1));
    publish_delta(root, 2, save_dir(s, 1), save_dir(s, 2));
    extra = {"--target", "5"};
    missing = "000005";
  }
  SUBCASE("ROOT is empty and a --target given") {  // without --target, an empty root is a no-op (e2e_publish.cpp)
    extra = {"--target", "1"};
    missing = "000001";
  }
  const LocalSnapshot snap(local);
  std::vector<std::string> args{"--root", root.string()};
  args.insert(args.end(), extra.begin(), extra.end());
  args.push_back(local.string());
  const RunResult r = apply(args);
  E2E_CHECK_CODE(r, 4);
  CHECK_ERR_MENTIONS(r, missing);
  E2E_CHECK_UNCHANGED(snap);
  CHECK(state_json(local) == json{{"version", "000000"}});
}

TEST_CASE("a target older than LOCAL: exit 4 and LOCAL unchanged") {
  TempDir t;
  const fs::path s = gen_series(t / "series", 3);
  const fs::path root = t / "root", local = t / "local";
  fs::create_directories(root);
  for (int v = 1; v <= 3; ++v) publish_delta(root, v, save_dir(s, v - 1), save_dir(s, v));
  E2E_REQUIRE_CODE(apply({"-q", "--init", save_dir(s, 0).string(), local.string()}), 0);
  pull(root, local);
  REQUIRE(state_version(local) == "000003");
  const LocalSnapshot snap(local);
  const RunResult r = apply({"--root", root.string(), "--target", "1", local.string()});
  E2E_CHECK_CODE(r, 4);
  CHECK_ERR_MENTIONS(r, "000003");
  E2E_CHECK_UNCHANGED(snap);
}

TEST_CASE("LOCAL already at the newest version: exit 0, noop, nothing changed") {
  TempDir t;
  const fs::path s = gen_series(t / "series", 2);
  const fs::path root = t / "root", local = t / "local";
  fs::create_directories(root);
  for (int v = 1; v <= 2; ++v) publish_delta(root, v, save_dir(s, v - 1), save_dir(s, v));
  E2E_REQUIRE_CODE(apply({"-q", "--init", save_dir(s, 0).string(), local.string()}), 0);
  pull(root, local);
  const LocalSnapshot snap(local);
  const json j = pull(root, local);
  CHECK(j["noop"] == true);
  CHECK(j["from_version"] == "000002");
  CHECK(j["to_version"] == "000002");
  CHECK(j["applied"] == json::array());
  CHECK(j["tensors_patched"] == 0);
  E2E_CHECK_UNCHANGED(snap);
  // -q prints nothing.
  const RunResult q = apply({"-q", "--root", root.string(), local.string()});
  E2E_CHECK_CODE(q, 0);
  CHECK(q.out.empty());
}

TEST_CASE("temporary directories of a publication in progress are ignored") {
  TempDir t;
  const fs::path s = gen_series(t / "series", 4, {"--max-shard-size", "600KB"});
  const fs::path root = t / "root", local = t / "local";
  fs::create_directories(root);
  for (int v = 1; v <= 3; ++v) publish_delta(root, v, save_dir(s, v - 1), save_dir(s, v));
  // A half-written delta 4 under delta-diff's hidden name (its index cut short),
  // an empty hidden version 5, and a hidden full copy 6.
  publish_delta(t / "root", 4, save_dir(s, 3), save_dir(s, 4));
  fs::rename(version_dir(root, 4), root / ".weight_v000004.tmp-1a2b3c4d");
  const fs::path half = root / ".weight_v000004.tmp-1a2b3c4d" / "model.safetensors.index.json";
  const std::string text = read_file(half);
  write_file(half, text.substr(0, text.size() / 3));
  fs::create_directories(root / ".weight_v000005.tmp-deadbeef");
  copy_tree(save_dir(s, 4), root / ".weight_v000006.tmp");

  E2E_REQUIRE_CODE(apply({"-q", "--init", save_dir(s, 0).string(), local.string()}), 0);
  const json j = pull(root, local);
  CHECK(j["to_version"] == "000003");
  CHECK(j["applied"] == versions({"000001", "000002", "000003"}));
  E2E_CHECK_TREE_EQUAL(local, save_dir(s, 3));
  CHECK(state_json(local) == json{{"version", "000003"}});
}

TEST_CASE("a fresh LOCAL and a ROOT of deltas only: exit 4, the message points to --init") {
  TempDir t;
  const fs::path s = gen_series(t / "series", 2);
  const fs::path root = t / "root", local = t / "local";
  fs::create_directories(root);
  fs::create_directories(local);
  for (int v = 1; v <= 2; ++v) publish_delta(root, v, save_dir(s, v - 1), save_dir(s, v));
  const LocalSnapshot snap(local);
  const RunResult r = apply({"--root", root.string(), local.string()});
  E2E_CHECK_CODE(r, 4);
  CHECK_ERR_MENTIONS(r, "--init");
  E2E_CHECK_UNCHANGED(snap);
  CHECK_FALSE(fs::exists(local / ".weight_sync" / "state.json"));
}
