// The model of a publication root every reader asks (src/root/root_view.hpp):
// which versions are complete, which full, what a pull waits for, and where
// a pull (and so a prune) may start. Version directories are laid out by
// hand: an index with a delta key makes a delta, a marker listing a file
// that is not there makes a version still arriving.
#include <doctest/doctest.h>

#include <fstream>

#include "format/completion_marker.hpp"
#include "hfdelta/version.hpp"
#include "root/root_view.hpp"
#include "unit_util.hpp"
#include "util/io.hpp"

namespace fs = boost::filesystem;
using namespace hfdelta;

namespace {

void put(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p.string()) << text;
}

// Version `v` of ROOT: a delta on `v - 1`, or a full version; complete, or
// with its marker listing a weight file that has not arrived.
fs::path version(const fs::path& root, std::uint64_t v, bool delta, bool complete = true) {
  const fs::path d = root / version_dirname(v);
  put(d / "model.safetensors",
      "weights " + std::to_string(v));  // not read: the model looks at names, indexes and markers
  if (delta)
    put(d / "model.safetensors.index.json", R"({"metadata": {"delta_encoding": "xor", "version": ")" +
                                                format_version(v) + R"(", "base_version": ")" + format_version(v - 1) +
                                                R"("}, "weight_map": {}})");
  write_marker(d, v, !delta, false, 1);
  if (!complete) fs::remove(d / "model.safetensors");
  return d;
}

std::vector<std::uint64_t> numbers(const std::vector<VersionDir>& v) {
  std::vector<std::uint64_t> out;
  for (const VersionDir& d : v) out.push_back(d.version);
  return out;
}

}  // namespace

TEST_CASE("root view: complete versions up to the first still arriving, full versions, sidecars, withdrawn") {
  unit::TempDir t;
  const fs::path root = t.path();
  version(root, 1, true);
  version(root, 2, false);
  put(root / sidecar_dirname(2) / "model.safetensors", "the delta 1 -> 2");
  version(root, 3, true, false);  // still arriving
  version(root, 4, false);
  version(root, 5, true);
  fs::create_directory(root / withdrawn_dirname(6));

  const RootView v = view_root(root, std::nullopt, false);
  CHECK(numbers(v.all) == std::vector<std::uint64_t>{1, 2, 3, 4, 5});
  CHECK(numbers(v.versions) == std::vector<std::uint64_t>{1, 2});
  CHECK(v.incomplete == 3u);
  CHECK(unit::contains(v.waiting_for, "model.safetensors"));
  CHECK(numbers(v.beyond) == std::vector<std::uint64_t>{4, 5});
  CHECK(v.newest() == 5u);
  CHECK(v.newest_complete() == 5u);
  CHECK(v.withdrawn == std::set<std::uint64_t>{6});
  CHECK(v.sidecars.count(2) == 1);
  CHECK(v.is_complete(2));
  CHECK_FALSE(v.is_complete(3));
  CHECK(v.is_complete(4));
  CHECK(v.is_full(v.all[1]));
  CHECK_FALSE(v.is_full(v.all[0]));

  // Where a pull to N may start, and so what a prune keeping N keeps: the
  // newest complete full version at or below N.
  CHECK(v.newest_full(1) == nullptr);
  REQUIRE(v.newest_full(3) != nullptr);
  CHECK(v.newest_full(3)->version == 2);
  REQUIRE(v.newest_full(100) != nullptr);
  CHECK(v.newest_full(100)->version == 4);
}

TEST_CASE("root view: versions at or below LOCAL's are not looked at") {
  unit::TempDir t;
  const fs::path root = t.path();
  version(root, 1, true, false);  // arriving, but LOCAL is past it
  version(root, 2, true);
  const RootView v = view_root(root, 1, false);
  CHECK(numbers(v.versions) == std::vector<std::uint64_t>{2});
  CHECK_FALSE(v.incomplete);
  CHECK(v.newest_complete() == 2u);
  CHECK(view_root(root, 2, false).newest_complete() == std::nullopt);
  CHECK(view_root(root, std::nullopt, false).incomplete == 1u);
}

TEST_CASE("root view: a version without a marker is complete unless markers are required") {
  unit::TempDir t;
  const fs::path root = t.path();
  put(root / version_dirname(1) / "model.safetensors", "a plain slime-layout version");
  CHECK(numbers(view_root(root, std::nullopt, false).versions) == std::vector<std::uint64_t>{1});
  const RootView strict = view_root(root, std::nullopt, true);
  CHECK(strict.versions.empty());
  CHECK(strict.incomplete == 1u);
}

TEST_CASE("root view: a delta whose index does not convert is never taken for a full version") {
  unit::TempDir t;
  const fs::path root = t.path();
  version(root, 1, false);
  const fs::path d = version(root, 2, true);
  put(d / "model.safetensors.index.json", R"({"metadata": {"delta_encoding": "no such encoding"}})");
  fs::remove(d / kCompleteFile);  // the marker would list the old index's checksum
  const RootView v = view_root(root, std::nullopt, false);
  CHECK(unit::error_of([&] { v.index_of(v.all[1]); }));
  CHECK_FALSE(v.is_full(v.all[1]));
  CHECK_FALSE(v.is_full_version(v.all[1], false));
  CHECK(v.is_full_version(v.all[0], false));
  // A pull to 2 stops at the damaged index with its error, as a pull reads it.
  const auto e = unit::error_of([&] { v.newest_full(2); });
  REQUIRE(e);
  CHECK(unit::contains(e->what(), "no such encoding"));
  REQUIRE(v.newest_full(1) != nullptr);
  CHECK(v.newest_full(1)->version == 1);
}

TEST_CASE("root view: a full version is one complete and not a delta; a delta's marker is not read for it") {
  unit::TempDir t;
  const fs::path root = t.path();
  version(root, 1, false);
  version(root, 2, false, false);  // full, still arriving
  const fs::path d = version(root, 3, true);
  put(d / kCompleteFile, "not json");  // a delta's marker: damage, but no question of being full
  const RootListing l = list_root(root);
  CHECK(l.is_full_version(l.all[0], false));
  CHECK_FALSE(l.is_full_version(l.all[1], false));
  CHECK_FALSE(l.is_full_version(l.all[2], false));
}

TEST_CASE("root view: a listing reads names only") {
  unit::TempDir t;
  const fs::path root = t.path();
  CHECK(newest_published(root) == std::nullopt);
  version(root, 7, false);
  fs::create_directory(root / ".weight_v000008.tmp-12345678");  // a publication under way
  CHECK(newest_published(root) == 7u);
  const RootListing l = list_root(root);
  CHECK(l.all.size() == 1);
  CHECK(l.newest() == 7u);
}
